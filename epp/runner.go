// Package epp is fleetinfer's endpoint picker: GIE v1.5.0's EPP (flags,
// EndpointPickerConfig, in-tree plugins, flow control, ext-proc server,
// health and metrics as GIE users know them) with federation: the EPPs of a
// pool in different clusters stream their pods' state to each other, and
// each picks among local and remote pods.
//
// # Composition
//
// GIE's runner (cmd/epp/runner) cannot be extended from outside where
// federation needs it: it builds the candidate lookup from the local
// datastore only and hands the ext-proc server its own concrete Director. So
// Runner.Run repeats the runner's setup step by step with GIE's exported
// packages, and changes three things, each marked "fleetinfer:" below:
//
//  1. the candidate lookup (candidates.go) adds fresh remote endpoints (with
//     the cross-cluster filter configured: the least loaded few, once no
//     local endpoint has headroom) and matches subset hints by IP and port,
//     with the pool's failureMode deciding what happens to a hint whose pod
//     is gone;
//  2. the ext-proc server's Director is wrapped (director.go) to send
//     Parent-mode picks to the remote gateway with a subset hint header;
//  3. the federation server and subscriptions run next to GIE's servers.
//
// Everything else, including plugin registration (plugins.go mirrors GIE's
// list and adds fleetinfer's plugins), is GIE's code.
//
// # Peer directory
//
// The peers come from a file (--federation-peers-file), which the hub will
// publish. It is YAML or JSON, reloaded when it changes:
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
// only the identities listed. See federation.PeerDirectory.
package epp

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/profiling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/tracing"
	backendmetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/backend/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/contracts"
	fccontroller "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/controller"
	fcregistry "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/flowcontrol/registry"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	extractormetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/extractor/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metrics"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metrics/collectors"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"
	runserver "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/server"
	"sigs.k8s.io/gateway-api-inference-extension/version"
)

//go:embed default-config.yaml
var defaultConfig []byte

var setupLog = ctrl.Log.WithName("setup")

// Runner runs fleetinfer's EPP.
type Runner struct {
	opts *runserver.Options
	fed  *FederationOptions
}

// NewRunner returns a runner whose flags are GIE's, fleetinfer's federation
// flags and --kubeconfig, all on the global pflag command line (GIE's
// runner parses that one too).
func NewRunner() *Runner {
	if pflag.CommandLine.Lookup("kubeconfig") == nil {
		pflag.CommandLine.Var(kubeconfigFlag{}, "kubeconfig",
			"Path to a kubeconfig. Defaults to $KUBECONFIG, then the in-cluster configuration.")
	}
	r := &Runner{opts: runserver.NewOptions(), fed: NewFederationOptions()}
	r.opts.AddFlags(pflag.CommandLine)
	r.fed.AddFlags(pflag.CommandLine)
	return r
}

// GIE's runner reads the API server address through controller-runtime,
// which honours $KUBECONFIG only; the flag sets that variable.
type kubeconfigFlag struct{}

func (kubeconfigFlag) String() string     { return os.Getenv("KUBECONFIG") }
func (kubeconfigFlag) Set(v string) error { return os.Setenv("KUBECONFIG", v) }
func (kubeconfigFlag) Type() string       { return "string" }

// Run parses the command line and runs the EPP until ctx ends. It follows
// GIE's Runner.Run and Runner.setup (cmd/epp/runner/runner.go, v1.5.0).
func (r *Runner) Run(ctx context.Context) error {
	logutil.InitSetupLogging()
	setupLog.Info("fleetinfer-epp build", "commit-sha", version.CommitSHA, "build-ref", version.BuildRef)
	pflag.Parse()
	opts := r.opts
	if err := opts.Complete(); err != nil {
		return err
	}
	if err := opts.Validate(); err != nil {
		setupLog.Error(err, "Failed to validate flags")
		return err
	}
	if err := r.fed.Validate(); err != nil {
		setupLog.Error(err, "Failed to validate federation flags")
		return err
	}
	flags := map[string]any{}
	pflag.VisitAll(func(f *pflag.Flag) { flags[f.Name] = f.Value })
	setupLog.Info("Flags processed", "flags", flags)
	logutil.InitLogging(&opts.ZapOptions)
	if opts.Tracing {
		if err := tracing.InitTracing(ctx, setupLog, "gateway-api-inference-extension/epp"); err != nil {
			return fmt.Errorf("failed to init tracing %w", err)
		}
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		setupLog.Error(err, "Failed to get Kubernetes rest config")
		return err
	}
	mgr, err := r.setup(ctx, cfg)
	if err != nil {
		return err
	}
	setupLog.Info("Controller manager starting")
	if err := mgr.Start(ctx); err != nil {
		setupLog.Error(err, "Error starting controller manager")
		return err
	}
	setupLog.Info("Controller manager terminated")
	return nil
}

func (r *Runner) setup(ctx context.Context, cfg *rest.Config) (ctrl.Manager, error) {
	opts := r.opts
	// Configuration, phase one: GIE's parseConfigurationPhaseOne, with
	// fleetinfer's default configuration when none is given.
	configBytes := defaultConfig
	if opts.ConfigText != "" {
		configBytes = []byte(opts.ConfigText)
	} else if opts.ConfigFile != "" {
		b, err := os.ReadFile(opts.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("failed to load config from a file '%s' - %w", opts.ConfigFile, err)
		}
		configBytes = b
	}
	loader.RegisterFeatureGate(datalayer.ExperimentalDatalayerFeatureGate)
	loader.RegisterFeatureGate(datalayer.EnableLegacyMetricsFeatureGate)
	loader.RegisterFeatureGate(flowcontrol.FeatureGate)
	configuredSpill := &spillPolicy{}
	registerPlugins(configuredSpill)
	rawConfig, featureGates, err := loader.LoadRawConfig(configBytes, setupLog)
	if err != nil {
		return nil, fmt.Errorf("failed to parse config - %w", err)
	}
	// GIE's deprecated environment switch for flow control.
	if on, _ := strconv.ParseBool(os.Getenv("ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER")); on && !featureGates[flowcontrol.FeatureGate] {
		rawConfig.FeatureGates = append(rawConfig.FeatureGates, flowcontrol.FeatureGate)
		featureGates[flowcontrol.FeatureGate] = true
	}
	legacyMetrics := featureGates[datalayer.EnableLegacyMetricsFeatureGate]

	// Metrics collection: GIE's setupMetricsCollection.
	dlRuntime := datalayer.NewRuntime(opts.RefreshMetricsInterval)
	var epf datalayer.EndpointFactory = dlRuntime
	if legacyMetrics {
		pmc, err := backendmetrics.NewPodMetricsClientImpl(setupLog, backendmetrics.Config{
			ModelServerMetricsScheme: opts.ModelServerMetricsScheme, ModelServerMetricsHTTPSInsecure: opts.ModelServerMetricsHTTPSInsecure,
			ModelServerMetricsPath: opts.ModelServerMetricsPath, TotalQueuedRequestsMetric: opts.TotalQueuedRequestsMetric,
			TotalRunningRequestsMetric: opts.TotalRunningRequestsMetric, KVCacheUsagePercentageMetric: opts.KVCacheUsagePercentageMetric,
			LoRAInfoMetric: opts.LoRAInfoMetric, CacheInfoMetric: opts.CacheInfoMetric,
		})
		if err != nil {
			return nil, err
		}
		epf = backendmetrics.NewPodMetricsFactory(pmc, opts.RefreshMetricsInterval)
	}
	gknn, err := poolGKNN(opts)
	if err != nil {
		return nil, err
	}
	startCrdReconcilers := opts.EndpointSelector == ""
	controllerCfg := runserver.NewControllerConfig(startCrdReconcilers)
	if err := controllerCfg.PopulateControllerConfig(cfg); err != nil {
		return nil, err
	}
	ds := datastore.NewDatastore(ctx, epf, int32(opts.ModelServerMetricsPort))
	if !startCrdReconcilers {
		pool, err := runner.NewEndpointPoolFromOptions(gknn.Namespace, opts.PoolName, opts.EndpointSelector, opts.EndpointTargetPorts)
		if err != nil {
			return nil, err
		}
		ds = ds.WithEndpointPool(pool)
	}

	// Configuration, phase two: GIE's parseConfigurationPhaseTwo. The pick
	// recorder (fleetinfer) comes before the configured plugins.
	handle := fwkplugin.NewEppHandle(ctx, func() []types.NamespacedName {
		eps := ds.PodList(datastore.AllPodsPredicate)
		names := make([]types.NamespacedName, 0, len(eps))
		for _, ep := range eps {
			names = append(names, ep.GetMetadata().NamespacedName)
		}
		return names
	})
	eppConfig, err := loader.InstantiateAndConfigure(rawConfig, handle, setupLog)
	if err != nil {
		return nil, fmt.Errorf("failed to load the configuration - %w", err)
	}
	requestControlConfig := requestcontrol.NewConfig()
	requestControlConfig.AddPlugins(pickRecorder{})
	requestControlConfig.AddPlugins(handle.GetAllPlugins()...)
	dag, err := datalayer.ValidateAndOrderDataDependencies(handle.GetAllPlugins())
	if err != nil {
		return nil, fmt.Errorf("failed to load the configuration - %w", err)
	}
	requestControlConfig.OrderPrepareDataPlugins(dag)
	parser := handlers.NewParser(eppConfig.ParserConfig)

	// Metrics server: GIE's, with fleetinfer's collectors.
	metrics.Register(append([]prometheus.Collector{collectors.NewInferencePoolMetricsCollector(ds)}, metricCollectors()...)...)
	metrics.RecordInferenceExtensionInfo(version.CommitSHA, version.BuildRef)
	metricsServerOptions := metricsserver.Options{BindAddress: fmt.Sprintf(":%d", opts.MetricsPort)}
	if opts.MetricsEndpointAuth {
		metricsServerOptions.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	isLeader := &atomic.Bool{}
	mgr, err := runserver.NewDefaultManager(controllerCfg, gknn, cfg, metricsServerOptions, opts.EnableLeaderElection)
	if err != nil {
		return nil, err
	}
	if opts.EnableLeaderElection {
		go func() {
			<-mgr.Elected()
			isLeader.Store(true)
			setupLog.Info("This instance is now the leader!")
		}()
	} else {
		isLeader.Store(true)
	}
	if opts.EnablePprof {
		if err := profiling.SetupPprofHandlers(mgr); err != nil {
			return nil, err
		}
	}
	scheduler := scheduling.NewSchedulerWithConfig(eppConfig.SchedulerConfig)
	disallowed := ""
	if legacyMetrics {
		disallowed = extractormetrics.MetricsExtractorType
	}
	if err := dlRuntime.Configure(eppConfig.DataConfig, !legacyMetrics, disallowed, setupLog); err != nil {
		return nil, fmt.Errorf("failed to initialize data layer: %w", err)
	}
	if err := dlRuntime.Start(ctx, mgr); err != nil {
		return nil, fmt.Errorf("failed to initialize data layer: %w", err)
	}

	// fleetinfer: the federated candidate lookup replaces GIE's
	// DatastoreEndpointCandidates, and the federation runs next to GIE.
	fed, err := r.fed.build(gknn.NamespacedName, ds, setupLog)
	if err != nil {
		return nil, err
	}
	cands := &candidates{ds: ds, disableSubsetHint: opts.DisableEndpointSubsetFilter, now: time.Now,
		failOpen: poolFailOpen(mgr.GetClient(), gknn.NamespacedName, startCrdReconcilers)}
	if fed.store != nil {
		cands.remote = fed.store
	}
	if cands.spill, err = configuredSpill.get(); err != nil {
		return nil, err
	}
	if cands.spill == nil && fed.store != nil {
		setupLog.Info("No cross-cluster-filter configured: every fresh remote endpoint is a candidate for every request")
	}
	if err := fed.addTo(mgr); err != nil {
		return nil, err
	}

	// Admission: GIE's flow control or legacy admission over our candidates.
	var endpointCandidates contracts.EndpointCandidates = cands
	var admission requestcontrol.AdmissionController
	if featureGates[flowcontrol.FeatureGate] {
		endpointCandidates = requestcontrol.NewCachedEndpointCandidates(ctx, endpointCandidates, 50*time.Millisecond)
		registry, err := fcregistry.NewFlowRegistry(eppConfig.FlowControlConfig.Registry, setupLog)
		if err != nil {
			return nil, fmt.Errorf("failed to initialize Flow Registry: %w", err)
		}
		fc, err := fccontroller.NewFlowController(ctx, opts.PoolName, eppConfig.FlowControlConfig.Controller, fccontroller.Deps{
			Registry: registry, SaturationDetector: eppConfig.SaturationDetector,
			EndpointCandidates: endpointCandidates, UsageLimitPolicy: eppConfig.FlowControlConfig.UsageLimitPolicy,
		})
		if err != nil {
			return nil, fmt.Errorf("failed to initialize Flow Controller: %w", err)
		}
		go registry.Run(ctx)
		admission = requestcontrol.NewFlowControlAdmissionController(fc, opts.PoolName)
	} else {
		admission = requestcontrol.NewLegacyAdmissionController(eppConfig.SaturationDetector, endpointCandidates)
	}
	gieDirector := requestcontrol.NewDirectorWithConfig(ds, scheduler, admission, parser, endpointCandidates, requestControlConfig)

	serverRunner := &runserver.ExtProcServerRunner{
		GrpcPort: opts.GRPCPort, GKNN: gknn, Datastore: ds, ControllerCfg: controllerCfg,
		SecureServing: opts.SecureServing, HealthChecking: opts.HealthChecking, CertPath: opts.CertPath,
		EnableCertReload: opts.EnableCertReload, RefreshPrometheusMetricsInterval: opts.RefreshPrometheusMetricsInterval,
		MetricsStalenessThreshold: opts.MetricsStalenessThreshold, Director: gieDirector, Parser: parser,
		SaturationDetector: eppConfig.SaturationDetector, UseExperimentalDatalayerV2: !legacyMetrics,
	}
	if err := serverRunner.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := addHealthServer(mgr, ds, opts.GRPCHealthPort, isLeader, opts.EnableLeaderElection); err != nil {
		return nil, err
	}
	// fleetinfer: GIE's ExtProcServerRunner.AsRunnable with the streaming
	// server's Director wrapped (see director.go).
	streaming := handlers.NewStreamingServer(ds, director{Director: gieDirector}, parser)
	return mgr, mgr.Add(extProcRunnable(serverRunner, extProcServer{inner: streaming}, legacyMetrics))
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

// poolGKNN is GIE's extractGKNN (unexported in its runner): the pool, or in
// standalone mode the EPP's own Deployment, named after its pod.
func poolGKNN(opts *runserver.Options) (common.GKNN, error) {
	ns := opts.PoolNamespace
	if ns == "" {
		ns = os.Getenv("NAMESPACE")
	}
	if ns == "" {
		ns = runserver.DefaultPoolNamespace
	}
	if opts.PoolName != "" {
		return common.GKNN{NamespacedName: types.NamespacedName{Namespace: ns, Name: opts.PoolName},
			GroupKind: schema.GroupKind{Group: opts.PoolGroup, Kind: "InferencePool"}}, nil
	}
	m := deploymentPod.FindStringSubmatch(os.Getenv("POD_NAME"))
	if m == nil {
		return common.GKNN{}, errors.New("standalone mode needs POD_NAME of the form <deployment>-<hash>-<id>")
	}
	return common.GKNN{NamespacedName: types.NamespacedName{Namespace: ns, Name: m[1]},
		GroupKind: schema.GroupKind{Group: "apps", Kind: "Deployment"}}, nil
}

var deploymentPod = regexp.MustCompile(`^(.+)-[a-z0-9]+-[a-z0-9]+$`)
