package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	ns := namespace(t, fl.Hub)
	place(t, routedService(ns, "first-hubs", 1), fleetv1alpha1.InferencePlacementSpec{
		Clusters: fleetv1alpha1.ClusterAffinity{Names: []string{"east"}}, Federation: noFederation})
	hubReady(t, ns, "first-hubs", "east=1", 120*time.Second)
	east := fl.Spoke("east")
	load := startLoad(t, ns, "first-hubs", loadRate, 5*time.Minute, "east")
	pods := podUIDs(t, ns, "first-hubs")
	before := copiesIn(t, east, ns)
	if len(before) == 0 {
		t.Fatal("no copy of the first hub's service in east")
	}
	since := time.Now()

	second := startSecondHub(t)
	testutil.Eventually(t, 60*time.Second, "the second hub sees every spoke", func(ctx context.Context) error {
		m, err := metrics.Scrape(ctx, second)
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

// startSecondHub starts a hub cluster of its own, registers the fleet's
// spokes with it (the first hub's kubeconfig Secrets, copied), runs bin/hub
// against it with an orphan sweep every second and no grace period, and
// returns its metrics URL. Everything stops when the test ends.
func startSecondHub(t *testing.T) string {
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
		Args: []string{"--kubeconfig=" + cp.AdminKubeconfig(), "--cluster-namespace=" + fleet.Namespace,
			"--probe-interval=1s", "--orphan-collection-interval=1s", "--orphan-grace-period=0s",
			"--metrics-bind-address=" + metricsAddr, "--health-probe-bind-address=" + probeAddr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(controlplane.StopGrace) })
	if err := controlplane.WaitHTTP(ctx, p, http.DefaultClient, "http://"+probeAddr+"/readyz", time.Minute); err != nil {
		t.Fatal(err)
	}
	return "http://" + metricsAddr + "/metrics"
}
