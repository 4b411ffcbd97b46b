package federation

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// The peer's clock runs an hour ahead of ours: only differences to its send
// time may matter.
var peerEpoch = time.Now().Add(time.Hour)

func at(offset time.Duration) int64 { return peerEpoch.Add(offset).UnixNano() }

func spec(name, ip string) *federationv1.EndpointSpec {
	return &federationv1.EndpointSpec{Name: name, PodName: name, Address: ip, Port: 8000}
}

func metrics(waiting uint32, scraped time.Duration) *federationv1.EndpointMetrics {
	return &federationv1.EndpointMetrics{NumRequestsWaiting: waiting, ScrapeUnixNano: at(scraped)}
}

func snapshot(eps ...*federationv1.Endpoint) *federationv1.Update {
	return &federationv1.Update{Seq: 1, SentUnixNano: at(0), Snapshot: true, Upserts: eps}
}

func TestPeerStateAppliesUpdatesInOrder(t *testing.T) {
	recv := time.Now()
	tests := []struct {
		name    string
		updates []*federationv1.Update
		// want maps endpoint names to their waiting queue and data age.
		want    map[string][2]int64
		wantErr string
	}{{
		name: "snapshot ages data by the peer's own clock",
		updates: []*federationv1.Update{snapshot(
			&federationv1.Endpoint{Id: 1, Spec: spec("a", "10.0.0.1"), Metrics: metrics(2, -30*time.Millisecond)})},
		want: map[string][2]int64{"a@west": {2, 30}},
	}, {
		name: "delta changes metrics without a spec and removes",
		updates: []*federationv1.Update{
			snapshot(&federationv1.Endpoint{Id: 1, Spec: spec("a", "10.0.0.1"), Metrics: metrics(2, -30*time.Millisecond)},
				&federationv1.Endpoint{Id: 2, Spec: spec("b", "10.0.0.2"), Metrics: metrics(0, -30*time.Millisecond)}),
			{Seq: 2, SentUnixNano: at(0), Upserts: []*federationv1.Endpoint{{Id: 1, Metrics: metrics(9, -10*time.Millisecond)}}, Removed: []uint32{2}},
		},
		want: map[string][2]int64{"a@west": {9, 10}},
	}, {
		name: "watermark refreshes unchanged endpoints but not lagging ones",
		updates: []*federationv1.Update{
			snapshot(&federationv1.Endpoint{Id: 1, Spec: spec("a", "10.0.0.1"), Metrics: metrics(1, -900*time.Millisecond)},
				&federationv1.Endpoint{Id: 2, Spec: spec("b", "10.0.0.2"), Metrics: metrics(1, -900*time.Millisecond)}),
			{Seq: 2, SentUnixNano: at(0), CurrentUnixNano: at(-20 * time.Millisecond), Lagging: []uint32{2}},
		},
		want: map[string][2]int64{"a@west": {1, 20}, "b@west": {1, 900}},
	}, {
		name:    "a stream must start with a snapshot",
		updates: []*federationv1.Update{{Seq: 1, SentUnixNano: at(0)}},
		wantErr: "snapshot",
	}, {
		name:    "sequence gaps are refused",
		updates: []*federationv1.Update{snapshot(), {Seq: 3, SentUnixNano: at(0)}},
		wantErr: "sequence 3 after 1",
	}, {
		name:    "a new endpoint needs its spec",
		updates: []*federationv1.Update{snapshot(&federationv1.Endpoint{Id: 1, Metrics: metrics(0, 0)})},
		wantErr: "without its spec",
	}, {
		name:    "removing an unknown endpoint is refused",
		updates: []*federationv1.Update{snapshot(), {Seq: 2, SentUnixNano: at(0), Removed: []uint32{7}}},
		wantErr: "unknown endpoint 7",
	}, {
		name: "a peer may not exceed its endpoint limit",
		updates: []*federationv1.Update{snapshot(
			&federationv1.Endpoint{Id: 1, Spec: spec("a", "10.0.0.1"), Metrics: metrics(0, 0)},
			&federationv1.Endpoint{Id: 2, Spec: spec("b", "10.0.0.2"), Metrics: metrics(0, 0)},
			&federationv1.Endpoint{Id: 3, Spec: spec("c", "10.0.0.3"), Metrics: metrics(0, 0)})},
		wantErr: "exceeds 2 endpoints",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPeerState(&Origin{Cluster: "west", Mode: fleetv1alpha1.FederationEndpoint}, "llm", Limits{MaxMessageBytes: 1 << 20, MaxEndpoints: 2}, Destinations{}, nil)
			var err error
			for _, u := range tc.updates {
				if err = p.apply(u, recv); err != nil {
					break
				}
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, errProtocol) {
					t.Fatalf("error %v, want a protocol error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][2]int64{}
			for _, ep := range (Remote{Peers: []*View{p.view.Load()}}).AppendFresh(nil) {
				m := ep.GetMetrics()
				got[ep.GetMetadata().NamespacedName.Name] = [2]int64{int64(m.WaitingQueueSize), recv.Sub(m.UpdateTime).Milliseconds()}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("endpoints %v, want %v", got, tc.want)
			}
			for name, w := range tc.want {
				if got[name] != w {
					t.Errorf("%s: waiting and age(ms) %v, want %v", name, got[name], w)
				}
			}
		})
	}
}

// A view's entry says where the entry gateway sends a request picked to it,
// as NextHop does, and follows a spec that moves the pod.
func TestAViewsEntriesCarryTheirNextHop(t *testing.T) {
	moved := &federationv1.Update{Seq: 2, SentUnixNano: at(0), Upserts: []*federationv1.Endpoint{{Id: 1, Spec: spec("a", "10.0.0.9"), Metrics: metrics(0, 0)}}}
	for _, tc := range []struct {
		name    string
		mode    fleetv1alpha1.FederationMode
		updates []*federationv1.Update
		want    string
	}{
		{"Endpoint mode: the pod", fleetv1alpha1.FederationEndpoint, nil, "10.0.0.1:8000"},
		{"Endpoint mode, the pod moved: its new address", fleetv1alpha1.FederationEndpoint, []*federationv1.Update{moved}, "10.0.0.9:8000"},
		{"Parent mode: the cluster's gateway", fleetv1alpha1.FederationParent, nil, "gw.west:8080"},
		{"Parent mode, the pod moved: still the gateway", fleetv1alpha1.FederationParent, []*federationv1.Update{moved}, "gw.west:8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &Origin{Cluster: "west", Mode: tc.mode, Gateway: "gw.west:8080"}
			p := newPeerState(o, "llm", Limits{MaxMessageBytes: 1 << 20, MaxEndpoints: 2}, Destinations{}, nil)
			updates := append([]*federationv1.Update{snapshot(&federationv1.Endpoint{Id: 1, Spec: spec("a", "10.0.0.1"), Metrics: metrics(0, 0)})}, tc.updates...)
			for _, u := range updates {
				if err := p.apply(u, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			e := &p.view.Load().Entries[0]
			if e.NextHop() != tc.want || NextHop(o, e.Endpoint.GetMetadata()) != tc.want {
				t.Fatalf("entry's next hop %q, NextHop %q; want %q", e.NextHop(), NextHop(o, e.Endpoint.GetMetadata()), tc.want)
			}
			if v := NewView(o, []Entry{{Endpoint: e.Endpoint}}); v.Entries[0].NextHop() != tc.want {
				t.Fatalf("NewView's entry's next hop %q, want %q", v.Entries[0].NextHop(), tc.want)
			}
		})
	}
}

func TestDecodeUpdateRefusesMalformedOrOversizedMessages(t *testing.T) {
	valid := func(mut func(*federationv1.Update)) []byte {
		u := snapshot(&federationv1.Endpoint{Id: 1, Spec: spec("a", "10.0.0.1"), Metrics: metrics(0, 0)})
		mut(u)
		b, err := proto.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	manyLabels := map[string]string{}
	for i := range maxLabels + 1 {
		manyLabels[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name    string
		data    []byte
		wantErr string
	}{
		{"valid", valid(func(*federationv1.Update) {}), ""},
		{"not protobuf", []byte{0xff, 0xff, 0xff}, "malformed"},
		{"oversized", make([]byte, 8192), "exceeds the limit"},
		{"no sequence", valid(func(u *federationv1.Update) { u.Seq = 0 }), "sequence"},
		{"KV usage not a fraction", valid(func(u *federationv1.Update) { u.Upserts[0].Metrics.KvCacheUsage = 1.5 }), "not a fraction"},
		{"address not an IP", valid(func(u *federationv1.Update) { u.Upserts[0].Spec.Address = "evil.example" }), "not an IP"},
		{"port zero", valid(func(u *federationv1.Update) { u.Upserts[0].Spec.Port = 0 }), "port"},
		{"too many labels", valid(func(u *federationv1.Update) { u.Upserts[0].Spec.Labels = manyLabels }), "labels"},
		{"no metrics", valid(func(u *federationv1.Update) { u.Upserts[0].Metrics = nil }), "without metrics"},
		{"upserted twice", valid(func(u *federationv1.Update) { u.Upserts = append(u.Upserts, u.Upserts[0]) }), "twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeUpdate(tc.data, Limits{MaxMessageBytes: 4096, MaxEndpoints: 16})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// BenchmarkApply decodes and applies one message of a peer: of 90
// endpoints, a tenth of which changed since the last one, with the
// freshness watermark (what the benchmark's peers send twenty times a
// second each); of 4,096 endpoints, one changed (a flooding peer's
// message); and a heartbeat of 4,096 endpoints.
func BenchmarkApply(b *testing.B) {
	for _, bc := range []struct {
		name             string
		endpoints, dirty uint32
	}{{"90 endpoints, 9 changed", 90, 9}, {"4096 endpoints, 1 changed", 4096, 1}, {"4096 endpoints, heartbeat", 4096, 0}} {
		b.Run(bc.name, func(b *testing.B) {
			p := newPeerState(&Origin{Cluster: "west", Mode: fleetv1alpha1.FederationEndpoint}, "llm", DefaultLimits, Destinations{}, nil)
			first := snapshot()
			for i := range bc.endpoints {
				first.Upserts = append(first.Upserts, &federationv1.Endpoint{Id: i + 1, Spec: &federationv1.EndpointSpec{
					Name: fmt.Sprintf("sim-%04d-rank-0", i), PodName: fmt.Sprintf("sim-%04d", i), Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), Port: 8000,
					Labels: map[string]string{"app": "llama", "pod-template-hash": "7d9f8c6b5"}}, Metrics: metrics(i%4, -time.Millisecond)})
			}
			if err := p.apply(first, time.Now()); err != nil {
				b.Fatal(err)
			}
			seq := uint64(1)
			b.ReportAllocs()
			for b.Loop() {
				seq++
				u := &federationv1.Update{Seq: seq, SentUnixNano: at(0), CurrentUnixNano: at(-time.Millisecond)}
				for j := range bc.dirty {
					u.Upserts = append(u.Upserts, &federationv1.Endpoint{Id: (uint32(seq)*7+j*10)%bc.endpoints + 1, Metrics: metrics(uint32(seq%4), -time.Millisecond)})
				}
				data, err := proto.Marshal(u)
				if err != nil {
					b.Fatal(err)
				}
				if u, err = DecodeUpdate(data, DefaultLimits); err != nil {
					b.Fatal(err)
				}
				if err := p.apply(u, time.Now()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
