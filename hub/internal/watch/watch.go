// Package watch is the event plumbing the hub's controllers share: where a
// watch runs (the hub itself or the spokes), how objects in spokes map back
// to the hub object they belong to, and the inventory's cluster changes as
// reconcile requests.
package watch

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// OnHub and OnSpokes say where a watch runs. multicluster-runtime engages a
// controller with the local cluster and every provider cluster unless told
// otherwise; the hub's objects live only on the hub and copies only in
// spokes.
var (
	OnHub    = []mcbuilder.WatchesOption{mcbuilder.WithEngageWithLocalCluster(true), mcbuilder.WithEngageWithProviderClusters(false)}
	OnSpokes = []mcbuilder.WatchesOption{mcbuilder.WithEngageWithLocalCluster(false), mcbuilder.WithEngageWithProviderClusters(true)}
	// ForHub is OnHub for a controller's primary object.
	ForHub = []mcbuilder.ForOption{mcbuilder.WithEngageWithLocalCluster(true), mcbuilder.WithEngageWithProviderClusters(false)}
)

// Request is the request for the hub object namespace/name.
func Request(ns, name string) mcreconcile.Request {
	return mcreconcile.Request{Request: reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}}
}

// Map enqueues what fn returns for each event, in whichever cluster the
// watch runs.
func Map(fn func(context.Context, client.Object) []mcreconcile.Request) func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(fn)
	}
}

// SameKey maps an object to the hub request of its own namespace/name.
var SameKey = Map(func(_ context.Context, o client.Object) []mcreconcile.Request {
	return []mcreconcile.Request{Request(o.GetNamespace(), o.GetName())}
})

// ToOrigin maps an object the hub created in a spoke to the hub object of
// the same namespace/name; objects the hub did not create map to nothing.
var ToOrigin = Map(func(_ context.Context, o client.Object) []mcreconcile.Request {
	if !fleetv1alpha1.IsManagedByHub(o) {
		return nil
	}
	return []mcreconcile.Request{Request(o.GetNamespace(), o.GetName())}
})

// ClusterChangeWindow is how long ClusterChanges folds cluster changes
// into one pass: a flapping cluster (or several failing at once) costs each
// object one reconcile per window rather than one per flip.
const ClusterChangeWindow = time.Second

// ClusterChanges re-runs the keys that keys returns whenever the inventory
// reports a cluster joining, leaving, failing or recovering: once per
// burst of changes, at the end of a window (ClusterChangeWindow, or settle
// if longer: a newly engaged cluster's caches get settle to fill) that
// opens with the burst's first change.
func ClusterChanges(ctx context.Context, inv *inventory.Inventory, settle time.Duration, keys func(context.Context) []client.ObjectKey) source.TypedSource[mcreconcile.Request] {
	changes := inv.Subscribe(64)
	requests := make(chan event.TypedGenericEvent[client.ObjectKey])
	go func() {
		defer close(requests)
		coalesce(ctx, changes, max(settle, ClusterChangeWindow), func() {
			for _, k := range keys(ctx) {
				select {
				case requests <- event.TypedGenericEvent[client.ObjectKey]{Object: k}:
				case <-ctx.Done():
					return
				}
			}
		})
	}()
	return source.TypedChannel(requests, handler.TypedFuncs[client.ObjectKey, mcreconcile.Request]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[client.ObjectKey], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
			q.Add(Request(e.Object.Namespace, e.Object.Name))
		},
	})
}

// coalesce calls fire once per burst of changes, window after the burst's
// first change; changes that arrive within the window join it. It returns
// when ctx ends.
func coalesce[T any](ctx context.Context, changes <-chan T, window time.Duration, fire func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
		}
		closes := time.After(window)
		for open := true; open; {
			select {
			case <-ctx.Done():
				return
			case <-changes:
			case <-closes:
				open = false
			}
		}
		fire()
	}
}

// Keys lists the keys of the objects a list returns ("" for all namespaces).
func Keys(ctx context.Context, c client.Client, list client.ObjectList, ns string) []client.ObjectKey {
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return nil
	}
	var out []client.ObjectKey
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		if obj, ok := o.(client.Object); ok {
			out = append(out, client.ObjectKeyFromObject(obj))
		}
		return nil
	})
	return out
}

// Requests is Keys as reconcile requests.
func Requests(ctx context.Context, c client.Client, list client.ObjectList, ns string) []mcreconcile.Request {
	var out []mcreconcile.Request
	for _, k := range Keys(ctx, c, list, ns) {
		out = append(out, Request(k.Namespace, k.Name))
	}
	return out
}

// MapCoalesced is Map for summaries of many objects: it enqueues what fn
// returns delay after the first event, and the queue folds every event in
// between into that one request, so a burst of changes costs one reconcile
// (and one write) per delay rather than one per change.
func MapCoalesced(delay time.Duration, fn func(context.Context, client.Object) []mcreconcile.Request) func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	add := func(ctx context.Context, o client.Object, q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
		for _, r := range fn(ctx, o) {
			q.AddAfter(r, delay)
		}
	}
	return func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedFuncs[client.Object, mcreconcile.Request]{
			CreateFunc: func(ctx context.Context, e event.TypedCreateEvent[client.Object], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
				add(ctx, e.Object, q)
			},
			UpdateFunc: func(ctx context.Context, e event.TypedUpdateEvent[client.Object], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
				add(ctx, e.ObjectNew, q)
			},
			DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[client.Object], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
				add(ctx, e.Object, q)
			},
			GenericFunc: func(ctx context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
				add(ctx, e.Object, q)
			},
		}
	}
}

// Registrations adds to b watches on the registrations the inventory reads
// clusters' labels from: the Secrets and ClusterProfiles in ns and, where
// OCM is installed, ManagedClusters. A registration created, deleted or
// relabelled (a pod-network label added, say) re-runs what fn returns; the
// inventory's own changes (ClusterChanges) say nothing of labels.
func Registrations(b *mcbuilder.Builder, mgr mcmanager.Manager, ns string, fn func(context.Context, client.Object) []mcreconcile.Request) *mcbuilder.Builder {
	relabelled := predicate.LabelChangedPredicate{}
	inNamespace := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == ns })
	b = b.Watches(&corev1.Secret{}, Map(fn), append(OnHub, mcbuilder.WithPredicates(inNamespace, relabelled))...)
	installed := func(gvk schema.GroupVersionKind) bool {
		_, err := mgr.GetLocalManager().GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		return err == nil
	}
	if installed(clusterinventoryv1alpha1.SchemeGroupVersion.WithKind("ClusterProfile")) {
		b = b.Watches(&clusterinventoryv1alpha1.ClusterProfile{}, Map(fn), append(OnHub, mcbuilder.WithPredicates(inNamespace, relabelled))...)
	}
	if installed(clusterv1.SchemeGroupVersion.WithKind("ManagedCluster")) {
		b = b.Watches(&clusterv1.ManagedCluster{}, Map(fn), append(OnHub, mcbuilder.WithPredicates(relabelled))...)
	}
	return b
}
