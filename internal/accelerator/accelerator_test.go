package accelerator

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func gpus(r corev1.ResourceName, n int64) corev1.ResourceList {
	return corev1.ResourceList{r: *resource.NewQuantity(n, resource.DecimalSI)}
}

func TestPodRequestCountsAsTheScheduler(t *testing.T) {
	always := ptr.To(corev1.ContainerRestartPolicyAlways)
	cases := []struct {
		name string
		spec corev1.PodSpec
		want int64
	}{
		{"containers add up", corev1.PodSpec{Containers: []corev1.Container{
			{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 2)}},
			{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 1)}}}}, 3},
		{"a limit alone is the request", corev1.PodSpec{Containers: []corev1.Container{
			{Resources: corev1.ResourceRequirements{Limits: gpus(NVIDIA, 4)}}}}, 4},
		{"a request wins over its limit", corev1.PodSpec{Containers: []corev1.Container{
			{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 2), Limits: gpus(NVIDIA, 2)}}}}, 2},
		{"an init container larger than the containers sets the peak", corev1.PodSpec{
			InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 8)}}},
			Containers:     []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 2)}}}}, 8},
		{"a sidecar runs alongside the containers", corev1.PodSpec{
			InitContainers: []corev1.Container{{RestartPolicy: always, Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 1)}}},
			Containers:     []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 2)}}}}, 3},
		{"an init container after a sidecar runs next to it", corev1.PodSpec{
			InitContainers: []corev1.Container{
				{RestartPolicy: always, Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 1)}},
				{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 4)}}},
			Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 2)}}}}, 5},
		{"overhead is added", corev1.PodSpec{Overhead: gpus(NVIDIA, 1),
			Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: gpus(NVIDIA, 2)}}}}, 3},
		{"other resources do not count", corev1.PodSpec{Containers: []corev1.Container{
			{Resources: corev1.ResourceRequirements{Requests: gpus(AMD, 2)}}}}, 0},
	}
	for _, c := range cases {
		if got := PodRequest(&c.spec, NVIDIA); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestPodNeedFindsEachVendorsResource(t *testing.T) {
	for _, r := range Resources {
		spec := corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: gpus(r, 2)}}}}
		if got, n := PodNeed(&spec); got != r || n != 2 {
			t.Errorf("%s: got %s × %d", r, got, n)
		}
		if !IsAccelerator(r) || ProductLabel(r) == "" {
			t.Errorf("%s: not known as an accelerator with a product label", r)
		}
	}
	cpu := corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), "gpu.intel.com/millicores": resource.MustParse("500")}}}}}
	if r, n := PodNeed(&cpu); r != "" || n != 0 {
		t.Errorf("a CPU pod with fractional Intel GPU shares needs %s × %d", r, n)
	}
}
