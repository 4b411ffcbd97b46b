package epp

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/crossing"
)

// picksToWest sends n requests and counts those whose destination is in
// cluster west (127.12.x.x here).
func picksToWest(t *testing.T, h *harness, n int) (west int, dests []string) {
	t.Helper()
	for range n {
		d := h.request(t, completion("hello"), 1<<20, nil).dest
		dests = append(dests, d)
		if strings.HasPrefix(d, "127.12.") {
			west++
		}
	}
	return west, dests
}

// A peer that claims zero load would draw every spilled request; with a
// share of 0.5 it gets about half.
func TestOneRemoteClusterTakesAtMostItsShareOfPicks(t *testing.T) {
	g := crossing.New(crossing.Options{MaxShare: 0.5, Window: time.Minute, MinPicks: 10, Failures: 1 << 30, Open: time.Hour})
	h := newGatedHarness(t, saturatedEast(), &fakeRemote{eps: []fwkdl.Endpoint{endpoint("w0", "127.12.0.1:8000", 0, west)}}, testConfig, g)
	n, _ := picksToWest(t, h, 200)
	if n < 80 || n > 110 {
		t.Fatalf("%d of 200 picks crossed to west, want about half", n)
	}
}

// Crossed requests that get no response open the breaker: after three,
// requests stay local.
func TestCrossingsStopWhenCrossedRequestsFail(t *testing.T) {
	g := crossing.New(crossing.Options{MaxShare: 1, Window: time.Minute, MinPicks: 10, Failures: 3, Open: time.Hour})
	h := newGatedHarness(t, saturatedEast(), &fakeRemote{eps: []fwkdl.Endpoint{endpoint("w0", "127.12.0.1:8000", 0, west)}}, testConfig, g)
	n, dests := picksToWest(t, h, 10)
	if n != 3 || !strings.HasPrefix(dests[0], "127.12.") || strings.HasPrefix(dests[9], "127.12.") {
		t.Fatalf("picks went to %v; want the first three to west, then local", dests)
	}
}

// crossedWithStatus sends a request whose response headers come back with
// status, and returns its destination.
func crossedWithStatus(t *testing.T, h *harness, status string) string {
	t.Helper()
	s := &fakeStream{ctx: context.Background(), in: append(requestMessages(completion("hello"), 1<<20, nil),
		&extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extProcPb.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(status)}}}}}})}
	if err := h.server.Process(s); err != nil {
		t.Fatalf("Process: %v", err)
	}
	for _, r := range s.sent {
		if d := destination(r); d != "" {
			return d
		}
	}
	return ""
}

// The breaker reads the status of crossed requests' responses: 200s keep
// it closed, 503s open it.
func TestTheBreakerFollowsTheStatusOfCrossedResponses(t *testing.T) {
	g := crossing.New(crossing.Options{MaxShare: 1, Window: time.Minute, MinPicks: 10, Failures: 3, Open: time.Hour})
	h := newGatedHarness(t, saturatedEast(), &fakeRemote{eps: []fwkdl.Endpoint{endpoint("w0", "127.12.0.1:8000", 0, west)}}, testConfig, g)
	for i := range 10 {
		if d := crossedWithStatus(t, h, "200"); d != "127.12.0.1:8000" {
			t.Fatalf("request %d with 200s went to %q, want west", i, d)
		}
	}
	var dests []string
	for range 5 {
		dests = append(dests, crossedWithStatus(t, h, "503"))
	}
	if !strings.HasPrefix(dests[2], "127.12.") || strings.HasPrefix(dests[3], "127.12.") {
		t.Fatalf("after 503s requests went to %v; want three to west, then local", dests)
	}
}
