package distribute

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// Progressive rollout. A change to a service (what its copies run, not how
// many replicas) reaches its clusters a few at a time: the number of
// updated copies not yet healthy stays within maxConcurrentClusters, and a
// Ready copy of a previous version waits for a free slot (one that is not
// Ready is updated at once). An updated copy is healthy once it has been
// Ready at its current generation for minReadySeconds (the clock's
// readySince); one not Ready within progressDeadlineSeconds of the hub
// asking stalls the rollout, and the clusters not yet updated keep the
// previous version (their replica count still follows the decision). The
// state is derived each reconcile from the copies and the clocks, so a
// restarted hub resumes where the last one was, and a new change (a fix)
// starts over, with the copies that are not Ready first.

// RolledOut is the hub service's condition under a Progressive rollout:
// True when every chosen cluster runs the service's current version
// healthily.
const RolledOut v1alpha2.ConditionType = "RolledOut"

// Reasons of the RolledOut condition; they are also its Events' reasons.
const (
	ReasonRolledOut          = "RolledOut"
	ReasonRolloutProgressing = "RolloutProgressing"
	ReasonRolloutStalled     = "RolloutStalled"
)

// Defaults of a Progressive rollout's settings.
const (
	defaultProgressDeadline = 10 * time.Minute
	defaultMaxConcurrent    = 1
)

// rolloutPlan is what a reconcile does under the rollout.
type rolloutPlan struct {
	// hold are the clusters whose copy keeps its previous version now.
	hold map[string]bool
	// condition is RolledOut (nil when the rollout is not Progressive).
	condition *v1alpha2.Condition
	// requeue is when a healthy or stall verdict next changes with time
	// alone (0 for never).
	requeue time.Duration
}

// planRollout stages the change of decision d under the placement's
// rollout. desired is the copy a cluster should run; clocks are the copy
// clocks of the decision memory.
//
// A cluster Stuck under the service's current generation (stuck.go) stalls
// the rollout too: once its replicas have moved away it is no longer
// chosen, and without this the next stage would carry the change that
// stuck it to the next cluster.
func planRollout(ro fleetv1alpha1.Rollout, d decision, copies map[string]*observed, clocks []v1alpha2.CopyClock,
	stuck []v1alpha2.StuckCluster, desired func(cluster string) *v1alpha2.LLMInferenceService, now time.Time) rolloutPlan {
	if ro.Strategy != fleetv1alpha1.RolloutProgressive || d.keep {
		return rolloutPlan{}
	}
	minReady := time.Duration(ptr.Deref(ro.MinReadySeconds, 0)) * time.Second
	deadline := defaultProgressDeadline
	if s := ro.ProgressDeadlineSeconds; s != nil {
		deadline = time.Duration(*s) * time.Second
	}
	var outdated, notReadyOutdated, updated, inFlight, stalled []string
	var stallWhy []string
	plan := rolloutPlan{hold: map[string]bool{}}
	soon := func(at time.Time) {
		plan.requeue = placement.MinPositive(plan.requeue, at.Sub(now)+100*time.Millisecond)
	}
	for _, name := range slices.Sorted(maps.Keys(d.want)) {
		o := copies[name]
		if o == nil || o.err != nil || !o.exists || !o.ours || o.terminating {
			// A copy to create gets the current version; an unreadable one
			// is written nothing this time anyway.
			continue
		}
		if !sameVersion(o.obj, desired(name)) {
			// A copy that has been Ready at its generation serves the
			// previous version even while its status flickers (a
			// Deployment the controller has not observed yet): it waits
			// for a slot. Only one that never turned Ready there is
			// updated at once.
			clock := clockOf(clocks, name)
			if o.ready || (clock != nil && clock.Ready && clock.Generation == o.obj.Generation) {
				outdated = append(outdated, name)
			} else {
				notReadyOutdated = append(notReadyOutdated, name)
			}
			continue
		}
		updated = append(updated, name)
		clock := clockOf(clocks, name)
		switch {
		case o.ready && (clock == nil || clock.ReadySince == nil || !now.Before(clock.ReadySince.Add(minReady))):
			// Healthy.
		case o.ready:
			inFlight = append(inFlight, name)
			soon(clock.ReadySince.Add(minReady))
		case clock != nil && !now.Before(clock.AskedAt.Add(deadline)):
			stalled = append(stalled, name)
			why := o.message
			if why == "" {
				why = "no condition of the copy says why"
			}
			stallWhy = append(stallWhy, fmt.Sprintf("%s (%s)", name, why))
		default:
			inFlight = append(inFlight, name)
			if clock != nil {
				soon(clock.AskedAt.Add(deadline))
			}
		}
	}
	for _, st := range stuck {
		if !slices.Contains(stalled, st.Name) {
			stalled = append(stalled, st.Name)
			stallWhy = append(stallWhy, fmt.Sprintf("%s (its copy is Stuck)", st.Name))
		}
	}
	// Copies that are not Ready are updated at once, outside the limit:
	// they serve nothing the update could take away, and a fix reaches
	// the clusters a bad version broke first.
	waiting := append(notReadyOutdated, outdated...)
	slots := 0
	if len(stalled) == 0 {
		slots = len(notReadyOutdated) + max(int(ptr.Deref(ro.MaxConcurrentClusters, defaultMaxConcurrent))-len(inFlight), 0)
	}
	next := waiting[:min(slots, len(waiting))]
	held := waiting[len(next):]
	for _, name := range held {
		plan.hold[name] = true
	}
	total := len(updated) + len(waiting)
	switch {
	case len(stalled) > 0:
		plan.condition = condition(RolledOut, corev1.ConditionFalse, ReasonRolloutStalled, fmt.Sprintf(
			"the current version is not Ready within %s in %s; %s keep the previous version until the service changes again",
			deadline, strings.Join(stallWhy, "; "), listOrNone(held)))
	case len(waiting) > 0 || len(inFlight) > 0:
		plan.condition = condition(RolledOut, corev1.ConditionFalse, ReasonRolloutProgressing, fmt.Sprintf(
			"%d/%d clusters run the current version; not yet Ready%s: %s; waiting: %s",
			len(updated)+len(next), total, readyForSuffix(minReady), listOrNone(append(slices.Clone(inFlight), next...)), listOrNone(held)))
	default:
		plan.condition = condition(RolledOut, corev1.ConditionTrue, ReasonRolledOut,
			fmt.Sprintf("every cluster (%s) runs the current version", listOrNone(updated)))
	}
	return plan
}

// sameVersion says whether a copy runs the version want describes: the same
// spec apart from the replica count, labels and annotations.
func sameVersion(cur, want *v1alpha2.LLMInferenceService) bool {
	a, b := cur.Spec.DeepCopy(), want.Spec.DeepCopy()
	a.Replicas, b.Replicas = nil, nil
	return equality.Semantic.DeepEqual(a, b) && equality.Semantic.DeepEqual(cur.Labels, want.Labels) &&
		equality.Semantic.DeepEqual(cur.Annotations, want.Annotations)
}

// heldCopy is a held cluster's copy: its previous version with the
// decision's replicas.
func heldCopy(cur *v1alpha2.LLMInferenceService, replicas int32) *v1alpha2.LLMInferenceService {
	cp := cur.DeepCopy()
	if cp.Spec.Scaling == nil {
		cp.Spec.Replicas = ptr.To(replicas)
	}
	return cp
}

func clockOf(clocks []v1alpha2.CopyClock, cluster string) *v1alpha2.CopyClock {
	if i := slices.IndexFunc(clocks, func(c v1alpha2.CopyClock) bool { return c.Cluster == cluster }); i >= 0 {
		return &clocks[i]
	}
	return nil
}

func readyForSuffix(minReady time.Duration) string {
	if minReady <= 0 {
		return ""
	}
	return fmt.Sprintf(" (and Ready for %s)", minReady)
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
