package kubelet

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/fleetinfer/fleetinfer/internal/nodestatus"
)

// A terminated pod's object is deleted even when the API server refuses
// the first attempts (it is restarting): nothing else would delete a
// terminating pod whose deletion event has passed.
func TestFinalDeleteRetriesUntilThePodIsGone(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}}
	cs := fake.NewClientset(pod)
	refusals := 2
	cs.PrependReactor("delete", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		if refusals == 0 {
			return false, nil, nil
		}
		refusals--
		return true, nil, apierrors.NewServiceUnavailable("the API server is starting")
	})
	k := &Kubelet{cs: cs, log: logr.Discard()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k.finalDelete(ctx, pod)
	if refusals != 0 {
		t.Fatalf("%d refusals left: finalDelete gave up", refusals)
	}
	if _, err := cs.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the pod is still there after finalDelete: %v", err)
	}
}

// A node the node lifecycle controller marked Unknown (its lease lapsed
// while the API server was down) turns Ready at the kubelet's next
// heartbeat, as with a real kubelet; a Ready node only has its lease
// renewed.
func TestHeartbeatPostsReadyAgainAfterTheNodeWasMarkedUnknown(t *testing.T) {
	spec := NodeSpec{Name: "gpu-a", GPUs: 4, GPUProduct: "NVIDIA-L40S", GPUMemoryMiB: 46068}
	node, err := spec.object("127.14.0.1", "test")
	if err != nil {
		t.Fatal(err)
	}
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			node.Status.Conditions[i].Status, node.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
		}
	}
	cs := fake.NewClientset(node)
	k := &Kubelet{cs: cs, log: logr.Discard(), opts: Options{Nodes: []NodeSpec{spec}, Version: "test"},
		nodeIPs: map[string]string{"gpu-a": "127.14.0.1"}}
	ctx := context.Background()
	k.beat(ctx)
	got, err := cs.CoreV1().Nodes().Get(ctx, "gpu-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !nodestatus.Ready(got) {
		t.Fatalf("node conditions after a heartbeat: %+v", got.Status.Conditions)
	}
	if _, err := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "gpu-a", metav1.GetOptions{}); err != nil {
		t.Fatalf("no lease after a heartbeat: %v", err)
	}

	statusWrites := 0
	cs.PrependReactor("update", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			statusWrites++
		}
		return false, nil, nil
	})
	k.beat(ctx)
	if statusWrites != 0 {
		t.Errorf("a heartbeat of a Ready node wrote its status %d times", statusWrites)
	}
}
