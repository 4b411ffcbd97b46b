package llmisvc

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

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

// A pod that only copies the picker's labels, or claims a ReplicaSet of
// another Deployment, is not the picker: its address would steer other
// clusters' spilled requests.
func TestPickerPodsAreFoundByOwnershipNotLabels(t *testing.T) {
	controlledBy := func(kind, name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}}
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "llama-kserve-router-scheduler", UID: "dep"}}
	rs := func(name string, uid, owner types.UID) appsv1.ReplicaSet {
		return appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid, OwnerReferences: controlledBy("Deployment", dep.Name, owner)}}
	}
	pod := func(name string, owners []metav1.OwnerReference) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: owners}}
	}
	sets := []appsv1.ReplicaSet{rs("current", "rs1", "dep"), rs("previous", "rs2", "dep"), rs("another-deployments", "rs3", "other")}
	notController := controlledBy("ReplicaSet", "current", "rs1")
	notController[0].Controller = nil
	cases := []struct {
		name string
		pods []corev1.Pod
		want []string
	}{
		{"the current and the previous ReplicaSet's pods", []corev1.Pod{pod("a", controlledBy("ReplicaSet", "current", "rs1")), pod("b", controlledBy("ReplicaSet", "previous", "rs2"))}, []string{"a", "b"}},
		{"a bare pod with the picker's labels", []corev1.Pod{pod("bare", nil)}, nil},
		{"a ReplicaSet of another Deployment", []corev1.Pod{pod("other", controlledBy("ReplicaSet", "another-deployments", "rs3"))}, nil},
		{"the right name with another UID", []corev1.Pod{pod("forged", controlledBy("ReplicaSet", "current", "rs9"))}, nil},
		{"an owner that is not its controller", []corev1.Pod{pod("adopted", notController)}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, p := range ownedPods(dep, sets, tc.pods) {
				got = append(got, p.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ownedPods = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPickerAddressIsTheFirstReadyPodByName(t *testing.T) {
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	notReady := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
	pod := func(name, ip string, conds []corev1.PodCondition, ports ...corev1.ContainerPort) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Ports: ports}}},
			Status: corev1.PodStatus{PodIP: ip, Conditions: conds}}
	}
	deleting := pod("a", "127.0.1.1", ready)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	fed := corev1.ContainerPort{Name: "federation", ContainerPort: 19004}
	cases := []struct {
		name string
		pods []corev1.Pod
		want string
	}{
		{"no pod", nil, ""},
		{"not ready (a standby replica)", []corev1.Pod{pod("a", "127.0.1.1", notReady)}, ""},
		{"no readiness reported", []corev1.Pod{pod("a", "127.0.1.1", nil)}, ""},
		{"ready without an IP", []corev1.Pod{pod("a", "", ready)}, ""},
		{"deleting", []corev1.Pod{deleting}, ""},
		{"default port", []corev1.Pod{pod("a", "127.0.1.1", ready, corev1.ContainerPort{Name: "grpc", ContainerPort: 9002})}, "127.0.1.1:9004"},
		{"named port", []corev1.Pod{pod("a", "127.0.1.1", ready, fed)}, "127.0.1.1:19004"},
		{"first by name", []corev1.Pod{pod("b", "127.0.1.2", ready), pod("a", "127.0.1.1", ready)}, "127.0.1.1:9004"},
		{"the leader, whichever its name", []corev1.Pod{pod("a", "127.0.1.1", notReady), deleting, pod("b", "127.0.1.2", ready, fed)}, "127.0.1.2:19004"},
		{"IPv6", []corev1.Pod{pod("a", "fd00::5", ready)}, "[fd00::5]:9004"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := pickerAddress(tc.pods); got != tc.want {
				t.Errorf("pickerAddress = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestGatewayAddress(t *testing.T) {
	gw := func(addrs []string, ports ...gwapiv1.PortNumber) *gwapiv1.Gateway {
		g := &gwapiv1.Gateway{}
		for _, p := range ports {
			g.Spec.Listeners = append(g.Spec.Listeners, gwapiv1.Listener{Port: p})
		}
		for _, a := range addrs {
			g.Status.Addresses = append(g.Status.Addresses, gwapiv1.GatewayStatusAddress{Value: a})
		}
		return g
	}
	cases := []struct {
		name string
		gw   *gwapiv1.Gateway
		want string
	}{
		{"no address yet", gw(nil, 8080), ""},
		{"empty address", gw([]string{""}, 8080), ""},
		{"first address, first listener's port", gw([]string{"10.0.0.1", "10.0.0.2"}, 8080, 443), "10.0.0.1:8080"},
		{"no listener", gw([]string{"10.0.0.1"}), ""},
		{"hostname", gw([]string{"gw.east.example"}, 80), "gw.east.example:80"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := gatewayAddress(tc.gw); got != tc.want {
				t.Errorf("gatewayAddress = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLoadBalancerAddress(t *testing.T) {
	lb := func(port int32, ingress ...corev1.LoadBalancerIngress) *corev1.Service {
		s := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer,
			Ports: []corev1.ServicePort{{Name: "metrics", Port: 9090}, {Name: "federation", Port: port}}}}
		s.Status.LoadBalancer.Ingress = ingress
		return s
	}
	cases := []struct {
		name string
		svc  *corev1.Service
		want string
	}{
		{"no address yet", lb(9004), ""},
		{"an ingress with neither IP nor hostname", lb(9004, corev1.LoadBalancerIngress{}), ""},
		{"IP with the Service's federation port", lb(19004, corev1.LoadBalancerIngress{IP: "127.0.2.1"}), "127.0.2.1:19004"},
		{"hostname", lb(9004, corev1.LoadBalancerIngress{Hostname: "lb.east.example"}), "lb.east.example:9004"},
		{"IP before hostname", lb(9004, corev1.LoadBalancerIngress{IP: "127.0.2.1", Hostname: "lb.east.example"}), "127.0.2.1:9004"},
		{"first ingress", lb(9004, corev1.LoadBalancerIngress{IP: "127.0.2.1"}, corev1.LoadBalancerIngress{IP: "127.0.2.2"}), "127.0.2.1:9004"},
		{"IPv6", lb(9004, corev1.LoadBalancerIngress{IP: "fd00::7"}), "[fd00::7]:9004"},
		{"no federation port", &corev1.Service{Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{
			Ingress: []corev1.LoadBalancerIngress{{IP: "127.0.2.1"}}}}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := loadBalancerAddress(tc.svc); got != tc.want {
				t.Errorf("loadBalancerAddress = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParseFederationAddress(t *testing.T) {
	for in, want := range map[string]FederationAddress{"LoadBalancer": FederationAddressLoadBalancer, "podip": FederationAddressPodIP, "PodIP": FederationAddressPodIP} {
		if got, err := ParseFederationAddress(in); err != nil || got != want {
			t.Errorf("ParseFederationAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "NodePort", "pod"} {
		if _, err := ParseFederationAddress(in); err == nil {
			t.Errorf("ParseFederationAddress(%q) accepted it", in)
		}
	}
}
