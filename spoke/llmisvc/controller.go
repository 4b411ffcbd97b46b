// Package llmisvc reconciles a KServe LLMInferenceService on a spoke into
// its model-server workloads (Deployment or LeaderWorkerSet, prefill
// included), the workload Service, and the router: InferencePool, endpoint
// picker (Deployment, Service, RBAC) and HTTPRoute. Names, labels,
// conditions and config composition follow KServe v0.20.0. On a copy the
// fleetinfer hub placed with federation on, it also federates the endpoint
// picker and reports where other clusters reach it (status.federation).
package llmisvc

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/statuspatch"
)

// Options configure the reconciler; the spoke's flags set them.
type Options struct {
	// SystemNamespace holds the well-known presets and is the fallback for
	// config lookups.
	SystemNamespace string
	// PresetPrefix prefixes the well-known preset names ("kserve-").
	PresetPrefix string
	// Global is passed to preset templates; its gateway is the default one
	// for `router.gateway: {}`.
	Global GlobalConfig
	// FederationAddress is which address of a federated picker the copy
	// reports for other clusters; empty means LoadBalancer.
	FederationAddress FederationAddress
	// RenderLimits bound each service's rendering; zero means
	// DefaultRenderLimits.
	RenderLimits RenderLimits
	// Workers is how many services are reconciled at once; zero means
	// DefaultWorkers.
	Workers int
	// StallAfter is how long one reconcile may run before the liveness
	// check fails; zero means DefaultStallAfter.
	StallAfter time.Duration
}

// Defaults of Options.
const (
	DefaultWorkers    = 4
	DefaultStallAfter = 2 * time.Minute
)

// Reconciler reconciles LLMInferenceServices.
type Reconciler struct {
	client.Client
	opts     Options
	recorder record.EventRecorder
	// optional APIs (LeaderWorkerSet, InferencePool, Gateway API) found in
	// the cluster at start-up.
	apis availableAPIs
	// pickers holds the endpoint pickers' pods (see watchPickers); nil
	// unless federation addresses are pod IPs.
	pickers client.Reader
	// inFlight tracks running reconciles for the liveness check.
	inFlight *inFlight
}

// NewReconciler builds a reconciler.
func NewReconciler(c client.Client, recorder record.EventRecorder, opts Options) *Reconciler {
	if opts.FederationAddress == "" {
		opts.FederationAddress = FederationAddressLoadBalancer
	}
	if opts.RenderLimits == (RenderLimits{}) {
		opts.RenderLimits = DefaultRenderLimits
	}
	if opts.Workers <= 0 {
		opts.Workers = DefaultWorkers
	}
	if opts.StallAfter <= 0 {
		opts.StallAfter = DefaultStallAfter
	}
	return &Reconciler{Client: c, opts: opts, recorder: recorder, inFlight: newInFlight(opts.StallAfter)}
}

// Event reasons on Ready edges, as in KServe.
const (
	EventReady    = "LLMInferenceServiceReady"
	EventNotReady = "LLMInferenceServiceNotReady"
)

// Services are created only as dry runs (the composed spec is validated by
// the API server, see validateRendered) and otherwise read and updated
// (finalizer, status). Configs are only read; installing the well-known
// presets is spoke/presets' (and its own RBAC's) job.
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceserviceconfigs,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=leaderworkerset.x-k8s.io,resources=leaderworkersets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings;clusterrolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames="system:auth-delegator"
// +kubebuilder:rbac:groups=inference.networking.k8s.io,resources=inferencepools,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gateways,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Reconcile brings one service's children in line with its spec and writes
// its status once, at the end.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	defer r.inFlight.start()()
	svc := &v1alpha2.LLMInferenceService{}
	if err := r.Get(ctx, req.NamespacedName, svc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !svc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, svc)
	}
	before := svc.Status.DeepCopy()
	result, recErr := r.reconcile(ctx, svc)
	svc.Status.ObservedGeneration = svc.Generation
	if err := r.updateStatus(ctx, svc, before); err != nil {
		return ctrl.Result{}, errors.Join(recErr, err)
	}
	r.emitReadyEdge(svc, before)
	var cfgErr *configError
	switch {
	case errors.As(recErr, &cfgErr):
		r.recorder.Eventf(svc, corev1.EventTypeWarning, cfgErr.reason, "%v", recErr)
	case recErr != nil:
		r.recorder.Eventf(svc, corev1.EventTypeWarning, "ReconcileError", "%v", recErr)
	}
	if cfgErr != nil && cfgErr.terminal {
		// Waits for a change to the service or a config it uses.
		return result, nil
	}
	return result, recErr
}

// reconcile composes the spec, then reconciles workloads and router, and
// rolls the sub-conditions up into WorkloadsReady, RouterReady and Ready.
func (r *Reconciler) reconcile(ctx context.Context, svc *v1alpha2.LLMInferenceService) (ctrl.Result, error) {
	st := &svc.Status.Status
	if !federates(svc) {
		svc.Status.Federation = nil
	}
	if svc.Stopped() {
		err := r.teardown(ctx, svc)
		svc.Status.Workloads, svc.Status.Router, svc.Status.Addresses, svc.Status.URL = nil, nil, nil, nil
		for _, t := range []v1alpha2.ConditionType{v1alpha2.PresetsCombined, v1alpha2.WorkloadsReady, v1alpha2.RouterReady} {
			st.MarkFalse(t, "Stopped", "Service is stopped (annotation %s=true)", v1alpha2.StopAnnotation)
		}
		st.Aggregate(v1alpha2.Ready, v1alpha2.ReadyDependents)
		return ctrl.Result{}, err
	}

	c, err := r.compose(ctx, svc)
	if err != nil {
		var cfgErr *configError
		reason := ReasonCombineError
		if errors.As(err, &cfgErr) {
			reason = cfgErr.reason
		}
		st.MarkFalse(v1alpha2.PresetsCombined, reason, "%v", err)
		svc.Status.AppliedConfigRefs = nil
		st.Aggregate(v1alpha2.Ready, v1alpha2.ReadyDependents)
		return ctrl.Result{}, err
	}
	st.MarkTrue(v1alpha2.PresetsCombined)
	svc.Status.AppliedConfigRefs = c.applied
	r.reportFieldsNotActedOn(svc, &c.spec)

	var errs []error
	if err := r.reconcileWorkload(ctx, svc, &c.spec); err != nil {
		errs = append(errs, fmt.Errorf("workload: %w", err))
	}
	requeue, err := r.reconcileRouter(ctx, svc, &c.spec)
	if err != nil {
		errs = append(errs, fmt.Errorf("router: %w", err))
	}
	st.Aggregate(v1alpha2.WorkloadsReady, v1alpha2.WorkloadSubConditions)
	st.Aggregate(v1alpha2.RouterReady, v1alpha2.RouterSubConditions)
	st.Aggregate(v1alpha2.Ready, v1alpha2.ReadyDependents)
	return ctrl.Result{RequeueAfter: requeue}, errors.Join(errs...)
}

// teardown removes every workload and router child, for the stop annotation.
func (r *Reconciler) teardown(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	return errors.Join(r.removeWorkload(ctx, svc), r.removeRouter(ctx, svc))
}

// finalize removes the cluster-scoped children (which owner references
// cannot clean up), which releases the finalizer; the API server's garbage
// collector removes the rest.
func (r *Reconciler) finalize(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	if !controllerutil.ContainsFinalizer(svc, Finalizer) {
		return nil
	}
	return r.removeClusterScoped(ctx, svc, svc)
}

// setFinalizer puts the finalizer on svc (hold) or takes it off. A service
// holds it only while it has a cluster-scoped child, so that deleting a
// service, or its namespace, never waits on this controller otherwise (an
// uninstalled controller wedges nothing but those). The update goes from a
// copy: the reconcile's status in progress stays as it is.
func (r *Reconciler) setFinalizer(ctx context.Context, svc *v1alpha2.LLMInferenceService, hold bool) error {
	cp := svc.DeepCopy()
	changed := controllerutil.RemoveFinalizer(cp, Finalizer)
	if hold {
		changed = controllerutil.AddFinalizer(cp, Finalizer)
	}
	if !changed {
		return nil
	}
	if err := r.Update(ctx, cp); err != nil {
		if !hold {
			return client.IgnoreNotFound(err)
		}
		return err
	}
	svc.Finalizers, svc.ResourceVersion = cp.Finalizers, cp.ResourceVersion
	return nil
}

// updateStatus writes the status if it changed (statuspatch: a merge patch,
// since the spec may be large).
func (r *Reconciler) updateStatus(ctx context.Context, svc *v1alpha2.LLMInferenceService, before *v1alpha2.LLMInferenceServiceStatus) error {
	if equality.Semantic.DeepEqual(before, &svc.Status) {
		return nil
	}
	want := svc.Status.DeepCopy()
	err := statuspatch.Write(ctx, r.Client, svc, func(cur *v1alpha2.LLMInferenceService) { cur.Status = *want })
	if err != nil && !apierrors.IsConflict(err) {
		r.recorder.Eventf(svc, corev1.EventTypeWarning, "UpdateFailed", "Failed to update status: %v", err)
	}
	return err
}

// emitReadyEdge records an Event when Ready turns True or stops being True.
func (r *Reconciler) emitReadyEdge(svc *v1alpha2.LLMInferenceService, before *v1alpha2.LLMInferenceServiceStatus) {
	was, is := before.IsTrue(v1alpha2.Ready), svc.Status.IsTrue(v1alpha2.Ready)
	switch {
	case is && !was:
		r.recorder.Event(svc, corev1.EventTypeNormal, EventReady, "LLMInferenceService is ready")
	case was && !is:
		var failing []string
		for _, c := range svc.Status.Conditions {
			if c.Status == corev1.ConditionFalse && c.Severity != v1alpha2.ConditionSeverityInfo {
				failing = append(failing, string(c.Type))
			}
		}
		sort.Strings(failing)
		r.recorder.Eventf(svc, corev1.EventTypeWarning, EventNotReady, "LLMInferenceService is not ready; False conditions: %s", strings.Join(failing, ", "))
	}
}

// reportFieldsNotActedOn names the accepted fields this controller keeps but
// does not implement, so a KServe user sees what is ignored instead of
// finding out in production.
func (r *Reconciler) reportFieldsNotActedOn(svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec) {
	var fields []string
	add := func(cond bool, name string) {
		if cond {
			fields = append(fields, name)
		}
	}
	for _, w := range []struct {
		path string
		spec *v1alpha2.WorkloadSpec
	}{{"spec", &s.WorkloadSpec}, {"spec.prefill", s.Prefill}} {
		if w.spec == nil {
			continue
		}
		add(w.spec.Scaling != nil, w.path+".scaling")
		add(w.spec.KVCacheOffloading != nil, w.path+".kvCacheOffloading")
	}
	add(s.Tracing != nil, "spec.tracing")
	add(s.Model.Confidential != nil, "spec.model.confidential")
	if s.Router != nil {
		add(s.Router.Ingress != nil, "spec.router.ingress")
		if s.Router.Route != nil {
			add(s.Router.Route.Group != nil || s.Router.Route.Weight != nil, "spec.router.route.group/weight")
		}
	}
	for k := range svc.Annotations {
		add(strings.HasPrefix(k, "serving.kserve.io/exp-dra-"), "metadata.annotations["+k+"]")
	}
	sort.Strings(fields)
	if len(fields) == 0 {
		svc.Status.ClearCondition(v1alpha2.FieldsNotActedOn)
		return
	}
	svc.Status.SetCondition(v1alpha2.Condition{
		Type: v1alpha2.FieldsNotActedOn, Status: corev1.ConditionTrue, Severity: v1alpha2.ConditionSeverityInfo,
		Reason:  "NotImplemented",
		Message: "Accepted and kept, but fleetinfer does not act on: " + strings.Join(fields, ", "),
	})
}

// requeueWhileWaiting re-checks objects whose readiness the controller
// cannot watch (Gateways it does not own, in clusters without the CRD).
const requeueWhileWaiting = 10 * time.Second
