package v1alpha1

// Labels, annotations and names shared by the hub, which writes them into
// spoke clusters, and the spoke controller, which reads them. They are part
// of the API: users see them with kubectl and may select on them.
const (
	// ManagedByLabel marks objects the hub created in a spoke; the hub
	// updates and deletes only objects that carry it with ManagedByHub.
	ManagedByLabel = "fleet.fleetinfer.io/managed-by"
	ManagedByHub   = "fleetinfer-hub"

	// OriginUIDAnnotation is the UID of the hub object a copy came from.
	OriginUIDAnnotation = "fleet.fleetinfer.io/origin-uid"

	// FederationClusterAnnotation on a spoke copy of a service names the
	// cluster the copy runs in and turns on federation of its endpoint
	// picker: the spoke controller mounts the peer directory and the
	// federation certificate named below and passes the federation flags.
	FederationClusterAnnotation = "fleet.fleetinfer.io/federation-cluster"
	// FederationModeAnnotation is the placement's federation mode (Endpoint
	// or Parent) on a copy; the hub writes it into the peer directories.
	FederationModeAnnotation = "fleet.fleetinfer.io/federation-mode"

	// PeerDirectoryKey is the key of the peer directory in its ConfigMap.
	PeerDirectoryKey = "peers.yaml"
	// FederationPort is the federation gRPC port of fleetinfer's EPP.
	FederationPort = 9004

	// GatewayPeerPortAnnotation on a spoke's inference Gateway is the port
	// on the Gateway's address where other clusters' gateways forward
	// requests in Parent mode; without it the first listener's port is used.
	GatewayPeerPortAnnotation = "fleet.fleetinfer.io/peer-port"
)

// PeerDirectoryName is the ConfigMap, next to a service's copy, that holds
// the peer directory of the service's endpoint picker.
func PeerDirectoryName(service string) string { return service + "-epp-peers" }

// FederationTLSName is the Secret, next to a service's copy, that holds the
// endpoint picker's federation certificate (tls.crt, tls.key) and the CA
// that signs its peers' (ca.crt).
func FederationTLSName(service string) string { return service + "-epp-federation" }
