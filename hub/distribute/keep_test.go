package distribute

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
	"github.com/fleetinfer/fleetinfer/hub/internal/spokewrite"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// runningFleet is a hub whose service llama runs 2 replicas in each of a and
// b under the placement gpus (a decision in force), with hubObjs besides
// the service; the copies in a and b are the hub's and ready.
func runningFleet(t *testing.T, gpus *fleetv1alpha1.InferencePlacement, hubObjs ...client.Object) *fleet {
	t.Helper()
	svc := placedOn(service("llama", 2), "decided-before", map[string]int32{"a": 2, "b": 2})
	if gpus != nil {
		svc.Status.Placement.InputsHash = placement.Fingerprint(gpus, svc, []string{"a", "b"})
		hubObjs = append(hubObjs, gpus)
	}
	copyIn := func(cluster string) *v1alpha2.LLMInferenceService {
		cp := hubCopy("llama", 2)
		cp.UID = types.UID("uid-copy-" + cluster) // the hub remembers deletions by UID
		return cp
	}
	return newFleet(t, append(hubObjs, svc), map[string][]client.Object{
		"a": {spokewrite.Namespace(ns, hubtest.HubID), copyIn("a")}, "b": {spokewrite.Namespace(ns, hubtest.HubID), copyIn("b")}})
}

// A decision that fails, or that chooses no cluster, while the service runs
// keeps every copy as it is, says why in Placed (reason and message naming
// the kept copies) and in one Event, and writes nothing to the spokes.
func TestADecisionErrorKeepsWhatRuns(t *testing.T) {
	gpus := placementOf(fleetv1alpha1.Duplicated, "a", "b")
	overlapping := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "everything", UID: "uid-everything"}}
	nowhere := gpus.DeepCopy()
	nowhere.Spec.Clusters = fleetv1alpha1.ClusterAffinity{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "typo"}}}
	emptyValues := selecting(gpus, metav1.LabelSelectorRequirement{Key: "region", Operator: metav1.LabelSelectorOpIn, Values: []string{}})
	unknownOperator := selecting(gpus, metav1.LabelSelectorRequirement{Key: "region", Operator: "Equals", Values: []string{"eu"}})
	ocm := gpus.DeepCopy()
	ocm.Spec.Clusters = fleetv1alpha1.ClusterAffinity{OCMPlacement: &fleetv1alpha1.LocalReference{Name: "ocm"}}
	emptyDecision := &clusterv1beta1.PlacementDecision{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ocm-decision-1",
		Labels: map[string]string{clusterv1beta1.PlacementLabel: "ocm"}}}
	// failing makes the reconciler's hub reads of one list kind fail.
	failing := func(kind client.ObjectList) func(*fleet) {
		return func(f *fleet) {
			f.Hub.Inject(fakeapi.FailOn("list", kind, errors.New("the server is currently unable to handle the request")))
		}
	}
	listFails := failing(&clusterv1beta1.PlacementDecisionList{})
	placementsFail := failing(&fleetv1alpha1.InferencePlacementList{})
	cases := []struct {
		name       string
		placement  *fleetv1alpha1.InferencePlacement
		others     []client.Object
		breakHub   func(*fleet)
		wantErr    bool
		wantReason string
		wantInMsg  string
	}{
		{"a second placement selecting the service", gpus, []client.Object{overlapping}, nil, false,
			placement.ReasonMultiplePlacements, "everything, gpus all select this service"},
		{"the placement deleted", nil, nil, nil, false,
			placement.ReasonNoPlacement, "no InferencePlacement in namespace llm selects this service"},
		{"the placements cannot be read", gpus, nil, placementsFail, true,
			placement.ReasonPlacementUnreadable, "cannot be read"},
		{"the OCM Placement's decisions cannot be listed", ocm, nil, listFails, true,
			placement.ReasonOCMDecisionsUnavailable, "PlacementDecisions of OCM Placement llm/ocm cannot be read"},
		{"the OCM Placement decided no cluster", ocm, []client.Object{emptyDecision}, nil, false,
			placement.ReasonOCMDecisionsUnavailable, "OCM Placement ocm decided no cluster"},
		{"the cluster selector matches no cluster", nowhere, nil, nil, false,
			placement.ReasonNoEligibleCluster, "labels do not match"},
		{"the cluster selector has an In without values", emptyValues, nil, nil, false,
			placement.ReasonInvalidPlacement, "clusters.selector"},
		{"the cluster selector has an unknown operator", unknownOperator, nil, nil, false,
			placement.ReasonInvalidPlacement, "clusters.selector"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := runningFleet(t, c.placement, c.others...)
			if c.breakHub != nil {
				c.breakHub(f)
			}
			for round := range 2 {
				_, err := f.r.Reconcile(context.Background(), watch.Request(ns, "llama"))
				if (err != nil) != c.wantErr {
					t.Fatalf("reconcile %d: error %v, want one: %v", round, err, c.wantErr)
				}
				for _, cl := range []string{"a", "b"} {
					if w := f.Spoke(cl).Writes(); len(w) != 0 {
						t.Errorf("reconcile %d: writes %q to %s, want none", round, w, cl)
					}
					f.kept(fmt.Sprintf("reconcile %d", round), cl, "llama", 2)
				}
			}
			f.saysTheCopiesAreKept(t, c.wantReason, c.wantInMsg)
		})
	}
}

// selecting is pl with a cluster selector of one expression, which the
// fake API server stores unvalidated, as an API server with an older CRD
// would.
func selecting(pl *fleetv1alpha1.InferencePlacement, e metav1.LabelSelectorRequirement) *fleetv1alpha1.InferencePlacement {
	out := pl.DeepCopy()
	out.Spec.Clusters = fleetv1alpha1.ClusterAffinity{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{e}}}
	return out
}

// saysTheCopiesAreKept checks that the service's status, after the
// decision error of reason, says so and that the copies it keeps serve:
// Placed False with reason, its message saying inMsg and what is kept,
// every cluster entry Running with 2 desired, Ready True, and one NotPlaced
// Event saying the copies are kept.
func (f *fleet) saysTheCopiesAreKept(t *testing.T, reason, inMsg string) {
	t.Helper()
	st := f.hubService("llama").Status
	p := st.GetCondition(placement.Placed)
	if p == nil || p.Status != corev1.ConditionFalse || p.Reason != reason {
		t.Fatalf("Placed is %+v, want False/%s", p, reason)
	}
	for _, want := range []string{inMsg, "the copies in a=2, b=2 are kept", "deleting the service on the hub"} {
		if !strings.Contains(p.Message, want) {
			t.Errorf("Placed message %q does not say %q", p.Message, want)
		}
	}
	for _, e := range st.Clusters {
		if e.Phase != PhaseRunning || e.DesiredReplicas != 2 {
			t.Errorf("cluster entry %+v, want Running with 2 desired", e)
		}
	}
	if !st.IsTrue("Ready") {
		t.Errorf("Ready is %+v, want True: the kept copies serve", st.GetCondition("Ready"))
	}
	var notPlaced []string
	for _, e := range f.Events.Drain() {
		if strings.Contains(e, "NotPlaced") {
			notPlaced = append(notPlaced, e)
		}
	}
	if len(notPlaced) != 1 || !strings.Contains(notPlaced[0], "kept") {
		t.Errorf("NotPlaced events %q over two reconciles, want one saying the copies are kept", notPlaced)
	}
}

// Once the cause is gone (the overlapping placement deleted), the decision
// in force applies again: Placed turns True and the copies are untouched.
func TestTheDecisionInForceResumesWhenTheErrorIsGone(t *testing.T) {
	gpus := placementOf(fleetv1alpha1.Duplicated, "a", "b")
	overlapping := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "everything", UID: "uid-everything"}}
	f := runningFleet(t, gpus, overlapping)
	f.reconcile("llama")
	if err := f.Hub.API.Delete(context.Background(), overlapping); err != nil {
		t.Fatal(err)
	}
	f.reconcile("llama")
	st := f.hubService("llama").Status
	if p := st.GetCondition(placement.Placed); p == nil || p.Status != corev1.ConditionTrue {
		t.Errorf("Placed is %+v, want True again", p)
	}
	for _, cl := range []string{"a", "b"} {
		if w := f.Spoke(cl).Writes(); len(w) != 0 {
			t.Errorf("writes %q to %s, want none", w, cl)
		}
	}
}

// Deleting the hub object still deletes every copy, also while a decision
// error keeps them.
func TestDeletingTheHubServiceDeletesEveryCopy(t *testing.T) {
	overlapping := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "everything", UID: "uid-everything"}}
	for _, c := range []struct {
		name   string
		others []client.Object
	}{{"placed", nil}, {"kept by a decision error", []client.Object{overlapping}}} {
		t.Run(c.name, func(t *testing.T) {
			f := runningFleet(t, placementOf(fleetv1alpha1.Duplicated, "a", "b"), c.others...)
			f.reconcile("llama")
			if err := f.Hub.API.Delete(context.Background(), f.hubService("llama")); err != nil {
				t.Fatal(err)
			}
			f.reconcile("llama")
			for _, cl := range []string{"a", "b"} {
				if cp := f.copyIn(cl, "llama"); cp != nil {
					t.Errorf("%s still holds a copy after the hub service was deleted", cl)
				}
			}
			svc := &v1alpha2.LLMInferenceService{}
			if err := f.Hub.API.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "llama"}, svc); client.IgnoreNotFound(err) != nil || err == nil {
				t.Errorf("the hub service is still there (%v), want its finalizer removed", err)
			}
		})
	}
}

// A service that never ran anywhere and has no eligible cluster stays
// unplaced, as before: nothing to keep.
func TestAServiceThatNeverRanStaysUnplaced(t *testing.T) {
	nowhere := placementOf(fleetv1alpha1.Duplicated)
	nowhere.Spec.Clusters = fleetv1alpha1.ClusterAffinity{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"region": "typo"}}}
	f := newFleet(t, []client.Object{service("llama", 1), nowhere}, map[string][]client.Object{"a": nil})
	f.reconcile("llama")
	st := f.hubService("llama").Status
	if p := st.GetCondition(placement.Placed); p == nil || p.Status != corev1.ConditionFalse || p.Reason != placement.ReasonNoEligibleCluster ||
		strings.Contains(p.Message, "kept") {
		t.Errorf("Placed is %+v, want False/%s saying nothing is kept", p, placement.ReasonNoEligibleCluster)
	}
	if cp := f.copyIn("a", "llama"); cp != nil {
		t.Errorf("a holds a copy of a service placed nowhere")
	}
}

// Asking for zero replicas is not a decision error: the copies go.
func TestZeroReplicasRemovesTheCopies(t *testing.T) {
	f := runningFleet(t, placementOf(fleetv1alpha1.Duplicated, "a", "b"))
	svc := f.hubService("llama")
	svc.Spec.Replicas = ptr.To(int32(0))
	svc.Generation++ // as the API server does on a spec change; the fake client does not
	if err := f.Hub.API.Update(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	f.reconcile("llama")
	for _, cl := range []string{"a", "b"} {
		if cp := f.copyIn(cl, "llama"); cp != nil {
			t.Errorf("%s keeps a copy of a service asking for 0 replicas", cl)
		}
	}
}

// Whatever phase of decide settles an outcome, one that would leave a
// running service without a copy keeps what runs, with the phase's reason;
// only an explicit zero (the service's replicas or the placement's total)
// may empty it, and outcomes that place or keep pass unchanged.
func TestNoOutcomeButAnAskedForZeroRemovesTheLastCopy(t *testing.T) {
	running := decision{want: map[string]int32{"a": 2}, reasons: map[string]string{"a": "placed"}, keep: true}
	invalid := condition(placement.Placed, corev1.ConditionFalse, placement.ReasonInvalidPlacement, "InferencePlacement gpus: bad")
	zero, two := ptr.To[int32](0), ptr.To[int32](2)
	cases := []struct {
		name          string
		running       decision
		out           outcome
		replicas      *int32
		total         *int32
		wantKept      bool
		wantClustersN int
	}{
		{"an empty outcome with a reason", running, outcome{placed: invalid}, two, nil, true, 1},
		{"an empty outcome without a condition", running, outcome{}, two, nil, true, 1},
		{"an outcome that moves the replicas", running, outcome{decision: decision{want: map[string]int32{"b": 2}}}, two, nil, false, 1},
		{"an outcome that keeps", running, outcome{decision: running}, two, nil, true, 1},
		{"nothing runs", decision{want: map[string]int32{}}, outcome{placed: invalid}, two, nil, false, 0},
		{"the service asks for zero", running, outcome{}, zero, nil, false, 0},
		{"the placement's total is zero", running, outcome{}, nil, zero, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			svc := service("llama", 2)
			svc.Spec.Replicas = c.replicas
			pl := placementOf(fleetv1alpha1.FreeCapacity, "a")
			pl.Spec.Replicas.Total = c.total
			s := &decideScope{svc: svc, pl: pl, running: c.running}
			got := s.neverEmpties(c.out)
			if got.keep != c.wantKept || len(got.want) != c.wantClustersN {
				t.Fatalf("outcome keeps %v with %v, want keep %v with %d clusters", got.keep, got.want, c.wantKept, c.wantClustersN)
			}
			if c.wantKept && c.out.placed != nil && (got.placed == nil || got.placed.Reason != c.out.placed.Reason ||
				!strings.Contains(got.placed.Message, "are kept")) {
				t.Errorf("Placed %+v, want reason %s and a message saying what is kept", got.placed, c.out.placed.Reason)
			}
		})
	}
}
