// Package monitoring holds fleetinfer's Grafana dashboard and example
// Prometheus alerts, and reads back which metrics they use, so that tests
// can hold them to the metrics fleetinfer's binaries register.
package monitoring

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

var (
	//go:embed grafana-dashboard.json
	Dashboard []byte
	//go:embed prometheus-rules.yaml
	Rules []byte
)

// Query is one PromQL expression and where it is used.
type Query struct {
	Where string
	Expr  string
}

// Queries returns every PromQL expression of the dashboard (panel targets
// and variable queries) and of the alert rules.
func Queries() ([]Query, error) {
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(Dashboard, &dash); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []Query
	for _, p := range dash.Panels {
		for _, t := range p.Targets {
			out = append(out, Query{Where: "dashboard panel " + p.Title, Expr: t.Expr})
		}
	}
	for _, v := range dash.Templating.List {
		if m := labelValues.FindStringSubmatch(v.Definition); m != nil {
			out = append(out, Query{Where: "dashboard variable " + v.Name, Expr: m[1]})
		}
	}

	rules, err := AlertRules()
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		out = append(out, Query{Where: "alert " + r.Alert, Expr: r.Expr})
	}
	return out, nil
}

// Rule is one alerting rule of the PrometheusRule.
type Rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// AlertRules parses the PrometheusRule strictly (a misspelt field fails)
// and returns its rules.
func AlertRules() ([]Rule, error) {
	var file struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []Rule `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(Rules, &file); err != nil {
		return nil, fmt.Errorf("alert rules: %w", err)
	}
	if file.APIVersion != "monitoring.coreos.com/v1" || file.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("alert rules are a %s %s, not a monitoring.coreos.com/v1 PrometheusRule", file.APIVersion, file.Kind)
	}
	var out []Rule
	for _, g := range file.Spec.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// labelValues matches Grafana's label_values(metric, label) variable query.
var labelValues = regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

// grafanaVars are the dashboard's template variables with values that make
// its expressions plain PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$namespace", ".*")

// Metrics parses each query and returns the metric names it selects,
// mapped to where they are used. Histogram series (_bucket, _sum, _count)
// are named as queried.
func Metrics() (map[string][]string, error) {
	qs, err := Queries()
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, q := range qs {
		expr, err := parser.ParseExpr(grafanaVars.Replace(q.Expr))
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", q.Where, q.Expr, err)
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
				out[vs.Name] = append(out[vs.Name], q.Where)
			}
			return nil
		})
	}
	return out, nil
}
