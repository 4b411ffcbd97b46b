package federation

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Mode is how requests reach a remote cluster's pods.
type Mode string

const (
	// ModeEndpoint sends requests straight to the remote pod's ip:port
	// (a flat pod network between clusters).
	ModeEndpoint Mode = "Endpoint"
	// ModeParent sends requests to the remote cluster's gateway and names the
	// chosen pod in the x-gateway-destination-endpoint-subset header, which
	// the remote EPP honours.
	ModeParent Mode = "Parent"
)

// ParseMode accepts a mode name in any letter case.
func ParseMode(s string) (Mode, error) {
	switch {
	case strings.EqualFold(s, string(ModeEndpoint)):
		return ModeEndpoint, nil
	case strings.EqualFold(s, string(ModeParent)):
		return ModeParent, nil
	}
	return "", fmt.Errorf("unknown federation mode %q (want Endpoint or Parent)", s)
}

// PeerDirectory lists the endpoint pickers an EPP federates with. The hub
// publishes it; each EPP reads it from a file and picks the entries of its
// own pool.
type PeerDirectory struct {
	Peers []Peer `json:"peers"`
}

// Peer is one remote cluster's endpoint picker for a pool.
type Peer struct {
	// Cluster is the peer's cluster name (a DNS label), unique per pool.
	Cluster string `json:"cluster"`
	// Pool limits the entry to the EPPs of one InferencePool; without it the
	// entry applies to every pool.
	Pool *PoolRef `json:"pool,omitempty"`
	// FederationAddress is host:port of the peer EPP's federation server.
	FederationAddress string `json:"federationAddress"`
	// GatewayAddress is host:port of the peer cluster's inference gateway,
	// needed for Parent mode.
	GatewayAddress string `json:"gatewayAddress,omitempty"`
	// Identity is the peer's mTLS identity: a URI SAN (e.g. a SPIFFE ID) or
	// DNS SAN of its certificate. It is checked both ways: the subscriber
	// verifies the server it dials, the server admits only listed identities.
	Identity string `json:"identity"`
	// Mode overrides the EPP's default mode (--federation-mode) for this peer.
	Mode Mode `json:"mode,omitempty"`
}

// PoolRef names an InferencePool; the same namespace and name identify it in
// every cluster.
type PoolRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// ParseDirectory parses and validates a peer directory in YAML or JSON.
func ParseDirectory(data []byte) (*PeerDirectory, error) {
	var d PeerDirectory
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		return nil, fmt.Errorf("peer directory: %w", err)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Validate checks every entry.
func (d *PeerDirectory) Validate() error {
	if len(d.Peers) > 1000 {
		return fmt.Errorf("peer directory lists %d peers, at most 1000", len(d.Peers))
	}
	type key struct{ cluster, pool string }
	seen := map[key]bool{}
	var errs []error
	for i, p := range d.Peers {
		if err := p.validate(); err != nil {
			errs = append(errs, fmt.Errorf("peers[%d]: %w", i, err))
			continue
		}
		k := key{p.Cluster, ""}
		if p.Pool != nil {
			k.pool = p.Pool.Namespace + "/" + p.Pool.Name
		}
		if seen[k] {
			errs = append(errs, fmt.Errorf("peers[%d]: cluster %s listed twice for the same pool", i, p.Cluster))
		}
		seen[k] = true
	}
	return errors.Join(errs...)
}

func (p Peer) validate() error {
	if msgs := validation.IsDNS1123Label(p.Cluster); len(msgs) > 0 {
		return fmt.Errorf("cluster %q: %v", p.Cluster, msgs)
	}
	if p.Pool != nil && (p.Pool.Namespace == "" || p.Pool.Name == "") {
		return errors.New("pool needs a namespace and a name")
	}
	if err := validHostPort(p.FederationAddress); err != nil {
		return fmt.Errorf("federationAddress: %w", err)
	}
	if p.GatewayAddress != "" {
		if err := validHostPort(p.GatewayAddress); err != nil {
			return fmt.Errorf("gatewayAddress: %w", err)
		}
	}
	if p.Identity == "" {
		return errors.New("identity is required: peers authenticate each other by it")
	}
	if p.Mode != "" {
		if _, err := ParseMode(string(p.Mode)); err != nil {
			return err
		}
	}
	if p.Mode == ModeParent && p.GatewayAddress == "" {
		return errors.New("Parent mode needs a gatewayAddress")
	}
	return nil
}

func validHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("%q has no host", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("%q has an invalid port", s)
	}
	return nil
}

// For returns the peers of pool, leaving out the EPP's own cluster.
func (d *PeerDirectory) For(pool types.NamespacedName, self string) []Peer {
	var out []Peer
	for _, p := range d.Peers {
		if p.Cluster == self {
			continue
		}
		if p.Pool != nil && (p.Pool.Namespace != pool.Namespace || p.Pool.Name != pool.Name) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// DirectoryFile follows a peer directory file: it reloads the file when its
// content changes (Kubernetes swaps ConfigMap volumes by symlink, which
// inotify on the file itself misses, so it polls) and keeps the last valid
// version when a change does not parse.
type DirectoryFile struct {
	Path     string
	Interval time.Duration
	Log      logr.Logger

	mu      sync.RWMutex
	current *PeerDirectory
	raw     []byte
	subs    []chan struct{}
}

// Load reads the file once; it fails when the file is missing or invalid.
func (f *DirectoryFile) Load() error {
	_, err := f.reload()
	return err
}

// Current returns the last valid directory.
func (f *DirectoryFile) Current() *PeerDirectory {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.current == nil {
		return &PeerDirectory{}
	}
	return f.current
}

// Changed returns a channel that receives a value after each change.
func (f *DirectoryFile) Changed() <-chan struct{} {
	ch := make(chan struct{}, 1)
	f.mu.Lock()
	f.subs = append(f.subs, ch)
	f.mu.Unlock()
	return ch
}

func (f *DirectoryFile) reload() (bool, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return false, err
	}
	f.mu.RLock()
	same := f.current != nil && bytes.Equal(data, f.raw)
	f.mu.RUnlock()
	if same {
		return false, nil
	}
	d, err := ParseDirectory(data)
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	f.current, f.raw = d, data
	subs := f.subs
	f.mu.Unlock()
	for _, ch := range subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return true, nil
}

// Run polls the file until ctx ends.
func (f *DirectoryFile) Run(ctx context.Context) error {
	interval := f.Interval
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if changed, err := f.reload(); err != nil {
				f.Log.Error(err, "Peer directory not reloaded; keeping the previous one", "path", f.Path)
			} else if changed {
				f.Log.Info("Peer directory reloaded", "path", f.Path, "peers", len(f.Current().Peers))
			}
		}
	}
}
