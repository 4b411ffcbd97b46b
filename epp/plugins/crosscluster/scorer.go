package crosscluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// ScorerType is the cross-cluster scorer's plugin type.
const ScorerType = "cross-cluster-scorer"

// ScorerParams are the scorer's parameters.
type ScorerParams struct {
	// NetworkCost is what a remote endpoint is charged, from 0 (free) to 1:
	// it scores 1-NetworkCost where a local endpoint scores 1.
	NetworkCost float64 `json:"networkCost"`
	// ClusterCosts override NetworkCost per remote cluster.
	ClusterCosts map[string]float64 `json:"clusterCosts,omitempty"`
}

// DefaultScorerParams are used for parameters left out.
var DefaultScorerParams = ScorerParams{NetworkCost: 0.5}

// Scorer charges remote endpoints a network cost, so that with the scorer's
// weight next to GIE's load scorers a remote endpoint wins only when it is
// enough less loaded to pay for the extra hop.
type Scorer struct {
	name   string
	params ScorerParams
}

var _ fwksched.Scorer = (*Scorer)(nil)

// ScorerFactory builds the scorer from its EndpointPickerConfig parameters.
func ScorerFactory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	p := DefaultScorerParams
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s parameters: %w", ScorerType, err)
		}
	}
	if err := validCost("networkCost", p.NetworkCost); err != nil {
		return nil, err
	}
	for cluster, c := range p.ClusterCosts {
		if err := validCost("clusterCosts."+cluster, c); err != nil {
			return nil, err
		}
	}
	return &Scorer{name: name, params: p}, nil
}

func validCost(what string, c float64) error {
	if !(c >= 0 && c <= 1) {
		return fmt.Errorf("%s: %s must be between 0 and 1, not %v", ScorerType, what, c)
	}
	return nil
}

func (s *Scorer) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: ScorerType, Name: s.name}
}

// Category is Affinity: the scorer prefers endpoints where the request
// already is (the local cluster).
func (s *Scorer) Category() fwksched.ScorerCategory { return fwksched.Affinity }

// Score scores nothing when every candidate is local, as without a spill:
// they would all score 1, which changes no max-score or random pick, and
// GIE's scheduling cycle then spares a pass over every candidate for this
// scorer. (A weighted-random picker then weighs local candidates by the
// other scorers alone.)
func (s *Scorer) Score(_ context.Context, _ *fwksched.CycleState, _ *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	if !slices.ContainsFunc(endpoints, isRemote) {
		return nil
	}
	scores := make(map[fwksched.Endpoint]float64, len(endpoints))
	for _, ep := range endpoints {
		o := federation.OriginOf(ep)
		if o == nil {
			scores[ep] = 1
			continue
		}
		cost, ok := s.params.ClusterCosts[o.Cluster]
		if !ok {
			cost = s.params.NetworkCost
		}
		scores[ep] = 1 - cost
	}
	return scores
}
