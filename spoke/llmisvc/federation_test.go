package llmisvc

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

func TestFederateWiresThePickerOnlyWhenTheHubAsks(t *testing.T) {
	cases := []struct {
		name        string
		annotations map[string]string
		args        []string
		ports       []corev1.ContainerPort
		wantArgs    []string // each must be present
		wantVolumes int
		wantPort    int32
	}{
		{name: "not placed by the hub", wantVolumes: 0},
		{name: "placed with federation",
			annotations: map[string]string{fleetv1alpha1.FederationClusterAnnotation: "east", fleetv1alpha1.FederationModeAnnotation: "Parent"},
			wantArgs: []string{"--federation-cluster=east", "--federation-port=9004", "--federation-mode=Parent",
				"--federation-peers-file=/etc/fleetinfer/federation/peers/peers.yaml",
				"--federation-cert-file=/etc/fleetinfer/federation/tls/tls.crt",
				"--federation-key-file=/etc/fleetinfer/federation/tls/tls.key",
				"--federation-ca-file=/etc/fleetinfer/federation/tls/ca.crt"},
			wantVolumes: 2, wantPort: 9004},
		{name: "the template's own federation port is kept",
			annotations: map[string]string{fleetv1alpha1.FederationClusterAnnotation: "west"},
			ports:       []corev1.ContainerPort{{Name: "federation", ContainerPort: 19004}},
			wantArgs:    []string{"--federation-port=19004"}, wantVolumes: 2, wantPort: 19004},
		{name: "a template that federates by itself is left alone",
			annotations: map[string]string{fleetv1alpha1.FederationClusterAnnotation: "west"},
			args:        []string{"--federation-peers-file=/mine.yaml"}, wantVolumes: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Name: "llama", Annotations: tc.annotations}}
			pod := &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Args: tc.args, Ports: tc.ports}}}
			c := &pod.Containers[0]
			has := func(flag string) bool {
				return slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, flag) })
			}
			federate(svc, pod, c, has)
			for _, a := range tc.wantArgs {
				if !slices.Contains(c.Args, a) {
					t.Errorf("args %v lack %s", c.Args, a)
				}
			}
			if len(pod.Volumes) != tc.wantVolumes || len(c.VolumeMounts) != tc.wantVolumes {
				t.Errorf("%d volumes and %d mounts, want %d", len(pod.Volumes), len(c.VolumeMounts), tc.wantVolumes)
			}
			if tc.wantVolumes > 0 {
				if pod.Volumes[0].ConfigMap.Name != "llama-epp-peers" || pod.Volumes[1].Secret.SecretName != "llama-epp-federation" {
					t.Errorf("volumes %+v", pod.Volumes)
				}
			}
			if tc.wantPort != 0 {
				i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "federation" })
				if i < 0 || c.Ports[i].ContainerPort != tc.wantPort || len(c.Ports) != 1 {
					t.Errorf("ports %+v, want one federation port %d", c.Ports, tc.wantPort)
				}
			}
		})
	}
}
