package inventory

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/internal/fence"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
)

// A cluster whose hub lease another installation with this hub's ID holds
// is listed fenced: its client refuses writes, the metric says 0, the
// subscribers hear of it. Taking the lease over (--take-over-spoke-leases)
// makes it writable again, and says so the same ways; a cluster without a
// lease is fenced only until the first renewal creates it.
func TestTheLeaseFencesWrites(t *testing.T) {
	ctx := context.Background()
	key := fence.LeaseKey("hub-1")
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("uid-b/fleetinfer-system"), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))}}
	inv := New(Options{Hub: fakeapi.New().Client, Namespace: registrations, Log: testr.New(t),
		Lease: fence.Options{HubID: "hub-1", Holder: "uid-a/fleetinfer-system", Duration: 40 * time.Second}})
	events := inv.Subscribe(10)
	api := newAPIServer(t)
	east, _ := engage(t, inv, "east", api.URL)
	fresh, _ := engage(t, inv, "fresh", api.URL)
	if err := east.client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	drain(events)
	write := func(c Cluster) error {
		return c.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm-" + time.Now().Format("150405.000000000")}})
	}
	if c := snapshot(t, inv, "fresh"); c.Fence.Reason != fleetv1alpha1.ReasonHubLeaseNotAcquired || !fence.IsNotHeld(write(c)) {
		t.Fatalf("before the first renewal: fence %+v, want writes refused until the lease is acquired", c.Fence)
	}

	inv.renewLeases(ctx)
	c := snapshot(t, inv, "east")
	if c.Writable() || c.Fence.Reason != fleetv1alpha1.ReasonHeldByAnotherHub || !fence.IsNotHeld(write(c)) {
		t.Errorf("held by another hub: writable %v, fence %+v; want writes refused", c.Writable(), c.Fence)
	}
	if !c.Available() {
		t.Error("a fenced cluster is listed unavailable; it is only not this hub's to write")
	}
	if c := snapshot(t, inv, "fresh"); !c.Writable() || write(c) != nil {
		t.Errorf("a cluster without a lease: writable %v after the first renewal, fence %+v", c.Writable(), c.Fence)
	}
	if got := testutil.ToFloat64(leaseHeld.WithLabelValues("east")); got != 0 {
		t.Errorf("fleetinfer_hub_spoke_lease_held{cluster=east} = %v, want 0", got)
	}
	if got := drain(events); !got["east"] || !got["fresh"] {
		t.Errorf("subscribers heard of %v, want east and fresh", got)
	}

	inv.opts.Lease.TakeOver = true
	inv.renewLeases(ctx)
	if c := snapshot(t, inv, "east"); !c.Writable() || write(c) != nil {
		t.Errorf("after taking over: writable %v, fence %+v", c.Writable(), c.Fence)
	}
	l := &coordinationv1.Lease{}
	if err := fresh.reader.Get(ctx, key, l); err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != "uid-a/fleetinfer-system" {
		t.Errorf("fresh's lease %+v (%v), want it this hub's", l.Spec, err)
	}
	if got := testutil.ToFloat64(leaseHeld.WithLabelValues("east")); got != 1 {
		t.Errorf("fleetinfer_hub_spoke_lease_held{cluster=east} = %v, want 1", got)
	}
	if got := drain(events); !got["east"] || got["fresh"] {
		t.Errorf("subscribers heard of %v, want east only", got)
	}
}

// drain is the set of cluster names the subscription received so far.
func drain(ch <-chan string) map[string]bool {
	out := map[string]bool{}
	for {
		select {
		case n := <-ch:
			out[n] = true
		default:
			return out
		}
	}
}
