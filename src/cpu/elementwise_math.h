/* elementwise_math.h — internals of the elementwise losses (include/fusedloss.h section 9): the
 * resolved parameters, the shared validator and work plan (src/common/elementwise_validate.c),
 * and the per-element fp32 math, compiled into both backends from this one source (C for
 * src/cpu/elementwise_loss.c, __host__ __device__ for src/cuda/elementwise_loss.cu), so the two
 * differ only in the last bits of expf / powf (C library vs libdevice), the reciprocals (IEEE
 * division vs MUFU.RCP + a Newton step) and in nvcc's fma contraction. Internal, not installed.
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_CPU_ELEMENTWISE_MATH_H
#define FL_CPU_ELEMENTWISE_MATH_H

#include <math.h>
#include <stdint.h>

#include "../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FL__EW_FOCAL = 0, FL__EW_BCE = 1 } fl__ew_op;

typedef struct {
    fl__ew_op    op;
    fl_reduction reduction;
    float        alpha;      /* focal */
    float        gamma;      /* focal */
    int          use_alpha;  /* focal: alpha >= 0 */
    int          gamma_kind; /* focal: 0 (gamma == 0), 1, 2, 3 (other: powf) */
    const float* weight;     /* bce: [C] or NULL */
    const float* pos_weight; /* bce: [C] or NULL */
    int64_t      n;          /* elements */
    int64_t      C;          /* bce: columns (1 for focal) */
} fl__ew_params;

/* Reduction blocks for n elements (0 for n <= 0): min(1024, ceil(n / 4096)). The CUDA grid (256
 * threads a block, grid-stride) and the CPU's fixed contiguous blocks both use it, so neither
 * depends on the device or the thread count. */
#define FL__EW_MAX_BLOCKS 1024
int64_t fl__ew_blocks(int64_t n);
/* Workspace bytes of a MEAN / SUM forward or fused call: 256 + align256(8 * blocks). */
size_t fl__ew_workspace_bytes(int64_t n);

/* Validate every argument of an elementwise-loss entry point (either backend) and resolve *p.
 * op: focal (N = n, C = 1, weight = pos_weight = NULL) or bce. pass: which outputs exist
 * (forward: loss; backward: dlogits, grad_loss; fused: both). Checks sizes, dtype, reduction,
 * alpha / gamma (focal), grad_scale (backward, fused), NULLs, element alignment, 64-bit extent,
 * the workspace (forward / fused with MEAN / SUM; 256-byte aligned when is_cuda) and aliasing
 * (only dlogits == logits). */
fl_status fl__ew_validate(const char* fn, fl__ew_op op, fl__pass pass, int is_cuda, const float* loss,
                          const void* dlogits, const void* logits, const void* targets, const float* weight,
                          const float* pos_weight, const float* grad_loss, float grad_scale, int64_t N,
                          int64_t C, fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                          const void* workspace, size_t workspace_bytes, fl__ew_params* p);

#ifdef __cplusplus
}
#endif

/* ---- per-element math (fp32) ----------------------------------------------------------------- */
/* powf of the generic focal (gamma not 0 / 1 / 2): the CUDA file makes it an out-of-line call
 * (inlined into its 16-element unrolled loops it took ptxas ~20 s per kernel, 4 minutes for the
 * file, for a rare gamma) */
#ifndef FL_EW_POWF
#  define FL_EW_POWF powf
#endif
#ifdef __CUDACC__
#  define FL_EW_HD static __host__ __device__ __forceinline__
#else
#  define FL_EW_HD static inline
#endif

/* The fast 16-bit forms (fast = 1: CUDA, fp16 / bf16 logits, the default there;
 * FUSEDLOSS_EW_EXACT16=1 turns them off; the CPU never uses them): e = ex2.approx(-|x| log2 e)
 * (relative error <= |x| 2^-24 + 2^-22: 3e-6 at |x| = 30), bare MUFU.RCP reciprocals (~1 ulp), the
 * log1p series to 2w^3/9 (truncation w^5 / 11 <= 1.5e-6 relative): each loss element within
 * ~2^-17 relative, far inside the 16-bit gradient's rounding (2^-9 / 2^-12) and PyTorch's 16-bit
 * loss, ~12 instructions an element fewer (the 16-bit kernels were compute-bound: H200 2026-12-02
 * run 8, sigmoid focal bf16 1.62x the floor in a CUDA graph, fp32 1.09x). `fast` is a
 * compile-time constant in every caller. */

/* 1 / d for a normal, finite d (here d in [1, 3]). CUDA: MUFU.RCP (rcp.approx.ftz, ~1 ulp), plus
 * one Newton step unless fast (then within 1 ulp, no branch: the IEEE division is ~10
 * instructions and a slow-path branch); C: the IEEE division. NaN in, NaN out. */
FL_EW_HD float fl__ew_rcp(float d, int fast) {
#ifdef __CUDA_ARCH__
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    return fast ? r : fmaf(r, fmaf(-d, r, 1.0f), r);
#else
    (void)fast;
    return 1.0f / d;
#endif
}

/* log1p(e) for e in [0, 1] (NaN in, NaN out), without log1pf's general range reduction (~25
 * instructions and a branch in libdevice): log1p(e) = 2 atanh(s), s = e / (2 + e) in [0, 1/3],
 * = s (2 + w Q(w)), w = s^2 <= 1/9, Q the atanh series 2/3 + 2w/5 + ... + 2w^5/13 (truncation
 * w^7 / 15 <= 1.4e-8 relative at e = 1; fast: to 2w^3/9); relative error a few fp32 ulps (s's,
 * the series', the two roundings), checked against float64 by tests/test_elementwise_loss.c over
 * all of [0, 1]. */
FL_EW_HD float fl__ew_log1p01(float e, int fast) {
    const float s = e * fl__ew_rcp(2.0f + e, fast);
    const float w = s * s;
    float q;
    if (fast) {
        q = 2.0f / 9.0f;
    } else {
        q = 2.0f / 13.0f;
        q = q * w + 2.0f / 11.0f;
        q = q * w + 2.0f / 9.0f;
    }
    q = q * w + 2.0f / 7.0f;
    q = q * w + 2.0f / 5.0f;
    q = q * w + 2.0f / 3.0f;
    return s * (w * q + 2.0f);
}

/* Shared first steps: e = exp(-|x|), sp = log1p(e), p = sigmoid(x), pm = 1 - p = sigmoid(-x)
 * (both without cancellation: r = 1 / (1 + e) is the larger, e r the smaller). */
FL_EW_HD void fl__ew_sigmoid(float x, int fast, float* sp, float* p, float* pm) {
    float e;
#ifdef __CUDA_ARCH__
    if (fast) asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fabsf(x) * -1.4426950408889634f));
    else
#endif
        e = expf(-fabsf(x));
    const float r = fl__ew_rcp(1.0f + e, fast);
    const float er = e * r;
    *sp = fl__ew_log1p01(e, fast);
    *p = x >= 0.0f ? r : er;
    *pm = x >= 0.0f ? er : r;
}

/* Sigmoid focal loss of one element: *l = loss, *d = dloss/dx (formulas: header section 9). */
FL_EW_HD void fl__ew_focal(float x, float y, float alpha, int use_alpha, float gamma, int gk, int fast, float* l,
                           float* d) {
    float sp, p, pm;
    fl__ew_sigmoid(x, fast, &sp, &p, &pm);
    const float omy = 1.0f - y;
    /* bce = max(x, 0) - x y + sp as a sum of non-negative terms (no cancellation for y in [0, 1]) */
    const float bce = (x >= 0.0f ? x * omy : -x * y) + sp;
    const float q = p * omy + pm * y;                      /* 1 - p_t */
    const float qg = gk == 0 ? 1.0f : gk == 1 ? q : gk == 2 ? q * q : FL_EW_POWF(q, gamma);
    const float a = use_alpha ? alpha * y + (1.0f - alpha) * omy : 1.0f;
    *l = a * (bce * qg);
    const float dce = p * omy - pm * y;                    /* p - y without cancellation */
    if (gk == 0) {
        *d = a * dce;                                      /* torch: pow backward is 0 for exponent 0 */
        return;
    }
    const float c = gamma * bce * (1.0f - 2.0f * y);
    float t2;
    if (gk == 1 || gk == 2) {
        /* q^(gamma - 1) = 1 or q: no division. At q == 0 this is the branch below's value too
         * (p pm == 0 there: t2 = c * 0 * {1, 0}). */
        t2 = gk == 1 ? c * (p * pm) : (c * (p * pm)) * q;
    } else if (q > 0.0f) {
        t2 = c * ((p * pm) / q) * qg;                      /* p pm / q <= 1: no overflow */
    } else {
        /* q == 0 (or NaN): q^(gamma-1) = inf / 1 / 0 as torch's pow; p pm == 0 here, so
         * gamma < 1 gives 0 * inf = NaN, exactly as PyTorch's autograd */
        const float qd = gamma < 1.0f ? INFINITY : gamma == 1.0f ? 1.0f : 0.0f;
        t2 = (c * (p * pm)) * qd;
    }
    *d = a * (dce * qg + t2);
}

/* BCE with logits of one element: weight w (1 if none), pos_weight pw (has_pw: given). */
FL_EW_HD void fl__ew_bce(float x, float y, float w, int has_w, float pw, int has_pw, int fast, float* l,
                         float* d) {
    float sp, p, pm;
    fl__ew_sigmoid(x, fast, &sp, &p, &pm);
    const float omy = 1.0f - y;
    /* (1 - y) x + lw (sp + max(-x, 0)), lw = 1 + (pw - 1) y, as non-negative terms (pw, y >= 0):
     * x >= 0: x (1 - y) + lw sp;  x < 0: -x (pw y) + lw sp  (since lw - (1 - y) = pw y) */
    const float lw = has_pw ? (pw - 1.0f) * y + 1.0f : 1.0f;
    float v = (x >= 0.0f ? x * omy : -x * (has_pw ? pw * y : y)) + (has_pw ? lw * sp : sp);
    float g = has_pw ? p * omy - (pw * y) * pm : p * omy - y * pm;
    if (has_w) {
        v = v * w;
        g = g * w;
    }
    *l = v;
    *d = g;
}

#endif /* FL_CPU_ELEMENTWISE_MATH_H */
