package fleet

import (
	"context"
	"net/netip"

	"github.com/fleetinfer/fleetinfer/localfleet/gateway"
)

// RestartGateway stops spoke s's gateway, if it runs, and starts a new one
// in its place with the same address and peers: a benchmark that loses a
// cluster, gateway included, brings it back for its next run.
func (f *Fleet) RestartGateway(ctx context.Context, s *Cluster) error {
	if s.Gateway != nil {
		s.Gateway.Stop()
		s.Gateway = nil
	}
	var peers []netip.AddrPort
	for _, o := range f.Spokes {
		if o != s {
			peers = append(peers, netip.AddrPortFrom(GatewayAddress(o.NetworkIndex), gateway.DefaultPeerPort))
		}
	}
	return f.startGateway(ctx, s, s.NetworkIndex, peers)
}
