package llmisvc

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Router readiness on a spoke, decided to avoid the never-Ready services of
// KServe issues #5986 and #6072:
//
//   - GatewaysReady: every Gateway the service routes through (its route's
//     parents and spec.router.gateway.refs) exists and is Programmed. A
//     missing default Gateway is reported by name; the condition recovers
//     when the Gateway appears.
//   - HTTPRoutesReady: every parent of every route (managed or referenced)
//     accepted it with resolved references.
//   - InferencePoolReady: the pool exists and every Gateway whose routes send
//     traffic to it has accepted it. A pool no route points at (a scheduler
//     without a route, or a Gateway that attaches pools without HTTPRoutes)
//     has no Gateway to wait for and is ready as soon as it exists: it is
//     usable through its endpoint picker.
//   - SchedulerWorkloadReady: the endpoint picker has an available replica.
//
// A condition with nothing to judge (no route, no scheduler) is absent and
// does not block RouterReady.

// Reasons of router readiness conditions.
const (
	ReasonGatewaysNotReady   = "GatewaysNotReady"
	ReasonHTTPRoutesNotReady = "HTTPRoutesNotReady"
	ReasonWaitingForGateway  = "WaitingForGateway"
)

// inferencePoolKind is the kind of a route backend that is a pool.
const inferencePoolKind = "InferencePool"

func (r *Reconciler) gatewaysReadiness(ctx context.Context, svc *v1alpha2.LLMInferenceService, rt *routing) time.Duration {
	st := &svc.Status
	if len(rt.gateways) == 0 {
		st.ClearCondition(v1alpha2.GatewaysReady)
		return 0
	}
	if !r.apis.gateway {
		st.MarkFalse(v1alpha2.GatewaysReady, ReasonGatewayAPIMissing, "the service routes through Gateways, but the Gateway API CRDs are not installed")
		return 0
	}
	var missing, notProgrammed []string
	for _, k := range rt.gateways {
		g := &gwapiv1.Gateway{}
		err := r.Get(ctx, k, g)
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, k.String())
		case err != nil:
			notProgrammed = append(notProgrammed, fmt.Sprintf("%s (%v)", k, err))
		case !meta.IsStatusConditionTrue(g.Status.Conditions, string(gwapiv1.GatewayConditionProgrammed)):
			notProgrammed = append(notProgrammed, k.String())
		}
	}
	switch {
	case len(missing) > 0:
		st.MarkFalse(v1alpha2.GatewaysReady, ReasonRefsInvalid, "Gateway %s not found: create it, point spec.router.gateway.refs at an existing Gateway, or set the spoke's --default-gateway", strings.Join(missing, ", "))
		return requeueWhileWaiting
	case len(notProgrammed) > 0:
		st.MarkFalse(v1alpha2.GatewaysReady, ReasonGatewaysNotReady, "Gateway %s is not Programmed", strings.Join(notProgrammed, ", "))
		return requeueWhileWaiting
	}
	st.MarkTrue(v1alpha2.GatewaysReady)
	return 0
}

func routesReadiness(st *v1alpha2.LLMInferenceServiceStatus, rt *routing) {
	if c := st.GetCondition(v1alpha2.HTTPRoutesReady); c != nil && c.Status == corev1.ConditionFalse && len(rt.routes) == 0 {
		return // already explained (missing refs, missing API)
	}
	if len(rt.routes) == 0 {
		st.ClearCondition(v1alpha2.HTTPRoutesReady)
		return
	}
	var pending []string
	for _, hr := range rt.routes {
		for _, p := range hr.Spec.ParentRefs {
			if !parentAccepted(hr, p) {
				pending = append(pending, fmt.Sprintf("%s (parent %s)", hr.Name, parentKey(p, hr.Namespace)))
			}
		}
	}
	if len(pending) > 0 {
		st.MarkFalse(v1alpha2.HTTPRoutesReady, ReasonHTTPRoutesNotReady, "HTTPRoute %s not yet accepted with resolved references", strings.Join(pending, ", "))
		return
	}
	st.MarkTrue(v1alpha2.HTTPRoutesReady)
}

func parentAccepted(hr *gwapiv1.HTTPRoute, ref gwapiv1.ParentReference) bool {
	key := parentKey(ref, hr.Namespace)
	for _, ps := range hr.Status.Parents {
		if parentKey(ps.ParentRef, hr.Namespace) != key || !ptr.Equal(ps.ParentRef.SectionName, ref.SectionName) {
			continue
		}
		acc := meta.FindStatusCondition(ps.Conditions, string(gwapiv1.RouteConditionAccepted))
		res := meta.FindStatusCondition(ps.Conditions, string(gwapiv1.RouteConditionResolvedRefs))
		return acc != nil && acc.Status == metav1.ConditionTrue && acc.ObservedGeneration >= hr.Generation &&
			res != nil && res.Status == metav1.ConditionTrue
	}
	return false
}

// poolReadiness sets InferencePoolReady by the rules at the top of this file.
func poolReadiness(svc *v1alpha2.LLMInferenceService, rt *routing) {
	st := &svc.Status
	if rt.pool == nil {
		if c := st.GetCondition(v1alpha2.InferencePoolReady); c == nil || c.Status != corev1.ConditionFalse {
			st.ClearCondition(v1alpha2.InferencePoolReady)
		}
		return
	}
	var scope []client.ObjectKey
	for _, hr := range rt.routes {
		if !routesToPool(hr, rt.pool.Name) {
			continue
		}
		for _, p := range hr.Spec.ParentRefs {
			if isGateway(p.Group, p.Kind) && !slices.Contains(scope, parentKey(p, hr.Namespace)) {
				scope = append(scope, parentKey(p, hr.Namespace))
			}
		}
	}
	var waiting []string
	for _, g := range scope {
		if !poolAcceptedBy(rt.pool, g) {
			waiting = append(waiting, g.String())
		}
	}
	if len(waiting) > 0 {
		st.MarkFalse(v1alpha2.InferencePoolReady, ReasonWaitingForGateway, "InferencePool %s is not yet accepted by Gateway %s", rt.pool.Name, strings.Join(waiting, ", "))
		return
	}
	st.MarkTrue(v1alpha2.InferencePoolReady)
}

func routesToPool(hr *gwapiv1.HTTPRoute, pool string) bool {
	for _, rule := range hr.Spec.Rules {
		for _, b := range rule.BackendRefs {
			if b.Kind != nil && *b.Kind == inferencePoolKind && string(b.Name) == pool {
				return true
			}
		}
	}
	return false
}

func poolAcceptedBy(p *igwapiv1.InferencePool, g client.ObjectKey) bool {
	for _, ps := range p.Status.Parents {
		ns := p.Namespace
		if ps.ParentRef.Namespace != "" {
			ns = string(ps.ParentRef.Namespace)
		}
		if string(ps.ParentRef.Name) == g.Name && ns == g.Namespace {
			return meta.IsStatusConditionTrue(ps.Conditions, string(igwapiv1.InferencePoolConditionAccepted))
		}
	}
	return false
}

// routerStatus records the observed topology and the service's addresses:
// one per programmed Gateway address (path-based, /<namespace>/<name>, as the
// route preset serves it), or the workload Service's in-cluster address when
// nothing routes to the service.
func (r *Reconciler) routerStatus(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec, rt *routing) {
	rs := &v1alpha2.RouterStatus{}
	model := ptr.Deref(s.Model.Name, svc.Name)
	for _, k := range rt.gateways {
		og := v1alpha2.ObservedGateway{ObjectReference: gwapiv1.ObjectReference{Group: gatewayGroup, Kind: "Gateway",
			Name: gwapiv1.ObjectName(k.Name), Namespace: ptr.To(gwapiv1.Namespace(k.Namespace))}}
		for _, hr := range rt.routes {
			for _, p := range hr.Spec.ParentRefs {
				if isGateway(p.Group, p.Kind) && parentKey(p, hr.Namespace) == k {
					og.HTTPRoutes = append(og.HTTPRoutes, gwapiv1.ObjectReference{Group: gatewayGroup, Kind: "HTTPRoute",
						Name: gwapiv1.ObjectName(hr.Name), Namespace: ptr.To(gwapiv1.Namespace(hr.Namespace))})
					if p.SectionName != nil {
						og.Listeners = append(og.Listeners, *p.SectionName)
					}
				}
			}
		}
		rs.Gateways = append(rs.Gateways, og)
		if len(og.HTTPRoutes) > 0 && r.apis.gateway {
			svc.Status.Addresses = append(svc.Status.Addresses, r.gatewayAddresses(ctx, k, svc, model)...)
		}
	}
	if rt.pool != nil {
		rs.Scheduler = &v1alpha2.ObservedSchedulerStatus{InferencePool: &gwapiv1.ObjectReference{
			Group: igwapiv1.GroupName, Kind: inferencePoolKind, Name: gwapiv1.ObjectName(rt.pool.Name), Namespace: ptr.To(gwapiv1.Namespace(rt.pool.Namespace))}}
		if rt.eppSvc != "" {
			rs.Scheduler.Service = &gwapiv1.ObjectReference{Group: "", Kind: "Service", Name: gwapiv1.ObjectName(rt.eppSvc), Namespace: ptr.To(gwapiv1.Namespace(svc.Namespace))}
		}
	}
	if len(rs.Gateways) > 0 || rs.Scheduler != nil {
		svc.Status.Router = rs
	}
	if len(svc.Status.Addresses) == 0 {
		u := fmt.Sprintf("http://%s.%s.svc.cluster.local", workloadServiceName(svc), svc.Namespace)
		svc.Status.Addresses = []v1alpha2.SourcedAddress{{Addressable: v1alpha2.Addressable{URL: ptr.To(u)},
			Models: []v1alpha2.ModelSourcedAddressStatus{{Name: model}}}}
	}
	svc.Status.URL = svc.Status.Addresses[0].URL
}

func (r *Reconciler) gatewayAddresses(ctx context.Context, k client.ObjectKey, svc *v1alpha2.LLMInferenceService, model string) []v1alpha2.SourcedAddress {
	g := &gwapiv1.Gateway{}
	if err := r.Get(ctx, k, g); err != nil || !meta.IsStatusConditionTrue(g.Status.Conditions, string(gwapiv1.GatewayConditionProgrammed)) {
		return nil
	}
	port := ""
	for _, l := range g.Spec.Listeners {
		if l.Protocol == gwapiv1.HTTPProtocolType && l.Port != 80 {
			port = strconv.Itoa(int(l.Port))
		}
		break
	}
	var out []v1alpha2.SourcedAddress
	for _, a := range g.Status.Addresses {
		host := a.Value
		if port != "" {
			host = net.JoinHostPort(host, port)
		}
		u := fmt.Sprintf("http://%s/%s/%s", host, svc.Namespace, svc.Name)
		out = append(out, v1alpha2.SourcedAddress{
			Addressable: v1alpha2.Addressable{URL: ptr.To(u)},
			Origin: &gwapiv1.ObjectReference{Group: gatewayGroup, Kind: "Gateway", Name: gwapiv1.ObjectName(k.Name),
				Namespace: ptr.To(gwapiv1.Namespace(k.Namespace))},
			Models: []v1alpha2.ModelSourcedAddressStatus{{Name: model}},
		})
	}
	return out
}
