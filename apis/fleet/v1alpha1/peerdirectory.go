package v1alpha1

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// PeerDirectory lists the endpoint pickers an endpoint picker federates
// with. It is a file format, not a resource: the hub writes it into the
// ConfigMap PeerDirectoryName(service) under PeerDirectoryKey, the picker
// reads it from a file (--federation-peers-file) and takes the entries of
// its own pool. Operators who federate pickers without a hub write it by
// hand in the same format.
//
// +kubebuilder:object:generate=false
type PeerDirectory struct {
	Peers []Peer `json:"peers"`
	// OwnEndpointCIDRs are the address ranges of the reading picker's own
	// cluster's endpoints: a peer's endpoint inside them is refused, so a
	// peer cannot steer requests to this cluster's own pods.
	OwnEndpointCIDRs []string `json:"ownEndpointCIDRs,omitempty"`
}

// MaxEndpointCIDRs bounds the ranges of one cluster.
const MaxEndpointCIDRs = 32

// PodCIDRsProperty is the ClusterProfile property (or OCM cluster claim) by
// which a cluster's registration names the address ranges its endpoints
// (pods) use, comma separated. The hub publishes them with the cluster's
// entry in peer directories (Peer.EndpointCIDRs).
const PodCIDRsProperty = "podcidrs.fleet.fleetinfer.io"

// ParseCIDRs parses a comma-separated list of address ranges, as
// PodCIDRsProperty holds them.
func ParseCIDRs(s string) ([]string, error) {
	var out []string
	for _, c := range strings.Split(s, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked().String())
	}
	return out, validCIDRs(out)
}

// Prefixes returns the ranges of validated CIDRs.
func Prefixes(cidrs []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

func validCIDRs(cidrs []string) error {
	if len(cidrs) > MaxEndpointCIDRs {
		return fmt.Errorf("%d address ranges, at most %d", len(cidrs), MaxEndpointCIDRs)
	}
	for _, c := range cidrs {
		if _, err := netip.ParsePrefix(c); err != nil {
			return err
		}
	}
	return nil
}

// MaxPeers bounds a directory, so a picker never holds more subscriptions
// than it can serve.
const MaxPeers = 1000

// Peer is one remote cluster's endpoint picker for a pool.
//
// +kubebuilder:object:generate=false
type Peer struct {
	// Cluster is the peer's cluster name (a DNS label), unique per pool.
	Cluster string `json:"cluster"`
	// Pool limits the entry to the pickers of one InferencePool; without it
	// the entry applies to every pool.
	Pool *PoolRef `json:"pool,omitempty"`
	// FederationAddress is host:port of the peer picker's federation server;
	// empty only for a SubscribeOnly peer.
	FederationAddress string `json:"federationAddress,omitempty"`
	// GatewayAddress is host:port of the peer cluster's inference gateway,
	// needed for Parent mode.
	GatewayAddress string `json:"gatewayAddress,omitempty"`
	// Identity is the peer's mTLS identity: a URI SAN (e.g. a SPIFFE ID) or
	// DNS SAN of its certificate. It is checked both ways: the subscriber
	// verifies the server it dials, the server admits only listed identities.
	Identity string `json:"identity"`
	// Mode overrides the picker's default mode (--federation-mode) for this
	// peer: Endpoint or Parent.
	Mode FederationMode `json:"mode,omitempty"`
	// SubscribeOnly marks a peer that only subscribes: the picker of a
	// cluster that imports the pool (an InferencePoolImport) and runs none
	// of its pods. Pickers admit its identity, to their federation servers
	// and behind its Parent-mode marks, but never dial it or send it
	// requests, so it has no address and no mode.
	SubscribeOnly bool `json:"subscribeOnly,omitempty"`
	// EndpointCIDRs are the address ranges the peer's endpoints may use (its
	// pod ranges, from its registration's PodCIDRsProperty): pickers refuse
	// the peer's endpoints outside them. Without them only the address
	// classes no endpoint has (loopback, link-local, unspecified, multicast)
	// and the reading cluster's own ranges are refused.
	EndpointCIDRs []string `json:"endpointCIDRs,omitempty"`
}

// PoolRef names an InferencePool; the same namespace and name identify it in
// every cluster.
//
// +kubebuilder:object:generate=false
type PoolRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// ParsePeerMode accepts the modes a peer can be reached in, Endpoint or
// Parent, in any letter case.
func ParsePeerMode(s string) (FederationMode, error) {
	for _, m := range []FederationMode{FederationEndpoint, FederationParent} {
		if strings.EqualFold(s, string(m)) {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown federation mode %q (want Endpoint or Parent)", s)
}

// ParsePeerDirectory parses and validates a peer directory in YAML or JSON;
// unknown fields are errors, so a typo does not silently drop a setting.
func ParsePeerDirectory(data []byte) (*PeerDirectory, error) {
	var d PeerDirectory
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		return nil, fmt.Errorf("peer directory: %w", err)
	}
	// Modes are accepted in any letter case and compared canonical.
	for i, p := range d.Peers {
		if mode, err := ParsePeerMode(string(p.Mode)); err == nil {
			d.Peers[i].Mode = mode
		}
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Validate checks every entry.
func (d *PeerDirectory) Validate() error {
	if len(d.Peers) > MaxPeers {
		return fmt.Errorf("peer directory lists %d peers, at most %d", len(d.Peers), MaxPeers)
	}
	var errs []error
	if err := validCIDRs(d.OwnEndpointCIDRs); err != nil {
		errs = append(errs, fmt.Errorf("ownEndpointCIDRs: %w", err))
	}
	type key struct{ cluster, pool string }
	seen := map[key]bool{}
	for i, p := range d.Peers {
		if err := p.Validate(); err != nil {
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

// Validate checks one entry.
func (p Peer) Validate() error {
	if msgs := validation.IsDNS1123Label(p.Cluster); len(msgs) > 0 {
		return fmt.Errorf("cluster %q: %v", p.Cluster, msgs)
	}
	if p.Pool != nil && (p.Pool.Namespace == "" || p.Pool.Name == "") {
		return errors.New("pool needs a namespace and a name")
	}
	if p.Identity == "" {
		return errors.New("identity is required: peers authenticate each other by it")
	}
	if err := validCIDRs(p.EndpointCIDRs); err != nil {
		return fmt.Errorf("endpointCIDRs: %w", err)
	}
	if p.SubscribeOnly {
		if p.FederationAddress != "" || p.GatewayAddress != "" || p.Mode != "" || len(p.EndpointCIDRs) > 0 {
			return errors.New("a subscribeOnly peer is never dialled: it has no federationAddress, gatewayAddress, mode or endpointCIDRs")
		}
		return nil
	}
	if err := validHostPort(p.FederationAddress); err != nil {
		return fmt.Errorf("federationAddress: %w", err)
	}
	if p.GatewayAddress != "" {
		if err := validHostPort(p.GatewayAddress); err != nil {
			return fmt.Errorf("gatewayAddress: %w", err)
		}
	}
	if p.Mode == "" {
		return nil
	}
	mode, err := ParsePeerMode(string(p.Mode))
	if err != nil {
		return err
	}
	if mode == FederationParent && p.GatewayAddress == "" {
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

// For returns the peers of pool, leaving out the picker's own cluster.
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
