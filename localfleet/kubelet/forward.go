package kubelet

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"
)

// forwarder makes podIP:port reach a process listening on 127.0.0.1:local,
// standing in for the pod network namespace a real kubelet would create.
type forwarder struct {
	ln    net.Listener
	local string
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func forward(podIP string, port int32, local int) (*forwarder, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(podIP, strconv.Itoa(int(port))))
	if err != nil {
		return nil, err
	}
	f := &forwarder{ln: ln, local: net.JoinHostPort("127.0.0.1", strconv.Itoa(local)), conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		in, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		f.wg.Add(1)
		go f.pipe(in)
	}
}

func (f *forwarder) track(c net.Conn, add bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if add {
		f.conns[c] = struct{}{}
	} else {
		delete(f.conns, c)
	}
}

// pipe copies both ways. A process that is not listening yet (or any more)
// resets the client's connection, as a closed port in the pod would.
func (f *forwarder) pipe(in net.Conn) {
	defer f.wg.Done()
	out, err := net.DialTimeout("tcp", f.local, time.Second)
	if err != nil {
		if tc, ok := in.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = in.Close()
		return
	}
	f.track(in, true)
	f.track(out, true)
	defer func() {
		f.track(in, false)
		f.track(out, false)
	}()
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
	go half(out, in)
	go half(in, out)
	wg.Wait()
	_ = in.Close()
	_ = out.Close()
}

// Close stops accepting and drops open connections.
func (f *forwarder) Close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
