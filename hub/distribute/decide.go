package distribute

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// Reasons of the Placed condition.
const (
	ReasonNoPlacement        = "NoPlacement"
	ReasonMultiplePlacements = "MultiplePlacements"
	ReasonNoEligibleCluster  = "NoEligibleCluster"
	ReasonPartiallyPlaced    = "PartiallyPlaced"
	ReasonInvalidPlacement   = "InvalidPlacement"
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

// decide returns where the service should run. A new decision is computed
// only when its inputs change (the placement, the service, the set of
// healthy eligible clusters), never because capacity moved, so a placed
// service stays put and the hub stays quiet. It also returns when the next
// failover deadline falls, so the reconcile happens on time.
func (r *Reconciler) decide(ctx context.Context, svc *v1alpha2.LLMInferenceService, clusters []inventory.Cluster, copies map[string]*observed) (decision, time.Duration, error) {
	st := &svc.Status
	pl, reason, msg, err := r.placementFor(ctx, svc)
	if err != nil {
		return decision{}, 0, err
	}
	if pl == nil {
		st.MarkFalse(Placed, reason, "%s", msg)
		delete(st.Annotations, inputsAnnotation)
		return decision{}, 0, nil
	}
	toleration := r.opts.DefaultToleration
	if t := pl.Spec.Failover.TolerationSeconds; t != nil {
		toleration = time.Duration(*t) * time.Second
	}
	failedOver := splitList(st.Annotations[failedOverAnnotation])
	var requeue time.Duration
	var inputs []placement.Cluster
	now := time.Now()
	for _, c := range clusters {
		ok := c.Available()
		if !ok {
			if left := toleration - now.Sub(c.UnavailableSince); left > 0 {
				ok = true // within the toleration: keep its replicas where they are
				requeue = minPositive(requeue, left+100*time.Millisecond)
			}
		}
		if ok && pl.Spec.Replicas.Rebalance == "Never" && slices.Contains(failedOver, c.Name) {
			ok = false // recovered, but the placement keeps replicas where failover put them
		}
		// The service's own ready pods hold accelerators that are its to
		// keep; pods not yet bound hold none, so counting them would count
		// the same room twice.
		var current int32
		if o := copies[c.Name]; o != nil && o.ours {
			current = min(o.readyReplicas, o.replicas)
		}
		inputs = append(inputs, placement.Cluster{Name: c.Name, Labels: c.Labels, Properties: c.Properties,
			Healthy: ok, Capacity: capacityOf(ctx, c), Current: current})
	}
	req := placement.Request{Spec: pl.Spec, Replicas: ptr.Deref(svc.Spec.Replicas, 1), Need: needOf(svc, pl.Spec.Accelerator)}
	if ref := pl.Spec.Clusters.OCMPlacement; ref != nil {
		req.OCMDecided = r.ocmDecided(ctx, pl.Namespace, ref.Name)
	}
	// Deciding is cheap and pure; only a change of its inputs (the
	// placement, the service, the eligible clusters) replaces the decision
	// in force, so capacity moving under a placed service does not move it.
	d, err := placement.Decide(req, inputs)
	if err != nil {
		st.MarkFalse(Placed, ReasonInvalidPlacement, "InferencePlacement %s: %v", pl.Name, err)
		return decision{}, requeue, nil
	}
	fp := fingerprint(pl, svc, d.Eligible)
	current, hasCurrent := currentDecision(svc)
	// Replicas that fit nowhere are placed as soon as room appears.
	morePlaced := current.unplaced > 0 && d.Unplaced < current.unplaced
	if hasCurrent && st.Annotations[inputsAnnotation] == fp && !morePlaced {
		current.federation = federationMode(pl)
		return current, requeue, nil
	}
	next := decision{want: map[string]int32{}, reasons: map[string]string{}, unplaced: d.Unplaced, message: d.Message,
		federation: federationMode(pl)}
	for _, c := range d.Clusters {
		if c.Replicas > 0 {
			next.want[c.Name], next.reasons[c.Name] = c.Replicas, c.Reason
		}
	}
	r.recordFailover(svc, current, next, clusters)
	if st.Annotations == nil {
		st.Annotations = map[string]string{}
	}
	st.Annotations[inputsAnnotation] = fp
	if next.unplaced > 0 {
		st.Annotations[unplacedAnnotation] = strconv.Itoa(int(next.unplaced))
	} else {
		delete(st.Annotations, unplacedAnnotation)
	}
	cause := "initial"
	if hasCurrent {
		cause = "inputs-changed"
	}
	if !equalWant(current.want, next.want) {
		placementChanges.WithLabelValues(cause).Inc()
	}
	switch {
	case len(next.want) == 0:
		st.MarkFalse(Placed, ReasonNoEligibleCluster, "InferencePlacement %s: %s", pl.Name, d.Message)
	case next.unplaced > 0:
		st.SetCondition(v1alpha2.Condition{Type: Placed, Status: corev1.ConditionTrue, Reason: ReasonPartiallyPlaced,
			Message: fmt.Sprintf("InferencePlacement %s: %s (%s); %d replicas fit nowhere", pl.Name, clusterNames(next.want), d.Message, next.unplaced)})
	default:
		st.SetCondition(v1alpha2.Condition{Type: Placed, Status: corev1.ConditionTrue, Reason: "Placed",
			Message: fmt.Sprintf("InferencePlacement %s: %s (%s)", pl.Name, clusterNames(next.want), d.Message)})
	}
	return next, requeue, nil
}

// federationMode is the placement's federation mode, Endpoint by default.
func federationMode(p *fleetv1alpha1.InferencePlacement) fleetv1alpha1.FederationMode {
	if m := p.Spec.Federation.Mode; m != "" {
		return m
	}
	return fleetv1alpha1.FederationEndpoint
}

// recordFailover remembers clusters that lost their replicas because they
// were unavailable, for Rebalance: Never, and says so in an Event.
func (r *Reconciler) recordFailover(svc *v1alpha2.LLMInferenceService, prev, next decision, clusters []inventory.Cluster) {
	failed := splitList(svc.Status.Annotations[failedOverAnnotation])
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
		r.recorder.Eventf(svc, corev1.EventTypeWarning, "Failover", "Cluster %s unavailable since %s (%s): its replicas move to %s",
			c.Name, c.UnavailableSince.UTC().Format(time.RFC3339), c.Reason, clusterNames(next.want))
	}
	// A cluster back in the decision is no longer failed over.
	failed = slices.DeleteFunc(failed, func(n string) bool { _, in := next.want[n]; return in })
	sort.Strings(failed)
	if svc.Status.Annotations == nil {
		svc.Status.Annotations = map[string]string{}
	}
	if len(failed) == 0 {
		delete(svc.Status.Annotations, failedOverAnnotation)
	} else {
		svc.Status.Annotations[failedOverAnnotation] = strings.Join(failed, ",")
	}
}

// placementFor finds the one InferencePlacement of the service's namespace
// that selects it.
func (r *Reconciler) placementFor(ctx context.Context, svc *v1alpha2.LLMInferenceService) (*fleetv1alpha1.InferencePlacement, string, string, error) {
	var list fleetv1alpha1.InferencePlacementList
	if err := r.hub.List(ctx, &list, client.InNamespace(svc.Namespace)); err != nil {
		return nil, "", "", err
	}
	var matched []*fleetv1alpha1.InferencePlacement
	for i := range list.Items {
		p := &list.Items[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if selects(p, svc) {
			matched = append(matched, p)
		}
	}
	switch len(matched) {
	case 0:
		return nil, ReasonNoPlacement, fmt.Sprintf("no InferencePlacement in namespace %s selects this service; create one to run it on GPU clusters", svc.Namespace), nil
	case 1:
		return matched[0], "", "", nil
	}
	var names []string
	for _, p := range matched {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	return nil, ReasonMultiplePlacements, fmt.Sprintf("InferencePlacements %s all select this service; narrow their serviceSelector so exactly one does", strings.Join(names, ", ")), nil
}

func selects(p *fleetv1alpha1.InferencePlacement, svc *v1alpha2.LLMInferenceService) bool {
	if p.Spec.ServiceSelector == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.ServiceSelector)
	return err == nil && sel.Matches(labels.Set(svc.Labels))
}

// ocmDecided collects the clusters of an OCM Placement's decisions; nil
// (every cluster) when OCM is not installed, empty when it decided none.
func (r *Reconciler) ocmDecided(ctx context.Context, ns, placementName string) map[string]bool {
	var list clusterv1beta1.PlacementDecisionList
	if err := r.hub.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{clusterv1beta1.PlacementLabel: placementName}); err != nil {
		return map[string]bool{}
	}
	out := map[string]bool{}
	for _, d := range list.Items {
		for _, c := range d.Status.Decisions {
			out[c.ClusterName] = true
		}
	}
	return out
}

// needOf derives what one replica needs from the service's pod templates:
// the nvidia.com/gpu it requests per pod, the nvidia.com/gpu.product it
// selects, and how many pods a multi-node replica has.
func needOf(svc *v1alpha2.LLMInferenceService, override *fleetv1alpha1.AcceleratorRequirement) placement.Need {
	n := placement.Need{Pods: 1}
	s := &svc.Spec
	if s.Worker != nil {
		n.Pods = s.Parallelism.GroupSize()
	}
	for _, pod := range []*corev1.PodSpec{s.Template, s.Worker} {
		if pod == nil {
			continue
		}
		n.PerPod = max(n.PerPod, podGPUs(pod))
		if p := pod.NodeSelector[gpuProductLabel]; p != "" {
			n.Product = p
		}
	}
	if override != nil {
		n.Product = override.Product
		n.PerPod = int64(override.Count) / int64(max(n.Pods, 1))
	}
	return n
}

const (
	gpuResource     corev1.ResourceName = "nvidia.com/gpu"
	gpuProductLabel                     = "nvidia.com/gpu.product"
)

func podGPUs(pod *corev1.PodSpec) int64 {
	var n int64
	for _, c := range pod.Containers {
		q := c.Resources.Requests.Name(gpuResource, "")
		if q.IsZero() {
			q = c.Resources.Limits.Name(gpuResource, "")
		}
		n += q.Value()
	}
	return n
}

// capacityOf reads a cluster's capacity report from the hub's cache of it,
// which still answers while the cluster is briefly unreachable (a blip must
// not make a cluster look ineligible); nil when it has none.
func capacityOf(ctx context.Context, c inventory.Cluster) *fleetv1alpha1.ClusterCapacityStatus {
	cc := &fleetv1alpha1.ClusterCapacity{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}, cc); err != nil {
		return nil
	}
	return &cc.Status
}

// fingerprint identifies the inputs of a decision.
func fingerprint(p *fleetv1alpha1.InferencePlacement, svc *v1alpha2.LLMInferenceService, eligible []string) string {
	b, _ := json.Marshal(struct {
		P, S     version
		Eligible []string
	}{version{p.UID, p.Generation}, version{svc.UID, svc.Generation}, eligible})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// version identifies one generation of an object.
type version struct {
	UID        any
	Generation int64
}

// currentDecision reads the applied decision back from the status.
func currentDecision(svc *v1alpha2.LLMInferenceService) (decision, bool) {
	d := decision{want: map[string]int32{}, reasons: map[string]string{}}
	for _, c := range svc.Status.Clusters {
		if c.Phase != PhaseLeaving {
			d.want[c.Name], d.reasons[c.Name] = c.DesiredReplicas, c.PlacementReason
		}
	}
	if c := svc.Status.GetCondition(Placed); c != nil {
		d.message = c.Message
	}
	if n, err := strconv.Atoi(svc.Status.Annotations[unplacedAnnotation]); err == nil {
		d.unplaced = int32(n)
	}
	return d, svc.Status.Annotations[inputsAnnotation] != ""
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

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || b < a {
		return b
	}
	return a
}
