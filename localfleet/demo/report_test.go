package demo

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/loadgen"
)

func TestSummarizeCountsWhereRequestsWereServed(t *testing.T) {
	t0 := time.Now()
	ok := func(entry, pod string, ttft time.Duration) loadgen.Result {
		return loadgen.Result{Entry: entry, Start: t0, Status: 200, Tokens: 4, TTFT: ttft, Total: 2 * ttft, Pod: pod, Namespace: "demo"}
	}
	res := []loadgen.Result{
		ok("central", "c-0", 100*time.Millisecond),
		ok("central", "e-0", 300*time.Millisecond),
		ok("central", "w-0", 200*time.Millisecond),
		ok("east", "e-0", 50*time.Millisecond),
		{Entry: "central", Start: t0, Status: 503, Err: "503 Service Unavailable: no healthy upstream"},
		{Entry: "west", Start: t0, Err: "dropped by the client: too many requests in flight"},
		ok("west", "gone-0", 60*time.Millisecond),
	}
	servedBy := map[string]string{"demo/c-0": "central", "demo/e-0": "east", "demo/w-0": "west"}
	st := summarize("federated", "central", []string{"central", "east", "west"}, t0, 2*time.Second, res, servedBy)
	if st.Requests != 7 || st.OK != 5 {
		t.Errorf("requests %d, completed %d; want 7 and 5", st.Requests, st.OK)
	}
	if st.Served["central"]["east"] != 1 || st.Served["central"]["west"] != 1 || st.Served["central"]["central"] != 1 || st.Served["east"]["east"] != 1 {
		t.Errorf("traffic matrix %v", st.Served)
	}
	if st.unknownServingPod != 1 || st.Served["west"]["?"] != 1 {
		t.Errorf("a pod no cluster holds any more must be counted as unknown: %v", st.Served)
	}
	// 2 of 5 completed requests provably left their entry cluster.
	if st.CrossCluster != 0.4 {
		t.Errorf("cross-cluster share %v, want 0.4", st.CrossCluster)
	}
	if st.HotP50 != 200*time.Millisecond || st.ReqPerS != 2.5 || st.TokPerS != 10 {
		t.Errorf("hot p50 %s, %.1f req/s, %.1f tok/s", st.HotP50, st.ReqPerS, st.TokPerS)
	}
	if len(st.Errors) != 2 || st.Errors["HTTP 503"] != 1 {
		t.Errorf("errors %v", st.Errors)
	}
	for _, svg := range []string{ttftSVG([]phaseStats{st}), trafficSVG([]phaseStats{st})} {
		if !strings.HasPrefix(svg, "<svg") || !strings.HasSuffix(svg, "</svg>\n") {
			t.Errorf("not an SVG document: %.80s", svg)
		}
	}
}
