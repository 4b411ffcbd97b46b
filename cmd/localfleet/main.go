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

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fleetinfer/fleetinfer/internal/cmdflags"
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
		var cl cmdflags.Up
		cl.AddFlags(fs)
		_ = fs.Parse(args)
		err = runUp(&cl)
	case "down":
		var cl cmdflags.Down
		cl.AddFlags(fs)
		_ = fs.Parse(args)
		err = up.Down(cl.Dir, cl.Timeout, os.Stdout)
	default:
		var cl cmdflags.Demo
		cl.AddFlags(fs)
		_ = fs.Parse(args)
		err = runDemo(&cl)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// network reads the network flags, exiting on a bad value.
func network(n *cmdflags.Network) (*wan.Matrix, wan.PodNetwork) {
	m, mode, err := n.Parse()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(2)
	}
	return m, mode
}

func runUp(cl *cmdflags.Up) error {
	opts := cl.Options
	opts.Network, opts.PodNetwork = network(&cl.Network)
	opts.Spokes = demo.Spokes(cl.Spokes)
	opts.Out, opts.Log = os.Stdout, demo.ProgressLog(os.Stdout)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return up.Up(ctx, opts)
}

func runDemo(cl *cmdflags.Demo) error {
	opts := cl.Options
	opts.Network, opts.PodNetwork = network(&cl.Network)
	opts.Replicas = int32(cl.Replicas)
	opts.Out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return demo.Run(ctx, opts)
}
