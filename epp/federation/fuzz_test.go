package federation

import (
	"fmt"
	"net/netip"
	"slices"
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

// FuzzMessageSequence feeds a hostile peer's stream of up to eight
// messages (each a length byte pair and its bytes) through decode, the
// address checks and apply, and checks the view after every message the
// stream survives: within the limits, ordered by load, holding exactly the
// endpoints held, none refused, and after a snapshot only what it listed.
func FuzzMessageSequence(f *testing.F) {
	frame := func(msgs ...*federationv1.Update) []byte {
		var out []byte
		for _, u := range msgs {
			b, _ := proto.Marshal(u)
			out = append(out, byte(len(b)>>8), byte(len(b)))
			out = append(out, b...)
		}
		return out
	}
	ep := func(id uint32, addr string, waiting uint32) *federationv1.Endpoint {
		return &federationv1.Endpoint{Id: id, Spec: &federationv1.EndpointSpec{Name: fmt.Sprint("e", id), Address: addr, Port: 8000},
			Metrics: &federationv1.EndpointMetrics{NumRequestsWaiting: waiting, ScrapeUnixNano: 1}}
	}
	f.Add(frame(
		&federationv1.Update{Seq: 1, SentUnixNano: 2, Snapshot: true, Upserts: []*federationv1.Endpoint{ep(1, "10.2.0.1", 3), ep(2, "127.0.0.1", 0)}},
		&federationv1.Update{Seq: 2, SentUnixNano: 2, Upserts: []*federationv1.Endpoint{{Id: 2, Metrics: &federationv1.EndpointMetrics{}}, ep(3, "10.2.0.3", 1)}},
		&federationv1.Update{Seq: 3, SentUnixNano: 2, Snapshot: true, Upserts: []*federationv1.Endpoint{ep(4, "10.2.0.4", 0)}},
		&federationv1.Update{Seq: 4, SentUnixNano: 2, Removed: []uint32{4}, CurrentUnixNano: 2},
	))
	limits := Limits{MaxMessageBytes: 16 << 10, MaxEndpoints: 32}
	dest := Destinations{Own: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	ranges := []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := newPeerState(&Origin{Cluster: "west", Mode: fleetv1alpha1.FederationEndpoint}, "llm", limits, dest, ranges)
		for range 8 {
			if len(data) < 2 {
				return
			}
			n := min(int(data[0])<<8|int(data[1]), len(data)-2)
			msg := data[2 : 2+n]
			data = data[2+n:]
			u, err := DecodeUpdate(msg, limits)
			if err != nil {
				return
			}
			if err := p.apply(u, time.Now()); err != nil {
				return
			}
			checkView(t, p, u)
		}
	})
}

// checkView checks a peer's state and view after u was applied.
func checkView(t *testing.T, p *peerState, u *federationv1.Update) {
	t.Helper()
	if len(p.byID)+len(p.refused) > p.limits.MaxEndpoints || p.bytes > p.limits.MaxMessageBytes || p.bytes < 0 {
		t.Fatalf("%d held and %d refused endpoints in %d bytes; limits %+v", len(p.byID), len(p.refused), p.bytes, p.limits)
	}
	v := p.view.Load()
	if len(v.Entries) != len(p.byID) {
		t.Fatalf("view of %d entries, %d endpoints held", len(v.Entries), len(p.byID))
	}
	if !slices.IsSortedFunc(v.Entries, func(a, b Entry) int { return compareLoad(a.metrics, b.metrics) }) {
		t.Fatal("view not ordered by load")
	}
	listed := map[uint32]bool{}
	for _, e := range u.GetUpserts() {
		listed[e.GetId()] = true
	}
	for id, re := range p.byID {
		addr, err := netip.ParseAddr(re.ep.GetMetadata().GetIPAddress())
		if err != nil || p.dest.refusal(addr, p.ranges) != "" {
			t.Fatalf("endpoint %d held at %q", id, re.ep.GetMetadata().GetIPAddress())
		}
		if u.GetSnapshot() && !listed[id] {
			t.Fatalf("endpoint %d held after a snapshot that did not list it", id)
		}
	}
}
