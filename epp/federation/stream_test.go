package federation

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

var testPool = types.NamespacedName{Namespace: "llm", Name: "llama"}

// localPods is a stand-in for GIE's datastore whose pods are scraped, with
// unchanged values, whenever they are listed.
type localPods struct {
	mu  sync.Mutex
	eps []fwkdl.Endpoint
}

func (l *localPods) list() []fwkdl.Endpoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ep := range l.eps {
		m := ep.GetMetrics().Clone()
		m.UpdateTime = time.Now()
		ep.UpdateMetrics(m)
	}
	return append([]fwkdl.Endpoint(nil), l.eps...)
}

func (l *localPods) set(eps ...fwkdl.Endpoint) {
	l.mu.Lock()
	l.eps = eps
	l.mu.Unlock()
}

func localPod(name, ip string, waiting int) *fwkdl.ModelServer {
	m := fwkdl.NewMetrics()
	m.WaitingQueueSize, m.KVCacheUsagePercent, m.UpdateTime = waiting, 0.25, time.Now()
	return fwkdl.NewEndpoint(&fwkdl.EndpointMetadata{
		NamespacedName: types.NamespacedName{Namespace: testPool.Namespace, Name: name + "-rank-0"},
		PodName:        name, Address: ip, Port: "8000", Labels: map[string]string{"app": "llama"},
	}, m)
}

// cluster is one side of a federation test: a publisher serving its local
// pods and the credentials of its identity.
type cluster struct {
	name, identity string
	creds          *Credentials
	local          *localPods
	publisher      *Publisher
	credsDir       string
	addr           string
	stop           func()
}

func newCluster(t *testing.T, ca *federationtest.CA, name string, dir *DirectoryFile) *cluster {
	t.Helper()
	return newClusterAt(t, ca, name, dir, "127.0.0.1:0", nil)
}

// newClusterAt starts a cluster's publisher at addr serving local (new,
// empty pods when nil), as a restarted EPP on the same address would.
func newClusterAt(t *testing.T, ca *federationtest.CA, name string, dir *DirectoryFile, addr string, local *localPods) *cluster {
	t.Helper()
	if local == nil {
		local = &localPods{}
	}
	c := &cluster{name: name, identity: "spiffe://fleet.test/" + name, local: local}
	c.credsDir = t.TempDir()
	c.creds = loadCreds(t, ca, c.credsDir, c.identity)
	pub := NewPublisher(PublisherOptions{Pool: testPool, Local: c.local.list, Interval: 10 * time.Millisecond,
		Heartbeat: 50 * time.Millisecond, LaggingAfter: time.Second, Authorize: Authorize(dir, testPool, name), Roots: c.creds.Roots, Log: logr.Discard()})
	c.publisher = pub
	srv := grpc.NewServer(ServerOptions(c.creds)...)
	federationv1.RegisterFederationServer(srv, pub)
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.addr = lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _ = pub.Run(ctx) }()
	go pub.ReauthorizeOn(ctx, time.Minute, dir.Changed(), c.creds.Changed())
	go func() { _ = srv.Serve(lis) }()
	var once sync.Once
	c.stop = func() { once.Do(func() { cancel(); srv.Stop() }) }
	t.Cleanup(c.stop)
	return c
}

func loadCreds(t *testing.T, ca *federationtest.CA, dir, identity string) *Credentials {
	t.Helper()
	f, err := ca.WriteFiles(dir, identity)
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadCredentials(TLSFiles{CertFile: f.Cert, KeyFile: f.Key, CAFile: f.CA}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeDirectory(t *testing.T, peers ...fleetv1alpha1.Peer) *DirectoryFile {
	t.Helper()
	path := filepath.Join(t.TempDir(), "peers.yaml")
	writeDirectoryFile(t, path, peers...)
	d := &DirectoryFile{Path: path, Interval: 20 * time.Millisecond, Log: logr.Discard()}
	if err := d.Load(); err != nil {
		t.Fatal(err)
	}
	return d
}

func writeDirectoryFile(t *testing.T, path string, peers ...fleetv1alpha1.Peer) {
	t.Helper()
	s, err := yaml.Marshal(fleetv1alpha1.PeerDirectory{Peers: peers})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, s, 0o600); err != nil {
		t.Fatal(err)
	}
}

// testDestinations admit the loopback addresses the tests' pods have, as
// the local fleet does.
var testDestinations = Destinations{AllowLoopback: true}

// subscribe runs a subscriber for cluster self following dir into a new
// store with a staleness bound of a second.
func subscribe(t *testing.T, self string, creds *Credentials, dir *DirectoryFile) *Store {
	t.Helper()
	return subscribeWith(t, self, creds, dir, time.Second, 0)
}

// subscribeWith is subscribe with the staleness bound staleAfter, measuring
// round trips every ping (0: never).
func subscribeWith(t *testing.T, self string, creds *Credentials, dir *DirectoryFile, staleAfter, ping time.Duration) *Store {
	t.Helper()
	store := NewStore(staleAfter)
	sub := NewSubscriber(SubscriberOptions{Cluster: self, Pool: testPool, DefaultMode: fleetv1alpha1.FederationEndpoint, Store: store,
		Credentials: creds, Limits: DefaultLimits, Destinations: testDestinations, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		PingInterval: ping, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sub.Run(ctx, dir) }()
	t.Cleanup(func() { cancel(); <-done })
	return store
}

func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func remote(s *Store) map[string]fwkdl.Endpoint {
	out := map[string]fwkdl.Endpoint{}
	for _, ep := range s.Remote(time.Now()).AppendFresh(nil) {
		out[ep.GetMetadata().NamespacedName.Name] = ep
	}
	return out
}

func TestSubscriberMirrorsPeerPodsAndFollowsChangesAndRemovals(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	// Both clusters read the same directory, as the hub would publish it.
	path := filepath.Join(t.TempDir(), "peers.yaml")
	dir := &DirectoryFile{Path: path, Interval: 20 * time.Millisecond, Log: logr.Discard()}
	writeDirectoryFile(t, path, fleetv1alpha1.Peer{Cluster: "east", FederationAddress: "127.0.0.1:1", Identity: "spiffe://fleet.test/east"})
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	west := newCluster(t, ca, "west", dir)
	east := newCluster(t, ca, "east", dir)
	writeDirectoryFile(t, path,
		fleetv1alpha1.Peer{Cluster: "east", FederationAddress: east.addr, Identity: east.identity},
		fleetv1alpha1.Peer{Cluster: "west", FederationAddress: west.addr, Identity: west.identity})
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	west.local.set(localPod("a", "127.12.0.1", 0), localPod("b", "127.12.0.2", 3))
	store := subscribe(t, "east", east.creds, dir)

	waitFor(t, "west's pods mirrored", func() error {
		got := remote(store)
		b, ok := got["b-rank-0@west"]
		if len(got) != 2 || !ok {
			return fmt.Errorf("remote endpoints %v", got)
		}
		md, m := b.GetMetadata(), b.GetMetrics()
		if md.Address != "127.12.0.2" || md.Port != "8000" || md.Labels[ClusterLabel] != "west" || md.Labels["app"] != "llama" {
			return fmt.Errorf("metadata %+v", md)
		}
		if m.WaitingQueueSize != 3 || m.KVCacheUsagePercent != 0.25 {
			return fmt.Errorf("metrics %+v", m)
		}
		if o := OriginOf(b.GetAttributes()); o == nil || o.Cluster != "west" || o.Mode != fleetv1alpha1.FederationEndpoint {
			return fmt.Errorf("origin %+v", o)
		}
		return nil
	})

	west.local.set(localPod("a", "127.12.0.1", 7))
	waitFor(t, "change and removal mirrored", func() error {
		got := remote(store)
		if a, ok := got["a-rank-0@west"]; len(got) != 1 || !ok || a.GetMetrics().WaitingQueueSize != 7 {
			return fmt.Errorf("remote endpoints %v", got)
		}
		return nil
	})

	// Unchanged data stays fresh through heartbeats, well past the bound.
	time.Sleep(1500 * time.Millisecond)
	if got := remote(store); len(got) != 1 {
		t.Fatalf("unchanged endpoint went stale: %v", got)
	}

	west.stop()
	waitFor(t, "west's pods dropped when its stream breaks", func() error {
		if n := store.Count()["west"]; n != 0 {
			return fmt.Errorf("%d endpoints left", n)
		}
		return nil
	})
}

// The picker of a cluster that only imports the pool is listed as a
// subscribe-only peer: publishers admit it, and no picker dials it.
func TestSubscribeOnlyPeerIsServedButNeverDialled(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "peers.yaml")
	writeDirectoryFile(t, path, fleetv1alpha1.Peer{Cluster: "edge", Identity: "spiffe://fleet.test/edge", SubscribeOnly: true})
	dir := &DirectoryFile{Path: path, Interval: 20 * time.Millisecond, Log: logr.Discard()}
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	west := newCluster(t, ca, "west", dir)
	west.local.set(localPod("a", "127.12.0.1", 0))
	writeDirectoryFile(t, path, fleetv1alpha1.Peer{Cluster: "edge", Identity: "spiffe://fleet.test/edge", SubscribeOnly: true},
		fleetv1alpha1.Peer{Cluster: "west", FederationAddress: west.addr, Identity: west.identity})
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}

	edge := subscribe(t, "edge", loadCreds(t, ca, t.TempDir(), "spiffe://fleet.test/edge"), dir)
	waitFor(t, "west's pod mirrored at the importer", func() error {
		if got := remote(edge); len(got) != 1 {
			return fmt.Errorf("remote endpoints %v", got)
		}
		return nil
	})

	sub := NewSubscriber(SubscriberOptions{Cluster: "west", Pool: testPool, Store: NewStore(time.Second), Credentials: west.creds,
		Limits: DefaultLimits, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub.sync(ctx, dir.Current())
	sub.mu.Lock()
	n := len(sub.running)
	sub.mu.Unlock()
	if n != 0 {
		t.Fatalf("west follows %d peers, want none: edge only subscribes", n)
	}
}

func TestPublisherRefusesIdentityOutsideTheDirectory(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	dir := writeDirectory(t, fleetv1alpha1.Peer{Cluster: "east", FederationAddress: "127.0.0.1:1", Identity: "spiffe://fleet.test/east"})
	west := newCluster(t, ca, "west", dir)
	west.local.set(localPod("a", "127.12.0.1", 0))
	// A certificate from the right CA with an identity nobody listed.
	creds := loadCreds(t, ca, t.TempDir(), "spiffe://fleet.test/intruder")
	err = subscribeOnce(west.addr, creds.ClientConfig(west.identity))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("subscription by an unknown identity: %v, want PermissionDenied", err)
	}
}

func TestPublisherRefusesClientWithoutCertificate(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	dir := writeDirectory(t)
	west := newCluster(t, ca, "west", dir)
	cfg := west.creds.ClientConfig(west.identity)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	if err := subscribeOnce(west.addr, cfg); status.Code(err) != codes.Unavailable {
		t.Fatalf("subscription without a client certificate: %v, want the handshake to fail", err)
	}
}

func TestSubscriberRefusesServerWithAnotherIdentity(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	dir := writeDirectory(t, fleetv1alpha1.Peer{Cluster: "east", FederationAddress: "127.0.0.1:1", Identity: "spiffe://fleet.test/east"})
	west := newCluster(t, ca, "west", dir)
	creds := loadCreds(t, ca, t.TempDir(), "spiffe://fleet.test/east")
	// East expects someone else at west's address.
	if err := subscribeOnce(west.addr, creds.ClientConfig("spiffe://fleet.test/central")); status.Code(err) != codes.Unavailable {
		t.Fatalf("subscription to an impostor: %v, want the handshake to fail", err)
	}
}

// subscribeOnce opens a subscription and returns the error of its first
// receive.
func subscribeOnce(addr string, cfg *tls.Config) error {
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(grpccreds.NewTLS(cfg)))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := federationv1.NewFederationClient(conn).Subscribe(ctx,
		&federationv1.SubscribeRequest{PoolNamespace: testPool.Namespace, PoolName: testPool.Name})
	if err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}

func TestSubscriberReconnectsWhenThePeerComesBack(t *testing.T) {
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "peers.yaml")
	writeDirectoryFile(t, path, fleetv1alpha1.Peer{Cluster: "east", FederationAddress: "127.0.0.1:1", Identity: "spiffe://fleet.test/east"})
	dir := &DirectoryFile{Path: path, Interval: 20 * time.Millisecond, Log: logr.Discard()}
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	west := newCluster(t, ca, "west", dir)
	east := newCluster(t, ca, "east", dir)
	west.local.set(localPod("a", "127.12.0.1", 0))
	writeDirectoryFile(t, path, fleetv1alpha1.Peer{Cluster: "east", FederationAddress: east.addr, Identity: east.identity},
		fleetv1alpha1.Peer{Cluster: "west", FederationAddress: west.addr, Identity: west.identity})
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	store := subscribe(t, "east", east.creds, dir)
	waitFor(t, "west subscribed", holds(store, "west", 1))
	west.stop()
	waitFor(t, "west dropped", holds(store, "west", 0))
	newClusterAt(t, ca, "west", dir, west.addr, west.local)
	waitFor(t, "west back after reconnecting", holds(store, "west", 1))
}

// holds checks that store holds n endpoints of cluster.
func holds(store *Store, cluster string, n int) func() error {
	return func() error {
		if got := store.Count()[cluster]; got != n {
			return fmt.Errorf("%d endpoints of %s, want %d", got, cluster, n)
		}
		return nil
	}
}
