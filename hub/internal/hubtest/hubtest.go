// Package hubtest is the fake fleet the hub's package tests run on: a hub
// and its spokes on fake API servers (package fakeapi), the spokes listed
// to the code under test as the inventory lists them, with what the hub
// wrote recorded, the faults a test injects, and what the test changes of
// a spoke's availability and labels.
package hubtest

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/hub/internal/fence"
	"github.com/fleetinfer/fleetinfer/hub/internal/hubtest/fakeapi"
	"github.com/fleetinfer/fleetinfer/hub/inventory"
)

// HubID is the identity of the hub under test.
const HubID = "hub-under-test"

// HubName is the name the hub's writes are listed under in Fleet.Writes.
const HubName = "hub"

// Spoke is a member cluster of the fleet. What it holds when the fleet
// starts is Objects; Server is its API server once NewFleet started it.
// The other fields are what the inventory reports of it, read on every
// listing, so a test may change them between reconciles.
type Spoke struct {
	*fakeapi.Server
	Name    string
	Objects []client.Object
	// Labels and Properties are its registration's.
	Labels     map[string]string
	Properties map[string]string
	// UnavailableSince and Reason say since when and why the hub cannot
	// reach it; zero while it is available.
	UnavailableSince time.Time
	Reason           string
	// Engaging lists it as registered but not engaged yet, without
	// clients; the inventory lists such a cluster unavailable too, so a
	// test sets UnavailableSince and Reason with it.
	Engaging bool
	// Fence makes it fenced: another hub with this hub's ID holds its hub
	// lease, and its client refuses writes, as the inventory's does.
	Fence fence.Fence
}

// NewSpoke is an available cluster holding objs, labelled with its name as
// OCM labels its ManagedClusters.
func NewSpoke(name string, objs ...client.Object) *Spoke {
	return &Spoke{Name: name, Objects: objs, Labels: map[string]string{"name": name}}
}

// Unavailable makes s unavailable since now for reason.
func (s *Spoke) Unavailable(reason string) *Spoke {
	s.UnavailableSince, s.Reason = time.Now(), reason
	return s
}

// cluster is the inventory's snapshot of s.
func (s *Spoke) cluster() inventory.Cluster {
	c := inventory.Cluster{Name: s.Name, Labels: s.Labels, Properties: s.Properties,
		UnavailableSince: s.UnavailableSince, Reason: s.Reason, Engaging: s.Engaging, Fence: s.Fence}
	if !s.Engaging {
		c.Client, c.Reader = s.Client, s.Reader
	}
	if s.Fence.Fenced() && !s.Engaging {
		c.Client = fence.Guard(s.Client, s.Name, func() fence.Fence { return s.Fence })
	}
	return c
}

// Fleet is a hub and its spokes. It is the inventory.Source of its spokes,
// in the order they were given.
type Fleet struct {
	t      testing.TB
	Hub    *fakeapi.Server
	Events *Events
	spokes []*Spoke
}

// NewFleet starts a hub holding hubObjs and the spokes.
func NewFleet(t testing.TB, hubObjs []client.Object, spokes ...*Spoke) *Fleet {
	t.Helper()
	f := &Fleet{t: t, Hub: fakeapi.New(hubObjs...), Events: NewEvents(), spokes: spokes}
	for _, s := range spokes {
		s.Server = SpokeAPI(s.Objects...)
	}
	return f
}

// SpokeAPI is a spoke's API server holding objs, and nodes that back the
// capacity reports among them.
func SpokeAPI(objs ...client.Object) *fakeapi.Server {
	return fakeapi.NewSpoke(append(objs, nodesBehind(objs)...)...)
}

// Clusters lists the spokes as the inventory would now.
func (f *Fleet) Clusters(ctx context.Context) []inventory.Cluster {
	return only(f.spokes).Clusters(ctx)
}

// Only is a source that lists only the named spokes, as a hub that has
// engaged no other would.
func (f *Fleet) Only(names ...string) inventory.Source {
	var out only
	for _, n := range names {
		out = append(out, f.Spoke(n))
	}
	return out
}

type only []*Spoke

func (o only) Clusters(context.Context) []inventory.Cluster {
	out := make([]inventory.Cluster, 0, len(o))
	for _, s := range o {
		out = append(out, s.cluster())
	}
	return out
}

// Spokes are the fleet's spokes in order.
func (f *Fleet) Spokes() []*Spoke { return f.spokes }

// Spoke is the named spoke; the test fails when there is none.
func (f *Fleet) Spoke(name string) *Spoke {
	f.t.Helper()
	for _, s := range f.spokes {
		if s.Name == name {
			return s
		}
	}
	f.t.Fatalf("no spoke %s", name)
	return nil
}

// Writes is every write the hub made, by cluster (the hub's own under
// HubName); clusters it did not write to are absent.
func (f *Fleet) Writes() map[string][]string {
	out := map[string][]string{}
	if w := f.Hub.Writes(); len(w) > 0 {
		out[HubName] = w
	}
	for _, s := range f.spokes {
		if w := s.Writes(); len(w) > 0 {
			out[s.Name] = w
		}
	}
	return out
}

// ClearWrites forgets the writes so far.
func (f *Fleet) ClearWrites() {
	f.Hub.ClearWrites()
	for _, s := range f.spokes {
		s.ClearWrites()
	}
}

// Get reads obj by key from the API server of the named spoke; false when
// it does not exist.
func (f *Fleet) Get(cluster string, key client.ObjectKey, obj client.Object) bool {
	f.t.Helper()
	err := f.Spoke(cluster).API.Get(context.Background(), key, obj)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return true
}

// Events records Events for a test to read.
type Events struct{ *record.FakeRecorder }

// NewEvents is a recorder with room for more Events than any test records.
func NewEvents() *Events { return &Events{record.NewFakeRecorder(1000)} }

// Drain returns the Events recorded since the last Drain.
func (e *Events) Drain() []string {
	var out []string
	for {
		select {
		case ev := <-e.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}
