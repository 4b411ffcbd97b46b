package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// namespace creates a namespace named after the test on cluster c; on a
// hub, bound to every cluster.
func namespace(t *testing.T, c *fleet.Cluster) string {
	t.Helper()
	name := testutil.NewNamespace(t, c.Client)
	if c.Name() == fleet.HubName {
		// The hub places a namespace's services only on clusters bound to
		// it; the tests of tenancy make namespaces of their own.
		if err := fleet.BindEveryCluster(context.Background(), c.Client, name); err != nil {
			t.Fatal(err)
		}
	}
	// Tests share the fleet and some count free GPUs: a test's pods go with
	// it.
	t.Cleanup(func() {
		_ = c.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		noPods(t, c, name, nil)
	})
	return name
}

// noPods waits until namespace ns of cluster c has no pods (with labels)
// left.
func noPods(t *testing.T, c *fleet.Cluster, ns string, labels map[string]string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, "pods of "+ns+" gone from "+c.Name(), func(ctx context.Context) error {
		pods, err := podsOf(ctx, c, ns, labels)
		if err != nil || len(pods) > 0 {
			return fmt.Errorf("%d pods left (%v)", len(pods), err)
		}
		return nil
	})
}

// podsOf lists the pods of namespace ns matching labels.
func podsOf(ctx context.Context, c *fleet.Cluster, ns string, labels map[string]string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := c.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels(labels))
	return pods.Items, err
}

// readyPod waits for exactly one Ready pod with the labels and returns it.
func readyPod(t *testing.T, c *fleet.Cluster, ns string, labels map[string]string) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	testutil.Eventually(t, 60*time.Second, "pod ready", func(ctx context.Context) error {
		pods, err := podsOf(ctx, c, ns, labels)
		if err != nil {
			return err
		}
		if len(pods) != 1 {
			return fmt.Errorf("%d pods", len(pods))
		}
		pod = pods[0]
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("pod %s phase %s, containers %+v", pod.Name, pod.Status.Phase, pod.Status.ContainerStatuses)
	})
	return pod
}

func intstrFromString(s string) intstr.IntOrString { return intstr.FromString(s) }

// podNetwork switches the shared fleet's pod network to mode for the rest
// of the test: a test that needs pod addresses reachable across clusters
// (Endpoint mode) runs in flat mode.
func podNetwork(t *testing.T, mode wan.PodNetwork) {
	t.Helper()
	before := fl.PodNetwork()
	if err := fl.SetPodNetwork(context.Background(), mode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fl.SetPodNetwork(context.Background(), before); err != nil {
			t.Errorf("restore pod network %s: %v", before, err)
		}
	})
}
