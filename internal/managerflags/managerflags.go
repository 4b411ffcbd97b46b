// Package managerflags holds the command-line flags every fleetinfer
// controller binary shares, with controller-runtime's conventional names:
// --kubeconfig (registered by controller-runtime), --metrics-bind-address,
// --health-probe-bind-address, --leader-elect, --kube-api-qps and
// --kube-api-burst, and the zap logging flags.
package managerflags

import (
	"flag"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Flags are the shared flags.
type Flags struct {
	MetricsAddr string
	ProbeAddr   string
	LeaderElect bool
	// LeaderElectionNamespace holds the lease; controller-runtime defaults
	// it to the pod's namespace, which a process outside a cluster lacks.
	LeaderElectionNamespace string
	// QPS and Burst bound each client's requests to an API server.
	// client-go's defaults (5 and 10) serialise a controller that writes to
	// several clusters at once.
	QPS   float64
	Burst int
	// PprofAddr serves net/http/pprof when set.
	PprofAddr string
	Zap       zap.Options
}

// Bind registers the flags on fs with per-binary default ports.
func (f *Flags) Bind(fs *flag.FlagSet, metricsAddr, probeAddr string) {
	fs.StringVar(&f.MetricsAddr, "metrics-bind-address", metricsAddr, "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	fs.StringVar(&f.ProbeAddr, "health-probe-bind-address", probeAddr, "Address the /healthz and /readyz endpoints bind to.")
	fs.BoolVar(&f.LeaderElect, "leader-elect", false, "Enable leader election, so that only one replica is active.")
	fs.StringVar(&f.LeaderElectionNamespace, "leader-election-namespace", "", "Namespace of the leader election lease; defaults to the pod's own when running in a cluster.")
	fs.Float64Var(&f.QPS, "kube-api-qps", 100, "Queries per second each client may send to an API server.")
	fs.IntVar(&f.Burst, "kube-api-burst", 300, "Requests each client may send to an API server in a burst.")
	fs.StringVar(&f.PprofAddr, "pprof-bind-address", "", "Address net/http/pprof binds to; empty disables it.")
	f.Zap.BindFlags(fs)
}

// Throttle applies --kube-api-qps and --kube-api-burst to cfg.
func (f *Flags) Throttle(cfg *rest.Config) error {
	cfg.QPS, cfg.Burst = float32(f.QPS), f.Burst
	return nil
}

// RESTConfig is the --kubeconfig (or in-cluster) configuration, throttled.
func (f *Flags) RESTConfig() *rest.Config {
	cfg := ctrl.GetConfigOrDie()
	_ = f.Throttle(cfg)
	return cfg
}

// Logger returns the logger the zap flags describe.
func (f *Flags) Logger() logr.Logger { return zap.New(zap.UseFlagOptions(&f.Zap)) }

// Options are the manager options the flags describe.
func (f *Flags) Options(scheme *runtime.Scheme, leaderElectionID string) ctrl.Options {
	return ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: f.MetricsAddr},
		HealthProbeBindAddress:  f.ProbeAddr,
		LeaderElection:          f.LeaderElect,
		LeaderElectionID:        leaderElectionID,
		LeaderElectionNamespace: f.LeaderElectionNamespace,
		PprofBindAddress:        f.PprofAddr,
	}
}

// AddChecks adds the standard liveness and readiness checks.
func AddChecks(mgr ctrl.Manager) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("readyz", healthz.Ping)
}
