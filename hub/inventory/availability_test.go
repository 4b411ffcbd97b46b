package inventory

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	fleettestutil "github.com/fleetinfer/fleetinfer/internal/testutil"
)

func managedCluster(name string, available metav1.ConditionStatus, reason string) *clusterv1.ManagedCluster {
	return &clusterv1.ManagedCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: clusterv1.ManagedClusterStatus{Conditions: []metav1.Condition{{
			Type: clusterv1.ManagedClusterConditionAvailable, Status: available, Reason: reason,
			LastTransitionTime: metav1.Now(),
		}}},
	}
}

func clusterProfile(namespace, name string, healthy metav1.ConditionStatus, reason string) *clusterinventoryv1alpha1.ClusterProfile {
	return &clusterinventoryv1alpha1.ClusterProfile{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Status: clusterinventoryv1alpha1.ClusterProfileStatus{Conditions: []metav1.Condition{{
			Type: clusterinventoryv1alpha1.ClusterConditionControlPlaneHealthy, Status: healthy, Reason: reason,
			LastTransitionTime: metav1.Now(),
		}}},
	}
}

// The API servers a case's cluster may have.
func readyServer(t *testing.T) string { return newAPIServer(t).URL }

func failingServer(t *testing.T) string {
	s := newAPIServer(t)
	s.answer(http.StatusInternalServerError)
	return s.URL
}

func closedServer(t *testing.T) string {
	s := httptest.NewServer(http.NotFoundHandler())
	s.Close()
	return s.URL
}

// hangingServer never answers /readyz; it lets go when the prober gives up.
func hangingServer(t *testing.T) string {
	s := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(s.Close)
	return s.URL
}

// A cluster is available when its API server answers /readyz and none of
// its registrations (OCM ManagedCluster, ClusterProfile in the inventory's
// namespace) says otherwise; otherwise it is unavailable and the reason
// names the cause.
func TestAvailabilityFollowsTheProbeAndTheRegistration(t *testing.T) {
	const name = "spoke"
	for _, tc := range []struct {
		name   string
		server func(*testing.T) string
		regs   []client.Object
		// wantReason are parts of the reason; none means available.
		wantReason []string
	}{
		{name: "probe answers and there is no registration", server: readyServer},
		{name: "probe answers and the ManagedCluster is Available", server: readyServer,
			regs: []client.Object{managedCluster(name, metav1.ConditionTrue, "ManagedClusterAvailable")}},
		{name: "probe answers and the ClusterProfile is ControlPlaneHealthy", server: readyServer,
			regs: []client.Object{clusterProfile(registrations, name, metav1.ConditionTrue, "Healthy")}},
		{name: "probe answers and both registrations are healthy", server: readyServer,
			regs: []client.Object{managedCluster(name, metav1.ConditionTrue, "ManagedClusterAvailable"),
				clusterProfile(registrations, name, metav1.ConditionTrue, "Healthy")}},
		{name: "a ClusterProfile in another namespace is not this cluster's", server: readyServer,
			regs: []client.Object{clusterProfile("elsewhere", name, metav1.ConditionFalse, "Unhealthy")}},
		{name: "a ManagedCluster of another name is not this cluster's", server: readyServer,
			regs: []client.Object{managedCluster("other", metav1.ConditionFalse, "Lost")}},

		{name: "ManagedCluster Available=False", server: readyServer,
			regs:       []client.Object{managedCluster(name, metav1.ConditionFalse, "LeaseUpdateStopped")},
			wantReason: []string{"ManagedCluster spoke", "Available=False", "LeaseUpdateStopped"}},
		{name: "ManagedCluster Available=Unknown", server: readyServer,
			regs:       []client.Object{managedCluster(name, metav1.ConditionUnknown, "StatusUnknown")},
			wantReason: []string{"ManagedCluster spoke", "Available=Unknown", "StatusUnknown"}},
		{name: "ClusterProfile ControlPlaneHealthy=False", server: readyServer,
			regs:       []client.Object{clusterProfile(registrations, name, metav1.ConditionFalse, "Unhealthy")},
			wantReason: []string{"ClusterProfile spoke", "ControlPlaneHealthy=False", "Unhealthy"}},
		{name: "ClusterProfile ControlPlaneHealthy=Unknown", server: readyServer,
			regs:       []client.Object{clusterProfile(registrations, name, metav1.ConditionUnknown, "Lost")},
			wantReason: []string{"ClusterProfile spoke", "ControlPlaneHealthy=Unknown", "Lost"}},
		{name: "ManagedCluster Available but ClusterProfile not healthy", server: readyServer,
			regs: []client.Object{managedCluster(name, metav1.ConditionTrue, "ManagedClusterAvailable"),
				clusterProfile(registrations, name, metav1.ConditionFalse, "Unhealthy")},
			wantReason: []string{"ClusterProfile spoke", "ControlPlaneHealthy=False"}},

		{name: "probe answers 500 although the registration is healthy", server: failingServer,
			regs:       []client.Object{managedCluster(name, metav1.ConditionTrue, "ManagedClusterAvailable")},
			wantReason: []string{"/readyz", "500"}},
		{name: "probe finds the listener closed", server: closedServer,
			wantReason: []string{"connection refused"}},
		{name: "probe gets no answer within the timeout", server: hangingServer,
			wantReason: []string{"/readyz", "exceeded"}}, // the client's or the context's timeout
	} {
		t.Run(tc.name, func(t *testing.T) {
			inv, _ := newInventory(t, tc.regs...)
			engage(t, inv, name, tc.server(t))
			wantAvailable := len(tc.wantReason) == 0
			c := probeUntil(t, inv, name, wantAvailable)
			if wantAvailable {
				if c.Reason != "" || !c.UnavailableSince.IsZero() {
					t.Errorf("available cluster has Reason %q, UnavailableSince %v; want neither", c.Reason, c.UnavailableSince)
				}
				return
			}
			for _, part := range tc.wantReason {
				if !strings.Contains(c.Reason, part) {
					t.Errorf("Reason %q does not mention %q", c.Reason, part)
				}
			}
		})
	}
}

// UnavailableSince is the toleration clock: it starts when the cluster
// becomes unavailable, keeps running while it stays unavailable (whatever
// the reason becomes), stops on recovery and starts afresh at the next
// failure. The availability gauge follows.
func TestUnavailableSinceStartsAtTheFailureAndClearsOnRecovery(t *testing.T) {
	const name = "since"
	ctx := context.Background()
	inv, hub := newInventory(t)
	srv := newAPIServer(t)
	engage(t, inv, name, srv.URL)
	gauge := func() float64 {
		m := &dto.Metric{}
		if err := availableGauge.WithLabelValues(name).Write(m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}

	probeUntil(t, inv, name, true)
	if g := gauge(); g != 1 {
		t.Errorf("gauge while available = %v, want 1", g)
	}

	before := time.Now()
	srv.answer(http.StatusServiceUnavailable)
	c := probeUntil(t, inv, name, false)
	after := time.Now()
	since := c.UnavailableSince
	if since.Before(before) || since.After(after) {
		t.Fatalf("UnavailableSince = %v, want between the first failed probe (%v) and the flip (%v)", since, before, after)
	}
	if g := gauge(); g != 0 {
		t.Errorf("gauge while unavailable = %v, want 0", g)
	}

	probeRounds(inv, 3)
	if c = snapshot(t, inv, name); !c.UnavailableSince.Equal(since) {
		t.Fatalf("UnavailableSince moved from %v to %v while the probe kept failing", since, c.UnavailableSince)
	}

	// The API server answers again, but OCM now reports the cluster lost:
	// still unavailable, so the clock keeps running.
	if err := hub.Create(ctx, managedCluster(name, metav1.ConditionFalse, "LeaseUpdateStopped")); err != nil {
		t.Fatal(err)
	}
	srv.answer(http.StatusOK)
	for round := 0; !strings.Contains(c.Reason, "ManagedCluster"); round++ {
		if round == maxProbeRounds {
			t.Fatalf("reason still %q after %d rounds with only the ManagedCluster unavailable", c.Reason, round)
		}
		inv.probeAll(ctx)
		if c = snapshot(t, inv, name); c.Available() || !c.UnavailableSince.Equal(since) {
			t.Fatalf("after the cause changed: Available()=%v UnavailableSince=%v, want unavailable since %v", c.Available(), c.UnavailableSince, since)
		}
	}

	mc := &clusterv1.ManagedCluster{}
	if err := hub.Get(ctx, client.ObjectKey{Name: name}, mc); err != nil {
		t.Fatal(err)
	}
	mc.Status.Conditions[0].Status, mc.Status.Conditions[0].Reason = metav1.ConditionTrue, "ManagedClusterAvailable"
	if err := hub.Status().Update(ctx, mc); err != nil {
		t.Fatal(err)
	}
	c = probeUntil(t, inv, name, true)
	if !c.UnavailableSince.IsZero() || c.Reason != "" {
		t.Fatalf("after recovery UnavailableSince=%v Reason=%q, want zero and empty", c.UnavailableSince, c.Reason)
	}
	if g := gauge(); g != 1 {
		t.Errorf("gauge after recovery = %v, want 1", g)
	}

	again := time.Now()
	srv.answer(http.StatusInternalServerError)
	if c = probeUntil(t, inv, name, false); c.UnavailableSince.Before(again) {
		t.Fatalf("UnavailableSince after a second failure = %v, want a fresh clock from %v", c.UnavailableSince, again)
	}
}

// The probe speaks to the API server with the cluster's own credentials.
func TestProbeUsesTheClustersCredentials(t *testing.T) {
	inv, _ := newInventory(t)
	srv := newAPIServer(t)
	engage(t, inv, "creds", srv.URL)
	inv.probeAll(context.Background())
	if n := srv.hits.Load(); n != 1 {
		t.Fatalf("/readyz asked %d times in one probe round, want 1", n)
	}
	if got, _ := srv.auth.Load().(string); got != "Bearer token-creds" {
		t.Fatalf("probe sent Authorization %q, want the cluster's bearer token", got)
	}
}

// Start probes every ProbeInterval until its context ends, then returns nil.
func TestStartProbesUntilStopped(t *testing.T) {
	const name = "started"
	inv, _ := newInventory(t)
	inv.opts.ProbeInterval = 20 * time.Millisecond
	srv := newAPIServer(t)
	srv.answer(http.StatusInternalServerError)
	engage(t, inv, name, srv.URL)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- inv.Start(ctx) }()
	fleettestutil.Eventually(t, 5*time.Second, "Start's probes find the cluster unavailable", func(context.Context) error {
		if c := snapshot(t, inv, name); c.Available() {
			return fmt.Errorf("still available after %d probes", srv.hits.Load())
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Start returned %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
}

// A cluster whose rest config cannot make a client is refused, not tracked.
func TestEngageRefusesAClusterItCannotProbe(t *testing.T) {
	inv, _ := newInventory(t)
	cl := &fakeCluster{cfg: &rest.Config{Host: "https://127.0.0.1:1", TLSClientConfig: rest.TLSClientConfig{CAFile: t.TempDir() + "/missing-ca.crt"}}}
	if err := inv.Engage(t.Context(), multicluster.ClusterName("broken"), cl); err == nil {
		t.Fatal("Engage accepted a cluster whose CA file does not exist")
	}
	if cs := inv.Clusters(context.Background()); len(cs) != 0 {
		t.Fatalf("Clusters() = %v after a refused Engage, want none", names(cs))
	}
}
