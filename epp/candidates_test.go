package epp

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/common/observability/logging"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// A crossing request's candidates are the few remote endpoints expected
// soonest, so that GIE's scheduling cycle, which copies and scores every
// candidate, costs no more with a large fleet than without federation; the
// local endpoints, all expected later, are left out.
func TestCrossingCandidatesAreTheRemoteEndpointsExpectedSoonest(t *testing.T) {
	policy, _, _ := loadFleetinferConfig(t, testConfig)
	var local, remote []fwkdl.Endpoint
	for i := range 40 {
		local = append(local, endpoint(fmt.Sprint("l", i), fmt.Sprintf("127.11.0.%d:8000", i+1), 5+i, nil))
		remote = append(remote, endpoint(fmt.Sprint("r", i, "@west"), fmt.Sprintf("127.12.0.%d:8000", i+1), i/20, west))
	}
	c := &candidates{ds: &fakeDatastore{local: local}, remote: &fakeRemote{eps: remote}, spill: policy, now: time.Now}

	got := c.Locate(context.Background(), nil)
	if len(got) != 16 {
		t.Fatalf("%d candidates, want the 16 remote endpoints expected soonest", len(got))
	}
	for _, ep := range got {
		if federation.OriginOf(ep.GetAttributes()) == nil {
			t.Fatalf("local candidate %s", ep.GetMetadata().NamespacedName.Name)
		}
		if q := ep.GetMetrics().WaitingQueueSize; q > 0 {
			t.Errorf("remote candidate with queue %d, while 20 of queue 0 exist", q)
		}
	}

	// With a local endpoint expected sooner, every local endpoint is a
	// candidate, as in GIE.
	local[39].GetMetrics().WaitingQueueSize = 0
	if got := c.Locate(context.Background(), nil); len(got) != 40 || slices.ContainsFunc(got, func(ep fwkdl.Endpoint) bool {
		return federation.OriginOf(ep.GetAttributes()) != nil
	}) {
		t.Fatalf("%d candidates with an idle local endpoint, want the 40 local endpoints", len(got))
	}
}

// The candidate lookup applies the policy the configured cross-cluster-filter
// was built with: with a margin of a second, local endpoints expected in
// 500 and 900 ms stay ahead of an idle remote endpoint 400 ms away.
func TestCandidatesApplyTheConfiguredFiltersSpillPolicy(t *testing.T) {
	config := strings.Replace(testConfig, "- type: cross-cluster-filter\n",
		"- type: cross-cluster-filter\n  parameters: {crossMargin: 1s}\n", 1)
	policy, _, _ := loadFleetinferConfig(t, config)
	local := []fwkdl.Endpoint{endpoint("l0", "127.11.0.1:8000", 5, nil), endpoint("l1", "127.11.0.2:8000", 9, nil)}
	remote := []fwkdl.Endpoint{endpoint("r0@west", "127.12.0.1:8000", 0, west)}
	c := &candidates{ds: &fakeDatastore{local: local}, remote: &fakeRemote{eps: remote}, spill: policy, now: time.Now}
	if got := c.Locate(context.Background(), nil); len(got) != 2 {
		t.Fatalf("%d candidates, want the 2 local endpoints", len(got))
	}
	policy, _, _ = loadFleetinferConfig(t, testConfig)
	c.spill = policy
	if got := c.Locate(context.Background(), nil); len(got) != 1 {
		t.Fatalf("%d candidates with the default margin, want the remote endpoint", len(got))
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

// At GIE's debug verbosity a request's lookup logs why it stays or crosses:
// the estimates weighed, here the local queue of 5 (500 ms) against remote
// endpoints 400 ms away, and, when the remote endpoints were read, why
// those read are no candidates; a flow-control probe's lookup logs
// nothing, nor does any lookup below that verbosity.
func TestTheSpillEstimateIsLoggedAtDebugVerbosity(t *testing.T) {
	local := []fwkdl.Endpoint{endpoint("l0", "127.11.0.1:8000", 5, nil)}
	idle := endpoint("r0@west", "127.12.0.1:8000", 0, west)
	queuedOne := endpoint("r0@west", "127.12.0.1:8000", 1, west)
	queuedAtCap := endpoint("r1@west", "127.12.0.2:8000", 5, west) // the default queueDepthThreshold
	for _, tc := range []struct {
		name      string
		remote    []fwkdl.Endpoint
		margin    string
		verbosity int
		request   bool
		// metered gives the lookup a meter, which has seen no crossing: a
		// crossing would open a new connection.
		metered bool
		want    string
	}{
		{name: "a request that crosses to the idle endpoint", remote: []fwkdl.Endpoint{idle, queuedAtCap}, margin: "20ms", verbosity: logging.DEBUG, request: true,
			want: `"level"=4 "msg"="Spill estimate" "remoteCandidates"=1 "localEstimateMs"=500 "remoteEstimateMs"=400 ` +
				`"remoteRead"=2 "remoteQueued"=1 "remoteStale"=0 "remoteCacheFull"=0 "remoteSlower"=0 "remoteUnconnected"=0`},
		{name: "a request that stays: the remote endpoints are slower by the margin or queued", remote: []fwkdl.Endpoint{queuedOne, queuedAtCap}, margin: "20ms", verbosity: logging.DEBUG, request: true,
			want: `"level"=4 "msg"="Spill estimate" "remoteCandidates"=0 "localEstimateMs"=500 ` +
				`"remoteRead"=2 "remoteQueued"=1 "remoteStale"=0 "remoteCacheFull"=0 "remoteSlower"=1 "remoteUnconnected"=0`},
		{name: "a request that stays: the idle endpoint is no sooner with a new connection's round trip", remote: []fwkdl.Endpoint{idle}, margin: "20ms", verbosity: logging.DEBUG, request: true,
			metered: true,
			want: `"level"=4 "msg"="Spill estimate" "remoteCandidates"=0 "localEstimateMs"=500 ` +
				`"remoteRead"=1 "remoteQueued"=0 "remoteStale"=0 "remoteCacheFull"=0 "remoteSlower"=1 "remoteUnconnected"=1`},
		{name: "a request that stays: no remote endpoint is read within the round trip and margin", remote: []fwkdl.Endpoint{idle}, margin: "1s", verbosity: logging.DEBUG, request: true,
			want: `"level"=4 "msg"="Spill estimate" "remoteCandidates"=0 "localEstimateMs"=500`},
		{name: "a saturation probe", remote: []fwkdl.Endpoint{idle}, margin: "20ms", verbosity: logging.DEBUG},
		{name: "below debug verbosity", remote: []fwkdl.Endpoint{idle}, margin: "20ms", verbosity: logging.DEBUG - 1, request: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			config := strings.Replace(testConfig, "- type: cross-cluster-filter\n",
				"- type: cross-cluster-filter\n  parameters: {crossMargin: "+tc.margin+"}\n", 1)
			policy, _, _ := loadFleetinferConfig(t, config)
			c := &candidates{ds: &fakeDatastore{local: local}, remote: &fakeRemote{eps: tc.remote}, spill: policy, now: time.Now}
			if tc.metered {
				c.meter = spill.NewMeter()
			}
			var lines []string
			ctx := log.IntoContext(context.Background(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: tc.verbosity}))
			if tc.request {
				ctx = withPick(ctx)
			}
			c.Locate(ctx, nil)
			switch {
			case tc.want == "" && len(lines) > 0:
				t.Fatalf("logged %q, want nothing", lines)
			case tc.want != "" && (len(lines) != 1 || lines[0] != tc.want):
				t.Fatalf("logged %q, want %q", lines, tc.want)
			}
		})
	}
}
