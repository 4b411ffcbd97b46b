package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

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
	fmt.Fprintln(tw, "CLUSTER\tAVAILABLE\tNODES\tGPUS (FREE/TOTAL)\tDELETIONS\tMESSAGE")
	sort.Slice(members.Items, func(i, j int) bool { return members.Items[i].Name < members.Items[j].Name })
	for _, m := range members.Items {
		available, msg := availability(&m)
		if available == "True" {
			msg = ""
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", m.Name, available, m.Status.Nodes, gpus(m.Status.Accelerators), deletions(m.Status), msg)
	}
	if len(members.Items) == 0 {
		fmt.Fprintln(tw, "(none: the hub has engaged no cluster)\t\t\t\t\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	if err := pendingDeletions(out, members.Items, time.Now()); err != nil {
		return err
	}
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

// deletions is a MemberCluster's count of the copies the orphan collector
// will delete and of those deletion protection holds.
func deletions(st fleetv1alpha1.MemberClusterStatus) string {
	if st.PendingDeletionCount == 0 && st.HeldDeletionCount == 0 {
		return "none"
	}
	return fmt.Sprintf("%d pending, %d held", st.PendingDeletionCount, st.HeldDeletionCount)
}

// pendingDeletions lists, when there are any, the copies whose hub service
// is gone, cluster by cluster: when the orphan collector deletes each, or
// that protection holds it. A user who sees a copy here that should stay
// recreates its hub service before DELETE AFTER.
func pendingDeletions(out io.Writer, members []fleetv1alpha1.MemberCluster, now time.Time) error {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	rows := 0
	for _, m := range members {
		for _, d := range m.Status.PendingDeletions {
			if rows == 0 {
				fmt.Fprintln(tw, "CLUSTER\tNAMESPACE\tORPHANED COPY\tORPHANED SINCE\tDELETE AFTER")
			}
			rows++
			after := "held: " + fleetv1alpha1.DeletionProtectedLabel + "=" + fleetv1alpha1.DeletionProtectedAlways
			if d.DeleteAfter != nil {
				after = fmt.Sprintf("%s (in %s)", d.DeleteAfter.UTC().Format(time.RFC3339), d.DeleteAfter.Sub(now).Round(time.Second))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, d.Namespace, d.Name, d.OrphanedSince.UTC().Format(time.RFC3339), after)
		}
		if more := int(m.Status.PendingDeletionCount+m.Status.HeldDeletionCount) - len(m.Status.PendingDeletions); more > 0 {
			fmt.Fprintf(tw, "%s\t(%d more)\t\t\t\n", m.Name, more)
		}
	}
	if rows == 0 {
		return nil
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(out)
	return err
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
