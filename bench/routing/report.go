package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetinfer/fleetinfer/bench/internal/host"
	"github.com/fleetinfer/fleetinfer/internal/stats"
)

type results struct {
	Config config `json:"-"`
	host.Run
	FleetStartup   string      `json:"fleet_startup"`
	Clusters       []string    `json:"clusters"`
	Setup          setup       `json:"setup"`
	FleetEPPConfig string      `json:"fleetinfer_epp_config"`
	Scenarios      []scenario  `json:"scenarios"`
	Runs           []runResult `json:"runs"`
	Summary        []summary   `json:"summary"`
	// WAN is the network between the clusters.
	WAN *wanSetup `json:"wan"`
	// Bars are the "done when" bars, judged on the medians.
	Bars []bar `json:"bars"`
}

type setup struct {
	RunSeconds float64 `json:"arrival_window_s"`
	MaxTokens  int     `json:"max_tokens"`
	SLOMs      float64 `json:"ttft_slo_ms"`
	SimArgs    string  `json:"simulator_args"`
}

// runResult is one policy's run of one scenario.
type runResult struct {
	Scenario string `json:"scenario"`
	Policy   string `json:"policy"`
	Rep      int    `json:"rep"`
	Requests int    `json:"requests"`
	OK       int    `json:"ok"`
	Errors   int    `json:"errors"`
	// TTFT quantiles are over the requests that streamed a token.
	P50Ms float64 `json:"ttft_p50_ms"`
	P90Ms float64 `json:"ttft_p90_ms"`
	P99Ms float64 `json:"ttft_p99_ms"`
	// Throughput is completed requests per second over the span from the
	// first arrival to the last request's end, Goodput the requests within
	// the TTFT SLO per second of the arrival window; WithinSLO is the share
	// of all arrivals within the SLO.
	Throughput float64 `json:"throughput_rps"`
	Goodput    float64 `json:"goodput_rps"`
	WithinSLO  float64 `json:"within_slo"`
	// CrossShare is the share of completed requests served in another
	// cluster than the one they entered.
	CrossShare float64 `json:"cross_cluster_share"`
	Crossed    int     `json:"crossed"`
	// Local and Across are the TTFT of completed requests served in the
	// cluster they entered and in another one: what a crossing costs a
	// policy beyond its link shows in the difference.
	Local  split `json:"served_where_entered"`
	Across split `json:"served_across"`
	// CacheHit is the share of prompt tokens the simulators found in their
	// prefix caches.
	CacheHit float64 `json:"prefix_cache_hit"`
	// ForwardedTwice counts requests fleetinfer's pickers sent to another
	// cluster twice (see addPickerCounts); 0 for the other policies, whose
	// pickers do not forward. RemoteAgeP99Ms is the p99 age of remote data
	// at fleetinfer's crossing picks, from the peer's scrape to the pick
	// (fleetinfer_epp_federation_lag_seconds); absent for other policies.
	ForwardedTwice int      `json:"forwarded_twice"`
	RemoteAgeP99Ms *float64 `json:"remote_age_p99_ms,omitempty"`
	// FederationKiBps is the federation traffic from one picker to one
	// peer, KiB per second of the run (addPickerCounts); fleetinfer only.
	FederationKiBps *float64 `json:"federation_kib_per_s_per_peer,omitempty"`
	// ConnectionsOpened is how many connections the gateways opened to
	// the pickers' destinations during the run
	// (fleetinfer_gateway_upstream_connections_total); fleetinfer only.
	// A crossing that opens one pays an extra round trip over its link.
	ConnectionsOpened *int `json:"gateway_connections_opened,omitempty"`
	// LBConnectionsOpened is how many connections SkyServe's load balancer
	// opened to the gateways during the run (skyProxy); SkyServe's
	// policies only. Like ConnectionsOpened, each crossed a link.
	LBConnectionsOpened *int `json:"load_balancer_connections_opened,omitempty"`
	// Served counts completed requests per serving cluster.
	Served   []int          `json:"served_per_cluster"`
	ErrKinds map[string]int `json:"errors_by_kind,omitempty"`
	// PerSecond are, per second of arrival, the requests within the SLO and
	// the failed ones.
	GoodPerSecond []int   `json:"good_per_second"`
	ErrPerSecond  []int   `json:"errors_per_second"`
	SpanS         float64 `json:"span_s"`
	WallS         float64 `json:"wall_s"`
	// LoadAverage is the machine's 1-minute load average when the run
	// ended; MaxSendLagMs the longest an arrival was sent after its time
	// (the load generator itself starved of CPU).
	LoadAverage  float64 `json:"load_average"`
	MaxSendLagMs float64 `json:"max_send_lag_ms"`
	// CPU is what the machine's cores did over the run (cpu.go).
	CPU *cpuUse `json:"cpu,omitempty"`
}

// split is the TTFT of a part of a run's requests. Its requests' pods tell
// a policy's path from its load: AtIdleP50Ms is the p50 TTFT of those that
// found their pod serving no other request (the path alone: gateways,
// pickers, links and an idle pod's prefill), OthersMean how many other
// requests their pods served on average when they arrived (the load they
// met). Both go by the client's times, from a request's arrival to its
// end, which for a crossing include its link.
type split struct {
	Requests    int     `json:"requests"`
	P50Ms       float64 `json:"ttft_p50_ms"`
	P99Ms       float64 `json:"ttft_p99_ms"`
	AtIdle      int     `json:"at_idle_pod"`
	AtIdleP50Ms float64 `json:"ttft_p50_at_idle_pod_ms"`
	OthersMean  float64 `json:"others_at_pod_mean"`
}

// atPod is a completed request's TTFT and the other requests its pod
// served when it arrived (othersAtArrival).
type atPod struct {
	ttftMs float64
	others int
}

func splitOf(part []atPod) split {
	ttft, idle := make([]float64, 0, len(part)), []float64{}
	others := 0
	for _, x := range part {
		ttft = append(ttft, x.ttftMs)
		others += x.others
		if x.others == 0 {
			idle = append(idle, x.ttftMs)
		}
	}
	out := split{Requests: len(part), P50Ms: stats.Quantile(ttft, 0.5), P99Ms: stats.Quantile(ttft, 0.99), AtIdle: len(idle)}
	if len(idle) > 0 {
		out.AtIdleP50Ms = stats.Quantile(idle, 0.5)
	}
	if len(part) > 0 {
		out.OthersMean = float64(others) / float64(len(part))
	}
	return out
}

// othersAtArrival returns, for each completed request of out, how many
// other completed requests of its pod had arrived before it and not yet
// ended, by the client's times; 0 for the rest.
func othersAtArrival(out []result) []int {
	byPod := map[string][]int{}
	for i, x := range out {
		if x.ok() && x.Pod != "" {
			byPod[x.Pod] = append(byPod[x.Pod], i)
		}
	}
	others := make([]int, len(out))
	for _, idx := range byPod {
		for _, i := range idx {
			for _, j := range idx {
				if j != i && out[j].At <= out[i].At && out[i].At < out[j].At+out[j].Total {
					others[i]++
				}
			}
		}
	}
	return others
}

func newRun(sc scenario, pol string, rep int, out []result, window, slo time.Duration, wall time.Duration) runResult {
	secs := int((window + time.Second - 1) / time.Second)
	r := runResult{Scenario: sc.Name, Policy: pol, Rep: rep, Requests: len(out), Served: make([]int, len(sc.Replicas)),
		ErrKinds: map[string]int{}, GoodPerSecond: make([]int, secs), ErrPerSecond: make([]int, secs), WallS: wall.Seconds(),
		LoadAverage: host.LoadAverage()}
	var ttft []float64
	var local, across []atPod
	others := othersAtArrival(out)
	var span time.Duration
	good, cross, served, prompt, cached := 0, 0, 0, 0, 0
	for i, x := range out {
		span = max(span, x.At+x.Total)
		r.MaxSendLagMs = max(r.MaxSendLagMs, ms(x.SendLag))
		sec := min(int(x.At/time.Second), secs-1)
		if !x.ok() {
			r.Errors++
			r.ErrPerSecond[sec]++
			r.ErrKinds[errKind(x.Err)]++
			continue
		}
		r.OK++
		ttft = append(ttft, ms(x.TTFT))
		prompt, cached = prompt+x.PromptTokens, cached+x.CachedTokens
		if x.TTFT <= slo {
			good++
			r.GoodPerSecond[sec]++
		}
		if x.Served >= 0 {
			served++
			r.Served[x.Served]++
			if x.Served != x.Entry {
				cross++
				across = append(across, atPod{ms(x.TTFT), others[i]})
			} else {
				local = append(local, atPod{ms(x.TTFT), others[i]})
			}
		}
	}
	r.P50Ms, r.P90Ms, r.P99Ms = stats.Quantile(ttft, 0.5), stats.Quantile(ttft, 0.9), stats.Quantile(ttft, 0.99)
	r.Local, r.Across = splitOf(local), splitOf(across)
	r.SpanS = span.Seconds()
	if span > 0 {
		r.Throughput = float64(r.OK) / span.Seconds()
	}
	// Goodput divides by the arrival window, the same for every policy:
	// over the span, equal outcomes would differ by when the last response
	// happened to end.
	r.Goodput = float64(good) / window.Seconds()
	if len(out) > 0 {
		r.WithinSLO = float64(good) / float64(len(out))
	}
	r.Crossed = cross
	if served > 0 {
		r.CrossShare = float64(cross) / float64(served)
	}
	if prompt > 0 {
		r.CacheHit = float64(cached) / float64(prompt)
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// errKind shortens an error to what kind it is, for counting.
func errKind(e string) string {
	for _, k := range []string{"connection refused", "connection reset", "EOF", "503", "500", "502", "deadline exceeded",
		"without [DONE]", "no route", "too many"} {
		if strings.Contains(e, k) {
			return k
		}
	}
	if len(e) > 60 {
		e = e[:60]
	}
	return e
}

func (r runResult) line() string {
	return fmt.Sprintf("n=%d ok=%d err=%d ttft p50 %.0f ms p99 %.0f ms, %.1f req/s, goodput %.1f req/s, cross %.0f%%",
		r.Requests, r.OK, r.Errors, r.P50Ms, r.P99Ms, r.Throughput, r.Goodput, 100*r.CrossShare)
}

// summary is the median over repetitions of one scenario and policy.
type summary struct {
	Scenario   string  `json:"scenario"`
	Policy     string  `json:"policy"`
	P50Ms      float64 `json:"ttft_p50_ms"`
	P99Ms      float64 `json:"ttft_p99_ms"`
	Throughput float64 `json:"throughput_rps"`
	Goodput    float64 `json:"goodput_rps"`
	WithinSLO  float64 `json:"within_slo"`
	CrossShare float64 `json:"cross_cluster_share"`
	CacheHit   float64 `json:"prefix_cache_hit"`
	ErrorShare float64 `json:"error_share"`
	// P99Range and GoodputRange are the lowest and highest over the runs.
	P99Range     [2]float64 `json:"ttft_p99_range_ms"`
	GoodputRange [2]float64 `json:"goodput_range_rps"`
	// ForwardedTwice is the total over the runs; RemoteAgeP99Ms the median
	// of the runs' (absent for policies other than fleetinfer).
	ForwardedTwice int      `json:"forwarded_twice"`
	RemoteAgeP99Ms *float64 `json:"remote_age_p99_ms,omitempty"`
	// FederationKiBps, ConnectionsOpened and LBConnectionsOpened are the
	// medians of the runs'.
	FederationKiBps     *float64 `json:"federation_kib_per_s_per_peer,omitempty"`
	ConnectionsOpened   *float64 `json:"gateway_connections_opened,omitempty"`
	LBConnectionsOpened *float64 `json:"load_balancer_connections_opened,omitempty"`
	// Local and Across hold the medians of the runs' p50 and p99 (of runs
	// with such requests) and the requests of all runs.
	Local  split `json:"served_where_entered"`
	Across split `json:"served_across"`
	// LoadAverage and SendLagMs are medians of the runs' figures.
	LoadAverage float64 `json:"load_average"`
	SendLagMs   float64 `json:"max_send_lag_ms"`
	// CPU holds the medians of the runs' figures.
	CPU  *cpuUse `json:"cpu,omitempty"`
	Runs int     `json:"runs"`
}

// bar is one of the bars and whether this run met it.
type bar struct {
	Scenario string `json:"scenario"`
	Bar      string `json:"bar"`
	Figure   string `json:"figure"`
	Met      bool   `json:"met"`
}

func (r *results) summarize() {
	c := r.Config
	r.Setup = setup{RunSeconds: c.duration.Seconds(), MaxTokens: c.maxTokens, SLOMs: ms(c.slo), SimArgs: simLatency}
	type key struct{ sc, pol string }
	groups := map[key][]runResult{}
	var order []key
	for _, run := range r.Runs {
		k := key{run.Scenario, run.Policy}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], run)
	}
	for _, k := range order {
		var p50s, p99s, tp, gp, slo, cross, hit, errs, load, lag, age, fed, opened, lbOpened []float64
		twice := 0
		for _, run := range groups[k] {
			p50s, p99s = append(p50s, run.P50Ms), append(p99s, run.P99Ms)
			tp, gp, slo = append(tp, run.Throughput), append(gp, run.Goodput), append(slo, run.WithinSLO)
			cross, errs = append(cross, run.CrossShare), append(errs, float64(run.Errors)/float64(max(run.Requests, 1)))
			hit = append(hit, run.CacheHit)
			load, lag = append(load, run.LoadAverage), append(lag, run.MaxSendLagMs)
			twice += run.ForwardedTwice
			if run.RemoteAgeP99Ms != nil {
				age = append(age, *run.RemoteAgeP99Ms)
			}
			if run.FederationKiBps != nil {
				fed = append(fed, *run.FederationKiBps)
			}
			if run.ConnectionsOpened != nil {
				opened = append(opened, float64(*run.ConnectionsOpened))
			}
			if run.LBConnectionsOpened != nil {
				lbOpened = append(lbOpened, float64(*run.LBConnectionsOpened))
			}
		}
		s := summary{Scenario: k.sc, Policy: k.pol, P50Ms: stats.Median(p50s), P99Ms: stats.Median(p99s), Throughput: stats.Median(tp),
			Goodput: stats.Median(gp), WithinSLO: stats.Median(slo), CrossShare: stats.Median(cross), CacheHit: stats.Median(hit), ErrorShare: stats.Median(errs),
			P99Range: [2]float64{slices.Min(p99s), slices.Max(p99s)}, GoodputRange: [2]float64{slices.Min(gp), slices.Max(gp)},
			ForwardedTwice: twice, LoadAverage: stats.Median(load), SendLagMs: stats.Median(lag), Runs: len(groups[k])}
		s.Local = medianSplit(groups[k], func(r runResult) split { return r.Local })
		s.Across = medianSplit(groups[k], func(r runResult) split { return r.Across })
		s.CPU = medianCPU(groups[k])
		if len(age) > 0 {
			m := stats.Median(age)
			s.RemoteAgeP99Ms = &m
		}
		if len(opened) > 0 {
			m := stats.Median(opened)
			s.ConnectionsOpened = &m
		}
		if len(lbOpened) > 0 {
			m := stats.Median(lbOpened)
			s.LBConnectionsOpened = &m
		}
		if len(fed) > 0 {
			m := stats.Median(fed)
			s.FederationKiBps = &m
		}
		r.Summary = append(r.Summary, s)
	}
	r.Bars = r.judge()
}

// medianSplit is the median over runs of one part of their requests.
func medianSplit(runs []runResult, part func(runResult) split) split {
	var out split
	var p50s, p99s, idle, others []float64
	for _, r := range runs {
		x := part(r)
		if x.Requests > 0 {
			out.Requests += x.Requests
			p50s, p99s, others = append(p50s, x.P50Ms), append(p99s, x.P99Ms), append(others, x.OthersMean)
		}
		if x.AtIdle > 0 {
			out.AtIdle += x.AtIdle
			idle = append(idle, x.AtIdleP50Ms)
		}
	}
	if len(p50s) > 0 {
		out.P50Ms, out.P99Ms, out.OthersMean = stats.Median(p50s), stats.Median(p99s), stats.Median(others)
	}
	if len(idle) > 0 {
		out.AtIdleP50Ms = stats.Median(idle)
	}
	return out
}

// real are the policies one can run; the oracle is a bound.
var realPolicies = []string{"gie-local", "round-robin", "least-load", "fleetinfer"}

// judge checks the bars against the summary.
func (r *results) judge() []bar {
	get := func(sc, pol string) (summary, bool) {
		for _, m := range r.Summary {
			if m.Scenario == sc && m.Policy == pol {
				return m, true
			}
		}
		return summary{}, false
	}
	var out []bar
	add := func(sc, text, figure string, met bool) {
		out = append(out, bar{Scenario: sc, Bar: text, Figure: figure, Met: met})
	}
	if f, ok := get("hot-cluster", "fleetinfer"); ok {
		rr, _ := get("hot-cluster", "round-robin")
		ll, _ := get("hot-cluster", "least-load")
		o, _ := get("hot-cluster", "oracle")
		gl, _ := get("hot-cluster", "gie-local")
		better := min(rr.P99Ms, ll.P99Ms)
		add("hot-cluster", "p99 TTFT ≤ 0.85× the better of round-robin and least-load", fmt.Sprintf("%.2f×", f.P99Ms/better), f.P99Ms <= 0.85*better)
		add("hot-cluster", "p99 TTFT ≤ 1.2× the oracle's", fmt.Sprintf("%.2f×", f.P99Ms/o.P99Ms), f.P99Ms <= 1.2*o.P99Ms)
		add("hot-cluster", "p99 TTFT ≤ 0.5× gie-local's", fmt.Sprintf("%.2f×", f.P99Ms/gl.P99Ms), f.P99Ms <= 0.5*gl.P99Ms)
	}
	for _, sc := range []string{"prefix-remote", "prefix-heavy"} {
		f, ok := get(sc, "fleetinfer")
		if !ok {
			continue
		}
		bestHit, lowest := 0.0, true
		for _, pol := range policies {
			if m, ok := get(sc, pol); ok {
				bestHit = max(bestHit, m.CacheHit)
				if pol != "fleetinfer" && pol != "oracle" && m.P99Ms < f.P99Ms {
					lowest = false
				}
			}
		}
		add(sc, "prefix-cache hit share ≥ 0.9× the best policy's", fmt.Sprintf("%.0f%% vs %.0f%%", 100*f.CacheHit, 100*bestHit), f.CacheHit >= 0.9*bestHit)
		add(sc, "p99 TTFT the lowest of the real policies", fmt.Sprintf("%.0f ms", f.P99Ms), lowest)
	}
	for _, sc := range []string{"moving-hotspot", "slowing-link"} {
		f, ok := get(sc, "fleetinfer")
		if !ok {
			continue
		}
		best, met := 0.0, true
		for _, pol := range realPolicies {
			if m, ok := get(sc, pol); ok && pol != "fleetinfer" {
				best = max(best, m.Goodput)
				met = met && f.Goodput >= m.Goodput
			}
		}
		figure := fmt.Sprintf("%.1f vs best other %.1f req/s", f.Goodput, best)
		if met && f.Goodput == best {
			figure += fmt.Sprintf(" (a tie: %.0f%% within the SLO)", 100*f.WithinSLO)
		}
		add(sc, "goodput ≥ every other real policy's", figure, met)
	}
	for _, s := range r.Scenarios {
		f, ok := get(s.Name, "fleetinfer")
		if !ok {
			continue
		}
		add(s.Name, "0 requests forwarded twice", fmt.Sprint(f.ForwardedTwice), f.ForwardedTwice == 0)
		if f.RemoteAgeP99Ms != nil {
			add(s.Name, "remote data age p99 < 250 ms", fmt.Sprintf("%.0f ms", *f.RemoteAgeP99Ms), *f.RemoteAgeP99Ms < 250)
		}
	}
	return out
}

// writeSoFar summarizes the runs so far and writes the results.
func (r *results) writeSoFar(dir string) error {
	r.Finish()
	r.Summary = nil
	r.summarize()
	return r.write(dir)
}

func (r *results) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := map[string]string{
		"routing.json":         string(b) + "\n",
		"routing.md":           r.markdown(),
		"routing-ttft.svg":     r.ttftSVG(),
		"routing-timeline.svg": r.timelineSVG(),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var policyNotes = map[string]string{
	"gie-local": "(a) GIE v1.5.0's stock EPP binary in each cluster, its default configuration, no federation: every request is served in the cluster it enters.",
	"round-robin": "(b) SkyServe's load balancer with `RoundRobinPolicy` in front of the three gateways (every request passes it, in one region: see below); " +
		"each cluster's stock EPP picks the pod. Ready set refreshed every 20 s.",
	"least-load": "(c) SkyServe's load balancer with `LeastLoadPolicy`, its default: the gateway with the fewest requests in flight " +
		"as the load balancer itself counts them (dispatch to end of stream), ties to the first; each cluster's stock EPP picks the pod. Ready set refreshed every 20 s.",
	"fleetinfer": "(d) fleetinfer's EPP in each cluster, federated (Parent mode: the remote cluster's gateway, with signed marks), with the configuration below: " +
		"it estimates each pod's time to first token (load over the measured service rate, plus the measured round trip for a remote pod, plus the prefill of the prompt blocks the pod does not hold: by its own record for a local pod, by the published prefix summary for a remote one) and sends a request " +
		"to another cluster only when a remote pod is expected sooner by the margin (epp/spill).",
	"oracle": "(e) in-process: every request goes straight to the pod where it expects the first token soonest: requests in flight per batch slot fleet-wide " +
		"(counted exactly in the benchmark: all traffic is its own) times 400 ms, plus the link's current round trip from the entry cluster, plus the prefix's prefill " +
		"where the pod does not hold it (it saw every request and warm-up); it knows a lost cluster at once.",
}

func (r *results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Routing benchmark: five policies, %d scenarios, three clusters apart\n\n", len(r.Scenarios))
	fmt.Fprintf(&b, "Written by `go run ./bench/routing %s` (bench/routing; `make bench-routing` runs it with `-out bench/results -stock-epp bin/gie-epp`) on %s, started %s, in %s "+
		"(fleet start-up %s). The machine's 1-minute load average was %.1f at the start and %.1f at the end (2 cores, shared with other work: "+
		"compare policies within a scenario, which ran back to back, rather than absolute figures). Each scenario states its repetitions; figures are medians over them, "+
		"and each repetition starts with the next policy in turn.\n\n",
		strings.Join(os.Args[1:], " "), r.Machine, r.Started, r.Duration, r.FleetStartup, r.LoadAverage[0], r.LoadAverage[1])
	b.WriteString("## Setup\n\n")
	if w := r.WAN; w != nil {
		var links []string
		for _, l := range w.Links {
			links = append(links, fmt.Sprintf("%s–%s %.0f ms (jitter %.1f ms)", l.A, l.B, l.RTTMs, l.JitterMs))
		}
		fmt.Fprintf(&b, "The clusters are apart: every connection between them crosses an emulated link (localfleet/wan, the default matrix: %s), "+
			"pod networks are %s (no cluster reaches another's pod addresses) and fleetinfer's pickers federate in %s mode: a request that crosses goes "+
			"from the entry cluster's gateway to the other cluster's, with signed marks, and pays the link. The load generator stands in the cluster a request "+
			"enters; where a policy's request travels to another cluster from the client (to SkyServe's load balancer, from it to another gateway, the oracle's "+
			"to another cluster's pod), it crosses the same links through a fabric forward from the cluster it leaves, and before each run a burst of 24 "+
			"completions from each cluster through the policy opens the connections its crossings use, as steady traffic keeps them open. "+
			"The one exception is hot-cluster-flat: the same workload as hot-cluster on flat pod networks (the fabric routes a connection to another "+
			"cluster's pod address over the link), with fleetinfer's pickers in Endpoint mode, so that a crossing request goes from the entry cluster's "+
			"gateway straight to the remote pod, without the other cluster's gateway and picker.\n\n",
			strings.Join(links, ", "), w.PodNetwork, w.Mode)
	}
	fmt.Fprintf(&b, "Three clusters (%s), each a real kube-apiserver with a local kubelet, and each its local gateway (Envoy's ext-proc exchange). "+
		"Model servers are `llm-d-inference-sim` v0.10.2 pods on loopback addresses with a latency model: `%s` and per cluster `--max-num-seqs`. "+
		"A request is a streamed `/v1/completions` of %d tokens (`ignore_eos`); TTFT runs on the client from the request's scheduled arrival to the first SSE event "+
		"carrying text, so it includes queueing anywhere and any retry backoff. Arrivals are Poisson, open loop, over %.0f s per run; every policy gets the same arrivals "+
		"(prompt words differ per policy, so that no run profits from the prefix caches an earlier one left). Between runs the pods drain.\n\n",
		strings.Join(r.Clusters, ", "), r.Setup.SimArgs, r.Setup.MaxTokens, r.Setup.RunSeconds)
	fmt.Fprintf(&b, "SLO: TTFT ≤ %.0f ms. Goodput counts completed requests within it per second of the arrival window, the same for every policy, so that "+
		"equal outcomes give equal goodput; \"within SLO\" is their share of all arrivals (failures count against it). "+
		"Throughput counts completed requests per second of the span from the first arrival to the last request's end. "+
		"Cross-cluster is the share of completed requests served by a pod (the simulator's `x-inference-pod`) of another cluster than the one they entered. "+
		"Prefix-cache hits is the share of prompt tokens the simulators found cached (their usage report, `stream_options.include_usage`).\n\n", r.Setup.SLOMs)
	b.WriteString("Both pickers are deployed in every cluster: a second InferencePool over the model servers, picked by the stock EPP, sits next to fleetinfer's, " +
		"each with its own HTTPRoute host on the same gateway. The stock EPP is a pod of each cluster, run by a second local kubelet on a tainted node, since the fleet's kubelet runs " +
		"only fleetinfer's EPP image. A fleet runs one set of pickers, so only the running policy's pool selects the model servers: before each run the other pool's selector " +
		"is changed to match no pod (neither for the oracle), its pickers drop their pods and stop scraping, and a pool given its pods back is warmed through every gateway " +
		"before the run. The running pickers scrape their pods every 50 ms (GIE's default). The control planes (kube-apiserver, etcd, the LWS controller) run at " +
		"nice 10, since a real fleet gives them machines of their own: every 5 minutes each kube-apiserver rebuilds the OpenAPI v3 spec of every CRD, 1–2 s of CPU for KServe's, " +
		"in every cluster at once.\n\n")
	b.WriteString("Policies:\n\n")
	for _, p := range policies {
		fmt.Fprintf(&b, "- **%s** %s\n", p, policyNotes[p])
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, skyServeNote, r.Clusters[skyServeAt])
	b.WriteString("\nfleetinfer's EPP configuration in every cluster:\n\n```yaml\n" + r.FleetEPPConfig + "```\n\n")
	b.WriteString("Scenarios:\n\n| scenario | pods per cluster | --max-num-seqs | KV blocks per pod | arrivals per cluster | rate | prompts | repetitions |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Scenarios {
		prompts := fmt.Sprintf("%d unique tokens", s.PromptWords)
		if s.Prefixes > 0 {
			prompts = fmt.Sprintf("one of %d shared %d-token prefixes + %d unique tokens", s.Prefixes, s.PrefixWords, s.PromptWords)
		}
		if s.PrefixHome {
			prompts += ", prefix p cached in cluster p mod 3 before the run"
		}
		entry := shares(s.Entry)
		if len(s.EntryPhases) > 0 {
			var phases []string
			for _, p := range s.EntryPhases {
				phases = append(phases, shares(p))
			}
			entry = strings.Join(phases, " → ")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %.0f/s | %s | %d |\n", s.Title, join(s.Replicas), join(s.MaxNumSeqs), s.KVBlocks, entry, s.Rate, prompts, s.Reps)
	}
	fmt.Fprintf(&b, "\n"+lossNote+"\n", r.Setup.RunSeconds/2)
	b.WriteString("## Results\n\n")
	for _, s := range r.Scenarios {
		fmt.Fprintf(&b, "### %s\n\n| policy | TTFT p50 ms | TTFT p99 ms (range) | throughput req/s | goodput req/s (range) | within SLO | errors | cross-cluster | prefix-cache hits | forwarded twice | remote age p99 ms | runs | load average | send lag ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", s.Title)
		for _, m := range r.Summary {
			if m.Scenario != s.Name {
				continue
			}
			age := "–"
			if m.RemoteAgeP99Ms != nil {
				age = fmt.Sprintf("%.0f", *m.RemoteAgeP99Ms)
			}
			fmt.Fprintf(&b, "| %s | %.0f | %.0f (%.0f–%.0f) | %.1f | %.1f (%.1f–%.1f) | %.0f%% | %.1f%% | %.0f%% | %.0f%% | %d | %s | %d | %.1f | %.0f |\n", m.Policy, m.P50Ms,
				m.P99Ms, m.P99Range[0], m.P99Range[1], m.Throughput, m.Goodput, m.GoodputRange[0], m.GoodputRange[1],
				100*m.WithinSLO, 100*m.ErrorShare, 100*m.CrossShare, 100*m.CacheHit, m.ForwardedTwice, age, m.Runs, m.LoadAverage, m.SendLagMs)
		}
		b.WriteString("\n")
	}
	b.WriteString(r.splitTable())
	b.WriteString(r.cpuTable())
	if len(r.Bars) > 0 {
		b.WriteString("## The issue's bars\n\nJudged on the medians above.\n\n| scenario | bar | fleetinfer | met |\n|---|---|---|---|\n")
		for _, x := range r.Bars {
			met := "no"
			if x.Met {
				met = "**yes**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", x.Scenario, x.Bar, x.Figure, met)
		}
		b.WriteString("\n")
	}
	b.WriteString(r.reading())
	b.WriteString("![TTFT per scenario and policy](routing-ttft.svg)\n\n![requests within the SLO per second, cluster lost halfway](routing-timeline.svg)\n\n")
	b.WriteString("## Runs\n\nLoad average: the machine's 1-minute load average at the end of the run. Send lag: the longest an arrival left after its time " +
		"(the load generator short of CPU; its requests' TTFT includes it).\n\n" +
		"| scenario | policy | rep | requests | ok | errors (kinds) | p50 | p90 | p99 ms | served per cluster | wall s | load average | send lag ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Runs {
		var kinds []string
		for k, n := range x.ErrKinds {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
		sort.Strings(kinds)
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d %s | %.0f | %.0f | %.0f | %s | %.0f | %.1f | %.0f |\n", x.Scenario, x.Policy, x.Rep, x.Requests, x.OK, x.Errors,
			strings.Join(kinds, ", "), x.P50Ms, x.P90Ms, x.P99Ms, join(x.Served), x.WallS, x.LoadAverage, x.MaxSendLagMs)
	}
	return b.String()
}

// cpuTable sets, per scenario and policy, how busy the machine's cores
// were during the runs and what each part of the lab used of them.
func (r *results) cpuTable() string {
	if !slices.ContainsFunc(r.Summary, func(m summary) bool { return m.CPU != nil }) {
		return ""
	}
	var b strings.Builder
	b.WriteString("## CPU during the runs\n\nThe machine's cores busy (all of them: 100% is every core saturated) over each run, from the first arrival to the last response, " +
		"and the cores each part of the lab used on average (process CPU time from /proc over the run's wall time; medians over the runs). The bench process holds the " +
		"load generator, SkyServe's load balancer, the gateways, the kubelets and the emulated links. Only the running policy's pickers have pods to scrape (none in the oracle's runs); the others idle. " +
		"Three clusters share these cores, where a real fleet gives each its own machines: when they are saturated, every pass through a gateway or picker waits for one.\n\n" +
		"| scenario | policy | machine busy | " + strings.Join(cpuParts, " | ") + " |\n|---|---|---|" + strings.Repeat("---|", len(cpuParts)) + "\n")
	for _, m := range r.Summary {
		if m.CPU == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f%% |", m.Scenario, m.Policy, 100*m.CPU.MachineBusy)
		for _, p := range cpuParts {
			fmt.Fprintf(&b, " %.2f |", m.CPU.Cores[p])
		}
		b.WriteString("\n")
	}
	return b.String() + "\n"
}

// splitTable sets, per scenario and policy, the requests served where they
// entered beside those served across: a crossing's cost beyond its link
// shows as the difference, and the oracle, which skips every gateway and
// picker, shows what those cost.
func (r *results) splitTable() string {
	var b strings.Builder
	b.WriteString("## Served where they entered, and across\n\n" +
		"TTFT of the completed requests served in the cluster they entered and of those served in another one (medians over the runs; requests summed). " +
		"Least-load's crossings pay their link once, from the client, then one gateway and picker; fleetinfer's in Parent mode pay the link from the entry " +
		"cluster's gateway and picker to the other cluster's gateway and picker; the oracle's pay the link and no gateway or picker at all. " +
		"Each side's \"idle p50\" is the p50 of its requests that found their pod serving no other request, which is the path alone, and \"others\" " +
		"is how many other requests their pods served on average when they arrived, which is the load they met (both by the client's times, " +
		"from a request's arrival to its end, which for a request that crossed includes its link, so \"others\" counts a little high).\n\n" +
		"| scenario | policy | where entered: requests | p50 ms | p99 ms | idle p50 ms | others | across: requests | p50 ms | p99 ms | idle p50 ms | others |\n" +
		"|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	cell := func(x split) string {
		if x.Requests == 0 {
			return "0 | – | – | – | –"
		}
		idle := "–"
		if x.AtIdle > 0 {
			idle = fmt.Sprintf("%.0f", x.AtIdleP50Ms)
		}
		return fmt.Sprintf("%d | %.0f | %.0f | %s | %.2f", x.Requests, x.P50Ms, x.P99Ms, idle, x.OthersMean)
	}
	for _, m := range r.Summary {
		if m.Policy == "gie-local" {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", m.Scenario, m.Policy, cell(m.Local), cell(m.Across))
	}
	b.WriteString("\n")
	var opened, lbOpened []string
	for _, m := range r.Summary {
		if m.ConnectionsOpened != nil {
			opened = append(opened, fmt.Sprintf("%s %.0f", m.Scenario, *m.ConnectionsOpened))
		}
		if m.LBConnectionsOpened != nil {
			lbOpened = append(lbOpened, fmt.Sprintf("%s %s %.0f", m.Scenario, m.Policy, *m.LBConnectionsOpened))
		}
	}
	if len(opened) > 0 {
		fmt.Fprintf(&b, "Connections fleetinfer's gateways opened to the pickers' destinations (local pods, other clusters' gateways) during a run, "+
			"the median over the runs (`fleetinfer_gateway_upstream_connections_total{upstream=\"picked\"}`; a crossing that opens one pays its link's "+
			"round trip once more): %s.\n\n", strings.Join(opened, ", "))
	}
	if len(lbOpened) > 0 {
		fmt.Fprintf(&b, "Connections SkyServe's load balancer opened to the gateways during a run, the median over the runs (it closes one idle for "+
			"%s, httpx's keepalive_expiry, and keeps at most %d idle per gateway; each crosses a link from east but to east's own gateway): %s.\n\n",
			httpxLimits.keepaliveExpiry, httpxLimits.maxIdle, strings.Join(lbOpened, ", "))
	}
	return b.String()
}

// reading explains the figures: the mechanisms behind them, with this
// run's numbers, for the scenarios that ran with fleetinfer.
func (r *results) reading() string {
	get := func(sc, pol string) summary {
		for _, m := range r.Summary {
			if m.Scenario == sc && m.Policy == pol {
				return m
			}
		}
		return summary{}
	}
	ran := func(scenarios ...string) bool {
		for _, sc := range scenarios {
			if get(sc, "fleetinfer").Scenario == "" {
				return false
			}
		}
		return true
	}
	var b strings.Builder
	b.WriteString("## Reading the results\n\n")
	if ran("hot-cluster") {
		r.readHotCluster(&b, get)
	}
	if ran("hot-cluster", "hot-cluster-flat") {
		r.readFlat(&b, get)
	}
	if ran("moving-hotspot", "slowing-link") {
		r.readMoving(&b, get)
	}
	if ran("prefix-heavy", "prefix-remote") {
		r.readPrefixes(&b, get)
	}
	if ran("cluster-lost") {
		r.readLost(&b, get)
	}
	b.WriteString("**Noise.** This machine has 2 cores and other work ran beside the benchmark (load averages and the load generator's send lag " +
		"are in the tables): a run whose send lag reaches hundreds of milliseconds had everything on the machine stalled for about as long, " +
		"which shows as a TTFT tail whatever the policy. The ranges show how far repetitions differ.\n\n")
	return b.String()
}

func (*results) readHotCluster(b *strings.Builder, get func(sc, pol string) summary) {
	hotF, hotRR, hotLL, hotO := get("hot-cluster", "fleetinfer"), get("hot-cluster", "round-robin"), get("hot-cluster", "least-load"), get("hot-cluster", "oracle")
	fmt.Fprintf(b, "**Hot cluster.** fleetinfer's pickers send a request to another cluster only when a pod there is expected to answer sooner, "+
		"round trip included: %.0f%% of its requests crossed (round-robin %.0f%%, least-load %.0f%%, oracle %.0f%%), p99 %.0f ms against %.0f (round-robin), "+
		"%.0f (least-load) and %.0f (oracle). Every crossing pays its link's round trip (19–34 ms here) on top of an extra gateway and picker. "+
		"Where the time goes (the table above): requests served where they entered took p50 %.0f ms under fleetinfer, %.0f under least-load and %.0f "+
		"under the oracle, which passes no gateway or picker; requests served across took p50 %.0f ms (p99 %.0f) under fleetinfer against %.0f (p99 %.0f) "+
		"under least-load, whose crossings pass one gateway and picker, and %.0f (p99 %.0f) under the oracle.",
		100*hotF.CrossShare, 100*hotRR.CrossShare, 100*hotLL.CrossShare, 100*hotO.CrossShare, hotF.P99Ms, hotRR.P99Ms, hotLL.P99Ms, hotO.P99Ms,
		hotF.Local.P50Ms, hotLL.Local.P50Ms, hotO.Local.P50Ms, hotF.Across.P50Ms, hotF.Across.P99Ms, hotLL.Across.P50Ms, hotLL.Across.P99Ms,
		hotO.Across.P50Ms, hotO.Across.P99Ms)
	if hotF.CPU != nil && hotLL.CPU != nil {
		fmt.Fprintf(b, " The machine's cores were %.0f%% busy over fleetinfer's runs and %.0f%% over least-load's; fleetinfer's pickers used %.2f cores "+
			"in its runs, the stock pickers %.2f in least-load's (CPU table above).", 100*hotF.CPU.MachineBusy, 100*hotLL.CPU.MachineBusy,
			hotF.CPU.Cores[partFleetPickers], hotLL.CPU.Cores[partStockPickers])
	}
	b.WriteString("\n\n")
}

func (*results) readFlat(b *strings.Builder, get func(sc, pol string) summary) {
	f, fl, ll, o := get("hot-cluster", "fleetinfer"), get("hot-cluster-flat", "fleetinfer"), get("hot-cluster-flat", "least-load"), get("hot-cluster-flat", "oracle")
	fmt.Fprintf(b, "**Flat pod networks.** With the same arrivals on flat pod networks, where fleetinfer's entry gateway sends a crossing request "+
		"straight to the remote pod (Endpoint mode), fleetinfer's p99 is %.0f ms (%.0f%% crossed) against least-load's %.0f and the oracle's %.0f; "+
		"through the other cluster's gateway and picker (Parent mode, hot-cluster) it was %.0f ms.\n\n",
		fl.P99Ms, 100*fl.CrossShare, ll.P99Ms, o.P99Ms, f.P99Ms)
}

func (*results) readMoving(b *strings.Builder, get func(sc, pol string) summary) {
	mvF, mvLL := get("moving-hotspot", "fleetinfer"), get("moving-hotspot", "least-load")
	slF, slLL := get("slowing-link", "fleetinfer"), get("slowing-link", "least-load")
	fmt.Fprintf(b, "**Moving hot spot and slowing link.** Goodput at the SLO: fleetinfer %.1f and %.1f req/s, least-load %.1f and %.1f. "+
		"fleetinfer's estimate reads each pod's load as its picker's peers publish it (every 50 ms) and each link's round trip as its federation pings "+
		"measure it (every 500 ms, each moving the estimate halfway), so a hot spot that moves and a link that slows change where requests cross within "+
		"about a second; SkyServe's least-load counts its own requests per cluster and knows nothing of links.\n\n",
		mvF.Goodput, slF.Goodput, mvLL.Goodput, slLL.Goodput)
}

func (*results) readPrefixes(b *strings.Builder, get func(sc, pol string) summary) {
	pl, pf, po := get("prefix-heavy", "gie-local"), get("prefix-heavy", "fleetinfer"), get("prefix-heavy", "oracle")
	rf, ro := get("prefix-remote", "fleetinfer"), get("prefix-remote", "oracle")
	fmt.Fprintf(b, "**Prefixes.** Share of prompt tokens found in the simulators' caches: prefix-heavy %.0f%% under cluster-local GIE, %.0f%% under "+
		"fleetinfer, %.0f%% under the oracle; prefix-remote %.0f%% under fleetinfer, %.0f%% under the oracle. The oracle knows where every prefix is cached. "+
		"fleetinfer's pickers know where they sent each prompt (their record of their own pods) and what their peers publish of theirs (a 1 KiB "+
		"Bloom filter per pod, at most a second old; epp/prefixes), and the estimate weighs the prefill a pod that holds the prefix saves against "+
		"the round trip to it. Federation traffic from one picker to one peer, pod state and summaries together: %s KiB/s in prefix-heavy, %s in prefix-remote "+
		"(medians of the runs).\n\n",
		100*pl.CacheHit, 100*pf.CacheHit, 100*po.CacheHit, 100*rf.CacheHit, 100*ro.CacheHit, kibps(pf), kibps(rf))
}

// kibps formats a summary's federation traffic, "–" without a figure.
func kibps(s summary) string {
	if s.FederationKiBps == nil {
		return "–"
	}
	return fmt.Sprintf("%.1f", *s.FederationKiBps)
}

func (*results) readLost(b *strings.Builder, get func(sc, pol string) summary) {
	lostLL, lostRR, lostF := get("cluster-lost", "least-load"), get("cluster-lost", "round-robin"), get("cluster-lost", "fleetinfer")
	fmt.Fprintf(b, "**Cluster lost.** The pickers of the clusters that remain drop the lost cluster's pods when its picker's stream breaks, so fleetinfer "+
		"loses only the requests in flight there (%.1f%% of its requests failed). SkyServe keeps the lost gateway in its ready set until the next sync; "+
		"a connection to it is refused at once, so under `LeastLoadPolicy` it always has the least load and attracts every request, each tried three "+
		"times over 2.6 s before failing (%.0f%% failed), while round-robin fails only the attempts whose turn it is (%.0f%%).\n\n",
		100*lostF.ErrorShare, 100*lostLL.ErrorShare, 100*lostRR.ErrorShare)
}

const skyServeNote = "SkyServe, as read in skypilot-org/skypilot `sky/serve/load_balancing_policies.py` (`LeastLoadPolicy`, registered with `default=True`; " +
	"`RoundRobinPolicy`) and `sky/serve/load_balancer.py` / `constants.py`: the load balancer is the one entry every request passes, a process in one region " +
	"(the serve controller's; here %s's, where most of the hot scenarios' requests enter), so a request entering elsewhere travels there and back on top of any " +
	"link from there to the gateway picked. It is an HTTP proxy (a FastAPI app forwarding with httpx and streaming the response back): every request and every " +
	"streamed chunk passes it on top of the gateway and picker of the cluster picked. Here that pass is a Go reverse proxy in the benchmark's process, which " +
	"costs less CPU than SkyServe's Python one: a lower bound of it. Its connections to the gateways are kept as SkyServe's are: the load balancer holds an " +
	"`httpx.AsyncClient(base_url=replica_url)` per replica, with httpx's default limits (100 connections, 20 kept idle, an idle one closed after 5 s), so a " +
	"connection opened after a quiet 5 s pays a handshake over the link, as one of fleetinfer's gateways does after 2 minutes. SkyServe's `external_load_balancers` (one per region behind geo DNS) would spare that trip, each balancing by its own " +
	"count of what it sent, blind to the others'; the single load balancer, SkyServe's default, is what runs here. `LeastLoadPolicy` keeps `load_map`, " +
	"the requests in flight per replica as the load balancer counts them itself (`pre_execute_hook` +1 on dispatch, `post_execute_hook` −1 when the proxied stream ends), " +
	"and picks `min(ready_replicas, key=load)`; the ready replicas come from the controller every `LB_CONTROLLER_SYNC_INTERVAL_SECONDS` = 20 s; a request is tried up to " +
	"`LB_MAX_RETRY` = 3 times on connection errors, with a backoff from 1 s. A replica here is a whole cluster (its gateway and its own EPP). So SkyServe's load signal is " +
	"never stale (it is its own count, refreshed on every request) but blind to work it did not send and to capacity; what is periodic is the ready set, refreshed every 20 s as " +
	"SkyServe does (its readiness here: the gateway's `/readyz`). llm-d's alpha multi-cluster plugins instead scrape peer EPPs' pool averages every 5 s; that scheme is not " +
	"what SkyServe does and is not run here.\n"

const lossNote = "Cluster lost: at the middle of each run every process of central's pods (model servers, both pickers) gets SIGKILL, its Deployment is scaled to zero and " +
	"its gateway stops; each policy runs on a fresh deployment. Requests in flight there fail. From then on arrivals that would enter central enter east and west instead " +
	"(a global load balancer or DNS health check in front of the gateways is assumed to steer them at once: a slower one would fail them for (a) and (d) until it reacts). " +
	"SkyServe's load balancer syncs its ready set at the run's start and every 20 s after, so it keeps central for the remaining %.0f s of the run, " +
	"close to the 10 s a 20 s period costs on average.\n"

func join[T any](v []T) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, "/")
}

func shares(v []float64) string {
	total := 0.0
	for _, x := range v {
		total += x
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.0f%%", 100*x/total)
	}
	return strings.Join(s, "/")
}

// writeRequests writes one run's requests to path, a JSON object a line,
// times in milliseconds.
func writeRequests(path string, out []result) error {
	var b bytes.Buffer
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for _, r := range out {
		line, err := json.Marshal(map[string]any{"at_ms": ms(r.At), "entry": r.Entry, "prefix": r.Prefix, "served": r.Served, "pod": r.Pod,
			"ttft_ms": ms(r.TTFT), "total_ms": ms(r.Total), "tokens": r.Tokens, "prompt_tokens": r.PromptTokens,
			"cached_tokens": r.CachedTokens, "attempts": r.Attempts, "err": r.Err, "send_lag_ms": ms(r.SendLag)})
		if err != nil {
			return err
		}
		b.Write(append(line, '\n'))
	}
	// The first run's requests come before any results are written.
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
