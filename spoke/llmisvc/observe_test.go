package llmisvc

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// A workload whose state cannot be read is not ready: an absent
// sub-condition would count as met when WorkloadsReady rolls them up, and
// the service would turn Ready before its LeaderWorkerSet had a pod.
func TestWorkloadNotObservedIsNotReady(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantReason string
		wantErr    bool
	}{
		{"just created, not in the cache yet", apierrors.NewNotFound(schema.GroupResource{Group: "leaderworkerset.x-k8s.io", Resource: "leaderworkersets"}, "x"), "Creating", false},
		{"read failed", errors.New("connection refused"), "ReadFailed", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := &v1alpha2.LLMInferenceService{}
			err := notObserved(svc, v1alpha2.WorkerWorkloadReady, "LeaderWorkerSet", "x", tc.err)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
			c := svc.Status.GetCondition(v1alpha2.WorkerWorkloadReady)
			if c == nil || c.Status != corev1.ConditionFalse || c.Reason != tc.wantReason {
				t.Fatalf("condition %+v, want False/%s", c, tc.wantReason)
			}
			svc.Status.Aggregate(v1alpha2.WorkloadsReady, v1alpha2.WorkloadSubConditions)
			if svc.Status.IsTrue(v1alpha2.WorkloadsReady) {
				t.Fatal("WorkloadsReady is True while the workload is not observed")
			}
		})
	}
}
