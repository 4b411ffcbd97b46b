package distribute

import (
	"context"
	"errors"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/multicluster-runtime/providers/kubeconfig"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// hanging is a spoke that never answers: a black-holed link, or a cache
// that never syncs. Every read and create waits until its context ends.
func hanging(ctx context.Context, verb string, _ runtime.Object) error {
	if verb != "get" && verb != "create" {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// One hanging spoke holds neither the worker nor the other clusters'
// writes: each call to a cluster has its own deadline.
func TestAHangingSpokeDelaysAReconcileOnlyByTheClusterDeadline(t *testing.T) {
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "hangs", "answers")},
		map[string][]client.Object{"hangs": nil, "answers": nil})
	const deadline = 300 * time.Millisecond
	f.r.opts.ClusterTimeout = deadline
	f.Spoke("hangs").Inject(hanging)

	began := time.Now()
	_, _ = f.r.Reconcile(context.Background(), watch.Request(ns, "llama"))
	took := time.Since(began)

	// Four rounds of calls, each bounded: observe, read capacity, write,
	// observe again; one more deadline of slack for a busy machine.
	if took > 5*deadline {
		t.Errorf("the reconcile took %s with one hanging spoke, want at most %s (a few cluster deadlines of %s)", took, 5*deadline, deadline)
	}
	if f.copyIn("answers", "llama") == nil {
		t.Error("the cluster that answers got no copy while another cluster hung")
	}
}

// A copy being deleted may still report Ready; counting it would let the
// copy that a move leaves shrink or go while the new one is on its way out.
func TestATerminatingCopyIsNotCountedAsReady(t *testing.T) {
	leaving := hubCopy("llama", 1)
	going := hubCopy("llama", 1)
	going.Finalizers = []string{"example.com/hold"}
	going.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "b")},
		map[string][]client.Object{"a": {leaving}, "b": {going}})
	f.reconcile("llama")
	f.reconcile("llama")

	if f.copyIn("a", "llama") == nil {
		t.Error("the copy the move leaves was deleted while the chosen cluster's copy is being deleted")
	}
	for _, c := range f.hubService("llama").Status.Clusters {
		if c.Name == "b" && (c.Phase != PhaseTerminating || c.Ready) {
			t.Errorf("cluster b: phase %s, ready %v; want %s, not ready", c.Phase, c.Ready, PhaseTerminating)
		}
	}
}

// refusing is a spoke that refuses every delete (a webhook, RBAC drift).
var refusing = fakeapi.FailOn("delete", nil, errors.New("admission webhook denied the request"))

// A spoke that refuses to delete a copy holds a deleted hub service only for
// FinalizePatience; then the service goes and the orphan collector keeps
// trying there.
func TestAHubServiceWaitsForARefusingSpokeOnlyForAWhile(t *testing.T) {
	for _, tc := range []struct {
		name       string
		deletedAgo time.Duration
		wantGone   bool
	}{
		{"deleted a moment ago: it waits", time.Second, false},
		{"deleted longer ago than the patience: it goes", FinalizePatience + time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := service("llama", 1)
			svc.Finalizers = []string{Finalizer}
			svc.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-tc.deletedAgo)}
			f := newFleet(t, []client.Object{svc, placementOf(fleetv1alpha1.Duplicated, "a")},
				map[string][]client.Object{"a": {hubCopy("llama", 1)}})
			f.Spoke("a").Inject(refusing)
			res, err := f.r.Reconcile(context.Background(), watch.Request(ns, "llama"))
			if !tc.wantGone && (res.RequeueAfter <= 0 || res.RequeueAfter > finalizeRetry || err != nil) {
				t.Errorf("a waiting hub service is looked at again after %s (error %v), want within %s whatever the queue's backoff",
					res.RequeueAfter, err, finalizeRetry)
			}

			gone := apierrors.IsNotFound(f.Hub.API.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "llama"}, svc))
			if gone != tc.wantGone {
				t.Fatalf("hub service gone %v (reconcile error %v), want %v", gone, err, tc.wantGone)
			}
			if f.copyIn("a", "llama") == nil {
				t.Error("the copy the spoke refused to delete is gone")
			}
		})
	}
}

// The copy a move leaves is deleted; while it terminates and after it is
// gone, the cluster is not part of the decision, so no copy comes back.
func TestALeavingCopyThatTerminatesDoesNotComeBack(t *testing.T) {
	going := hubCopy("llama", 1)
	going.Finalizers = []string{"example.com/hold"}
	going.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "b")},
		map[string][]client.Object{"a": {going}, "b": {hubCopy("llama", 1)}})
	f.reconcile("llama")
	f.reconcile("llama")
	cp := f.copyIn("a", "llama")
	cp.Finalizers = nil
	if err := f.Spoke("a").API.Update(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	f.reconcile("llama")
	f.reconcile("llama")
	if cp := f.copyIn("a", "llama"); cp != nil {
		t.Errorf("a copy came back in the cluster the service left: %d replicas", *cp.Spec.Replicas)
	}
}

// The clusters a decision takes replicas from while they are unavailable
// are remembered as failed over (for Rebalance: Never), and so is a cluster
// of the previous decision that is no longer in the inventory (its
// registration removed).
func TestFailedOverRemembersUnavailableAndUnregisteredClusters(t *testing.T) {
	down := inventory.Cluster{Name: "down", UnavailableSince: time.Unix(1, 0)}
	up := inventory.Cluster{Name: "up"}
	want := func(names ...string) decision {
		d := decision{want: map[string]int32{}}
		for _, n := range names {
			d.want[n] = 1
		}
		return d
	}
	cases := []struct {
		name       string
		before     []string
		prev, next decision
		clusters   []inventory.Cluster
		failed     []string
		events     int
	}{
		{"an unavailable cluster loses its replicas", nil, want("down"), want("up"), []inventory.Cluster{down, up}, []string{"down"}, 1},
		{"an unregistered cluster loses its replicas", nil, want("gone"), want("up"), []inventory.Cluster{up}, []string{"gone"}, 0},
		{"an available cluster left by a placement change is not failed over", nil, want("up"), want("down"), []inventory.Cluster{down, up}, nil, 0},
		{"an unavailable cluster that keeps its replicas is not failed over", nil, want("down"), want("down"), []inventory.Cluster{down}, nil, 0},
		{"a failed-over cluster back in the decision is forgotten", []string{"down"}, want("up"), want("down", "up"), []inventory.Cluster{down, up}, nil, 0},
		{"a failed-over cluster stays remembered", []string{"gone"}, want("up"), want("up"), []inventory.Cluster{up}, []string{"gone"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			failed, moved := failedOver(c.before, c.prev, c.next, c.clusters)
			if !slices.Equal(failed, c.failed) || len(moved) != c.events {
				t.Errorf("failed over %v with %d failovers, want %v with %d", failed, len(moved), c.failed, c.events)
			}
		})
	}
}

// joined is a Source of the clusters of several sources.
type joined []inventory.Source

func (j joined) Clusters(ctx context.Context) []inventory.Cluster {
	var out []inventory.Cluster
	for _, s := range j {
		out = append(out, s.Clusters(ctx)...)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

// A hub that restarts (or a new leader) while a spoke is down never engages
// that spoke, but the spoke is still registered: its replicas stay where
// they are until the placement's toleration has passed since the loss an
// earlier hub recorded, and move only then. For a GPU model too, although
// the hub cannot read the spoke's capacity report: the replicas it ran
// count as its room (make chaos saw them move 34 s into a 60 s toleration).
func TestARegisteredSpokeTheHubNeverEngagedKeepsItsReplicasThroughTheToleration(t *testing.T) {
	const registrations, toleration, lostAgo = "fleet-system", time.Minute, 20 * time.Second
	gpus := eightH100s()
	gpuModel := gpuService("llama", 2)
	for _, tc := range []struct {
		name string
		svc  *v1alpha2.LLMInferenceService
	}{
		{"a CPU model", service("llama", 2)},
		{"a GPU model, whose capacity the hub cannot read there", gpuModel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := placementOf(fleetv1alpha1.Weighted, "a", "b")
			pl.Spec.Replicas.Weights = []fleetv1alpha1.ClusterWeight{{Cluster: "a", Weight: 1}, {Cluster: "b", Weight: 1}}
			pl.Spec.Failover.TolerationSeconds = ptr.To(int32(toleration / time.Second))
			f, advance := clockedFleet(t, []client.Object{tc.svc, pl,
				&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: "b",
					Labels: map[string]string{kubeconfig.DefaultKubeconfigSecretLabel: "true"}}},
			}, map[string][]client.Object{"a": {gpus.DeepCopy()}, "b": {gpus.DeepCopy()}})
			f.reconcile("llama")
			f.markReady("a", "llama", 1)
			f.markReady("b", "llama", 1)
			f.reconcile("llama")
			if cp := f.copyIn("a", "llama"); cp == nil || *cp.Spec.Replicas != 1 {
				t.Fatalf("a's copy %v before the restart, want 1 replica", cp)
			}

			// The new hub engages a only; an earlier hub recorded b lost lostAgo.
			lost := f.r.timeNow().Add(-lostAgo).Truncate(time.Second)
			if err := f.Hub.API.Create(context.Background(), &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: inventory.RecordName},
				Data:       map[string]string{"b": lost.UTC().Format(time.RFC3339)}}); err != nil {
				t.Fatal(err)
			}
			f.r.clusters = joined{f.Only("a"), inventory.New(inventory.Options{Hub: f.Hub.Client, Namespace: registrations}).Registered()}
			f.restartHub()

			f.reconcile("llama")
			if e := entry(f.hubService("llama"), "b"); e == nil || e.DesiredReplicas != 1 {
				t.Fatalf("b's entry %+v within the toleration, want it to keep its replica", e)
			}
			if cp := f.copyIn("a", "llama"); *cp.Spec.Replicas != 1 {
				t.Fatalf("a's copy has %d replicas within the toleration, want 1: b's replica moved early", *cp.Spec.Replicas)
			}

			advance(toleration - lostAgo + 2*time.Second)
			f.reconcile("llama")
			if e := entry(f.hubService("llama"), "b"); e != nil && e.DesiredReplicas != 0 {
				t.Fatalf("b's entry %+v after the toleration, want its replica moved", e)
			}
			if cp := f.copyIn("a", "llama"); *cp.Spec.Replicas != 2 {
				t.Fatalf("a's copy has %d replicas after the toleration, want 2", *cp.Spec.Replicas)
			}
		})
	}
}

// A new leader that has not yet engaged a cluster keeps the decision in
// force: a move the placement asked for meanwhile (from c to b, b not yet
// reached, so its capacity unknown) waits, and c's serving copy is not
// retired on account of a decision made without b. Once b is engaged the
// move goes ahead, make-before-break (make chaos saw a leader in its first
// second delete the old copy of a move before the new one existed).
func TestANewLeaderDecidesNothingWhileItIsStillEngagingClusters(t *testing.T) {
	gpus := eightH100s()
	svc := gpuService("llama", 1)
	pl := placementOf(fleetv1alpha1.Duplicated, "a", "c")
	f := newFleet(t, []client.Object{svc, pl},
		map[string][]client.Object{"a": {gpus.DeepCopy()}, "b": {gpus.DeepCopy()}, "c": {gpus.DeepCopy()}})
	f.reconcile("llama")
	f.markReady("a", "llama", 1)
	f.markReady("c", "llama", 1)
	f.reconcile("llama")

	// A new leader, b not engaged yet; the placement moves from c to b.
	b := f.Spoke("b")
	b.UnavailableSince, b.Engaging, b.Reason = time.Now(), true, "registered but not engaged"
	f.restartHub()
	cur := &fleetv1alpha1.InferencePlacement{}
	if err := f.Hub.API.Get(context.Background(), client.ObjectKeyFromObject(pl), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Clusters.Names = []string{"a", "b"}
	cur.Generation++
	if err := f.Hub.API.Update(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	f.reconcile("llama")
	if f.copyIn("c", "llama") == nil {
		t.Fatal("c's serving copy was deleted by a leader still engaging b")
	}

	// b engaged: the move goes ahead, c's copy stays until b's is Ready.
	b.UnavailableSince, b.Engaging, b.Reason = time.Time{}, false, ""
	f.reconcile("llama")
	if f.copyIn("b", "llama") == nil || f.copyIn("c", "llama") == nil {
		t.Fatalf("after b engaged: copy in b %v, in c %v; want both until b's is Ready", f.copyIn("b", "llama") != nil, f.copyIn("c", "llama") != nil)
	}
	f.markReady("b", "llama", 1)
	f.reconcile("llama")
	if f.copyIn("c", "llama") != nil {
		t.Error("c's copy stays after b's turned Ready")
	}
}

// eightH100s is a capacity report of one node with 8 free H100s.
func eightH100s() *fleetv1alpha1.ClusterCapacity {
	return hubtest.Capacity(hubtest.GPUNode("nvidia.com/gpu", "H100", 8, 8))
}

// gpuService is service with one GPU per replica.
func gpuService(name string, replicas int32) *v1alpha2.LLMInferenceService {
	svc := service(name, replicas)
	svc.Spec.Template = &corev1.PodSpec{Containers: []corev1.Container{{Name: "main",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}}
	return svc
}
