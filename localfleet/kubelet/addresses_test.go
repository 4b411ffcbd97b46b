package kubelet

import (
	"net/netip"
	"testing"
)

// Neither pods (bottom up) nor nodes (top down) get a reserved address, even
// once the range wraps.
func TestAddressesSkipReservedRanges(t *testing.T) {
	reserved := netip.MustParsePrefix("127.11.0.64/26") // .64–.127
	a := newAddresses(netip.MustParsePrefix("127.11.0.0/24"), []netip.Prefix{reserved, netip.MustParsePrefix("127.11.0.254/32")})
	node, err := a.node()
	if err != nil || node != "127.11.0.253" {
		t.Fatalf("first node address %q (%v), want 127.11.0.253: .254 is reserved", node, err)
	}
	for range 300 {
		ip, err := a.pod()
		if err != nil {
			t.Fatal(err)
		}
		if reserved.Contains(netip.MustParseAddr(ip)) {
			t.Fatalf("pod address %s is reserved", ip)
		}
		a.release(ip)
	}
}
