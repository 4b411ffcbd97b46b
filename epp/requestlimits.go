package epp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	configPb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typePb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// RequestLimits bound what clients can make the ext-proc server hold. GIE's
// StreamingServer appends every request-body chunk to one buffer until
// end_of_stream and keeps it for the request's life, so without a bound one
// large POST, or many slow ones, exhausts the picker and every request then
// falls to the pool's failure mode.
//
// A request whose body grows past MaxBodyBytes is answered 413 the moment
// the chunk that crosses the limit arrives; it is never buffered beyond the
// limit. The bodies of all requests in flight share MaxBufferedBytes: a
// chunk that does not fit is answered 503, so many requests below the
// per-request limit cannot exhaust memory together either. A request holds
// its share until its stream ends (GIE keeps the body until then).
//
// A shared budget alone lets a few slow uploads lock every other client
// out, so it is also split: the bodies one client is still sending hold at
// most MaxClientBodyBytes (429 beyond), the last ReservedBytes of the
// shared budget take only small bodies, which large ones therefore never
// crowd out, and a body that arrives slower than MinBodyRate after
// BodyGracePeriod is answered 408 and gives its share back.
type RequestLimits struct {
	MaxBodyBytes       int64
	MaxClientBodyBytes int64
	MaxBufferedBytes   int64
	ReservedBytes      int64
	// MinBodyRate is in bytes per second, averaged from the request's
	// headers on.
	MinBodyRate     int64
	BodyGracePeriod time.Duration
	// The ext-proc gRPC server's: the largest message, the concurrent
	// streams per connection, and the keepalive pings that find dead peers.
	MaxRecvMsgBytes      int
	MaxConcurrentStreams uint32
	KeepaliveTime        time.Duration
	KeepaliveTimeout     time.Duration

	budget bodyBudget
}

// smallBodyBytes is the largest body the reserve takes: a chat or
// completion prompt of a few thousand tokens with its JSON, the request
// most clients send, is well under it.
const smallBodyBytes = 64 << 10

// NewRequestLimits returns the defaults: 16 MiB per body (a long-context
// prompt is well under 1 MiB; images inline as base64 can reach a few MiB)
// and per client, 64 MiB for all bodies together of which 16 MiB (256 small
// bodies, thousands of chat prompts) only for small ones, which leaves
// large ones room for three of the largest, and 64 KiB/s after 10 s (a
// 16 MiB body may take 4.5 minutes; any uplink that still sends is
// faster). Each stream
// also costs the picker about 30 KiB of its own and up to a 64 KiB
// flow-control window of unread chunks: 10,000 slow bodies peak at about
// 450 MiB resident (TestHostileBodiesKeepThePickersMemoryBounded).
func NewRequestLimits() *RequestLimits {
	return &RequestLimits{
		MaxBodyBytes: 16 << 20, MaxClientBodyBytes: 16 << 20, MaxBufferedBytes: 64 << 20, ReservedBytes: 16 << 20,
		MinBodyRate: 64 << 10, BodyGracePeriod: 10 * time.Second,
		MaxRecvMsgBytes: 4 << 20, MaxConcurrentStreams: 4096,
		KeepaliveTime: 30 * time.Second, KeepaliveTimeout: 10 * time.Second,
	}
}

// AddFlags adds the limits' flags to fs.
func (l *RequestLimits) AddFlags(fs *pflag.FlagSet) {
	fs.Int64Var(&l.MaxBodyBytes, "max-request-body-bytes", l.MaxBodyBytes, "Largest request body the picker accepts; a larger one is answered 413 without being buffered beyond this.")
	fs.Int64Var(&l.MaxClientBodyBytes, "max-client-request-body-bytes", l.MaxClientBodyBytes, "Request-body bytes the bodies one client (the source.address the gateway sends; else each request alone) is still sending may hold together; a chunk beyond it is answered 429.")
	fs.Int64Var(&l.MaxBufferedBytes, "max-buffered-request-body-bytes", l.MaxBufferedBytes, "Request-body bytes all requests in flight may hold together; a chunk beyond it is answered 503.")
	fs.Int64Var(&l.ReservedBytes, "reserved-request-body-bytes", l.ReservedBytes, fmt.Sprintf("Part of --max-buffered-request-body-bytes only bodies of at most %d bytes may use, so that larger bodies never crowd small requests out.", smallBodyBytes))
	fs.Int64Var(&l.MinBodyRate, "min-request-body-bytes-per-second", l.MinBodyRate, "Slowest average rate, from the request's headers on, at which a request body may arrive once --request-body-grace-period has passed; a slower one is answered 408 and its bytes released.")
	fs.DurationVar(&l.BodyGracePeriod, "request-body-grace-period", l.BodyGracePeriod, "Time every request body gets before --min-request-body-bytes-per-second applies.")
	fs.IntVar(&l.MaxRecvMsgBytes, "ext-proc-max-recv-msg-bytes", l.MaxRecvMsgBytes, "Largest ext-proc message the gRPC server receives.")
	fs.Uint32Var(&l.MaxConcurrentStreams, "ext-proc-max-concurrent-streams", l.MaxConcurrentStreams, "Concurrent ext-proc streams (requests) per gateway connection; Envoy opens more connections beyond it.")
	fs.DurationVar(&l.KeepaliveTime, "ext-proc-keepalive-time", l.KeepaliveTime, "Idle time after which the ext-proc server pings a gateway connection.")
	fs.DurationVar(&l.KeepaliveTimeout, "ext-proc-keepalive-timeout", l.KeepaliveTimeout, "Time after a ping without answer at which the ext-proc server closes the connection.")
}

// Validate checks the flags.
func (l *RequestLimits) Validate() error {
	switch {
	case l.MaxBodyBytes <= 0 || l.MaxClientBodyBytes < l.MaxBodyBytes || l.MaxBufferedBytes < l.MaxClientBodyBytes:
		return fmt.Errorf("--max-request-body-bytes (%d), --max-client-request-body-bytes (%d) and --max-buffered-request-body-bytes (%d) must be positive and each at most the next",
			l.MaxBodyBytes, l.MaxClientBodyBytes, l.MaxBufferedBytes)
	case l.ReservedBytes < smallBodyBytes || l.MaxBufferedBytes-l.ReservedBytes < l.MaxBodyBytes:
		return fmt.Errorf("--reserved-request-body-bytes (%d) must hold a small body (%d bytes) and leave a largest body (--max-request-body-bytes, %d) room in --max-buffered-request-body-bytes (%d)",
			l.ReservedBytes, smallBodyBytes, l.MaxBodyBytes, l.MaxBufferedBytes)
	case l.MinBodyRate <= 0 || l.BodyGracePeriod <= 0:
		return errors.New("--min-request-body-bytes-per-second and --request-body-grace-period must be positive")
	case l.MaxRecvMsgBytes <= 0 || l.MaxConcurrentStreams == 0:
		return errors.New("--ext-proc-max-recv-msg-bytes and --ext-proc-max-concurrent-streams must be positive")
	case l.KeepaliveTime <= 0 || l.KeepaliveTimeout <= 0:
		return errors.New("--ext-proc-keepalive-time and --ext-proc-keepalive-timeout must be positive")
	}
	return nil
}

// ServerOptions are the ext-proc gRPC server's limits.
func (l *RequestLimits) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(l.MaxRecvMsgBytes),
		grpc.MaxConcurrentStreams(l.MaxConcurrentStreams),
		// Fixed flow-control windows: with them a stream buffers at most
		// 64 KiB its handler has not read. Without them grpc-go grows each
		// window from its bandwidth-delay estimate, up to megabytes.
		grpc.InitialWindowSize(64 << 10),
		grpc.InitialConnWindowSize(4 << 20),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: l.KeepaliveTime, Timeout: l.KeepaliveTimeout}),
		// Envoy pings no more often than its own interval (minutes by
		// default); a client pinging every few seconds is misbehaving.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
}

// Why a request is answered before its body ended: the reason label of
// fleetinfer_epp_request_bodies_refused_total.
const (
	tooLarge   = "too_large"
	clientFull = "client_full"
	bufferFull = "buffer_full"
	tooSlow    = "too_slow"
	afterEnd   = "after_end"
)

// bodyBudget is what the request bodies in flight hold: all of them, and
// per client the bodies still arriving.
type bodyBudget struct {
	mu       sync.Mutex
	total    int64
	arriving map[string]int64
}

// refusal returns why n more bytes of a body that holds held do not fit
// when its client's arriving bodies hold client and all bodies total, ""
// when they fit.
func (l *RequestLimits) refusal(total, client, held, n int64) string {
	switch {
	case held+n > l.MaxBodyBytes:
		return tooLarge
	case client+n > l.MaxClientBodyBytes:
		return clientFull
	case total+n > l.shareFor(held+n):
		return bufferFull
	}
	return ""
}

// shareFor is how much of the shared budget all bodies may hold for a body
// of size bytes to grow: all of it for a small body, all but the reserve
// for a larger one.
func (l *RequestLimits) shareFor(size int64) int64 {
	if size <= smallBodyBytes {
		return l.MaxBufferedBytes
	}
	return l.MaxBufferedBytes - l.ReservedBytes
}

// take reserves n more bytes for a body of client that holds held, or
// returns why they do not fit. A request without a client identity ("") is
// a client of its own.
func (l *RequestLimits) take(client string, held, n int64) string {
	b := &l.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	own := held
	if client != "" {
		own = b.arriving[client]
	}
	if r := l.refusal(b.total, own, held, n); r != "" {
		return r
	}
	b.total += n
	if client != "" {
		if b.arriving == nil {
			b.arriving = map[string]int64{}
		}
		b.arriving[client] += n
	}
	return ""
}

// release gives back held bytes: to the shared budget if shared, and to
// the client's while its body was still arriving. A body that ended stops
// counting against its client (it is served, not held open) but keeps its
// bytes in the shared budget until its stream ends.
func (l *RequestLimits) release(client string, held int64, arriving, shared bool) {
	b := &l.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	if shared {
		b.total -= held
	}
	if arriving && client != "" {
		if b.arriving[client] -= held; b.arriving[client] <= 0 {
			delete(b.arriving, client)
		}
	}
}

// clientAttributes is where the gateway puts the attributes its ext_proc
// filter lists in request_attributes; sourceAddress, the downstream
// client's address, is one it sets itself (after its trusted
// x-forwarded-for hops), which no client header can forge.
const (
	clientAttributes = "envoy.filters.http.ext_proc"
	sourceAddress    = "source.address"
)

// clientOf returns the client host a request's headers message names, ""
// when the gateway sends no source.address. Its port is left out: a
// client's requests come over many connections.
func clientOf(req *extProcPb.ProcessingRequest) string {
	addr := req.GetAttributes()[clientAttributes].GetFields()[sourceAddress].GetStringValue()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// limitedStream is the gateway's side of one ext-proc stream, counting the
// request body GIE's StreamingServer receives through it. When a chunk
// breaks a limit it answers with an ImmediateResponse itself and ends the
// stream for the server (io.EOF), which then returns without the chunk.
// A timer answers a body that arrives too slowly (408) even while no chunk
// comes, and gives its bytes back at once; the gateway then ends the
// stream, and with it the request and GIE's copy of the body.
//
// It also refuses (400) a request body message after the request ended (a
// body message, or headers or trailers with end_of_stream). Envoy never
// sends one, but GIE picks again on every message with end_of_stream, so a
// client that ended the request twice would have it picked, counted in
// flight and let across a cluster boundary twice.
type limitedStream struct {
	extProcPb.ExternalProcessor_ProcessServer
	limits *RequestLimits
	start  time.Time

	// mu orders the timer's answer with Recv's and with GIE's Send.
	mu    sync.Mutex
	timer *time.Timer
	// client is the client the request's headers named.
	client string
	// held is this request's share of the budget, given back by done.
	held int64
	// ended says the request's end_of_stream was received.
	ended bool
	// over says the request was answered here or its stream ended: the
	// timer does nothing and Recv ends the stream for GIE.
	over bool
}

func newLimitedStream(stream extProcPb.ExternalProcessor_ProcessServer, limits *RequestLimits) *limitedStream {
	s := &limitedStream{ExternalProcessor_ProcessServer: stream, limits: limits, start: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = time.AfterFunc(limits.BodyGracePeriod, s.expire)
	return s
}

func (s *limitedStream) Recv() (*extProcPb.ProcessingRequest, error) {
	req, err := s.ExternalProcessor_ProcessServer.Recv()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.over:
		return nil, io.EOF
	case err != nil:
		return req, err
	case req.GetRequestHeaders() != nil:
		s.client = clientOf(req)
		s.endIf(req.GetRequestHeaders().GetEndOfStream())
	case req.GetRequestTrailers() != nil:
		s.endIf(true) // a body ended by trailers (gRPC) has no end_of_stream
	case req.GetRequestBody() != nil:
		return s.body(req)
	}
	return req, nil
}

// body counts a request body chunk, or refuses it.
func (s *limitedStream) body(req *extProcPb.ProcessingRequest) (*extProcPb.ProcessingRequest, error) {
	if s.ended {
		return nil, s.refuse(afterEnd)
	}
	n := int64(len(req.GetRequestBody().GetBody()))
	if r := s.limits.take(s.client, s.held, n); r != "" {
		return nil, s.refuse(r)
	}
	s.held += n
	bufferedBodyBytes.Add(float64(n))
	s.endIf(req.GetRequestBody().GetEndOfStream())
	if !s.ended {
		s.timer.Reset(time.Until(s.deadline()))
	}
	return req, nil
}

// endIf records the end of the request when end is set: the body no
// longer counts against its client, nor against the clock.
func (s *limitedStream) endIf(end bool) {
	if !end || s.ended {
		return
	}
	s.ended = true
	s.timer.Stop()
	s.limits.release(s.client, s.held, true, false)
}

// deadline is when the body falls below the minimum rate: the grace, plus
// a second per MinBodyRate bytes received.
func (s *limitedStream) deadline() time.Time {
	return s.start.Add(s.limits.BodyGracePeriod + time.Duration(float64(s.held)/float64(s.limits.MinBodyRate)*float64(time.Second)))
}

// expire answers a body that is behind its deadline. The timer may fire
// for a deadline a chunk has since moved.
func (s *limitedStream) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.over && !s.ended && !time.Now().Before(s.deadline()) {
		_ = s.refuse(tooSlow)
	}
}

func (s *limitedStream) Send(resp *extProcPb.ProcessingResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ExternalProcessor_ProcessServer.Send(resp)
}

// refuse answers the request for reason, gives its share back and ends
// the stream for GIE's server.
func (s *limitedStream) refuse(reason string) error {
	code, msg := s.answerTo(reason)
	requestBodiesRefused.WithLabelValues(reason).Inc()
	s.giveBack()
	resp := &extProcPb.ProcessingResponse{Response: &extProcPb.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extProcPb.ImmediateResponse{
			Status:  &typePb.HttpStatus{Code: code},
			Body:    []byte(msg + "\n"),
			Details: "fleetinfer_epp_" + reason,
			Headers: &extProcPb.HeaderMutation{SetHeaders: []*configPb.HeaderValueOption{{
				Header: &configPb.HeaderValue{Key: "content-type", RawValue: []byte("text/plain; charset=utf-8")}}}},
		}}}
	if err := s.ExternalProcessor_ProcessServer.Send(resp); err != nil {
		return err
	}
	return io.EOF
}

// answerTo is the status and message a client gets for reason.
func (s *limitedStream) answerTo(reason string) (typePb.StatusCode, string) {
	l := s.limits
	switch reason {
	case tooLarge:
		return typePb.StatusCode_PayloadTooLarge, fmt.Sprintf("request body exceeds the endpoint picker's limit of %d bytes", l.MaxBodyBytes)
	case clientFull:
		return typePb.StatusCode_TooManyRequests, fmt.Sprintf("this client's request bodies still arriving exceed the endpoint picker's limit of %d bytes per client; retry when they have been sent", l.MaxClientBodyBytes)
	case bufferFull:
		return typePb.StatusCode_ServiceUnavailable, "the endpoint picker holds as many request bodies as it may; retry later"
	case tooSlow:
		return typePb.StatusCode_RequestTimeout, fmt.Sprintf("request body arrived slower than the endpoint picker's minimum of %d bytes per second after %s", l.MinBodyRate, l.BodyGracePeriod)
	}
	// afterEnd
	return typePb.StatusCode_BadRequest, "request body continued after its end_of_stream"
}

// done ends the stream: its timer stops and its share is given back.
func (s *limitedStream) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer.Stop()
	s.giveBack()
}

// giveBack releases the request's share and marks the stream over.
func (s *limitedStream) giveBack() {
	s.limits.release(s.client, s.held, !s.ended, true)
	bufferedBodyBytes.Sub(float64(s.held))
	s.held, s.over = 0, true
}
