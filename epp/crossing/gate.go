// Package crossing decides which remote clusters a pick may cross to, from
// what the EPP saw of its own picks: no remote cluster takes more than a
// configured share of them (a peer that claims an idle fleet cannot draw
// all of this cluster's traffic), and a circuit breaker per remote cluster
// stops crossings to a cluster whose crossed requests fail or are slow,
// whatever its peer says of its load.
//
// The candidate lookup asks Admitted before remote endpoints join a pick;
// the director reports each pick (Picked) and the request path each crossed
// request's outcome (Observe).
package crossing

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// Options configure a Gate.
type Options struct {
	// MaxShare is the largest share of picks one remote cluster may take,
	// over Window; 1 does not bound.
	MaxShare float64
	// Window is what the share is measured over, and MinPicks how many
	// picks it must hold before the share applies.
	Window   time.Duration
	MinPicks int
	// Failures is how many crossed requests to a cluster that fail in a
	// row open its breaker, for Open; then one request probes it.
	Failures int
	Open     time.Duration
	// SlowAfter counts a crossed request whose response headers took
	// longer as failed; 0 judges errors only.
	SlowAfter time.Duration
}

// DefaultOptions bound nothing by share, and open a cluster's breaker for
// 10 s after 5 crossed requests in a row failed or took over 30 s to their
// response headers.
var DefaultOptions = Options{MaxShare: 1, Window: 10 * time.Second, MinPicks: 20, Failures: 5, Open: 10 * time.Second, SlowAfter: 30 * time.Second}

var (
	heldBack = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_crossings_held_back_total",
		Help: "Picks for which a remote cluster's endpoints were left out, by cluster and reason (share: it took its maximum share of picks; breaker: its circuit breaker is open).",
	}, []string{"cluster", "reason"})
	outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_crossing_outcomes_total",
		Help: "Crossed requests by cluster and outcome (ok, error: 5xx or no response, slow: response headers later than the breaker's bound).",
	}, []string{"cluster", "outcome"})
	breakerOpen = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_epp_crossing_breaker_open",
		Help: "1 while the circuit breaker of crossings to a cluster is open (or probing), else 0.",
	}, []string{"cluster"})
)

// Collectors returns the package's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{heldBack, outcomes, breakerOpen}
}

// Gate holds the picks and breakers; safe for concurrent use. A nil Gate
// admits every cluster and records nothing.
type Gate struct {
	opts Options

	mu sync.Mutex
	// The share is counted in two halves of the window: cur since
	// curStart, prev the half before.
	cur, prev   map[string]int
	curN, prevN int
	curStart    time.Time
	breakers    map[string]*breaker
}

type breaker struct {
	failures int
	// openUntil is when an open breaker lets the next probe through; zero
	// while closed. A probe moves it on by Open, so a probe whose pick
	// went elsewhere, and was never observed, does not hold it open.
	openUntil time.Time
}

// New returns a gate with opts.
func New(opts Options) *Gate {
	return &Gate{opts: opts, cur: map[string]int{}, prev: map[string]int{}, breakers: map[string]*breaker{}}
}

// Admitted returns the peers' views whose cluster a pick at now may cross
// to. A view it leaves out is counted once per pick.
func (g *Gate) Admitted(peers []*federation.View, now time.Time) []*federation.View {
	if g == nil {
		return peers
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.roll(now)
	out := peers[:0:0]
	for _, v := range peers {
		c := v.Origin.Cluster
		switch {
		case g.overShare(c):
			heldBack.WithLabelValues(c, "share").Inc()
		case !g.breakerAdmits(c, now):
			heldBack.WithLabelValues(c, "breaker").Inc()
		default:
			out = append(out, v)
		}
	}
	return out
}

// Picked records a pick's primary cluster ("" for a local pick).
func (g *Gate) Picked(cluster string, now time.Time) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.roll(now)
	g.cur[cluster]++
	g.curN++
}

// Observe records, at now, a crossed request's outcome: failed (an error
// status or no response), or its response headers after took.
func (g *Gate) Observe(cluster string, failed bool, took time.Duration, now time.Time) {
	if g == nil {
		return
	}
	outcome := "ok"
	switch {
	case failed:
		outcome = "error"
	case g.opts.SlowAfter > 0 && took > g.opts.SlowAfter:
		outcome = "slow"
	}
	outcomes.WithLabelValues(cluster, outcome).Inc()
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.breaker(cluster)
	if outcome == "ok" {
		if !b.openUntil.IsZero() {
			breakerOpen.WithLabelValues(cluster).Set(0)
		}
		*b = breaker{}
		return
	}
	b.failures++
	if !b.openUntil.IsZero() || b.failures >= g.opts.Failures {
		b.openUntil = now.Add(g.opts.Open)
		breakerOpen.WithLabelValues(cluster).Set(1)
	}
}

// roll starts a new half window when the current one is over. Called with
// g.mu held.
func (g *Gate) roll(now time.Time) {
	half := g.opts.Window / 2
	if now.Sub(g.curStart) < half {
		return
	}
	if now.Sub(g.curStart) < 2*half {
		g.prev, g.prevN = g.cur, g.curN
	} else {
		g.prev, g.prevN = map[string]int{}, 0
	}
	g.cur, g.curN, g.curStart = map[string]int{}, 0, now
}

// overShare reports whether cluster took its share of the window's picks.
// Called with g.mu held.
func (g *Gate) overShare(cluster string) bool {
	n := g.curN + g.prevN
	if g.opts.MaxShare >= 1 || n < g.opts.MinPicks {
		return false
	}
	return float64(g.cur[cluster]+g.prev[cluster]) >= g.opts.MaxShare*float64(n)
}

// breakerAdmits reports whether cluster's breaker lets a pick cross:
// closed, or open past its time, and then this pick is the probe. Called
// with g.mu held.
func (g *Gate) breakerAdmits(cluster string, now time.Time) bool {
	b := g.breakers[cluster]
	switch {
	case b == nil || b.openUntil.IsZero():
		return true
	case now.Before(b.openUntil):
		return false
	}
	b.openUntil = now.Add(g.opts.Open)
	return true
}

func (g *Gate) breaker(cluster string) *breaker {
	b := g.breakers[cluster]
	if b == nil {
		b = &breaker{}
		g.breakers[cluster] = b
	}
	return b
}
