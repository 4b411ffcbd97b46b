package wan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// PodNetwork says whether a cluster's pod addresses are reachable from the
// other clusters.
type PodNetwork string

const (
	// Isolated pod networks reach no other cluster: a connection to another
	// cluster's pod address is refused. Clusters reach each other only
	// through what they expose (gateways, load balancers).
	Isolated PodNetwork = "isolated"
	// Flat pod networks reach every cluster's pod addresses through the
	// link between the clusters, as Cilium Cluster Mesh, Submariner or GKE
	// multi-cluster networking do.
	Flat PodNetwork = "flat"
)

// ParsePodNetwork reads a mode; "" is Isolated.
func ParsePodNetwork(s string) (PodNetwork, error) {
	switch PodNetwork(s) {
	case "", Isolated:
		return Isolated, nil
	case Flat:
		return Flat, nil
	}
	return "", fmt.Errorf("wan: pod network %q is neither %q nor %q", s, Isolated, Flat)
}

// Policy is how a listener of the fabric treats connections from other
// clusters.
type Policy int

const (
	// Exposed addresses (a gateway, a load balancer) take connections from
	// every cluster, through the link.
	Exposed Policy = iota
	// PodAddress listeners are a pod's ports: other clusters reach them
	// through the link on a flat pod network and not at all on an isolated
	// one.
	PodAddress
)

func (p Policy) String() string {
	if p == PodAddress {
		return "pod address"
	}
	return "exposed"
}

// FabricOptions configure a Fabric.
type FabricOptions struct {
	// Matrix holds the links between the clusters; it must name every
	// cluster of Networks. Nil: no clusters, every connection is direct.
	Matrix *Matrix
	// Networks are the address ranges of each cluster: a connection's
	// source address tells the cluster it comes from. A source in no range
	// (127.0.0.1: the test harness, a load generator, a process that binds
	// no address) comes from outside every cluster and is never delayed.
	Networks map[string][]netip.Prefix
	// PodNetwork is the pod-network mode (default Isolated).
	PodNetwork PodNetwork
	Log        logr.Logger
}

// Fabric is the wide-area network between the clusters of a local fleet.
// Every cluster process shares the host's loopback, so the fabric applies a
// link on the receiving side: each listener it serves belongs to a cluster,
// and a connection to it pays the link between that cluster and the one its
// source address belongs to (see FabricOptions.Networks). Connections inside
// a cluster, or from outside every cluster, are direct.
//
// A refused connection (a pod address from another cluster, in isolated
// mode) is reset right after it was accepted: a real network without a route
// would not complete the handshake at all, but on loopback the kernel
// completes it before the fabric sees the source.
//
// Each pair of clusters has one link state, shared by every listener (a
// black hole cuts the pair's gateway, load-balancer, pod and API-server
// traffic at once); see Proxy for how the links differ from a real
// wide-area network. Every method is safe for concurrent use.
type Fabric struct {
	matrix   *Matrix
	networks map[string][]netip.Prefix
	lines    map[pair]*line
	direct   *line
	flaps    *group // flap goroutines
	log      logr.Logger

	mu       sync.Mutex
	mode     PodNetwork
	counters map[[2]string]*counters // by (source, destination)
	servers  map[*Server]struct{}
	discard  counters // direct connections
}

// NewFabric validates opts and builds a fabric.
func NewFabric(opts FabricOptions) (*Fabric, error) {
	mode, err := ParsePodNetwork(string(opts.PodNetwork))
	if err != nil {
		return nil, err
	}
	m := opts.Matrix
	if m == nil {
		m = &Matrix{links: map[pair]Link{}}
	}
	for c, prefixes := range opts.Networks {
		if _, err := m.Link(c, c); err != nil {
			return nil, err
		}
		for _, p := range prefixes {
			if !p.Addr().IsLoopback() {
				return nil, fmt.Errorf("wan: network %s of %s is not a loopback range", p, c)
			}
		}
	}
	f := &Fabric{matrix: m, networks: opts.Networks, lines: map[pair]*line{}, direct: newLine(Link{}),
		flaps: newGroup(), log: opts.Log, mode: mode, counters: map[[2]string]*counters{}, servers: map[*Server]struct{}{}}
	for p, l := range m.links {
		f.lines[p] = newLine(l)
	}
	return f, nil
}

// Matrix is the matrix the fabric started with (SetLink does not change it).
func (f *Fabric) Matrix() *Matrix { return f.matrix }

// PodNetwork is the pod-network mode in use.
func (f *Fabric) PodNetwork() PodNetwork {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode
}

// SetPodNetwork changes the mode for connections accepted from now on.
func (f *Fabric) SetPodNetwork(mode PodNetwork) error {
	mode, err := ParsePodNetwork(string(mode))
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.mode = mode
	f.mu.Unlock()
	return nil
}

// Cluster returns the cluster whose network holds ip.
func (f *Fabric) Cluster(ip netip.Addr) (string, bool) {
	ip = ip.Unmap()
	for c, prefixes := range f.networks {
		for _, p := range prefixes {
			if p.Contains(ip) {
				return c, true
			}
		}
	}
	return "", false
}

// line returns the link state between two different clusters of the matrix.
func (f *Fabric) line(a, b string) (*line, error) {
	if a == b {
		return nil, fmt.Errorf("wan: a link joins two clusters, not %q to itself", a)
	}
	l := f.lines[pairOf(a, b)]
	if l == nil {
		_, err := f.matrix.Link(a, b)
		return nil, err
	}
	return l, nil
}

// Link is the link in use between a and b.
func (f *Fabric) Link(a, b string) (Link, error) {
	l, err := f.line(a, b)
	if err != nil {
		return Link{}, err
	}
	return l.Link(), nil
}

// SetLink changes the link between a and b for bytes read from now on, on
// open connections too (a slow-down, a recovery).
func (f *Fabric) SetLink(a, b string, lk Link) error {
	l, err := f.line(a, b)
	if err != nil {
		return err
	}
	return l.setLink(lk)
}

// BlackHole drops everything between a and b, both ways, on open and new
// connections, until Heal: no bytes, no FIN, no RST, so peers hang until
// their own timeouts. It stops a running Flap of the pair.
func (f *Fabric) BlackHole(a, b string) error {
	l, err := f.line(a, b)
	if err != nil {
		return err
	}
	l.blackHole()
	return nil
}

// Heal ends a black hole between a and b (bytes written during it stay
// dropped) and stops a running Flap of the pair.
func (f *Fabric) Heal(a, b string) error {
	l, err := f.line(a, b)
	if err != nil {
		return err
	}
	l.heal()
	return nil
}

// BlackHoled reports whether the link between a and b is black-holed now.
func (f *Fabric) BlackHoled(a, b string) bool {
	l, err := f.line(a, b)
	return err == nil && l.blackHoled()
}

// Flap alternates a black hole and a healed link between a and b for d,
// starting with a black hole of period/2, and leaves the link healed. It
// returns at once; BlackHole, Heal, another Flap or Close stop it early.
func (f *Fabric) Flap(a, b string, period, d time.Duration) error {
	l, err := f.line(a, b)
	if err != nil {
		return err
	}
	return l.flap(f.flaps, period, d)
}

// Stats are the counters of connections from cluster from to cluster to.
func (f *Fabric) Stats(from, to string) Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.counters[[2]string{from, to}]; c != nil {
		return c.stats()
	}
	return Stats{}
}

func (f *Fabric) countersOf(from, to string) *counters {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := [2]string{from, to}
	c := f.counters[k]
	if c == nil {
		c = &counters{}
		f.counters[k] = c
	}
	return c
}

// Server is a listener the fabric serves.
type Server struct {
	f       *Fabric
	ln      net.Listener
	g       *group
	cluster string
	policy  Policy
	dial    Dial
	// source, when set, is the cluster of every connection whatever its
	// address (Forward).
	source string
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops accepting, drops the server's open connections and waits.
func (s *Server) Close() error {
	s.f.mu.Lock()
	delete(s.f.servers, s)
	s.f.mu.Unlock()
	return s.g.close(s.ln.Close)
}

// Serve accepts on ln, which belongs to cluster, and forwards each
// connection to what dial connects: directly when it comes from the same
// cluster or from outside every cluster; from another cluster through
// their link, or not at all for a PodAddress listener in isolated mode.
// The server owns ln from now on.
func (f *Fabric) Serve(ln net.Listener, cluster string, policy Policy, dial Dial) (*Server, error) {
	if _, err := f.matrix.Link(cluster, cluster); err != nil && len(f.networks) > 0 {
		_ = ln.Close()
		return nil, err
	}
	return f.serve(&Server{f: f, ln: ln, g: newGroup(), cluster: cluster, policy: policy, dial: dial})
}

// Forward listens on addr in cluster to and forwards every connection to
// target through the link from cluster from, whatever the connection's
// source address: for a client that binds no address of its cluster (the
// hub's controllers reaching a spoke's API server).
func (f *Fabric) Forward(addr, from, to, target string) (*Server, error) {
	if _, err := f.line(from, to); err != nil {
		return nil, err
	}
	if err := loopback(addr); err != nil {
		return nil, fmt.Errorf("wan: listen address: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	return f.serve(&Server{f: f, ln: ln, g: newGroup(), cluster: to, policy: Exposed, dial: To(target), source: from})
}

func (f *Fabric) serve(s *Server) (*Server, error) {
	f.mu.Lock()
	f.servers[s] = struct{}{}
	f.mu.Unlock()
	serveListener(s.g, s.ln, s.handle)
	return s, nil
}

// Listen is Serve for an in-process server: it returns a listener on a
// private port of 127.0.0.1 that receives what the fabric accepts on addr
// for cluster. Closing it closes both.
func (f *Fabric) Listen(addr, cluster string, policy Policy) (net.Listener, error) {
	public, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	private, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = public.Close()
		return nil, err
	}
	s, err := f.Serve(public, cluster, policy, To(private.Addr().String()))
	if err != nil {
		_ = private.Close()
		return nil, err
	}
	return &servedListener{Listener: private, s: s}, nil
}

// servedListener is the private end of Listen; its Addr is the public one.
type servedListener struct {
	net.Listener
	s *Server
}

func (l *servedListener) Addr() net.Addr { return l.s.ln.Addr() }

func (l *servedListener) Close() error {
	return errors.Join(l.s.Close(), l.Listener.Close())
}

func (s *Server) handle(in net.Conn, start time.Time) {
	f := s.f
	src := s.source
	if src == "" {
		if ap, err := netip.ParseAddrPort(in.RemoteAddr().String()); err == nil {
			src, _ = f.Cluster(ap.Addr())
		}
	}
	if src == "" || src == s.cluster {
		carry(s.g, f.direct, in, start, s.dial, &f.discard)
		return
	}
	cnt := f.countersOf(src, s.cluster)
	if s.policy == PodAddress && f.PodNetwork() == Isolated {
		cnt.refused.Add(1)
		f.log.V(1).Info("connection refused: pod networks are isolated", "from", src, "source", in.RemoteAddr().String(),
			"to", s.cluster, "address", s.Addr())
		reset(in)
		return
	}
	l, err := f.line(src, s.cluster)
	if err != nil {
		f.log.Error(err, "no link", "from", src, "to", s.cluster)
		reset(in)
		return
	}
	cnt.accepted.Add(1)
	carry(s.g, l, in, start, s.dial, cnt)
}

// Close closes every server of the fabric and stops running flaps.
func (f *Fabric) Close() {
	f.mu.Lock()
	servers := make([]*Server, 0, len(f.servers))
	for s := range f.servers {
		servers = append(servers, s)
	}
	f.mu.Unlock()
	for _, s := range servers {
		_ = s.Close()
	}
	_ = f.flaps.close(nil)
}
