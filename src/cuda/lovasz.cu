/* lovasz.cu — CUDA backend of the Lovasz-softmax loss (include/fusedloss.h section 13), the same
 * semantics as src/cpu/lovasz.c. One pipeline, every step on the caller's stream:
 *
 *   P = N d pixels, a set = the batch (per_image == 0, L = P) or one image (L = d); a segment
 *   s = set * C + c is class c over one set: L elements, S = sets * C segments, E = S L = C P.
 *
 *   1. lv_keys     one thread per pixel (lse first when from_logits): for every class c, at
 *                  position s L + j (j: the pixel's place in its set) a 64-bit key
 *                  (s << 32) | (0x7FFFFFFF - bits(e)) (e = |fg - p| in fp32 >= 0, so its bits
 *                  order like its value; a NaN e maps to 0: first, as on the CPU), or
 *                  (s << 32) | 0xFFFFFFFF for an ignored pixel (last in its segment), and a
 *                  32-bit value (j << 1) | fg. Probabilities + fused: ignored pixels' dinput = 0.
 *   2. cub::DeviceRadixSort::SortPairs over bits [0, 32 + bits(S - 1)): LSD radix sort is stable,
 *                  and the keys are laid out in increasing pixel index, so equal errors keep the
 *                  header's tie order (increasing pixel index). Each segment stays in place.
 *      Default since 2026-12-05 (when 1 + bits(L - 1) + bits(S - 1) <= 32): the same order from
 *                  8-byte pairs: lv_keys writes the 32-bit error keys and values packing (s, j, fg);
 *                  pass A sorts by the error keys (32 bits), pass B stably by the segment field of
 *                  the values (see lv_run_t); FUSEDLOSS_LOVASZ_SORT=1 takes the 12-byte pairs above.
 *      Default since 2026-12-06 (s33) for segments of >= 65536 pixels: no pass B; each segment is
 *                  sorted on its own by its error keys (lv_seg_sort: CUB's onesweep agents, one
 *                  sort a segment in the same four launches), the same order again.
 *   3. cub::DeviceScan::InclusiveSum of the fg bits in sorted order (read from the values through
 *                  a transform iterator), over all E (a segment's count = the scan minus its value
 *                  before the segment).
 *   4. lv_segments one thread per set: G_s per class, V (valid pixels = sum G), K (classes
 *                  averaged), the loss weight 1 / K [/ N] and the gradient weight g / K [/ N] per
 *                  segment (0 for classes not averaged and sets without valid pixels); g from
 *                  grad_loss on the device (no host read).
 *   5. lv_jaccard  one thread per sorted position (rank k = 1..V of its segment): with a = the fg
 *                  count and b = k - a the bg count up to k, J_k = k / (G + b) and
 *                  D_k = 1 / (G + b) (fg)  or  (G - a) / ((G + b)(G + b - 1)) (bg, k > 1; 1 / (G + 1)
 *                  at k = 1) — Berman's J_k - J_{k-1} in closed form (no cancellation), in double;
 *                  the loss term e D_k in double, summed per block in a fixed order; the gradient
 *                  w D_k (fg ? -1 : +1) to dinput (probabilities) or to gp [C][P] fp32 (logits).
 *   6. lv_final    one block: the block partials in a fixed order (deterministic), NaN if a label
 *                  was out of range; lv_softmax_bwd (logits + fused): per pixel dx_c = p_c (gp_c -
 *                  sum_k p_k gp_k), every x read before dx is written (in place works).
 *   FUSEDLOSS_LOVASZ_JAC=2 (32-bit sort path; the default since s20, =1 takes 3-5) replaces 3-5 with lv_count
 *                  (G from the labels, before the sort), lv_prep (segment table, look-back states,
 *                  bucket cursors), lv_jaccard2 (tiles in order, the fg scan by decoupled look-back,
 *                  the gradient appended by bucket) and lv_flush (each bucket's window out in pixel
 *                  order); see the section before lv_jaccard2.
 *
 * Numerics: e in fp32 (the CPU uses double), so errors that differ by less than an fp32 rounding
 * may tie here (ordered by pixel index) where the CPU separates them: the loss does not depend on
 * the tie order, the gradient does (the CPU and CUDA gradients agree exactly when the fp32 errors
 * are exact, e.g. probabilities on a 2^-12 grid). Out-of-range labels: that pixel is ignored in the
 * sort, the loss is NaN, its dinput is NaN, and *opts->error_flag = 1 when error_flag is set.
 * Limits: E = C N d <= 2^31 - 1 elements (FL_ERR_UNSUPPORTED beyond).
 * Workspace (256-byte aligned pieces): 256 header | G 4S | keys 2 x 8E | values 2 x 4E | lse 4P (logits)
 * | per segment base, V int32 + loss / gradient weights double | block / tile partials | look-back
 * states | bucket cursors | CUB temp (or lv_seg_sort's scratch, whichever is larger).
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cub/agent/agent_radix_sort_histogram.cuh>
#include <cub/agent/agent_radix_sort_onesweep.cuh>
#include <cub/agent/single_pass_scan_operators.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda/std/functional>
#include <thrust/iterator/transform_iterator.h>

#include "common.cuh"

#define LV_THREADS 256
#define LV_MAX_BLOCKS 2048
#define LV_REG_C 32   /* lv_softmax_bwd keeps p and gp of up to 32 classes in registers */
/* the v2 Jaccard pass (FUSEDLOSS_LOVASZ_JAC=2, lv_jaccard2): tiles of LV_TILE sorted positions */
#define LV_ITEMS 16
#define LV_TILE (LV_THREADS * LV_ITEMS)
#define LV_GC_SMEM 1024   /* lv_count: per-block fg counts in shared memory for S <= this */
#define LV_LB_MAX 512     /* gradient buckets one tile may touch (bucketed scatter) */
#define LV_BB_MIN 5       /* bucket width 2^bits pixels, bits in [LV_BB_MIN, LV_BB_MAX] */
#define LV_BB_MAX 13
#define LV_PC_D 1024      /* FUSEDLOSS_LOVASZ_PC=1: probabilities with d below this go through gp */

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef cub::ScanTileState<int> LvTileState;

typedef struct {
    const void* x;
    void* dx;
    const void* labels;
    int lab64;
    int64_t N, C, d, ld, P, L, S, E;
    int64_t ign;
    int per_image, from_logits, fused, all;
    u64* keys;      /* current key buffer of the sort's input */
    u32* vals;
    float* lse;     /* [P] (logits) */
    int* bad;       /* header: 1 when a label was out of range */
    int* error_flag;
    const float* grad_loss;
    float grad_scale;
} LvArgs;

static __device__ __forceinline__ int64_t lv_label(const void* lab, int lab64, int64_t i) {
    return lab64 ? ((const long long*)lab)[i] : (int64_t)((const int*)lab)[i];
}

/* FUSEDLOSS_LOVASZ_SORT=3 (s20; off: slower, see lv_sort_packed): the 32-bit path's error key kq and value vq
 * ((s << (jb + 1)) | (j << 1) | fg) packed into one 64-bit key [s | k31 | j | fg], sorted alone over
 * bits [jb + 1, jb + 32 + sbits) (see lv_sort_packed). k31 keeps kq's order in 31 bits: kq takes
 * 0 (NaN), [0x007FFFFF, 0x7FFFFFFF] (e from +inf down to 0) or 0xFFFFFFFF (ignored), so
 * k31 = 0, kq - 0x007FFFFE in [1, 0x7F800001], or 0x7F800002. lv_unpack gives kq and vq back. */
static __device__ __forceinline__ u64 lv_pack(u32 kq, u32 vq, int jb) {
    const u32 k31 = kq == 0u ? 0u : kq == 0xFFFFFFFFu ? 0x7F800002u : kq - 0x007FFFFEu;
    const u64 low = (u64)vq & ((2ull << jb) - 1ull);
    return ((u64)(vq >> (jb + 1)) << (jb + 32)) | ((u64)k31 << (jb + 1)) | low;
}
static __device__ __forceinline__ void lv_unpack(u64 w, int jb, u32& kq, u32& vq) {
    const u32 k31 = (u32)(w >> (jb + 1)) & 0x7FFFFFFFu;
    kq = k31 == 0u ? 0u : k31 == 0x7F800002u ? 0xFFFFFFFFu : k31 + 0x007FFFFEu;
    vq = ((u32)(w >> (jb + 32)) << (jb + 1)) | (u32)(w & ((2ull << jb) - 1ull));
}
/* the 32-bit path's key and value at sorted-input position pos: two arrays, or one packed word (PK) */
template <bool PK>
static __device__ __forceinline__ void lv_put(const LvArgs& a, int64_t pos, u32 kq, u32 vq, int jb) {
    if constexpr (PK) {
        a.keys[pos] = lv_pack(kq, vq, jb);
    } else {
        ((u32*)a.keys)[pos] = kq;
        a.vals[pos] = vq;
    }
}

template <typename T, bool K32, bool PK = false>
static __global__ void __launch_bounds__(LV_THREADS) lv_keys(LvArgs a, int jb) {
    const T* x = (const T*)a.x;
    T* dx = (T*)a.dx;
    for (int64_t i = (int64_t)blockIdx.x * LV_THREADS + threadIdx.x; i < a.P; i += (int64_t)gridDim.x * LV_THREADS) {
        const int64_t y = lv_label(a.labels, a.lab64, i);
        const int bad = y != a.ign && (y < 0 || y >= a.C);
        const int skip = y == a.ign || bad;
        if (bad) {
            atomicOr(a.bad, 1);
            if (a.error_flag) atomicOr(a.error_flag, 1);
        }
        const int64_t n = i / a.d, k = i - n * a.d;
        const int64_t e0 = n * a.ld + k;
        const int64_t set = a.per_image ? n : 0;
        const int64_t j = a.per_image ? k : i;
        if constexpr (K32) {
            /* (SORT=2 only) C <= LV_REG_C: the pixel's C values loaded back to back into registers
             * first (the loop below issues each class's load after the previous class's stores,
             * which may alias it: one memory latency per class), then the same operations in the
             * same order as below, so the same keys and lse bit for bit */
            if (a.C <= LV_REG_C) {
                float xv[LV_REG_C];
#pragma unroll
                for (int c = 0; c < LV_REG_C; c++)
                    xv[c] = (c < a.C && !skip) ? to_float(x[e0 + (int64_t)c * a.d]) : 0.0f;
                float lse = 0.0f;
                if (a.from_logits && !skip) {
                    float m = -INFINITY;
#pragma unroll
                    for (int c = 0; c < LV_REG_C; c++)
                        if (c < a.C) m = fmaxf(m, xv[c]);
                    float s = 0.0f;
#pragma unroll
                    for (int c = 0; c < LV_REG_C; c++)
                        if (c < a.C) s += expf(xv[c] - m);
                    lse = m + logf(s);
                    a.lse[i] = lse;
                }
#pragma unroll
                for (int c = 0; c < LV_REG_C; c++) {
                    if (c >= a.C) break;
                    const int64_t pos = (set * a.C + c) * a.L + j;
                    const u32 sj = ((u32)(set * a.C + c) << (jb + 1)) | ((u32)j << 1);
                    if (skip) {
                        lv_put<PK>(a, pos, 0xFFFFFFFFu, sj, jb);
                        if (a.fused && !a.from_logits) dx[e0 + (int64_t)c * a.d] = from_float<T>(bad ? NAN : 0.0f);
                        continue;
                    }
                    const float p = a.from_logits ? expf(xv[c] - lse) : xv[c];
                    const int fg = y == c;
                    const float e = fabsf((fg ? 1.0f : 0.0f) - p);
                    lv_put<PK>(a, pos, e != e ? 0u : 0x7FFFFFFFu - __float_as_uint(e), sj | (u32)fg, jb);
                }
                continue;
            }
        }
        float lse = 0.0f;
        if (a.from_logits && !skip) {
            float m = -INFINITY;
            for (int64_t c = 0; c < a.C; c++) m = fmaxf(m, to_float(x[e0 + c * a.d]));
            float s = 0.0f;
            for (int64_t c = 0; c < a.C; c++) s += expf(to_float(x[e0 + c * a.d]) - m);
            lse = m + logf(s);
            a.lse[i] = lse;
        }
        for (int64_t c = 0; c < a.C; c++) {
            const int64_t pos = (set * a.C + c) * a.L + j;
            const u64 hi = (u64)(set * a.C + c) << 32;
            const u32 sj = K32 ? ((u32)(set * a.C + c) << (jb + 1)) | ((u32)j << 1) : 0u;   /* packed (s, j) */
            if (skip) {
                if constexpr (K32) {
                    lv_put<PK>(a, pos, 0xFFFFFFFFu, sj, jb);
                } else {
                    a.keys[pos] = hi | 0xFFFFFFFFull;
                    a.vals[pos] = (u32)j << 1;
                }
                if (a.fused && !a.from_logits) dx[e0 + c * a.d] = from_float<T>(bad ? NAN : 0.0f);
                continue;
            }
            const float v = to_float(x[e0 + c * a.d]);
            const float p = a.from_logits ? expf(v - lse) : v;
            const int fg = y == c;
            const float e = fabsf((fg ? 1.0f : 0.0f) - p);
            const u32 low = e != e ? 0u : 0x7FFFFFFFu - __float_as_uint(e);
            if constexpr (K32) {
                lv_put<PK>(a, pos, low, sj | (u32)fg, jb);
            } else {
                a.keys[pos] = hi | (u64)low;
                a.vals[pos] = ((u32)j << 1) | (u32)fg;
            }
        }
    }
}

/* 4 consecutive elements of T at p (p 4-element aligned) as floats: one 16-byte (fp32) or 8-byte load */
template <typename T>
static __device__ __forceinline__ void lv_load4(const T* p, float* v) {
    if constexpr (sizeof(T) == 4) {
        const float4 f = *(const float4*)p;
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
    } else {
        const uint2 u = *(const uint2*)p;
        const T* h = (const T*)&u;
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = to_float(h[k]);
    }
}

/* lv_keys<T, true> four pixels a thread (FUSEDLOSS_LOVASZ_KEYS4, default 1 since s20: 155 -> 140 us on H100): per class one
 * 16-byte (fp32; 8-byte 16-bit) load of the 4 pixels and one 16-byte store each of their keys and
 * values, instead of 4-byte accesses, so each of the 19 + 38 streams a warp touches moves 512 bytes
 * at a time instead of 128 (the default ran at ~2 TB/s: 88 MB read, 160 MB written in 124 us, s16).
 * The same operations in the same order per pixel (lse: the max, then the sum over the classes in
 * order; then the keys), so the same keys, values and lse bit for bit; the logits' three sweeps over
 * the classes reload the pixels' values (from L1 / L2) instead of holding 4 C of them. Needs d, ld
 * and x 4-element aligned (lv_run_t checks), so the 4 pixels share an image and L % 4 == 0. */
/* (s33: the class loads through ld.global.nc, two in flight instead of one, measured 138.8 / 139.6 against
 * 135.7 / 136.4 us on the H100, run 3: removed; s21's four in flight lost too, so more loads in flight is
 * not this kernel's lever despite ncu's 89% long-scoreboard samples) */
/* MB (the default since s23, FUSEDLOSS_LOVASZ_KEYS4_MINB=0: no bound): the same code bounded to 4 blocks an SM
 * (64 registers, no spills; unbounded it takes 72, 3 blocks: ncu s21 run 3 found it occupancy-bound, 61.5% of
 * DRAM, 136 us for a ~80 us floor). H100 s23 run 3, alternated twice: 139.7 / 139.8 -> 135.4 / 135.9 us; tests
 * 7158/0, bitwise against MB 0 (A/B row). A bound of 1 would change the code (NOTES "SASS"): 0 = none. */
template <typename T, bool PK = false, int MB = 0>
static __global__ void __launch_bounds__(LV_THREADS, MB) lv_keys4(LvArgs a, int jb) {
    const T* x = (const T*)a.x;
    T* dx = (T*)a.dx;
    const int64_t P4 = a.P >> 2;
    for (int64_t q = (int64_t)blockIdx.x * LV_THREADS + threadIdx.x; q < P4; q += (int64_t)gridDim.x * LV_THREADS) {
        const int64_t i0 = q << 2;
        const int64_t n = i0 / a.d, k0 = i0 - n * a.d;
        const int64_t e0 = n * a.ld + k0;
        const int64_t set = a.per_image ? n : 0;
        const int64_t j0 = a.per_image ? k0 : i0;
        int yc[4];   /* the pixel's class, -1 ignored, -2 out of range (flagged) */
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t y = lv_label(a.labels, a.lab64, i0 + u);
            const int bad = y != a.ign && (y < 0 || y >= a.C);
            yc[u] = bad ? -2 : y == a.ign ? -1 : (int)y;
            if (bad) {
                atomicOr(a.bad, 1);
                if (a.error_flag) atomicOr(a.error_flag, 1);
            }
        }
        float lse[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (a.from_logits) {   /* skipped pixels' values are read but not used (as lse, never stored) */
            float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, sm[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v[4];
#pragma unroll 4
            for (int64_t c = 0; c < a.C; c++) {
                lv_load4<T>(x + e0 + c * a.d, v);
#pragma unroll
                for (int u = 0; u < 4; u++) m[u] = fmaxf(m[u], v[u]);
            }
#pragma unroll 4
            for (int64_t c = 0; c < a.C; c++) {
                lv_load4<T>(x + e0 + c * a.d, v);
#pragma unroll
                for (int u = 0; u < 4; u++) sm[u] += expf(v[u] - m[u]);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                lse[u] = m[u] + logf(sm[u]);
                if (yc[u] >= 0) a.lse[i0 + u] = lse[u];
            }
        }
#pragma unroll 4   /* loads of 4 classes in flight */
        for (int64_t c = 0; c < a.C; c++) {
            const int64_t sc = set * a.C + c;
            const int64_t pos = sc * a.L + j0;
            float v[4];
            lv_load4<T>(x + e0 + c * a.d, v);
            u32 kq[4], vq[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const u32 sj = ((u32)sc << (jb + 1)) | ((u32)(j0 + u) << 1);
                if (yc[u] < 0) {
                    kq[u] = 0xFFFFFFFFu;
                    vq[u] = sj;
                    if (a.fused && !a.from_logits) dx[e0 + c * a.d + u] = from_float<T>(yc[u] == -2 ? NAN : 0.0f);
                    continue;
                }
                const float p = a.from_logits ? expf(v[u] - lse[u]) : v[u];
                const int fg = yc[u] == (int)c;
                const float e = fabsf((fg ? 1.0f : 0.0f) - p);
                kq[u] = e != e ? 0u : 0x7FFFFFFFu - __float_as_uint(e);
                vq[u] = sj | (u32)fg;
            }
            if constexpr (PK) {   /* pos % 4 == 0: two 16-byte stores of the 4 packed words */
                ulonglong2* w = (ulonglong2*)(a.keys + pos);
                w[0] = make_ulonglong2(lv_pack(kq[0], vq[0], jb), lv_pack(kq[1], vq[1], jb));
                w[1] = make_ulonglong2(lv_pack(kq[2], vq[2], jb), lv_pack(kq[3], vq[3], jb));
            } else {
                *(uint4*)((u32*)a.keys + pos) = make_uint4(kq[0], kq[1], kq[2], kq[3]);
                *(uint4*)(a.vals + pos) = make_uint4(vq[0], vq[1], vq[2], vq[3]);
            }
        }
    }
}

/* the v2 pipeline's G_s (fg pixels of every segment) from the labels: per block in shared memory when
 * S <= LV_GC_SMEM, then one atomic a segment (integer sums: deterministic); gcnt [S] zeroed before. A
 * kernel of its own: counted inside lv_keys it made ptxas spill the 16-bit K32 variants. */
static __global__ void __launch_bounds__(LV_THREADS) lv_count(LvArgs a, int* gcnt) {
    __shared__ int gh[LV_GC_SMEM];
    const bool sm = a.S <= LV_GC_SMEM;
    if (sm) {
        for (int k = threadIdx.x; k < (int)a.S; k += LV_THREADS) gh[k] = 0;
        __syncthreads();
    }
    for (int64_t i = (int64_t)blockIdx.x * LV_THREADS + threadIdx.x; i < a.P; i += (int64_t)gridDim.x * LV_THREADS) {
        const int64_t y = lv_label(a.labels, a.lab64, i);
        if (y == a.ign || y < 0 || y >= a.C) continue;   /* ignored, or out of range (lv_keys flags it) */
        const int64_t seg = (a.per_image ? i / a.d : 0) * a.C + y;
        if (sm) atomicAdd(&gh[seg], 1);
        else atomicAdd(gcnt + seg, 1);
    }
    if (sm) {
        __syncthreads();
        for (int k = threadIdx.x; k < (int)a.S; k += LV_THREADS)
            if (gh[k]) atomicAdd(gcnt + k, gh[k]);
    }
}

/* the fg bit of a sorted value, as the scan's input */
struct LvFg {
    __host__ __device__ int operator()(u32 v) const { return (int)(v & 1u); }
};
typedef thrust::transform_iterator<LvFg, const u32*> LvFgIt;
struct LvFgPk {   /* SORT=3: fg is the packed word's bit 0 */
    __host__ __device__ int operator()(u64 w) const { return (int)(w & 1ull); }
};
typedef thrust::transform_iterator<LvFgPk, const u64*> LvFgPkIt;

/* one set's segment weights from its classes' fg counts G (lv_segments, lv_prep): V valid pixels
 * (= sum G), K classes averaged, loss weight 1 / K [/ N] and gradient weight g / K [/ N] for the
 * averaged classes of a set with valid pixels, else 0 */
static __device__ __forceinline__ void lv_set_weights(int64_t set, int64_t C, int all, int per_image, int64_t N,
                                                      double g, const int* G, int* Vs, double* lw, double* gw) {
    int64_t V = 0, K = 0;
    for (int64_t c = 0; c < C; c++) {
        const int Gc = G[set * C + c];
        V += Gc;
        K += all || Gc > 0;
    }
    const double div = (double)K * (per_image ? (double)N : 1.0);
    for (int64_t c = 0; c < C; c++) {
        const int64_t s = set * C + c;
        const int counted = V > 0 && (all || G[s] > 0);
        lw[s] = counted ? 1.0 / div : 0.0;
        gw[s] = counted ? g / div : 0.0;
        Vs[s] = (int)V;
    }
}

static __device__ __forceinline__ double lv_grad_factor(const float* grad_loss, float grad_scale) {
    return (double)grad_scale * (grad_loss ? (double)grad_loss[0] : 1.0);
}

/* one thread per set: the segment table, G and base from the scan */
static __global__ void lv_segments(const int* scan, int64_t nsets, int64_t C, int64_t L, int all, int per_image,
                                   int64_t N, const float* grad_loss, float grad_scale, int* G, int* base, int* Vs,
                                   double* lw, double* gw) {
    const int64_t set = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (set >= nsets) return;
    for (int64_t c = 0; c < C; c++) {
        const int64_t s = set * C + c, p0 = s * L;
        const int b = p0 > 0 ? scan[p0 - 1] : 0;
        G[s] = scan[p0 + L - 1] - b;
        base[s] = b;
    }
    lv_set_weights(set, C, all, per_image, N, lv_grad_factor(grad_loss, grad_scale), G, Vs, lw, gw);
}

static __device__ __forceinline__ double lv_block_sum(double v, double* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) sh[w] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) t += sh[k];
    return t;
}

/* D_k of a segment with Gs fg pixels at rank k = r + 1 with A fg up to and including it: Berman's
 * J_k - J_{k-1} in closed form (lv_jaccard, lv_jaccard2: the same operations, so the same bits) */
static __device__ __forceinline__ double lv_dk(int fg, u32 r, double Gs, double A) {
    const double B = (double)(r + 1) - A;   /* bg up to k */
    if (fg) return 1.0 / (Gs + B);
    if (r == 0) return 1.0 / (Gs + 1.0);
    return (Gs - A) / ((Gs + B) * (Gs + B - 1.0));
}
/* lv_dk with one division (lv_jaccard2's H path): the operands selected first, so the same operations on the
 * same values (at r = 0 a bg item has A = 0, B = 1: Gs + B is the Gs + 1.0 above), bit for bit, without three
 * division sequences behind branches in each of the pass's unrolled items */
static __device__ __forceinline__ double lv_dk1(int fg, u32 r, double Gs, double A) {
    const double B = (double)(r + 1) - A;
    const double GB = Gs + B;
    const bool bg2 = !fg && r != 0;
    return (bg2 ? Gs - A : 1.0) / (bg2 ? GB * (GB - 1.0) : GB);
}

/* the gradient gv of (segment s, pixel j of its set): to dinput (probabilities) or to gp [C][P] fp32
 * (logits); 32-bit index arithmetic, every index < E < 2^31 */
template <typename T>
static __device__ __forceinline__ void lv_store_grad(const LvArgs& a, float* gp, u32 s, u32 j, float gv) {
    const u32 C32 = (u32)a.C, d32 = (u32)a.d;
    const u32 set = s / C32, c = s - set * C32;
    const u32 i = a.per_image ? set * d32 + j : j;
    if (a.from_logits) {
        gp[(size_t)c * (u32)a.P + i] = gv;
    } else {
        const u32 n = i / d32, kk = i - n * d32;
        ((T*)a.dx)[(int64_t)n * a.ld + (int64_t)c * d32 + kk] = from_float<T>(gv);
    }
}

template <typename T, bool K32, bool PK = false>
static __global__ void __launch_bounds__(LV_THREADS, K32 ? 8 : 0) lv_jaccard(LvArgs a, const u64* keys, const u32* vals,
                                                                 const int* scan, const int* G, const int* base,
                                                                 const int* Vs, const double* lw, const double* gw,
                                                                 float* gp, double* part, int jb) {
    __shared__ double sh[LV_THREADS / 32];
    double acc = 0.0;
    const u32 E = (u32)a.E, L = (u32)a.L;   /* all < 2^31 */
    for (u32 pos = blockIdx.x * LV_THREADS + threadIdx.x; pos < E; pos += gridDim.x * LV_THREADS) {
        const u32 s = pos / L, r = pos - s * L;
        if ((int)r >= Vs[s]) continue;   /* an ignored pixel (sorted last) */
        /* K32: keys holds the 32-bit error keys (sorted), vals the packed (s, j, fg); their reads
         * (and the scan's) evict-first, so that the streamed 12 bytes a position do not push the
         * segment's scattered gradient lines out of L2 before all their elements are written */
        u64 key;
        u32 v0;
        if constexpr (PK) {   /* the packed word (SORT=3): kq and the value back */
            u32 kq;
            lv_unpack(__ldcs(keys + pos), jb, kq, v0);
            key = kq;
        } else {
            key = K32 ? (u64)__ldcs((const u32*)keys + pos) : keys[pos];
            v0 = K32 ? __ldcs(vals + pos) : vals[pos];
        }
        const u32 v = K32 ? (((v0 >> 1) & ((1u << jb) - 1u)) << 1) | (v0 & 1u) : v0;
        const int fg = (int)(v & 1u);
        const double A = (double)((K32 ? __ldcs(scan + pos) : scan[pos]) - base[s]);   /* fg up to and including k */
        const double D = lv_dk(fg, r, (double)G[s], A);
        const float e = __uint_as_float(0x7FFFFFFFu - (u32)(key & 0xFFFFFFFFull));
        acc += lw[s] * (double)e * D;
        if (a.fused) lv_store_grad<T>(a, gp, s, v >> 1, (float)(gw[s] * D * (fg ? -1.0 : 1.0)));
    }
    const double t = lv_block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = t;
}

/* ---------------------------------------------------------------------------------------- */
/* the v2 Jaccard pass (FUSEDLOSS_LOVASZ_JAC=2; 32-bit sort path only)                        */
/*                                                                                            */
/* The default pass reads a CUB scan of the fg bits (one more kernel: 54 us and 80 MB written  */
/* and read back at 4 x 19 x 512 x 512) and scatters 4-byte gradients to random pixels of each */
/* 4 MB segment (s16: ~0.33 of its 0.41 ms, not explained). v2: lv_count counts G_s, so       */
/* lv_prep makes the segment table (base = exclusive prefix of G) before the sort ends; then   */
/* lv_jaccard2 takes tiles of LV_TILE sorted positions in order and scans the fg bits itself   */
/* (a block scan + CUB's decoupled look-back over the tiles: A = prefix - base[s], exactly the */
/* default's count), computes D_k with the default's operations (the same gradient bit for     */
/* bit; the loss sums per tile, so its rounding may differ) and, with buckets, does not        */
/* scatter: each tile counting-sorts its gradients in shared memory by bucket (segment, pixel  */
/* >> bits) and appends each bucket's run after an atomic on the bucket's cursor; lv_flush     */
/* then takes one bucket a block, places its (pixel, gradient) pairs in a shared-memory window */
/* and writes the window out in pixel order (coalesced). The order inside a bucket depends on  */
/* the atomics, but every pixel has one entry, so the output does not.                         */

typedef struct {
    int bits;        /* bucket width 2^bits pixels; 0: no buckets (direct stores) */
    u32 nb;          /* buckets a segment: ceil(L / 2^bits) */
    float* gv;       /* [E]: bucket (s, b)'s entries at s L + b 2^bits, in cursor order */
    u16* jl;         /* [E]: their pixel within the bucket */
    int* cur;        /* [S nb] entries appended (zeroed by lv_prep) */
} LvBkt;

/* every tile's look-back status, the bucket cursors and (block 0) the segment table from G */
static __global__ void __launch_bounds__(LV_THREADS) lv_prep(LvTileState ts, int ntiles, int* cur, int64_t ncur,
                                                             const int* G, int64_t nsets, int64_t C, int all,
                                                             int per_image, int64_t N, const float* grad_loss,
                                                             float grad_scale, int* base, int* Vs, double* lw,
                                                             double* gw) {
    ts.InitializeStatus(ntiles);
    for (int64_t k = (int64_t)blockIdx.x * LV_THREADS + threadIdx.x; k < ncur; k += (int64_t)gridDim.x * LV_THREADS)
        cur[k] = 0;
    if (blockIdx.x != 0) return;
    typedef cub::BlockScan<int, LV_THREADS> BS;
    __shared__ typename BS::TempStorage tmp;
    const int64_t S = nsets * C;
    int run = 0;
    for (int64_t c0 = 0; c0 < S; c0 += LV_THREADS) {
        const int64_t s = c0 + threadIdx.x;
        int ex = 0, agg = 0;
        BS(tmp).ExclusiveSum(s < S ? G[s] : 0, ex, agg);
        if (s < S) base[s] = run + ex;
        run += agg;
        __syncthreads();
    }
    const double g = lv_grad_factor(grad_loss, grad_scale);
    for (int64_t set = threadIdx.x; set < nsets; set += LV_THREADS)
        lv_set_weights(set, C, all, per_image, N, g, G, Vs, lw, gw);
}

/* SG (the default for buckets since s23; FUSEDLOSS_LOVASZ_JAC2_SG=0: registers; buckets only): each item's
 * gradient and pixel-in-bucket go to st_gv / st_jl at [i][thread] (the staging arrays, before the runs' offsets are known) instead of 16 + 16
 * registers a thread; after the offsets each thread reads its own items back and, past the barrier that
 * already separates the offsets from the staging, writes them to their runs. Why: the default keeps kk, vv,
 * gvr and lbr (64 registers) live together, 80 registers a thread = 3 blocks an SM, and ncu found the pass
 * latency-bound at 28% of DRAM (s21 run 3: 226 us for a ~93 us floor); SG aims at <= 64 (4 blocks).
 * Measured (H100 s23 run 1): 64 registers, the kernel 227.5 / 227.8 -> 214.4 / 216.0 us alternated, bench_lovasz
 * probas 8.7 -> 8.9x rows, logits 7.9 -> 8.1x; tests 7118/0 with buckets everywhere, memcheck and racecheck 0. */
/* H (SG kernels; s31, the default since s32; FUSEDLOSS_LOVASZ_JAC2_HOIST=0: the s23 kernels): a thread whose LV_ITEMS positions lie in one segment and
 * before E (all but the threads that straddle a segment boundary or the end) reads the segment's V, G, base and
 * weights once instead of at every item, knows every position valid, and forms D with one division (lv_dk1):
 * the same operations on the same values, bit for bit. Why (s31's reading): the item loop is ~160 SASS
 * instructions an item with 5 dependent global loads and three branchy double divisions, and ncu (s21) found the
 * pass latency-bound at 28% of DRAM. sm_90: ~84 instructions an item at 76 registers (3 blocks an SM, no
 * spills); H 0 the s23 kernel (SASS identical). Measured (H100 s32 run 1, profile_lovasz 4x19x512x512 fp32,
 * alternated): lv_jaccard2 216.3 / 215.6 -> 207.5 us, lv_flush 106 -> 98 us, the step's kernels 1.335 -> 1.322 ms:
 * ~1%, far less than the instruction count promised (so the pass is not issue-bound after all). Bounded to 4
 * blocks an SM (64 registers, 84 bytes of spills; s31's H 1) it was slower than H 0: 223-225 us, removed. */
template <typename T, bool BKT, bool SG, bool ONE>
static __device__ __forceinline__ void lv_j2_items(const LvArgs& a, const u32 (&kk)[LV_ITEMS], const u32 (&vv)[LV_ITEMS],
                                                   u32 p0, u32 E, u32 L, u32 s_lo, int jb, const LvBkt& bk,
                                                   const int* G, const int* base, const int* Vs, const double* lw,
                                                   const double* gw, float* gp, int& run, double& acc,
                                                   float (&gvr)[BKT && !SG ? LV_ITEMS : 1],
                                                   u32 (&lbr)[BKT ? LV_ITEMS : 1], float* st_gv, u16* st_jl,
                                                   int* b_cnt) {
    u32 s = p0 / L, r = p0 - s * L;
    int nv = 0;   /* ONE: items i < nv are valid (r0 + i < V) */
    double hG = 0.0, hlw = 0.0, hgw = 0.0;
    if constexpr (ONE) {
        nv = Vs[s] - (int)r; run -= base[s]; hG = (double)G[s]; hlw = lw[s]; hgw = gw[s];   /* run: A from here */
    }
#pragma unroll
    for (int i = 0; i < LV_ITEMS; i++) {
        if (BKT) lbr[i] = 0xFFFFFFFFu;
        const u32 pos = p0 + i;
        const int fg = (int)(vv[i] & 1u);
        run += fg;   /* inclusive: fg bits up to and including pos */
        if (ONE ? i < nv : (pos < E && (int)r < Vs[s])) {   /* else past the end, or an ignored pixel (sorted last) */
            /* A: fg up to and including k */
            const double D = ONE ? lv_dk1(fg, r, hG, (double)run) : lv_dk(fg, r, (double)G[s], (double)(run - base[s]));
            const float e = __uint_as_float(0x7FFFFFFFu - kk[i]);
            acc += (ONE ? hlw : lw[s]) * (double)e * D;
            if (a.fused) {
                const float gv = (float)((ONE ? hgw : gw[s]) * D * (fg ? -1.0 : 1.0));
                const u32 j = (vv[i] >> 1) & ((1u << jb) - 1u);
                if (BKT) {
                    const u32 lb = (s - s_lo) * bk.nb + (j >> bk.bits);
                    if constexpr (SG) {   /* [i][thread]: conflict-free; read back by this thread only */
                        st_gv[i * LV_THREADS + threadIdx.x] = gv;
                        st_jl[i * LV_THREADS + threadIdx.x] = (u16)(j & ((1u << bk.bits) - 1u));
                    } else {
                        gvr[i] = gv;
                    }
                    lbr[i] = (lb << 16) | (u32)atomicAdd(&b_cnt[lb], 1);
                } else {
                    lv_store_grad<T>(a, gp, s, j, gv);
                }
            }
        }
        if (++r == L) {
            r = 0;
            s++;
        }
    }
}

template <typename T, bool BKT, bool PK = false, bool SG = false, bool H = false>
static __global__ void __launch_bounds__(LV_THREADS, SG ? (H ? 3 : 4) : 0) lv_jaccard2(LvArgs a, const u32* keys, const u32* vals,
                                                                 LvTileState ts, const int* G, const int* base,
                                                                 const int* Vs, const double* lw, const double* gw,
                                                                 float* gp, double* part, int jb, LvBkt bk) {
    typedef cub::BlockScan<int, LV_THREADS> BS;
    typedef cub::TilePrefixCallbackOp<int, ::cuda::std::plus<int>, LvTileState> TP;
    __shared__ typename BS::TempStorage sc;
    __shared__ typename TP::TempStorage tp;
    __shared__ double sh[LV_THREADS / 32];
    /* BKT: per local bucket the count, the run's offset in the staging arrays and its global start */
    __shared__ int b_cnt[BKT ? LV_LB_MAX : 1], b_off[BKT ? LV_LB_MAX : 1], b_dst[BKT ? LV_LB_MAX : 1];
    __shared__ float st_gv[BKT ? LV_TILE : 1];
    __shared__ u16 st_jl[BKT ? LV_TILE : 1], st_lb[BKT ? LV_TILE : 1];
    const u32 E = (u32)a.E, L = (u32)a.L;   /* all < 2^31 */
    const int tile = (int)blockIdx.x;
    const u32 t0 = (u32)tile * LV_TILE, p0 = t0 + threadIdx.x * LV_ITEMS;
    const u32 s_lo = t0 / L;
    const u32 s_hi = ((t0 + LV_TILE - 1 < E ? t0 + LV_TILE - 1 : E - 1)) / L;
    const u32 R = BKT ? (s_hi - s_lo + 1) * bk.nb : 0;   /* local buckets of this tile (host: <= LV_LB_MAX) */
    if constexpr (BKT)
        if (a.fused)
            for (u32 k = threadIdx.x; k < R; k += LV_THREADS) b_cnt[k] = 0;

    /* this thread's LV_ITEMS consecutive positions (evict-first: read once) */
    u32 kk[LV_ITEMS], vv[LV_ITEMS];
    if constexpr (PK) {   /* SORT=3: keys holds the packed words (vals unused) */
        const u64* w = (const u64*)keys;
        if (t0 + LV_TILE <= E) {
#pragma unroll
            for (int q = 0; q < LV_ITEMS / 2; q++) {
                const ulonglong2 w2 = __ldcs((const ulonglong2*)(w + p0) + q);
                lv_unpack(w2.x, jb, kk[2 * q], vv[2 * q]);
                lv_unpack(w2.y, jb, kk[2 * q + 1], vv[2 * q + 1]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < LV_ITEMS; i++) {
                if (p0 + i < E) {
                    lv_unpack(__ldcs(w + p0 + i), jb, kk[i], vv[i]);
                } else {
                    kk[i] = 0xFFFFFFFFu;
                    vv[i] = 0u;
                }
            }
        }
    } else if (t0 + LV_TILE <= E) {
#pragma unroll
        for (int q = 0; q < LV_ITEMS / 4; q++) {
            const uint4 k4 = __ldcs((const uint4*)(keys + p0) + q), v4 = __ldcs((const uint4*)(vals + p0) + q);
            kk[4 * q] = k4.x; kk[4 * q + 1] = k4.y; kk[4 * q + 2] = k4.z; kk[4 * q + 3] = k4.w;
            vv[4 * q] = v4.x; vv[4 * q + 1] = v4.y; vv[4 * q + 2] = v4.z; vv[4 * q + 3] = v4.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < LV_ITEMS; i++) {
            kk[i] = p0 + i < E ? __ldcs(keys + p0 + i) : 0xFFFFFFFFu;
            vv[i] = p0 + i < E ? __ldcs(vals + p0 + i) : 0u;   /* fg 0: adds nothing to the scan */
        }
    }
    /* the exclusive fg count before this thread's first position, over all E (the default's scan) */
    int cnt = 0;
#pragma unroll
    for (int i = 0; i < LV_ITEMS; i++) cnt += (int)(vv[i] & 1u);
    int run = 0;
    if (tile == 0) {
        int agg = 0;
        BS(sc).ExclusiveSum(cnt, run, agg);
        if (threadIdx.x == 0) ts.SetInclusive(0, agg);
    } else {
        TP pre(ts, tp, ::cuda::std::plus<int>{}, tile);
        BS(sc).ExclusiveSum(cnt, run, pre);
    }
    if (BKT && a.fused) __syncthreads();   /* b_cnt zeroed before the counting below */

    double acc = 0.0;
    float gvr[BKT && !SG ? LV_ITEMS : 1];
    u32 lbr[BKT ? LV_ITEMS : 1];   /* (local bucket << 16) | rank in it, 0xFFFFFFFF: no entry */
    if (H && p0 + LV_ITEMS <= E && (p0 + LV_ITEMS - 1) / L == p0 / L)
        lv_j2_items<T, BKT, SG, true>(a, kk, vv, p0, E, L, s_lo, jb, bk, G, base, Vs, lw, gw, gp, run, acc, gvr, lbr,
                                      st_gv, st_jl, b_cnt);
    else
        lv_j2_items<T, BKT, SG, false>(a, kk, vv, p0, E, L, s_lo, jb, bk, G, base, Vs, lw, gw, gp, run, acc, gvr, lbr,
                                       st_gv, st_jl, b_cnt);
    if constexpr (BKT) if (a.fused) {
        __syncthreads();   /* every count in */
        /* runs' offsets in the staging arrays (exclusive scan of the counts, 2 buckets a thread) and
         * each run's global start: one atomic on the bucket's cursor */
        const u32 q0 = 2 * threadIdx.x, q1 = q0 + 1;
        const int c0 = q0 < R ? b_cnt[q0] : 0, c1 = q1 < R ? b_cnt[q1] : 0;
        int off = 0, total = 0;
        BS(sc).ExclusiveSum(c0 + c1, off, total);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u32 q = h ? q1 : q0;
            const int c = h ? c1 : c0, o = h ? off + c0 : off;
            if (q < R && c > 0) {
                const u32 sq = s_lo + q / bk.nb, bq = q - (q / bk.nb) * bk.nb;
                const int got = atomicAdd(bk.cur + (size_t)sq * bk.nb + bq, c);
                b_off[q] = o;
                b_dst[q] = (int)(sq * L + (bq << bk.bits)) + got - o;   /* + staging index = destination */
            }
        }
        /* SG: this thread's own items back from [i][thread] (its own writes: no barrier needed); the barrier
         * below orders every such read before any write to the runs */
        float gq[SG ? LV_ITEMS : 1];
        u16 jq[SG ? LV_ITEMS : 1];
        if constexpr (SG) {
#pragma unroll
            for (int i = 0; i < LV_ITEMS; i++) {
                if (lbr[i] == 0xFFFFFFFFu) continue;
                gq[i] = st_gv[i * LV_THREADS + threadIdx.x];
                jq[i] = st_jl[i * LV_THREADS + threadIdx.x];
            }
        }
        __syncthreads();
        const u32 jm = (1u << jb) - 1u, wm = (1u << bk.bits) - 1u;
#pragma unroll
        for (int i = 0; i < LV_ITEMS; i++) {
            if (lbr[i] == 0xFFFFFFFFu) continue;
            const u32 lb = lbr[i] >> 16;
            const int at = b_off[lb] + (int)(lbr[i] & 0xFFFFu);
            if constexpr (SG) {
                st_gv[at] = gq[i];
                st_jl[at] = jq[i];
            } else {
                st_gv[at] = gvr[i];
                st_jl[at] = (u16)(((vv[i] >> 1) & jm) & wm);
            }
            st_lb[at] = (u16)lb;
        }
        __syncthreads();
        /* consecutive staged entries of a bucket go to consecutive addresses: coalesced runs */
        for (int k = threadIdx.x; k < total; k += LV_THREADS) {
            const int dst = b_dst[st_lb[k]] + k;
            bk.gv[dst] = st_gv[k];
            bk.jl[dst] = st_jl[k];
        }
    }
    const double t = lv_block_sum(acc, sh);
    if (threadIdx.x == 0) part[tile] = t;
}

/* one block a bucket (s, b): its entries into a shared-memory window of 2^bits pixels, then the
 * window out in pixel order (only the pixels with an entry: ignored pixels keep lv_keys' value) */
/* BL (the default since s23; FUSEDLOSS_LOVASZ_FLUSH_BATCH=0: one entry at a time): the entries' loads LV_FB a
 * thread at a time, all issued before their shared-memory stores and mask atomics. Why: the one-at-a-time loop
 * waits for each entry's two loads in turn (~32 entries a thread in an 8192-pixel bucket, each a global-memory
 * latency), which matches ncu's 47.7% of DRAM (s21 run 3: 124 us for a ~67 us floor). The same entries land in
 * the same window slots, so the output is bit for bit the same. H100 s23 run 3, alternated twice: 120.6 / 120.7
 * -> 107.5 / 107.9 us; tests 7158/0 (bitwise A/B row), memcheck 0. */
#define LV_FB 8
/* H (with lv_jaccard2's, FUSEDLOSS_LOVASZ_JAC2_HOIST, default 1 since s32): the window's destination formed once (its set
 * and class, and its image when the window lies in one) instead of two integer divisions a pixel in
 * lv_store_grad (~50 sm_90 instructions a pixel in the write-out loop); the same values to the same places. */
template <typename T, bool BL = false, bool H = false>
static __global__ void __launch_bounds__(LV_THREADS) lv_flush(LvArgs a, LvBkt bk, float* gp) {
    __shared__ float win[1 << LV_BB_MAX];
    __shared__ u32 msk[(1 << LV_BB_MAX) / 32];
    const u32 L = (u32)a.L;
    const u32 gb = blockIdx.x, s = gb / bk.nb, b = gb - s * bk.nb;
    const u32 lo = b << bk.bits, W = 1u << bk.bits;
    const u32 npx = L - lo < W ? L - lo : W;
    for (u32 k = threadIdx.x; k < (npx + 31) / 32; k += LV_THREADS) msk[k] = 0;
    __syncthreads();
    const u32 reg = s * L + lo;
    const int n = bk.cur[gb];
    if constexpr (BL) {
        for (int e0 = threadIdx.x; e0 < n; e0 += LV_FB * LV_THREADS) {
            u32 q[LV_FB];
            float g[LV_FB];
#pragma unroll
            for (int u = 0; u < LV_FB; u++) {
                const int e = e0 + u * LV_THREADS;
                q[u] = e < n ? (u32)bk.jl[reg + e] : 0u;
                g[u] = e < n ? __ldcs(bk.gv + reg + e) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < LV_FB; u++) {
                if (e0 + u * LV_THREADS < n) {
                    win[q[u]] = g[u];
                    atomicOr(&msk[q[u] >> 5], 1u << (q[u] & 31));
                }
            }
        }
    } else {
        for (int e = threadIdx.x; e < n; e += LV_THREADS) {
            const u32 q = bk.jl[reg + e];
            win[q] = __ldcs(bk.gv + reg + e);
            atomicOr(&msk[q >> 5], 1u << (q & 31));
        }
    }
    __syncthreads();
    if constexpr (H) {
        const u32 C32 = (u32)a.C, d32 = (u32)a.d;
        const u32 set = s / C32, c = s - set * C32;
        const u32 i0 = a.per_image ? set * d32 + lo : lo;   /* the window's first pixel (lv_store_grad's i) */
        if (a.from_logits) {
            float* dst = gp + (size_t)c * (u32)a.P + i0;
            for (u32 q = threadIdx.x; q < npx; q += LV_THREADS)
                if ((msk[q >> 5] >> (q & 31)) & 1u) dst[q] = win[q];
            return;
        }
        const u32 n0 = i0 / d32, k0 = i0 - n0 * d32;
        if (k0 + npx <= d32) {   /* one image: consecutive pixels at consecutive addresses */
            T* dst = (T*)a.dx + (int64_t)n0 * a.ld + (int64_t)c * d32 + k0;
            for (u32 q = threadIdx.x; q < npx; q += LV_THREADS)
                if ((msk[q >> 5] >> (q & 31)) & 1u) dst[q] = from_float<T>(win[q]);
            return;
        }
    }
    for (u32 q = threadIdx.x; q < npx; q += LV_THREADS)
        if ((msk[q >> 5] >> (q & 31)) & 1u) lv_store_grad<T>(a, gp, s, lo + q, win[q]);
}

static __global__ void lv_final(const double* part, int nparts, const int* bad, float* loss) {
    __shared__ double sh[LV_THREADS / 32];
    double acc = 0.0;
    /* the same additions in the same order (k = tid, tid + blockDim, ...), 8 loads in flight before them
     * (H100 s33 run 3, 4x19x512x512, 4880 partials: 9.2 -> 4.0 us; each load had waited for the last add) */
    for (int k0 = threadIdx.x; k0 < nparts; k0 += 8 * (int)blockDim.x) {
        double v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int k = k0 + u * (int)blockDim.x;
            v[u] = k < nparts ? part[k] : 0.0;
        }
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (k0 + u * (int)blockDim.x < nparts) acc += v[u];
    }
    const double t = lv_block_sum(acc, sh);
    if (threadIdx.x == 0) loss[0] = *bad ? NAN : (float)t;
}

/* PROB (FUSEDLOSS_LOVASZ_PC=1, probabilities with small d such as the P x C layout [P, C]): the
 * gradient w.r.t. the probabilities is gp itself, copied per pixel into dinput; ignored and
 * out-of-range pixels keep lv_keys' 0 / NaN */
template <typename T, bool PROB = false>
static __global__ void __launch_bounds__(LV_THREADS) lv_softmax_bwd(LvArgs a, const float* gp) {
    const T* x = (const T*)a.x;
    T* dx = (T*)a.dx;
    for (int64_t i = (int64_t)blockIdx.x * LV_THREADS + threadIdx.x; i < a.P; i += (int64_t)gridDim.x * LV_THREADS) {
        const int64_t y = lv_label(a.labels, a.lab64, i);
        const int bad = y != a.ign && (y < 0 || y >= a.C);
        const int64_t n = i / a.d, k = i - n * a.d;
        const int64_t e0 = n * a.ld + k;
        if constexpr (PROB) {
            if (y == a.ign || bad) continue;
            for (int64_t c = 0; c < a.C; c++) dx[e0 + c * a.d] = from_float<T>(gp[c * a.P + i]);
            continue;
        }
        if (y == a.ign || bad) {
            for (int64_t c = 0; c < a.C; c++) dx[e0 + c * a.d] = from_float<T>(bad ? NAN : 0.0f);
            continue;
        }
        const float lse = a.lse[i];
        float s = 0.0f;
        if (a.C <= LV_REG_C) {   /* p and gp once, kept in registers */
            float pr[LV_REG_C], gr[LV_REG_C];
#pragma unroll
            for (int c = 0; c < LV_REG_C; c++) {
                if (c < a.C) {
                    pr[c] = expf(to_float(x[e0 + (int64_t)c * a.d]) - lse);
                    gr[c] = gp[(int64_t)c * a.P + i];
                    s += pr[c] * gr[c];
                }
            }
#pragma unroll
            for (int c = 0; c < LV_REG_C; c++)
                if (c < a.C) dx[e0 + (int64_t)c * a.d] = from_float<T>(pr[c] * (gr[c] - s));
            continue;
        }
        for (int64_t c = 0; c < a.C; c++) s += expf(to_float(x[e0 + c * a.d]) - lse) * gp[c * a.P + i];
        for (int64_t c = 0; c < a.C; c++) {
            const float p = expf(to_float(x[e0 + c * a.d]) - lse);
            dx[e0 + c * a.d] = from_float<T>(p * (gp[c * a.P + i] - s));
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* SORT=3's sort: CUB's onesweep radix sort of the packed 64-bit keys alone, with R-bit digits    */
/*                                                                                            */
/* CUB's own tuning takes 8-bit digits; 4 x 19 x 512 x 512 sorts 31 + 5 = 36 bits, 5 passes of 8 */
/* or 4 of 9. Every pass moves 8 bytes an element either way (the 32-bit path's pass A and B:   */
/* 4 + 1 passes of 4 + 4 bytes, and a histogram pass for each sort), so one pass fewer is ~1/5  */
/* of the sort's memory traffic if a 9-bit pass costs what an 8-bit one does. Measured (H100 s20  */
/* run 1, 4x19x512x512): it does not: 8-bit 5 x 154 us (as the 32-bit pairs' 5 x 152), 9-bit    */
/* 4 x 201 us, 10-bit (256 x 24) 4 x 335 us. So SORT=3 stays off.                                */
/* LvHub<R>: the sm_90 keys-only 64-bit onesweep shape of CUB's tuning (384 threads x 30 keys)   */
/* for R <= 9 (ptxas, sm_90: R = 9 takes 71 registers and 47 KB of shared memory), 256 x 24 for  */
/* R = 10 (the 384 x 30 tile needs 59 KB of static shared memory at 10 bits). The other members */
/* only make the policy complete: DispatchRadixSort runs onesweep when ONESWEEP is set.          */
template <int R>
struct LvHub {
    struct Policy : cub::ChainedPolicy<800, Policy, Policy> {
        static constexpr bool ONESWEEP = true;
        static constexpr int ONESWEEP_RADIX_BITS = R;
        using HistogramPolicy = cub::AgentRadixSortHistogramPolicy<128, 16, 1, u64, R>;
        using ExclusiveSumPolicy = cub::AgentRadixSortExclusiveSumPolicy<256, R>;
        using OnesweepPolicy = cub::AgentRadixSortOnesweepPolicy<(R >= 10 ? 256 : 384), (R >= 10 ? 24 : 30), u64, 1,
                                                                 cub::RADIX_RANK_MATCH_EARLY_COUNTS_ANY,
                                                                 cub::BLOCK_SCAN_RAKING_MEMOIZE,
                                                                 cub::RADIX_SORT_STORE_DIRECT, R>;
        using ScanPolicy = cub::AgentScanPolicy<512, 23, int, cub::BLOCK_LOAD_WARP_TRANSPOSE, cub::LOAD_DEFAULT,
                                                cub::BLOCK_STORE_WARP_TRANSPOSE, cub::BLOCK_SCAN_RAKING_MEMOIZE>;
        using DownsweepPolicy = cub::AgentRadixSortDownsweepPolicy<512, 23, u64, cub::BLOCK_LOAD_TRANSPOSE,
                                                                   cub::LOAD_DEFAULT, cub::RADIX_RANK_MATCH,
                                                                   cub::BLOCK_SCAN_WARP_SCANS, 7>;
        using AltDownsweepPolicy = cub::AgentRadixSortDownsweepPolicy<256, 47, u64, cub::BLOCK_LOAD_TRANSPOSE,
                                                                      cub::LOAD_DEFAULT, cub::RADIX_RANK_MEMOIZE,
                                                                      cub::BLOCK_SCAN_WARP_SCANS, 6>;
        using UpsweepPolicy = cub::AgentRadixSortUpsweepPolicy<256, 23, u64, cub::LOAD_DEFAULT, 7>;
        using AltUpsweepPolicy = cub::AgentRadixSortUpsweepPolicy<256, 47, u64, cub::LOAD_DEFAULT, 6>;
        using SingleTilePolicy = cub::AgentRadixSortDownsweepPolicy<256, 19, u64, cub::BLOCK_LOAD_DIRECT, cub::LOAD_LDG,
                                                                    cub::RADIX_RANK_MEMOIZE,
                                                                    cub::BLOCK_SCAN_WARP_SCANS, 6>;
        using SegmentedPolicy = cub::AgentRadixSortDownsweepPolicy<192, 39, u64, cub::BLOCK_LOAD_TRANSPOSE,
                                                                   cub::LOAD_DEFAULT, cub::RADIX_RANK_MEMOIZE,
                                                                   cub::BLOCK_SCAN_WARP_SCANS, 6>;
        using AltSegmentedPolicy = cub::AgentRadixSortDownsweepPolicy<384, 11, u64, cub::BLOCK_LOAD_TRANSPOSE,
                                                                      cub::LOAD_DEFAULT, cub::RADIX_RANK_MEMOIZE,
                                                                      cub::BLOCK_SCAN_WARP_SCANS, 5>;
    };
    using MaxPolicy = Policy;
};

#define LV_RADIX_MIN 8
#define LV_RADIX_MAX 10

template <int R>
static cudaError_t lv_sort_packed_r(void* temp, size_t& tb, cub::DoubleBuffer<u64>& k, int n, int b0, int b1,
                                    cudaStream_t s) {
    cub::DoubleBuffer<cub::NullType> v;
    return cub::DispatchRadixSort<cub::SortOrder::Ascending, u64, cub::NullType, int,
                                  cub::detail::identity_decomposer_t, LvHub<R>>::Dispatch(temp, tb, k, v, n, b0, b1,
                                                                                          true, s);
}
/* the packed keys sorted by bits [b0, b1) with R-bit digits (R in [LV_RADIX_MIN, LV_RADIX_MAX]);
 * temp == nullptr: the scratch size into tb. Stable, as every LSD radix sort. */
static cudaError_t lv_sort_packed(int R, void* temp, size_t& tb, cub::DoubleBuffer<u64>& k, int n, int b0, int b1,
                                  cudaStream_t s) {
    switch (R) {
        case 8: return lv_sort_packed_r<8>(temp, tb, k, n, b0, b1, s);
        case 9: return lv_sort_packed_r<9>(temp, tb, k, n, b0, b1, s);
        default: return lv_sort_packed_r<10>(temp, tb, k, n, b0, b1, s);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* FUSEDLOSS_LOVASZ_SEGSORT (s33, the default): the 32-bit path's sort without pass B            */
/*                                                                                            */
/* The 8-byte-pair path sorts all E error keys as one array (pass A, 4 onesweep passes) and then */
/* stably by segment (pass B: one more onesweep pass, a histogram kernel, two memsets): H100 s33  */
/* run 1, 4x19x512x512, pass B is ~151 us of onesweep + ~42 us of histogram + ~6 us of small ops  */
/* of the 1.327 ms of kernels. But the keys are laid out segment by segment already (position    */
/* s L + j), so each segment can be sorted on its own by its 32 error-key bits: the same order    */
/* (an LSD radix sort is stable and the input is in increasing j), with no segment pass at all.   */
/* Here that is one onesweep sort a segment, all segments in the same four launches: CUB's       */
/* onesweep and histogram agents (the library's own ranking, look-back and scatter) under thin    */
/* kernels that give each block its segment's pointers: keys + s L, the segment's digit offsets   */
/* (s L + the exclusive sum of its histogram), its own tile counter and look-back rows. A block's */
/* tile within its segment comes from the agent's atomic counter, so the look-back only waits on  */
/* blocks that already run (the forward-progress argument of CUB's own kernel). The look-back    */
/* rows alternate between two regions: each block of pass p zeroes one row of the region pass   */
/* p + 1 uses (pass p - 1's, finished), so one memset before the sort is all the zeroing.        */
/* The tile shape is CUB's sm_90 tuning for 4-byte keys with 4-byte values and 32-bit offsets    */
/* (384 x 23, what pass A ran on sm_90).                                                         */
#define LV_SEG_THREADS 384
#define LV_SEG_ITEMS 23
#define LV_SEG_TILE (LV_SEG_THREADS * LV_SEG_ITEMS)
#define LV_SEG_HTHREADS 128   /* the histogram agent's shape: CUB's sm_90 tuning for 4-byte keys */
#define LV_SEG_HITEMS 16
#define LV_SEG_LMAX (1 << 28) /* a segment is one onesweep portion (CUB's portion size) */
typedef cub::AgentRadixSortOnesweepPolicy<LV_SEG_THREADS, LV_SEG_ITEMS, u32, 1, cub::RADIX_RANK_MATCH_EARLY_COUNTS_ANY,
                                          cub::BLOCK_SCAN_RAKING_MEMOIZE, cub::RADIX_SORT_STORE_DIRECT, 8>
    LvSegPolicy;
typedef cub::detail::radix_sort::AgentRadixSortOnesweep<LvSegPolicy, false, u32, u32, u32, int> LvSegAgent;
/* the histogram agent with CUB's sm_90 setting for 4-byte keys (1 private copy of each bin); 4 copies
 * (s33's FUSEDLOSS_LOVASZ_SEGHIST_PARTS=4) tied on the H100 (s34 run 1: 46.8 vs 46.9-47.1 us) and were removed */
typedef cub::AgentRadixSortHistogramPolicy<LV_SEG_HTHREADS, LV_SEG_HITEMS, 1, u32, 8> LvSegHistPolicy;
typedef cub::detail::radix_sort::AgentRadixSortHistogram<LvSegHistPolicy, false, u32, u32> LvSegHistAgent;
static_assert(LvSegAgent::TILE_ITEMS == LV_SEG_TILE, "the onesweep tile the host plans with");

/* the four 8-bit digit histograms of every segment: hist[s][pass][256] (zeroed before); blockIdx.y
 * is the segment, blockIdx.x strides over its keys */
static __global__ void __launch_bounds__(LV_SEG_HTHREADS) lv_seg_hist(u32* hist, const u32* keys, int L) {
    __shared__ typename LvSegHistAgent::TempStorage ts;
    LvSegHistAgent ag(ts, hist + (size_t)blockIdx.y * 1024, keys + (int64_t)blockIdx.y * L, (u32)L, 0, 32);
    ag.Process();
}

/* bins[s][pass][b] = s L + the exclusive sum of hist[s][pass][0, b): where digit b of segment s
 * starts in the pass's output. One block of 256 a (segment, pass). */
static __global__ void __launch_bounds__(256) lv_seg_bins(const u32* hist, u32* bins, int L) {
    typedef cub::BlockScan<u32, 256> Scan;
    __shared__ typename Scan::TempStorage ts;
    const size_t i = (size_t)blockIdx.x * 256 + threadIdx.x;
    u32 ex;
    Scan(ts).ExclusiveSum(hist[i], ex);
    bins[i] = (u32)((uint64_t)(blockIdx.x >> 2) * (u32)L + ex);
}

/* one onesweep pass (bits [bit, bit + nbits), nbits = 8: an argument, as in CUB's kernel; a literal
 * 8 took ptxas to 110 registers, one block an SM) over every segment: block b works in segment
 * b / tps; lb: this pass's look-back rows ([segment][tile][256], zero), lb_zero: the next pass's
 * (block b zeroes row b) or NULL; ctr: this pass's tile counters [S] (zero); bins: this pass's
 * digit starts (bins[s * 1024 + b]); keys / values in at s L, out at the absolute starts */
static __global__ void __launch_bounds__(LV_SEG_THREADS) lv_seg_onesweep(int* lb, int* lb_zero, int* ctr,
                                                                         const u32* bins, u32* ko, const u32* ki,
                                                                         u32* vo, const u32* vi, int L, int tps,
                                                                         int bit, int nbits) {
    __shared__ typename LvSegAgent::TempStorage ts;
    /* the next pass's rows: one a block (rows s tps + t and blocks s tps + t are the same S tps) */
    if (lb_zero && threadIdx.x < 256) lb_zero[(size_t)blockIdx.x * 256 + threadIdx.x] = 0;
    const int s = (int)(blockIdx.x / (unsigned)tps);
    const int64_t so = (int64_t)s * L;
    LvSegAgent ag(ts, lb + (int64_t)s * tps * 256, ctr + s, nullptr, bins + (size_t)s * 1024, ko, ki + so, vo,
                  vi + so, L, bit, nbits);
    ag.Process();
}

/* the scratch of lv_seg_sort: hist | bins | counters | look-back region 0 | region 1 */
static size_t lv_seg_bytes(int64_t S, int64_t L, size_t* off_bins, size_t* off_ctr, size_t* off_lb0, size_t* off_lb1) {
    const int64_t tps = (L + LV_SEG_TILE - 1) / LV_SEG_TILE;
    const size_t h = ((size_t)S * 4096 + 255) & ~(size_t)255;
    const size_t c = ((size_t)S * 16 + 255) & ~(size_t)255;
    const size_t lb = ((size_t)(S * tps) * 1024 + 255) & ~(size_t)255;
    if (off_bins) {
        *off_bins = h;
        *off_ctr = 2 * h;
        *off_lb0 = 2 * h + c;
        *off_lb1 = 2 * h + c + lb;
    }
    return 2 * h + c + 2 * lb;
}

#define LV_CU_TRY(expr)                          \
    do {                                          \
        const cudaError_t lv__e_ = (expr);        \
        if (lv__e_ != cudaSuccess) return lv__e_; \
    } while (0)

/* the 32-bit pairs (k, v: E = S L each, segment s at s L) sorted by key within each segment, stably;
 * k / v flipped as CUB's DoubleBuffer (four passes: Current() ends where it began) */
static cudaError_t lv_seg_sort(char* tmp, cub::DoubleBuffer<u32>& k, cub::DoubleBuffer<u32>& v, int64_t S, int64_t L,
                               int sms, cudaStream_t stream) {
    size_t ob, oc, o0, o1;
    lv_seg_bytes(S, L, &ob, &oc, &o0, &o1);
    const int tps = (int)((L + LV_SEG_TILE - 1) / LV_SEG_TILE);
    u32* hist = (u32*)tmp;
    u32* bins = (u32*)(tmp + ob);
    int* ctr = (int*)(tmp + oc);
    int* lb[2] = {(int*)(tmp + o0), (int*)(tmp + o1)};
    LV_CU_TRY(cudaMemsetAsync(tmp, 0, o1, stream));   /* hist, bins, counters, region 0 */
    int64_t hx = ((int64_t)sms * 12 + S - 1) / S;        /* ~12 blocks an SM in all (CUB: occupancy x SMs) */
    const int64_t ht = (L + LV_SEG_HTHREADS * LV_SEG_HITEMS - 1) / (LV_SEG_HTHREADS * LV_SEG_HITEMS);
    if (hx > ht) hx = ht;
    lv_seg_hist<<<dim3((unsigned)hx, (unsigned)S), LV_SEG_HTHREADS, 0, stream>>>(hist, k.Current(), (int)L);
    LV_CU_TRY(cudaGetLastError());
    lv_seg_bins<<<(unsigned)(S * 4), 256, 0, stream>>>(hist, bins, (int)L);
    LV_CU_TRY(cudaGetLastError());
    for (int p = 0; p < 4; p++) {
        lv_seg_onesweep<<<(unsigned)(S * tps), LV_SEG_THREADS, 0, stream>>>(
            lb[p & 1], p < 3 ? lb[(p + 1) & 1] : nullptr, ctr + p * S, bins + p * 256, k.Alternate(), k.Current(),
            v.Alternate(), v.Current(), (int)L, tps, 8 * p, 8);
        LV_CU_TRY(cudaGetLastError());
        k.selector ^= 1;
        v.selector ^= 1;
    }
    return cudaSuccess;
}

/* ---------------------------------------------------------------------------------------- */
/* workspace plan                                                                             */

typedef struct {
    int64_t P, L, S, E, nsets;
    int end_bit;
    int sbits, jbits;   /* bits of S - 1 and of L - 1 (the 32-bit path needs 1 + jbits + sbits <= 32) */
    int64_t ntiles;     /* lv_jaccard2's tiles */
    size_t off_keys0, off_keys1, off_vals0, off_vals1, off_lse, off_G, off_base, off_V, off_lw, off_gw, off_part,
        off_tiles, off_cur, off_temp;
    size_t tile_bytes, temp_bytes, total;
} LvPlan;

/* where lv_seg_sort can take the sort (the 32-bit path with S > 1, segments of one onesweep portion, S within a
 * grid's y extent): lv_plan plans its scratch there and lv_run_t may take it (FUSEDLOSS_LOVASZ_SEGSORT) */
static int lv_seg_possible(const LvPlan* pl) {
    return pl->E > 0 && pl->sbits > 0 && 1 + pl->jbits + pl->sbits <= 32 && pl->L <= LV_SEG_LMAX && pl->S <= 65535;
}

/* an integer knob, read on every call (an A/B within one process) */
static int lv_env_int(const char* name, int dflt) {
    const char* e = getenv(name);
    return e && *e ? atoi(e) : dflt;
}

/* blocks of a grid-stride loop over n items: at most cap */
static unsigned lv_grid(int64_t n, int64_t cap) {
    int64_t g = (n + LV_THREADS - 1) / LV_THREADS;
    if (g > cap) g = cap;
    return (unsigned)(g < 1 ? 1 : g);
}

static size_t al256(size_t v) { return (v + 255u) & ~(size_t)255u; }

static cudaError_t lv_plan(int64_t N, int64_t C, int64_t d, int per_image, int from_logits, LvPlan* pl) {
    memset(pl, 0, sizeof *pl);
    pl->P = N * d;
    pl->nsets = per_image ? N : (N > 0 ? 1 : 0);
    pl->L = per_image ? d : pl->P;
    pl->S = pl->nsets * C;
    pl->E = pl->S * pl->L;
    int bits = 0;
    while (bits < 31 && ((int64_t)1 << bits) < pl->S) bits++;
    pl->end_bit = 32 + bits;
    pl->sbits = bits;
    int jb = 0;
    while (jb < 32 && ((int64_t)1 << jb) < pl->L) jb++;
    pl->jbits = jb;
    const size_t E = (size_t)pl->E, S = (size_t)pl->S;
    size_t o = 256;
    pl->off_G = o;     o += al256(4 * S);   /* right after the header: one memset zeroes both (v2 counts G) */
    pl->off_keys0 = o; o += al256(8 * E);
    pl->off_keys1 = o; o += al256(8 * E);
    pl->off_vals0 = o; o += al256(4 * E);
    pl->off_vals1 = o; o += al256(4 * E);
    pl->off_lse = o;   o += from_logits ? al256(4 * (size_t)pl->P) : 0;
    pl->off_base = o;  o += al256(4 * S);
    pl->off_V = o;     o += al256(4 * S);
    pl->off_lw = o;    o += al256(8 * S);
    pl->off_gw = o;    o += al256(8 * S);
    /* the v2 pass's pieces are planned whatever the knob says (the size does not depend on it) */
    pl->ntiles = (pl->E + LV_TILE - 1) / LV_TILE;
    pl->off_part = o;  o += al256(8 * (size_t)(pl->ntiles > LV_MAX_BLOCKS ? pl->ntiles : LV_MAX_BLOCKS));
    size_t tsb = 0;
    if (pl->E > 0) LvTileState::AllocationSize((int)pl->ntiles, tsb);
    pl->tile_bytes = tsb;
    pl->off_tiles = o; o += al256(tsb);
    pl->off_cur = o;   o += al256(4 * S * (size_t)((pl->L + (1 << LV_BB_MIN) - 1) >> LV_BB_MIN));
    pl->off_temp = o;
    size_t t_sort = 0, t_scan = 0;
    if (pl->E > 0) {
        cub::DoubleBuffer<u64> k((u64*)nullptr, (u64*)nullptr);
        cub::DoubleBuffer<u32> v((u32*)nullptr, (u32*)nullptr);
        cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, t_sort, k, v, (int)pl->E, 0, pl->end_bit);
        if (e != cudaSuccess) return e;
        /* the 32-bit path's two sorts (lv_run_t): the scratch covers both paths, so the workspace
         * size does not depend on FUSEDLOSS_LOVASZ_SORT */
        size_t t32 = 0;
        cub::DoubleBuffer<u32> k32((u32*)nullptr, (u32*)nullptr);
        e = cub::DeviceRadixSort::SortPairs(nullptr, t32, k32, v, (int)pl->E, 0, 32);
        if (e != cudaSuccess) return e;
        if (t32 > t_sort) t_sort = t32;
        if (pl->sbits > 0 && 1 + pl->jbits + pl->sbits <= 32) {   /* pass B (its bit range) */
            e = cub::DeviceRadixSort::SortPairs(nullptr, t32, k32, v, (int)pl->E, pl->jbits + 1,
                                                pl->jbits + 1 + pl->sbits);
            if (e != cudaSuccess) return e;
            if (t32 > t_sort) t_sort = t32;
        }
        e = cub::DeviceScan::InclusiveSum(nullptr, t_scan, LvFgIt((const u32*)nullptr, LvFg()), (int*)nullptr,
                                          (int)pl->E);
        if (e != cudaSuccess) return e;
        if (1 + pl->jbits + pl->sbits <= 32) {   /* SORT=3: the packed keys' sort (every digit width) and scan */
            for (int R = LV_RADIX_MIN; R <= LV_RADIX_MAX; R++) {
                e = lv_sort_packed(R, nullptr, t32, k, (int)pl->E, pl->jbits + 1, pl->jbits + 32 + pl->sbits,
                                   (cudaStream_t)0);
                if (e != cudaSuccess) return e;
                if (t32 > t_sort) t_sort = t32;
            }
            size_t t2 = 0;
            e = cub::DeviceScan::InclusiveSum(nullptr, t2, LvFgPkIt((const u64*)nullptr, LvFgPk()), (int*)nullptr,
                                              (int)pl->E);
            if (e != cudaSuccess) return e;
            if (t2 > t_scan) t_scan = t2;
        }
    }
    /* SEGSORT's scratch (lv_seg_sort) shares the CUB scratch's place: planned where the path is possible,
     * whatever the knob says */
    if (lv_seg_possible(pl)) {
        const size_t t_seg = lv_seg_bytes(pl->S, pl->L, NULL, NULL, NULL, NULL);
        if (t_seg > t_sort) t_sort = t_seg;
    }
    pl->temp_bytes = al256(t_sort > t_scan ? t_sort : t_scan);
    pl->total = o + pl->temp_bytes;
    return cudaSuccess;
}

/* lv_plan through a per-thread cache of the last two shapes (per device): each call plans twice (the
 * validation's size check and the run), and a plan is four CUB size queries */
static cudaError_t lv_plan_cached(int64_t N, int64_t C, int64_t d, int per_image, int from_logits, LvPlan* pl) {
    struct Entry {
        int valid, dev, per_image, from_logits;
        int64_t N, C, d;
        LvPlan pl;
    };
    static thread_local Entry cache[2];
    static thread_local int next;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return lv_plan(N, C, d, per_image, from_logits, pl);
    }
    for (int k = 0; k < 2; k++) {
        const Entry& e = cache[k];
        if (e.valid && e.dev == dev && e.N == N && e.C == C && e.d == d && e.per_image == per_image &&
            e.from_logits == from_logits) {
            *pl = e.pl;
            return cudaSuccess;
        }
    }
    const cudaError_t err = lv_plan(N, C, d, per_image, from_logits, pl);
    if (err != cudaSuccess) return err;
    Entry& e = cache[next];
    next ^= 1;
    e.valid = 1; e.dev = dev; e.per_image = per_image; e.from_logits = from_logits;
    e.N = N; e.C = C; e.d = d;
    e.pl = *pl;
    return cudaSuccess;
}

extern "C" {

/* the CUDA workspace of one call (src/internal.h); 0 when the CUB size query failed (no device) */
size_t fl__lovasz_cuda_workspace_bytes(int64_t N, int64_t C, int64_t d, int per_image, int from_logits) {
    LvPlan pl;
    if (lv_plan_cached(N, C, d, per_image, from_logits, &pl) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return pl.total;
}

}  // extern "C"

template <typename T>
static fl_status lv_run_t(const char* fn, const fl__lovasz_params* p, const LvPlan& pl, float* loss, void* dinput,
                          const void* x, const void* labels, const float* grad_loss, float grad_scale,
                          int* error_flag, void* workspace, cudaStream_t stream) {
    char* ws = (char*)workspace;
    LvArgs a;
    memset(&a, 0, sizeof a);
    a.x = x;
    a.dx = dinput;
    a.labels = labels;
    a.lab64 = p->index_dtype == FL_INDEX_I64;
    a.N = p->N; a.C = p->C; a.d = p->d; a.ld = p->ld; a.P = pl.P; a.L = pl.L; a.S = pl.S; a.E = pl.E;
    a.ign = p->ignore_index;
    a.per_image = p->per_image; a.from_logits = p->from_logits; a.fused = dinput != nullptr;
    a.all = p->classes == FL_LOVASZ_ALL;
    a.keys = (u64*)(ws + pl.off_keys0);
    a.vals = (u32*)(ws + pl.off_vals0);
    a.lse = p->from_logits ? (float*)(ws + pl.off_lse) : nullptr;
    a.bad = (int*)ws;
    a.error_flag = error_flag;
    a.grad_loss = grad_loss;
    a.grad_scale = grad_scale;

    int dev = 0, sms = 132;
    FL_CUDA_TRY(cudaGetDevice(&dev));
    FL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const int64_t cap = (int64_t)sms * 8;

    /* The sort as 8-byte pairs (default since 2026-12-05; FUSEDLOSS_LOVASZ_SORT=1: the 12-byte pairs of
     * one 64-bit-key sort), so every radix pass moves 2/3 of the bytes. H200 s16 run 2, 4x19x512x512
     * fp32 probabilities: onesweep passes 914 -> 684 us, keys 188 -> 124 us, Jaccard 438 -> 407 us,
     * the kernels 1.68 -> 1.36 ms. Pass A sorts the 32-bit error keys alone (4 passes),
     * the values packing (segment s, pixel j, fg) as (s << (jbits + 1)) | (j << 1) | fg; pass B sorts
     * those values by their segment field (bits [jbits + 1, jbits + 1 + sbits): one pass) with the
     * error keys riding along. Both sorts are stable and the input is in (s, j) order, so the result
     * is the default path's order exactly: segment, then decreasing error, then increasing pixel.
     * Needs 1 + jbits + sbits <= 32 (4 x 19 x 512 x 512: 1 + 20 + 5); else the 64-bit keys. */
    const int sort_knob = lv_env_int("FUSEDLOSS_LOVASZ_SORT", 2);
    const int k32 = (sort_knob == 2 || sort_knob == 3) && 1 + pl.jbits + pl.sbits <= 32;
    /* FUSEDLOSS_LOVASZ_SORT=3 (s20, off: slower on H100, see lv_sort_packed): the 32-bit path's key and value as one packed
     * 64-bit key, sorted alone with R-bit digits (see lv_sort_packed): the same order, so the same
     * results bit for bit */
    const int pk = k32 && sort_knob == 3;
    /* digits: FUSEDLOSS_LOVASZ_RADIX (8-10), or (unset / 0) the fewest passes that 10-bit digits allow, at
     * the narrowest digit that keeps them: 31 + sbits = 36 bits (19 classes) -> 4 x 9, 38 (per image,
     * 4 x 19 segments) -> 4 x 10, <= 32 -> 4 x 8 */
    int radix = lv_env_int("FUSEDLOSS_LOVASZ_RADIX", 0);
    if (radix <= 0) {
        const int nbits = 31 + pl.sbits, passes = (nbits + LV_RADIX_MAX - 1) / LV_RADIX_MAX;
        radix = (nbits + passes - 1) / passes;
    }
    radix = radix < LV_RADIX_MIN ? LV_RADIX_MIN : radix > LV_RADIX_MAX ? LV_RADIX_MAX : radix;
    /* FUSEDLOSS_LOVASZ_JAC=2 (32-bit path only; built in s19, the default since s20: H100 s20 run 1,
     * 4x19x512x512 fp32 probabilities, the scan + Jaccard 535 us -> Jaccard + flush 349 us; =1 the old pass):
     * G counted by lv_keys, the fg scan inside the Jaccard pass, the gradient through buckets (see
     * lv_jaccard2) */
    const int jac2 = k32 && pl.E > 0 && lv_env_int("FUSEDLOSS_LOVASZ_JAC", 2) == 2;
    int* G = (int*)(ws + pl.off_G);
    int* base = (int*)(ws + pl.off_base);
    int* Vs = (int*)(ws + pl.off_V);
    double* lw = (double*)(ws + pl.off_lw);
    double* gw = (double*)(ws + pl.off_gw);
    double* part = (double*)(ws + pl.off_part);
    FL_CUDA_TRY(cudaMemsetAsync(ws, 0, jac2 ? pl.off_G + 4 * (size_t)pl.S : 256, stream));   /* header (+ G) */
    if (jac2) {
        lv_count<<<lv_grid(pl.P, (int64_t)sms * 4), LV_THREADS, 0, stream>>>(a, G);
        FL_CUDA_TRY(cudaGetLastError());
    }
    /* FUSEDLOSS_LOVASZ_KEYS4 (default 1; 0: one pixel a thread): four pixels a thread where d, ld and x
     * allow 4-element vectors */
    const int keys4 = k32 && p->d % 4 == 0 && p->ld % 4 == 0 && (uintptr_t)x % (4 * sizeof(T)) == 0 &&
                      lv_env_int("FUSEDLOSS_LOVASZ_KEYS4", 1) != 0;
    if (keys4 && pk) {
        lv_keys4<T, true><<<lv_grid(pl.P / 4, cap), LV_THREADS, 0, stream>>>(a, pl.jbits);
    } else if (keys4 && lv_env_int("FUSEDLOSS_LOVASZ_KEYS4_MINB", 4) == 4) {   /* MB above */
        lv_keys4<T, false, 4><<<lv_grid(pl.P / 4, cap), LV_THREADS, 0, stream>>>(a, pl.jbits);
    } else if (keys4) {
        lv_keys4<T><<<lv_grid(pl.P / 4, cap), LV_THREADS, 0, stream>>>(a, pl.jbits);
    } else if (pk) {
        lv_keys<T, true, true><<<lv_grid(pl.P, cap), LV_THREADS, 0, stream>>>(a, pl.jbits);
    } else if (k32) {
        lv_keys<T, true><<<lv_grid(pl.P, cap), LV_THREADS, 0, stream>>>(a, pl.jbits);
    } else {
        lv_keys<T, false><<<lv_grid(pl.P, cap), LV_THREADS, 0, stream>>>(a, 0);
    }
    FL_CUDA_TRY(cudaGetLastError());

    cub::DoubleBuffer<u64> kb((u64*)(ws + pl.off_keys0), (u64*)(ws + pl.off_keys1));
    cub::DoubleBuffer<u32> vb((u32*)(ws + pl.off_vals0), (u32*)(ws + pl.off_vals1));
    size_t tb = pl.temp_bytes;
    const u64* keys;
    const u32* vals;
    int* scan;
    float* gp;
    float* bucket_gv = nullptr;   /* jac2: the upper half of the sorted keys' 8E-byte buffer */
    if (pk) {
        FL_CUDA_TRY(lv_sort_packed(radix, (void*)(ws + pl.off_temp), tb, kb, (int)pl.E, pl.jbits + 1,
                                   pl.jbits + 32 + pl.sbits, stream));
        keys = kb.Current();                          /* the packed words: the Jaccard passes unpack them */
        vals = nullptr;
        scan = (int*)(ws + pl.off_vals0);             /* the value buffers are free on this path */
        gp = (float*)kb.Alternate();                  /* C x P floats (4E bytes of the 8E) */
        bucket_gv = (float*)(ws + pl.off_vals1);
    } else if (k32) {
        cub::DoubleBuffer<u32> eb((u32*)(ws + pl.off_keys0), (u32*)(ws + pl.off_keys1));
        /* FUSEDLOSS_LOVASZ_SEGSORT (s33, default 1; 0: pass A + pass B): each segment sorted on its own by
         * its error keys (lv_seg_sort), for segments of >= FUSEDLOSS_LOVASZ_SEGSORT_MIN pixels (default
         * 65536): the same order as pass A + pass B, without pass B. H100 s33 run 2, 4x19x512x512 fp32
         * probabilities: kernels 1.326 -> 1.110 ms, the synchronised step 1.44 -> 1.22 ms */
        const int segsort = lv_seg_possible(&pl) && lv_env_int("FUSEDLOSS_LOVASZ_SEGSORT", 1) != 0 &&
                            pl.L >= (int64_t)lv_env_int("FUSEDLOSS_LOVASZ_SEGSORT_MIN", 65536);
        if (segsort) {
            FL_CUDA_TRY(lv_seg_sort(ws + pl.off_temp, eb, vb, pl.S, pl.L, sms, stream));
        } else {
            FL_CUDA_TRY(cub::DeviceRadixSort::SortPairs((void*)(ws + pl.off_temp), tb, eb, vb, (int)pl.E, 0, 32, stream));
        }
        if (pl.sbits > 0 && !segsort) {
            cub::DoubleBuffer<u32> pk(vb.Current(), vb.Alternate()), pe(eb.Current(), eb.Alternate());
            tb = pl.temp_bytes;
            FL_CUDA_TRY(cub::DeviceRadixSort::SortPairs((void*)(ws + pl.off_temp), tb, pk, pe, (int)pl.E,
                                                        pl.jbits + 1, pl.jbits + 1 + pl.sbits, stream));
            vb = pk;
            eb = pe;
        }
        keys = (const u64*)eb.Current();              /* the 32-bit error keys (lv_jaccard<T, true>) */
        vals = vb.Current();
        scan = (int*)vb.Alternate();
        gp = (float*)eb.Alternate();                  /* C x P floats = 4E bytes */
        bucket_gv = (float*)(eb.Current() + pl.E);
    } else {
        FL_CUDA_TRY(cub::DeviceRadixSort::SortPairs((void*)(ws + pl.off_temp), tb, kb, vb, (int)pl.E, 0, pl.end_bit,
                                                    stream));
        keys = kb.Current();
        vals = vb.Current();
        scan = (int*)vb.Alternate();                  /* E ints: the scanned fg bits */
        gp = (float*)kb.Alternate();                  /* C x P floats (4E bytes of the 8E) */
    }
    /* FUSEDLOSS_LOVASZ_PC=1 (s19, off until timed): probabilities with d < LV_PC_D (the P x C layout
     * [P, C] has d = 1) take the logits' route: the Jaccard pass stores into gp [C][P], where each
     * class's gradient stays in its own 4P-byte window, and lv_softmax_bwd<PROB> copies it to
     * dinput pixel by pixel. Directly, a class's stores land C d elements apart over all of dinput. */
    LvArgs ag = a;
    const int via_gp = a.fused && !p->from_logits && p->d < LV_PC_D && lv_env_int("FUSEDLOSS_LOVASZ_PC", 0) != 0;
    if (via_gp) ag.from_logits = 1;   /* the Jaccard pass and the flush only (lv_store_grad's target) */
    int64_t nparts;
    if (jac2) {
        LvTileState ts;
        FL_CUDA_TRY(ts.Init((int)pl.ntiles, ws + pl.off_tiles, pl.tile_bytes));
        /* buckets: FUSEDLOSS_LOVASZ_BUCKET=0 stores directly (as the default pass); width 2^bits pixels
         * (FUSEDLOSS_LOVASZ_BUCKET_BITS, 5-13), for segments of >= FUSEDLOSS_LOVASZ_BUCKET_MIN pixels
         * (default 65536; the tests take 1) whose tiles touch <= LV_LB_MAX buckets */
        LvBkt bk;
        memset(&bk, 0, sizeof bk);
        int bits = lv_env_int("FUSEDLOSS_LOVASZ_BUCKET_BITS", LV_BB_MAX);
        bits = bits < LV_BB_MIN ? LV_BB_MIN : bits > LV_BB_MAX ? LV_BB_MAX : bits;
        const int64_t nb = (pl.L + (1 << bits) - 1) >> bits;
        int64_t segs = (LV_TILE - 1) / pl.L + 2;
        if (segs > pl.S) segs = pl.S;
        const int bkt = a.fused && lv_env_int("FUSEDLOSS_LOVASZ_BUCKET", 1) != 0 &&
                        pl.L >= (int64_t)lv_env_int("FUSEDLOSS_LOVASZ_BUCKET_MIN", 65536) && segs * nb <= LV_LB_MAX;
        if (bkt) {
            bk.bits = bits;
            bk.nb = (u32)nb;
            bk.gv = bucket_gv;
            bk.jl = (u16*)scan;                       /* the scan's 4E bytes are free on this path */
            bk.cur = (int*)(ws + pl.off_cur);
        }
        const int64_t ncur = bkt ? pl.S * nb : 0;
        /* lv_jaccard2's and lv_flush's H (default 1; 0: the s23 kernels): s32 run 1 (H100), kernels 1.335 -> 1.322 ms */
        const int hoist = lv_env_int("FUSEDLOSS_LOVASZ_JAC2_HOIST", 1) != 0;
        const int sg = lv_env_int("FUSEDLOSS_LOVASZ_JAC2_SG", 1) != 0;
        const int fbatch = lv_env_int("FUSEDLOSS_LOVASZ_FLUSH_BATCH", 1) != 0;
        lv_prep<<<(unsigned)((pl.ntiles + LV_THREADS - 1) / LV_THREADS), LV_THREADS, 0, stream>>>(
            ts, (int)pl.ntiles, bk.cur, ncur, G, pl.nsets, p->C, a.all, p->per_image, p->N, grad_loss, grad_scale,
            base, Vs, lw, gw);
        FL_CUDA_TRY(cudaGetLastError());
        if (pk && bkt)
            lv_jaccard2<T, true, true><<<(unsigned)pl.ntiles, LV_THREADS, 0, stream>>>(
                ag, (const u32*)keys, vals, ts, G, base, Vs, lw, gw, gp, part, pl.jbits, bk);
        else if (pk)
            lv_jaccard2<T, false, true><<<(unsigned)pl.ntiles, LV_THREADS, 0, stream>>>(
                ag, (const u32*)keys, vals, ts, G, base, Vs, lw, gw, gp, part, pl.jbits, bk);
        else if (bkt && sg && hoist)   /* H above, 3 blocks an SM */
            lv_jaccard2<T, true, false, true, true><<<(unsigned)pl.ntiles, LV_THREADS, 0, stream>>>(
                ag, (const u32*)keys, vals, ts, G, base, Vs, lw, gw, gp, part, pl.jbits, bk);
        else if (bkt && sg)   /* SG above: H100 s23 run 1 227.5 -> 215 us */
            lv_jaccard2<T, true, false, true><<<(unsigned)pl.ntiles, LV_THREADS, 0, stream>>>(
                ag, (const u32*)keys, vals, ts, G, base, Vs, lw, gw, gp, part, pl.jbits, bk);
        else if (bkt)
            lv_jaccard2<T, true><<<(unsigned)pl.ntiles, LV_THREADS, 0, stream>>>(
                ag, (const u32*)keys, vals, ts, G, base, Vs, lw, gw, gp, part, pl.jbits, bk);
        else
            lv_jaccard2<T, false><<<(unsigned)pl.ntiles, LV_THREADS, 0, stream>>>(
                ag, (const u32*)keys, vals, ts, G, base, Vs, lw, gw, gp, part, pl.jbits, bk);
        FL_CUDA_TRY(cudaGetLastError());
        if (bkt) {
            if (fbatch && hoist)   /* BL and H above */
                lv_flush<T, true, true><<<(unsigned)ncur, LV_THREADS, 0, stream>>>(ag, bk, gp);
            else if (fbatch)   /* BL above */
                lv_flush<T, true><<<(unsigned)ncur, LV_THREADS, 0, stream>>>(ag, bk, gp);
            else
                lv_flush<T><<<(unsigned)ncur, LV_THREADS, 0, stream>>>(ag, bk, gp);
            FL_CUDA_TRY(cudaGetLastError());
        }
        nparts = pl.ntiles;
    } else {
        tb = pl.temp_bytes;
        if (pk)
            FL_CUDA_TRY(cub::DeviceScan::InclusiveSum((void*)(ws + pl.off_temp), tb, LvFgPkIt(keys, LvFgPk()), scan,
                                                      (int)pl.E, stream));
        else
            FL_CUDA_TRY(cub::DeviceScan::InclusiveSum((void*)(ws + pl.off_temp), tb, LvFgIt(vals, LvFg()), scan,
                                                      (int)pl.E, stream));
        lv_segments<<<(unsigned)((pl.nsets + 127) / 128), 128, 0, stream>>>(scan, pl.nsets, p->C, pl.L, a.all,
                                                                             p->per_image, p->N, grad_loss,
                                                                             grad_scale, G, base, Vs, lw, gw);
        FL_CUDA_TRY(cudaGetLastError());
        /* exactly the resident blocks: the positions in flight form one window moving through the
         * sorted array, so each segment's scattered gradient writes land in L2 together (run 4: 2048
         * blocks = two waves, each writing half of every segment: 0.73 ms for 20M positions) */
        static int occ[3][3];
        int* o = &occ[p->dtype == FL_DTYPE_F32 ? 0 : p->dtype == FL_DTYPE_F16 ? 1 : 2][k32 + pk];
        if (*o == 0) {
            int v = 0;
            FL_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &v, pk ? (const void*)lv_jaccard<T, true, true>
                       : k32 ? (const void*)lv_jaccard<T, true> : (const void*)lv_jaccard<T, false>,
                LV_THREADS, 0));
            *o = v > 0 ? v : 1;
        }
        int64_t nb = (pl.E + LV_THREADS - 1) / LV_THREADS;
        if (nb > (int64_t)sms * *o) nb = (int64_t)sms * *o;
        if (nb > LV_MAX_BLOCKS) nb = LV_MAX_BLOCKS;
        if (pk)
            lv_jaccard<T, true, true><<<(unsigned)nb, LV_THREADS, 0, stream>>>(ag, keys, vals, scan, G, base, Vs, lw,
                                                                                gw, gp, part, pl.jbits);
        else if (k32)
            lv_jaccard<T, true><<<(unsigned)nb, LV_THREADS, 0, stream>>>(ag, keys, vals, scan, G, base, Vs, lw, gw,
                                                                          gp, part, pl.jbits);
        else
            lv_jaccard<T, false><<<(unsigned)nb, LV_THREADS, 0, stream>>>(ag, keys, vals, scan, G, base, Vs, lw, gw,
                                                                           gp, part, 0);
        FL_CUDA_TRY(cudaGetLastError());
        nparts = nb;
    }
    if (loss) {
        lv_final<<<1, LV_THREADS, 0, stream>>>(part, (int)nparts, a.bad, loss);
        FL_CUDA_TRY(cudaGetLastError());
    }
    if (a.fused && p->from_logits) {
        lv_softmax_bwd<T><<<lv_grid(pl.P, cap), LV_THREADS, 0, stream>>>(a, gp);
        FL_CUDA_TRY(cudaGetLastError());
    } else if (via_gp) {
        lv_softmax_bwd<T, true><<<lv_grid(pl.P, cap), LV_THREADS, 0, stream>>>(a, gp);
        FL_CUDA_TRY(cudaGetLastError());
    }
    return FL_OK;
}

static fl_status lv_cuda(const char* fn, fl__pass pass, float* loss, void* dinput, const void* input, int64_t ld,
                         const void* labels, fl_index_dtype index_dtype, const float* grad_loss, float grad_scale,
                         int64_t N, int64_t C, int64_t d, fl_dtype dtype, const fl_lovasz_options* opts,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    fl__clear_error();
    fl__lovasz_params p;
    FL_CHECK(fl__lovasz_validate(fn, pass, 1, loss, dinput, input, ld, labels, index_dtype, grad_loss, grad_scale, N,
                                 C, d, dtype, opts, workspace, workspace_bytes, &p));
    if (N == 0) {
        if (loss) FL_CUDA_TRY(cudaMemsetAsync(loss, 0, sizeof(float), stream));
        return FL_OK;
    }
    LvPlan pl;
    FL_CUDA_TRY(lv_plan_cached(N, C, d, p.per_image, p.from_logits, &pl));
    int* ef = opts ? opts->error_flag : nullptr;
    switch (dtype) {
        case FL_DTYPE_F32:
            return lv_run_t<float>(fn, &p, pl, loss, dinput, input, labels, grad_loss, grad_scale, ef, workspace,
                                   stream);
        case FL_DTYPE_F16:
            return lv_run_t<__half>(fn, &p, pl, loss, dinput, input, labels, grad_loss, grad_scale, ef, workspace,
                                    stream);
        default:
            return lv_run_t<__nv_bfloat16>(fn, &p, pl, loss, dinput, input, labels, grad_loss, grad_scale, ef,
                                           workspace, stream);
    }
}

extern "C" {

fl_status fl_lovasz_softmax_forward_cuda(float* loss, const void* input, int64_t ld, const void* labels,
                                         fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                         const fl_lovasz_options* opts, void* workspace, size_t workspace_bytes,
                                         fl_stream stream) {
    return lv_cuda("fl_lovasz_softmax_forward_cuda", FL__PASS_FORWARD, loss, NULL, input, ld, labels, index_dtype,
                   NULL, 1.0f, N, C, d, dtype, opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

fl_status fl_lovasz_softmax_fused_cuda(float* loss, void* dinput, const void* input, int64_t ld, const void* labels,
                                       fl_index_dtype index_dtype, const float* grad_loss, float grad_scale,
                                       int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                       const fl_lovasz_options* opts, void* workspace, size_t workspace_bytes,
                                       fl_stream stream) {
    return lv_cuda("fl_lovasz_softmax_fused_cuda", FL__PASS_FUSED, loss, dinput, input, ld, labels, index_dtype,
                   grad_loss, grad_scale, N, C, d, dtype, opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

}  // extern "C"
