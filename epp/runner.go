// Package epp is fleetinfer's endpoint picker. It runs GIE v1.5.0's EPP
// runner unchanged (flags, EndpointPickerConfig, ext-proc server, flow
// control, health and metrics as GIE users know them) and adds fleetinfer's
// plugins to its registry.
package epp

import (
	"os"

	"github.com/spf13/pflag"
	"sigs.k8s.io/gateway-api-inference-extension/cmd/epp/runner"
)

// NewRunner returns GIE's runner, named for fleetinfer, with a --kubeconfig
// flag added to its command line.
func NewRunner() *runner.Runner {
	// GIE's runner parses only the pflag command line and reads the API
	// server address through controller-runtime, which honours $KUBECONFIG;
	// the flag sets that variable while the runner parses its flags.
	if pflag.CommandLine.Lookup("kubeconfig") == nil {
		pflag.CommandLine.Var(kubeconfigFlag{}, "kubeconfig",
			"Path to a kubeconfig. Defaults to $KUBECONFIG, then the in-cluster configuration.")
	}
	return runner.NewRunner().WithExecutableName("fleetinfer-epp")
}

type kubeconfigFlag struct{}

func (kubeconfigFlag) String() string     { return os.Getenv("KUBECONFIG") }
func (kubeconfigFlag) Set(v string) error { return os.Setenv("KUBECONFIG", v) }
func (kubeconfigFlag) Type() string       { return "string" }
