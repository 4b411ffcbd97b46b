package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
)

// slowReconciles counts, per controller, the reconciles the hub reports
// (controller-runtime's controller_runtime_reconcile_time_seconds) that took
// longer than 10 s.
func slowReconciles(t *testing.T) map[string]float64 {
	t.Helper()
	m, err := metrics.Scrape(context.Background(), fl.Hub.ControllerMetrics)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for series, v := range m {
		if !strings.HasPrefix(series, "controller_runtime_reconcile_time_seconds_count{") {
			continue
		}
		labels := strings.TrimPrefix(series, "controller_runtime_reconcile_time_seconds_count")
		within := m[`controller_runtime_reconcile_time_seconds_bucket{`+strings.Trim(labels, "{}")+`,le="10"}`]
		out[labels] = v - within
	}
	return out
}

// A spoke whose API server the hub cannot reach — the link black-holed, so
// connections hang rather than fail — holds no hub worker: a service placed
// elsewhere meanwhile turns Ready within 30 s, no hub reconcile takes longer
// than 10 s, and the service that runs in the lost spoke keeps its copy.
// (The 2-minute variant is the same test with a longer hole.)
func TestABlackHoledSpokeHoldsNoHubWorker(t *testing.T) {
	ns := namespace(t, fl.Hub)
	place(t, gpuService(ns, "in-east", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}}})
	hubReady(t, ns, "in-east", "east=1", 120*time.Second)
	slowBefore := slowReconciles(t)
	if len(slowBefore) == 0 {
		t.Fatal("the hub reports no controller_runtime_reconcile_time_seconds")
	}

	const hole = 30 * time.Second
	fl.Fabric().BlackHole("hub", "east")
	holed := time.Now()
	t.Cleanup(func() { fl.Fabric().Heal("hub", "east") })

	place(t, gpuService(ns, "in-west", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"west"}}})
	hubReady(t, ns, "in-west", "west=1", 30*time.Second)
	t.Logf("with hub–east black-holed, a service placed on west was Ready %.1fs after the hole began", time.Since(holed).Seconds())

	time.Sleep(time.Until(holed.Add(hole)))
	fl.Fabric().Heal("hub", "east")
	for controller, n := range slowReconciles(t) {
		if n > slowBefore[controller] {
			t.Errorf("hub controller %s: %v reconciles over 10 s during the hole", controller, n-slowBefore[controller])
		}
	}
	if c := fl.Spoke("east"); c != nil {
		cp := &v1alpha2.LLMInferenceService{}
		if err := c.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "in-east"}, cp); err != nil {
			t.Errorf("east's copy after the hole: %v", err)
		}
	}
	hubReady(t, ns, "in-east", "east=1", 60*time.Second)
}
