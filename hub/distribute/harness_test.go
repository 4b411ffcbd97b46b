package distribute

import (
	"context"
	"sort"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

const ns = "llm"

// fleet is the distribution reconciler over a fake hub and spokes.
type fleet struct {
	*hubtest.Fleet
	t *testing.T
	r *Reconciler
}

// newFleet builds a hub holding hubObjs and one spoke per key of spokeObjs,
// listed by name.
func newFleet(t *testing.T, hubObjs []client.Object, spokeObjs map[string][]client.Object) *fleet {
	t.Helper()
	var names []string
	for name := range spokeObjs {
		names = append(names, name)
	}
	sort.Strings(names)
	var spokes []*hubtest.Spoke
	for _, name := range names {
		spokes = append(spokes, hubtest.NewSpoke(name, spokeObjs[name]...))
	}
	f := &fleet{Fleet: hubtest.NewFleet(t, hubObjs, spokes...), t: t}
	f.r = &Reconciler{hub: f.Hub.Client, clusters: f.Fleet, recorder: f.Events, opts: Options{HubID: hubtest.HubID},
		deletions: &deletions{hubID: hubtest.HubID}}
	return f
}

// reconcile reconciles the hub service name and fails the test on error.
func (f *fleet) reconcile(name string) {
	f.t.Helper()
	if _, err := f.r.Reconcile(context.Background(), watch.Request(ns, name)); err != nil {
		f.t.Fatalf("reconcile %s: %v", name, err)
	}
}

// hubService reads the hub service back.
func (f *fleet) hubService(name string) *v1alpha2.LLMInferenceService {
	f.t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	if err := f.Hub.API.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		f.t.Fatal(err)
	}
	return svc
}

// copyIn returns a spoke's copy of service name, nil when it has none.
func (f *fleet) copyIn(cluster, name string) *v1alpha2.LLMInferenceService {
	f.t.Helper()
	cp := &v1alpha2.LLMInferenceService{}
	if !f.Get(cluster, client.ObjectKey{Namespace: ns, Name: name}, cp) {
		return nil
	}
	return cp
}

// kept fails the test unless cluster keeps its copy of service name, not
// being deleted, with replicas; step says when.
func (f *fleet) kept(step, cluster, name string, replicas int32) {
	f.t.Helper()
	cp := f.copyIn(cluster, name)
	if cp == nil || !cp.DeletionTimestamp.IsZero() || ptr.Deref(cp.Spec.Replicas, 0) != replicas {
		f.t.Fatalf("%s: %s's copy is %v, want it kept with %d replicas", step, cluster, cp, replicas)
	}
}

// markReady makes a spoke's copy report Ready with ready replicas, as the
// spoke controller would.
func (f *fleet) markReady(cluster, name string, ready int32) {
	f.t.Helper()
	f.setCopyStatus(cluster, name, func(cp *v1alpha2.LLMInferenceService) { setReady(cp, ready) })
}

// markNotReady makes a spoke's copy report ready of its replicas ready and
// not Ready, its main workload saying why, as the spoke controller would
// for pods Pending, pulling or crashing.
func (f *fleet) markNotReady(cluster, name string, ready int32, why string) {
	f.t.Helper()
	f.setCopyStatus(cluster, name, func(cp *v1alpha2.LLMInferenceService) {
		cp.Status.ObservedGeneration = cp.Generation
		cp.Status.MarkFalse(v1alpha2.MainWorkloadReady, "MinimumReplicasUnavailable", "%s", why)
		cp.Status.MarkFalse(v1alpha2.Ready, "WorkloadsNotReady", "the main workload is not ready")
		cp.Status.Workloads = &v1alpha2.WorkloadStatus{Primary: &v1alpha2.ObservedWorkloadStatus{ReadyReplicas: ptr.To(ready)}}
	})
}

// setCopyStatus changes the status of a spoke's copy as its controller
// would.
func (f *fleet) setCopyStatus(cluster, name string, change func(*v1alpha2.LLMInferenceService)) {
	f.t.Helper()
	cp := f.copyIn(cluster, name)
	if cp == nil {
		f.t.Fatalf("%s has no copy of %s", cluster, name)
	}
	change(cp)
	if err := f.Spoke(cluster).API.Status().Update(context.Background(), cp); err != nil {
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
	cp := desiredCopy(service(name, replicas), hubtest.HubID, "", replicas, decision{})
	setReady(cp, replicas)
	return cp
}

// placementOf places the namespace's services on the named clusters.
func placementOf(strategy fleetv1alpha1.ReplicaStrategy, clusters ...string) *fleetv1alpha1.InferencePlacement {
	return &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpus", UID: "uid-placement"},
		Spec: fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: clusters},
			Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: strategy}}}
}
