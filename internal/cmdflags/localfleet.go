package cmdflags

import (
	"flag"
	"fmt"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/demo"
	"github.com/fleetinfer/fleetinfer/localfleet/up"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// Network is the flags that shape the network between the clusters.
type Network struct {
	matrix, podNetwork string
}

// AddFlags registers the network flags on fs.
func (n *Network) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&n.matrix, "wan-matrix", "", "YAML file of the links between clusters (round trip, jitter, bandwidth, loss per pair; default: modelled on IBM Cloud's Washington DC, Dallas and Toronto)")
	fs.StringVar(&n.podNetwork, "pod-network", string(wan.Isolated), "isolated: a cluster's pod addresses are unreachable from the others; flat: reachable through the link")
}

// Parse reads the network flags once fs is parsed.
func (n *Network) Parse() (*wan.Matrix, wan.PodNetwork, error) {
	mode, err := wan.ParsePodNetwork(n.podNetwork)
	if err != nil {
		return nil, "", fmt.Errorf("--pod-network: %w", err)
	}
	if n.matrix == "" {
		return nil, mode, nil
	}
	m, err := wan.Load(n.matrix)
	if err != nil {
		return nil, "", fmt.Errorf("--wan-matrix: %w", err)
	}
	return m, mode, nil
}

// Demo is `localfleet`'s command line (the demo).
type Demo struct {
	Options  demo.Options
	Replicas int
	Network  Network
}

// AddFlags registers the demo's flags on fs.
func (d *Demo) AddFlags(fs *flag.FlagSet) {
	opts := &d.Options
	fs.IntVar(&opts.Spokes, "spokes", 3, "number of GPU clusters")
	fs.DurationVar(&opts.LoadDuration, "load-duration", 0, "length of each of the two load phases (default 40s)")
	fs.Float64Var(&opts.Rate, "rate", 0, "requests per second (default 12)")
	fs.Float64Var(&opts.HotShare, "hot-share", 0, "share of requests entering the hot cluster (default 0.75)")
	fs.StringVar(&opts.HotCluster, "hot-cluster", "", "cluster most requests enter (default the last spoke, the smallest)")
	fs.IntVar(&opts.MaxTokens, "max-tokens", 0, "tokens per completion (default 40)")
	fs.IntVar(&d.Replicas, "replicas", 0, "the service's replicas across the fleet (default 6)")
	fs.StringVar(&opts.ReportDir, "report-dir", "demo-report", "directory for report.md and its plots")
	fs.StringVar(&opts.Dir, "dir", "", "keep cluster state and logs in this directory instead of a temporary one")
	d.Network.AddFlags(fs)
}

// Up is `localfleet up`'s command line.
type Up struct {
	Options up.Options
	Spokes  int
	Network Network
}

// AddFlags registers `localfleet up`'s flags on fs.
func (u *Up) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&u.Options.Dir, "dir", ".fleet", "directory for the fleet's state, logs, kubeconfig and state file (cleared of an earlier fleet's state)")
	fs.IntVar(&u.Spokes, "spokes", 3, "number of GPU clusters")
	u.Network.AddFlags(fs)
}

// Down is `localfleet down`'s command line.
type Down struct {
	Dir     string
	Timeout time.Duration
}

// AddFlags registers `localfleet down`'s flags on fs.
func (d *Down) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&d.Dir, "dir", ".fleet", "the fleet's directory")
	fs.DurationVar(&d.Timeout, "timeout", 2*time.Minute, "how long to wait for the fleet to stop")
}
