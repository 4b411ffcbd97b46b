// Package hub assembles the hub on a multicluster-runtime manager whose
// provider engages the spoke clusters (provider.go: OCM, ClusterProfiles or
// kubeconfig Secrets). Setup builds the cluster inventory, then sets up
// each controller through its package's Setup with the shared
// dependencies (hub/internal/component) and its own options: service
// placement and distribution with the orphan collector (hub/distribute),
// placement status (hub/placement), MemberClusters (hub/members), the
// InferencePool export controller (hub/export) and the endpoint-picker
// federation, peer directories and certificates (hub/federation).
// identity.go gives the hub the ID it marks its spoke objects with.
package hub

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/distribute"
	"github.com/fleetinfer/fleetinfer/hub/export"
	"github.com/fleetinfer/fleetinfer/hub/federation"
	"github.com/fleetinfer/fleetinfer/hub/internal/component"
	"github.com/fleetinfer/fleetinfer/hub/internal/fence"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/hub/members"
	"github.com/fleetinfer/fleetinfer/hub/placement"
	"github.com/fleetinfer/fleetinfer/internal/nodecapacity"
)

// Scheme knows every API the hub reads or writes, on the hub and in spokes.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(v1alpha2.AddToScheme(Scheme))
	utilruntime.Must(fleetv1alpha1.AddToScheme(Scheme))
	utilruntime.Must(clusterv1.Install(Scheme))
	utilruntime.Must(clusterv1beta1.Install(Scheme))
	utilruntime.Must(clusterinventoryv1alpha1.AddToScheme(Scheme))
	utilruntime.Must(igwapiv1.Install(Scheme))
	utilruntime.Must(igwapixv1alpha1.Install(Scheme))
}

// ClusterOptions make every engaged spoke cluster use the hub's scheme,
// cache only the ConfigMaps and Secrets the hub published, and of Nodes
// only what counts their accelerators.
func ClusterOptions() []cluster.Option {
	return []cluster.Option{func(o *cluster.Options) {
		o.Scheme = Scheme
		o.Cache.ByObject = federation.SpokeCache()
		// Placement bounds capacity reports by the Nodes; keep little of each.
		o.Cache.ByObject[&corev1.Node{}] = cache.ByObject{Transform: nodecapacity.Slim}
	}}
}

// CacheOptions limit the hub's cache of its own Secrets to the namespace of
// the registrations and the federation CA.
func CacheOptions(namespace string) cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Namespaces: map[string]cache.Config{namespace: {}}},
	}}
}

// Options configure the hub. Settings left unset take the defaults of
// withDefaults, or of the component they are handed to (its Options'
// withDefaults).
type Options struct {
	// Namespace holds the spokes' registrations (kubeconfig Secrets,
	// ClusterProfiles).
	Namespace string
	// DefaultToleration applies to placements that set none.
	DefaultToleration time.Duration
	// DefaultReadyTimeout applies to placements that set no
	// failover.readyTimeoutSeconds.
	DefaultReadyTimeout time.Duration
	// ProbeInterval is how often each spoke's API server is probed.
	ProbeInterval time.Duration
	// ProbeFailureThreshold and ProbeSuccessThreshold are how many
	// consecutive failed probes make a spoke unavailable, and how many good
	// ones make it available again (inventory.Options).
	ProbeFailureThreshold int
	ProbeSuccessThreshold int
	// OrphanInterval is how often the orphan collector sweeps the spokes.
	OrphanInterval time.Duration
	// ClusterTimeout bounds each call to one spoke within a reconcile.
	ClusterTimeout time.Duration
	// OrphanGrace is how long a copy stays orphaned before it is deleted.
	OrphanGrace time.Duration
	// RequireClusterSetBinding limits each namespace to the clusters of the
	// sets its ClusterSetBindings bind.
	RequireClusterSetBinding bool
	// HubID is this hub's identity on the spokes (fleetv1alpha1.HubIDLabel);
	// empty derives it from the hub cluster (HubIdentity).
	HubID string
	// SpokeLeaseDuration and SpokeLeaseRenewPeriod: the hub writes to a
	// spoke only while it holds the lease of its hub ID there
	// (inventory.Options.Lease), renewed every period, lasting the
	// duration; a restored hub whose old one is dead takes it over a
	// duration after it stopped being renewed.
	SpokeLeaseDuration    time.Duration
	SpokeLeaseRenewPeriod time.Duration
	// TakeOverSpokeLeases takes the leases another hub installation with
	// the same hub ID holds, at once: for a restore whose old hub still
	// runs and must be retired (it then stands by).
	TakeOverSpokeLeases bool
	// FederationCASecret is the Secret in Namespace holding the federation
	// CA (created when missing).
	FederationCASecret string
	// FederationCAOverlap is how long each phase of a federation CA
	// rotation lasts (ca.Authority.Overlap).
	FederationCAOverlap time.Duration
	// TrustDomain is the SPIFFE trust domain of endpoint-picker identities.
	TrustDomain string
	// Workers is how many services each controller reconciles at once
	// (DefaultWorkers): a reconcile mostly waits on other clusters' API
	// servers.
	Workers int
}

// DefaultWorkers is Options.Workers when unset.
const DefaultWorkers = 8

// withDefaults fills the hub-wide settings left unset.
func (o Options) withDefaults() Options {
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.SpokeLeaseDuration <= 0 {
		o.SpokeLeaseDuration = inventory.DefaultLeaseDuration
	}
	if o.SpokeLeaseRenewPeriod <= 0 {
		o.SpokeLeaseRenewPeriod = inventory.DefaultLeaseRenewPeriod
	}
	return o
}

// Setup registers the hub's components with mgr: the inventory, then each
// controller through its package's Setup, with the shared dependencies and
// its own options.
func Setup(ctx context.Context, mgr mcmanager.Manager, opts Options) error {
	opts = opts.withDefaults()
	if opts.SpokeLeaseRenewPeriod >= opts.SpokeLeaseDuration {
		return fmt.Errorf("the spoke lease renew period (%s) must be shorter than its duration (%s)", opts.SpokeLeaseRenewPeriod, opts.SpokeLeaseDuration)
	}
	local := mgr.GetLocalManager()
	id, err := HubIdentity(ctx, local.GetAPIReader(), opts.HubID)
	if err != nil {
		return err
	}
	installation, err := HubInstallation(ctx, local.GetAPIReader(), opts.Namespace)
	if err != nil {
		return err
	}
	local.GetLogger().Info("hub identity", "hubID", id, "installation", installation, "takeOverSpokeLeases", opts.TakeOverSpokeLeases)
	inv := inventory.New(inventory.Options{Hub: local.GetClient(), HubReader: local.GetAPIReader(), Namespace: opts.Namespace,
		ProbeInterval: opts.ProbeInterval, ProbeFailureThreshold: opts.ProbeFailureThreshold,
		ProbeSuccessThreshold: opts.ProbeSuccessThreshold, EngageGrace: engageGrace(opts.ProbeInterval, opts.ProbeFailureThreshold),
		Lease:            fence.Options{HubID: id, Holder: installation, Duration: opts.SpokeLeaseDuration, TakeOver: opts.TakeOverSpokeLeases},
		LeaseRenewPeriod: opts.SpokeLeaseRenewPeriod, Log: local.GetLogger().WithName("inventory")})
	if err := mgr.Add(inv); err != nil {
		return err
	}
	deps := component.Deps{Manager: mgr, Inventory: inv}
	setups := []func() error{
		func() error {
			return distribute.Setup(ctx, deps, distribute.Options{DefaultToleration: opts.DefaultToleration, Workers: opts.Workers,
				HubID: id, OrphanGrace: opts.OrphanGrace, OrphanInterval: opts.OrphanInterval, ClusterTimeout: opts.ClusterTimeout,
				DefaultReadyTimeout: opts.DefaultReadyTimeout, RequireClusterSetBinding: opts.RequireClusterSetBinding})
		},
		func() error { return placement.Setup(ctx, deps, placement.Options{Namespace: opts.Namespace}) },
		func() error { return members.Setup(ctx, deps, members.Options{ClusterTimeout: opts.ClusterTimeout}) },
		func() error { return export.Setup(ctx, deps, export.Options{HubID: id}) },
		func() error {
			return federation.Setup(ctx, deps, federation.Options{TrustDomain: opts.TrustDomain, Workers: opts.Workers, HubID: id,
				Namespace: opts.Namespace, CASecret: opts.FederationCASecret, CAOverlap: opts.FederationCAOverlap})
		},
	}
	for _, setup := range setups {
		if err := setup(); err != nil {
			return err
		}
	}
	return nil
}

// engageGrace is how long a new leader gives registered clusters to be
// engaged before an earlier hub's record of their loss counts: twice what
// declaring an engaged cluster lost takes (threshold failed probes), and at
// least 5 s, which engaging a cluster (its caches synced) takes on a busy
// hub.
func engageGrace(probeInterval time.Duration, failureThreshold int) time.Duration {
	if failureThreshold <= 0 {
		failureThreshold = 3
	}
	return max(5*time.Second, 2*time.Duration(failureThreshold)*probeInterval)
}
