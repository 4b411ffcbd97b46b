package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
	"github.com/fleetinfer/fleetinfer/epp/marks"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// The federation tests run one pool, "llama", in three clusters of the shared
// fleet, each with fleetinfer's EPP as a pod (bin/epp run by the local
// kubelet with its ServiceAccount) and simulator pods on loopback addresses.
// The EPPs federate over mTLS with a peer directory naming each other:
// east is where requests enter; west is reached in Endpoint mode (pod
// ip:port) and central in Parent mode (its gateway plus a subset hint).

const fedPool = "llama"

// fedEPPConfig: spill as soon as a local pod has a request waiting, so that
// simulators with one slot saturate quickly, and count local metrics as
// fresh for a second (on a busy 2-core machine a 50 ms scrape can run late);
// prefix affinity is left out so that identical prompts do not stick to one
// pod.
const fedEPPConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: cross-cluster-filter
  parameters: {queueDepthThreshold: 1, metricsStalenessThreshold: 1s}
- type: cross-cluster-scorer
  parameters: {networkCost: 0.3}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: cross-cluster-filter
  - {pluginRef: cross-cluster-scorer, weight: 1}
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 1}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{pluginRef: core-metrics-extractor}]
`

// fedCluster is the pool in one cluster, with an ext-proc client of its
// picker.
type fedCluster struct {
	*fedpool.Member
	picker *extproc.Client
}

// startFederation deploys the pool in every spoke and waits until each EPP
// holds its peers' pods.
func startFederation(t *testing.T, simArgs map[string]string, replicas map[string]int32) (string, map[string]*fedCluster, *federationtest.CA) {
	t.Helper()
	modes := []fleetv1alpha1.FederationMode{fleetv1alpha1.FederationEndpoint, fleetv1alpha1.FederationEndpoint, fleetv1alpha1.FederationParent}
	opts := fedpool.Options{Namespace: fmt.Sprintf("epp-fed-%d", time.Now().UnixNano()%100000), Pool: fedPool, EPPConfig: fedEPPConfig}
	for i, s := range fl.Spokes {
		opts.Members = append(opts.Members, &fedpool.Member{Cluster: s, Replicas: replicas[s.Name()], SimArgs: simArgs[s.Name()], Mode: modes[i]})
	}
	// The pool's pods would otherwise run, and take CPU, for the rest of
	// the suite.
	removeNamespaceOnCleanup(t, opts.Namespace, fl.Spokes...)
	pool, err := fedpool.Deploy(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]*fedCluster{}
	for _, m := range pool.Members {
		f := &fedCluster{Member: m}
		if f.picker, err = extproc.Dial(m.EPPAddr(fedpool.GRPCPort)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.picker.Close() })
		clusters[m.Cluster.Name()] = f
	}
	return pool.Namespace, clusters, pool.CA
}

func fedHost(ns string) string { return fedpool.Host(fedPool, ns) }

func fedCompletion(prompt string) *extproc.Request {
	body := fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":8}`, prompt)
	return &extproc.Request{Path: "/v1/completions", Header: http.Header{"Content-Type": {"application/json"},
		"Content-Length": {strconv.Itoa(len(body))}}, Body: strings.NewReader(body)}
}

// pick asks f's picker for req's destination and answers the pick with a
// 200 as though the pod had served it: the request goes nowhere, and picks
// left unanswered would read as failed crossings and open the picker's
// breaker for the cluster they crossed to.
func pick(t *testing.T, f *fedCluster, req *extproc.Request) *extproc.Pick {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := f.picker.PickServed(ctx, req, http.StatusOK)
	if err != nil {
		t.Fatalf("%s: pick: %v", f.Cluster.Name(), err)
	}
	return p
}

// load keeps every pod of pods busy with real completions (workers per pod,
// back to back) until stop is called, at most for limit.
func load(pods []string, workers int, limit time.Duration) (stop func()) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	var wg sync.WaitGroup
	body := `{"model":"llama","prompt":"keep this simulator busy","max_tokens":40}`
	for _, pod := range pods {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+pod+"/v1/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					if resp, err := http.DefaultClient.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
			}()
		}
	}
	return func() { cancel(); wg.Wait() }
}

func TestEPPFederation(t *testing.T) {
	// west is reached in Endpoint mode, at its pods' addresses, and the
	// pickers federate at theirs: pod networks reachable across clusters.
	podNetwork(t, wan.Flat)
	// east's two pods take one request at a time, slowly, so that a few
	// concurrent completions make vllm:num_requests_waiting move.
	simArgs := map[string]string{
		"east":    "--max-num-seqs=1 --time-to-first-token=200ms --inter-token-latency=50ms",
		"west":    "--max-num-seqs=8",
		"central": "--max-num-seqs=8",
	}
	ns, clusters, ca := startFederation(t, simArgs, map[string]int32{"east": 2, "west": 1, "central": 1})
	east, west, central := clusters["east"], clusters["west"], clusters["central"]
	t.Logf("namespace %s; east pods %v, west %v, central %v", ns, east.Pods, west.Pods, central.Pods)

	t.Run("local pick carries the destination header and envoy.lb metadata", func(t *testing.T) {
		p := pick(t, east, fedCompletion("hello"))
		if p.Immediate != nil || !slices.Contains(east.Pods, p.Primary()) {
			t.Fatalf("pick %q (immediate %v), want one of east's pods %v", p.Destination, p.Immediate, east.Pods)
		}
		md := p.DynamicMetadata.GetFields()[extproc.LBNamespace].GetStructValue().GetFields()[extproc.DestinationHeader].GetStringValue()
		if md != p.Destination {
			t.Fatalf("envoy.lb metadata %q differs from the header %q", md, p.Destination)
		}
	})

	t.Run("no spill while local pods have headroom", func(t *testing.T) {
		for i := range 20 {
			if p := pick(t, east, fedCompletion(fmt.Sprint("idle ", i))); !slices.Contains(east.Pods, p.Primary()) {
				t.Fatalf("pick %d went to %q with east idle", i, p.Destination)
			}
		}
	})

	t.Run("invalid JSON is refused with 400", func(t *testing.T) {
		p := pick(t, east, &extproc.Request{Path: "/v1/completions", Header: http.Header{"Content-Type": {"application/json"}},
			Body: strings.NewReader(`{"model": "llama", "prompt": `)})
		if p.Immediate == nil || p.Immediate.Status != http.StatusBadRequest {
			t.Fatalf("pick %q, immediate %v, want 400", p.Destination, p.Immediate)
		}
	})

	t.Run("unauthenticated or unknown peers are refused", func(t *testing.T) {
		other, err := federationtest.NewCA("someone-else")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			ca   *federationtest.CA
			id   string
			cert bool
			want codes.Code
		}{
			{"no client certificate", ca, "", false, codes.Unavailable},
			{"certificate from another CA", other, west.Identity, true, codes.Unavailable},
			{"identity not in the peer directory", ca, "spiffe://fleetinfer.test/intruder", true, codes.PermissionDenied},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if got := status.Code(subscribeAs(t, east, tc.ca, tc.id, tc.cert)); got != tc.want {
					t.Fatalf("subscription ended with %v, want %v", got, tc.want)
				}
			})
		}
	})

	stop := load(east.Pods, 3, 90*time.Second)
	defer stop()
	seen := map[string]*extproc.Pick{}
	// A spilled request's candidates are the remote pods expected soonest,
	// within the margin of the soonest: with both remote clusters idle that
	// is the nearer one (or the one already connected to), and the other
	// only once the first one's pods are busy too.
	t.Run("spill to the remote cluster expected soonest when local pods are saturated, then to the other once that one is busy", func(t *testing.T) {
		other := map[string]*fedCluster{"west": central, "central": west}
		var first string
		testutil.Eventually(t, 30*time.Second, "a pick in a remote cluster", func(context.Context) error {
			p := pick(t, east, fedCompletion("spill"))
			switch {
			case slices.Contains(west.Pods, p.Primary()):
				first, seen["west"] = "west", p
			case p.Primary() == central.GatewayAddr():
				first, seen["central"] = "central", p
			default:
				return fmt.Errorf("last pick %q, want a remote cluster's", p.Destination)
			}
			return nil
		})
		busy := load(clusters[first].Pods, 3, 60*time.Second)
		defer busy()
		testutil.Eventually(t, 30*time.Second, "a pick in the other remote cluster", func(context.Context) error {
			p := pick(t, east, fedCompletion("spill"))
			switch {
			case slices.Contains(west.Pods, p.Primary()):
				seen["west"] = p
			case p.Primary() == central.GatewayAddr():
				seen["central"] = p
			}
			if len(seen) < 2 {
				return fmt.Errorf("last pick %q with %s busy, want %s's", p.Destination, first, other[first].Cluster.Name())
			}
			return nil
		})
	})

	t.Run("Parent mode marks the forwarded request and the remote EPP honours the marks", func(t *testing.T) {
		p := seen["central"]
		if p == nil || p.Header.Get(marks.Pod) != strings.Join(central.Pods, ",") || p.Header.Get(marks.Origin) != "east" ||
			p.Header.Get(marks.Hops) != "1" || p.Header.Get(marks.Signature) == "" {
			t.Fatalf("parent-mode pick %+v, want marks from east naming %v", p, central.Pods)
		}
		// What central's gateway sends its EPP for the forwarded request.
		before := marksCounted(t, central, "accepted")
		req := fedCompletion("forwarded")
		for _, k := range marks.Headers {
			req.Header.Set(k, p.Header.Get(k))
		}
		if got := pick(t, central, req); got.Primary() != central.Pods[0] || got.Header.Get(marks.Signature) != "" {
			t.Fatalf("marked pick %q (marks left: %q), want %s", got.Destination, got.Header.Get(marks.Signature), central.Pods[0])
		}
		if n := marksCounted(t, central, "accepted") - before; n != 1 {
			t.Fatalf("central accepted %v marks, want 1", n)
		}
	})

	t.Run("a gateway's own subset hint for a pod that is gone falls back to the EPP's own pick (FailOpen)", func(t *testing.T) {
		req := fedCompletion("stale hint")
		req.Subset = []string{net.JoinHostPort(central.EPP.Status.PodIP, "8000")}
		if got := pick(t, central, req); got.Immediate != nil || !slices.Contains(central.Pods, got.Primary()) {
			t.Fatalf("pick %q (immediate %v), want one of central's pods", got.Destination, got.Immediate)
		}
	})

	t.Run("requests entering east's gateway are served in west (Endpoint mode) and central (Parent mode, forwarded once), forged marks notwithstanding", func(t *testing.T) {
		served := map[string]string{} // cluster → pod
		names := map[string]string{}
		for _, f := range []*fedCluster{west, central} {
			pods, err := podsOf(context.Background(), f.Cluster, ns, map[string]string{"app": fedPool})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods {
				names[p.Name] = f.Cluster.Name()
			}
		}
		// A client's marks claiming central forwarded the request to east's
		// busy pod: honoured, they would keep every request on that pod.
		forged := map[string]string{marks.Origin: "central", marks.Hops: "1", marks.Pod: east.Pods[0],
			marks.Expires: strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10), marks.Signature: "Zm9yZ2Vk"}
		rejected, accepted := marksCounted(t, east, "rejected"), marksCounted(t, central, "accepted")
		centralRemote := remotePicks(t, central)
		eastToWest := fl.Fabric().Stats("east", "west")
		sent, inCentral := 0, 0
		for ; sent < 40 && len(served) < 2; sent++ {
			resp, body := gwPost(t, east.Cluster.GatewayURL(), fedHost(ns), "/v1/completions",
				[]byte(fmt.Sprintf(`{"model":"llama","prompt":"through the gateway %d","max_tokens":2}`, sent)), forged)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %s", resp.Status, body)
			}
			pod := resp.Header.Get(gwPodHeader)
			if cluster, ok := names[pod]; ok {
				served[cluster] = pod
				if cluster == "central" {
					inCentral++
				}
			}
		}
		if len(served) != 2 {
			t.Fatalf("served remotely by %v, want a pod of west and of central", served)
		}
		if n := marksCounted(t, east, "rejected") - rejected; n < float64(sent) {
			t.Errorf("east rejected %v forged marks of %d requests", n, sent)
		}
		// Each request served in central arrived with east's marks, which
		// central verified, and central sent none on.
		if n := marksCounted(t, central, "accepted") - accepted; n < float64(inCentral) {
			t.Errorf("central accepted %v marks for %d requests it served", n, inCentral)
		}
		if n := remotePicks(t, central) - centralRemote; n != 0 {
			t.Errorf("central forwarded %v requests again", n)
		}
		// East's gateway reached west's pod at its address, through the
		// link between them: the flat pod network routes it.
		if st := fl.Fabric().Stats("east", "west"); st.Accepted == eastToWest.Accepted || st.BytesFromTarget == eastToWest.BytesFromTarget {
			t.Errorf("no connection from east to west crossed their link (before %+v, after %+v)", eastToWest, st)
		} else {
			t.Logf("east → west over the link: %d connections, %d bytes there, %d back", st.Accepted-eastToWest.Accepted,
				st.BytesToTarget-eastToWest.BytesToTarget, st.BytesFromTarget-eastToWest.BytesFromTarget)
		}
	})

	t.Run("a killed peer's pods are no longer picked within 3 s", func(t *testing.T) {
		pid, err := strconv.Atoi(strings.TrimPrefix(west.EPP.Status.ContainerStatuses[0].ContainerID, "localfleet://"))
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		var lastWest time.Duration
		for time.Since(killed) < 4*time.Second {
			if p := pick(t, east, fedCompletion("after the kill")); slices.Contains(west.Pods, p.Primary()) {
				lastWest = time.Since(killed)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if lastWest > 3*time.Second {
			t.Fatalf("west's pod still picked %s after its EPP was killed", lastWest)
		}
		t.Logf("west last picked %v after the kill (0: never)", lastWest)
	})
	stop()

	t.Run("no endpoints anywhere is refused with 503", func(t *testing.T) {
		for _, f := range []*fedCluster{east, central} {
			var d appsv1.Deployment
			if err := f.Cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fedPool}, &d); err != nil {
				t.Fatal(err)
			}
			d.Spec.Replicas = ptr.To(int32(0))
			if err := f.Cluster.Client.Update(context.Background(), &d); err != nil {
				t.Fatal(err)
			}
		}
		testutil.Eventually(t, 30*time.Second, "503 without pods", func(context.Context) error {
			p := pick(t, east, fedCompletion("nobody home"))
			if p.Immediate == nil || p.Immediate.Status != http.StatusServiceUnavailable {
				return fmt.Errorf("pick %q, immediate %v", p.Destination, p.Immediate)
			}
			return nil
		})
	})
}

// subscribeAs subscribes to f's federation server as a client with a
// certificate for id from issuer (or none), and returns how the first
// receive ended.
// marksCounted is a picker's count of requests whose Parent-mode marks had
// result (accepted, rejected, absent).
func marksCounted(t *testing.T, f *fedCluster, result string) float64 {
	t.Helper()
	m, err := f.EPPMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m[fmt.Sprintf("fleetinfer_epp_parent_marks_total{result=%q}", result)]
}

// remotePicks is a picker's count of picks that left its cluster.
func remotePicks(t *testing.T, f *fedCluster) float64 {
	t.Helper()
	m, err := f.EPPMetrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for series, v := range m {
		if strings.HasPrefix(series, "fleetinfer_epp_picks_total{") && strings.Contains(series, `locality="remote"`) {
			n += v
		}
	}
	return n
}

func subscribeAs(t *testing.T, f *fedCluster, issuer *federationtest.CA, id string, withCert bool) error {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} //nolint:gosec // the server is not what is tested
	if withCert {
		certPEM, keyPEM, err := issuer.Issue(id)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return subscribeOver(f.EPPAddr(fedpool.FederationPort), cfg, f.EPP.Namespace, fedPool)
}

// subscribeOver subscribes over TLS cfg to the federation server at addr
// for pool ns/pool, and returns how the first receive ended.
func subscribeOver(addr string, cfg *tls.Config, ns, pool string) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := federationv1.NewFederationClient(conn).Subscribe(ctx, &federationv1.SubscribeRequest{PoolNamespace: ns, PoolName: pool})
	if err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}
