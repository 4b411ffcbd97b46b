package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
)

// KServe's data-parallel sample for GCP a3-highgpu-8g machines (DeepSeek
// with data 16 / dataLocal 8: a leader and one worker of 8 GPUs each,
// scheduler and gateway route).
const multiNodeSample = "../apis/serving/v1alpha2/testdata/kserve-v0.20.0/samples/dp-ep__deepseek-r1-gpu-rdma-roce__llm-inference-service-dp-ep-deepseek-r1-gpu-naive.0.yaml"

// KServe's multi-node sample, applied unchanged to the spoke with two 8-GPU
// nodes, becomes Ready through the spoke controller and the LeaderWorkerSet
// controller: the LeaderWorkerSet's webhooks give the group's pods their
// labels and environment, the leader and its worker run on a GPU node each,
// a completion sent to the service's URL is served by the leader (the worker
// is a headless vLLM rank, faked by the local kubelet as a process that only
// stays up), and deleting the service removes the LeaderWorkerSet and every
// pod of the group.
func TestKServeMultiNodeSampleRunsAsALeaderWorkerSet(t *testing.T) {
	allGPUsFree(t) // the group takes both of east's nodes whole
	spoke := fl.Spoke("east")
	ctx := context.Background()
	ns := namespace(t, spoke)
	// The sample's prerequisite: the service account its pods run as (in
	// KServe's guide it carries the Hugging Face token; there are no
	// weights to fetch here).
	if err := spoke.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "hfsa", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	name := applySample(t, spoke, multiNodeSample, ns)
	began := time.Now()
	svc := serviceReady(t, spoke, ns, name, 3*time.Minute)
	t.Logf("Ready after %s", time.Since(began).Round(100*time.Millisecond))

	lwsName := name + "-kserve-mn"
	lws := &lwsv1.LeaderWorkerSet{}
	if err := spoke.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: lwsName}, lws); err != nil {
		t.Fatal(err)
	}
	if size := *lws.Spec.LeaderWorkerTemplate.Size; size != 2 {
		t.Errorf("group size %d, want data/dataLocal = 2", size)
	}
	group, err := podsOf(ctx, spoke, ns, map[string]string{lwsv1.SetNameLabelKey: lwsName})
	if err != nil {
		t.Fatal(err)
	}
	if len(group) != 2 {
		t.Fatalf("%d pods in the group, want a leader and a worker; LeaderWorkerSet status %+v; service conditions %+v",
			len(group), lws.Status, svc.Status.Conditions)
	}
	var leader, worker corev1.Pod
	nodes := map[string]bool{}
	for _, p := range group {
		// The pod webhook labels each pod with its index in the group and
		// gives its containers the group's environment.
		switch p.Labels[lwsv1.WorkerIndexLabelKey] {
		case "0":
			leader = p
		case "1":
			worker = p
		}
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s is %s", p.Name, p.Status.Phase)
		}
		node := &corev1.Node{}
		if err := spoke.Client.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, node); err != nil {
			t.Fatalf("pod %s node %q: %v", p.Name, p.Spec.NodeName, err)
		}
		if node.Labels[accelerator.NVIDIAProductLabel] == "" {
			t.Errorf("pod %s runs on %s, not a GPU node", p.Name, node.Name)
		}
		nodes[node.Name] = true
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 {
				t.Errorf("pod %s container %s restarted %d times", p.Name, cs.Name, cs.RestartCount)
			}
		}
	}
	if leader.Name == "" || worker.Name == "" {
		t.Fatalf("no leader and worker among %s and %s (worker-index labels)", group[0].Name, group[1].Name)
	}
	t.Logf("leader %s on %s (%s), worker %s on %s (%s)", leader.Name, leader.Spec.NodeName, leader.Status.PodIP,
		worker.Name, worker.Spec.NodeName, worker.Status.PodIP)
	if len(nodes) != 2 {
		t.Errorf("leader and worker share a node; each needs all 8 GPUs of one")
	}
	wantAddress := fmt.Sprintf("%s-0.%s.%s", lwsName, lwsName, ns)
	for _, p := range group {
		env := map[string]string{}
		for _, e := range container(t, p, "main").Env {
			env[e.Name] = e.Value
		}
		if env[lwsv1.LwsLeaderAddress] != wantAddress || env[lwsv1.LwsGroupSize] != "2" || env[lwsv1.LwsWorkerIndex] != p.Labels[lwsv1.WorkerIndexLabelKey] {
			t.Errorf("pod %s group environment: leader address %q (want %q), size %q, index %q", p.Name,
				env[lwsv1.LwsLeaderAddress], wantAddress, env[lwsv1.LwsGroupSize], env[lwsv1.LwsWorkerIndex])
		}
	}
	if !strings.Contains(strings.Join(container(t, worker, "main").Command, " "), "--headless") {
		t.Errorf("worker is not a headless vLLM: %q", container(t, worker, "main").Command)
	}
	// Nothing listens on the worker: requests can only reach the leader.
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort(worker.Status.PodIP, "8000"), time.Second); err == nil {
		conn.Close()
		t.Errorf("the headless worker %s answers on %s:8000", worker.Name, worker.Status.PodIP)
	}
	readyPod(t, spoke, ns, map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/component": "llminferenceservice-router-scheduler"})

	url := ""
	if svc.Status.URL != nil {
		url = *svc.Status.URL
	}
	if !strings.HasPrefix(url, "http://127.") {
		t.Fatalf("status.url %q is not the gateway's", url)
	}
	header := complete(t, url, `{"model":"deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct","prompt":"Eight GPUs per node, and","max_tokens":6}`)
	// The simulator names the pod that served in x-inference-pod.
	if served := header.Get("x-inference-pod"); served != leader.Name {
		t.Errorf("completion served by %q, want the leader %s", served, leader.Name)
	}

	began = time.Now()
	if err := spoke.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 2*time.Minute, "LeaderWorkerSet, StatefulSets and pods gone", func(ctx context.Context) error {
		err := spoke.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: lwsName}, &lwsv1.LeaderWorkerSet{})
		if !apierrors.IsNotFound(err) {
			return errors.Join(errors.New("LeaderWorkerSet still there"), err)
		}
		var sets appsv1.StatefulSetList
		if err := spoke.Client.List(ctx, &sets, client.InNamespace(ns)); err != nil || len(sets.Items) > 0 {
			return fmt.Errorf("%d StatefulSets left (%v)", len(sets.Items), err)
		}
		pods, err := podsOf(ctx, spoke, ns, nil)
		if err != nil || len(pods) > 0 {
			return fmt.Errorf("%d pods left (%v)", len(pods), err)
		}
		return nil
	})
	t.Logf("service, LeaderWorkerSet and pods gone %s after the delete", time.Since(began).Round(100*time.Millisecond))
}

func container(t *testing.T, p corev1.Pod, name string) corev1.Container {
	t.Helper()
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("pod %s has no container %s", p.Name, name)
	return corev1.Container{}
}
