#!/usr/bin/env bash
# step.sh NAME COMMAND...: runs one step of `make test`, says when it starts
# and how long it took, and appends that to the summary `step.sh --summary`
# prints, so a newcomer's first (cold) run shows where its time goes.
# STEP_LOG names the summary file (bin/steps.log by default).
set -euo pipefail
log=${STEP_LOG:-bin/steps.log}
if [ "${1:-}" = --summary ]; then
  echo "==> make test steps (wall-clock seconds):"
  [ -f "$log" ] && awk -F'\t' '{printf "    %-18s %6s  %s\n", $1, $2, $3; t += $2}
    END {printf "    %-18s %6ss\n", "total", t}' "$log"
  exit 0
fi
if [ "${1:-}" = --reset ]; then
  mkdir -p "$(dirname "$log")" && : >"$log"
  exit 0
fi
name=$1
shift
echo "==> $name: $*"
start=$(date +%s)
rc=0
"$@" || rc=$?
took=$(($(date +%s) - start))
state=ok
[ "$rc" -eq 0 ] || state="FAILED (exit $rc)"
printf '%s\t%ss\t%s\n' "$name" "$took" "$state" >>"$log"
echo "<== $name: $state in ${took}s"
exit "$rc"
