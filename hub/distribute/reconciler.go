// Package distribute is the hub's LLMInferenceService controller. For each
// service applied to the hub it asks hub/placement where the service runs
// under the InferencePlacement that selects it, writes a copy of the service
// into each chosen cluster, make-before-break, and reports one status with
// an entry per cluster. The hub never touches a spoke object it did not
// create. By file:
//
//   - reconciler.go: the reconcile pipeline (observe the copies, decide,
//     plan the rollout, distribute, report, record Events), finalization,
//     and the Events, recorded in one place from the conditions'
//     transitions and the decision's failovers.
//   - decide.go: the decision, in phases on a decideScope; it never empties
//     a running service.
//   - stuck.go: application-level failover: a copy not Ready within the
//     ready timeout is Stuck and its replicas move.
//   - rollout.go: a Progressive rollout stages a change a few clusters at a
//     time (RolledOut).
//   - copies.go: reading and writing the copies and the configs they name
//     (through hub/internal/spokewrite), and deleting them.
//   - status.go: report, pure: the per-cluster entries and the Placed,
//     Distributed and Ready conditions.
//   - gc.go: the orphan collector removes copies no hub object accounts for.
//   - setup.go: Setup and the watches.
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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/placement"
	"github.com/fleetinfer/fleetinfer/internal/statuspatch"
)

// Finalizer keeps a hub service until its copies are deleted.
const Finalizer = "fleet.fleetinfer.io/hub"

// Distributed is the hub service's condition that says whether every chosen
// cluster holds its copy; placement.Placed and Ready stand next to it.
const Distributed v1alpha2.ConditionType = "Distributed"

// Phases of a cluster entry in status.clusters.
const (
	PhasePlacing     = "Placing"
	PhaseRunning     = "Running"
	PhaseLeaving     = "Leaving"
	PhaseUnreachable = "Unreachable"
	PhaseConflict    = "Conflict"
	// PhaseTerminating: the copy is being deleted; it is not counted as
	// ready, so no other copy shrinks or goes on its account.
	PhaseTerminating = "Terminating"
	// PhaseStuck: the copy was not Ready within the placement's ready
	// timeout (stuck.go).
	PhaseStuck = "Stuck"
)

// Options configure the reconciler.
type Options struct {
	// DefaultToleration applies when a placement sets none.
	DefaultToleration time.Duration
	// Workers is how many services are reconciled at once.
	Workers int
	// HubID is this hub's identity (fleetv1alpha1.HubIDLabel): the hub
	// updates and deletes only the spoke objects that carry it.
	HubID string
	// ClusterTimeout bounds every call to one cluster (DefaultClusterTimeout
	// when unset): a spoke that hangs (a black-holed link, a cache that never
	// syncs) is unreadable for this reconcile instead of holding the worker
	// and every other cluster's writes.
	ClusterTimeout time.Duration
	// OrphanGrace is how long a copy must stay orphaned (no hub service of
	// its name) before the collector deletes it.
	OrphanGrace time.Duration
	// DefaultReadyTimeout applies to placements that set no
	// failover.readyTimeoutSeconds (DefaultReadyTimeout when unset).
	DefaultReadyTimeout time.Duration
	// RequireClusterSetBinding limits each namespace to the clusters of
	// the sets its ClusterSetBindings bind.
	RequireClusterSetBinding bool
	// OrphanInterval is how often the orphan collector sweeps the spokes.
	OrphanInterval time.Duration
}

// withDefaults fills the settings left unset.
func (o Options) withDefaults() Options {
	if o.ClusterTimeout <= 0 {
		o.ClusterTimeout = DefaultClusterTimeout
	}
	if o.DefaultReadyTimeout <= 0 {
		o.DefaultReadyTimeout = DefaultReadyTimeout
	}
	return o
}

// FinalizePatience is how long a deleted hub service waits for every
// reachable cluster to delete its copy before it goes anyway, leaving the
// rest to the orphan collector.
const FinalizePatience = 2 * time.Minute

// finalizeRetry is how soon a deleted hub service whose copies could not
// all be deleted is looked at again.
const finalizeRetry = 5 * time.Second

// ReasonCopiesLeft is the Event of a hub service that went before all its
// copies did.
const ReasonCopiesLeft = "CopiesLeftToOrphanCollector"

// DefaultClusterTimeout is Options.ClusterTimeout when unset.
const DefaultClusterTimeout = 10 * time.Second

// DefaultOrphanGrace is the hub's default --orphan-grace-period: OCM's work
// agent waits as long before it evicts what a changed hub no longer
// claims. A hub restored from a backup that lacks some services, or a hub
// whose services were deleted without their finalizer, must not take
// their copies off the clusters before someone notices.
const DefaultOrphanGrace = 60 * time.Minute

// DefaultReadyTimeout is Options.DefaultReadyTimeout when unset.
const DefaultReadyTimeout = 10 * time.Minute

// Reconciler reconciles hub LLMInferenceServices.
type Reconciler struct {
	hub      client.Client
	clusters inventory.Source
	// inv feeds the watches with cluster changes (setupWithManager); a
	// reconcile reads clusters only through clusters.
	inv       *inventory.Inventory
	recorder  record.EventRecorder
	opts      Options
	deletions *deletions
	// now reads the clock (time.Now when nil); tests move it.
	now func() time.Time
}

// OrphanCollector returns the collector of the copies this reconciler's hub
// left behind; it shares the reconciler's memory of deletions.
func (r *Reconciler) OrphanCollector(interval time.Duration) *OrphanCollector {
	return &OrphanCollector{hub: r.hub, inv: r.inv, interval: interval, grace: r.opts.OrphanGrace, timeout: r.clusterTimeout(),
		deletions: r.deletions}
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
	stuckCopies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_hub_stuck_copies_total",
		Help: "Copies found Stuck (not Ready within the placement's ready timeout), by cluster.",
	}, []string{"cluster"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(placementChanges, copyWrites, distributionLag, readyClusters, stuckCopies)
}

// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices;llminferenceserviceconfigs,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=serving.kserve.io,resources=llminferenceservices/finalizers,verbs=update
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=inferenceplacements,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=clustersetbindings,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=inferenceplacements/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cluster.open-cluster-management.io,resources=managedclusters;placementdecisions,verbs=get;list;watch
// +kubebuilder:rbac:groups=multicluster.x-k8s.io,resources=clusterprofiles,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=fleetinfer-system,resources=secrets,verbs=get;list;watch
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
		if err := r.finalize(ctx, svc); err != nil {
			// Retried within finalizeRetry rather than by the queue's
			// backoff, which after two minutes of failures waits minutes
			// more: the patience must end on time.
			log.FromContext(ctx).Error(err, "copies not deleted yet; retrying", "patienceLeft", FinalizePatience-time.Since(deletingSince(svc)))
			return ctrl.Result{RequeueAfter: finalizeRetry}, nil
		}
		return ctrl.Result{}, nil
	}
	if controllerutil.AddFinalizer(svc, Finalizer) {
		if err := r.hub.Update(ctx, svc); err != nil {
			return ctrl.Result{}, err
		}
	}
	before := svc.Status.DeepCopy()
	out, recErr := r.reconcile(ctx, svc)
	svc.Status.ObservedGeneration = svc.Generation
	if err := r.writeStatus(ctx, svc, before); err != nil {
		return ctrl.Result{}, errors.Join(recErr, err)
	}
	r.events(svc, before, out.failovers, out.stuck)
	return ctrl.Result{RequeueAfter: out.requeue}, recErr
}

// reconcile runs observe → decide → distribute → observe → report. Only
// distribute writes to the clusters; the status is written by the caller.
func (r *Reconciler) reconcile(ctx context.Context, svc *v1alpha2.LLMInferenceService) (outcome, error) {
	began := time.Now()
	clusters := r.clusters.Clusters(ctx)
	copies := r.observe(ctx, svc, clusters)
	out, decideErr := r.decide(ctx, svc, clusters, copies)
	if decideErr != nil && out.placed == nil {
		return outcome{}, decideErr
	}
	// Copies are not written while their protection is not known, lest
	// one lose the label; a decision that keeps writes nothing anyway.
	by, protErr := deletionProtection(ctx, r.hub, svc)
	if protErr != nil && !out.keep {
		return outcome{}, errors.Join(decideErr, protErr)
	}
	out.protected = by != ""
	var clocks []v1alpha2.CopyClock
	var stuck []v1alpha2.StuckCluster
	if out.memory != nil {
		clocks, stuck = out.memory.CopyClocks, out.memory.StuckClusters
	}
	out.staged = planRollout(out.rollout, out.decision, copies, clocks, stuck, func(cluster string) *v1alpha2.LLMInferenceService {
		return desiredCopy(svc, r.opts.HubID, cluster, out.want[cluster], out.decision)
	}, r.timeNow())
	out.requeue = placement.MinPositive(out.requeue, out.staged.requeue)
	asked, distErr := r.distribute(ctx, svc, out.decision, out.staged.hold, clusters, copies)
	if distErr == nil && !out.keep && len(out.want) > 0 && svc.Status.ObservedGeneration != svc.Generation {
		distributionLag.Observe(time.Since(began).Seconds())
	}
	// Read back what the writes did, so the status is the clusters' own.
	copies = r.observe(ctx, svc, clusters)
	if out.memory != nil {
		out.memory.CopyClocks = tickClocks(out.memory.CopyClocks, out.want, copies, asked, r.timeNow())
		// No event comes when a copy stays Pending: look again when its
		// deadline passes.
		out.requeue = placement.MinPositive(out.requeue, untilFirstDeadline(out.memory.CopyClocks, out.readyTimeout, r.timeNow()))
	}
	report(svc, out, clusters, copies)
	if svc.Status.Clusters != nil && !svc.Status.IsTrue(Distributed) && out.requeue == 0 {
		out.requeue = 5 * time.Second
	}
	return out, errors.Join(decideErr, protErr, distErr)
}

// inCluster runs one cluster's part of a reconcile under the cluster
// deadline.
func (r *Reconciler) inCluster(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.clusterTimeout())
	defer cancel()
	return f(ctx)
}

func (r *Reconciler) timeNow() time.Time {
	if r.now == nil {
		return time.Now()
	}
	return r.now()
}

// clusterTimeout is Options.ClusterTimeout, defaulted also for a reconciler
// that Setup did not build.
func (r *Reconciler) clusterTimeout() time.Duration {
	return r.opts.withDefaults().ClusterTimeout
}

// finalize deletes the copies in every reachable cluster, unless deletion
// protection holds the service (protection.go). Copies in unreachable
// clusters are left to the orphan collector, which removes them when the
// cluster comes back, so a lost cluster cannot block deletion.
func (r *Reconciler) finalize(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	if !controllerutil.ContainsFinalizer(svc, Finalizer) {
		return nil
	}
	switch by, err := deletionProtection(ctx, r.hub, svc); {
	case err != nil:
		return err
	case by != "":
		return r.holdDeletion(ctx, svc, by)
	}
	var errs []error
	for _, c := range r.clusters.Clusters(ctx) {
		if !c.Writable() { // the orphan collector deletes there later
			continue
		}
		if err := r.inCluster(ctx, func(ctx context.Context) error {
			return r.deletions.deleteCopy(ctx, c, svc.Namespace, svc.Name)
		}); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		if heldUntilNow(svc) {
			return errors.Join(err, r.liftHold(ctx, svc))
		}
		if time.Since(deletingSince(svc)) < FinalizePatience {
			return err
		}
		// A spoke that refuses the delete (a webhook, RBAC drift) must not
		// hold the hub object for ever: the orphan collector retries there.
		r.recorder.Eventf(svc, corev1.EventTypeWarning, ReasonCopiesLeft,
			"Deleted on the hub although some copies could not be deleted for %s; the orphan collector keeps trying: %v", FinalizePatience, err)
	}
	controllerutil.RemoveFinalizer(svc, Finalizer)
	return client.IgnoreNotFound(r.hub.Update(ctx, svc))
}

func (r *Reconciler) writeStatus(ctx context.Context, svc *v1alpha2.LLMInferenceService, before *v1alpha2.LLMInferenceServiceStatus) error {
	if equality.Semantic.DeepEqual(before, &svc.Status) {
		return nil
	}
	want := svc.Status.DeepCopy()
	return statuspatch.Write(ctx, r.hub, svc, func(cur *v1alpha2.LLMInferenceService) { cur.Status = *want })
}

// events records the decision's failovers, the copies found Stuck, and the
// transitions of the hub conditions. A condition's Event reason is its type
// when True (Placed, Distributed, Ready) and names the loss otherwise
// (NotPlaced, NotDistributed, NotReady); a rollout's is its reason, a
// Warning only when it stalls.
func (r *Reconciler) events(svc *v1alpha2.LLMInferenceService, before *v1alpha2.LLMInferenceServiceStatus, failovers []failover, stuck []stuckCopy) {
	readyClusters.WithLabelValues(svc.Namespace, svc.Name).Set(float64(countReady(svc.Status.Clusters)))
	for _, f := range failovers {
		r.recorder.Eventf(svc, corev1.EventTypeWarning, "Failover", "Cluster %s unavailable since %s (%s): its replicas move to %s",
			f.cluster.Name, f.cluster.UnavailableSince.UTC().Format(time.RFC3339), f.cluster.Reason, f.to)
	}
	for _, s := range stuck {
		if s.found {
			stuckCopies.WithLabelValues(s.cluster).Inc()
		}
		if s.event != "" {
			r.recorder.Event(svc, corev1.EventTypeWarning, "Stuck", s.event)
		}
	}
	for _, t := range []v1alpha2.ConditionType{placement.Placed, Distributed, v1alpha2.Ready, RolledOut} {
		was, is := before.GetCondition(t), svc.Status.GetCondition(t)
		if is == nil || (was != nil && was.Status == is.Status && was.Reason == is.Reason) {
			continue
		}
		typ := corev1.EventTypeNormal
		if is.Status != corev1.ConditionTrue && is.Reason != ReasonRolloutProgressing {
			typ = corev1.EventTypeWarning
		}
		msg := is.Message
		if msg == "" {
			msg = fmt.Sprintf("%s is %s", t, is.Status)
		}
		r.recorder.Event(svc, typ, eventReason(is), msg)
	}
}

// eventReason is the reason of the Event that marks condition c's
// transition. A rollout's is its own reason (RolloutProgressing,
// RolloutStalled, RolledOut), and so is a namespace the hub may not write
// into: only a spoke's admin can resolve it, and alerts select on it.
func eventReason(c *v1alpha2.Condition) string {
	switch {
	case c.Type == RolledOut || c.Reason == ReasonNamespaceNotOurs:
		return c.Reason
	case c.Status == corev1.ConditionTrue:
		return string(c.Type)
	}
	return "Not" + string(c.Type)
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
