package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// freeGPUs reads a spoke's ClusterCapacity for one product.
func freeGPUs(ctx context.Context, c *fleet.Cluster, product string) (int64, error) {
	cc := &fleetv1alpha1.ClusterCapacity{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}, cc); err != nil {
		return 0, err
	}
	for _, a := range cc.Status.Accelerators {
		if a.Product == product {
			return a.Free, nil
		}
	}
	return 0, fmt.Errorf("no %s in %+v", product, cc.Status)
}

// The spoke's capacity report follows scheduling: free GPUs drop within 5 s
// of a GPU pod being bound and come back within 5 s of its deletion.
func TestCapacityReportFollowsGPUPodsWithinSeconds(t *testing.T) {
	spoke := fl.Spokes[1]
	product := spoke.Spec.Nodes[0].GPUProduct
	ctx := context.Background()
	var before int64
	testutil.Eventually(t, 30*time.Second, "capacity published", func(ctx context.Context) error {
		var err error
		before, err = freeGPUs(ctx, spoke, product)
		return err
	})
	ns := namespace(t, spoke)
	dep := vllmDeployment(ns, "two-gpus", 2)
	if err := spoke.Client.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	pod := readyPod(t, spoke, ns, map[string]string{"app": "two-gpus"})
	bound := time.Now()
	testutil.Eventually(t, 5*time.Second, "free GPUs drop by 2", func(ctx context.Context) error {
		free, err := freeGPUs(ctx, spoke, product)
		if err != nil || free != before-2 {
			return fmt.Errorf("free %d (was %d): %v", free, before, err)
		}
		return nil
	})
	t.Logf("capacity reflected the bound pod %s within %s of it being Ready", pod.Name, time.Since(bound).Round(time.Millisecond))
	if err := spoke.Client.Delete(ctx, dep, client.PropagationPolicy("Foreground")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "pod gone", func(ctx context.Context) error {
		pods, err := podsOf(ctx, spoke, ns, map[string]string{"app": "two-gpus"})
		if err != nil || len(pods) > 0 {
			return fmt.Errorf("%d pods (%v)", len(pods), err)
		}
		return nil
	})
	deleted := time.Now()
	testutil.Eventually(t, 5*time.Second, "free GPUs back", func(ctx context.Context) error {
		free, err := freeGPUs(ctx, spoke, product)
		if err != nil || free != before {
			return fmt.Errorf("free %d, want %d: %v", free, before, err)
		}
		return nil
	})
	t.Logf("capacity recovered within %s of the pod's deletion", time.Since(deleted).Round(time.Millisecond))
}

// allGPUsFree waits until every running spoke reports all its GPUs free, as
// the hub reads them, for tests whose expected placement counts free GPUs:
// an earlier test's pods, or a capacity report that has not caught up with
// their deletion, would change the split. It names the pods that still hold
// GPUs when it gives up.
func allGPUsFree(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, "every GPU free", func(ctx context.Context) error {
		for _, s := range fl.Spokes {
			if !s.Running() {
				continue
			}
			cc := &fleetv1alpha1.ClusterCapacity{}
			if err := s.Client.Get(ctx, client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}, cc); err != nil {
				return err
			}
			for _, a := range cc.Status.Accelerators {
				if a.Requested != 0 {
					return fmt.Errorf("%s reports %d of %d %s requested; GPU pods there: %v",
						s.Name(), a.Requested, a.Allocatable, a.Product, gpuPods(ctx, s))
				}
			}
		}
		return nil
	})
}

// gpuPods names the pods of a cluster that request GPUs.
func gpuPods(ctx context.Context, c *fleet.Cluster) []string {
	var pods corev1.PodList
	if err := c.Client.List(ctx, &pods); err != nil {
		return []string{err.Error()}
	}
	var names []string
	for _, p := range pods.Items {
		if accelerator.PodRequest(&p.Spec, accelerator.NVIDIA) > 0 {
			names = append(names, p.Namespace+"/"+p.Name+" ("+string(p.Status.Phase)+")")
		}
	}
	return names
}
