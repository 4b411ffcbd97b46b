package spill

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
)

var now = time.Now()

// testPolicy is the policy of the default parameters, edited, at now.
func testPolicy(tb testing.TB, edit func(*Params)) *Policy {
	tb.Helper()
	p := DefaultParams
	if edit != nil {
		edit(&p)
	}
	policy, err := New(p, func() time.Time { return now })
	if err != nil {
		tb.Fatal(err)
	}
	return policy
}

func TestHeadroomIsFreshMetricsBelowBothThresholds(t *testing.T) {
	fresh, stale := 10*time.Millisecond, time.Minute
	ep := func(waiting int, kv float64, age time.Duration, remote bool) fwksched.Endpoint {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now.Add(-age)
		attrs := fwkdl.NewAttributes()
		if remote {
			attrs.Put(federation.OriginAttribute, &federation.Origin{Cluster: "west"})
		}
		return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{}, m, attrs)
	}
	p := testPolicy(t, nil)
	for _, tc := range []struct {
		name string
		ep   fwksched.Endpoint
		want bool
	}{
		{"fresh and below both thresholds", ep(4, 0.79, fresh, false), true},
		{"queue at the threshold", ep(5, 0, fresh, false), false},
		{"KV cache at the threshold", ep(0, 0.8, fresh, false), false},
		{"stale local metrics", ep(0, 0, stale, false), false},
		{"local metrics older than the local threshold", ep(0, 0, 500*time.Millisecond, false), false},
		{"remote data within the remote threshold", ep(0, 0, 500*time.Millisecond, true), true},
		{"stale remote data", ep(0, 0, 2*time.Second, true), false},
		{"remote queue at the threshold", ep(5, 0, fresh, true), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.HasRoom(tc.ep); got != tc.want {
				t.Fatalf("HasRoom = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewRefusesInvalidParameters(t *testing.T) {
	for name, edit := range map[string]func(*Params){
		"negative queue threshold":     func(p *Params) { p.QueueDepthThreshold = -1 },
		"KV threshold above 1":         func(p *Params) { p.KVCacheUtilThreshold = 80 },
		"no staleness threshold":       func(p *Params) { p.MetricsStalenessThreshold = 0 },
		"no remote candidates":         func(p *Params) { p.MaxRemoteCandidates = 0 },
		"negative margin":              func(p *Params) { p.CrossMargin = -1 },
		"no service rate":              func(p *Params) { p.ServiceRate = 0 },
		"negative prefill time":        func(p *Params) { p.PrefillPerToken = -1 },
		"running cost above 1":         func(p *Params) { p.RunningCost = 1.5 },
		"negative running cost":        func(p *Params) { p.RunningCost = -0.25 },
		"negative connect round trips": func(p *Params) { p.ConnectRoundTrips = -1 },
		"no destination idle timeout":  func(p *Params) { p.DestinationIdleTimeout = 0 },
		"destination idle timeout beyond what the meter keeps": func(p *Params) {
			p.DestinationIdleTimeout = Duration(MaxDestinationIdleTimeout + time.Second)
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := DefaultParams
			edit(&p)
			if _, err := New(p, time.Now); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// The estimate: wait = load / service rate (a quarter of that for each
// request running below a full batch of a pod the meter measured: what it
// adds to the new request's own first token, the cost these cases take;
// the default, 0.5, counts half a turn), plus the round trip for a remote
// endpoint; a request crosses only to remote endpoints expected sooner
// than the best local one by the margin (20 ms by default), within the
// caps. The default service rate is 10 requests/s.
func TestRemoteAreThoseExpectedSoonerByTheMargin(t *testing.T) {
	type pod struct {
		name             string
		waiting, running int
		age              time.Duration
	}
	fresh, stale := 10*time.Millisecond, 1500*time.Millisecond
	addr := func(name string) types.NamespacedName { return types.NamespacedName{Name: name} }
	endpoint := func(p pod) *fwkdl.ModelServer {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.RunningRequestsSize, m.UpdateTime = p.waiting, p.running, now.Add(-p.age)
		return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: addr(p.name)}, m)
	}
	peer := func(cluster string, rtt time.Duration, pods ...pod) *federation.View {
		o := &federation.Origin{Cluster: cluster, RoundTrip: &federation.RoundTrip{}}
		o.RoundTrip.Observe(rtt)
		var entries []federation.Entry
		for _, p := range pods {
			entries = append(entries, federation.Entry{Endpoint: endpoint(p), Updated: now.Add(-p.age)})
		}
		return federation.NewView(o, entries)
	}
	// measured is a meter that timed requests of took at each named local
	// pod, seen queueing behind slots running: a service rate of
	// slots/took.
	measured := func(slots int, took time.Duration, names ...string) func() *Meter {
		return func() *Meter {
			m := NewMeter()
			for _, n := range names {
				start := now.Add(-time.Second - took)
				m.Started(addr(n), start)
				m.pod(addr(n)).sawRunning(slots, 1)
				// Ended before the scrapes, so no scrape counts it running.
				m.finished(addr(n), span{start: start, end: now.Add(-time.Second)}, true)
			}
			return m
		}
	}
	// endedAfterScrape is a meter that saw a request at the named pod start
	// before a scrape taken age ago and end since.
	endedAfterScrape := func(age time.Duration, name string) func() *Meter {
		return func() *Meter {
			m := NewMeter()
			start := now.Add(-age - 50*time.Millisecond)
			m.Started(addr(name), start)
			m.finished(addr(name), span{start: start, end: now.Add(-age / 2)}, true)
			return m
		}
	}
	// ranOneAtATime is a meter that timed a request of took at the named
	// pod, never seen running more than one or queueing.
	ranOneAtATime := func(took time.Duration, name string) func() *Meter {
		return func() *Meter {
			m := NewMeter()
			start := now.Add(-time.Second - took)
			m.Started(addr(name), start)
			m.pod(addr(name)).sawRunning(1, 0)
			m.finished(addr(name), span{start: start, end: now.Add(-time.Second)}, true)
			return m
		}
	}
	inFlight := func(n int, name string) func() *Meter {
		return func() *Meter {
			m := NewMeter()
			for range n {
				m.Started(addr(name), now.Add(-time.Second))
			}
			return m
		}
	}
	// sentAgo is a meter with one request to the named pod in flight,
	// picked ago.
	sentAgo := func(ago time.Duration, name string) func() *Meter {
		return func() *Meter {
			m := NewMeter()
			m.Started(addr(name), now.Add(-ago))
			return m
		}
	}
	learnPath := func(p *Params) { p.LearnCrossingPath = true }
	wholeTurns := func(p *Params) { p.RunningCost = 1 }
	atDefaultCost := func(p *Params) { p.RunningCost = DefaultParams.RunningCost }
	// crossedIn is a meter whose crossed requests to cluster took took to
	// their response headers.
	crossedIn := func(cluster string, took time.Duration) func() *Meter {
		return func() *Meter {
			m := NewMeter()
			m.Crossed(cluster, took)
			return m
		}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Params)
		meter func() *Meter
		local []pod
		peers []*federation.View
		want  string
	}{
		{name: "an idle local endpoint keeps the request", local: []pod{{"l", 0, 0, fresh}, {"l-busy", 9, 4, fresh}},
			peers: []*federation.View{peer("w", 0, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "remote endpoints expected sooner, round trip included, soonest first",
			local: []pod{{"l", 1, 2, fresh}}, // 300 ms
			peers: []*federation.View{peer("w", 150*time.Millisecond, pod{"w", 0, 0, fresh}, pod{"w1", 1, 0, fresh}), // 150, 250
				peer("e", 140*time.Millisecond, pod{"e", 0, 0, fresh}, pod{"e-slow", 3, 2, fresh})}, // 140, 640
			want: "e,w"},
		{name: "but none later than the soonest by more than the margin, whose shorter queue GIE's scorers would prefer",
			local: []pod{{"l", 1, 2, fresh}}, // 300 ms
			peers: []*federation.View{peer("w", 160*time.Millisecond, pod{"w", 0, 0, fresh}), // 160
				peer("e", 30*time.Millisecond, pod{"e", 0, 1, fresh})}, // 130
			want: "e"},
		{name: "a link slower than the local wait keeps the request", local: []pod{{"l", 0, 2, fresh}}, // 200 ms
			peers: []*federation.View{peer("w", 190*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "without a margin the same link wins", edit: func(p *Params) { p.CrossMargin = 0 },
			local: []pod{{"l", 0, 2, fresh}}, peers: []*federation.View{peer("w", 190*time.Millisecond, pod{"w", 0, 0, fresh})}, want: "w"},
		{name: "the queue cap holds even when the remote endpoint is expected sooner", local: []pod{{"l", 40, 4, fresh}},
			peers: []*federation.View{peer("w", 0, pod{"w-q5", 5, 0, fresh}, pod{"w-q9", 9, 0, fresh})}, want: ""},
		{name: "remote data older than the remote staleness threshold is no candidate", local: []pod{{"l", 9, 4, fresh}},
			peers: []*federation.View{peer("w", 0, pod{"w-old", 0, 0, stale}, pod{"w", 1, 0, fresh})}, want: "w"},
		{name: "a local pod's measured rate: 4 running in 100 ms is 40/s, so a load of 4 waits 100 ms at whole turns",
			edit: wholeTurns, meter: measured(4, 100*time.Millisecond, "l"), local: []pod{{"l", 0, 4, fresh}},
			peers: []*federation.View{peer("w", 90*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "a pod never seen queueing is not taken as full: one running of 2 slots in 100 ms waits 50 ms at whole turns",
			edit: wholeTurns, meter: ranOneAtATime(100*time.Millisecond, "l"), local: []pod{{"l", 0, 1, fresh}},
			peers: []*federation.View{peer("w", 40*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "nor is its batch: two running of 3 slots wait half a 33 ms turn, not 67 ms",
			meter: ranOneAtATime(100*time.Millisecond, "l"), local: []pod{{"l", 0, 2, fresh}},
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "unmeasured, the same pod waits 400 ms at the default rate",
			local: []pod{{"l", 0, 4, fresh}}, peers: []*federation.View{peer("w", 90*time.Millisecond, pod{"w", 0, 0, fresh})}, want: "w"},
		{name: "remote pods take the local pods' measured rate",
			edit: wholeTurns, meter: measured(4, 100*time.Millisecond, "l"), local: []pod{{"l", 4, 4, fresh}}, // 200 ms
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 4, fresh})}, want: "w"}, // 130 ms, 430 at 10/s
		{name: "below a full batch each running request costs a quarter turn: 3 running of 4 at 40/s wait 19 ms, and the request stays",
			meter: measured(4, 100*time.Millisecond, "l"), local: []pod{{"l", 0, 3, fresh}},
			peers: []*federation.View{peer("w", 0, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "at the default cost, which also counts what the request adds to those after it, the same pod waits 38 ms, and the request crosses",
			edit: atDefaultCost, meter: measured(4, 100*time.Millisecond, "l"), local: []pod{{"l", 0, 3, fresh}},
			peers: []*federation.View{peer("w", 0, pod{"w", 0, 0, fresh})}, want: "w"},
		{name: "at whole turns the same pod waits 75 ms, and the request crosses",
			edit: wholeTurns, meter: measured(4, 100*time.Millisecond, "l"), local: []pod{{"l", 0, 3, fresh}},
			peers: []*federation.View{peer("w", 0, pod{"w", 0, 0, fresh})}, want: "w"},
		{name: "beyond a full batch each request waits a whole turn: 4 running and 2 waiting of 4 wait 3/4 + 3 turns, 94 ms",
			meter: measured(4, 100*time.Millisecond, "l"), local: []pod{{"l", 2, 4, fresh}},
			peers: []*federation.View{peer("w", 50*time.Millisecond, pod{"w", 0, 0, fresh})}, want: "w"}, // 50 ms
		{name: "remote pods take the local pods' batch: 3 running of 4 wait 19 ms, not 75",
			meter: measured(4, 100*time.Millisecond, "l"), local: []pod{{"l", 2, 4, fresh}}, // 94 ms
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 3, fresh})}, want: "w"}, // 49 ms, 105 at whole turns
		{name: "this picker's requests in flight count when the scrape shows fewer",
			meter: inFlight(5, "w"), local: []pod{{"l", 2, 2, fresh}}, // 325 ms: a batch of 2, its scrape shows
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""}, // 455 ms, as many slots
		{name: "a request this picker sent after the peer read the pod, less the link's one way, adds to the one the peer published",
			meter: sentAgo(5*time.Millisecond, "w"), local: []pod{{"l", 0, 4, fresh}}, // 100 ms: 4 running of 5 slots
			peers: []*federation.View{peer("w", 40*time.Millisecond, pod{"w", 0, 1, fresh})}, want: ""}, // 2 running: 90 ms, not 65
		{name: "one sent before that is in what the peer published, and the request crosses",
			meter: sentAgo(time.Second, "w"), local: []pod{{"l", 0, 4, fresh}},
			peers: []*federation.View{peer("w", 40*time.Millisecond, pod{"w", 0, 1, fresh})}, want: "w"}, // 65 ms
		{name: "a scrape that still shows a request this picker saw end: the idle local pod keeps the request",
			meter: endedAfterScrape(fresh, "l"), local: []pod{{"l", 0, 1, fresh}}, // 0 ms, not 100
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "learning the path, crossings that took longer than the link's round trip count at what they took",
			edit: learnPath, meter: crossedIn("w", 190*time.Millisecond), local: []pod{{"l", 1, 1, fresh}}, // 200 ms: a batch of 1
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "by default the same crossings count at the round trip",
			meter: crossedIn("w", 190*time.Millisecond), local: []pod{{"l", 1, 1, fresh}}, // 200 ms: a batch of 1
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 0, fresh})}, want: "w"},
		{name: "learning the path, crossings measured faster than the round trip count at the round trip",
			edit: learnPath, meter: crossedIn("w", time.Millisecond), local: []pod{{"l", 1, 1, fresh}}, // 200 ms
			peers: []*federation.View{peer("w", 190*time.Millisecond, pod{"w", 0, 0, fresh})}, want: ""},
		{name: "without that request seen ending, the same scrape reads 100 ms and crosses",
			local: []pod{{"l", 0, 1, fresh}}, peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w", 0, 0, fresh})}, want: "w"},
		{name: "stale local metrics: the remote endpoints expected soonest, whatever their load",
			local: []pod{{"l", 0, 0, time.Minute}}, peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w-q9", 9, 0, fresh})}, want: "w-q9"},
		{name: "no local endpoints: the same",
			peers: []*federation.View{peer("w", 30*time.Millisecond, pod{"w-q9", 9, 0, fresh}, pod{"w-q7", 7, 0, fresh})}, want: "w-q7"},
		{name: "no peers", local: []pod{{"l", 9, 4, fresh}}, want: ""},
		{name: "a longer queue with fewer running still ranks by its estimate", edit: func(p *Params) { p.MaxRemoteCandidates = 1; p.QueueDepthThreshold = 5 },
			local: []pod{{"l", 9, 4, fresh}},                                                                                    // 1.3 s
			peers: []*federation.View{peer("w", 0, pod{"w-q0-r4", 0, 4, fresh}, pod{"w-q1-r0", 1, 0, fresh})}, want: "w-q1-r0"}, // 400 and 100 ms
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := testPolicy(t, func(p *Params) {
				// Connections have their own test: here every crossing
				// costs its round trip alone.
				p.RunningCost, p.ConnectRoundTrips = 0.25, 0
				if tc.edit != nil {
					tc.edit(p)
				}
			})
			var local []fwkdl.Endpoint
			for _, p := range tc.local {
				local = append(local, endpoint(p))
			}
			var m *Meter
			if tc.meter != nil {
				m = tc.meter()
			}
			// The peers are visited from a random one; the result must not
			// depend on it.
			for range 20 {
				var got []string
				eps, _ := policy.Remote(local, federation.Remote{Peers: tc.peers, Stale: now.Add(-2 * time.Second)}, m, Prompt{})
				for _, e := range eps {
					got = append(got, e.GetMetadata().NamespacedName.Name)
				}
				if strings.Join(got, ",") != tc.want {
					t.Fatalf("candidates %v, want %q", got, tc.want)
				}
			}
		})
	}
}

func TestMeterCountsInFlightAndTimesCompletedRequestsOnly(t *testing.T) {
	a := types.NamespacedName{Name: "a"}
	m := NewMeter()
	m.Started(a, now)
	m.Started(a, now)
	m.Finished(a, now, false) // did not complete: no sample
	if p := m.lookup(a); p.inflight.Load() != 1 || len(p.open) != 1 || p.service.Load() != 0 {
		t.Fatalf("in flight %d (%d open), service %v; want 1 and none", p.inflight.Load(), len(p.open), p.service.Load())
	}
	if _, ok := m.PoolRate(); ok {
		t.Fatal("pool rate without a sample")
	}
	m.pod(a).sawRunning(4, 1)
	m.pod(a).sawRunning(2, 0)
	m.finished(a, span{start: now.Add(-200 * time.Millisecond), end: now}, true)
	if r, ok := m.lookup(a).rate(); !ok || r != 20 {
		t.Fatalf("rate %v, want a batch of 4 over 200 ms = 20/s", r)
	}
	if r, _ := m.PoolRate(); r != 20 {
		t.Fatalf("pool rate %v, want 20", r)
	}
	// Each sample moves the service time a fifth of the way.
	m.Started(a, now.Add(-700*time.Millisecond))
	m.finished(a, span{start: now.Add(-700 * time.Millisecond), end: now}, true)
	if got := time.Duration(m.lookup(a).service.Load()); got != 300*time.Millisecond {
		t.Fatalf("service time %v, want 300ms", got)
	}
	var nilMeter *Meter
	nilMeter.Started(a, now)
	nilMeter.Finished(a, now, true)
	if nilMeter.lookup(a) != nil {
		t.Fatal("a nil meter measured")
	}
}

// A request picked behind a full batch waited for a slot before it held
// one: its time from the pick says how long the queue was, not how fast the
// pod serves.
func TestARequestPickedBehindAFullBatchIsNoSampleOfTheServiceTime(t *testing.T) {
	a := types.NamespacedName{Name: "a"}
	m := NewMeter()
	m.pod(a).sawRunning(4, 1) // a batch of 4
	starts := make([]time.Time, 5)
	for i := range starts {
		starts[i] = now.Add(time.Duration(i) * time.Millisecond)
		m.Started(a, starts[i])
	}
	m.finished(a, span{start: starts[4], end: starts[4].Add(900 * time.Millisecond)}, true)
	if got := m.lookup(a).service.Load(); got != 0 {
		t.Fatalf("service time %v after the fifth request, want none", time.Duration(got))
	}
	m.finished(a, span{start: starts[0], end: starts[0].Add(400 * time.Millisecond)}, true)
	if got := time.Duration(m.lookup(a).service.Load()); got != 400*time.Millisecond {
		t.Fatalf("service time %v after the first request, want 400ms", got)
	}
	if got := m.lookup(a).inflight.Load(); got != 3 {
		t.Fatalf("%d in flight, want 3", got)
	}
}

// A pod's load as this picker knows it: the scrape's, less what it saw end
// since, or its own requests in flight when more.
func TestLoadCorrectsTheScrapeByThePickersOwnRequests(t *testing.T) {
	scrape := now.Add(-40 * time.Millisecond)
	before, after := scrape.Add(-300*time.Millisecond), scrape.Add(20*time.Millisecond)
	for _, tc := range []struct {
		name             string
		started          int    // requests this picker sent the pod
		ended            []span // of them, those that ended, when
		waiting, running int    // scraped
		want             [2]int // waiting, running
	}{
		{name: "a pod this picker never sent to: the scrape", waiting: 1, running: 3, want: [2]int{1, 3}},
		{name: "requests sent since the scrape count", started: 3, running: 1, want: [2]int{0, 3}},
		{name: "sent ones the scrape already shows count once", started: 2, waiting: 1, running: 3, want: [2]int{1, 3}},
		{name: "one that ended since the scrape no longer runs", started: 2, ended: []span{{before, after}}, running: 2, want: [2]int{0, 1}},
		{name: "one that ended before the scrape was not in it", started: 2, ended: []span{{before, scrape.Add(-time.Millisecond)}}, running: 2, want: [2]int{0, 2}},
		{name: "never below nothing running", started: 2, ended: []span{{before, after}, {before, after}}, running: 1, want: [2]int{0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := types.NamespacedName{Name: "a"}
			m := NewMeter()
			for range tc.started {
				m.Started(a, before)
			}
			for _, sp := range tc.ended {
				m.finished(a, sp, true)
			}
			w, r := m.Scraped(a, tc.waiting, tc.running, scrape)
			if got := [2]int{w, r}; got != tc.want {
				t.Fatalf("Scraped = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMeterSignalsEveryStartAndEndOnce(t *testing.T) {
	a := types.NamespacedName{Name: "a"}
	m := NewMeter()
	select {
	case <-m.Changed():
		t.Fatal("a change before any request")
	default:
	}
	m.Started(a, now)
	m.Started(a, now)
	<-m.Changed()
	select {
	case <-m.Changed():
		t.Fatal("two starts since the last receive signalled twice")
	default:
	}
	m.Finished(a, now, true)
	select {
	case <-m.Changed():
	default:
		t.Fatal("an end did not signal")
	}
}

// A pod's batch size is what ran while requests waited behind it; until a
// pod has queued, one more than it was ever seen running.
func TestRateTakesTheBatchSizeOnceAPodQueued(t *testing.T) {
	for _, tc := range []struct {
		name    string
		scrapes [][2]int // running, waiting
		want    float64  // requests/s at 100 ms a request
	}{
		{name: "never scraped: a batch of one", want: 10},
		{name: "never queued, one at a time: not full with one", scrapes: [][2]int{{1, 0}}, want: 20},
		{name: "never queued: one more than ever seen running", scrapes: [][2]int{{5, 0}, {2, 0}}, want: 60},
		{name: "queued behind 4: a batch of 4, whatever ran since", scrapes: [][2]int{{4, 1}, {6, 0}}, want: 40},
		{name: "the largest batch seen queueing", scrapes: [][2]int{{4, 1}, {3, 2}, {6, 1}}, want: 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &podMeter{}
			for _, sc := range tc.scrapes {
				p.sawRunning(sc[0], sc[1])
			}
			p.service.Store(int64(100 * time.Millisecond))
			if got, ok := p.rate(); !ok || got != tc.want {
				t.Fatalf("rate = %v (%v), want %v", got, ok, tc.want)
			}
		})
	}
}

// The batch is learned from every scrape read, not only those a pick
// reads: the federation's publisher reads each pod's scrape every interval,
// and a burst's peak between two picks shows only there.
func TestScrapesReadBetweenPicksTeachThePodsBatch(t *testing.T) {
	a := types.NamespacedName{Name: "a"}
	m := NewMeter()
	if w, r := m.Scraped(a, 0, 0, now); w != 0 || r != 0 || m.lookup(a) != nil {
		t.Fatalf("an idle pod's scrape: load %d/%d, meter %v; want 0/0 and nothing recorded", w, r, m.lookup(a))
	}
	m.Scraped(a, 1, 4, now) // the burst: four run, one waits
	m.Scraped(a, 0, 2, now)
	if got := m.lookup(a).slots(); got != 4 {
		t.Fatalf("slots = %d after a scrape showed 4 running and 1 waiting, want 4", got)
	}
	if got := m.PoolSlots(); got != 4 {
		t.Fatalf("pool slots = %d, want 4", got)
	}
}

// Retain drops the pods that went away, but not one with a request still
// in flight: its end must find the meter, not start a new one below zero.
func TestRetainDropsGonePodsWithNothingInFlight(t *testing.T) {
	gone, busy, kept := types.NamespacedName{Name: "gone"}, types.NamespacedName{Name: "gone-busy"}, types.NamespacedName{Name: "kept"}
	m := NewMeter()
	for _, a := range []types.NamespacedName{gone, busy, kept} {
		m.Started(a, now)
	}
	m.Finished(gone, now, true)
	m.Finished(kept, now, true)
	m.Retain(func(a types.NamespacedName) bool { return a == kept })
	if m.lookup(gone) != nil {
		t.Fatal("the meter of a pod that went away with nothing in flight was kept")
	}
	if m.lookup(kept) == nil {
		t.Fatal("the meter of a pod still there was dropped")
	}
	if m.lookup(busy) == nil {
		t.Fatal("the meter of a pod with a request in flight was dropped")
	}
	m.Finished(busy, now, true)
	if got := m.lookup(busy).inflight.Load(); got != 0 {
		t.Fatalf("%d in flight after the request ended, want 0", got)
	}
}

// Remote reports the estimates it weighed, which the pick's debug log
// shows: here, unmeasured pods at the default 10 requests a second, each
// request a whole turn (100 ms), and a 30 ms link.
func TestRemoteReportsTheEstimatesItWeighed(t *testing.T) {
	metrics := func(waiting, running int, age time.Duration) *fwkdl.Metrics {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.RunningRequestsSize, m.UpdateTime = waiting, running, now.Add(-age)
		return m
	}
	o := &federation.Origin{Cluster: "w", RoundTrip: &federation.RoundTrip{}}
	o.RoundTrip.Observe(30 * time.Millisecond)
	for _, tc := range []struct {
		name                  string
		local, remote         *fwkdl.Metrics
		wantLocalKnown        bool
		wantLocal, wantRemote time.Duration
	}{
		{name: "a request that crosses: the local pod's 2 turns against the idle remote pod's round trip",
			local: metrics(0, 2, 0), remote: metrics(0, 0, 0), wantLocalKnown: true, wantLocal: 200 * time.Millisecond, wantRemote: 30 * time.Millisecond},
		{name: "a request that stays at an idle local pod: no remote estimate",
			local: metrics(0, 0, 0), remote: metrics(0, 0, 0), wantLocalKnown: true},
		{name: "a local pod's load unknown: the remote pod's 9 turns and round trip",
			local: metrics(0, 0, time.Minute), remote: metrics(9, 0, 0), wantRemote: 930 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "l"}}, tc.local)
			e := federation.Entry{Endpoint: fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "r"}}, tc.remote), Updated: now}
			policy := testPolicy(t, func(p *Params) { p.RunningCost = 1 })
			_, got := policy.Remote([]fwkdl.Endpoint{local}, federation.Remote{Peers: []*federation.View{federation.NewView(o, []federation.Entry{e})},
				Stale: now.Add(-2 * time.Second)}, nil, Prompt{})
			if got.LocalKnown() != tc.wantLocalKnown || (tc.wantLocalKnown && got.Local != tc.wantLocal) || got.Remote != tc.wantRemote {
				t.Fatalf("weighed local %v (known %t) and remote %v, want %v (known %t) and %v",
					got.Local, got.LocalKnown(), got.Remote, tc.wantLocal, tc.wantLocalKnown, tc.wantRemote)
			}
		})
	}
}

// Remote says why the remote endpoints it read are no candidates, each
// endpoint counted once: here a local pod running 5 (500 ms at whole turns)
// and a 30 ms link, so that a remote endpoint must be expected within
// 480 ms.
func TestRemoteCountsWhyRemoteEndpointsAreNoCandidates(t *testing.T) {
	o := &federation.Origin{Cluster: "w", RoundTrip: &federation.RoundTrip{}}
	o.RoundTrip.Observe(30 * time.Millisecond)
	entry := func(name string, waiting, running int, kv float64, age time.Duration) federation.Entry {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.RunningRequestsSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, running, kv, now.Add(-age)
		return federation.Entry{Endpoint: fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}}, m), Updated: now.Add(-age)}
	}
	for _, tc := range []struct {
		name          string
		maxCandidates int
		entries       []federation.Entry
		want          Estimate
		candidates    int
	}{
		{name: "each cap, one endpoint expected no sooner than the margin allows, and one later than the soonest by more than the margin", maxCandidates: 16,
			entries: []federation.Entry{
				entry("idle", 0, 0, 0, 0), entry("idle-too", 0, 0, 0, 0), entry("running-3", 0, 3, 0, 0), entry("running-5", 0, 5, 0, 0),
				entry("older-than-the-threshold", 0, 0, 0, 2*time.Second), entry("stale-in-the-federation", 0, 0, 0, 20*time.Second),
				entry("kv-cache-full", 0, 0, 0.9, 0), entry("queue-at-the-cap", 5, 0, 0, 0), entry("queue-past-the-cap", 6, 0, 0, 0),
			},
			want:       Estimate{Local: 500 * time.Millisecond, Remote: 30 * time.Millisecond, Read: 9, Queued: 2, Stale: 2, CacheFull: 1, Slower: 2},
			candidates: 2},
		{name: "beyond the soonest candidates, and left unread by their queue", maxCandidates: 1,
			entries: []federation.Entry{
				entry("running-3", 0, 3, 0, 0), entry("idle", 0, 0, 0, 0), entry("queue-4", 4, 0, 0, 0), entry("queue-at-the-cap", 5, 0, 0, 0),
			},
			want:       Estimate{Local: 500 * time.Millisecond, Remote: 30 * time.Millisecond, Read: 4, Queued: 1, Slower: 2},
			candidates: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			local := fwkdl.NewMetrics()
			local.RunningRequestsSize, local.UpdateTime = 5, now
			policy := testPolicy(t, func(p *Params) { p.RunningCost, p.MaxRemoteCandidates = 1, tc.maxCandidates })
			got, weighed := policy.Remote([]fwkdl.Endpoint{fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "l"}}, local)},
				federation.Remote{Peers: []*federation.View{federation.NewView(o, tc.entries)}, Stale: now.Add(-10 * time.Second)}, nil, Prompt{})
			if len(got) != tc.candidates || weighed != tc.want {
				t.Fatalf("%d candidates, weighed %+v; want %d and %+v", len(got), weighed, tc.candidates, tc.want)
			}
			if sum := len(got) + weighed.Queued + weighed.Stale + weighed.CacheFull + weighed.Slower; sum != weighed.Read {
				t.Fatalf("candidates and hold-backs add up to %d, read %d", sum, weighed.Read)
			}
		})
	}
}

// A crossing over a connection the gateway no longer keeps waits for a new
// one: here a local pod running 1 (100 ms at whole turns), a 45 ms link and the 20 ms margin, so that an idle remote pod
// wins by 35 ms over an open connection and loses by 10 without one.
func TestACrossingWithoutAnOpenConnectionPaysItsHandshake(t *testing.T) {
	endpoint := func(name, ip string, running int) *fwkdl.ModelServer {
		m := fwkdl.NewMetrics()
		m.RunningRequestsSize, m.UpdateTime = running, now
		return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}, Address: ip, Port: "8000"}, m)
	}
	peer := func(cluster string, mode fleetv1alpha1.FederationMode, pods ...*fwkdl.ModelServer) *federation.View {
		o := &federation.Origin{Cluster: cluster, Mode: mode, Gateway: "gw-" + cluster + ":8080", RoundTrip: &federation.RoundTrip{}}
		o.RoundTrip.Observe(45 * time.Millisecond)
		var entries []federation.Entry
		for _, ep := range pods {
			entries = append(entries, federation.Entry{Endpoint: ep, Updated: now})
		}
		return federation.NewView(o, entries)
	}
	parent := peer("w", fleetv1alpha1.FederationParent, endpoint("w", "10.1.0.1", 0))
	// crossed is a meter that sent a request to each destination, ago.
	crossed := func(ago time.Duration, dests ...string) *Meter {
		m := NewMeter()
		for _, d := range dests {
			m.CrossedAt(d, now.Add(-ago))
		}
		return m
	}
	for _, tc := range []struct {
		name            string
		edit            func(*Params)
		meter           *Meter
		peer            *federation.View
		want            string
		wantUnconnected int
	}{
		{name: "Parent mode, crossed to the peer's gateway a second ago: the connection is open, and the request crosses",
			meter: crossed(time.Second, "gw-w:8080"), peer: parent, want: "w"},
		{name: "crossed there longer ago than the idle timeout: the handshake's round trip makes the remote pod slower",
			meter: crossed(time.Duration(DefaultParams.DestinationIdleTimeout)+time.Second, "gw-w:8080"), peer: parent, wantUnconnected: 1},
		{name: "a gateway with Envoy's default cleanup interval, 5 s, has dropped a connection idle for 6 s",
			edit:  func(p *Params) { p.DestinationIdleTimeout = Duration(5 * time.Second) },
			meter: crossed(6*time.Second, "gw-w:8080"), peer: parent, wantUnconnected: 1},
		{name: "never crossed there", meter: NewMeter(), peer: parent, wantUnconnected: 1},
		{name: "a connection to another peer's gateway is no connection to this one",
			meter: crossed(time.Second, "gw-c:8080"), peer: parent, wantUnconnected: 1},
		{name: "a connection idle for less than the idle timeout is still open",
			meter: crossed(time.Duration(DefaultParams.DestinationIdleTimeout)-time.Second, "gw-w:8080"), peer: parent, want: "w"},
		{name: "connections left out", edit: func(p *Params) { p.ConnectRoundTrips = 0 }, meter: NewMeter(), peer: parent, want: "w"},
		{name: "TLS on top takes two round trips: an open connection still wins",
			edit:  func(p *Params) { p.ConnectRoundTrips = 2 },
			meter: crossed(time.Second, "gw-w:8080"), peer: parent, want: "w"},
		{name: "without a meter nothing is known of connections, and none is charged", peer: parent, want: "w"},
		{name: "Endpoint mode: each pod is its own destination, and only the pod crossed to has a connection",
			meter: crossed(time.Second, "10.1.0.2:8000"),
			peer:  peer("w", fleetv1alpha1.FederationEndpoint, endpoint("w-unconnected", "10.1.0.1", 0), endpoint("w-connected", "10.1.0.2", 0)),
			want:  "w-connected", wantUnconnected: 1},
		{name: "Endpoint mode: the gateway's address is no pod's",
			meter: crossed(time.Second, "gw-w:8080"),
			peer:  peer("w", fleetv1alpha1.FederationEndpoint, endpoint("w", "10.1.0.1", 0)), wantUnconnected: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := testPolicy(t, func(p *Params) {
				p.RunningCost = 1
				if tc.edit != nil {
					tc.edit(p)
				}
			})
			local := []fwkdl.Endpoint{endpoint("l", "10.0.0.1", 1)}
			got, weighed := policy.Remote(local, federation.Remote{Peers: []*federation.View{tc.peer}, Stale: now.Add(-2 * time.Second)}, tc.meter, Prompt{})
			var names []string
			for _, e := range got {
				names = append(names, e.GetMetadata().NamespacedName.Name)
			}
			if strings.Join(names, ",") != tc.want || weighed.Unconnected != tc.wantUnconnected {
				t.Fatalf("candidates %v with %d charged a connection, want %q and %d", names, weighed.Unconnected, tc.want, tc.wantUnconnected)
			}
		})
	}
}

func TestForgetCrossingsBeforeKeepsOnlyLaterDestinations(t *testing.T) {
	m := NewMeter()
	m.CrossedAt("old:8080", now.Add(-2*time.Hour))
	m.CrossedAt("recent:8080", now.Add(-time.Minute))
	m.CrossedAt("recent:8080", now.Add(-3*time.Hour)) // an earlier pick recorded late
	m.ForgetCrossingsBefore(now.Add(-time.Hour))
	if m.sentSince("old:8080", now.Add(-3*time.Hour)) || !m.sentSince("recent:8080", now.Add(-2*time.Minute)) {
		t.Fatalf("after forgetting: old kept %t, recent kept %t", m.sentSince("old:8080", now.Add(-3*time.Hour)), m.sentSince("recent:8080", now.Add(-2*time.Minute)))
	}
}

func TestRemoteCarriesTheViewsFreshness(t *testing.T) {
	m := fwkdl.NewMetrics()
	m.UpdateTime = now.Add(-time.Minute) // the scrape, before watermarks vouched for it
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "r"}}, m)
	ep.GetAttributes().Put(federation.OriginAttribute, &federation.Origin{Cluster: "w"})
	v := federation.NewView(&federation.Origin{Cluster: "w"}, []federation.Entry{{Endpoint: ep, Updated: now.Add(-20 * time.Millisecond)}})
	policy := testPolicy(t, nil)
	got, _ := policy.Remote(nil, federation.Remote{Peers: []*federation.View{v}, Stale: now.Add(-2 * time.Second)}, nil, Prompt{})
	if len(got) != 1 || !got[0].GetMetrics().UpdateTime.Equal(now.Add(-20*time.Millisecond)) {
		t.Fatalf("got %v", got)
	}
	if federation.OriginOf(got[0].GetAttributes()) == nil || ep.GetMetrics().UpdateTime != m.UpdateTime {
		t.Fatal("the candidate lost its origin or changed the view's endpoint")
	}
}

// A crossing pick reads every remote pod that may win but allocates only
// for its candidates: with Endpoint-mode peers, each pod its own
// destination, looking up a pod's connection costs no allocation.
func TestRemoteAllocatesForItsCandidatesNotForThePodsItReads(t *testing.T) {
	o := &federation.Origin{Cluster: "w", Mode: fleetv1alpha1.FederationEndpoint, RoundTrip: &federation.RoundTrip{}}
	o.RoundTrip.Observe(30 * time.Millisecond)
	idlePods := func(n int) federation.Remote {
		entries := make([]federation.Entry, n)
		for i := range entries {
			m := fwkdl.NewMetrics()
			m.UpdateTime = now
			entries[i] = federation.Entry{Endpoint: fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{
				NamespacedName: types.NamespacedName{Name: fmt.Sprint("w", i)}, Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), Port: "8000"}, m), Updated: now}
		}
		return federation.Remote{Peers: []*federation.View{federation.NewView(o, entries)}, Stale: now.Add(-2 * time.Second)}
	}
	local := []fwkdl.Endpoint{fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{}, &fwkdl.Metrics{WaitingQueueSize: 10, UpdateTime: now})}
	policy := testPolicy(t, nil)
	m := NewMeter()
	m.CrossedAt("10.1.0.1:8000", now)
	allocs := func(remote federation.Remote) (float64, Estimate) {
		var weighed Estimate
		return testing.AllocsPerRun(20, func() { _, weighed = policy.Remote(local, remote, m, Prompt{}) }), weighed
	}
	few, fewWeighed := allocs(idlePods(DefaultParams.MaxRemoteCandidates))
	many, manyWeighed := allocs(idlePods(25 * DefaultParams.MaxRemoteCandidates))
	if fewWeighed.Read != DefaultParams.MaxRemoteCandidates || manyWeighed.Read != 25*DefaultParams.MaxRemoteCandidates || manyWeighed.Unconnected < manyWeighed.Read-1 {
		t.Fatalf("weighed %+v and %+v: want every pod read and looked up", fewWeighed, manyWeighed)
	}
	if many > few {
		t.Fatalf("%v allocations reading %d pods, %v reading %d: want none per pod read", many, manyWeighed.Read, few, fewWeighed.Read)
	}
}

// BenchmarkRemote picks the 16 remote endpoints expected soonest of 10
// peers × 90 endpoints, as a crossing pick does.
func BenchmarkRemote(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	remote := federation.Remote{Stale: now.Add(-2 * time.Second)}
	for c := range 10 {
		entries := make([]federation.Entry, 90)
		for i := range entries {
			m := fwkdl.NewMetrics()
			m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = rng.IntN(4), float64(rng.IntN(60))/100, now
			entries[i] = federation.Entry{Endpoint: fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{}, m), Updated: now}
		}
		remote.Peers = append(remote.Peers, federation.NewView(&federation.Origin{Cluster: fmt.Sprint(c)}, entries))
	}
	local := []fwkdl.Endpoint{fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{}, &fwkdl.Metrics{WaitingQueueSize: 10, UpdateTime: now})}
	policy := testPolicy(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		if eps, _ := policy.Remote(local, remote, nil, Prompt{}); len(eps) != 16 {
			b.Fatal("not 16")
		}
	}
}

// With PrefillPerToken set, the estimate adds the prefill of the prompt's
// blocks after those an endpoint holds: this picker's record for a local
// pod, the published summary for a remote one. Here a block prefills in
// 16 × 400 µs = 6.4 ms, so the 50-block prompt in 320 ms where nothing is
// cached.
func TestAPromptCrossesToWhereItsPrefixIsCachedWhenThatIsSooner(t *testing.T) {
	prompt := make([]uint64, 50)
	for i := range prompt {
		prompt[i] = uint64(1000 + i)
	}
	holding := func(blocks int) *prefixes.Summary {
		x := prefixes.NewIndex()
		x.Record(types.NamespacedName{Name: "remote"}, prompt[:blocks])
		s, _ := x.Summary(types.NamespacedName{Name: "remote"})
		return s
	}
	type pod struct {
		name             string
		waiting, running int
		holds            int // leading blocks of the prompt cached
	}
	for _, tc := range []struct {
		name    string
		prefill time.Duration
		local   pod
		rtt     time.Duration
		remote  pod
		want    string
	}{
		{"cached nowhere: the idle local pod", 400 * time.Microsecond, pod{"l", 0, 0, 0}, 30 * time.Millisecond, pod{"w", 0, 0, 0}, ""},
		{"cached in a remote pod only: 30 ms there against 320 here", 400 * time.Microsecond, pod{"l", 0, 0, 0}, 30 * time.Millisecond, pod{"w", 0, 0, 50}, "w"},
		{"cached here too: the local pod", 400 * time.Microsecond, pod{"l", 0, 0, 50}, 30 * time.Millisecond, pod{"w", 0, 0, 50}, ""},
		{"half of it remote across 200 ms: 360 ms there, not sooner", 400 * time.Microsecond, pod{"l", 0, 0, 0}, 200 * time.Millisecond, pod{"w", 0, 0, 25}, ""},
		{"cached in a busy local pod: 400 ms of queue here against 350 ms of prefill there", 400 * time.Microsecond, pod{"l", 2, 2, 50}, 30 * time.Millisecond, pod{"w", 0, 0, 0}, "w"},
		{"prefill not configured: summaries are not read", 0, pod{"l", 0, 0, 0}, 30 * time.Millisecond, pod{"w", 0, 0, 50}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy := testPolicy(t, func(p *Params) { p.PrefillPerToken = Duration(tc.prefill) })
			lm := fwkdl.NewMetrics()
			lm.WaitingQueueSize, lm.RunningRequestsSize, lm.UpdateTime = tc.local.waiting, tc.local.running, now
			local := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: tc.local.name}}, lm)
			index := prefixes.NewIndex()
			index.Record(types.NamespacedName{Name: tc.local.name}, prompt[:tc.local.holds])
			rm := fwkdl.NewMetrics()
			rm.WaitingQueueSize, rm.RunningRequestsSize, rm.UpdateTime = tc.remote.waiting, tc.remote.running, now
			o := &federation.Origin{Cluster: "west", RoundTrip: &federation.RoundTrip{}}
			o.RoundTrip.Observe(tc.rtt)
			e := federation.Entry{Endpoint: fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: tc.remote.name}}, rm), Updated: now}
			if tc.remote.holds > 0 {
				e.Prefixes = holding(tc.remote.holds)
			}
			var got []string
			eps, _ := policy.Remote([]fwkdl.Endpoint{local}, federation.Remote{Peers: []*federation.View{federation.NewView(o, []federation.Entry{e})},
				Stale: now.Add(-2 * time.Second)}, nil, Prompt{Hashes: prompt, Local: index})
			for _, ep := range eps {
				got = append(got, ep.GetMetadata().NamespacedName.Name)
			}
			if strings.Join(got, ",") != tc.want {
				t.Fatalf("candidates %v, want %q", got, tc.want)
			}
		})
	}
}
