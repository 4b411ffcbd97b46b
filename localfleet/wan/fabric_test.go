package wan

import (
	"cmp"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// Three clusters, each with a /16 of loopback outside the local fleet's
// ranges, 60 ms apart.
const fabricRTT = 60 * time.Millisecond

var fabricNetworks = map[string][]netip.Prefix{
	"a": {netip.MustParsePrefix("127.201.0.0/16")},
	"b": {netip.MustParsePrefix("127.202.0.0/16")},
	"c": {netip.MustParsePrefix("127.203.0.0/16")},
}

func newTestFabric(t *testing.T, mode PodNetwork) *Fabric {
	t.Helper()
	m, err := Parse([]byte("clusters: [a, b, c]\ndefault: {rtt: 60ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := NewFabric(FabricOptions{Matrix: m, Networks: fabricNetworks, PodNetwork: mode})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// serveEcho serves an echo server through f on addr, in cluster.
func serveEcho(t *testing.T, f *Fabric, addr, cluster string, p Policy) string {
	t.Helper()
	echoSrv := startEcho(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.Serve(ln, cluster, p, To(echoSrv.addr()))
	if err != nil {
		t.Fatal(err)
	}
	return s.Addr()
}

// tryDialFrom connects to addr from source (an IP; "" binds nothing).
func tryDialFrom(source, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: time.Second}
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	return d.Dial("tcp", addr)
}

func dialFrom(t *testing.T, source, addr string) net.Conn {
	t.Helper()
	c, err := tryDialFrom(source, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestFabricTellsClustersBySourceAddressAndEnforcesThePodNetwork(t *testing.T) {
	type want int
	const (
		direct want = iota
		linked
		refused
	)
	for _, tc := range []struct {
		name   string
		mode   PodNetwork
		policy Policy
		source string // "" binds nothing: 127.0.0.1
		want   want
	}{
		{"outside every cluster to a pod address", Isolated, PodAddress, "", direct},
		{"same cluster to a pod address", Isolated, PodAddress, "127.202.0.9", direct},
		{"other cluster to a pod address, isolated", Isolated, PodAddress, "127.201.0.9", refused},
		{"other cluster to a pod address, flat", Flat, PodAddress, "127.201.0.9", linked},
		{"other cluster to an exposed address, isolated", Isolated, Exposed, "127.201.0.9", linked},
		{"other cluster to an exposed address, flat", Flat, Exposed, "127.203.0.9", linked},
		{"same cluster to an exposed address", Isolated, Exposed, "127.202.7.7", direct},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newTestFabric(t, tc.mode)
			addr := serveEcho(t, f, "127.202.0.1:0", "b", tc.policy)
			src, _ := f.Cluster(netip.MustParseAddr(cmp.Or(tc.source, "127.0.0.1")))
			c, err := tryDialFrom(tc.source, addr)
			if err == nil {
				defer c.Close()
				_, err = tryExchange(c, time.Second) // also pays the handshake
			}
			if tc.want == refused {
				// The reset reaches the client as its connect completes
				// or on its first exchange.
				if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
					t.Fatalf("connect and exchange: %v, want a reset", err)
				}
				if st := f.Stats(src, "b"); st.Refused != 1 || st.Accepted != 0 {
					t.Fatalf("stats %+v, want 1 refused, 0 accepted", st)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			took := exchange(t, c)
			switch tc.want {
			case linked:
				within(t, "exchange", took, fabricRTT, 0.2)
				_ = c.Close()
				deadline := time.Now().Add(time.Second)
				for f.Stats(src, "b").BytesFromTarget < 32 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if st := f.Stats(src, "b"); st.Accepted != 1 || st.BytesToTarget != 32 || st.BytesFromTarget != 32 || st.Refused != 0 {
					t.Fatalf("stats %s→b %+v, want 1 accepted, 32 bytes each way", src, st)
				}
			case direct:
				if took > fabricRTT/4 {
					t.Fatalf("exchange took %s, want no link", took)
				}
			}
		})
	}
}

// A request pays the RTT of the pair; changing the link changes it.
func TestFabricDelayIsTheLinkOfThePair(t *testing.T) {
	f := newTestFabric(t, Isolated)
	if err := f.SetLink("a", "c", Link{RTT: 120 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	addr := serveEcho(t, f, "127.203.0.1:0", "c", Exposed)
	for _, tc := range []struct {
		source string
		rtt    time.Duration
	}{{"127.201.0.5", 120 * time.Millisecond}, {"127.202.0.5", fabricRTT}} {
		c := dialFrom(t, tc.source, addr)
		exchange(t, c)
		within(t, "fastest exchange from "+tc.source, fastestExchange(t, c, 5), tc.rtt, 0.2)
	}
}

func TestFabricBlackHoleHangsThePairWithoutResetUntilHealed(t *testing.T) {
	f := newTestFabric(t, Isolated)
	addr := serveEcho(t, f, "127.202.0.1:0", "b", Exposed)
	old := dialFrom(t, "127.201.0.5", addr)
	exchange(t, old)
	if err := f.BlackHole("b", "a"); err != nil {
		t.Fatal(err)
	}
	if !f.BlackHoled("a", "b") || f.BlackHoled("c", "b") {
		t.Fatal("the black hole is not on a–b alone")
	}
	if _, err := tryExchange(old, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("open connection during the black hole: %v, want a timeout (no RST)", err)
	}
	if _, err := tryExchange(dialFrom(t, "127.201.0.5", addr), 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("new connection during the black hole: %v, want a timeout (no RST)", err)
	}
	if _, err := tryExchange(dialFrom(t, "127.203.0.5", addr), time.Second); err != nil {
		t.Errorf("c to b during a black hole between a and b: %v", err)
	}
	if err := f.Heal("a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := tryExchange(dialFrom(t, "127.201.0.5", addr), time.Second); err != nil {
		t.Errorf("new connection after Heal: %v", err)
	}
}

// Forward charges the link of a fixed source cluster whatever the client's
// address, and shares the pair's black hole.
func TestFabricForwardAttributesEveryConnectionToItsSource(t *testing.T) {
	f := newTestFabric(t, Isolated)
	echoSrv := startEcho(t)
	s, err := f.Forward("127.202.252.1:0", "a", "b", echoSrv.addr())
	if err != nil {
		t.Fatal(err)
	}
	c := dialFrom(t, "", s.Addr())
	exchange(t, c)
	within(t, "fastest exchange", fastestExchange(t, c, 5), fabricRTT, 0.2)
	if st := f.Stats("a", "b"); st.Accepted != 1 {
		t.Fatalf("stats a→b %+v, want 1 accepted", st)
	}
	if err := f.BlackHole("a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := tryExchange(c, 300*time.Millisecond); !isTimeout(err) {
		t.Errorf("during the black hole: %v, want a timeout", err)
	}
}

func TestFabricRefusesUnknownClustersAndLinks(t *testing.T) {
	f := newTestFabric(t, Isolated)
	for _, err := range []error{f.BlackHole("a", "nowhere"), f.Heal("a", "a"), f.SetLink("x", "y", Link{})} {
		if err == nil {
			t.Error("no error for a pair that is not a link of the matrix")
		}
	}
	if _, err := NewFabric(FabricOptions{Matrix: Default([]string{"a"}), Networks: fabricNetworks}); err == nil {
		t.Error("a network of a cluster the matrix does not name was accepted")
	}
	if _, err := ParsePodNetwork("routed"); err == nil {
		t.Error(`pod network "routed" was accepted`)
	}
	ln, err := f.Listen("127.202.0.1:0", "b", Exposed)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := f.Serve(ln, "nowhere", Exposed, To("127.0.0.1:9")); err == nil {
		t.Error("a listener of a cluster the matrix does not name was served")
	}
}
