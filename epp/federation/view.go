package federation

import (
	"cmp"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	fwkdl "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/datalayer"

	"github.com/fleetinfer/fleetinfer/epp/prefixes"
)

// Remote is the federated view as one pick sees it: every connected peer's
// view, and the staleness cutoff at the pick's time.
type Remote struct {
	Peers []*View
	// Stale is the staleness cutoff: endpoints whose data is vouched for
	// only before it are left out.
	Stale time.Time
}

// View is one peer's endpoints as of its last message, ordered from the
// least to the most loaded: by waiting queue, then KV-cache usage. It is
// immutable, so a pick reads it without locks, and picking the least loaded
// few of a fleet walks the front of each peer's view instead of scanning
// and copying every remote endpoint.
type View struct {
	Origin  *Origin
	Entries []Entry
	// oldest is the earliest Updated among Entries.
	oldest time.Time
	lag    prometheus.Observer
}

// Entry is one remote endpoint in a View.
type Entry struct {
	// Endpoint carries the metadata and origin.
	Endpoint *fwkdl.ModelServer
	// Updated is the local time up to which the peer vouches for the
	// endpoint's data.
	Updated time.Time
	// Prefixes is the endpoint's prefix summary, nil without one.
	Prefixes *prefixes.Summary

	// metrics are the endpoint's when the view was built; queue and kv are
	// read from them once, for a pick's scan.
	metrics *fwkdl.Metrics
	queue   int
	running int
	kv      float64
	hop     string
}

// Queue is the endpoint's waiting queue.
func (e *Entry) Queue() int { return e.queue }

// Running is the endpoint's running requests.
func (e *Entry) Running() int { return e.running }

// KVCacheUsage is the endpoint's KV-cache usage, a fraction.
func (e *Entry) KVCacheUsage() float64 { return e.kv }

// NextHop is where the entry gateway sends a request picked to the
// endpoint (see the function NextHop).
func (e *Entry) NextHop() string { return e.hop }

// Read is when the peer read the endpoint's counts, its scrape, in this
// picker's clock. Updated may be later: it also covers the peer's messages
// since that left them unchanged.
func (e *Entry) Read() time.Time { return e.metrics.UpdateTime }

// NewView returns the view of origin's endpoints with their current metrics
// and metadata, as the store builds one from a peer's messages. It orders
// entries in place.
func NewView(origin *Origin, entries []Entry) *View {
	for i := range entries {
		entries[i].metrics = entries[i].Endpoint.GetMetrics()
		entries[i].hop = NextHop(origin, entries[i].Endpoint.GetMetadata())
	}
	slices.SortStableFunc(entries, func(a, b Entry) int { return compareLoad(a.metrics, b.metrics) })
	v := &View{Origin: origin, Entries: entries}
	v.index()
	return v
}

// index fills what a view derives from its entries' metrics.
func (v *View) index() {
	for i := range v.Entries {
		e := &v.Entries[i]
		e.queue, e.running, e.kv = e.metrics.WaitingQueueSize, e.metrics.RunningRequestsSize, e.metrics.KVCacheUsagePercent
		if i == 0 || e.Updated.Before(v.oldest) {
			v.oldest = e.Updated
		}
	}
}

// compareLoad orders metrics by waiting queue, then KV-cache usage.
func compareLoad(a, b *fwkdl.Metrics) int {
	if c := cmp.Compare(a.WaitingQueueSize, b.WaitingQueueSize); c != 0 {
		return c
	}
	return cmp.Compare(a.KVCacheUsagePercent, b.KVCacheUsagePercent)
}

// Oldest returns the earliest data time among the view's endpoints that are
// not stale, and whether there is one.
func (v *View) Oldest(stale time.Time) (time.Time, bool) {
	if len(v.Entries) == 0 {
		return time.Time{}, false
	}
	if !v.oldest.Before(stale) {
		return v.oldest, true
	}
	var oldest time.Time
	for i := range v.Entries {
		if t := v.Entries[i].Updated; !t.Before(stale) && (oldest.IsZero() || t.Before(oldest)) {
			oldest = t
		}
	}
	return oldest, !oldest.IsZero()
}

// ObserveLag records, for every peer with fresh endpoints, the age at now of
// its stalest fresh data: the federation lag a pick sees.
func (r Remote) ObserveLag(now time.Time) {
	for _, v := range r.Peers {
		oldest, ok := v.Oldest(r.Stale)
		if !ok {
			continue
		}
		o := v.lag
		if o == nil {
			o = lag.WithLabelValues(v.Origin.Cluster)
		}
		o.Observe(now.Sub(oldest).Seconds())
	}
}

// AppendFresh appends every endpoint that is not stale to dst.
func (r Remote) AppendFresh(dst []fwkdl.Endpoint) []fwkdl.Endpoint {
	var fresh []*Entry
	for _, v := range r.Peers {
		for i := range v.Entries {
			if e := &v.Entries[i]; !e.Updated.Before(r.Stale) {
				fresh = append(fresh, e)
			}
		}
	}
	return AppendEndpoints(dst, fresh)
}

// AppendEndpoints appends the entries' endpoints to dst as a pick hands them
// to GIE: with the view's metrics, dated Updated.
func AppendEndpoints(dst []fwkdl.Endpoint, entries []*Entry) []fwkdl.Endpoint {
	eps := make([]pickEndpoint, len(entries))
	for i, e := range entries {
		eps[i] = pickEndpoint{ModelServer: e.Endpoint, metrics: *e.metrics}
		eps[i].metrics.UpdateTime = e.Updated
		dst = append(dst, &eps[i])
	}
	return dst
}

// pickEndpoint is a remote endpoint as one pick sees it.
type pickEndpoint struct {
	*fwkdl.ModelServer
	metrics fwkdl.Metrics
}

func (e *pickEndpoint) GetMetrics() *fwkdl.Metrics { return &e.metrics }
