package crossing

import (
	"slices"
	"testing"
	"time"

	"github.com/fleetinfer/fleetinfer/epp/federation"
)

func views(clusters ...string) []*federation.View {
	out := make([]*federation.View, len(clusters))
	for i, c := range clusters {
		out[i] = federation.NewView(&federation.Origin{Cluster: c}, nil)
	}
	return out
}

func admitted(g *Gate, now time.Time, clusters ...string) []string {
	var out []string
	for _, v := range g.Admitted(views(clusters...), now) {
		out = append(out, v.Origin.Cluster)
	}
	return out
}

func TestOneRemoteClusterTakesAtMostItsShareOfPicks(t *testing.T) {
	g := New(Options{MaxShare: 0.5, Window: 10 * time.Second, MinPicks: 10, Failures: 5, Open: time.Second})
	now := time.Unix(1000, 0)
	// Every pick goes where the first admitted cluster is, else local: a
	// peer that claims zero load wins every pick it may take.
	west := 0
	for i := range 1000 {
		at := now.Add(time.Duration(i) * 10 * time.Millisecond)
		if a := admitted(g, at, "west"); len(a) > 0 {
			g.Picked("west", at)
			west++
		} else {
			g.Picked("", at)
		}
	}
	if share := float64(west) / 1000; share > 0.55 || share < 0.4 {
		t.Fatalf("west took %.2f of the picks, want about its share of 0.5", share)
	}
}

func TestTheShareAppliesOnlyPastTheMinimumOfPicks(t *testing.T) {
	g := New(Options{MaxShare: 0.5, Window: 10 * time.Second, MinPicks: 10, Failures: 5, Open: time.Second})
	now := time.Unix(1000, 0)
	for range 9 {
		g.Picked("west", now)
	}
	if a := admitted(g, now, "west"); len(a) != 1 {
		t.Fatal("a cluster was held back before the window held enough picks to judge a share")
	}
	g.Picked("west", now)
	if a := admitted(g, now, "west", "central"); !slices.Equal(a, []string{"central"}) {
		t.Fatalf("admitted %v, want central only: west took all 10 picks", a)
	}
	// Two windows later the picks are forgotten.
	if a := admitted(g, now.Add(20*time.Second), "west"); len(a) != 1 {
		t.Fatal("west held back by picks of two windows ago")
	}
}

func TestTheBreakerOpensOnFailuresAndProbesAfterItsTime(t *testing.T) {
	g := New(Options{MaxShare: 1, Window: 10 * time.Second, MinPicks: 10, Failures: 3, Open: 5 * time.Second, SlowAfter: time.Second})
	now := time.Unix(1000, 0)
	steps := []struct {
		at      time.Duration
		observe string // "", ok, error, slow
		want    bool   // west admitted after the step
	}{
		{0, "error", true},
		{0, "slow", true},
		{0, "ok", true}, // a success resets the count
		{1, "error", true},
		{1, "error", true},
		{1, "slow", false}, // three in a row: open for 5 s
		{5, "", false},
		{6, "", true},  // past its time: this pick is the probe
		{6, "", false}, // one probe at a time
		{6, "error", false},
		{10, "", false}, // the failed probe opened it again
		{12, "", true},  // the next probe
		{12, "ok", true},
		{12, "", true}, // closed
	}
	for i, s := range steps {
		at := now.Add(s.at * time.Second)
		switch s.observe {
		case "ok":
			g.Observe("west", false, 100*time.Millisecond, at)
		case "error":
			g.Observe("west", true, 0, at)
		case "slow":
			g.Observe("west", false, 2*time.Second, at)
		}
		if got := len(admitted(g, at, "west")) == 1; got != s.want {
			t.Fatalf("step %d (%+v): west admitted %v, want %v", i, s, got, s.want)
		}
	}
}
