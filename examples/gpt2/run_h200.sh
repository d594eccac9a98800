#!/usr/bin/env bash
# run_h200.sh — issue 7's measurement set on one H200, in under ~9 minutes; every output file
# under $OUT/gpt2 (logs, CSVs, JSONs, profiles, PNGs), one summary on stdout.
#
#   bash examples/gpt2/run_h200.sh                         # build (if needed) + the default set
#   STEPS="correctness" bash examples/gpt2/run_h200.sh     # the 200-step correctness run (~2 min)
#   STEPS="bench bench-compile" bash examples/gpt2/run_h200.sh
#
# Steps (STEPS, space- or comma-separated; default
# "build bench bench-llama correctness-short bench-compile"), each with its own time limit and
# never past BUDGET seconds from the start (the order puts the slowest, bench-compile, last):
#   build              build/libfusedloss.so with CUDA (make -j16 GPU_ARCH=90 lib) unless the one
#                      there already imports with CUDA (carry build/ to skip it); nvidia-smi, versions
#   bench              GPT-2 124M, B=16, T=1024, bf16, eager, real text: off then on, median step
#                      time, tokens/s, peak memory, lm_head + loss share, the largest micro-batch in
#                      40 GiB (binary search), torch.profiler top kernels of each
#   bench-llama        Llama-style (H=2048, 4 layers, V=128256), B=4, T=2048, SYNTHETIC tokens, eager:
#                      the same measurements
#   correctness-short  on vs off vs calibration, 50 steps of GPT-2 B=16 T=1024 on the KJV text
#   bench-compile      GPT-2 B=16 T=1024 with torch.compile on the model in both runs (+ profiles)
#   (--fusedloss on is the whole patch: linear CE + the fused bias-GeLU MLP for GPT-2, train.py's
#    --fused-gelu auto; the *-lce steps below measure the linear cross-entropy alone)
#   bench-lce          GPT-2 B=16 T=1024 eager, 'on' = the linear CE only (--fused-gelu off; not in
#                      the default set); bench-compile-lce the same under torch.compile;
#                      correctness-lce: correctness-short with it
#   correctness        the full check: 200 steps (not in the default set: ~2 minutes of its own)
# Env: OUT (default /tmp/out), STEPS, BUDGET (seconds, default 530), FL_COMMIT (recorded in every
#      JSON; the machine's copy may have no .git), GPU_ARCH (90), FORCE_BUILD=1 (always make lib),
#      TRAIN_ARGS (extra arguments appended to every train.py call, so they override the step's).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT="${OUT:-/tmp/out}"
O="$OUT/gpt2"
mkdir -p "$O"
STEPS="${STEPS:-build bench bench-llama correctness-short bench-compile}"
STEPS=" ${STEPS//,/ } "
BUDGET="${BUDGET:-530}"
GPU_ARCH="${GPU_ARCH:-90}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export FUSEDLOSS_LIBRARY="${FUSEDLOSS_LIBRARY:-$PWD/build/libfusedloss.so}"
if [ -z "${FL_COMMIT:-}" ]; then
    FL_COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    if [ "$FL_COMMIT" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        FL_COMMIT="$FL_COMMIT+dirty"
    fi
fi
export FL_COMMIT
T0=$SECONDS
SUMMARY=()
TRAIN="python3 examples/gpt2/train.py --out $O --no-progress"

want() { [[ "$STEPS" == *" $1 "* ]]; }

# run NAME LIMIT_S CMD...: the command under `timeout`, output in $O/NAME.log
run() {
    local name=$1 limit=$2; shift 2
    local left=$((BUDGET - (SECONDS - T0)))
    if [ "$left" -lt 20 ]; then
        SUMMARY+=("$(printf '%-18s SKIPPED (budget of %ss spent)' "$name" "$BUDGET")")
        echo "== $name: skipped, budget spent"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo "== $name (limit ${limit}s): $*"
    local t=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" > "$O/$name.log" 2>&1
    local rc=$?
    local verdict="ok"
    [ $rc -ne 0 ] && verdict="FAILED rc=$rc"
    [ $rc -eq 124 ] && verdict="TIMED OUT after ${limit}s"
    SUMMARY+=("$(printf '%-18s %-22s %4ss  %s' "$name" "$verdict" "$((SECONDS - t))" "$O/$name.log")")
    if [ $rc -ne 0 ]; then
        echo "-- $name: $verdict; log tail:"
        tail -n 25 "$O/$name.log"
    fi
    return 0
}

if want build; then
    {
        nvidia-smi || true
        python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
        python3 -m pip list 2>/dev/null | grep -i -E '^(torch|transformers|tokenizers|tqdm|matplotlib|numpy) ' || true
        echo "FL_COMMIT=$FL_COMMIT"
    } > "$O/env.log" 2>&1
    if [ "${FORCE_BUILD:-0}" = 1 ] || ! python3 -c "import fusedloss, sys; sys.exit(0 if fusedloss.cuda_built() else 1)" >/dev/null 2>&1; then
        run build 300 make -j16 GPU_ARCH="$GPU_ARCH" lib
    else
        SUMMARY+=("$(printf '%-18s %-22s' build 'ok (library present)')")
    fi
fi

want bench && run bench 160 $TRAIN --mode bench --model gpt2 --batch 16 --seq 1024 \
    --mem-budget-gib 40 --profile $TRAIN_ARGS
want bench-llama && run bench-llama 150 $TRAIN --mode bench --model llama-style --batch 4 \
    --seq 2048 --data synthetic --mem-budget-gib 40 --profile $TRAIN_ARGS
want correctness-short && run correctness-short 170 $TRAIN --mode correctness --model gpt2 \
    --batch 16 --seq 1024 --steps 50 --tag gpt2_real_B16_T1024_50steps $TRAIN_ARGS
want bench-compile && run bench-compile 300 $TRAIN --mode bench --model gpt2 --batch 16 \
    --seq 1024 --compile --profile $TRAIN_ARGS
want bench-lce && run bench-lce 150 $TRAIN --mode bench --model gpt2 --batch 16 --seq 1024 \
    --fused-gelu off --max-batch off --tag gpt2_real_B16_T1024_lce $TRAIN_ARGS
want bench-compile-lce && run bench-compile-lce 300 $TRAIN --mode bench --model gpt2 --batch 16 \
    --seq 1024 --compile --fused-gelu off --tag gpt2_real_B16_T1024_compile_lce $TRAIN_ARGS
want correctness-lce && run correctness-lce 170 $TRAIN --mode correctness --model gpt2 \
    --batch 16 --seq 1024 --steps 50 --fused-gelu off --tag gpt2_real_B16_T1024_50steps_lce $TRAIN_ARGS
want correctness && run correctness 400 $TRAIN --mode correctness --model gpt2 --batch 16 \
    --seq 1024 --steps 200 $TRAIN_ARGS

echo
echo "== results ($O; commit $FL_COMMIT; $((SECONDS - T0))s)"
for f in "$O"/bench_*B*_T*.txt; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f")"
    cat "$f"
done
for f in "$O"/correctness*.log; do
    [ -f "$f" ] || continue
    echo "-- $(basename "$f")"
    sed -n '/^correctness:/,$p' "$f" | grep -v '^plot:\|^->' || tail -n 20 "$f"
done
echo
printf '%s\n' "${SUMMARY[@]}"
# the device returns only a few files: everything of this run in one archive (TAR=0 keeps the tree)
if [ "${TAR:-1}" = 1 ]; then
    tar czf "$OUT/gpt2.tgz" -C "$OUT" gpt2 && rm -rf "$O" && echo "-> $OUT/gpt2.tgz"
fi
