// Command routing is the routing benchmark of `make bench-routing`: on a
// local fleet of three clusters whose model servers are simulators with a
// latency model, it runs each scenario once per routing policy on the same
// arrivals and reports, per scenario and policy, TTFT measured by the client
// from the SSE stream, throughput, goodput within a TTFT SLO, and the share
// of requests served in another cluster than the one they entered.
//
// Policies:
//
//	gie-local    GIE v1.5.0's stock EPP in each cluster, no federation: a request is served where it enters.
//	round-robin  SkyServe's load balancer with RoundRobinPolicy over the clusters' gateways; each cluster's stock EPP picks.
//	least-load   SkyServe's load balancer with LeastLoadPolicy (its default) over the gateways; each stock EPP picks.
//	fleetinfer   fleetinfer's federated EPP in each cluster (Parent mode; Endpoint mode on flat pod networks): a request crosses when a remote pod is expected sooner.
//	oracle       exact requests in flight per pod, the links' round trips and where each prefix is cached, known in this process at once.
//
// Both pickers are deployed in every cluster (a second InferencePool over
// the same pods for the stock EPP), but only the running policy's pool
// selects the pods, as a fleet runs one set of pickers (usePool); each run
// reports the CPU each part of the lab used (cpu.go). See
// bench/results/routing.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fleetinfer/fleetinfer/bench/internal/host"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

type config struct {
	out, stock  string
	fleetConfig string
	policies    []string
	duration    time.Duration
	reps        int
	maxTokens   int
	slo         time.Duration
	only        string
	maxInFlight int
	// requests: write every run's requests next to the results.
	requests bool
	// fleetArgs are extra flags for fleetinfer's pickers; fleetDir keeps
	// the fleet's state and logs (empty: a temporary directory).
	fleetArgs []string
	fleetDir  string
}

func main() {
	var c config
	flag.StringVar(&c.out, "out", "bench/results", "directory for routing.json, routing.md and the SVG plots")
	flag.StringVar(&c.stock, "stock-epp", "bin/gie-epp", "GIE v1.5.0's stock EPP binary (sigs.k8s.io/gateway-api-inference-extension/cmd/epp)")
	flag.DurationVar(&c.duration, "duration", 16*time.Second, "arrivals per run (one scenario, one policy)")
	flag.IntVar(&c.reps, "reps", 0, "repetitions of every run, instead of each scenario's own (results are medians)")
	flag.IntVar(&c.maxTokens, "max-tokens", 16, "tokens per completion (ignore_eos)")
	flag.DurationVar(&c.slo, "slo", time.Second, "TTFT objective for goodput")
	flag.StringVar(&c.only, "scenario", "", "run only these scenarios, comma-separated")
	pols := flag.String("policies", strings.Join(policies, ","), "policies to run, comma-separated")
	configFile := flag.String("fleetinfer-config", "", "EndpointPickerConfig file for fleetinfer's EPPs instead of the built-in one")
	flag.IntVar(&c.maxInFlight, "max-in-flight", 512, "client bound on requests in flight")
	flag.BoolVar(&c.requests, "requests", false, "also write each run's requests, one JSON object a line, to requests-SCENARIO-POLICY-REP.jsonl in -out")
	fleetArgs := flag.String("fleetinfer-args", "", "extra flags for fleetinfer's EPPs, space-separated (--v=4 logs each request's spill estimate)")
	flag.StringVar(&c.fleetDir, "fleet-dir", "", "put the fleet's state and logs in this directory instead of a temporary one, and keep them (a pod's own log goes with the pod, at its scenario's end)")
	flag.Parse()
	c.policies = strings.Split(*pols, ",")
	c.fleetArgs = strings.Fields(*fleetArgs)
	c.fleetConfig = fleetEPPConfig
	if *configFile != "" {
		b, err := os.ReadFile(*configFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		c.fleetConfig = string(b)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// The clusters are the fleet's default spokes (east, west, central) without
// their own simulator flags: every scenario sets its pods' capacity. They
// sit apart, on the default matrix's links (round trips of 31, 34 and 19 ms
// between Washington DC, Dallas and Toronto), with isolated pod networks:
// fleetinfer's pickers reach other clusters' pods in Parent mode, through
// their gateways. Where prompts are unique the KV cache is sized as a real
// server's bounds its batch: four 128-token prompts (8 blocks each) fill 32
// of its 36 blocks (89%), so a full batch shows in vllm:kv_cache_usage_perc,
// the signal GIE's and fleetinfer's pickers read besides the queue. With
// vLLM-sized caches (1,024 blocks) a full batch of these short prompts
// would read 3%, and only a queue would tell a busy pod from an idle one.
// In the prefix scenarios a pod's 400 blocks hold a full batch (212 blocks)
// and about 4 of the 12 prefixes (50 blocks each): the fleet's six pods can
// keep all 12, a cluster's two about 8, and a pod that sees every prefix a
// third of them.
//
// hot-cluster runs 5 repetitions, the others 3: its bars sit within the
// spread of a policy's p99 from one run to the next on a shared 2-core
// machine, and with 5 every one of the 5 policies starts a repetition once.
var scenarios = []scenario{
	{Name: "hot-cluster", Title: "hot cluster: 70% of arrivals enter east, 3 equal clusters", Reps: 5,
		Replicas: []int32{2, 2, 2}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 36, Entry: []float64{0.7, 0.15, 0.15}, Rate: 18, PromptWords: 128, Lost: -1},
	{Name: "hot-cluster-flat", Title: "hot cluster on flat pod networks: fleetinfer in Endpoint mode, the entry gateway sends a crossing straight to the remote pod", Reps: 3,
		Replicas: []int32{2, 2, 2}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 36, Entry: []float64{0.7, 0.15, 0.15}, Rate: 18, PromptWords: 128, Lost: -1, Flat: true},
	{Name: "moving-hotspot", Title: "moving hot spot: 70% of arrivals enter east, then west, then central, a third of the run each", Reps: 3,
		Replicas: []int32{2, 2, 2}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 36, Entry: []float64{1, 1, 1},
		EntryPhases: [][]float64{{0.7, 0.15, 0.15}, {0.15, 0.7, 0.15}, {0.15, 0.15, 0.7}}, Rate: 18, PromptWords: 128, Lost: -1},
	{Name: "slowing-link", Title: "slowing link: hot east, its link to west goes from 30 to 150 ms halfway", Reps: 3,
		Replicas: []int32{2, 2, 2}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 36, Entry: []float64{0.7, 0.15, 0.15}, Rate: 18, PromptWords: 128, Lost: -1,
		SlowLink: &slowLink{A: 0, B: 1, From: 30 * time.Millisecond, To: 150 * time.Millisecond}},
	{Name: "prefix-heavy", Reps: 3, Title: "prefix-heavy: 12 shared 800-token prefixes, arrivals even",
		Replicas: []int32{2, 2, 2}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 400, Entry: []float64{1, 1, 1}, Rate: 14,
		Prefixes: 12, PrefixWords: 800, PromptWords: 50, Lost: -1},
	{Name: "prefix-remote", Reps: 3, Title: "prefix-remote: 12 shared 800-token prefixes, each cached in one cluster before the run, arrivals even",
		Replicas: []int32{2, 2, 2}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 400, Entry: []float64{1, 1, 1}, Rate: 14,
		Prefixes: 12, PrefixWords: 800, PromptWords: 50, PrefixHome: true, Lost: -1},
	{Name: "unequal-capacity", Reps: 3, Title: "unequal capacity: 4/2/1 pods, arrivals even",
		Replicas: []int32{4, 2, 1}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 36, Entry: []float64{1, 1, 1}, Rate: 20, PromptWords: 128, Lost: -1},
	{Name: "cluster-lost", Reps: 3, Title: "cluster lost: central's pods, pickers and gateway killed halfway, arrivals even",
		Replicas: []int32{2, 2, 2}, MaxNumSeqs: []int{4, 4, 4}, KVBlocks: 36, Entry: []float64{1, 1, 1}, Rate: 16, PromptWords: 128, Lost: 2},
}

var policies = []string{"gie-local", "round-robin", "least-load", "fleetinfer", "oracle"}

// fleetEPPConfig is fleetinfer's default configuration (epp/default-config.yaml)
// with GIE's in-flight counting, and the spill policy's caps and staleness
// set for this workload:
//   - the estimate decides the crossing (see epp/spill): the default
//     service rate, 10 requests/s per pod, is what these simulators serve
//     with a full batch (4 slots, about 400 ms a request) until the picker
//     has measured it, and the default margin is 20 ms; the default
//     running cost, half a slot's turn per request running below a full
//     batch, is twice these simulators' share of a step (each request
//     running adds a third of an idle pod's time to first token, about
//     24 ms at 128 prompt words, to a turn of about 100 ms): once for the
//     new request's first token and once for those it slows after it;
//   - a remote pod with a request waiting (queueDepthThreshold 1) or a KV
//     cache over 80% full is no candidate: with 4-slot simulators a queue
//     means a full batch. Local metrics count as fresh for a second (a
//     50 ms scrape runs late on a busy machine);
//   - GIE's inflight-load-producer counts the picker's own requests in
//     flight per pod, and fleetinfer's in-flight-requests-scorer spreads
//     picks by that count between scrapes (epp/plugins/inflight);
//   - prefillPerToken is the simulators' prefill time per token as the
//     picker counts tokens, as an operator sets their model's: the picker
//     assumes 4 characters a token, the simulators count a word (7
//     characters here, see words) as one, so their 400 µs a token is
//     400 × 4/7 ≈ 230 µs a picker's token. The estimate then weighs a
//     prompt's prefix cached in another cluster (the pickers' published
//     prefix summaries, epp/prefixes) against the round trip.
const fleetEPPConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: cross-cluster-filter
  parameters: {queueDepthThreshold: 1, kvCacheUtilThreshold: 0.8, metricsStalenessThreshold: 1s, prefillPerToken: 230us}
- type: cross-cluster-scorer
- type: inflight-load-producer
- type: in-flight-requests-scorer
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: cross-cluster-filter
  - {pluginRef: cross-cluster-scorer, weight: 1}
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: in-flight-requests-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}]
`

func run(ctx context.Context, c config) error {
	began := time.Now()
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	// The router kubelets run pods in their own directories.
	stock, err := filepath.Abs(c.stock)
	if err != nil {
		return err
	}
	c.stock = stock
	spokes := fleet.DefaultSpokes()
	for i := range spokes {
		spokes[i].SimulatorArgs = nil
	}
	res := &results{Config: c, Run: host.StartRun(), FleetEPPConfig: c.fleetConfig}
	// The clusters are apart: the default matrix's links, isolated pod
	// networks, fleetinfer's pickers in Parent mode.
	fl, err := fleet.Start(ctx, fleet.Options{Dir: c.fleetDir, Spokes: spokes, NoControllers: true, PodNetwork: wan.Isolated})
	if err != nil {
		if fl != nil {
			fl.Stop()
		}
		return err
	}
	defer fl.Stop()
	res.FleetStartup = fl.StartupTime.Round(100 * time.Millisecond).String()
	if res.WAN, err = wanOf(fl); err != nil {
		return err
	}
	routers, err := startRouterNodes(ctx, fl, stock)
	if err != nil {
		return err
	}
	defer stopAll(routers)
	if err := lowerControlPlanes(stock); err != nil {
		return err
	}
	lb, err := startSkyProxy(httpxLimits.keepaliveExpiry)
	if err != nil {
		return err
	}
	defer lb.close()
	for _, s := range fl.Spokes {
		res.Clusters = append(res.Clusters, s.Name())
	}
	for si, sc := range scenarios {
		if c.only != "" && !slices.Contains(strings.Split(c.only, ","), sc.Name) {
			continue
		}
		fmt.Printf("scenario %s (at %s)\n", sc.Name, time.Since(began).Round(time.Second))
		res.Scenarios = append(res.Scenarios, sc)
		if err := runScenario(ctx, c, fl, lb, si, sc, res); err != nil {
			return fmt.Errorf("%s: %w", sc.Name, err)
		}
		// The results so far, so that a run cut short leaves the
		// scenarios it finished.
		if err := res.writeSoFar(c.out); err != nil {
			return err
		}
	}
	return nil
}

// runScenario runs every policy on the scenario's arrivals, on one
// deployment, or on a fresh one per run when the scenario destroys a
// cluster; lb is SkyServe's load balancer proxy.
func runScenario(ctx context.Context, c config, fl *fleet.Fleet, lb *skyProxy, si int, sc scenario, res *results) error {
	if net := fl.PodNetwork(); sc.podNetwork() != net {
		if err := fl.SetPodNetwork(ctx, sc.podNetwork()); err != nil {
			return err
		}
		defer func() { _ = fl.SetPodNetwork(context.WithoutCancel(ctx), net) }()
	}
	var d *deployment
	defer func() {
		if d != nil {
			_ = d.remove(context.WithoutCancel(ctx))
		}
	}()
	reps := sc.Reps
	if c.reps > 0 {
		reps = c.reps
	}
	for rep := range reps {
		// Each repetition starts with another policy, so that no policy
		// always runs first on a fresh deployment or last before a drain.
		k := rep % len(c.policies)
		for pi, pol := range slices.Concat(c.policies[k:], c.policies[:k]) {
			if d == nil {
				ns := fmt.Sprintf("routing-%d-%d-%d", si, rep, pi)
				var err error
				if d, err = deploy(ctx, fl, sc, ns, c.fleetConfig, c.fleetArgs, c.maxTokens); err != nil {
					return err
				}
			}
			if err := d.usePool(ctx, poolOf(pol), c.maxTokens); err != nil {
				return err
			}
			r := newRouter(pol, sc, d, lb.url, uint64(rep))
			arrivals := sc.arrivals(c.duration, uint64(1000*si+rep), pol)
			if sc.PrefixHome {
				both, err := d.warmPrefixes(ctx, sc, pol, r)
				if err != nil {
					return err
				}
				fmt.Printf("  %-12s prefixes cached on two pods of their home cluster: %d of %d\n", pol, both, sc.Prefixes)
			}
			cl := newLoadClient(c.maxTokens, 60*time.Second, d.podCluster, d.links)
			runCtx, cancel := context.WithCancel(ctx)
			sky, _ := r.(*skyServe)
			probe := func(i int) bool { return gatewayReady(runCtx, fl.Spokes[i]) }
			if sky != nil {
				sky.refresh(probe)
			}
			if pol != "gie-local" {
				crossed, err := d.warmLinks(ctx, r, cl)
				if err != nil {
					cancel()
					return err
				}
				fmt.Printf("  %-12s warm-up: of %d completions from each cluster, %v crossed\n", pol, crossingBurst, crossed)
			}
			before, err := d.pickerCounts(ctx, pol)
			if err != nil {
				cancel()
				return err
			}
			start := time.Now().Add(200 * time.Millisecond)
			if sky != nil {
				go sky.sync(runCtx, start, probe)
			}
			restore, err := d.setSlowLink(sc)
			if err != nil {
				cancel()
				return err
			}
			var midErr error
			midDone := make(chan struct{})
			if mid := d.halfway(ctx, sc, r); mid != nil {
				time.AfterFunc(time.Until(start.Add(c.duration/2)), func() {
					defer close(midDone)
					midErr = mid()
				})
			} else {
				close(midDone)
			}
			began, cpu, lbOpened := time.Now(), startCPUMeter(c.stock), lb.opened.Load()
			out := cl.runLoad(runCtx, r, arrivals, c.maxInFlight, start)
			used := cpu.use()
			lbOpened = lb.opened.Load() - lbOpened
			cancel()
			<-midDone
			if err := errors.Join(midErr, restore()); err != nil {
				return err
			}
			after, err := d.pickerCounts(ctx, pol)
			if err != nil {
				return err
			}
			run := newRun(sc, pol, rep, out, c.duration, c.slo, time.Since(began))
			run.CPU = used
			if sky != nil {
				n := int(lbOpened)
				run.LBConnectionsOpened = &n
			}
			if c.requests {
				if err := writeRequests(filepath.Join(c.out, fmt.Sprintf("requests-%s-%s-%d.jsonl", sc.Name, pol, rep)), out); err != nil {
					return err
				}
			}
			run.addPickerCounts(before, after)
			fmt.Printf("  %-12s %s\n", pol, run.line())
			res.Runs = append(res.Runs, run)
			if sc.Lost >= 0 {
				if err := fl.RestartGateway(ctx, fl.Spokes[sc.Lost]); err != nil {
					return err
				}
				if err := d.remove(ctx); err != nil {
					return err
				}
				d = nil
				continue
			}
			// Let the pickers' scrapes see the idle pods before the next run.
			time.Sleep(time.Second)
		}
	}
	return nil
}

// skyServeAt is the cluster whose region SkyServe's load balancer runs in:
// east, where the hot scenarios' traffic mostly enters, the placement that
// costs SkyServe least there.
const skyServeAt = 0

// newRouter builds policy pol's router for a run on d; lb is the URL of
// SkyServe's load balancer proxy.
func newRouter(pol string, sc scenario, d *deployment, lb string, seed uint64) router {
	switch pol {
	case "gie-local":
		return &entryRouter{gws: d.gateways(), host: fedpool.Host(stockPool, d.ns)}
	case "round-robin", "least-load":
		return newSkyServe(d.gateways(), fedpool.Host(stockPool, d.ns), lb, skyServeAt, pol == "least-load", seed)
	case "fleetinfer":
		return &entryRouter{gws: d.gateways(), host: d.pool.Host()}
	}
	var pods []oraclePod
	for i, m := range d.pool.Members {
		for _, p := range m.Pods {
			pods = append(pods, oraclePod{addr: p, cluster: i, slots: sc.MaxNumSeqs[i]})
		}
	}
	return newOracle(pods, seed, d.rtt, time.Duration(sc.PrefixWords)*simPrefillPerToken)
}
