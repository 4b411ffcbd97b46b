package distribute

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/spokewrite"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

func binding(set string) *fleetv1alpha1.ClusterSetBinding {
	return &fleetv1alpha1.ClusterSetBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: set},
		Spec: fleetv1alpha1.ClusterSetBindingSpec{ClusterSet: set}}
}

// requireBindings turns the hub's binding check on and puts each named
// cluster in a set.
func (f *fleet) requireBindings(sets map[string]string) {
	f.r.opts.RequireClusterSetBinding = true
	for _, s := range f.Spokes() {
		s.Labels = map[string]string{fleetv1alpha1.ClusterSetLabel: sets[s.Name]}
	}
}

func placedOf(t *testing.T, f *fleet) (status corev1.ConditionStatus, reason, message string) {
	t.Helper()
	p := f.hubService("llama").Status.GetCondition(placement.Placed)
	if p == nil {
		t.Fatal("no Placed condition")
	}
	return p.Status, p.Reason, p.Message
}

// A namespace without a ClusterSetBinding places nothing, and its service
// says why and what to ask for.
func TestANamespaceWithoutABindingPlacesNothing(t *testing.T) {
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "a", "b")},
		map[string][]client.Object{"a": nil, "b": nil})
	f.requireBindings(map[string]string{"a": "us", "b": "eu"})
	f.reconcile("llama")
	status, reason, msg := placedOf(t, f)
	if status != corev1.ConditionFalse || reason != placement.ReasonNoClusterSetBinding ||
		!strings.Contains(msg, "namespace llm has no ClusterSetBinding") || !strings.Contains(msg, `"global"`) {
		t.Errorf("Placed %s/%s %q; want False/%s naming the namespace and the global set", status, reason, msg, placement.ReasonNoClusterSetBinding)
	}
	for _, cl := range []string{"a", "b"} {
		if f.copyIn(cl, "llama") != nil {
			t.Errorf("%s got a copy of a service of an unbound namespace", cl)
		}
	}
}

// A binding of one set places on its clusters only, and the others are
// listed as not eligible with the reason.
func TestABoundSetLimitsWhereTheNamespacePlaces(t *testing.T) {
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "a", "b"), binding("us")},
		map[string][]client.Object{"a": nil, "b": nil})
	f.requireBindings(map[string]string{"a": "us", "b": "eu"})
	f.reconcile("llama")
	if f.copyIn("a", "llama") == nil || f.copyIn("b", "llama") != nil {
		t.Errorf("copies in a: %v, b: %v; want a only", f.copyIn("a", "llama") != nil, f.copyIn("b", "llama") != nil)
	}
	st := f.hubService("llama").Status
	if st.Placement == nil || len(st.Placement.NotEligible) != 1 || st.Placement.NotEligible[0].Name != "b" ||
		!strings.Contains(st.Placement.NotEligible[0].Reason, `cluster set "eu" is not bound`) {
		t.Errorf("notEligible %+v; want b, its set not bound", st.Placement)
	}
}

// Taking away a namespace's last binding while its service runs keeps what
// runs: the hub never deletes a running service on account of its inputs.
func TestRemovingTheLastBindingKeepsWhatRuns(t *testing.T) {
	f := runningFleet(t, placementOf(fleetv1alpha1.Duplicated, "a", "b"))
	f.requireBindings(map[string]string{"a": "us", "b": "us"})
	f.reconcile("llama")
	for _, cl := range []string{"a", "b"} {
		if cp := f.copyIn(cl, "llama"); cp == nil || *cp.Spec.Replicas != 2 {
			t.Fatalf("%s's copy %v, want it kept with 2 replicas", cl, cp)
		}
	}
	status, reason, msg := placedOf(t, f)
	if status != corev1.ConditionFalse || reason != placement.ReasonNoClusterSetBinding || !strings.Contains(msg, "kept") {
		t.Errorf("Placed %s/%s %q; want False/%s saying what runs is kept", status, reason, msg, placement.ReasonNoClusterSetBinding)
	}

	if err := f.Hub.API.Create(context.Background(), binding("us")); err != nil {
		t.Fatal(err)
	}
	f.reconcile("llama")
	if status, reason, msg := placedOf(t, f); status != corev1.ConditionTrue {
		t.Errorf("Placed %s/%s %q once the binding is back; want True", status, reason, msg)
	}
}

// A hub namespace whose name a spoke already uses for its own is a
// Conflict there: nothing is written into it, the service runs in the
// other clusters, the hub service says which label lets the hub in, and
// once the spoke's admin adds it the copy follows.
func TestANamespaceThatIsTheSpokesOwnIsAConflict(t *testing.T) {
	theirs := hubtest.Namespace(ns, map[string]string{"team": "monitoring"})
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "a", "b")},
		map[string][]client.Object{"a": {theirs}, "b": nil})
	f.reconcile("llama")
	if f.copyIn("a", "llama") != nil || len(f.Writes()["a"]) > 0 {
		t.Errorf("the hub wrote %v into a's own namespace", f.Writes()["a"])
	}
	if f.copyIn("b", "llama") == nil {
		t.Error("b got no copy: one cluster's conflict held the others back")
	}
	optIn := fleetv1alpha1.AcceptsHubLabel + "=" + hubtest.HubID
	d := f.hubService("llama").Status.GetCondition(Distributed)
	if d == nil || d.Reason != ReasonNamespaceNotOurs || !strings.Contains(d.Message, "cluster(s) a ") ||
		!strings.Contains(d.Message, "namespace llm") || !strings.Contains(d.Message, optIn) {
		t.Errorf("Distributed %+v; want %s naming the cluster, the namespace and %s", d, ReasonNamespaceNotOurs, optIn)
	}
	if e := f.hubService("llama").Status.Clusters[0]; e.Name != "a" || e.Phase != PhaseConflict || !strings.Contains(e.Message, optIn) {
		t.Errorf("a's entry %+v; want Conflict with the opt-in label", e)
	}
	if evs := strings.Join(f.Events.Drain(), "\n"); !strings.Contains(evs, "Warning "+ReasonNamespaceNotOurs) {
		t.Errorf("Events %s; want a Warning %s", evs, ReasonNamespaceNotOurs)
	}

	theirs.Labels[fleetv1alpha1.AcceptsHubLabel] = hubtest.HubID
	if err := f.Spoke("a").API.Update(context.Background(), theirs); err != nil {
		t.Fatal(err)
	}
	f.reconcile("llama")
	if f.copyIn("a", "llama") == nil {
		t.Error("a got no copy once its namespace opted in")
	}
}

// Moving a service onto a cluster whose namespace is not the hub's deletes
// nothing where it runs: the move waits, as for a cluster that cannot be
// written.
func TestAConflictingNamespaceDeletesNothingElsewhere(t *testing.T) {
	svc := placedOn(service("llama", 2), "decided-before", map[string]int32{"b": 2})
	f := newFleet(t, []client.Object{svc, placementOf(fleetv1alpha1.Duplicated, "a")}, map[string][]client.Object{
		"a": {hubtest.Namespace(ns, nil)}, "b": {spokewrite.Namespace(ns, hubtest.HubID), hubCopy("llama", 2)}})
	for range 2 {
		f.reconcile("llama")
	}
	f.kept("moved onto a conflicting namespace", "b", "llama", 2)
	if f.copyIn("a", "llama") != nil {
		t.Error("the hub wrote into a's own namespace")
	}
}
