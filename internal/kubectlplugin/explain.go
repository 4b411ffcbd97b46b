package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

func explainCommand(o *options) *cobra.Command {
	return &cobra.Command{
		Use:   "explain SERVICE",
		Short: "Why each member cluster was chosen for a service or left out, from the hub's decision in force",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			hub, ns, err := o.hub(false)
			if err != nil {
				return err
			}
			return Explain(cmd.Context(), hub, client.ObjectKey{Namespace: ns, Name: args[0]}, o.streams.Out)
		},
	}
}

// Explain prints the hub's decision for a service and, for every member
// cluster, whether it was chosen and why (or why not).
func Explain(ctx context.Context, hub client.Client, key client.ObjectKey, out io.Writer) error {
	svc := &v1alpha2.LLMInferenceService{}
	if err := hub.Get(ctx, key, svc); err != nil {
		return err
	}
	var members fleetv1alpha1.MemberClusterList
	if err := hub.List(ctx, &members); err != nil {
		return fmt.Errorf("member clusters: %w", err)
	}
	mem := svc.Status.Placement
	var pl *fleetv1alpha1.InferencePlacement
	if mem != nil && mem.PlacementName != "" {
		pl = &fleetv1alpha1.InferencePlacement{}
		if err := hub.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: mem.PlacementName}, pl); err != nil {
			pl = nil
		}
	}
	fmt.Fprintf(out, "Service %s/%s\n", key.Namespace, key.Name)
	for _, t := range []v1alpha2.ConditionType{"Placed", "Distributed", v1alpha2.Ready} {
		if c := svc.Status.GetCondition(t); c != nil {
			line := fmt.Sprintf("  %s=%s", t, c.Status)
			if c.Reason != "" {
				line += " (" + c.Reason + ")"
			}
			if c.Message != "" {
				line += ": " + c.Message
			}
			fmt.Fprintln(out, line)
		}
	}
	if mem == nil {
		fmt.Fprintln(out, "  No placement decision: no InferencePlacement in the namespace selects the service.")
	} else {
		if mem.LastDecisionTime != nil {
			fmt.Fprintf(out, "  Decided at %s by InferencePlacement %s\n", mem.LastDecisionTime.UTC().Format("2006-01-02 15:04:05Z"), mem.PlacementName)
		}
		if mem.UnplacedReplicas > 0 {
			fmt.Fprintf(out, "  %d replicas fit in no cluster; they are placed as soon as room appears\n", mem.UnplacedReplicas)
		}
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tDECISION\tREPLICAS (READY/DESIRED)\tWHY")
	for _, r := range explainClusters(svc, pl, members.Items) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.cluster, r.decision, r.replicas, r.why)
	}
	return tw.Flush()
}

type explained struct{ cluster, decision, replicas, why string }

// explainClusters says, for each member cluster and each cluster the
// service's status names, why it holds replicas of the service or not: the
// reasons are the hub's (status.clusters, status.placement), completed with
// the placement's clusters.names and the cluster's availability.
func explainClusters(svc *v1alpha2.LLMInferenceService, pl *fleetv1alpha1.InferencePlacement, members []fleetv1alpha1.MemberCluster) []explained {
	var names []string
	available := map[string]string{}
	for _, m := range members {
		names = append(names, m.Name)
		if st, msg := availability(&m); st != "True" {
			available[m.Name] = "unavailable: " + msg
		}
	}
	entries := map[string]v1alpha2.ClusterStatus{}
	for _, c := range svc.Status.Clusters {
		entries[c.Name] = c
		names = append(names, c.Name)
	}
	excluded, stuck, failedOver := map[string]string{}, map[string]bool{}, map[string]bool{}
	if mem := svc.Status.Placement; mem != nil {
		for _, e := range mem.NotEligible {
			excluded[e.Name] = e.Reason
			names = append(names, e.Name)
		}
		for _, s := range mem.StuckClusters {
			stuck[s.Name] = true
		}
		for _, f := range mem.FailedOverClusters {
			failedOver[f] = true
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	var out []explained
	for _, n := range names {
		r := explained{cluster: n, replicas: "-"}
		e, listed := entries[n]
		switch {
		case listed && e.DesiredReplicas > 0:
			r.decision = "chosen"
			r.replicas = fmt.Sprintf("%d/%d %s", e.ReadyReplicas, e.DesiredReplicas, e.Phase)
			r.why = e.PlacementReason
		case listed:
			r.decision = "leaving"
			r.replicas = fmt.Sprintf("%d/0 %s", e.ReadyReplicas, e.Phase)
			r.why = "no longer in the decision; kept until the clusters of the new placement are ready"
		case excluded[n] != "":
			r.decision, r.why = "not eligible", excluded[n]
		case pl != nil && len(pl.Spec.Clusters.Names) > 0 && !slices.Contains(pl.Spec.Clusters.Names, n):
			r.decision, r.why = "not asked for", fmt.Sprintf("InferencePlacement %s lists clusters.names %v", pl.Name, pl.Spec.Clusters.Names)
		case svc.Status.Placement == nil:
			r.decision, r.why = "not placed", "no InferencePlacement selects the service"
		default:
			r.decision, r.why = "not chosen", "eligible, but the strategy gave it no replicas (no room, no weight, or beyond maxClusters)"
		}
		if listed && e.Message != "" && e.Phase != "Running" {
			r.why += "; " + e.Message
		}
		if stuck[n] {
			r.why += "; its copy was not Ready within the ready timeout (Stuck)"
		}
		if failedOver[n] {
			r.why += "; failed over: lost its replicas while unavailable"
		}
		if a := available[n]; a != "" {
			r.why += "; " + a
		}
		out = append(out, r)
	}
	return out
}
