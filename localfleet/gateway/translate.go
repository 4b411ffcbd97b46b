package gateway

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// world is the cluster state the gateway reads from its informer cache.
type world struct {
	classes    []gatewayv1.GatewayClass
	gateway    *gatewayv1.Gateway // nil when absent
	routes     []gatewayv1.HTTPRoute
	pools      map[types.NamespacedName]*inferencev1.InferencePool
	services   map[types.NamespacedName]*corev1.Service
	pods       map[string][]*corev1.Pod // by namespace
	namespaces map[string]*corev1.Namespace
	grants     []gatewayv1.ReferenceGrant
}

// config is what the data plane serves: one consistent snapshot, swapped
// atomically after every change.
type config struct {
	listeners map[int32]*routeTable
	// epps lists every endpoint-picker address in use, so that clients of
	// pickers that went away can be closed.
	epps map[string]bool
}

// translation is the outcome of one pass over the world: the config to
// serve and the status the gateway owes every object it is a parent of.
type translation struct {
	cfg *config
	// serving is false when the Gateway is absent or not of a class this
	// controller implements: nothing is served and no Gateway, route or
	// pool status is written.
	serving   bool
	listeners []*listenerState
	gatewayOK metav1.Condition // Accepted
	routes    map[types.NamespacedName][]gatewayv1.RouteParentStatus
	pools     map[types.NamespacedName]*inferencev1.ParentStatus
}

// listenerState is one Gateway listener as translated.
type listenerState struct {
	spec      gatewayv1.Listener
	valid     bool
	kinds     []gatewayv1.RouteGroupKind
	conds     []metav1.Condition // Accepted, ResolvedRefs, Conflicted
	attached  int32
	table     *routeTable
	bindError error // set by the listener sync; nil once bound
}

// backend is a resolved backendRef.
type backend struct {
	label   string // for metrics and logs: "inferencepool/ns/name", "service/ns/name:port"
	weight  int
	filters filters
	// invalid, when set, is why requests to this backend get 500.
	invalid string
	service *serviceTarget
	pool    *poolTarget
}

type serviceTarget struct {
	endpoints []string
	h2c       bool
}

// poolTarget is an InferencePool with everything a request needs resolved.
type poolTarget struct {
	key      types.NamespacedName
	failOpen bool
	h2c      bool
	// local holds ip:port of every Ready pod for every target port: the
	// destinations that stay in the cluster.
	local map[string]bool
	// epp lists ip:port of the Ready pods behind the endpoint picker's
	// Service; eppProblem says why there are none to ask, if the reference
	// itself is broken.
	epp        []string
	eppProblem string
}

const (
	gatewayGroup   = gatewayv1.GroupName
	inferenceGroup = inferencev1.GroupName
	importGroup    = "inference.networking.x-k8s.io"
)

type translator struct {
	ctrl     gatewayv1.GatewayController
	w        *world
	pools    map[types.NamespacedName]*poolTarget
	services map[string]*serviceTarget
}

// translate computes the config and status for the gateway's Gateway.
func translate(ctrl gatewayv1.GatewayController, w *world) *translation {
	t := &translator{ctrl: ctrl, w: w, pools: map[types.NamespacedName]*poolTarget{}, services: map[string]*serviceTarget{}}
	tr := &translation{
		cfg:    &config{listeners: map[int32]*routeTable{}, epps: map[string]bool{}},
		routes: map[types.NamespacedName][]gatewayv1.RouteParentStatus{},
		pools:  map[types.NamespacedName]*inferencev1.ParentStatus{},
	}
	gw := w.gateway
	if gw == nil || !t.classIsOurs(string(gw.Spec.GatewayClassName)) {
		return tr
	}
	tr.serving = true
	tr.listeners = t.listeners(gw)
	tr.gatewayOK = condition(gatewayv1.GatewayConditionAccepted, false, gatewayv1.GatewayReasonListenersNotValid,
		"No listener is valid.", gw.Generation)
	for _, l := range tr.listeners {
		if l.valid {
			tr.gatewayOK = condition(gatewayv1.GatewayConditionAccepted, true, gatewayv1.GatewayReasonAccepted,
				"Accepted by "+string(ctrl)+".", gw.Generation)
		}
	}

	routes := append([]gatewayv1.HTTPRoute(nil), w.routes...)
	sort.Slice(routes, func(i, j int) bool { return routeKey(&routes[i]).String() < routeKey(&routes[j]).String() })
	poolAccepted := map[types.NamespacedName]bool{}
	for i := range routes {
		rt := &routes[i]
		refs := t.parentRefsToUs(rt)
		if len(refs) == 0 {
			continue
		}
		c := t.compile(rt)
		var parents []gatewayv1.RouteParentStatus
		accepted := false
		for _, ref := range refs {
			st := t.attach(rt, ref, c, tr.listeners)
			parents = append(parents, st)
			accepted = accepted || meta.IsStatusConditionTrue(st.Conditions, string(gatewayv1.RouteConditionAccepted))
		}
		tr.routes[routeKey(rt)] = parents
		for _, p := range c.pools {
			poolAccepted[p] = poolAccepted[p] || accepted
		}
	}
	// Listeners sharing a port (told apart by hostname) share one table.
	for _, l := range tr.listeners {
		if !l.valid {
			continue
		}
		port := int32(l.spec.Port)
		if tr.cfg.listeners[port] == nil {
			tr.cfg.listeners[port] = &routeTable{}
		}
		tr.cfg.listeners[port].merge(l.table)
	}
	for _, rt := range tr.cfg.listeners {
		rt.seal()
	}
	for key, accepted := range poolAccepted {
		pool := w.pools[key]
		if pool == nil {
			continue
		}
		tr.pools[key] = t.poolStatus(pool, accepted)
	}
	for _, p := range t.pools {
		for _, a := range p.epp {
			tr.cfg.epps[a] = true
		}
	}
	return tr
}

func (t *translator) classIsOurs(name string) bool {
	for _, c := range t.w.classes {
		if c.Name == name {
			return c.Spec.ControllerName == t.ctrl
		}
	}
	return false
}

// listeners validates the Gateway's listeners: HTTP only (TLS termination is
// not implemented), route kinds limited to HTTPRoute, and no two listeners on
// one port with the same hostname.
func (t *translator) listeners(gw *gatewayv1.Gateway) []*listenerState {
	gen := gw.Generation
	out := make([]*listenerState, len(gw.Spec.Listeners))
	for i, spec := range gw.Spec.Listeners {
		l := &listenerState{spec: spec, table: &routeTable{}}
		out[i] = l
		if spec.Protocol != gatewayv1.HTTPProtocolType {
			l.conds = []metav1.Condition{
				condition(gatewayv1.ListenerConditionAccepted, false, gatewayv1.ListenerReasonUnsupportedProtocol,
					fmt.Sprintf("Protocol %s is not supported; the local gateway serves plain HTTP.", spec.Protocol), gen),
				condition(gatewayv1.ListenerConditionResolvedRefs, true, gatewayv1.ListenerReasonResolvedRefs, "", gen),
				condition(gatewayv1.ListenerConditionConflicted, false, gatewayv1.ListenerReasonNoConflicts, "", gen),
			}
			continue
		}
		l.valid = true
		resolved := condition(gatewayv1.ListenerConditionResolvedRefs, true, gatewayv1.ListenerReasonResolvedRefs, "", gen)
		l.kinds = []gatewayv1.RouteGroupKind{{Group: ptrTo(gatewayv1.Group(gatewayGroup)), Kind: "HTTPRoute"}}
		if ar := spec.AllowedRoutes; ar != nil && len(ar.Kinds) > 0 {
			l.kinds = nil
			for _, k := range ar.Kinds {
				if (k.Group == nil || *k.Group == gatewayGroup) && k.Kind == "HTTPRoute" {
					l.kinds = []gatewayv1.RouteGroupKind{{Group: ptrTo(gatewayv1.Group(gatewayGroup)), Kind: "HTTPRoute"}}
				} else {
					resolved = condition(gatewayv1.ListenerConditionResolvedRefs, false, gatewayv1.ListenerReasonInvalidRouteKinds,
						fmt.Sprintf("Route kind %s is not supported; only HTTPRoute is.", k.Kind), gen)
				}
			}
		}
		l.conds = []metav1.Condition{
			condition(gatewayv1.ListenerConditionAccepted, true, gatewayv1.ListenerReasonAccepted, "", gen),
			resolved,
			condition(gatewayv1.ListenerConditionConflicted, false, gatewayv1.ListenerReasonNoConflicts, "", gen),
		}
	}
	for i, a := range out {
		for j, b := range out {
			if i != j && a.valid && b.valid && a.spec.Port == b.spec.Port && hostnameOf(a.spec.Hostname) == hostnameOf(b.spec.Hostname) {
				a.conds[2] = condition(gatewayv1.ListenerConditionConflicted, true, gatewayv1.ListenerReasonHostnameConflict,
					fmt.Sprintf("Listener %s uses the same port and hostname.", b.spec.Name), gen)
			}
		}
	}
	for _, l := range out {
		if l.valid && meta.IsStatusConditionTrue(l.conds, string(gatewayv1.ListenerConditionConflicted)) {
			l.valid = false
		}
	}
	return out
}

func hostnameOf(h *gatewayv1.Hostname) string {
	if h == nil {
		return ""
	}
	return strings.ToLower(string(*h))
}

func routeKey(r *gatewayv1.HTTPRoute) types.NamespacedName {
	return types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
}

// parentRefsToUs returns the route's parentRefs that name this gateway.
func (t *translator) parentRefsToUs(r *gatewayv1.HTTPRoute) []gatewayv1.ParentReference {
	var out []gatewayv1.ParentReference
	for _, p := range r.Spec.ParentRefs {
		if refersTo(p, r.Namespace, t.w.gateway) {
			out = append(out, p)
		}
	}
	return out
}

func refersTo(p gatewayv1.ParentReference, routeNS string, gw *gatewayv1.Gateway) bool {
	return valueOr(p.Group, gatewayGroup) == gatewayGroup && valueOr(p.Kind, "Gateway") == "Gateway" &&
		valueOr(p.Namespace, routeNS) == gw.Namespace && string(p.Name) == gw.Name
}

// valueOr is what an optional API field holds, or its default.
func valueOr[T ~string](p *T, def string) string {
	if p == nil {
		return def
	}
	return string(*p)
}

// compiledRoute is an HTTPRoute turned into match entries, independent of
// the listener it attaches to.
type compiledRoute struct {
	entries  []*routeEntry
	valid    int      // rules that compiled
	invalid  []string // why the others did not
	resolved metav1.Condition
	pools    []types.NamespacedName
}

func (t *translator) compile(r *gatewayv1.HTTPRoute) *compiledRoute {
	c := &compiledRoute{resolved: condition(gatewayv1.RouteConditionResolvedRefs, true, gatewayv1.RouteReasonResolvedRefs, "", r.Generation)}
	for i, rule := range r.Spec.Rules {
		entries, err := t.compileRule(r, i, rule, c)
		if err != nil {
			c.invalid = append(c.invalid, fmt.Sprintf("rule %d: %v", i, err))
			continue
		}
		c.valid++
		c.entries = append(c.entries, entries...)
	}
	return c
}

func (t *translator) compileRule(r *gatewayv1.HTTPRoute, index int, rule gatewayv1.HTTPRouteRule, c *compiledRoute) ([]*routeEntry, error) {
	matches := rule.Matches
	if len(matches) == 0 {
		matches = []gatewayv1.HTTPRouteMatch{{}}
	}
	prefix := ""
	if m := matches[0].Path; len(matches) == 1 && m != nil && (m.Type == nil || *m.Type == gatewayv1.PathMatchPathPrefix) && m.Value != nil {
		prefix = *m.Value
	}
	ruleFilters, err := compileFilters(rule.Filters, prefix)
	if err != nil {
		return nil, err
	}
	action := &ruleAction{}
	if to := rule.Timeouts; to != nil {
		if action.timeout, err = parseDuration(to.Request); err != nil {
			return nil, err
		}
		if action.backendTimeout, err = parseDuration(to.BackendRequest); err != nil {
			return nil, err
		}
	}
	for _, ref := range rule.BackendRefs {
		f := ruleFilters
		if len(ref.Filters) > 0 {
			bf, err := compileFilters(ref.Filters, prefix)
			if err != nil {
				return nil, err
			}
			f = ruleFilters.then(bf)
		}
		b := t.backend(r, ref.BackendRef, c)
		b.filters = f
		action.backends = append(action.backends, b)
		action.totalWeight += b.weight
	}
	var entries []*routeEntry
	for mi, m := range matches {
		e := &routeEntry{route: routeKey(r), created: r.CreationTimestamp.Time, rule: index, match: mi, action: action,
			path: pathMatch{kind: gatewayv1.PathMatchPathPrefix, value: "/"}}
		if m.Path != nil {
			if m.Path.Type != nil {
				e.path.kind = *m.Path.Type
			}
			if m.Path.Value != nil {
				e.path.value = *m.Path.Value
			}
			if e.path.kind == gatewayv1.PathMatchRegularExpression {
				if e.path.re, err = anchored(e.path.value); err != nil {
					return nil, err
				}
			}
		}
		if m.Method != nil {
			e.method = string(*m.Method)
		}
		for _, h := range m.Headers {
			vm, err := valueMatcher(http.CanonicalHeaderKey(string(h.Name)), h.Value, h.Type != nil && *h.Type == gatewayv1.HeaderMatchRegularExpression)
			if err != nil {
				return nil, err
			}
			e.headers = append(e.headers, vm)
		}
		for _, q := range m.QueryParams {
			vm, err := valueMatcher(string(q.Name), q.Value, q.Type != nil && *q.Type == gatewayv1.QueryParamMatchRegularExpression)
			if err != nil {
				return nil, err
			}
			e.query = append(e.query, vm)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

func valueMatcher(name, value string, regex bool) (valueMatch, error) {
	vm := valueMatch{name: name, exact: value}
	if regex {
		re, err := anchored(value)
		if err != nil {
			return vm, err
		}
		vm.re = re
	}
	return vm, nil
}

// anchored compiles a RE2 expression that must match the whole value, as
// Envoy's safe_regex matchers do.
func anchored(expr string) (*regexp.Regexp, error) {
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		return nil, fmt.Errorf("invalid regular expression %q: %w", expr, err)
	}
	return re, nil
}

func parseDuration(d *gatewayv1.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	v, err := time.ParseDuration(string(*d))
	if err != nil || v < 0 {
		return 0, fmt.Errorf("invalid timeout %q", *d)
	}
	return v, nil
}

// compileFilters accepts the filters the gateway implements; any other
// makes the rule invalid.
func compileFilters(fs []gatewayv1.HTTPRouteFilter, prefix string) (filters, error) {
	var f filters
	for _, x := range fs {
		switch {
		case x.Type == gatewayv1.HTTPRouteFilterRequestHeaderModifier && x.RequestHeaderModifier != nil:
			f.requestHeaders = append(f.requestHeaders, x.RequestHeaderModifier)
		case x.Type == gatewayv1.HTTPRouteFilterResponseHeaderModifier && x.ResponseHeaderModifier != nil:
			f.responseHeaders = append(f.responseHeaders, x.ResponseHeaderModifier)
		case x.Type == gatewayv1.HTTPRouteFilterURLRewrite && x.URLRewrite != nil:
			if p := x.URLRewrite.Path; p != nil {
				switch {
				case p.Type == gatewayv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
				case p.Type == gatewayv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil:
					if prefix == "" {
						return f, fmt.Errorf("ReplacePrefixMatch needs exactly one PathPrefix match")
					}
				default:
					return f, fmt.Errorf("path modifier %q is not supported", p.Type)
				}
				f.rewritePath, f.prefix = p, prefix
			}
			if x.URLRewrite.Hostname != nil {
				f.rewriteHost = string(*x.URLRewrite.Hostname)
			}
		default:
			return f, fmt.Errorf("filter %s is not supported by the local gateway", x.Type)
		}
	}
	return f, nil
}

// then returns f followed by the filters of a backendRef, whose rewrites win.
func (f filters) then(b filters) filters {
	out := f
	if b.rewritePath != nil {
		out.rewritePath, out.prefix = b.rewritePath, b.prefix
	}
	if b.rewriteHost != "" {
		out.rewriteHost = b.rewriteHost
	}
	out.requestHeaders = append(append([]*gatewayv1.HTTPHeaderFilter(nil), f.requestHeaders...), b.requestHeaders...)
	out.responseHeaders = append(append([]*gatewayv1.HTTPHeaderFilter(nil), f.responseHeaders...), b.responseHeaders...)
	return out
}

// backend resolves a backendRef. A broken reference keeps its weight and
// turns its share of the traffic into 500s; the first problem becomes the
// route's ResolvedRefs condition.
func (t *translator) backend(r *gatewayv1.HTTPRoute, ref gatewayv1.BackendRef, c *compiledRoute) *backend {
	group, kind, ns := valueOr(ref.Group, ""), valueOr(ref.Kind, "Service"), valueOr(ref.Namespace, r.Namespace)
	key := types.NamespacedName{Namespace: ns, Name: string(ref.Name)}
	b := &backend{weight: 1}
	if ref.Weight != nil {
		b.weight = int(*ref.Weight)
	}
	fail := func(reason gatewayv1.RouteConditionReason, format string, args ...any) *backend {
		b.invalid = fmt.Sprintf(format, args...)
		if c.resolved.Status == metav1.ConditionTrue {
			c.resolved = condition(gatewayv1.RouteConditionResolvedRefs, false, reason, b.invalid, r.Generation)
		}
		return b
	}
	switch {
	case group == "" && kind == "Service":
		b.label = "service/" + key.String()
		if ref.Port == nil {
			return fail(gatewayv1.RouteReasonUnsupportedValue, "backendRef to Service %s has no port", key)
		}
		b.label += ":" + strconv.Itoa(int(*ref.Port))
	case group == inferenceGroup && kind == "InferencePool":
		b.label = "inferencepool/" + key.String()
	case group == importGroup && kind == "InferencePoolImport":
		// GIE's multi-cluster proposal: the import controller programs the
		// data plane of an import. fleetinfer's creates an InferencePool of
		// the import's name whose picker reaches the exporting clusters; a
		// gateway that implements the proposal (istio/istio#58252) resolves
		// the import to that pool, and so does this one.
		b.label = "inferencepoolimport/" + key.String()
	default:
		b.label = strings.ToLower(kind) + "/" + key.String()
		return fail(gatewayv1.RouteReasonInvalidKind, "backendRef kind %s in group %q is not supported", kind, group)
	}
	if ns != r.Namespace && !t.granted(r.Namespace, group, kind, key) {
		return fail(gatewayv1.RouteReasonRefNotPermitted, "no ReferenceGrant in namespace %s allows HTTPRoutes from %s to %s %s", ns, r.Namespace, kind, key.Name)
	}
	if kind == "InferencePool" || kind == "InferencePoolImport" {
		p := t.pool(key)
		switch {
		case p == nil && kind == "InferencePoolImport":
			return fail(gatewayv1.RouteReasonBackendNotFound,
				"InferencePoolImport %s has no InferencePool of the same name to route to: the import controller creates it once the pool is exported and federated", key)
		case p == nil:
			return fail(gatewayv1.RouteReasonBackendNotFound, "InferencePool %s not found", key)
		}
		b.pool = p
		c.pools = append(c.pools, key)
		return b
	}
	s, problem := t.service(key, int32(*ref.Port))
	if problem != "" {
		return fail(gatewayv1.RouteReasonBackendNotFound, "%s", problem)
	}
	b.service = s
	return b
}

func (t *translator) granted(from, group, kind string, to types.NamespacedName) bool {
	for _, g := range t.w.grants {
		if g.Namespace != to.Namespace {
			continue
		}
		fromOK, toOK := false, false
		for _, f := range g.Spec.From {
			fromOK = fromOK || (string(f.Group) == gatewayGroup && f.Kind == "HTTPRoute" && string(f.Namespace) == from)
		}
		for _, x := range g.Spec.To {
			toOK = toOK || (string(x.Group) == group && string(x.Kind) == kind && (x.Name == nil || string(*x.Name) == to.Name))
		}
		if fromOK && toOK {
			return true
		}
	}
	return false
}

// service resolves a Service port to the Ready pods of its selector: the
// local fleet has no EndpointSlices (the API server refuses loopback
// addresses in them), so the gateway reads the pods itself.
func (t *translator) service(key types.NamespacedName, port int32) (*serviceTarget, string) {
	id := key.String() + ":" + strconv.Itoa(int(port))
	if s, ok := t.services[id]; ok {
		return s, ""
	}
	svc := t.w.services[key]
	if svc == nil {
		return nil, fmt.Sprintf("Service %s not found", key)
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, fmt.Sprintf("Service %s is of type ExternalName, which the gateway does not forward to", key)
	}
	sp := servicePort(svc, port)
	if sp == nil {
		return nil, fmt.Sprintf("Service %s has no port %d", key, port)
	}
	s := &serviceTarget{h2c: sp.AppProtocol != nil && *sp.AppProtocol == string(inferencev1.AppProtocolH2C)}
	for _, pod := range t.readyPods(key.Namespace, svc.Spec.Selector) {
		if p := targetPort(pod, sp); p > 0 {
			s.endpoints = append(s.endpoints, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(p))))
		}
	}
	t.services[id] = s
	return s, ""
}

func servicePort(svc *corev1.Service, port int32) *corev1.ServicePort {
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == port {
			return &svc.Spec.Ports[i]
		}
	}
	return nil
}

// targetPort resolves a Service port's targetPort on one pod: a number, or a
// container port name (which pods may map to different numbers).
func targetPort(pod *corev1.Pod, sp *corev1.ServicePort) int32 {
	tp := sp.TargetPort
	switch {
	case tp.IntValue() > 0:
		return int32(tp.IntValue())
	case tp.StrVal == "":
		return sp.Port
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == tp.StrVal {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// readyPods are the pods of ns matching selector that a load balancer may
// send to: Ready, with an IP, not terminating. A nil or empty selector
// selects nothing, as for a Service.
func (t *translator) readyPods(ns string, selector map[string]string) []*corev1.Pod {
	if len(selector) == 0 {
		return nil
	}
	sel := labels.SelectorFromSet(selector)
	var out []*corev1.Pod
	for _, p := range t.w.pods[ns] {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" && podutils.IsPodReady(p) && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// pool resolves an InferencePool: its endpoints and its endpoint picker.
func (t *translator) pool(key types.NamespacedName) *poolTarget {
	if p, ok := t.pools[key]; ok {
		return p
	}
	ip := t.w.pools[key]
	if ip == nil {
		return nil
	}
	p := &poolTarget{key: key, local: map[string]bool{},
		failOpen: ip.Spec.EndpointPickerRef.FailureMode == inferencev1.EndpointPickerFailOpen,
		h2c:      ip.Spec.AppProtocol == inferencev1.AppProtocolH2C}
	for _, pod := range t.readyPods(key.Namespace, toStringMap(ip.Spec.Selector.MatchLabels)) {
		for _, tp := range ip.Spec.TargetPorts {
			ep := net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(tp.Number)))
			p.local[ep] = true
		}
	}
	p.epp, p.eppProblem = t.endpointPicker(key.Namespace, ip.Spec.EndpointPickerRef)
	t.pools[key] = p
	return p
}

func toStringMap(m map[inferencev1.LabelKey]inferencev1.LabelValue) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[string(k)] = string(v)
	}
	return out
}

// endpointPicker resolves endpointPickerRef (a Service port, the only kind
// GIE defines) to the addresses of the picker's Ready pods.
func (t *translator) endpointPicker(ns string, ref inferencev1.EndpointPickerRef) ([]string, string) {
	group, kind := valueOr(ref.Group, ""), string(ref.Kind)
	if kind == "" {
		kind = "Service"
	}
	if group != "" || kind != "Service" {
		return nil, fmt.Sprintf("endpointPickerRef kind %s in group %q is not supported", kind, group)
	}
	if ref.Port == nil {
		return nil, "endpointPickerRef has no port"
	}
	key := types.NamespacedName{Namespace: ns, Name: string(ref.Name)}
	svc := t.w.services[key]
	switch {
	case svc == nil:
		return nil, fmt.Sprintf("endpoint picker Service %s not found", key)
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return nil, fmt.Sprintf("endpoint picker Service %s is of type ExternalName, which must not be supported", key)
	}
	sp := servicePort(svc, int32(ref.Port.Number))
	if sp == nil {
		return nil, fmt.Sprintf("endpoint picker Service %s has no port %d", key, ref.Port.Number)
	}
	var out []string
	for _, pod := range t.readyPods(ns, svc.Spec.Selector) {
		if p := targetPort(pod, sp); p > 0 {
			out = append(out, net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(p))))
		}
	}
	return out, ""
}

// attach evaluates one parentRef of a route against the Gateway's listeners
// and, when accepted, adds the route's entries to each listener it attaches
// to, under the hostnames the two have in common.
func (t *translator) attach(r *gatewayv1.HTTPRoute, ref gatewayv1.ParentReference, c *compiledRoute, ls []*listenerState) gatewayv1.RouteParentStatus {
	gen := r.Generation
	st := gatewayv1.RouteParentStatus{ParentRef: ref, ControllerName: t.ctrl}
	reject := func(reason gatewayv1.RouteConditionReason, msg string) gatewayv1.RouteParentStatus {
		st.Conditions = []metav1.Condition{condition(gatewayv1.RouteConditionAccepted, false, reason, msg, gen), c.resolved}
		return st
	}
	var matched, allowed []*listenerState
	for _, l := range ls {
		if (ref.SectionName == nil || *ref.SectionName == l.spec.Name) && (ref.Port == nil || *ref.Port == l.spec.Port) {
			matched = append(matched, l)
		}
	}
	if len(matched) == 0 {
		return reject(gatewayv1.RouteReasonNoMatchingParent, "No listener matches the parentRef's sectionName and port.")
	}
	for _, l := range matched {
		if l.valid && len(l.kinds) > 0 && t.namespaceAllowed(l, r.Namespace) {
			allowed = append(allowed, l)
		}
	}
	if len(allowed) == 0 {
		return reject(gatewayv1.RouteReasonNotAllowedByListeners, "No listener allows HTTPRoutes from namespace "+r.Namespace+".")
	}
	type attachment struct {
		l     *listenerState
		hosts []string
	}
	var attached []attachment
	for _, l := range allowed {
		if hosts := intersectHostnames(l.spec.Hostname, r.Spec.Hostnames); len(hosts) > 0 {
			attached = append(attached, attachment{l, hosts})
		}
	}
	if len(attached) == 0 {
		return reject(gatewayv1.RouteReasonNoMatchingListenerHostname, "No listener hostname intersects the route's hostnames.")
	}
	if c.valid == 0 && len(c.invalid) > 0 {
		return reject(gatewayv1.RouteReasonUnsupportedValue, "No rule is valid: "+strings.Join(c.invalid, "; "))
	}
	for _, a := range attached {
		a.l.attached++
		for _, e := range c.entries {
			a.l.table.add(e, a.hosts)
		}
	}
	st.Conditions = []metav1.Condition{
		condition(gatewayv1.RouteConditionAccepted, true, gatewayv1.RouteReasonAccepted, "Accepted by "+string(t.ctrl)+".", gen),
		c.resolved,
	}
	if len(c.invalid) > 0 {
		st.Conditions = append(st.Conditions, condition(gatewayv1.RouteConditionPartiallyInvalid, true,
			gatewayv1.RouteReasonUnsupportedValue, "Dropped: "+strings.Join(c.invalid, "; "), gen))
	}
	return st
}

func (t *translator) namespaceAllowed(l *listenerState, ns string) bool {
	from := gatewayv1.NamespacesFromSame
	var selector *metav1.LabelSelector
	if ar := l.spec.AllowedRoutes; ar != nil && ar.Namespaces != nil {
		if ar.Namespaces.From != nil {
			from = *ar.Namespaces.From
		}
		selector = ar.Namespaces.Selector
	}
	switch from {
	case gatewayv1.NamespacesFromAll:
		return true
	case gatewayv1.NamespacesFromSelector:
		n := t.w.namespaces[ns]
		sel, err := metav1.LabelSelectorAsSelector(selector)
		return n != nil && err == nil && sel.Matches(labels.Set(n.Labels))
	}
	return ns == t.w.gateway.Namespace
}

// intersectHostnames returns the hostnames a route serves through a
// listener ("" for any host): the route's own when the listener has none,
// the listener's when the route has none, else the pairs that overlap, each
// narrowed to the more specific side ("*.example.com" and "a.example.com"
// give "a.example.com").
func intersectHostnames(listener *gatewayv1.Hostname, route []gatewayv1.Hostname) []string {
	lh := hostnameOf(listener)
	if len(route) == 0 {
		return []string{lh}
	}
	seen := map[string]bool{}
	var out []string
	for _, rh := range route {
		h := strings.ToLower(string(rh))
		switch {
		case lh == "" || h == lh:
		case covers(lh, h):
		case covers(h, lh):
			h = lh
		default:
			continue
		}
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

// covers reports whether the wildcard hostname w matches h (a name or a
// narrower wildcard): "*.example.com" covers "a.example.com",
// "a.b.example.com" and "*.b.example.com", but not "example.com".
func covers(w, h string) bool {
	return strings.HasPrefix(w, "*.") && len(h) > len(w)-1 && strings.HasSuffix(h, w[1:])
}

// poolStatus is the gateway's parent entry on an InferencePool.
func (t *translator) poolStatus(pool *inferencev1.InferencePool, routeAccepted bool) *inferencev1.ParentStatus {
	gen := pool.Generation
	accepted := condition(inferencev1.InferencePoolConditionAccepted, true, inferencev1.InferencePoolReasonAccepted,
		"Accepted by "+string(t.ctrl)+" as a backend of Gateway "+t.w.gateway.Namespace+"/"+t.w.gateway.Name+".", gen)
	if !routeAccepted {
		accepted = condition(inferencev1.InferencePoolConditionAccepted, false, inferencev1.InferencePoolReasonHTTPRouteNotAccepted,
			"No HTTPRoute referencing the pool is accepted by the Gateway.", gen)
	}
	resolved := condition(inferencev1.InferencePoolConditionResolvedRefs, true, inferencev1.InferencePoolReasonResolvedRefs, "", gen)
	if p := t.pool(types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}); p != nil && p.eppProblem != "" {
		resolved = condition(inferencev1.InferencePoolConditionResolvedRefs, false, inferencev1.InferencePoolReasonInvalidExtensionRef, p.eppProblem, gen)
	}
	return &inferencev1.ParentStatus{
		ParentRef:      t.gatewayParentRef(),
		ControllerName: inferencev1.ControllerName(t.ctrl),
		Conditions:     []metav1.Condition{accepted, resolved},
	}
}

func (t *translator) gatewayParentRef() inferencev1.ParentReference {
	return inferencev1.ParentReference{
		Group:     ptrTo(inferencev1.Group(gatewayGroup)),
		Kind:      "Gateway",
		Namespace: inferencev1.Namespace(t.w.gateway.Namespace),
		Name:      inferencev1.ObjectName(t.w.gateway.Name),
	}
}

func condition[T ~string, R ~string](typ T, ok bool, reason R, msg string, gen int64) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(typ), Status: s, Reason: string(reason), Message: msg, ObservedGeneration: gen}
}

func ptrTo[T any](v T) *T { return &v }
