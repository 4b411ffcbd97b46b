package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/gateway"
	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
)

// The gateway tests share one inference stack in the first spoke, built on
// first use: GIE's endpoint picker (bin/epp, run by the kubelet as a pod with
// its own ServiceAccount) in front of real model-server simulators.
//
//   - pool "llm": pods llm-a and llm-b, picker "llm-epp" (FailClose);
//   - pool "refusing": pod spare, which serves, and pod broken, which is
//     Ready but has nothing listening on the pool's target port; picker
//     "refusing-epp";
//   - pool "headless": llm-a and llm-b behind a picker Service that selects
//     no pod, for the failure modes.
//
// Both pickers pick one endpoint (GIE's default maxNumOfEndpoints), the only
// kind of pick deploy/envoy/envoy.yaml's ORIGINAL_DST cluster can dial.
var (
	gwStackOnce sync.Once
	gwStack     *inferenceStack
	gwStackErr  error
)

type inferenceStack struct {
	spoke   *fleet.Cluster
	ns      string
	llmPods []corev1.Pod // llm-a, llm-b
	llmEPP  string       // ip:port of the llm pool's picker
	spare   corev1.Pod
	broken  corev1.Pod
}

const (
	gwPodHeader = "X-Inference-Pod"
	gwModel     = "opt-125m"
	// gwPort is the model servers' port and the pools' target port.
	gwPort = 8000
)

func gatewayStack(t *testing.T) *inferenceStack {
	t.Helper()
	gwStackOnce.Do(func() {
		began := time.Now()
		gwStack, gwStackErr = newInferenceStack(context.Background(), fl.Spokes[0])
		if gwStackErr == nil {
			fmt.Printf("gateway inference stack (2 pickers, 4 model servers) ready in %.1fs\n", time.Since(began).Seconds())
		}
	})
	if gwStackErr != nil {
		t.Fatalf("inference stack: %v", gwStackErr)
	}
	return gwStack
}

func newInferenceStack(ctx context.Context, spoke *fleet.Cluster) (*inferenceStack, error) {
	s := &inferenceStack{spoke: spoke, ns: fmt.Sprintf("gateway-e2e-%d", time.Now().UnixNano()%100000)}
	objs := []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}}
	objs = append(objs, fedpool.EPPRBAC(s.ns)...)
	objs = append(objs,
		gwModelServer(s.ns, "llm-a", gwPort, map[string]string{"pool": "llm"}),
		gwModelServer(s.ns, "llm-b", gwPort, map[string]string{"pool": "llm"}),
		gwModelServer(s.ns, "spare", gwPort, map[string]string{"pool": "refusing"}),
		// broken serves on 8001 and is Ready by its probe there, but the
		// pool sends to 8000, where connections are refused.
		gwModelServer(s.ns, "broken", gwPort+1, map[string]string{"pool": "refusing"}),
	)
	objs = append(objs, gwEndpointPicker(s.ns, "llm-epp", "llm")...)
	objs = append(objs, gwEndpointPicker(s.ns, "refusing-epp", "refusing")...)
	objs = append(objs,
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "headless-epp", Namespace: s.ns}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "no-such-picker"},
			Ports:    []corev1.ServicePort{{Name: "grpc", Port: 9002, TargetPort: intstrFromString("grpc")}},
		}},
		gwInferencePool(s.ns, "llm", "llm", "llm-epp", inferencev1.EndpointPickerFailClose),
		gwInferencePool(s.ns, "refusing", "refusing", "refusing-epp", inferencev1.EndpointPickerFailClose),
		gwInferencePool(s.ns, "headless", "llm", "headless-epp", inferencev1.EndpointPickerFailOpen),
	)
	for _, o := range objs {
		if err := spoke.Client.Create(ctx, o); err != nil {
			return nil, fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	pods := map[string]corev1.Pod{}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for {
		var list corev1.PodList
		if err := spoke.Client.List(ctx, &list, client.InNamespace(s.ns)); err != nil {
			return nil, err
		}
		for _, p := range list.Items {
			if fedpool.PodReady(&p) {
				pods[p.Labels["app"]] = p
			}
		}
		if len(pods) == 6 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("ready pods after 90s: %v of 6", slices.Sorted(maps.Keys(pods)))
		case <-time.After(250 * time.Millisecond):
		}
	}
	s.llmPods = []corev1.Pod{pods["llm-a"], pods["llm-b"]}
	s.spare, s.broken = pods["spare"], pods["broken"]
	s.llmEPP = net.JoinHostPort(pods["llm-epp"].Status.PodIP, "9002")
	return s, nil
}

// gwModelServer is a one-pod vLLM Deployment serving on port.
func gwModelServer(ns, name string, port int32, extra map[string]string) *appsv1.Deployment {
	d := vllmDeployment(ns, name, 1)
	for k, v := range extra {
		d.Spec.Template.Labels[k] = v
	}
	c := &d.Spec.Template.Spec.Containers[0]
	for i, a := range c.Args {
		if a == "--port" {
			c.Args[i+1] = fmt.Sprint(port)
		}
	}
	c.Ports[0].ContainerPort = port
	// The stack lives for the whole suite: it holds no GPUs, so that tests
	// that count free GPUs (placement, multi-node groups) find them all.
	c.Resources = corev1.ResourceRequirements{}
	// Tokens 10 ms apart, so that a streamed completion arrives over time.
	c.Env = []corev1.EnvVar{{Name: "FLEETINFER_SIM_ARGS", Value: "--time-to-first-token=20ms --inter-token-latency=10ms"}}
	return d
}

// gwEPPConfig is GIE's default scoring without the prefix cache (whose
// affinity would make picks of identical prompts sticky), one endpoint per
// pick.
const gwEPPConfig = `{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"EndpointPickerConfig",` +
	`"plugins":[{"type":"queue-scorer"},{"type":"kv-cache-utilization-scorer"},{"name":"picker","type":"max-score-picker"}],` +
	`"schedulingProfiles":[{"name":"default","plugins":[{"pluginRef":"queue-scorer"},{"pluginRef":"kv-cache-utilization-scorer"},{"pluginRef":"picker"}]}]}`

// endpointPicker is GIE's EPP for one pool as its Helm chart deploys it.
func gwEndpointPicker(ns, name, pool string) []client.Object {
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{ServiceAccountName: "epp", Containers: []corev1.Container{{
					Name:  "epp",
					Image: fl.Image("epp"),
					Args: []string{"--pool-name=" + pool, "--pool-namespace=" + ns, "--grpc-port=9002", "--grpc-health-port=9003",
						"--metrics-port=9090", "--secure-serving=false", "--tracing=false", "--metrics-endpoint-auth=false",
						"--enable-pprof=false", "--refresh-metrics-interval=100ms", "--config-text=" + gwEPPConfig},
					Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 9002}, {Name: "grpc-health", ContainerPort: 9003}, {Name: "metrics", ContainerPort: 9090}},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 2, ProbeHandler: corev1.ProbeHandler{
						GRPC: &corev1.GRPCAction{Port: 9003, Service: ptr.To("envoy.service.ext_proc.v3.ExternalProcessor")}}},
				}}},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "grpc", Port: 9002, TargetPort: intstrFromString("grpc")}}},
	}
	return []client.Object{dep, svc}
}

func gwInferencePool(ns, name, selectPool, epp string, mode inferencev1.EndpointPickerFailureMode) *inferencev1.InferencePool {
	sel := map[inferencev1.LabelKey]inferencev1.LabelValue{"pool": inferencev1.LabelValue(selectPool)}
	return &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: inferencev1.InferencePoolSpec{
			Selector:    inferencev1.LabelSelector{MatchLabels: sel},
			TargetPorts: []inferencev1.Port{{Number: gwPort}},
			EndpointPickerRef: inferencev1.EndpointPickerRef{Name: inferencev1.ObjectName(epp),
				Port: &inferencev1.Port{Number: 9002}, FailureMode: mode},
		},
	}
}

func gwPoolBackend(name string) []gatewayv1.HTTPBackendRef {
	return []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{BackendObjectReference: gatewayv1.BackendObjectReference{
		Group: ptr.To(gatewayv1.Group(inferencev1.GroupName)), Kind: ptr.To(gatewayv1.Kind("InferencePool")), Name: gatewayv1.ObjectName(name)}}}}
}

func gwPrefixMatch(p string) []gatewayv1.HTTPRouteMatch {
	return []gatewayv1.HTTPRouteMatch{{Path: &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To(p)}}}
}

// gwCreateRoute creates r and waits until the Gateway accepted it and the
// gateway serves it.
func gwCreateRoute(t *testing.T, s *inferenceStack, r *gatewayv1.HTTPRoute) {
	t.Helper()
	if err := s.spoke.Client.Create(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "route accepted", func(ctx context.Context) error {
		if err := s.spoke.Client.Get(ctx, client.ObjectKeyFromObject(r), r); err != nil {
			return err
		}
		for _, p := range r.Status.Parents {
			if c := meta.FindStatusCondition(p.Conditions, string(gatewayv1.RouteConditionAccepted)); c != nil && c.ObservedGeneration == r.Generation {
				return nil
			}
		}
		return fmt.Errorf("parents %+v", r.Status.Parents)
	})
}

func gwCompletion(prompt string, stream bool, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{"model": gwModel, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true, "stream": stream})
	return b
}

var gwHTTPClient = &http.Client{Timeout: 30 * time.Second}

// post sends body to base+path with the given Host and extra headers.
func gwPost(t *testing.T, base, host, path string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := gwHTTPClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func (s *inferenceStack) llmEndpoints() []string {
	var out []string
	for _, p := range s.llmPods {
		out = append(out, net.JoinHostPort(p.Status.PodIP, fmt.Sprint(gwPort)))
	}
	return out
}

// The ext-proc client speaks to GIE's picker as Envoy does: the request
// headers and a body sent in several chunks get a pick whose header and
// envoy.lb metadata agree, naming one of the pool's endpoints, and
// the body back as streamed mutations; a subset hint confines the pick, and
// an empty one is refused with 503.
func TestExtProcPickAgreesInHeaderAndMetadataAndHonoursSubset(t *testing.T) {
	s := gatewayStack(t)
	c, err := extproc.Dial(s.llmEPP, extproc.WithChunkSize(40))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	body := gwCompletion("The ext-proc client sends this prompt in several chunks to the endpoint picker.", false, 4)
	req := func(subset []string) *extproc.Request {
		return &extproc.Request{Method: http.MethodPost, Path: "/v1/completions", Authority: "epp.test",
			Header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {fmt.Sprint(len(body))}},
			Body:   bytes.NewReader(body), Subset: subset}
	}
	var p *extproc.Pick
	testutil.Eventually(t, 20*time.Second, "picker picks", func(ctx context.Context) error {
		var err error
		if p, err = c.Pick(ctx, req(nil)); err != nil {
			return err
		}
		if p.Immediate != nil {
			return p.Immediate
		}
		return nil
	})
	lb, _ := p.DynamicMetadata.AsMap()[extproc.LBNamespace].(map[string]any)
	if lb[extproc.DestinationHeader] != p.Destination || p.Header.Get(extproc.DestinationHeader) != p.Destination {
		t.Errorf("header %q and metadata %v disagree", p.Header.Get(extproc.DestinationHeader), lb)
	}
	want := s.llmEndpoints()
	if len(p.Endpoints) != 1 || !slices.Contains(want, p.Destination) {
		t.Errorf("endpoints %v, want one of %v", p.Endpoints, want)
	}
	var sent, got map[string]any
	_ = json.Unmarshal(body, &sent)
	if err := json.Unmarshal(p.Body, &got); err != nil || fmt.Sprint(got) != fmt.Sprint(sent) {
		t.Errorf("body after mutation %q, want %s", p.Body, body)
	}
	if !p.ClearRouteCache || p.BodyChunks < 1 || p.Latency <= 0 || p.LatencyAfterBody > p.Latency {
		t.Errorf("clear_route_cache %v, body chunks %d, latency %s after body %s", p.ClearRouteCache, p.BodyChunks, p.Latency, p.LatencyAfterBody)
	}
	t.Logf("pick %s (after body %s), %d body bytes sent in %d-byte chunks, returned in %d chunk(s)",
		p.Latency, p.LatencyAfterBody, len(body), 40, p.BodyChunks)

	for _, only := range want {
		for range 4 {
			p, err := c.Pick(ctx, req([]string{only}))
			if err != nil || p.Immediate != nil || p.Primary() != only {
				t.Fatalf("subset %s: pick %+v, err %v", only, p, err)
			}
		}
	}
	p, err = c.Pick(ctx, req([]string{}))
	if err != nil || p.Immediate == nil || p.Immediate.Status != http.StatusServiceUnavailable {
		t.Fatalf("empty subset: pick %+v, err %v; want an immediate 503", p, err)
	}
}

// The whole exchange: the picked endpoint's streamed response passes through
// the picker chunk by chunk, and the picker's response-header mutation
// reaches the client.
func TestExtProcExchangeStreamsResponseThroughPicker(t *testing.T) {
	s := gatewayStack(t)
	c, err := extproc.Dial(s.llmEPP)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := gwCompletion("Stream me through the picker.", true, 12)
	ex, err := c.Start(context.Background(), &extproc.Request{Method: http.MethodPost, Path: "/v1/completions", Authority: "epp.test",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: bytes.NewReader(body)})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	p := ex.Pick()
	if p.Immediate != nil {
		t.Fatal(p.Immediate)
	}
	resp, err := http.Post("http://"+p.Primary()+p.Path, "application/json", bytes.NewReader(p.Body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var status int
	var hdr http.Header
	var chunks [][]byte
	err = ex.Respond(&extproc.Response{Status: resp.StatusCode, Header: resp.Header, Body: resp.Body}, extproc.Sink{
		Headers: func(code int, h http.Header) error { status, hdr = code, h; return nil },
		Body:    func(b []byte) error { chunks = append(chunks, append([]byte(nil), b...)); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK || hdr.Get("X-Went-Into-Resp-Headers") != "true" {
		t.Errorf("status %d, headers %v", status, hdr)
	}
	all := bytes.Join(chunks, nil)
	if len(chunks) < 3 || !bytes.Contains(all, []byte("data: [DONE]")) {
		t.Errorf("%d chunks released: %q", len(chunks), all)
	}
	t.Logf("%d SSE chunks released one by one, %d bytes", len(chunks), len(all))
}

// A completion through the gateway: the route's InferencePool backend asks
// the picker, forwards the mutated request to the picked pod, and returns
// the answer through the picker; a streamed completion reaches the client
// event by event while tokens are generated.
func TestGatewayServesCompletionsThroughPickerStreamingSSE(t *testing.T) {
	s := gatewayStack(t)
	const host = "completions.gateway.test"
	gwCreateRoute(t, s, fedpool.Route(s.ns, "completions", host, gatewayv1.HTTPRouteRule{Matches: gwPrefixMatch("/v1"), BackendRefs: gwPoolBackend("llm")}))
	base := s.spoke.GatewayURL()

	resp, b := gwPost(t, base, host, "/v1/completions", gwCompletion("Hello through the gateway", false, 8), nil)
	var out struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil || len(out.Choices) == 0 {
		t.Fatalf("completion: %s %s", resp.Status, b)
	}
	if served := gwEndpointOf(s, resp.Header.Get(gwPodHeader)); !slices.Contains(s.llmEndpoints(), served) {
		t.Errorf("served by pod %q (%s); want one of %v", resp.Header.Get(gwPodHeader), served, s.llmEndpoints())
	}

	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions", bytes.NewReader(gwCompletion("Stream through the gateway", true, 16)))
	req.Host = host
	began := time.Now()
	sresp, err := gwHTTPClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	if sresp.StatusCode != http.StatusOK || !strings.HasPrefix(sresp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %s %v", sresp.Status, sresp.Header)
	}
	var arrivals []time.Duration
	sc := bufio.NewScanner(sresp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			arrivals = append(arrivals, time.Since(began))
		}
	}
	if len(arrivals) < 8 {
		t.Fatalf("%d SSE events", len(arrivals))
	}
	// 16 tokens 10 ms apart: the events must arrive spread over time, not
	// in one buffered burst at the end.
	if spread := arrivals[len(arrivals)-1] - arrivals[0]; spread < 75*time.Millisecond {
		t.Errorf("SSE events arrived within %s of each other: %v", spread, arrivals)
	}
	t.Logf("%d SSE events, first after %s, last after %s", len(arrivals), arrivals[0], arrivals[len(arrivals)-1])
}

func gwEndpointOf(s *inferenceStack, pod string) string {
	for _, p := range append(s.llmPods, s.spare, s.broken) {
		if p.Name == pod {
			return net.JoinHostPort(p.Status.PodIP, fmt.Sprint(gwPort))
		}
	}
	return ""
}

// An HTTPRoute with a URLRewrite is programmed as KServe's routes are: the
// gateway rewrites /<ns>/<name>/v1/... to /v1/... and reports the route's
// parents Accepted and ResolvedRefs for its generation, the pool's parent
// entry for the Gateway, and the Gateway Programmed at its address. A rule
// whose backend is missing is reported and answers 500; an unrouted path 404.
func TestGatewayRewritesPathAndProgramsRouteAndPoolStatus(t *testing.T) {
	s := gatewayStack(t)
	ctx := context.Background()
	const host = "rewrite.gateway.test"
	prefix := "/" + s.ns + "/llm/v1"
	r := fedpool.Route(s.ns, "rewrite", host,
		gatewayv1.HTTPRouteRule{Matches: gwPrefixMatch(prefix), BackendRefs: gwPoolBackend("llm"), Filters: []gatewayv1.HTTPRouteFilter{{
			Type: gatewayv1.HTTPRouteFilterURLRewrite, URLRewrite: &gatewayv1.HTTPURLRewriteFilter{Path: &gatewayv1.HTTPPathModifier{
				Type: gatewayv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v1")}}}}},
		gatewayv1.HTTPRouteRule{Matches: gwPrefixMatch("/missing"), BackendRefs: gwPoolBackend("no-such-pool")},
	)
	gwCreateRoute(t, s, r)
	base := s.spoke.GatewayURL()

	resp, b := gwPost(t, base, host, prefix+"/completions", gwCompletion("rewritten", false, 4), nil)
	if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"choices"`)) {
		t.Fatalf("rewritten completion: %s %s", resp.Status, b)
	}
	if resp, b := gwPost(t, base, host, "/missing/v1/completions", gwCompletion("x", false, 1), nil); resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("missing backend: %s %s, want 500", resp.Status, b)
	}
	if resp, b := gwPost(t, base, host, "/elsewhere", nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unrouted path: %s %s, want 404", resp.Status, b)
	}

	if err := s.spoke.Client.Get(ctx, client.ObjectKeyFromObject(r), r); err != nil {
		t.Fatal(err)
	}
	if len(r.Status.Parents) != 1 || r.Status.Parents[0].ControllerName != gateway.ControllerName {
		t.Fatalf("route parents %+v", r.Status.Parents)
	}
	conds := r.Status.Parents[0].Conditions
	accepted := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionAccepted))
	resolved := meta.FindStatusCondition(conds, string(gatewayv1.RouteConditionResolvedRefs))
	if accepted == nil || accepted.Status != metav1.ConditionTrue || accepted.ObservedGeneration != r.Generation ||
		resolved == nil || resolved.Status != metav1.ConditionFalse || resolved.Reason != string(gatewayv1.RouteReasonBackendNotFound) {
		t.Errorf("route conditions %+v; want Accepted and ResolvedRefs=False/BackendNotFound for generation %d", conds, r.Generation)
	}

	// Without the broken rule, every reference resolves. A patch, as the
	// gateway may write the route's status meanwhile.
	read := r.DeepCopy()
	r.Spec.Rules = r.Spec.Rules[:1]
	if err := s.spoke.Client.Patch(ctx, r, client.MergeFrom(read)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "ResolvedRefs for the new generation", func(ctx context.Context) error {
		if err := s.spoke.Client.Get(ctx, client.ObjectKeyFromObject(r), r); err != nil {
			return err
		}
		c := meta.FindStatusCondition(r.Status.Parents[0].Conditions, string(gatewayv1.RouteConditionResolvedRefs))
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != r.Generation {
			return fmt.Errorf("ResolvedRefs %+v at generation %d", c, r.Generation)
		}
		return nil
	})

	var pool inferencev1.InferencePool
	if err := s.spoke.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "llm"}, &pool); err != nil {
		t.Fatal(err)
	}
	var entry *inferencev1.ParentStatus
	for i, p := range pool.Status.Parents {
		if p.ParentRef.Kind == "Gateway" && string(p.ParentRef.Name) == fleet.GatewayName && string(p.ParentRef.Namespace) == fleet.Namespace {
			entry = &pool.Status.Parents[i]
		}
	}
	if entry == nil || !meta.IsStatusConditionTrue(entry.Conditions, string(inferencev1.InferencePoolConditionAccepted)) ||
		!meta.IsStatusConditionTrue(entry.Conditions, string(inferencev1.InferencePoolConditionResolvedRefs)) {
		t.Errorf("pool parents %+v; want the Gateway's entry Accepted and ResolvedRefs", pool.Status.Parents)
	}

	var gw gatewayv1.Gateway
	if err := s.spoke.Client.Get(ctx, client.ObjectKey{Namespace: fleet.Namespace, Name: fleet.GatewayName}, &gw); err != nil {
		t.Fatal(err)
	}
	addr := fleet.GatewayAddress(s.spoke.NetworkIndex).String()
	if !meta.IsStatusConditionTrue(gw.Status.Conditions, string(gatewayv1.GatewayConditionProgrammed)) ||
		len(gw.Status.Addresses) != 1 || gw.Status.Addresses[0].Value != addr || len(gw.Status.Listeners) != 1 || gw.Status.Listeners[0].AttachedRoutes < 2 {
		t.Errorf("gateway status %+v; want Programmed at %s with the test routes attached", gw.Status, addr)
	}
}

// The pool's failureMode decides when its picker is down (its Service has no
// ready pod), as Envoy's failure_mode_allow does with deploy/envoy/envoy.yaml:
// FailOpen lets the request go on without a pick, which the ORIGINAL_DST
// cluster has no destination for (503, counted as failed open), FailClose
// answers ext_proc's 500.
func TestGatewayFailsOpenOrClosedWhenPickerIsDown(t *testing.T) {
	s := gatewayStack(t)
	ctx := context.Background()
	const host = "failure-mode.gateway.test"
	gwCreateRoute(t, s, fedpool.Route(s.ns, "failure-mode", host, gatewayv1.HTTPRouteRule{BackendRefs: gwPoolBackend("headless")}))
	base := s.spoke.GatewayURL()
	before := gwMetricSum(t, s.spoke, "fleetinfer_gateway_epp_fail_open_total", nil)

	for range 3 {
		resp, b := gwPost(t, base, host, "/v1/completions", gwCompletion("fail open", false, 2), nil)
		if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(b, []byte("no healthy upstream")) || resp.Header.Get(gwPodHeader) != "" {
			t.Fatalf("FailOpen: %s %s (pod %q); want 503 no healthy upstream", resp.Status, b, resp.Header.Get(gwPodHeader))
		}
	}
	if after := gwMetricSum(t, s.spoke, "fleetinfer_gateway_epp_fail_open_total", nil); after-before != 3 {
		t.Errorf("fail-open count rose by %v, want 3", after-before)
	}

	// A patch, not an update: the gateway writes the pool's status
	// meanwhile, which an update of what was read would conflict with.
	var pool inferencev1.InferencePool
	if err := s.spoke.Client.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "headless"}, &pool); err != nil {
		t.Fatal(err)
	}
	read := pool.DeepCopy()
	pool.Spec.EndpointPickerRef.FailureMode = inferencev1.EndpointPickerFailClose
	if err := s.spoke.Client.Patch(ctx, &pool, client.MergeFrom(read)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "FailClose answers 500", func(context.Context) error {
		resp, b := gwPost(t, base, host, "/v1/completions", gwCompletion("fail closed", false, 2), nil)
		if resp.StatusCode != http.StatusInternalServerError || !bytes.Contains(b, []byte("endpoint picker unavailable")) {
			return fmt.Errorf("%s %s", resp.Status, b)
		}
		return nil
	})
}

// A picked endpoint that refuses connections is tried once, as the file's
// ORIGINAL_DST cluster, with no retry policy, tries it: the client gets 503
// and the gateway moves on to no other pod. The picker picks between the two
// idle pods at random, so 16 requests reach both (all 16 to one of them: 1
// in 32,768).
func TestGatewayTriesAPickedEndpointOnce(t *testing.T) {
	s := gatewayStack(t)
	const host = "refusing.gateway.test"
	gwCreateRoute(t, s, fedpool.Route(s.ns, "refusing", host, gatewayv1.HTTPRouteRule{BackendRefs: gwPoolBackend("refusing")}))
	base := s.spoke.GatewayURL()
	before := gwMetricSum(t, s.spoke, "fleetinfer_gateway_upstream_retries_total", nil)
	var served, refused int
	for i := range 16 {
		resp, b := gwPost(t, base, host, "/v1/completions", gwCompletion(fmt.Sprintf("refusing %d", i), false, 2), nil)
		switch {
		case resp.StatusCode == http.StatusOK && resp.Header.Get(gwPodHeader) == s.spare.Name:
			served++
		case resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(b, []byte("upstream connect error")):
			refused++
		default:
			t.Fatalf("request %d: %s from pod %q: %s", i, resp.Status, resp.Header.Get(gwPodHeader), b)
		}
	}
	if served == 0 || refused == 0 {
		t.Errorf("%d served by %s and %d refused; want both kinds", served, s.spare.Name, refused)
	}
	if retries := gwMetricSum(t, s.spoke, "fleetinfer_gateway_upstream_retries_total", nil) - before; retries != 0 {
		t.Errorf("%v retries; a picked endpoint is tried once", retries)
	}
	t.Logf("%d of 16 requests served by %s, %d refused by %s", served, s.spare.Name, refused, s.broken.Status.PodIP)
}

// A client does not name endpoints: as deploy/envoy/envoy.yaml does, the
// gateway drops the destination and subset headers a client sends, and the
// picker picks as usual.
func TestGatewayIgnoresClientEndpointHeaders(t *testing.T) {
	s := gatewayStack(t)
	const host = "subset.gateway.test"
	gwCreateRoute(t, s, fedpool.Route(s.ns, "subset", host, gatewayv1.HTTPRouteRule{BackendRefs: gwPoolBackend("llm")}))
	nowhere := map[string]string{extproc.SubsetKey: "127.0.0.99:8000", extproc.DestinationHeader: "127.0.0.99:8000"}
	if resp, b := gwPost(t, s.spoke.GatewayURL(), host, "/v1/completions", gwCompletion("ignored", false, 2), nowhere); resp.StatusCode != http.StatusOK {
		t.Errorf("client endpoint headers: %s %s; want them ignored", resp.Status, b)
	}
}

// The picker's rejection of a request it cannot parse is the client's
// answer, with the picker's message.
func TestGatewayPassesPickerRejectionOfInvalidJSON(t *testing.T) {
	s := gatewayStack(t)
	const host = "invalid.gateway.test"
	gwCreateRoute(t, s, fedpool.Route(s.ns, "invalid", host, gatewayv1.HTTPRouteRule{BackendRefs: gwPoolBackend("llm")}))
	resp, b := gwPost(t, s.spoke.GatewayURL(), host, "/v1/completions", []byte(`{"model": "opt-125m", "prompt": `), nil)
	if resp.StatusCode != http.StatusBadRequest || len(b) == 0 || resp.Header.Get(gwPodHeader) != "" {
		t.Errorf("invalid JSON: %s %q from pod %q; want the picker's 400", resp.Status, b, resp.Header.Get(gwPodHeader))
	}
	t.Logf("picker answered %s: %s", resp.Status, bytes.TrimSpace(b))
}

// gwMetricSum adds up a metric of the spoke's gateway over the series whose
// labels include want.
func gwMetricSum(t *testing.T, c *fleet.Cluster, name string, want map[string]string) float64 {
	t.Helper()
	families, err := c.Gateway.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if gwHasLabels(m, want) {
				sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func gwHasLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			found = found || (l.GetName() == k && l.GetValue() == v)
		}
		if !found {
			return false
		}
	}
	return true
}
