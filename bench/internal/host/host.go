// Package host describes the machine a benchmark ran on: results from a
// shared, noisy machine mean little without it.
package host

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Run is what every benchmark's results say of the run itself: when it
// started, how long it took, on what machine, and how loaded that machine
// was at the start and the end. Benchmarks embed it in their results.
type Run struct {
	Started  string `json:"started"`
	Duration string `json:"duration"`
	Machine  string `json:"machine"`
	// LoadAverage is /proc/loadavg's 1-minute figure at the start and end:
	// the machine is shared, and other work inflates tails.
	LoadAverage [2]float64 `json:"load_average"`

	began time.Time
}

// StartRun records the start of a run.
func StartRun() Run {
	now := time.Now()
	return Run{Started: now.UTC().Format(time.RFC3339), Machine: Machine(), LoadAverage: [2]float64{LoadAverage(), 0}, began: now}
}

// Finish records the end of the run.
func (r *Run) Finish() {
	r.LoadAverage[1] = LoadAverage()
	r.Duration = time.Since(r.began).Round(time.Second).String()
}

// Machine is "<cpus> × <model name>" from /proc/cpuinfo, "" elsewhere.
func Machine() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	model, cpus := "", 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			cpus++
			model = strings.TrimSpace(line[strings.IndexByte(line, ':')+1:])
		}
	}
	return fmt.Sprintf("%d × %s", cpus, model)
}

// LoadAverage is the 1-minute load average, 0 when unknown.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}

// CPU is a reading of the machine's CPU time counters (/proc/stat), in
// clock ticks summed over all cores.
type CPU struct{ busy, total uint64 }

// ReadCPU reads the counters; the zero CPU when they cannot be read.
func ReadCPU() CPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPU{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return CPU{}
	}
	var c CPU
	for i, f := range fields[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		c.total += v
		// idle and iowait are the 4th and 5th counters.
		if i != 3 && i != 4 {
			c.busy += v
		}
	}
	return c
}

// BusySince is the share of the machine's CPU time, over all its cores,
// that was busy between an earlier reading and this one: 1 means every core
// was saturated throughout. Zero when either reading is missing.
func (c CPU) BusySince(earlier CPU) float64 {
	if c.total <= earlier.total || earlier.total == 0 {
		return 0
	}
	return float64(c.busy-earlier.busy) / float64(c.total-earlier.total)
}

// Processes is a reading of every process's CPU time, by process ID.
type Processes map[int]Process

// Process is one process's command line and the CPU time it had used
// (user and system) when read.
type Process struct {
	Cmdline []string
	CPU     time.Duration
}

// clockTick is the unit of /proc/<pid>/stat's CPU times: USER_HZ, 100 on
// every Linux architecture Go runs on.
const clockTick = 10 * time.Millisecond

// ReadProcesses reads every process's CPU time from /proc; empty where
// there is no /proc. A process that ends while it is read is left out.
func ReadProcesses() Processes {
	out := Processes{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		cpu, ok := parseStatCPU(string(stat))
		if !ok {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out[pid] = Process{Cmdline: strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"), CPU: cpu}
	}
	return out
}

// parseStatCPU is utime + stime of a /proc/<pid>/stat line. The command
// name in parentheses may hold spaces and parentheses itself, so fields
// count from the last ')'.
func parseStatCPU(stat string) (time.Duration, bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	// After the name: state(3) ppid(4) ... utime(14) stime(15).
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * clockTick, true
}

// UsedSince is the CPU time each process in p used since earlier: all of
// it for a process that started since. Processes that ended in between are
// not in p, so what they used is not counted.
func (p Processes) UsedSince(earlier Processes) map[int]time.Duration {
	out := make(map[int]time.Duration, len(p))
	for pid, now := range p {
		before, ok := earlier[pid]
		if ok && !slices.Equal(before.Cmdline, now.Cmdline) {
			ok = false // the ID was reused
		}
		if !ok {
			out[pid] = now.CPU
			continue
		}
		if now.CPU > before.CPU {
			out[pid] = now.CPU - before.CPU
		}
	}
	return out
}
