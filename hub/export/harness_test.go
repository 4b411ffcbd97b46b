package export

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

const (
	ns       = "team"
	poolName = "llama"
)

var poolKey = client.ObjectKey{Namespace: ns, Name: poolName}

var scheme = runtime.NewScheme()

// testHubID is the identity of the hub under test.
const testHubID = "hub-under-test"

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(igwapiv1.Install(scheme))
	utilruntime.Must(igwapixv1alpha1.Install(scheme))
	utilruntime.Must(v1alpha2.AddToScheme(scheme))
}

// clusters is a fixed inventory.
type clusters []inventory.Cluster

func (c clusters) Clusters(context.Context) []inventory.Cluster { return c }

// spoke is one fake member cluster: what it holds, whether the hub sees it
// available, and every write the hub made through its client.
type spoke struct {
	name string
	objs []client.Object
	down bool
	// unreadable makes every read of an InferencePool fail, as a cache that
	// never synced does.
	unreadable bool
	api        client.Client
	writes     []string // "verb Kind namespace/name"
}

// member is an available cluster holding objs.
// An exported pool comes with the hub's copy that owns it, as the spoke
// makes it.
func member(name string, objs ...client.Object) *spoke {
	return &spoke{name: name, objs: withOwners(objs)}
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
func unavailable(name string, objs ...client.Object) *spoke {
	return &spoke{name: name, objs: withOwners(objs), down: true}
}

// interceptors record the hub's writes and fail its pool reads while the
// spoke is unreadable.
func (s *spoke) interceptors() interceptor.Funcs {
	f := hubtest.RecordWrites(s.record)
	f.Get = func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
		if _, pool := o.(*igwapiv1.InferencePool); pool && s.unreadable {
			return errors.New("timed out waiting for cache to be synced")
		}
		return c.Get(ctx, key, o, opts...)
	}
	return f
}

func (s *spoke) record(verb string, o client.Object) {
	kind := fmt.Sprintf("%T", o)
	if gvk, err := apiutil.GVKForObject(o, scheme); err == nil {
		kind = gvk.Kind
	}
	s.writes = append(s.writes, fmt.Sprintf("%s %s %s", verb, kind, client.ObjectKeyFromObject(o)))
}

// fleet is the export reconciler over fake spokes, in the order given.
type fleet struct {
	t      *testing.T
	spokes []*spoke
	r      *Reconciler
}

func newFleet(t *testing.T, spokes ...*spoke) *fleet {
	t.Helper()
	f := &fleet{t: t, spokes: spokes}
	var inv clusters
	for _, s := range spokes {
		s.api = fake.NewClientBuilder().WithScheme(scheme).WithObjects(s.objs...).
			WithStatusSubresource(&igwapiv1.InferencePool{}, &igwapixv1alpha1.InferencePoolImport{}).
			WithInterceptorFuncs(s.interceptors()).Build()
		c := inventory.Cluster{Name: s.name, Client: s.api, Reader: s.api}
		if s.down {
			c.UnavailableSince, c.Reason = time.Now(), "API server unreachable"
		}
		inv = append(inv, c)
	}
	f.r = &Reconciler{Clusters: inv, HubID: testHubID}
	return f
}

// reconcile reconciles the pool and fails the test on error.
func (f *fleet) reconcile() {
	f.t.Helper()
	if _, err := f.r.Reconcile(context.Background(), watch.Request(ns, poolName)); err != nil {
		f.t.Fatalf("Reconcile: %v", err)
	}
}

func (f *fleet) spoke(name string) *spoke {
	f.t.Helper()
	for _, s := range f.spokes {
		if s.name == name {
			return s
		}
	}
	f.t.Fatalf("no spoke %s", name)
	return nil
}

// writes is every write the hub made, by cluster; clusters it did not write
// to are absent.
func (f *fleet) writes() map[string][]string {
	out := map[string][]string{}
	for _, s := range f.spokes {
		if len(s.writes) > 0 {
			out[s.name] = s.writes
		}
	}
	return out
}

func (f *fleet) clearWrites() {
	for _, s := range f.spokes {
		s.writes = nil
	}
}

// get reads an object of a cluster straight from its fake API; false when
// it does not exist.
func (f *fleet) get(cluster string, key client.ObjectKey, o client.Object) bool {
	f.t.Helper()
	err := f.spoke(cluster).api.Get(context.Background(), key, o)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return true
}

// exportingIn is the exporting clusters the hub's import in cluster lists,
// or nil when the cluster has no import of the hub's. An import without the
// hub's controller entry lists nothing ([]string{}).
func (f *fleet) exportingIn(cluster string) []string {
	f.t.Helper()
	imp := &igwapixv1alpha1.InferencePoolImport{}
	if !f.get(cluster, poolKey, imp) || !fleetv1alpha1.IsOwnedByHub(imp, testHubID) {
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
	if !f.get(cluster, poolKey, p) {
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
	fleetv1alpha1.MarkOwnedByHub(cp, testHubID)
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

func namespace(labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}
}
