package hub

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/cluster-inventory-api/pkg/access"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	"sigs.k8s.io/multicluster-runtime/providers/kubeconfig"

	"github.com/fleetinfer/fleetinfer/hub/clusterprofile"
	"github.com/fleetinfer/fleetinfer/hub/internal/credentials"
)

// The cluster providers the hub can find its spokes with.
const (
	// ProviderKubeconfig engages a cluster per kubeconfig Secret labelled
	// sigs.k8s.io/multicluster-runtime-kubeconfig=true.
	ProviderKubeconfig = "kubeconfig"
	// ProviderClusterProfile engages a cluster per Cluster Inventory API
	// ClusterProfile.
	ProviderClusterProfile = "clusterprofile"
)

// ProviderOptions choose and configure the cluster provider.
type ProviderOptions struct {
	// Kind is ProviderKubeconfig or ProviderClusterProfile.
	Kind string
	// Namespace holds the registrations (Options.Namespace).
	Namespace string
	// Consumer is the ClusterProfile Secret strategy's consumer name.
	Consumer string
	// AccessFile is a cluster-inventory-api access provider file (KEP-5339
	// exec plugins); empty uses only the Secret strategy.
	AccessFile string
	// RESTOptions adjust each spoke's rest.Config.
	RESTOptions []func(*rest.Config) error
	// Kubeconfigs says what a kubeconfig from a Secret may do on the hub's
	// host (exec plugins, files); a cluster whose kubeconfig does more is
	// not engaged.
	Kubeconfigs credentials.Policy
}

// Provider is a cluster provider that runs as a controller on the hub.
type Provider interface {
	multicluster.Provider
	SetupWithManager(context.Context, mcmanager.Manager) error
}

// NewProvider builds the provider the options choose, giving every engaged
// cluster ClusterOptions.
func NewProvider(o ProviderOptions) (Provider, error) {
	switch o.Kind {
	case ProviderKubeconfig:
		// The check runs on the config the provider built from the Secret,
		// before anything else and before any request.
		ro := append([]func(*rest.Config) error{o.Kubeconfigs.Check}, o.RESTOptions...)
		return kubeconfig.New(kubeconfig.Options{Namespace: o.Namespace, RESTOptions: ro, ClusterOptions: ClusterOptions()}), nil
	case ProviderClusterProfile:
		opts := clusterprofile.Options{Namespace: o.Namespace, Consumer: o.Consumer, RESTOptions: o.RESTOptions, ClusterOptions: ClusterOptions(),
			CheckKubeconfig: o.Kubeconfigs.Check}
		if o.AccessFile != "" {
			cfg, err := access.NewFromFile(o.AccessFile)
			if err != nil {
				return nil, err
			}
			opts.Access = cfg
		}
		return clusterprofile.New(opts), nil
	default:
		return nil, fmt.Errorf("unknown cluster provider %q: want %s or %s", o.Kind, ProviderKubeconfig, ProviderClusterProfile)
	}
}
