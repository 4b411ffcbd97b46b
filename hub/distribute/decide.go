package distribute

import (
	"context"
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
func (r *Reconciler) decide(ctx context.Context, svc *v1alpha2.LLMInferenceService, clusters []inventory.Cluster, copies map[string]*observed) (outcome, error) {
	prev := placement.InForce(&svc.Status)
	pl, reason, msg, err := placement.For(ctx, r.hub, svc)
	if err != nil {
		return outcome{}, err
	}
	if pl == nil {
		out := outcome{placed: condition(placement.Placed, corev1.ConditionFalse, reason, msg)}
		// Without a placement there is no decision in force, but the
		// clusters failed over stay remembered for when one selects it again.
		if prev != nil && len(prev.FailedOverClusters) > 0 {
			out.memory = &v1alpha2.PlacementStatus{FailedOverClusters: prev.FailedOverClusters}
		}
		return out, nil
	}
	now := time.Now()
	held := map[string]int32{}
	for name, o := range copies {
		if o.ours {
			held[name] = min(o.readyReplicas, o.replicas)
		}
	}
	fleet := placement.Fleet{Clusters: clusters, Held: held, DefaultToleration: r.opts.DefaultToleration, Now: now}
	if prev != nil {
		fleet.FailedOver = prev.FailedOverClusters
	}
	req, inputs, requeue := placement.Inputs(ctx, r.hub, pl, svc, fleet)
	d, err := placement.Decide(req, inputs)
	if err != nil {
		return outcome{placed: condition(placement.Placed, corev1.ConditionFalse, placement.ReasonInvalidPlacement,
			fmt.Sprintf("InferencePlacement %s: %v", pl.Name, err)), memory: prev, requeue: requeue}, nil
	}
	fp := placement.Fingerprint(pl, svc, d.Eligible)
	current := currentDecision(svc, prev)
	current.federation = placement.FederationMode(pl)
	// Replicas that fit nowhere are placed as soon as room appears.
	morePlaced := current.unplaced > 0 && d.Unplaced < current.unplaced
	if prev != nil && prev.InputsHash == fp && !morePlaced {
		kept := *prev
		kept.PlacementName = pl.Name
		out := outcome{decision: current, memory: &kept, requeue: requeue}
		if c := svc.Status.GetCondition(placement.Placed); c != nil {
			out.placed = ptr.To(*c)
		}
		return out, nil
	}
	next := decision{want: map[string]int32{}, reasons: map[string]string{}, unplaced: d.Unplaced, message: d.Message,
		federation: current.federation}
	for _, c := range d.Clusters {
		if c.Replicas > 0 {
			next.want[c.Name], next.reasons[c.Name] = c.Replicas, c.Reason
		}
	}
	out := outcome{decision: next, requeue: requeue}
	out.memory = &v1alpha2.PlacementStatus{PlacementName: pl.Name, InputsHash: fp, UnplacedReplicas: next.unplaced}
	out.memory.FailedOverClusters, out.failovers = failedOver(fleet.FailedOver, current, next, clusters)
	changed := !equalWant(current.want, next.want) || current.unplaced != next.unplaced
	if prev != nil && prev.LastDecisionTime != nil && !changed {
		out.memory.LastDecisionTime = prev.LastDecisionTime
	} else {
		out.memory.LastDecisionTime = ptr.To(metav1.NewTime(now))
	}
	if !equalWant(current.want, next.want) {
		cause := "initial"
		if prev != nil && prev.InputsHash != "" {
			cause = "inputs-changed"
		}
		placementChanges.WithLabelValues(cause).Inc()
	}
	switch {
	case len(next.want) == 0:
		out.placed = condition(placement.Placed, corev1.ConditionFalse, placement.ReasonNoEligibleCluster,
			fmt.Sprintf("InferencePlacement %s: %s", pl.Name, d.Message))
	case next.unplaced > 0:
		out.placed = condition(placement.Placed, corev1.ConditionTrue, placement.ReasonPartiallyPlaced,
			fmt.Sprintf("InferencePlacement %s: %s (%s); %d replicas fit nowhere", pl.Name, clusterNames(next.want), d.Message, next.unplaced))
	default:
		out.placed = condition(placement.Placed, corev1.ConditionTrue, placement.ReasonPlaced,
			fmt.Sprintf("InferencePlacement %s: %s (%s)", pl.Name, clusterNames(next.want), d.Message))
	}
	return out, nil
}

// failedOver returns the clusters that lost their replicas while
// unavailable, remembered for Rebalance: Never, sorted; and the ones this
// decision newly moved replicas away from. A cluster back in the decision is
// no longer failed over.
func failedOver(before []string, prev, next decision, clusters []inventory.Cluster) ([]string, []failover) {
	failed := slices.Clone(before)
	var moved []failover
	for _, c := range clusters {
		if _, had := prev.want[c.Name]; !had || c.Available() {
			continue
		}
		if _, keeps := next.want[c.Name]; keeps {
			continue
		}
		if !slices.Contains(failed, c.Name) {
			failed = append(failed, c.Name)
		}
		moved = append(moved, failover{cluster: c, to: clusterNames(next.want)})
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
		if c.Phase != PhaseLeaving {
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
