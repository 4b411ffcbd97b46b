package federation

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

func TestDestinationsRefuseAddressesNoPeerEndpointHas(t *testing.T) {
	own := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	west := []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("fd00:2::/64")}
	loopbackFleet := []netip.Prefix{netip.MustParsePrefix("127.12.0.0/16")}
	tests := []struct {
		addr          string
		ranges        []netip.Prefix
		allowLoopback bool
		want          string
	}{
		{"10.2.0.7", west, false, ""},
		{"fd00:2::7", west, false, ""},
		{"10.3.0.7", west, false, RefusedOutside},
		{"10.3.0.7", nil, false, ""},
		{"10.1.0.7", nil, false, RefusedOwnRange},
		{"127.0.0.1", nil, false, RefusedLoopback},
		{"::1", nil, false, RefusedLoopback},
		{"::ffff:127.0.0.1", nil, false, RefusedLoopback},
		{"169.254.169.254", nil, false, RefusedLinkLocal},
		{"fe80::1", nil, false, RefusedLinkLocal},
		{"0.0.0.0", nil, false, RefusedUnspecified},
		{"::", nil, false, RefusedUnspecified},
		{"239.1.2.3", nil, false, RefusedMulticast},
		{"ff02::1", nil, false, RefusedLinkLocal},
		{"ff05::1", nil, false, RefusedMulticast},
		// The local fleet lives on loopback: there a peer's own range is
		// admitted, another cluster's range and 127.0.0.1 are not.
		{"127.12.0.9", loopbackFleet, true, ""},
		{"127.13.0.9", loopbackFleet, true, RefusedOutside},
		{"127.0.0.1", loopbackFleet, true, RefusedOutside},
		{"169.254.169.254", loopbackFleet, true, RefusedLinkLocal},
	}
	for _, tc := range tests {
		d := Destinations{AllowLoopback: tc.allowLoopback, Own: own}
		if got := d.refusal(netip.MustParseAddr(tc.addr), tc.ranges); got != tc.want {
			t.Errorf("%s (ranges %v, loopback allowed %v): refusal %q, want %q", tc.addr, tc.ranges, tc.allowLoopback, got, tc.want)
		}
	}
}

// A peer's refused endpoints are left out and counted once per spec; their
// metrics-only updates and removals are not protocol errors, and the rest
// of the peer's endpoints are held.
func TestPeerStateDropsRefusedEndpointsOnly(t *testing.T) {
	origin := &Origin{Cluster: "refusing-west", Mode: fleetv1alpha1.FederationEndpoint}
	p := newPeerState(origin, "llm", DefaultLimits, Destinations{Own: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}},
		[]netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")})
	ep := func(id uint32, addr string) *federationv1.Endpoint {
		return &federationv1.Endpoint{Id: id, Spec: spec(addr, addr), Metrics: metrics(0, 0)}
	}
	steps := []*federationv1.Update{
		snapshot(ep(1, "10.2.0.1"), ep(2, "127.0.0.1"), ep(3, "10.1.0.3"), ep(4, "10.2.0.4")),
		{Seq: 2, SentUnixNano: at(0), Upserts: []*federationv1.Endpoint{{Id: 2, Metrics: metrics(0, 0)}, {Id: 3, Metrics: metrics(0, 0)}}},
		// Endpoint 4 moves out of the peer's range: it goes.
		{Seq: 3, SentUnixNano: at(0), Upserts: []*federationv1.Endpoint{ep(4, "10.9.0.4")}, Removed: []uint32{2}},
	}
	for _, u := range steps {
		if err := p.apply(u, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	var held []string
	for _, e := range p.view.Load().Entries {
		held = append(held, e.Endpoint.GetMetadata().GetIPAddress())
	}
	if !slices.Equal(held, []string{"10.2.0.1"}) {
		t.Errorf("held %v, want only 10.2.0.1", held)
	}
	for reason, want := range map[string]float64{RefusedLoopback: 1, RefusedOwnRange: 1, RefusedOutside: 1} {
		if got := testutil.ToFloat64(endpointsRefused.WithLabelValues(origin.Cluster, reason)); got != want {
			t.Errorf("refusals for %s: %v, want %v", reason, got, want)
		}
	}
}

// A peer cannot grow what it makes this EPP hold, through deltas, past
// what one snapshot may carry.
func TestPeerStateBoundsAPeersBytes(t *testing.T) {
	limits := Limits{MaxMessageBytes: 2048, MaxEndpoints: 1000}
	p := newPeerState(&Origin{Cluster: "west"}, "llm", limits, Destinations{}, nil)
	if err := p.apply(snapshot(), time.Now()); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(2); seq < 200; seq++ {
		ep := &federationv1.Endpoint{Id: uint32(seq), Spec: spec(fmt.Sprintf("endpoint-%d", seq), "10.0.0.1"), Metrics: metrics(0, 0)}
		err := p.apply(&federationv1.Update{Seq: seq, SentUnixNano: at(0), Upserts: []*federationv1.Endpoint{ep}}, time.Now())
		if err != nil {
			if !errors.Is(err, errProtocol) || p.bytes > limits.MaxMessageBytes+proto.Size(ep) {
				t.Fatalf("error %v with %d bytes held", err, p.bytes)
			}
			return
		}
	}
	t.Fatalf("%d bytes held, limit %d", p.bytes, limits.MaxMessageBytes)
}
