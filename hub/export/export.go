// Package export is the export controller of the GIE multi-cluster
// proposal, run by the hub: an InferencePool of a copy the hub placed that
// its cluster exports (the annotation
// inference.networking.x-k8s.io/export: ClusterSet) gets an
// Exported parent entry in its status, and every member cluster gets an
// InferencePoolImport of the same namespace and name listing the exporting
// clusters. When no cluster exports a pool any more, its imports are
// withdrawn.
package export

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/component"
	"github.com/fleetinfer/fleetinfer/hub/internal/spokewrite"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// ControllerName names the hub in pool parents and import controllers.
const ControllerName = "fleetinfer.io/hub"

var importedPools = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "fleetinfer_hub_exported_pool_clusters",
	Help: "Clusters exporting an InferencePool.",
}, []string{"namespace", "pool"})

func init() { ctrlmetrics.Registry.MustRegister(importedPools) }

// Reconciler reconciles one exported pool (by namespace/name) across the
// fleet.
type Reconciler struct {
	// Clusters are the fleet's clusters.
	Clusters inventory.Source
	// HubID is this hub's identity (fleetv1alpha1.HubIDLabel): it creates
	// and deletes only imports that carry it.
	HubID string
}

// +kubebuilder:rbac:groups=inference.networking.k8s.io,resources=inferencepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=inference.networking.k8s.io,resources=inferencepools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=inference.networking.x-k8s.io,resources=inferencepoolimports,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=inference.networking.x-k8s.io,resources=inferencepoolimports/status,verbs=get;update;patch

// Reconcile converges one pool's exports and imports. A cluster that cannot
// be reached, or that another hub with this hub's ID holds (fenced), keeps
// what it has until it is back, and a cluster whose pool
// cannot be read keeps its place in the imports: not knowing whether a
// cluster exports is no reason to withdraw its pool from the fleet.
func (r *Reconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (ctrl.Result, error) {
	clusters := r.Clusters.Clusters(ctx)
	var exporting []string
	unread := map[string]bool{}
	var errs []error
	for _, c := range clusters {
		p := &igwapiv1.InferencePool{}
		err := c.Client.Get(ctx, req.NamespacedName, p)
		switch {
		case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
			continue
		case err != nil:
			unread[c.Name] = true
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.Name, err))
			continue
		}
		if p.Annotations[fleetv1alpha1.ExportAnnotation] != fleetv1alpha1.ExportClusterSet || !p.DeletionTimestamp.IsZero() {
			continue
		}
		placed, err := r.placedHere(ctx, c.Client, p)
		if err != nil {
			unread[c.Name] = true
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.Name, err))
			continue
		}
		if !placed {
			continue
		}
		exporting = append(exporting, c.Name)
		if c.Writable() {
			if err := markExported(ctx, c.Client, p); err != nil {
				errs = append(errs, fmt.Errorf("cluster %s: %w", c.Name, err))
			}
		}
	}
	sort.Strings(exporting)
	importedPools.WithLabelValues(req.Namespace, req.Name).Set(float64(len(exporting)))
	for _, c := range clusters {
		if !c.Writable() {
			continue
		}
		var err error
		switch {
		case len(exporting) > 0:
			err = r.ensureImport(ctx, c.Client, req.NamespacedName, exporting, unread)
		case len(unread) == 0:
			err = r.withdraw(ctx, c.Client, req.NamespacedName)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cluster %s: %w", c.Name, err))
		}
	}
	if len(exporting) == 0 && len(unread) == 0 {
		importedPools.DeleteLabelValues(req.Namespace, req.Name)
	}
	return ctrl.Result{}, errors.Join(errs...)
}

// placedHere reports whether the pool belongs to a copy this hub placed:
// only those are exported. An export annotation on any other pool (a
// tenant's own service in the spoke, a second hub's copy) would make this
// hub write imports, and their namespaces, into every cluster.
func (r *Reconciler) placedHere(ctx context.Context, c client.Client, p *igwapiv1.InferencePool) (bool, error) {
	owner := metav1.GetControllerOf(p)
	if owner == nil || owner.Kind != "LLMInferenceService" || owner.APIVersion != v1alpha2.GroupVersion.String() {
		return false, nil
	}
	svc := &v1alpha2.LLMInferenceService{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: owner.Name}, svc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return svc.UID == owner.UID && fleetv1alpha1.IsOwnedByHub(svc, r.HubID), nil
}

// markExported sets the hub's parent entry on the pool: a parent of kind
// InferencePoolImport with Exported=True. Other controllers' entries (the
// Gateways') are theirs and stay as they are.
func markExported(ctx context.Context, c client.Client, p *igwapiv1.InferencePool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &igwapiv1.InferencePool{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		ref := igwapiv1.ParentReference{Group: ptr.To(igwapiv1.Group(igwapixv1alpha1.SchemeGroupVersion.Group)), Kind: "InferencePoolImport",
			Name: igwapiv1.ObjectName(cur.Name), Namespace: igwapiv1.Namespace(cur.Namespace)}
		i := slices.IndexFunc(cur.Status.Parents, func(ps igwapiv1.ParentStatus) bool {
			return ps.ParentRef.Kind == ref.Kind && ptr.Deref(ps.ParentRef.Group, "") == *ref.Group && ps.ParentRef.Name == ref.Name
		})
		entry := igwapiv1.ParentStatus{ParentRef: ref, ControllerName: ControllerName}
		if i >= 0 {
			entry = *cur.Status.Parents[i].DeepCopy()
		}
		before := entry.DeepCopy()
		meta.SetStatusCondition(&entry.Conditions, metav1.Condition{Type: string(igwapiv1.InferencePoolConditionExported),
			Status: metav1.ConditionTrue, Reason: string(igwapiv1.InferencePoolReasonExported),
			Message: "Exported to every member cluster of the fleet as an InferencePoolImport", ObservedGeneration: cur.Generation})
		if i >= 0 && equality.Semantic.DeepEqual(before, &entry) {
			return nil
		}
		if i >= 0 {
			cur.Status.Parents[i] = entry
		} else {
			cur.Status.Parents = append(cur.Status.Parents, entry)
		}
		return c.Status().Update(ctx, cur)
	})
}

// ensureImport creates the InferencePoolImport (and its namespace) and
// records the exporting clusters in the hub's controller entry; a cluster in
// unread that the entry lists stays listed.
func (r *Reconciler) ensureImport(ctx context.Context, c client.Client, key client.ObjectKey, exporting []string, unread map[string]bool) error {
	imp := &igwapixv1alpha1.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
		Labels: fleetv1alpha1.OwnedByHubLabels(r.HubID)}}
	createNamespace := func() error { return spokewrite.EnsureNamespace(ctx, c, key.Namespace, r.HubID) }
	// The import's content is its status, written below: the object itself
	// is only created.
	_, err := spokewrite.Ensure(ctx, c, r.HubID, imp, createNamespace, func(_, _ *igwapixv1alpha1.InferencePoolImport) bool { return false })
	var notOurs *spokewrite.NotOursError
	var nsNotOurs *spokewrite.NamespaceNotOursError
	switch {
	case meta.IsNoMatchError(err):
		return nil // the member has no InferencePoolImport API
	case errors.As(err, &notOurs):
		return nil // someone else's import of that name
	case errors.As(err, &nsNotOurs):
		return nil // a namespace of the member's own: it imports nothing
	case err != nil:
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key, imp); err != nil {
			return err
		}
		i := slices.IndexFunc(imp.Status.Controllers, func(ic igwapixv1alpha1.ImportController) bool { return ic.Name == ControllerName })
		names := slices.Clone(exporting)
		if i >= 0 {
			for _, e := range imp.Status.Controllers[i].ExportingClusters {
				if n := string(e.Name); unread[n] && !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
		}
		sort.Strings(names)
		entry := igwapixv1alpha1.ImportController{Name: ControllerName}
		for _, n := range names {
			entry.ExportingClusters = append(entry.ExportingClusters, igwapixv1alpha1.ExportingCluster{Name: igwapixv1alpha1.ClusterName(n)})
		}
		if i >= 0 {
			entry.Parents, entry.Conditions = imp.Status.Controllers[i].Parents, imp.Status.Controllers[i].Conditions
			if equality.Semantic.DeepEqual(imp.Status.Controllers[i], entry) {
				return nil
			}
			imp.Status.Controllers[i] = entry
		} else {
			imp.Status.Controllers = append(imp.Status.Controllers, entry)
		}
		return c.Status().Update(ctx, imp)
	})
}

// withdraw deletes the hub's import of a pool no cluster exports.
func (r *Reconciler) withdraw(ctx context.Context, c client.Client, key client.ObjectKey) error {
	imp := &igwapixv1alpha1.InferencePoolImport{}
	err := c.Get(ctx, key, imp)
	if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fleetv1alpha1.IsOwnedByHub(imp, r.HubID) {
		return nil
	}
	return client.IgnoreNotFound(c.Delete(ctx, imp))
}

// Options configure the reconciler.
type Options struct {
	// HubID is this hub's identity (Reconciler.HubID).
	HubID string
}

// Setup registers the reconciler.
func Setup(ctx context.Context, deps component.Deps, opts Options) error {
	r := &Reconciler{Clusters: deps.Inventory, HubID: opts.HubID}
	return r.setupWithManager(ctx, deps.Manager, deps.Inventory)
}

// setupWithManager registers the reconciler: pools and imports in every
// cluster map to their namespace/name; cluster changes re-run every pool a
// cluster knows.
func (r *Reconciler) setupWithManager(ctx context.Context, mgr mcmanager.Manager, inv *inventory.Inventory) error {
	return mcbuilder.ControllerManagedBy(mgr).
		Named("hub-inferencepool-export").
		Watches(&igwapiv1.InferencePool{}, watch.SameKey, watch.OnSpokes...).
		Watches(&igwapixv1alpha1.InferencePoolImport{}, watch.SameKey, watch.OnSpokes...).
		WatchesRawSource(watch.ClusterChanges(ctx, inv, time.Second, r.knownPools)).
		Complete(r)
}

// knownPools lists every pool and import in every cluster: when a cluster
// joins, leaves or recovers, a new member needs its imports and a lost
// exporter's pools change.
func (r *Reconciler) knownPools(ctx context.Context) []client.ObjectKey {
	seen := map[client.ObjectKey]bool{}
	var out []client.ObjectKey
	for _, c := range r.Clusters.Clusters(ctx) {
		keys := watch.Keys(ctx, c.Client, &igwapiv1.InferencePoolList{}, "")
		var imports igwapixv1alpha1.InferencePoolImportList
		if err := c.Client.List(ctx, &imports, client.MatchingLabels(fleetv1alpha1.OwnedByHubLabels(r.HubID))); err == nil {
			for i := range imports.Items {
				keys = append(keys, client.ObjectKeyFromObject(&imports.Items[i]))
			}
		}
		for _, k := range keys {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}
