// Package spill is the EPP's spill policy: whether a request leaves its
// cluster, and which remote endpoints are then its candidates.
//
// The policy estimates each endpoint's time to first token (TTFT) and sends
// a request to another cluster only when a remote endpoint is expected to
// answer sooner than the best local one by CrossMargin:
//
//	TTFT ≈ wait(load) + round trip + prefill of the uncached prompt
//
// where load is the endpoint's waiting and running requests (for a local
// pod, Meter.Scraped: the scrape's, less those this picker saw end since, or
// its own requests in flight to it, when more; a remote pod's peer
// publishes that of its own pods, to which this picker adds its own
// requests sent to the pod too late to be in what the peer read, or counts
// all of them when more), and wait turns it into time with the pod's
// service rate, its measured requests per second with a full batch (Meter;
// remote endpoints, which serve the same model, take the local pods'
// measured rate, and ServiceRate stands in until one is measured), and its
// batch slots (Meter; remote endpoints take the local pods' largest). The
// round trip is the federation's measurement to the endpoint's cluster
// (with LearnCrossingPath, the crossing's measured path when that is
// longer: Meter.Path, what a Parent-mode crossing passes besides the link
// and the remote pod); 0 for local endpoints. The prefill counts only where
// PrefillPerToken is set: the prompt's blocks after those the endpoint
// holds (package prefixes: this picker's record for a local pod, the
// peer's published summary for a remote one) times PrefillPerToken; a
// prompt's part every endpoint must prefill alike is left out.
//
// A continuous-batching server runs each step for its whole batch, so
// every request it runs slows the first token of the next one (and the
// next one, while it runs, those after it), but while the batch has a
// free slot the next one does not wait for any to end: each running
// request then costs RunningCost of a slot's turn (1/service rate), and
// each request beyond a full batch a whole turn. A request
// therefore leaves a pod that runs a few for an idle one nearby, as the
// routing benchmark's oracle does (bench/routing), when the round trip is
// less than what those few add, rather than staying until the batch is
// full.
//
// The fixed thresholds are caps: a remote endpoint with a queue of
// QueueDepthThreshold or more, a KV cache at least KVCacheUtilThreshold
// full, or data older than RemoteMetricsStalenessThreshold is never a
// candidate while local endpoints exist. Local endpoints whose metrics are
// older than MetricsStalenessThreshold are not estimated (their load is
// unknown); when no local endpoint has fresh metrics, the best remote ones
// are candidates.
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
	"sort"
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
)

// Params are the spill policy's parameters, as the cross-cluster-filter
// plugin takes them in the EndpointPickerConfig.
type Params struct {
	// CrossMargin is how much sooner a remote endpoint must be expected to
	// answer than the best local one for a request to cross: the estimate's
	// error, which a crossing should not be a gamble on. It is also how
	// much later than the soonest remote candidate another may be expected
	// and still be a candidate.
	CrossMargin Duration `json:"crossMargin"`
	// ServiceRate is a pod's requests per second with a full batch until
	// one is measured.
	ServiceRate float64 `json:"serviceRate"`
	// RunningCost is what each request a pod runs while its batch has a
	// free slot costs a new request sent there, as a fraction of a slot's
	// turn (1/service rate). It counts both ways: each running request
	// slows the new one's first token by its share of a batch step, and
	// the new one, while it runs, slows as much the first token of each
	// request sent to the pod after it, of which there are about as many
	// as the pod runs (Little's law: arrivals over a request's stay are
	// the requests running on average). So twice the share of a step: a
	// request then goes where it delays the fleet least, not only where
	// it is itself served soonest, and leaves a hot cluster's pods some
	// room for the bursts to come. 1 counts every request as a whole
	// turn, as if the batch were always full. A pod's batch size is
	// measured (Meter); a pod this picker never scraped counts every
	// request a turn.
	RunningCost float64 `json:"runningCost"`
	// QueueDepthThreshold and KVCacheUtilThreshold cap remote candidates.
	QueueDepthThreshold  int     `json:"queueDepthThreshold"`
	KVCacheUtilThreshold float64 `json:"kvCacheUtilThreshold"`
	// MetricsStalenessThreshold applies to local endpoints.
	MetricsStalenessThreshold Duration `json:"metricsStalenessThreshold"`
	// RemoteMetricsStalenessThreshold applies to remote endpoints, whose
	// data also crossed the federation (remote endpoints older than the
	// federation's staleness bound are never candidates at all).
	RemoteMetricsStalenessThreshold Duration `json:"remoteMetricsStalenessThreshold"`
	// PrefillPerToken is the model servers' prefill time per prompt token,
	// which weighs a prompt's prefix held in one cluster's cache against
	// the round trip there; zero leaves prefixes out of the estimate.
	PrefillPerToken Duration `json:"prefillPerToken"`
	// MaxRemoteCandidates bounds how many remote endpoints, those expected
	// soonest, are a crossing request's candidates. GIE copies and scores
	// every candidate on every pick, so without a bound a fleet of
	// thousands of pods would make each crossing pick that much slower.
	MaxRemoteCandidates int `json:"maxRemoteCandidates"`
	// ConnectRoundTrips is what a crossing costs besides its round trip
	// when the gateway has no connection open to its destination
	// (federation.NextHop): the round trips a new connection takes before the
	// request can travel, 1 for TCP (deploy/envoy/envoy.yaml), 2 with TLS
	// 1.3 on top. 0 leaves connections out of the estimate.
	ConnectRoundTrips int `json:"connectRoundTrips"`
	// DestinationIdleTimeout is how long after this picker's last crossing
	// to a destination the gateway is taken to keep its connections there:
	// Envoy drops an ORIGINAL_DST host, and closes its connections, once it
	// saw no request for a cleanup_interval (5 s by default; 2 minutes in
	// deploy/envoy/envoy.yaml, whose value the default here follows). A gateway
	// that kept them longer costs only crossings not taken; one that kept
	// them shorter, a handshake the estimate left out. A crossing sent by
	// another replica of this picker also keeps them open, which this one
	// does not see: with replicas, crossings cost more here than they do.
	DestinationIdleTimeout Duration `json:"destinationIdleTimeout"`
	// LearnCrossingPath charges a crossing its measured path (Meter.Path)
	// where that exceeds the link's round trip. Off by default: the path
	// also holds the origin's own forwarding after the pick, which a local
	// request pays alike, and in the routing benchmark pickers using it
	// crossed less and found fewer prefixes cached (docs/performance/history.md).
	LearnCrossingPath bool `json:"learnCrossingPath"`
}

// DefaultParams are used for parameters left out.
var DefaultParams = Params{
	CrossMargin:                     Duration(20 * time.Millisecond),
	ServiceRate:                     10,
	RunningCost:                     0.5,
	QueueDepthThreshold:             5,
	KVCacheUtilThreshold:            0.8,
	MetricsStalenessThreshold:       Duration(200 * time.Millisecond),
	RemoteMetricsStalenessThreshold: Duration(time.Second),
	MaxRemoteCandidates:             16,
	ConnectRoundTrips:               1,
	DestinationIdleTimeout:          Duration(2 * time.Minute),
}

// MaxDestinationIdleTimeout bounds DestinationIdleTimeout: the meter
// forgets destinations not crossed to for that long.
const MaxDestinationIdleTimeout = time.Hour

// Validate checks the parameters.
func (p Params) Validate() error {
	if p.CrossMargin < 0 || p.PrefillPerToken < 0 || !(p.ServiceRate > 0) || p.QueueDepthThreshold <= 0 || p.KVCacheUtilThreshold <= 0 || p.KVCacheUtilThreshold > 1 ||
		p.MetricsStalenessThreshold <= 0 || p.RemoteMetricsStalenessThreshold <= 0 || p.MaxRemoteCandidates <= 0 || !(p.RunningCost >= 0 && p.RunningCost <= 1) {
		return errors.New("serviceRate, thresholds and maxRemoteCandidates must be positive, crossMargin and prefillPerToken not negative, and kvCacheUtilThreshold and runningCost at most 1 (runningCost not negative)")
	}
	if p.ConnectRoundTrips < 0 || p.DestinationIdleTimeout <= 0 || time.Duration(p.DestinationIdleTimeout) > MaxDestinationIdleTimeout {
		return fmt.Errorf("connectRoundTrips must not be negative, and destinationIdleTimeout positive and at most %v", MaxDestinationIdleTimeout)
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

// UsesPrefixes reports whether the estimate weighs cached prefixes
// (PrefillPerToken set), so that a prompt's blocks are worth hashing.
func (p *Policy) UsesPrefixes() bool { return p.params.PrefillPerToken > 0 }

// Endpoint is what HasRoom reads of an endpoint: its metrics, and its
// attributes, which say whether it is remote (federation.OriginOf).
type Endpoint interface {
	GetMetrics() *fwkdl.Metrics
	federation.Attributes
}

// HasRoom reports whether ep is within the caps now, judged by the
// staleness threshold of a local or a remote endpoint.
func (p *Policy) HasRoom(ep Endpoint) bool {
	staleAfter := p.params.MetricsStalenessThreshold
	if federation.OriginOf(ep) != nil {
		staleAfter = p.params.RemoteMetricsStalenessThreshold
	}
	return p.hasRoom(ep.GetMetrics(), p.now(), staleAfter)
}

// Remote returns the remote endpoints that are a request's candidates
// instead of the local ones, none when the request stays local: at most
// MaxRemoteCandidates, those expected to answer soonest and no later than
// CrossMargin after the soonest, each expected sooner than the best local
// endpoint by CrossMargin and within the caps; without local endpoints
// with fresh metrics, the remote endpoints expected soonest whatever their
// load. The candidate lookup calls it, so that remote endpoints enter GIE's
// scheduling cycle, which copies and scores every candidate, only when
// they can be picked.
//
// The remote endpoints are read only when some peer's round trip leaves
// room to win against the best local estimate, and each peer's view is
// ordered by queue, so only its front is read: up to the queue cap, and
// until the queue alone puts an endpoint past the local estimate or the
// candidates already found.
//
// The Estimate says what was weighed, for the pick's debug log.
func (p *Policy) Remote(local []fwkdl.Endpoint, remote federation.Remote, m *Meter, prompt Prompt) ([]fwkdl.Endpoint, Estimate) {
	now := p.now()
	if p.params.PrefillPerToken == 0 {
		prompt = Prompt{}
	}
	best := p.bestLocal(local, now, m, prompt)
	weighed := Estimate{Local: best}
	if len(remote.Peers) == 0 || best <= p.minRTT(remote, m)+time.Duration(p.params.CrossMargin) {
		return nil, weighed
	}
	capped := best != never
	beat := best - time.Duration(p.params.CrossMargin)
	poolRate := p.params.ServiceRate
	if r, ok := m.PoolRate(); ok {
		poolRate = r
	}
	poolSlots := m.PoolSlots()
	roomSince := now.Add(-time.Duration(p.params.RemoteMetricsStalenessThreshold))
	idleSince := now.Add(-time.Duration(p.params.DestinationIdleTimeout))
	k := p.params.MaxRemoteCandidates
	top := make([]ranked, 0, k)
	ranks := 0
	// Equal estimates rank in visiting order: start at a random peer, so
	// that ties do not always go to the same cluster.
	n := len(remote.Peers)
	start := randomStart(n)
	for i := range n {
		v := remote.Peers[(start+i)%n]
		cost := p.crossingCost(v.Origin, m)
		// A Parent-mode peer is one destination, its gateway, and pays a
		// new connection once for all its pods; an Endpoint-mode peer's
		// pods are each their own, so the queue's bar below counts the
		// round trip alone and each pod adds its own.
		parent := v.Origin.Mode == fleetv1alpha1.FederationParent
		if parent {
			if c := p.connect(v.Origin, v.Origin.Gateway, m, idleSince); c > 0 {
				cost += c
				weighed.Unconnected++
			}
		}
		weighed.Read += len(v.Entries)
		for j := range v.Entries {
			e := &v.Entries[j]
			if capped && e.Queue() >= p.params.QueueDepthThreshold {
				weighed.Queued += len(v.Entries) - j
				break
			}
			if e.Updated.Before(remote.Stale) || capped && e.Updated.Before(roomSince) {
				weighed.Stale++
				continue
			}
			if capped && e.KVCacheUsage() >= p.params.KVCacheUtilThreshold {
				weighed.CacheFull++
				continue
			}
			// The view is ordered by queue: once the queue alone puts an
			// endpoint past the bar, so it does every later one.
			floor := p.wait(e.Queue(), poolSlots, poolRate) + cost
			if (capped && floor >= beat) || (len(top) == k && floor >= top[k-1].est) {
				weighed.heldUnread(v.Entries[j:], capped, p.params.QueueDepthThreshold)
				break
			}
			entryCost := cost
			if !parent {
				if c := p.connect(v.Origin, e.NextHop(), m, idleSince); c > 0 {
					entryCost += c
					weighed.Unconnected++
				}
			}
			// The prefill, from the summary, comes before the pod's own
			// load: at headroom most endpoints fall past the bar by it.
			var unheld time.Duration
			if len(prompt.Hashes) > 0 {
				held := 0
				if s := e.Prefixes; s != nil {
					held = s.Match(prompt.Hashes)
				}
				unheld = p.prefill(len(prompt.Hashes) - held)
			}
			floor += entryCost - cost
			if (capped && floor+unheld >= beat) || (len(top) == k && floor+unheld >= top[k-1].est) {
				weighed.Slower++
				continue
			}
			// This picker's own requests in flight to the pod only add to
			// its load: look them up only for a pod within the bar without.
			load := e.Queue() + e.Running()
			est := p.wait(load, poolSlots, poolRate) + entryCost + unheld
			if !capped || est < beat {
				if pm := m.lookup(e.Endpoint.GetMetadata().NamespacedName); pm != nil {
					est = p.wait(remoteLoad(load, e, v.Origin, pm), poolSlots, poolRate) + entryCost + unheld
				}
			}
			if capped && est >= beat {
				weighed.Slower++
				continue
			}
			top = insertBounded(top, ranked{e: e, est: est})
			ranks++
		}
	}
	// GIE's scorers choose among the candidates knowing neither the round
	// trips nor the peers' prefix summaries: offer them only those the
	// estimate cannot tell apart from the soonest, within CrossMargin of it,
	// so that a pod one link further or without the prompt's prefix is not
	// picked for its shorter queue.
	if len(top) > 0 {
		last := top[0].est + time.Duration(p.params.CrossMargin)
		top = top[:sort.Search(len(top), func(i int) bool { return top[i].est > last })]
	}
	// Those ranked but not among the candidates.
	weighed.Slower += ranks - len(top)
	if len(top) == 0 {
		return nil, weighed
	}
	weighed.Remote = top[0].est
	entries := make([]*federation.Entry, len(top))
	for i, r := range top {
		entries[i] = r.e
	}
	return federation.AppendEndpoints(nil, entries), weighed
}

// Estimate is what Remote weighed: the soonest a local endpoint is expected
// to answer the request (see LocalKnown), and the soonest a remote
// candidate is, round trip included (0 when no remote endpoint is a
// candidate); and of the remote endpoints, how many it read (0 when the
// best local estimate was within the nearest peer's round trip and the
// margin, so that none could win) and why those read are no candidates:
// Read is the candidates plus Queued, Stale, CacheFull and Slower.
type Estimate struct {
	Local, Remote time.Duration
	Read          int
	// Queued had a queue at the cap (QueueDepthThreshold), CacheFull a KV
	// cache at its cap; Stale had data older than the remote staleness
	// threshold; Slower were within the caps but not expected sooner than
	// the best local endpoint by the margin, or not among the
	// MaxRemoteCandidates soonest, or expected later than the soonest
	// remote one by more than the margin. Endpoints left unread because
	// their queue alone put them past the bar count as Slower, or as Queued
	// when their queue is at the cap.
	Queued, Stale, CacheFull, Slower int
	// Unconnected counts the destinations (federation.NextHop: a Parent-mode
	// peer's gateway, an Endpoint-mode pod within the caps) charged a new
	// connection (ConnectRoundTrips): this picker had not crossed there
	// for DestinationIdleTimeout.
	Unconnected int
}

// heldUnread counts the endpoints rest, ordered by queue and left unread,
// as Queued from the first whose queue is at the cap (capped: while local
// endpoints have fresh metrics), as Slower before it.
func (e *Estimate) heldUnread(rest []federation.Entry, capped bool, queueCap int) {
	slower := len(rest)
	if capped {
		slower = sort.Search(len(rest), func(i int) bool { return rest[i].Queue() >= queueCap })
	}
	e.Slower += slower
	e.Queued += len(rest) - slower
}

// LocalKnown reports whether some local endpoint had fresh metrics, so that
// Local is an estimate.
func (e Estimate) LocalKnown() bool { return e.Local != never }

// remoteLoad is the load of the remote endpoint e, whose peer published
// load, with this picker's own requests in flight to it (pm): those it sent
// too late to have reached the pod when the peer read it, a one-way trip
// over the link before, add to what the peer published, and all of them
// count when they are more. A peer that reads a pod seconds after the last
// crossing to it has them all; one that read it just before a burst of
// crossings has none of the burst, while its other requests still run.
func remoteLoad(load int, e *federation.Entry, o *federation.Origin, pm *podMeter) int {
	unseen := pm.sentAfter(e.Read().Add(-o.RTT() / 2))
	return max(load+unseen, int(pm.inflight.Load()))
}

// never is the estimate of an endpoint whose load is unknown.
const never = time.Duration(math.MaxInt64)

// bestLocal is the soonest a local endpoint with fresh metrics is expected
// to answer, never without one.
func (p *Policy) bestLocal(local []fwkdl.Endpoint, now time.Time, m *Meter, prompt Prompt) time.Duration {
	best := never
	// No local pod holds more of the prompt than some pod does: when none
	// holds its first block, none is matched.
	held := 0
	if len(prompt.Hashes) > 0 {
		held = prompt.Local.Held(prompt.Hashes)
	}
	for _, ep := range local {
		mt := ep.GetMetrics()
		if mt == nil || now.Sub(mt.UpdateTime) > time.Duration(p.params.MetricsStalenessThreshold) {
			continue
		}
		pm, waiting, running := m.scraped(ep.GetMetadata().NamespacedName, mt.WaitingQueueSize, mt.RunningRequestsSize, mt.UpdateTime)
		rate, slots := p.params.ServiceRate, 0
		if pm != nil {
			if r, ok := pm.rate(); ok {
				rate = r
			}
			slots = int(pm.slots())
		}
		est := p.wait(waiting+running, slots, rate)
		if len(prompt.Hashes) > 0 {
			matched := 0
			if held > 0 {
				matched = prompt.Local.Match(ep.GetMetadata().NamespacedName, prompt.Hashes[:held])
			}
			est += p.prefill(len(prompt.Hashes) - matched)
		}
		best = min(best, est)
	}
	return best
}

// Prompt is what the estimate knows of a request's prompt: its block hashes
// (prefixes.Hashes) and the record of which local pods hold which; zero
// leaves prefixes out.
type Prompt struct {
	Hashes []uint64
	Local  *prefixes.Index
}

// prefill is the expected prefill time of blocks uncached blocks.
func (p *Policy) prefill(blocks int) time.Duration {
	return time.Duration(blocks*prefixes.TokensPerBlock) * time.Duration(p.params.PrefillPerToken)
}

// minRTT is the least a crossing to a peer costs: no remote endpoint is
// expected sooner than that.
func (p *Policy) minRTT(remote federation.Remote, m *Meter) time.Duration {
	out := never
	for _, v := range remote.Peers {
		out = min(out, p.crossingCost(v.Origin, m))
	}
	return out
}

// crossingCost is what a crossing to o's cluster costs: the link's round
// trip, or with LearnCrossingPath the measured path when that is more.
func (p *Policy) crossingCost(o *federation.Origin, m *Meter) time.Duration {
	if p.params.LearnCrossingPath {
		return max(o.RTT(), m.Path(o.Cluster))
	}
	return o.RTT()
}

// connect is what a crossing to dest, in o's cluster, costs for its
// connection: nothing while this picker crossed there since idleSince (the
// gateway keeps a connection open) or without a meter (nothing known),
// else ConnectRoundTrips of the link's round trip.
func (p *Policy) connect(o *federation.Origin, dest string, m *Meter, idleSince time.Time) time.Duration {
	if p.params.ConnectRoundTrips == 0 || m == nil || m.sentSince(dest, idleSince) {
		return 0
	}
	return time.Duration(p.params.ConnectRoundTrips) * o.RTT()
}

// wait is the expected wait for a first token at a pod with load waiting
// and running requests, a batch of slots (0: not known) and service rate
// (requests/s with a full batch): RunningCost of a turn (1/rate) for each
// request running while a slot is free, a whole turn for each request
// beyond a full batch, and each request a turn while slots is not known.
func (p *Policy) wait(load, slots int, rate float64) time.Duration {
	turns := float64(load)
	if slots > 0 {
		free := float64(min(load, slots-1))
		turns = free*p.params.RunningCost + float64(load) - free
	}
	return time.Duration(min(turns/rate*float64(time.Second), float64(never/2)))
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

// ranked is a remote entry with its estimate.
type ranked struct {
	e   *federation.Entry
	est time.Duration
}

// insertBounded inserts r into top, which is ordered by estimate and holds
// at most cap(top) entries, after those that rank equal.
func insertBounded(top []ranked, r ranked) []ranked {
	if len(top) == cap(top) && r.est >= top[len(top)-1].est {
		return top
	}
	i, _ := slices.BinarySearchFunc(top, r, func(a, b ranked) int {
		if a.est < b.est {
			return -1
		}
		return 1
	})
	if len(top) < cap(top) {
		top = append(top, ranked{})
	}
	copy(top[i+1:], top[i:len(top)-1])
	top[i] = r
	return top
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
