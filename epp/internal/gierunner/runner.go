// Copied from GIE v1.5.0, cmd/epp/runner/runner.go (Runner.Run,
// Runner.setup and the helpers it calls), with GIE's exported packages;
// changes are marked "fleetinfer:". See the package doc.

package gierunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common"
	logutil "sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
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

var setupLog = ctrl.Log.WithName("setup")

// Runner is GIE's Runner with a Delta.
type Runner struct {
	opts  *runserver.Options
	delta Delta
	// contention is --contention-profiling (see profiling.go).
	contention bool
}

// New returns a runner whose flags, GIE's and the delta's, are on the global
// pflag command line, which Run parses.
//
// fleetinfer: GIE adds its flags in Run; here they are added at once, next
// to the delta's.
func New(delta Delta) *Runner {
	r := &Runner{opts: runserver.NewOptions(), delta: delta}
	r.opts.AddFlags(pflag.CommandLine)
	addProfilingFlags(pflag.CommandLine, &r.contention)
	if delta.AddFlags != nil {
		delta.AddFlags(pflag.CommandLine)
	}
	return r
}

// Run parses the command line and runs the EPP until ctx ends.
func (r *Runner) Run(ctx context.Context) error {
	logutil.InitSetupLogging()
	setupLog.Info(r.delta.ExecutableName+" build", "commit-sha", version.CommitSHA, "build-ref", version.BuildRef)
	pflag.Parse()
	opts := r.opts
	if err := opts.Complete(); err != nil {
		return err
	}
	if err := opts.Validate(); err != nil {
		setupLog.Error(err, "Failed to validate flags")
		return err
	}
	// fleetinfer: the delta's flags.
	if r.delta.FlagsParsed != nil {
		if err := r.delta.FlagsParsed(); err != nil {
			return err
		}
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
	// Configuration, phase one: parseConfigurationPhaseOne.
	// fleetinfer: the delta's default configuration when none is given.
	configBytes := r.delta.DefaultConfig
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
	RegisterInTreePlugins()
	// fleetinfer: the delta's plugins.
	if r.delta.RegisterPlugins != nil {
		r.delta.RegisterPlugins()
	}
	rawConfig, featureGates, err := loader.LoadRawConfig(configBytes, setupLog)
	if err != nil {
		return nil, fmt.Errorf("failed to parse config - %w", err)
	}
	// The deprecated environment switch for flow control
	// (applyDeprecatedEnvFeatureGate).
	// fleetinfer: it also turns flow control on below; GIE's only adds the
	// gate to the configuration.
	if on, _ := strconv.ParseBool(os.Getenv("ENABLE_EXPERIMENTAL_FLOW_CONTROL_LAYER")); on && !featureGates[flowcontrol.FeatureGate] {
		rawConfig.FeatureGates = append(rawConfig.FeatureGates, flowcontrol.FeatureGate)
		featureGates[flowcontrol.FeatureGate] = true
	}
	legacyMetrics := featureGates[datalayer.EnableLegacyMetricsFeatureGate]

	// Metrics collection: setupMetricsCollection.
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
	// setupDatastore.
	ds := datastore.NewDatastore(ctx, epf, int32(opts.ModelServerMetricsPort))
	if !startCrdReconcilers {
		pool, err := runner.NewEndpointPoolFromOptions(gknn.Namespace, opts.PoolName, opts.EndpointSelector, opts.EndpointTargetPorts)
		if err != nil {
			return nil, err
		}
		ds = ds.WithEndpointPool(pool)
	}

	// Configuration, phase two: parseConfigurationPhaseTwo.
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
	// fleetinfer: the delta's request-control plugins come first.
	requestControlConfig.AddPlugins(r.delta.RequestControlPlugins...)
	requestControlConfig.AddPlugins(handle.GetAllPlugins()...)
	dag, err := datalayer.ValidateAndOrderDataDependencies(handle.GetAllPlugins())
	if err != nil {
		return nil, fmt.Errorf("failed to load the configuration - %w", err)
	}
	requestControlConfig.OrderPrepareDataPlugins(dag)
	parser := handlers.NewParser(eppConfig.ParserConfig)

	// Metrics server.
	// fleetinfer: with the delta's collectors.
	metrics.Register(append([]prometheus.Collector{collectors.NewInferencePoolMetricsCollector(ds)}, r.delta.Collectors...)...)
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
	// fleetinfer: the CPU profile and trace too, contention recorded only on
	// request, and only loopback callers without authentication
	// (profiling.go).
	if opts.EnablePprof {
		if !opts.MetricsEndpointAuth {
			setupLog.Info("Profiling answers only loopback callers (kubectl port-forward): --metrics-endpoint-auth=false leaves the metrics port unauthenticated")
		}
		for path, h := range pprofHandlers(!opts.MetricsEndpointAuth) {
			if err := mgr.AddMetricsServerExtraHandler(path, h); err != nil {
				return nil, err
			}
		}
		recordContention(r.contention)
	}
	scheduler := scheduling.NewSchedulerWithConfig(eppConfig.SchedulerConfig)
	// configureAndStartDatalayer.
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

	// Admission: flow control or legacy admission.
	// fleetinfer: over the delta's candidate lookup.
	var endpointCandidates contracts.EndpointCandidates
	if r.delta.Candidates != nil {
		endpointCandidates, err = r.delta.Candidates(Pool{Context: ctx, Manager: mgr, Datastore: ds, Name: gknn.NamespacedName,
			HasPool: startCrdReconcilers, Options: opts, Log: setupLog})
		if err != nil {
			return nil, err
		}
	} else {
		endpointCandidates = requestcontrol.NewDatastoreEndpointCandidates(ds,
			requestcontrol.WithDisableEndpointSubsetFilter(opts.DisableEndpointSubsetFilter))
	}
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
	director := requestcontrol.NewDirectorWithConfig(ds, scheduler, admission, parser, endpointCandidates, requestControlConfig)

	// fleetinfer: UseExperimentalDatalayerV2 is !legacyMetrics; GIE also
	// sets it with the deprecated dataLayer gate next to enableLegacyMetrics.
	serverRunner := &runserver.ExtProcServerRunner{
		GrpcPort: opts.GRPCPort, GKNN: gknn, Datastore: ds, ControllerCfg: controllerCfg,
		SecureServing: opts.SecureServing, HealthChecking: opts.HealthChecking, CertPath: opts.CertPath,
		EnableCertReload: opts.EnableCertReload, RefreshPrometheusMetricsInterval: opts.RefreshPrometheusMetricsInterval,
		MetricsStalenessThreshold: opts.MetricsStalenessThreshold, Director: director, Parser: parser,
		SaturationDetector: eppConfig.SaturationDetector, UseExperimentalDatalayerV2: !legacyMetrics,
	}
	if err := serverRunner.SetupWithManager(mgr); err != nil {
		return nil, err
	}
	if err := addHealthServer(mgr, ds, opts.GRPCHealthPort, isLeader, opts.EnableLeaderElection); err != nil {
		return nil, err
	}
	// registerExtProcServer, with ExtProcServerRunner.AsRunnable's body in
	// servers.go.
	// fleetinfer: the delta's ext-proc service around GIE's Director, and
	// its gRPC server options.
	var svc extProcPb.ExternalProcessorServer = handlers.NewStreamingServer(ds, director, parser)
	if r.delta.ExtProcServer != nil {
		svc = r.delta.ExtProcServer(ds, director, parser)
	}
	var grpcOpts []grpc.ServerOption
	if r.delta.ExtProcServerOptions != nil {
		grpcOpts = r.delta.ExtProcServerOptions()
	}
	return mgr, mgr.Add(extProcRunnable(serverRunner, svc, grpcOpts))
}

// poolGKNN is extractGKNN: the pool, or in standalone mode the EPP's own
// Deployment, named after its pod.
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
