// Package spill is the EPP's spill policy: whether a request leaves its
// cluster, and which local and remote endpoints are then its candidates.
//
// An endpoint has headroom while its metrics are fresh, its queue is below
// QueueDepthThreshold and its KV cache below KVCacheUtilThreshold: the same
// test as GIE's utilization-detector, whose defaults these are. A request
// stays local while any local endpoint has headroom (Saturated); once none
// has, the least loaded remote endpoints with headroom join (Remote) next to
// the least loaded local ones (Local).
//
// The policy is made once, from the parameters of the cross-cluster-filter
// plugin (package plugins/crosscluster), and shared: the EPP's candidate
// lookup decides the spill with it before scheduling, and the plugin trims
// the scheduled candidates with its HasRoom.
package spill

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// Params are the spill policy's parameters, as the cross-cluster-filter
// plugin takes them in the EndpointPickerConfig.
type Params struct {
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

// DefaultParams are used for parameters left out.
var DefaultParams = Params{
	QueueDepthThreshold:             5,
	KVCacheUtilThreshold:            0.8,
	MetricsStalenessThreshold:       Duration(200 * time.Millisecond),
	RemoteMetricsStalenessThreshold: Duration(time.Second),
	MaxRemoteCandidates:             16,
	MaxLocalCandidatesOnSpill:       16,
}

// Validate checks the parameters.
func (p Params) Validate() error {
	if p.QueueDepthThreshold <= 0 || p.KVCacheUtilThreshold <= 0 || p.KVCacheUtilThreshold > 1 ||
		p.MetricsStalenessThreshold <= 0 || p.RemoteMetricsStalenessThreshold <= 0 || p.MaxRemoteCandidates <= 0 || p.MaxLocalCandidatesOnSpill <= 0 {
		return errors.New("thresholds, maxRemoteCandidates and maxLocalCandidatesOnSpill must be positive and kvCacheUtilThreshold at most 1")
	}
	return nil
}

// Policy is the spill policy; see the package doc.
type Policy struct {
	params Params
	now    func() time.Time
}

// New returns the policy of params, which it validates, reading the time
// from now.
func New(params Params, now func() time.Time) (*Policy, error) {
	if err := params.Validate(); err != nil {
		return nil, err
	}
	return &Policy{params: params, now: now}, nil
}

// Endpoint is what HasRoom reads of an endpoint: its metrics, and its
// attributes, which say whether it is remote (federation.OriginOf).
type Endpoint interface {
	GetMetrics() *fwkdl.Metrics
	federation.Attributes
}

// HasRoom reports whether ep has headroom now, judged by the staleness
// threshold of a local or a remote endpoint.
func (p *Policy) HasRoom(ep Endpoint) bool {
	staleAfter := p.params.MetricsStalenessThreshold
	if federation.OriginOf(ep) != nil {
		staleAfter = p.params.RemoteMetricsStalenessThreshold
	}
	return p.hasRoom(ep.GetMetrics(), p.now(), staleAfter)
}

// Saturated reports whether no local endpoint has headroom, that is whether
// remote endpoints may join at all.
func (p *Policy) Saturated(local []fwkdl.Endpoint) bool {
	now := p.now()
	for _, ep := range local {
		if p.hasRoom(ep.GetMetrics(), now, p.params.MetricsStalenessThreshold) {
			return false
		}
	}
	return true
}

// Remote returns the remote endpoints that join the candidates of a request
// whose local endpoints have no headroom (the caller checks Saturated
// first): the least loaded remote endpoints with headroom, at most
// MaxRemoteCandidates, or none when no remote endpoint has headroom; without
// local endpoints, the least loaded remote endpoints whether they have
// headroom or not. The candidate lookup calls it, so that remote endpoints
// enter GIE's scheduling cycle, which copies and scores every candidate,
// only when they can be picked.
//
// Each peer's view is ordered by load, so only its front is read: once a
// peer has given MaxRemoteCandidates endpoints with headroom, the rest of
// it cannot rank higher, and past the queue threshold none has headroom.
func (p *Policy) Remote(local []fwkdl.Endpoint, remote federation.Remote) []fwkdl.Endpoint {
	k := p.params.MaxRemoteCandidates
	roomSince := p.now().Add(-time.Duration(p.params.RemoteMetricsStalenessThreshold))
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
			if len(local) > 0 && e.Queue() >= p.params.QueueDepthThreshold {
				break
			}
			if e.Updated.Before(remote.Stale) {
				continue
			}
			r := ranked[*federation.Entry]{v: e, queue: e.Queue(), kv: e.KVCacheUsage(),
				ahead: !e.Updated.Before(roomSince) && e.Queue() < p.params.QueueDepthThreshold && e.KVCacheUsage() < p.params.KVCacheUtilThreshold}
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

// Local returns the local endpoints that stay candidates when a request
// spills (Remote gave some): the MaxLocalCandidatesOnSpill least loaded, by
// queue then KV-cache usage, those with fresh metrics first. None has
// headroom (the caller checked Saturated), so the rest rank below these on
// GIE's load scorers; what could still favour one of them is a prefix-cache
// hit, which is worth little behind a queue past the threshold.
func (p *Policy) Local(local []fwkdl.Endpoint) []fwkdl.Endpoint {
	k := p.params.MaxLocalCandidatesOnSpill
	if len(local) <= k {
		return local
	}
	best := make([]ranked[fwkdl.Endpoint], 0, k)
	// Saturated local endpoints often report equal loads: start at a random
	// one, so that ties do not always keep the same endpoints.
	now := p.now()
	start := randomStart(len(local))
	for i := range local {
		ep := local[(start+i)%len(local)]
		r := ranked[fwkdl.Endpoint]{v: ep, queue: math.MaxInt, kv: math.Inf(1)}
		if m := ep.GetMetrics(); m != nil {
			r.queue, r.kv = m.WaitingQueueSize, m.KVCacheUsagePercent
			r.ahead = now.Sub(m.UpdateTime) <= time.Duration(p.params.MetricsStalenessThreshold)
		}
		best = insertBounded(best, r)
	}
	out := make([]fwkdl.Endpoint, len(best))
	for i, r := range best {
		out[i] = r.v
	}
	return out
}

// hasRoom is the headroom test.
func (p *Policy) hasRoom(m *fwkdl.Metrics, now time.Time, staleAfter Duration) bool {
	return m != nil && now.Sub(m.UpdateTime) <= time.Duration(staleAfter) &&
		m.WaitingQueueSize < p.params.QueueDepthThreshold && m.KVCacheUsagePercent < p.params.KVCacheUtilThreshold
}

func randomStart(n int) int {
	if n > 1 {
		return rand.IntN(n)
	}
	return 0
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
