package federation

import (
	"context"
	"crypto/x509"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
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
	// Load, when set, is handed each local endpoint's scrape every time
	// local state is compared, and gives its waiting and running requests
	// as this picker knows them now (spill.Meter.Scraped, which also learns
	// the pod's batch from the scrape), which are published instead of the
	// scraped ones. Changed, when set, receives when they may have changed:
	// local state is then compared and changes sent without waiting for
	// Interval, but no sooner than MinGap after the last comparison, so
	// that subscribers get at most a message per MinGap.
	Load    func(name types.NamespacedName, waiting, running int, scrape time.Time) (int, int)
	Changed <-chan struct{}
	MinGap  time.Duration
	// Heartbeat is the longest a subscriber waits for a message; heartbeats
	// carry the freshness watermark when nothing changed.
	Heartbeat time.Duration
	// LaggingAfter marks an endpoint whose last scrape is older as lagging:
	// its data keeps its own scrape time instead of the watermark.
	LaggingAfter time.Duration
	// Authorize maps a client certificate's identities to the peer's cluster
	// name, or reports that the identity is unknown. Reauthorize asks it
	// again for every open stream.
	Authorize func(identities []string) (cluster string, ok bool)
	// Roots returns the current CA bundle, against which Reauthorize checks
	// every open stream's client certificate again; nil skips that check.
	Roots func() *x509.CertPool
	// Buffer is how many messages a subscriber may fall behind before its
	// stream is closed (it then resubscribes and gets a fresh snapshot).
	Buffer int
	// Limits are the subscribers' (DefaultLimits when zero): the endpoints
	// published fit them, so that a snapshot of all of them is one message a
	// subscriber accepts; the rest are withheld.
	Limits Limits
	// Prefixes, when set, gives each local endpoint's prefix summary and
	// its version (package prefixes); a changed one is sent at most every
	// PrefixInterval per endpoint. Summaries are sent while the pool
	// publishes at most a quarter of Limits.MaxEndpoints, so that they take
	// at most a quarter of a snapshot's size.
	Prefixes       func(types.NamespacedName) (*prefixes.Summary, uint64)
	PrefixInterval time.Duration
	Log            logr.Logger
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
	last map[uint32]*sentEndpoint
	// byCluster is each peer's one open stream.
	byCluster map[string]*subscription
	// opened bounds how often each peer may open a stream, pinged how
	// often it may ping.
	opened, pinged map[string]*rate.Limiter
	// bytes is the encoded size of last's endpoints in a snapshot.
	bytes int
	// withheld are the local endpoints left out of what is published, and
	// the metadata that made them so when it was their own (names or
	// labels out of bounds, so unchanged metadata needs no new look); nil
	// when the pool's limits did (endpoint count, message size), which are
	// looked at again every tick.
	withheld map[types.NamespacedName]*fwkdl.EndpointMetadata
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
	// size is ep's share of a snapshot's encoded size.
	size int
	// prefixVersion is the version of the prefix summary last sent, at
	// prefixSent.
	prefixVersion uint64
	prefixSent    time.Time
}

type subscription struct {
	ch      chan *federationv1.Update
	cluster string
	// chain is the client's verified certificate chain, leaf first.
	chain []*x509.Certificate
	// ended is closed, with why set, when the publisher ends the stream:
	// the subscriber fell too far behind, a newer stream of the same peer
	// replaced it, or the peer is no longer authorized.
	ended chan struct{}
	why   error
}

// end ends the stream with err. Called with the publisher's mu held, so a
// stream ends once.
func (s *subscription) end(err error) {
	select {
	case <-s.ended:
	default:
		s.why = err
		close(s.ended)
	}
}

// NewPublisher returns a publisher; Run drives it.
func NewPublisher(opts PublisherOptions) *Publisher {
	if opts.Buffer <= 0 {
		opts.Buffer = 64
	}
	if opts.Limits == (Limits{}) {
		opts.Limits = DefaultLimits
	}
	return &Publisher{opts: opts, ids: map[types.NamespacedName]uint32{}, withheld: map[types.NamespacedName]*fwkdl.EndpointMetadata{},
		last: map[uint32]*sentEndpoint{}, subs: map[*subscription]struct{}{}, byCluster: map[string]*subscription{},
		opened: map[string]*rate.Limiter{}, pinged: map[string]*rate.Limiter{}}
}

// Run compares local state and publishes changes until ctx ends: Interval
// after the last comparison, or MinGap after it once Changed received.
func (p *Publisher) Run(ctx context.Context) error {
	last := time.Now()
	due := last.Add(p.opts.Interval)
	t := time.NewTimer(p.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.opts.Changed:
			if soon := last.Add(p.opts.MinGap); soon.Before(due) {
				due = soon
				t.Reset(time.Until(due))
			}
		case now := <-t.C:
			p.tick(now)
			last, due = now, now.Add(p.opts.Interval)
			t.Reset(p.opts.Interval)
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
			s.end(status.Error(codes.ResourceExhausted, "subscriber fell behind; resubscribe for a fresh snapshot"))
			p.drop(s)
		}
	}
}

// diff brings last up to local and returns the delta. Called with p.mu held.
func (p *Publisher) diff(local []fwkdl.Endpoint, now time.Time) *federationv1.Update {
	u := &federationv1.Update{}
	present := make(map[uint32]bool, len(local))
	seen := make(map[types.NamespacedName]bool, len(p.withheld))
	for _, ep := range local {
		md, m := ep.GetMetadata(), ep.GetMetrics()
		if md == nil || m == nil {
			continue
		}
		m = p.current(md.NamespacedName, m)
		seen[md.NamespacedName] = true
		if w := p.withheld[md.NamespacedName]; w != nil && w == md {
			continue
		}
		id := p.ids[md.NamespacedName]
		prev := p.last[id]
		summary, version := p.dueSummary(md.NamespacedName, prev, now)
		var next *federationv1.Endpoint
		onlySummary := false
		switch {
		case prev == nil || prev.md != md && !sameSpec(prev.ep.GetSpec(), md):
			if err := checkNamesAndLabels(md.NamespacedName.Name, md.PodName, md.Labels); err != nil {
				p.withhold(md, md, "labels", err)
				continue
			}
			next = &federationv1.Endpoint{Spec: specOf(md), Metrics: metricsOf(m), Prefixes: prev.prefixes()}
		case !sameValues(prev.ep.GetMetrics(), m):
			next = &federationv1.Endpoint{Spec: prev.ep.GetSpec(), Metrics: metricsOf(m), Prefixes: prev.prefixes()}
		case summary != nil:
			next, onlySummary = prev.ep, true
		}
		if next != nil && summary != nil {
			// A summary never costs an endpoint its place in the message:
			// without room it waits, and the endpoint goes without it.
			withSummary := &federationv1.Endpoint{Spec: next.GetSpec(), Metrics: next.GetMetrics(), Prefixes: summary}
			switch {
			case p.bytes+growth(withSummary, prev) <= p.budget():
				next = withSummary
			case onlySummary:
				next, summary = nil, nil
				prefixSummaries.WithLabelValues("deferred").Inc()
			default:
				summary = nil
				prefixSummaries.WithLabelValues("deferred").Inc()
			}
		}
		if next != nil {
			size, grow := snapshotSize(next), growth(next, prev)
			switch {
			case prev == nil && len(p.last) >= p.opts.Limits.MaxEndpoints:
				p.withhold(md, nil, "endpoint-count", fmt.Errorf("the pool publishes at most %d endpoints", p.opts.Limits.MaxEndpoints))
				continue
			case p.bytes+grow > p.budget():
				p.withhold(md, nil, "message-size", fmt.Errorf("the pool's endpoints would not fit a message of %d bytes", p.opts.Limits.MaxMessageBytes))
				continue
			}
			if prev == nil {
				p.nextID++
				id = p.nextID
				p.ids[md.NamespacedName] = id
			}
			next.Id = id
			p.bytes += grow
			switch {
			case prev == nil || prev.ep.GetSpec() != next.GetSpec():
				u.Upserts = append(u.Upserts, next)
			default:
				// Only a new summary travels again.
				delta := &federationv1.Endpoint{Id: id, Metrics: next.GetMetrics()}
				if summary != nil {
					delta.Prefixes = summary
				}
				u.Upserts = append(u.Upserts, delta)
			}
			if prev == nil {
				prev = &sentEndpoint{}
				p.last[id] = prev
			}
			prev.ep, prev.size = next, size
			if summary != nil {
				prev.prefixVersion, prev.prefixSent = version, now
				prefixSummaries.WithLabelValues("sent").Inc()
			}
		}
		delete(p.withheld, md.NamespacedName)
		present[id] = true
		prev.md, prev.scrape = md, scrapeOf(m)
	}
	for id, e := range p.last {
		if !present[id] {
			u.Removed = append(u.Removed, id)
			p.bytes -= e.size
			delete(p.last, id)
		}
	}
	for name, id := range p.ids {
		if !present[id] {
			delete(p.ids, name)
		}
	}
	for name := range p.withheld {
		if !seen[name] {
			delete(p.withheld, name)
		}
	}
	slices.Sort(u.Removed)
	u.CurrentUnixNano, u.Lagging = p.watermark(now)
	p.synced = true
	return u
}

// current is m with the waiting and running requests Load gives of the
// endpoint name, m itself when they are the scraped ones.
func (p *Publisher) current(name types.NamespacedName, m *fwkdl.Metrics) *fwkdl.Metrics {
	if p.opts.Load == nil {
		return m
	}
	waiting, running := p.opts.Load(name, m.WaitingQueueSize, m.RunningRequestsSize, m.UpdateTime)
	if waiting == m.WaitingQueueSize && running == m.RunningRequestsSize {
		return m
	}
	c := m.Clone()
	c.WaitingQueueSize, c.RunningRequestsSize = waiting, running
	return c
}

// dueSummary returns the prefix summary of the local endpoint name to send
// now, with its version: nil unless summaries are on, the endpoint's
// changed since the last sent (prev's; nil for a new endpoint) and that was
// PrefixInterval ago. Called with p.mu held.
func (p *Publisher) dueSummary(name types.NamespacedName, prev *sentEndpoint, now time.Time) (*federationv1.PrefixSummary, uint64) {
	if p.opts.Prefixes == nil || len(p.last) > p.opts.Limits.MaxEndpoints/4 {
		return nil, 0
	}
	if prev != nil && now.Sub(prev.prefixSent) < p.opts.PrefixInterval {
		return nil, 0
	}
	s, version := p.opts.Prefixes(name)
	if s == nil || prev != nil && version == prev.prefixVersion {
		return nil, 0
	}
	return &federationv1.PrefixSummary{Filter: s.Bytes()}, version
}

// prefixes is the summary last sent for e, nil for none or a new endpoint.
func (e *sentEndpoint) prefixes() *federationv1.PrefixSummary {
	if e == nil {
		return nil
	}
	return e.ep.GetPrefixes()
}

// withhold leaves a local endpoint out of what is published (a previously
// published one is removed), and counts it and logs it once. Called with
// p.mu held.
func (p *Publisher) withhold(md, sticky *fwkdl.EndpointMetadata, reason string, err error) {
	if _, ok := p.withheld[md.NamespacedName]; !ok {
		endpointsWithheld.WithLabelValues(reason).Inc()
		p.opts.Log.Info("Endpoint not federated", "endpoint", md.NamespacedName, "reason", reason, "err", err.Error())
	}
	p.withheld[md.NamespacedName] = sticky
}

// budget is the encoded size the published endpoints may take: a message's
// limit less what a snapshot's other fields (lagging ids) and a delta's
// removed ids may take next to them.
func (p *Publisher) budget() int {
	return max(p.opts.Limits.MaxMessageBytes-10*p.opts.Limits.MaxEndpoints-64, 0)
}

// growth is how much sending next for an endpoint last sent as prev (nil
// for none) grows a snapshot's encoded size.
func growth(next *federationv1.Endpoint, prev *sentEndpoint) int {
	n := snapshotSize(next)
	if prev != nil {
		n -= prev.size
	}
	return n
}

// snapshotSize is the encoded size of e as an element of an Update's
// upserts: its own, its length prefix and the field's tag.
func snapshotSize(e *federationv1.Endpoint) int {
	n := proto.Size(e)
	return n + 1 + protowire.SizeVarint(uint64(n))
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
			e = &federationv1.Endpoint{Id: id, Spec: e.GetSpec(), Metrics: proto.CloneOf(e.GetMetrics()), Prefixes: e.GetPrefixes()}
			e.Metrics.ScrapeUnixNano = s
		}
		u.Upserts = append(u.Upserts, e)
	}
	u.CurrentUnixNano, u.Lagging = p.watermark(now)
	return u
}

// Streams a peer cluster may open to one pool: five a second, in bursts of
// twenty (every pool of a peer reconnects during a CA rotation). A subscriber
// reconnects with backoff from 100 ms; each stream costs a snapshot.
const (
	streamsPerSecond = 5
	streamBurst      = 20
)

// Pings a peer cluster may send: its pickers ping every
// --federation-ping-interval (500 ms by default), one per pool they
// subscribe to, so twenty a second in bursts of forty leaves room for
// several pools and for a shorter interval, and bounds a peer that pings in
// a loop to a few microseconds of work a second.
const (
	pingsPerSecond = 20
	pingBurst      = 40
)

// mayOpen reports whether cluster may open a stream now.
func (p *Publisher) mayOpen(cluster string) bool {
	return p.allow(p.opened, cluster, streamsPerSecond, streamBurst)
}

// allow takes a token from cluster's limiter in limiters, made with limit
// and burst on first use. Peers come from the directory (MaxPeers), so the
// maps are bounded.
func (p *Publisher) allow(limiters map[string]*rate.Limiter, cluster string, limit rate.Limit, burst int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := limiters[cluster]
	if l == nil {
		l = rate.NewLimiter(limit, burst)
		limiters[cluster] = l
	}
	return l.Allow()
}

// drop forgets a subscription. Called with p.mu held.
func (p *Publisher) drop(s *subscription) {
	delete(p.subs, s)
	if p.byCluster[s.cluster] == s {
		delete(p.byCluster, s.cluster)
	}
}

// Reauthorize ends the open streams of peers that are no longer authorized:
// their identity left the directory (or now names another cluster), or
// their certificate no longer verifies against the current CA bundle (a CA
// rotation ended, or it expired). The runner calls it whenever the
// directory or the credentials change.
func (p *Publisher) Reauthorize() {
	var roots *x509.CertPool
	if p.opts.Roots != nil {
		roots = p.opts.Roots()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		if cluster, ok := p.opts.Authorize(Identities(s.chain[0])); !ok || cluster != s.cluster {
			refused.WithLabelValues("deauthorized").Inc()
			s.end(status.Error(codes.PermissionDenied, "client identity is no longer a peer in the peer directory"))
			p.drop(s)
			continue
		}
		if roots != nil {
			if _, err := verifyChain(s.chain, roots, x509.ExtKeyUsageClientAuth); err != nil {
				refused.WithLabelValues("deauthorized").Inc()
				s.end(status.Errorf(codes.Unauthenticated, "client certificate no longer verifies: %v", err))
				p.drop(s)
			}
		}
	}
}

// ReauthorizeOn calls Reauthorize whenever one of changed receives (the
// directory's and the credentials' Changed) and every interval, for
// certificates that expire, until ctx ends.
func (p *Publisher) ReauthorizeOn(ctx context.Context, interval time.Duration, changed ...<-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	cases := make([]reflect.SelectCase, 0, len(changed)+2)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)})
	for _, ch := range changed {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
	}
	for {
		if i, _, _ := reflect.Select(cases); i == 0 {
			return
		}
		p.Reauthorize()
	}
}

// tooOftenDelay is how long a stream opened too often waits for its
// refusal. An honest subscriber is never refused: it backs off from 100 ms
// and opens at most a few streams a second.
const tooOftenDelay = 5 * time.Second

// Subscribe implements the Federation service.
//
// A peer has one stream: a newer stream of the same peer replaces the open
// one, which ends with ABORTED. Refusing the newer one instead would lock a
// subscriber whose connection died without a word out until keepalive
// notices; replacing lets it come back at once, and a peer gains nothing
// by opening more.
func (p *Publisher) Subscribe(req *federationv1.SubscribeRequest, stream federationv1.Federation_SubscribeServer) error {
	ctx := stream.Context()
	cluster, chain, ok := p.authorize(ctx)
	if !ok {
		refused.WithLabelValues("unknown-identity").Inc()
		return status.Error(codes.PermissionDenied, "client identity is not a peer in the peer directory")
	}
	if req.GetPoolNamespace() != p.opts.Pool.Namespace || req.GetPoolName() != p.opts.Pool.Name {
		refused.WithLabelValues("wrong-pool").Inc()
		return status.Errorf(codes.FailedPrecondition, "this EPP serves pool %s, not %s/%s",
			p.opts.Pool, req.GetPoolNamespace(), req.GetPoolName())
	}
	if !p.mayOpen(cluster) {
		// A peer that reopens in a loop is answered late, holding one of
		// its connection's four stream slots, so that each connection costs
		// this EPP at most four streams in tooOftenDelay, not a busy loop.
		refused.WithLabelValues("too-often").Inc()
		select {
		case <-ctx.Done():
		case <-time.After(tooOftenDelay):
		}
		return status.Error(codes.ResourceExhausted, "this peer opens streams too often; retry with backoff")
	}
	s := &subscription{ch: make(chan *federationv1.Update, p.opts.Buffer), cluster: cluster, chain: chain, ended: make(chan struct{})}
	local := p.opts.Local()
	p.mu.Lock()
	now := time.Now()
	if !p.synced {
		p.diff(local, now)
	}
	first := p.snapshot(now)
	if old := p.byCluster[cluster]; old != nil {
		refused.WithLabelValues("replaced").Inc()
		old.end(status.Error(codes.Aborted, "replaced by a newer stream of the same peer"))
		p.drop(old)
	}
	p.subs[s] = struct{}{}
	p.byCluster[cluster] = s
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.drop(s)
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
		case <-s.ended:
			p.opts.Log.Info("Peer's stream ended", "peer", cluster, "reason", s.why.Error())
			return s.why
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
	cluster, _, ok := p.authorize(ctx)
	if !ok {
		return nil, status.Error(codes.PermissionDenied, "client identity is not a peer in the peer directory")
	}
	if !p.allow(p.pinged, cluster, pingsPerSecond, pingBurst) {
		refused.WithLabelValues("pings-too-often").Inc()
		return nil, status.Error(codes.ResourceExhausted, "this peer pings too often; keep to --federation-ping-interval")
	}
	return &federationv1.PingReply{}, nil
}

// authorize returns the cluster of the stream's client and its verified
// certificate chain.
func (p *Publisher) authorize(ctx context.Context) (string, []*x509.Certificate, bool) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return "", nil, false
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", nil, false
	}
	chain := info.State.VerifiedChains[0]
	cluster, ok := p.opts.Authorize(Identities(chain[0]))
	return cluster, chain, ok
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
		if validAdapterName(name) {
			out[name] = clampUint32(n)
		}
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
	valid := 0
	for name := range cur {
		if validAdapterName(name) {
			valid++
		}
	}
	if len(sent) != min(valid, maxAdapters) {
		return false
	}
	for name, n := range sent {
		if v, ok := cur[name]; !ok || clampUint32(v) != n {
			return false
		}
	}
	return true
}
