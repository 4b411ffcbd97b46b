package epp

import (
	"fmt"

	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"

	"github.com/fleetinfer/fleetinfer/epp/plugins/crosscluster"
	"github.com/fleetinfer/fleetinfer/epp/plugins/inflight"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// registerPlugins registers fleetinfer's plugin types; the runner does so
// after GIE's in-tree ones (gierunner.RegisterInTreePlugins). The
// cross-cluster-filter's factory records the spill policy it builds in
// policy, for the candidate lookup.
func registerPlugins(policy *spillPolicy) {
	fwkplugin.Register(crosscluster.FilterType, crosscluster.NewFilterFactory(policy.record))
	fwkplugin.Register(crosscluster.ScorerType, crosscluster.ScorerFactory)
	fwkplugin.Register(inflight.ScorerType, inflight.ScorerFactory)
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
