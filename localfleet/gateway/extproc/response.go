package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
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

// Respond runs the response phase: it sends the upstream's headers and,
// without waiting for their answer, starts sending the body as it arrives
// (FULL_DUPLEX_STREAMED: Envoy holds no body chunk back while the headers are
// with the processor), hands the mutated status and headers to sink.Headers
// when their answer comes, then each chunk the processor releases to
// sink.Body, until the processor ends the body (or answers the trailers).
// So a model server that sends its headers with the first token costs one
// wait for the processor before that token reaches the client, not two.
//
// An ImmediateResponse from the processor is returned as the error; if it
// came before sink.Headers was called, the caller can still send it to the
// client. After an error the caller must close resp.Body, which the body pump
// may be blocked reading, or read what is left of it through Unprocessed.
func (e *Exchange) Respond(resp *Response, sink Sink) (err error) {
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
	if resp.Body != nil {
		// Failing while the pump may still send: cancel the stream, so that
		// it stops and Close does not half-close under it.
		defer func() {
			if err != nil {
				e.cancel(err)
			}
		}()
		e.pump = newBodyPump()
		go e.pump.run(e, resp, md)
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
	if resp.Body != nil {
		e.pump.headersAnswered()
	}
	if err := sink.Headers(code, h.http()); err != nil {
		return err
	}
	if resp.Body == nil {
		e.finished = true
		return nil
	}
	return e.respondBody(resp, sink)
}

// Unprocessed is what a gateway that lets a response go on without its
// processor (failure_mode_allow) sends after Respond failed before calling
// sink.Headers: the part of body the pump had taken, which the processor
// never released, followed by the rest. Its first read waits for the pump to
// stop, which may be reading body for its next chunk; the headers need not
// wait for that.
func (e *Exchange) Unprocessed(body io.Reader) io.Reader {
	if e.pump == nil {
		return body
	}
	return &unprocessed{pump: e.pump, rest: body}
}

type unprocessed struct {
	pump *bodyPump
	rest io.Reader
	r    io.Reader
}

func (u *unprocessed) Read(b []byte) (int, error) {
	if u.r == nil {
		<-u.pump.done
		u.r = io.MultiReader(bytes.NewReader(u.pump.taken), u.rest)
	}
	return u.r.Read(b)
}

// respondBody hands the released chunks on while the pump sends the body.
// The processor may hold chunks back (GIE's EPP buffers a non-streamed body
// to its end), so there is no timeout while the upstream is still sending;
// once it is done the processor has the message timeout to finish.
func (e *Exchange) respondBody(resp *Response, sink Sink) error {
	stop := (<-chan struct{})(e.pump.done)
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
			case <-e.pump.done:
			case <-e.ctx.Done():
				return fmt.Errorf("ext-proc: %w", context.Cause(e.ctx))
			}
			if !e.pump.sentTrailers.Load() {
				e.finished = true
				return nil
			}
		case m.GetResponseTrailers() != nil:
			// The pump may still be returning from sending the trailers;
			// Close must not half-close under it.
			<-e.pump.done
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

// maxTaken bounds what the pump reads of a body while the processor has not
// answered its headers, as Envoy's buffer limit raises a watermark: past it
// the pump waits for the answer before reading on.
const maxTaken = 1 << 20

// bodyPump sends the upstream body to the processor on its own goroutine.
// Until the headers are answered it keeps a copy of what it sent, so that a
// response that goes on without the processor loses none of it.
type bodyPump struct {
	done         chan struct{}
	answered     chan struct{}
	sentTrailers atomic.Bool

	mu    sync.Mutex // guards taken, and the close of answered against take
	taken []byte
}

func newBodyPump() *bodyPump {
	return &bodyPump{done: make(chan struct{}), answered: make(chan struct{})}
}

// headersAnswered drops the copy: from here the processor releases the body.
func (p *bodyPump) headersAnswered() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.taken = nil
	close(p.answered)
}

// take keeps a copy of a chunk read before the headers were answered, and
// reports whether the pump may read on without waiting for that answer.
func (p *bodyPump) take(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.answered:
		return true
	default:
	}
	p.taken = append(p.taken, b...)
	return len(p.taken) < maxTaken
}

func (p *bodyPump) run(e *Exchange, resp *Response, md *corev3.Metadata) {
	defer close(p.done)
	if err := p.send(e, resp, md); err != nil {
		e.cancel(err)
	}
}

// send sends the upstream body as it arrives, then its end: an empty
// end_of_stream chunk, or the trailers, which end the stream instead. It
// stops when the processor ended the stream or the exchange failed.
func (p *bodyPump) send(e *Exchange, resp *Response, md *corev3.Metadata) error {
	buf := make([]byte, ResponseBodyChunkSize)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if !p.take(buf[:n]) {
				select {
				case <-p.answered:
				case <-e.ctx.Done():
					return nil
				}
			}
			// Send encodes the message before returning, so buf is free again.
			if err := e.send(&extprocv3.ProcessingRequest{
				Request:         &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: buf[:n]}},
				MetadataContext: md,
			}); err != nil || e.sendClosed || e.ctx.Err() != nil {
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
	p.sentTrailers.Store(true)
	return e.send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{Trailers: t.proto()}},
		MetadataContext: md,
	})
}
