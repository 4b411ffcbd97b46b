// Command epp is fleetinfer's endpoint picker; see package epp.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fleetinfer/fleetinfer/epp"
)

func main() {
	if err := epp.NewRunner().Run(ctrl.SetupSignalHandler()); err != nil {
		os.Exit(1)
	}
}
