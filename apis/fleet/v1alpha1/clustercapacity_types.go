package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterCapacityName is the name of the one ClusterCapacity of a cluster.
const ClusterCapacityName = "cluster"

// ClusterCapacity reports a cluster's accelerators: per product, how many
// the nodes offer and how many running or scheduled pods have requested. The
// spoke controller keeps the single object named "cluster" current within a
// second of a pod being bound or removed, so the hub learns free GPUs by
// reading one small object per cluster instead of listing every pod.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ccap
// +kubebuilder:printcolumn:name="Accelerators",type="string",JSONPath=".status.summary"
// +kubebuilder:printcolumn:name="Nodes",type="integer",JSONPath=".status.nodes"
// +kubebuilder:printcolumn:name="Updated",type="date",JSONPath=".status.updateTime"
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'cluster'",message="a cluster has one ClusterCapacity, named 'cluster'"
type ClusterCapacity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status ClusterCapacityStatus `json:"status,omitempty"`
}

// ClusterCapacityStatus is the observed capacity.
type ClusterCapacityStatus struct {
	// Accelerators, one entry per resource and product.
	// +optional
	// +listType=map
	// +listMapKey=resource
	// +listMapKey=product
	Accelerators []AcceleratorCapacity `json:"accelerators,omitempty"`

	// Nodes is the number of schedulable, Ready nodes counted.
	Nodes int32 `json:"nodes"`

	// Summary is a one-line, human-readable form of Accelerators.
	// +optional
	Summary string `json:"summary,omitempty"`

	// UpdateTime is when the numbers last changed.
	// +optional
	UpdateTime metav1.Time `json:"updateTime,omitempty"`
}

// AcceleratorCapacity is the capacity of one accelerator product.
type AcceleratorCapacity struct {
	// Product is the accelerator model as the vendor's feature discovery
	// labels it (nvidia.com/gpu.product, amd.com/gpu.product-name,
	// gpu.intel.com/product, cloud.google.com/gke-tpu-accelerator), or
	// "unknown".
	Product string `json:"product"`
	// Resource is the extended resource pods request: nvidia.com/gpu,
	// amd.com/gpu, gpu.intel.com/i915, gpu.intel.com/xe or google.com/tpu.
	Resource corev1.ResourceName `json:"resource"`
	// Nodes with this product.
	Nodes int32 `json:"nodes"`
	// Allocatable is the sum over those nodes.
	Allocatable int64 `json:"allocatable"`
	// Requested is the sum of the requests of the pods bound to those nodes
	// that have not finished.
	Requested int64 `json:"requested"`
	// Free is Allocatable minus Requested.
	Free int64 `json:"free"`
	// LargestFreeOnNode is the most a single pod can still get on one node.
	LargestFreeOnNode int64 `json:"largestFreeOnNode"`
	// FreeNodes counts nodes by how many accelerators they have free, so a
	// placement can tell how many pods of a given size still fit.
	// +optional
	// +listType=map
	// +listMapKey=free
	FreeNodes []FreeBucket `json:"freeNodes,omitempty"`
	// MemoryMiB is the memory of one accelerator, when labelled.
	// +optional
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
}

// FreeBucket is the number of nodes with a given number of free
// accelerators.
type FreeBucket struct {
	Free  int64 `json:"free"`
	Nodes int32 `json:"nodes"`
}

// PodsThatFit is how many pods requesting perPod accelerators of this
// product can still be scheduled, node by node.
func (a *AcceleratorCapacity) PodsThatFit(perPod int64) int64 {
	if perPod <= 0 {
		return 0
	}
	var n int64
	for _, b := range a.FreeNodes {
		n += int64(b.Nodes) * (b.Free / perPod)
	}
	return n
}

// +kubebuilder:object:root=true

// ClusterCapacityList is a list of ClusterCapacity.
type ClusterCapacityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterCapacity `json:"items"`
}
