package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub"
	"github.com/fleetinfer/fleetinfer/hub/clusterprofile"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/engaged"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// The registrations the fleet writes are enough for the hub's ClusterProfile
// provider to engage every spoke, each with a client that reaches that
// spoke, and the profiles carry what the ManagedClusters do.
//
// The shared fleet's bin/hub runs the kubeconfig provider, and a second
// bin/hub on the same hub would fight it over the spokes' copies (both
// would place and write every service) unless leader election kept it idle,
// which would leave the provider untested. So the provider runs here, in a
// manager of its own whose only engaged runnable records the clusters: it
// reads the fleet's own ClusterProfiles and Secrets in fleetinfer-system
// (what bin/hub --cluster-provider=clusterprofile would read; a copy in a
// scratch namespace would test the copy), writes nothing there but Events
// on profiles it refuses, and writes nothing to the spokes.
func TestHubClusterProfileProviderEngagesEveryFleetSpoke(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := engaged.New()
	p := clusterprofile.New(clusterprofile.Options{Namespace: fleet.Namespace, Consumer: fleet.HubUser, ClusterOptions: hub.ClusterOptions()})
	mgr, err := mcmanager.New(fl.Hub.Admin(), p, mcmanager.Options{
		Scheme:     hub.Scheme,
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Add(rec); err != nil {
		t.Fatal(err)
	}
	if err := p.SetupWithManager(ctx, mgr); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	var want []string
	for _, s := range fl.Spokes {
		want = append(want, s.Name())
	}
	sort.Strings(want)
	testutil.Eventually(t, 60*time.Second, "every spoke engaged through its ClusterProfile", func(ctx context.Context) error {
		got := rec.Clusters()
		if names := slices.Sorted(maps.Keys(got)); !slices.Equal(names, want) {
			return fmt.Errorf("engaged %v, want %v", names, want)
		}
		for name, cl := range got {
			if err := sameCapacities(ctx, cl, fl.Spoke(name)); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})

	for _, s := range fl.Spokes {
		mc := &clusterv1.ManagedCluster{}
		cp := &clusterinventoryv1alpha1.ClusterProfile{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Name: s.Name()}, mc); err != nil {
			t.Fatal(err)
		}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: s.Name()}, cp); err != nil {
			t.Fatal(err)
		}
		if err := profileMirrors(cp, mc); err != nil {
			t.Errorf("ClusterProfile %s: %v", s.Name(), err)
		}
	}
}

// sameCapacities checks that cl reaches spoke with the hub's access: both
// list the same capacity reports.
func sameCapacities(ctx context.Context, cl cluster.Cluster, spoke *fleet.Cluster) error {
	var via, direct fleetv1alpha1.ClusterCapacityList
	if err := cl.GetAPIReader().List(ctx, &via); err != nil {
		return err
	}
	if err := spoke.Client.List(ctx, &direct); err != nil {
		return err
	}
	names := func(l fleetv1alpha1.ClusterCapacityList) []string {
		var out []string
		for _, c := range l.Items {
			out = append(out, c.Name)
		}
		sort.Strings(out)
		return out
	}
	if a, b := names(via), names(direct); len(a) == 0 || !slices.Equal(a, b) {
		return fmt.Errorf("the engaged client sees capacity reports %v, the spoke has %v", a, b)
	}
	return nil
}

// profileMirrors checks a ClusterProfile against its ManagedCluster: the
// same labels plus the cluster manager's, ControlPlaneHealthy as Available,
// the claims as properties.
func profileMirrors(cp *clusterinventoryv1alpha1.ClusterProfile, mc *clusterv1.ManagedCluster) error {
	var problems []string
	if cp.Spec.ClusterManager.Name != fleet.ClusterManager || cp.Labels[clusterinventoryv1alpha1.LabelClusterManagerKey] != fleet.ClusterManager {
		problems = append(problems, fmt.Sprintf("cluster manager %q, label %q", cp.Spec.ClusterManager.Name, cp.Labels[clusterinventoryv1alpha1.LabelClusterManagerKey]))
	}
	for k, v := range mc.Labels {
		if cp.Labels[k] != v {
			problems = append(problems, fmt.Sprintf("label %s=%q, the ManagedCluster has %q", k, cp.Labels[k], v))
		}
	}
	available := meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable)
	healthy := meta.FindStatusCondition(cp.Status.Conditions, clusterinventoryv1alpha1.ClusterConditionControlPlaneHealthy)
	if available == nil || healthy == nil || healthy.Status != metav1.ConditionTrue || healthy.Status != available.Status {
		problems = append(problems, fmt.Sprintf("ControlPlaneHealthy %+v for Available %+v", healthy, available))
	}
	props := map[string]string{}
	for _, p := range cp.Status.Properties {
		props[p.Name] = p.Value
	}
	for _, c := range mc.Status.ClusterClaims {
		if props[c.Name] != c.Value {
			problems = append(problems, fmt.Sprintf("property %s=%q, claim %q", c.Name, props[c.Name], c.Value))
		}
	}
	if props[fleet.AcceleratorsClaim] == "" {
		problems = append(problems, "no accelerators property")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// decide writes the PlacementDecision of an OCM Placement as OCM's
// placement controller does: owned by the Placement, labelled with its
// name, the chosen clusters in status.decisions. OCM's controllers do not
// run in the local fleet (the fleet plays their registration side only), so
// the test is the scheduler; the Placement says so with OCM's annotation
// for external schedulers.
func decide(t *testing.T, pl *clusterv1beta1.Placement, clusters ...string) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, "PlacementDecision written", func(ctx context.Context) error {
		pd := &clusterv1beta1.PlacementDecision{ObjectMeta: metav1.ObjectMeta{Namespace: pl.Namespace, Name: pl.Name + "-decision-1"}}
		if _, err := controllerutil.CreateOrUpdate(ctx, fl.Hub.Client, pd, func() error {
			pd.Labels = map[string]string{clusterv1beta1.PlacementLabel: pl.Name, clusterv1beta1.DecisionGroupIndexLabel: "0"}
			return controllerutil.SetControllerReference(pl, pd, fl.Hub.Client.Scheme())
		}); err != nil {
			return err
		}
		// Never null: the CRD requires the list, empty or not.
		pd.Status.Decisions = []clusterv1beta1.ClusterDecision{}
		for _, c := range clusters {
			pd.Status.Decisions = append(pd.Status.Decisions, clusterv1beta1.ClusterDecision{ClusterName: c, Reason: "chosen by the test"})
		}
		return fl.Hub.Client.Status().Update(ctx, pd)
	})
}

// A placement that defers to an OCM Placement puts the service exactly on
// the clusters OCM decided, and follows when the decision changes.
func TestHubOCMPlacementDecisionsChooseTheClusters(t *testing.T) {
	ns := namespace(t, fl.Hub)
	pl := &clusterv1beta1.Placement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu-clusters",
		Annotations: map[string]string{clusterv1beta1.PlacementDisableAnnotation: "true"}}}
	if err := fl.Hub.Client.Create(context.Background(), pl); err != nil {
		t.Fatal(err)
	}
	decide(t, pl, "east", "central")
	began := time.Now()
	place(t, gpuService(ns, "ocm-placed", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{OCMPlacement: &fleetv1alpha1.LocalReference{Name: pl.Name}},
		Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Duplicated}})
	hubReady(t, ns, "ocm-placed", "central=1,east=1", 90*time.Second)

	// Only the new decision may move the service: while the copies still
	// settle, any of their events would make the hub look again anyway.
	testutil.Eventually(t, 60*time.Second, "the hub quiet for 5 s", func(context.Context) error {
		if quiet := time.Since(lastWrite(t, began)); quiet < 5*time.Second {
			return fmt.Errorf("last write %s ago", quiet.Round(time.Second))
		}
		return nil
	})
	decide(t, pl, "west")
	hubReady(t, ns, "ocm-placed", "west=1", 60*time.Second)
}
