package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestPartOfNamesWhichPartOfTheLabAProcessIs(t *testing.T) {
	const self, stock = 100, "/repo/bin/gie-epp"
	for _, tc := range []struct {
		name    string
		pid     int
		cmdline []string
		want    string
	}{
		{"this process", self, []string{"/tmp/routingbench", "-scenario", "x"}, partBench},
		{"stock EPP", 7, []string{stock, "--pool-name=llama-gie"}, partStockPickers},
		{"a gie-epp elsewhere is not the one under test", 7, []string{"/elsewhere/gie-epp"}, partOther},
		{"fleetinfer EPP from its image", 8, []string{"/tmp/fleet/images/abc/rootfs/usr/local/bin/epp", "--pool-name=llama"}, partFleetPickers},
		{"simulator", 9, []string{"/repo/bin/sim-v0.10.2/llm-d-inference-sim", "--model", "llama"}, partModelServers},
		{"apiserver", 10, []string{"/repo/bin/kube-v1.36.3/kube-apiserver", "--etcd-servers=x"}, partControl},
		{"etcd", 11, []string{"/repo/bin/etcd-v3.6.16/etcd"}, partControl},
		{"LWS controller", 12, []string{"/repo/bin/lws-v0.8.0/lws", "--config=x"}, partControl},
		{"kernel thread", 13, []string{""}, partOther},
		{"no command line", 14, nil, partOther},
		{"other work", 15, []string{"/usr/bin/go", "build"}, partOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := partOf(tc.pid, tc.cmdline, self, stock); got != tc.want {
				t.Fatalf("partOf = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCPUTableShowsTheMediansOfRunsThatMeasured(t *testing.T) {
	run := func(busy, sims float64) runResult {
		return runResult{Scenario: "hot-cluster", Policy: "fleetinfer", CPU: &cpuUse{MachineBusy: busy, Cores: map[string]float64{partModelServers: sims}}}
	}
	r := &results{Runs: []runResult{run(0.9, 0.4), run(0.5, 0.2), run(0.97, 0.6), {Scenario: "hot-cluster", Policy: "oracle"}}}
	r.summarize()
	var fleet, oracle *summary
	for i := range r.Summary {
		switch r.Summary[i].Policy {
		case "fleetinfer":
			fleet = &r.Summary[i]
		case "oracle":
			oracle = &r.Summary[i]
		}
	}
	if fleet == nil || fleet.CPU == nil || fleet.CPU.MachineBusy != 0.9 || fleet.CPU.Cores[partModelServers] != 0.4 || fleet.CPU.Cores[partFleetPickers] != 0 {
		t.Fatalf("fleetinfer's CPU summary = %+v, want the medians busy 0.9, model servers 0.4, pickers 0", fleet)
	}
	if oracle == nil || oracle.CPU != nil {
		t.Fatalf("a policy whose runs measured no CPU has a CPU summary: %+v", oracle)
	}
	table := r.cpuTable()
	if !strings.Contains(table, "| hot-cluster | fleetinfer | 90% | 0.40 | 0.00 |") || strings.Contains(table, "| oracle |") {
		t.Fatalf("CPU table:\n%s", table)
	}
	if (&results{Summary: []summary{{Scenario: "x", Policy: "oracle"}}}).cpuTable() != "" {
		t.Fatal("a table without any measured run is written")
	}
}

func TestReniceLowersEveryThreadOfAProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := renice(cmd.Process.Pid, controlPlaneNice); err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", cmd.Process.Pid, task.Name()))
		if err != nil {
			t.Fatal(err)
		}
		// The fields after the command's closing parenthesis; niceness is
		// the 19th field of the line, the 17th of these.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if fields[16] != strconv.Itoa(controlPlaneNice) {
			t.Errorf("thread %s has nice %s, want %d", task.Name(), fields[16], controlPlaneNice)
		}
	}
	if err := renice(-1, controlPlaneNice); err == nil {
		t.Error("renice of a process that does not exist succeeded")
	}
}
