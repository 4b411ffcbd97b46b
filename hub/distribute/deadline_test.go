package distribute

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

// hangingClient is a spoke that never answers: a black-holed link, or a
// cache that never syncs. Every call waits until its context ends.
type hangingClient struct{ client.Client }

func (hangingClient) Get(ctx context.Context, _ client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	<-ctx.Done()
	return ctx.Err()
}

func (hangingClient) Create(ctx context.Context, _ client.Object, _ ...client.CreateOption) error {
	<-ctx.Done()
	return ctx.Err()
}

// One hanging spoke holds neither the worker nor the other clusters'
// writes: each call to a cluster has its own deadline.
func TestAHangingSpokeDelaysAReconcileOnlyByTheClusterDeadline(t *testing.T) {
	f := newFleet(t, []client.Object{service("llama", 1), placementOf(fleetv1alpha1.Duplicated, "hangs", "answers")},
		map[string][]client.Object{"hangs": nil, "answers": nil})
	const deadline = 300 * time.Millisecond
	f.r.opts.ClusterTimeout = deadline
	clusters := f.r.clusters.(fixedClusters)
	for i := range clusters {
		if clusters[i].Name == "hangs" {
			clusters[i].Client = hangingClient{clusters[i].Client}
		}
	}

	began := time.Now()
	_, _ = f.r.Reconcile(context.Background(), watch.Request(ns, "llama"))
	took := time.Since(began)

	// Four rounds of calls, each bounded: observe, read capacity, write,
	// observe again; one more deadline of slack for a busy machine.
	if took > 5*deadline {
		t.Errorf("the reconcile took %s with one hanging spoke, want at most %s (a few cluster deadlines of %s)", took, 5*deadline, deadline)
	}
	if f.copyIn("answers", "llama") == nil {
		t.Error("the cluster that answers got no copy while another cluster hung")
	}
}
