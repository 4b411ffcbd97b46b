package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/bench/internal/host"
	"github.com/fleetinfer/fleetinfer/internal/stats"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

type bench struct {
	fl  *fleet.Fleet
	cfg config
}

// phase is one way of getting c.services services into every spoke.
type phase struct {
	Name string
	// Direct: the benchmark creates each copy in the spokes itself.
	Direct bool
	// Paced: services arrive at cfg.rate per second rather than at once.
	Paced bool
}

// propagationResult is one phase. A copy's latency runs from the moment the
// benchmark sends the service's create (to the hub, or to the spokes when
// Direct) to the moment a watch on the spoke delivers the copy.
type propagationResult struct {
	Phase      string    `json:"phase"`
	Services   int       `json:"services"`
	Copies     int       `json:"copies"`
	CopyP50Ms  float64   `json:"copy_p50_ms"`
	CopyP90Ms  float64   `json:"copy_p90_ms"`
	CopyP99Ms  float64   `json:"copy_p99_ms"`
	CopyMaxMs  float64   `json:"copy_max_ms"`
	AllP50Ms   float64   `json:"service_all_copies_p50_ms"`
	AllP99Ms   float64   `json:"service_all_copies_p99_ms"`
	WallS      float64   `json:"wall_s"`
	CopyMillis []float64 `json:"copy_ms"`
	// Hub is what the hub's service controller did (hub phases only).
	Hub *hubWork `json:"hub,omitempty"`
	// MachineBusy is the share of the machine's CPU (all cores) that was
	// busy from the first create to the last copy: near 1, the control
	// planes, controllers and benchmark were short of CPU.
	MachineBusy float64 `json:"machine_cpu_busy"`
}

// benchService is a service the spokes run no pods for (KServe's stop
// annotation), so that the phase measures the control planes only.
func benchService(ns, name string) *v1alpha2.LLMInferenceService {
	return &v1alpha2.LLMInferenceService{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"bench": ns},
			Annotations: map[string]string{"serving.kserve.io/stop": "true"}},
		Spec: v1alpha2.LLMInferenceServiceSpec{
			Model: v1alpha2.LLMModelSpec{URI: "hf://facebook/opt-125m", Name: ptr.To("opt")},
			WorkloadSpec: v1alpha2.WorkloadSpec{Replicas: ptr.To(int32(1)),
				Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "vllm/vllm-openai:v0.11.0"}}}},
		},
	}
}

func (b *bench) propagation(ctx context.Context, ph phase) (propagationResult, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
	defer cancel()
	ns := "bench-" + ph.Name
	hub := b.fl.Hub.Client
	if err := createNamespace(ctx, hub, ns); err != nil {
		return propagationResult{}, err
	}
	if err := fleet.BindEveryCluster(ctx, hub, ns); err != nil {
		return propagationResult{}, err
	}
	names := make([]string, b.cfg.services)
	for i := range names {
		names[i] = fmt.Sprintf("svc-%03d", i)
	}
	if ph.Direct {
		for _, s := range b.fl.Spokes {
			if err := createNamespace(ctx, s.Client, ns); err != nil {
				return propagationResult{}, err
			}
		}
	} else {
		var clusters []string
		for _, s := range b.fl.Spokes {
			clusters = append(clusters, s.Name())
		}
		p := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Name: "all", Namespace: ns},
			Spec: fleetv1alpha1.InferencePlacementSpec{
				ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": ns}},
				Clusters:        fleetv1alpha1.ClusterAffinity{Names: clusters}}}
		if err := hub.Create(ctx, p); err != nil {
			return propagationResult{}, err
		}
	}

	seen := newArrivals(len(names) * len(b.fl.Spokes))
	for _, s := range b.fl.Spokes {
		w, err := watchCopies(ctx, s, ns)
		if err != nil {
			return propagationResult{}, err
		}
		go seen.follow(s.Name(), w)
	}

	before, err := scrape(ctx, b.fl.Hub.ControllerMetrics, hubHost(b.fl))
	if err != nil {
		return propagationResult{}, err
	}
	sent := make([]time.Time, len(names))
	began, cpuBefore := time.Now(), host.ReadCPU()
	create := func(i int) error {
		sent[i] = time.Now()
		if !ph.Direct {
			return hub.Create(ctx, benchService(ns, names[i]))
		}
		var wg sync.WaitGroup
		errs := make([]error, len(b.fl.Spokes))
		for k, s := range b.fl.Spokes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[k] = s.Client.Create(ctx, benchService(ns, names[i]))
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if err := drive(ctx, len(names), b.cfg.concurrency, ph.Paced, b.cfg.rate, create); err != nil {
		return propagationResult{}, err
	}
	if err := seen.wait(ctx); err != nil {
		return propagationResult{}, fmt.Errorf("%w (%d of %d copies arrived)", err, seen.count(), len(names)*len(b.fl.Spokes))
	}
	res := propagationResult{Phase: ph.Name, Services: len(names), Copies: seen.count(), MachineBusy: host.ReadCPU().BusySince(cpuBefore)}
	if !ph.Direct {
		after, err := scrape(ctx, b.fl.Hub.ControllerMetrics, hubHost(b.fl))
		if err != nil {
			return res, err
		}
		w := work(before, after)
		res.Hub = &w
	}
	var all []float64
	for i, n := range names {
		worst := 0.0
		for _, s := range b.fl.Spokes {
			ms := float64(seen.at(s.Name(), n).Sub(sent[i]).Microseconds()) / 1000
			res.CopyMillis = append(res.CopyMillis, ms)
			worst = max(worst, ms)
		}
		all = append(all, worst)
	}
	res.WallS = seen.last().Sub(began).Seconds()
	res.CopyP50Ms, res.CopyP90Ms = stats.Quantile(res.CopyMillis, 0.5), stats.Quantile(res.CopyMillis, 0.9)
	res.CopyP99Ms, res.CopyMaxMs = stats.Quantile(res.CopyMillis, 0.99), stats.Quantile(res.CopyMillis, 1)
	res.AllP50Ms, res.AllP99Ms = stats.Quantile(all, 0.5), stats.Quantile(all, 0.99)
	return res, b.cleanUp(ctx, ns, ph.Direct)
}

// drive calls create for 0..n-1: with `workers` at once, or paced at rate
// per second; either way bounded by n and by ctx.
func drive(ctx context.Context, n, workers int, paced bool, rate float64, create func(int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	if paced {
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for i := range n {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = create(i)
			}()
		}
	} else {
		next := make(chan int)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					errs[i] = create(i)
				}
			}()
		}
		for i := range n {
			next <- i
		}
		close(next)
	}
	wg.Wait()
	return errors.Join(errs...)
}

func createNamespace(ctx context.Context, c client.Client, name string) error {
	return client.IgnoreAlreadyExists(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}

// watchCopies watches the services of a namespace in a spoke.
func watchCopies(ctx context.Context, s *fleet.Cluster, ns string) (watch.Interface, error) {
	wc, err := client.NewWithWatch(s.Admin(), client.Options{Scheme: fleet.Scheme})
	if err != nil {
		return nil, err
	}
	return wc.Watch(ctx, &v1alpha2.LLMInferenceServiceList{}, client.InNamespace(ns))
}

// arrivals records when each copy first arrived in each cluster.
type arrivals struct {
	mu    sync.Mutex
	when  map[string]time.Time // cluster/name
	want  int
	done  chan struct{}
	final time.Time
}

func newArrivals(want int) *arrivals {
	return &arrivals{when: map[string]time.Time{}, want: want, done: make(chan struct{})}
}

func (a *arrivals) follow(cluster string, w watch.Interface) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		now := time.Now()
		if ev.Type != watch.Added {
			continue
		}
		o, ok := ev.Object.(client.Object)
		if !ok {
			continue
		}
		a.mu.Lock()
		k := cluster + "/" + o.GetName()
		if _, dup := a.when[k]; !dup {
			a.when[k] = now
			a.final = now
			if len(a.when) == a.want {
				close(a.done)
			}
		}
		a.mu.Unlock()
	}
}

func (a *arrivals) wait(ctx context.Context) error {
	select {
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *arrivals) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.when)
}

func (a *arrivals) at(cluster, name string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.when[cluster+"/"+name]
}

func (a *arrivals) last() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.final
}

// cleanUp deletes the phase's services and waits until no copy is left, so
// that the next phase starts from a quiet fleet.
func (b *bench) cleanUp(ctx context.Context, ns string, direct bool) error {
	del := func(c client.Client) error {
		return c.DeleteAllOf(ctx, &v1alpha2.LLMInferenceService{}, client.InNamespace(ns))
	}
	if direct {
		for _, s := range b.fl.Spokes {
			if err := del(s.Client); err != nil {
				return err
			}
		}
	} else if err := del(b.fl.Hub.Client); err != nil {
		return err
	}
	for {
		left := 0
		for _, c := range append([]*fleet.Cluster{b.fl.Hub}, b.fl.Spokes...) {
			var l v1alpha2.LLMInferenceServiceList
			if err := c.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
				return err
			}
			left += len(l.Items)
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d services left after the phase: %w", left, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// hubHost is host:port of the hub's API server as its clients name it.
func hubHost(f *fleet.Fleet) string {
	return strings.TrimPrefix(f.Hub.Admin().Host, "https://")
}
