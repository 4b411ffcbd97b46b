package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

func TestArrivalsAreTheSameWorkloadForEveryPolicy(t *testing.T) {
	sc := scenario{Replicas: []int32{2, 2, 2}, Entry: []float64{0.7, 0.15, 0.15}, Rate: 50, PromptWords: 20,
		Prefixes: 4, PrefixWords: 30, Lost: -1}
	a, b := sc.arrivals(20*time.Second, 7, "fleetinfer"), sc.arrivals(20*time.Second, 7, "oracle")
	if len(a) != len(b) || len(a) < 800 || len(a) > 1200 {
		t.Fatalf("%d and %d arrivals, want the same, about 1000", len(a), len(b))
	}
	entries := make([]int, 3)
	prefixes := map[string]bool{}
	for i := range a {
		if a[i].At != b[i].At || a[i].Entry != b[i].Entry {
			t.Fatalf("arrival %d differs: %v/%d vs %v/%d", i, a[i].At, a[i].Entry, b[i].At, b[i].Entry)
		}
		if a[i].Prompt == b[i].Prompt {
			t.Fatalf("arrival %d has the same prompt under two policies", i)
		}
		if n := len(strings.Fields(a[i].Prompt)); n != 50 {
			t.Fatalf("prompt of %d words, want 50", n)
		}
		entries[a[i].Entry]++
		prefixes[strings.Join(strings.Fields(a[i].Prompt)[:30], " ")] = true
	}
	if share := float64(entries[0]) / float64(len(a)); share < 0.65 || share > 0.75 {
		t.Errorf("hot share %.2f, want about 0.7", share)
	}
	if len(prefixes) != 4 {
		t.Errorf("%d distinct prefixes, want 4", len(prefixes))
	}
	if !slices.Equal(a, sc.arrivals(20*time.Second, 7, "fleetinfer")) {
		t.Error("arrivals are not repeatable")
	}
}

func TestArrivalsAvoidTheLostClusterFromHalfway(t *testing.T) {
	sc := scenario{Entry: []float64{1, 1, 1}, Rate: 100, PromptWords: 1, Lost: 2}
	before, after := make([]int, 3), make([]int, 3)
	for _, a := range sc.arrivals(10*time.Second, 1, "x") {
		if a.At < 5*time.Second {
			before[a.Entry]++
		} else {
			after[a.Entry]++
		}
	}
	if before[2] == 0 || after[2] != 0 || after[0] == 0 || after[1] == 0 {
		t.Fatalf("entries before the loss %v, after %v", before, after)
	}
}

func TestPickShare(t *testing.T) {
	for _, tc := range []struct {
		shares []float64
		u      float64
		want   int
	}{
		{[]float64{0.7, 0.15, 0.15}, 0, 0},
		{[]float64{0.7, 0.15, 0.15}, 0.69, 0},
		{[]float64{0.7, 0.15, 0.15}, 0.71, 1},
		{[]float64{0.7, 0.15, 0.15}, 0.99, 2},
		{[]float64{1, 1, 0}, 0.6, 1},
		{[]float64{1, 1, 0}, 0.999999, 1},
		{[]float64{0, 1, 1}, 0.1, 1},
	} {
		if got := pickShare(tc.shares, tc.u); got != tc.want {
			t.Errorf("pickShare(%v, %v) = %d, want %d", tc.shares, tc.u, got, tc.want)
		}
	}
}

func TestSkyServeLeastLoadCountsItsOwnRequestsInFlight(t *testing.T) {
	s := newSkyServe(gateways{"a", "b", "c"}, "h", "", 0, true, 1)
	s.setReady([]int{0, 1, 2})
	var got []int
	var held []target
	for range 5 {
		tg, ok := s.route(arrival{})
		if !ok {
			t.Fatal("no route")
		}
		got = append(got, tg.Cluster)
		held = append(held, tg)
	}
	// Ties go to the first ready replica, as Python's min does.
	if want := []int{0, 1, 2, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("picks %v, want %v", got, want)
	}
	s.done(held[2]) // c: 0 in flight
	s.done(held[0]) // a: 1 in flight
	if tg, _ := s.route(arrival{}); tg.Cluster != 2 {
		t.Fatalf("picked %d, want 2 (least in flight)", tg.Cluster)
	}
	// The same set leaves loads alone; a smaller one forgets the gone.
	s.setReady([]int{2, 1, 0})
	if s.load[1] != 2 {
		t.Fatalf("load of 1 is %d after a same-set sync, want 2", s.load[1])
	}
	s.setReady([]int{0, 1})
	if _, ok := s.load[2]; ok || slices.Contains(s.ready, 2) {
		t.Fatal("a replica gone from the ready set is still known")
	}
	if tg, _ := s.route(arrival{}); tg.Cluster != 0 || tg.URL != "a" || tg.Host != "h" {
		t.Fatalf("route %+v, want cluster 0 at a with host h", tg)
	}
}

func TestSkyServeRoundRobinCyclesAShuffledReadySet(t *testing.T) {
	s := newSkyServe(gateways{"a", "b", "c"}, "h", "", 0, false, 1)
	if _, ok := s.route(arrival{}); ok {
		t.Fatal("routed with no ready replicas")
	}
	s.setReady([]int{0, 1, 2})
	var first []int
	for range 6 {
		tg, _ := s.route(arrival{})
		first = append(first, tg.Cluster)
	}
	if !slices.Equal(first[:3], first[3:]) || len(slices.Compact(slices.Sorted(slices.Values(first[:3])))) != 3 {
		t.Fatalf("picks %v: want each replica once per cycle, the same cycle twice", first)
	}
	s.setReady([]int{0, 2})
	seen := map[int]int{}
	for range 4 {
		tg, _ := s.route(arrival{})
		seen[tg.Cluster]++
	}
	if seen[0] != 2 || seen[2] != 2 {
		t.Fatalf("after the set shrank: %v", seen)
	}
}

func TestSkyServeRetriesThreeTimesWithGrowingBackoff(t *testing.T) {
	s := newSkyServe(nil, "", "", 0, true, 1)
	if s.attempts() != 3 || s.backoff(1) != time.Second || s.backoff(2) != 1600*time.Millisecond {
		t.Fatalf("attempts %d, backoffs %v %v", s.attempts(), s.backoff(1), s.backoff(2))
	}
}

func TestOraclePicksTheLeastLoadedPodPerSlotAndSkipsLostClusters(t *testing.T) {
	o := newOracle([]oraclePod{
		{addr: "a:1", cluster: 0, slots: 4, inflight: 3},
		{addr: "b:1", cluster: 1, slots: 2, inflight: 1},
		{addr: "c:1", cluster: 2, slots: 8, inflight: 3},
	}, 1, func(a, b int) time.Duration { return 0 }, 0)
	// Per slot: a 0.75, b 0.5, c 0.375.
	tg, ok := o.route(arrival{})
	if !ok || tg.URL != "http://c:1" || tg.Cluster != 2 || o.pods[2].inflight != 4 {
		t.Fatalf("route %+v (c in flight %d), want c", tg, o.pods[2].inflight)
	}
	// Now b and c tie at 0.5: both must come up.
	seen := map[int]bool{}
	for range 40 {
		tg, _ := o.route(arrival{})
		seen[tg.Cluster] = true
		o.done(tg)
	}
	if !seen[1] || !seen[2] || seen[0] {
		t.Fatalf("tied picks went to %v, want b and c only", seen)
	}
	o.lose(2)
	o.lose(1)
	if tg, _ := o.route(arrival{}); tg.Cluster != 0 {
		t.Fatalf("picked cluster %d after 1 and 2 were lost", tg.Cluster)
	}
	o.lose(0)
	if _, ok := o.route(arrival{}); ok {
		t.Fatal("routed with every cluster lost")
	}
}

// The oracle adds the round trip from the entry cluster and the prefill of
// a prefix the pod does not hold to each pod's load.
func TestOracleWeighsRoundTripsAndWherePrefixesAreCached(t *testing.T) {
	rtt := func(a, b int) time.Duration {
		if a == b {
			return 0
		}
		return 150 * time.Millisecond
	}
	newO := func() *oracle {
		return newOracle([]oraclePod{
			{addr: "a:1", cluster: 0, slots: 4, inflight: 1}, // 100 ms of load, local
			{addr: "b:1", cluster: 1, slots: 4},              // idle, 150 ms away
		}, 1, rtt, 320*time.Millisecond)
	}
	for _, tc := range []struct {
		name  string
		warm  int // cluster holding prefix 0, -1 none
		a     arrival
		want  int
		setup func(o *oracle)
	}{
		{name: "a loaded local pod beats an idle one a slow link away", warm: -1, a: arrival{Entry: 0, Prefix: -1}, want: 0},
		{name: "a heavier local load loses to the link", warm: -1, a: arrival{Entry: 0, Prefix: -1}, want: 1,
			setup: func(o *oracle) { o.pods[0].inflight = 3 }},
		{name: "a remote pod holding the prefix beats a local one that does not", warm: 1, a: arrival{Entry: 0, Prefix: 0}, want: 1},
		{name: "the local pod holding it wins", warm: 0, a: arrival{Entry: 0, Prefix: 0}, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newO()
			if tc.warm >= 0 {
				o.warm(tc.warm, 0)
			}
			if tc.setup != nil {
				tc.setup(o)
			}
			if tg, _ := o.route(tc.a); tg.Cluster != tc.want {
				t.Fatalf("routed to cluster %d, want %d", tg.Cluster, tc.want)
			}
		})
	}
}

func TestReadStream(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		tokens       int
		err          string
	}{
		{"tokens", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n", 2, ""},
		{"usage", "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":850,\"prompt_tokens_details\":{\"cached_tokens\":800}}}\n\ndata: [DONE]\n", 1, ""},
		{"empty text is not a token", "data: {\"choices\":[{\"text\":\"\"}]}\n\ndata: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: [DONE]\n", 1, ""},
		{"cut short", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", 1, "without [DONE]"},
		{"malformed", "data: {\n\n", 0, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			firsts := 0
			n, u, err := readStream(strings.NewReader(tc.stream), func() { firsts++ })
			if tc.name == "usage" && (u.PromptTokens != 850 || u.Details.CachedTokens != 800) {
				t.Errorf("usage %+v, want 850 prompt tokens, 800 cached", u)
			}
			if n != tc.tokens || firsts != min(n, 1) {
				t.Errorf("%d tokens, first called %d times; want %d tokens", n, firsts, tc.tokens)
			}
			if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("error %v, want %q", err, tc.err)
			}
		})
	}
}

func TestRunSummary(t *testing.T) {
	sc := scenario{Name: "s", Replicas: []int32{1, 1}}
	ms := time.Millisecond
	out := []result{
		{At: 0, Entry: 0, Served: 0, Pod: "a", TTFT: 100 * ms, Total: 500 * ms},
		{At: 500 * ms, Entry: 0, Served: 1, Pod: "b", TTFT: 300 * ms, Total: 900 * ms},
		{At: 1300 * ms, Entry: 1, Served: 1, Pod: "b", TTFT: 2 * time.Second, Total: 2700 * ms},
		{At: 1600 * ms, Entry: 1, Served: -1, Total: 10 * ms, Err: "dial tcp: connection refused"},
	}
	r := newRun(sc, "p", 0, out, 2*time.Second, time.Second, time.Minute)
	if r.OK != 3 || r.Errors != 1 || r.ErrKinds["connection refused"] != 1 {
		t.Fatalf("ok %d errors %d kinds %v", r.OK, r.Errors, r.ErrKinds)
	}
	// Goodput: 2 requests within the SLO over the 2 s arrival window.
	if r.SpanS != 4 || r.Throughput != 0.75 || r.Goodput != 1 || r.WithinSLO != 0.5 {
		t.Fatalf("span %v throughput %v goodput %v within %v", r.SpanS, r.Throughput, r.Goodput, r.WithinSLO)
	}
	if r.CrossShare != 1.0/3 || !slices.Equal(r.Served, []int{1, 2}) {
		t.Fatalf("cross %v served %v", r.CrossShare, r.Served)
	}
	if r.P50Ms != 300 || !slices.Equal(r.GoodPerSecond, []int{2, 0}) || !slices.Equal(r.ErrPerSecond, []int{0, 1}) {
		t.Fatalf("p50 %v good %v errors %v", r.P50Ms, r.GoodPerSecond, r.ErrPerSecond)
	}
	// Served where they entered: 100 ms at an idle pod and 2000 ms at a
	// pod still serving the crossing that arrived at 500 ms; across: 300
	// ms at an idle pod; the failed request is in neither.
	if r.Local != (split{Requests: 2, P50Ms: 1050, P99Ms: 1981, AtIdle: 1, AtIdleP50Ms: 100, OthersMean: 0.5}) ||
		r.Across != (split{Requests: 1, P50Ms: 300, P99Ms: 300, AtIdle: 1, AtIdleP50Ms: 300}) {
		t.Fatalf("where entered %+v, across %+v", r.Local, r.Across)
	}
}

func TestSplitMediansLeaveOutRunsWithoutSuchRequests(t *testing.T) {
	runs := []runResult{
		{Across: split{Requests: 10, P50Ms: 100, P99Ms: 300, AtIdle: 4, AtIdleP50Ms: 90, OthersMean: 0.5}},
		{Across: split{}},
		{Across: split{Requests: 20, P50Ms: 140, P99Ms: 500, OthersMean: 2}},
		{Across: split{Requests: 30, P50Ms: 120, P99Ms: 400, AtIdle: 6, AtIdleP50Ms: 70, OthersMean: 1}},
	}
	got := medianSplit(runs, func(r runResult) split { return r.Across })
	// The idle p50 is the median of the two runs with such requests.
	if want := (split{Requests: 60, P50Ms: 120, P99Ms: 400, AtIdle: 10, AtIdleP50Ms: 80, OthersMean: 1}); got != want {
		t.Fatalf("median split %+v, want %+v", got, want)
	}
	if got := medianSplit(runs, func(r runResult) split { return r.Local }); got != (split{}) {
		t.Fatalf("median of no requests %+v, want zero", got)
	}
}

func TestOthersAtArrivalCountsThePodsRequestsNotYetEnded(t *testing.T) {
	ms := time.Millisecond
	out := []result{
		{At: 0, Pod: "a", Total: 300 * ms},
		{At: 100 * ms, Pod: "a", Total: 300 * ms},
		{At: 200 * ms, Pod: "b", Total: 100 * ms},
		{At: 250 * ms, Pod: "a", Total: 100 * ms},
		// Ends as the next arrives: not counted.
		{At: 300 * ms, Pod: "b", Total: 50 * ms},
		{At: 350 * ms, Pod: "b", Total: 50 * ms},
		// Failed and pod-less requests count for nothing and find nothing.
		{At: 260 * ms, Pod: "a", Total: time.Second, Err: "503"},
		{At: 270 * ms, Total: time.Second},
	}
	got := othersAtArrival(out)
	if want := []int{0, 1, 0, 2, 0, 0, 0, 0}; !slices.Equal(got, want) {
		t.Fatalf("others at arrival %v, want %v", got, want)
	}
}

func TestBarsAreJudgedOnTheMedians(t *testing.T) {
	for _, tc := range []struct {
		fleet float64
		met   []bool // vs the better load balancer, the oracle, gie-local
	}{{100, []bool{true, true, true}}, {130, []bool{false, false, true}}, {90, []bool{true, true, true}}, {210, []bool{false, false, false}}} {
		r := &results{Config: config{reps: 1}, Scenarios: []scenario{{Name: "hot-cluster"}}}
		for pol, p99 := range map[string]float64{"gie-local": 400, "round-robin": 200, "least-load": 150, "fleetinfer": tc.fleet, "oracle": 100} {
			r.Runs = append(r.Runs, runResult{Scenario: "hot-cluster", Policy: pol, P99Ms: p99, Requests: 1})
		}
		r.summarize()
		var got []bool
		for _, b := range r.Bars[:3] {
			got = append(got, b.Met)
		}
		if !slices.Equal(got, tc.met) {
			t.Errorf("fleetinfer p99 %v: bars %+v, want met %v", tc.fleet, r.Bars, tc.met)
		}
		if last := r.Bars[len(r.Bars)-1]; last.Bar != "0 requests forwarded twice" || !last.Met {
			t.Errorf("last bar %+v, want no request forwarded twice, met", last)
		}
	}
}

func TestRemoteAgeForwardsTwiceAndConnectionsOpenedFromThePickersCounts(t *testing.T) {
	before := pickerCounts{0: {remotePicks: 10, lag: map[float64]float64{0.05: 5, 0.1: 10, math.Inf(1): 10}, opened: 40},
		1: {remotePicks: 0, lag: map[float64]float64{0.05: 0, 0.1: 0, math.Inf(1): 0}, opened: 7}}
	after := pickerCounts{0: {remotePicks: 30, lag: map[float64]float64{0.05: 5, 0.1: 110, math.Inf(1): 110}, opened: 43},
		1: {remotePicks: 5, lag: map[float64]float64{0.05: 0, 0.1: 0, math.Inf(1): 0}, opened: 8},
		2: {opened: 100}}
	r := runResult{Crossed: 22, Errors: 1}
	r.addPickerCounts(before, after)
	// 25 remote picks for 22 crossed requests and 1 failure: 2 twice.
	if r.ForwardedTwice != 2 {
		t.Errorf("forwarded twice %d, want 2", r.ForwardedTwice)
	}
	// 100 observations in (50 ms, 100 ms]: p99 at 99.5 ms.
	if r.RemoteAgeP99Ms == nil || math.Abs(*r.RemoteAgeP99Ms-99.5) > 0.01 {
		t.Errorf("remote age p99 %v, want 99.5 ms", r.RemoteAgeP99Ms)
	}
	// 3 and 1 opened by the gateways counted before and after the run.
	if r.ConnectionsOpened == nil || *r.ConnectionsOpened != 4 {
		t.Errorf("connections opened %v, want 4", r.ConnectionsOpened)
	}
	var none runResult
	none.addPickerCounts(nil, nil)
	if none.RemoteAgeP99Ms != nil || none.ForwardedTwice != 0 || none.ConnectionsOpened != nil {
		t.Errorf("without counts: %+v", none)
	}
}

// A run of some scenarios explains only those: a paragraph about a
// scenario that did not run would quote zeros as its figures.
func TestReadingExplainsOnlyTheScenariosThatRan(t *testing.T) {
	r := &results{Summary: []summary{{Scenario: "hot-cluster", Policy: "fleetinfer"}, {Scenario: "moving-hotspot", Policy: "fleetinfer"}}}
	got := r.reading()
	for _, want := range []string{"**Hot cluster.**", "**Noise.**"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in:\n%s", want, got)
		}
	}
	// The moving hot spot's paragraph also quotes the slowing link, which
	// did not run.
	for _, absent := range []string{"**Moving hot spot", "**Prefixes.**", "**Cluster lost.**"} {
		if strings.Contains(got, absent) {
			t.Errorf("%q for a scenario that did not run:\n%s", absent, got)
		}
	}
}

// recordedLinks names the hop in every address it reaches.
type recordedLinks struct{}

func (recordedLinks) reach(from, to int, url string) (string, error) {
	return fmt.Sprintf("%s via %d-%d", url, from, to), nil
}

// passLinks reaches every address unchanged and records the hops asked.
type passLinks struct{ asked [][2]int }

func (l *passLinks) reach(from, to int, url string) (string, error) {
	l.asked = append(l.asked, [2]int{from, to})
	return url, nil
}

// An attempt reaches another cluster over the link between the two:
// SkyServe's from where it entered to its load balancer's region and on to
// the gateway it picked, the oracle's straight to the pod's cluster.
func TestAttemptsCrossTheLinksOnTheirWay(t *testing.T) {
	for _, tc := range []struct {
		name         string
		entry        int
		cluster, via int
		wantURL      string
		wantLB       string
	}{
		{name: "served where it entered", entry: 1, cluster: 1, via: -1, wantURL: "gw"},
		{name: "straight to another cluster", entry: 1, cluster: 2, via: -1, wantURL: "gw via 1-2"},
		{name: "through a load balancer where it entered", entry: 0, cluster: 2, via: 0, wantURL: "gw via 0-2", wantLB: "lb"},
		{name: "to a load balancer elsewhere and back", entry: 1, cluster: 1, via: 0, wantURL: "gw via 0-1", wantLB: "lb via 1-0"},
		{name: "to a load balancer elsewhere and on to a third cluster", entry: 2, cluster: 1, via: 0, wantURL: "gw via 0-1", wantLB: "lb via 2-0"},
		{name: "to a load balancer elsewhere, served where it stands", entry: 1, cluster: 0, via: 0, wantURL: "gw", wantLB: "lb via 1-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &loadClient{links: recordedLinks{}}
			tg := target{URL: "gw", Cluster: tc.cluster, via: tc.via}
			if tc.via >= 0 {
				tg.lb = "lb"
			}
			got, err := c.linked(tc.entry, tg)
			if err != nil {
				t.Fatal(err)
			}
			if got.URL != tc.wantURL || got.lb != tc.wantLB {
				t.Fatalf("linked URL %q, load balancer %q; want %q, %q", got.URL, got.lb, tc.wantURL, tc.wantLB)
			}
		})
	}
	got, err := (&loadClient{}).linked(1, target{URL: "gw", Cluster: 2, via: 0, lb: "lb"})
	if err != nil || got.URL != "gw" || got.lb != "lb" {
		t.Fatalf("without links: %+v, %v; want the URLs unchanged", got, err)
	}
}

// The benchmark's own connections to another cluster pay the fabric's
// link: a forward per address, made once, gone with close.
func TestFabricLinksCarryConnectionsOverTheLink(t *testing.T) {
	const rtt = 60 * time.Millisecond
	m, err := wan.Parse([]byte("clusters: [a, b]\ndefault: {rtt: 60ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := wan.NewFabric(wan.FabricOptions{Matrix: m})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer srv.Close()
	l := newFabricLinks(f, []string{"a", "b"})
	u, err := l.reach(0, 1, srv.URL+"/v1/completions")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(u, "/v1/completions") || strings.HasPrefix(u, srv.URL) {
		t.Fatalf("reached %s as %s, want another address with the same path", srv.URL, u)
	}
	if again, _ := l.reach(0, 1, srv.URL+"/health"); !strings.HasPrefix(again, strings.TrimSuffix(u, "/v1/completions")) {
		t.Fatalf("second address %s, want the first forward %s", again, u)
	}
	if _, err := l.reach(0, 2, srv.URL); err == nil {
		t.Fatal("reached a cluster with no index, want an error")
	}
	cl := &http.Client{Transport: &http.Transport{}}
	for i, floor := range []time.Duration{rtt, rtt} {
		start := time.Now()
		resp, err := cl.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if took := time.Since(start); took < floor {
			t.Fatalf("request %d took %v, want at least the link's round trip %v", i, took, floor)
		}
	}
	l.close()
	if resp, err := cl.Get(u); err == nil {
		resp.Body.Close()
		t.Fatal("a request through a closed forward succeeded")
	}
}

// refusedRouter sends every attempt through a load balancer in cluster 0
// (its proxy at lb) to cluster 1's gateway, which refuses connections.
type refusedRouter struct{ url, lb string }

func (r refusedRouter) route(arrival) (target, bool) {
	return target{URL: r.url, Cluster: 1, pod: -1, via: 0, lb: r.lb}, true
}
func (refusedRouter) done(target)               {}
func (refusedRouter) attempts() int             { return 3 }
func (refusedRouter) backoff(int) time.Duration { return 0 }
func (refusedRouter) lose(int)                  {}

// refusingAddr is a loopback address that refuses connections for the
// test's length: a port bound but not listening. A port listened on and
// closed would be free for any other process (tests run in parallel) to
// listen on.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// startTestSkyProxy starts the load balancer stand-in for one test and
// closes it when the test ends.
func startTestSkyProxy(t *testing.T, keepaliveExpiry time.Duration) *skyProxy {
	t.Helper()
	lb, err := startSkyProxy(keepaliveExpiry)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lb.close)
	return lb
}

// A request reaches the load balancer once; its retries leave from there.
func TestRetriesLeaveFromTheLoadBalancer(t *testing.T) {
	url := "http://" + refusingAddr(t)
	lb := startTestSkyProxy(t, httpxLimits.keepaliveExpiry)
	links := &passLinks{}
	c := newLoadClient(1, 5*time.Second, nil, links)
	res := c.do(context.Background(), refusedRouter{url: url, lb: lb.url}, arrival{Entry: 1, Prefix: -1}, time.Now())
	if res.ok() || res.Attempts != 3 {
		t.Fatalf("result %+v, want 3 failed attempts", res)
	}
	want := [][2]int{{1, 0}, {0, 1}, {0, 1}, {0, 1}}
	if !slices.Equal(links.asked, want) {
		t.Fatalf("links crossed %v, want %v", links.asked, want)
	}
}

// SkyServe's load balancer passes the request to the gateway picked with the
// route's Host and streams the answer back event by event.
func TestSkyServesRequestsPassItsProxyAndStreamThrough(t *testing.T) {
	const hold = time.Second
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != "pool.example" || r.Header.Get(upstreamHeader) != "" || r.URL.Path != "/v1/completions" {
			http.Error(w, fmt.Sprintf("host %q, upstream header %q, path %q", r.Host, r.Header.Get(upstreamHeader), r.URL.Path), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Inference-Pod", "west-a")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(hold)
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer gw.Close()
	lb := startTestSkyProxy(t, httpxLimits.keepaliveExpiry)
	c := newLoadClient(2, 5*time.Second, map[string]int{"west-a": 1}, nil)
	var res result
	tg := target{URL: gw.URL, Host: "pool.example", Cluster: 1, pod: -1, via: 0, lb: lb.url}
	if _, err := c.attempt(context.Background(), tg, []byte(`{}`), time.Now(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Tokens != 2 || res.Served != 1 || res.Pod != "west-a" {
		t.Fatalf("result %+v, want 2 tokens served by west-a in cluster 1", res)
	}
	// A proxy that buffered the stream would deliver the first token with
	// the rest, after the gateway's pause.
	if res.TTFT >= hold*8/10 || res.Total < hold {
		t.Fatalf("first token after %v, stream over after %v: want the first token before the gateway's %v pause", res.TTFT, res.Total, hold)
	}
	// The proxy refuses a request that names no upstream.
	resp, err := http.Post(lb.url+"/v1/completions", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("without %s: %s, want 400", upstreamHeader, resp.Status)
	}
}

func TestTheClientReusesItsConnectionAfterAStream(t *testing.T) {
	var conns atomic.Int32
	gw := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
		// The end of the chunked body follows [DONE] on its own, as a
		// model server's may.
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
	}))
	gw.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	gw.Start()
	defer gw.Close()
	c := newLoadClient(1, 5*time.Second, nil, nil)
	for range 3 {
		var res result
		if _, err := c.attempt(context.Background(), target{URL: gw.URL, pod: -1, via: -1}, []byte(`{}`), time.Now(), &res); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("3 requests in turn opened %d connections, want 1", n)
	}
}

// SkyServe's load balancer keeps a connection to a gateway only as long as
// httpx does: reused while busy, closed once idle for its keepalive expiry,
// so the next request opens (and counts) another.
func TestTheLoadBalancerReopensAConnectionLeftIdlePastItsExpiry(t *testing.T) {
	var conns atomic.Int32
	gw := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	}))
	gw.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	gw.Start()
	defer gw.Close()
	const expiry = 300 * time.Millisecond
	lb := startTestSkyProxy(t, expiry)
	c := newLoadClient(1, 5*time.Second, nil, nil)
	send := func() {
		t.Helper()
		var res result
		if _, err := c.attempt(context.Background(), target{URL: gw.URL, pod: -1, via: -1, lb: lb.url}, []byte(`{}`), time.Now(), &res); err != nil {
			t.Fatal(err)
		}
	}
	send()
	send()
	if n, opened := conns.Load(), lb.opened.Load(); n != 1 || opened != 1 {
		t.Fatalf("2 requests in turn: the gateway saw %d connections, the load balancer counted %d; want 1 and 1", n, opened)
	}
	time.Sleep(3 * expiry)
	send()
	if n, opened := conns.Load(), lb.opened.Load(); n != 2 || opened != 2 {
		t.Fatalf("a request after %v idle: the gateway saw %d connections, the load balancer counted %d; want 2 and 2", 3*expiry, n, opened)
	}
}

// SkyServe's load balancer reads a request's whole body before it sends the
// request on: the gateway sees no request while the body is still arriving.
func TestTheLoadBalancerSendsARequestOnOnlyOnceItsBodyHasArrived(t *testing.T) {
	const pause = 300 * time.Millisecond
	type seen struct {
		at   time.Time
		body string
		size int64
	}
	got := make(chan seen, 1)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		b, _ := io.ReadAll(r.Body)
		got <- seen{at: at, body: string(b), size: r.ContentLength}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer gw.Close()
	lb := startTestSkyProxy(t, httpxLimits.keepaliveExpiry)
	// The body's second half leaves the client a pause after its first.
	pr, pw := io.Pipe()
	lastSent := make(chan time.Time, 1)
	go func() {
		_, _ = io.WriteString(pw, `{"prompt":`)
		time.Sleep(pause)
		lastSent <- time.Now()
		_, _ = io.WriteString(pw, `"hello"}`)
		_ = pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, lb.url+"/v1/completions", pr)
	req.Header.Set(upstreamHeader, gw.URL)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %s, want 200", resp.Status)
	}
	s := <-got
	if s.body != `{"prompt":"hello"}` || s.size != int64(len(s.body)) {
		t.Fatalf("the gateway got body %q of length %d, want the whole body with its length", s.body, s.size)
	}
	if last := <-lastSent; s.at.Before(last) {
		t.Fatalf("the gateway saw the request %v before the body's last part left the client", last.Sub(s.at))
	}
}

func TestRequestsAreWrittenBeforeTheResultsDirectoryExists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "not-yet", "requests-hot-cluster-fleetinfer-0.jsonl")
	if err := writeRequests(path, []result{{Entry: 0, Prefix: 3, Served: 1, Pod: "west-a", TTFT: 80 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), `"ttft_ms":80`) || !strings.Contains(string(b), `"pod":"west-a"`) || !strings.Contains(string(b), `"prefix":3`) {
		t.Fatalf("requests file: %q, %v", b, err)
	}
}

func TestEachPolicyRunsWithOnlyItsOwnPickers(t *testing.T) {
	for pol, want := range map[string]string{
		"gie-local": stockPool, "round-robin": stockPool, "least-load": stockPool, "fleetinfer": fleetPool, "oracle": "",
	} {
		if got := poolOf(pol); got != want {
			t.Errorf("poolOf(%q) = %q, want %q", pol, got, want)
		}
	}
	if len(policies) != 5 {
		t.Errorf("a policy was added (%v): say which pickers it runs with", policies)
	}
}
