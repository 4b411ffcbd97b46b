package epp

import (
	"crypto/tls"
	"slices"
	"testing"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"k8s.io/apimachinery/pkg/types"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	"github.com/fleetinfer/fleetinfer/epp/marks"
)

func setHeaders(h *extProcPb.HeaderMutation) map[string]string {
	out := map[string]string{}
	for _, o := range h.SetHeaders {
		out[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
	}
	return out
}

// A forwarded request names its pool, so the other cluster's route takes it
// although the entry route's URL rewrite changed its path; a request that
// arrived forwarded and is served here leaves without the header, as
// without its marks.
func TestParentModePicksNameThePoolAndServedForwardsDropIt(t *testing.T) {
	ca, err := federationtest.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue("spiffe://fleetinfer.io/cluster/east/ns/team/llminferenceservice/llama")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	m := &marker{cluster: "east", pool: types.NamespacedName{Namespace: "team", Name: "llama-inference-pool"},
		cert: func() *tls.Certificate { return &cert }, now: time.Now}
	hs, err := m.sign("10.1.0.5:8000")
	if err != nil {
		t.Fatal(err)
	}

	forwarded := &extProcPb.HeaderMutation{}
	markMutation(forwarded, &pick{marks: hs})
	set := setHeaders(forwarded)
	if got := set[fleetv1alpha1.ForwardedPoolHeader]; got != "team/llama-inference-pool" {
		t.Errorf("%s = %q, want team/llama-inference-pool", fleetv1alpha1.ForwardedPoolHeader, got)
	}
	for _, name := range marks.Headers {
		if _, ok := set[name]; !ok {
			t.Errorf("the forwarded request lacks the mark %s", name)
		}
	}

	served := &extProcPb.HeaderMutation{}
	markMutation(served, &pick{carried: true})
	if !slices.Contains(served.RemoveHeaders, fleetv1alpha1.ForwardedPoolHeader) {
		t.Errorf("a forwarded request served here keeps %s: removes %v", fleetv1alpha1.ForwardedPoolHeader, served.RemoveHeaders)
	}
}
