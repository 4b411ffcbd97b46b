package kubectlplugin

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

func TestPickerCountsLeaveOutRequestsForwardedFromElsewhere(t *testing.T) {
	tests := []struct {
		name    string
		metrics string
		want    Counts
	}{
		{name: "no picks yet", metrics: "# HELP x\n", want: Counts{ServedIn: map[string]float64{}}},
		{name: "local and remote picks", metrics: `fleetinfer_epp_picks_total{cluster="",locality="local"} 8
fleetinfer_epp_picks_total{cluster="east",locality="remote"} 3
fleetinfer_epp_picks_total{cluster="west",locality="remote"} 1
fleetinfer_epp_parent_marks_total{result="absent"} 12
`, want: Counts{Entered: 12, ServedIn: map[string]float64{"": 8, "east": 3, "west": 1}}},
		{name: "forwarded here by another picker", metrics: `fleetinfer_epp_picks_total{cluster="",locality="local"} 10
fleetinfer_epp_parent_marks_total{result="accepted"} 4
fleetinfer_epp_parent_marks_total{result="absent"} 6
fleetinfer_epp_parent_marks_total{result="rejected"} 0
`, want: Counts{Entered: 6, ServedIn: map[string]float64{"": 6}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PickerCounts([]byte(tc.metrics))
			if err != nil {
				t.Fatal(err)
			}
			if got.Entered != tc.want.Entered || len(got.ServedIn) != len(tc.want.ServedIn) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for k, v := range tc.want.ServedIn {
				if got.ServedIn[k] != v {
					t.Fatalf("served in %q: %v, want %v", k, got.ServedIn[k], v)
				}
			}
		})
	}
}

func TestExplainSaysWhyEachClusterIsInOrOut(t *testing.T) {
	member := func(name string, available metav1.ConditionStatus) fleetv1alpha1.MemberCluster {
		return fleetv1alpha1.MemberCluster{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: fleetv1alpha1.MemberClusterStatus{
			Conditions: []metav1.Condition{{Type: fleetv1alpha1.MemberClusterAvailable, Status: available, Message: "API server unreachable"}}}}
	}
	members := []fleetv1alpha1.MemberCluster{member("a", "True"), member("b", "True"), member("c", "False"), member("d", "True"), member("e", "True")}
	svc := &v1alpha2.LLMInferenceService{Status: v1alpha2.LLMInferenceServiceStatus{
		Clusters: []v1alpha2.ClusterStatus{
			{Name: "a", DesiredReplicas: 2, ReadyReplicas: 1, Phase: "Placing", PlacementReason: "room for 4", Message: "pods starting"},
			{Name: "d", DesiredReplicas: 0, ReadyReplicas: 1, Phase: "Leaving"},
		},
		Placement: &v1alpha2.PlacementStatus{PlacementName: "p", FailedOverClusters: []string{"c"},
			NotEligible: []v1alpha2.ExcludedCluster{{Name: "c", Reason: "unavailable beyond the failover toleration"}}},
	}}
	pl := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"a", "b", "c", "d"}}}}
	want := map[string][2]string{
		"a": {"chosen", "room for 4; pods starting"},
		"b": {"not chosen", "eligible, but the strategy gave it no replicas (no room, no weight, or beyond maxClusters)"},
		"c": {"not eligible", "unavailable beyond the failover toleration; failed over: lost its replicas while unavailable; unavailable: API server unreachable"},
		"d": {"leaving", "no longer in the decision; kept until the clusters of the new placement are ready"},
		"e": {"not asked for", "InferencePlacement p lists clusters.names [a b c d]"},
	}
	got := explainClusters(svc, pl, members)
	if len(got) != len(want) {
		t.Fatalf("got %d rows, want %d: %+v", len(got), len(want), got)
	}
	for _, r := range got {
		if w := want[r.cluster]; r.decision != w[0] || r.why != w[1] {
			t.Errorf("%s: %q, %q; want %q, %q", r.cluster, r.decision, r.why, w[0], w[1])
		}
	}
}

// status shows per cluster how many copies are pending deletion and held,
// then each listed copy with when the orphan collector deletes it.
func TestStatusShowsWhatIsPendingDeletionAndWhen(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	after := metav1.NewTime(now.Add(59 * time.Minute))
	east := fleetv1alpha1.MemberCluster{ObjectMeta: metav1.ObjectMeta{Name: "east"}, Status: fleetv1alpha1.MemberClusterStatus{
		PendingDeletionCount: 2, HeldDeletionCount: 1,
		PendingDeletions: []fleetv1alpha1.PendingDeletion{
			{Namespace: "llm", Name: "lost", OrphanedSince: metav1.NewTime(now.Add(-time.Minute)), DeleteAfter: &after},
			{Namespace: "llm", Name: "kept", OrphanedSince: metav1.NewTime(now.Add(-time.Hour)), Held: true},
		}}}
	if got := deletions(east.Status); got != "2 pending, 1 held" {
		t.Errorf("DELETIONS %q, want \"2 pending, 1 held\"", got)
	}
	if got := deletions(fleetv1alpha1.MemberClusterStatus{}); got != "none" {
		t.Errorf("DELETIONS %q without any, want none", got)
	}
	var out strings.Builder
	if err := pendingDeletions(&out, []fleetv1alpha1.MemberCluster{east, {ObjectMeta: metav1.ObjectMeta{Name: "west"}}}, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"east     llm        lost           2026-01-02T02:59:00Z  2026-01-02T03:59:00Z (in 59m0s)",
		"held: fleet.fleetinfer.io/deletion-protected=Always", "east     (1 more)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("pending deletions lack %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := pendingDeletions(&out, []fleetv1alpha1.MemberCluster{{ObjectMeta: metav1.ObjectMeta{Name: "west"}}}, now); err != nil || out.Len() != 0 {
		t.Errorf("pending deletions without any: %q (%v), want nothing", out.String(), err)
	}
}
