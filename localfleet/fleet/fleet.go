// Package fleet runs the local fleet: one hub and several spoke clusters, each
// a real control plane on this machine, with a local kubelet per spoke whose
// fake GPU nodes run model servers as real processes on loopback addresses.
// Tests, `make demo` and the benchmarks all start it through Start.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/apis"
	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/deploy/crds"
	"github.com/fleetinfer/fleetinfer/internal/ociimage"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/gateway"
	"github.com/fleetinfer/fleetinfer/localfleet/kubelet"
	"github.com/fleetinfer/fleetinfer/localfleet/loadbalancer"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
	"github.com/fleetinfer/fleetinfer/localfleet/registry"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// SpokeSpec describes one GPU cluster.
type SpokeSpec struct {
	Name  string
	Nodes []kubelet.NodeSpec
	// Labels go on the cluster's registration (OCM ManagedCluster), e.g. its
	// region, for placement to select on.
	Labels map[string]string
	// SimulatorArgs are default llm-d-inference-sim flags for the model
	// servers of this cluster: its latency model and capacity.
	SimulatorArgs []string
}

// Options configures a fleet.
type Options struct {
	// Dir holds every cluster's state and logs; a temporary directory that
	// Stop removes when empty.
	Dir    string
	Spokes []SpokeSpec
	// Binaries defaults to binaries.Locate().
	Binaries *binaries.Set
	// AvailabilityGrace is how long a spoke's API server may be unreachable
	// before its ManagedCluster turns Available=Unknown (OCM waits five lease
	// periods, 5 min by default).
	AvailabilityGrace time.Duration
	// StatusInterval is how often a spoke's registration status is refreshed.
	StatusInterval time.Duration
	// NoGateways skips the local gateway (package gateway) each spoke
	// otherwise gets, with its GatewayClass and Gateway.
	NoGateways bool
	// NoControllers skips fleetinfer's own controllers (the hub image on the
	// hub, the spoke image in each spoke), for tests of the fleet alone.
	NoControllers bool
	// NoLeaderWorkerSet skips the LeaderWorkerSet controller each spoke
	// otherwise runs (lws.go), which multi-node services need for their
	// pods. It starts beside the kubelet and costs no measurable start-up.
	NoLeaderWorkerSet bool
	// HubArgs are extra flags for the hub.
	HubArgs []string
	// HubReplicas is how many hub processes run (default 1); above 1
	// they elect a leader, as the install manifests' replicas do.
	HubReplicas int
	// ClusterProvider is how the hub finds the spokes (its
	// --cluster-provider): "" or "kubeconfig" for the kubeconfig Secrets,
	// "clusterprofile" for the ClusterProfiles; the fleet writes both.
	ClusterProvider string
	// FirstNetwork is the network index (SpokeNetwork, GatewayAddress) of
	// the first spoke, so that a second fleet can run beside another one.
	FirstNetwork int
	// Network holds the links between the clusters (nil: wan.Default over
	// the spokes, in order). The hub sits in the first spoke's region unless
	// the matrix names a cluster "hub". The matrix in use is written to
	// MatrixFile in Dir.
	Network *wan.Matrix
	// PodNetwork is the pod-network mode: wan.Isolated (the default) or
	// wan.Flat.
	PodNetwork wan.PodNetwork
	Log        logr.Logger
}

// Cluster is one member of the fleet.
type Cluster struct {
	*controlplane.ControlPlane
	// Client is an admin client with the fleet's scheme.
	Client    client.Client
	Clientset kubernetes.Interface
	// Kubelet runs the spoke's pods; nil on the hub.
	Kubelet *kubelet.Kubelet
	// Gateway serves the spoke's Gateway (see gateways.go); nil on the hub
	// and with Options.NoGateways.
	Gateway *gateway.Gateway
	// LoadBalancer serves the spoke's LoadBalancer Services; nil on the hub.
	LoadBalancer *loadbalancer.LoadBalancer
	// NetworkIndex numbers the spoke's loopback range (SpokeNetwork,
	// GatewayAddress).
	NetworkIndex int
	// HubURL is where the hub reaches the spoke's API server: through the
	// link between them (APIAddress). The fleet's own clients use URL().
	HubURL string
	// ControllerMetrics is the Prometheus endpoint of fleetinfer's
	// controller in this cluster, empty when it does not run one; on the
	// hub, the leading replica's as HubLeader last found it.
	ControllerMetrics string
	Spec              SpokeSpec
}

// Fleet is a running local fleet.
type Fleet struct {
	Hub    *Cluster
	Spokes []*Cluster
	// Registry records every process the fleet started.
	Registry *process.Registry
	// StartupTime is how long Start took.
	StartupTime time.Duration
	// StartupStages is how long each stage of Start took, in order.
	StartupStages []Stage
	// Images pulls and unpacks images from the fleet's registry.
	Images *registry.Store
	// ImageDigests maps each fleetinfer image reference the fleet's
	// registry serves to its index digest.
	ImageDigests map[string]string

	opts     Options
	registry *registry.Server
	// mirror maps fleetinfer's image names to the fleet's registry.
	mirror   ociimage.Mirror
	fabric   *wan.Fabric
	netLocks []*os.File
	dir      string
	ownDir   bool
	cancel   context.CancelFunc
	agents   sync.WaitGroup
	stopOnce sync.Once

	// hubArgs are bin/hub's flags: hubBaseArgs, which the fleet needs,
	// then Options.HubArgs (or StartHub's); hubs every replica started.
	hubArgs     []string
	hubBaseArgs []string
	hubMu       sync.Mutex
	hubs        []*HubReplica
	hubsStarted int
}

// Namespace holds the fleet's registration objects on the hub.
const Namespace = "fleetinfer-system"

// Start brings up the hub and spokes in parallel, installs CRDs, starts the
// kubelets and registers every spoke with the hub. On error everything
// already started is stopped.
func Start(ctx context.Context, opts Options) (f *Fleet, err error) {
	began := time.Now()
	if opts.Binaries == nil {
		b, err := binaries.Locate()
		if err != nil {
			return nil, err
		}
		opts.Binaries = &b
	}
	if opts.AvailabilityGrace <= 0 {
		opts.AvailabilityGrace = 15 * time.Second
	}
	if opts.StatusInterval <= 0 {
		opts.StatusInterval = 2 * time.Second
	}
	if err := validate(opts.Spokes, opts.FirstNetwork); err != nil {
		return nil, err
	}
	f = &Fleet{Registry: &process.Registry{}, opts: opts, dir: opts.Dir}
	if opts.FirstNetwork == 0 {
		// Fleets in other processes (a second test package, a demo) must
		// not hand out the same pod addresses or gateway address.
		if f.opts.FirstNetwork, f.netLocks, err = reserveNetworks(len(opts.Spokes)); err != nil {
			return nil, err
		}
		opts.FirstNetwork = f.opts.FirstNetwork
	}
	if f.dir == "" {
		if f.dir, err = os.MkdirTemp("", "fleetinfer-fleet-"); err != nil {
			return nil, err
		}
		f.ownDir = true
	}
	defer func() {
		if err != nil {
			// The error may name a log in the fleet's directory, which
			// Stop removes: carry the log's end in the error instead.
			err = withLogTails(err, f.dir)
			f.Stop()
		}
	}()
	if err := f.startFabric(); err != nil {
		return f, err
	}
	if err := f.startRegistry(ctx); err != nil {
		return f, err
	}
	agentCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel

	hubCRDs, err := HubCRDs()
	if err != nil {
		return nil, err
	}
	spokeCRDs, err := crds.ThirdParty(crds.GroupGIE, crds.GroupGIEExperiment, crds.GroupLWS, crds.GroupGateway)
	if err != nil {
		return nil, err
	}
	// fleetinfer's own APIs exist on both sides: the hub takes services from
	// users, the spokes reconcile their copies.
	own, err := apis.CRDs()
	if err != nil {
		return nil, err
	}
	spokeCRDs = append(spokeCRDs, own...)

	// Control planes first, all at once; each cluster then installs its CRDs.
	f.Spokes = make([]*Cluster, len(opts.Spokes))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		c, err := f.startCluster(gctx, HubName, -1, hubCRDs)
		f.Hub = c
		return err
	})
	for i, s := range opts.Spokes {
		g.Go(func() error {
			c, err := f.startCluster(gctx, s.Name, opts.FirstNetwork+i, spokeCRDs)
			if c != nil {
				c.Spec, c.NetworkIndex = s, opts.FirstNetwork+i
			}
			f.Spokes[i] = c
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return f, err
	}
	f.stage("control planes and CRDs", began)

	stageBegan := time.Now()
	g, gctx = errgroup.WithContext(ctx)
	for _, s := range f.Spokes {
		g.Go(func() error { return f.startKubelet(gctx, s, s.NetworkIndex) })
		g.Go(func() error { return f.startLoadBalancer(gctx, s) })
		g.Go(func() error { return f.startAPIProxy(s) })
	}
	if !opts.NoGateways {
		g.Go(func() error { return f.startGateways(gctx) })
	}
	if !opts.NoControllers {
		for _, s := range f.Spokes {
			g.Go(func() error { return f.startSpokeController(gctx, s) })
		}
	}
	if !opts.NoLeaderWorkerSet {
		for _, s := range f.Spokes {
			g.Go(func() error { return f.startLWS(gctx, s) })
		}
	}
	if err := g.Wait(); err != nil {
		return f, err
	}
	f.stage("kubelets, gateways, controllers", stageBegan)
	stageBegan = time.Now()
	if err := f.registerSpokes(ctx, agentCtx); err != nil {
		return f, err
	}
	f.stage("registration", stageBegan)
	if !opts.NoControllers {
		stageBegan = time.Now()
		if err := f.startHubController(ctx); err != nil {
			return f, err
		}
		f.stage("hub controller", stageBegan)
	}
	f.StartupTime = time.Since(began)
	return f, nil
}

// HubCRDs are the CRDs a hub cluster has: OCM's, the Cluster Inventory
// API's, GIE's and fleetinfer's own.
func HubCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	third, err := crds.ThirdParty(crds.GroupOCMCluster, crds.GroupOCMWork, crds.GroupOCMAddon,
		crds.GroupClusterInv, crds.GroupGIE, crds.GroupGIEExperiment)
	if err != nil {
		return nil, err
	}
	own, err := apis.CRDs()
	if err != nil {
		return nil, err
	}
	return append(third, own...), nil
}

// withLogTails appends to err the last lines of each log file under dir
// that its message names.
func withLogTails(err error, dir string) error {
	if dir == "" {
		return err
	}
	msg := err.Error()
	var tails []string
	for _, field := range strings.FieldsFunc(msg, func(r rune) bool { return r == ' ' || r == ';' || r == '(' || r == ')' || r == ',' }) {
		if !strings.HasPrefix(field, dir) || !strings.HasSuffix(field, ".log") {
			continue
		}
		b, readErr := os.ReadFile(field)
		if readErr != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		tails = append(tails, fmt.Sprintf("last lines of %s:\n%s", filepath.Base(field), strings.Join(lines[max(len(lines)-15, 0):], "\n")))
	}
	if len(tails) == 0 {
		return err
	}
	return fmt.Errorf("%w\n%s", err, strings.Join(tails, "\n"))
}

// Stage is one stage of a fleet's start-up.
type Stage struct {
	Name     string
	Duration time.Duration
}

func (f *Fleet) stage(name string, began time.Time) {
	f.StartupStages = append(f.StartupStages, Stage{name, time.Since(began)})
}

// StartupSummary is the start-up time with its stages, for a log line.
func (f *Fleet) StartupSummary() string {
	parts := make([]string, len(f.StartupStages))
	for i, s := range f.StartupStages {
		parts[i] = fmt.Sprintf("%s %.1fs", s.Name, s.Duration.Seconds())
	}
	return fmt.Sprintf("%.1fs (%s)", f.StartupTime.Seconds(), strings.Join(parts, ", "))
}

func validate(spokes []SpokeSpec, first int) error {
	seen := map[string]bool{HubName: true}
	for _, s := range spokes {
		if s.Name == "" || seen[s.Name] {
			return fmt.Errorf("spoke name %q is empty or not unique (\"hub\" is taken)", s.Name)
		}
		seen[s.Name] = true
		if len(s.Nodes) == 0 {
			return fmt.Errorf("spoke %s has no nodes", s.Name)
		}
	}
	if len(spokes)+first > 100 {
		return errors.New("at most 100 spokes: each gets a 127.x.0.0/16 range from 127.11")
	}
	return nil
}

// startCluster starts the hub (index -1) or the spoke of that network index.
func (f *Fleet) startCluster(ctx context.Context, name string, index int, crdList []*apiextensionsv1.CustomResourceDefinition) (*Cluster, error) {
	b := f.opts.Binaries
	spoke := index >= 0
	cp, err := controlplane.New(controlplane.Options{
		Name: name, Dir: filepath.Join(f.dir, name), Registry: f.Registry,
		ControllerManager: true, Scheduler: spoke, AuditUsers: []string{HubUser}, ServingIPs: servingIPs(spoke, index),
		Binaries: controlplane.Binaries{Etcd: b.Etcd, KubeAPIServer: b.KubeAPIServer,
			KubeControllerManager: b.KubeControllerManager, KubeScheduler: b.KubeScheduler},
	})
	if err != nil {
		return nil, err
	}
	c := &Cluster{ControlPlane: cp}
	if err := cp.Start(ctx); err != nil {
		return c, err
	}
	if c.Client, err = client.New(cp.Admin(), client.Options{Scheme: Scheme}); err != nil {
		return c, err
	}
	if c.Clientset, err = kubernetes.NewForConfig(cp.Admin()); err != nil {
		return c, err
	}
	if err := crds.Install(ctx, cp.Admin(), crdList); err != nil {
		return c, fmt.Errorf("%s: %w", name, err)
	}
	f.opts.Log.Info("cluster up", "cluster", name, "url", cp.URL())
	return c, nil
}

func (f *Fleet) startKubelet(ctx context.Context, c *Cluster, index int) error {
	b := f.opts.Binaries
	k, err := kubelet.New(kubelet.Options{
		Cluster:  c.Name(),
		Config:   c.Admin(),
		Nodes:    c.Spec.Nodes,
		Network:  SpokeNetwork(index),
		Reserved: reservedAddresses(index),
		Fabric:   f.fabric,
		Registry: f.Registry,
		Dir:      filepath.Join(c.Dir(), "kubelet"),
		Version:  "v1.36.3-localfleet",
		Log:      f.opts.Log.WithName("kubelet"),
		Runtimes: kubelet.Runtimes{
			kubelet.SimulatorRuntime{Binary: b.Simulator, Repos: kubelet.DefaultModelServerImages, DefaultArgs: c.Spec.SimulatorArgs},
			kubelet.ImageRuntime{Description: "fleetinfer EPP image from the fleet's registry", Repos: []string{"fleetinfer/epp"}, Images: f.Images,
				Flags: kubelet.PortFlags{Ports: map[string]int32{"grpc-port": 9002, "grpc-health-port": 9003, "metrics-port": 9090, "federation-port": 9004},
					PodIP: []string{fleetv1alpha1.FlagFederationSourceAddress},
					// Pods live on loopback here; each spoke's range still
					// bounds its peers' endpoints (PodCIDRsProperty).
					Args: []string{"--" + fleetv1alpha1.FlagFederationAllowLoopback}}},
			kubelet.ImageRuntime{Description: "fleetinfer spoke image from the fleet's registry", Repos: []string{"fleetinfer/spoke"}, Images: f.Images,
				Flags: kubelet.PortFlags{Addresses: map[string]int32{"metrics-bind-address": 8080, "health-probe-bind-address": 8081}}},
			kubelet.CompletedRuntime{Description: "KServe storage-initializer (no model weights to fetch)", Repos: []string{"kserve/storage-initializer"}},
		},
	})
	if err != nil {
		return err
	}
	if err := k.Start(ctx); err != nil {
		return err
	}
	c.Kubelet = k
	return nil
}

// SpokeNetwork is the loopback range of the index-th spoke's pods and nodes.
func SpokeNetwork(index int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{127, byte(11 + index), 0, 0}), 16)
}

// Spoke returns the spoke of that name, or nil.
func (f *Fleet) Spoke(name string) *Cluster {
	for _, s := range f.Spokes {
		if s != nil && s.Name() == name {
			return s
		}
	}
	return nil
}

// Dir is the fleet's state directory.
func (f *Fleet) Dir() string { return f.dir }

// Stop stops the kubelets (and so every pod process), then the control
// planes, then anything else still running, and removes a temporary
// directory. It is safe to call more than once.
func (f *Fleet) Stop() {
	f.stopOnce.Do(func() {
		defer releaseNetworks(f.netLocks)
		if f.cancel != nil {
			f.cancel()
		}
		f.agents.Wait()
		f.stopGateways()
		for _, s := range f.Spokes {
			if s != nil && s.LoadBalancer != nil {
				s.LoadBalancer.Stop()
			}
		}
		var wg sync.WaitGroup
		for _, s := range f.Spokes {
			if s != nil && s.Kubelet != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.Kubelet.Stop()
				}()
			}
		}
		wg.Wait()
		for _, c := range append([]*Cluster{f.Hub}, f.Spokes...) {
			if c != nil && c.ControlPlane != nil {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.Stop()
				}()
			}
		}
		wg.Wait()
		f.Registry.StopAll(controlplane.StopGrace)
		if f.registry != nil {
			f.registry.Stop()
		}
		if f.fabric != nil {
			f.fabric.Close()
		}
		if f.ownDir {
			_ = os.RemoveAll(f.dir)
		}
	})
}
