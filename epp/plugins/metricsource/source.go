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
// A sample goes with the family the text format's parser would give it,
// so a sample without a family of its own whose name ends _count or _sum
// of a declared summary or histogram (or _bucket of a histogram) is left
// out with it; families without a # TYPE line, untyped, are kept.
//
// The scrape asks for the page uncompressed. GIE's source uses Go's
// default of asking for gzip, and Prometheus' client libraries (the
// simulator's Go one, vLLM's Python one) then compress every page: about
// 18 KB to 1.6 KB, on every scrape of every pod. On a pod network those
// bytes are cheap, and the compression is the model server's CPU, 20 times
// a second for each picker: a scrape of the simulator's page costs about a
// third less uncompressed (BenchmarkScrape).
package metricsource

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/pflag"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
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
	if p.Scheme != "http" && p.Scheme != "https" {
		return nil, fmt.Errorf("%s parameters: scheme %q: want http or https", sourcemetrics.MetricsDataSourceType, p.Scheme)
	}
	return newSource(name, p), nil
}

// Scrape limits, GIE's HTTP data source's: two idle connections a pod,
// closed after 10 s unused (a pod that went away), and 10 s for a scrape.
const (
	idleConnsPerPod = 2
	idleConnTimeout = 10 * time.Second
	scrapeTimeout   = 10 * time.Second
)

// source scrapes each pod's metrics page for GIE's data layer, as GIE's
// HTTP data source does but with a client of its own: it asks for the page
// uncompressed, and a source's TLS setting stays its own (GIE's sets it on
// a client all its sources share).
type source struct {
	name         fwkplugin.TypedName
	scheme, path string
	client       *http.Client
}

func newSource(name string, p params) *source {
	tr := &http.Transport{
		MaxIdleConnsPerHost: idleConnsPerPod,
		IdleConnTimeout:     idleConnTimeout,
		DisableCompression:  true,
	}
	if p.Scheme == "https" {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: p.InsecureSkipVerify} //nolint:gosec // the user's setting, GIE's default
	}
	return &source{
		name:   fwkplugin.TypedName{Type: sourcemetrics.MetricsDataSourceType, Name: name},
		scheme: p.Scheme, path: p.Path,
		client: &http.Client{Transport: tr, Timeout: scrapeTimeout},
	}
}

func (s *source) TypedName() fwkplugin.TypedName { return s.name }

// OutputType is what Parse returns, what GIE's metrics extractors read.
func (s *source) OutputType() reflect.Type { return sourcemetrics.PrometheusMetricType }

func (s *source) ExtractorType() reflect.Type { return fwkdl.ExtractorType }

// Poll scrapes ep's page.
func (s *source) Poll(ctx context.Context, ep fwkdl.Endpoint) (any, error) {
	md := ep.GetMetadata()
	target := url.URL{Scheme: s.scheme, Host: md.GetMetricsHost(), Path: s.path}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", md.GetNamespacedName(), err)
	}
	defer func() {
		// What is left of an error page, within reason, so that the
		// connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: status %d", md.GetNamespacedName(), resp.StatusCode)
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		return nil, fmt.Errorf("scraping %s: the page came with Content-Encoding %q, unasked", md.GetNamespacedName(), enc)
	}
	return Parse(resp.Body)
}

var _ fwkdl.PollingDataSource = (*source)(nil)

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
	return parseText(withoutDistributions(buf.Bytes()))
}

// parseText parses a text page. The text format's parser (prometheus/common
// v0.67.5) panics on some malformed pages, "{}0" among them; a model
// server's page is input, so that is an error here.
func parseText(page []byte) (families map[string]*dto.MetricFamily, err error) {
	defer func() {
		if r := recover(); r != nil {
			families, err = nil, fmt.Errorf("malformed metrics page: the text parser failed: %v", r)
		}
	}()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	return parser.TextToMetricFamilies(bytes.NewReader(page))
}

// pages are the buffers scrapes read pages into, each scrape of each pod
// 20 times a second: kept while at most pooledPage.
var pages = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const pooledPage = 1 << 20

// withoutDistributions returns page's lines but those of its histogram,
// gauge-histogram and summary families; page itself when it declares none.
// A page with quoted (UTF-8) names is left whole.
func withoutDistributions(page []byte) []byte {
	distributions := declaredDistributions(page)
	if len(distributions) == 0 {
		return page
	}
	out := make([]byte, 0, len(page)/4)
	f := filter{distributions: distributions, kinds: map[string]kind{}}
	for raw := range bytes.Lines(page) {
		if !f.drops(lineOf(raw)) {
			out = append(out, raw...)
		}
	}
	return out
}

// filter follows a page's families line by line, as the text format's
// parser does, to tell which lines belong to a distribution.
type filter struct {
	// distributions are the families the page declares summaries or
	// histograms, wherever their # TYPE line is.
	distributions map[string]bool
	// kinds are the families seen so far.
	kinds map[string]kind
}

// drops reports whether l belongs to a distribution, and notes the family
// l opens.
func (f *filter) drops(l pageLine) bool {
	switch {
	case string(l.keyword) == "HELP":
		if _, ok := f.kinds[string(l.family)]; !ok {
			f.kinds[string(l.family)] = other
		}
		return f.distributions[string(l.family)]
	case string(l.keyword) == "TYPE":
		k := kindOf(l.typ)
		f.kinds[string(l.family)] = k
		return k != other
	case len(l.sample) > 0:
		return f.goesWithDistribution(l.sample)
	}
	return false
}

// goesWithDistribution reports whether a sample named name belongs to a
// distribution: the family of its own name when one exists, else the
// summary or histogram its name ends a _count, _sum (or, for a histogram,
// _bucket) of. A sample with neither opens an untyped family of its name.
func (f *filter) goesWithDistribution(name []byte) bool {
	if k, ok := f.kinds[string(name)]; ok {
		return k != other
	}
	switch f.kinds[string(familyOf(name))] {
	case histogram:
		return true
	case summary:
		return !bytes.HasSuffix(name, []byte("_bucket"))
	}
	f.kinds[string(name)] = other
	return false
}

// kind is what the filter needs of a family's type.
type kind uint8

const (
	other kind = iota
	summary
	histogram // or gauge histogram
)

// kindOf reads a # TYPE line's type as the text format's parser does, in
// any case.
func kindOf(typ []byte) kind {
	switch {
	case bytes.EqualFold(typ, []byte("summary")):
		return summary
	case bytes.EqualFold(typ, []byte("histogram")), bytes.EqualFold(typ, []byte("gauge_histogram")):
		return histogram
	}
	return other
}

// declaredDistributions are the families page's # TYPE lines declare
// distributions; none when a line names a family in quotes.
func declaredDistributions(page []byte) map[string]bool {
	var out map[string]bool
	for raw := range bytes.Lines(page) {
		l := lineOf(raw)
		if l.quoted {
			return nil
		}
		if string(l.keyword) == "TYPE" && kindOf(l.typ) != other {
			if out == nil {
				out = map[string]bool{}
			}
			out[string(l.family)] = true
		}
	}
	return out
}

// pageLine is what the filter reads of a line of a page.
type pageLine struct {
	// keyword, family and typ are a comment's first three words after its
	// #, as the text format's parser reads them: "HELP" or "TYPE", the
	// family's name and (for TYPE) its type.
	keyword, family, typ []byte
	// sample is a sample line's metric name.
	sample []byte
	// quoted is a line naming its family or metric in quotes.
	quoted bool
}

func lineOf(raw []byte) pageLine {
	line := bytes.TrimLeft(bytes.TrimSuffix(raw, []byte{'\n'}), " \t")
	comment, ok := bytes.CutPrefix(line, []byte("#"))
	if !ok {
		return pageLine{sample: sampleName(line), quoted: bytes.HasPrefix(line, []byte("{"))}
	}
	var l pageLine
	words := func() []byte {
		comment = bytes.TrimLeft(comment, " \t")
		i := bytes.IndexAny(comment, " \t")
		if i < 0 {
			i = len(comment)
		}
		w := comment[:i]
		comment = comment[i:]
		return w
	}
	l.keyword, l.family, l.typ = words(), words(), words()
	if string(l.keyword) != "HELP" && string(l.keyword) != "TYPE" {
		return pageLine{}
	}
	l.quoted = bytes.HasPrefix(l.family, []byte(`"`))
	return l
}

// sampleName is the metric name a sample line starts with.
func sampleName(line []byte) []byte {
	if i := bytes.IndexAny(line, "{ \t"); i >= 0 {
		return line[:i]
	}
	return line
}

// familyOf is the summary or histogram a sample named name would belong
// to by its suffix: name less _count, _sum or _bucket; name without one.
func familyOf(name []byte) []byte {
	for _, suffix := range []string{"_count", "_sum", "_bucket"} {
		if base, ok := bytes.CutSuffix(name, []byte(suffix)); ok {
			return base
		}
	}
	return name
}
