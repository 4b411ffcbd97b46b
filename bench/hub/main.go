// Command hub benchmarks the hub on the local fleet (a hub and three spokes,
// each a real kube-apiserver, with bin/hub and bin/spoke running as in
// production): how long a service applied on the hub takes to appear in
// every spoke, for 100 services at once and paced, next to the same objects
// created directly in the spokes by the benchmark (the floor any push
// system pays: one API write and one watch event); and how long a failover
// takes once a spoke's control plane is lost. `make bench` runs it and
// writes bench/results/hub.{json,md,svg}.
//
// Services carry KServe's stop annotation so that spokes run no model
// servers for them: the hub's work is identical, the machine stays free
// for the measurement. Failover uses a service with real simulator pods.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fleetinfer/fleetinfer/bench/internal/host"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

type config struct {
	out          string
	services     int
	concurrency  int
	rate         float64
	failoverReps int
	toleration   time.Duration
	timeout      time.Duration
	hubArgs      string
}

func main() {
	var c config
	flag.StringVar(&c.out, "out", "bench/results", "directory for hub.json, hub.md and hub.svg")
	flag.IntVar(&c.services, "services", 100, "services per propagation phase")
	flag.IntVar(&c.concurrency, "concurrency", 8, "concurrent writers in the burst phases")
	flag.Float64Var(&c.rate, "rate", 10, "services per second in the paced phase")
	flag.IntVar(&c.failoverReps, "failover-reps", 3, "failover repetitions (results are medians)")
	flag.DurationVar(&c.toleration, "toleration", 5*time.Second, "the placement's failover toleration")
	flag.DurationVar(&c.timeout, "phase-timeout", 3*time.Minute, "bound on each phase")
	flag.StringVar(&c.hubArgs, "hub-args", "", "extra flags for bin/hub, space-separated (e.g. --concurrent-service-syncs=16)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) error {
	ctrllog.SetLogger(logr.Discard())
	res := results{Run: host.StartRun(), Services: c.services, Concurrency: c.concurrency, Rate: c.rate, Toleration: c.toleration.String()}
	fmt.Println("starting the local fleet (hub + 3 spokes)")
	fl, err := fleet.Start(ctx, fleet.Options{Spokes: fleet.DefaultSpokes(), NoGateways: true, HubArgs: strings.Fields(c.hubArgs)})
	if err != nil {
		if fl != nil {
			fl.Stop()
		}
		return fmt.Errorf("local fleet: %w", err)
	}
	defer fl.Stop()
	res.FleetStartup = fl.StartupTime.Round(100 * time.Millisecond).String()
	fmt.Printf("fleet up in %s\n", res.FleetStartup)
	// What the fleet itself costs with nothing changing: the floor under
	// every phase's machine CPU.
	idle := host.ReadCPU()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
	}
	res.IdleBusy = host.ReadCPU().BusySince(idle)
	fmt.Printf("idle fleet: machine CPU %.0f%% busy\n", 100*res.IdleBusy)

	b := &bench{fl: fl, cfg: c}
	for _, ph := range []phase{
		{Name: "direct-burst", Direct: true},
		{Name: "hub-burst"},
		{Name: "hub-paced", Paced: true},
	} {
		fmt.Printf("phase %s: %d services\n", ph.Name, c.services)
		r, err := b.propagation(ctx, ph)
		if err != nil {
			return fmt.Errorf("phase %s: %w", ph.Name, err)
		}
		res.Propagation = append(res.Propagation, r)
		fmt.Printf("  per copy p50 %.0f ms, p99 %.0f ms\n", r.CopyP50Ms, r.CopyP99Ms)
		if r.Hub != nil {
			fmt.Printf("  hub: %d reconciles, %.0f ms each, %.0f ms queued; %d requests to the hub, %d to spokes\n",
				r.Hub.Reconciles, r.Hub.ReconcileAvgMs, r.Hub.QueueWaitAvgMs, r.Hub.HubRequests, r.Hub.SpokeRequests)
		}
	}
	for rep := range c.failoverReps {
		fmt.Printf("failover %d/%d\n", rep+1, c.failoverReps)
		r, err := b.failover(ctx, rep)
		if err != nil {
			return fmt.Errorf("failover %d: %w", rep+1, err)
		}
		res.Failovers = append(res.Failovers, r)
		fmt.Printf("  re-placed %.1f s, serving %.1f s after the loss\n", r.ReplacedS, r.ServingS)
	}
	res.Finish()
	res.summarize()
	return res.write(c.out)
}
