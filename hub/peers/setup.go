package peers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

// SpokeCache limits what the hub caches of a spoke's pods, ConfigMaps and
// Secrets to what it needs: endpoint-picker pods and what it published.
// Without it the first read would start an informer over all of them.
func SpokeCache() map[client.Object]cache.ByObject {
	picker, _ := labels.NewRequirement(labelComponent, selection.Equals, []string{SchedulerComponent})
	ours, _ := labels.NewRequirement(fleetv1alpha1.ManagedByLabel, selection.Equals, []string{fleetv1alpha1.ManagedByHub})
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}:       {Label: labels.NewSelector().Add(*picker)},
		&corev1.ConfigMap{}: {Label: labels.NewSelector().Add(*ours)},
		&corev1.Secret{}:    {Label: labels.NewSelector().Add(*ours)},
	}
}

// SetupWithManager registers the reconciler. A service is reconciled when it
// or its copies change, when a picker pod or a published object changes,
// when a spoke's gateway or the CA changes, and when clusters come and go.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr mcmanager.Manager) error {
	return mcbuilder.ControllerManagedBy(mgr).
		Named("hub-federation-peers").
		WithOptions(controller.TypedOptions[mcreconcile.Request]{MaxConcurrentReconciles: r.Opts.Workers}).
		For(&v1alpha2.LLMInferenceService{}, watch.ForHub...).
		Watches(&v1alpha2.LLMInferenceService{}, watch.ToOrigin, watch.OnSpokes...).
		Watches(&corev1.Pod{}, watch.Map(toService), watch.OnSpokes...).
		Watches(&corev1.ConfigMap{}, watch.Map(toOwner), watch.OnSpokes...).
		Watches(&corev1.Secret{}, watch.Map(toOwner), watch.OnSpokes...).
		Watches(&gwapiv1.Gateway{}, watch.Map(r.allServices), append(watch.OnSpokes,
			mcbuilder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return client.ObjectKeyFromObject(o) == r.Opts.Gateway
			})))...).
		Watches(&corev1.Secret{}, watch.Map(r.allServices), append(watch.OnHub,
			mcbuilder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				return client.ObjectKeyFromObject(o) == r.CA.Secret
			})))...).
		WatchesRawSource(watch.ClusterChanges(ctx, r.Inv, 0, func(ctx context.Context) []client.ObjectKey {
			return watch.Keys(ctx, r.Hub, &v1alpha2.LLMInferenceServiceList{}, "")
		})).
		Complete(r)
}

// toService maps a picker pod to the service it picks for.
func toService(_ context.Context, o client.Object) []mcreconcile.Request {
	l := o.GetLabels()
	if l[labelPartOf] != partOfService || l[labelName] == "" {
		return nil
	}
	return []mcreconcile.Request{watch.Request(o.GetNamespace(), l[labelName])}
}

// toOwner maps a published object to the service whose copy owns it.
func toOwner(_ context.Context, o client.Object) []mcreconcile.Request {
	for _, ref := range o.GetOwnerReferences() {
		if ref.Kind == "LLMInferenceService" && ref.APIVersion == v1alpha2.GroupVersion.String() {
			return []mcreconcile.Request{watch.Request(o.GetNamespace(), ref.Name)}
		}
	}
	return nil
}

func (r *Reconciler) allServices(ctx context.Context, _ client.Object) []mcreconcile.Request {
	return watch.Requests(ctx, r.Hub, &v1alpha2.LLMInferenceServiceList{}, "")
}
