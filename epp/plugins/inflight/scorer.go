// Package inflight scores endpoints by the requests this EPP has sent them
// and not yet seen finish, as counted by GIE's inflight-load-producer. Model
// servers' metrics are scraped every 50 ms or so; between two scrapes every
// pick sees the same numbers, so a burst of picks lands on the endpoint that
// looked emptiest. The picker's own count is exact and current for its own
// traffic, and breaks those ties:
//
//	plugins:
//	- type: inflight-load-producer
//	- type: in-flight-requests-scorer
//	schedulingProfiles:
//	- name: default
//	  plugins:
//	  - {pluginRef: in-flight-requests-scorer, weight: 2}
package inflight

import (
	"context"
	"encoding/json"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrconcurrency "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/concurrency"
)

// ScorerType is the scorer's plugin type.
const ScorerType = "in-flight-requests-scorer"

// Scorer scores each candidate by its requests in flight from this EPP,
// relative to the candidates': the fewest score 1, the most 0.
//
// It reads the InFlightLoad attribute that GIE's inflight-load-producer puts
// on every candidate before scheduling, but does not declare it as consumed:
// GIE v1.5.0 checks a consumer against a producer by comparing the sample
// values they declare, and both declare a fresh *InFlightLoad, so the
// pointers never match and the EPP refuses the configuration (that is why
// GIE's own token-load-scorer cannot be used with the producer either). The
// producer runs in the request-control layer, before any scorer, so the
// order the check would enforce holds anyway.
type Scorer struct {
	name string
}

var _ fwksched.Scorer = (*Scorer)(nil)

// ScorerFactory builds the scorer; it takes no parameters.
func ScorerFactory(name string, _ json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	return &Scorer{name: name}, nil
}

func (s *Scorer) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: ScorerType, Name: s.name}
}

// Category is Distribution: the scorer spreads requests.
func (s *Scorer) Category() fwksched.ScorerCategory { return fwksched.Distribution }

// Score returns nil when no candidate has requests in flight from this EPP:
// all would score alike. An endpoint without the attribute (no producer
// configured) counts as having none.
func (s *Scorer) Score(_ context.Context, _ *fwksched.CycleState, _ *fwksched.LLMRequest, endpoints []fwksched.Endpoint) map[fwksched.Endpoint]float64 {
	counts := make([]int64, len(endpoints))
	lo, hi := int64(-1), int64(0)
	for i, ep := range endpoints {
		counts[i] = inFlight(ep)
		hi = max(hi, counts[i])
		if lo < 0 || counts[i] < lo {
			lo = counts[i]
		}
	}
	if hi == lo {
		return nil
	}
	scores := make(map[fwksched.Endpoint]float64, len(endpoints))
	for i, ep := range endpoints {
		scores[ep] = float64(hi-counts[i]) / float64(hi-lo)
	}
	return scores
}

func inFlight(ep fwksched.Endpoint) int64 {
	v, ok := ep.Get(attrconcurrency.InFlightLoadKey)
	if !ok {
		return 0
	}
	if l, ok := v.(*attrconcurrency.InFlightLoad); ok {
		return max(l.Requests, 0)
	}
	return 0
}
