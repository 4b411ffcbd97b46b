// Package epp is fleetinfer's endpoint picker: GIE v1.5.0's EPP (flags,
// EndpointPickerConfig, in-tree plugins, flow control, ext-proc server,
// health and metrics as GIE users know them) with federation: the EPPs of a
// pool in different clusters stream their pods' state to each other, and
// each picks among local and remote pods.
//
// # Composition
//
// GIE's runner cannot be extended from outside where federation needs it:
// it builds the candidate lookup from the local datastore only and hands the
// ext-proc server its own concrete Director. So internal/gierunner holds a
// copy of its setup, with hooks, and this package is fleetinfer's delta on
// it (runner.go):
//
//  1. the candidate lookup (candidates.go) adds fresh remote endpoints and
//     matches subset hints and marked pods by IP and port, with the pool's
//     failureMode deciding what happens to a hint whose pod is gone. With a
//     cross-cluster-filter configured (default-config.yaml, the shipped
//     profile), the spill policy (package spill, built once by the plugin's
//     factory and shared) estimates each endpoint's time to first token
//     from its load, the round trip to its cluster and the prompt's
//     uncached prefill (package prefixes: this picker's record of its own
//     pods, peers' summaries of theirs); remote endpoints join a pick only
//     when one is expected sooner than the best local endpoint by a margin,
//     and then only those within that margin of the soonest. Package
//     crossing's share cap and per-cluster breaker decide which clusters a
//     pick may cross to at all; the plugin (plugins/crosscluster) then only
//     trims;
//  2. the ext-proc server's Director is wrapped (director.go) to send
//     Parent-mode picks to the remote gateway with signed marks (package
//     marks, parentmarks.go), and its stream to verify the marks a request
//     arrives with, which keep its pick local; the wrappers share the
//     request's pick (pick.go), and the stream bounds the request bodies it
//     holds (requestlimits.go); a request a peer marked reports back, in a
//     Server-Timing header, how long it took here after the pick, so the
//     origin learns what its crossings cost (servertiming.go);
//  3. the federation server and subscriptions (peering.go, package
//     federation) run next to GIE's servers, and so does the loop that
//     forgets the pods that went away (gonepods.go);
//  4. fleetinfer's plugins (plugins.go: plugins/crosscluster,
//     plugins/inflight) are registered next to GIE's, and its metrics
//     (metrics.go) next to GIE's.
//
// # Peer directory
//
// The peers come from a file (--federation-peers-file), YAML or JSON,
// reloaded when it changes:
//
//	peers:
//	- cluster: west                         # the peer's cluster name
//	  pool: {namespace: llm, name: llama}   # optional: only for this pool
//	  federationAddress: 10.1.0.7:9004      # the peer EPP's federation server
//	  gatewayAddress: 10.1.0.9:80           # the peer cluster's gateway (Parent mode)
//	  identity: spiffe://fleet.example/west/epp  # URI or DNS SAN of its certificate
//	  mode: Parent                          # optional, default --federation-mode
//
// An EPP takes the entries of its pool (and those without a pool) except its
// own cluster's (--federation-cluster). It subscribes to each, and serves
// only the identities listed. The format is PeerDirectory in apis/fleet/v1alpha1.
package epp

import (
	"context"
	_ "embed"
	"os"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"

	"github.com/fleetinfer/fleetinfer/epp/crossing"
	"github.com/fleetinfer/fleetinfer/epp/internal/gierunner"
	"github.com/fleetinfer/fleetinfer/epp/spill"
	"github.com/fleetinfer/fleetinfer/internal/memlimit"
)

//go:embed default-config.yaml
var defaultConfig []byte

// DefaultConfig is the EndpointPickerConfig the EPP runs when none is given.
func DefaultConfig() string { return string(defaultConfig) }

var setupLog = ctrl.Log.WithName("setup")

// Runner runs fleetinfer's EPP: GIE's runner (internal/gierunner) with
// fleetinfer's delta.
type Runner struct {
	gie *gierunner.Runner
	fed *FederationOptions
	// spill is the configured cross-cluster-filter's spill policy, recorded
	// by the plugin's factory while GIE instantiates the configuration.
	spill *spillPolicy
	// marker signs and verifies Parent-mode marks; built with the
	// candidate lookup, before the ext-proc server; nil without federation.
	marker *marker
	// meter measures the pods this picker sends to for the spill policy;
	// recorder times each request there and, with federation, records its
	// prompt in the federation's prefix record.
	meter    *spill.Meter
	recorder *pickRecorder
	// crossings bounds each remote cluster's share of picks and breaks
	// crossings to failing ones; built with marker, nil without federation.
	crossings *crossing.Gate
	// limits bound the ext-proc server and the request bodies it holds.
	limits *RequestLimits
}

// NewRunner returns a runner whose flags are GIE's, fleetinfer's federation
// flags and --kubeconfig, all on the global pflag command line (GIE's
// runner parses that one too).
func NewRunner() *Runner {
	r := &Runner{fed: NewFederationOptions(), spill: &spillPolicy{}, meter: spill.NewMeter(), limits: NewRequestLimits()}
	r.recorder = &pickRecorder{meter: r.meter}
	r.gie = gierunner.New(gierunner.Delta{
		ExecutableName:        "fleetinfer-epp",
		DefaultConfig:         defaultConfig,
		AddFlags:              r.addFlags,
		FlagsParsed:           r.flagsParsed,
		RegisterPlugins:       func() { registerPlugins(r.spill) },
		RequestControlPlugins: []fwkplugin.Plugin{r.recorder},
		Collectors:            MetricCollectors(),
		Candidates:            r.candidates,
		ExtProcServer: func(ds handlers.Datastore, gie handlers.Director, parser fwkrh.Parser) extProcPb.ExternalProcessorServer {
			return newExtProcServer(ds, gie, parser, r.marker, r.crossings, *r.recorder, r.limits)
		},
		ExtProcServerOptions: func() []grpc.ServerOption { return r.limits.ServerOptions() },
	})
	return r
}

// Run parses the command line and runs the EPP until ctx ends.
func (r *Runner) Run(ctx context.Context) error { return r.gie.Run(ctx) }

func (r *Runner) addFlags(fs *pflag.FlagSet) {
	if fs.Lookup("kubeconfig") == nil {
		fs.Var(kubeconfigFlag{}, "kubeconfig", "Path to a kubeconfig. Defaults to $KUBECONFIG, then the in-cluster configuration.")
	}
	r.fed.AddFlags(fs)
	r.limits.AddFlags(fs)
}

// flagsParsed sets the runtime's soft memory limit from the container's
// (package memlimit), which the request limits' memory bound relies on, and
// checks fleetinfer's flags. It runs once GIE has set up its setup log, so
// that the limit is logged where an operator looks for start-up settings.
func (r *Runner) flagsParsed() error {
	if soft, ok := memlimit.FromContainer(); ok {
		setupLog.Info("Soft memory limit set from the container's memory limit", "bytes", soft, "share", memlimit.Share)
	}
	if err := r.fed.Validate(); err != nil {
		setupLog.Error(err, "Failed to validate federation flags")
		return err
	}
	if err := r.limits.Validate(); err != nil {
		setupLog.Error(err, "Failed to validate request limits")
		return err
	}
	return nil
}

// GIE's runner reads the API server address through controller-runtime,
// which honours $KUBECONFIG only; the flag sets that variable.
type kubeconfigFlag struct{}

func (kubeconfigFlag) String() string     { return os.Getenv("KUBECONFIG") }
func (kubeconfigFlag) Set(v string) error { return os.Setenv("KUBECONFIG", v) }
func (kubeconfigFlag) Type() string       { return "string" }

// candidates builds fleetinfer's candidate lookup in place of GIE's
// DatastoreEndpointCandidates, with the configured spill policy, and starts
// the federation and the loop that forgets gone pods next to GIE's servers.
func (r *Runner) candidates(p gierunner.Pool) (contracts.EndpointCandidates, error) {
	fed, err := r.fed.build(p.Name, p.Datastore, r.meter, p.Log)
	if err != nil {
		return nil, err
	}
	r.recorder.prefixes = fed.prefixes
	cands := &candidates{ds: p.Datastore, meter: r.meter, prefixes: fed.prefixes, disableSubsetHint: p.Options.DisableEndpointSubsetFilter, now: time.Now,
		failOpen: poolFailOpen(p.Manager.GetClient(), p.Name, p.HasPool)}
	if fed.store != nil {
		cands.remote = fed.store
		r.marker = fed.marker()
		r.crossings = crossing.New(r.fed.crossingOptions())
		cands.crossings = r.crossings
	}
	if cands.spill, err = r.spill.get(); err != nil {
		return nil, err
	}
	if cands.spill == nil && fed.store != nil {
		p.Log.Info("No cross-cluster-filter configured: every fresh remote endpoint is a candidate for every request")
	}
	gone := gonePods{ds: p.Datastore, remote: cands.remote, meter: r.meter, prefixes: fed.prefixes, now: time.Now}
	if err := p.Manager.Add(gierunner.NoLeaderElection(gone)); err != nil {
		return nil, err
	}
	return cands, fed.addTo(p.Manager)
}

// newExtProcServer is the ext-proc service around GIE's Director: GIE's
// StreamingServer over the director wrapper, inside the stream wrapper
// (director.go), both with the marker and the crossing gate (nil without
// federation), the pick recorder that ends abandoned requests in the
// meter, and the stream's request body bounded by limits.
func newExtProcServer(ds handlers.Datastore, gie handlers.Director, parser fwkrh.Parser, m *marker, g *crossing.Gate, rec pickRecorder, limits *RequestLimits) extProcPb.ExternalProcessorServer {
	return extProcServer{inner: handlers.NewStreamingServer(ds, director{Director: gie, marker: m, crossings: g}, parser), marker: m, crossings: g, recorder: rec, limits: limits}
}

// poolFailOpen reads endpointPickerRef.failureMode from the InferencePool,
// which GIE's manager already caches. Without a pool (standalone mode) the
// API's default, FailClose, applies.
func poolFailOpen(c client.Reader, pool types.NamespacedName, hasPool bool) func(context.Context) bool {
	return func(ctx context.Context) bool {
		if !hasPool {
			return false
		}
		var p v1.InferencePool
		if err := c.Get(ctx, pool, &p); err != nil {
			return false
		}
		return p.Spec.EndpointPickerRef.FailureMode == v1.EndpointPickerFailOpen
	}
}
