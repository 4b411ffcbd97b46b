package llmisvc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Rendering trusts configs, not services. The Go templates in string values
// of LLMInferenceServiceConfigs (the well-known presets and baseRefs) are
// executed, restricted and bounded; the service's own spec is data in which a
// closed set of placeholders is replaced by values (KServe's samples use
// `{{ .Spec.Model.Name }}` and `{{ ChildName .ObjectMeta.Name `-epp-service` }}`
// in services) and anything else between `{{` and `}}` is refused, never run.

// RenderLimits bound the rendering of one service.
type RenderLimits struct {
	// MaxBytes bounds the service's spec, the merged configs and the output
	// of rendering, each as JSON.
	MaxBytes int
	// Timeout bounds the execution of config templates.
	Timeout time.Duration
}

// DefaultRenderLimits: KServe's presets render to about 10 KiB, and an
// object over 1.5 MiB does not fit etcd, children included.
var DefaultRenderLimits = RenderLimits{MaxBytes: 1 << 20, Timeout: time.Second}

// Reasons of PresetsCombined=False from rendering.
const (
	ReasonRenderLimitExceeded    = "RenderLimitExceeded"
	ReasonUnsupportedPlaceholder = "UnsupportedPlaceholder"
)

// renderInput is what rendering reads.
type renderInput struct {
	meta   metav1.ObjectMeta
	global GlobalConfig
	// configs is the merged presets and baseRefs: the only templates.
	configs v1alpha2.LLMInferenceServiceSpec
	// service is the service's own spec, merged over the rendered configs.
	service v1alpha2.LLMInferenceServiceSpec
}

// render substitutes the service's placeholders, executes the config
// templates against the configs merged with the substituted service (as
// .Spec, the model name defaulted to the service's name), and merges the
// service over the rendered configs.
func render(in renderInput, lim RenderLimits) (*v1alpha2.LLMInferenceServiceSpec, error) {
	b := &budget{left: lim.MaxBytes, deadline: time.Now().Add(lim.Timeout)}
	rawConfigs, err := b.tree("the merged configs", in.configs)
	if err != nil {
		return nil, err
	}
	rawService, err := b.tree("the service's spec", in.service)
	if err != nil {
		return nil, err
	}
	model := ptr.Deref(in.service.Model.Name, ptr.Deref(in.configs.Model.Name, ""))
	if model == "" {
		model = in.meta.Name
	}
	if bytes.Contains(rawService, []byte("{{")) {
		p := placeholders(in.meta, in.global, model)
		if rawService, err = rewriteStrings(rawService, func(s string) (string, error) { return b.substitute(s, p) }); err != nil {
			return nil, err
		}
	}
	var service v1alpha2.LLMInferenceServiceSpec
	if err := json.Unmarshal(rawService, &service); err != nil {
		return nil, fmt.Errorf("rendered service: %w", err)
	}
	if bytes.Contains(rawConfigs, []byte("{{")) {
		merged, err := v1alpha2.MergeSpecs(in.configs, service)
		if err != nil {
			return nil, err
		}
		if ptr.Deref(merged.Model.Name, "") == "" {
			merged.Model.Name = ptr.To(in.meta.Name)
		}
		data := view(reflect.ValueOf(templateData{ObjectMeta: in.meta, Spec: merged, GlobalConfig: in.global}))
		funcs := b.configFuncs()
		if rawConfigs, err = rewriteStrings(rawConfigs, func(s string) (string, error) { return b.execute(s, funcs, data) }); err != nil {
			return nil, err
		}
	}
	var configs v1alpha2.LLMInferenceServiceSpec
	if err := json.Unmarshal(rawConfigs, &configs); err != nil {
		return nil, fmt.Errorf("rendered configs: %w", err)
	}
	out, err := v1alpha2.MergeSpecs(configs, service)
	if err != nil {
		return nil, err
	}
	if ptr.Deref(out.Model.Name, "") == "" {
		out.Model.Name = ptr.To(in.meta.Name)
	}
	if _, err := (&budget{left: lim.MaxBytes}).tree("the rendered spec", out); err != nil {
		return nil, err
	}
	return &out, nil
}

// limitError is rendering over a RenderLimits bound.
type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }

// pathError is a rendering error in the string value at path, its message
// clipped: it ends up in a condition and an Event.
type pathError struct {
	path string
	err  error
}

func (e *pathError) Error() string {
	const max = 512
	msg := e.err.Error()
	if len(msg) > max {
		msg = strings.ToValidUTF8(msg[:max], "") + "…"
	}
	return e.path + ": " + msg
}

func (e *pathError) Unwrap() error { return e.err }

// placeholderError is a `{{ … }}` in the service's spec that is not one of
// its placeholders.
type placeholderError struct{ msg string }

func (e *placeholderError) Error() string { return e.msg }

// budget is what is left of one rendering's bounds. Config templates have
// no loops, no recursion and no methods (see checkTemplate and view), so
// their work is linear in their size between two points where the budget is
// charged: every write and every call of a function of configFuncs.
type budget struct {
	left     int
	deadline time.Time
}

func (b *budget) charge(n int) error {
	if n > b.left {
		return &limitError{"rendering produced more than the limit of bytes"}
	}
	b.left -= n
	if time.Now().After(b.deadline) {
		return &limitError{"rendering took longer than its time limit"}
	}
	return nil
}

// tree is v as JSON, within the byte limit (which it does not charge: the
// limit bounds each of input and output).
func (b *budget) tree(what string, v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(raw) > b.left {
		return nil, &limitError{fmt.Sprintf("%s is %d bytes as JSON, over the limit of %d", what, len(raw), b.left)}
	}
	return raw, nil
}

// rewriteStrings replaces every string value containing "{{" in the JSON
// document raw with f's result; each value is a template or data on its
// own, so no output can break out of its string. Errors name the path.
func rewriteStrings(raw []byte, f func(string) (string, error)) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	var walk func(path string, v any) (any, error)
	walk = func(path string, v any) (any, error) {
		switch v := v.(type) {
		case string:
			if !strings.Contains(v, "{{") {
				return v, nil
			}
			s, err := f(v)
			if err != nil {
				return nil, &pathError{path: path, err: err}
			}
			return s, nil
		case map[string]any:
			for k, e := range v {
				var err error
				if v[k], err = walk(path+"."+k, e); err != nil {
					return nil, err
				}
			}
		case []any:
			for i, e := range v {
				var err error
				if v[i], err = walk(path+"["+strconv.Itoa(i)+"]", e); err != nil {
					return nil, err
				}
			}
		}
		return v, nil
	}
	doc, err := walk("spec", doc)
	if err != nil {
		return nil, err
	}
	return json.Marshal(doc)
}

// configFuncs are the functions config templates may call, besides the
// constant-time builtins in allowedBuiltins. Each charges the budget for
// what it returns, whether or not it is written.
func (b *budget) configFuncs() template.FuncMap {
	charged := func(s string) (string, error) { return s, b.charge(len(s)) }
	return template.FuncMap{
		"ChildName": func(parent, suffix string) (string, error) { return charged(childName(parent, suffix)) },
		// shellQuote joins its arguments into one single-quoted shell word,
		// for values in `bash -c` scripts.
		"shellQuote": func(parts ...any) (string, error) {
			var s strings.Builder
			for _, p := range parts {
				if p != nil {
					fmt.Fprint(&s, p)
				}
			}
			return charged("'" + strings.ReplaceAll(s.String(), "'", `'\''`) + "'")
		},
		// toJSON encodes a value, for values embedded in JSON text.
		"toJSON": func(v any) (string, error) {
			out, err := json.Marshal(v)
			if err != nil {
				return "", err
			}
			return charged(string(out))
		},
	}
}

// allowedBuiltins are text/template's builtins that take constant or
// linear time and allocate nothing large; printf and its kin can pad to a
// megabyte per verb.
var allowedBuiltins = map[string]bool{"and": true, "or": true, "not": true, "eq": true, "ne": true,
	"lt": true, "le": true, "gt": true, "ge": true, "len": true, "index": true}

// execute runs one config string as a template against data.
func (b *budget) execute(text string, funcs template.FuncMap, data any) (string, error) {
	t, err := template.New("config").Option("missingkey=error").Funcs(funcs).Parse(text)
	if err != nil {
		return "", err
	}
	if err := checkTemplate(t, funcs); err != nil {
		return "", err
	}
	var out strings.Builder
	if err := t.Execute(&chargedWriter{b: b, w: &out}, data); err != nil {
		var le *limitError
		if errors.As(err, &le) {
			return "", le
		}
		return "", err
	}
	return out.String(), nil
}

type chargedWriter struct {
	b *budget
	w *strings.Builder
}

func (w *chargedWriter) Write(p []byte) (int, error) {
	if err := w.b.charge(len(p)); err != nil {
		return 0, err
	}
	return w.w.Write(p)
}

// checkTemplate refuses what could make a config template run without
// bound: loops, template definitions and calls (recursion), and functions
// other than funcs and allowedBuiltins.
func checkTemplate(t *template.Template, funcs template.FuncMap) error {
	if len(t.Templates()) > 1 {
		return errors.New("config templates may not define templates")
	}
	var check func(n parse.Node) error
	checkAll := func(nodes ...parse.Node) error {
		for _, n := range nodes {
			if n == nil || reflect.ValueOf(n).IsNil() {
				continue
			}
			if err := check(n); err != nil {
				return err
			}
		}
		return nil
	}
	check = func(n parse.Node) error {
		switch n := n.(type) {
		case *parse.ListNode:
			return checkAll(nodesOf(n.Nodes)...)
		case *parse.ActionNode:
			return checkAll(n.Pipe)
		case *parse.IfNode:
			return checkAll(n.Pipe, n.List, n.ElseList)
		case *parse.WithNode:
			return checkAll(n.Pipe, n.List, n.ElseList)
		case *parse.PipeNode:
			for _, c := range n.Cmds {
				if err := checkAll(nodesOf(c.Args)...); err != nil {
					return err
				}
			}
			return nil
		case *parse.ChainNode:
			return checkAll(n.Node)
		case *parse.IdentifierNode:
			if _, ok := funcs[n.Ident]; !ok && !allowedBuiltins[n.Ident] {
				return fmt.Errorf("function %q is not available to config templates", n.Ident)
			}
			return nil
		case *parse.RangeNode:
			return errors.New("range is not allowed in config templates")
		case *parse.TemplateNode:
			return errors.New("template calls are not allowed in config templates")
		default:
			return nil
		}
	}
	return check(t.Tree.Root)
}

func nodesOf[N parse.Node](ns []N) []parse.Node {
	out := make([]parse.Node, len(ns))
	for i, n := range ns {
		out[i] = n
	}
	return out
}

// view is v as plain maps, slices and scalars keyed by Go field names, as
// templates address them, so that templates can reach fields but call no
// methods (DeepCopy, String, ...) on the data. Embedded structs are reachable
// by their type name and promoted; types with their own JSON form
// (quantities, times, raw extensions) are that form.
func view(v reflect.Value) any {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if m, ok := marshaler(v); ok {
		raw, err := m.MarshalJSON()
		var out any
		if err != nil || json.Unmarshal(raw, &out) != nil {
			return nil
		}
		return out
	}
	switch v.Kind() {
	case reflect.Struct:
		out := map[string]any{}
		var promoted []map[string]any
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			fv := view(v.Field(i))
			out[f.Name] = fv
			if m, ok := fv.(map[string]any); ok && f.Anonymous {
				promoted = append(promoted, m)
			}
		}
		for _, m := range promoted {
			for k, e := range m {
				if _, taken := out[k]; !taken {
					out[k] = e
				}
			}
		}
		return out
	case reflect.Map:
		out := make(map[string]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			out[fmt.Sprint(it.Key().Interface())] = view(it.Value())
		}
		return out
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return string(v.Bytes())
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = view(v.Index(i))
		}
		return out
	case reflect.String:
		return v.String()
	case reflect.Bool:
		return v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return v.Uint()
	case reflect.Float32, reflect.Float64:
		return v.Float()
	default:
		return nil
	}
}

var marshalerType = reflect.TypeFor[json.Marshaler]()

// marshaler is v's own JSON encoder, if its type or pointer type has one.
func marshaler(v reflect.Value) (json.Marshaler, bool) {
	if v.Type().Implements(marshalerType) {
		return v.Interface().(json.Marshaler), true
	}
	if reflect.PointerTo(v.Type()).Implements(marshalerType) {
		p := reflect.New(v.Type())
		p.Elem().Set(v)
		return p.Interface().(json.Marshaler), true
	}
	return nil, false
}

// placeholders are the values the service's own spec may refer to: the
// template forms KServe's presets and samples use for them.
func placeholders(meta metav1.ObjectMeta, global GlobalConfig, model string) map[string]string {
	return map[string]string{
		".Spec.Model.Name":                          model,
		".ObjectMeta.Name":                          meta.Name,
		".Name":                                     meta.Name,
		".ObjectMeta.Namespace":                     meta.Namespace,
		".Namespace":                                meta.Namespace,
		".GlobalConfig.SystemNamespace":             global.SystemNamespace,
		".GlobalConfig.IngressGatewayName":          global.IngressGatewayName,
		".GlobalConfig.IngressGatewayNamespace":     global.IngressGatewayNamespace,
		".GlobalConfig.ModelBasedRoutingHeaderName": global.ModelBasedRoutingHeaderName,
		".GlobalConfig.EnableTLS":                   strconv.FormatBool(global.EnableTLS),
	}
}

// substitute replaces the placeholders in one string of the service's spec:
// `{{ P }}` for a P of values, `{{ ChildName N "suffix" }}` for a name N of
// values, and `{{ "text" }}` (text/template's escape for literal braces);
// `{{-` and `-}}` trim spaces as in text/template. Nothing is evaluated.
func (b *budget) substitute(s string, values map[string]string) (string, error) {
	var out strings.Builder
	for {
		open := strings.Index(s, "{{")
		if open < 0 {
			break
		}
		end := actionEnd(s[open+2:])
		if end < 0 {
			break
		}
		action := s[open+2 : open+2+end]
		before, rest := s[:open], s[open+2+end+2:]
		if strings.HasPrefix(action, "- ") {
			before, action = strings.TrimRight(before, " \t\r\n"), action[2:]
		}
		if strings.HasSuffix(action, " -") {
			rest, action = strings.TrimLeft(rest, " \t\r\n"), action[:len(action)-2]
		}
		v, err := placeholder(strings.TrimSpace(action), values)
		if err != nil {
			return "", err
		}
		if err := b.charge(len(before) + len(v)); err != nil {
			return "", err
		}
		out.WriteString(before)
		out.WriteString(v)
		s = rest
	}
	if err := b.charge(len(s)); err != nil {
		return "", err
	}
	out.WriteString(s)
	return out.String(), nil
}

// actionEnd is the index of the "}}" closing the action that s starts, past
// a quoted literal if the action is one.
func actionEnd(s string) int {
	body := strings.TrimLeft(strings.TrimPrefix(s, "-"), " \t\r\n")
	skip := len(s) - len(body)
	if body != "" && (body[0] == '"' || body[0] == '`') {
		for i := 1; i < len(body); i++ {
			switch {
			case body[0] == '"' && body[i] == '\\':
				i++
			case body[i] == body[0]:
				if end := strings.Index(body[i+1:], "}}"); end >= 0 {
					return skip + i + 1 + end
				}
				return -1
			}
		}
	}
	return strings.Index(s, "}}")
}

func placeholder(action string, values map[string]string) (string, error) {
	if v, ok := values[action]; ok {
		return v, nil
	}
	if lit, err := strconv.Unquote(action); err == nil && action != "" && strings.ContainsRune("\"`", rune(action[0])) {
		return lit, nil
	}
	if f := strings.Fields(action); len(f) == 3 && f[0] == "ChildName" {
		parent, ok := values[f[1]]
		suffix, err := strconv.Unquote(f[2])
		if ok && err == nil {
			return childName(parent, suffix), nil
		}
	}
	const shown = 64
	if len(action) > shown {
		action = strings.ToValidUTF8(action[:shown], "") + "…"
	}
	return "", &placeholderError{fmt.Sprintf("{{%s}} is not a placeholder: a service's own fields are data, "+
		"where only {{ .Spec.Model.Name }}, {{ .ObjectMeta.Name }}, {{ .ObjectMeta.Namespace }}, {{ .GlobalConfig.<field> }}, "+
		"{{ ChildName .ObjectMeta.Name \"<suffix>\" }} and {{ \"<literal>\" }} are replaced; templates belong in an LLMInferenceServiceConfig", action)}
}
