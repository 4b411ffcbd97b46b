package inventory

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
)

// registrations is the namespace of the registration Secrets and
// ClusterProfiles in these tests.
const registrations = "fleet-system"

// maxProbeRounds bounds how many probe rounds a steady cause may take to
// change a cluster's availability. The inventory may want more than one
// failed or good probe before it flips (hysteresis), but not unboundedly many.
const maxProbeRounds = 10

// fakeCluster is the part of a multicluster-runtime cluster the inventory
// uses: its rest config (to probe it) and its clients (handed out in
// Clusters). Any other method panics on the nil embedded interface.
type fakeCluster struct {
	cluster.Cluster
	cfg    *rest.Config
	client client.Client
	reader client.Reader
}

func (f *fakeCluster) GetConfig() *rest.Config     { return f.cfg }
func (f *fakeCluster) GetClient() client.Client    { return f.client }
func (f *fakeCluster) GetAPIReader() client.Reader { return f.reader }

// apiServer stands in for a cluster's API server: /readyz answers status
// (200 unless set), every other path 404; it records the last Authorization
// header /readyz saw and how often it was asked.
type apiServer struct {
	*httptest.Server
	status atomic.Int32
	auth   atomic.Value
	hits   atomic.Int32
}

func newAPIServer(t *testing.T) *apiServer {
	t.Helper()
	s := &apiServer{}
	s.status.Store(http.StatusOK)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		s.hits.Add(1)
		s.auth.Store(r.Header.Get("Authorization"))
		w.WriteHeader(int(s.status.Load()))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *apiServer) answer(status int) { s.status.Store(int32(status)) }

// newInventory builds an inventory whose hub holds objs.
func newInventory(t *testing.T, objs ...client.Object) (*Inventory, client.Client) {
	t.Helper()
	hub := fakeapi.New(objs...).Client
	inv := New(Options{Hub: hub, Namespace: registrations, ProbeTimeout: 500 * time.Millisecond, Log: testr.New(t)})
	return inv, hub
}

// newFakeCluster is a cluster whose API server is at host, with a bearer
// token of its own and an empty fake API.
func newFakeCluster(name, host string) *fakeCluster {
	spoke := fakeapi.NewSpoke()
	return &fakeCluster{cfg: &rest.Config{Host: host, BearerToken: "token-" + name}, client: spoke.Client, reader: spoke.Reader}
}

// engage engages a cluster whose API server is at host until the returned
// cancel is called or the test ends.
func engage(t *testing.T, inv *Inventory, name, host string) (*fakeCluster, context.CancelFunc) {
	t.Helper()
	cl := newFakeCluster(name, host)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := inv.Engage(ctx, multicluster.ClusterName(name), cl); err != nil {
		t.Fatalf("Engage(%s): %v", name, err)
	}
	return cl, cancel
}

// snapshot returns the inventory's snapshot of name, failing the test when
// it is not engaged.
func snapshot(t *testing.T, inv *Inventory, name string) Cluster {
	t.Helper()
	c, ok := inv.Cluster(context.Background(), name)
	if !ok {
		t.Fatalf("cluster %s is not in the inventory", name)
	}
	return c
}

// probeUntil runs probe rounds until name's availability is want, at most
// maxProbeRounds, and returns the snapshot.
func probeUntil(t *testing.T, inv *Inventory, name string, want bool) Cluster {
	t.Helper()
	var c Cluster
	for range maxProbeRounds {
		inv.probeAll(context.Background())
		if c = snapshot(t, inv, name); c.Available() == want {
			return c
		}
	}
	t.Fatalf("cluster %s: Available()=%v after %d probe rounds, want %v (reason %q)", name, c.Available(), maxProbeRounds, want, c.Reason)
	return c
}

// probeRounds runs n probe rounds.
func probeRounds(inv *Inventory, n int) {
	for range n {
		inv.probeAll(context.Background())
	}
}

// names lists the clusters' names in their order.
func names(cs []Cluster) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}
