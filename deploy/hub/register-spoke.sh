#!/usr/bin/env bash
# Registers a spoke cluster with the hub the way multicluster-runtime's
# kubeconfig provider reads it: grants the hub its rights in the spoke
# (spoke-access/), issues a token for its ServiceAccount
# fleetinfer-hub/fleetinfer-hub there, and stores a
# kubeconfig with it on the hub as Secret fleetinfer-system/<name>, key
# kubeconfig, labelled sigs.k8s.io/multicluster-runtime-kubeconfig=true.
#
#   deploy/hub/register-spoke.sh NAME SPOKE_KUBECONFIG HUB_KUBECONFIG
#
# NAME is the cluster's name in the fleet (a DNS label; the same as the
# spoke chart's federation.clusterName). SERVER overrides the spoke API
# server URL the hub dials (default: the one in SPOKE_KUBECONFIG);
# TOKEN_DURATION the token's lifetime (default 8760h; re-run to rotate).
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 NAME SPOKE_KUBECONFIG HUB_KUBECONFIG" >&2
  exit 2
fi
name=$1 spoke=$2 hub=$3
here=$(cd "$(dirname "$0")" && pwd)
ns=fleetinfer-system

# The policy's matchConstraints is an atomic field that the API server
# defaults, so any second applier (an earlier install, another tool) conflicts
# on it even with identical manifests; this script states the access the hub
# must have, so it takes ownership.
kubectl --kubeconfig "$spoke" apply --server-side --force-conflicts -k "$here/spoke-access" >/dev/null
token=$(kubectl --kubeconfig "$spoke" -n fleetinfer-hub create token fleetinfer-hub --duration "${TOKEN_DURATION:-8760h}")
view() { kubectl --kubeconfig "$spoke" config view --minify --flatten -o jsonpath="$1"; }
server=${SERVER:-$(view '{.clusters[0].cluster.server}')}
ca=$(view '{.clusters[0].cluster.certificate-authority-data}')

kubeconfig=$(cat <<YAML
apiVersion: v1
kind: Config
clusters:
  - name: $name
    cluster:
      server: $server
      certificate-authority-data: $ca
users:
  - name: fleetinfer-hub
    user:
      token: $token
contexts:
  - name: $name
    context: {cluster: $name, user: fleetinfer-hub}
current-context: $name
YAML
)
kubectl --kubeconfig "$hub" -n "$ns" create secret generic "$name" --from-literal=kubeconfig="$kubeconfig" \
    --dry-run=client -o yaml |
  kubectl label --local -f - sigs.k8s.io/multicluster-runtime-kubeconfig=true -o yaml |
  kubectl --kubeconfig "$hub" apply --server-side --force-conflicts -f - >/dev/null
echo "registered $name: Secret $ns/$name on the hub"
