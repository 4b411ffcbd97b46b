package distribute

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// Reasons of the Distributed and Ready conditions.
const (
	ReasonConflict = "ConflictingObject"
	// ReasonNamespaceNotOurs: the service's namespace exists in a chosen
	// cluster and is not the hub's to write into (spokewrite.EnsureNamespace).
	ReasonNamespaceNotOurs = "NamespaceNotOurs"
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
	if out.placed != nil {
		st.SetCondition(*out.placed)
	}
	placement.Record(st, out.memory)
	t := tallyClusters(svc, out, clusters, copies)
	st.Clusters = t.entries
	st.PlacedClusters, st.ReadyClusters = ptr.To(t.placed), ptr.To(t.ready)
	reportDistributed(svc, out.decision, t)
	reportReady(st, out.decision, t)
	switch {
	case out.keep:
		// A kept decision writes nothing: the rollout stands where it was.
	case out.staged.condition != nil:
		st.SetCondition(*out.staged.condition)
	default:
		st.ClearCondition(RolledOut)
	}
	reportAddresses(st, t.entries)
}

// clusterTally is the per-cluster entries of the status and what the
// conditions roll up from them.
type clusterTally struct {
	entries                                   []v1alpha2.ClusterStatus
	conflicts, unreachable, pending, notReady []string
	// notOurs are the chosen clusters whose namespace the hub may not
	// write into, and optIn the label that lets it in.
	notOurs []string
	optIn   string
	// placed and ready count the chosen clusters, and those Running.
	placed, ready int32
}

// tallyClusters builds an entry for every cluster the decision chooses or
// that holds a copy of this hub, sorted by name.
func tallyClusters(svc *v1alpha2.LLMInferenceService, out outcome, clusters []inventory.Cluster, copies map[string]*observed) clusterTally {
	byName := map[string]inventory.Cluster{}
	for _, c := range clusters {
		byName[c.Name] = c
	}
	names := map[string]bool{}
	for n := range out.want {
		names[n] = true
	}
	for n, o := range copies {
		if o.exists && o.ours {
			names[n] = true
		}
	}
	var t clusterTally
	for _, n := range slices.Sorted(maps.Keys(names)) {
		o := copies[n]
		if o == nil {
			o = &observed{err: fmt.Errorf("cluster %s is not registered", n)}
		}
		_, chosen := out.want[n]
		e := t.entry(svc, n, o, out, byName[n])
		if chosen {
			t.placed++
			if e.Phase == PhaseRunning {
				t.ready++
			} else {
				t.notReady = append(t.notReady, n)
			}
		}
		t.entries = append(t.entries, e)
	}
	return t
}

// entry is the status entry of cluster n (c; zero when not registered, and
// then o has an error), whose copy is o; what keeps it from Running is
// noted for the Distributed condition, and a fence (another hub with this
// hub's ID writes there) in the entry's message.
func (t *clusterTally) entry(svc *v1alpha2.LLMInferenceService, n string, o *observed, out outcome, c inventory.Cluster) v1alpha2.ClusterStatus {
	want, chosen := out.want[n]
	stuckMsg, stuck := stuckMessage(out.stuck, n)
	e := v1alpha2.ClusterStatus{Name: n, DesiredReplicas: want, PlacementReason: out.reasons[n],
		ReadyReplicas: o.readyReplicas, Ready: o.ready, URL: o.url, Message: o.message}
	switch {
	case !c.Available() || o.err != nil:
		e.Phase = PhaseUnreachable
		if o.err != nil {
			e.Message = o.err.Error()
		}
		if chosen {
			t.unreachable = append(t.unreachable, n)
		}
	case chosen && o.notOurs != nil:
		e.Phase, e.Ready, e.URL = PhaseConflict, false, ""
		e.Message = fmt.Sprintf("%v; nothing is written there", o.notOurs)
		t.notOurs, t.optIn = append(t.notOurs, n), o.notOurs.OptIn()
	case chosen && o.exists && !o.ours:
		e.Phase, e.Ready, e.URL = PhaseConflict, false, ""
		e.Message = fmt.Sprintf("LLMInferenceService %s/%s already exists in this cluster and was not created by the hub; it is left alone", svc.Namespace, svc.Name)
		t.conflicts = append(t.conflicts, n)
	case o.terminating && chosen:
		e.Phase = PhaseTerminating
		e.Message = "the copy is being deleted; its replicas do not count until it is gone"
		t.pending = append(t.pending, n+" (terminating)")
	case stuck:
		e.Phase, e.Message = PhaseStuck, stuckMsg
		if !chosen {
			t.pending = append(t.pending, n+" (stuck, leaving)")
		}
	case !chosen:
		e.Phase = PhaseLeaving
		e.Message = "kept until the clusters of the new placement are ready"
		t.pending = append(t.pending, n+" (leaving)")
	case !o.exists || o.replicas != want:
		e.Phase = PhasePlacing
		t.pending = append(t.pending, n)
	case o.ready && o.readyReplicas >= want:
		e.Phase = PhaseRunning
	default:
		e.Phase = PhasePlacing
	}
	if c.Fence.Fenced() && e.Phase != PhaseRunning && e.Phase != PhaseUnreachable {
		e.Message = "this hub writes nothing in this cluster: " + c.Fence.Message
	}
	return e
}

// reportDistributed sets the Distributed condition: whether every chosen
// cluster holds its copy, and no other copy is left to retire.
func reportDistributed(svc *v1alpha2.LLMInferenceService, d decision, t clusterTally) {
	st := &svc.Status
	switch {
	case len(d.want) == 0 && len(t.entries) == 0:
		st.ClearCondition(Distributed)
	case len(t.notOurs) > 0:
		st.MarkFalse(Distributed, ReasonNamespaceNotOurs, "namespace %s exists in cluster(s) %s and was not created by this hub, which writes nothing there; "+
			"label it %s in those clusters to let the hub in, or use another namespace on the hub",
			svc.Namespace, strings.Join(t.notOurs, ", "), t.optIn)
	case len(t.conflicts) > 0:
		st.MarkFalse(Distributed, ReasonConflict, "LLMInferenceService %s/%s exists in cluster(s) %s and was not created by the hub; rename it there or delete it",
			svc.Namespace, svc.Name, strings.Join(t.conflicts, ", "))
	case len(t.unreachable) > 0:
		st.MarkFalse(Distributed, ReasonUnreachable, "cluster(s) %s cannot be reached", strings.Join(t.unreachable, ", "))
	case len(t.pending) > 0:
		st.MarkFalse(Distributed, ReasonInProgress, "copies being written or retired: %s", strings.Join(t.pending, ", "))
	default:
		st.SetCondition(v1alpha2.Condition{Type: Distributed, Status: corev1.ConditionTrue, Reason: "Distributed",
			Message: fmt.Sprintf("copies in %s", clusterNames(d.want))})
	}
}

// reportReady sets the Ready condition: True when every chosen cluster
// runs its copy; otherwise why not, cluster by cluster.
func reportReady(st *v1alpha2.LLMInferenceServiceStatus, d decision, t clusterTally) {
	switch {
	case len(d.want) == 0:
		if c := st.GetCondition(placement.Placed); c != nil && c.Status == corev1.ConditionFalse {
			st.MarkFalse(v1alpha2.Ready, c.Reason, "%s", c.Message)
		} else {
			st.MarkFalse(v1alpha2.Ready, ReasonClustersNotReady, "the service runs in no cluster")
		}
	case len(t.notReady) > 0:
		var details []string
		for _, e := range t.entries {
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
}

// reportAddresses lists the Running copies' URLs as the service's
// addresses; the first is its URL.
func reportAddresses(st *v1alpha2.LLMInferenceServiceStatus, entries []v1alpha2.ClusterStatus) {
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
