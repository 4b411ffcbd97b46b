package epp

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/structpb"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"
)

// held returns the bytes all bodies hold.
func (l *RequestLimits) held() int64 {
	l.budget.mu.Lock()
	defer l.budget.mu.Unlock()
	return l.budget.total
}

// fromClient adds the source.address attribute Envoy sends with a
// request's headers when its ext_proc filter lists it; "" adds none.
func fromClient(m *extProcPb.ProcessingRequest, client string) *extProcPb.ProcessingRequest {
	if client != "" {
		m.Attributes = map[string]*structpb.Struct{clientAttributes: {Fields: map[string]*structpb.Value{
			sourceAddress: structpb.NewStringValue(client)}}}
	}
	return m
}

// The lock-out of issue 51: eight clients trickle 16 MiB uploads into the
// picker, over gRPC as Envoy reaches it, and never finish them. They fill
// what the shared budget gives large bodies; a small request from a ninth
// client is still picked, from the reserve.
func TestASmallRequestIsServedWhileEightClientsHoldLargeUploadsOpen(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := NewRequestLimits()
	c := serveOverGRPC(t, newHarness(t, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil)}, nil).withLimits(l))

	// Three 16 MiB bodies fill what large bodies may use (the shared 64 MiB
	// less its 16 MiB reserve), whatever the order chunks come in: a body
	// refused gives its share back and the others take it up.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			trickle(ctx, t, c, fmt.Sprintf("10.0.0.%d:4000%d", i+1, i), 512<<10, l.MaxBodyBytes)
		}()
	}
	wg.Wait()
	for l.held() < l.MaxBufferedBytes-l.ReservedBytes && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the uploads hold %d MiB", l.held()>>20)

	stream := openRequest(ctx, t, c, "10.0.0.9:5000")
	if err := stream.Send(bodyChunk([]byte(completion("hi")), true)); err != nil {
		t.Fatal(err)
	}
	if dest, status := pickOrAnswer(t, stream); dest != "127.11.0.1:8000" {
		t.Errorf("the ninth client's small request got %d, want its pick", status)
	}
}

// serveOverGRPC serves h's picker over gRPC and returns a client of it.
func serveOverGRPC(t *testing.T, h *harness) extProcPb.ExternalProcessorClient {
	return (&pickerProcess{addr: servePicker(t, h)}).dial(t)
}

// trickle sends total body bytes from client in chunks, 20 ms apart,
// without ending the body, until the picker refuses them. The stream
// stays open until ctx ends.
func trickle(ctx context.Context, t *testing.T, c extProcPb.ExternalProcessorClient, client string, chunk, total int64) {
	stream := openRequest(ctx, t, c, client)
	b := make([]byte, chunk)
	for sent := int64(0); sent < total && stream.Send(bodyChunk(b, false)) == nil; sent += chunk {
		time.Sleep(20 * time.Millisecond)
	}
}

// pickOrAnswer returns the destination the picker sets for a request, or
// the status it answers it with.
func pickOrAnswer(t *testing.T, stream extProcPb.ExternalProcessor_ProcessClient) (string, int) {
	t.Helper()
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream ended without a pick or an answer: %v", err)
		}
		if im := resp.GetImmediateResponse(); im != nil {
			return "", int(im.GetStatus().GetCode())
		}
		if d := destination(resp); d != "" {
			return d, 0
		}
	}
}

// The budget's rules, on a picker with 1 MiB shared, 128 KiB of it
// reserved, 512 KiB per body and 640 KiB per client.
func TestBodyBudget(t *testing.T) {
	const k = 1 << 10
	l := &RequestLimits{MaxBodyBytes: 512 * k, MaxClientBodyBytes: 640 * k, MaxBufferedBytes: 1024 * k, ReservedBytes: 128 * k}
	tests := []struct {
		name                string
		total, client, held int64 // held by all bodies, the client's arriving ones, this one
		n                   int64 // the chunk
		want                string
	}{
		{"a chunk within every limit fits", 100 * k, 100 * k, 100 * k, 16 * k, ""},
		{"a body may grow to the per-body limit", 100 * k, 500 * k, 500 * k, 12 * k, ""},
		{"a body past the per-body limit is too large", 100 * k, 500 * k, 500 * k, 13 * k, tooLarge},
		{"a client's arriving bodies together are capped", 600 * k, 630 * k, 10 * k, 16 * k, clientFull},
		{"a large body may not grow into the reserve", 890 * k, 200 * k, 200 * k, 16 * k, bufferFull},
		{"a large body fits up to the reserve", 880 * k, 200 * k, 200 * k, 16 * k, ""},
		{"a small body fits in the reserve when large ones hold the rest", 896 * k, 0, 0, 64 * k, ""},
		{"a small body that grows past the small size leaves the reserve", 960 * k, 64 * k, 64 * k, 1, bufferFull},
		{"small bodies cannot pass the whole budget", 1020 * k, 0, 0, 8 * k, bufferFull},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := l.refusal(tt.total, tt.client, tt.held, tt.n); got != tt.want {
				t.Errorf("refusal %q, want %q", got, tt.want)
			}
		})
	}
}

// A client's bodies share its cap while they arrive; a body that ended no
// longer counts against it, and a request without a client identity is a
// client of its own.
func TestClientShares(t *testing.T) {
	const k = 1 << 10
	l := &RequestLimits{MaxBodyBytes: 64 * k, MaxClientBodyBytes: 96 * k, MaxBufferedBytes: 1024 * k, ReservedBytes: 128 * k}
	steps := []struct {
		name, client string
		held, n      int64
		want         string
	}{
		{"the client's first body", "10.0.0.1", 0, 64 * k, ""},
		{"its second body within the client's cap", "10.0.0.1", 0, 32 * k, ""},
		{"its third body over the client's cap", "10.0.0.1", 0, 1, clientFull},
		{"another client's body", "10.0.0.2", 0, 64 * k, ""},
		{"a body without a client identity", "", 0, 64 * k, ""},
		{"another one without a client identity", "", 0, 64 * k, ""},
	}
	for _, st := range steps {
		if got := l.take(st.client, st.held, st.n); got != st.want {
			t.Errorf("%s: refusal %q, want %q", st.name, got, st.want)
		}
	}
	l.release("10.0.0.1", 64*k, true, false) // its first body ended
	if got := l.take("10.0.0.1", 0, 64*k); got != "" {
		t.Errorf("a body after the client's first ended: refusal %q, want none", got)
	}
	if got, want := l.held(), int64(352*k); got != want {
		t.Errorf("all bodies hold %d KiB, want %d KiB (an ended body keeps its bytes until its stream ends)", got/k, want/k)
	}
}

// The minimum body rate: after the grace, a body must have arrived at
// MinBodyRate on average since its headers, or it is answered 408 and its
// bytes are released at once, while its stream is still open.
func TestSlowBodies(t *testing.T) {
	const grace, rate = 200 * time.Millisecond, 40 << 10 // 40 KiB/s: 2 KiB per 50 ms
	tests := []struct {
		name     string
		every    time.Duration // between 2 KiB chunks
		chunks   int
		end      bool // the body ends after them
		want     int  // 408, or 0 for the pick
		wantHeld bool // the body still holds its bytes at the end
	}{
		{"a body that stalls is answered 408 after the grace", 0, 1, false, 408, false},
		{"a body slower than the rate is answered 408", 100 * time.Millisecond, 10, true, 408, false},
		{"a body faster than the rate is picked", 25 * time.Millisecond, 20, true, 0, true},
		{"a body that ended is not timed while it is served", 0, 1, true, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewRequestLimits()
			l.BodyGracePeriod, l.MinBodyRate = grace, rate
			h := newHarness(t, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil)}, nil).withLimits(l)
			before := testutil.ToFloat64(requestBodiesRefused.WithLabelValues(tooSlow))
			s, _ := h.processLive(t)
			go s.paced(tt.every, tt.chunks, tt.end)
			if _, got := s.outcome(t, 4*grace+time.Second); got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
			time.Sleep(2 * grace) // longer than the grace again: an ended body stays
			if held := l.held() > 0; held != tt.wantHeld {
				t.Errorf("the body holds bytes: %v, want %v", held, tt.wantHeld)
			}
			if rose := testutil.ToFloat64(requestBodiesRefused.WithLabelValues(tooSlow)) - before; (rose == 1) != (tt.want == 408) {
				t.Errorf("fleetinfer_epp_request_bodies_refused_total{reason=\"too_slow\"} rose by %v", rose)
			}
		})
	}
}

// paced sends a POST's headers and the start of a completion, then 2 KiB
// of its prompt every interval and, if end, the rest of the body.
func (s *liveStream) paced(every time.Duration, chunks int, end bool) {
	if !s.send(requestMessages("", 1, nil)[0]) || !s.send(bodyChunk([]byte(`{"model":"llama","max_tokens":8,"prompt":"`), false)) {
		return
	}
	for range chunks {
		time.Sleep(every)
		if !s.send(bodyChunk(bytes.Repeat([]byte("x"), 2<<10), false)) {
			return
		}
	}
	if end {
		s.send(bodyChunk([]byte(`"}`), true))
	}
}

func TestRequestLimitsValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*RequestLimits)
		want string // in the error; "" for none
	}{
		{"the defaults", func(*RequestLimits) {}, ""},
		{"a client cap below the body limit", func(l *RequestLimits) { l.MaxClientBodyBytes = l.MaxBodyBytes - 1 }, "--max-client-request-body-bytes"},
		{"a client cap over the shared budget", func(l *RequestLimits) { l.MaxClientBodyBytes = l.MaxBufferedBytes + 1 }, "each at most the next"},
		{"a reserve smaller than a small body", func(l *RequestLimits) { l.ReservedBytes = smallBodyBytes - 1 }, "--reserved-request-body-bytes"},
		{"a reserve that leaves no room for the largest body", func(l *RequestLimits) { l.ReservedBytes = l.MaxBufferedBytes - l.MaxBodyBytes + 1 }, "room"},
		{"no minimum rate", func(l *RequestLimits) { l.MinBodyRate = 0 }, "--min-request-body-bytes-per-second"},
		{"no grace", func(l *RequestLimits) { l.BodyGracePeriod = 0 }, "--request-body-grace-period"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := NewRequestLimits()
			tt.edit(l)
			err := l.Validate()
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}
