// Package v1alpha2 holds the serving.kserve.io/v1alpha2 API that fleetinfer
// accepts unchanged from KServe users: LLMInferenceService and
// LLMInferenceServiceConfig, schema-compatible with KServe v0.20.0.
//
// The CRDs also serve v1alpha1 (the version KServe's samples use) with this
// same schema plus v1alpha1's model.criticality, so a v1alpha1 object reads
// back unchanged in both versions without a conversion webhook. KServe's
// v1alpha1 additionally accepted the retired GIE v1alpha2 InferencePool shape
// in router.scheduler.pool.spec; fleetinfer rejects that shape with a
// validation error instead of pruning it.
//
// +kubebuilder:object:generate=true
// +groupName=serving.kserve.io
package v1alpha2

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "serving.kserve.io", Version: "v1alpha2"}

	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func init() {
	SchemeBuilder.Register(&LLMInferenceService{}, &LLMInferenceServiceList{},
		&LLMInferenceServiceConfig{}, &LLMInferenceServiceConfigList{})
}
