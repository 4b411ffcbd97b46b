package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// A simulator's page, cut short: a histogram, the load gauges with the
// model's label, and a gauge whose name starts like one of them.
const page = `# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{model_name="bench",le="0.001"} 1
vllm:time_to_first_token_seconds_sum{model_name="bench"} 0
vllm:time_to_first_token_seconds_count{model_name="bench"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="bench"} 0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="bench"} 0
# TYPE vllm:num_requests_running_total gauge
vllm:num_requests_running_total{model_name="bench"} 7
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="bench"} 0
`

func TestTheStandInsServeTheSimulatorsPageWithThePhasesLoad(t *testing.T) {
	got, err := withLoad([]byte(page), 10)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.NewReplacer(
		`vllm:kv_cache_usage_perc{model_name="bench"} 0`, `vllm:kv_cache_usage_perc{model_name="bench"} 0.3`,
		`vllm:num_requests_running{model_name="bench"} 0`, `vllm:num_requests_running{model_name="bench"} 4`,
		`vllm:num_requests_waiting{model_name="bench"} 0`, `vllm:num_requests_waiting{model_name="bench"} 10`,
	).Replace(page)
	if string(got) != want {
		t.Errorf("page with load:\n%s\nwant:\n%s", got, want)
	}
}

func TestAPageWithoutALoadGaugeIsRefused(t *testing.T) {
	short := strings.Replace(page, `vllm:kv_cache_usage_perc{model_name="bench"} 0`+"\n", "", 1)
	_, err := withLoad([]byte(short), 0)
	if err == nil || !strings.Contains(err.Error(), "vllm:kv_cache_usage_perc") {
		t.Errorf("got %v, want an error naming the missing gauge", err)
	}
}

func TestASimulatorThatExitsIsReportedWithTheEndOfItsLog(t *testing.T) {
	dir := t.TempDir()
	sim := filepath.Join(dir, "sim")
	if err := os.WriteFile(sim, []byte("#!/bin/sh\necho 'IP should be defined' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	reg := &process.Registry{}
	defer reg.StopAll(time.Second)
	_, err := simulatorPage(t.Context(), sim, dir, reg)
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "IP should be defined") {
		t.Errorf("got %v, want the exit status and the end of the simulator's log", err)
	}
}
