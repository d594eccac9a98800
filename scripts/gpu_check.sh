#!/usr/bin/env bash
# gpu_check.sh — the one script to run on the GPU machine (H200): build, CPU tests, CUDA tests,
# compute-sanitizer, the C benchmark and the PyTorch peer comparison, each with a time limit.
#
#   bash scripts/gpu_check.sh                      # every step that fits BUDGET (default 530 s), in order
#   STEPS="bench" bash scripts/gpu_check.sh        # just the C benchmark (builds first if needed)
#   STEPS="build test-cuda" bash scripts/gpu_check.sh
#
# One device call (10 minutes at most) no longer holds every step: on an H100 (s28 run 6, FL_PREBUILT) build 18 s,
# test-cuda 34 s, test-knobs 283 s, and sanitize then had 92 s of its 360; zoo (~400 s) and the whole `-k cuda`
# pytest (> 200 s) need calls of their own, and gelu / lce / vp / peers are capped at 420 / 360 / 300 / 240 s. So
# a whole check is several calls, for example:
#   FL_PREBUILT=1 STEPS="build test-cuda test-knobs sanitize" BUDGET=560 bash scripts/gpu_check.sh
#   FL_PREBUILT=1 STEPS="zoo" BUDGET=570 bash scripts/gpu_check.sh   (s29: its C tests alone passed 420 s on an H100, cut
#     inside the distillation lines; split it by ZOO_TESTS, e.g. "test_elementwise_loss_cuda test_distill_cuda" /
#     "test_taylor_ce_cuda test_large_margin_ce_cuda test_margin_ce_cuda test_softmax_focal_cuda" / "test_lovasz_cuda"
#     with ZOO_PY=0 and ZOO_CAP=560, then ZOO_TESTS=none for the Python benches and tests)
#   FL_PREBUILT=1 STEPS="pytest bench" BUDGET=570 PYTEST_CAP=380 bash scripts/gpu_check.sh
#   FL_PREBUILT=1 STEPS="gelu" ..., STEPS="lce vp", STEPS="bench-ab peers" (one call each)
#
# Steps (STEPS, space- or comma-separated; default "all"):
#   build      nvidia-smi, `make -j16 GPU_ARCH=90`, then the CUDA test and the benchmark with the
#              Makefile's compile/link line (cc -std=c11 ... build/libfusedloss.a -lcudart_static ...)
#   test-cpu   make test
#   test-cuda  build/test_cross_entropy_cuda (full grid)
#   test-knobs the CUDA grid (--no-big) with the kernel choice forced by FUSEDLOSS_CE_TMA* knobs
#   sanitize   compute-sanitizer memcheck (--small --stride 2), racecheck (--small --stride 6),
#              memcheck with the staged kernel forced (--small --stride 3), racecheck of the refilled ring,
#              memcheck / racecheck with FUSEDLOSS_CE_PIPE_DN=0 (--small --stride 4 / 8)
#   bench      build/bench_cross_entropy --csv bench/results/<date>-<card>.csv (copied to $OUT)
#   bench-ab   the benchmark on the headline shapes once per BENCH_AB variant (knob settings)
#   peers      python3 bench/bench_peers.py --out $OUT/peers-<date>.json
#   gelu       GeLU (issue 6): build/test_gelu_cuda (fast 16-bit formulas, the default; --small: the exact
#              16-bit operations, and the slab path for contiguous inputs, FUSEDLOSS_GELU_STREAM=0), compute-sanitizer
#              memcheck on its small grid, build/bench_gelu (defaults, then each GELU_AB variant),
#              python3 bench/bench_gelu_torch.py (eager, torch.compile, MLP level), the Python
#              GeLU tests on the GPU; all output in $OUT/gelu.log (time cap GELU_CAP, default 420 s)
#   lce        linear cross-entropy (issue 5): build/test_linear_cross_entropy_cuda, compute-sanitizer
#              memcheck on its --small grid, build/bench_linear_ce, python3 bench/bench_lce_torch.py
#              (eager, torch.compile, Liger, fusedloss through Python); all output in $OUT/lce.log
#   vp         vocab-parallel CE (issue 9): build/test_vocab_parallel_cuda, memcheck + racecheck on its
#              --small grid, test_vp_nccl_cuda, the linear variant's test_vp_linear_cuda (+ memcheck
#              --small) and bench_vp_linear; with >= 2 GPUs torchrun python/tests/dist_vp_nccl.py and
#              bench/bench_vp.py (NCCL); all output in $OUT/vp.log
#   zoo        loss zoo (issue 8): the GPU tests of the elementwise losses, distillation, margin CE and
#              softmax focal, Lovasz, Taylor and large-margin CE (ZOO_TESTS; + memcheck / racecheck on their --small grids;
#              the elementwise one also --small with FUSEDLOSS_EW_EXACT16=1); unless
#              ZOO_PY=0, the benches (ZOO_BENCHES: bench_zoo, bench_distill, bench_softmax_losses, bench_lovasz,
#              bench_taylor) and
#              the CUDA cases of the zoo's Python tests (ZOO_PYTESTS); all output in $OUT/zoo.log
#   pytest     the Python package's CUDA tests (PYTHONPATH=python, build/libfusedloss.so)
# Every step's output goes to $OUT/<step>.log (OUT defaults to /tmp/out); stdout gets one line
# per step, the tail of any failing log, the benchmark summaries, and last a summary table.
# Env: OUT, STEPS, BUDGET (seconds for the whole script, default 530), FL_COMMIT, GPU_ARCH (90),
#      PEERS_PROVIDERS (bench_peers.py --providers), PEERS_REPS (30), BENCH_ARGS (extra args),
#      PYTEST_CAP (the pytest step's limit, 200 s; the whole CUDA suite needs more on a cold machine), PYTEST_ARGS.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
STEPS="${STEPS:-all}"
STEPS=" ${STEPS//,/ } "
BUDGET="${BUDGET:-530}"
GPU_ARCH="${GPU_ARCH:-90}"
T0=$(date +%s)
DATE=$(date -u +%F)

# a library built elsewhere and carried here (FL_PREBUILT) says which tree it came from: build/BUILD_COMMIT
# (written by the Makefile); the device copy's own git state can differ from it (s14 saw "-dirty")
if [ -z "${FL_COMMIT:-}" ] && [ -s build/BUILD_COMMIT ] && { [ -e build/libfusedloss.a.gz ] || [ "${FL_PREBUILT:-0}" = 1 ]; }; then
    FL_COMMIT="$(cat build/BUILD_COMMIT)"
fi
if [ -z "${FL_COMMIT:-}" ]; then
    FL_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [ "$FL_COMMIT" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        FL_COMMIT="$FL_COMMIT-dirty"
    fi
fi
export FL_COMMIT

NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
CUDA_HOME="${CUDA_HOME:-${NVCC:+$(dirname "$(dirname "$NVCC")")}}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
CUDA_LIBDIR="$CUDA_HOME/lib64"
[ -d "$CUDA_LIBDIR" ] || CUDA_LIBDIR="$CUDA_HOME/targets/x86_64-linux/lib"
SANITIZER=$(command -v compute-sanitizer || true)
for c in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
    [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER="$c"
done
# peers' pure-Python wheels carried in .whl/ (e.g. liger_kernel, see bench/bench_peers.py): installed once
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1 ||
        echo "warning: could not install the carried wheels"
fi
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_HOME CUDA_LIBDIR SANITIZER OUT DATE GPU_ARCH

CC="${CC:-cc}"
# the Makefile's conventions for tests and tools (see its $(BUILD)/% rule)
export FL_CFLAGS="-std=c11 -O2 -Wall -Wextra -fopenmp -Iinclude -I$CUDA_HOME/include"
# cuBLASLt (linear cross-entropy): the toolkit's, else the one PyTorch's wheels ship
BLAS_LIB="-L$CUDA_LIBDIR -lcublasLt -Wl,-rpath,$CUDA_LIBDIR"
if [ ! -e "$CUDA_LIBDIR/libcublasLt.so" ]; then
    d=$(python3 -c 'import nvidia.cu13, os; print(os.path.join(nvidia.cu13.__path__[0], "lib"))' 2>/dev/null ||
        python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null)
    [ -n "$d" ] && BLAS_LIB="-L$d -l:libcublasLt.so.13 -Wl,-rpath,$d" && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export FL_LIBS="build/libfusedloss.a $BLAS_LIB -L$CUDA_LIBDIR -lcudart_static -ldl -lrt -lstdc++ -lm -lpthread -fopenmp"
export CC

declare -A STATUS TIME KEY
ORDER=()

want() { [[ "$STEPS" == " all " || "$STEPS" == *" $1 "* ]]; }
elapsed() { echo $(( $(date +%s) - T0 )); }

# run_step NAME CAP_SECONDS COMMAND_STRING — runs under `timeout`, log in $OUT/NAME.log (appended)
run_step() {
    local name=$1 cap=$2 cmd=$3
    local left=$(( BUDGET - $(elapsed) - 10 ))
    local lim=$(( cap < left ? cap : left ))
    ORDER+=("$name")
    if (( lim < 15 )); then
        STATUS[$name]="SKIP"; TIME[$name]=0; KEY[$name]="no time left (BUDGET=$BUDGET s)"
        echo "== $name: skipped, no time left"
        return 1
    fi
    echo "== $name (limit ${lim}s) $(date -u +%T)"
    local t
    t=$(date +%s)
    timeout --kill-after=10 "$lim" bash -c "$cmd" >> "$OUT/$name.log" 2>&1
    local rc=$?
    TIME[$name]=$(( $(date +%s) - t ))
    if (( rc == 0 )); then STATUS[$name]="OK"
    elif (( rc == 124 || rc == 137 )); then STATUS[$name]="TIMEOUT"
    else STATUS[$name]="FAIL($rc)"; fi
    KEY[$name]=""
    echo "   $name: ${STATUS[$name]} in ${TIME[$name]}s"
    return $rc
}

# ---- environment -------------------------------------------------------------------------------
: > "$OUT/build.log"
for f in test-cpu test-cuda test-knobs sanitize bench bench-ab gelu lce vp zoo pytest peers; do want "$f" && : > "$OUT/$f.log"; done
{
    echo "# gpu_check.sh $(date -u +%FT%TZ) commit $FL_COMMIT steps:$STEPS"
    nvidia-smi 2>&1 || echo "nvidia-smi not available"
    echo "nvcc: ${NVCC:-none} $("${NVCC:-false}" --version 2>/dev/null | tail -1)"
    echo "cc: $($CC --version 2>/dev/null | head -1)"
    echo "compute-sanitizer: ${SANITIZER:-none}"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
} | tee -a "$OUT/build.log"

# ---- build ---------------------------------------------------------------------------------------
# The benchmark and test binaries are needed by later steps: build when asked or when missing.
NEED_BUILD=0
want build && NEED_BUILD=1
for b in build/libfusedloss.a build/libfusedloss.so build/test_cross_entropy_cuda build/bench_cross_entropy; do
    [ -e "$b" ] || NEED_BUILD=1
done
# FL_PREBUILT with only build/libfusedloss.a carried (the .a and .so together passed the 64 MiB
# carry limit once the elementwise kernels landed): the .so is linked here from the archive
if [ -n "${FL_PREBUILT:-}" ] && [ -e build/libfusedloss.a ] && [ ! -e build/libfusedloss.so ]; then
    echo "+ linking build/libfusedloss.so from build/libfusedloss.a" | tee -a "$OUT/build.log"
    $CC -shared -o build/libfusedloss.so -Wl,--whole-archive build/libfusedloss.a -Wl,--no-whole-archive \
        -Wl,--version-script=src/libfusedloss.map -L"$CUDA_LIBDIR" -lcublasLt -Wl,-rpath,"$CUDA_LIBDIR" \
        -lcudart_static -ldl -lrt -lstdc++ -lm -lpthread -fopenmp >> "$OUT/build.log" 2>&1 || echo "   (failed)"
fi
if (( NEED_BUILD )) && [ -n "${FL_PREBUILT:-}" ] && [ -e build/libfusedloss.a ] && [ -e build/libfusedloss.so ]; then
    # FL_PREBUILT=1: the library was built on the development machine and carried (the binaries
    # that link it statically are ~19 MB each, over the carry limit): link the C programs only
    run_step build 120 '
        rc=0
        for t in tests/*_cuda.c bench/bench_*.c; do
            b=build/$(basename "$t" .c)
            [ -e "$b" ] && { echo "= $b carried"; continue; }
            echo "+ $CC $FL_CFLAGS $t -o $b $FL_LIBS"; $CC $FL_CFLAGS "$t" -o "$b" $FL_LIBS || rc=1
        done
        exit $rc
    '
    KEY[build]="prebuilt library; $(ls build/test_cross_entropy_cuda build/bench_cross_entropy 2>/dev/null | wc -l)/2 programs linked"
elif (( NEED_BUILD )); then
    # --threads 0: nvcc compiles the sm_90 / sm_80 / compute_80 targets in parallel
    run_step build 240 '
        rc=0
        if ! make -j16 GPU_ARCH=$GPU_ARCH EXTRA_NVCCFLAGS="--threads 0"; then
            rc=1
            echo "### make (all) failed; building the library alone"
            make -j16 GPU_ARCH=$GPU_ARCH EXTRA_NVCCFLAGS="--threads 0" lib || exit 1
        fi
        echo "+ $CC $FL_CFLAGS tests/test_cross_entropy_cuda.c -o build/test_cross_entropy_cuda $FL_LIBS"
        $CC $FL_CFLAGS tests/test_cross_entropy_cuda.c -o build/test_cross_entropy_cuda $FL_LIBS || rc=1
        echo "+ $CC $FL_CFLAGS bench/bench_cross_entropy.c -o build/bench_cross_entropy $FL_LIBS"
        $CC $FL_CFLAGS bench/bench_cross_entropy.c -o build/bench_cross_entropy $FL_LIBS || rc=1
        exit $rc
    '
    KEY[build]="$(grep -c 'warning' "$OUT/build.log" | tr -d ' ') warning lines; $(ls build/libfusedloss.a build/test_cross_entropy_cuda build/bench_cross_entropy 2>/dev/null | wc -l)/3 artifacts"
fi

have() { [ -e "$1" ] || { ORDER+=("$2"); STATUS[$2]="SKIP"; TIME[$2]=0; KEY[$2]="$1 missing (build failed?)"; echo "== $2: skipped, $1 missing"; return 1; }; }

# ---- CPU tests ---------------------------------------------------------------------------------
# (FL_PREBUILT: skipped. The carried library has no object files, so `make test` rebuilt every CUDA object and
# timed out, s28; CI runs the CPU tests on every landing.)
if want test-cpu && [ -z "${FL_PREBUILT:-}" ]; then
    run_step test-cpu 90 'make -j16 GPU_ARCH=$GPU_ARCH EXTRA_NVCCFLAGS="--threads 0" test'
    KEY[test-cpu]=$(grep -hE '^[0-9]+ passed, [0-9]+ failed' "$OUT/test-cpu.log" |
        awk '{p+=$1; f+=$3} END {if (NR) printf "%d passed, %d failed (%d programs)", p, f, NR; else print "no summary line"}')
    grep -q '^overall okay: 1' "$OUT/test-cpu.log" && KEY[test-cpu]+="; overall okay: 1"
fi

# ---- CUDA tests ----------------------------------------------------------------------------------
if want test-cuda && have build/test_cross_entropy_cuda test-cuda; then
    run_step test-cuda 240 'build/test_cross_entropy_cuda'
    KEY[test-cuda]=$(grep -E '^[0-9]+ passed, [0-9]+ failed|^SKIP|^FATAL' "$OUT/test-cuda.log" | tail -1)
    n=$(grep -c '^FAIL' "$OUT/test-cuda.log")
    (( n > 0 )) && KEY[test-cuda]+="; first FAIL: $(grep -m1 '^FAIL' "$OUT/test-cuda.log" | cut -c1-90)"
fi

# ---- CUDA tests under the kernel-choice knobs ---------------------------------------------------
# The same grid (without the N = 8192 shapes) with the other code paths forced: tiny shared-memory
# chunks (clusters of up to 16 CTAs on the test shapes, staged backward) and the sm_90 staged
# kernel off (the chunked two-pass path that sm_80 and fallbacks use).
if want test-knobs && have build/test_cross_entropy_cuda test-knobs; then
    run_step test-knobs 300 '
        rc=0
        echo "### FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=2 FUSEDLOSS_CE_TMA_BWD=1"
        FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=2 FUSEDLOSS_CE_TMA_BWD=1 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 FUSEDLOSS_CE_PIPE_THREADS=128"
        FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 FUSEDLOSS_CE_PIPE_THREADS=128 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=0 FUSEDLOSS_CE_PIPE_KB=5 FUSEDLOSS_CE_PIPE_NBUF=4 FUSEDLOSS_CE_PIPE_THREADS=256 FUSEDLOSS_CE_PIPE_STATS=64"
        FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=0 FUSEDLOSS_CE_PIPE_KB=5 FUSEDLOSS_CE_PIPE_NBUF=4 FUSEDLOSS_CE_PIPE_THREADS=256 FUSEDLOSS_CE_PIPE_STATS=64 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PIPE_NBAR=1 FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 (the hardware-barrier slot release, slots refilled)"
        FUSEDLOSS_CE_PIPE_NBAR=1 FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PIPE_TMAP=0 (the producer by raw bulk copies, the default before s21), default plans, then slots refilled, then whole chunks"
        FUSEDLOSS_CE_PIPE_TMAP=0 build/test_cross_entropy_cuda --no-big || rc=1
        FUSEDLOSS_CE_PIPE_TMAP=0 FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 build/test_cross_entropy_cuda --no-big || rc=1
        FUSEDLOSS_CE_PIPE_TMAP=0 FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=0 FUSEDLOSS_CE_PIPE_KB=5 FUSEDLOSS_CE_PIPE_NBUF=4 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### the default (tensor-map) producer with slots refilled, then whole chunks"
        FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 build/test_cross_entropy_cuda --no-big || rc=1
        FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=0 FUSEDLOSS_CE_PIPE_KB=5 FUSEDLOSS_CE_PIPE_NBUF=4 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PIPE_THREADS=800 (the option-free ring kernel at its launch bound)"
        FUSEDLOSS_CE_PIPE_THREADS=800 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PDL=0 (graph capture without programmatic dependent launch)"
        FUSEDLOSS_CE_PDL=0 build/test_cross_entropy_cuda --filter graph || rc=1
        echo "### FUSEDLOSS_CE_PIPE_DN_FOLD=0 (s26 DN alone: denominators counted in the pipe kernel, then the reduce kernel), default plans, then slots refilled"
        FUSEDLOSS_CE_PIPE_DN_FOLD=0 build/test_cross_entropy_cuda --no-big || rc=1
        FUSEDLOSS_CE_PIPE_DN_FOLD=0 FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PIPE_DN=0 (the setup and reduce kernels around the pipe kernel, as before s27), default plans, then slots refilled"
        FUSEDLOSS_CE_PIPE_DN=0 build/test_cross_entropy_cuda --no-big || rc=1
        FUSEDLOSS_CE_PIPE_DN=0 FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### DN + FOLD (the default since s27) with its slots refilled"
        FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PLAIN_ST=0 (evict-first gradient stores in the ring / staged kernels too)"
        FUSEDLOSS_CE_PLAIN_ST=0 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=8 FUSEDLOSS_CE_TMA_NSUB=1 FUSEDLOSS_CE_TMA_FWD=1 FUSEDLOSS_CE_TMA_BWD=1 FUSEDLOSS_CE_TMA_THREADS=128"
        FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=8 FUSEDLOSS_CE_TMA_NSUB=1 FUSEDLOSS_CE_TMA_FWD=1 FUSEDLOSS_CE_TMA_BWD=1 FUSEDLOSS_CE_TMA_THREADS=128 \
            build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_TMA_KB=4 FUSEDLOSS_CE_TMA_NSUB=8 FUSEDLOSS_CE_STREAM=2 FUSEDLOSS_CE_STREAM_KB=8"
        FUSEDLOSS_CE_TMA_KB=4 FUSEDLOSS_CE_TMA_NSUB=8 FUSEDLOSS_CE_STREAM=2 FUSEDLOSS_CE_STREAM_KB=8 \
            build/test_cross_entropy_cuda --no-big || rc=1
        echo "### FUSEDLOSS_CE_TMA=0 FUSEDLOSS_CE_STREAM=0"
        FUSEDLOSS_CE_TMA=0 FUSEDLOSS_CE_STREAM=0 build/test_cross_entropy_cuda --no-big || rc=1
        echo "### logit offsets (s30): the ring as before (OFF_PIPE=1), and the forward on the streaming kernel (OFF_FWD=0; staged by default since s31)"
        FUSEDLOSS_CE_OFF_PIPE=1 build/test_cross_entropy_cuda --filter off || rc=1
        FUSEDLOSS_CE_OFF_FWD=0 build/test_cross_entropy_cuda --filter off || rc=1
        exit $rc
    '
    KEY[test-knobs]=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/test-knobs.log" | awk '{p+=$1; f+=$3} END {printf "%d passed, %d failed (%d runs)", p, f, NR}')
fi

# ---- compute-sanitizer -------------------------------------------------------------------------
if want sanitize && have build/test_cross_entropy_cuda sanitize; then
    if [ -z "$SANITIZER" ]; then
        ORDER+=(sanitize); STATUS[sanitize]="SKIP"; TIME[sanitize]=0; KEY[sanitize]="compute-sanitizer not found"
    else
        run_step sanitize 360 '
            rc=0
            echo "### memcheck"
            timeout 100 "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 99 \
                build/test_cross_entropy_cuda --small --stride 2 || rc=$?
            echo "### memcheck exit $rc"
            rc2=0
            echo "### racecheck"
            timeout 45 "$SANITIZER" --tool racecheck --print-limit 20 --error-exitcode 99 \
                build/test_cross_entropy_cuda --small --stride 6 || rc2=$?
            echo "### racecheck exit $rc2"
            rc3=0
            echo "### memcheck, staged kernel forced + streaming backward (FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=2 FUSEDLOSS_CE_TMA_FWD=1 FUSEDLOSS_CE_STREAM=2 FUSEDLOSS_CE_STREAM_KB=8)"
            FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=2 FUSEDLOSS_CE_TMA_FWD=1 FUSEDLOSS_CE_STREAM=2 FUSEDLOSS_CE_STREAM_KB=8 timeout 60 "$SANITIZER" --tool memcheck --print-limit 20 \
                --error-exitcode 99 build/test_cross_entropy_cuda --small --stride 3 || rc3=$?
            echo "### memcheck-staged exit $rc3"
            rc4=0
            echo "### racecheck, staged kernel forced (FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=2 FUSEDLOSS_CE_TMA_FWD=1 FUSEDLOSS_CE_TMA_BWD=1)"
            FUSEDLOSS_CE_PIPE=0 FUSEDLOSS_CE_TMA_KB=2 FUSEDLOSS_CE_TMA_FWD=1 FUSEDLOSS_CE_TMA_BWD=1 timeout 45 "$SANITIZER" --tool racecheck --print-limit 20 \
                --error-exitcode 99 build/test_cross_entropy_cuda --small --stride 7 || rc4=$?
            echo "### racecheck-staged exit $rc4"
            rc5=0
            echo "### racecheck, the ring with its slots refilled (FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 FUSEDLOSS_CE_TMA_GRID=1; the tensor-map producer, default since s21)"
            FUSEDLOSS_CE_PIPE=2 FUSEDLOSS_CE_PIPE_SUB=1 FUSEDLOSS_CE_PIPE_RING=16 FUSEDLOSS_CE_PIPE_SLACK=1 FUSEDLOSS_CE_TMA_GRID=1 timeout 90 "$SANITIZER" --tool racecheck --print-limit 20 \
                --error-exitcode 99 build/test_cross_entropy_cuda --small --stride 24 || rc5=$?
            echo "### racecheck-refills exit $rc5"
            rc6=0
            echo "### memcheck and racecheck, the setup and reduce kernels around the pipe kernel (FUSEDLOSS_CE_PIPE_DN=0: before s27; DN + FOLD is the default above)"
            FUSEDLOSS_CE_PIPE_DN=0 timeout 60 "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 99 \
                build/test_cross_entropy_cuda --small --stride 4 || rc6=$?
            FUSEDLOSS_CE_PIPE_DN=0 timeout 45 "$SANITIZER" --tool racecheck --print-limit 20 --error-exitcode 99 \
                build/test_cross_entropy_cuda --small --stride 8 || rc6=$?
            echo "### sanitize-dn exit $rc6"
            [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ $rc4 -eq 0 ] && [ $rc5 -eq 0 ] && [ $rc6 -eq 0 ]
        '
        mc=$(grep -m1 'ERROR SUMMARY' "$OUT/sanitize.log" | sed 's/.*ERROR SUMMARY: //')
        rcs=$(grep -m1 'RACECHECK SUMMARY' "$OUT/sanitize.log" | sed 's/.*RACECHECK SUMMARY: //')
        mc3=$(grep 'ERROR SUMMARY' "$OUT/sanitize.log" | sed -n 2p | sed 's/.*ERROR SUMMARY: //')
        rc4s=$(grep 'RACECHECK SUMMARY' "$OUT/sanitize.log" | sed -n 2p | sed 's/.*RACECHECK SUMMARY: //')
        rc5s=$(grep 'RACECHECK SUMMARY' "$OUT/sanitize.log" | sed -n 3p | sed 's/.*RACECHECK SUMMARY: //')
        KEY[sanitize]="memcheck: ${mc:-no summary}; racecheck: ${rcs:-no summary}; memcheck staged: ${mc3:-no summary}; racecheck staged: ${rc4s:-no summary}; racecheck refills: ${rc5s:-no summary}"
        if grep -qE 'Device not supported|not supported on this (device|platform)' "$OUT/sanitize.log"; then
            STATUS[sanitize]="N/A"; KEY[sanitize]="compute-sanitizer cannot run on this machine (see sanitize.log)"
        fi
        grep -q '^### memcheck exit 124' "$OUT/sanitize.log" && KEY[sanitize]+=" (memcheck timed out)"
        grep -q '^### racecheck exit 124' "$OUT/sanitize.log" && KEY[sanitize]+=" (racecheck timed out)"
        grep -q '^### racecheck-refills exit 124' "$OUT/sanitize.log" && KEY[sanitize]+=" (racecheck with refills timed out)"
    fi
fi

# ---- C benchmark ---------------------------------------------------------------------------------
# the card in the file name (it was always "h200", also for the H100s the device tool lends: s38 run 1)
CARD=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true) | head -1 | grep -oiE 'h[0-9]{3}' | head -1 | tr 'A-Z' 'a-z')
CARD=${CARD:-gpu}
CSV="bench/results/$DATE-$CARD.csv"
if want bench && have build/bench_cross_entropy bench; then
    mkdir -p bench/results
    export CSV
    run_step bench 150 'build/bench_cross_entropy --csv "$CSV" ${BENCH_ARGS:-}'
    [ -f "$CSV" ] && cp "$CSV" "$OUT/bench-$DATE-$CARD.csv"
    KEY[bench]=$(grep -m1 '^SUMMARY copy' "$OUT/bench.log" | sed 's/^SUMMARY //')
    k=$(grep -m1 '^SUMMARY 8192x128256 bf16 mean ' "$OUT/bench.log" | sed 's/^SUMMARY 8192x128256 bf16 mean *//')
    [ -n "$k" ] && KEY[bench]+="; 8192x128256 bf16: $k"
    [ -z "${KEY[bench]}" ] && KEY[bench]=$(grep -m1 -E '^SKIP|error' "$OUT/bench.log" | cut -c1-100)
fi

# ---- C benchmark A/B over the knobs --------------------------------------------------------------
# BENCH_AB: ';'-separated variants, each a space-separated list of VAR=VALUE (FUSEDLOSS_CE_*), run
# on BENCH_AB_CASES (default: the four headline shapes); rows go to the same CSV with the variant
# appended to the commit column.
if want bench-ab && have build/bench_cross_entropy bench-ab; then
    export BENCH_AB="${BENCH_AB:-FUSEDLOSS_CE_STREAM=0;FUSEDLOSS_CE_TMA_NSUB=1;FUSEDLOSS_CE_TMA_NSUB=2;FUSEDLOSS_CE_TMA_NSUB=8;FUSEDLOSS_CE_TMA_KB=200;FUSEDLOSS_CE_TMA_KB=64;FUSEDLOSS_CE_TMA_FWD=1 FUSEDLOSS_CE_TMA_BWD=1;FUSEDLOSS_CE_STREAM_KB=32;FUSEDLOSS_CE_STREAM_KB=256}"
    export BENCH_AB_CASES="${BENCH_AB_CASES:---case 8192 128256 bf16 --case 4096 50257 f32 --case 2048 32000 f16 --case 4096 256000 bf16}"
    mkdir -p bench/results
    export CSV
    run_step bench-ab 200 '
        IFS=";" read -ra VARS <<< "$BENCH_AB"
        for v in "${VARS[@]}"; do
            echo "### variant: $v"
            env $v FL_COMMIT="$FL_COMMIT+${v// /+}" build/bench_cross_entropy --csv "$CSV" --reps 30 $BENCH_AB_CASES | grep -E "^SUMMARY|rror"
        done
    '
    [ -f "$CSV" ] && cp "$CSV" "$OUT/bench-$DATE-$CARD.csv"
    KEY[bench-ab]="$(grep -c '^### variant' "$OUT/bench-ab.log") variants"
fi

# ---- GeLU (issue 6) ------------------------------------------------------------------------------
if want gelu && have build/test_gelu_cuda gelu; then
    export GELU_AB="${GELU_AB:-}"
    run_step gelu "${GELU_CAP:-420}" '
        rc=0
        set -o pipefail   # a failing test under | grep | tail must fail the step (run 2 showed OK with 2 failed)
        echo "### test_gelu_cuda ${GELU_TEST_ARGS:-} (failures and the summary; passing cases not shown)"
        build/test_gelu_cuda ${GELU_TEST_ARGS:-} | grep -v "^OK " | tail -40 || rc=1
        echo "### test_gelu_cuda --exact16 --small (the exact 16-bit operations)"
        build/test_gelu_cuda --exact16 --small | tail -3 || rc=1
        echo "### FUSEDLOSS_GELU_STREAM=0 test_gelu_cuda --small (the slab path for contiguous inputs too)"
        FUSEDLOSS_GELU_STREAM=0 build/test_gelu_cuda --small | tail -3 || rc=1
        echo "### FUSEDLOSS_GELU_STREAM_WAVES=0.001 test_gelu_cuda --small (a one-CTA stream grid: many iterations)"
        FUSEDLOSS_GELU_STREAM_WAVES=0.001 build/test_gelu_cuda --small | grep -v "^OK " | tail -6 || rc=1
        echo "### FUSEDLOSS_GELU_DBIAS_SUM=0 / DBIAS_RPB=1 test_gelu_cuda --small (the counter finish; the shortest dbias row blocks)"
        FUSEDLOSS_GELU_DBIAS_SUM=0 build/test_gelu_cuda --small | tail -2 || rc=1
        FUSEDLOSS_GELU_DBIAS_RPB=1 build/test_gelu_cuda --small | tail -2 || rc=1
        if [ -n "$SANITIZER" ]; then
            echo "### memcheck test_gelu_cuda --small --stride 5"
            timeout 75 "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 99 build/test_gelu_cuda --small --stride 5 | tail -4 || rc=1
            echo "### racecheck test_gelu_cuda --small --stride 11"
            timeout 45 "$SANITIZER" --tool racecheck --print-limit 20 --error-exitcode 99 build/test_gelu_cuda --small --stride 11 | tail -3 || rc=1
        fi
        if [ -x build/bench_gelu ]; then
            echo "### bench_gelu (defaults)"; build/bench_gelu --csv "$OUT/gelu-bench.csv" | tail -40
            IFS=";" read -ra VARS <<< "$GELU_AB"
            for v in "${VARS[@]}"; do
                [ -z "$v" ] && continue
                echo "### bench_gelu variant: $v"; env $v build/bench_gelu | grep -E "SUMMARY|rror"
            done
        fi
        if [ -e build/libfusedloss.so ]; then
            echo "### bench_gelu_torch.py"
            PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so timeout 170 python3 bench/bench_gelu_torch.py --out "$OUT/gelu-torch.json" ${GELU_TORCH_ARGS:-} 2>&1 | tail -40
            echo "### pytest python/tests/test_gelu.py (CUDA)"
            PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so timeout 120 python3 -m pytest -q -x -k cuda python/tests/test_gelu.py 2>&1 | tail -5
            for e16 in 0 1; do
                echo "### pytest python/tests/test_gelu.py (CUDA) with FUSEDLOSS_GELU_EXACT16=$e16"
                FUSEDLOSS_GELU_EXACT16=$e16 PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so timeout 90 python3 -m pytest -q -k cuda python/tests/test_gelu.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -8
            done
        fi
        exit $rc
    '
    KEY[gelu]=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$OUT/gelu.log" | head -1)
fi

# ---- linear cross-entropy ------------------------------------------------------------------------
if want lce && have build/test_linear_cross_entropy_cuda lce; then
    run_step lce "${LCE_CAP:-360}" '
        set -o pipefail   # a failure under | tail must fail the step
        rc=0
        echo "### test_linear_cross_entropy_cuda"
        timeout 150 build/test_linear_cross_entropy_cuda || rc=1
        if [ -n "$SANITIZER" ]; then
            echo "### memcheck --small"
            timeout 90 "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 99 \
                build/test_linear_cross_entropy_cuda --small || rc=1
        fi
        echo "### bench_linear_ce"
        timeout 120 build/bench_linear_ce ${LCE_BENCH_ARGS:-} || rc=1
        for v in ${LCE_AB:-}; do
            echo "### bench_linear_ce variant $v"
            env $v timeout 60 build/bench_linear_ce ${LCE_AB_ARGS:-} || rc=1
        done
        if [ "${LCE_TORCH:-1}" = 1 ]; then
            echo "### bench_lce_torch.py"
            PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" FUSEDLOSS_LIBRARY=build/libfusedloss.so timeout ${LCE_TORCH_CAP:-200} \
                python3 bench/bench_lce_torch.py --out "$OUT/lce-peers-$DATE.json" ${LCE_TORCH_ARGS:-} || rc=1
        fi
        if [ -n "${LCE_PROF:-}" ]; then
            NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
            echo "### nsys: ${NSYS:-none}"
            if [ -n "$NSYS" ]; then
                "$NSYS" profile -o /tmp/lce_prof -f true --stats=false build/bench_linear_ce $LCE_PROF --reps 3 --warmup 1 >/dev/null 2>&1
                "$NSYS" stats --report cuda_gpu_kern_sum --format csv /tmp/lce_prof.nsys-rep 2>/dev/null | cut -c1-260 | head -40
            fi
        fi
        exit $rc
    '
    KEY[lce]="$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$OUT/lce.log" | head -1); memcheck: $(grep -m1 "ERROR SUMMARY" "$OUT/lce.log" | sed "s/.*ERROR SUMMARY: //")"
fi

# ---- vocab-parallel cross-entropy (issue 9) ------------------------------------------------------
# The C GPU test (+ memcheck/racecheck --small) on one GPU; with >= 2 GPUs the torchrun NCCL test
# and bench_vp.py (NCCL_NVLS_ENABLE=0: NVLink multicast stays off on the lent machines).
if want vp && have build/test_vocab_parallel_cuda vp; then
    run_step vp "${VP_CAP:-300}" '
        set -o pipefail
        rc=0
        echo "### test_vocab_parallel_cuda"
        timeout 120 build/test_vocab_parallel_cuda || rc=1
        if [ -n "$SANITIZER" ]; then
            for tool in memcheck racecheck; do
                echo "### $tool --small"
                timeout 90 "$SANITIZER" --tool $tool --print-limit 20 --error-exitcode 99 \
                    build/test_vocab_parallel_cuda --small | tail -3 || rc=1
            done
        fi
        NCCL_LIB=$(ls /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 2>/dev/null | head -1)
        [ -z "$NCCL_LIB" ] && NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], \"lib\", \"libnccl.so.2\"))" 2>/dev/null)
        echo "### test_vp_nccl_cuda (NCCL: ${NCCL_LIB:-not found})"
        FUSEDLOSS_NCCL_LIBRARY="$NCCL_LIB" NCCL_NVLS_ENABLE=0 timeout 90 build/test_vp_nccl_cuda || rc=1
        if [ -e build/test_vp_linear_cuda ]; then
            echo "### test_vp_linear_cuda (the linear variant; NCCL: ${NCCL_LIB:-not found})"
            FUSEDLOSS_NCCL_LIBRARY="$NCCL_LIB" NCCL_NVLS_ENABLE=0 timeout 150 build/test_vp_linear_cuda || rc=1
            if [ -n "$SANITIZER" ]; then
                # without the NCCL entry: ncclCommInitAll probes kernel images and memcheck reports those
                # API errors (cudaErrorNoKernelImageForDevice, inside libnccl); the
                # kernels of the NCCL entry are checked in a second run with API-error reports off
                echo "### memcheck test_vp_linear_cuda --small --no-nccl"
                timeout 120 "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 99 \
                    build/test_vp_linear_cuda --small --no-nccl | tail -3 || rc=1
                echo "### memcheck test_vp_linear_cuda --small (NCCL entry; --report-api-errors no)"
                FUSEDLOSS_NCCL_LIBRARY="$NCCL_LIB" NCCL_NVLS_ENABLE=0 timeout 120 "$SANITIZER" --tool memcheck \
                    --report-api-errors no --print-limit 20 --error-exitcode 99 build/test_vp_linear_cuda --small | tail -3 || rc=1
            fi
        fi
        if [ -e build/bench_vp_linear ]; then
            echo "### bench_vp_linear (rank 0 of TP = k on one GPU)"
            FUSEDLOSS_NCCL_LIBRARY="$NCCL_LIB" NCCL_NVLS_ENABLE=0 timeout 90 build/bench_vp_linear ${VPL_BENCH_ARGS:-} || rc=1
        fi
        echo "### pytest python/tests/test_vocab_parallel.py (CUDA cases)"
        PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so timeout 120 python3 -m pytest -q -x -k cuda \
            python/tests/test_vocab_parallel.py 2>&1 | tail -4 || rc=1
        ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
        if [ "$ngpu" -ge 2 ]; then
            export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" FUSEDLOSS_LIBRARY=$PWD/build/libfusedloss.so NCCL_NVLS_ENABLE=0
            echo "### torchrun dist_vp_nccl.py (2 GPUs)"
            timeout 200 torchrun --standalone --nproc_per_node 2 python/tests/dist_vp_nccl.py 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*" || rc=1
            echo "### torchrun bench_vp.py (2 GPUs)"
            timeout 150 torchrun --standalone --nproc_per_node 2 bench/bench_vp.py --out "$OUT/vp-bench-$DATE.json" 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*\*\*" || rc=1
        else
            echo "### one GPU: the NCCL test needs nvidia-h200-x2 (skipped); bench_vp.py --simulate"
            PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so timeout 150 python3 bench/bench_vp.py --simulate \
                --out "$OUT/vp-bench-sim-$DATE.json" || rc=1
        fi
        exit $rc
    '
    KEY[vp]="$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$OUT/vp.log" | head -1); $(grep -m1 "^vp-nccl" "$OUT/vp.log" | sed "s/ on .*)://")"
fi

# ---- loss zoo (issue 8) ---------------------------------------------------------------------------
if want zoo && have build/test_elementwise_loss_cuda zoo; then
    run_step zoo "${ZOO_CAP:-420}" '
        set -o pipefail   # a failure under | tail must fail the step
        rc=0
        for t in ${ZOO_TESTS:-test_elementwise_loss_cuda test_distill_cuda test_margin_ce_cuda test_softmax_focal_cuda test_lovasz_cuda test_taylor_ce_cuda test_large_margin_ce_cuda}; do
            [ -x build/$t ] || { echo "### build/$t missing"; continue; }
            echo "### $t"; timeout 240 build/$t > "$OUT/$t.out" 2>&1 || rc=1; grep -m60 -E "FAIL|input of" "$OUT/$t.out"; tail -5 "$OUT/$t.out"
            if [ "$t" = test_distill_cuda ]; then   # the KL ring (default) walking rows; the staged kernel (JSD too) walking several rows per cluster; the ticket kernel alone
                echo "### FUSEDLOSS_DISTILL_PIPE_GRID=3 $t --small"
                FUSEDLOSS_DISTILL_PIPE_GRID=3 timeout 90 build/$t --small 2>&1 | grep -v pipelined | grep -E -m20 "FAIL|input of|passed" || rc=1
                echo "### FUSEDLOSS_DISTILL_PIPE=0 FUSEDLOSS_DISTILL_STAGED=2 FUSEDLOSS_DISTILL_STAGED_GRID=3 $t --small"
                FUSEDLOSS_DISTILL_PIPE=0 FUSEDLOSS_DISTILL_STAGED=2 FUSEDLOSS_DISTILL_STAGED_GRID=3 timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                echo "### FUSEDLOSS_DISTILL_PIPE=0 FUSEDLOSS_DISTILL_STAGED=2 FUSEDLOSS_DISTILL_STAGED_ROWS=2 FUSEDLOSS_DISTILL_STAGED_GRID=3 $t --small"
                FUSEDLOSS_DISTILL_PIPE=0 FUSEDLOSS_DISTILL_STAGED=2 FUSEDLOSS_DISTILL_STAGED_ROWS=2 FUSEDLOSS_DISTILL_STAGED_GRID=3 timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                echo "### FUSEDLOSS_DISTILL_PIPE=0 FUSEDLOSS_DISTILL_STAGED=0 $t --small"
                FUSEDLOSS_DISTILL_PIPE=0 FUSEDLOSS_DISTILL_STAGED=0 timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                # the statistics with exact per-vector maxima (LAZY=0; lazy references are the default since s29); the rings of s18: rows not 16-byte aligned (HEAD, the default since s22: =0 the ticket kernel), the
                # hardware-barrier slot release (NBAR, opt-in); the group reduction instead of the per-warp exchange (WX=0; WX is the default since s35), also through maps
                for kv in "FUSEDLOSS_DISTILL_PIPE_LAZY=0" "FUSEDLOSS_DISTILL_PIPE_LAZY=0 FUSEDLOSS_DISTILL_PIPE_GRID=3" "FUSEDLOSS_DISTILL_PIPE_HEAD=0" "FUSEDLOSS_DISTILL_PIPE_GRID=3" "FUSEDLOSS_DISTILL_PIPE_NBAR=1 FUSEDLOSS_DISTILL_PIPE_GRID=3" "FUSEDLOSS_DISTILL_PIPE_TMAP=1" "FUSEDLOSS_DISTILL_PIPE_TMAP=1 FUSEDLOSS_DISTILL_PIPE_GRID=3" "FUSEDLOSS_DISTILL_PIPE_WX=0 FUSEDLOSS_DISTILL_PIPE_GRID=3" "FUSEDLOSS_DISTILL_PIPE_WX=0 FUSEDLOSS_DISTILL_PIPE_TMAP=1"; do   # + the tensor-map producer of s19
                    echo "### $kv $t --small --kl"
                    env $kv timeout 90 build/$t --small --kl 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                done
                # the fused JSD (on the ring by default since s39): the ring at a small grid and through maps, and the
                # ticket kernel it replaced (_JSD=0); the ring without the stash (_JST=0; the stash is the default since
                # s40; the guard-free sweep + diet since s43) and at cluster 8 (two merged partials a lane, s40); every mode
                for kv in "FUSEDLOSS_DISTILL_PIPE_GRID=3" "FUSEDLOSS_DISTILL_PIPE_TMAP=1" "FUSEDLOSS_DISTILL_PIPE_JSD=0" "FUSEDLOSS_DISTILL_PIPE_JST=0 FUSEDLOSS_DISTILL_PIPE_GRID=3" "FUSEDLOSS_DISTILL_PIPE_CS=8"; do
                    echo "### $kv $t --small"
                    env $kv timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                done
            fi
            if [ "$t" = test_taylor_ce_cuda ]; then   # the CTA kernels (the ring is the default for fused rows of > 1024 classes)
                echo "### FUSEDLOSS_TC_PIPE=0 $t --small"
                FUSEDLOSS_TC_PIPE=0 timeout 90 build/$t --small 2>&1 | grep -E -m20 "^FAIL|passed|failed" || rc=1
                echo "### FUSEDLOSS_TC_PIPE_TMAP=0 $t, then with FUSEDLOSS_TC_PIPE_GRID=1 --small"   # the producer by raw bulk copies (the default before s21)
                FUSEDLOSS_TC_PIPE_TMAP=0 timeout 120 build/$t 2>&1 | grep -E -m20 "^FAIL|passed|failed" || rc=1
                FUSEDLOSS_TC_PIPE_TMAP=0 FUSEDLOSS_TC_PIPE_GRID=1 timeout 90 build/$t --small 2>&1 | grep -E -m20 "^FAIL|passed|failed" || rc=1
                echo "### FUSEDLOSS_TC_PIPE_NBAR=1 FUSEDLOSS_TC_PIPE_GRID=1 $t --small"   # the hardware-barrier slot release of s18
                FUSEDLOSS_TC_PIPE_NBAR=1 FUSEDLOSS_TC_PIPE_GRID=1 timeout 90 build/$t --small 2>&1 | grep -E -m20 "^FAIL|passed|failed" || rc=1
            fi
            if [ "$t" = test_margin_ce_cuda ] || [ "$t" = test_softmax_focal_cuda ]; then   # the staged rows kernel (default) and the ticket one
                echo "### FUSEDLOSS_TGT_STAGED=0 $t --small"   # the ticket kernel (the staged one is the default)
                FUSEDLOSS_TGT_STAGED=0 timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                echo "### FUSEDLOSS_TGT_STAGED_GRID=3 $t --small"
                FUSEDLOSS_TGT_STAGED_GRID=3 timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                echo "### FUSEDLOSS_TGT_WARP=0 $t --small"   # rows of C <= 4096 on the ticket kernel (the warp-a-row kernel is the default since s23)
                FUSEDLOSS_TGT_WARP=0 timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
            fi
            if [ "$t" = test_softmax_focal_cuda ]; then   # the position kernels at 1 / 2 / 4 positions a thread (default 1 fp32, 2 16-bit), 256-thread CTAs (default 128), a float a position (POS_MODE=0; warp tiles since s24), no PDL, int labels read by the kernel (POS_CODES=0; label bytes from the count since s24), the PM 3 default of a fused MEAN (the count summed in the kernel) against PM 2 (POS_EARLY=0) and PM 4 (POS_FOLD=1: the loss reduced in the kernel too; with and without PDL), the codes kernel at two label groups a thread (CODES_U=2), 32-thread CTAs (more ticket groups than the threads of a CTA)
                for kv in "FUSEDLOSS_FOCAL_PV=1" "FUSEDLOSS_FOCAL_PV=2" "FUSEDLOSS_FOCAL_PV=4" "FUSEDLOSS_FOCAL_POS_THREADS=256" "FUSEDLOSS_FOCAL_POS_MODE=0" "FUSEDLOSS_FOCAL_POS_PDL=0" "FUSEDLOSS_FOCAL_POS_CODES=0" "FUSEDLOSS_FOCAL_POS_EARLY=0" "FUSEDLOSS_FOCAL_POS_FOLD=1" "FUSEDLOSS_FOCAL_POS_FOLD=1 FUSEDLOSS_FOCAL_POS_PDL=0" "FUSEDLOSS_FOCAL_CODES_U=2" "FUSEDLOSS_FOCAL_POS_THREADS=32"; do
                    echo "### $kv $t --small"
                    env $kv timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
                done
            fi
            if [ "$t" = test_lovasz_cuda ]; then   # the v2 Jaccard pass of s19 (look-back scan, bucketed gradient): direct stores, then buckets of 32 / 64 pixels on every shape (also with the s23 kernels: SG 0, HOIST 0; with the s33 per-segment sort on every shape, SEGSORT_MIN=1, and without it, SEGSORT=0)
                for kv in "FUSEDLOSS_LOVASZ_JAC=2 FUSEDLOSS_LOVASZ_BUCKET=0" "FUSEDLOSS_LOVASZ_JAC=2 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5 FUSEDLOSS_LOVASZ_SEGSORT_MIN=1" "FUSEDLOSS_LOVASZ_SEGSORT=0 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5" "FUSEDLOSS_LOVASZ_JAC2_SG=0 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5" "FUSEDLOSS_LOVASZ_JAC2_HOIST=0 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5" "FUSEDLOSS_LOVASZ_JAC=2 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=6"; do
                    echo "### $kv $t"
                    env $kv timeout 150 build/$t 2>&1 | grep -E -m20 "FAIL|passed|failed" || rc=1
                done
                for kv in "FUSEDLOSS_LOVASZ_PC=1" "FUSEDLOSS_LOVASZ_PC=1 FUSEDLOSS_LOVASZ_JAC=2 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5" "FUSEDLOSS_LOVASZ_JAC=1 FUSEDLOSS_LOVASZ_KEYS4=0" "FUSEDLOSS_LOVASZ_SORT=3 FUSEDLOSS_LOVASZ_KEYS4=1 FUSEDLOSS_LOVASZ_JAC=2 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5"; do   # small-d probabilities through the class-major buffer; the old key kernel and Jaccard pass (the defaults before s20); the packed-key sort (s20) under the v2 pass
                    echo "### $kv $t --no-big"
                    env $kv timeout 150 build/$t --no-big 2>&1 | grep -E -m20 "FAIL|passed|failed" || rc=1
                done
                echo "### FUSEDLOSS_LOVASZ_JAC=1 FUSEDLOSS_LOVASZ_KEYS4=0 $t (the old paths on the big case; the default run above takes buckets of 8192 pixels)"
                FUSEDLOSS_LOVASZ_JAC=1 FUSEDLOSS_LOVASZ_KEYS4=0 timeout 150 build/$t 2>&1 | grep -E -m20 "FAIL|passed|failed" || rc=1
                if [ -n "$SANITIZER" ]; then
                    for tool in memcheck racecheck synccheck; do
                        echo "### $tool FUSEDLOSS_LOVASZ_JAC=2 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5 FUSEDLOSS_LOVASZ_SEGSORT_MIN=1 $t --small"
                        FUSEDLOSS_LOVASZ_JAC=2 FUSEDLOSS_LOVASZ_BUCKET_MIN=1 FUSEDLOSS_LOVASZ_BUCKET_BITS=5 FUSEDLOSS_LOVASZ_SEGSORT_MIN=1 timeout 90 "$SANITIZER" --tool $tool --print-limit 20 --error-exitcode 99 build/$t --small | tail -3 || rc=1
                    done
                    echo "### memcheck FUSEDLOSS_LOVASZ_SORT=3 FUSEDLOSS_LOVASZ_KEYS4=1 $t --small"
                    FUSEDLOSS_LOVASZ_SORT=3 FUSEDLOSS_LOVASZ_KEYS4=1 timeout 90 "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 99 build/$t --small | tail -3 || rc=1
                fi
            fi
            if [ "$t" = test_large_margin_ce_cuda ]; then   # the staged CTA kernels with register loads (cp.async copies are the default since s29); rows of 72-100 KB unstaged (STAGE_KB=72, the cap before s30); LM_V=0, the staged AS kernels of s29-s36 (V=7 the default since s37); PREFETCH=1, lm_cta_pf7_kernel over the whole grid
                for kv in "FUSEDLOSS_LM_ASYNC=0" "FUSEDLOSS_LM_STAGE_KB=72" "FUSEDLOSS_LM_V=0" "FUSEDLOSS_LM_PREFETCH=1"; do
                    echo "### $kv $t --small"
                    env $kv timeout 90 build/$t --small 2>&1 | grep -E -m20 "^FAIL|passed|failed" || rc=1
                done
            fi
            if [ "$t" = test_elementwise_loss_cuda ]; then   # the exact 16-bit forms (the fast ones are the default)
                echo "### FUSEDLOSS_EW_EXACT16=1 $t --small"
                FUSEDLOSS_EW_EXACT16=1 timeout 90 build/$t --small 2>&1 | grep -E -m20 "FAIL|input of|passed" || rc=1
            fi
            if [ -n "$SANITIZER" ]; then
                for tool in memcheck racecheck; do
                    echo "### $tool $t --small"
                    # distillation: 2 clusters at most, so the staged kernel walks rows (exchanges, prefetch)
                    FUSEDLOSS_DISTILL_PIPE=0 FUSEDLOSS_TGT_STAGED_GRID=2 FUSEDLOSS_DISTILL_STAGED=2 FUSEDLOSS_DISTILL_STAGED_GRID=2 timeout 90 "$SANITIZER" --tool $tool --print-limit 20 --error-exitcode 99 build/$t --small | tail -3 || rc=1
                done
                # the ring kernels (KL, Taylor) refilling their slots: memcheck, and racecheck through tensor
                # maps (the default of the Taylor ring since s21, opt-in for the KL ring; with raw bulk copies racecheck
                # reports every refill: NOTES "Session 16", "Session 21")
                if [ "$t" = test_distill_cuda ] || [ "$t" = test_taylor_ce_cuda ]; then
                    echo "### memcheck $t --small, the ring on 1 cluster"
                    FUSEDLOSS_DISTILL_PIPE_GRID=1 FUSEDLOSS_TC_PIPE_GRID=1 timeout 90 "$SANITIZER" --tool memcheck --print-limit 20 --error-exitcode 99 build/$t --small | tail -3 || rc=1
                    echo "### racecheck $t --small (--kl), the ring on 1 cluster, through tensor maps"
                    kl=""; [ "$t" = test_distill_cuda ] && kl="--kl"
                    # KL ring: gated with the group reduction (_WX=0) and the unaligned-row kernels off (_HEAD=0: their
                    # raw copies have no tensor-map form); then the default WX exchange (with its per-lane release since
                    # s39: 0 hazards) and the JSD ring, gated too
                    FUSEDLOSS_DISTILL_PIPE_WX=0 FUSEDLOSS_DISTILL_PIPE_HEAD=0 FUSEDLOSS_DISTILL_PIPE_TMAP=1 FUSEDLOSS_DISTILL_PIPE_GRID=1 FUSEDLOSS_TC_PIPE_GRID=1 timeout 90 "$SANITIZER" --tool racecheck --print-limit 20 --error-exitcode 99 build/$t --small $kl | tail -3 || rc=1
                    if [ "$t" = test_distill_cuda ]; then
                        echo "### racecheck $t --small, WX and the JSD ring (the defaults)"
                        FUSEDLOSS_DISTILL_PIPE_HEAD=0 FUSEDLOSS_DISTILL_PIPE_TMAP=1 FUSEDLOSS_DISTILL_PIPE_GRID=1 timeout 120 "$SANITIZER" --tool racecheck --print-limit 20 --error-exitcode 99 build/$t --small | tail -3 || rc=1
                    fi
                fi
            fi
        done
        if [ "${ZOO_PY:-1}" != 0 ] && [ -e build/libfusedloss.so ]; then
            export PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so
            for b in ${ZOO_BENCHES:-bench_zoo bench_distill bench_softmax_losses bench_lovasz bench_taylor}; do
                [ -e bench/$b.py ] || continue
                echo "### $b.py"; timeout 200 python3 bench/$b.py --out "$OUT/$b-$DATE.json" 2>&1 | tail -30 || rc=1
            done
            zpy="${ZOO_PYTESTS:-test_zoo test_distill test_linear_distill test_softmax_losses test_lovasz test_taylor test_large_margin}"
            echo "### pytest $zpy (CUDA cases)"
            timeout 240 python3 -m pytest -q -k cuda $(for f in $zpy; do ls python/tests/$f.py 2>/dev/null; done) 2>&1 | tail -12 || rc=1
        fi
        exit $rc
    '
    KEY[zoo]="$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$OUT/zoo.log" | tr "\n" ";" | cut -c1-120)"
fi

# ---- Python package on the GPU -------------------------------------------------------------------
if want pytest && have build/libfusedloss.so pytest; then
    # (straight into the log: through `| tail -15` a run cut by the limit left an empty log, s28)
    run_step pytest "${PYTEST_CAP:-200}" 'PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 -m pytest -q -x -k cuda python/tests ${PYTEST_ARGS:-} 2>&1'
    KEY[pytest]=$(grep -E "passed|failed" "$OUT/pytest.log" | tail -1)
fi

# ---- PyTorch peers -------------------------------------------------------------------------------
if want peers && have build/libfusedloss.so peers; then
    left=$(( BUDGET - $(elapsed) - 10 ))
    cap=$(( left < 240 ? left : 240 ))
    export PEERS_BUDGET=$(( cap > 60 ? cap - 40 : 20 ))   # the script stops starting work after this
    export PEERS_OUT="$OUT/peers-$DATE.json"
    run_step peers "$cap" 'PYTHONUNBUFFERED=1 python3 bench/bench_peers.py --out "$PEERS_OUT" --reps ${PEERS_REPS:-30} --warmup 3 --budget $PEERS_BUDGET ${PEERS_PROVIDERS:+--providers $PEERS_PROVIDERS}'
    KEY[peers]=$(grep -m1 '^PEERS copy' "$OUT/peers.log" | sed 's/^PEERS //')
    [ -z "${KEY[peers]}" ] && KEY[peers]=$(grep -m1 -E '^SKIP|Error' "$OUT/peers.log" | cut -c1-100)
fi

# ---- keep logs within what comes back (16 MB a file) ---------------------------------------------
for f in "$OUT"/*.log; do
    [ -f "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt 8000000 ]; then
        { head -c 2000000 "$f"; echo; echo "[... truncated by gpu_check.sh ...]"; tail -c 4000000 "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
    fi
done

# ---- report --------------------------------------------------------------------------------------
for s in "${ORDER[@]}"; do
    case "${STATUS[$s]}" in
        OK|SKIP|N/A) ;;
        *) echo; echo "---- tail of $OUT/$s.log (${STATUS[$s]}) ----"
           tail -n 15 "$OUT/$s.log" 2>/dev/null | cut -c1-200 ;;
    esac
done
if [ -f "$OUT/bench.log" ] && grep -q '^SUMMARY' "$OUT/bench.log"; then
    echo; echo "---- bench (ratio to the copy floor) ----"; grep '^SUMMARY' "$OUT/bench.log" | sed 's/^SUMMARY //'
fi
if [ -f "$OUT/bench-ab.log" ] && grep -q '^SUMMARY' "$OUT/bench-ab.log"; then
    echo; echo "---- bench A/B ----"; grep -E '^### variant|^SUMMARY [0-9]' "$OUT/bench-ab.log" | sed 's/^SUMMARY //'
fi
if [ -f "$OUT/lce.log" ] && grep -qE '^SUMMARY|^LCE' "$OUT/lce.log"; then
    echo; echo "---- linear CE ----"; grep -E '^SUMMARY|^LCE' "$OUT/lce.log" | sed 's/^SUMMARY //'
fi
if [ -f "$OUT/vp.log" ] && grep -q '^bench_vp' "$OUT/vp.log"; then
    echo; echo "---- vocab-parallel bench ----"; grep -A4 "^bench_vp" "$OUT/vp.log" | head -8
fi
if [ -f "$OUT/peers.log" ] && grep -q '^PEERS' "$OUT/peers.log"; then
    echo; echo "---- peers (fwd+bwd, ratio to the floor) ----"; grep '^PEERS' "$OUT/peers.log" | sed 's/^PEERS //'
fi
echo
echo "==== gpu_check summary: commit $FL_COMMIT, $(elapsed)s total, logs in $OUT ===="
printf '%-10s %-10s %6s  %s\n' step status time key
overall=0
for s in "${ORDER[@]}"; do
    printf '%-10s %-10s %5ss  %s\n' "$s" "${STATUS[$s]}" "${TIME[$s]}" "${KEY[$s]}"
    case "${STATUS[$s]}" in OK|SKIP|N/A) ;; *) overall=1 ;; esac
done
exit $overall
