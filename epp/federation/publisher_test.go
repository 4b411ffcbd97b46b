package federation

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
)

func TestPublisherDiffSendsOnlyChanges(t *testing.T) {
	scraped := time.Now()
	pod := func(md *fwkdl.EndpointMetadata, mut func(*fwkdl.Metrics)) fwkdl.Endpoint {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = 1, 0.5, scraped
		if mut != nil {
			mut(m)
		}
		return fwkdl.NewEndpoint(md, m)
	}
	a := localPod("a", "127.12.0.1", 0).GetMetadata()
	b := localPod("b", "127.12.0.2", 0).GetMetadata()
	relabelled := a.Clone()
	relabelled.Labels["llm-d.ai/role"] = "decode"
	// upserts describes a delta: id, then "spec" (a full endpoint) or
	// "metrics" (metrics only).
	type upsert struct {
		id   uint32
		what string
	}
	tests := []struct {
		name    string
		local   []fwkdl.Endpoint
		want    []upsert
		removed []uint32
	}{
		{"new endpoints are sent whole", []fwkdl.Endpoint{pod(a, nil), pod(b, nil)}, []upsert{{1, "spec"}, {2, "spec"}}, nil},
		{"a rescrape with the same values is no change", []fwkdl.Endpoint{
			pod(a, func(m *fwkdl.Metrics) { m.UpdateTime = scraped.Add(time.Second) }), pod(b, nil)}, nil, nil},
		{"equal metadata in a new object is no change", []fwkdl.Endpoint{pod(a.Clone(), nil), pod(b, nil)}, nil, nil},
		{"a queue change sends metrics only", []fwkdl.Endpoint{pod(a, func(m *fwkdl.Metrics) { m.WaitingQueueSize = 4 }), pod(b, nil)},
			[]upsert{{1, "metrics"}}, nil},
		{"LoRA state is a change", []fwkdl.Endpoint{pod(a, func(m *fwkdl.Metrics) { m.WaitingQueueSize = 4; m.ActiveModels["sql"] = 1 }), pod(b, nil)},
			[]upsert{{1, "metrics"}}, nil},
		{"a label change sends the endpoint whole", []fwkdl.Endpoint{
			pod(relabelled, func(m *fwkdl.Metrics) { m.WaitingQueueSize = 4; m.ActiveModels["sql"] = 1 }), pod(b, nil)},
			[]upsert{{1, "spec"}}, nil},
		{"a pod that is gone is removed", []fwkdl.Endpoint{pod(b, nil)}, nil, []uint32{1}},
	}
	p := NewPublisher(PublisherOptions{LaggingAfter: time.Hour})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := p.diff(tc.local, time.Now())
			var got []upsert
			for _, e := range u.GetUpserts() {
				what := "metrics"
				if e.GetSpec() != nil {
					what = "spec"
				}
				got = append(got, upsert{e.GetId(), what})
			}
			slices.SortFunc(got, func(x, y upsert) int { return int(x.id) - int(y.id) })
			if !slices.Equal(got, tc.want) || !slices.Equal(u.GetRemoved(), tc.removed) {
				t.Fatalf("upserts %v removed %v, want %v and %v", got, u.GetRemoved(), tc.want, tc.removed)
			}
		})
	}
	// A snapshot carries the latest scrape and values, whatever was sent.
	later := scraped.Add(3 * time.Second)
	p.diff([]fwkdl.Endpoint{pod(b, func(m *fwkdl.Metrics) { m.UpdateTime = later })}, later)
	snap := p.snapshot(later)
	if len(snap.GetUpserts()) != 1 || snap.GetUpserts()[0].GetMetrics().GetScrapeUnixNano() != later.UnixNano() ||
		snap.GetUpserts()[0].GetSpec().GetName() != "b-rank-0" || !maps.Equal(snap.GetUpserts()[0].GetSpec().GetLabels(), b.Labels) {
		t.Fatalf("snapshot %v", snap)
	}
	if snap.GetCurrentUnixNano() != later.UnixNano() {
		t.Fatalf("watermark %d, want the latest scrape %d", snap.GetCurrentUnixNano(), later.UnixNano())
	}
}

// A pod's prefix summary is published with it when new, again only when it
// changed and at most every PrefixInterval, is part of every snapshot, and
// reaches the subscriber's view of the pod, which keeps it across updates
// that do not carry one.
func TestPrefixSummariesTravelWhenTheyChangeAtMostEveryInterval(t *testing.T) {
	index := prefixes.NewIndex()
	a, b := localPod("a", "127.12.0.1", 0), localPod("b", "127.12.0.2", 0)
	doc := prefixes.Hashes("m", strings.Repeat("the shared document ", 40))
	question := prefixes.Hashes("m", strings.Repeat("the shared document ", 40)+strings.Repeat("and a question ", 10))
	index.Record(a.GetMetadata().NamespacedName, doc)
	p := NewPublisher(PublisherOptions{LaggingAfter: time.Hour, Prefixes: index.Summary, PrefixInterval: time.Second})
	sub := newPeerState(&Origin{Cluster: "east", Mode: fleetv1alpha1.FederationEndpoint}, testPool.Namespace, DefaultLimits,
		Destinations{AllowLoopback: true}, nil)
	t0 := time.Now()
	seq := uint64(0)
	send := func(u *federationv1.Update, at time.Time) {
		t.Helper()
		seq++
		u.Seq, u.SentUnixNano = seq, at.UnixNano()
		if err := sub.apply(u, at); err != nil {
			t.Fatal(err)
		}
	}
	held := func(pod string, hashes []uint64) int {
		for _, e := range sub.view.Load().Entries {
			if e.Endpoint.GetMetadata().PodName == pod+"@east" {
				if e.Prefixes == nil {
					return -1
				}
				return e.Prefixes.Match(hashes)
			}
		}
		t.Fatalf("no entry for %s", pod)
		return 0
	}
	withSummary := func(u *federationv1.Update) []uint32 {
		var ids []uint32
		for _, e := range u.GetUpserts() {
			if e.GetPrefixes() != nil {
				ids = append(ids, e.GetId())
			}
		}
		return ids
	}
	steps := []struct {
		name   string
		after  time.Duration
		record []uint64 // recorded for a before the tick
		want   []uint32 // ids sent with a summary
		heldA  int      // blocks of question the subscriber sees a hold
	}{
		{"a new pod goes with its summary, one without none", 0, nil, []uint32{1}, len(doc)},
		{"a change within the interval waits", 100 * time.Millisecond, question, nil, len(doc)},
		{"after the interval it goes", 1100 * time.Millisecond, nil, []uint32{1}, len(question)},
		{"no change, nothing sent", 2500 * time.Millisecond, question[:3], nil, len(question)},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			index.Record(a.GetMetadata().NamespacedName, st.record)
			now := t0.Add(st.after)
			u := p.diff([]fwkdl.Endpoint{a, b}, now)
			if seq == 0 {
				u = p.snapshot(now)
			}
			if got := withSummary(u); !slices.Equal(got, st.want) {
				t.Fatalf("summaries sent for %v, want %v", got, st.want)
			}
			send(u, now)
			if got := held("a", question); got != st.heldA {
				t.Fatalf("the subscriber sees a hold %d blocks of the question, want %d", got, st.heldA)
			}
			if got := held("b", question); got != -1 {
				t.Fatalf("the subscriber has a summary for b, which has none (matches %d)", got)
			}
		})
	}
	if got := withSummary(p.snapshot(t0.Add(3 * time.Second))); !slices.Equal(got, []uint32{1}) {
		t.Fatalf("a snapshot carries summaries for %v, want [1]", got)
	}
}

// A summary that would not fit the subscribers' message limit waits: the
// endpoint is published without it, never withheld for it.
func TestAPrefixSummaryNeverCostsAnEndpointItsPlace(t *testing.T) {
	index := prefixes.NewIndex()
	a := localPod("a", "127.12.0.1", 0)
	index.Record(a.GetMetadata().NamespacedName, prefixes.Hashes("m", strings.Repeat("the shared document ", 40)))
	p := NewPublisher(PublisherOptions{LaggingAfter: time.Hour, Prefixes: index.Summary, PrefixInterval: time.Second,
		Limits: Limits{MaxMessageBytes: prefixes.SummaryBytes, MaxEndpoints: 8}})
	u := p.diff([]fwkdl.Endpoint{a}, time.Now())
	if len(u.GetUpserts()) != 1 || u.GetUpserts()[0].GetSpec() == nil {
		t.Fatalf("upserts %v, want the endpoint", u.GetUpserts())
	}
	if u.GetUpserts()[0].GetPrefixes() != nil {
		t.Fatal("a summary larger than the message limit was sent")
	}
	if len(p.withheld) != 0 {
		t.Fatalf("withheld %v", p.withheld)
	}
}

// The picker's own view of its pods' load (Load) is what peers get, and a
// change of it travels without waiting for the interval, but no sooner than
// the minimum gap after the last message.
func TestThePickersLoadIsPublishedWhenItChangesAtMostEveryMinGap(t *testing.T) {
	const minGap = 40 * time.Millisecond
	var inFlight atomic.Int64
	changed := make(chan struct{}, 1)
	pods := &localPods{}
	pods.set(localPod("a", "127.12.0.1", 1))
	p := NewPublisher(PublisherOptions{Pool: testPool, Local: pods.list, Interval: time.Hour, Heartbeat: time.Hour, LaggingAfter: time.Hour,
		Load: func(_ types.NamespacedName, waiting, running int, _ time.Time) (int, int) {
			return waiting, max(running, int(inFlight.Load())-waiting)
		},
		Changed: changed, MinGap: minGap})
	s := &subscription{ch: make(chan *federationv1.Update, 16), ended: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()

	// receive returns when the next message arrived, failing unless it
	// carries the pod with waiting and running requests.
	receive := func(waiting, running uint32) time.Time {
		t.Helper()
		select {
		case u := <-s.ch:
			if len(u.GetUpserts()) != 1 {
				t.Fatalf("upserts %v, want the pod's", u.GetUpserts())
			}
			m := u.GetUpserts()[0].GetMetrics()
			if m.GetNumRequestsWaiting() != waiting || m.GetNumRequestsRunning() != running {
				t.Fatalf("published waiting %d running %d, want %d and %d", m.GetNumRequestsWaiting(), m.GetNumRequestsRunning(), waiting, running)
			}
			return time.Now()
		case <-time.After(5 * time.Second):
			t.Fatalf("no message with waiting %d running %d", waiting, running)
		}
		return time.Time{}
	}
	inFlight.Store(3)
	changed <- struct{}{}
	first := receive(1, 2)
	inFlight.Store(5)
	changed <- struct{}{}
	second := receive(1, 4)
	if gap := second.Sub(first); gap < minGap/2 {
		t.Fatalf("second message %v after the first, want about the minimum gap %v", gap, minGap)
	}
	// A signal that changed nothing sends nothing (the heartbeat is an hour).
	changed <- struct{}{}
	select {
	case u := <-s.ch:
		t.Fatalf("message %v without a change", u)
	case <-time.After(3 * minGap):
	}
}
