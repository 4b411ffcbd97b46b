package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MemberClusterAvailable is the condition type of a MemberCluster that the
// hub can place services on: True while the hub reaches the cluster's API
// server and its registration (OCM ManagedCluster, ClusterProfile) does not
// say otherwise.
const MemberClusterAvailable = "Available"

// Reasons of the Available condition.
const (
	ReasonClusterAvailable   = "ClusterAvailable"
	ReasonClusterUnavailable = "ClusterUnavailable"
)

// MemberClusterHubLeaseHeld is the condition type of a MemberCluster whose
// hub Lease (one per hub ID in every spoke) this hub holds: only then does
// it write there. False while another hub installation with the same hub
// ID holds it (this hub stands by for the cluster), or before the hub
// could acquire it.
const MemberClusterHubLeaseHeld = "HubLeaseHeld"

// Reasons of the HubLeaseHeld condition.
const (
	ReasonHubLeaseHeld        = "HubLeaseHeld"
	ReasonHeldByAnotherHub    = "HeldByAnotherHub"
	ReasonHubLeaseNotAcquired = "HubLeaseNotAcquired"
)

// MemberCluster is the hub's view of one member cluster, named after it:
// whether the hub can place services there and the accelerators it
// reports. The hub creates one for every cluster it engages, keeps its
// status current and deletes it when the cluster leaves, so that
// `kubectl get memberclusters` on the hub shows the fleet's health.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=member
// +kubebuilder:printcolumn:name="Available",type="string",JSONPath=".status.conditions[?(@.type=='Available')].status"
// +kubebuilder:printcolumn:name="Accelerators",type="string",JSONPath=".status.summary"
// +kubebuilder:printcolumn:name="Nodes",type="integer",JSONPath=".status.nodes"
// +kubebuilder:printcolumn:name="Message",type="string",JSONPath=".status.conditions[?(@.type=='Available')].message",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type MemberCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status MemberClusterStatus `json:"status,omitempty"`
}

// MemberClusterStatus is what the hub observes of a member cluster.
type MemberClusterStatus struct {
	// Conditions: Available.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Accelerators are the cluster's ClusterCapacity report, as the hub
	// last read it; empty while the cluster reports none.
	// +optional
	// +listType=map
	// +listMapKey=resource
	// +listMapKey=product
	Accelerators []AcceleratorCapacity `json:"accelerators,omitempty"`

	// Nodes is the number of schedulable, Ready nodes the report counts.
	// +optional
	Nodes int32 `json:"nodes,omitempty"`

	// Summary is the report's one-line form: free/total per product.
	// +optional
	Summary string `json:"summary,omitempty"`
}

// +kubebuilder:object:root=true

// MemberClusterList is a list of MemberCluster.
type MemberClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MemberCluster `json:"items"`
}
