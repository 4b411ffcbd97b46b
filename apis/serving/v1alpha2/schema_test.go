package v1alpha2_test

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/fleetinfer/fleetinfer/apis"
	"github.com/fleetinfer/fleetinfer/apis/schemapaths"
)

// kserveOnly are paths KServe v0.20.0 accepts that fleetinfer deliberately
// does not, each with the reason; everything else KServe accepts must be
// accepted here with the same type.
var kserveOnly = map[string]string{
	// KServe's v1alpha1 held the retired GIE v1alpha2 pool shape; both
	// versions here use the v1 shape and reject the old one.
	"spec.router.scheduler.pool.spec.extensionRef":     "legacy InferencePool shape",
	"spec.router.scheduler.pool.spec.targetPortNumber": "legacy InferencePool shape",
	"spec.router.scheduler.pool.spec.selector{}":       "legacy InferencePool shape",
	// KServe leaves adapters without a schema; here each adapter is an
	// object keyed by a unique name, its other fields preserved.
	"spec.model.lora.adapters": "typed adapter list",
}

// Every property KServe v0.20.0's llmisvc CRDs accept, in both versions and
// both kinds, is accepted by fleetinfer's CRDs with the same type (or kept by
// a node that preserves unknown fields), so nothing a KServe user writes is
// pruned. The reference paths come from KServe's CRD files
// (hack/sync-kserve-fixtures.sh).
func TestSchemaAcceptsEverythingKServeAccepts(t *testing.T) {
	ours := map[string]map[string]string{} // "Kind version" -> path -> type
	crds, err := apis.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		for _, v := range c.Spec.Versions {
			m := map[string]string{}
			for _, p := range schemapaths.Of(v.Schema.OpenAPIV3Schema) {
				path, typ, _ := strings.Cut(p, " ")
				m[path] = typ
			}
			ours[c.Spec.Names.Kind+" "+v.Name] = m
		}
	}
	f, err := os.Open("testdata/kserve-v0.20.0/schema-paths.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	checked := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		kindVersion, path, typ := fields[0]+" "+fields[1], fields[2], fields[3]
		m, ok := ours[kindVersion]
		if !ok {
			t.Fatalf("fleetinfer does not serve %s", kindVersion)
		}
		checked++
		if exempt(path) || covered(m, path, typ) {
			continue
		}
		t.Errorf("%s: KServe accepts %s (%s); fleetinfer has %q", kindVersion, path, typ, m[strings.TrimSuffix(path, "*")])
	}
	if checked < 10000 {
		t.Fatalf("only %d reference paths checked", checked)
	}
}

func exempt(path string) bool {
	path = strings.TrimPrefix(strings.TrimSuffix(path, "*"), ".")
	for p := range kserveOnly {
		if path == p || strings.HasPrefix(path, p+".") || strings.HasPrefix(path, p+"[") || strings.HasPrefix(path, p+"{") {
			return true
		}
	}
	return false
}

// covered reports whether our schema accepts path with type typ: the same
// path and type, or an ancestor that preserves unknown fields.
func covered(ours map[string]string, path, typ string) bool {
	bare := strings.TrimSuffix(path, "*")
	for _, p := range []string{bare, bare + "*"} {
		// "any" (no type) accepts every type.
		if got, ok := ours[p]; ok && (got == typ || got == "any") {
			return true
		}
	}
	for i := len(bare) - 1; i > 0; i-- {
		if c := bare[i]; c == '.' || c == '[' || c == '{' {
			if _, ok := ours[bare[:i]+"*"]; ok {
				return true
			}
		}
	}
	return false
}
