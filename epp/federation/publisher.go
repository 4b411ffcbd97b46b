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
	last     map[uint32]*sentEndpoint
	subs     map[*subscription]struct{}
	lastSent time.Time
	// synced is whether last follows the local state. Without subscribers
	// ticks do nothing, and the next subscription catches up first.
	synced bool
}

// sentEndpoint is an endpoint as last sent, and its latest scrape.
type sentEndpoint struct {
	// md is the metadata the spec was made of: GIE replaces an endpoint's
	// metadata when it changes, so the same pointer is the same spec.
	md *fwkdl.EndpointMetadata
	// ep is shared with the subscriptions' messages, so never changed.
	ep *federationv1.Endpoint
	// scrape is the latest scrape time, which changes on every scrape and
	// travels in the watermark rather than as a change.
	scrape int64
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
		last: map[uint32]*sentEndpoint{}, subs: map[*subscription]struct{}{}}
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
	p.mu.Lock()
	idle := len(p.subs) == 0
	if idle {
		p.synced = false
	}
	p.mu.Unlock()
	if idle {
		return
	}
	local := p.opts.Local()
	p.mu.Lock()
	defer p.mu.Unlock()
	u := p.diff(local, now)
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

// diff brings last up to local and returns the delta. Called with p.mu held.
func (p *Publisher) diff(local []fwkdl.Endpoint, now time.Time) *federationv1.Update {
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
		prev := p.last[id]
		switch {
		case prev == nil || prev.md != md && !sameSpec(prev.ep.GetSpec(), md):
			prev = &sentEndpoint{ep: &federationv1.Endpoint{Id: id, Spec: specOf(md), Metrics: metricsOf(m)}}
			p.last[id] = prev
			u.Upserts = append(u.Upserts, prev.ep)
		case !sameValues(prev.ep.GetMetrics(), m):
			prev.ep = &federationv1.Endpoint{Id: id, Spec: prev.ep.GetSpec(), Metrics: metricsOf(m)}
			u.Upserts = append(u.Upserts, &federationv1.Endpoint{Id: id, Metrics: prev.ep.GetMetrics()})
		}
		prev.md, prev.scrape = md, scrapeOf(m)
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
	p.synced = true
	return u
}

// watermark returns the oldest scrape time among endpoints that are not
// lagging, and the lagging ones. Called with p.mu held.
func (p *Publisher) watermark(now time.Time) (int64, []uint32) {
	cutoff := now.Add(-p.opts.LaggingAfter).UnixNano()
	var current int64
	var lagging []uint32
	for id, e := range p.last {
		if e.scrape < cutoff {
			lagging = append(lagging, id)
			continue
		}
		if current == 0 || e.scrape < current {
			current = e.scrape
		}
	}
	slices.Sort(lagging)
	return current, lagging
}

// snapshot builds the first message of a new stream. Called with p.mu held.
func (p *Publisher) snapshot(now time.Time) *federationv1.Update {
	u := &federationv1.Update{Snapshot: true}
	for _, id := range slices.Sorted(maps.Keys(p.last)) {
		e := p.last[id].ep
		if s := p.last[id].scrape; s != e.GetMetrics().GetScrapeUnixNano() {
			e = &federationv1.Endpoint{Id: id, Spec: e.GetSpec(), Metrics: proto.CloneOf(e.GetMetrics())}
			e.Metrics.ScrapeUnixNano = s
		}
		u.Upserts = append(u.Upserts, e)
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
	local := p.opts.Local()
	p.mu.Lock()
	now := time.Now()
	if !p.synced {
		p.diff(local, now)
	}
	first := p.snapshot(now)
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
	sentBytes, sentUpdates := bytesTotal.WithLabelValues(cluster, "sent"), updatesTotal.WithLabelValues(cluster, "sent")
	send := func(u *federationv1.Update) error {
		seq++
		// Each stream numbers its own messages; the shared delta is copied
		// field by field (its endpoints are read-only from here on).
		msg := &federationv1.Update{Seq: seq, SentUnixNano: time.Now().UnixNano(), Snapshot: u.GetSnapshot(),
			Upserts: u.GetUpserts(), Removed: u.GetRemoved(), CurrentUnixNano: u.GetCurrentUnixNano(), Lagging: u.GetLagging()}
		if err := stream.Send(msg); err != nil {
			return err
		}
		sentBytes.Add(float64(proto.Size(msg)))
		sentUpdates.Inc()
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

// Ping answers peers' round-trip probes (see Subscriber). Only peers in
// the directory are answered, as for Subscribe.
func (p *Publisher) Ping(ctx context.Context, _ *federationv1.PingRequest) (*federationv1.PingReply, error) {
	if _, ok := p.authorize(ctx); !ok {
		return nil, status.Error(codes.PermissionDenied, "client identity is not a peer in the peer directory")
	}
	return &federationv1.PingReply{}, nil
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
		KvCacheUsage:       kvUsage(m),
		Cache: &federationv1.CacheConfig{BlockSize: clampUint32(m.CacheBlockSize), NumGpuBlocks: clampUint32(m.CacheNumBlocks),
			MaxTokenCapacity: uint64(max(m.KvCacheMaxTokenCapacity, 0))},
		ScrapeUnixNano: scrapeOf(m),
	}
	if hasLoRA(m) {
		out.Lora = &federationv1.LoRAState{MaxAdapters: maxAdaptersOf(m),
			Running: adapters(m.ActiveModels), Waiting: adapters(m.WaitingModels)}
	}
	return out
}

func scrapeOf(m *fwkdl.Metrics) int64 {
	if m.UpdateTime.IsZero() {
		return 0
	}
	return m.UpdateTime.UnixNano()
}

// kvUsage and maxAdaptersOf are metricsOf's conversions, which sameValues
// compares against.
func kvUsage(m *fwkdl.Metrics) float64 { return min(max(m.KVCacheUsagePercent, 0), 1) }

func maxAdaptersOf(m *fwkdl.Metrics) int32 { return int32(min(m.MaxActiveModels, 1<<30)) }

func hasLoRA(m *fwkdl.Metrics) bool {
	return m.MaxActiveModels > 0 || len(m.ActiveModels) > 0 || len(m.WaitingModels) > 0
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

// sameSpec reports whether spec was made of metadata equal to md.
func sameSpec(spec *federationv1.EndpointSpec, md *fwkdl.EndpointMetadata) bool {
	port, _ := strconv.ParseUint(md.GetPort(), 10, 16)
	return spec.GetName() == md.NamespacedName.Name && spec.GetPodName() == md.PodName &&
		spec.GetAddress() == md.GetIPAddress() && spec.GetPort() == uint32(port) && maps.Equal(spec.GetLabels(), md.Labels)
}

// sameValues reports whether sent carries m's values (metricsOf's, without
// the scrape time).
func sameValues(sent *federationv1.EndpointMetrics, m *fwkdl.Metrics) bool {
	c := sent.GetCache()
	if sent.GetNumRequestsWaiting() != clampUint32(m.WaitingQueueSize) || sent.GetNumRequestsRunning() != clampUint32(m.RunningRequestsSize) ||
		sent.GetKvCacheUsage() != kvUsage(m) || c.GetBlockSize() != clampUint32(m.CacheBlockSize) ||
		c.GetNumGpuBlocks() != clampUint32(m.CacheNumBlocks) || c.GetMaxTokenCapacity() != uint64(max(m.KvCacheMaxTokenCapacity, 0)) {
		return false
	}
	l := sent.GetLora()
	if !hasLoRA(m) {
		return l == nil
	}
	return l != nil && l.GetMaxAdapters() == maxAdaptersOf(m) &&
		sameAdapters(l.GetRunning(), m.ActiveModels) && sameAdapters(l.GetWaiting(), m.WaitingModels)
}

// sameAdapters reports whether sent is what adapters(cur) may return.
func sameAdapters(sent map[string]uint32, cur map[string]int) bool {
	if len(sent) != min(len(cur), maxAdapters) {
		return false
	}
	for name, n := range sent {
		if v, ok := cur[name]; !ok || clampUint32(v) != n {
			return false
		}
	}
	return true
}
