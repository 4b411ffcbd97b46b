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
	s := rolloutState{now: now, minReady: time.Duration(ptr.Deref(ro.MinReadySeconds, 0)) * time.Second, deadline: defaultProgressDeadline}
	if sec := ro.ProgressDeadlineSeconds; sec != nil {
		s.deadline = time.Duration(*sec) * time.Second
	}
	for _, name := range slices.Sorted(maps.Keys(d.want)) {
		o := copies[name]
		if o == nil || o.err != nil || !o.exists || !o.ours || o.terminating {
			// A copy to create gets the current version; an unreadable one
			// is written nothing this time anyway.
			continue
		}
		s.classify(name, o, clockOf(clocks, name), desired(name))
	}
	for _, st := range stuck {
		if !slices.Contains(s.stalled, st.Name) {
			s.stalled = append(s.stalled, st.Name)
			s.stallWhy = append(s.stallWhy, fmt.Sprintf("%s (its copy is Stuck)", st.Name))
		}
	}
	return s.plan(ptr.Deref(ro.MaxConcurrentClusters, defaultMaxConcurrent))
}

// rolloutState is where the chosen clusters' copies stand in a rollout.
type rolloutState struct {
	now                time.Time
	minReady, deadline time.Duration
	// outdated copies run a previous version and serve it (they wait for a
	// slot); notReadyOutdated ones serve nothing.
	outdated, notReadyOutdated []string
	// updated copies run the current version; of them, inFlight are not
	// healthy yet and stalled missed the deadline (stallWhy says why).
	updated, inFlight, stalled, stallWhy []string
	// requeue is when a verdict next changes with time alone.
	requeue time.Duration
}

// classify sorts the copy o of cluster name, whose clock is clock, by
// whether it runs want's version and how healthily.
func (s *rolloutState) classify(name string, o *observed, clock *v1alpha2.CopyClock, want *v1alpha2.LLMInferenceService) {
	if !sameVersion(o.obj, want) {
		// A copy that has been Ready at its generation serves the
		// previous version even while its status flickers (a
		// Deployment the controller has not observed yet): it waits
		// for a slot. Only one that never turned Ready there is
		// updated at once.
		if o.ready || (clock != nil && clock.Ready && clock.Generation == o.obj.Generation) {
			s.outdated = append(s.outdated, name)
		} else {
			s.notReadyOutdated = append(s.notReadyOutdated, name)
		}
		return
	}
	s.updated = append(s.updated, name)
	switch {
	case o.ready && (clock == nil || clock.ReadySince == nil || !s.now.Before(clock.ReadySince.Add(s.minReady))):
		// Healthy.
	case o.ready:
		s.inFlight = append(s.inFlight, name)
		s.soon(clock.ReadySince.Add(s.minReady))
	case clock != nil && !s.now.Before(clock.AskedAt.Add(s.deadline)):
		s.stalled = append(s.stalled, name)
		why := o.message
		if why == "" {
			why = "no condition of the copy says why"
		}
		s.stallWhy = append(s.stallWhy, fmt.Sprintf("%s (%s)", name, why))
	default:
		s.inFlight = append(s.inFlight, name)
		if clock != nil {
			s.soon(clock.AskedAt.Add(s.deadline))
		}
	}
}

// soon makes the plan be looked at again just after at.
func (s *rolloutState) soon(at time.Time) {
	s.requeue = placement.MinPositive(s.requeue, at.Sub(s.now)+100*time.Millisecond)
}

// plan updates as many outdated copies as maxConcurrent clusters allow,
// holds the rest, and sets RolledOut.
func (s *rolloutState) plan(maxConcurrent int32) rolloutPlan {
	plan := rolloutPlan{hold: map[string]bool{}, requeue: s.requeue}
	// Copies that are not Ready are updated at once, outside the limit:
	// they serve nothing the update could take away, and a fix reaches
	// the clusters a bad version broke first.
	waiting := append(s.notReadyOutdated, s.outdated...)
	slots := 0
	if len(s.stalled) == 0 {
		slots = len(s.notReadyOutdated) + max(int(maxConcurrent)-len(s.inFlight), 0)
	}
	next := waiting[:min(slots, len(waiting))]
	held := waiting[len(next):]
	for _, name := range held {
		plan.hold[name] = true
	}
	total := len(s.updated) + len(waiting)
	switch {
	case len(s.stalled) > 0:
		plan.condition = condition(RolledOut, corev1.ConditionFalse, ReasonRolloutStalled, fmt.Sprintf(
			"the current version is not Ready within %s in %s; %s keep the previous version until the service changes again",
			s.deadline, strings.Join(s.stallWhy, "; "), listOrNone(held)))
	case len(waiting) > 0 || len(s.inFlight) > 0:
		plan.condition = condition(RolledOut, corev1.ConditionFalse, ReasonRolloutProgressing, fmt.Sprintf(
			"%d/%d clusters run the current version; not yet Ready%s: %s; waiting: %s",
			len(s.updated)+len(next), total, readyForSuffix(s.minReady), listOrNone(append(slices.Clone(s.inFlight), next...)), listOrNone(held)))
	default:
		plan.condition = condition(RolledOut, corev1.ConditionTrue, ReasonRolledOut,
			fmt.Sprintf("every cluster (%s) runs the current version", listOrNone(s.updated)))
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
