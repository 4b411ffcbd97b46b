package llmisvc

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

func TestChildNameStaysAValidLabelAndUnique(t *testing.T) {
	long := strings.Repeat("a", 70)
	cases := []struct{ parent, suffix, want string }{
		{"opt", "-kserve", "opt-kserve"},
		{strings.Repeat("a", 56), "-kserve", strings.Repeat("a", 56) + "-kserve"},
	}
	for _, c := range cases {
		if got := childName(c.parent, c.suffix); got != c.want {
			t.Errorf("childName(%q, %q) = %q, want %q", c.parent, c.suffix, got, c.want)
		}
	}
	a, b := childName(long+"x", "-kserve-workload-svc"), childName(long+"y", "-kserve-workload-svc")
	if len(a) > 63 || a == b || !strings.HasSuffix(a, "-kserve-workload-svc") {
		t.Errorf("long names: %q (%d) and %q", a, len(a), b)
	}
}

func TestPresetsFollowTheServiceShape(t *testing.T) {
	r := &Reconciler{opts: Options{PresetPrefix: "kserve-"}}
	worker := &corev1.PodSpec{}
	dp := &v1alpha2.ParallelismSpec{Data: ptr.To(int32(4)), DataLocal: ptr.To(int32(2))}
	pp := &v1alpha2.ParallelismSpec{Pipeline: ptr.To(int32(2))}
	cases := []struct {
		name string
		spec v1alpha2.LLMInferenceServiceSpec
		want string
	}{
		{"single node", v1alpha2.LLMInferenceServiceSpec{}, "kserve-config-llm-template"},
		{"scheduler and route", v1alpha2.LLMInferenceServiceSpec{Router: &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{}, Route: &v1alpha2.GatewayRoutesSpec{}}},
			"kserve-config-llm-scheduler kserve-config-llm-router-route kserve-config-llm-template"},
		{"pool ref needs no scheduler preset", v1alpha2.LLMInferenceServiceSpec{Router: &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{Pool: &v1alpha2.InferencePoolSpec{Ref: &corev1.LocalObjectReference{Name: "p"}}}}},
			"kserve-config-llm-template"},
		{"route refs need no route preset", v1alpha2.LLMInferenceServiceSpec{Router: &v1alpha2.RouterSpec{Route: &v1alpha2.GatewayRoutesSpec{HTTP: &v1alpha2.HTTPRouteSpec{Refs: []corev1.LocalObjectReference{{Name: "r"}}}}}},
			"kserve-config-llm-template"},
		{"data parallel", v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Worker: worker, Parallelism: dp}}, "kserve-config-llm-worker-data-parallel"},
		{"pipeline parallel", v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Worker: worker, Parallelism: pp}}, "kserve-config-llm-worker-pipeline-parallel"},
		{"disaggregated", v1alpha2.LLMInferenceServiceSpec{Prefill: &v1alpha2.WorkloadSpec{}}, "kserve-config-llm-prefill-template kserve-config-llm-decode-template"},
		{"disaggregated multi-node", v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Worker: worker, Parallelism: dp}, Prefill: &v1alpha2.WorkloadSpec{Worker: worker, Parallelism: pp}},
			"kserve-config-llm-prefill-worker-pipeline-parallel kserve-config-llm-decode-worker-data-parallel"},
	}
	for _, c := range cases {
		if got := strings.Join(r.presetsFor(&c.spec), " "); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// A Deployment rolling out a new pod template is not ready while old pods
// remain, though they keep it Available: the service does not run its
// current spec yet.
func TestADeploymentIsReadyOnlyOnceItsCurrentTemplateRunsEveryReplica(t *testing.T) {
	available := appsv1.DeploymentCondition{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}
	stalled := appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse,
		Reason: "ProgressDeadlineExceeded", Message: "ReplicaSet has timed out progressing"}
	cases := []struct {
		name                   string
		replicas, total, fresh int32
		conds                  []appsv1.DeploymentCondition
		want                   string // the condition's reason, "" for True
	}{
		{"rolled out", 2, 2, 2, []appsv1.DeploymentCondition{available}, ""},
		{"a new pod surged next to the old one", 1, 2, 1, []appsv1.DeploymentCondition{available}, "RolloutInProgress"},
		{"half the replicas updated", 2, 2, 1, []appsv1.DeploymentCondition{available}, "RolloutInProgress"},
		{"scaling up the current template", 3, 3, 3, []appsv1.DeploymentCondition{available}, ""},
		{"the rollout's deadline passed", 1, 2, 1, []appsv1.DeploymentCondition{available, stalled}, "ProgressDeadlineExceeded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := &appsv1.Deployment{Spec: appsv1.DeploymentSpec{Replicas: ptr.To(c.replicas)},
				Status: appsv1.DeploymentStatus{Replicas: c.total, UpdatedReplicas: c.fresh, Conditions: c.conds}}
			st := &v1alpha2.Status{}
			deploymentReadiness(st, v1alpha2.MainWorkloadReady, d)
			got := st.GetCondition(v1alpha2.MainWorkloadReady)
			if (c.want == "") != (got.Status == corev1.ConditionTrue) || (c.want != "" && got.Reason != c.want) {
				t.Errorf("condition %+v, want reason %q", got, c.want)
			}
		})
	}
}

// A single picker is surged and the old one stays until the new one is
// Ready; leader-elected pickers (only the leader is Ready) may all go at
// once, or the new ones could never take the lease.
func TestThePickerRollsWithoutAGapWhereItCan(t *testing.T) {
	cases := []struct {
		replicas                 int32
		maxSurge, maxUnavailable string
	}{{1, "1", "0"}, {3, "1", "100%"}}
	for _, c := range cases {
		s := pickerRollout(c.replicas)
		if s.Type != appsv1.RollingUpdateDeploymentStrategyType || s.RollingUpdate == nil ||
			s.RollingUpdate.MaxSurge.String() != c.maxSurge || s.RollingUpdate.MaxUnavailable.String() != c.maxUnavailable {
			t.Errorf("%d replicas: strategy %+v, want RollingUpdate maxSurge %s maxUnavailable %s", c.replicas, s, c.maxSurge, c.maxUnavailable)
		}
	}
}
