// Command kubectl-fleetinfer is the kubectl plugin for operators of a
// fleetinfer fleet (`kubectl fleetinfer status|explain|traffic`); see
// package kubectlplugin.
package main

import (
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/fleetinfer/fleetinfer/internal/kubectlplugin"
)

func main() {
	cmd := kubectlplugin.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
