package placement

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
)

func requests(r corev1.ResourceName, n int64) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Requests: corev1.ResourceList{r: *resource.NewQuantity(n, resource.DecimalSI)}}
}

func TestNeedOfCountsAsTheSpokesCapacityDoes(t *testing.T) {
	always := ptr.To(corev1.ContainerRestartPolicyAlways)
	// One pod with everything that makes the scheduler's count differ from
	// the sum of its containers: an init container, a sidecar, overhead.
	pod := &corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "sidecar", RestartPolicy: always, Resources: requests(accelerator.NVIDIA, 1)},
			{Name: "warmup", Resources: requests(accelerator.NVIDIA, 6)},
		},
		Containers:   []corev1.Container{{Name: "main", Resources: requests(accelerator.NVIDIA, 2)}},
		Overhead:     corev1.ResourceList{accelerator.NVIDIA: resource.MustParse("1")},
		NodeSelector: map[string]string{accelerator.NVIDIAProductLabel: "H100"},
	}
	amd := &corev1.PodSpec{
		Containers:   []corev1.Container{{Name: "main", Resources: requests(accelerator.AMD, 4)}},
		NodeSelector: map[string]string{accelerator.AMDProductLabel: "MI300X", accelerator.NVIDIAProductLabel: "ignored"},
	}
	cases := []struct {
		name     string
		spec     v1alpha2.LLMInferenceServiceSpec
		override *fleetv1alpha1.AcceleratorRequirement
		want     Need
	}{
		{"init container, sidecar and overhead count as the scheduler counts them",
			v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: pod}},
			nil, Need{Resource: accelerator.NVIDIA, Product: "H100", PerPod: accelerator.PodRequest(pod, accelerator.NVIDIA), Pods: 1}},
		{"an AMD pod needs amd.com/gpu of the product its AMD label selects",
			v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: amd}},
			nil, Need{Resource: accelerator.AMD, Product: "MI300X", PerPod: 4, Pods: 1}},
		{"a multi-node replica needs a pod per rank of its group",
			v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: amd, Worker: amd, Parallelism: &v1alpha2.ParallelismSpec{Pipeline: ptr.To(int32(2))}}},
			nil, Need{Resource: accelerator.AMD, Product: "MI300X", PerPod: 4, Pods: 2}},
		{"a CPU model needs no accelerator",
			v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}},
			nil, Need{Pods: 1}},
		{"the placement's override keeps the pods' resource",
			v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: amd}},
			&fleetv1alpha1.AcceleratorRequirement{Product: "MI250", Count: 2}, Need{Resource: accelerator.AMD, Product: "MI250", PerPod: 2, Pods: 1}},
		{"the placement's override of a CPU model is nvidia.com/gpu unless it names a resource",
			v1alpha2.LLMInferenceServiceSpec{},
			&fleetv1alpha1.AcceleratorRequirement{Count: 1}, Need{Resource: accelerator.NVIDIA, PerPod: 1, Pods: 1}},
		{"the placement's override names the resource",
			v1alpha2.LLMInferenceServiceSpec{},
			&fleetv1alpha1.AcceleratorRequirement{Resource: accelerator.TPU, Product: "tpu-v5p-slice", Count: 4},
			Need{Resource: accelerator.TPU, Product: "tpu-v5p-slice", PerPod: 4, Pods: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := NeedOf(&v1alpha2.LLMInferenceService{Spec: c.spec}, c.override)
			if got != c.want {
				t.Errorf("need %+v, want %+v", got, c.want)
			}
		})
	}
	if n := accelerator.PodRequest(pod, accelerator.NVIDIA); n != 8 {
		t.Fatalf("the pod requests %d, want the sidecar and init container's peak 7 plus overhead 1", n)
	}
}

// capacityCluster is a registered cluster whose ClusterCapacity reports one
// node per entry.
func capacityCluster(name string, entries ...fleetv1alpha1.AcceleratorCapacity) inventory.Cluster {
	c := hubtest.SpokeAPI(hubtest.Capacity(entries...))
	return inventory.Cluster{Name: name, Client: c.Client, Reader: c.Reader}
}

func TestAMDServiceIsPlacedOnlyWhereAMDGPUsAreFree(t *testing.T) {
	fleet := Fleet{Now: time.Now(), Clusters: []inventory.Cluster{
		capacityCluster("nvidia-free", hubtest.GPUNode(accelerator.NVIDIA, "NVIDIA-H100-80GB-HBM3", 8, 8)),
		capacityCluster("amd-used", hubtest.GPUNode(accelerator.AMD, "MI300X", 8, 0), hubtest.GPUNode(accelerator.NVIDIA, "NVIDIA-L4", 8, 8)),
		capacityCluster("amd-free", hubtest.GPUNode(accelerator.AMD, "MI300X", 8, 8)),
	}}
	svc := &v1alpha2.LLMInferenceService{Spec: v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: &corev1.PodSpec{
		Containers: []corev1.Container{{Name: "main", Resources: requests(accelerator.AMD, 2)}}}}}}
	for _, strategy := range []fleetv1alpha1.ReplicaStrategy{fleetv1alpha1.FreeCapacity, fleetv1alpha1.Overflow} {
		t.Run(string(strategy), func(t *testing.T) {
			pl := &fleetv1alpha1.InferencePlacement{Spec: spec(strategy)}
			pl.Spec.Replicas.Total = ptr.To(int32(2))
			req, clusters, _, _ := Inputs(context.Background(), nil, pl, svc, fleet)
			d, err := Decide(req, clusters)
			if err != nil {
				t.Fatal(err)
			}
			if got := summary(d); got != "amd-free=2" {
				t.Errorf("placed %q (%s), want amd-free=2 only", got, d.Message)
			}
		})
	}
}

func TestInputsKeepAClusterWithinItsToleration(t *testing.T) {
	now := time.Now()
	down := func(name string, since time.Duration) inventory.Cluster {
		c := capacityCluster(name)
		c.UnavailableSince, c.Reason = now.Add(-since), "probe failed"
		return c
	}
	pl := &fleetv1alpha1.InferencePlacement{Spec: spec(fleetv1alpha1.Duplicated)}
	pl.Spec.Failover.TolerationSeconds = ptr.To(int32(60))
	never := pl.DeepCopy()
	never.Spec.Replicas.Rebalance = "Never"
	cases := []struct {
		name        string
		pl          *fleetv1alpha1.InferencePlacement
		cluster     inventory.Cluster
		failedOver  []string
		wantHealthy bool
		wantRequeue bool
	}{
		{"available", pl, capacityCluster("a"), nil, true, false},
		{"unavailable within the toleration", pl, down("a", 10*time.Second), nil, true, true},
		{"unavailable beyond the toleration", pl, down("a", 2*time.Minute), nil, false, false},
		{"recovered after failover, rebalance Never", never, capacityCluster("a"), []string{"a"}, false, false},
		{"recovered after failover, rebalance allowed", pl, capacityCluster("a"), []string{"a"}, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, clusters, requeue, _ := Inputs(context.Background(), nil, c.pl, &v1alpha2.LLMInferenceService{},
				Fleet{Clusters: []inventory.Cluster{c.cluster}, FailedOver: c.failedOver, Now: now})
			if clusters[0].Healthy != c.wantHealthy || (requeue > 0) != c.wantRequeue {
				t.Errorf("healthy %v requeue %v, want healthy %v requeue %v", clusters[0].Healthy, requeue, c.wantHealthy, c.wantRequeue)
			}
		})
	}
}

func TestInForceReadsTheLegacyAnnotationsOnce(t *testing.T) {
	legacy := v1alpha2.LLMInferenceServiceStatus{Status: v1alpha2.Status{Annotations: map[string]string{
		legacyInputsAnnotation: "abc", legacyUnplacedAnnotation: "2", legacyFailedOverAnnotation: "west,east", "other": "kept"}}}
	got := InForce(&legacy)
	want := &v1alpha2.PlacementStatus{InputsHash: "abc", UnplacedReplicas: 2, FailedOverClusters: []string{"east", "west"}}
	if got == nil || got.InputsHash != want.InputsHash || got.UnplacedReplicas != want.UnplacedReplicas ||
		len(got.FailedOverClusters) != 2 || got.FailedOverClusters[0] != "east" {
		t.Fatalf("legacy memory read as %+v, want %+v", got, want)
	}
	Record(&legacy, got)
	if len(legacy.Annotations) != 1 || legacy.Annotations["other"] != "kept" {
		t.Errorf("annotations after Record: %v, want only the unrelated one", legacy.Annotations)
	}
	typed := v1alpha2.LLMInferenceServiceStatus{Placement: &v1alpha2.PlacementStatus{InputsHash: "new"},
		Status: v1alpha2.Status{Annotations: map[string]string{legacyInputsAnnotation: "old"}}}
	if got := InForce(&typed); got.InputsHash != "new" {
		t.Errorf("with both, read %q, want the typed form", got.InputsHash)
	}
	if InForce(&v1alpha2.LLMInferenceServiceStatus{}) != nil {
		t.Error("a service never decided has a decision in force")
	}
}

// A spoke whose report claims a thousand times the GPUs its nodes allocate
// is placed by its nodes: it draws no more replicas than an honest one.
func TestACapacityReportIsBoundedByTheClustersNodes(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "h100-0", Labels: map[string]string{accelerator.NVIDIAProductLabel: "H100"}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{accelerator.NVIDIA: resource.MustParse("8")},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	liar := fakeapi.NewSpoke(hubtest.Capacity(hubtest.GPUNode(accelerator.NVIDIA, "H100", 8000, 8000)), node)
	fleet := Fleet{Now: time.Now(), Clusters: []inventory.Cluster{
		capacityCluster("honest", hubtest.GPUNode(accelerator.NVIDIA, "H100", 8, 8)),
		{Name: "liar", Client: liar.Client, Reader: liar.Reader},
	}}
	svc := &v1alpha2.LLMInferenceService{Spec: v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Template: &corev1.PodSpec{
		Containers: []corev1.Container{{Name: "main", Resources: requests(accelerator.NVIDIA, 1)}}}}}}
	pl := &fleetv1alpha1.InferencePlacement{Spec: spec(fleetv1alpha1.FreeCapacity)}
	pl.Spec.Replicas.Total = ptr.To(int32(8))
	req, clusters, _, _ := Inputs(context.Background(), nil, pl, svc, fleet)
	d, err := Decide(req, clusters)
	if err != nil {
		t.Fatal(err)
	}
	if got := summary(d); got != "honest=4,liar=4" {
		t.Errorf("placed %q (%s), want the replicas split by the nodes' GPUs: honest=4 liar=4", got, d.Message)
	}
	if v := testutil.ToFloat64(capacityCapped.WithLabelValues("liar")); v != 1 {
		t.Errorf("fleetinfer_hub_capacity_report_capped{cluster=liar} = %v, want 1", v)
	}
}
