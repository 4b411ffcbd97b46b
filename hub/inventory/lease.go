package inventory

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/fleetinfer/fleetinfer/hub/internal/fence"
)

// The hub's lease in each cluster (package fence): while the hub leads it
// acquires and renews the lease of its hub ID in every engaged cluster, and
// the clients Clusters hands out refuse writes where it does not hold it.

// Defaults of Options.Lease.Duration and Options.LeaseRenewPeriod.
const (
	DefaultLeaseDuration    = 40 * time.Second
	DefaultLeaseRenewPeriod = 10 * time.Second
)

var leaseHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "fleetinfer_hub_spoke_lease_held",
	Help: "Whether this hub holds its hub lease in a cluster (1), and so writes there, or not (0): another hub with the same hub ID holds it, or it could not be acquired.",
}, []string{"cluster"})

func init() {
	ctrlmetrics.Registry.MustRegister(leaseHeld)
}

// fencing reports whether the inventory fences writes: a hub ID names the
// lease. Tests of what it lists leave it out.
func (i *Inventory) fencing() bool { return i.opts.Lease.HubID != "" }

// guarded is t's client, fenced by t's lease.
func (i *Inventory) guarded(t *tracked) client.Client {
	if !i.fencing() {
		return t.cl.GetClient()
	}
	return fence.Guard(t.cl.GetClient(), t.name, func() fence.Fence {
		i.mu.Lock()
		defer i.mu.Unlock()
		return i.fenceLocked(t, time.Now())
	})
}

// fenceLocked is what t's lease refuses at now; i.mu is held.
func (i *Inventory) fenceLocked(t *tracked, now time.Time) fence.Fence {
	if !i.fencing() {
		return fence.Fence{}
	}
	return t.lease.Fence(i.opts.Lease, now)
}

// keepLeases renews the lease in every engaged cluster at once, then every
// LeaseRenewPeriod, until ctx ends.
func (i *Inventory) keepLeases(ctx context.Context) {
	if !i.fencing() {
		return
	}
	tick := time.NewTicker(i.opts.LeaseRenewPeriod)
	defer tick.Stop()
	for {
		i.renewLeases(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// renewLeases renews the lease in every engaged cluster, all at once.
func (i *Inventory) renewLeases(ctx context.Context) {
	var wg sync.WaitGroup
	for _, t := range i.engaged() {
		wg.Go(func() { i.renewLease(ctx, t) })
	}
	wg.Wait()
}

// renewLease acquires or renews t's lease, within one renew period, and
// announces a change of the fence or the holder: the metric, a log line,
// and the subscribers, whose controllers then write, or stop writing.
func (i *Inventory) renewLease(ctx context.Context, t *tracked) {
	if !i.fencing() {
		return
	}
	t.leaseMu.Lock()
	defer t.leaseMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, i.opts.LeaseRenewPeriod)
	defer cancel()
	i.mu.Lock()
	prev := t.lease
	i.mu.Unlock()
	now := time.Now()
	next := fence.Keep(ctx, t.cl.GetAPIReader(), t.cl.GetClient(), i.opts.Lease, prev, now)
	i.mu.Lock()
	t.lease = next
	was, is := t.announced, i.fenceLocked(t, now)
	changed := was.Reason != is.Reason || prev.Holder != next.Holder
	t.announced = is
	i.mu.Unlock()
	if !changed {
		return
	}
	held := 0.0
	if !is.Fenced() {
		held = 1
	}
	leaseHeld.WithLabelValues(t.name).Set(held)
	key := fence.LeaseKey(i.opts.Lease.HubID)
	if is.Fenced() {
		i.opts.Log.Info("hub lease not held: writes to the cluster stop", "cluster", t.name, "lease", key, "holder", next.Holder,
			"reason", is.Reason, "message", is.Message)
	} else {
		i.opts.Log.Info("hub lease held: writes to the cluster proceed", "cluster", t.name, "lease", key, "previousHolder", prev.Holder)
	}
	i.notify(t.name)
}
