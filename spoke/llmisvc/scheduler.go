package llmisvc

import (
	"context"
	"errors"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// The scheduler of a service: its InferencePool, and the endpoint picker
// (Deployment, Service, service account and RBAC) that picks for it.

// Reasons of the InferencePoolReady and SchedulerWorkloadReady conditions.
const (
	ReasonPoolNotFound        = "InferencePoolNotFound"
	ReasonPoolAPIMissing      = "InferencePoolAPINotInstalled"
	ReasonSchedulerNotReady   = "SchedulerNotReady"
	ReasonSchedulerNoTemplate = "SchedulerTemplateMissing"
)

// eppMetricsAuthDisabledFlag turns off the endpoint picker's authentication
// of /metrics callers.
const eppMetricsAuthDisabledFlag = "--metrics-endpoint-auth=false"

// reconcileScheduler reconciles the pool and picker of svc's scheduler, as
// children of owner: svc itself, or the InferencePoolImport whose picker
// the import controller runs under svc's names (import.go).
func (r *Reconciler) reconcileScheduler(ctx context.Context, svc *v1alpha2.LLMInferenceService, owner client.Object, s *v1alpha2.LLMInferenceServiceSpec, rt *routing) error {
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
	eppLabels := pickerLabels(svc)
	tmpl := sch.Template.DeepCopy()
	if tmpl.ServiceAccountName == eppSAName(svc) {
		errs = append(errs, r.reconcileEPPIdentity(ctx, svc, owner, tmpl))
	}
	dep, err := r.desiredEPPDeployment(svc, sch, tmpl, eppLabels)
	if err != nil {
		st.MarkFalse(v1alpha2.SchedulerWorkloadReady, ReasonInvalidSchedulerConfig, "%v", err)
		return err
	}
	if cur, err := ensureObserved(ctx, r, owner, dep, syncDeployment); err != nil {
		st.MarkFalse(v1alpha2.SchedulerWorkloadReady, reconcileFailedReason(err), "%v", err)
		errs = append(errs, err)
	} else {
		observeEPP(svc, cur)
	}
	epp := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: rt.eppSvc, Namespace: svc.Namespace, Labels: eppLabels},
		Spec:       corev1.ServiceSpec{Selector: eppLabels, Ports: eppServicePorts(tmpl, pool)},
	}
	errs = append(errs, ensure(ctx, r, owner, epp, syncService))
	if owner == client.Object(svc) {
		// Only a copy's picker serves other clusters; an import's only
		// subscribes (import.go).
		errs = append(errs, r.reconcileFederationService(ctx, svc, tmpl))
	}

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
	cur, err := ensureObserved(ctx, r, owner, want, func(cur, want *igwapiv1.InferencePool, stale bool) bool {
		if !stale && derivedEqual(want.Spec, cur.Spec) {
			return false
		}
		cur.Spec = want.Spec
		return true
	})
	if err != nil {
		st.MarkFalse(v1alpha2.InferencePoolReady, reconcileFailedReason(err), "%v", err)
		return errors.Join(append(errs, err)...)
	}
	rt.pool = cur
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
func (r *Reconciler) reconcileEPPIdentity(ctx context.Context, svc *v1alpha2.LLMInferenceService, owner client.Object, tmpl *corev1.PodSpec) error {
	labels := pickerLabels(svc)
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
		ensure(ctx, r, owner, sa, func(*corev1.ServiceAccount, *corev1.ServiceAccount, bool) bool { return false }),
		ensure(ctx, r, owner, role, func(cur, want *rbacv1.Role, stale bool) bool {
			if !stale && derivedEqual(want.Rules, cur.Rules) {
				return false
			}
			cur.Rules = want.Rules
			return true
		}),
		ensure(ctx, r, owner, rb, func(cur, want *rbacv1.RoleBinding, stale bool) bool {
			if !stale && derivedEqual(want.Subjects, cur.Subjects) {
				return false
			}
			cur.Subjects = want.Subjects
			return true
		}),
	}
	if metricsAuthEnabled(tmpl) {
		if owner == client.Object(svc) {
			if err := r.setFinalizer(ctx, svc, true); err != nil {
				return errors.Join(append(errs, err)...)
			}
		}
		errs = append(errs, ensure(ctx, r, owner, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: eppAuthBindingName(svc), Labels: withLabels(labels, ownerNamespaceLabel, svc.Namespace)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: svc.Namespace}},
		}, func(*rbacv1.ClusterRoleBinding, *rbacv1.ClusterRoleBinding, bool) bool { return false }))
	} else {
		errs = append(errs, r.removeClusterScoped(ctx, svc, owner))
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

// removeClusterScoped removes the cluster-scoped children of owner; a
// service then needs its finalizer no more.
func (r *Reconciler) removeClusterScoped(ctx context.Context, svc *v1alpha2.LLMInferenceService, owner client.Object) error {
	if err := remove(ctx, r, owner, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: eppAuthBindingName(svc)}}); err != nil {
		return err
	}
	if owner != client.Object(svc) {
		return nil
	}
	return r.setFinalizer(ctx, svc, false)
}

// desiredEPPDeployment is the endpoint picker, its EndpointPickerConfig
// passed as --config-text, rolled by pickerRollout.
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
			Strategy: pickerRollout(replicas),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: sch.Annotations},
				Spec:       *pod,
			},
		},
	}, nil
}

// pickerRollout replaces the endpoint picker without a gap in routing where
// it can. A single picker (no leader election) is surged: the new one runs
// next to the old until it is Ready (its datastore synced, its gRPC health
// serving), and only then does the old one go, so the gateway always has a
// Ready picker. For that moment two pickers pick for the pool, each from its
// own view, which GIE's pickers without leader election are built for; they
// share the service account and the federation certificate Secret, and the
// federation Service sends a peer's subscription to either, so peers
// resubscribe (within the reconnect backoff) when the old one goes, and keep
// the last view they had meanwhile.
//
// With leader election (replicas > 1) only the leader reports Ready, so the
// Deployment counts one available pod whatever it runs, and a new pod cannot
// turn Ready while the old leader holds the lease: every old pod may go at
// once (maxUnavailable 100%), the old leader releases the lease as it stops,
// and a new pod takes it within the lease's retry period. That handover is
// the gap left; Recreate would add the old pods' whole termination to it.
func pickerRollout(replicas int32) appsv1.DeploymentStrategy {
	surge, unavailable := intstr.FromInt32(1), intstr.FromInt32(0)
	if replicas > 1 {
		unavailable = intstr.FromString("100%")
	}
	return appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType,
		RollingUpdate: &appsv1.RollingUpdateDeployment{MaxSurge: &surge, MaxUnavailable: &unavailable}}
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

func observeEPP(svc *v1alpha2.LLMInferenceService, cur *appsv1.Deployment) {
	svc.Status.Workloads.Scheduler = &v1alpha2.ObservedWorkloadStatus{
		TypedLocalObjectReference: corev1.TypedLocalObjectReference{APIGroup: ptr.To("apps"), Kind: "Deployment", Name: cur.Name},
		ReadyReplicas:             ptr.To(cur.Status.ReadyReplicas),
	}
	for _, c := range cur.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse {
			svc.Status.MarkFalse(v1alpha2.SchedulerWorkloadReady, c.Reason, "endpoint picker %s: %s", cur.Name, c.Message)
			return
		}
	}
	if cur.Status.AvailableReplicas > 0 {
		svc.Status.MarkTrue(v1alpha2.SchedulerWorkloadReady)
	} else {
		svc.Status.MarkFalse(v1alpha2.SchedulerWorkloadReady, ReasonSchedulerNotReady, "endpoint picker %s has no available replica yet", cur.Name)
	}
}

func (r *Reconciler) removeScheduler(ctx context.Context, svc *v1alpha2.LLMInferenceService, owner client.Object) error {
	ns := svc.Namespace
	errs := []error{
		remove(ctx, r, owner, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: schedulerName(svc), Namespace: ns}}),
		remove(ctx, r, owner, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: eppServiceName(svc), Namespace: ns}}),
		remove(ctx, r, owner, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: eppSAName(svc), Namespace: ns}}),
		remove(ctx, r, owner, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: eppRoleName(svc), Namespace: ns}}),
		remove(ctx, r, owner, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: eppBindingName(svc), Namespace: ns}}),
		r.removeClusterScoped(ctx, svc, owner),
	}
	if owner == client.Object(svc) {
		errs = append(errs, r.removeFederationService(ctx, svc))
	}
	if r.apis.inferencePool {
		errs = append(errs, remove(ctx, r, owner, &igwapiv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: poolName(svc), Namespace: ns}}))
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
