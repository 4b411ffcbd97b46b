package distribute

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/spokewrite"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// observed is what a cluster holds of a service.
type observed struct {
	exists        bool
	ours          bool // created by this hub (managed-by label)
	replicas      int32
	readyReplicas int32
	ready         bool
	// terminating: the copy is being deleted (by the hub or in the spoke):
	// whatever it reports, it is not what the service can count on.
	terminating bool
	url         string
	message     string
	obj         *v1alpha2.LLMInferenceService
	err         error // the cluster could not be read
	// notOurs: the service's namespace exists in the cluster but is
	// neither this hub's nor opted in to it; nothing is written there.
	notOurs *spokewrite.NamespaceNotOursError
}

// observe reads the service's copy in every available cluster, all at once,
// each under the cluster deadline: a cluster whose cache has not synced, or
// that does not answer, is unreadable for this reconcile.
func (r *Reconciler) observe(ctx context.Context, svc *v1alpha2.LLMInferenceService, clusters []inventory.Cluster) map[string]*observed {
	out := make(map[string]*observed, len(clusters))
	for _, c := range clusters {
		out[c.Name] = &observed{}
	}
	var wg sync.WaitGroup
	for _, c := range clusters {
		o := out[c.Name]
		if !c.Available() {
			o.err = errors.New(c.Reason)
			continue
		}
		wg.Go(func() { r.observeIn(ctx, c, svc, o) })
	}
	wg.Wait()
	return out
}

func (r *Reconciler) observeIn(ctx context.Context, c inventory.Cluster, svc *v1alpha2.LLMInferenceService, o *observed) {
	ns := &corev1.Namespace{}
	err := r.inCluster(ctx, func(ctx context.Context) error { return c.Client.Get(ctx, client.ObjectKey{Name: svc.Namespace}, ns) })
	switch {
	case err == nil:
		o.notOurs = spokewrite.NamespaceNotOurs(ns, r.opts.HubID)
	case !apierrors.IsNotFound(err):
		o.err = err
		return
	}
	cp := &v1alpha2.LLMInferenceService{}
	err = r.inCluster(ctx, func(ctx context.Context) error { return c.Client.Get(ctx, client.ObjectKeyFromObject(svc), cp) })
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		o.err = err
		return
	}
	o.exists, o.obj = true, cp
	o.ours = fleetv1alpha1.IsOwnedByHub(cp, r.opts.HubID)
	o.replicas = ptr.Deref(cp.Spec.Replicas, 1)
	if w := cp.Status.Workloads; w != nil && w.Primary != nil {
		o.readyReplicas = ptr.Deref(w.Primary.ReadyReplicas, 0)
	}
	o.terminating = !cp.DeletionTimestamp.IsZero()
	o.ready = cp.Status.IsTrue(v1alpha2.Ready) && cp.Status.ObservedGeneration == cp.Generation && !o.terminating
	o.url = ptr.Deref(cp.Status.URL, "")
	o.message = firstProblem(cp)
}

// firstProblem is the message of the copy's first False condition.
func firstProblem(s *v1alpha2.LLMInferenceService) string {
	for _, t := range append([]v1alpha2.ConditionType{v1alpha2.PresetsCombined}, append(append(v1alpha2.WorkloadSubConditions, v1alpha2.RouterSubConditions...), v1alpha2.Ready)...) {
		if c := s.Status.GetCondition(t); c != nil && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("%s: %s", t, c.Message)
		}
	}
	return ""
}

// distribute converges the copies on the decision, make-before-break: a
// cluster gains replicas at once, but loses them (or its copy) only once
// every cluster of the decision reports its full share ready, so moving a
// service never drops capacity first.
//
// A decision that keeps (decide could not place the service, or placed it
// nowhere, while it runs) writes nothing: every copy stays as it is.
//
// The clusters in hold keep the version their copy runs (a progressive
// rollout has not reached them, rollout.go); only their replicas follow
// the decision.
//
// It returns the clusters whose copy it created or gave a new spec: their
// ready timeout starts again (stuck.go).
func (r *Reconciler) distribute(ctx context.Context, svc *v1alpha2.LLMInferenceService, d decision, hold map[string]bool,
	clusters []inventory.Cluster, copies map[string]*observed) (map[string]bool, error) {
	if d.keep {
		return nil, nil
	}
	settled := true
	for name, want := range d.want {
		o := copies[name]
		if o == nil || !o.ours || !o.ready || o.readyReplicas < want {
			settled = false
		}
	}
	// Clusters are written in parallel: each write is an API round trip to a
	// different cluster, and a service's latency is the slowest of them.
	errs := make([]error, len(clusters))
	asked := make([]bool, len(clusters))
	var wg sync.WaitGroup
	for i, c := range clusters {
		o := copies[c.Name]
		want, chosen := d.want[c.Name]
		var write func(context.Context) error
		switch {
		case !c.Writable() || o.err != nil:
			// Nothing can be written; failover (in decide) handles an
			// unavailable cluster. A fenced one is not lost, only another
			// hub's to write to: this hub writes nothing there and moves
			// nothing away from it (decide sees it available).
		case o.notOurs != nil:
			// Not the hub's namespace: reported, nothing written or
			// deleted there, and the copies elsewhere stay, as for a
			// cluster whose writes fail.
		case chosen && o.exists && !o.ours:
			// Someone else's object: reported, never overwritten.
		case chosen:
			replicas := want
			if o.exists && o.replicas > want && !settled {
				replicas = o.replicas // shrink once the others are ready
			}
			want := desiredCopy(svc, r.opts.HubID, c.Name, replicas, d)
			if hold[c.Name] {
				want = heldCopy(o.obj, replicas)
			}
			write = func(ctx context.Context) (err error) {
				asked[i], err = r.ensureCopy(ctx, c, want, o)
				return err
			}
		case o.exists && o.ours && settled:
			write = func(ctx context.Context) error { return r.deletions.deleteCopy(ctx, c, svc.Namespace, svc.Name) }
		}
		if write == nil {
			continue
		}
		wg.Go(func() {
			if err := r.inCluster(ctx, write); err != nil {
				errs[i] = fmt.Errorf("cluster %s: %w", c.Name, err)
			}
		})
	}
	wg.Wait()
	out := map[string]bool{}
	for i, c := range clusters {
		if asked[i] {
			out[c.Name] = true
		}
	}
	return out, errors.Join(errs...)
}

// desiredCopy is the service as one cluster runs it under decision d: the
// hub's spec with the cluster's replicas, labelled as the hub's (and as
// deletion-protected when d says so), and, when its endpoint picker
// federates, annotated with the cluster's name and the federation mode.
func desiredCopy(svc *v1alpha2.LLMInferenceService, hubID, cluster string, replicas int32, d decision) *v1alpha2.LLMInferenceService {
	cp := &v1alpha2.LLMInferenceService{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace,
			Labels: maps.Clone(svc.Labels), Annotations: maps.Clone(svc.Annotations)},
		Spec: *svc.Spec.DeepCopy(),
	}
	if cp.Labels == nil {
		cp.Labels = map[string]string{}
	}
	if cp.Annotations == nil {
		cp.Annotations = map[string]string{}
	}
	delete(cp.Annotations, corev1.LastAppliedConfigAnnotation)
	fleetv1alpha1.MarkOwnedByHub(cp, hubID)
	markProtected(cp, d.protected)
	cp.Annotations[fleetv1alpha1.OriginUIDAnnotation] = string(svc.UID)
	if rt := svc.Spec.Router; rt != nil && rt.Scheduler != nil {
		cp.Annotations[fleetv1alpha1.ExportAnnotation] = fleetv1alpha1.ExportClusterSet
		if f := d.federation; f != "" && f != fleetv1alpha1.FederationDisabled {
			cp.Annotations[fleetv1alpha1.FederationClusterAnnotation] = cluster
			cp.Annotations[fleetv1alpha1.FederationModeAnnotation] = string(f)
		}
	}
	// With autoscaling the spoke's autoscaler owns replicas (the schema
	// forbids both).
	if svc.Spec.Scaling == nil {
		cp.Spec.Replicas = ptr.To(replicas)
	}
	return cp
}

// ensureCopy creates or updates the copy, and the namespace and configs it
// needs, writing only what differs. It says whether it asked the cluster to
// run a spec: created the copy or changed its spec.
func (r *Reconciler) ensureCopy(ctx context.Context, c inventory.Cluster, want *v1alpha2.LLMInferenceService, o *observed) (bool, error) {
	if err := spokewrite.EnsureNamespace(ctx, c.Client, want.Namespace, r.opts.HubID); err != nil {
		return false, err
	}
	if err := r.ensureConfigs(ctx, c, want); err != nil {
		return false, err
	}
	if !o.exists {
		if err := c.Client.Create(ctx, want); err != nil {
			return false, err
		}
		copyWrites.WithLabelValues(c.Name, "create").Inc()
		return true, nil
	}
	sameSpec := equality.Semantic.DeepEqual(o.obj.Spec, want.Spec)
	res, err := spokewrite.Update(ctx, c.Client, r.opts.HubID, o.obj.DeepCopy(), want, func(cur, want *v1alpha2.LLMInferenceService) bool {
		if sameSpec && equality.Semantic.DeepEqual(cur.Labels, want.Labels) && equality.Semantic.DeepEqual(cur.Annotations, want.Annotations) {
			return false
		}
		cur.Spec, cur.Labels, cur.Annotations = want.Spec, want.Labels, want.Annotations
		return true
	})
	if res != spokewrite.Updated {
		return false, err
	}
	copyWrites.WithLabelValues(c.Name, "update").Inc()
	return !sameSpec, nil
}

// ensureConfigs copies the LLMInferenceServiceConfigs the service names in
// baseRefs that exist in its hub namespace; others are expected in the spoke
// (its presets, or configs its owners manage there).
func (r *Reconciler) ensureConfigs(ctx context.Context, c inventory.Cluster, svc *v1alpha2.LLMInferenceService) error {
	for _, ref := range svc.Spec.BaseRefs {
		src := &v1alpha2.LLMInferenceServiceConfig{}
		if err := r.hub.Get(ctx, client.ObjectKey{Namespace: svc.Namespace, Name: ref.Name}, src); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		want := &v1alpha2.LLMInferenceServiceConfig{
			ObjectMeta: metav1.ObjectMeta{Name: src.Name, Namespace: src.Namespace, Labels: maps.Clone(src.Labels)},
			Spec:       *src.Spec.DeepCopy(),
		}
		if want.Labels == nil {
			want.Labels = map[string]string{}
		}
		fleetv1alpha1.MarkOwnedByHub(want, r.opts.HubID)
		_, err := spokewrite.Ensure(ctx, c.Client, r.opts.HubID, want, nil, func(cur, want *v1alpha2.LLMInferenceServiceConfig) bool {
			if equality.Semantic.DeepEqual(cur.Spec, want.Spec) && equality.Semantic.DeepEqual(cur.Labels, want.Labels) {
				return false
			}
			cur.Spec, cur.Labels = want.Spec, want.Labels
			return true
		})
		// The spoke's own config of that name wins there.
		var notOurs *spokewrite.NotOursError
		if err != nil && !errors.As(err, &notOurs) {
			return err
		}
	}
	return nil
}

// deletions remembers the copies the hub asked a cluster to delete. A copy
// with a finalizer lingers until the spoke has cleaned up, and the hub's
// cache learns of its deletion timestamp a moment after the request: without
// this memory every reconcile in between would send the delete again.
type deletions struct {
	hubID string

	mu   sync.Mutex
	sent map[types.UID]time.Time
}

// deletionMemory is how long a delete request is not repeated.
const deletionMemory = time.Minute

// deleteCopy deletes the hub's copy of a service, if it is the hub's and not
// already being deleted.
func (d *deletions) deleteCopy(ctx context.Context, c inventory.Cluster, ns, name string) error {
	cp := &v1alpha2.LLMInferenceService{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cp); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !fleetv1alpha1.IsOwnedByHub(cp, d.hubID) || !cp.DeletionTimestamp.IsZero() {
		return nil
	}
	d.mu.Lock()
	if d.sent == nil {
		d.sent = map[types.UID]time.Time{}
	}
	now := time.Now()
	for uid, at := range d.sent {
		if now.Sub(at) > deletionMemory {
			delete(d.sent, uid)
		}
	}
	_, recent := d.sent[cp.UID]
	if !recent {
		d.sent[cp.UID] = now
	}
	d.mu.Unlock()
	if recent {
		return nil
	}
	if err := c.Client.Delete(ctx, cp, client.Preconditions{UID: &cp.UID}); client.IgnoreNotFound(err) != nil {
		d.mu.Lock()
		delete(d.sent, cp.UID)
		d.mu.Unlock()
		return err
	}
	copyWrites.WithLabelValues(c.Name, "delete").Inc()
	return nil
}
