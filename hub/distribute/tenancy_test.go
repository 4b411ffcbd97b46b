package distribute

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
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
