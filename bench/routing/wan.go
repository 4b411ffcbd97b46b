package main

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetinfer/fleetinfer/localfleet/fedpool"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// simPrefillPerToken is the simulators' prefill time per prompt token not
// in their prefix cache (simLatency's --prefill-time-per-token).
const simPrefillPerToken = 400 * time.Microsecond

// wanSetup is the network the benchmark ran on, for routing.json.
type wanSetup struct {
	PodNetwork string    `json:"pod_network"`
	Mode       string    `json:"federation_mode"`
	Links      []wanLink `json:"links"`
}

type wanLink struct {
	A        string  `json:"a"`
	B        string  `json:"b"`
	RTTMs    float64 `json:"rtt_ms"`
	JitterMs float64 `json:"jitter_ms"`
}

func wanOf(fl *fleet.Fleet) (*wanSetup, error) {
	w := &wanSetup{PodNetwork: string(fl.PodNetwork()), Mode: "Parent"}
	for i, a := range fl.Spokes {
		for _, b := range fl.Spokes[i+1:] {
			l, err := fl.Fabric().Link(a.Name(), b.Name())
			if err != nil {
				return nil, err
			}
			w.Links = append(w.Links, wanLink{A: a.Name(), B: b.Name(), RTTMs: ms(l.RTT), JitterMs: ms(l.Jitter)})
		}
	}
	return w, nil
}

// fabricLinks carries the benchmark's own connections between clusters
// over the fabric's links. The load client and SkyServe's load balancer
// dial from 127.0.0.1, in no cluster, which the fabric passes straight
// through; a client standing in one cluster reaches another's gateway or
// pod over their link, with its jitter, bandwidth and handshake, as
// fleetinfer's gateways do when they forward a crossing. So each address
// reached from another cluster gets a fabric Forward from that cluster,
// made on first use and kept until close.
type fabricLinks struct {
	fabric   *wan.Fabric
	clusters []string

	mu       sync.Mutex
	forwards map[forwardKey]*wan.Server
}

type forwardKey struct {
	from, to int
	host     string
}

// newFabricLinks returns the links of fabric between clusters, named by
// index.
func newFabricLinks(fabric *wan.Fabric, clusters []string) *fabricLinks {
	return &fabricLinks{fabric: fabric, clusters: clusters, forwards: map[forwardKey]*wan.Server{}}
}

func (l *fabricLinks) reach(from, to int, raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	if from < 0 || to < 0 || from >= len(l.clusters) || to >= len(l.clusters) {
		return "", fmt.Errorf("no link from cluster %d to cluster %d", from, to)
	}
	k := forwardKey{from: from, to: to, host: u.Host}
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.forwards[k]
	if s == nil {
		if s, err = l.fabric.Forward("127.0.0.1:0", l.clusters[from], l.clusters[to], u.Host); err != nil {
			return "", err
		}
		l.forwards[k] = s
	}
	u.Host = s.Addr()
	return u.String(), nil
}

// close stops every forward and the connections through them.
func (l *fabricLinks) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, s := range l.forwards {
		_ = s.Close()
		delete(l.forwards, k)
	}
}

// rtt is the current round trip between clusters a and b (0 for a cluster
// to itself).
func (d *deployment) rtt(a, b int) time.Duration {
	l, err := d.fl.Fabric().Link(d.fl.Spokes[a].Name(), d.fl.Spokes[b].Name())
	if err != nil {
		return 0
	}
	return l.RTT
}

// setSlowLink gives the scenario's slowing link its starting round trip,
// and returns what puts the link back as it was.
func (d *deployment) setSlowLink(sc scenario) (restore func() error, err error) {
	sl := sc.SlowLink
	if sl == nil {
		return func() error { return nil }, nil
	}
	a, b := d.fl.Spokes[sl.A].Name(), d.fl.Spokes[sl.B].Name()
	orig, err := d.fl.Fabric().Link(a, b)
	if err != nil {
		return nil, err
	}
	if err := d.setRTT(sl, sl.From); err != nil {
		return nil, err
	}
	return func() error { return d.fl.Fabric().SetLink(a, b, orig) }, nil
}

func (d *deployment) setRTT(sl *slowLink, rtt time.Duration) error {
	a, b := d.fl.Spokes[sl.A].Name(), d.fl.Spokes[sl.B].Name()
	return d.fl.Fabric().SetLink(a, b, wan.Link{RTT: rtt, Jitter: rtt / 20, Bandwidth: wan.DefaultBandwidth})
}

// halfway is what happens to the fleet halfway through a run of sc, nil
// when nothing does: a cluster is lost (router r learns it at once, as
// only the oracle can) or a link slows.
func (d *deployment) halfway(ctx context.Context, sc scenario, r router) func() error {
	switch {
	case sc.Lost >= 0:
		return func() error {
			r.lose(sc.Lost)
			return d.lose(ctx, sc.Lost)
		}
	case sc.SlowLink != nil:
		return func() error { return d.setRTT(sc.SlowLink, sc.SlowLink.To) }
	}
	return nil
}

// warmPrefixes caches each of the scenario's prefixes (policy pol's words)
// in its home cluster, prefix p in cluster p mod 3, the way earlier traffic
// there would have: two requests through the home gateway, picked by the
// policy's own pickers, or, for the oracle, one straight to each of the
// home cluster's pods, which the oracle records. It returns how many
// prefixes two pods hold: the pickers may send a prefix's two requests to
// one pod.
func (d *deployment) warmPrefixes(ctx context.Context, sc scenario, pol string, r router) (int, error) {
	c := newLoadClient(1, 30*time.Second, d.podCluster, nil)
	host := fedpool.Host(stockPool, d.ns)
	if pol == "fleetinfer" {
		host = d.pool.Host()
	}
	type send struct {
		url, host string
		prompt    string
		prefix    int
	}
	var sends []send
	for p := range sc.Prefixes {
		home := p % len(d.fl.Spokes)
		prefix := sc.prefix(pol, p)
		if o, ok := r.(*oracle); ok {
			for _, pod := range d.pool.Members[home].Pods {
				sends = append(sends, send{url: "http://" + pod, prompt: prefix + "warm", prefix: p})
			}
			o.warm(home, p)
			continue
		}
		for i := range 2 {
			sends = append(sends, send{url: d.fl.Spokes[home].GatewayURL(), host: host, prompt: prefix + "warm " + strconv.Itoa(i), prefix: p})
		}
	}
	out := make([]result, len(sends))
	var wg sync.WaitGroup
	for i, s := range sends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = c.do(ctx, &entryRouter{gws: gateways{s.url}, host: s.host}, arrival{Prompt: s.prompt, Prefix: s.prefix}, time.Now())
		}()
	}
	wg.Wait()
	pods := map[int]map[string]bool{}
	for _, res := range out {
		if res.Err != "" {
			return 0, fmt.Errorf("warming prefixes: %s", res.Err)
		}
		if pods[res.Prefix] == nil {
			pods[res.Prefix] = map[string]bool{}
		}
		pods[res.Prefix][res.Pod] = true
	}
	both := 0
	for _, held := range pods {
		if len(held) > 1 {
			both++
		}
	}
	return both, nil
}

// pickerCounts are what fleetinfer's pickers counted, per picker: their
// remote picks, their federation-lag histogram buckets (le → count) and the
// federation bytes they sent to each peer.
type pickerCounts map[int]pickerCount

type pickerCount struct {
	remotePicks float64
	lag         map[float64]float64
	sent        map[string]float64
	// opened is the connections the picker's gateway opened to pickers'
	// destinations (local pods and, in Parent mode, other gateways).
	opened float64
}

// pickerCounts scrapes fleetinfer's pickers and their gateways; none for
// other policies. A picker or gateway that does not answer (its cluster
// lost) is left out.
func (d *deployment) pickerCounts(ctx context.Context, pol string) (pickerCounts, error) {
	if pol != "fleetinfer" {
		return nil, nil
	}
	out := pickerCounts{}
	for i, m := range d.pool.Members {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		series, err := m.EPPMetrics(sctx)
		cancel()
		if err != nil {
			continue
		}
		pc := pickerCount{lag: map[float64]float64{}, sent: map[string]float64{}}
		for name, v := range series {
			switch metrics.Name(name) {
			case "fleetinfer_epp_picks_total":
				if strings.Contains(name, `locality="remote"`) {
					pc.remotePicks += v
				}
			case "fleetinfer_epp_federation_bytes_total":
				if dir, _ := label(name, "direction"); dir == "sent" {
					peer, _ := label(name, "peer")
					pc.sent[peer] += v
				}
			case "fleetinfer_epp_federation_lag_seconds_bucket":
				if le, ok := label(name, "le"); ok {
					f, err := strconv.ParseFloat(le, 64)
					if err == nil {
						pc.lag[f] += v
					}
				}
			}
		}
		if m.Cluster.Gateway != nil {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			series, err := metrics.Scrape(sctx, m.Cluster.Gateway.MetricsURL())
			cancel()
			if err != nil {
				continue
			}
			pc.opened = series[`fleetinfer_gateway_upstream_connections_total{upstream="picked"}`]
		}
		out[i] = pc
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no fleetinfer picker answered for its metrics")
	}
	return out, nil
}

// label returns the value of label k in a series name.
func label(series, k string) (string, bool) {
	_, rest, ok := strings.Cut(series, k+`="`)
	if !ok {
		return "", false
	}
	v, _, ok := strings.Cut(rest, `"`)
	return v, ok
}

// addPickerCounts records, from fleetinfer's pickers' counts before and
// after the run (those that answered both times), the requests forwarded
// twice, the age of remote data at pick time, the federation bytes a
// picker sent a peer per second of the run (its pods' state and prefix
// summaries), the mean over the streams, and the connections the gateways
// opened to the pickers' destinations.
//
// Every request a picker sends to another cluster is one remote pick, and
// the picker there, seeing its verified marks, picks locally; a request
// forwarded twice would be a second remote pick for one crossing. So the
// remote picks beyond the requests served in another cluster than they
// entered, and beyond the failed requests (which may have been picked
// remote before they failed), are forwards twice.
func (r *runResult) addPickerCounts(before, after pickerCounts) {
	if before == nil || after == nil {
		return
	}
	var remote, sent, opened float64
	streams := 0
	lag := map[float64]float64{}
	for i, a := range after {
		b, ok := before[i]
		if !ok {
			continue
		}
		remote += a.remotePicks - b.remotePicks
		opened += a.opened - b.opened
		for le, n := range a.lag {
			lag[le] += n - b.lag[le]
		}
		for peer, n := range a.sent {
			sent += n - b.sent[peer]
			streams++
		}
	}
	if streams > 0 && r.WallS > 0 {
		v := sent / float64(streams) / r.WallS / 1024
		r.FederationKiBps = &v
	}
	r.ForwardedTwice = max(0, int(math.Round(remote))-r.Crossed-r.Errors)
	n := int(math.Round(opened))
	r.ConnectionsOpened = &n
	if p99, ok := bucketQuantile(lag, 0.99); ok {
		v := p99 * 1000
		r.RemoteAgeP99Ms = &v
	}
}

// bucketQuantile is quantile q of a Prometheus histogram's cumulative
// buckets (le → count), interpolated linearly inside its bucket; false
// without observations. Past the largest finite bound it is that bound.
func bucketQuantile(buckets map[float64]float64, q float64) (float64, bool) {
	les := make([]float64, 0, len(buckets))
	for le := range buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	if len(les) == 0 || buckets[les[len(les)-1]] <= 0 {
		return 0, false
	}
	target := q * buckets[les[len(les)-1]]
	lo, below := 0.0, 0.0
	for _, le := range les {
		n := buckets[le]
		if n >= target {
			if math.IsInf(le, 1) {
				return lo, true
			}
			if n == below {
				return le, true
			}
			return lo + (le-lo)*(target-below)/(n-below), true
		}
		lo, below = le, n
	}
	return lo, true
}
