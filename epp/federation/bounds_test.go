package federation

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/federation/federationtest"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// federatedPair is a west publisher and an east subscriber that read the
// same directory, which lists both.
type federatedPair struct {
	west, east *cluster
	store      *Store
	dir        *DirectoryFile
}

func newFederatedPair(t *testing.T) *federatedPair {
	t.Helper()
	return newFederatedPairStale(t, time.Second)
}

// newFederatedPairStale is newFederatedPair with east's staleness bound
// staleAfter.
func newFederatedPairStale(t *testing.T, staleAfter time.Duration) *federatedPair {
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
	p := &federatedPair{west: newCluster(t, ca, "west", dir), east: newCluster(t, ca, "east", dir), dir: dir}
	writeDirectoryFile(t, path, p.peers()...)
	if err := dir.Load(); err != nil {
		t.Fatal(err)
	}
	p.store = subscribeWith(t, "east", p.east.creds, dir, staleAfter, 0)
	return p
}

// holds waits until east holds n endpoints of west.
func (p *federatedPair) holds(t *testing.T, what string, n int) {
	t.Helper()
	waitFor(t, what, func() error {
		if got := p.store.Count()["west"]; got != n {
			return fmt.Errorf("east holds %d endpoints of west, want %d", got, n)
		}
		return nil
	})
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
	// A snapshot of 4,096 endpoints may take seconds to build, send and
	// apply on a loaded machine; the stream must not go stale meanwhile.
	p := newFederatedPairStale(t, 10*time.Second)
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

// A peer taken out of the directory loses its open stream: the publisher
// looks at its streams again when the directory changes.
func TestARemovedPeersOpenStreamClosesWithinFiveSeconds(t *testing.T) {
	p := newFederatedPair(t)
	p.west.local.set(localPod("a", "127.12.0.1", 0))
	p.holds(t, "west's pod mirrored", 1)
	deauthorized := testutil.ToFloat64(refused.WithLabelValues("deauthorized"))
	// The directory no longer lists east but still lists west, which east
	// follows: only west's reauthorization can end the stream.
	writeDirectoryFile(t, p.dir.Path, p.peers()[1])
	removed := time.Now()
	if err := p.dir.Load(); err != nil {
		t.Fatal(err)
	}
	p.holds(t, "east's stream closed", 0)
	took := time.Since(removed)
	t.Logf("stream closed %v after the directory changed", took)
	if took > 5*time.Second {
		t.Fatalf("stream closed after %v, want within 5 s", took)
	}
	if d := testutil.ToFloat64(refused.WithLabelValues("deauthorized")) - deauthorized; d < 1 {
		t.Errorf("%v streams ended as deauthorized", d)
	}
}

// A newer stream of the same peer replaces the open one, which ends with
// ABORTED: a peer holds one stream however many it opens. A peer that
// opens streams in a loop is answered RESOURCE_EXHAUSTED, after
// tooOftenDelay.
func TestANewerStreamOfTheSamePeerReplacesTheOpenOne(t *testing.T) {
	p := newFederatedPair(t)
	p.west.local.set(localPod("a", "127.12.0.1", 0))
	p.holds(t, "west's pod mirrored", 1)
	open := func() (federationv1.Federation_SubscribeClient, error) {
		conn, err := grpc.NewClient("passthrough:///"+p.west.addr, grpc.WithTransportCredentials(grpccreds.NewTLS(p.east.creds.ClientConfig(p.west.identity))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		st, err := federationv1.NewFederationClient(conn).Subscribe(t.Context(),
			&federationv1.SubscribeRequest{PoolNamespace: testPool.Namespace, PoolName: testPool.Name})
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		return st, err
	}
	prev, err := open()
	if err != nil {
		t.Fatal(err)
	}
	for replaced := 0; ; replaced++ {
		began := time.Now()
		next, err := open()
		if err != nil {
			// East's own subscriber, replaced too, reconnects and takes
			// from the same burst: how many replacements fit varies.
			if status.Code(err) != codes.ResourceExhausted || time.Since(began) < tooOftenDelay-100*time.Millisecond {
				t.Fatalf("stream %d: %v after %v, want RESOURCE_EXHAUSTED after %s, past the burst", replaced+2, err, time.Since(began), tooOftenDelay)
			}
			break
		}
		for {
			_, err := prev.Recv()
			if err == nil {
				continue
			}
			if status.Code(err) != codes.Aborted {
				t.Fatalf("the replaced stream ended with %v, want ABORTED", err)
			}
			break
		}
		prev = next
	}
	p.west.publisher.mu.Lock()
	n := len(p.west.publisher.subs)
	p.west.publisher.mu.Unlock()
	if n != 1 {
		t.Errorf("%d streams open for one peer, want 1", n)
	}
}

// When a CA rotation ends, the publisher's bundle drops the old CA: a
// stream whose client certificate only the old CA signed ends.
func TestAStreamEndsWhenItsCertificateNoLongerVerifies(t *testing.T) {
	p := newFederatedPair(t)
	p.west.local.set(localPod("a", "127.12.0.1", 0))
	p.holds(t, "west's pod mirrored", 1)
	next, err := federationtest.NewCA("fleet-next")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.WriteFiles(p.west.credsDir, p.west.identity); err != nil {
		t.Fatal(err)
	}
	rotated := time.Now()
	if _, err := p.west.creds.reload(); err != nil {
		t.Fatal(err)
	}
	p.holds(t, "east's stream closed", 0)
	t.Logf("stream closed %v after the CA bundle changed", time.Since(rotated))
}

// A peer that sends faster than its rate limit is read no faster than the
// limit allows, with its bursts, and the wait is counted; nothing is
// refused.
func TestUpdateCodecReadsAPeerNoFasterThanItsRateLimit(t *testing.T) {
	limits := Limits{MaxMessageBytes: 1 << 10, MaxEndpoints: 16, MaxMessagesPerSecond: 50, MaxBytesPerSecond: 1 << 20}
	c := &updateCodec{limits: limits, bytes: bytesTotal.WithLabelValues("rate-test", "received"), updates: updatesTotal.WithLabelValues("rate-test", "received"),
		ctx: t.Context(), throttled: throttled.WithLabelValues("rate-test")}
	c.messageRate, c.byteRate = limits.rateLimiters()
	data, err := proto.Marshal(&federationv1.Update{Seq: 1, SentUnixNano: 1, Snapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	// The burst (100) is read at once, the next 50 over a second.
	began := time.Now()
	for i := range 150 {
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &federationv1.Update{}); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	took := time.Since(began)
	waited := testutil.ToFloat64(throttled.WithLabelValues("rate-test"))
	t.Logf("150 messages read in %s, %.2f s of it waiting", took, waited)
	if took < 900*time.Millisecond || waited < 0.8 {
		t.Errorf("150 messages at 50 a second (burst 100) read in %s, %.2f s counted as throttled; want about a second", took, waited)
	}

	// A stream that ends stops the wait.
	ctx, cancel := context.WithCancel(t.Context())
	c.ctx = ctx
	cancel()
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, &federationv1.Update{}); err == nil {
		t.Error("a message of an ended stream was read past the limit")
	}
}

// A peer that pings in a loop is answered RESOURCE_EXHAUSTED past a burst,
// and its pings are counted as refused; pings at the picker's interval
// never are.
func TestAPeerThatPingsInALoopIsRefused(t *testing.T) {
	p := newFederatedPair(t)
	conn, err := grpc.NewClient("passthrough:///"+p.west.addr, grpc.WithTransportCredentials(grpccreds.NewTLS(p.east.creds.ClientConfig(p.west.identity))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := federationv1.NewFederationClient(conn)
	for i := range 5 {
		if _, err := c.Ping(t.Context(), &federationv1.PingRequest{}); err != nil {
			t.Fatalf("ping %d at a normal pace: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := testutil.ToFloat64(refused.WithLabelValues("pings-too-often"))
	ok, exhausted := 0, 0
	began := time.Now()
	for range 200 {
		_, err := c.Ping(t.Context(), &federationv1.PingRequest{})
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.ResourceExhausted:
			exhausted++
		default:
			t.Fatalf("ping: %v", err)
		}
	}
	// The burst, what refills meanwhile, and east's own picker's pings.
	if bound := pingBurst + int(time.Since(began).Seconds()*pingsPerSecond) + 2; ok > bound || exhausted == 0 {
		t.Errorf("%d of 200 pings in a loop answered (bound %d), %d refused", ok, bound, exhausted)
	}
	if d := testutil.ToFloat64(refused.WithLabelValues("pings-too-often")) - before; int(d) != exhausted {
		t.Errorf("%v pings counted as refused, %d were", d, exhausted)
	}
}
