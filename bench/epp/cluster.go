package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc"
	grpccreds "google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/deploy/crds"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
	"github.com/fleetinfer/fleetinfer/internal/httpget"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/loadgen"
	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

const (
	benchNS   = "bench"
	benchPool = "bench"
	// The local cluster's pod range; peers' pods are in 127.(41+i).0.0/16 and
	// are never contacted (the benchmark only picks).
	localNet = 20
)

// startAPIServer runs one real kube-apiserver with GIE's CRDs.
func startAPIServer(ctx context.Context, dir string, reg *process.Registry) (*controlplane.ControlPlane, client.Client, error) {
	b, err := binaries.Locate()
	if err != nil {
		return nil, nil, err
	}
	cp, err := controlplane.New(controlplane.Options{Name: "bench", Dir: filepath.Join(dir, "cluster"), Registry: reg,
		Binaries: controlplane.Binaries{Etcd: b.Etcd, KubeAPIServer: b.KubeAPIServer}})
	if err != nil {
		return nil, nil, err
	}
	if err := cp.Start(ctx); err != nil {
		return cp, nil, err
	}
	list, err := crds.ThirdParty(crds.GroupGIE, crds.GroupGIEExperiment)
	if err != nil {
		return cp, nil, err
	}
	if err := crds.Install(ctx, cp.Admin(), list); err != nil {
		return cp, nil, err
	}
	c, err := client.New(cp.Admin(), client.Options{Scheme: fleet.Scheme})
	return cp, c, err
}

// createPool creates the pool and n Ready pods at 127.20.x.y:8000.
func createPool(ctx context.Context, c client.Client, n int) ([]netip.Addr, error) {
	// No controller manager runs here to create the default ServiceAccount,
	// which pod admission wants.
	for _, o := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: benchNS}}} {
		if err := c.Create(ctx, o); err != nil {
			return nil, err
		}
	}
	pool := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: benchPool, Namespace: benchNS},
		Spec: inferencev1.InferencePoolSpec{
			Selector:          inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": benchPool}},
			TargetPorts:       []inferencev1.Port{{Number: 8000}},
			EndpointPickerRef: inferencev1.EndpointPickerRef{Name: "epp", Port: &inferencev1.Port{Number: 9002}},
		}}
	if err := c.Create(ctx, pool); err != nil {
		return nil, err
	}
	addrs := make([]netip.Addr, n)
	for i := range n {
		addrs[i] = netip.AddrFrom4([4]byte{127, localNet, byte((i + 1) / 250), byte((i+1)%250 + 1)})
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("sim-%03d", i), Namespace: benchNS, Labels: map[string]string{"app": benchPool}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai",
				Ports: []corev1.ContainerPort{{ContainerPort: 8000}}}}}}
		if err := c.Create(ctx, pod); err != nil {
			return nil, err
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: addrs[i].String(), PodIPs: []corev1.PodIP{{IP: addrs[i].String()}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}}}
		if err := c.Status().Update(ctx, pod); err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// modelServers serves a model server's metrics page on every pod address,
// as many stand-ins for simulators: both EPPs scrape the same servers. The
// page is a real simulator's (simulatorPage), histograms and all, so a
// scrape costs what it costs against a model server; only the load gauges
// are the phase's. Saturated makes every pod report a queue that GIE's and
// fleetinfer's defaults call saturated.
type modelServers struct {
	saturated atomic.Bool
	// pages are the page at headroom and saturated.
	pages   [2][]byte
	servers []*http.Server
}

func startModelServers(addrs []netip.Addr, page []byte) (*modelServers, error) {
	m := &modelServers{}
	for i, waiting := range []int{0, 10} {
		p, err := withLoad(page, waiting)
		if err != nil {
			return nil, err
		}
		m.pages[i] = p
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		page := m.pages[0]
		if m.saturated.Load() {
			page = m.pages[1]
		}
		w.Header().Set("Content-Type", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
		_, _ = w.Write(page)
	})
	for _, a := range addrs {
		lis, err := net.Listen("tcp", netip.AddrPortFrom(a, 8000).String())
		if err != nil {
			m.stop()
			return nil, err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		m.servers = append(m.servers, srv)
		go func() { _ = srv.Serve(lis) }()
	}
	return m, nil
}

// withLoad returns page with its load gauges set: waiting requests queued,
// 4 running and the KV cache 30% used.
func withLoad(page []byte, waiting int) ([]byte, error) {
	values := map[string]string{
		"vllm:num_requests_waiting": strconv.Itoa(waiting),
		"vllm:num_requests_running": "4",
		"vllm:kv_cache_usage_perc":  "0.3",
	}
	lines := bytes.SplitAfter(page, []byte("\n"))
	set := map[string]bool{}
	for i, l := range lines {
		name, _, ok := bytes.Cut(l, []byte("{"))
		if !ok {
			continue
		}
		v, ok := values[string(name)]
		if !ok {
			continue
		}
		end := bytes.LastIndexByte(l, ' ')
		if end < 0 {
			return nil, fmt.Errorf("metrics page: no value in %q", l)
		}
		lines[i] = fmt.Appendf(nil, "%s %s\n", l[:end], v)
		set[string(name)] = true
	}
	for name := range values {
		if !set[name] {
			return nil, fmt.Errorf("the simulator's metrics page has no %s", name)
		}
	}
	return bytes.Join(lines, nil), nil
}

// simulatorPage runs one real simulator (the version `make tools` pins),
// completes a request on it so that its histograms hold a sample, and
// returns its metrics page.
func simulatorPage(ctx context.Context, sim, dir string, reg *process.Registry) ([]byte, error) {
	free, err := ports.Free(1)
	if err != nil {
		return nil, err
	}
	p, err := process.Start(process.Spec{Name: "simulator", Path: sim,
		Args: []string{"--model=" + benchPool, "--port=" + portString(free[0]), "--max-num-seqs=4"},
		// The simulator wants its pod's address, as the kubelet gives it.
		Env: []string{"POD_IP=127.0.0.1"}, LogPath: filepath.Join(dir, "simulator.log")}, reg)
	if err != nil {
		return nil, err
	}
	defer p.Stop(time.Second)
	base := "http://127.0.0.1:" + portString(free[0])
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		r := loadgen.Send(ctx, http.DefaultClient, loadgen.Entry{URL: base}, benchPool, "How long is a piece of string?", 8)
		if r.OK() {
			break
		}
		select {
		case <-p.Done():
			// The log goes with the run's directory: quote its end.
			log, _ := os.ReadFile(p.LogPath)
			return nil, fmt.Errorf("the simulator exited: %v; its log ends:\n%s", p.ExitErr(), log[max(len(log)-2048, 0):])
		case <-ctx.Done():
			return nil, fmt.Errorf("no completion from the simulator within 30 s: status %d, %d tokens, %s", r.Status, r.Tokens, r.Err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return httpget.Body(ctx, base+"/metrics", 1<<20)
}

func (m *modelServers) stop() {
	for _, s := range m.servers {
		_ = s.Close()
	}
}

// peerInterval is how often the fake peers re-scrape and publish their pods,
// as a picker does at GIE's default refresh.
const peerInterval = 50 * time.Millisecond

// fakePeer is a real federation server publishing synthetic pod state, as a
// peer EPP would publish its scraped pods: every endpoint is "scraped" each
// interval, and a tenth of them change their queue or KV usage each time.
type fakePeer struct {
	name, identity, addr string
	stop                 func()
}

func startFakePeers(ctx context.Context, ca *federationtest.CA, dir string, n, perPeer int, localIdentity string, interval time.Duration) ([]*fakePeer, error) {
	var peers []*fakePeer
	for i := range n {
		p := &fakePeer{name: fmt.Sprintf("peer-%02d", i), identity: fmt.Sprintf("spiffe://fleetinfer.bench/peer-%02d", i)}
		files, err := ca.WriteFiles(mkdir(filepath.Join(dir, p.name)), p.identity)
		if err != nil {
			return peers, err
		}
		creds, err := federation.LoadCredentials(federation.TLSFiles{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA}, logr.Discard())
		if err != nil {
			return peers, err
		}
		eps := syntheticEndpoints(i, perPeer)
		var mu sync.Mutex
		pctx, cancel := context.WithCancel(ctx)
		go scrapeSynthetic(pctx, eps, &mu, interval, rand.New(rand.NewPCG(uint64(i), 7)))
		pub := federation.NewPublisher(federation.PublisherOptions{
			Pool: types.NamespacedName{Namespace: benchNS, Name: benchPool},
			Local: func() []fwkdl.Endpoint {
				mu.Lock()
				defer mu.Unlock()
				out := make([]fwkdl.Endpoint, len(eps))
				for j, e := range eps {
					out[j] = e
				}
				return out
			},
			Interval: interval, Heartbeat: 100 * time.Millisecond, LaggingAfter: 500 * time.Millisecond,
			Authorize: func(ids []string) (string, bool) {
				for _, id := range ids {
					if id == localIdentity {
						return "local", true
					}
				}
				return "", false
			},
			Log: logr.Discard(),
		})
		srv := grpc.NewServer(grpc.Creds(grpccreds.NewTLS(creds.ServerConfig())))
		federationv1.RegisterFederationServer(srv, pub)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			cancel()
			return peers, err
		}
		p.addr = lis.Addr().String()
		go func() { _ = pub.Run(pctx) }()
		go func() { _ = srv.Serve(lis) }()
		p.stop = func() { cancel(); srv.Stop() }
		peers = append(peers, p)
	}
	return peers, nil
}

func syntheticEndpoints(peer, n int) []*fwkdl.ModelServer {
	eps := make([]*fwkdl.ModelServer, n)
	for j := range n {
		m := fwkdl.NewMetrics()
		m.RunningRequestsSize, m.KVCacheUsagePercent, m.CacheBlockSize, m.CacheNumBlocks, m.UpdateTime = 4, 0.3, 16, 1024, time.Now()
		name := fmt.Sprintf("sim-%03d", j)
		eps[j] = fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{
			NamespacedName: types.NamespacedName{Namespace: benchNS, Name: name + "-rank-0"}, PodName: name,
			Address: netip.AddrFrom4([4]byte{127, byte(41 + peer), byte(j / 250), byte(j%250 + 1)}).String(), Port: "8000",
			Labels: map[string]string{"app": benchPool, "pod-template-hash": "7d9f8c6b5"},
		}, m)
	}
	return eps
}

func scrapeSynthetic(ctx context.Context, eps []*fwkdl.ModelServer, mu *sync.Mutex, interval time.Duration, rng *rand.Rand) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			mu.Lock()
			for _, e := range eps {
				m := e.GetMetrics().Clone()
				m.UpdateTime = now
				if rng.IntN(10) == 0 {
					m.WaitingQueueSize = rng.IntN(4)
					m.KVCacheUsagePercent = float64(rng.IntN(60)) / 100
				}
				e.UpdateMetrics(m)
			}
			mu.Unlock()
		}
	}
}

// peerDirectory is the file the fleetinfer EPP reads.
func peerDirectory(peers []*fakePeer) string {
	s := "peers:\n"
	for _, p := range peers {
		s += fmt.Sprintf("- {cluster: %s, federationAddress: %q, identity: %q}\n", p.name, p.addr, p.identity)
	}
	return s
}

func portString(p int) string { return strconv.Itoa(p) }

var errTimeout = errors.New("timed out")
