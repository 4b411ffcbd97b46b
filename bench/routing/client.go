package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// result is one request as the client saw it.
type result struct {
	At    time.Duration `json:"at_ms"`
	Entry int           `json:"entry"`
	// Prefix is the index of the prompt's shared prefix, -1 for none.
	Prefix int `json:"prefix"`
	// Served is the cluster of the pod that answered, -1 when none did.
	Served int `json:"served"`
	// Pod is the simulator's name for the pod that answered
	// (X-Inference-Pod), empty when none did.
	Pod    string        `json:"pod,omitempty"`
	TTFT   time.Duration `json:"ttft_ms"`
	Total  time.Duration `json:"total_ms"`
	Tokens int           `json:"tokens"`
	// PromptTokens and CachedTokens are the simulator's usage report: the
	// prompt's tokens and those found in its prefix cache.
	PromptTokens int    `json:"prompt_tokens"`
	CachedTokens int    `json:"cached_tokens"`
	Attempts     int    `json:"attempts"`
	Err          string `json:"err,omitempty"`
	// SendLag is how late the request left after its arrival time.
	SendLag time.Duration `json:"send_lag_ms"`
}

func (r result) ok() bool { return r.Err == "" }

// loadClient sends completions and reads their SSE streams.
type loadClient struct {
	http      *http.Client
	maxTokens int
	timeout   time.Duration
	// podCluster maps the simulator's x-inference-pod header to the pod's
	// cluster.
	podCluster map[string]int
	// links carries attempts that leave for another cluster over the link
	// between the two; nil: every address is reached directly.
	links linker
}

// linker reaches addresses in other clusters as a client standing in one
// cluster would: over the link between the two.
type linker interface {
	// reach returns the URL by which a connection from cluster from reaches
	// url, an address in cluster to (from ≠ to).
	reach(from, to int, url string) (string, error)
}

func newLoadClient(maxTokens int, timeout time.Duration, podCluster map[string]int, links linker) *loadClient {
	return &loadClient{
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true,
			IdleConnTimeout: 30 * time.Second}},
		maxTokens: maxTokens, timeout: timeout, podCluster: podCluster, links: links,
	}
}

// errNoRoute is a request the router had nowhere to send.
var errNoRoute = errors.New("no route")

// do sends arrival a through router r. TTFT and Total run from the arrival
// (so they include a retrying load balancer's backoff) to the first
// streamed token and to the end of the stream.
//
// The client stands in the cluster the request enters. The fabric delays
// connections by their source address, and the client's (127.0.0.1) is in
// no cluster, so an attempt the router sends to another cluster reaches it
// through c.links, over the link between the two clusters (linked):
// SkyServe's requests go to its load balancer's region, pass its proxy
// (skyProxy) and go from there to the gateway it picks; the oracle's go
// straight to the pod. Requests that enter their own gateway
// (cluster-local GIE, fleetinfer) cross, if at all, from gateway to
// gateway, which the fabric carries itself.
func (c *loadClient) do(ctx context.Context, r router, a arrival, start time.Time) (res result) {
	res = result{At: a.At, Entry: a.Entry, Prefix: a.Prefix, Served: -1}
	defer func() {
		if res.Total == 0 {
			res.Total = time.Since(start) - res.At
		}
	}()
	body, _ := json.Marshal(map[string]any{"model": "llama", "prompt": a.Prompt, "max_tokens": c.maxTokens,
		"stream": true, "ignore_eos": true, "stream_options": map[string]any{"include_usage": true}})
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	// from is where an attempt leaves: where the request entered, and for a
	// retry the load balancer that retries it.
	from := a.Entry
	for res.Attempts < r.attempts() {
		if res.Attempts > 0 {
			select {
			case <-time.After(r.backoff(res.Attempts)):
			case <-ctx.Done():
				res.Err = ctx.Err().Error()
				return res
			}
		}
		res.Attempts++
		t, ok := r.route(a)
		if !ok {
			res.Err = errNoRoute.Error()
			return res
		}
		linked, err := c.linked(from, t)
		if err != nil {
			r.done(t)
			res.Err = err.Error()
			return res
		}
		if t.via >= 0 {
			from = t.via
		}
		retry, err := c.attempt(ctx, linked, body, start, &res)
		r.done(t)
		if err == nil {
			return res
		}
		res.Err = err.Error()
		if !retry {
			return res
		}
	}
	return res
}

// linked is t with the URLs an attempt leaving cluster from connects to:
// the load balancer it passes, if any, reached from from, and t's own URL
// reached from the load balancer's cluster, or from from without one.
func (c *loadClient) linked(from int, t target) (target, error) {
	hop := func(a, b int, url string) (string, error) {
		if a == b || c.links == nil {
			return url, nil
		}
		return c.links.reach(a, b, url)
	}
	var err error
	if t.via >= 0 {
		if t.lb, err = hop(from, t.via, t.lb); err != nil {
			return t, err
		}
		from = t.via
	}
	t.URL, err = hop(from, t.Cluster, t.URL)
	return t, err
}

// attempt sends one try; retry reports a connection error before any
// response, the only kind a load balancer may retry.
func (c *loadClient) attempt(ctx context.Context, t target, body []byte, start time.Time, res *result) (retry bool, err error) {
	base := t.URL
	if t.lb != "" {
		base = t.lb
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	if t.lb != "" {
		req.Header.Set(upstreamHeader, t.URL)
	}
	if t.Host != "" {
		req.Host = t.Host
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return true, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		// The load balancer could not reach the gateway: it retries.
		retry := t.lb != "" && resp.Header.Get(connectErrorHeader) != ""
		return retry, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	res.Pod = resp.Header.Get("X-Inference-Pod")
	if cl, ok := c.podCluster[res.Pod]; ok {
		res.Served = cl
	}
	n, u, err := readStream(resp.Body, func() { res.TTFT = time.Since(start) - res.At })
	res.Tokens, res.PromptTokens, res.CachedTokens = n, u.PromptTokens, u.Details.CachedTokens
	res.Total = time.Since(start) - res.At
	// The stream ends right after [DONE]: reading it to its end lets the
	// connection serve the next request, as an HTTP client's pool does,
	// instead of a new connection per request.
	_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
	if err == nil && n == 0 {
		err = errors.New("no tokens")
	}
	return false, err
}

// usage is the usage report of a stream's last event (stream_options
// include_usage).
type usage struct {
	PromptTokens int `json:"prompt_tokens"`
	Details      struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// readStream reads an OpenAI completions SSE stream, calling first at the
// first event that carries text, and returns the number of such events and
// the usage reported.
func readStream(r io.Reader, first func()) (int, usage, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	var u usage
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			return n, u, nil
		}
		var ev struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return n, u, fmt.Errorf("malformed event: %w", err)
		}
		if ev.Usage != nil {
			u = *ev.Usage
		}
		if len(ev.Choices) == 0 || ev.Choices[0].Text == "" {
			continue
		}
		if n == 0 {
			first()
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return n, u, err
	}
	return n, u, errors.New("stream ended without [DONE]")
}

// runLoad sends the arrivals open-loop from start (each at its time,
// whatever is in flight, at most maxInFlight at once: beyond that an
// arrival is recorded as refused by the client) and returns their results
// in arrival order once every request has ended.
func (c *loadClient) runLoad(ctx context.Context, r router, arrivals []arrival, maxInFlight int, start time.Time) []result {
	out := make([]result, len(arrivals))
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	for i, a := range arrivals {
		select {
		case <-time.After(time.Until(start.Add(a.At))):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			out[i] = result{At: a.At, Entry: a.Entry, Served: -1, Err: "not sent: " + ctx.Err().Error()}
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			out[i] = result{At: a.At, Entry: a.Entry, Served: -1, Err: "client: too many requests in flight"}
			continue
		}
		lag := time.Since(start.Add(a.At))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = c.do(ctx, r, a, start)
			out[i].SendLag = lag
		}()
	}
	wg.Wait()
	return out
}
