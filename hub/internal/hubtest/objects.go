package hubtest

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
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

// nodesBehind are Ready nodes that allocate what the capacity reports among
// objs claim, as a real cluster's nodes back its report (the hub bounds a
// report by the nodes).
func nodesBehind(objs []client.Object) []client.Object {
	var nodes []client.Object
	for _, o := range objs {
		cc, ok := o.(*fleetv1alpha1.ClusterCapacity)
		if !ok {
			continue
		}
		for _, a := range cc.Status.Accelerators {
			count := max(int64(a.Nodes), 1)
			for i := range count {
				alloc := a.Allocatable / count
				if i == 0 {
					alloc += a.Allocatable % count
				}
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: strings.ToLower(fmt.Sprintf("%s-%s-%d", a.Product, strings.ReplaceAll(string(a.Resource), "/", "-"), i)),
					Labels: map[string]string{}},
					Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{a.Resource: *resource.NewQuantity(alloc, resource.DecimalSI)},
						Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
				if l := accelerator.ProductLabel(a.Resource); l != "" && a.Product != "unknown" {
					n.Labels[l] = a.Product
				}
				nodes = append(nodes, n)
			}
		}
	}
	return nodes
}
