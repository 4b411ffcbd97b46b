package main

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// target is where one attempt of a request goes: a cluster's gateway (with
// the Host of the pool's route) or, for the oracle, a pod.
type target struct {
	URL     string
	Host    string
	Cluster int
	// pod indexes the oracle's pods; -1 otherwise.
	pod int
	// via is the cluster of a load balancer the attempt passes on its way
	// to Cluster (SkyServe's); -1 when it goes there from where it entered.
	via int
	// lb is the URL of that load balancer's proxy (skyProxy), which
	// forwards the attempt to URL; empty when the attempt goes to URL
	// itself.
	lb string
}

// router is a routing policy in front of the clusters: what the entry side
// decides before the request reaches a gateway or pod.
type router interface {
	// route picks where arrival a goes; false when nothing is available.
	route(a arrival) (target, bool)
	// done is called once per routed attempt when its stream has ended.
	done(t target)
	// attempts is how many times a request is tried on connection errors,
	// and backoff the wait before retry i (1-based).
	attempts() int
	backoff(i int) time.Duration
	// lose tells the router that cluster c is gone, at the moment it is
	// gone; only a policy that sees the fleet instantly (the oracle) uses
	// it, the others learn it their own way.
	lose(c int)
}

// gateways are the clusters' gateway base URLs, indexed like the spokes.
type gateways []string

// entryRouter sends every request to the gateway it entered through, with
// the host of one pool: cluster-local GIE (each gateway's own stock EPP) or
// fleetinfer (each gateway's federated EPP, which may pick a remote pod).
type entryRouter struct {
	gws  gateways
	host string
}

func (e *entryRouter) route(a arrival) (target, bool) {
	return target{URL: e.gws[a.Entry], Host: e.host, Cluster: a.Entry, pod: -1, via: -1}, true
}
func (*entryRouter) done(target)               {}
func (*entryRouter) attempts() int             { return 1 }
func (*entryRouter) backoff(int) time.Duration { return 0 }
func (*entryRouter) lose(int)                  {}

// SkyServe's load balancer, as in skypilot-org/skypilot sky/serve: one LB
// that every request passes through, in one region (the serve controller's,
// where the LB process runs), a policy over the "ready replicas"
// (here: the clusters' gateways, each cluster's own EPP picking a pod), the
// ready set refreshed from the controller every
// LB_CONTROLLER_SYNC_INTERVAL_SECONDS (20 s), and up to LB_MAX_RETRY (3)
// attempts on connection errors with a backoff starting at 1 s
// (common_utils.Backoff, multiplier 1.6; its jitter left out).
type skyServe struct {
	gws  gateways
	host string
	// lb is the URL of the load balancer's proxy, which every request
	// passes.
	lb string
	// at is the cluster whose region the load balancer runs in: a request
	// entering elsewhere travels there first.
	at    int
	least bool // LeastLoadPolicy (default) rather than RoundRobinPolicy
	rnd   *rand.Rand

	mu    sync.Mutex
	ready []int
	index int
	// load is LeastLoadPolicy.load_map: requests in flight per replica as
	// the LB itself counts them, from dispatch (pre_execute_hook) to the
	// end of the proxied stream (post_execute_hook).
	load map[int]int
}

// SkyServe's constants (sky/serve/constants.py).
const (
	skySyncInterval   = 20 * time.Second
	skyMaxRetry       = 3
	skyInitialBackoff = time.Second
)

func newSkyServe(gws gateways, host, lb string, at int, least bool, seed uint64) *skyServe {
	return &skyServe{gws: gws, host: host, lb: lb, at: at, least: least, rnd: rand.New(rand.NewPCG(seed, 3)), load: map[int]int{}}
}

// setReady is set_ready_replicas: nothing changes for the same set;
// RoundRobinPolicy shuffles a new set and restarts at its first replica,
// LeastLoadPolicy keeps the load of replicas that stay.
func (s *skyServe) setReady(ready []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, b := slices.Clone(ready), slices.Clone(s.ready)
	slices.Sort(a)
	slices.Sort(b)
	if slices.Equal(a, b) && s.ready != nil {
		return
	}
	s.ready = slices.Clone(ready)
	if !s.least {
		s.rnd.Shuffle(len(s.ready), func(i, j int) { s.ready[i], s.ready[j] = s.ready[j], s.ready[i] })
		s.index = 0
		return
	}
	for r := range s.load {
		if !slices.Contains(s.ready, r) {
			delete(s.load, r)
		}
	}
}

// refresh is one sync with the controller: the replicas whose probe
// answers are the ready set.
func (s *skyServe) refresh(ready func(c int) bool) {
	var set []int
	for c := range s.gws {
		if ready(c) {
			set = append(set, c)
		}
	}
	s.setReady(set)
}

// sync refreshes the ready set every skySyncInterval from start (the first
// refresh, at start, is the caller's) until ctx ends.
func (s *skyServe) sync(ctx context.Context, start time.Time, ready func(c int) bool) {
	for next := start.Add(skySyncInterval); ; next = next.Add(skySyncInterval) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
			s.refresh(ready)
		}
	}
}

func (s *skyServe) route(arrival) (target, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ready) == 0 {
		return target{}, false
	}
	var c int
	if s.least {
		// Python's min: the first replica with the least load.
		c = s.ready[0]
		for _, r := range s.ready[1:] {
			if s.load[r] < s.load[c] {
				c = r
			}
		}
		s.load[c]++
	} else {
		c = s.ready[s.index]
		s.index = (s.index + 1) % len(s.ready)
	}
	return target{URL: s.gws[c], Host: s.host, Cluster: c, pod: -1, via: s.at, lb: s.lb}, true
}

func (s *skyServe) done(t target) {
	if !s.least {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.load[t.Cluster]--
}

func (*skyServe) attempts() int { return skyMaxRetry }

func (*skyServe) backoff(i int) time.Duration {
	d := float64(skyInitialBackoff)
	for range i - 1 {
		d *= 1.6
	}
	return time.Duration(d)
}

func (*skyServe) lose(int) {}

// oracle sees every pod's true load at once: the requests in flight to
// each pod, counted exactly in this process (all traffic comes from here),
// which pods hold which prompt prefix (every request that carried it went
// through here, and so did the warm-up), the current round trip of every
// link, and which pods are gone. It sends each request straight to the pod
// where it expects the first token soonest, ties broken at random:
//
//	requests in flight / batch slots × oracleServiceTime
//	+ the round trip from the entry cluster to the pod's
//	+ the prefill of the prefix when the pod does not hold it.
type oracle struct {
	pods []oraclePod
	rnd  *rand.Rand
	// rtt is the current round trip between two clusters.
	rtt func(a, b int) time.Duration
	// prefill is the prefill time of a prefix the pod does not hold.
	prefill time.Duration

	mu sync.Mutex
}

// oracleServiceTime is how long a request holds a batch slot under the
// benchmark's latency model: 20 ms overhead, 128 prompt tokens at 0.4 ms
// and 16 output tokens at 20 ms.
const oracleServiceTime = 400 * time.Millisecond

type oraclePod struct {
	addr     string
	cluster  int
	slots    int
	inflight int
	gone     bool
	// prefixes the pod holds.
	prefixes map[int]bool
}

func newOracle(pods []oraclePod, seed uint64, rtt func(a, b int) time.Duration, prefill time.Duration) *oracle {
	for i := range pods {
		pods[i].prefixes = map[int]bool{}
	}
	return &oracle{pods: pods, rnd: rand.New(rand.NewPCG(seed, 4)), rtt: rtt, prefill: prefill}
}

// expected is the oracle's estimate of a's time to first token on pod p.
func (o *oracle) expected(p *oraclePod, a arrival) time.Duration {
	d := time.Duration(p.inflight) * oracleServiceTime / time.Duration(p.slots)
	if p.cluster != a.Entry {
		d += o.rtt(a.Entry, p.cluster)
	}
	if a.Prefix >= 0 && !p.prefixes[a.Prefix] {
		d += o.prefill
	}
	return d
}

func (o *oracle) route(a arrival) (target, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	best, ties := -1, 0
	var bestD time.Duration
	for i := range o.pods {
		p := &o.pods[i]
		if p.gone {
			continue
		}
		d := o.expected(p, a)
		switch {
		case best < 0 || d < bestD:
			ties = 1
		case d == bestD:
			ties++
			if o.rnd.IntN(ties) != 0 {
				continue
			}
		default:
			continue
		}
		best, bestD = i, d
	}
	if best < 0 {
		return target{}, false
	}
	p := &o.pods[best]
	p.inflight++
	if a.Prefix >= 0 {
		p.prefixes[a.Prefix] = true
	}
	return target{URL: "http://" + p.addr, Cluster: p.cluster, pod: best, via: -1}, true
}

// warm records that the pods of cluster c hold prefix.
func (o *oracle) warm(c, prefix int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range o.pods {
		if o.pods[i].cluster == c {
			o.pods[i].prefixes[prefix] = true
		}
	}
}

func (o *oracle) done(t target) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pods[t.pod].inflight--
}

func (*oracle) attempts() int             { return 1 }
func (*oracle) backoff(int) time.Duration { return 0 }

func (o *oracle) lose(c int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range o.pods {
		if o.pods[i].cluster == c {
			o.pods[i].gone = true
		}
	}
}
