package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/deploy/charts"
	"github.com/fleetinfer/fleetinfer/internal/ociimage"
	"github.com/fleetinfer/fleetinfer/internal/release"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// fleetinfer upgraded from one release to the next under load, as an
// operator does it with the release's artifacts: release N (the images
// every test runs) is installed — the spoke chart's archive with two
// controller replicas, hub.yaml, the spoke registered with the release's
// register-spoke.sh — and a routed service placed from the hub; then, while
// requests flow through the spoke's gateway, the chart of release N+1 (the
// same code built here as the next patch version) is applied over it, which
// rolls the controller and, through the picker preset, every picker, and the
// hub's replicas are replaced one by one with N+1's, each new one started
// before the old one stops, as its Deployment rolls. No request fails:
// the pickers roll with a surge, and the model servers are not touched.
func TestAnUpgradeUnderLoadFailsNoRequest(t *testing.T) {
	ctx := context.Background()
	inst := startInstallFleet(t)
	hub, spoke := inst.Hub, inst.Spokes[0]
	from, to := releases(t, inst)
	t.Logf("upgrading %s → %s", from.version, to.version)

	// Release N.
	applyChartArchive(t, spoke, from.Chart)
	controllers := map[string]string{"app.kubernetes.io/instance": "fleetinfer-spoke", "app.kubernetes.io/component": "controller"}
	runningImage(t, spoke, fleet.Namespace, controllers, 2, from.Images["spoke"])
	kubectl(t, "--kubeconfig", hub.AdminKubeconfig(), "apply", "--server-side", "-f", from.Hub)
	runTool(t, from.Register, spoke.Name(), spoke.AdminKubeconfig(), hub.AdminKubeconfig())
	hubs := startHubDeployment(t, inst, hubManifests(t, from.Hub))
	hubLeader(t, hubs)

	ns := namespace(t, hub)
	const name = "upgraded"
	svc := routedService(ns, name, 2)
	placement := &fleetv1alpha1.InferencePlacement{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: fleetv1alpha1.InferencePlacementSpec{ServiceSelector: &metav1.LabelSelector{MatchLabels: svc.Labels}}}
	for _, o := range []client.Object{svc, placement} {
		if err := hub.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	pickers := map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/component": "llminferenceservice-router-scheduler"}
	runningImage(t, spoke, ns, pickers, 1, from.Images["epp"])
	var servers map[types.UID]bool
	testutil.Eventually(t, 2*time.Minute, "two model servers ready", func(ctx context.Context) error {
		var err error
		if servers, err = readyPods(ctx, spoke, ns, name); err != nil || len(servers) != 2 {
			return fmt.Errorf("ready model server pods %v (%v)", servers, err)
		}
		return nil
	})

	// Bounded load: 10 requests a second for at most 4 minutes.
	load := startLoadVia(t, hub, ns, name, 10, 4*time.Minute)
	time.Sleep(3 * time.Second)
	began := time.Now()

	// Release N+1: the chart as `helm upgrade` applies it, then the hub.
	applyChartArchive(t, spoke, to.Chart)
	runningImage(t, spoke, fleet.Namespace, controllers, 2, to.Images["spoke"])
	runningImage(t, spoke, ns, pickers, 1, to.Images["epp"])
	kubectl(t, "--kubeconfig", hub.AdminKubeconfig(), "apply", "--server-side", "-f", to.Hub)
	image, args, _ := hubDeployment(t, hubManifests(t, to.Hub))
	if image != to.Images["hub"] {
		t.Fatalf("hub.yaml of %s runs %s, want %s", to.version, image, to.Images["hub"])
	}
	kubeconfig := serviceAccountKubeconfig(t, hub, fleet.Namespace, "fleetinfer-hub")
	for i, old := range hubs {
		hubs[i] = startHubReplica(t, inst, len(hubs)+i, image, args, kubeconfig)
		old.p.Stop(30 * time.Second)
	}
	hubLeader(t, hubs)
	upgraded := time.Since(began)

	// The service stays Ready on the new hub, which changes nothing that
	// serves.
	testutil.Eventually(t, 60*time.Second, "the hub service Ready under the new hub", func(ctx context.Context) error {
		cur := &v1alpha2.LLMInferenceService{}
		if err := hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cur); err != nil {
			return err
		}
		if !cur.Status.IsTrue(v1alpha2.Ready) || cur.Status.ObservedGeneration != cur.Generation {
			return fmt.Errorf("hub: %s", hubConditions(cur))
		}
		return nil
	})
	time.Sleep(5 * time.Second)
	got := load.stop()
	after, err := readyPods(ctx, spoke, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for uid := range servers {
		if after[uid] {
			kept++
		}
	}
	reportFault("upgrade", "%s → %s in %.1f s (controller, pickers, hub): %s; %d of %d model server pods kept",
		from.version, to.version, upgraded.Seconds(), got, kept, len(servers))
	if got.Failed > 0 {
		t.Errorf("%s during the upgrade", got)
	}
	if got.Sent < 100 {
		t.Errorf("only %d requests sent", got.Sent)
	}
	if kept != len(servers) {
		t.Errorf("the upgrade replaced %d of %d model server pods", len(servers)-kept, len(servers))
	}
}

// aRelease is a release's artifacts and its version.
type aRelease struct {
	release.Artifacts
	version string
}

// releases writes release N from the images every test runs and release
// N+1 (the next patch version) from images built here for this machine's
// platform, pushed to the fleet's registry.
func releases(t *testing.T, inst *fleet.Fleet) (aRelease, aRelease) {
	t.Helper()
	ctx := context.Background()
	root, err := binaries.Root()
	if err != nil {
		t.Fatal(err)
	}
	bins, err := binaries.Locate()
	if err != nil {
		t.Fatal(err)
	}
	c, err := charts.Load(charts.Spoke)
	if err != nil {
		t.Fatal(err)
	}
	current := c.Metadata.AppVersion
	next := nextPatch(t, current)
	layout := t.TempDir()
	began := time.Now()
	if _, err := ociimage.Build(ctx, ociimage.Options{Root: root, Out: layout, Version: next, Created: time.Unix(0, 0).UTC(),
		Platforms: []v1.Platform{{OS: "linux", Architecture: runtime.GOARCH}}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("images of %s built in %.1f s", next, time.Since(began).Seconds())
	if err := inst.PushImages(ctx, layout); err != nil {
		t.Fatal(err)
	}
	out := make([]aRelease, 2)
	for i, r := range []struct{ version, layout string }{{current, bins.Images}, {next, layout}} {
		a, err := release.Write(release.Options{Root: root, Version: r.version, Images: r.layout, Out: t.TempDir(), Created: time.Unix(0, 0).UTC()})
		if err != nil {
			t.Fatal(err)
		}
		out[i] = aRelease{Artifacts: a, version: r.version}
	}
	return out[0], out[1]
}

// nextPatch is vX.Y.(Z+1) of vX.Y.Z.
func nextPatch(t *testing.T, version string) string {
	t.Helper()
	i := strings.LastIndex(version, ".")
	z, err := strconv.Atoi(version[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("version %q is not vX.Y.Z", version)
	}
	return version[:i+1] + strconv.Itoa(z+1)
}

// applyChartArchive renders a packaged chart with two controller replicas
// and server-side applies it, as `helm install` and `helm upgrade` do.
func applyChartArchive(t *testing.T, spoke *fleet.Cluster, archive string) {
	t.Helper()
	c, err := loader.Load(archive)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := charts.Render(c, charts.Options{ReleaseName: "fleetinfer-spoke", Namespace: fleet.Namespace, Values: map[string]any{"replicas": 2}})
	if err != nil {
		t.Fatal(err)
	}
	serverSideApply(t, spoke.Client, "helm", objs)
}

func hubManifests(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := charts.ReadManifests(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// runningImage waits until exactly n pods match labels in ns, all Ready and
// all running image (the pod's main container), and no other pod does.
func runningImage(t *testing.T, c *fleet.Cluster, ns string, labels map[string]string, n int, image string) {
	t.Helper()
	testutil.Eventually(t, 3*time.Minute, fmt.Sprintf("%d pods of %v Ready with %s", n, labels, filepath.Base(image)), func(ctx context.Context) error {
		pods, err := podsOf(ctx, c, ns, labels)
		if err != nil {
			return err
		}
		ready := 0
		for _, p := range pods {
			if p.Spec.Containers[0].Image != image {
				return fmt.Errorf("pod %s runs %s", p.Name, p.Spec.Containers[0].Image)
			}
			if podReady(p) && p.DeletionTimestamp.IsZero() {
				ready++
			}
		}
		if ready != n || len(pods) != n {
			return fmt.Errorf("%d of %d pods ready", ready, len(pods))
		}
		return nil
	})
}
