package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Response is the upstream's answer as the gateway received it.
type Response struct {
	Status int
	Header http.Header
	// Body is read as it arrives, each read becoming one message; nil when
	// the response has no body (HEAD, 204, 304).
	Body io.Reader
	// Trailer is read once Body is exhausted, as http.Response fills its
	// Trailer map then.
	Trailer http.Header
}

// Sink receives the response as the processor releases it.
type Sink struct {
	// Headers gets the status and headers after the processor's mutation,
	// before any body.
	Headers func(status int, h http.Header) error
	// Body gets every chunk the processor releases, in order: a streamed
	// (SSE) response arrives chunk by chunk, a buffered one at its end.
	Body func(chunk []byte) error
	// Trailers gets the trailers after mutation, if the upstream sent any.
	Trailers func(h http.Header) error
}

// ResponseBodyChunkSize is the largest upstream read forwarded in one
// message.
const ResponseBodyChunkSize = 32 << 10

// Respond runs the response phase: it sends the upstream's headers and waits
// for their answer, hands the mutated status and headers to sink.Headers,
// then streams the body to the processor while handing each released chunk
// to sink.Body, until the processor ends the body (or answers the trailers).
//
// An ImmediateResponse from the processor is returned as the error; if it
// came before sink.Headers was called, the caller can still send it to the
// client. After an error the caller must close resp.Body, which the body pump
// may be blocked reading.
func (e *Exchange) Respond(resp *Response, sink Sink) error {
	if e.finished {
		return errors.New("ext-proc: the exchange is already finished")
	}
	md := responseMetadata(e.pick.Destination, e.subset)
	h := headers{{":status", strconv.Itoa(resp.Status)}}
	h.fromHTTP(resp.Header)
	if err := e.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: h.proto(), EndOfStream: resp.Body == nil}},
		MetadataContext: md,
	}); err != nil {
		return err
	}
	m, err := e.answer(e.opts.messageTimeout, nil)
	if err != nil {
		return err
	}
	hr := m.GetResponseHeaders()
	if hr == nil {
		return protocolErrorf("expected the response headers response, got %T", m.GetResponse())
	}
	if _, err := h.apply(responseHeaders, hr.GetResponse().GetHeaderMutation()); err != nil {
		return err
	}
	status, _ := h.get(":status")
	code, _ := strconv.Atoi(status)
	if err := sink.Headers(code, h.http()); err != nil {
		return err
	}
	if resp.Body == nil {
		e.finished = true
		return nil
	}
	return e.respondBody(resp, md, sink)
}

// respondBody pumps the upstream body to the processor on its own goroutine
// (FULL_DUPLEX_STREAMED sends without waiting for answers) while this one
// hands the released chunks on. The processor may hold chunks back (GIE's EPP
// buffers a non-streamed body to its end), so there is no timeout while the
// upstream is still sending; once it is done the processor has the message
// timeout to finish.
func (e *Exchange) respondBody(resp *Response, md *corev3.Metadata, sink Sink) (err error) {
	// Failing while the pump may still send: cancel the stream, so that it
	// stops and Close does not half-close under it.
	defer func() {
		if err != nil {
			e.cancel(err)
		}
	}()
	pumped := make(chan struct{})
	var sentTrailers atomic.Bool
	go func() {
		defer close(pumped)
		if err := e.pump(resp, md, &sentTrailers); err != nil {
			e.cancel(err)
		}
	}()
	stop := (<-chan struct{})(pumped)
	var timeout time.Duration
	for {
		m, err := e.answer(timeout, stop)
		if errors.Is(err, errStopped) {
			stop, timeout = nil, e.opts.messageTimeout
			continue
		}
		if err != nil {
			return err
		}
		switch {
		case m.GetResponseBody() != nil:
			sr := m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return protocolErrorf("response body response without a streamed_response mutation")
			}
			if len(sr.GetBody()) > 0 {
				if err := sink.Body(sr.GetBody()); err != nil {
					return err
				}
			}
			if !sr.GetEndOfStream() {
				continue
			}
			// The body is over; with trailers sent, their answer ends it.
			select {
			case <-pumped:
			case <-e.ctx.Done():
				return fmt.Errorf("ext-proc: %w", context.Cause(e.ctx))
			}
			if !sentTrailers.Load() {
				e.finished = true
				return nil
			}
		case m.GetResponseTrailers() != nil:
			// The pump may still be returning from sending the trailers;
			// Close must not half-close under it.
			<-pumped
			var t headers
			t.fromHTTP(resp.Trailer)
			if _, err := t.apply(responseHeaders, m.GetResponseTrailers().GetHeaderMutation()); err != nil {
				return err
			}
			if sink.Trailers != nil {
				if err := sink.Trailers(t.http()); err != nil {
					return err
				}
			}
			e.finished = true
			return nil
		default:
			return protocolErrorf("expected a response body or trailers response, got %T", m.GetResponse())
		}
	}
}

// pump sends the upstream body as it arrives, then its end: an empty
// end_of_stream chunk, or the trailers, which end the stream instead.
func (e *Exchange) pump(resp *Response, md *corev3.Metadata, sentTrailers *atomic.Bool) error {
	buf := make([]byte, ResponseBodyChunkSize)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			// Send encodes the message before returning, so buf is free again.
			if err := e.send(&extprocv3.ProcessingRequest{
				Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: buf[:n]}},
				MetadataContext: md,
			}); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("upstream response body: %w", err)
		}
	}
	var t headers
	t.fromHTTP(resp.Trailer)
	if len(t) == 0 {
		return e.send(&extprocv3.ProcessingRequest{
			Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{EndOfStream: true}},
			MetadataContext: md,
		})
	}
	sentTrailers.Store(true)
	return e.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: t.proto()}},
		MetadataContext: md,
	})
}
