package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/testutil"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/loadgen"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The fault tests run each fault under steady open-loop load through the
// gateway of every cluster a service runs in, and count what the fault
// cost: failed requests, copies the hub deleted, pods replaced.

// routedService is gpuService with a route on each cluster's gateway (and
// an endpoint picker), so that requests can enter there.
func routedService(ns, name string, replicas int32) *v1alpha2.LLMInferenceService {
	svc := gpuService(ns, name, replicas, 1)
	svc.Spec.Router = &v1alpha2.RouterSpec{Scheduler: &v1alpha2.SchedulerSpec{},
		Route: &v1alpha2.GatewayRoutesSpec{}, Gateway: &v1alpha2.GatewaySpec{}}
	return svc
}

// noFederation keeps the pickers of a placement's clusters apart: the fault
// tests count the hub's decisions, not federation.
var noFederation = fleetv1alpha1.Federation{Mode: fleetv1alpha1.FederationDisabled}

// steadyLoad is open-loop load at a fixed average rate, running until
// stopped or its time limit.
type steadyLoad struct {
	cancel  context.CancelFunc
	done    chan struct{}
	results []loadgen.Result
}

// startLoad sends requests to the service at rate per second through the
// gateway of every cluster the hub reports a copy URL for (or of the
// clusters named in through), evenly, for at most limit (the rate bounds
// the count). It waits until the service answers through each gateway, so
// that failures count the fault, not the start-up.
func startLoad(t *testing.T, ns, name string, rate float64, limit time.Duration, through ...string) *steadyLoad {
	t.Helper()
	return startLoadVia(t, fl.Hub, ns, name, rate, limit, through...)
}

// startLoadVia is startLoad for the service of another fleet's hub.
func startLoadVia(t *testing.T, hub *fleet.Cluster, ns, name string, rate float64, limit time.Duration, through ...string) *steadyLoad {
	t.Helper()
	var entries []loadgen.Entry
	testutil.Eventually(t, 60*time.Second, "the service answers through every gateway it runs behind", func(ctx context.Context) error {
		svc := &v1alpha2.LLMInferenceService{}
		if err := hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
			return err
		}
		entries = entries[:0]
		for _, c := range svc.Status.Clusters {
			if len(through) > 0 && !slices.Contains(through, c.Name) {
				continue
			}
			if c.URL == "" {
				return fmt.Errorf("%s reports no URL yet", c.Name)
			}
			e := loadgen.Entry{Name: c.Name, URL: c.URL, Weight: 1}
			if r := loadgen.Send(ctx, http.DefaultClient, e, "opt", "are you there", 2); !r.OK() {
				return fmt.Errorf("through %s: %s (status %d)", c.Name, r.Err, r.Status)
			}
			entries = append(entries, e)
		}
		if len(entries) == 0 {
			return fmt.Errorf("no copy reported")
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	l := &steadyLoad{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.results = loadgen.Run(ctx, loadgen.Options{Entries: entries, Rate: rate, Duration: limit, MaxInFlight: 64,
			Timeout: 20 * time.Second, Model: "opt", MaxTokens: 4, Seed: 14,
			Prompt: func(i int) string { return fmt.Sprintf("steady %s %d", name, i) }})
	}()
	t.Cleanup(l.finish)
	return l
}

func (l *steadyLoad) finish() {
	l.cancel()
	<-l.done
}

// loadFigures is what the load saw.
type loadFigures struct {
	Sent, Failed int
	// Errors counts the failures by message.
	Errors map[string]int
}

func (f loadFigures) String() string {
	s := fmt.Sprintf("%d/%d requests failed", f.Failed, f.Sent)
	if f.Failed > 0 {
		keys := slices.Sorted(maps.Keys(f.Errors))
		var parts []string
		for _, k := range keys[:min(len(keys), 3)] {
			parts = append(parts, fmt.Sprintf("%dx %q", f.Errors[k], k))
		}
		s += " (" + strings.Join(parts, "; ") + ")"
	}
	return s
}

// stop ends the load, waits for the requests in flight and counts.
func (l *steadyLoad) stop() loadFigures {
	l.finish()
	f := loadFigures{Sent: len(l.results), Errors: map[string]int{}}
	for _, r := range l.results {
		if !r.OK() {
			f.Failed++
			msg := r.Err
			if len(msg) > 80 {
				msg = msg[:80]
			}
			f.Errors[msg]++
		}
	}
	return f
}

// podUIDs records the UID of every pod of the service across the spokes,
// by cluster/name.
func podUIDs(t *testing.T, ns, name string) map[string]types.UID {
	t.Helper()
	out := map[string]types.UID{}
	for _, s := range fl.Spokes {
		if !s.Running() {
			continue
		}
		pods, err := podsOf(context.Background(), s, ns, map[string]string{"app.kubernetes.io/name": name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			out[s.Name()+"/"+p.Name] = p.UID
		}
	}
	return out
}

// replacedPods says which of the pods recorded before are gone or have
// another UID now.
func replacedPods(t *testing.T, ns, name string, before map[string]types.UID) []string {
	t.Helper()
	now := podUIDs(t, ns, name)
	var out []string
	for k, uid := range before {
		if now[k] != uid {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// hubDeletes lists the deletions of service copies (LLMInferenceServices)
// of namespace ns by the hub in every spoke's audit log since since.
func hubDeletes(t *testing.T, ns string, since time.Time) []string {
	t.Helper()
	var out []string
	forEachHubWrite(t, since, func(cluster, verb, uri string, _ time.Time) {
		if verb == "delete" && strings.Contains(uri, "/namespaces/"+ns+"/llminferenceservices/") {
			out = append(out, cluster+": "+uri)
		}
	})
	return out
}

// reportFault prints one case's figures on a line of its own, for
// collection (`go test ./e2e -run TestFault -v | grep ^FAULT`).
func reportFault(name, format string, args ...any) {
	fmt.Printf("FAULT %s: %s\n", name, fmt.Sprintf(format, args...))
}

// fleetReadyPods counts the Ready model-server pods of the service across
// the running spokes, in all and by cluster.
func fleetReadyPods(ctx context.Context, ns, name string) (int, map[string]int32, error) {
	n, by := 0, map[string]int32{}
	for _, s := range fl.Spokes {
		if !s.Running() {
			continue
		}
		ready, err := readyPods(ctx, s, ns, name)
		if err != nil {
			return 0, nil, err
		}
		n += len(ready)
		if len(ready) > 0 {
			by[s.Name()] = int32(len(ready))
		}
	}
	return n, by, nil
}
