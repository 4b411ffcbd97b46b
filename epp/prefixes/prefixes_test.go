package prefixes

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

func text(seed string, blocks int) string {
	var b strings.Builder
	for i := 0; b.Len() < blocks*BlockChars; i++ {
		fmt.Fprintf(&b, "%s-%d ", seed, i)
	}
	return b.String()[:blocks*BlockChars]
}

// Prompts share leading hashes exactly as far as they share whole blocks,
// and the same text for another model shares none.
func TestHashesAreEqualExactlyAsFarAsPromptsShareBlocks(t *testing.T) {
	doc := text("doc", 10)
	cases := []struct {
		name          string
		model, prompt string
		want          int // leading hashes equal to those of doc+question for model "m"
	}{
		{"the same prompt", "m", doc + text("q1", 3), 13},
		{"another question after the document", "m", doc + text("q2", 3), 10},
		{"the document cut mid-block", "m", doc[:5*BlockChars+10], 5},
		{"another model", "n", doc + text("q1", 3), 0},
		{"a different first character", "m", "X" + doc[1:] + text("q1", 3), 0},
	}
	base := Hashes("m", doc+text("q1", 3))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Hashes(c.model, c.prompt)
			n := 0
			for n < len(got) && n < len(base) && got[n] == base[n] {
				n++
			}
			if n != c.want {
				t.Fatalf("%d leading hashes equal, want %d", n, c.want)
			}
		})
	}
	if got := len(Hashes("m", text("long", MaxBlocks+50))); got != MaxBlocks {
		t.Errorf("a long prompt hashes %d blocks, want at most %d", got, MaxBlocks)
	}
	if got := Hashes("m", "short"); got != nil {
		t.Errorf("a prompt shorter than a block hashes %v", got)
	}
}

// The index answers for a pod's blocks exactly, keeps the most recently
// used Capacity of them, and its summary changes version only with them.
func TestTheIndexKeepsEachPodsRecentBlocks(t *testing.T) {
	x := NewIndex()
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	doc := Hashes("m", text("doc", 50))
	x.Record(a, doc)
	if got := x.Match(a, Hashes("m", text("doc", 50)+text("q", 4))); got != 50 {
		t.Errorf("pod a matches %d blocks of the document and a question, want 50", got)
	}
	if got := x.Match(b, doc); got != 0 {
		t.Errorf("pod b, sent nothing, matches %d blocks", got)
	}
	s1, v1 := x.Summary(a)
	x.Record(a, doc[:10])
	if s2, v2 := x.Summary(a); v2 != v1 || s2 != s1 {
		t.Errorf("recording blocks the pod holds changed its summary (version %d → %d)", v1, v2)
	}
	// Fill the pod with 1,500 blocks of other prompts, using the
	// document's first 5 blocks again after 1,000: those stay, the rest of
	// the document goes.
	for i := range 30 {
		if i == 20 {
			x.Record(a, doc[:5])
		}
		x.Record(a, Hashes("m", text(fmt.Sprint("other", i), 50)))
	}
	if got := x.Match(a, doc); got != 5 {
		t.Errorf("after 1,500 other blocks pod a matches %d blocks of the document, want the 5 used again", got)
	}
	if _, v3 := x.Summary(a); v3 == v1 {
		t.Error("new blocks left the summary's version unchanged")
	}
	x.Retain(func(p types.NamespacedName) bool { return p == b })
	if s, _ := x.Summary(a); s != nil {
		t.Error("a pod that went away still has a summary")
	}
}

// Held counts the leading blocks each held by some pod, through records,
// evictions and pods going away: no pod's Match exceeds it.
func TestHeldBoundsEveryPodsMatch(t *testing.T) {
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	system := text("system", 8)
	doc := Hashes("m", system+text("doc", 12))
	// evictAll sends pod more blocks of other prompts than it keeps.
	evictAll := func(x *Index, pod types.NamespacedName) {
		for i := range Capacity/64 + 1 {
			x.Record(pod, Hashes("m", text(fmt.Sprint("other", i), 64)))
		}
	}
	cases := []struct {
		name   string
		record func(x *Index)
		want   int
	}{
		{"nothing recorded", func(*Index) {}, 0},
		{"one pod holds the whole prompt", func(x *Index) { x.Record(a, doc) }, 20},
		{"pods hold its system prompt and part of the rest", func(x *Index) {
			x.Record(a, doc[:8])
			x.Record(b, doc[:14])
		}, 14},
		{"blocks held by different pods count as held", func(x *Index) {
			x.Record(a, doc[:3])
			x.Record(b, doc[3:])
		}, 20},
		{"a pod's evicted blocks are no longer held", func(x *Index) {
			x.Record(a, doc)
			evictAll(x, a)
		}, 0},
		{"another pod still holds a block one pod evicted", func(x *Index) {
			x.Record(a, doc)
			x.Record(b, doc[:6])
			evictAll(x, a)
		}, 6},
		{"a pod gone no longer holds anything", func(x *Index) {
			x.Record(a, doc)
			x.Record(b, doc[:4])
			x.Retain(func(p types.NamespacedName) bool { return p == b })
		}, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := NewIndex()
			c.record(x)
			if got := x.Held(doc); got != c.want {
				t.Errorf("Held = %d, want %d", got, c.want)
			}
			for _, p := range []types.NamespacedName{a, b} {
				if m := x.Match(p, doc); m > c.want {
					t.Errorf("pod %s matches %d blocks, more than Held's %d", p.Name, m, c.want)
				}
			}
		})
	}
	var none *Index
	if got := none.Held(doc); got != 0 {
		t.Errorf("a nil index holds %d blocks", got)
	}
}

// A summary carries the pod's blocks across the wire, and a block the pod
// does not hold matches with about the stated probability at full
// capacity.
func TestASummaryMatchesHeldBlocksAndFewOthers(t *testing.T) {
	x := NewIndex()
	pod := types.NamespacedName{Namespace: "ns", Name: "p"}
	r := rand.New(rand.NewPCG(1, 2))
	held := make([]uint64, Capacity)
	for i := range held {
		held[i] = r.Uint64()
	}
	x.Record(pod, held)
	s, _ := x.Summary(pod)
	got, ok := FromBytes(s.Bytes())
	if !ok {
		t.Fatal("a summary's own bytes are not a summary")
	}
	if n := got.Match(held); n != len(held) {
		t.Fatalf("the decoded summary matches %d of the %d held blocks", n, len(held))
	}
	const trials = 100000
	fp := 0
	for range trials {
		if got.Match([]uint64{r.Uint64()}) == 1 {
			fp++
		}
	}
	if rate := float64(fp) / trials; rate > 0.035 {
		t.Errorf("false-positive rate %.2f%% at %d blocks, the package states about 2.4%%", 100*rate, Capacity)
	} else {
		t.Logf("false-positive rate %.2f%% at %d blocks (fill %.2f)", 100*rate, Capacity, got.FillRatio())
	}
	for _, b := range [][]byte{nil, make([]byte, SummaryBytes-1), make([]byte, 2*SummaryBytes)} {
		if _, ok := FromBytes(b); ok {
			t.Errorf("%d bytes decoded as a summary", len(b))
		}
	}
}
