package epp

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwksched "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"

	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// A request picked twice (a stream whose request body ends twice makes
// GIE pick again) is timed in the meter from its first pick, when it was
// counted in flight, not from the second: its service time is what the
// pod took.
func TestARequestPickedTwiceIsTimedFromItsFirstPick(t *testing.T) {
	pod := types.NamespacedName{Namespace: "llm", Name: "l0"}
	result := &fwksched.SchedulingResult{PrimaryProfileName: "default", ProfileResults: map[string]*fwksched.ProfileRunResult{
		"default": {TargetEndpoints: []fwksched.Endpoint{fwksched.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: pod, Address: "127.11.0.1", Port: "8000"}, fwkdl.NewMetrics(), nil)}},
	}}
	meter := spill.NewMeter()
	rec := pickRecorder{meter: meter}
	ctx := withPick(context.Background())
	const took = 200 * time.Millisecond

	rec.PreRequest(ctx, nil, result)
	time.Sleep(took)
	rec.PreRequest(ctx, nil, result)
	rec.finish(pickOf(ctx), true)

	// A pod never scraped has a batch of one: its rate is one over the
	// service time.
	rate, ok := meter.PoolRate()
	if !ok {
		t.Fatal("no service time measured")
	}
	if got := time.Duration(float64(time.Second) / rate); got < took {
		t.Errorf("service time %v, want at least the %v since the first pick", got, took)
	}
}
