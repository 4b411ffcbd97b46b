package federation

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
)

// federatedPair is a west publisher and an east subscriber that read the
// same directory, which lists both.
type federatedPair struct {
	west, east *cluster
	store      *Store
	dirPath    string
}

func newFederatedPair(t *testing.T) *federatedPair {
	t.Helper()
	ca, err := federationtest.NewCA("fleet")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "peers.yaml")
	dir := &DirectoryFile{Path: path, Interval: 20 * time.Millisecond, Log: logr.Discard()}
	writeDirectoryFile(t, path)
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	p := &federatedPair{west: newCluster(t, ca, "west", dir), east: newCluster(t, ca, "east", dir), dirPath: path}
	writeDirectoryFile(t, path, p.peers()...)
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	p.store = subscribe(t, "east", p.east.creds, dir)
	return p
}

func (p *federatedPair) peers() []fleetv1alpha1.Peer {
	return []fleetv1alpha1.Peer{
		{Cluster: "east", FederationAddress: p.east.addr, Identity: p.east.identity},
		{Cluster: "west", FederationAddress: p.west.addr, Identity: p.west.identity},
	}
}

// One pod with 65 labels, one with a 300-character adapter name and 5,000
// endpoints in all: the publisher leaves out the first, the adapter name,
// and the endpoints past the limit, and the rest federate.
func TestPublisherWithholdsWhatBreaksTheSharedLimitsAndTheRestFederates(t *testing.T) {
	p := newFederatedPair(t)
	labelled := localPod("labelled", "127.12.0.1", 0)
	for i := range maxLabels + 1 {
		labelled.GetMetadata().Labels[fmt.Sprintf("label-%d", i)] = "v"
	}
	lora := localPod("lora", "127.12.0.2", 0)
	m := lora.GetMetrics().Clone()
	m.MaxActiveModels, m.ActiveModels = 4, map[string]int{"sql": 1, strings.Repeat("a", 300): 1}
	lora.UpdateMetrics(m)
	eps := []fwkdl.Endpoint{labelled, lora}
	for i := range 5000 - len(eps) {
		eps = append(eps, localPod(fmt.Sprintf("pod-%d", i), fmt.Sprintf("127.12.%d.%d", 1+i/250, 1+i%250), 0))
	}
	byLabels := testutil.ToFloat64(endpointsWithheld.WithLabelValues("labels"))
	byCount := testutil.ToFloat64(endpointsWithheld.WithLabelValues("endpoint-count"))
	p.west.local.set(eps...)
	waitFor(t, "west's endpoints within the limits mirrored", func() error {
		if n := p.store.Count()["west"]; n != DefaultLimits.MaxEndpoints {
			return fmt.Errorf("%d endpoints of west, want %d", n, DefaultLimits.MaxEndpoints)
		}
		return nil
	})
	got := remote(p.store)
	if _, ok := got["labelled-rank-0@west"]; ok {
		t.Error("the pod with 65 labels federates")
	}
	if ep, ok := got["lora-rank-0@west"]; !ok || len(ep.GetMetrics().ActiveModels) != 1 || ep.GetMetrics().ActiveModels["sql"] != 1 {
		t.Errorf("the LoRA pod federates as %v, want with its sql adapter only", ep)
	}
	if d := testutil.ToFloat64(endpointsWithheld.WithLabelValues("labels")) - byLabels; d != 1 {
		t.Errorf("%v endpoints withheld for their labels, want 1", d)
	}
	if d := testutil.ToFloat64(endpointsWithheld.WithLabelValues("endpoint-count")) - byCount; d != float64(5000-1-DefaultLimits.MaxEndpoints) {
		t.Errorf("%v endpoints withheld past the count, want %d", d, 5000-1-DefaultLimits.MaxEndpoints)
	}
}

func TestPublisherKeepsWhatItPublishesWithinOneMessage(t *testing.T) {
	limits := Limits{MaxMessageBytes: 64 << 10, MaxEndpoints: 1000}
	pub := NewPublisher(PublisherOptions{LaggingAfter: time.Hour, Limits: limits, Log: logr.Discard()})
	var eps []fwkdl.Endpoint
	for i := range 1000 {
		ep := localPod(fmt.Sprintf("pod-%d", i), fmt.Sprintf("10.0.%d.%d", i/250, 1+i%250), 0)
		for j := range 8 {
			ep.GetMetadata().Labels[fmt.Sprintf("example.com/label-%d", j)] = strings.Repeat("v", 63)
		}
		eps = append(eps, ep)
	}
	pub.diff(eps, time.Now())
	snap := pub.snapshot(time.Now())
	snap.Seq, snap.SentUnixNano = 1, time.Now().UnixNano()
	data, err := proto.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > limits.MaxMessageBytes {
		t.Fatalf("snapshot of %d bytes, limit %d", len(data), limits.MaxMessageBytes)
	}
	if n := len(snap.GetUpserts()); n == 0 || n == len(eps) {
		t.Fatalf("%d of %d endpoints published; want as many as fit, not all", n, len(eps))
	}
	if _, err := DecodeUpdate(data, limits); err != nil {
		t.Fatalf("a subscriber refuses the snapshot: %v", err)
	}
}
