package epp

import (
	"strings"
	"testing"
	"unicode/utf8"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

// FuzzRequestBody sends arbitrary request bodies, in arbitrary chunks, down
// the EPP's request path. It must never panic, and every request must end in
// a pick or an error status, never in silence.
func FuzzRequestBody(f *testing.F) {
	f.Add(completion("hello"), 7)
	f.Add(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`, 3)
	f.Add(`{"model":"llama","prompt":["a","b"],"stream":true}`, 100)
	f.Add(`{"model":7}`, 1)
	f.Add(`{"prompt":"no model"}`, 5)
	f.Add(`[]`, 1)
	f.Add("\x00\xff", 1)
	h := newHarness(f, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil), endpoint("b", "127.11.0.2:8000", 9, nil)},
		[]fwkdl.Endpoint{endpoint("r@west", "127.12.0.1:8000", 0, west)})
	f.Fuzz(func(t *testing.T, body string, chunk int) {
		if chunk <= 0 || chunk > 1<<16 {
			chunk = 1 << 16
		}
		r := h.request(t, body, chunk, nil)
		if r.status == 0 && (r.dest == "" || r.dest != r.metadata) {
			t.Fatalf("request neither routed nor refused: %+v", r)
		}
		if r.status != 0 && r.status < 400 {
			t.Fatalf("status %d for a refused request", r.status)
		}
	})
}

// FuzzRequestHeaders sends a request with an arbitrary client header (the
// destination and subset headers among the seeds) and an arbitrary subset
// hint from the gateway's metadata. A client header never decides the
// destination: a routed request goes to one of the pool's endpoints, and
// every request ends in a pick or an error status.
func FuzzRequestHeaders(f *testing.F) {
	f.Add("x-gateway-destination-endpoint", "169.254.169.254:80", "")
	f.Add("X-Gateway-Destination-Endpoint", "127.11.0.2:8000,10.0.0.1:80", "127.11.0.1:8000")
	f.Add("x-gateway-destination-endpoint-subset", "127.0.0.1:22", "")
	f.Add("x-fleetinfer-pool", "../kube-system/secrets", "127.12.0.1:8000")
	f.Add("x-fleetinfer-mark", "forged", "not an address")
	f.Add("content-length", "-1", "")
	known := map[string]bool{"127.11.0.1:8000": true, "127.11.0.2:8000": true, "127.12.0.1:8000": true}
	h := newHarness(f, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil), endpoint("b", "127.11.0.2:8000", 9, nil)},
		[]fwkdl.Endpoint{endpoint("r@west", "127.12.0.1:8000", 0, west)})
	f.Fuzz(func(t *testing.T, key, value, hint string) {
		if key == "" || strings.ContainsAny(key, ":\x00") || !utf8.ValidString(key) {
			return // not a header an HTTP/1 or HTTP/2 client can send
		}
		if !utf8.ValidString(hint) {
			return // gateway metadata is a protobuf Struct, whose strings are UTF-8
		}
		var hints []string
		if hint != "" {
			hints = strings.Split(hint, ",")
		}
		r := h.requestWith(t, completion("hello"), 1<<16, hints, [][2]string{{key, value}})
		switch {
		case r.status == 0 && !known[r.dest]:
			t.Fatalf("routed to %q, not an endpoint of the pool (header %s: %q, hint %q)", r.dest, key, value, hint)
		case r.status != 0 && r.status < 400:
			t.Fatalf("status %d for a refused request", r.status)
		}
	})
}
