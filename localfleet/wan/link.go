// Package wan emulates the wide-area links between the clusters of the local
// fleet. Every cluster of the local fleet shares one free loopback network;
// this package puts a TCP proxy with a round trip, jitter, a bandwidth limit
// and loss in the way of traffic that crosses clusters, and lets tests and
// benchmarks break a link at run time (a black hole, a flap, a slow-down).
//
// A Link describes one pair of clusters, a Matrix holds the links of a fleet
// (Default is modelled on published inter-region round trips, Parse reads the
// same shape from YAML or JSON), and a Proxy forwards TCP connections through
// one Link. Traffic inside a cluster does not go through this package.
//
// Only loopback addresses are accepted, as listen addresses and as targets.
package wan

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// MinRetransmissionTimeout is the floor of the retransmission timeout a lost
// chunk pays: Linux's TCP_RTO_MIN.
const MinRetransmissionTimeout = 200 * time.Millisecond

// Link is the behaviour of the path between two clusters, the same in both
// directions. The zero Link is a direct connection.
//
// Delay is applied half each way: a byte takes RTT/2 (plus jitter, plus
// serialization at Bandwidth) from one end to the other, so a request and its
// response pay one RTT.
type Link struct {
	// RTT is the round-trip time: RTT/2 is added to every chunk in each direction.
	RTT time.Duration
	// Jitter bounds a random extra delay per chunk: each direction adds a
	// uniform delay in [0, Jitter/2], so a round trip pays at most RTT+Jitter.
	// A chunk is never delivered before the one written before it on the same
	// connection, so jitter delays bytes but never reorders them (a late chunk
	// holds up the ones behind it, as TCP's in-order delivery does).
	Jitter time.Duration
	// Bandwidth is the capacity of each direction of each connection in bytes
	// per second; 0 is unlimited. It is a serialization delay: a chunk of n
	// bytes leaves n/Bandwidth after the previous one has left.
	Bandwidth int64
	// Loss is the probability that a chunk is lost. A TCP stream cannot lose
	// bytes, so a lost chunk is modelled as TCP recovers from a lost segment:
	// it arrives one retransmission timeout (RetransmissionTimeout) late, and
	// the chunks behind it wait for it.
	Loss float64
}

// IsDirect reports whether the link adds nothing: no proxy is needed.
func (l Link) IsDirect() bool { return l == Link{} }

// RetransmissionTimeout is what a lost chunk pays on top of its delay:
// max(200 ms, 2·RTT). Linux computes the timeout from the smoothed RTT and its
// variance with a 200 ms floor; twice the RTT stands in for that on a link
// whose RTT barely varies.
func (l Link) RetransmissionTimeout() time.Duration {
	return max(MinRetransmissionTimeout, 2*l.RTT)
}

// Validate rejects negative values and a loss outside [0, 1].
func (l Link) Validate() error {
	switch {
	case l.RTT < 0:
		return fmt.Errorf("rtt %s is negative", l.RTT)
	case l.Jitter < 0:
		return fmt.Errorf("jitter %s is negative", l.Jitter)
	case l.Bandwidth < 0:
		return fmt.Errorf("bandwidth %d bytes/s is negative", l.Bandwidth)
	case !(l.Loss >= 0 && l.Loss <= 1): // also rejects NaN
		return fmt.Errorf("loss %v is not a probability between 0 and 1", l.Loss)
	}
	return nil
}

func (l Link) String() string {
	bw := "unlimited"
	if l.Bandwidth > 0 {
		bw = fmt.Sprintf("%d B/s", l.Bandwidth)
	}
	return fmt.Sprintf("rtt %s, jitter %s, bandwidth %s, loss %g", l.RTT, l.Jitter, bw, l.Loss)
}

// oneWay is the delay of one chunk of n bytes in one direction, without
// serialization: half the RTT, a share of the jitter, and a retransmission
// timeout if the chunk is lost.
func (l Link) oneWay() time.Duration {
	d := l.RTT / 2
	if j := int64(l.Jitter / 2); j > 0 {
		d += time.Duration(rand.Int64N(j + 1))
	}
	if l.Loss > 0 && rand.Float64() < l.Loss {
		d += l.RetransmissionTimeout()
	}
	return d
}

// serialization is how long n bytes take to leave at the link's bandwidth.
func (l Link) serialization(n int) time.Duration {
	if l.Bandwidth <= 0 {
		return 0
	}
	return time.Duration(float64(n) / float64(l.Bandwidth) * float64(time.Second))
}
