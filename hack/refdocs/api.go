package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

type schema = apiextensionsv1.JSONSchemaProps

// embedded names the upstream types the KServe-compatible kinds embed
// whole (pod templates, inline HTTPRoute and InferencePool specs): their
// hundreds of fields are documented upstream, so the walk stops at them.
// A type is told by the fields it has, as the CRDs carry no Go type names.
var embedded = []struct {
	fields []string
	name   string
}{
	{[]string{"containers", "volumes"}, "a Kubernetes core/v1 PodSpec: see the Kubernetes API reference"},
	{[]string{"parentRefs", "rules"}, "a Gateway API HTTPRouteSpec: see the Gateway API reference"},
	{[]string{"endpointPickerRef", "selector", "targetPorts"}, "an InferencePoolSpec: see the Gateway API Inference Extension reference"},
	{[]string{"lastTransitionTime", "message", "reason", "status", "type"}, "a Kubernetes metav1.Condition"},
}

// apiPage documents every CRD in dir: per kind and served version, a table
// of its spec's and status's fields.
func apiPage(dir string) (string, error) {
	crds, err := readCRDs(dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(header + "# API reference\n\nThe kinds fleetinfer serves, from the CRDs in `apis/crds`, " +
		"by API group; every kind also has the standard `apiVersion`, `kind` and `metadata`. " +
		"Fields of upstream types embedded whole (pod templates, HTTPRoute and InferencePool specs) are not listed.\n\n")
	w := apiWriter{b: &b, seen: map[string]string{}}
	group := ""
	for _, crd := range crds {
		if crd.Spec.Group != group {
			group = crd.Spec.Group
			fmt.Fprintf(&b, "## %s\n\n", group)
		}
		w.crd(crd)
	}
	return b.String(), nil
}

// readCRDs reads dir's CRDs, sorted by group and kind.
func readCRDs(dir string) ([]apiextensionsv1.CustomResourceDefinition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var crds []apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(data, &crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		crds = append(crds, crd)
	}
	sort.Slice(crds, func(i, j int) bool {
		a, b := crds[i].Spec, crds[j].Spec
		return a.Group < b.Group || a.Group == b.Group && a.Names.Kind < b.Names.Kind
	})
	return crds, nil
}

// apiWriter writes the kinds' sections. seen maps the JSON of each spec
// and status schema already written to where it was, so that a version or
// kind sharing one (KServe's v1alpha1 and v1alpha2; LLMInferenceService's
// spec and its config's) points there instead of repeating it.
type apiWriter struct {
	b    *strings.Builder
	seen map[string]string
}

func (w apiWriter) crd(crd apiextensionsv1.CustomResourceDefinition) {
	names := crd.Spec.Names
	fmt.Fprintf(w.b, "### %s\n\n", names.Kind)
	scope := "Namespaced"
	if crd.Spec.Scope == apiextensionsv1.ClusterScoped {
		scope = "Cluster-scoped"
	}
	fmt.Fprintf(w.b, "%s; plural `%s`", scope, names.Plural)
	if len(names.ShortNames) > 0 {
		fmt.Fprintf(w.b, ", short names `%s`", strings.Join(names.ShortNames, "`, `"))
	}
	w.b.WriteString(".\n\n")
	for _, v := range crd.Spec.Versions {
		if !v.Served || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		w.version(names.Kind, v)
	}
}

func (w apiWriter) version(kind string, v apiextensionsv1.CustomResourceDefinitionVersion) {
	title := kind + " " + v.Name
	root := v.Schema.OpenAPIV3Schema
	fmt.Fprintf(w.b, "#### %s\n\n", title)
	if v.Storage {
		w.b.WriteString("Storage version. ")
	}
	if v.Deprecated {
		w.b.WriteString("Deprecated. ")
	}
	if d := oneLine(root.Description); d != "" {
		w.b.WriteString(d)
	}
	w.b.WriteString("\n\n")
	var rows [][]string
	for _, name := range sortedKeys(root.Properties) {
		if name == "apiVersion" || name == "kind" || name == "metadata" {
			continue
		}
		s := root.Properties[name]
		key, _ := json.Marshal(s)
		if where, ok := w.seen[string(key)]; ok {
			rows = append(rows, row(name, &s, slices.Contains(root.Required, name), "The same fields as "+where+"."))
			continue
		}
		w.seen[string(key)] = fmt.Sprintf("%s's `%s`", title, name)
		rows = append(rows, fields(name, &s, slices.Contains(root.Required, name))...)
	}
	table(w.b, []string{"Field", "Type", "Required", "Description", "Validation"}, rows)
}

// fields lists s and, unless it is an embedded upstream type, its fields.
func fields(path string, s *schema, required bool) [][]string {
	for _, e := range embedded {
		if hasFields(s, e.fields) {
			return [][]string{row(path, s, required, "Fields: "+e.name+".")}
		}
	}
	rows := [][]string{row(path, s, required, "")}
	if s.Items != nil && s.Items.Schema != nil {
		s, path = s.Items.Schema, path+"[]"
	}
	for _, name := range sortedKeys(s.Properties) {
		child := s.Properties[name]
		rows = append(rows, fields(path+"."+name, &child, slices.Contains(s.Required, name))...)
	}
	return rows
}

func row(path string, s *schema, required bool, note string) []string {
	req := ""
	if required {
		req = "yes"
	}
	desc := strings.TrimSpace(oneLine(s.Description) + " " + note)
	return []string{code(path), text(typeName(s)), req, text(desc), text(strings.Join(validations(s), "; "))}
}

// hasFields tells whether s, or the items of s, has all of names.
func hasFields(s *schema, names []string) bool {
	if s.Items != nil && s.Items.Schema != nil {
		s = s.Items.Schema
	}
	for _, n := range names {
		if _, ok := s.Properties[n]; !ok {
			return false
		}
	}
	return true
}

func typeName(s *schema) string {
	switch {
	case s.XIntOrString:
		return "int or string"
	case s.Type == "array" && s.Items != nil && s.Items.Schema != nil:
		return "[]" + typeName(s.Items.Schema)
	case s.Type == "object" && len(s.Properties) == 0 && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		return "map[string]" + typeName(s.AdditionalProperties.Schema)
	case s.Type == "" && s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields:
		return "any"
	case s.Format != "":
		return s.Type + " (" + s.Format + ")"
	}
	return s.Type
}

// validations lists what the API server checks of s beyond its type.
func validations(s *schema) []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	if len(s.Enum) > 0 {
		vals := make([]string, len(s.Enum))
		for i, e := range s.Enum {
			vals[i] = string(e.Raw)
		}
		add("one of %s", strings.Join(vals, ", "))
	}
	if s.Default != nil {
		add("default %s", s.Default.Raw)
	}
	if s.Pattern != "" {
		add("pattern `%s`", s.Pattern)
	}
	bound := func(name string, min, max *int64) {
		if min != nil {
			add("%s >= %d", name, *min)
		}
		if max != nil {
			add("%s <= %d", name, *max)
		}
	}
	bound("length", s.MinLength, s.MaxLength)
	bound("items", s.MinItems, s.MaxItems)
	bound("properties", s.MinProperties, s.MaxProperties)
	if s.Minimum != nil {
		add(">= %v", *s.Minimum)
	}
	if s.Maximum != nil {
		add("<= %v", *s.Maximum)
	}
	for _, r := range s.XValidations {
		if r.Message != "" {
			add("%s", r.Message)
		} else {
			add("rule `%s`", r.Rule)
		}
	}
	return v
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
