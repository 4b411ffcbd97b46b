package crosscluster

import (
	"context"
	"encoding/json"
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
	dl := func(name string, waiting int, kv float64, age time.Duration, cluster string) fwkdl.Endpoint {
		m := fwkdl.NewMetrics()
		m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now.Add(-age)
		return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}}, m)
	}
	fresh := 10 * time.Millisecond
	remote := []fwkdl.Endpoint{dl("r-busy", 9, 0, fresh, "w"), dl("r-q2", 2, 0.1, fresh, "w"), dl("r-q0-kv5", 0, 0.5, fresh, "w"),
		dl("r-q0-kv1", 0, 0.1, fresh, "w"), dl("r-q1", 1, 0, fresh, "w")}
	tests := []struct {
		name  string
		local []fwkdl.Endpoint
		want  string
	}{
		{"none while local has headroom", []fwkdl.Endpoint{dl("l", 0, 0, fresh, "")}, ""},
		{"least loaded with headroom on spill, bounded", []fwkdl.Endpoint{dl("l", 7, 0, fresh, "")}, "r-q0-kv1,r-q0-kv5,r-q1"},
		{"without local endpoints, least loaded", nil, "r-q0-kv1,r-q0-kv5,r-q1"},
	}
	p, err := FilterFactory("f", json.RawMessage(`{"maxRemoteCandidates": 3}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(*Filter)
	f.now = func() time.Time { return now }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range f.RemoteCandidates(tc.local, remote) {
				got = append(got, e.GetMetadata().NamespacedName.Name)
			}
			if strings.Join(got, ",") != tc.want {
				t.Fatalf("admitted %v, want %s", got, tc.want)
			}
		})
	}
}
