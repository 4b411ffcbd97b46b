// Package engaged records what a multicluster-runtime manager engages: a
// Recorder added to the manager is engaged with every cluster the provider
// brings, as the hub's controllers are, so tests of a provider see what the
// hub would.
package engaged

import (
	"context"
	"maps"
	"strings"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

// Recorder is a multicluster-runtime runnable that remembers the engaged
// clusters and every engagement and disengagement.
type Recorder struct {
	mu   sync.Mutex
	log  []string
	live map[string]cluster.Cluster
}

// New returns an empty recorder; add it to the manager with Add.
func New() *Recorder { return &Recorder{live: map[string]cluster.Cluster{}} }

// Start blocks until the manager stops.
func (r *Recorder) Start(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Engage records the cluster until ctx ends.
func (r *Recorder) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live[string(name)] = cl
	r.log = append(r.log, "+"+string(name))
	go func() {
		<-ctx.Done()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.live[string(name)] == cl {
			delete(r.live, string(name))
		}
		r.log = append(r.log, "-"+string(name))
	}()
	return nil
}

// Cluster is the cluster engaged under name, or nil.
func (r *Recorder) Cluster(name string) cluster.Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.live[name]
}

// Clusters are the engaged clusters by name.
func (r *Recorder) Clusters() map[string]cluster.Cluster {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.live)
}

// History lists engagements (+name) and their ends (-name) in order.
func (r *Recorder) History() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.log, " ")
}
