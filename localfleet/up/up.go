// Package up keeps a local fleet running for people to use with kubectl:
// `localfleet up` starts it in a directory, writes one kubeconfig with a
// context per cluster and prints how to reach it, and stops it on SIGINT or
// SIGTERM; `localfleet down` sends that signal to the fleet running in the
// directory, found through its state file.
package up

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"

	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// Files in the fleet's directory.
const (
	// KubeconfigFile has a context per cluster: "hub" and each spoke.
	KubeconfigFile = "kubeconfig"
	// StateFile holds the PID and start time of the running `localfleet
	// up`; it exists while the fleet runs.
	StateFile = "localfleet.pid"
	// marker says the directory is a fleet's, so up may clear it.
	marker = ".localfleet"
)

// ReadyLine starts the line up prints once the fleet can take services.
const ReadyLine = "Fleet is up"

// Options configure up.
type Options struct {
	// Dir holds the fleet's state, logs, kubeconfig and state file.
	Dir        string
	Spokes     []fleet.SpokeSpec
	Network    *wan.Matrix
	PodNetwork wan.PodNetwork
	Out        io.Writer
	Log        logr.Logger
}

// Up starts the fleet in opts.Dir and keeps it running until ctx ends, then
// stops it. The kubeconfig is written, and ReadyLine printed, once the hub
// can place on every spoke.
func Up(ctx context.Context, opts Options) (err error) {
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return err
	}
	if err := claim(dir); err != nil {
		return err
	}
	defer os.Remove(filepath.Join(dir, StateFile))
	kubeconfig := filepath.Join(dir, KubeconfigFile)
	defer os.Remove(kubeconfig) // its servers are gone with the fleet
	bins, err := binaries.Locate()
	if err != nil {
		return err
	}
	out := opts.Out
	began := time.Now()
	fmt.Fprintf(out, "Starting the local fleet in %s: a hub and %d GPU clusters\n", dir, len(opts.Spokes))
	f, err := fleet.Start(ctx, fleet.Options{Dir: dir, Spokes: opts.Spokes, Network: opts.Network, PodNetwork: opts.PodNetwork,
		Binaries: &bins, Log: opts.Log})
	if f != nil {
		defer func() {
			fmt.Fprintln(out, "Stopping the fleet")
			f.Stop()
			if alive := f.Registry.Alive(); len(alive) > 0 && err == nil {
				err = fmt.Errorf("processes left running: %v", alive)
			}
			if err == nil {
				fmt.Fprintf(out, "Stopped: all %d processes the fleet started have exited\n", len(f.Registry.Started()))
			}
		}()
	}
	if err != nil {
		return fmt.Errorf("the local fleet did not start: %w", err)
	}
	if err := f.WaitPlaceable(ctx, 3*time.Minute); err != nil {
		return err
	}
	if err := f.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	printAccess(out, f, bins, kubeconfig, time.Since(began))
	<-ctx.Done()
	return nil
}

// claim makes dir the fleet's, cleared of an earlier fleet's state, and
// records this process in its state file. It refuses a directory another
// running fleet holds, and a non-empty one that never held a fleet.
func claim(dir string) error {
	if pid, running := Running(dir); running {
		return fmt.Errorf("a fleet is already running in %s (pid %d); stop it with `localfleet down --dir %s`", dir, pid, dir)
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	case len(entries) > 0:
		if _, err := os.Stat(filepath.Join(dir, marker)); err != nil {
			return fmt.Errorf("%s is not empty and holds no local fleet; choose another --dir", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, marker), nil, 0o644); err != nil {
		return err
	}
	pid := os.Getpid()
	return os.WriteFile(filepath.Join(dir, StateFile), fmt.Appendf(nil, "%d %s\n", pid, process.StartTime(pid)), 0o644)
}

// Running reports the PID of the `localfleet up` that holds dir, if it
// still runs (a PID reused by another process does not count).
func Running(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return 0, false
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return 0, false
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil {
		return 0, false
	}
	return pid, process.StartTime(pid) == fields[1]
}

// Down stops the fleet running in dir and waits until its process has
// exited (it stops every process of the fleet first), at most timeout.
// With no fleet running there it says so and succeeds.
func Down(dir string, timeout time.Duration, out io.Writer) error {
	pid, running := Running(dir)
	if !running {
		fmt.Fprintf(out, "No fleet is running in %s\n", dir)
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop the fleet (pid %d): %w", pid, err)
	}
	fmt.Fprintf(out, "Stopping the fleet in %s (pid %d)\n", dir, pid)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, running := Running(dir); !running {
			fmt.Fprintln(out, "Stopped")
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the fleet (pid %d) was still running %s after SIGTERM", pid, timeout)
}

// printAccess prints the kubeconfig and its contexts, each spoke's gateway
// and what to try.
func printAccess(out io.Writer, f *fleet.Fleet, bins binaries.Set, kubeconfig string, took time.Duration) {
	root, _ := binaries.Root()
	contexts := []string{f.Hub.Name()}
	for _, s := range f.Spokes {
		contexts = append(contexts, s.Name())
	}
	fmt.Fprintf(out, "%s in %.0fs: the hub and %d GPU clusters, %s pod networks.\n\n", ReadyLine, took.Seconds(), len(f.Spokes), f.PodNetwork())
	fmt.Fprintf(out, "Kubeconfig, with the contexts %s:\n  %s\n", strings.Join(contexts, ", "), kubeconfig)
	fmt.Fprintf(out, "Use it, with kubectl and the kubectl-fleetinfer plugin on your PATH, in another shell:\n")
	fmt.Fprintf(out, "  export KUBECONFIG=%s PATH=%s:%s:$PATH\n\n", kubeconfig, filepath.Join(root, "bin"), filepath.Dir(bins.KubeAPIServer))
	fmt.Fprintln(out, "Gateways (a placed service's URL in each cluster is in its status.clusters[].url):")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	for _, s := range f.Spokes {
		fmt.Fprintf(tw, "  %s\t%s\n", s.Name(), s.GatewayURL())
	}
	_ = tw.Flush()
	fmt.Fprintln(out, "\nTry:")
	fmt.Fprintln(out, "  kubectl --context hub get memberclusters")
	fmt.Fprintln(out, "  kubectl fleetinfer status")
	fmt.Fprintf(out, "  kubectl --context %s get nodes,pods -A\n", f.Spokes[0].Name())
	fmt.Fprintf(out, "\nStop the fleet with Ctrl-C, or: %s down --dir %s\n", filepath.Join(root, "bin", "localfleet"), f.Dir())
}
