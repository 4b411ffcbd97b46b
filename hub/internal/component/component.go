// Package component is what the hub hands each of its controllers. Every
// controller package has one entry, Setup(ctx, Deps, Options): Deps are the
// manager and the inventory every controller shares, Options its own
// settings, whose defaults its withDefaults method sets. hub.Setup calls
// them in turn.
package component

import (
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"

	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// EventSource is the component that the hub's Events name.
const EventSource = "fleetinfer-hub"

// Deps are what the hub's controllers share.
type Deps struct {
	// Manager engages the spokes; its local manager is the hub cluster's.
	Manager mcmanager.Manager
	// Inventory is the fleet's clusters, and the source of the cluster
	// changes the controllers watch.
	Inventory *inventory.Inventory
}

// Hub is the (cached) client of the hub cluster.
func (d Deps) Hub() client.Client { return d.Manager.GetLocalManager().GetClient() }

// HubReader reads the hub cluster's API server, past the cache.
func (d Deps) HubReader() client.Reader { return d.Manager.GetLocalManager().GetAPIReader() }

// Recorder records the hub's Events.
func (d Deps) Recorder() record.EventRecorder {
	return d.Manager.GetLocalManager().GetEventRecorderFor(EventSource)
}
