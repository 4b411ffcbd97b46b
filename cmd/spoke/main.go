// Command spoke runs fleetinfer's spoke controller in one GPU cluster; see
// package spoke.
package main

import (
	"flag"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fleetinfer/fleetinfer/internal/cmdflags"
	"github.com/fleetinfer/fleetinfer/internal/managerflags"
	"github.com/fleetinfer/fleetinfer/spoke"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

func main() {
	var cl cmdflags.Spoke
	cl.AddFlags(flag.CommandLine)
	flag.Parse()
	mf, opts, gateway := &cl.Manager, cl.Options, cl.Gateway
	log := mf.Logger()
	ctrl.SetLogger(log)

	ns, name, ok := strings.Cut(gateway, "/")
	if !ok || ns == "" || name == "" {
		log.Error(nil, "--default-gateway must be namespace/name", "value", gateway)
		os.Exit(2)
	}
	opts.Global.IngressGatewayNamespace, opts.Global.IngressGatewayName = ns, name
	fa, err := llmisvc.ParseFederationAddress(cl.FederationAddress)
	if err != nil {
		log.Error(err, "--federation-address")
		os.Exit(2)
	}
	opts.FederationAddress = fa
	opts.Global.SystemNamespace = opts.SystemNamespace

	ctx := ctrl.SetupSignalHandler()
	mgr, err := ctrl.NewManager(mf.RESTConfig(), spoke.ManagerOptions(mf.Options(spoke.Scheme, "fleetinfer-spoke")))
	if err == nil {
		err = spoke.Setup(ctx, mgr, opts)
	}
	if err == nil {
		err = managerflags.AddChecks(mgr)
	}
	if err == nil {
		err = mgr.Start(ctx)
	}
	if err != nil {
		log.Error(err, "spoke controller failed")
		os.Exit(1)
	}
}
