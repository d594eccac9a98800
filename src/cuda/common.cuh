/* common.cuh — what every fusedloss CUDA source shares: the element conversions (fp32 arithmetic
 * on fp32 / fp16 / bf16 storage; round to nearest even on the way back) and FL_CUDA_TRY, which
 * turns a CUDA error into FL_ERR_CUDA with fl_last_error() naming `fn` (a local of the caller).
 * Internal, not installed.
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_CUDA_COMMON_CUH
#define FL_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../internal.h"

// Evict-first (streaming) accesses of data touched once. FL_AB_PLAIN_LD / FL_AB_PLAIN_ST (A/B
// builds only, never set by the Makefile: compile a .cu with -D... on the device into a second
// binary) make them default-cached instead. Why it is worth measuring per kernel: GeLU's backward
// kernels streamed 3-6% faster default-cached while its 16-bit tanh forward was 5% slower, and
// the CE ring kernel gained 1-4% with default-cached stores where its whole-chunk mode lost 3%
// (NOTES.md "Session 12"). GeLU chooses per kernel (gelu.cu's gelu_cs()).
#ifdef FL_AB_PLAIN_LD
#define FL_LDCS(p) (*(p))
#else
#define FL_LDCS(p) __ldcs(p)
#endif
#ifdef FL_AB_PLAIN_ST
#define FL_STCS(p, v) (void)(*(p) = (v))
#else
#define FL_STCS(p, v) __stcs((p), (v))
#endif

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// 2^x on the SFU alone (ex2.approx.ftz): max relative error ~2^-22 (PTX ISA), results below
// 2^-126 flushed to zero; -inf -> +0, NaN -> NaN. exp2f adds its denormal handling (FSETP + two
// predicated FMUL around the MUFU.EX2 in SASS).
__device__ __forceinline__ float fexp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// VEC values added pairwise (a tree of depth log2 VEC; e is overwritten): a dependency chain of one add
// per vector instead of one per element on the caller's accumulator (the sweeps are latency-bound on
// their accumulator chains, ncu CE run 4). Fixed order: deterministic.
template <int VEC>
__device__ __forceinline__ float tree_sum(float (&e)[VEC]) {
#pragma unroll
    for (int w = VEC / 2; w > 0; w /= 2)
#pragma unroll
        for (int v = 0; v < w; v++) e[v] += e[v + w];
    return e[0];
}

// log2(x) on the SFU alone (lg2.approx.ftz: MUFU.LG2): absolute error <= 2^-22 for x in [0.5, 2],
// 2 ulp elsewhere (CUDA's __log2f); subnormal x flushed to 0 (-> -inf), so callers that may pass one
// clamp first. log2f is a software polynomial in SASS (no MUFU.LG2: ~20 instructions).
__device__ __forceinline__ float flog2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#define FL_CUDA_TRY(expr)                                                                   \
    do {                                                                                    \
        cudaError_t fl__e_ = (expr);                                                        \
        if (fl__e_ != cudaSuccess) {                                                        \
            (void)cudaGetLastError(); /* clear a sticky launch error, as NCCL CUDACHECK */  \
            return fl__fail(FL_ERR_CUDA, "%s: %s (%s:%d)", fn, cudaGetErrorString(fl__e_),  \
                            __FILE__, __LINE__);                                            \
        }                                                                                   \
    } while (0)

#endif /* FL_CUDA_COMMON_CUH */
