package epp

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// Hostile peers: a peer with a valid certificate that announces endpoints
// no peer has, and one that floods. The receiver is east (own pods in
// 10.1.0.0/16); the peer is west, whose registration gives 10.2.0.0/16.

const (
	hostileIdentity = "spiffe://fleetinfer.test/hostile-west"
	eastIdentity    = "spiffe://fleetinfer.test/east"
)

// scriptedPeer is a publisher that says what its script says: first, then
// next(seq) for every later message as fast as the stream takes them (nil:
// a heartbeat every 100 ms).
type scriptedPeer struct {
	federationv1.UnimplementedFederationServer
	first func() *federationv1.Update
	next  func(seq uint64) *federationv1.Update
}

func (p *scriptedPeer) Subscribe(_ *federationv1.SubscribeRequest, st federationv1.Federation_SubscribeServer) error {
	u := p.first()
	u.Seq, u.SentUnixNano = 1, time.Now().UnixNano()
	if err := st.Send(u); err != nil {
		return err
	}
	for seq := uint64(2); ; seq++ {
		var u *federationv1.Update
		if p.next != nil {
			u = p.next(seq)
		} else {
			select {
			case <-st.Context().Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			u = &federationv1.Update{CurrentUnixNano: time.Now().UnixNano()}
		}
		u.Seq, u.SentUnixNano = seq, time.Now().UnixNano()
		if err := st.Send(u); err != nil {
			return err
		}
	}
}

// serve serves the peer with the credentials in dir on a loopback port.
func (p *scriptedPeer) serve(tb testing.TB, files federationtest.Files) string {
	tb.Helper()
	creds, err := federation.LoadCredentials(federation.TLSFiles{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA}, logr.Discard())
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer(federation.ServerOptions(creds)...)
	federationv1.RegisterFederationServer(srv, p)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	tb.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// announced is an endpoint at addr with no load, freshly scraped.
func announced(id uint32, addr string) *federationv1.Endpoint {
	return &federationv1.Endpoint{Id: id,
		Spec:    &federationv1.EndpointSpec{Name: fmt.Sprintf("ep-%d", id), PodName: fmt.Sprintf("pod-%d", id), Address: addr, Port: 8000},
		Metrics: &federationv1.EndpointMetrics{ScrapeUnixNano: time.Now().UnixNano()}}
}

// eastSubscribes runs east's subscriber to the peer at addr, as the hub's
// directory lists it, into a new store.
func eastSubscribes(t testing.TB, ca *federationtest.CA, addr string) *federation.Store {
	t.Helper()
	dir := t.TempDir()
	files, err := ca.WriteFiles(dir, eastIdentity)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := federation.LoadCredentials(federation.TLSFiles{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "peers.yaml")
	peers := fmt.Sprintf("ownEndpointCIDRs: [10.1.0.0/16]\npeers:\n- {cluster: west, federationAddress: %q, identity: %q, endpointCIDRs: [10.2.0.0/16]}\n", addr, hostileIdentity)
	if err := os.WriteFile(path, []byte(peers), 0o600); err != nil {
		t.Fatal(err)
	}
	df := &federation.DirectoryFile{Path: path, Interval: time.Hour, Log: logr.Discard()}
	if err := df.Load(); err != nil {
		t.Fatal(err)
	}
	store := federation.NewStore(2 * time.Second)
	sub := federation.NewSubscriber(federation.SubscriberOptions{Cluster: "east", Pool: testPool, DefaultMode: fleetv1alpha1.FederationEndpoint,
		Store: store, Credentials: creds, Limits: federation.DefaultLimits, MinBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second,
		Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(ctx, df) }()
	t.Cleanup(func() { cancel(); <-done })
	return store
}

// saturatedEast is east's own pods, none with headroom, so that requests
// spill to west.
func saturatedEast() []fwkdl.Endpoint {
	return []fwkdl.Endpoint{endpoint("east-0", "10.1.0.1:8000", 10, nil), endpoint("east-1", "10.1.0.2:8000", 10, nil)}
}

func TestAPeerAnnouncingAddressesNoPeerHasGetsNoPicks(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	files, err := ca.WriteFiles(t.TempDir(), hostileIdentity)
	if err != nil {
		t.Fatal(err)
	}
	hostile := []string{"127.0.0.1", "169.254.169.254", "0.0.0.0", "::1", "10.1.0.5", "10.3.0.1"}
	reasons := []string{federation.RefusedLoopback, federation.RefusedLinkLocal, federation.RefusedUnspecified,
		federation.RefusedLoopback, federation.RefusedOwnRange, federation.RefusedOutside}
	before := refusals(t)
	peer := &scriptedPeer{first: func() *federationv1.Update {
		u := &federationv1.Update{Snapshot: true, CurrentUnixNano: time.Now().UnixNano()}
		for i, addr := range hostile {
			u.Upserts = append(u.Upserts, announced(uint32(i+1), addr))
		}
		u.Upserts = append(u.Upserts, announced(100, "10.2.0.7"))
		return u
	}}
	store := eastSubscribes(t, ca, peer.serve(t, files))
	deadline := time.Now().Add(5 * time.Second)
	for store.Count()["west"] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("east holds %v of west's endpoints, want the one in its range", store.Count())
		}
		time.Sleep(10 * time.Millisecond)
	}
	h := newHarnessConfig(t, saturatedEast(), store, testConfig)
	picks := map[string]int{}
	for range 200 {
		picks[h.request(t, completion("hello"), 1<<20, nil).dest]++
	}
	for dest := range picks {
		host, _, _ := net.SplitHostPort(dest)
		for _, addr := range hostile {
			if host == addr || strings.Trim(host, "[]") == addr {
				t.Errorf("%d picks to %s", picks[dest], dest)
			}
		}
	}
	if picks["10.2.0.7:8000"] == 0 {
		t.Errorf("picks %v: none to west's endpoint in its range", picks)
	}
	want := map[string]float64{}
	for _, r := range reasons {
		want[r]++
	}
	after := refusals(t)
	for r, n := range want {
		if d := after[r] - before[r]; d != n {
			t.Errorf("%v refusals counted for %s, want %v", d, r, n)
		}
	}
	t.Logf("picks: %v; refusals: %v", picks, after)
}

// refusals reads fleetinfer_epp_federation_endpoints_refused_total of peer
// west, by reason.
func refusals(t testing.TB) map[string]float64 {
	t.Helper()
	return gatheredBy(t, "fleetinfer_epp_federation_endpoints_refused_total", map[string]string{"peer": "west"}, "reason")
}

// gathered sums the series of the federation metric name whose labels
// include match.
func gathered(t testing.TB, name string, match map[string]string) float64 {
	t.Helper()
	var sum float64
	for _, v := range gatheredBy(t, name, match, "") {
		sum += v
	}
	return sum
}

// gatheredBy sums the series of the federation metric name whose labels
// include match, by the value of label by.
func gatheredBy(t testing.TB, name string, match map[string]string, by string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(federation.Collectors()...)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if matches(labels, match) {
				out[labels[by]] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func matches(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}
