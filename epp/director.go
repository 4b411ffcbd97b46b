package epp

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	errcommon "sigs.k8s.io/gateway-api-inference-extension/pkg/common/error"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/crossing"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// responseStatus is the :status of response headers, 0 when absent.
func responseStatus(h *corev3.HeaderMap) int {
	for _, hv := range h.GetHeaders() {
		if hv.GetKey() == ":status" {
			n, _ := strconv.Atoi(headerValue(hv))
			return n
		}
	}
	return 0
}

// headerValue is a header's value, which Envoy sends as raw bytes or, from
// older configurations, as a string.
func headerValue(hv *corev3.HeaderValue) string {
	if raw := hv.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return hv.GetValue()
}

// The request path around GIE's Director, for remote picks: the stream
// wrapper verifies the Parent-mode marks a request arrives with (which keep
// its pick local, see candidates), pickRecorder records a pick's endpoints,
// the director wrapper turns Parent-mode picks into the remote gateway's
// address and signs the marks, and the stream wrapper adds them to the
// headers response. They share the request's pick (see pickKey).

// director wraps GIE's Director: after GIE's pick, targets in Parent-mode
// clusters are replaced by their cluster's gateway, and the pods go into
// the signed marks. Endpoint-mode and local targets keep their ip:port.
type director struct {
	handlers.Director
	marker    *marker
	crossings *crossing.Gate
}

func (d director) HandleRequest(ctx context.Context, reqCtx *handlers.RequestContext) (*handlers.RequestContext, error) {
	p := pickOf(ctx)
	if p != nil {
		p.request = reqCtx
	}
	rc, err := d.Director.HandleRequest(ctx, reqCtx)
	if err != nil || p == nil || len(p.targets) == 0 {
		return rc, err
	}
	if p.crossed == "" {
		localPicks.Inc()
	} else {
		picks.WithLabelValues("remote", p.crossed).Inc()
	}
	d.crossings.Picked(p.crossed, p.pickedAt)
	parent := slices.ContainsFunc(p.targets, func(t fwksched.Endpoint) bool {
		o := federation.OriginOf(t)
		return o != nil && o.Mode == fleetv1alpha1.FederationParent
	})
	if !parent || p.marked != nil {
		// GIE's destination, every target's ip:port, is already right. (A
		// marked request has local candidates only.)
		return rc, nil
	}
	dest := make([]string, 0, len(p.targets))
	var pods []string
	for _, t := range p.targets {
		o := federation.OriginOf(t)
		if o != nil && o.Mode == fleetv1alpha1.FederationParent {
			pods = append(pods, federation.PodAddress(t.GetMetadata()))
		}
		if addr := federation.NextHop(o, t.GetMetadata()); !slices.Contains(dest, addr) {
			dest = append(dest, addr)
		}
	}
	pods = appendClusterPeers(pods, p.spilled, p.crossed)
	if p.marks, err = d.marker.sign(strings.Join(pods, ",")); err != nil {
		// Unmarked, the request would be picked afresh there and could
		// come back: refuse it instead.
		return rc, errcommon.Error{Code: errcommon.Internal, Msg: "Parent-mode marks: " + err.Error()}
	}
	// GIE writes the header and the envoy.lb metadata from TargetEndpoint
	// after this returns, so both carry the rewritten value.
	rc.TargetEndpoint = strings.Join(dest, ",")
	return rc, nil
}

// appendClusterPeers appends to pods, the picked ones, the other Parent-mode
// endpoints of cluster among the spilled candidates. The marks then name
// every pod of that cluster the spill policy expected sooner than the local
// ones, picked first, and the cluster's own picker chooses among them: its
// data on its pods is fresher than the federation's, and every request to
// them, from any cluster, passes it (a pod that filled up since the peer
// last published is passed over there rather than queued on).
func appendClusterPeers(pods []string, spilled []fwkdl.Endpoint, cluster string) []string {
	for _, ep := range spilled {
		o := federation.OriginOf(ep.GetAttributes())
		if o == nil || o.Cluster != cluster || o.Mode != fleetv1alpha1.FederationParent {
			continue
		}
		if addr := federation.PodAddress(ep.GetMetadata()); !slices.Contains(pods, addr) {
			pods = append(pods, addr)
		}
	}
	return pods
}

// extProcServer wraps GIE's StreamingServer: each stream's request body is
// bounded (requestlimits.go), each stream gets its pick, the request's marks
// are verified when its headers arrive, and the request-headers response
// carries a Parent-mode pick's marks and a destination no client header can
// add to.
type extProcServer struct {
	extProcPb.UnimplementedExternalProcessorServer
	inner     extProcPb.ExternalProcessorServer
	marker    *marker
	crossings *crossing.Gate
	limits    *RequestLimits
	recorder  pickRecorder
}

func (s extProcServer) Process(stream extProcPb.ExternalProcessor_ProcessServer) error {
	limited := newLimitedStream(stream, s.limits)
	defer limited.done()
	ms := &markingStream{ExternalProcessor_ProcessServer: limited, ctx: withPick(stream.Context()), marker: s.marker, crossings: s.crossings, meter: s.recorder.meter}
	err := s.inner.Process(ms)
	p := pickOf(ms.ctx)
	// A request that did not complete (an error, a client that went away)
	// still leaves the meter's count of requests in flight.
	s.recorder.finish(p, false)
	// A crossed request whose stream ends before its response headers came
	// back got no response: a failure of the crossing (or a client that
	// gave up, which cannot be told apart here).
	if p.crossed != "" && !p.observed {
		s.crossings.Observe(p.crossed, true, time.Since(p.pickedAt), time.Now())
	}
	return err
}

type markingStream struct {
	extProcPb.ExternalProcessor_ProcessServer
	ctx       context.Context
	marker    *marker
	crossings *crossing.Gate
	meter     *spill.Meter
}

func (s *markingStream) Context() context.Context { return s.ctx }

func (s *markingStream) Recv() (*extProcPb.ProcessingRequest, error) {
	req, err := s.ExternalProcessor_ProcessServer.Recv()
	if h := req.GetRequestHeaders(); err == nil && h != nil {
		if p := pickOf(s.ctx); p != nil {
			s.marker.read(s.ctx, h.GetHeaders(), p)
		}
	}
	if h := req.GetResponseHeaders(); err == nil && h != nil {
		if p := pickOf(s.ctx); p.crossed != "" && !p.observed {
			p.observed = true
			took, failed := time.Since(p.pickedAt), responseStatus(h.GetHeaders()) >= 500
			s.crossings.Observe(p.crossed, failed, took, time.Now())
			// The crossing's own cost is known only where the other
			// cluster's picker said how long the request took after its
			// pick (servertiming.go); an Endpoint-mode crossing's stays the
			// link's round trip.
			if upstream, ok := upstreamTiming(h.GetHeaders()); ok && !failed && s.meter != nil && upstream < took {
				s.meter.Crossed(p.crossed, took-upstream)
				crossingPath.WithLabelValues(p.crossed).Set(s.meter.Path(p.crossed).Seconds())
			}
		}
	}
	return req, err
}

func (s *markingStream) Send(resp *extProcPb.ProcessingResponse) error {
	// A peer's request tells the peer how long it took here after the pick.
	if h := resp.GetResponseHeaders(); h != nil {
		if p := pickOf(s.ctx); p != nil && p.marked != nil && !p.pickedAt.IsZero() {
			addUpstreamTiming(h, time.Since(p.pickedAt))
		}
	}
	if h := resp.GetRequestHeaders().GetResponse().GetHeaderMutation(); h != nil {
		replaceDestination(h)
		if p := pickOf(s.ctx); p != nil {
			markMutation(h, p)
		}
	}
	return s.ExternalProcessor_ProcessServer.Send(resp)
}

// replaceDestination makes the picker's destination header replace any the
// request carries. GIE sets it with the default append action, under which
// a client's own x-gateway-destination-endpoint would stay in front of the
// picker's value for a gateway that does not strip it (deploy/envoy does).
// The subset hint is metadata the gateway sets, never a header GIE reads.
func replaceDestination(h *extProcPb.HeaderMutation) {
	for _, o := range h.GetSetHeaders() {
		if strings.EqualFold(o.GetHeader().GetKey(), metadata.DestinationEndpointKey) {
			o.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		}
	}
}
