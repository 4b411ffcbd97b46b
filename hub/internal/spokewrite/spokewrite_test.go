package spokewrite

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

func configMap(hubID, value string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": value}}
	if hubID != "" {
		fleetv1alpha1.MarkOwnedByHub(cm, hubID)
	}
	return cm
}

func copyData(cur, want *corev1.ConfigMap) bool {
	if cur.Data["k"] == want.Data["k"] {
		return false
	}
	cur.Data = want.Data
	return true
}

func TestEnsureCreatesUpdatesWhatDiffersAndRefusesWhatIsNotOurs(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	prepared := 0
	prepare := func() error { prepared++; return nil }
	steps := []struct {
		name string
		want *corev1.ConfigMap
		res  Result
	}{
		{"absent: created after prepare", configMap("hub-a", "1"), Created},
		{"same content: nothing written", configMap("hub-a", "1"), Unchanged},
		{"new content: updated", configMap("hub-a", "2"), Updated},
	}
	for _, s := range steps {
		res, err := Ensure(ctx, c, "hub-a", s.want, prepare, copyData)
		if err != nil || res != s.res {
			t.Fatalf("%s: got %v, %v; want %v", s.name, res, err, s.res)
		}
	}
	if prepared != 1 {
		t.Errorf("prepare ran %d times, want once (before the create)", prepared)
	}
	_, err := Ensure(ctx, c, "hub-b", configMap("hub-b", "3"), prepare, copyData)
	var notOurs *NotOursError
	if !errors.As(err, &notOurs) {
		t.Fatalf("another hub's write: got %v, want a NotOursError", err)
	}
	got := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "cm"}, got); err != nil || got.Data["k"] != "2" {
		t.Errorf("the object after the refused write holds %v (%v), want 2", got.Data, err)
	}
}

// The hub creates a missing namespace, writes into one it created or one
// that opts in to its ID, and into no other: not one created by someone
// else, nor by another hub, nor one that opts in to another hub.
func TestEnsureNamespaceWritesOnlyIntoOurOrOptedInNamespaces(t *testing.T) {
	ctx := context.Background()
	ns := func(name string, labels map[string]string) client.Object {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	c := fake.NewClientBuilder().WithObjects(
		ns("ours", fleetv1alpha1.HubNamespaceLabels("hub-a")),
		ns("opted-in", map[string]string{fleetv1alpha1.AcceptsHubLabel: "hub-a"}),
		ns("monitoring", nil),
		ns("other-hubs", fleetv1alpha1.HubNamespaceLabels("hub-b")),
		ns("opted-in-to-b", map[string]string{fleetv1alpha1.AcceptsHubLabel: "hub-b"}),
	).Build()
	for name, mayWrite := range map[string]bool{"missing": true, "ours": true, "opted-in": true,
		"monitoring": false, "other-hubs": false, "opted-in-to-b": false} {
		err := EnsureNamespace(ctx, c, name, "hub-a")
		var notOurs *NamespaceNotOursError
		switch {
		case mayWrite && err != nil:
			t.Errorf("%s: %v; want the hub to write there", name, err)
		case !mayWrite && !errors.As(err, &notOurs):
			t.Errorf("%s: %v; want a NamespaceNotOursError", name, err)
		case !mayWrite && notOurs.OptIn() != fleetv1alpha1.AcceptsHubLabel+"=hub-a":
			t.Errorf("%s: opt-in %q; want the accepts-hub label with the hub's ID", name, notOurs.OptIn())
		}
	}
	created := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: "missing"}, created); err != nil || !fleetv1alpha1.IsOwnedByHub(created, "hub-a") {
		t.Errorf("created namespace %v (%v); want it labelled as hub-a's", created.Labels, err)
	}
}
