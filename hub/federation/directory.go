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
)

// peer is the directory entry of one cluster's picker, built from what its
// copy reports, or nil while it cannot be reached.
func (r *Reconciler) peer(ctx context.Context, svc *v1alpha2.LLMInferenceService, cluster string, cp *v1alpha2.LLMInferenceService) *fleetv1alpha1.Peer {
	st := cp.Status.Federation
	if st == nil || st.PickerAddress == "" {
		return nil
	}
	p := &fleetv1alpha1.Peer{Cluster: cluster, FederationAddress: st.PickerAddress, GatewayAddress: st.GatewayAddress,
		Identity: r.identity(cluster, svc), Mode: fleetv1alpha1.FederationMode(cp.Annotations[fleetv1alpha1.FederationModeAnnotation])}
	if p.Mode == fleetv1alpha1.FederationParent && p.GatewayAddress == "" {
		r.Recorder.Eventf(svc, corev1.EventTypeWarning, ReasonGatewayUnknown,
			"Cluster %s is left out of the peer directories: Parent mode needs the address of its gateway, which its copy does not report", cluster)
		return nil
	}
	// The addresses come from the spoke; one it got wrong must not make
	// every other cluster's picker refuse its whole directory.
	if err := p.Validate(); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "peer entry left out", "cluster", cluster)
		return nil
	}
	return p
}

// identity is the URI SAN of a picker's certificate: one per service per
// cluster, so a picker can speak only for its own pool and cluster.
func (r *Reconciler) identity(cluster string, svc *v1alpha2.LLMInferenceService) string {
	return fmt.Sprintf("spiffe://%s/cluster/%s/ns/%s/llminferenceservice/%s", r.Opts.TrustDomain, cluster, svc.Namespace, svc.Name)
}

// ensureDirectory writes the peer directory of m: every other member whose
// picker can be reached (m.sees).
func (r *Reconciler) ensureDirectory(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member, members []member) error {
	dir := fleetv1alpha1.PeerDirectory{Peers: []fleetv1alpha1.Peer{}}
	for _, o := range members {
		if p := m.sees(o); p != nil {
			dir.Peers = append(dir.Peers, *p)
		}
	}
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
