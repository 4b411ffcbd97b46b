package llmisvc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// workloadPart is one of the (up to two) workloads of a service: the main
// (decode) one and the prefill one.
type workloadPart struct {
	spec           *v1alpha2.WorkloadSpec // nil when absent
	deploymentName string
	lwsName        string
	component      string // app.kubernetes.io/component of a single-node pod
	leader, worker string // components of a multi-node group
	role           string // llm-d.ai/role
	singleCond     v1alpha2.ConditionType
	multiCond      v1alpha2.ConditionType
	tracingSuffix  string
}

func parts(svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec) []workloadPart {
	mainRole := v1alpha2.RoleBoth
	if s.Prefill != nil {
		mainRole = v1alpha2.RoleDecode
	}
	return []workloadPart{
		{spec: &s.WorkloadSpec, deploymentName: mainDeploymentName(svc), lwsName: mainLWSName(svc),
			component: v1alpha2.ComponentWorkload, leader: v1alpha2.ComponentLeader, worker: v1alpha2.ComponentWorker, role: mainRole,
			singleCond: v1alpha2.MainWorkloadReady, multiCond: v1alpha2.WorkerWorkloadReady},
		{spec: s.Prefill, deploymentName: prefillDeploymentName(svc), lwsName: prefillLWSName(svc),
			component: v1alpha2.ComponentWorkloadPrefill, leader: v1alpha2.ComponentLeaderPrefill, worker: v1alpha2.ComponentWorkerPrefill, role: v1alpha2.RolePrefill,
			singleCond: v1alpha2.PrefillWorkloadReady, multiCond: v1alpha2.PrefillWorkerWorkloadReady},
	}
}

// reconcileWorkload converges the Deployments and LeaderWorkerSets (each
// present or deleted according to the topology) and the workload Service,
// and records their readiness.
func (r *Reconciler) reconcileWorkload(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec) error {
	st := &svc.Status
	st.Workloads = &v1alpha2.WorkloadStatus{}
	var errs []error
	for i, p := range parts(svc, s) {
		multi := p.spec != nil && p.spec.Worker != nil
		single := p.spec != nil && !multi
		if err := r.reconcileLWS(ctx, svc, s, p, multi, i == 1); err != nil {
			errs = append(errs, err)
		}
		if err := r.reconcileDeployment(ctx, svc, s, p, single, i == 1); err != nil {
			errs = append(errs, err)
		}
	}
	if err := ensure(ctx, r, svc, r.desiredWorkloadService(svc), syncService); err != nil {
		// The Service fronts the main workload, which is not reachable
		// without it.
		st.MarkFalse(v1alpha2.MainWorkloadReady, reconcileFailedReason(err), "%v", err)
		errs = append(errs, err)
	} else {
		st.Workloads.Service = &corev1.TypedLocalObjectReference{Kind: "Service", Name: workloadServiceName(svc)}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) removeWorkload(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	var errs []error
	for _, p := range parts(svc, &svc.Spec) {
		errs = append(errs, remove(ctx, r, svc, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: p.deploymentName, Namespace: svc.Namespace}}))
		if r.apis.lws {
			errs = append(errs, remove(ctx, r, svc, &lwsv1.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: p.lwsName, Namespace: svc.Namespace}}))
		}
		svc.Status.MarkFalse(p.singleCond, "Stopped", "Service is stopped")
		svc.Status.ClearCondition(p.multiCond)
	}
	errs = append(errs, remove(ctx, r, svc, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: workloadServiceName(svc), Namespace: svc.Namespace}}))
	return errors.Join(errs...)
}

func (r *Reconciler) reconcileDeployment(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec, p workloadPart, wanted, prefill bool) error {
	key := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: p.deploymentName, Namespace: svc.Namespace}}
	if !wanted {
		svc.Status.ClearCondition(p.singleCond)
		return remove(ctx, r, svc, key)
	}
	labels := withLabels(selectorLabels(svc), v1alpha2.LabelComponent, p.component, v1alpha2.LabelKServe, v1alpha2.KServeWorkload, v1alpha2.LabelRole, p.role)
	want := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: p.deploymentName, Namespace: svc.Namespace, Labels: propagatedLabels(svc, labels),
			Annotations: propagatedAnnotations(svc, nil)},
		Spec: appsv1.DeploymentSpec{
			Replicas: p.spec.Replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: r.podTemplate(svc, s, p.spec, p.spec.Template, labels),
		},
	}
	cur, err := ensureObserved(ctx, r, svc, want, syncDeployment)
	if err != nil {
		svc.Status.MarkFalse(p.singleCond, reconcileFailedReason(err), "%v", err)
		return err
	}
	observe := &v1alpha2.ObservedWorkloadStatus{
		TypedLocalObjectReference: corev1.TypedLocalObjectReference{APIGroup: ptr.To("apps"), Kind: "Deployment", Name: cur.Name},
		ReadyReplicas:             ptr.To(cur.Status.ReadyReplicas),
	}
	if prefill {
		svc.Status.Workloads.Prefill = observe
	} else {
		svc.Status.Workloads.Primary = observe
	}
	deploymentReadiness(&svc.Status.Status, p.singleCond, cur)
	return nil
}

// deploymentReadiness follows the Deployment's own conditions: Available
// means ready, Progressing=False (for example a deadline exceeded) means
// failed. A rollout of a new pod template is not ready until it has
// replaced every old pod, as kubectl rollout status judges it: the old pods
// keep the Deployment Available, but the service does not run its current
// spec, which is what the hub's health gates ask.
func deploymentReadiness(st *v1alpha2.Status, t v1alpha2.ConditionType, d *appsv1.Deployment) {
	if d.Status.ObservedGeneration < d.Generation {
		st.MarkFalse(t, "RolloutPending", "Deployment %s: the controller has not observed generation %d yet", d.Name, d.Generation)
		return
	}
	var available *appsv1.DeploymentCondition
	for i, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse {
			st.MarkFalse(t, c.Reason, "Deployment %s: %s", d.Name, c.Message)
			return
		}
		if c.Type == appsv1.DeploymentAvailable {
			available = &d.Status.Conditions[i]
		}
	}
	if want := ptr.Deref(d.Spec.Replicas, 1); d.Status.UpdatedReplicas < want || d.Status.Replicas > d.Status.UpdatedReplicas {
		st.MarkFalse(t, "RolloutInProgress", "Deployment %s: rolling out its current pod template: %d of %d replicas updated, %d old ones still running",
			d.Name, d.Status.UpdatedReplicas, want, max(d.Status.Replicas-d.Status.UpdatedReplicas, 0))
		return
	}
	switch {
	case available == nil:
		st.MarkFalse(t, "DeploymentNotReady", "Deployment %s has no Available condition yet", d.Name)
	case available.Status == corev1.ConditionTrue:
		st.MarkTrue(t)
	default:
		st.MarkFalse(t, available.Reason, "Deployment %s: %s (%d/%d replicas ready)", d.Name, available.Message,
			d.Status.ReadyReplicas, ptr.Deref(d.Spec.Replicas, 1))
	}
}

func (r *Reconciler) reconcileLWS(ctx context.Context, svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec, p workloadPart, wanted, prefill bool) error {
	if !r.apis.lws {
		if wanted {
			svc.Status.MarkFalse(p.multiCond, "LeaderWorkerSetNotInstalled",
				"spec%s.worker asks for a multi-node workload, but the LeaderWorkerSet CRD (leaderworkerset.x-k8s.io) is not installed in this cluster", map[bool]string{true: ".prefill"}[prefill])
		} else {
			svc.Status.ClearCondition(p.multiCond)
		}
		return nil
	}
	key := &lwsv1.LeaderWorkerSet{ObjectMeta: metav1.ObjectMeta{Name: p.lwsName, Namespace: svc.Namespace}}
	if !wanted {
		svc.Status.ClearCondition(p.multiCond)
		return remove(ctx, r, svc, key)
	}
	base := withLabels(selectorLabels(svc), v1alpha2.LabelKServe, v1alpha2.KServeWorkload, v1alpha2.LabelRole, p.role)
	leaderLabels := withLabels(base, v1alpha2.LabelComponent, p.leader)
	workerLabels := withLabels(base, v1alpha2.LabelComponent, p.worker)
	if p.spec.Template != nil {
		// Behind a leader, workers serve no API (vLLM's headless ranks):
		// as in KServe, they stay out of the workload Service and the pool.
		workerLabels = withLabels(selectorLabels(svc), v1alpha2.LabelComponent, p.worker)
	}
	size := p.spec.Parallelism.GroupSize()
	want := &lwsv1.LeaderWorkerSet{
		ObjectMeta: metav1.ObjectMeta{Name: p.lwsName, Namespace: svc.Namespace,
			Labels: propagatedLabels(svc, base), Annotations: propagatedAnnotations(svc, nil)},
		Spec: lwsv1.LeaderWorkerSetSpec{
			Replicas:      p.spec.Replicas,
			StartupPolicy: lwsv1.LeaderCreatedStartupPolicy,
			LeaderWorkerTemplate: lwsv1.LeaderWorkerTemplate{
				Size:           ptr.To(size),
				RestartPolicy:  lwsv1.RecreateGroupOnPodRestart,
				WorkerTemplate: r.podTemplate(svc, s, p.spec, p.spec.Worker, workerLabels),
			},
			RolloutStrategy: lwsv1.RolloutStrategy{Type: lwsv1.RollingUpdateStrategyType},
		},
	}
	if p.spec.Template != nil {
		lt := r.podTemplate(svc, s, p.spec, p.spec.Template, leaderLabels)
		want.Spec.LeaderWorkerTemplate.LeaderTemplate = &lt
	}
	if prefill && p.spec.Parallelism != nil && p.spec.Parallelism.Data != nil {
		want.Spec.LeaderWorkerTemplate.SubGroupPolicy = &lwsv1.SubGroupPolicy{SubGroupSize: ptr.To(size)}
	}
	cur, err := ensureObserved(ctx, r, svc, want, syncLWS)
	if err != nil {
		svc.Status.MarkFalse(p.multiCond, reconcileFailedReason(err), "%v", err)
		return err
	}
	observe := &v1alpha2.ObservedWorkloadStatus{
		TypedLocalObjectReference: corev1.TypedLocalObjectReference{APIGroup: ptr.To(lwsv1.GroupVersion.Group), Kind: "LeaderWorkerSet", Name: cur.Name},
		ReadyReplicas:             ptr.To(cur.Status.ReadyReplicas),
	}
	if prefill {
		svc.Status.Workloads.Prefill = observe
	} else {
		svc.Status.Workloads.Primary = observe
	}
	c := meta.FindStatusCondition(cur.Status.Conditions, string(lwsv1.LeaderWorkerSetAvailable))
	if c == nil || c.Status != metav1.ConditionTrue {
		reason, msg := "LeaderWorkerSetNotReady", fmt.Sprintf("LeaderWorkerSet %s: %d/%d groups ready", cur.Name, cur.Status.ReadyReplicas, ptr.Deref(cur.Spec.Replicas, 1))
		if c != nil {
			reason, msg = c.Reason, fmt.Sprintf("LeaderWorkerSet %s: %s", cur.Name, c.Message)
		}
		svc.Status.MarkFalse(p.multiCond, reason, "%s", msg)
		return nil
	}
	ready, err := r.groupsWithReadyWorkers(ctx, cur)
	if err != nil {
		return notObserved(svc, p.multiCond, "LeaderWorkerSet", cur.Name, err)
	}
	if want := ptr.Deref(cur.Spec.Replicas, 1); size > 1 && ready < want {
		svc.Status.MarkFalse(p.multiCond, "WorkersNotReady", "LeaderWorkerSet %s: %d/%d groups have every worker ready", cur.Name, ready, want)
		return nil
	}
	svc.Status.MarkTrue(p.multiCond)
	return nil
}

// groupsWithReadyWorkers counts the groups of a LeaderWorkerSet whose worker
// StatefulSet has all its pods ready. LWS v0.8.0 counts a group as ready
// once its leader is ready and its workers merely exist (its
// StatefulsetReady compares created replicas, not ready ones), so its
// Available condition alone would call a service ready whose workers are
// still Pending, and vLLM's leader serves nothing until its ranks are up.
func (r *Reconciler) groupsWithReadyWorkers(ctx context.Context, lws *lwsv1.LeaderWorkerSet) (int32, error) {
	var list appsv1.StatefulSetList
	if err := r.List(ctx, &list, client.InNamespace(lws.Namespace), client.MatchingLabels{lwsv1.SetNameLabelKey: lws.Name}); err != nil {
		return 0, err
	}
	var ready int32
	for _, sts := range list.Items {
		if _, worker := sts.Labels[lwsv1.GroupIndexLabelKey]; worker && sts.Status.ReadyReplicas >= ptr.Deref(sts.Spec.Replicas, 1) {
			ready++
		}
	}
	return ready, nil
}

// podTemplate builds a workload pod: the composed pod spec with the model
// mounted, the service's pod labels and annotations, and propagated
// metadata.
func (r *Reconciler) podTemplate(svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec, w *v1alpha2.WorkloadSpec, pod *corev1.PodSpec, labels map[string]string) corev1.PodTemplateSpec {
	t := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: propagatedLabels(svc, labels)}}
	for k, v := range w.Labels {
		t.Labels[k] = v
	}
	t.Annotations = propagatedAnnotations(svc, nil)
	for k, v := range w.Annotations {
		if k != ModelRoutingAnnotation {
			if t.Annotations == nil {
				t.Annotations = map[string]string{}
			}
			t.Annotations[k] = v
		}
	}
	if pod != nil {
		t.Spec = *pod.DeepCopy()
		attachModel(&t.Spec, s)
	}
	return t
}

// Metadata prefixes copied from the service to its workloads, as KServe
// does: CNI network selection, Kueue, Prometheus scraping.
var (
	propagatedAnnotationPrefixes = []string{"k8s.v1.cni.cncf.io", "kueue.x-k8s.io", "prometheus.io"}
	propagatedLabelPrefixes      = []string{"kueue.x-k8s.io"}
)

func propagatedLabels(svc *v1alpha2.LLMInferenceService, base map[string]string) map[string]string {
	return withPrefixed(base, svc.Labels, propagatedLabelPrefixes)
}

func propagatedAnnotations(svc *v1alpha2.LLMInferenceService, base map[string]string) map[string]string {
	return withPrefixed(base, svc.Annotations, propagatedAnnotationPrefixes)
}

func withPrefixed(base, from map[string]string, prefixes []string) map[string]string {
	out := withLabels(base)
	for k, v := range from {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				out[k] = v
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (r *Reconciler) desiredWorkloadService(svc *v1alpha2.LLMInferenceService) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: workloadServiceName(svc), Namespace: svc.Namespace,
			Labels: withLabels(selectorLabels(svc), v1alpha2.LabelComponent, v1alpha2.ComponentWorkload)},
		Spec: corev1.ServiceSpec{
			Selector: workloadSelector(svc),
			Ports: []corev1.ServicePort{{Name: "http", Port: 8000, TargetPort: intstr.FromInt32(8000),
				Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("http")}},
		},
	}
}

func syncDeployment(cur, want *appsv1.Deployment, stale bool) bool {
	return syncReplicated(&cur.Spec, &want.Spec, &cur.Spec.Replicas, &want.Spec.Replicas, stale)
}

func syncLWS(cur, want *lwsv1.LeaderWorkerSet, stale bool) bool {
	return syncReplicated(&cur.Spec, &want.Spec, &cur.Spec.Replicas, &want.Spec.Replicas, stale)
}

// syncReplicated replaces a workload spec that differs, keeping the current
// replicas when the service leaves them unset: then they belong to whoever
// scales the workload.
func syncReplicated[S any](cur, want *S, curReplicas, wantReplicas **int32, stale bool) bool {
	if *wantReplicas == nil {
		*wantReplicas = *curReplicas
	}
	if !stale && derivedEqual(*want, *cur) {
		return false
	}
	*cur = *want
	return true
}

// syncService updates the fields the controller owns; the cluster IP and
// other allocated fields stay.
func syncService(cur, want *corev1.Service, stale bool) bool {
	if !stale && derivedEqual(want.Spec.Selector, cur.Spec.Selector) && derivedEqual(want.Spec.Ports, cur.Spec.Ports) && derivedEqual(want.Spec.Type, cur.Spec.Type) {
		return false
	}
	cur.Spec.Selector, cur.Spec.Ports = want.Spec.Selector, want.Spec.Ports
	if want.Spec.Type != "" {
		cur.Spec.Type = want.Spec.Type
	}
	return true
}

// reconcileFailedReason names a failure to create or update a child.
func reconcileFailedReason(err error) string {
	var notOwned *NotOwnedError
	if errors.As(err, &notOwned) {
		return "NotOwned"
	}
	return "ReconcileError"
}
