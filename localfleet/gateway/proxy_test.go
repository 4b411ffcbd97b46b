package gateway

import (
	"net/http"
	"reflect"
	"testing"
)

func TestDestinationsAreLocalPodsOrRemote(t *testing.T) {
	pool := &poolTarget{local: map[string]bool{"127.11.0.1:8000": true}}
	tests := []struct {
		name string
		ep   string
		want destination
	}{
		{"an endpoint of a Ready pod of the pool", "127.11.0.1:8000", localEndpoint},
		{"a pod IP on a port the pool does not target", "127.11.0.1:9000", remote},
		{"another cluster's gateway", "127.12.254.1:8080", remote},
		{"another cluster's pod, reached directly", "127.12.0.7:8000", remote},
	}
	for _, tt := range tests {
		if got := classify(tt.ep, pool); got != tt.want {
			t.Errorf("%s: %s is %s, want %s", tt.name, tt.ep, got, tt.want)
		}
	}
}

func TestHopByHopHeadersAreDropped(t *testing.T) {
	h := http.Header{"Connection": {"keep-alive, X-Private"}, "X-Private": {"1"}, "Keep-Alive": {"timeout=5"},
		"Te": {"trailers"}, "Upgrade": {"h2c"}, "Content-Type": {"application/json"}}
	removeHopByHop(h)
	if want := (http.Header{"Content-Type": {"application/json"}}); !reflect.DeepEqual(h, want) {
		t.Errorf("got %v, want %v", h, want)
	}
}

func TestOnlyAllowedNetworksAreDialled(t *testing.T) {
	g := &Gateway{allowed: defaultAllowedTargets}
	for target, want := range map[string]bool{"127.11.0.1:8000": true, "10.0.0.1:8000": false, "pod:8000": false} {
		if got := g.allowedTarget(target); got != want {
			t.Errorf("allowedTarget(%q) = %v, want %v", target, got, want)
		}
	}
}
