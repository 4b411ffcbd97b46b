package accelerator_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/placement"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/nodecapacity"
)

// The hub sizes a replica by what its pod takes and the spoke reports free
// accelerators by what its bound pods take: a pod must cost both the same,
// or the hub places replicas where the spoke has no room (or keeps room it
// could use). This pod has everything the scheduler counts beyond its
// containers.
func TestHubNeedAndSpokeCapacityCountAPodAlike(t *testing.T) {
	for _, r := range accelerator.Resources {
		t.Run(string(r), func(t *testing.T) {
			n := func(v int64) corev1.ResourceList {
				return corev1.ResourceList{r: *resource.NewQuantity(v, resource.DecimalSI)}
			}
			pod := corev1.PodSpec{
				InitContainers: []corev1.Container{
					{Name: "proxy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{Requests: n(1)}},
					{Name: "warm-up", Resources: corev1.ResourceRequirements{Limits: n(2)}},
				},
				Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: n(4)}}},
				Overhead:   n(1),
			}
			// sidecar 1 + main 4 (the init container's 1+2 is less) + overhead 1
			const want = 6

			need := placement.NeedOf(&v1alpha2.LLMInferenceService{Spec: v1alpha2.LLMInferenceServiceSpec{
				WorkloadSpec: v1alpha2.WorkloadSpec{Template: pod.DeepCopy()}}}, nil)
			if need.Resource != r || need.PerPod != want {
				t.Errorf("hub need: %s × %d, want %s × %d", need.Resource, need.PerPod, r, want)
			}

			node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
				Allocatable: n(8), Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
			bound := corev1.Pod{Spec: *pod.DeepCopy(), Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			bound.Spec.NodeName = "n1"
			st := nodecapacity.Compute([]corev1.Node{node}, []corev1.Pod{bound})
			if len(st.Accelerators) != 1 || st.Accelerators[0].Resource != r || st.Accelerators[0].Requested != want {
				t.Errorf("spoke capacity: %+v, want %d of %s requested", st.Accelerators, want, r)
			}
		})
	}
}
