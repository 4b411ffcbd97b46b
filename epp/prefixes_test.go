package epp

import (
	"strings"
	"testing"

	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/prefixes"
)

// Through the whole request path, with prefillPerToken set: a prompt whose
// prefix a remote pod holds (its published summary) crosses to it while the
// local pod would prefill it all; once this picker has sent a prompt with
// that prefix to its own pod, the next one stays, and a prompt cached
// nowhere stays too. The round trip is testRTT (400 ms); a 16 KiB document
// prefills in 256 blocks × 16 tokens × 400 µs = 1.6 s.
func TestAPromptGoesWhereItsPrefixIsCached(t *testing.T) {
	doc := strings.Repeat("a long shared document ", 720)[:256*prefixes.BlockChars]
	other := strings.Repeat("another document entirely ", 640)[:256*prefixes.BlockChars]
	r := endpoint("r@west", "127.12.0.1:8000", 0, west)
	west := &fakeRemote{eps: []fwkdl.Endpoint{r}, prefixes: map[string]*prefixes.Summary{}}
	westHolds := func(docs ...string) func() {
		return func() {
			x := prefixes.NewIndex()
			for _, d := range docs {
				x.Record(r.GetMetadata().NamespacedName, prefixes.Hashes("llama", d))
			}
			west.prefixes["r@west"], _ = x.Summary(r.GetMetadata().NamespacedName)
		}
	}
	config := strings.Replace(testConfig, "- type: cross-cluster-filter\n",
		"- type: cross-cluster-filter\n  parameters: {prefillPerToken: 400us}\n", 1)
	h := newHarnessConfig(t, []fwkdl.Endpoint{endpoint("a", "127.11.0.1:8000", 0, nil)}, west, config)
	for _, step := range []struct {
		name   string
		before func()
		prompt string
		want   string
	}{
		{"cached only in west: crosses", westHolds(doc), doc + "first question", "127.12.0.1:8000"},
		{"cached nowhere: stays (and is now cached here)", nil, other + "first question", "127.11.0.1:8000"},
		{"cached here and in west: stays", westHolds(doc, other), other + "second question", "127.11.0.1:8000"},
		{"still only in west: crosses", nil, doc + "second question", "127.12.0.1:8000"},
		{"a prompt shorter than a block: the round trip decides", nil, "hello", "127.11.0.1:8000"},
	} {
		if step.before != nil {
			step.before()
		}
		if got := h.request(t, completion(step.prompt), 1024, nil); got.dest != step.want {
			t.Fatalf("%s: went to %s, want %s", step.name, got.dest, step.want)
		}
	}
}
