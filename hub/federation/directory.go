package federation

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// peer is the directory entry of one cluster's picker, built from what its
// copy reports, or nil while it cannot be reached. Its mode depends on the
// cluster of the directory it goes into (peersOf).
func (r *Reconciler) peer(ctx context.Context, svc *v1alpha2.LLMInferenceService, c inventory.Cluster, cp *v1alpha2.LLMInferenceService) *fleetv1alpha1.Peer {
	st := cp.Status.Federation
	if st == nil || st.PickerAddress == "" {
		return nil
	}
	cluster := c.Name
	p := &fleetv1alpha1.Peer{Cluster: cluster, FederationAddress: st.PickerAddress, GatewayAddress: st.GatewayAddress,
		Identity: r.identity(cluster, svc), EndpointCIDRs: endpointCIDRs(ctx, c)}
	// The addresses come from the spoke; one it got wrong must not make
	// every other cluster's picker refuse its whole directory.
	if err := p.Validate(); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "peer entry left out", "cluster", cluster)
		return nil
	}
	return p
}

// endpointCIDRs are the address ranges the registration of c says its pods
// use (fleetv1alpha1.PodCIDRsProperty); nil when it says none or nothing
// valid, and then pickers check only the address classes.
func endpointCIDRs(ctx context.Context, c inventory.Cluster) []string {
	v := c.Properties[fleetv1alpha1.PodCIDRsProperty]
	if v == "" {
		return nil
	}
	cidrs, err := fleetv1alpha1.ParseCIDRs(v)
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "pod ranges of the cluster's registration ignored", "cluster", c.Name, "property", fleetv1alpha1.PodCIDRsProperty)
		return nil
	}
	return cidrs
}

// peersOf lists the peers in m's directory: every other member whose
// picker can be reached, each in the mode the placement asks for where the
// two clusters share a pod network, else in Parent mode
// (fleetv1alpha1.PeerMode): a pod address that is not routed from m's
// cluster would only fail. A peer to be reached in Parent mode that reports
// no gateway is left out and named in noGateway.
//
// An importer (importers.go) reaches the exporters in Parent mode only: its
// picker has no pods to serve a pick itself, and its own gateway is where
// its requests enter. It is listed in the exporters' directories as a
// subscriber only, and importers do not list each other.
func peersOf(m member, members []member) (peers []fleetv1alpha1.Peer, noGateway []string) {
	asked := fleetv1alpha1.FederationParent
	if m.copy != nil {
		asked = fleetv1alpha1.FederationMode(m.copy.Annotations[fleetv1alpha1.FederationModeAnnotation])
	}
	peers = []fleetv1alpha1.Peer{}
	for _, o := range members {
		if o.cluster.Name == m.cluster.Name || o.peer == nil || (m.importer != nil && o.importer != nil) {
			continue
		}
		p := *o.peer
		if !p.SubscribeOnly {
			p.Mode = fleetv1alpha1.PeerMode(asked, m.cluster.Labels, o.cluster.Labels)
			if p.Mode == fleetv1alpha1.FederationParent && p.GatewayAddress == "" {
				noGateway = append(noGateway, o.cluster.Name)
				continue
			}
		}
		peers = append(peers, p)
	}
	return peers, noGateway
}

// identity is the URI SAN of a picker's certificate: one per service per
// cluster, so a picker can speak only for its own pool and cluster.
func (r *Reconciler) identity(cluster string, svc *v1alpha2.LLMInferenceService) string {
	return fmt.Sprintf("spiffe://%s/cluster/%s/ns/%s/llminferenceservice/%s", r.Opts.TrustDomain, cluster, svc.Namespace, svc.Name)
}

// ensureDirectory writes the peer directory of m (peersOf).
func (r *Reconciler) ensureDirectory(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member, peers []fleetv1alpha1.Peer) error {
	dir := fleetv1alpha1.PeerDirectory{Peers: peers, OwnEndpointCIDRs: endpointCIDRs(ctx, m.cluster)}
	data, err := yaml.Marshal(dir)
	if err != nil {
		return err
	}
	directoryPeers.WithLabelValues(svc.Namespace, svc.Name, m.cluster.Name).Set(float64(len(dir.Peers)))
	want := &corev1.ConfigMap{
		ObjectMeta: r.childMeta(svc, m, fleetv1alpha1.PeerDirectoryName(svc.Name)),
		Data:       map[string]string{fleetv1alpha1.PeerDirectoryKey: string(data)},
	}
	changed, err := apply(ctx, r, svc, m, want, func(cur *corev1.ConfigMap) bool {
		if cur.Data[fleetv1alpha1.PeerDirectoryKey] == want.Data[fleetv1alpha1.PeerDirectoryKey] {
			return false
		}
		cur.Data = want.Data
		return true
	})
	if changed && err == nil {
		names := make([]string, 0, len(dir.Peers))
		for _, p := range dir.Peers {
			names = append(names, p.Cluster)
		}
		r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonPeersUpdated, "Peer directory in cluster %s lists %d peers: %s",
			m.cluster.Name, len(names), strings.Join(names, ", "))
	}
	return err
}
