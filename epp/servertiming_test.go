package epp

import (
	"context"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

func TestUpstreamTimingReadsThePeersMetric(t *testing.T) {
	tests := []struct {
		name    string
		headers [][2]string
		want    time.Duration
		ok      bool
	}{
		{name: "no Server-Timing", headers: [][2]string{{":status", "200"}}},
		{name: "the metric alone", headers: [][2]string{{"server-timing", "fleetinfer-upstream;dur=12.5"}}, want: 12500 * time.Microsecond, ok: true},
		{name: "among a model server's metrics, with a description", headers: [][2]string{{"server-timing", `queue;dur=3, fleetinfer-upstream;desc="picker";dur=40 ,prefill;dur=9`}}, want: 40 * time.Millisecond, ok: true},
		{name: "the picker's, appended last, wins over a pod's", headers: [][2]string{{"server-timing", "fleetinfer-upstream;dur=1"}, {"Server-Timing", "fleetinfer-upstream;dur=70"}}, want: 70 * time.Millisecond, ok: true},
		{name: "another metric only", headers: [][2]string{{"server-timing", "fleetinfer-upstreams;dur=5"}}},
		{name: "no duration", headers: [][2]string{{"server-timing", "fleetinfer-upstream;desc=x"}}},
		{name: "negative", headers: [][2]string{{"server-timing", "fleetinfer-upstream;dur=-4"}}},
		{name: "not a number", headers: [][2]string{{"server-timing", "fleetinfer-upstream;dur=NaN"}}},
		{name: "beyond an hour", headers: [][2]string{{"server-timing", "fleetinfer-upstream;dur=1e300"}}},
		{name: "garbage", headers: [][2]string{{"server-timing", ";;,=;dur"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hm := &corev3.HeaderMap{}
			for _, kv := range tc.headers {
				hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
			}
			got, ok := upstreamTiming(hm)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("upstreamTiming = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// The upstream metric a picker writes reads back as the time it took.
func TestUpstreamTimingRoundTrips(t *testing.T) {
	r := &extProcPb.HeadersResponse{}
	addUpstreamTiming(r, 1234567*time.Microsecond)
	hm := &corev3.HeaderMap{}
	for _, o := range r.GetResponse().GetHeaderMutation().GetSetHeaders() {
		if !o.GetAppend().GetValue() {
			t.Fatalf("the metric replaces a model server's Server-Timing: %v", o)
		}
		hm.Headers = append(hm.Headers, o.GetHeader())
	}
	if got, ok := upstreamTiming(hm); !ok || got != 1234567*time.Microsecond {
		t.Fatalf("read back %v, %v", got, ok)
	}
}

// slowResponseStream holds the response headers for wait, as a crossed
// request's response takes its time to come back.
type slowResponseStream struct {
	*fakeStream
	wait time.Duration
}

func (s *slowResponseStream) Recv() (*extProcPb.ProcessingRequest, error) {
	if len(s.in) > 0 && s.in[0].GetResponseHeaders() != nil {
		time.Sleep(s.wait)
	}
	return s.fakeStream.Recv()
}

// exchange runs one request with extra request headers whose response
// headers, reqHdr and respHdr added, come back after wait; it returns the
// Server-Timing values the picker set on the response.
func exchange(t *testing.T, h *harness, reqHdr, respHdr [][2]string, wait time.Duration) []string {
	t.Helper()
	in := requestMessages(completion("hello"), 1<<20, nil)
	rh := in[0].GetRequestHeaders().GetHeaders()
	for _, kv := range reqHdr {
		rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	resp := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}
	for _, kv := range respHdr {
		resp.Headers = append(resp.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	in = append(in, &extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extProcPb.HttpHeaders{Headers: resp}}})
	s := &slowResponseStream{fakeStream: &fakeStream{ctx: context.Background(), in: in}, wait: wait}
	if err := h.server.Process(s); err != nil {
		t.Fatalf("Process: %v", err)
	}
	var timings []string
	for _, r := range s.sent {
		for _, o := range r.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if strings.EqualFold(o.GetHeader().GetKey(), serverTimingHeader) {
				timings = append(timings, string(o.GetHeader().GetRawValue()))
			}
		}
	}
	return timings
}

// A picker tells a peer how long the peer's request took after its pick,
// and tells a client nothing.
func TestAPeersRequestIsAnsweredWithItsUpstreamTime(t *testing.T) {
	h := newHarness(t, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil)}, nil)
	got := exchange(t, h, markedBy(t, "central", "127.11.0.1:8000"), nil, 30*time.Millisecond)
	if len(got) != 1 {
		t.Fatalf("Server-Timing set on a peer's request: %q, want one", got)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: serverTimingHeader, RawValue: []byte(got[0])}}}
	if d, ok := upstreamTiming(hm); !ok || d < 30*time.Millisecond || d > 10*time.Second {
		t.Fatalf("upstream time %v (%v) for a response 30 ms after the pick", d, ok)
	}
	if got := exchange(t, h, nil, nil, 0); len(got) != 0 {
		t.Fatalf("Server-Timing set on a client's request: %q", got)
	}
}

// A Parent-mode crossing's path is what the crossed request took to its
// response headers less what the other cluster's picker says it took there;
// without the picker's word (an Endpoint-mode crossing, a peer that does
// not say) the path is not learnt and the link's round trip stands.
func TestACrossingsPathLeavesOutTheOtherClustersShare(t *testing.T) {
	h := newHarness(t, saturatedEast(), []fwkdl.Endpoint{endpoint("p@central", "127.13.0.1:8000", 0, central)})
	exchange(t, h, nil, nil, 20*time.Millisecond)
	if p := h.meter.Path("central"); p != 0 {
		t.Fatalf("path %v learnt from a response without the peer's upstream time", p)
	}
	const wait, upstream = 80 * time.Millisecond, 60 * time.Millisecond
	began := time.Now()
	exchange(t, h, nil, [][2]string{{"server-timing", "fleetinfer-upstream;dur=60"}}, wait)
	elapsed := time.Since(began)
	if p := h.meter.Path("central"); p < wait-upstream || p > elapsed-upstream {
		t.Fatalf("path %v; want the %v after the pick less the peer's %v (at most %v)", p, wait, upstream, elapsed-upstream)
	}
	// A peer claiming more than the whole crossing took teaches nothing.
	before := h.meter.Path("central")
	exchange(t, h, nil, [][2]string{{"server-timing", "fleetinfer-upstream;dur=3000000"}}, time.Millisecond)
	if p := h.meter.Path("central"); p != before {
		t.Fatalf("path moved from %v to %v on a peer's claim longer than the crossing", before, p)
	}
}
