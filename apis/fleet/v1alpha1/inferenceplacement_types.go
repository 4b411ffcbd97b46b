package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InferencePlacement places the LLMInferenceServices of its namespace on
// GPU clusters: which clusters are eligible, how many run each service, how
// replicas are divided among them and when a failed cluster's replicas move.
// The services themselves stay plain KServe objects.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=iplace
// +kubebuilder:printcolumn:name="Strategy",type="string",JSONPath=".spec.replicas.strategy"
// +kubebuilder:printcolumn:name="Services",type="integer",JSONPath=".status.placedServices"
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type InferencePlacement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   InferencePlacementSpec   `json:"spec,omitempty"`
	Status InferencePlacementStatus `json:"status,omitempty"`
}

// InferencePlacementSpec is the desired placement.
//
// +kubebuilder:validation:XValidation:rule="self.replicas.strategy != 'Weighted' || (has(self.replicas.weights) && size(self.replicas.weights) > 0)",message="replicas.weights is required with the Weighted strategy"
// +kubebuilder:validation:XValidation:rule="self.replicas.strategy == 'Weighted' || !has(self.replicas.weights)",message="replicas.weights is only used by the Weighted strategy"
// +kubebuilder:validation:XValidation:rule="self.replicas.strategy == 'Overflow' || !has(self.replicas.preference)",message="replicas.preference is only used by the Overflow strategy"
// +kubebuilder:validation:XValidation:rule="self.replicas.strategy != 'Duplicated' || !has(self.replicas.total)",message="replicas.total divides replicas among clusters; the Duplicated strategy runs the service's own replica count in every cluster"
type InferencePlacementSpec struct {
	// ServiceSelector selects the LLMInferenceServices of this namespace
	// that the placement applies to; empty selects all of them.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="serviceSelector: matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['Exists', 'DoesNotExist'] || (has(e.values) && size(e.values) > 0))",message="serviceSelector: matchExpressions[].values must not be empty for In and NotIn (an empty list matches nothing); leave the expression out instead"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, !(e.operator in ['Exists', 'DoesNotExist']) || !has(e.values) || size(e.values) == 0)",message="serviceSelector: matchExpressions[].values must be empty for Exists and DoesNotExist"
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`

	// Clusters are the eligible clusters; without any constraint every
	// registered cluster is.
	// +optional
	Clusters ClusterAffinity `json:"clusters,omitempty"`

	// MaxClusters caps how many clusters run each service; the clusters
	// with the most room for it are chosen. Unset uses every eligible
	// cluster (within what the strategy needs).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxClusters *int32 `json:"maxClusters,omitempty"`

	// Replicas is how replicas are spread.
	// +optional
	// +kubebuilder:default={strategy: Duplicated}
	Replicas ReplicaScheduling `json:"replicas,omitempty"`

	// Accelerator overrides what each replica needs, which is otherwise
	// derived from the service's pod templates (nvidia.com/gpu requests and
	// a nvidia.com/gpu.product node selector).
	// +optional
	Accelerator *AcceleratorRequirement `json:"accelerator,omitempty"`

	// Failover says when a failed cluster's replicas move.
	// +optional
	Failover Failover `json:"failover,omitempty"`

	// Rollout says how a change to a service reaches its clusters.
	// +optional
	Rollout Rollout `json:"rollout,omitempty"`

	// Federation connects the endpoint pickers of the clusters a service is
	// placed on, so that each can pick the fleet's best pod.
	// +optional
	Federation Federation `json:"federation,omitempty"`
}

// ClusterAffinity selects clusters. All given constraints must hold.
type ClusterAffinity struct {
	// Names lists eligible clusters by name.
	// +optional
	// +listType=set
	Names []string `json:"names,omitempty"`

	// Selector matches cluster labels (the OCM ManagedCluster's, the
	// ClusterProfile's, or the registration Secret's).
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="clusters.selector: matchExpressions[].operator must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['Exists', 'DoesNotExist'] || (has(e.values) && size(e.values) > 0))",message="clusters.selector: matchExpressions[].values must not be empty for In and NotIn (an empty list matches nothing); leave the expression out instead"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, !(e.operator in ['Exists', 'DoesNotExist']) || !has(e.values) || size(e.values) == 0)",message="clusters.selector: matchExpressions[].values must be empty for Exists and DoesNotExist"
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// Properties match ClusterProfile properties and OCM cluster claims.
	// +optional
	Properties []PropertyRequirement `json:"properties,omitempty"`

	// OCMPlacement follows the PlacementDecisions of an OCM Placement in
	// this namespace: only the clusters it decides are eligible.
	// +optional
	OCMPlacement *LocalReference `json:"ocmPlacement,omitempty"`
}

// LocalReference names an object in the same namespace.
type LocalReference struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// PropertyRequirement is a condition on a named cluster property.
//
// +kubebuilder:validation:XValidation:rule="self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : has(self.values) && size(self.values) > 0",message="values must be set for In, NotIn, Gt and Lt and empty for Exists and DoesNotExist"
// +kubebuilder:validation:XValidation:rule="!(self.operator in ['Gt', 'Lt']) || size(self.values) == 1",message="Gt and Lt take exactly one value"
type PropertyRequirement struct {
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// +kubebuilder:validation:Enum=In;NotIn;Exists;DoesNotExist;Gt;Lt
	Operator string `json:"operator"`
	// +optional
	Values []string `json:"values,omitempty"`
}

// ReplicaStrategy names how replicas are spread.
// +kubebuilder:validation:Enum=Duplicated;Weighted;FreeCapacity;Overflow
type ReplicaStrategy string

// Replica strategies.
const (
	// Duplicated runs the service's replica count in every chosen cluster.
	Duplicated ReplicaStrategy = "Duplicated"
	// Weighted divides the total by static weights.
	Weighted ReplicaStrategy = "Weighted"
	// FreeCapacity divides the total in proportion to how many replicas
	// each cluster can still fit.
	FreeCapacity ReplicaStrategy = "FreeCapacity"
	// Overflow fills clusters in preference order up to what each can fit
	// and spills the rest to the next.
	Overflow ReplicaStrategy = "Overflow"
)

// ReplicaScheduling spreads replicas.
type ReplicaScheduling struct {
	// +kubebuilder:default=Duplicated
	// +optional
	Strategy ReplicaStrategy `json:"strategy,omitempty"`

	// Total is the number of replicas to divide among clusters; unset, it is
	// the service's spec.replicas (1 if unset).
	// +optional
	// +kubebuilder:validation:Minimum=0
	Total *int32 `json:"total,omitempty"`

	// Weights of the Weighted strategy; clusters without a weight get none.
	// +optional
	// +listType=map
	// +listMapKey=cluster
	Weights []ClusterWeight `json:"weights,omitempty"`

	// Preference orders clusters for Overflow, most preferred first;
	// eligible clusters not listed follow, by name.
	// +optional
	// +listType=set
	Preference []string `json:"preference,omitempty"`

	// Rebalance says whether replicas move back to a cluster that recovers
	// from a failure: OnRecovery recomputes the placement with it, Never
	// leaves replicas where failover put them until the placement or the
	// service changes.
	// +optional
	// +kubebuilder:validation:Enum=OnRecovery;Never
	// +kubebuilder:default=OnRecovery
	Rebalance string `json:"rebalance,omitempty"`
}

// ClusterWeight is a static weight.
type ClusterWeight struct {
	// +kubebuilder:validation:MinLength=1
	Cluster string `json:"cluster"`
	// +kubebuilder:validation:Minimum=1
	Weight int32 `json:"weight"`
}

// AcceleratorRequirement is what one replica needs.
type AcceleratorRequirement struct {
	// Resource is the accelerator's extended resource. Empty means the one
	// the service's pods request, or nvidia.com/gpu when they request none.
	// +optional
	// +kubebuilder:validation:Enum=nvidia.com/gpu;amd.com/gpu;gpu.intel.com/i915;gpu.intel.com/xe;google.com/tpu
	Resource corev1.ResourceName `json:"resource,omitempty"`
	// Product is the accelerator model as the resource's vendor labels it
	// (nvidia.com/gpu.product, amd.com/gpu.product-name,
	// gpu.intel.com/product, cloud.google.com/gke-tpu-accelerator); empty
	// accepts any.
	// +optional
	Product string `json:"product,omitempty"`
	// Count of accelerators one replica requests (all pods of a multi-node
	// group together).
	// +kubebuilder:validation:Minimum=0
	Count int32 `json:"count"`
}

// Failover configures moving replicas off a failed cluster, or off a
// cluster whose copy does not turn Ready.
type Failover struct {
	// TolerationSeconds is how long a cluster may be unreachable or
	// reported unavailable before its replicas move to healthy clusters.
	// Its old copy stays until the replacements are Ready.
	// +optional
	// +kubebuilder:default=60
	// +kubebuilder:validation:Minimum=0
	TolerationSeconds *int32 `json:"tolerationSeconds,omitempty"`

	// ReadyTimeoutSeconds is how long a cluster's copy may take to turn
	// Ready after the hub created it or changed its spec (pods Pending for
	// GPUs taken since the decision, images that do not pull, crash loops).
	// Past it the copy is Stuck: its replicas are placed on other eligible
	// clusters, and the stuck copy stays until they are Ready; when no other
	// cluster can take them nothing moves. A stuck cluster gets none of the
	// service's replicas until the placement or the service changes. Unset,
	// the hub's --default-ready-timeout (10m) applies.
	// +optional
	// +kubebuilder:validation:Minimum=10
	ReadyTimeoutSeconds *int32 `json:"readyTimeoutSeconds,omitempty"`
}

// RolloutStrategy names how a change to a service reaches its clusters.
// +kubebuilder:validation:Enum=All;Progressive
type RolloutStrategy string

const (
	// RolloutAll writes a change to every cluster at once.
	RolloutAll RolloutStrategy = "All"
	// RolloutProgressive writes a change to a few clusters at a time, and to
	// the next ones only once those run it Ready.
	RolloutProgressive RolloutStrategy = "Progressive"
)

// Rollout stages a change to a service (its spec, labels or annotations;
// not its replica count) across the clusters it runs in, as OCM's
// ManifestWorkReplicaSet rolloutStrategy does for manifests. A stage is
// healthy when every updated copy reports Ready at its current generation
// and has stayed Ready for minReadySeconds. A stage not healthy within
// progressDeadlineSeconds, or a copy found Stuck (failover), stalls the
// rollout: no further cluster is
// updated, the clusters not yet updated keep running the previous spec, and
// the service's RolledOut condition says RolloutStalled and why. A copy
// that is not Ready is updated at once, outside maxConcurrentClusters: it
// serves nothing the update could take away, and a fix (a new change) so
// reaches the clusters a bad version broke first. Clusters that newly get
// the service get the current spec.
//
// +kubebuilder:validation:XValidation:rule="self.strategy == 'Progressive' || (!has(self.maxConcurrentClusters) && !has(self.minReadySeconds) && !has(self.progressDeadlineSeconds))",message="maxConcurrentClusters, minReadySeconds and progressDeadlineSeconds are only used by the Progressive strategy"
type Rollout struct {
	// +optional
	// +kubebuilder:default=All
	Strategy RolloutStrategy `json:"strategy,omitempty"`

	// MaxConcurrentClusters is how many clusters are updated at once
	// (Progressive; 1 when unset).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxConcurrentClusters *int32 `json:"maxConcurrentClusters,omitempty"`

	// MinReadySeconds is how long an updated copy must stay Ready before
	// the next clusters are updated (Progressive; 0 when unset).
	// +optional
	// +kubebuilder:validation:Minimum=0
	MinReadySeconds *int32 `json:"minReadySeconds,omitempty"`

	// ProgressDeadlineSeconds is how long an updated copy may take to turn
	// Ready before the rollout stalls (Progressive; 600 when unset).
	// +optional
	// +kubebuilder:validation:Minimum=10
	ProgressDeadlineSeconds *int32 `json:"progressDeadlineSeconds,omitempty"`
}

// FederationMode is how requests reach the pods of another cluster.
// +kubebuilder:validation:Enum=Endpoint;Parent;Disabled
type FederationMode string

const (
	// FederationEndpoint sends requests straight to a remote pod's ip:port;
	// it needs a pod network that spans the clusters.
	FederationEndpoint FederationMode = "Endpoint"
	// FederationParent sends requests to the remote cluster's gateway and
	// names the chosen pod as a hint its endpoint picker honours.
	FederationParent FederationMode = "Parent"
	// FederationDisabled keeps each cluster's endpoint picker to its own pods.
	FederationDisabled FederationMode = "Disabled"
)

// Federation configures the endpoint-picker federation of placed services.
// The hub gives each cluster's picker a peer directory naming the pickers of
// the same service in the other placed clusters, and an mTLS certificate
// from the hub's federation CA.
type Federation struct {
	// Mode is how requests reach another cluster's pods.
	// +optional
	// +kubebuilder:default=Endpoint
	Mode FederationMode `json:"mode,omitempty"`
}

// InferencePlacementStatus is the outcome: per service, the clusters chosen
// and why.
type InferencePlacementStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// PlacedServices is the number of services placed.
	// +optional
	PlacedServices int32 `json:"placedServices,omitempty"`
	// Services are the decisions, one per selected service.
	// +optional
	// +listType=map
	// +listMapKey=name
	Services []ServiceDecision `json:"services,omitempty"`
}

// ServiceDecision is where one service runs.
type ServiceDecision struct {
	Name string `json:"name"`
	// +optional
	Clusters []ClusterDecision `json:"clusters,omitempty"`
	// UnplacedReplicas did not fit anywhere.
	// +optional
	UnplacedReplicas int32 `json:"unplacedReplicas,omitempty"`
	// Message explains the decision.
	// +optional
	Message string `json:"message,omitempty"`
}

// ClusterDecision is one cluster's share.
type ClusterDecision struct {
	Name     string `json:"name"`
	Replicas int32  `json:"replicas"`
	// Reason the cluster got this share.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// +kubebuilder:object:root=true

// InferencePlacementList is a list of InferencePlacement.
type InferencePlacementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InferencePlacement `json:"items"`
}

func init() {
	SchemeBuilder.Register(&InferencePlacement{}, &InferencePlacementList{})
}
