package monitoring_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetinfer/fleetinfer/deploy/monitoring"
)

// Where metrics are registered: fleetinfer's own packages (fleetinfer_hub_*,
// fleetinfer_epp_*), GIE's EPP (inference_*) and controller-runtime
// (reconcile, work queue). Dependencies are read at the versions go.mod pins.
var metricSources = []struct{ module, dir string }{
	{"", "epp"}, {"", "hub"}, {"", "spoke"}, {"", "internal"},
	{"sigs.k8s.io/gateway-api-inference-extension", "pkg/epp/metrics"},
	{"sigs.k8s.io/controller-runtime", "pkg/internal/controller/metrics"},
	{"sigs.k8s.io/controller-runtime", "pkg/internal/metrics"},
	{"sigs.k8s.io/controller-runtime", "pkg/metrics"},
}

// registered returns the fully qualified names of the Prometheus metrics
// defined in the Go sources below dirs: every composite literal with a
// Name field (prometheus.CounterOpts, GaugeOpts, HistogramOpts, ...),
// joined with its Namespace and Subsystem as prometheus.BuildFQName does.
// String constants are resolved by name across all the files read, which is
// how these packages refer to each other's (metrics.WorkQueueSubsystem).
func registered(t *testing.T, dirs []string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			files = append(files, f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	consts := map[string]ast.Expr{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if g, ok := n.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							consts[name.Name] = vs.Values[i]
						}
					}
				}
			}
			return true
		})
	}
	var resolve func(e ast.Expr, depth int) (string, bool)
	resolve = func(e ast.Expr, depth int) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.Ident:
			if v, ok := consts[e.Name]; ok && depth < 5 {
				return resolve(v, depth+1)
			}
		case *ast.SelectorExpr:
			if v, ok := consts[e.Sel.Name]; ok && depth < 5 {
				return resolve(v, depth+1)
			}
		}
		return "", false
	}
	out := map[string]bool{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			parts := map[string]string{}
			for _, el := range lit.Elts {
				kv, ok := el.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, ok := kv.Key.(*ast.Ident)
				if !ok || (key.Name != "Name" && key.Name != "Namespace" && key.Name != "Subsystem") {
					continue
				}
				if v, ok := resolve(kv.Value, 0); ok {
					parts[key.Name] = v
				}
			}
			if parts["Name"] == "" {
				return true
			}
			var name []string
			for _, k := range []string{"Namespace", "Subsystem", "Name"} {
				if parts[k] != "" {
					name = append(name, parts[k])
				}
			}
			out[strings.Join(name, "_")] = true
			return true
		})
	}
	return out
}

func sourceDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	for _, s := range metricSources {
		args := []string{"list", "-m", "-f", "{{.Dir}}"}
		if s.module != "" {
			args = append(args, s.module)
		}
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		dirs = append(dirs, filepath.Join(strings.TrimSpace(string(out)), s.dir))
	}
	return dirs
}

// Every metric the dashboard and the alerts query is one that fleetinfer's
// binaries register (a histogram's _bucket, _sum and _count series count as
// the histogram), so a renamed metric fails here instead of leaving an empty
// panel or an alert that never fires.
func TestDashboardAndAlertsUseOnlyRegisteredMetrics(t *testing.T) {
	known := registered(t, sourceDirs(t))
	for _, want := range []string{"fleetinfer_epp_picks_total", "inference_extension_scheduler_e2e_duration_seconds",
		"controller_runtime_reconcile_total", "workqueue_depth"} {
		if !known[want] {
			t.Fatalf("the source scan misses %s; it found %d metrics", want, len(known))
		}
	}
	used, err := monitoring.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for name, where := range used {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if trimmed, ok := strings.CutSuffix(name, suffix); ok && known[trimmed] {
				base = trimmed
			}
		}
		if !known[base] {
			t.Errorf("%s (used by %s) is registered by no binary", name, strings.Join(slices.Compact(where), ", "))
		}
	}
}

// The dashboard covers what operators asked for: placement, distribution
// lag, federation lag, local vs remote picks and EPP latency; and every
// alert has a summary and a severity.
func TestDashboardCoversTheFleetAndAlertsAreComplete(t *testing.T) {
	used, err := monitoring.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"fleetinfer_hub_placement_decisions_total", "fleetinfer_hub_distribution_seconds_bucket",
		"fleetinfer_epp_federation_lag_seconds_bucket", "fleetinfer_epp_picks_total",
		"inference_extension_scheduler_e2e_duration_seconds_bucket",
	} {
		if len(used[want]) == 0 {
			t.Errorf("nothing queries %s", want)
		}
	}
	rules, err := monitoring.AlertRules()
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) < 5 {
		t.Errorf("%d alerts", len(rules))
	}
	for _, r := range rules {
		if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
			t.Errorf("alert %q needs a name, a severity label and a summary", r.Alert)
		}
	}
}
