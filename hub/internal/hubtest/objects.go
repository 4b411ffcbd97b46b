package hubtest

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// Namespace is the namespace name, labelled labels.
func Namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// Capacity is a spoke's capacity report of accelerators.
func Capacity(accelerators ...fleetv1alpha1.AcceleratorCapacity) *fleetv1alpha1.ClusterCapacity {
	return &fleetv1alpha1.ClusterCapacity{ObjectMeta: metav1.ObjectMeta{Name: fleetv1alpha1.ClusterCapacityName},
		Status: fleetv1alpha1.ClusterCapacityStatus{Accelerators: accelerators}}
}

// GPUNode is one node's accelerators of resource r and product: allocatable
// of them, free free.
func GPUNode(r corev1.ResourceName, product string, allocatable, free int64) fleetv1alpha1.AcceleratorCapacity {
	return fleetv1alpha1.AcceleratorCapacity{Resource: r, Product: product, Nodes: 1, Allocatable: allocatable,
		Requested: allocatable - free, Free: free, LargestFreeOnNode: free, FreeNodes: []fleetv1alpha1.FreeBucket{{Free: free, Nodes: 1}}}
}
