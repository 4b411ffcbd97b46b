package federation

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// FuzzDecodeAndApply feeds two messages from a hostile peer through the
// subscriber's path: decode and validate, then apply to the peer's state. It
// must never panic, and the state must stay within its limits.
func FuzzDecodeAndApply(f *testing.F) {
	first, _ := proto.Marshal(snapshot(
		&federationv1.Endpoint{Id: 1, Spec: &federationv1.EndpointSpec{Name: "a", Address: "10.0.0.1", Port: 8000,
			Labels: map[string]string{"llm-d.ai/role": "decode"}}, Metrics: &federationv1.EndpointMetrics{
			NumRequestsWaiting: 1, KvCacheUsage: 0.5, ScrapeUnixNano: 1,
			Lora: &federationv1.LoRAState{MaxAdapters: 2, Running: map[string]uint32{"sql": 1}}}}))
	second, _ := proto.Marshal(&federationv1.Update{Seq: 2, SentUnixNano: 2, Removed: []uint32{1}, CurrentUnixNano: 2})
	f.Add(first, second)
	f.Add(first, []byte{})
	f.Add([]byte{0x08, 0x01}, []byte{0xff})
	limits := Limits{MaxMessageBytes: 64 << 10, MaxEndpoints: 64}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		p := newPeerState(&Origin{Cluster: "west", Mode: fleetv1alpha1.FederationEndpoint}, "llm", limits, Destinations{}, nil)
		for _, data := range [][]byte{a, b} {
			u, err := DecodeUpdate(data, limits)
			if err != nil {
				return
			}
			if err := p.apply(u, time.Now()); err != nil {
				return
			}
			if len(p.byID) > limits.MaxEndpoints {
				t.Fatalf("%d endpoints held, limit %d", len(p.byID), limits.MaxEndpoints)
			}
		}
	})
}
