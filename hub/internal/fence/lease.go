// Package fence keeps two hubs that share an ID from both writing to a
// spoke, as MultiKueue's identity-guarded remote client keeps two managers
// apart. A hub writes into a spoke only while it holds the Lease named
// after its hub ID there (Keep acquires and renews it); Guard wraps the
// spoke's client so every write checks that first. The holder is the hub
// installation, not the process: a new leader among one hub's replicas
// holds the lease at once, while another installation given the same
// --hub-id (a restored hub whose old one still runs) finds it held, writes
// nothing and says why, until the lease expires or it is told to take it
// over.
package fence

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// Reasons a cluster is fenced (Fence.Reason), also those of the
// MemberCluster's HubLeaseHeld condition.
const (
	ReasonHeldByAnotherHub = fleetv1alpha1.ReasonHeldByAnotherHub
	ReasonNotAcquired      = fleetv1alpha1.ReasonHubLeaseNotAcquired
)

// Options say which lease a hub keeps, as whom, and how.
type Options struct {
	// HubID names the lease (LeaseKey).
	HubID string
	// Holder is this hub installation (the lease's holderIdentity).
	Holder string
	// Duration is how long a lease lasts without renewal.
	Duration time.Duration
	// TakeOver takes a lease another installation holds without waiting
	// for it to expire.
	TakeOver bool
}

// LeaseKey is the Lease of the hub with this ID in a spoke, in the hub's
// own namespace there. The ID is a label value, which may hold what a name
// may not (capitals, '_'): such IDs are named by their hash.
func LeaseKey(hubID string) client.ObjectKey {
	name := "fleetinfer-hub-" + hubID
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		sum := sha256.Sum256([]byte(hubID))
		name = "fleetinfer-hub-" + hex.EncodeToString(sum[:8])
	}
	return client.ObjectKey{Namespace: fleetv1alpha1.HubServiceAccountNamespace, Name: name}
}

// State is what a hub knows of its lease in one cluster.
type State struct {
	// HeldUntil is when this hub's hold ends unless renewed: the start of
	// its last successful renewal plus the duration, so that it stops
	// writing before another hub can find the lease expired. Zero when
	// not held.
	HeldUntil time.Time
	// Holder is the holder the lease named when last read.
	Holder string
	// Err is why the last attempt failed; the hold stands until HeldUntil.
	Err error
	// seen is the holder's renewal as last read, seenAt when this hub
	// first read it: another holder's lease expires a duration after it
	// stopped changing, by this hub's clock, as client-go's leader
	// election judges it, so that the hubs' clocks need not agree.
	seen   string
	seenAt time.Time
}

// Held reports whether this hub may write at now.
func (s State) Held(now time.Time) bool { return now.Before(s.HeldUntil) }

// Keep acquires or renews the lease, reading it through r (past any cache:
// the hub may read leases only in its own namespace) and writing through w
// (which the fence must not guard), and returns the new state. A lease this installation holds is
// renewed; one another holds is taken once it has expired, or at once with
// TakeOver; a missing one is created.
func Keep(ctx context.Context, r client.Reader, w client.Writer, o Options, prev State, now time.Time) State {
	key := LeaseKey(o.HubID)
	l := &coordinationv1.Lease{}
	if err := r.Get(ctx, key, l); apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels: fleetv1alpha1.OwnedByHubLabels(o.HubID)},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(o.Holder), AcquireTime: ptr.To(metav1.NewMicroTime(now)),
				LeaseTransitions: ptr.To[int32](0)}}
		hold(l, o, now)
		return prev.after(w.Create(ctx, l), l, o, now)
	} else if err != nil {
		prev.Err = err
		return prev
	}
	next := prev.observe(l, now)
	next.Holder = ptr.Deref(l.Spec.HolderIdentity, "")
	if next.Holder != o.Holder && !o.TakeOver && !next.expired(l, o, now) {
		next.HeldUntil, next.Err = time.Time{}, nil
		return next
	}
	if next.Holder != o.Holder {
		next.HeldUntil = time.Time{} // whatever happens, it was not this hub's
	}
	hold(l, o, now)
	return next.after(w.Update(ctx, l), l, o, now)
}

// hold makes l this installation's, renewed at now; taking it from another
// holder is a transition.
func hold(l *coordinationv1.Lease, o Options, now time.Time) {
	t := metav1.NewMicroTime(now)
	if ptr.Deref(l.Spec.HolderIdentity, "") != o.Holder {
		l.Spec.HolderIdentity, l.Spec.AcquireTime = ptr.To(o.Holder), &t
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &t, ptr.To(int32(o.Duration.Seconds()))
}

// after is the state once the write of l (held by this installation since
// now) returned err: held for a duration from now, or as before.
func (s State) after(err error, l *coordinationv1.Lease, o Options, now time.Time) State {
	if err != nil {
		s.Err = err
		return s
	}
	s = s.observe(l, now)
	s.HeldUntil, s.Holder, s.Err = now.Add(o.Duration), o.Holder, nil
	return s
}

// observe records l's holder and renewal, and since when they are as read.
func (s State) observe(l *coordinationv1.Lease, now time.Time) State {
	seen := fmt.Sprintf("%s@%v", ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.RenewTime)
	if seen != s.seen {
		s.seen, s.seenAt = seen, now
	}
	return s
}

// expired reports whether l's holder let it lapse: no holder, or no
// renewal seen for the duration it declares (o's when it declares none).
func (s State) expired(l *coordinationv1.Lease, o Options, now time.Time) bool {
	if ptr.Deref(l.Spec.HolderIdentity, "") == "" {
		return true
	}
	d := o.Duration
	if secs := ptr.Deref(l.Spec.LeaseDurationSeconds, 0); secs > 0 {
		d = time.Duration(secs) * time.Second
	}
	return !now.Before(s.seenAt.Add(d))
}

// Fence is what s refuses, said for an operator: nothing while the lease
// is held; otherwise who holds it, or why it could not be acquired, and
// what to do.
func (s State) Fence(o Options, now time.Time) Fence {
	key := LeaseKey(o.HubID)
	switch {
	case s.Held(now):
		return Fence{}
	case s.Holder != "" && s.Holder != o.Holder:
		return Fence{Reason: ReasonHeldByAnotherHub, Message: fmt.Sprintf("the Lease %s in this cluster is held by hub installation %q, "+
			"another hub with this hub's ID %q: this hub writes nothing here and stands by. Stop that hub and its lease expires "+
			"within %s, or run this hub with --take-over-spoke-leases to retire it", key, s.Holder, o.HubID, o.Duration)}
	case apierrors.IsForbidden(s.Err):
		return Fence{Reason: ReasonNotAcquired, Message: fmt.Sprintf("the hub may not keep its Lease %s in this cluster, so it writes "+
			"nothing here; apply deploy/hub/spoke-access to the cluster again (register-spoke.sh): %v", key, s.Err)}
	case s.Err != nil:
		return Fence{Reason: ReasonNotAcquired, Message: fmt.Sprintf("the hub could not renew its Lease %s in this cluster, so it writes nothing here: %v", key, s.Err)}
	default:
		return Fence{Reason: ReasonNotAcquired, Message: fmt.Sprintf("the hub has not acquired its Lease %s in this cluster yet", key)}
	}
}
