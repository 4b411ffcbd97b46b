package distribute

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

// readyTimeout is the ready timeout of the placements in these tests.
const readyTimeout = 60 * time.Second

// pending is what a copy whose pods wait for GPUs says.
const pending = "0/2 pods available: Insufficient nvidia.com/gpu"

// withReadyTimeout sets the placement's ready timeout to readyTimeout.
func withReadyTimeout(pl *fleetv1alpha1.InferencePlacement) *fleetv1alpha1.InferencePlacement {
	pl.Spec.Failover.ReadyTimeoutSeconds = ptr.To(int32(readyTimeout / time.Second))
	return pl
}

// clockedFleet is newFleet with the reconciler's clock in the test's hands:
// advance moves it.
func clockedFleet(t *testing.T, hubObjs []client.Object, spokeObjs map[string][]client.Object) (*fleet, func(time.Duration)) {
	t.Helper()
	f := newFleet(t, hubObjs, spokeObjs)
	now := time.Now()
	f.r.now = func() time.Time { return now }
	return f, func(d time.Duration) { now = now.Add(d) }
}

// twoOfThree places services in 2 of the clusters a, b and c (a and b, all
// having room), with the test's ready timeout.
func twoOfThree() *fleetv1alpha1.InferencePlacement {
	pl := withReadyTimeout(placementOf(fleetv1alpha1.Duplicated, "a", "b", "c"))
	pl.Spec.MaxClusters = ptr.To(int32(2))
	return pl
}

// pendingInB is a hub whose service llama (2 replicas) is placed by
// placement pl in a and b, its copy in a Ready and the one in b with ready
// of its replicas and not Ready, waiting for GPUs; the clock stands where
// the hub asked.
func pendingInB(t *testing.T, pl *fleetv1alpha1.InferencePlacement, ready int32) (*fleet, func(time.Duration)) {
	t.Helper()
	f, advance := clockedFleet(t, []client.Object{service("llama", 2), pl}, map[string][]client.Object{"a": nil, "b": nil, "c": nil})
	f.reconcile("llama")
	f.markReady("a", "llama", 2)
	f.markNotReady("b", "llama", ready, pending)
	return f, advance
}

// entry is the status entry of cluster, nil when there is none.
func entry(svc *v1alpha2.LLMInferenceService, cluster string) *v1alpha2.ClusterStatus {
	for i := range svc.Status.Clusters {
		if svc.Status.Clusters[i].Name == cluster {
			return &svc.Status.Clusters[i]
		}
	}
	return nil
}

// stuckEvents are the Stuck Events recorded so far.
func (f *fleet) stuckEvents() []string {
	var out []string
	for _, e := range f.Events.Drain() {
		if strings.HasPrefix(e, "Warning Stuck ") {
			out = append(out, e)
		}
	}
	return out
}

// A copy that is not Ready within the ready timeout turns Stuck: its
// replicas are placed on another eligible cluster, and the stuck copy, with
// what it serves, stays until they are Ready.
func TestACopyNeverReadyPastTheDeadlineTurnsStuckAndItsReplicasMoveMakeBeforeBreak(t *testing.T) {
	split := withReadyTimeout(placementOf(fleetv1alpha1.Weighted, "a", "b"))
	split.Spec.Replicas.Total = ptr.To(int32(4))
	split.Spec.Replicas.Weights = []fleetv1alpha1.ClusterWeight{{Cluster: "a", Weight: 1}, {Cluster: "b", Weight: 1}}
	cases := []struct {
		name      string
		placement *fleetv1alpha1.InferencePlacement
		stuckHas  int32  // replicas of b's copy that are ready
		to        string // the cluster b's replicas go to
		wantTo    int32  // its replicas then
		wantMove  string // in the Stuck Event
	}{
		{"a copy with no ready replica: its replicas go to the third cluster", twoOfThree(), 0, "c", 2, "move to a=2, c=2"},
		{"a copy with some ready replicas keeps them until the other cluster has the whole share", split, 1, "a", 4, "move to a=4"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := testutil.ToFloat64(stuckCopies.WithLabelValues("b"))
			f, advance := pendingInB(t, c.placement, c.stuckHas)
			bKeeps := func(step string) { f.kept(step, "b", "llama", 2) }

			advance(readyTimeout - time.Second)
			f.reconcile("llama")
			if e := entry(f.hubService("llama"), "b"); e == nil || e.Phase != PhasePlacing {
				t.Fatalf("within the timeout b's entry is %+v, want it Placing", e)
			}
			if ev := f.stuckEvents(); len(ev) > 0 {
				t.Fatalf("Stuck Events within the timeout: %v", ev)
			}

			advance(2 * time.Second)
			f.reconcile("llama")
			svc := f.hubService("llama")
			e := entry(svc, "b")
			if e == nil || e.Phase != PhaseStuck || !strings.Contains(e.Message, pending) {
				t.Fatalf("past the timeout b's entry is %+v, want it Stuck with the copy's own message %q", e, pending)
			}
			if cp := f.copyIn(c.to, "llama"); cp == nil || ptr.Deref(cp.Spec.Replicas, 0) != c.wantTo {
				t.Fatalf("%s's copy is %v, want %d replicas there", c.to, cp, c.wantTo)
			}
			bKeeps("replicas placed elsewhere")
			if ev := f.stuckEvents(); len(ev) != 1 || !strings.Contains(ev[0], "Cluster b") || !strings.Contains(ev[0], c.wantMove) {
				t.Errorf("Stuck Events %v, want one saying b's replicas %s", ev, c.wantMove)
			}
			if got := testutil.ToFloat64(stuckCopies.WithLabelValues("b")) - before; got != 1 {
				t.Errorf("fleetinfer_hub_stuck_copies_total{cluster=b} rose by %v, want 1", got)
			}
			if p := svc.Status.Placement; p == nil || len(p.StuckClusters) != 1 || p.StuckClusters[0].Name != "b" {
				t.Errorf("status.placement %+v, want b remembered as stuck", p)
			}

			f.reconcile("llama")
			bKeeps("the replacement not ready")
			f.markReady(c.to, "llama", c.wantTo-1)
			f.reconcile("llama")
			bKeeps("the replacement ready short of its share")
			if ev := f.stuckEvents(); len(ev) > 0 {
				t.Errorf("Stuck Events after the transition: %v", ev)
			}

			f.markReady(c.to, "llama", c.wantTo)
			f.reconcile("llama")
			if cp := f.copyIn("b", "llama"); cp != nil {
				t.Errorf("b's stuck copy is kept once %s is ready", c.to)
			}
			f.reconcile("llama")
			if cp := f.copyIn("b", "llama"); cp != nil {
				t.Errorf("b got a copy again while stuck")
			}
			if !f.hubService("llama").Status.IsTrue(v1alpha2.Ready) {
				t.Errorf("the service is not Ready once its replicas run elsewhere: %s", hubConditionsOf(f.hubService("llama")))
			}
		})
	}
}

// A copy Ready within the timeout is never Stuck, not even when it stops
// being Ready later: the timeout is for turning Ready after the hub asked.
func TestACopyReadyWithinTheDeadlineIsNeverStuck(t *testing.T) {
	f, advance := pendingInB(t, twoOfThree(), 0)
	advance(readyTimeout - time.Second)
	f.markReady("b", "llama", 2)
	f.reconcile("llama")

	advance(10 * readyTimeout)
	f.markNotReady("b", "llama", 1, "container crashed")
	f.reconcile("llama")
	f.reconcile("llama")

	if e := entry(f.hubService("llama"), "b"); e == nil || e.Phase == PhaseStuck {
		t.Errorf("b's entry is %+v, want it not Stuck", e)
	}
	if f.copyIn("c", "llama") != nil {
		t.Error("c got a copy: replicas moved off a copy that was Ready in time")
	}
	if ev := f.stuckEvents(); len(ev) > 0 {
		t.Errorf("Stuck Events %v, want none", ev)
	}
}

// When no other cluster can take a stuck copy's replicas, nothing moves:
// every copy stays as it is, the entry and a Stuck Event say why, and the
// copy turning Ready later ends it.
func TestAStuckCopyWithNowhereToGoStaysAndTheStatusSaysWhy(t *testing.T) {
	cases := []struct {
		name      string
		placement *fleetv1alpha1.InferencePlacement
	}{
		{"the other cluster already runs its own replicas", withReadyTimeout(placementOf(fleetv1alpha1.Duplicated, "a", "b"))},
		{"the only cluster", withReadyTimeout(placementOf(fleetv1alpha1.Duplicated, "b"))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, advance := clockedFleet(t, []client.Object{service("llama", 2), c.placement}, map[string][]client.Object{"a": nil, "b": nil})
			f.reconcile("llama")
			if f.copyIn("a", "llama") != nil {
				f.markReady("a", "llama", 2)
			}
			f.markNotReady("b", "llama", 0, pending)
			advance(readyTimeout + time.Second)
			f.reconcile("llama")
			f.ClearWrites()
			f.reconcile("llama")

			if w := f.Writes(); len(w) > 0 {
				t.Errorf("writes by cluster %v while nothing can move, want none", w)
			}
			if cp := f.copyIn("b", "llama"); cp == nil || ptr.Deref(cp.Spec.Replicas, 0) != 2 {
				t.Fatalf("b's copy is %v, want it kept with its 2 replicas", cp)
			}
			svc := f.hubService("llama")
			e := entry(svc, "b")
			if e == nil || e.Phase != PhaseStuck || e.DesiredReplicas != 2 || !strings.Contains(e.Message, "no other eligible cluster") {
				t.Errorf("b's entry is %+v, want it Stuck, still desired, saying no other cluster can take its replicas", e)
			}
			if r := svc.Status.GetCondition(v1alpha2.Ready); r == nil || !strings.Contains(r.Message, "no other eligible cluster") {
				t.Errorf("Ready is %+v, want it to say why nothing moves", r)
			}
			if ev := f.stuckEvents(); len(ev) != 1 || !strings.Contains(ev[0], "nothing moves") {
				t.Errorf("Stuck Events %v, want one saying nothing moves", ev)
			}

			f.markReady("b", "llama", 2)
			f.reconcile("llama")
			svc = f.hubService("llama")
			if e := entry(svc, "b"); e == nil || e.Phase != PhaseRunning {
				t.Errorf("b's entry once its copy is Ready is %+v, want it Running", e)
			}
			if p := svc.Status.Placement; p == nil || len(p.StuckClusters) != 0 {
				t.Errorf("status.placement %+v, want b no longer stuck", p)
			}
		})
	}
}

// The clock lives in the decision memory: a hub restarted while a copy is
// not Ready counts on from when the first hub asked, not from its own start.
func TestARestartedHubKeepsTheClock(t *testing.T) {
	f, advance := pendingInB(t, twoOfThree(), 0)

	advance(readyTimeout * 2 / 3)
	f.restartHub()
	f.reconcile("llama")
	advance(readyTimeout/3 + 2*time.Second)
	f.reconcile("llama")

	if e := entry(f.hubService("llama"), "b"); e == nil || e.Phase != PhaseStuck {
		t.Errorf("b's entry is %+v, want it Stuck %s after the first hub asked", e, readyTimeout)
	}
	if f.copyIn("c", "llama") == nil {
		t.Error("c got no copy: the restarted hub started the clock again")
	}
}

// Changing the service is the fix a stuck cluster waits for: it is eligible
// again, and a copy the hub changes starts a new clock.
func TestAChangedServiceMakesAStuckClusterEligibleAgain(t *testing.T) {
	f, advance := pendingInB(t, twoOfThree(), 0)
	advance(readyTimeout + time.Second)
	f.reconcile("llama")
	f.markReady("c", "llama", 2)
	f.reconcile("llama")
	if f.copyIn("b", "llama") != nil {
		t.Fatal("b's stuck copy is kept once c is ready")
	}

	svc := f.hubService("llama")
	svc.Spec.Replicas = ptr.To(int32(3))
	svc.Generation++ // the fake client keeps generations as given
	if err := f.Hub.API.Update(t.Context(), svc); err != nil {
		t.Fatal(err)
	}
	f.reconcile("llama")
	p := f.hubService("llama").Status.Placement
	if p == nil || len(p.StuckClusters) != 0 {
		t.Errorf("status.placement %+v after the service changed, want no stuck cluster", p)
	}
}

func hubConditionsOf(svc *v1alpha2.LLMInferenceService) string {
	var out []string
	for _, c := range svc.Status.Conditions {
		out = append(out, string(c.Type)+"="+string(c.Status)+" ("+c.Message+")")
	}
	return strings.Join(out, "; ")
}

// No event comes while a copy stays Pending: the service is looked at again
// when the copy's deadline passes.
func TestAServiceIsLookedAtAgainWhenACopysDeadlinePasses(t *testing.T) {
	f, advance := pendingInB(t, twoOfThree(), 0)
	advance(readyTimeout / 2)
	res, err := f.r.Reconcile(t.Context(), watch.Request(ns, "llama"))
	if err != nil {
		t.Fatal(err)
	}
	// The clock is stored to the second.
	if left := readyTimeout / 2; res.RequeueAfter < left-time.Second || res.RequeueAfter > left+time.Second {
		t.Errorf("requeued after %s, want about %s, when b's deadline passes", res.RequeueAfter, left)
	}
}
