// Package kubectlplugin is `kubectl fleetinfer`, the fleet as an operator
// sees it from the hub: status (member clusters and services), explain
// (why each cluster was chosen or left out for a service) and traffic
// (where each cluster's endpoint picker sent the requests that entered
// there). It speaks to the hub through the usual kubeconfig flags
// (--kubeconfig, --context, -n) and, for traffic, to each member cluster
// through the kubeconfig context named after it (or --cluster-context).
package kubectlplugin

import (
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "github.com/fleetinfer/fleetinfer/apis/fleet/v1alpha1"
	"github.com/fleetinfer/fleetinfer/apis/serving/v1alpha2"
)

var scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(v1alpha2.AddToScheme(scheme))
	utilruntime.Must(fleetv1alpha1.AddToScheme(scheme))
}

// options are the flags every command shares.
type options struct {
	flags   *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
}

// NewCommand is the plugin's root command.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{flags: genericclioptions.NewConfigFlags(true), streams: streams}
	root := &cobra.Command{
		Use:           "kubectl-fleetinfer",
		Short:         "The fleetinfer fleet from the hub: clusters, services, placement decisions and traffic",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.flags.AddFlags(root.PersistentFlags())
	root.AddCommand(statusCommand(o), explainCommand(o), trafficCommand(o))
	return root
}

// hub is a client of the hub cluster the flags name, and the namespace -n
// names; without -n, "" (all namespaces) when all is true, else the
// kubeconfig context's namespace.
func (o *options) hub(all bool) (client.Client, string, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", err
	}
	ns, explicit, err := o.flags.ToRawKubeConfigLoader().Namespace()
	if all && !explicit {
		ns = ""
	}
	return c, ns, err
}
