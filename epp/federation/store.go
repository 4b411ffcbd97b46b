package federation

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// OriginAttribute is the endpoint attribute that marks a remote endpoint and
// says where it lives. Local endpoints do not have it.
const OriginAttribute = "fleetinfer.io/origin"

// ClusterLabel is set on every remote endpoint's labels to its cluster's
// name, for label-based plugins; a peer cannot set it itself.
const ClusterLabel = "fleetinfer.io/cluster"

// Origin describes a remote endpoint's cluster and how to reach it. It is
// immutable once attached, so Clone returns it as is.
type Origin struct {
	Cluster string
	// Mode says whether requests go to the pod itself (Endpoint) or to its
	// cluster's gateway with the pod as subset hint (Parent).
	Mode Mode
	// Gateway is the cluster's gateway address (host:port), for Parent mode.
	Gateway string
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
// Apply runs on the stream's goroutine only; readers use the endpoints
// snapshot, which is swapped atomically, and each endpoint's metrics, which
// GIE's endpoint type stores atomically.
type peerState struct {
	origin    *Origin
	namespace string // the pool's namespace, which remote endpoints share
	limits    Limits

	seq  uint64
	byID map[uint32]*remoteEndpoint
	// endpoints is the current set, rebuilt when membership changes.
	endpoints atomic.Pointer[[]*remoteEndpoint]
}

type remoteEndpoint struct {
	ep *fwkdl.ModelServer
	// metrics are the last received values; their UpdateTime is the local
	// time the data was scraped, advanced by freshness watermarks.
	metrics *fwkdl.Metrics
}

func newPeerState(origin *Origin, namespace string, limits Limits) *peerState {
	return &peerState{origin: origin, namespace: namespace, limits: limits, byID: map[uint32]*remoteEndpoint{}}
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
	changed := false
	if u.GetSnapshot() {
		changed = len(p.byID) > 0
		clear(p.byID)
	}
	for _, id := range u.GetRemoved() {
		if _, ok := p.byID[id]; !ok {
			return fmt.Errorf("%w: removal of unknown endpoint %d", errProtocol, id)
		}
		delete(p.byID, id)
		changed = true
	}
	for _, e := range u.GetUpserts() {
		re, ok := p.byID[e.GetId()]
		if !ok {
			if e.GetSpec() == nil {
				return fmt.Errorf("%w: endpoint %d first sent without its spec", errProtocol, e.GetId())
			}
			if len(p.byID) >= p.limits.MaxEndpoints {
				return fmt.Errorf("%w: peer exceeds %d endpoints", errProtocol, p.limits.MaxEndpoints)
			}
			re = &remoteEndpoint{ep: fwkdl.NewEndpoint(nil, nil)}
			re.ep.GetAttributes().Put(OriginAttribute, p.origin)
			p.byID[e.GetId()] = re
			changed = true
		}
		if s := e.GetSpec(); s != nil {
			re.ep.UpdateMetadata(p.metadata(s))
		}
		re.metrics = metricsFrom(e.GetMetrics(), local(e.GetMetrics().GetScrapeUnixNano()))
		re.ep.UpdateMetrics(re.metrics)
	}
	if cur := u.GetCurrentUnixNano(); cur > 0 {
		wm := local(cur)
		lagging := make(map[uint32]bool, len(u.GetLagging()))
		for _, id := range u.GetLagging() {
			lagging[id] = true
		}
		for id, re := range p.byID {
			if lagging[id] || !wm.After(re.metrics.UpdateTime) {
				continue
			}
			// Shallow copy: the maps are never written after creation.
			m := *re.metrics
			m.UpdateTime = wm
			re.metrics = &m
			re.ep.UpdateMetrics(re.metrics)
		}
	}
	if changed {
		list := make([]*remoteEndpoint, 0, len(p.byID))
		for _, re := range p.byID {
			list = append(list, re)
		}
		p.endpoints.Store(&list)
	}
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
// concurrent use; reads never wait for a stream.
type Store struct {
	// StaleAfter is the staleness bound: a remote endpoint whose data is
	// older is left out of candidate sets.
	staleAfter time.Duration

	mu    sync.RWMutex
	peers map[string]*peerState // by cluster
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
}

// remove drops a peer's endpoints if they are still those of p: when a
// peer's entry changes, the new stream may register before the old one has
// finished leaving.
func (s *Store) remove(cluster string, p *peerState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.peers[cluster] == p {
		delete(s.peers, cluster)
	}
}

// AppendFresh appends every remote endpoint whose data is within the
// staleness bound at now to dst, and calls peer (when not nil) once per
// peer with endpoints, with the oldest data time among its fresh ones.
func (s *Store) AppendFresh(dst []fwkdl.Endpoint, now time.Time, peer func(cluster string, oldest time.Time)) []fwkdl.Endpoint {
	cutoff := now.Add(-s.staleAfter)
	s.mu.RLock()
	defer s.mu.RUnlock()
	for cluster, p := range s.peers {
		list := p.endpoints.Load()
		if list == nil {
			continue
		}
		var oldest time.Time
		for _, re := range *list {
			t := re.ep.GetMetrics().UpdateTime
			if t.Before(cutoff) {
				continue
			}
			if oldest.IsZero() || t.Before(oldest) {
				oldest = t
			}
			dst = append(dst, re.ep)
		}
		if peer != nil && !oldest.IsZero() {
			peer(cluster, oldest)
		}
	}
	return dst
}

// Count returns how many endpoints each peer has, fresh or not.
func (s *Store) Count() map[string]int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]int, len(s.peers))
	for cluster, p := range s.peers {
		if list := p.endpoints.Load(); list != nil {
			out[cluster] = len(*list)
		}
	}
	return out
}

// PodAddress returns the ip:port a remote endpoint serves on.
func PodAddress(md *fwkdl.EndpointMetadata) string {
	return net.JoinHostPort(md.GetIPAddress(), md.GetPort())
}
