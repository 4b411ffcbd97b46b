package distribute

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// otherHubsCopy is a copy another hub made in a spoke this hub shares.
func otherHubsCopy(name string) *v1alpha2.LLMInferenceService {
	cp := desiredCopy(service(name, 2), "the-other-hub", "", 2, decision{})
	setReady(cp, 2)
	return cp
}

// Two hubs on the same spokes leave each other's copies alone: a copy with
// another hub's ID is a foreign object, never updated, shrunk or collected.
func TestAnotherHubsCopiesAreNeverWrittenNorCollected(t *testing.T) {
	f := newFleet(t, []client.Object{service("shared", 1), placementOf(fleetv1alpha1.Duplicated, "a")},
		map[string][]client.Object{"a": {otherHubsCopy("shared"), otherHubsCopy("theirs")}})
	f.reconcile("shared")
	f.reconcile("shared")
	gc := f.r.OrphanCollector(time.Hour)
	gc.collect(context.Background(), inventory.Cluster{Name: "a", Client: f.Spoke("a").Client}, time.Now())

	if w := f.Spoke("a").Writes(); len(w) != 0 {
		t.Errorf("writes %q to a cluster holding only the other hub's copies, want none", w)
	}
	for _, name := range []string{"shared", "theirs"} {
		cp := f.copyIn("a", name)
		if cp == nil || cp.Labels[fleetv1alpha1.HubIDLabel] != "the-other-hub" || *cp.Spec.Replicas != 2 {
			t.Errorf("the other hub's copy %s changed or went: %+v", name, cp)
		}
	}
	if got := f.hubService("shared").Status.Clusters; len(got) != 1 || got[0].Phase != PhaseConflict {
		t.Errorf("status.clusters %+v, want cluster a in phase %s", got, PhaseConflict)
	}
}

// An orphan is deleted only after the grace period; a hub service that
// reappears within it (deleted and recreated, a restore a little behind)
// finds its copy still running.
func TestOrphansAreDeletedOnlyAfterTheGracePeriod(t *testing.T) {
	f := newFleet(t, nil, map[string][]client.Object{"a": {hubCopy("orphan", 1), hubCopy("back", 1)}})
	f.r.opts.OrphanGrace = time.Minute
	gc := f.r.OrphanCollector(time.Hour)
	a := inventory.Cluster{Name: "a", Client: f.Spoke("a").Client}
	t0 := time.Now()
	pending := func() float64 { return testutil.ToFloat64(orphansPending.WithLabelValues("a")) }

	swept := map[string]bool{"a": true}
	if _, ok := gc.nextDue(swept); ok {
		t.Error("a sweep is due before any orphan was found")
	}
	gc.collect(context.Background(), a, t0)
	if f.copyIn("a", "orphan") == nil || f.copyIn("a", "back") == nil {
		t.Fatal("an orphan was deleted at once, before its grace period")
	}
	// The collector looks again when the grace ends, not at its next
	// interval (an hour here).
	if due, ok := gc.nextDue(swept); !ok || !due.Equal(t0.Add(time.Minute)) {
		t.Errorf("next sweep due %v (%v), want at the end of the grace period %v", due, ok, t0.Add(time.Minute))
	}
	if _, ok := gc.nextDue(map[string]bool{}); ok {
		t.Error("a sweep is due for the orphans of a cluster that was not available")
	}
	if got := pending(); got != 2 {
		t.Errorf("fleetinfer_hub_orphans_pending_deletion{cluster=a} = %v, want 2", got)
	}

	if err := f.Hub.API.Create(context.Background(), service("back", 1)); err != nil {
		t.Fatal(err)
	}
	gc.collect(context.Background(), a, t0.Add(30*time.Second))
	if err := f.Hub.API.Delete(context.Background(), service("back", 1)); err != nil {
		t.Fatal(err)
	}
	gc.collect(context.Background(), a, t0.Add(61*time.Second))
	if f.copyIn("a", "orphan") != nil {
		t.Error("an orphan outlived its grace period")
	}
	if f.copyIn("a", "back") == nil {
		t.Error("a copy whose service came back within the grace period was deleted when the service went again: its grace restarts")
	}
	if got := pending(); got != 1 {
		t.Errorf("fleetinfer_hub_orphans_pending_deletion{cluster=a} = %v, want 1 (the copy whose service went again)", got)
	}
}
