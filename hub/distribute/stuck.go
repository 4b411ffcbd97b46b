package distribute

import (
	"fmt"
	"slices"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Application-level failover. A chosen cluster's copy that is not Ready
// within the placement's ready timeout of the hub creating it or changing
// its spec (pods Pending for GPUs taken since the decision, an image that
// does not pull, a crash loop) is Stuck: decide leaves the cluster out of
// the eligible ones, so its replicas are placed elsewhere, and distribute's
// make-before-break keeps the stuck copy (with whatever it serves) until the
// replacements are Ready. When no other cluster can take its replicas,
// nothing moves and the status says so.
//
// The clock is the decision memory's (status.placement.copyClocks): one
// entry per chosen copy with the generation the hub asked for and when. It
// lives with the rest of the memory on the hub object, so a restarted hub or
// a new leader counts on from where the last one was, and it is written in
// the status update the reconcile makes anyway. An annotation on the copy
// would do too, but would have to be carried through every copy write (the
// hub writes a copy only when it differs) and read back from the spoke. A
// stuck cluster is eligible again when the
// placement or the service changes (a new generation of either: the fix, a
// new image or other clusters, is an edit), or, if its replicas could not
// move, as soon as its copy turns Ready. There is no timer that brings it
// back: trying again where a copy did not start would move replicas back and
// forth every timeout.

// stuckCopy is a cluster whose copy is Stuck, as report and events show it.
type stuckCopy struct {
	cluster string
	// message is the cluster entry's: why, and what happens to its
	// replicas.
	message string
	// event is the Stuck Event's message at a transition (the copy found
	// stuck while its replicas cannot move, or its replicas moving away);
	// empty otherwise.
	event string
	// found says the cluster turned Stuck in this reconcile.
	found bool
}

// readyTimeout is the placement's ready timeout, or the hub's default.
func (r *Reconciler) readyTimeout(pl *fleetv1alpha1.InferencePlacement) time.Duration {
	if s := pl.Spec.Failover.ReadyTimeoutSeconds; s != nil {
		return time.Duration(*s) * time.Second
	}
	return r.opts.withDefaults().DefaultReadyTimeout
}

// stuckNow returns the stuck clusters of the service, sorted: the ones
// remembered in prev that still are (the placement and the service have the
// same generations, and their copy is not Ready while the decision keeps
// them), and the clusters of the current decision whose copy's clock ran
// out.
func stuckNow(prev *v1alpha2.PlacementStatus, pl *fleetv1alpha1.InferencePlacement, svc *v1alpha2.LLMInferenceService,
	current decision, copies map[string]*observed, timeout time.Duration, now time.Time) []v1alpha2.StuckCluster {
	if prev == nil {
		return nil
	}
	readyHere := func(name string) bool {
		o := copies[name]
		return o != nil && o.err == nil && o.exists && o.ours && o.ready
	}
	var out []v1alpha2.StuckCluster
	for _, s := range prev.StuckClusters {
		if prev.PlacementName != pl.Name || s.PlacementGeneration != pl.Generation || s.ServiceGeneration != svc.Generation {
			continue
		}
		if _, chosen := current.want[s.Name]; chosen && readyHere(s.Name) {
			continue
		}
		out = append(out, s)
	}
	for _, c := range prev.CopyClocks {
		if c.Ready || now.Sub(c.AskedAt.Time) < timeout || isStuck(out, c.Cluster) {
			continue
		}
		if _, chosen := current.want[c.Cluster]; !chosen {
			continue
		}
		o := copies[c.Cluster]
		if o == nil || o.err != nil || !o.exists || !o.ours || o.terminating || o.ready || o.obj.Generation != c.Generation {
			continue
		}
		out = append(out, v1alpha2.StuckCluster{Name: c.Cluster, Since: metav1.NewTime(now),
			PlacementGeneration: pl.Generation, ServiceGeneration: svc.Generation})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func isStuck(stuck []v1alpha2.StuckCluster, name string) bool {
	return slices.ContainsFunc(stuck, func(s v1alpha2.StuckCluster) bool { return s.Name == name })
}

func stuckNames(stuck []v1alpha2.StuckCluster) []string {
	var out []string
	for _, s := range stuck {
		out = append(out, s.Name)
	}
	return out
}

// heldBack says that the next decision moves a stuck cluster's replicas
// nowhere: it leaves the cluster out but places fewer replicas than the
// decision in force. Then nothing moves.
func heldBack(stuck []v1alpha2.StuckCluster, current, next decision) bool {
	leaves := false
	for _, s := range stuck {
		_, was := current.want[s.Name]
		_, is := next.want[s.Name]
		leaves = leaves || (was && !is)
	}
	return leaves && placedReplicas(next.want) < placedReplicas(current.want)
}

func placedReplicas(want map[string]int32) int32 {
	var n int32
	for _, r := range want {
		n += r
	}
	return n
}

// describeStuck says, for each stuck cluster whose copy is still there (not
// being deleted) and not Ready, why it is stuck and what becomes of its
// replicas, going from the decision before to the one after (the same when
// nothing moves; then decided, the message of the decision made without
// the stuck clusters, says why their replicas found no other cluster).
// Clusters in previously are not newly found.
func describeStuck(stuck, previously []v1alpha2.StuckCluster, before, after decision, copies map[string]*observed,
	timeout time.Duration, decided string) []stuckCopy {
	var out []stuckCopy
	for _, s := range stuck {
		o := copies[s.Name]
		if o == nil || o.err != nil || !o.exists || !o.ours || o.terminating || o.ready {
			continue
		}
		problem := o.message
		if problem == "" {
			problem = "no condition of the copy says why"
		}
		why := fmt.Sprintf("not Ready within %s of the hub's last change to it (%s)", timeout, problem)
		sc := stuckCopy{cluster: s.Name, found: !isStuck(previously, s.Name)}
		_, was := before.want[s.Name]
		n, chosen := after.want[s.Name]
		switch {
		case chosen:
			sc.message = why + "; no other eligible cluster can take its replicas, so they stay"
			if sc.found {
				sc.event = fmt.Sprintf("Cluster %s: its copy is %s; no other eligible cluster can take its %d replicas (%s), so nothing moves",
					s.Name, why, n, decided)
			}
		default:
			sc.message = why + "; kept until its replicas are Ready elsewhere"
			if was {
				sc.event = fmt.Sprintf("Cluster %s: its copy is %s: its replicas move to %s; the stuck copy stays until they are Ready",
					s.Name, why, clusterNames(after.want))
			}
		}
		out = append(out, sc)
	}
	return out
}

// tickClocks returns the clocks of the chosen clusters' copies after this
// reconcile's writes: a copy the hub just created or whose spec it changed
// (asked), or that is seen at another generation or for the first time,
// starts a clock; a copy Ready at its clock's generation stops it for good.
// An unreadable cluster keeps its clock; clusters out of the decision have
// none.
func tickClocks(prev []v1alpha2.CopyClock, want map[string]int32, copies map[string]*observed, asked map[string]bool, now time.Time) []v1alpha2.CopyClock {
	var out []v1alpha2.CopyClock
	for name := range want {
		i := slices.IndexFunc(prev, func(c v1alpha2.CopyClock) bool { return c.Cluster == name })
		o := copies[name]
		switch {
		case o == nil || o.err != nil:
			if i >= 0 {
				out = append(out, prev[i])
			}
		case !o.exists || !o.ours:
			// Nothing of the hub's to time.
		case i < 0 || asked[name] || prev[i].Generation != o.obj.Generation:
			c := v1alpha2.CopyClock{Cluster: name, Generation: o.obj.Generation, AskedAt: metav1.NewTime(now), Ready: o.ready}
			if o.ready {
				c.ReadySince = ptr.To(metav1.NewTime(now))
			}
			out = append(out, c)
		default:
			c := prev[i]
			if o.ready && c.ReadySince == nil {
				c.ReadySince = ptr.To(metav1.NewTime(now))
			}
			c.Ready = c.Ready || o.ready
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Cluster < out[j].Cluster })
	return out
}

// untilFirstDeadline is how long until the first running clock runs out (0
// when none runs): no event comes when a copy stays Pending, so the service
// is looked at again then.
func untilFirstDeadline(clocks []v1alpha2.CopyClock, timeout time.Duration, now time.Time) time.Duration {
	if timeout <= 0 {
		return 0
	}
	var first time.Duration
	for _, c := range clocks {
		if c.Ready {
			continue
		}
		if left := c.AskedAt.Add(timeout).Sub(now) + 100*time.Millisecond; left > 0 && (first == 0 || left < first) {
			first = left
		}
	}
	return first
}

// stuckMessage is the message of cluster's entry when its copy is Stuck.
func stuckMessage(stuck []stuckCopy, cluster string) (string, bool) {
	for _, s := range stuck {
		if s.cluster == cluster {
			return s.message, true
		}
	}
	return "", false
}
