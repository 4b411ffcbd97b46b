package nodecapacity

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
)

func node(name, product string, gpus int64, ready, schedulable bool) corev1.Node {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{accelerator.NVIDIAProductLabel: product, accelerator.NVIDIAMemoryLabel: "81559"}},
		Spec:       corev1.NodeSpec{Unschedulable: !schedulable},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{accelerator.NVIDIA: *resource.NewQuantity(gpus, resource.DecimalSI)},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}},
		},
	}
}

func gpuContainer(n int64) corev1.Container {
	return corev1.Container{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{accelerator.NVIDIA: *resource.NewQuantity(n, resource.DecimalSI)}}}
}

func pod(nodeName string, phase corev1.PodPhase, containers ...corev1.Container) corev1.Pod {
	return corev1.Pod{Spec: corev1.PodSpec{NodeName: nodeName, Containers: containers}, Status: corev1.PodStatus{Phase: phase}}
}

func TestComputeCountsFreeGPUsPerProduct(t *testing.T) {
	nodes := []corev1.Node{
		node("h1", "H100", 8, true, true),
		node("h2", "H100", 8, true, true),
		node("a1", "A100", 4, true, true),
		node("down", "H100", 8, false, true),
		node("cordoned", "H100", 8, true, false),
		node("cpu", "", 0, true, true),
	}
	pods := []corev1.Pod{
		pod("h1", corev1.PodRunning, gpuContainer(4), gpuContainer(2)),
		pod("h2", corev1.PodPending, gpuContainer(1)),
		pod("h2", corev1.PodSucceeded, gpuContainer(8)), // finished: frees its GPUs
		pod("", corev1.PodPending, gpuContainer(8)),     // not bound yet
		pod("a1", corev1.PodRunning, gpuContainer(4)),
	}
	st := Compute(nodes, pods)
	if st.Nodes != 4 {
		t.Errorf("nodes %d, want 4 (Ready and schedulable)", st.Nodes)
	}
	if len(st.Accelerators) != 2 {
		t.Fatalf("accelerators %+v", st.Accelerators)
	}
	a100, h100 := st.Accelerators[0], st.Accelerators[1]
	if h100.Product != "H100" || h100.Allocatable != 16 || h100.Requested != 7 || h100.Free != 9 || h100.LargestFreeOnNode != 7 || h100.Nodes != 2 || h100.MemoryMiB != 81559 {
		t.Errorf("H100 %+v", h100)
	}
	if got := h100.PodsThatFit(4); got != 1 {
		t.Errorf("4-GPU pods that fit on H100 nodes with 2 and 7 free: %d, want 1 (buckets %+v)", got, h100.FreeNodes)
	}
	if got := h100.PodsThatFit(1); got != 9 {
		t.Errorf("1-GPU pods that fit: %d, want 9", got)
	}
	if a100.Product != "A100" || a100.Free != 0 || a100.LargestFreeOnNode != 0 {
		t.Errorf("A100 %+v", a100)
	}
	if st.Summary != "A100 0/4 free, H100 9/16 free" {
		t.Errorf("summary %q", st.Summary)
	}
}

func TestComputeKeepsVendorsApart(t *testing.T) {
	amd := node("m1", "", 8, true, true)
	amd.Labels = map[string]string{accelerator.AMDProductLabel: "AMD_Instinct_MI300X_OAM"}
	amd.Status.Allocatable = corev1.ResourceList{accelerator.AMD: *resource.NewQuantity(8, resource.DecimalSI)}
	unlabelled := node("n1", "", 4, true, true)
	unlabelled.Labels = nil
	unlabelledAMD := node("m2", "", 2, true, true)
	unlabelledAMD.Labels = nil
	unlabelledAMD.Status.Allocatable = corev1.ResourceList{accelerator.AMD: *resource.NewQuantity(2, resource.DecimalSI),
		"gpu.intel.com/millicores": *resource.NewQuantity(1000, resource.DecimalSI)}
	amdPod := pod("m1", corev1.PodRunning, corev1.Container{Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{accelerator.AMD: *resource.NewQuantity(2, resource.DecimalSI)}}})
	st := Compute([]corev1.Node{amd, unlabelled, unlabelledAMD}, []corev1.Pod{amdPod, pod("n1", corev1.PodRunning, gpuContainer(1))})
	want := map[string]int64{
		"amd.com/gpu AMD_Instinct_MI300X_OAM": 6,
		"amd.com/gpu unknown":                 2,
		"nvidia.com/gpu unknown":              3,
	}
	if len(st.Accelerators) != len(want) {
		t.Fatalf("accelerators %+v, want %v", st.Accelerators, want)
	}
	for _, a := range st.Accelerators {
		if free, ok := want[string(a.Resource)+" "+a.Product]; !ok || a.Free != free {
			t.Errorf("%s %s: free %d, want %v", a.Resource, a.Product, a.Free, want)
		}
	}
}

// Recomputing the capacity of a large cluster stays cheap.
func BenchmarkCompute10kPods(b *testing.B) {
	var nodes []corev1.Node
	for i := range 1250 {
		nodes = append(nodes, node("n"+string(rune('a'+i%26))+itoa(i), "H100", 8, true, true))
	}
	var pods []corev1.Pod
	for i := range 10000 {
		pods = append(pods, pod(nodes[i%len(nodes)].Name, corev1.PodRunning, gpuContainer(1)))
	}
	b.ResetTimer()
	for range b.N {
		Compute(nodes, pods)
	}
}

func itoa(i int) string { return resource.NewQuantity(int64(i), resource.DecimalSI).String() }

// A report is capped at what the nodes allocate, whatever it claims.
func TestBoundCapsAReportAtTheNodes(t *testing.T) {
	nodes := []corev1.Node{node("h1", "H100", 8, true, true), node("h2", "H100", 8, true, true), node("h3", "H100", 8, false, true)}
	honest := Compute(nodes, []corev1.Pod{pod("h1", corev1.PodRunning, gpuContainer(6))})
	inflated := honest.DeepCopy()
	inflated.Nodes = 2000
	inflated.Accelerators[0].Allocatable, inflated.Accelerators[0].Free, inflated.Accelerators[0].LargestFreeOnNode = 16000, 15994, 8000
	inflated.Accelerators[0].FreeNodes = []fleetv1alpha1.FreeBucket{{Free: 8000, Nodes: 1000}}
	phantom := honest.DeepCopy()
	phantom.Accelerators = append(phantom.Accelerators, fleetv1alpha1.AcceleratorCapacity{Resource: accelerator.NVIDIA, Product: "B200",
		Nodes: 1, Allocatable: 8, Free: 8, LargestFreeOnNode: 8})
	cases := []struct {
		name       string
		report     fleetv1alpha1.ClusterCapacityStatus
		wantCapped bool
		want       string // Allocatable/Free/LargestFreeOnNode/Nodes per accelerator
	}{
		{"an honest report passes as it is", honest, false, "H100 16/10/8/2"},
		{"an inflated report is capped", *inflated, true, "H100 16/16/8/2"},
		{"an accelerator no node offers is dropped", *phantom, true, "H100 16/10/8/2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, capped := Bound(c.report, nodes)
			var parts []string
			for _, a := range got.Accelerators {
				parts = append(parts, fmt.Sprintf("%s %d/%d/%d/%d", a.Product, a.Allocatable, a.Free, a.LargestFreeOnNode, a.Nodes))
				for _, b := range a.FreeNodes {
					if b.Free > a.LargestFreeOnNode {
						t.Errorf("a free bucket of %d exceeds the largest node's %d", b.Free, a.LargestFreeOnNode)
					}
				}
			}
			if capped != c.wantCapped || strings.Join(parts, ", ") != c.want || got.Nodes > 2 {
				t.Errorf("Bound = %v (capped %v, %d nodes), want %s (capped %v)", parts, capped, got.Nodes, c.want, c.wantCapped)
			}
		})
	}
}

// The cache's slim nodes count as the nodes do.
func TestSlimNodesComputeTheSame(t *testing.T) {
	n := node("h1", "H100", 8, true, true)
	n.Labels["kubernetes.io/hostname"] = "h1"
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"vllm"}, SizeBytes: 1 << 34}}
	n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("96")
	slim, err := Slim(&n)
	if err != nil {
		t.Fatal(err)
	}
	s := slim.(*corev1.Node)
	if len(s.Status.Images) != 0 || len(s.Status.Allocatable) != 1 || s.Labels["kubernetes.io/hostname"] != "" {
		t.Errorf("slim node keeps more than Compute reads: %+v", s)
	}
	if a, b := Compute([]corev1.Node{n}, nil), Compute([]corev1.Node{*s}, nil); !equality.Semantic.DeepEqual(a, b) {
		t.Errorf("slim node computes %+v, the node %+v", b, a)
	}
}
