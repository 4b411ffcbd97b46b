// Package peers federates the endpoint pickers of a placed service. For each
// cluster that runs a copy of the service with federation on, it writes next
// to the copy a peer directory (a ConfigMap in the format of
// epp/federation.PeerDirectory) naming the pickers of the same service in
// the other clusters: their federation address, their gateway for Parent
// mode, and the identity their certificate carries; and an mTLS certificate
// for the picker's own identity (a Secret), signed by the hub's federation
// CA. Both are owned by the copy, so the spoke's garbage collector removes
// them with it. Directories change as placement changes and as pickers move.
package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// Labels KServe puts on an LLMInferenceService's endpoint-picker pods, which
// the spoke controller keeps; the hub caches only pods that carry
// SchedulerComponent.
const (
	labelName          = "app.kubernetes.io/name"
	labelPartOf        = "app.kubernetes.io/part-of"
	labelComponent     = "app.kubernetes.io/component"
	partOfService      = "llminferenceservice"
	SchedulerComponent = "llminferenceservice-router-scheduler"
)

// Reasons of the Events the reconciler records on hub services.
const (
	ReasonPeersUpdated      = "FederationPeersUpdated"
	ReasonNotOurs           = "FederationObjectNotOurs"
	ReasonGatewayUnknown    = "FederationGatewayUnknown"
	ReasonCertificateIssued = "FederationCertificateIssued"
	ReasonTrustUpdated      = "FederationTrustBundleUpdated"
	ReasonUnpublished       = "FederationUnpublished"
)

var (
	directoryPeers = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_hub_federation_directory_peers",
		Help: "Peers listed in the federation peer directory of a service's endpoint picker in a cluster.",
	}, []string{"namespace", "service", "cluster"})
	federationWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_hub_federation_writes_total",
		Help: "Peer directories and certificates the hub wrote into spokes, by kind.",
	}, []string{"cluster", "kind"})
)

func init() { ctrlmetrics.Registry.MustRegister(directoryPeers, federationWrites) }

// Options configure the reconciler.
type Options struct {
	// TrustDomain is the SPIFFE trust domain of the pickers' identities.
	TrustDomain string
	// Gateway is each spoke's inference Gateway, whose address Parent-mode
	// peers send requests to.
	Gateway client.ObjectKey
	// Workers is how many services are reconciled at once.
	Workers int
}

// Reconciler publishes the peer directories and certificates of one hub
// LLMInferenceService.
type Reconciler struct {
	Hub      client.Client
	Inv      *inventory.Inventory
	CA       *Authority
	Recorder record.EventRecorder
	Opts     Options
}

// member is one cluster that runs a federated copy of the service.
type member struct {
	cluster inventory.Cluster
	copy    *v1alpha2.LLMInferenceService
	// peer is how the others reach its picker; nil until the picker has a
	// ready pod (or, in Parent mode, until its gateway has an address).
	peer *federation.Peer
}

// Reconcile publishes what the federation of one hub service needs.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
	svc := &v1alpha2.LLMInferenceService{}
	if err := r.Hub.Get(ctx, req.NamespacedName, svc); err != nil {
		// Gone: its copies go, and what is published goes with them.
		if apierrors.IsNotFound(err) {
			directoryPeers.DeletePartialMatch(prometheus.Labels{"namespace": req.Namespace, "service": req.Name})
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	members, retired := r.members(ctx, svc)
	var errs []error
	for _, m := range retired {
		if m.cluster.Available() {
			if err := r.unpublish(ctx, svc, m); err != nil {
				errs = append(errs, fmt.Errorf("cluster %s: %w", m.cluster.Name, err))
			}
		}
	}
	var renew time.Time
	for _, m := range members {
		if !m.cluster.Available() {
			continue
		}
		at, err := r.ensureCertificate(ctx, svc, m)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: certificate: %w", m.cluster.Name, err))
		} else if renew.IsZero() || at.Before(renew) {
			renew = at
		}
		if err := r.ensureDirectory(ctx, svc, m, members); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: peer directory: %w", m.cluster.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	if renew.IsZero() {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: max(time.Until(renew), time.Second)}, nil
}

// members finds the clusters that run a federated copy of svc, sorted by
// name so that directories are written the same way every time, and the
// copies that do not federate (any more): federation disabled, or the
// service stopped, which removes its picker.
func (r *Reconciler) members(ctx context.Context, svc *v1alpha2.LLMInferenceService) (members, retired []member) {
	for _, c := range r.Inv.Clusters(ctx) {
		cp := &v1alpha2.LLMInferenceService{}
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(svc), cp); err != nil {
			continue
		}
		if !fleetv1alpha1.IsManagedByHub(cp) || !cp.DeletionTimestamp.IsZero() {
			continue
		}
		m := member{cluster: c, copy: cp}
		if cp.Annotations[fleetv1alpha1.FederationClusterAnnotation] == "" || cp.Stopped() {
			retired = append(retired, m)
			continue
		}
		m.peer = r.peer(ctx, svc, c, cp)
		members = append(members, m)
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.cluster.Name, b.cluster.Name) })
	return members, retired
}

// unpublish removes the peer directory and certificate the hub published
// next to a copy that no longer federates: its picker is gone or runs
// alone, and a certificate left behind would be a credential nobody uses.
func (r *Reconciler) unpublish(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member) error {
	var errs []error
	for _, o := range []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: fleetv1alpha1.PeerDirectoryName(svc.Name)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: fleetv1alpha1.FederationTLSName(svc.Name)}},
	} {
		// The cache holds only what the hub labelled as its own.
		if err := m.cluster.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			errs = append(errs, client.IgnoreNotFound(err))
			continue
		}
		err := m.cluster.Client.Delete(ctx, o, client.Preconditions{UID: ptr.To(o.GetUID())})
		if err == nil {
			federationWrites.WithLabelValues(m.cluster.Name, kindOf(o)).Inc()
			r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonUnpublished, "Removed the federation %s of the endpoint picker in cluster %s: its copy does not federate",
				kindOf(o), m.cluster.Name)
		}
		errs = append(errs, client.IgnoreNotFound(err))
	}
	return errors.Join(errs...)
}

// peer is the directory entry of one cluster's picker, or nil while it
// cannot be reached.
func (r *Reconciler) peer(ctx context.Context, svc *v1alpha2.LLMInferenceService, c inventory.Cluster, cp *v1alpha2.LLMInferenceService) *federation.Peer {
	addr := eppAddress(ctx, c.Client, cp)
	if addr == "" {
		return nil
	}
	p := &federation.Peer{Cluster: c.Name, FederationAddress: addr, Identity: r.identity(c.Name, svc),
		Mode: federation.Mode(cp.Annotations[fleetv1alpha1.FederationModeAnnotation])}
	p.GatewayAddress = gatewayAddress(ctx, c.Client, r.Opts.Gateway)
	if p.Mode == federation.ModeParent && p.GatewayAddress == "" {
		r.Recorder.Eventf(svc, corev1.EventTypeWarning, ReasonGatewayUnknown,
			"Cluster %s is left out of the peer directories: Parent mode needs the address of its Gateway %s, which has none in its status", c.Name, r.Opts.Gateway)
		return nil
	}
	if err := (&federation.PeerDirectory{Peers: []federation.Peer{*p}}).Validate(); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "peer entry left out", "cluster", c.Name)
		return nil
	}
	return p
}

// identity is the URI SAN of a picker's certificate: one per service per
// cluster, so a picker can speak only for its own pool and cluster.
func (r *Reconciler) identity(cluster string, svc *v1alpha2.LLMInferenceService) string {
	return fmt.Sprintf("spiffe://%s/cluster/%s/ns/%s/llminferenceservice/%s", r.Opts.TrustDomain, cluster, svc.Namespace, svc.Name)
}

// eppAddress is ip:port of the federation server of the copy's picker: its
// first ready pod by name (with leader election only the leader is ready).
func eppAddress(ctx context.Context, c client.Client, cp *v1alpha2.LLMInferenceService) string {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(cp.Namespace),
		client.MatchingLabels{labelName: cp.Name, labelPartOf: partOfService, labelComponent: SchedulerComponent}); err != nil {
		return ""
	}
	slices.SortFunc(pods.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range pods.Items {
		if p.Status.PodIP == "" || !p.DeletionTimestamp.IsZero() || !podReady(&p) {
			continue
		}
		port := int32(fleetv1alpha1.FederationPort)
		for _, ctr := range p.Spec.Containers {
			if i := slices.IndexFunc(ctr.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == "federation" }); i >= 0 {
				port = ctr.Ports[i].ContainerPort
			}
		}
		return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(port)))
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	i := slices.IndexFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady })
	return i >= 0 && p.Status.Conditions[i].Status == corev1.ConditionTrue
}

// gatewayAddress is host:port where other clusters' gateways forward
// requests to this cluster, or "" while its Gateway has no address.
func gatewayAddress(ctx context.Context, c client.Client, key client.ObjectKey) string {
	gw := &gwapiv1.Gateway{}
	if err := c.Get(ctx, key, gw); err != nil {
		return ""
	}
	return peerAddress(gw)
}

// peerAddress is the Gateway's first status address with its peer port: the
// GatewayPeerPortAnnotation, else its first listener's port.
func peerAddress(gw *gwapiv1.Gateway) string {
	if len(gw.Status.Addresses) == 0 || gw.Status.Addresses[0].Value == "" {
		return ""
	}
	port := 0
	if v, ok := gw.Annotations[fleetv1alpha1.GatewayPeerPortAnnotation]; ok {
		port, _ = strconv.Atoi(v)
	} else if len(gw.Spec.Listeners) > 0 {
		port = int(gw.Spec.Listeners[0].Port)
	}
	if port <= 0 || port > 65535 {
		return ""
	}
	return net.JoinHostPort(gw.Status.Addresses[0].Value, strconv.Itoa(port))
}

// ensureDirectory writes the peer directory of m: every other member whose
// picker can be reached.
func (r *Reconciler) ensureDirectory(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member, members []member) error {
	dir := federation.PeerDirectory{Peers: []federation.Peer{}}
	for _, o := range members {
		if o.cluster.Name != m.cluster.Name && o.peer != nil {
			dir.Peers = append(dir.Peers, *o.peer)
		}
	}
	data, err := yaml.Marshal(dir)
	if err != nil {
		return err
	}
	directoryPeers.WithLabelValues(svc.Namespace, svc.Name, m.cluster.Name).Set(float64(len(dir.Peers)))
	want := &corev1.ConfigMap{
		ObjectMeta: r.childMeta(m, fleetv1alpha1.PeerDirectoryName(svc.Name)),
		Data:       map[string]string{fleetv1alpha1.PeerDirectoryKey: string(data)},
	}
	changed, err := apply(ctx, r, svc, m, want, func(cur *corev1.ConfigMap) bool {
		if cur.Data[fleetv1alpha1.PeerDirectoryKey] == want.Data[fleetv1alpha1.PeerDirectoryKey] {
			return false
		}
		cur.Data = want.Data
		return true
	})
	if changed && err == nil {
		names := make([]string, 0, len(dir.Peers))
		for _, p := range dir.Peers {
			names = append(names, p.Cluster)
		}
		r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonPeersUpdated, "Peer directory in cluster %s lists %d peers: %s",
			m.cluster.Name, len(names), strings.Join(names, ", "))
	}
	return err
}

// ensureCertificate keeps m's picker certificate and trust bundle current
// and returns when to look again.
func (r *Reconciler) ensureCertificate(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member) (time.Time, error) {
	id := r.identity(m.cluster.Name, svc)
	name := fleetv1alpha1.FederationTLSName(svc.Name)
	cur := &corev1.Secret{}
	err := m.cluster.Client.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: name}, cur)
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, err
	}
	if err == nil {
		v, err := r.CA.Check(ctx, id, cur.Data[corev1.TLSCertKey])
		if err != nil {
			return time.Time{}, err
		}
		if v.KeepLeaf {
			if bytes.Equal(cur.Data[corev1.ServiceAccountRootCAKey], v.Bundle) {
				return v.Recheck, nil
			}
			// A rotation changed the trust bundle only: the picker keeps its
			// certificate, so its open streams stay up.
			changed, err := r.publishCertificate(ctx, svc, m, name, cur.Data[corev1.TLSCertKey], cur.Data[corev1.TLSPrivateKeyKey], v.Bundle)
			if changed {
				r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonTrustUpdated, "Updated the federation trust bundle of the endpoint picker in cluster %s to %d CAs",
					m.cluster.Name, bytes.Count(v.Bundle, []byte("BEGIN CERTIFICATE")))
			}
			return v.Recheck, err
		}
	}
	cert, err := r.CA.Issue(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	changed, err := r.publishCertificate(ctx, svc, m, name, cert.cert, cert.key, cert.ca)
	if changed {
		r.Recorder.Eventf(svc, corev1.EventTypeNormal, ReasonCertificateIssued, "Issued the federation certificate of the endpoint picker in cluster %s for %s", m.cluster.Name, id)
	}
	return cert.recheck, err
}

// publishCertificate writes a picker's certificate Secret and reports
// whether it changed.
func (r *Reconciler) publishCertificate(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member, name string, cert, key, bundle []byte) (bool, error) {
	want := &corev1.Secret{
		ObjectMeta: r.childMeta(m, name),
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key,
			corev1.ServiceAccountRootCAKey: bundle},
	}
	changed, err := apply(ctx, r, svc, m, want, func(cur *corev1.Secret) bool {
		cur.Data, cur.Type = want.Data, want.Type
		return true
	})
	return changed && err == nil, err
}

// childMeta labels a published object as the hub's and makes the copy its
// owner.
func (r *Reconciler) childMeta(m member, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: m.copy.Namespace, Name: name,
		Labels: map[string]string{fleetv1alpha1.ManagedByLabel: fleetv1alpha1.ManagedByHub, labelName: m.copy.Name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha2.GroupVersion.String(), Kind: "LLMInferenceService",
			Name: m.copy.Name, UID: m.copy.UID, BlockOwnerDeletion: ptr.To(false)}},
	}
}

// apply creates want or updates the cached object through mutate, which
// reports whether it changed anything. An object of that name the hub did
// not create is left alone and reported.
func apply[T client.Object](ctx context.Context, r *Reconciler, svc *v1alpha2.LLMInferenceService, m member, want T, mutate func(T) bool) (bool, error) {
	c := m.cluster.Client
	cur := want.DeepCopyObject().(T)
	err := c.Get(ctx, client.ObjectKeyFromObject(want), cur)
	if apierrors.IsNotFound(err) {
		err = c.Create(ctx, want)
		if apierrors.IsAlreadyExists(err) {
			// The cache holds only what the hub labelled, and may lag what it
			// just wrote: only the API server can tell whose this is.
			live := want.DeepCopyObject().(T)
			if err := m.cluster.Reader.Get(ctx, client.ObjectKeyFromObject(want), live); err != nil {
				return false, err
			}
			if fleetv1alpha1.IsManagedByHub(live) {
				return false, fmt.Errorf("%s is not in the cache yet", kindOf(want))
			}
			r.Recorder.Eventf(svc, corev1.EventTypeWarning, ReasonNotOurs, "Cluster %s has a %T %s/%s the hub did not create; the endpoint picker there cannot federate until it is removed",
				m.cluster.Name, want, want.GetNamespace(), want.GetName())
			return false, nil
		}
		if err == nil {
			federationWrites.WithLabelValues(m.cluster.Name, kindOf(want)).Inc()
		}
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	changed := mutate(cur)
	if !equality.Semantic.DeepEqual(cur.GetOwnerReferences(), want.GetOwnerReferences()) {
		// The copy was replaced: follow the new one, or its GC takes this.
		cur.SetOwnerReferences(want.GetOwnerReferences())
		changed = true
	}
	if !changed {
		return false, nil
	}
	if err := c.Update(ctx, cur); err != nil {
		return false, err
	}
	federationWrites.WithLabelValues(m.cluster.Name, kindOf(want)).Inc()
	return true, nil
}

func kindOf(o client.Object) string {
	if _, ok := o.(*corev1.Secret); ok {
		return "certificate"
	}
	return "directory"
}
