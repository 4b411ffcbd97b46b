package placement

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/component"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=inferenceplacements,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=inferenceplacements/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// StatusReconciler summarizes, on each InferencePlacement, the decisions
// the hub made for the services it selects, as each service's status
// reports them, and whether their pickers can use the Endpoint mode it asks
// for (the EndpointMode condition, from the clusters' registration labels).
type StatusReconciler struct {
	Hub      client.Client
	Clusters inventory.Source
	// Recorder records an Event on the placement when its EndpointMode
	// condition changes.
	Recorder record.EventRecorder
}

// Reconcile writes one placement's status.
func (r *StatusReconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
	p := &fleetv1alpha1.InferencePlacement{}
	if err := r.Hub.Get(ctx, req.NamespacedName, p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var list v1alpha2.LLMInferenceServiceList
	if err := r.Hub.List(ctx, &list, client.InNamespace(p.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	want := p.Status.DeepCopy()
	want.ObservedGeneration = p.Generation
	want.Services, want.PlacedServices = nil, 0
	var notReady []string
	var federated [][]string // the clusters of each service whose pickers federate
	for i := range list.Items {
		svc := &list.Items[i]
		if !Selects(p, svc) {
			continue
		}
		d := fleetv1alpha1.ServiceDecision{Name: svc.Name}
		if c := svc.Status.GetCondition(Placed); c != nil {
			d.Message = c.Message
			if c.Status == "True" {
				want.PlacedServices++
			}
		}
		for _, c := range svc.Status.Clusters {
			// A cluster leaving the decision is reported with no desired
			// replicas until its copy goes.
			if c.DesiredReplicas > 0 {
				d.Clusters = append(d.Clusters, fleetv1alpha1.ClusterDecision{Name: c.Name, Replicas: c.DesiredReplicas, Reason: c.PlacementReason})
			}
		}
		want.Services = append(want.Services, d)
		if rt := svc.Spec.Router; rt != nil && rt.Scheduler != nil {
			var names []string
			for _, c := range d.Clusters {
				names = append(names, c.Name)
			}
			federated = append(federated, names)
		}
		if !svc.Status.IsTrue(v1alpha2.Ready) {
			notReady = append(notReady, svc.Name)
		}
	}
	sort.Slice(want.Services, func(i, j int) bool { return want.Services[i].Name < want.Services[j].Name })
	cond := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "ServicesReady",
		Message: fmt.Sprintf("%d services placed and ready", len(want.Services)), ObservedGeneration: p.Generation}
	switch {
	case len(want.Services) == 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "NoServices", "the serviceSelector selects no LLMInferenceService in this namespace"
	case len(notReady) > 0:
		sort.Strings(notReady)
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, "ServicesNotReady", "not ready: "+strings.Join(notReady, ", ")
	}
	meta.SetStatusCondition(&want.Conditions, cond)
	endpoint := r.endpointMode(ctx, p, federated)
	if endpoint != nil {
		meta.SetStatusCondition(&want.Conditions, *endpoint)
	} else {
		meta.RemoveStatusCondition(&want.Conditions, ConditionEndpointMode)
	}
	if equality.Semantic.DeepEqual(&p.Status, want) {
		return ctrl.Result{}, nil
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &fleetv1alpha1.InferencePlacement{}
		if err := r.Hub.Get(ctx, req.NamespacedName, cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		cur.Status = *want
		return r.Hub.Status().Update(ctx, cur)
	})
	if err == nil {
		r.recordEndpointMode(p, meta.FindStatusCondition(p.Status.Conditions, ConditionEndpointMode), endpoint)
	}
	return ctrl.Result{}, err
}

// endpointMode is the placement's EndpointMode condition
// (endpointModeCondition), nil when it does not ask for Endpoint mode.
func (r *StatusReconciler) endpointMode(ctx context.Context, p *fleetv1alpha1.InferencePlacement, federated [][]string) *metav1.Condition {
	mode := FederationMode(p)
	if mode != fleetv1alpha1.FederationEndpoint {
		return nil
	}
	labels := map[string]map[string]string{}
	for _, c := range r.Clusters.Clusters(ctx) {
		labels[c.Name] = c.Labels
	}
	cond := endpointModeCondition(mode, federated, labels)
	cond.ObservedGeneration = p.Generation
	return cond
}

// recordEndpointMode records an Event when the EndpointMode condition
// turns up or changes what it says.
func (r *StatusReconciler) recordEndpointMode(p *fleetv1alpha1.InferencePlacement, was, is *metav1.Condition) {
	if is == nil || (was != nil && was.Status == is.Status && was.Reason == is.Reason && was.Message == is.Message) {
		return
	}
	kind := corev1.EventTypeNormal
	if is.Status != metav1.ConditionTrue {
		kind = corev1.EventTypeWarning
	}
	r.Recorder.Event(p, kind, is.Reason, is.Message)
}

// Options configure the status reconciler.
type Options struct {
	// Namespace holds the clusters' registrations.
	Namespace string
}

// Setup registers the status reconciler on the hub.
func Setup(ctx context.Context, deps component.Deps, opts Options) error {
	r := &StatusReconciler{Hub: deps.Hub(), Clusters: deps.Inventory, Recorder: deps.Recorder()}
	return r.setupWithManager(ctx, deps.Manager, deps.Inventory, opts.Namespace)
}

// setupWithManager registers the reconciler on the hub. Clusters joining,
// leaving or relabelled (their registrations in ns) re-run every placement:
// the EndpointMode condition reads their labels.
func (r *StatusReconciler) setupWithManager(ctx context.Context, mgr mcmanager.Manager, inv *inventory.Inventory, ns string) error {
	b := mcbuilder.ControllerManagedBy(mgr).
		Named("hub-inferenceplacement-status").
		For(&fleetv1alpha1.InferencePlacement{}, watch.ForHub...).
		// One placement may select hundreds of services: a second's worth of
		// their changes becomes one status write.
		Watches(&v1alpha2.LLMInferenceService{}, watch.MapCoalesced(time.Second, r.placementsOfService), watch.OnHub...).
		WatchesRawSource(watch.ClusterChanges(ctx, inv, 0, func(ctx context.Context) []client.ObjectKey {
			return watch.Keys(ctx, r.Hub, &fleetv1alpha1.InferencePlacementList{}, "")
		}))
	return watch.Registrations(b, mgr, ns, r.allPlacements).Complete(r)
}

func (r *StatusReconciler) placementsOfService(ctx context.Context, o client.Object) []mcreconcile.Request {
	return watch.Requests(ctx, r.Hub, &fleetv1alpha1.InferencePlacementList{}, o.GetNamespace())
}

func (r *StatusReconciler) allPlacements(ctx context.Context, _ client.Object) []mcreconcile.Request {
	return watch.Requests(ctx, r.Hub, &fleetv1alpha1.InferencePlacementList{}, "")
}
