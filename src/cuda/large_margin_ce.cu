/* large_margin_ce.cu — CUDA backend of the large-margin softmax cross-entropy (include/fusedloss.h
 * section 15; Kobayashi, pytorch-loss LargeMarginSoftmaxV1), the semantics of
 * src/cpu/large_margin_ce.c in fp32 arithmetic. The structure is taylor_ce.cu's:
 *
 *   C <= 1024 : lm_warp_kernel, one warp per row (8 rows per CTA, rows grid-strided), the row in
 *               registers (lane l holds the VEC-column groups l, l + 32, ..., VEC = 16 / sizeof(T)),
 *               so the logits are read once and dlogits written once;
 *   C >  1024 : lm_cta_kernel, one 512-thread CTA per row: pass 1 gathers the row's statistics,
 *               pass 2 writes the gradient (lm_cta_head_kernel for rows not all 16-byte aligned,
 *               below). Fused and vectorised with rows up to 100 KB (72 KB until s30; STAGE, lm_cuda): pass 1 keeps
 *               the row in shared memory (rowpass.cuh; copied there by cp.async before the statistics
 *               since session 29, AS), so it is read once, as many CTAs per SM as fit; otherwise pass 2
 *               reads it again from L2 (at most 2 rows per SM in flight).
 *   16-byte vectors when the rows (and dlogits) are 16-byte aligned; otherwise the same groups
 *   element by element (the same values and summation order, hence the same results) except for
 *   C > 1024 with logits and dlogits of the same 16-byte phase (e.g. odd C): lm_cta_head_kernel,
 *   vectors from each row's first 16-byte boundary, the head columns before it as scalar extras
 *   (the grouping, hence the last bits, then follows the row's address).
 *
 * Numerics (fp32; u = 2^-24). Only the non-target columns k != y and x_y are needed: with
 * m' = max_k x_k, d_k = x_k - m', e_k = exp(d_k), the row statistics are s = sum e_k (>= 1),
 * w = sum e_k d_k, b = sum d_k. Then q_k = e_k / s, A' = w / s = sum q_k (x_k - m') and, as
 * sum q_k = 1 and (C - 1) c = 1 (c = 1 / (C - 1)), the regulariser sum (q_k - c) log q_k is
 * A' - c b exactly: every term is shifted by m', so its rounding is relative to |x_k - m'|, not to
 * |x_k| (the CPU's (A - lse') - c (B - (C - 1) lse') cancels in fp32 for large logits).
 * lse - x_y: with dd = m' - x_y, dd >= 0: dd + log(s + exp(-dd)) (two terms >= 0); dd < 0 (the
 * target dominates): log1p(s exp(dd)), which keeps tiny losses to full relative precision. The
 * same branch gives P = exp(m' - lse) = 1 / (s + exp(x_y - m')) (p_j = e_j P: one exp per element,
 * shared with q_j) and 1 - p_y = sum_{k != y} p_k = s P, so dx_y = -g s P does not cancel. The
 * gradient of j != y is e_j (g P + g (lambda / 2) / s (d_j + 1 - A')) - g (lambda / 2) c.
 * Statistics: the warp kernel takes m' first (a warp max), then sums with the shift known; the CTA
 * kernel keeps a running (m, s, w, b, n) per thread, re-shifted when its maximum grows (once per
 * 16-byte group at most: the group's max first), and merges them in a fixed tree (shuffles, then
 * warp 0 over the 16 warps' partials): deterministic. MEAN's count of rows not ignored and the SUM
 * / MEAN reduction of the per-row losses are rowpass.cuh's two-stage kernels (rp_count before,
 * rp_reduce after), as taylor_ce.cu. Out-of-range targets: the row's loss and gradient NaN,
 * *error_flag = 1; they count in MEAN's D.
 * In place (dlogits == logits): every thread writes only the columns it read itself, after it read
 * them; x_y, the one value shared across threads, comes from the owning lane's registers (warp
 * kernel) or is read by thread 0 before the first barrier of the row (CTA kernel), which every
 * store of the row follows (the hazard of NOTES.md run 28).
 * Workspace (SUM / MEAN; src/internal.h): float D at 16 | reduction partials at 256 | per-row fp32
 * losses at FL__TAYLOR_WS_HEAD (the rule of section 14). NONE: the per-row losses go straight to
 * loss[].
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cluster.cuh"
#include "common.cuh"
#include "ringrow.cuh"
#include "rowpass.cuh"

#define LM_THREADS 256       /* warp kernel: 8 rows per CTA */
#define LM_CTA_THREADS 512   /* CTA kernel: one row per CTA */

typedef struct {
    const void* x;
    void* dx;
    const void* tg;
    int lab64;
    int64_t N, C, ld, ign;
    float half;          /* lambda / 2 */
    float c;             /* 1 / (C - 1), rounded once */
    int none, mean, fused;
    const float* gl;
    float gscale;
    const float* Ddev;   /* MEAN's count (device), else NULL */
    float* rowloss;      /* per-row losses: loss[] for NONE, the workspace's otherwise (NULL: not wanted) */
    int* error_flag;
} LmArgs;

// ---------------------------------------------------------------------------------------------
// device helpers
// ---------------------------------------------------------------------------------------------

/* the row's upstream gradient g_i (MEAN: / D) */
static __device__ __forceinline__ float lm_g(const LmArgs& a, int64_t i) {
    float g = a.gscale * (a.gl ? a.gl[a.none ? i : 0] : 1.0f);
    if (a.mean) g /= *a.Ddev;
    return g;
}

/* 0: a regular row; 1: ignored; 2: out of range (flagged) */
static __device__ __forceinline__ int lm_row_kind(const LmArgs& a, int64_t y) {
    if (y == a.ign) return 1;
    if (y < 0 || y >= a.C) return 2;
    return 0;
}

/* The per-row gradient coefficients: dx_j = e_j (gp + gq (d_j + k1)) - gc (j != y), dx_y = dy */
typedef struct {
    float mo, gp, gq, k1, gc, dy;
} LmCoef;

/* The row's loss from x_y and the non-target statistics (mo = m', s, w, b as in the header comment);
 * with want_grad, the gradient coefficients for the upstream gradient g. */
static __device__ __forceinline__ float lm_row(const LmArgs& a, float xy, float mo, float s, float w, float b,
                                               bool want_grad, float g, LmCoef* k) {
    const float As = w / s;                 /* sum q_k (x_k - m') <= 0 */
    const float reg = fmaf(-a.c, b, As);    /* sum (q_k - c) log q_k = A' - c b (>= 0) */
    const float dd = mo - xy;
    float ce, P;                            /* lse - x_y; exp(m' - lse) */
    if (dd >= 0.0f) {                       /* x_y <= m': lse = m' + log(s + e_y), s >= 1 */
        const float den = s + expf(-dd);
        ce = dd + logf(den);
        P = 1.0f / den;
    } else {                                /* the target dominates (or NaN): lse = x_y + log1p(t) */
        const float r = expf(dd), t = s * r;
        ce = log1pf(t);
        P = r / (1.0f + t);
    }
    if (want_grad) {
        const float gh = g * a.half;
        k->mo = mo;
        k->gp = g * P;
        k->gq = gh / s;
        k->k1 = 1.0f - As;
        k->gc = gh * a.c;
        k->dy = -(g * (s * P));             /* g (p_y - 1) = -g sum_{k != y} p_k */
    }
    return fmaf(a.half, reg, ce);
}

/* exp(d) of the per-element sums and gradients: the SFU's 2^x of d log2(e) (FMUL + MUFU.EX2) instead
 * of expf's 8-instruction range reduction; relative error <= 2^-22 plus the rounding of d log2(e)
 * (|d| u), results below 2^-126 flushed to 0 (e_j < 2^-126 only where d_j < -87). The row's
 * scalars (lm_row) and the rare re-shifts (lm_shift) keep expf. Why: the CTA kernel's element loops
 * were ~52 SASS instructions per element (8192x32000 bf16 2.54x the floor, issue-bound). */
static __device__ __forceinline__ float lm_exp(float d) { return fexp2(d * RP_LOG2E); }

static __device__ __forceinline__ float lm_grad(const LmCoef& k, float v) {
    const float d = v - k.mo;
    return fmaf(lm_exp(d), fmaf(k.gq, d + k.k1, k.gp), -k.gc);
}
/* V & 1 (part of FUSEDLOSS_LM_V=7, the default since s37): lm_grad with c0 = gq k1 + gp formed once a row, so an element
 * takes FADD, FMUL, MUFU, FFMA, FFMA (one FADD less); the extra rounding, u (|gq k1| + |gp|) e, is within the
 * terms the tests' slack already has for k1 and P (tests/test_large_margin_ce_cuda.c) */
static __device__ __forceinline__ float lm_grad2(const LmCoef& k, float c0, float v) {
    const float d = v - k.mo;
    return fmaf(lm_exp(d), fmaf(k.gq, d, c0), -k.gc);
}

/* 16 bytes of T (VEC = 16 / sizeof(T) elements) at p as floats: one vector load (VEC16, p 16-byte
 * aligned) or VEC element loads of the same values. LAST: the last read of these bytes (evict
 * first), else kept in L2 for the re-read. */
template <typename T, bool VEC16, bool LAST>
static __device__ __forceinline__ void lm_load16(const T* p, float* out) {
    if (VEC16) {
        const uint4 u = LAST ? FL_LDCS((const uint4*)p) : __ldcg((const uint4*)p);
        rp_unpack<T>(u, out);
    } else {
#pragma unroll
        for (int k = 0; k < (int)(16 / sizeof(T)); k++) out[k] = to_float(LAST ? FL_LDCS(p + k) : __ldcg(p + k));
    }
}
template <typename T, bool VEC16>
static __device__ __forceinline__ void lm_store16(T* p, const float* in) {
    if (VEC16) {
        rp_vstore<T, (int)(16 / sizeof(T))>(p, in);
    } else {
#pragma unroll
        for (int k = 0; k < (int)(16 / sizeof(T)); k++) p[k] = from_float<T>(in[k]);
    }
}

/* ---- the CTA kernel's running statistics of the non-target columns: max m, and relative to it
 * s = sum exp(x - m), w = sum exp(x - m) (x - m), b = sum (x - m); n values so far ---- */
typedef struct {
    float m, s, w, b, n;
} LmStat;

/* re-shift to a maximum M >= t.m: exp(x - M) = f exp(x - m), f = exp(m - M); x - M = (x - m) + dm */
static __device__ __forceinline__ void lm_shift(LmStat& t, float M) {
    if (t.n > 0.0f) {
        const float dm = t.m - M, f = expf(dm);
        t.w = f * fmaf(t.s, dm, t.w);
        t.s *= f;
        t.b = fmaf(t.n, dm, t.b);
    }
    t.m = M;
}
/* one value into s, w, b (the caller counts n) */
static __device__ __forceinline__ void lm_acc(LmStat& t, float v) {
    const float d = v - t.m, e = lm_exp(d);
    t.s += e;
    t.w = fmaf(e, d, t.w);
    t.b += d;
}
static __device__ __forceinline__ void lm_add(LmStat& t, float v) {
    lm_acc(t, v);
    t.n += 1.0f;
}
/* the VEC values of one group (dq: the target's column minus the group's first, excluded when in
 * [0, VEC)): the group's maximum first, so the statistics re-shift at most once per group. The
 * groups without the target (all but one a row) take a branch-free body: per-element tests had made
 * nvcc emit a branch around every element (BSSY / BRA / BSYNC); n counts by the group. */
template <int VEC>
static __device__ __forceinline__ void lm_push_group(LmStat& t, const float* v, int64_t dq) {
    if (dq >= 0 && dq < VEC) {
        const int ty = (int)dq;
        float vm = -INFINITY;
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k != ty) vm = fmaxf(vm, v[k]);
        if (vm > t.m) lm_shift(t, vm);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            if (k != ty) lm_acc(t, v[k]);
        t.n += (float)(VEC - 1);
        return;
    }
    float vm = v[0];
#pragma unroll
    for (int k = 1; k < VEC; k++) vm = fmaxf(vm, v[k]);
    if (vm > t.m) lm_shift(t, vm);
#pragma unroll
    for (int k = 0; k < VEC; k++) lm_acc(t, v[k]);
    t.n += (float)VEC;
}
/* V & 4 (FUSEDLOSS_LM_V=7, s36, the default since s37): lm_push_group with a LAZY reference, as distill.cu's
 * dc_acc_lz (the KL's default since s29): a group without the target takes its exponentials against the running
 * reference t.m as it is, with no maximum (lm_push_group's VEC - 1 FMNMX, FSETP and branch a group), summed
 * into the group's own sums first; the group is redone by lm_push_group (the maximum, the re-shift, the exponentials again) only when its
 * sum passes 2^16, i.e. an element lies more than ~11 above the reference, or is +inf: so each thread's first
 * group (t.m = -inf, every term +inf) takes lm_push_group and the references are values of the row, never more
 * than ~11 below the thread's maximum (terms <= 2^16). NaN passes the test and reaches the sums as before. The
 * merges then shift to the largest reference, not to the row's maximum: the row formula (lm_row) and the
 * gradient hold for any shift, and in pass 2 e_j = exp(x_j - mo) <= 2^16 (mo, the merged reference, is within
 * ~11 of the row's maximum). sm_90 SASS (bf16, the hot path): pass 1 ~10.9 -> 9.0 instructions an element
 * (175 a step of two groups -> 72 a group; 40 registers, as the default). */
#define LM_LZ_LIM 65536.0f
template <int VEC>
static __device__ __forceinline__ void lm_push_group_lz(LmStat& t, const float* v, int dq) {
    if ((unsigned)dq < (unsigned)VEC) {   /* the target's group (one a row) */
        lm_push_group<VEC>(t, v, (int64_t)dq);
        return;
    }
    /* the group's sums in chains, not trees: trees of d[] and e[] held 16 more registers live (58 instead of
     * lm_cta_kernel's 40: 2 CTAs an SM instead of 3; the head kernel 77, 1 CTA) */
    float gb = v[0] - t.m, gs = lm_exp(gb), gw = gs * gb;
#pragma unroll
    for (int k = 1; k < VEC; k++) {
        const float d = v[k] - t.m, e = lm_exp(d);
        gs += e;
        gw = fmaf(e, d, gw);
        gb += d;
    }
    if (gs > LM_LZ_LIM) {   /* rare past each thread's first group */
        lm_push_group<VEC>(t, v, dq);
        return;
    }
    t.s += gs;
    t.w += gw;
    t.b += gb;
    t.n += (float)VEC;
}
/* a then b, in this order (the CTA's merge tree fixes which is which: deterministic) */
static __device__ __forceinline__ LmStat lm_merge(LmStat a, LmStat b) {
    if (b.n == 0.0f) return a;
    if (a.n == 0.0f) return b;
    const float M = fmaxf(a.m, b.m);
    lm_shift(a, M);
    lm_shift(b, M);
    a.s += b.s;
    a.w += b.w;
    a.b += b.b;
    a.n += b.n;
    return a;
}
/* lane 0 ends with the merge of the 32 lanes' statistics (a fixed tree) */
static __device__ __forceinline__ LmStat lm_warp_merge(LmStat t) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        LmStat u;
        u.m = __shfl_down_sync(0xffffffffu, t.m, o);
        u.s = __shfl_down_sync(0xffffffffu, t.s, o);
        u.w = __shfl_down_sync(0xffffffffu, t.w, o);
        u.b = __shfl_down_sync(0xffffffffu, t.b, o);
        u.n = __shfl_down_sync(0xffffffffu, t.n, o);
        t = lm_merge(t, u);
    }
    return t;
}

/* the same merge for the ring kernel (LmRing), shorter on the row's critical path: the warp's maximum
 * first (exact, a butterfly of fmaxf), each lane's sums moved to it once (lm_shift: one expf), then
 * s, w, b, n summed by a fixed butterfly (four independent chains a level). lm_warp_merge's tree takes
 * two lm_shift (expf) per level on one dependent chain; the ring's statistics group waits for this
 * merge twice a row (its warps, then warp 0 over the warps). Every lane ends with the result. */
static __device__ __forceinline__ LmStat lm_warp_merge_flat(LmStat t) {
    float M = t.n > 0.0f ? t.m : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    if (t.n > 0.0f && M > t.m) lm_shift(t, M);
    t.m = M;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float s = __shfl_xor_sync(0xffffffffu, t.s, o), w = __shfl_xor_sync(0xffffffffu, t.w, o);
        const float b = __shfl_xor_sync(0xffffffffu, t.b, o), n = __shfl_xor_sync(0xffffffffu, t.n, o);
        t.s += s;
        t.w += w;
        t.b += b;
        t.n += n;
    }
    return t;
}

// ---------------------------------------------------------------------------------------------
// kernels
// ---------------------------------------------------------------------------------------------

/* rows whose target is ignored (loss 0, gradient 0) or out of range (NaN, flagged); `t` / `nt`:
 * this thread's index and the threads per row */
template <typename T>
static __device__ __forceinline__ void lm_special_row(const LmArgs& a, int64_t i, int kind, int t, int nt) {
    const float v = kind == 1 ? 0.0f : NAN;
    if (kind == 2 && t == 0 && a.error_flag) atomicOr(a.error_flag, 1);
    if (t == 0 && a.rowloss) a.rowloss[i] = v;
    if (a.fused) {
        T* dx = (T*)a.dx + i * a.ld;
        for (int64_t j = t; j < a.C; j += nt) dx[j] = from_float<T>(v);
    }
}

/* One warp per row, C <= 1024: lane l holds the G groups l + 32 g of VEC columns (a full group moves
 * as one 16-byte vector when VEC16; the row's last, partial group element by element, never past C). */
template <typename T, int G, bool VEC16>
static __global__ void __launch_bounds__(LM_THREADS) lm_warp_kernel(LmArgs a) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int VPL = G * VEC;
    const int lane = threadIdx.x & 31;
    const int C = (int)a.C;   /* <= 1024: 32-bit column arithmetic */
    const int64_t warps = (int64_t)gridDim.x * (LM_THREADS / 32);
    for (int64_t i = (int64_t)blockIdx.x * (LM_THREADS / 32) + (threadIdx.x >> 5); i < a.N; i += warps) {
        const int64_t y64 = rp_label(a.tg, a.lab64, i);
        const int kind = lm_row_kind(a, y64);
        if (kind != 0) {
            lm_special_row<T>(a, i, kind, lane, 32);
            continue;
        }
        const int y = (int)y64;
        const T* x = (const T*)a.x + i * a.ld;   /* 64-bit row offset: N * ld may exceed 2^31 */
        float v[VPL];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int c0 = (lane + 32 * g) * VEC;
            if (c0 + VEC <= C) {
                lm_load16<T, VEC16, true>(x + c0, v + g * VEC);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++) v[g * VEC + k] = c0 + k < C ? to_float(FL_LDCS(x + c0 + k)) : 0.0f;
            }
        }
        /* x_y from the registers of the lane that holds it: no second global read, which in place
         * could see another lane's gradient already stored there */
        float t = 0.0f, mo = -INFINITY;
#pragma unroll
        for (int q = 0; q < VPL; q++) {
            const int j = (lane + 32 * (q / VEC)) * VEC + q % VEC;
            if (j == y) t = v[q];
            else if (j < C) mo = fmaxf(mo, v[q]);
        }
        const float xy = __shfl_sync(0xffffffffu, t, (y / VEC) & 31);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mo = fmaxf(mo, __shfl_xor_sync(0xffffffffu, mo, o));
        /* the shift known: e and d per element (kept for the gradient), sums in column order per
         * lane, then a butterfly (plain adds: every lane ends with the same bits) */
        float e[VPL];
        float s = 0.0f, w = 0.0f, b = 0.0f;
#pragma unroll
        for (int q = 0; q < VPL; q++) {
            const int j = (lane + 32 * (q / VEC)) * VEC + q % VEC;
            v[q] -= mo;
            e[q] = lm_exp(v[q]);
            if (j != y && j < C) {
                s += e[q];
                w = fmaf(e[q], v[q], w);
                b += v[q];
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            w += __shfl_xor_sync(0xffffffffu, w, o);
            b += __shfl_xor_sync(0xffffffffu, b, o);
        }
        LmCoef k;
        const float g = a.fused ? lm_g(a, i) : 0.0f;
        const float l = lm_row(a, xy, mo, s, w, b, a.fused != 0, g, &k);
        if (lane == 0 && a.rowloss) a.rowloss[i] = l;
        if (a.fused) {
            T* dx = (T*)a.dx + i * a.ld;
#pragma unroll
            for (int g2 = 0; g2 < G; g2++) {
                const int c0 = (lane + 32 * g2) * VEC;
                float o[VEC];
#pragma unroll
                for (int kk = 0; kk < VEC; kk++) {
                    const int q = g2 * VEC + kk;
                    o[kk] = c0 + kk == y ? k.dy : fmaf(e[q], fmaf(k.gq, v[q] + k.k1, k.gp), -k.gc);
                }
                if (c0 + VEC <= C) {
                    lm_store16<T, VEC16>(dx + c0, o);
                } else {
#pragma unroll
                    for (int kk = 0; kk < VEC; kk++)
                        if (c0 + kk < C) dx[c0 + kk] = from_float<T>(o[kk]);
                }
            }
        }
    }
}

/* One CTA of LM_CTA_THREADS per row, C > 1024: thread t takes the VEC-column groups t, t + 512, ...
 * (from column 0) then the tail columns (C % VEC of them) t, t + 512, ...; VEC16: rows (and
 * dlogits) 16-byte aligned, so the groups move as vectors (else element by element, or
 * lm_cta_head_kernel below). STAGE (VEC16, fused): pass 1 keeps group q in stage[q]
 * for pass 2 (the same thread's groups: no barrier; rowpass.cuh), the grid is the resident CTAs;
 * else the grid keeps at most 2 rows per SM in flight so that pass 2's re-read of the row comes from
 * L2 (lm_cuda). */
/* PF (STAGE and VEC16 only; FUSEDLOSS_LM_PREFETCH=1, experimental, not yet measured: written in
 * session 15, which had no GPU): the next row of this CTA is copied into shared memory with
 * per-thread cp.async during this row's pass 2, each vector as soon as its gradient is stored. Every
 * thread owns the same vectors q = tid + 512 k in every row, so it reads only what it copied itself:
 * no barrier (cp.async.wait_group, as the staged distillation kernel). Pass 1 then starts on data
 * already landed and the next row's reads overlap this row's stores and math (today pass 1 waits on
 * its own loads, 2 x 16 bytes a thread in flight). Ignored / out-of-range rows read nothing: their
 * prefetched copy is waited for, then the next row's is issued. */
/* AS (STAGE and VEC16 only, not with PF; FUSEDLOSS_LM_ASYNC, the default since session 29): the row's own groups copied into
 * stage[] by cp.async at the top of pass 1, all of them before the first wait, then read back from shared
 * memory. Why: the ncu source profile of this kernel (H100 s29 run 3, 8192x32000 bf16) has 41% of its warp
 * samples on pass 1's global loads (long scoreboard): two 16-byte loads a thread in flight at a time, four
 * round trips a row at 32000 bf16 columns, against one with every copy issued first, and no registers held
 * for them (3 CTAs an SM at 40 registers; PF's 58 registers took it to 2, which may be why it did not pay). */
/* V (FUSEDLOSS_LM_V: 7, the default since s37, or 0; the staged AS kernels and lm_cta_pf7_kernel; 0 and 7 only): bit 0,
 * the gradient loop without the per-element target test (every column of a group takes lm_grad2; the target's owner overwrites
 * dx[y] with k.dy after its loop: the same thread, so in place and out of place alike the last store wins);
 * bit 1, lm_warp_merge_flat for both merges (one re-shift a lane instead of two a level on one chain); bit 2,
 * the lazy references of pass 1 (lm_push_group_lz). */
template <typename T, bool VEC16, bool STAGE, bool PF = false, bool AS = false, int V = 0>
static __device__ __forceinline__ void lm_cta_body(LmArgs a) {
    constexpr int VEC = 16 / (int)sizeof(T);
    extern __shared__ uint4 stage[];
    constexpr int NW = LM_CTA_THREADS / 32;
    __shared__ float sh_stat[5][NW];   /* the warps' merged statistics (m, s, w, b, n) */
    __shared__ float sh_coef[6];       /* the row's gradient coefficients (LmCoef) */
    const int64_t nvec = a.C / VEC, tail0 = nvec * VEC;
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    if constexpr (PF) {   /* this CTA's first row */
        if (blockIdx.x < a.N) {
            const T* x0 = (const T*)a.x + (int64_t)blockIdx.x * a.ld;
            for (int64_t q = tid; q < nvec; q += LM_CTA_THREADS) cp_async16(stage + q, x0 + q * VEC);
        }
        cp_commit();
    }
    for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
        const int64_t y = rp_label(a.tg, a.lab64, i);
        const int kind = lm_row_kind(a, y);
        if (kind != 0) {   /* the same branch for the whole CTA: no barrier skipped by some threads */
            lm_special_row<T>(a, i, kind, tid, LM_CTA_THREADS);
            if constexpr (PF) {   /* this row's copies landed (unread), then the next row's */
                cp_wait(0);
                if (i + gridDim.x < a.N) {
                    const T* xn = (const T*)a.x + (i + gridDim.x) * a.ld;
                    for (int64_t q = tid; q < nvec; q += LM_CTA_THREADS) cp_async16(stage + q, xn + q * VEC);
                }
                cp_commit();
            }
            continue;
        }
        const T* x = (const T*)a.x + i * a.ld;   /* 64-bit row offset */
        /* x_y by thread 0 before barrier A: in place, the owner's gradient store (after barrier B)
         * overwrites it */
        const float xy = tid == 0 ? to_float(x[y]) : 0.0f;
        if constexpr (AS) {   /* this thread's groups of the row (its previous row's reads of them are done) */
            for (int64_t q = tid; q < nvec; q += LM_CTA_THREADS) cp_async16(stage + q, x + q * VEC);
            cp_commit();
        }
        LmStat st;
        st.m = -INFINITY;
        st.s = st.w = st.b = st.n = 0.0f;
        /* two groups per step, both loads issued before either is processed (bytes in flight; a
         * plain `#pragma unroll 2` made ptxas spill on sm_80): the groups are still taken in the
         * order q, q + 512, q + 1024, ... */
        if constexpr (PF || AS) cp_wait(0);   /* this thread's copies of the row have landed */
        if constexpr ((V & 4) != 0) {   /* (AS or PF: the row in stage[]) one group a step, the same order: two made ptxas keep 52
                                           registers, 2 CTAs an SM instead of 3; 32-bit indices (a staged row
                                           has < 2^16 groups; y < C) */
            const int nv = (int)nvec, yv = (int)y;
            for (int q = tid; q < nv; q += LM_CTA_THREADS) {
                float v0[VEC];
                rp_unpack<T>(stage[q], v0);
                lm_push_group_lz<VEC>(st, v0, yv - q * VEC);
            }
        } else
        for (int64_t q = tid; q < nvec; q += 2 * LM_CTA_THREADS) {
            const bool two = q + LM_CTA_THREADS < nvec;
            float v0[VEC], v1[VEC];
            if constexpr (PF || AS) {   /* copied by this thread (PF: during the previous row's pass 2) */
                rp_unpack<T>(stage[q], v0);
                rp_unpack<T>(two ? stage[q + LM_CTA_THREADS] : stage[q], v1);
            } else if (STAGE) {  /* read once: evict first, kept for pass 2 */
                const uint4 u0 = FL_LDCS((const uint4*)(x + q * VEC));
                const uint4 u1 = two ? FL_LDCS((const uint4*)(x + (q + LM_CTA_THREADS) * VEC)) : u0;
                stage[q] = u0;
                if (two) stage[q + LM_CTA_THREADS] = u1;
                rp_unpack<T>(u0, v0);
                rp_unpack<T>(u1, v1);
            } else {
                lm_load16<T, VEC16, false>(x + q * VEC, v0);
                if (two) lm_load16<T, VEC16, false>(x + (q + LM_CTA_THREADS) * VEC, v1);
            }
            lm_push_group<VEC>(st, v0, y - q * VEC);
            if (two) lm_push_group<VEC>(st, v1, y - (q + LM_CTA_THREADS) * VEC);
        }
        for (int64_t j = tail0 + tid; j < a.C; j += LM_CTA_THREADS) {
            if (j == y) continue;
            const float v = to_float(__ldcg(x + j));
            if (v > st.m) lm_shift(st, v);
            lm_add(st, v);
        }
        st = (V & 2) ? lm_warp_merge_flat(st) : lm_warp_merge(st);
        if (lane == 0) {
            sh_stat[0][wid] = st.m; sh_stat[1][wid] = st.s; sh_stat[2][wid] = st.w;
            sh_stat[3][wid] = st.b; sh_stat[4][wid] = st.n;
        }
        /* barrier A: the warps' partials visible to warp 0. (No barrier is needed at the end of the
         * row: sh_stat is rewritten only after barrier B, which warp 0 passes after reading it, and
         * sh_coef only after the next row's barrier A, which every thread passes after reading it.) */
        __syncthreads();
        if (wid == 0) {
            LmStat u;
            if (lane < NW) {
                u.m = sh_stat[0][lane]; u.s = sh_stat[1][lane]; u.w = sh_stat[2][lane];
                u.b = sh_stat[3][lane]; u.n = sh_stat[4][lane];
            } else {
                u.m = -INFINITY;
                u.s = u.w = u.b = u.n = 0.0f;
            }
            u = (V & 2) ? lm_warp_merge_flat(u) : lm_warp_merge(u);
            if (lane == 0) {
                LmCoef k;
                const float g = a.fused ? lm_g(a, i) : 0.0f;
                const float l = lm_row(a, xy, u.m, u.s, u.w, u.b, a.fused != 0, g, &k);
                if (a.rowloss) a.rowloss[i] = l;
                sh_coef[0] = k.mo; sh_coef[1] = k.gp; sh_coef[2] = k.gq; sh_coef[3] = k.k1;
                sh_coef[4] = k.gc; sh_coef[5] = k.dy;
            }
        }
        /* barrier B: the coefficients visible to every thread; also in the forward, where it keeps
         * the other warps from writing the next row's sh_stat before warp 0 has read this row's */
        __syncthreads();
        if (!a.fused) continue;
        LmCoef k;
        k.mo = sh_coef[0]; k.gp = sh_coef[1]; k.gq = sh_coef[2]; k.k1 = sh_coef[3]; k.gc = sh_coef[4];
        k.dy = sh_coef[5];
        const float c0 = fmaf(k.gq, k.k1, k.gp);   /* V & 1: lm_grad2's constant */
        T* dx = (T*)a.dx + i * a.ld;
        /* PF: the row this CTA takes next (NULL: none), copied into each vector's slot once the
         * slot is read (the same thread: the shared-memory read comes first in program order) */
        const T* xn = (PF && i + gridDim.x < a.N) ? (const T*)a.x + (i + gridDim.x) * a.ld : nullptr;
#pragma unroll 2
        for (int64_t q = tid; q < nvec; q += LM_CTA_THREADS) {
            float v[VEC];
            if (STAGE) rp_unpack<T>(stage[q], v);
            else lm_load16<T, VEC16, true>(x + q * VEC, v);
            if constexpr (PF) {
                if (xn) cp_async16(stage + q, xn + q * VEC);
            }
            if constexpr ((V & 1) != 0) {
#pragma unroll
                for (int kk = 0; kk < VEC; kk++) v[kk] = lm_grad2(k, c0, v[kk]);
            } else {
                const int64_t dq = y - q * VEC;
                const int ty = dq >= 0 && dq < VEC ? (int)dq : -1;   /* 32-bit compares per element */
#pragma unroll
                for (int kk = 0; kk < VEC; kk++) v[kk] = kk == ty ? k.dy : lm_grad(k, v[kk]);
            }
            lm_store16<T, VEC16>(dx + q * VEC, v);
        }
        /* V & 1: the target's column, by the thread whose group it is in (after its own store there) */
        if ((V & 1) != 0 && y < tail0 && (y / VEC) % LM_CTA_THREADS == tid) dx[y] = from_float<T>(k.dy);
        if constexpr (PF) cp_commit();
        for (int64_t j = tail0 + tid; j < a.C; j += LM_CTA_THREADS) {
            const float v = to_float(FL_LDCS(x + j));
            dx[j] = from_float<T>(j == y ? k.dy : lm_grad(k, v));
        }
    }
}

/* the kernels of lm_cta_body: lm_cta_kernel as before (its SASS unchanged), and PF with V = 7 held to 40 registers
 * (3 CTAs an SM; at its natural 56 an SM holds 2) with a 4-byte spill once a row, in lm_row's lane (s37:
 * FUSEDLOSS_LM_PREFETCH=1, off: a tie with V = 7's AS kernel on the H200, s37 run 1) */
template <typename T, bool VEC16, bool STAGE, bool PF = false, bool AS = false, int V = 0>
static __global__ void __launch_bounds__(LM_CTA_THREADS) lm_cta_kernel(LmArgs a) {
    lm_cta_body<T, VEC16, STAGE, PF, AS, V>(a);
}
template <typename T>
static __global__ void __launch_bounds__(LM_CTA_THREADS, 3) lm_cta_pf7_kernel(LmArgs a) {
    lm_cta_body<T, true, true, true, false, 7>(a);
}

/* lm_cta_kernel for rows that are not all 16-byte aligned while logits and dlogits have the same
 * 16-byte phase (lm_cuda): each row's groups start at its first 16-byte boundary and move as
 * vectors; the h head columns before it are extras, handled with the tail (thread t takes the
 * extras t, t + 512, ..., head first). The grouping, hence the last bits, follows the row's
 * address; an aligned row (h = 0) is grouped as in lm_cta_kernel. Why: with groups from column 0
 * such rows (V = 50257) went element by element, 8192x50257 bf16 4.92x the floor (s10 run 2);
 * 2.51x with heads (run 5). A kernel of its own so that the aligned kernel's code stays as it was
 * (the head inside taylor_ce.cu's aligned kernel slowed it, s10 run 6). STAGE (fused): as
 * lm_cta_kernel's, with a row's (C - h) / VEC groups in the C / VEC slots. In place: as
 * lm_cta_kernel (x_y by thread 0 before barrier A; every column, head and tail included, written
 * by the thread that read it). Its body is a copy of lm_cta_kernel's with the heads added: a change
 * to one belongs in the other (see tc_cta_head_kernel). */
/* AS (STAGE only; as lm_cta_kernel's): the row's vectors (from its first 16-byte boundary) copied into stage[]
 * by cp.async before the statistics. */
template <typename T, bool STAGE, bool AS = false, int V = 0>
static __global__ void __launch_bounds__(LM_CTA_THREADS) lm_cta_head_kernel(LmArgs a) {
    constexpr int VEC = 16 / (int)sizeof(T);
    extern __shared__ uint4 stage[];
    constexpr int NW = LM_CTA_THREADS / 32;
    __shared__ float sh_stat[5][NW];   /* the warps' merged statistics (m, s, w, b, n) */
    __shared__ float sh_coef[6];       /* the row's gradient coefficients (LmCoef) */
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
        const int64_t y = rp_label(a.tg, a.lab64, i);
        const int kind = lm_row_kind(a, y);
        if (kind != 0) {   /* the same branch for the whole CTA: no barrier skipped by some threads */
            lm_special_row<T>(a, i, kind, tid, LM_CTA_THREADS);
            continue;
        }
        const T* x = (const T*)a.x + i * a.ld;   /* 64-bit row offset */
        /* head columns before the row's first 16-byte boundary (dlogits: the same phase) */
        int64_t h = (int64_t)(((16u - ((unsigned)(uintptr_t)x & 15u)) & 15u) / sizeof(T));
        if (h > a.C) h = a.C;
        const int64_t nvec = (a.C - h) / VEC, tail0 = h + nvec * VEC, nex = h + (a.C - tail0);
        const T* xb = x + h;
        /* x_y by thread 0 before barrier A: in place, the owner's gradient store (after barrier B)
         * overwrites it */
        const float xy = tid == 0 ? to_float(x[y]) : 0.0f;
        if constexpr (AS) {   /* this thread's vectors of the row (its previous row's reads of them are done) */
            for (int64_t q = tid; q < nvec; q += LM_CTA_THREADS) cp_async16(stage + q, xb + q * VEC);
            cp_commit();
            cp_wait(0);
        }
        LmStat st;
        st.m = -INFINITY;
        st.s = st.w = st.b = st.n = 0.0f;
        /* two groups per step, both loads issued before either is processed (as lm_cta_kernel) */
        if constexpr ((V & 4) != 0) {   /* (AS only) one group a step, as lm_cta_kernel's */
            const int nv = (int)nvec, yv = (int)(y - h);
            for (int q = tid; q < nv; q += LM_CTA_THREADS) {
                float v0[VEC];
                rp_unpack<T>(stage[q], v0);
                lm_push_group_lz<VEC>(st, v0, yv - q * VEC);
            }
        } else
        for (int64_t q = tid; q < nvec; q += 2 * LM_CTA_THREADS) {
            const bool two = q + LM_CTA_THREADS < nvec;
            float v0[VEC], v1[VEC];
            if constexpr (AS) {   /* copied by this thread above */
                rp_unpack<T>(stage[q], v0);
                rp_unpack<T>(two ? stage[q + LM_CTA_THREADS] : stage[q], v1);
            } else if (STAGE) {  /* read once: evict first, kept for pass 2 */
                const uint4 u0 = FL_LDCS((const uint4*)(xb + q * VEC));
                const uint4 u1 = two ? FL_LDCS((const uint4*)(xb + (q + LM_CTA_THREADS) * VEC)) : u0;
                stage[q] = u0;
                if (two) stage[q + LM_CTA_THREADS] = u1;
                rp_unpack<T>(u0, v0);
                rp_unpack<T>(u1, v1);
            } else {
                lm_load16<T, true, false>(xb + q * VEC, v0);
                if (two) lm_load16<T, true, false>(xb + (q + LM_CTA_THREADS) * VEC, v1);
            }
            lm_push_group<VEC>(st, v0, y - h - q * VEC);
            if (two) lm_push_group<VEC>(st, v1, y - h - (q + LM_CTA_THREADS) * VEC);
        }
        for (int64_t e = tid; e < nex; e += LM_CTA_THREADS) {  /* head, then tail columns */
            const int64_t j = e < h ? e : tail0 + (e - h);
            if (j == y) continue;
            const float v = to_float(__ldcg(x + j));
            if (v > st.m) lm_shift(st, v);
            lm_add(st, v);
        }
        st = (V & 2) ? lm_warp_merge_flat(st) : lm_warp_merge(st);
        if (lane == 0) {
            sh_stat[0][wid] = st.m; sh_stat[1][wid] = st.s; sh_stat[2][wid] = st.w;
            sh_stat[3][wid] = st.b; sh_stat[4][wid] = st.n;
        }
        /* barrier A (and no barrier at the end of the row: see lm_cta_kernel) */
        __syncthreads();
        if (wid == 0) {
            LmStat u;
            if (lane < NW) {
                u.m = sh_stat[0][lane]; u.s = sh_stat[1][lane]; u.w = sh_stat[2][lane];
                u.b = sh_stat[3][lane]; u.n = sh_stat[4][lane];
            } else {
                u.m = -INFINITY;
                u.s = u.w = u.b = u.n = 0.0f;
            }
            u = (V & 2) ? lm_warp_merge_flat(u) : lm_warp_merge(u);
            if (lane == 0) {
                LmCoef k;
                const float g = a.fused ? lm_g(a, i) : 0.0f;
                const float l = lm_row(a, xy, u.m, u.s, u.w, u.b, a.fused != 0, g, &k);
                if (a.rowloss) a.rowloss[i] = l;
                sh_coef[0] = k.mo; sh_coef[1] = k.gp; sh_coef[2] = k.gq; sh_coef[3] = k.k1;
                sh_coef[4] = k.gc; sh_coef[5] = k.dy;
            }
        }
        /* barrier B: the coefficients visible to every thread (also in the forward: see
         * lm_cta_kernel) */
        __syncthreads();
        if (!a.fused) continue;
        LmCoef k;
        k.mo = sh_coef[0]; k.gp = sh_coef[1]; k.gq = sh_coef[2]; k.k1 = sh_coef[3]; k.gc = sh_coef[4];
        k.dy = sh_coef[5];
        const float c0 = fmaf(k.gq, k.k1, k.gp);   /* V & 1: lm_grad2's constant */
        T* dx = (T*)a.dx + i * a.ld;
#pragma unroll 2
        for (int64_t q = tid; q < nvec; q += LM_CTA_THREADS) {
            float v[VEC];
            if (STAGE) rp_unpack<T>(stage[q], v);
            else lm_load16<T, true, true>(xb + q * VEC, v);
            if constexpr ((V & 1) != 0) {
#pragma unroll
                for (int kk = 0; kk < VEC; kk++) v[kk] = lm_grad2(k, c0, v[kk]);
            } else {
                const int64_t dq = y - h - q * VEC;
                const int ty = dq >= 0 && dq < VEC ? (int)dq : -1;   /* 32-bit compares per element */
#pragma unroll
                for (int kk = 0; kk < VEC; kk++) v[kk] = kk == ty ? k.dy : lm_grad(k, v[kk]);
            }
            lm_store16<T, true>(dx + h + q * VEC, v);
        }
        /* V & 1: the target's column, as lm_cta_kernel (its vector columns only: the extras take k.dy below) */
        if ((V & 1) != 0 && y >= h && y < tail0 && ((y - h) / VEC) % LM_CTA_THREADS == tid) dx[y] = from_float<T>(k.dy);
        /* each extra column read and written by the same thread: safe in place */
        for (int64_t e = tid; e < nex; e += LM_CTA_THREADS) {
            const int64_t j = e < h ? e : tail0 + (e - h);
            const float v = to_float(FL_LDCS(x + j));
            dx[j] = from_float<T>(j == y ? k.dy : lm_grad(k, v));
        }
    }
}

/* ---- the ring kernel's policy (ringrow.cuh: FUSEDLOSS_LM_PIPE=1, experimental, not yet run) --------
 * The same per-group statistics (lm_push_group), merge tree (lm_warp_merge), row formula (lm_row) and
 * gradient (lm_grad) as the CTA kernels; the target's column is excluded from the statistics and
 * gets k.dy. */
struct LmRing {
    typedef LmArgs Args;
    typedef LmStat Stat;
    static constexpr bool kPairs = true;   /* two running sums a thread: the re-shift tests and the sums'
                                              chains of two groups overlap */
    static __device__ __forceinline__ Stat merge(Stat a, Stat b) { return lm_merge(a, b); }
    static __device__ __forceinline__ Stat init() {
        Stat t;
        t.m = -INFINITY;
        t.s = t.w = t.b = t.n = 0.0f;
        return t;
    }
    template <int VEC>
    static __device__ __forceinline__ void push(const Args&, Stat& t, const float* v, int64_t dq) {
        lm_push_group<VEC>(t, v, dq);
    }
    static __device__ __forceinline__ void push1(const Args&, Stat& t, float v, bool target) {
        if (target) return;
        if (v > t.m) lm_shift(t, v);
        lm_add(t, v);
    }
    static __device__ __forceinline__ Stat warp_merge(Stat t) { return lm_warp_merge_flat(t); }
    static __device__ __forceinline__ int kind(const Args& a, int64_t y) { return lm_row_kind(a, y); }
    static __device__ __forceinline__ float row(const Args& a, int64_t i, float xy, const Stat& u, float* c) {
        LmCoef k;
        const float l = lm_row(a, xy, u.m, u.s, u.w, u.b, true, lm_g(a, i), &k);
        c[0] = k.mo; c[1] = k.gp; c[2] = k.gq; c[3] = k.k1; c[4] = k.gc; c[5] = k.dy;
        return l;
    }
    static __device__ __forceinline__ float grad(const Args&, const float* c, float v, bool target) {
        if (target) return c[5];
        const LmCoef k = {c[0], c[1], c[2], c[3], c[4], c[5]};
        return lm_grad(k, v);
    }
};

// ---------------------------------------------------------------------------------------------
// launchers
// ---------------------------------------------------------------------------------------------

typedef void (*lm_fn)(LmArgs);

/* FUSEDLOSS_LM_PREFETCH=1: the staged CTA kernel with the next row's cp.async prefetch (PF above) */
static int lm_prefetch(void) { return rp_env_flag("FUSEDLOSS_LM_PREFETCH", 0) != 0; }
/* FUSEDLOSS_LM_ASYNC (default 1 since session 29; 0: the register loads): the staged CTA kernels with the row's own
 * copies issued first (AS above). H100 s29 run 4, bench_taylor lm_vocab 8192x32000 bf16, graph step, two
 * alternations: 0.448 / 0.447 ms -> 0.415 / 0.414 ms (1.28x -> 1.18-1.19x that card's floor); tests 4661/0,
 * memcheck 0, racecheck 0. (The head kernel's AS, for rows not 16-byte aligned such as 50257 columns, came after
 * that run.) */
static int lm_async(void) { return rp_env_flag("FUSEDLOSS_LM_ASYNC", 1) != 0; }

/* FUSEDLOSS_LM_V (default 7 since session 37; 0: the s29-s36 staged AS kernels; other values: 7): the staged AS
 * kernels' variant V (lm_cta_kernel / lm_cta_head_kernel; with FUSEDLOSS_LM_PREFETCH=1, lm_cta_pf7_kernel). H200 s37
 * run 1 (bench_taylor lm_vocab, bf16, graph step x floor, two alternations), V = 0 / 1 / 3 / 7 / PREFETCH=1 with 7:
 * 8192x32000 0.388, 0.390 / 0.369, 0.356 / 0.324, 0.325 / **0.319, 0.321** / 0.317, 0.320 ms (1.55-1.56x -> 1.28x);
 * 8192x50257 (head kernel) 0.625 -> **0.538 ms** (1.59x -> 1.37x). V = 1 and 3 (the gradient loop alone, plus the
 * flat merges) lost to 7 and were removed; the flat merges (once a row) were worth as much as the per-element cut
 * of V = 1 (-0.045 / -0.031 against -0.019 / -0.034 ms). Tests at V = 7:
 * 5199/0, memcheck 0 (also PREFETCH=1). */
static int lm_variant(void) { return rp_env_i64("FUSEDLOSS_LM_V", 7) == 0 ? 0 : 7; }

template <typename T>
static lm_fn lm_pick_t(int64_t C, bool vec16, bool head, bool stage) {
    constexpr int VEC = 16 / (int)sizeof(T);
    const int64_t G = ((C + VEC - 1) / VEC + 31) / 32;   /* groups per lane */
    const bool v7 = lm_variant() == 7;
    if (C > 1024 && head) {
        if (stage && lm_async() && v7) return lm_cta_head_kernel<T, true, true, 7>;
        return stage ? (lm_async() ? lm_cta_head_kernel<T, true, true> : lm_cta_head_kernel<T, true>)
                     : lm_cta_head_kernel<T, false>;
    }
    /* PREFETCH=1 with V = 7 (s37): a tie with V = 7's AS kernel (0.317, 0.320 against 0.319, 0.321 ms), stays off */
    if (C > 1024 && stage && lm_prefetch()) return v7 ? lm_cta_pf7_kernel<T> : lm_cta_kernel<T, true, true, true>;
    if (C > 1024 && stage && lm_async())
        return v7 ? lm_cta_kernel<T, true, true, false, true, 7> : lm_cta_kernel<T, true, true, false, true>;
    if (C > 1024 && stage) return lm_cta_kernel<T, true, true>;
    if (C > 1024) return vec16 ? lm_cta_kernel<T, true, false> : lm_cta_kernel<T, false, false>;
    if (G <= 1) return vec16 ? lm_warp_kernel<T, 1, true> : lm_warp_kernel<T, 1, false>;
    if (G <= 2) return vec16 ? lm_warp_kernel<T, 2, true> : lm_warp_kernel<T, 2, false>;
    if constexpr (VEC == 4) {   /* fp32: up to 8 groups of 4 at C = 1024; 16-bit: up to 4 of 8 */
        if (G > 4) return vec16 ? lm_warp_kernel<T, 8, true> : lm_warp_kernel<T, 8, false>;
    }
    return vec16 ? lm_warp_kernel<T, 4, true> : lm_warp_kernel<T, 4, false>;
}
static lm_fn lm_pick(fl_dtype dt, int64_t C, bool vec16, bool head, bool stage) {
    switch (dt) {
        case FL_DTYPE_F32: return lm_pick_t<float>(C, vec16, head, stage);
        case FL_DTYPE_F16: return lm_pick_t<__half>(C, vec16, head, stage);
        default: return lm_pick_t<__nv_bfloat16>(C, vec16, head, stage);
    }
}

/* FUSEDLOSS_LM_PIPE=1: fused rows of > 1024 classes on sm_90 through rr_kernel<T, LmRing> (ringrow.cuh),
 * aligned or of one 16-byte phase with dlogits. Off by default: SLOWER than the CTA kernels (H200 s16
 * runs 2-3, graph step x floor: 8192x32000 bf16 2.0-2.1x at every plan tried against 1.64x, 8192x50257
 * 1.83x against 1.74x: 16 warps on its exponentials instead of 3 CTAs' 48). Knobs
 * FUSEDLOSS_LM_PIPE_{THREADS,STATS,RING,SUB,SLACK,PLAIN_ST,GRID} (ringrow.cuh). */
static fl_status lm_cuda(const char* fn, fl__pass pass, float* loss, void* dlogits, const void* logits, int64_t ld,
                         const void* targets, fl_index_dtype index_dtype, const float* grad_loss, float grad_scale,
                         int64_t N, int64_t C, fl_dtype dtype, const fl_large_margin_options* opts, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    fl__clear_error();
    fl__large_margin_params p;
    FL_CHECK(fl__large_margin_validate(fn, pass, 1, loss, dlogits, logits, ld, targets, index_dtype, grad_loss,
                                       grad_scale, N, C, dtype, opts, workspace, workspace_bytes, &p));
    const RlPlan w = rl_plan(workspace, loss, p.reduction);
    int done = 0;
    FL_CUDA_TRY(rl_begin(w, loss, targets, index_dtype == FL_INDEX_I64, p.ignore_index, N, stream, &done));
    if (done) return FL_OK;
    const int none = w.none, mean = w.mean;
    const int fused = pass == FL__PASS_FUSED;
    LmArgs a;
    memset(&a, 0, sizeof a);
    a.x = logits;
    a.dx = fused ? dlogits : nullptr;
    a.tg = targets;
    a.lab64 = index_dtype == FL_INDEX_I64;
    a.N = N;
    a.C = C;
    a.ld = ld;
    a.ign = p.ignore_index;
    a.half = 0.5f * p.lambda;
    a.c = (float)(1.0 / (double)(C - 1));
    a.none = none;
    a.mean = mean;
    a.fused = fused;
    a.gl = grad_loss;
    a.gscale = grad_scale;
    a.Ddev = mean ? w.D : nullptr;
    a.rowloss = loss ? w.rowloss : nullptr;
    a.error_flag = p.error_flag;

    const size_t es = fl__dtype_size(dtype);
    /* vec16: every row (and dlogits) 16-byte aligned: groups from column 0 as vectors. Else, for
     * C > 1024 with element-aligned logits and dlogits of the same 16-byte phase (always so in
     * place), head: lm_cta_head_kernel, vectors from each row's first boundary. Else element by
     * element from column 0. */
    const bool vec16 = rl_vec16(logits, dlogits, fused, ld, es);
    const bool head = !vec16 && C > 1024 && (uintptr_t)logits % es == 0 &&
                      (!fused || ((uintptr_t)logits - (uintptr_t)dlogits) % 16 == 0);
    /* staged up to the stage limit below (rows of <= 72 KB until s30: with register loads the kernel was bound
     * by its exponentials, not by the re-read, and with 2 per SM staging lost: H200 s10 run 2, fwd+bwd in a
     * CUDA graph, 8192x32000 bf16 0.635 ms staged vs 0.638 re-read; 8192x20000 fp32, 80 KB rows, 0.551 vs 0.533) */
    RrPlan lp;
    if (const void* pfn = rr_plan<LmRing>("FUSEDLOSS_LM_PIPE", 0, "pipelined large-margin kernel", dtype, N, C,
                                          vec16 || head, fused, logits, ld, &lp)) {
        void* args[] = {&a, &lp.sub, &lp.R, &lp.Ts, &lp.maps};
        FL_CUDA_TRY(cudaLaunchKernel(pfn, dim3(lp.grid), dim3((unsigned)lp.T), args, lp.smem, stream));
        FL_CUDA_TRY(rl_end(w, loss, N, stream));
        return FL_OK;
    }
    /* FUSEDLOSS_LM_STAGE_KB (default 100 = RL_STAGE_MAX_BYTES since s30; 72 = the old cap): the largest staged row.
     * With s29's cp.async row copies (AS) staging at 2 CTAs an SM wins, unlike s10's register loads above: H100
     * s30 run 1, graph step, 72 / 100, two alternations: 8192x50257 bf16 (98 KB rows) 0.852, 0.849 / 0.675, 0.683
     * ms (1.55x -> 1.22x); 8192x20000 fp32 (80 KB) 0.618, 0.614 / 0.503, 0.504 ms (1.41x -> 1.14x). */
    int64_t stage_kb = rp_env_i64("FUSEDLOSS_LM_STAGE_KB", 100);
    if (stage_kb < 1 || stage_kb > RL_STAGE_MAX_BYTES / 1024) stage_kb = 100;
    const size_t smem = rl_stage_bytes(C, es, vec16 || head, fused, stage_kb * 1024);
    const lm_fn kfn = lm_pick(dtype, C, vec16, head, smem > 0);
    unsigned grid = 0;
    if (smem > 0) FL_CUDA_TRY(rl_stage_grid((const void*)kfn, LM_CTA_THREADS, smem, N, &grid));
    else FL_CUDA_TRY(rl_grid(N, C, LM_THREADS, &grid));
    kfn<<<grid, C <= 1024 ? LM_THREADS : LM_CTA_THREADS, smem, stream>>>(a);
    FL_CUDA_TRY(cudaGetLastError());
    FL_CUDA_TRY(rl_end(w, loss, N, stream));
    return FL_OK;
}

// ---------------------------------------------------------------------------------------------
// entry points
// ---------------------------------------------------------------------------------------------
extern "C" {

fl_status fl_large_margin_ce_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                          fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                          const fl_large_margin_options* opts, void* workspace,
                                          size_t workspace_bytes, fl_stream stream) {
    return lm_cuda("fl_large_margin_ce_forward_cuda", FL__PASS_FORWARD, loss, NULL, logits, ld, targets,
                   index_dtype, NULL, 1.0f, N, C, dtype, opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

fl_status fl_large_margin_ce_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld,
                                        const void* targets, fl_index_dtype index_dtype, const float* grad_loss,
                                        float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                        const fl_large_margin_options* opts, void* workspace,
                                        size_t workspace_bytes, fl_stream stream) {
    return lm_cuda("fl_large_margin_ce_fused_cuda", FL__PASS_FUSED, loss, dlogits, logits, ld, targets, index_dtype,
                   grad_loss, grad_scale, N, C, dtype, opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

}  // extern "C"
