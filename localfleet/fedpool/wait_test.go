package fedpool

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWaitEndsAtOnceOnAFinalErrorAndRetriesOthersUntilTheTimeout(t *testing.T) {
	notYet := errors.New("not ready yet")
	cases := []struct {
		name      string
		check     func(calls int) error
		wantCalls int // at least
		wantErr   string
		atTimeout bool
	}{
		{name: "true at the third check", check: func(calls int) error {
			if calls < 3 {
				return notYet
			}
			return nil
		}, wantCalls: 3},
		{name: "never true", check: func(int) error { return notYet }, wantCalls: 2, wantErr: "not ready yet", atTimeout: true},
		{name: "final at the second check", check: func(calls int) error {
			if calls < 2 {
				return notYet
			}
			return Final(errors.New("EPP pod Failed: bad flag"))
		}, wantCalls: 2, wantErr: "the thing: EPP pod Failed: bad flag"},
	}
	const timeout = 1500 * time.Millisecond
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			start := time.Now()
			err := Wait(context.Background(), timeout, "the thing", func(context.Context) error {
				calls++
				return c.check(calls)
			})
			took := time.Since(start)
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("Wait: %v", err)
				}
			} else if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Wait = %v, want an error containing %q", err, c.wantErr)
			}
			if calls < c.wantCalls {
				t.Errorf("check called %d times, want at least %d", calls, c.wantCalls)
			}
			if c.atTimeout != (took >= timeout) {
				t.Errorf("Wait returned after %s; at the timeout (%s): %v, want %v", took, timeout, took >= timeout, c.atTimeout)
			}
		})
	}
}
