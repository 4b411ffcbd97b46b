#!/usr/bin/env bash
# Fails when regenerating (make manifests generate) changes any file, i.e.
# when a generated file was edited by hand or not regenerated after a change.
# It compares content hashes before and after, so it works on an uncommitted
# working tree too.
set -euo pipefail
cd "$(dirname "$0")/.."
snapshot() {
  find . -path ./bin -prune -o -path ./.git -prune -o -type f -print0 | sort -z | xargs -0 sha256sum
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
