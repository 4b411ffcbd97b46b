package epp

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"strings"
	"time"

	configPb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/marks"
)

// marker signs the marks of this picker's Parent-mode picks and verifies
// those of requests other clusters' pickers forwarded here (package marks).
// A nil marker (federation off) signs nothing and verifies nothing: marks
// a request carries are then rejected.
type marker struct {
	cluster  string
	pool     types.NamespacedName
	cert     func() *tls.Certificate
	verifier *marks.Verifier
	now      func() time.Time
}

// forwardHeaders are the headers a Parent-mode pick adds to the request: the
// signed marks, and the pool the request is for, by which the other
// cluster's route takes it (fleetv1alpha1.ForwardedPoolHeader).
var forwardHeaders = append(slices.Clone(marks.Headers), fleetv1alpha1.ForwardedPoolHeader)

// sign returns the headers of a Parent-mode pick of pods (forwardHeaders).
func (m *marker) sign(pods string) ([][2]string, error) {
	if m == nil {
		return nil, errors.New("federation is off: no key to sign Parent-mode marks with")
	}
	hs, err := marks.Sign(marks.Mark{Origin: m.cluster, Pool: m.pool, Pods: pods, Hops: 1,
		Expires: m.now().Add(marks.Lifetime).Unix()}, m.cert())
	if err != nil {
		return nil, err
	}
	return append(hs, [2]string{fleetv1alpha1.ForwardedPoolHeader, m.pool.String()}), nil
}

// read verifies the mark headers of a request, records the outcome in p and
// counts it. Marks that do not verify are ignored as if absent.
func (m *marker) read(ctx context.Context, hm *configPb.HeaderMap, p *pick) {
	var carried map[string]string
	for _, h := range hm.GetHeaders() {
		if !strings.HasPrefix(h.GetKey(), "x-fleetinfer-") {
			continue
		}
		if carried == nil {
			carried = map[string]string{}
		}
		carried[h.GetKey()] = headerValue(h)
	}
	get := func(name string) (string, bool) { v, ok := carried[name]; return v, ok }
	var (
		mk  marks.Mark
		err error
	)
	switch {
	case m != nil:
		mk, err = m.verifier.Verify(get)
	case anyMark(get):
		err = errors.New("federation is off: no peers to verify marks from")
	default:
		err = marks.ErrAbsent
	}
	switch {
	case errors.Is(err, marks.ErrAbsent):
		parentMarksAbsent.Inc()
	case err != nil:
		p.carried = true
		parentMarks.WithLabelValues("rejected").Inc()
		log.FromContext(ctx).V(1).Info("Parent-mode marks rejected; picking as for a client request", "reason", err.Error(), "origin", carried[marks.Origin])
	default:
		p.carried = true
		p.marked = &mk
		parentMarks.WithLabelValues("accepted").Inc()
	}
}

func anyMark(get func(string) (string, bool)) bool {
	for _, name := range marks.Headers {
		if _, ok := get(name); ok {
			return true
		}
	}
	return false
}

// markMutation adds the pick's marks to the request-headers response, or,
// when the request carried marks and leaves with none, removes them. Either
// way it first drops the marks GIE echoes from the request: Envoy applies
// set_headers after remove_headers, so an echo would put them back.
func markMutation(h *extProcPb.HeaderMutation, p *pick) {
	if !p.carried && len(p.marks) == 0 {
		return
	}
	h.SetHeaders = slices.DeleteFunc(h.SetHeaders, func(o *configPb.HeaderValueOption) bool {
		return slices.Contains(forwardHeaders, strings.ToLower(o.GetHeader().GetKey()))
	})
	for _, kv := range p.marks {
		h.SetHeaders = append(h.SetHeaders, &configPb.HeaderValueOption{
			Header:       &configPb.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])},
			AppendAction: configPb.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
	}
	if p.carried && len(p.marks) == 0 {
		h.RemoveHeaders = append(h.RemoveHeaders, forwardHeaders...)
	}
}
