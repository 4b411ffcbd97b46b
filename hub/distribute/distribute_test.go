package distribute

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/spokewrite"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// placedOn gives a hub service the status of a decision in force that put
// it on cluster=replicas.
func placedOn(svc *v1alpha2.LLMInferenceService, hash string, want map[string]int32) *v1alpha2.LLMInferenceService {
	for name, n := range want {
		svc.Status.Clusters = append(svc.Status.Clusters, v1alpha2.ClusterStatus{Name: name, DesiredReplicas: n, ReadyReplicas: n,
			Ready: true, Phase: PhaseRunning, PlacementReason: "before"})
	}
	svc.Status.SetCondition(v1alpha2.Condition{Type: placement.Placed, Status: corev1.ConditionTrue, Reason: placement.ReasonPlaced})
	svc.Status.Placement = &v1alpha2.PlacementStatus{PlacementName: "gpus", InputsHash: hash}
	svc.Finalizers = []string{Finalizer}
	return svc
}

func TestMovingReplicasMakesBeforeItBreaks(t *testing.T) {
	split := placementOf(fleetv1alpha1.Weighted, "a", "b")
	split.Spec.Replicas.Total = ptr.To(int32(4))
	split.Spec.Replicas.Weights = []fleetv1alpha1.ClusterWeight{{Cluster: "a", Weight: 1}, {Cluster: "b", Weight: 1}}
	cases := []struct {
		name      string
		placement *fleetv1alpha1.InferencePlacement
		onA       int32 // replicas a runs before the move
		wantB     int32
		wantA     int32 // after b is ready; 0: a's copy is deleted
	}{
		{"a service moved from a to b keeps a's copy until b's is ready, then deletes it", placementOf(fleetv1alpha1.Duplicated, "b"), 2, 2, 0},
		{"a service split over a and b keeps a's replicas until b's share is ready, then shrinks a", split, 4, 2, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			svc := placedOn(service("llama", c.onA), "decided-before", map[string]int32{"a": c.onA})
			f := newFleet(t, []client.Object{svc, c.placement}, map[string][]client.Object{
				"a": {hubCopy("llama", c.onA)}, "b": nil})
			aKeeps := func(step string) { f.kept(step, "a", "llama", c.onA) }

			f.reconcile("llama")
			if cp := f.copyIn("b", "llama"); cp == nil || ptr.Deref(cp.Spec.Replicas, 0) != c.wantB {
				t.Fatalf("b's copy is %v, want one with %d replicas", cp, c.wantB)
			}
			aKeeps("b's copy written")
			f.reconcile("llama")
			aKeeps("b's copy not ready")
			f.markReady("b", "llama", c.wantB-1)
			f.reconcile("llama")
			aKeeps("b's copy ready short of its share")

			f.markReady("b", "llama", c.wantB)
			f.reconcile("llama")
			cp := f.copyIn("a", "llama")
			switch {
			case c.wantA == 0 && cp != nil:
				t.Errorf("a's copy is kept with %d replicas once b is ready, want it deleted", ptr.Deref(cp.Spec.Replicas, 0))
			case c.wantA > 0 && (cp == nil || ptr.Deref(cp.Spec.Replicas, 0) != c.wantA):
				t.Errorf("a's copy is %v once b is ready, want %d replicas", cp, c.wantA)
			}
		})
	}
}

func TestOrphanCollectorDeletesOnlyWhatNoHubObjectAccountsFor(t *testing.T) {
	kept := hubCopy("kept", 1)
	kept.Spec.BaseRefs = []corev1.LocalObjectReference{{Name: "shared"}}
	users := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "users"}}
	config := func(name string, hubs bool) *v1alpha2.LLMInferenceServiceConfig {
		c := &v1alpha2.LLMInferenceServiceConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if hubs {
			fleetv1alpha1.MarkOwnedByHub(c, hubtest.HubID)
		}
		return c
	}
	f := newFleet(t, []client.Object{service("kept", 1)}, map[string][]client.Object{"a": {
		hubCopy("gone", 1), kept, users, config("shared", true), config("stale", true), config("own", false)}})
	f.r.OrphanCollector(time.Hour).collect(context.Background(), inventory.Cluster{Name: "a", Client: f.Spoke("a").Client}, time.Now())

	cases := []struct {
		name     string
		obj      client.Object
		wantKept bool
	}{
		{"a hub copy whose hub object is gone is deleted", &v1alpha2.LLMInferenceService{}, false},
		{"a hub copy whose hub object exists is kept", &v1alpha2.LLMInferenceService{}, true},
		{"the spoke user's own service is never touched", &v1alpha2.LLMInferenceService{}, true},
		{"a hub-copied config a copy references is kept", &v1alpha2.LLMInferenceServiceConfig{}, true},
		{"a hub-copied config no copy references is deleted", &v1alpha2.LLMInferenceServiceConfig{}, false},
		{"the spoke user's own config is never touched", &v1alpha2.LLMInferenceServiceConfig{}, true},
	}
	names := []string{"gone", "kept", "users", "shared", "stale", "own"}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := f.Spoke("a").API.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: names[i]}, c.obj)
			if kept := err == nil; kept != c.wantKept {
				t.Errorf("%s: kept %v (%v), want %v", names[i], kept, err, c.wantKept)
			}
		})
	}
}

func TestAForeignObjectIsReportedAndNeverWritten(t *testing.T) {
	foreign := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama", Labels: map[string]string{"team": "spoke"}},
		Spec: v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Replicas: ptr.To(int32(7))}}}
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "a")},
		map[string][]client.Object{"a": {foreign}})
	f.reconcile("llama")
	f.reconcile("llama")

	if w := f.Spoke("a").Writes(); len(w) != 0 {
		t.Errorf("writes %q to the cluster holding the foreign object, want none", w)
	}
	cp := f.copyIn("a", "llama")
	if fleetv1alpha1.IsOwnedByHub(cp, hubtest.HubID) || ptr.Deref(cp.Spec.Replicas, 0) != 7 || cp.Labels["team"] != "spoke" {
		t.Errorf("the foreign object changed: %+v", cp.ObjectMeta)
	}
	st := f.hubService("llama").Status
	if len(st.Clusters) != 1 || st.Clusters[0].Phase != PhaseConflict {
		t.Errorf("cluster entries %+v, want one Conflict entry for a", st.Clusters)
	}
	if c := st.GetCondition(Distributed); c == nil || c.Reason != ReasonConflict {
		t.Errorf("Distributed is %+v, want reason %s", c, ReasonConflict)
	}
}

func TestASecondReconcileWithNothingChangedWritesNothing(t *testing.T) {
	cases := []struct {
		name    string
		hub     []client.Object
		prepare func(f *fleet)
	}{
		{"placed and running in two clusters",
			[]client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "a", "b")},
			func(f *fleet) {
				f.reconcile("llama")
				f.markReady("a", "llama", 1)
				f.markReady("b", "llama", 1)
				f.reconcile("llama")
			}},
		{"copies written, not yet ready",
			[]client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "a", "b")},
			func(f *fleet) { f.reconcile("llama") }},
		{"no placement selects the service",
			[]client.Object{service("llama", 1)},
			func(f *fleet) { f.reconcile("llama") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t, c.hub, map[string][]client.Object{"a": nil, "b": nil})
			c.prepare(f)
			f.ClearWrites()
			f.reconcile("llama")
			if w := f.Writes(); len(w) > 0 {
				t.Errorf("writes by cluster %v, want none", w)
			}
		})
	}
}

func TestAnUpgradedHubKeepsTheDecisionInForce(t *testing.T) {
	// The decision in force gave each cluster 2 replicas; deciding again
	// would give each the service's 1.
	svc := placedOn(service("llama", 1), "", map[string]int32{"a": 2, "b": 2})
	svc.Status.Placement = nil
	pl := placementOf(fleetv1alpha1.Duplicated, "a", "b")
	hash := placement.Fingerprint(pl, svc, []string{"a", "b"})
	svc.Status.Annotations = map[string]string{"fleet.fleetinfer.io/placement-inputs": hash, "fleet.fleetinfer.io/failed-over": "c"}
	f := newFleet(t, []client.Object{svc, pl}, map[string][]client.Object{
		"a": {spokewrite.Namespace(ns, hubtest.HubID), hubCopy("llama", 2)}, "b": {spokewrite.Namespace(ns, hubtest.HubID), hubCopy("llama", 2)}})

	f.reconcile("llama")
	if w := f.Writes(); len(w) != 1 || len(w[hubtest.HubName]) != 1 {
		t.Errorf("writes by cluster %v, want only the hub's status", w)
	}
	st := f.hubService("llama").Status
	if p := st.Placement; p == nil || p.InputsHash != hash || p.PlacementName != "gpus" || len(p.FailedOverClusters) != 1 {
		t.Errorf("status.placement %+v, want the legacy decision (hash %s, failed over c) under placement gpus", p, hash)
	}
	if len(st.Annotations) != 0 {
		t.Errorf("status.annotations %v, want the legacy ones dropped", st.Annotations)
	}
	for _, c := range st.Clusters {
		if c.DesiredReplicas != 2 {
			t.Errorf("%s desires %d replicas, want the decision in force's 2", c.Name, c.DesiredReplicas)
		}
	}
	f.ClearWrites()
	f.reconcile("llama")
	if w := f.Writes(); len(w) > 0 {
		t.Errorf("writes by cluster %v after the migration, want none", w)
	}
}

func TestReportSetsPhasesAndConditions(t *testing.T) {
	clusters := []inventory.Cluster{{Name: "a"}, {Name: "b"}, {Name: "down", UnavailableSince: time.Now(), Reason: "probe failed"}}
	ready := func(n int32) *observed {
		return &observed{exists: true, ours: true, replicas: n, readyReplicas: n, ready: true, url: "http://x"}
	}
	placed := condition(placement.Placed, corev1.ConditionTrue, placement.ReasonPlaced, "")
	on := func(want map[string]int32) outcome {
		return outcome{decision: decision{want: want}, placed: placed, memory: &v1alpha2.PlacementStatus{InputsHash: "h"}}
	}
	type want struct {
		phases      string // name=phase, in order
		distributed string // status/reason, "" when absent
		ready       string
	}
	cases := []struct {
		name   string
		out    outcome
		copies map[string]*observed
		want   want
	}{
		{"a chosen copy ready with its share runs",
			on(map[string]int32{"a": 2}), map[string]*observed{"a": ready(2)},
			want{"a=Running", "True/Distributed", "True/"}},
		{"a chosen copy short of its share is placing",
			on(map[string]int32{"a": 2}), map[string]*observed{"a": {exists: true, ours: true, replicas: 2, readyReplicas: 1}},
			want{"a=Placing", "True/Distributed", "False/" + ReasonClustersNotReady}},
		{"a chosen cluster without its copy is placing",
			on(map[string]int32{"a": 2}), map[string]*observed{"a": {}},
			want{"a=Placing", "False/" + ReasonInProgress, "False/" + ReasonClustersNotReady}},
		{"a cluster out of the decision is leaving",
			on(map[string]int32{"a": 2}), map[string]*observed{"a": ready(2), "b": ready(2)},
			want{"a=Running b=Leaving", "False/" + ReasonInProgress, "True/"}},
		{"an unreachable chosen cluster",
			on(map[string]int32{"a": 1, "down": 1}), map[string]*observed{"a": ready(1), "down": {err: errFake("probe failed")}},
			want{"a=Running down=Unreachable", "False/" + ReasonUnreachable, "False/" + ReasonClustersNotReady}},
		{"a foreign object in a chosen cluster is a conflict",
			on(map[string]int32{"a": 1}), map[string]*observed{"a": {exists: true, ready: true, readyReplicas: 1, replicas: 1}},
			want{"a=Conflict", "False/" + ReasonConflict, "False/" + ReasonClustersNotReady}},
		{"without a placement Ready says why",
			outcome{placed: condition(placement.Placed, corev1.ConditionFalse, placement.ReasonNoPlacement, "none")}, map[string]*observed{},
			want{"", "", "False/" + placement.ReasonNoPlacement}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			svc := service("llama", 1)
			svc.Status.Annotations = map[string]string{"fleet.fleetinfer.io/placement-inputs": "old"}
			report(svc, c.out, clusters, c.copies)
			st := &svc.Status
			var phases []string
			for _, e := range st.Clusters {
				phases = append(phases, e.Name+"="+e.Phase)
			}
			got := want{strings.Join(phases, " "), cond(st, Distributed), cond(st, v1alpha2.Ready)}
			if got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
			if p := st.GetCondition(placement.Placed); p == nil || p.Reason != c.out.placed.Reason {
				t.Errorf("Placed is %+v, want the decided %+v", p, c.out.placed)
			}
			if st.Placement != c.out.memory || len(st.Annotations) != 0 {
				t.Errorf("status.placement %+v, annotations %v: want the decided memory and no legacy annotations", st.Placement, st.Annotations)
			}
		})
	}
}

type errFake string

func (e errFake) Error() string { return string(e) }

func cond(st *v1alpha2.LLMInferenceServiceStatus, t v1alpha2.ConditionType) string {
	c := st.GetCondition(t)
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

func TestEventReasonsNameTheLoss(t *testing.T) {
	withConds := func(conds ...v1alpha2.Condition) *v1alpha2.LLMInferenceServiceStatus {
		return &v1alpha2.LLMInferenceServiceStatus{Status: v1alpha2.Status{Conditions: conds}}
	}
	is := func(t v1alpha2.ConditionType, s corev1.ConditionStatus, reason string) v1alpha2.Condition {
		return v1alpha2.Condition{Type: t, Status: s, Reason: reason, Message: "m"}
	}
	placedTrue := is(placement.Placed, corev1.ConditionTrue, placement.ReasonPlaced)
	cases := []struct {
		name          string
		before, after *v1alpha2.LLMInferenceServiceStatus
		failovers     []failover
		want          []string
	}{
		{"gaining a condition is named by its type",
			withConds(), withConds(placedTrue, is(Distributed, corev1.ConditionTrue, "Distributed"), is(v1alpha2.Ready, corev1.ConditionTrue, "")),
			nil, []string{"Normal Placed m", "Normal Distributed m", "Normal Ready m"}},
		{"losing a condition is named NotPlaced, NotDistributed, NotReady",
			withConds(placedTrue), withConds(is(placement.Placed, corev1.ConditionFalse, placement.ReasonNoPlacement),
				is(Distributed, corev1.ConditionFalse, ReasonInProgress), is(v1alpha2.Ready, corev1.ConditionFalse, ReasonClustersNotReady)),
			nil, []string{"Warning NotPlaced m", "Warning NotDistributed m", "Warning NotReady m"}},
		{"an unchanged condition is quiet",
			withConds(placedTrue), withConds(placedTrue), nil, nil},
		{"a failover is announced before the conditions",
			withConds(placedTrue), withConds(placedTrue),
			[]failover{{cluster: inventory.Cluster{Name: "east", UnavailableSince: time.Unix(0, 0), Reason: "probe failed"}, to: "west=1"}},
			[]string{"Warning Failover Cluster east unavailable since 1970-01-01T00:00:00Z (probe failed): its replicas move to west=1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t, nil, nil)
			svc := service("llama", 1)
			svc.Status = *c.after
			f.r.events(svc, c.before, c.failovers, nil)
			got := f.Events.Drain()
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("events\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}
