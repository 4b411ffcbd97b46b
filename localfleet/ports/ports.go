// Package ports hands out TCP ports on 127.0.0.1 for processes the local
// fleet starts, which bind them themselves a moment later.
//
// A port the kernel picks for a bind to port 0 comes from its ephemeral
// range, the range every outgoing connection also takes its source port
// from. Between the check and the child's own bind, one of the fleet's many
// connections (clients, gateways, scrapes, watches) can take that port, and
// the child exits with "address already in use". Ports from here lie below
// the ephemeral range, where only explicit binds land; each process walks it
// from a random point, so that processes handing out ports side by side
// (test binaries run in parallel) rarely meet.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// span is how many ports below the ephemeral range are used, floor the
// lowest port used: a machine whose ephemeral range starts lower than
// floor+span gets the kernel's choice, as before.
const (
	span  = 12000
	floor = 10000
)

var alloc struct {
	once   sync.Once
	mu     sync.Mutex
	lo, hi int // [lo, hi); hi == 0: let the kernel choose
	next   int
}

// Free reserves n distinct free TCP ports on 127.0.0.1. They are released
// before Free returns; the caller starts the processes that bind them right
// away.
func Free(n int) ([]int, error) {
	alloc.once.Do(func() {
		alloc.lo, alloc.hi = below(ephemeralStart())
		if alloc.hi > 0 {
			alloc.next = alloc.lo + rand.IntN(alloc.hi-alloc.lo)
		}
	})
	var held []net.Listener
	defer func() {
		for _, l := range held {
			_ = l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := listen()
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// listen binds the next free port of the range, or one the kernel picks.
func listen() (net.Listener, error) {
	if alloc.hi == 0 {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	alloc.mu.Lock()
	defer alloc.mu.Unlock()
	var last error
	for range alloc.hi - alloc.lo {
		p := alloc.next
		if alloc.next++; alloc.next == alloc.hi {
			alloc.next = alloc.lo
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			return l, nil
		}
		last = err
	}
	return nil, fmt.Errorf("no free port in %d–%d: %w", alloc.lo, alloc.hi-1, last)
}

// below is the range of ports used under an ephemeral range starting at
// start, or (0, 0) when there is no room for it.
func below(start int) (lo, hi int) {
	if start-span < floor {
		return 0, 0
	}
	return start - span, start
}

// ephemeralStart is the first port of Linux's ephemeral range (32768 by
// default), or 0 where it cannot be read.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return n
}
