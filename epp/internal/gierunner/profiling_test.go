package gierunner

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestPprofServesTheCPUProfileTraceAndNamedProfiles(t *testing.T) {
	mux := http.NewServeMux()
	for path, h := range pprofHandlers(false) {
		mux.Handle(path, h)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	gzipMagic := []byte{0x1f, 0x8b}
	for _, tc := range []struct {
		path   string
		prefix []byte // what the body starts with
	}{
		{"/debug/pprof/profile?seconds=1", gzipMagic},
		{"/debug/pprof/heap", gzipMagic},
		{"/debug/pprof/allocs", gzipMagic},
		{"/debug/pprof/goroutine", gzipMagic},
		{"/debug/pprof/mutex", gzipMagic},
		{"/debug/pprof/block", gzipMagic},
		{"/debug/pprof/trace?seconds=0.1", []byte("go 1.")},
		{"/debug/pprof/", []byte("<html>")},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if len(body) == 0 || !bytes.HasPrefix(body, tc.prefix) {
				t.Errorf("body starts %q, want %q", body[:min(len(body), 16)], tc.prefix)
			}
		})
	}
	resp, err := http.Get(srv.URL + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the command line, which holds the picker's configuration, answered %d, want 404", resp.StatusCode)
	}
}

func TestUnauthenticatedProfilingAnswersOnlyLoopbackCallers(t *testing.T) {
	for _, tc := range []struct {
		name            string
		unauthenticated bool
		remote          string
		want            int
	}{
		{"another pod, metrics port unauthenticated", true, "10.244.1.7:51234", http.StatusForbidden},
		{"another pod over IPv6, unauthenticated", true, "[fd00::7]:51234", http.StatusForbidden},
		{"port-forward, unauthenticated", true, "127.0.0.1:51234", http.StatusOK},
		{"port-forward over IPv6, unauthenticated", true, "[::1]:51234", http.StatusOK},
		{"IPv4-mapped loopback, unauthenticated", true, "[::ffff:127.0.0.1]:51234", http.StatusOK},
		{"no address, unauthenticated", true, "", http.StatusForbidden},
		// The metrics server's filter authenticates callers first.
		{"another pod, metrics port authenticated", false, "10.244.1.7:51234", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := pprofHandlers(tc.unauthenticated)
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/symbol", "/debug/pprof/profile", "/debug/pprof/trace"} {
				if tc.want == http.StatusOK && (path == "/debug/pprof/profile" || path == "/debug/pprof/trace") {
					continue // they would run for a second; the index and symbol stand for them
				}
				req := httptest.NewRequest(http.MethodGet, path, nil)
				req.RemoteAddr = tc.remote
				rec := httptest.NewRecorder()
				hs[path].ServeHTTP(rec, req)
				if rec.Code != tc.want {
					t.Errorf("%s from %q: %d %s, want %d", path, tc.remote, rec.Code, strings.TrimSpace(rec.Body.String()), tc.want)
				}
			}
		})
	}
}

func TestContentionIsRecordedOnlyWithTheFlag(t *testing.T) {
	before := runtime.SetMutexProfileFraction(-1)
	t.Cleanup(func() {
		runtime.SetMutexProfileFraction(before)
		runtime.SetBlockProfileRate(0)
	})
	for _, tc := range []struct {
		args         []string
		wantFraction int
	}{
		{nil, 0},
		{[]string{"--contention-profiling"}, 1},
		{[]string{"--contention-profiling=false"}, 0},
	} {
		t.Run(strings.Join(append([]string{"flags"}, tc.args...), " "), func(t *testing.T) {
			runtime.SetMutexProfileFraction(7) // neither value: the call must set it
			fs := pflag.NewFlagSet("epp", pflag.ContinueOnError)
			var contention bool
			addProfilingFlags(fs, &contention)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			recordContention(contention)
			if got := runtime.SetMutexProfileFraction(-1); got != tc.wantFraction {
				t.Errorf("mutex profile fraction %d, want %d", got, tc.wantFraction)
			}
		})
	}
}
