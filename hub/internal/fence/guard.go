package fence

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Fence is why a hub may not write to a cluster; zero while it may.
type Fence struct {
	// Reason is a condition reason (ReasonHeldByAnotherHub,
	// ReasonNotAcquired).
	Reason string
	// Message says who holds the lease, and what to do.
	Message string
}

// Fenced reports whether the fence refuses writes.
func (f Fence) Fenced() bool { return f.Reason != "" }

// NotHeldError is a write to a cluster refused because this hub does not
// hold its hub lease there.
type NotHeldError struct {
	Cluster string
	Fence   Fence
}

func (e *NotHeldError) Error() string {
	return fmt.Sprintf("write to cluster %s refused (%s): %s", e.Cluster, e.Fence.Reason, e.Fence.Message)
}

// IsNotHeld reports whether err is, or wraps, a *NotHeldError.
func IsNotHeld(err error) bool {
	var nh *NotHeldError
	return errors.As(err, &nh)
}

// Guard wraps a cluster's client so that every write (create, update,
// patch, apply, delete, delete-all-of, and the same on subresources such as
// status) first asks fence, and is refused with a *NotHeldError while the
// cluster is fenced; reads pass. It is the one place the hub's writes to a
// spoke are fenced, so no controller can forget the check.
func Guard(c client.Client, cluster string, fence func() Fence) client.Client {
	return guarded{Client: c, check: func() error {
		if f := fence(); f.Fenced() {
			return &NotHeldError{Cluster: cluster, Fence: f}
		}
		return nil
	}}
}

type guarded struct {
	client.Client
	check check
}

func (g guarded) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return g.check.then(func() error { return g.Client.Create(ctx, obj, opts...) })
}

func (g guarded) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return g.check.then(func() error { return g.Client.Update(ctx, obj, opts...) })
}

func (g guarded) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return g.check.then(func() error { return g.Client.Patch(ctx, obj, patch, opts...) })
}

func (g guarded) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	return g.check.then(func() error { return g.Client.Apply(ctx, obj, opts...) })
}

func (g guarded) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return g.check.then(func() error { return g.Client.Delete(ctx, obj, opts...) })
}

func (g guarded) DeleteAllOf(ctx context.Context, obj client.Object, opts ...client.DeleteAllOfOption) error {
	return g.check.then(func() error { return g.Client.DeleteAllOf(ctx, obj, opts...) })
}

func (g guarded) Status() client.SubResourceWriter {
	return guardedWriter{SubResourceWriter: g.Client.Status(), check: g.check}
}

func (g guarded) SubResource(name string) client.SubResourceClient {
	sc := g.Client.SubResource(name)
	return struct {
		client.SubResourceReader
		client.SubResourceWriter
	}{sc, guardedWriter{SubResourceWriter: sc, check: g.check}}
}

// check refuses a write with a *NotHeldError, or lets it through (nil).
type check func() error

// then runs write unless the check refuses.
func (c check) then(write func() error) error {
	if err := c(); err != nil {
		return err
	}
	return write()
}

type guardedWriter struct {
	client.SubResourceWriter
	check check
}

func (w guardedWriter) Create(ctx context.Context, obj, sub client.Object, opts ...client.SubResourceCreateOption) error {
	return w.check.then(func() error { return w.SubResourceWriter.Create(ctx, obj, sub, opts...) })
}

func (w guardedWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	return w.check.then(func() error { return w.SubResourceWriter.Update(ctx, obj, opts...) })
}

func (w guardedWriter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	return w.check.then(func() error { return w.SubResourceWriter.Patch(ctx, obj, patch, opts...) })
}

func (w guardedWriter) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	return w.check.then(func() error { return w.SubResourceWriter.Apply(ctx, obj, opts...) })
}
