// Package demo is what `make demo` runs: it brings up the local fleet, shows
// each cluster's state while it runs, and shuts everything down on Ctrl-C or
// when its time is up, ending with a summary.
package demo

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	clusterv1 "open-cluster-management.io/api/cluster/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetinfer/fleetinfer/e2e/fleet"
	"github.com/fleetinfer/fleetinfer/e2e/kubelet"
)

// Options configures a demo run.
type Options struct {
	// Spokes is the number of GPU clusters (default 3).
	Spokes int
	// Duration ends the run; 0 runs until ctx is cancelled.
	Duration time.Duration
	// Refresh is how often the status table is printed.
	Refresh time.Duration
	// Dir keeps the fleet's state and logs there instead of a temporary
	// directory that is removed at the end.
	Dir string
	Out io.Writer
}

// Run runs the demo.
func Run(ctx context.Context, opts Options) error {
	if opts.Spokes <= 0 {
		opts.Spokes = 3
	}
	if opts.Refresh <= 0 {
		opts.Refresh = 5 * time.Second
	}
	out := opts.Out
	fmt.Fprintf(out, "==> Starting the local fleet: 1 hub + %d GPU clusters (real kube-apiserver, etcd, controller-manager, scheduler each)\n", opts.Spokes)
	f, err := fleet.Start(ctx, fleet.Options{Dir: opts.Dir, Spokes: Spokes(opts.Spokes), Log: progressLog(out)})
	if err != nil {
		if f != nil {
			f.Stop()
		}
		return fmt.Errorf("local fleet did not start: %w", err)
	}
	defer f.Stop()
	fmt.Fprintf(out, "==> Fleet up in %.1fs\n", f.StartupTime.Seconds())
	printAccess(out, f)

	var done <-chan time.Time
	if opts.Duration > 0 {
		done = time.After(opts.Duration)
		fmt.Fprintf(out, "==> Running for %s (Ctrl-C to stop earlier)\n", opts.Duration)
	} else {
		fmt.Fprintln(out, "==> Running until Ctrl-C")
	}
	began := time.Now()
	tick := time.NewTicker(opts.Refresh)
	defer tick.Stop()
	printStatus(ctx, out, f)
loop:
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "\n==> Interrupted")
			break loop
		case <-done:
			break loop
		case <-tick.C:
			printStatus(ctx, out, f)
		}
	}
	fmt.Fprintln(out, "==> Final state")
	printStatus(context.WithoutCancel(ctx), out, f)
	fmt.Fprintln(out, "==> Shutting down")
	f.Stop()
	alive := f.Registry.Alive()
	fmt.Fprintf(out, "\nSummary: %d clusters ran for %s; %d processes started, %d still running.\n",
		len(f.Spokes)+1, time.Since(began).Round(time.Second), len(f.Registry.Started()), len(alive))
	if len(alive) > 0 {
		return fmt.Errorf("processes left running: %v", alive)
	}
	return nil
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

// progressLog prints the fleet's progress messages as indented lines.
func progressLog(out io.Writer) logr.Logger {
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
			total += n.Status.Allocatable.Name(kubelet.GPUResource, "").Value()
			st.product = n.Labels[kubelet.GPUProductLabel]
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			live++
			if p.Spec.NodeName != "" {
				for _, c := range p.Spec.Containers {
					used += c.Resources.Limits.Name(kubelet.GPUResource, "").Value()
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
