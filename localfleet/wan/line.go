package wan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// group owns goroutines and open connections that end together: a proxy's,
// a fabric's listener's, the fabric's flaps. close cancels its context,
// drops its connections and waits for its goroutines.
type group struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

func newGroup() *group {
	ctx, cancel := context.WithCancel(context.Background())
	return &group{ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
}

// spawn runs fn in a goroutine close waits for; false (fn not run) once the
// group is closed.
func (g *group) spawn(fn func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		fn()
	}()
	return true
}

// track records an open connection so close can drop it; false if closed.
func (g *group) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns[c] = struct{}{}
	return true
}

func (g *group) untrack(c net.Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// close runs stop (closing a listener) after cancelling, then drops the open
// connections (bytes in flight are lost) and waits. Only the first call
// does anything; it returns stop's error.
func (g *group) close(stop func() error) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	g.cancel()
	conns := make([]net.Conn, 0, len(g.conns))
	for c := range g.conns {
		conns = append(conns, c)
	}
	g.mu.Unlock()
	var err error
	if stop != nil {
		err = stop()
	}
	for _, c := range conns {
		_ = c.Close()
	}
	g.wg.Wait()
	return err
}

// sleep waits for d; false if the group or the connection (done) ended first.
func (g *group) sleep(d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		select {
		case <-g.ctx.Done():
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-g.ctx.Done():
		return false
	case <-done:
		return false
	}
}

// line is the state of one link at run time: the Link in use and its
// faults (a black hole, a flap). A Proxy has one; a Fabric has one per pair
// of clusters, shared by every listener that carries that pair's traffic.
type line struct {
	link atomic.Pointer[Link]

	mu      sync.Mutex
	holed   bool
	healed  chan struct{} // closed while the link is not black-holed
	flapGen uint64        // bumped by BlackHole, Heal and Flap: a running flap stops
}

func newLine(l Link) *line {
	healed := make(chan struct{})
	close(healed)
	ln := &line{healed: healed}
	ln.link.Store(&l)
	return ln
}

func (l *line) Link() Link { return *l.link.Load() }

func (l *line) setLink(lk Link) error {
	if err := lk.Validate(); err != nil {
		return fmt.Errorf("wan: link: %w", err)
	}
	l.link.Store(&lk)
	return nil
}

func (l *line) blackHole() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flapGen++
	l.setHoleLocked(true)
}

func (l *line) heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flapGen++
	l.setHoleLocked(false)
}

func (l *line) blackHoled() bool {
	holed, _ := l.hole()
	return holed
}

// flap runs in g: closing g stops it.
func (l *line) flap(g *group, period, d time.Duration) error {
	if period <= 0 || d <= 0 {
		return fmt.Errorf("wan: flap period %s and duration %s must be positive", period, d)
	}
	l.mu.Lock()
	l.flapGen++
	gen := l.flapGen
	l.mu.Unlock()
	ok := g.spawn(func() {
		end := time.Now().Add(d)
		down := true
		for {
			left := time.Until(end)
			if left <= 0 || !l.setHoleIf(gen, down) {
				break
			}
			if !g.sleep(min(period/2, left), nil) {
				return
			}
			down = !down
		}
		l.setHoleIf(gen, false)
	})
	if !ok {
		return errors.New("wan: closed")
	}
	return nil
}

// setHoleIf sets the hole if no BlackHole, Heal or Flap came after flap gen.
func (l *line) setHoleIf(gen uint64, holed bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.flapGen != gen {
		return false
	}
	l.setHoleLocked(holed)
	return true
}

func (l *line) setHoleLocked(holed bool) {
	switch {
	case holed && !l.holed:
		l.holed, l.healed = true, make(chan struct{})
	case !holed && l.holed:
		l.holed = false
		close(l.healed)
	}
}

func (l *line) hole() (bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holed, l.healed
}

// waitHealed waits until the link is not black-holed; false if g or the
// connection (done) ended first.
func (l *line) waitHealed(g *group, done <-chan struct{}) bool {
	for {
		holed, healed := l.hole()
		if !holed {
			return true
		}
		select {
		case <-healed:
		case <-g.ctx.Done():
			return false
		case <-done:
			return false
		}
	}
}
