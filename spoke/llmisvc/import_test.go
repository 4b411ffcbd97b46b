package llmisvc_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	igwapixv1alpha1 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

// hubImport plays the hub's export controller: an import of pool name
// listing the exporting clusters.
func hubImport(t *testing.T, ns, name string, exporting ...string) *igwapixv1alpha1.InferencePoolImport {
	t.Helper()
	ctx := context.Background()
	imp := &igwapixv1alpha1.InferencePoolImport{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: fleetv1alpha1.ManagedByHubLabels()}}
	if err := c.Create(ctx, imp); err != nil {
		t.Fatal(err)
	}
	setExporting(t, imp, exporting...)
	return imp
}

// setExporting sets the hub's entry of the import.
func setExporting(t *testing.T, imp *igwapixv1alpha1.InferencePoolImport, exporting ...string) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, "hub's import entry", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(imp), imp); err != nil {
			return err
		}
		entry := igwapixv1alpha1.ImportController{Name: "fleetinfer.io/hub"}
		for _, e := range exporting {
			entry.ExportingClusters = append(entry.ExportingClusters, igwapixv1alpha1.ExportingCluster{Name: igwapixv1alpha1.ClusterName(e)})
		}
		i := slices.IndexFunc(imp.Status.Controllers, func(c igwapixv1alpha1.ImportController) bool { return c.Name == entry.Name })
		if i < 0 {
			imp.Status.Controllers = append(imp.Status.Controllers, entry)
		} else {
			imp.Status.Controllers[i] = entry
		}
		return c.Status().Update(ctx, imp)
	})
}

// routeToImport is an HTTPRoute on the default Gateway whose backend is
// the import.
func routeToImport(t *testing.T, ns, name, imp string) *gwapiv1.HTTPRoute {
	t.Helper()
	hr := &gwapiv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gwapiv1.HTTPRouteSpec{
			CommonRouteSpec: gwapiv1.CommonRouteSpec{ParentRefs: []gwapiv1.ParentReference{{
				Namespace: ptr.To(gwapiv1.Namespace(systemNS)), Name: "inference-gateway"}}},
			Rules: []gwapiv1.HTTPRouteRule{{BackendRefs: []gwapiv1.HTTPBackendRef{{BackendRef: gwapiv1.BackendRef{
				BackendObjectReference: gwapiv1.BackendObjectReference{Group: ptr.To(gwapiv1.Group("inference.networking.x-k8s.io")),
					Kind: ptr.To(gwapiv1.Kind("InferencePoolImport")), Name: gwapiv1.ObjectName(imp)}}}}}},
		}}
	if err := c.Create(context.Background(), hr); err != nil {
		t.Fatal(err)
	}
	return hr
}

// labelImport plays the hub, which labels an import it federates with the
// service and annotates it with the cluster.
func labelImport(t *testing.T, imp *igwapixv1alpha1.InferencePoolImport, service, cluster string) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, "label the import", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(imp), imp); err != nil {
			return err
		}
		imp.Labels[v1alpha2.LabelName] = service
		imp.Annotations = map[string]string{fleetv1alpha1.FederationClusterAnnotation: cluster}
		return c.Update(ctx, imp)
	})
}

// publishDirectory plays the hub, which publishes the picker's peer
// directory next to the import, owned by it.
func publishDirectory(t *testing.T, imp *igwapixv1alpha1.InferencePoolImport, service string) {
	t.Helper()
	dir := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: imp.Namespace, Name: fleetv1alpha1.PeerDirectoryName(service),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: igwapixv1alpha1.SchemeGroupVersion.String(), Kind: "InferencePoolImport", Name: imp.Name, UID: imp.UID}}},
		Data: map[string]string{fleetv1alpha1.PeerDirectoryKey: "peers: []\n"}}
	if err := c.Create(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
}

// importEntry waits for the import controller's entry to hold Accepted
// with status and reason (no entry at all when status is empty) and
// returns it.
func importEntry(t *testing.T, k client.ObjectKey, status metav1.ConditionStatus, reason string) *igwapixv1alpha1.ImportController {
	t.Helper()
	var got *igwapixv1alpha1.ImportController
	testutil.Eventually(t, waitTimeout, fmt.Sprintf("import entry Accepted=%s/%s", status, reason), func(ctx context.Context) error {
		imp := &igwapixv1alpha1.InferencePoolImport{}
		if err := c.Get(ctx, k, imp); err != nil {
			return err
		}
		i := slices.IndexFunc(imp.Status.Controllers, func(c igwapixv1alpha1.ImportController) bool {
			return c.Name == fleetv1alpha1.ImportControllerName
		})
		switch {
		case status == "" && i >= 0:
			return fmt.Errorf("entry still there: %+v", imp.Status.Controllers[i])
		case status == "":
			return nil
		case i < 0:
			return fmt.Errorf("no entry: %+v", imp.Status.Controllers)
		}
		got = &imp.Status.Controllers[i]
		a := meta.FindStatusCondition(got.Conditions, llmisvc.ImportConditionAccepted)
		if a == nil || a.Status != status || a.Reason != reason {
			return fmt.Errorf("Accepted %+v", a)
		}
		return nil
	})
	return got
}

// An HTTPRoute to an InferencePoolImport in a cluster with no copy of the
// service gets the import routed: the controller asks the hub to federate
// (its status entry, FederationPending), and once the hub has labelled the
// import and published the peer directory it runs a federated picker in
// Parent mode behind a pool of the import's name that selects no pod. The
// entry lists the route's Gateway and turns Accepted when the picker is
// available; without exporting clusters, or without the route, everything
// it made goes.
func TestRouteToAnImportRunsAFederatedPickerBehindAPoolOfItsName(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	ctx := context.Background()
	const pool = "shared-inference-pool"
	imp := hubImport(t, ns, pool, "east", "west")
	k := client.ObjectKeyFromObject(imp)
	hr := routeToImport(t, ns, "edge", pool)

	e := importEntry(t, k, metav1.ConditionFalse, llmisvc.ReasonFederationPending)
	if len(e.Parents) != 1 || string(e.Parents[0].ParentRef.Name) != "inference-gateway" || string(e.Parents[0].ParentRef.Namespace) != systemNS ||
		e.Parents[0].ParentRef.Kind != "Gateway" {
		t.Errorf("parents %+v, want the route's Gateway", e.Parents)
	}
	if err := c.Get(ctx, k, &igwapiv1.InferencePool{}); err == nil {
		t.Error("a pool exists before the hub federated the picker")
	}

	// The hub: the import's service and cluster, then the peer directory
	// next to it, owned by it.
	labelImport(t, imp, "shared", "edge")
	importEntry(t, k, metav1.ConditionFalse, llmisvc.ReasonFederationPending)
	publishDirectory(t, imp, "shared")

	p := &igwapiv1.InferencePool{}
	get(t, k, p)
	if fmt.Sprint(p.Spec.Selector.MatchLabels) != fmt.Sprint(map[igwapiv1.LabelKey]igwapiv1.LabelValue{llmisvc.ImportPoolLabel: pool}) ||
		string(p.Spec.EndpointPickerRef.Name) != "shared-epp-service" || !metav1.IsControlledBy(p, imp) {
		t.Errorf("pool %+v; want a selector no pod matches, the import's picker, owned by the import", p.Spec)
	}
	if p.Annotations[fleetv1alpha1.ExportAnnotation] != "" {
		t.Error("the import's pool is exported")
	}
	dep := &appsv1.Deployment{}
	get(t, key(ns, "shared-kserve-router-scheduler"), dep)
	main := dep.Spec.Template.Spec.Containers[0]
	for _, want := range []string{"--pool-name", pool, "--federation-cluster=edge", "--federation-mode=Parent", "--metrics-endpoint-auth=false",
		"--federation-peers-file=/etc/fleetinfer/federation/peers/peers.yaml"} {
		if !slices.Contains(main.Args, want) {
			t.Errorf("picker args %v lack %s", main.Args, want)
		}
	}
	if !slices.ContainsFunc(dep.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == fleetv1alpha1.FederationTLSName("shared")
	}) {
		t.Errorf("picker volumes %+v lack the federation certificate", dep.Spec.Template.Spec.Volumes)
	}
	get(t, key(ns, "shared-epp-service"), &corev1.Service{})
	importEntry(t, k, metav1.ConditionFalse, llmisvc.ReasonImportPickerNotReady)
	markAvailable(t, key(ns, "shared-kserve-router-scheduler"))
	e = importEntry(t, k, metav1.ConditionTrue, llmisvc.ReasonImportRouted)
	if a := meta.FindStatusCondition(e.Conditions, llmisvc.ImportConditionAccepted); !strings.Contains(a.Message, "east, west") {
		t.Errorf("Accepted message %q does not name the exporting clusters", a.Message)
	}
	// The hub's entry is the hub's.
	if err := c.Get(ctx, k, imp); err != nil {
		t.Fatal(err)
	}
	if len(imp.Status.Controllers) != 2 || len(imp.Status.Controllers[0].ExportingClusters) != 2 {
		t.Errorf("controllers %+v", imp.Status.Controllers)
	}

	setExporting(t, imp)
	importEntry(t, k, metav1.ConditionFalse, llmisvc.ReasonNoExportingClusters)
	gone(t, k, &igwapiv1.InferencePool{})
	gone(t, key(ns, "shared-kserve-router-scheduler"), &appsv1.Deployment{})

	setExporting(t, imp, "west")
	get(t, k, &igwapiv1.InferencePool{})
	if err := c.Delete(ctx, hr); err != nil {
		t.Fatal(err)
	}
	importEntry(t, k, "", "")
	gone(t, k, &igwapiv1.InferencePool{})
	gone(t, key(ns, "shared-kserve-router-scheduler"), &appsv1.Deployment{})
	gone(t, key(ns, "shared-epp-service"), &corev1.Service{})
}

// A pool of the import's name that the import controller did not make (a
// copy of the service arrived in the cluster, or a user's) serves the
// import: the controller's own pool and picker make way and are not
// recreated, and the entry says the import is served locally.
func TestLocalPoolOfTheImportsNameTakesOver(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	const pool = "local-inference-pool"
	imp := hubImport(t, ns, pool, "east")
	k := client.ObjectKeyFromObject(imp)
	routeToImport(t, ns, "edge", pool)
	labelImport(t, imp, "local", "edge")
	publishDirectory(t, imp, "local")
	get(t, key(ns, "local-kserve-router-scheduler"), &appsv1.Deployment{})

	// A copy of the service arrives.
	service(t, ns, `
metadata: {name: local}
spec:
  model: {uri: "hf://facebook/opt-125m", name: opt}
  router: {scheduler: {}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	importEntry(t, k, metav1.ConditionTrue, llmisvc.ReasonServedByLocalPool)
	testutil.Eventually(t, waitTimeout, "the copy's own pool", func(ctx context.Context) error {
		p := &igwapiv1.InferencePool{}
		if err := c.Get(ctx, k, p); err != nil {
			return err
		}
		if metav1.IsControlledBy(p, imp) {
			return fmt.Errorf("still the import's pool")
		}
		if p.Spec.Selector.MatchLabels[llmisvc.ImportPoolLabel] != "" {
			return fmt.Errorf("selector %v", p.Spec.Selector.MatchLabels)
		}
		return nil
	})
	d := &appsv1.Deployment{}
	get(t, key(ns, "local-kserve-router-scheduler"), d)
	if metav1.IsControlledBy(d, imp) {
		t.Error("the picker is still the import's")
	}
}
