package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

func statusCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Member clusters (availability, free GPUs per product) and services (where their replicas run, how many are ready); all namespaces unless -n",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hub, ns, err := o.hub(true)
			if err != nil {
				return err
			}
			return Status(cmd.Context(), hub, ns, o.streams.Out)
		},
	}
}

// Status prints the member clusters, then the hub's services in ns ("" for
// all namespaces).
func Status(ctx context.Context, hub client.Client, ns string, out io.Writer) error {
	var members fleetv1alpha1.MemberClusterList
	if err := hub.List(ctx, &members); err != nil {
		return fmt.Errorf("member clusters: %w", err)
	}
	var services v1alpha2.LLMInferenceServiceList
	if err := hub.List(ctx, &services, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tAVAILABLE\tNODES\tGPUS (FREE/TOTAL)\tMESSAGE")
	sort.Slice(members.Items, func(i, j int) bool { return members.Items[i].Name < members.Items[j].Name })
	for _, m := range members.Items {
		available, msg := availability(&m)
		if available == "True" {
			msg = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", m.Name, available, m.Status.Nodes, gpus(m.Status.Accelerators), msg)
	}
	if len(members.Items) == 0 {
		fmt.Fprintln(tw, "(none: the hub has engaged no cluster)\t\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tREADY\tCLUSTERS (READY/DESIRED REPLICAS, PHASE)")
	sort.Slice(services.Items, func(i, j int) bool {
		a, b := services.Items[i], services.Items[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	for _, s := range services.Items {
		ready := "Unknown"
		if c := s.Status.GetCondition(v1alpha2.Ready); c != nil {
			ready = string(c.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Namespace, s.Name, ready, placements(s.Status.Clusters))
	}
	if len(services.Items) == 0 {
		fmt.Fprintln(tw, "(no services)\t\t\t")
	}
	return tw.Flush()
}

// availability is a MemberCluster's Available status and message.
func availability(m *fleetv1alpha1.MemberCluster) (string, string) {
	c := meta.FindStatusCondition(m.Status.Conditions, fleetv1alpha1.MemberClusterAvailable)
	if c == nil {
		return "Unknown", "the hub has not judged it yet"
	}
	return string(c.Status), c.Message
}

// gpus is "product free/total" per accelerator product.
func gpus(acc []fleetv1alpha1.AcceleratorCapacity) string {
	if len(acc) == 0 {
		return "none reported"
	}
	parts := make([]string, len(acc))
	for i, a := range acc {
		parts[i] = fmt.Sprintf("%s %d/%d", a.Product, a.Free, a.Allocatable)
	}
	return strings.Join(parts, ", ")
}

// placements is "cluster ready/desired phase" per cluster entry.
func placements(clusters []v1alpha2.ClusterStatus) string {
	if len(clusters) == 0 {
		return "none"
	}
	parts := make([]string, len(clusters))
	for i, c := range clusters {
		parts[i] = fmt.Sprintf("%s %d/%d %s", c.Name, c.ReadyReplicas, c.DesiredReplicas, c.Phase)
	}
	return strings.Join(parts, ", ")
}
