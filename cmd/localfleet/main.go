// Command localfleet runs the local fleet demo; see package demo.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fleetinfer/fleetinfer/localfleet/demo"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

func main() {
	var opts demo.Options
	flag.IntVar(&opts.Spokes, "spokes", 3, "number of GPU clusters")
	flag.DurationVar(&opts.LoadDuration, "load-duration", 0, "length of each of the two load phases (default 40s)")
	flag.Float64Var(&opts.Rate, "rate", 0, "requests per second (default 12)")
	flag.Float64Var(&opts.HotShare, "hot-share", 0, "share of requests entering the hot cluster (default 0.75)")
	flag.StringVar(&opts.HotCluster, "hot-cluster", "", "cluster most requests enter (default the last spoke, the smallest)")
	flag.IntVar(&opts.MaxTokens, "max-tokens", 0, "tokens per completion (default 40)")
	var replicas int
	flag.IntVar(&replicas, "replicas", 0, "the service's replicas across the fleet (default 6)")
	flag.StringVar(&opts.ReportDir, "report-dir", "demo-report", "directory for report.md and its plots")
	flag.StringVar(&opts.Dir, "dir", "", "keep cluster state and logs in this directory instead of a temporary one")
	matrix := flag.String("wan-matrix", "", "YAML file of the links between clusters (round trip, jitter, bandwidth, loss per pair; default: modelled on IBM Cloud's Washington DC, Dallas and Toronto)")
	podNetwork := flag.String("pod-network", string(wan.Isolated), "isolated: a cluster's pod addresses are unreachable from the others; flat: reachable through the link")
	flag.Parse()
	var err error
	if opts.PodNetwork, err = wan.ParsePodNetwork(*podNetwork); err != nil {
		fmt.Fprintln(os.Stderr, "error: --pod-network:", err)
		os.Exit(2)
	}
	if *matrix != "" {
		if opts.Network, err = wan.Load(*matrix); err != nil {
			fmt.Fprintln(os.Stderr, "error: --wan-matrix:", err)
			os.Exit(2)
		}
	}
	opts.Replicas = int32(replicas)
	opts.Out = os.Stdout
	// The demo prints its own progress; the in-process parts of the fleet
	// (gateways, kubelets, agents) would otherwise write client-go's and
	// controller-runtime's logs over it. Each process's log is in its
	// cluster's directory (--dir keeps them).
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
