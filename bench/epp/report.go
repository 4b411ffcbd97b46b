package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fleetinfer/fleetinfer/bench/internal/host"
	"github.com/fleetinfer/fleetinfer/internal/stats"
)

type results struct {
	Config config `json:"-"`
	host.Run
	Setup   setup       `json:"setup"`
	Runs    []runResult `json:"runs"`
	Summary []summary   `json:"summary"`
	Ratios  []ratio     `json:"ratios"`
}

type setup struct {
	Repetitions  int    `json:"repetitions"`
	LocalPods    int    `json:"local_pods"`
	Peers        int    `json:"peers"`
	PodsPerPeer  int    `json:"pods_per_peer"`
	FederatedAll int    `json:"federated_pods"`
	Sequential   int    `json:"sequential_picks"`
	Concurrent   string `json:"concurrent"`
	Notes        string `json:"notes"`
}

// summary is the median over repetitions of one EPP, scenario and load.
type summary struct {
	EPP, Scenario, Load string
	P50Ms, P99Ms        float64
	PerSec              float64
	RemoteShare         float64
	CPUPerPickUs        float64
	IdleCPU             float64
	AgeP50Ms, AgeP99Ms  float64
	BytesPerPeerS       float64
}

// ratio compares fleetinfer with stock in one phase: each repetition's
// ratio (both EPPs measured in the same repetition, slice by slice), then
// their median and range, so that a repetition spoiled by the machine's
// other work spoils both of its EPPs rather than one side of a median.
type ratio struct {
	Scenario, Load string
	// P99, P50, PerSec and CPUPerPick are medians over repetitions of
	// fleetinfer's over stock's.
	P99, P50, PerSec, CPUPerPick float64
	P99Min, P99Max               float64
	P99PerRep                    []float64
}

func (r *results) summarize() {
	c := r.Config
	r.Setup = setup{Repetitions: c.reps, LocalPods: c.local, Peers: c.peers, PodsPerPeer: c.perPeer, FederatedAll: c.local + c.peers*c.perPeer,
		Sequential: c.seq, Concurrent: fmt.Sprintf("%d picks over %d pickers", c.concPicks, c.conc),
		Notes: "Local pods are stand-ins on loopback pod addresses scraped by both EPPs (running side by side) every 50 ms (GIE's default); " +
			"each serves the metrics page of a real llm-d-inference-sim run at the start (gauges, counters and histograms, about 18 KB) " +
			"with the phase's load gauges; " +
			"peers are real fleetinfer federation servers (mTLS) in the benchmark process publishing synthetic pod state " +
			"(every pod re-scraped each 50 ms, a tenth of them changing each time). 'headroom': local pods report empty queues; " +
			"'saturated': they report 10 waiting requests, so fleetinfer's estimate (10 waiting behind 4 running: over a second at the default 10/s) sends requests to " +
			"remote pods, expected sooner by far more than the margin (their round trip is the loopback's): its candidates are the 16 remote pods expected " +
			fmt.Sprintf("soonest (maxRemoteCandidates, chosen from the %d in its federated view; about a quarter of the remote pods have no queue, so the 16 are alike, within the margin of the soonest), where stock GIE scores all %d local pods. ", c.peers*c.perPeer, c.local) +
			"fleetinfer runs its default configuration with prefillPerToken set, so every pick hashes its prompt into blocks, matches them " +
			"against its record of the local pods and the summaries of remote ones, and records them (epp/prefixes)."}
	type key struct{ epp, scenario, load string }
	groups := map[key][]runResult{}
	var order []key
	for _, run := range r.Runs {
		k := key{run.EPP, run.Scenario, run.Load}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], run)
	}
	byKey := map[key]summary{}
	for _, k := range order {
		var p50, p99, ps, share, a50, a99, bps, cpu, idle []float64
		for _, run := range groups[k] {
			cpu, idle = append(cpu, run.CPUPerPickUs), append(idle, run.IdleCPU)
			p50, p99, ps = append(p50, run.P50Ms), append(p99, run.P99Ms), append(ps, run.PerSec)
			share = append(share, float64(run.Remote)/float64(max(run.Picks, 1)))
			if run.LagSamples > 0 {
				a50, a99 = append(a50, run.LagP50Ms), append(a99, run.LagP99Ms)
			}
			var per []float64
			for _, v := range run.BytesPerPeerS {
				per = append(per, v)
			}
			if len(per) > 0 {
				bps = append(bps, stats.Median(per))
			}
		}
		s := summary{EPP: k.epp, Scenario: k.scenario, Load: k.load, P50Ms: stats.Median(p50), P99Ms: stats.Median(p99), PerSec: stats.Median(ps),
			RemoteShare: stats.Median(share), CPUPerPickUs: stats.Median(cpu), IdleCPU: stats.Median(idle), AgeP50Ms: stats.Median(a50), AgeP99Ms: stats.Median(a99), BytesPerPeerS: stats.Median(bps)}
		byKey[k] = s
		r.Summary = append(r.Summary, s)
	}
	type repKey struct {
		rep                 int
		epp, scenario, load string
	}
	byRep := map[repKey]runResult{}
	for _, run := range r.Runs {
		byRep[repKey{run.Rep, run.EPP, run.Scenario, run.Load}] = run
	}
	for _, k := range order {
		if k.epp != "fleetinfer" {
			continue
		}
		q := ratio{Scenario: k.scenario, Load: k.load}
		var p50, ps, cpu []float64
		for _, f := range groups[k] {
			s, ok := byRep[repKey{f.Rep, "gie-stock", k.scenario, k.load}]
			if !ok || s.P99Ms == 0 || s.P50Ms == 0 || s.PerSec == 0 || s.CPUPerPickUs == 0 {
				continue
			}
			q.P99PerRep = append(q.P99PerRep, f.P99Ms/s.P99Ms)
			p50, ps, cpu = append(p50, f.P50Ms/s.P50Ms), append(ps, f.PerSec/s.PerSec), append(cpu, f.CPUPerPickUs/s.CPUPerPickUs)
		}
		if len(q.P99PerRep) == 0 {
			continue
		}
		q.P99, q.P50, q.PerSec, q.CPUPerPick = stats.Median(q.P99PerRep), stats.Median(p50), stats.Median(ps), stats.Median(cpu)
		q.P99Min, q.P99Max = slices.Min(q.P99PerRep), slices.Max(q.P99PerRep)
		r.Ratios = append(r.Ratios, q)
	}
}

// loadAverages returns the lowest, median and highest 1-minute load average
// at the start of the phases.
func (r *results) loadAverages() (lo, med, hi float64) {
	var l []float64
	for _, run := range r.Runs {
		l = append(l, run.LoadAverage)
	}
	if len(l) == 0 {
		return 0, 0, 0
	}
	return slices.Min(l), stats.Median(l), slices.Max(l)
}

func (r *results) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "epp.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "epp-latency.svg"), []byte(r.latencySVG()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "epp-freshness.svg"), []byte(r.freshnessSVG()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "epp.md"), []byte(r.markdown()), 0o644)
}

func (r *results) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# EPP benchmark: fleetinfer (federated view of %d pods) vs GIE v1.5.0 stock (%d local pods)\n\n",
		r.Setup.FederatedAll, r.Setup.LocalPods)
	fmt.Fprintf(&b, "Written by `make bench-epp` (`go run ./bench/epp`) on %s, %s, in %s. %d repetitions, each starting both EPPs afresh. Both EPPs run side by side throughout a repetition and take turns in %d slices of every phase (who goes first alternating), so that both see the same background load; only one is picked from at a time. Figures per EPP are medians over repetitions; ratios are each repetition's fleetinfer/stock ratio, then their median (and range).\n\n",
		r.Machine, r.Started, r.Duration, r.Setup.Repetitions, chunks)
	lo, med, hi := r.loadAverages()
	fmt.Fprintf(&b, "The machine is shared: its 1-minute load average was %.1f at the start and %.1f at the end, and %.1f–%.1f (median %.1f) at the start of the phases, on 2 cores. Other work inflates tails, unevenly from one repetition to the next; the ratios within a repetition are the robust figures.\n\n",
		r.LoadAverage[0], r.LoadAverage[1], lo, hi, med)
	fmt.Fprintf(&b, "Setup: %d local pods; fleetinfer also federates with %d peers × %d pods. %d sequential picks, then %s, per phase. %s\n\n",
		r.Setup.LocalPods, r.Setup.Peers, r.Setup.PodsPerPeer, r.Setup.Sequential, r.Setup.Concurrent, r.Setup.Notes)
	b.WriteString("Pick latency is from sending the request headers to receiving their answer on one ext-proc stream (what Envoy waits), " +
		"over the local gateway's Envoy-faithful ext-proc client.\n\n")
	b.WriteString("EPP CPU is the EPP process's CPU time per pick over the phase (it includes scraping and, for fleetinfer, the federation streams); " +
		"idle CPU is its share of one core with no picks.\n\n")
	b.WriteString("## Pick latency and throughput\n\n| EPP | local pods | load | p50 ms | p99 ms | picks/s | remote picks | EPP CPU µs/pick | idle CPU |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.Summary {
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %.2f | %.0f | %.0f%% | %.0f | %.0f%% |\n",
			s.EPP, s.Scenario, s.Load, s.P50Ms, s.P99Ms, s.PerSec, 100*s.RemoteShare, s.CPUPerPickUs, s.IdleCPU)
	}
	b.WriteString("\n## fleetinfer / stock\n\nTarget: p99 at most 1.1× stock's. Medians of the repetitions' ratios; the p99 ratio's range over repetitions in brackets.\n\n" +
		"| local pods | load | p99 ratio | p50 ratio | picks/s ratio | EPP CPU/pick ratio | p99 target |\n|---|---|---|---|---|---|---|\n")
	for _, q := range r.Ratios {
		verdict := "met"
		if q.P99 > 1.1 {
			verdict = "missed"
		}
		fmt.Fprintf(&b, "| %s | %s | %.2f (%.2f–%.2f) | %.2f | %.2f | %.2f | %s |\n", q.Scenario, q.Load, q.P99, q.P99Min, q.P99Max, q.P50, q.PerSec, q.CPUPerPick, verdict)
	}
	b.WriteString("\n## Federation freshness and traffic (fleetinfer)\n\n" +
		"Age of remote data at pick time: for each pick that considers remote pods, the stalest of each peer's pods in the federated view, from the peer's scrape to the pick " +
		"(histogram `fleetinfer_epp_federation_lag_seconds`, quantiles interpolated within its buckets: 5, 10, 20, 30, 50, 75, 100, 125, 150, 200, 250, 300 ms, ...). " +
		"Only the saturated phase considers remote pods (a headroom phase does only if local scrapes fall behind). " +
		"Bytes per second per peer: federation payload received from each peer (`fleetinfer_epp_federation_bytes_total`), median over peers. Target: p99 age under 250 ms.\n\n" +
		"| local pods | load | age p50 ms | age p99 ms | bytes/s per peer |\n|---|---|---|---|---|\n")
	for _, s := range r.Summary {
		if s.EPP != "fleetinfer" {
			continue
		}
		if s.Scenario == "saturated" {
			fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %.0f |\n", s.Scenario, s.Load, s.AgeP50Ms, s.AgeP99Ms, s.BytesPerPeerS)
		} else {
			fmt.Fprintf(&b, "| %s | %s | (no remote candidates) | | %.0f |\n", s.Scenario, s.Load, s.BytesPerPeerS)
		}
	}
	b.WriteString(whereTimeGoes(r.Config))
	b.WriteString("\n![pick latency](epp-latency.svg)\n\n![federation freshness](epp-freshness.svg)\n")
	return b.String()
}

// latencySVG draws p50 and p99 bars per phase for both EPPs.
func (r *results) latencySVG() string {
	const w, h, left, bottom, top = 760, 340, 60, 60, 40
	maxV := 0.0
	for _, s := range r.Summary {
		maxV = max(maxV, s.P99Ms)
	}
	if maxV == 0 {
		maxV = 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">Pick latency, ms (p50 solid, p99 light): GIE stock vs fleetinfer</text>`+"\n", left)
	plotH := float64(h - bottom - top)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, h-bottom, w-10, h-bottom)
	for i := 0; i <= 4; i++ {
		v := maxV * float64(i) / 4
		y := float64(h-bottom) - plotH*float64(i)/4
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%.1f</text><line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#ddd"/>`+"\n", left-5, y+4, v, left, y, w-10, y)
	}
	slot := float64(w-left-20) / float64(max(len(r.Summary), 1))
	for i, s := range r.Summary {
		x := float64(left) + slot*float64(i) + slot*0.15
		color := "#4878a8"
		if s.EPP == "fleetinfer" {
			color = "#d0703c"
		}
		for _, bar := range []struct {
			v   float64
			op  string
			off float64
		}{{s.P99Ms, "0.35", 0}, {s.P50Ms, "1", slot * 0.2}} {
			bh := plotH * bar.v / maxV
			fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="%s" fill-opacity="%s"/>`+"\n",
				x+bar.off, float64(h-bottom)-bh, slot*0.5, bh, color, bar.op)
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">%s</text><text x="%.0f" y="%d" text-anchor="middle">%s %s</text>`+"\n",
			x+slot*0.35, h-bottom+15, s.EPP, x+slot*0.35, h-bottom+29, s.Scenario, s.Load[:3])
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// freshnessSVG draws, per repetition of the saturated phases, the p50 and
// p99 age of remote data at pick time against the 250 ms target.
func (r *results) freshnessSVG() string {
	const w, h, left, bottom, top, target = 760, 300, 60, 50, 40, 250.0
	var runs []runResult
	for _, run := range r.Runs {
		if run.EPP == "fleetinfer" && run.Scenario == "saturated" {
			runs = append(runs, run)
		}
	}
	maxV := target * 1.2
	for _, run := range runs {
		maxV = max(maxV, run.LagP99Ms)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14">Age of remote data at pick time, ms (p50 solid, p99 light; dashed: 250 ms target)</text>`+"\n", left)
	plotH := float64(h - bottom - top)
	y := func(v float64) float64 { return float64(h-bottom) - plotH*v/maxV }
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, h-bottom, w-10, h-bottom)
	for _, v := range []float64{0, 100, 200, 300, 400, 500} {
		if v > maxV {
			break
		}
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%.0f</text><line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#ddd"/>`+"\n", left-5, y(v)+4, v, left, y(v), w-10, y(v))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#c00" stroke-dasharray="6 4"/>`+"\n", left, y(target), w-10, y(target))
	slot := float64(w-left-20) / float64(max(len(runs), 1))
	for i, run := range runs {
		x := float64(left) + slot*float64(i) + slot*0.2
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="#d0703c" fill-opacity="0.35"/>`+"\n", x, y(run.LagP99Ms), slot*0.6, float64(h-bottom)-y(run.LagP99Ms))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="#d0703c"/>`+"\n", x+slot*0.15, y(run.LagP50Ms), slot*0.3, float64(h-bottom)-y(run.LagP50Ms))
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">rep %d %s</text>`+"\n", x+slot*0.3, h-bottom+15, run.Rep+1, run.Load[:3])
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// whereTimeGoes explains the ratios from profiles of both EPPs under this
// benchmark's load and from the in-process BenchmarkPick (epp-analysis.md).
func whereTimeGoes(c config) string {
	return "\n## Where the time goes\n\n" +
		"Profiles of both EPPs under this benchmark's load (`go run ./bench/epp -profile DIR`: perf for CPU, GIE's pprof for allocations) " +
		"and `go test ./epp -run '^$' -bench BenchmarkPick` (both wirings in process, without scraping or sockets) are in [epp-analysis.md](epp-analysis.md), " +
		"taken with 100 local pods whose page held five gauges. In short:\n\n" +
		"- *Scrapes*: both EPPs scrape every local pod every 50 ms. fleetinfer's scrape parser leaves the page's histograms out (epp/plugins/metricsource), " +
		"most of a model server's page, so its scrapes cost a fraction of stock's: compare their idle CPU above.\n" +
		"- *Headroom* (no spill): fleetinfer's pick allocates what stock's does (BenchmarkPick, with this benchmark's prompt and prefillPerToken: within 2% " +
		"of the bytes and objects) and costs about 1.2× its CPU: the spill estimate over the local pods and the remote ones within reach, and the prefix record. " +
		fmt.Sprintf("Besides, fleetinfer follows %d peers' streams (about %d messages a second here), which competes with picks for the 2 cores.\n", c.peers, c.peers*int(time.Second/peerInterval)) +
		fmt.Sprintf("- *Saturated* (spill): a spilled pick hands GIE the 16 remote pods expected soonest, where stock GIE copies and scores all %d saturated ", c.local) +
		fmt.Sprintf("local pods. Choosing the 16 remote pods from %d takes microseconds of CPU (BenchmarkRemote in epp/spill).\n", c.peers*c.perPeer)
}
