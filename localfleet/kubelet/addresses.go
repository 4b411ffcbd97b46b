package kubelet

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"

	"github.com/fleetinfer/fleetinfer/localfleet/ports"
)

// addresses hands out loopback addresses from one range: nodes from the top
// down, pods from the bottom up. Pod addresses are not reused until the range
// wraps, so a connection meant for a deleted pod cannot reach its successor.
type addresses struct {
	mu          sync.Mutex
	first, last uint32 // inclusive range
	reserved    []netip.Prefix
	nextPod     uint32
	lowestNode  uint32 // pods stay below the lowest node address
	inUse       map[uint32]bool
}

// newAddresses hands out addresses of p outside reserved.
func newAddresses(p netip.Prefix, reserved []netip.Prefix) *addresses {
	b := p.Masked().Addr().As4()
	first := binary.BigEndian.Uint32(b[:])
	last := first | (1<<(32-p.Bits()) - 1)
	return &addresses{first: first, last: last, reserved: reserved, nextPod: first, lowestNode: last + 1, inUse: map[uint32]bool{}}
}

func toIP(n uint32) string {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	return netip.AddrFrom4(b).String()
}

// usable excludes x.y.z.0 and x.y.z.255, which read as network and broadcast
// addresses though loopback has neither, and the reserved ranges.
func (a *addresses) usable(n uint32) bool {
	if n&0xff == 0 || n&0xff == 0xff {
		return false
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], n)
	for _, r := range a.reserved {
		if r.Contains(netip.AddrFrom4(b)) {
			return false
		}
	}
	return true
}

func (a *addresses) pod() (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for range a.lowestNode - a.first {
		cand := a.nextPod
		a.nextPod++
		if a.nextPod >= a.lowestNode {
			a.nextPod = a.first
		}
		if a.usable(cand) && !a.inUse[cand] {
			a.inUse[cand] = true
			return toIP(cand), nil
		}
	}
	return "", fmt.Errorf("no free pod address in %s-%s", toIP(a.first), toIP(a.last))
}

func (a *addresses) node() (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.lowestNode > a.first+1 {
		a.lowestNode--
		if a.usable(a.lowestNode) {
			a.inUse[a.lowestNode] = true
			return toIP(a.lowestNode), nil
		}
	}
	return "", fmt.Errorf("no free node address in %s-%s", toIP(a.first), toIP(a.last))
}

func (a *addresses) release(ip string) {
	addr, err := netip.ParseAddr(ip)
	if err != nil || !addr.Is4() {
		return
	}
	b := addr.As4()
	a.mu.Lock()
	delete(a.inUse, binary.BigEndian.Uint32(b[:]))
	a.mu.Unlock()
}

// freePort reserves a free local port for a process to listen on.
func freePort() (int, error) {
	free, err := ports.Free(1)
	if err != nil {
		return 0, err
	}
	return free[0], nil
}
