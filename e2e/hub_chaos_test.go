package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1beta1 "open-cluster-management.io/api/cluster/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/placement"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// The fault suite of "the hub never loses a service": each case runs a
// fault under steady open-loop load through the gateways the service runs
// behind and prints a `FAULT <case>: <figures>` line. The default run takes
// short variants; `make chaos` (FLEETINFER_CHAOS=1) the durations
// and counts.

// chaos selects the long variants.
var chaos = os.Getenv("FLEETINFER_CHAOS") != ""

// span is ci in the default run and long under `make chaos`.
func span(ci, long time.Duration) time.Duration {
	if chaos {
		return long
	}
	return ci
}

// loadRate is the fault cases' steady load, in requests per second.
const loadRate = 5

// underFault runs fault under steady load on service svc of namespace ns
// and asserts what a fault must leave alone: no request failed, the hub
// deleted none of the namespace's copies (but those of the services named
// in deleted, which the case deletes itself) and svc's pods kept their
// UIDs. fault returns its own figures for the FAULT line.
func underFault(t *testing.T, name, ns, svc string, fault func() string, deleted ...string) {
	t.Helper()
	uids := podUIDs(t, ns, svc)
	since := time.Now()
	load := startLoad(t, ns, svc, loadRate, 10*time.Minute)
	began := time.Now()
	figures := fault()
	seen := load.stop()
	deletes := slices.DeleteFunc(hubDeletes(t, ns, since), func(d string) bool {
		return slices.ContainsFunc(deleted, func(n string) bool { return strings.HasSuffix(d, "/llminferenceservices/"+n) })
	})
	replaced := replacedPods(t, ns, svc, uids)
	others := ""
	if len(deleted) > 0 {
		others = " other than " + strings.Join(deleted, ", ") + "'s"
	}
	reportFault(name, "%s; %d copies%s deleted; %d of %d pods replaced; %s (%.0f s under load)",
		seen, len(deletes), others, len(replaced), len(uids), figures, time.Since(began).Seconds())
	if seen.Failed > 0 {
		t.Errorf("%s", seen)
	}
	if len(deletes) > 0 {
		t.Errorf("the hub deleted copies: %v", deletes)
	}
	if len(replaced) > 0 {
		t.Errorf("pods replaced: %v", replaced)
	}
}

// placedReason waits until the hub service's Placed condition has reason
// and returns its message.
func placedReason(t *testing.T, ns, name, reason string, timeout time.Duration) string {
	t.Helper()
	var msg string
	testutil.Eventually(t, timeout, "Placed reason "+reason, func(ctx context.Context) error {
		svc := &v1alpha2.LLMInferenceService{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		c := svc.Status.GetCondition(placement.Placed)
		if c == nil || c.Reason != reason {
			return fmt.Errorf("%s", hubConditions(svc))
		}
		msg = c.Message
		return nil
	})
	return msg
}

// Decision errors keep what runs. One routed service, placed on central
// alone through an OCM Placement, meets in turn a second placement that
// selects it, its placement deleted and recreated, OCM deciding no cluster,
// a cluster selector that cannot be parsed (both shapes a template renders,
// through a CRD without the admission rules, as an older install has), and
// every GPU node of central cordoned: the hub says why in the Placed
// condition, deletes no copy, no pod is replaced and no request fails.
func TestFaultDecisionErrorsKeepTheService(t *testing.T) {
	ns := namespace(t, fl.Hub)
	const name = "keeper"
	ocm := &clusterv1beta1.Placement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gpu-clusters",
		Annotations: map[string]string{clusterv1beta1.PlacementDisableAnnotation: "true"}}}
	if err := fl.Hub.Client.Create(context.Background(), ocm); err != nil {
		t.Fatal(err)
	}
	decide(t, ocm, "central")
	p := place(t, routedService(ns, name, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters:   fleetv1alpha1.ClusterAffinity{OCMPlacement: &fleetv1alpha1.LocalReference{Name: ocm.Name}},
		Federation: noFederation})
	hubReady(t, ns, name, "central=1", 120*time.Second)
	hold := span(10*time.Second, 30*time.Second)
	ctx := context.Background()

	second := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-too"},
		Spec: fleetv1alpha1.InferencePlacementSpec{ServiceSelector: p.Spec.ServiceSelector,
			Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}}}}
	create := func(o client.Object) func(t *testing.T) {
		return func(t *testing.T) {
			o.SetResourceVersion("")
			if err := fl.Hub.Client.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	remove := func(o client.Object) func(t *testing.T) {
		return func(t *testing.T) {
			if err := fl.Hub.Client.Delete(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name, fault, reason string
		cause, undo         func(t *testing.T)
	}{
		{"overlapping placement", "overlapping-placement", placement.ReasonMultiplePlacements, create(second), remove(second)},
		{"placement deleted and recreated", "placement-recreated", placement.ReasonNoPlacement, remove(p), create(p)},
		{"OCM decides no cluster", "ocm-decisions-empty", placement.ReasonOCMDecisionsUnavailable,
			func(t *testing.T) { decide(t, ocm) }, func(t *testing.T) { decide(t, ocm, "central") }},
		{"selector In with no values (older CRD)", "selector-in-no-values", placement.ReasonInvalidPlacement,
			selectClusters(p, &metav1.LabelSelectorRequirement{Key: "region", Operator: metav1.LabelSelectorOpIn}),
			selectClusters(p, nil)},
		{"selector operator Equals (older CRD)", "selector-operator-equals", placement.ReasonInvalidPlacement,
			selectClusters(p, &metav1.LabelSelectorRequirement{Key: "region", Operator: "Equals", Values: []string{"central"}}),
			selectClusters(p, nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			underFault(t, c.fault, ns, name, func() string {
				c.cause(t)
				placedReason(t, ns, name, c.reason, 30*time.Second)
				time.Sleep(hold)
				c.undo(t)
				placedReason(t, ns, name, placement.ReasonPlaced, 30*time.Second)
				hubReady(t, ns, name, "central=1", 30*time.Second)
				return fmt.Sprintf("held %s with Placed=False %s", hold, c.reason)
			})
		})
	}

	t.Run("every GPU node cordoned", func(t *testing.T) {
		cordonHold := span(15*time.Second, 2*time.Minute)
		underFault(t, "gpu-nodes-cordoned", ns, name, func() string {
			central := fl.Spoke("central")
			nodes := cordon(t, central, true)
			t.Cleanup(func() { cordon(t, central, false) })
			testutil.Eventually(t, 30*time.Second, "central reports no schedulable GPU", func(ctx context.Context) error {
				cc := &fleetv1alpha1.ClusterCapacity{}
				if err := central.Client.Get(ctx, client.ObjectKey{Name: fleetv1alpha1.ClusterCapacityName}, cc); err != nil {
					return err
				}
				for _, a := range cc.Status.Accelerators {
					if a.Allocatable > 0 {
						return fmt.Errorf("%d %s allocatable", a.Allocatable, a.Product)
					}
				}
				return nil
			})
			time.Sleep(cordonHold)
			reason := currentPlaced(t, ns, name)
			cordon(t, central, false)
			hubReady(t, ns, name, "central=1", 30*time.Second)
			return fmt.Sprintf("held %s with %d GPU nodes cordoned (Placed: %s)", cordonHold, nodes, reason)
		})
	})
}

// selectClusters returns a step that sets the placement's clusters to a
// selector with the requirement, or back to its OCM Placement when nil. A
// requirement the admission rules refuse is first shown refused, then
// written through a CRD stripped of those rules until the test ends.
func selectClusters(p *fleetv1alpha1.InferencePlacement, req *metav1.LabelSelectorRequirement) func(t *testing.T) {
	ocm := p.Spec.Clusters
	return func(t *testing.T) {
		clusters := ocm
		if req != nil {
			clusters = fleetv1alpha1.ClusterAffinity{Selector: &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{*req}}}
			if err := updatePlacement(p, clusters); !apierrors.IsInvalid(err) {
				t.Fatalf("the placement CRD accepted selector %v: %v", *req, err)
			}
			withoutSelectorRules(t)
		}
		testutil.Eventually(t, 30*time.Second, "placement updated", func(context.Context) error {
			return updatePlacement(p, clusters)
		})
	}
}

func updatePlacement(p *fleetv1alpha1.InferencePlacement, clusters fleetv1alpha1.ClusterAffinity) error {
	ctx := context.Background()
	cur := &fleetv1alpha1.InferencePlacement{}
	if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil {
		return err
	}
	cur.Spec.Clusters = clusters
	return fl.Hub.Client.Update(ctx, cur)
}

// withoutSelectorRules removes the label selector rules from the hub's
// InferencePlacement CRD, as a CRD from before they existed lacks them,
// and puts them back when the test ends.
func withoutSelectorRules(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	key := client.ObjectKey{Name: "inferenceplacements." + fleetv1alpha1.GroupVersion.Group}
	if err := fl.Hub.Client.Get(ctx, key, crd); err != nil {
		t.Fatal(err)
	}
	original := crd.DeepCopy()
	if !dropSelectorRules(crd.Object) {
		t.Fatalf("%s has no selector rules to remove", key.Name)
	}
	if err := fl.Hub.Client.Update(ctx, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testutil.Eventually(t, 30*time.Second, "selector rules restored", func(ctx context.Context) error {
			cur := original.DeepCopy()
			if err := fl.Hub.Client.Get(ctx, key, cur); err != nil {
				return err
			}
			restored := original.DeepCopy()
			restored.SetResourceVersion(cur.GetResourceVersion())
			return fl.Hub.Client.Update(ctx, restored)
		})
	})
}

// dropSelectorRules deletes, anywhere in a CRD's schema, the CEL rules that
// check a selector requirement's operator; true when it found some.
func dropSelectorRules(node any) bool {
	found := false
	switch n := node.(type) {
	case map[string]any:
		if rules, ok := n["x-kubernetes-validations"].([]any); ok {
			kept := slices.DeleteFunc(rules, func(r any) bool {
				rule, _ := r.(map[string]any)["rule"].(string)
				return strings.Contains(rule, ".operator")
			})
			found = found || len(kept) < len(rules)
			if n["x-kubernetes-validations"] = kept; len(kept) == 0 {
				delete(n, "x-kubernetes-validations")
			}
		}
		for _, v := range n {
			found = dropSelectorRules(v) || found
		}
	case []any:
		for _, v := range n {
			found = dropSelectorRules(v) || found
		}
	}
	return found
}

// currentPlaced is the hub service's Placed condition as status/reason.
func currentPlaced(t *testing.T, ns, name string) string {
	t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	if err := fl.Hub.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		t.Fatal(err)
	}
	if c := svc.Status.GetCondition(placement.Placed); c != nil {
		return fmt.Sprintf("%s/%s", c.Status, c.Reason)
	}
	return "none"
}

// cordon marks every GPU node of cluster c unschedulable (or schedulable
// again) and returns how many it changed.
func cordon(t *testing.T, s *fleet.Cluster, unschedulable bool) int {
	t.Helper()
	var nodes corev1.NodeList
	if err := s.Client.List(context.Background(), &nodes); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, node := range nodes.Items {
		if _, gpu := node.Status.Allocatable[accelerator.NVIDIA]; !gpu || node.Spec.Unschedulable == unschedulable {
			continue
		}
		patch := client.MergeFrom(node.DeepCopy())
		node.Spec.Unschedulable = unschedulable
		if err := s.Client.Patch(context.Background(), &node, patch); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

// The hub leader SIGKILLed at random points of make-before-break moves:
// each move completes within 60 s of the new leader taking the lease, the
// service's ready pods never drop below the placement's total, and the
// copies end exactly as placed (none missing, none left over). One copy
// stays on east and serves the load throughout; the other moves between
// west and central.
func TestFaultHubLeaderKilledDuringMoves(t *testing.T) {
	if len(fl.HubReplicas()) < 2 {
		t.Skip("the fleet runs one hub replica")
	}
	ns := namespace(t, fl.Hub)
	const name = "moved"
	p := place(t, routedService(ns, name, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters:   fleetv1alpha1.ClusterAffinity{Names: []string{"east", "west"}},
		Replicas:   fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Duplicated},
		Federation: noFederation})
	hubReady(t, ns, name, "east=1,west=1", 120*time.Second)
	kills := 2
	if chaos {
		kills = 20
	}
	eastPods := podUIDs(t, ns, name)
	for k := range eastPods {
		if !strings.HasPrefix(k, "east/") {
			delete(eastPods, k)
		}
	}
	load := startLoad(t, ns, name, loadRate, 30*time.Minute, "east")

	// The ready model servers, sampled until the moves end. One sample
	// lists the clusters one after the other, so a move towards a cluster
	// listed earlier can show one pod too few for the instant between the
	// lists; a real gap (the old pod gone before the new one is Ready)
	// lasts a pod's start-up. So a drop counts when two samples in a row
	// show it.
	minReady, minSample, sampled, last := 2, 2, 0, 2
	var drops []string // the samples that showed a drop, with when and where
	began := time.Now()
	sampling, stopSampling := context.WithCancel(context.Background())
	sampler := make(chan struct{})
	go func() {
		defer close(sampler)
		for sampling.Err() == nil {
			ctx, cancel := context.WithTimeout(sampling, 5*time.Second)
			if n, by, err := fleetReadyPods(ctx, ns, name); err == nil {
				minReady, minSample, sampled, last = min(minReady, max(n, last)), min(minSample, n), sampled+1, n
				if n < 2 && len(drops) < 20 {
					drops = append(drops, fmt.Sprintf("%.1fs: %s", time.Since(began).Seconds(), split(by)))
				}
			}
			cancel()
			select {
			case <-sampling.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { stopSampling(); <-sampler })

	rng := rand.New(rand.NewPCG(14, 14))
	var worst, takeovers time.Duration
	clusters := []string{"west", "central"}
	for i := range kills {
		to := clusters[(i+1)%2]
		testutil.Eventually(t, 10*time.Second, "placement moved to "+to, func(ctx context.Context) error {
			if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return err
			}
			p.Spec.Clusters.Names = []string{"east", to}
			return fl.Hub.Client.Update(ctx, p)
		})
		// A point of the move: before the hub saw it, while the new copy
		// starts, or while the old one goes.
		time.Sleep(time.Duration(rng.Int64N(int64(8 * time.Second))))
		killed, err := fl.KillHubLeader(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%.1fs: moving to %s, leader killed", killed.Sub(began).Seconds(), to)
		if _, err := fl.HubLeader(context.Background(), 60*time.Second); err != nil {
			t.Fatal(err)
		}
		led := time.Now()
		hubReady(t, ns, name, split(map[string]int32{"east": 1, to: 1}), 60*time.Second)
		worst, takeovers = max(worst, time.Since(led)), takeovers+led.Sub(killed)
	}
	stopSampling()
	<-sampler
	seen := load.stop()
	replaced := replacedPods(t, ns, name, eastPods)
	reportFault("hub-leader-killed", "%d leader kills during moves; each move complete within %.1f s of the new leader (mean takeover %.1f s); min %d ready model servers of 2 in two samples in a row, %d in one (%d samples); through east: %s; %d east pods replaced",
		kills, worst.Seconds(), (takeovers / time.Duration(kills)).Seconds(), minReady, minSample, sampled, seen, len(replaced))
	if minReady < 2 {
		t.Errorf("ready model servers dropped to %d, below the placement's 2; samples below 2 (ready pods by cluster): %v", minReady, drops)
	}
	if seen.Failed > 0 {
		t.Errorf("%s", seen)
	}
	if len(replaced) > 0 {
		t.Errorf("east's pods replaced: %v", replaced)
	}
}

// Services deleted on the hub while a spoke is partitioned from it: once
// healed, that spoke's copies of them are gone within the orphan grace
// period plus 10 s, and nothing else is deleted (the service that stays
// keeps its copy and pods and serves throughout).
func TestFaultServicesDeletedWhileASpokeIsPartitioned(t *testing.T) {
	ns := namespace(t, fl.Hub)
	on := fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}}, Federation: noFederation}
	var gone []*v1alpha2.LLMInferenceService
	for _, n := range []string{"gone-a", "gone-b"} {
		svc := gpuService(ns, n, 1, 1)
		place(t, svc, on)
		gone = append(gone, svc)
	}
	place(t, routedService(ns, "stays", 1), on)
	for _, n := range []string{"gone-a", "gone-b", "stays"} {
		hubReady(t, ns, n, "east=1", 120*time.Second)
	}
	partition := span(20*time.Second, 2*time.Minute)
	underFault(t, "partitioned-deletes", ns, "stays", func() string {
		fl.Fabric().BlackHole("hub", "east")
		t.Cleanup(func() { fl.Fabric().Heal("hub", "east") })
		for _, svc := range gone {
			if err := fl.Hub.Client.Delete(context.Background(), svc); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(partition)
		fl.Fabric().Heal("hub", "east")
		healed := time.Now()
		testutil.Eventually(t, orphanGrace+10*time.Second, "the deleted services' copies gone from east", func(ctx context.Context) error {
			for _, svc := range gone {
				if got, err := copies(ctx, ns, svc.Name); err != nil || len(got) > 0 {
					return fmt.Errorf("%s: %s (%v)", svc.Name, split(got), err)
				}
			}
			return nil
		})
		took := time.Since(healed)
		return fmt.Sprintf("partitioned %s; the 2 deleted services' copies gone %.1f s after healing (grace %s)", partition, took.Seconds(), orphanGrace)
	}, "gone-a", "gone-b")
}

// A spoke API server restarted while the hub writes 100 services (twice in
// the default run, 5 times under `make chaos`): all 100 copies converge
// and none is left orphaned. The services are stopped (KServe's stop
// annotation, which the copies carry) and request no GPU, so the case
// measures the hub's writes, not 100 model servers.
func TestFaultSpokeAPIServerRestartsWhileTheHubWrites(t *testing.T) {
	ns := namespace(t, fl.Hub)
	ctx := context.Background()
	const services = 100
	restarts := 2
	if chaos {
		restarts = 5
	}
	central := fl.Spoke("central")
	batch := map[string]string{"batch": "bulk"}
	pl := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bulk"},
		Spec: fleetv1alpha1.InferencePlacementSpec{ServiceSelector: &metav1.LabelSelector{MatchLabels: batch},
			Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"central"}}, Federation: noFederation}}
	if err := fl.Hub.Client.Create(ctx, pl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fl.Hub.Client.DeleteAllOf(ctx, &v1alpha2.LLMInferenceService{}, client.InNamespace(ns))
		testutil.Eventually(t, 120*time.Second, "every copy gone", func(ctx context.Context) error {
			var list v1alpha2.LLMInferenceServiceList
			if err := central.Client.List(ctx, &list, client.InNamespace(ns)); err != nil || len(list.Items) > 0 {
				return fmt.Errorf("%d copies left (%v)", len(list.Items), err)
			}
			return nil
		})
		_ = fl.Hub.Client.Delete(ctx, pl)
	})

	restarted := make(chan error, 1)
	began := time.Now()
	go func() {
		for range restarts {
			if err := central.RestartAPIServer(ctx); err != nil {
				restarted <- err
				return
			}
			time.Sleep(2 * time.Second)
		}
		restarted <- nil
	}()
	for i := range services {
		svc := gpuService(ns, fmt.Sprintf("bulk-%03d", i), 1, 0)
		svc.Labels["batch"] = "bulk"
		svc.Annotations = map[string]string{v1alpha2.StopAnnotation: "true"}
		if err := fl.Hub.Client.Create(ctx, svc); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	lastRestart := time.Now()
	converged := 0
	testutil.Eventually(t, 3*time.Minute, "every copy on central", func(ctx context.Context) error {
		var list v1alpha2.LLMInferenceServiceList
		if err := central.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		converged = 0
		for _, cp := range list.Items {
			if fleetv1alpha1.IsManagedByHub(&cp) && cp.Annotations[v1alpha2.StopAnnotation] == "true" && cp.DeletionTimestamp.IsZero() {
				converged++
			}
		}
		if converged != services || len(list.Items) != services {
			return fmt.Errorf("%d of %d copies converged, %d in all", converged, services, len(list.Items))
		}
		return nil
	})
	took := time.Since(lastRestart)
	orphans := 0
	for _, s := range fl.Spokes {
		var list v1alpha2.LLMInferenceServiceList
		if err := s.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if s != central {
			orphans += len(list.Items)
		}
	}
	reportFault("api-server-restarts", "%d/%d copies converged %.1f s after the last of %d API server restarts (%.0f s of restarts while the hub wrote); %d copies elsewhere",
		converged, services, took.Seconds(), restarts, lastRestart.Sub(began).Seconds(), orphans)
	if orphans > 0 {
		t.Errorf("%d copies in clusters the placement does not name", orphans)
	}
}

// The hub restarted (its leader SIGKILLed) again and again while a spoke is
// down: the replicas still fail over within the toleration plus 15 s of
// the loss, and not before the toleration, because the loss's start is recorded, not counted afresh by
// each new leader. The default run kills the leader once, 5 s into the
// loss, with a 25 s toleration (the new leader takes the lease about 21 s
// into the loss, waits out its engage grace, and one counting afresh would
// fail over only about 46 s after the loss); `make chaos` kills it every
// 40 s with a 60 s toleration.
func TestFaultHubRestartsDoNotResetTheFailoverClock(t *testing.T) {
	if len(fl.HubReplicas()) < 2 {
		t.Skip("the fleet runs one hub replica")
	}
	ns := namespace(t, fl.Hub)
	toleration, every, firstKill := 25*time.Second, time.Duration(0), 5*time.Second
	if chaos {
		toleration, every = 60*time.Second, 40*time.Second
	}
	place(t, gpuService(ns, "survivor", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"central", "west"}},
		Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Overflow, Total: ptr.To(int32(1)),
			Preference: []string{"central", "west"}, Rebalance: "Never"},
		Failover: fleetv1alpha1.Failover{TolerationSeconds: ptr.To(int32(toleration / time.Second))}})
	hubReady(t, ns, "survivor", "central=1", 120*time.Second)

	central, west := fl.Spoke("central"), fl.Spoke("west")
	lost := time.Now()
	central.Stop()
	t.Cleanup(func() {
		if !central.Running() {
			if err := central.Start(context.Background()); err != nil {
				t.Error(err)
			}
		}
	})
	kills := 0
	killing, stopKilling := context.WithCancel(context.Background())
	killer := make(chan struct{})
	go func() {
		defer close(killer)
		next := lost.Add(firstKill)
		for {
			select {
			case <-killing.Done():
				return
			case <-time.After(time.Until(next)):
			}
			if _, err := fl.KillHubLeader(killing); err != nil {
				return
			}
			kills++
			if every == 0 {
				return
			}
			next = next.Add(every)
		}
	}()
	t.Cleanup(func() { stopKilling(); <-killer })
	testutil.Eventually(t, toleration+15*time.Second-time.Since(lost), "replicas re-placed on west", func(ctx context.Context) error {
		cp := &v1alpha2.LLMInferenceService{}
		if err := west.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "survivor"}, cp); err != nil {
			return err
		}
		if ptr.Deref(cp.Spec.Replicas, 0) != 1 {
			return fmt.Errorf("west's copy asks for %d replicas", ptr.Deref(cp.Spec.Replicas, 0))
		}
		return nil
	})
	failedOver := time.Since(lost)
	stopKilling()
	<-killer
	reportFault("hub-restarts-while-spoke-down", "replicas re-placed %.1f s after the loss (toleration %s, bound %s); %d leader kills meanwhile",
		failedOver.Seconds(), toleration, toleration+15*time.Second, kills)
	if failedOver < toleration {
		t.Errorf("replicas moved %.1f s after the loss, before the %s toleration", failedOver.Seconds(), toleration)
	}
	if err := central.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	hubReady(t, ns, "survivor", "west=1", 120*time.Second)
}

// probeTimeout is the hub's API server probe timeout (hub/inventory's
// default; the fleet sets no other) and probeInterval the fleet's
// --probe-interval.
const probeTimeout, probeInterval = 2 * time.Second, time.Second

// flakyWritesPerMinute is the budget of hub writes to the spokes while one
// spoke's probe fails 1 time in 3: the hub's steady state writes nothing,
// and a placement change (the one the case allows) is a few objects.
const flakyWritesPerMinute = 6

// A spoke whose probe fails about 1 time in 3, as over a congested link:
// the hub–central link turns slower than the hub's probe timeout for one
// probe interval, then back for three (the failed probe lasts two) (bytes delayed, never
// dropped, so the hub's watches live on). The probe's failure threshold
// (3 in a row) is never reached, so central stays available: at most 1
// placement change (copies created or deleted, or the hub service's
// clusters), no copy deleted, no pod replaced, no request failed, and the
// hub's writes to the spokes stay within flakyWritesPerMinute. 60 s, 5
// minutes under `make chaos`.
func TestFaultFlakyProbeChangesNothing(t *testing.T) {
	ns := namespace(t, fl.Hub)
	const name = "flaky"
	place(t, routedService(ns, name, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"central"}}, Federation: noFederation})
	hubReady(t, ns, name, "central=1", 120*time.Second)
	flaky := span(60*time.Second, 5*time.Minute)
	fabric := fl.Fabric()
	normal, err := fabric.Link("hub", "central")
	if err != nil {
		t.Fatal(err)
	}
	// Each leg of a round trip over the slow link outlasts the probe.
	slow := normal
	slow.RTT = normal.RTT + 2*probeTimeout + time.Second
	t.Cleanup(func() { _ = fabric.SetLink("hub", "central", normal) })

	underFault(t, "flaky-probe", ns, name, func() string {
		failuresBefore := probeFailures(t, "central")
		before := hubClusters(t, ns, name)
		began := time.Now()
		cycles, unavailableSamples, samples := 0, 0, 0
		for time.Since(began) < flaky {
			if err := fabric.SetLink("hub", "central", slow); err != nil {
				t.Fatal(err)
			}
			time.Sleep(probeInterval)
			if err := fabric.SetLink("hub", "central", normal); err != nil {
				t.Fatal(err)
			}
			cycles++
			// A failed probe takes the probe timeout, two intervals:
			// three more intervals make the next two probes good.
			for range 3 {
				time.Sleep(probeInterval)
				samples++
				if clusterAvailable(t, "central") == 0 {
					unavailableSamples++
				}
			}
		}
		took := time.Since(began)
		// Let the last slow bytes land before counting.
		time.Sleep(slow.RTT)
		failures := probeFailures(t, "central") - failuresBefore
		after := hubClusters(t, ns, name)
		changes := 0
		var writes []string
		forEachHubWrite(t, began, func(cluster, verb, uri string, _ time.Time) {
			if cluster == fl.Hub.Name() {
				return
			}
			writes = append(writes, verb+" "+cluster+": "+uri)
			if (verb == "create" || verb == "delete") && strings.Contains(uri, "/namespaces/"+ns+"/llminferenceservices") {
				changes++
			}
		})
		if before != after {
			changes++
		}
		perMinute := float64(len(writes)) / took.Minutes()
		// A failed probe holds the probe loop for the timeout.
		probes := took.Seconds()/probeInterval.Seconds() - failures*float64(probeTimeout/probeInterval-1)
		if failures == 0 {
			t.Errorf("no probe of central failed in %d slow spells: the fault did not reach the probe", cycles)
		}
		if unavailableSamples > 0 {
			t.Errorf("the hub found central unavailable in %d of %d samples: a probe failing 1 time in 3 made it flap", unavailableSamples, samples)
		}
		if changes > 1 {
			t.Errorf("%d placement changes (clusters %s, then %s; writes %v)", changes, before, after, writes)
		}
		if perMinute > flakyWritesPerMinute {
			t.Errorf("the hub wrote to the spokes %.1f times a minute, budget %d:\n%s", perMinute, flakyWritesPerMinute, strings.Join(writes, "\n"))
		}
		return fmt.Sprintf("%s, link slowed to %s RTT (probe timeout %s) 1 s in 4 (%d spells): %.0f of about %.0f probes of central failed; central unavailable in %d of %d samples; %d placement changes (clusters %s, then %s); %d hub writes to spokes (%.1f/min, budget %d)",
			flaky, slow.RTT, probeTimeout, cycles, failures, probes, unavailableSamples, samples, changes, before, after, len(writes), perMinute, flakyWritesPerMinute)
	})
}

// probeFailures is the hub's count of failed probes of cluster c.
func probeFailures(t *testing.T, c string) float64 {
	return hubMetrics(t)[`fleetinfer_hub_cluster_probe_failures_total{cluster="`+c+`"}`]
}

// clusterAvailable is the hub's availability gauge of cluster c (1 or 0).
func clusterAvailable(t *testing.T, c string) float64 {
	return hubMetrics(t)[`fleetinfer_hub_cluster_available{cluster="`+c+`"}`]
}

// hubClusters is the hub service's clusters and their shares as its status
// reports them.
func hubClusters(t *testing.T, ns, name string) string {
	t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	if err := fl.Hub.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
		t.Fatal(err)
	}
	shares := map[string]int32{}
	for _, c := range svc.Status.Clusters {
		shares[c.Name] = c.DesiredReplicas
	}
	return split(shares)
}
