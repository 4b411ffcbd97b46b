// Package e2e holds the end-to-end tests of fleetinfer on the local fleet.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// fl is the fleet every test of the package shares: one hub and three spokes
// take several seconds to start, so tests isolate themselves by namespace.
var fl *fleet.Fleet

// orphanGrace is the suite hub's --orphan-grace-period: far shorter than
// the default 60 minutes so that the partition fault case fits the suite.
const orphanGrace = 20 * time.Second

// hubArgs are the suite hub's flags but the orphan grace: a test that needs
// the default grace starts the hub with them alone.
var hubArgs = []string{"--federation-ca-rotation-overlap=" + hubCAOverlap.String()}

// suiteHubArgs are the flags the suite's hub runs with.
func suiteHubArgs() []string {
	return append(slices.Clone(hubArgs), "--orphan-grace-period="+orphanGrace.String())
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := logr.Discard()
	if os.Getenv("FLEET_LOG") != "" {
		log = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 1})
	}
	// The gateways run controller-runtime caches in this process.
	ctrllog.SetLogger(log)
	var err error
	// Two hub replicas elect a leader, as the install manifests' do, so
	// that the fault tests can kill the leader.
	fl, err = fleet.Start(ctx, fleet.Options{Spokes: fleet.DefaultSpokes(), Log: log, HubReplicas: 2,
		HubArgs: suiteHubArgs()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "local fleet did not start:", err)
		if fl != nil {
			fl.Stop()
		}
		return 1
	}
	fmt.Printf("local fleet start-up (hub + %d spokes): %s\n", len(fl.Spokes), fl.StartupSummary())
	// Tests place services from their first second: every spoke must count.
	if err := fl.WaitPlaceable(ctx, 2*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, err)
		fl.Stop()
		return 1
	}
	code := m.Run()
	if bad := fl.NotFromImages(); len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "fleetinfer components ran from binaries, not the registry's images: %v\n", bad)
		code = 1
	}
	fl.Stop()
	if alive := fl.Registry.Alive(); len(alive) > 0 {
		fmt.Fprintf(os.Stderr, "processes left running after the fleet stopped: %v\n", alive)
		return 1
	}
	fmt.Printf("all %d processes the fleet started have exited\n", len(fl.Registry.Started()))
	return code
}
