package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
)

// WaitPlaceable waits until the hub can place on every spoke: the hub has
// engaged the spoke and finds it available, the spoke's controller has
// reported its GPU capacity, and the hub's MemberCluster for it (what
// `kubectl get memberclusters` shows) says Available. A service applied before that is placed on the
// clusters that happen to be ready and moved when the others arrive.
func (f *Fleet) WaitPlaceable(ctx context.Context, timeout time.Duration) error {
	if f.Hub.ControllerMetrics == "" {
		return fmt.Errorf("the hub controller is not running")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		missing := f.notPlaceable(ctx)
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("spokes not placeable after %s: %s", timeout, strings.Join(missing, "; "))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (f *Fleet) notPlaceable(ctx context.Context) []string {
	var missing []string
	hub, err := metrics.Scrape(ctx, f.Hub.ControllerMetrics)
	if err != nil {
		return []string{"hub metrics: " + err.Error()}
	}
	for _, s := range f.Spokes {
		if hub[`fleetinfer_hub_cluster_available{cluster="`+s.Name()+`"}`] != 1 {
			missing = append(missing, s.Name()+": not available to the hub")
			continue
		}
		cc := &fleetv1alpha1.ClusterCapacity{}
		if err := s.Client.Get(ctx, client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}, cc); err != nil || cc.Status.Nodes == 0 {
			missing = append(missing, s.Name()+": no capacity report")
			continue
		}
		mc := &fleetv1alpha1.MemberCluster{}
		if err := f.Hub.Client.Get(ctx, client.ObjectKey{Name: s.Name()}, mc); err != nil ||
			!meta.IsStatusConditionTrue(mc.Status.Conditions, fleetv1alpha1.MemberClusterAvailable) {
			missing = append(missing, s.Name()+": its MemberCluster is not Available")
		}
	}
	return missing
}
