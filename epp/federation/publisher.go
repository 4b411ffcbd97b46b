package federation

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// Pool is the InferencePool this EPP serves; subscriptions for another
	// pool are refused.
	Pool types.NamespacedName
	// Local lists the pool's local endpoints with their scraped metrics
	// (GIE's datastore).
	Local func() []fwkdl.Endpoint
	// Interval is how often local state is compared and changes sent; about
	// GIE's scrape interval.
	Interval time.Duration
	// Heartbeat is the longest a subscriber waits for a message; heartbeats
	// carry the freshness watermark when nothing changed.
	Heartbeat time.Duration
	// LaggingAfter marks an endpoint whose last scrape is older as lagging:
	// its data keeps its own scrape time instead of the watermark.
	LaggingAfter time.Duration
	// Authorize maps a client certificate's identities to the peer's cluster
	// name, or reports that the identity is unknown.
	Authorize func(identities []string) (cluster string, ok bool)
	// Buffer is how many messages a subscriber may fall behind before its
	// stream is closed (it then resubscribes and gets a fresh snapshot).
	Buffer int
	Log    logr.Logger
}

// Publisher serves the Federation service: it turns the local datastore into
// a snapshot plus deltas and fans them out to subscribers.
type Publisher struct {
	federationv1.UnimplementedFederationServer
	opts PublisherOptions

	mu     sync.Mutex
	ids    map[types.NamespacedName]uint32
	nextID uint32
	// last is what every subscriber has been sent, by id.
	last     map[uint32]*federationv1.Endpoint
	subs     map[*subscription]struct{}
	lastSent time.Time
}

type subscription struct {
	ch      chan *federationv1.Update
	cluster string
	// overflow is closed when the subscriber fell too far behind.
	overflow chan struct{}
}

// NewPublisher returns a publisher; Run drives it.
func NewPublisher(opts PublisherOptions) *Publisher {
	if opts.Buffer <= 0 {
		opts.Buffer = 64
	}
	return &Publisher{opts: opts, ids: map[types.NamespacedName]uint32{},
		last: map[uint32]*federationv1.Endpoint{}, subs: map[*subscription]struct{}{}}
}

// Run compares local state every interval and publishes changes until ctx ends.
func (p *Publisher) Run(ctx context.Context) error {
	t := time.NewTicker(p.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			p.tick(now)
		}
	}
}

// tick diffs local endpoints against what was last sent and fans the delta
// (or a heartbeat) out to every subscriber.
func (p *Publisher) tick(now time.Time) {
	local := p.opts.Local()
	p.mu.Lock()
	defer p.mu.Unlock()
	u := &federationv1.Update{}
	present := make(map[uint32]bool, len(local))
	for _, ep := range local {
		md, m := ep.GetMetadata(), ep.GetMetrics()
		if md == nil || m == nil {
			continue
		}
		id, ok := p.ids[md.NamespacedName]
		if !ok {
			p.nextID++
			id = p.nextID
			p.ids[md.NamespacedName] = id
		}
		present[id] = true
		cur := &federationv1.Endpoint{Id: id, Spec: specOf(md), Metrics: metricsOf(m)}
		prev := p.last[id]
		switch {
		case prev == nil || !proto.Equal(prev.GetSpec(), cur.GetSpec()):
			u.Upserts = append(u.Upserts, cur)
		case !sameValues(prev.GetMetrics(), cur.GetMetrics()):
			u.Upserts = append(u.Upserts, &federationv1.Endpoint{Id: id, Metrics: cur.GetMetrics()})
		}
		p.last[id] = cur
	}
	for id := range p.last {
		if !present[id] {
			u.Removed = append(u.Removed, id)
			delete(p.last, id)
		}
	}
	for name, id := range p.ids {
		if !present[id] {
			delete(p.ids, name)
		}
	}
	slices.Sort(u.Removed)
	u.CurrentUnixNano, u.Lagging = p.watermark(now)
	if len(u.Upserts) == 0 && len(u.Removed) == 0 && now.Sub(p.lastSent) < p.opts.Heartbeat {
		return
	}
	p.lastSent = now
	for s := range p.subs {
		select {
		case s.ch <- u:
		default:
			// The subscriber is too slow; it gets a fresh snapshot when it
			// comes back, which is cheaper than buffering without bound.
			close(s.overflow)
			delete(p.subs, s)
		}
	}
}

// watermark returns the oldest scrape time among endpoints that are not
// lagging, and the lagging ones. Called with p.mu held.
func (p *Publisher) watermark(now time.Time) (int64, []uint32) {
	cutoff := now.Add(-p.opts.LaggingAfter).UnixNano()
	var current int64
	var lagging []uint32
	for id, e := range p.last {
		t := e.GetMetrics().GetScrapeUnixNano()
		if t < cutoff {
			lagging = append(lagging, id)
			continue
		}
		if current == 0 || t < current {
			current = t
		}
	}
	slices.Sort(lagging)
	return current, lagging
}

// snapshot builds the first message of a new stream. Called with p.mu held.
func (p *Publisher) snapshot(now time.Time) *federationv1.Update {
	u := &federationv1.Update{Snapshot: true}
	for _, id := range slices.Sorted(maps.Keys(p.last)) {
		u.Upserts = append(u.Upserts, p.last[id])
	}
	u.CurrentUnixNano, u.Lagging = p.watermark(now)
	return u
}

// Subscribe implements the Federation service.
func (p *Publisher) Subscribe(req *federationv1.SubscribeRequest, stream federationv1.Federation_SubscribeServer) error {
	ctx := stream.Context()
	cluster, ok := p.authorize(ctx)
	if !ok {
		refused.WithLabelValues("unknown-identity").Inc()
		return status.Error(codes.PermissionDenied, "client identity is not a peer in the peer directory")
	}
	if req.GetPoolNamespace() != p.opts.Pool.Namespace || req.GetPoolName() != p.opts.Pool.Name {
		refused.WithLabelValues("wrong-pool").Inc()
		return status.Errorf(codes.FailedPrecondition, "this EPP serves pool %s, not %s/%s",
			p.opts.Pool, req.GetPoolNamespace(), req.GetPoolName())
	}
	s := &subscription{ch: make(chan *federationv1.Update, p.opts.Buffer), cluster: cluster, overflow: make(chan struct{})}
	p.mu.Lock()
	first := p.snapshot(time.Now())
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.subs, s)
		p.mu.Unlock()
	}()
	subscribers.Inc()
	defer subscribers.Dec()
	p.opts.Log.Info("Peer subscribed", "peer", cluster, "endpoints", len(first.GetUpserts()))

	var seq uint64
	send := func(u *federationv1.Update) error {
		seq++
		// Each stream numbers its own messages; the shared delta is copied
		// field by field (its endpoints are read-only from here on).
		msg := &federationv1.Update{Seq: seq, SentUnixNano: time.Now().UnixNano(), Snapshot: u.GetSnapshot(),
			Upserts: u.GetUpserts(), Removed: u.GetRemoved(), CurrentUnixNano: u.GetCurrentUnixNano(), Lagging: u.GetLagging()}
		if err := stream.Send(msg); err != nil {
			return err
		}
		bytesTotal.WithLabelValues(cluster, "sent").Add(float64(proto.Size(msg)))
		updatesTotal.WithLabelValues(cluster, "sent").Inc()
		return nil
	}
	if err := send(first); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.overflow:
			return status.Error(codes.ResourceExhausted, "subscriber fell behind; resubscribe for a fresh snapshot")
		case u := <-s.ch:
			if err := send(u); err != nil {
				return err
			}
		}
	}
}

func (p *Publisher) authorize(ctx context.Context) (string, bool) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return "", false
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	return p.opts.Authorize(Identities(info.State.VerifiedChains[0][0]))
}

func specOf(md *fwkdl.EndpointMetadata) *federationv1.EndpointSpec {
	port, _ := strconv.ParseUint(md.GetPort(), 10, 16)
	return &federationv1.EndpointSpec{Name: md.NamespacedName.Name, PodName: md.PodName,
		Address: md.GetIPAddress(), Port: uint32(port), Labels: md.Labels}
}

func metricsOf(m *fwkdl.Metrics) *federationv1.EndpointMetrics {
	out := &federationv1.EndpointMetrics{
		NumRequestsWaiting: clampUint32(m.WaitingQueueSize),
		NumRequestsRunning: clampUint32(m.RunningRequestsSize),
		KvCacheUsage:       min(max(m.KVCacheUsagePercent, 0), 1),
		Cache: &federationv1.CacheConfig{BlockSize: clampUint32(m.CacheBlockSize), NumGpuBlocks: clampUint32(m.CacheNumBlocks),
			MaxTokenCapacity: uint64(max(m.KvCacheMaxTokenCapacity, 0))},
	}
	if !m.UpdateTime.IsZero() {
		out.ScrapeUnixNano = m.UpdateTime.UnixNano()
	}
	if m.MaxActiveModels > 0 || len(m.ActiveModels) > 0 || len(m.WaitingModels) > 0 {
		out.Lora = &federationv1.LoRAState{MaxAdapters: int32(min(m.MaxActiveModels, 1<<30)),
			Running: adapters(m.ActiveModels), Waiting: adapters(m.WaitingModels)}
	}
	return out
}

func adapters(in map[string]int) map[string]uint32 {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]uint32, min(len(in), maxAdapters))
	for name, n := range in {
		if len(out) == maxAdapters {
			break
		}
		out[name] = clampUint32(n)
	}
	return out
}

func clampUint32(n int) uint32 { return uint32(min(max(n, 0), 1<<31)) }

// sameValues compares metrics without their scrape time, which changes on
// every scrape and travels in the watermark instead.
func sameValues(a, b *federationv1.EndpointMetrics) bool {
	return a.GetNumRequestsWaiting() == b.GetNumRequestsWaiting() &&
		a.GetNumRequestsRunning() == b.GetNumRequestsRunning() &&
		a.GetKvCacheUsage() == b.GetKvCacheUsage() &&
		proto.Equal(a.GetLora(), b.GetLora()) && proto.Equal(a.GetCache(), b.GetCache())
}
