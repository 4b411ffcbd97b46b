package epp

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"

	"github.com/fleetinfer/fleetinfer/epp/internal/gierunner"
	"github.com/fleetinfer/fleetinfer/epp/plugins/crosscluster"
	"github.com/fleetinfer/fleetinfer/epp/plugins/inflight"
)

// fleetinfer's plugin types come next to GIE's (whose list gierunner's test
// checks against GIE's own registration), and take none of their names but
// metrics-data-source, whose factory becomes fleetinfer's: the source it
// builds leaves a page's histograms unparsed.
func TestRegisterPluginsAddsFleetinfersNextToGIEs(t *testing.T) {
	saved := maps.Clone(fwkplugin.Registry)
	t.Cleanup(func() { fwkplugin.Registry = saved })

	fwkplugin.Registry = map[string]fwkplugin.FactoryFunc{}
	gierunner.RegisterInTreePlugins()
	gie := slices.Sorted(maps.Keys(fwkplugin.Registry))
	registerPlugins(&spillPolicy{})
	want := slices.Sorted(slices.Values(append(gie, crosscluster.FilterType, crosscluster.ScorerType, inflight.ScorerType)))
	if got := slices.Sorted(maps.Keys(fwkplugin.Registry)); !slices.Equal(got, want) {
		t.Fatalf("registered %v\nwant GIE's %v plus fleetinfer's", got, gie)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# TYPE ttft_seconds histogram\nttft_seconds_bucket{le=\"+Inf\"} 1\nttft_seconds_sum 0.1\nttft_seconds_count 1\n" +
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n"))
	}))
	defer srv.Close()
	plugin, err := fwkplugin.Registry[sourcemetrics.MetricsDataSourceType]("metrics", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	source := plugin.(fwkdl.PollingDataSource)
	got, err := source.Poll(context.Background(), fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{MetricsHost: strings.TrimPrefix(srv.URL, "http://")}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if families := got.(sourcemetrics.PrometheusMetricMap); len(families) != 1 || families["vllm:num_requests_waiting"] == nil {
		t.Errorf("the registered %s parsed %v, want the gauge alone", sourcemetrics.MetricsDataSourceType, slices.Collect(maps.Keys(families)))
	}
}
