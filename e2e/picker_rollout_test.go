package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
)

// A service's endpoint picker is replaced without a gap in routing: while
// its pod template changes (an annotation on the picker's pods, which rolls
// it as a config change does), completions sent through the gateway at a
// bounded rate all succeed, and none is served fail-open, which is what the
// gateway does when it has no picker to ask.
func TestThePickerRollsWithoutAGapInRouting(t *testing.T) {
	spoke := fl.Spokes[0]
	ctx := context.Background()
	ns := namespace(t, spoke)
	name := applySample(t, spoke, cpuSample, ns)
	svc := serviceReady(t, spoke, ns, name, 120*time.Second)
	pickerPods := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/component": "llminferenceservice-router-scheduler"}
	old := readyPod(t, spoke, ns, pickerPods)
	url := *svc.Status.URL + "/v1/completions"
	pool := map[string]string{"pool": ns + "/" + name + "-inference-pool"}
	failOpenBefore := gwMetricSum(t, spoke, "fleetinfer_gateway_epp_fail_open_total", pool)

	// Bounded load: 2 senders, one request each every 100 ms, at most 1000
	// requests and 3 minutes in all.
	const maxRequests, maxTime = 1000, 3 * time.Minute
	var sent, failed atomic.Int64
	var mu sync.Mutex
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	httpc := &http.Client{Timeout: 10 * time.Second}
	began := time.Now()
	for range 2 {
		wg.Go(func() {
			for time.Since(began) < maxTime && sent.Add(1) <= maxRequests {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				resp, err := httpc.Post(url, "application/json",
					strings.NewReader(`{"model":"facebook/opt-125m","prompt":"roll the picker","max_tokens":4}`))
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%s", resp.Status)
					}
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %v", time.Since(began).Round(time.Millisecond), err))
					mu.Unlock()
				}
			}
		})
	}
	stopLoad := func() int64 {
		close(stop)
		wg.Wait()
		return min(sent.Load(), maxRequests)
	}

	time.Sleep(2 * time.Second)
	changed := time.Now()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &v1alpha2.LLMInferenceService{}
		if err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(svc), cur); err != nil {
			return err
		}
		sch := cur.Spec.Router.Scheduler
		if sch.Annotations == nil {
			sch.Annotations = map[string]string{}
		}
		sch.Annotations["e2e.fleetinfer.io/revision"] = "2"
		return spoke.Client.Update(ctx, cur)
	}); err != nil {
		stopLoad()
		t.Fatal(err)
	}
	testutil.Eventually(t, 90*time.Second, "a new picker Ready and the old one gone", func(ctx context.Context) error {
		pods, err := podsOf(ctx, spoke, ns, pickerPods)
		if err != nil {
			return err
		}
		if len(pods) != 1 || pods[0].UID == old.UID {
			return fmt.Errorf("%d picker pods, the old one among them", len(pods))
		}
		if !podReady(pods[0]) {
			return fmt.Errorf("the new picker is not Ready")
		}
		return nil
	})
	rolled := time.Since(changed)
	// A few more seconds of load on the new picker alone.
	time.Sleep(3 * time.Second)
	n := stopLoad()
	failOpen := gwMetricSum(t, spoke, "fleetinfer_gateway_epp_fail_open_total", pool) - failOpenBefore
	t.Logf("picker replaced %s after the change; %d requests, %d failed, %d served fail-open", rolled.Round(100*time.Millisecond), n, failed.Load(), int(failOpen))
	if failed.Load() > 0 || failOpen > 0 {
		t.Fatalf("%d requests failed and %d were served without a picker while it rolled: %v", failed.Load(), int(failOpen), failures)
	}
	if n < 50 {
		t.Fatalf("only %d requests sent", n)
	}
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
