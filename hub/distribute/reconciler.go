// Package distribute is the hub's LLMInferenceService controller: for each
// service applied to the hub it decides, under the InferencePlacement that
// selects it, which clusters run it with how many replicas; writes a copy of
// the service into each of them; moves replicas off clusters that fail for
// longer than the placement tolerates; and reports one status with an entry
// per cluster. It never touches a spoke object it did not create.
package distribute

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// Labels and annotations the hub puts on what it writes into spokes.
const (
	// Finalizer keeps a hub service until its copies are deleted.
	Finalizer = "fleet.fleetinfer.io/hub"

	// status.annotations the hub keeps between reconciles.
	inputsAnnotation     = "fleet.fleetinfer.io/placement-inputs"
	unplacedAnnotation   = "fleet.fleetinfer.io/unplaced-replicas"
	failedOverAnnotation = "fleet.fleetinfer.io/failed-over"
)

// Hub condition types on the hub's LLMInferenceService, next to Ready.
const (
	Placed      v1alpha2.ConditionType = "Placed"
	Distributed v1alpha2.ConditionType = "Distributed"
)

// Phases of a cluster entry in status.clusters.
const (
	PhasePlacing     = "Placing"
	PhaseRunning     = "Running"
	PhaseLeaving     = "Leaving"
	PhaseUnreachable = "Unreachable"
	PhaseConflict    = "Conflict"
)

// Options configure the reconciler.
type Options struct {
	// DefaultToleration applies when a placement sets none.
	DefaultToleration time.Duration
	// Workers is how many services are reconciled at once.
	Workers int
}

// Reconciler reconciles hub LLMInferenceServices.
type Reconciler struct {
	hub       client.Client
	inv       *inventory.Inventory
	recorder  record.EventRecorder
	opts      Options
	deletions *deletions
}

// NewReconciler builds the reconciler on the hub (local) cluster's client.
func NewReconciler(mgr mcmanager.Manager, inv *inventory.Inventory, opts Options) *Reconciler {
	local := mgr.GetLocalManager()
	return &Reconciler{hub: local.GetClient(), inv: inv, recorder: local.GetEventRecorderFor("fleetinfer-hub"), opts: opts,
		deletions: &deletions{}}
}

// OrphanCollector returns the collector of the copies this reconciler's hub
// left behind; it shares the reconciler's memory of deletions.
func (r *Reconciler) OrphanCollector(interval time.Duration) *OrphanCollector {
	return &OrphanCollector{hub: r.hub, inv: r.inv, interval: interval, deletions: r.deletions}
}

var (
	placementChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_hub_placement_decisions_total",
		Help: "Placement decisions that changed where a service runs, by cause.",
	}, []string{"cause"})
	copyWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_hub_copy_writes_total",
		Help: "Writes of service copies to spokes, by cluster and operation.",
	}, []string{"cluster", "operation"})
	distributionLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fleetinfer_hub_distribution_seconds",
		Help:    "From a hub service's change (generation) to its copies written in every reachable chosen cluster.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	readyClusters = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_hub_service_ready_clusters",
		Help: "Clusters whose copy of a service is Ready.",
	}, []string{"namespace", "service"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(placementChanges, copyWrites, distributionLag, readyClusters)
}

// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices;llminferenceserviceconfigs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices/finalizers,verbs=update
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=inferenceplacements,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=inferenceplacements/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.open-cluster-management.io,resources=managedclusters;placementdecisions,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=clusterprofiles,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile places, distributes and reports one hub service. Requests for
// other clusters do not occur: every watch maps to the hub object.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
	svc := &v1alpha2.LLMInferenceService{}
	if err := r.hub.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			readyClusters.DeleteLabelValues(req.Namespace, req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !svc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, svc)
	}
	if controllerutil.AddFinalizer(svc, Finalizer) {
		if err := r.hub.Update(ctx, svc); err != nil {
			return ctrl.Result{}, err
		}
	}
	before := svc.Status.DeepCopy()
	requeue, recErr := r.reconcile(ctx, svc)
	svc.Status.ObservedGeneration = svc.Generation
	if err := r.writeStatus(ctx, svc, before); err != nil {
		return ctrl.Result{}, errors.Join(recErr, err)
	}
	r.events(svc, before)
	return ctrl.Result{RequeueAfter: requeue}, recErr
}

func (r *Reconciler) reconcile(ctx context.Context, svc *v1alpha2.LLMInferenceService) (time.Duration, error) {
	began := time.Now()
	clusters := r.inv.Clusters(ctx)
	copies := r.observe(ctx, svc, clusters)
	d, requeue, err := r.decide(ctx, svc, clusters, copies)
	if err != nil {
		return 0, err
	}
	distErr := r.distribute(ctx, svc, d, clusters, copies)
	if distErr == nil && len(d.want) > 0 && svc.Status.ObservedGeneration != svc.Generation {
		distributionLag.Observe(time.Since(began).Seconds())
	}
	// Read back what the writes did, so the status is the clusters' own.
	copies = r.observe(ctx, svc, clusters)
	r.report(svc, d, clusters, copies)
	if svc.Status.Clusters != nil && !svc.Status.IsTrue(Distributed) && requeue == 0 {
		requeue = 5 * time.Second
	}
	return requeue, distErr
}

// finalize deletes the copies in every reachable cluster. Copies in
// unreachable clusters are left to the orphan collector, which removes them
// when the cluster comes back, so a lost cluster cannot block deletion.
func (r *Reconciler) finalize(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	if !controllerutil.ContainsFinalizer(svc, Finalizer) {
		return nil
	}
	var errs []error
	for _, c := range r.inv.Clusters(ctx) {
		if !c.Available() {
			continue
		}
		if err := r.deletions.deleteCopy(ctx, c, svc.Namespace, svc.Name); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	controllerutil.RemoveFinalizer(svc, Finalizer)
	return client.IgnoreNotFound(r.hub.Update(ctx, svc))
}

func (r *Reconciler) writeStatus(ctx context.Context, svc *v1alpha2.LLMInferenceService, before *v1alpha2.LLMInferenceServiceStatus) error {
	if equality.Semantic.DeepEqual(before, &svc.Status) {
		return nil
	}
	want := svc.Status.DeepCopy()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha2.LLMInferenceService{}
		if err := r.hub.Get(ctx, client.ObjectKeyFromObject(svc), cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		cur.Status = *want
		return r.hub.Status().Update(ctx, cur)
	})
}

// events records transitions of the hub conditions.
func (r *Reconciler) events(svc *v1alpha2.LLMInferenceService, before *v1alpha2.LLMInferenceServiceStatus) {
	readyClusters.WithLabelValues(svc.Namespace, svc.Name).Set(float64(countReady(svc.Status.Clusters)))
	for _, t := range []v1alpha2.ConditionType{Placed, Distributed, v1alpha2.Ready} {
		was, is := before.GetCondition(t), svc.Status.GetCondition(t)
		if is == nil || (was != nil && was.Status == is.Status && was.Reason == is.Reason) {
			continue
		}
		typ := corev1.EventTypeNormal
		if is.Status != corev1.ConditionTrue {
			typ = corev1.EventTypeWarning
		}
		msg := is.Message
		if msg == "" {
			msg = fmt.Sprintf("%s is %s", t, is.Status)
		}
		r.recorder.Event(svc, typ, string(t)+reasonSuffix(is), msg)
	}
}

func reasonSuffix(c *v1alpha2.Condition) string {
	if c.Status == corev1.ConditionTrue {
		return ""
	}
	return "Not"
}

func countReady(cs []v1alpha2.ClusterStatus) int {
	n := 0
	for _, c := range cs {
		if c.Ready {
			n++
		}
	}
	return n
}

// clusterNames lists names in a stable order for messages.
func clusterNames(m map[string]int32) string {
	names := make([]string, 0, len(m))
	for n, v := range m {
		names = append(names, fmt.Sprintf("%s=%d", n, v))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
