package placement

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/nodecapacity"
)

// Placed is the hub service's condition that says whether, and where, it is
// placed.
const Placed v1alpha2.ConditionType = "Placed"

// Reasons of the Placed condition.
const (
	ReasonPlaced             = "Placed"
	ReasonNoPlacement        = "NoPlacement"
	ReasonMultiplePlacements = "MultiplePlacements"
	ReasonNoEligibleCluster  = "NoEligibleCluster"
	ReasonPartiallyPlaced    = "PartiallyPlaced"
	ReasonInvalidPlacement   = "InvalidPlacement"
	// ReasonOCMDecisionsUnavailable: the OCM Placement's decisions could
	// not be read, or name no cluster while the service runs.
	ReasonOCMDecisionsUnavailable = "OCMDecisionsUnavailable"
	// ReasonPlacementUnreadable: the InferencePlacements could not be read.
	ReasonPlacementUnreadable = "PlacementUnreadable"
	// ReasonNoClusterSetBinding: the hub requires ClusterSetBindings and
	// the namespace has none.
	ReasonNoClusterSetBinding = "NoClusterSetBinding"
	// ReasonClusterSetBindingsUnreadable: the namespace's
	// ClusterSetBindings could not be read.
	ReasonClusterSetBindingsUnreadable = "ClusterSetBindingsUnreadable"
)

// For finds the one InferencePlacement of the service's namespace that
// selects it. When none or several do it returns nil, with the reason and
// message of the False Placed condition that says so.
func For(ctx context.Context, hub client.Reader, svc *v1alpha2.LLMInferenceService) (*fleetv1alpha1.InferencePlacement, string, string, error) {
	var list fleetv1alpha1.InferencePlacementList
	if err := hub.List(ctx, &list, client.InNamespace(svc.Namespace)); err != nil {
		return nil, "", "", err
	}
	var matched []*fleetv1alpha1.InferencePlacement
	for i := range list.Items {
		p := &list.Items[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if Selects(p, svc) {
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

// Selects reports whether placement p selects service svc.
func Selects(p *fleetv1alpha1.InferencePlacement, svc *v1alpha2.LLMInferenceService) bool {
	if p.Spec.ServiceSelector == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.ServiceSelector)
	return err == nil && sel.Matches(labels.Set(svc.Labels))
}

// Fleet is what the hub knows of its clusters when it decides for one
// service.
type Fleet struct {
	Clusters []inventory.Cluster
	// Held is, per cluster, the service's replicas whose pods are ready:
	// their accelerators are counted as requested in the cluster's capacity
	// although they are the service's to keep. Pods not yet bound hold
	// none, so counting them would count the same room twice.
	Held map[string]int32
	// FailedOver lists the clusters that lost the service's replicas while
	// unavailable (the decision memory's FailedOverClusters).
	FailedOver []string
	// Stuck lists the clusters whose copy of the service was not Ready
	// within the ready timeout: they are not eligible for it.
	Stuck []string
	// DefaultToleration applies when the placement sets none.
	DefaultToleration time.Duration
	Now               time.Time
	// ClusterTimeout bounds each cluster's capacity read (none when zero):
	// a cluster that hangs reads as one without a report.
	ClusterTimeout time.Duration
	// RequireClusterSetBinding limits each namespace to the clusters of
	// the sets its ClusterSetBindings bind.
	RequireClusterSetBinding bool
}

// Inputs gathers the request and the clusters of a decision for svc under
// pl. It also returns when the earliest failover toleration ends, so the
// service is reconsidered on time (0 when none is running). The error says
// that an input could not be read (an OCM Placement's decisions): the hub
// must not decide on what it could not read.
func Inputs(ctx context.Context, hub client.Reader, pl *fleetv1alpha1.InferencePlacement, svc *v1alpha2.LLMInferenceService, f Fleet) (Request, []Cluster, time.Duration, error) {
	toleration := f.DefaultToleration
	if t := pl.Spec.Failover.TolerationSeconds; t != nil {
		toleration = time.Duration(*t) * time.Second
	}
	var requeue time.Duration
	var out []Cluster
	capacities := capacitiesOf(ctx, f.Clusters, f.ClusterTimeout)
	for i, c := range f.Clusters {
		ok := c.Available()
		if !ok {
			if left := toleration - f.Now.Sub(c.UnavailableSince); left > 0 {
				ok = true // within the toleration: keep its replicas where they are
				requeue = MinPositive(requeue, left+100*time.Millisecond)
			}
		}
		if ok && pl.Spec.Replicas.Rebalance == "Never" && slices.Contains(f.FailedOver, c.Name) {
			ok = false // recovered, but the placement keeps replicas where failover put them
		}
		out = append(out, Cluster{Name: c.Name, Labels: c.Labels, Properties: c.Properties,
			Healthy: ok, Stuck: slices.Contains(f.Stuck, c.Name), Capacity: capacities[i], Current: f.Held[c.Name]})
	}
	req := Request{Spec: pl.Spec, Replicas: ptr.Deref(svc.Spec.Replicas, 1), Need: NeedOf(svc, pl.Spec.Accelerator)}
	if f.RequireClusterSetBinding {
		var err error
		if req.BoundSets, err = BoundSets(ctx, hub, pl.Namespace); err != nil {
			return req, out, requeue, err
		}
	}
	var err error
	if ref := pl.Spec.Clusters.OCMPlacement; ref != nil {
		req.OCMDecided, err = OCMDecided(ctx, hub, pl.Namespace, ref.Name)
	}
	return req, out, requeue, err
}

// ErrBindingsUnreadable wraps a failure to list a namespace's
// ClusterSetBindings: without them the hub cannot tell where the namespace
// may place, so it decides nothing.
var ErrBindingsUnreadable = errors.New("the namespace's ClusterSetBindings cannot be read")

// BoundSets are the cluster sets the ClusterSetBindings of ns bind (empty,
// not nil, when there are none).
func BoundSets(ctx context.Context, hub client.Reader, ns string) (map[string]bool, error) {
	var list fleetv1alpha1.ClusterSetBindingList
	if err := hub.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBindingsUnreadable, err)
	}
	out := map[string]bool{}
	for _, b := range list.Items {
		out[b.Spec.ClusterSet] = true
	}
	return out, nil
}

// NeedOf derives what one replica needs from the service's pod templates:
// the accelerator resource and how many of it each pod requests, counted as
// the scheduler (and the spoke's ClusterCapacity) counts them; the product
// its node selector asks for; and how many pods a multi-node replica has.
// The placement's spec.accelerator, when set, overrides the product and the
// count.
func NeedOf(svc *v1alpha2.LLMInferenceService, override *fleetv1alpha1.AcceleratorRequirement) Need {
	n := Need{Pods: 1}
	s := &svc.Spec
	if s.Worker != nil {
		n.Pods = s.Parallelism.GroupSize()
	}
	pods := []*corev1.PodSpec{s.Template, s.Worker}
	for _, pod := range pods {
		if pod == nil {
			continue
		}
		if r, count := accelerator.PodNeed(pod); count > n.PerPod {
			n.Resource, n.PerPod = r, count
		}
	}
	if override != nil {
		if override.Resource != "" {
			n.Resource = override.Resource
		}
		if n.Resource == "" {
			n.Resource = accelerator.NVIDIA
		}
		n.Product = override.Product
		n.PerPod = int64(override.Count) / int64(max(n.Pods, 1))
		return n
	}
	if label := accelerator.ProductLabel(n.Resource); label != "" {
		for _, pod := range pods {
			if pod == nil {
				continue
			}
			if p := pod.NodeSelector[label]; p != "" {
				n.Product = p
			}
		}
	}
	return n
}

// capacitiesOf reads every cluster's capacity report at once, each within
// the timeout.
func capacitiesOf(ctx context.Context, clusters []inventory.Cluster, timeout time.Duration) []*fleetv1alpha1.ClusterCapacityStatus {
	out := make([]*fleetv1alpha1.ClusterCapacityStatus, len(clusters))
	var wg sync.WaitGroup
	for i, c := range clusters {
		wg.Go(func() {
			ctx := ctx
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			out[i] = CapacityOf(ctx, c)
		})
	}
	wg.Wait()
	return out
}

// CapacityOf reads a cluster's capacity report through the hub's cache of
// the cluster, which still answers while the cluster is briefly unreachable
// (a blip must not make a cluster look ineligible), bounded by the cluster's
// Nodes as the hub sees them: a report is the spoke's claim, and one that
// claims more room than its nodes allocate (a bug, or a compromised spoke
// controller) would draw replicas from every other cluster. nil when there
// is no report or the nodes cannot be read: nothing grows there then.
func CapacityOf(ctx context.Context, c inventory.Cluster) *fleetv1alpha1.ClusterCapacityStatus {
	if c.Client == nil {
		return nil
	}
	cc := &fleetv1alpha1.ClusterCapacity{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}, cc); err != nil {
		return nil
	}
	var nodes corev1.NodeList
	if err := c.Client.List(ctx, &nodes); err != nil {
		return nil
	}
	st, capped := nodecapacity.Bound(cc.Status, nodes.Items)
	capacityCapped.WithLabelValues(c.Name).Set(map[bool]float64{true: 1}[capped])
	return &st
}

var capacityCapped = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "fleetinfer_hub_capacity_report_capped",
	Help: "1 while a cluster's ClusterCapacity report claims more accelerators than its Nodes allocate, so the hub places by the Nodes instead; else 0.",
}, []string{"cluster"})

func init() { ctrlmetrics.Registry.MustRegister(capacityCapped) }

// OCMDecided collects the clusters of an OCM Placement's decisions; empty
// when it decided none. An error (OCM not installed, the cache not readable)
// is returned as such, never as an empty set: an empty set would make every
// cluster ineligible.
func OCMDecided(ctx context.Context, hub client.Reader, ns, placementName string) (map[string]bool, error) {
	if hub == nil {
		return nil, fmt.Errorf("PlacementDecisions of OCM Placement %s/%s cannot be read: no hub client", ns, placementName)
	}
	var list clusterv1beta1.PlacementDecisionList
	if err := hub.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{clusterv1beta1.PlacementLabel: placementName}); err != nil {
		return nil, fmt.Errorf("PlacementDecisions of OCM Placement %s/%s cannot be read: %w", ns, placementName, err)
	}
	out := map[string]bool{}
	for _, d := range list.Items {
		for _, c := range d.Status.Decisions {
			out[c.ClusterName] = true
		}
	}
	return out, nil
}

// Fingerprint identifies the inputs of a decision: what of the placement
// and of the service concerns where replicas run (the placement's clusters,
// replica scheduling and accelerator; the service's replica count and
// accelerator need) and the eligible clusters. Capacity is left out, so
// capacity moving under a placed service does not move it; so is every
// other field, so that an image bump or a federation or rollout setting
// changes a service where it runs instead of placing it again by today's
// room (cold model loads, churn, and a reason for a spoke's inflated
// capacity report to draw replicas).
func Fingerprint(p *fleetv1alpha1.InferencePlacement, svc *v1alpha2.LLMInferenceService, eligible []string) string {
	return hash(struct {
		Placement  types.UID
		Clusters   fleetv1alpha1.ClusterAffinity
		MaxCluster *int32
		Replicas   fleetv1alpha1.ReplicaScheduling
		Service    types.UID
		Count      int32
		Need       Need
		Eligible   []string
	}{p.UID, p.Spec.Clusters, p.Spec.MaxClusters, p.Spec.Replicas, svc.UID, ptr.Deref(svc.Spec.Replicas, 1),
		NeedOf(svc, p.Spec.Accelerator), eligible})
}

// LegacyFingerprint is the fingerprint hubs up to v0.1.0 recorded (the
// placement's and the service's generations): a decision memory holding it
// is in force when it matches, so an upgraded hub re-records it instead of
// placing every service again.
func LegacyFingerprint(p *fleetv1alpha1.InferencePlacement, svc *v1alpha2.LLMInferenceService, eligible []string) string {
	return hash(struct {
		P, S     version
		Eligible []string
	}{version{p.UID, p.Generation}, version{svc.UID, svc.Generation}, eligible})
}

func hash(v any) string {
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// version identifies one generation of an object.
type version struct {
	UID        any
	Generation int64
}

// FederationMode is the placement's federation mode, Endpoint by default.
func FederationMode(p *fleetv1alpha1.InferencePlacement) fleetv1alpha1.FederationMode {
	if m := p.Spec.Federation.Mode; m != "" {
		return m
	}
	return fleetv1alpha1.FederationEndpoint
}

// MinPositive is the sooner of two requeue delays, 0 (none) being the
// latest.
func MinPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}
