// Command hub runs fleetinfer's hub controller; see package hub.
package main

import (
	"flag"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/providers/kubeconfig"

	"github.com/fleetinfer/fleetinfer/hub"
	"github.com/fleetinfer/fleetinfer/internal/managerflags"
)

func main() {
	var mf managerflags.Flags
	mf.Bind(flag.CommandLine, ":8080", ":8081")
	var opts hub.Options
	flag.StringVar(&opts.Namespace, "cluster-namespace", "fleetinfer-system", "Namespace of the spoke registrations: kubeconfig Secrets labelled sigs.k8s.io/multicluster-runtime-kubeconfig=true, ClusterProfiles.")
	flag.DurationVar(&opts.DefaultToleration, "default-failover-toleration", 60*time.Second, "How long a cluster may be unavailable before its replicas move, for placements that set no failover.tolerationSeconds.")
	flag.DurationVar(&opts.ProbeInterval, "probe-interval", 2*time.Second, "How often each spoke's API server is probed.")
	flag.DurationVar(&opts.OrphanInterval, "orphan-collection-interval", 30*time.Second, "How often spokes are swept for copies no hub object accounts for.")
	flag.Parse()
	log := mf.Logger()
	ctrl.SetLogger(log)

	ctx := ctrl.SetupSignalHandler()
	provider := kubeconfig.New(kubeconfig.Options{Namespace: opts.Namespace, ClusterOptions: hub.ClusterOptions()})
	mgr, err := mcmanager.New(ctrl.GetConfigOrDie(), provider, mf.Options(hub.Scheme, "fleetinfer-hub"))
	if err == nil {
		err = provider.SetupWithManager(ctx, mgr)
	}
	if err == nil {
		err = hub.Setup(ctx, mgr, opts)
	}
	if err == nil {
		err = managerflags.AddChecks(mgr.GetLocalManager())
	}
	if err == nil {
		err = mgr.Start(ctx)
	}
	if err != nil {
		log.Error(err, "hub failed")
		os.Exit(1)
	}
}
