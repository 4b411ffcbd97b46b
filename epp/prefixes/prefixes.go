// Package prefixes tracks which prompt prefixes each model server is
// believed to hold in its KV cache, and summarizes that for other clusters.
//
// A prompt is cut into blocks of BlockChars characters, and each block gets
// a hash chained over every block before it, so that equal hashes mean equal
// prompts up to that block (as vLLM's prefix cache keys its blocks). A
// picker records the blocks of each request it sends to one of its own pods
// (an approximation, as GIE's approximate prefix index is: the pod's cache
// may have evicted them since), keeping the most recent Capacity blocks per
// pod; it answers for its own pods exactly from that record, and publishes
// for other clusters a Bloom filter of it (Summary), of fixed size, which a
// remote picker matches a prompt's blocks against.
//
// Sizes, per pod: the record holds at most Capacity (1,024) blocks, about
// 115 KiB with its bookkeeping (92 KiB without the per-block holder counts
// that Held reads), in the picker that owns the pod only; the summary is
// SummaryBytes (1 KiB) in every picker of the fleet, 1 MiB per 1,000
// remote pods. With 1,024 blocks in 8,192 bits and 4 hash functions
// a block the pod does not hold matches with probability about 2.4% (and a
// run of matches stops at the first block that does not, so a prompt's
// match is overstated by a block with about that probability).
package prefixes

import (
	"container/list"
	"encoding/binary"
	"math/bits"
	"sync"

	"github.com/cespare/xxhash/v2"
	"k8s.io/apimachinery/pkg/types"
)

const (
	// BlockChars is a block's size in prompt characters: 16 tokens at the
	// 4 characters a token GIE assumes, vLLM's default block.
	BlockChars = 64
	// MaxBlocks bounds the blocks hashed of one prompt (16 KiB of text).
	MaxBlocks = 256
	// Capacity is how many blocks the record keeps per pod.
	Capacity = 1024
	// SummaryBytes is a summary's size; SummaryHashes the bits set per
	// block.
	SummaryBytes  = 1024
	SummaryHashes = 4
)

// TokensPerBlock is a block's size in tokens, for estimates of prefill.
const TokensPerBlock = BlockChars / 4

// Hashes returns the chained hashes of prompt's whole blocks for model, at
// most MaxBlocks. The model seeds the chain: equal text for another model
// is another cache.
func Hashes(model, prompt string) []uint64 {
	n := min(len(prompt)/BlockChars, MaxBlocks)
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	prev := xxhash.Sum64String(model)
	var d xxhash.Digest
	var seed [8]byte
	for i := range n {
		d.Reset()
		binary.LittleEndian.PutUint64(seed[:], prev)
		_, _ = d.Write(seed[:])
		_, _ = d.WriteString(prompt[i*BlockChars : (i+1)*BlockChars])
		prev = d.Sum64()
		out[i] = prev
	}
	return out
}

// Index is a picker's record of the blocks it sent to each of its pods. It
// is safe for concurrent use: a pick matches its prompt against every local
// pod (Match, under the read lock, concurrently with other picks' matches)
// and records it once, for its target.
type Index struct {
	mu   sync.RWMutex
	pods map[types.NamespacedName]*podRecord
	// holders counts the pods holding each block, so that a prompt no pod
	// holds (most prompts but a shared system prompt's) is told apart with
	// one lookup instead of one per pod (Held).
	holders map[uint64]int32
}

// podRecord holds a pod's most recent blocks, least recent at the back.
type podRecord struct {
	order  *list.List
	blocks map[uint64]*list.Element
	// version counts changes; summary is built for summarized.
	version, summarized uint64
	summary             *Summary
}

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{pods: map[types.NamespacedName]*podRecord{}, holders: map[uint64]int32{}}
}

// Record notes that pod was sent a prompt of these block hashes.
func (x *Index) Record(pod types.NamespacedName, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.pods[pod]
	if r == nil {
		r = &podRecord{order: list.New(), blocks: map[uint64]*list.Element{}}
		x.pods[pod] = r
	}
	for _, h := range hashes {
		if e, ok := r.blocks[h]; ok {
			r.order.MoveToFront(e)
			continue
		}
		r.blocks[h] = r.order.PushFront(h)
		x.holders[h]++
		r.version++
		if r.order.Len() > Capacity {
			last := r.order.Back()
			x.release(last.Value.(uint64))
			delete(r.blocks, last.Value.(uint64))
			r.order.Remove(last)
		}
	}
}

// release notes that a pod no longer holds h.
func (x *Index) release(h uint64) {
	if x.holders[h]--; x.holders[h] <= 0 {
		delete(x.holders, h)
	}
}

// Held returns how many leading blocks of hashes are each held by some pod:
// no pod's Match is longer. None in a nil index.
func (x *Index) Held(hashes []uint64) int {
	if x == nil {
		return 0
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	for i, h := range hashes {
		if x.holders[h] == 0 {
			return i
		}
	}
	return len(hashes)
}

// Match returns how many leading blocks of hashes pod holds; none in a nil
// index.
func (x *Index) Match(pod types.NamespacedName, hashes []uint64) int {
	if x == nil {
		return 0
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.pods[pod]
	if r == nil {
		return 0
	}
	for i, h := range hashes {
		if _, ok := r.blocks[h]; !ok {
			return i
		}
	}
	return len(hashes)
}

// Summary returns pod's summary and its version, which changes when the
// summary does; nil before anything was recorded for pod.
func (x *Index) Summary(pod types.NamespacedName) (*Summary, uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.pods[pod]
	if r == nil {
		return nil, 0
	}
	if r.summary == nil || r.summarized != r.version {
		s := NewSummary()
		for h := range r.blocks {
			s.add(h)
		}
		r.summary, r.summarized = s, r.version
	}
	return r.summary, r.version
}

// Retain forgets the pods keep does not report: pods that went away.
func (x *Index) Retain(keep func(types.NamespacedName) bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for pod, r := range x.pods {
		if !keep(pod) {
			for h := range r.blocks {
				x.release(h)
			}
			delete(x.pods, pod)
		}
	}
}

// Summary is a Bloom filter of a pod's blocks. It is immutable once built.
type Summary struct {
	words []uint64
}

// NewSummary returns an empty summary of SummaryBytes.
func NewSummary() *Summary {
	return &Summary{words: make([]uint64, SummaryBytes/8)}
}

// FromBytes returns the summary b encodes, false when b is not one (another
// size).
func FromBytes(b []byte) (*Summary, bool) {
	if len(b) != SummaryBytes {
		return nil, false
	}
	s := NewSummary()
	for i := range s.words {
		s.words[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return s, true
}

// Bytes encodes s.
func (s *Summary) Bytes() []byte {
	out := make([]byte, 0, SummaryBytes)
	for _, w := range s.words {
		out = binary.LittleEndian.AppendUint64(out, w)
	}
	return out
}

// Match returns how many leading blocks of hashes s holds, or seems to.
func (s *Summary) Match(hashes []uint64) int {
	for i, h := range hashes {
		if !s.has(h) {
			return i
		}
	}
	return len(hashes)
}

// FillRatio is the share of bits set: 1 − FillRatio^SummaryHashes is
// near the chance that a block the pod does not hold does not match.
func (s *Summary) FillRatio() float64 {
	n := 0
	for _, w := range s.words {
		n += bits.OnesCount64(w)
	}
	return float64(n) / float64(64*len(s.words))
}

// positions are the bits of h: double hashing over h's halves.
func (s *Summary) positions(h uint64, f func(word int, bit uint64) bool) bool {
	m := uint64(64 * len(s.words))
	a, b := h, h>>32|1
	for i := range uint64(SummaryHashes) {
		p := (a + i*b) % m
		if !f(int(p/64), 1<<(p%64)) {
			return false
		}
	}
	return true
}

func (s *Summary) add(h uint64) {
	s.positions(h, func(w int, bit uint64) bool { s.words[w] |= bit; return true })
}

func (s *Summary) has(h uint64) bool {
	return s.positions(h, func(w int, bit uint64) bool { return s.words[w]&bit != 0 })
}
