package federation

import (
	"net/netip"
	"slices"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// Destinations decides which addresses a peer's endpoints may have: a pick
// sends requests to them, so a peer that could announce any address could
// steer this cluster's requests anywhere. An endpoint refused is not held
// (the rest of the peer's endpoints are), and counted in
// fleetinfer_epp_federation_endpoints_refused_total.
type Destinations struct {
	// AllowLoopback admits loopback addresses, for a fleet that lives on
	// loopback (the local fleet); the peer's ranges still apply.
	AllowLoopback bool
	// Own are this cluster's own endpoint ranges (the directory's
	// OwnEndpointCIDRs): a peer never announces them.
	Own []netip.Prefix
}

// Reasons an endpoint's address is refused, the reason label of the metric.
const (
	RefusedLoopback    = "loopback"
	RefusedLinkLocal   = "link-local"
	RefusedUnspecified = "unspecified"
	RefusedMulticast   = "multicast"
	RefusedOwnRange    = "own-range"
	RefusedOutside     = "outside-peer-ranges"
)

// refusal returns why addr may not be an endpoint of a peer whose endpoints
// use ranges (none: any range), or "" when it may.
func (d Destinations) refusal(addr netip.Addr, ranges []netip.Prefix) string {
	addr = addr.Unmap()
	switch {
	case addr.IsUnspecified():
		return RefusedUnspecified
	case addr.IsLoopback() && !d.AllowLoopback:
		return RefusedLoopback
	case addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast():
		return RefusedLinkLocal
	case addr.IsMulticast():
		return RefusedMulticast
	case contains(d.Own, addr):
		return RefusedOwnRange
	case len(ranges) > 0 && !contains(ranges, addr):
		return RefusedOutside
	}
	return ""
}

func contains(ranges []netip.Prefix, addr netip.Addr) bool {
	return slices.ContainsFunc(ranges, func(p netip.Prefix) bool { return p.Contains(addr) })
}

// ForDirectory returns d with the directory's own ranges.
func (d Destinations) ForDirectory(dir *fleetv1alpha1.PeerDirectory) Destinations {
	d.Own = fleetv1alpha1.Prefixes(dir.OwnEndpointCIDRs)
	return d
}
