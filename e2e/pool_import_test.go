package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	inferencexv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
)

// A cluster with no replicas of a service serves it through the service's
// InferencePoolImport, as GIE's multi-cluster proposal describes: an
// HTTPRoute on central's Gateway names the import of a service placed on
// east and west; the spoke's import controller runs a federated picker
// behind a pool of the import's name, and every completion sent to central's
// gateway is served by a pod of east or west (Parent mode: central's picker
// sends it to their gateway with its marks, and their picker picks
// locally). The import's status carries the hub's exporting clusters and
// the import controller's Gateway and Accepted condition; the exported
// pools keep their Exported condition.
func TestHTTPRouteToAnInferencePoolImportServesFromExportingClusters(t *testing.T) {
	ns := namespace(t, fl.Hub)
	const name = "imported"
	pool := name + "-inference-pool"
	svc := gpuService(ns, name, 1, 1)
	svc.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{},
		Route: &v1alpha2.GatewayRoutesSpec{}, Gateway: &v1alpha2.GatewaySpec{}}
	place(t, svc, fleetv1alpha1.InferencePlacementSpec{
		Clusters:   fleetv1alpha1.ClusterAffinity{Names: []string{"east", "west"}},
		Federation: fleetv1alpha1.Federation{Mode: fleetv1alpha1.FederationParent},
	})
	hubReady(t, ns, name, "east=1,west=1", 120*time.Second)
	central := fl.Spoke("central")
	testutil.Eventually(t, 60*time.Second, "central imports the pool from east and west", func(ctx context.Context) error {
		got, err := exporters(ctx, ns, pool)
		if err != nil {
			return err
		}
		if got["central"] != "east+west" {
			return fmt.Errorf("imports %v", got)
		}
		return nil
	})

	path := "/" + ns + "/" + name + "/v1/completions"
	hr := &gwapiv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "to-the-import"},
		Spec: gwapiv1.HTTPRouteSpec{
			CommonRouteSpec: gwapiv1.CommonRouteSpec{ParentRefs: []gwapiv1.ParentReference{{
				Namespace: ptr.To(gwapiv1.Namespace(fleet.Namespace)), Name: fleet.GatewayName}}},
			// The path of the exporting clusters' own routes: Parent mode
			// sends the request to their gateways as it came.
			Rules: []gwapiv1.HTTPRouteRule{{
				Matches: []gwapiv1.HTTPRouteMatch{{Path: &gwapiv1.HTTPPathMatch{Type: ptr.To(gwapiv1.PathMatchPathPrefix), Value: ptr.To(path)}}},
				BackendRefs: []gwapiv1.HTTPBackendRef{{BackendRef: gwapiv1.BackendRef{BackendObjectReference: gwapiv1.BackendObjectReference{
					Group: ptr.To(gwapiv1.Group(inferencexv1alpha1.SchemeGroupVersion.Group)), Kind: ptr.To(gwapiv1.Kind("InferencePoolImport")),
					Name: gwapiv1.ObjectName(pool)}}}},
			}},
		}}
	if err := central.Client.Create(context.Background(), hr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = central.Client.Delete(context.Background(), hr) })

	testutil.Eventually(t, 90*time.Second, "the import routed in central", func(ctx context.Context) error {
		imp := &inferencexv1alpha1.InferencePoolImport{}
		if err := central.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, imp); err != nil {
			return err
		}
		i := slices.IndexFunc(imp.Status.Controllers, func(c inferencexv1alpha1.ImportController) bool {
			return c.Name == fleetv1alpha1.ImportControllerName
		})
		if i < 0 {
			return fmt.Errorf("no import controller entry: %+v", imp.Status.Controllers)
		}
		e := imp.Status.Controllers[i]
		a := meta.FindStatusCondition(e.Conditions, "Accepted")
		if a == nil || a.Status != metav1.ConditionTrue {
			return fmt.Errorf("Accepted %+v", a)
		}
		if len(e.Parents) != 1 || string(e.Parents[0].ParentRef.Name) != fleet.GatewayName {
			return fmt.Errorf("parents %+v", e.Parents)
		}
		return nil
	})
	picker := pickerPod(t, central, ns, name)
	testutil.Eventually(t, 30*time.Second, "central's picker holds east's and west's pods", func(ctx context.Context) error {
		m, err := fedpool.EPPMetrics(ctx, picker)
		if err != nil {
			return err
		}
		for _, c := range []string{"east", "west"} {
			if n := m[fmt.Sprintf("fleetinfer_epp_federation_remote_endpoints{peer=%q}", c)]; n != 1 {
				return fmt.Errorf("%v endpoints of %s", n, c)
			}
		}
		return nil
	})

	// Which cluster each pod of the service runs in.
	podCluster := map[string]string{}
	for _, c := range fl.Spokes {
		pods, err := podsOf(context.Background(), c, ns, map[string]string{"app.kubernetes.io/name": name, "kserve.io/component": "workload"})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			podCluster[p.Name] = c.Name()
		}
	}
	served := map[string]int{}
	for i := range 20 {
		resp, body := gwPost(t, central.GatewayURL(), "imported.example", path,
			[]byte(fmt.Sprintf(`{"model":"opt","prompt":"through central's import %d","max_tokens":2}`, i)), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s: %s", i, resp.Status, body)
		}
		pod := resp.Header.Get(gwPodHeader)
		c, ok := podCluster[pod]
		if !ok || c == "central" {
			t.Fatalf("request %d served by pod %q (cluster %q); want a pod of east or west", i, pod, c)
		}
		served[c]++
	}
	t.Logf("served through central's import: %v", served)

	// Each exporting cluster's pool keeps the hub's Exported condition.
	for _, c := range []string{"east", "west"} {
		ip := &inferencev1.InferencePool{}
		if err := fl.Spoke(c).Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pool}, ip); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(ip.Status.Parents, func(ps inferencev1.ParentStatus) bool {
			return ps.ParentRef.Kind == "InferencePoolImport" && meta.IsStatusConditionTrue(ps.Conditions, "Exported")
		}) {
			t.Errorf("%s's pool has no Exported parent entry: %+v", c, ip.Status.Parents)
		}
	}

	// Without the route, central's pool and picker go.
	if err := central.Client.Delete(context.Background(), hr); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "central's import pool removed", func(ctx context.Context) error {
		err := central.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, &inferencev1.InferencePool{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return client.IgnoreNotFound(err)
	})
	noPods(t, central, ns, map[string]string{"app.kubernetes.io/name": name})
}
