package fleet

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/controlplane"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
	"github.com/fleetinfer/fleetinfer/localfleet/process"
)

// HubReplica is one hub process of the fleet.
type HubReplica struct {
	Process *process.Process
	// Metrics is its Prometheus endpoint.
	Metrics string
}

// leaderMetric is controller-runtime's gauge of the lease bin/hub holds
// (its leader election ID).
const leaderMetric = `leader_election_master_status{name="fleetinfer-hub"}`

// StartHubReplica starts one more hub process with the fleet's hub
// flags and waits until it is ready (a standby is ready while it waits for
// the lease). With Options.HubReplicas above 1 the replicas elect a leader.
func (f *Fleet) StartHubReplica(ctx context.Context) (*HubReplica, error) {
	f.hubMu.Lock()
	n, args := f.hubsStarted, f.hubArgs
	f.hubsStarted++
	f.hubMu.Unlock()
	name := "hub-controller"
	if n > 0 {
		name = fmt.Sprintf("hub-controller-%d", n)
	}
	p, err := f.startController(ctx, f.Hub, f.Image("hub"), name, args)
	r := &HubReplica{Process: p, Metrics: f.Hub.ControllerMetrics}
	if p != nil {
		f.hubMu.Lock()
		f.hubs = append(f.hubs, r)
		f.hubMu.Unlock()
	}
	return r, err
}

// StopHub stops every hub replica, as an outage or an upgrade of the hub
// does: the spokes keep running what the hub wrote.
func (f *Fleet) StopHub() {
	for _, r := range f.HubReplicas() {
		r.Process.Stop(controlplane.StopGrace)
	}
}

// StartHub starts the fleet's number of hub replicas with args in place of
// Options.HubArgs from now on (a test that needs a flag at its default,
// which the suite sets, brings the hub back so), and waits until one
// leads. A replica that was stopped holds the lease until it expires.
func (f *Fleet) StartHub(ctx context.Context, args []string) error {
	f.hubMu.Lock()
	f.hubArgs = append(slices.Clone(f.hubBaseArgs), args...)
	f.hubMu.Unlock()
	for range max(f.opts.HubReplicas, 1) {
		if _, err := f.StartHubReplica(ctx); err != nil {
			return err
		}
	}
	_, err := f.HubLeader(ctx, time.Minute)
	return err
}

// HubReplicas are the hub processes still running.
func (f *Fleet) HubReplicas() []*HubReplica {
	f.hubMu.Lock()
	defer f.hubMu.Unlock()
	var out []*HubReplica
	for _, r := range f.hubs {
		if !r.Process.Exited() {
			out = append(out, r)
		}
	}
	return out
}

// HubLeader waits up to timeout until exactly one running replica leads
// (controller-runtime's leader_election_master_status) and returns it; a
// single replica without leader election leads by itself. The hub's
// ControllerMetrics then names the leader's endpoint.
func (f *Fleet) HubLeader(ctx context.Context, timeout time.Duration) (*HubReplica, error) {
	deadline := time.Now().Add(timeout)
	for {
		leader, err := f.hubLeader(ctx)
		if err == nil {
			f.Hub.ControllerMetrics = leader.Metrics
			return leader, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no single hub leader after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (f *Fleet) hubLeader(ctx context.Context) (*HubReplica, error) {
	running := f.HubReplicas()
	if f.opts.HubReplicas <= 1 && len(running) == 1 {
		return running[0], nil
	}
	var leading []*HubReplica
	for _, r := range running {
		m, err := metrics.Scrape(ctx, r.Metrics)
		if err != nil {
			return nil, err
		}
		if m[leaderMetric] == 1 {
			leading = append(leading, r)
		}
	}
	if len(leading) != 1 {
		return nil, fmt.Errorf("%d of %d running replicas lead", len(leading), len(running))
	}
	return leading[0], nil
}

// KillHubLeader SIGKILLs the leading hub replica, so that it cannot release
// its lease, and starts a replacement standby, so that the fleet keeps its
// number of replicas. It returns when the leader is dead; another replica
// takes the lease once it expires.
func (f *Fleet) KillHubLeader(ctx context.Context) (killed time.Time, err error) {
	leader, err := f.HubLeader(ctx, time.Minute)
	if err != nil {
		return time.Time{}, err
	}
	leader.Process.Kill()
	killed = time.Now()
	_, err = f.StartHubReplica(ctx)
	return killed, err
}
