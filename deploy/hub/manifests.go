// Package hub holds the hub's manifests (`kubectl apply -k deploy/hub` on the
// hub cluster) and, for Go callers, the access it needs in each spoke.
package hub

import _ "embed"

// SpokeAccess is spoke-access/access.yaml: the hub's identity, RBAC and
// admission policy in one spoke. The local fleet grants its hub exactly this.
//
//go:embed spoke-access/access.yaml
var SpokeAccess []byte
