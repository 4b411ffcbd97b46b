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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fleetinfer/fleetinfer/e2e/fleet"
	"github.com/fleetinfer/fleetinfer/e2e/gateway/extproc"
	"github.com/fleetinfer/fleetinfer/e2e/metrics"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
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

// fedCluster is the pool in one cluster.
type fedCluster struct {
	c        *fleet.Cluster
	identity string
	mode     federation.Mode
	epp      corev1.Pod
	pods     []string // model-server ip:port
	picker   *extproc.Client
}

func (f *fedCluster) eppAddr(port int) string {
	return net.JoinHostPort(f.epp.Status.PodIP, strconv.Itoa(port))
}

// gatewayAddr is host:port of the cluster gateway's peer listener, where
// Parent-mode requests from other clusters arrive.
func (f *fedCluster) gatewayAddr() string {
	return strings.TrimPrefix(f.c.GatewayPeerURL(), "http://")
}

// startFederation deploys the pool in every spoke and waits until each EPP
// holds its peers' pods.
func startFederation(t *testing.T, simArgs map[string]string, replicas map[string]int32) (string, map[string]*fedCluster, *federationtest.CA) {
	t.Helper()
	ctx := context.Background()
	ns := fmt.Sprintf("epp-fed-%d", time.Now().UnixNano()%100000)
	ca, err := federationtest.NewCA("fleetinfer-test")
	if err != nil {
		t.Fatal(err)
	}
	modes := []federation.Mode{federation.ModeEndpoint, federation.ModeEndpoint, federation.ModeParent}
	clusters := map[string]*fedCluster{}
	for i, s := range fl.Spokes {
		f := &fedCluster{c: s, identity: "spiffe://fleetinfer.test/" + s.Name() + "/epp", mode: modes[i]}
		clusters[s.Name()] = f
		cert, key, err := ca.Issue(f.identity)
		if err != nil {
			t.Fatal(err)
		}
		objs := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}
		objs = append(objs, gwEPPRBAC(ns)...)
		objs = append(objs,
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "federation-tls", Namespace: ns},
				Data: map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": ca.PEM}},
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "epp", Namespace: ns},
				Data: map[string]string{"config.yaml": fedEPPConfig, "peers.yaml": "peers: []\n"}},
			fedModelServer(ns, replicas[s.Name()], simArgs[s.Name()]),
			&inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: fedPool, Namespace: ns},
				Spec: inferencev1.InferencePoolSpec{
					Selector:    inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": fedPool}},
					TargetPorts: []inferencev1.Port{{Number: 8000}},
					EndpointPickerRef: inferencev1.EndpointPickerRef{Name: fedPool + "-epp", Port: &inferencev1.Port{Number: 9002},
						FailureMode: inferencev1.EndpointPickerFailOpen},
				}},
			fedEPPPod(ns, s.Name()),
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fedPool + "-epp", Namespace: ns},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": fedPool + "-epp"},
					Ports: []corev1.ServicePort{{Name: "grpc", Port: 9002, TargetPort: intstrFromString("grpc")}}}},
			// The same route in every cluster: a request forwarded in Parent
			// mode keeps its host and meets the pool again at the peer.
			gwRoute(ns, fedPool, fedHost(ns), gatewayv1.HTTPRouteRule{Matches: gwPrefixMatch("/"), BackendRefs: gwPoolBackend(fedPool)}))
		for _, o := range objs {
			if err := s.Client.Create(ctx, o); err != nil {
				t.Fatalf("%s: create %T: %v", s.Name(), o, err)
			}
		}
	}
	// The directory needs the EPPs' pod addresses, so it is written once
	// they are known; the EPPs reload it.
	var dir strings.Builder
	dir.WriteString("peers:\n")
	for _, s := range fl.Spokes {
		f := clusters[s.Name()]
		eventually(t, 60*time.Second, s.Name()+" EPP ready", func(ctx context.Context) error {
			if err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fedPool + "-epp"}, &f.epp); err != nil {
				return err
			}
			if !gwPodReady(&f.epp) {
				return fmt.Errorf("EPP pod %s, containers %+v", f.epp.Status.Phase, f.epp.Status.ContainerStatuses)
			}
			return nil
		})
		fmt.Fprintf(&dir, "- {cluster: %s, pool: {namespace: %s, name: %s}, federationAddress: %q, gatewayAddress: %q, identity: %q, mode: %s}\n",
			s.Name(), ns, fedPool, f.eppAddr(9004), f.gatewayAddr(), f.identity, f.mode)
		if f.picker, err = extproc.Dial(f.eppAddr(9002)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.picker.Close() })
	}
	for _, s := range fl.Spokes {
		eventually(t, 30*time.Second, s.Name()+" route accepted", func(ctx context.Context) error {
			var r gatewayv1.HTTPRoute
			if err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fedPool}, &r); err != nil {
				return err
			}
			for _, p := range r.Status.Parents {
				if meta.IsStatusConditionTrue(p.Conditions, string(gatewayv1.RouteConditionAccepted)) {
					return nil
				}
			}
			return fmt.Errorf("route parents %+v", r.Status.Parents)
		})
		cm := &corev1.ConfigMap{}
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epp"}, cm); err != nil {
			t.Fatal(err)
		}
		cm.Data["peers.yaml"] = dir.String()
		if err := s.Client.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range fl.Spokes {
		f := clusters[s.Name()]
		eventually(t, 60*time.Second, s.Name()+" model servers ready", func(ctx context.Context) error {
			pods, err := podsOf(ctx, s, ns, map[string]string{"app": fedPool})
			if err != nil {
				return err
			}
			f.pods = nil
			for _, p := range pods {
				if gwPodReady(&p) {
					f.pods = append(f.pods, net.JoinHostPort(p.Status.PodIP, "8000"))
				}
			}
			if len(f.pods) != int(replicas[s.Name()]) {
				return fmt.Errorf("%d of %d ready", len(f.pods), replicas[s.Name()])
			}
			return nil
		})
	}
	for _, s := range fl.Spokes {
		f := clusters[s.Name()]
		eventually(t, 30*time.Second, s.Name()+" EPP holds its peers' pods", func(ctx context.Context) error {
			m, err := eppMetrics(ctx, f)
			if err != nil {
				return err
			}
			for _, peer := range fl.Spokes {
				if peer == s {
					continue
				}
				want := float64(replicas[peer.Name()])
				if got := m[`fleetinfer_epp_federation_remote_endpoints{peer="`+peer.Name()+`"}`]; got != want {
					return fmt.Errorf("%s: %v remote endpoints, want %v", peer.Name(), got, want)
				}
			}
			return nil
		})
	}
	return ns, clusters, ca
}

func fedHost(ns string) string { return fedPool + "." + ns + ".test" }

func fedModelServer(ns string, replicas int32, simArgs string) *appsv1.Deployment {
	d := vllmDeployment(ns, fedPool, 0)
	d.Spec.Replicas = ptr.To(replicas)
	c := &d.Spec.Template.Spec.Containers[0]
	c.Args = []string{"llama", "--port", "8000", "--max-model-len", "4096"}
	c.Resources = corev1.ResourceRequirements{}
	c.Env = []corev1.EnvVar{{Name: "FLEETINFER_SIM_ARGS", Value: simArgs}}
	return d
}

// fedEPPPod is a bare pod so that a killed EPP stays dead.
func fedEPPPod(ns, cluster string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fedPool + "-epp", Namespace: ns, Labels: map[string]string{"app": fedPool + "-epp"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: "epp", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "epp", Image: "ghcr.io/fleetinfer/epp:dev",
				Args: []string{"--pool-name=" + fedPool, "--pool-namespace=" + ns, "--grpc-port=9002", "--grpc-health-port=9003",
					"--metrics-port=9090", "--secure-serving=false", "--tracing=false", "--metrics-endpoint-auth=false",
					"--enable-pprof=false", "--v=1", "--config-file=/etc/epp/config.yaml",
					"--federation-cluster=" + cluster, "--federation-port=9004", "--federation-peers-file=/etc/epp/peers.yaml",
					"--federation-cert-file=/etc/federation/tls.crt", "--federation-key-file=/etc/federation/tls.key",
					"--federation-ca-file=/etc/federation/ca.crt"},
				Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 9002}, {Name: "grpc-health", ContainerPort: 9003},
					{Name: "metrics", ContainerPort: 9090}, {Name: "federation", ContainerPort: 9004}},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 2, ProbeHandler: corev1.ProbeHandler{
					GRPC: &corev1.GRPCAction{Port: 9003, Service: ptr.To("envoy.service.ext_proc.v3.ExternalProcessor")}}},
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/epp"}, {Name: "tls", MountPath: "/etc/federation"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "epp"}}}},
				{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "federation-tls"}}},
			},
		},
	}
}

// eppMetrics scrapes the EPP's Prometheus endpoint into series → value.
func eppMetrics(ctx context.Context, f *fedCluster) (map[string]float64, error) {
	return metrics.Scrape(ctx, "http://"+f.eppAddr(9090)+"/metrics")
}

func fedCompletion(prompt string) *extproc.Request {
	body := fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":8}`, prompt)
	return &extproc.Request{Path: "/v1/completions", Header: http.Header{"Content-Type": {"application/json"},
		"Content-Length": {strconv.Itoa(len(body))}}, Body: strings.NewReader(body)}
}

func pick(t *testing.T, f *fedCluster, req *extproc.Request) *extproc.Pick {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := f.picker.Pick(ctx, req)
	if err != nil {
		t.Fatalf("%s: pick: %v", f.c.Name(), err)
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
	// east's two pods take one request at a time, slowly, so that a few
	// concurrent completions make vllm:num_requests_waiting move.
	simArgs := map[string]string{
		"east":    "--max-num-seqs=1 --time-to-first-token=200ms --inter-token-latency=50ms",
		"west":    "--max-num-seqs=8",
		"central": "--max-num-seqs=8",
	}
	ns, clusters, ca := startFederation(t, simArgs, map[string]int32{"east": 2, "west": 1, "central": 1})
	east, west, central := clusters["east"], clusters["west"], clusters["central"]
	t.Logf("namespace %s; east pods %v, west %v, central %v", ns, east.pods, west.pods, central.pods)

	t.Run("local pick carries the destination header and envoy.lb metadata", func(t *testing.T) {
		p := pick(t, east, fedCompletion("hello"))
		if p.Immediate != nil || !slices.Contains(east.pods, p.Primary()) {
			t.Fatalf("pick %q (immediate %v), want one of east's pods %v", p.Destination, p.Immediate, east.pods)
		}
		md := p.DynamicMetadata.GetFields()[extproc.LBNamespace].GetStructValue().GetFields()[extproc.DestinationHeader].GetStringValue()
		if md != p.Destination {
			t.Fatalf("envoy.lb metadata %q differs from the header %q", md, p.Destination)
		}
	})

	t.Run("no spill while local pods have headroom", func(t *testing.T) {
		for i := range 20 {
			if p := pick(t, east, fedCompletion(fmt.Sprint("idle ", i))); !slices.Contains(east.pods, p.Primary()) {
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
			{"certificate from another CA", other, west.identity, true, codes.Unavailable},
			{"identity not in the peer directory", ca, "spiffe://fleetinfer.test/intruder", true, codes.PermissionDenied},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if got := status.Code(subscribeAs(t, east, tc.ca, tc.id, tc.cert)); got != tc.want {
					t.Fatalf("subscription ended with %v, want %v", got, tc.want)
				}
			})
		}
	})

	stop := load(east.pods, 3, 90*time.Second)
	defer stop()
	seen := map[string]*extproc.Pick{}
	t.Run("spill to remote clusters when local pods are saturated", func(t *testing.T) {
		eventually(t, 30*time.Second, "picks in both remote clusters", func(context.Context) error {
			p := pick(t, east, fedCompletion("spill"))
			switch {
			case slices.Contains(west.pods, p.Primary()):
				seen["west"] = p
			case p.Primary() == central.gatewayAddr():
				seen["central"] = p
			}
			if len(seen) < 2 {
				return fmt.Errorf("last pick %q; remote clusters picked so far: %d", p.Destination, len(seen))
			}
			return nil
		})
	})

	t.Run("Parent mode names the pod as subset hint and the remote EPP honours it", func(t *testing.T) {
		p := seen["central"]
		if p == nil || !slices.Equal(p.Subset, central.pods) {
			t.Fatalf("parent-mode pick %+v, want subset %v", p, central.pods)
		}
		// What central's gateway sends its EPP for the forwarded request.
		req := fedCompletion("forwarded")
		req.Subset = p.Subset
		if got := pick(t, central, req); got.Primary() != central.pods[0] {
			t.Fatalf("hinted pick %q, want %s", got.Destination, central.pods[0])
		}
	})

	t.Run("a hint for a pod that is gone falls back to the remote EPP's own pick (FailOpen)", func(t *testing.T) {
		req := fedCompletion("stale hint")
		req.Subset = []string{net.JoinHostPort(central.epp.Status.PodIP, "8000")}
		if got := pick(t, central, req); got.Immediate != nil || !slices.Contains(central.pods, got.Primary()) {
			t.Fatalf("pick %q (immediate %v), want one of central's pods", got.Destination, got.Immediate)
		}
	})

	t.Run("requests entering east's gateway are served in west (Endpoint mode) and central (Parent mode)", func(t *testing.T) {
		served := map[string]string{} // cluster → pod
		names := map[string]string{}
		for _, f := range []*fedCluster{west, central} {
			pods, err := podsOf(context.Background(), f.c, ns, map[string]string{"app": fedPool})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range pods {
				names[p.Name] = f.c.Name()
			}
		}
		for i := 0; i < 40 && len(served) < 2; i++ {
			resp, body := gwPost(t, east.c.GatewayURL(), fedHost(ns), "/v1/completions",
				[]byte(fmt.Sprintf(`{"model":"llama","prompt":"through the gateway %d","max_tokens":2}`, i)), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %s", resp.Status, body)
			}
			pod := resp.Header.Get(gwPodHeader)
			if cluster, ok := names[pod]; ok {
				served[cluster] = pod
			}
		}
		if len(served) != 2 {
			t.Fatalf("served remotely by %v, want a pod of west and of central", served)
		}
	})

	t.Run("a killed peer's pods are no longer picked within 3 s", func(t *testing.T) {
		pid, err := strconv.Atoi(strings.TrimPrefix(west.epp.Status.ContainerStatuses[0].ContainerID, "localfleet://"))
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		var lastWest time.Duration
		for time.Since(killed) < 4*time.Second {
			if p := pick(t, east, fedCompletion("after the kill")); slices.Contains(west.pods, p.Primary()) {
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
			if err := f.c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: fedPool}, &d); err != nil {
				t.Fatal(err)
			}
			d.Spec.Replicas = ptr.To(int32(0))
			if err := f.c.Client.Update(context.Background(), &d); err != nil {
				t.Fatal(err)
			}
		}
		eventually(t, 30*time.Second, "503 without pods", func(context.Context) error {
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
	conn, err := grpc.NewClient("passthrough:///"+f.eppAddr(9004), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := federationv1.NewFederationClient(conn).Subscribe(ctx, &federationv1.SubscribeRequest{PoolNamespace: f.epp.Namespace, PoolName: fedPool})
	if err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}
