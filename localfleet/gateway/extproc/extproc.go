// Package extproc is an Envoy ext_proc client that drives an endpoint picker
// (EPP) exactly as Envoy does for a Gateway API Inference Extension pool:
// one envoy.service.ext_proc.v3.ExternalProcessor/Process stream per HTTP
// request, with request and response headers SEND, request and response
// bodies FULL_DUPLEX_STREAMED and trailers SEND.
//
// The request phase sends the headers (pseudo-headers first, values in
// raw_value), then the body in chunks with end_of_stream on the last, without
// waiting for answers; the processor answers the headers only after the whole
// body (GIE's EPP schedules then), with a header mutation carrying
// x-gateway-destination-endpoint, the same value in dynamic metadata
// namespace envoy.lb, and clear_route_cache, followed by the (possibly
// rewritten) body as streamed mutations. The response phase sends the
// upstream's headers and body chunks, each message carrying envoy.lb with the
// destination, and hands back every chunk the processor releases, so an
// SSE stream passes through chunk by chunk. An ImmediateResponse ends the
// exchange at any point and becomes the HTTP answer.
//
// Client.Pick runs only the request phase (what a benchmark of the picker
// needs); Client.Start plus Exchange.Respond run the whole exchange, as the
// local gateway does for every request.
package extproc

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// DefaultMessageTimeout bounds each wait for a processor answer that is due:
// the request-headers response after the request body ended, the
// response-headers response, and the end of the response body after the
// upstream's ended. GIE's Envoy examples use 1000 s so that flow control can
// queue requests; an endpoint picker without flow control answers in
// milliseconds.
const DefaultMessageTimeout = 10 * time.Second

// DefaultChunkSize is the largest request-body chunk sent in one message,
// about what Envoy forwards per read from a downstream connection.
const DefaultChunkSize = 64 << 10

// Client sends ext-proc streams to one processor. It is safe for concurrent
// use; every exchange is its own stream on a shared connection.
type Client struct {
	conn   *grpc.ClientConn // nil when the connection belongs to the caller
	proc   extprocv3.ExternalProcessorClient
	opts   options
	closed sync.Once
}

type options struct {
	messageTimeout time.Duration
	chunkSize      int
}

// Option configures a Client.
type Option func(*options)

// WithMessageTimeout sets how long an answer that is due may take (default
// DefaultMessageTimeout; 0 waits as long as the context allows).
func WithMessageTimeout(d time.Duration) Option { return func(o *options) { o.messageTimeout = d } }

// WithChunkSize sets the largest request-body chunk per message.
func WithChunkSize(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.chunkSize = n
		}
	}
}

// Dial connects to a processor at target ("host:port") over plaintext HTTP/2,
// as GIE's EPP serves with --secure-serving=false. The connection is lazy
// and reconnects with a short back-off, so an EPP that restarts is used again
// within about a second.
func Dial(target string, opts ...Option) (*Client, error) {
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}))
	if err != nil {
		return nil, fmt.Errorf("ext-proc client for %s: %w", target, err)
	}
	c := New(conn, opts...)
	c.conn = conn
	return c, nil
}

// New returns a client over an existing connection, which the caller keeps
// and closes.
func New(conn grpc.ClientConnInterface, opts ...Option) *Client {
	o := options{messageTimeout: DefaultMessageTimeout, chunkSize: DefaultChunkSize}
	for _, f := range opts {
		f(&o)
	}
	return &Client{proc: extprocv3.NewExternalProcessorClient(conn), opts: o}
}

// Close closes a connection Dial opened.
func (c *Client) Close() error {
	var err error
	c.closed.Do(func() {
		if c.conn != nil {
			err = c.conn.Close()
		}
	})
	return err
}

// Request is an HTTP request as the gateway presents it to the processor.
type Request struct {
	// Method defaults to POST with a body, GET without.
	Method string
	// Path is the request target, with the query: the :path pseudo-header.
	Path string
	// Authority is the :authority pseudo-header (the Host).
	Authority string
	// Scheme defaults to "http".
	Scheme string
	// Header holds the other headers. An x-request-id is generated when
	// absent, as Envoy's connection manager does; content-length is the
	// caller's to set.
	Header http.Header
	// Body is read and sent chunk by chunk; nil for a headers-only request.
	Body io.Reader
	// Trailer, if not empty, is sent after the body; the last body chunk
	// then does not end the stream.
	Trailer http.Header
	// Subset is the subset hint. nil sends none (pick from the whole pool);
	// an empty non-nil slice asks for a pick from no endpoints.
	Subset []string
	// SourceAddress is the client's ip:port, sent with the headers as the
	// source.address attribute; "" sends none.
	SourceAddress string
}

// Pick is the processor's answer to the request phase.
type Pick struct {
	// RequestID is the x-request-id the stream carried.
	RequestID string
	// Destination is the raw x-gateway-destination-endpoint value, equal to
	// the envoy.lb metadata value; Endpoints is it split, primary first.
	Destination string
	Endpoints   []string
	// Method, Path and Header are the request after the header mutation
	// (pseudo-headers excluded from Header).
	Method string
	Path   string
	Header http.Header
	// Body is the request body after the streamed body mutations, and
	// BodyChunks how many mutation messages carried it.
	Body       []byte
	BodyChunks int
	// DynamicMetadata is what the processor returned with its answers.
	DynamicMetadata *structpb.Struct
	// ClearRouteCache is the processor's request to re-match the route.
	ClearRouteCache bool
	// RejectedMutations counts header mutations Envoy's default rules
	// ignore (host, :authority, :scheme, :method, x-envoy-*).
	RejectedMutations int
	// Immediate is set when the processor answered the request itself (400,
	// 429, 503, ...) instead of picking; the other fields are then empty.
	Immediate *ImmediateResponse
	// Latency runs from sending the request headers to receiving their
	// answer; LatencyAfterBody from sending the end of the body. The first is
	// what a client waits for; the second is the picker's own time.
	Latency, LatencyAfterBody time.Duration
}

// Primary is the endpoint to try first.
func (p *Pick) Primary() string {
	if len(p.Endpoints) == 0 {
		return ""
	}
	return p.Endpoints[0]
}

// ImmediateResponse is a processor's direct answer to the client. As an
// error it ends an exchange.
type ImmediateResponse struct {
	Status  int
	Header  http.Header
	Body    []byte
	Details string
}

func (r *ImmediateResponse) Error() string {
	return fmt.Sprintf("ext-proc immediate response %d: %s", r.Status, r.Body)
}

// Write sends the response to an HTTP client as Envoy's local reply does,
// adding a text/plain content type to a body that names none.
func (r *ImmediateResponse) Write(w http.ResponseWriter) {
	for k, vs := range r.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	if len(r.Body) > 0 && w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "text/plain")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(r.Body)))
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

func immediate(m *extprocv3.ImmediateResponse) (*ImmediateResponse, error) {
	h := headers{}
	if _, err := h.apply(responseHeaders, m.GetHeaders()); err != nil {
		return nil, err
	}
	code := int(m.GetStatus().GetCode())
	if code < 200 || code > 599 {
		code = http.StatusInternalServerError
	}
	return &ImmediateResponse{Status: code, Header: h.http(), Body: m.GetBody(), Details: m.GetDetails()}, nil
}

// Pick runs the request phase of one stream and ends it there, as a client
// that goes away after the pick would. It returns the pick, or an
// ImmediateResponse in Pick.Immediate, or an error from the transport or a
// protocol violation.
func (c *Client) Pick(ctx context.Context, req *Request) (*Pick, error) {
	ex, err := c.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	ex.Close()
	return ex.Pick(), nil
}

// PickServed runs one stream as a gateway whose upstream answered the pick
// at once with status and no body: the request phase, then the response
// headers. A driver that stands in for the upstream uses it where Pick would
// look, to the processor, like a client that gave up (fleetinfer's picker
// counts an abandoned crossed request against the cluster it crossed to).
func (c *Client) PickServed(ctx context.Context, req *Request, status int) (*Pick, error) {
	ex, err := c.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	defer ex.Close()
	p := ex.Pick()
	if p.Immediate != nil {
		return p, nil
	}
	if err := ex.Respond(&Response{Status: status}, Sink{Headers: func(int, http.Header) error { return nil }}); err != nil {
		return nil, fmt.Errorf("ext-proc: response phase: %w", err)
	}
	return p, nil
}

// processingMode is what the filter is configured with; Envoy announces the
// body modes in the first message's protocol_config.
var protocolConfig = &extprocv3.ProtocolConfiguration{
	RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
	ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
}

// Start opens a stream and runs the request phase. The exchange lives as
// long as ctx; Close it when done. When the processor answered with an
// ImmediateResponse the exchange is already finished and Pick().Immediate
// holds the answer.
func (c *Client) Start(ctx context.Context, req *Request) (*Exchange, error) {
	sctx, cancel := context.WithCancelCause(ctx)
	stream, err := c.proc.Process(sctx)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("ext-proc: open stream: %w", err)
	}
	e := &Exchange{stream: stream, ctx: sctx, cancel: cancel, opts: c.opts, recv: make(chan received, 16), subset: req.Subset}
	e.recvDone.Add(1)
	go e.receive()
	if err := e.requestPhase(req); err != nil {
		var ir *ImmediateResponse
		if !errors.As(err, &ir) {
			e.Close()
			return nil, err
		}
		e.pick = Pick{RequestID: e.pick.RequestID, Immediate: ir, Latency: e.pick.Latency, LatencyAfterBody: e.pick.LatencyAfterBody}
	}
	return e, nil
}

// Exchange is one ext-proc stream.
type Exchange struct {
	stream extprocv3.ExternalProcessor_ProcessClient
	ctx    context.Context
	cancel context.CancelCauseFunc
	opts   options
	recv   chan received
	// recvDone tracks the receiving goroutine; sends happen on the caller's
	// goroutine or the response-body pump, never both at once.
	recvDone sync.WaitGroup
	subset   []string
	pick     Pick
	// pump sends the response body, from Respond on.
	pump     *bodyPump
	finished bool // an immediate response or the end of the response phase
	ended    bool // the stream's end (EOF or an error) was received
	// sendClosed: the processor ended the stream while the request was
	// still being sent (an ImmediateResponse, such as a 413 for a body over
	// its limit); like Envoy, the exchange stops sending and reads why.
	sendClosed bool
	closed     sync.Once
}

type received struct {
	m   *extprocv3.ProcessingResponse
	err error
}

func (e *Exchange) receive() {
	defer e.recvDone.Done()
	for {
		m, err := e.stream.Recv()
		select {
		case e.recv <- received{m, err}:
		case <-e.ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// Pick is the request phase's outcome.
func (e *Exchange) Pick() *Pick { return &e.pick }

// next waits for the processor's next message. A timeout of 0 waits until
// ctx ends; stop, when it fires, ends the wait with errStopped.
func (e *Exchange) next(timeout time.Duration, stop <-chan struct{}) (*extprocv3.ProcessingResponse, error) {
	var expire <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expire = t.C
	}
	select {
	case r := <-e.recv:
		if r.err != nil {
			e.ended = true
		}
		if errors.Is(r.err, io.EOF) {
			return nil, errors.New("ext-proc: processor closed the stream before answering")
		}
		if r.err != nil {
			return nil, fmt.Errorf("ext-proc: %w", r.err)
		}
		return r.m, nil
	case <-expire:
		return nil, fmt.Errorf("ext-proc: no answer within %s: %w", timeout, ErrMessageTimeout)
	case <-stop:
		return nil, errStopped
	case <-e.ctx.Done():
		return nil, fmt.Errorf("ext-proc: %w", context.Cause(e.ctx))
	}
}

var errStopped = errors.New("stopped")

// ErrMessageTimeout marks an exchange that ended because an answer that was
// due did not come within the client's message timeout.
var ErrMessageTimeout = errors.New("message timeout")

// answer is next for a message the exchange is waiting for: an
// ImmediateResponse ends the exchange and comes back as the error, and the
// message's dynamic metadata is merged into the pick's, as Envoy merges it
// into the stream's.
func (e *Exchange) answer(timeout time.Duration, stop <-chan struct{}) (*extprocv3.ProcessingResponse, error) {
	m, err := e.next(timeout, stop)
	if err != nil {
		return nil, err
	}
	if m := m.GetImmediateResponse(); m != nil {
		ir, err := immediate(m)
		if err != nil {
			return nil, err
		}
		e.finished = true
		return nil, ir
	}
	mergeMetadata(&e.pick.DynamicMetadata, m.GetDynamicMetadata())
	return m, nil
}

// send sends a message; when the processor has already closed the stream the
// error is io.EOF and the reason is in the next received message.
func (e *Exchange) send(m *extprocv3.ProcessingRequest) error {
	if err := e.stream.Send(m); err != nil {
		if errors.Is(err, io.EOF) {
			e.sendClosed = true
			return nil
		}
		return fmt.Errorf("ext-proc: send: %w", err)
	}
	return nil
}

func (e *Exchange) requestPhase(req *Request) error {
	hdr := req.Header.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	id := hdr.Get(RequestIDHeader)
	if id == "" {
		id = NewRequestID()
		hdr.Set(RequestIDHeader, id)
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
		if req.Body != nil {
			method = http.MethodPost
		}
	}
	scheme := req.Scheme
	if scheme == "" {
		scheme = "http"
	}
	h := headers{{":method", method}, {":scheme", scheme}, {":authority", req.Authority}, {":path", req.Path}}
	h.fromHTTP(hdr)
	e.pick.RequestID = id
	md := requestMetadata(req.Subset)

	sent := time.Now()
	headersOnly := req.Body == nil && len(req.Trailer) == 0
	if err := e.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: headersOnly}},
		MetadataContext: md,
		ProtocolConfig:  protocolConfig,
		Attributes:      requestAttributes(req.SourceAddress),
	}); err != nil {
		return err
	}
	if req.Body != nil {
		if err := e.sendBody(req.Body, len(req.Trailer) == 0); err != nil {
			return err
		}
	}
	if len(req.Trailer) > 0 {
		var t headers
		t.fromHTTP(req.Trailer)
		if err := e.send(&extprocv3.ProcessingRequest{
			Request:         &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{Trailers: t.proto()}},
			MetadataContext: md,
		}); err != nil {
			return err
		}
	}
	bodySent := time.Now()

	m, err := e.answer(e.opts.messageTimeout, nil)
	now := time.Now()
	e.pick.Latency, e.pick.LatencyAfterBody = now.Sub(sent), now.Sub(bodySent)
	if err != nil {
		return err
	}
	hr := m.GetRequestHeaders()
	if hr == nil {
		return protocolErrorf("expected the request headers response, got %T", m.GetResponse())
	}
	e.pick.ClearRouteCache = hr.GetResponse().GetClearRouteCache()
	if e.pick.RejectedMutations, err = h.apply(requestHeaders, hr.GetResponse().GetHeaderMutation()); err != nil {
		return err
	}
	if err := e.readDestination(h); err != nil {
		return err
	}
	e.pick.Method, _ = h.get(":method")
	e.pick.Path, _ = h.get(":path")
	e.pick.Header = h.http()

	if req.Body != nil {
		if err := e.readRequestBody(); err != nil {
			return err
		}
	}
	if len(req.Trailer) > 0 {
		m, err := e.answer(e.opts.messageTimeout, nil)
		if err != nil {
			return err
		}
		if m.GetRequestTrailers() == nil {
			return protocolErrorf("expected the request trailers response, got %T", m.GetResponse())
		}
	}
	return nil
}

// sendBody streams body in chunks, reading one ahead so that the last chunk
// carries end_of_stream (unless trailers follow).
func (e *Exchange) sendBody(body io.Reader, endStream bool) error {
	buf := make([]byte, e.opts.chunkSize)
	var pending []byte
	for {
		n, err := io.ReadFull(body, buf)
		if n > 0 {
			if pending != nil {
				if err := e.sendChunk(pending, false); err != nil || e.sendClosed {
					return err
				}
			}
			pending = append([]byte(nil), buf[:n]...)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return e.sendChunk(pending, endStream)
		}
		if err != nil {
			return fmt.Errorf("read request body: %w", err)
		}
	}
}

func (e *Exchange) sendChunk(b []byte, eos bool) error {
	return e.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}},
		MetadataContext: requestMetadata(e.subset),
	})
}

// readDestination checks the Endpoint Picker Protocol's two copies of the
// destination: the header mutation and the envoy.lb metadata must both be
// present and equal, or the pick is void.
func (e *Exchange) readDestination(h headers) error {
	hv, inHeader := h.get(DestinationHeader)
	mv, inMetadata := metadataString(e.pick.DynamicMetadata, LBNamespace, DestinationHeader)
	switch {
	case !inHeader || hv == "":
		return protocolErrorf("no %s header in the request headers response", DestinationHeader)
	case !inMetadata:
		return protocolErrorf("no %s/%s dynamic metadata in the request headers response", LBNamespace, DestinationHeader)
	case hv != mv:
		return protocolErrorf("destination header %q differs from %s metadata %q", hv, LBNamespace, mv)
	}
	eps := SplitEndpoints(hv)
	if err := validEndpoints(eps); err != nil {
		return err
	}
	e.pick.Destination, e.pick.Endpoints = hv, eps
	return nil
}

// readRequestBody collects the streamed body mutations up to end_of_stream.
// FULL_DUPLEX_STREAMED forwards only what the processor sends back, so any
// other kind of body answer is a protocol error.
func (e *Exchange) readRequestBody() error {
	for {
		m, err := e.answer(e.opts.messageTimeout, nil)
		if err != nil {
			return err
		}
		br := m.GetRequestBody()
		if br == nil {
			return protocolErrorf("expected a request body response, got %T", m.GetResponse())
		}
		sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil {
			return protocolErrorf("request body response without a streamed_response mutation")
		}
		e.pick.Body = append(e.pick.Body, sr.GetBody()...)
		e.pick.BodyChunks++
		if sr.GetEndOfStream() {
			return nil
		}
	}
}

// Close ends the stream as Envoy does when the HTTP stream is done: it
// half-closes and lets the processor end the stream (bounded by
// closeTimeout), then cancels it. A processor that sees the close before the
// response phase completed treats it as a client that went away; GIE's EPP
// still runs its completion hooks then.
func (e *Exchange) Close() {
	e.closed.Do(func() {
		// A cancelled stream (a failed response phase) is dead already, and
		// its body pump may still be sending: no half-close then.
		if !e.ended && e.ctx.Err() == nil && e.stream.CloseSend() == nil {
			t := time.NewTimer(closeTimeout)
			defer t.Stop()
		drain:
			for {
				select {
				case r := <-e.recv:
					if r.err != nil {
						break drain
					}
				case <-t.C:
					break drain
				case <-e.ctx.Done():
					break drain
				}
			}
		}
		e.cancel(nil)
		e.recvDone.Wait()
	})
}

// closeTimeout bounds the wait for the processor to end a half-closed stream.
const closeTimeout = time.Second

// newRequestID returns a random UUID (version 4), Envoy's x-request-id form.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
