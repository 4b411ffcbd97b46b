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

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
