package fence

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

const (
	me    = "uid-a/fleetinfer-system"
	other = "uid-b/fleetinfer-system"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func opts() Options { return Options{HubID: "hub-1", Holder: me, Duration: 40 * time.Second} }

// lease is the hub-1 lease held by holder, renewed at renewed.
func lease(holder string, renewed time.Time) *coordinationv1.Lease {
	k := LeaseKey("hub-1")
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(renewed)), LeaseTransitions: ptr.To[int32](3)}}
}

func TestKeep(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "x", errors.New("no"))
	for _, tc := range []struct {
		name     string
		lease    *coordinationv1.Lease
		o        func(*Options)
		prev     State
		now      time.Time
		getErr   error
		writeErr error
		// held, holder and transitions are what Keep should leave.
		held        bool
		holder      string
		transitions int32
		reason      string
	}{
		{name: "no lease: created", now: t0, held: true, holder: me, transitions: 0},
		{name: "ours: renewed", lease: lease(me, t0), now: t0.Add(10 * time.Second), held: true, holder: me, transitions: 3},
		{name: "ours after a leader change: renewed at once", lease: lease(me, t0.Add(-time.Hour)), now: t0, held: true, holder: me, transitions: 3},
		{name: "another's, first seen: stand by", lease: lease(other, t0.Add(-time.Hour)), now: t0,
			holder: other, transitions: 3, reason: ReasonHeldByAnotherHub},
		{name: "another's, unchanged for its duration: taken", lease: lease(other, t0), now: t0.Add(40 * time.Second),
			prev: State{}.observe(lease(other, t0), t0), held: true, holder: me, transitions: 4},
		{name: "another's, renewed since: stand by", lease: lease(other, t0.Add(30*time.Second)), now: t0.Add(40 * time.Second),
			prev: State{}.observe(lease(other, t0), t0), holder: other, transitions: 3, reason: ReasonHeldByAnotherHub},
		{name: "another's, take over: taken at once", lease: lease(other, t0), now: t0, o: func(o *Options) { o.TakeOver = true },
			held: true, holder: me, transitions: 4},
		{name: "no holder: taken", lease: lease("", t0), now: t0, held: true, holder: me, transitions: 4},
		{name: "unreadable and never held: fenced, says how to fix", now: t0, getErr: forbidden, reason: ReasonNotAcquired},
		{name: "unreadable while held: the hold runs out", lease: lease(me, t0), now: t0.Add(20 * time.Second), getErr: errors.New("timeout"),
			prev: State{HeldUntil: t0.Add(40 * time.Second), Holder: me}, held: true, holder: me, transitions: 3},
		{name: "unreadable past the hold: fenced", lease: lease(me, t0), now: t0.Add(41 * time.Second), getErr: errors.New("timeout"),
			prev: State{HeldUntil: t0.Add(40 * time.Second), Holder: me}, holder: me, transitions: 3, reason: ReasonNotAcquired},
		{name: "taken by another in between: not held", lease: lease(other, t0), now: t0.Add(time.Minute),
			prev: State{}.observe(lease(other, t0), t0), writeErr: apierrors.NewConflict(schema.GroupResource{}, "x", errors.New("changed")),
			holder: other, transitions: 3, reason: ReasonHeldByAnotherHub},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts()
			if tc.o != nil {
				tc.o(&o)
			}
			b := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
					if tc.getErr != nil {
						return tc.getErr
					}
					return c.Get(ctx, key, obj)
				},
				Update: func(ctx context.Context, c client.WithWatch, obj client.Object, _ ...client.UpdateOption) error {
					if tc.writeErr != nil {
						return tc.writeErr
					}
					return c.Update(ctx, obj)
				},
			})
			if tc.lease != nil {
				b = b.WithObjects(tc.lease)
			}
			c := b.Build()
			got := Keep(context.Background(), c, c, o, tc.prev, tc.now)
			if got.Held(tc.now) != tc.held {
				t.Errorf("held = %v, want %v (state %+v)", got.Held(tc.now), tc.held, got)
			}
			if f := got.Fence(o, tc.now); f.Reason != tc.reason {
				t.Errorf("fence %+v, want reason %q", f, tc.reason)
			}
			if tc.getErr != nil {
				return
			}
			l := &coordinationv1.Lease{}
			if err := c.Get(context.Background(), LeaseKey("hub-1"), l); err != nil {
				t.Fatal(err)
			}
			if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != tc.holder || got.Holder != tc.holder {
				t.Errorf("holder in the lease %q, in the state %q, want %q", h, got.Holder, tc.holder)
			}
			if n := ptr.Deref(l.Spec.LeaseTransitions, -1); n != tc.transitions {
				t.Errorf("transitions = %d, want %d", n, tc.transitions)
			}
		})
	}
}

// A hub ID is a label value; the lease is named after it when that makes a
// valid name, after its hash otherwise.
func TestLeaseKey(t *testing.T) {
	for id, want := range map[string]string{
		"0f6c2b0e-5a4b-4f8e-9a53-6f3e5d1c2b7a": "fleetinfer-hub-0f6c2b0e-5a4b-4f8e-9a53-6f3e5d1c2b7a",
		"prod":                                 "fleetinfer-hub-prod",
		"Prod_EU":                              "fleetinfer-hub-",
	} {
		got := LeaseKey(id)
		if got.Namespace != "fleetinfer-hub" || !strings.HasPrefix(got.Name, want) || (want == "fleetinfer-hub-" && len(got.Name) != len(want)+16) {
			t.Errorf("LeaseKey(%q) = %s, want %s…", id, got, want)
		}
	}
}

// The message of a cluster held by another installation names the holder
// and the lease, and what to do.
func TestFenceSaysWhy(t *testing.T) {
	f := State{Holder: other}.Fence(opts(), t0)
	for _, want := range []string{other, "fleetinfer-hub/fleetinfer-hub-hub-1", "--take-over-spoke-leases", "stands by"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message %q lacks %q", f.Message, want)
		}
	}
}
