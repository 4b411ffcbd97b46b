package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// scenario is one workload and fleet shape, run once per policy.
type scenario struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Reps is how many times each policy runs it.
	Reps int `json:"repetitions"`
	// Replicas and batch capacity (the simulator's --max-num-seqs) per
	// cluster, in the fleet's spoke order.
	Replicas   []int32 `json:"replicas"`
	MaxNumSeqs []int   `json:"max_num_seqs"`
	// KVBlocks is every simulator's KV cache in blocks of 16 tokens.
	KVBlocks int `json:"kv_cache_blocks"`
	// Entry is each cluster's share of arrivals. EntryPhases, when set,
	// replace it in equal parts of the run, in turn: a hot spot that moves.
	Entry       []float64   `json:"entry_share"`
	EntryPhases [][]float64 `json:"entry_phases,omitempty"`
	// Rate is arrivals per second (Poisson).
	Rate float64 `json:"rate_per_s"`
	// Prefixes > 0 gives every prompt one of that many long shared
	// prefixes (documents or system prompts), chosen uniformly.
	Prefixes    int `json:"prefixes,omitempty"`
	PrefixWords int `json:"prefix_words,omitempty"`
	// PrefixHome says that prefix p is cached in cluster p mod 3 before
	// the run (warm), while requests for it enter every cluster.
	PrefixHome bool `json:"prefix_home,omitempty"`
	// PromptWords is the unique part of every prompt.
	PromptWords int `json:"prompt_words"`
	// Lost is the index of the cluster lost halfway through the run, -1
	// for none.
	Lost int `json:"lost"`
	// SlowLink, when set, slows one link halfway through the run.
	SlowLink *slowLink `json:"slow_link,omitempty"`
	// Flat runs the scenario on flat pod networks, fleetinfer's pickers
	// federating in Endpoint mode: a crossing request goes from the entry
	// cluster's gateway straight to the remote pod, over the link.
	Flat bool `json:"flat,omitempty"`
}

// mode is how fleetinfer's pickers reach the other clusters' pods.
func (s scenario) mode() fleetv1alpha1.FederationMode {
	if s.Flat {
		return fleetv1alpha1.FederationEndpoint
	}
	return fleetv1alpha1.FederationParent
}

// podNetwork is the fleet's pod network for the scenario.
func (s scenario) podNetwork() wan.PodNetwork {
	if s.Flat {
		return wan.Flat
	}
	return wan.Isolated
}

// slowLink is a link between clusters A and B whose round trip goes from
// From to To halfway through a run.
type slowLink struct {
	A, B int
	From time.Duration `json:"from_ns"`
	To   time.Duration `json:"to_ns"`
}

// simLatency is every simulator's latency model: prefill time per prompt
// token not in its prefix cache (one token per word with the simulator's
// dummy tokenizer) plus an overhead, a fixed time per output token, and
// both slowed by up to 2× as the batch fills (--time-factor-under-load);
// requests beyond --max-num-seqs wait. The KV cache (--enable-kvcache)
// gives prefix-cache hits and a real vllm:kv_cache_usage_perc.
const simLatency = "--enable-kvcache --prefill-overhead=20ms --prefill-time-per-token=400us " +
	"--inter-token-latency=20ms --time-factor-under-load=2"

// simArgs are the simulator flags of cluster i's pods.
func (s scenario) simArgs(i int) string {
	return fmt.Sprintf("%s --max-num-seqs=%d --kv-cache-size=%d", simLatency, s.MaxNumSeqs[i], s.KVBlocks)
}

// arrival is one request of a workload.
type arrival struct {
	At time.Duration
	// Entry is the cluster whose gateway the request enters.
	Entry  int
	Prompt string
	// Prefix is the index of the prompt's shared prefix, -1 for none.
	Prefix int
}

// arrivals draws the scenario's requests for a run of d: Poisson arrivals,
// entries by share, prompts from words seeded by seed. Every policy gets the
// same arrivals; salt (the policy's name) only changes the words, so that
// what one policy left in the simulators' prefix caches cannot help the
// next. After a loss, arrivals that would enter the lost cluster enter the
// others in proportion to their shares, as a global load balancer or DNS
// health check in front of the gateways would steer them.
func (s scenario) arrivals(d time.Duration, seed uint64, salt string) []arrival {
	r := rand.New(rand.NewPCG(seed, 1))
	var out []arrival
	at := time.Duration(0)
	for i := 0; ; i++ {
		at += time.Duration(r.ExpFloat64() / s.Rate * float64(time.Second))
		if at >= d {
			return out
		}
		shares := s.Entry
		if n := len(s.EntryPhases); n > 0 {
			shares = s.EntryPhases[min(int(int64(at)*int64(n)/int64(d)), n-1)]
		}
		if s.Lost >= 0 && at >= d/2 {
			shares = append([]float64(nil), s.Entry...)
			shares[s.Lost] = 0
		}
		a := arrival{At: at, Entry: pickShare(shares, r.Float64()), Prefix: -1}
		var b strings.Builder
		if s.Prefixes > 0 {
			a.Prefix = r.IntN(s.Prefixes)
			b.WriteString(s.prefix(salt, a.Prefix))
		}
		words(&b, fmt.Sprintf("%s-req%d", salt, i), s.PromptWords)
		a.Prompt = b.String()
		out = append(out, a)
	}
}

// prefix is the text of shared prefix p under salt.
func (s scenario) prefix(salt string, p int) string {
	var b strings.Builder
	words(&b, fmt.Sprintf("%s-doc%d", salt, p), s.PrefixWords)
	return b.String()
}

// pickShare maps u in [0,1) to an index with probability proportional to
// its share.
func pickShare(shares []float64, u float64) int {
	total := 0.0
	for _, s := range shares {
		total += s
	}
	acc, last := 0.0, 0
	for i, s := range shares {
		if s <= 0 {
			continue
		}
		acc += s / total
		last = i
		if u < acc {
			return i
		}
	}
	return last
}

// words writes n space-separated words derived from key: the simulator's
// dummy tokenizer counts one token per word, so n is the prompt's length in
// tokens, and equal keys give equal text (a shared prefix).
func words(b *strings.Builder, key string, n int) {
	r := rand.New(rand.NewPCG(hash(key), 2))
	for range n {
		fmt.Fprintf(b, "w%x ", r.Uint32()&0xfffff)
	}
}

func hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}
