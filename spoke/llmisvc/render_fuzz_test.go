package llmisvc

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// FuzzRender renders a config template and a service value of any text
// within small limits: rendering returns within its time budget (plus
// slack for a loaded machine), its output stays within the byte limit, and
// the service's values without placeholders come out unchanged.
func FuzzRender(f *testing.F) {
	f.Add("{{ .Spec.Model.Name }}", "{{ .ObjectMeta.Name }}", "m")
	f.Add("{{range 100000000000}}{{end}}", "{{range 100000000000}}{{end}}", `x" $(touch /tmp/pwned) "y`)
	f.Add(`{{ shellQuote "p/" .Namespace .Spec.Model.Name }}`, `{{ "{{" }} {{- .GlobalConfig.EnableTLS -}} }}`, "'")
	f.Add(`{{define "a"}}{{template "a" .}}{{end}}{{template "a" .}}`, "{{ ChildName .ObjectMeta.Name `-x` }}", "")
	f.Add(`{{ if toJSON .Spec }}{{ toJSON .Spec }}{{ toJSON .Spec }}{{ end }}`, "a", strings.Repeat("b", 30000))
	f.Add(`{{ with .Spec.Parallelism }}{{ or .Tensor 1 }}{{ else }}{{ index .Spec.Template.Containers 0 }}{{ end }}`, `{{- "x" -}}`, "m")
	lim := RenderLimits{MaxBytes: 64 << 10, Timeout: 50 * time.Millisecond}
	f.Fuzz(func(t *testing.T, config, value, model string) {
		// Objects reach the controller as JSON, always valid UTF-8.
		if !utf8.ValidString(config) || !utf8.ValidString(value) || !utf8.ValidString(model) {
			return
		}
		configs := argsSpec("", config)
		configs.Model = v1alpha2.LLMModelSpec{}
		service := argsSpec(model, value, "plain")
		start := time.Now()
		out, err := render(input(configs, service), lim)
		if d := time.Since(start); d > lim.Timeout+2*time.Second {
			t.Fatalf("rendering took %s", d)
		}
		if err != nil {
			return
		}
		if n := len(mustJSON(t, out)); n > lim.MaxBytes {
			t.Fatalf("rendered %d bytes, over %d", n, lim.MaxBytes)
		}
		args := out.Template.Containers[0].Args
		if !strings.Contains(value, "{{") && (len(args) != 2 || args[0] != value || args[1] != "plain") {
			t.Fatalf("service args %q came out as %q", []string{value, "plain"}, args)
		}
		if model != "" && !strings.Contains(model, "{{") && ptr.Deref(out.Model.Name, "") != model {
			t.Fatalf("model %q came out as %q", model, ptr.Deref(out.Model.Name, ""))
		}
	})
}
