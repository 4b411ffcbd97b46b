package wan

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Stats count what crossed a link: a Proxy's, or one direction of a pair of
// clusters in a Fabric (connections from one cluster to the other, bytes
// both ways on them).
type Stats struct {
	// Accepted counts connections accepted, black-holed ones included,
	// refused ones not.
	Accepted int64
	// BytesToTarget and BytesFromTarget count bytes delivered in each
	// direction: from the connecting side and back to it.
	BytesToTarget, BytesFromTarget int64
	// BytesDropped counts bytes dropped by black holes, both directions.
	BytesDropped int64
	// Refused counts connections reset at once because the pod network
	// does not route them (a Fabric in isolated mode; a Proxy never
	// refuses).
	Refused int64
}

type counters struct {
	accepted, toTarget, fromTarget, dropped, refused atomic.Int64
}

func (c *counters) stats() Stats {
	return Stats{Accepted: c.accepted.Load(), BytesToTarget: c.toTarget.Load(), BytesFromTarget: c.fromTarget.Load(),
		BytesDropped: c.dropped.Load(), Refused: c.refused.Load()}
}

// Dial connects to what a listener forwards to.
type Dial func(ctx context.Context) (net.Conn, error)

// To dials one address.
func To(target string) Dial {
	d := net.Dialer{Timeout: 5 * time.Second}
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) }
}

// readSize is the largest chunk read and delayed as one unit.
const readSize = 32 << 10

// queueChunks bounds the chunks in flight per direction of a connection: a
// slow reader holds the writer back, as a full TCP window does.
const queueChunks = 64

// serveListener accepts on ln until g closes and hands each connection with
// its accept time to handle, in a goroutine of g.
func serveListener(g *group, ln net.Listener, handle func(in net.Conn, accepted time.Time)) {
	g.spawn(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) || !g.sleep(10*time.Millisecond, nil) {
					return
				}
				continue
			}
			start := time.Now()
			if !g.spawn(func() { handle(in, start) }) {
				_ = in.Close()
			}
		}
	})
}

// reset closes c with an RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// conn is one carried connection: abort drops both sides at once.
type conn struct {
	in, out net.Conn
	done    chan struct{}
	once    sync.Once
}

func (c *conn) abort() {
	c.once.Do(func() {
		close(c.done)
		_ = c.in.Close()
		_ = c.out.Close()
	})
}

// carry forwards in (accepted at start) to what dial connects, both
// directions, in order, through l, counting in cnt; it returns when both
// directions have ended. See Proxy for how this differs from a real link.
func carry(g *group, l *line, in net.Conn, start time.Time, dial Dial, cnt *counters) {
	if !g.track(in) {
		_ = in.Close()
		return
	}
	defer g.untrack(in)
	out, err := dial(g.ctx)
	if err != nil {
		// The refusal travels back to the client: one RTT, after any hole.
		if g.sleep(time.Until(start.Add(l.Link().RTT)), nil) && l.waitHealed(g, nil) {
			reset(in)
			return
		}
		_ = in.Close()
		return
	}
	if !g.track(out) {
		_ = in.Close()
		_ = out.Close()
		return
	}
	defer g.untrack(out)
	c := &conn{in: in, out: out, done: make(chan struct{})}
	rtt := l.Link().RTT
	var wg sync.WaitGroup
	wg.Add(2)
	go direction(g, l, &wg, c, in, out, start.Add(rtt+rtt/2), &cnt.toTarget, cnt)
	go direction(g, l, &wg, c, out, in, start.Add(rtt), &cnt.fromTarget, cnt)
	wg.Wait()
	_ = in.Close()
	_ = out.Close()
}

// chunk is bytes read from one side and when to deliver them to the other;
// eof marks the end of the stream (a FIN to pass on).
type chunk struct {
	b   []byte
	at  time.Time
	eof bool
}

// direction forwards src to dst: a reader stamps each chunk with its delivery
// time, the writer sleeps until then and writes it. Delivery times never
// decrease, so nothing is reordered. floor is the earliest delivery (the
// handshake's cost).
func direction(g *group, l *line, wg *sync.WaitGroup, c *conn, src, dst net.Conn, floor time.Time, delivered *atomic.Int64, cnt *counters) {
	defer wg.Done()
	q := make(chan chunk, queueChunks)
	if !g.spawn(func() { read(g, l, c, src, q, floor, cnt) }) {
		return
	}
	for ch := range q {
		if !g.sleep(time.Until(ch.at), c.done) {
			return
		}
		if ch.eof {
			if !l.waitHealed(g, c.done) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			continue
		}
		if l.blackHoled() {
			cnt.dropped.Add(int64(len(ch.b)))
			continue
		}
		if _, err := dst.Write(ch.b); err != nil {
			c.abort()
			return
		}
		delivered.Add(int64(len(ch.b)))
	}
}

func read(g *group, l *line, c *conn, src net.Conn, q chan<- chunk, last time.Time, cnt *counters) {
	defer close(q)
	buf := make([]byte, readSize)
	var sent time.Time // when the previous chunk finished leaving (bandwidth)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now()
			if l.blackHoled() {
				cnt.dropped.Add(int64(n))
			} else {
				lk := l.Link()
				sent = later(sent, now).Add(lk.serialization(n))
				last = later(last, sent.Add(lk.oneWay()))
				select {
				case q <- chunk{b: append([]byte(nil), buf[:n]...), at: last}:
				case <-c.done:
					return
				case <-g.ctx.Done():
					return
				}
			}
		}
		if err != nil {
			// EOF, or a reset or Close: pass a FIN on after what was read.
			last = later(last, time.Now().Add(l.Link().RTT/2))
			select {
			case q <- chunk{eof: true, at: last}:
			case <-c.done:
			case <-g.ctx.Done():
			}
			return
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
