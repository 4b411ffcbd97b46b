package host

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPUCountsUserAndSystemTimeAfterTheCommandName(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       time.Duration
		ok         bool
	}{
		{"plain", "4321 (etcd) S 1 4321 4321 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 1000 10", 3 * time.Second, true},
		{"name with spaces and parentheses", "77 (a (b) c) R 1 77 77 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 10 1", 100 * time.Millisecond, true},
		{"cut short", "77 (x) R 1 77", 0, false},
		{"no name", "77 x R 1", 0, false},
		{"not numbers", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 u s 0 0 20 0 1 0 5 10 1", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseStatCPU(tc.stat)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("parseStatCPU = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestUsedSinceCountsNewAndReusedProcessesWhole(t *testing.T) {
	earlier := Processes{
		1: {Cmdline: []string{"sim"}, CPU: 2 * time.Second},
		2: {Cmdline: []string{"epp"}, CPU: time.Second},
		3: {Cmdline: []string{"gone"}, CPU: time.Second},
	}
	now := Processes{
		1: {Cmdline: []string{"sim"}, CPU: 5 * time.Second},
		2: {Cmdline: []string{"other"}, CPU: 400 * time.Millisecond}, // ID reused
		4: {Cmdline: []string{"new"}, CPU: 300 * time.Millisecond},
	}
	got := now.UsedSince(earlier)
	want := map[int]time.Duration{1: 3 * time.Second, 2: 400 * time.Millisecond, 4: 300 * time.Millisecond}
	if len(got) != len(want) {
		t.Fatalf("UsedSince = %v, want %v", got, want)
	}
	for pid, d := range want {
		if got[pid] != d {
			t.Fatalf("UsedSince[%d] = %v, want %v (all: %v)", pid, got[pid], d, got)
		}
	}
}

func TestReadProcessesSeesThisProcessSpendCPU(t *testing.T) {
	before := ReadProcesses()
	if len(before) == 0 {
		t.Skip("no /proc here")
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	used := ReadProcesses().UsedSince(before)
	if used[os.Getpid()] <= 0 {
		t.Fatalf("a process that spun 200 ms shows %v used", used[os.Getpid()])
	}
}
