// Package members keeps one MemberCluster on the hub per engaged cluster:
// its availability as the inventory judges it, whether the hub holds its
// hub lease there (and so writes there), and the accelerators its
// ClusterCapacity reports, so that `kubectl get memberclusters` shows the
// fleet's health without the hub's logs or metrics.
package members

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/internal/component"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/placement"
	"github.com/fleetinfer/fleetinfer/internal/statuspatch"
)

// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=memberclusters,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=memberclusters/status,verbs=get;update;patch

// Reconciler writes the MemberCluster named after each cluster.
type Reconciler struct {
	Hub      client.Client
	Clusters interface {
		Cluster(ctx context.Context, name string) (inventory.Cluster, bool)
	}
	// ClusterTimeout bounds the read of a cluster's capacity report
	// (Options.ClusterTimeout).
	ClusterTimeout time.Duration
	// Recorder records the Events of the hub lease (leaseEvent).
	Recorder record.EventRecorder
}

// Reconcile makes the MemberCluster of cluster req.Name match the
// inventory: created and kept current while the cluster is engaged,
// deleted once it is not (if the hub created it).
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	name := req.Name
	c, engaged := r.Clusters.Cluster(ctx, name)
	cur := &fleetv1alpha1.MemberCluster{}
	err := r.Hub.Get(ctx, client.ObjectKey{Name: name}, cur)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return reconcile.Result{}, err
	case !engaged && err == nil && fleetv1alpha1.IsManagedByHub(cur):
		return reconcile.Result{}, client.IgnoreNotFound(r.Hub.Delete(ctx, cur))
	case !engaged:
		return reconcile.Result{}, nil
	case apierrors.IsNotFound(err):
		cur = &fleetv1alpha1.MemberCluster{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{fleetv1alpha1.ManagedByLabel: fleetv1alpha1.ManagedByHub}}}
		if err := r.Hub.Create(ctx, cur); err != nil {
			return reconcile.Result{}, err
		}
	}
	capCtx, cancel := context.WithTimeout(ctx, r.ClusterTimeout)
	capacity := placement.CapacityOf(capCtx, c)
	cancel()
	now := time.Now()
	if equality.Semantic.DeepEqual(cur.Status, Status(cur.Status, c, capacity, now)) {
		return reconcile.Result{}, nil
	}
	r.leaseEvent(cur, cur.Status, leaseCondition(c))
	// Computed on the latest status and sent as a patch of what changed, so
	// that the orphan collector's pending deletions, written beside, are
	// never overwritten with an older copy.
	return reconcile.Result{}, statuspatch.Write(ctx, r.Hub, cur, func(latest *fleetv1alpha1.MemberCluster) {
		latest.Status = Status(latest.Status, c, capacity, now)
	})
}

// Status is the status a cluster's MemberCluster should have, from the
// status it has: the Available condition from the inventory (its
// transition time the loss when the cluster is unavailable), HubLeaseHeld
// from the cluster's fence, and the capacity report, or the last one seen
// when the report cannot be read.
func Status(cur fleetv1alpha1.MemberClusterStatus, c inventory.Cluster, capacity *fleetv1alpha1.ClusterCapacityStatus, now time.Time) fleetv1alpha1.MemberClusterStatus {
	st := *cur.DeepCopy()
	avail := metav1.Condition{Type: fleetv1alpha1.MemberClusterAvailable, Status: metav1.ConditionTrue,
		Reason: fleetv1alpha1.ReasonClusterAvailable, Message: "the hub reaches the cluster's API server and can place services there"}
	since := now
	if !c.Available() {
		avail.Status, avail.Reason = metav1.ConditionFalse, fleetv1alpha1.ReasonClusterUnavailable
		avail.Message = fmt.Sprintf("unavailable since %s: %s", c.UnavailableSince.UTC().Format(time.RFC3339), c.Reason)
		since = c.UnavailableSince
	}
	setCondition(&st, avail, since)
	setCondition(&st, leaseCondition(c), now)
	if capacity != nil {
		st.Accelerators, st.Nodes, st.Summary = capacity.Accelerators, capacity.Nodes, capacity.Summary
	}
	return st
}

// leaseCondition says whether the hub holds its hub lease in the cluster,
// and so writes there.
func leaseCondition(c inventory.Cluster) metav1.Condition {
	if c.Fence.Fenced() {
		return metav1.Condition{Type: fleetv1alpha1.MemberClusterHubLeaseHeld, Status: metav1.ConditionFalse,
			Reason: c.Fence.Reason, Message: c.Fence.Message}
	}
	return metav1.Condition{Type: fleetv1alpha1.MemberClusterHubLeaseHeld, Status: metav1.ConditionTrue,
		Reason: fleetv1alpha1.ReasonHubLeaseHeld, Message: "this hub holds its hub lease in the cluster and writes there"}
}

// setCondition sets cond in st, its transition time since (to the second)
// when its status changes.
func setCondition(st *fleetv1alpha1.MemberClusterStatus, cond metav1.Condition, since time.Time) {
	if prev := meta.FindStatusCondition(st.Conditions, cond.Type); prev == nil || prev.Status != cond.Status {
		cond.LastTransitionTime = metav1.NewTime(since.Truncate(time.Second))
	}
	meta.SetStatusCondition(&st.Conditions, cond)
}

// leaseEvent records the hub standing by for a cluster another hub with its
// ID writes to (a Warning), and taking the cluster back: the changes of the
// HubLeaseHeld condition an operator must act on or know of. A lease not
// acquired yet, as at every start, is no Event; its condition says it.
func (r *Reconciler) leaseEvent(mc *fleetv1alpha1.MemberCluster, was fleetv1alpha1.MemberClusterStatus, is metav1.Condition) {
	prev := meta.FindStatusCondition(was.Conditions, is.Type)
	switch {
	case is.Reason == fleetv1alpha1.ReasonHeldByAnotherHub && (prev == nil || prev.Reason != is.Reason):
		r.Recorder.Event(mc, corev1.EventTypeWarning, is.Reason, is.Message)
	case is.Status == metav1.ConditionTrue && prev != nil && prev.Reason == fleetv1alpha1.ReasonHeldByAnotherHub:
		r.Recorder.Event(mc, corev1.EventTypeNormal, is.Reason, "this hub holds its hub lease in the cluster again and writes there")
	}
}

// Options configure the reconciler.
type Options struct {
	// ClusterTimeout bounds the read of a cluster's capacity report
	// (5 s when unset).
	ClusterTimeout time.Duration
}

// withDefaults fills the settings left unset.
func (o Options) withDefaults() Options {
	if o.ClusterTimeout <= 0 {
		o.ClusterTimeout = 5 * time.Second
	}
	return o
}

// Setup registers the reconciler.
func Setup(ctx context.Context, deps component.Deps, opts Options) error {
	opts = opts.withDefaults()
	r := &Reconciler{Hub: deps.Hub(), Clusters: deps.Inventory, ClusterTimeout: opts.ClusterTimeout, Recorder: deps.Recorder()}
	return r.setupWithManager(ctx, deps.Manager, deps.Inventory)
}

// setupWithManager registers the reconciler: MemberClusters on the hub,
// capacity reports in the spokes (each mapped to its cluster's
// MemberCluster), and the inventory's changes (a cluster joining, leaving,
// failing or recovering) for every cluster engaged or with a MemberCluster.
func (r *Reconciler) setupWithManager(ctx context.Context, mgr mcmanager.Manager, inv *inventory.Inventory) error {
	toMember := func(name multicluster.ClusterName, _ cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, client.Object) []mcreconcile.Request {
			return []mcreconcile.Request{watch.Request("", string(name))}
		})
	}
	return mcbuilder.ControllerManagedBy(mgr).
		Named("hub-membercluster").
		For(&fleetv1alpha1.MemberCluster{}, watch.ForHub...).
		Watches(&fleetv1alpha1.ClusterCapacity{}, toMember, watch.OnSpokes...).
		WatchesRawSource(watch.ClusterChanges(ctx, inv, 0, func(ctx context.Context) []client.ObjectKey {
			keys := watch.Keys(ctx, r.Hub, &fleetv1alpha1.MemberClusterList{}, "")
			for _, c := range inv.Clusters(ctx) {
				keys = append(keys, client.ObjectKey{Name: c.Name})
			}
			return keys
		})).
		Complete(r)
}
