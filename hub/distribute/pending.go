package distribute

import (
	"cmp"
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/statuspatch"
)

// pendingDeletions is what a cluster's MemberCluster says of its orphans.
type pendingDeletions struct {
	listed      []fleetv1alpha1.PendingDeletion
	count, held int32
}

// report counts a cluster's orphans in the metrics and writes them to its
// MemberCluster, so that a user sees what the collector will delete and
// when without the hub's metrics. Nothing is written when nothing changed;
// a MemberCluster not made yet (hub/members makes it) is written at a later
// sweep.
func (g *OrphanCollector) report(ctx context.Context, cluster string, orphaned map[copyRef]orphan) {
	want := pendingOf(orphaned, g.grace)
	orphansPending.WithLabelValues(cluster).Set(float64(want.count))
	deletionsHeld.WithLabelValues(cluster).Set(float64(want.held))
	mc := &fleetv1alpha1.MemberCluster{}
	if err := g.hub.Get(ctx, client.ObjectKey{Name: cluster}, mc); err != nil || want.equal(mc.Status) {
		return
	}
	if err := statuspatch.Write(ctx, g.hub, mc, want.set); err != nil {
		log.FromContext(ctx).Error(err, "writing the pending deletions", "cluster", cluster)
	}
}

// pendingOf lists the orphans, those the collector will delete soonest
// first and the held ones last, and counts them.
func pendingOf(orphaned map[copyRef]orphan, grace time.Duration) pendingDeletions {
	var p pendingDeletions
	for ref, o := range orphaned {
		d := fleetv1alpha1.PendingDeletion{Namespace: ref.namespace, Name: ref.name,
			OrphanedSince: metav1.NewTime(o.since.UTC().Truncate(time.Second)), Held: o.held}
		if o.held {
			p.held++
		} else {
			p.count++
			after := metav1.NewTime(o.since.Add(grace).UTC().Truncate(time.Second))
			d.DeleteAfter = &after
		}
		p.listed = append(p.listed, d)
	}
	slices.SortFunc(p.listed, func(a, b fleetv1alpha1.PendingDeletion) int {
		switch {
		case a.Held && !b.Held:
			return 1
		case !a.Held && b.Held:
			return -1
		}
		if !a.Held {
			if c := a.DeleteAfter.Compare(b.DeleteAfter.Time); c != 0 {
				return c
			}
		}
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	if len(p.listed) > fleetv1alpha1.MaxListedPendingDeletions {
		p.listed = p.listed[:fleetv1alpha1.MaxListedPendingDeletions]
	}
	return p
}

func (p pendingDeletions) equal(st fleetv1alpha1.MemberClusterStatus) bool {
	return st.PendingDeletionCount == p.count && st.HeldDeletionCount == p.held &&
		equality.Semantic.DeepEqual(st.PendingDeletions, p.listed)
}

func (p pendingDeletions) set(mc *fleetv1alpha1.MemberCluster) {
	mc.Status.PendingDeletions, mc.Status.PendingDeletionCount, mc.Status.HeldDeletionCount = p.listed, p.count, p.held
}
