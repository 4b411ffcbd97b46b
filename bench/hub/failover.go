package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// failoverResult is one loss of a spoke's control plane, timed from the
// moment it stopped.
type failoverResult struct {
	// ReplacedS: the surviving cluster's copy carries the lost replicas.
	ReplacedS float64 `json:"replaced_s"`
	// ServingS: that copy is Ready (its new pods serve).
	ServingS float64 `json:"serving_s"`
	// SettledS: after the lost cluster came back, the hub reports Ready with
	// the survivor alone (the stale copy is gone), timed from the restart.
	SettledS float64 `json:"settled_after_return_s"`
}

// failover places two 1-GPU replicas on central (preferred, Overflow),
// stops central's control plane, and times the move to west.
func (b *bench) failover(ctx context.Context, rep int) (failoverResult, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.timeout)
	defer cancel()
	ns := fmt.Sprintf("bench-failover-%d", rep)
	hub := b.fl.Hub.Client
	if err := createNamespace(ctx, hub, ns); err != nil {
		return failoverResult{}, err
	}
	if err := fleet.BindEveryCluster(ctx, hub, ns); err != nil {
		return failoverResult{}, err
	}
	svc := &v1alpha2.LLMInferenceService{
		ObjectMeta: metav1.ObjectMeta{Name: "resilient", Namespace: ns, Labels: map[string]string{"bench": ns}},
		Spec: v1alpha2.LLMInferenceServiceSpec{
			Model: v1alpha2.LLMModelSpec{URI: "hf://facebook/opt-125m", Name: ptr.To("opt")},
			WorkloadSpec: v1alpha2.WorkloadSpec{Replicas: ptr.To(int32(1)),
				Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "vllm/vllm-openai:v0.11.0",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{accelerator.NVIDIA: resource.MustParse("1")}}}}}},
		},
	}
	p := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Name: "resilient", Namespace: ns},
		Spec: fleetv1alpha1.InferencePlacementSpec{
			ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bench": ns}},
			Clusters:        fleetv1alpha1.ClusterAffinity{Names: []string{"central", "west"}},
			Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Overflow, Total: ptr.To(int32(2)),
				Preference: []string{"central", "west"}, Rebalance: "Never"},
			Failover: fleetv1alpha1.Failover{TolerationSeconds: ptr.To(int32(b.cfg.toleration / time.Second))},
		}}
	for _, o := range []client.Object{p, svc} {
		if err := hub.Create(ctx, o); err != nil {
			return failoverResult{}, err
		}
	}
	central, west := b.fl.Spoke("central"), b.fl.Spoke("west")
	key := client.ObjectKeyFromObject(svc)
	copyOf := func(ctx context.Context, c client.Client) (*v1alpha2.LLMInferenceService, error) {
		cp := &v1alpha2.LLMInferenceService{}
		err := c.Get(ctx, key, cp)
		return cp, err
	}
	if err := until(ctx, "central serving both replicas", func(ctx context.Context) (bool, error) {
		cp, err := copyOf(ctx, central.Client)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return ptr.Deref(cp.Spec.Replicas, 0) == 2 && cp.Status.IsTrue(v1alpha2.Ready), nil
	}); err != nil {
		return failoverResult{}, err
	}

	// The loss starts when the control plane starts going away, not when
	// Stop has finished taking it down.
	lost := time.Now()
	central.Stop()
	var res failoverResult
	err := until(ctx, "west carrying the replicas", func(ctx context.Context) (bool, error) {
		cp, err := copyOf(ctx, west.Client)
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if ptr.Deref(cp.Spec.Replicas, 0) == 2 && res.ReplacedS == 0 {
			res.ReplacedS = time.Since(lost).Seconds()
		}
		return res.ReplacedS > 0 && cp.Status.IsTrue(v1alpha2.Ready), nil
	})
	res.ServingS = time.Since(lost).Seconds()
	if startErr := central.Start(ctx); startErr != nil {
		return res, fmt.Errorf("restart central: %w", startErr)
	}
	if err != nil {
		return res, err
	}
	back := time.Now()
	if err := until(ctx, "the hub settled on west", func(ctx context.Context) (bool, error) {
		h := &v1alpha2.LLMInferenceService{}
		if err := hub.Get(ctx, key, h); err != nil {
			return false, err
		}
		_, err := copyOf(ctx, central.Client)
		return h.Status.IsTrue(v1alpha2.Ready) && len(h.Status.Clusters) == 1 && client.IgnoreNotFound(err) == nil && err != nil, nil
	}); err != nil {
		return res, err
	}
	res.SettledS = time.Since(back).Seconds()
	return res, b.removeFailoverService(ctx, svc, p)
}

// removeFailoverService deletes the service and waits until its pods are
// gone, so that the next repetition finds central's GPUs free.
func (b *bench) removeFailoverService(ctx context.Context, svc *v1alpha2.LLMInferenceService, p *fleetv1alpha1.InferencePlacement) error {
	if err := b.fl.Hub.Client.Delete(ctx, svc); err != nil {
		return err
	}
	if err := until(ctx, "no pods left", func(ctx context.Context) (bool, error) {
		for _, s := range b.fl.Spokes {
			var pods corev1.PodList
			if err := s.Client.List(ctx, &pods, client.InNamespace(svc.Namespace)); err != nil {
				return false, err
			}
			if len(pods.Items) > 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	return b.fl.Hub.Client.Delete(ctx, p)
}

// until polls check every 100 ms until it holds, fails, or ctx ends.
func until(ctx context.Context, what string, check func(context.Context) (bool, error)) error {
	for {
		ok, err := check(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
