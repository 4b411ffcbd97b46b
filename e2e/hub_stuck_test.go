package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/distribute"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// readyPods are the UIDs of a service's Ready model-server pods (its
// workload's, not its endpoint picker's) in a cluster.
func readyPods(ctx context.Context, c *fleet.Cluster, ns, name string) (map[types.UID]bool, error) {
	pods, err := podsOf(ctx, c, ns, map[string]string{"app.kubernetes.io/name": name, v1alpha2.LabelComponent: v1alpha2.ComponentWorkload})
	if err != nil {
		return nil, err
	}
	out := map[types.UID]bool{}
	for _, p := range pods {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.DeletionTimestamp.IsZero() {
				out[p.UID] = true
			}
		}
	}
	return out, nil
}

// stoppedServing returns the pods of serving (cluster → UIDs of service
// name's pods in namespace ns) that are no longer Ready or are gone.
func stoppedServing(ctx context.Context, ns, name string, serving map[string]map[types.UID]bool) ([]string, error) {
	var out []string
	for cluster, uids := range serving {
		ready, err := readyPods(ctx, fl.Spoke(cluster), ns, name)
		if err != nil {
			return nil, err
		}
		for uid := range uids {
			if !ready[uid] {
				out = append(out, cluster+"/"+string(uid))
			}
		}
	}
	return out, nil
}

// A copy whose pods stay Pending for lack of GPUs turns Stuck after the
// placement's ready timeout, and its replicas are re-placed within the
// timeout plus 10 s; the replicas that were ready (the stuck copy's one pod
// that got GPUs, and the other cluster's) keep running until the
// replacements are Ready. Central's 4 GPUs are half taken by another
// workload; the Weighted strategy places by weight, not by room, so the
// hub asks central for 2 replicas of 2 GPUs, as it would when GPUs are
// taken between its decision and the pods' scheduling.
func TestHubMovesTheReplicasOfACopyStuckPendingForGPUs(t *testing.T) {
	allGPUsFree(t)
	ctx := context.Background()
	central, west := fl.Spoke("central"), fl.Spoke("west")
	hogs := namespace(t, central)
	if err := central.Client.Create(ctx, vllmDeployment(hogs, "gpu-hog", 2)); err != nil {
		t.Fatal(err)
	}
	readyPod(t, central, hogs, map[string]string{"app": "gpu-hog"})

	ns := namespace(t, fl.Hub)
	const timeout = 20 * time.Second
	spec := fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"central", "west"}},
		Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Weighted, Total: ptr.To(int32(3)),
			Weights: []fleetv1alpha1.ClusterWeight{{Cluster: "central", Weight: 2}, {Cluster: "west", Weight: 1}}},
		Failover: fleetv1alpha1.Failover{ReadyTimeoutSeconds: ptr.To(int32(timeout / time.Second))},
	}
	tooShort := &fleetv1alpha1.InferencePlacement{}
	tooShort.Name, tooShort.Namespace, tooShort.Spec = "too-short", ns, *spec.DeepCopy()
	tooShort.Spec.Failover.ReadyTimeoutSeconds = ptr.To(int32(5))
	if err := fl.Hub.Client.Create(ctx, tooShort, client.DryRunAll); !apierrors.IsInvalid(err) {
		t.Errorf("a placement with readyTimeoutSeconds 5 was not refused as invalid: %v", err)
	}

	asked := time.Now()
	place(t, gpuService(ns, "stuck", 1, 2), spec)
	var serving map[string]map[types.UID]bool // cluster -> ready pods once each has one
	testutil.Eventually(t, 60*time.Second, "a ready pod in central and in west, one Pending in central", func(ctx context.Context) error {
		serving = map[string]map[types.UID]bool{}
		for _, c := range []*fleet.Cluster{central, west} {
			ready, err := readyPods(ctx, c, ns, "stuck")
			if err != nil || len(ready) != 1 {
				return fmt.Errorf("%s: %d ready pods (%v)", c.Name(), len(ready), err)
			}
			serving[c.Name()] = ready
		}
		return nil
	})

	// Until west's copy is Ready with all 3 replicas, the pods that were
	// ready keep running; the move happens within the deadline plus 10 s.
	stillServing := func(ctx context.Context) error {
		stopped, err := stoppedServing(ctx, ns, "stuck", serving)
		if err == nil && len(stopped) > 0 {
			t.Fatalf("%v stopped serving before the replacements were Ready", stopped)
		}
		return err
	}
	svc := &v1alpha2.LLMInferenceService{}
	testutil.Eventually(t, time.Until(asked.Add(timeout+10*time.Second)), "central Stuck and its replicas re-placed on west", func(ctx context.Context) error {
		if err := stillServing(ctx); err != nil {
			return err
		}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "stuck"}, svc); err != nil {
			return err
		}
		got, err := copies(ctx, ns, "stuck")
		if err != nil {
			return err
		}
		stuck := false
		for _, e := range svc.Status.Clusters {
			stuck = stuck || (e.Name == "central" && e.Phase == distribute.PhaseStuck)
		}
		if !stuck || got["west"] != 3 {
			return fmt.Errorf("copies %s; hub: %s", split(got), hubConditions(svc))
		}
		return nil
	})
	t.Logf("replicas re-placed %s after the service was placed (ready timeout %s): %s", time.Since(asked).Round(100*time.Millisecond), timeout, hubConditions(svc))

	// From here the hub retires central's copy as soon as west's is Ready,
	// which can fall between two polls. So each poll reads the pods first
	// and west's copy second: pods that stopped serving while the copy read
	// afterwards is still not Ready stopped before it was.
	testutil.Eventually(t, 60*time.Second, "west's copy Ready with 3 replicas", func(ctx context.Context) error {
		stopped, err := stoppedServing(ctx, ns, "stuck", serving)
		if err != nil {
			return err
		}
		cp := &v1alpha2.LLMInferenceService{}
		if err := west.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "stuck"}, cp); err != nil {
			return err
		}
		if !cp.Status.IsTrue(v1alpha2.Ready) || cp.Status.ObservedGeneration != cp.Generation {
			if len(stopped) > 0 {
				t.Fatalf("%v stopped serving before west's copy was Ready (%s)", stopped, hubConditions(cp))
			}
			return fmt.Errorf("west's copy not Ready yet")
		}
		return nil
	})
	hubReady(t, ns, "stuck", "west=3", 60*time.Second)
}
