package capacity

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fleetinfer/fleetinfer/internal/accelerator"
)

// The cache keeps only what the computation reads.
func TestStrippedPodsComputeTheSame(t *testing.T) {
	p := corev1.Pod{Spec: corev1.PodSpec{NodeName: "h1", Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{accelerator.NVIDIA: resource.MustParse("3")}}}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "BIG", Value: "x"}}
	p.Spec.Volumes = []corev1.Volume{{Name: "v"}}
	slim, err := stripPod(&p)
	if err != nil {
		t.Fatal(err)
	}
	sp := slim.(*corev1.Pod)
	if len(sp.Spec.Volumes) != 0 || len(sp.Spec.Containers[0].Env) != 0 || accelerator.PodRequest(&sp.Spec, accelerator.NVIDIA) != 3 || sp.Spec.NodeName != "h1" {
		t.Errorf("stripped pod %+v", sp.Spec)
	}
}
