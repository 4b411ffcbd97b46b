// Package demo is what `make demo` runs: it brings up the local fleet,
// applies KServe's GPU sample and an InferencePlacement to the hub, waits
// until the service is Ready in every cluster, and drives the same skewed
// load twice — most requests entering the smallest cluster — first with each
// cluster's endpoint picker on its own, then with the pickers federated. It
// ends with a summary and a report (Markdown with SVG plots).
package demo

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/internal/accelerator"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/kubelet"
	"github.com/fleetinfer/fleetinfer/localfleet/loadgen"
	"github.com/fleetinfer/fleetinfer/localfleet/wan"
)

// Options configures a demo run.
type Options struct {
	// Spokes is the number of GPU clusters (default 3).
	Spokes int
	// Replicas is the service's total replicas across the fleet (default 6).
	Replicas int32
	// LoadDuration is the length of each of the two load phases.
	LoadDuration time.Duration
	// Rate is the average arrival rate (requests per second).
	Rate float64
	// HotShare is the share of requests that enter the hot cluster; the
	// rest are split evenly over the others.
	HotShare float64
	// HotCluster is where most requests enter; default the last spoke (the
	// smallest in the default fleet).
	HotCluster string
	// MaxTokens is each completion's length.
	MaxTokens int
	// ReportDir receives report.md and its plots.
	ReportDir string
	// Dir keeps the fleet's state and logs there instead of a temporary
	// directory that is removed at the end.
	Dir string
	// Network is the matrix of links between the clusters (nil: the
	// fleet's default) and PodNetwork the pod-network mode (default
	// isolated); see fleet.Options.
	Network    *wan.Matrix
	PodNetwork wan.PodNetwork
	Out        io.Writer
}

func (o *Options) defaults() {
	if o.Spokes <= 0 {
		o.Spokes = 3
	}
	if o.Replicas <= 0 {
		o.Replicas = 6
	}
	if o.LoadDuration <= 0 {
		o.LoadDuration = 40 * time.Second
	}
	if o.Rate <= 0 {
		o.Rate = 12
	}
	if o.HotShare <= 0 || o.HotShare > 1 {
		o.HotShare = 0.75
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = 40
	}
	if o.ReportDir == "" {
		o.ReportDir = "demo-report"
	}
}

// Run runs the demo.
func Run(ctx context.Context, opts Options) error {
	opts.defaults()
	out := opts.Out
	began := time.Now()
	step := func(format string, a ...any) {
		fmt.Fprintf(out, "==> [%s] %s\n", time.Since(began).Round(time.Second), fmt.Sprintf(format, a...))
	}
	step("Starting the local fleet: 1 hub + %d GPU clusters (real kube-apiserver, etcd, controller-manager, scheduler each; fleetinfer's hub and spoke controllers; a gateway per cluster)", opts.Spokes)
	f, err := fleet.Start(ctx, fleet.Options{Dir: opts.Dir, Spokes: Spokes(opts.Spokes), Network: opts.Network,
		PodNetwork: opts.PodNetwork, Log: ProgressLog(out)})
	if err != nil {
		if f != nil {
			f.Stop()
		}
		return fmt.Errorf("local fleet did not start: %w", err)
	}
	defer f.Stop()
	if err := f.WaitPlaceable(ctx, 2*time.Minute); err != nil {
		return err
	}
	step("Fleet up in %.1fs; the hub sees every cluster's GPUs", time.Since(began).Seconds())
	printStatus(ctx, out, f)
	printAccess(out, f)
	printNetwork(out, f)
	if opts.HotCluster == "" {
		opts.HotCluster = f.Spokes[len(f.Spokes)-1].Name()
	}
	if f.Spoke(opts.HotCluster) == nil {
		return fmt.Errorf("--hot-cluster %q is not one of the spokes", opts.HotCluster)
	}

	svc, err := sample()
	if err != nil {
		return err
	}
	pl := placement(svc, opts.Replicas)
	step("Applying KServe's sample %s (%s) and an InferencePlacement to the hub: %d replicas over every cluster by free GPUs (FreeCapacity), federation off",
		svc.Name, samplePath, opts.Replicas)
	if err := apply(ctx, f, svc, pl); err != nil {
		return err
	}
	key := client.ObjectKeyFromObject(svc)
	ready, err := waitReady(ctx, out, f, key, 5*time.Minute)
	if err != nil {
		return err
	}
	step("Ready everywhere; placement decided by the hub:")
	printPlacement(out, f, ready)

	entries := entriesFor(ready, opts.HotCluster, opts.HotShare)
	clusters := make([]string, 0, len(entries))
	for _, e := range entries {
		clusters = append(clusters, e.Name)
	}
	var phases []phaseStats
	run := func(name string) error {
		step("Load phase %q: %.0f requests/s for %s, %.0f%% entering %s, %d-token streamed completions",
			name, opts.Rate, opts.LoadDuration, 100*opts.HotShare, opts.HotCluster, opts.MaxTokens)
		start := time.Now()
		res := loadgen.Run(ctx, loadgen.Options{Entries: entries, Rate: opts.Rate, Duration: opts.LoadDuration, MaxInFlight: 512,
			Timeout: 60 * time.Second, Model: modelName(ready), MaxTokens: opts.MaxTokens, Seed: 7, Label: name,
			Prompt: func(i int) string { return fmt.Sprintf("Request %d: summarise the state of the fleet.", i) }})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		st := summarize(name, opts.HotCluster, clusters, start, opts.LoadDuration, res, podClusters(ctx, f))
		printPhase(out, st)
		phases = append(phases, st)
		return nil
	}
	if err := run("cluster-local"); err != nil {
		return err
	}
	// Endpoint mode needs pod addresses reachable across clusters; on
	// isolated pod networks requests cross through the other cluster's
	// gateway.
	mode := fleetv1alpha1.FederationParent
	if f.PodNetwork() == wan.Flat {
		mode = fleetv1alpha1.FederationEndpoint
	}
	step("Turning federation on: spec.federation.mode=%s on the placement (%s pod networks); the hub publishes peer directories and certificates, each picker restarts federated", mode, f.PodNetwork())
	if err := setFederation(ctx, f, client.ObjectKeyFromObject(pl), mode); err != nil {
		return err
	}
	if err := waitFederated(ctx, out, f, ready, 3*time.Minute); err != nil {
		return err
	}
	if err := run("federated"); err != nil {
		return err
	}

	header := fmt.Sprintf("Run of %s. Fleet: 1 hub and %d GPU clusters; KServe sample `%s` placed by the hub (%s). "+
		"Load: %.0f requests/s for %s per phase, %.0f%% entering %s and the rest split evenly, %d-token streamed completions "+
		"(vLLM simulator with each cluster's latency model). Phase *cluster-local*: each cluster's endpoint picker sees its own pods only. "+
		"Phase *federated*: the same load with the pickers federated (%s mode). Clusters are apart: %s pod networks, links %s.\n",
		began.UTC().Format(time.RFC3339), len(f.Spokes), svc.Name, placementSummary(ready), opts.Rate, opts.LoadDuration,
		100*opts.HotShare, opts.HotCluster, opts.MaxTokens, mode, f.PodNetwork(), strings.Join(links(f), ", "))
	path, err := writeReport(opts.ReportDir, header, phases)
	if err != nil {
		return err
	}
	step("Summary")
	printSummary(out, phases, opts.HotCluster)
	printCrossings(out, f, phases[len(phases)-1])
	fmt.Fprintf(out, "    Report: %s\n", path)
	step("Shutting down")
	f.Stop()
	if alive := f.Registry.Alive(); len(alive) > 0 {
		return fmt.Errorf("processes left running: %v", alive)
	}
	step("Done: %d processes started and stopped", len(f.Registry.Started()))
	return nil
}

// entriesFor makes the load enter each placed cluster's gateway at the
// service's URL there, hot taking share of arrivals.
func entriesFor(svc *v1alpha2.LLMInferenceService, hot string, share float64) []loadgen.Entry {
	var out []loadgen.Entry
	others := len(svc.Status.Clusters) - 1
	for _, c := range svc.Status.Clusters {
		w := share
		if c.Name != hot {
			w = (1 - share) / float64(max(others, 1))
		}
		out = append(out, loadgen.Entry{Name: c.Name, URL: c.URL, Weight: w})
	}
	return out
}

// modelName is the name the model servers answer to.
func modelName(svc *v1alpha2.LLMInferenceService) string {
	if n := svc.Spec.Model.Name; n != nil && *n != "" {
		return *n
	}
	return svc.Spec.Model.URI
}

func placementSummary(svc *v1alpha2.LLMInferenceService) string {
	var parts []string
	for _, c := range svc.Status.Clusters {
		parts = append(parts, fmt.Sprintf("%s=%d", c.Name, c.DesiredReplicas))
	}
	return strings.Join(parts, ", ")
}

// printSummary compares the phases.
func printSummary(out io.Writer, phases []phaseStats, hot string) {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "    PHASE\tCOMPLETED\tREQ/S\tTOKENS/S\tTTFT P50\tTTFT P99\tP99 ENTERING %s\tSERVED ELSEWHERE\n", strings.ToUpper(hot))
	for _, st := range phases {
		fmt.Fprintf(tw, "    %s\t%d/%d\t%.1f\t%.0f\t%s\t%s\t%s\t%.0f%%\n", st.Name, st.OK, st.Requests, st.ReqPerS, st.TokPerS,
			ms(st.TTFTp50), ms(st.TTFTp99), ms(st.HotP99), 100*st.CrossCluster)
	}
	_ = tw.Flush()
	if len(phases) == 2 && phases[1].HotP99 > 0 {
		fmt.Fprintf(out, "    Federation cut the p99 TTFT of requests entering %s from %s to %s (%.1f×).\n",
			hot, ms(phases[0].HotP99), ms(phases[1].HotP99), float64(phases[0].HotP99)/float64(phases[1].HotP99))
	}
}

// Spokes returns n GPU clusters: the default three, then more of the same
// shapes with numbered names.
func Spokes(n int) []fleet.SpokeSpec {
	base := fleet.DefaultSpokes()
	out := make([]fleet.SpokeSpec, 0, n)
	for i := range n {
		s := base[i%len(base)]
		if i >= len(base) {
			suffix := fmt.Sprintf("-%d", i/len(base)+1)
			s.Name += suffix
			nodes := make([]kubelet.NodeSpec, len(s.Nodes))
			for j, nd := range s.Nodes {
				nd.Name += suffix
				nodes[j] = nd
			}
			s.Nodes = nodes
		}
		out = append(out, s)
	}
	return out
}

// ProgressLog prints the fleet's progress messages as indented lines.
func ProgressLog(out io.Writer) logr.Logger {
	return funcr.New(func(_, args string) {
		args = strings.TrimPrefix(args, `"level"=0 `)
		fmt.Fprintf(out, "    %s\n", strings.NewReplacer(`"msg"=`, "", `"`, "").Replace(args))
	}, funcr.Options{})
}

func printAccess(out io.Writer, f *fleet.Fleet) {
	fmt.Fprintln(out, "    Inspect any cluster with kubectl while the demo runs, e.g.:")
	fmt.Fprintf(out, "      bin/kube-*/kubectl --kubeconfig %s get managedclusters\n", f.Hub.AdminKubeconfig())
	for _, s := range f.Spokes {
		fmt.Fprintf(out, "      bin/kube-*/kubectl --kubeconfig %s get nodes,pods -A\n", s.AdminKubeconfig())
	}
}

// printNetwork prints the pod-network mode and the links between the
// clusters, hub included.
func printNetwork(out io.Writer, f *fleet.Fleet) {
	fmt.Fprintf(out, "    Network: %s pod networks; links (round trip) between clusters, as written to %s:\n",
		f.PodNetwork(), filepath.Join(f.Dir(), fleet.MatrixFile))
	for _, l := range links(f) {
		fmt.Fprintf(out, "      %s\n", l)
	}
}

// links lists every link of the matrix with its round trip.
func links(f *fleet.Fleet) []string {
	var out []string
	clusters := f.Matrix().Clusters()
	for i, a := range clusters {
		for _, b := range clusters[i+1:] {
			if l, err := f.Fabric().Link(a, b); err == nil {
				out = append(out, fmt.Sprintf("%s–%s %s", a, b, l.RTT))
			}
		}
	}
	return out
}

// printCrossings prints, for each ordered pair of spokes, how many of the
// phase's requests entered one and were served in the other, and how many
// connections crossed the link and the bytes they carried.
func printCrossings(out io.Writer, f *fleet.Fleet, st phaseStats) {
	fmt.Fprintf(out, "    Requests across links in phase %q (entered → served: requests, link round trip):\n", st.Name)
	for _, a := range f.Spokes {
		for _, b := range f.Spokes {
			if n := st.Served[a.Name()][b.Name()]; a != b && n > 0 {
				l, _ := f.Fabric().Link(a.Name(), b.Name())
				fmt.Fprintf(out, "      %s → %s: %d, %s\n", a.Name(), b.Name(), n, l.RTT)
			}
		}
	}
	fmt.Fprintln(out, "    Connections across links, whole run (from → to: connections, bytes there/back, refused):")
	for _, a := range f.Spokes {
		for _, b := range f.Spokes {
			if a == b {
				continue
			}
			if st := f.Fabric().Stats(a.Name(), b.Name()); st != (wan.Stats{}) {
				fmt.Fprintf(out, "      %s → %s: %d, %d/%d B, %d refused\n", a.Name(), b.Name(), st.Accepted, st.BytesToTarget, st.BytesFromTarget, st.Refused)
			}
		}
	}
}

// printStatus prints one line per cluster: nodes, GPUs in use, pods and, for
// spokes, the hub's view of the cluster.
func printStatus(ctx context.Context, out io.Writer, f *fleet.Fleet) {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "    %s\tCLUSTER\tNODES\tGPUS (FREE/TOTAL)\tACCELERATOR\tPODS (READY/ALL)\tHUB SEES\n", time.Now().Format("15:04:05"))
	for _, s := range f.Spokes {
		st := clusterStatus(ctx, f, s)
		fmt.Fprintf(tw, "    \t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name(), st.nodes, st.gpus, st.product, st.pods, st.hub)
	}
	_ = tw.Flush()
}

type status struct{ nodes, gpus, product, pods, hub string }

func clusterStatus(ctx context.Context, f *fleet.Fleet, s *fleet.Cluster) status {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st := status{nodes: "?", gpus: "?", product: "?", pods: "?", hub: "?"}
	var nodes corev1.NodeList
	var pods corev1.PodList
	if err := s.Client.List(ctx, &nodes); err != nil {
		st.nodes = "unreachable"
		return st
	}
	if err := s.Client.List(ctx, &pods); err == nil {
		total, used, ready, live := int64(0), int64(0), 0, 0
		for _, n := range nodes.Items {
			total += n.Status.Allocatable.Name(accelerator.NVIDIA, "").Value()
			st.product = n.Labels[accelerator.NVIDIAProductLabel]
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			live++
			if p.Spec.NodeName != "" {
				for _, c := range p.Spec.Containers {
					used += c.Resources.Limits.Name(accelerator.NVIDIA, "").Value()
				}
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		st.gpus = fmt.Sprintf("%d/%d", total-used, total)
		st.pods = fmt.Sprintf("%d/%d", ready, live)
	}
	st.nodes = fmt.Sprint(len(nodes.Items))
	var mc clusterv1.ManagedCluster
	if err := f.Hub.Client.Get(ctx, client.ObjectKey{Name: s.Name()}, &mc); err == nil {
		c := meta.FindStatusCondition(mc.Status.Conditions, clusterv1.ManagedClusterConditionAvailable)
		st.hub = "registered"
		if c != nil {
			st.hub = "Available=" + string(c.Status)
		}
	}
	return st
}
