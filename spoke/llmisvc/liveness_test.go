package llmisvc

import (
	"testing"
	"time"
)

// Liveness fails while one reconcile runs longer than the stall timeout
// and recovers when it returns; finished and short reconciles never fail it.
func TestLivenessFailsWhileAReconcileIsStuck(t *testing.T) {
	now := time.Unix(1000, 0)
	f := newInFlight(time.Minute)
	f.now = func() time.Time { return now }
	step := func(d time.Duration) { now = now.Add(d) }

	quick := f.start()
	step(30 * time.Second)
	quick()
	stuck := f.start()
	other := f.start()
	cases := []struct {
		name    string
		advance time.Duration
		end     func()
		healthy bool
	}{
		{"reconciles within the timeout", 59 * time.Second, nil, true},
		{"one over the timeout", 2 * time.Second, other, false},
		{"the stuck one still running", time.Hour, nil, false},
		{"the stuck one returned", 0, stuck, true},
		{"idle for long", time.Hour, nil, true},
	}
	for _, c := range cases {
		step(c.advance)
		if c.end != nil {
			c.end()
		}
		if err := f.check(nil); (err == nil) != c.healthy {
			t.Errorf("%s: check = %v, want healthy=%v", c.name, err, c.healthy)
		}
	}
}
