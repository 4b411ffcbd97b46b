package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// profilePhases runs every phase once per EPP under the benchmark's load and
// profiles it into dir: CPU with perf, because the stock EPP serves no CPU
// profile and perf needs no change to either binary; allocations from the
// allocs profile that --enable-pprof serves, in a second pass, because in the
// stock EPP that flag also turns on block and mutex profiling at full rate,
// which would distort the CPU profiles (fleetinfer's records them only with
// --contention-profiling). Each EPP is first profiled idle for 5 s
// (<epp>-idle.cpu.txt); each phase leaves <epp>-<scenario>-<load>.cpu.txt
// (flat and cumulative perf tops) and .allocs.txt (pprof top by bytes and by
// objects), with the raw perf.data and pprof files next to them.
func profilePhases(ctx context.Context, c config, variants []variant, kubeconfig string, servers *modelServers, dir, out string, reg *process.Registry) error {
	perf, err := exec.LookPath("perf")
	if err != nil {
		return fmt.Errorf("profiling needs perf: %w", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, pass := range []string{"cpu", "allocs"} {
		vs := variants
		if pass == "allocs" {
			vs = nil
			for _, v := range variants {
				v.args = append(append([]string(nil), v.args...), "--enable-pprof=true")
				vs = append(vs, v)
			}
		}
		if err := profilePass(ctx, c, vs, pass, perf, kubeconfig, servers, dir, out, reg); err != nil {
			return err
		}
	}
	return nil
}

func profilePass(ctx context.Context, c config, variants []variant, pass, perf, kubeconfig string, servers *modelServers, dir, out string, reg *process.Registry) error {
	procs, err := startEPPs(ctx, variants, kubeconfig, dir, reg)
	defer stopEPPs(procs)
	if err != nil {
		return err
	}
	defer servers.saturated.Store(false)
	if pass == "cpu" {
		// Idle, both EPPs only scrape, and fleetinfer follows its peers.
		time.Sleep(2 * time.Second)
		for _, e := range procs {
			name := filepath.Join(out, e.v.name+"-idle")
			if err := exec.CommandContext(ctx, perf, "record", "-q", "-F", "1999", "-g", "-p", fmt.Sprint(e.p.PID()),
				"-o", name+".perf.data", "--", "sleep", "5").Run(); err != nil {
				return err
			}
			if err := perfTops(ctx, perf, name); err != nil {
				return err
			}
		}
	}
	for _, scenario := range []string{"headroom", "saturated"} {
		servers.saturated.Store(scenario == "saturated")
		time.Sleep(2 * time.Second)
		for _, load := range []string{"sequential", "concurrent"} {
			workers, picks := 1, c.seq
			if load == "concurrent" {
				workers, picks = c.conc, c.concPicks
			}
			for _, e := range procs {
				if _, _, _, err := drive(ctx, e.picker, 1, c.warmup); err != nil {
					return err
				}
				name := filepath.Join(out, fmt.Sprintf("%s-%s-%s", e.v.name, scenario, load))
				pprofURL := strings.TrimSuffix(e.metricsURL, "/metrics") + "/debug/pprof/allocs"
				var rec *exec.Cmd
				if pass == "cpu" {
					rec = exec.CommandContext(ctx, perf, "record", "-q", "-F", "1999", "-g", "-p", fmt.Sprint(e.p.PID()), "-o", name+".perf.data")
					if err := rec.Start(); err != nil {
						return err
					}
					time.Sleep(500 * time.Millisecond) // perf attaches
				} else if err := fetch(ctx, pprofURL, name+".allocs.before.pb.gz"); err != nil {
					return err
				}
				start, cpuFrom := time.Now(), cpuTime(e.p.PID())
				lat, _, _, err := drive(ctx, e.picker, workers, picks)
				if err != nil {
					return err
				}
				cpu, elapsed := cpuTime(e.p.PID())-cpuFrom, time.Since(start)
				if pass == "cpu" {
					_ = rec.Process.Signal(syscall.SIGINT)
					_ = rec.Wait()
					err = perfTops(ctx, perf, name)
				} else if err = fetch(ctx, pprofURL, name+".allocs.after.pb.gz"); err == nil {
					err = allocTops(ctx, name)
				}
				if err != nil {
					return err
				}
				fmt.Printf("  %s %-10s %-9s %-10s p99 %.2f ms  cpu %.0f µs/pick  %.0f picks/s\n", pass, e.v.name, scenario, load,
					pct(lat, 99), float64(cpu.Microseconds())/float64(max(len(lat), 1)), float64(len(lat))/elapsed.Seconds())
			}
		}
	}
	return nil
}

func fetch(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func perfTops(ctx context.Context, perf, name string) error {
	var b strings.Builder
	for _, mode := range []string{"--no-children", "--children"} {
		o, err := exec.CommandContext(ctx, perf, "report", "-i", name+".perf.data", "--stdio", mode,
			"--sort", "sym", "-g", "none", "--percent-limit", "0.5").Output()
		if err != nil {
			return fmt.Errorf("perf report %s: %w", name, err)
		}
		fmt.Fprintf(&b, "==== perf report %s\n%s\n", mode, o)
	}
	return os.WriteFile(name+".cpu.txt", []byte(b.String()), 0o644)
}

func allocTops(ctx context.Context, name string) error {
	var b strings.Builder
	for _, index := range []string{"alloc_space", "alloc_objects"} {
		o, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=40", "-sample_index="+index,
			"-base", name+".allocs.before.pb.gz", name+".allocs.after.pb.gz").Output()
		if err != nil {
			return fmt.Errorf("pprof %s: %w", name, err)
		}
		fmt.Fprintf(&b, "==== %s\n%s\n", index, o)
	}
	return os.WriteFile(name+".allocs.txt", []byte(b.String()), 0o644)
}
