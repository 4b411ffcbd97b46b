package crosscluster

import (
	"context"
	"encoding/json"
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

func ep(name string, waiting int, kv float64, age time.Duration, cluster string) fwksched.Endpoint {
	m := fwkdl.NewMetrics()
	m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now.Add(-age)
	attrs := fwkdl.NewAttributes()
	if cluster != "" {
		attrs.Put(federation.OriginAttribute, &federation.Origin{Cluster: cluster, Mode: federation.ModeEndpoint})
	}
	return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}}, m, attrs)
}

func names(eps []fwksched.Endpoint) string {
	var out []string
	for _, e := range eps {
		out = append(out, e.GetMetadata().NamespacedName.Name)
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

func TestFilterKeepsTrafficLocalUntilLocalEndpointsSaturate(t *testing.T) {
	fresh, stale := 10*time.Millisecond, time.Minute
	tests := []struct {
		name      string
		endpoints []fwksched.Endpoint
		want      string
	}{
		{"only local endpoints pass through", []fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("l2", 9, 0, fresh, "")}, "l1,l2"},
		{"one local endpoint with headroom keeps all traffic local",
			[]fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("l2", 1, 0, fresh, ""), ep("r1", 0, 0, fresh, "west")}, "l1,l2"},
		{"saturated by queue: remote endpoints with headroom join",
			[]fwksched.Endpoint{ep("l1", 5, 0, fresh, ""), ep("r1", 0, 0, fresh, "west"), ep("r2", 7, 0, fresh, "west")}, "l1,r1"},
		{"saturated by KV cache", []fwksched.Endpoint{ep("l1", 0, 0.9, fresh, ""), ep("r1", 0, 0.1, fresh, "west")}, "l1,r1"},
		{"stale local metrics count as saturated", []fwksched.Endpoint{ep("l1", 0, 0, stale, ""), ep("r1", 0, 0, fresh, "west")}, "l1,r1"},
		{"no remote headroom: stay local", []fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("r1", 9, 0, fresh, "west")}, "l1"},
		{"stale remote data is no headroom", []fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("r1", 0, 0, stale, "west")}, "l1"},
		{"no local endpoints: remote ones with headroom", []fwksched.Endpoint{ep("r1", 9, 0, fresh, "west"), ep("r2", 0, 0, fresh, "east")}, "r2"},
		{"no local endpoints and no headroom: all remote", []fwksched.Endpoint{ep("r1", 9, 0, fresh, "west")}, "r1"},
	}
	p, err := FilterFactory("f", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(*Filter)
	f.now = func() time.Time { return now }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(f.Filter(context.Background(), nil, nil, tc.endpoints)); got != tc.want {
				t.Fatalf("kept %s, want %s", got, tc.want)
			}
		})
	}
}

func TestScorerChargesRemoteEndpointsTheirClusterCost(t *testing.T) {
	p, err := ScorerFactory("s", json.RawMessage(`{"networkCost": 0.4, "clusterCosts": {"east": 0.1}}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	local, west, east := ep("l", 0, 0, 0, ""), ep("w", 0, 0, 0, "west"), ep("e", 0, 0, 0, "east")
	got := p.(*Scorer).Score(context.Background(), nil, nil, []fwksched.Endpoint{local, west, east})
	for e, want := range map[fwksched.Endpoint]float64{local: 1, west: 0.6, east: 0.9} {
		if got[e] != want {
			t.Errorf("%s scored %v, want %v", e.GetMetadata().NamespacedName.Name, got[e], want)
		}
	}
	if got := p.(*Scorer).Score(context.Background(), nil, nil, []fwksched.Endpoint{local, ep("l2", 0, 0, 0, "")}); len(got) != 0 {
		t.Errorf("only local candidates scored %v, want none", got)
	}
}

func TestFactoriesRefuseInvalidParameters(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func() error
	}{
		{"filter: negative queue threshold", func() error {
			_, err := FilterFactory("f", json.RawMessage(`{"queueDepthThreshold": -1}`), nil)
			return err
		}},
		{"filter: KV threshold above 1", func() error {
			_, err := FilterFactory("f", json.RawMessage(`{"kvCacheUtilThreshold": 80}`), nil)
			return err
		}},
		{"filter: duration not a string", func() error {
			_, err := FilterFactory("f", json.RawMessage(`{"metricsStalenessThreshold": 200}`), nil)
			return err
		}},
		{"filter: no local candidates on spill", func() error {
			_, err := FilterFactory("f", json.RawMessage(`{"maxLocalCandidatesOnSpill": 0}`), nil)
			return err
		}},
		{"scorer: cost above 1", func() error {
			_, err := ScorerFactory("s", json.RawMessage(`{"networkCost": 2}`), nil)
			return err
		}},
		{"scorer: NaN-like cluster cost", func() error {
			_, err := ScorerFactory("s", json.RawMessage(`{"clusterCosts": {"west": -0.1}}`), nil)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.make() == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestRemoteCandidatesAreTheLeastLoadedFewAndOnlyOnSpill(t *testing.T) {
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
	p, err := FilterFactory("f", json.RawMessage(`{"maxRemoteCandidates": 3}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(*Filter)
	f.now = func() time.Time { return now }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The peers are visited from a random one; the result must not
			// depend on it.
			for range 20 {
				var got []string
				for _, e := range f.RemoteCandidates(tc.local, tc.remote) {
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

func TestLocalCandidatesOnSpillAreTheLeastLoadedFew(t *testing.T) {
	dl := func(name string, waiting int, kv float64) fwkdl.Endpoint {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now
		return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}}, m)
	}
	noMetrics := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "unscraped"}}, nil)
	p, err := FilterFactory("f", json.RawMessage(`{"maxLocalCandidatesOnSpill": 3}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(*Filter)
	f.now = func() time.Time { return now }
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
				for _, e := range f.LocalCandidates(tc.local) {
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
			for _, e := range f.LocalCandidates(local) {
				kept[e.GetMetadata().NamespacedName.Name] = true
			}
		}
		if len(kept) < 6 {
			t.Fatalf("50 spills kept only %d of 10 equally loaded endpoints", len(kept))
		}
	})
}

func TestRemoteCandidatesCarryTheViewsFreshness(t *testing.T) {
	m := fwkdl.NewMetrics()
	m.UpdateTime = now.Add(-time.Minute) // the scrape, before watermarks vouched for it
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: "r"}}, m)
	ep.GetAttributes().Put(federation.OriginAttribute, &federation.Origin{Cluster: "w"})
	v := federation.NewView(&federation.Origin{Cluster: "w"}, []federation.Entry{{Endpoint: ep, Updated: now.Add(-20 * time.Millisecond)}})
	p, _ := FilterFactory("f", nil, nil)
	f := p.(*Filter)
	f.now = func() time.Time { return now }
	got := f.RemoteCandidates(nil, federation.Remote{Peers: []*federation.View{v}, Stale: now.Add(-2 * time.Second)})
	if len(got) != 1 || !got[0].GetMetrics().UpdateTime.Equal(now.Add(-20*time.Millisecond)) {
		t.Fatalf("got %v", got)
	}
	if federation.OriginOf(got[0].GetAttributes()) == nil || ep.GetMetrics().UpdateTime != m.UpdateTime {
		t.Fatal("the candidate lost its origin or changed the view's endpoint")
	}
}

// BenchmarkRemoteCandidates picks the 16 least loaded of 10 peers × 90
// endpoints, as a spilled pick does.
func BenchmarkRemoteCandidates(b *testing.B) {
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
	p, _ := FilterFactory("f", nil, nil)
	f := p.(*Filter)
	f.now = func() time.Time { return now }
	b.ReportAllocs()
	for b.Loop() {
		if len(f.RemoteCandidates(local, remote)) != 16 {
			b.Fatal("not 16")
		}
	}
}

// BenchmarkFilterLocalOnly is the filter in a scheduling cycle without a
// spill: 100 local candidates.
func BenchmarkFilterLocalOnly(b *testing.B) {
	eps := make([]fwksched.Endpoint, 100)
	for i := range eps {
		eps[i] = ep(fmt.Sprint(i), 0, 0.3, time.Millisecond, "")
	}
	p, _ := FilterFactory("f", nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		p.(*Filter).Filter(context.Background(), nil, nil, eps)
	}
}
