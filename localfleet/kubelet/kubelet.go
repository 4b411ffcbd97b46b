// Package kubelet is the local fleet's node agent: it registers fake GPU nodes
// with a cluster and runs the pods that kube-scheduler binds to them as real
// processes on this machine, each pod on its own loopback address.
//
// What it fakes, and why: there are no GPUs, container images or network
// namespaces here. Nodes advertise nvidia.com/gpu capacity that does not
// exist; containers of known images run as local binaries (see Runtime); and a
// pod's ports are forwarded from its 127.x address to the process, which
// listens on a free local port. Everything the API shows (pod IPs, phases,
// readiness from probes, restart counts, events) is what those processes do.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/localfleet/process"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// Options configures a kubelet.
type Options struct {
	// Cluster names the cluster in logs and kubeconfigs.
	Cluster string
	// Config reaches the API server with rights to nodes, pods, events,
	// leases and service-account tokens.
	Config *rest.Config
	Nodes  []NodeSpec
	// Network is the loopback range pods and nodes get addresses from,
	// e.g. 127.11.0.0/16.
	Network netip.Prefix
	// Reserved are addresses of Network that no pod or node gets: the
	// cluster's gateway, load balancers and API endpoint.
	Reserved []netip.Prefix
	// Fabric carries connections to the pods' ports, as the pod network
	// and the links between clusters would (policy wan.PodAddress). Nil:
	// every connection is direct.
	Fabric   *wan.Fabric
	Runtimes Runtimes
	Registry *process.Registry
	// Dir holds per-pod directories: volumes, tokens, process logs.
	Dir string
	// Version is reported as the nodes' kubelet version.
	Version string
	// RestartBackoff is the first delay before restarting a failed
	// container; it doubles up to MaxRestartBackoff. The kubelet's own values
	// (10 s, 5 min) would make crash tests take minutes.
	RestartBackoff, MaxRestartBackoff time.Duration
	// MaxGracePeriod caps terminationGracePeriodSeconds.
	MaxGracePeriod time.Duration
	Log            logr.Logger
}

// Kubelet runs the pods bound to its nodes.
type Kubelet struct {
	opts        Options
	cs          kubernetes.Interface
	log         logr.Logger
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	ips         *addresses
	nodeIPs     map[string]string
	nodes       map[string]bool

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	cancel  context.CancelFunc
	done    chan struct{}
}

// New validates opts and builds a kubelet; Start runs it.
func New(opts Options) (*Kubelet, error) {
	if !netip.MustParsePrefix("127.0.0.0/8").Contains(opts.Network.Addr()) || opts.Network.Bits() < 8 || opts.Network.Bits() > 24 {
		return nil, fmt.Errorf("kubelet %s: network %s must be a /8 to /24 inside 127.0.0.0/8", opts.Cluster, opts.Network)
	}
	if opts.Fabric == nil {
		var err error
		if opts.Fabric, err = wan.NewFabric(wan.FabricOptions{}); err != nil {
			return nil, err
		}
	}
	if opts.RestartBackoff <= 0 {
		opts.RestartBackoff = time.Second
	}
	if opts.MaxRestartBackoff < opts.RestartBackoff {
		opts.MaxRestartBackoff = 30 * opts.RestartBackoff
	}
	if opts.MaxGracePeriod <= 0 {
		opts.MaxGracePeriod = 10 * time.Second
	}
	if opts.Version == "" {
		opts.Version = "localfleet"
	}
	cs, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, err
	}
	k := &Kubelet{
		opts: opts, cs: cs, log: opts.Log.WithValues("cluster", opts.Cluster),
		ips:     newAddresses(opts.Network, opts.Reserved),
		nodeIPs: map[string]string{}, nodes: map[string]bool{},
		workers: map[types.UID]*podWorker{},
	}
	for _, n := range opts.Nodes {
		if k.nodes[n.Name] {
			return nil, fmt.Errorf("kubelet %s: node %s listed twice", opts.Cluster, n.Name)
		}
		k.nodes[n.Name] = true
		ip, err := k.ips.node()
		if err != nil {
			return nil, err
		}
		k.nodeIPs[n.Name] = ip
	}
	k.broadcaster = record.NewBroadcaster()
	k.recorder = k.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: opts.Cluster})
	return k, nil
}

// Start registers the nodes, waits for the pod informer to sync and runs
// until Stop.
func (k *Kubelet) Start(ctx context.Context) error {
	for _, n := range k.opts.Nodes {
		if err := k.registerNode(ctx, n, k.nodeIPs[n.Name]); err != nil {
			return err
		}
	}
	k.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: k.cs.CoreV1().Events("")})
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k.cancel, k.done = cancel, make(chan struct{})
	factory := informers.NewSharedInformerFactoryWithOptions(k.cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermNotEqualSelector("spec.nodeName", "").String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { k.sync(runCtx, o) },
		UpdateFunc: func(_, o any) { k.sync(runCtx, o) },
		DeleteFunc: func(o any) { k.deleted(o) },
	}); err != nil {
		cancel()
		return err
	}
	factory.Start(runCtx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cancel()
		factory.Shutdown()
		return errors.New("kubelet " + k.opts.Cluster + ": pod informer did not sync")
	}
	go func() {
		defer close(k.done)
		k.heartbeat(runCtx)
		factory.Shutdown()
		k.stopAll()
		k.broadcaster.Shutdown()
	}()
	return nil
}

// Stop stops every pod's processes (the pod objects stay, as they do when a
// node goes away) and waits.
func (k *Kubelet) Stop() {
	if k.cancel == nil {
		return
	}
	k.cancel()
	<-k.done
}

func (k *Kubelet) stopAll() {
	k.mu.Lock()
	ws := make([]*podWorker, 0, len(k.workers))
	for _, w := range k.workers {
		ws = append(ws, w)
	}
	k.mu.Unlock()
	for _, w := range ws {
		w.cancel()
	}
	for _, w := range ws {
		<-w.done
	}
}

// NodeIP returns the address of a node.
func (k *Kubelet) NodeIP(node string) string { return k.nodeIPs[node] }

func (k *Kubelet) sync(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || !k.nodes[pod.Spec.NodeName] {
		return
	}
	k.mu.Lock()
	w := k.workers[pod.UID]
	k.mu.Unlock()
	switch {
	case w != nil && pod.DeletionTimestamp != nil:
		w.setPod(pod)
		go k.terminate(ctx, w, true)
	case w != nil:
		w.setPod(pod)
		w.changed()
	case pod.DeletionTimestamp != nil:
		// Never started here (or the kubelet restarted): nothing to stop.
		go k.finalDelete(ctx, pod)
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
	default:
		k.startPod(ctx, pod)
	}
}

func (k *Kubelet) startPod(ctx context.Context, pod *corev1.Pod) {
	ip := k.nodeIPs[pod.Spec.NodeName]
	if !pod.Spec.HostNetwork {
		var err error
		if ip, err = k.ips.pod(); err != nil {
			k.recorder.Eventf(pod, corev1.EventTypeWarning, "FailedCreatePodSandBox", "no pod address: %v", err)
			return
		}
	}
	w := newPodWorker(k, pod, ip, k.nodeIPs[pod.Spec.NodeName])
	wctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	k.mu.Lock()
	k.workers[pod.UID] = w
	k.mu.Unlock()
	k.log.V(1).Info("starting pod", "pod", w.key, "ip", ip, "node", pod.Spec.NodeName)
	go w.run(wctx)
}

func (k *Kubelet) deleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	k.mu.Lock()
	w := k.workers[pod.UID]
	k.mu.Unlock()
	if w != nil {
		go k.terminate(context.Background(), w, false)
	}
}

// terminate stops a pod's processes, frees its address and directory, and,
// for a graceful deletion, removes the pod object as the kubelet does once
// its containers are gone.
func (k *Kubelet) terminate(ctx context.Context, w *podWorker, deleteObject bool) {
	k.mu.Lock()
	if k.workers[w.uid] != w {
		k.mu.Unlock()
		return // already terminating
	}
	delete(k.workers, w.uid)
	k.mu.Unlock()
	w.cancel()
	<-w.done
	if ip := w.ip; ip != w.hostIP {
		k.ips.release(ip)
	}
	_ = os.RemoveAll(w.dir)
	if deleteObject {
		k.finalDelete(ctx, w.pod())
	}
	k.log.V(1).Info("pod stopped", "pod", w.key)
}

// finalDelete removes the object of a pod whose processes have stopped,
// retrying until it is gone or the kubelet stops: the API server may be
// restarting (a real kubelet's pod workers retry too), and nothing else
// would delete a terminating pod whose deletion event has passed.
func (k *Kubelet) finalDelete(ctx context.Context, pod *corev1.Pod) {
	backoff := 250 * time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := k.cs.CoreV1().Pods(pod.Namespace).Delete(attempt, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To(int64(0)),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		cancel()
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return
		}
		k.log.Error(err, "delete pod; retrying", "pod", pod.Namespace+"/"+pod.Name, "after", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
