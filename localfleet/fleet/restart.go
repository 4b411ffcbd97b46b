package fleet

import "context"

// RestartGateway stops spoke s's gateway, if it runs, and starts a new one
// in its place with the same address: a benchmark that loses a
// cluster, gateway included, brings it back for its next run.
func (f *Fleet) RestartGateway(ctx context.Context, s *Cluster) error {
	if s.Gateway != nil {
		s.Gateway.Stop()
		s.Gateway = nil
	}
	return f.startGateway(ctx, s, s.NetworkIndex)
}
