// Package statuspatch writes an object's status as a merge patch.
package statuspatch

import (
	"context"
	"reflect"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Write reads the latest object named like obj, has set give it the
// status wanted, and sends the difference as a merge patch of the status
// subresource guarded by the resourceVersion, retrying on conflicts. A
// patch carries only what changed: an update carries the whole object,
// and a user's spec may be as large as the API server allows (1.5 MiB by
// default), which would cost the API server a second per status write. An
// object that is gone is not an error.
func Write[T client.Object](ctx context.Context, c client.Client, obj T, set func(T)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(T)
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
			return client.IgnoreNotFound(err)
		}
		patch := client.MergeFromWithOptions(cur.DeepCopyObject().(T), client.MergeFromWithOptimisticLock{})
		set(cur)
		return c.Status().Patch(ctx, cur, patch)
	})
}
