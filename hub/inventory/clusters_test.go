package inventory

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

// Clusters lists every engaged cluster sorted by name, whatever the order
// they were engaged in, on every call.
func TestClustersAreSortedByName(t *testing.T) {
	inv, _ := newInventory(t)
	srv := newAPIServer(t)
	engaged := []string{"kilo", "charlie", "juliett", "alpha", "india", "echo", "lima", "bravo", "hotel", "delta", "golf", "foxtrot"}
	for _, n := range engaged {
		engage(t, inv, n, srv.URL)
	}
	want := slices.Sorted(slices.Values(engaged))
	for range 3 {
		if got := names(inv.Clusters(t.Context())); !slices.Equal(got, want) {
			t.Fatalf("Clusters() = %v, want %v", got, want)
		}
	}
}

// A cluster's labels are its name plus the labels of its registration
// Secret, ManagedCluster and ClusterProfile; its properties are the
// ManagedCluster's cluster claims and the ClusterProfile's properties. Only
// registrations of its name (and, for the namespaced ones, in the
// inventory's namespace) count, and they are read afresh on every call.
func TestClustersCarryLabelsAndPropertiesFromEveryRegistration(t *testing.T) {
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: "east",
		Labels: map[string]string{"region": "us-east", "from-secret": "yes"}}}
	straySecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Name: "east",
		Labels: map[string]string{"stray": "yes"}}}
	mc := &clusterv1.ManagedCluster{ObjectMeta: metav1.ObjectMeta{Name: "east", Labels: map[string]string{"vendor": "OpenShift"}},
		Status: clusterv1.ManagedClusterStatus{ClusterClaims: []clusterv1.ManagedClusterClaim{
			{Name: "id.k8s.io", Value: "east-id"}, {Name: "platform.open-cluster-management.io", Value: "AWS"}}}}
	cp := &clusterinventoryv1alpha1.ClusterProfile{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: "east",
		Labels: map[string]string{"tier": "gold"}},
		Status: clusterinventoryv1alpha1.ClusterProfileStatus{Properties: []clusterinventoryv1alpha1.Property{{Name: "gpu.count", Value: "8"}}}}
	inv, hub := newInventory(t, secret, straySecret, mc, cp)
	srv := newAPIServer(t)
	east, _ := engage(t, inv, "east", srv.URL)
	west, _ := engage(t, inv, "west", srv.URL)

	cs := inv.Clusters(ctx)
	if got := names(cs); !slices.Equal(got, []string{"east", "west"}) {
		t.Fatalf("Clusters() = %v, want [east west]", got)
	}
	wantLabels := map[string]string{"name": "east", "region": "us-east", "from-secret": "yes", "vendor": "OpenShift", "tier": "gold"}
	wantProps := map[string]string{"id.k8s.io": "east-id", "platform.open-cluster-management.io": "AWS", "gpu.count": "8"}
	if !maps.Equal(cs[0].Labels, wantLabels) {
		t.Errorf("east labels = %v, want %v", cs[0].Labels, wantLabels)
	}
	if !maps.Equal(cs[0].Properties, wantProps) {
		t.Errorf("east properties = %v, want %v", cs[0].Properties, wantProps)
	}
	if want := map[string]string{"name": "west"}; !maps.Equal(cs[1].Labels, want) {
		t.Errorf("west (no registration) labels = %v, want %v", cs[1].Labels, want)
	}
	if len(cs[1].Properties) != 0 {
		t.Errorf("west (no registration) properties = %v, want none", cs[1].Properties)
	}
	for k, c := range map[int]*fakeCluster{0: east, 1: west} {
		if cs[k].Client != c.client || cs[k].Reader != c.reader {
			t.Errorf("%s: Client and Reader are not the engaged cluster's", cs[k].Name)
		}
	}

	if err := hub.Get(ctx, client.ObjectKeyFromObject(mc), mc); err != nil {
		t.Fatal(err)
	}
	mc.Labels["vendor"] = "EKS"
	if err := hub.Update(ctx, mc); err != nil {
		t.Fatal(err)
	}
	if c, ok := inv.Cluster(ctx, "east"); !ok || c.Labels["vendor"] != "EKS" {
		t.Fatalf("after the ManagedCluster's label changed: found=%v labels=%v, want vendor=EKS", ok, c.Labels)
	}
}

// Cluster finds one engaged cluster by name, and nothing for another name.
func TestClusterFindsOnlyEngagedClusters(t *testing.T) {
	inv, _ := newInventory(t)
	engage(t, inv, "here", newAPIServer(t).URL)
	if c, ok := inv.Cluster(t.Context(), "here"); !ok || c.Name != "here" || c.Labels["name"] != "here" {
		t.Fatalf("Cluster(here) = %+v, %v; want the engaged cluster", c, ok)
	}
	if c, ok := inv.Cluster(t.Context(), "gone"); ok {
		t.Fatalf("Cluster(gone) = %+v, true; want not found", c)
	}
}

// When the provider engages a cluster again under the same name, the end of
// the earlier engagement does not remove the new one.
func TestAReplacedEngagementOutlivesItsPredecessor(t *testing.T) {
	const name = "replaced"
	inv, _ := newInventory(t)
	srv := newAPIServer(t)
	_, endFirst := engage(t, inv, name, srv.URL)
	ch := inv.Subscribe(4)
	second := newFakeCluster(name, srv.URL)
	if err := inv.Engage(t.Context(), multicluster.ClusterName(name), second); err != nil {
		t.Fatal(err)
	}
	expectNotified(t, ch, name) // the second engagement

	endFirst()
	// The first engagement's end may or may not be announced; give it time to
	// be processed either way.
	select {
	case <-ch:
	case <-time.After(500 * time.Millisecond):
	}
	c, ok := inv.Cluster(t.Context(), name)
	if !ok {
		t.Fatal("the cluster left the inventory when its earlier engagement ended")
	}
	if c.Client != second.client {
		t.Fatal("the cluster's Client is not the latest engagement's")
	}
}
