package epp

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/datastore"

	"github.com/fleetinfer/fleetinfer/epp/prefixes"
	"github.com/fleetinfer/fleetinfer/epp/spill"
)

// forgetInterval is how often the load meter and the prefix record drop
// pods that went away.
const forgetInterval = time.Minute

// gonePods drops, every forgetInterval, what this picker keeps per pod of
// the pods that went away: the load meter's measurements (a picker with or
// without peers meters every pod it sends to) and, with federation, the
// prefix record. Without it a picker running for months, while its pool's
// pods are replaced by every rollout, would keep them for every pod it ever
// sent to.
type gonePods struct {
	ds localPods
	// remote, nil without federation, lists the remote pods the meter
	// also measures while they are published.
	remote remoteEndpoints
	meter  *spill.Meter
	// prefixes is nil without federation.
	prefixes *prefixes.Index
	now      func() time.Time
}

// Start runs the loop until ctx ends (manager.Runnable).
func (g gonePods) Start(ctx context.Context) error {
	wait.UntilWithContext(ctx, func(context.Context) { g.forget() }, forgetInterval)
	return nil
}

func (g gonePods) forget() {
	local, present := g.present()
	if g.prefixes != nil {
		g.prefixes.Retain(func(pod types.NamespacedName) bool { return local[pod] })
	}
	g.meter.Retain(func(pod types.NamespacedName) bool { return local[pod] || present[pod] })
	// A destination idle for longer than any connection idle timeout the
	// spill policy accepts has no connection left.
	g.meter.ForgetCrossingsBefore(g.now().Add(-spill.MaxDestinationIdleTimeout))
}

// present returns the local pods, which the prefix record holds, and the
// remote ones the peers publish now.
func (g gonePods) present() (local, remote map[types.NamespacedName]bool) {
	local, remote = map[types.NamespacedName]bool{}, map[types.NamespacedName]bool{}
	for _, ep := range g.ds.PodList(datastore.AllPodsPredicate) {
		local[ep.GetMetadata().NamespacedName] = true
	}
	if g.remote == nil {
		return local, remote
	}
	for _, v := range g.remote.Remote(g.now()).Peers {
		for i := range v.Entries {
			remote[v.Entries[i].Endpoint.GetMetadata().NamespacedName] = true
		}
	}
	return local, remote
}
