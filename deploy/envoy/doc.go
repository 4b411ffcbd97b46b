// Package envoy holds the Envoy configuration a plain-Envoy user needs in
// front of one InferencePool's endpoint picker (envoy.yaml), the
// configuration fleetinfer's local gateway (localfleet/gateway) stands for.
// Its test parses the file into go-control-plane's Envoy v3 types, validates
// it, and holds the Endpoint Picker Protocol settings to the names and values
// the local gateway and the spoke's presets use.
package envoy

import _ "embed"

// Bootstrap is envoy.yaml, a static Envoy v3 bootstrap.
//
//go:embed envoy.yaml
var Bootstrap []byte
