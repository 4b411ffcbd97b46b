package export

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

const (
	ns       = "team"
	poolName = "llama"
)

var poolKey = client.ObjectKey{Namespace: ns, Name: poolName}

// member is an available cluster holding objs.
// An exported pool comes with the hub's copy that owns it, as the spoke
// makes it.
func member(name string, objs ...client.Object) *hubtest.Spoke {
	return hubtest.NewSpoke(name, withOwners(objs)...)
}

// withOwners adds to objs the copy each exportedPool among them belongs to.
func withOwners(objs []client.Object) []client.Object {
	for _, o := range objs {
		if owner := metav1.GetControllerOf(o); owner != nil && owner.UID == placedCopyUID {
			return append(objs, placedCopy())
		}
	}
	return objs
}

// unavailable is a cluster the hub cannot reach, holding objs in its cache.
func unavailable(name string, objs ...client.Object) *hubtest.Spoke {
	return member(name, objs...).Unavailable("API server unreachable")
}

// unreadablePools makes every read of an InferencePool fail, as a cache
// that never synced does.
var unreadablePools = fakeapi.FailOn("get", &igwapiv1.InferencePool{}, errors.New("timed out waiting for cache to be synced"))

// fleet is the export reconciler over fake spokes, in the order given.
type fleet struct {
	*hubtest.Fleet
	t *testing.T
	r *Reconciler
}

func newFleet(t *testing.T, spokes ...*hubtest.Spoke) *fleet {
	t.Helper()
	f := &fleet{Fleet: hubtest.NewFleet(t, nil, spokes...), t: t}
	f.r = &Reconciler{Clusters: f.Fleet, HubID: hubtest.HubID}
	return f
}

// reconcile reconciles the pool and fails the test on error.
func (f *fleet) reconcile() {
	f.t.Helper()
	if _, err := f.r.Reconcile(context.Background(), watch.Request(ns, poolName)); err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
}

// exportingIn is the exporting clusters the hub's import in cluster lists,
// or nil when the cluster has no import of the hub's. An import without the
// hub's controller entry lists nothing ([]string{}).
func (f *fleet) exportingIn(cluster string) []string {
	f.t.Helper()
	imp := &igwapixv1alpha1.InferencePoolImport{}
	if !f.Get(cluster, poolKey, imp) || !fleetv1alpha1.IsOwnedByHub(imp, hubtest.HubID) {
		return nil
	}
	out := []string{}
	for _, ic := range imp.Status.Controllers {
		if ic.Name == ControllerName {
			for _, ec := range ic.ExportingClusters {
				out = append(out, string(ec.Name))
			}
		}
	}
	return out
}

// exportedIn reports whether the pool in cluster carries the hub's
// Exported parent entry, checking that entry whole.
func (f *fleet) exportedIn(cluster string) bool {
	f.t.Helper()
	p := &igwapiv1.InferencePool{}
	if !f.Get(cluster, poolKey, p) {
		return false
	}
	found := false
	for _, ps := range p.Status.Parents {
		if ps.ParentRef.Kind != "InferencePoolImport" {
			continue
		}
		if found {
			f.t.Errorf("%s: the pool has more than one InferencePoolImport parent: %+v", cluster, p.Status.Parents)
		}
		found = true
		ref := ps.ParentRef
		if ref.Group == nil || string(*ref.Group) != igwapixv1alpha1.SchemeGroupVersion.Group || string(ref.Name) != poolName ||
			string(ref.Namespace) != ns || ps.ControllerName != ControllerName {
			f.t.Errorf("%s: the Exported parent is %+v (controller %s), want the import %s of group %s by %s",
				cluster, ref, ps.ControllerName, poolKey, igwapixv1alpha1.SchemeGroupVersion.Group, ControllerName)
		}
		if len(ps.Conditions) != 1 {
			f.t.Errorf("%s: the Exported parent has conditions %+v, want Exported only", cluster, ps.Conditions)
			continue
		}
		c := ps.Conditions[0]
		if c.Type != string(igwapiv1.InferencePoolConditionExported) || c.Status != metav1.ConditionTrue ||
			c.Reason != string(igwapiv1.InferencePoolReasonExported) || c.ObservedGeneration != p.Generation {
			f.t.Errorf("%s: the Exported parent's condition is %+v, want Exported=True for generation %d", cluster, c, p.Generation)
		}
	}
	return found
}

// exportedGauge is the exported-clusters gauge of the pool; false when the
// pool has no series.
func exportedGauge(t *testing.T) (float64, bool) {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	importedPools.Collect(ch)
	close(ch)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		l := map[string]string{}
		for _, lp := range d.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["namespace"] == ns && l["pool"] == poolName {
			return d.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// exportedPool is the pool of a copy the hub placed, which its cluster
// exports to the ClusterSet.
func exportedPool() *igwapiv1.InferencePool {
	p := foreignExportedPool()
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha2.GroupVersion.String(), Kind: "LLMInferenceService",
		Name: placedCopy().Name, UID: placedCopyUID, Controller: ptr.To(true)}}
	return p
}

// foreignExportedPool is an exported pool of no copy of the hub's.
func foreignExportedPool() *igwapiv1.InferencePool {
	p := pool()
	p.Annotations = map[string]string{igwapixv1alpha1.ExportAnnotationKey: igwapixv1alpha1.ExportAnnotationVal}
	return p
}

const placedCopyUID = "uid-placed-copy"

// placedCopy is the hub's copy of a service whose pool is exportedPool.
func placedCopy() *v1alpha2.LLMInferenceService {
	cp := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama", UID: placedCopyUID}}
	fleetv1alpha1.MarkOwnedByHub(cp, hubtest.HubID)
	return cp
}

// pool is a pool its cluster does not export.
func pool() *igwapiv1.InferencePool {
	return &igwapiv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: poolName, Generation: 3}}
}

// ownImport is a spoke's own InferencePoolImport of the pool's name,
// labelled with labels, with a status its own controller wrote.
func ownImport(labels map[string]string) *igwapixv1alpha1.InferencePoolImport {
	return &igwapixv1alpha1.InferencePoolImport{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: poolName, Labels: labels},
		Status: igwapixv1alpha1.InferencePoolImportStatus{Controllers: []igwapixv1alpha1.ImportController{{
			Name: "example.net/import", ExportingClusters: []igwapixv1alpha1.ExportingCluster{{Name: "elsewhere"}}}}},
	}
}
