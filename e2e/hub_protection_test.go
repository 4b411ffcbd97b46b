package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/distribute"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
)

// onEast places a service on east alone.
var onEast = fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}}}

// A service labelled deletion-protected survives deleting its hub object:
// the hub object stays Terminating, says why in CopiesDeleted and a Warning
// Event, and the copy and its pods run on untouched until the label is
// removed; then the copy and the hub object go.
func TestAProtectedServiceSurvivesDeletingItsHubObjectUntilProtectionIsRemoved(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, fl.Hub)
	svc := gpuService(ns, "protected", 1, 1)
	svc.Labels[fleetv1alpha1.DeletionProtectedLabel] = fleetv1alpha1.DeletionProtectedAlways
	place(t, svc, onEast)
	hubReady(t, ns, "protected", "east=1", 120*time.Second)
	cp := &v1alpha2.LLMInferenceService{}
	if err := fl.Spoke("east").Client.Get(ctx, client.ObjectKeyFromObject(svc), cp); err != nil || !fleetv1alpha1.IsDeletionProtected(cp) {
		t.Fatalf("east's copy does not carry the protection (%v): %v", err, cp.Labels)
	}
	pods := podUIDs(t, ns, "protected")
	deleted := time.Now()
	if err := fl.Hub.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the hub says the deletion is held", func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
			return err
		}
		c := svc.Status.GetCondition(distribute.CopiesDeleted)
		if c == nil || c.Reason != distribute.ReasonDeletionProtected {
			return fmt.Errorf("hub conditions: %s", hubConditions(svc))
		}
		return warningEvent(ctx, ns, "protected", distribute.ReasonDeletionProtected)
	})
	// The hub has had several reconciles (and orphan sweeps) to get it wrong.
	time.Sleep(10 * time.Second)
	if got, err := copies(ctx, ns, "protected"); err != nil || split(got) != "east=1" {
		t.Errorf("copies of the protected service after deleting its hub object: %s (%v), want east=1", split(got), err)
	}
	if replaced := replacedPods(t, ns, "protected", pods); len(replaced) > 0 {
		t.Errorf("pods replaced while the deletion was held: %v", replaced)
	}
	if d := hubDeletes(t, ns, deleted); len(d) > 0 {
		t.Errorf("the hub deleted copies of a protected service: %v", d)
	}

	lifted := time.Now()
	if err := fl.Hub.Client.Patch(ctx, svc, client.RawPatch("application/merge-patch+json",
		fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, fleetv1alpha1.DeletionProtectedLabel))); err != nil {
		t.Fatal(err)
	}
	eventuallyNoCopies(t, ns, "protected")
	testutil.Eventually(t, 20*time.Second, "the hub object gone", func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc); err == nil {
			return fmt.Errorf("still there: %s", hubConditions(svc))
		}
		return nil
	})
	t.Logf("deletion held %.1f s; copy and hub object gone %.1f s after the label was removed",
		lifted.Sub(deleted).Seconds(), time.Since(lifted).Seconds())
}

// warningEvent finds a Warning Event with reason on the hub object name.
func warningEvent(ctx context.Context, ns, name, reason string) error {
	var events corev1.EventList
	if err := fl.Hub.Client.List(ctx, &events, client.InNamespace(ns)); err != nil {
		return err
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason && e.Type == corev1.EventTypeWarning {
			return nil
		}
	}
	return fmt.Errorf("no Warning %s Event among %d", reason, len(events.Items))
}

// A hub restored from a backup that lacks half its services (here: the
// hub stopped, two of four hub objects deleted past the hub's finalizer,
// the hub started again with the default orphan grace) deletes nothing for
// the grace: every copy and pod stays, and east's MemberCluster lists the
// two orphans with a deleteAfter an hour out.
func TestAHubRestoredWithoutHalfItsServicesDeletesNothingForTheGrace(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, fl.Hub)
	names := []string{"kept-a", "kept-b", "lost-a", "lost-b"}
	pods := map[string]map[string]types.UID{}
	for _, n := range names {
		place(t, gpuService(ns, n, 1, 1), onEast)
	}
	for _, n := range names {
		hubReady(t, ns, n, "east=1", 120*time.Second)
		pods[n] = podUIDs(t, ns, n)
	}
	fl.StopHub()
	// Registered after place: it runs before their cleanups, which need a
	// hub with the suite's short grace to collect the orphans.
	t.Cleanup(func() {
		fl.StopHub()
		if err := fl.StartHub(ctx, suiteHubArgs()); err != nil {
			t.Errorf("restarting the suite's hub: %v", err)
		}
	})
	for _, n := range names[2:] {
		restoreWithout(t, ns, n)
	}
	restarted := time.Now()
	if err := fl.StartHub(ctx, hubArgs); err != nil {
		t.Fatal(err)
	}
	var listed []string
	testutil.Eventually(t, 45*time.Second, "east's MemberCluster lists the orphans", func(ctx context.Context) error {
		listed = nil
		mc := &fleetv1alpha1.MemberCluster{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Name: "east"}, mc); err != nil {
			return err
		}
		for _, d := range mc.Status.PendingDeletions {
			if d.Namespace != ns {
				continue
			}
			if d.DeleteAfter == nil || d.DeleteAfter.Sub(restarted) < 59*time.Minute || d.DeleteAfter.Sub(restarted) > 61*time.Minute {
				return fmt.Errorf("%s/%s deleteAfter %v, want about an hour after the restart (%s)", d.Namespace, d.Name, d.DeleteAfter, restarted.UTC())
			}
			listed = append(listed, d.Name)
		}
		if fmt.Sprint(listed) != "[lost-a lost-b]" {
			return fmt.Errorf("pending deletions in %s: %v (%d in all)", ns, listed, mc.Status.PendingDeletionCount)
		}
		return nil
	})
	// Several sweeps (every 10 s) and reconciles of the restored hub.
	time.Sleep(time.Until(restarted.Add(30 * time.Second)))
	for _, n := range names {
		if got, err := copies(ctx, ns, n); err != nil || split(got) != "east=1" {
			t.Errorf("copies of %s %.0f s after the restore: %s (%v), want east=1", n, time.Since(restarted).Seconds(), split(got), err)
		}
		if replaced := replacedPods(t, ns, n, pods[n]); len(replaced) > 0 {
			t.Errorf("pods of %s replaced: %v", n, replaced)
		}
	}
	if d := hubDeletes(t, ns, restarted); len(d) > 0 {
		t.Errorf("the restored hub deleted copies within the grace: %v", d)
	}
	if m := hubMetrics(t); m[`fleetinfer_hub_orphans_pending_deletion{cluster="east"}`] < 2 {
		t.Errorf("fleetinfer_hub_orphans_pending_deletion{cluster=east} = %v, want at least the 2 orphans", m[`fleetinfer_hub_orphans_pending_deletion{cluster="east"}`])
	}
	t.Logf("restored hub: %v pending deletion, nothing deleted in %.0f s", listed, time.Since(restarted).Seconds())
}

// restoreWithout removes hub service name as a restore from a backup that
// lacks it would: gone from the hub, its finalizer never run.
func restoreWithout(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	svc := &v1alpha2.LLMInferenceService{}
	if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		t.Fatal(err)
	}
	svc.Finalizers = nil
	if err := fl.Hub.Client.Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	if err := fl.Hub.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
}
