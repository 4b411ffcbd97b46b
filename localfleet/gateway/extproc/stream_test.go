package extproc

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// serveProcessor serves p on a loopback port for the test and returns a
// connection to it.
func serveProcessor(t *testing.T, p extprocv3.ExternalProcessorServer) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, p)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// refusingProcessor answers 413 once a request body passes limit bytes, as
// fleetinfer's picker does, and ends the stream.
type refusingProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	limit int
}

func (p refusingProcessor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	n := 0
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		if n += len(req.GetRequestBody().GetBody()); n > p.limit {
			return s.Send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
				ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_PayloadTooLarge}}}})
		}
	}
}

// countingReader is an endless body that counts what was read of it.
type countingReader struct{ n int64 }

func (r *countingReader) Read(b []byte) (int, error) {
	r.n += int64(len(b))
	return len(b), nil
}

func TestAnImmediateResponseDuringTheBodyStopsSendingIt(t *testing.T) {
	conn := serveProcessor(t, refusingProcessor{limit: 1 << 20})

	body := &countingReader{}
	pick, err := New(conn).Pick(context.Background(), &Request{Path: "/v1/completions", Body: io.LimitReader(body, 4<<30)})
	if err != nil {
		t.Fatal(err)
	}
	if pick.Immediate == nil || pick.Immediate.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %+v, want the processor's 413", pick.Immediate)
	}
	// What the stream's flow-control windows take beyond the limit, not
	// the whole 4 GB.
	if body.n > 64<<20 {
		t.Errorf("%d bytes of the body read after the processor answered at 1 MiB", body.n)
	}
	t.Logf("body read: %d bytes", body.n)
}

// silentProcessor reads the stream and never answers, as a picker that
// hangs does.
type silentProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (silentProcessor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
	}
}

func TestAPickerThatDoesNotAnswerEndsTheExchangeWithAMessageTimeout(t *testing.T) {
	conn := serveProcessor(t, silentProcessor{})

	const timeout = 100 * time.Millisecond
	began := time.Now()
	_, err := New(conn, WithMessageTimeout(timeout)).Pick(context.Background(), &Request{Path: "/v1/completions", Body: strings.NewReader(`{"model":"m"}`)})
	if !errors.Is(err, ErrMessageTimeout) {
		t.Fatalf("error %v, want ErrMessageTimeout", err)
	}
	if took := time.Since(began); took < timeout || took > timeout+5*time.Second {
		t.Errorf("gave up after %s, want about %s", took, timeout)
	}
}

// pipingProcessor picks 127.0.0.1:8000 and echoes the request body, then
// withholds its answer to the response headers until a response body chunk
// has arrived. With failAtBody it instead ends the stream with an error
// there, as a picker that crashes does.
type pipingProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	failAtBody bool
}

func (p pipingProcessor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	const dest = "127.0.0.1:8000"
	md, _ := structpb.NewStruct(map[string]any{LBNamespace: map[string]any{DestinationHeader: dest}})
	headersPending := false
	for {
		req, err := s.Recv()
		if err != nil {
			return nil
		}
		var out []*extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			if r.RequestBody.GetEndOfStream() {
				out = append(out, &extprocv3.ProcessingResponse{
					Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
						HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set(DestinationHeader, dest)}}}}},
					DynamicMetadata: md,
				}, streamed(true, r.RequestBody.GetBody(), true))
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			headersPending = true
		case *extprocv3.ProcessingRequest_ResponseBody:
			if p.failAtBody {
				return errors.New("picker crashed")
			}
			if headersPending {
				headersPending = false
				out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
					ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
						HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{set("x-saw-body-first", "true")}}}}}})
			}
			out = append(out, streamed(false, r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream()))
		}
		for _, m := range out {
			if err := s.Send(m); err != nil {
				return nil
			}
		}
	}
}

func streamed(request bool, body []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
		Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// A model server sends its headers with the first token; Envoy's
// FULL_DUPLEX_STREAMED sends that token to the processor without waiting
// for the headers' answer, so the token waits for the processor once.
func TestResponseBodyIsSentBeforeTheHeadersAreAnswered(t *testing.T) {
	conn := serveProcessor(t, pipingProcessor{})
	ex, err := New(conn, WithMessageTimeout(5*time.Second)).Start(context.Background(), &Request{Path: "/v1/completions", Body: strings.NewReader(`{"model":"m"}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	var got []byte
	var hdr http.Header
	err = ex.Respond(&Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: strings.NewReader("data: token\n\n")}, Sink{
		Headers: func(_ int, h http.Header) error { hdr = h; return nil },
		Body:    func(b []byte) error { got = append(got, b...); return nil },
	})
	if err != nil {
		t.Fatalf("response phase: %v (a client that waits for the headers' answer before sending the body stalls here)", err)
	}
	if hdr.Get("X-Saw-Body-First") != "true" || string(got) != "data: token\n\n" {
		t.Errorf("headers %v, body %q", hdr, got)
	}
}

// A processor that fails after the pump took part of the body: what a
// gateway failing open passes on is the whole body, that part included, and
// getting it does not wait for the pump, which is blocked reading the next
// chunk.
func TestUnprocessedKeepsWhatThePumpTookBeforeTheProcessorFailed(t *testing.T) {
	conn := serveProcessor(t, pipingProcessor{failAtBody: true})
	ex, err := New(conn, WithMessageTimeout(5*time.Second)).Start(context.Background(), &Request{Path: "/v1/completions", Body: strings.NewReader(`{"model":"m"}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write([]byte("first chunk;")) }()
	err = ex.Respond(&Response{Status: http.StatusOK, Body: pr}, Sink{
		Headers: func(int, http.Header) error { t.Error("headers released by a processor that failed"); return nil },
		Body:    func([]byte) error { return nil },
	})
	if err == nil {
		t.Fatal("Respond succeeded with a processor that failed")
	}
	got := make(chan io.Reader, 1)
	go func() { got <- ex.Unprocessed(pr) }()
	var rest io.Reader
	select {
	case rest = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("Unprocessed waited for the upstream's next chunk")
	}
	go func() {
		_, _ = pw.Write([]byte("second chunk"))
		_ = pw.Close()
	}()
	all, err := io.ReadAll(rest)
	if err != nil || string(all) != "first chunk;second chunk" {
		t.Errorf("unprocessed body %q (err %v), want both chunks", all, err)
	}
}
