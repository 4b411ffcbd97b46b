// Package crosscluster holds fleetinfer's scheduling plugins for a federated
// candidate set, where remote endpoints (from peer EPPs) sit next to local
// ones. Both plugins are configured in the EndpointPickerConfig like GIE's:
//
//	plugins:
//	- type: cross-cluster-filter
//	  parameters: {queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, maxRemoteCandidates: 16, maxLocalCandidatesOnSpill: 16}
//	- type: cross-cluster-scorer
//	  parameters: {networkCost: 0.5, clusterCosts: {west: 0.3}}
//	schedulingProfiles:
//	- name: default
//	  plugins:
//	  - pluginRef: cross-cluster-filter
//	  - {pluginRef: cross-cluster-scorer, weight: 1}
//	  - ...GIE's scorers...
package crosscluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// FilterType is the cross-cluster filter's plugin type.
const FilterType = "cross-cluster-filter"

// FilterParams are the filter's parameters. An endpoint has headroom while
// its metrics are fresh, its queue is below QueueDepthThreshold and its KV
// cache below KVCacheUtilThreshold: the same test as GIE's
// utilization-detector, whose defaults these are.
type FilterParams struct {
	QueueDepthThreshold  int     `json:"queueDepthThreshold"`
	KVCacheUtilThreshold float64 `json:"kvCacheUtilThreshold"`
	// MetricsStalenessThreshold applies to local endpoints.
	MetricsStalenessThreshold Duration `json:"metricsStalenessThreshold"`
	// RemoteMetricsStalenessThreshold applies to remote endpoints, whose
	// data also crossed the federation (remote endpoints older than the
	// federation's staleness bound are never candidates at all).
	RemoteMetricsStalenessThreshold Duration `json:"remoteMetricsStalenessThreshold"`
	// MaxRemoteCandidates bounds how many remote endpoints, the least loaded
	// ones with headroom, join a spilled request's candidates. GIE copies
	// and scores every candidate on every pick, so without a bound a fleet
	// of thousands of pods would make each spilled pick that much slower.
	MaxRemoteCandidates int `json:"maxRemoteCandidates"`
	// MaxLocalCandidatesOnSpill bounds how many local endpoints, the least
	// loaded ones, stay candidates next to the remote ones when a request
	// spills. None of them has headroom; the least loaded are the ones that
	// can still win against a remote endpoint's network cost, and scoring
	// every saturated local endpoint on every spilled pick would cost more
	// than the spill itself.
	MaxLocalCandidatesOnSpill int `json:"maxLocalCandidatesOnSpill"`
}

// DefaultFilterParams are used for parameters left out.
var DefaultFilterParams = FilterParams{
	QueueDepthThreshold:             5,
	KVCacheUtilThreshold:            0.8,
	MetricsStalenessThreshold:       Duration(200 * time.Millisecond),
	RemoteMetricsStalenessThreshold: Duration(time.Second),
	MaxRemoteCandidates:             16,
	MaxLocalCandidatesOnSpill:       16,
}

// Filter keeps requests in the local cluster while any local endpoint has
// headroom. When none has, it adds the remote endpoints that have headroom
// (the least loaded local ones stay in, so scorers and the network cost
// decide; the candidate lookup keeps MaxLocalCandidatesOnSpill); when no
// remote endpoint has headroom either, spilling would not help and only
// local endpoints remain. Without local endpoints, remote ones are kept.
type Filter struct {
	name   string
	params FilterParams
	now    func() time.Time
}

var _ fwksched.Filter = (*Filter)(nil)

// FilterFactory builds the filter from its EndpointPickerConfig parameters.
func FilterFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	p := DefaultFilterParams
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s parameters: %w", FilterType, err)
		}
	}
	if p.QueueDepthThreshold <= 0 || p.KVCacheUtilThreshold <= 0 || p.KVCacheUtilThreshold > 1 ||
		p.MetricsStalenessThreshold <= 0 || p.RemoteMetricsStalenessThreshold <= 0 || p.MaxRemoteCandidates <= 0 || p.MaxLocalCandidatesOnSpill <= 0 {
		return nil, errors.New(FilterType + ": thresholds, maxRemoteCandidates and maxLocalCandidatesOnSpill must be positive and kvCacheUtilThreshold at most 1")
	}
	return &Filter{name: name, params: p, now: time.Now}, nil
}

func (f *Filter) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: FilterType, Name: f.name}
}

func (f *Filter) Filter(_ context.Context, _ *fwksched.CycleState, _ *fwksched.LLMRequest, endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	// Without a spill the candidate lookup adds no remote endpoint: pass the
	// candidates through without copying them.
	first := slices.IndexFunc(endpoints, isRemote)
	if first < 0 {
		return endpoints
	}
	now := f.now()
	local := make([]fwksched.Endpoint, 0, len(endpoints))
	remote := make([]fwksched.Endpoint, 0, len(endpoints)-first)
	var remoteRoom []fwksched.Endpoint
	localRoom := false
	for _, ep := range endpoints {
		if !isRemote(ep) {
			local = append(local, ep)
			localRoom = localRoom || f.hasRoom(ep.GetMetrics(), now, f.params.MetricsStalenessThreshold)
			continue
		}
		remote = append(remote, ep)
		if f.hasRoom(ep.GetMetrics(), now, f.params.RemoteMetricsStalenessThreshold) {
			remoteRoom = append(remoteRoom, ep)
		}
	}
	switch {
	case len(local) == 0 && len(remoteRoom) > 0:
		return remoteRoom
	case len(local) == 0:
		return remote
	case localRoom || len(remoteRoom) == 0:
		return local
	}
	return append(local, remoteRoom...)
}

// RemoteCandidates decides, before scheduling, which remote endpoints join
// the candidates of a request whose local endpoints have no headroom (see
// LocalSaturated, which the caller checks first): the least loaded remote
// endpoints with headroom, at most MaxRemoteCandidates, or none when no
// remote endpoint has headroom; without local endpoints, the least loaded
// remote endpoints whether they have headroom or not. The candidate lookup
// calls it, so that remote endpoints enter GIE's scheduling cycle, which
// copies and scores every candidate, only when they can be picked.
//
// Each peer's view is ordered by load, so only its front is read: once a
// peer has given MaxRemoteCandidates endpoints with headroom, the rest of
// it cannot rank higher, and past the queue threshold none has headroom.
func (f *Filter) RemoteCandidates(local []fwkdl.Endpoint, remote federation.Remote) []fwkdl.Endpoint {
	k := f.params.MaxRemoteCandidates
	roomSince := f.now().Add(-time.Duration(f.params.RemoteMetricsStalenessThreshold))
	best := make([]ranked[*federation.Entry], 0, k)
	withRoom := false
	// Equal loads rank in visiting order: start at a random peer, so that
	// ties do not always go to the same cluster.
	n := len(remote.Peers)
	start := randomStart(n)
	for i := range n {
		v := remote.Peers[(start+i)%n]
		taken := 0
		for j := range v.Entries {
			e := &v.Entries[j]
			if len(local) > 0 && e.Queue() >= f.params.QueueDepthThreshold {
				break
			}
			if e.Updated.Before(remote.Stale) {
				continue
			}
			r := ranked[*federation.Entry]{v: e, queue: e.Queue(), kv: e.KVCacheUsage(),
				ahead: !e.Updated.Before(roomSince) && e.Queue() < f.params.QueueDepthThreshold && e.KVCacheUsage() < f.params.KVCacheUtilThreshold}
			if r.ahead {
				withRoom = true
			} else if len(local) > 0 {
				continue
			}
			best = insertBounded(best, r)
			if r.ahead {
				if taken++; taken == k {
					break
				}
			}
		}
	}
	if len(best) == 0 || len(local) > 0 && !withRoom {
		return nil
	}
	entries := make([]*federation.Entry, len(best))
	for i, r := range best {
		entries[i] = r.v
	}
	return federation.AppendEndpoints(nil, entries)
}

// LocalCandidates returns the local endpoints that stay candidates when a
// request spills (RemoteCandidates gave some): the MaxLocalCandidatesOnSpill
// least loaded, by queue then KV-cache usage, those with fresh metrics
// first. None has headroom (the caller
// checked LocalSaturated), so the rest rank below these on GIE's load
// scorers; what could still favour one of them is a prefix-cache hit, which
// is worth little behind a queue past the threshold.
func (f *Filter) LocalCandidates(local []fwkdl.Endpoint) []fwkdl.Endpoint {
	k := f.params.MaxLocalCandidatesOnSpill
	if len(local) <= k {
		return local
	}
	best := make([]ranked[fwkdl.Endpoint], 0, k)
	// Saturated local endpoints often report equal loads: start at a random
	// one, so that ties do not always keep the same endpoints.
	now := f.now()
	start := randomStart(len(local))
	for i := range local {
		ep := local[(start+i)%len(local)]
		r := ranked[fwkdl.Endpoint]{v: ep, queue: math.MaxInt, kv: math.Inf(1)}
		if m := ep.GetMetrics(); m != nil {
			r.queue, r.kv = m.WaitingQueueSize, m.KVCacheUsagePercent
			r.ahead = now.Sub(m.UpdateTime) <= time.Duration(f.params.MetricsStalenessThreshold)
		}
		best = insertBounded(best, r)
	}
	out := make([]fwkdl.Endpoint, len(best))
	for i, r := range best {
		out[i] = r.v
	}
	return out
}

// isRemote reports whether ep came from a peer EPP.
func isRemote(ep fwksched.Endpoint) bool { return federation.OriginOf(ep) != nil }

func randomStart(n int) int {
	if n > 1 {
		return rand.IntN(n)
	}
	return 0
}

// insertBounded inserts r into best, which is ordered and holds at most
// cap(best) endpoints, after those that rank equal.
func insertBounded[T any](best []ranked[T], r ranked[T]) []ranked[T] {
	if len(best) == cap(best) && !r.less(best[len(best)-1]) {
		return best
	}
	i, _ := slices.BinarySearchFunc(best, r, func(a, b ranked[T]) int {
		if a.less(b) {
			return -1
		}
		return 1
	})
	if len(best) < cap(best) {
		best = append(best, ranked[T]{})
	}
	copy(best[i+1:], best[i:len(best)-1])
	best[i] = r
	return best
}

// LocalSaturated reports whether no local endpoint has headroom, that is
// whether remote endpoints may join at all.
func (f *Filter) LocalSaturated(local []fwkdl.Endpoint) bool {
	now := f.now()
	for _, ep := range local {
		if f.hasRoom(ep.GetMetrics(), now, f.params.MetricsStalenessThreshold) {
			return false
		}
	}
	return true
}

// ranked orders endpoints by load: those ahead first (remote endpoints
// with headroom, local endpoints with fresh metrics), then by queue, then by
// KV-cache usage.
type ranked[T any] struct {
	v     T
	ahead bool
	queue int
	kv    float64
}

func (a ranked[T]) less(b ranked[T]) bool {
	if a.ahead != b.ahead {
		return a.ahead
	}
	if a.queue != b.queue {
		return a.queue < b.queue
	}
	return a.kv < b.kv
}

func (f *Filter) hasRoom(m *fwkdl.Metrics, now time.Time, staleAfter Duration) bool {
	return m != nil && now.Sub(m.UpdateTime) <= time.Duration(staleAfter) &&
		m.WaitingQueueSize < f.params.QueueDepthThreshold && m.KVCacheUsagePercent < f.params.KVCacheUtilThreshold
}

// Duration is a time.Duration written as a Go duration string ("200ms") in
// the configuration, as GIE's own plugins take durations.
type Duration time.Duration

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"200ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }
