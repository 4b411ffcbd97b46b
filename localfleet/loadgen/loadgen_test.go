package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/ports"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

func TestReadStreamCountsTokensAndRefusesBrokenStreams(t *testing.T) {
	cases := []struct {
		name    string
		stream  string
		tokens  int
		wantErr string
	}{
		{"two tokens", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n", 2, ""},
		{"empty chunks are not tokens", "data: {\"choices\":[{\"text\":\"\"}]}\n\ndata: {\"choices\":[]}\n\ndata: [DONE]\n\n", 0, ""},
		{"comments and blank lines", ": keep-alive\n\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n", 1, ""},
		{"cut short", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", 1, "without [DONE]"},
		{"malformed", "data: {nope\n\n", 0, "malformed event"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			firsts := 0
			n, err := readStream(strings.NewReader(tc.stream), func() { firsts++ })
			if n != tc.tokens || firsts != tc.tokens {
				t.Errorf("tokens %d (callbacks %d), want %d", n, firsts, tc.tokens)
			}
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestPickFollowsWeights(t *testing.T) {
	entries := []Entry{{Name: "hot", Weight: 3}, {Name: "cold", Weight: 1}}
	for _, tc := range []struct {
		u    float64
		want string
	}{{0, "hot"}, {0.74, "hot"}, {0.76, "cold"}, {0.999, "cold"}} {
		if got := pick(entries, 4, tc.u).Name; got != tc.want {
			t.Errorf("pick(%v) = %s, want %s", tc.u, got, tc.want)
		}
	}
}

// Results come in arrival order, however the requests finish, and each
// request carries its entry's Host.
func TestRunReturnsResultsInArrivalOrderWithTheEntrysHost(t *testing.T) {
	const n = 10
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		i, _ := strconv.Atoi(req.Prompt)
		// The first arrivals answer last.
		time.Sleep(time.Duration(n-i) * 20 * time.Millisecond)
		w.Header().Set("x-inference-pod", req.Prompt+"@"+r.Host)
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	res := Run(context.Background(), Options{
		Entries: []Entry{{Name: "only", URL: srv.URL, Host: "svc.test", Weight: 1}},
		Rate:    200, Duration: time.Duration(n) * 5 * time.Millisecond, Model: "m", MaxTokens: 1, Seed: 1,
		Prompt: strconv.Itoa,
	})
	if len(res) == 0 {
		t.Fatal("no results")
	}
	for i, r := range res {
		if want := strconv.Itoa(i) + "@svc.test"; !r.OK() || r.Pod != want {
			t.Errorf("result %d: pod %q (%s), want %q", i, r.Pod, r.Err, want)
		}
	}
}

// A run against a real simulator: every request streams its tokens, TTFT
// includes the simulator's time to first token, the pod that answered is
// named, and arrivals split by weight.
func TestRunAgainstTheSimulator(t *testing.T) {
	b, err := binaries.Locate()
	if err != nil {
		t.Skip(err) // make tools builds the simulator
	}
	free, err := ports.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	reg := &process.Registry{}
	defer reg.StopAll(controlplane.StopGrace)
	port := strconv.Itoa(free[0])
	sim, err := process.Start(process.Spec{Name: "sim", Path: b.Simulator, Env: []string{"POD_NAME=sim-0", "POD_NAMESPACE=test"},
		Args: []string{"--model=m", "--port=" + port, "--force-dummy-tokenizer", "--time-to-first-token=50ms", "--inter-token-latency=2ms"}}, reg)
	if err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + port
	if err := controlplane.WaitHTTP(context.Background(), sim, http.DefaultClient, url+"/health", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	res := Run(context.Background(), Options{
		Entries: []Entry{{Name: "hot", URL: url, Weight: 4}, {Name: "cold", URL: url, Weight: 1}},
		Rate:    40, Duration: 2 * time.Second, Model: "m", MaxTokens: 5, Seed: 1,
		Prompt: func(i int) string { return "hello " + strconv.Itoa(i) },
	})
	if len(res) < 40 || len(res) > 81 {
		t.Fatalf("%d results for 2 s at 40/s", len(res))
	}
	byEntry := map[string]int{}
	for _, r := range res {
		if !r.OK() {
			t.Fatalf("request failed: %+v", r)
		}
		byEntry[r.Entry]++
		if r.Tokens != 5 || r.TTFT < 50*time.Millisecond || r.Total < r.TTFT || r.Pod != "sim-0" || r.Namespace != "test" {
			t.Errorf("result %+v", r)
		}
	}
	if byEntry["hot"] < 2*byEntry["cold"] {
		t.Errorf("entries %v, want about 4:1", byEntry)
	}
}
