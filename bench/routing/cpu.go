package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetinfer/fleetinfer/bench/internal/host"
	"github.com/fleetinfer/fleetinfer/internal/stats"
)

// The parts of the lab whose CPU a run reports. Every cluster's model
// servers, pickers and control plane share this machine's cores, where a
// real fleet gives each cluster its own machines: how busy the cores were
// says how long each pass through a gateway or picker waited for one.
const (
	partModelServers = "model servers"
	partFleetPickers = "fleetinfer pickers"
	partStockPickers = "stock pickers"
	partBench        = "bench process"
	partControl      = "control planes"
	partOther        = "other"
)

// cpuParts orders the parts for the report.
var cpuParts = []string{partModelServers, partFleetPickers, partStockPickers, partBench, partControl, partOther}

// controlPlaneBinaries are the fleet's Kubernetes processes.
var controlPlaneBinaries = []string{"kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "lws"}

// partOf says which part of the lab a process is: this process (the load
// generator, SkyServe's load balancer, the gateways, kubelets and links all
// run in it), the stock EPP binary, fleetinfer's EPP (the image's
// /usr/local/bin/epp), the simulator, a control plane, or other work.
func partOf(pid int, cmdline []string, self int, stockEPP string) string {
	if pid == self {
		return partBench
	}
	if len(cmdline) == 0 || cmdline[0] == "" {
		return partOther
	}
	bin := cmdline[0]
	switch base := filepath.Base(bin); {
	case bin == stockEPP:
		return partStockPickers
	case strings.HasSuffix(bin, "/usr/local/bin/epp"):
		return partFleetPickers
	case base == "llm-d-inference-sim":
		return partModelServers
	case slices.Contains(controlPlaneBinaries, base):
		return partControl
	}
	return partOther
}

// cpuUse is the CPU a run took: how busy the machine's cores were, and how
// many cores each part of the lab used on average, over the run's wall time.
type cpuUse struct {
	MachineBusy float64            `json:"machine_busy"`
	Cores       map[string]float64 `json:"cores"`
}

// cpuMeter reads the CPU counters at a run's start and tells its use at
// the end.
type cpuMeter struct {
	stockEPP string
	began    time.Time
	machine  host.CPU
	procs    host.Processes
}

func startCPUMeter(stockEPP string) *cpuMeter {
	return &cpuMeter{stockEPP: stockEPP, began: time.Now(), machine: host.ReadCPU(), procs: host.ReadProcesses()}
}

// use is the CPU used since the meter started; nil where /proc cannot be
// read.
func (m *cpuMeter) use() *cpuUse {
	wall := time.Since(m.began)
	procs := host.ReadProcesses()
	if len(procs) == 0 || wall <= 0 {
		return nil
	}
	u := &cpuUse{MachineBusy: host.ReadCPU().BusySince(m.machine), Cores: map[string]float64{}}
	self := os.Getpid()
	for pid, d := range procs.UsedSince(m.procs) {
		u.Cores[partOf(pid, procs[pid].Cmdline, self, m.stockEPP)] += d.Seconds() / wall.Seconds()
	}
	return u
}

// medianCPU is the median over runs of each figure; nil without any.
func medianCPU(runs []runResult) *cpuUse {
	var busy []float64
	cores := map[string][]float64{}
	for _, r := range runs {
		if r.CPU == nil {
			continue
		}
		busy = append(busy, r.CPU.MachineBusy)
		for _, p := range cpuParts {
			cores[p] = append(cores[p], r.CPU.Cores[p])
		}
	}
	if len(busy) == 0 {
		return nil
	}
	out := &cpuUse{MachineBusy: stats.Median(busy), Cores: map[string]float64{}}
	for p, v := range cores {
		out.Cores[p] = stats.Median(v)
	}
	return out
}

// controlPlaneNice is the niceness of the control planes during the
// benchmark. A real fleet gives them machines of their own; here they share
// the two cores with the data plane, and every 5 minutes each kube-apiserver
// rebuilds the OpenAPI v3 spec of every CRD (apiextensions' informer
// resync), 1–2 s of CPU for KServe's big CRDs, in every cluster at once. At
// nice 10 that work takes what the data plane leaves idle instead of
// delaying picks and streams.
const controlPlaneNice = 10

// lowerControlPlanes sets every thread of the control-plane processes now
// running to controlPlaneNice.
func lowerControlPlanes(stockEPP string) error {
	self := os.Getpid()
	var errs []error
	for pid, p := range host.ReadProcesses() {
		if partOf(pid, p.Cmdline, self, stockEPP) == partControl {
			errs = append(errs, renice(pid, controlPlaneNice))
		}
	}
	return errors.Join(errs...)
}

// renice sets every thread of process pid to nice. Linux keeps a niceness
// per thread, and a thread a Go runtime starts later takes its creator's.
func renice(pid, nice int) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("renice thread %d of process %d: %w", tid, pid, err)
		}
	}
	return nil
}
