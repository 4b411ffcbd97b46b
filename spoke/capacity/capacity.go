// Package capacity publishes the cluster's accelerator capacity in the
// ClusterCapacity object the hub reads, as internal/nodecapacity counts it
// from the nodes and the unfinished pods bound to them.
package capacity

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/nodecapacity"
)

// Reconciler keeps the ClusterCapacity current.
type Reconciler struct {
	client.Client
}

// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=clustercapacities,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=fleet.fleetinfer.io,resources=clustercapacities/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes;pods,verbs=get;list;watch

// Reconcile recomputes the capacity from the cache and writes it if it
// changed. Every node or pod event maps to the one ClusterCapacity, so a
// burst of events costs one recomputation.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return ctrl.Result{}, err
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods); err != nil {
		return ctrl.Result{}, err
	}
	want := nodecapacity.Compute(nodes.Items, pods.Items)
	return ctrl.Result{}, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cc := &fleetv1alpha1.ClusterCapacity{}
		err := r.Get(ctx, client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}, cc)
		if apierrors.IsNotFound(err) {
			cc.Name = fleetv1alpha1.ClusterCapacityName
			if err := r.Create(ctx, cc); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		want.UpdateTime = cc.Status.UpdateTime
		if equality.Semantic.DeepEqual(cc.Status, want) {
			return nil
		}
		want.UpdateTime = metav1.NewTime(time.Now())
		cc.Status = want
		return r.Status().Update(ctx, cc)
	})
}

var singleton = reconcile.Request{NamespacedName: client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	toSingleton := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{singleton}
	})
	// Only a pod's node, phase and requests matter; label and status churn
	// of running pods does not.
	podChanged := predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
			return o.Spec.NodeName != n.Spec.NodeName || o.Status.Phase != n.Status.Phase
		},
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("clustercapacity").
		For(&fleetv1alpha1.ClusterCapacity{}).
		Watches(&corev1.Node{}, toSingleton).
		Watches(&corev1.Pod{}, toSingleton, builder.WithPredicates(podChanged)).
		Complete(r)
}

// CacheOptions keep the cache small at 10k pods: only bound, unfinished
// pods, stripped to the fields the computation reads.
func CacheOptions() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Pod{}: {
			Field: fields.AndSelectors(
				fields.OneTermNotEqualSelector("spec.nodeName", ""),
				fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
				fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
			),
			Transform: stripPod,
		},
	}
}

// stripPod keeps what Compute and the watch predicate read.
func stripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{
		TypeMeta:   p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, Overhead: p.Spec.Overhead},
		Status:     corev1.PodStatus{Phase: p.Status.Phase},
	}
	slim.Spec.Containers = slimContainers(p.Spec.Containers)
	slim.Spec.InitContainers = slimContainers(p.Spec.InitContainers)
	return slim, nil
}

func slimContainers(cs []corev1.Container) []corev1.Container {
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy,
			Resources: corev1.ResourceRequirements{Requests: c.Resources.Requests}}
	}
	return out
}
