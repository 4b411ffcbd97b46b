package epp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extProcPb "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/metadata"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/internal/memlimit"
)

// withLimits returns the harness's server with other request limits.
func (h *harness) withLimits(l *RequestLimits) *harness {
	s := h.server.(extProcServer)
	s.limits = l
	return &harness{server: s, failOpen: h.failOpen}
}

func TestRequestBodyLimits(t *testing.T) {
	idle := endpoint("a", "127.11.0.1:8000", 0, nil)
	body := completion(strings.Repeat("x", 4000)) // about 4 KB
	tests := []struct {
		name          string
		body, buffer  int64
		held          int64 // bytes other requests in flight hold
		chunk         int
		want          result
		wantRefusedAs string
	}{
		{name: "a body within the limit is picked", body: 8 << 10, buffer: 1 << 20, chunk: 1000,
			want: result{dest: "127.11.0.1:8000", metadata: "127.11.0.1:8000"}},
		{name: "a body exactly at the limit is picked", body: int64(len(body)), buffer: 1 << 20, chunk: 1000,
			want: result{dest: "127.11.0.1:8000", metadata: "127.11.0.1:8000"}},
		{name: "a body one byte over the limit is answered 413", body: int64(len(body)) - 1, buffer: 1 << 20, chunk: 1000,
			want: result{status: 413}, wantRefusedAs: "too_large"},
		{name: "a single chunk over the limit is answered 413", body: 1000, buffer: 1 << 20, chunk: len(body),
			want: result{status: 413}, wantRefusedAs: "too_large"},
		{name: "a body that does not fit the shared buffer is answered 503", body: 8 << 10, buffer: 8 << 10, held: 6 << 10, chunk: 1000,
			want: result{status: 503}, wantRefusedAs: "buffer_full"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &RequestLimits{MaxBodyBytes: tt.body, MaxClientBodyBytes: tt.body, MaxBufferedBytes: tt.buffer,
				MinBodyRate: 1, BodyGracePeriod: time.Minute}
			l.budget.total = tt.held
			h := newHarness(t, []fwkdl.Endpoint{idle}, nil).withLimits(l)
			before := testutil.ToFloat64(requestBodiesRefused.WithLabelValues(tt.wantRefusedAs))
			if got := h.request(t, body, tt.chunk, nil); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if tt.wantRefusedAs != "" && testutil.ToFloat64(requestBodiesRefused.WithLabelValues(tt.wantRefusedAs)) != before+1 {
				t.Errorf("fleetinfer_epp_request_bodies_refused_total{reason=%q} did not count the refusal", tt.wantRefusedAs)
			}
			if got := l.held(); got != tt.held {
				t.Errorf("after the stream ended %d bytes are held, want %d (the other requests')", got, tt.held)
			}
		})
	}
}

func TestClientDestinationHeaderNeverStaysInFrontOfThePick(t *testing.T) {
	h := newHarness(t, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil)}, nil)
	s := &fakeStream{ctx: context.Background(), in: requestMessages(completion("hi"), 64, nil)}
	rh := s.in[0].GetRequestHeaders().GetHeaders()
	rh.Headers = append(rh.Headers, &corev3.HeaderValue{Key: metadata.DestinationEndpointKey, RawValue: []byte("169.254.169.254:80")},
		&corev3.HeaderValue{Key: metadata.SubsetFilterKey, RawValue: []byte("169.254.169.254:80")})
	if err := h.server.Process(s); err != nil {
		t.Fatal(err)
	}
	var dests int
	for _, resp := range s.sent {
		for _, o := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
			switch strings.ToLower(o.GetHeader().GetKey()) {
			case metadata.DestinationEndpointKey:
				dests++
				if v := string(o.GetHeader().GetRawValue()); v != "127.11.0.1:8000" {
					t.Errorf("destination %q, want the picked 127.11.0.1:8000", v)
				}
				if o.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
					t.Errorf("destination header appended (%v): a client's own value would stay in front", o.GetAppendAction())
				}
			case strings.ToLower(metadata.SubsetFilterKey):
				t.Errorf("the client's subset header is passed on")
			}
		}
	}
	if dests != 1 {
		t.Errorf("%d destination headers set, want 1", dests)
	}
}

// The picker under hostile bodies, over gRPC as Envoy reaches it: one 4 GB
// body streamed (generated, never allocated), then 10,000 slow bodies. The
// picker runs in a process of its own (TestPickerProcess), as deployed with a
// 512 MiB memory limit, and its peak resident memory (VmHWM) must stay under
// that limit.
func TestHostileBodiesKeepThePickersMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("streams 10,000 requests")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("a 4 GB body is answered 413 after the limit", func(t *testing.T) {
		picker := startPicker(t, NewRequestLimits().MaxBodyBytes)
		stream := openRequest(ctx, t, picker.dial(t), "")
		chunk := make([]byte, 64<<10) // Envoy's read size; sent again and again
		const total = 4 << 30
		var sent int64
		start := time.Now()
		for sent < total {
			if err := stream.Send(bodyChunk(chunk, sent+int64(len(chunk)) >= total)); err != nil {
				break // the picker answered and closed; its answer follows
			}
			sent += int64(len(chunk))
		}
		status, msg := answer(t, stream)
		rss := picker.peakRSS(t)
		t.Logf("4 GB body: answered %d %q after %d bytes sent (%.1f MiB) in %s; picker's peak RSS %d MiB",
			status, msg, sent, float64(sent)/(1<<20), time.Since(start).Round(time.Millisecond), rss>>20)
		if status != 413 || !strings.Contains(msg, strconv.FormatInt(NewRequestLimits().MaxBodyBytes, 10)) {
			t.Errorf("answer %d %q, want 413 naming the limit", status, msg)
		}
		if sent >= total {
			t.Errorf("the whole body was sent: the picker never answered")
		}
		if rss >= pickerContainerMemory {
			t.Errorf("picker's peak RSS %d MiB, want under its container's %d MiB", rss>>20, pickerContainerMemory>>20)
		}
	})

	t.Run("10,000 slow bodies are held within the shared budget and answered", func(t *testing.T) {
		// 10,000 requests each send a 2 KiB chunk a second. The shared
		// budget (64 MiB) fills after about 3 rounds; the per-request limit
		// is 24 KiB here (16 MiB by default), so that every request meets
		// one limit or the other within the 20 rounds.
		const n, rounds, maxBody = 10000, 20, 24 << 10
		picker := startPicker(t, maxBody)
		clients := []extProcPb.ExternalProcessorClient{picker.dial(t), picker.dial(t), picker.dial(t), picker.dial(t)}
		streams := make([]extProcPb.ExternalProcessor_ProcessClient, n)
		for i := range streams {
			streams[i] = openRequest(ctx, t, clients[i%len(clients)], "")
		}
		chunk := make([]byte, 2<<10)
		open := make([]bool, n)
		for i := range open {
			open[i] = true
		}
		start := time.Now()
		for r := 0; r < rounds; r++ {
			round := time.Now()
			var wg sync.WaitGroup
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < n; i += 8 {
						if open[i] && streams[i].Send(bodyChunk(chunk, false)) != nil {
							open[i] = false
						}
					}
				}()
			}
			wg.Wait()
			time.Sleep(time.Until(round.Add(time.Second)))
		}
		counts := map[int]int{}
		for _, s := range streams {
			status, _ := answer(t, s)
			counts[status]++
		}
		rss := picker.peakRSS(t)
		t.Logf("%d slow bodies over %s: answers %v; picker's peak RSS %d MiB", n, time.Since(start).Round(time.Second), counts, rss>>20)
		if counts[413]+counts[503] != n || counts[413] == 0 {
			t.Errorf("answers %v, want every request answered 413 or 503, some 413", counts)
		}
		if rss >= pickerContainerMemory {
			t.Errorf("picker's peak RSS %d MiB, want under its container's %d MiB", rss>>20, pickerContainerMemory>>20)
		}
	})
}

// pickerContainerMemory is the memory limit of the test picker's notional
// container, which its peak RSS must stay under.
const pickerContainerMemory = 512 << 20

// pickerProcessEnv, set to the per-request body limit, makes
// TestPickerProcess serve a picker.
const pickerProcessEnv = "FLEETINFER_TEST_PICKER_MAX_BODY"

// TestPickerProcess is the picker process of
// TestHostileBodiesKeepThePickersMemoryBounded: the harness's picker on a
// gRPC server with the default limits but the body limit given, serving
// until its standard input closes. It prints its address.
func TestPickerProcess(t *testing.T) {
	maxBody, err := strconv.ParseInt(os.Getenv(pickerProcessEnv), 10, 64)
	if err != nil {
		t.Skip("run by TestHostileBodiesKeepThePickersMemoryBounded")
	}
	// The picker as deployed with a 512 MiB memory limit: its runner sets
	// the soft limit from the container's.
	memlimit.Apply(pickerContainerMemory)
	limits := NewRequestLimits()
	limits.MaxBodyBytes = maxBody
	// The slow bodies stay until the size limits answer them, however long
	// the rounds take on a loaded machine: the rate's timers run (their
	// memory counts) but never fire.
	limits.BodyGracePeriod = time.Hour
	fmt.Println("listening", servePicker(t, newHarness(t, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil)}, nil).withLimits(limits)))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// servePicker serves h's picker on a loopback gRPC server with its limits'
// options, as the runner does, until the test ends, and returns its
// address.
func servePicker(t *testing.T, h *harness) string {
	t.Helper()
	srv := grpc.NewServer(h.server.(extProcServer).limits.ServerOptions()...)
	extProcPb.RegisterExternalProcessorServer(srv, h.server)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

type pickerProcess struct {
	cmd  *exec.Cmd
	addr string
}

func startPicker(t *testing.T, maxBody int64) *pickerProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPickerProcess$")
	cmd.Env = append(os.Environ(), pickerProcessEnv+"="+strconv.FormatInt(maxBody, 10))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return &pickerProcess{cmd: cmd, addr: addr}
		}
	}
	t.Fatalf("the picker process exited without listening: %v", sc.Err())
	return nil
}

func (p *pickerProcess) dial(t *testing.T) extProcPb.ExternalProcessorClient {
	t.Helper()
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return extProcPb.NewExternalProcessorClient(conn)
}

// peakRSS returns the process's VmHWM in bytes.
func (p *pickerProcess) peakRSS(t testing.TB) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in the picker's /proc status")
	return 0
}

// openRequest opens an ext-proc stream and sends a POST's headers, from
// client when it is not "" (the source.address Envoy sends).
func openRequest(ctx context.Context, t testing.TB, c extProcPb.ExternalProcessorClient, client string) extProcPb.ExternalProcessor_ProcessClient {
	t.Helper()
	stream, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(fromClient(requestMessages("", 1, nil)[0], client)); err != nil {
		t.Fatal(err)
	}
	return stream
}

func bodyChunk(b []byte, eos bool) *extProcPb.ProcessingRequest {
	return &extProcPb.ProcessingRequest{Request: &extProcPb.ProcessingRequest_RequestBody{
		RequestBody: &extProcPb.HttpBody{Body: b, EndOfStream: eos}}}
}

// answer returns the status and body of the picker's immediate response, 0
// when it sent none before closing.
func answer(t testing.TB, stream extProcPb.ExternalProcessor_ProcessClient) (int, string) {
	t.Helper()
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return 0, ""
		}
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		if im := resp.GetImmediateResponse(); im != nil {
			return int(im.GetStatus().GetCode()), string(im.GetBody())
		}
	}
}

// A request whose body ends twice is picked once: the second end, which
// Envoy never sends, is answered 400 before GIE's server picks again.
func TestARequestBodyAfterItsEndIsRefusedBeforeASecondPick(t *testing.T) {
	tests := []struct {
		name string
		in   func() []*extProcPb.ProcessingRequest
	}{
		{"a body ended twice", func() []*extProcPb.ProcessingRequest {
			msgs := requestMessages(completion("hi"), 1<<10, nil)
			return append(msgs, msgs[len(msgs)-1])
		}},
		{"a body after headers that ended the request", func() []*extProcPb.ProcessingRequest {
			msgs := requestMessages(completion("hi"), 1<<10, nil)
			msgs[0].GetRequestHeaders().EndOfStream = true
			return msgs
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil)}, nil)
			before := testutil.ToFloat64(requestBodiesRefused.WithLabelValues("after_end"))
			s := &fakeStream{ctx: context.Background(), in: tt.in()}
			if err := h.server.Process(s); err != nil {
				t.Fatal(err)
			}
			var picks, refused int
			for _, r := range s.sent {
				if destination(r) != "" {
					picks++
				}
				if r.GetImmediateResponse().GetStatus().GetCode() == 400 {
					refused++
				}
			}
			if picks > 1 || refused != 1 {
				t.Errorf("%d picks and %d 400 answers, want at most one pick and the second end refused", picks, refused)
			}
			if got := testutil.ToFloat64(requestBodiesRefused.WithLabelValues("after_end")) - before; got != 1 {
				t.Errorf("fleetinfer_epp_request_bodies_refused_total{reason=\"after_end\"} rose by %v, want 1", got)
			}
		})
	}
}
