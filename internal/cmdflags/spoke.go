package cmdflags

import (
	"flag"

	"github.com/fleetinfer/fleetinfer/internal/managerflags"
	"github.com/fleetinfer/fleetinfer/spoke"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

// Spoke is cmd/spoke's command line. Gateway and FederationAddress are the
// raw values of --default-gateway and --federation-address, which the main
// checks and moves into Options.
type Spoke struct {
	Manager           managerflags.Flags
	Options           spoke.Options
	Gateway           string
	FederationAddress string
}

// AddFlags registers the spoke's flags on fs.
func (s *Spoke) AddFlags(fs *flag.FlagSet) {
	s.Manager.Bind(fs, ":8080", ":8081")
	opts := &s.Options
	fs.StringVar(&opts.SystemNamespace, "system-namespace", "fleetinfer-system", "Namespace of the well-known presets and fallback for config lookups.")
	fs.StringVar(&opts.PresetPrefix, "preset-prefix", "kserve-", "Prefix of the well-known preset names.")
	fs.BoolVar(&opts.InstallPresets, "install-presets", true, "Install the well-known presets into the system namespace at start-up.")
	fs.StringVar(&s.Gateway, "default-gateway", "fleetinfer-system/inference-gateway", "namespace/name of the Gateway for `router.gateway: {}`.")
	fs.BoolVar(&opts.Global.EnableTLS, "enable-tls", false, "Serve model servers and the endpoint picker over TLS (presets read it as .GlobalConfig.EnableTLS).")
	fs.StringVar(&opts.Global.ModelBasedRoutingHeaderName, "model-routing-header", "X-Gateway-Model-Name", "Header the route preset matches for model-based routing.")
	fs.IntVar(&opts.Workers, "concurrent-service-syncs", llmisvc.DefaultWorkers, "Services reconciled at once.")
	fs.DurationVar(&opts.StallAfter, "reconcile-stall-timeout", llmisvc.DefaultStallAfter, "/healthz fails while one service's reconcile has run longer than this.")
	fs.StringVar(&s.FederationAddress, "federation-address", string(llmisvc.FederationAddressLoadBalancer),
		"Address a federated endpoint picker is reported at for other clusters: LoadBalancer (a Service of type LoadBalancer per federated service) "+
			"or PodIP (the ready picker pod's IP, for a cluster without a load-balancer controller whose pod network other clusters reach).")
}
