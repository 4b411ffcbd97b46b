// Package v1alpha1 is fleetinfer's own API, fleet.fleetinfer.io/v1alpha1:
// what the hub needs to place LLMInferenceServices across GPU clusters and
// what each spoke reports about itself.
//
// +kubebuilder:object:generate=true
// +groupName=fleet.fleetinfer.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "fleet.fleetinfer.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func init() {
	SchemeBuilder.Register(&ClusterCapacity{}, &ClusterCapacityList{}, &MemberCluster{}, &MemberClusterList{})
}
