// Package apis embeds fleetinfer's CustomResourceDefinitions, generated from
// the types below it by `make manifests`.
package apis

import (
	"embed"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/fleetinfer/fleetinfer/deploy/crds"
)

//go:embed crds/*.yaml
var generated embed.FS

// CRDs returns every CRD fleetinfer defines.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	return crds.Parse(generated, "crds")
}
