package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
	"github.com/fleetinfer/fleetinfer/localfleet/binaries"
	"github.com/fleetinfer/fleetinfer/localfleet/fleet"
	"github.com/fleetinfer/fleetinfer/localfleet/metrics"
)

// The demo serves KServe's own GPU sample, unchanged: three replicas of a
// model with one GPU each, an endpoint picker and a route on the cluster's
// gateway. Its namespace and the placement are the demo's.
const (
	samplePath = "apis/serving/v1alpha2/testdata/kserve-v0.20.0/samples/multi-gpu-vendor__llm-inference-service-qwen2-7b-nvidia-with-scheduler.0.yaml"
	namespace  = "demo"
)

// sample reads the KServe sample from the repository.
func sample() (*v1alpha2.LLMInferenceService, error) {
	root, err := binaries.Root()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, samplePath))
	if err != nil {
		return nil, err
	}
	svc := &v1alpha2.LLMInferenceService{}
	if err := yaml.Unmarshal(b, svc); err != nil {
		return nil, fmt.Errorf("%s: %w", samplePath, err)
	}
	// The sample is written for v1alpha1, which the CRD serves with the same
	// schema; the typed client speaks v1alpha2.
	svc.APIVersion, svc.Namespace = "", namespace
	svc.Labels = map[string]string{"app": svc.Name}
	return svc, nil
}

// placement spreads the service's replicas over every cluster in
// proportion to free GPUs, starting without federation so that the first
// load phase shows what cluster-local picking does.
func placement(svc *v1alpha2.LLMInferenceService, replicas int32) *fleetv1alpha1.InferencePlacement {
	return &fleetv1alpha1.InferencePlacement{
		ObjectMeta: metav1.ObjectMeta{Name: svc.Name, Namespace: namespace},
		Spec: fleetv1alpha1.InferencePlacementSpec{
			ServiceSelector: &metav1.LabelSelector{MatchLabels: svc.Labels},
			Replicas:        fleetv1alpha1.ReplicaScheduling{Strategy: fleetv1alpha1.FreeCapacity, Total: ptr.To(replicas)},
			Federation:      fleetv1alpha1.Federation{Mode: fleetv1alpha1.FederationDisabled},
		},
	}
}

// apply creates the namespace with a binding to every cluster, the
// placement and the service on the hub.
func apply(ctx context.Context, f *fleet.Fleet, svc *v1alpha2.LLMInferenceService, p *fleetv1alpha1.InferencePlacement) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := f.Hub.Client.Create(ctx, ns); err != nil {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	if err := fleet.BindEveryCluster(ctx, f.Hub.Client, namespace); err != nil {
		return err
	}
	for _, o := range []client.Object{p, svc} {
		if err := f.Hub.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// waitReady prints the hub's per-cluster status every few seconds until the
// service is Ready in every cluster the hub placed it on.
func waitReady(ctx context.Context, out io.Writer, f *fleet.Fleet, key client.ObjectKey, timeout time.Duration) (*v1alpha2.LLMInferenceService, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		svc := &v1alpha2.LLMInferenceService{}
		if err := f.Hub.Client.Get(ctx, key, svc); err == nil {
			if line := hubLine(svc); line != last {
				fmt.Fprintf(out, "    %s  %s\n", time.Now().Format("15:04:05"), line)
				last = line
			}
			if svc.Status.IsTrue(v1alpha2.Ready) && len(svc.Status.Clusters) > 0 {
				return svc, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the service was not Ready in time; last status: %s", last)
		case <-time.After(time.Second):
		}
	}
}

// hubLine is the hub's view of the service on one line.
func hubLine(svc *v1alpha2.LLMInferenceService) string {
	parts := []string{}
	for _, t := range []v1alpha2.ConditionType{"Placed", "Distributed", v1alpha2.Ready} {
		if c := svc.Status.GetCondition(t); c != nil {
			parts = append(parts, fmt.Sprintf("%s=%s", t, c.Status))
		}
	}
	for _, c := range svc.Status.Clusters {
		parts = append(parts, fmt.Sprintf("%s:%s %d/%d", c.Name, c.Phase, c.ReadyReplicas, c.DesiredReplicas))
	}
	return strings.Join(parts, "  ")
}

// printPlacement prints where the hub put the replicas and why.
func printPlacement(out io.Writer, f *fleet.Fleet, svc *v1alpha2.LLMInferenceService) {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "    CLUSTER\tGPU\tREPLICAS (READY/DESIRED)\tWHY\tURL")
	for _, c := range svc.Status.Clusters {
		product := ""
		if s := f.Spoke(c.Name); s != nil && len(s.Spec.Nodes) > 0 {
			product = s.Spec.Nodes[0].GPUProduct
		}
		fmt.Fprintf(tw, "    %s\t%s\t%d/%d\t%s\t%s\n", c.Name, product, c.ReadyReplicas, c.DesiredReplicas, c.PlacementReason, c.URL)
	}
	_ = tw.Flush()
}

// setFederation switches the placement's federation mode.
func setFederation(ctx context.Context, f *fleet.Fleet, key client.ObjectKey, mode fleetv1alpha1.FederationMode) error {
	p := &fleetv1alpha1.InferencePlacement{}
	if err := f.Hub.Client.Get(ctx, key, p); err != nil {
		return err
	}
	p.Spec.Federation.Mode = mode
	return f.Hub.Client.Update(ctx, p)
}

// waitFederated waits until the endpoint picker in each placed cluster is
// connected to the pickers of all the others, printing progress.
func waitFederated(ctx context.Context, out io.Writer, f *fleet.Fleet, svc *v1alpha2.LLMInferenceService, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var placed []string
	for _, c := range svc.Status.Clusters {
		placed = append(placed, c.Name)
	}
	last := ""
	for {
		var parts []string
		done := true
		for _, name := range placed {
			n, err := peersConnected(ctx, f.Spoke(name), svc.Name)
			if err != nil || n != len(placed)-1 {
				done = false
			}
			state := fmt.Sprintf("%d/%d peers", n, len(placed)-1)
			if err != nil {
				state = "starting"
			}
			parts = append(parts, name+": "+state)
		}
		if line := strings.Join(parts, "  "); line != last {
			fmt.Fprintf(out, "    %s  %s\n", time.Now().Format("15:04:05"), line)
			last = line
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("endpoint pickers not federated in time: %s", last)
		case <-time.After(time.Second):
		}
	}
}

// peersConnected reads fleetinfer_epp_federation_peers_connected from the
// service's ready, federating endpoint picker in a cluster.
func peersConnected(ctx context.Context, c *fleet.Cluster, svc string) (int, error) {
	var pods corev1.PodList
	if err := c.Client.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{
		"app.kubernetes.io/name": svc, "app.kubernetes.io/component": "llminferenceservice-router-scheduler"}); err != nil {
		return 0, err
	}
	for _, p := range pods.Items {
		federating := slices.ContainsFunc(p.Spec.Containers, func(ctr corev1.Container) bool {
			return slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, "--federation-peers-file") })
		})
		if !federating || p.Status.PodIP == "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		m, err := metrics.Scrape(ctx, "http://"+p.Status.PodIP+":9090/metrics")
		if err != nil {
			return 0, err
		}
		return int(m["fleetinfer_epp_federation_peers_connected"]), nil
	}
	return 0, fmt.Errorf("no federating endpoint picker yet")
}

// podClusters maps the demo's pods (namespace/name) to their cluster.
func podClusters(ctx context.Context, f *fleet.Fleet) map[string]string {
	out := map[string]string{}
	for _, s := range f.Spokes {
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace(namespace)); err != nil {
			continue
		}
		for _, p := range pods.Items {
			out[p.Namespace+"/"+p.Name] = s.Name()
		}
	}
	return out
}
