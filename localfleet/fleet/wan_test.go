package fleet

import (
	"testing"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// The hub sits in the first spoke's region unless the matrix names it; a
// matrix that leaves out a spoke is refused.
func TestFleetMatrixPlacesTheHub(t *testing.T) {
	spokes := []SpokeSpec{{Name: "east"}, {Name: "west"}, {Name: "central"}}
	withHub, err := wan.Parse([]byte("clusters: [east, west, central, hub]\ndefault: {rtt: 50ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	noHub, err := wan.Parse([]byte("clusters: [east, west, central]\ndefault: {rtt: 50ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	noCentral, err := wan.Parse([]byte("clusters: [east, west]\ndefault: {rtt: 50ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		network  *wan.Matrix
		hubEast  time.Duration
		hubWest  time.Duration
		wantFail bool
	}{
		{"default matrix", nil, wan.DefaultSameRegionRTT, 31 * time.Millisecond, false},
		{"a matrix without the hub", noHub, wan.DefaultSameRegionRTT, 50 * time.Millisecond, false},
		{"a matrix naming the hub", withHub, 50 * time.Millisecond, 50 * time.Millisecond, false},
		{"a matrix without a spoke", noCentral, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := fleetMatrix(Options{Spokes: spokes, Network: tc.network})
			if tc.wantFail {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				spoke string
				want  time.Duration
			}{{"east", tc.hubEast}, {"west", tc.hubWest}} {
				if l, err := m.Link(HubCluster, c.spoke); err != nil || l.RTT != c.want {
					t.Errorf("hub–%s %v (%v), want %s", c.spoke, l.RTT, err, c.want)
				}
			}
		})
	}
	if _, err := noHub.Link(HubCluster, "east"); err == nil {
		t.Error("fleetMatrix added the hub to the matrix it was given")
	}
}
