// Package nodecapacity counts the accelerators a cluster's nodes offer
// (NVIDIA, AMD and Intel GPUs, TPUs) per resource and product, and what the
// unfinished pods bound to them take, counted as the hub counts a replica's
// need (internal/accelerator). The spoke reports it in its ClusterCapacity;
// the hub bounds such a report by the nodes it sees itself.
package nodecapacity

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/nodestatus"
)

// unknownProduct stands for the product of nodes whose vendor label is
// missing.
const unknownProduct = "unknown"

// Compute aggregates the capacity of nodes given the pods bound to them.
// Unschedulable and NotReady nodes offer nothing; finished pods request
// nothing.
func Compute(nodes []corev1.Node, pods []corev1.Pod) fleetv1alpha1.ClusterCapacityStatus {
	type key struct {
		resource corev1.ResourceName
		product  string
	}
	requested := map[string]corev1.ResourceList{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		on := requested[p.Spec.NodeName]
		if on == nil {
			on = corev1.ResourceList{}
			requested[p.Spec.NodeName] = on
		}
		for _, r := range accelerator.Resources {
			if n := accelerator.PodRequest(&p.Spec, r); n > 0 {
				q := on[r]
				q.Add(*resource.NewQuantity(n, resource.DecimalSI))
				on[r] = q
			}
		}
	}
	byProduct := map[key]*fleetv1alpha1.AcceleratorCapacity{}
	st := fleetv1alpha1.ClusterCapacityStatus{}
	for i := range nodes {
		n := &nodes[i]
		if n.Spec.Unschedulable || !nodestatus.Ready(n) {
			continue
		}
		st.Nodes++
		for r, q := range n.Status.Allocatable {
			alloc := q.Value()
			if !accelerator.IsAccelerator(r) || alloc == 0 {
				continue
			}
			product := n.Labels[accelerator.ProductLabel(r)]
			if product == "" {
				product = unknownProduct
			}
			k := key{r, product}
			a := byProduct[k]
			if a == nil {
				a = &fleetv1alpha1.AcceleratorCapacity{Product: product, Resource: r}
				byProduct[k] = a
			}
			if l := accelerator.MemoryLabel(r); l != "" {
				if mem, err := strconv.ParseInt(n.Labels[l], 10, 64); err == nil && mem > a.MemoryMiB {
					a.MemoryMiB = mem
				}
			}
			a.Nodes++
			a.Allocatable += alloc
			q := requested[n.Name][r]
			used := q.Value()
			a.Requested += used
			a.LargestFreeOnNode = max(a.LargestFreeOnNode, alloc-used)
			addFree(a, max(alloc-used, 0))
		}
	}
	for _, a := range byProduct {
		a.Free = a.Allocatable - a.Requested
		st.Accelerators = append(st.Accelerators, *a)
	}
	sort.Slice(st.Accelerators, func(i, j int) bool {
		a, b := st.Accelerators[i], st.Accelerators[j]
		if a.Product != b.Product {
			return a.Product < b.Product
		}
		return a.Resource < b.Resource
	})
	st.Summary = summarize(st.Accelerators)
	return st
}

// summarize is the report's one-line form: free/total per product.
func summarize(accelerators []fleetv1alpha1.AcceleratorCapacity) string {
	summary := make([]string, len(accelerators))
	for i, a := range accelerators {
		summary[i] = fmt.Sprintf("%s %d/%d free", a.Product, a.Free, a.Allocatable)
	}
	return strings.Join(summary, ", ")
}

func addFree(a *fleetv1alpha1.AcceleratorCapacity, free int64) {
	for i := range a.FreeNodes {
		if a.FreeNodes[i].Free == free {
			a.FreeNodes[i].Nodes++
			return
		}
	}
	a.FreeNodes = append(a.FreeNodes, fleetv1alpha1.FreeBucket{Free: free, Nodes: 1})
	sort.Slice(a.FreeNodes, func(i, j int) bool { return a.FreeNodes[i].Free > a.FreeNodes[j].Free })
}

// Bound caps a capacity report at what nodes offer, so that a report, a
// spoke's claim, cannot draw more replicas than its nodes could run: per
// resource and product, allocatable and free at most what the
// schedulable, Ready nodes allocate, the largest free and the free buckets
// at most the largest node, node counts at most theirs. Accelerators no
// node offers are dropped. capped says whether the report claimed more.
func Bound(report fleetv1alpha1.ClusterCapacityStatus, nodes []corev1.Node) (out fleetv1alpha1.ClusterCapacityStatus, capped bool) {
	offer := Compute(nodes, nil)
	out = *report.DeepCopy()
	out.Accelerators = out.Accelerators[:0]
	if out.Nodes > offer.Nodes {
		out.Nodes, capped = offer.Nodes, true
	}
	for _, a := range report.Accelerators {
		i := slices.IndexFunc(offer.Accelerators, func(o fleetv1alpha1.AcceleratorCapacity) bool {
			return o.Resource == a.Resource && o.Product == a.Product
		})
		if i < 0 {
			capped = capped || a.Allocatable > 0 || a.Free > 0
			continue
		}
		b := bound(a, offer.Accelerators[i])
		capped = capped || !equality.Semantic.DeepEqual(a, b)
		out.Accelerators = append(out.Accelerators, b)
	}
	if capped {
		out.Summary = summarize(out.Accelerators) + " (the report claimed more than the nodes allocate)"
	}
	return out, capped
}

// bound is the report a capped at the offer o of the same accelerator.
func bound(a, o fleetv1alpha1.AcceleratorCapacity) fleetv1alpha1.AcceleratorCapacity {
	b := *a.DeepCopy()
	b.Nodes = min(b.Nodes, o.Nodes)
	b.Allocatable = min(b.Allocatable, o.Allocatable)
	b.Requested = min(b.Requested, b.Allocatable)
	b.Free = min(b.Free, b.Allocatable)
	b.LargestFreeOnNode = min(b.LargestFreeOnNode, o.LargestFreeOnNode)
	left := o.Nodes
	b.FreeNodes = b.FreeNodes[:0]
	for _, f := range a.FreeNodes {
		if n := min(f.Nodes, left); n > 0 {
			b.FreeNodes = append(b.FreeNodes, fleetv1alpha1.FreeBucket{Free: min(f.Free, o.LargestFreeOnNode), Nodes: n})
			left -= n
		}
	}
	return b
}

// Slim keeps of a Node what Compute reads, for a cache of many clusters'
// nodes: its name, accelerator labels, schedulability, accelerator
// allocatable and Ready condition.
func Slim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Node{TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: map[string]string{}},
		Spec:       corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable},
		Status:     corev1.NodeStatus{Allocatable: corev1.ResourceList{}}}
	for r, q := range n.Status.Allocatable {
		if accelerator.IsAccelerator(r) {
			slim.Status.Allocatable[r] = q
			for _, l := range []string{accelerator.ProductLabel(r), accelerator.MemoryLabel(r)} {
				if v, ok := n.Labels[l]; ok && l != "" {
					slim.Labels[l] = v
				}
			}
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			slim.Status.Conditions = append(slim.Status.Conditions, corev1.NodeCondition{Type: c.Type, Status: c.Status})
		}
	}
	return slim, nil
}
