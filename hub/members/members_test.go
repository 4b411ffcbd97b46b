package members

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/internal/fence"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

func TestStatusFollowsAvailabilityAndKeepsTheLastCapacity(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	lost := now.Add(-time.Minute)
	h100 := &fleetv1alpha1.ClusterCapacityStatus{Nodes: 2, Summary: "H100 3/8 free",
		Accelerators: []fleetv1alpha1.AcceleratorCapacity{{Product: "H100", Resource: "nvidia.com/gpu", Allocatable: 8, Free: 3}}}
	available := fleetv1alpha1.MemberClusterStatus{Nodes: 2, Summary: "H100 3/8 free", Accelerators: h100.Accelerators,
		Conditions: []metav1.Condition{{Type: "Available", Status: "True", Reason: fleetv1alpha1.ReasonClusterAvailable,
			LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))}}}
	tests := []struct {
		name        string
		cur         fleetv1alpha1.MemberClusterStatus
		cluster     inventory.Cluster
		capacity    *fleetv1alpha1.ClusterCapacityStatus
		wantStatus  metav1.ConditionStatus
		wantSince   time.Time
		wantSummary string
	}{
		{name: "new and available", cluster: inventory.Cluster{Name: "east"}, capacity: h100,
			wantStatus: "True", wantSince: now, wantSummary: "H100 3/8 free"},
		{name: "still available keeps its transition time", cur: available, cluster: inventory.Cluster{Name: "east"}, capacity: h100,
			wantStatus: "True", wantSince: now.Add(-time.Hour), wantSummary: "H100 3/8 free"},
		{name: "lost: unavailable since the loss, the last report kept", cur: available,
			cluster:    inventory.Cluster{Name: "east", UnavailableSince: lost, Reason: "API server unreachable"},
			wantStatus: "False", wantSince: lost, wantSummary: "H100 3/8 free"},
		{name: "no report yet", cluster: inventory.Cluster{Name: "east"}, wantStatus: "True", wantSince: now},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := Status(tc.cur, tc.cluster, tc.capacity, now)
			c := meta.FindStatusCondition(st.Conditions, fleetv1alpha1.MemberClusterAvailable)
			if c == nil || c.Status != tc.wantStatus || !c.LastTransitionTime.Time.Equal(tc.wantSince) {
				t.Fatalf("Available = %+v, want %s since %s", c, tc.wantStatus, tc.wantSince)
			}
			if st.Summary != tc.wantSummary {
				t.Fatalf("summary %q, want %q", st.Summary, tc.wantSummary)
			}
			if tc.wantStatus == "False" && c.Reason != fleetv1alpha1.ReasonClusterUnavailable {
				t.Fatalf("reason %q", c.Reason)
			}
		})
	}
}

// A cluster whose hub lease another hub installation holds is HubLeaseHeld
// False, saying who holds it, with a Warning Event once; taking it back is
// a Normal Event; a lease not acquired yet, as at every start, is no Event.
func TestHubLeaseHeldConditionAndEvents(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	held := fence.Fence{Reason: fleetv1alpha1.ReasonHeldByAnotherHub, Message: `held by hub installation "uid-b/fleetinfer-system"`}
	notYet := fence.Fence{Reason: fleetv1alpha1.ReasonHubLeaseNotAcquired, Message: "not acquired yet"}
	steps := []struct {
		fence      fence.Fence
		wantStatus metav1.ConditionStatus
		wantEvent  string
	}{
		{fence: notYet, wantStatus: "False"},
		{wantStatus: "True"},
		{fence: held, wantStatus: "False", wantEvent: "Warning HeldByAnotherHub " + held.Message},
		{fence: held, wantStatus: "False"},
		{wantStatus: "True", wantEvent: "Normal HubLeaseHeld this hub holds its hub lease in the cluster again and writes there"},
	}
	events := record.NewFakeRecorder(10)
	r := &Reconciler{Recorder: events}
	mc := &fleetv1alpha1.MemberCluster{ObjectMeta: metav1.ObjectMeta{Name: "east"}}
	for i, s := range steps {
		c := inventory.Cluster{Name: "east", Fence: s.fence}
		st := Status(mc.Status, c, nil, now)
		cond := meta.FindStatusCondition(st.Conditions, fleetv1alpha1.MemberClusterHubLeaseHeld)
		if cond == nil || cond.Status != s.wantStatus || (s.fence.Fenced() && (cond.Reason != s.fence.Reason || cond.Message != s.fence.Message)) {
			t.Fatalf("step %d: HubLeaseHeld = %+v, want %s for %+v", i, cond, s.wantStatus, s.fence)
		}
		r.leaseEvent(mc, mc.Status, *cond)
		var got string
		select {
		case got = <-events.Events:
		default:
		}
		if got != s.wantEvent {
			t.Errorf("step %d: Event %q, want %q", i, got, s.wantEvent)
		}
		mc.Status = st
	}
}
