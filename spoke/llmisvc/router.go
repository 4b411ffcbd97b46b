package llmisvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
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

// Reasons of router conditions.
const (
	ReasonRefsInvalid          = "RefsInvalid"
	ReasonGatewaysNotReady     = "GatewaysNotReady"
	ReasonGatewayAPIMissing    = "GatewayAPINotInstalled"
	ReasonHTTPRoutesNotReady   = "HTTPRoutesNotReady"
	ReasonNoRouteSpec          = "NoRouteSpec"
	ReasonWaitingForGateway    = "WaitingForGateway"
	ReasonPoolNotFound         = "InferencePoolNotFound"
	ReasonPoolAPIMissing       = "InferencePoolAPINotInstalled"
	ReasonSchedulerNotReady    = "SchedulerNotReady"
	ReasonSchedulerNoTemplate  = "SchedulerTemplateMissing"
	gatewayGroup               = "gateway.networking.k8s.io"
	inferencePoolKind          = "InferencePool"
	eppMetricsAuthDisabledFlag = "--metrics-endpoint-auth=false"
)

// routing is what reconcileRouter learns while reconciling, for the
// conditions and the status.
type routing struct {
	routes   []*gwapiv1.HTTPRoute
	gateways []client.ObjectKey // in order of first mention
	pool     *igwapiv1.InferencePool
	eppSvc   string
}

func (r *Reconciler) reconcileRouter(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec) (time.Duration, error) {
	st := &svc.Status
	st.Router, st.Addresses, st.URL = nil, nil, nil
	router := s.Router
	var errs []error
	rt := &routing{}

	managedScheduler := router != nil && router.Scheduler != nil && (router.Scheduler.Pool == nil || router.Scheduler.Pool.Ref == nil)
	if managedScheduler {
		errs = append(errs, r.reconcileScheduler(ctx, svc, s, rt))
	} else {
		errs = append(errs, r.removeScheduler(ctx, svc))
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
	return errors.Join(r.removeScheduler(ctx, svc), r.removeManagedRoute(ctx, svc))
}

// --- scheduler: InferencePool, endpoint picker and its RBAC ---

func (r *Reconciler) reconcileScheduler(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec, rt *routing) error {
	st := &svc.Status
	sch := s.Router.Scheduler
	if !r.apis.inferencePool {
		st.MarkFalse(v1alpha2.InferencePoolReady, ReasonPoolAPIMissing, "spec.router.scheduler needs the InferencePool CRD (inference.networking.k8s.io/v1), which is not installed in this cluster")
		return nil
	}
	if sch.Template == nil || len(sch.Template.Containers) == 0 {
		st.MarkFalse(v1alpha2.SchedulerWorkloadReady, ReasonSchedulerNoTemplate,
			"spec.router.scheduler has no pod template and the %s%s preset provides none", r.opts.PresetPrefix, presetScheduler)
		return nil
	}
	var errs []error
	pool := sch.Pool.Spec
	rt.eppSvc = string(pool.EndpointPickerRef.Name)
	eppLabels := withLabels(selectorLabels(svc), v1alpha2.LabelComponent, v1alpha2.ComponentScheduler)
	tmpl := sch.Template.DeepCopy()
	if tmpl.ServiceAccountName == eppSAName(svc) {
		errs = append(errs, r.reconcileEPPIdentity(ctx, svc, tmpl))
	}
	dep, err := r.desiredEPPDeployment(svc, sch, tmpl, eppLabels)
	if err != nil {
		st.MarkFalse(v1alpha2.SchedulerWorkloadReady, ReasonInvalidSchedulerConfig, "%v", err)
		return err
	}
	if err := ensure(ctx, r, svc, dep, syncDeployment); err != nil {
		st.MarkFalse(v1alpha2.SchedulerWorkloadReady, reconcileFailedReason(err), "%v", err)
		errs = append(errs, err)
	} else {
		errs = append(errs, r.observeEPP(ctx, svc, dep))
	}
	epp := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: rt.eppSvc, Namespace: svc.Namespace, Labels: eppLabels},
		Spec:       corev1.ServiceSpec{Selector: eppLabels, Ports: eppServicePorts(tmpl, pool)},
	}
	errs = append(errs, ensure(ctx, r, svc, epp, syncService))

	want := &igwapiv1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: poolName(svc), Namespace: svc.Namespace, Labels: selectorLabels(svc)},
		Spec:       *pool.DeepCopy(),
	}
	// A service the hub distributes asks for its pool to be exported to the
	// fleet (GIE multi-cluster proposal); the hub's export controller acts
	// on the pool's annotation.
	if v := svc.Annotations[fleetv1alpha1.ExportAnnotation]; v != "" {
		want.Annotations = map[string]string{fleetv1alpha1.ExportAnnotation: v}
	}
	if err := ensure(ctx, r, svc, want, func(cur, want *igwapiv1.InferencePool, stale bool) bool {
		if !stale && derivedEqual(want.Spec, cur.Spec) {
			return false
		}
		cur.Spec = want.Spec
		return true
	}); err != nil {
		st.MarkFalse(v1alpha2.InferencePoolReady, reconcileFailedReason(err), "%v", err)
		return errors.Join(append(errs, err)...)
	}
	rt.pool = &igwapiv1.InferencePool{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(want), rt.pool); err != nil {
		rt.pool = nil
		errs = append(errs, notObserved(svc, v1alpha2.InferencePoolReady, "InferencePool", want.Name, err))
	}
	return errors.Join(errs...)
}

// The API server lets the spoke create the endpoint picker's Role only if the
// spoke holds every permission in it (or may escalate, which would let it
// grant anything): it holds them, cluster-wide since services live in any
// namespace. Pods and events it holds already for its own work.
// +kubebuilder:rbac:groups=inference.networking.x-k8s.io,resources=inferencepools;inferenceobjectives;inferencemodelrewrites,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete

// reconcileEPPIdentity gives the endpoint picker its own service account with
// read access to the pods and pools of its namespace (and leases for leader
// election) and, when its metrics endpoint authenticates callers, the
// auth-delegator binding that lets it check their tokens.
func (r *Reconciler) reconcileEPPIdentity(ctx context.Context, svc *v1alpha2.LLMInferenceService, tmpl *corev1.PodSpec) error {
	labels := withLabels(selectorLabels(svc), v1alpha2.LabelComponent, v1alpha2.ComponentScheduler)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: eppSAName(svc), Namespace: svc.Namespace, Labels: labels}}
	read := []string{"get", "list", "watch"}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: eppRoleName(svc), Namespace: svc.Namespace, Labels: labels},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: read},
			{APIGroups: []string{"inference.networking.k8s.io", "inference.networking.x-k8s.io"}, Resources: []string{"inferencepools"}, Verbs: read},
			{APIGroups: []string{"inference.networking.x-k8s.io"}, Resources: []string{"inferenceobjectives", "inferencemodelrewrites"}, Verbs: read},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: eppBindingName(svc), Namespace: svc.Namespace, Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: svc.Namespace}},
	}
	errs := []error{
		ensure(ctx, r, svc, sa, func(*corev1.ServiceAccount, *corev1.ServiceAccount, bool) bool { return false }),
		ensure(ctx, r, svc, role, func(cur, want *rbacv1.Role, stale bool) bool {
			if !stale && derivedEqual(want.Rules, cur.Rules) {
				return false
			}
			cur.Rules = want.Rules
			return true
		}),
		ensure(ctx, r, svc, rb, func(cur, want *rbacv1.RoleBinding, stale bool) bool {
			if !stale && derivedEqual(want.Subjects, cur.Subjects) {
				return false
			}
			cur.Subjects = want.Subjects
			return true
		}),
	}
	if metricsAuthEnabled(tmpl) {
		errs = append(errs, ensure(ctx, r, svc, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: eppAuthBindingName(svc), Labels: withLabels(labels, ownerNamespaceLabel, svc.Namespace)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: svc.Namespace}},
		}, func(*rbacv1.ClusterRoleBinding, *rbacv1.ClusterRoleBinding, bool) bool { return false }))
	} else {
		errs = append(errs, r.removeClusterScoped(ctx, svc))
	}
	return errors.Join(errs...)
}

// metricsAuthEnabled reports whether the EPP authenticates /metrics callers
// (GIE's default), which needs TokenReview and SubjectAccessReview rights.
func metricsAuthEnabled(pod *corev1.PodSpec) bool {
	for _, c := range pod.Containers {
		if c.Name == mainContainer && slices.Contains(append(append([]string{}, c.Command...), c.Args...), eppMetricsAuthDisabledFlag) {
			return false
		}
	}
	return true
}

func (r *Reconciler) removeClusterScoped(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	return remove(ctx, r, svc, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: eppAuthBindingName(svc)}})
}

// desiredEPPDeployment is the endpoint picker: one active replica (Recreate,
// so two pickers never run against one pool without leader election), its
// EndpointPickerConfig passed as --config-text.
func (r *Reconciler) desiredEPPDeployment(svc *v1alpha2.LLMInferenceService, sch *v1alpha2.SchedulerSpec, pod *corev1.PodSpec, labels map[string]string) (*appsv1.Deployment, error) {
	replicas := ptr.Deref(sch.Replicas, 1)
	podLabels := withLabels(labels)
	for k, v := range sch.Labels {
		podLabels[k] = v
	}
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == mainContainer })
	if i < 0 {
		i = 0
	}
	c := &pod.Containers[i]
	args := append(append([]string{}, c.Command...), c.Args...)
	has := func(flag string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return a == flag || strings.HasPrefix(a, flag+"=") })
	}
	if sch.Config != nil && sch.Config.Inline != nil && !has("--config-text") && !has("--config-file") {
		text, err := schedulerConfigText(sch.Config.Inline)
		if err != nil {
			return nil, err
		}
		c.Args = append(c.Args, "--config-text", text)
	}
	if replicas > 1 && !has("--ha-enable-leader-election") {
		c.Args = append(c.Args, "--ha-enable-leader-election")
	}
	federate(svc, pod, c, has)
	// Templated flags that rendered to nothing ('{{ if ... }}') are dropped.
	c.Command = slices.DeleteFunc(c.Command, func(a string) bool { return strings.TrimSpace(a) == "" })
	c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.TrimSpace(a) == "" })
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: schedulerName(svc), Namespace: svc.Namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: sch.Annotations},
				Spec:       *pod,
			},
		},
	}, nil
}

// eppPortNames are the endpoint picker's ports the EPP Service exposes.
var eppPortNames = []string{"grpc", "grpc-health", "metrics", "zmq", fleetv1alpha1.FederationPortName}

func eppServicePorts(pod *corev1.PodSpec, pool *igwapiv1.InferencePoolSpec) []corev1.ServicePort {
	var ports []corev1.ServicePort
	for _, c := range pod.Containers {
		for _, p := range c.Ports {
			if slices.Contains(eppPortNames, p.Name) {
				ports = append(ports, corev1.ServicePort{Name: p.Name, Port: p.ContainerPort,
					TargetPort: intstr.FromInt32(p.ContainerPort), Protocol: corev1.ProtocolTCP})
			}
		}
	}
	if len(ports) == 0 {
		n := int32(9002)
		if pool.EndpointPickerRef.Port != nil {
			n = int32(pool.EndpointPickerRef.Port.Number)
		}
		ports = []corev1.ServicePort{{Name: "grpc", Port: n, TargetPort: intstr.FromInt32(n), Protocol: corev1.ProtocolTCP}}
	}
	return ports
}

func (r *Reconciler) observeEPP(ctx context.Context, svc *v1alpha2.LLMInferenceService, want *appsv1.Deployment) error {
	cur := &appsv1.Deployment{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(want), cur); err != nil {
		return notObserved(svc, v1alpha2.SchedulerWorkloadReady, "Deployment", want.Name, err)
	}
	svc.Status.Workloads.Scheduler = &v1alpha2.ObservedWorkloadStatus{
		TypedLocalObjectReference: corev1.TypedLocalObjectReference{APIGroup: ptr.To("apps"), Kind: "Deployment", Name: cur.Name},
		ReadyReplicas:             ptr.To(cur.Status.ReadyReplicas),
	}
	for _, c := range cur.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse {
			svc.Status.MarkFalse(v1alpha2.SchedulerWorkloadReady, c.Reason, "endpoint picker %s: %s", cur.Name, c.Message)
			return nil
		}
	}
	if cur.Status.AvailableReplicas > 0 {
		svc.Status.MarkTrue(v1alpha2.SchedulerWorkloadReady)
	} else {
		svc.Status.MarkFalse(v1alpha2.SchedulerWorkloadReady, ReasonSchedulerNotReady, "endpoint picker %s has no available replica yet", cur.Name)
	}
	return nil
}

func (r *Reconciler) removeScheduler(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	ns := svc.Namespace
	errs := []error{
		remove(ctx, r, svc, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: schedulerName(svc), Namespace: ns}}),
		remove(ctx, r, svc, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: eppServiceName(svc), Namespace: ns}}),
		remove(ctx, r, svc, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: eppSAName(svc), Namespace: ns}}),
		remove(ctx, r, svc, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: eppRoleName(svc), Namespace: ns}}),
		remove(ctx, r, svc, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: eppBindingName(svc), Namespace: ns}}),
		r.removeClusterScoped(ctx, svc),
	}
	if r.apis.inferencePool {
		errs = append(errs, remove(ctx, r, svc, &igwapiv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: poolName(svc), Namespace: ns}}))
	}
	return errors.Join(errs...)
}

func (r *Reconciler) observePoolRef(ctx context.Context, svc *v1alpha2.LLMInferenceService, name string, rt *routing) error {
	if !r.apis.inferencePool {
		svc.Status.MarkFalse(v1alpha2.InferencePoolReady, ReasonPoolAPIMissing, "spec.router.scheduler.pool.ref needs the InferencePool CRD, which is not installed")
		return nil
	}
	p := &igwapiv1.InferencePool{}
	err := r.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: name}, p)
	if apierrors.IsNotFound(err) {
		svc.Status.MarkFalse(v1alpha2.InferencePoolReady, ReasonPoolNotFound, "InferencePool %s/%s (spec.router.scheduler.pool.ref) does not exist", svc.Namespace, name)
		return nil
	}
	if err != nil {
		return err
	}
	rt.pool = p
	return nil
}

// --- routes ---

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
	if err := ensure(ctx, r, svc, want, func(cur, want *gwapiv1.HTTPRoute, stale bool) bool {
		if !stale && derivedEqual(want.Spec, cur.Spec) {
			return false
		}
		cur.Spec = want.Spec
		return true
	}); err != nil {
		st.MarkFalse(v1alpha2.HTTPRoutesReady, reconcileFailedReason(err), "%v", err)
		return err
	}
	cur := &gwapiv1.HTTPRoute{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(want), cur); err != nil {
		return notObserved(svc, v1alpha2.HTTPRoutesReady, "HTTPRoute", want.Name, err)
	}
	rt.addRoute(cur)
	return nil
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

// --- readiness ---

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

// poolReadiness: see the comment at the top of this file.
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

// --- status ---

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
