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
// +kubebuilder:printcolumn:name="Pending-Deletions",type="integer",JSONPath=".status.pendingDeletionCount",priority=1
// +kubebuilder:printcolumn:name="Held",type="integer",JSONPath=".status.heldDeletionCount",priority=1
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

	// PendingDeletions are the copies this hub made in the cluster whose
	// hub service is gone, as the hub's orphan collector last found them:
	// each is deleted when its grace period ends (deleteAfter) unless it
	// carries the deletion protection (held). Soonest first, held ones
	// last, at most MaxListedPendingDeletions; the two counts cover them
	// all. A copy whose service comes back within the grace leaves the
	// list and keeps running.
	// +optional
	// +listType=map
	// +listMapKey=namespace
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=20
	PendingDeletions []PendingDeletion `json:"pendingDeletions,omitempty"`

	// PendingDeletionCount is the number of copies waiting out their grace
	// period before the orphan collector deletes them, listed or not.
	// +optional
	PendingDeletionCount int32 `json:"pendingDeletionCount,omitempty"`

	// HeldDeletionCount is the number of copies whose hub service is gone
	// that the orphan collector keeps because they carry the deletion
	// protection label (fleet.fleetinfer.io/deletion-protected: Always).
	// +optional
	HeldDeletionCount int32 `json:"heldDeletionCount,omitempty"`
}

// MaxListedPendingDeletions bounds MemberClusterStatus.PendingDeletions, so
// that a hub restored without thousands of services keeps its status small.
const MaxListedPendingDeletions = 20

// PendingDeletion is one copy the orphan collector will delete, or would
// without its deletion protection.
type PendingDeletion struct {
	// Namespace of the copy (and of its hub service, now gone).
	Namespace string `json:"namespace"`

	// Name of the copy.
	Name string `json:"name"`

	// OrphanedSince is when the hub (its current leader) first found the
	// copy's hub service gone; the grace period counts from here.
	OrphanedSince metav1.Time `json:"orphanedSince"`

	// DeleteAfter is when the grace period ends and the collector deletes
	// the copy; unset while the copy is held.
	// +optional
	DeleteAfter *metav1.Time `json:"deleteAfter,omitempty"`

	// Held says the copy carries the deletion protection label: the
	// collector keeps it for as long as it does.
	// +optional
	Held bool `json:"held,omitempty"`
}

// +kubebuilder:object:root=true

// MemberClusterList is a list of MemberCluster.
type MemberClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MemberCluster `json:"items"`
}
