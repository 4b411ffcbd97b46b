package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// OriginalDstCleanup is how often the hosts of the pickers' destinations
// that saw no request are dropped: the cleanup_interval of
// deploy/envoy/envoy.yaml's inference_pool cluster (Envoy's default is 5 s;
// the file says why it keeps them longer).
const OriginalDstCleanup = 2 * time.Minute

// originalDst holds the connection pools of the destinations pickers
// choose, as Envoy's ORIGINAL_DST cluster holds them: a host, with its own
// pool, is made on its first request and dropped with its connections once
// a cleanup interval has passed without a request to it. So a crossing
// between gateways after a lull of that long opens a connection over the
// link, as it would through Envoy, and one in steady traffic does not.
// Unlike Envoy, a host with a request in flight is kept: Envoy drains its
// connections instead, which comes to the same for requests shorter than
// the interval.
type originalDst struct {
	newTransport func(h2c bool) *http.Transport

	mu    sync.Mutex
	hosts map[dstKey]*dstHost
}

type dstKey struct {
	addr string
	h2c  bool
}

type dstHost struct {
	tr *http.Transport
	// used says whether a request went to the host since the last sweep,
	// inflight how many are under way.
	used     bool
	inflight int
}

func newOriginalDst(newTransport func(h2c bool) *http.Transport) *originalDst {
	return &originalDst{newTransport: newTransport, hosts: map[dstKey]*dstHost{}}
}

// acquire returns the pool of the host addr (ip:port) for one request, and
// the function that ends that request's use of it, to be called once.
func (o *originalDst) acquire(addr string, h2c bool) (*http.Transport, func()) {
	k := dstKey{addr: addr, h2c: h2c}
	o.mu.Lock()
	defer o.mu.Unlock()
	h := o.hosts[k]
	if h == nil {
		h = &dstHost{tr: o.newTransport(h2c)}
		o.hosts[k] = h
	}
	h.used = true
	h.inflight++
	return h.tr, func() {
		o.mu.Lock()
		h.inflight--
		o.mu.Unlock()
	}
}

// sweep drops the hosts that saw no request since the last sweep and have
// none in flight, closing their connections.
func (o *originalDst) sweep() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k, h := range o.hosts {
		if !h.used && h.inflight == 0 {
			h.tr.CloseIdleConnections()
			delete(o.hosts, k)
			continue
		}
		h.used = false
	}
}

// run sweeps every interval until ctx ends.
func (o *originalDst) run(ctx context.Context, interval time.Duration) {
	wait.UntilWithContext(ctx, func(context.Context) { o.sweep() }, interval)
}

// closeIdle closes every host's idle connections.
func (o *originalDst) closeIdle() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, h := range o.hosts {
		h.tr.CloseIdleConnections()
	}
}
