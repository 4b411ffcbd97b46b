package epp

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
	eppconfig "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/config/loader"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datalayer"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/handlers"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/scheduling"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/crossing"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	"github.com/fleetinfer/fleetinfer/epp/internal/gierunner"
	"github.com/fleetinfer/fleetinfer/epp/marks"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// The harness runs the EPP's request path in process, as the runner wires
// it (GIE's Director and StreamingServer around fleetinfer's candidates,
// director and stream wrappers), over fake local and remote endpoints.

type fakeDatastore struct{ local []fwkdl.Endpoint }

func (d *fakeDatastore) PoolGet() (*datalayer.EndpointPool, error) {
	return &datalayer.EndpointPool{Namespace: "llm", Name: "llama", TargetPorts: []int{8000}}, nil
}
func (d *fakeDatastore) ObjectiveGet(string) *v1alpha2.InferenceObjective { return nil }
func (d *fakeDatastore) ModelRewriteGet(string) (*v1alpha2.InferenceModelRewriteRule, string) {
	return nil, ""
}
func (d *fakeDatastore) PodList(pred func(fwkdl.Endpoint) bool) []fwkdl.Endpoint {
	var out []fwkdl.Endpoint
	for _, ep := range d.local {
		if pred(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// fakeRemote stands in for the federation store: one view per cluster of
// its endpoints, none of them stale, with the prefix summaries given by
// endpoint name.
type fakeRemote struct {
	eps      []fwkdl.Endpoint
	prefixes map[string]*prefixes.Summary
}

func (r *fakeRemote) Remote(now time.Time) federation.Remote {
	byCluster := map[*federation.Origin][]federation.Entry{}
	for _, ep := range r.eps {
		o := federation.OriginOf(ep.GetAttributes())
		byCluster[o] = append(byCluster[o], federation.Entry{Endpoint: ep.(*fwkdl.ModelServer), Updated: ep.GetMetrics().UpdateTime,
			Prefixes: r.prefixes[ep.GetMetadata().NamespacedName.Name]})
	}
	out := federation.Remote{Stale: now.Add(-time.Hour)}
	for o, entries := range byCluster {
		out.Peers = append(out.Peers, federation.NewView(o, entries))
	}
	return out
}

func endpoint(name, addr string, waiting int, origin *federation.Origin) fwkdl.Endpoint {
	ip, port, _ := strings.Cut(addr, ":")
	m := fwkdl.NewMetrics()
	m.WaitingQueueSize, m.UpdateTime = waiting, time.Now()
	ep := fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{NamespacedName: types.NamespacedName{Namespace: "llm", Name: name},
		PodName: name, Address: ip, Port: port}, m)
	if origin != nil {
		ep.GetAttributes().Put(federation.OriginAttribute, origin)
	}
	return ep
}

// Both peers are testRTT away. With the spill policy's default service
// rate (10/s) a local endpoint with a queue of 3 is expected to answer in
// 300 ms and stays ahead of an idle remote one; a queue of 9 (900 ms) is not.
var (
	west    = &federation.Origin{Cluster: "west", Mode: fleetv1alpha1.FederationEndpoint, RoundTrip: roundTrip(testRTT)}
	central = &federation.Origin{Cluster: "central", Mode: fleetv1alpha1.FederationParent, Gateway: "127.13.0.99:8080", RoundTrip: roundTrip(testRTT)}
)

const testRTT = 400 * time.Millisecond

func roundTrip(d time.Duration) *federation.RoundTrip {
	r := &federation.RoundTrip{}
	r.Observe(d)
	return r
}

const testConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: cross-cluster-filter
- type: cross-cluster-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: cross-cluster-filter
  - {pluginRef: cross-cluster-scorer, weight: 1}
  - {pluginRef: queue-scorer, weight: 2}
dataLayer: {sources: []}
`

type harness struct {
	server   extProcPb.ExternalProcessorServer
	failOpen bool
	// crossings is the crossing gate (newGatedHarness), nil without.
	crossings *crossing.Gate
	// meter is the spill policy's meter.
	meter *spill.Meter
}

func newHarness(t testing.TB, local, remote []fwkdl.Endpoint) *harness {
	t.Helper()
	return newHarnessConfig(t, local, &fakeRemote{eps: remote}, testConfig)
}

func newHarnessConfig(t testing.TB, local []fwkdl.Endpoint, remote remoteEndpoints, config string) *harness {
	t.Helper()
	return newGatedHarness(t, local, remote, config, nil)
}

// newGatedHarness is newHarnessConfig with a crossing gate.
func newGatedHarness(t testing.TB, local []fwkdl.Endpoint, remote remoteEndpoints, config string, g *crossing.Gate) *harness {
	t.Helper()
	policy, handle, cfg := loadFleetinferConfig(t, config)
	ds := &fakeDatastore{local: local}
	h := &harness{crossings: g}
	rec := pickRecorder{meter: spill.NewMeter(), prefixes: prefixes.NewIndex()}
	h.meter = rec.meter
	cands := &candidates{ds: ds, remote: remote, spill: policy, meter: rec.meter, prefixes: rec.prefixes, crossings: g,
		failOpen: func(context.Context) bool { return h.failOpen }, now: time.Now}
	rc := requestcontrol.NewConfig()
	rc.AddPlugins(rec)
	rc.AddPlugins(handle.GetAllPlugins()...)
	parser := handlers.NewParser(cfg.ParserConfig)
	gie := requestcontrol.NewDirectorWithConfig(ds, scheduling.NewSchedulerWithConfig(cfg.SchedulerConfig),
		requestcontrol.NewLegacyAdmissionController(cfg.SaturationDetector, cands), parser, cands, rc)
	h.server = newExtProcServer(ds, gie, parser, testMarker(t), h.crossings, rec, NewRequestLimits())
	return h
}

// The harness's picker is east's, in pool llm/llama; its peer directory
// lists west and central, and every certificate comes from one CA.
var (
	testPool    = types.NamespacedName{Namespace: "llm", Name: "llama"}
	testIDs     = map[string]string{"west": "spiffe://fleetinfer.test/west", "central": "spiffe://fleetinfer.test/central"}
	testPKIOnce sync.Once
	testPKI     struct {
		ca    *federationtest.CA
		roots *x509.CertPool
		certs map[string]*tls.Certificate // by cluster, east included
		err   error
	}
)

// testCert returns the federation certificate of a cluster, issued by the
// harness's CA.
func testCert(t testing.TB, cluster string) *tls.Certificate {
	t.Helper()
	testPKIOnce.Do(func() {
		p := &testPKI
		if p.ca, p.err = federationtest.NewCA("fleet"); p.err != nil {
			return
		}
		p.roots = x509.NewCertPool()
		p.roots.AppendCertsFromPEM(p.ca.PEM)
		p.certs = map[string]*tls.Certificate{}
		for _, c := range []string{"east", "west", "central"} {
			certPEM, keyPEM, err := p.ca.Issue("spiffe://fleetinfer.test/" + c)
			if err != nil {
				p.err = err
				return
			}
			kp, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				p.err = err
				return
			}
			p.certs[c] = &kp
		}
	})
	if testPKI.err != nil {
		t.Fatal(testPKI.err)
	}
	return testPKI.certs[cluster]
}

func testMarker(t testing.TB) *marker {
	cert := testCert(t, "east")
	return &marker{cluster: "east", pool: testPool, cert: func() *tls.Certificate { return cert }, now: time.Now,
		verifier: &marks.Verifier{Pool: testPool, Roots: func() *x509.CertPool { return testPKI.roots },
			Identity: func(c string) (string, bool) { id, ok := testIDs[c]; return id, ok }}}
}

// markedBy returns the mark headers another cluster's picker sets when it
// forwards a request for pods here.
func markedBy(t testing.TB, cluster, pods string) [][2]string {
	t.Helper()
	h, err := marks.Sign(marks.Mark{Origin: cluster, Pool: testPool, Pods: pods, Hops: 1,
		Expires: time.Now().Add(marks.Lifetime).Unix()}, testCert(t, cluster))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// registerAllPlugins registers GIE's plugins and fleetinfer's, as the
// runner does, and returns where the cross-cluster-filter's factory records
// the spill policy it builds.
func registerAllPlugins() *spillPolicy {
	configured := &spillPolicy{}
	gierunner.RegisterInTreePlugins()
	registerPlugins(configured)
	return configured
}

// loadFleetinferConfig registers GIE's and fleetinfer's plugins and instantiates
// config with them, as the runner does, and returns the spill policy of its
// cross-cluster-filter (nil without one).
func loadFleetinferConfig(t testing.TB, config string) (*spill.Policy, fwkplugin.Handle, *eppconfig.Config) {
	t.Helper()
	configured := registerAllPlugins()
	handle, cfg := loadConfig(t, []byte(config))
	policy, err := configured.get()
	if err != nil {
		t.Fatal(err)
	}
	return policy, handle, cfg
}

// loadConfig instantiates an EndpointPickerConfig (GIE's default when
// empty) with the registered plugins.
func loadConfig(t testing.TB, config []byte) (fwkplugin.Handle, *eppconfig.Config) {
	t.Helper()
	raw, _, err := loader.LoadRawConfig(config, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	handle := fwkplugin.NewEppHandle(context.Background(), func() []types.NamespacedName { return nil })
	cfg, err := loader.InstantiateAndConfigure(raw, handle, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return handle, cfg
}

// fakeStream is the EPP's side of one ext-proc stream.
type fakeStream struct {
	grpc.ServerStream
	ctx  context.Context
	in   []*extProcPb.ProcessingRequest
	sent []*extProcPb.ProcessingResponse
}

func (s *fakeStream) Context() context.Context { return s.ctx }
func (s *fakeStream) Send(r *extProcPb.ProcessingResponse) error {
	s.sent = append(s.sent, r)
	return nil
}
func (s *fakeStream) Recv() (*extProcPb.ProcessingRequest, error) {
	if len(s.in) == 0 {
		return nil, io.EOF
	}
	r := s.in[0]
	s.in = s.in[1:]
	return r, nil
}

// liveStream is the EPP's side of an ext-proc stream whose messages come
// when the test sends them, and whose request stays in flight, as while a
// model server streams its answer, until end is closed.
type liveStream struct {
	grpc.ServerStream
	in   chan *extProcPb.ProcessingRequest
	sent chan *extProcPb.ProcessingResponse
	end  chan struct{}
}

func (s *liveStream) Context() context.Context { return context.Background() }
func (s *liveStream) Send(r *extProcPb.ProcessingResponse) error {
	s.sent <- r
	return nil
}
func (s *liveStream) Recv() (*extProcPb.ProcessingRequest, error) {
	select {
	case r := <-s.in:
		return r, nil
	case <-s.end:
		return nil, io.EOF
	}
}

// send hands the EPP m, unless the stream ended first.
func (s *liveStream) send(m *extProcPb.ProcessingRequest) bool {
	select {
	case s.in <- m:
		return true
	case <-s.end:
		return false
	}
}

// outcome waits for the request's pick or immediate answer: its
// destination, or its status.
func (s *liveStream) outcome(t testing.TB, within time.Duration) (string, int) {
	t.Helper()
	timeout := time.After(within)
	for {
		select {
		case r := <-s.sent:
			if im := r.GetImmediateResponse(); im != nil {
				return "", int(im.GetStatus().GetCode())
			}
			if d := destination(r); d != "" {
				return d, 0
			}
		case <-timeout:
			t.Fatalf("neither a pick nor an answer within %s", within)
		}
	}
}

// processLive runs the harness's server on a liveStream until finish (also
// called at the end of the test) ends the stream.
func (h *harness) processLive(t testing.TB) (s *liveStream, finish func()) {
	s = &liveStream{in: make(chan *extProcPb.ProcessingRequest), sent: make(chan *extProcPb.ProcessingResponse, 16), end: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- h.server.Process(s) }()
	var once sync.Once
	finish = func() {
		once.Do(func() {
			close(s.end)
			if err := <-done; err != nil {
				t.Errorf("Process: %v", err)
			}
		})
	}
	t.Cleanup(finish)
	return s, finish
}

// connected records a crossing to each remote endpoint's destination a
// moment ago: the gateway keeps its connections there open, so that a
// crossing costs its round trip alone (spill.Params.ConnectRoundTrips).
func (h *harness) connected(remote []fwkdl.Endpoint) {
	for _, ep := range remote {
		h.meter.CrossedAt(federation.NextHop(federation.OriginOf(ep.GetAttributes()), ep.GetMetadata()), time.Now())
	}
}

// requestHeld sends a request and returns its destination while the
// request stays in flight; finish ends it.
func (h *harness) requestHeld(t testing.TB, body string) (dest string, finish func()) {
	t.Helper()
	s, finish := h.processLive(t)
	go func() {
		for _, m := range requestMessages(body, len(body), nil) {
			s.send(m)
		}
	}()
	dest, status := s.outcome(t, 10*time.Second)
	if dest == "" {
		t.Fatalf("refused with %d", status)
	}
	return dest, finish
}

// result is what the proxy learns from the EPP about one request.
type result struct {
	status   int    // immediate response status, 0 when routed
	dest     string // x-gateway-destination-endpoint header
	metadata string // envoy.lb metadata value
	// marks is the Parent-mode marks' pod header a pick sets, "-" when it
	// removes the marks a request carried, "" when it does neither.
	marks string
}

// request sends a POST with body, split in chunks of at most chunk bytes, as
// Envoy does in FULL_DUPLEX_STREAMED mode, with an optional subset hint.
func (h *harness) request(t testing.TB, body string, chunk int, hint []string) result {
	t.Helper()
	return h.requestWith(t, body, chunk, hint, nil)
}

// requestWith is request with extra request headers.
func (h *harness) requestWith(t testing.TB, body string, chunk int, hint []string, hdr [][2]string) result {
	t.Helper()
	var md *corev3.Metadata
	if hint != nil {
		list := make([]any, len(hint))
		for i, v := range hint {
			list[i] = v
		}
		st, err := structpb.NewStruct(map[string]any{metadata.SubsetFilterKey: list})
		if err != nil {
			t.Fatal(err)
		}
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{metadata.SubsetFilterNamespace: st}}
	}
	s := &fakeStream{ctx: context.Background(), in: requestMessages(body, chunk, md)}
	rh := s.in[0].GetRequestHeaders().GetHeaders()
	for _, kv := range hdr {
		rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	if err := h.server.Process(s); err != nil {
		t.Fatalf("Process: %v", err)
	}
	var r result
	for _, resp := range s.sent {
		if im := resp.GetImmediateResponse(); im != nil {
			r.status = int(im.GetStatus().GetCode())
		}
		hr := resp.GetRequestHeaders()
		if hr == nil {
			continue
		}
		mut := hr.GetResponse().GetHeaderMutation()
		if slices.Contains(mut.GetRemoveHeaders(), marks.Signature) {
			r.marks = "-"
		}
		set := map[string]string{}
		for _, hv := range mut.GetSetHeaders() {
			set[hv.GetHeader().GetKey()] = string(hv.GetHeader().GetRawValue())
		}
		r.dest = set[metadata.DestinationEndpointKey]
		if sig, ok := set[marks.Signature]; ok {
			r.marks = set[marks.Pod]
			// What the remote picker will make of them.
			m, err := (&marks.Verifier{Pool: testPool, Roots: func() *x509.CertPool { return testPKI.roots },
				Identity: func(string) (string, bool) { return "spiffe://fleetinfer.test/east", true }}).
				Verify(func(k string) (string, bool) { v, ok := set[k]; return v, ok })
			if err != nil || m.Origin != "east" || m.Hops != 1 || sig == "" {
				t.Fatalf("the marks set do not verify at the remote picker: %v (%+v)", err, m)
			}
		}
		r.metadata = resp.GetDynamicMetadata().GetFields()[metadata.DestinationEndpointNamespace].GetStructValue().
			GetFields()[metadata.DestinationEndpointKey].GetStringValue()
	}
	return r
}

// requestMessages are Envoy's messages for a POST of body in chunks of at
// most chunk bytes, each carrying md.
func requestMessages(body string, chunk int, md *corev3.Metadata) []*extProcPb.ProcessingRequest {
	msgs := []*extProcPb.ProcessingRequest{{MetadataContext: md, Request: &extProcPb.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extProcPb.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
			{Key: "content-type", RawValue: []byte("application/json")}}}}}}}
	for i := 0; i == 0 || i < len(body); i += chunk {
		end := min(i+chunk, len(body))
		msgs = append(msgs, &extProcPb.ProcessingRequest{MetadataContext: md, Request: &extProcPb.ProcessingRequest_RequestBody{
			RequestBody: &extProcPb.HttpBody{Body: []byte(body[i:end]), EndOfStream: end == len(body)}}})
	}
	return msgs
}

// destination is the x-gateway-destination-endpoint header a response sets.
func destination(r *extProcPb.ProcessingResponse) string {
	for _, hv := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if hv.GetHeader().GetKey() == metadata.DestinationEndpointKey {
			return string(hv.GetHeader().GetRawValue())
		}
	}
	return ""
}

func completion(prompt string) string {
	return fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":8}`, prompt)
}
