package epp

import (
	"context"
	"net"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	"github.com/fleetinfer/fleetinfer/epp/crossing"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// localPods lists the pool's pods in this cluster: GIE's datastore.
type localPods interface {
	PodList(func(fwkdl.Endpoint) bool) []fwkdl.Endpoint
}

// candidates is fleetinfer's candidate lookup, in place of GIE's
// DatastoreEndpointCandidates (requestcontrol/candidates.go), which reads
// the local datastore only and matches subset hints by IP alone.
//
//   - Without a subset hint, the candidates are the local endpoints plus the
//     fresh remote ones. With a spill policy (the cross-cluster-filter's),
//     they are the local endpoints, or, when the policy expects a remote
//     endpoint to answer sooner by its margin, the few remote endpoints
//     expected soonest instead; the filter plugin then only trims them.
//   - With a verified Parent-mode mark (another cluster's EPP forwarded the
//     request here; see package marks), the candidates are local only, so a
//     request crosses at most one cluster boundary and never bounces between
//     clusters: the local endpoints matching the mark's pods (IP and port)
//     when it names any and they exist, else all local endpoints when it
//     names none; when the named pods went away, the pool's failureMode
//     decides, as for a subset hint.
//   - With a subset hint (x-gateway-destination-endpoint-subset in metadata
//     namespace envoy.lb.subset_hint, set by a gateway's own configuration),
//     the candidates are the local endpoints matching a hinted ip:port (IP
//     and port; an entry without a port matches by IP, as in GIE). When no
//     hinted endpoint exists (the pod went away), the pool's failureMode
//     decides: FailOpen picks among all local endpoints, FailClose returns
//     none (503). An empty hint list means no candidates, as in GIE.
type candidates struct {
	ds localPods
	// remote holds the peers' endpoints; nil without federation.
	remote remoteEndpoints
	// spill decides when remote endpoints replace the local ones, and
	// which; nil (no cross-cluster-filter configured) admits every fresh
	// one next to the local ones.
	spill *spill.Policy
	// meter holds this picker's measurements of the pods it sends to, and
	// prefixes its record of the prompts it sent them, for the spill
	// policy's estimate.
	meter    *spill.Meter
	prefixes *prefixes.Index
	// failOpen reports the pool's failureMode.
	failOpen func(ctx context.Context) bool
	// crossings leaves out the remote clusters a request may not cross to
	// now (share, breaker); nil admits every one.
	crossings         *crossing.Gate
	disableSubsetHint bool
	now               func() time.Time
}

var _ contracts.EndpointCandidates = (*candidates)(nil)

// remoteEndpoints is what candidates need of the federation's store.
type remoteEndpoints interface {
	Remote(now time.Time) federation.Remote
}

func (c *candidates) Locate(ctx context.Context, md map[string]any) []fwkdl.Endpoint {
	if p := pickOf(ctx); p != nil && p.marked != nil {
		if pods := p.marked.PodList(); len(pods) > 0 {
			return c.hinted(ctx, pods)
		}
		return c.ds.PodList(datastore.AllPodsPredicate)
	}
	if !c.disableSubsetHint {
		if hint, ok := subsetHint(md); ok {
			return c.hinted(ctx, hint)
		}
	}
	local := c.ds.PodList(datastore.AllPodsPredicate)
	if c.remote == nil {
		return local
	}
	now := c.now()
	remote := c.remote.Remote(now)
	// The gate leaves out the clusters a request may not cross to now,
	// before the spill policy estimates the rest. Requests' lookups only:
	// the gate counts what it holds back and lets an open breaker's probe
	// through, neither of which a flow-control saturation probe is.
	if forRequest(ctx) {
		remote.Peers = c.crossings.Admitted(remote.Peers, now)
	}
	if c.spill == nil {
		c.observeLag(ctx, remote, now)
		return remote.AppendFresh(local)
	}
	var prompt spill.Prompt
	p := pickOf(ctx)
	if p != nil && c.prefixes != nil && c.spill.UsesPrefixes() {
		prompt = spill.Prompt{Hashes: p.promptOf(nil), Local: c.prefixes}
	}
	spilled, weighed := c.spill.Remote(local, remote, c.meter, prompt)
	if forRequest(ctx) {
		logSpill(ctx, weighed, len(spilled))
	}
	if len(spilled) == 0 {
		return local
	}
	if p != nil {
		p.spilled = spilled
	}
	c.observeLag(ctx, remote, now)
	return spilled
}

// logSpill logs, at GIE's debug verbosity, why a request stays or
// crosses: the estimates the spill policy weighed, in milliseconds (the
// local one absent when no local pod's load is known), how many remote
// endpoints became its candidates (0: it stays), and, when the policy read
// the remote endpoints, how many it read and why the others are no
// candidates (spill.Estimate).
func logSpill(ctx context.Context, weighed spill.Estimate, remoteCandidates int) {
	l := log.FromContext(ctx).V(logging.DEBUG)
	if !l.Enabled() {
		return
	}
	kv := []any{"remoteCandidates", remoteCandidates}
	if weighed.LocalKnown() {
		kv = append(kv, "localEstimateMs", milliseconds(weighed.Local))
	}
	if remoteCandidates > 0 {
		kv = append(kv, "remoteEstimateMs", milliseconds(weighed.Remote))
	}
	if weighed.Read > 0 {
		kv = append(kv, "remoteRead", weighed.Read, "remoteQueued", weighed.Queued, "remoteStale", weighed.Stale,
			"remoteCacheFull", weighed.CacheFull, "remoteSlower", weighed.Slower, "remoteUnconnected", weighed.Unconnected)
	}
	l.Info("Spill estimate", kv...)
}

func milliseconds(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// observeLag records the age of the remote data a request's pick reads;
// not for flow control's saturation probes.
func (c *candidates) observeLag(ctx context.Context, remote federation.Remote, now time.Time) {
	if forRequest(ctx) {
		remote.ObserveLag(now)
	}
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
		subsetHints.WithLabelValues("honoured").Inc()
		return matched
	case c.failOpen(ctx):
		subsetHints.WithLabelValues("fallback").Inc()
		return local
	}
	subsetHints.WithLabelValues("rejected").Inc()
	return nil
}
