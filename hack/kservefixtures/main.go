// Command kservefixtures extracts, from a KServe v0.20.0 source tree, the
// test fixtures that pin fleetinfer's compatibility with KServe: every
// LLMInferenceService and LLMInferenceServiceConfig document under
// docs/samples/llmisvc, and the property paths (with types) of KServe's own
// llmisvc CRD schemas. hack/sync-kserve-fixtures.sh runs it; the output is
// committed, so tests need no KServe at run time.
//
// Usage: kservefixtures <kserve source dir> <output dir>
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/apis/schemapaths"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: kservefixtures <kserve source dir> <output dir>")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "kservefixtures:", err)
		os.Exit(1)
	}
}

func run(src, out string) error {
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(out, "samples"), 0o755); err != nil {
		return err
	}
	if err := samples(filepath.Join(src, "docs", "samples", "llmisvc"), filepath.Join(out, "samples")); err != nil {
		return err
	}
	var lines []string
	for _, f := range []string{"serving.kserve.io_llminferenceservices.yaml", "serving.kserve.io_llminferenceserviceconfigs.yaml"} {
		b, err := os.ReadFile(filepath.Join(src, "config", "crd", "full", "llmisvc", f))
		if err != nil {
			return err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(b, &crd); err != nil {
			return err
		}
		for _, v := range crd.Spec.Versions {
			for _, p := range schemapaths.Of(v.Schema.OpenAPIV3Schema) {
				lines = append(lines, crd.Spec.Names.Kind+" "+v.Name+" "+p)
			}
		}
	}
	sort.Strings(lines)
	return os.WriteFile(filepath.Join(out, "schema-paths.txt"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

// samples copies each document of the two kinds, one file per document,
// named after its source file.
func samples(dir, out string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		base := strings.ReplaceAll(strings.TrimSuffix(rel, ".yaml"), string(filepath.Separator), "__")
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			var meta struct{ Kind string }
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if meta.Kind != "LLMInferenceService" && meta.Kind != "LLMInferenceServiceConfig" {
				continue
			}
			name := fmt.Sprintf("%s.%d.yaml", base, i)
			if err := os.WriteFile(filepath.Join(out, name), bytes.TrimSpace(doc), 0o644); err != nil {
				return err
			}
		}
	})
}
