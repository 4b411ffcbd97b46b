// Package crosscluster holds fleetinfer's scheduling plugins for a federated
// candidate set, where remote endpoints (from peer EPPs) sit next to local
// ones. Both plugins are configured in the EndpointPickerConfig like GIE's;
// the filter's parameters are those of the spill policy (package spill):
//
//	plugins:
//	- type: cross-cluster-filter
//	  parameters: {crossMargin: 20ms, serviceRate: 10, runningCost: 0.5, queueDepthThreshold: 5, kvCacheUtilThreshold: 0.8, maxRemoteCandidates: 16}
//	- type: cross-cluster-scorer
//	  parameters: {networkCost: 0.5, clusterCosts: {west: 0.3}}
//	schedulingProfiles:
//	- name: default
//	  plugins:
//	  - pluginRef: cross-cluster-filter
//	  - {pluginRef: cross-cluster-scorer, weight: 1}
//	  - ...GIE's scorers...
package crosscluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// FilterType is the plugin type of the spill policy's filter.
const FilterType = "cross-cluster-filter"

// Filter is the spill policy's plugin. The EPP's candidate lookup decides
// with the same policy, before scheduling, whether a request spills and
// which endpoints are then its candidates: the local ones, or the few remote
// ones expected to answer sooner by the policy's margin and within its caps
// (or, without local endpoints with fresh metrics, the remote ones expected
// soonest). The filter trims what it is given to the caps at scheduling
// time: remote endpoints past them (by then) are dropped, unless nothing
// else would remain. (With flow control on, GIE
// caches the lookup's candidates for up to 50 ms, and a spill decided stands
// that long.)
type Filter struct {
	name   string
	policy *spill.Policy
}

var _ fwksched.Filter = (*Filter)(nil)

// NewFilterFactory returns the filter's factory, which builds the spill
// policy from the filter's EndpointPickerConfig parameters. built, when not
// nil, receives every policy so built, so that the candidate lookup applies
// the filter's own policy.
func NewFilterFactory(built func(*spill.Policy)) fwkplugin.FactoryFunc {
	return func(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
		p := spill.DefaultParams
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &p); err != nil {
				return nil, fmt.Errorf("%s parameters: %w", FilterType, err)
			}
		}
		policy, err := spill.New(p, time.Now)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", FilterType, err)
		}
		if built != nil {
			built(policy)
		}
		return &Filter{name: name, policy: policy}, nil
	}
}

func (f *Filter) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: FilterType, Name: f.name}
}

func (f *Filter) Filter(_ context.Context, _ *fwksched.CycleState, _ *fwksched.LLMRequest, endpoints []fwksched.Endpoint) []fwksched.Endpoint {
	// Without a spill the candidate lookup adds no remote endpoint: pass the
	// candidates through without copying them.
	first := slices.IndexFunc(endpoints, isRemote)
	if first < 0 {
		return endpoints
	}
	kept := make([]fwksched.Endpoint, 0, len(endpoints))
	for _, ep := range endpoints {
		if !isRemote(ep) {
			kept = append(kept, ep)
		}
	}
	for _, ep := range endpoints[first:] {
		if isRemote(ep) && f.policy.HasRoom(ep) {
			kept = append(kept, ep)
		}
	}
	if len(kept) == 0 {
		// No local endpoint, and no remote one with headroom: all remain.
		return endpoints
	}
	return kept
}

// isRemote reports whether ep came from a peer EPP.
func isRemote(ep fwksched.Endpoint) bool { return federation.OriginOf(ep) != nil }
