// Package inventory is the hub's view of its clusters: which are engaged
// (from the multicluster-runtime provider), their labels and properties
// (from the OCM ManagedCluster, the ClusterProfile or the registration
// Secret), and whether each is available: the hub probes every cluster's API
// server itself and also honours the registration's own verdict (OCM's
// ManagedClusterConditionAvailable, ClusterProfile's ControlPlaneHealthy).
// Since when each lost cluster has been unavailable is recorded on the hub
// (record.go), so a restarted hub counts the failover toleration on.
package inventory

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	clusterinventoryv1alpha1 "sigs.k8s.io/cluster-inventory-api/apis/v1alpha1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	"sigs.k8s.io/multicluster-runtime/providers/kubeconfig"

	"github.com/fleetinfer/fleetinfer/hub/internal/fence"
)

var secretGVK = corev1.SchemeGroupVersion.WithKind("Secret")

// Cluster is a snapshot of one cluster.
type Cluster struct {
	Name       string
	Labels     map[string]string
	Properties map[string]string
	// UnavailableSince is when the cluster last became unavailable; zero
	// while it is available.
	UnavailableSince time.Time
	// Reason explains unavailability.
	Reason string
	// Client reads from the hub's cache of the cluster, which holds only
	// what the hub watches; Reader reads the API server directly.
	Client client.Client
	Reader client.Reader
	// Engaging says the cluster is registered but not engaged by a hub that
	// began to lead less than its EngageGrace ago: its copies and capacity
	// are not known yet, not known to be lost.
	Engaging bool
	// Fence says why the hub may not write to the cluster although it may
	// read it: it does not hold its hub lease there (lease.go). Client
	// refuses writes then; zero while it may write.
	Fence fence.Fence
}

// Available reports whether the cluster is currently available.
func (c Cluster) Available() bool { return c.UnavailableSince.IsZero() }

// Writable reports whether the hub may write to the cluster: it is
// available and not fenced. A fenced cluster still runs what it runs, and
// another hub with this hub's ID manages it: the hub skips it when writing,
// as it does an unavailable one, but it is no reason to move replicas.
func (c Cluster) Writable() bool { return c.Available() && !c.Fence.Fenced() }

// Options configure the inventory.
type Options struct {
	// Hub reads registrations (ManagedClusters, ClusterProfiles, Secrets)
	// and writes the availability record (record.go).
	Hub client.Client
	// HubReader reads the availability record past the cache (the hub
	// watches no ConfigMaps); Hub when nil.
	HubReader client.Reader
	// Namespace holds the registration Secrets and ClusterProfiles.
	Namespace string
	// ProbeInterval is how often each cluster's API server is probed.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe.
	ProbeTimeout time.Duration
	// ProbeFailureThreshold is how many consecutive failed probes make a
	// cluster unavailable (3 when unset); the toleration counts from the
	// first of them.
	ProbeFailureThreshold int
	// ProbeSuccessThreshold is how many consecutive good probes make a
	// cluster that the probes found unavailable available again (2 when
	// unset).
	ProbeSuccessThreshold int
	// EngageGrace is how long after it begins to lead the hub gives a
	// registered cluster to be engaged before it trusts an earlier hub's
	// record of that cluster's loss (0: at once). A leader killed before
	// it engaged a cluster leaves its presumption of a loss in the record;
	// the next leader, which has not engaged the cluster yet either in its
	// first moments, would otherwise take a healthy cluster as lost long
	// ago and move its replicas away at once.
	EngageGrace time.Duration
	// Lease fences the hub's writes (lease.go): while it leads the hub
	// keeps the lease of Lease.HubID in every engaged cluster, and the
	// clients Clusters lists refuse writes where it does not hold it. No
	// HubID: no fencing.
	Lease fence.Options
	// LeaseRenewPeriod is how often the leases are renewed
	// (DefaultLeaseRenewPeriod when unset).
	LeaseRenewPeriod time.Duration
	Log              logr.Logger
}

// Source lists the fleet's clusters, sorted by name, each with its clients
// and availability. The hub's controllers read clusters through it: the
// Inventory in a running hub, fixed clusters with fake clients in tests.
type Source interface {
	Clusters(ctx context.Context) []Cluster
}

var _ Source = (*Inventory)(nil)

// Inventory tracks the engaged clusters. It is a multicluster-runtime
// Runnable: the manager engages it with every cluster the provider finds.
type Inventory struct {
	opts Options

	record *record
	// started is when this hub began to lead (Start, which runs only on the
	// leader): the loss of a registered cluster it has not engaged, when no
	// earlier hub recorded one. Guarded by mu.
	started time.Time

	mu       sync.Mutex
	clusters map[string]*tracked
	subs     []chan<- string
}

type tracked struct {
	name   string
	cl     cluster.Cluster
	http   *http.Client
	readyz string // the API server's /readyz URL
	// probeFails and probeOKs count the current streak of failed and good
	// probes; firstFail is when the failing streak began.
	probeFails int
	probeOKs   int
	firstFail  time.Time
	probeErr   string
	// probeDown: the probes made the cluster unavailable (probeFails reached
	// the failure threshold) and have not yet made it available again.
	probeDown bool
	since     time.Time // unavailable since; zero when available
	reason    string
	// recorded is when an earlier hub process found the cluster
	// unavailable (record.go), until this process sees it answer: a hub
	// that restarts while a cluster is lost keeps counting the toleration
	// from the loss rather than from its own start.
	recorded time.Time
	// The registration's last verdict, kept while the hub cannot read it.
	regAvailable bool
	regReason    string
	regSince     time.Time
	// lease is the hub lease there, guarded by the inventory's mu;
	// announced the fence last announced. leaseMu serializes renewals.
	lease     fence.State
	announced fence.Fence
	leaseMu   sync.Mutex
}

// New builds an inventory.
func New(opts Options) *Inventory {
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 2 * time.Second
	}
	if opts.ProbeTimeout <= 0 {
		opts.ProbeTimeout = 2 * time.Second
	}
	if opts.ProbeFailureThreshold <= 0 {
		opts.ProbeFailureThreshold = 3
	}
	if opts.ProbeSuccessThreshold <= 0 {
		opts.ProbeSuccessThreshold = 2
	}
	if opts.Lease.Duration <= 0 {
		opts.Lease.Duration = DefaultLeaseDuration
	}
	if opts.LeaseRenewPeriod <= 0 {
		opts.LeaseRenewPeriod = DefaultLeaseRenewPeriod
	}
	return &Inventory{opts: opts, clusters: map[string]*tracked{},
		record: &record{hub: opts.Hub, reader: opts.HubReader, key: client.ObjectKey{Namespace: opts.Namespace, Name: RecordName}, log: opts.Log}}
}

var (
	availableGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fleetinfer_hub_cluster_available",
		Help: "Whether the hub considers a cluster available (1) or not (0).",
	}, []string{"cluster"})
	probeFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetinfer_hub_cluster_probe_failures_total",
		Help: "API server probes of a cluster that failed.",
	}, []string{"cluster"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(availableGauge, probeFailures)
}

// Engage starts tracking a cluster until ctx ends (the provider disengaged it).
func (i *Inventory) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	cfg := rest.CopyConfig(cl.GetConfig())
	cfg.Timeout = i.opts.ProbeTimeout
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	readyz, err := readyzURL(cfg)
	if err != nil {
		return err
	}
	t := &tracked{name: string(name), cl: cl, http: hc, readyz: readyz, regAvailable: true,
		recorded: i.record.since(ctx, string(name))}
	i.mu.Lock()
	i.clusters[t.name] = t
	leading := !i.started.IsZero()
	i.mu.Unlock()
	availableGauge.WithLabelValues(t.name).Set(1)
	i.notify(t.name)
	if leading {
		// Renewals come every LeaseRenewPeriod: a cluster engaged in
		// between is not left unwritable for that long.
		go i.renewLease(ctx, t)
	}
	go func() {
		<-ctx.Done()
		i.mu.Lock()
		removed := i.clusters[t.name] == t
		if removed {
			delete(i.clusters, t.name)
		}
		i.mu.Unlock()
		if !removed {
			return // a later engagement under the same name owns the series
		}
		availableGauge.DeleteLabelValues(t.name)
		leaseHeld.DeleteLabelValues(t.name)
		i.notify(t.name)
	}()
	return nil
}

// Start probes every cluster until ctx ends.
func (i *Inventory) Start(ctx context.Context) error {
	i.startedAt()
	go i.keepLeases(ctx)
	t := time.NewTicker(i.opts.ProbeInterval)
	defer t.Stop()
	graceEnd := time.After(i.opts.EngageGrace)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			i.probeAll(ctx)
		case <-graceEnd:
			// Registered's verdict on the clusters still not engaged
			// changes now: have the services decided again.
			for _, c := range i.Registered().Clusters(ctx) {
				if !c.Available() {
					i.notify(c.Name)
				}
			}
		}
	}
}

// startedAt is when this hub began to lead, set on first use.
func (i *Inventory) startedAt() time.Time {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.started.IsZero() {
		i.started = time.Now()
	}
	return i.started
}

// Subscribe returns a channel that receives a cluster's name whenever it is
// engaged, disengaged or changes availability.
func (i *Inventory) Subscribe(buffer int) <-chan string {
	ch := make(chan string, buffer)
	i.mu.Lock()
	i.subs = append(i.subs, ch)
	i.mu.Unlock()
	return ch
}

func (i *Inventory) notify(name string) {
	i.mu.Lock()
	subs := slices.Clone(i.subs)
	i.mu.Unlock()
	for _, s := range subs {
		select {
		case s <- name:
		default: // a slow subscriber catches up on its next full resync
		}
	}
}

// engaged is every engaged cluster's tracking.
func (i *Inventory) engaged() []*tracked {
	i.mu.Lock()
	defer i.mu.Unlock()
	ts := make([]*tracked, 0, len(i.clusters))
	for _, t := range i.clusters {
		ts = append(ts, t)
	}
	return ts
}

func (i *Inventory) probeAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, t := range i.engaged() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := i.probe(ctx, t)
			i.update(t, err, i.registrationAvailable(ctx, t.name))
			i.mu.Lock()
			since := t.since
			i.mu.Unlock()
			i.record.save(ctx, t.name, since)
		}()
	}
	wg.Wait()
}

func (i *Inventory) probe(ctx context.Context, t *tracked) error {
	ctx, cancel := context.WithTimeout(ctx, i.opts.ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.readyz, nil)
	if err != nil {
		return err
	}
	resp, err := t.http.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz answered %s", resp.Status)
	}
	return nil
}

// readyzURL is the /readyz URL of the API server cfg speaks to, joined as
// a path so that a server URL with a trailing slash or a path prefix (a
// proxy's /k8s/clusters/<id>) is probed where it answers.
func readyzURL(cfg *rest.Config) (string, error) {
	base, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return "", fmt.Errorf("the API server URL %q: %w", cfg.Host, err)
	}
	return base.JoinPath("readyz").String(), nil
}

// update records a probe and the registration's verdict; availability
// changes are announced. The probes change availability with hysteresis:
// the cluster becomes unavailable after ProbeFailureThreshold consecutive
// failures, unavailable since the first of them, and available again after
// ProbeSuccessThreshold consecutive good probes. The registration's verdict
// applies at once.
func (i *Inventory) update(t *tracked, probeErr error, reg verdict) {
	i.mu.Lock()
	wasAvailable := t.since.IsZero()
	now := time.Now()
	if reg.known {
		t.regAvailable, t.regReason, t.regSince = reg.available, reg.reason, reg.since
	}
	if probeErr == nil {
		t.recorded = time.Time{} // it answered: whatever came before is over
	}
	if probeErr != nil {
		if t.probeFails == 0 {
			t.firstFail = now
		}
		t.probeFails++
		t.probeOKs = 0
		t.probeErr = probeErr.Error()
		if t.probeFails >= i.opts.ProbeFailureThreshold {
			t.probeDown = true
		}
	} else {
		t.probeFails = 0
		t.probeOKs++
		if t.probeOKs >= i.opts.ProbeSuccessThreshold {
			t.probeDown = false
		}
	}
	var reason string
	switch {
	case t.probeDown && probeErr != nil:
		reason = "API server unreachable: " + t.probeErr
	case t.probeDown:
		reason = fmt.Sprintf("API server unreachable: %s (answering again, %d of %d good probes)",
			t.probeErr, t.probeOKs, i.opts.ProbeSuccessThreshold)
	case !t.regAvailable:
		reason = t.regReason
	}
	if probeErr != nil {
		probeFailures.WithLabelValues(t.name).Inc()
	}
	if reason != "" && t.since.IsZero() {
		t.since = lossSince(now, t)
	}
	if reason == "" {
		t.since = time.Time{}
	}
	t.reason = reason
	isAvailable := t.since.IsZero()
	i.mu.Unlock()
	if wasAvailable != isAvailable {
		v := 0.0
		if isAvailable {
			v = 1
		}
		availableGauge.WithLabelValues(t.name).Set(v)
		i.opts.Log.Info("cluster availability changed", "cluster", t.name, "available", isAvailable, "reason", reason)
		i.notify(t.name)
	}
}

// verdict is what a cluster's registration says about its availability.
type verdict struct {
	// known is false when a registration could not be read: the last
	// verdict stands, since a hub that cannot read its own API says nothing
	// about the cluster.
	known     bool
	available bool
	reason    string
	// since is when the registration's condition last changed: how long
	// the cluster has been lost, even across hub restarts.
	since time.Time
}

// registrationAvailable reads what the cluster's registration says about
// it: OCM's Available condition or ClusterProfile's ControlPlaneHealthy.
// Without a registration of either kind the probe alone decides.
func (i *Inventory) registrationAvailable(ctx context.Context, name string) verdict {
	mc := &clusterv1.ManagedCluster{}
	err := i.opts.Hub.Get(ctx, client.ObjectKey{Name: name}, mc)
	if v, decided := conditionVerdict("ManagedCluster "+name, err, mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable); decided {
		return v
	}
	cp := &clusterinventoryv1alpha1.ClusterProfile{}
	err = i.opts.Hub.Get(ctx, client.ObjectKey{Namespace: i.opts.Namespace, Name: name}, cp)
	// Unknown counts as unhealthy, as OCM's Available=Unknown does: it is
	// what a cluster manager reports when it lost touch with the cluster.
	if v, decided := conditionVerdict("ClusterProfile "+name, err, cp.Status.Conditions, clusterinventoryv1alpha1.ClusterConditionControlPlaneHealthy); decided {
		return v
	}
	return verdict{known: true, available: true}
}

// conditionVerdict is one registration's verdict from the read of it (err)
// and its conditions: decided when the read failed (unknown) or the
// condition of that type is there and not True (unavailable); a missing
// registration or condition leaves the verdict to the next one.
func conditionVerdict(what string, err error, conds []metav1.Condition, condType string) (verdict, bool) {
	switch {
	case err != nil && absent(err):
		return verdict{}, false
	case err != nil:
		return verdict{}, true
	}
	c := meta.FindStatusCondition(conds, condType)
	if c == nil || c.Status == metav1.ConditionTrue {
		return verdict{}, false
	}
	return verdict{known: true, since: c.LastTransitionTime.Time,
		reason: fmt.Sprintf("%s is %s=%s (%s)", what, c.Type, c.Status, c.Reason)}, true
}

// absent reports whether a registration read failed only because there is
// no such registration (or no such kind on this hub: OCM not installed).
func absent(err error) bool {
	return apierrors.IsNotFound(err) || meta.IsNoMatchError(err)
}

// lossSince is when an unavailable cluster was lost: the first of the failed
// probes that made it unavailable (or, if an earlier hub process recorded
// the loss and this one has not seen the cluster answer, that record), or
// the time its registration's condition changed; now when neither says.
func lossSince(now time.Time, t *tracked) time.Time {
	since := now
	if t.probeDown {
		since = t.firstFail
		if !t.recorded.IsZero() && t.recorded.Before(since) {
			since = t.recorded
		}
	}
	if !t.regAvailable && !t.regSince.IsZero() && t.regSince.Before(since) {
		since = t.regSince
	}
	return since
}

// Clusters returns a snapshot of every engaged cluster, sorted by name, with
// labels and properties from its registration.
func (i *Inventory) Clusters(ctx context.Context) []Cluster {
	i.mu.Lock()
	out := make([]Cluster, 0, len(i.clusters))
	now := time.Now()
	for _, t := range i.clusters {
		out = append(out, Cluster{Name: t.name, UnavailableSince: t.since, Reason: t.reason, Client: i.guarded(t), Reader: t.cl.GetAPIReader(),
			Fence: i.fenceLocked(t, now)})
	}
	i.mu.Unlock()
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	for k := range out {
		out[k].Labels, out[k].Properties = i.describe(ctx, out[k].Name)
	}
	return out
}

// Registered is a Source of every registered cluster: the engaged ones, and
// those with a registration (a kubeconfig Secret, a ClusterProfile) that
// the hub has not engaged. The provider engages a cluster only once its
// cache syncs, so a hub that starts, or becomes leader, while a spoke is
// down never engages it; placing on Clusters alone would drop that spoke
// as if it had left the fleet and move its replicas at once. Registered
// lists it unavailable since its recorded loss instead (since the hub
// began to lead when nothing is recorded, and then records that), so failover
// waits for the placement's toleration; during the first EngageGrace of
// leading, since the hub began to lead, whatever is recorded. Unengaged clusters have no
// clients: read them only when Available.
func (i *Inventory) Registered() Source { return registeredSource{i} }

type registeredSource struct{ inv *Inventory }

func (r registeredSource) Clusters(ctx context.Context) []Cluster {
	out := r.inv.Clusters(ctx)
	engaged := len(out)
	for _, name := range r.inv.registrations(ctx) {
		if slices.ContainsFunc(out, func(c Cluster) bool { return c.Name == name }) {
			continue
		}
		started := r.inv.startedAt()
		since := r.inv.record.since(ctx, name)
		engaging := time.Since(started) < r.inv.opts.EngageGrace
		switch {
		case engaging:
			// Not yet engaged may mean not yet reached: what an earlier
			// hub recorded counts once the grace is over.
			since = started
		case since.IsZero():
			since = started
			r.inv.record.save(ctx, name, since)
		}
		lbls, props := r.inv.describe(ctx, name)
		out = append(out, Cluster{Name: name, Labels: lbls, Properties: props, UnavailableSince: since, Engaging: engaging,
			Reason: "registered but not engaged: the hub has not reached its API server"})
	}
	if len(out) > engaged {
		sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	}
	return out
}

// registrations names the clusters registered in the namespace: kubeconfig
// Secrets and ClusterProfiles, whichever the provider reads. A kind that
// cannot be listed adds none.
func (i *Inventory) registrations(ctx context.Context) []string {
	var names []string
	secs := &metav1.PartialObjectMetadataList{}
	secs.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("SecretList"))
	if err := i.opts.Hub.List(ctx, secs, client.InNamespace(i.opts.Namespace),
		client.MatchingLabels{kubeconfig.DefaultKubeconfigSecretLabel: "true"}); err == nil {
		for _, s := range secs.Items {
			names = append(names, s.Name)
		}
	}
	cps := &clusterinventoryv1alpha1.ClusterProfileList{}
	if err := i.opts.Hub.List(ctx, cps, client.InNamespace(i.opts.Namespace)); err == nil {
		for _, cp := range cps.Items {
			names = append(names, cp.Name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Cluster returns one engaged cluster.
func (i *Inventory) Cluster(ctx context.Context, name string) (Cluster, bool) {
	for _, c := range i.Clusters(ctx) {
		if c.Name == name {
			return c, true
		}
	}
	return Cluster{}, false
}

// describe merges labels and properties from every registration of the
// cluster: the Secret, the OCM ManagedCluster (labels, cluster claims) and
// the ClusterProfile (labels, properties).
func (i *Inventory) describe(ctx context.Context, name string) (map[string]string, map[string]string) {
	lbls, props := map[string]string{"name": name}, map[string]string{}
	sec := &metav1.PartialObjectMetadata{}
	sec.SetGroupVersionKind(secretGVK)
	if err := i.opts.Hub.Get(ctx, client.ObjectKey{Namespace: i.opts.Namespace, Name: name}, sec); err == nil {
		for k, v := range sec.Labels {
			lbls[k] = v
		}
	}
	mc := &clusterv1.ManagedCluster{}
	if err := i.opts.Hub.Get(ctx, client.ObjectKey{Name: name}, mc); err == nil {
		for k, v := range mc.Labels {
			lbls[k] = v
		}
		for _, c := range mc.Status.ClusterClaims {
			props[c.Name] = c.Value
		}
	}
	cp := &clusterinventoryv1alpha1.ClusterProfile{}
	if err := i.opts.Hub.Get(ctx, client.ObjectKey{Namespace: i.opts.Namespace, Name: name}, cp); err == nil {
		for k, v := range cp.Labels {
			lbls[k] = v
		}
		for _, p := range cp.Status.Properties {
			props[p.Name] = p.Value
		}
	}
	return lbls, props
}
