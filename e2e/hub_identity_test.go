package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/deploy/crds"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// A second hub cluster (staging beside production, a disaster-recovery hub
// started early) registered with the same spokes, holding no services,
// collects orphans as eagerly as it can: it must leave the first hub's
// copies alone, because they carry the first hub's identity.
func TestASecondHubOnTheSameSpokesLeavesTheFirstHubsCopiesAlone(t *testing.T) {
	ctx := context.Background()
	ns, east, _ := firstHubsServiceInEast(t)
	load := startLoad(t, ns, "first-hubs", loadRate, 5*time.Minute, "east")
	pods := podUIDs(t, ns, "first-hubs")
	before := copiesIn(t, east, ns)
	if len(before) == 0 {
		t.Fatal("no copy of the first hub's service in east")
	}
	since := time.Now()

	second := startSecondHub(t)
	testutil.Eventually(t, 60*time.Second, "the second hub sees every spoke", func(ctx context.Context) error {
		m, err := metrics.Scrape(ctx, second.metrics)
		if err != nil {
			return err
		}
		for _, s := range fl.Spokes {
			if m[fmt.Sprintf("fleetinfer_hub_cluster_available{cluster=%q}", s.Name())] != 1 {
				return fmt.Errorf("%s not available to the second hub", s.Name())
			}
		}
		return nil
	})
	// The second hub sweeps for orphans every second with no grace period:
	// give it several sweeps.
	time.Sleep(5 * time.Second)
	after := copiesIn(t, east, ns)
	for name, rv := range before {
		switch got, ok := after[name]; {
		case !ok:
			t.Errorf("the second hub deleted the first hub's copy %s", name)
		case got != rv:
			t.Errorf("the second hub changed the first hub's copy %s (resourceVersion %s → %s)", name, rv, got)
		}
	}
	if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "first-hubs"}, &v1alpha2.LLMInferenceService{}); err != nil {
		t.Fatal(err)
	}
	hubReady(t, ns, "first-hubs", "east=1", 10*time.Second)
	seen := load.stop()
	// Both hubs write to the spokes as the hub's identity, and the first
	// one, settled, writes nothing there: any write in the namespace in a
	// spoke is the second hub's. (On its own hub cluster the first hub may
	// still update its objects' status; the second hub has a hub of its own.)
	var writes []string
	forEachHubWrite(t, since, func(cluster, verb, uri string, _ time.Time) {
		if cluster != fl.Hub.Name() && strings.Contains(uri, "/namespaces/"+ns+"/") {
			writes = append(writes, cluster+": "+verb+" "+uri)
		}
	})
	replaced := replacedPods(t, ns, "first-hubs", pods)
	reportFault("second-hub", "a second hub with no services on the same spokes for %.0f s: %d hub writes in the first hub's namespace in the spokes; %s; %d of %d pods replaced",
		time.Since(since).Seconds(), len(writes), seen, len(replaced), len(pods))
	if len(writes) > 0 {
		t.Errorf("hub writes to the first hub's objects while the second hub ran: %v", writes)
	}
	if seen.Failed > 0 {
		t.Errorf("%s", seen)
	}
	if len(replaced) > 0 {
		t.Errorf("pods replaced: %v", replaced)
	}
}

// A disaster-recovery hub started with the first hub's ID while the first
// one still runs (what --hub-id allows) finds the first hub's lease in
// every spoke: it writes nothing there, neither its own service's copy nor
// the deletion of the first hub's copies (which carry its ID, and which it
// sweeps for orphans every second with no grace), and it says why on its
// MemberClusters, in Warning Events and in a metric.
func TestASecondHubWithTheFirstHubsIDWritesNothingAndSaysWhy(t *testing.T) {
	ctx := context.Background()
	ns, east, cp := firstHubsServiceInEast(t)
	before := copiesIn(t, east, ns)
	id, first := cp.Labels[fleetv1alpha1.HubIDLabel], installation(t, fl.Hub.Client)
	since := time.Now()

	second := startSecondHub(t, "--hub-id="+id)
	began := time.Now()
	for cluster, msg := range leaseConditions(t, second.hub, fleetv1alpha1.ReasonHeldByAnotherHub) {
		if !strings.Contains(msg, first) || !strings.Contains(msg, "fleetinfer-hub-"+id) || !strings.Contains(msg, "--take-over-spoke-leases") {
			t.Errorf("%s: HubLeaseHeld says %q, want the first hub's installation %s, the lease and what to do", cluster, msg, first)
		}
	}
	standby := time.Since(began)
	leaseEvents(t, second.hub, fleetv1alpha1.ReasonHeldByAnotherHub)
	leaseMetric(t, second.metrics, 0)

	// The second hub's own service, placed where the first hub writes.
	if err := second.hub.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := fleet.BindEveryCluster(ctx, second.hub, ns); err != nil {
		t.Fatal(err)
	}
	svc := routedService(ns, "second-hubs", 1)
	for _, o := range []client.Object{&fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "second-hubs"},
		Spec: fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}}, Federation: noFederation,
			ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": svc.Name}}}}, svc} {
		if err := second.hub.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 60*time.Second, "the second hub's service says why east holds no copy", func(ctx context.Context) error {
		got := &v1alpha2.LLMInferenceService{}
		if err := second.hub.Get(ctx, client.ObjectKeyFromObject(svc), got); err != nil {
			return err
		}
		for _, c := range got.Status.Clusters {
			if c.Name == "east" && strings.Contains(c.Message, "writes nothing") && strings.Contains(c.Message, first) {
				return nil
			}
		}
		return fmt.Errorf("status.clusters %+v", got.Status.Clusters)
	})
	// Several orphan sweeps and reconciles of the second hub.
	time.Sleep(5 * time.Second)

	after := copiesIn(t, east, ns)
	for name, rv := range before {
		if after[name] != rv {
			t.Errorf("the first hub's copy %s changed or went (resourceVersion %s → %q)", name, rv, after[name])
		}
	}
	for _, s := range fl.Spokes {
		if _, ok := copiesIn(t, s, ns)["second-hubs"]; ok {
			t.Errorf("the second hub wrote its copy into %s", s.Name())
		}
	}
	var writes []string
	forEachHubWrite(t, since, func(cluster, verb, uri string, _ time.Time) {
		if cluster != fl.Hub.Name() && strings.Contains(uri, "/namespaces/"+ns+"/") {
			writes = append(writes, cluster+": "+verb+" "+uri)
		}
	})
	hubReady(t, ns, "first-hubs", "east=1", 10*time.Second)
	reportFault("second-hub-same-id", "a second hub with the first hub's ID: stood by in every spoke %.1f s after it was ready; %d hub writes in the service namespace in the spokes",
		standby.Seconds(), len(writes))
	if len(writes) > 0 {
		t.Errorf("hub writes in the spokes while the second hub ran: %v", writes)
	}
}

// A restored hub whose old hub still runs takes the spokes over only when
// told to (--take-over-spoke-leases): it holds every spoke's lease at once,
// the old hub stands by there and says so, and writes nothing, not even
// an edit of its own service. Once the new hub is gone, the old one takes
// the leases back when they expire, and catches up.
func TestARestoredHubTakesTheSpokesOverOnlyWhenTold(t *testing.T) {
	ctx := context.Background()
	ns, east, cp := firstHubsServiceInEast(t)
	key := client.ObjectKeyFromObject(cp)
	id := cp.Labels[fleetv1alpha1.HubIDLabel]

	// Its orphan grace is long: a restore is not missing the first hub's
	// service, this test only has no copy of it there.
	second := startSecondHub(t, "--hub-id="+id, "--take-over-spoke-leases", "--orphan-grace-period=1h")
	leaseConditions(t, second.hub, fleetv1alpha1.ReasonHubLeaseHeld)
	leaseMetric(t, second.metrics, 1)
	restored := installation(t, second.hub)
	for cluster, msg := range leaseConditions(t, fl.Hub.Client, fleetv1alpha1.ReasonHeldByAnotherHub) {
		if !strings.Contains(msg, restored) {
			t.Errorf("%s: the old hub's HubLeaseHeld says %q, want the restored hub's installation %s", cluster, msg, restored)
		}
	}
	leaseEvents(t, fl.Hub.Client, fleetv1alpha1.ReasonHeldByAnotherHub)

	svc := &v1alpha2.LLMInferenceService{}
	if err := fl.Hub.Client.Get(ctx, key, svc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(svc.DeepCopy())
	metav1.SetMetaDataLabel(&svc.ObjectMeta, "edited", "while-fenced")
	if err := fl.Hub.Client.Patch(ctx, svc, patch); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if got := copiesIn(t, east, ns)["first-hubs"]; got != cp.ResourceVersion {
		t.Errorf("the fenced old hub changed its copy (resourceVersion %s → %q)", cp.ResourceVersion, got)
	}

	second.stop()
	stopped := time.Now()
	leaseConditions(t, fl.Hub.Client, fleetv1alpha1.ReasonHubLeaseHeld)
	back := time.Since(stopped)
	leaseEvents(t, fl.Hub.Client, fleetv1alpha1.ReasonHubLeaseHeld)
	testutil.Eventually(t, 30*time.Second, "the old hub writes its edit", func(ctx context.Context) error {
		if err := east.Client.Get(ctx, key, cp); err != nil {
			return err
		}
		if cp.Labels["edited"] != "while-fenced" {
			return fmt.Errorf("copy labels %v", cp.Labels)
		}
		return nil
	})
	reportFault("hub-takeover", "a restored hub took every spoke over (--take-over-spoke-leases); stopped, the old hub held its leases again %.1f s later",
		back.Seconds())
}

// firstHubsServiceInEast places a service "first-hubs" of the fleet's hub
// in a new namespace on east and waits until it is ready; it returns the
// namespace, east and the copy there.
func firstHubsServiceInEast(t *testing.T) (string, *fleet.Cluster, *v1alpha2.LLMInferenceService) {
	t.Helper()
	ns := namespace(t, fl.Hub)
	place(t, routedService(ns, "first-hubs", 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}}, Federation: noFederation})
	hubReady(t, ns, "first-hubs", "east=1", 120*time.Second)
	east := fl.Spoke("east")
	cp := &v1alpha2.LLMInferenceService{}
	if err := east.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "first-hubs"}, cp); err != nil {
		t.Fatal(err)
	}
	return ns, east, cp
}

// installation is how the hub of cluster c names itself as a lease holder:
// its kube-system UID, then its namespace.
func installation(t *testing.T, c client.Client) string {
	t.Helper()
	ks := &corev1.Namespace{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: metav1.NamespaceSystem}, ks); err != nil {
		t.Fatal(err)
	}
	return string(ks.UID) + "/" + fleet.Namespace
}

// leaseConditions waits until the MemberCluster of every spoke on hub has
// its HubLeaseHeld condition with reason, and returns each one's message.
func leaseConditions(t *testing.T, hub client.Client, reason string) map[string]string {
	t.Helper()
	out := map[string]string{}
	testutil.Eventually(t, 90*time.Second, "HubLeaseHeld "+reason+" on every MemberCluster", func(ctx context.Context) error {
		for _, s := range fl.Spokes {
			mc := &fleetv1alpha1.MemberCluster{}
			if err := hub.Get(ctx, client.ObjectKey{Name: s.Name()}, mc); err != nil {
				return err
			}
			c := meta.FindStatusCondition(mc.Status.Conditions, fleetv1alpha1.MemberClusterHubLeaseHeld)
			if c == nil || c.Reason != reason {
				return fmt.Errorf("%s: HubLeaseHeld %+v", s.Name(), c)
			}
			out[s.Name()] = c.Message
		}
		return nil
	})
	return out
}

// leaseEvents waits for an Event with reason on the MemberCluster of every
// spoke on hub.
func leaseEvents(t *testing.T, hub client.Client, reason string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, reason+" Events", func(ctx context.Context) error {
		var events corev1.EventList
		if err := hub.List(ctx, &events); err != nil {
			return err
		}
		for _, s := range fl.Spokes {
			if !slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
				return e.InvolvedObject.Kind == "MemberCluster" && e.InvolvedObject.Name == s.Name() && e.Reason == reason
			}) {
				return fmt.Errorf("no %s Event on MemberCluster %s", reason, s.Name())
			}
		}
		return nil
	})
}

// leaseMetric waits until the hub whose metrics are at url reports want
// for fleetinfer_hub_spoke_lease_held of every spoke.
func leaseMetric(t *testing.T, url string, want float64) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, "fleetinfer_hub_spoke_lease_held", func(ctx context.Context) error {
		m, err := metrics.Scrape(ctx, url)
		if err != nil {
			return err
		}
		for _, s := range fl.Spokes {
			if got, ok := m[fmt.Sprintf("fleetinfer_hub_spoke_lease_held{cluster=%q}", s.Name())]; !ok || got != want {
				return fmt.Errorf("%s: %v (reported: %v), want %v", s.Name(), got, ok, want)
			}
		}
		return nil
	})
}

// copiesIn maps each hub-made service copy in the namespace to its
// resourceVersion.
func copiesIn(t *testing.T, c *fleet.Cluster, ns string) map[string]string {
	t.Helper()
	var list v1alpha2.LLMInferenceServiceList
	if err := c.Client.List(context.Background(), &list, client.InNamespace(ns),
		client.MatchingLabels{fleetv1alpha1.ManagedByLabel: fleetv1alpha1.ManagedByHub}); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, cp := range list.Items {
		out[cp.Name] = cp.ResourceVersion
	}
	return out
}

// secondHub is a hub beside the fleet's own: its metrics URL and a client
// of its hub cluster.
type secondHub struct {
	metrics string
	hub     client.Client
	stop    func()
}

// startSecondHub starts a hub cluster of its own, registers the fleet's
// spokes with it (the first hub's kubeconfig Secrets, copied), runs bin/hub
// against it with an orphan sweep every second, no grace period and args,
// and returns it. Everything stops when the test ends.
func startSecondHub(t *testing.T, args ...string) secondHub {
	t.Helper()
	ctx := context.Background()
	bins, err := binaries.Locate()
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.New(controlplane.Options{Name: "second-hub", Dir: t.TempDir(), Registry: fl.Registry,
		Binaries: controlplane.Binaries{Etcd: bins.Etcd, KubeAPIServer: bins.KubeAPIServer}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hubCRDs, err := fleet.HubCRDs()
	if err != nil {
		t.Fatal(err)
	}
	if err := crds.Install(ctx, cp.Admin(), hubCRDs); err != nil {
		t.Fatal(err)
	}
	hub, err := client.New(cp.Admin(), client.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := hub.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fleet.Namespace}}); err != nil {
		t.Fatal(err)
	}
	var regs corev1.SecretList
	if err := fl.Hub.Client.List(ctx, &regs, client.InNamespace(fleet.Namespace),
		client.MatchingLabels{fleet.KubeconfigSecretLabel: "true"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range regs.Items {
		reg := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, Labels: s.Labels}, Data: s.Data}
		if err := hub.Create(ctx, reg); err != nil {
			t.Fatal(err)
		}
	}
	free, err := ports.Free(2)
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(free[0]))
	probeAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(free[1]))
	p, _, err := fl.StartImage(ctx, fl.Image("hub"), process.Spec{Name: "second-hub/hub",
		LogPath: filepath.Join(cp.Dir(), "logs", "hub.log"),
		Args: append([]string{"--kubeconfig=" + cp.AdminKubeconfig(), "--cluster-namespace=" + fleet.Namespace,
			"--probe-interval=1s", "--orphan-collection-interval=1s", "--orphan-grace-period=0s",
			"--metrics-bind-address=" + metricsAddr, "--health-probe-bind-address=" + probeAddr}, args...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(controlplane.StopGrace) })
	if err := controlplane.WaitHTTP(ctx, p, http.DefaultClient, "http://"+probeAddr+"/readyz", time.Minute); err != nil {
		t.Fatal(err)
	}
	return secondHub{metrics: "http://" + metricsAddr + "/metrics", hub: hub, stop: func() { p.Stop(controlplane.StopGrace) }}
}
