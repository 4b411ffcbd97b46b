#!/usr/bin/env bash
# Fails when a component reaches into another instead of going through the
# contract they share (apis/ or an internal package): the hub must not build
# on the spoke controller or the endpoint picker, the spoke on neither the hub
# nor the picker; and e2e/ holds end-to-end tests only, with the local fleet
# they run on in localfleet/.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
fail=0
check() { # check <packages> <forbidden prefix regexp>
  local bad
  bad=$(go list -deps "$1" | grep -E "^$mod/($2)(/|$)" | sort -u || true)
  if [ -n "$bad" ]; then
    echo "packages under $1 must not depend on:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    fail=1
  fi
}
check ./hub/... 'spoke|epp|localfleet|e2e'
check ./spoke/... 'hub|epp|localfleet|e2e'
check ./epp/... 'hub|spoke|localfleet|e2e'
check ./apis/... 'hub|spoke|epp|localfleet|e2e'
nontest=$(find e2e -name '*.go' ! -name '*_test.go')
if [ -n "$nontest" ]; then
  echo "e2e/ holds tests only; move these to localfleet/ or an internal package:" >&2
  echo "$nontest" | sed 's/^/  /' >&2
  fail=1
fi
exit $fail
