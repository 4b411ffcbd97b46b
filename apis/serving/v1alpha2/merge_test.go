package v1alpha2

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// Merging keeps base fields the override leaves unset and merges containers
// and env by name.
func TestMergeSpecsOverridesOnlyWhatIsSet(t *testing.T) {
	base := LLMInferenceServiceSpec{
		Model:        LLMModelSpec{URI: "hf://base/model", Name: ptr.To("base")},
		WorkloadSpec: WorkloadSpec{Replicas: ptr.To(int32(2)), Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "base-image", Env: []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "1"}}}}}},
	}
	override := LLMInferenceServiceSpec{
		Model:        LLMModelSpec{Name: ptr.To("mine")},
		WorkloadSpec: WorkloadSpec{Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Env: []corev1.EnvVar{{Name: "B", Value: "2"}}}, {Name: "sidecar", Image: "s"}}}},
	}
	got, err := MergeSpecs(base, override)
	if err != nil {
		t.Fatal(err)
	}
	if got.Model.URI != "hf://base/model" || *got.Model.Name != "mine" || *got.Replicas != 2 {
		t.Errorf("model %+v replicas %v", got.Model, got.Replicas)
	}
	cs := got.Template.Containers
	if len(cs) != 2 || cs[0].Image != "base-image" {
		t.Fatalf("containers %+v", cs)
	}
	env := map[string]string{}
	for _, e := range cs[0].Env {
		env[e.Name] = e.Value
	}
	if env["A"] != "1" || env["B"] != "2" {
		t.Errorf("env %v", env)
	}
}
