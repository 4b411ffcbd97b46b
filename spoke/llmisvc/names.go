package llmisvc

import (
	"crypto/md5" //nolint:gosec // a name suffix, not a security boundary
	"encoding/hex"
	"strings"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

const (
	// Finalizer guards cluster-scoped children, which have no owner
	// reference; only a service that has one holds it (setFinalizer).
	Finalizer = "serving.kserve.io/llmisvc-finalizer"
	// ModelRoutingAnnotation is a preset switch that must not reach pods.
	ModelRoutingAnnotation = "serving.kserve.io/model-based-routing-enabled"
)

// childName joins a parent name and a suffix into a valid object name of at
// most 63 characters (a DNS label, which Services and pod-template owners
// need), replacing the tail of a long parent with a hash so that names stay
// unique and stable.
func childName(parent, suffix string) string { return boundedName(parent, suffix, 63) }

func boundedName(parent, suffix string, limit int) string {
	if len(parent)+len(suffix) <= limit {
		return parent + suffix
	}
	sum := md5.Sum([]byte(parent)) //nolint:gosec
	h := hex.EncodeToString(sum[:])
	keep := max(limit-len(suffix)-len(h), 0)
	return strings.TrimRight(parent[:keep], "-.") + h + suffix
}

// Names of a service's children, as KServe names them.
func mainDeploymentName(s *v1alpha2.LLMInferenceService) string { return childName(s.Name, "-kserve") }
func mainLWSName(s *v1alpha2.LLMInferenceService) string        { return childName(s.Name, "-kserve-mn") }
func prefillDeploymentName(s *v1alpha2.LLMInferenceService) string {
	return childName(s.Name, "-kserve-prefill")
}
func prefillLWSName(s *v1alpha2.LLMInferenceService) string {
	return childName(s.Name, "-kserve-mn-prefill")
}
func workloadServiceName(s *v1alpha2.LLMInferenceService) string {
	return childName(s.Name, "-kserve-workload-svc")
}
func poolName(s *v1alpha2.LLMInferenceService) string { return childName(s.Name, "-inference-pool") }
func schedulerName(s *v1alpha2.LLMInferenceService) string {
	return childName(s.Name, "-kserve-router-scheduler")
}
func eppServiceName(s *v1alpha2.LLMInferenceService) string { return childName(s.Name, "-epp-service") }
func eppSAName(s *v1alpha2.LLMInferenceService) string      { return childName(s.Name, "-epp-sa") }
func eppRoleName(s *v1alpha2.LLMInferenceService) string    { return childName(s.Name, "-epp-role") }
func eppBindingName(s *v1alpha2.LLMInferenceService) string { return childName(s.Name, "-epp-rb") }
func eppAuthBindingName(s *v1alpha2.LLMInferenceService) string {
	// Cluster-scoped: a DNS subdomain of up to 253 characters.
	return boundedName(s.Namespace+"-"+s.Name, "-epp-auth-rb", 253)
}
func routeName(s *v1alpha2.LLMInferenceService) string { return childName(s.Name, "-kserve-route") }

// selectorLabels identify a service's objects.
func selectorLabels(s *v1alpha2.LLMInferenceService) map[string]string {
	return map[string]string{v1alpha2.LabelPartOf: v1alpha2.PartOfValue, v1alpha2.LabelName: s.Name}
}

// workloadSelector selects the model-server pods of a service, decode and
// prefill alike: the workload Service and the default pool selector.
func workloadSelector(s *v1alpha2.LLMInferenceService) map[string]string {
	l := selectorLabels(s)
	l[v1alpha2.LabelKServe] = v1alpha2.KServeWorkload
	return l
}

// pickerLabels label a service's endpoint picker (its pods, Service and
// RBAC) and select its pods.
func pickerLabels(s *v1alpha2.LLMInferenceService) map[string]string {
	return withLabels(selectorLabels(s), v1alpha2.LabelComponent, v1alpha2.ComponentScheduler)
}

func withLabels(base map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(base)+len(kv)/2)
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}
