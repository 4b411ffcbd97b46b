package epp

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// A spilled request's candidates are bounded on both sides, so that GIE's
// scheduling cycle, which copies and scores every candidate, costs no more
// with a large saturated pool and a large fleet than without federation.
func TestSpilledCandidatesAreTheLeastLoadedOnBothSides(t *testing.T) {
	policy, _, _ := loadFleetinferConfig(t, testConfig)
	var local, remote []fwkdl.Endpoint
	for i := range 40 {
		local = append(local, endpoint(fmt.Sprint("l", i), fmt.Sprintf("127.11.0.%d:8000", i+1), 5+i, nil))
		remote = append(remote, endpoint(fmt.Sprint("r", i, "@west"), fmt.Sprintf("127.12.0.%d:8000", i+1), i/20, west))
	}
	c := &candidates{ds: &fakeDatastore{local: local}, remote: &fakeRemote{eps: remote}, spill: policy, now: time.Now}

	got := c.Locate(context.Background(), nil)
	var locals []string
	remotes := 0
	for _, ep := range got {
		if federation.OriginOf(ep.GetAttributes()) != nil {
			remotes++
			if q := ep.GetMetrics().WaitingQueueSize; q > 0 {
				t.Errorf("remote candidate with queue %d, while 20 of queue 0 exist", q)
			}
			continue
		}
		locals = append(locals, ep.GetMetadata().NamespacedName.Name)
	}
	slices.Sort(locals)
	want := []string{}
	for i := range 16 {
		want = append(want, fmt.Sprint("l", i))
	}
	slices.Sort(want)
	if remotes != 16 || !slices.Equal(locals, want) {
		t.Fatalf("spilled candidates: %d remote and local %v; want 16 remote and local %v", remotes, locals, want)
	}

	// Without a spill every local endpoint is a candidate, as in GIE.
	local[39].GetMetrics().WaitingQueueSize = 0
	if got := c.Locate(context.Background(), nil); len(got) != 40 {
		t.Fatalf("%d candidates with local headroom, want all 40 local endpoints", len(got))
	}
}

// The candidate lookup applies the policy the configured cross-cluster-filter
// was built with: with a queue threshold of 50, local endpoints with queues
// of 5 and more still have headroom, and nothing spills.
func TestCandidatesApplyTheConfiguredFiltersSpillPolicy(t *testing.T) {
	config := strings.Replace(testConfig, "- type: cross-cluster-filter\n",
		"- type: cross-cluster-filter\n  parameters: {queueDepthThreshold: 50}\n", 1)
	policy, _, _ := loadFleetinferConfig(t, config)
	local := []fwkdl.Endpoint{endpoint("l0", "127.11.0.1:8000", 5, nil), endpoint("l1", "127.11.0.2:8000", 9, nil)}
	remote := []fwkdl.Endpoint{endpoint("r0@west", "127.12.0.1:8000", 0, west)}
	c := &candidates{ds: &fakeDatastore{local: local}, remote: &fakeRemote{eps: remote}, spill: policy, now: time.Now}
	if got := c.Locate(context.Background(), nil); len(got) != 2 {
		t.Fatalf("%d candidates, want the 2 local endpoints", len(got))
	}
}

func TestOneSpillPolicyPerConfiguration(t *testing.T) {
	config := strings.Replace(testConfig, "- type: cross-cluster-filter\n",
		"- type: cross-cluster-filter\n- {type: cross-cluster-filter, name: second}\n", 1)
	configured := registerAllPlugins()
	loadConfig(t, []byte(config))
	if _, err := configured.get(); err == nil {
		t.Fatal("two cross-cluster-filters accepted")
	}
}
