// Command epp benchmarks fleetinfer's endpoint picker against GIE v1.5.0's
// stock EPP in the same run, on this machine: pick latency and picks/s with
// a federated view of 1,000 pods (40 local pods plus 10 peers of 96) next to
// the stock EPP over the same 40 local pods, and the federation's freshness
// and bytes per peer. `make bench` runs it and writes bench/results/epp.*.
//
// Both EPPs are processes against one real kube-apiserver, with the same
// flags, scraping the same 40 stand-ins for model servers on loopback pod
// addresses, which serve the metrics page of a real simulator run at start
// (the scrape and the page are real, the serving is not). 40, not more: on
// this 2-core machine the stock EPP's scrapes of 100 such pages every 50 ms
// took more than a core, and its picks starved. The 10
// peers are real federation servers in this process publishing synthetic pod
// state that changes all the time. Picks are driven by the local gateway's
// Envoy-faithful ext-proc client, one stream per pick.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fleetinfer/fleetinfer/bench/internal/host"
	"github.com/fleetinfer/fleetinfer/epp"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

type config struct {
	out, stock, epp, profile   string
	reps, seq, conc, concPicks int
	local, peers, perPeer      int
	warmup                     int
}

func main() {
	var c config
	flag.StringVar(&c.out, "out", "bench/results", "directory for epp.json, epp.md and the SVG plots")
	flag.StringVar(&c.stock, "stock-epp", "bin/gie-epp", "GIE v1.5.0's stock EPP binary (sigs.k8s.io/gateway-api-inference-extension/cmd/epp)")
	flag.StringVar(&c.epp, "epp", "", "fleetinfer's EPP binary (default: bin/epp)")
	flag.IntVar(&c.reps, "reps", 7, "repetitions (results are medians, ratios medians of each repetition's)")
	flag.IntVar(&c.seq, "seq", 2000, "sequential picks per phase")
	flag.IntVar(&c.conc, "conc", 8, "concurrent pickers")
	flag.IntVar(&c.concPicks, "conc-picks", 4000, "picks of the concurrent phase")
	flag.IntVar(&c.warmup, "warmup", 300, "warm-up picks before each phase")
	flag.IntVar(&c.local, "local", 40, "local pods")
	flag.IntVar(&c.peers, "peers", 10, "federation peers")
	flag.IntVar(&c.perPeer, "per-peer", 96, "pods per peer")
	flag.StringVar(&c.profile, "profile", "", "instead of measuring, profile each phase of both EPPs (CPU with perf, allocations with pprof) into this directory")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func mkdir(p string) string {
	_ = os.MkdirAll(p, 0o755)
	return p
}

func run(ctx context.Context, c config) error {
	started := host.StartRun()
	dir, err := os.MkdirTemp("", "fleetinfer-bench-")
	if err != nil {
		return err
	}
	reg := &process.Registry{}
	defer func() {
		reg.StopAll(controlplane.StopGrace)
		_ = os.RemoveAll(dir)
	}()
	cp, cl, err := startAPIServer(ctx, dir, reg)
	if cp != nil {
		defer cp.Stop()
	}
	if err != nil {
		return err
	}
	addrs, err := createPool(ctx, cl, c.local)
	if err != nil {
		return err
	}
	b, err := binaries.Locate()
	if err != nil {
		return err
	}
	page, err := simulatorPage(ctx, b.Simulator, dir, reg)
	if err != nil {
		return err
	}
	servers, err := startModelServers(addrs, page)
	if err != nil {
		return err
	}
	defer servers.stop()
	ca, err := federationtest.NewCA("fleetinfer-bench")
	if err != nil {
		return err
	}
	const localID = "spiffe://fleetinfer.bench/local"
	peers, err := startFakePeers(ctx, ca, dir, c.peers, c.perPeer, localID, peerInterval)
	for _, p := range peers {
		defer p.stop()
	}
	if err != nil {
		return err
	}
	tls, err := ca.WriteFiles(mkdir(filepath.Join(dir, "local")), localID)
	if err != nil {
		return err
	}
	peersFile := filepath.Join(dir, "peers.yaml")
	if err := os.WriteFile(peersFile, []byte(peerDirectory(peers)), 0o600); err != nil {
		return err
	}
	if c.epp == "" {
		c.epp = b.EPP
	}
	fed, err := ports.Free(1)
	if err != nil {
		return err
	}
	fedPort := fed[0]
	variants := []variant{
		{name: "gie-stock", binary: c.stock},
		{name: "fleetinfer", binary: c.epp, federated: c.peers * c.perPeer, args: []string{
			"--federation-cluster=local", "--federation-peers-file=" + peersFile, "--federation-port=" + portString(fedPort),
			"--federation-cert-file=" + tls.Cert, "--federation-key-file=" + tls.Key, "--federation-ca-file=" + tls.CA,
			"--federation-allow-loopback", "--config-text=" + fleetConfig}},
	}
	if c.profile != "" {
		return profilePhases(ctx, c, variants, cp.AdminKubeconfig(), servers, dir, c.profile, reg)
	}
	res := results{Config: c, Run: started}
	for rep := range c.reps {
		fmt.Printf("rep %d/%d\n", rep+1, c.reps)
		runs, err := measureRep(ctx, c, variants, rep, cp.AdminKubeconfig(), servers, dir, reg)
		if err != nil {
			return err
		}
		res.Runs = append(res.Runs, runs...)
	}
	res.Finish()
	res.summarize()
	return res.write(c.out)
}

// fleetConfig is fleetinfer's default configuration with the estimate's
// prefill term on (prefillPerToken), so that every pick hashes its prompt
// and reads the prefix record and the peers' summaries.
var fleetConfig = strings.Replace(epp.DefaultConfig(), "- type: cross-cluster-filter\n",
	"- type: cross-cluster-filter\n  parameters: {prefillPerToken: 400us}\n", 1)

type variant struct {
	name, binary string
	args         []string
	federated    int // remote endpoints expected, 0 for none
}

// run is one measured phase of one EPP process.
type runResult struct {
	Rep      int     `json:"rep"`
	EPP      string  `json:"epp"`
	Scenario string  `json:"scenario"` // headroom | saturated
	Load     string  `json:"load"`     // sequential | concurrent
	Picks    int     `json:"picks"`
	Errors   int     `json:"errors"`
	P50Ms    float64 `json:"p50_ms"`
	P90Ms    float64 `json:"p90_ms"`
	P99Ms    float64 `json:"p99_ms"`
	PerSec   float64 `json:"picks_per_s"`
	Remote   int     `json:"remote_picks"`
	// CPUPerPickUs is the EPP process's CPU time over the phase divided by
	// its picks; IdleCPU is its share of one core while nothing is picked
	// (scraping and, for fleetinfer, the federation streams).
	CPUPerPickUs float64 `json:"epp_cpu_us_per_pick"`
	IdleCPU      float64 `json:"epp_idle_cpu_percent"`
	// LoadAverage is the machine's 1-minute load average when the phase
	// began.
	LoadAverage float64 `json:"load_average"`
	// Federation, fleetinfer only, over the phase.
	LagP50Ms      float64            `json:"remote_age_p50_ms,omitempty"`
	LagP99Ms      float64            `json:"remote_age_p99_ms,omitempty"`
	LagSamples    int                `json:"remote_age_samples,omitempty"`
	BytesPerPeerS map[string]float64 `json:"bytes_per_s_per_peer,omitempty"`
}

// eppProc is one running EPP.
type eppProc struct {
	v          variant
	p          *process.Process
	picker     *extproc.Client
	metricsURL string
}

func startEPP(ctx context.Context, v variant, kubeconfig, dir string, reg *process.Registry) (*eppProc, error) {
	free, err := ports.Free(3)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--pool-name=" + benchPool, "--pool-namespace=" + benchNS,
		"--grpc-port=" + portString(free[0]), "--grpc-health-port=" + portString(free[1]), "--metrics-port=" + portString(free[2]),
		"--secure-serving=false", "--tracing=false", "--metrics-endpoint-auth=false", "--enable-pprof=false", "--v=1"}, v.args...)
	p, err := process.Start(process.Spec{Name: v.name, Path: v.binary, Args: args, Env: []string{"KUBECONFIG=" + kubeconfig},
		LogPath: filepath.Join(dir, v.name+".log")}, reg)
	if err != nil {
		return nil, err
	}
	e := &eppProc{v: v, p: p, metricsURL: "http://127.0.0.1:" + portString(free[2]) + "/metrics"}
	if err := waitReady(ctx, "127.0.0.1:"+portString(free[1]), e.metricsURL, v.federated, p); err != nil {
		e.stop()
		return nil, err
	}
	if e.picker, err = extproc.Dial("127.0.0.1:" + portString(free[0])); err != nil {
		e.stop()
		return nil, err
	}
	return e, nil
}

// startEPPs starts every variant, returning those that started.
func startEPPs(ctx context.Context, variants []variant, kubeconfig, dir string, reg *process.Registry) ([]*eppProc, error) {
	var procs []*eppProc
	for _, v := range variants {
		e, err := startEPP(ctx, v, kubeconfig, dir, reg)
		if err != nil {
			return procs, fmt.Errorf("%s: %w", v.name, err)
		}
		procs = append(procs, e)
	}
	return procs, nil
}

func stopEPPs(procs []*eppProc) {
	for _, e := range procs {
		e.stop()
	}
}

func (e *eppProc) stop() {
	if e.picker != nil {
		_ = e.picker.Close()
	}
	e.p.Stop(controlplane.StopGrace)
}

// chunks is how many slices each phase is cut into, the EPPs taking turns
// slice by slice (who goes first alternating), so that both see the same
// background load on a shared machine.
const chunks = 8

// measureRep runs every phase on all EPPs at once.
func measureRep(ctx context.Context, c config, variants []variant, rep int, kubeconfig string, servers *modelServers, dir string, reg *process.Registry) ([]runResult, error) {
	procs, err := startEPPs(ctx, variants, kubeconfig, dir, reg)
	defer stopEPPs(procs)
	if err != nil {
		return nil, err
	}
	var out []runResult
	for _, scenario := range []string{"headroom", "saturated"} {
		servers.saturated.Store(scenario == "saturated")
		// A few scrapes, then the federation, catch up; each EPP's CPU while
		// idle is measured meanwhile.
		idleFrom := map[*eppProc]time.Duration{}
		for _, e := range procs {
			idleFrom[e] = cpuTime(e.p.PID())
		}
		time.Sleep(2 * time.Second)
		idle := map[*eppProc]float64{}
		for _, e := range procs {
			idle[e] = (cpuTime(e.p.PID()) - idleFrom[e]).Seconds() / 2 * 100
		}
		for _, load := range []string{"sequential", "concurrent"} {
			workers, picks := 1, c.seq
			if load == "concurrent" {
				workers, picks = c.conc, c.concPicks
			}
			type acc struct {
				lat           []time.Duration
				remote, errs  int
				elapsed, cpu  time.Duration
				before, after map[string]float64
			}
			accs := map[*eppProc]*acc{}
			for _, e := range procs {
				m, err := metrics.Scrape(ctx, e.metricsURL)
				if err != nil {
					return nil, err
				}
				accs[e] = &acc{before: m}
			}
			phaseStart, loadAvg := time.Now(), host.LoadAverage()
			for chunk := range chunks {
				order := slices.Clone(procs)
				if (rep+chunk)%2 == 1 {
					slices.Reverse(order)
				}
				for _, e := range order {
					if _, _, _, err := drive(ctx, e.picker, 1, c.warmup/chunks); err != nil {
						return nil, err
					}
					start, cpuFrom := time.Now(), cpuTime(e.p.PID())
					lat, remote, errs, err := drive(ctx, e.picker, workers, picks/chunks)
					if err != nil {
						return nil, fmt.Errorf("%s: %w", e.v.name, err)
					}
					a := accs[e]
					a.elapsed += time.Since(start)
					a.cpu += cpuTime(e.p.PID()) - cpuFrom
					a.lat, a.remote, a.errs = append(a.lat, lat...), a.remote+remote, a.errs+errs
				}
			}
			phase := time.Since(phaseStart)
			for _, e := range procs {
				a := accs[e]
				m, err := metrics.Scrape(ctx, e.metricsURL)
				if err != nil {
					return nil, err
				}
				a.after = m
				r := runResult{Rep: rep, LoadAverage: loadAvg, EPP: e.v.name, Scenario: scenario, Load: load, Picks: len(a.lat), Errors: a.errs,
					P50Ms: pct(a.lat, 50), P90Ms: pct(a.lat, 90), P99Ms: pct(a.lat, 99), PerSec: float64(len(a.lat)) / a.elapsed.Seconds(),
					Remote: a.remote, CPUPerPickUs: float64(a.cpu.Microseconds()) / float64(max(len(a.lat), 1)), IdleCPU: idle[e]}
				if e.v.federated > 0 {
					r.LagP50Ms, r.LagP99Ms, r.LagSamples = lagQuantiles(a.before, a.after)
					// Federation bytes flow all phase long, picks or not.
					r.BytesPerPeerS = bytesPerPeer(a.before, a.after, phase)
				}
				out = append(out, r)
				fmt.Printf("  %-10s %-10s %-10s p50 %.2f ms  p99 %.2f ms  %.0f picks/s  remote %d  errors %d  age p99 %.0f ms  cpu %.0f µs/pick  idle %.0f%%\n",
					e.v.name, scenario, load, r.P50Ms, r.P99Ms, r.PerSec, r.Remote, r.Errors, r.LagP99Ms, r.CPUPerPickUs, r.IdleCPU)
			}
		}
	}
	servers.saturated.Store(false)
	return out, nil
}

// waitReady waits for the EPP's ext-proc health, its local pods and, for
// fleetinfer, every remote endpoint.
func waitReady(ctx context.Context, healthAddr, metricsURL string, federated int, p *process.Process) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(healthAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	for {
		select {
		case <-p.Done():
			return fmt.Errorf("EPP exited: %v", p.ExitErr())
		case <-ctx.Done():
			return fmt.Errorf("EPP not ready: %w", errTimeout)
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			continue
		}
		if federated == 0 {
			time.Sleep(2 * time.Second) // every pod scraped a few times
			return nil
		}
		m, err := metrics.Scrape(ctx, metricsURL)
		if err != nil {
			continue
		}
		total := 0.0
		for k, v := range m {
			if strings.HasPrefix(k, "fleetinfer_epp_federation_remote_endpoints{") {
				total += v
			}
		}
		if int(total) == federated {
			return nil
		}
	}
}

// drive runs picks over workers concurrent pickers and returns their
// latencies (headers sent to headers answer, as Envoy waits), how many went
// to a remote pod and how many failed.
func drive(ctx context.Context, picker *extproc.Client, workers, picks int) ([]time.Duration, int, int, error) {
	var mu sync.Mutex
	var lat []time.Duration
	remote, errs := 0, 0
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				p, err := picker.PickServed(pctx, request(int(session.Add(1))), http.StatusOK)
				cancel()
				mu.Lock()
				switch {
				case err != nil || p.Immediate != nil:
					errs++
				default:
					lat = append(lat, p.Latency)
					if !strings.HasPrefix(p.Primary(), "127.20.") {
						remote++
					}
				}
				mu.Unlock()
			}
		}()
	}
	for i := range picks {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if errs > picks/100 {
		return nil, 0, errs, fmt.Errorf("%d of %d picks failed", errs, picks)
	}
	return lat, remote, errs, ctx.Err()
}

// session makes every prompt of the run unique, so that prefix-cache
// affinity from earlier phases does not steer picks.
var session atomic.Int64

var prompt = strings.Repeat("Summarise the following federation benchmark paragraph for a busy reader. ", 8)

func request(i int) *extproc.Request {
	body := fmt.Sprintf(`{"model":"bench","prompt":"[session %d] %s","max_tokens":16}`, i, prompt)
	return &extproc.Request{Path: "/v1/completions", Header: http.Header{"Content-Type": {"application/json"},
		"Content-Length": {strconv.Itoa(len(body))}}, Body: strings.NewReader(body)}
}

func pct(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return float64(s[i].Microseconds()) / 1000
}

// lagQuantiles estimates p50 and p99 of fleetinfer_epp_federation_lag_seconds
// over a phase from the histogram's buckets (summed over peers), linearly
// within a bucket.
func lagQuantiles(before, after map[string]float64) (p50, p99 float64, n int) {
	type bucket struct{ le, count float64 }
	sums := map[float64]float64{}
	for k, v := range after {
		if !strings.HasPrefix(k, "fleetinfer_epp_federation_lag_seconds_bucket{") {
			continue
		}
		i := strings.Index(k, `le="`)
		le, err := strconv.ParseFloat(strings.TrimSuffix(k[i+4:], `"}`), 64)
		if err != nil {
			continue // +Inf
		}
		sums[le] += v - before[k]
	}
	var bs []bucket
	for le, c := range sums {
		bs = append(bs, bucket{le, c})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	total := 0.0
	for k, v := range after {
		if strings.HasPrefix(k, "fleetinfer_epp_federation_lag_seconds_count{") {
			total += v - before[k]
		}
	}
	if total == 0 {
		return 0, 0, 0
	}
	q := func(f float64) float64 {
		rank, prevLE, prevC := f*total, 0.0, 0.0
		for _, b := range bs {
			if b.count >= rank {
				if b.count == prevC {
					return b.le * 1000
				}
				return 1000 * (prevLE + (b.le-prevLE)*(rank-prevC)/(b.count-prevC))
			}
			prevLE, prevC = b.le, b.count
		}
		return prevLE * 1000
	}
	return q(0.5), q(0.99), int(total)
}

func bytesPerPeer(before, after map[string]float64, d time.Duration) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if strings.HasPrefix(k, "fleetinfer_epp_federation_bytes_total{") && strings.Contains(k, `direction="received"`) {
			i := strings.Index(k, `peer="`)
			peer := k[i+6:]
			peer = peer[:strings.IndexByte(peer, '"')]
			out[peer] = (v - before[k]) / d.Seconds()
		}
	}
	return out
}

// cpuTime is a process's user plus system CPU time, from /proc (in clock
// ticks of 10 ms); zero when it cannot be read.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
