package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/gateway/extproc"
)

type listenerKind string

// publicListener is every listener's kind: the gateway has only the
// Gateway's own listeners.
const publicListener listenerKind = "public"

// maxAttempts bounds the pods of a Service backend tried for one request
// when connections fail, like the connect-failure retries Istio configures
// by default. A picker's destination is tried once: ORIGINAL_DST has no
// other host to retry on.
const maxAttempts = 3

func (g *Gateway) handler(kind listenerKind, port int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serve(w, r, kind, port) })
}

// record is what the access log and the metrics say about a request.
type record struct {
	listener listenerKind
	route    string
	backend  string
	upstream string // the endpoint that served
	pick     time.Duration
	failOpen bool
	note     string // why the gateway answered by itself
}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, kind listenerKind, port int32) {
	start := time.Now()
	rw := &responseWriter{ResponseWriter: w}
	rec := &record{listener: kind}
	defer g.observe(r, rw, rec, start)

	table := g.cfg.Load().listeners[port]
	// What deploy/envoy/envoy.yaml's header_mutation filter removes: a
	// client does not name endpoints.
	r.Header.Del(extproc.DestinationHeader)
	r.Header.Del(extproc.SubsetKey)
	prepareRequestHeaders(r)

	var e *routeEntry
	if table != nil {
		e = table.route(r)
	}
	if e == nil {
		g.reply(rw, rec, http.StatusNotFound, "no route matches the request")
		return
	}
	rec.route = e.route.String()
	ctx := r.Context()
	if e.action.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.action.timeout)
		defer cancel()
	}
	b := e.action.pick()
	if b == nil {
		g.reply(rw, rec, http.StatusInternalServerError, "the matching rule has no backend with a weight above zero")
		return
	}
	rec.backend = b.label
	if b.invalid != "" {
		g.reply(rw, rec, http.StatusInternalServerError, b.invalid)
		return
	}
	body, ok := g.readBody(rw, r, rec)
	if !ok {
		return
	}
	if b.pool != nil {
		g.servePool(ctx, rw, r, e, b, body, rec)
		return
	}
	g.serveService(ctx, rw, r, e, b, body, rec)
}

// prepareRequestHeaders does what Envoy's connection manager does before
// any filter sees a request: drop hop-by-hop headers, add an x-request-id
// if there is none, and record the client in x-forwarded-for.
func prepareRequestHeaders(r *http.Request) {
	removeHopByHop(r.Header)
	if r.Header.Get(extproc.RequestIDHeader) == "" {
		r.Header.Set(extproc.RequestIDHeader, extproc.NewRequestID())
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header.Get("X-Forwarded-For"); prior != "" {
			host = prior + ", " + host
		}
		r.Header.Set("X-Forwarded-For", host)
	}
	r.Header.Set("X-Forwarded-Proto", "http")
}

// hopByHop are the headers that describe one connection, not the request.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// readBody reads the whole request body: a Service backend's request keeps
// it to retry the next pod after a connection failure (Envoy buffers for
// retries too), and a pool's picker answers only once it has the whole body
// anyway. Reading it before the picker sees it loses only the overlap of the
// upload with the transfer to the picker; the picker still gets it in
// chunks.
func (g *Gateway) readBody(w *responseWriter, r *http.Request, rec *record) ([]byte, bool) {
	if r.ContentLength == 0 {
		return nil, true
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.opts.MaxRequestBody))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		g.reply(w, rec, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", g.opts.MaxRequestBody))
		return nil, false
	case err != nil:
		g.reply(w, rec, http.StatusBadRequest, "reading the request body: "+err.Error())
		return nil, false
	}
	return b, true
}

// servePool serves a request whose backend is an InferencePool.
func (g *Gateway) servePool(ctx context.Context, w *responseWriter, r *http.Request, e *routeEntry, b *backend, body []byte, rec *record) {
	pool := b.pool
	ex, release, err := g.pick(ctx, r, pool, body, rec)
	if release != nil {
		defer release()
	}
	if ex != nil {
		defer ex.Close()
	}
	if err != nil {
		g.pickFailed(ctx, w, pool, err, rec)
		return
	}
	p := ex.Pick()
	if p.Immediate != nil {
		rec.note = "endpoint picker answered " + strconv.Itoa(p.Immediate.Status)
		p.Immediate.Write(w)
		return
	}

	// Every destination, a local pod, another cluster's pod or another
	// cluster's gateway (Parent mode), gets the request as the picker's
	// mutations left it, with the route's filters applied, as Envoy sends
	// it to its ORIGINAL_DST cluster. A Parent-mode pick's marks are among
	// those mutations.
	target, ok := originalDstHost(p.Destination)
	if !ok {
		// ORIGINAL_DST parses the header as one address: a fallback list
		// finds no host (Envoy counts original_dst_host_invalid).
		g.answer(w, rec, http.StatusServiceUnavailable, "no healthy upstream",
			fmt.Sprintf("no healthy upstream: %s %q is not one ip:port", extproc.DestinationHeader, p.Destination))
		return
	}
	path, host := rewrite(b, p.Path, r.Host)
	build := func(int) *outbound {
		h := p.Header.Clone()
		modifyHeaders(h, b.filters.requestHeaders)
		return &outbound{method: p.Method, uri: path, host: host, header: h, body: p.Body, h2c: pool.h2c, originalDst: true}
	}
	resp := g.forward(ctx, w, rec, []string{target}, build, e.action.backendTimeout, b.label)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	g.metrics.destinations.WithLabelValues(pool.key.String(), string(classify(rec.upstream, pool))).Inc()
	g.respond(w, r, resp, ex, b, rec)
}

// pick runs the request phase with the pool's endpoint picker. The caller
// closes the exchange, then releases the client.
func (g *Gateway) pick(ctx context.Context, r *http.Request, pool *poolTarget, body []byte, rec *record) (*extproc.Exchange, func(), error) {
	if pool.eppProblem != "" {
		return nil, nil, errors.New(pool.eppProblem)
	}
	if len(pool.epp) == 0 {
		return nil, nil, fmt.Errorf("the endpoint picker of pool %s has no ready pod", pool.key)
	}
	addr := pool.epp[g.next("epp/"+pool.key.String())%uint64(len(pool.epp))]
	c, release, err := g.epps.get(addr)
	if err != nil {
		return nil, nil, err
	}
	h := r.Header.Clone()
	req := &extproc.Request{Method: r.Method, Path: r.URL.RequestURI(), Authority: r.Host, Header: h, SourceAddress: r.RemoteAddr}
	if r.ContentLength != 0 {
		req.Body = bytes.NewReader(body)
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	start := time.Now()
	ex, err := c.Start(ctx, req)
	outcome := "picked"
	switch {
	case err != nil:
		outcome = "error"
		rec.pick = time.Since(start)
	case ex.Pick().Immediate != nil:
		outcome = "immediate_response"
		rec.pick = ex.Pick().Latency
	default:
		rec.pick = ex.Pick().Latency
	}
	g.metrics.pick.WithLabelValues(pool.key.String(), outcome).Observe(rec.pick.Seconds())
	return ex, release, err
}

// destination is where a picked endpoint leads.
type destination string

const (
	localEndpoint destination = "local"
	remote        destination = "remote"
)

// classify tells a local pod, an endpoint of a Ready pod of the pool, from
// anything else: another cluster's pod (Endpoint mode) or gateway (Parent
// mode), which the gateway does not tell apart, as Envoy does not.
func classify(ep string, pool *poolTarget) destination {
	if pool.local[ep] {
		return localEndpoint
	}
	return remote
}

// originalDstHost is the host Envoy's ORIGINAL_DST cluster makes of an
// x-gateway-destination-endpoint value: one literal ip:port, or none.
func originalDstHost(v string) (string, bool) {
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		return "", false
	}
	return ap.String(), true
}

// pickFailed answers a request whose picker could not be reached, failed or
// did not answer in time, as Envoy's ext_proc filter and connection manager
// do.
func (g *Gateway) pickFailed(ctx context.Context, w *responseWriter, pool *poolTarget, err error, rec *record) {
	switch {
	case ctx.Err() != nil:
		g.contextDone(ctx, w, rec)
	case errors.Is(err, extproc.ErrMessageTimeout):
		// The stream idle timer, not ext_proc's, ends the wait.
		g.log.Error(err, "endpoint picker did not answer", "pool", pool.key.String())
		g.reply(w, rec, http.StatusRequestTimeout, "stream timeout")
	case pool.failOpen:
		// failure_mode_allow: the request goes on without the picker's
		// header, and ORIGINAL_DST has no other way to a host.
		g.log.Error(err, "endpoint picker failed; the pool fails open, but without a pick there is no destination", "pool", pool.key.String())
		rec.failOpen = true
		g.metrics.failOpen.WithLabelValues(pool.key.String()).Inc()
		g.answer(w, rec, http.StatusServiceUnavailable, "no healthy upstream", "failed open without a destination: "+err.Error())
	default:
		g.log.Error(err, "endpoint picker failed", "pool", pool.key.String())
		g.reply(w, rec, http.StatusInternalServerError, "endpoint picker unavailable: "+err.Error())
	}
}

// serveService sends the request to the Service's Ready pods, round robin,
// moving on to the next pod when a connection fails.
func (g *Gateway) serveService(ctx context.Context, w *responseWriter, r *http.Request, e *routeEntry, b *backend, body []byte, rec *record) {
	eps := b.service.endpoints
	if len(eps) == 0 {
		g.reply(w, rec, http.StatusServiceUnavailable, "no healthy upstream")
		return
	}
	first := int(g.next(b.label) % uint64(len(eps)))
	targets := make([]string, 0, min(len(eps), maxAttempts))
	for i := range cap(targets) {
		targets = append(targets, eps[(first+i)%len(eps)])
	}
	g.serveDirect(ctx, w, r, e, b, body, targets, b.service.h2c, rec)
}

// serveDirect sends the client's request, with the route's filters applied
// but untouched by any picker, to the first target that accepts a
// connection, and passes the response through.
func (g *Gateway) serveDirect(ctx context.Context, w *responseWriter, r *http.Request, e *routeEntry, b *backend, body []byte, targets []string, h2c bool, rec *record) {
	path, host := rewrite(b, r.URL.RequestURI(), r.Host)
	build := func(int) *outbound {
		h := r.Header.Clone()
		modifyHeaders(h, b.filters.requestHeaders)
		return &outbound{method: r.Method, uri: path, host: host, header: h, body: body, h2c: h2c}
	}
	resp := g.forward(ctx, w, rec, targets, build, e.action.backendTimeout, b.label)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	g.passThrough(w, r, resp, resp.Body, b)
}

// rewrite applies the backend's URLRewrite to a request target (path and
// query) and host.
func rewrite(b *backend, uri, host string) (string, string) {
	path, query, hasQuery := strings.Cut(uri, "?")
	path, host = b.filters.rewrite(path, host)
	if hasQuery {
		path += "?" + query
	}
	return path, host
}

func (g *Gateway) next(key string) uint64 {
	v, _ := g.rr.LoadOrStore(key, new(atomic.Uint64))
	return v.(*atomic.Uint64).Add(1) - 1
}

// outbound is a request as it goes to one upstream.
type outbound struct {
	method, uri, host string
	header            http.Header
	body              []byte
	h2c               bool
	// originalDst marks a picker's destination, which goes through its
	// host's pool in Gateway.dst.
	originalDst bool
}

// errNotAllowed marks a destination outside Options.AllowedTargets.
var errNotAllowed = errors.New("destination outside the allowed networks")

// forward sends the request to the first target that accepts a connection,
// trying the next one only when connecting failed, so that a request is
// never sent twice, and records the target that answered. Each attempt is
// bounded by timeout (0: none). When no target answers it replies to the
// client as Envoy does and returns nil.
func (g *Gateway) forward(ctx context.Context, w *responseWriter, rec *record, targets []string, build func(int) *outbound, timeout time.Duration, label string) *http.Response {
	resp, served, err := g.roundTrip(ctx, targets, build, timeout, label)
	if err != nil {
		if ctx.Err() != nil {
			g.contextDone(ctx, w, rec)
		} else {
			g.reply(w, rec, http.StatusServiceUnavailable, "upstream connect error or disconnect/reset before headers: "+err.Error())
		}
		return nil
	}
	rec.upstream = served
	return resp
}

// roundTrip is forward's attempts, returning the error instead of replying.
func (g *Gateway) roundTrip(ctx context.Context, targets []string, build func(int) *outbound, timeout time.Duration, label string) (*http.Response, string, error) {
	var last error
	for i, t := range targets {
		if i > 0 {
			g.metrics.retries.WithLabelValues(label).Inc()
		}
		if !g.allowedTarget(t) {
			last = fmt.Errorf("%s: %w", t, errNotAllowed)
			continue
		}
		o := build(i)
		actx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, timeout)
		}
		req, err := http.NewRequestWithContext(actx, o.method, "http://"+t+o.uri, bytes.NewReader(o.body))
		if err != nil {
			cancel()
			return nil, "", err
		}
		req.Host = o.host
		req.Header = o.header
		req.Header.Del("Content-Length")
		if len(o.body) == 0 {
			req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
		}
		tr, release := g.transport, func() {}
		switch {
		case o.originalDst:
			tr, release = g.dst.acquire(t, o.h2c)
		case o.h2c:
			tr = g.h2c
		}
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err == nil {
			g.metrics.upstreamHeaders.WithLabelValues(label).Observe(time.Since(start).Seconds())
			resp.Body = &timedBody{ReadCloser: resp.Body, start: start, cancel: cancel, release: release,
				observe: g.metrics.upstreamDuration.WithLabelValues(label).Observe}
			return resp, t, nil
		}
		release()
		cancel()
		last = fmt.Errorf("%s: %w", t, err)
		if !connectFailed(err) {
			return nil, t, last
		}
	}
	return nil, "", last
}

func (g *Gateway) allowedTarget(t string) bool {
	ap, err := netip.ParseAddrPort(t)
	if err != nil {
		return false
	}
	for _, p := range g.allowed {
		if p.Contains(ap.Addr()) {
			return true
		}
	}
	return false
}

// connectFailed reports whether err happened before anything was sent.
func connectFailed(err error) bool {
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, syscall.ECONNREFUSED)
}

// timedBody records the upstream duration when the body is done and
// releases the attempt's timeout and its use of the host's pool (after the
// connection went back to it, so that a sweep never leaves one behind).
type timedBody struct {
	io.ReadCloser
	start   time.Time
	cancel  context.CancelFunc
	release func()
	observe func(float64)
	done    atomic.Bool
}

func (b *timedBody) Close() error {
	err := b.ReadCloser.Close()
	if !b.done.Swap(true) {
		b.observe(time.Since(b.start).Seconds())
		b.cancel()
		b.release()
	}
	return err
}

// respond passes the upstream response through the picker's response phase
// to the client. When the picker fails before the client got headers, the
// failure mode decides between the unprocessed response and a 500 (408 when
// it did not answer within the stream idle timeout); after
// that the client connection is aborted, since chunks the picker held are
// lost.
func (g *Gateway) respond(w *responseWriter, r *http.Request, resp *http.Response, ex *extproc.Exchange, b *backend, rec *record) {
	h := resp.Header.Clone()
	removeHopByHop(h)
	modifyHeaders(h, b.filters.responseHeaders)
	var body io.Reader = resp.Body
	if !hasBody(r.Method, resp) {
		body = nil
	}
	sink := extproc.Sink{
		Headers: func(status int, h http.Header) error {
			// The picker may change the body, so its length is unknown.
			h.Del("Content-Length")
			for k, vs := range h {
				w.Header()[k] = vs
			}
			w.WriteHeader(status)
			return nil
		},
		Body: func(chunk []byte) error {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
			return w.Flush()
		},
		Trailers: func(t http.Header) error {
			for k, vs := range t {
				for _, v := range vs {
					w.Header().Add(http.TrailerPrefix+k, v)
				}
			}
			return nil
		},
	}
	err := ex.Respond(&extproc.Response{Status: resp.StatusCode, Header: h, Body: body, Trailer: resp.Trailer}, sink)
	if err == nil {
		return
	}
	var ir *extproc.ImmediateResponse
	switch {
	case w.status == 0 && errors.As(err, &ir):
		rec.note = "endpoint picker answered " + strconv.Itoa(ir.Status)
		ir.Write(w)
	case w.status == 0 && r.Context().Err() == nil && errors.Is(err, extproc.ErrMessageTimeout):
		g.log.Error(err, "endpoint picker did not answer on the response", "pool", b.pool.key.String())
		g.reply(w, rec, http.StatusRequestTimeout, "stream timeout")
	case w.status == 0 && r.Context().Err() == nil && b.pool.failOpen:
		g.log.Error(err, "endpoint picker failed on the response; passing it through", "pool", b.pool.key.String())
		rec.failOpen = true
		g.metrics.failOpen.WithLabelValues(b.pool.key.String()).Inc()
		g.passThrough(w, r, resp, ex.Unprocessed(resp.Body), b)
	case w.status == 0 && r.Context().Err() == nil:
		g.log.Error(err, "endpoint picker failed on the response", "pool", b.pool.key.String())
		g.reply(w, rec, http.StatusInternalServerError, "endpoint picker failed on the response: "+err.Error())
	default:
		if r.Context().Err() == nil {
			g.log.Error(err, "response aborted", "pool", b.pool.key.String())
		}
		rec.note = "aborted: " + err.Error()
		panic(http.ErrAbortHandler)
	}
}

// hasBody is false when the response cannot have one, which Envoy signals
// with end_of_stream on the headers.
func hasBody(method string, resp *http.Response) bool {
	return method != http.MethodHead && resp.StatusCode >= 200 && resp.StatusCode != http.StatusNoContent &&
		resp.StatusCode != http.StatusNotModified && resp.ContentLength != 0
}

// passThrough copies an upstream response, whose body is read from body, to
// the client, flushing every read so that streamed responses stay streamed.
func (g *Gateway) passThrough(w *responseWriter, r *http.Request, resp *http.Response, body io.Reader, b *backend) {
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	removeHopByHop(h)
	for k := range resp.Trailer {
		h.Add("Trailer", k)
	}
	modifyHeaders(h, b.filters.responseHeaders)
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, extproc.ResponseBodyChunkSize)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = w.Flush()
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if r.Context().Err() == nil {
				g.log.Error(err, "upstream response body", "backend", b.label)
			}
			panic(http.ErrAbortHandler)
		}
	}
	for k, vs := range resp.Trailer {
		h[k] = vs
	}
}

// contextDone answers a request whose context ended: 504 when the route's
// timeout fired, nothing when the client went away.
func (g *Gateway) contextDone(ctx context.Context, w *responseWriter, rec *record) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		g.reply(w, rec, http.StatusGatewayTimeout, "upstream request timeout")
		return
	}
	rec.note = "client went away"
}

// reply is the gateway's own answer, msg, which its log also records.
func (g *Gateway) reply(w *responseWriter, rec *record, code int, msg string) {
	g.answer(w, rec, code, msg, msg)
}

// answer is the gateway's own answer, msg, with the note its log records
// (which may say more than the client is told, as Envoy's response flags do).
func (g *Gateway) answer(w *responseWriter, rec *record, code int, msg, note string) {
	rec.note = note
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, msg+"\n")
}

// clientClosed is the status recorded for a request whose client went away
// before an answer, as nginx and Envoy's access logs show it.
const clientClosed = 499

func (g *Gateway) observe(r *http.Request, w *responseWriter, rec *record, start time.Time) {
	code := w.status
	if code == 0 {
		code = clientClosed
	}
	d := time.Since(start)
	g.metrics.requests.WithLabelValues(string(rec.listener), rec.route, rec.backend, strconv.Itoa(code)).Inc()
	g.metrics.duration.WithLabelValues(string(rec.listener), rec.route, rec.backend).Observe(d.Seconds())
	g.log.V(1).Info("request", "listener", rec.listener, "method", r.Method, "host", r.Host, "path", r.URL.Path,
		"requestID", r.Header.Get(extproc.RequestIDHeader), "route", rec.route, "backend", rec.backend, "upstream", rec.upstream,
		"code", code, "duration", d, "pick", rec.pick, "failOpen", rec.failOpen, "note", rec.note)
}

// responseWriter records the status sent and flushes through wrappers.
type responseWriter struct {
	http.ResponseWriter
	status int
}

func (w *responseWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *responseWriter) Flush() error { return http.NewResponseController(w.ResponseWriter).Flush() }

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
