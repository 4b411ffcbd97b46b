#!/usr/bin/env bash
# Fails when regenerating (make manifests generate) changes a generated file,
# i.e. when one was edited by hand or not regenerated after a change. It
# compares content hashes before and after, so it also works on a working
# tree with uncommitted changes. Add each generator's outputs to GENERATED.
set -euo pipefail
cd "$(dirname "$0")/.."
GENERATED=(
  apis/crds
  deploy/crds/thirdparty
  deploy/charts/fleetinfer-spoke/crds
  deploy/charts/fleetinfer-spoke/charts
  deploy/charts/fleetinfer-spoke/files/presets
  deploy/charts/fleetinfer-spoke/generated
  deploy/hub/crds
  deploy/hub/rbac
  docs/reference
)
snapshot() {
  { find "${GENERATED[@]}" -type f 2>/dev/null; find apis -name 'zz_generated.*.go'; } |
    sort | xargs -r sha256sum
}
before=$(mktemp); after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
snapshot >"$before"
make --no-print-directory manifests generate >/dev/null
snapshot >"$after"
if ! diff -u "$before" "$after"; then
  echo "generated files are out of date: run 'make manifests generate' and commit the result" >&2
  exit 1
fi
