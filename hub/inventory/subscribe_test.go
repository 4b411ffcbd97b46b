package inventory

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

// expectNotified receives len(want) names from ch, waiting up to 5 s for
// each, checks they are want (in any order) and that nothing else is queued.
func expectNotified(t *testing.T, ch <-chan string, want ...string) {
	t.Helper()
	var got []string
	for range want {
		select {
		case n := <-ch:
			got = append(got, n)
		case <-time.After(5 * time.Second):
			t.Fatalf("notified of %v, want %v", got, want)
		}
	}
	slices.Sort(got)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("notified of %v, want %v", got, want)
	}
	expectQuiet(t, ch)
}

// expectQuiet checks that nothing is queued on ch. The inventory notifies
// before Engage and a probe round return, so nothing arrives later from them.
func expectQuiet(t *testing.T, ch <-chan string) {
	t.Helper()
	select {
	case n := <-ch:
		t.Fatalf("notified of %q when nothing changed", n)
	default:
	}
}

// A subscriber hears a cluster's name when it joins, when its availability
// flips either way and when it leaves, and nothing while it stays as it is.
func TestSubscribersAreToldOfJoiningFlippingAndLeaving(t *testing.T) {
	const name = "told"
	inv, _ := newInventory(t)
	ch := inv.Subscribe(16)
	srv := newAPIServer(t)
	_, disengage := engage(t, inv, name, srv.URL)
	expectNotified(t, ch, name)

	probeRounds(inv, 3)
	expectQuiet(t, ch)

	srv.answer(http.StatusInternalServerError)
	probeUntil(t, inv, name, false)
	expectNotified(t, ch, name)
	probeRounds(inv, 3)
	expectQuiet(t, ch)

	srv.answer(http.StatusOK)
	probeUntil(t, inv, name, true)
	expectNotified(t, ch, name)
	probeRounds(inv, 3)
	expectQuiet(t, ch)

	disengage()
	expectNotified(t, ch, name)
	if cs := inv.Clusters(t.Context()); len(cs) != 0 {
		t.Fatalf("Clusters() = %v after the only cluster left, want none", names(cs))
	}
}

// A change to one cluster names that cluster only.
func TestSubscribersHearOnlyTheClusterThatChanged(t *testing.T) {
	inv, _ := newInventory(t)
	steady, flapping := newAPIServer(t), newAPIServer(t)
	engage(t, inv, "steady", steady.URL)
	engage(t, inv, "flapping", flapping.URL)
	ch := inv.Subscribe(16)

	flapping.answer(http.StatusBadGateway)
	probeUntil(t, inv, "flapping", false)
	expectNotified(t, ch, "flapping")
	if c := snapshot(t, inv, "steady"); !c.Available() {
		t.Fatalf("steady cluster became unavailable: %s", c.Reason)
	}
}

// Every subscriber is told, and one that never reads neither blocks the
// inventory nor keeps the others from hearing.
func TestAFullSubscriberBlocksNeitherTheInventoryNorOthers(t *testing.T) {
	const name = "crowded"
	inv, _ := newInventory(t)
	_ = inv.Subscribe(0) // never read
	first, second := inv.Subscribe(4), inv.Subscribe(4)
	srv := newAPIServer(t)

	cl := newFakeCluster(name, srv.URL)
	done := make(chan error, 1)
	go func() {
		if err := inv.Engage(t.Context(), multicluster.ClusterName(name), cl); err != nil {
			done <- err
			return
		}
		srv.answer(http.StatusInternalServerError)
		probeRounds(inv, maxProbeRounds)
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Engage and probing stalled behind a subscriber that does not read")
	}
	expectNotified(t, first, name, name)
	expectNotified(t, second, name, name)
}
