package llmisvc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// NotOwnedError means an object the service would manage already exists and
// belongs to something else. The controller never takes it over.
type NotOwnedError struct {
	Kind, Name string
}

func (e *NotOwnedError) Error() string {
	return fmt.Sprintf("%s %s exists and is not controlled by this LLMInferenceService; rename or delete it", e.Kind, e.Name)
}

// syncFunc brings cur towards want and reports whether it changed anything.
// stale is true when want differs from what the controller last applied
// (a removed field or list entry, which comparing against cur cannot see);
// otherwise sync still reverts drift in the fields want sets.
type syncFunc[T client.Object] func(cur, want T, stale bool) bool

// hashAnnotation records a digest of what the controller last applied.
const hashAnnotation = "fleetinfer.io/applied-hash"

// ensure creates want, or updates the existing object through sync, as the
// service's controlled child. Unchanged objects cost no write.
func ensure[T client.Object](ctx context.Context, r *Reconciler, owner client.Object, want T, sync syncFunc[T]) error {
	_, err := ensureObserved(ctx, r, owner, want, sync)
	return err
}

// ensureObserved is ensure for a child whose status the service reports: it
// returns the child as this reconcile left it, the API server's answer when
// it wrote and the cached object otherwise. Reading the cache again after a
// write can return the object from before it, whose status describes the
// previous spec: a Deployment just given a new pod template would still look
// rolled out, and the service would turn Ready on its old pods.
func ensureObserved[T client.Object](ctx context.Context, r *Reconciler, owner client.Object, want T, sync syncFunc[T]) (T, error) {
	var none T
	kind := kindOf(r, want)
	hash, err := appliedHash(want)
	if err != nil {
		return none, err
	}
	ann := want.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[hashAnnotation] = hash
	want.SetAnnotations(ann)
	if want.GetNamespace() != "" {
		if err := controllerutil.SetControllerReference(owner, want, r.Scheme()); err != nil {
			return none, err
		}
	}
	cur := reflect.New(reflect.TypeOf(want).Elem()).Interface().(T)
	err = r.Get(ctx, client.ObjectKeyFromObject(want), cur)
	if apierrors.IsNotFound(err) {
		if err := r.Create(ctx, want); err != nil {
			return none, fmt.Errorf("create %s %s: %w", kind, want.GetName(), err)
		}
		r.recorder.Eventf(owner, corev1.EventTypeNormal, "Created", "Created %s %s", kind, want.GetName())
		return want, nil
	}
	if err != nil {
		return none, err
	}
	if !ownedBy(cur, owner) {
		return none, &NotOwnedError{Kind: kind, Name: want.GetName()}
	}
	stale := cur.GetAnnotations()[hashAnnotation] != hash
	changed := mergeMeta(cur, want)
	if sync(cur, want, stale) || changed {
		if err := r.Update(ctx, cur); err != nil {
			return none, fmt.Errorf("update %s %s: %w", kind, want.GetName(), err)
		}
		r.recorder.Eventf(owner, corev1.EventTypeNormal, "Updated", "Updated %s %s", kind, want.GetName())
	}
	return cur, nil
}

// remove deletes obj if it exists and the service controls it; objects of
// others are left alone.
func remove[T client.Object](ctx context.Context, r *Reconciler, owner client.Object, obj T) error {
	kind := kindOf(r, obj)
	cur := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(T)
	if err := r.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !ownedBy(cur, owner) || cur.GetDeletionTimestamp() != nil {
		return nil
	}
	if err := r.Delete(ctx, cur, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.recorder.Eventf(owner, corev1.EventTypeNormal, "Deleted", "Deleted %s %s", kind, obj.GetName())
	return nil
}

// ownedBy reports whether obj is the owner's child: a controller reference
// for namespaced objects, the owner labels for cluster-scoped ones (which
// cannot carry an owner reference to a namespaced object).
func ownedBy(obj client.Object, owner client.Object) bool {
	if obj.GetNamespace() == "" {
		l := obj.GetLabels()
		return l[v1alpha2.LabelName] == owner.GetName() && l[ownerNamespaceLabel] == owner.GetNamespace()
	}
	return metav1.IsControlledBy(obj, owner)
}

const ownerNamespaceLabel = "serving.kserve.io/llminferenceservice-namespace"

// mergeMeta adds want's labels and annotations to cur, keeping others'.
func mergeMeta(cur, want client.Object) bool {
	changed := false
	for _, f := range []struct {
		get func() map[string]string
		set func(map[string]string)
		w   map[string]string
	}{
		{cur.GetLabels, cur.SetLabels, want.GetLabels()},
		{cur.GetAnnotations, cur.SetAnnotations, want.GetAnnotations()},
	} {
		m := f.get()
		for k, v := range f.w {
			if old, ok := m[k]; !ok || old != v {
				if m == nil {
					m = map[string]string{}
				}
				m[k] = v
				changed = true
			}
		}
		f.set(m)
	}
	return changed
}

// derivedEqual reports whether cur already has every field want sets;
// fields the API server defaulted in cur do not count as differences.
func derivedEqual(want, cur any) bool { return equality.Semantic.DeepDerivative(want, cur) }

// appliedHash digests the object as the controller wants it, metadata
// other than labels and annotations left out.
func appliedHash(obj client.Object) (string, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	if meta, ok := m["metadata"].(map[string]any); ok {
		m["metadata"] = map[string]any{"labels": meta["labels"], "annotations": meta["annotations"]}
	}
	delete(m, "status")
	b, err = json.Marshal(m)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

func kindOf(r *Reconciler, obj client.Object) string {
	gvk, err := apiutil.GVKForObject(obj, r.Scheme())
	if err != nil {
		return reflect.TypeOf(obj).Elem().Name()
	}
	return gvk.Kind
}

// notObserved marks a condition False when the state behind it (a child, or
// the pods of a LeaderWorkerSet's groups) could not be read: an absent
// sub-condition would count as met in WorkloadsReady or RouterReady. A
// NotFound is a cache that has not seen an object yet, which the watch on
// it ends; any other error is returned for a retry.
func notObserved(svc *v1alpha2.LLMInferenceService, cond v1alpha2.ConditionType, kind, name string, err error) error {
	if apierrors.IsNotFound(err) {
		svc.Status.MarkFalse(cond, "Creating", "%s %s was created and is not observed yet", kind, name)
		return nil
	}
	svc.Status.MarkFalse(cond, "ReadFailed", "%s %s: %v", kind, name, err)
	return err
}
