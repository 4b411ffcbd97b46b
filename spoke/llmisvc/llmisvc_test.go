package llmisvc_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	igwapiv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	lwsv1 "sigs.k8s.io/lws/api/leaderworkerset/v1"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/spoke/llmisvc"
)

const singleNode = `
metadata: {name: opt}
spec:
  model: {uri: "hf://facebook/opt-125m", name: facebook/opt-125m}
  replicas: 2
  template:
    containers:
    - name: main
      image: vllm/vllm-openai:v0.11.0
      resources: {limits: {nvidia.com/gpu: "1"}}
`

func key(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

func container(pod corev1.PodSpec, name string) *corev1.Container {
	for i := range pod.Containers {
		if pod.Containers[i].Name == name {
			return &pod.Containers[i]
		}
	}
	return nil
}

// A single-node service becomes a Deployment (the preset's vLLM command with
// the service's image, the model fetched by the storage initializer) and the
// workload Service; it turns Ready when the Deployment is available, with an
// Event on the edge.
func TestSingleNodeServiceTurnsReadyWhenItsDeploymentIsAvailable(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	service(t, ns, singleNode)
	dep := &appsv1.Deployment{}
	get(t, key(ns, "opt-kserve"), dep)
	if *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %d, want 2", *dep.Spec.Replicas)
	}
	want := map[string]string{"app.kubernetes.io/part-of": "llminferenceservice", "app.kubernetes.io/name": "opt",
		"app.kubernetes.io/component": "llminferenceservice-workload", "kserve.io/component": "workload", "llm-d.ai/role": "both"}
	for k, v := range want {
		if dep.Spec.Template.Labels[k] != v {
			t.Errorf("pod label %s=%q, want %q", k, dep.Spec.Template.Labels[k], v)
		}
	}
	main := container(dep.Spec.Template.Spec, "main")
	if main == nil || main.Image != "vllm/vllm-openai:v0.11.0" || len(main.Command) < 3 || !strings.Contains(main.Command[2], `--served-model-name "facebook/opt-125m"`) {
		t.Fatalf("main container not composed from the preset and the service: %+v", main)
	}
	init := dep.Spec.Template.Spec.InitContainers
	if len(init) != 1 || init[0].Name != "storage-initializer" || !slices.Equal(init[0].Args, []string{"hf://facebook/opt-125m", "/mnt/models"}) {
		t.Errorf("storage initializer: %+v", init)
	}
	if _, ok := dep.Spec.Template.Annotations["serving.kserve.io/model-based-routing-enabled"]; ok {
		t.Error("the preset's routing switch reached the pods")
	}
	svcObj := &corev1.Service{}
	get(t, key(ns, "opt-kserve-workload-svc"), svcObj)
	if svcObj.Spec.Ports[0].Port != 8000 || svcObj.Spec.Selector["kserve.io/component"] != "workload" {
		t.Errorf("workload service %+v", svcObj.Spec)
	}
	condition(t, key(ns, "opt"), v1alpha2.MainWorkloadReady, corev1.ConditionFalse, "")
	condition(t, key(ns, "opt"), v1alpha2.Ready, corev1.ConditionFalse, "")

	markAvailable(t, key(ns, "opt-kserve"))
	svc := condition(t, key(ns, "opt"), v1alpha2.Ready, corev1.ConditionTrue, "")
	for _, typ := range []v1alpha2.ConditionType{v1alpha2.PresetsCombined, v1alpha2.WorkloadsReady, v1alpha2.RouterReady, v1alpha2.MainWorkloadReady} {
		if !svc.Status.IsTrue(typ) {
			t.Errorf("%s not True: %s", typ, conditions(svc))
		}
	}
	if got := svc.Status.AppliedConfigRefs; len(got) != 1 || got[0].Name != "kserve-config-llm-template" || got[0].Source != v1alpha2.AppliedConfigSourcePreset {
		t.Errorf("appliedConfigs %+v", got)
	}
	if svc.Status.URL == nil || *svc.Status.URL != "http://opt-kserve-workload-svc."+ns+".svc.cluster.local" {
		t.Errorf("url %v", svc.Status.URL)
	}
	if w := svc.Status.Workloads; w == nil || w.Primary == nil || w.Primary.Kind != "Deployment" || ptr.Deref(w.Primary.ReadyReplicas, 0) != 2 {
		t.Errorf("workloads %+v", w)
	}
	testutil.Eventually(t, waitTimeout, "Ready event", func(ctx context.Context) error {
		reasons, err := events(ctx, ns, "opt")
		if err != nil || !slices.Contains(reasons, "LLMInferenceServiceReady") || !slices.Contains(reasons, "Created") {
			return fmt.Errorf("events %v (%v)", reasons, err)
		}
		return nil
	})
}

// A worker makes the workload a LeaderWorkerSet whose group size comes from
// the parallelism; removing the worker replaces it with a Deployment.
func TestWorkerMakesALeaderWorkerSetAndRemovingItConverges(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, `
metadata: {name: dp}
spec:
  model: {uri: "hf://deepseek-ai/DeepSeek-R1"}
  replicas: 2
  parallelism: {data: 8, dataLocal: 4, expert: true}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
  worker: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	lws := &lwsv1.LeaderWorkerSet{}
	get(t, key(ns, "dp-kserve-mn"), lws)
	if ptr.Deref(lws.Spec.LeaderWorkerTemplate.Size, 0) != 2 || ptr.Deref(lws.Spec.Replicas, 0) != 2 {
		t.Errorf("size %v replicas %v, want 2 and 2", lws.Spec.LeaderWorkerTemplate.Size, lws.Spec.Replicas)
	}
	if l := lws.Spec.LeaderWorkerTemplate.LeaderTemplate.Labels["app.kubernetes.io/component"]; l != "llminferenceservice-workload-leader" {
		t.Errorf("leader component %q", l)
	}
	if l := lws.Spec.LeaderWorkerTemplate.WorkerTemplate.Labels["app.kubernetes.io/component"]; l != "llminferenceservice-workload-worker" {
		t.Errorf("worker component %q", l)
	}
	if l, ok := lws.Spec.LeaderWorkerTemplate.WorkerTemplate.Labels["kserve.io/component"]; ok {
		t.Errorf("workers behind a leader are in the pool selector (kserve.io/component=%s)", l)
	}
	worker := container(lws.Spec.LeaderWorkerTemplate.WorkerTemplate.Spec, "main")
	if worker == nil || !strings.Contains(strings.Join(worker.Command, " "), "--data-parallel-size 8") || !strings.Contains(strings.Join(worker.Command, " "), "--enable-expert-parallel") {
		t.Errorf("worker not rendered from the data-parallel preset: %+v", worker)
	}
	if err := c.Get(context.Background(), key(ns, "dp-kserve"), &appsv1.Deployment{}); err == nil {
		t.Error("single-node Deployment exists next to the LeaderWorkerSet")
	}
	condition(t, key(ns, "dp"), v1alpha2.WorkerWorkloadReady, corev1.ConditionFalse, "")

	testutil.Eventually(t, waitTimeout, "LWS available", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "dp-kserve-mn"), lws); err != nil {
			return err
		}
		lws.Status.ReadyReplicas = 2
		lws.Status.Conditions = []metav1.Condition{{Type: "Available", Status: metav1.ConditionTrue, Reason: "AllGroupsReady", LastTransitionTime: metav1.Now()}}
		return c.Status().Update(ctx, lws)
	})
	// LWS calls a group ready once its workers exist; the service waits
	// for them to be ready. The test plays LWS's pod controller, which
	// makes a worker StatefulSet per group.
	condition(t, key(ns, "dp"), v1alpha2.WorkerWorkloadReady, corev1.ConditionFalse, "WorkersNotReady")
	for i := range 2 {
		sts := workerStatefulSet(ns, "dp-kserve-mn", i)
		if err := c.Create(context.Background(), sts); err != nil {
			t.Fatal(err)
		}
		sts.Status.Replicas, sts.Status.ReadyReplicas = 1, 1
		if err := c.Status().Update(context.Background(), sts); err != nil {
			t.Fatal(err)
		}
	}
	condition(t, key(ns, "dp"), v1alpha2.Ready, corev1.ConditionTrue, "")

	testutil.Eventually(t, waitTimeout, "remove worker", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "dp"), svc); err != nil {
			return err
		}
		svc.Spec.Worker = nil
		return c.Update(ctx, svc)
	})
	gone(t, key(ns, "dp-kserve-mn"), &lwsv1.LeaderWorkerSet{})
	get(t, key(ns, "dp-kserve"), &appsv1.Deployment{})
	s := condition(t, key(ns, "dp"), v1alpha2.MainWorkloadReady, corev1.ConditionFalse, "")
	if s.Status.GetCondition(v1alpha2.WorkerWorkloadReady) != nil {
		t.Error("WorkerWorkloadReady still present after the worker was removed")
	}
}

// workerStatefulSet is the StatefulSet LWS makes for the workers of group i.
func workerStatefulSet(ns, lws string, i int) *appsv1.StatefulSet {
	labels := map[string]string{lwsv1.SetNameLabelKey: lws, lwsv1.GroupIndexLabelKey: fmt.Sprint(i)}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", lws, i), Namespace: ns, Labels: labels},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "vllm/vllm-openai:v0.11.0"}}}},
		},
	}
}

// Prefill adds a separate prefill Deployment (role prefill) and turns the
// main one into the decode side; both come from their presets.
func TestPrefillAddsAPrefillWorkload(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	service(t, ns, `
metadata: {name: pd}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  replicas: 2
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
  prefill:
    replicas: 1
    template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	decode, prefill := &appsv1.Deployment{}, &appsv1.Deployment{}
	get(t, key(ns, "pd-kserve"), decode)
	get(t, key(ns, "pd-kserve-prefill"), prefill)
	if decode.Spec.Template.Labels["llm-d.ai/role"] != "decode" || prefill.Spec.Template.Labels["llm-d.ai/role"] != "prefill" {
		t.Errorf("roles: decode %q, prefill %q", decode.Spec.Template.Labels["llm-d.ai/role"], prefill.Spec.Template.Labels["llm-d.ai/role"])
	}
	if prefill.Spec.Template.Labels["app.kubernetes.io/component"] != "llminferenceservice-workload-prefill" || *prefill.Spec.Replicas != 1 {
		t.Errorf("prefill deployment %v replicas %d", prefill.Spec.Template.Labels, *prefill.Spec.Replicas)
	}
	if cmd := strings.Join(container(prefill.Spec.Template.Spec, "main").Command, " "); !strings.Contains(cmd, "NixlConnector") {
		t.Errorf("prefill command not from the prefill preset: %s", cmd)
	}
	svc := condition(t, key(ns, "pd"), v1alpha2.PrefillWorkloadReady, corev1.ConditionFalse, "")
	var names []string
	for _, a := range svc.Status.AppliedConfigRefs {
		names = append(names, string(a.Name))
	}
	if !slices.Equal(names, []string{"kserve-config-llm-prefill-template", "kserve-config-llm-decode-template"}) {
		t.Errorf("applied presets %v", names)
	}
	markAvailable(t, key(ns, "pd-kserve"))
	markAvailable(t, key(ns, "pd-kserve-prefill"))
	condition(t, key(ns, "pd"), v1alpha2.Ready, corev1.ConditionTrue, "")
}

// With scheduler, route and gateway the router is wired end to end: the pool
// selects the workload pods and names the EPP Service, the EPP runs under its
// own service account with the pool's name, the HTTPRoute attaches to the
// default Gateway and sends to the pool. RouterReady follows the Gateway,
// the route's and the pool's acceptance and the EPP's availability.
func TestRouterWiresPoolPickerAndRouteAndFollowsTheGateway(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	service(t, ns, `
metadata: {name: routed}
spec:
  model: {uri: "hf://facebook/opt-125m", name: opt}
  router: {scheduler: {}, route: {}, gateway: {}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	pool := &igwapiv1.InferencePool{}
	get(t, key(ns, "routed-inference-pool"), pool)
	wantSel := map[igwapiv1.LabelKey]igwapiv1.LabelValue{"app.kubernetes.io/name": "routed", "app.kubernetes.io/part-of": "llminferenceservice", "kserve.io/component": "workload"}
	if fmt.Sprint(pool.Spec.Selector.MatchLabels) != fmt.Sprint(wantSel) {
		t.Errorf("pool selector %v", pool.Spec.Selector.MatchLabels)
	}
	if pool.Spec.EndpointPickerRef.Name != "routed-epp-service" || pool.Spec.EndpointPickerRef.Port.Number != 9002 ||
		pool.Spec.EndpointPickerRef.FailureMode != igwapiv1.EndpointPickerFailOpen || pool.Spec.TargetPorts[0].Number != 8000 {
		t.Errorf("pool picker ref %+v ports %+v", pool.Spec.EndpointPickerRef, pool.Spec.TargetPorts)
	}
	epp := &appsv1.Deployment{}
	get(t, key(ns, "routed-kserve-router-scheduler"), epp)
	args := strings.Join(container(epp.Spec.Template.Spec, "main").Args, " ")
	if !strings.Contains(args, "--pool-name routed-inference-pool") || !strings.Contains(args, "--pool-namespace "+ns) || !strings.Contains(args, "--secure-serving=false") {
		t.Errorf("epp args %s", args)
	}
	// A single picker is surged, never recreated: the old one serves until
	// the new one is Ready.
	if ru := epp.Spec.Strategy.RollingUpdate; epp.Spec.Template.Spec.ServiceAccountName != "routed-epp-sa" ||
		epp.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable.String() != "0" || ru.MaxSurge.String() != "1" {
		t.Errorf("epp sa %q strategy %+v", epp.Spec.Template.Spec.ServiceAccountName, epp.Spec.Strategy)
	}
	eppSvc := &corev1.Service{}
	get(t, key(ns, "routed-epp-service"), eppSvc)
	if eppSvc.Spec.Ports[0].Name != "grpc" || eppSvc.Spec.Ports[0].Port != 9002 || eppSvc.Spec.Selector["app.kubernetes.io/component"] != "llminferenceservice-router-scheduler" {
		t.Errorf("epp service %+v", eppSvc.Spec)
	}
	get(t, key(ns, "routed-epp-sa"), &corev1.ServiceAccount{})
	role := &rbacv1.Role{}
	get(t, key(ns, "routed-epp-role"), role)
	get(t, key(ns, "routed-epp-rb"), &rbacv1.RoleBinding{})
	route := &gwapiv1.HTTPRoute{}
	get(t, key(ns, "routed-kserve-route"), route)
	if p := route.Spec.ParentRefs[0]; p.Name != "inference-gateway" || ptr.Deref(p.Namespace, "") != systemNS {
		t.Errorf("route parent %+v", p)
	}
	if b := route.Spec.Rules[0].BackendRefs[0]; b.Name != "routed-inference-pool" || ptr.Deref(b.Kind, "") != "InferencePool" {
		t.Errorf("route backend %+v", b)
	}

	// No Gateway yet: reported by name, not stuck silently.
	svc := condition(t, key(ns, "routed"), v1alpha2.GatewaysReady, corev1.ConditionFalse, "RefsInvalid")
	if msg := svc.Status.GetCondition(v1alpha2.GatewaysReady).Message; !strings.Contains(msg, systemNS+"/inference-gateway") {
		t.Errorf("GatewaysReady message %q does not name the gateway", msg)
	}
	gw := programmedGateway(t, "inference-gateway")
	condition(t, key(ns, "routed"), v1alpha2.GatewaysReady, corev1.ConditionTrue, "")
	condition(t, key(ns, "routed"), v1alpha2.HTTPRoutesReady, corev1.ConditionFalse, "HTTPRoutesNotReady")

	acceptRoute(t, key(ns, "routed-kserve-route"), gw)
	condition(t, key(ns, "routed"), v1alpha2.HTTPRoutesReady, corev1.ConditionTrue, "")
	condition(t, key(ns, "routed"), v1alpha2.InferencePoolReady, corev1.ConditionFalse, "WaitingForGateway")
	acceptPool(t, key(ns, "routed-inference-pool"), gw)
	condition(t, key(ns, "routed"), v1alpha2.InferencePoolReady, corev1.ConditionTrue, "")

	condition(t, key(ns, "routed"), v1alpha2.SchedulerWorkloadReady, corev1.ConditionFalse, "SchedulerNotReady")
	markAvailable(t, key(ns, "routed-kserve-router-scheduler"))
	markAvailable(t, key(ns, "routed-kserve"))
	svc = condition(t, key(ns, "routed"), v1alpha2.Ready, corev1.ConditionTrue, "")
	if u := ptr.Deref(svc.Status.URL, ""); u != "http://127.0.0.9:8080/"+ns+"/routed" {
		t.Errorf("url %q, want the gateway's address and the path prefix", u)
	}
	if rs := svc.Status.Router; rs == nil || rs.Scheduler == nil || rs.Scheduler.InferencePool.Name != "routed-inference-pool" || len(rs.Gateways) != 1 {
		t.Errorf("router status %+v", rs)
	}
}

// programmedGateway creates (once) a Gateway in the system namespace and
// reports it Programmed with a loopback address, as a gateway controller
// would.
func programmedGateway(t *testing.T, name string) *gwapiv1.Gateway {
	t.Helper()
	ctx := context.Background()
	gw := &gwapiv1.Gateway{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: systemNS},
		Spec: gwapiv1.GatewaySpec{GatewayClassName: "test", Listeners: []gwapiv1.Listener{{Name: "http", Port: 8080, Protocol: gwapiv1.HTTPProtocolType}}}}
	if err := c.Create(ctx, gw); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, waitTimeout, "gateway programmed", func(ctx context.Context) error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(gw), gw); err != nil {
			return err
		}
		gw.Status.Addresses = []gwapiv1.GatewayStatusAddress{{Type: ptr.To(gwapiv1.IPAddressType), Value: "127.0.0.9"}}
		gw.Status.Conditions = []metav1.Condition{
			{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.Now(), ObservedGeneration: gw.Generation},
			{Type: "Programmed", Status: metav1.ConditionTrue, Reason: "Programmed", LastTransitionTime: metav1.Now(), ObservedGeneration: gw.Generation}}
		return c.Status().Update(ctx, gw)
	})
	return gw
}

func acceptRoute(t *testing.T, k client.ObjectKey, gw *gwapiv1.Gateway) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, "route accepted", func(ctx context.Context) error {
		r := &gwapiv1.HTTPRoute{}
		if err := c.Get(ctx, k, r); err != nil {
			return err
		}
		r.Status.Parents = []gwapiv1.RouteParentStatus{{
			ParentRef:      gwapiv1.ParentReference{Group: ptr.To(gwapiv1.Group("gateway.networking.k8s.io")), Kind: ptr.To(gwapiv1.Kind("Gateway")), Name: gwapiv1.ObjectName(gw.Name), Namespace: ptr.To(gwapiv1.Namespace(gw.Namespace))},
			ControllerName: "example.com/test",
			Conditions: []metav1.Condition{
				{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.Now(), ObservedGeneration: r.Generation},
				{Type: "ResolvedRefs", Status: metav1.ConditionTrue, Reason: "ResolvedRefs", LastTransitionTime: metav1.Now(), ObservedGeneration: r.Generation}},
		}}
		return c.Status().Update(ctx, r)
	})
}

func acceptPool(t *testing.T, k client.ObjectKey, gw *gwapiv1.Gateway) {
	t.Helper()
	testutil.Eventually(t, waitTimeout, "pool accepted", func(ctx context.Context) error {
		p := &igwapiv1.InferencePool{}
		if err := c.Get(ctx, k, p); err != nil {
			return err
		}
		p.Status.Parents = []igwapiv1.ParentStatus{{
			ParentRef:  igwapiv1.ParentReference{Group: ptr.To(igwapiv1.Group("gateway.networking.k8s.io")), Kind: "Gateway", Name: igwapiv1.ObjectName(gw.Name), Namespace: igwapiv1.Namespace(gw.Namespace)},
			Conditions: []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, Reason: "Accepted", LastTransitionTime: metav1.Now(), ObservedGeneration: p.Generation}},
		}}
		return c.Status().Update(ctx, p)
	})
}

// A scheduler without a route has no Gateway to wait for: its pool is ready
// once it exists (the never-Ready case of KServe issue #5986).
func TestPoolWithoutRouteDoesNotWaitForAGateway(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	service(t, ns, `
metadata: {name: noroute}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router: {scheduler: {}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	condition(t, key(ns, "noroute"), v1alpha2.InferencePoolReady, corev1.ConditionTrue, "")
	markAvailable(t, key(ns, "noroute-kserve-router-scheduler"))
	markAvailable(t, key(ns, "noroute-kserve"))
	svc := condition(t, key(ns, "noroute"), v1alpha2.Ready, corev1.ConditionTrue, "")
	if svc.Status.GetCondition(v1alpha2.GatewaysReady) != nil || svc.Status.GetCondition(v1alpha2.HTTPRoutesReady) != nil {
		t.Errorf("gateway/route conditions without a route: %s", conditions(svc))
	}
}

// Route refs replace the managed route: the managed HTTPRoute is deleted and
// readiness follows the user's route, reported by name while it is missing.
func TestRouteRefsReplaceTheManagedRoute(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, `
metadata: {name: byo}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router: {route: {}, gateway: {}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	get(t, key(ns, "byo-kserve-route"), &gwapiv1.HTTPRoute{})
	testutil.Eventually(t, waitTimeout, "switch to refs", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "byo"), svc); err != nil {
			return err
		}
		svc.Spec.Router.Route = &v1alpha2.GatewayRoutesSpec{HTTP: &v1alpha2.HTTPRouteSpec{Refs: []corev1.LocalObjectReference{{Name: "my-route"}}}}
		svc.Spec.Router.Gateway = &v1alpha2.GatewaySpec{Refs: []v1alpha2.GatewayObjectReference{{UntypedObjectReference: v1alpha2.UntypedObjectReference{Name: "my-gateway", Namespace: gwapiv1.Namespace(ns)}}}}
		return c.Update(ctx, svc)
	})
	gone(t, key(ns, "byo-kserve-route"), &gwapiv1.HTTPRoute{})
	s := condition(t, key(ns, "byo"), v1alpha2.HTTPRoutesReady, corev1.ConditionFalse, "RefsInvalid")
	if !strings.Contains(s.Status.GetCondition(v1alpha2.HTTPRoutesReady).Message, "my-route") {
		t.Errorf("message does not name the missing route: %s", conditions(s))
	}
	user := &gwapiv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: "my-route", Namespace: ns},
		Spec: gwapiv1.HTTPRouteSpec{CommonRouteSpec: gwapiv1.CommonRouteSpec{ParentRefs: []gwapiv1.ParentReference{{Name: "my-gateway"}}}}}
	if err := c.Create(context.Background(), user); err != nil {
		t.Fatal(err)
	}
	condition(t, key(ns, "byo"), v1alpha2.HTTPRoutesReady, corev1.ConditionFalse, "HTTPRoutesNotReady")
}

// A missing baseRef is reported as PresetsCombined=False/ConfigNotFound and
// the service recovers once the config exists.
func TestMissingBaseRefIsReportedAndRecovers(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	service(t, ns, `
metadata: {name: based}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  baseRefs: [{name: my-config}]
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	s := condition(t, key(ns, "based"), v1alpha2.PresetsCombined, corev1.ConditionFalse, "ConfigNotFound")
	if !strings.Contains(s.Status.GetCondition(v1alpha2.PresetsCombined).Message, "my-config") || s.Status.IsTrue(v1alpha2.Ready) {
		t.Errorf("conditions %s", conditions(s))
	}
	cfg := &v1alpha2.LLMInferenceServiceConfig{ObjectMeta: metav1.ObjectMeta{Name: "my-config", Namespace: ns},
		Spec: v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{Replicas: ptr.To(int32(3))}}}
	if err := c.Create(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	condition(t, key(ns, "based"), v1alpha2.PresetsCombined, corev1.ConditionTrue, "")
	dep := &appsv1.Deployment{}
	get(t, key(ns, "based-kserve"), dep)
	if *dep.Spec.Replicas != 3 {
		t.Errorf("replicas from the baseRef: %d, want 3", *dep.Spec.Replicas)
	}
}

// Presets lose to baseRefs, earlier baseRefs to later ones, and all of them to
// the service's own spec; containers and env merge by name.
// status.appliedConfigs records the chain in that order.
func TestConfigPrecedencePresetsThenBaseRefsThenSpec(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	ctx := context.Background()
	env := func(kv ...string) []corev1.EnvVar {
		var out []corev1.EnvVar
		for i := 0; i < len(kv); i += 2 {
			out = append(out, corev1.EnvVar{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, cfg := range []struct {
		name string
		env  []corev1.EnvVar
	}{{"cfg-a", env("A", "a", "B", "a")}, {"cfg-b", env("B", "b", "C", "b")}} {
		if err := c.Create(ctx, &v1alpha2.LLMInferenceServiceConfig{ObjectMeta: metav1.ObjectMeta{Name: cfg.name, Namespace: ns},
			Spec: v1alpha2.LLMInferenceServiceSpec{WorkloadSpec: v1alpha2.WorkloadSpec{
				Template: &corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Env: cfg.env}}}}}}); err != nil {
			t.Fatal(err)
		}
	}
	service(t, ns, `
metadata: {name: layered}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  baseRefs: [{name: cfg-a}, {name: cfg-b}]
  template:
    containers:
    - name: main
      image: vllm/vllm-openai:v0.11.0
      env: [{name: C, value: spec}]
`)
	dep := &appsv1.Deployment{}
	get(t, key(ns, "layered-kserve"), dep)
	got := map[string]string{}
	for _, e := range container(dep.Spec.Template.Spec, "main").Env {
		got[e.Name] = e.Value
	}
	want := map[string]string{"A": "a", "B": "b", "C": "spec", "VLLM_LOGGING_LEVEL": "INFO"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("env %s=%q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	s := condition(t, key(ns, "layered"), v1alpha2.PresetsCombined, corev1.ConditionTrue, "")
	var chain []string
	for _, a := range s.Status.AppliedConfigRefs {
		chain = append(chain, fmt.Sprintf("%s/%s:%s", a.Namespace, a.Name, a.Source))
	}
	wantChain := []string{systemNS + "/kserve-config-llm-template:Preset", ns + "/cfg-a:UserRef", ns + "/cfg-b:UserRef"}
	if !slices.Equal(chain, wantChain) {
		t.Errorf("appliedConfigs %v, want %v", chain, wantChain)
	}
}

// The stop annotation removes workloads and router objects and reports
// Stopped; removing it brings them back.
func TestStopAnnotationRoundTrip(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, `
metadata: {name: stoppable}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router: {scheduler: {}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	get(t, key(ns, "stoppable-kserve"), &appsv1.Deployment{})
	get(t, key(ns, "stoppable-inference-pool"), &igwapiv1.InferencePool{})
	setAnnotation := func(v *string) {
		testutil.Eventually(t, waitTimeout, "annotate", func(ctx context.Context) error {
			if err := c.Get(ctx, key(ns, "stoppable"), svc); err != nil {
				return err
			}
			if v == nil {
				delete(svc.Annotations, "serving.kserve.io/stop")
			} else {
				metav1.SetMetaDataAnnotation(&svc.ObjectMeta, "serving.kserve.io/stop", *v)
			}
			return c.Update(ctx, svc)
		})
	}
	setAnnotation(ptr.To("true"))
	for _, o := range []struct {
		name string
		obj  client.Object
	}{{"stoppable-kserve", &appsv1.Deployment{}}, {"stoppable-kserve-router-scheduler", &appsv1.Deployment{}},
		{"stoppable-inference-pool", &igwapiv1.InferencePool{}}, {"stoppable-kserve-workload-svc", &corev1.Service{}}, {"stoppable-epp-service", &corev1.Service{}}} {
		gone(t, key(ns, o.name), o.obj)
	}
	s := condition(t, key(ns, "stoppable"), v1alpha2.Ready, corev1.ConditionFalse, "Stopped")
	if s.Status.Workloads != nil {
		t.Errorf("workloads status kept while stopped: %+v", s.Status.Workloads)
	}
	setAnnotation(nil)
	get(t, key(ns, "stoppable-kserve"), &appsv1.Deployment{})
	get(t, key(ns, "stoppable-inference-pool"), &igwapiv1.InferencePool{})
	condition(t, key(ns, "stoppable"), v1alpha2.PresetsCombined, corev1.ConditionTrue, "")
}

// Left unset, replicas belong to whoever scales the Deployment (an HPA);
// setting them in the spec takes over again.
func TestUnsetReplicasKeepWhatAnAutoscalerSet(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, `
metadata: {name: scaled}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	dep := &appsv1.Deployment{}
	get(t, key(ns, "scaled-kserve"), dep)
	testutil.Eventually(t, waitTimeout, "autoscaler sets 5", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "scaled-kserve"), dep); err != nil {
			return err
		}
		dep.Spec.Replicas = ptr.To(int32(5))
		return c.Update(ctx, dep)
	})
	// Any change to the service makes the controller reconcile the
	// Deployment again.
	testutil.Eventually(t, waitTimeout, "label service", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "scaled"), svc); err != nil {
			return err
		}
		metav1.SetMetaDataLabel(&svc.ObjectMeta, "touched", "yes")
		svc.Spec.Labels = map[string]string{"team": "a"}
		return c.Update(ctx, svc)
	})
	testutil.Eventually(t, waitTimeout, "pod label applied, replicas kept", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "scaled-kserve"), dep); err != nil {
			return err
		}
		if dep.Spec.Template.Labels["team"] != "a" {
			return fmt.Errorf("not reconciled yet")
		}
		if *dep.Spec.Replicas != 5 {
			return fmt.Errorf("replicas %d, want the autoscaler's 5", *dep.Spec.Replicas)
		}
		return nil
	})
	testutil.Eventually(t, waitTimeout, "spec replicas 2", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "scaled"), svc); err != nil {
			return err
		}
		svc.Spec.Replicas = ptr.To(int32(2))
		return c.Update(ctx, svc)
	})
	testutil.Eventually(t, waitTimeout, "replicas 2", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "scaled-kserve"), dep); err != nil {
			return err
		}
		if *dep.Spec.Replicas != 2 {
			return fmt.Errorf("replicas %d", *dep.Spec.Replicas)
		}
		return nil
	})
}

// The scheduler config is inline or a ConfigMap ref, never both; the schema
// cannot see inline (KServe accepts an object or a YAML string), so the
// controller rejects the mix and resolves a ref into --config-text.
func TestSchedulerConfigInlineOrRef(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	service(t, ns, `
metadata: {name: both}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router:
    scheduler:
      config:
        inline: {apiVersion: inference.networking.x-k8s.io/v1alpha1, kind: EndpointPickerConfig}
        ref: {name: epp-config, key: epp}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	s := condition(t, key(ns, "both"), v1alpha2.PresetsCombined, corev1.ConditionFalse, "InvalidSchedulerConfig")
	if !strings.Contains(s.Status.GetCondition(v1alpha2.PresetsCombined).Message, "both inline and ref are set") {
		t.Errorf("message %q", s.Status.GetCondition(v1alpha2.PresetsCombined).Message)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "epp-config", Namespace: ns}, Data: map[string]string{"epp": `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
`}}
	if err := c.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	service(t, ns, `
metadata: {name: byref}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router:
    scheduler:
      config: {ref: {name: epp-config, key: epp}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	epp := &appsv1.Deployment{}
	get(t, key(ns, "byref-kserve-router-scheduler"), epp)
	args := container(epp.Spec.Template.Spec, "main").Args
	i := slices.Index(args, "--config-text")
	if i < 0 || !strings.Contains(args[i+1], "queue-scorer") {
		t.Errorf("--config-text not taken from the ConfigMap: %v", args)
	}
}

// Fields fleetinfer keeps but does not act on are named in an informational
// condition that does not block Ready.
func TestUnimplementedFieldsAreReportedNotDropped(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, `
metadata: {name: traced}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  tracing: {}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	s := condition(t, client.ObjectKeyFromObject(svc), v1alpha2.FieldsNotActedOn, corev1.ConditionTrue, "NotImplemented")
	if !strings.Contains(s.Status.GetCondition(v1alpha2.FieldsNotActedOn).Message, "spec.tracing") || s.Spec.Tracing == nil {
		t.Errorf("tracing dropped or not named: %s", conditions(s))
	}
	markAvailable(t, key(ns, "traced-kserve"))
	condition(t, client.ObjectKeyFromObject(svc), v1alpha2.Ready, corev1.ConditionTrue, "")
}

// Deleting a service leaves nothing behind: namespaced children go with
// their owner, the cluster-scoped auth binding of an EPP whose metrics
// endpoint authenticates callers goes through the finalizer.
func TestDeletingAServiceLeavesNothingBehind(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, `
metadata: {name: doomed}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router:
    route: {}
    gateway: {}
    scheduler:
      template:
        containers:
        - name: main
          args: [--pool-name, doomed-inference-pool, --pool-namespace, "{{ .ObjectMeta.Namespace }}"]
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	crb := &rbacv1.ClusterRoleBinding{}
	get(t, key("", ns+"-doomed-epp-auth-rb"), crb)
	get(t, key(ns, "doomed-kserve-route"), &gwapiv1.HTTPRoute{})
	if err := c.Delete(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	gone(t, key(ns, "doomed"), &v1alpha2.LLMInferenceService{})
	gone(t, key("", ns+"-doomed-epp-auth-rb"), &rbacv1.ClusterRoleBinding{})
	for _, o := range []struct {
		name string
		obj  client.Object
	}{{"doomed-kserve", &appsv1.Deployment{}}, {"doomed-kserve-router-scheduler", &appsv1.Deployment{}},
		{"doomed-inference-pool", &igwapiv1.InferencePool{}}, {"doomed-kserve-workload-svc", &corev1.Service{}},
		{"doomed-epp-service", &corev1.Service{}}, {"doomed-epp-sa", &corev1.ServiceAccount{}},
		{"doomed-epp-role", &rbacv1.Role{}}, {"doomed-epp-rb", &rbacv1.RoleBinding{}}, {"doomed-kserve-route", &gwapiv1.HTTPRoute{}}} {
		gone(t, key(ns, o.name), o.obj)
	}
}

// An object of the same name that the service does not control is never
// taken over; the conflict is reported on the service.
func TestForeignObjectIsNotTakenOver(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	ctx := context.Background()
	foreign := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "clash-kserve-workload-svc", Namespace: ns, Labels: map[string]string{"owner": "someone-else"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1234}}}}
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	service(t, ns, strings.ReplaceAll(singleNode, "name: opt}", "name: clash}"))
	s := condition(t, key(ns, "clash"), v1alpha2.MainWorkloadReady, corev1.ConditionFalse, "NotOwned")
	if !strings.Contains(s.Status.GetCondition(v1alpha2.MainWorkloadReady).Message, "clash-kserve-workload-svc") {
		t.Errorf("message does not name the Service: %s", conditions(s))
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(foreign), foreign); err != nil {
		t.Fatal(err)
	}
	if foreign.Spec.Ports[0].Port != 1234 || len(foreign.OwnerReferences) != 0 {
		t.Errorf("foreign service changed: %+v", foreign)
	}
}

// A copy the hub placed with federation on exposes its picker's federation
// port through a Service of type LoadBalancer and reports where other
// clusters reach it: the load balancer's address, as the cluster's
// load-balancer controller sets it (this suite plays that controller), and
// the Gateway's address. Until the load balancer has an address the copy
// reports none and says why in an Event; without federation it reports
// nothing and the Service goes.
func TestFederatedCopyReportsLoadBalancerAndGatewayAddresses(t *testing.T) {
	ctx := context.Background()
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, fmt.Sprintf(`
metadata: {name: fed, annotations: {%q: east}}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router: {scheduler: {}, route: {}, gateway: {refs: [{name: fed-gateway, namespace: %s}]}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`, fleetv1alpha1.FederationClusterAnnotation, systemNS))
	federation := func(want *v1alpha2.FederationStatus) *v1alpha2.LLMInferenceService {
		t.Helper()
		got := &v1alpha2.LLMInferenceService{}
		testutil.Eventually(t, waitTimeout, fmt.Sprintf("status.federation %+v", want), func(ctx context.Context) error {
			if err := c.Get(ctx, key(ns, "fed"), got); err != nil {
				return err
			}
			if !equality.Semantic.DeepEqual(got.Status.Federation, want) {
				return fmt.Errorf("have %+v", got.Status.Federation)
			}
			return nil
		})
		return got
	}
	federation(&v1alpha2.FederationStatus{})

	programmedGateway(t, "fed-gateway")
	federation(&v1alpha2.FederationStatus{GatewayAddress: "127.0.0.9:8080"})

	// The Service selects the picker's pods and sends the federation port to
	// the picker container's.
	epp := &appsv1.Deployment{}
	get(t, key(ns, "fed-kserve-router-scheduler"), epp)
	lb := &corev1.Service{}
	get(t, key(ns, fleetv1alpha1.FederationServiceName("fed")), lb)
	fedPort := slices.IndexFunc(container(epp.Spec.Template.Spec, "main").Ports, func(p corev1.ContainerPort) bool { return p.Name == "federation" })
	if lb.Spec.Type != corev1.ServiceTypeLoadBalancer || !metav1.IsControlledBy(lb, svc) || fedPort < 0 ||
		!equality.Semantic.DeepEqual(lb.Spec.Selector, epp.Spec.Selector.MatchLabels) || !equality.Semantic.DeepEqual(lb.Labels, epp.Labels) ||
		len(lb.Spec.Ports) != 1 || lb.Spec.Ports[0].Name != "federation" || lb.Spec.Ports[0].Port != 9004 ||
		lb.Spec.Ports[0].TargetPort.IntValue() != int(container(epp.Spec.Template.Spec, "main").Ports[fedPort].ContainerPort) {
		t.Fatalf("federation Service %+v, owners %v; want a LoadBalancer controlled by the copy, selecting the picker's pods, port federation 9004 to the picker's", lb.Spec, lb.OwnerReferences)
	}
	testutil.Eventually(t, waitTimeout, "FederationAddressPending event", func(ctx context.Context) error {
		reasons, err := events(ctx, ns, "fed")
		if err != nil {
			return err
		}
		if !slices.Contains(reasons, llmisvc.ReasonFederationAddressPending) {
			return fmt.Errorf("events %v", reasons)
		}
		return nil
	})
	setIngress := func(in corev1.LoadBalancerIngress) {
		t.Helper()
		testutil.Eventually(t, waitTimeout, "load-balancer status", func(ctx context.Context) error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(lb), lb); err != nil {
				return err
			}
			lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{in}
			return c.Status().Update(ctx, lb)
		})
	}
	setIngress(corev1.LoadBalancerIngress{IP: "127.0.1.5"})
	settled := federation(&v1alpha2.FederationStatus{PickerAddress: "127.0.1.5:9004", GatewayAddress: "127.0.0.9:8080"})

	// Settled: nothing more is written.
	time.Sleep(2 * time.Second)
	if err := c.Get(ctx, key(ns, "fed"), svc); err != nil {
		t.Fatal(err)
	}
	if svc.ResourceVersion != settled.ResourceVersion {
		t.Errorf("the settled service was written again: resourceVersion %s, then %s", settled.ResourceVersion, svc.ResourceVersion)
	}

	setIngress(corev1.LoadBalancerIngress{Hostname: "picker.east.example"})
	federation(&v1alpha2.FederationStatus{PickerAddress: "picker.east.example:9004", GatewayAddress: "127.0.0.9:8080"})

	testutil.Eventually(t, waitTimeout, "federation off", func(ctx context.Context) error {
		if err := c.Get(ctx, key(ns, "fed"), svc); err != nil {
			return err
		}
		delete(svc.Annotations, fleetv1alpha1.FederationClusterAnnotation)
		return c.Update(ctx, svc)
	})
	federation(nil)
	gone(t, key(ns, fleetv1alpha1.FederationServiceName("fed")), &corev1.Service{})
}

// A federated copy that names no Gateway is reached through the cluster's
// default one, which serves pools that no route names.
func TestFederatedCopyWithoutRouteReportsTheDefaultGateway(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	programmedGateway(t, "inference-gateway")
	service(t, ns, fmt.Sprintf(`
metadata: {name: fed, annotations: {%q: east}}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router: {scheduler: {}}
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`, fleetv1alpha1.FederationClusterAnnotation))
	testutil.Eventually(t, waitTimeout, "status.federation", func(ctx context.Context) error {
		svc := &v1alpha2.LLMInferenceService{}
		if err := c.Get(ctx, key(ns, "fed"), svc); err != nil {
			return err
		}
		if want := (v1alpha2.FederationStatus{GatewayAddress: "127.0.0.9:8080"}); svc.Status.Federation == nil || *svc.Status.Federation != want {
			return fmt.Errorf("have %+v, want %+v", svc.Status.Federation, want)
		}
		return nil
	})
}

// A service holds the finalizer only while it has a cluster-scoped child
// (its picker's auth-delegator binding, when the picker authenticates
// /metrics callers): the default picker has none, so deleting such a
// service, or its namespace, never waits for this controller.
func TestOnlyAServiceWithAClusterScopedChildHoldsTheFinalizer(t *testing.T) {
	ns := testutil.NewNamespace(t, c)
	svc := service(t, ns, `
metadata: {name: light}
spec:
  model: {uri: "hf://facebook/opt-125m"}
  router:
    scheduler:
      template:
        containers:
        - name: main
          args: [--pool-name, light-inference-pool, --metrics-endpoint-auth=false]
  template: {containers: [{name: main, image: vllm/vllm-openai:v0.11.0}]}
`)
	binding := key("", ns+"-light-epp-auth-rb")
	finalizer := func(want bool) {
		t.Helper()
		testutil.Eventually(t, waitTimeout, fmt.Sprintf("finalizer held: %v", want), func(ctx context.Context) error {
			if err := c.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
				return err
			}
			if got := slices.Contains(svc.Finalizers, llmisvc.Finalizer); got != want || svc.Status.ObservedGeneration != svc.Generation {
				return fmt.Errorf("finalizers %v at observed generation %d of %d", svc.Finalizers, svc.Status.ObservedGeneration, svc.Generation)
			}
			return nil
		})
	}
	setArgs := func(args ...string) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(svc), svc); err != nil {
				return err
			}
			svc.Spec.Router.Scheduler.Template.Containers[0].Args = args
			return c.Update(context.Background(), svc)
		}); err != nil {
			t.Fatal(err)
		}
	}
	get(t, key(ns, "light-kserve-router-scheduler"), &appsv1.Deployment{})
	finalizer(false)

	setArgs("--pool-name", "light-inference-pool")
	get(t, binding, &rbacv1.ClusterRoleBinding{})
	finalizer(true)

	setArgs("--pool-name", "light-inference-pool", "--metrics-endpoint-auth=false")
	gone(t, binding, &rbacv1.ClusterRoleBinding{})
	finalizer(false)
}
