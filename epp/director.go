package epp

import (
	"context"
	"slices"
	"strings"

	configPb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// The request path around GIE's Director, for remote picks: pickRecorder
// records a pick's endpoints, the director wrapper turns Parent-mode picks
// into the remote gateway's address, and the ext-proc stream wrapper adds
// the subset hint header to the headers response. The three share the
// request's pick (see pickKey).

// director wraps GIE's Director: after GIE's pick, targets in Parent-mode
// clusters are replaced by their cluster's gateway, and the pods become the
// subset hint. Endpoint-mode and local targets keep their ip:port.
type director struct {
	handlers.Director
}

func (d director) HandleRequest(ctx context.Context, reqCtx *handlers.RequestContext) (*handlers.RequestContext, error) {
	rc, err := d.Director.HandleRequest(ctx, reqCtx)
	p := pickOf(ctx)
	if err != nil || p == nil || len(p.targets) == 0 {
		return rc, err
	}
	primary := federation.OriginOf(p.targets[0])
	if primary == nil {
		localPicks.Inc()
	} else {
		picks.WithLabelValues("remote", primary.Cluster).Inc()
	}
	parent := slices.ContainsFunc(p.targets, func(t fwksched.Endpoint) bool {
		o := federation.OriginOf(t)
		return o != nil && o.Mode == fleetv1alpha1.FederationParent
	})
	if !parent {
		// GIE's destination, every target's ip:port, is already right.
		return rc, nil
	}
	dest := make([]string, 0, len(p.targets))
	var hint []string
	for _, t := range p.targets {
		addr := federation.PodAddress(t.GetMetadata())
		if o := federation.OriginOf(t); o != nil && o.Mode == fleetv1alpha1.FederationParent {
			hint = append(hint, addr)
			addr = o.Gateway
		}
		if !slices.Contains(dest, addr) {
			dest = append(dest, addr)
		}
	}
	// GIE writes the header and the envoy.lb metadata from TargetEndpoint
	// after this returns, so both carry the rewritten value.
	rc.TargetEndpoint = strings.Join(dest, ",")
	p.hint = strings.Join(hint, ",")
	return rc, nil
}

// extProcServer wraps GIE's StreamingServer: each stream gets its pick, and
// the request-headers response of a Parent-mode pick gets the subset hint
// header. GIE cannot set it itself: it strips that header from what it echoes
// because it is one of its own input headers.
type extProcServer struct {
	extProcPb.UnimplementedExternalProcessorServer
	inner extProcPb.ExternalProcessorServer
}

func (s extProcServer) Process(stream extProcPb.ExternalProcessor_ProcessServer) error {
	return s.inner.Process(&hintingStream{ExternalProcessor_ProcessServer: stream, ctx: withPick(stream.Context())})
}

type hintingStream struct {
	extProcPb.ExternalProcessor_ProcessServer
	ctx context.Context
}

func (s *hintingStream) Context() context.Context { return s.ctx }

func (s *hintingStream) Send(resp *extProcPb.ProcessingResponse) error {
	if h := resp.GetRequestHeaders().GetResponse().GetHeaderMutation(); h != nil {
		if p := pickOf(s.ctx); p != nil && p.hint != "" {
			h.SetHeaders = append(h.SetHeaders, &configPb.HeaderValueOption{
				Header:       &configPb.HeaderValue{Key: metadata.SubsetFilterKey, RawValue: []byte(p.hint)},
				AppendAction: configPb.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
			})
		}
	}
	return s.ExternalProcessor_ProcessServer.Send(resp)
}
