package epp

import (
	"testing"

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
