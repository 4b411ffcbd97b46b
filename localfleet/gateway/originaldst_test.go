package gateway

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A picker's destination keeps its connections while requests go to it at
// least once a cleanup interval, and loses them, as Envoy's ORIGINAL_DST
// host does, after an interval without one; a host with a request in
// flight is kept. The gateway's counter of connections opened sees each.
func TestADestinationUnusedForACleanupIntervalLosesItsConnections(t *testing.T) {
	var opened atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	counter := prometheus.NewCounter(prometheus.CounterOpts{Name: "opened"})
	dial := counted((&net.Dialer{}).DialContext, counter)
	o := newOriginalDst(func(bool) *http.Transport { return &http.Transport{DialContext: dial} })
	defer o.closeIdle()
	get := func() {
		t.Helper()
		tr, release := o.acquire(addr, false)
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		release()
	}
	steps := []struct {
		name   string
		sweeps int
		want   int32 // connections opened after the step's request
	}{
		{name: "the first request opens a connection", sweeps: 0, want: 1},
		{name: "a request within the interval reuses it", sweeps: 1, want: 1},
		{name: "after a whole interval without a request, a new one", sweeps: 2, want: 2},
	}
	for _, s := range steps {
		for range s.sweeps {
			o.sweep()
		}
		get()
		if got := opened.Load(); got != s.want {
			t.Fatalf("%s: %d connections opened, want %d", s.name, got, s.want)
		}
		if got := testutil.ToFloat64(counter); got != float64(s.want) {
			t.Fatalf("%s: the gateway counted %v connections opened, want %d", s.name, got, s.want)
		}
	}

	tr, release := o.acquire("127.0.0.1:1", false)
	o.sweep()
	o.sweep()
	if again, r := o.acquire("127.0.0.1:1", false); again != tr {
		t.Fatal("a host with a request in flight was dropped")
	} else {
		r()
	}
	release()
}
