package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The contract between the hub, which writes into spoke clusters, the spoke
// controller, which reads what the hub wrote and runs the endpoint picker,
// and the endpoint picker itself. Each name is declared here once; users see
// them with kubectl and may select on them.
const (
	// ManagedByLabel marks objects the hub created in a spoke; the hub
	// updates and deletes only objects whose value says they are its own
	// (IsManagedByHub).
	ManagedByLabel = "fleet.fleetinfer.io/managed-by"
	// ManagedByHub is the label's value on what a fleetinfer hub created.
	ManagedByHub = "fleetinfer-hub"

	// HubIDLabel names the hub that created an object in a spoke, so that
	// several hubs (staging and production, blue and green, a restored
	// disaster-recovery hub) can share spokes: a hub updates and deletes
	// only what carries its own ID (IsOwnedByHub). The ID defaults to the
	// hub cluster's own identity (its kube-system namespace's UID); a hub
	// that is to take over another's copies, as a restore does, is given
	// that hub's ID.
	HubIDLabel = "fleet.fleetinfer.io/hub-id"

	// AcceptsHubLabel, on an existing spoke namespace, lets the hub whose
	// ID is its value write into it (HubMayWriteIn). Without it a hub
	// writes only into namespaces it created: a hub tenant whose namespace
	// happens to share a name with one of the spoke's own (monitoring,
	// argocd, default) must never be given it, with its ServiceAccounts
	// and Secrets. The spoke's admission policy (deploy/hub/spoke-access)
	// reads the same labels.
	AcceptsHubLabel = "fleet.fleetinfer.io/accepts-hub"

	// OriginUIDAnnotation is the UID of the hub object a copy came from.
	OriginUIDAnnotation = "fleet.fleetinfer.io/origin-uid"

	// ExportAnnotation on a spoke copy asks the spoke to export the
	// service's InferencePool to the ClusterSet; the spoke puts it on the
	// pool, where the hub's export controller finds it (GIE's multi-cluster
	// proposal, apix v1alpha1 ExportAnnotationKey and ExportAnnotationVal).
	ExportAnnotation = "inference.networking.x-k8s.io/export"
	// ExportClusterSet is the only export scope GIE defines.
	ExportClusterSet = "ClusterSet"

	// FederationClusterAnnotation on a spoke copy of a service names the
	// cluster the copy runs in and turns on federation of its endpoint
	// picker: the spoke controller mounts the peer directory and the
	// federation certificate named below and passes the federation flags.
	FederationClusterAnnotation = "fleet.fleetinfer.io/federation-cluster"
	// FederationModeAnnotation is the placement's federation mode (Endpoint
	// or Parent) on a copy; the hub writes it into the peer directories.
	FederationModeAnnotation = "fleet.fleetinfer.io/federation-mode"

	// ImportControllerName is the spoke's entry in an InferencePoolImport's
	// status.controllers: the import controller, which routes the import in
	// a cluster that runs none of the pool's pods (the hub's export
	// controller keeps its own entry, with the exporting clusters). An
	// import that carries it asks the hub to federate the cluster's picker
	// for the pool as a subscriber. The hub then labels the import with
	// the service it belongs to (app.kubernetes.io/name) and annotates it
	// with FederationClusterAnnotation, and publishes the picker's peer
	// directory and certificate next to it, owned by it, under the
	// service's names (PeerDirectoryName, FederationTLSName).
	ImportControllerName = "fleet.fleetinfer.io/import-controller"

	// PeerDirectoryKey is the key of the peer directory in its ConfigMap.
	PeerDirectoryKey = "peers.yaml"
	// FederationPort is the default federation gRPC port of the endpoint
	// picker, and FederationPortName the name of that container port.
	FederationPort     = 9004
	FederationPortName = "federation"

	// ForwardedPoolHeader is the request header by which a picker that
	// forwards a request to another cluster's gateway (Parent mode) names the
	// InferencePool it is for, as namespace/name. The forwarded request
	// leaves with the entry route's URL rewrite applied (Envoy rewrites for
	// any destination), so the exporting cluster's route, which matches the
	// original path, would not match it; the spoke adds a rule matching this
	// header to a federated service's route instead.
	ForwardedPoolHeader = "x-fleetinfer-pool"

	// PodNetworkLabel on a cluster's registration (OCM ManagedCluster or
	// ClusterProfile) names the pod network the cluster belongs to. Clusters
	// with the same value reach each other's pod addresses (a flat network:
	// Cilium Cluster Mesh, Submariner, GKE multi-cluster); only between them
	// does the hub let pickers use Endpoint mode. Without it a cluster's pods
	// are reachable from no other cluster, and peers reach it in Parent mode
	// through its gateway.
	PodNetworkLabel = "fleet.fleetinfer.io/pod-network"

	// DeletionProtectedLabel, set to DeletionProtectedAlways on a hub
	// LLMInferenceService or on an InferencePlacement (for every service it
	// selects), keeps the service's copies when the service is deleted: the
	// hub holds the deleted service (Terminating) until the label is
	// removed, and its orphan collector never deletes a copy that carries
	// the label, which the hub copies onto every copy it writes. It guards
	// against removing a service from the fleet by mistake, not against
	// moves: placement, failover and an explicit replicas: 0 still remove
	// the copies they remove. Modelled after Karmada's
	// resourcetemplate.karmada.io/deletion-protected: Always.
	DeletionProtectedLabel = "fleet.fleetinfer.io/deletion-protected"
	// DeletionProtectedAlways is the only value that protects, as in
	// Karmada: any other value protects nothing.
	DeletionProtectedAlways = "Always"
)

// IsDeletionProtected reports whether obj carries the deletion protection.
func IsDeletionProtected(obj metav1.Object) bool {
	return obj.GetLabels()[DeletionProtectedLabel] == DeletionProtectedAlways
}

// Flags of the endpoint picker (cmd/epp) that the spoke controller sets
// when it federates a picker, without the leading dashes.
const (
	FlagFederationCluster   = "federation-cluster"
	FlagFederationPort      = "federation-port"
	FlagFederationMode      = "federation-mode"
	FlagFederationPeersFile = "federation-peers-file"
	FlagFederationCertFile  = "federation-cert-file"
	FlagFederationKeyFile   = "federation-key-file"
	FlagFederationCAFile    = "federation-ca-file"
	// FlagFederationSourceAddress is the local address the picker's
	// federation connections leave from (Envoy's upstream bind config): for
	// a picker on a host with several addresses. Empty lets the system
	// choose.
	FlagFederationSourceAddress = "federation-source-address"
	// FlagFederationAllowLoopback admits peers' endpoints at loopback
	// addresses, which pickers otherwise refuse: for a fleet that lives on
	// loopback (the local fleet runs its pickers with it); each peer's
	// EndpointCIDRs still apply.
	FlagFederationAllowLoopback = "federation-allow-loopback"
)

// FederationServiceName is the Service, next to a service's copy, of type
// LoadBalancer that exposes the endpoint picker's federation port to other
// clusters; the spoke reports its load-balancer address as the picker's
// federation address.
func FederationServiceName(service string) string { return service + "-epp-federation" }

// PeerMode is the mode in which a picker in a cluster labelled a reaches
// the pods of a peer in a cluster labelled b (each the labels of its
// registration), when the placement asks for mode: Endpoint only when it is
// asked (or nothing is: Endpoint is the default) and the two clusters share
// a pod network (the same non-empty PodNetworkLabel), for a pod address is
// of no use where it is not routed; Parent otherwise, which needs only the
// peer's gateway.
func PeerMode(asked FederationMode, a, b map[string]string) FederationMode {
	if (asked == FederationEndpoint || asked == "") && SharePodNetwork(a, b) {
		return FederationEndpoint
	}
	return FederationParent
}

// SharePodNetwork reports whether two clusters, by the labels of their
// registrations, reach each other's pod addresses.
func SharePodNetwork(a, b map[string]string) bool {
	return a[PodNetworkLabel] != "" && a[PodNetworkLabel] == b[PodNetworkLabel]
}

// IsManagedByHub reports whether the hub created obj: the only objects in a
// spoke it may change or delete.
func IsManagedByHub(obj metav1.Object) bool {
	return obj.GetLabels()[ManagedByLabel] == ManagedByHub
}

// MarkManagedByHub labels obj as created by the hub.
func MarkManagedByHub(obj metav1.Object) {
	l := obj.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[ManagedByLabel] = ManagedByHub
	obj.SetLabels(l)
}

// ManagedByHubLabels selects what the hub created (for list options and
// cache selectors).
func ManagedByHubLabels() map[string]string {
	return map[string]string{ManagedByLabel: ManagedByHub}
}

// IsOwnedByHub reports whether the hub with this ID created obj.
func IsOwnedByHub(obj metav1.Object, hubID string) bool {
	return IsManagedByHub(obj) && obj.GetLabels()[HubIDLabel] == hubID
}

// MarkOwnedByHub labels obj as created by the hub with this ID.
func MarkOwnedByHub(obj metav1.Object, hubID string) {
	MarkManagedByHub(obj)
	obj.GetLabels()[HubIDLabel] = hubID
}

// OwnedByHubLabels selects what the hub with this ID created.
func OwnedByHubLabels(hubID string) map[string]string {
	return map[string]string{ManagedByLabel: ManagedByHub, HubIDLabel: hubID}
}

// PodSecurityEnforceLabel and HubNamespacePodSecurity: the Pod Security
// Standard the hub enforces on the namespaces it creates in spokes. Baseline
// forbids privileged pods, host namespaces, host paths and added
// capabilities, none of which the presets' model servers or pickers use;
// restricted would also require every pod to run as non-root with a
// seccomp profile, which model-server images often do not.
const (
	PodSecurityEnforceLabel = "pod-security.kubernetes.io/enforce"
	HubNamespacePodSecurity = "baseline"
)

// HubNamespaceLabels are the labels of a namespace the hub with this ID
// creates in a spoke: its ownership and its Pod Security level.
func HubNamespaceLabels(hubID string) map[string]string {
	l := OwnedByHubLabels(hubID)
	l[PodSecurityEnforceLabel] = HubNamespacePodSecurity
	return l
}

// HubMayWriteIn reports whether the hub with this ID may write into the
// spoke namespace ns: it created ns, or ns opts in to it (AcceptsHubLabel).
func HubMayWriteIn(ns metav1.Object, hubID string) bool {
	return IsOwnedByHub(ns, hubID) || ns.GetLabels()[AcceptsHubLabel] == hubID
}

// HubGroup is the group of the hub's identity in a spoke, with the
// ServiceAccounts of HubServiceAccountNamespace there: the spoke-access
// RBAC and admission policy (deploy/hub/spoke-access) match both.
const (
	HubGroup                   = "fleetinfer.io:hubs"
	HubServiceAccountNamespace = "fleetinfer-hub"
)

// PeerDirectoryName is the ConfigMap, next to a service's copy, that holds
// the peer directory of the service's endpoint picker.
func PeerDirectoryName(service string) string { return service + "-epp-peers" }

// FederationTLSName is the Secret, next to a service's copy, that holds the
// endpoint picker's federation certificate (tls.crt, tls.key) and the CA
// that signs its peers' (ca.crt).
func FederationTLSName(service string) string { return service + "-epp-federation" }
