package distribute

import (
	"context"

	"k8s.io/client-go/util/workqueue"
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
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

var (
	onHub    = []mcbuilder.WatchesOption{mcbuilder.WithEngageWithLocalCluster(true), mcbuilder.WithEngageWithProviderClusters(false)}
	onSpokes = []mcbuilder.WatchesOption{mcbuilder.WithEngageWithLocalCluster(false), mcbuilder.WithEngageWithProviderClusters(true)}
)

// hubRequest is the request for the hub object of namespace/name.
func hubRequest(ns, name string) mcreconcile.Request {
	return mcreconcile.Request{Request: reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}}
}

// SetupWithManager registers the reconciler: hub services and placements
// are watched on the hub; copies in the spokes map back to their hub
// service; the inventory's availability changes re-run every service.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	return mcbuilder.ControllerManagedBy(mgr).
		Named("hub-llminferenceservice").
		For(&v1alpha2.LLMInferenceService{}, mcbuilder.WithEngageWithLocalCluster(true), mcbuilder.WithEngageWithProviderClusters(false)).
		Watches(&fleetv1alpha1.InferencePlacement{}, mapOnHub(r.servicesOfPlacement), onHub...).
		Watches(&v1alpha2.LLMInferenceService{}, copyToHub, onSpokes...).
		// A cluster that starts reporting capacity may become eligible.
		Watches(&fleetv1alpha1.ClusterCapacity{}, mapOnHub(r.allServices),
			append(onSpokes, mcbuilder.WithPredicates(predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}))...).
		WatchesRawSource(r.clusterEvents(ctx)).
		Complete(r)
}

func mapOnHub(fn func(context.Context, client.Object) []mcreconcile.Request) func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return func(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
		return handler.TypedEnqueueRequestsFromMapFunc(fn)
	}
}

// copyToHub maps a spoke copy to the hub service it came from.
func copyToHub(multicluster.ClusterName, cluster.Cluster) handler.TypedEventHandler[client.Object, mcreconcile.Request] {
	return handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []mcreconcile.Request {
		if o.GetLabels()[ManagedByLabel] != ManagedByValue {
			return nil
		}
		return []mcreconcile.Request{hubRequest(o.GetNamespace(), o.GetName())}
	})
}

func (r *Reconciler) allServices(ctx context.Context, _ client.Object) []mcreconcile.Request {
	return r.servicesIn(ctx, "")
}

func (r *Reconciler) servicesOfPlacement(ctx context.Context, o client.Object) []mcreconcile.Request {
	return r.servicesIn(ctx, o.GetNamespace())
}

// servicesIn lists the hub services of a namespace ("" for all).
func (r *Reconciler) servicesIn(ctx context.Context, ns string) []mcreconcile.Request {
	var list v1alpha2.LLMInferenceServiceList
	if err := r.hub.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil
	}
	out := make([]mcreconcile.Request, 0, len(list.Items))
	for _, s := range list.Items {
		out = append(out, hubRequest(s.Namespace, s.Name))
	}
	return out
}

// clusterEvents turns the inventory's cluster changes into a reconcile of
// every hub service: a cluster joining, leaving, failing or recovering can
// change any decision.
func (r *Reconciler) clusterEvents(ctx context.Context) source.TypedSource[mcreconcile.Request] {
	changes := r.inv.Subscribe(64)
	events := make(chan event.TypedGenericEvent[client.Object])
	go func() {
		defer close(events)
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
			}
			var list v1alpha2.LLMInferenceServiceList
			if err := r.hub.List(ctx, &list); err != nil {
				continue
			}
			for i := range list.Items {
				select {
				case events <- event.TypedGenericEvent[client.Object]{Object: &list.Items[i]}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return source.TypedChannel(events, handler.TypedFuncs[client.Object, mcreconcile.Request]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[mcreconcile.Request]) {
			q.Add(hubRequest(e.Object.GetNamespace(), e.Object.GetName()))
		},
	})
}
