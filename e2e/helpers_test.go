package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	removeNamespaceOnCleanup(t, name, c)
	return name
}

// removeNamespaceOnCleanup deletes namespace ns from each cluster when the
// test ends and waits for its pods to go: tests share the fleet, and some
// count free GPUs.
func removeNamespaceOnCleanup(t *testing.T, ns string, clusters ...*fleet.Cluster) {
	t.Helper()
	t.Cleanup(func() {
		for _, c := range clusters {
			_ = c.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		}
		for _, c := range clusters {
			noPods(t, c, ns, nil)
		}
	})
}

// noPodsWithin bounds noPods. A pod goes once its controller, the garbage
// collector and the kubelet have each seen a deletion; when its cluster's
// API server has just come back from an outage of 30 s or more, the
// kubelet's and the spoke controller's watches are still in client-go's
// reflector backoff, which ends at [30, 60) s between attempts (a real
// kubelet waits the same), so the deletion can reach them a minute late.
const noPodsWithin = 2 * time.Minute

// noPods waits until namespace ns of cluster c has no pods (with labels)
// left.
func noPods(t *testing.T, c *fleet.Cluster, ns string, labels map[string]string) {
	t.Helper()
	start := time.Now()
	defer func() {
		if took := time.Since(start); took > time.Minute {
			t.Logf("pods of %s took %s to go from %s", ns, took.Round(time.Second), c.Name())
		}
	}()
	testutil.Eventually(t, noPodsWithin, "pods of "+ns+" gone from "+c.Name(), func(ctx context.Context) error {
		pods, err := podsOf(ctx, c, ns, labels)
		if err != nil || len(pods) > 0 {
			return fmt.Errorf("%d pods left (%v): %s", len(pods), err, describePods(ctx, c, pods))
		}
		return nil
	})
}

// describePods says, for a failure message, what holds each pod: its
// owner, phase, node and whether its deletion has begun.
func describePods(ctx context.Context, c *fleet.Cluster, pods []corev1.Pod) string {
	var out []string
	for _, p := range pods {
		owner := "no owner"
		if o := metav1.GetControllerOf(&p); o != nil {
			obj := &unstructured.Unstructured{}
			obj.SetAPIVersion(o.APIVersion)
			obj.SetKind(o.Kind)
			err := c.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: o.Name}, obj)
			switch {
			case err != nil:
				owner = fmt.Sprintf("owner %s/%s: %v", o.Kind, o.Name, err)
			case obj.GetUID() != o.UID:
				owner = fmt.Sprintf("owner %s/%s replaced (uid %s, pod names %s)", o.Kind, o.Name, obj.GetUID(), o.UID)
			case obj.GetDeletionTimestamp() != nil:
				owner = fmt.Sprintf("owner %s/%s deleting, finalizers %v", o.Kind, o.Name, obj.GetFinalizers())
			default:
				owner = fmt.Sprintf("owner %s/%s present", o.Kind, o.Name)
			}
		}
		deleting := "not deleting"
		if p.DeletionTimestamp != nil {
			deleting = "deleting since " + p.DeletionTimestamp.UTC().Format(time.TimeOnly)
		}
		out = append(out, fmt.Sprintf("%s (uid %s, %s, %s, node %q, %s, finalizers %v)",
			p.Name, p.UID, owner, p.Status.Phase, p.Spec.NodeName, deleting, p.Finalizers))
	}
	return strings.Join(out, "; ")
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
