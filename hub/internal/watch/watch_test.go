package watch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A cluster that flips many times within the window re-runs the objects
// once, and a change after the window re-runs them again.
func TestClusterFlipsWithinTheWindowReRunEveryObjectOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := make(chan string, 64)
	var fired atomic.Int32
	const window = 200 * time.Millisecond
	go coalesce(ctx, changes, window, func() { fired.Add(1) })

	for range 20 {
		changes <- "east"
		time.Sleep(window / 40)
	}
	waitFor(t, &fired, 1)
	time.Sleep(2 * window)
	if n := fired.Load(); n != 1 {
		t.Fatalf("20 flips within %s re-ran the objects %d times, want 1", window, n)
	}
	changes <- "west"
	waitFor(t, &fired, 2)
}

func waitFor(t *testing.T, fired *atomic.Int32, want int32) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); fired.Load() < want; {
		if time.Now().After(deadline) {
			t.Fatalf("fired %d times, want %d", fired.Load(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
