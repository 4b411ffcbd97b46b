package distribute

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// Deletion protection (fleetv1alpha1.DeletionProtectedLabel). A mistaken
// delete of a hub service, of its namespace or of the CRD would otherwise
// take the service off every cluster at once; with the label on the
// service, or on an InferencePlacement that selects it, the finalizer holds
// the deleted service and its copies run on until the label is removed.
// The label travels with the copies, so that the orphan collector, which
// sees only the spokes once the hub object is gone (a hub restored without
// it), keeps them too.

// CopiesDeleted is the condition of a deleted hub service whose copies are
// kept: False with ReasonDeletionProtected while the protection holds it.
const CopiesDeleted v1alpha2.ConditionType = "CopiesDeleted"

// ReasonDeletionProtected is the reason of CopiesDeleted, and of the
// Warning Event, while deletion protection holds a deleted hub service.
const ReasonDeletionProtected = "DeletionProtected"

// byService is deletionProtection's answer for a service's own label.
const byService = "the service"

// deletionProtection names what protects svc from deletion: the service's
// own label, or the InferencePlacements that select it and carry the label
// (whether or not exactly one selects it: any of them protects). It is ""
// when nothing does.
func deletionProtection(ctx context.Context, hub client.Reader, svc *v1alpha2.LLMInferenceService) (string, error) {
	if fleetv1alpha1.IsDeletionProtected(svc) {
		return byService, nil
	}
	var list fleetv1alpha1.InferencePlacementList
	if err := hub.List(ctx, &list, client.InNamespace(svc.Namespace)); err != nil {
		return "", fmt.Errorf("reading the InferencePlacements for deletion protection: %w", err)
	}
	var names []string
	for i := range list.Items {
		if p := &list.Items[i]; fleetv1alpha1.IsDeletionProtected(p) && placement.Selects(p, svc) {
			names = append(names, p.Name)
		}
	}
	if len(names) == 0 {
		return "", nil
	}
	sort.Strings(names)
	return "InferencePlacement " + strings.Join(names, ", "), nil
}

// markProtected puts the deletion protection on a copy of a service that a
// placement protects; a service's own label is already on its copies.
func markProtected(cp *v1alpha2.LLMInferenceService, protected bool) {
	if protected {
		cp.Labels[fleetv1alpha1.DeletionProtectedLabel] = fleetv1alpha1.DeletionProtectedAlways
	}
}

// holdDeletion keeps a deleted, protected service and its copies: it says
// so in CopiesDeleted and, when the hold begins, in a Warning Event. The
// service is looked at again when the label goes, from the service or the
// placement, through their watches.
func (r *Reconciler) holdDeletion(ctx context.Context, svc *v1alpha2.LLMInferenceService, by string) error {
	before := svc.Status.DeepCopy()
	remove := fmt.Sprintf("kubectl label llminferenceservice -n %s %s %s-", svc.Namespace, svc.Name, fleetv1alpha1.DeletionProtectedLabel)
	if by != byService {
		remove = fmt.Sprintf("remove label %s from %s", fleetv1alpha1.DeletionProtectedLabel, by)
	}
	msg := fmt.Sprintf("deletion held: %s carries %s=%s, so the copies in %s keep running; to delete them: %s",
		by, fleetv1alpha1.DeletionProtectedLabel, fleetv1alpha1.DeletionProtectedAlways, clustersOf(svc), remove)
	svc.Status.SetCondition(*condition(CopiesDeleted, corev1.ConditionFalse, ReasonDeletionProtected, msg))
	if err := r.writeStatus(ctx, svc, before); err != nil {
		return err
	}
	if was := before.GetCondition(CopiesDeleted); was == nil || was.Reason != ReasonDeletionProtected {
		r.recorder.Event(svc, corev1.EventTypeWarning, ReasonDeletionProtected, msg)
	}
	return nil
}

// ReasonProtectionLifted is the reason of CopiesDeleted once the protection
// that held a deleted service is removed and its copies are being deleted.
const ReasonProtectionLifted = "DeletionProtectionLifted"

// heldUntilNow says a protection held svc until this reconcile lifted it.
func heldUntilNow(svc *v1alpha2.LLMInferenceService) bool {
	c := svc.Status.GetCondition(CopiesDeleted)
	return c != nil && c.Reason == ReasonDeletionProtected
}

// liftHold records, when some copies could not be deleted at once, that
// the protection holding svc is gone: the patience with the spokes that
// refuse (deletingSince) starts now, however long the hold lasted. When
// every copy goes at once nothing needs recording: the service goes too.
func (r *Reconciler) liftHold(ctx context.Context, svc *v1alpha2.LLMInferenceService) error {
	before := svc.Status.DeepCopy()
	svc.Status.SetCondition(*condition(CopiesDeleted, corev1.ConditionUnknown, ReasonProtectionLifted,
		"deletion protection removed: deleting the copies"))
	return r.writeStatus(ctx, svc, before)
}

// deletingSince is when the hub began deleting svc's copies: when it was
// deleted, or when a protection that held it was lifted.
func deletingSince(svc *v1alpha2.LLMInferenceService) time.Time {
	since := svc.DeletionTimestamp.Time
	if c := svc.Status.GetCondition(CopiesDeleted); c != nil && c.Reason == ReasonProtectionLifted && c.LastTransitionTime.After(since) {
		since = c.LastTransitionTime.Time
	}
	return since
}

// clustersOf names the clusters the status lists a copy in.
func clustersOf(svc *v1alpha2.LLMInferenceService) string {
	var names []string
	for _, c := range svc.Status.Clusters {
		names = append(names, c.Name)
	}
	if len(names) == 0 {
		return "every cluster"
	}
	return strings.Join(names, ", ")
}
