package federation

import (
	"context"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

// Importers: a cluster that runs no copy of a service but routes its
// InferencePoolImport (the spoke's import controller keeps an entry named
// fleetv1alpha1.ImportControllerName on the import) subscribes to the
// service's federation. The hub labels the import with the service and
// annotates it with the cluster's name, publishes next to it, owned by it,
// a peer directory of the exporting clusters' pickers (in Parent mode: the
// importer reaches them through their gateways) and a certificate for the
// cluster's identity, and lists the importer in the exporting clusters'
// directories as a subscribe-only peer, which their pickers admit but never
// dial: it runs no pods and has no federation address.

// importers finds the clusters that import svc's pool: no copy of svc
// (running or retired), an import of the pool the copies report, carrying
// the import controller's entry. Every other cluster without a copy is
// returned in others, whose federation objects, if any, are an importer's
// that stopped importing.
func (r *Reconciler) importers(ctx context.Context, svc *v1alpha2.LLMInferenceService, members, retired []member) (importers, others []member) {
	pool := reportedPool(members)
	for _, c := range r.Inv.Clusters(ctx) {
		if slices.ContainsFunc(append(slices.Clone(members), retired...), func(m member) bool { return m.cluster.Name == c.Name }) {
			continue
		}
		m := member{cluster: c}
		imp := &igwapixv1alpha1.InferencePoolImport{}
		var err error
		if pool != "" {
			err = c.Client.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: pool}, imp)
		}
		switch {
		case err != nil && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err):
			continue // unknown: what was published stays
		case pool == "" || err != nil || !fleetv1alpha1.IsOwnedByHub(imp, r.Opts.HubID) || !imp.DeletionTimestamp.IsZero() || !routes(imp):
			others = append(others, m)
			continue
		}
		m.importer = imp
		m.peer = &fleetv1alpha1.Peer{Cluster: c.Name, Identity: r.identity(c.Name, svc), SubscribeOnly: true}
		importers = append(importers, m)
	}
	return importers, others
}

// reportedPool is the InferencePool the members' copies report: the name of
// every import of the service.
func reportedPool(members []member) string {
	for _, m := range members {
		if rs := m.copy.Status.Router; rs != nil && rs.Scheduler != nil && rs.Scheduler.InferencePool != nil {
			return string(rs.Scheduler.InferencePool.Name)
		}
	}
	return ""
}

// routes reports whether the spoke's import controller routes the import.
func routes(imp *igwapixv1alpha1.InferencePoolImport) bool {
	return slices.ContainsFunc(imp.Status.Controllers, func(c igwapixv1alpha1.ImportController) bool {
		return c.Name == fleetv1alpha1.ImportControllerName
	})
}

// +kubebuilder:rbac:groups=inference.networking.x-k8s.io,resources=inferencepoolimports,verbs=get;list;watch;update

// markImport labels an importer's import with the service and annotates it
// with the cluster's name: what the spoke's import controller needs to run
// the service's picker there.
func (r *Reconciler) markImport(ctx context.Context, svc *v1alpha2.LLMInferenceService, m member) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		imp := &igwapixv1alpha1.InferencePoolImport{}
		if err := m.cluster.Client.Get(ctx, client.ObjectKeyFromObject(m.importer), imp); err != nil {
			return client.IgnoreNotFound(err)
		}
		if imp.Labels[v1alpha2.LabelName] == svc.Name && imp.Annotations[fleetv1alpha1.FederationClusterAnnotation] == m.cluster.Name {
			return nil
		}
		metav1.SetMetaDataLabel(&imp.ObjectMeta, v1alpha2.LabelName, svc.Name)
		metav1.SetMetaDataAnnotation(&imp.ObjectMeta, fleetv1alpha1.FederationClusterAnnotation, m.cluster.Name)
		if err := m.cluster.Client.Update(ctx, imp); err != nil {
			return err
		}
		federationWrites.WithLabelValues(m.cluster.Name, "import").Inc()
		return nil
	})
}

// ownerRef is the owner of what the hub publishes for m's picker: the copy,
// or an importer's import. Neither blocks its owner's deletion.
func (m member) ownerRef() metav1.OwnerReference {
	if m.importer != nil {
		return metav1.OwnerReference{APIVersion: igwapixv1alpha1.SchemeGroupVersion.String(), Kind: "InferencePoolImport",
			Name: m.importer.Name, UID: m.importer.UID, BlockOwnerDeletion: ptr.To(false)}
	}
	return metav1.OwnerReference{APIVersion: v1alpha2.GroupVersion.String(), Kind: "LLMInferenceService",
		Name: m.copy.Name, UID: m.copy.UID, BlockOwnerDeletion: ptr.To(false)}
}

// toImportingService maps an import in a spoke to the service it is
// labelled with, or, before the hub labelled it, to every service of its
// namespace (one of them exports the pool).
func (r *Reconciler) toImportingService(ctx context.Context, o client.Object) []mcreconcile.Request {
	if name := o.GetLabels()[v1alpha2.LabelName]; name != "" {
		return []mcreconcile.Request{watch.Request(o.GetNamespace(), name)}
	}
	return watch.Requests(ctx, r.Hub, &v1alpha2.LLMInferenceServiceList{}, o.GetNamespace())
}
