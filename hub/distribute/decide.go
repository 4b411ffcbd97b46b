package distribute

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// decision is the applied placement of one service.
type decision struct {
	want     map[string]int32 // cluster -> replicas
	reasons  map[string]string
	unplaced int32
	message  string
	// federation is how the placed clusters' endpoint pickers federate.
	federation fleetv1alpha1.FederationMode
	// rollout is how a change to the service reaches the clusters
	// (rollout.go).
	rollout fleetv1alpha1.Rollout
	// keep says deciding failed or chose no cluster while the service runs:
	// want is what runs now, and distribute writes nothing, so no copy is
	// deleted or shrunk until a decision places the service again.
	keep bool
	// protected says the copies carry the deletion protection: the
	// service or a placement selecting it asks for it (protection.go).
	// reconcile sets it; deciding does not depend on it.
	protected bool
}

// outcome is what deciding yields; report writes it into the status and
// events announces its failovers.
type outcome struct {
	decision
	// placed is the Placed condition; nil leaves it as it is.
	placed *v1alpha2.Condition
	// memory is the decision memory to keep in status.placement.
	memory *v1alpha2.PlacementStatus
	// failovers are the clusters whose replicas this decision moved away
	// because they were unavailable.
	failovers []failover
	// requeue is when the next failover toleration ends.
	requeue time.Duration
	// readyTimeout is the placement's ready timeout (0 without a
	// placement): how long a copy may take to turn Ready (stuck.go).
	readyTimeout time.Duration
	// stuck are the clusters whose copy is Stuck.
	stuck []stuckCopy
	// staged is what the rollout lets distribute write (rollout.go).
	staged rolloutPlan
}

// engagingRecheck is how soon a service whose decision waits for clusters
// being engaged is looked at again, should no engagement notify it.
const engagingRecheck = time.Second

// engagingClusters names the clusters a new leader has not engaged yet
// within its grace.
func engagingClusters(clusters []inventory.Cluster) []string {
	var out []string
	for _, c := range clusters {
		if c.Engaging {
			out = append(out, c.Name)
		}
	}
	return out
}

// failover is one cluster losing its replicas to others while unavailable.
type failover struct {
	cluster inventory.Cluster
	to      string // the decision's clusters, for the message
}

// decide returns where the service should run. A new decision is computed
// only when its inputs change (the placement, the service, the set of
// healthy eligible clusters), never because capacity moved, so a placed
// service stays put and the hub stays quiet. It writes nothing: the
// outcome carries the Placed condition and the decision memory for report.
//
// Deciding never empties a running service: when it fails (no placement,
// several, the placements or an OCM Placement's decisions unreadable, the
// placement invalid) or chooses no cluster while copies of this hub exist,
// the outcome keeps what runs (see kept) and says why in the Placed
// condition. One function holds that for every phase (neverEmpties): only
// deleting the service on the hub, or asking for zero replicas, removes its
// last copy. An error is returned with an outcome that keeps, so the caller
// still reports it.
//
// The phases run in order on one decideScope; each returns done when the
// outcome is settled: the placement (selectPlacement), the decision in
// force while clusters are being engaged, the placement's inputs
// (placementInputs), the new decision (placeAgain).
func (r *Reconciler) decide(ctx context.Context, svc *v1alpha2.LLMInferenceService, clusters []inventory.Cluster, copies map[string]*observed) (outcome, error) {
	s := &decideScope{svc: svc, clusters: clusters, copies: copies, prev: placement.InForce(&svc.Status)}
	s.running = kept(currentDecision(svc, s.prev), copies)
	out, err := r.decidePhases(ctx, s)
	return s.neverEmpties(out), err
}

// decidePhases runs the phases of decide on s.
func (r *Reconciler) decidePhases(ctx context.Context, s *decideScope) (outcome, error) {
	if out, done, err := r.selectPlacement(ctx, s); done {
		return out, err
	}
	r.observeInForce(s)
	if engaging := engagingClusters(s.clusters); s.prev != nil && len(engaging) > 0 {
		// A hub that began to lead moments ago has not reached these
		// clusters yet: their copies and capacity are unknown, and a
		// decision without them could retire a copy elsewhere before
		// theirs exists. The decision in force stays until they are
		// engaged or the grace is over (the inventory says so).
		return s.keepInForce(s.current.message, engagingRecheck), nil
	}
	if out, done, err := r.placementInputs(ctx, s); done {
		return out, err
	}
	d, err := placement.Decide(s.req, s.inputs)
	if err != nil {
		// An invalid placement (a selector the API server let through,
		// from a CRD older than its validation) decides nothing: the
		// guard in decide keeps what runs.
		return outcome{placed: condition(placement.Placed, corev1.ConditionFalse, placement.ReasonInvalidPlacement,
			fmt.Sprintf("InferencePlacement %s: %v", s.pl.Name, err)), memory: s.prev, requeue: s.requeue}, nil
	}
	return s.placeAgain(d), nil
}

// neverEmpties holds decide's promise in one place, whatever phase settled
// out: an outcome that would leave no copy of a service that runs is
// turned into one that keeps what runs (keepOutcome), with out's reason and
// message, unless the service or its placement asks for zero replicas.
// Deleting the hub service does not come through decide.
func (s *decideScope) neverEmpties(out outcome) outcome {
	if out.keep || len(out.want) > 0 || len(s.running.want) == 0 || s.asksForZero() {
		return out
	}
	reason, msg := placement.ReasonNoEligibleCluster, "no cluster was decided"
	if out.placed != nil {
		reason, msg = out.placed.Reason, out.placed.Message
	}
	k := keepOutcome(s.running, s.prev, reason, msg)
	k.requeue = out.requeue
	return k
}

// asksForZero reports an explicit replicas: 0, on the service or as the
// placement's total: the one decision that may remove every copy.
func (s *decideScope) asksForZero() bool {
	if r := s.svc.Spec.Replicas; r != nil && *r == 0 {
		return true
	}
	return s.pl != nil && s.pl.Spec.Replicas.Total != nil && *s.pl.Spec.Replicas.Total == 0
}

// decideScope is what the phases of decide share.
type decideScope struct {
	svc      *v1alpha2.LLMInferenceService
	clusters []inventory.Cluster
	copies   map[string]*observed
	// prev is the decision memory in force; running is what runs now, for
	// an outcome that keeps it (kept).
	prev    *v1alpha2.PlacementStatus
	running decision
	// pl is the placement that selects the service.
	pl *fleetv1alpha1.InferencePlacement
	// current is the decision in force with the placement's federation and
	// rollout.
	current decision
	now     time.Time
	timeout time.Duration
	// stuck are the clusters Stuck now, previouslyStuck the ones the memory
	// names.
	stuck, previouslyStuck []v1alpha2.StuckCluster
	// fleet is what the placement's inputs were read from, req and inputs
	// what it decides on; requeue is when they next change with time alone.
	fleet   placement.Fleet
	req     placement.Request
	inputs  []placement.Cluster
	requeue time.Duration
}

// selectPlacement finds the placement that selects the service. Without one
// (or when the placements cannot be read) the outcome is settled: what runs
// is kept, or the service is not placed.
func (r *Reconciler) selectPlacement(ctx context.Context, s *decideScope) (outcome, bool, error) {
	pl, reason, msg, err := placement.For(ctx, r.hub, s.svc)
	switch {
	case err != nil && len(s.running.want) > 0:
		return keepOutcome(s.running, s.prev, placement.ReasonPlacementUnreadable,
			fmt.Sprintf("the InferencePlacements of namespace %s cannot be read: %v", s.svc.Namespace, err)), true, err
	case err != nil:
		return outcome{}, true, err
	case pl == nil && len(s.running.want) > 0:
		return keepOutcome(s.running, s.prev, reason, msg), true, nil
	case pl == nil:
		out := outcome{placed: condition(placement.Placed, corev1.ConditionFalse, reason, msg)}
		// Without a placement there is no decision in force, but the
		// clusters failed over stay remembered for when one selects it again.
		if s.prev != nil && len(s.prev.FailedOverClusters) > 0 {
			out.memory = &v1alpha2.PlacementStatus{FailedOverClusters: s.prev.FailedOverClusters}
		}
		return out, true, nil
	}
	s.pl = pl
	return outcome{}, false, nil
}

// observeInForce reads the decision in force under the placement and the
// clusters whose copy is Stuck now.
func (r *Reconciler) observeInForce(s *decideScope) {
	s.now = r.timeNow()
	s.current = currentDecision(s.svc, s.prev)
	s.current.federation = placement.FederationMode(s.pl)
	s.current.rollout = s.pl.Spec.Rollout
	s.timeout = r.readyTimeout(s.pl)
	s.stuck = stuckNow(s.prev, s.pl, s.svc, s.current, s.copies, s.timeout, s.now)
	if s.prev != nil {
		s.previouslyStuck = s.prev.StuckClusters
	}
}

// keepInForce is the outcome that keeps the decision in force (inForce),
// msg from the placement's decision, looked at again after requeue.
func (s *decideScope) keepInForce(msg string, requeue time.Duration) outcome {
	return inForce(s.svc, s.pl, s.current, s.prev, s.stuck, msg, outcome{requeue: requeue, readyTimeout: s.timeout,
		stuck: describeStuck(s.stuck, s.previouslyStuck, s.current, s.current, s.copies, s.timeout, msg)})
}

// placementInputs reads what the placement decides on. When they cannot
// be read the outcome is settled: what runs is kept.
func (r *Reconciler) placementInputs(ctx context.Context, s *decideScope) (outcome, bool, error) {
	s.fleet = placement.Fleet{Clusters: s.clusters, Held: s.held(), DefaultToleration: r.opts.DefaultToleration, Now: s.now,
		ClusterTimeout: r.clusterTimeout(), Stuck: stuckNames(s.stuck), RequireClusterSetBinding: r.opts.RequireClusterSetBinding}
	if s.prev != nil {
		s.fleet.FailedOver = s.prev.FailedOverClusters
	}
	var err error
	s.req, s.inputs, s.requeue, err = placement.Inputs(ctx, r.hub, s.pl, s.svc, s.fleet)
	if err == nil {
		return outcome{}, false, nil
	}
	msg := fmt.Sprintf("InferencePlacement %s: %v", s.pl.Name, err)
	reason := placement.ReasonOCMDecisionsUnavailable
	if errors.Is(err, placement.ErrBindingsUnreadable) {
		reason = placement.ReasonClusterSetBindingsUnreadable
	}
	out := outcome{decision: decision{keep: true}, placed: condition(placement.Placed, corev1.ConditionFalse,
		reason, msg), memory: s.prev}
	if len(s.running.want) > 0 {
		out = keepOutcome(s.running, s.prev, reason, msg)
	}
	out.requeue = s.requeue
	return out, true, err
}

// held is the replicas each cluster holds, for the placement's capacity.
func (s *decideScope) held() map[string]int32 {
	held := map[string]int32{}
	for name, o := range s.copies {
		switch {
		case o.ours:
			held[name] = min(o.readyReplicas, o.replicas)
		case o.err != nil:
			// Unreadable (unreachable, or not engaged by a hub that just
			// began to lead): its replicas are counted as it last ran
			// them, so that an unknown capacity does not make the cluster
			// ineligible within the toleration.
			held[name] = s.current.want[name]
		}
	}
	return held
}

// placeAgain applies the placement's decision d, unless its inputs are the
// ones in force, a stuck cluster's replicas have nowhere to go, or it
// would take every cluster from a running service.
func (s *decideScope) placeAgain(d placement.Decision) outcome {
	fp := placement.Fingerprint(s.pl, s.svc, d.Eligible)
	if s.prev != nil && s.prev.InputsHash == placement.LegacyFingerprint(s.pl, s.svc, d.Eligible) {
		s.prev.InputsHash = fp // recorded by an older hub: the same inputs
	}
	// Replicas that fit nowhere are placed as soon as room appears.
	morePlaced := s.current.unplaced > 0 && d.Unplaced < s.current.unplaced
	if s.prev != nil && s.prev.InputsHash == fp && !morePlaced {
		return s.keepInForce(d.Message, s.requeue)
	}
	next := decision{want: map[string]int32{}, reasons: map[string]string{}, unplaced: d.Unplaced, message: d.Message,
		federation: s.current.federation, rollout: s.current.rollout}
	for _, c := range d.Clusters {
		if c.Replicas > 0 {
			next.want[c.Name], next.reasons[c.Name] = c.Replicas, c.Reason
		}
	}
	if heldBack(s.stuck, s.current, next) {
		// No other cluster takes a stuck cluster's replicas: nothing moves,
		// the status says why, and the decision is made again at every
		// reconcile (its inputs differ from the one in force) until room
		// appears or the copy turns Ready.
		return s.keepInForce(d.Message, placement.MinPositive(s.requeue, heldRecheck))
	}
	noEligible := placement.ReasonNoEligibleCluster
	if s.req.BoundSets != nil && len(s.req.BoundSets) == 0 {
		noEligible = placement.ReasonNoClusterSetBinding
		d.Message = fmt.Sprintf("namespace %s has no ClusterSetBinding: its services may be placed only on the clusters of the sets bound to it (fleet.fleetinfer.io/clusterset on a cluster's registration; %q binds every cluster); ask the fleet's administrators for one",
			s.svc.Namespace, fleetv1alpha1.GlobalClusterSet)
	}
	if len(next.want) == 0 && next.unplaced > 0 && len(s.running.want) > 0 {
		return s.keepForNoCluster(noEligible, d.Message)
	}
	return s.applied(next, fp, d, noEligible)
}

// keepForNoCluster keeps what runs when the decision chose zero clusters
// for replicas that are asked for: an error to report, never a reason to
// delete what runs.
func (s *decideScope) keepForNoCluster(noEligible, decided string) outcome {
	reason, msg := noEligible, fmt.Sprintf("InferencePlacement %s: %s", s.pl.Name, decided)
	if ref := s.pl.Spec.Clusters.OCMPlacement; ref != nil && len(s.req.OCMDecided) == 0 {
		reason = placement.ReasonOCMDecisionsUnavailable
		msg = fmt.Sprintf("InferencePlacement %s: OCM Placement %s decided no cluster (it may be recomputing, or lost its ManagedClusterSetBinding)", s.pl.Name, ref.Name)
	}
	out := keepOutcome(s.running, s.prev, reason, msg)
	out.requeue = s.requeue
	return out
}

// applied is the outcome of the new decision next (inputs fingerprint fp):
// its decision memory, failovers and Placed condition.
func (s *decideScope) applied(next decision, fp string, d placement.Decision, noEligible string) outcome {
	current, prev := s.current, s.prev
	out := outcome{decision: next, requeue: s.requeue, readyTimeout: s.timeout,
		stuck: describeStuck(s.stuck, s.previouslyStuck, current, next, s.copies, s.timeout, d.Message)}
	out.memory = &v1alpha2.PlacementStatus{PlacementName: s.pl.Name, InputsHash: fp, UnplacedReplicas: next.unplaced, StuckClusters: s.stuck,
		NotEligible: d.NotEligible}
	if prev != nil {
		out.memory.CopyClocks = prev.CopyClocks
	}
	out.memory.FailedOverClusters, out.failovers = failedOver(s.fleet.FailedOver, current, next, s.clusters)
	changed := !equalWant(current.want, next.want) || current.unplaced != next.unplaced
	if prev != nil && prev.LastDecisionTime != nil && !changed {
		out.memory.LastDecisionTime = prev.LastDecisionTime
	} else {
		out.memory.LastDecisionTime = ptr.To(metav1.NewTime(s.now))
	}
	if !equalWant(current.want, next.want) {
		cause := "initial"
		if prev != nil && prev.InputsHash != "" {
			cause = "inputs-changed"
		}
		placementChanges.WithLabelValues(cause).Inc()
	}
	if len(next.want) == 0 {
		out.placed = condition(placement.Placed, corev1.ConditionFalse, noEligible,
			fmt.Sprintf("InferencePlacement %s: %s", s.pl.Name, d.Message))
	} else {
		out.placed = placedCondition(s.pl, next.want, next.unplaced, d.Message)
	}
	return out
}

// heldRecheck is how often a decision that could not move a stuck
// cluster's replicas is made again: capacity growing elsewhere raises no
// event.
const heldRecheck = 30 * time.Second

// inForce completes out with the decision in force (current) kept: the
// decision memory of prev under placement pl with the stuck clusters, and
// the Placed condition as it is, or, after an error kept the decision, as
// it applies again (msg from the placement's decision).
func inForce(svc *v1alpha2.LLMInferenceService, pl *fleetv1alpha1.InferencePlacement, current decision, prev *v1alpha2.PlacementStatus,
	stuck []v1alpha2.StuckCluster, msg string, out outcome) outcome {
	kept := *prev
	kept.PlacementName = pl.Name
	kept.StuckClusters = stuck
	out.decision, out.memory = current, &kept
	if c := svc.Status.GetCondition(placement.Placed); c != nil && c.Status == corev1.ConditionTrue {
		out.placed = ptr.To(*c)
	} else if len(current.want) > 0 {
		out.placed = placedCondition(pl, current.want, current.unplaced, msg)
	}
	return out
}

// placedCondition is the True Placed condition of a decision that places
// want, and fits unplaced replicas nowhere.
func placedCondition(pl *fleetv1alpha1.InferencePlacement, want map[string]int32, unplaced int32, msg string) *v1alpha2.Condition {
	if unplaced > 0 {
		return condition(placement.Placed, corev1.ConditionTrue, placement.ReasonPartiallyPlaced,
			fmt.Sprintf("InferencePlacement %s: %s (%s); %d replicas fit nowhere", pl.Name, clusterNames(want), msg, unplaced))
	}
	return condition(placement.Placed, corev1.ConditionTrue, placement.ReasonPlaced,
		fmt.Sprintf("InferencePlacement %s: %s (%s)", pl.Name, clusterNames(want), msg))
}

// kept is what runs of the service now, for a decision that keeps it: the
// clusters of the decision in force whose copy exists (or cannot be seen,
// the cluster being unreachable), with their desired replicas; when the
// status names none of them (it was lost), every copy of this hub with its
// replicas. Copies outside the decision in force stay Leaving. Empty when
// nothing of this hub runs.
func kept(current decision, copies map[string]*observed) decision {
	k := decision{want: map[string]int32{}, reasons: map[string]string{}, keep: true}
	for name, n := range current.want {
		if o := copies[name]; o == nil || o.err != nil || (o.exists && o.ours) {
			k.want[name], k.reasons[name] = n, current.reasons[name]
		}
	}
	if len(k.want) > 0 {
		return k
	}
	for name, o := range copies {
		if o.exists && o.ours {
			k.want[name], k.reasons[name] = o.replicas, "kept: running when the decision failed"
		}
	}
	return k
}

// keepOutcome keeps what runs (running, from kept) and the decision memory,
// with a False Placed condition whose reason names the cause and whose
// message says which copies are kept and what undoes it.
func keepOutcome(running decision, prev *v1alpha2.PlacementStatus, reason, cause string) outcome {
	msg := fmt.Sprintf("%s; the copies in %s are kept as they are until a decision places the service again "+
		"(only deleting the service on the hub removes them)", cause, clusterNames(running.want))
	return outcome{decision: running, placed: condition(placement.Placed, corev1.ConditionFalse, reason, msg), memory: prev}
}

// failedOver returns the clusters that lost their replicas while
// unavailable, remembered for Rebalance: Never, sorted; and the ones this
// decision newly moved replicas away from, for Events. A cluster of the
// previous decision that is not in the inventory at all (its registration
// removed) lost its replicas the same way. A cluster back in the decision
// is no longer failed over.
func failedOver(before []string, prev, next decision, clusters []inventory.Cluster) ([]string, []failover) {
	failed := slices.Clone(before)
	var moved []failover
	for name := range prev.want {
		i := slices.IndexFunc(clusters, func(c inventory.Cluster) bool { return c.Name == name })
		if _, keeps := next.want[name]; keeps || (i >= 0 && clusters[i].Available()) {
			continue
		}
		if !slices.Contains(failed, name) {
			failed = append(failed, name)
		}
		if i >= 0 {
			moved = append(moved, failover{cluster: clusters[i], to: clusterNames(next.want)})
		}
	}
	failed = slices.DeleteFunc(failed, func(n string) bool { _, in := next.want[n]; return in })
	slices.Sort(failed)
	if len(failed) == 0 {
		failed = nil
	}
	return failed, moved
}

// currentDecision reads the applied decision back from the status: the
// clusters of the decision are the entries that are not leaving it.
func currentDecision(svc *v1alpha2.LLMInferenceService, memory *v1alpha2.PlacementStatus) decision {
	d := decision{want: map[string]int32{}, reasons: map[string]string{}}
	for _, c := range svc.Status.Clusters {
		// A cluster the decision asks no replicas of is not in it (its
		// copy is leaving, being deleted, or could not be read).
		if c.Phase != PhaseLeaving && c.DesiredReplicas > 0 {
			d.want[c.Name], d.reasons[c.Name] = c.DesiredReplicas, c.PlacementReason
		}
	}
	if c := svc.Status.GetCondition(placement.Placed); c != nil {
		d.message = c.Message
	}
	if memory != nil {
		d.unplaced = memory.UnplacedReplicas
	}
	return d
}

// condition builds a hub condition; report sets it.
func condition(t v1alpha2.ConditionType, status corev1.ConditionStatus, reason, msg string) *v1alpha2.Condition {
	return &v1alpha2.Condition{Type: t, Status: status, Reason: reason, Message: msg}
}

func equalWant(a, b map[string]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
