package epp

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"

	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/marks"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// pick is one request's scheduling outcome as fleetinfer needs it for
// remote picks.
type pick struct {
	// targets are the primary profile's endpoints, in order.
	targets []fwksched.Endpoint
	// marks are the headers a Parent-mode pick adds to the request.
	marks [][2]string
	// marked is the verified mark the request arrived with, nil without:
	// it is picked among local endpoints only.
	marked *marks.Mark
	// spilled are the remote endpoints the candidate lookup offered,
	// those the spill policy expects sooner than every local one.
	spilled []fwkdl.Endpoint
	// carried reports that the request arrived with mark headers, verified
	// or not; they are removed unless the pick sets its own.
	carried bool
	// crossed is the remote cluster of the primary target, "" for a local
	// pick, picked at pickedAt; observed reports that its outcome was
	// given to the crossing gate.
	crossed  string
	pickedAt time.Time
	observed bool
	// metered is the primary target while the meter counts the request in
	// flight there, since meteredAt, metering whether it does. A second
	// pick of the request (GIE picks again on each end of a request body a
	// stream carries) moves pickedAt but not meteredAt, by which the
	// request's end finds its start in the meter.
	metered   types.NamespacedName
	meteredAt time.Time
	metering  bool
	// request is GIE's context of the request, which the director wrapper
	// hands on before GIE parses the body into it; prompt is its prompt's
	// block hashes once computed (see promptOf).
	request *handlers.RequestContext
	prompt  []uint64
	hashed  bool
}

// promptOf returns the block hashes of the request's prompt (package
// prefixes), computed once per request, from the LLMRequest GIE parsed;
// nil before it did.
func (p *pick) promptOf(req *fwksched.LLMRequest) []uint64 {
	if p.hashed {
		return p.prompt
	}
	if req == nil && p.request != nil {
		req = p.request.SchedulingRequest
	}
	if req == nil || req.Body == nil {
		return nil
	}
	p.prompt, p.hashed = prefixes.Hashes(req.TargetModel, req.Body.PromptText()), true
	return p.prompt
}

// pickKey is the context key of a request's *pick, the one piece of
// per-request state fleetinfer adds to GIE's request path.
//
// extProcServer.Process puts a new *pick in the context of each ext-proc
// stream (one stream is one request), and GIE passes that context down to
// its Director, the candidate lookup and the plugins. Then, in order:
//
//   - markingStream, on the request headers, writes the verified mark;
//   - director, before GIE's, writes GIE's request context;
//   - candidates reads the mark, asks forRequest whether there is a pick,
//     and hashes the prompt GIE parsed into that context;
//   - pickRecorder (a PreRequest plugin) writes the targets, pickedAt and
//     crossed, starts the request in the meter and records a local
//     target's prompt blocks in the prefix index;
//   - director reads them, tells the crossing gate, and writes the marks;
//   - markingStream reads the marks into the request-headers response.
//
// A context without a *pick is not a request's: flow control's dispatch
// cycle calls the candidate lookup with its own context, to probe the pool's
// saturation, and no pick follows.
type pickKey struct{}

// withPick returns ctx carrying a new, empty pick.
func withPick(ctx context.Context) context.Context {
	return context.WithValue(ctx, pickKey{}, &pick{})
}

// pickOf returns the request's pick, nil outside a request (see pickKey).
func pickOf(ctx context.Context) *pick {
	p, _ := ctx.Value(pickKey{}).(*pick)
	return p
}

// forRequest reports whether a candidate lookup is for a request, as the
// Director's (and, for sheddable requests, legacy admission's) are, rather
// than a flow-control probe (see pickKey).
func forRequest(ctx context.Context) bool { return pickOf(ctx) != nil }

// pickRecorderType is the PreRequest plugin the runner adds before the
// configured ones; it is internal and not configurable.
const pickRecorderType = "fleetinfer-pick-recorder"

// pickRecorder records the primary profile's targets in the request's
// pick, with when it was picked and the primary target's cluster, the
// request's start and end at its primary target in the spill policy's
// meter (nil: none), and its prompt's blocks as held by a local primary
// target in the prefix index (nil: none).
type pickRecorder struct {
	meter    *spill.Meter
	prefixes *prefixes.Index
}

var (
	_ requestcontrol.PreRequest   = pickRecorder{}
	_ requestcontrol.ResponseBody = pickRecorder{}
)

func (pickRecorder) TypedName() fwkplugin.TypedName {
	return fwkplugin.TypedName{Type: pickRecorderType, Name: pickRecorderType}
}

func (r pickRecorder) PreRequest(ctx context.Context, req *fwksched.LLMRequest, result *fwksched.SchedulingResult) {
	p := pickOf(ctx)
	if p == nil || result == nil {
		return
	}
	if pr := result.ProfileResults[result.PrimaryProfileName]; pr != nil {
		p.targets = pr.TargetEndpoints
	}
	if len(p.targets) == 0 {
		return
	}
	p.pickedAt, p.crossed = time.Now(), ""
	if o := federation.OriginOf(p.targets[0]); o != nil {
		p.crossed = o.Cluster
		r.meter.CrossedAt(federation.NextHop(o, p.targets[0].GetMetadata()), p.pickedAt)
	} else if r.prefixes != nil {
		r.prefixes.Record(p.targets[0].GetMetadata().NamespacedName, p.promptOf(req))
	}
	if r.meter == nil || p.metering {
		return
	}
	p.metered, p.meteredAt, p.metering = p.targets[0].GetMetadata().NamespacedName, p.pickedAt, true
	r.meter.Started(p.metered, p.meteredAt)
}

// ResponseBody times a request that completed. GIE also calls it, with a
// context of its own, for a request that ended otherwise; that one has no
// pick, and extProcServer ends it in the meter without a time.
func (r pickRecorder) ResponseBody(ctx context.Context, _ *fwksched.LLMRequest, resp *requestcontrol.Response, _ *fwkdl.EndpointMetadata) {
	if p := pickOf(ctx); p != nil && resp != nil && resp.EndOfStream {
		r.finish(p, true)
	}
}

// finish ends p's request in the meter, as a sample of the pod's service
// time when it completed on a local pod.
func (r pickRecorder) finish(p *pick, completed bool) {
	if r.meter == nil || !p.metering {
		return
	}
	r.meter.Finished(p.metered, p.meteredAt, completed && p.crossed == "")
	p.metering = false
}
