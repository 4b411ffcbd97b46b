package distribute

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// protect puts the deletion protection label on obj, or takes it off.
func protect(obj client.Object, on bool) {
	l := obj.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	delete(l, fleetv1alpha1.DeletionProtectedLabel)
	if on {
		l[fleetv1alpha1.DeletionProtectedLabel] = fleetv1alpha1.DeletionProtectedAlways
	}
	obj.SetLabels(l)
}

// relabel reads a hub object back and sets or removes its protection.
func (f *fleet) relabel(obj client.Object, on bool) {
	f.t.Helper()
	ctx := context.Background()
	if err := f.Hub.API.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		f.t.Fatal(err)
	}
	protect(obj, on)
	if err := f.Hub.API.Update(ctx, obj); err != nil {
		f.t.Fatal(err)
	}
}

// eventsWith are the Events recorded so far whose text starts with prefix.
func (f *fleet) eventsWith(prefix string) []string {
	var out []string
	for _, e := range f.Events.Drain() {
		if strings.HasPrefix(e, prefix) {
			out = append(out, e)
		}
	}
	return out
}

// A deleted hub service that carries the protection, itself or through
// the placement that selects it, keeps every copy: the finalizer holds it,
// CopiesDeleted and one Warning Event say why and name the label. Removing
// the label lets the deletion proceed at once. The copies carry the label
// while the service is protected.
func TestAProtectedServiceKeepsItsCopiesUntilTheLabelIsRemoved(t *testing.T) {
	for _, tc := range []struct {
		name    string
		on      func(svc, pl client.Object) client.Object // what carries the label
		inEvent string
	}{
		{"the service is labelled", func(svc, _ client.Object) client.Object { return svc }, "the service carries"},
		{"its placement is labelled", func(_, pl client.Object) client.Object { return pl }, "InferencePlacement gpus carries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := placementOf(fleetv1alpha1.Duplicated, "a", "b")
			f := runningFleet(t, gpus)
			f.relabel(tc.on(f.hubService("llama"), gpus), true)
			f.reconcile("llama")
			for _, cl := range []string{"a", "b"} {
				if cp := f.copyIn(cl, "llama"); cp == nil || !fleetv1alpha1.IsDeletionProtected(cp) {
					t.Fatalf("%s's copy does not carry the protection: %+v", cl, cp)
				}
			}
			f.Events.Drain()
			if err := f.Hub.API.Delete(context.Background(), f.hubService("llama")); err != nil {
				t.Fatal(err)
			}
			f.reconcile("llama")
			f.reconcile("llama")
			f.kept("deleted while protected", "a", "llama", 2)
			f.kept("deleted while protected", "b", "llama", 2)
			c := f.hubService("llama").Status.GetCondition(CopiesDeleted)
			if c == nil || c.Status != corev1.ConditionFalse || c.Reason != ReasonDeletionProtected ||
				!strings.Contains(c.Message, tc.inEvent) || !strings.Contains(c.Message, fleetv1alpha1.DeletionProtectedLabel) {
				t.Errorf("CopiesDeleted is %+v, want False/%s naming what carries %s", c, ReasonDeletionProtected, fleetv1alpha1.DeletionProtectedLabel)
			}
			if ev := f.eventsWith("Warning " + ReasonDeletionProtected); len(ev) != 1 || !strings.Contains(ev[0], tc.inEvent) {
				t.Errorf("Events %q, want one Warning %s saying %q", ev, ReasonDeletionProtected, tc.inEvent)
			}

			f.relabel(tc.on(f.hubService("llama"), gpus), false)
			f.reconcile("llama")
			for _, cl := range []string{"a", "b"} {
				if f.copyIn(cl, "llama") != nil {
					t.Errorf("%s keeps its copy after the protection was removed", cl)
				}
			}
			err := f.Hub.API.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "llama"}, &v1alpha2.LLMInferenceService{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("the hub service is still there (%v) after the protection was removed", err)
			}
		})
	}
}

// A protection that held a deleted service for longer than the patience
// with refusing spokes leaves that patience whole once it is lifted.
func TestLiftingAProtectionRestartsThePatienceWithRefusingSpokes(t *testing.T) {
	svc := service("llama", 1)
	svc.Finalizers = []string{Finalizer}
	svc.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-FinalizePatience - time.Hour)}
	svc.Status.Conditions = []v1alpha2.Condition{{Type: CopiesDeleted, Status: corev1.ConditionFalse, Reason: ReasonDeletionProtected}}
	f := newFleet(t, []client.Object{svc, placementOf(fleetv1alpha1.Duplicated, "a")},
		map[string][]client.Object{"a": {hubCopy("llama", 1)}})
	f.Spoke("a").Inject(refusing)
	f.reconcile("llama")
	held := f.hubService("llama")
	if c := held.Status.GetCondition(CopiesDeleted); c == nil || c.Reason != ReasonProtectionLifted {
		t.Errorf("CopiesDeleted is %+v, want reason %s", c, ReasonProtectionLifted)
	}
	if f.copyIn("a", "llama") == nil {
		t.Error("the copy the spoke refused to delete is gone")
	}
}

// The orphan collector never deletes a copy that carries the protection,
// however long it has been an orphan; it counts it as held, lists it in
// the cluster's MemberCluster, and deletes it at once when the label goes
// from the copy.
func TestTheOrphanCollectorNeverDeletesAProtectedCopy(t *testing.T) {
	kept, gone := hubCopy("kept", 1), hubCopy("gone", 1)
	kept.UID, gone.UID = "uid-kept", "uid-gone" // the hub remembers deletions by UID
	protect(kept, true)
	member := &fleetv1alpha1.MemberCluster{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	f := newFleet(t, []client.Object{member}, map[string][]client.Object{"a": {kept, gone}})
	f.r.opts.OrphanGrace = time.Minute
	gc := f.r.OrphanCollector(time.Hour)
	a := inventory.Cluster{Name: "a", Client: f.Spoke("a").Client}
	t0 := time.Now()
	gc.collect(context.Background(), a, t0)
	gc.collect(context.Background(), a, t0.Add(48*time.Hour))
	if f.copyIn("a", "kept") == nil {
		t.Fatal("the orphan collector deleted a protected copy")
	}
	if f.copyIn("a", "gone") != nil {
		t.Error("an unprotected orphan outlived its grace period")
	}
	if held, due := testutil.ToFloat64(deletionsHeld.WithLabelValues("a")), testutil.ToFloat64(orphansPending.WithLabelValues("a")); held != 1 || due != 0 {
		t.Errorf("fleetinfer_hub_copies_deletion_held = %v, fleetinfer_hub_orphans_pending_deletion = %v, want 1 and 0", held, due)
	}
	if _, ok := gc.nextDue(map[string]bool{"a": true}); ok {
		t.Error("a sweep is due for a held orphan")
	}
	st := f.member("a").Status
	if st.HeldDeletionCount != 1 || st.PendingDeletionCount != 0 || len(st.PendingDeletions) != 1 ||
		!st.PendingDeletions[0].Held || st.PendingDeletions[0].DeleteAfter != nil {
		t.Errorf("MemberCluster status %+v, want the protected copy listed as held, with no deleteAfter", st)
	}

	cp := f.copyIn("a", "kept")
	protect(cp, false)
	if err := f.Spoke("a").API.Update(context.Background(), cp); err != nil {
		t.Fatal(err)
	}
	gc.collect(context.Background(), a, t0.Add(48*time.Hour+time.Second))
	if f.copyIn("a", "kept") != nil {
		t.Error("an orphan long past its grace stays after its protection was removed")
	}
}

// member reads a MemberCluster from the hub.
func (f *fleet) member(name string) *fleetv1alpha1.MemberCluster {
	f.t.Helper()
	mc := &fleetv1alpha1.MemberCluster{}
	if err := f.Hub.API.Get(context.Background(), client.ObjectKey{Name: name}, mc); err != nil {
		f.t.Fatal(err)
	}
	return mc
}

// A cluster's MemberCluster lists its pending deletions, soonest first, at
// most MaxListedPendingDeletions with the count of all, each with when it
// goes; a sweep that finds nothing new writes nothing.
func TestTheMemberClusterListsWhatTheCollectorWillDeleteAndWhen(t *testing.T) {
	n := fleetv1alpha1.MaxListedPendingDeletions + 5
	spoke := []client.Object{}
	for i := range n {
		cp := hubCopy(fmt.Sprintf("orphan-%02d", i), 1)
		cp.UID = types.UID(fmt.Sprintf("uid-%d", i))
		spoke = append(spoke, cp)
	}
	f := newFleet(t, []client.Object{&fleetv1alpha1.MemberCluster{ObjectMeta: metav1.ObjectMeta{Name: "a"}}}, map[string][]client.Object{"a": spoke})
	f.r.opts.OrphanGrace = DefaultOrphanGrace
	gc := f.r.OrphanCollector(time.Hour)
	a := inventory.Cluster{Name: "a", Client: f.Spoke("a").Client}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	gc.orphans = map[string]map[copyRef]orphan{"a": {{ns, "orphan-07", "uid-7"}: {since: t0.Add(-time.Minute)}}}
	gc.collect(context.Background(), a, t0)

	st := f.member("a").Status
	if st.PendingDeletionCount != int32(n) || len(st.PendingDeletions) != fleetv1alpha1.MaxListedPendingDeletions {
		t.Fatalf("pendingDeletionCount %d with %d listed, want %d with %d", st.PendingDeletionCount, len(st.PendingDeletions),
			n, fleetv1alpha1.MaxListedPendingDeletions)
	}
	first, second := st.PendingDeletions[0], st.PendingDeletions[1]
	if first.Name != "orphan-07" || !first.DeleteAfter.Time.Equal(t0.Add(DefaultOrphanGrace-time.Minute)) {
		t.Errorf("first listed %s deleteAfter %v, want the oldest orphan, orphan-07, at %v", first.Name, first.DeleteAfter, t0.Add(59*time.Minute))
	}
	if second.Name != "orphan-00" || !second.DeleteAfter.Time.Equal(t0.Add(time.Hour)) || !second.OrphanedSince.Time.Equal(t0) {
		t.Errorf("second listed %+v, want orphan-00 orphaned at %v, deleted after %v", second, t0, t0.Add(time.Hour))
	}
	rv := f.member("a").ResourceVersion
	gc.collect(context.Background(), a, t0.Add(30*time.Second))
	if got := f.member("a").ResourceVersion; got != rv {
		t.Errorf("a sweep that found the same orphans wrote the MemberCluster (resourceVersion %s → %s)", rv, got)
	}
}
