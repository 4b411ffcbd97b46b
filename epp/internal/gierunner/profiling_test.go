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
	for path, h := range pprofHandlers() {
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
