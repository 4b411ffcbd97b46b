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
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// vllmDeployment is a model-server Deployment as a user would write it for
// the vllm/vllm-openai image, whose entrypoint is "vllm serve".
func vllmDeployment(ns, name string, gpus int64) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name:  "vllm",
					Image: "vllm/vllm-openai:v0.11.0",
					Args:  []string{"facebook/opt-125m", "--served-model-name", "opt-125m", "--port", "8000", "--max-model-len", "4096", "--enforce-eager"},
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}},
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
						HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstrFromString("http")}}, PeriodSeconds: 2},
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
						accelerator.NVIDIA: *resource.NewQuantity(gpus, resource.DecimalSI)}},
				}}},
			},
		},
	}
}

// A vLLM Deployment with a GPU request becomes a Ready pod on a GPU node with
// a loopback address, served by a real simulator process: completions and
// vLLM metrics answer on podIP:8000. Deleting the Deployment stops the process.
func TestModelServerPodServesOnItsPodIPAndStopsWithItsDeployment(t *testing.T) {
	spoke := fl.Spokes[0]
	ns := namespace(t, spoke)
	ctx := context.Background()
	dep := vllmDeployment(ns, "opt", 1)
	if err := spoke.Client.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	pod := readyPod(t, spoke, ns, map[string]string{"app": "opt"})

	var node corev1.Node
	if err := spoke.Client.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, &node); err != nil {
		t.Fatal(err)
	}
	if node.Labels[accelerator.NVIDIAProductLabel] == "" || node.Status.Capacity.Name(accelerator.NVIDIA, resource.DecimalSI).IsZero() {
		t.Fatalf("pod landed on node %s without GPUs: labels %v", node.Name, node.Labels)
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || !netip.MustParsePrefix("127.0.0.0/8").Contains(ip) {
		t.Fatalf("pod IP %q is not a loopback address", pod.Status.PodIP)
	}

	base := "http://" + net.JoinHostPort(pod.Status.PodIP, "8000")
	resp, err := http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"opt-125m","prompt":"Hello from the local fleet","max_tokens":8}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var completion struct {
		Model   string `json:"model"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &completion) != nil || len(completion.Choices) == 0 {
		t.Fatalf("completion: %s %s", resp.Status, body)
	}
	if completion.Model != "opt-125m" {
		t.Errorf("served model %q, want the --served-model-name opt-125m", completion.Model)
	}

	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} {
		if !strings.Contains(string(metrics), m) {
			t.Errorf("metrics lack %s", m)
		}
	}

	pid := processID(t, pod)
	if !running(pid) {
		t.Fatalf("pid %d of the pod is not running", pid)
	}
	if err := spoke.Client.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "pod and process gone", func(ctx context.Context) error {
		err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &corev1.Pod{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod still exists (%v)", err)
		}
		if running(pid) {
			return fmt.Errorf("process %d still running", pid)
		}
		return nil
	})
	if _, err := http.Get(base + "/health"); err == nil {
		t.Errorf("%s still answers after the pod is gone", base)
	}
}

// A pod that asks for more GPUs than any node has is never bound, and the
// scheduler says why in an Event.
func TestPodRequestingMoreGPUsThanAnyNodeStaysPendingWithEvent(t *testing.T) {
	spoke := fl.Spokes[0]
	ns := namespace(t, spoke)
	ctx := context.Background()
	if err := spoke.Client.Create(ctx, vllmDeployment(ns, "too-big", 64)); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	testutil.Eventually(t, 30*time.Second, "FailedScheduling event", func(ctx context.Context) error {
		pods, err := podsOf(ctx, spoke, ns, map[string]string{"app": "too-big"})
		if err != nil || len(pods) != 1 {
			return fmt.Errorf("%d pods (%v)", len(pods), err)
		}
		pod = pods[0]
		var events corev1.EventList
		if err := spoke.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == pod.Name && e.Reason == "FailedScheduling" &&
				strings.Contains(e.Message, "Insufficient nvidia.com/gpu") {
				return nil
			}
		}
		return fmt.Errorf("no FailedScheduling event naming nvidia.com/gpu among %d events", len(events.Items))
	})
	time.Sleep(2 * time.Second)
	if err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
		t.Fatalf("pod phase %s on node %q, want Pending and unbound", pod.Status.Phase, pod.Spec.NodeName)
	}
}

// A container whose image the local kubelet cannot run stays Pending with a
// waiting reason and a Warning event that names the image.
func TestUnknownImageStaysPendingWithReason(t *testing.T) {
	spoke := fl.Spokes[1]
	ns := namespace(t, spoke)
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mystery", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "example.com/mystery:1.0"}}},
	}
	if err := spoke.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "ErrImagePull", func(ctx context.Context) error {
		if err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodPending || len(pod.Status.ContainerStatuses) != 1 {
			return fmt.Errorf("phase %s, statuses %v", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		w := pod.Status.ContainerStatuses[0].State.Waiting
		if w == nil || w.Reason != "ErrImagePull" || !strings.Contains(w.Message, "example.com/mystery:1.0") {
			return fmt.Errorf("waiting state %+v", w)
		}
		var events corev1.EventList
		if err := spoke.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "Failed" && strings.Contains(e.Message, "mystery") {
				return nil
			}
		}
		return fmt.Errorf("no Warning event")
	})
}

// When a model server's process dies, the kubelet restarts it and counts the
// restart; the pod is Ready again on the same address.
func TestDeadProcessIsRestartedAndCounted(t *testing.T) {
	spoke := fl.Spokes[2]
	ns := namespace(t, spoke)
	ctx := context.Background()
	if err := spoke.Client.Create(ctx, vllmDeployment(ns, "crashy", 1)); err != nil {
		t.Fatal(err)
	}
	pod := readyPod(t, spoke, ns, map[string]string{"app": "crashy"})
	pid := processID(t, pod)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "restarted and ready", func(ctx context.Context) error {
		if err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
			return err
		}
		cs := pod.Status.ContainerStatuses[0]
		if cs.RestartCount != 1 || !cs.Ready || cs.LastTerminationState.Terminated == nil {
			return fmt.Errorf("restarts %d ready %v last %+v", cs.RestartCount, cs.Ready, cs.LastTerminationState)
		}
		if processID(t, pod) == pid {
			return fmt.Errorf("same pid")
		}
		return nil
	})
	resp, err := http.Get("http://" + net.JoinHostPort(pod.Status.PodIP, "8000") + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// Every spoke is registered with the hub twice over: a kubeconfig Secret the
// hub can use, and an OCM ManagedCluster whose status carries the spoke's
// GPU capacity.
func TestSpokesAreRegisteredWithTheHub(t *testing.T) {
	ctx := context.Background()
	for _, s := range fl.Spokes {
		var sec corev1.Secret
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: s.Name()}, &sec); err != nil {
			t.Fatal(err)
		}
		if sec.Labels[fleet.KubeconfigSecretLabel] != "true" {
			t.Errorf("secret %s lacks label %s", sec.Name, fleet.KubeconfigSecretLabel)
		}
		cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[fleet.KubeconfigSecretKey])
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.New(cfg, client.Options{Scheme: fleet.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		// The hub's spoke access reads capacity reports, not nodes.
		var capacities fleetv1alpha1.ClusterCapacityList
		if err := c.List(ctx, &capacities); err != nil {
			t.Fatalf("hub cannot use the kubeconfig of %s: %v", s.Name(), err)
		}
		want := 0
		for _, n := range s.Spec.Nodes {
			want += n.GPUs
		}
		var mc clusterv1.ManagedCluster
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Name: s.Name()}, &mc); err != nil {
			t.Fatal(err)
		}
		if !meta.IsStatusConditionTrue(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable) {
			t.Errorf("%s not Available: %v", s.Name(), mc.Status.Conditions)
		}
		gpus := mc.Status.Allocatable[clusterv1.ResourceName(accelerator.NVIDIA)]
		if gpus.Value() != int64(want) {
			t.Errorf("%s allocatable GPUs %s, want %d", s.Name(), gpus.String(), want)
		}
	}
}

// processID reads the PID the local kubelet puts in the container ID.
func processID(t *testing.T, pod corev1.Pod) int {
	t.Helper()
	id := pod.Status.ContainerStatuses[0].ContainerID
	pid, err := strconv.Atoi(strings.TrimPrefix(id, "localfleet://"))
	if err != nil {
		t.Fatalf("container ID %q has no PID", id)
	}
	return pid
}

func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited; only its parent has not reaped it yet.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// httpFrom is an HTTP client whose connections leave from source, as a
// process of the cluster that owns that address; keep-alive reuses one
// connection for consecutive requests.
func httpFrom(source netip.Addr, timeout time.Duration) *http.Client {
	d := &net.Dialer{Timeout: time.Second}
	if source.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: source.AsSlice()}
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 1}}
}

// getHealth sends GET /health with Host host and says how long it took.
func getHealth(c *http.Client, base, host string) (time.Duration, error) {
	req, err := http.NewRequest(http.MethodGet, base+"/health", nil)
	if err != nil {
		return 0, err
	}
	req.Host = host
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s", resp.Status)
	}
	return time.Since(start), nil
}

// medianHealth is the median time of n GET /health on one kept-alive
// connection, after one request that opens it.
func medianHealth(t *testing.T, c *http.Client, base, host string, n int) time.Duration {
	t.Helper()
	var ds []time.Duration
	for i := range n + 1 {
		d, err := getHealth(c, base, host)
		if err != nil {
			t.Fatalf("GET %s/health (Host %s): %v", base, host, err)
		}
		if i > 0 {
			ds = append(ds, d)
		}
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// The clusters of the local fleet are apart. With the default matrix and
// isolated pod networks, a process of cluster A cannot reach a pod address
// of cluster B (the connection is reset); it reaches B's gateway and B's
// LoadBalancer addresses, and each round trip pays link(A, B)'s RTT. A black
// hole between A and B makes connections hang without a reset until it
// heals. The hub reaches every spoke's API server through its own link.
func TestClustersAreApartOnTheWAN(t *testing.T) {
	ctx := context.Background()
	a, b := fl.Spokes[0], fl.Spokes[1]
	if fl.PodNetwork() != wan.Isolated {
		t.Fatalf("the shared fleet runs pod network %q, want the default %q", fl.PodNetwork(), wan.Isolated)
	}
	rtt, err := fl.Fabric().Link(a.Name(), b.Name())
	if err != nil {
		t.Fatal(err)
	}
	fromA := fleet.GatewayAddress(a.NetworkIndex)
	ns := namespace(t, b)
	dep := vllmDeployment(ns, "apart", 1)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "apart", Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "apart"}, Ports: []corev1.ServicePort{{Port: 8000}}}}
	lb := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "apart-lb", Namespace: ns}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "apart"},
		Ports: []corev1.ServicePort{{Port: 18000, TargetPort: intstrFromString("http")}}}}
	const host = "apart.test"
	route := fedpool.Route(ns, "apart", host, gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
		BackendObjectReference: gatewayv1.BackendObjectReference{Name: "apart", Port: ptr.To(gatewayv1.PortNumber(8000))}}}}})
	for _, obj := range []client.Object{dep, svc, lb, route} {
		if err := b.Client.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	pod := readyPod(t, b, ns, map[string]string{"app": "apart"})
	if err := fedpool.RouteAccepted(ctx, b, ns, "apart", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	podBase := "http://" + net.JoinHostPort(pod.Status.PodIP, "8000")

	t.Run("another cluster's pod address is unreachable, the cluster's own is not", func(t *testing.T) {
		refused := fl.Fabric().Stats(a.Name(), b.Name()).Refused
		if _, err := getHealth(httpFrom(fromA, 2*time.Second), podBase, ""); err == nil {
			t.Fatalf("%s reached %s's pod at %s", a.Name(), b.Name(), podBase)
		} else if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("error %v, want a connection reset", err)
		}
		if got := fl.Fabric().Stats(a.Name(), b.Name()).Refused - refused; got != 1 {
			t.Errorf("fabric counted %d refused connections from %s to %s, want 1", got, a.Name(), b.Name())
		}
		if _, err := getHealth(httpFrom(fleet.GatewayAddress(b.NetworkIndex), 2*time.Second), podBase, ""); err != nil {
			t.Errorf("%s's own address does not reach its pod: %v", b.Name(), err)
		}
	})

	fromAClient := httpFrom(fromA, 5*time.Second)
	t.Run("another cluster's gateway answers after the link's round trip", func(t *testing.T) {
		direct := medianHealth(t, httpFrom(netip.Addr{}, 5*time.Second), b.GatewayURL(), host, 9)
		linked := medianHealth(t, fromAClient, b.GatewayURL(), host, 9)
		extra := linked - direct
		lo, hi := time.Duration(float64(rtt.RTT)*0.8), time.Duration(float64(rtt.RTT)*1.2)
		t.Logf("GET /health through %s's gateway: %s from %s, %s from outside the clusters: the link adds %s (RTT %s)",
			b.Name(), linked, a.Name(), direct, extra, rtt.RTT)
		if extra < lo || extra > hi {
			t.Errorf("the link adds %s to a round trip, want %s ±20%% [%s, %s]", extra, rtt.RTT, lo, hi)
		}
	})

	t.Run("a black hole hangs connections without a reset until it heals", func(t *testing.T) {
		if err := fl.Fabric().BlackHole(a.Name(), b.Name()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fl.Fabric().Heal(a.Name(), b.Name()) })
		c := httpFrom(fromA, 700*time.Millisecond)
		c.Transport = fromAClient.Transport // the connection opened before the hole
		for _, tc := range []struct {
			name string
			c    *http.Client
		}{{"open connection", c}, {"new connection", httpFrom(fromA, 700*time.Millisecond)}} {
			_, err := getHealth(tc.c, b.GatewayURL(), host)
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("%s during the black hole: %v, want a timeout", tc.name, err)
			}
		}
		if err := fl.Fabric().Heal(a.Name(), b.Name()); err != nil {
			t.Fatal(err)
		}
		if _, err := getHealth(httpFrom(fromA, 2*time.Second), b.GatewayURL(), host); err != nil {
			t.Errorf("after healing: %v", err)
		}
	})

	t.Run("a LoadBalancer Service is reachable from another cluster through the link", func(t *testing.T) {
		var ip netip.Addr
		testutil.Eventually(t, 20*time.Second, "load-balancer address", func(ctx context.Context) error {
			if err := b.Client.Get(ctx, client.ObjectKeyFromObject(lb), lb); err != nil {
				return err
			}
			if in := lb.Status.LoadBalancer.Ingress; len(in) == 1 {
				ip, err = netip.ParseAddr(in[0].IP)
				return err
			}
			return fmt.Errorf("ingress %+v", lb.Status.LoadBalancer.Ingress)
		})
		if !fleet.LoadBalancerPool(b.NetworkIndex).Contains(ip) {
			t.Fatalf("load-balancer address %s is outside %s's pool %s", ip, b.Name(), fleet.LoadBalancerPool(b.NetworkIndex))
		}
		before := fl.Fabric().Stats(a.Name(), b.Name()).Accepted
		took := medianHealth(t, httpFrom(fromA, 5*time.Second), "http://"+net.JoinHostPort(ip.String(), "18000"), "", 5)
		if took < time.Duration(float64(rtt.RTT)*0.8) {
			t.Errorf("GET /health through the load balancer took %s, less than the link's RTT %s", took, rtt.RTT)
		}
		if n := fl.Fabric().Stats(a.Name(), b.Name()).Accepted - before; n != 1 {
			t.Errorf("%d connections from %s to %s through the link, want 1", n, a.Name(), b.Name())
		}
	})

	t.Run("the hub reaches every spoke through its link", func(t *testing.T) {
		for _, s := range fl.Spokes {
			var sec corev1.Secret
			if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: s.Name()}, &sec); err != nil {
				t.Fatal(err)
			}
			cfg, err := clientcmd.RESTConfigFromKubeConfig(sec.Data[fleet.KubeconfigSecretKey])
			if err != nil {
				t.Fatal(err)
			}
			if want := "https://" + fleet.APIAddress(s.NetworkIndex).String(); cfg.Host != want {
				t.Errorf("the hub reaches %s at %s, want %s", s.Name(), cfg.Host, want)
			}
			var mc clusterv1.ManagedCluster
			if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Name: s.Name()}, &mc); err != nil {
				t.Fatal(err)
			}
			if !meta.IsStatusConditionTrue(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable) {
				t.Errorf("%s not Available: %v", s.Name(), mc.Status.Conditions)
			}
			if st := fl.Fabric().Stats(fleet.HubCluster, s.Name()); st.Accepted == 0 || st.BytesFromTarget == 0 {
				t.Errorf("no hub traffic crossed the link to %s: %+v", s.Name(), st)
			}
		}
	})
}

// fleetinfer's components run from the images in the fleet's registry: the
// hub and spoke controllers the fleet starts, and a picker pod named by tag
// or by digest, which reports the registry's index digest as its imageID.
// (TestMain fails the package if any component ran from a plain binary.)
func TestComponentsRunFromTheRegistrysImages(t *testing.T) {
	if bad := fl.NotFromImages(); len(bad) > 0 {
		t.Errorf("run from binaries, not the registry's images: %v", bad)
	}
	spoke := fl.Spokes[0]
	ns := namespace(t, spoke)
	ctx := context.Background()
	createPickerRBAC(t, spoke, ns)
	tag := fl.Image("epp")
	digest := fl.ImageDigests[tag]
	if digest == "" {
		t.Fatalf("the fleet's registry has no %s: %v", tag, fl.ImageDigests)
	}
	repo, _, _ := strings.Cut(tag, ":")
	pods := map[string]string{"by-tag": tag, "by-digest": repo + "@" + digest}
	for pool, image := range pods {
		if err := spoke.Client.Create(ctx, fedpool.EPPPod(ns, pool, image)); err != nil {
			t.Fatal(err)
		}
	}
	for pool := range pods {
		testutil.Eventually(t, 60*time.Second, pool+" picker started from the image", func(ctx context.Context) error {
			pod := &corev1.Pod{}
			if err := spoke.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fedpool.EPPName(pool)}, pod); err != nil {
				return err
			}
			if len(pod.Status.ContainerStatuses) != 1 || pod.Status.ContainerStatuses[0].State.Waiting != nil {
				return fmt.Errorf("containers %+v", pod.Status.ContainerStatuses)
			}
			if got, want := pod.Status.ContainerStatuses[0].ImageID, repo+"@"+digest; got != want {
				return fmt.Errorf("imageID %q, want %q", got, want)
			}
			return nil
		})
	}
	if bad := fl.NotFromImages(); len(bad) > 0 {
		t.Errorf("run from binaries, not the registry's images: %v", bad)
	}
}

// A container that fails at start says why where users look: under
// FallbackToLogsOnError the kubelet puts its log's tail in the terminated
// state's message, which `kubectl describe pod` shows.
func TestAFailedContainersStatusCarriesItsLogTail(t *testing.T) {
	spoke := fl.Spokes[0]
	ns := namespace(t, spoke)
	ctx := context.Background()
	createPickerRBAC(t, spoke, ns)
	if err := spoke.Client.Create(ctx, fedpool.EPPPod(ns, "misconfigured", fl.Image("epp"), "--no-such-flag")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, "the failed picker's message", func(ctx context.Context) error {
		pod := &corev1.Pod{}
		if err := spoke.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fedpool.EPPName("misconfigured")}, pod); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodFailed || len(pod.Status.ContainerStatuses) != 1 {
			return fmt.Errorf("phase %s, containers %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		term := pod.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode == 0 || !strings.Contains(term.Message, "no-such-flag") {
			return fmt.Errorf("terminated state %+v", term)
		}
		return nil
	})
}

// createPickerRBAC gives namespace ns the picker's ServiceAccount and role.
func createPickerRBAC(t *testing.T, spoke *fleet.Cluster, ns string) {
	t.Helper()
	for _, o := range fedpool.EPPRBAC(ns) {
		if err := spoke.Client.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
}
