package llmisvc

import (
	"testing"

	"k8s.io/utils/ptr"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

func poolRef(name string) gwapiv1.HTTPBackendRef {
	return gwapiv1.HTTPBackendRef{BackendRef: gwapiv1.BackendRef{BackendObjectReference: gwapiv1.BackendObjectReference{
		Group: ptr.To(gwapiv1.Group("inference.networking.k8s.io")), Kind: ptr.To(gwapiv1.Kind("InferencePool")),
		Name: gwapiv1.ObjectName(name)}}}
}

func TestForwardedRuleTakesParentModeRequestsToThePoolUnrewritten(t *testing.T) {
	rewrite := gwapiv1.HTTPRouteFilter{Type: gwapiv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwapiv1.HTTPURLRewriteFilter{
		Path: &gwapiv1.HTTPPathModifier{Type: gwapiv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/")}}}
	prefix := []gwapiv1.HTTPRouteMatch{{Path: &gwapiv1.HTTPPathMatch{Type: ptr.To(gwapiv1.PathMatchPathPrefix), Value: ptr.To("/team/llama")}}}
	timeouts := &gwapiv1.HTTPRouteTimeouts{Request: ptr.To(gwapiv1.Duration("0s"))}
	for _, tc := range []struct {
		name      string
		rules     []gwapiv1.HTTPRouteRule
		wantRules int
	}{
		{name: "a rule to the pool behind a prefix rewrite is copied without the rewrite",
			rules:     []gwapiv1.HTTPRouteRule{{Name: ptr.To(gwapiv1.SectionName("main")), Matches: prefix, Filters: []gwapiv1.HTTPRouteFilter{rewrite}, BackendRefs: []gwapiv1.HTTPBackendRef{poolRef("llama-inference-pool")}, Timeouts: timeouts}},
			wantRules: 2},
		{name: "a route to another backend gets no rule",
			rules:     []gwapiv1.HTTPRouteRule{{Matches: prefix, BackendRefs: []gwapiv1.HTTPBackendRef{poolRef("other-pool")}}},
			wantRules: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &gwapiv1.HTTPRouteSpec{Rules: tc.rules}
			addForwardedRule(spec, "team", "llama-inference-pool")
			if len(spec.Rules) != tc.wantRules {
				t.Fatalf("%d rules, want %d", len(spec.Rules), tc.wantRules)
			}
			if tc.wantRules == 1 {
				return
			}
			if len(spec.Rules[0].Filters) != 1 {
				t.Error("the service's own rule lost its rewrite")
			}
			fwd := spec.Rules[1]
			if fwd.Name != nil || len(fwd.Filters) != 0 || fwd.Timeouts == nil || *fwd.Timeouts.Request != "0s" {
				t.Errorf("forwarded rule %+v: want no name, no rewrite, the rule's timeouts", fwd)
			}
			if len(fwd.Matches) != 1 || *fwd.Matches[0].Path.Value != "/" || len(fwd.Matches[0].Headers) != 1 ||
				fwd.Matches[0].Headers[0].Name != fleetv1alpha1.ForwardedPoolHeader || fwd.Matches[0].Headers[0].Value != "team/llama-inference-pool" {
				t.Errorf("forwarded rule matches %+v, want any path with %s: team/llama-inference-pool", fwd.Matches, fleetv1alpha1.ForwardedPoolHeader)
			}
			if string(fwd.BackendRefs[0].Name) != "llama-inference-pool" {
				t.Errorf("forwarded rule goes to %s", fwd.BackendRefs[0].Name)
			}
		})
	}
}
