package wan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards the TCP connections it accepts to one target through a Link,
// both directions, in order. Its link can be changed, black-holed and healed
// at run time; every method is safe for concurrent use.
//
// Where it differs from a real wide-area network, so that nobody takes it for
// more faithful than it is:
//
//   - Connecting always succeeds at once, black hole or not: the listener is
//     local and the kernel completes the handshake. A real partition would let
//     SYNs time out. The handshake's cost is charged instead: the client's
//     first bytes reach the target no earlier than 1.5·RTT after the connection
//     was accepted and the target's first bytes reach the client no earlier than
//     1·RTT after it, as if the client had waited for the SYN-ACK. The target is
//     dialled at once, also during a black hole, so it sees a connection a
//     real partition would have kept from it.
//   - Data written during a black hole is dropped, not delivered late when the
//     link heals (TCP would retransmit it). A connection that carried bytes
//     through a hole has lost them: its peers have timed out on it and must not
//     reuse it. A FIN (CloseWrite, Close) is not dropped: it is passed on once
//     the hole heals, as TCP retransmits it.
//   - A black hole drops bytes at the proxy; peers keep writing until their
//     socket buffers fill instead of seeing their own retransmissions fail, and
//     no keep-alive or user timeout of the kernel ever fires because of it.
//   - Bandwidth is per direction per connection, without slow start, a
//     congestion window or a bandwidth-delay cap: N bytes take N/Bandwidth plus
//     the one-way delay on any connection. Connections do not share it.
//   - Loss delays a chunk of up to 32 KiB (one read) by a retransmission
//     timeout; real loss hits segments of ~1.4 KiB and fast retransmit often
//     recovers in one RTT instead.
//   - If the target refuses the connection the client is reset after one
//     RTT (after the hole heals, if the link is black-holed).
type Proxy struct {
	ln     net.Listener
	target string
	link   atomic.Pointer[Link]

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	holed   bool
	healed  chan struct{} // closed while the link is not black-holed
	flapGen uint64        // bumped by BlackHole, Heal and Flap: a running flap stops
	conns   map[net.Conn]struct{}

	accepted, toTarget, fromTarget, dropped atomic.Int64
}

// Stats are the proxy's counters since it started.
type Stats struct {
	// Accepted counts connections accepted, black-holed ones included.
	Accepted int64
	// BytesToTarget and BytesFromTarget count bytes delivered in each direction.
	BytesToTarget, BytesFromTarget int64
	// BytesDropped counts bytes dropped by black holes, both directions.
	BytesDropped int64
}

// readSize is the largest chunk read and delayed as one unit.
const readSize = 32 << 10

// queueChunks bounds the chunks in flight per direction of a connection: a
// slow reader holds the writer back, as a full TCP window does.
const queueChunks = 64

// Listen starts a proxy on addr (a loopback IP and port; port 0 picks a free
// one) that forwards to target (a loopback IP and port) through link.
func Listen(addr, target string, link Link) (*Proxy, error) {
	if err := link.Validate(); err != nil {
		return nil, fmt.Errorf("wan: link: %w", err)
	}
	if err := loopback(addr); err != nil {
		return nil, fmt.Errorf("wan: listen address: %w", err)
	}
	if err := loopback(target); err != nil {
		return nil, fmt.Errorf("wan: target: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("wan: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	healed := make(chan struct{})
	close(healed)
	p := &Proxy{ln: ln, target: target, ctx: ctx, cancel: cancel, healed: healed, conns: map[net.Conn]struct{}{}}
	p.link.Store(&link)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// loopback accepts host:port where host is an IP literal in 127.0.0.0/8 or ::1.
func loopback(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("%q is not a loopback IP address", host)
	}
	return nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address connections are forwarded to.
func (p *Proxy) Target() string { return p.target }

// Link is the link in use.
func (p *Proxy) Link() Link { return *p.link.Load() }

// SetLink changes the link for bytes read from now on, on open connections
// too (a slow-down, a recovery). Bytes already in flight keep their delay.
func (p *Proxy) SetLink(l Link) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("wan: link: %w", err)
	}
	p.link.Store(&l)
	return nil
}

// BlackHole drops everything in both directions, on open and new connections,
// until Heal: no bytes, no FIN, no RST, so peers hang until their own
// timeouts. It stops a running Flap.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flapGen++
	p.setHoleLocked(true)
}

// Heal ends a black hole. Bytes written during it stay dropped. It stops a
// running Flap.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.flapGen++
	p.setHoleLocked(false)
}

// BlackHoled reports whether the link is black-holed now.
func (p *Proxy) BlackHoled() bool {
	holed, _ := p.hole()
	return holed
}

// Flap alternates a black hole and a healed link for d, starting with a black
// hole of period/2 followed by period/2 healed, and leaves the link healed.
// It returns at once; BlackHole, Heal, another Flap or Close stop it early.
func (p *Proxy) Flap(period, d time.Duration) error {
	if period <= 0 || d <= 0 {
		return fmt.Errorf("wan: flap period %s and duration %s must be positive", period, d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("wan: proxy closed")
	}
	p.flapGen++
	gen := p.flapGen
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		end := time.Now().Add(d)
		down := true
		for {
			left := time.Until(end)
			if left <= 0 || !p.setHoleIf(gen, down) {
				break
			}
			t := time.NewTimer(min(period/2, left))
			select {
			case <-t.C:
			case <-p.ctx.Done():
				t.Stop()
				return
			}
			down = !down
		}
		p.setHoleIf(gen, false)
	}()
	return nil
}

// setHoleIf sets the hole if no BlackHole, Heal or Flap came after flap gen.
func (p *Proxy) setHoleIf(gen uint64, holed bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.flapGen != gen {
		return false
	}
	p.setHoleLocked(holed)
	return true
}

func (p *Proxy) setHoleLocked(holed bool) {
	switch {
	case holed && !p.holed:
		p.holed, p.healed = true, make(chan struct{})
	case !holed && p.holed:
		p.holed = false
		close(p.healed)
	}
}

func (p *Proxy) hole() (bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed, p.healed
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	return Stats{
		Accepted:        p.accepted.Load(),
		BytesToTarget:   p.toTarget.Load(),
		BytesFromTarget: p.fromTarget.Load(),
		BytesDropped:    p.dropped.Load(),
	}
}

// Close stops accepting, drops open connections (bytes in flight are lost)
// and waits for every goroutine of the proxy to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	conns := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
	return err
}

// track records an open connection so Close can drop it; false if closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if !p.sleep(10*time.Millisecond, nil) {
				return
			}
			continue
		}
		p.accepted.Add(1)
		p.wg.Add(1) // serve's own count keeps Close's Wait from returning first
		go p.pipe(in)
	}
}

// sleep waits for d; false if the proxy or the connection (done) ended first.
func (p *Proxy) sleep(d time.Duration, done <-chan struct{}) bool {
	if d <= 0 {
		select {
		case <-p.ctx.Done():
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
	case <-p.ctx.Done():
		return false
	case <-done:
		return false
	}
}

// waitHealed waits until the link is not black-holed; false if the proxy or
// the connection ended first.
func (p *Proxy) waitHealed(done <-chan struct{}) bool {
	for {
		holed, healed := p.hole()
		if !holed {
			return true
		}
		select {
		case <-healed:
		case <-p.ctx.Done():
			return false
		case <-done:
			return false
		}
	}
}

// conn is one proxied connection: abort drops both sides at once.
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

func (p *Proxy) pipe(in net.Conn) {
	defer p.wg.Done()
	start := time.Now()
	if !p.track(in) {
		_ = in.Close()
		return
	}
	defer p.untrack(in)
	d := net.Dialer{Timeout: 5 * time.Second}
	out, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		// The refusal travels back to the client: one RTT, after any hole.
		if p.sleep(time.Until(start.Add(p.Link().RTT)), nil) && p.waitHealed(nil) {
			if tc, ok := in.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
		}
		_ = in.Close()
		return
	}
	if !p.track(out) {
		_ = in.Close()
		_ = out.Close()
		return
	}
	defer p.untrack(out)
	c := &conn{in: in, out: out, done: make(chan struct{})}
	rtt := p.Link().RTT
	var wg sync.WaitGroup
	wg.Add(2)
	go p.direction(&wg, c, in, out, start.Add(rtt+rtt/2), &p.toTarget)
	go p.direction(&wg, c, out, in, start.Add(rtt), &p.fromTarget)
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
func (p *Proxy) direction(wg *sync.WaitGroup, c *conn, src, dst net.Conn, floor time.Time, delivered *atomic.Int64) {
	defer wg.Done()
	q := make(chan chunk, queueChunks)
	p.wg.Add(1)
	go p.read(c, src, q, floor)
	for ch := range q {
		if !p.sleep(time.Until(ch.at), c.done) {
			return
		}
		if ch.eof {
			if !p.waitHealed(c.done) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			continue
		}
		if holed, _ := p.hole(); holed {
			p.dropped.Add(int64(len(ch.b)))
			continue
		}
		if _, err := dst.Write(ch.b); err != nil {
			c.abort()
			return
		}
		delivered.Add(int64(len(ch.b)))
	}
}

func (p *Proxy) read(c *conn, src net.Conn, q chan<- chunk, last time.Time) {
	defer p.wg.Done()
	defer close(q)
	buf := make([]byte, readSize)
	var sent time.Time // when the previous chunk finished leaving (bandwidth)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now()
			if holed, _ := p.hole(); holed {
				p.dropped.Add(int64(n))
			} else {
				l := p.Link()
				sent = later(sent, now).Add(l.serialization(n))
				last = later(last, sent.Add(l.oneWay()))
				select {
				case q <- chunk{b: append([]byte(nil), buf[:n]...), at: last}:
				case <-c.done:
					return
				case <-p.ctx.Done():
					return
				}
			}
		}
		if err != nil {
			// EOF, or a reset or Close: pass a FIN on after what was read.
			last = later(last, time.Now().Add(p.Link().RTT/2))
			select {
			case q <- chunk{eof: true, at: last}:
			case <-c.done:
			case <-p.ctx.Done():
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
