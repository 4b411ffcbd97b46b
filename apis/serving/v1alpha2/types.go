package v1alpha2

import (
	"strings"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// LLMInferenceService is one LLM deployment: model servers, the Service in
// front of them and, optionally, the InferencePool, endpoint picker and
// HTTPRoute that expose it through a Gateway.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=llminferenceservices,shortName=llmisvc
// +kubebuilder:printcolumn:name="URL",type="string",JSONPath=".status.url"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].reason"
// +kubebuilder:printcolumn:name="Clusters",type="integer",JSONPath=".status.placedClusters",description="Clusters the fleetinfer hub placed the service on"
// +kubebuilder:printcolumn:name="Ready Clusters",type="integer",JSONPath=".status.readyClusters",description="Placed clusters whose copy runs its share ready"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="URLs",type="string",JSONPath=".status.addresses[*].url",priority=1
// +kubebuilder:storageversion
type LLMInferenceService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LLMInferenceServiceSpec   `json:"spec,omitempty"`
	Status LLMInferenceServiceStatus `json:"status,omitempty"`
}

// StopAnnotation set to "true" stops a service, as in KServe: its workloads
// and router objects are removed, and the hub stops federating its picker.
const StopAnnotation = "serving.kserve.io/stop"

// Stopped reports whether the service carries the stop annotation.
func (s *LLMInferenceService) Stopped() bool {
	return strings.EqualFold(s.Annotations[StopAnnotation], "true")
}

// +kubebuilder:object:root=true

// LLMInferenceServiceList is a list of LLMInferenceService.
type LLMInferenceServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LLMInferenceService `json:"items"`
}

// LLMInferenceServiceConfig is a partial, templated LLMInferenceServiceSpec
// that services inherit through spec.baseRefs, and the form of the
// well-known presets.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].reason"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:storageversion
type LLMInferenceServiceConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LLMInferenceServiceSpec         `json:"spec,omitempty"`
	Status LLMInferenceServiceConfigStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// LLMInferenceServiceConfigList is a list of LLMInferenceServiceConfig.
type LLMInferenceServiceConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LLMInferenceServiceConfig `json:"items"`
}

// LLMInferenceServiceConfigStatus is the observed state of a config.
type LLMInferenceServiceConfigStatus struct {
	Status `json:",inline"`

	// ReferencedBy lists the services that use this config.
	// +optional
	// +listType=atomic
	ReferencedBy []UntypedObjectReference `json:"referencedBy,omitempty"`
}

// LLMInferenceServiceSpec is the desired state of a service. In a config,
// every field is optional.
type LLMInferenceServiceSpec struct {
	// Model is the model to serve.
	// +optional
	Model LLMModelSpec `json:"model"`

	// StorageInitializer controls the init container that fetches the model.
	// +optional
	StorageInitializer *StorageInitializerSpec `json:"storageInitializer,omitempty"`

	// WorkloadSpec is the main workload: the decode side when Prefill is set.
	// +optional
	WorkloadSpec `json:",inline,omitempty"`

	// Router exposes the service: HTTPRoute, Gateway and endpoint picker.
	// +optional
	Router *RouterSpec `json:"router,omitempty"`

	// Prefill, when set, adds a separate prefill workload (prefill/decode
	// disaggregation).
	// +optional
	Prefill *WorkloadSpec `json:"prefill,omitempty"`

	// Tracing, when present (even empty), turns on distributed tracing.
	// +optional
	Tracing *TracingSpec `json:"tracing,omitempty"`

	// BaseRefs are LLMInferenceServiceConfigs merged under this spec, later
	// entries overriding earlier ones; the service's own spec wins.
	// +optional
	BaseRefs []corev1.LocalObjectReference `json:"baseRefs,omitempty"`
}

// WorkloadSpec is one workload: its replicas and pod templates.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.replicas) && has(self.scaling))",message="replicas and scaling are mutually exclusive; use scaling for autoscaled deployments or replicas for static deployments"
// +kubebuilder:validation:XValidation:rule="!has(self.worker) || (has(self.parallelism) && (has(self.parallelism.data) || has(self.parallelism.dataLocal) || has(self.parallelism.pipeline)))",message="when worker is specified, parallelism must be configured for either data parallelism or pipeline parallelism"
// +kubebuilder:validation:XValidation:rule="(has(self.parallelism) && has(self.parallelism.data) && has(self.parallelism.dataLocal) ? (self.parallelism.data / self.parallelism.dataLocal > 1 ? self.parallelism.data / self.parallelism.dataLocal : 1) : (has(self.parallelism) && has(self.parallelism.pipeline) ? self.parallelism.pipeline : 1)) == (has(oldSelf.parallelism) && has(oldSelf.parallelism.data) && has(oldSelf.parallelism.dataLocal) ? (oldSelf.parallelism.data / oldSelf.parallelism.dataLocal > 1 ? oldSelf.parallelism.data / oldSelf.parallelism.dataLocal : 1) : (has(oldSelf.parallelism) && has(oldSelf.parallelism.pipeline) ? oldSelf.parallelism.pipeline : 1))",message="total parallelism size (the LeaderWorkerSet group size) is immutable; delete and recreate the service to change it"
type WorkloadSpec struct {
	// Replicas is the number of replicas (groups, for multi-node). Left
	// unset, the controller keeps whatever an autoscaler set.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`

	// Scaling configures autoscaling; exclusive with Replicas.
	// +optional
	Scaling *ScalingSpec `json:"scaling,omitempty"`

	// Parallelism of the model server (tensor, pipeline, data, expert).
	// +optional
	Parallelism *ParallelismSpec `json:"parallelism,omitempty"`

	// Labels added to the workload's pods.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to the workload's pods.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// Template is the pod of a single-node workload, or the leader pod of a
	// multi-node one.
	// +optional
	Template *corev1.PodSpec `json:"template,omitempty"`

	// Worker, when set, makes the workload multi-node (a LeaderWorkerSet);
	// it is the worker pod.
	// +optional
	Worker *corev1.PodSpec `json:"worker,omitempty"`

	// KVCacheOffloading configures vLLM's tiered KV-cache offloading.
	// +optional
	KVCacheOffloading *KVCacheOffloadingSpec `json:"kvCacheOffloading,omitempty"`
}

// KVCacheOffloadingSpec configures KV-cache offloading to CPU memory and
// further tiers.
type KVCacheOffloadingSpec struct {
	// CPU is the CPU memory for the first offload tier.
	CPU resource.Quantity `json:"cpu"`

	// EvictionPolicy of the CPU tier.
	// +optional
	// +kubebuilder:validation:Enum=lru;arc
	// +kubebuilder:default=lru
	EvictionPolicy string `json:"evictionPolicy,omitempty"`

	// Secondary tiers, in cascade order.
	// +optional
	Secondary []SecondaryTierSpec `json:"secondary,omitempty"`
}

// SecondaryTierSpec is one further KV-cache tier.
type SecondaryTierSpec struct {
	// +optional
	FileSystem *FileSystemTierSpec `json:"fileSystem,omitempty"`
}

// FileSystemTierSpec is a disk tier on an emptyDir or a PVC.
type FileSystemTierSpec struct {
	// +optional
	EmptyDir *EmptyDirTierSpec `json:"emptyDir,omitempty"`
	// +optional
	PVC *PVCTierSpec `json:"pvc,omitempty"`
}

// EmptyDirTierSpec sizes a node-local disk tier.
type EmptyDirTierSpec struct {
	Size resource.Quantity `json:"size"`
}

// PVCTierSpec is a disk tier on a per-pod ephemeral PVC or an existing one.
type PVCTierSpec struct {
	// +optional
	Spec *corev1.PersistentVolumeClaimSpec `json:"spec,omitempty"`
	// +optional
	Ref *PVCRefTierSpec `json:"ref,omitempty"`
}

// PVCRefTierSpec names an existing PVC and a path in it.
type PVCRefTierSpec struct {
	Name string `json:"name"`
	// +optional
	Path string `json:"path,omitempty"`
}

// ConfidentialSpec enables serving encrypted model artifacts.
type ConfidentialSpec struct {
	Enabled bool `json:"enabled"`
	// +optional
	ResourceId *string `json:"resourceId,omitempty"` //nolint:revive // wire name fixed by KServe
}

// Criticality is the v1alpha1 model priority, kept so v1alpha1 objects
// round-trip unchanged.
// +kubebuilder:validation:Enum=Critical;Standard;Sheddable
type Criticality string

// LLMModelSpec is the model to serve.
type LLMModelSpec struct {
	// URI of the model, e.g. hf://facebook/opt-125m, s3://, pvc://, oci://.
	URI string `json:"uri"`

	// Name is the model name clients send in requests; defaults to the
	// service's name.
	// +optional
	Name *string `json:"name,omitempty"`

	// Criticality is accepted for serving.kserve.io/v1alpha1 objects.
	// +optional
	Criticality *Criticality `json:"criticality,omitempty"`

	// LoRA adapters served on top of the model.
	// +optional
	LoRA *LoRASpec `json:"lora,omitempty"`

	// Confidential enables encrypted model artifacts.
	// +optional
	Confidential *ConfidentialSpec `json:"confidential,omitempty"`
}

// LoRASpec configures LoRA adapters.
type LoRASpec struct {
	// Adapters to load. Names must be unique.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Adapters []LoRAAdapter `json:"adapters,omitempty"`

	// MaxRank maps to vLLM --max-lora-rank.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxRank *int32 `json:"maxRank,omitempty"`

	// MaxAdapters maps to vLLM --max-loras.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxAdapters *int32 `json:"maxAdapters,omitempty"`

	// MaxCpuAdapters maps to vLLM --max-cpu-loras.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxCpuAdapters *int32 `json:"maxCpuAdapters,omitempty"` //nolint:revive // wire name fixed by KServe
}

// LoRAAdapter is one adapter. KServe declares adapters as model specs
// without a schema; the known fields are typed here and anything else is
// preserved.
//
// +kubebuilder:pruning:PreserveUnknownFields
// +kubebuilder:validation:XValidation:rule="self.name != '.' && self.name != '..'",message="adapter name must not be '.' or '..'"
type LoRAAdapter struct {
	// Name the adapter is requested by.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// URI of the adapter (hf://, s3://, pvc://).
	// +optional
	URI string `json:"uri,omitempty"`
}

// StorageInitializerSpec controls the model-fetching init container.
type StorageInitializerSpec struct {
	// Enabled, when false, skips the init container.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// RouterSpec exposes the service.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.route) && has(self.route.http) && has(self.route.http.refs) && size(self.route.http.refs) > 0 && has(self.gateway) && (!has(self.gateway.refs) || size(self.gateway.refs) == 0))",message="custom HTTP routes (spec.router.route.http.refs) cannot be used with a managed gateway (spec.router.gateway); either remove spec.router.route.http.refs or set spec.router.gateway.refs"
type RouterSpec struct {
	// Route: {} for a managed HTTPRoute, or refs/spec.
	// +optional
	Route *GatewayRoutesSpec `json:"route,omitempty"`

	// Gateway: {} for the default Gateway, or refs to existing Gateways.
	// +optional
	Gateway *GatewaySpec `json:"gateway,omitempty"`

	// Ingress refs to existing Ingresses.
	// +optional
	Ingress *IngressSpec `json:"ingress,omitempty"`

	// Scheduler: the InferencePool and its endpoint picker.
	// +optional
	Scheduler *SchedulerSpec `json:"scheduler,omitempty"`
}

// GatewayRoutesSpec configures the HTTPRoute and routing group.
type GatewayRoutesSpec struct {
	// +optional
	HTTP *HTTPRouteSpec `json:"http,omitempty"`

	// Group is the routing group this service shares traffic with.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`
	Group *string `json:"group,omitempty"`

	// Weight is the service's share of its group's traffic.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	Weight *int32 `json:"weight,omitempty"`
}

// HTTPRouteSpec is either refs to existing routes or an inline route spec.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.refs) && size(self.refs) > 0 && has(self.spec))",message="cannot use both custom HTTPRoute refs (spec.router.route.http.refs) and an inline route spec (spec.router.route.http.spec); choose one"
type HTTPRouteSpec struct {
	// Refs are user-managed HTTPRoutes; the controller only reads them.
	// +optional
	Refs []corev1.LocalObjectReference `json:"refs,omitempty"`

	// Spec is a route the controller creates and manages.
	// +optional
	Spec *gwapiv1.HTTPRouteSpec `json:"spec,omitempty"`
}

// GatewaySpec refers to existing Gateways.
type GatewaySpec struct {
	// +optional
	Refs []GatewayObjectReference `json:"refs,omitempty"`
}

// IngressSpec refers to existing Ingresses.
type IngressSpec struct {
	// +optional
	Refs []UntypedObjectReference `json:"refs,omitempty"`
}

// SchedulerSpec configures the InferencePool and its endpoint picker (EPP).
type SchedulerSpec struct {
	// Pool is an inline InferencePool spec or a ref to an existing pool.
	// +optional
	Pool *InferencePoolSpec `json:"pool,omitempty"`

	// Labels added to the EPP pods.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// Annotations added to the EPP pods.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// Template is the EPP pod.
	// +optional
	Template *corev1.PodSpec `json:"template,omitempty"`

	// Config is the EndpointPickerConfig, inline or from a ConfigMap.
	// +optional
	Config *SchedulerConfigSpec `json:"config,omitempty"`

	// Replicas of the EPP; more than one runs with leader election.
	// +optional
	// +kubebuilder:validation:Minimum=1
	Replicas *int32 `json:"replicas,omitempty"`
}

// SchedulerConfigSpec holds an EndpointPickerConfig inline or by reference,
// exactly one of the two. Inline has no schema (KServe accepts an object or a
// YAML string), so CEL cannot see it and the controller enforces the choice,
// reporting InvalidSchedulerConfig.
type SchedulerConfigSpec struct {
	// Inline EndpointPickerConfig, as an object or as a YAML string.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	Inline *runtime.RawExtension `json:"inline,omitempty"`

	// Ref is a ConfigMap key holding an EndpointPickerConfig (key defaults
	// to "epp").
	// +optional
	Ref *corev1.ConfigMapKeySelector `json:"ref,omitempty"`
}

// InferencePoolSpec is an inline GIE v1 pool spec or a ref to a pool.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.spec) && has(self.ref))",message="pool spec and pool ref are mutually exclusive"
type InferencePoolSpec struct {
	// +optional
	Spec *igwapiv1.InferencePoolSpec `json:"spec,omitempty"`
	// +optional
	Ref *corev1.LocalObjectReference `json:"ref,omitempty"`
}

// ScalingSpec configures autoscaling through the Workload Variant Autoscaler.
//
// +kubebuilder:validation:XValidation:rule="has(self.wva)",message="wva is required when scaling is configured; it provides the autoscaling mechanism"
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="minReplicas cannot exceed maxReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.wva) || !has(self.wva.keda) || !has(self.wva.keda.idleReplicaCount) || has(self.minReplicas)",message="minReplicas is required when idleReplicaCount is set; idleReplicaCount must be less than minReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.wva) || !has(self.wva.keda) || !has(self.wva.keda.idleReplicaCount) || !has(self.minReplicas) || self.wva.keda.idleReplicaCount < self.minReplicas",message="idleReplicaCount must be less than minReplicas; idleReplicaCount defines the replica floor when no triggers are active"
type ScalingSpec struct {
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// +kubebuilder:validation:Minimum=1
	MaxReplicas int32 `json:"maxReplicas"`

	// +optional
	WVA *WVASpec `json:"wva,omitempty"`
}

// WVASpec configures the Workload Variant Autoscaler.
type WVASpec struct {
	// VariantCost is the cost of one replica, a non-negative number.
	// +optional
	// +kubebuilder:validation:Pattern=`^\d+(\.\d+)?$`
	// +kubebuilder:default="10.0"
	VariantCost string `json:"variantCost,omitempty"`

	ActuatorSpec `json:",inline"`
}

// ActuatorSpec picks the scaling actuator: an HPA or a KEDA ScaledObject.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.hpa) && has(self.keda))",message="hpa and keda are mutually exclusive; choose one actuator backend"
// +kubebuilder:validation:XValidation:rule="has(self.hpa) || has(self.keda)",message="either hpa or keda must be specified as the actuator backend"
type ActuatorSpec struct {
	// +optional
	HPA *HPAScalingSpec `json:"hpa,omitempty"`
	// +optional
	KEDA *KEDAScalingSpec `json:"keda,omitempty"`
}

// HPAScalingSpec is the HPA actuator.
type HPAScalingSpec struct {
	// +optional
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
}

// KEDAScalingSpec is the KEDA actuator, with KEDA ScaledObject fields.
//
// +kubebuilder:validation:XValidation:rule="!has(self.advanced) || !has(self.advanced.scalingModifiers) || (size(self.advanced.scalingModifiers.formula) == 0 && size(self.advanced.scalingModifiers.target) == 0 && size(self.advanced.scalingModifiers.activationTarget) == 0 && size(self.advanced.scalingModifiers.metricType) == 0)",message="scalingModifiers must not be set; WVA controls the scaling metric formula and logic"
// +kubebuilder:validation:XValidation:rule="!has(self.advanced) || !has(self.advanced.horizontalPodAutoscalerConfig) || size(self.advanced.horizontalPodAutoscalerConfig.name) == 0",message="horizontalPodAutoscalerConfig.name must not be set; the controller manages the HPA name"
type KEDAScalingSpec struct {
	// +optional
	// +kubebuilder:validation:Minimum=1
	PollingInterval *int32 `json:"pollingInterval,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	CooldownPeriod *int32 `json:"cooldownPeriod,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	InitialCooldownPeriod *int32 `json:"initialCooldownPeriod,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	IdleReplicaCount *int32 `json:"idleReplicaCount,omitempty"`
	// +optional
	Fallback *KEDAFallback `json:"fallback,omitempty"`
	// +optional
	Advanced *KEDAAdvancedConfig `json:"advanced,omitempty"`
}

// KEDAFallback is KEDA's fallback replica policy.
type KEDAFallback struct {
	FailureThreshold int32 `json:"failureThreshold"`
	Replicas         int32 `json:"replicas"`
	// +optional
	// +kubebuilder:validation:Enum=static;currentReplicas;currentReplicasIfHigher;currentReplicasIfLower
	// +kubebuilder:default=static
	Behavior string `json:"behavior,omitempty"`
}

// KEDAAdvancedConfig is KEDA's advanced ScaledObject configuration.
type KEDAAdvancedConfig struct {
	// +optional
	HorizontalPodAutoscalerConfig *KEDAHPAConfig `json:"horizontalPodAutoscalerConfig,omitempty"`
	// +optional
	RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount,omitempty"`
	// +optional
	ScalingModifiers KEDAScalingModifiers `json:"scalingModifiers,omitempty"`
}

// KEDAHPAConfig configures the HPA KEDA creates.
type KEDAHPAConfig struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
}

// KEDAScalingModifiers combines KEDA triggers with a formula.
type KEDAScalingModifiers struct {
	// +optional
	Formula string `json:"formula,omitempty"`
	// +optional
	Target string `json:"target,omitempty"`
	// +optional
	ActivationTarget string `json:"activationTarget,omitempty"`
	// +optional
	// +kubebuilder:validation:Enum=AverageValue;Value
	MetricType autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
}

// TracingSpec configures OpenTelemetry tracing.
type TracingSpec struct {
	// +optional
	ExporterEndpoint *string `json:"exporterEndpoint,omitempty"`
	// +optional
	Sampler *string `json:"sampler,omitempty"`
	// +optional
	SamplerArg *string `json:"samplerArg,omitempty"`
	// +optional
	Exporter *string `json:"exporter,omitempty"`
}

// ParallelismSpec is the model server's parallelism.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.pipeline) && (has(self.data) || has(self.dataLocal)))",message="cannot set both pipeline parallelism and data parallelism (data or dataLocal) simultaneously"
// +kubebuilder:validation:XValidation:rule="!has(self.data) || has(self.dataLocal)",message="dataLocal must be set when data is set"
// +kubebuilder:validation:XValidation:rule="!has(self.dataLocal) || has(self.data)",message="data must be set when dataLocal is set"
type ParallelismSpec struct {
	// +optional
	// +kubebuilder:validation:Minimum=1
	Tensor *int32 `json:"tensor,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	Pipeline *int32 `json:"pipeline,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	Data *int32 `json:"data,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	DataLocal *int32 `json:"dataLocal,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	DataRPCPort *int32 `json:"dataRPCPort,omitempty"`
	// +optional
	Expert bool `json:"expert,omitempty"`
}

// UntypedObjectReference names an object in a namespace.
type UntypedObjectReference struct {
	Name      gwapiv1.ObjectName `json:"name,omitempty"`
	Namespace gwapiv1.Namespace  `json:"namespace,omitempty"`
}

// GatewayObjectReference names a Gateway and optionally one listener.
type GatewayObjectReference struct {
	UntypedObjectReference `json:",inline"`
	// +optional
	SectionName *gwapiv1.SectionName `json:"sectionName,omitempty"`
}

// GroupSize is the number of pods in one multi-node replica: data over
// dataLocal with data parallelism (ranks per pod), the pipeline size with
// pipeline parallelism, else 1. The hub sizes a replica's accelerator need
// by it and the spoke sizes its LeaderWorkerSet groups by it.
func (p *ParallelismSpec) GroupSize() int32 {
	switch {
	case p == nil:
		return 1
	case p.Data != nil || p.DataLocal != nil:
		data, local := int32(1), int32(1)
		if p.Data != nil {
			data = max(*p.Data, 1)
		}
		if p.DataLocal != nil {
			local = max(*p.DataLocal, 1)
		}
		return max(data/local, 1)
	case p.Pipeline != nil:
		return max(*p.Pipeline, 1)
	}
	return 1
}
