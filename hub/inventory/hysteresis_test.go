package inventory

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A server URL written with a trailing slash (as many kubeconfigs have it)
// is probed at /readyz, not //readyz, so a healthy cluster stays available.
func TestProbeURLJoinsTheServerPath(t *testing.T) {
	inv, _ := newInventory(t)
	srv := newAPIServer(t)
	engage(t, inv, "slash", srv.URL+"/")
	probeRounds(inv, 5)
	if c := snapshot(t, inv, "slash"); !c.Available() {
		t.Fatalf("cluster with server %s/ is unavailable: %s", srv.URL, c.Reason)
	}
	if n := srv.hits.Load(); n != 5 {
		t.Fatalf("/readyz answered %d of 5 probes, want every one", n)
	}
}

// watched engages a cluster named name on a fresh inventory with a ready
// API server, subscribed to its changes, and takes the engagement notice.
func watched(t *testing.T, name string) (*Inventory, *apiServer, <-chan string) {
	t.Helper()
	inv, _ := newInventory(t)
	ch := inv.Subscribe(16)
	srv := newAPIServer(t)
	engage(t, inv, name, srv.URL)
	expectNotified(t, ch, name)
	return inv, srv, ch
}

// probeSequence answers each probe round with the next status of seq and
// returns the cluster's availability after each round.
func probeSequence(t *testing.T, inv *Inventory, srv *apiServer, name string, seq ...int) []bool {
	t.Helper()
	var out []bool
	for _, status := range seq {
		srv.answer(status)
		inv.probeAll(context.Background())
		out = append(out, snapshot(t, inv, name).Available())
	}
	return out
}

// With the default thresholds (3 failures, 2 successes) scattered failed
// probes never flip a cluster; 3 in a row do, and the toleration clock
// starts at the first of them; 2 good probes in a row bring it back.
func TestProbesFlipAvailabilityOnlyAfterConsecutiveResults(t *testing.T) {
	const bad, good = http.StatusInternalServerError, http.StatusOK
	t.Run("one failure in three never flips a cluster", func(t *testing.T) {
		inv, srv, ch := watched(t, "blips")
		for round, ok := range probeSequence(t, inv, srv, "blips", bad, good, good, bad, good, good, bad, bad, good, bad) {
			if !ok {
				t.Fatalf("unavailable after probe %d of a sequence without 3 failures in a row", round+1)
			}
		}
		expectQuiet(t, ch)
	})
	t.Run("three consecutive failures flip it, unavailable since the first", func(t *testing.T) {
		inv, srv, ch := watched(t, "lost")
		probeSequence(t, inv, srv, "lost", good)
		before := time.Now()
		got := probeSequence(t, inv, srv, "lost", bad)
		afterFirst := time.Now()
		got = append(got, probeSequence(t, inv, srv, "lost", bad, bad)...)
		if want := []bool{true, true, false}; !slices.Equal(got, want) {
			t.Fatalf("available after each failed probe %v, want %v", got, want)
		}
		expectNotified(t, ch, "lost")
		c := snapshot(t, inv, "lost")
		if c.UnavailableSince.Before(before) || c.UnavailableSince.After(afterFirst) {
			t.Errorf("UnavailableSince %v, want the first failed probe's time (between %v and %v)", c.UnavailableSince, before, afterFirst)
		}

		// One good probe is not enough; a failure restarts the count.
		if got := probeSequence(t, inv, srv, "lost", good, bad, good); !slices.Equal(got, []bool{false, false, false}) {
			t.Fatalf("available after good, bad, good %v, want unavailable throughout", got)
		}
		if c2 := snapshot(t, inv, "lost"); !c2.UnavailableSince.Equal(c.UnavailableSince) {
			t.Errorf("UnavailableSince moved from %v to %v while recovering", c.UnavailableSince, c2.UnavailableSince)
		}
		expectQuiet(t, ch)
		if got := probeSequence(t, inv, srv, "lost", good); !slices.Equal(got, []bool{true}) {
			t.Fatalf("unavailable after 2 good probes in a row")
		}
		expectNotified(t, ch, "lost")
		if c := snapshot(t, inv, "lost"); !c.UnavailableSince.IsZero() || c.Reason != "" {
			t.Errorf("recovered cluster has UnavailableSince %v, Reason %q", c.UnavailableSince, c.Reason)
		}
	})
	t.Run("the thresholds are options", func(t *testing.T) {
		inv, _ := newInventory(t)
		inv.opts.ProbeFailureThreshold, inv.opts.ProbeSuccessThreshold = 1, 3
		srv := newAPIServer(t)
		engage(t, inv, "strict", srv.URL)
		if got := probeSequence(t, inv, srv, "strict", bad, good, good, good); !slices.Equal(got, []bool{false, false, false, true}) {
			t.Fatalf("available after bad, good, good, good %v, want false false false true", got)
		}
	})
}

// The registration's verdict needs no streak: OCM saying the cluster is
// lost makes it unavailable at the next round.
func TestTheRegistrationsVerdictAppliesAtOnce(t *testing.T) {
	inv, _ := newInventory(t, managedCluster("ocm", metav1.ConditionFalse, "LeaseUpdateStopped"))
	srv := newAPIServer(t)
	engage(t, inv, "ocm", srv.URL)
	inv.probeAll(context.Background())
	if c := snapshot(t, inv, "ocm"); c.Available() {
		t.Fatal("available after one round although its ManagedCluster is Available=False")
	}
}
