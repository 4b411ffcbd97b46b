package placement

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// The EndpointMode condition of an InferencePlacement that asks for
// Endpoint mode: whether its services' pickers can use it between every
// pair of clusters a service runs in.
const (
	ConditionEndpointMode      = "EndpointMode"
	ReasonPodNetworksShared    = "PodNetworksShared"
	ReasonPodNetworksNotShared = "PodNetworksNotShared"
)

// maxPairsNamed bounds the pairs a condition message names.
const maxPairsNamed = 10

// endpointModeCondition judges a placement that asks for mode, given the
// clusters each of its federated services runs in and every cluster's
// registration labels: nil when Endpoint mode is not asked; else True when
// every pair of clusters that run a service together shares a pod network,
// False naming the pairs that do not, between which the hub publishes
// Parent mode instead (fleetv1alpha1.PeerMode).
func endpointModeCondition(mode fleetv1alpha1.FederationMode, services [][]string, labels map[string]map[string]string) *metav1.Condition {
	if mode != fleetv1alpha1.FederationEndpoint {
		return nil
	}
	type pair struct{ a, b string }
	apart := map[pair]bool{}
	for _, clusters := range services {
		clusters = slices.Sorted(slices.Values(clusters))
		for i, a := range clusters {
			for _, b := range clusters[i+1:] {
				if fleetv1alpha1.PeerMode(mode, labels[a], labels[b]) != fleetv1alpha1.FederationEndpoint {
					apart[pair{a, b}] = true
				}
			}
		}
	}
	if len(apart) == 0 {
		return &metav1.Condition{Type: ConditionEndpointMode, Status: metav1.ConditionTrue, Reason: ReasonPodNetworksShared,
			Message: fmt.Sprintf("Endpoint mode is used: every pair of clusters that run a service together carries the same %s label", fleetv1alpha1.PodNetworkLabel)}
	}
	pairs := make([]string, 0, len(apart))
	for p := range apart {
		pairs = append(pairs, p.a+" and "+p.b)
	}
	slices.Sort(pairs)
	named := strings.Join(pairs[:min(len(pairs), maxPairsNamed)], ", ")
	if len(pairs) > maxPairsNamed {
		named += fmt.Sprintf(" and %d more pairs", len(pairs)-maxPairsNamed)
	}
	return &metav1.Condition{Type: ConditionEndpointMode, Status: metav1.ConditionFalse, Reason: ReasonPodNetworksNotShared,
		Message: fmt.Sprintf("Parent mode is used between %s: Endpoint mode needs pod addresses routable between two clusters, "+
			"which the hub assumes only when both registrations carry the same non-empty %s label", named, fleetv1alpha1.PodNetworkLabel)}
}
