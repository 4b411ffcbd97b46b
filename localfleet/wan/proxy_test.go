package wan

import (
	"bytes"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// server is a loopback TCP server whose handlers Close waits for.
type server struct {
	ln net.Listener
	wg sync.WaitGroup
	mu sync.Mutex
	cs []net.Conn
}

// startServer serves handle on 127.0.0.1 until the test ends.
func startServer(t *testing.T, handle func(net.Conn)) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.cs = append(s.cs, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *server) addr() string { return s.ln.Addr().String() }

func (s *server) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.cs {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// echo copies everything back and half-closes at the client's EOF.
func echo(c net.Conn) {
	_, _ = io.Copy(c, c)
	_ = c.(*net.TCPConn).CloseWrite()
}

func startEcho(t *testing.T) *server { return startServer(t, echo) }

func listen(t *testing.T, target string, l Link) *Proxy {
	t.Helper()
	p, err := Listen("127.0.0.1:0", target, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// exchange sends 16 bytes and reads the echo within 3 s; it returns the time.
func exchange(t *testing.T, c net.Conn) time.Duration {
	t.Helper()
	d, err := tryExchange(c, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func tryExchange(c net.Conn, timeout time.Duration) (time.Duration, error) {
	msg := []byte("0123456789abcdef")
	got := make([]byte, len(msg))
	start := time.Now()
	if err := c.SetDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := c.Write(msg); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, err
	}
	if !bytes.Equal(got, msg) {
		return 0, errors.New("echo differs: " + string(got))
	}
	return time.Since(start), nil
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// fastestExchange is the fastest of n exchanges on c: a link's delay is a
// floor that a loaded machine only adds to (a CPU to wait for, on either
// side), so where a test checks the link's round trip alone the fastest
// exchange tells it, while the median moves when most of them waited.
func fastestExchange(t *testing.T, c net.Conn, n int) time.Duration {
	t.Helper()
	out := exchange(t, c)
	for range n - 1 {
		out = min(out, exchange(t, c))
	}
	return out
}

// medianExchange is the median of n exchanges on c: one exchange can wait
// for a CPU on a loaded machine, the median of several tells the link.
func medianExchange(t *testing.T, c net.Conn, n int) time.Duration {
	t.Helper()
	ds := make([]time.Duration, 0, n)
	for range n {
		ds = append(ds, exchange(t, c))
	}
	return median(ds)
}

func within(t *testing.T, what string, got, want time.Duration, tol float64) {
	t.Helper()
	lo, hi := time.Duration(float64(want)*(1-tol)), time.Duration(float64(want)*(1+tol))
	if got < lo || got > hi {
		t.Errorf("%s = %s, want %s ±%.0f%% [%s, %s]", what, got, want, tol*100, lo, hi)
	} else {
		t.Logf("%s = %s (want %s ±%.0f%%)", what, got, want, tol*100)
	}
}

func TestExchangeThroughProxyPaysOneRTTAndANewConnectionTwo(t *testing.T) {
	echoSrv := startEcho(t)
	for _, tc := range []struct {
		name string
		link Link
	}{
		{"rtt 20ms", Link{RTT: 20 * time.Millisecond}},
		{"rtt 40ms jitter 5%", Link{RTT: 40 * time.Millisecond, Jitter: 2 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := listen(t, echoSrv.addr(), tc.link)
			c := dial(t, p.Addr())
			// The first exchange pays the handshake the kernel skipped.
			within(t, "first exchange on a new connection", exchange(t, c), 2*tc.link.RTT, 0.2)
			within(t, "median exchange", medianExchange(t, c, 10), tc.link.RTT+tc.link.Jitter/2, 0.2)
		})
	}
	t.Run("direct", func(t *testing.T) {
		c := dial(t, echoSrv.addr())
		if m := medianExchange(t, c, 10); m > 5*time.Millisecond {
			t.Errorf("median direct exchange = %s, want under 5ms", m)
		} else {
			t.Logf("median direct exchange = %s", m)
		}
	})
}

// startSink reads n bytes per connection and then answers one byte.
func startSink(t *testing.T, n int) *server {
	return startServer(t, func(c net.Conn) {
		if _, err := io.CopyN(io.Discard, c, int64(n)); err == nil {
			_, _ = c.Write([]byte{1})
		}
	})
}

func TestBandwidthLimitsThroughput(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bytes     int
		bandwidth int64
	}{
		{"256 KiB at 1 MiB/s", 256 << 10, 1 << 20},
		{"1 MiB at 4 MiB/s", 1 << 20, 4 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sink := startSink(t, tc.bytes)
			p := listen(t, sink.addr(), Link{Bandwidth: tc.bandwidth})
			c := dial(t, p.Addr())
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			start := time.Now()
			go func() { _, _ = c.Write(make([]byte, tc.bytes)) }()
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			want := time.Duration(float64(tc.bytes) / float64(tc.bandwidth) * float64(time.Second))
			within(t, "transfer", time.Since(start), want, 0.25)
			// The counter follows the last write, which the answer can overtake.
			got := p.Stats().BytesToTarget
			for deadline := time.Now().Add(time.Second); got != int64(tc.bytes) && time.Now().Before(deadline); got = p.Stats().BytesToTarget {
				time.Sleep(time.Millisecond)
			}
			if got != int64(tc.bytes) {
				t.Errorf("BytesToTarget = %d, want %d", got, tc.bytes)
			}
		})
	}
}

func TestJitterKeepsBytesInOrder(t *testing.T) {
	echoSrv := startEcho(t)
	p := listen(t, echoSrv.addr(), Link{RTT: 10 * time.Millisecond, Jitter: 10 * time.Millisecond})
	c := dial(t, p.Addr())
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	sent := make([]byte, 1<<20)
	for i := range sent {
		sent[i] = byte(i*7 + i/251)
	}
	go func() {
		// Writes of varied sizes make many chunks with their own jitter.
		for off, n := 0, 1; off < len(sent); off, n = off+n, n%9000+1777 {
			if _, err := c.Write(sent[off:min(off+n, len(sent))]); err != nil {
				return
			}
		}
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent) {
		i := 0
		for i < min(len(got), len(sent)) && got[i] == sent[i] {
			i++
		}
		t.Fatalf("echo differs from what was sent: %d bytes back of %d, first difference at %d", len(got), len(sent), i)
	}
	if s := p.Stats(); s.BytesToTarget != int64(len(sent)) || s.BytesFromTarget != int64(len(sent)) {
		t.Errorf("stats %+v, want %d bytes each way", s, len(sent))
	}
}

func TestHalfCloseReachesTheOtherSide(t *testing.T) {
	echoSrv := startEcho(t)
	p := listen(t, echoSrv.addr(), Link{RTT: 20 * time.Millisecond})
	c := dial(t, p.Addr())
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The echo server sees EOF only if the FIN was passed on, and answers with its own.
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last words" {
		t.Fatalf("ReadAll = %q, %v; want the echo and EOF", got, err)
	}
}

// isTimeout reports whether err is a deadline, not an EOF or a reset.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET)
}

func TestBlackHoleHangsPeersUntilHealed(t *testing.T) {
	echoSrv := startEcho(t)
	p := listen(t, echoSrv.addr(), Link{RTT: 20 * time.Millisecond})
	old := dial(t, p.Addr())
	exchange(t, old)

	p.BlackHole()
	if !p.BlackHoled() {
		t.Fatal("BlackHoled() = false after BlackHole")
	}
	if _, err := tryExchange(old, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("exchange on an open connection during a black hole: %v, want a timeout", err)
	}
	during, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatalf("connect during a black hole: %v (the local listener accepts)", err)
	}
	defer during.Close()
	if _, err := tryExchange(during, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("exchange on a new connection during a black hole: %v, want a timeout", err)
	}
	if s := p.Stats(); s.BytesDropped != 32 || s.BytesToTarget != 16 || s.Accepted != 2 {
		t.Errorf("stats %+v, want 32 bytes dropped, only the first exchange's 16 delivered, 2 accepted", s)
	}

	p.Heal()
	start := time.Now()
	if _, err := tryExchange(dial(t, p.Addr()), time.Second); err != nil {
		t.Fatalf("exchange on a new connection after Heal: %v", err)
	}
	t.Logf("first exchange after Heal on a new connection took %s", time.Since(start))
	// What was written during the hole stays lost: nothing arrives late.
	_ = old.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := old.Read(make([]byte, 64)); !isTimeout(err) {
		t.Errorf("after Heal the old connection read %d bytes, %v; want nothing (dropped) and a timeout", n, err)
	}
}

func TestFlapAlternatesAndEndsHealed(t *testing.T) {
	p := listen(t, "127.0.0.1:9", Link{})
	if err := p.Flap(60*time.Millisecond, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	transitions, state := 0, false
	for deadline := time.Now().Add(450 * time.Millisecond); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if s := p.BlackHoled(); s != state {
			transitions, state = transitions+1, s
		}
	}
	// 300ms of 30ms down, 30ms up: ten changes; scheduling may blur a few.
	if transitions < 6 || state {
		t.Errorf("saw %d transitions, black-holed at the end = %v; want at least 6 and healed", transitions, state)
	}

	// BlackHole takes over from a running flap.
	if err := p.Flap(40*time.Millisecond, time.Second); err != nil {
		t.Fatal(err)
	}
	p.BlackHole()
	time.Sleep(100 * time.Millisecond)
	if !p.BlackHoled() {
		t.Error("a flap went on after BlackHole")
	}
}

func TestLostChunksPayTheRetransmissionTimeout(t *testing.T) {
	echoSrv := startEcho(t)
	l := Link{RTT: 20 * time.Millisecond, Loss: 1}
	p := listen(t, echoSrv.addr(), l)
	c := dial(t, p.Addr())
	exchange(t, c) // the handshake's cost is not under test
	// Both the request and the response are lost once.
	within(t, "exchange with every chunk lost", exchange(t, c), l.RTT+2*l.RetransmissionTimeout(), 0.2)

	for _, tc := range []struct{ rtt, want time.Duration }{
		{20 * time.Millisecond, 200 * time.Millisecond},
		{150 * time.Millisecond, 300 * time.Millisecond},
	} {
		if got := (Link{RTT: tc.rtt}).RetransmissionTimeout(); got != tc.want {
			t.Errorf("RetransmissionTimeout with RTT %s = %s, want %s", tc.rtt, got, tc.want)
		}
	}
}

func TestSetLinkChangesTheRTTOfLaterExchanges(t *testing.T) {
	echoSrv := startEcho(t)
	p := listen(t, echoSrv.addr(), Link{RTT: 20 * time.Millisecond})
	c := dial(t, p.Addr())
	exchange(t, c)
	within(t, "fastest exchange before SetLink", fastestExchange(t, c, 5), 20*time.Millisecond, 0.2)
	if err := p.SetLink(Link{RTT: 60 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	within(t, "fastest exchange after SetLink to 60ms", fastestExchange(t, c, 5), 60*time.Millisecond, 0.2)
	if err := p.SetLink(Link{RTT: -time.Millisecond}); err == nil {
		t.Error("SetLink accepted a negative RTT")
	}
}

func TestRefusedTargetResetsTheClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().String()
	ln.Close()
	p := listen(t, closedPort, Link{RTT: 20 * time.Millisecond})
	c := dial(t, p.Addr())
	_, err = tryExchange(c, 2*time.Second)
	if err == nil || isTimeout(err) {
		t.Errorf("exchange with a refused target: %v, want a reset", err)
	}
}

func TestListenTakesOnlyLoopbackAddresses(t *testing.T) {
	for _, tc := range []struct{ addr, target string }{
		{"0.0.0.0:0", "127.0.0.1:80"},
		{":0", "127.0.0.1:80"},
		{"127.0.0.1:0", "10.0.0.1:80"},
		{"127.0.0.1:0", "localhost:80"},
		{"127.0.0.1:0", "[::]:80"},
	} {
		if p, err := Listen(tc.addr, tc.target, Link{}); err == nil {
			p.Close()
			t.Errorf("Listen(%q, %q) succeeded, want an error", tc.addr, tc.target)
		}
	}
	if _, err := Listen("127.0.0.1:0", "127.0.0.1:80", Link{Loss: 2}); err == nil {
		t.Error("Listen accepted a loss of 2")
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	echoSrv := startEcho(t)
	before := runtime.NumGoroutine()

	p, err := Listen("127.0.0.1:0", echoSrv.addr(), Link{RTT: 20 * time.Millisecond, Bandwidth: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	busy := dial(t, p.Addr())
	exchange(t, busy)
	_ = dial(t, p.Addr())                                  // idle
	go func() { _, _ = busy.Write(make([]byte, 4<<20)) }() // bytes in flight at Close
	held := dial(t, p.Addr())
	_, _ = held.Write([]byte("waiting"))
	if err := p.Flap(time.Second, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)

	done := make(chan struct{})
	go func() { _ = p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return within 3s")
	}
	// The echo server's handlers end when the proxy's side closes.
	now := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); now > before && time.Now().Before(deadline); now = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	if now > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines before the proxy, %d after Close:\n%s", before, now, buf[:runtime.Stack(buf, true)])
	}
}
