package v1alpha2

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// LLMInferenceServiceStatus is the observed state of a service.
type LLMInferenceServiceStatus struct {
	// URL is the service's primary address: an external one when there is
	// one, otherwise the first address found.
	// +optional
	URL *string `json:"url,omitempty"`

	Status `json:",inline"`

	// Address is kept for schema compatibility and never set; see Addresses.
	// +optional
	Address *Addressable `json:"address,omitempty"`

	// Addresses where the service is reachable, with the resource that
	// produced each.
	// +optional
	// +listType=atomic
	Addresses []SourcedAddress `json:"addresses,omitempty"`

	// Router is the routing topology observed at the last reconcile.
	// +optional
	Router *RouterStatus `json:"router,omitempty"`

	// Workloads are the workload objects observed at the last reconcile.
	// +optional
	Workloads *WorkloadStatus `json:"workloads,omitempty"`

	// AppliedConfigRefs are the configs merged into the spec, in precedence
	// order: presets first, then baseRefs; the service's own spec wins over
	// all of them.
	// +optional
	// +listType=atomic
	AppliedConfigRefs []AppliedConfigRef `json:"appliedConfigs,omitempty"`

	// Clusters is set by the fleetinfer hub on the service it places: one
	// entry per GPU cluster that runs (or is leaving) a copy. A fleetinfer
	// extension; KServe's schema has no such field.
	// +optional
	// +listType=map
	// +listMapKey=name
	Clusters []ClusterStatus `json:"clusters,omitempty"`

	// PlacedClusters is set by the fleetinfer hub on the service it places:
	// how many clusters the decision in force gives replicas (a kubectl
	// column). A fleetinfer extension.
	// +optional
	PlacedClusters *int32 `json:"placedClusters,omitempty"`
	// ReadyClusters is set by the fleetinfer hub: how many of the placed
	// clusters run their share ready (a kubectl column). A fleetinfer
	// extension.
	// +optional
	ReadyClusters *int32 `json:"readyClusters,omitempty"`

	// Placement is set by the fleetinfer hub on the service it places: the
	// decision in force, which the hub keeps until its inputs change. A
	// fleetinfer extension.
	// +optional
	Placement *PlacementStatus `json:"placement,omitempty"`

	// Federation is set by the spoke controller on a copy the fleetinfer hub
	// placed with federation on: where the endpoint pickers and gateways of
	// other clusters reach this cluster's picker and gateway. The hub
	// publishes it in the other clusters' peer directories. A fleetinfer
	// extension.
	// +optional
	Federation *FederationStatus `json:"federation,omitempty"`
}

// PlacementStatus is the hub's placement decision in force for a service;
// the replicas each cluster gets are in Clusters.
type PlacementStatus struct {
	// PlacementName is the InferencePlacement the decision followed.
	// +optional
	PlacementName string `json:"placementName,omitempty"`
	// InputsHash identifies the inputs of the decision (the placement's
	// clusters, replica scheduling and accelerator, the service's replica
	// count and accelerator need, and the eligible clusters); the hub
	// decides again only when they change, not on other edits.
	InputsHash string `json:"inputsHash"`
	// UnplacedReplicas fit in no cluster when the decision was made; they
	// are placed as soon as room appears.
	// +optional
	UnplacedReplicas int32 `json:"unplacedReplicas,omitempty"`
	// FailedOverClusters lost their replicas while unavailable; with
	// rebalance: Never they get none back when they recover.
	// +optional
	// +listType=set
	FailedOverClusters []string `json:"failedOverClusters,omitempty"`
	// LastDecisionTime is when the decision in force was made.
	// +optional
	LastDecisionTime *metav1.Time `json:"lastDecisionTime,omitempty"`
	// StuckClusters held a copy that was not Ready within the placement's
	// ready timeout; they get none of the service's replicas until the
	// placement or the service changes (their generations here differ from
	// the objects'), or, when no other cluster could take the replicas, until
	// the stuck copy turns Ready.
	// +optional
	// +listType=map
	// +listMapKey=name
	StuckClusters []StuckCluster `json:"stuckClusters,omitempty"`
	// CopyClocks time each chosen cluster's copy against the ready timeout,
	// from when the hub created it or changed its spec; kept here so a
	// restarted hub counts on from where it was.
	// +optional
	// +listType=map
	// +listMapKey=cluster
	CopyClocks []CopyClock `json:"copyClocks,omitempty"`
	// NotEligible are the clusters the decision left out, each with why.
	// +optional
	// +listType=map
	// +listMapKey=name
	NotEligible []ExcludedCluster `json:"notEligible,omitempty"`
}

// ExcludedCluster is a cluster a placement decision did not consider.
type ExcludedCluster struct {
	// Name of the cluster.
	Name string `json:"name"`
	// Reason it was left out, e.g. "labels do not match", "has no
	// NVIDIA-H100-80GB-HBM3 (nvidia.com/gpu)".
	Reason string `json:"reason"`
}

// StuckCluster is a cluster whose copy of the service was not Ready within
// the ready timeout.
type StuckCluster struct {
	// Name of the cluster.
	Name string `json:"name"`
	// Since is when the hub found the copy stuck.
	Since metav1.Time `json:"since"`
	// PlacementGeneration and ServiceGeneration are the generations of the
	// InferencePlacement and the hub service then: a new one of either makes
	// the cluster eligible again.
	PlacementGeneration int64 `json:"placementGeneration"`
	ServiceGeneration   int64 `json:"serviceGeneration"`
}

// CopyClock is when the hub asked one cluster's copy to run its current
// spec, and whether it has been Ready since.
type CopyClock struct {
	// Cluster holding the copy.
	Cluster string `json:"cluster"`
	// Generation is the copy's metadata.generation the clock runs for: a
	// new one (the hub changed the spec) restarts it.
	Generation int64 `json:"generation"`
	// AskedAt is when the hub created the copy or changed its spec to that
	// generation (or first saw it there).
	AskedAt metav1.Time `json:"askedAt"`
	// Ready says the copy has been Ready at that generation: its clock has
	// stopped, and it is never Stuck until its spec changes.
	// +optional
	Ready bool `json:"ready,omitempty"`
	// ReadySince is when the hub first saw the copy Ready at that
	// generation: a progressive rollout's next stage waits for the
	// placement's minReadySeconds from it.
	// +optional
	ReadySince *metav1.Time `json:"readySince,omitempty"`
}

// FederationStatus is how other clusters reach a copy's endpoint picker.
type FederationStatus struct {
	// PickerAddress is host:port of the endpoint picker's federation server.
	// +optional
	PickerAddress string `json:"pickerAddress,omitempty"`
	// GatewayAddress is host:port where other clusters' gateways send this
	// service's requests (Parent mode).
	// +optional
	GatewayAddress string `json:"gatewayAddress,omitempty"`
}

// ClusterStatus is one cluster's copy of a hub service.
type ClusterStatus struct {
	// Name of the cluster.
	Name string `json:"name"`
	// DesiredReplicas is the cluster's share.
	DesiredReplicas int32 `json:"desiredReplicas"`
	// PlacementReason says why the cluster got its share.
	// +optional
	PlacementReason string `json:"placementReason,omitempty"`
	// ReadyReplicas is what the copy reports.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`
	// Ready is the copy's Ready condition.
	Ready bool `json:"ready"`
	// Phase: Placing (copy being created), Running, Leaving (kept until
	// replacements are ready), Stuck (not Ready within the placement's ready
	// timeout), Unreachable, Conflict.
	// +optional
	Phase string `json:"phase,omitempty"`
	// URL of the copy, as its cluster reports it.
	// +optional
	URL string `json:"url,omitempty"`
	// Message explains a copy that is not ready.
	// +optional
	Message string `json:"message,omitempty"`
}

// Status is the condition block shared by services and configs, in the
// Knative duck-type wire format KServe uses.
type Status struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions of the resource.
	// +optional
	Conditions Conditions `json:"conditions,omitempty"`

	// Annotations carry controller state, such as the preset names a
	// service was first reconciled with.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Addressable is an address in the Knative duck-type format.
type Addressable struct {
	// +optional
	Name *string `json:"name,omitempty"`
	// +optional
	URL *string `json:"url,omitempty"`
	// +optional
	CACerts *string `json:"CACerts,omitempty"`
	// +optional
	Audience *string `json:"audience,omitempty"`
}

// SourcedAddress is an address with the resource that produced it.
type SourcedAddress struct {
	Addressable `json:",inline"`

	// Origin is the Gateway (or other resource) behind the address.
	// +optional
	Origin *gwapiv1.ObjectReference `json:"origin,omitempty"`

	// +optional
	Models []ModelSourcedAddressStatus `json:"models,omitempty"`
}

// ModelSourcedAddressStatus names a model served at an address.
type ModelSourcedAddressStatus struct {
	Name string `json:"name"`
}

// RouterStatus is the observed routing topology.
type RouterStatus struct {
	// +optional
	// +listType=atomic
	Gateways []ObservedGateway `json:"gateways,omitempty"`
	// +optional
	Scheduler *ObservedSchedulerStatus `json:"scheduler,omitempty"`
	// +optional
	Group *GroupStatus `json:"group,omitempty"`
}

// ObservedGateway is a Gateway with the listeners and routes bound through it.
type ObservedGateway struct {
	gwapiv1.ObjectReference `json:",inline"`
	// +optional
	// +listType=atomic
	Listeners []gwapiv1.SectionName `json:"listeners,omitempty"`
	// +optional
	// +listType=atomic
	HTTPRoutes []gwapiv1.ObjectReference `json:"httpRoutes,omitempty"`
}

// ObservedSchedulerStatus is the pool and EPP Service in use.
type ObservedSchedulerStatus struct {
	// +optional
	InferencePool *gwapiv1.ObjectReference `json:"inferencePool,omitempty"`
	// +optional
	Service *gwapiv1.ObjectReference `json:"service,omitempty"`
}

// GroupStatus is the observed routing group.
type GroupStatus struct {
	Name string `json:"name"`
	// +optional
	// +listType=map
	// +listMapKey=name
	Members []GroupMemberStatus `json:"members,omitempty"`
}

// GroupMemberStatus is one member of a routing group.
type GroupMemberStatus struct {
	Name   string `json:"name"`
	Weight int32  `json:"weight"`
	// +optional
	Stopped bool `json:"stopped,omitempty"`
	// +optional
	BackendRef *gwapiv1.BackendObjectReference `json:"backendRef,omitempty"`
}

// ObservedWorkloadStatus is a workload object and its ready replicas.
type ObservedWorkloadStatus struct {
	corev1.TypedLocalObjectReference `json:",inline"`
	// +optional
	ReadyReplicas *int32 `json:"readyReplicas,omitempty"`
}

// WorkloadStatus lists the workload objects of a service.
type WorkloadStatus struct {
	// Primary is the main (decode) Deployment or LeaderWorkerSet.
	// +optional
	Primary *ObservedWorkloadStatus `json:"primary,omitempty"`
	// +optional
	Prefill *ObservedWorkloadStatus `json:"prefill,omitempty"`
	// +optional
	Service *corev1.TypedLocalObjectReference `json:"service,omitempty"`
	// Scheduler is the EPP Deployment.
	// +optional
	Scheduler *ObservedWorkloadStatus `json:"scheduler,omitempty"`
}

// AppliedConfigSource says why a config was merged.
// +kubebuilder:validation:Enum=Preset;UserRef
type AppliedConfigSource string

const (
	// AppliedConfigSourcePreset is a well-known preset chosen from the
	// service's shape.
	AppliedConfigSourcePreset AppliedConfigSource = "Preset"
	// AppliedConfigSourceUserRef is a config named in spec.baseRefs.
	AppliedConfigSourceUserRef AppliedConfigSource = "UserRef"
)

// AppliedConfigRef is one merged config.
type AppliedConfigRef struct {
	Name      gwapiv1.ObjectName  `json:"name"`
	Namespace gwapiv1.Namespace   `json:"namespace"`
	Source    AppliedConfigSource `json:"source"`
}
