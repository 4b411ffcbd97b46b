// Package loadbalancer gives Services of type LoadBalancer an address in
// the local fleet, as MetalLB or a cloud provider's load balancer does in a
// real cluster: an address from the cluster's own range, written to
// status.loadBalancer.ingress, and a listener per service port on it that
// forwards each connection to a Ready pod of the Service, round robin.
//
// The listeners are served through the fleet's network between clusters
// (wan.Fabric, policy Exposed): a load balancer address is what a cluster
// with an isolated pod network exposes to the others, so it is reachable
// from every cluster, through the link.
//
// Services with a spec.loadBalancerClass are left to their class's
// implementation, as MetalLB leaves them. Only TCP ports are served.
package loadbalancer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/kubectl/pkg/util/podutils"

	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// Options configure a cluster's load balancer.
type Options struct {
	// Cluster is the cluster's name in the fabric.
	Cluster string
	// Config reaches the API server with rights to read Services and Pods,
	// write Service status and create Events.
	Config *rest.Config
	// Pool is the loopback range addresses are allocated from (x.y.z.0 and
	// x.y.z.255 excepted).
	Pool   netip.Prefix
	Fabric *wan.Fabric
	Log    logr.Logger
}

// LoadBalancer serves a cluster's LoadBalancer Services.
type LoadBalancer struct {
	opts     Options
	cs       kubernetes.Interface
	services corelisters.ServiceLister
	pods     corelisters.PodLister
	recorder record.EventRecorder
	dirty    chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}

	mu        sync.Mutex // held by reconcile
	balancers map[types.NamespacedName]*balancer
}

// balancer is one Service's address and listeners.
type balancer struct {
	ip      netip.Addr
	servers map[int32]*wan.Server // by service port
	next    atomic.Uint64         // round robin
}

// New validates opts; Start runs the load balancer.
func New(opts Options) (*LoadBalancer, error) {
	if opts.Config == nil || opts.Fabric == nil || !opts.Pool.Addr().IsLoopback() {
		return nil, errors.New("loadbalancer: Config, Fabric and a loopback Pool are required")
	}
	cs, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, err
	}
	return &LoadBalancer{opts: opts, cs: cs, dirty: make(chan struct{}, 1), balancers: map[types.NamespacedName]*balancer{}}, nil
}

// Start watches Services and Pods, serves the LoadBalancer Services found
// once, and keeps serving them until Stop.
func (lb *LoadBalancer) Start(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(lb.cs, 0)
	svcInf, podInf := factory.Core().V1().Services(), factory.Core().V1().Pods()
	lb.services, lb.pods = svcInf.Lister(), podInf.Lister()
	trigger := func() {
		select {
		case lb.dirty <- struct{}{}:
		default:
		}
	}
	// Pods are read when a connection arrives; only Services change what
	// is served.
	if _, err := svcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { trigger() }, UpdateFunc: func(any, any) { trigger() }, DeleteFunc: func(any) { trigger() },
	}); err != nil {
		return err
	}
	podInf.Informer() // registered before Start
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: lb.cs.CoreV1().Events("")})
	lb.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "localfleet-loadbalancer"})
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	factory.Start(runCtx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), svcInf.Informer().HasSynced, podInf.Informer().HasSynced) {
		cancel()
		factory.Shutdown()
		broadcaster.Shutdown()
		return fmt.Errorf("loadbalancer %s: caches did not sync", lb.opts.Cluster)
	}
	lb.reconcile(ctx)
	lb.cancel, lb.done = cancel, make(chan struct{})
	go func() {
		defer close(lb.done)
		for {
			select {
			case <-runCtx.Done():
				factory.Shutdown()
				lb.closeAll()
				broadcaster.Shutdown()
				return
			case <-lb.dirty:
				lb.reconcile(runCtx)
			}
		}
	}()
	return nil
}

// Stop closes every listener (open connections drop) and stops watching.
func (lb *LoadBalancer) Stop() {
	if lb.cancel == nil {
		return
	}
	lb.cancel()
	<-lb.done
}

func (lb *LoadBalancer) closeAll() {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	for key, b := range lb.balancers {
		b.close()
		delete(lb.balancers, key)
	}
}

func (b *balancer) close() {
	for port, s := range b.servers {
		_ = s.Close()
		delete(b.servers, port)
	}
}

// served says whether this load balancer implements svc.
func served(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.LoadBalancerClass == nil && svc.DeletionTimestamp == nil
}

// reconcile releases what is no longer a served Service and serves every
// one that is: an address, a listener per TCP port, the status.
func (lb *LoadBalancer) reconcile(ctx context.Context) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	svcs, err := lb.services.List(labels.Everything())
	if err != nil {
		return
	}
	want := map[types.NamespacedName]*corev1.Service{}
	for _, s := range svcs {
		if served(s) {
			want[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
		}
	}
	for key, b := range lb.balancers {
		if want[key] == nil {
			b.close()
			delete(lb.balancers, key)
			lb.opts.Log.V(1).Info("load balancer released", "service", key, "ip", b.ip)
		}
	}
	for key, svc := range want {
		lb.serve(ctx, key, svc)
	}
}

func (lb *LoadBalancer) serve(ctx context.Context, key types.NamespacedName, svc *corev1.Service) {
	b := lb.balancers[key]
	if b == nil {
		ip, err := lb.allocate(svc)
		if err != nil {
			lb.recorder.Eventf(svc, corev1.EventTypeWarning, "AllocationFailed", "Failed to allocate IP for %q: %v", key, err)
			return
		}
		b = &balancer{ip: ip, servers: map[int32]*wan.Server{}}
		lb.balancers[key] = b
		lb.recorder.Eventf(svc, corev1.EventTypeNormal, "IPAllocated", "Assigned IP [%s]", ip)
	}
	ports := map[int32]bool{}
	for _, p := range svc.Spec.Ports {
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			lb.recorder.Eventf(svc, corev1.EventTypeWarning, "UnsupportedProtocol", "Port %d: the local load balancer serves TCP only, not %s", p.Port, p.Protocol)
			continue
		}
		ports[p.Port] = true
		if b.servers[p.Port] != nil {
			continue
		}
		addr := net.JoinHostPort(b.ip.String(), strconv.Itoa(int(p.Port)))
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			b.servers[p.Port], err = lb.opts.Fabric.Serve(ln, lb.opts.Cluster, wan.Exposed, lb.dial(key, p.Port, b))
		}
		if err != nil {
			lb.recorder.Eventf(svc, corev1.EventTypeWarning, "ListenFailed", "Failed to listen on %s: %v", addr, err)
		}
	}
	for port, s := range b.servers {
		if !ports[port] {
			_ = s.Close()
			delete(b.servers, port)
		}
	}
	ingress := []corev1.LoadBalancerIngress{{IP: b.ip.String()}}
	if slices.EqualFunc(svc.Status.LoadBalancer.Ingress, ingress, func(a, b corev1.LoadBalancerIngress) bool { return a.IP == b.IP }) {
		return
	}
	upd := svc.DeepCopy()
	upd.Status.LoadBalancer.Ingress = ingress
	if _, err := lb.cs.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		lb.opts.Log.V(1).Info("load balancer status not written, retrying", "service", key, "err", err.Error())
		// The informer's update of our own write, or this retry, comes back.
		lb.retryLater()
	}
}

func (lb *LoadBalancer) retryLater() {
	select {
	case lb.dirty <- struct{}{}:
	default:
	}
}

// allocate keeps the address the Service's status already names when it is
// in the pool and free (a restarted load balancer), or takes the first free
// one.
func (lb *LoadBalancer) allocate(svc *corev1.Service) (netip.Addr, error) {
	used := map[netip.Addr]bool{}
	for _, b := range lb.balancers {
		used[b.ip] = true
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(in.IP); err == nil && lb.opts.Pool.Contains(ip) && !used[ip] && usable(ip) {
			return ip, nil
		}
	}
	for ip := lb.opts.Pool.Masked().Addr(); lb.opts.Pool.Contains(ip); ip = ip.Next() {
		if usable(ip) && !used[ip] {
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address in %s", lb.opts.Pool)
}

// usable excludes x.y.z.0 and x.y.z.255, as the kubelet's pod addresses do.
func usable(ip netip.Addr) bool {
	b := ip.As4()
	last := binary.BigEndian.Uint32(b[:]) & 0xff
	return last != 0 && last != 0xff
}

// dial connects to the Service's Ready endpoints for port, round robin,
// trying the next one when a connection fails; with none the client is
// reset, as a load balancer without healthy backends does.
func (lb *LoadBalancer) dial(key types.NamespacedName, port int32, b *balancer) wan.Dial {
	return func(ctx context.Context) (net.Conn, error) {
		svc, err := lb.services.Services(key.Namespace).Get(key.Name)
		if err != nil {
			return nil, err
		}
		targets := lb.endpoints(svc, port)
		if len(targets) == 0 {
			lb.recorder.Eventf(svc, corev1.EventTypeWarning, "NoReadyEndpoints", "Port %d: no Ready pod to forward a connection to", port)
			return nil, fmt.Errorf("service %s port %d has no ready endpoints", key, port)
		}
		start := int(b.next.Add(1))
		var errs []error
		d := net.Dialer{}
		for i := range targets {
			c, err := d.DialContext(ctx, "tcp", targets[(start+i)%len(targets)])
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
}

// endpoints are ip:port of the Ready pods the Service selects, for its
// port, in a stable order.
func (lb *LoadBalancer) endpoints(svc *corev1.Service, port int32) []string {
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Port == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil || len(svc.Spec.Selector) == 0 {
		return nil
	}
	pods, err := lb.pods.Pods(svc.Namespace).List(labels.SelectorFromSet(svc.Spec.Selector))
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range pods {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil || !podutils.IsPodReady(p) {
			continue
		}
		if tp := targetPort(p, sp); tp > 0 {
			out = append(out, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(tp))))
		}
	}
	slices.Sort(out)
	return out
}

// targetPort resolves a service port's targetPort on a pod: a number, a
// container port's name, or (unset) the service port itself; 0 if the pod
// has no port of that name.
func targetPort(p *corev1.Pod, sp *corev1.ServicePort) int32 {
	switch {
	case sp.TargetPort.Type == intstr.String:
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == sp.TargetPort.StrVal && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) {
					return cp.ContainerPort
				}
			}
		}
		return 0
	case sp.TargetPort.IntVal > 0:
		return sp.TargetPort.IntVal
	}
	return sp.Port
}

// Address is the load-balancer address of a Service, if it has one.
func (lb *LoadBalancer) Address(key types.NamespacedName) (netip.Addr, bool) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if b := lb.balancers[key]; b != nil {
		return b.ip, true
	}
	return netip.Addr{}, false
}
