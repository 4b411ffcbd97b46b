package distribute

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// OrphanCollector deletes what the hub left in spokes that no hub object
// accounts for any more: copies of services deleted while their cluster was
// unreachable, and copied configs no copy references. It runs periodically
// and whenever a cluster joins or recovers (as MultiKueue's garbage
// collector does for remote objects after an outage).
type OrphanCollector struct {
	hub       client.Client
	inv       *inventory.Inventory
	interval  time.Duration
	deletions *deletions
}

// Start runs the collector until ctx ends.
func (g *OrphanCollector) Start(ctx context.Context) error {
	changes := g.inv.Subscribe(16)
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-changes:
		}
		for _, c := range g.inv.Clusters(ctx) {
			if c.Available() {
				g.collect(ctx, c)
			}
		}
	}
}

func (g *OrphanCollector) collect(ctx context.Context, c inventory.Cluster) {
	managed := client.MatchingLabels(fleetv1alpha1.ManagedByHubLabels())
	var copies v1alpha2.LLMInferenceServiceList
	if err := c.Client.List(ctx, &copies, managed); err != nil {
		return
	}
	referenced := map[string]bool{} // namespace/config
	for _, cp := range copies.Items {
		hub := &v1alpha2.LLMInferenceService{}
		err := g.hub.Get(ctx, client.ObjectKeyFromObject(&cp), hub)
		if apierrors.IsNotFound(err) {
			_ = g.deletions.deleteCopy(ctx, c, cp.Namespace, cp.Name)
			continue
		}
		for _, ref := range cp.Spec.BaseRefs {
			referenced[cp.Namespace+"/"+ref.Name] = true
		}
	}
	var configs v1alpha2.LLMInferenceServiceConfigList
	if err := c.Client.List(ctx, &configs, managed); err != nil {
		return
	}
	for i := range configs.Items {
		cfg := &configs.Items[i]
		if !referenced[cfg.Namespace+"/"+cfg.Name] && cfg.DeletionTimestamp.IsZero() {
			_ = client.IgnoreNotFound(c.Client.Delete(ctx, cfg))
		}
	}
}

// NeedLeaderElection: only the elected hub deletes.
func (g *OrphanCollector) NeedLeaderElection() bool { return true }
