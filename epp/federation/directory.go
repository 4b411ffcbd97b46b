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
	subs    []chan struct{}
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
func (f *DirectoryFile) Changed() <-chan struct{} {
	ch := make(chan struct{}, 1)
	f.mu.Lock()
	f.subs = append(f.subs, ch)
	f.mu.Unlock()
	return ch
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
	subs := f.subs
	f.mu.Unlock()
	for _, ch := range subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
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
