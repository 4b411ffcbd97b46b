package epp

// Peering: the federation's flags, and its server, subscriptions and file
// watchers (package federation) built from them and run next to GIE's
// servers.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/epp/crossing"
	"github.com/fleetinfer/fleetinfer/epp/federation"
	federationv1 "github.com/fleetinfer/fleetinfer/epp/federation/v1"
	"github.com/fleetinfer/fleetinfer/epp/internal/gierunner"
	"github.com/fleetinfer/fleetinfer/epp/marks"
	"github.com/fleetinfer/fleetinfer/epp/prefixes"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// FederationOptions are the federation's command-line flags. Federation is
// on when --federation-peers-file is set.
type FederationOptions struct {
	Cluster          string
	PeersFile        string
	Port             int
	CertFile         string
	KeyFile          string
	CAFile           string
	Mode             string
	Staleness        time.Duration
	PublishInterval  time.Duration
	PublishMinGap    time.Duration
	Heartbeat        time.Duration
	MaxEndpoints     int
	MaxMessageBytes  int
	MaxMessageRate   int
	MaxByteRate      int
	ReloadInterval   time.Duration
	MinBackoff       time.Duration
	MaxBackoff       time.Duration
	LaggingAfter     time.Duration
	SubscriberBuffer int
	SourceAddress    string
	PingInterval     time.Duration
	AllowLoopback    bool
	MaxRemoteShare   float64
	BreakerFailures  int
	BreakerOpen      time.Duration
	BreakerSlow      time.Duration
}

// maxReconnectBackoff caps the wait between a peer's reconnects. A reconnect
// made during a partition waits out the staleness bound before it fails, so
// after the link heals a peer is back within the staleness plus this: 4 s
// with the defaults, inside the 5 s a partition's end should take to heal.
const maxReconnectBackoff = 2 * time.Second

// NewFederationOptions returns the defaults.
func NewFederationOptions() *FederationOptions {
	return &FederationOptions{
		Port: fleetv1alpha1.FederationPort, Mode: string(fleetv1alpha1.FederationEndpoint), Staleness: 2 * time.Second,
		PublishInterval: 50 * time.Millisecond, PublishMinGap: 25 * time.Millisecond, Heartbeat: 100 * time.Millisecond,
		MaxEndpoints: federation.DefaultLimits.MaxEndpoints, MaxMessageBytes: federation.DefaultLimits.MaxMessageBytes,
		MaxMessageRate: federation.DefaultLimits.MaxMessagesPerSecond, MaxByteRate: federation.DefaultLimits.MaxBytesPerSecond,
		ReloadInterval: time.Second, MinBackoff: 100 * time.Millisecond, MaxBackoff: maxReconnectBackoff,
		LaggingAfter: 500 * time.Millisecond, SubscriberBuffer: 64, PingInterval: 500 * time.Millisecond,
		MaxRemoteShare: crossing.DefaultOptions.MaxShare, BreakerFailures: crossing.DefaultOptions.Failures,
		BreakerOpen: crossing.DefaultOptions.Open, BreakerSlow: crossing.DefaultOptions.SlowAfter,
	}
}

// AddFlags adds the federation flags to fs.
func (o *FederationOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Cluster, fleetv1alpha1.FlagFederationCluster, o.Cluster, "This cluster's name; peer directory entries of this cluster are skipped.")
	fs.StringVar(&o.PeersFile, fleetv1alpha1.FlagFederationPeersFile, o.PeersFile, "Peer directory file (YAML or JSON, reloaded on change); enables federation.")
	fs.IntVar(&o.Port, fleetv1alpha1.FlagFederationPort, o.Port, "Port of the federation gRPC server (mTLS).")
	fs.StringVar(&o.CertFile, fleetv1alpha1.FlagFederationCertFile, o.CertFile, "PEM certificate of this EPP's federation identity (reloaded on change).")
	fs.StringVar(&o.KeyFile, fleetv1alpha1.FlagFederationKeyFile, o.KeyFile, "PEM private key of the federation certificate (reloaded on change).")
	fs.StringVar(&o.CAFile, fleetv1alpha1.FlagFederationCAFile, o.CAFile, "PEM CA bundle that signs peers' certificates (reloaded on change).")
	fs.StringVar(&o.SourceAddress, fleetv1alpha1.FlagFederationSourceAddress, o.SourceAddress, "Local IP address federation connections to peers leave from (for a picker on a host with several addresses); empty lets the system choose.")
	fs.StringVar(&o.Mode, fleetv1alpha1.FlagFederationMode, o.Mode, "How requests reach peers' pods when their entry does not say: Endpoint (pod ip:port) or Parent (peer gateway, with signed marks).")
	fs.DurationVar(&o.Staleness, "federation-staleness", o.Staleness, "Remote endpoints whose data is older are not candidates; a silent peer is disconnected after this long.")
	fs.DurationVar(&o.PublishInterval, "federation-publish-interval", o.PublishInterval, "How often local changes are sent to subscribers.")
	fs.DurationVar(&o.PublishMinGap, "federation-publish-min-gap", o.PublishMinGap, "When a request this picker sent to a local pod starts or ends, the pods' load is sent to subscribers this long after the last message at the earliest, without waiting for --federation-publish-interval; at least 1 s over --federation-max-messages-per-second, which peers with the same flags apply.")
	fs.DurationVar(&o.Heartbeat, "federation-heartbeat", o.Heartbeat, "Longest time between messages to a subscriber; heartbeats carry data freshness.")
	fs.DurationVar(&o.PingInterval, "federation-ping-interval", o.PingInterval, "How often the round trip to each peer is measured (fleetinfer_epp_peer_rtt_seconds); the spill policy adds it to a remote endpoint's expected time to first token.")
	fs.IntVar(&o.MaxEndpoints, "federation-max-endpoints-per-peer", o.MaxEndpoints, "Most endpoints accepted from one peer.")
	fs.BoolVar(&o.AllowLoopback, fleetv1alpha1.FlagFederationAllowLoopback, o.AllowLoopback, "Admit peers' endpoints at loopback addresses (only for a fleet that lives on loopback, as the local fleet does); each peer's address ranges still apply.")
	fs.Float64Var(&o.MaxRemoteShare, "federation-max-remote-share", o.MaxRemoteShare, "Largest share of picks (over 10 s, once 20 picks were made) one remote cluster may take; 1 does not bound.")
	fs.IntVar(&o.BreakerFailures, "federation-breaker-failures", o.BreakerFailures, "Crossed requests to a cluster that fail in a row (5xx, no response, or slower than --federation-breaker-slow) before no request crosses to it for --federation-breaker-open; then one probes.")
	fs.DurationVar(&o.BreakerOpen, "federation-breaker-open", o.BreakerOpen, "How long a cluster's circuit breaker stays open before a request probes it.")
	fs.DurationVar(&o.BreakerSlow, "federation-breaker-slow", o.BreakerSlow, "A crossed request whose response headers take longer counts as failed; 0 judges errors only.")
	fs.IntVar(&o.MaxMessageBytes, "federation-max-message-bytes", o.MaxMessageBytes, "Largest federation message accepted; what a peer's endpoints may take in all, and what this EPP publishes fits it.")
	fs.IntVar(&o.MaxMessageRate, "federation-max-messages-per-second", o.MaxMessageRate, "Most messages a second read from one peer (bursts of twice that); what a faster peer sends waits in the peer (flow control). 0: no bound.")
	fs.IntVar(&o.MaxByteRate, "federation-max-bytes-per-second", o.MaxByteRate, "Most bytes a second read from one peer (bursts of one more message); what a faster peer sends waits in the peer (flow control). 0: no bound.")
}

// Validate checks the flags.
func (o *FederationOptions) Validate() error {
	if o.PeersFile == "" {
		return nil
	}
	var errs []error
	if o.Cluster == "" {
		errs = append(errs, errors.New("--federation-cluster is required with --federation-peers-file"))
	}
	if o.CertFile == "" || o.KeyFile == "" || o.CAFile == "" {
		errs = append(errs, errors.New("--federation-cert-file, --federation-key-file and --federation-ca-file are required: peers authenticate with mTLS"))
	}
	if _, err := fleetv1alpha1.ParsePeerMode(o.Mode); err != nil {
		errs = append(errs, err)
	}
	if o.SourceAddress != "" {
		if _, err := netip.ParseAddr(o.SourceAddress); err != nil {
			errs = append(errs, fmt.Errorf("--%s %q is not an IP address", fleetv1alpha1.FlagFederationSourceAddress, o.SourceAddress))
		}
	}
	if o.Port <= 0 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--federation-port %d out of range", o.Port))
	}
	if o.Staleness <= 0 || o.PublishInterval <= 0 || o.Heartbeat <= 0 || o.Heartbeat >= o.Staleness || o.PingInterval <= 0 {
		errs = append(errs, errors.New("federation intervals must be positive, with the heartbeat shorter than the staleness bound"))
	}
	if o.MaxRemoteShare <= 0 || o.MaxRemoteShare > 1 || o.BreakerFailures <= 0 || o.BreakerOpen <= 0 || o.BreakerSlow < 0 {
		errs = append(errs, errors.New("--federation-max-remote-share must be in (0, 1], the breaker's failures and open time positive"))
	}
	if o.MaxEndpoints <= 0 || o.MaxMessageBytes <= 0 || o.MaxMessageRate < 0 || o.MaxByteRate < 0 {
		errs = append(errs, errors.New("federation limits must be positive (rates may be 0: no bound)"))
	}
	switch {
	case o.PublishMinGap <= 0 || o.PublishMinGap > o.PublishInterval:
		errs = append(errs, fmt.Errorf("--federation-publish-min-gap %s must be positive and at most --federation-publish-interval %s", o.PublishMinGap, o.PublishInterval))
	case o.MaxMessageRate > 0 && o.PublishMinGap < time.Second/time.Duration(o.MaxMessageRate):
		errs = append(errs, fmt.Errorf("--federation-publish-min-gap %s would send peers more than the %d messages a second of --federation-max-messages-per-second", o.PublishMinGap, o.MaxMessageRate))
	}
	return errors.Join(errs...)
}

// crossingOptions are the crossing gate's options from the flags.
func (o *FederationOptions) crossingOptions() crossing.Options {
	opts := crossing.DefaultOptions
	opts.MaxShare, opts.Failures, opts.Open, opts.SlowAfter = o.MaxRemoteShare, o.BreakerFailures, o.BreakerOpen, o.BreakerSlow
	return opts
}

// federationParts are the running pieces; all nil when federation is off.
type federationParts struct {
	store      *federation.Store
	dir        *federation.DirectoryFile
	creds      *federation.Credentials
	publisher  *federation.Publisher
	subscriber *federation.Subscriber
	port       int
	reload     time.Duration
	cluster    string
	pool       types.NamespacedName
	// prefixes records the prompts this picker sent each local pod, for
	// the summaries published to peers and the spill policy's estimate.
	// Nil without federation: only a crossing weighs prefixes.
	prefixes *prefixes.Index
}

// prefixSummaryInterval is the shortest time between two prefix summaries
// of one endpoint sent to peers: a summary is 1 KiB, so this bounds them to
// 1 KiB a second per endpoint and peer, while a prefix cached in one
// cluster reaches the others' estimates within about a second.
const prefixSummaryInterval = time.Second

// marker signs this picker's Parent-mode marks with its federation key and
// verifies its peers' against the CA bundle and the peer directory.
func (f *federationParts) marker() *marker {
	return &marker{cluster: f.cluster, pool: f.pool, cert: f.creds.Certificate, now: time.Now,
		verifier: &marks.Verifier{Pool: f.pool, Roots: f.creds.Roots, Identity: federation.PeerIdentity(f.dir, f.pool, f.cluster)}}
}

// build makes the federation's parts. The publisher sends the load meter
// knows of the local pods as soon as it changes, and hands meter every
// scrape it reads (spill.Meter.Scraped).
func (o *FederationOptions) build(pool types.NamespacedName, ds datastore.Datastore, meter *spill.Meter, log logr.Logger) (*federationParts, error) {
	if o.PeersFile == "" {
		return &federationParts{}, nil
	}
	log = log.WithName("federation")
	mode, _ := fleetv1alpha1.ParsePeerMode(o.Mode)
	dir := &federation.DirectoryFile{Path: o.PeersFile, Interval: o.ReloadInterval, Log: log}
	if err := dir.Load(); err != nil {
		return nil, err
	}
	creds, err := federation.LoadCredentials(federation.TLSFiles{CertFile: o.CertFile, KeyFile: o.KeyFile, CAFile: o.CAFile}, log)
	if err != nil {
		return nil, err
	}
	limits := federation.Limits{MaxMessageBytes: o.MaxMessageBytes, MaxEndpoints: o.MaxEndpoints,
		MaxMessagesPerSecond: o.MaxMessageRate, MaxBytesPerSecond: o.MaxByteRate}
	store := federation.NewStore(o.Staleness)
	index := prefixes.NewIndex()
	return &federationParts{
		store: store, dir: dir, creds: creds, port: o.Port, reload: o.ReloadInterval, cluster: o.Cluster, pool: pool, prefixes: index,
		publisher: federation.NewPublisher(federation.PublisherOptions{
			Pool: pool, Local: func() []fwkdl.Endpoint { return ds.PodList(datastore.AllPodsPredicate) },
			Interval: o.PublishInterval, Load: meter.Scraped, Changed: meter.Changed(), MinGap: o.PublishMinGap,
			Heartbeat: o.Heartbeat, LaggingAfter: o.LaggingAfter,
			Authorize: federation.Authorize(dir, pool, o.Cluster), Roots: creds.Roots, Buffer: o.SubscriberBuffer, Limits: limits, Log: log,
			Prefixes: index.Summary, PrefixInterval: prefixSummaryInterval,
		}),
		subscriber: federation.NewSubscriber(federation.SubscriberOptions{
			Cluster: o.Cluster, Pool: pool, DefaultMode: mode, Store: store, Credentials: creds, Limits: limits,
			Destinations: federation.Destinations{AllowLoopback: o.AllowLoopback},
			MinBackoff:   o.MinBackoff, MaxBackoff: o.MaxBackoff, SourceAddress: o.SourceAddress, PingInterval: o.PingInterval, Log: log,
		}),
	}, nil
}

// addTo adds the federation's server, subscriptions and file watchers to
// the manager, next to GIE's servers.
func (f *federationParts) addTo(mgr manager.Manager) error {
	if f.store == nil {
		return nil
	}
	srv := grpc.NewServer(federation.ServerOptions(f.creds)...)
	federationv1.RegisterFederationServer(srv, f.publisher)
	for _, r := range []manager.Runnable{
		gierunner.NoLeaderElection(gierunner.GRPCServer("federation", srv, f.port)),
		runFunc(f.publisher.Run),
		runFunc(func(ctx context.Context) error { return f.subscriber.Run(ctx, f.dir) }),
		runFunc(f.dir.Run),
		runFunc(func(ctx context.Context) error {
			// Expired certificates are looked for every minute.
			f.publisher.ReauthorizeOn(ctx, time.Minute, f.dir.Changed(), f.creds.Changed())
			return nil
		}),
		runFunc(func(ctx context.Context) error { f.creds.Run(ctx, f.reload); return nil }),
	} {
		if err := mgr.Add(r); err != nil {
			return err
		}
	}
	return nil
}

func runFunc(fn func(context.Context) error) manager.Runnable {
	return gierunner.NoLeaderElection(manager.RunnableFunc(fn))
}
