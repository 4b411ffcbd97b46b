package main

import (
	"context"
	"strings"

	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
)

// hubWork is what the hub did during a phase, from its Prometheus metrics:
// how many reconciles of its service controller, how long they ran, how
// long services waited in its queue, and the API requests the whole process
// sent. It says where propagation time goes.
type hubWork struct {
	Reconciles     int     `json:"reconciles"`
	ReconcileAvgMs float64 `json:"reconcile_avg_ms"`
	QueueWaitAvgMs float64 `json:"queue_wait_avg_ms"`
	HubRequests    int     `json:"hub_api_requests"`
	SpokeRequests  int     `json:"spoke_api_requests"`
}

const hubController = "hub-llminferenceservice"

// scrape sums the series hubWork is computed from.
func scrape(ctx context.Context, url, hubHost string) (map[string]float64, error) {
	all, err := metrics.Scrape(ctx, url)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for series, v := range all {
		switch name := metrics.Name(series); {
		case name == "rest_client_requests_total" && strings.Contains(series, `host="`+hubHost+`"`):
			out["hub_requests"] += v
		case name == "rest_client_requests_total":
			out["spoke_requests"] += v
		case strings.Contains(series, `"`+hubController+`"`):
			out[name] += v
		}
	}
	return out, nil
}

func work(before, after map[string]float64) hubWork {
	d := func(k string) float64 { return after[k] - before[k] }
	w := hubWork{Reconciles: int(d("controller_runtime_reconcile_time_seconds_count")),
		HubRequests: int(d("hub_requests")), SpokeRequests: int(d("spoke_requests"))}
	if w.Reconciles > 0 {
		w.ReconcileAvgMs = d("controller_runtime_reconcile_time_seconds_sum") / float64(w.Reconciles) * 1000
	}
	if n := d("workqueue_queue_duration_seconds_count"); n > 0 {
		w.QueueWaitAvgMs = d("workqueue_queue_duration_seconds_sum") / n * 1000
	}
	return w
}
