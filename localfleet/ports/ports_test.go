package ports

import (
	"net"
	"strconv"
	"testing"
)

// Ports come from below the ephemeral range when there is room for the
// span above the floor; otherwise the kernel chooses.
func TestPortsLieBelowTheEphemeralRange(t *testing.T) {
	for _, tc := range []struct {
		name         string
		start        int
		wantLo, want int
	}{
		{"Linux's default range", 32768, 20768, 32768},
		{"a range starting at 49152", 49152, 37152, 49152},
		{"just room", floor + span, floor, floor + span},
		{"no room: the kernel chooses", 1024, 0, 0},
		{"unreadable: the kernel chooses", 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if lo, hi := below(tc.start); lo != tc.wantLo || hi != tc.want {
				t.Errorf("below(%d) = [%d, %d), want [%d, %d)", tc.start, lo, hi, tc.wantLo, tc.want)
			}
		})
	}
}

// Free hands out distinct ports that can be bound, in the range, skipping
// one that something else holds.
func TestFreeSkipsAPortInUse(t *testing.T) {
	if _, err := Free(1); err != nil { // sets the range up
		t.Fatal(err)
	}
	if alloc.hi == 0 {
		t.Skip("this machine's ephemeral range leaves no room below it")
	}
	alloc.mu.Lock()
	taken := alloc.next
	alloc.mu.Unlock()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(taken)))
	if err != nil {
		t.Skipf("port %d is in use already: %v", taken, err)
	}
	defer l.Close()
	got, err := Free(3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range got {
		if p == taken {
			t.Errorf("handed out port %d, which is in use", p)
		}
		if seen[p] {
			t.Errorf("port %d handed out twice in %v", p, got)
		}
		seen[p] = true
		if p < alloc.lo || p >= alloc.hi {
			t.Errorf("port %d outside [%d, %d)", p, alloc.lo, alloc.hi)
		}
		pl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Errorf("port %d cannot be bound: %v", p, err)
			continue
		}
		pl.Close()
	}
}
