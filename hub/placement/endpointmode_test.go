package placement

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest"
	"github.com/fleetinfer/fleetinfer/hub/internal/watch"
)

// podNetworks labels clusters by name with their pod network ("" for none).
func podNetworks(nets map[string]string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for c, n := range nets {
		out[c] = map[string]string{"name": c}
		if n != "" {
			out[c][fleetv1alpha1.PodNetworkLabel] = n
		}
	}
	return out
}

func TestEndpointModeConditionNamesThePairsThatCannotUseIt(t *testing.T) {
	labels := podNetworks(map[string]string{"east": "mesh", "west": "mesh", "central": "", "north": "other"})
	cases := []struct {
		name     string
		mode     fleetv1alpha1.FederationMode
		services [][]string
		want     string   // status/reason, "" for no condition
		pairs    []string // named in the message
		notNamed []string
	}{
		{name: "Parent asked: no condition", mode: fleetv1alpha1.FederationParent, services: [][]string{{"east", "central"}}},
		{name: "federation disabled: no condition", mode: fleetv1alpha1.FederationDisabled, services: [][]string{{"east", "central"}}},
		{name: "every pair shares a pod network", mode: fleetv1alpha1.FederationEndpoint, services: [][]string{{"east", "west"}, {"west"}},
			want: "True/" + ReasonPodNetworksShared},
		{name: "one cluster per service: nothing to share", mode: fleetv1alpha1.FederationEndpoint, services: [][]string{{"central"}, {"north"}},
			want: "True/" + ReasonPodNetworksShared},
		{name: "no service yet", mode: fleetv1alpha1.FederationEndpoint, want: "True/" + ReasonPodNetworksShared},
		{name: "an unlabelled cluster and another pod network", mode: fleetv1alpha1.FederationEndpoint,
			services: [][]string{{"west", "east", "central"}, {"east", "north"}},
			want:     "False/" + ReasonPodNetworksNotShared,
			pairs:    []string{"central and east", "central and west", "east and north"}, notNamed: []string{"east and west"}},
		{name: "a cluster the inventory does not know has no pod network", mode: fleetv1alpha1.FederationEndpoint,
			services: [][]string{{"east", "gone"}}, want: "False/" + ReasonPodNetworksNotShared, pairs: []string{"east and gone"}},
		{name: "clusters that run no service together are no pair", mode: fleetv1alpha1.FederationEndpoint,
			services: [][]string{{"east"}, {"central"}}, want: "True/" + ReasonPodNetworksShared},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := endpointModeCondition(tc.mode, tc.services, labels)
			got := ""
			if c != nil {
				got = string(c.Status) + "/" + c.Reason
				if c.Type != ConditionEndpointMode {
					t.Errorf("type %s", c.Type)
				}
			}
			if got != tc.want {
				t.Fatalf("condition %s, want %s", got, tc.want)
			}
			for _, p := range tc.pairs {
				if !strings.Contains(c.Message, p) || !strings.Contains(c.Message, fleetv1alpha1.PodNetworkLabel) || !strings.Contains(c.Message, "Parent mode is used") {
					t.Errorf("message %q does not name %s, the label and Parent mode", c.Message, p)
				}
			}
			for _, p := range tc.notNamed {
				if strings.Contains(c.Message, p) {
					t.Errorf("message %q names %s, which shares a pod network", c.Message, p)
				}
			}
		})
	}
}

func TestEndpointModeConditionBoundsThePairsItNames(t *testing.T) {
	var clusters []string
	for _, c := range "abcdefgh" {
		clusters = append(clusters, string(c))
	}
	c := endpointModeCondition(fleetv1alpha1.FederationEndpoint, [][]string{clusters}, nil)
	if strings.Count(c.Message, " and ") != maxPairsNamed+1 || !strings.Contains(c.Message, "and 18 more pairs") {
		t.Errorf("message %q, want %d of the 28 pairs named and the rest counted", c.Message, maxPairsNamed)
	}
}

// A placement asking for Endpoint mode says, in its EndpointMode condition,
// whether its services' clusters can use it, follows their labels, and
// records one Event per change; a placement that asks for Parent mode has
// no such condition.
func TestPlacementStatusReportsWhetherEndpointModeCanBeUsed(t *testing.T) {
	ctx := context.Background()
	const ns = "llm"
	p := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fleet", Generation: 1},
		Spec: fleetv1alpha1.InferencePlacementSpec{Federation: fleetv1alpha1.Federation{Mode: fleetv1alpha1.FederationEndpoint}}}
	svc := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama"},
		Spec: v1alpha2.LLMInferenceServiceSpec{Router: &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{}}}}
	svc.Status.Clusters = []v1alpha2.ClusterStatus{{Name: "east", DesiredReplicas: 1}, {Name: "west", DesiredReplicas: 2}, {Name: "central", DesiredReplicas: 0}}
	noRouter := &v1alpha2.LLMInferenceService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain"}}
	noRouter.Status.Clusters = []v1alpha2.ClusterStatus{{Name: "east", DesiredReplicas: 1}, {Name: "central", DesiredReplicas: 1}}
	var spokes []*hubtest.Spoke
	for _, c := range []struct{ name, net string }{{"east", "mesh"}, {"west", ""}, {"central", ""}} {
		s := hubtest.NewSpoke(c.name)
		s.Labels = podNetworks(map[string]string{c.name: c.net})[c.name]
		spokes = append(spokes, s)
	}
	f := hubtest.NewFleet(t, []client.Object{p, svc, noRouter}, spokes...)
	hub := f.Hub.API
	r := &StatusReconciler{Hub: f.Hub.Client, Clusters: f, Recorder: f.Events}
	reconcile := func() (*metav1.Condition, []string) {
		t.Helper()
		if _, err := r.Reconcile(ctx, watch.Request(ns, "fleet")); err != nil {
			t.Fatal(err)
		}
		got := &fleetv1alpha1.InferencePlacement{}
		if err := hub.Get(ctx, client.ObjectKeyFromObject(p), got); err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(got.Status.Conditions, ConditionEndpointMode), f.Events.Drain()
	}

	// west is unlabelled: east and west use Parent mode. central has no
	// replicas, and the service without a router does not federate.
	c, recorded := reconcile()
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonPodNetworksNotShared || !strings.Contains(c.Message, "east and west") ||
		strings.Contains(c.Message, "central") || c.ObservedGeneration != 1 {
		t.Fatalf("EndpointMode %+v, want False naming east and west only", c)
	}
	if len(recorded) != 1 || !strings.HasPrefix(recorded[0], "Warning "+ReasonPodNetworksNotShared+" Parent mode is used between east and west") {
		t.Errorf("Events %q, want one Warning naming the pair", recorded)
	}

	f.ClearWrites()
	if _, recorded := reconcile(); len(recorded) != 0 || len(f.Writes()) != 0 {
		t.Errorf("nothing changed, yet writes %q and Events %q", f.Writes(), recorded)
	}

	f.Spoke("west").Labels = podNetworks(map[string]string{"west": "mesh"})["west"]
	c, recorded = reconcile()
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonPodNetworksShared {
		t.Fatalf("EndpointMode %+v, want True once west joins east's pod network", c)
	}
	if len(recorded) != 1 || !strings.HasPrefix(recorded[0], "Normal "+ReasonPodNetworksShared) {
		t.Errorf("Events %q, want one Normal", recorded)
	}

	if err := hub.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Federation.Mode = fleetv1alpha1.FederationParent
	if err := hub.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	if c, recorded := reconcile(); c != nil || len(recorded) != 0 {
		t.Errorf("Parent mode asked: EndpointMode %+v and Events %q, want neither", c, recorded)
	}
}
