package fleet

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/fleetinfer/fleetinfer/localfleet/gateway"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// The Gateway API objects the fleet creates in every spoke: a GatewayClass
// for the local gateway and one Gateway, in Namespace, with a plain HTTP
// listener that admits HTTPRoutes from every namespace (KServe creates its
// routes next to each LLMInferenceService).
const (
	GatewayClassName    = "fleetinfer-local"
	GatewayName         = "inference-gateway"
	GatewayListenerName = "http"
	GatewayListenerPort = 8080
)

// GatewayAddress is the address of the index-th spoke's gateway, near the
// top of the spoke's range, far below the node addresses the kubelet hands
// out from the very top and far above the pod addresses it hands out from
// the bottom.
func GatewayAddress(index int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, byte(11 + index), 254, 1})
}

// startGateways creates the Gateway API objects of every spoke and starts
// its gateway in this process.
func (f *Fleet) startGateways(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(f.Spokes))
	for i, s := range f.Spokes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f.startGateway(ctx, s, f.opts.FirstNetwork+i)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (f *Fleet) startGateway(ctx context.Context, s *Cluster, index int) error {
	began := time.Now()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	class := &gatewayv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: GatewayClassName},
		Spec: gatewayv1.GatewayClassSpec{ControllerName: gateway.ControllerName,
			Description: ptr.To("Local fleet gateway: ext-proc to endpoint pickers as Envoy")},
	}
	gw := &gatewayv1.Gateway{
		// Parent-mode peers forward to its address on the first listener's
		// port, as any client reaches it.
		ObjectMeta: metav1.ObjectMeta{Name: GatewayName, Namespace: Namespace},
		Spec: gatewayv1.GatewaySpec{
			GatewayClassName: GatewayClassName,
			Listeners: []gatewayv1.Listener{{
				Name: GatewayListenerName, Port: GatewayListenerPort, Protocol: gatewayv1.HTTPProtocolType,
				AllowedRoutes: &gatewayv1.AllowedRoutes{Namespaces: &gatewayv1.RouteNamespaces{From: ptr.To(gatewayv1.NamespacesFromAll)}},
			}},
		},
	}
	for _, obj := range []client.Object{ns, class, gw} {
		if err := client.IgnoreAlreadyExists(s.Client.Create(ctx, obj)); err != nil {
			return err
		}
	}
	g, err := gateway.New(gateway.Options{
		Config:  s.Admin(),
		Gateway: types.NamespacedName{Namespace: Namespace, Name: GatewayName},
		Address: GatewayAddress(index),
		// Every cluster reaches the gateway, through the link.
		Listen: func(addr string) (net.Listener, error) { return f.fabric.Listen(addr, s.Name(), wan.Exposed) },
		Log:    f.opts.Log.WithName("gateway").WithValues("cluster", s.Name()),
	})
	if err != nil {
		return err
	}
	if err := g.Start(ctx); err != nil {
		g.Stop()
		return err
	}
	s.Gateway = g
	f.opts.Log.Info("gateway up", "cluster", s.Name(), "url", g.URL(), "took", time.Since(began).Round(time.Millisecond))
	return nil
}

func (f *Fleet) stopGateways() {
	var wg sync.WaitGroup
	for _, s := range f.Spokes {
		if s != nil && s.Gateway != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.Gateway.Stop()
			}()
		}
	}
	wg.Wait()
}

// GatewayURL is the base URL of the spoke's Gateway listener, "" on the hub
// or without gateways.
func (c *Cluster) GatewayURL() string {
	if c.Gateway == nil {
		return ""
	}
	return c.Gateway.URL()
}
