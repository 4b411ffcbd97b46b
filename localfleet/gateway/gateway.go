// Package gateway is the local fleet's Gateway API implementation: an HTTP
// reverse proxy per spoke cluster that plays the part Envoy (Istio, Envoy
// Gateway, kgateway) plays in production, including towards the endpoint
// picker.
//
// Control plane. A Gateway instance serves one Gateway object whose
// GatewayClass names ControllerName. It watches GatewayClasses, that
// Gateway, HTTPRoutes, ReferenceGrants, InferencePools
// (inference.networking.k8s.io/v1), Services, Pods and Namespaces, and
// writes status as an implementation must: GatewayClass Accepted; Gateway
// Accepted, Programmed, its address and per-listener conditions; HTTPRoute
// status.parents (Accepted, ResolvedRefs, PartiallyInvalid) for the
// current generation; InferencePool status.parents (Accepted, ResolvedRefs)
// for the Gateway. KServe's LLMInferenceService readiness reads exactly these.
// Every change recomputes the whole configuration from the cache and swaps
// it atomically.
//
// Data plane. HTTP listeners of the Gateway bind Options.Address on their
// port. Requests are matched as the Gateway API specifies (hostnames, Exact,
// PathPrefix and RegularExpression paths, methods, headers, query
// parameters, precedence) and filtered (URLRewrite, Request- and
// ResponseHeaderModifier); backendRefs are chosen by weight. A Service
// backend goes to its Ready pods round robin. An InferencePool backend asks
// the pool's endpoint picker over ext-proc (package extproc, Envoy's
// FULL_DUPLEX_STREAMED exchange), forwards to the picked endpoint and streams
// the response back through the picker chunk by chunk. The picker's
// ImmediateResponse (400, 429, 503, ...) is the client's answer.
//
// For picks the gateway does what deploy/envoy/envoy.yaml makes Envoy do, and
// nothing more: its ORIGINAL_DST cluster dials the one ip:port in
// x-gateway-destination-endpoint, once (503 when the value is not one
// address, such as a comma-separated fallback list, and 503 when the
// connection fails: no retries); the picker's answers are bounded only by the
// stream idle timeout (408); and the response phase reports no served
// endpoint. When the picker cannot be reached or fails, the pool's
// failureMode decides as Envoy's failure_mode_allow does: FailClose answers
// 500, FailOpen lets the request go on without a pick, which ORIGINAL_DST has
// no destination for (503), and lets a response the picker failed on pass
// through unprocessed.
//
// Endpoints are resolved from Pods, not EndpointSlices, which cannot exist in
// the local fleet (the API server refuses loopback addresses in them).
//
// Cross-cluster picks. Whatever the picker's destination, a local pod,
// another cluster's pod (Endpoint mode) or another cluster's gateway
// (Parent mode), the gateway sends it the request as the picker's header and
// body mutations left it, with the route's filters applied, as Envoy does:
// Parent mode needs nothing else of a gateway, since the marks that keep a
// forwarded request in the cluster it reaches are request headers the
// pickers set and verify themselves (package epp/marks). Like
// deploy/envoy/envoy.yaml, the gateway removes the destination and subset
// headers a client sends.
//
// Observability: Prometheus metrics on Options.AdminPort (/metrics, plus
// /healthz and /readyz), one structured log line per request at V(1).
// Every listener binds loopback addresses only.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
)

// ControllerName is the GatewayClass controllerName this gateway implements.
const ControllerName gatewayv1.GatewayController = "fleetinfer.io/local-gateway"

// DefaultAdminPort is the Prometheus/health port, besides the Gateway's own
// listeners, borrowed from Istio's conventions.
const DefaultAdminPort = 15090

// upstreamIdleTimeout is how long an idle upstream connection stays open.
const upstreamIdleTimeout = time.Hour

// downstreamIdleTimeout is how long an idle client connection stays open:
// an hour, the default of Envoy's HTTP connection manager
// (common_http_protocol_options.idle_timeout), which deploy/envoy does not
// change. A Parent-mode crossing's upstream is another gateway's listener;
// were that listener to close idle connections sooner than the crossing
// gateway's pool lets them go, a request sent on one as it closes would
// fail before any response (503), a race Envoy's equal defaults all but
// avoid.
const downstreamIdleTimeout = time.Hour

// DefaultStreamIdleTimeout is deploy/envoy/envoy.yaml's stream_idle_timeout.
// Envoy's ext_proc message timer does not run with FULL_DUPLEX_STREAMED
// bodies, so this idle limit is what ends a wait for the endpoint picker.
const DefaultStreamIdleTimeout = 5 * time.Minute

// DefaultConnectTimeout is the file's connect_timeout for the pool's
// ORIGINAL_DST cluster, used for every upstream.
const DefaultConnectTimeout = 2 * time.Second

// Options configures a gateway.
type Options struct {
	// Config reaches the cluster's API server with rights to read the
	// watched kinds and write the status of Gateway API objects and
	// InferencePools.
	Config *rest.Config
	// Gateway is the Gateway object this instance serves.
	Gateway types.NamespacedName
	// Address is the loopback address every listener binds and the Gateway
	// reports in status.addresses.
	Address netip.Addr
	// AdminPort is the port of /metrics, /healthz and /readyz (default
	// DefaultAdminPort).
	AdminPort int
	// AllowedTargets are the networks upstream connections may go to
	// (default 127.0.0.0/8): whatever a picker answers, nothing else is
	// dialled.
	AllowedTargets []netip.Prefix
	// ConnectTimeout bounds each upstream connection attempt (default
	// DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// StreamIdleTimeout bounds each wait for an endpoint-picker answer that
	// is due (default DefaultStreamIdleTimeout): a request that waits longer
	// gets 408 if its response has not begun, as from Envoy's stream idle
	// timer.
	StreamIdleTimeout time.Duration
	// MaxRequestBody is the largest request body accepted (default 32 MiB);
	// the gateway holds bodies to retry a Service backend's next pod, as
	// Envoy buffers them for retries. Larger ones get 413.
	MaxRequestBody int64
	// ShutdownGrace is how long Stop lets requests in flight finish
	// (default 5 s).
	ShutdownGrace time.Duration
	// Listen opens the Gateway's HTTP listeners on addr (default
	// net.Listen): the local fleet serves them through its network between
	// clusters (wan.Fabric.Listen).
	Listen func(addr string) (net.Listener, error)
	Log    logr.Logger
}

// Gateway is a running gateway.
type Gateway struct {
	opts    Options
	log     logr.Logger
	cfg     atomic.Pointer[config]
	metrics *metrics
	epps    *eppClients
	// rr keeps round-robin positions across configuration changes.
	rr        sync.Map // string -> *atomic.Uint64
	transport *http.Transport
	h2c       *http.Transport
	// dst holds the pools of the destinations pickers choose.
	dst     *originalDst
	allowed []netip.Prefix

	cache  cache.Cache
	client client.Client
	dirty  chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	ready  atomic.Bool

	mu        sync.Mutex
	servers   map[int32]*server // the Gateway's HTTP listeners by port
	admin     *server
	listeners []*listenerState // last translation, for status
}

type server struct {
	srv  *http.Server
	addr string
	done chan struct{}
}

var defaultAllowedTargets = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(gatewayv1.Install(scheme))
	utilruntime.Must(inferencev1.Install(scheme))
}

// New validates opts; Start runs the gateway.
func New(opts Options) (*Gateway, error) {
	if opts.Config == nil || opts.Gateway.Name == "" {
		return nil, errors.New("gateway: Config and Gateway are required")
	}
	if !opts.Address.IsLoopback() {
		return nil, fmt.Errorf("gateway: address %s is not a loopback address", opts.Address)
	}
	if opts.AdminPort == 0 {
		opts.AdminPort = DefaultAdminPort
	}
	if len(opts.AllowedTargets) == 0 {
		opts.AllowedTargets = defaultAllowedTargets
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.StreamIdleTimeout <= 0 {
		opts.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	if opts.MaxRequestBody <= 0 {
		opts.MaxRequestBody = 32 << 20
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 5 * time.Second
	}
	if opts.Listen == nil {
		opts.Listen = listenTCP
	}
	g := &Gateway{
		opts: opts, log: opts.Log.WithValues("gateway", opts.Gateway.String()),
		metrics: newMetrics(), epps: newEPPClients(extproc.WithMessageTimeout(opts.StreamIdleTimeout)),
		allowed: opts.AllowedTargets, dirty: make(chan struct{}, 1), servers: map[int32]*server{},
	}
	// Upstream connections leave from the gateway's own address, as Envoy's
	// upstream_bind_config makes them: the cluster they come from is told
	// by their source.
	dialer := &net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second,
		LocalAddr: &net.TCPAddr{IP: opts.Address.AsSlice()}}
	// Bodies pass through untouched: no transparent gzip. Idle upstream
	// connections stay open for an hour, Envoy's default for a cluster's
	// pool (common_http_protocol_options.idle_timeout), which deploy/envoy
	// does not change; the pickers' destinations are also dropped as
	// Envoy's ORIGINAL_DST cluster drops them (originalDst).
	newTransport := func(useH2C bool, dial dialFunc) *http.Transport {
		t := &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 64,
			IdleConnTimeout: upstreamIdleTimeout, DisableCompression: true}
		if useH2C {
			var p http.Protocols
			p.SetUnencryptedHTTP2(true)
			t.Protocols = &p
		}
		return t
	}
	toBackend := counted(dialer.DialContext, g.metrics.upstreamConnections.WithLabelValues("backend"))
	toPicked := counted(dialer.DialContext, g.metrics.upstreamConnections.WithLabelValues("picked"))
	g.transport, g.h2c = newTransport(false, toBackend), newTransport(true, toBackend)
	g.dst = newOriginalDst(func(useH2C bool) *http.Transport { return newTransport(useH2C, toPicked) })
	g.cfg.Store(&config{listeners: map[int32]*routeTable{}})
	return g, nil
}

// Start watches the cluster, programs the Gateway once (so that its status
// is written when Start returns), and opens the listeners.
func (g *Gateway) Start(ctx context.Context) error {
	c, err := cache.New(g.opts.Config, cache.Options{Scheme: scheme, DefaultTransform: cache.TransformStripManagedFields()})
	if err != nil {
		return err
	}
	if g.client, err = client.New(g.opts.Config, client.Options{Scheme: scheme}); err != nil {
		return err
	}
	g.cache = c
	handler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { g.trigger() },
		UpdateFunc: func(any, any) { g.trigger() },
		DeleteFunc: func(any) { g.trigger() },
	}
	for _, obj := range watched() {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("gateway: watch %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cacheDone := make(chan struct{})
	go func() {
		defer close(cacheDone)
		_ = c.Start(runCtx)
	}()
	// On failure the cache stops here; Stop closes whatever listener opened.
	fail := func(err error) error {
		cancel()
		<-cacheDone
		return err
	}
	if !c.WaitForCacheSync(ctx) {
		return fail(errors.New("gateway: cache did not sync"))
	}
	if g.admin, err = g.listen(listenTCP, g.opts.AdminPort, g.adminHandler()); err != nil {
		return fail(err)
	}
	if err := g.reconcile(ctx); err != nil {
		g.log.Info("first reconcile incomplete, retrying", "err", err.Error())
	}
	g.ready.Store(true)
	g.cancel, g.done = cancel, make(chan struct{})
	sweeps := make(chan struct{})
	go func() {
		defer close(sweeps)
		g.dst.run(runCtx, OriginalDstCleanup)
	}()
	go func() {
		defer close(g.done)
		g.loop(runCtx)
		<-cacheDone
		<-sweeps
	}()
	return nil
}

func watched() []client.Object {
	return []client.Object{
		&gatewayv1.GatewayClass{}, &gatewayv1.Gateway{}, &gatewayv1.HTTPRoute{}, &gatewayv1.ReferenceGrant{},
		&inferencev1.InferencePool{}, &corev1.Service{}, &corev1.Pod{}, &corev1.Namespace{},
	}
}

func (g *Gateway) trigger() {
	select {
	case g.dirty <- struct{}{}:
	default:
	}
}

// resync re-reads everything now and then, which repairs a status write that
// lost a race without waiting for the next event.
const resync = 30 * time.Second

func (g *Gateway) loop(ctx context.Context) {
	retry := time.NewTimer(resync)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.dirty:
		case <-retry.C:
		}
		next := resync
		if err := g.reconcile(ctx); err != nil && ctx.Err() == nil {
			g.log.V(1).Info("reconcile incomplete, retrying", "err", err.Error())
			next = 200 * time.Millisecond
		}
		retry.Reset(next)
	}
}

// reconcile translates the cluster state, serves the result and writes the
// status it implies.
func (g *Gateway) reconcile(ctx context.Context) error {
	w, err := g.read(ctx)
	if err != nil {
		return err
	}
	tr := translate(ControllerName, w)
	g.syncListeners(tr)
	g.cfg.Store(tr.cfg)
	g.epps.prune(tr.cfg.epps)
	return g.writeStatus(ctx, w, tr)
}

// read loads the world from the cache.
func (g *Gateway) read(ctx context.Context) (*world, error) {
	w := &world{pools: map[types.NamespacedName]*inferencev1.InferencePool{}, services: map[types.NamespacedName]*corev1.Service{},
		pods: map[string][]*corev1.Pod{}, namespaces: map[string]*corev1.Namespace{}}
	var classes gatewayv1.GatewayClassList
	var gws gatewayv1.GatewayList
	var routes gatewayv1.HTTPRouteList
	var grants gatewayv1.ReferenceGrantList
	var pools inferencev1.InferencePoolList
	var svcs corev1.ServiceList
	var pods corev1.PodList
	var nss corev1.NamespaceList
	for _, l := range []client.ObjectList{&classes, &gws, &routes, &grants, &pools, &svcs, &pods, &nss} {
		if err := g.cache.List(ctx, l); err != nil {
			return nil, err
		}
	}
	w.classes, w.routes, w.grants = classes.Items, routes.Items, grants.Items
	for i := range gws.Items {
		if gw := &gws.Items[i]; gw.Namespace == g.opts.Gateway.Namespace && gw.Name == g.opts.Gateway.Name {
			w.gateway = gw
		}
	}
	for i := range pools.Items {
		p := &pools.Items[i]
		w.pools[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		w.services[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		w.pods[p.Namespace] = append(w.pods[p.Namespace], p)
	}
	for i := range nss.Items {
		w.namespaces[nss.Items[i].Name] = &nss.Items[i]
	}
	return w, nil
}

// syncListeners opens a server for every port of a valid HTTP listener and
// closes those no listener uses any more; a port that cannot be bound makes
// its listeners unprogrammed.
func (g *Gateway) syncListeners(tr *translation) {
	want := map[int32]bool{}
	for _, l := range tr.listeners {
		if l.valid {
			want[int32(l.spec.Port)] = true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	bindErr := map[int32]error{}
	for port := range want {
		if g.servers[port] != nil {
			continue
		}
		s, err := g.listen(g.opts.Listen, int(port), g.handler(publicListener, port))
		if err != nil {
			bindErr[port] = err
			continue
		}
		g.servers[port] = s
	}
	for port, s := range g.servers {
		if !want[port] {
			delete(g.servers, port)
			go g.shutdown(s)
		}
	}
	for _, l := range tr.listeners {
		if l.valid {
			l.bindError = bindErr[int32(l.spec.Port)]
		}
	}
	g.listeners = tr.listeners
}

func listenTCP(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

func (g *Gateway) listen(listen func(string) (net.Listener, error), port int, h http.Handler) (*server, error) {
	addr := net.JoinHostPort(g.opts.Address.String(), strconv.Itoa(port))
	ln, err := listen(addr)
	if err != nil {
		return nil, err
	}
	s := &server{addr: addr, done: make(chan struct{}), srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       downstreamIdleTimeout,
		ErrorLog:          log.New(logWriter{g.log}, "", 0),
	}}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.log.Error(err, "listener stopped", "addr", addr)
		}
	}()
	return s, nil
}

func (g *Gateway) shutdown(s *server) {
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.ShutdownGrace)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	<-s.done
}

// logWriter sends net/http's own error log (bad requests, TLS probes) to
// the gateway's log at debug level.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.V(1).Info("http server", "msg", string(p))
	return len(p), nil
}

func (g *Gateway) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !g.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}

// Stop drains the listeners (requests in flight get ShutdownGrace to
// finish), stops watching and closes the endpoint-picker connections.
func (g *Gateway) Stop() {
	g.ready.Store(false)
	g.mu.Lock()
	servers := []*server{g.admin}
	for _, s := range g.servers {
		servers = append(servers, s)
	}
	g.servers = map[int32]*server{}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range servers {
		if s != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g.shutdown(s)
			}()
		}
	}
	wg.Wait()
	if g.cancel != nil {
		g.cancel()
		<-g.done
	}
	g.epps.closeAll()
	g.transport.CloseIdleConnections()
	g.h2c.CloseIdleConnections()
	g.dst.closeIdle()
}

// URL is the base URL of the Gateway's first programmed HTTP listener, ""
// before one is.
func (g *Gateway) URL() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, l := range g.listeners {
		if l.valid && l.bindError == nil && g.servers[int32(l.spec.Port)] != nil {
			return "http://" + g.servers[int32(l.spec.Port)].addr
		}
	}
	return ""
}

// MetricsURL is where the gateway's Prometheus metrics are served.
func (g *Gateway) MetricsURL() string {
	return "http://" + net.JoinHostPort(g.opts.Address.String(), strconv.Itoa(g.opts.AdminPort)) + "/metrics"
}

// Registry holds the gateway's metrics, for tests and embedding.
func (g *Gateway) Registry() *prometheus.Registry { return g.metrics.registry }
