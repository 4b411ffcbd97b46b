package cmdflags

import (
	"flag"
	"time"

	"github.com/fleetinfer/fleetinfer/hub"
	"github.com/fleetinfer/fleetinfer/hub/distribute"
	"github.com/fleetinfer/fleetinfer/hub/federation/ca"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/internal/managerflags"
)

// Hub is cmd/hub's command line.
type Hub struct {
	Manager  managerflags.Flags
	Options  hub.Options
	Provider hub.ProviderOptions
}

// AddFlags registers the hub's flags on fs.
func (h *Hub) AddFlags(fs *flag.FlagSet) {
	h.Manager.Bind(fs, ":8080", ":8081")
	opts, po := &h.Options, &h.Provider
	fs.StringVar(&opts.Namespace, "cluster-namespace", "fleetinfer-system", "Namespace of the spoke registrations: kubeconfig Secrets labelled sigs.k8s.io/multicluster-runtime-kubeconfig=true, ClusterProfiles.")
	fs.DurationVar(&opts.DefaultToleration, "default-failover-toleration", 60*time.Second, "How long a cluster may be unavailable before its replicas move, for placements that set no failover.tolerationSeconds.")
	fs.DurationVar(&opts.DefaultReadyTimeout, "default-ready-timeout", distribute.DefaultReadyTimeout, "How long a cluster's copy may take to turn Ready after the hub created it or changed its spec before it is Stuck and its replicas move, for placements that set no failover.readyTimeoutSeconds.")
	fs.DurationVar(&opts.ProbeInterval, "probe-interval", 2*time.Second, "How often each spoke's API server is probed.")
	fs.IntVar(&opts.ProbeFailureThreshold, "probe-failure-threshold", 3, "Consecutive failed probes that make a spoke unavailable; the failover toleration counts from the first of them.")
	fs.IntVar(&opts.ProbeSuccessThreshold, "probe-success-threshold", 2, "Consecutive good probes that make a spoke the probes found unavailable available again.")
	fs.DurationVar(&opts.OrphanInterval, "orphan-collection-interval", 30*time.Second, "How often spokes are swept for copies no hub object accounts for.")
	fs.DurationVar(&opts.OrphanGrace, "orphan-grace-period", distribute.DefaultOrphanGrace, "How long a copy must stay orphaned (its hub service gone) before the orphan collector deletes it; a copy carrying fleet.fleetinfer.io/deletion-protected=Always is never deleted by it. Long enough for a hub restored from an older backup to get its services back.")
	fs.BoolVar(&opts.RequireClusterSetBinding, "require-cluster-set-binding", true, "Place a namespace's services only on the clusters of the cluster sets its ClusterSetBindings bind (fleet.fleetinfer.io/clusterset on a cluster's registration; \"global\" binds every cluster). false lets every namespace use every cluster.")
	fs.StringVar(&opts.HubID, "hub-id", "", "This hub's identity on the spokes (label fleet.fleetinfer.io/hub-id): it changes and deletes only objects carrying it. Empty derives it from the hub cluster (its kube-system namespace's UID). Give a restored hub the ID of the hub it replaces.")
	fs.DurationVar(&opts.SpokeLeaseDuration, "spoke-lease-duration", inventory.DefaultLeaseDuration, "How long this hub's Lease in a spoke (fleetinfer-hub/fleetinfer-hub-<hub ID>; it writes to a spoke only while it holds it) lasts unrenewed: a hub with the same --hub-id that finds it held by another hub installation stands by, and takes it over once it has not been renewed for this long.")
	fs.DurationVar(&opts.SpokeLeaseRenewPeriod, "spoke-lease-renew-period", inventory.DefaultLeaseRenewPeriod, "How often this hub renews its Lease in each spoke; shorter than --spoke-lease-duration.")
	fs.BoolVar(&opts.TakeOverSpokeLeases, "take-over-spoke-leases", false, "Take the spokes' Leases of this hub ID from another hub installation that holds them, without waiting for them to expire: for a restored hub whose old hub still runs and must be retired (the old one then stands by). Never on two running hubs: they would take the leases from each other.")
	fs.StringVar(&opts.FederationCASecret, "federation-ca-secret", "fleetinfer-federation-ca", "Secret in --cluster-namespace holding the CA (tls.crt, tls.key) that signs endpoint pickers' federation certificates; created when missing.")
	fs.DurationVar(&opts.FederationCAOverlap, "federation-ca-rotation-overlap", ca.DefaultOverlap, "When the CA in --federation-ca-secret is replaced: how long pickers trust both CAs before their certificates are re-signed by the new one, and again before the old CA is dropped. Longer than a Secret takes to reach a picker's files.")
	fs.StringVar(&opts.TrustDomain, "federation-trust-domain", "fleetinfer.io", "SPIFFE trust domain of endpoint-picker identities (spiffe://<domain>/cluster/<c>/ns/<ns>/llminferenceservice/<name>).")
	fs.IntVar(&opts.Workers, "concurrent-service-syncs", 8, "Services reconciled at once by each hub controller.")
	fs.DurationVar(&opts.ClusterTimeout, "cluster-timeout", distribute.DefaultClusterTimeout, "Deadline of each call to one spoke within a reconcile: a spoke that hangs is unreadable for that reconcile instead of holding the worker and the other spokes' writes.")
	fs.StringVar(&po.Kind, "cluster-provider", hub.ProviderKubeconfig, "How the hub finds its spokes in --cluster-namespace: kubeconfig (Secrets labelled sigs.k8s.io/multicluster-runtime-kubeconfig=true) or clusterprofile (Cluster Inventory API ClusterProfiles).")
	fs.StringVar(&po.Consumer, "clusterprofile-consumer", "fleetinfer-hub", "With --cluster-provider=clusterprofile: the consumer name of the kubeconfig Secrets (label x-k8s.io/cluster-inventory-consumer) the hub reads for profiles it has no access provider for.")
	fs.StringVar(&po.AccessFile, "clusterprofile-provider-file", "", "With --cluster-provider=clusterprofile: the Cluster Inventory API access provider file (JSON, exec plugins per provider name) used for profiles' status.accessProviders; empty reads only Secrets.")
	po.Kubeconfigs.AddFlags(fs)
}
