// Package charts renders fleetinfer's Helm charts with the Helm SDK, as
// `helm template --include-crds` does, offline: for the chart tests and the
// install e2e tests, which apply the result to real API servers.
package charts

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/ignore"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/fleetinfer/fleetinfer/internal/ociimage"
)

// Spoke is the per-cluster chart.
const Spoke = "fleetinfer-spoke"

// sources holds the charts in the binary, so that rendering them needs no
// checkout: the localfleet binary reads the chart's appVersion, and builds
// with -trimpath (images, make test) have no source paths to find them by.
//
//go:embed all:fleetinfer-spoke
var sources embed.FS

// builtKubeVersion is the Kubernetes version of the k8s.io/api module in
// this repository's go.mod (k8s.io/api v0.X.Y is Kubernetes v1.X.Y); a test
// fails when the two differ.
const builtKubeVersion = "v1.36.3"

// Load loads the named chart from the charts built into this package.
func Load(name string) (*chart.Chart, error) {
	rules, err := helmIgnore(name)
	if err != nil {
		return nil, err
	}
	var files []*loader.BufferedFile
	err = fs.WalkDir(sources, name, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == name {
			return err
		}
		rel := strings.TrimPrefix(p, name+"/")
		info, err := d.Info()
		if err != nil || rules.Ignore(rel, info) {
			if err == nil && d.IsDir() {
				return fs.SkipDir
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := fs.ReadFile(sources, p)
		files = append(files, &loader.BufferedFile{Name: rel, Data: b})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", name, err)
	}
	return loader.LoadFiles(files)
}

// helmIgnore reads the chart's .helmignore with Helm's defaults, as
// `helm package` and loader.LoadDir apply them.
func helmIgnore(name string) (*ignore.Rules, error) {
	b, err := fs.ReadFile(sources, path.Join(name, ignore.HelmIgnore))
	if errors.Is(err, fs.ErrNotExist) {
		r := ignore.Empty()
		r.AddDefaults()
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	r, err := ignore.Parse(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("chart %s: %s: %w", name, ignore.HelmIgnore, err)
	}
	r.AddDefaults()
	return r, nil
}

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
		kv = builtKubeVersion
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
