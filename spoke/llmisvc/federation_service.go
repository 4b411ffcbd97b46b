package llmisvc

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// FederationAddress says which address of a federated endpoint picker the
// spoke reports for other clusters to reach it (the spoke's
// --federation-address).
type FederationAddress string

const (
	// FederationAddressLoadBalancer exposes the picker's federation port
	// through a Service of type LoadBalancer and reports the address the
	// cluster's load-balancer controller gives it: pod addresses are usually
	// not routable from other clusters.
	FederationAddressLoadBalancer FederationAddress = "LoadBalancer"
	// FederationAddressPodIP reports the ready picker pod's own IP, for
	// clusters whose pod network other clusters reach (a flat network) and
	// that have no load-balancer controller.
	FederationAddressPodIP FederationAddress = "PodIP"
)

// ParseFederationAddress accepts LoadBalancer or PodIP in any letter case.
func ParseFederationAddress(s string) (FederationAddress, error) {
	for _, a := range []FederationAddress{FederationAddressLoadBalancer, FederationAddressPodIP} {
		if strings.EqualFold(s, string(a)) {
			return a, nil
		}
	}
	return "", fmt.Errorf("unknown federation address %q (want %s or %s)", s, FederationAddressLoadBalancer, FederationAddressPodIP)
}

// ReasonFederationAddressPending is the Event reason on a copy whose
// federation Service has no load-balancer address yet.
const ReasonFederationAddressPending = "FederationAddressPending"

// reconcileFederationService keeps the federation Service of a service
// whose picker federates through a load balancer, and removes it otherwise:
// federation off, the service stopped, or pod IPs reported instead. pod is
// the picker's pod template, federation port included.
func (r *Reconciler) reconcileFederationService(ctx context.Context, svc *v1alpha2.LLMInferenceService, pod *corev1.PodSpec) error {
	if !federates(svc) || r.opts.FederationAddress != FederationAddressLoadBalancer {
		return r.removeFederationService(ctx, svc)
	}
	labels := pickerLabels(svc)
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: fleetv1alpha1.FederationServiceName(svc.Name), Namespace: svc.Namespace, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: labels,
			Ports: []corev1.ServicePort{{Name: fleetv1alpha1.FederationPortName, Port: fleetv1alpha1.FederationPort,
				TargetPort: intstr.FromInt32(federationContainerPort(pod.Containers)), Protocol: corev1.ProtocolTCP}},
		},
	}
	return ensure(ctx, r, svc, want, syncService)
}

func (r *Reconciler) removeFederationService(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	return remove(ctx, r, svc, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: fleetv1alpha1.FederationServiceName(svc.Name), Namespace: svc.Namespace}})
}

// loadBalancedPickerAddress is the federation Service's load-balancer
// address, "" until the cluster's load-balancer controller assigns one,
// which the copy's Events then say.
func (r *Reconciler) loadBalancedPickerAddress(ctx context.Context, svc *v1alpha2.LLMInferenceService) (string, error) {
	lb := &corev1.Service{}
	err := r.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: fleetv1alpha1.FederationServiceName(svc.Name)}, lb)
	if err != nil {
		// Just created and not in the cache yet: the watch on it brings the
		// service back.
		return "", client.IgnoreNotFound(err)
	}
	addr := loadBalancerAddress(lb)
	if addr == "" {
		r.recorder.Eventf(svc, corev1.EventTypeNormal, ReasonFederationAddressPending,
			"Service %s of type LoadBalancer has no load-balancer address yet; other clusters cannot reach the endpoint picker until it has one "+
				"(on a cluster without a load-balancer controller whose pod network other clusters reach, run the spoke with --federation-address=%s)",
			lb.Name, FederationAddressPodIP)
	}
	return addr, nil
}

// loadBalancerAddress is host:port of a LoadBalancer Service's federation
// port: its first ingress IP, else hostname, with the Service's port; ""
// while it has none.
func loadBalancerAddress(lb *corev1.Service) string {
	if len(lb.Status.LoadBalancer.Ingress) == 0 {
		return ""
	}
	in := lb.Status.LoadBalancer.Ingress[0]
	host := in.IP
	if host == "" {
		host = in.Hostname
	}
	i := slices.IndexFunc(lb.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == fleetv1alpha1.FederationPortName })
	if host == "" || i < 0 {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(int(lb.Spec.Ports[i].Port)))
}

// federationContainerPort is the picker's federation port: its container
// port named "federation", else the default federation port.
func federationContainerPort(containers []corev1.Container) int32 {
	for _, c := range containers {
		if i := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == fleetv1alpha1.FederationPortName }); i >= 0 {
			return c.Ports[i].ContainerPort
		}
	}
	return fleetv1alpha1.FederationPort
}
