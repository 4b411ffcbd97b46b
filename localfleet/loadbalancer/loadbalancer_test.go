package loadbalancer

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestTargetPortResolvesNumbersNamesAndTheServicePort(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "epp", Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 9002}, {Name: "federation", ContainerPort: 9004}}},
	}}}
	for _, tc := range []struct {
		name   string
		target intstr.IntOrString
		want   int32
	}{
		{"by name", intstr.FromString("federation"), 9004},
		{"by number", intstr.FromInt32(9100), 9100},
		{"unset: the service port", intstr.IntOrString{}, 443},
		{"a name the pod lacks", intstr.FromString("metrics"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := targetPort(pod, &corev1.ServicePort{Port: 443, TargetPort: tc.target}); got != tc.want {
				t.Errorf("targetPort = %d, want %d", got, tc.want)
			}
		})
	}
}
