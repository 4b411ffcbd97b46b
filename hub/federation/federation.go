// Package federation federates the endpoint pickers of a placed service.
// For each cluster that runs a copy of the service with federation on, it
// writes next to the copy a peer directory (a ConfigMap in the format of
// fleetv1alpha1.PeerDirectory, directory.go) naming the pickers of the same
// service in the other clusters, and an mTLS certificate for the picker's
// own identity (a Secret, certificates.go) signed by the hub's federation
// CA (package ca). Both are owned by the copy, so the spoke's garbage
// collector removes them with it. A cluster that only imports the
// service's pool (hub/export) gets the same, as a subscribe-only peer
// (importers.go). Setup and the watches are in setup.go.
//
// The hub reads only copies: each spoke reports on its copy's
// status.federation where its picker's federation server listens and, for
// Parent mode, where its gateway takes other clusters' requests. The
// directories change as placement changes and as those addresses do.
package federation

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/federation/ca"
	"github.com/fleetinfer/fleetinfer/hub/internal/spokewrite"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
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
	// Workers is how many services are reconciled at once.
	Workers int
	// HubID is this hub's identity (fleetv1alpha1.HubIDLabel): it writes
	// and removes only what carries it, next to copies that carry it.
	HubID string
	// Namespace holds the clusters' registrations and the federation CA's
	// Secret, CASecret.
	Namespace string
	CASecret  string
	// CAOverlap is how long each phase of a CA rotation lasts
	// (ca.Authority.Overlap).
	CAOverlap time.Duration
}

// Reconciler publishes the peer directories and certificates of one hub
// LLMInferenceService.
type Reconciler struct {
	Hub      client.Client
	Inv      inventory.Source
	CA       *ca.Authority
	Recorder record.EventRecorder
	Opts     Options
}

// member is one cluster that runs a federated copy of the service, or that
// imports its pool (importers.go).
type member struct {
	cluster inventory.Cluster
	copy    *v1alpha2.LLMInferenceService
	// importer is the import of an importing cluster, which has no copy.
	importer *igwapixv1alpha1.InferencePoolImport
	// peer is how the others reach its picker, without the mode, which
	// depends on the pair of clusters (peersOf); nil until the copy reports
	// its picker's address.
	peer *fleetv1alpha1.Peer
}

// Reconcile publishes what the federation of one hub service needs, in the
// clusters the hub may write to (available, not fenced); the others keep
// what was published.
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
	importers, others := r.importers(ctx, svc, members, retired)
	members, retired = sortedMembers(append(members, importers...)), append(retired, others...)
	var errs []error
	for _, m := range retired {
		if m.cluster.Writable() {
			if err := r.unpublish(ctx, svc, m); err != nil {
				errs = append(errs, fmt.Errorf("cluster %s: %w", m.cluster.Name, err))
			}
		}
	}
	var renew time.Time
	noGateway := map[string]bool{}
	for _, m := range members {
		if !m.cluster.Writable() {
			continue
		}
		if m.importer != nil {
			if err := r.markImport(ctx, svc, m); err != nil {
				errs = append(errs, fmt.Errorf("cluster %s: import: %w", m.cluster.Name, err))
			}
		}
		at, err := r.ensureCertificate(ctx, svc, m)
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: certificate: %w", m.cluster.Name, err))
		} else if !at.IsZero() && (renew.IsZero() || at.Before(renew)) {
			renew = at
		}
		peers, left := peersOf(m, members)
		for _, c := range left {
			noGateway[c] = true
		}
		if err := r.ensureDirectory(ctx, svc, m, peers); err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: peer directory: %w", m.cluster.Name, err))
		}
	}
	for _, c := range slices.Sorted(maps.Keys(noGateway)) {
		r.Recorder.Eventf(svc, corev1.EventTypeWarning, ReasonGatewayUnknown,
			"Cluster %s is left out of the peer directories that reach it in Parent mode: Parent mode needs the address of its gateway, which its copy does not report", c)
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
		if !fleetv1alpha1.IsOwnedByHub(cp, r.Opts.HubID) || !cp.DeletionTimestamp.IsZero() {
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
	return sortedMembers(members), retired
}

// sortedMembers sorts members by cluster name, so that directories are
// written the same way every time.
func sortedMembers(members []member) []member {
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.cluster.Name, b.cluster.Name) })
	return members
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
		if err := m.cluster.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			errs = append(errs, client.IgnoreNotFound(err))
			continue
		}
		if !fleetv1alpha1.IsOwnedByHub(o, r.Opts.HubID) {
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

// childMeta labels a published object as the hub's and makes the copy (or
// an importer's import) its owner.
func (r *Reconciler) childMeta(svc *v1alpha2.LLMInferenceService, m member, name string) metav1.ObjectMeta {
	meta := metav1.ObjectMeta{
		Namespace: svc.Namespace, Name: name,
		Labels:          map[string]string{v1alpha2.LabelName: svc.Name},
		OwnerReferences: []metav1.OwnerReference{m.ownerRef()},
	}
	fleetv1alpha1.MarkOwnedByHub(&meta, r.Opts.HubID)
	return meta
}

// apply creates want or updates the existing object through mutate, which
// reports whether it changed anything; an owner that differs from want's
// (the copy was replaced) is followed, or the old copy's GC takes the
// object. An object of that name the hub did not create is left alone and
// reported.
func apply[T client.Object](ctx context.Context, r *Reconciler, svc *v1alpha2.LLMInferenceService, m member, want T, mutate func(T) bool) (bool, error) {
	res, err := spokewrite.Ensure(ctx, m.cluster.Client, r.Opts.HubID, want, nil, func(cur, want T) bool {
		changed := mutate(cur)
		if !equality.Semantic.DeepEqual(cur.GetOwnerReferences(), want.GetOwnerReferences()) {
			cur.SetOwnerReferences(want.GetOwnerReferences())
			changed = true
		}
		return changed
	})
	var notOurs *spokewrite.NotOursError
	switch {
	case apierrors.IsAlreadyExists(err):
		return false, alreadyExists(ctx, r, svc, m, want)
	case errors.As(err, &notOurs):
		r.notOurs(svc, m, notOurs.Object)
		return false, nil
	case err != nil || res == spokewrite.Unchanged:
		return false, err
	}
	federationWrites.WithLabelValues(m.cluster.Name, kindOf(want)).Inc()
	return true, nil
}

// alreadyExists handles a create of want that found the object there. The
// cache holds only what the hub labelled, and may lag what it just wrote:
// only the API server can tell whose this is.
func alreadyExists[T client.Object](ctx context.Context, r *Reconciler, svc *v1alpha2.LLMInferenceService, m member, want T) error {
	cur := want.DeepCopyObject().(T)
	if err := m.cluster.Reader.Get(ctx, client.ObjectKeyFromObject(want), cur); err != nil {
		return err
	}
	if fleetv1alpha1.IsOwnedByHub(cur, r.Opts.HubID) {
		return fmt.Errorf("%s is not in the cache yet", kindOf(want))
	}
	r.notOurs(svc, m, cur)
	return nil
}

// notOurs reports an object in the way of what the hub publishes.
func (r *Reconciler) notOurs(svc *v1alpha2.LLMInferenceService, m member, o client.Object) {
	r.Recorder.Eventf(svc, corev1.EventTypeWarning, ReasonNotOurs, "Cluster %s has a %s %s/%s the hub did not create; the endpoint picker there cannot federate until it is removed",
		m.cluster.Name, kindName(o), o.GetNamespace(), o.GetName())
}

func kindOf(o client.Object) string {
	if _, ok := o.(*corev1.Secret); ok {
		return "certificate"
	}
	return "directory"
}

func kindName(o client.Object) string {
	if _, ok := o.(*corev1.Secret); ok {
		return "Secret"
	}
	return "ConfigMap"
}
