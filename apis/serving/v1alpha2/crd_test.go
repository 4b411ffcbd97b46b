package v1alpha2_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/apis"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/internal/testutil/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	crds, err := apis.CRDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(testenv.Run(m, testenv.Options{CRDs: crds}, &env))
}

func resource(kind, version string) schema.GroupVersionResource {
	r := "llminferenceservices"
	if kind == "LLMInferenceServiceConfig" {
		r = "llminferenceserviceconfigs"
	}
	return schema.GroupVersionResource{Group: "serving.kserve.io", Version: version, Resource: r}
}

// Every LLMInferenceService and LLMInferenceServiceConfig sample shipped
// with KServe v0.20.0 is accepted by the CRDs on a real API server and reads
// back unchanged through both served versions: nothing is pruned except
// fields KServe's own schema does not have either (a sample bug KServe prunes
// too), and the only additions are schema defaults.
func TestKServeSamplesRoundTripInBothVersions(t *testing.T) {
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNamespace(t, env.Client)
	schemas := ourSchemas(t)
	kserve := kservePaths(t)
	files, err := filepath.Glob("testdata/kserve-v0.20.0/samples/*.yaml")
	if err != nil || len(files) < 20 {
		t.Fatalf("samples: %v (%d files)", err, len(files))
	}
	for i, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(b, &obj.Object); err != nil {
				t.Fatal(err)
			}
			applied := obj.DeepCopy()
			// Samples from different directories reuse names.
			obj.SetName(fmt.Sprintf("s%02d-%s", i, obj.GetName()))
			obj.SetNamespace(ns)
			gv, err := schema.ParseGroupVersion(obj.GetAPIVersion())
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := dyn.Resource(resource(obj.GetKind(), gv.Version)).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
				t.Fatalf("rejected: %v", err)
			}
			for _, version := range []string{"v1alpha1", "v1alpha2"} {
				got, err := dyn.Resource(resource(obj.GetKind(), version)).Namespace(ns).Get(ctx, obj.GetName(), metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				c := comparison{kserve: kserve[obj.GetKind()+" "+gv.Version]}
				c.compare(schemas[obj.GetKind()].Properties["spec"], applied.Object["spec"], got.Object["spec"], ".spec")
				for _, p := range c.problems {
					t.Errorf("read back in %s: %s", version, p)
				}
				for _, k := range []string{"labels", "annotations"} {
					w, _, _ := unstructured.NestedStringMap(applied.Object, "metadata", k)
					h, _, _ := unstructured.NestedStringMap(got.Object, "metadata", k)
					if len(w) > 0 && !reflect.DeepEqual(w, h) {
						t.Errorf("%s metadata.%s: applied %v, read %v", version, k, w, h)
					}
				}
			}
		})
	}
}

func ourSchemas(t *testing.T) map[string]apiextensionsv1.JSONSchemaProps {
	crds, err := apis.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]apiextensionsv1.JSONSchemaProps{}
	for _, c := range crds {
		out[c.Spec.Names.Kind] = *c.Spec.Versions[0].Schema.OpenAPIV3Schema
	}
	return out
}

// kservePaths reads the reference paths as "Kind version" -> path set.
func kservePaths(t *testing.T) map[string]map[string]bool {
	b, err := os.ReadFile("testdata/kserve-v0.20.0/schema-paths.txt")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		key := f[0] + " " + f[1]
		if out[key] == nil {
			out[key] = map[string]bool{}
		}
		out[key][f[2]] = true
	}
	return out
}

// comparison walks what was applied against what was read back, along our
// schema.
type comparison struct {
	kserve   map[string]bool
	problems []string
}

func (c *comparison) compare(s apiextensionsv1.JSONSchemaProps, want, have any, path string) {
	preserve := s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields
	switch w := want.(type) {
	case map[string]any:
		h, ok := have.(map[string]any)
		if !ok {
			c.problems = append(c.problems, fmt.Sprintf("%s: applied an object, read %s", path, mustJSON(have)))
			return
		}
		for k, wv := range w {
			child, known := s.Properties[k]
			sub := path + "." + k
			if !known && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
				child, known, sub = *s.AdditionalProperties.Schema, true, path+"{}"
			}
			hv, kept := h[k]
			switch {
			case !kept && !known && !preserve && !c.kserve[sub] && !c.kserve[sub+"*"]:
				// Unknown to KServe's schema as well: pruned there too.
			case !kept:
				c.problems = append(c.problems, fmt.Sprintf("%s was pruned", path+"."+k))
			case !known:
				if !jsonEqual(wv, hv) {
					c.problems = append(c.problems, fmt.Sprintf("%s: applied %s, read %s", path+"."+k, mustJSON(wv), mustJSON(hv)))
				}
			default:
				c.compare(child, wv, hv, sub)
			}
		}
		for k, hv := range h {
			if _, applied := w[k]; applied {
				continue
			}
			child := s.Properties[k]
			if child.Default == nil || !jsonEqual(json.RawMessage(child.Default.Raw), hv) {
				c.problems = append(c.problems, fmt.Sprintf("%s.%s appeared (%s) and is not a schema default", path, k, mustJSON(hv)))
			}
		}
	case []any:
		h, ok := have.([]any)
		if !ok || len(h) != len(w) {
			c.problems = append(c.problems, fmt.Sprintf("%s: applied %s, read %s", path, mustJSON(want), mustJSON(have)))
			return
		}
		var item apiextensionsv1.JSONSchemaProps
		if s.Items != nil && s.Items.Schema != nil {
			item = *s.Items.Schema
		}
		for i := range w {
			c.compare(item, w[i], h[i], path+"[]")
		}
	default:
		if !jsonEqual(want, have) {
			c.problems = append(c.problems, fmt.Sprintf("%s: applied %s, read %s", path, mustJSON(want), mustJSON(have)))
		}
	}
}

// jsonEqual compares through JSON so that int64 and float64 agree.
func jsonEqual(a, b any) bool {
	var x, y any
	_ = json.Unmarshal([]byte(mustJSON(a)), &x)
	_ = json.Unmarshal([]byte(mustJSON(b)), &y)
	return reflect.DeepEqual(x, y)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

const validBase = `
apiVersion: serving.kserve.io/v1alpha2
kind: LLMInferenceService
metadata: {name: bad}
spec:
  model: {uri: "hf://facebook/opt-125m", name: opt}
`

// Each validation rule rejects bad input with a message that says what is
// wrong, before anything is stored.
func TestValidationRejectsBadInputWithClearMessages(t *testing.T) {
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNamespace(t, env.Client)
	cases := []struct {
		name, kind, spec, want string
	}{
		{"worker without parallelism", "LLMInferenceService", `{worker: {containers: [{name: main}]}}`,
			"when worker is specified, parallelism must be configured"},
		{"worker with only tensor parallelism", "LLMInferenceService", `{worker: {containers: [{name: main}]}, parallelism: {tensor: 2}}`,
			"when worker is specified, parallelism must be configured"},
		{"pipeline and data", "LLMInferenceService", `{parallelism: {pipeline: 2, data: 4, dataLocal: 2}}`,
			"cannot set both pipeline parallelism and data parallelism"},
		{"data without dataLocal", "LLMInferenceService", `{parallelism: {data: 4}}`, "dataLocal must be set when data is set"},
		{"dataLocal without data", "LLMInferenceService", `{parallelism: {dataLocal: 4}}`, "data must be set when dataLocal is set"},
		{"zero data parallelism", "LLMInferenceService", `{parallelism: {data: 0, dataLocal: 1}}`, "should be greater than or equal to 1"},
		{"negative pipeline", "LLMInferenceService", `{parallelism: {pipeline: -1}}`, "should be greater than or equal to 1"},
		{"prefill worker without parallelism", "LLMInferenceService", `{prefill: {worker: {containers: [{name: main}]}}}`,
			"when worker is specified, parallelism must be configured"},
		{"replicas and scaling", "LLMInferenceService", `{replicas: 2, scaling: {maxReplicas: 3, wva: {hpa: {}}}}`,
			"replicas and scaling are mutually exclusive"},
		{"negative replicas", "LLMInferenceService", `{replicas: -1}`, "should be greater than or equal to 0"},
		{"route refs and spec", "LLMInferenceService", `{router: {route: {http: {refs: [{name: r}], spec: {}}}}}`,
			"cannot use both custom HTTPRoute refs"},
		{"scheduler zero replicas", "LLMInferenceService", `{router: {scheduler: {replicas: 0}}}`, "should be greater than or equal to 1"},
		{"route refs with managed gateway", "LLMInferenceService", `{router: {route: {http: {refs: [{name: r}]}}, gateway: {}}}`,
			"cannot be used with a managed gateway"},
		{"pool spec and ref", "LLMInferenceService", `{router: {scheduler: {pool: {ref: {name: p}, spec: {selector: {matchLabels: {a: b}}, targetPorts: [{number: 8000}], endpointPickerRef: {name: e, port: {number: 9002}}}}}}}`,
			"pool spec and pool ref are mutually exclusive"},
		{"legacy pool shape", "LLMInferenceService", `{router: {scheduler: {pool: {spec: {selector: {app: x}, targetPortNumber: 8000}}}}}`,
			"spec.router.scheduler.pool.spec.targetPorts: Required value"},
		{"duplicate adapter names", "LLMInferenceService", `{model: {uri: "hf://x/y", lora: {adapters: [{name: a, uri: "hf://a"}, {name: a, uri: "hf://b"}]}}}`,
			"Duplicate value"},
		{"adapter without name", "LLMInferenceService", `{model: {uri: "hf://x/y", lora: {adapters: [{uri: "hf://a"}]}}}`,
			"name: Required value"},
		{"adapter named dot-dot", "LLMInferenceService", `{model: {uri: "hf://x/y", lora: {adapters: [{name: "..", uri: "hf://a"}]}}}`,
			"adapter name must not be '.' or '..'"},
		{"lora maxRank zero", "LLMInferenceService", `{model: {uri: "hf://x/y", lora: {maxRank: 0}}}`, "should be greater than or equal to 1"},
		{"scaling min above max", "LLMInferenceService", `{scaling: {minReplicas: 4, maxReplicas: 2, wva: {hpa: {}}}}`, "minReplicas cannot exceed maxReplicas"},
		{"scaling without actuator", "LLMInferenceService", `{scaling: {maxReplicas: 2, wva: {}}}`, "either hpa or keda must be specified"},
		{"config with baseRefs", "LLMInferenceServiceConfig", `{baseRefs: [{name: other}]}`, "cannot have baseRefs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(validBase), &obj.Object); err != nil {
				t.Fatal(err)
			}
			var spec map[string]any
			if err := yaml.Unmarshal([]byte(tc.spec), &spec); err != nil {
				t.Fatal(err)
			}
			merged, _, _ := unstructured.NestedMap(obj.Object, "spec")
			for k, v := range spec {
				merged[k] = v
			}
			obj.Object["spec"] = merged
			obj.SetKind(tc.kind)
			obj.SetGenerateName("bad-")
			obj.SetName("")
			_, err := dyn.Resource(resource(tc.kind, "v1alpha2")).Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want Invalid, got %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("message %q lacks %q", err.Error(), tc.want)
			}
		})
	}
}

// The LeaderWorkerSet group size (data/dataLocal, or pipeline) cannot change
// after creation; other parallelism fields can.
func TestParallelismSizeIsImmutable(t *testing.T) {
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNamespace(t, env.Client)
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(validBase), &obj.Object); err != nil {
		t.Fatal(err)
	}
	spec := obj.Object["spec"].(map[string]any)
	spec["parallelism"] = map[string]any{"data": int64(8), "dataLocal": int64(4), "tensor": int64(1)}
	spec["worker"] = map[string]any{"containers": []any{map[string]any{"name": "main"}}}
	ctx := context.Background()
	r := dyn.Resource(resource("LLMInferenceService", "v1alpha2")).Namespace(ns)
	created, err := r.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(created.Object, int64(2), "spec", "parallelism", "tensor")
	if created, err = r.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("tensor change rejected: %v", err)
	}
	_ = unstructured.SetNestedField(created.Object, int64(16), "spec", "parallelism", "data")
	_, err = r.Update(ctx, created, metav1.UpdateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "total parallelism size") {
		t.Fatalf("size change from 2 to 4: want Invalid naming the size, got %v", err)
	}
}
