// Package loadgen sends OpenAI-style streaming completions to inference
// gateways at a fixed average rate, with each request entering one of
// several gateways by weight, and records what a client sees: time to first
// token, total time, tokens, and which model-server pod answered (the
// simulator's x-inference-pod header). Load is bounded in count, time and
// requests in flight, and stops by itself.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Entry is a gateway requests enter through.
type Entry struct {
	// Name labels the results (e.g. the cluster's name).
	Name string
	// URL is the service's base URL at that gateway; completions go to
	// URL + "/v1/completions".
	URL string
	// Host, when set, is the requests' Host header: the hostname of the
	// service's HTTPRoute, for a gateway that serves several.
	Host string
	// Weight is the entry's share of arrivals, relative to the others.
	Weight float64
}

// Options configure a run.
type Options struct {
	Entries []Entry
	// Rate is the average number of arrivals per second (Poisson).
	Rate float64
	// Duration bounds the run; arrivals stop when it ends.
	Duration time.Duration
	// MaxInFlight bounds outstanding requests; an arrival beyond it is
	// recorded as dropped by the client, not sent.
	MaxInFlight int
	// Timeout bounds one request.
	Timeout time.Duration
	Model   string
	// MaxTokens is each completion's length: requests set vLLM's ignore_eos
	// so that every completion streams exactly this many tokens and the
	// load does not depend on what the model happens to generate.
	MaxTokens int
	// Prompt returns the prompt of the i-th request.
	Prompt func(i int) string
	// Seed makes the arrivals and entries repeatable.
	Seed uint64
	// Label is copied into every result (e.g. the phase of a demo).
	Label string
}

// Result is one request as the client saw it.
type Result struct {
	Label string
	Entry string
	Start time.Time
	// TTFT is the time to the first streamed token, Total to the end of
	// the stream; both zero when the request failed before any token.
	TTFT, Total time.Duration
	Tokens      int
	Status      int
	// Pod and Namespace name the model server that answered.
	Pod, Namespace string
	Err            string
}

// OK reports whether the request completed with at least one token.
func (r Result) OK() bool { return r.Err == "" && r.Status == http.StatusOK && r.Tokens > 0 }

// Run sends the load and returns every arrival's result in arrival order.
func Run(ctx context.Context, opts Options) []Result {
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 256
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	rng := rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))
	total := 0.0
	for _, e := range opts.Entries {
		total += e.Weight
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: opts.MaxInFlight}}
	defer client.CloseIdleConnections()

	runCtx, cancel := context.WithTimeout(ctx, opts.Duration)
	defer cancel()
	limit := int(opts.Rate*opts.Duration.Seconds()) + 1
	// results[i] is the i-th arrival's, written by whoever finishes it.
	results := make([]Result, limit)
	arrivals := 0
	var wg sync.WaitGroup
	slots := make(chan struct{}, opts.MaxInFlight)
	next := time.Now()
	for ; arrivals < limit; arrivals++ {
		next = next.Add(time.Duration(rng.ExpFloat64() / opts.Rate * float64(time.Second)))
		select {
		case <-runCtx.Done():
		case <-time.After(time.Until(next)):
		}
		if runCtx.Err() != nil {
			break
		}
		e := pick(opts.Entries, total, rng.Float64())
		r := &results[arrivals]
		*r = Result{Label: opts.Label, Entry: e.Name, Start: time.Now()}
		select {
		case slots <- struct{}{}:
		default:
			r.Err = "dropped by the client: too many requests in flight"
			continue
		}
		prompt := opts.Prompt(arrivals)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			// Requests already sent finish even when the run's time is up.
			reqCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.Timeout)
			defer cancel()
			*r = Send(reqCtx, client, e, opts.Model, prompt, opts.MaxTokens)
			r.Label = opts.Label
		}()
	}
	wg.Wait()
	return results[:arrivals]
}

func pick(entries []Entry, total, u float64) Entry {
	u *= total
	for _, e := range entries {
		if u < e.Weight {
			return e
		}
		u -= e.Weight
	}
	return entries[len(entries)-1]
}

// Send sends one streaming completion through entry e, reads its
// server-sent events and says what the client saw.
func Send(ctx context.Context, client *http.Client, e Entry, model, prompt string, maxTokens int) Result {
	r := Result{Entry: e.Name, Start: time.Now()}
	complete(ctx, client, e, model, prompt, maxTokens, &r)
	return r
}

// complete sends one streaming completion and reads its server-sent events.
func complete(ctx context.Context, client *http.Client, e Entry, model, prompt string, maxTokens int, r *Result) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true, "stream": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(e.URL, "/")+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		r.Err = err.Error()
		return
	}
	req.Host = e.Host
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		r.Err = err.Error()
		return
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	r.Pod, r.Namespace = resp.Header.Get("x-inference-pod"), resp.Header.Get("x-inference-namespace")
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		r.Err = fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(msg))
		return
	}
	tokens, err := readStream(resp.Body, func() {
		if r.TTFT == 0 {
			r.TTFT = time.Since(r.Start)
		}
	})
	r.Tokens, r.Total = tokens, time.Since(r.Start)
	if err != nil {
		r.Err = err.Error()
	}
}

// readStream counts the completion chunks of an SSE stream that carry text,
// calling first on each; it ends at "data: [DONE]".
func readStream(body io.Reader, first func()) (int, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	tokens := 0
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return tokens, nil
		}
		var chunk struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			return tokens, fmt.Errorf("malformed event %q: %w", data, err)
		}
		if len(chunk.Choices) > 0 && chunk.Choices[0].Text != "" {
			first()
			tokens++
		}
	}
	if err := sc.Err(); err != nil {
		return tokens, err
	}
	return tokens, fmt.Errorf("stream ended without [DONE] after %d tokens", tokens)
}
