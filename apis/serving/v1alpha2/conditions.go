package v1alpha2

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionType names a condition.
type ConditionType string

// Condition types, with the exact strings KServe uses. Ready is true when
// PresetsCombined, WorkloadsReady and RouterReady are; each of the last two
// aggregates the sub-conditions below it.
const (
	Ready           ConditionType = "Ready"
	PresetsCombined ConditionType = "PresetsCombined"
	WorkloadsReady  ConditionType = "WorkloadsReady"
	RouterReady     ConditionType = "RouterReady"

	MainWorkloadReady          ConditionType = "MainWorkloadReady"
	WorkerWorkloadReady        ConditionType = "WorkerWorkloadReady"
	PrefillWorkloadReady       ConditionType = "PrefillWorkloadReady"
	PrefillWorkerWorkloadReady ConditionType = "PrefillWorkerWorkloadReady"

	GatewaysReady          ConditionType = "GatewaysReady"
	HTTPRoutesReady        ConditionType = "HTTPRoutesReady"
	InferencePoolReady     ConditionType = "InferencePoolReady"
	SchedulerWorkloadReady ConditionType = "SchedulerWorkloadReady"

	// FieldsNotActedOn lists accepted fields fleetinfer keeps but does not
	// act on yet. Informational: it never blocks Ready.
	FieldsNotActedOn ConditionType = "FieldsNotActedOn"
)

// WorkloadSubConditions roll up into WorkloadsReady.
var WorkloadSubConditions = []ConditionType{MainWorkloadReady, WorkerWorkloadReady, PrefillWorkloadReady, PrefillWorkerWorkloadReady}

// RouterSubConditions roll up into RouterReady.
var RouterSubConditions = []ConditionType{GatewaysReady, HTTPRoutesReady, InferencePoolReady, SchedulerWorkloadReady}

// ReadyDependents roll up into Ready.
var ReadyDependents = []ConditionType{PresetsCombined, WorkloadsReady, RouterReady}

// ConditionSeverity of a condition that is not True; empty means Error.
type ConditionSeverity string

// Severities, as in Knative.
const (
	ConditionSeverityError   ConditionSeverity = ""
	ConditionSeverityWarning ConditionSeverity = "Warning"
	ConditionSeverityInfo    ConditionSeverity = "Info"
)

// Condition is a condition in the Knative duck-type wire format.
type Condition struct {
	Type   ConditionType          `json:"type"`
	Status corev1.ConditionStatus `json:"status"`
	// +optional
	Severity ConditionSeverity `json:"severity,omitempty"`
	// +optional
	// +kubebuilder:validation:Type=string
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitempty"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}

// Conditions is a set of conditions, one per type.
type Conditions []Condition

// GetCondition returns the condition of type t, or nil.
func (s *Status) GetCondition(t ConditionType) *Condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			return &s.Conditions[i]
		}
	}
	return nil
}

// IsTrue reports whether condition t is True.
func (s *Status) IsTrue(t ConditionType) bool {
	c := s.GetCondition(t)
	return c != nil && c.Status == corev1.ConditionTrue
}

// SetCondition adds or replaces a condition, keeping its transition time
// when the status does not change.
func (s *Status) SetCondition(c Condition) {
	if old := s.GetCondition(c.Type); old != nil {
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.Now()
		}
		*old = c
		return
	}
	c.LastTransitionTime = metav1.Now()
	s.Conditions = append(s.Conditions, c)
}

// MarkTrue sets condition t True.
func (s *Status) MarkTrue(t ConditionType) {
	s.SetCondition(Condition{Type: t, Status: corev1.ConditionTrue})
}

// MarkFalse sets condition t False with a reason and message.
func (s *Status) MarkFalse(t ConditionType, reason, format string, args ...any) {
	s.SetCondition(Condition{Type: t, Status: corev1.ConditionFalse, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// MarkUnknown sets condition t Unknown with a reason and message.
func (s *Status) MarkUnknown(t ConditionType, reason, format string, args ...any) {
	s.SetCondition(Condition{Type: t, Status: corev1.ConditionUnknown, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// ClearCondition removes condition t.
func (s *Status) ClearCondition(t ConditionType) {
	out := s.Conditions[:0]
	for _, c := range s.Conditions {
		if c.Type != t {
			out = append(out, c)
		}
	}
	s.Conditions = out
}

// Aggregate sets target from its sub-conditions: False with the reason of
// the first False one, else Unknown with the first Unknown one's, else True.
// Absent sub-conditions do not count; with none present target is True.
func (s *Status) Aggregate(target ConditionType, subs []ConditionType) {
	var unknown *Condition
	for _, t := range subs {
		c := s.GetCondition(t)
		switch {
		case c == nil:
		case c.Status == corev1.ConditionFalse:
			s.MarkFalse(target, c.Reason, "%s", c.Message)
			return
		case c.Status != corev1.ConditionTrue && unknown == nil:
			unknown = c
		}
	}
	if unknown != nil {
		s.MarkUnknown(target, unknown.Reason, "%s", unknown.Message)
		return
	}
	s.MarkTrue(target)
}
