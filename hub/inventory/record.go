package inventory

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RecordName is the ConfigMap, in the registrations' namespace, in which the
// hub records since when each lost cluster has been unavailable: one key per
// cluster, an RFC 3339 time. The toleration before replicas move away counts
// from that time, so a hub that restarts (an upgrade, a crash loop, a
// failover to another replica) more often than the toleration still fails
// over a cluster that stays lost. Only clusters currently unavailable have a
// key; the map is written when a cluster is lost or comes back.
const RecordName = "fleetinfer-hub-availability"

// +kubebuilder:rbac:groups="",namespace=fleetinfer-system,resources=configmaps,verbs=get;create;update

// record reads and writes the availability record. Writing is best effort:
// when it fails the hub keeps its in-memory view, and a restart counts the
// toleration from the restart, as it would without a record.
type record struct {
	hub    client.Client
	reader client.Reader
	key    client.ObjectKey
	log    logr.Logger

	mu      sync.Mutex
	loaded  bool
	written map[string]string // what the ConfigMap holds, as last read or written
}

// since is when an earlier hub recorded the cluster lost; zero if it did not.
func (r *record) since(ctx context.Context, cluster string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loadLocked(ctx)
	t, err := time.Parse(time.RFC3339, r.written[cluster])
	if err != nil {
		return time.Time{}
	}
	return t
}

func (r *record) get(ctx context.Context) (*corev1.ConfigMap, error) {
	reader := r.reader
	if reader == nil {
		reader = r.hub
	}
	cm := &corev1.ConfigMap{}
	return cm, reader.Get(ctx, r.key, cm)
}

func (r *record) loadLocked(ctx context.Context) {
	if r.loaded {
		return
	}
	switch cm, err := r.get(ctx); {
	case err == nil:
		r.written, r.loaded = cm.Data, true
	case apierrors.IsNotFound(err):
		r.written, r.loaded = map[string]string{}, true
	default:
		// Try again at the next engagement or save; until then there is
		// no record to honour.
		r.log.Error(err, "reading the availability record", "configMap", r.key)
	}
}

// save records that cluster is unavailable since the given time, or, for the
// zero time, that it is available. Unchanged values are not written.
func (r *record) save(ctx context.Context, cluster string, since time.Time) {
	want := ""
	if !since.IsZero() {
		want = since.UTC().Format(time.RFC3339)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.loadLocked(ctx)
	if !r.loaded || r.written[cluster] == want {
		return
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := r.get(ctx)
		create := apierrors.IsNotFound(err)
		if err != nil && !create {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if want == "" {
			delete(cm.Data, cluster)
		} else {
			cm.Data[cluster] = want
		}
		switch {
		case create && want == "":
			// nothing recorded, nothing to clear
		case create:
			cm.Namespace, cm.Name = r.key.Namespace, r.key.Name
			err = r.hub.Create(ctx, cm)
		default:
			err = r.hub.Update(ctx, cm)
		}
		if err == nil {
			r.written = cm.Data
		}
		return err
	})
	if err != nil {
		r.log.Error(err, "recording a cluster's availability", "configMap", r.key, "cluster", cluster)
	}
}
