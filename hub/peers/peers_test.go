package peers

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

func TestPeerAddressOfAGateway(t *testing.T) {
	listener := []gwapiv1.Listener{{Name: "http", Port: 8080}}
	addr := func(v string) []gwapiv1.GatewayStatusAddress { return []gwapiv1.GatewayStatusAddress{{Value: v}} }
	cases := []struct {
		name        string
		annotations map[string]string
		listeners   []gwapiv1.Listener
		addresses   []gwapiv1.GatewayStatusAddress
		want        string
	}{
		{"first listener's port", nil, listener, addr("10.0.0.1"), "10.0.0.1:8080"},
		{"peer port annotation wins", map[string]string{fleetv1alpha1.GatewayPeerPortAnnotation: "15080"}, listener, addr("10.0.0.1"), "10.0.0.1:15080"},
		{"IPv6 address", nil, listener, addr("fd00::1"), "[fd00::1]:8080"},
		{"host name", nil, listener, addr("gw.example.com"), "gw.example.com:8080"},
		{"no address yet", nil, listener, nil, ""},
		{"no port", nil, nil, addr("10.0.0.1"), ""},
		{"invalid annotation", map[string]string{fleetv1alpha1.GatewayPeerPortAnnotation: "http"}, listener, addr("10.0.0.1"), ""},
		{"annotation out of range", map[string]string{fleetv1alpha1.GatewayPeerPortAnnotation: "70000"}, listener, addr("10.0.0.1"), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw := &gwapiv1.Gateway{ObjectMeta: metav1.ObjectMeta{Annotations: tc.annotations},
				Spec: gwapiv1.GatewaySpec{Listeners: tc.listeners}, Status: gwapiv1.GatewayStatus{Addresses: tc.addresses}}
			if got := peerAddress(gw); got != tc.want {
				t.Errorf("peerAddress = %q, want %q", got, tc.want)
			}
		})
	}
}
