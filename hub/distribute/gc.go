package distribute

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

var (
	orphansPending = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_hub_orphans_pending_deletion",
		Help: "Copies in a cluster that no hub service accounts for, waiting out the grace period before the orphan collector deletes them.",
	}, []string{"cluster"})
	deletionsHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_hub_copies_deletion_held",
		Help: "Copies in a cluster that no hub service accounts for and that the orphan collector keeps because they carry the deletion protection label (fleet.fleetinfer.io/deletion-protected: Always).",
	}, []string{"cluster"})
)

func init() { ctrlmetrics.Registry.MustRegister(orphansPending, deletionsHeld) }

// OrphanCollector deletes what this hub left in spokes that no hub object
// accounts for any more: copies of services deleted while their cluster was
// unreachable, and copied configs no copy references. It runs periodically
// and whenever a cluster joins or recovers (as MultiKueue's garbage
// collector does for remote objects after an outage).
//
// It touches only objects that carry this hub's ID, so hubs sharing spokes
// leave each other's copies alone, and a copy is deleted only once it has
// been an orphan for the grace period: a hub service deleted and recreated,
// or a hub restored from a backup a little behind, gets its copy back
// before anything stops. A copy carrying the deletion protection is never
// deleted here (it is held). What is pending, and until when, is written to
// each cluster's MemberCluster status and counted in the metrics.
type OrphanCollector struct {
	hub       client.Client
	inv       *inventory.Inventory
	interval  time.Duration
	grace     time.Duration
	timeout   time.Duration // per cluster sweep
	deletions *deletions

	// orphans holds, per cluster, the copies the last sweep found orphaned.
	// Only Start's loop touches it.
	orphans map[string]map[copyRef]orphan
}

// orphan is a copy whose hub service is gone: since when the collector
// knows it, and whether its deletion protection holds it.
type orphan struct {
	since time.Time
	held  bool
}

// Start runs the collector until ctx ends: every interval, when clusters
// change, and when the first pending orphan's grace period ends, so that
// an orphan goes at the end of its grace rather than up to an interval
// later.
func (g *OrphanCollector) Start(ctx context.Context) error {
	changes := g.inv.Subscribe(16)
	t := time.NewTicker(g.interval)
	defer t.Stop()
	due := time.NewTimer(g.interval)
	defer due.Stop()
	swept := map[string]bool{}
	for {
		if next, ok := g.nextDue(swept); ok {
			due.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-changes:
		case <-due.C:
		}
		clear(swept)
		for _, c := range g.inv.Clusters(ctx) {
			// A fenced cluster is another hub's to write: no orphan of it
			// is timed or counted until this hub holds its lease again.
			if c.Writable() {
				cctx, cancel := context.WithTimeout(ctx, g.timeout)
				g.collect(cctx, c, time.Now())
				cancel()
				swept[c.Name] = true
			}
		}
	}
}

func (g *OrphanCollector) collect(ctx context.Context, c inventory.Cluster, now time.Time) {
	ours := client.MatchingLabels(fleetv1alpha1.OwnedByHubLabels(g.deletions.hubID))
	var copies v1alpha2.LLMInferenceServiceList
	if err := c.Client.List(ctx, &copies, ours); err != nil {
		return
	}
	orphaned, referenced := g.sweep(ctx, c, copies.Items, now)
	if g.orphans == nil {
		g.orphans = map[string]map[copyRef]orphan{}
	}
	g.orphans[c.Name] = orphaned
	g.report(ctx, c.Name, orphaned)
	var configs v1alpha2.LLMInferenceServiceConfigList
	if err := c.Client.List(ctx, &configs, ours); err != nil {
		return
	}
	for i := range configs.Items {
		cfg := &configs.Items[i]
		if !referenced[cfg.Namespace+"/"+cfg.Name] && cfg.DeletionTimestamp.IsZero() {
			_ = client.IgnoreNotFound(c.Client.Delete(ctx, cfg))
		}
	}
}

// sweep deletes the copies whose grace period has ended and returns the
// orphans left, and the configs (namespace/name) the copies still there
// reference.
func (g *OrphanCollector) sweep(ctx context.Context, c inventory.Cluster, copies []v1alpha2.LLMInferenceService, now time.Time) (map[copyRef]orphan, map[string]bool) {
	before := g.orphans[c.Name]
	orphaned := map[copyRef]orphan{}
	referenced := map[string]bool{}
	for _, cp := range copies {
		ref := copyRef{cp.Namespace, cp.Name, cp.UID}
		hub := &v1alpha2.LLMInferenceService{}
		switch err := g.hub.Get(ctx, client.ObjectKeyFromObject(&cp), hub); {
		case apierrors.IsNotFound(err):
			o, ok := before[ref]
			if !ok {
				o.since = now
			}
			// The label is read from the copy each time: removing it there
			// lets a long-held orphan go at once.
			o.held = fleetv1alpha1.IsDeletionProtected(&cp)
			if !o.held && now.Sub(o.since) >= g.grace {
				_ = g.deletions.deleteCopy(ctx, c, cp.Namespace, cp.Name)
				continue
			}
			orphaned[ref] = o
		case err != nil:
			// Unknown: neither an orphan nor proof of a live service; an
			// orphan keeps its time.
			if o, ok := before[ref]; ok {
				orphaned[ref] = o
			}
		}
		for _, ref := range cp.Spec.BaseRefs {
			referenced[cp.Namespace+"/"+ref.Name] = true
		}
	}
	return orphaned, referenced
}

// nextDue is when the first orphan found in the swept clusters ends its
// grace period; false when none is pending (held orphans never are). An unavailable cluster's
// orphans keep their time but wait for the cluster, not the timer (which
// would fire at once, over and over, once their grace has passed).
func (g *OrphanCollector) nextDue(swept map[string]bool) (time.Time, bool) {
	var next time.Time
	for cluster, orphans := range g.orphans {
		if !swept[cluster] {
			continue
		}
		for _, o := range orphans {
			if o.held {
				continue
			}
			if due := o.since.Add(g.grace); next.IsZero() || due.Before(next) {
				next = due
			}
		}
	}
	return next, !next.IsZero()
}

// copyRef names one copy; a copy deleted and made again is another.
type copyRef struct {
	namespace, name string
	uid             types.UID
}

// NeedLeaderElection: only the elected hub deletes.
func (g *OrphanCollector) NeedLeaderElection() bool { return true }
