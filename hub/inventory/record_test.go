package inventory

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/multicluster-runtime/providers/kubeconfig"

	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
)

// restart builds a second inventory on the same hub, as a restarted hub
// process would.
func restart(t *testing.T, hub client.Client) *Inventory {
	t.Helper()
	return New(Options{Hub: hub, Namespace: registrations, ProbeTimeout: 500 * time.Millisecond, Log: testr.New(t)})
}

func recorded(t *testing.T, hub client.Client) map[string]string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := hub.Get(context.Background(), client.ObjectKey{Namespace: registrations, Name: RecordName}, cm); err != nil {
		t.Fatalf("the availability record: %v", err)
	}
	return cm.Data
}

// A hub that restarts while a cluster is lost keeps counting the toleration
// from the loss: otherwise a hub restarting more often than the toleration
// would never fail the cluster over.
func TestALostClustersUnavailableSinceSurvivesAHubRestart(t *testing.T) {
	inv, hub := newInventory(t)
	srv := newAPIServer(t)
	srv.answer(http.StatusServiceUnavailable)
	engage(t, inv, "lost", srv.URL)
	lost := probeUntil(t, inv, "lost", false).UnavailableSince
	if got := recorded(t, hub)["lost"]; got != lost.UTC().Format(time.RFC3339) {
		t.Fatalf("recorded %q, want the loss at %s", got, lost.UTC().Format(time.RFC3339))
	}

	time.Sleep(1100 * time.Millisecond) // the record has second precision
	again := restart(t, hub)
	engage(t, again, "lost", srv.URL)
	since := probeUntil(t, again, "lost", false).UnavailableSince
	if want := lost.Truncate(time.Second); !since.Equal(want) {
		t.Fatalf("after a restart the cluster is unavailable since %s, want the first hub's %s", since, want)
	}

	srv.answer(http.StatusOK)
	probeUntil(t, again, "lost", true)
	if got, ok := recorded(t, hub)["lost"]; ok {
		t.Fatalf("the record still holds %q after the cluster came back", got)
	}
}

// A record is about the loss the earlier hub saw. Once this hub has seen the
// cluster answer, a later failure is a new loss that starts now.
func TestARecordIsForgottenOnceTheClusterAnswers(t *testing.T) {
	old := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	inv, _ := newInventory(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: RecordName},
		Data: map[string]string{"flaky": old}})
	srv := newAPIServer(t)
	engage(t, inv, "flaky", srv.URL)
	inv.probeAll(context.Background())
	srv.answer(http.StatusServiceUnavailable)
	began := time.Now()
	since := probeUntil(t, inv, "flaky", false).UnavailableSince
	if since.Before(began) {
		t.Fatalf("unavailable since %s, before this failure began at %s: the hour-old record was honoured after the cluster answered", since, began)
	}
}

// OCM's verdict carries its own time: the toleration counts from when the
// ManagedCluster's Available condition changed, not from when the hub read it.
func TestARegistrationsLossCountsFromItsConditionsTransition(t *testing.T) {
	mc := managedCluster("ocm", metav1.ConditionUnknown, "ManagedClusterLeaseUpdateStopped")
	changed := metav1.NewTime(time.Now().Add(-10 * time.Minute).Truncate(time.Second))
	mc.Status.Conditions[0].LastTransitionTime = changed
	inv, _ := newInventory(t, mc)
	srv := newAPIServer(t)
	engage(t, inv, "ocm", srv.URL)
	if since := probeUntil(t, inv, "ocm", false).UnavailableSince; !since.Equal(changed.Time) {
		t.Fatalf("unavailable since %s, want the condition's transition at %s", since, changed.Time)
	}
}

// A hub that cannot read a registration learns nothing about the cluster:
// the last verdict stands, in both directions.
func TestAFailedRegistrationReadKeepsTheLastVerdict(t *testing.T) {
	var failing bool
	mc := managedCluster("ocm", metav1.ConditionFalse, "Lost")
	hub := fakeapi.New(mc)
	hub.Inject(func(_ context.Context, verb string, obj runtime.Object) error {
		if _, ok := obj.(*clusterv1.ManagedCluster); ok && verb == "get" && failing {
			return errors.New("etcdserver: request timed out")
		}
		return nil
	})
	inv := New(Options{Hub: hub.Client, Namespace: registrations, ProbeTimeout: 500 * time.Millisecond, Log: testr.New(t)})
	srv := newAPIServer(t)
	engage(t, inv, "ocm", srv.URL)
	probeUntil(t, inv, "ocm", false)

	failing = true
	probeRounds(inv, maxProbeRounds)
	if c := snapshot(t, inv, "ocm"); c.Available() {
		t.Fatal("a cluster its ManagedCluster calls lost became available while the hub could not read the ManagedCluster")
	}

	failing = false
	mc.Status.Conditions[0].Status, mc.Status.Conditions[0].Reason = metav1.ConditionTrue, "Back"
	if err := hub.API.Status().Update(context.Background(), mc); err != nil {
		t.Fatal(err)
	}
	probeUntil(t, inv, "ocm", true)
	failing = true
	probeRounds(inv, maxProbeRounds)
	if c := snapshot(t, inv, "ocm"); !c.Available() {
		t.Fatalf("an available cluster became unavailable because the hub could not read its ManagedCluster: %s", c.Reason)
	}
}

// The end of an earlier engagement leaves the availability series of the
// engagement that replaced it.
func TestAReplacedEngagementKeepsItsAvailabilityMetric(t *testing.T) {
	inv, _ := newInventory(t)
	srv := newAPIServer(t)
	_, endFirst := engage(t, inv, "metric", srv.URL)
	engage(t, inv, "metric", srv.URL)
	endFirst()
	time.Sleep(200 * time.Millisecond)
	if got := testutil.ToFloat64(availableGauge.WithLabelValues("metric")); got != 1 {
		t.Fatalf("fleetinfer_hub_cluster_available{cluster=metric} = %v after the earlier engagement ended, want 1", got)
	}
}

// A registered cluster the hub has not engaged (a hub that started while it
// was down) is listed by Registered as unavailable since the loss an
// earlier hub recorded, or, with nothing recorded, since this hub started,
// which it records for the hubs after it. Engaged clusters are listed once.
func TestARegisteredClusterNotEngagedIsUnavailableSinceItsRecordedLoss(t *testing.T) {
	kubeconfigSecret := func(name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: name,
			Labels: map[string]string{kubeconfig.DefaultKubeconfigSecretLabel: "true"}}}
	}
	lost := time.Now().Add(-time.Hour).Truncate(time.Second)
	inv, hub := newInventory(t, kubeconfigSecret("up"), kubeconfigSecret("recorded"), kubeconfigSecret("unrecorded"),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: "not-a-registration"}},
		clusterProfile(registrations, "profiled", metav1.ConditionTrue, ""),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: RecordName},
			Data: map[string]string{"recorded": lost.UTC().Format(time.RFC3339)}})
	engage(t, inv, "up", newAPIServer(t).URL)

	got := inv.Registered().Clusters(context.Background())
	if want := []string{"profiled", "recorded", "unrecorded", "up"}; !slices.Equal(names(got), want) {
		t.Fatalf("Registered lists %v, want %v", names(got), want)
	}
	since := map[string]time.Time{}
	for _, c := range got {
		since[c.Name] = c.UnavailableSince
		if c.Name != "up" && (c.Available() || c.Client != nil) {
			t.Errorf("%s is listed available or with a client, want it unavailable and unreadable: %+v", c.Name, c)
		}
	}
	if !since["up"].IsZero() {
		t.Errorf("the engaged cluster is unavailable since %s", since["up"])
	}
	if !since["recorded"].Equal(lost) {
		t.Errorf("recorded is unavailable since %s, want the recorded loss %s", since["recorded"], lost)
	}
	if !since["unrecorded"].Equal(inv.startedAt()) {
		t.Errorf("unrecorded is unavailable since %s, want the hub's start %s", since["unrecorded"], inv.startedAt())
	}
	if got := recorded(t, hub)["unrecorded"]; got != inv.startedAt().UTC().Format(time.RFC3339) {
		t.Errorf("recorded %q for unrecorded, want the hub's start", got)
	}
}

// A hub that began to lead moments ago trusts no recorded loss of a cluster
// it has not engaged yet (the record may be a presumption left by a leader
// killed before it engaged the cluster): within EngageGrace the cluster is
// unavailable only since this hub began to lead, and nothing is recorded;
// when the grace ends, the services are told to decide again, and the
// recorded loss counts.
func TestANewLeaderTrustsARecordedLossOnlyAfterItsEngageGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	lost := time.Now().Add(-time.Hour).Truncate(time.Second)
	hub := fakeapi.New(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: "slow",
			Labels: map[string]string{kubeconfig.DefaultKubeconfigSecretLabel: "true"}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: registrations, Name: RecordName},
			Data: map[string]string{"slow": lost.UTC().Format(time.RFC3339)}}).Client
	inv := New(Options{Hub: hub, Namespace: registrations, ProbeInterval: time.Hour, EngageGrace: grace, Log: testr.New(t)})
	changes := inv.Subscribe(4)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = inv.Start(ctx) }()

	sinceOf := func() time.Time {
		got := inv.Registered().Clusters(context.Background())
		if len(got) != 1 || got[0].Available() {
			t.Fatalf("Registered lists %+v, want slow, unavailable", got)
		}
		return got[0].UnavailableSince
	}
	if since := sinceOf(); !since.Equal(inv.startedAt()) {
		t.Errorf("within the grace slow is unavailable since %s, want since the hub began to lead (%s), not the recorded %s", since, inv.startedAt(), lost)
	}
	select {
	case name := <-changes:
		if name != "slow" {
			t.Errorf("notified about %s at the grace's end, want slow", name)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification when the grace ended")
	}
	if since := sinceOf(); !since.Equal(lost) {
		t.Errorf("after the grace slow is unavailable since %s, want the recorded loss %s", since, lost)
	}
}
