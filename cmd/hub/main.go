// Command hub runs fleetinfer's hub controller; see package hub.
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/fleetinfer/fleetinfer/hub"
	"github.com/fleetinfer/fleetinfer/internal/cmdflags"
	"github.com/fleetinfer/fleetinfer/internal/managerflags"
)

func main() {
	var cl cmdflags.Hub
	cl.AddFlags(flag.CommandLine)
	flag.Parse()
	mf, opts, po := &cl.Manager, cl.Options, cl.Provider
	log := mf.Logger()
	ctrl.SetLogger(log)

	ctx := ctrl.SetupSignalHandler()
	po.Namespace = opts.Namespace
	po.RESTOptions = append(po.RESTOptions, mf.Throttle)
	provider, err := hub.NewProvider(po)
	if err != nil {
		log.Error(err, "no cluster provider")
		os.Exit(2)
	}
	mo := mf.Options(hub.Scheme, "fleetinfer-hub")
	mo.Cache = hub.CacheOptions(opts.Namespace)
	mgr, err := mcmanager.New(mf.RESTConfig(), provider, mo)
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
