package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/placement"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
)

// A hub namespace that no ClusterSetBinding gives clusters places nothing,
// even with a placement that names every cluster: its service says why
// (Placed False, NoClusterSetBinding) and no spoke gets a copy.
func TestAHubNamespaceWithoutAClusterSetBindingPlacesNothing(t *testing.T) {
	ns := testutil.NewNamespace(t, fl.Hub.Client) // not namespace(): no binding
	var all []string
	for _, s := range fl.Spokes {
		all = append(all, s.Name())
	}
	place(t, gpuService(ns, "unbound", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: all}})
	var msg string
	testutil.Eventually(t, 30*time.Second, "Placed False for want of a binding", func(ctx context.Context) error {
		svc := &v1alpha2.LLMInferenceService{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "unbound"}, svc); err != nil {
			return err
		}
		p := svc.Status.GetCondition(placement.Placed)
		if p == nil || p.Status != corev1.ConditionFalse || p.Reason != placement.ReasonNoClusterSetBinding {
			return fmt.Errorf("hub: %s", hubConditions(svc))
		}
		msg = p.Message
		return nil
	})
	if !strings.Contains(msg, "has no ClusterSetBinding") {
		t.Errorf("Placed message %q does not say what is missing", msg)
	}
	for _, s := range fl.Spokes {
		err := s.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "unbound"}, &v1alpha2.LLMInferenceService{})
		if client.IgnoreNotFound(err) != nil || err == nil {
			t.Errorf("%s holds a copy of an unbound namespace's service (%v)", s.Name(), err)
		}
	}
}
