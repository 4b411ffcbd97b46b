package distribute

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/fence"
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

// A cluster whose hub lease another hub installation with this hub's ID
// holds is that hub's to write: this hub writes nothing there, neither its
// own services' copies nor changes to (or deletions of) the copies there,
// says why in the service's status, and moves no replica away from it,
// since the cluster is not lost; the clusters it holds are written as ever.
func TestAFencedClusterIsWrittenNothingAndNothingMovesAway(t *testing.T) {
	// The other hub's copy of "shared" carries this hub's ID, with another
	// spec (3 replicas); "theirs" has no service on this hub.
	f := newFleet(t, []client.Object{service("shared", 1), service("new", 1), placementOf(fleetv1alpha1.Duplicated, "a", "b")},
		map[string][]client.Object{"a": {hubCopy("shared", 3), hubCopy("theirs", 1)}, "b": nil})
	a := f.Spoke("a")
	a.Fence = fence.Fence{Reason: fleetv1alpha1.ReasonHeldByAnotherHub, Message: `the Lease is held by hub installation "uid-b/fleetinfer-system"`}
	f.r.opts.OrphanGrace = 0
	for range 2 {
		f.reconcile("shared")
		f.reconcile("new")
		gc := f.r.OrphanCollector(time.Hour)
		for _, c := range f.Clusters(context.Background()) {
			gc.collect(context.Background(), c, time.Now())
		}
	}

	if w := a.Writes(); len(w) != 0 {
		t.Errorf("writes %q to the fenced cluster, want none", w)
	}
	f.kept("fenced", "a", "shared", 3)
	f.kept("fenced", "a", "theirs", 1)
	for _, name := range []string{"shared", "new"} {
		f.kept("writable", "b", name, 1)
		var entry *v1alpha2.ClusterStatus
		for _, e := range f.hubService(name).Status.Clusters {
			if e.Name == "a" {
				entry = &e
			}
		}
		switch {
		case entry == nil || entry.DesiredReplicas != 1:
			t.Errorf("%s: status entry of a %+v, want it still chosen with 1 replica", name, entry)
		case name == "new" && !strings.Contains(entry.Message, "uid-b/fleetinfer-system"):
			t.Errorf("%s: status entry of a says %q, want the fence's message", name, entry.Message)
		}
	}
}
