package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

// Hostile specs applied on the hub reach a spoke as copies that end with
// PresetsCombined=False and its reason, which the hub reports for that
// cluster; a model name made to break out of the presets' shell script is
// quoted. Meanwhile a service on the same spoke keeps taking changes from
// the hub, and the spoke controller's memory stays under 256 MiB. The bound
// on each refusal is 2 s after its copy arrives, plus the time a benign
// copy arriving with them takes to compose (the machine's load), plus for
// the 1.4 MB spec twice the time the hub took to write it.
func TestHostileSpecsAppliedOnTheHubEndFalseInTheSpoke(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, fl.Hub)
	spoke := fl.Spokes[0]
	on := fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{spoke.Name()}}}
	withArgs := func(name string, args ...string) *v1alpha2.LLMInferenceService {
		svc := gpuService(ns, name, 1, 1)
		svc.Spec.Template.Containers[0].Args = args
		return svc
	}
	good := withArgs("good")
	place(t, good, on)
	hubReady(t, ns, good.Name, spoke.Name()+"=1", 2*time.Minute)

	padding := strings.Repeat(`{{printf "%0999999d" 0}}`, 1000)
	hostile := map[string]string{"range": llmisvc.ReasonUnsupportedPlaceholder, "padding": llmisvc.ReasonUnsupportedPlaceholder,
		"huge": llmisvc.ReasonRenderLimitExceeded}
	specs := []*v1alpha2.LLMInferenceService{
		withArgs("range", "{{range 100000000000}}{{end}}"),
		withArgs("padding", padding),
		withArgs("huge", strings.Repeat("a", 1_400_000)),
	}
	injection := withArgs("injection")
	injection.Spec.Model.Name = ptr.To(`x" $(touch /tmp/pwned) "y`)
	control := withArgs("control")

	rss := sampleRSS(t, spoke.ControllerMetrics)
	var names []string
	for _, svc := range append(specs, injection, control) {
		names = append(names, svc.Name)
	}
	arrived, seen := watchCopies(t, spoke.Admin(), ns, names, 2*time.Minute, func(cp *v1alpha2.LLMInferenceService) bool {
		if cp.Name == control.Name || cp.Name == injection.Name {
			return cp.Status.IsTrue(v1alpha2.PresetsCombined)
		}
		c := cp.Status.GetCondition(v1alpha2.PresetsCombined)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == hostile[cp.Name]
	})

	// The good service's spec changes on the hub while the hostile ones arrive.
	var latencies []time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		latencies = changeThroughTheHub(t, spoke, client.ObjectKeyFromObject(good), 10)
	}()
	written := map[string]time.Duration{}
	for _, svc := range append(specs, injection, control) {
		start := time.Now()
		place(t, svc, on)
		written[svc.Name] = time.Since(start)
	}
	t.Logf("the hub took %s to accept the 1.4 MB service", written["huge"].Round(time.Millisecond))
	got := seen()
	wg.Wait()

	took := func(name string) (time.Duration, bool) {
		at, ok := got[name]
		if !ok {
			return 0, false
		}
		return at.Sub(arrived()[name]), true
	}
	baseline, ok := took(control.Name)
	if !ok {
		t.Fatalf("the control service's copy did not compose within 2 minutes")
	}
	t.Logf("control: PresetsCombined=True %s after its copy arrived", baseline.Round(time.Millisecond))
	for _, svc := range specs {
		d, ok := took(svc.Name)
		if !ok {
			t.Errorf("%s: no copy with PresetsCombined=False/%s within 2 minutes", svc.Name, hostile[svc.Name])
			continue
		}
		limit := baseline + 2*time.Second
		if svc.Name == "huge" {
			limit += 2 * written[svc.Name]
		}
		t.Logf("%s: PresetsCombined=False/%s %s after its copy arrived (bound %s)", svc.Name, hostile[svc.Name], d.Round(time.Millisecond), limit.Round(time.Millisecond))
		if d > limit {
			t.Errorf("%s: PresetsCombined=False %s after its copy arrived, over %s", svc.Name, d, limit)
		}
	}
	// The hub tells its user why, per cluster.
	for _, svc := range specs {
		testutil.Eventually(t, 30*time.Second, svc.Name+" on the hub", func(ctx context.Context) error {
			h := &v1alpha2.LLMInferenceService{}
			if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), h); err != nil {
				return err
			}
			i := slices.IndexFunc(h.Status.Clusters, func(c v1alpha2.ClusterStatus) bool { return c.Name == spoke.Name() })
			if i < 0 || !strings.HasPrefix(h.Status.Clusters[i].Message, string(v1alpha2.PresetsCombined)+": ") {
				return fmt.Errorf("hub: %s", hubConditions(h))
			}
			return nil
		})
	}

	d := &appsv1.Deployment{}
	if err := spoke.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "injection-kserve"}, d); err != nil {
		t.Fatal(err)
	}
	script := strings.Join(d.Spec.Template.Spec.Containers[0].Command, " ")
	if want := `--served-model-name 'x" $(touch /tmp/pwned) "y'`; !strings.Contains(script, want) {
		t.Errorf("the copy's script does not quote the model name as %s: %s", want, script)
	}

	slices.Sort(latencies)
	if len(latencies) == 0 {
		t.Fatal("the good service's changes were not measured")
	}
	p99 := latencies[(len(latencies)*99+99)/100-1]
	t.Logf("good service: %d changes from the hub reconciled in %s, p50 %s, p99 %s", len(latencies), spoke.Name(),
		latencies[len(latencies)/2].Round(time.Millisecond), p99.Round(time.Millisecond))
	if p99 > 5*time.Second+baseline {
		t.Errorf("p99 %s over 5 s plus the control's %s: %v", p99, baseline, latencies)
	}
	peak := rss()
	t.Logf("%s controller RSS: peak %d MiB while sampled", spoke.Name(), peak>>20)
	if peak > 256<<20 {
		t.Errorf("the spoke controller's RSS peaked at %d MiB, over 256 MiB", peak>>20)
	}
}

// changeThroughTheHub changes a hub service's spec n times, each after the
// spoke's copy reconciled the previous one, and returns how long each took
// from the hub write to the copy's status.
func changeThroughTheHub(t *testing.T, spoke *fleet.Cluster, k client.ObjectKey, n int) []time.Duration {
	var out []time.Duration
	for i := range n {
		svc := &v1alpha2.LLMInferenceService{}
		if err := fl.Hub.Client.Get(context.Background(), k, svc); err != nil {
			t.Error(err)
			return out
		}
		patch := client.MergeFrom(svc.DeepCopy())
		env := fmt.Sprintf("%d", i)
		svc.Spec.Template.Containers[0].Env = []corev1.EnvVar{{Name: "CHANGE", Value: env}}
		start := time.Now()
		if err := fl.Hub.Client.Patch(context.Background(), svc, patch); err != nil {
			t.Error(err)
			return out
		}
		reconciled := func() bool {
			cp := &v1alpha2.LLMInferenceService{}
			if err := spoke.Client.Get(context.Background(), k, cp); err != nil {
				return false
			}
			c := cp.Spec.Template.Containers[0]
			return len(c.Env) == 1 && c.Env[0].Value == env && cp.Status.ObservedGeneration >= cp.Generation && cp.Status.IsTrue(v1alpha2.PresetsCombined)
		}
		for !reconciled() {
			if time.Since(start) > 30*time.Second {
				t.Errorf("change %d of %s not reconciled in %s within 30 s", i, k, spoke.Name())
				return out
			}
			time.Sleep(50 * time.Millisecond)
		}
		out = append(out, time.Since(start))
	}
	return out
}

// watchCopies watches a spoke's services in ns for up to limit. arrived
// returns when each copy was first seen; seen waits until each named copy
// is done, or limit passes, and returns when each was first done.
func watchCopies(t *testing.T, cfg *rest.Config, ns string, names []string, limit time.Duration, done func(*v1alpha2.LLMInferenceService) bool) (arrived func() map[string]time.Time, seen func() map[string]time.Time) {
	t.Helper()
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: fl.Hub.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	w, err := wc.Watch(ctx, &v1alpha2.LLMInferenceServiceList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	first, finished := map[string]time.Time{}, map[string]time.Time{}
	end := make(chan struct{})
	go func() {
		defer close(end)
		defer w.Stop()
		for e := range w.ResultChan() {
			cp, ok := e.Object.(*v1alpha2.LLMInferenceService)
			if !ok || e.Type == watch.Deleted || !slices.Contains(names, cp.Name) {
				continue
			}
			now := time.Now()
			mu.Lock()
			if _, ok := first[cp.Name]; !ok {
				first[cp.Name] = now
			}
			if _, ok := finished[cp.Name]; !ok && done(cp) {
				finished[cp.Name] = now
			}
			mu.Unlock()
		}
	}()
	arrived = func() map[string]time.Time {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(first)
	}
	seen = func() map[string]time.Time {
		for {
			mu.Lock()
			all := len(finished) == len(names)
			out := maps.Clone(finished)
			mu.Unlock()
			if all {
				return out
			}
			select {
			case <-end:
				return out
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return arrived, seen
}

// sampleRSS samples a controller's resident memory from its metrics every
// 200 ms until the test ends; the returned func gives the peak so far.
func sampleRSS(t *testing.T, metricsURL string) func() int64 {
	var mu sync.Mutex
	var peak int64
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			if m, err := metrics.Scrape(ctx, metricsURL); err == nil {
				mu.Lock()
				peak = max(peak, int64(m["process_resident_memory_bytes"]))
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		if peak == 0 {
			t.Fatal("the controller's process_resident_memory_bytes was never scraped")
		}
		return peak
	}
}
