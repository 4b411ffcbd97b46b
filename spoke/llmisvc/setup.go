package llmisvc

import (
	"context"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// availableAPIs are the optional APIs found in the cluster at start-up.
// Without one, the features that need it report a condition instead of
// failing the whole controller.
type availableAPIs struct {
	lws, inferencePool, gateway bool
}

func detectAPIs(m meta.RESTMapper) availableAPIs {
	has := func(g, k string) bool {
		_, err := m.RESTMapping(schema.GroupKind{Group: g, Kind: k})
		return err == nil
	}
	return availableAPIs{
		lws:           has(lwsv1.GroupVersion.Group, "LeaderWorkerSet"),
		inferencePool: has(igwapiv1.GroupName, "InferencePool"),
		gateway:       has(gwapiv1.GroupName, "HTTPRoute") && has(gwapiv1.GroupName, "Gateway"),
	}
}

// SetupWithManager registers the reconciler, with Options.Workers workers
// and a liveness check that fails while one reconcile runs longer than
// Options.StallAfter: it owns every namespaced child
// and maps changes of configs, referenced routes, pools, Gateways, scheduler
// ConfigMaps and, with --federation-address=PodIP, endpoint-picker pods to the
// services that use them.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.apis = detectAPIs(mgr.GetRESTMapper())
	if err := mgr.AddHealthzCheck("llminferenceservice-progress", r.inFlight.check); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("llminferenceservice").
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.Workers}).
		For(&v1alpha2.LLMInferenceService{}).
		Owns(&appsv1.Deployment{}).
		// Every change, status included: a federation Service's status
		// carries the load-balancer address the copy reports.
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Watches(&v1alpha2.LLMInferenceServiceConfig{}, handler.EnqueueRequestsFromMapFunc(r.servicesUsingConfig)).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.servicesUsingConfigMap), builder.OnlyMetadata)
	if r.opts.FederationAddress == FederationAddressPodIP {
		pickers, err := r.watchPickers(mgr)
		if err != nil {
			return err
		}
		b = b.WatchesRawSource(pickers)
	}
	if r.apis.lws {
		b = b.Owns(&lwsv1.LeaderWorkerSet{}).
			Watches(&appsv1.StatefulSet{}, handler.EnqueueRequestsFromMapFunc(r.serviceOfGroup))
	}
	if r.apis.inferencePool {
		b = b.Owns(&igwapiv1.InferencePool{}).
			Watches(&igwapiv1.InferencePool{}, handler.EnqueueRequestsFromMapFunc(r.servicesUsingPool))
	}
	if r.apis.gateway {
		b = b.Owns(&gwapiv1.HTTPRoute{}).
			Watches(&gwapiv1.HTTPRoute{}, handler.EnqueueRequestsFromMapFunc(r.servicesUsingRoute)).
			Watches(&gwapiv1.Gateway{}, handler.EnqueueRequestsFromMapFunc(r.servicesWithRouter))
	}
	return b.Complete(r)
}

// serviceOfGroup maps a StatefulSet of a LeaderWorkerSet group to the
// service that owns the LeaderWorkerSet, whose readiness counts its workers.
func (r *Reconciler) serviceOfGroup(ctx context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[lwsv1.SetNameLabelKey]
	if name == "" {
		return nil
	}
	lws := &lwsv1.LeaderWorkerSet{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: name}, lws); err != nil {
		return nil
	}
	owner := metav1.GetControllerOf(lws)
	if owner == nil || owner.Kind != "LLMInferenceService" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: lws.Namespace, Name: owner.Name}}}
}

// services lists services in ns ("" for all) that match keep.
func (r *Reconciler) services(ctx context.Context, ns string, keep func(*v1alpha2.LLMInferenceService) bool) []reconcile.Request {
	var list v1alpha2.LLMInferenceServiceList
	if err := r.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if keep(&list.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// servicesUsingConfig maps a config to the services that reference it or
// merged it last time; a config in the system namespace (a preset) can be
// used from any namespace.
func (r *Reconciler) servicesUsingConfig(ctx context.Context, o client.Object) []reconcile.Request {
	ns := o.GetNamespace()
	if ns == r.opts.SystemNamespace {
		ns = ""
	}
	return r.services(ctx, ns, func(s *v1alpha2.LLMInferenceService) bool {
		if slices.ContainsFunc(s.Spec.BaseRefs, func(ref corev1.LocalObjectReference) bool { return ref.Name == o.GetName() }) {
			return true
		}
		// A service whose composition failed may be waiting for a preset.
		if c := s.Status.GetCondition(v1alpha2.PresetsCombined); c != nil && c.Status != corev1.ConditionTrue {
			return true
		}
		return slices.ContainsFunc(s.Status.AppliedConfigRefs, func(a v1alpha2.AppliedConfigRef) bool {
			return string(a.Name) == o.GetName() && string(a.Namespace) == o.GetNamespace()
		})
	})
}

func (r *Reconciler) servicesUsingConfigMap(ctx context.Context, o client.Object) []reconcile.Request {
	ns := o.GetNamespace()
	if ns == r.opts.SystemNamespace {
		ns = ""
	}
	return r.services(ctx, ns, func(s *v1alpha2.LLMInferenceService) bool {
		rt := s.Spec.Router
		return rt != nil && rt.Scheduler != nil && rt.Scheduler.Config != nil && rt.Scheduler.Config.Ref != nil &&
			rt.Scheduler.Config.Ref.Name == o.GetName()
	})
}

func (r *Reconciler) servicesUsingPool(ctx context.Context, o client.Object) []reconcile.Request {
	return r.services(ctx, o.GetNamespace(), func(s *v1alpha2.LLMInferenceService) bool {
		rt := s.Spec.Router
		return rt != nil && rt.Scheduler != nil && rt.Scheduler.Pool != nil && rt.Scheduler.Pool.Ref != nil &&
			rt.Scheduler.Pool.Ref.Name == o.GetName()
	})
}

func (r *Reconciler) servicesUsingRoute(ctx context.Context, o client.Object) []reconcile.Request {
	return r.services(ctx, o.GetNamespace(), func(s *v1alpha2.LLMInferenceService) bool {
		rt := s.Spec.Router
		return rt != nil && rt.Route != nil && rt.Route.HTTP != nil &&
			slices.ContainsFunc(rt.Route.HTTP.Refs, func(ref corev1.LocalObjectReference) bool { return ref.Name == o.GetName() })
	})
}

// servicesWithRouter maps a Gateway to every service that routes at all or
// federates (which reports its Gateway's address); Gateways change rarely
// and may be the default of services that do not name them.
func (r *Reconciler) servicesWithRouter(ctx context.Context, _ client.Object) []reconcile.Request {
	return r.services(ctx, "", func(s *v1alpha2.LLMInferenceService) bool {
		return s.Spec.Router != nil || len(s.Spec.BaseRefs) > 0 || federates(s)
	})
}
