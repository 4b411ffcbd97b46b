package llmisvc

import (
	"fmt"
	"net/http"
	"sync"
	"time"
)

// inFlight tracks the reconciles running now, so that liveness fails when
// one of them is stuck (a worker that never returns would otherwise leave a
// process that answers pings and reconciles nothing).
type inFlight struct {
	stallAfter time.Duration
	now        func() time.Time

	mu      sync.Mutex
	next    uint64
	started map[uint64]time.Time
}

func newInFlight(stallAfter time.Duration) *inFlight {
	return &inFlight{stallAfter: stallAfter, now: time.Now, started: map[uint64]time.Time{}}
}

// start records a reconcile; the returned func records its end.
func (f *inFlight) start() (end func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.next
	f.next++
	f.started[id] = f.now()
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.started, id)
	}
}

// check fails while a reconcile has run for longer than stallAfter.
func (f *inFlight) check(*http.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	for _, t := range f.started {
		if d := now.Sub(t); d > f.stallAfter {
			return fmt.Errorf("a reconcile has been running for %s, over %s", d.Round(time.Second), f.stallAfter)
		}
	}
	return nil
}
