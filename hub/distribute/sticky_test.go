package distribute

import (
	"context"
	"testing"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/spokewrite"
	"github.com/fleetinfer/fleetinfer/hub/placement"
)

// A FreeCapacity service runs 2 replicas in each of a and b, when b starts
// reporting a thousand free GPUs (a spoke's report, honest or not). Edits
// that do not concern placement change the copies where they run; only an
// input of placement decides again by today's room.
func TestOnlyPlacementInputsPlaceAServiceAgain(t *testing.T) {
	cases := []struct {
		name   string
		edit   func(*v1alpha2.LLMInferenceService, *fleetv1alpha1.InferencePlacement)
		legacy bool // the decision was recorded by a hub up to v0.1.0
		moves  bool
	}{
		{"an image bump", func(s *v1alpha2.LLMInferenceService, _ *fleetv1alpha1.InferencePlacement) {
			s.Spec.Template.Containers[0].Image = "vllm:v2"
		}, false, false},
		{"an image bump after a hub upgrade", func(s *v1alpha2.LLMInferenceService, _ *fleetv1alpha1.InferencePlacement) {
			s.Spec.Template.Containers[0].Image = "vllm:v2"
		}, true, false},
		{"a federation setting on the placement", func(_ *v1alpha2.LLMInferenceService, p *fleetv1alpha1.InferencePlacement) {
			p.Spec.Federation.Mode = fleetv1alpha1.FederationDisabled
		}, false, false},
		{"more replicas", func(s *v1alpha2.LLMInferenceService, _ *fleetv1alpha1.InferencePlacement) {
			s.Spec.Replicas = ptr.To(int32(6))
		}, false, true},
		{"a total on the placement", func(_ *v1alpha2.LLMInferenceService, p *fleetv1alpha1.InferencePlacement) {
			p.Spec.Replicas.Total = ptr.To(int32(8))
		}, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			svc, pl := gpuService("llama", 4), placementOf(fleetv1alpha1.FreeCapacity, "a", "b")
			svc.Generation, pl.Generation = 1, 1
			placedOn(svc, "", map[string]int32{"a": 2, "b": 2})
			fp := placement.Fingerprint
			if c.legacy {
				fp = placement.LegacyFingerprint
			}
			svc.Status.Placement.InputsHash = fp(pl, svc, []string{"a", "b"})
			running := func(cluster string) []client.Object {
				cp := hubCopy("llama", 2)
				cp.Spec.Template = svc.Spec.Template.DeepCopy()
				return []client.Object{spokewrite.Namespace(ns, hubtest.HubID), cp}
			}
			f := newFleet(t, []client.Object{svc, pl}, map[string][]client.Object{
				"a": append(running("a"), hubtest.Capacity(hubtest.GPUNode("nvidia.com/gpu", "H100", 2, 0))),
				"b": append(running("b"), hubtest.Capacity(hubtest.GPUNode("nvidia.com/gpu", "H100", 1002, 1000)))})
			if c.legacy { // an upgraded hub's first reconcile adopts the decision
				f.reconcile("llama")
			}

			edited, editedPl := f.hubService("llama"), &fleetv1alpha1.InferencePlacement{}
			if err := f.Hub.API.Get(context.Background(), client.ObjectKeyFromObject(pl), editedPl); err != nil {
				t.Fatal(err)
			}
			c.edit(edited, editedPl)
			edited.Generation, editedPl.Generation = 2, 2
			for _, o := range []client.Object{edited, editedPl} {
				if err := f.Hub.API.Update(context.Background(), o); err != nil {
					t.Fatal(err)
				}
			}
			f.reconcile("llama")

			a, b := f.copyIn("a", "llama"), f.copyIn("b", "llama")
			kept := a != nil && b != nil && ptr.Deref(a.Spec.Replicas, 0) == 2 && ptr.Deref(b.Spec.Replicas, 0) == 2
			if kept == c.moves {
				t.Errorf("after %s: copies a %v, b %v; want replicas moved %v", c.name, replicas(a), replicas(b), c.moves)
			}
			if p := f.hubService("llama").Status.Placement; !c.moves && p.InputsHash != placement.Fingerprint(editedPl, edited, []string{"a", "b"}) {
				t.Errorf("decision memory %s, want this hub's fingerprint of the same inputs", p.InputsHash)
			}
		})
	}
}

func replicas(cp *v1alpha2.LLMInferenceService) any {
	if cp == nil {
		return "none"
	}
	return ptr.Deref(cp.Spec.Replicas, 0)
}
