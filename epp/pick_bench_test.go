package epp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
	"github.com/fleetinfer/fleetinfer/epp/internal/gierunner"
)

// BenchmarkPick is bench/epp's comparison in process, without scraping,
// sockets or the other EPP: one request through the ext-proc stream (headers, body in chunks,
// as the gateway sends it) against GIE's stock wiring (its default
// configuration, candidate lookup and Director) and fleetinfer's (default
// configuration, federated candidates, wrapped Director and stream), over
// 100 local pods with headroom or saturated, fleetinfer also holding 10
// peers × 90 pods received over real mTLS federation streams. Compare
// fleetinfer/X with stock/X; cpu-µs/op, B/op and allocs/op are per pick.
// The peers fall silent once the store holds their pods, and the store and
// filter accept data an hour old, so that the streams' own work (measured by
// federation's BenchmarkApply) stays out of the picks' figures.
func BenchmarkPick(b *testing.B) {
	store := federatedStore(b, 10, 90)
	config := strings.Replace(string(defaultConfig), "- type: cross-cluster-filter\n",
		"- type: cross-cluster-filter\n  parameters: {remoteMetricsStalenessThreshold: 1h, prefillPerToken: 400us}\n", 1)
	for _, scenario := range []string{"headroom", "saturated"} {
		local := benchLocal(100, scenario == "saturated")
		for _, v := range []struct {
			name string
			h    *harness
		}{
			{"stock", newStockHarness(b, local)},
			{"fleetinfer", newHarnessConfig(b, local, store, config)},
		} {
			b.Run(v.name+"/"+scenario, func(b *testing.B) {
				b.ReportAllocs()
				cpu := processCPU()
				i := 0
				for b.Loop() {
					i++
					if r := v.h.request(b, completion(fmt.Sprintf("[session %d] %s", i, benchPrompt)), 64, nil); r.dest == "" {
						b.Fatalf("no pick: %+v", r)
					}
				}
				b.ReportMetric(float64((processCPU()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// benchPrompt is bench/epp's prompt: 600 characters, nine prefix blocks
// to hash and match on every pick.
var benchPrompt = strings.Repeat("Summarise the following federation benchmark paragraph for a busy reader. ", 8)

// processCPU is the process's user and system CPU time: on a shared machine
// it says more than wall time, and it includes what the pick leaves to the
// garbage collector.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// newStockHarness wires GIE's EPP as its runner does, with its default
// configuration.
func newStockHarness(b *testing.B, local []fwkdl.Endpoint) *harness {
	gierunner.RegisterInTreePlugins()
	handle, cfg := loadConfig(b, nil)
	ds := &fakeDatastore{local: local}
	cands := requestcontrol.NewDatastoreEndpointCandidates(ds)
	rc := requestcontrol.NewConfig()
	rc.AddPlugins(handle.GetAllPlugins()...)
	parser := handlers.NewParser(cfg.ParserConfig)
	gie := requestcontrol.NewDirectorWithConfig(ds, scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig),
		requestcontrol.NewLegacyAdmissionController(cfg.SaturationDetector, cands), parser, cands, rc)
	return &harness{server: handlers.NewStreamingServer(ds, gie, parser)}
}

// benchLocal returns local pods reporting empty queues, or queues of 10
// (saturated by the default thresholds). Their metrics are dated ahead so
// that they stay fresh for the whole benchmark without a scraper.
func benchLocal(n int, saturated bool) []fwkdl.Endpoint {
	out := make([]fwkdl.Endpoint, n)
	for i := range n {
		m := fwkdl.NewMetrics()
		m.RunningRequestsSize, m.KVCacheUsagePercent, m.CacheBlockSize, m.CacheNumBlocks = 4, 0.3, 16, 1024
		m.UpdateTime = time.Now().Add(time.Hour)
		if saturated {
			m.WaitingQueueSize = 10
		}
		out[i] = fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: "llm", Name: fmt.Sprintf("sim-%03d-rank-0", i)}, PodName: fmt.Sprintf("sim-%03d", i),
			Address: fmt.Sprintf("127.20.%d.%d", i/250, i%250+1), Port: "8000", Labels: map[string]string{"app": "llama", "pod-template-hash": "7d9f8c6b5"},
		}, m)
	}
	return out
}

// federatedStore fills a store from peers publishing perPeer pods each, with
// varied loads, over mTLS on loopback, as the benchmark's peers do, then
// stops the peers' publishing (their streams stay up).
func federatedStore(b *testing.B, peers, perPeer int) *federation.Store {
	ca, err := federationtest.NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	pool := types.NamespacedName{Namespace: "llm", Name: "llama"}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	publishing, silence := context.WithCancel(ctx)
	creds := func(name string) *federation.Credentials {
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			b.Fatal(err)
		}
		f, err := ca.WriteFiles(d, "spiffe://bench/"+name)
		if err != nil {
			b.Fatal(err)
		}
		c, err := federation.LoadCredentials(federation.TLSFiles{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}, logr.Discard())
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	peersFile := "peers:\n"
	for i := range peers {
		name := fmt.Sprintf("peer-%02d", i)
		eps := make([]fwkdl.Endpoint, perPeer)
		rng := rand.New(rand.NewPCG(uint64(i), 1))
		for j := range perPeer {
			m := fwkdl.NewMetrics()
			m.WaitingQueueSize, m.KVCacheUsagePercent, m.RunningRequestsSize = rng.IntN(4), float64(rng.IntN(60))/100, 4
			eps[j] = fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{
				NamespacedName: types.NamespacedName{Namespace: "llm", Name: fmt.Sprintf("sim-%03d-rank-0", j)}, PodName: fmt.Sprintf("sim-%03d", j),
				Address: fmt.Sprintf("127.%d.%d.%d", 41+i, j/250, j%250+1), Port: "8000", Labels: map[string]string{"app": "llama"},
			}, m)
		}
		list := func() []fwkdl.Endpoint { return eps }
		c := creds(name)
		pub := federation.NewPublisher(federation.PublisherOptions{Pool: pool, Local: list, Interval: 50 * time.Millisecond,
			Heartbeat: 100 * time.Millisecond, LaggingAfter: time.Hour,
			Authorize: func([]string) (string, bool) { return "local", true }, Log: logr.Discard()})
		srv := grpc.NewServer(grpc.Creds(grpccreds.NewTLS(c.ServerConfig())))
		federationv1.RegisterFederationServer(srv, pub)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = pub.Run(publishing) }()
		go func() { _ = srv.Serve(lis) }()
		b.Cleanup(srv.Stop)
		peersFile += fmt.Sprintf("- {cluster: %s, federationAddress: %q, identity: %q}\n", name, lis.Addr(), "spiffe://bench/"+name)
	}
	path := filepath.Join(dir, "peers.yaml")
	if err := os.WriteFile(path, []byte(peersFile), 0o600); err != nil {
		b.Fatal(err)
	}
	df := &federation.DirectoryFile{Path: path, Interval: time.Hour, Log: logr.Discard()}
	if err := df.Load(); err != nil {
		b.Fatal(err)
	}
	store := federation.NewStore(time.Hour)
	sub := federation.NewSubscriber(federation.SubscriberOptions{Cluster: "local", Pool: pool, DefaultMode: fleetv1alpha1.FederationEndpoint,
		Store: store, Credentials: creds("local"), Limits: federation.DefaultLimits,
		Destinations: federation.Destinations{AllowLoopback: true}, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, Log: logr.Discard()})
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(ctx, df) }()
	b.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(20 * time.Second)
	for {
		total := 0
		for _, n := range store.Count() {
			total += n
		}
		if total == peers*perPeer {
			silence()
			return store
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d remote endpoints after 20 s", total, peers*perPeer)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
