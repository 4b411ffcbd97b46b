package federation

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
)

const importName = svcName + "-inference-pool"

// ownedByCopyOrImport reports whether ref is the copy of the service in
// cluster or, for an importer, its import.
func ownedByCopyOrImport(ref metav1.OwnerReference, cluster string) bool {
	return ref.UID == types.UID(cluster+"-copy") || (ref.UID == types.UID(cluster+"-import") && ref.Kind == "InferencePoolImport")
}

// exporting is a copy in Parent mode that reports its picker, its gateway
// and its pool.
func exporting(cluster, picker, gateway string) *v1alpha2.LLMInferenceService {
	cp := copyOf(cluster, fleetv1alpha1.FederationParent, reports(picker, gateway))
	cp.Status.Router = &v1alpha2.RouterStatus{Scheduler: &v1alpha2.ObservedSchedulerStatus{
		InferencePool: &gwapiv1.ObjectReference{Name: importName}}}
	return cp
}

// importOf is the hub's import of the pool in cluster, routed by the
// spoke's import controller when routed is true.
func importOf(cluster string, routed bool) *igwapixv1alpha1.InferencePoolImport {
	imp := &igwapixv1alpha1.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: importName, UID: types.UID(cluster + "-import")}}
	fleetv1alpha1.MarkOwnedByHub(imp, hubtest.HubID)
	imp.Status.Controllers = []igwapixv1alpha1.ImportController{{Name: "fleetinfer.io/hub",
		ExportingClusters: []igwapixv1alpha1.ExportingCluster{{Name: "east"}, {Name: "west"}}}}
	if routed {
		imp.Status.Controllers = append(imp.Status.Controllers, igwapixv1alpha1.ImportController{Name: fleetv1alpha1.ImportControllerName})
	}
	return imp
}

// A cluster whose import the spoke routes subscribes to the federation: it
// gets a directory of the exporting pickers in Parent mode (those with a
// gateway) and a certificate, both owned by its import, which the hub
// labels with the service and the cluster; the exporting pickers list it
// as a subscribe-only peer. A cluster whose import is not routed gets
// nothing, and an importer that stops routing loses what it got.
func TestAClusterRoutingTheImportSubscribesToTheFederation(t *testing.T) {
	endpointOnly := copyOf("central", fleetv1alpha1.FederationEndpoint, reports("10.0.3.1:9004", ""))
	f := newFixture(t,
		newSpoke("east", exporting("east", "10.0.1.1:9004", "192.0.2.1:15080")),
		newSpoke("west", exporting("west", "10.0.2.1:9004", "192.0.2.2:15080")),
		newSpoke("central", endpointOnly),
		newSpoke("edge", importOf("edge", true)),
		newSpoke("north", importOf("north", false)))
	f.reconcile(t)
	// Each directory holds the peers in its own copy's mode: east and west
	// ask Parent, central Endpoint, an importer always Parent. central
	// reports no gateway, so the directories that would reach it in Parent
	// mode leave it out.
	f.check(t, map[string][]string{
		"east":    {"edge subscribe-only", "west 10.0.2.1:9004 192.0.2.2:15080 Parent"},
		"west":    {"east 10.0.1.1:9004 192.0.2.1:15080 Parent", "edge subscribe-only"},
		"central": {"east 10.0.1.1:9004 192.0.2.1:15080 Endpoint", "edge subscribe-only", "west 10.0.2.1:9004 192.0.2.2:15080 Endpoint"},
		"edge":    {"east 10.0.1.1:9004 192.0.2.1:15080 Parent", "west 10.0.2.1:9004 192.0.2.2:15080 Parent"},
	})
	imp := &igwapixv1alpha1.InferencePoolImport{}
	if err := f.Spoke("edge").API.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: importName}, imp); err != nil {
		t.Fatal(err)
	}
	if imp.Labels[v1alpha2.LabelName] != svcName || imp.Annotations[fleetv1alpha1.FederationClusterAnnotation] != "edge" {
		t.Errorf("import labels %v, annotations %v; want the service and the cluster", imp.Labels, imp.Annotations)
	}

	f.ClearWrites()
	f.reconcile(t)
	for name, w := range f.spokeWrites() {
		if len(w) > 0 {
			t.Errorf("%s: steady state wrote %v", name, w)
		}
	}

	imp.Status.Controllers = slices.DeleteFunc(imp.Status.Controllers, func(c igwapixv1alpha1.ImportController) bool {
		return c.Name == fleetv1alpha1.ImportControllerName
	})
	if err := f.Spoke("edge").API.Status().Update(context.Background(), imp); err != nil {
		t.Fatal(err)
	}
	f.reconcile(t)
	f.check(t, map[string][]string{
		"east":    {"west 10.0.2.1:9004 192.0.2.2:15080 Parent"},
		"west":    {"east 10.0.1.1:9004 192.0.2.1:15080 Parent"},
		"central": {"east 10.0.1.1:9004 192.0.2.1:15080 Endpoint", "west 10.0.2.1:9004 192.0.2.2:15080 Endpoint"},
	})
}
