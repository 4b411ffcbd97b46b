package llmisvc

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

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
