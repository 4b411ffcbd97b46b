package wan

import (
	"fmt"
	"net"
	"net/netip"
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
	line   *line
	g      *group
	cnt    counters
}

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
	p := &Proxy{ln: ln, target: target, line: newLine(link), g: newGroup()}
	dial := To(target)
	serveListener(p.g, ln, func(in net.Conn, start time.Time) {
		p.cnt.accepted.Add(1)
		carry(p.g, p.line, in, start, dial, &p.cnt)
	})
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
func (p *Proxy) Link() Link { return p.line.Link() }

// SetLink changes the link for bytes read from now on, on open connections
// too (a slow-down, a recovery). Bytes already in flight keep their delay.
func (p *Proxy) SetLink(l Link) error { return p.line.setLink(l) }

// BlackHole drops everything in both directions, on open and new connections,
// until Heal: no bytes, no FIN, no RST, so peers hang until their own
// timeouts. It stops a running Flap.
func (p *Proxy) BlackHole() { p.line.blackHole() }

// Heal ends a black hole. Bytes written during it stay dropped. It stops a
// running Flap.
func (p *Proxy) Heal() { p.line.heal() }

// BlackHoled reports whether the link is black-holed now.
func (p *Proxy) BlackHoled() bool { return p.line.blackHoled() }

// Flap alternates a black hole and a healed link for d, starting with a black
// hole of period/2 followed by period/2 healed, and leaves the link healed.
// It returns at once; BlackHole, Heal, another Flap or Close stop it early.
func (p *Proxy) Flap(period, d time.Duration) error { return p.line.flap(p.g, period, d) }

// Stats returns the counters.
func (p *Proxy) Stats() Stats { return p.cnt.stats() }

// Close stops accepting, drops open connections (bytes in flight are lost)
// and waits for every goroutine of the proxy to end.
func (p *Proxy) Close() error { return p.g.close(p.ln.Close) }
