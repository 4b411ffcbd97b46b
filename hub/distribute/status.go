package distribute

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// Reasons of the Distributed and Ready conditions.
const (
	ReasonConflict         = "ConflictingObject"
	ReasonUnreachable      = "ClusterUnreachable"
	ReasonInProgress       = "InProgress"
	ReasonClustersNotReady = "ClustersNotReady"
)

// report sets the service's status from the outcome of deciding and what
// the clusters hold, without API calls: the Placed condition and the
// decision memory (status.placement) as decided, the per-cluster entries,
// and their roll-up into Distributed and Ready, the rollout's RolledOut;
// the hub's addresses are the ready copies' URLs.
func report(svc *v1alpha2.LLMInferenceService, out outcome, clusters []inventory.Cluster, copies map[string]*observed) {
	st := &svc.Status
	d := out.decision
	if out.placed != nil {
		st.SetCondition(*out.placed)
	}
	placement.Record(st, out.memory)
	var entries []v1alpha2.ClusterStatus
	var conflicts, unreachable, pending, notReady []string
	available := map[string]bool{}
	for _, c := range clusters {
		available[c.Name] = c.Available()
	}
	names := map[string]bool{}
	for n := range d.want {
		names[n] = true
	}
	for n, o := range copies {
		if o.exists && o.ours {
			names[n] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	for _, n := range sorted {
		o := copies[n]
		if o == nil {
			o = &observed{err: fmt.Errorf("cluster %s is not registered", n)}
		}
		want, chosen := d.want[n]
		stuckMsg, stuck := stuckMessage(out.stuck, n)
		e := v1alpha2.ClusterStatus{Name: n, DesiredReplicas: want, PlacementReason: d.reasons[n],
			ReadyReplicas: o.readyReplicas, Ready: o.ready, URL: o.url, Message: o.message}
		switch {
		case !available[n] || o.err != nil:
			e.Phase = PhaseUnreachable
			if o.err != nil {
				e.Message = o.err.Error()
			}
			if chosen {
				unreachable = append(unreachable, n)
			}
		case chosen && o.exists && !o.ours:
			e.Phase, e.Ready, e.URL = PhaseConflict, false, ""
			e.Message = fmt.Sprintf("LLMInferenceService %s/%s already exists in this cluster and was not created by the hub; it is left alone", svc.Namespace, svc.Name)
			conflicts = append(conflicts, n)
		case o.terminating && chosen:
			e.Phase = PhaseTerminating
			e.Message = "the copy is being deleted; its replicas do not count until it is gone"
			pending = append(pending, n+" (terminating)")
		case stuck:
			e.Phase, e.Message = PhaseStuck, stuckMsg
			if !chosen {
				pending = append(pending, n+" (stuck, leaving)")
			}
		case !chosen:
			e.Phase = PhaseLeaving
			e.Message = "kept until the clusters of the new placement are ready"
			pending = append(pending, n+" (leaving)")
		case !o.exists || o.replicas != want:
			e.Phase = PhasePlacing
			pending = append(pending, n)
		case o.ready && o.readyReplicas >= want:
			e.Phase = PhaseRunning
		default:
			e.Phase = PhasePlacing
		}
		if chosen && !(e.Phase == PhaseRunning) {
			notReady = append(notReady, n)
		}
		entries = append(entries, e)
	}
	st.Clusters = entries

	switch {
	case len(d.want) == 0 && len(entries) == 0:
		st.ClearCondition(Distributed)
	case len(conflicts) > 0:
		st.MarkFalse(Distributed, ReasonConflict, "LLMInferenceService %s/%s exists in cluster(s) %s and was not created by the hub; rename it there or delete it",
			svc.Namespace, svc.Name, strings.Join(conflicts, ", "))
	case len(unreachable) > 0:
		st.MarkFalse(Distributed, ReasonUnreachable, "cluster(s) %s cannot be reached", strings.Join(unreachable, ", "))
	case len(pending) > 0:
		st.MarkFalse(Distributed, ReasonInProgress, "copies being written or retired: %s", strings.Join(pending, ", "))
	default:
		st.SetCondition(v1alpha2.Condition{Type: Distributed, Status: corev1.ConditionTrue, Reason: "Distributed",
			Message: fmt.Sprintf("copies in %s", clusterNames(d.want))})
	}

	switch {
	case len(d.want) == 0:
		if c := st.GetCondition(placement.Placed); c != nil && c.Status == corev1.ConditionFalse {
			st.MarkFalse(v1alpha2.Ready, c.Reason, "%s", c.Message)
		} else {
			st.MarkFalse(v1alpha2.Ready, ReasonClustersNotReady, "the service runs in no cluster")
		}
	case len(notReady) > 0:
		var details []string
		for _, e := range entries {
			if _, chosen := d.want[e.Name]; chosen && e.Phase != PhaseRunning {
				msg := fmt.Sprintf("%s %d/%d ready", e.Name, e.ReadyReplicas, e.DesiredReplicas)
				if e.Message != "" {
					msg += " (" + e.Message + ")"
				}
				details = append(details, msg)
			}
		}
		st.MarkFalse(v1alpha2.Ready, ReasonClustersNotReady, "%s", strings.Join(details, "; "))
	default:
		st.MarkTrue(v1alpha2.Ready)
	}

	switch {
	case d.keep:
		// A kept decision writes nothing: the rollout stands where it was.
	case out.staged.condition != nil:
		st.SetCondition(*out.staged.condition)
	default:
		st.ClearCondition(RolledOut)
	}

	st.Addresses, st.URL = nil, nil
	for _, e := range entries {
		if e.Phase == PhaseRunning && e.URL != "" {
			st.Addresses = append(st.Addresses, v1alpha2.SourcedAddress{Addressable: v1alpha2.Addressable{Name: ptr.To(e.Name), URL: ptr.To(e.URL)}})
		}
	}
	if len(st.Addresses) > 0 {
		st.URL = st.Addresses[0].URL
	}
}
