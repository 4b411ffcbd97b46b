package federation

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
)

// partition relays TCP connections to a target and, while holed, drops
// every byte both ways without closing anything: a partition that drops
// packets rather than refusing connections. A connection accepted during
// the hole is never relayed (its handshake is lost for good). Each chunk
// waits half of rtt (ns) before it is relayed, so an exchange pays rtt.
type partition struct {
	ln    net.Listener
	holed atomic.Bool
	rtt   atomic.Int64
	wg    sync.WaitGroup
}

func newPartition(t *testing.T, target string) *partition {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &partition{ln: ln}
	var mu sync.Mutex
	var conns []net.Conn
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, in)
			mu.Unlock()
			if p.holed.Load() {
				p.wg.Add(1)
				go func() { defer p.wg.Done(); _, _ = io.Copy(io.Discard, in) }()
				continue
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, out)
			mu.Unlock()
			for _, pair := range [][2]net.Conn{{in, out}, {out, in}} {
				p.wg.Add(1)
				go func() { defer p.wg.Done(); p.relay(pair[0], pair[1]) }()
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *partition) addr() string { return p.ln.Addr().String() }

// relay copies from src to dst, dropping what arrives while holed.
func (p *partition) relay(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		time.Sleep(time.Duration(p.rtt.Load() / 2))
		if n > 0 && !p.holed.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				_ = dst.(*net.TCPConn).CloseWrite()
			}
			return
		}
	}
}

// eastLinkedToWest starts clusters east and west (with one pod) whose
// directory has east reach west through a partition.
func eastLinkedToWest(t *testing.T) (east *cluster, dir *DirectoryFile, link *partition) {
	t.Helper()
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	dir = writeDirectory(t)
	west := newCluster(t, ca, "west", dir)
	east = newCluster(t, ca, "east", dir)
	west.local.set(localPod("a", "127.12.0.1", 0))
	link = newPartition(t, west.addr)
	writeDirectoryFile(t, dir.Path, fleetv1alpha1.Peer{Cluster: "east", FederationAddress: east.addr, Identity: east.identity},
		fleetv1alpha1.Peer{Cluster: "west", FederationAddress: link.addr(), Identity: west.identity})
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	return east, dir, link
}

// A partition that drops packets makes the subscriber drop the peer's pods
// after the staleness bound, and reconnect attempts made during it, whose
// handshake is lost, give up within that bound too: the peer is back about
// a staleness bound after the partition heals, not after gRPC's 20 s
// connect timeout.
func TestSubscriberIsBackWithinTheStalenessBoundAfterAPartitionHeals(t *testing.T) {
	east, dir, link := eastLinkedToWest(t)
	store := subscribe(t, "east", east.creds, dir)
	waitFor(t, "west subscribed", holds(store, "west", 1))
	link.holed.Store(true)
	waitFor(t, "west dropped", holds(store, "west", 0))
	// Reconnect attempts (every 100 ms at most) go into the hole.
	time.Sleep(500 * time.Millisecond)
	link.holed.Store(false)
	healed := time.Now()
	waitFor(t, "west back after the partition healed", holds(store, "west", 1))
	if took, bound := time.Since(healed), store.StaleAfter()+time.Second; took > bound {
		t.Errorf("west was back %s after the partition healed, want within %s", took, bound)
	}
}

// The round trip to a peer is measured on its subscription and followed
// when the link slows, as the spill policy needs it: from 30 to 150 ms
// within a few pings.
func TestSubscriberMeasuresTheRoundTripAndFollowsALinkThatSlows(t *testing.T) {
	east, dir, link := eastLinkedToWest(t)
	link.rtt.Store(int64(30 * time.Millisecond))
	store := subscribeWith(t, "east", east.creds, dir, time.Second, 20*time.Millisecond)
	rtt := func() time.Duration {
		for _, v := range store.Remote(time.Now()).Peers {
			return v.Origin.RTT()
		}
		return 0
	}
	// Within: at least the link's round trip, and not far above it on a
	// loaded machine.
	within := func(lo, hi time.Duration) func() error {
		return func() error {
			if got := rtt(); got < lo || got > hi {
				return fmt.Errorf("round trip %v, want within [%v, %v]", got, lo, hi)
			}
			return nil
		}
	}
	waitFor(t, "round trip measured", within(30*time.Millisecond, 100*time.Millisecond))
	if got := testutil.ToFloat64(peerRTT.WithLabelValues("west")); got != rtt().Seconds() {
		t.Errorf("fleetinfer_epp_peer_rtt_seconds %v, want %v", got, rtt().Seconds())
	}
	link.rtt.Store(int64(150 * time.Millisecond))
	slowed := time.Now()
	waitFor(t, "round trip follows the slower link", within(140*time.Millisecond, 250*time.Millisecond))
	if took := time.Since(slowed); took > 2*time.Second {
		t.Errorf("took %v to follow the link", took)
	}
}
