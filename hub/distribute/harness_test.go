package distribute

import (
	"context"
	"sort"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

const ns = "llm"

// fixedClusters is an inventory.Source of clusters that never change.
type fixedClusters []inventory.Cluster

func (f fixedClusters) Clusters(context.Context) []inventory.Cluster { return f }

// fleet is a hub and its spokes on fake clients that count their writes.
type fleet struct {
	t        *testing.T
	hub      client.Client
	spokes   map[string]client.Client
	writes   map[string]*atomic.Int64 // by cluster name, "hub" for the hub
	r        *Reconciler
	recorder *record.FakeRecorder
}

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha2.AddToScheme, fleetv1alpha1.AddToScheme, clusterv1beta1.Install} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// newFleet builds a hub holding hubObjs and one spoke per key of spokeObjs.
// testHubID is the identity of the hub under test.
const testHubID = "hub-under-test"

func newFleet(t *testing.T, hubObjs []client.Object, spokeObjs map[string][]client.Object) *fleet {
	t.Helper()
	s := testScheme(t)
	build := func(name string, objs []client.Object) (client.Client, *atomic.Int64) {
		n := &atomic.Int64{}
		c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
			WithStatusSubresource(&v1alpha2.LLMInferenceService{}, &fleetv1alpha1.InferencePlacement{}, &fleetv1alpha1.ClusterCapacity{}).
			WithInterceptorFuncs(hubtest.RecordWrites(func(string, client.Object) { n.Add(1) })).Build()
		return c, n
	}
	f := &fleet{t: t, spokes: map[string]client.Client{}, writes: map[string]*atomic.Int64{}, recorder: record.NewFakeRecorder(100)}
	f.hub, f.writes["hub"] = build("hub", hubObjs)
	var names []string
	for name := range spokeObjs {
		names = append(names, name)
	}
	sort.Strings(names)
	var clusters fixedClusters
	for _, name := range names {
		c, n := build(name, spokeObjs[name])
		f.spokes[name], f.writes[name] = c, n
		clusters = append(clusters, inventory.Cluster{Name: name, Client: c, Reader: c})
	}
	f.r = &Reconciler{hub: f.hub, clusters: clusters, recorder: f.recorder, opts: Options{HubID: testHubID}, deletions: &deletions{hubID: testHubID}}
	return f
}

// reconcile reconciles the hub service name and fails the test on error.
func (f *fleet) reconcile(name string) {
	f.t.Helper()
	if _, err := f.r.Reconcile(context.Background(), watch.Request(ns, name)); err != nil {
		f.t.Fatalf("reconcile %s: %v", name, err)
	}
}

// totalWrites is the writes counted so far in the hub and every spoke.
func (f *fleet) totalWrites() map[string]int64 {
	out := map[string]int64{}
	for name, n := range f.writes {
		if v := n.Load(); v > 0 {
			out[name] = v
		}
	}
	return out
}

func (f *fleet) resetWrites() {
	for _, n := range f.writes {
		n.Store(0)
	}
}

// hubService reads the hub service back.
func (f *fleet) hubService(name string) *v1alpha2.LLMInferenceService {
	f.t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	if err := f.hub.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		f.t.Fatal(err)
	}
	return svc
}

// copyIn returns a spoke's copy of service name, nil when it has none.
func (f *fleet) copyIn(cluster, name string) *v1alpha2.LLMInferenceService {
	f.t.Helper()
	cp := &v1alpha2.LLMInferenceService{}
	if err := f.spokes[cluster].Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, cp); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil
		}
		f.t.Fatal(err)
	}
	return cp
}

// markReady makes a spoke's copy report Ready with ready replicas, as the
// spoke controller would.
func (f *fleet) markReady(cluster, name string, ready int32) {
	f.t.Helper()
	cp := f.copyIn(cluster, name)
	if cp == nil {
		f.t.Fatalf("%s has no copy of %s", cluster, name)
	}
	setReady(cp, ready)
	if err := f.spokes[cluster].Status().Update(context.Background(), cp); err != nil {
		f.t.Fatal(err)
	}
}

// markNotReady makes a spoke's copy report ready of its replicas ready and
// not Ready, its main workload saying why, as the spoke controller would
// for pods Pending, pulling or crashing.
func (f *fleet) markNotReady(cluster, name string, ready int32, why string) {
	f.t.Helper()
	cp := f.copyIn(cluster, name)
	if cp == nil {
		f.t.Fatalf("%s has no copy of %s", cluster, name)
	}
	cp.Status.ObservedGeneration = cp.Generation
	cp.Status.MarkFalse(v1alpha2.MainWorkloadReady, "MinimumReplicasUnavailable", "%s", why)
	cp.Status.MarkFalse(v1alpha2.Ready, "WorkloadsNotReady", "the main workload is not ready")
	cp.Status.Workloads = &v1alpha2.WorkloadStatus{Primary: &v1alpha2.ObservedWorkloadStatus{ReadyReplicas: ptr.To(ready)}}
	if err := f.spokes[cluster].Status().Update(context.Background(), cp); err != nil {
		f.t.Fatal(err)
	}
}

// restartHub replaces the reconciler with a new one on the same hub and
// spokes: nothing it knew in memory survives, as in a hub restarted or a
// new leader.
func (f *fleet) restartHub() {
	old := f.r
	f.r = &Reconciler{hub: old.hub, clusters: old.clusters, recorder: old.recorder, opts: old.opts,
		deletions: &deletions{hubID: old.opts.HubID}, now: old.now}
}

func setReady(cp *v1alpha2.LLMInferenceService, ready int32) {
	cp.Status.ObservedGeneration = cp.Generation
	cp.Status.MarkTrue(v1alpha2.Ready)
	cp.Status.URL = ptr.To("http://" + cp.Name + ".example")
	cp.Status.Workloads = &v1alpha2.WorkloadStatus{Primary: &v1alpha2.ObservedWorkloadStatus{ReadyReplicas: ptr.To(ready)}}
}

// service is a hub service of a CPU model (no accelerators, so no capacity
// report is needed to place it).
func service(name string, replicas int32) *v1alpha2.LLMInferenceService {
	return &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-svc-" + name)},
		Spec: v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Replicas: ptr.To(replicas)}}}
}

// hubCopy is a copy the hub wrote into a spoke, with its replicas ready.
func hubCopy(name string, replicas int32) *v1alpha2.LLMInferenceService {
	cp := desiredCopy(service(name, replicas), testHubID, "", replicas, "")
	setReady(cp, replicas)
	return cp
}

// placementOf places the namespace's services on the named clusters.
func placementOf(strategy fleetv1alpha1.ReplicaStrategy, clusters ...string) *fleetv1alpha1.InferencePlacement {
	return &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpus", UID: "uid-placement"},
		Spec: fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: clusters},
			Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: strategy}}}
}
