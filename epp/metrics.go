package epp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetinfer/fleetinfer/epp/crossing"
	"github.com/fleetinfer/fleetinfer/epp/federation"
)

// The EPP's own metrics, counted on the request path. The runner registers
// MetricCollectors() next to GIE's.
var (
	// picks is counted by the director, which knows where a pick went.
	picks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_picks_total",
		Help: "Requests scheduled, by whether the primary endpoint is local or remote, and its cluster (empty for local).",
	}, []string{"locality", "cluster"})
	// localPicks is picks' local series, looked up once: it is counted on
	// every pick that stays in the cluster.
	localPicks = picks.WithLabelValues("local", "")
	// subsetHints is counted by the candidate lookup.
	subsetHints = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_subset_hints_total",
		Help: "Requests that carried a subset hint (GIE's envoy.lb.subset_hint metadata, or the pod of a verified Parent-mode mark), by result: honoured (a hinted endpoint exists), fallback (none does; own pick, FailOpen) or rejected (none does; FailClose).",
	}, []string{"result"})
	// parentMarks is counted when a request's headers arrive.
	parentMarks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_parent_marks_total",
		Help: "Requests by their Parent-mode marks: accepted (verified; picked locally), rejected (present but not verified; picked as a client request) or absent.",
	}, []string{"result"})
	// parentMarksAbsent is parentMarks' absent series, counted on most
	// requests.
	parentMarksAbsent = parentMarks.WithLabelValues("absent")
	// requestBodiesRefused and bufferedBodyBytes are counted by limitedStream.
	requestBodiesRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_request_bodies_refused_total",
		Help: "Requests answered before their body ended, by reason: too_large (413, over --max-request-body-bytes), client_full (429, over --max-client-request-body-bytes), buffer_full (503, over --max-buffered-request-body-bytes, or past its unreserved part for a body over 64 KiB), too_slow (408, under --min-request-body-bytes-per-second after --request-body-grace-period) or after_end (400, a body message after the request's end_of_stream).",
	}, []string{"reason"})
	bufferedBodyBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetinfer_epp_buffered_request_body_bytes",
		Help: "Request-body bytes held by the requests in flight.",
	})
	// crossingPath is set by markingStream from the spill meter.
	crossingPath = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_epp_crossing_path_seconds",
		Help: "How long crossed requests to a cluster take from the pick to their response headers, less the time after the other cluster's pick its picker reports in Server-Timing (a moving average): the cost of a Parent-mode crossing the spill estimate uses when it exceeds the link's measured round trip.",
	}, []string{"cluster"})
)

// MetricCollectors returns every fleetinfer EPP metric: the federation's and the
// request path's.
func MetricCollectors() []prometheus.Collector {
	return append(append(federation.Collectors(), crossing.Collectors()...), picks, subsetHints, parentMarks, requestBodiesRefused, bufferedBodyBytes, crossingPath)
}
