// Command localfleet runs the local fleet demo; see package demo.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetinfer/fleetinfer/e2e/demo"
)

func main() {
	var opts demo.Options
	flag.IntVar(&opts.Spokes, "spokes", 3, "number of GPU clusters")
	flag.DurationVar(&opts.Duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	flag.DurationVar(&opts.Refresh, "refresh", 0, "how often to print cluster status (default 5s)")
	flag.StringVar(&opts.Dir, "dir", "", "keep cluster state and logs in this directory instead of a temporary one")
	flag.Parse()
	opts.Out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
