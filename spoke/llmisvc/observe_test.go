package llmisvc

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// A child whose state cannot be read is not ready: an absent sub-condition
// would count as met when WorkloadsReady or RouterReady rolls them up, and
// the service would turn Ready before its LeaderWorkerSet had a pod or its
// HTTPRoute existed.
func TestChildNotObservedIsNotReady(t *testing.T) {
	children := []struct {
		kind     string
		cond     v1alpha2.ConditionType
		rollUp   v1alpha2.ConditionType
		subConds []v1alpha2.ConditionType
	}{
		{"LeaderWorkerSet", v1alpha2.WorkerWorkloadReady, v1alpha2.WorkloadsReady, v1alpha2.WorkloadSubConditions},
		{"HTTPRoute", v1alpha2.HTTPRoutesReady, v1alpha2.RouterReady, v1alpha2.RouterSubConditions},
		{"InferencePool", v1alpha2.InferencePoolReady, v1alpha2.RouterReady, v1alpha2.RouterSubConditions},
	}
	errs := []struct {
		name       string
		err        error
		wantReason string
		wantErr    bool
	}{
		{"just created, not in the cache yet", apierrors.NewNotFound(schema.GroupResource{Resource: "children"}, "x"), "Creating", false},
		{"read failed", errors.New("connection refused"), "ReadFailed", true},
	}
	for _, ch := range children {
		for _, tc := range errs {
			t.Run(ch.kind+"/"+tc.name, func(t *testing.T) {
				svc := &v1alpha2.LLMInferenceService{}
				err := notObserved(svc, ch.cond, ch.kind, "x", tc.err)
				if (err != nil) != tc.wantErr {
					t.Fatalf("error %v, want one: %v", err, tc.wantErr)
				}
				c := svc.Status.GetCondition(ch.cond)
				if c == nil || c.Status != corev1.ConditionFalse || c.Reason != tc.wantReason {
					t.Fatalf("condition %+v, want False/%s", c, tc.wantReason)
				}
				svc.Status.Aggregate(ch.rollUp, ch.subConds)
				if svc.Status.IsTrue(ch.rollUp) {
					t.Fatalf("%s is True while the %s is not observed", ch.rollUp, ch.kind)
				}
			})
		}
	}
}

// A reconcile that gives the Deployment a new pod template judges readiness
// on the Deployment it wrote, not on a cache that has not seen the write:
// the cached copy still reports the previous template rolled out, and
// reporting Ready on it lets the hub's Progressive rollout count the
// cluster healthy and carry a change to the next one before a single pod
// runs it.
func TestAServiceIsNotReadyOnADeploymentTheCacheShowsFromBeforeItsUpdate(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha2.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// The fake store plays the API server's generation rule (a spec change
	// increments metadata.generation); lagging plays an informer that has
	// not yet delivered this reconcile's writes.
	var lagging *appsv1.Deployment
	store := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if d, ok := obj.(*appsv1.Deployment); ok && lagging != nil {
				lagging.DeepCopyInto(d)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			obj.SetGeneration(1)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if d, ok := obj.(*appsv1.Deployment); ok {
				stored := &appsv1.Deployment{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(d), stored); err != nil {
					return err
				}
				if !equality.Semantic.DeepEqual(stored.Spec, d.Spec) {
					d.Generation = stored.Generation + 1
				}
			}
			return c.Update(ctx, obj, opts...)
		},
	}).WithStatusSubresource(&appsv1.Deployment{}).Build()
	r := &Reconciler{Client: store, recorder: record.NewFakeRecorder(100)}

	svc := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Name: "staged", Namespace: "ns", UID: "uid-1", Generation: 1}}
	svc.Spec.Template = &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "vllm/vllm-openai:v0.11.0"}}}
	main := parts(svc, &svc.Spec)[0]
	reconcile := func() *v1alpha2.Condition {
		t.Helper()
		svc.Status.Workloads = &v1alpha2.WorkloadStatus{}
		if err := r.reconcileDeployment(ctx, svc, &svc.Spec, main, true, false); err != nil {
			t.Fatal(err)
		}
		return svc.Status.GetCondition(main.singleCond)
	}
	reconcile()
	d := &appsv1.Deployment{}
	if err := store.Get(ctx, client.ObjectKey{Namespace: "ns", Name: main.deploymentName}, d); err != nil {
		t.Fatal(err)
	}
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1,
		Conditions: []appsv1.DeploymentCondition{{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}}}
	if err := store.Status().Update(ctx, d); err != nil {
		t.Fatal(err)
	}
	if c := reconcile(); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("the first version rolled out, but %s is %+v", main.singleCond, c)
	}

	lagging = d.DeepCopy()
	svc.Generation = 2
	svc.Spec.Template.Containers[0].Image = "example.com/mystery:1.0"
	c := reconcile()
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != "RolloutPending" {
		t.Fatalf("%s after changing the image is %+v, want False/RolloutPending", main.singleCond, c)
	}
}
