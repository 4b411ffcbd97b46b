// Package charts renders fleetinfer's Helm charts with the Helm SDK, as
// `helm template --include-crds` does, offline: for the chart tests and the
// install e2e tests, which apply the result to real API servers.
package charts

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/mod/modfile"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/fleetinfer/fleetinfer/internal/ociimage"
)

// Spoke is the per-cluster chart.
const Spoke = "fleetinfer-spoke"

// Dir is the directory of the named chart in this repository.
func Dir(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), name)
}

// Load loads the named chart from this repository.
func Load(name string) (*chart.Chart, error) { return loader.Load(Dir(name)) }

// Image is the reference of a fleetinfer image at the spoke chart's
// appVersion, the tag the chart, the presets and the hub manifests name and
// `make images` builds.
func Image(component string) (string, error) {
	c, err := Load(Spoke)
	if err != nil {
		return "", err
	}
	return ociimage.Reference(component, c.Metadata.AppVersion), nil
}

// Options choose the release and what the target cluster offers.
type Options struct {
	ReleaseName string
	Namespace   string
	// Values override the chart's values.yaml, as `--values` does.
	Values map[string]any
	// APIVersions are API versions (group/version or group/version/Kind)
	// the cluster serves beyond the built-in ones, as `--api-versions`.
	APIVersions []string
	// KubeVersion is the cluster's version; by default the one fleetinfer
	// is built against (k8s.io/api v0.X.Y is Kubernetes v1.X.Y).
	KubeVersion string
}

// builtKubeVersion is the Kubernetes version of the k8s.io/api module in
// this repository's go.mod.
func builtKubeVersion() (string, error) {
	path := filepath.Join(Dir(".."), "..", "go.mod")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	f, err := modfile.ParseLax(path, b, nil)
	if err != nil {
		return "", err
	}
	for _, r := range f.Require {
		if r.Mod.Path == "k8s.io/api" && strings.HasPrefix(r.Mod.Version, "v0.") {
			return "v1." + strings.TrimPrefix(r.Mod.Version, "v0."), nil
		}
	}
	return "", fmt.Errorf("%s requires no k8s.io/api v0.x", path)
}

// Render renders the chart as `helm template --include-crds`: values are
// checked against values.schema.json, subcharts whose condition is false are
// left out, and the CRDs of crds/ directories come first.
func Render(c *chart.Chart, o Options) ([]*unstructured.Unstructured, error) {
	cfg := &action.Configuration{Log: func(string, ...any) {}}
	install := action.NewInstall(cfg)
	install.DryRun, install.ClientOnly, install.IncludeCRDs, install.Replace = true, true, true, true
	install.ReleaseName, install.Namespace = o.ReleaseName, o.Namespace
	install.APIVersions = chartutil.VersionSet(o.APIVersions)
	kv := o.KubeVersion
	if kv == "" {
		var err error
		if kv, err = builtKubeVersion(); err != nil {
			return nil, err
		}
	}
	v, err := chartutil.ParseKubeVersion(kv)
	if err != nil {
		return nil, err
	}
	install.KubeVersion = v
	values := o.Values
	if values == nil {
		values = map[string]any{}
	}
	// Install mutates the chart (it drops disabled subcharts); render a copy.
	rel, err := install.Run(copyChart(c), values)
	if err != nil {
		return nil, err
	}
	return ParseManifests([]byte(rel.Manifest))
}

// copyChart copies what Install changes: the dependency list.
func copyChart(c *chart.Chart) *chart.Chart {
	out := *c
	deps := make([]*chart.Chart, len(c.Dependencies()))
	for i, d := range c.Dependencies() {
		deps[i] = copyChart(d)
	}
	out.SetDependencies(deps...)
	return &out
}

// ReadManifests is ParseManifests of the file at path.
func ReadManifests(path string) ([]*unstructured.Unstructured, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseManifests(b)
}

// ParseManifests splits a multi-document YAML stream into objects, skipping
// empty documents (Helm's templates that render nothing).
func ParseManifests(b []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
}
