package epp

import (
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// What a crossing costs is what a crossed request took from its pick to its
// response headers, less what it spent in the other cluster after that
// cluster's picker chose its pod: the link both ways, the other gateway
// and the other picker. The second part is the other cluster's to measure,
// and its picker tells it back in a Server-Timing response header (W3C
// Server Timing, which gateways pass on), on the responses to requests a
// peer marked: its upstream metric is the time from its pick to the
// response headers it saw, in milliseconds. Without it the origin would
// count the pod's queue and prefill (a model server that sends its
// headers with the first token) as the crossing's, and the spill estimate,
// which adds the remote pod's expected wait itself, would count them
// twice.
const (
	serverTimingHeader = "server-timing"
	upstreamMetric     = "fleetinfer-upstream"
)

// addUpstreamTiming appends the upstream metric with took to a
// response-headers response, as one more Server-Timing header: a model
// server's own metrics stay.
func addUpstreamTiming(r *extProcPb.HeadersResponse, took time.Duration) {
	if r.Response == nil {
		r.Response = &extProcPb.CommonResponse{}
	}
	if r.Response.HeaderMutation == nil {
		r.Response.HeaderMutation = &extProcPb.HeaderMutation{}
	}
	v := upstreamMetric + ";dur=" + strconv.FormatFloat(milliseconds(took), 'f', 3, 64)
	r.Response.HeaderMutation.SetHeaders = append(r.Response.HeaderMutation.SetHeaders, &corev3.HeaderValueOption{
		Header: &corev3.HeaderValue{Key: serverTimingHeader, RawValue: []byte(v)},
		Append: wrapperspb.Bool(true),
	})
}

// upstreamTiming returns the upstream metric of a response's Server-Timing
// headers, the last one when several carry it (the picker appends its own
// after any a model server set); false without one or with a duration that
// is not a finite, non-negative number.
func upstreamTiming(h *corev3.HeaderMap) (time.Duration, bool) {
	var (
		out time.Duration
		ok  bool
	)
	for _, hv := range h.GetHeaders() {
		if !strings.EqualFold(hv.GetKey(), serverTimingHeader) {
			continue
		}
		for _, metric := range strings.Split(headerValue(hv), ",") {
			if d, found := metricDuration(metric, upstreamMetric); found {
				out, ok = d, true
			}
		}
	}
	return out, ok
}

// metricDuration reads the dur parameter of one Server-Timing metric
// ("name;dur=12.5;desc=…") if it is named name.
func metricDuration(metric, name string) (time.Duration, bool) {
	params := strings.Split(metric, ";")
	if strings.TrimSpace(params[0]) != name {
		return 0, false
	}
	for _, p := range params[1:] {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		if strings.TrimSpace(k) != "dur" {
			continue
		}
		ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		// An hour bounds what a response's headers can have waited for.
		if err != nil || !(ms >= 0 && ms <= float64(time.Hour/time.Millisecond)) {
			return 0, false
		}
		return time.Duration(ms * float64(time.Millisecond)), true
	}
	return 0, false
}
