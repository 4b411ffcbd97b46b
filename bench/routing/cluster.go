package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/kubelet"
)

// Pool names: fleetinfer's federated pool and, over the same model-server
// pods, a second InferencePool picked by GIE's stock EPP.
const (
	fleetPool = "llama"
	stockPool = "llama-gie"
	// stockImage is GIE's published EPP image; the router node's kubelet
	// runs it as the stock binary.
	stockImage  = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
	routerTaint = "fleetinfer.io/router"
)

// startRouterNodes gives every spoke a tainted CPU node whose own local
// kubelet runs GIE's stock EPP image as bin/gie-epp: the fleet's kubelets
// run only fleetinfer's EPP image, and the stock picker should be a pod of
// the cluster like any other, found by the gateway through its Service. Its
// pods take addresses from 127.<spoke>.200.0/24, inside the spoke's range
// and far above the addresses the spoke's kubelet hands out.
func startRouterNodes(ctx context.Context, fl *fleet.Fleet, stockEPP string) ([]*kubelet.Kubelet, error) {
	var out []*kubelet.Kubelet
	for _, s := range fl.Spokes {
		base := fleet.SpokeNetwork(s.NetworkIndex).Addr().As4()
		k, err := kubelet.New(kubelet.Options{
			Cluster: s.Name(), Config: s.Admin(), Registry: fl.Registry,
			Nodes: []kubelet.NodeSpec{{Name: s.Name() + "-router", CPU: "8", Memory: "32Gi",
				Taints: []corev1.Taint{{Key: routerTaint, Effect: corev1.TaintEffectNoSchedule}}}},
			Network: netip.PrefixFrom(netip.AddrFrom4([4]byte{base[0], base[1], 200, 0}), 24),
			Dir:     filepath.Join(fl.Dir(), s.Name()+"-router"),
			Runtimes: kubelet.Runtimes{kubelet.BinaryRuntime{
				Description: "GIE v1.5.0 EPP image as the stock binary", Repos: []string{"gateway-api-inference-extension/epp"},
				Binary: stockEPP,
				Flags:  kubelet.PortFlags{Ports: map[string]int32{"grpc-port": fedpool.GRPCPort, "grpc-health-port": fedpool.HealthPort, "metrics-port": fedpool.MetricsPort}}}},
			Log: logr.Discard(),
		})
		if err == nil {
			err = k.Start(ctx)
		}
		if err != nil {
			stopAll(out)
			return nil, fmt.Errorf("%s router node: %w", s.Name(), err)
		}
		out = append(out, k)
	}
	return out, nil
}

func stopAll(ks []*kubelet.Kubelet) {
	for _, k := range ks {
		k.Stop()
	}
}

// deployment is one scenario's pools in every cluster.
type deployment struct {
	fl   *fleet.Fleet
	ns   string
	pool *fedpool.Pool
	// podCluster maps model-server pod names to cluster indices.
	podCluster map[string]int
	// links carry the benchmark's own connections between clusters.
	links *fabricLinks
}

// deploy creates the scenario's model servers and fleetinfer's federated
// pool with fedpool (Parent mode where pod networks are isolated, Endpoint
// mode where they are flat), then the stock pool over the same pods, and
// warms both paths of every gateway with completions of maxTokens.
// fleetinfer's pickers run with eppConfig and the extra flags eppArgs.
func deploy(ctx context.Context, fl *fleet.Fleet, sc scenario, ns, eppConfig string, eppArgs []string, maxTokens int) (*deployment, error) {
	opts := fedpool.Options{Namespace: ns, Pool: fleetPool, EPPConfig: eppConfig, EPPArgs: eppArgs}
	for i, s := range fl.Spokes {
		opts.Members = append(opts.Members, &fedpool.Member{Cluster: s, Replicas: sc.Replicas[i], SimArgs: sc.simArgs(i),
			Mode: sc.mode()})
	}
	pool, err := fedpool.Deploy(ctx, opts)
	if err != nil {
		return nil, err
	}
	var clusters []string
	for _, s := range fl.Spokes {
		clusters = append(clusters, s.Name())
	}
	d := &deployment{fl: fl, ns: ns, pool: pool, podCluster: map[string]int{}, links: newFabricLinks(fl.Fabric(), clusters)}
	for i, s := range fl.Spokes {
		for _, o := range []client.Object{fedpool.InferencePool(ns, stockPool, fleetPool, fedpool.EPPName(stockPool)),
			fedpool.EPPService(ns, fedpool.EPPName(stockPool)), stockEPPPod(s, ns),
			fedpool.Route(ns, stockPool, fedpool.Host(stockPool, ns), fedpool.PoolRule(stockPool))} {
			if err := s.Client.Create(ctx, o); err != nil {
				return nil, fmt.Errorf("%s: create %T %s: %w", s.Name(), o, o.GetName(), err)
			}
		}
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": fleetPool}); err != nil {
			return nil, err
		}
		for _, p := range pods.Items {
			if _, dup := d.podCluster[p.Name]; dup {
				return nil, fmt.Errorf("pod name %s in two clusters: served clusters would be ambiguous", p.Name)
			}
			d.podCluster[p.Name] = i
		}
	}
	for _, s := range fl.Spokes {
		if err := fedpool.RouteAccepted(ctx, s, ns, stockPool, time.Minute); err != nil {
			return nil, err
		}
		if err := stockEPPReady(ctx, fl, s, ns); err != nil {
			return nil, err
		}
	}
	return d, d.warm(ctx, maxTokens, pool.Host(), fedpool.Host(stockPool, d.ns))
}

// stockEPPPod is the stock picker's pod in cluster s, on its router node. It
// is a bare pod, so that the cluster-lost scenario's kill leaves it dead.
func stockEPPPod(s *fleet.Cluster, ns string) *corev1.Pod {
	epp := fedpool.EPPPod(ns, stockPool, stockImage)
	epp.Spec.NodeName = s.Name() + "-router"
	epp.Spec.Tolerations = []corev1.Toleration{{Key: routerTaint, Operator: corev1.TolerationOpExists}}
	return epp
}

// stockEPPReady waits for the stock picker of cluster s to be Ready. One
// whose binary exited at start is replaced, at most twice, with the end of
// its log (the kubelet's termination message) in the output, as a
// ReplicaSet would replace a failed pod.
func stockEPPReady(ctx context.Context, fl *fleet.Fleet, s *fleet.Cluster, ns string) error {
	key := client.ObjectKey{Namespace: ns, Name: fedpool.EPPName(stockPool)}
	for attempt := 1; ; attempt++ {
		var failed *corev1.Pod
		err := fedpool.Wait(ctx, time.Minute, s.Name()+" stock EPP ready", func(ctx context.Context) error {
			var p corev1.Pod
			if err := s.Client.Get(ctx, key, &p); err != nil {
				return err
			}
			if p.Status.Phase == corev1.PodFailed {
				failed = &p
				return nil
			}
			if !fedpool.PodReady(&p) {
				return fmt.Errorf("phase %s, containers %+v", p.Status.Phase, p.Status.ContainerStatuses)
			}
			return nil
		})
		if err != nil || failed == nil {
			return err
		}
		why := fmt.Sprintf("%s stock EPP exited at start (attempt %d): %s", s.Name(), attempt, fedpool.TerminationMessage(failed))
		if attempt == 3 {
			return errors.New(why)
		}
		fmt.Println("  " + why + "; replacing it")
		if err := s.Client.Delete(ctx, failed); client.IgnoreNotFound(err) != nil {
			return err
		}
		if err := fedpool.Wait(ctx, time.Minute, s.Name()+" failed stock EPP gone", func(ctx context.Context) error {
			var p corev1.Pod
			if err := s.Client.Get(ctx, key, &p); err == nil {
				return fmt.Errorf("still there (%s)", p.Status.Phase)
			} else {
				return client.IgnoreNotFound(err)
			}
		}); err != nil {
			return err
		}
		if err := s.Client.Create(ctx, stockEPPPod(s, ns)); err != nil {
			return err
		}
	}
}

// warm sends a few completions of maxTokens through every gateway to each
// of hosts (pools' route hosts), until each answers 4 times: pickers have
// scraped their pods and connections are open. The completions are as long
// as the run's, so that the pickers' measured service times start at what
// the run's requests take.
func (d *deployment) warm(ctx context.Context, maxTokens int, hosts ...string) error {
	c := newLoadClient(maxTokens, 10*time.Second, d.podCluster, nil)
	for i, s := range d.fl.Spokes {
		for _, host := range hosts {
			r := &entryRouter{gws: gateways{s.GatewayURL()}, host: host}
			n, ok := 0, 0
			if err := fedpool.Wait(ctx, time.Minute, s.Name()+" serves "+host, func(ctx context.Context) error {
				res := c.do(ctx, r, arrival{Prompt: "warm up " + strconv.Itoa(n)}, time.Now())
				n++
				if !res.ok() {
					return errors.New(res.Err)
				}
				if ok++; ok < 4 {
					return errors.New("warming")
				}
				return nil
			}); err != nil {
				return fmt.Errorf("cluster %d: %w", i, err)
			}
		}
	}
	return nil
}

// poolOf is the pool whose pickers route policy pol's requests; "" for the
// oracle, which routes in this process.
func poolOf(pol string) string {
	switch pol {
	case "fleetinfer":
		return fleetPool
	case "oracle":
		return ""
	}
	return stockPool
}

// idleLabel is a label no model server carries: a pool whose selector also
// asks for it selects no pod.
const idleLabel = "bench.fleetinfer.io/idle"

// usePool gives the model servers to pool's pickers in every cluster and
// takes them from the other pool's (from both for ""), then, if pool had
// none, warms its route through every gateway. A fleet runs one set of
// pickers; with both scraping every pod all the time, each policy's run
// would share the machine's two cores with the other set's scrapes (about
// a fifth of a core), which no real fleet pays. A pool that selects no pod
// has nothing to scrape: GIE's datastore resyncs its pods when the pool's
// selector changes, so neither picker restarts.
func (d *deployment) usePool(ctx context.Context, pool string, maxTokens int) error {
	given := false
	for _, s := range d.fl.Spokes {
		for _, name := range []string{fleetPool, stockPool} {
			want := map[inferencev1.LabelKey]inferencev1.LabelValue{"app": fleetPool}
			if name != pool {
				want[idleLabel] = "true"
			}
			var p inferencev1.InferencePool
			if err := s.Client.Get(ctx, client.ObjectKey{Namespace: d.ns, Name: name}, &p); err != nil {
				return fmt.Errorf("%s: %w", s.Name(), err)
			}
			if maps.Equal(p.Spec.Selector.MatchLabels, want) {
				continue
			}
			patch := client.MergeFrom(p.DeepCopy())
			p.Spec.Selector.MatchLabels = want
			if err := s.Client.Patch(ctx, &p, patch); err != nil {
				return fmt.Errorf("%s: select pods for pool %s: %w", s.Name(), name, err)
			}
			given = given || name == pool
		}
	}
	if !given {
		return nil
	}
	return d.warm(ctx, maxTokens, fedpool.Host(pool, d.ns))
}

// crossingBurst is how many completions warmLinks sends at once from each
// cluster: more than a cluster's batch slots, so that the policy crosses
// with some, about as many at once as a scenario's busiest moments cross.
const crossingBurst = 24

// warmLinks sends a burst of completions of maxTokens from each cluster
// through r, the policy about to run, with c, the run's client, and returns
// how many of each burst crossed. A fleet serving steady traffic holds its
// connections across the links open: fleetinfer's gateways' to the other
// gateways, SkyServe's clients' to its load balancer and the load
// balancer's to the gateways, the oracle's to the pods. Between this
// benchmark's runs of one policy the others run for minutes, long enough
// for a gateway to drop the other gateways' hosts as the ORIGINAL_DST
// cluster of deploy/envoy/envoy.yaml does (2 minutes unused). Without the
// burst a run would pay connections' handshakes over the links on its
// first crossings.
func (d *deployment) warmLinks(ctx context.Context, r router, c *loadClient) ([]int, error) {
	crossed := make([]int, len(d.fl.Spokes))
	for i := range d.fl.Spokes {
		burst := make([]arrival, crossingBurst)
		for j := range burst {
			burst[j] = arrival{Entry: i, Prompt: fmt.Sprintf("warm up crossings %d %d", i, j), Prefix: -1}
		}
		for _, res := range c.runLoad(ctx, r, burst, crossingBurst, time.Now()) {
			if !res.ok() {
				return nil, fmt.Errorf("%s: warming crossings: %s", d.fl.Spokes[i].Name(), res.Err)
			}
			if res.Served != i {
				crossed[i]++
			}
		}
	}
	return crossed, nil
}

// gateways are the spokes' gateway URLs now.
func (d *deployment) gateways() gateways {
	var out gateways
	for _, s := range d.fl.Spokes {
		out = append(out, s.GatewayURL())
	}
	return out
}

// lose kills cluster c at once, as a lost cluster goes: every process of
// the scenario's pods there (model servers, both pickers) gets SIGKILL, the
// model-server Deployment is scaled to zero so that nothing restarts them
// (the pickers are bare pods), and the cluster's gateway stops listening.
// The gateway comes back with restoreGateway.
func (d *deployment) lose(ctx context.Context, c int) error {
	s := d.fl.Spokes[c]
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(d.ns)); err != nil {
		return err
	}
	var errs []error
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			pid, err := strconv.Atoi(strings.TrimPrefix(cs.ContainerID, "localfleet://"))
			if err != nil || pid <= 1 {
				continue
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("kill %s: %w", p.Name, err))
			}
		}
	}
	go s.Gateway.Stop()
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: d.ns, Name: fleetPool}}
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))
	errs = append(errs, s.Client.Patch(ctx, dep, patch))
	return errors.Join(errs...)
}

// gatewayReady is the load balancer's readiness probe of a cluster: the
// gateway's own /readyz on its admin port.
func gatewayReady(ctx context.Context, s *fleet.Cluster) bool {
	if s.Gateway == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	u := strings.TrimSuffix(s.Gateway.MetricsURL(), "/metrics") + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// remove deletes the scenario's namespace in every cluster and waits (a
// bounded time) for its pods to be gone, so that the next scenario does not
// share the machine with them.
func (d *deployment) remove(ctx context.Context) error {
	d.links.close()
	for _, s := range d.fl.Spokes {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: d.ns}}
		if err := client.IgnoreNotFound(s.Client.Delete(ctx, ns, client.GracePeriodSeconds(0))); err != nil {
			return err
		}
	}
	for _, s := range d.fl.Spokes {
		if err := fedpool.Wait(ctx, 30*time.Second, s.Name()+" pods of "+d.ns+" gone", func(ctx context.Context) error {
			var pods corev1.PodList
			if err := s.Client.List(ctx, &pods, client.InNamespace(d.ns)); err != nil {
				return err
			}
			if len(pods.Items) > 0 {
				// Pods of a deleted namespace go with grace; they carry no
				// state worth waiting for.
				for _, p := range pods.Items {
					_ = s.Client.Delete(ctx, &p, client.GracePeriodSeconds(0))
				}
				return fmt.Errorf("%d pods left", len(pods.Items))
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}
