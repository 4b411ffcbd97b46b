// Command localfleet runs the local fleet demo (see package demo) or, with
// `up` and `down`, keeps a local fleet running for kubectl (see package up).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fleetinfer/fleetinfer/localfleet/demo"
	"github.com/fleetinfer/fleetinfer/localfleet/up"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

const usage = `Usage:
  localfleet [flags]         run the demo (make demo)
  localfleet up [flags]      start a fleet and keep it running until Ctrl-C or 'localfleet down' (make fleet-up)
  localfleet down [flags]    stop the fleet running in --dir (make fleet-down)
`

func main() {
	// The in-process parts of the fleet (gateways, kubelets, agents) would
	// otherwise write client-go's and controller-runtime's logs over the
	// progress lines. Each process's log is in its cluster's directory.
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	args := os.Args[1:]
	cmd := ""
	if len(args) > 0 && (args[0] == "up" || args[0] == "down") {
		cmd, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("localfleet "+cmd, flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	var err error
	switch cmd {
	case "up":
		err = runUp(fs, args)
	case "down":
		dir := fs.String("dir", ".fleet", "the fleet's directory")
		timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the fleet to stop")
		_ = fs.Parse(args)
		err = up.Down(*dir, *timeout, os.Stdout)
	default:
		err = runDemo(fs, args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// network adds the flags that shape the network between the clusters and
// returns a function that reads them once the flags are parsed.
func network(fs *flag.FlagSet) func() (*wan.Matrix, wan.PodNetwork) {
	matrix := fs.String("wan-matrix", "", "YAML file of the links between clusters (round trip, jitter, bandwidth, loss per pair; default: modelled on IBM Cloud's Washington DC, Dallas and Toronto)")
	podNetwork := fs.String("pod-network", string(wan.Isolated), "isolated: a cluster's pod addresses are unreachable from the others; flat: reachable through the link")
	return func() (*wan.Matrix, wan.PodNetwork) {
		mode, err := wan.ParsePodNetwork(*podNetwork)
		if err != nil {
			fmt.Fprintln(os.Stderr, "error: --pod-network:", err)
			os.Exit(2)
		}
		var m *wan.Matrix
		if *matrix != "" {
			if m, err = wan.Load(*matrix); err != nil {
				fmt.Fprintln(os.Stderr, "error: --wan-matrix:", err)
				os.Exit(2)
			}
		}
		return m, mode
	}
}

func runUp(fs *flag.FlagSet, args []string) error {
	var opts up.Options
	fs.StringVar(&opts.Dir, "dir", ".fleet", "directory for the fleet's state, logs, kubeconfig and state file (cleared of an earlier fleet's state)")
	spokes := fs.Int("spokes", 3, "number of GPU clusters")
	net := network(fs)
	_ = fs.Parse(args)
	opts.Network, opts.PodNetwork = net()
	opts.Spokes = demo.Spokes(*spokes)
	opts.Out, opts.Log = os.Stdout, demo.ProgressLog(os.Stdout)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return up.Up(ctx, opts)
}

func runDemo(fs *flag.FlagSet, args []string) error {
	var opts demo.Options
	fs.IntVar(&opts.Spokes, "spokes", 3, "number of GPU clusters")
	fs.DurationVar(&opts.LoadDuration, "load-duration", 0, "length of each of the two load phases (default 40s)")
	fs.Float64Var(&opts.Rate, "rate", 0, "requests per second (default 12)")
	fs.Float64Var(&opts.HotShare, "hot-share", 0, "share of requests entering the hot cluster (default 0.75)")
	fs.StringVar(&opts.HotCluster, "hot-cluster", "", "cluster most requests enter (default the last spoke, the smallest)")
	fs.IntVar(&opts.MaxTokens, "max-tokens", 0, "tokens per completion (default 40)")
	replicas := fs.Int("replicas", 0, "the service's replicas across the fleet (default 6)")
	fs.StringVar(&opts.ReportDir, "report-dir", "demo-report", "directory for report.md and its plots")
	fs.StringVar(&opts.Dir, "dir", "", "keep cluster state and logs in this directory instead of a temporary one")
	net := network(fs)
	_ = fs.Parse(args)
	opts.Network, opts.PodNetwork = net()
	opts.Replicas = int32(*replicas)
	opts.Out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return demo.Run(ctx, opts)
}
