package federation

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"k8s.io/apimachinery/pkg/types"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
)

// SubscriberOptions configure the subscriptions of one EPP.
type SubscriberOptions struct {
	// Cluster is this EPP's own cluster name, sent to peers.
	Cluster string
	Pool    types.NamespacedName
	// DefaultMode applies to peers that do not set one.
	DefaultMode fleetv1alpha1.FederationMode
	Store       *Store
	Credentials *Credentials
	Limits      Limits
	// Destinations refuses peers' endpoints by address; the directory adds
	// the own ranges and each peer's.
	Destinations Destinations
	// MinBackoff and MaxBackoff bound the wait between reconnects (with
	// jitter, doubling from the minimum).
	MinBackoff, MaxBackoff time.Duration
	// SourceAddress is the local IP subscriptions dial from; empty lets
	// the system choose.
	SourceAddress string
	// PingInterval is how often the round trip to each peer is measured,
	// on its subscription's connection; 0 measures nothing.
	PingInterval time.Duration
	Log          logr.Logger
}

// Subscriber keeps one subscription per peer of the pool that publishes
// (every peer but a subscribe-only one), following the peer directory: peers
// that appear are subscribed, peers that leave or change are
// dropped (and resubscribed with the new entry).
type Subscriber struct {
	opts SubscriberOptions

	mu      sync.Mutex
	running map[string]*peerRun // by cluster
	wg      sync.WaitGroup
}

type peerRun struct {
	peer   fleetv1alpha1.Peer
	dest   Destinations
	cancel context.CancelFunc
}

// NewSubscriber returns a subscriber with no peers.
func NewSubscriber(opts SubscriberOptions) *Subscriber {
	return &Subscriber{opts: opts, running: map[string]*peerRun{}}
}

// Run follows the directory until ctx ends, then stops every subscription.
func (s *Subscriber) Run(ctx context.Context, dir *DirectoryFile) error {
	changed := dir.Changed()
	s.sync(ctx, dir.Current())
	for {
		select {
		case <-ctx.Done():
			s.wg.Wait()
			return nil
		case <-changed:
			s.sync(ctx, dir.Current())
		}
	}
}

// Authorize maps a client's certificate identities to a peer of this pool,
// for the publisher: only identities in the directory may subscribe.
func Authorize(dir *DirectoryFile, pool types.NamespacedName, self string) func([]string) (string, bool) {
	return func(ids []string) (string, bool) {
		for _, p := range dir.Current().For(pool, self) {
			for _, id := range ids {
				if id == p.Identity {
					return p.Cluster, true
				}
			}
		}
		return "", false
	}
}

// PeerIdentity returns the identity the directory lists for a peer cluster
// of this pool (false for an unknown cluster, and for self), for checking
// the certificate behind a Parent-mode mark (package epp/marks).
func PeerIdentity(dir *DirectoryFile, pool types.NamespacedName, self string) func(cluster string) (string, bool) {
	return func(cluster string) (string, bool) {
		for _, p := range dir.Current().For(pool, self) {
			if p.Cluster == cluster {
				return p.Identity, true
			}
		}
		return "", false
	}
}

func (s *Subscriber) sync(ctx context.Context, d *fleetv1alpha1.PeerDirectory) {
	want := map[string]fleetv1alpha1.Peer{}
	for _, p := range d.For(s.opts.Pool, s.opts.Cluster) {
		if p.SubscribeOnly {
			continue // an importer's picker: it has nothing to publish
		}
		if p.Mode == "" {
			p.Mode = s.opts.DefaultMode
		}
		want[p.Cluster] = p
	}
	dest := s.opts.Destinations.ForDirectory(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	for cluster, r := range s.running {
		if p, ok := want[cluster]; !ok || !samePeer(p, r.peer) || !slices.Equal(dest.Own, r.dest.Own) {
			r.cancel()
			delete(s.running, cluster)
		}
	}
	for cluster, p := range want {
		if _, ok := s.running[cluster]; ok {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		s.running[cluster] = &peerRun{peer: p, dest: dest, cancel: cancel}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.follow(pctx, p, dest)
		}()
	}
}

func samePeer(a, b fleetv1alpha1.Peer) bool {
	return a.Cluster == b.Cluster && a.FederationAddress == b.FederationAddress &&
		a.GatewayAddress == b.GatewayAddress && a.Identity == b.Identity && a.Mode == b.Mode &&
		slices.Equal(a.EndpointCIDRs, b.EndpointCIDRs)
}

// follow subscribes to one peer until ctx ends, reconnecting with backoff.
func (s *Subscriber) follow(ctx context.Context, p fleetv1alpha1.Peer, dest Destinations) {
	log := s.opts.Log.WithValues("peer", p.Cluster, "address", p.FederationAddress)
	origin := &Origin{Cluster: p.Cluster, Mode: p.Mode, Gateway: p.GatewayAddress, RoundTrip: &RoundTrip{}}
	backoff := s.opts.MinBackoff
	defer remoteEndpoints.DeleteLabelValues(p.Cluster)
	defer peerRTT.DeleteLabelValues(p.Cluster)
	for {
		began := time.Now()
		reason, err := s.stream(ctx, p, origin, dest)
		if ctx.Err() != nil {
			return
		}
		streamErrors.WithLabelValues(p.Cluster, reason).Inc()
		log.Info("Federation stream ended; peer's endpoints dropped", "reason", reason, "err", err)
		// A stream that lasted resets the backoff: the peer was healthy.
		if time.Since(began) > s.opts.MaxBackoff {
			backoff = s.opts.MinBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, s.opts.MaxBackoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// dial connects to a peer from the configured source address.
func (s *Subscriber) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	if s.opts.SourceAddress != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(s.opts.SourceAddress)}
	}
	return d.DialContext(ctx, "tcp", addr)
}

// stream runs one subscription and returns why it ended.
func (s *Subscriber) stream(ctx context.Context, p fleetv1alpha1.Peer, origin *Origin, dest Destinations) (string, error) {
	staleAfter := s.opts.Store.StaleAfter()
	// A static flow-control window turns gRPC's bandwidth estimation off: it
	// pinged (and the peer acknowledged) on received data, which doubled the
	// syscalls and TLS records of a stream of small, frequent updates. A
	// window of the largest message never holds a peer back.
	window := int32(min(max(s.opts.Limits.MaxMessageBytes, 64<<10), 1<<30))
	conn, err := grpc.NewClient("passthrough:///"+p.FederationAddress,
		grpc.WithTransportCredentials(credentials.NewTLS(s.opts.Credentials.ClientConfig(p.Identity))),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: staleAfter, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window),
		grpc.WithContextDialer(s.dial),
	)
	if err != nil {
		return "connect", err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// A peer that stops talking without closing the connection is dropped
	// once its data would be stale anyway: heartbeats come far more often.
	// The bound holds from the dial on: a connection whose handshake a
	// partition swallows (packets dropped, no reset) would otherwise wait
	// out gRPC's 20 s connect timeout, long after the path came back.
	watchdog := time.AfterFunc(staleAfter, func() { cancel(errStale) })
	defer watchdog.Stop()
	client := federationv1.NewFederationClient(conn)
	if s.opts.PingInterval > 0 {
		go s.ping(ctx, client, origin, staleAfter)
	}
	c := &updateCodec{limits: s.opts.Limits, bytes: bytesTotal.WithLabelValues(p.Cluster, "received"),
		updates: updatesTotal.WithLabelValues(p.Cluster, "received"), ctx: ctx, throttled: throttled.WithLabelValues(p.Cluster)}
	c.messageRate, c.byteRate = s.opts.Limits.rateLimiters()
	st, err := client.Subscribe(ctx,
		&federationv1.SubscribeRequest{PoolNamespace: s.opts.Pool.Namespace, PoolName: s.opts.Pool.Name, Cluster: s.opts.Cluster},
		grpc.ForceCodecV2(c), grpc.MaxCallRecvMsgSize(s.opts.Limits.MaxMessageBytes))
	if err != nil {
		if errors.Is(context.Cause(ctx), errStale) {
			return "connect", fmt.Errorf("%w: %w", errStale, err)
		}
		return "connect", err
	}
	state := newPeerState(origin, s.opts.Pool.Namespace, s.opts.Limits, dest, fleetv1alpha1.Prefixes(p.EndpointCIDRs))
	held := remoteEndpoints.WithLabelValues(p.Cluster)
	connected := false
	defer func() {
		if connected {
			s.opts.Store.remove(p.Cluster, state)
			held.Set(0)
			peersConnected.Dec()
		}
	}()
	for {
		u, err := st.Recv()
		if err != nil {
			if errors.Is(context.Cause(ctx), errStale) {
				return "stale", errStale
			}
			if c.err != nil {
				return "protocol", c.err
			}
			return "transport", err
		}
		watchdog.Reset(staleAfter)
		if err := state.apply(u, time.Now()); err != nil {
			return "protocol", err
		}
		if !connected {
			connected = true
			peersConnected.Inc()
			s.opts.Store.set(p.Cluster, state)
			s.opts.Log.Info("Federation stream up", "peer", p.Cluster, "endpoints", len(state.byID))
		}
		held.Set(float64(len(state.byID)))
	}
}

// ping measures the round trip to the peer every PingInterval until ctx
// ends, on the subscription's connection: a unary call the publisher
// answers at once, so the time is the link's round trip plus the two ends'
// gRPC handling. A ping that fails is no sample: the stream's own watchdog
// handles a dead peer. The first answer is no sample either: that call may
// have waited for the connection's TCP and TLS handshakes.
func (s *Subscriber) ping(ctx context.Context, client federationv1.FederationClient, origin *Origin, timeout time.Duration) {
	gauge := peerRTT.WithLabelValues(origin.Cluster)
	t := time.NewTicker(s.opts.PingInterval)
	defer t.Stop()
	answered := false
	for {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		began := time.Now()
		_, err := client.Ping(pctx, &federationv1.PingRequest{})
		cancel()
		if err == nil && answered {
			gauge.Set(origin.RoundTrip.Observe(time.Since(began)).Seconds())
		}
		answered = answered || err == nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

var errStale = errors.New("no message within the staleness bound")

// updateCodec decodes received Updates with DecodeUpdate, so that every byte
// from a peer goes through the same validation the fuzz tests exercise, and
// counts them. Requests are encoded with gRPC's proto codec.
type updateCodec struct {
	limits         Limits
	bytes, updates prometheus.Counter
	// ctx is the stream's: waiting for the rate limits ends with it.
	ctx context.Context
	// messageRate and byteRate bound the stream's rate; nil where Limits
	// do not. throttled counts the time spent waiting for them.
	messageRate, byteRate *rate.Limiter
	throttled             prometheus.Counter
	// err is the last decoding error: gRPC reports it to Recv as an
	// Internal status, this keeps it apart from transport errors.
	err error
}

func (c *updateCodec) Name() string { return grpcproto.Name }

// wait holds the stream until its rate limits allow a message of n bytes.
// Not reading is the bound: the rest of a flood waits in the peer, held
// back by the stream's flow-control window, and costs this picker nothing.
// Closing the stream instead would cost more: the peer would resend a full
// snapshot, decoded again, on every reconnect. A flooding peer's heartbeats
// arrive late, so its endpoints soon count as stale.
func (c *updateCodec) wait(n int) error {
	began := time.Now()
	if c.messageRate != nil {
		if err := c.messageRate.Wait(c.ctx); err != nil {
			return err
		}
	}
	if c.byteRate != nil {
		if err := c.byteRate.WaitN(c.ctx, n); err != nil {
			return err
		}
	}
	if waited := time.Since(began); waited > time.Millisecond {
		c.throttled.Add(waited.Seconds())
	}
	return nil
}

func (c *updateCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

func (c *updateCodec) Unmarshal(data mem.BufferSlice, v any) error {
	out, ok := v.(*federationv1.Update)
	if !ok {
		return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
	}
	n := data.Len()
	c.bytes.Add(float64(n))
	c.updates.Inc()
	if err := c.wait(n); err != nil {
		return err
	}
	b := data.Materialize()
	if err := decodeInto(b, out, c.limits); err != nil {
		c.err = err
		return fmt.Errorf("%w: %w", errProtocol, err)
	}
	return nil
}
