#!/usr/bin/env bash
# Copies the third-party CRDs that fleetinfer installs from the exact module
# versions pinned in go.mod into deploy/crds/thirdparty, so that the local
# fleet, the hub manifests and the Helm chart ship the upstream files
# unchanged. `make manifests` runs it; CI fails when the copy drifts.
set -euo pipefail
cd "$(dirname "$0")/.."
out=deploy/crds/thirdparty
rm -rf "$out"
mkdir -p "$out"

moddir() { go list -m -f '{{.Dir}}' "$1"; }

gie=$(moddir sigs.k8s.io/gateway-api-inference-extension)
lws=$(moddir sigs.k8s.io/lws)
gw=$(moddir sigs.k8s.io/gateway-api)
ocm=$(moddir open-cluster-management.io/api)
inv=$(moddir sigs.k8s.io/cluster-inventory-api)

copy() { install -m 0644 "$@" "$out/"; }
copy "$gie"/config/crd/bases/*.yaml
copy "$lws"/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml
# Standard channel CRDs only; the ValidatingAdmissionPolicy next to them is not a CRD.
copy $(ls "$gw"/config/crd/standard/gateway.networking.k8s.io_*.yaml | grep -v _vap_)
copy "$inv"/config/crd/bases/*.yaml
# OCM: the cluster and work APIs. addon/v1alpha1 duplicates addon/v1beta1 and
# operator/ belongs to OCM's own installer, so neither is copied.
copy "$ocm"/cluster/v1/*.crd.yaml "$ocm"/cluster/v1beta1/*.crd.yaml "$ocm"/cluster/v1beta2/*.crd.yaml \
     "$ocm"/cluster/v1alpha1/*.crd.yaml "$ocm"/work/v1/*.crd.yaml "$ocm"/addon/v1beta1/*.crd.yaml
