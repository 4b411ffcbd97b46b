package llmisvc

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/spoke/presets"
)

// renderWithin renders in, failing the test instead of hanging when
// rendering does not return within limit.
func renderWithin(t *testing.T, in renderInput, lim RenderLimits, limit time.Duration) (*v1alpha2.LLMInferenceServiceSpec, error) {
	t.Helper()
	type result struct {
		spec *v1alpha2.LLMInferenceServiceSpec
		err  error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		s, err := render(in, lim)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		if d := time.Since(start); d > limit {
			t.Errorf("rendering took %s, over %s", d, limit)
		}
		return r.spec, r.err
	case <-time.After(limit + 10*time.Second):
		t.Fatalf("rendering has not returned after %s", limit+10*time.Second)
		return nil, nil
	}
}

func argsSpec(model string, args ...string) v1alpha2.LLMInferenceServiceSpec {
	return v1alpha2.LLMInferenceServiceSpec{
		Model:        v1alpha2.LLMModelSpec{URI: "hf://x/y", Name: ptr.To(model)},
		WorkloadSpec: v1alpha2.WorkloadSpec{Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Args: args}}}},
	}
}

// input renders service over configs as compose does.
func input(configs, service v1alpha2.LLMInferenceServiceSpec) renderInput {
	return renderInput{meta: metav1.ObjectMeta{Name: "svc", Namespace: "team"},
		global: GlobalConfig{SystemNamespace: "fleetinfer-system", EnableTLS: true}, configs: configs, service: service}
}

// A service's own fields are data: its placeholders are replaced by values,
// text between `{{` and `}}` that is not one is refused without being run,
// and its size is bounded; each returns quickly.
func TestServiceFieldsAreDataNotTemplates(t *testing.T) {
	huge := strings.Repeat("a", 1400*1024)
	cases := []struct {
		name   string
		spec   v1alpha2.LLMInferenceServiceSpec
		want   string // the rendered first arg, when rendering succeeds
		reason string // else the reason it is refused with
	}{
		{"range over a huge number", argsSpec("m", "{{range 100000000000}}{{end}}"), "", ReasonUnsupportedPlaceholder},
		{"a thousand paddings", argsSpec("m", strings.Repeat(`{{printf "%0999999d" 0}}`, 1000)), "", ReasonUnsupportedPlaceholder},
		{"1.4 MB spec", argsSpec("m", huge), "", ReasonRenderLimitExceeded},
		{"model name with quotes and a command substitution", argsSpec(`x" $(touch /tmp/pwned) "y`, "--model={{ .Spec.Model.Name }}"),
			`--model=x" $(touch /tmp/pwned) "y`, ""},
		{"in the model name too", argsSpec("{{range 100000000000}}{{end}}", "{{ .Spec.Model.Name }}"), "", ReasonUnsupportedPlaceholder},
		{"KServe sample placeholders", argsSpec("opt", "tcp://{{ ChildName .ObjectMeta.Name `-epp-service` }}:5557 {{.ObjectMeta.Namespace}} {{- .GlobalConfig.EnableTLS -}} !"),
			"tcp://svc-epp-service:5557 teamtrue!", ""},
		{"quoted literal braces", argsSpec("m", `{{ "{{ messages }}" }}`), "{{ messages }}", ""},
		{"braces without an action stay text", argsSpec("m", "{{ not closed", "}} {"), "{{ not closed", ""},
		{"a JSON breakout stays in its string", argsSpec(`m","privileged":true,"x":"`, "{{ .Spec.Model.Name }}"), `m","privileged":true,"x":"`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := renderWithin(t, input(v1alpha2.LLMInferenceServiceSpec{}, c.spec), DefaultRenderLimits, 2*time.Second)
			if c.reason != "" {
				var cfgErr *configError
				if !errors.As(renderError(err), &cfgErr) || err == nil || cfgErr.reason != c.reason {
					t.Fatalf("error %v, want reason %s", err, c.reason)
				}
				if len(err.Error()) > 2048 {
					t.Errorf("message of %d bytes", len(err.Error()))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Template.Containers[0].Args[0]; got != c.want {
				t.Errorf("arg %q, want %q", got, c.want)
			}
			if out.Template.Containers[0].SecurityContext != nil {
				t.Errorf("the value escaped its string: %+v", out.Template.Containers[0])
			}
		})
	}
}

// Config templates run, but without loops, template calls, padding
// functions or methods of the data, and within the byte and time limits;
// values they put in shell scripts or JSON are quoted.
func TestConfigTemplatesAreBoundedAndQuoteValues(t *testing.T) {
	bigModel := strings.Repeat("m", 100*1024)
	cases := []struct {
		name    string
		model   string
		config  string
		want    string
		failure string // a part of the error, when rendering fails
	}{
		{"range", "m", "{{range 100000000000}}{{end}}", "", "range is not allowed"},
		{"recursion", "m", `{{define "a"}}{{template "a" .}}{{template "a" .}}{{end}}{{template "a" .}}`, "", "may not define templates"},
		{"padding", "m", `{{printf "%0999999d" 0}}`, "", `function "printf" is not available`},
		{"methods of the data", "m", "{{ .Spec.DeepCopy }}", "", `no entry for key "DeepCopy"`},
		{"output over the byte limit", bigModel, strings.Repeat("{{ .Spec.Model.Name }}", 11), "", "more than the limit of bytes"},
		{"functions count toward the limit", bigModel, strings.Repeat("{{ if toJSON .Spec }}{{ end }}", 20), "", "more than the limit of bytes"},
		{"fields, guards and defaults", "m", "{{ .ObjectMeta.Name }}/{{ .Namespace }} tls={{ .GlobalConfig.EnableTLS }} " +
			"{{- if and .Spec.Parallelism .Spec.Parallelism.Tensor }} tp={{ .Spec.Parallelism.Tensor }}{{ end }} dp={{ or .Spec.Parallelism.Data 1 }}",
			"svc/team tls=true dp=1", ""},
		{"shell quoting", `x" $(touch /tmp/pwned) 'y`, `--served-model-name {{ shellQuote .Spec.Model.Name }} {{ shellQuote "p/" .Namespace "/" .Spec.Model.Name }}`,
			`--served-model-name 'x" $(touch /tmp/pwned) '\''y' 'p/team/x" $(touch /tmp/pwned) '\''y'`, ""},
		{"values are not rendered again", `{{ "{{range 100000000000}}{{end}}" }}`, "{{ .Spec.Model.Name }}", "{{range 100000000000}}{{end}}", ""},
		{"JSON encoding", `a"b`, `{"topic":{{ toJSON .Spec.Model.Name }}}`, `{"topic":"a\"b"}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			service := argsSpec(c.model)
			service.Template.Containers[0].Args = nil
			configs := argsSpec("", c.config)
			configs.Model = v1alpha2.LLMModelSpec{}
			configs.Parallelism = &v1alpha2.ParallelismSpec{Tensor: nil}
			out, err := renderWithin(t, input(configs, service), DefaultRenderLimits, 2*time.Second)
			if c.failure != "" {
				if err == nil || !strings.Contains(err.Error(), c.failure) {
					t.Fatalf("error %v, want one saying %q", err, c.failure)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Template.Containers[0].Args[0]; got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

// Every preset renders for a service using every parallelism field it
// reads, leaving no template text or missing value behind.
func TestEveryPresetRenders(t *testing.T) {
	cfgs, err := presets.Load("fleetinfer-system", "kserve-")
	if err != nil {
		t.Fatal(err)
	}
	par := &v1alpha2.ParallelismSpec{Data: ptr.To(int32(4)), DataLocal: ptr.To(int32(2)), Tensor: ptr.To(int32(2)), Pipeline: ptr.To(int32(2)), Expert: true}
	service := v1alpha2.LLMInferenceServiceSpec{
		Model:        v1alpha2.LLMModelSpec{URI: "hf://x/y", Name: ptr.To("org/model")},
		WorkloadSpec: v1alpha2.WorkloadSpec{Parallelism: par},
		Prefill:      &v1alpha2.WorkloadSpec{Parallelism: par},
	}
	for _, cfg := range cfgs {
		t.Run(cfg.Name, func(t *testing.T) {
			out, err := renderWithin(t, input(cfg.Spec, service), DefaultRenderLimits, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			raw := mustJSON(t, out)
			for _, bad := range []string{"{{", "<no value>", "<nil>"} {
				if strings.Contains(raw, bad) {
					t.Errorf("rendered preset contains %q: %s", bad, raw)
				}
			}
		})
	}
}

// The single-node preset's script, run by bash, passes a model name with
// quotes and a command substitution to the model server as one argument
// each time, and runs nothing else.
func TestPresetScriptPassesTheModelNameAsOneWord(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	canary, argsFile := filepath.Join(dir, "pwned"), filepath.Join(dir, "args")
	model := `x" $(touch ` + canary + `) '` + "`touch " + canary + "`" + `' "y`
	vllm := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + argsFile + "\n"
	if err := os.WriteFile(filepath.Join(dir, "vllm"), []byte(vllm), 0o755); err != nil {
		t.Fatal(err)
	}
	cfgs, err := presets.Load("fleetinfer-system", "kserve-")
	if err != nil {
		t.Fatal(err)
	}
	var preset *v1alpha2.LLMInferenceServiceConfig
	for _, c := range cfgs {
		if c.Name == "kserve-"+presetTemplate {
			preset = c
		}
	}
	out, err := renderWithin(t, input(preset.Spec, argsSpec(model)), DefaultRenderLimits, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	main := out.Template.Containers[0]
	cmd := exec.Command(bash, append(main.Command[1:], "--extra")...)
	cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin"}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if _, err := os.Stat(canary); err == nil {
		t.Fatal("the model name's command ran")
	}
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSpace(string(b)), "\n")
	want := []string{"serve", "/mnt/models", "--served-model-name", model, "publishers/team/models/" + model}
	if len(args) < len(want) || strings.Join(args[:len(want)], "\x00") != strings.Join(want, "\x00") {
		t.Errorf("vllm got %q, want it to start with %q", args, want)
	}
	if args[len(args)-1] != "--extra" {
		t.Errorf("container args not passed on: %q", args)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
