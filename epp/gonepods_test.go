package epp

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/prefixes"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// The forget loop keeps what the picker knows of the pods that are there,
// local ones in the datastore and remote ones a peer publishes, and drops
// the rest, with federation or without.
func TestForgettingGonePodsKeepsThosePresent(t *testing.T) {
	pod := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "llm", Name: name} }
	hashes := []uint64{1, 2, 3}
	for _, tc := range []struct {
		name       string
		federation bool
		kept       []string
		dropped    []string
	}{
		{name: "with federation", federation: true, kept: []string{"l0", "r0@west"}, dropped: []string{"gone", "r9@west"}},
		{name: "without federation", kept: []string{"l0"}, dropped: []string{"gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meter := spill.NewMeter()
			// Each pod ran one timed request across the scrape read below:
			// a meter that still knows the pod takes it off the scrape.
			started, scrape := time.Now().Add(-time.Second), time.Now().Add(-time.Millisecond)
			for _, name := range append(append([]string(nil), tc.kept...), tc.dropped...) {
				meter.Started(pod(name), started)
				meter.Finished(pod(name), started, true)
			}
			g := gonePods{ds: &fakeDatastore{local: []fwkdl.Endpoint{endpoint("l0", "127.11.0.1:8000", 0, nil)}}, meter: meter, now: time.Now}
			if tc.federation {
				g.remote = &fakeRemote{eps: []fwkdl.Endpoint{endpoint("r0@west", "127.12.0.1:8000", 0, west)}}
				g.prefixes = prefixes.NewIndex()
				g.prefixes.Record(pod("l0"), hashes)
				g.prefixes.Record(pod("gone"), hashes)
			}

			g.forget()

			for _, name := range tc.kept {
				if _, running := meter.Scraped(pod(name), 0, 1, scrape); running != 0 {
					t.Errorf("meter of %s forgotten: a scrape's request it saw end still counts", name)
				}
			}
			for _, name := range tc.dropped {
				if _, running := meter.Scraped(pod(name), 0, 1, scrape); running != 1 {
					t.Errorf("meter of %s kept after it went away", name)
				}
			}
			if g.prefixes == nil {
				return
			}
			if n := g.prefixes.Match(pod("l0"), hashes); n != len(hashes) {
				t.Errorf("prefix record of l0 holds %d blocks, want %d", n, len(hashes))
			}
			if n := g.prefixes.Match(pod("gone"), hashes); n != 0 {
				t.Errorf("prefix record of a gone pod still holds %d blocks", n)
			}
		})
	}
}
