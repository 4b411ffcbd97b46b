// Package metricsource is fleetinfer's metrics-data-source: the plugin of
// GIE's type and parameters that scrapes each model server's Prometheus
// page, registered in its place, with a parser that leaves the page's
// histogram and summary families out before parsing the rest.
//
// The picker scrapes every local pod about 20 times a second, and most of
// a model server's page is histograms (of llm-d-inference-sim v0.10.2's 269
// lines, 11 histogram families take about 220) that no extractor in the
// EPP reads: GIE's core-metrics-extractor reads gauges (queue, running
// requests, KV-cache use, LoRA and cache-config info) and counters. A
// profile of a picker in the routing benchmark's hot-cluster runs had
// parsing the whole page, and collecting what it allocated, at about 40% of
// the picker's CPU; parsing only the families the extractor can read
// makes a scrape's parse several times cheaper (BenchmarkParse).
//
// Families without a # TYPE line, which the text format reads as untyped,
// are kept whatever their samples' names.
package metricsource

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	sourcehttp "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/http"
	sourcemetrics "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/datalayer/source/metrics"
)

// MaxPage bounds a model server's metrics page: a larger one is an error,
// not memory the picker gives a misbehaving server.
const MaxPage = 8 << 20

// params are GIE's metrics-data-source parameters.
type params struct {
	Scheme             string `json:"scheme"`
	Path               string `json:"path"`
	InsecureSkipVerify bool   `json:"insecureSkipVerify"`
}

// Factory builds the data source from GIE's parameters, with GIE's
// defaults: http, /metrics, certificates not verified. GIE's deprecated
// --model-server-metrics-* flags, where set, change the defaults as they do
// for GIE's own plugin.
func Factory(name string, raw json.RawMessage, _ fwkplugin.Handle) (fwkplugin.Plugin, error) {
	p := params{Scheme: "http", Path: "/metrics", InsecureSkipVerify: true}
	if v, ok := flagValue("model-server-metrics-scheme"); ok {
		p.Scheme = v
	}
	if v, ok := flagValue("model-server-metrics-path"); ok {
		p.Path = v
	}
	if v, ok := flagValue("model-server-metrics-https-insecure-skip-verify"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("--model-server-metrics-https-insecure-skip-verify: %w", err)
		}
		p.InsecureSkipVerify = b
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s parameters: %w", sourcemetrics.MetricsDataSourceType, err)
		}
	}
	return sourcehttp.NewHTTPDataSource(p.Scheme, p.Path, p.InsecureSkipVerify, sourcemetrics.MetricsDataSourceType, name,
		Parse, sourcemetrics.PrometheusMetricType)
}

// flagValue is the value of a command-line flag the user set.
func flagValue(name string) (string, bool) {
	f := pflag.Lookup(name)
	if f == nil || !f.Changed {
		return "", false
	}
	return f.Value.String(), true
}

// Parse reads a Prometheus text page into its gauge, counter and untyped
// families, as GIE's parser would read them (a sourcemetrics.PrometheusMetricMap).
func Parse(r io.Reader) (any, error) {
	buf := pages.Get().(*bytes.Buffer)
	defer func() {
		// A page that came near the bound is not worth keeping around.
		if buf.Cap() <= pooledPage {
			buf.Reset()
			pages.Put(buf)
		}
	}()
	if _, err := buf.ReadFrom(io.LimitReader(r, MaxPage+1)); err != nil {
		return nil, err
	}
	if buf.Len() > MaxPage {
		return nil, fmt.Errorf("metrics page larger than %d bytes", MaxPage)
	}
	// The parser copies what it keeps: the page's buffer can be reused.
	parser := expfmt.NewTextParser(model.LegacyValidation)
	return parser.TextToMetricFamilies(bytes.NewReader(withoutDistributions(buf.Bytes())))
}

// pages are the buffers scrapes read pages into, each scrape of each pod
// 20 times a second: kept while at most pooledPage.
var pages = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const pooledPage = 1 << 20

// withoutDistributions returns page's lines but those of its histogram,
// gauge-histogram and summary families. The text format groups a family's
// lines: its # HELP and # TYPE lines, then its samples, named after it
// (with _bucket, _sum, _count or _created for a distribution).
func withoutDistributions(page []byte) []byte {
	// A page with no distribution is parsed as it is.
	if !bytes.Contains(page, []byte("histogram")) && !bytes.Contains(page, []byte("summary")) {
		return page
	}
	out := make([]byte, 0, len(page)/4)
	var (
		dropping []byte // the family whose samples are being left out
		help     []byte // a # HELP line held until the line after it shows its family's type
	)
	keep := func(line []byte) {
		out = append(out, help...)
		help = nil
		out = append(out, line...)
		out = append(out, '\n')
	}
	for len(page) > 0 {
		var line []byte
		line, page, _ = bytes.Cut(page, []byte{'\n'})
		trimmed := bytes.TrimLeft(line, " \t")
		switch {
		case bytes.HasPrefix(trimmed, []byte("#")):
			f := bytes.Fields(trimmed)
			switch {
			case len(f) >= 3 && string(f[0]) == "#" && string(f[1]) == "HELP":
				dropping = nil
				out = append(out, help...)
				help = append(append([]byte(nil), line...), '\n')
			case len(f) >= 4 && string(f[0]) == "#" && string(f[1]) == "TYPE" && distribution(f[3]):
				dropping, help = f[2], nil
			default:
				dropping = nil
				keep(line)
			}
		case dropping != nil && partOf(sampleName(trimmed), dropping):
		default:
			dropping = nil
			keep(line)
		}
	}
	return append(out, help...)
}

func distribution(typ []byte) bool {
	switch string(typ) {
	case "histogram", "gaugehistogram", "summary":
		return true
	}
	return false
}

// sampleName is the metric name a sample line starts with.
func sampleName(line []byte) []byte {
	if i := bytes.IndexAny(line, "{ \t"); i >= 0 {
		return line[:i]
	}
	return line
}

// partOf reports whether a sample named name belongs to the distribution
// family named family.
func partOf(name, family []byte) bool {
	suffix, ok := bytes.CutPrefix(name, family)
	if !ok {
		return false
	}
	switch string(suffix) {
	case "", "_bucket", "_sum", "_count", "_created", "_gsum", "_gcount":
		return true
	}
	return false
}
