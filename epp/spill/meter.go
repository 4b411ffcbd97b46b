package spill

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Meter measures what the estimate needs of the endpoints this picker
// sends requests to, by endpoint name (a remote endpoint's carries its
// cluster): the requests it has in flight to
// each, and, for local pods, how long requests take there and how many run
// at once, whose quotient is the pod's service rate. It is safe for
// concurrent use. A nil *Meter measures nothing: every pod then has no
// requests in flight and the default service rate.
//
// Requests picked by other pickers are not timed here; in Parent mode every
// request served by a local pod passes this picker (peers forward to its
// gateway), so the local measurements cover all of them.
type Meter struct {
	mu   sync.RWMutex
	pods map[types.NamespacedName]*podMeter
	// poolRate follows the local pods' measured rates (requests/s, as
	// float64 bits): the prior for remote pods, which serve the same model.
	poolRate atomic.Uint64
	// poolSlots is the largest batch of a local pod (podMeter.slots): that
	// of remote pods, which serve the same model.
	poolSlots atomic.Int64
	// paths holds, per remote cluster, how long crossed requests took to
	// their response headers (ns, each sample moving it a fifth of the
	// way): the round trip plus what the crossing passes on the way (the
	// other cluster's gateway and picker in Parent mode), which pings of
	// the federation stream do not see.
	paths sync.Map // cluster → *atomic.Int64
	// sent holds, per destination a crossing's gateway connects to
	// (federation.NextHop), when this picker last sent a request there
	// (unix ns): whether the gateway still keeps a connection open to it.
	sent sync.Map // destination → *atomic.Int64
	// changed receives, without blocking, when a request starts or ends:
	// the load this picker knows of its pods (Load) changed.
	changed chan struct{}
}

type podMeter struct {
	inflight atomic.Int64
	// mu guards open and ran.
	mu sync.Mutex
	// open holds this picker's requests in flight to the pod: when each
	// was sent, and how many were in flight before it, so that one that
	// waited for a slot is no sample of the time a request holds one.
	open []opened
	// ran holds when the last timed requests at the pod started and ended
	// (a ring), so that a scrape taken before some of them ended is not
	// read as if they still ran (ranAcross).
	ran  [16]span
	next int
	// service is the mean time a request holds a slot of the pod's batch:
	// from the pick to the end of its response, for requests picked while
	// the pod had a free slot, in ns (each sample moves it a fifth of the
	// way); 0 before the first. A request that queued behind a full batch
	// also took its wait, which a burst would otherwise read as a slower
	// pod: a lower rate, so a higher estimate for every pod, local and
	// remote, just when crossing helps most.
	service atomic.Int64
	// seen is the most requests seen running at once, and batch the most
	// seen running while others waited: the pod's batch size (a
	// continuous-batching server queues a request only when its batch is
	// full), 0 until the pod has queued.
	seen, batch atomic.Int64
}

// NewMeter returns a meter that has measured nothing yet.
func NewMeter() *Meter {
	return &Meter{pods: map[types.NamespacedName]*podMeter{}, changed: make(chan struct{}, 1)}
}

// Changed receives after requests start or end, once for any number of
// them since the last receive.
func (m *Meter) Changed() <-chan struct{} { return m.changed }

func (m *Meter) signal() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

func (m *Meter) pod(addr types.NamespacedName) *podMeter {
	m.mu.RLock()
	p := m.pods[addr]
	m.mu.RUnlock()
	if p != nil {
		return p
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p = m.pods[addr]; p == nil {
		p = &podMeter{}
		m.pods[addr] = p
	}
	return p
}

// lookup returns the pod's meter, nil when nothing was measured of it.
func (m *Meter) lookup(addr types.NamespacedName) *podMeter {
	if m == nil {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.pods[addr]
}

// Retain drops the measurements of the pods keep rejects (pods that went
// away), so that a picker running for months does not keep one for every
// pod that ever came and went. A pod with a request of this picker still
// in flight keeps its meter: the request's end must find it.
func (m *Meter) Retain(keep func(types.NamespacedName) bool) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for addr, p := range m.pods {
		if p.inflight.Load() <= 0 && !keep(addr) {
			delete(m.pods, addr)
		}
	}
}

// opened is a request in flight: when it was sent, and how many of this
// picker's requests were in flight to the pod before it.
type opened struct {
	at    time.Time
	ahead int64
}

// Started records a request sent to the endpoint addr at at, its pick.
func (m *Meter) Started(addr types.NamespacedName, at time.Time) {
	if m == nil {
		return
	}
	p := m.pod(addr)
	ahead := p.inflight.Add(1) - 1
	p.mu.Lock()
	p.open = append(p.open, opened{at: at, ahead: ahead})
	p.mu.Unlock()
	m.signal()
}

// sentAfter is how many of this picker's requests in flight to the pod it
// sent after t.
func (p *podMeter) sentAfter(t time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, o := range p.open {
		if o.at.After(t) {
			n++
		}
	}
	return n
}

// span is when a request at a pod started and ended.
type span struct{ start, end time.Time }

// Finished records the end of the request Started at addr at at. sample
// says whether its time is a sample of the pod's service time: it
// completed, on a local pod (an error, a request the client gave up or one
// served in another cluster is none).
func (m *Meter) Finished(addr types.NamespacedName, at time.Time, sample bool) {
	m.finished(addr, span{start: at, end: time.Now()}, sample)
}

func (m *Meter) finished(addr types.NamespacedName, ran span, sample bool) {
	if m == nil {
		return
	}
	p := m.pod(addr)
	p.inflight.Add(-1)
	p.mu.Lock()
	// Without a record of it (never Started), the request is taken as
	// one that had a slot.
	var o opened
	if i := slices.IndexFunc(p.open, func(o opened) bool { return o.at.Equal(ran.start) }); i >= 0 {
		o = p.open[i]
		p.open = slices.Delete(p.open, i, i+1)
	} else if len(p.open) > 0 {
		p.open = p.open[1:]
	}
	took := ran.end.Sub(ran.start)
	if sample && took > 0 {
		p.ran[p.next] = ran
		p.next = (p.next + 1) % len(p.ran)
	}
	p.mu.Unlock()
	m.signal()
	if slots := p.batch.Load(); !sample || took <= 0 || slots > 0 && o.ahead >= slots {
		return
	}
	p.service.Store(movedTowards(p.service.Load(), int64(took)))
	if r, ok := p.rate(); ok {
		pool := loadFloat(&m.poolRate)
		if pool > 0 {
			r = pool + (r-pool)/5
		}
		storeFloat(&m.poolRate, r)
	}
}

// ranAcross is how many of the last timed requests at the pod were
// running at scrape and have ended since: a scrape's running count that
// still includes them overstates the pod's load.
func (p *podMeter) ranAcross(scrape time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.ran {
		if r.start.Before(scrape) && r.end.After(scrape) {
			n++
		}
	}
	return n
}

// Scraped records a scrape of the local pod addr, taken at scrape, and
// returns the pod's waiting and running requests as this picker knows them
// now.
//
// The scrape teaches the pod's batch size (see slots): the most requests
// it ran at once, and whether others waited behind them. Every reader of
// the scrapes calls it, the federation's publisher every interval while
// peers subscribe as well as the estimate at each pick, so that a burst's
// peak is learned even when no pick reads the scrape that shows it (a pod
// that ran four at once between picks is not taken for one with room for
// a fifth).
//
// The load is the scrape's, less the requests this picker saw end since
// the scrape, or, when more, its own requests in flight to the pod, which
// include those it sent since. In Parent mode every request to a local pod
// passes this picker, so for a local pod that is the pod's load without
// the scrape's lag. The estimate of a local pod reads it, and the
// federation publishes it, so that peers estimate the pod as this picker
// does.
func (m *Meter) Scraped(addr types.NamespacedName, waiting, running int, scrape time.Time) (int, int) {
	_, waiting, running = m.scraped(addr, waiting, running, scrape)
	return waiting, running
}

// scraped is Scraped, which also returns the pod's meter (nil when the
// pod has none), so that the estimate looks the pod up once.
func (m *Meter) scraped(addr types.NamespacedName, waiting, running int, scrape time.Time) (*podMeter, int, int) {
	if m == nil {
		return nil, waiting, running
	}
	p := m.lookup(addr)
	if p == nil && running+waiting > 0 {
		p = m.pod(addr)
	}
	if p != nil {
		m.sawRunning(p, running, waiting)
	}
	waiting, running = p.load(waiting, running, scrape)
	return p, waiting, running
}

// load is the load Scraped returns, for the pod's meter; a nil one leaves
// the scrape as it is.
func (p *podMeter) load(waiting, running int, scrape time.Time) (int, int) {
	if p == nil {
		return waiting, running
	}
	if running > 0 {
		running = max(running-p.ranAcross(scrape), 0)
	}
	if n := int(p.inflight.Load()); n > waiting+running {
		running = n - waiting
	}
	return waiting, running
}

// sawRunning records a scrape of the local pod p: running requests at
// once, and waiting ones behind them.
func (m *Meter) sawRunning(p *podMeter, running, waiting int) {
	p.sawRunning(running, waiting)
	raise(&m.poolSlots, p.slots())
}

// sawRunning records the scrape in the pod's own meter only.
func (p *podMeter) sawRunning(running, waiting int) {
	raise(&p.seen, int64(running))
	if waiting > 0 {
		raise(&p.batch, int64(running))
	}
}

// raise sets v to n if n is larger.
func raise(v *atomic.Int64, n int64) {
	for {
		cur := v.Load()
		if n <= cur || v.CompareAndSwap(cur, n) {
			return
		}
	}
}

// slots is the pod's batch size. Until the pod has queued, it is taken as
// one more than the pod was ever seen running, so that a pod that has run
// one request at a time is not read as full with one.
func (p *podMeter) slots() int64 {
	if b := p.batch.Load(); b > 0 {
		return b
	}
	return p.seen.Load() + 1
}

// rate is the requests per second the pod completes with its batch full:
// its batch size over its service time.
func (p *podMeter) rate() (float64, bool) {
	service := p.service.Load()
	if service <= 0 {
		return 0, false
	}
	return float64(p.slots()) / time.Duration(service).Seconds(), true
}

// PoolRate returns the local pods' measured service rate, false before any
// was measured.
func (m *Meter) PoolRate() (float64, bool) {
	if m == nil {
		return 0, false
	}
	r := loadFloat(&m.poolRate)
	return r, r > 0
}

// PoolSlots returns the largest batch size of a local pod (one more than
// it ran at once until it queued), 0 before any was scraped.
func (m *Meter) PoolSlots() int {
	if m == nil {
		return 0
	}
	return int(m.poolSlots.Load())
}

func loadFloat(u *atomic.Uint64) float64 { return math.Float64frombits(u.Load()) }

func storeFloat(u *atomic.Uint64, f float64) { u.Store(math.Float64bits(f)) }

// Crossed records that a request's crossing to cluster took took: from
// its pick to its response headers, less the time the other cluster spent
// on it after its own pick.
func (m *Meter) Crossed(cluster string, took time.Duration) {
	if m == nil || took <= 0 {
		return
	}
	v, ok := m.paths.Load(cluster)
	if !ok {
		v, _ = m.paths.LoadOrStore(cluster, new(atomic.Int64))
	}
	p := v.(*atomic.Int64)
	for {
		cur := p.Load()
		if p.CompareAndSwap(cur, movedTowards(cur, int64(took))) {
			return
		}
	}
}

// movedTowards is a moving average cur (0: none yet) moved a fifth of the
// way to sample.
func movedTowards(cur, sample int64) int64 {
	if cur <= 0 {
		return sample
	}
	return cur + (sample-cur)/5
}

// CrossedAt records that this picker sent a request to the remote
// destination dest at at.
func (m *Meter) CrossedAt(dest string, at time.Time) {
	if m == nil {
		return
	}
	v, ok := m.sent.Load(dest)
	if !ok {
		v, _ = m.sent.LoadOrStore(dest, new(atomic.Int64))
	}
	raise(v.(*atomic.Int64), at.UnixNano())
}

// ForgetCrossingsBefore drops the destinations this picker last sent to
// before t, so that one running for months does not keep every remote pod
// it ever crossed to (Endpoint mode). A destination forgotten counts as
// one without a connection.
func (m *Meter) ForgetCrossingsBefore(t time.Time) {
	if m == nil {
		return
	}
	m.sent.Range(func(k, v any) bool {
		if v.(*atomic.Int64).Load() < t.UnixNano() {
			m.sent.CompareAndDelete(k, v)
		}
		return true
	})
}

// sentSince reports whether this picker sent a request to dest after t.
func (m *Meter) sentSince(dest string, t time.Time) bool {
	if m == nil {
		return false
	}
	v, ok := m.sent.Load(dest)
	return ok && v.(*atomic.Int64).Load() > t.UnixNano()
}

// Path returns the measured time of a crossing to cluster (see Crossed),
// 0 before any was measured.
func (m *Meter) Path(cluster string) time.Duration {
	if m == nil {
		return 0
	}
	if v, ok := m.paths.Load(cluster); ok {
		return time.Duration(v.(*atomic.Int64).Load())
	}
	return 0
}
