#!/usr/bin/env bash
# Refreshes the KServe v0.20.0 compatibility fixtures (samples and CRD
# schema paths) under apis/serving/v1alpha2/testdata/kserve-v0.20.0 from the
# KServe module. Not part of `make manifests`: the fixtures pin one KServe
# release and change only when fleetinfer targets another.
set -euo pipefail
cd "$(dirname "$0")/.."
version=v0.20.0
dir=$(go mod download -json "github.com/kserve/kserve@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { echo "could not locate github.com/kserve/kserve@$version" >&2; exit 1; }
go run ./hack/kservefixtures "$dir" "apis/serving/v1alpha2/testdata/kserve-$version"
