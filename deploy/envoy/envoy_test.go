package envoy_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/fleetinfer/fleetinfer/deploy/envoy"
	"github.com/fleetinfer/fleetinfer/epp/spill"
	"github.com/fleetinfer/fleetinfer/localfleet/gateway"
	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
	"github.com/fleetinfer/fleetinfer/spoke/presets"
)

// parse reads an Envoy bootstrap in YAML as Envoy does: YAML to JSON, then
// protojson into the v3 types, rejecting unknown fields and enum names, and
// runs ValidateAll on the bootstrap and on every typed_config inside it
// (protoc-gen-validate does not look inside an Any by itself).
func parse(b []byte) (*bootstrapv3.Bootstrap, error) {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("YAML: %w", err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(j, bs); err != nil {
		return nil, fmt.Errorf("Envoy v3 bootstrap: %w", err)
	}
	if err := validate(bs, "bootstrap"); err != nil {
		return nil, err
	}
	return bs, nil
}

type validator interface{ ValidateAll() error }

// validate runs ValidateAll on m, then unpacks every Any below it and
// validates what it holds.
func validate(m proto.Message, where string) error {
	v, ok := m.(validator)
	if !ok {
		return fmt.Errorf("%s: %s has no ValidateAll", where, m.ProtoReflect().Descriptor().FullName())
	}
	if err := v.ValidateAll(); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	var errs []error
	eachAny(m.ProtoReflect(), func(a *anypb.Any) {
		inner, err := a.UnmarshalNew()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", where, a.GetTypeUrl(), err))
			return
		}
		errs = append(errs, validate(inner, where+" > "+string(inner.ProtoReflect().Descriptor().Name())))
	})
	return errors.Join(errs...)
}

// eachAny calls f for every google.protobuf.Any reachable from m without
// crossing another Any.
func eachAny(m protoreflect.Message, f func(*anypb.Any)) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		visit := func(v protoreflect.Value) {
			msg := v.Message()
			if a, ok := msg.Interface().(*anypb.Any); ok {
				f(a)
				return
			}
			eachAny(msg, f)
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { visit(mv); return true })
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := range v.List().Len() {
					visit(v.List().Get(i))
				}
			}
		case fd.Message() != nil:
			visit(v)
		}
		return true
	})
}

// gatewayConfig is what the Endpoint Picker Protocol needs from the file.
type gatewayConfig struct {
	hcm     *hcmv3.HttpConnectionManager
	filters []*hcmv3.HttpFilter
	extProc *extprocv3.ExternalProcessor
	strip   *headermutationv3.HeaderMutation
}

func httpConnectionManager(bs *bootstrapv3.Bootstrap) (*listenerv3.Filter, *hcmv3.HttpConnectionManager, error) {
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().MessageIs(hcm) {
					if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						return nil, nil, err
					}
					return f, hcm, nil
				}
			}
		}
	}
	return nil, nil, errors.New("no listener with an HTTP connection manager")
}

func clusterNamed(bs *bootstrapv3.Bootstrap, name string) *clusterv3.Cluster {
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c
		}
	}
	return nil
}

// presetFailureMode is the endpointPickerRef.failureMode fleetinfer's
// scheduler preset gives every pool.
func presetFailureMode(t *testing.T) inferencev1.EndpointPickerFailureMode {
	t.Helper()
	cfgs, err := presets.Load("fleetinfer-system", "kserve-")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfgs {
		if c.Name != "kserve-config-llm-scheduler" {
			continue
		}
		pool := c.Spec.Router.Scheduler.Pool.Spec
		if pool.EndpointPickerRef.FailureMode == "" {
			return inferencev1.EndpointPickerFailClose // the API's default
		}
		return pool.EndpointPickerRef.FailureMode
	}
	t.Fatal("no config-llm-scheduler preset")
	return ""
}

// checkProtocol returns every way bs departs from what GIE's EPP and the
// local gateway expect of the gateway in front of it.
func checkProtocol(bs *bootstrapv3.Bootstrap, failOpen bool) error {
	_, hcm, err := httpConnectionManager(bs)
	if err != nil {
		return err
	}
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	// Filter order: strip client-sent protocol headers, then the EPP, then
	// the router (last, so that it routes on the EPP's header).
	filters := hcm.GetHttpFilters()
	index := func(name string) int {
		return slices.IndexFunc(filters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == name })
	}
	strip, ext, router := index("envoy.filters.http.header_mutation"), index("envoy.filters.http.ext_proc"), index("envoy.filters.http.router")
	if ext < 0 {
		return errors.New("no envoy.filters.http.ext_proc filter")
	}
	if router != len(filters)-1 {
		fail("the router is filter %d of %d, not the last", router+1, len(filters))
	}
	if ext > router {
		fail("ext_proc (filter %d) comes after the router (filter %d)", ext+1, router+1)
	}
	if strip < 0 || strip > ext {
		fail("no header_mutation filter before ext_proc strips client-sent protocol headers")
	} else {
		hm := &headermutationv3.HeaderMutation{}
		if err := filters[strip].GetTypedConfig().UnmarshalTo(hm); err != nil {
			return err
		}
		var removed []string
		for _, m := range hm.GetMutations().GetRequestMutations() {
			if r := m.GetRemove(); r != "" {
				removed = append(removed, strings.ToLower(r))
			}
		}
		for _, h := range []string{extproc.DestinationHeader, extproc.SubsetKey} {
			if !slices.Contains(removed, h) {
				fail("client-sent %s is not removed before ext_proc", h)
			}
		}
	}

	// The ext_proc filter: modes, timeouts, failure mode, metadata.
	ep := &extprocv3.ExternalProcessor{}
	if err := filters[ext].GetTypedConfig().UnmarshalTo(ep); err != nil {
		return err
	}
	pm := ep.GetProcessingMode()
	want := &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
		RequestBodyMode:     extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode:    extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode:  extprocv3.ProcessingMode_SEND,
		ResponseTrailerMode: extprocv3.ProcessingMode_SEND,
	}
	if !proto.Equal(pm, want) {
		fail("processing_mode is {%v}, the EPP needs {%v}", pm, want)
	}
	if d := ep.GetMessageTimeout().AsDuration(); d != extproc.DefaultMessageTimeout {
		fail("message_timeout %v differs from the local gateway's extproc.DefaultMessageTimeout %v", d, extproc.DefaultMessageTimeout)
	}
	if ep.GetFailureModeAllow() != failOpen {
		fail("failure_mode_allow is %v but the pools' failureMode is FailOpen=%v", ep.GetFailureModeAllow(), failOpen)
	}
	if !slices.Contains(ep.GetRequestAttributes(), extproc.SourceAddressAttribute) {
		fail("ext_proc does not send %s (request_attributes), by which the EPP budgets request bodies per client", extproc.SourceAddressAttribute)
	}
	if !hcm.GetUseRemoteAddress().GetValue() {
		fail("use_remote_address is off: a client's own x-forwarded-for would set its %s", extproc.SourceAddressAttribute)
	}
	if ep.GetAllowModeOverride() {
		fail("allow_mode_override is set; Envoy ignores mode overrides with FULL_DUPLEX_STREAMED")
	}
	if !slices.Contains(ep.GetMetadataOptions().GetReceivingNamespaces().GetUntyped(), extproc.LBNamespace) {
		fail("the EPP's %s metadata is not accepted (metadata_options.receiving_namespaces)", extproc.LBNamespace)
	}
	for _, ns := range []string{extproc.LBNamespace, extproc.SubsetNamespace} {
		if !slices.Contains(ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), ns) {
			fail("metadata namespace %s is not forwarded to the EPP", ns)
		}
	}
	eppCluster := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if c := clusterNamed(bs, eppCluster); c == nil {
		fail("ext_proc's gRPC cluster %q is not defined", eppCluster)
	} else {
		opts := &upstreamhttpv3.HttpProtocolOptions{}
		a := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if a == nil || a.UnmarshalTo(opts) != nil || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			fail("the EPP cluster %q does not speak HTTP/2, which gRPC needs", eppCluster)
		}
	}

	// Routes: to an ORIGINAL_DST cluster that dials the EPP's header, with
	// no route timeout to cut a streamed completion.
	if d := hcm.GetStreamIdleTimeout().AsDuration(); d != gateway.DefaultStreamIdleTimeout {
		fail("stream_idle_timeout %v differs from the local gateway's bound on a stalled EPP, gateway.DefaultStreamIdleTimeout %v", d, gateway.DefaultStreamIdleTimeout)
	}
	routes := 0
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			routes++
			ra := r.GetRoute()
			if ra.GetTimeout() == nil || ra.GetTimeout().AsDuration() != 0 {
				fail("route %q has a timeout (%v); Envoy's default 15 s cuts streamed completions", r.GetMatch().GetPrefix(), ra.GetTimeout().AsDuration())
			}
			if ra.GetRetryPolicy() != nil || hcm.GetRouteConfig().GetVirtualHosts()[0].GetRetryPolicy() != nil {
				fail("route %q retries; the local gateway tries a picked endpoint once", r.GetMatch().GetPrefix())
			}
			c := clusterNamed(bs, ra.GetCluster())
			switch {
			case c == nil:
				fail("route %q goes to undefined cluster %q", r.GetMatch().GetPrefix(), ra.GetCluster())
			case c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.GetLbPolicy() != clusterv3.Cluster_CLUSTER_PROVIDED:
				fail("cluster %q is %v/%v, not ORIGINAL_DST/CLUSTER_PROVIDED", c.GetName(), c.GetType(), c.GetLbPolicy())
			case !c.GetOriginalDstLbConfig().GetUseHttpHeader() || c.GetOriginalDstLbConfig().GetHttpHeaderName() != extproc.DestinationHeader:
				fail("cluster %q does not dial the %s header (use_http_header %v, http_header_name %q)", c.GetName(),
					extproc.DestinationHeader, c.GetOriginalDstLbConfig().GetUseHttpHeader(), c.GetOriginalDstLbConfig().GetHttpHeaderName())
			case c.GetConnectTimeout().AsDuration() != gateway.DefaultConnectTimeout:
				fail("cluster %q connect_timeout %v differs from the local gateway's gateway.DefaultConnectTimeout %v", c.GetName(),
					c.GetConnectTimeout().AsDuration(), gateway.DefaultConnectTimeout)
			case c.GetCleanupInterval().AsDuration() != gateway.OriginalDstCleanup:
				fail("cluster %q cleanup_interval %v differs from the local gateway's gateway.OriginalDstCleanup %v", c.GetName(),
					c.GetCleanupInterval().AsDuration(), gateway.OriginalDstCleanup)
			case c.GetCleanupInterval().AsDuration() != time.Duration(spill.DefaultParams.DestinationIdleTimeout):
				fail("cluster %q cleanup_interval %v differs from the spill estimate's default destinationIdleTimeout %v", c.GetName(),
					c.GetCleanupInterval().AsDuration(), time.Duration(spill.DefaultParams.DestinationIdleTimeout))
			}
		}
	}
	if routes == 0 {
		fail("no routes")
	}
	return errors.Join(errs...)
}

// pickerStreams is how many requests the EPP is tested to hold open at
// once within its memory limit (epp's
// TestHostileBodiesKeepThePickersMemoryBounded) and, at the rate it is
// benchmarked at (bench/results/epp.md), 10 s of completions: what the
// gateway's concurrency through it must reach.
const pickerStreams = 10000

// checkCapacity returns every way bs's circuit breakers fall short of that
// load, or would refuse a request the EPP picked.
func checkCapacity(bs *bootstrapv3.Bootstrap) error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	epp, pool := thresholds(bs, "epp"), thresholds(bs, "inference_pool")
	for name, t := range map[string]*clusterv3.CircuitBreakers_Thresholds{"epp": epp, "inference_pool": pool} {
		if t.GetMaxRequests() == nil || t.GetMaxPendingRequests() == nil || t.GetMaxConnections() == nil {
			fail("cluster %q keeps one of Envoy's default circuit breakers (1,024): set max_requests, max_pending_requests and max_connections", name)
		}
	}
	if n := epp.GetMaxRequests().GetValue(); n < pickerStreams {
		fail("cluster epp max_requests %d is below the %d requests the EPP holds open: every request holds an ext-proc stream", n, pickerStreams)
	}
	if p, e := pool.GetMaxRequests().GetValue(), epp.GetMaxRequests().GetValue(); p < e {
		fail("cluster inference_pool max_requests %d is below epp's %d: a request the EPP picked would be refused", p, e)
	}
	if c, r := pool.GetMaxConnections().GetValue(), pool.GetMaxRequests().GetValue(); c < r {
		fail("cluster inference_pool max_connections %d is below its max_requests %d: HTTP/1.1 needs a connection per request", c, r)
	}
	return errors.Join(errs...)
}

// thresholds returns a cluster's circuit breakers for default-priority
// requests, nil if it sets none.
func thresholds(bs *bootstrapv3.Bootstrap, cluster string) *clusterv3.CircuitBreakers_Thresholds {
	for _, t := range clusterNamed(bs, cluster).GetCircuitBreakers().GetThresholds() {
		if t.GetPriority() == corev3.RoutingPriority_DEFAULT {
			return t
		}
	}
	return nil
}

// check runs every check of the bootstrap.
func check(bs *bootstrapv3.Bootstrap, failOpen bool) error {
	return errors.Join(checkProtocol(bs, failOpen), checkCapacity(bs))
}

func TestBootstrapIsValid(t *testing.T) {
	bs, err := parse(envoy.Bootstrap)
	if err != nil {
		t.Fatal(err)
	}
	if err := check(bs, presetFailureMode(t) == inferencev1.EndpointPickerFailOpen); err != nil {
		t.Fatal(err)
	}
	// The spoke's preset points endpointPickerRef at port 9002; the example
	// EPP endpoint must use it too.
	ep := clusterNamed(bs, "epp").GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if ep.GetPortValue() != 9002 || !strings.HasSuffix(ep.GetAddress(), "-epp-service.llm.svc.cluster.local") {
		t.Errorf("EPP endpoint %s:%d is not <service>-epp-service:9002", ep.GetAddress(), ep.GetPortValue())
	}
}

// TestBrokenBootstrapsFail makes sure each check above can fail: every case
// breaks one thing in a copy of envoy.yaml.
func TestBrokenBootstrapsFail(t *testing.T) {
	failOpen := presetFailureMode(t) == inferencev1.EndpointPickerFailOpen
	cases := []struct {
		name, old, new string
		want           string // in the error
	}{
		{"unknown body mode", "request_body_mode: FULL_DUPLEX_STREAMED", "request_body_mode: FULL_DUPLEX_STREAMING", "FULL_DUPLEX_STREAMING"},
		{"unknown field", "message_timeout: 10s", "message_timeout_s: 10", "message_timeout_s"},
		{"cluster without a name", "- name: inference_pool", `- name: ""`, "Name"},
		{"ext_proc without a gRPC cluster", "envoy_grpc: {cluster_name: epp}", `envoy_grpc: {cluster_name: ""}`, "ClusterName"},
		{"buffered body", "request_body_mode: FULL_DUPLEX_STREAMED", "request_body_mode: BUFFERED", "processing_mode"},
		{"other header", "http_header_name: x-gateway-destination-endpoint", "http_header_name: x-envoy-original-dst-host", "does not dial"},
		{"route timeout", "\n                  timeout: 0s", "\n                  timeout: 15s", "has a timeout"},
		{"retries", "\n                  timeout: 0s", "\n                  timeout: 0s\n                  retry_policy: {retry_on: connect-failure, num_retries: 2}", "retries"},
		{"idle timeout", "stream_idle_timeout: 300s", "stream_idle_timeout: 10s", "DefaultStreamIdleTimeout"},
		{"connect timeout", "before its 503.\n    connect_timeout: 2s", "before its 503.\n    connect_timeout: 5s", "DefaultConnectTimeout"},
		{"Envoy's cleanup interval", "cleanup_interval: 120s", "cleanup_interval: 5s", "OriginalDstCleanup"},
		{"failure mode", "failure_mode_allow: true", "failure_mode_allow: false", "failure_mode_allow"},
		{"message timeout", "message_timeout: 10s", "message_timeout: 1000s", "DefaultMessageTimeout"},
		{"client header kept", "- remove: x-gateway-destination-endpoint\n", "", "not removed"},
		{"metadata dropped", "untyped: [envoy.lb]", "untyped: [other]", "not accepted"},
		{"EPP over HTTP/1.1", "http2_protocol_options: {max_concurrent_streams: 4096}", "http_protocol_options: {}", "HTTP/2"},
		{"client address not sent", "request_attributes: [source.address]", "request_attributes: [request.path]", "source.address"},
		{"client address from x-forwarded-for", "use_remote_address: true", "use_remote_address: false", "use_remote_address"},
		{"EPP's default breakers", "        max_pending_requests: 2048\n", "", "default circuit breakers"},
		{"EPP concurrency below its load", "max_requests: 10000", "max_requests: 1024", "below the 10000"},
		{"pool refuses picks", "max_requests: 40000", "max_requests: 5000", "would be refused"},
		{"pool short of connections", "max_connections: 40000", "max_connections: 20000", "a connection per request"},
		{"route to the EPP", "cluster: inference_pool", "cluster: epp", "not ORIGINAL_DST"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := string(envoy.Bootstrap)
			if strings.Count(src, c.old) != 1 {
				t.Fatalf("envoy.yaml has %d copies of %q, want 1", strings.Count(src, c.old), c.old)
			}
			err := func() error {
				bs, err := parse([]byte(strings.Replace(src, c.old, c.new, 1)))
				if err != nil {
					return err
				}
				return check(bs, failOpen)
			}()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}

	// Filter order, which a text edit cannot move cleanly: the router
	// before ext_proc.
	t.Run("router before ext_proc", func(t *testing.T) {
		bs, err := parse(envoy.Bootstrap)
		if err != nil {
			t.Fatal(err)
		}
		f, hcm, err := httpConnectionManager(bs)
		if err != nil {
			t.Fatal(err)
		}
		fs := hcm.HttpFilters
		fs[len(fs)-2], fs[len(fs)-1] = fs[len(fs)-1], fs[len(fs)-2]
		a, err := anypb.New(hcm)
		if err != nil {
			t.Fatal(err)
		}
		f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: a}
		if err := checkProtocol(bs, failOpen); err == nil || !strings.Contains(err.Error(), "after the router") {
			t.Fatalf("error %v, want ext_proc after the router", err)
		}
	})
}
