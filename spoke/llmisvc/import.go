package llmisvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// The import controller of GIE's multi-cluster proposal, for a cluster that
// runs none of an exported pool's pods. When an HTTPRoute here names an
// InferencePoolImport as its backend, the controller routes it: it runs an
// endpoint picker for the import, federated as a subscriber with the
// pickers of the exporting clusters, behind an InferencePool of the
// import's name whose selector matches no pod. That picker sees the
// exporting clusters' pods and sends each request, in Parent mode, to the
// gateway of the cluster whose pod it chose. The picker and pool are the
// ones a copy of the service would have (scheduler.go, federation.go),
// built from the scheduler preset under the service's names and owned by
// the import, so they go with it.
//
// The hub learns of the importer from the controller's status entry on the
// import (fleetv1alpha1.ImportControllerName); it labels the import with the
// service and publishes the picker's peer directory and certificate next to
// it. Until it has, the import is not routed (FederationPending).

// ImportConditionAccepted is the condition GIE's proposal gives an import
// controller's entry: True when the import is routed.
const ImportConditionAccepted = "Accepted"

// Reasons of the import controller's Accepted condition.
const (
	ReasonImportRouted           = "Accepted"
	ReasonNoExportingClusters    = "NoExportingClusters"
	ReasonFederationPending      = "FederationPending"
	ReasonImportPickerNotReady   = "PickerNotReady"
	ReasonServedByLocalPool      = "ServedByLocalPool"
	ReasonImportSchedulerInvalid = "SchedulerPresetInvalid"
)

// ImportPoolLabel is the selector of the pool the import controller
// creates: no pod carries it, so the pool has no local endpoints and its
// picker picks among the exporting clusters' pods only.
const ImportPoolLabel = "fleet.fleetinfer.io/import"

// exportingClusters are the clusters the import's other controller entries
// list (the hub's export controller keeps one).
func exportingClusters(imp *igwapixv1alpha1.InferencePoolImport) []string {
	var out []string
	for _, c := range imp.Status.Controllers {
		if c.Name == fleetv1alpha1.ImportControllerName {
			continue
		}
		for _, e := range c.ExportingClusters {
			if !slices.Contains(out, string(e.Name)) {
				out = append(out, string(e.Name))
			}
		}
	}
	return out
}

// ImportReconciler reconciles InferencePoolImports with the service
// reconciler's machinery.
type ImportReconciler struct {
	*Reconciler
}

// +kubebuilder:rbac:groups=inference.networking.x-k8s.io,resources=inferencepoolimports,verbs=get;list;watch
// +kubebuilder:rbac:groups=inference.networking.x-k8s.io,resources=inferencepoolimports/status,verbs=get;update;patch

// Reconcile routes one import, or withdraws what routed it, and records
// the outcome in the controller's status entry.
func (r *ImportReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	imp := &igwapixv1alpha1.InferencePoolImport{}
	if err := r.Get(ctx, req.NamespacedName, imp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !imp.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // its children go with it
	}
	parents, err := r.importParents(ctx, imp)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(parents) == 0 {
		// Nothing routes to the import: no picker, and no entry that would
		// keep the hub federating this cluster.
		return ctrl.Result{}, errors.Join(r.unrouteImport(ctx, imp), r.writeImportEntry(ctx, imp, nil))
	}
	accepted, recErr := r.routeImport(ctx, imp)
	accepted.ObservedGeneration = imp.Generation
	entry := &igwapixv1alpha1.ImportController{Name: fleetv1alpha1.ImportControllerName, Parents: parents}
	meta.SetStatusCondition(&entry.Conditions, accepted)
	return ctrl.Result{}, errors.Join(recErr, r.writeImportEntry(ctx, imp, entry))
}

// routeImport runs the import's pool and picker when the import can be
// routed from this cluster and removes them otherwise; it returns the
// Accepted condition that says which.
func (r *ImportReconciler) routeImport(ctx context.Context, imp *igwapixv1alpha1.InferencePoolImport) (metav1.Condition, error) {
	notAccepted := func(reason, format string, args ...any) metav1.Condition {
		return metav1.Condition{Type: ImportConditionAccepted, Status: metav1.ConditionFalse,
			Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	service := imp.Labels[v1alpha2.LabelName]
	local, err := r.localPool(ctx, imp, service)
	if err != nil {
		return notAccepted(ReasonFederationPending, "%v", err), err
	}
	if local != "" {
		return metav1.Condition{Type: ImportConditionAccepted, Status: metav1.ConditionTrue,
			Reason: ReasonServedByLocalPool, Message: local}, r.unrouteImport(ctx, imp)
	}
	if len(exportingClusters(imp)) == 0 {
		return notAccepted(ReasonNoExportingClusters, "No cluster exports InferencePool %s/%s", imp.Namespace, imp.Name), r.unrouteImport(ctx, imp)
	}
	cluster := imp.Annotations[fleetv1alpha1.FederationClusterAnnotation]
	if service == "" || cluster == "" {
		return notAccepted(ReasonFederationPending, "Waiting for the hub to federate this cluster's endpoint picker for the import (label %s, annotation %s)",
			v1alpha2.LabelName, fleetv1alpha1.FederationClusterAnnotation), nil
	}
	svc := importedService(imp, service, cluster)
	if poolName(svc) != imp.Name {
		return notAccepted(ReasonFederationPending, "The import is labelled with service %s, whose pool is %s, not %s", service, poolName(svc), imp.Name), nil
	}
	dir := &metav1.PartialObjectMetadata{}
	dir.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	err = r.Get(ctx, client.ObjectKey{Namespace: imp.Namespace, Name: fleetv1alpha1.PeerDirectoryName(service)}, dir)
	if apierrors.IsNotFound(err) || (err == nil && !isOwnedBy(dir, imp)) {
		return notAccepted(ReasonFederationPending, "Waiting for the hub to publish the peer directory %s and the certificate %s",
			fleetv1alpha1.PeerDirectoryName(service), fleetv1alpha1.FederationTLSName(service)), nil
	}
	if err != nil {
		return notAccepted(ReasonFederationPending, "%v", err), err
	}
	spec, err := r.importSchedulerSpec(ctx, svc, imp)
	if err != nil {
		return notAccepted(ReasonImportSchedulerInvalid, "%v", err), err
	}
	if err := r.reconcileScheduler(ctx, svc, imp, spec, &routing{}); err != nil {
		return notAccepted(ReasonImportPickerNotReady, "%v", err), err
	}
	if c := svc.Status.GetCondition(v1alpha2.SchedulerWorkloadReady); c == nil || c.Status != corev1.ConditionTrue {
		msg := "The endpoint picker has no available replica yet (it starts once the federation certificate is mounted)"
		if c != nil && c.Message != "" {
			msg = c.Message
		}
		return notAccepted(ReasonImportPickerNotReady, "%s", msg), nil
	}
	return metav1.Condition{Type: ImportConditionAccepted, Status: metav1.ConditionTrue,
		Reason: ReasonImportRouted, Message: fmt.Sprintf("Routed to the pods of %s through InferencePool %s and its federated endpoint picker, in Parent mode",
			strings.Join(exportingClusters(imp), ", "), imp.Name)}, nil
}

// isOwnedBy reports whether o has an owner reference to owner: the hub's
// objects next to an import are owned by it (not controlled).
func isOwnedBy(o metav1.Object, owner metav1.Object) bool {
	return slices.ContainsFunc(o.GetOwnerReferences(), func(ref metav1.OwnerReference) bool { return ref.UID == owner.GetUID() })
}

// localPool says why the import is served by a pool of this cluster (""
// when it is not): a copy of the service runs here, or an InferencePool of
// the import's name that the import controller did not create exists. Its
// own pool and picker then make way.
func (r *ImportReconciler) localPool(ctx context.Context, imp *igwapixv1alpha1.InferencePoolImport, service string) (string, error) {
	if service != "" {
		err := r.Get(ctx, client.ObjectKey{Namespace: imp.Namespace, Name: service}, &v1alpha2.LLMInferenceService{})
		if err == nil {
			return fmt.Sprintf("LLMInferenceService %s runs in this cluster: its own InferencePool %s serves the import", service, imp.Name), nil
		}
		if !apierrors.IsNotFound(err) {
			return "", err
		}
	}
	p := &igwapiv1.InferencePool{}
	err := r.Get(ctx, client.ObjectKeyFromObject(imp), p)
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if metav1.IsControlledBy(p, imp) {
		return "", nil
	}
	return fmt.Sprintf("InferencePool %s of this cluster serves the import", imp.Name), nil
}

// importedService stands for the imported service in this cluster: its
// names name the picker the import controller runs, and its annotations
// federate that picker (federate) as the hub asked, in Parent mode: an
// importing cluster reaches the exporting clusters through their gateways.
func importedService(imp *igwapixv1alpha1.InferencePoolImport, service, cluster string) *v1alpha2.LLMInferenceService {
	return &v1alpha2.LLMInferenceService{
		ObjectMeta: metav1.ObjectMeta{Namespace: imp.Namespace, Name: service, Annotations: map[string]string{
			fleetv1alpha1.FederationClusterAnnotation: cluster,
			fleetv1alpha1.FederationModeAnnotation:    string(fleetv1alpha1.FederationParent),
		}},
		Status: v1alpha2.LLMInferenceServiceStatus{Workloads: &v1alpha2.WorkloadStatus{}},
	}
}

// importSchedulerSpec is the scheduler preset rendered for svc, as a copy's
// scheduler would be, with two changes: the pool selects no pod (its
// endpoints are all remote), and the picker's metrics endpoint does not
// authenticate callers, whose cluster-wide auth-delegator binding could not
// be owned by the import.
func (r *ImportReconciler) importSchedulerSpec(ctx context.Context, svc *v1alpha2.LLMInferenceService, imp *igwapixv1alpha1.InferencePoolImport) (*v1alpha2.LLMInferenceServiceSpec, error) {
	cfg, err := r.config(ctx, svc.Namespace, r.opts.PresetPrefix+presetScheduler)
	if err != nil {
		return nil, err
	}
	if cfg.Spec.Router == nil || cfg.Spec.Router.Scheduler == nil {
		return nil, fmt.Errorf("preset %s has no spec.router.scheduler", cfg.Name)
	}
	preset := v1alpha2.LLMInferenceServiceSpec{Router: &v1alpha2.RouterSpec{Scheduler: cfg.Spec.Router.Scheduler.DeepCopy()}}
	s, err := render(renderInput{meta: svc.ObjectMeta, global: r.opts.Global, configs: preset}, r.opts.RenderLimits)
	if err != nil {
		return nil, renderError(err)
	}
	r.applyDefaults(svc, s)
	if err := r.resolveSchedulerConfig(ctx, svc.Namespace, s); err != nil {
		return nil, err
	}
	sch := s.Router.Scheduler
	if sch.Pool == nil || sch.Pool.Spec == nil || sch.Template == nil {
		return nil, fmt.Errorf("preset %s gives no pool spec or picker template", cfg.Name)
	}
	sch.Pool.Spec.Selector.MatchLabels = map[igwapiv1.LabelKey]igwapiv1.LabelValue{ImportPoolLabel: igwapiv1.LabelValue(imp.Name)}
	if metricsAuthEnabled(sch.Template) {
		i := slices.IndexFunc(sch.Template.Containers, func(c corev1.Container) bool { return c.Name == mainContainer })
		if i < 0 {
			i = 0
		}
		sch.Template.Containers[i].Args = append(sch.Template.Containers[i].Args, eppMetricsAuthDisabledFlag)
	}
	return s, nil
}

// unrouteImport removes the pool and picker the controller runs for imp.
func (r *ImportReconciler) unrouteImport(ctx context.Context, imp *igwapixv1alpha1.InferencePoolImport) error {
	service := imp.Labels[v1alpha2.LabelName]
	if service == "" {
		return nil // nothing was created without it
	}
	svc := importedService(imp, service, "")
	if poolName(svc) != imp.Name {
		return nil
	}
	return r.removeScheduler(ctx, svc, imp)
}

// importParents are the Gateways of the HTTPRoutes whose backendRefs name
// the import, in order of first mention.
func (r *ImportReconciler) importParents(ctx context.Context, imp *igwapixv1alpha1.InferencePoolImport) ([]igwapiv1.ParentStatus, error) {
	if !r.apis.gateway {
		return nil, nil
	}
	var routes gwapiv1.HTTPRouteList
	if err := r.List(ctx, &routes); err != nil {
		return nil, err
	}
	slices.SortFunc(routes.Items, func(a, b gwapiv1.HTTPRoute) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	rt := &routing{}
	for i := range routes.Items {
		if slices.Contains(importsOf(&routes.Items[i]), client.ObjectKeyFromObject(imp)) {
			rt.addRoute(&routes.Items[i])
		}
	}
	var out []igwapiv1.ParentStatus
	for _, g := range rt.gateways {
		out = append(out, igwapiv1.ParentStatus{ControllerName: igwapiv1.ControllerName(fleetv1alpha1.ImportControllerName),
			ParentRef: igwapiv1.ParentReference{Group: ptr.To(igwapiv1.Group(gatewayGroup)), Kind: "Gateway",
				Namespace: igwapiv1.Namespace(g.Namespace), Name: igwapiv1.ObjectName(g.Name)}})
	}
	return out, nil
}

// importsOf lists the InferencePoolImports a route's backendRefs name.
func importsOf(hr *gwapiv1.HTTPRoute) []client.ObjectKey {
	var out []client.ObjectKey
	for _, rule := range hr.Spec.Rules {
		for _, b := range rule.BackendRefs {
			if b.Group == nil || string(*b.Group) != igwapixv1alpha1.SchemeGroupVersion.Group || b.Kind == nil || *b.Kind != "InferencePoolImport" {
				continue
			}
			ns := hr.Namespace
			if b.Namespace != nil {
				ns = string(*b.Namespace)
			}
			if k := (client.ObjectKey{Namespace: ns, Name: string(b.Name)}); !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

// writeImportEntry sets the controller's entry in the import's status, or
// removes it when entry is nil; other controllers' entries stay as they are.
func (r *ImportReconciler) writeImportEntry(ctx context.Context, imp *igwapixv1alpha1.InferencePoolImport, entry *igwapixv1alpha1.ImportController) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &igwapixv1alpha1.InferencePoolImport{}
		if err := r.Get(ctx, client.ObjectKeyFromObject(imp), cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		controllers := slices.Clone(cur.Status.Controllers)
		i := slices.IndexFunc(controllers, func(c igwapixv1alpha1.ImportController) bool { return c.Name == fleetv1alpha1.ImportControllerName })
		switch {
		case entry == nil && i < 0:
			return nil
		case entry == nil:
			controllers = slices.Delete(controllers, i, i+1)
		case i < 0:
			controllers = append(controllers, *entry)
		default:
			want := entry.DeepCopy()
			// Keep transition times of conditions that did not change.
			want.Conditions = slices.Clone(controllers[i].Conditions)
			for _, c := range entry.Conditions {
				meta.SetStatusCondition(&want.Conditions, c)
			}
			if equality.Semantic.DeepEqual(controllers[i], *want) {
				return nil
			}
			controllers[i] = *want
		}
		cur.Status.Controllers = controllers
		return r.Status().Update(ctx, cur)
	})
}

// SetupWithManager registers the import controller, after the service
// reconciler's (whose API detection it shares), when the cluster has the
// InferencePoolImport, InferencePool and Gateway APIs. An import is
// reconciled when it, a route naming it, a service or pool of its name, or
// what it owns (its picker, the hub's peer directory) changes.
func (r *ImportReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if _, err := mgr.GetRESTMapper().RESTMapping(igwapixv1alpha1.SchemeGroupVersion.WithKind("InferencePoolImport").GroupKind()); err != nil ||
		!r.apis.inferencePool || !r.apis.gateway {
		return nil
	}
	toImports := func(_ context.Context, hr *gwapiv1.HTTPRoute) []reconcile.Request {
		var out []reconcile.Request
		for _, k := range importsOf(hr) {
			out = append(out, reconcile.Request{NamespacedName: k})
		}
		return out
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("inferencepoolimport").
		For(&igwapixv1alpha1.InferencePoolImport{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Watches(&igwapiv1.InferencePool{}, &handler.EnqueueRequestForObject{}).
		Watches(&v1alpha2.LLMInferenceService{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: poolName(o.(*v1alpha2.LLMInferenceService))}}}
		})).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &igwapixv1alpha1.InferencePoolImport{}),
			builder.OnlyMetadata).
		WatchesRawSource(source.Kind(mgr.GetCache(), &gwapiv1.HTTPRoute{}, handler.TypedEnqueueRequestsFromMapFunc(toImports))).
		Complete(r)
}
