package v1alpha2

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// Config composition (KServe semantics): presets, then baseRefs in order,
// then the service's own spec, each merged over the previous with strategic
// merge patch, so pod containers, volumes and env merge by name.

// MergeAll folds the specs left to right, each overriding the previous.
func MergeAll(specs []LLMInferenceServiceSpec) (LLMInferenceServiceSpec, error) {
	var out LLMInferenceServiceSpec
	for i, s := range specs {
		if i == 0 {
			out = *s.DeepCopy()
			continue
		}
		var err error
		if out, err = MergeSpecs(out, s); err != nil {
			return out, err
		}
	}
	return out, nil
}

// MergeSpecs applies override on top of base with strategic merge patch
// semantics. The patch is the difference between an empty spec and the
// override, so fields the override leaves unset never clear the base.
func MergeSpecs(base, override LLMInferenceServiceSpec) (LLMInferenceServiceSpec, error) {
	var out LLMInferenceServiceSpec
	baseJSON, err := json.Marshal(base)
	if err != nil {
		return out, err
	}
	overJSON, err := json.Marshal(override)
	if err != nil {
		return out, err
	}
	zeroJSON, err := json.Marshal(LLMInferenceServiceSpec{})
	if err != nil {
		return out, err
	}
	patch, err := strategicpatch.CreateTwoWayMergePatch(zeroJSON, overJSON, LLMInferenceServiceSpec{})
	if err != nil {
		return out, fmt.Errorf("diff override: %w", err)
	}
	merged, err := strategicpatch.StrategicMergePatch(baseJSON, patch, LLMInferenceServiceSpec{})
	if err != nil {
		return out, fmt.Errorf("merge: %w", err)
	}
	err = json.Unmarshal(merged, &out)
	return out, err
}
