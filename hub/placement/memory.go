package placement

import (
	"slices"
	"strconv"
	"strings"

	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

// Legacy status annotations holding the decision memory. A hub object that
// has them and no status.placement is read as if it had the typed form, so
// the hub keeps the decision in force instead of deciding again and moving
// replicas; Record drops them once the typed form is written.
const (
	legacyInputsAnnotation     = "fleet.fleetinfer.io/placement-inputs"
	legacyUnplacedAnnotation   = "fleet.fleetinfer.io/unplaced-replicas"
	legacyFailedOverAnnotation = "fleet.fleetinfer.io/failed-over"
)

// InForce returns a copy of the decision memory of the service: its
// status.placement, else the same read from the legacy status annotations;
// nil when it has neither.
func InForce(st *v1alpha2.LLMInferenceServiceStatus) *v1alpha2.PlacementStatus {
	if st.Placement != nil {
		return st.Placement.DeepCopy()
	}
	a := st.Annotations
	hash, unplaced, failed := a[legacyInputsAnnotation], a[legacyUnplacedAnnotation], a[legacyFailedOverAnnotation]
	if hash == "" && unplaced == "" && failed == "" {
		return nil
	}
	p := &v1alpha2.PlacementStatus{InputsHash: hash}
	if n, err := strconv.Atoi(unplaced); err == nil {
		p.UnplacedReplicas = int32(n)
	}
	if failed != "" {
		p.FailedOverClusters = strings.Split(failed, ",")
		slices.Sort(p.FailedOverClusters)
	}
	return p
}

// Record sets the service's decision memory to p (none when nil) and drops
// the legacy annotations it replaces.
func Record(st *v1alpha2.LLMInferenceServiceStatus, p *v1alpha2.PlacementStatus) {
	st.Placement = p
	for _, k := range []string{legacyInputsAnnotation, legacyUnplacedAnnotation, legacyFailedOverAnnotation} {
		delete(st.Annotations, k)
	}
	if len(st.Annotations) == 0 {
		st.Annotations = nil
	}
}
