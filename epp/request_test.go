package epp

import (
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/marks"
)

func TestRequestPath(t *testing.T) {
	idle := endpoint("a", "127.11.0.1:8000", 0, nil)
	busy := endpoint("b", "127.11.0.2:8000", 9, nil)
	rank1 := endpoint("a-rank-1", "127.11.0.1:8001", 4, nil)
	remoteIdle := endpoint("r@west", "127.12.0.1:8000", 0, west)
	parentIdle := endpoint("p@central", "127.13.0.1:8000", 0, central)
	parentOne := endpoint("q@central", "127.13.0.2:8000", 1, central)
	parentFull := endpoint("f@central", "127.13.0.3:8000", 6, central)
	parentIdleToo := endpoint("i@central", "127.13.0.4:8000", 0, central)
	tests := []struct {
		name          string
		local, remote []fwkdl.Endpoint
		body          string
		hint          []string
		hdr           [][2]string
		failOpen      bool
		want          result
		// orWant is another right result: the pick among endpoints that
		// score alike is random.
		orWant result
		// marks is how the picker counts the request's marks.
		marks string
	}{{
		name:  "local pick with header and envoy.lb metadata",
		local: []fwkdl.Endpoint{idle, busy}, remote: []fwkdl.Endpoint{remoteIdle},
		want: result{dest: "127.11.0.1:8000", metadata: "127.11.0.1:8000"},
	}, {
		name:  "no spill while a local endpoint is expected sooner than a remote one and its round trip",
		local: []fwkdl.Endpoint{busy, endpoint("c", "127.11.0.3:8000", 3, nil)}, remote: []fwkdl.Endpoint{remoteIdle},
		want: result{dest: "127.11.0.3:8000", metadata: "127.11.0.3:8000"},
	}, {
		name:  "spill to a remote endpoint (Endpoint mode) expected sooner, round trip included",
		local: []fwkdl.Endpoint{busy}, remote: []fwkdl.Endpoint{remoteIdle},
		want: result{dest: "127.12.0.1:8000", metadata: "127.12.0.1:8000"},
	}, {
		name:  "Parent mode sends to the remote gateway with the pod in signed marks",
		local: []fwkdl.Endpoint{busy}, remote: []fwkdl.Endpoint{parentIdle},
		want: result{dest: "127.13.0.99:8080", metadata: "127.13.0.99:8080", marks: "127.13.0.1:8000"},
	}, {
		name:  "Parent-mode marks name the picked pod first, then the cluster's other candidates, those expected as soon within the margin",
		local: []fwkdl.Endpoint{busy}, remote: []fwkdl.Endpoint{parentFull, parentOne, parentIdle, parentIdleToo, endpoint("s@west", "127.12.0.2:8000", 2, west)},
		want:   result{dest: "127.13.0.99:8080", metadata: "127.13.0.99:8080", marks: "127.13.0.1:8000,127.13.0.4:8000"},
		orWant: result{dest: "127.13.0.99:8080", metadata: "127.13.0.99:8080", marks: "127.13.0.4:8000,127.13.0.1:8000"},
	}, {
		name:  "a request marked with several pods is picked among them by this cluster's own data",
		local: []fwkdl.Endpoint{idle, busy, endpoint("c", "127.11.0.3:8000", 3, nil)},
		hdr:   markedBy(t, "central", "127.11.0.2:8000,127.11.0.3:8000"),
		want:  result{dest: "127.11.0.3:8000", metadata: "127.11.0.3:8000", marks: "-"}, marks: "accepted",
	}, {
		name:  "a request marked by a peer is picked locally, on the named pod",
		local: []fwkdl.Endpoint{idle, busy}, remote: []fwkdl.Endpoint{parentIdle},
		hdr:  markedBy(t, "central", "127.11.0.2:8000"),
		want: result{dest: "127.11.0.2:8000", metadata: "127.11.0.2:8000", marks: "-"}, marks: "accepted",
	}, {
		name:  "a marked request never leaves the cluster, even with every local pod saturated",
		local: []fwkdl.Endpoint{busy}, remote: []fwkdl.Endpoint{parentIdle, remoteIdle},
		hdr:  markedBy(t, "central", ""),
		want: result{dest: "127.11.0.2:8000", metadata: "127.11.0.2:8000", marks: "-"}, marks: "accepted",
	}, {
		name:  "marked pod gone: own local pick when the pool fails open",
		local: []fwkdl.Endpoint{idle, busy}, remote: []fwkdl.Endpoint{parentIdle}, failOpen: true,
		hdr:  markedBy(t, "central", "127.11.0.9:8000"),
		want: result{dest: "127.11.0.1:8000", metadata: "127.11.0.1:8000", marks: "-"}, marks: "accepted",
	}, {
		name:  "marked pod gone: 503 when the pool fails closed",
		local: []fwkdl.Endpoint{idle, busy}, remote: []fwkdl.Endpoint{parentIdle},
		hdr:  markedBy(t, "central", "127.11.0.9:8000"),
		want: result{status: 503}, marks: "accepted",
	}, {
		name:  "forged marks do not keep a request local: it spills with marks of its own",
		local: []fwkdl.Endpoint{busy}, remote: []fwkdl.Endpoint{parentIdle},
		hdr: [][2]string{{marks.Origin, "central"}, {marks.Hops, "1"}, {marks.Pod, "127.11.0.2:8000"},
			{marks.Expires, fmt.Sprint(time.Now().Add(time.Second).Unix())}, {marks.Signature, "Zm9yZ2Vk"}},
		want: result{dest: "127.13.0.99:8080", metadata: "127.13.0.99:8080", marks: "127.13.0.1:8000"}, marks: "rejected",
	}, {
		name:  "forged marks do not steer a local pick, and are removed",
		local: []fwkdl.Endpoint{idle, busy},
		hdr:   [][2]string{{marks.Origin, "central"}, {marks.Pod, "127.11.0.2:8000"}},
		want:  result{dest: "127.11.0.1:8000", metadata: "127.11.0.1:8000", marks: "-"}, marks: "rejected",
	}, {
		name:  "marks signed by a cluster outside the directory do not steer",
		local: []fwkdl.Endpoint{idle, busy},
		hdr:   markedBy(t, "east", "127.11.0.2:8000"),
		want:  result{dest: "127.11.0.1:8000", metadata: "127.11.0.1:8000", marks: "-"}, marks: "rejected",
	}, {
		name:  "remote endpoints past the queue cap do not take a spill",
		local: []fwkdl.Endpoint{busy}, remote: []fwkdl.Endpoint{endpoint("r@west", "127.12.0.1:8000", 20, west)},
		want: result{dest: "127.11.0.2:8000", metadata: "127.11.0.2:8000"},
	}, {
		name:  "subset hint matches IP and port",
		local: []fwkdl.Endpoint{idle, rank1}, hint: []string{"127.11.0.1:8001"},
		want: result{dest: "127.11.0.1:8001", metadata: "127.11.0.1:8001"},
	}, {
		name:  "a hinted request never leaves the cluster",
		local: []fwkdl.Endpoint{busy}, remote: []fwkdl.Endpoint{remoteIdle}, hint: []string{"127.11.0.2:8000"},
		want: result{dest: "127.11.0.2:8000", metadata: "127.11.0.2:8000"},
	}, {
		name:  "hinted pod gone: own pick when the pool fails open",
		local: []fwkdl.Endpoint{idle, busy}, hint: []string{"127.11.0.9:8000"}, failOpen: true,
		want: result{dest: "127.11.0.1:8000", metadata: "127.11.0.1:8000"},
	}, {
		name:  "hinted pod gone: 503 when the pool fails closed",
		local: []fwkdl.Endpoint{idle, busy}, hint: []string{"127.11.0.9:8000"},
		want: result{status: 503},
	}, {
		name:  "invalid JSON is a bad request",
		local: []fwkdl.Endpoint{idle}, body: `{"model": "llama", "prompt": `,
		want: result{status: 400},
	}, {
		name: "no endpoints anywhere is unavailable",
		want: result{status: 503},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.local, tc.remote)
			h.connected(tc.remote)
			h.failOpen = tc.failOpen
			body := tc.body
			if body == "" {
				body = completion("Hello from the fleet")
			}
			if tc.marks == "" {
				tc.marks = "absent"
			}
			before := counted(t, tc.marks)
			if got := h.requestWith(t, body, 7, tc.hint, tc.hdr); got != tc.want && (tc.orWant == result{} || got != tc.orWant) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if n := counted(t, tc.marks) - before; n != 1 {
				t.Fatalf("marks counted %s %v times, want once", tc.marks, n)
			}
		})
	}
}

// GIE's inflight-load-producer with fleetinfer's in-flight-requests-scorer
// loads (GIE's own consumer of the producer's data does not) and spreads
// picks over endpoints whose scraped metrics are alike: the second request
// goes where the first did not, before any scrape could tell them apart.
func TestInFlightScorerSpreadsPicksBetweenScrapes(t *testing.T) {
	const config = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: inflight-load-producer
- type: in-flight-requests-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: in-flight-requests-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 2}
dataLayer: {sources: []}
`
	local := []fwkdl.Endpoint{endpoint("a", "127.12.0.2:8000", 0, nil), endpoint("b", "127.12.0.3:8000", 0, nil)}
	h := newHarnessConfig(t, local, &fakeRemote{}, config)
	// Two rounds: each request stays in flight while the next is picked,
	// then all finish, and the counts start again from zero.
	for round := range 2 {
		first, finishFirst := h.requestHeld(t, completion(fmt.Sprint("first ", round)))
		second, finishSecond := h.requestHeld(t, completion(fmt.Sprint("second ", round)))
		finishFirst()
		finishSecond()
		if first == second {
			t.Fatalf("round %d: both requests went to %s while the other endpoint had none in flight", round, first)
		}
	}
}

// counted is the picker's count of requests whose marks had result.
func counted(t *testing.T, result string) float64 {
	t.Helper()
	var m dto.Metric
	if err := parentMarks.WithLabelValues(result).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// The spill policy counts this picker's own requests in flight to a pod,
// which its scrape may not show yet: with five requests held on the idle
// local pod (500 ms at the default 10/s), the sixth goes to the idle remote
// pod 400 ms away; once they end, requests stay local again.
// A crossing leaves the gateway a connection to the other cluster's
// gateway, which the next crossing there finds open: the first costs the
// round trip twice (a new connection's, then the request's), the next once.
// With the local queue at 5 (500 ms) an idle Parent-mode pod 400 ms away
// is sooner by the margin over an open connection and not over a new one;
// at 9 (900 ms) it is sooner either way.
func TestACrossingLeavesItsConnectionOpenForTheNext(t *testing.T) {
	local := endpoint("a", "127.11.0.1:8000", 5, nil)
	h := newHarness(t, []fwkdl.Endpoint{local}, []fwkdl.Endpoint{endpoint("p@central", "127.13.0.1:8000", 0, central)})
	queue := func(n int) {
		local.GetMetrics().WaitingQueueSize, local.GetMetrics().UpdateTime = n, time.Now()
	}
	for _, step := range []struct {
		name  string
		queue int
		want  string
	}{
		{"no connection open: the request stays", 5, "127.11.0.1:8000"},
		{"sooner even with a new connection: the request crosses", 9, "127.13.0.99:8080"},
		{"the connection is open: the request crosses", 5, "127.13.0.99:8080"},
	} {
		queue(step.queue)
		if got := h.request(t, completion(step.name), 7, nil); got.dest != step.want {
			t.Fatalf("%s: went to %s, want %s", step.name, got.dest, step.want)
		}
	}
}

func TestRequestsInFlightFromThisPickerMoveTheSpill(t *testing.T) {
	local := endpoint("a", "127.11.0.1:8000", 0, nil)
	remote := []fwkdl.Endpoint{endpoint("r@west", "127.12.0.1:8000", 0, west)}
	h := newHarness(t, []fwkdl.Endpoint{local}, remote)
	h.connected(remote)
	var held []func()
	for i := range 5 {
		dest, finish := h.requestHeld(t, completion(fmt.Sprint("held ", i)))
		held = append(held, finish)
		if dest != "127.11.0.1:8000" {
			t.Fatalf("request %d went to %s with %d in flight locally, want the local pod", i, dest, i)
		}
	}
	if got := h.request(t, completion("sixth"), 7, nil); got.dest != "127.12.0.1:8000" {
		t.Fatalf("sixth request went to %s, want the remote pod", got.dest)
	}
	for _, finish := range held {
		finish()
	}
	if got := h.request(t, completion("after"), 7, nil); got.dest != "127.11.0.1:8000" {
		t.Fatalf("after the held requests ended, a request went to %s, want the local pod", got.dest)
	}
}
