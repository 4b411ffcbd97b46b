// Package gierunner is a copy of GIE's EPP runner, quarantined: the setup of
// sigs.k8s.io/gateway-api-inference-extension at UpstreamVersion, with
// hooks where fleetinfer's EPP (package epp) changes it.
//
// GIE's runner cannot be extended from outside where federation needs it:
// it builds the candidate lookup from the local datastore only, and hands
// the ext-proc server its own concrete Director. So this package repeats its
// setup with GIE's exported packages, and its unexported or internal pieces
// by equivalents. The upstream files, all at UpstreamVersion:
//
//   - cmd/epp/runner/runner.go: Runner.Run, Runner.setup,
//     parseConfigurationPhaseOne and Two, setupMetricsCollection,
//     configureAndStartDatalayer, extractGKNN, registerHealthServer
//     (runner.go here) and registerInTreePlugins (plugins.go);
//   - cmd/epp/runner/health.go: healthServer (servers.go);
//   - internal/runnable/grpc.go and internal/runnable/leader_election.go:
//     GRPCServer and NoLeaderElection (servers.go);
//   - internal/tls/tls.go: CreateSelfSignedTLSCertificate (servers.go);
//   - pkg/epp/server/runserver.go: ExtProcServerRunner.AsRunnable
//     (servers.go).
//
// Every change to upstream's behaviour is marked "fleetinfer:". A test fails
// when go.mod pins another GIE version: re-diff these files against the new
// tag, carry the changes over, then update UpstreamVersion. The copy goes
// once GIE takes hooks for the candidate lookup and the ext-proc server.
package gierunner

import (
	"context"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	fwkrh "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requesthandling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
)

// UpstreamVersion is the GIE release this package copies.
const UpstreamVersion = "v1.5.0"

// Delta is what the caller changes in GIE's runner. Nil and empty fields
// leave GIE's behaviour.
type Delta struct {
	// ExecutableName names the binary in the first log line.
	ExecutableName string
	// DefaultConfig is the EndpointPickerConfig used when neither
	// --config-file nor --config-text is given.
	DefaultConfig []byte
	// AddFlags adds the caller's flags next to GIE's. FlagsParsed runs once
	// the command line is parsed and GIE's flags are valid, after the setup
	// log and before anything starts: the caller checks its own flags there
	// and applies the process settings that follow from them; an error
	// stops the EPP.
	AddFlags    func(*pflag.FlagSet)
	FlagsParsed func() error
	// RegisterPlugins registers the caller's plugin types after GIE's
	// in-tree ones.
	RegisterPlugins func()
	// RequestControlPlugins come before the configured plugins.
	RequestControlPlugins []fwkplugin.Plugin
	// Collectors are registered next to GIE's metrics.
	Collectors []prometheus.Collector
	// Candidates builds the candidate lookup in place of GIE's
	// DatastoreEndpointCandidates. It may add runnables to the manager.
	Candidates func(Pool) (contracts.EndpointCandidates, error)
	// ExtProcServer builds the ext-proc service around GIE's Director in
	// place of GIE's StreamingServer.
	ExtProcServer func(ds handlers.Datastore, director handlers.Director, parser fwkrh.Parser) extProcPb.ExternalProcessorServer
	// ExtProcServerOptions returns options for the ext-proc gRPC server,
	// read once the command line is parsed.
	ExtProcServerOptions func() []grpc.ServerOption
}

// Pool is what Delta.Candidates gets: the pool's datastore and manager.
type Pool struct {
	Context   context.Context
	Manager   ctrl.Manager
	Datastore datastore.Datastore
	// Name is the InferencePool's namespaced name, or in standalone mode
	// (--endpoint-selector) the EPP Deployment's.
	Name types.NamespacedName
	// HasPool is false in standalone mode, where no InferencePool exists.
	HasPool bool
	Options *runserver.Options
	Log     logr.Logger
}
