package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/loadgen"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// The tests of this file run the pool "llama" federated in Parent mode in
// every spoke of the shared fleet, on its default network: isolated pod
// networks and the default matrix. Each cluster has one model server.

// wanSimArgs: one slot per model server, so that a little load saturates a
// cluster; one latency model in every cluster with no spread, so that a
// crossed request's time to first token differs from a local one's by its
// path only; and every request logged with its headers (--log-http), so that
// a test can tell, for each request, which model server served it and
// through how many gateways it came.
const wanSimArgs = "--max-num-seqs=1 --time-to-first-token=100ms --time-to-first-token-std-dev=0 " +
	"--inter-token-latency=10ms --inter-token-latency-std-dev=0 --log-http"

// parentPool is the pool in every spoke, each member in Parent mode, its
// pickers started with eppArgs; it is deleted when the test ends.
type parentPool struct {
	*fedpool.Pool
	// clusterOf maps a model-server pod's name to its cluster.
	clusterOf map[string]string
	client    *http.Client
}

func startParentPool(t *testing.T, eppArgs ...string) *parentPool {
	t.Helper()
	if got := fl.PodNetwork(); got != wan.Isolated {
		t.Fatalf("the shared fleet runs pod network %q, want the default %q", got, wan.Isolated)
	}
	ctx := context.Background()
	opts := fedpool.Options{Namespace: fmt.Sprintf("wan-%d", time.Now().UnixNano()%100000), Pool: fedPool,
		EPPConfig: fedEPPConfig, EPPArgs: eppArgs}
	for _, s := range fl.Spokes {
		opts.Members = append(opts.Members, &fedpool.Member{Cluster: s, Replicas: 1, SimArgs: wanSimArgs, Mode: fleetv1alpha1.FederationParent})
	}
	removeNamespaceOnCleanup(t, opts.Namespace, fl.Spokes...)
	began := time.Now()
	pool, err := fedpool.Deploy(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	p := &parentPool{Pool: pool, clusterOf: map[string]string{}, client: &http.Client{}}
	t.Cleanup(p.client.CloseIdleConnections)
	for _, m := range pool.Members {
		pods, err := podsOf(ctx, m.Cluster, pool.Namespace, map[string]string{"app": fedPool})
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range pods {
			p.clusterOf[pod.Name] = m.Cluster.Name()
		}
		t.Logf("%s: model server %v, picker federating at %s", m.Cluster.Name(), m.Pods, m.FederationAddress)
	}
	t.Logf("pool %s/%s federated in Parent mode in %d clusters in %s", pool.Namespace, pool.Pool, len(pool.Members), time.Since(began).Round(100*time.Millisecond))
	return p
}

// entry is where requests enter cluster m: its gateway, with the pool's
// hostname.
func (p *parentPool) entry(m *fedpool.Member) loadgen.Entry {
	return loadgen.Entry{Name: m.Cluster.Name(), URL: m.Cluster.GatewayURL(), Host: p.Host(), Weight: 1}
}

// send sends one streamed completion of maxTokens tokens into cluster m's
// gateway, within 10 s.
func (p *parentPool) send(m *fedpool.Member, prompt string, maxTokens int) loadgen.Result {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return loadgen.Send(ctx, p.client, p.entry(m), fedPool, prompt, maxTokens)
}

// servedIn is the cluster whose model server answered r.
func (p *parentPool) servedIn(r loadgen.Result) string { return p.clusterOf[r.Pod] }

// served is one completion as the model server that served it logged it.
type served struct {
	cluster string
	// gateways is how many gateways the request passed: the entries of the
	// X-Forwarded-For it arrived with, to which each gateway of the local
	// fleet appends the address it was called from (Envoy does with
	// use_remote_address).
	gateways int
}

// logged matches one completion request the simulator logged with
// --log-http: its headers, one per line, and its body, Go-quoted.
var logged = regexp.MustCompile(`(?s)"HTTP request" method="POST" requestURI="/v1/completions" remoteAddr="[^"]*" headers=<\n(.*?)\n >\s*body=("(?:[^"\\]|\\.)*")`)

// servedRequests reads what every model server of the pool logged and
// returns, by prompt, where and how each completion was served.
func (p *parentPool) servedRequests(t *testing.T) map[string][]served {
	t.Helper()
	out := map[string][]served{}
	for _, m := range p.Members {
		pods, err := podsOf(context.Background(), m.Cluster, p.Namespace, map[string]string{"app": fedPool})
		if err != nil {
			t.Fatal(err)
		}
		for _, pod := range pods {
			for _, match := range logged.FindAllStringSubmatch(podLog(t, m.Cluster, &pod, "vllm"), -1) {
				body, err := strconv.Unquote(match[2])
				var req struct {
					Prompt string `json:"prompt"`
				}
				if err != nil || json.Unmarshal([]byte(body), &req) != nil {
					t.Fatalf("%s: unreadable logged body %s", pod.Name, match[2])
				}
				s := served{cluster: m.Cluster.Name()}
				for _, h := range strings.Split(match[1], "\n") {
					if k, v, ok := strings.Cut(strings.TrimSpace(h), ": "); ok && strings.EqualFold(k, "X-Forwarded-For") {
						s.gateways = len(strings.Split(v, ","))
					}
				}
				out[req.Prompt] = append(out[req.Prompt], s)
			}
		}
	}
	return out
}

// pickerSeries sums a picker's series whose text starts with prefix.
func pickerSeries(t *testing.T, m *fedpool.Member, prefix string) float64 {
	t.Helper()
	got, err := m.EPPMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for series, v := range got {
		if strings.HasPrefix(series, prefix) {
			n += v
		}
	}
	return n
}

// forwards are the requests the pool's pickers sent to another cluster,
// and the forwarded requests whose marks they accepted.
func (p *parentPool) forwards(t *testing.T) (picked, accepted float64) {
	t.Helper()
	for _, m := range p.Members {
		f := &fedCluster{Member: m}
		picked += remotePicks(t, f)
		accepted += marksCounted(t, f, "accepted")
	}
	return picked, accepted
}

// picksTo is a picker's count of requests it sent to cluster.
func picksTo(t *testing.T, m *fedpool.Member, cluster string) float64 {
	return pickerSeries(t, m, fmt.Sprintf(`fleetinfer_epp_picks_total{cluster=%q,locality="remote"}`, cluster))
}

// remoteEndpoints is how many of peer's endpoints a picker holds.
func remoteEndpoints(t *testing.T, m *fedpool.Member, peer string) float64 {
	return pickerSeries(t, m, fmt.Sprintf(`fleetinfer_epp_federation_remote_endpoints{peer=%q}`, peer))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// The pool federated in Parent mode on isolated pod networks: a saturated
// cluster's requests are served by the other clusters' model servers through
// their gateways, each forwarded request is forwarded once only even when
// every cluster is saturated, a crossed request pays the link's round trip,
// and the other clusters' pod addresses stay unreachable.
func TestParentModeServesAcrossIsolatedClusters(t *testing.T) {
	p := startParentPool(t)
	east, west, central := p.Member("east"), p.Member("west"), p.Member("central")

	t.Run("a request entering a saturated cluster is served by another cluster's model server through its gateway", func(t *testing.T) {
		// East's model server is kept busy from outside the clusters: load
		// sent through east's gateway would itself spill, and leave east no
		// busier than the others.
		stop := load(east.Pods, 3, 30*time.Second)
		defer stop()
		accepted := map[string]float64{}
		for _, m := range []*fedpool.Member{west, central} {
			accepted[m.Cluster.Name()] = marksCounted(t, &fedCluster{Member: m}, "accepted")
		}
		var crossed loadgen.Result
		var prompt string
		for i := 0; i < 40 && crossed.Pod == ""; i++ {
			prompt = fmt.Sprintf("entering saturated east %d", i)
			r := p.send(east, prompt, 2)
			if !r.OK() {
				t.Fatalf("request %d: %s", i, r.Err)
			}
			if p.servedIn(r) != "east" {
				crossed = r
			}
		}
		stop()
		if crossed.Pod == "" {
			t.Fatal("40 requests entering saturated east were all served in east")
		}
		in := p.servedIn(crossed)
		got := p.servedRequests(t)[prompt]
		if len(got) != 1 || got[0].cluster != in || got[0].gateways != 2 {
			t.Fatalf("the model servers logged %+v for the request served by %s in %s, want it once, through 2 gateways", got, crossed.Pod, in)
		}
		if n := marksCounted(t, &fedCluster{Member: p.Member(in)}, "accepted") - accepted[in]; n < 1 {
			t.Errorf("%s's picker accepted %v Parent-mode marks, want east's", in, n)
		}
		t.Logf("served by %s in %s through east's and %s's gateways, TTFT %s", crossed.Pod, in, in, crossed.TTFT.Round(time.Millisecond))
	})

	t.Run("with every cluster saturated no request is forwarded twice", func(t *testing.T) {
		ctx := context.Background()
		remote, accepted := p.forwards(t)
		// Three model servers with one slot each serve about 20 completions
		// of 4 tokens a second: 25 a second for 4 s keeps all three queues
		// filled.
		watch, peaks := watchWaiting(p)
		results := loadgen.Run(ctx, loadgen.Options{
			Entries: []loadgen.Entry{p.entry(east), p.entry(west), p.entry(central)},
			Rate:    25, Duration: 4 * time.Second, MaxInFlight: 60, Timeout: 20 * time.Second, Model: fedPool, MaxTokens: 4,
			Prompt: func(i int) string { return fmt.Sprintf("everyone saturated %d", i) }, Seed: 12,
		})
		watch()
		for _, m := range p.Members {
			if peaks[m.Cluster.Name()] < 1 {
				t.Errorf("%s's model server never had a request waiting: the cluster was not saturated", m.Cluster.Name())
			}
		}
		seen := p.servedRequests(t)
		forwarded := map[string]int{} // "entry → serving cluster"
		for i, r := range results {
			if !r.OK() {
				t.Errorf("request %d entering %s: %s", i, r.Entry, r.Err)
				continue
			}
			in := p.servedIn(r)
			got := seen[fmt.Sprintf("everyone saturated %d", i)]
			want := 1
			if in != r.Entry {
				want = 2
				forwarded[r.Entry+" → "+in]++
			}
			if len(got) != 1 || got[0].cluster != in || got[0].gateways != want {
				t.Errorf("request %d entering %s, served in %s: the model servers logged %+v, want it once, through %d gateways", i, r.Entry, in, got, want)
			}
		}
		n := 0
		for _, c := range forwarded {
			n += c
		}
		if n == 0 {
			t.Fatalf("none of %d requests was forwarded: the run proves nothing", len(results))
		}
		// Every forward the pickers chose, and every mark they accepted, is
		// one of those requests: none was picked remote a second time.
		remoteAfter, acceptedAfter := p.forwards(t)
		if remoteAfter-remote != float64(n) || acceptedAfter-accepted != float64(n) {
			t.Errorf("pickers picked %v remote endpoints and accepted %v marks, want %d each", remoteAfter-remote, acceptedAfter-accepted, n)
		}
		t.Logf("%d requests, %d forwarded once (%v), none twice; most requests waiting per model server: %v", len(results), n, forwarded, peaks)
	})

	t.Run("a crossed request's time to first token includes the link's round trip", func(t *testing.T) {
		// A long inter-region round trip, well above what the extra gateway
		// and picker of a crossed request cost on a busy 2-core machine.
		const rtt = 100 * time.Millisecond
		for _, m := range []*fedpool.Member{west, central} {
			before, err := fl.Fabric().Link("east", m.Cluster.Name())
			if err != nil {
				t.Fatal(err)
			}
			if err := fl.Fabric().SetLink("east", m.Cluster.Name(), wan.Link{RTT: rtt, Bandwidth: before.Bandwidth}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = fl.Fabric().SetLink("east", m.Cluster.Name(), before) })
		}
		// The last subtest saturated every cluster; its queues take a
		// picker refresh to leave the pickers' views, and on a loaded
		// machine a request entering west could still be sent on.
		for _, m := range []*fedpool.Member{west, central} {
			testutil.Eventually(t, 15*time.Second, m.Cluster.Name()+"'s picker sees its cluster idle", func(context.Context) error {
				if r := p.send(m, "idle probe", 2); !r.OK() || p.servedIn(r) != m.Cluster.Name() {
					return fmt.Errorf("served by %q (%s)", r.Pod, r.Err)
				}
				return nil
			})
		}
		// East's model server is kept busy from outside the clusters, so
		// that east's picker sends requests on while the others stay idle.
		stop := load(east.Pods, 3, 30*time.Second)
		defer stop()
		local := map[string][]time.Duration{}
		var crossed []loadgen.Result
		// The first request to cross opens the gateways' connections: it
		// is not counted.
		warm := false
		for i := 0; i < 20 && len(crossed) < 9; i++ {
			for _, m := range []*fedpool.Member{west, central} {
				r := p.send(m, fmt.Sprintf("local ttft %d", i), 2)
				if !r.OK() || p.servedIn(r) != m.Cluster.Name() {
					t.Fatalf("request entering idle %s: served by %q (%s)", m.Cluster.Name(), r.Pod, r.Err)
				}
				local[m.Cluster.Name()] = append(local[m.Cluster.Name()], r.TTFT)
			}
			r := p.send(east, fmt.Sprintf("crossed ttft %d", i), 2)
			if !r.OK() {
				t.Fatalf("request entering east: %s", r.Err)
			}
			if p.servedIn(r) != "east" {
				if warm {
					crossed = append(crossed, r)
				}
				warm = true
			}
		}
		stop()
		if len(crossed) < 5 {
			t.Fatalf("%d requests entering saturated east crossed, want at least 5", len(crossed))
		}
		var extra []time.Duration
		for _, r := range crossed {
			extra = append(extra, r.TTFT-median(local[p.servedIn(r)]))
		}
		got := median(extra)
		for i := range extra {
			extra[i] = extra[i].Round(100 * time.Microsecond)
		}
		lo, hi := time.Duration(float64(rtt)*0.8), time.Duration(float64(rtt)*1.2)
		t.Logf("TTFT: local median %s in west, %s in central; crossing from east adds a median %s over %d requests (%v); link RTT %s",
			median(local["west"]).Round(100*time.Microsecond), median(local["central"]).Round(100*time.Microsecond),
			got.Round(100*time.Microsecond), len(extra), extra, rtt)
		if got < lo || got > hi {
			t.Errorf("crossing adds %s to the time to first token, want the link's RTT %s ±20%% [%s, %s]", got, rtt, lo, hi)
		}
	})

	t.Run("a connection from one cluster to another cluster's pod address fails", func(t *testing.T) {
		for _, addr := range []string{central.Pods[0], central.EPPAddr(fedpool.FederationPort)} {
			refused := fl.Fabric().Stats("east", "central").Refused
			if err := exchange(fleet.GatewayAddress(east.Cluster.NetworkIndex), addr); !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("east's connection to central's pod address %s: %v, want a reset", addr, err)
			}
			if n := fl.Fabric().Stats("east", "central").Refused - refused; n != 1 {
				t.Errorf("the fabric refused %d connections from east to %s, want 1", n, addr)
			}
			if err := exchange(fleet.GatewayAddress(central.Cluster.NetworkIndex), addr); err != nil {
				t.Errorf("central's own connection to %s: %v", addr, err)
			}
		}
	})
}

// exchange connects to addr from source, sends an HTTP request and reads
// what comes back: nil once the server answers or closes the connection
// (a TLS server closes it on an HTTP request), the error otherwise.
func exchange(source netip.Addr, addr string) error {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: source.AsSlice()}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "GET /health HTTP/1.0\r\n\r\n"); err != nil {
		return err
	}
	if _, err = c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// watchWaiting samples the waiting requests of the pool's model servers
// every 100 ms until stop is called, and keeps each cluster's peak.
func watchWaiting(p *parentPool) (stop func(), peaks map[string]float64) {
	peaks = map[string]float64{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, m := range p.Members {
				for _, pod := range m.Pods {
					got, err := metrics.Scrape(ctx, "http://"+pod+"/metrics")
					if err != nil {
						continue
					}
					for series, v := range got {
						if metrics.Name(series) == "vllm:num_requests_waiting" {
							peaks[m.Cluster.Name()] = max(peaks[m.Cluster.Name()], v)
						}
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() { cancel(); <-done }, peaks
}

// A black hole between two clusters (packets dropped, no reset): within the
// pickers' federation staleness plus 0.5 s no request is sent into it,
// requests entering either cluster are served all along, by their own
// cluster or a third, and federation across the link resumes within 5 s of
// it healing.
func TestBlackHoledLinkIsAvoidedAndFederationResumesWhenItHeals(t *testing.T) {
	const staleness = time.Second
	p := startParentPool(t, "--federation-staleness="+staleness.String())
	east, west := p.Member("east"), p.Member("west")
	// East's model server is kept busy from outside the clusters: east's
	// picker sends requests on, to west and central.
	stop := load(east.Pods, 3, 60*time.Second)
	defer stop()
	var toWest int
	for i := 0; i < 40 && toWest == 0; i++ {
		if r := p.send(east, fmt.Sprintf("before the hole %d", i), 2); r.OK() && p.servedIn(r) == "west" {
			toWest++
		}
	}
	if toWest == 0 {
		t.Fatal("no request entering saturated east was served in west before the black hole")
	}

	if err := fl.Fabric().BlackHole("east", "west"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fl.Fabric().Heal("east", "west") })
	holed := time.Now()
	window := staleness + 500*time.Millisecond
	// Requests enter east and west one after the other, each bounded by 4 s,
	// until 4 s after the window.
	var wg sync.WaitGroup
	probes := map[string][]probe{}
	var mu sync.Mutex
	for _, m := range []*fedpool.Member{east, west} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100 && time.Since(holed) < window+4*time.Second; i++ {
				pr := probe{start: time.Now()}
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				pr.Result = loadgen.Send(ctx, p.client, p.entry(m), fedPool, fmt.Sprintf("during the hole %s %d", m.Cluster.Name(), i), 2)
				cancel()
				mu.Lock()
				probes[m.Cluster.Name()] = append(probes[m.Cluster.Name()], pr)
				mu.Unlock()
			}
		}()
	}
	var dropped time.Duration
	for time.Since(holed) < window {
		if dropped == 0 && remoteEndpoints(t, east, "west") == 0 && remoteEndpoints(t, west, "east") == 0 {
			dropped = time.Since(holed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	eastToWest, westToEast := picksTo(t, east, "west"), picksTo(t, west, "east")
	wg.Wait()
	if n := picksTo(t, east, "west") - eastToWest; n != 0 {
		t.Errorf("east's picker sent %v requests to west later than %s into the black hole", n, window)
	}
	if n := picksTo(t, west, "east") - westToEast; n != 0 {
		t.Errorf("west's picker sent %v requests to east later than %s into the black hole", n, window)
	}
	if dropped == 0 {
		t.Errorf("the pickers still held each other's endpoints %s into the black hole", window)
	}
	for entered, prs := range probes {
		after, lost, by := 0, 0, map[string]int{}
		for _, pr := range prs {
			if pr.start.Sub(holed) < window {
				if !pr.OK() {
					lost++
				}
				continue
			}
			after++
			in := p.servedIn(pr.Result)
			by[in]++
			if !pr.OK() || (in != entered && in != "central") {
				t.Errorf("request entering %s %s into the black hole: served in %q (%s)", entered, pr.start.Sub(holed).Round(time.Millisecond), in, pr.Err)
			}
		}
		if after < 3 {
			t.Errorf("%d requests entered %s after the window, want at least 3", after, entered)
		}
		t.Logf("entering %s: %d requests in the first %s (%d lost in the hole), then %d served by %v", entered, len(prs)-after, window, lost, after, by)
	}

	if err := fl.Fabric().Heal("east", "west"); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	var resumed time.Duration
	for time.Since(healed) < 15*time.Second {
		if remoteEndpoints(t, east, "west") == 1 && remoteEndpoints(t, west, "east") == 1 {
			resumed = time.Since(healed)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if resumed == 0 || resumed > 5*time.Second {
		t.Fatalf("federation between east and west resumed %s after the link healed (0: not within 15 s), want within 5 s", resumed)
	}
	var servedInWest time.Duration
	for i := 0; i < 40 && servedInWest == 0; i++ {
		if r := p.send(east, fmt.Sprintf("after the heal %d", i), 2); r.OK() && p.servedIn(r) == "west" {
			servedInWest = time.Since(healed)
		}
	}
	if servedInWest == 0 {
		t.Error("no request entering saturated east was served in west after the link healed")
	}
	t.Logf("black hole east–west, federation staleness %s: both pickers dropped the other's endpoints %s into it; healed, federation resumed after %s and east's requests reached west again after %s",
		staleness, dropped.Round(time.Millisecond), resumed.Round(time.Millisecond), servedInWest.Round(time.Millisecond))
}

// probe is one request sent during a fault.
type probe struct {
	start time.Time
	loadgen.Result
}
