package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetinfer/fleetinfer/epp"
	"github.com/fleetinfer/fleetinfer/hack/refdocs/registrations"
	_ "github.com/fleetinfer/fleetinfer/hub" // registers the hub's metrics
	_ "github.com/fleetinfer/fleetinfer/spoke"
)

type metricDoc struct {
	component, name, typ, help string
	labels                     []string
}

// ownPrefix marks fleetinfer's metrics among the registry's: the others are
// controller-runtime's and client-go's standard ones.
const ownPrefix = "fleetinfer_"

// metricDocs describes fleetinfer's metrics: the hub's and spoke's as their
// packages registered them with controller-runtime's registry, the
// picker's from its list (it registers them next to GIE's when it runs).
func metricDocs() ([]metricDoc, error) {
	var docs []metricDoc
	for _, c := range registrations.Collectors() {
		ds, err := describe(c)
		if err != nil {
			return nil, err
		}
		docs = append(docs, ds...)
	}
	for _, c := range epp.MetricCollectors() {
		ds, err := describe(c)
		if err != nil {
			return nil, err
		}
		docs = append(docs, ds...)
	}
	own := docs[:0]
	for _, d := range docs {
		if strings.HasPrefix(d.name, ownPrefix) {
			d.component = strings.SplitN(strings.TrimPrefix(d.name, ownPrefix), "_", 2)[0]
			own = append(own, d)
		}
	}
	sort.Slice(own, func(i, j int) bool { return own[i].name < own[j].name })
	return own, nil
}

// describe reads c's descriptors. A Desc exposes its name, help and labels
// only through String, whose quoted fields are read back with strconv.
func describe(c prometheus.Collector) ([]metricDoc, error) {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	var docs []metricDoc
	for d := range ch {
		doc, err := parseDesc(d.String())
		if err != nil {
			return nil, err
		}
		doc.typ = metricType(c)
		docs = append(docs, doc)
	}
	return docs, nil
}

// parseDesc reads `Desc{fqName: "n", help: "h", constLabels: {...},
// variableLabels: {a,b}}`.
func parseDesc(s string) (metricDoc, error) {
	var d metricDoc
	rest, ok := strings.CutPrefix(s, `Desc{fqName: `)
	name, err := strconv.QuotedPrefix(rest)
	if !ok || err != nil {
		return d, fmt.Errorf("unexpected descriptor %s", s)
	}
	rest, ok = strings.CutPrefix(rest[len(name):], `, help: `)
	help, err := strconv.QuotedPrefix(rest)
	if !ok || err != nil {
		return d, fmt.Errorf("unexpected descriptor %s", s)
	}
	_, labels, ok := strings.Cut(rest[len(help):], "variableLabels: {")
	if !ok {
		return d, fmt.Errorf("unexpected descriptor %s", s)
	}
	d.name, _ = strconv.Unquote(name)
	d.help, _ = strconv.Unquote(help)
	if labels = strings.TrimSuffix(labels, "}}"); labels != "" {
		for _, l := range strings.Split(labels, ",") {
			// A label with a constraint is written c(name).
			d.labels = append(d.labels, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
		}
	}
	return d, nil
}

// metricType names c's Prometheus type; a Desc does not carry it. Gauge is
// tested before Counter, whose methods a Gauge has too; a Summary has a
// Histogram's methods, so one would need a case of its own (there is none).
func metricType(c prometheus.Collector) string {
	switch c.(type) {
	case *prometheus.GaugeVec, prometheus.Gauge:
		return "gauge"
	case *prometheus.CounterVec, prometheus.Counter:
		return "counter"
	case *prometheus.HistogramVec, prometheus.Histogram:
		return "histogram"
	}
	return "untyped"
}

func metricsPage() (string, error) {
	docs, err := metricDocs()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(header + "# Metrics\n\nThe Prometheus metrics fleetinfer itself defines, by component. " +
		"Each component also serves controller-runtime's standard metrics; the endpoint picker serves GIE v1.5.0's too.\n\n")
	for _, comp := range []string{"hub", "spoke", "epp"} {
		var rows [][]string
		for _, d := range docs {
			if d.component == comp {
				rows = append(rows, []string{code(d.name), d.typ, code(strings.Join(d.labels, ", ")), text(d.help)})
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n", comp)
		table(&b, []string{"Metric", "Type", "Labels", "Description"}, rows)
	}
	return b.String(), nil
}
