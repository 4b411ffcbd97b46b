package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/distribute"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
)

// A bad change (an image that never pulls) under a Progressive rollout of
// one cluster per stage reaches the first cluster only: the rollout stalls
// at its progress deadline with a RolloutStalled condition and Event, and
// the other two clusters keep the previous version, with the very pods that
// served before. The first cluster's old pod keeps serving too (its
// Deployment rolls, it does not recreate).
func TestABadChangeUnderAProgressiveRolloutStopsAfterTheFirstCluster(t *testing.T) {
	allGPUsFree(t)
	ctx := context.Background()
	ns := namespace(t, fl.Hub)
	const deadline = 15 * time.Second
	clusters := []string{"central", "east", "west"}
	place(t, gpuService(ns, "staged", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: clusters},
		Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Duplicated},
		Rollout: fleetv1alpha1.Rollout{Strategy: fleetv1alpha1.RolloutProgressive, MaxConcurrentClusters: ptr.To(int32(1)),
			ProgressDeadlineSeconds: ptr.To(int32(deadline / time.Second))},
	})
	hubReady(t, ns, "staged", "central=1,east=1,west=1", 90*time.Second)
	// The hub is Ready once one cluster serves; the first version has
	// rolled out when every copy is Ready. Until then a copy that is not
	// Ready takes a change at once, by design.
	testutil.Eventually(t, 60*time.Second, "the first version rolled out", func(ctx context.Context) error {
		svc := &v1alpha2.LLMInferenceService{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "staged"}, svc); err != nil {
			return err
		}
		if !svc.Status.IsTrue(distribute.RolledOut) {
			return fmt.Errorf("hub: %s", hubConditions(svc))
		}
		return nil
	})
	serving := map[string]map[types.UID]bool{}
	for _, c := range clusters {
		ready, err := readyPods(ctx, fl.Spoke(c), ns, "staged")
		if err != nil || len(ready) != 1 {
			t.Fatalf("%s: ready pods %v (%v)", c, ready, err)
		}
		serving[c] = ready
	}
	stillServing := func(ctx context.Context) {
		for c, uids := range serving {
			ready, err := readyPods(ctx, fl.Spoke(c), ns, "staged")
			if err != nil {
				continue // a read error says nothing about the pods
			}
			for uid := range uids {
				if !ready[uid] {
					t.Fatalf("%s's pod %s stopped serving during the rollout", c, uid)
				}
			}
		}
	}

	const bad = "example.com/mystery:1.0"
	svc := &v1alpha2.LLMInferenceService{}
	if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "staged"}, svc); err != nil {
		t.Fatal(err)
	}
	good := svc.Spec.Template.Containers[0].Image
	svc.Spec.Template.Containers[0].Image = bad
	if err := fl.Hub.Client.Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	images := func(ctx context.Context) (map[string]string, error) {
		out := map[string]string{}
		for _, c := range clusters {
			cp := &v1alpha2.LLMInferenceService{}
			if err := fl.Spoke(c).Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "staged"}, cp); err != nil {
				return nil, err
			}
			out[c] = cp.Spec.Template.Containers[0].Image
		}
		return out, nil
	}
	var cond *v1alpha2.Condition
	testutil.Eventually(t, deadline+45*time.Second, "the rollout stalled after central", func(ctx context.Context) error {
		stillServing(ctx)
		got, err := images(ctx)
		if err != nil {
			return err
		}
		if got["east"] != good || got["west"] != good {
			t.Fatalf("the bad change reached a second cluster: %v", got)
		}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		cond = svc.Status.GetCondition(distribute.RolledOut)
		if got["central"] != bad || cond == nil || cond.Reason != distribute.ReasonRolloutStalled {
			return fmt.Errorf("images %v; hub: %s", got, hubConditions(svc))
		}
		return nil
	})
	t.Logf("stalled %s after the change (deadline %s): %s", time.Since(changed).Round(100*time.Millisecond), deadline, cond.Message)
	if !strings.Contains(cond.Message, "east, west keep the previous version") {
		t.Errorf("RolledOut message %q does not name the held clusters", cond.Message)
	}

	// The stall holds: the next reconciles (the copies' status changes,
	// the periodic requeue) update nothing more.
	hold := time.Now().Add(10 * time.Second)
	for time.Now().Before(hold) {
		stillServing(ctx)
		got, err := images(ctx)
		if err == nil && (got["east"] != good || got["west"] != good) {
			t.Fatalf("the bad change reached a second cluster after the stall: %v", got)
		}
		time.Sleep(500 * time.Millisecond)
	}
	testutil.Eventually(t, 10*time.Second, "a RolloutStalled Warning Event on the hub service", func(ctx context.Context) error {
		var events corev1.EventList
		if err := fl.Hub.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == "staged" && e.Reason == distribute.ReasonRolloutStalled && e.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return fmt.Errorf("no RolloutStalled Event among %d", len(events.Items))
	})

	// Rolling back is a new change: central, not Ready, is updated at once
	// and the rollout completes.
	if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.Template.Containers[0].Image = good
	if err := fl.Hub.Client.Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, "rolled out after the rollback", func(ctx context.Context) error {
		stillServing(ctx)
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		if !svc.Status.IsTrue(distribute.RolledOut) || !svc.Status.IsTrue(v1alpha2.Ready) {
			return fmt.Errorf("hub: %s", hubConditions(svc))
		}
		return nil
	})
}
