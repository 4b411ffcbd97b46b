package federation

import "github.com/prometheus/client_golang/prometheus"

// Federation metrics: what the store, publisher and subscriber count. The
// runner registers Collectors() next to GIE's own.
var (
	peersConnected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetinfer_epp_federation_peers_connected",
		Help: "Peers whose federation stream is up (subscriptions of this EPP).",
	})
	subscribers = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fleetinfer_epp_federation_subscribers",
		Help: "Peers subscribed to this EPP's endpoints.",
	})
	remoteEndpoints = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_epp_federation_remote_endpoints",
		Help: "Endpoints held for each peer.",
	}, []string{"peer"})
	// Lag is observed at pick time, once per peer, for the stalest of that
	// peer's endpoints that were candidates.
	lag = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fleetinfer_epp_federation_lag_seconds",
		Help:    "Age of a peer's endpoint data at pick time (its stalest candidate endpoint), from the peer's scrape to the pick.",
		Buckets: []float64{.005, .01, .02, .03, .05, .075, .1, .125, .15, .2, .25, .3, .4, .5, .75, 1, 1.5, 2},
	}, []string{"peer"})
	bytesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_bytes_total",
		Help: "Federation message bytes exchanged with each peer (protobuf payload, without gRPC and TLS framing).",
	}, []string{"peer", "direction"})
	updatesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_updates_total",
		Help: "Federation messages exchanged with each peer.",
	}, []string{"peer", "direction"})
	streamErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_stream_errors_total",
		Help: "Subscription streams to a peer that ended, by reason (connect, transport, protocol, stale).",
	}, []string{"peer", "reason"})
	throttled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_throttled_seconds_total",
		Help: "Time this EPP held a peer's stream unread because the peer sent faster than --federation-max-messages-per-second or --federation-max-bytes-per-second.",
	}, []string{"peer"})
	peerRTT = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_epp_peer_rtt_seconds",
		Help: "Round trip to each peer's cluster as the spill policy uses it: federation pings on the subscription's connection, each moving the estimate halfway.",
	}, []string{"peer"})
	endpointsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_endpoints_refused_total",
		Help: "Peers' endpoints not held because of their address, by peer and reason (loopback, link-local, unspecified, multicast, own-range, outside-peer-ranges).",
	}, []string{"peer", "reason"})
	endpointsWithheld = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_endpoints_withheld_total",
		Help: "Local endpoints this EPP left out of what it publishes, each counted when it is first left out, by reason (labels: names or labels out of the shared bounds; endpoint-count; message-size).",
	}, []string{"reason"})
	prefixSummaries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_prefix_summaries_total",
		Help: "Prefix summaries of local endpoints published (sent: to every subscriber; deferred: left for a later message because the pool's endpoints would not fit a message with it).",
	}, []string{"result"})
	refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_epp_federation_refused_total",
		Help: "Subscriptions and pings this EPP refused or ended, by reason (unknown-identity, wrong-pool; replaced: a newer stream of the same peer came; too-often: the peer opens more than 5 streams a second to the pool, in bursts of 20; pings-too-often: more than 20 pings a second, in bursts of 40; deauthorized: the peer left the directory or its certificate no longer verifies).",
	}, []string{"reason"})
)

// Collectors returns the federation's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{peersConnected, subscribers, remoteEndpoints, lag, bytesTotal,
		updatesTotal, streamErrors, throttled, refused, endpointsRefused, endpointsWithheld, peerRTT, prefixSummaries}
}
