#!/usr/bin/env bash
# device_tasks.sh — a list of timed commands for one device run, after gpu_check.sh's build step.
#
#   bash scripts/device_tasks.sh scripts/tasks/<file>      # each non-comment line: <seconds> <command>
#
# Every command runs under `timeout <seconds>` with its output (the last 300 lines) in
# $OUT/tasks.log (one file: the device tool brings back only a few files), then one summary line
# per task (rc, seconds) at the end of the log and on stdout. BUDGET (default 560 s) stops the
# list early, so a hang cannot eat the device call's 600 s limit.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
BUDGET="${BUDGET:-560}"
T0=$(date +%s)
# the library may come gzipped (carry build/libfusedloss.a.gz: the .a passed 58 MB in session 11, and the
# working tree + carry must stay under 64 MiB)
if [ -e build/libfusedloss.a.gz ] && [ ! -e build/libfusedloss.a ]; then gunzip -c build/libfusedloss.a.gz > build/libfusedloss.a; fi
[ -e build/test_cross_entropy_cuda ] || FL_PREBUILT="${FL_PREBUILT:-1}" STEPS=build BUDGET=150 bash scripts/gpu_check.sh | tail -3
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" FUSEDLOSS_LIBRARY="$PWD/build/libfusedloss.so"
# provenance: the tree the (carried) library was built from, as the Makefile recorded it
echo "### library built from $(cat build/BUILD_COMMIT 2>/dev/null || echo 'an unrecorded tree'); device tree $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $(date -u +%FT%TZ)" | tee -a "$OUT/tasks.log"
SUM=()
n=0
while IFS= read -r line; do
    case "$line" in ''|'#'*) continue ;; esac
    n=$((n + 1))
    lim=${line%% *}; cmd=${line#* }
    left=$((BUDGET - ($(date +%s) - T0)))
    (( left < 10 )) && { SUM+=("task $n skipped (budget): $cmd"); continue; }
    (( lim > left )) && lim=$left
    t=$(date +%s)
    echo "### [$n] (${lim}s) $cmd" | tee -a "$OUT/tasks.log"
    timeout "$lim" bash -c "$cmd" > /tmp/device-task.out 2>&1
    rc=$?
    tail -300 /tmp/device-task.out >> "$OUT/tasks.log"
    SUM+=("task $n rc=$rc $(( $(date +%s) - t ))s: $cmd")
done < "$1"
printf '%s\n' "${SUM[@]}" | tee -a "$OUT/tasks.log"
