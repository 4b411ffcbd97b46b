// Package spokewrite writes what the hub owns into a spoke, one way for
// every kind: an object is created when absent, left alone when the hub
// did not create it (fleetv1alpha1.IsOwnedByHub), and updated only when
// its content differs. Each caller says what its content is.
package spokewrite

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// Result says what a write did.
type Result int

const (
	Unchanged Result = iota
	Created
	Updated
)

// NotOursError is an object in the way of what the hub writes: it has the
// name, but this hub did not create it, so it is left as it is.
type NotOursError struct {
	// Object is the object the cluster holds.
	Object client.Object
}

func (e *NotOursError) Error() string {
	return fmt.Sprintf("%s/%s exists and was not created by this hub", e.Object.GetNamespace(), e.Object.GetName())
}

// Ensure makes the object named like want in c hold want's content. When
// it is absent, prepare (if not nil; the object's namespace, say) runs and
// want is created. When it exists and hubID owns it, update copies the
// content from want into cur and says whether that changed anything; only
// then is it written. Errors of the Get and the writes are returned as
// they are (a Create that races with another writer is AlreadyExists).
func Ensure[T client.Object](ctx context.Context, c client.Client, hubID string, want T, prepare func() error,
	update func(cur, want T) bool) (Result, error) {
	cur := want.DeepCopyObject().(T)
	err := c.Get(ctx, client.ObjectKeyFromObject(want), cur)
	if !apierrors.IsNotFound(err) {
		if err != nil {
			return Unchanged, err
		}
		return Update(ctx, c, hubID, cur, want, update)
	}
	if prepare != nil {
		if err := prepare(); err != nil {
			return Unchanged, err
		}
	}
	if err := c.Create(ctx, want); err != nil {
		return Unchanged, err
	}
	return Created, nil
}

// Update writes want's content over cur, the object c holds, as Ensure
// does: a *NotOursError when hubID does not own cur, nothing when update
// changes nothing.
func Update[T client.Object](ctx context.Context, c client.Client, hubID string, cur, want T, update func(cur, want T) bool) (Result, error) {
	if !fleetv1alpha1.IsOwnedByHub(cur, hubID) {
		return Unchanged, &NotOursError{Object: cur}
	}
	if !update(cur, want) {
		return Unchanged, nil
	}
	if err := c.Update(ctx, cur); err != nil {
		return Unchanged, err
	}
	return Updated, nil
}

// Namespace is the namespace the hub creates in a spoke. The hub never
// deletes namespaces: they may hold anything.
func Namespace(name, hubID string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: fleetv1alpha1.HubNamespaceLabels(hubID)}}
}

// NamespaceNotOursError is a spoke namespace the hub may not write into:
// it exists, this hub did not create it, and it does not opt in
// (fleetv1alpha1.HubMayWriteIn). Nothing is written there, and nothing is
// adopted: only the spoke's admin can let the hub in, with OptIn.
type NamespaceNotOursError struct {
	Namespace string
	HubID     string
}

func (e *NamespaceNotOursError) Error() string {
	return fmt.Sprintf("namespace %s exists and was not created by this hub; label it %s to let the hub write into it", e.Namespace, e.OptIn())
}

// OptIn is the label, key=value, that lets the hub into the namespace.
func (e *NamespaceNotOursError) OptIn() string {
	return fleetv1alpha1.AcceptsHubLabel + "=" + e.HubID
}

// NamespaceNotOurs is why the hub with this ID may not write into ns, or
// nil when it may.
func NamespaceNotOurs(ns *corev1.Namespace, hubID string) *NamespaceNotOursError {
	if fleetv1alpha1.HubMayWriteIn(ns, hubID) {
		return nil
	}
	return &NamespaceNotOursError{Namespace: ns.Name, HubID: hubID}
}

// EnsureNamespace creates the namespace name when it is missing, and
// otherwise returns a *NamespaceNotOursError unless the hub may write into
// it. A create that loses a race looks at the winner's namespace: the
// name alone says nothing about whose it is.
func EnsureNamespace(ctx context.Context, c client.Client, name, hubID string) error {
	ns := &corev1.Namespace{}
	err := c.Get(ctx, client.ObjectKey{Name: name}, ns)
	if apierrors.IsNotFound(err) {
		err = c.Create(ctx, Namespace(name, hubID))
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		err = c.Get(ctx, client.ObjectKey{Name: name}, ns)
	}
	if err != nil {
		return err
	}
	if notOurs := NamespaceNotOurs(ns, hubID); notOurs != nil {
		return notOurs
	}
	return nil
}
