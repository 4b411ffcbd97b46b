package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterSetLabel on a cluster's registration (its kubeconfig Secret, OCM
// ManagedCluster or ClusterProfile) names the cluster set it belongs to, as
// OCM's cluster.open-cluster-management.io/clusterset does. A cluster
// belongs to at most one named set, and to GlobalClusterSet.
const ClusterSetLabel = "fleet.fleetinfer.io/clusterset"

// GlobalClusterSet is the set every cluster belongs to; binding it gives a
// namespace the whole fleet.
const GlobalClusterSet = "global"

// ClusterSetBinding lets the services of its namespace be placed on the
// clusters of one cluster set, as OCM's ManagedClusterSetBinding does for
// Placements. While the hub requires bindings (its
// --require-cluster-set-binding, on by default), a placement chooses only
// among clusters of the sets bound in its namespace; the others show in
// status.placement.notEligible with the reason. Who may create bindings in
// a namespace is who may give it clusters: grant create on
// clustersetbindings to the platform team, not to tenants.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=csb
// +kubebuilder:printcolumn:name="ClusterSet",type="string",JSONPath=".spec.clusterSet"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type ClusterSetBinding struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ClusterSetBindingSpec `json:"spec"`
}

// ClusterSetBindingSpec names the bound set.
type ClusterSetBindingSpec struct {
	// ClusterSet is the value of fleet.fleetinfer.io/clusterset on the
	// clusters this namespace may use, or "global" for every cluster.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="clusterSet is immutable; create another binding"
	ClusterSet string `json:"clusterSet"`
}

// +kubebuilder:object:root=true

// ClusterSetBindingList is a list of ClusterSetBinding.
type ClusterSetBindingList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterSetBinding `json:"items"`
}

// InBoundSet reports whether a cluster with these registration labels is in
// one of the bound sets.
func InBoundSet(bound map[string]bool, clusterLabels map[string]string) bool {
	if bound[GlobalClusterSet] {
		return true
	}
	set := clusterLabels[ClusterSetLabel]
	return set != "" && bound[set]
}

func init() {
	SchemeBuilder.Register(&ClusterSetBinding{}, &ClusterSetBindingList{})
}
