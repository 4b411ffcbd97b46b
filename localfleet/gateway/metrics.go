package gateway

import (
	"context"
	"net"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the gateway's Prometheus series. Every gateway has its own
// registry, without process collectors: the local fleet runs several
// gateways in one process.
type metrics struct {
	registry *prometheus.Registry
	// requests counts answered requests by listener (always public), route
	// ("namespace/name", "" when none matched), backend and status code.
	requests *prometheus.CounterVec
	// duration is the whole request at the gateway, to the last byte.
	duration *prometheus.HistogramVec
	// upstreamHeaders is the time from sending to an upstream until its
	// response headers: time to first token for a streamed completion.
	upstreamHeaders *prometheus.HistogramVec
	// upstreamDuration is the time from sending to an upstream until the
	// last byte of its response.
	upstreamDuration *prometheus.HistogramVec
	// pick is the endpoint picker's answer time (request headers sent to
	// their answer) by pool and outcome: picked, immediate_response, error.
	pick *prometheus.HistogramVec
	// failOpen counts requests that went on without the picker because it
	// failed and the pool is FailOpen.
	failOpen *prometheus.CounterVec
	// retries counts connection failures that moved a request on to a
	// Service backend's next Ready pod.
	retries *prometheus.CounterVec
	// destinations counts picks by where they led: local, or remote
	// (another cluster's pod or gateway).
	destinations *prometheus.CounterVec
	// upstreamConnections counts upstream connections opened, as Envoy's
	// upstream_cx_total does per cluster: to a route's backend, or to a
	// picker's destination (the ORIGINAL_DST cluster), where a crossing
	// that opens one pays the link's round trip for it.
	upstreamConnections *prometheus.CounterVec
}

func newMetrics() *metrics {
	fast := prometheus.ExponentialBuckets(0.0001, 2, 17) // 0.1 ms to 6.5 s
	slow := prometheus.ExponentialBuckets(0.001, 2, 17)  // 1 ms to 65 s
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetinfer_gateway_requests_total",
			Help: "Requests answered, by listener, HTTPRoute, backend and HTTP status code."},
			[]string{"listener", "route", "backend", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetinfer_gateway_request_duration_seconds",
			Help: "Time from receiving a request to sending the last byte of its response.", Buckets: slow},
			[]string{"listener", "route", "backend"}),
		upstreamHeaders: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetinfer_gateway_upstream_response_header_duration_seconds",
			Help: "Time from sending a request upstream to receiving the response headers.", Buckets: slow},
			[]string{"backend"}),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetinfer_gateway_upstream_request_duration_seconds",
			Help: "Time from sending a request upstream to receiving the last byte of the response.", Buckets: slow},
			[]string{"backend"}),
		pick: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetinfer_gateway_epp_pick_duration_seconds",
			Help: "Time from sending the request headers to the endpoint picker to its answer.", Buckets: fast},
			[]string{"pool", "outcome"}),
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetinfer_gateway_epp_fail_open_total",
			Help: "Requests that went on without the endpoint picker because it failed and the pool fails open: 503 without a pick (no destination), a response passed through unprocessed."},
			[]string{"pool"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetinfer_gateway_upstream_retries_total",
			Help: "Upstream connection failures after which a Service backend's next ready pod was tried; a picker's destination is tried once."},
			[]string{"backend"}),
		destinations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetinfer_gateway_epp_destinations_total",
			Help: "Endpoint picker destinations used, by kind: local, or remote (another cluster's pod or gateway)."},
			[]string{"pool", "kind"}),
		upstreamConnections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetinfer_gateway_upstream_connections_total",
			Help: "Upstream connections opened, by upstream: backend (a route's backend) or picked (an endpoint picker's destination)."},
			[]string{"upstream"}),
	}
	m.registry.MustRegister(m.requests, m.duration, m.upstreamHeaders, m.upstreamDuration, m.pick, m.failOpen, m.retries, m.destinations,
		m.upstreamConnections)
	return m
}

// dialFunc is how a transport dials.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// counted returns dial, counting each connection it opens in opened.
func counted(dial dialFunc, opened prometheus.Counter) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err == nil {
			opened.Inc()
		}
		return c, err
	}
}
