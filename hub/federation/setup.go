package federation

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/federation/ca"
	"github.com/fleetinfer/fleetinfer/hub/internal/component"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// SpokeCache limits what the hub caches of a spoke's ConfigMaps and Secrets
// to what it published. Without it the first read would start an informer
// over all of them.
func SpokeCache() map[client.Object]cache.ByObject {
	ours := labels.SelectorFromSet(fleetv1alpha1.ManagedByHubLabels())
	return map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {Label: ours},
		&corev1.Secret{}:    {Label: ours},
	}
}

// Setup registers the reconciler, with the federation CA kept in the Secret
// opts.CASecret of opts.Namespace.
func Setup(ctx context.Context, deps component.Deps, opts Options) error {
	r := &Reconciler{Hub: deps.Hub(), Inv: deps.Inventory, Recorder: deps.Recorder(),
		CA: &ca.Authority{Client: deps.Hub(), Reader: deps.HubReader(),
			Secret: client.ObjectKey{Namespace: opts.Namespace, Name: opts.CASecret}, Overlap: opts.CAOverlap},
		Opts: opts}
	return r.setupWithManager(ctx, deps.Manager, deps.Inventory, opts.Namespace)
}

// setupWithManager registers the reconciler. A service is reconciled when it
// or its copies change (a copy's status carries its picker's and gateway's
// addresses), when a published object changes, when the CA changes, when
// inv reports clusters coming, going, failing or recovering, and when a
// cluster's registration in ns is relabelled (its pod network decides the
// mode its peers reach it in).
func (r *Reconciler) setupWithManager(ctx context.Context, mgr mcmanager.Manager, inv *inventory.Inventory, ns string) error {
	b := mcbuilder.ControllerManagedBy(mgr).
		Named("hub-federation").
		WithOptions(controller.TypedOptions[mcreconcile.Request]{MaxConcurrentReconciles: r.Opts.Workers}).
		For(&v1alpha2.LLMInferenceService{}, watch.ForHub...).
		Watches(&v1alpha2.LLMInferenceService{}, watch.ToOrigin, watch.OnSpokes...).
		Watches(&corev1.ConfigMap{}, watch.Map(toOwner), watch.OnSpokes...).
		Watches(&corev1.Secret{}, watch.Map(toOwner), watch.OnSpokes...).
		Watches(&igwapixv1alpha1.InferencePoolImport{}, watch.Map(r.toImportingService), watch.OnSpokes...).
		Watches(&corev1.Secret{}, watch.Map(r.allServices), append(watch.OnHub,
			mcbuilder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return client.ObjectKeyFromObject(o) == r.CA.Secret
			})))...).
		WatchesRawSource(watch.ClusterChanges(ctx, inv, 0, func(ctx context.Context) []client.ObjectKey {
			return watch.Keys(ctx, r.Hub, &v1alpha2.LLMInferenceServiceList{}, "")
		}))
	return watch.Registrations(b, mgr, ns, r.allServices).Complete(r)
}

// toOwner maps a published object to the service it was published for:
// the one it is labelled with (the owner is the copy of that name, or an
// importer's import).
func toOwner(_ context.Context, o client.Object) []mcreconcile.Request {
	if name := o.GetLabels()[v1alpha2.LabelName]; name != "" {
		return []mcreconcile.Request{watch.Request(o.GetNamespace(), name)}
	}
	return nil
}

func (r *Reconciler) allServices(ctx context.Context, _ client.Object) []mcreconcile.Request {
	return watch.Requests(ctx, r.Hub, &v1alpha2.LLMInferenceServiceList{}, "")
}
