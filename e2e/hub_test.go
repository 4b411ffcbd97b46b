package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	inferencexv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/hub/distribute"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// gpuService is a KServe LLMInferenceService whose replicas each request
// gpus GPUs of any product.
func gpuService(ns, name string, replicas int32, gpus int64) *v1alpha2.LLMInferenceService {
	return &v1alpha2.LLMInferenceService{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: v1alpha2.LLMInferenceServiceSpec{
			Model: v1alpha2.LLMModelSpec{URI: "hf://facebook/opt-125m", Name: ptr.To("opt")},
			WorkloadSpec: v1alpha2.WorkloadSpec{
				Replicas: ptr.To(replicas),
				Template: &corev1.PodSpec{Containers: []corev1.Container{{
					Name: "main", Image: "vllm/vllm-openai:v0.11.0",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
						accelerator.NVIDIA: *resource.NewQuantity(gpus, resource.DecimalSI)}},
				}}},
			},
		},
	}
}

// place applies a service and a placement that selects it on the hub, and
// deletes both when the test ends.
func place(t *testing.T, svc *v1alpha2.LLMInferenceService, spec fleetv1alpha1.InferencePlacementSpec) *fleetv1alpha1.InferencePlacement {
	t.Helper()
	ctx := context.Background()
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": svc.Name}}
	if spec.Failover.TolerationSeconds == nil {
		spec.Failover.TolerationSeconds = ptr.To(int32(5))
	}
	p := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: svc.Namespace}, Spec: spec}
	if err := fl.Hub.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := fl.Hub.Client.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fl.Hub.Client.Delete(ctx, svc)
		eventuallyNoCopies(t, svc.Namespace, svc.Name)
		_ = fl.Hub.Client.Delete(ctx, p)
		// Later tests count free GPUs: wait for the pods to go too.
		for _, s := range fl.Spokes {
			if s.Running() {
				noPods(t, s, svc.Namespace, map[string]string{"app.kubernetes.io/name": svc.Name})
			}
		}
	})
	return p
}

// copies reads each spoke's copy of a service: its replicas, or absent.
func copies(ctx context.Context, ns, name string) (map[string]int32, error) {
	out := map[string]int32{}
	for _, s := range fl.Spokes {
		if !s.Running() {
			continue // a stopped cluster holds nothing anyone can see
		}
		cp := &v1alpha2.LLMInferenceService{}
		err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cp)
		if client.IgnoreNotFound(err) != nil {
			return nil, err
		}
		if err == nil && cp.DeletionTimestamp.IsZero() {
			out[s.Name()] = ptr.Deref(cp.Spec.Replicas, 1)
		}
	}
	return out, nil
}

func split(m map[string]int32) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// hubReady waits for the hub service to be Ready with copies exactly as
// want ("cluster=replicas,..."), and returns it.
func hubReady(t *testing.T, ns, name, want string, timeout time.Duration) *v1alpha2.LLMInferenceService {
	t.Helper()
	svc := &v1alpha2.LLMInferenceService{}
	testutil.Eventually(t, timeout, "hub Ready with "+want, func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		got, err := copies(ctx, ns, name)
		if err != nil {
			return err
		}
		if split(got) != want {
			return fmt.Errorf("copies %s; hub: %s", split(got), hubConditions(svc))
		}
		if !svc.Status.IsTrue(v1alpha2.Ready) || !svc.Status.IsTrue(distribute.Distributed) {
			return fmt.Errorf("hub conditions: %s", hubConditions(svc))
		}
		return nil
	})
	return svc
}

func hubConditions(svc *v1alpha2.LLMInferenceService) string {
	var parts []string
	for _, c := range svc.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	for _, c := range svc.Status.Clusters {
		parts = append(parts, fmt.Sprintf("[%s %s %d/%d %s]", c.Name, c.Phase, c.ReadyReplicas, c.DesiredReplicas, c.Message))
	}
	return strings.Join(parts, "; ")
}

func eventuallyNoCopies(t *testing.T, ns, name string) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, "no copies left", func(ctx context.Context) error {
		got, err := copies(ctx, ns, name)
		if err != nil || len(got) > 0 {
			return fmt.Errorf("copies %s (%v)", split(got), err)
		}
		return nil
	})
}

// Each replica strategy lands the service where the placement says, pods run
// there, and the hub reports Ready with one entry per cluster. The fleet has
// 16 H100 (east), 8 A100 (west) and 4 L40S (central).
func TestHubPlacesServicesByStrategy(t *testing.T) {
	weights := []fleetv1alpha1.ClusterWeight{{Cluster: "east", Weight: 2}, {Cluster: "west", Weight: 1}}
	cases := []struct {
		name     string
		replicas int32
		gpus     int64
		sched    fleetv1alpha1.ReplicaScheduling
		want     string
	}{
		{"duplicated", 1, 1, fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Duplicated}, "central=1,east=1,west=1"},
		{"weighted", 1, 1, fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Weighted, Total: ptr.To(int32(3)), Weights: weights}, "east=2,west=1"},
		{"free-capacity", 1, 4, fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.FreeCapacity, Total: ptr.To(int32(7))}, "central=1,east=4,west=2"},
		// The preferred L40S cluster runs out of GPUs after one 4-GPU
		// replica; the rest spills to the next preferred cluster.
		{"overflow", 1, 4, fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Overflow, Total: ptr.To(int32(5)),
			Preference: []string{"central", "west", "east"}}, "central=1,east=2,west=2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			allGPUsFree(t)
			ns := namespace(t, fl.Hub)
			place(t, gpuService(ns, "svc-"+c.name, c.replicas, c.gpus), fleetv1alpha1.InferencePlacementSpec{Replicas: c.sched})
			svc := hubReady(t, ns, "svc-"+c.name, c.want, 90*time.Second)
			for _, e := range svc.Status.Clusters {
				if e.Phase != distribute.PhaseRunning || e.ReadyReplicas != e.DesiredReplicas || e.PlacementReason == "" {
					t.Errorf("cluster entry %+v", e)
				}
			}
			// The pods really run on that cluster's GPU nodes.
			for _, e := range svc.Status.Clusters {
				pods, err := podsOf(context.Background(), fl.Spoke(e.Name), ns, map[string]string{"app.kubernetes.io/name": "svc-" + c.name})
				if err != nil || int32(len(pods)) != e.DesiredReplicas {
					t.Errorf("%s: %d pods (%v), want %d", e.Name, len(pods), err, e.DesiredReplicas)
				}
			}
		})
	}
}

// Changing the placement moves replicas: the new cluster's copy is created
// and becomes ready before the old copy goes.
func TestHubMovesReplicasWhenThePlacementChanges(t *testing.T) {
	ns := namespace(t, fl.Hub)
	p := place(t, gpuService(ns, "mover", 2, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}},
		Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Duplicated}})
	hubReady(t, ns, "mover", "east=2", 60*time.Second)
	testutil.Eventually(t, 10*time.Second, "placement updated", func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		p.Spec.Clusters.Names = []string{"west"}
		return fl.Hub.Client.Update(ctx, p)
	})
	hubReady(t, ns, "mover", "west=2", 60*time.Second)
	testutil.Eventually(t, 10*time.Second, "placement status", func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		if len(p.Status.Services) != 1 || len(p.Status.Services[0].Clusters) != 1 || p.Status.Services[0].Clusters[0].Name != "west" {
			return fmt.Errorf("placement status %+v", p.Status)
		}
		return nil
	})
}

// Deleting the hub service removes every spoke copy.
func TestHubDeletesEveryCopyWithTheService(t *testing.T) {
	ns := namespace(t, fl.Hub)
	svc := gpuService(ns, "doomed", 1, 1)
	place(t, svc, fleetv1alpha1.InferencePlacementSpec{})
	hubReady(t, ns, "doomed", "central=1,east=1,west=1", 60*time.Second)
	if err := fl.Hub.Client.Delete(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	eventuallyNoCopies(t, ns, "doomed")
	testutil.Eventually(t, 30*time.Second, "hub object gone", func(ctx context.Context) error {
		err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), &v1alpha2.LLMInferenceService{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
}

// A spoke object of the same name that the hub did not create is reported
// on the hub and left exactly as it was.
func TestHubReportsButNeverOverwritesAForeignObject(t *testing.T) {
	ns := namespace(t, fl.Hub)
	ctx := context.Background()
	east := fl.Spoke("east")
	// East's own namespace, opted in: the conflict is the object's.
	if err := east.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{fleetv1alpha1.AcceptsHubLabel: hubID(t)}}}); err != nil {
		t.Fatal(err)
	}
	foreign := gpuService(ns, "contested", 3, 1)
	foreign.Labels = map[string]string{"owner": "east-team"}
	if err := east.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	place(t, gpuService(ns, "contested", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east", "west"}}})
	svc := &v1alpha2.LLMInferenceService{}
	testutil.Eventually(t, 30*time.Second, "conflict reported", func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "contested"}, svc); err != nil {
			return err
		}
		c := svc.Status.GetCondition(distribute.Distributed)
		if c == nil || c.Reason != distribute.ReasonConflict || !strings.Contains(c.Message, "east") {
			return fmt.Errorf("%s", hubConditions(svc))
		}
		return nil
	})
	if err := east.Client.Get(ctx, client.ObjectKeyFromObject(foreign), foreign); err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(foreign.Spec.Replicas, 0) != 3 || foreign.Labels[fleetv1alpha1.ManagedByLabel] != "" {
		t.Errorf("foreign object changed: replicas %v labels %v", foreign.Spec.Replicas, foreign.Labels)
	}
	got, err := copies(ctx, ns, "contested")
	if err != nil || got["west"] != 1 {
		t.Errorf("west copy: %v (%v)", got, err)
	}
	// The test's cleanup must not take the foreign object with it.
	t.Cleanup(func() { _ = east.Client.Delete(ctx, foreign) })
}

// auditWrites lists writes by the hub's identity in every cluster's audit
// log after since.
func auditWrites(t *testing.T, since time.Time) []string {
	t.Helper()
	var writes []string
	forEachHubWrite(t, since, func(cluster, verb, uri string, _ time.Time) {
		writes = append(writes, fmt.Sprintf("%s: %s %s", cluster, verb, uri))
	})
	return writes
}

// lastWrite is the time of the hub's last write after since.
func lastWrite(t *testing.T, since time.Time) time.Time {
	t.Helper()
	last := since
	forEachHubWrite(t, since, func(_, _, _ string, when time.Time) {
		if when.After(last) {
			last = when
		}
	})
	return last
}

func forEachHubWrite(t *testing.T, since time.Time, fn func(cluster, verb, uri string, when time.Time)) {
	t.Helper()
	for _, c := range append([]*fleet.Cluster{fl.Hub}, fl.Spokes...) {
		f, err := os.Open(c.AuditLog())
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e struct {
				Verb       string `json:"verb"`
				RequestURI string `json:"requestURI"`
				User       struct {
					Username string `json:"username"`
				} `json:"user"`
				Stage string    `json:"stage"`
				When  time.Time `json:"requestReceivedTimestamp"`
			}
			if json.Unmarshal(sc.Bytes(), &e) != nil || e.Stage != "ResponseComplete" || e.User.Username != fleet.HubUser || e.When.Before(since) {
				continue
			}
			// The hub replicas' leader election renews a Lease every few
			// seconds: that is not the hub writing what it manages.
			if strings.HasPrefix(e.RequestURI, "/apis/coordination.k8s.io/") {
				continue
			}
			fn(c.Name(), e.Verb, e.RequestURI, e.When)
		}
		f.Close()
	}
}

// Once services are placed and ready, the hub makes no writes at all while
// nothing changes: every cluster's audit log shows no create, update, patch
// or delete by the hub over 60 s.
func TestHubSteadyStateMakesNoWrites(t *testing.T) {
	ns := namespace(t, fl.Hub)
	// steady-a has an endpoint picker: its pool is exported and the pickers
	// federate, so those controllers are held to the same standard.
	a := gpuService(ns, "steady-a", 1, 1)
	a.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{}}
	place(t, a, fleetv1alpha1.InferencePlacementSpec{})
	place(t, gpuService(ns, "steady-b", 1, 2), fleetv1alpha1.InferencePlacementSpec{
		Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Weighted, Total: ptr.To(int32(3)),
			Weights: []fleetv1alpha1.ClusterWeight{{Cluster: "east", Weight: 2}, {Cluster: "west", Weight: 1}}}})
	hubReady(t, ns, "steady-a", "central=1,east=1,west=1", 60*time.Second)
	hubReady(t, ns, "steady-b", "east=2,west=1", 60*time.Second)
	testutil.Eventually(t, 30*time.Second, "complete peer directories", func(ctx context.Context) error {
		for _, s := range fl.Spokes {
			if d, err := directory(ctx, s, ns, "steady-a"); err != nil || len(d.Peers) != 2 {
				return fmt.Errorf("%s: %v %v", s.Name(), d, err)
			}
		}
		return nil
	})
	// Let in-flight status writes land before the quiet period starts.
	time.Sleep(3 * time.Second)
	start := time.Now()
	time.Sleep(60 * time.Second)
	if w := auditWrites(t, start); len(w) > 0 {
		t.Fatalf("the hub wrote %d times in a steady state:\n%s", len(w), strings.Join(w, "\n"))
	}
	if len(auditWrites(t, start.Add(-time.Hour))) == 0 {
		t.Fatal("no hub writes at all in the audit logs: the audit trail is not working")
	}
}

// exporters reads the exporting clusters of a pool's import in every spoke.
func exporters(ctx context.Context, ns, pool string) (map[string]string, error) {
	out := map[string]string{}
	for _, s := range fl.Spokes {
		imp := &inferencexv1alpha1.InferencePoolImport{}
		err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, imp)
		if client.IgnoreNotFound(err) != nil {
			return nil, err
		}
		if err != nil {
			continue
		}
		var names []string
		for _, c := range imp.Status.Controllers {
			for _, e := range c.ExportingClusters {
				names = append(names, string(e.Name))
			}
		}
		sort.Strings(names)
		out[s.Name()] = strings.Join(names, "+")
	}
	return out, nil
}

// The pools of a placed service are exported: each exporting cluster's pool
// has an Exported parent entry, every member cluster has an
// InferencePoolImport naming the exporters, and the imports follow the
// placement until the service is gone.
func TestHubExportsPoolsAndImportsThemEverywhere(t *testing.T) {
	ns := namespace(t, fl.Hub)
	svc := gpuService(ns, "exported", 1, 1)
	svc.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{}}
	p := place(t, svc, fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east", "west"}}})
	pool := "exported-inference-pool"
	want := func(w map[string]string) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, fmt.Sprintf("imports %v", w), func(ctx context.Context) error {
			got, err := exporters(ctx, ns, pool)
			if err != nil {
				return err
			}
			if fmt.Sprint(got) != fmt.Sprint(w) {
				return fmt.Errorf("imports %v", got)
			}
			return nil
		})
	}
	want(map[string]string{"central": "east+west", "east": "east+west", "west": "east+west"})
	ip := &inferencev1.InferencePool{}
	if err := fl.Spoke("east").Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pool}, ip); err != nil {
		t.Fatal(err)
	}
	exported := false
	for _, ps := range ip.Status.Parents {
		if ps.ParentRef.Kind == "InferencePoolImport" && meta.IsStatusConditionTrue(ps.Conditions, "Exported") {
			exported = true
		}
	}
	if !exported {
		t.Errorf("east's pool has no Exported parent entry: %+v", ip.Status.Parents)
	}

	testutil.Eventually(t, 10*time.Second, "narrow placement", func(ctx context.Context) error {
		if err := fl.Hub.Client.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		p.Spec.Clusters.Names = []string{"west"}
		return fl.Hub.Client.Update(ctx, p)
	})
	want(map[string]string{"central": "west", "east": "west", "west": "west"})
	if err := fl.Hub.Client.Delete(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	want(map[string]string{})
}

// Losing a spoke's control plane moves its replicas to a healthy cluster
// within the placement's toleration plus 10 s, and its MemberCluster on the
// hub says it is unavailable; when the spoke comes back its MemberCluster is
// Available again, its stale copy goes (Rebalance: Never) and the fleet
// settles without churn.
func TestHubFailsOverALostSpokeAndSettlesWhenItReturns(t *testing.T) {
	ns := namespace(t, fl.Hub)
	const toleration = 5 * time.Second
	place(t, gpuService(ns, "resilient", 1, 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"central", "west"}},
		Replicas: fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.Overflow, Total: ptr.To(int32(2)),
			Preference: []string{"central", "west"}, Rebalance: "Never"},
		Failover: fleetv1alpha1.Failover{TolerationSeconds: ptr.To(int32(toleration / time.Second))},
	})
	hubReady(t, ns, "resilient", "central=2", 60*time.Second)

	central, west := fl.Spoke("central"), fl.Spoke("west")
	// The loss starts when the control plane starts going away, not when
	// Stop has finished taking it down.
	lost := time.Now()
	central.Stop()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			_ = central.Start(context.Background())
		}
	})
	testutil.Eventually(t, toleration+10*time.Second, "replicas re-placed on west", func(ctx context.Context) error {
		cp := &v1alpha2.LLMInferenceService{}
		if err := west.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "resilient"}, cp); err != nil {
			return err
		}
		if r := ptr.Deref(cp.Spec.Replicas, 0); r != 2 {
			return fmt.Errorf("west copy has %d replicas", r)
		}
		return nil
	})
	t.Logf("replicas re-placed %s after the control plane began to stop (toleration %s)", time.Since(lost).Round(100*time.Millisecond), toleration)
	if c := memberAvailable(t, "central", metav1.ConditionFalse, 10*time.Second); c.Reason != fleetv1alpha1.ReasonClusterUnavailable {
		t.Errorf("central's MemberCluster: %+v", c)
	}
	testutil.Eventually(t, 60*time.Second, "west serving", func(ctx context.Context) error {
		cp := &v1alpha2.LLMInferenceService{}
		if err := west.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "resilient"}, cp); err != nil {
			return err
		}
		if !cp.Status.IsTrue(v1alpha2.Ready) {
			return fmt.Errorf("west copy not ready")
		}
		return nil
	})
	t.Logf("replacements ready %s after the loss", time.Since(lost).Round(100*time.Millisecond))

	if err := central.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	restarted = true
	back := time.Now()
	hubReady(t, ns, "resilient", "west=2", 90*time.Second)
	memberAvailable(t, "central", metav1.ConditionTrue, 30*time.Second)
	// Settling takes a few writes (the stale copy's deletion, status);
	// churn would be writes that never stop. Require a quiet 15 s within a
	// minute of the return.
	testutil.Eventually(t, 60*time.Second, "15 s without hub writes", func(context.Context) error {
		w := auditWrites(t, back)
		if len(w) > 0 && time.Since(lastWrite(t, back)) < 15*time.Second {
			return fmt.Errorf("%d writes since the cluster returned, the last %s ago", len(w), time.Since(lastWrite(t, back)).Round(time.Second))
		}
		if time.Since(back) < 15*time.Second {
			return fmt.Errorf("waiting")
		}
		return nil
	})
	t.Logf("settled with %d hub writes after the cluster returned: %s", len(auditWrites(t, back)), strings.Join(auditWrites(t, back), "; "))
}
