package federation

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
)

// OriginAttribute is the endpoint attribute that marks a remote endpoint and
// says where it lives. Local endpoints do not have it.
const OriginAttribute = "fleetinfer.io/origin"

// ClusterLabel is set on every remote endpoint's labels to its cluster's
// name, for label-based plugins; a peer cannot set it itself.
const ClusterLabel = "fleetinfer.io/cluster"

// Origin describes a remote endpoint's cluster and how to reach it. It is
// immutable once attached, so Clone returns it as is; the round trip it
// points to is the one value that changes, measured by the subscription.
type Origin struct {
	Cluster string
	// Mode says whether requests go to the pod itself (Endpoint) or to its
	// cluster's gateway with the pod named in signed marks (Parent).
	Mode fleetv1alpha1.FederationMode
	// Gateway is the cluster's gateway address (host:port), for Parent mode.
	Gateway string
	// RoundTrip is the measured round trip to the cluster; nil when
	// nothing measures it.
	RoundTrip *RoundTrip
}

// RTT returns the measured round trip to the cluster, 0 while unknown.
func (o *Origin) RTT() time.Duration {
	if o.RoundTrip == nil {
		return 0
	}
	return o.RoundTrip.Get()
}

// RoundTrip is a round-trip time that follows its samples: each moves it
// halfway to the sample, so that a link that slows is followed within a few
// samples while one late answer moves it only half as far.
type RoundTrip struct {
	ns atomic.Int64
}

// Get returns the current estimate, 0 before the first sample.
func (r *RoundTrip) Get() time.Duration { return time.Duration(r.ns.Load()) }

// Observe adds a sample and returns the new estimate. One goroutine
// observes; any may Get.
func (r *RoundTrip) Observe(sample time.Duration) time.Duration {
	cur := r.ns.Load()
	next := int64(sample)
	if cur > 0 {
		next = (cur + int64(sample)) / 2
	}
	r.ns.Store(next)
	return time.Duration(next)
}

func (o *Origin) Clone() fwkdl.Cloneable { return o }

// Attributes is what GIE's datalayer and scheduling endpoints share of their
// attribute maps.
type Attributes interface {
	Get(string) (fwkdl.Cloneable, bool)
}

// OriginOf returns the origin of a remote endpoint, or nil for a local one.
func OriginOf(attrs Attributes) *Origin {
	if attrs == nil {
		return nil
	}
	v, ok := attrs.Get(OriginAttribute)
	if !ok {
		return nil
	}
	o, _ := v.(*Origin)
	return o
}

// peerState holds one peer's endpoints as received on its current stream.
// Apply runs on the stream's goroutine only; readers use the view, an
// immutable snapshot that apply swaps atomically after every message.
type peerState struct {
	origin    *Origin
	namespace string // the pool's namespace, which remote endpoints share
	limits    Limits
	dest      Destinations
	// ranges are the peer's endpoint ranges (its directory entry's
	// EndpointCIDRs); none admits any range Destinations does not refuse.
	ranges []netip.Prefix

	seq  uint64
	byID map[uint32]*remoteEndpoint
	// bytes is the encoded size of the held endpoints' last specs and
	// metrics. It may not pass the message limit: a snapshot of them all
	// must fit one message, so a peer that grows its state through deltas
	// past it breaks the protocol, and its memory here stays bounded.
	bytes int
	// refused are the ids of endpoints whose address was refused: their
	// metrics-only updates and removals are ignored, not protocol errors.
	refused map[uint32]bool
	// order is byID's values from the least to the most loaded. It is
	// rebuilt from byID only when endpoints come or go (membersChanged), and
	// otherwise sorted again in place when values change, not for
	// watermarks: a message that changes a few endpoints leaves it nearly
	// sorted, which costs the sort one pass.
	order          []*remoteEndpoint
	membersChanged bool
	view           atomic.Pointer[View]
	// lag is this peer's federation lag histogram, looked up once.
	lag prometheus.Observer
}

type remoteEndpoint struct {
	id uint32
	// ep's metrics are the last received values, dated by their scrape.
	ep *fwkdl.ModelServer
	// specSize, metricsSize and prefixSize are the encoded sizes last
	// received.
	specSize, metricsSize, prefixSize int
	metrics                           *fwkdl.Metrics
	// hop is NextHop of the endpoint, made when its spec arrives rather
	// than on every pick that weighs it.
	hop string
	// prefixes is the endpoint's prefix summary, nil without one (or with
	// one of a size this EPP does not know).
	prefixes *prefixes.Summary
	// updated is the local time up to which the data is vouched for: its
	// scrape, advanced by freshness watermarks. Picks see it as the
	// metrics' UpdateTime (see View), so that a watermark, which moves
	// every endpoint, costs no copy of each one's metrics.
	updated time.Time
}

func newPeerState(origin *Origin, namespace string, limits Limits, dest Destinations, ranges []netip.Prefix) *peerState {
	return &peerState{origin: origin, namespace: namespace, limits: limits, dest: dest, ranges: ranges,
		byID: map[uint32]*remoteEndpoint{}, refused: map[uint32]bool{}, lag: lag.WithLabelValues(origin.Cluster)}
}

// drop forgets a held endpoint.
func (p *peerState) drop(id uint32) {
	if re, ok := p.byID[id]; ok {
		p.bytes -= re.specSize + re.metricsSize + re.prefixSize
		delete(p.byID, id)
		p.membersChanged = true
	}
}

// admit reports whether the endpoint spec s of id may be held; one that may
// not is dropped if held, remembered as refused and counted.
func (p *peerState) admit(id uint32, s *federationv1.EndpointSpec) bool {
	addr, err := netip.ParseAddr(s.GetAddress())
	reason := RefusedUnspecified
	if err == nil {
		reason = p.dest.refusal(addr, p.ranges)
	}
	if reason == "" {
		delete(p.refused, id)
		return true
	}
	p.drop(id)
	p.refused[id] = true
	endpointsRefused.WithLabelValues(p.origin.Cluster, reason).Inc()
	return false
}

// errProtocol marks a violation of the stream's rules (as opposed to a
// transport failure).
var errProtocol = errors.New("federation protocol violation")

// apply applies one validated Update received at recvAt (local clock).
func (p *peerState) apply(u *federationv1.Update, recvAt time.Time) error {
	if u.GetSeq() != p.seq+1 {
		return fmt.Errorf("%w: sequence %d after %d", errProtocol, u.GetSeq(), p.seq)
	}
	if p.seq == 0 && !u.GetSnapshot() {
		return fmt.Errorf("%w: stream does not start with a snapshot", errProtocol)
	}
	p.seq = u.GetSeq()
	// Times in the update are by the peer's clock; their distance to its send
	// time is carried over to ours, so skew between clusters cancels out.
	sent := u.GetSentUnixNano()
	local := func(t int64) time.Time {
		if t <= 0 || t > sent {
			return recvAt
		}
		return recvAt.Add(-time.Duration(sent - t))
	}
	if u.GetSnapshot() {
		clear(p.byID)
		clear(p.refused)
		p.bytes = 0
		p.membersChanged = true
	}
	for _, id := range u.GetRemoved() {
		if p.refused[id] {
			delete(p.refused, id)
			continue
		}
		if _, ok := p.byID[id]; !ok {
			return fmt.Errorf("%w: removal of unknown endpoint %d", errProtocol, id)
		}
		p.drop(id)
	}
	for _, e := range u.GetUpserts() {
		if s := e.GetSpec(); s == nil && p.refused[e.GetId()] || s != nil && !p.admit(e.GetId(), s) {
			continue
		}
		re, ok := p.byID[e.GetId()]
		if !ok {
			if e.GetSpec() == nil {
				return fmt.Errorf("%w: endpoint %d first sent without its spec", errProtocol, e.GetId())
			}
			if len(p.byID)+len(p.refused) >= p.limits.MaxEndpoints {
				return fmt.Errorf("%w: peer exceeds %d endpoints", errProtocol, p.limits.MaxEndpoints)
			}
			re = &remoteEndpoint{id: e.GetId(), ep: fwkdl.NewEndpoint(nil, nil)}
			re.ep.GetAttributes().Put(OriginAttribute, p.origin)
			p.byID[e.GetId()] = re
			p.membersChanged = true
		}
		p.bytes -= re.metricsSize
		re.metricsSize = proto.Size(e.GetMetrics())
		p.bytes += re.metricsSize
		if s := e.GetSpec(); s != nil {
			md := p.metadata(s)
			re.ep.UpdateMetadata(md)
			re.hop = NextHop(p.origin, md)
			p.bytes -= re.specSize
			re.specSize = proto.Size(s)
			p.bytes += re.specSize
		}
		if pr := e.GetPrefixes(); pr != nil {
			p.bytes -= re.prefixSize
			re.prefixSize = proto.Size(pr)
			p.bytes += re.prefixSize
			re.prefixes, _ = prefixes.FromBytes(pr.GetFilter())
		}
		if p.bytes > p.limits.MaxMessageBytes {
			return fmt.Errorf("%w: peer's endpoints take over %d bytes", errProtocol, p.limits.MaxMessageBytes)
		}
		re.metrics = metricsFrom(e.GetMetrics(), local(e.GetMetrics().GetScrapeUnixNano()))
		re.ep.UpdateMetrics(re.metrics)
		re.updated = re.metrics.UpdateTime
	}
	switch {
	case p.membersChanged:
		p.order = slices.AppendSeq(p.order[:0], maps.Values(p.byID))
		p.membersChanged = false
		fallthrough
	case len(u.GetUpserts()) > 0:
		slices.SortFunc(p.order, func(a, b *remoteEndpoint) int { return compareLoad(a.metrics, b.metrics) })
	}
	if cur := u.GetCurrentUnixNano(); cur > 0 {
		wm := local(cur)
		var lagging map[uint32]bool
		if len(u.GetLagging()) > 0 {
			lagging = make(map[uint32]bool, len(u.GetLagging()))
			for _, id := range u.GetLagging() {
				lagging[id] = true
			}
		}
		for _, re := range p.order {
			if !lagging[re.id] && wm.After(re.updated) {
				re.updated = wm
			}
		}
	}
	v := &View{Origin: p.origin, Entries: make([]Entry, len(p.order)), lag: p.lag}
	for i, re := range p.order {
		v.Entries[i] = Entry{Endpoint: re.ep, Updated: re.updated, metrics: re.metrics, Prefixes: re.prefixes, hop: re.hop}
	}
	v.index()
	p.view.Store(v)
	return nil
}

func (p *peerState) metadata(s *federationv1.EndpointSpec) *fwkdl.EndpointMetadata {
	labels := make(map[string]string, len(s.GetLabels())+1)
	maps.Copy(labels, s.GetLabels())
	labels[ClusterLabel] = p.origin.Cluster
	// Names carry the cluster so that they stay unique next to local ones:
	// GIE's plugins key their state by endpoint name.
	suffix := "@" + p.origin.Cluster
	return &fwkdl.EndpointMetadata{
		NamespacedName: types.NamespacedName{Namespace: p.namespace, Name: s.GetName() + suffix},
		PodName:        s.GetPodName() + suffix,
		Address:        s.GetAddress(),
		Port:           strconv.FormatUint(uint64(s.GetPort()), 10),
		Labels:         labels,
	}
}

func metricsFrom(m *federationv1.EndpointMetrics, at time.Time) *fwkdl.Metrics {
	out := &fwkdl.Metrics{
		ActiveModels:        make(map[string]int, len(m.GetLora().GetRunning())),
		WaitingModels:       make(map[string]int, len(m.GetLora().GetWaiting())),
		MaxActiveModels:     int(m.GetLora().GetMaxAdapters()),
		RunningRequestsSize: int(m.GetNumRequestsRunning()),
		WaitingQueueSize:    int(m.GetNumRequestsWaiting()),
		KVCacheUsagePercent: m.GetKvCacheUsage(),
		CacheBlockSize:      int(m.GetCache().GetBlockSize()),
		CacheNumBlocks:      int(m.GetCache().GetNumGpuBlocks()),
		UpdateTime:          at,
	}
	if c := m.GetCache().GetMaxTokenCapacity(); c <= uint64(^uint(0)>>1) {
		out.KvCacheMaxTokenCapacity = int(c)
	}
	for name, n := range m.GetLora().GetRunning() {
		out.ActiveModels[name] = int(n)
	}
	for name, n := range m.GetLora().GetWaiting() {
		out.WaitingModels[name] = int(n)
	}
	return out
}

// Store holds the endpoints of every connected peer. It is safe for
// concurrent use; reads take no lock and never wait for a stream.
type Store struct {
	// staleAfter is the staleness bound: a remote endpoint whose data is
	// older is left out of candidate sets.
	staleAfter time.Duration

	mu    sync.Mutex
	peers map[string]*peerState // by cluster
	// list is peers' values, rebuilt under mu when a peer comes or goes.
	list atomic.Pointer[[]*peerState]
}

// NewStore returns an empty store with the given staleness bound.
func NewStore(staleAfter time.Duration) *Store {
	return &Store{staleAfter: staleAfter, peers: map[string]*peerState{}}
}

// StaleAfter returns the staleness bound.
func (s *Store) StaleAfter() time.Duration { return s.staleAfter }

func (s *Store) set(cluster string, p *peerState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peers[cluster] = p
	s.publish()
}

// remove drops a peer's endpoints if they are still those of p: when a
// peer's entry changes, the new stream may register before the old one has
// finished leaving.
func (s *Store) remove(cluster string, p *peerState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peers[cluster] == p {
		delete(s.peers, cluster)
		s.publish()
	}
}

// publish swaps in the current peer list. Called with s.mu held.
func (s *Store) publish() {
	list := slices.Collect(maps.Values(s.peers))
	s.list.Store(&list)
}

// Remote returns every connected peer's current view, with the staleness
// cutoff at now.
func (s *Store) Remote(now time.Time) Remote {
	r := Remote{Stale: now.Add(-s.staleAfter)}
	list := s.list.Load()
	if list == nil {
		return r
	}
	r.Peers = make([]*View, 0, len(*list))
	for _, p := range *list {
		if v := p.view.Load(); v != nil {
			r.Peers = append(r.Peers, v)
		}
	}
	return r
}

// Count returns how many endpoints each peer has, fresh or not.
func (s *Store) Count() map[string]int {
	out := map[string]int{}
	if list := s.list.Load(); list != nil {
		for _, p := range *list {
			if v := p.view.Load(); v != nil {
				out[v.Origin.Cluster] = len(v.Entries)
			}
		}
	}
	return out
}

// PodAddress returns the ip:port a remote endpoint serves on.
func PodAddress(md *fwkdl.EndpointMetadata) string {
	return net.JoinHostPort(md.GetIPAddress(), md.GetPort())
}

// NextHop is the address the entry gateway sends a request picked to the
// endpoint md of origin o (nil: a local endpoint) to: the other cluster's
// gateway in Parent mode, the pod itself otherwise. The gateway (Envoy's
// ORIGINAL_DST cluster) keeps its connections per next hop.
func NextHop(o *Origin, md *fwkdl.EndpointMetadata) string {
	if o != nil && o.Mode == fleetv1alpha1.FederationParent {
		return o.Gateway
	}
	return PodAddress(md)
}
