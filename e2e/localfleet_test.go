package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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

	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
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
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes); err != nil {
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
