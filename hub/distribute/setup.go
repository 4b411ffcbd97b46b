package distribute

import (
	"context"

	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/component"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

// Setup registers the reconciler and its orphan collector.
func Setup(ctx context.Context, deps component.Deps, opts Options) error {
	opts = opts.withDefaults()
	// Registered, not the engaged clusters alone: a spoke the hub has not
	// engaged keeps its replicas through the toleration.
	r := &Reconciler{hub: deps.Hub(), clusters: deps.Inventory.Registered(), inv: deps.Inventory, recorder: deps.Recorder(),
		opts: opts, deletions: &deletions{hubID: opts.HubID}}
	if err := r.setupWithManager(ctx, deps.Manager); err != nil {
		return err
	}
	return deps.Manager.GetLocalManager().Add(r.OrphanCollector(opts.OrphanInterval))
}

// setupWithManager registers the reconciler: hub services and placements
// are watched on the hub; copies in the spokes map back to their hub
// service; the inventory's availability changes re-run every service.
func (r *Reconciler) setupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	b := mcbuilder.ControllerManagedBy(mgr).
		Named("hub-llminferenceservice").
		WithOptions(controller.TypedOptions[mcreconcile.Request]{MaxConcurrentReconciles: r.opts.Workers}).
		For(&v1alpha2.LLMInferenceService{}, watch.ForHub...).
		Watches(&fleetv1alpha1.InferencePlacement{}, watch.Map(r.servicesInNamespaceOf), watch.OnHub...).
		Watches(&fleetv1alpha1.ClusterSetBinding{}, watch.Map(r.servicesInNamespaceOf), watch.OnHub...).
		Watches(&v1alpha2.LLMInferenceService{}, watch.ToOrigin, watch.OnSpokes...).
		// A cluster that starts reporting capacity may become eligible.
		Watches(&fleetv1alpha1.ClusterCapacity{}, watch.Map(r.allServices),
			append(watch.OnSpokes, mcbuilder.WithPredicates(predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}))...).
		WatchesRawSource(watch.ClusterChanges(ctx, r.inv, 0, func(ctx context.Context) []client.ObjectKey {
			return watch.Keys(ctx, r.hub, &v1alpha2.LLMInferenceServiceList{}, "")
		}))
	// Placements that follow an OCM Placement move when its decisions do;
	// a hub without OCM has no PlacementDecisions to watch.
	pd := clusterv1beta1.SchemeGroupVersion.WithKind("PlacementDecision")
	if _, err := mgr.GetLocalManager().GetRESTMapper().RESTMapping(pd.GroupKind(), pd.Version); err == nil {
		b = b.Watches(&clusterv1beta1.PlacementDecision{}, watch.Map(r.servicesInNamespaceOf), watch.OnHub...)
	}
	return b.Complete(r)
}

func (r *Reconciler) allServices(ctx context.Context, _ client.Object) []mcreconcile.Request {
	return r.servicesIn(ctx, "")
}

func (r *Reconciler) servicesInNamespaceOf(ctx context.Context, o client.Object) []mcreconcile.Request {
	return r.servicesIn(ctx, o.GetNamespace())
}

// servicesIn lists the hub services of a namespace ("" for all).
func (r *Reconciler) servicesIn(ctx context.Context, ns string) []mcreconcile.Request {
	return watch.Requests(ctx, r.hub, &v1alpha2.LLMInferenceServiceList{}, ns)
}
