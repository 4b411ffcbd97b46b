package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = "../.."

// TestPagesUpToDate fails when the committed pages differ from what the code
// and CRDs generate, so that `go test ./...` (make test) catches a flag,
// metric or field changed without `make generate`.
func TestPagesUpToDate(t *testing.T) {
	pages, err := pages(filepath.Join(root, "apis/crds"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "docs/reference")
	for name, want := range pages {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("docs/reference/%s: %v; run `make generate`", name, err)
			continue
		}
		if line, ok := firstDiff(string(got), want); !ok {
			t.Errorf("docs/reference/%s is out of date from line %d; run `make generate`", name, line)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, ok := pages[e.Name()]; !ok {
			t.Errorf("docs/reference/%s is not generated; remove it or generate it", e.Name())
		}
	}
}

// firstDiff returns the first line (from 1) where got and want differ.
func firstDiff(got, want string) (int, bool) {
	if got == want {
		return 0, true
	}
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return i + 1, false
		}
	}
	return min(len(g), len(w)) + 1, false
}

var metricName = regexp.MustCompile(`Name:\s*"(fleetinfer_[a-z0-9_]+)"`)

// TestEveryMetricDocumented checks metrics.md against the metric names in
// the source: a package refdocs does not reach (neither imported by the hub
// or spoke nor in epp.MetricCollectors) would otherwise go missing silently.
func TestEveryMetricDocumented(t *testing.T) {
	docs, err := metricDocs()
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, d := range docs {
		documented[d.name] = true
	}
	for _, dir := range []string{"hub", "spoke", "epp", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			for _, m := range metricName.FindAllSubmatch(src, -1) {
				if !documented[string(m[1])] {
					t.Errorf("%s defines %s, which metrics.md does not list", path, m[1])
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestParseDesc(t *testing.T) {
	d, err := parseDesc(`Desc{fqName: "fleetinfer_x_total", help: "Say \"hi\", {a,b}}.", constLabels: {}, variableLabels: {peer,c(reason)}}`)
	if err != nil {
		t.Fatal(err)
	}
	if d.name != "fleetinfer_x_total" || d.help != `Say "hi", {a,b}}.` || strings.Join(d.labels, " ") != "peer reason" {
		t.Errorf("parseDesc = %+v", d)
	}
}
