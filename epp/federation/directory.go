package federation

import (
	"bytes"
	"context"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
)

// DirectoryFile follows a peer directory file: it reloads the file when its
// content changes (Kubernetes swaps ConfigMap volumes by symlink, which
// inotify on the file itself misses, so it polls) and keeps the last valid
// version when a change does not parse.
type DirectoryFile struct {
	Path     string
	Interval time.Duration
	Log      logr.Logger

	mu      sync.RWMutex
	current *fleetv1alpha1.PeerDirectory
	raw     []byte
	changes changes
}

// Load reads the file once; it fails when the file is missing or invalid.
func (f *DirectoryFile) Load() error {
	_, err := f.reload()
	return err
}

// Current returns the last valid directory.
func (f *DirectoryFile) Current() *fleetv1alpha1.PeerDirectory {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.current == nil {
		return &fleetv1alpha1.PeerDirectory{}
	}
	return f.current
}

// Changed returns a channel that receives a value after each change.
func (f *DirectoryFile) Changed() <-chan struct{} { return f.changes.channel() }

// changes hands out channels that each receive a value after a change (one
// value stands for any number of changes not yet received).
type changes struct {
	mu   sync.Mutex
	subs []chan struct{}
}

func (c *changes) channel() <-chan struct{} {
	ch := make(chan struct{}, 1)
	c.mu.Lock()
	c.subs = append(c.subs, ch)
	c.mu.Unlock()
	return ch
}

func (c *changes) notify() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (f *DirectoryFile) reload() (bool, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return false, err
	}
	f.mu.RLock()
	same := f.current != nil && bytes.Equal(data, f.raw)
	f.mu.RUnlock()
	if same {
		return false, nil
	}
	d, err := fleetv1alpha1.ParsePeerDirectory(data)
	if err != nil {
		return false, err
	}
	f.mu.Lock()
	f.current, f.raw = d, data
	f.mu.Unlock()
	f.changes.notify()
	return true, nil
}

// Run polls the file until ctx ends.
func (f *DirectoryFile) Run(ctx context.Context) error {
	interval := f.Interval
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if changed, err := f.reload(); err != nil {
				f.Log.Error(err, "Peer directory not reloaded; keeping the previous one", "path", f.Path)
			} else if changed {
				f.Log.Info("Peer directory reloaded", "path", f.Path, "peers", len(f.Current().Peers))
			}
		}
	}
}
