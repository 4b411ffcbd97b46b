package llmisvc

import (
	"context"
	"net"
	"path"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubectl/pkg/util/podutils"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Where the endpoint picker finds what the hub publishes for it.
const (
	federationPeersVolume = "federation-peers"
	federationTLSVolume   = "federation-tls"
	federationPeersDir    = "/etc/fleetinfer/federation/peers"
	federationTLSDir      = "/etc/fleetinfer/federation/tls"
)

// federate turns on the federation of the endpoint picker of a service the
// hub placed (it annotates the copy with the cluster's name): the picker
// reads its peer directory and mTLS certificate from the ConfigMap and Secret
// the hub writes next to the copy, and serves its pods to peers on the
// federation port. The volumes are not optional, so the picker starts only
// once the hub has issued its certificate, as with any Secret volume. A
// template that configures federation itself is left alone.
func federate(svc *v1alpha2.LLMInferenceService, pod *corev1.PodSpec, c *corev1.Container, has func(string) bool) {
	cluster := svc.Annotations[fleetv1alpha1.FederationClusterAnnotation]
	if !federates(svc) || has("--"+fleetv1alpha1.FlagFederationPeersFile) {
		return
	}
	port := int32(fleetv1alpha1.FederationPort)
	if i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == fleetv1alpha1.FederationPortName }); i >= 0 {
		port = c.Ports[i].ContainerPort
	} else {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: fleetv1alpha1.FederationPortName, ContainerPort: port, Protocol: corev1.ProtocolTCP})
	}
	c.Args = append(c.Args,
		flag(fleetv1alpha1.FlagFederationCluster, cluster),
		flag(fleetv1alpha1.FlagFederationPort, strconv.Itoa(int(port))),
		flag(fleetv1alpha1.FlagFederationPeersFile, path.Join(federationPeersDir, fleetv1alpha1.PeerDirectoryKey)),
		flag(fleetv1alpha1.FlagFederationCertFile, path.Join(federationTLSDir, corev1.TLSCertKey)),
		flag(fleetv1alpha1.FlagFederationKeyFile, path.Join(federationTLSDir, corev1.TLSPrivateKeyKey)),
		flag(fleetv1alpha1.FlagFederationCAFile, path.Join(federationTLSDir, corev1.ServiceAccountRootCAKey)),
	)
	if mode := svc.Annotations[fleetv1alpha1.FederationModeAnnotation]; mode != "" && !has("--"+fleetv1alpha1.FlagFederationMode) {
		c.Args = append(c.Args, flag(fleetv1alpha1.FlagFederationMode, mode))
	}
	c.VolumeMounts = append(c.VolumeMounts,
		corev1.VolumeMount{Name: federationPeersVolume, MountPath: federationPeersDir, ReadOnly: true},
		corev1.VolumeMount{Name: federationTLSVolume, MountPath: federationTLSDir, ReadOnly: true})
	pod.Volumes = append(pod.Volumes,
		corev1.Volume{Name: federationPeersVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: fleetv1alpha1.PeerDirectoryName(svc.Name)}}}},
		corev1.Volume{Name: federationTLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: fleetv1alpha1.FederationTLSName(svc.Name)}}})
}

// flag is a command-line flag as the picker parses it.
func flag(name, value string) string { return "--" + name + "=" + value }

// federates reports whether the service's endpoint picker federates: the
// hub placed the copy with federation on, and the service is not stopped.
func federates(svc *v1alpha2.LLMInferenceService) bool {
	return svc.Annotations[fleetv1alpha1.FederationClusterAnnotation] != "" && !svc.Stopped()
}

// reportFederation sets status.federation of a copy that federates: where
// other clusters reach its endpoint picker's federation server
// (pickerFederationAddress) and, in Parent mode, its Gateway (peerGateway);
// each "" while unknown. The hub
// publishes both in the peer directories. A copy that does not federate has
// none. When the picker's pods or the Gateway cannot be read, the previous
// value stays and the error is returned for a retry.
func (r *Reconciler) reportFederation(ctx context.Context, svc *v1alpha2.LLMInferenceService, rt *routing) error {
	if !federates(svc) {
		svc.Status.Federation = nil
		return nil
	}
	fs := &v1alpha2.FederationStatus{}
	if rt.eppSvc != "" {
		addr, err := r.pickerFederationAddress(ctx, svc)
		if err != nil {
			return err
		}
		fs.PickerAddress = addr
	}
	if k := r.peerGateway(rt); k.Name != "" && r.apis.gateway {
		gw := &gwapiv1.Gateway{}
		err := r.Get(ctx, k, gw)
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		if err == nil {
			fs.GatewayAddress = gatewayAddress(gw)
		}
	}
	svc.Status.Federation = fs
	return nil
}

// pickerFederationAddress is where other clusters reach the federation
// server of the service's managed picker, as --federation-address says: the
// load balancer in front of it, or its ready pod's IP.
func (r *Reconciler) pickerFederationAddress(ctx context.Context, svc *v1alpha2.LLMInferenceService) (string, error) {
	if r.opts.FederationAddress == FederationAddressLoadBalancer {
		return r.loadBalancedPickerAddress(ctx, svc)
	}
	if r.pickers == nil {
		return "", nil
	}
	pods, err := r.pickerPods(ctx, svc)
	if err != nil {
		return "", err
	}
	return pickerAddress(pods), nil
}

// pickerPods are the pods of the picker Deployment svc controls, found by
// ownership: pod → ReplicaSet → Deployment, each a controller reference by
// UID. Labels only narrow the search: anyone who may create pods in the
// namespace can copy the picker's labels onto a ready pod, and the address
// published from it would steer other clusters' spilled requests.
func (r *Reconciler) pickerPods(ctx context.Context, svc *v1alpha2.LLMInferenceService) ([]corev1.Pod, error) {
	dep := &appsv1.Deployment{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: schedulerName(svc)}, dep); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(dep, svc) {
		return nil, nil
	}
	sel := []client.ListOption{client.InNamespace(svc.Namespace), client.MatchingLabels(pickerLabels(svc))}
	var sets appsv1.ReplicaSetList
	if err := r.pickers.List(ctx, &sets, sel...); err != nil {
		return nil, err
	}
	var pods corev1.PodList
	if err := r.pickers.List(ctx, &pods, sel...); err != nil {
		return nil, err
	}
	return ownedPods(dep, sets.Items, pods.Items), nil
}

// ownedPods are the pods controlled by a ReplicaSet that dep controls.
func ownedPods(dep *appsv1.Deployment, sets []appsv1.ReplicaSet, pods []corev1.Pod) []corev1.Pod {
	owned := map[types.UID]bool{}
	for i := range sets {
		if metav1.IsControlledBy(&sets[i], dep) {
			owned[sets[i].UID] = true
		}
	}
	var out []corev1.Pod
	for _, p := range pods {
		if ref := metav1.GetControllerOf(&p); ref != nil && owned[ref.UID] {
			out = append(out, p)
		}
	}
	return out
}

// peerGateway is the Gateway that receives the service's requests from
// other clusters: the first one the service routes through, else the
// cluster's default Gateway (--default-gateway), which serves pools that no
// route names.
func (r *Reconciler) peerGateway(rt *routing) client.ObjectKey {
	if len(rt.gateways) > 0 {
		return rt.gateways[0]
	}
	return client.ObjectKey{Namespace: r.opts.Global.IngressGatewayNamespace, Name: r.opts.Global.IngressGatewayName}
}

// pickerAddress is ip:port of the federation server of the first ready
// picker pod by name (with leader election only the leader is ready), for
// --federation-address=PodIP.
func pickerAddress(pods []corev1.Pod) string {
	pods = slices.Clone(pods)
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range pods {
		if p.Status.PodIP == "" || !p.DeletionTimestamp.IsZero() || !podutils.IsPodReady(&p) {
			continue
		}
		return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(federationContainerPort(p.Spec.Containers))))
	}
	return ""
}

// gatewayAddress is where other clusters' pickers send requests in Parent
// mode, as any client would: the Gateway's first status address with its
// first listener's port; "" while the Gateway has no address.
func gatewayAddress(gw *gwapiv1.Gateway) string {
	if len(gw.Status.Addresses) == 0 || gw.Status.Addresses[0].Value == "" || len(gw.Spec.Listeners) == 0 {
		return ""
	}
	return net.JoinHostPort(gw.Status.Addresses[0].Value, strconv.Itoa(int(gw.Spec.Listeners[0].Port)))
}

// watchPickers gives the controller a cache of endpoint-picker pods and
// their ReplicaSets, which reportFederation reads with
// --federation-address=PodIP, and a watch on the pods. The manager's cache
// cannot serve: it keeps every pod stripped to what the capacity report reads
// (capacity.CacheOptions), without labels, IP or conditions. This cache
// holds only picker pods and ReplicaSets, selected by the API server, in full. Watching the
// pods rather than the picker's Deployment catches every change of the
// address: a leader handover between two replicas leaves the Deployment's
// ready count, and so its status, unchanged.
func (r *Reconciler) watchPickers(mgr ctrl.Manager) (source.Source, error) {
	sel := labels.SelectorFromSet(labels.Set{v1alpha2.LabelPartOf: v1alpha2.PartOfValue, v1alpha2.LabelComponent: v1alpha2.ComponentScheduler})
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Label: sel}, &appsv1.ReplicaSet{}: {Label: sel}},
		DefaultTransform: cache.TransformStripManagedFields(),
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(c); err != nil {
		return nil, err
	}
	r.pickers = c
	toService := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, p *corev1.Pod) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: p.Namespace, Name: p.Labels[v1alpha2.LabelName]}}}
	})
	addressChanged := predicate.TypedFuncs[*corev1.Pod]{UpdateFunc: func(e event.TypedUpdateEvent[*corev1.Pod]) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.Status.PodIP != n.Status.PodIP || podutils.IsPodReady(o) != podutils.IsPodReady(n) || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
	}}
	return source.Kind(c, &corev1.Pod{}, toService, addressChanged), nil
}
