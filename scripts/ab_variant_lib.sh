#!/usr/bin/env bash
# ab_variant_lib.sh — a second copy of the library whose CUDA objects are compiled with extra
# defines, for a same-run A/B of compile-time variants on the device (run-to-run spread on the
# H200 is 2-4%, so variants must be compared in one run, alternated):
#
#   bash scripts/ab_variant_lib.sh "-DFL_AB_PLAIN_ST" /tmp/ab [src/cuda/x.cu ...]
#
# builds /tmp/ab/libfusedloss.a and /tmp/ab/libfusedloss.so from build/libfusedloss.a with the
# given CUDA sources (default: every src/cuda/*.cu) recompiled for sm_90 only, in parallel, with
# the defines; and /tmp/ab/<tool> for each of bench_cross_entropy, bench_gelu, test_cross_entropy_cuda
# (static, like build/). Python: FUSEDLOSS_LIBRARY=/tmp/ab/libfusedloss.so. The A/B defines the
# sources know: FL_AB_PLAIN_LD / FL_AB_PLAIN_ST (src/cuda/common.cuh: default-cached instead of
# evict-first loads / stores of the streamed data).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEFS="${1:?defines}"
OUTD="${2:?output folder}"
shift 2
SRCS=("$@")
[ ${#SRCS[@]} -gt 0 ] || SRCS=(src/cuda/*.cu)
[ -e build/libfusedloss.a ] || { [ -e build/libfusedloss.a.gz ] && gunzip -c build/libfusedloss.a.gz > build/libfusedloss.a; }
mkdir -p "$OUTD"
NVCC="${NVCC:-nvcc}"
pids=()
for f in "${SRCS[@]}"; do
    b=$(basename "$f" .cu)
    "$NVCC" -O3 -std=c++17 -Iinclude -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC,-fvisibility=hidden \
        $DEFS -c "$f" -o "$OUTD/$b.o" > "$OUTD/$b.log" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc -eq 0 ] || { cat "$OUTD"/*.log; echo "ab_variant_lib: a compile failed"; exit 1; }
cp build/libfusedloss.a "$OUTD/libfusedloss.a"
for f in "${SRCS[@]}"; do
    b=$(basename "$f" .cu)
    # the CPU backend has objects of the same names (cpu/x.o, cuda/x.o): the CUDA one is the 2nd
    n=$(ar t "$OUTD/libfusedloss.a" | grep -cx "$b.o" || true)
    if [ "$n" = 2 ]; then ar dN 2 "$OUTD/libfusedloss.a" "$b.o"; elif [ "$n" = 1 ]; then ar d "$OUTD/libfusedloss.a" "$b.o"; fi
    ar q "$OUTD/libfusedloss.a" "$OUTD/$b.o"
done
LIBS="-L/usr/local/cuda/lib64 -lcublasLt -Wl,-rpath,/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lstdc++ -lm -lpthread -fopenmp"
cc -shared -o "$OUTD/libfusedloss.so" -Wl,--whole-archive "$OUTD/libfusedloss.a" -Wl,--no-whole-archive \
    -Wl,--version-script=src/libfusedloss.map $LIBS
for t in bench/bench_cross_entropy bench/bench_gelu tests/test_cross_entropy_cuda; do
    cc -std=c11 -O2 -Iinclude -fopenmp -DFL_WITH_CUDA -I/usr/local/cuda/include "$t.c" -o "$OUTD/$(basename "$t")" \
        "$OUTD/libfusedloss.a" $LIBS
done
echo "ab_variant_lib: $OUTD ($DEFS; ${#SRCS[@]} sources)"
