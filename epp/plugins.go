package epp

import (
	"fmt"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/fleetinfer/fleetinfer/epp/plugins/crosscluster"
	"github.com/fleetinfer/fleetinfer/epp/plugins/inflight"
	"github.com/fleetinfer/fleetinfer/epp/plugins/metricsource"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// registerPlugins registers fleetinfer's plugin types; the runner does so
// after GIE's in-tree ones (gierunner.RegisterInTreePlugins). The
// metrics-data-source replaces GIE's (package metricsource). The
// cross-cluster-filter's factory records the spill policy it builds in
// policy, for the candidate lookup.
func registerPlugins(policy *spillPolicy) {
	fwkplugin.Register(crosscluster.FilterType, crosscluster.NewFilterFactory(policy.record))
	fwkplugin.Register(crosscluster.ScorerType, crosscluster.ScorerFactory)
	fwkplugin.Register(inflight.ScorerType, inflight.ScorerFactory)
	fwkplugin.Register(sourcemetrics.MetricsDataSourceType, metricsource.Factory)
}

// spillPolicy is the spill policy of the configuration's
// cross-cluster-filter, as its factory built it while GIE instantiated the
// configuration: the candidate lookup applies that same policy.
type spillPolicy struct {
	policy  *spill.Policy
	filters int
}

func (s *spillPolicy) record(p *spill.Policy) {
	s.policy = p
	s.filters++
}

// get returns the policy, nil when no cross-cluster-filter is configured.
// The candidate lookup applies one policy, so the configuration may hold
// at most one cross-cluster-filter.
func (s *spillPolicy) get() (*spill.Policy, error) {
	if s.filters > 1 {
		return nil, fmt.Errorf("%d %s plugins configured; the candidate lookup applies one spill policy, so configure one",
			s.filters, crosscluster.FilterType)
	}
	return s.policy, nil
}
