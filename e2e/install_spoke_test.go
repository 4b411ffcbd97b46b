package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	helmaction "helm.sh/helm/v3/pkg/action"
	helmchart "helm.sh/helm/v3/pkg/chart"
	helmcli "helm.sh/helm/v3/pkg/cli"
	helmrelease "helm.sh/helm/v3/pkg/release"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/deploy/charts"
	"github.com/fleetinfer/fleetinfer/deploy/monitoring"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// The install tests run on a second, small fleet (a hub and one spoke, on
// loopback networks of its own) in which no controller runs as a plain
// process with an admin identity: everything fleetinfer runs there comes
// from the install manifests and runs under their ServiceAccounts.
func startInstallFleet(t *testing.T) *fleet.Fleet {
	t.Helper()
	spec := fleet.DefaultSpokes()[0]
	spec.Name = "install"
	f, err := fleet.Start(context.Background(), fleet.Options{
		Spokes:        []fleet.SpokeSpec{spec},
		NoControllers: true,
	})
	if err != nil {
		if f != nil {
			f.Stop()
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if bad := f.NotFromImages(); len(bad) > 0 {
			t.Errorf("fleetinfer components ran from binaries, not the registry's images: %v", bad)
		}
		f.Stop()
		if alive := f.Registry.Alive(); len(alive) > 0 {
			t.Errorf("install fleet left processes running: %v", alive)
		}
	})
	return f
}

// serverSideApply applies objects as `kubectl apply --server-side` does,
// CRDs first, and waits until every CRD is served.
func serverSideApply(t *testing.T, c client.Client, manager string, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	for _, crdsFirst := range []bool{true, false} {
		for _, o := range objs {
			if (o.GetKind() == "CustomResourceDefinition") != crdsFirst {
				continue
			}
			if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()), client.FieldOwner(manager)); err != nil {
				t.Fatalf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		}
		if crdsFirst {
			testutil.Eventually(t, 30*time.Second, "CRDs established", func(ctx context.Context) error {
				return crdsEstablished(ctx, c, objs)
			})
		}
	}
}

func crdsEstablished(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(o.GroupVersionKind())
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), cur); err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
		established := false
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			established = established || (m["type"] == "Established" && m["status"] == "True")
		}
		if !established {
			return fmt.Errorf("CRD %s not established", o.GetName())
		}
	}
	return nil
}

// podLog returns what a container of a pod run by the spoke's local kubelet
// has logged.
func podLog(t *testing.T, c *fleet.Cluster, pod *corev1.Pod, container string) string {
	t.Helper()
	dir := filepath.Join(c.Dir(), "kubelet", "pods", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID))
	b, err := os.ReadFile(filepath.Join(dir, container+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// scrape returns a Prometheus text exposition.
func scrape(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(b), err
}

// seriesNames returns the names of the series in a Prometheus text
// exposition.
func seriesNames(exposition string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(exposition, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out[line[:i]] = true
		}
	}
	return out
}

// exposesDashboardMetrics waits until the binary at url exposes every
// metric with one of the prefixes that the dashboard or the alerts query,
// except those that appear only after events this fleet does not produce
// (notYet). Gauges a binary refreshes periodically (GIE's pool averages,
// every 5 s) may take a while to appear.
func exposesDashboardMetrics(t *testing.T, what, url string, prefixes []string, notYet map[string]string) {
	t.Helper()
	used, err := monitoring.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for name := range used {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		if _, later := notYet[base]; !later && slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			want = append(want, name)
		}
	}
	if len(want) == 0 {
		t.Fatalf("no dashboard metric of %s to check", what)
	}
	slices.Sort(want)
	testutil.Eventually(t, 30*time.Second, what+" exposes the dashboard's metrics", func(ctx context.Context) error {
		exposition, err := scrape(ctx, url)
		if err != nil {
			return err
		}
		have := seriesNames(exposition)
		var missing []string
		for _, name := range want {
			if !have[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("missing %v", missing)
		}
		return nil
	})
}

// fleetinfer installed from its manifests on a fresh fleet, as a user does
// it, each part under its own ServiceAccount; see the subtests.
func TestInstallFromTheManifests(t *testing.T) {
	inst := startInstallFleet(t)
	if !t.Run("spoke chart runs the controller under its own ServiceAccount", func(t *testing.T) {
		installSpokeChart(t, inst.Spokes[0])
	}) {
		return
	}
	t.Run("hub manifests run the hub under its own ServiceAccount and a registered spoke's least privilege", func(t *testing.T) {
		installHub(t, inst)
	})
}

// installSpokeChart renders the per-cluster chart with the Helm SDK and
// server-side applies it to the spoke, with two replicas: the local kubelet
// runs its Deployment's image (ghcr.io/fleetinfer/spoke, pulled from the
// fleet's registry) with the pod's
// ServiceAccount token, so a leader being elected, KServe's CPU sample
// turning Ready and serving through the gateway, and the cluster's capacity
// report appearing prove the chart's generated RBAC is enough. The chart's
// presets are the ones in use: the controller is told not to install its
// own. The running controller and EPP expose what the dashboard queries.
func installSpokeChart(t *testing.T, spoke *fleet.Cluster) {
	ctx := context.Background()
	c, err := charts.Load(charts.Spoke)
	if err != nil {
		t.Fatal(err)
	}
	const release = "fleetinfer-spoke"
	objs, err := charts.Render(c, charts.Options{ReleaseName: release, Namespace: fleet.Namespace, Values: map[string]any{"replicas": 2}})
	if err != nil {
		t.Fatal(err)
	}
	serverSideApply(t, spoke.Client, "helm", objs)

	controllers := map[string]string{"app.kubernetes.io/instance": release, "app.kubernetes.io/component": "controller"}
	var pods []corev1.Pod
	testutil.Eventually(t, 90*time.Second, "two ready controller pods", func(ctx context.Context) error {
		if pods, err = podsOf(ctx, spoke, fleet.Namespace, controllers); err != nil {
			return err
		}
		ready := 0
		for _, p := range pods {
			if fedpool.PodReady(&p) && p.Spec.ServiceAccountName == release {
				ready++
			}
		}
		if ready != 2 || len(pods) != 2 {
			return fmt.Errorf("%d of %d pods ready under service account %s", ready, len(pods), release)
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, "a leader", func(ctx context.Context) error {
		return leaseHeld(ctx, spoke.Client, "fleetinfer-spoke")
	})
	cfg := &v1alpha2.LLMInferenceServiceConfig{}
	if err := spoke.Client.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: "kserve-config-llm-scheduler"}, cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Labels["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("scheduler preset labels %v: the controller overwrote the chart's presets", cfg.Labels)
	}

	epp := serveKServeCPUSample(t, spoke)

	testutil.Eventually(t, 30*time.Second, "capacity report", func(ctx context.Context) error {
		return spoke.Client.Get(ctx, client.ObjectKey{Name: "cluster"}, &fleetv1alpha1.ClusterCapacity{})
	})
	leaders := 0
	for _, p := range pods {
		url := "http://" + net.JoinHostPort(p.Status.PodIP, "8080") + "/metrics"
		metrics, err := scrape(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(metrics, `controller_runtime_reconcile_total{controller="llminferenceservice",result="success"}`) {
			leaders++
			exposesDashboardMetrics(t, "the spoke controller", url, []string{"controller_runtime_", "workqueue_"}, nil)
		}
		if err := spoke.Client.Get(ctx, client.ObjectKeyFromObject(&p), &p); err != nil {
			t.Fatal(err)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 {
				t.Errorf("controller pod %s restarted %d times", p.Name, cs.RestartCount)
			}
		}
		if log := podLog(t, spoke, &p, "manager"); strings.Contains(strings.ToLower(log), "forbidden") {
			t.Errorf("controller pod %s was refused something its RBAC should grant:\n%s", p.Name, log)
		}
	}
	if leaders != 1 {
		t.Errorf("%d controller pods reconciled services, want the one leader", leaders)
	}
	dryRunNonDefaultRenderings(t, spoke.Client, c)
	helmInstallAlongside(t, spoke, c)
	exposesDashboardMetrics(t, "the endpoint picker", "http://"+net.JoinHostPort(epp.Status.PodIP, "9090")+"/metrics", []string{"fleetinfer_epp_", "inference_"}, map[string]string{
		"fleetinfer_epp_federation_lag_seconds":         "needs federation peers",
		"fleetinfer_epp_federation_remote_endpoints":    "needs federation peers",
		"fleetinfer_epp_federation_bytes_total":         "needs federation peers",
		"fleetinfer_epp_federation_updates_total":       "needs federation peers",
		"fleetinfer_epp_federation_stream_errors_total": "needs a failing peer",
		"fleetinfer_epp_federation_refused_total":       "needs a refused peer",
		"fleetinfer_epp_subset_hints_total":             "needs a Parent-mode request",
		"inference_objective_request_error_total":       "needs a failed request",
	})
}

// dryRunNonDefaultRenderings server-side applies renderings with
// non-default values as a dry run, so the API server validates every object
// (the federation-wired scheduler preset against the CRD's schema, the
// presets Role against RBAC's escalation check) without changing the
// installed release.
func dryRunNonDefaultRenderings(t *testing.T, c client.Client, chart *helmchart.Chart) {
	t.Helper()
	for _, values := range []map[string]any{
		{"federation": map[string]any{"enabled": true, "clusterName": "install", "mode": "Parent"},
			"epp": map[string]any{"extraArgs": []any{"--refresh-metrics-interval=100ms"}}},
		{"presets": map[string]any{"source": "controller"}, "replicas": 3, "image": map[string]any{"digest": "sha256:" + strings.Repeat("0", 64)}},
	} {
		objs, err := charts.Render(chart, charts.Options{ReleaseName: "fleetinfer-spoke", Namespace: fleet.Namespace, Values: values})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() == "CustomResourceDefinition" {
				continue
			}
			if err := c.Apply(context.Background(), client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("helm"),
				client.ForceOwnership, client.DryRunAll); err != nil {
				t.Errorf("values %v: %s %s: %v", values, o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// helmInstallAlongside installs and uninstalls a second release with Helm
// itself (the SDK's install and uninstall actions against the API server),
// with no replicas so that only one controller runs: the CRDs, present
// already, are left as they are, the release's objects are created, and
// uninstalling removes them but never the CRDs.
func helmInstallAlongside(t *testing.T, spoke *fleet.Cluster, chart *helmchart.Chart) {
	t.Helper()
	ctx := context.Background()
	const release = "fleetinfer-helm"
	settings := helmcli.New()
	settings.KubeConfig = spoke.AdminKubeconfig()
	cfg := &helmaction.Configuration{}
	if err := cfg.Init(settings.RESTClientGetter(), release, "secret", func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	crdKey := client.ObjectKey{Name: "llminferenceservices.serving.kserve.io"}
	if err := spoke.Client.Get(ctx, crdKey, crd); err != nil {
		t.Fatal(err)
	}
	crdVersion := crd.GetResourceVersion()

	install := helmaction.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = release, release, true
	rel, err := install.Run(chart, map[string]any{"replicas": 0})
	if err != nil {
		t.Fatal(err)
	}
	if rel.Info.Status != helmrelease.StatusDeployed {
		t.Errorf("release %s", rel.Info.Status)
	}
	if err := spoke.Client.Get(ctx, crdKey, crd); err != nil || crd.GetResourceVersion() != crdVersion {
		t.Errorf("helm install touched the existing CRD (%v)", err)
	}
	presetKey := client.ObjectKey{Namespace: release, Name: "kserve-config-llm-scheduler"}
	if err := spoke.Client.Get(ctx, presetKey, &v1alpha2.LLMInferenceServiceConfig{}); err != nil {
		t.Errorf("helm install: %v", err)
	}

	if _, err := helmaction.NewUninstall(cfg).Run(release); err != nil {
		t.Fatal(err)
	}
	if err := spoke.Client.Get(ctx, presetKey, &v1alpha2.LLMInferenceServiceConfig{}); !apierrors.IsNotFound(err) {
		t.Errorf("preset after helm uninstall: %v", err)
	}
	if err := spoke.Client.Get(ctx, crdKey, crd); err != nil {
		t.Errorf("helm uninstall removed a CRD: %v", err)
	}
}

// leaseHeld checks that the leader election lease of that name in the
// fleet's namespace has a holder.
func leaseHeld(ctx context.Context, c client.Client, name string) error {
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: name}, lease); err != nil {
		return err
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return fmt.Errorf("lease %s has no holder", name)
	}
	return nil
}
