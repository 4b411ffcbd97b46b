package epp

import (
	"context"
	"net"
	"time"

	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// candidates is fleetinfer's replacement for GIE's
// DatastoreEndpointCandidates (requestcontrol/candidates.go), the one place
// the runner had to change: GIE's runner builds its candidate lookup from
// the local datastore only, and matches subset hints by IP alone.
//
//   - Without a subset hint, the candidates are the local endpoints plus the
//     fresh remote ones. With the cross-cluster filter configured, remote
//     endpoints are added only once no local endpoint has headroom (the
//     filter would drop them anyway), and then only the least loaded few,
//     next to the least loaded few local ones.
//   - With a hint (x-gateway-destination-endpoint-subset in metadata
//     namespace envoy.lb.subset_hint), the candidates are the local
//     endpoints matching a hinted ip:port (IP and port; an entry without a
//     port matches by IP, as in GIE). Hinted requests never leave the cluster:
//     they were sent here by another cluster's EPP (Parent mode), and going on
//     elsewhere could bounce a request between clusters. When no hinted
//     endpoint exists (the pod went away), the pool's failureMode decides:
//     FailOpen picks among all local endpoints, FailClose returns none (503).
//   - An empty hint list means no candidates, as in GIE.
type candidates struct {
	ds interface {
		PodList(func(fwkdl.Endpoint) bool) []fwkdl.Endpoint
	}
	// remote holds the peers' endpoints; nil without federation.
	remote remoteEndpoints
	// gate picks the remote endpoints that join the local ones (the
	// cross-cluster filter); nil admits every fresh one.
	gate interface {
		LocalSaturated(local []fwkdl.Endpoint) bool
		RemoteCandidates(local []fwkdl.Endpoint, remote federation.Remote) []fwkdl.Endpoint
		LocalCandidates(local []fwkdl.Endpoint) []fwkdl.Endpoint
	}
	// failOpen reports the pool's failureMode.
	failOpen          func(ctx context.Context) bool
	disableSubsetHint bool
	now               func() time.Time
}

var _ contracts.EndpointCandidates = (*candidates)(nil)

// remoteEndpoints is what candidates need of the federation's store.
type remoteEndpoints interface {
	Remote(now time.Time) federation.Remote
}

func (c *candidates) Locate(ctx context.Context, md map[string]any) []fwkdl.Endpoint {
	if !c.disableSubsetHint {
		if hint, ok := subsetHint(md); ok {
			return c.hinted(ctx, hint)
		}
	}
	local := c.ds.PodList(datastore.AllPodsPredicate)
	if c.remote == nil || (c.gate != nil && !c.gate.LocalSaturated(local)) {
		return local
	}
	now := c.now()
	remote := c.remote.Remote(now)
	// Lag is recorded for picks only (the director's lookups), not for flow
	// control's saturation checks.
	if pickFrom(ctx) != nil {
		remote.ObserveLag(now)
	}
	if c.gate == nil {
		return remote.AppendFresh(local)
	}
	spill := c.gate.RemoteCandidates(local, remote)
	if len(spill) == 0 {
		return local
	}
	return append(c.gate.LocalCandidates(local), spill...)
}

// subsetHint returns the hinted endpoints when the request carries a hint.
func subsetHint(md map[string]any) ([]string, bool) {
	ns, ok := md[metadata.SubsetFilterNamespace].(map[string]any)
	if !ok {
		return nil, false
	}
	list, ok := ns[metadata.SubsetFilterKey].([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, 0, len(list))
	for _, v := range list {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out, true
}

func (c *candidates) hinted(ctx context.Context, hint []string) []fwkdl.Endpoint {
	if len(hint) == 0 {
		return nil
	}
	exact := make(map[string]bool, len(hint))
	ipOnly := map[string]bool{}
	for _, h := range hint {
		if host, port, err := net.SplitHostPort(h); err == nil {
			exact[net.JoinHostPort(host, port)] = true
		} else {
			ipOnly[h] = true
		}
	}
	local := c.ds.PodList(datastore.AllPodsPredicate)
	var matched []fwkdl.Endpoint
	for _, ep := range local {
		md := ep.GetMetadata()
		if md != nil && (exact[federation.PodAddress(md)] || ipOnly[md.GetIPAddress()]) {
			matched = append(matched, ep)
		}
	}
	switch {
	case len(matched) > 0:
		federation.SubsetHints.WithLabelValues("honoured").Inc()
		return matched
	case c.failOpen(ctx):
		federation.SubsetHints.WithLabelValues("fallback").Inc()
		return local
	}
	federation.SubsetHints.WithLabelValues("rejected").Inc()
	return nil
}
