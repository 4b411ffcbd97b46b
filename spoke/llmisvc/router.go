package llmisvc

import (
	"context"
	"errors"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// routing is what reconcileRouter learns while reconciling, for the
// conditions and the status.
type routing struct {
	routes   []*gwapiv1.HTTPRoute
	gateways []client.ObjectKey // in order of first mention
	pool     *igwapiv1.InferencePool
	eppSvc   string
}

// reconcileRouter reconciles the router of a service: its scheduler
// (InferencePool and endpoint picker, scheduler.go) and its HTTPRoutes
// (route.go), then judges their readiness and sets the service's addresses
// (router_status.go).
func (r *Reconciler) reconcileRouter(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec) (time.Duration, error) {
	st := &svc.Status
	st.Router, st.Addresses, st.URL = nil, nil, nil
	router := s.Router
	var errs []error
	rt := &routing{}

	managedScheduler := router != nil && router.Scheduler != nil && (router.Scheduler.Pool == nil || router.Scheduler.Pool.Ref == nil)
	if managedScheduler {
		errs = append(errs, r.reconcileScheduler(ctx, svc, svc, s, rt))
	} else {
		errs = append(errs, r.removeScheduler(ctx, svc, svc))
		st.ClearCondition(v1alpha2.SchedulerWorkloadReady)
		st.Workloads.Scheduler = nil
	}

	managedRoute := router != nil && router.Route != nil && (router.Route.HTTP == nil || len(router.Route.HTTP.Refs) == 0)
	switch {
	case managedRoute:
		errs = append(errs, r.reconcileManagedRoute(ctx, svc, s, rt))
	default:
		errs = append(errs, r.removeManagedRoute(ctx, svc))
	}
	if router != nil && router.Route != nil && router.Route.HTTP != nil && len(router.Route.HTTP.Refs) > 0 {
		errs = append(errs, r.observeRouteRefs(ctx, svc, router.Route.HTTP.Refs, rt))
	}
	if router != nil && router.Gateway != nil {
		for _, g := range router.Gateway.Refs {
			ns := string(g.Namespace)
			if ns == "" {
				ns = svc.Namespace
			}
			rt.addGateway(client.ObjectKey{Namespace: ns, Name: string(g.Name)})
		}
	}
	if router != nil && router.Scheduler != nil && router.Scheduler.Pool != nil && router.Scheduler.Pool.Ref != nil {
		errs = append(errs, r.observePoolRef(ctx, svc, router.Scheduler.Pool.Ref.Name, rt))
	}

	requeue := r.gatewaysReadiness(ctx, svc, rt)
	routesReadiness(st, rt)
	poolReadiness(svc, rt)
	r.routerStatus(ctx, svc, s, rt)
	errs = append(errs, r.reportFederation(ctx, svc, rt))
	if router == nil {
		st.Router = nil
	}
	return requeue, errors.Join(errs...)
}

func (rt *routing) addGateway(k client.ObjectKey) {
	if !slices.Contains(rt.gateways, k) {
		rt.gateways = append(rt.gateways, k)
	}
}

// removeRouter deletes every router child, for the stop annotation.
func (r *Reconciler) removeRouter(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	for _, t := range v1alpha2.RouterSubConditions {
		svc.Status.ClearCondition(t)
	}
	return errors.Join(r.removeScheduler(ctx, svc, svc), r.removeManagedRoute(ctx, svc))
}
