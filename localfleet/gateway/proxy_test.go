package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
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

func TestOriginalDstTakesOneLiteralAddress(t *testing.T) {
	tests := []struct {
		name, value, host string
	}{
		{"a pod", "127.11.0.1:8000", "127.11.0.1:8000"},
		{"another cluster's gateway", "127.12.254.1:8080", "127.12.254.1:8080"},
		{"an IPv6 pod", "[::1]:8000", "[::1]:8000"},
		{"a primary with a fallback", "127.11.0.1:8000,127.11.0.2:8000", ""},
		{"a name", "pod-a:8000", ""},
		{"no port", "127.11.0.1", ""},
		{"nothing", "", ""},
	}
	for _, tt := range tests {
		host, ok := originalDstHost(tt.value)
		if host != tt.host || ok != (tt.host != "") {
			t.Errorf("%s: %q gives host %q (%v), want %q", tt.name, tt.value, host, ok, tt.host)
		}
	}
}

func TestAFailedPickIsAnsweredAsEnvoyAnswersIt(t *testing.T) {
	down := errors.New("ext-proc: open stream: connection refused")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name     string
		ctx      context.Context
		failOpen bool
		err      error
		code     int
		body     string
		failed   float64 // counted as failed open
	}{
		{"FailClose: ext_proc's error status", context.Background(), false, down, http.StatusInternalServerError, "endpoint picker unavailable", 0},
		{"FailOpen: no pick, so ORIGINAL_DST has no host", context.Background(), true, down, http.StatusServiceUnavailable, "no healthy upstream", 1},
		{"no answer in time: the stream idle timer", context.Background(), true,
			fmt.Errorf("ext-proc: no answer within 5m0s: %w", extproc.ErrMessageTimeout), http.StatusRequestTimeout, "stream timeout", 0},
		{"the client went away", cancelled, true, down, 0, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &Gateway{metrics: newMetrics(), log: logr.Discard()}
			pool := &poolTarget{key: types.NamespacedName{Namespace: "ns", Name: "llm"}, failOpen: tt.failOpen}
			rr := httptest.NewRecorder()
			w := &responseWriter{ResponseWriter: rr}
			g.pickFailed(tt.ctx, w, pool, tt.err, &record{})
			if w.status != tt.code || !strings.Contains(rr.Body.String(), tt.body) {
				t.Errorf("answered %d %q, want %d with %q", w.status, rr.Body.String(), tt.code, tt.body)
			}
			if got := testutil.ToFloat64(g.metrics.failOpen.WithLabelValues("ns/llm")); got != tt.failed {
				t.Errorf("fail-open count %v, want %v", got, tt.failed)
			}
		})
	}
}

// A Parent-mode crossing's upstream is another gateway's listener: it keeps
// an idle connection at least as long as the crossing gateway's pool does,
// so that a request is never sent on a connection being closed under it.
func TestAListenerKeepsIdleConnectionsAsLongAsAGatewaysPool(t *testing.T) {
	g := &Gateway{opts: Options{Address: netip.MustParseAddr("127.0.0.1")}}
	s, err := g.listen(listenTCP, 0, http.NotFoundHandler())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.srv.Close() }()
	if s.srv.IdleTimeout < upstreamIdleTimeout {
		t.Fatalf("listener closes idle connections after %v, before the upstream pools' %v", s.srv.IdleTimeout, upstreamIdleTimeout)
	}
}
