package gateway

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// writeStatus writes every status the translation implies that differs from
// what the object has. Only the gateway's own entries are touched: route and
// pool parents of other Gateways or controllers are kept as they are.
// Conflicts are returned so that the loop retries on fresher objects.
func (g *Gateway) writeStatus(ctx context.Context, w *world, tr *translation) error {
	var errs []error
	update := func(obj client.Object) {
		if err := g.client.Status().Update(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("status of %T %s: %w", obj, client.ObjectKeyFromObject(obj), err))
		}
	}
	for i := range w.classes {
		c := w.classes[i].DeepCopy()
		if c.Spec.ControllerName != ControllerName {
			continue
		}
		conds := mergeConditions(c.Status.Conditions, []metav1.Condition{
			condition(gatewayv1.GatewayClassConditionStatusAccepted, true, gatewayv1.GatewayClassReasonAccepted, "Handled by "+string(ControllerName)+".", c.Generation),
			condition(gatewayv1.GatewayClassConditionStatusSupportedVersion, true, gatewayv1.GatewayClassReasonSupportedVersion, "", c.Generation),
		})
		if !equality.Semantic.DeepEqual(conds, c.Status.Conditions) {
			c.Status.Conditions = conds
			update(c)
		}
	}
	if !tr.serving {
		return errors.Join(errs...)
	}
	if gw := w.gateway.DeepCopy(); g.gatewayStatus(gw, tr) {
		update(gw)
	}
	for i := range w.routes {
		r := w.routes[i].DeepCopy()
		parents := g.routeParents(r, tr.routes[routeKey(r)], w.gateway)
		if !equality.Semantic.DeepEqual(parents, r.Status.Parents) {
			r.Status.Parents = parents
			update(r)
		}
	}
	for key, p := range w.pools {
		pool := p.DeepCopy()
		parents := g.poolParents(pool, tr.pools[key], w.gateway)
		if !equality.Semantic.DeepEqual(parents, pool.Status.Parents) {
			pool.Status.Parents = parents
			update(pool)
		}
	}
	return errors.Join(errs...)
}

// gatewayStatus sets the Gateway's status and reports whether it changed.
func (g *Gateway) gatewayStatus(gw *gatewayv1.Gateway, tr *translation) bool {
	gen := gw.Generation
	before := gw.Status.DeepCopy()
	byName := map[gatewayv1.SectionName]gatewayv1.ListenerStatus{}
	for _, ls := range gw.Status.Listeners {
		byName[ls.Name] = ls
	}
	programmed := 0
	gw.Status.Listeners = nil
	for _, l := range tr.listeners {
		conds := append([]metav1.Condition(nil), l.conds...)
		switch {
		case !l.valid:
			conds = append(conds, condition(gatewayv1.ListenerConditionProgrammed, false, gatewayv1.ListenerReasonInvalid, "The listener is not valid.", gen))
		case l.bindError != nil:
			conds = append(conds, condition(gatewayv1.ListenerConditionProgrammed, false, gatewayv1.ListenerReasonPortUnavailable, l.bindError.Error(), gen))
		default:
			programmed++
			conds = append(conds, condition(gatewayv1.ListenerConditionProgrammed, true, gatewayv1.ListenerReasonProgrammed, "", gen))
		}
		kinds := l.kinds
		if kinds == nil {
			kinds = []gatewayv1.RouteGroupKind{}
		}
		gw.Status.Listeners = append(gw.Status.Listeners, gatewayv1.ListenerStatus{
			Name: l.spec.Name, SupportedKinds: kinds, AttachedRoutes: l.attached,
			Conditions: mergeConditions(byName[l.spec.Name].Conditions, conds),
		})
	}
	addr := g.opts.Address.String()
	prog := condition(gatewayv1.GatewayConditionProgrammed, true, gatewayv1.GatewayReasonProgrammed, "Listening on "+addr+".", gen)
	for _, a := range gw.Spec.Addresses {
		if (a.Type != nil && *a.Type != gatewayv1.IPAddressType) || a.Value != addr {
			prog = condition(gatewayv1.GatewayConditionProgrammed, false, gatewayv1.GatewayReasonAddressNotUsable,
				fmt.Sprintf("Only %s can be assigned by the local gateway.", addr), gen)
		}
	}
	if programmed == 0 && prog.Status == metav1.ConditionTrue {
		prog = condition(gatewayv1.GatewayConditionProgrammed, false, gatewayv1.GatewayReasonInvalid, "No listener is programmed.", gen)
	}
	gw.Status.Addresses = nil
	if prog.Status == metav1.ConditionTrue {
		gw.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: ptrTo(gatewayv1.IPAddressType), Value: addr}}
	}
	gw.Status.Conditions = mergeConditions(gw.Status.Conditions, []metav1.Condition{tr.gatewayOK, prog})
	return !equality.Semantic.DeepEqual(before, &gw.Status)
}

// routeParents replaces the gateway's entries in a route's status.parents
// with the translated ones (none when the route no longer names the
// Gateway), in place so that the list's order is stable, and keeps
// transition times of unchanged conditions.
func (g *Gateway) routeParents(r *gatewayv1.HTTPRoute, want []gatewayv1.RouteParentStatus, gw *gatewayv1.Gateway) []gatewayv1.RouteParentStatus {
	pending := map[string]gatewayv1.RouteParentStatus{}
	for _, p := range want {
		pending[parentRefKey(p.ParentRef)] = p
	}
	var out []gatewayv1.RouteParentStatus
	for _, p := range r.Status.Parents {
		if p.ControllerName != ControllerName || !refersTo(p.ParentRef, r.Namespace, gw) {
			out = append(out, p)
			continue
		}
		k := parentRefKey(p.ParentRef)
		if w, ok := pending[k]; ok {
			w.Conditions = mergeConditions(p.Conditions, w.Conditions)
			out = append(out, w)
			delete(pending, k)
		}
	}
	for _, p := range want {
		if w, ok := pending[parentRefKey(p.ParentRef)]; ok {
			w.Conditions = mergeConditions(nil, w.Conditions)
			out = append(out, w)
		}
	}
	return out
}

func parentRefKey(p gatewayv1.ParentReference) string {
	s := fmt.Sprintf("%v/%v/%v/%s", deref(p.Group), deref(p.Kind), deref(p.Namespace), p.Name)
	if p.SectionName != nil {
		s += "#" + string(*p.SectionName)
	}
	if p.Port != nil {
		s += fmt.Sprintf(":%d", *p.Port)
	}
	return s
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// poolParents puts the gateway's entry into a pool's status.parents, in
// place, or takes it out when no route attached to the Gateway uses the
// pool.
func (g *Gateway) poolParents(pool *inferencev1.InferencePool, want *inferencev1.ParentStatus, gw *gatewayv1.Gateway) []inferencev1.ParentStatus {
	var out []inferencev1.ParentStatus
	ours := types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}
	for _, p := range pool.Status.Parents {
		group := valueOr(p.ParentRef.Group, gatewayGroup)
		ns := string(p.ParentRef.Namespace)
		if ns == "" {
			ns = pool.Namespace
		}
		if group != gatewayGroup || p.ParentRef.Kind != "Gateway" || (types.NamespacedName{Namespace: ns, Name: string(p.ParentRef.Name)}) != ours {
			out = append(out, p)
			continue
		}
		if want != nil {
			w := *want
			w.Conditions = mergeConditions(p.Conditions, want.Conditions)
			out = append(out, w)
			want = nil
		}
	}
	if want != nil {
		w := *want
		w.Conditions = mergeConditions(nil, want.Conditions)
		out = append(out, w)
	}
	return out
}

// mergeConditions returns want with the transition time of every condition
// whose status did not change taken from old, as meta.SetStatusCondition
// does, and without conditions the gateway no longer sets.
func mergeConditions(old, want []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(want))
	for _, c := range want {
		if prev := meta.FindStatusCondition(old, c.Type); prev != nil && prev.Status == c.Status {
			c.LastTransitionTime = prev.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.Now()
		}
		out = append(out, c)
	}
	return out
}
