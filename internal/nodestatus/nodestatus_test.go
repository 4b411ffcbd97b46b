package nodestatus

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestReadyIsTheReadyConditionTrue(t *testing.T) {
	cond := func(typ corev1.NodeConditionType, s corev1.ConditionStatus) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: s}
	}
	for _, tc := range []struct {
		name  string
		conds []corev1.NodeCondition
		want  bool
	}{
		{"no conditions", nil, false},
		{"Ready True", []corev1.NodeCondition{cond(corev1.NodeMemoryPressure, corev1.ConditionFalse), cond(corev1.NodeReady, corev1.ConditionTrue)}, true},
		{"Ready False", []corev1.NodeCondition{cond(corev1.NodeReady, corev1.ConditionFalse)}, false},
		{"Ready Unknown, as the node lifecycle controller sets it", []corev1.NodeCondition{cond(corev1.NodeReady, corev1.ConditionUnknown)}, false},
		{"other conditions only", []corev1.NodeCondition{cond(corev1.NodeDiskPressure, corev1.ConditionTrue)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Ready(&corev1.Node{Status: corev1.NodeStatus{Conditions: tc.conds}}); got != tc.want {
				t.Fatalf("Ready = %v, want %v", got, tc.want)
			}
		})
	}
}
