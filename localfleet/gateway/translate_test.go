package gateway

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// testWorld is a cluster with the gateway's class and Gateway (one HTTP
// listener "http" on 8080 for routes from all namespaces, one HTTPS
// listener), pool "llm" in namespace "team" with two pods (one not Ready) and
// a picker Service whose pod is Ready, and a Service "web".
func testWorld() *world {
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: "infra", Name: "gw", Generation: 3},
		Spec: gatewayv1.GatewaySpec{GatewayClassName: "local", Listeners: []gatewayv1.Listener{
			{Name: "http", Port: 8080, Protocol: gatewayv1.HTTPProtocolType,
				AllowedRoutes: &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromAll)}}},
			{Name: "https", Port: 8443, Protocol: gatewayv1.HTTPSProtocolType},
		}},
	}
	pod := func(name, ip string, ready bool, labels map[string]string) *corev1.Pod {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, Labels: labels},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 9002}, {Name: "web", ContainerPort: 8081}}}}},
			Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
	}
	return &world{
		classes: []gatewayv1.GatewayClass{{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Spec: gatewayv1.GatewayClassSpec{ControllerName: ControllerName}}},
		gateway: gw,
		pools: map[types.NamespacedName]*inferencev1.InferencePool{{Namespace: "team", Name: "llm"}: {
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "llm", Generation: 2},
			Spec: inferencev1.InferencePoolSpec{
				Selector:          inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "llm"}},
				TargetPorts:       []inferencev1.Port{{Number: 8000}},
				EndpointPickerRef: inferencev1.EndpointPickerRef{Name: "llm-epp", Port: &inferencev1.Port{Number: 9002}, FailureMode: inferencev1.EndpointPickerFailOpen},
			},
		}},
		services: map[types.NamespacedName]*corev1.Service{
			{Namespace: "team", Name: "llm-epp"}: {ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "llm-epp"},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "epp"}, Ports: []corev1.ServicePort{{Port: 9002, TargetPort: intstr.FromString("grpc")}}}},
			{Namespace: "team", Name: "web"}: {ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web"},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("web")}}}},
		},
		pods: map[string][]*corev1.Pod{"team": {
			pod("llm-1", "127.11.0.1", true, map[string]string{"app": "llm"}),
			pod("llm-2", "127.11.0.2", false, map[string]string{"app": "llm"}),
			pod("epp-1", "127.11.0.3", true, map[string]string{"app": "epp"}),
			pod("web-1", "127.11.0.4", true, map[string]string{"app": "web"}),
		}},
		namespaces: map[string]*corev1.Namespace{"team": {ObjectMeta: metav1.ObjectMeta{Name: "team", Labels: map[string]string{"gateway": "yes"}}}},
	}
}

func httpRoute(name string, parent gatewayv1.ParentReference, rules ...gatewayv1.HTTPRouteRule) gatewayv1.HTTPRoute {
	return gatewayv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, Generation: 5, CreationTimestamp: metav1.NewTime(time.Unix(1, 0))},
		Spec:       gatewayv1.HTTPRouteSpec{CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{parent}}, Rules: rules},
	}
}

func toGateway() gatewayv1.ParentReference {
	return gatewayv1.ParentReference{Namespace: ptr.To(gatewayv1.Namespace("infra")), Name: "gw"}
}

func ref(group, kind, ns, name string, port int32) gatewayv1.HTTPBackendRef {
	r := gatewayv1.HTTPBackendRef{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
		Group: ptr.To(gatewayv1.Group(group)), Kind: ptr.To(gatewayv1.Kind(kind)), Name: gatewayv1.ObjectName(name)}}}
	if ns != "" {
		r.Namespace = ptr.To(gatewayv1.Namespace(ns))
	}
	if port != 0 {
		r.Port = ptr.To(gatewayv1.PortNumber(port))
	}
	return r
}

func cond(conds []metav1.Condition, typ string) string {
	c := meta.FindStatusCondition(conds, typ)
	if c == nil {
		return "absent"
	}
	return string(c.Status) + "/" + c.Reason
}

func TestRouteStatusReportsAttachmentAndReferences(t *testing.T) {
	pool := ref(inferencev1.GroupName, "InferencePool", "", "llm", 0)
	tests := []struct {
		name                     string
		route                    gatewayv1.HTTPRoute
		grant                    bool
		accepted, resolved, part string
	}{
		{name: "pool backend", route: httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{pool}}),
			accepted: "True/Accepted", resolved: "True/ResolvedRefs", part: "absent"},
		{name: "missing pool", route: httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref(inferencev1.GroupName, "InferencePool", "", "nope", 0)}}),
			accepted: "True/Accepted", resolved: "False/BackendNotFound", part: "absent"},
		{name: "import backend resolves to the pool of its name", route: httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref("inference.networking.x-k8s.io", "InferencePoolImport", "", "llm", 0)}}),
			accepted: "True/Accepted", resolved: "True/ResolvedRefs", part: "absent"},
		{name: "import without a pool of its name", route: httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref("inference.networking.x-k8s.io", "InferencePoolImport", "", "nope", 0)}}),
			accepted: "True/Accepted", resolved: "False/BackendNotFound", part: "absent"},
		{name: "unsupported kind", route: httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref("inference.networking.x-k8s.io", "InferenceObjective", "", "llm", 0)}}),
			accepted: "True/Accepted", resolved: "False/InvalidKind", part: "absent"},
		{name: "cross-namespace without grant", route: httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref("", "Service", "team", "web", 80)}}),
			accepted: "True/Accepted", resolved: "True/ResolvedRefs", part: "absent"},
		{name: "sectionName of no listener", route: httpRoute("r", gatewayv1.ParentReference{Namespace: ptr.To(gatewayv1.Namespace("infra")), Name: "gw", SectionName: ptr.To(gatewayv1.SectionName("grpc"))}),
			accepted: "False/NoMatchingParent", resolved: "True/ResolvedRefs", part: "absent"},
		{name: "only the HTTPS listener, which is not served", route: httpRoute("r", gatewayv1.ParentReference{Namespace: ptr.To(gatewayv1.Namespace("infra")), Name: "gw", SectionName: ptr.To(gatewayv1.SectionName("https"))}),
			accepted: "False/NotAllowedByListeners", resolved: "True/ResolvedRefs", part: "absent"},
		{name: "one rule with an unsupported filter is dropped", route: httpRoute("r", toGateway(),
			gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{pool}},
			gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestMirror}}}),
			accepted: "True/Accepted", resolved: "True/ResolvedRefs", part: "True/UnsupportedValue"},
		{name: "no valid rule", route: httpRoute("r", toGateway(),
			gatewayv1.HTTPRouteRule{Filters: []gatewayv1.HTTPRouteFilter{{Type: gatewayv1.HTTPRouteFilterRequestRedirect}}}),
			accepted: "False/UnsupportedValue", resolved: "True/ResolvedRefs", part: "absent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := testWorld()
			if tt.name == "cross-namespace without grant" {
				tt.route.Namespace = "other"
				tt.resolved = "False/RefNotPermitted"
			}
			w.routes = []gatewayv1.HTTPRoute{tt.route}
			tr := translate(ControllerName, w)
			parents := tr.routes[types.NamespacedName{Namespace: tt.route.Namespace, Name: "r"}]
			if len(parents) != 1 {
				t.Fatalf("parents %+v", parents)
			}
			p := parents[0]
			got := []string{cond(p.Conditions, "Accepted"), cond(p.Conditions, "ResolvedRefs"), cond(p.Conditions, "PartiallyInvalid")}
			if want := []string{tt.accepted, tt.resolved, tt.part}; strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("conditions %v, want %v", got, want)
			}
			for _, c := range p.Conditions {
				if c.ObservedGeneration != 5 {
					t.Errorf("%s observed generation %d, want the route's 5", c.Type, c.ObservedGeneration)
				}
			}
		})
	}
}

func TestReferenceGrantPermitsCrossNamespaceBackend(t *testing.T) {
	w := testWorld()
	r := httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref("", "Service", "team", "web", 80)}})
	r.Namespace = "other"
	w.routes = []gatewayv1.HTTPRoute{r}
	w.grants = []gatewayv1.ReferenceGrant{{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "g"}, Spec: gatewayv1.ReferenceGrantSpec{
		From: []gatewayv1.ReferenceGrantFrom{{Group: gatewayv1.GroupName, Kind: "HTTPRoute", Namespace: "other"}},
		To:   []gatewayv1.ReferenceGrantTo{{Group: "", Kind: "Service"}},
	}}}
	tr := translate(ControllerName, w)
	if got := cond(tr.routes[types.NamespacedName{Namespace: "other", Name: "r"}][0].Conditions, "ResolvedRefs"); got != "True/ResolvedRefs" {
		t.Errorf("ResolvedRefs %s", got)
	}
	e := tr.cfg.listeners[8080].any.entries[0]
	if eps := e.action.backends[0].service.endpoints; len(eps) != 1 || eps[0] != "127.11.0.4:8081" {
		t.Errorf("Service endpoints %v, want the named target port of the Ready pod", eps)
	}
}

func TestPoolResolvesReadyEndpointsPickerAndStatus(t *testing.T) {
	w := testWorld()
	w.routes = []gatewayv1.HTTPRoute{httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref(inferencev1.GroupName, "InferencePool", "", "llm", 0)}})}
	tr := translate(ControllerName, w)
	p := tr.cfg.listeners[8080].any.entries[0].action.backends[0].pool
	if len(p.local) != 1 || !p.local["127.11.0.1:8000"] || !p.failOpen || len(p.epp) != 1 || p.epp[0] != "127.11.0.3:9002" {
		t.Errorf("pool %+v; want the Ready pod only and the picker's pod at its named port", p)
	}
	if !tr.cfg.epps["127.11.0.3:9002"] {
		t.Errorf("picker addresses in use %v", tr.cfg.epps)
	}
	st := tr.pools[types.NamespacedName{Namespace: "team", Name: "llm"}]
	if st == nil || cond(st.Conditions, "Accepted") != "True/Accepted" || cond(st.Conditions, "ResolvedRefs") != "True/ResolvedRefs" ||
		st.ParentRef.Name != "gw" || st.ParentRef.Namespace != "infra" || st.Conditions[0].ObservedGeneration != 2 {
		t.Errorf("pool parent status %+v", st)
	}

	delete(w.services, types.NamespacedName{Namespace: "team", Name: "llm-epp"})
	tr = translate(ControllerName, w)
	if st := tr.pools[types.NamespacedName{Namespace: "team", Name: "llm"}]; cond(st.Conditions, "ResolvedRefs") != "False/InvalidExtensionRef" {
		t.Errorf("pool without its picker Service: %+v", st.Conditions)
	}
}

func TestPoolOfRejectedRouteIsNotAccepted(t *testing.T) {
	w := testWorld()
	w.gateway.Spec.Listeners[0].AllowedRoutes = nil // only the Gateway's own namespace
	w.routes = []gatewayv1.HTTPRoute{httpRoute("r", toGateway(), gatewayv1.HTTPRouteRule{BackendRefs: []gatewayv1.HTTPBackendRef{ref(inferencev1.GroupName, "InferencePool", "", "llm", 0)}})}
	tr := translate(ControllerName, w)
	if got := cond(tr.routes[types.NamespacedName{Namespace: "team", Name: "r"}][0].Conditions, "Accepted"); got != "False/NotAllowedByListeners" {
		t.Errorf("route Accepted %s", got)
	}
	if st := tr.pools[types.NamespacedName{Namespace: "team", Name: "llm"}]; cond(st.Conditions, "Accepted") != "False/HTTPRouteNotAccepted" {
		t.Errorf("pool %+v", st.Conditions)
	}

	selector := gatewayv1.NamespacesFromSelector
	w.gateway.Spec.Listeners[0].AllowedRoutes = &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: &selector,
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"gateway": "yes"}}}}
	tr = translate(ControllerName, w)
	if got := cond(tr.routes[types.NamespacedName{Namespace: "team", Name: "r"}][0].Conditions, "Accepted"); got != "True/Accepted" {
		t.Errorf("route from a selected namespace: Accepted %s", got)
	}
}

func TestListenersAreValidatedAndGatewaysOfOtherClassesIgnored(t *testing.T) {
	w := testWorld()
	w.gateway.Spec.Listeners = append(w.gateway.Spec.Listeners, gatewayv1.Listener{Name: "again", Port: 8080, Protocol: gatewayv1.HTTPProtocolType})
	tr := translate(ControllerName, w)
	got := map[gatewayv1.SectionName]string{}
	for _, l := range tr.listeners {
		got[l.spec.Name] = cond(l.conds, "Accepted") + " " + cond(l.conds, "Conflicted")
	}
	want := map[gatewayv1.SectionName]string{
		"http":  "True/Accepted True/HostnameConflict",
		"https": "False/UnsupportedProtocol False/NoConflicts",
		"again": "True/Accepted True/HostnameConflict",
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("listener %s: %s, want %s", name, got[name], w)
		}
	}
	if tr.gatewayOK.Status != metav1.ConditionFalse {
		t.Errorf("Gateway Accepted %+v with no usable listener", tr.gatewayOK)
	}

	w = testWorld()
	w.classes[0].Spec.ControllerName = "example.com/other"
	w.routes = []gatewayv1.HTTPRoute{httpRoute("r", toGateway())}
	if tr := translate(ControllerName, w); tr.serving || len(tr.routes) != 0 {
		t.Errorf("a Gateway of another controller's class was served: %+v", tr.routes)
	}
}

func TestStatusMergeKeepsOthersEntriesAndTransitionTimes(t *testing.T) {
	g := &Gateway{}
	w := testWorld()
	past := metav1.NewTime(time.Unix(1000, 0))
	other := gatewayv1.RouteParentStatus{ParentRef: gatewayv1.ParentReference{Name: "someone-elses"}, ControllerName: "example.com/other"}
	ours := gatewayv1.RouteParentStatus{ParentRef: toGateway(), ControllerName: ControllerName,
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: past}}}
	r := httpRoute("r", toGateway())
	r.Status.Parents = []gatewayv1.RouteParentStatus{ours, other}
	want := []gatewayv1.RouteParentStatus{{ParentRef: toGateway(), ControllerName: ControllerName,
		Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", ObservedGeneration: 6}}}}
	got := g.routeParents(&r, want, w.gateway)
	if len(got) != 2 || got[0].ControllerName != ControllerName || got[1].ControllerName != "example.com/other" {
		t.Fatalf("parents %+v; want ours in place, then the other controller's", got)
	}
	if !got[0].Conditions[0].LastTransitionTime.Equal(&past) || got[0].Conditions[0].ObservedGeneration != 6 {
		t.Errorf("condition %+v; want the old transition time and the new generation", got[0].Conditions[0])
	}
	if got := g.routeParents(&r, nil, w.gateway); len(got) != 1 || got[0].ControllerName != "example.com/other" {
		t.Errorf("after the route left the Gateway: %+v", got)
	}
}
