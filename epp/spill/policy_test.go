package spill

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

var now = time.Now()

// testPolicy is the policy of the default parameters, edited, at now.
func testPolicy(tb testing.TB, edit func(*Params)) *Policy {
	tb.Helper()
	p := DefaultParams
	if edit != nil {
		edit(&p)
	}
	policy, err := New(p, func() time.Time { return now })
	if err != nil {
		tb.Fatal(err)
	}
	return policy
}

func TestHeadroomIsFreshMetricsBelowBothThresholds(t *testing.T) {
	fresh, stale := 10*time.Millisecond, time.Minute
	ep := func(waiting int, kv float64, age time.Duration, remote bool) fwksched.Endpoint {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now.Add(-age)
		attrs := fwkdl.NewAttributes()
		if remote {
			attrs.Put(federation.OriginAttribute, &federation.Origin{Cluster: "west"})
		}
		return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{}, m, attrs)
	}
	p := testPolicy(t, nil)
	for _, tc := range []struct {
		name string
		ep   fwksched.Endpoint
		want bool
	}{
		{"fresh and below both thresholds", ep(4, 0.79, fresh, false), true},
		{"queue at the threshold", ep(5, 0, fresh, false), false},
		{"KV cache at the threshold", ep(0, 0.8, fresh, false), false},
		{"stale local metrics", ep(0, 0, stale, false), false},
		{"local metrics older than the local threshold", ep(0, 0, 500*time.Millisecond, false), false},
		{"remote data within the remote threshold", ep(0, 0, 500*time.Millisecond, true), true},
		{"stale remote data", ep(0, 0, 2*time.Second, true), false},
		{"remote queue at the threshold", ep(5, 0, fresh, true), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.HasRoom(tc.ep); got != tc.want {
				t.Fatalf("HasRoom = %v, want %v", got, tc.want)
			}
		})
	}
	local := func(eps ...fwksched.Endpoint) []fwkdl.Endpoint {
		out := make([]fwkdl.Endpoint, len(eps))
		for i, e := range eps {
			out[i] = fwkdl.NewEndpoint(e.GetMetadata(), e.GetMetrics())
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		local []fwkdl.Endpoint
		want  bool
	}{
		{"one local endpoint with headroom keeps requests local", local(ep(9, 0, fresh, false), ep(1, 0, fresh, false)), false},
		{"saturated by queue", local(ep(5, 0, fresh, false), ep(9, 0, fresh, false)), true},
		{"saturated by KV cache", local(ep(0, 0.9, fresh, false)), true},
		{"stale local metrics count as saturated", local(ep(0, 0, stale, false)), true},
		{"no local endpoints", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Saturated(tc.local); got != tc.want {
				t.Fatalf("Saturated = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewRefusesInvalidParameters(t *testing.T) {
	for name, edit := range map[string]func(*Params){
		"negative queue threshold":     func(p *Params) { p.QueueDepthThreshold = -1 },
		"KV threshold above 1":         func(p *Params) { p.KVCacheUtilThreshold = 80 },
		"no staleness threshold":       func(p *Params) { p.MetricsStalenessThreshold = 0 },
		"no remote candidates":         func(p *Params) { p.MaxRemoteCandidates = 0 },
		"no local candidates on spill": func(p *Params) { p.MaxLocalCandidatesOnSpill = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			p := DefaultParams
			edit(&p)
			if _, err := New(p, time.Now); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestRemoteIsTheLeastLoadedFewAndOnlyOnSpill(t *testing.T) {
	dl := func(name string, waiting int, kv float64) *fwkdl.ModelServer {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now.Add(-time.Minute)
		return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}}, m)
	}
	// view builds a peer's view; each endpoint's data is vouched for age ago.
	view := func(cluster string, eps map[*fwkdl.ModelServer]time.Duration) *federation.View {
		var entries []federation.Entry
		for ep, age := range eps {
			entries = append(entries, federation.Entry{Endpoint: ep, Updated: now.Add(-age)})
		}
		return federation.NewView(&federation.Origin{Cluster: cluster}, entries)
	}
	fresh := 10 * time.Millisecond
	west := view("w", map[*fwkdl.ModelServer]time.Duration{dl("w-busy", 9, 0): fresh, dl("w-q2", 2, 0.1): fresh,
		dl("w-q0-kv5", 0, 0.5): fresh, dl("w-q0-kv1", 0, 0.1): fresh, dl("w-q1", 1, 0): fresh})
	east := view("e", map[*fwkdl.ModelServer]time.Duration{dl("e-q0-kv0", 0, 0): fresh, dl("e-q0-kv9", 0, 0.9): fresh,
		dl("e-stale-q0", 0, 0): 3 * time.Second, dl("e-old-q0", 0, 0): 1500 * time.Millisecond, dl("e-busy", 8, 0): fresh})
	remote := federation.Remote{Peers: []*federation.View{west, east}, Stale: now.Add(-2 * time.Second)}
	tests := []struct {
		name   string
		local  []fwkdl.Endpoint
		remote federation.Remote
		want   string
	}{
		{"least loaded with headroom across peers, bounded", []fwkdl.Endpoint{dl("l", 7, 0)}, remote, "e-q0-kv0,w-q0-kv1,w-q0-kv5"},
		{"one peer", []fwkdl.Endpoint{dl("l", 7, 0)}, federation.Remote{Peers: []*federation.View{west}, Stale: remote.Stale},
			"w-q0-kv1,w-q0-kv5,w-q1"},
		{"none when no remote endpoint has headroom", []fwkdl.Endpoint{dl("l", 7, 0)},
			federation.Remote{Peers: []*federation.View{view("e", map[*fwkdl.ModelServer]time.Duration{
				dl("e-busy", 8, 0): fresh, dl("e-full", 0, 0.95): fresh, dl("e-old", 0, 0): 1500 * time.Millisecond})}, Stale: remote.Stale}, ""},
		{"without local endpoints, least loaded whether with headroom or not", nil,
			federation.Remote{Peers: []*federation.View{view("e", map[*fwkdl.ModelServer]time.Duration{
				dl("e-busy", 8, 0): fresh, dl("e-full", 0, 0.95): fresh, dl("e-old", 0, 0): 1500 * time.Millisecond,
				dl("e-stale", 0, 0): 3 * time.Second})}, Stale: remote.Stale}, "e-busy,e-full,e-old"},
		{"no peers", []fwkdl.Endpoint{dl("l", 7, 0)}, federation.Remote{Stale: remote.Stale}, ""},
	}
	policy := testPolicy(t, func(p *Params) { p.MaxRemoteCandidates = 3 })
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The peers are visited from a random one; the result must not
			// depend on it.
			for range 20 {
				var got []string
				for _, e := range policy.Remote(tc.local, tc.remote) {
					if e.GetMetrics().UpdateTime.Before(now.Add(-2 * time.Second)) {
						t.Fatalf("%s dated %v: stale", e.GetMetadata().NamespacedName.Name, e.GetMetrics().UpdateTime)
					}
					got = append(got, e.GetMetadata().NamespacedName.Name)
				}
				slices.Sort(got)
				if strings.Join(got, ",") != tc.want {
					t.Fatalf("admitted %v, want %s", got, tc.want)
				}
			}
		})
	}
}

func TestLocalOnSpillIsTheLeastLoadedFew(t *testing.T) {
	dl := func(name string, waiting int, kv float64) fwkdl.Endpoint {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now
		return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}}, m)
	}
	noMetrics := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "unscraped"}}, nil)
	policy := testPolicy(t, func(p *Params) { p.MaxLocalCandidatesOnSpill = 3 })
	for _, tc := range []struct {
		name  string
		local []fwkdl.Endpoint
		want  string
	}{
		{"queue first, then KV cache", []fwkdl.Endpoint{dl("q9", 9, 0), dl("q6-kv9", 6, 0.9), dl("q6-kv1", 6, 0.1),
			dl("q5-kv95", 5, 0.95), dl("q7", 7, 0)}, "q5-kv95,q6-kv1,q6-kv9"},
		{"endpoints never scraped last", []fwkdl.Endpoint{noMetrics, dl("q9", 9, 0), dl("q8", 8, 0), dl("q7", 7, 0)}, "q7,q8,q9"},
		{"all of them when within the bound", []fwkdl.Endpoint{dl("q9", 9, 0), noMetrics}, "q9,unscraped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 {
				var got []string
				for _, e := range policy.Local(tc.local) {
					got = append(got, e.GetMetadata().NamespacedName.Name)
				}
				slices.Sort(got)
				if strings.Join(got, ",") != tc.want {
					t.Fatalf("kept %v, want %s", got, tc.want)
				}
			}
		})
	}
	t.Run("equal loads do not always keep the same endpoints", func(t *testing.T) {
		var local []fwkdl.Endpoint
		for i := range 10 {
			local = append(local, dl(fmt.Sprint("q6-", i), 6, 0.5))
		}
		kept := map[string]bool{}
		for range 50 {
			for _, e := range policy.Local(local) {
				kept[e.GetMetadata().NamespacedName.Name] = true
			}
		}
		if len(kept) < 6 {
			t.Fatalf("50 spills kept only %d of 10 equally loaded endpoints", len(kept))
		}
	})
}

func TestRemoteCarriesTheViewsFreshness(t *testing.T) {
	m := fwkdl.NewMetrics()
	m.UpdateTime = now.Add(-time.Minute) // the scrape, before watermarks vouched for it
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "r"}}, m)
	ep.GetAttributes().Put(federation.OriginAttribute, &federation.Origin{Cluster: "w"})
	v := federation.NewView(&federation.Origin{Cluster: "w"}, []federation.Entry{{Endpoint: ep, Updated: now.Add(-20 * time.Millisecond)}})
	policy := testPolicy(t, nil)
	got := policy.Remote(nil, federation.Remote{Peers: []*federation.View{v}, Stale: now.Add(-2 * time.Second)})
	if len(got) != 1 || !got[0].GetMetrics().UpdateTime.Equal(now.Add(-20*time.Millisecond)) {
		t.Fatalf("got %v", got)
	}
	if federation.OriginOf(got[0].GetAttributes()) == nil || ep.GetMetrics().UpdateTime != m.UpdateTime {
		t.Fatal("the candidate lost its origin or changed the view's endpoint")
	}
}

// BenchmarkRemote picks the 16 least loaded of 10 peers × 90
// endpoints, as a spilled pick does.
func BenchmarkRemote(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	remote := federation.Remote{Stale: now.Add(-2 * time.Second)}
	for c := range 10 {
		entries := make([]federation.Entry, 90)
		for i := range entries {
			m := fwkdl.NewMetrics()
			m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = rng.IntN(4), float64(rng.IntN(60))/100, now
			entries[i] = federation.Entry{Endpoint: fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{}, m), Updated: now}
		}
		remote.Peers = append(remote.Peers, federation.NewView(&federation.Origin{Cluster: fmt.Sprint(c)}, entries))
	}
	local := []fwkdl.Endpoint{fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{}, &fwkdl.Metrics{WaitingQueueSize: 10, UpdateTime: now})}
	policy := testPolicy(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		if len(policy.Remote(local, remote)) != 16 {
			b.Fatal("not 16")
		}
	}
}
