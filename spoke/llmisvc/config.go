package llmisvc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Well-known preset names, without the configurable prefix ("kserve-" by
// default, as in KServe).
const (
	presetTemplate                      = "config-llm-template"
	presetDecodeTemplate                = "config-llm-decode-template"
	presetPrefillTemplate               = "config-llm-prefill-template"
	presetWorkerDataParallel            = "config-llm-worker-data-parallel"
	presetDecodeWorkerDataParallel      = "config-llm-decode-worker-data-parallel"
	presetPrefillWorkerDataParallel     = "config-llm-prefill-worker-data-parallel"
	presetWorkerPipelineParallel        = "config-llm-worker-pipeline-parallel"
	presetDecodeWorkerPipelineParallel  = "config-llm-decode-worker-pipeline-parallel"
	presetPrefillWorkerPipelineParallel = "config-llm-prefill-worker-pipeline-parallel"
	presetScheduler                     = "config-llm-scheduler"
	presetRoute                         = "config-llm-router-route"
)

// Reasons of PresetsCombined=False.
const (
	ReasonConfigNotFound         = "ConfigNotFound"
	ReasonCombineError           = "CombineBaseError"
	ReasonInvalidRenderedConfig  = "InvalidRenderedConfig"
	ReasonInvalidSchedulerConfig = "InvalidSchedulerConfig"
	ReasonValidationUnavailable  = "ValidationUnavailable"
	// ReasonUnsafePodSpec: a hub's copy asks for pods the hub's credential
	// must not be able to run (refuseUnsafePods).
	ReasonUnsafePodSpec = "UnsafePodSpec"
)

// configError is a composition failure with the reason it is reported under.
// Terminal ones wait for a watch event instead of being retried.
type configError struct {
	reason   string
	terminal bool
	err      error
}

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// GlobalConfig is cluster-wide input to preset templates, under
// .GlobalConfig as in KServe.
type GlobalConfig struct {
	SystemNamespace             string
	IngressGatewayName          string
	IngressGatewayNamespace     string
	EnableTLS                   bool
	ModelBasedRoutingHeaderName string
}

// templateData is what a preset template sees.
type templateData struct {
	metav1.ObjectMeta
	Spec         v1alpha2.LLMInferenceServiceSpec
	GlobalConfig GlobalConfig
}

// composed is the outcome of config composition.
type composed struct {
	spec    v1alpha2.LLMInferenceServiceSpec
	applied []v1alpha2.AppliedConfigRef
}

// compose merges the well-known presets, then spec.baseRefs in order, then
// the service's own spec (strategic merge: pod containers, volumes and env
// merge by name); the configs' Go templates are rendered against the merged
// spec and the service's placeholders replaced (see render). It then applies
// the controller's defaults, resolves the scheduler config and has the API
// server validate the outcome.
func (r *Reconciler) compose(ctx context.Context, svc *v1alpha2.LLMInferenceService) (*composed, error) {
	// A spec over the limit is refused before merging spends time on it.
	if _, err := (&budget{left: r.opts.RenderLimits.MaxBytes}).tree("the service's spec", svc.Spec); err != nil {
		return nil, renderError(err)
	}
	var applied []v1alpha2.AppliedConfigRef
	var bases []v1alpha2.LLMInferenceServiceSpec
	for _, ref := range svc.Spec.BaseRefs {
		cfg, err := r.config(ctx, svc.Namespace, ref.Name)
		if err != nil {
			return nil, err
		}
		bases = append(bases, cfg.Spec)
		applied = append(applied, v1alpha2.AppliedConfigRef{Name: gwapiv1.ObjectName(cfg.Name),
			Namespace: gwapiv1.Namespace(cfg.Namespace), Source: v1alpha2.AppliedConfigSourceUserRef})
	}
	// The shape of the service (scheduler, route, worker, prefill) may come
	// from baseRefs, so presets are chosen from a first merge without them.
	shape, err := v1alpha2.MergeAll(append(bases, svc.Spec))
	if err != nil {
		return nil, &configError{reason: ReasonCombineError, err: err}
	}
	var presets []v1alpha2.LLMInferenceServiceSpec
	var presetRefs []v1alpha2.AppliedConfigRef
	for _, name := range r.presetsFor(&shape) {
		cfg, err := r.config(ctx, svc.Namespace, name)
		if err != nil {
			return nil, err
		}
		presets = append(presets, cfg.Spec)
		presetRefs = append(presetRefs, v1alpha2.AppliedConfigRef{Name: gwapiv1.ObjectName(cfg.Name),
			Namespace: gwapiv1.Namespace(cfg.Namespace), Source: v1alpha2.AppliedConfigSourcePreset})
	}
	configs, err := v1alpha2.MergeAll(append(presets, bases...))
	if err != nil {
		return nil, &configError{reason: ReasonCombineError, err: err}
	}
	rendered, err := render(renderInput{meta: svc.ObjectMeta, global: r.opts.Global, configs: configs, service: svc.Spec}, r.opts.RenderLimits)
	if err != nil {
		return nil, renderError(err)
	}
	r.applyDefaults(svc, rendered)
	if err := refuseUnsafePods(svc, rendered); err != nil {
		return nil, err
	}
	if err := r.resolveSchedulerConfig(ctx, svc.Namespace, rendered); err != nil {
		return nil, err
	}
	if err := r.validateRendered(ctx, svc, rendered); err != nil {
		return nil, err
	}
	return &composed{spec: *rendered, applied: append(presetRefs, applied...)}, nil
}

// refuseUnsafePods refuses a copy the hub wrote whose composed pods would
// run under a ServiceAccount other than the service's own, privileged, or
// on the host (LLMInferenceServiceSpec.UnsafePods): a stolen hub
// credential must not run pods as the spoke's controllers, even where the
// admission policy that refuses such writes is missing or older. The
// composed spec is checked, so configs the hub wrote are too. The spoke's
// own services are its admin's, under its Pod Security levels.
func refuseUnsafePods(svc *v1alpha2.LLMInferenceService, spec *v1alpha2.LLMInferenceServiceSpec) error {
	if !fleetv1alpha1.IsManagedByHub(svc) {
		return nil
	}
	if unsafe := spec.UnsafePods(eppSAName(svc)); len(unsafe) > 0 {
		return &configError{reason: ReasonUnsafePodSpec, terminal: true,
			err: fmt.Errorf("a copy from a fleetinfer hub may not run pods with %s", strings.Join(unsafe, "; "))}
	}
	return nil
}

// renderError is a rendering failure with its reason; none is retried
// before the service or a config changes.
func renderError(err error) error {
	var le *limitError
	var pe *placeholderError
	switch {
	case errors.As(err, &le):
		return &configError{reason: ReasonRenderLimitExceeded, terminal: true, err: err}
	case errors.As(err, &pe):
		return &configError{reason: ReasonUnsupportedPlaceholder, terminal: true, err: err}
	default:
		return &configError{reason: ReasonInvalidRenderedConfig, terminal: true, err: fmt.Errorf("render config templates: %w", err)}
	}
}

// presetsFor chooses the well-known presets for a service's shape, lowest
// precedence first.
func (r *Reconciler) presetsFor(s *v1alpha2.LLMInferenceServiceSpec) []string {
	var names []string
	if s.Router != nil && s.Router.Scheduler != nil && (s.Router.Scheduler.Pool == nil || s.Router.Scheduler.Pool.Ref == nil) {
		names = append(names, presetScheduler)
	}
	if s.Router != nil && s.Router.Route != nil && (s.Router.Route.HTTP == nil || len(s.Router.Route.HTTP.Refs) == 0) {
		names = append(names, presetRoute)
	}
	workload := func(w *v1alpha2.WorkloadSpec, single, data, pipeline string) string {
		switch {
		case w.Worker == nil:
			return single
		case w.Parallelism != nil && (w.Parallelism.Data != nil || w.Parallelism.DataLocal != nil):
			return data
		default:
			return pipeline
		}
	}
	if s.Prefill != nil {
		names = append(names,
			workload(s.Prefill, presetPrefillTemplate, presetPrefillWorkerDataParallel, presetPrefillWorkerPipelineParallel),
			workload(&s.WorkloadSpec, presetDecodeTemplate, presetDecodeWorkerDataParallel, presetDecodeWorkerPipelineParallel))
	} else {
		names = append(names, workload(&s.WorkloadSpec, presetTemplate, presetWorkerDataParallel, presetWorkerPipelineParallel))
	}
	for i := range names {
		names[i] = r.opts.PresetPrefix + names[i]
	}
	return names
}

// config looks a config up in the service's namespace, then in the system
// namespace.
func (r *Reconciler) config(ctx context.Context, ns, name string) (*v1alpha2.LLMInferenceServiceConfig, error) {
	cfg := &v1alpha2.LLMInferenceServiceConfig{}
	for _, n := range []string{ns, r.opts.SystemNamespace} {
		err := r.Get(ctx, client.ObjectKey{Namespace: n, Name: name}, cfg)
		if err == nil {
			return cfg, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	return nil, &configError{reason: ReasonConfigNotFound, terminal: true,
		err: fmt.Errorf("LLMInferenceServiceConfig %q not found in namespace %q or the system namespace %q", name, ns, r.opts.SystemNamespace)}
}

// applyDefaults fills what the controller defaults after merging: the pool
// selector and picker reference, the EPP service account, the route's
// parents and backends.
func (r *Reconciler) applyDefaults(svc *v1alpha2.LLMInferenceService, s *v1alpha2.LLMInferenceServiceSpec) {
	if s.Router == nil {
		return
	}
	if sch := s.Router.Scheduler; sch != nil {
		if sch.Pool == nil {
			sch.Pool = &v1alpha2.InferencePoolSpec{}
		}
		if sch.Pool.Ref == nil {
			if sch.Pool.Spec == nil {
				sch.Pool.Spec = &igwapiv1.InferencePoolSpec{}
			}
			p := sch.Pool.Spec
			if len(p.Selector.MatchLabels) == 0 {
				p.Selector.MatchLabels = map[igwapiv1.LabelKey]igwapiv1.LabelValue{}
				for k, v := range workloadSelector(svc) {
					p.Selector.MatchLabels[igwapiv1.LabelKey(k)] = igwapiv1.LabelValue(v)
				}
			}
			if len(p.TargetPorts) == 0 {
				p.TargetPorts = []igwapiv1.Port{{Number: 8000}}
			}
			if p.EndpointPickerRef.Name == "" {
				p.EndpointPickerRef.Name = igwapiv1.ObjectName(eppServiceName(svc))
			}
			if p.EndpointPickerRef.Kind == "" {
				p.EndpointPickerRef.Kind = "Service"
			}
			if p.EndpointPickerRef.Port == nil {
				p.EndpointPickerRef.Port = &igwapiv1.Port{Number: 9002}
			}
		}
		if sch.Template != nil && sch.Template.ServiceAccountName == "" {
			sch.Template.ServiceAccountName = eppSAName(svc)
		}
	}
	route := s.Router.Route
	if route == nil || route.HTTP == nil || route.HTTP.Spec == nil {
		return
	}
	if gw := s.Router.Gateway; gw != nil && len(gw.Refs) > 0 {
		route.HTTP.Spec.ParentRefs = nil
		for _, ref := range gw.Refs {
			pr := gwapiv1.ParentReference{Name: ref.Name, SectionName: ref.SectionName}
			if ref.Namespace != "" {
				pr.Namespace = ptr.To(ref.Namespace)
			}
			route.HTTP.Spec.ParentRefs = append(route.HTTP.Spec.ParentRefs, pr)
		}
	}
	// Backends point at the managed pool in the presets; without a scheduler
	// they go to the workload Service, with a pool ref to that pool.
	for i := range route.HTTP.Spec.Rules {
		for j := range route.HTTP.Spec.Rules[i].BackendRefs {
			b := &route.HTTP.Spec.Rules[i].BackendRefs[j].BackendObjectReference
			if b.Kind == nil || *b.Kind != "InferencePool" || string(b.Name) != poolName(svc) {
				continue
			}
			switch {
			case s.Router.Scheduler == nil:
				b.Group, b.Kind = ptr.To(gwapiv1.Group("")), ptr.To(gwapiv1.Kind("Service"))
				b.Name, b.Port = gwapiv1.ObjectName(workloadServiceName(svc)), ptr.To(gwapiv1.PortNumber(8000))
			case s.Router.Scheduler.Pool != nil && s.Router.Scheduler.Pool.Ref != nil:
				b.Name = gwapiv1.ObjectName(s.Router.Scheduler.Pool.Ref.Name)
			}
		}
	}
}

// resolveSchedulerConfig checks the inline/ref choice (which the schema
// cannot, inline having no schema) and replaces a ConfigMap ref with the
// text it points to.
func (r *Reconciler) resolveSchedulerConfig(ctx context.Context, ns string, s *v1alpha2.LLMInferenceServiceSpec) error {
	if s.Router == nil || s.Router.Scheduler == nil || s.Router.Scheduler.Config == nil {
		return nil
	}
	c := s.Router.Scheduler.Config
	invalid := func(format string, args ...any) error {
		return &configError{reason: ReasonInvalidSchedulerConfig, terminal: true,
			err: fmt.Errorf("spec.router.scheduler.config: "+format, args...)}
	}
	switch {
	case c.Inline != nil && c.Ref != nil:
		return invalid("both inline and ref are set, either specify inline or ref")
	case c.Inline == nil && c.Ref == nil:
		return invalid("either inline or ref is required")
	case c.Ref != nil:
		key := c.Ref.Key
		if key == "" {
			key = "epp"
		}
		cm := &corev1.ConfigMap{}
		var text string
		found := false
		for _, n := range []string{ns, r.opts.SystemNamespace} {
			err := r.Get(ctx, client.ObjectKey{Namespace: n, Name: c.Ref.Name}, cm)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			text, found = cm.Data[key]
			if !found {
				return invalid("ConfigMap %s/%s has no key %q", n, c.Ref.Name, key)
			}
			break
		}
		if !found {
			return &configError{reason: ReasonConfigNotFound, terminal: true,
				err: fmt.Errorf("scheduler config ConfigMap %q not found in namespace %q or %q", c.Ref.Name, ns, r.opts.SystemNamespace)}
		}
		raw, err := json.Marshal(text)
		if err != nil {
			return err
		}
		c.Inline, c.Ref = &runtime.RawExtension{Raw: raw}, nil
	}
	if _, err := schedulerConfigText(c.Inline); err != nil {
		return invalid("inline configuration is invalid: %v", err)
	}
	return nil
}

// schedulerConfigText returns an inline EndpointPickerConfig as YAML text.
// KServe accepts it as an object or as a YAML string.
func schedulerConfigText(inline *runtime.RawExtension) (string, error) {
	raw := bytes.TrimSpace(inline.Raw)
	if len(raw) == 0 {
		return "", errors.New("empty")
	}
	var text string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return "", err
		}
	} else {
		b, err := yaml.JSONToYAML(raw)
		if err != nil {
			return "", err
		}
		text = string(b)
	}
	var probe map[string]any
	if err := yaml.Unmarshal([]byte(text), &probe); err != nil {
		return "", err
	}
	if len(probe) == 0 {
		return "", errors.New("not a YAML object")
	}
	if k, _ := probe["kind"].(string); k != "" && k != "EndpointPickerConfig" {
		return "", fmt.Errorf("kind %q, want EndpointPickerConfig", k)
	}
	return text, nil
}

// validateRendered asks the API server to validate the composed spec (schema
// and CEL rules) through a dry-run create, as KServe does, so a preset or
// baseRef cannot produce what a user could not have written.
func (r *Reconciler) validateRendered(ctx context.Context, svc *v1alpha2.LLMInferenceService, spec *v1alpha2.LLMInferenceServiceSpec) error {
	probe := &v1alpha2.LLMInferenceService{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, GenerateName: strings.TrimRight(childName(svc.Name, "-validation"), "-") + "-"},
		Spec:       *spec.DeepCopy(),
	}
	probe.Spec.BaseRefs = nil
	err := r.Create(ctx, probe, client.DryRunAll)
	switch {
	case err == nil:
		return nil
	case apierrors.IsInvalid(err):
		return &configError{reason: ReasonInvalidRenderedConfig, terminal: true, err: fmt.Errorf("the composed spec is invalid: %w", err)}
	default:
		return &configError{reason: ReasonValidationUnavailable, err: fmt.Errorf("validate composed spec: %w", err)}
	}
}
