package fleet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"

	"github.com/fleetinfer/fleetinfer/localfleet/loadbalancer"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// The network between the fleet's clusters (package wan): spoke i owns
// SpokeNetwork(i), pods from the bottom, nodes from the top, and the
// addresses below, which no pod or node gets.
//
//	127.(11+i).252.1:6443   the spoke's API server as the hub reaches it (APIAddress)
//	127.(11+i).253.0/24     LoadBalancer Service addresses (LoadBalancerPool)
//	127.(11+i).254.1        the gateway (GatewayAddress)
//
// Connections are told apart by their source address: the fabric applies
// the link between the source's cluster and the listener's on the
// receiving side, and refuses other clusters' connections to pod addresses
// when pod networks are isolated.

// HubCluster is the hub's name in the matrix.
const HubCluster = "hub"

// MatrixFile is the matrix in use, in the fleet's directory.
const MatrixFile = "wan-matrix.yaml"

// PodNetworkName is the pod network every spoke belongs to in flat mode:
// the value of fleetv1alpha1.PodNetworkLabel on its registration.
const PodNetworkName = "localfleet"

// APIAddress is where the hub reaches the index-th spoke's API server:
// a proxy in the spoke's range that carries the hub's traffic over the link
// between the hub and the spoke.
func APIAddress(index int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(11 + index), 252, 1}), 6443)
}

// LoadBalancerPool is the range LoadBalancer Services of the index-th spoke
// get addresses from.
func LoadBalancerPool(index int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{127, byte(11 + index), 253, 0}), 24)
}

// reservedAddresses are the ranges of the index-th spoke that no pod or node
// gets: .252 to .254.
func reservedAddresses(index int) []netip.Prefix {
	out := make([]netip.Prefix, 0, 3)
	for third := byte(252); third <= 254; third++ {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{127, byte(11 + index), third, 0}), 24))
	}
	return out
}

// fleetMatrix is opts.Network (or wan.Default over the spokes) with the hub:
// unless the matrix names it, the hub sits in the first spoke's region,
// wan.DefaultSameRegionRTT from it.
func fleetMatrix(opts Options) (*wan.Matrix, error) {
	names := make([]string, len(opts.Spokes))
	for i, s := range opts.Spokes {
		names[i] = s.Name
	}
	m := wan.Default(names)
	if opts.Network != nil {
		m = opts.Network.Clone()
	}
	for _, n := range names {
		if _, err := m.Link(n, n); err != nil {
			return nil, fmt.Errorf("network matrix: %w", err)
		}
	}
	if _, err := m.Link(HubCluster, HubCluster); err != nil {
		rtt := wan.DefaultSameRegionRTT
		if err := m.Place(HubCluster, names[0], wan.Link{RTT: rtt, Jitter: rtt / 20, Bandwidth: wan.DefaultBandwidth}); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// startFabric builds the network between the clusters and writes its
// matrix to the fleet's directory.
func (f *Fleet) startFabric() error {
	m, err := fleetMatrix(f.opts)
	if err != nil {
		return err
	}
	networks := map[string][]netip.Prefix{}
	for i, s := range f.opts.Spokes {
		networks[s.Name] = []netip.Prefix{SpokeNetwork(f.opts.FirstNetwork + i)}
	}
	if f.fabric, err = wan.NewFabric(wan.FabricOptions{Matrix: m, Networks: networks, PodNetwork: f.opts.PodNetwork,
		Log: f.opts.Log.WithName("wan")}); err != nil {
		return err
	}
	y, err := m.YAML()
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(f.dir, MatrixFile), y, 0o644)
}

// startAPIProxy opens the address the hub reaches spoke s's API server at.
func (f *Fleet) startAPIProxy(s *Cluster) error {
	u, err := url.Parse(s.URL())
	if err != nil {
		return err
	}
	addr := APIAddress(s.NetworkIndex)
	if _, err := f.fabric.Forward(addr.String(), HubCluster, s.Name(), u.Host); err != nil {
		return fmt.Errorf("%s: API server proxy: %w", s.Name(), err)
	}
	s.HubURL = "https://" + addr.String()
	return nil
}

func (f *Fleet) startLoadBalancer(ctx context.Context, s *Cluster) error {
	lb, err := loadbalancer.New(loadbalancer.Options{Cluster: s.Name(), Config: s.Admin(), Pool: LoadBalancerPool(s.NetworkIndex),
		Fabric: f.fabric, Log: f.opts.Log.WithName("loadbalancer").WithValues("cluster", s.Name())})
	if err != nil {
		return err
	}
	if err := lb.Start(ctx); err != nil {
		return err
	}
	s.LoadBalancer = lb
	return nil
}

// servingIPs are the addresses besides its own that a cluster's API server
// certificate must name: a spoke's APIAddress.
func servingIPs(spoke bool, index int) []net.IP {
	if !spoke {
		return nil
	}
	return []net.IP{net.IP(APIAddress(index).Addr().AsSlice())}
}

// Fabric is the network between the clusters: tests and benchmarks change
// links (SetLink), break them (BlackHole, Flap, Heal) and read what crossed
// them (Stats) through it.
func (f *Fleet) Fabric() *wan.Fabric { return f.fabric }

// Matrix is the matrix of links the fleet started with, hub included.
func (f *Fleet) Matrix() *wan.Matrix { return f.fabric.Matrix() }

// PodNetwork is the pod-network mode in use.
func (f *Fleet) PodNetwork() wan.PodNetwork { return f.fabric.PodNetwork() }

// SetPodNetwork switches the pod-network mode at run time, in the fabric
// and on every spoke's registration (fleetv1alpha1.PodNetworkLabel), for a
// test that needs the other mode.
func (f *Fleet) SetPodNetwork(ctx context.Context, mode wan.PodNetwork) error {
	if err := f.fabric.SetPodNetwork(mode); err != nil {
		return err
	}
	for _, s := range f.Spokes {
		if err := f.createManagedCluster(ctx, s); err != nil {
			return err
		}
		if err := f.createClusterProfile(ctx, s); err != nil {
			return err
		}
	}
	return nil
}
