package epp

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
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
type RequestLimits struct {
	MaxBodyBytes     int64
	MaxBufferedBytes int64
	// The ext-proc gRPC server's: the largest message, the concurrent
	// streams per connection, and the keepalive pings that find dead peers.
	MaxRecvMsgBytes      int
	MaxConcurrentStreams uint32
	KeepaliveTime        time.Duration
	KeepaliveTimeout     time.Duration

	buffered atomic.Int64
}

// NewRequestLimits returns the defaults: 16 MiB per body (a long-context
// prompt is well under 1 MiB; images inline as base64 can reach a few MiB),
// 64 MiB for all bodies together. Each stream also costs the picker about
// 30 KiB of its own and up to a 64 KiB flow-control window of unread
// chunks: 10,000 slow bodies peak at about 450 MiB resident
// (TestHostileBodiesKeepThePickersMemoryBounded).
func NewRequestLimits() *RequestLimits {
	return &RequestLimits{
		MaxBodyBytes: 16 << 20, MaxBufferedBytes: 64 << 20,
		MaxRecvMsgBytes: 4 << 20, MaxConcurrentStreams: 4096,
		KeepaliveTime: 30 * time.Second, KeepaliveTimeout: 10 * time.Second,
	}
}

// AddFlags adds the limits' flags to fs.
func (l *RequestLimits) AddFlags(fs *pflag.FlagSet) {
	fs.Int64Var(&l.MaxBodyBytes, "max-request-body-bytes", l.MaxBodyBytes, "Largest request body the picker accepts; a larger one is answered 413 without being buffered beyond this.")
	fs.Int64Var(&l.MaxBufferedBytes, "max-buffered-request-body-bytes", l.MaxBufferedBytes, "Request-body bytes all requests in flight may hold together; a chunk beyond it is answered 503.")
	fs.IntVar(&l.MaxRecvMsgBytes, "ext-proc-max-recv-msg-bytes", l.MaxRecvMsgBytes, "Largest ext-proc message the gRPC server receives.")
	fs.Uint32Var(&l.MaxConcurrentStreams, "ext-proc-max-concurrent-streams", l.MaxConcurrentStreams, "Concurrent ext-proc streams (requests) per gateway connection; Envoy opens more connections beyond it.")
	fs.DurationVar(&l.KeepaliveTime, "ext-proc-keepalive-time", l.KeepaliveTime, "Idle time after which the ext-proc server pings a gateway connection.")
	fs.DurationVar(&l.KeepaliveTimeout, "ext-proc-keepalive-timeout", l.KeepaliveTimeout, "Time after a ping without answer at which the ext-proc server closes the connection.")
}

// Validate checks the flags.
func (l *RequestLimits) Validate() error {
	switch {
	case l.MaxBodyBytes <= 0 || l.MaxBufferedBytes < l.MaxBodyBytes:
		return fmt.Errorf("--max-request-body-bytes must be positive and at most --max-buffered-request-body-bytes (%d, %d)", l.MaxBodyBytes, l.MaxBufferedBytes)
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

// take reserves n bytes of the shared body budget.
func (l *RequestLimits) take(n int64) bool {
	if l.buffered.Add(n) > l.MaxBufferedBytes {
		l.buffered.Add(-n)
		return false
	}
	return true
}

func (l *RequestLimits) release(n int64) { l.buffered.Add(-n) }

// limitedStream is the gateway's side of one ext-proc stream, counting the
// request body GIE's StreamingServer receives through it. When a chunk
// breaks a limit it answers with an ImmediateResponse itself and ends the
// stream for the server (io.EOF), which then returns without the chunk.
//
// It also refuses (400) a request body message after the request ended (a
// body message, or headers, with end_of_stream). Envoy never sends one, but
// GIE picks again on every message with end_of_stream, so a client that
// ended the request twice would have it picked, counted in flight and let
// across a cluster boundary twice.
type limitedStream struct {
	extProcPb.ExternalProcessor_ProcessServer
	limits *RequestLimits
	// held is this request's share of the budget, given back by done.
	held int64
	// ended says the request's end_of_stream (on its headers or body) was
	// received.
	ended bool
}

func (s *limitedStream) Recv() (*extProcPb.ProcessingRequest, error) {
	req, err := s.ExternalProcessor_ProcessServer.Recv()
	if req.GetRequestHeaders().GetEndOfStream() {
		s.ended = true // a request without a body
	}
	b := req.GetRequestBody()
	if err != nil || b == nil {
		return req, err
	}
	n := int64(len(b.GetBody()))
	switch {
	case s.ended:
		return nil, s.refuse("after_end", typePb.StatusCode_BadRequest, "request body continued after its end_of_stream")
	case s.held+n > s.limits.MaxBodyBytes:
		return nil, s.refuse("too_large", typePb.StatusCode_PayloadTooLarge,
			fmt.Sprintf("request body exceeds the endpoint picker's limit of %d bytes", s.limits.MaxBodyBytes))
	case !s.limits.take(n):
		return nil, s.refuse("buffer_full", typePb.StatusCode_ServiceUnavailable,
			"the endpoint picker holds as many request bodies as it may; retry later")
	}
	s.held += n
	s.ended = b.GetEndOfStream()
	bufferedBodyBytes.Add(float64(n))
	return req, nil
}

// refuse answers the request and ends the stream for GIE's server.
func (s *limitedStream) refuse(reason string, code typePb.StatusCode, msg string) error {
	requestBodiesRefused.WithLabelValues(reason).Inc()
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

// done gives the request's share back.
func (s *limitedStream) done() {
	s.limits.release(s.held)
	bufferedBodyBytes.Sub(float64(s.held))
	s.held = 0
}
