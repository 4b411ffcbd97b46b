// Command spoke runs fleetinfer's spoke controller in one GPU cluster; see
// package spoke.
package main

import (
	"flag"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fleetinfer/fleetinfer/internal/managerflags"
	"github.com/fleetinfer/fleetinfer/spoke"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

func main() {
	var mf managerflags.Flags
	mf.Bind(flag.CommandLine, ":8080", ":8081")
	opts := spoke.Options{Options: llmisvc.Options{Global: llmisvc.GlobalConfig{}}}
	var gateway string
	flag.StringVar(&opts.SystemNamespace, "system-namespace", "fleetinfer-system", "Namespace of the well-known presets and fallback for config lookups.")
	flag.StringVar(&opts.PresetPrefix, "preset-prefix", "kserve-", "Prefix of the well-known preset names.")
	flag.BoolVar(&opts.InstallPresets, "install-presets", true, "Install the well-known presets into the system namespace at start-up.")
	flag.StringVar(&gateway, "default-gateway", "fleetinfer-system/inference-gateway", "namespace/name of the Gateway for `router.gateway: {}`.")
	flag.BoolVar(&opts.Global.EnableTLS, "enable-tls", false, "Serve model servers and the endpoint picker over TLS (presets read it as .GlobalConfig.EnableTLS).")
	flag.StringVar(&opts.Global.ModelBasedRoutingHeaderName, "model-routing-header", "X-Gateway-Model-Name", "Header the route preset matches for model-based routing.")
	flag.IntVar(&opts.Workers, "concurrent-service-syncs", llmisvc.DefaultWorkers, "Services reconciled at once.")
	flag.DurationVar(&opts.StallAfter, "reconcile-stall-timeout", llmisvc.DefaultStallAfter, "/healthz fails while one service's reconcile has run longer than this.")
	federationAddress := flag.String("federation-address", string(llmisvc.FederationAddressLoadBalancer),
		"Address a federated endpoint picker is reported at for other clusters: LoadBalancer (a Service of type LoadBalancer per federated service) "+
			"or PodIP (the ready picker pod's IP, for a cluster without a load-balancer controller whose pod network other clusters reach).")
	flag.Parse()
	log := mf.Logger()
	ctrl.SetLogger(log)

	ns, name, ok := strings.Cut(gateway, "/")
	if !ok || ns == "" || name == "" {
		log.Error(nil, "--default-gateway must be namespace/name", "value", gateway)
		os.Exit(2)
	}
	opts.Global.IngressGatewayNamespace, opts.Global.IngressGatewayName = ns, name
	fa, err := llmisvc.ParseFederationAddress(*federationAddress)
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
