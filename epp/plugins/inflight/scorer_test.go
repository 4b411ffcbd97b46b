package inflight

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	attrconcurrency "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/attribute/concurrency"
)

func candidate(name string, requests int64, tracked bool) fwksched.Endpoint {
	attrs := fwkdl.NewAttributes()
	if tracked {
		attrs.Put(attrconcurrency.InFlightLoadKey, &attrconcurrency.InFlightLoad{Requests: requests})
	}
	return fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Name: name}}, fwkdl.NewMetrics(), attrs)
}

func TestScorerPrefersEndpointsWithFewerOfItsRequestsInFlight(t *testing.T) {
	tests := []struct {
		name   string
		counts []int64 // -1: no attribute (no producer configured)
		want   []float64
	}{
		{"fewest score 1, most 0, the rest in between", []int64{0, 2, 4}, []float64{1, 0.5, 0}},
		{"relative to the candidates, not to zero", []int64{3, 5}, []float64{1, 0}},
		{"an endpoint without the attribute has none in flight", []int64{-1, 2}, []float64{1, 0}},
		{"all alike: no scores", []int64{2, 2}, nil},
		{"no producer: no scores", []int64{-1, -1}, nil},
	}
	s := &Scorer{name: "s"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			eps := make([]fwksched.Endpoint, len(tc.counts))
			for i, n := range tc.counts {
				eps[i] = candidate(string(rune('a'+i)), n, n >= 0)
			}
			got := s.Score(context.Background(), nil, nil, eps)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("scores %v, want none", got)
				}
				return
			}
			for i, ep := range eps {
				if got[ep] != tc.want[i] {
					t.Errorf("endpoint %d scored %v, want %v", i, got[ep], tc.want[i])
				}
			}
		})
	}
}
