package llmisvc

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Reasons of the HTTPRoutesReady and GatewaysReady conditions set while
// routes are reconciled or read.
const (
	ReasonRefsInvalid       = "RefsInvalid"
	ReasonGatewayAPIMissing = "GatewayAPINotInstalled"
	ReasonNoRouteSpec       = "NoRouteSpec"
)

// gatewayGroup is the Gateway API's group, the default of a parent
// reference's.
const gatewayGroup = "gateway.networking.k8s.io"

func (r *Reconciler) reconcileManagedRoute(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec, rt *routing) error {
	st := &svc.Status
	if !r.apis.gateway {
		st.MarkFalse(v1alpha2.HTTPRoutesReady, ReasonGatewayAPIMissing, "spec.router.route needs the Gateway API CRDs (gateway.networking.k8s.io), which are not installed in this cluster")
		return nil
	}
	if s.Router.Route.HTTP == nil || s.Router.Route.HTTP.Spec == nil {
		st.MarkFalse(v1alpha2.HTTPRoutesReady, ReasonNoRouteSpec, "spec.router.route asks for a managed HTTPRoute but neither the service nor the %s%s preset gives its spec", r.opts.PresetPrefix, presetRoute)
		return nil
	}
	want := &gwapiv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Name: routeName(svc), Namespace: svc.Namespace,
			Labels: withLabels(selectorLabels(svc), v1alpha2.LabelComponent, v1alpha2.ComponentRouter)},
		Spec: *s.Router.Route.HTTP.Spec.DeepCopy(),
	}
	if federates(svc) {
		addForwardedRule(&want.Spec, svc.Namespace, poolName(svc))
	}
	cur, err := ensureObserved(ctx, r, svc, want, func(cur, want *gwapiv1.HTTPRoute, stale bool) bool {
		if !stale && derivedEqual(want.Spec, cur.Spec) {
			return false
		}
		cur.Spec = want.Spec
		return true
	})
	if err != nil {
		st.MarkFalse(v1alpha2.HTTPRoutesReady, reconcileFailedReason(err), "%v", err)
		return err
	}
	rt.addRoute(cur)
	return nil
}

// addForwardedRule lets requests other clusters' pickers forward here in
// Parent mode reach the pool: a copy of the route's first rule to the pool
// that matches the pool's fleetv1alpha1.ForwardedPoolHeader on any path and
// rewrites nothing, since the entry cluster's gateway already did. The
// service's own rules match longer path prefixes, so a client's request to
// the service's path still takes them, forged header or not; a client that
// sends the header on another path reaches the same pool it can reach
// anyway on this route's hostnames.
func addForwardedRule(spec *gwapiv1.HTTPRouteSpec, namespace, pool string) {
	for _, rule := range spec.Rules {
		if !slices.ContainsFunc(rule.BackendRefs, func(b gwapiv1.HTTPBackendRef) bool {
			return b.Kind != nil && *b.Kind == "InferencePool" && string(b.Name) == pool
		}) {
			continue
		}
		fwd := *rule.DeepCopy()
		fwd.Name = nil
		fwd.Matches = []gwapiv1.HTTPRouteMatch{{
			Path: &gwapiv1.HTTPPathMatch{Type: ptr.To(gwapiv1.PathMatchPathPrefix), Value: ptr.To("/")},
			Headers: []gwapiv1.HTTPHeaderMatch{{Type: ptr.To(gwapiv1.HeaderMatchExact),
				Name: fleetv1alpha1.ForwardedPoolHeader, Value: namespace + "/" + pool}},
		}}
		fwd.Filters = withoutRewrites(fwd.Filters)
		for i := range fwd.BackendRefs {
			fwd.BackendRefs[i].Filters = withoutRewrites(fwd.BackendRefs[i].Filters)
		}
		spec.Rules = append(spec.Rules, fwd)
		return
	}
}

func withoutRewrites(fs []gwapiv1.HTTPRouteFilter) []gwapiv1.HTTPRouteFilter {
	return slices.DeleteFunc(fs, func(f gwapiv1.HTTPRouteFilter) bool { return f.Type == gwapiv1.HTTPRouteFilterURLRewrite })
}

func (r *Reconciler) removeManagedRoute(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	if !r.apis.gateway {
		return nil
	}
	return remove(ctx, r, svc, &gwapiv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: routeName(svc), Namespace: svc.Namespace}})
}

func (r *Reconciler) observeRouteRefs(ctx context.Context, svc *v1alpha2.LLMInferenceService, refs []corev1.LocalObjectReference, rt *routing) error {
	if !r.apis.gateway {
		svc.Status.MarkFalse(v1alpha2.HTTPRoutesReady, ReasonGatewayAPIMissing, "spec.router.route.http.refs needs the Gateway API CRDs, which are not installed")
		return nil
	}
	var missing []string
	for _, ref := range refs {
		hr := &gwapiv1.HTTPRoute{}
		err := r.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: ref.Name}, hr)
		if apierrors.IsNotFound(err) {
			missing = append(missing, ref.Name)
			continue
		}
		if err != nil {
			return err
		}
		rt.addRoute(hr)
	}
	if len(missing) > 0 {
		svc.Status.MarkFalse(v1alpha2.HTTPRoutesReady, ReasonRefsInvalid, "HTTPRoute(s) %s (spec.router.route.http.refs) not found in namespace %s", strings.Join(missing, ", "), svc.Namespace)
	}
	return nil
}

// addRoute records a route and the Gateways it attaches to.
func (rt *routing) addRoute(hr *gwapiv1.HTTPRoute) {
	rt.routes = append(rt.routes, hr)
	for _, p := range hr.Spec.ParentRefs {
		if isGateway(p.Group, p.Kind) {
			rt.addGateway(parentKey(p, hr.Namespace))
		}
	}
}

func isGateway(g *gwapiv1.Group, k *gwapiv1.Kind) bool {
	return (g == nil || *g == gatewayGroup) && (k == nil || *k == "Gateway")
}

func parentKey(p gwapiv1.ParentReference, ns string) client.ObjectKey {
	if p.Namespace != nil {
		ns = string(*p.Namespace)
	}
	return client.ObjectKey{Namespace: ns, Name: string(p.Name)}
}
