package members

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
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
