package llmisvc

import (
	"path"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Where the endpoint picker finds what the hub publishes for it.
const (
	federationPeersVolume = "federation-peers"
	federationTLSVolume   = "federation-tls"
	federationPeersDir    = "/etc/fleetinfer/federation/peers"
	federationTLSDir      = "/etc/fleetinfer/federation/tls"
)

// federate turns on the federation of the endpoint picker of a service the
// hub placed (it annotates the copy with the cluster's name): the picker
// reads its peer directory and mTLS certificate from the ConfigMap and Secret
// the hub writes next to the copy, and serves its pods to peers on the
// federation port. The volumes are not optional, so the picker starts only
// once the hub has issued its certificate, as with any Secret volume. A
// template that configures federation itself is left alone.
func federate(svc *v1alpha2.LLMInferenceService, pod *corev1.PodSpec, c *corev1.Container, has func(string) bool) {
	cluster := svc.Annotations[fleetv1alpha1.FederationClusterAnnotation]
	if cluster == "" || has("--"+fleetv1alpha1.FlagFederationPeersFile) {
		return
	}
	port := int32(fleetv1alpha1.FederationPort)
	if i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == fleetv1alpha1.FederationPortName }); i >= 0 {
		port = c.Ports[i].ContainerPort
	} else {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: fleetv1alpha1.FederationPortName, ContainerPort: port, Protocol: corev1.ProtocolTCP})
	}
	c.Args = append(c.Args,
		flag(fleetv1alpha1.FlagFederationCluster, cluster),
		flag(fleetv1alpha1.FlagFederationPort, strconv.Itoa(int(port))),
		flag(fleetv1alpha1.FlagFederationPeersFile, path.Join(federationPeersDir, fleetv1alpha1.PeerDirectoryKey)),
		flag(fleetv1alpha1.FlagFederationCertFile, path.Join(federationTLSDir, corev1.TLSCertKey)),
		flag(fleetv1alpha1.FlagFederationKeyFile, path.Join(federationTLSDir, corev1.TLSPrivateKeyKey)),
		flag(fleetv1alpha1.FlagFederationCAFile, path.Join(federationTLSDir, corev1.ServiceAccountRootCAKey)),
	)
	if mode := svc.Annotations[fleetv1alpha1.FederationModeAnnotation]; mode != "" && !has("--"+fleetv1alpha1.FlagFederationMode) {
		c.Args = append(c.Args, flag(fleetv1alpha1.FlagFederationMode, mode))
	}
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: federationPeersVolume, MountPath: federationPeersDir, ReadOnly: true},
		corev1.VolumeMount{Name: federationTLSVolume, MountPath: federationTLSDir, ReadOnly: true})
	pod.Volumes = append(pod.Volumes,
		corev1.Volume{Name: federationPeersVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: fleetv1alpha1.PeerDirectoryName(svc.Name)}}}},
		corev1.Volume{Name: federationTLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: fleetv1alpha1.FederationTLSName(svc.Name)}}})
}

// flag is a command-line flag as the picker parses it.
func flag(name, value string) string { return "--" + name + "=" + value }
