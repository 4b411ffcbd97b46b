package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
)

// fleetKubeconfig writes the shared fleet's kubeconfig for the test.
func fleetKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := fl.WriteKubeconfig(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// cell is the value in column header of the first row whose first cell is
// key, in the first table of a command's output that has that column (its
// header line is in capitals); columns are found by their header's offset,
// so empty cells are read as empty.
func cell(t *testing.T, output, key, header string) string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(output, "\n"), "\n")
	h := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, header) && l == strings.ToUpper(l) })
	if h < 0 {
		t.Fatalf("no column %q in:\n%s", header, output)
	}
	start, end := strings.Index(lines[h], header), -1 // the last column runs to the end of its row
	if next := strings.IndexFunc(lines[h][start+len(header):], func(r rune) bool { return r != ' ' }); next >= 0 {
		// The next column starts where the spaces after this header end.
		end = start + len(header) + next
	}
	for _, l := range lines[h+1:] {
		if f := strings.Fields(l); len(f) > 0 && f[0] == key {
			if end < 0 {
				end = len(l)
			}
			return strings.TrimSpace(l[min(start, len(l)):min(end, len(l))])
		}
	}
	t.Fatalf("no row %q in:\n%s", key, output)
	return ""
}

// The fleet's health and a service's placement from kubectl alone: `kubectl
// get memberclusters` shows every spoke Available with its GPUs, `kubectl
// get llmisvc` on the hub shows how many clusters the service is placed on
// and ready in, and the kubectl-fleetinfer plugin (found by kubectl on the
// PATH) shows the clusters and the service (status), why each cluster was
// chosen or left out (explain), and where the requests that entered a
// cluster were served (traffic).
func TestOperatorSeesTheFleetFromKubectlAndThePlugin(t *testing.T) {
	kubeconfig := fleetKubeconfig(t)
	// kubectl looks a plugin up only when no flag comes before its name.
	kc := func(args ...string) string { return kubectl(t, append(args, "--kubeconfig", kubeconfig)...) }
	members := kc("--context", "hub", "get", "memberclusters")
	for _, s := range fl.Spokes {
		if got := cell(t, members, s.Name(), "AVAILABLE"); got != "True" {
			t.Errorf("%s AVAILABLE %q, want True:\n%s", s.Name(), got, members)
		}
		product := s.Spec.Nodes[0].GPUProduct
		if got := cell(t, members, s.Name(), "ACCELERATORS"); !strings.Contains(got, product) || !strings.Contains(got, "free") {
			t.Errorf("%s ACCELERATORS %q, want its %s with free/total:\n%s", s.Name(), got, product, members)
		}
	}

	ns := namespace(t, fl.Hub)
	const name = "observed"
	svc := gpuService(ns, name, 1, 1)
	svc.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{},
		Route: &v1alpha2.GatewayRoutesSpec{}, Gateway: &v1alpha2.GatewaySpec{}}
	place(t, svc, fleetv1alpha1.InferencePlacementSpec{Clusters: fleetv1alpha1.ClusterAffinity{
		Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "region", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"eu-central"}}}}}})
	ready := hubReady(t, ns, name, "east=1,west=1", 90*time.Second)

	services := kc("--context", "hub", "-n", ns, "get", "llmisvc")
	if c, r := cell(t, services, name, "CLUSTERS"), cell(t, services, name, "READY CLUSTERS"); c != "2" || r != "2" {
		t.Errorf("CLUSTERS %q READY CLUSTERS %q, want 2 and 2:\n%s", c, r, services)
	}

	status := kc("fleetinfer", "status")
	for _, want := range []string{ns + "  " + name, "east 1/1 Running, west 1/1 Running"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	for _, s := range fl.Spokes {
		if cell(t, status, s.Name(), "AVAILABLE") != "True" {
			t.Errorf("status: %s not available:\n%s", s.Name(), status)
		}
	}

	explain := kc("fleetinfer", "explain", "-n", ns, name)
	for cluster, want := range map[string][2]string{"east": {"chosen", "duplicated"}, "west": {"chosen", "duplicated"},
		"central": {"not eligible", "labels do not match"}} {
		if d, why := cell(t, explain, cluster, "DECISION"), cell(t, explain, cluster, "WHY"); d != want[0] || !strings.Contains(why, want[1]) {
			t.Errorf("explain %s: %q, %q; want %q, %q:\n%s", cluster, d, why, want[0], want[1], explain)
		}
	}

	const requests = 6
	var eastURL string
	for _, c := range ready.Status.Clusters {
		if c.Name == "east" {
			eastURL = c.URL
		}
	}
	for i := range requests {
		complete(t, eastURL, fmt.Sprintf(`{"model":"opt","prompt":"request %d","max_tokens":4}`, i))
	}
	var traffic string
	testutil.Eventually(t, 10*time.Second, "traffic counted", func(context.Context) error {
		traffic = kc("fleetinfer", "traffic", "-n", ns)
		return trafficRow(traffic, ns+"/"+name, "east", requests)
	})
	if err := trafficRow(traffic, ns+"/"+name, "west", 0); err != nil {
		t.Error(err)
	}
	t.Logf("kubectl fleetinfer traffic:\n%s", traffic)
}

// trafficRow checks the requests that entered cluster for service in the
// traffic table, and that they add up to 100 % across clusters.
func trafficRow(table, service, cluster string, want int) error {
	for _, l := range strings.Split(table, "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || f[0] != service || f[1] != cluster {
			continue
		}
		got, err := strconv.Atoi(f[2])
		if err != nil || got != want {
			return fmt.Errorf("%s entered %s %q times, want %d:\n%s", service, cluster, f[2], want, table)
		}
		return nil
	}
	return fmt.Errorf("no row for %s at %s:\n%s", service, cluster, table)
}

// memberAvailable waits until the MemberCluster of cluster has Available
// status want, and returns its condition.
func memberAvailable(t *testing.T, cluster string, want metav1.ConditionStatus, timeout time.Duration) metav1.Condition {
	t.Helper()
	var cond metav1.Condition
	testutil.Eventually(t, timeout, fmt.Sprintf("MemberCluster %s Available=%s", cluster, want), func(ctx context.Context) error {
		m := &fleetv1alpha1.MemberCluster{}
		if err := fl.Hub.Client.Get(ctx, client.ObjectKey{Name: cluster}, m); err != nil {
			return err
		}
		c := meta.FindStatusCondition(m.Status.Conditions, fleetv1alpha1.MemberClusterAvailable)
		if c == nil || c.Status != want {
			return fmt.Errorf("Available: %+v", c)
		}
		cond = *c
		return nil
	})
	return cond
}
