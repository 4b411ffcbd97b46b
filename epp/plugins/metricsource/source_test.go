package metricsource

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
)

// simPage is llm-d-inference-sim v0.10.2's /metrics page after one
// completion: gauges, counters and 11 histograms.
const simPage = "testdata/sim-v0.10.2.txt"

// fullParse is GIE's parse of a whole page.
func fullParse(t testing.TB, page []byte) map[string]*dto.MetricFamily {
	t.Helper()
	families, err := parseText(page)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

func TestParseReadsEveryGaugeAndCounterOfAModelServerPageAsGIEsParserDoes(t *testing.T) {
	page, err := os.ReadFile(simPage)
	if err != nil {
		t.Fatal(err)
	}
	full := fullParse(t, page)
	got, err := Parse(bytes.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	lean := got.(sourcemetrics.PrometheusMetricMap)
	var kept, dropped []string
	for name, mf := range full {
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_SUMMARY:
			dropped = append(dropped, name)
			if _, ok := lean[name]; ok {
				t.Errorf("histogram %s was parsed", name)
			}
		default:
			kept = append(kept, name)
			if !proto.Equal(mf, lean[name]) {
				t.Errorf("%s: parsed as %v, GIE's parser reads %v", name, lean[name], mf)
			}
		}
	}
	for _, want := range []string{"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
		"vllm:lora_requests_info", "vllm:cache_config_info"} {
		if !slices.Contains(kept, want) {
			t.Errorf("the page has no gauge %s: the test reads the wrong page", want)
		}
	}
	if len(lean) != len(kept) || len(dropped) == 0 {
		t.Errorf("parsed %d families, want the page's %d gauges and counters and none of its %d histograms", len(lean), len(kept), len(dropped))
	}
}

func TestWithoutDistributions(t *testing.T) {
	for _, tc := range []struct {
		name, page, want string
	}{{
		name: "a histogram goes with its help line, a gauge after it stays",
		page: "# HELP a_seconds Latency.\n# TYPE a_seconds histogram\na_seconds_bucket{le=\"1\"} 1\na_seconds_bucket{le=\"+Inf\"} 1\na_seconds_sum 0.5\na_seconds_count 1\n" +
			"# HELP queue Waiting.\n# TYPE queue gauge\nqueue 3\n",
		want: "# HELP queue Waiting.\n# TYPE queue gauge\nqueue 3\n",
	}, {
		name: "a summary goes, quantiles, sum and count; its _created and _bucket are families of their own, as the parser reads them",
		page: "# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\ns_created 4\ns_bucket 5\n# TYPE c counter\nc_total 7\n",
		want: "s_created 4\ns_bucket 5\n# TYPE c counter\nc_total 7\n",
	}, {
		name: "a type line in upper case, without a space after #, and a histogram's samples after another family's",
		page: "#TYPE h HISTOGRAM\nh_bucket{le=\"+Inf\"} 1\n# TYPE g gauge\ng 1\nh_count 1\nh_sum 0.5\n",
		want: "# TYPE g gauge\ng 1\n",
	}, {
		name: "a page with quoted names stays whole",
		page: "# TYPE h histogram\nh_count 1\n{\"g.x\"} 1\n",
		want: "# TYPE h histogram\nh_count 1\n{\"g.x\"} 1\n",
	}, {
		name: "a gauge named like a histogram's bucket is another family",
		page: "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_count 1\n# TYPE h_bucket_size gauge\nh_bucket_size 16\n",
		want: "# TYPE h_bucket_size gauge\nh_bucket_size 16\n",
	}, {
		name: "samples without a type line stay, whatever their names",
		page: "x_bucket{le=\"1\"} 1\nx_sum 1\n",
		want: "x_bucket{le=\"1\"} 1\nx_sum 1\n",
	}, {
		name: "a page without distributions stays as it is",
		page: "# HELP u Untyped.\nu 1\n# HELP last Nothing after it.",
		want: "# HELP u Untyped.\nu 1\n# HELP last Nothing after it.",
	}, {
		name: "comments, blank lines, indented lines and a help line without a type line stay",
		page: "# TYPE h histogram\nh_count 1\n# a comment\n\n  # TYPE g gauge\n  g 1\n# HELP last Nothing after it.",
		want: "# a comment\n\n  # TYPE g gauge\n  g 1\n# HELP last Nothing after it.",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(withoutDistributions([]byte(tc.page))); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestParseRejectsWhatGIEsParserRejects(t *testing.T) {
	for name, page := range map[string]string{
		"a sample with no value":       "# TYPE g gauge\ng\n",
		"a label value left open":      "# TYPE g gauge\ng{a=\"1} 1\n",
		"a value that is not a number": "g one\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := parseText([]byte(page)); err == nil {
				t.Fatal("GIE's parser accepts the page: the case tests nothing")
			}
			if _, err := Parse(strings.NewReader(page)); err == nil {
				t.Error("parsed without an error")
			}
		})
	}
}

func TestParseReturnsAnErrorWhereTheTextParserPanics(t *testing.T) {
	page := "#0000000\n{}0"
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the text parser reads the page without a panic: the case tests nothing")
			}
		}()
		parser := expfmt.NewTextParser(model.LegacyValidation)
		_, _ = parser.TextToMetricFamilies(strings.NewReader(page))
	}()
	if _, err := Parse(strings.NewReader(page)); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("Parse: %v, want a malformed-page error", err)
	}
}

func TestParseRefusesAPageLargerThanTheBound(t *testing.T) {
	line := "# TYPE g gauge\n"
	page := line + strings.Repeat("# filler comment\n", MaxPage/17+1)
	if _, err := Parse(strings.NewReader(page)); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a %d-byte page: %v, want an error naming the bound", len(page), err)
	}
}

func TestFactoryScrapesThePathItsParametersName(t *testing.T) {
	page, err := os.ReadFile(simPage)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/custom/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(page)
	}))
	defer srv.Close()
	src := newTestSource(t, `{"path":"/custom/metrics"}`)
	if got := src.TypedName(); got.Type != sourcemetrics.MetricsDataSourceType || got.Name != "scrape" {
		t.Errorf("typed name %+v, want GIE's type named scrape", got)
	}
	got, err := src.Poll(context.Background(), endpointAt(srv))
	if err != nil {
		t.Fatal(err)
	}
	families := got.(sourcemetrics.PrometheusMetricMap)
	if v := families["vllm:num_requests_waiting"].GetMetric()[0].GetGauge().GetValue(); v != 0 {
		t.Errorf("waiting requests %v, want the page's 0", v)
	}
	if _, err := Factory("bad", json.RawMessage(`{"scheme":"ftp"}`), nil); err == nil {
		t.Error("scheme ftp accepted")
	}
}

// A Prometheus client library compresses the page when the scrape accepts
// gzip, as Go's HTTP client does by default; the picker's scrape does not
// ask, and a server that compresses anyway is an error that says so.
func TestScrapeAsksForThePageUncompressed(t *testing.T) {
	page, err := os.ReadFile(simPage)
	if err != nil {
		t.Fatal(err)
	}
	var compressAnyway, askedForGzip atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			askedForGzip.Store(true)
		}
		if !compressAnyway.Load() && !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			_, _ = w.Write(page)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		gz := gzip.NewWriter(w)
		_, _ = gz.Write(page)
		_ = gz.Close()
	}))
	defer srv.Close()
	src := newTestSource(t, `{}`)
	got, err := src.Poll(context.Background(), endpointAt(srv))
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	if askedForGzip.Load() {
		t.Error("the scrape accepted gzip")
	}
	if _, ok := got.(sourcemetrics.PrometheusMetricMap)["vllm:num_requests_running"]; !ok {
		t.Error("the page's running requests are missing")
	}
	compressAnyway.Store(true)
	if _, err := src.Poll(context.Background(), endpointAt(srv)); err == nil || !strings.Contains(err.Error(), `Content-Encoding "gzip"`) {
		t.Errorf("a page compressed unasked: %v, want an error naming its encoding", err)
	}
}

func TestScrapeOfAnErrorPageIsAnErrorWithItsStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "metrics are off", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	_, err := newTestSource(t, `{}`).Poll(context.Background(), endpointAt(srv))
	if err == nil || !strings.Contains(err.Error(), "status 503") {
		t.Errorf("scrape of a 503: %v, want an error with the status", err)
	}
}

func newTestSource(t testing.TB, params string) fwkdl.PollingDataSource {
	t.Helper()
	plugin, err := Factory("scrape", json.RawMessage(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	return plugin.(fwkdl.PollingDataSource)
}

func endpointAt(srv *httptest.Server) fwkdl.Endpoint {
	return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{MetricsHost: strings.TrimPrefix(srv.URL, "http://")}, nil)
}

// FuzzParse: on any page GIE's parser reads, Parse returns what it returns
// but its distributions.
func FuzzParse(f *testing.F) {
	sim, err := os.ReadFile(simPage)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sim)
	f.Add([]byte("# HELP s x\n# TYPE s summary\ns{quantile=\"0.5\"} 1\ns_sum 2\ns_count 3\n# TYPE c counter\nc_total 7\n"))
	f.Add([]byte("#TYPE h HISTOGRAM\nh_bucket{le=\"+Inf\"} 1\n# TYPE g gauge\ng 1\nh_count 1\n"))
	f.Fuzz(func(t *testing.T, page []byte) {
		got, err := Parse(bytes.NewReader(page))
		full, fullErr := parseText(page)
		if fullErr != nil {
			return
		}
		if err != nil {
			t.Fatalf("GIE's parser reads the page, Parse fails: %v", err)
		}
		lean := got.(sourcemetrics.PrometheusMetricMap)
		for name, mf := range full {
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM, dto.MetricType_SUMMARY:
				if lean[name] != nil {
					t.Errorf("distribution %s parsed", name)
				}
			default:
				if !proto.Equal(mf, lean[name]) {
					t.Errorf("%s: parsed as %v, GIE's parser reads %v", name, lean[name], mf)
				}
			}
		}
		for name := range lean {
			if full[name] == nil {
				t.Errorf("%s parsed, GIE's parser has no such family", name)
			}
		}
	})
}

// BenchmarkParse compares a scrape's parse with GIE's (every family) on a
// model server's page, and on the same page without its distributions,
// where there is nothing to leave out.
func BenchmarkParse(b *testing.B) {
	sim, err := os.ReadFile(simPage)
	if err != nil {
		b.Fatal(err)
	}
	for name, page := range map[string][]byte{"simulator": sim, "gauges-and-counters": withoutDistributions(sim)} {
		b.Run(name+"/gie", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				fullParse(b, page)
			}
		})
		b.Run(name+"/fleetinfer", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(bytes.NewReader(page)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScrape is a scrape of the simulator's page served by Prometheus'
// Go client library (the simulator's), client and server in this process:
// as GIE's source scrapes (accepting gzip, which the library then
// compresses) and as this one does.
func BenchmarkScrape(b *testing.B) {
	sim, err := os.ReadFile(simPage)
	if err != nil {
		b.Fatal(err)
	}
	families, err := parseText(sim)
	if err != nil {
		b.Fatal(err)
	}
	page := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		return slices.Collect(maps.Values(families)), nil
	})
	srv := httptest.NewServer(promhttp.HandlerFor(page, promhttp.HandlerOpts{}))
	defer srv.Close()
	ep := endpointAt(srv)
	for _, c := range []struct {
		name string
		src  fwkdl.PollingDataSource
	}{
		{"gzip", &source{scheme: "http", path: "/metrics", client: &http.Client{Transport: &http.Transport{}}}},
		{"uncompressed", newTestSource(b, `{}`)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.src.Poll(context.Background(), ep); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
