package federation

import (
	"maps"
	"slices"
	"testing"
	"time"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
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
