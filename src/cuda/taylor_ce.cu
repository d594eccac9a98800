/* taylor_ce.cu — CUDA backend of the Taylor softmax cross-entropy (include/fusedloss.h section 14),
 * the semantics of src/cpu/taylor_ce.c in fp32 arithmetic.
 *
 *   C <= 1024 : tc_warp_kernel, one warp per row (8 rows per CTA, rows grid-strided): the row's
 *               values in registers (lane l holding the 16-byte column groups l + 32 g), so the
 *               logits are read once and dlogits written once;
 *   C >  1024 : tc_cta_kernel, one 512-thread CTA per row: pass 1 sums f(x) over the row, pass 2
 *               writes the gradient; 16-byte vectors when the rows (and dlogits) are 16-byte
 *               aligned, else element by element. Rows not all aligned (e.g. odd C) whose logits
 *               and dlogits have the same 16-byte phase take tc_cta_head_kernel instead: the same
 *               passes in 16-byte vectors from each row's first 16-byte boundary, the head columns
 *               before it as scalar extras. Fused and vectorised with rows up to RL_STAGE_MAX_BYTES
 *               (STAGE): pass 1 keeps the row in shared memory (rowpass.cuh), so it is read once,
 *               as many CTAs per SM as fit; otherwise pass 2 reads it again from L2 (at most 2 rows
 *               per SM in flight).
 *   Row sums: per-lane / per-thread partials in column order, then a fixed shuffle / shared tree:
 *   deterministic. MEAN's count of rows not ignored and the SUM / MEAN reduction of the per-row
 *   losses are rowpass.cuh's two-stage kernels (rp_count before, rp_reduce after: fixed ranges,
 *   partials in order). Out-of-range targets: the row's loss and gradient NaN, *error_flag = 1.
 * Workspace (SUM / MEAN; src/internal.h): float D at 16 | reduction partials at 256 | per-row fp32
 * losses at FL__TAYLOR_WS_HEAD. NONE: the per-row losses go straight to loss[].
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cluster.cuh"
#include "common.cuh"
#include "ringrow.cuh"
#include "rowpass.cuh"

#define TC_THREADS 256

typedef struct {
    const void* x;
    void* dx;
    const void* tg;
    int lab64;
    int64_t N, C, ld, ign;
    int order, none, mean, fused;
    const float* gl;
    float gscale;
    const float* Ddev;   /* MEAN's count (device), else NULL */
    float* rowloss;      /* per-row losses: loss[] for NONE, the workspace's otherwise (NULL: not wanted) */
    int* error_flag;
} TcArgs;

static __device__ __forceinline__ float tc_f(float x, int order) {
    const float f2 = fmaf(0.5f * x, x, 1.0f + x);
    if (order == 2) return f2;
    const float x2 = x * x;
    return f2 + x2 * x * (1.0f / 6.0f) + x2 * x2 * (1.0f / 24.0f);
}
static __device__ __forceinline__ float tc_df(float x, int order) {
    return order == 2 ? 1.0f + x : fmaf(0.5f * x, x, 1.0f + x) + x * x * x * (1.0f / 6.0f);
}

/* the row's upstream gradient g_i (MEAN: / D) */
static __device__ __forceinline__ float tc_g(const TcArgs& a, int64_t i) {
    float g = a.gscale * (a.gl ? a.gl[a.none ? i : 0] : 1.0f);
    if (a.mean) g /= *a.Ddev;
    return g;
}

/* 0: a regular row; 1: ignored; 2: out of range (flagged) */
static __device__ __forceinline__ int tc_row_kind(const TcArgs& a, int64_t y) {
    if (y == a.ign) return 1;
    if (y < 0 || y >= a.C) return 2;
    return 0;
}

/* One warp per row, C <= 1024: lane l holds the G groups l + 32 g of VEC = 16 / sizeof(T) columns
 * (a full group moves as one 16-byte vector when VEC16, streaming; the row's last, partial group
 * element by element, never past C), as large_margin_ce.cu's warp kernel. Why vectors: one scalar
 * load per column and lane (the first cut) ran 65536x1000 fp32 fwd+bwd at 1.81x the floor in a CUDA
 * graph, the large-margin kernel with this layout 1.42x (H200 2026-12-03 s10 run 2). */
template <typename T, int G, bool VEC16>
static __global__ void __launch_bounds__(TC_THREADS) tc_warp_kernel(TcArgs a) {
    constexpr int VEC = 16 / (int)sizeof(T);
    constexpr int VPL = G * VEC;
    T* dx = (T*)a.dx;
    const int lane = threadIdx.x & 31;
    const int C = (int)a.C;   /* <= 1024: 32-bit column arithmetic */
    const int64_t warps = (int64_t)gridDim.x * (TC_THREADS / 32);
    for (int64_t i = (int64_t)blockIdx.x * (TC_THREADS / 32) + (threadIdx.x >> 5); i < a.N; i += warps) {
        const int64_t y64 = rp_label(a.tg, a.lab64, i);
        const int kind = tc_row_kind(a, y64);
        const int64_t r0 = i * a.ld;
        if (kind != 0) {
            const float v = kind == 1 ? 0.0f : NAN;
            if (kind == 2 && lane == 0 && a.error_flag) atomicOr(a.error_flag, 1);
            if (lane == 0 && a.rowloss) a.rowloss[i] = v;
            if (a.fused)
                for (int64_t j = lane; j < a.C; j += 32) dx[r0 + j] = from_float<T>(v);
            continue;
        }
        const int y = (int)y64;
        const T* x = (const T*)a.x + r0;
        float v[VPL];
#pragma unroll
        for (int g = 0; g < G; g++) {
            const int c0 = (lane + 32 * g) * VEC;
            if (VEC16 && c0 + VEC <= C) {
                rp_unpack<T>(FL_LDCS((const uint4*)(x + c0)), v + g * VEC);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++) v[g * VEC + k] = c0 + k < C ? to_float(FL_LDCS(x + c0 + k)) : 0.0f;
            }
        }
        /* sums in column order per lane, then a butterfly; x_y from the registers of the lane that
         * holds it: no second global read, which in place could see another lane's gradient */
        float s = 0.0f, t = 0.0f;
#pragma unroll
        for (int q = 0; q < VPL; q++) {
            const int j = (lane + 32 * (q / VEC)) * VEC + q % VEC;
            if (j < C) s += tc_f(v[q], a.order);
            if (j == y) t = v[q];
        }
        const float xy = __shfl_sync(0xffffffffu, t, (y / VEC) & 31);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        const float fy = tc_f(xy, a.order);
        if (lane == 0 && a.rowloss) a.rowloss[i] = logf(s) - logf(fy);
        if (a.fused) {
            const float g = tc_g(a, i);
            const float ginvS = g / s, gdy = g * (tc_df(xy, a.order) / fy);
            T* d = dx + r0;
#pragma unroll
            for (int g2 = 0; g2 < G; g2++) {
                const int c0 = (lane + 32 * g2) * VEC;
                float o[VEC];
#pragma unroll
                for (int kk = 0; kk < VEC; kk++)
                    o[kk] = tc_df(v[g2 * VEC + kk], a.order) * ginvS - (c0 + kk == y ? gdy : 0.0f);
                if (VEC16 && c0 + VEC <= C) {
                    rp_vstore<T, VEC>(d + c0, o);
                } else {
#pragma unroll
                    for (int kk = 0; kk < VEC; kk++)
                        if (c0 + kk < C) d[c0 + kk] = from_float<T>(o[kk]);
                }
            }
        }
    }
}

/* 16 bytes of T as fp32 values, and back (VEC = 16 / sizeof(T)) */
template <typename T>
static __device__ __forceinline__ void tc_load16(const T* p, float* out) {
    uint4 u = *(const uint4*)p;
    const T* e = (const T*)&u;
#pragma unroll
    for (int k = 0; k < (int)(16 / sizeof(T)); k++) out[k] = to_float(e[k]);
}
template <typename T>
static __device__ __forceinline__ void tc_store16(T* p, const float* in) {
    uint4 u;
    T* e = (T*)&u;
#pragma unroll
    for (int k = 0; k < (int)(16 / sizeof(T)); k++) e[k] = from_float<T>(in[k]);
    *(uint4*)p = u;
}
/* the same 16 bytes' worth of elements, one at a time (VEC16 false: the groups start at column 0
 * and the rows are not aligned): the same values in the same order as a vector */
template <typename T, bool VEC16>
static __device__ __forceinline__ void tc_load_v(const T* p, float* out) {
    if (VEC16) {
        tc_load16<T>(p, out);
    } else {
#pragma unroll
        for (int k = 0; k < (int)(16 / sizeof(T)); k++) out[k] = to_float(p[k]);
    }
}
template <typename T, bool VEC16>
static __device__ __forceinline__ void tc_store_v(T* p, const float* in) {
    if (VEC16) {
        tc_store16<T>(p, in);
    } else {
#pragma unroll
        for (int k = 0; k < (int)(16 / sizeof(T)); k++) p[k] = from_float<T>(in[k]);
    }
}

/* One CTA of TC_CTA_THREADS per row; thread t takes the 16-byte groups t, t + 512, ... then the
 * tail; the groups start at column 0. VEC16: rows (and dlogits) 16-byte aligned, so the groups move
 * as vectors (else element by element, or tc_cta_head_kernel below). STAGE (VEC16, fused): pass 1
 * keeps group q in stage[q] for pass 2 (the same thread's groups: no barrier), the grid is the
 * resident CTAs; else the grid keeps at most 2 rows per SM in flight so that pass 2's re-read of
 * the row comes from L2 (tc_cuda). */
#define TC_CTA_THREADS 512
/* PF (STAGE only; FUSEDLOSS_TC_PREFETCH=1, experimental, not yet measured: written in session 15,
 * which had no GPU): the next row of this CTA copied into shared memory by per-thread cp.async during
 * this row's pass 2, as large_margin_ce.cu's lm_cta_kernel PF (each thread reads only the vectors it
 * copied itself: no barrier). */
template <typename T, bool VEC16, bool STAGE, bool PF = false>
static __global__ void __launch_bounds__(TC_CTA_THREADS) tc_cta_kernel(TcArgs a) {
    constexpr int VEC = 16 / (int)sizeof(T);
    extern __shared__ uint4 stage[];
    __shared__ float sh[TC_CTA_THREADS / 32];
    __shared__ float tot;
    const T* x = (const T*)a.x;
    T* dx = (T*)a.dx;
    const int64_t nvec = a.C / VEC, tail0 = nvec * VEC;
    if constexpr (PF) {   /* this CTA's first row */
        if (blockIdx.x < a.N)
            for (int64_t q = threadIdx.x; q < nvec; q += TC_CTA_THREADS)
                cp_async16(stage + q, x + (int64_t)blockIdx.x * a.ld + q * VEC);
        cp_commit();
    }
    for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
        const int64_t y = rp_label(a.tg, a.lab64, i);
        const int kind = tc_row_kind(a, y);
        const int64_t r0 = i * a.ld;
        if (kind != 0) {
            const float v = kind == 1 ? 0.0f : NAN;
            if (kind == 2 && threadIdx.x == 0 && a.error_flag) atomicOr(a.error_flag, 1);
            if (threadIdx.x == 0 && a.rowloss) a.rowloss[i] = v;
            if (a.fused)
                for (int64_t j = threadIdx.x; j < a.C; j += TC_CTA_THREADS) dx[r0 + j] = from_float<T>(v);
            if constexpr (PF) {   /* this row's copies landed (unread), then the next row's */
                cp_wait(0);
                if (i + gridDim.x < a.N)
                    for (int64_t q = threadIdx.x; q < nvec; q += TC_CTA_THREADS)
                        cp_async16(stage + q, x + (i + gridDim.x) * a.ld + q * VEC);
                cp_commit();
            }
            continue;
        }
        /* x_y before the barriers below: in place, the gradient stores after them overwrite it */
        const float xy = to_float(x[r0 + y]);
        float s = 0.0f;
        if constexpr (PF) cp_wait(0);   /* this thread's copies of the row have landed */
#pragma unroll 4
        for (int64_t q = threadIdx.x; q < nvec; q += TC_CTA_THREADS) {
            float v[VEC];
            if constexpr (PF) {
                rp_unpack<T>(stage[q], v);
            } else if (STAGE) {
                const uint4 u = FL_LDCS((const uint4*)(x + r0 + q * VEC));  /* read once: evict first */
                stage[q] = u;
                rp_unpack<T>(u, v);
            } else {
                tc_load_v<T, VEC16>(x + r0 + q * VEC, v);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) s += tc_f(v[k], a.order);
        }
        for (int64_t j = tail0 + threadIdx.x; j < a.C; j += TC_CTA_THREADS) s += tc_f(to_float(x[r0 + j]), a.order);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            for (int k = 0; k < TC_CTA_THREADS / 32; k++) t += sh[k];
            tot = t;
        }
        __syncthreads();
        const float S = tot;
        __syncthreads();   /* sh and tot are rewritten by the next row */
        const float fy = tc_f(xy, a.order);
        if (threadIdx.x == 0 && a.rowloss) a.rowloss[i] = logf(S) - logf(fy);
        if (a.fused) {
            const float g = tc_g(a, i);
            const float ginvS = g / S, gdy = g * (tc_df(xy, a.order) / fy);
            /* PF: the next row (NULL: none), into each slot once this thread has read it */
            const T* xn = (PF && i + gridDim.x < a.N) ? x + (i + gridDim.x) * a.ld : nullptr;
#pragma unroll 4
            for (int64_t q = threadIdx.x; q < nvec; q += TC_CTA_THREADS) {
                float v[VEC];
                if (STAGE) rp_unpack<T>(stage[q], v);
                else tc_load_v<T, VEC16>(x + r0 + q * VEC, v);
                if constexpr (PF) {
                    if (xn) cp_async16(stage + q, xn + q * VEC);
                }
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    v[k] = tc_df(v[k], a.order) * ginvS - (q * VEC + k == y ? gdy : 0.0f);
                tc_store_v<T, VEC16>(dx + r0 + q * VEC, v);
            }
            if constexpr (PF) cp_commit();
            for (int64_t j = tail0 + threadIdx.x; j < a.C; j += TC_CTA_THREADS) {
                const float v = to_float(x[r0 + j]);
                dx[r0 + j] = from_float<T>(tc_df(v, a.order) * ginvS - (j == y ? gdy : 0.0f));
            }
        }
    }
}

/* tc_cta_kernel for rows that are not all 16-byte aligned while logits and dlogits have the same
 * 16-byte phase (tc_cuda): each row's groups start at its first 16-byte boundary and move as
 * vectors; the h head columns before it are extras, handled with the tail (thread t takes the
 * extras t, t + 512, ..., head first). The grouping, hence the last bits of the row sum, follows
 * the row's address; an aligned row (h = 0) is grouped as in tc_cta_kernel. Why: with groups from
 * column 0 such rows (V = 50257) went element by element, 8192x50257 bf16 4.52x the floor (s10
 * run 2); 2.07x with heads (run 5). A kernel of its own because the head inside tc_cta_kernel
 * changed the aligned kernel's code and slowed it (8192x32000 bf16 staged 0.347 -> 0.43 ms, s10
 * run 6). STAGE (fused): as tc_cta_kernel's, with a row's (C - h) / VEC groups in the C / VEC
 * slots. Its body is a copy of tc_cta_kernel's with the heads added: a change to one belongs in the
 * other (a shared body with a HEAD template flag changed all 18 aligned instantiations' SASS even
 * with the flag off, 2026-12-04). */
template <typename T, bool STAGE>
static __global__ void __launch_bounds__(TC_CTA_THREADS) tc_cta_head_kernel(TcArgs a) {
    constexpr int VEC = 16 / (int)sizeof(T);
    extern __shared__ uint4 stage[];
    __shared__ float sh[TC_CTA_THREADS / 32];
    __shared__ float tot;
    const T* x = (const T*)a.x;
    T* dx = (T*)a.dx;
    for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
        const int64_t y = rp_label(a.tg, a.lab64, i);
        const int kind = tc_row_kind(a, y);
        const int64_t r0 = i * a.ld;
        if (kind != 0) {
            const float v = kind == 1 ? 0.0f : NAN;
            if (kind == 2 && threadIdx.x == 0 && a.error_flag) atomicOr(a.error_flag, 1);
            if (threadIdx.x == 0 && a.rowloss) a.rowloss[i] = v;
            if (a.fused)
                for (int64_t j = threadIdx.x; j < a.C; j += TC_CTA_THREADS) dx[r0 + j] = from_float<T>(v);
            continue;
        }
        /* head columns before the row's first 16-byte boundary (dlogits: the same phase) */
        int64_t h = (int64_t)(((16u - ((unsigned)(uintptr_t)(x + r0) & 15u)) & 15u) / sizeof(T));
        if (h > a.C) h = a.C;
        const int64_t nvec = (a.C - h) / VEC, tail0 = h + nvec * VEC, nex = h + (a.C - tail0);
        const T* xb = x + r0 + h;
        /* x_y before the barriers below: in place, the gradient stores after them overwrite it */
        const float xy = to_float(x[r0 + y]);
        float s = 0.0f;
#pragma unroll 4
        for (int64_t q = threadIdx.x; q < nvec; q += TC_CTA_THREADS) {
            float v[VEC];
            if (STAGE) {
                const uint4 u = FL_LDCS((const uint4*)(xb + q * VEC));  /* read once: evict first */
                stage[q] = u;
                rp_unpack<T>(u, v);
            } else {
                tc_load16<T>(xb + q * VEC, v);
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) s += tc_f(v[k], a.order);
        }
        for (int64_t e = threadIdx.x; e < nex; e += TC_CTA_THREADS) {  /* head, then tail columns */
            const int64_t j = e < h ? e : tail0 + (e - h);
            s += tc_f(to_float(x[r0 + j]), a.order);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            for (int k = 0; k < TC_CTA_THREADS / 32; k++) t += sh[k];
            tot = t;
        }
        __syncthreads();
        const float S = tot;
        __syncthreads();   /* sh and tot are rewritten by the next row */
        const float fy = tc_f(xy, a.order);
        if (threadIdx.x == 0 && a.rowloss) a.rowloss[i] = logf(S) - logf(fy);
        if (a.fused) {
            const float g = tc_g(a, i);
            const float ginvS = g / S, gdy = g * (tc_df(xy, a.order) / fy);
#pragma unroll 4
            for (int64_t q = threadIdx.x; q < nvec; q += TC_CTA_THREADS) {
                float v[VEC];
                if (STAGE) rp_unpack<T>(stage[q], v);
                else tc_load16<T>(xb + q * VEC, v);
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    v[k] = tc_df(v[k], a.order) * ginvS - (h + q * VEC + k == y ? gdy : 0.0f);
                tc_store16<T>(dx + r0 + h + q * VEC, v);
            }
            /* each extra column read and written by the same thread: safe in place */
            for (int64_t e = threadIdx.x; e < nex; e += TC_CTA_THREADS) {
                const int64_t j = e < h ? e : tail0 + (e - h);
                const float v = to_float(x[r0 + j]);
                dx[r0 + j] = from_float<T>(tc_df(v, a.order) * ginvS - (j == y ? gdy : 0.0f));
            }
        }
    }
}

/* ---- the ring kernel's policy (ringrow.cuh: FUSEDLOSS_TC_PIPE=1, experimental, not yet run) --------
 * S = sum f(x) over the whole row (the target included), loss log S - log f(x_y), gradient
 * f'(x) g / S - [j == y] g f'(x_y) / f(x_y): the CTA kernels' formulas (coef[0] = g / S, coef[1] =
 * g f'(x_y) / f(x_y)); the per-thread sums in a different order than tc_cta_kernel's. Why: rows of
 * more than RL_STAGE_MAX_BYTES and unaligned rows were re-read from L2 (8192x50257 bf16 2.07x). */
struct TcRing {
    typedef TcArgs Args;
    struct Stat { float s; };
    static constexpr bool kPairs = false;   /* one running sum (merge not needed) */
    static __device__ __forceinline__ Stat init() { return Stat{0.0f}; }
    template <int VEC>
    static __device__ __forceinline__ void push(const Args& a, Stat& t, const float* v, int64_t) {
#pragma unroll
        for (int k = 0; k < VEC; k++) t.s += tc_f(v[k], a.order);
    }
    static __device__ __forceinline__ void push1(const Args& a, Stat& t, float v, bool) { t.s += tc_f(v, a.order); }
    static __device__ __forceinline__ Stat warp_merge(Stat t) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) t.s += __shfl_xor_sync(0xffffffffu, t.s, o);
        return t;
    }
    static __device__ __forceinline__ int kind(const Args& a, int64_t y) { return tc_row_kind(a, y); }
    static __device__ __forceinline__ float row(const Args& a, int64_t i, float xy, const Stat& u, float* c) {
        const float fy = tc_f(xy, a.order), g = tc_g(a, i);
        c[0] = g / u.s;
        c[1] = g * (tc_df(xy, a.order) / fy);
        return logf(u.s) - logf(fy);
    }
    static __device__ __forceinline__ float grad(const Args& a, const float* c, float v, bool target) {
        return tc_df(v, a.order) * c[0] - (target ? c[1] : 0.0f);
    }
};

/* TcRing (rr_plan<TcRing> in tc_cuda, knob FUSEDLOSS_TC_PIPE) is the default for fused rows of > 1024
 * classes on sm_90 since 2026-12-05 (FUSEDLOSS_TC_PIPE=0: the CTA kernels below): rr_kernel<T, TcRing> (ringrow.cuh), 16-byte aligned rows or rows of one 16-byte
 * phase with dlogits, up to ~150 KB (the ring's slack rule; longer rows take the CTA kernels). H200
 * s16 runs 2-3, fwd+bwd graph step x floor, CTA kernels / ring: 8192x32000 bf16 1.38 / 1.20x,
 * 8192x50257 bf16 2.11 / 1.22x (its unaligned 100 KB rows had been re-read from L2); 672 threads,
 * 32 KB slots, evict-first stores: no better. Knobs FUSEDLOSS_TC_PIPE_{THREADS,STATS,RING,SUB,
 * SLACK,PLAIN_ST,GRID}. */
typedef void (*tc_fn)(TcArgs);

/* FUSEDLOSS_TC_PREFETCH=1: the staged CTA kernel with the next row's cp.async prefetch (PF above) */
static int tc_prefetch(void) { return rp_env_flag("FUSEDLOSS_TC_PREFETCH", 0) != 0; }

template <typename T>
static tc_fn tc_pick_t(int64_t C, bool vec16, bool head, bool stage) {
    constexpr int VEC = 16 / (int)sizeof(T);
    const int64_t G = ((C + VEC - 1) / VEC + 31) / 32;   /* groups per lane */
    if (C <= 1024) {
        if (G <= 1) return vec16 ? tc_warp_kernel<T, 1, true> : tc_warp_kernel<T, 1, false>;
        if (G <= 2) return vec16 ? tc_warp_kernel<T, 2, true> : tc_warp_kernel<T, 2, false>;
        if constexpr (VEC == 4) {   /* fp32: up to 8 groups of 4 at C = 1024; 16-bit: up to 4 of 8 */
            if (G > 4) return vec16 ? tc_warp_kernel<T, 8, true> : tc_warp_kernel<T, 8, false>;
        }
        return vec16 ? tc_warp_kernel<T, 4, true> : tc_warp_kernel<T, 4, false>;
    }
    if (head) return stage ? tc_cta_head_kernel<T, true> : tc_cta_head_kernel<T, false>;
    if (stage) return tc_prefetch() ? tc_cta_kernel<T, true, true, true> : tc_cta_kernel<T, true, true>;
    return vec16 ? tc_cta_kernel<T, true, false> : tc_cta_kernel<T, false, false>;
}
static tc_fn tc_pick(fl_dtype dt, int64_t C, bool vec16, bool head, bool stage) {
    switch (dt) {
        case FL_DTYPE_F32: return tc_pick_t<float>(C, vec16, head, stage);
        case FL_DTYPE_F16: return tc_pick_t<__half>(C, vec16, head, stage);
        default: return tc_pick_t<__nv_bfloat16>(C, vec16, head, stage);
    }
}

static fl_status tc_cuda(const char* fn, fl__pass pass, float* loss, void* dlogits, const void* logits, int64_t ld,
                         const void* targets, fl_index_dtype index_dtype, const float* grad_loss, float grad_scale,
                         int64_t N, int64_t C, fl_dtype dtype, const fl_taylor_options* opts, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    fl__clear_error();
    fl__taylor_params p;
    FL_CHECK(fl__taylor_validate(fn, pass, 1, loss, dlogits, logits, ld, targets, index_dtype, grad_loss, grad_scale,
                                 N, C, dtype, opts, workspace, workspace_bytes, &p));
    const RlPlan w = rl_plan(workspace, loss, p.reduction);
    int done = 0;
    FL_CUDA_TRY(rl_begin(w, loss, targets, index_dtype == FL_INDEX_I64, p.ignore_index, N, stream, &done));
    if (done) return FL_OK;
    const int none = w.none, mean = w.mean;
    const int fused = pass == FL__PASS_FUSED;
    TcArgs a;
    memset(&a, 0, sizeof a);
    a.x = logits;
    a.dx = fused ? dlogits : nullptr;
    a.tg = targets;
    a.lab64 = index_dtype == FL_INDEX_I64;
    a.N = N;
    a.C = C;
    a.ld = ld;
    a.ign = p.ignore_index;
    a.order = p.order;
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
     * place), head: tc_cta_head_kernel, vectors from each row's first boundary. Else element by
     * element from column 0. */
    const bool vec16 = rl_vec16(logits, dlogits, fused, ld, es);
    const bool head = !vec16 && C > 1024 && (uintptr_t)logits % es == 0 &&
                      (!fused || ((uintptr_t)logits - (uintptr_t)dlogits) % 16 == 0);
    RrPlan tp;
    if (const void* pfn = rr_plan<TcRing>("FUSEDLOSS_TC_PIPE", 1, "pipelined Taylor kernel", dtype, N, C, vec16 || head,
                                          fused, logits, ld, &tp)) {
        void* args[] = {&a, &tp.sub, &tp.R, &tp.Ts, &tp.maps};
        FL_CUDA_TRY(cudaLaunchKernel(pfn, dim3(tp.grid), dim3((unsigned)tp.T), args, tp.smem, stream));
        FL_CUDA_TRY(rl_end(w, loss, N, stream));
        return FL_OK;
    }
    const size_t smem = rl_stage_bytes(C, es, vec16 || head, fused, RL_STAGE_MAX_BYTES);
    const tc_fn kfn = tc_pick(dtype, C, vec16, head, smem > 0);
    unsigned grid = 0;
    if (smem > 0) FL_CUDA_TRY(rl_stage_grid((const void*)kfn, TC_CTA_THREADS, smem, N, &grid));
    else FL_CUDA_TRY(rl_grid(N, C, TC_THREADS, &grid));
    kfn<<<grid, C <= 1024 ? TC_THREADS : TC_CTA_THREADS, smem, stream>>>(a);
    FL_CUDA_TRY(cudaGetLastError());
    FL_CUDA_TRY(rl_end(w, loss, N, stream));
    return FL_OK;
}

extern "C" {

fl_status fl_taylor_ce_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                    fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                    const fl_taylor_options* opts, void* workspace, size_t workspace_bytes,
                                    fl_stream stream) {
    return tc_cuda("fl_taylor_ce_forward_cuda", FL__PASS_FORWARD, loss, NULL, logits, ld, targets, index_dtype, NULL,
                   1.0f, N, C, dtype, opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

fl_status fl_taylor_ce_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld, const void* targets,
                                  fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                  int64_t C, fl_dtype dtype, const fl_taylor_options* opts, void* workspace,
                                  size_t workspace_bytes, fl_stream stream) {
    return tc_cuda("fl_taylor_ce_fused_cuda", FL__PASS_FUSED, loss, dlogits, logits, ld, targets, index_dtype,
                   grad_loss, grad_scale, N, C, dtype, opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

}  // extern "C"
