package crosscluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

var now = time.Now()

func ep(name string, waiting int, kv float64, age time.Duration, cluster string) fwksched.Endpoint {
	m := fwkdl.NewMetrics()
	m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, kv, now.Add(-age)
	attrs := fwkdl.NewAttributes()
	if cluster != "" {
		attrs.Put(federation.OriginAttribute, &federation.Origin{Cluster: cluster, Mode: fleetv1alpha1.FederationEndpoint})
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

// The candidate lookup decides the spill with the filter's policy; the
// filter trims what it is given to that decision's shape.
func TestFilterTrimsTheSpillToRemoteEndpointsWithHeadroom(t *testing.T) {
	fresh, stale := 10*time.Millisecond, time.Minute
	tests := []struct {
		name      string
		endpoints []fwksched.Endpoint
		want      string
	}{
		{"no spill: local endpoints pass through", []fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("l2", 1, 0, fresh, "")}, "l1,l2"},
		{"spill: remote endpoints without headroom are dropped",
			[]fwksched.Endpoint{ep("l1", 5, 0, fresh, ""), ep("r1", 0, 0, fresh, "west"), ep("r2", 7, 0, fresh, "west")}, "l1,r1"},
		{"remote data is judged by the remote staleness threshold",
			[]fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("r1", 0, 0.1, 500*time.Millisecond, "west")}, "l1,r1"},
		{"no remote headroom left: stay local", []fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("r1", 9, 0, fresh, "west")}, "l1"},
		{"stale remote data is no headroom", []fwksched.Endpoint{ep("l1", 9, 0, fresh, ""), ep("r1", 0, 0, stale, "west")}, "l1"},
		{"no local endpoints: remote ones with headroom", []fwksched.Endpoint{ep("r1", 9, 0, fresh, "west"), ep("r2", 0, 0, fresh, "east")}, "r2"},
		{"no local endpoints and no headroom: all remote", []fwksched.Endpoint{ep("r1", 9, 0, fresh, "west")}, "r1"},
	}
	policy, err := spill.New(spill.DefaultParams, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	f := &Filter{name: "f", policy: policy}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(f.Filter(context.Background(), nil, nil, tc.endpoints)); got != tc.want {
				t.Fatalf("kept %s, want %s", got, tc.want)
			}
		})
	}
}

func TestFilterFactoryHandsOverThePolicyTheFilterApplies(t *testing.T) {
	var built []*spill.Policy
	p, err := NewFilterFactory(func(p *spill.Policy) { built = append(built, p) })("f", json.RawMessage(`{"maxRemoteCandidates": 3}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(built) != 1 || built[0] != p.(*Filter).policy {
		t.Fatalf("built %v, the filter applies %p", built, p.(*Filter).policy)
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
			_, err := NewFilterFactory(nil)("f", json.RawMessage(`{"queueDepthThreshold": -1}`), nil)
			return err
		}},
		{"filter: KV threshold above 1", func() error {
			_, err := NewFilterFactory(nil)("f", json.RawMessage(`{"kvCacheUtilThreshold": 80}`), nil)
			return err
		}},
		{"filter: duration not a string", func() error {
			_, err := NewFilterFactory(nil)("f", json.RawMessage(`{"metricsStalenessThreshold": 200}`), nil)
			return err
		}},
		{"filter: negative margin", func() error {
			_, err := NewFilterFactory(nil)("f", json.RawMessage(`{"crossMargin": "-1ms"}`), nil)
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

// BenchmarkFilterLocalOnly is the filter in a scheduling cycle without a
// spill: 100 local candidates.
func BenchmarkFilterLocalOnly(b *testing.B) {
	eps := make([]fwksched.Endpoint, 100)
	for i := range eps {
		eps[i] = ep(fmt.Sprint(i), 0, 0.3, time.Millisecond, "")
	}
	p, _ := NewFilterFactory(nil)("f", nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		p.(*Filter).Filter(context.Background(), nil, nil, eps)
	}
}
