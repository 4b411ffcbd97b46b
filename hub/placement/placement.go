// Package placement decides where a service runs: which of the fleet's
// clusters are eligible, which of them are chosen, and how many replicas
// each gets under the placement's strategy.
//
// Decide is pure, so every strategy is table-tested without a cluster. Its
// inputs are gathered here too (inputs.go: the InferencePlacement that
// selects a service, what one replica needs, each cluster's capacity,
// health within the failover toleration, an OCM Placement's decisions), as
// is the decision memory the hub keeps on the service (memory.go:
// status.placement). The InferencePlacement status controller (status.go,
// with Setup) summarizes the services' decisions and judges the
// EndpointMode condition (endpointmode.go). The hub's distribute
// controller applies the decision.
package placement

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Cluster is what a decision knows about one cluster.
type Cluster struct {
	Name       string
	Labels     map[string]string
	Properties map[string]string
	// Healthy is false once the cluster has been unreachable or unavailable
	// for longer than the placement tolerates.
	Healthy bool
	// Stuck says the service's copy here was not Ready within the
	// placement's ready timeout: the cluster is not eligible for it.
	Stuck bool
	// Capacity is the cluster's ClusterCapacity report; nil when unknown.
	Capacity *fleetv1alpha1.ClusterCapacityStatus
	// Current is the service's replicas on this cluster whose pods are
	// bound, so their accelerators are counted as requested in Capacity
	// although they are the service's to keep.
	Current int32
}

// Need is what one replica of a service takes.
type Need struct {
	// Resource is the accelerator resource its pods request (see
	// internal/accelerator); empty takes any.
	Resource corev1.ResourceName
	// Product is the accelerator model required; empty takes any.
	Product string
	// PerPod is the accelerators of Resource one pod requests; 0 for a CPU
	// model.
	PerPod int64
	// Pods is the number of pods of one replica (1, or a multi-node group).
	Pods int32
}

// Request is one decision's input.
type Request struct {
	Spec fleetv1alpha1.InferencePlacementSpec
	// Replicas is the service's own replica count (1 when unset).
	Replicas int32
	Need     Need
	// OCMDecided, when not nil, is the set an OCM Placement decided.
	OCMDecided map[string]bool
	// BoundSets, when not nil, are the cluster sets bound to the service's
	// namespace: only their clusters are eligible.
	BoundSets map[string]bool
}

// Decision is where a service runs.
type Decision struct {
	Clusters []fleetv1alpha1.ClusterDecision
	// Unplaced replicas fit nowhere.
	Unplaced int32
	Message  string
	// Eligible names the clusters that passed the filters, whatever their
	// room: a change of this set is a reason to decide again, a change of
	// room alone is not.
	Eligible []string
	// NotEligible are the clusters the filters left out, with why (the
	// clusters a placement's clusters.names does not ask for are not
	// mentioned).
	NotEligible []v1alpha2.ExcludedCluster
}

// Replicas returns the share of cluster name.
func (d Decision) Replicas(name string) (int32, bool) {
	for _, c := range d.Clusters {
		if c.Name == name {
			return c.Replicas, true
		}
	}
	return 0, false
}

// candidate is an eligible cluster with the replicas it can still take.
type candidate struct {
	Cluster
	room int64 // math.MaxInt64 when the service needs no accelerators
}

// Decide computes the decision.
func Decide(req Request, clusters []Cluster) (Decision, error) {
	cands, excluded, err := eligible(req, clusters)
	if err != nil {
		return Decision{}, err
	}
	var names []string
	for _, c := range cands {
		names = append(names, c.Name)
	}
	if len(cands) == 0 {
		msg := "no eligible cluster"
		if len(excluded) > 0 {
			msg += ": " + describeExcluded(excluded)
		}
		return Decision{Unplaced: total(req), Message: msg, NotEligible: excluded}, nil
	}
	var d Decision
	switch req.Spec.Replicas.Strategy {
	case fleetv1alpha1.Weighted:
		d = weighted(req, cands)
	case fleetv1alpha1.FreeCapacity:
		d = freeCapacity(req, cands)
	case fleetv1alpha1.Overflow:
		d = overflow(req, cands)
	default:
		d = duplicated(req, cands)
	}
	if len(excluded) > 0 {
		d.Message += "; not eligible: " + describeExcluded(excluded)
	}
	d.Eligible, d.NotEligible = names, excluded
	return d, nil
}

// describeExcluded lists the excluded clusters for a message:
// "name (reason); ...".
func describeExcluded(excluded []v1alpha2.ExcludedCluster) string {
	parts := make([]string, len(excluded))
	for i, e := range excluded {
		parts[i] = e.Name + " (" + e.Reason + ")"
	}
	return strings.Join(parts, "; ")
}

func total(req Request) int32 {
	if req.Spec.Replicas.Total != nil {
		return *req.Spec.Replicas.Total
	}
	return max(req.Replicas, 0)
}

// eligible filters clusters and says why the others were left out.
func eligible(req Request, clusters []Cluster) ([]candidate, []v1alpha2.ExcludedCluster, error) {
	aff := req.Spec.Clusters
	var sel labels.Selector
	if aff.Selector != nil {
		s, err := metav1.LabelSelectorAsSelector(aff.Selector)
		if err != nil {
			return nil, nil, fmt.Errorf("clusters.selector: %w", err)
		}
		sel = s
	}
	var out []candidate
	var excluded []v1alpha2.ExcludedCluster
	for _, c := range clusters {
		why := ""
		switch {
		case len(aff.Names) > 0 && !slices.Contains(aff.Names, c.Name):
			continue // never asked for: not worth a mention
		case req.BoundSets != nil && !fleetv1alpha1.InBoundSet(req.BoundSets, c.Labels):
			why = notBound(req.BoundSets, c.Labels)
		case req.OCMDecided != nil && !req.OCMDecided[c.Name]:
			why = "not decided by the OCM Placement"
		case sel != nil && !sel.Matches(labels.Set(c.Labels)):
			why = "labels do not match"
		case !propertiesMatch(aff.Properties, c.Properties):
			why = "properties do not match"
		case c.Stuck:
			why = "its copy was not Ready within the ready timeout"
		case !c.Healthy:
			why = "unavailable beyond the failover toleration"
		}
		room, ok, reason := roomFor(req.Need, c)
		if why == "" && !ok {
			why = reason
		}
		if why != "" {
			excluded = append(excluded, v1alpha2.ExcludedCluster{Name: c.Name, Reason: why})
			continue
		}
		out = append(out, candidate{Cluster: c, room: room})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	sort.Slice(excluded, func(i, j int) bool { return excluded[i].Name < excluded[j].Name })
	return out, excluded, nil
}

// notBound says why a cluster's set does not admit the namespace.
func notBound(bound map[string]bool, clusterLabels map[string]string) string {
	if len(bound) == 0 {
		return "the namespace has no ClusterSetBinding"
	}
	if set := clusterLabels[fleetv1alpha1.ClusterSetLabel]; set != "" {
		return fmt.Sprintf("cluster set %q is not bound to the namespace", set)
	}
	return "in no cluster set, and the namespace does not bind \"" + fleetv1alpha1.GlobalClusterSet + "\""
}

// roomFor is how many more replicas fit on c, counting the service's own
// current replicas as room (their accelerators are already requested).
// Capacity may limit growth but never shrinks what runs: a cluster that
// holds ready replicas of the service has room for at least those, even
// when its report is missing or shows none of the accelerator (its nodes
// cordoned or NotReady, which the spoke leaves out of its report).
func roomFor(n Need, c Cluster) (int64, bool, string) {
	if n.PerPod == 0 {
		return math.MaxInt64, true, ""
	}
	if c.Capacity == nil {
		if c.Current > 0 {
			return int64(c.Current), true, ""
		}
		return 0, false, "capacity not reported"
	}
	pods := max(n.Pods, 1)
	var fit int64
	found := false
	for i := range c.Capacity.Accelerators {
		a := &c.Capacity.Accelerators[i]
		if (n.Resource != "" && a.Resource != n.Resource) || (n.Product != "" && a.Product != n.Product) {
			continue
		}
		found = true
		fit += a.PodsThatFit(n.PerPod) / int64(pods)
	}
	if !found {
		if c.Current > 0 {
			return int64(c.Current), true, ""
		}
		return 0, false, "has no " + n.describe()
	}
	return fit + int64(c.Current), true, ""
}

// describe names the accelerator of a need for messages.
func (n Need) describe() string {
	switch {
	case n.Product != "" && n.Resource != "":
		return fmt.Sprintf("%s (%s)", n.Product, n.Resource)
	case n.Product != "":
		return n.Product
	case n.Resource != "":
		return string(n.Resource)
	}
	return "accelerators"
}

// limit keeps at most MaxClusters candidates, the first ones in order.
func limit(req Request, cands []candidate) []candidate {
	if m := req.Spec.MaxClusters; m != nil && int(*m) < len(cands) {
		return cands[:*m]
	}
	return cands
}

// byRoom orders candidates with the most room first, then by name.
func byRoom(cands []candidate) []candidate {
	out := slices.Clone(cands)
	sort.SliceStable(out, func(i, j int) bool { return out[i].room > out[j].room })
	return out
}

func duplicated(req Request, cands []candidate) Decision {
	chosen := limit(req, byRoom(cands))
	d := Decision{Message: fmt.Sprintf("%d replicas in each of %d clusters", req.Replicas, len(chosen))}
	for _, c := range sortedByName(chosen) {
		reason := "duplicated"
		if c.room != math.MaxInt64 && c.room < int64(req.Replicas) {
			reason = fmt.Sprintf("duplicated; only %d fit now", c.room)
		}
		d.Clusters = append(d.Clusters, fleetv1alpha1.ClusterDecision{Name: c.Name, Replicas: req.Replicas, Reason: reason})
	}
	return d
}

func weighted(req Request, cands []candidate) Decision {
	weights := map[string]int64{}
	for _, w := range req.Spec.Replicas.Weights {
		weights[w.Cluster] = int64(w.Weight)
	}
	var withWeight []candidate
	for _, c := range cands {
		if weights[c.Name] > 0 {
			withWeight = append(withWeight, c)
		}
	}
	sort.SliceStable(withWeight, func(i, j int) bool { return weights[withWeight[i].Name] > weights[withWeight[j].Name] })
	chosen := sortedByName(limit(req, withWeight))
	n := total(req)
	if len(chosen) == 0 {
		return Decision{Unplaced: n, Message: "no eligible cluster has a weight"}
	}
	w := make([]int64, len(chosen))
	var sum int64
	for i, c := range chosen {
		w[i] = weights[c.Name]
		sum += w[i]
	}
	shares := apportion(n, w, nil)
	d := Decision{Message: fmt.Sprintf("%d replicas divided by weight over %d clusters", n, len(chosen))}
	for i, c := range chosen {
		d.Clusters = append(d.Clusters, fleetv1alpha1.ClusterDecision{Name: c.Name, Replicas: shares[i],
			Reason: fmt.Sprintf("weight %d of %d", w[i], sum)})
	}
	return d
}

func freeCapacity(req Request, cands []candidate) Decision {
	var roomy []candidate
	for _, c := range byRoom(cands) {
		if c.room > 0 {
			roomy = append(roomy, c)
		}
	}
	chosen := sortedByName(limit(req, roomy))
	n := total(req)
	if len(chosen) == 0 {
		return Decision{Unplaced: n, Message: "no eligible cluster has room for a replica"}
	}
	w := make([]int64, len(chosen))
	for i, c := range chosen {
		w[i] = c.room
		if c.room == math.MaxInt64 {
			w[i] = int64(n) // no accelerators needed: equal shares
		}
	}
	shares := apportion(n, w, w)
	d := Decision{Message: fmt.Sprintf("%d replicas divided by free capacity over %d clusters", n, len(chosen))}
	var placed int32
	for i, c := range chosen {
		placed += shares[i]
		d.Clusters = append(d.Clusters, fleetv1alpha1.ClusterDecision{Name: c.Name, Replicas: shares[i], Reason: "room for " + roomString(c.room)})
	}
	d.Unplaced = n - placed
	return d
}

func overflow(req Request, cands []candidate) Decision {
	pref := req.Spec.Replicas.Preference
	rank := func(name string) int {
		if i := slices.Index(pref, name); i >= 0 {
			return i
		}
		return len(pref)
	}
	ordered := slices.Clone(cands)
	sort.SliceStable(ordered, func(i, j int) bool { return rank(ordered[i].Name) < rank(ordered[j].Name) })
	ordered = limit(req, ordered)
	n := total(req)
	remaining := int64(n)
	d := Decision{}
	for i, c := range ordered {
		take := min(remaining, c.room)
		remaining -= take
		if take == 0 {
			continue
		}
		reason := fmt.Sprintf("preference %d, room for %s", i+1, roomString(c.room))
		if i > 0 {
			reason = "overflow: " + reason
		}
		d.Clusters = append(d.Clusters, fleetv1alpha1.ClusterDecision{Name: c.Name, Replicas: int32(take), Reason: reason})
	}
	d.Unplaced = int32(remaining)
	d.Message = fmt.Sprintf("%d replicas filled in preference order over %d clusters", n-d.Unplaced, len(d.Clusters))
	if d.Unplaced > 0 {
		d.Message += fmt.Sprintf("; %d do not fit", d.Unplaced)
	}
	return d
}

// apportion divides n in proportion to weights by largest remainder, never
// giving a share more than its cap (when caps is not nil).
func apportion(n int32, weights, caps []int64) []int32 {
	out := make([]int32, len(weights))
	var sum int64
	for _, w := range weights {
		sum += w
	}
	if sum == 0 || n == 0 {
		return out
	}
	type rem struct {
		i    int
		frac int64
	}
	var rems []rem
	var given int32
	for i, w := range weights {
		q := int64(n) * w / sum
		if caps != nil {
			q = min(q, caps[i])
		}
		out[i] = int32(q)
		given += out[i]
		rems = append(rems, rem{i, int64(n)*w - q*sum})
	}
	sort.SliceStable(rems, func(a, b int) bool { return rems[a].frac > rems[b].frac })
	for given < n {
		progressed := false
		for _, r := range rems {
			if given == n {
				break
			}
			if caps != nil && int64(out[r.i]) >= caps[r.i] {
				continue
			}
			out[r.i]++
			given++
			progressed = true
		}
		if !progressed {
			break // every share is at its cap
		}
	}
	return out
}

func sortedByName(cands []candidate) []candidate {
	out := slices.Clone(cands)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func roomString(r int64) string {
	if r == math.MaxInt64 {
		return "any number (no accelerators needed)"
	}
	return strconv.FormatInt(r, 10)
}

func propertiesMatch(reqs []fleetv1alpha1.PropertyRequirement, props map[string]string) bool {
	for _, r := range reqs {
		v, ok := props[r.Name]
		switch r.Operator {
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		case "In":
			if !ok || !slices.Contains(r.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(r.Values, v) {
				return false
			}
		case "Gt", "Lt":
			have, err1 := strconv.ParseFloat(v, 64)
			want, err2 := strconv.ParseFloat(ptr.Deref(first(r.Values), ""), 64)
			if !ok || err1 != nil || err2 != nil || (r.Operator == "Gt" && have <= want) || (r.Operator == "Lt" && have >= want) {
				return false
			}
		}
	}
	return true
}

func first(v []string) *string {
	if len(v) == 0 {
		return nil
	}
	return &v[0]
}
