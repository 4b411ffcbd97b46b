package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/deploy/charts"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// kubectl runs the pinned kubectl.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	return runTool(t, "kubectl", args...)
}

// runTool runs a command with the pinned kubectl first on PATH (scripts such
// as register-spoke.sh call it), then bin/ (kubectl finds the
// kubectl-fleetinfer plugin there), and returns its output.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	bins, err := binaries.Locate()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(bins.KubeAPIServer)
	if name == "kubectl" {
		name = filepath.Join(dir, "kubectl")
	}
	cmd := exec.Command(name, args...)
	root, err := binaries.Root()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), "PATH="+strings.Join([]string{dir, filepath.Join(root, "bin"), os.Getenv("PATH")}, string(os.PathListSeparator)))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// serviceAccountKubeconfig writes a kubeconfig for a token of the
// ServiceAccount, as a pod of it would authenticate.
func serviceAccountKubeconfig(t *testing.T, c *fleet.Cluster, ns, name string) string {
	t.Helper()
	tr, err := c.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin := c.Admin()
	cfg := &rest.Config{Host: admin.Host, BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData}}
	path := filepath.Join(c.Dir(), name+".kubeconfig")
	if err := controlplane.WriteKubeconfig(path, c.Name(), cfg); err != nil {
		t.Fatal(err)
	}
	return path
}

// installHub applies deploy/hub to the hub with `kubectl apply
// --server-side -k`, registers the spoke with deploy/hub/register-spoke.sh
// (the hub then reaches it only with the spoke-access ClusterRole), and runs
// bin/hub with the Deployment's own flags under the hub's ServiceAccount.
// A KServe service with a placement, applied to the hub, is copied to the
// spoke, turns Ready there through the chart-installed spoke controller, and
// the hub reports it Ready: the hub's generated RBAC and the spoke-access
// rules are enough.
func installHub(t *testing.T, inst *fleet.Fleet) {
	ctx := context.Background()
	hub, spoke := inst.Hub, inst.Spokes[0]
	root, err := binaries.Root()
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, "--kubeconfig", hub.AdminKubeconfig(), "apply", "--server-side", "-k", filepath.Join(root, "deploy", "hub"))
	runTool(t, filepath.Join(root, "deploy", "hub", "register-spoke.sh"), spoke.Name(), spoke.AdminKubeconfig(), hub.AdminKubeconfig())

	// The hub cluster has no kubelet: run the Deployment's container as a
	// process, with its flags, on loopback ports.
	objs, err := charts.ParseManifests([]byte(kubectl(t, "kustomize", filepath.Join(root, "deploy", "hub"))))
	if err != nil {
		t.Fatal(err)
	}
	hubs := startHubDeployment(t, inst, objs)
	leader := hubLeader(t, hubs)

	ns := namespace(t, hub)
	svc := gpuService(ns, "installed", 1, 1)
	// With an endpoint picker, so that the hub also publishes its peer
	// directory and certificate, under the spoke-access admission policy.
	svc.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{}}
	placement := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: ns},
		Spec: fleetv1alpha1.InferencePlacementSpec{ServiceSelector: &metav1.LabelSelector{MatchLabels: svc.Labels}}}
	for _, o := range []client.Object{svc, placement} {
		if err := hub.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 90*time.Second, "hub service Ready from its spoke copy", func(ctx context.Context) error {
		cur := &v1alpha2.LLMInferenceService{}
		if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), cur); err != nil {
			return err
		}
		if !cur.Status.IsTrue(v1alpha2.Ready) {
			return fmt.Errorf("not Ready: %s", hubConditions(cur))
		}
		return spoke.Client.Get(ctx, client.ObjectKeyFromObject(svc), &v1alpha2.LLMInferenceService{})
	})
	testutil.Eventually(t, 30*time.Second, "federation objects published in the spoke", func(ctx context.Context) error {
		for _, o := range []client.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fleetv1alpha1.PeerDirectoryName(svc.Name)}},
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fleetv1alpha1.FederationTLSName(svc.Name)}},
		} {
			if err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
		}
		return nil
	})
	hubWritesOnlyItsOwn(t, spoke, ns)

	for _, h := range hubs {
		if b, err := os.ReadFile(h.log); err != nil || strings.Contains(strings.ToLower(string(b)), "forbidden") {
			t.Errorf("the hub was refused something its RBAC should grant (%v):\n%s", err, b)
		}
	}
	exposesDashboardMetrics(t, "the hub", leader.metrics, []string{"fleetinfer_hub_", "controller_runtime_", "workqueue_"}, map[string]string{
		"fleetinfer_hub_cluster_probe_failures_total": "needs an unreachable spoke",
		"fleetinfer_hub_exported_pool_clusters":       "needs a pool exported to another cluster",
	})
	if len(hubs) > 1 {
		standbyTakesOver(t, inst, hubs, leader, ns)
	}
	if err := hub.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 60*time.Second, "spoke copy removed with the hub service", func(ctx context.Context) error {
		err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(svc), &v1alpha2.LLMInferenceService{})
		if client.IgnoreNotFound(err) != nil || err == nil {
			return fmt.Errorf("copy still there (%v)", err)
		}
		return nil
	})
}

// startHubDeployment runs the hub Deployment of the hub's manifests objs:
// each replica a process of its image with its flags, under the hub's
// ServiceAccount (the hub cluster has no kubelet).
func startHubDeployment(t *testing.T, inst *fleet.Fleet, objs []*unstructured.Unstructured) []*hubReplica {
	t.Helper()
	image, args, replicas := hubDeployment(t, objs)
	t.Logf("the hub Deployment has %d replicas", replicas)
	hubs := make([]*hubReplica, replicas)
	for i := range hubs {
		hubs[i] = startHubReplica(t, inst, i, image, args, serviceAccountKubeconfig(t, inst.Hub, fleet.Namespace, "fleetinfer-hub"))
	}
	return hubs
}

// hubDeployment is the image, flags and replica count of the hub
// Deployment in the hub's manifests.
func hubDeployment(t *testing.T, objs []*unstructured.Unstructured) (image string, args []string, replicas int64) {
	t.Helper()
	replicas = 1
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == "fleetinfer-hub" {
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			args, _, _ = unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
			image, _, _ = unstructured.NestedString(containers[0].(map[string]any), "image")
			// Parsed YAML numbers may be int64 or float64.
			switch n, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas"); n := n.(type) {
			case int64:
				replicas = n
			case float64:
				replicas = int64(n)
			}
		}
	}
	if len(args) == 0 {
		t.Fatal("no hub Deployment in the hub's manifests")
	}
	return image, args, replicas
}

// hubReplica is one replica of the installed hub Deployment, run as a
// process: the hub cluster has no kubelet.
type hubReplica struct {
	p       *process.Process
	metrics string // its /metrics URL
	log     string
}

// startHubReplica runs the Deployment's image (pulled from the fleet's
// registry) with the Deployment's flags, on loopback
// ports, and waits until it is ready (a standby is ready too: it waits for
// the lease).
func startHubReplica(t *testing.T, inst *fleet.Fleet, i int, image string, deploymentArgs []string, kubeconfig string) *hubReplica {
	t.Helper()
	free, err := ports.Free(2)
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(free[0]))
	probeAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(free[1]))
	args := slices.Clone(deploymentArgs)
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "--metrics-bind-address="):
			args[i] = "--metrics-bind-address=" + metricsAddr
		case strings.HasPrefix(a, "--health-probe-bind-address="):
			args[i] = "--health-probe-bind-address=" + probeAddr
		}
	}
	h := &hubReplica{metrics: "http://" + metricsAddr + "/metrics",
		log: filepath.Join(inst.Hub.Dir(), "logs", fmt.Sprintf("hub-installed-%d.log", i))}
	h.p, _, err = inst.StartImage(context.Background(), image, process.Spec{Name: fmt.Sprintf("hub/hub-installed-%d", i), LogPath: h.log,
		Args: append(args, "--kubeconfig="+kubeconfig)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(h.log); t.Failed() && err == nil {
			t.Logf("hub replica %d log (last 8 KiB):\n%s", i, b[max(0, len(b)-8192):])
		}
	})
	if err := controlplane.WaitHTTP(context.Background(), h.p, http.DefaultClient, "http://"+probeAddr+"/readyz", time.Minute); err != nil {
		t.Fatal(err)
	}
	return h
}

// hubLeader waits until exactly one live replica reports that it leads
// (controller-runtime's leader_election_master_status) and returns it.
func hubLeader(t *testing.T, hubs []*hubReplica) *hubReplica {
	t.Helper()
	var leader *hubReplica
	testutil.Eventually(t, 60*time.Second, "one hub replica leading", func(ctx context.Context) error {
		var leading []*hubReplica
		for _, h := range hubs {
			if h.p.Exited() {
				continue
			}
			m, err := metrics.Scrape(ctx, h.metrics)
			if err != nil {
				return err
			}
			if m[`leader_election_master_status{name="fleetinfer-hub"}`] == 1 {
				leading = append(leading, h)
			}
		}
		if len(leading) != 1 {
			return fmt.Errorf("%d replicas lead", len(leading))
		}
		leader = leading[0]
		return nil
	})
	return leader
}

// standbyTakesOver kills the leading hub replica (SIGKILL: no lease release)
// and checks that another replica takes the lease and places a new service
// until it is Ready.
func standbyTakesOver(t *testing.T, inst *fleet.Fleet, hubs []*hubReplica, leader *hubReplica, ns string) {
	t.Helper()
	ctx := context.Background()
	killed := time.Now()
	leader.p.Kill()
	next := hubLeader(t, hubs)
	t.Logf("hub leader SIGKILLed; a standby leads %.1fs later (lease duration 15s)", time.Since(killed).Seconds())
	if next == leader {
		t.Fatal("the killed replica still leads")
	}
	svc := gpuService(ns, "after-failover", 1, 1)
	placement := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: ns},
		Spec: fleetv1alpha1.InferencePlacementSpec{ServiceSelector: &metav1.LabelSelector{MatchLabels: svc.Labels}}}
	for _, o := range []client.Object{svc, placement} {
		if err := inst.Hub.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 90*time.Second, "a service applied after the fail-over Ready", func(ctx context.Context) error {
		cur := &v1alpha2.LLMInferenceService{}
		if err := inst.Hub.Client.Get(ctx, client.ObjectKeyFromObject(svc), cur); err != nil {
			return err
		}
		if !cur.Status.IsTrue(v1alpha2.Ready) {
			return fmt.Errorf("not Ready: %s", hubConditions(cur))
		}
		return nil
	})
	t.Logf("service applied after the fail-over Ready %.1fs after the kill", time.Since(killed).Seconds())
}

// hubWritesOnlyItsOwn checks the spoke-access admission policy: acting as
// the hub's ServiceAccount in the spoke, a ConfigMap or Secret the hub did
// not label as its own cannot be created, changed or deleted, while one it
// labelled can.
func hubWritesOnlyItsOwn(t *testing.T, spoke *fleet.Cluster, ns string) {
	t.Helper()
	ctx := context.Background()
	cfg := rest.CopyConfig(spoke.Admin())
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + fleetv1alpha1.HubServiceAccountNamespace + ":fleetinfer-hub"}
	asHub, err := client.New(cfg, client.Options{Scheme: fleet.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "someone-elses"}, StringData: map[string]string{"k": "v"}}
	if err := spoke.Client.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	hubs := map[string]string{fleetv1alpha1.ManagedByLabel: fleetv1alpha1.ManagedByHub}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "fleet.fleetinfer.io/managed-by=fleetinfer-hub") {
			t.Errorf("the hub could %s: %v", what, err)
		}
	}
	refused("create an unlabelled ConfigMap", asHub.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "unlabelled"}}))
	relabelled := theirs.DeepCopy()
	relabelled.Labels = hubs
	refused("take over someone else's Secret by labelling it", asHub.Update(ctx, relabelled))
	refused("delete someone else's Secret", asHub.Delete(ctx, theirs))

	own := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hubs", Labels: hubs}}
	if err := asHub.Create(ctx, own); err != nil {
		t.Fatalf("the hub could not create a ConfigMap labelled as its own: %v", err)
	}
	own.Data = map[string]string{"k": "v"}
	if err := asHub.Update(ctx, own); err != nil {
		t.Errorf("the hub could not update its own ConfigMap: %v", err)
	}
	own.Labels = nil
	refused("drop its label from its own ConfigMap", asHub.Update(ctx, own))
	if err := asHub.Delete(ctx, own); err != nil {
		t.Errorf("the hub could not delete its own ConfigMap: %v", err)
	}
}
