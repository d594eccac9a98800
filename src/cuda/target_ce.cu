/* target_ce.cu — CUDA backend of the two softmax losses with one class target per row that are
 * "cross-entropy plus a per-row tweak": the margin softmax cross-entropy (include/fusedloss.h section
 * 11) and the softmax focal loss (section 12). The CPU backends (src/cpu/margin_ce.c,
 * src/cpu/softmax_focal.c) are the specification; tests/test_margin_ce_cuda.c and
 * tests/test_softmax_focal_cuda.c check this file against them.
 *
 * Rows take, in this order: the staged cluster kernel (sm_90, aligned rows of >= 1024 16-byte vectors); one warp
 * a row, the row in registers, for C <= TW_MAX_C (4096) (tgt_warp_kernel, the default since s23, with the
 * statistics and formulas below; FUSEDLOSS_TGT_WARP=0 skips it); else the ticket kernel:
 * Rows (margin; focal with d == 1 and C > 64): the row machinery of rowpass.cuh (as the distillation):
 *   phase 0, per chunk: the online max and sum of 2^(z log2e) over the chunk's columns EXCLUDING the
 *            target column (z = s x for the margin, x for focal); the last chunk of a row to finish
 *            merges the row (fixed order) and forms, from the target's own logit x_y (one load):
 *              M = max(m, z_y), Sx = S 2^(m - M), ey = 2^(z_y - M), lse = M + log2(Sx + ey),
 *              1 - p_y = Sx / (Sx + ey) (no cancellation), and the cross-entropy lse - z_y as
 *              log1p(S 2^(m - z_y)) when z_y is the row's max (accurate for confident rows),
 *            then the loss and the two gradient coefficients of the row: dx_c = g A p_c (c != y),
 *            dx_y = g B (margin: A = s, B = -s (1 - p_y) phi'; focal: A = -alpha_y F, B = alpha_y F (1 - p_y)).
 *   phase 1 (fused only): dx of the chunk, written once.
 * Positions (focal with d > 1, or rows of C <= 64): one thread per position, adjacent threads on
 * adjacent positions (coalesced for d > 1); C <= 64: the position's C values loaded together into
 * registers (one read, one write); larger C: the classes read twice (statistics, then the gradient:
 * the second read hits L1 / L2).
 * Reductions: per-row / per-position fp32 losses into the workspace, then rp_reduce (two stages over
 * the GPU, fixed order); MEAN's count of non-ignored rows by rp_count first. Out-of-range targets: no out-of-bounds read,
 * that row's loss and gradient NaN, *error_flag = 1. No allocation, no host sync, graph-capturable,
 * deterministic.
 * SPDX-License-Identifier: MIT
 */
#include <string.h>

#include <cooperative_groups.h>

#include "cluster.cuh"
#include "rowpass.cuh"

namespace cg = cooperative_groups;

#define TC_MARGIN 0
#define TC_FOCAL 1

struct TArgs {
    RpSched sc;
    const void* x;
    void* dx;
    float* loss;      // NONE: [rows] (may be NULL in fused)
    float* lse;       // margin: [N] or NULL
    float* rowloss;   // [rows] for the reduce kernel
    const void* tg;   // targets
    const float* gl;
    const float* Ddev;
    int* cnt;
    float* part;
    const float* alpha;
    int32_t* error_flag;
    int64_t V, ld, d;  // classes, batch stride, positions per sample (class stride d)
    int64_t nrows;     // rows (margin / focal rows) or positions (N * d)
    int64_t ignore;
    float k2;          // log2(e) * scale of the logits (margin: s; focal: 1)
    float s, m1, m2, m3, theta_max, sinmm;
    float gamma;
    float gscale;
    int easy, straight, cosface;
    int lab64, none;
};

// phi and phi' of the margin (header section 11); x = the target cosine
__device__ __forceinline__ void margin_phi(const TArgs& a, float x, float& phi, float& dphi) {
    if (a.cosface) { phi = x - a.m3; dphi = 1.0f; return; }
    const float xc = fminf(fmaxf(x, -1.0f), 1.0f);
    const float th = acosf(xc);
    const bool applies = a.easy ? x > 0.0f : th <= a.theta_max;
    if (applies) {
        const float u = a.m1 * th + a.m2;
        phi = cosf(u) - a.m3;
        dphi = a.straight ? 1.0f : a.m1 * sinf(u) / fmaxf(sinf(th), 1e-6f);
    } else {
        phi = a.easy ? x - a.m3 : x - a.m3 - a.sinmm;
        dphi = 1.0f;
    }
}

// The target's own terms, which do not depend on the row's statistics: its logit zy2 (log2 units),
// the margin's derivative dphi, the focal's alpha_y (the staged kernel computes them while its
// partials are in flight).
template <int MODE>
__device__ __forceinline__ void tgt_target(const TArgs& a, float xy, int64_t y, float& zy2, float& dphi, float& al) {
    dphi = 1.0f;
    al = 1.0f;
    if (MODE == TC_MARGIN) {
        float phi;
        margin_phi(a, xy, phi, dphi);
        zy2 = a.s * phi * RP_LOG2E;
    } else {
        zy2 = xy * RP_LOG2E;
        if (a.alpha) al = __ldg(a.alpha + y);
    }
}

// From the non-target statistics (m, S: log2 units) and the target's terms (tgt_target): loss, lse
// (natural), the coefficients A, B of the gradient and, for the rows kernel, L2 = log2 of the
// row's sum.
template <int MODE>
__device__ __forceinline__ void tgt_finish_t(const TArgs& a, float m, float S, float zy2, float dphi, float al,
                                             float& loss, float& lse, float& A, float& B, float& L2) {
    const float M = fmaxf(m, zy2);
    const float Sx = S * rp_rescale(m, M), ey = exp2f(zy2 - M);
    const float tot = Sx + ey;
    L2 = M + log2f(tot);
    lse = L2 * RP_LN2;
    const float q = Sx / tot, p = ey / tot;   // 1 - p_y, p_y
    const float ce = zy2 >= m ? log1pf(S * rp_rescale(m, zy2)) : (L2 - zy2) * RP_LN2;
    if (MODE == TC_MARGIN) {
        loss = ce;
        A = a.s;
        B = -a.s * q * dphi;
    } else {
        const float g = a.gamma;
        const float qg = g == 0.0f ? 1.0f : (g == 1.0f ? q : (g == 2.0f ? q * q : powf(q, g)));
        const float lp = -ce;                                   // log p_y
        const float r = q > 0.0f ? lp / q : -1.0f;              // log(1 - q) / q -> -1
        const float F = (g == 0.0f ? 0.0f : g * qg * p * r) - qg;  // gamma q^(g-1) p log p - q^g
        loss = al * qg * ce;
        A = -al * F;
        B = al * F * q;
    }
}

template <int MODE>
__device__ __forceinline__ void tgt_finish(const TArgs& a, float m, float S, float xy, int64_t y, float& loss,
                                           float& lse, float& A, float& B, float& L2) {
    float zy2, dphi, al;
    tgt_target<MODE>(a, xy, y, zy2, dphi, al);
    tgt_finish_t<MODE>(a, m, S, zy2, dphi, al, loss, lse, A, B, L2);
}

// the row's upstream gradient before the reduction's denominator, and with it
__device__ __forceinline__ float tgt_upstream(const TArgs& a, int64_t r) {
    return a.gscale * (a.gl ? __ldg(a.gl + (a.none ? r : 0)) : 1.0f);
}
__device__ __forceinline__ float tgt_grad(const TArgs& a, int64_t r) {
    float g = tgt_upstream(a, r);
    if (!a.none) g = g / (a.Ddev ? __ldcg(a.Ddev) : 1.0f);
    return g;
}

// one scalar column z (log2 units) into the online (m, S); m = -inf: z = -inf too, adds 0 (not NaN)
__device__ __forceinline__ void tgt_online(float& m, float& S, float z) {
    if (z > m) { S *= rp_rescale(m, z); m = z; }
    if (m != -INFINITY) S += exp2f(z - m);
}

__device__ __forceinline__ void tgt_flag(const TArgs& a) {
    if (a.error_flag) atomicExch(a.error_flag, 1);
}

// (m, S) of the CTA (log2 units), a fixed tree: lanes by shuffles, then warps in order in thread 0
// (the result is valid there only); one barrier, so sm is reusable after the next one
__device__ __forceinline__ float2 tgt_block_ms(float2 v, float2* sm) {
    const int tid = (int)threadIdx.x;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, v.x, off), os = __shfl_xor_sync(0xffffffffu, v.y, off);
        const float M = fmaxf(v.x, om);
        v.y = v.y * rp_rescale(v.x, M) + os * rp_rescale(om, M);
        v.x = M;
    }
    if ((tid & 31) == 0) sm[tid >> 5] = v;
    __syncthreads();
    if (tid == 0) {
        for (int k = 1; k < RP_THREADS / 32; k++) {
            const float M = fmaxf(v.x, sm[k].x);
            v.y = v.y * rp_rescale(v.x, M) + sm[k].y * rp_rescale(sm[k].x, M);
            v.x = M;
        }
    }
    return v;
}

// ---- rows: the chunked row machinery ---------------------------------------------------------------
// slots: phase 0 partial [0] m [1] S (non-target, log2 units); merged (chunk 0's slot): [0] L2 [1] A [2] B
template <typename T, int MODE, bool FUSED>
__global__ void __launch_bounds__(RP_THREADS, 2) tgt_rows_kernel(TArgs a) {
    constexpr int VEC = RpT<T>::VEC;
    constexpr int U = 16 / VEC;
    __shared__ float2 sm[RP_THREADS / 32];
    __shared__ unsigned long long s_ticket;
    __shared__ int s_merge;
    const int tid = threadIdx.x;
    if (tid == 0) s_ticket = atomicAdd(a.sc.ticket, 1ull);
    __syncthreads();
    unsigned long long t = s_ticket;
    while ((int64_t)t < a.sc.total) {
        unsigned long long next = 0;
        if (tid == 0) next = atomicAdd(a.sc.ticket, 1ull);
        int phase;
        int64_t r, c;
        if (rp_decode(a.sc, (int64_t)t, phase, r, c)) {
            const T* xrow = (const T*)a.x + r * a.ld;
            T* drow = FUSED ? (T*)a.dx + r * a.ld : nullptr;
            const int64_t h = (int64_t)(((16u - ((uintptr_t)xrow & 15u)) & 15u) / sizeof(T));
            const bool vec_ok = !FUSED || ((uintptr_t)(drow + h) & 15u) == 0;
            const RpRange g = rp_range<VEC>(c, a.sc.C, a.V, a.sc.chk, h, vec_ok);
            const int64_t y = rp_label(a.tg, a.lab64, r);
            const bool ign = y == a.ignore;
            const bool valid = y >= 0 && y < a.V;
            float* slotp = a.part + (r * a.sc.C + c) * 8;
            float* row0 = a.part + r * a.sc.C * 8;
            const float k2 = a.k2;
            if (phase == 0) {
                float m = -INFINITY, S = 0.0f;
                if (!ign) {
                    rp_stream<T, T, false, !FUSED, U>(xrow, nullptr, g,
                        [&](float (&xs)[U][VEC], float (&)[U][VEC], const bool (&in)[U], int64_t col0) {
                            float gm = -INFINITY;
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
                                const int64_t cu = col0 + (int64_t)u * RP_THREADS * VEC;
#pragma unroll
                                for (int e = 0; e < VEC; e++) {
                                    xs[u][e] = cu + e == y ? -INFINITY : xs[u][e] * k2;
                                    gm = fmaxf(gm, xs[u][e]);
                                }
                            }
                            if (gm > m) { S *= rp_rescale(m, gm); m = gm; }
                            const float mu = m == -INFINITY ? 0.0f : m;   // -inf logits add 0, not NaN
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
#pragma unroll
                                for (int e = 0; e < VEC; e++) S += exp2f(xs[u][e] - mu);
                            }
                        });
                    rp_scalars(g, [&](int64_t col) {
                        if (col == y) return;
                        tgt_online(m, S, rp_sload(xrow + col) * k2);
                    });
                }
                const float2 v = tgt_block_ms(make_float2(m, S), sm);
                if (tid == 0) {
                    slotp[0] = v.x; slotp[1] = v.y;
                    __threadfence();
                    const int done = atomicAdd(a.cnt + r, 1);
                    s_merge = done == (int)a.sc.C - 1;
                }
                __syncthreads();
                if (s_merge && tid < 32) {
                    __threadfence();
                    float mm = -INFINITY, ss = 0.0f;
                    for (int64_t q = tid; q < a.sc.C; q += 32) {
                        const float om = __ldcg(row0 + q * 8), os = __ldcg(row0 + q * 8 + 1);
                        const float M = fmaxf(mm, om);
                        ss = ss * rp_rescale(mm, M) + os * rp_rescale(om, M);
                        mm = M;
                    }
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) {
                        const float om = __shfl_xor_sync(0xffffffffu, mm, off), os = __shfl_xor_sync(0xffffffffu, ss, off);
                        const float M = fmaxf(mm, om);
                        ss = ss * rp_rescale(mm, M) + os * rp_rescale(om, M);
                        mm = M;
                    }
                    if (tid == 0) {
                        float loss = 0.0f, lse = 0.0f, A = 0.0f, B = 0.0f, L2 = 0.0f;
                        if (!ign && valid) {
                            tgt_finish<MODE>(a, mm, ss, rp_sload(xrow + y), y, loss, lse, A, B, L2);
                        } else if (!ign) {   // out of range: NaN row, flag
                            loss = A = B = NAN;
                            L2 = mm + log2f(ss);
                            lse = L2 * RP_LN2;
                            tgt_flag(a);
                        }
                        row0[0] = L2; row0[1] = A; row0[2] = B;
                        if (a.lse) a.lse[r] = lse;
                        if (a.none) { if (a.loss) a.loss[r] = loss; }
                        else a.rowloss[r] = loss;
                        __threadfence();
                        atomicAdd(a.cnt + r, 1);
                    }
                }
            } else if (FUSED) {
                rp_wait(a.cnt + r, (int)a.sc.C + 1);
                if (ign) {
                    for (int64_t col = g.lo + tid; col < g.hi; col += RP_THREADS) drow[col] = from_float<T>(0.0f);
                } else {
                    const float L2 = __ldcg(row0), gr = tgt_grad(a, r);
                    const float gA = gr * __ldcg(row0 + 1), gB = gr * __ldcg(row0 + 2);
                    rp_stream<T, T, false, true, U>(xrow, nullptr, g,
                        [&](float (&xs)[U][VEC], float (&)[U][VEC], const bool (&in)[U], int64_t col0) {
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
                                const int64_t cu = col0 + (int64_t)u * RP_THREADS * VEC;
#pragma unroll
                                for (int e = 0; e < VEC; e++)
                                    xs[u][e] = cu + e == y ? gB : gA * exp2f(xs[u][e] * k2 - L2);
                                rp_vstore<T, VEC>(drow + cu, xs[u]);
                            }
                        });
                    rp_scalars(g, [&](int64_t col) {
                        drow[col] = from_float<T>(col == y ? gB : gA * exp2f(rp_sload(xrow + col) * k2 - L2));
                    });
                }
            }
        }
        __syncthreads();
        if (tid == 0) s_ticket = next;
        __syncthreads();
        t = s_ticket;
    }
}

// ---- rows of at most 32 KE classes: a warp a row, the row in registers ------------------------------
// The default since s23 for rows of C <= TW_MAX_C classes (FUSEDLOSS_TGT_WARP=0: the ticket kernel above).
// Why: the ticket kernel spends two tickets a row (statistics, then gradient), each with its atomics,
// fences, CTA barriers and a spin on the row's count; at small C that latency is the whole cost (H100 s23
// run 3, focal 8192x1000 fp32 step replayed from a CUDA graph: 0.267 ms = 12.1x the floor, torch.compile
// 0.075 ms). Here lane l of the row's warp holds columns l, l + 32, ... (scalar loads, coalesced across
// the warp, any alignment and stride), the non-target (m, S) by a shuffle tree, tgt_finish in every lane,
// and the gradient from the registers: one read, one write, no barrier. The row is in registers before any
// store, so in place is safe; x_y is read (one load) before the stores too. Same formulas as the ticket
// kernel; the sums run in another order, so the loss may differ from it in the last bits.
#define TW_WARPS 8
#define TW_MAX_C 4096
template <typename T, int MODE, bool FUSED, int KE>
__global__ void __launch_bounds__(TW_WARPS * 32) tgt_warp_kernel(TArgs a) {
    const int lane = (int)(threadIdx.x & 31);
    const int64_t nw = (int64_t)gridDim.x * TW_WARPS;
    const float k2 = a.k2;
    const int64_t V = a.V;
    for (int64_t r = (int64_t)blockIdx.x * TW_WARPS + (threadIdx.x >> 5); r < a.nrows; r += nw) {
        const T* xrow = (const T*)a.x + r * a.ld;
        float z[KE];
#pragma unroll
        for (int k = 0; k < KE; k++) {   // the loads first: none waits for the label
            const int64_t col = lane + 32 * k;
            z[k] = col < V ? to_float(xrow[col]) * k2 : -INFINITY;
        }
        const int64_t y = rp_label(a.tg, a.lab64, r);
        const bool ign = y == a.ignore;
        const bool valid = y >= 0 && y < V;
        const float xy = !ign && valid ? to_float(xrow[y]) : 0.0f;
        float m = -INFINITY;
#pragma unroll
        for (int k = 0; k < KE; k++) {
            if (lane + 32 * k == y) z[k] = -INFINITY;   // the non-target statistics
            m = fmaxf(m, z[k]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        const float mu = m == -INFINITY ? 0.0f : m;   // -inf logits add 0, not NaN
        float S = 0.0f;
#pragma unroll
        for (int k = 0; k < KE; k++) S += exp2f(z[k] - mu);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) S += __shfl_xor_sync(0xffffffffu, S, off);
        float loss = 0.0f, lse = 0.0f, A = 0.0f, B = 0.0f, L2 = 0.0f;
        if (ign) {
            S = 0.0f;   // (not used: an ignored row's loss, lse and gradient are 0)
        } else if (valid) {
            tgt_finish<MODE>(a, m, S, xy, y, loss, lse, A, B, L2);
        } else {   // out of range: NaN row, flag
            loss = A = B = NAN;
            L2 = m + log2f(S);
            lse = L2 * RP_LN2;
            if (lane == 0) tgt_flag(a);
        }
        if (lane == 0) {
            if (a.lse) a.lse[r] = lse;
            if (a.none) {
                if (a.loss) a.loss[r] = loss;
            } else {
                a.rowloss[r] = loss;
            }
        }
        if (FUSED) {
            T* drow = (T*)a.dx + r * a.ld;
            const float gr = ign ? 0.0f : tgt_grad(a, r);
            const float gA = gr * A, gB = gr * B;
#pragma unroll
            for (int k = 0; k < KE; k++) {
                const int64_t col = lane + 32 * k;
                if (col < V) drow[col] = from_float<T>(ign ? 0.0f : col == y ? gB : gA * exp2f(z[k] - L2));
            }
        }
    }
}

// ---- rows, sm_90: the staged one-read kernel (as distill.cu's) ------------------------------------
// The default for aligned rows of >= 1024 16-byte vectors (FUSEDLOSS_TGT_STAGED=0: the ticket
// kernel). H200 2026-12-02, session 4 run 1, ArcFace + CE 4096x100000 fp32 fwd + bwd: 1.768 ms
// (2.26x the floor) vs 2.248 ms on the ticket kernel; then the per-element column compare replaced
// by the owner's -inf lane (below), ex2.approx.ftz and two accumulators. A thread-block cluster of
// cs CTAs owns a row at a time; CTA `rank` stages vectors [rank * per, rank * per + n) of it in shared memory with per-thread cp.async (each thread reads only what it
// copied: no CTA barrier for the data), the next row's copies refill sub-chunk k once the thread is
// done with it. Per row: the non-target statistics (m, S) of the piece, one exchange over DSMEM
// (st.async + mbarrier), a rank-order merge (the same bits in every CTA), tgt_finish in every CTA
// from the merged (m, S) and x_y, then the gradient from shared memory. In place: every CTA loads
// x_y before it sends its partial, and no CTA writes gradient before it has every partial, so x_y
// is read before any CTA can overwrite it.
#define TS_THREADS RP_THREADS
#define TS_NS 2
#define TS_MAX_CLUSTER 16

template <typename T, int MODE, bool FUSED>
__global__ void __launch_bounds__(TS_THREADS, 3) tgt_staged_kernel(TArgs a, int cs, int per, int nv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int VEC = RpT<T>::VEC;
    extern __shared__ __align__(16) uint4 ts_buf[];   // [per] vectors of the row
    __shared__ __align__(8) uint64_t xb[2];
    __shared__ float4 sl[2][TS_MAX_CLUSTER];          // (m, S) partials by rank (slot parity)
    __shared__ float2 sm[TS_THREADS / 32];
    __shared__ float4 bc;                             // (L2, A, B) of the row, for every thread
    const int tid = (int)threadIdx.x;
    int rank = 0;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int64_t cid = blockIdx.x / cs, ncl = gridDim.x / cs;
    const int lo = rank * per;
    const int n = nv - lo < per ? (nv - lo > 0 ? nv - lo : 0) : per;
    const int sub = (n + TS_NS - 1) / TS_NS;
    const int tail = (int)(a.V - (int64_t)nv * VEC);
    const bool has_x = rank == 0 && tid < tail;
    const int64_t xcol = (int64_t)nv * VEC + tid;
    const bool xch = cs > 1;
    const float k2 = a.k2;

    if (tid == 0) {
        mbar_init(&xb[0], 1u); mbar_init(&xb[1], 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (xch) cg::this_cluster().sync();   // why: barriers initialised and every CTA started before DSMEM stores

    auto issue = [&](int64_t r, int k) {
        if (r < a.nrows) {
            const uint4* xrow = reinterpret_cast<const uint4*>((const T*)a.x + r * a.ld) + lo;
            const int qhi = (k + 1) * sub < n ? (k + 1) * sub : n;
            for (int q = k * sub + tid; q < qhi; q += TS_THREADS) cp_async16(ts_buf + q, xrow + q);
        }
        cp_commit();   // empty past the last row: the group count stays uniform
    };

    int64_t r = cid;
    for (int k = 0; k < TS_NS; k++) issue(r, k);
    // the row's scalars a row ahead (the target), or at the row's start (x_y, the upstream
    // gradient; the denominator once): their load latency behind the sweeps, not before them
    const float Dd = a.Ddev ? __ldcg(a.Ddev) : 1.0f;   // tgt_grad's denominator (reductions)
    int64_t y_next = r < a.nrows ? rp_label(a.tg, a.lab64, r) : 0;
    int e = 0;
    for (; r < a.nrows; r += ncl) {
        const int64_t rn = r + ncl;
        const T* xrow = (const T*)a.x + r * a.ld;
        const int64_t y = y_next;
        if (rn < a.nrows) y_next = rp_label(a.tg, a.lab64, rn);
        const bool ign = y == a.ignore;
        const bool valid = y >= 0 && y < a.V;
        const float xy = (tid == 0 && !ign && valid) ? rp_sload(xrow + y) : 0.0f;   // before the exchange
        float gr0 = FUSED ? tgt_upstream(a, r) : 0.0f;   // = tgt_grad(a, r)
        if (!a.none) gr0 = gr0 / Dd;
        const int x = e & 1;
        const uint32_t xpar = (uint32_t)((e >> 1) & 1);
        e++;

        // ---- non-target statistics of the piece
        // the target column: its vector qy (if this CTA holds it) is copied, and then read, by one
        // thread only (`own`), which overwrites the target lane vy with -inf in shared memory once
        // the copy has landed, so neither sweep compares columns: the statistics sweep adds 0 for it,
        // the gradient sweep writes 0 there and the owner then stores the target's gradient over it
        const int64_t qy64 = valid ? y / VEC - lo : -1;
        const int qy = qy64 >= 0 && qy64 < n ? (int)qy64 : -1;
        const int vy = valid ? (int)(y % VEC) : 0;
        const int ky = qy >= 0 ? qy / sub : -1;   // its sub-chunk
        const bool own = qy >= 0 && (qy - ky * sub) % TS_THREADS == tid;
        // two (m, S) accumulators (even / odd vectors): two independent chains
        float m = -INFINITY, S = 0.0f, m1 = -INFINITY, S1 = 0.0f;
        auto accv = [&](float& m, float& S, int q) {
            float z[VEC];
            rp_unpack<T>(ts_buf[q], z);
            float gm = z[0];
#pragma unroll
            for (int v = 1; v < VEC; v++) gm = fmaxf(gm, z[v]);
            gm *= k2;   // k2 > 0: the max of the scaled values (-inf stays -inf)
            if (gm > m) { S *= rp_rescale(m, gm); m = gm; }
            const float mu = m == -INFINITY ? 0.0f : m;   // -inf columns (masked logits) add 0, not NaN
            float t0 = 0.0f, t1 = 0.0f;
#pragma unroll
            for (int v = 0; v < VEC; v += 2) {
                t0 += fexp2(fmaf(z[v], k2, -mu));
                t1 += fexp2(fmaf(z[v + 1], k2, -mu));
            }
            S += t0 + t1;
        };
#pragma unroll
        for (int k = 0; k < TS_NS; k++) {
            cp_wait(FUSED ? TS_NS - 1 - k : TS_NS - 1);
            if (own && k == ky) reinterpret_cast<T*>(ts_buf + qy)[vy] = from_float<T>(-INFINITY);
            const int qhi = (k + 1) * sub < n ? (k + 1) * sub : n;
            int q = k * sub + tid;
            for (; q + TS_THREADS < qhi; q += 2 * TS_THREADS) { accv(m, S, q); accv(m1, S1, q + TS_THREADS); }
            if (q < qhi) accv(m, S, q);
            if (!FUSED) issue(rn, k);
        }
        {
            const float M = fmaxf(m, m1);
            S = M == -INFINITY ? 0.0f : S * rp_rescale(m, M) + S1 * rp_rescale(m1, M);
            m = M;
        }
        if (has_x && xcol != y) tgt_online(m, S, rp_sload(xrow + xcol) * k2);
        float2 v = tgt_block_ms(make_float2(m, S), sm);
        if (tid == 0) {
            if (xch) {
                mbar_arrive_tx(&xb[x], (uint32_t)cs * 16u);
                const uint32_t ls = smem_addr(&sl[x][rank]), lb = smem_addr(&xb[x]);
                const float4 mine = make_float4(v.x, v.y, 0.0f, 0.0f);
                for (int c = 0; c < cs; c++) st_async_f4(mapa_shared(ls, c), mine, mapa_shared(lb, c));
            }
            // the target's terms while the partials are in flight (margin: acos / cos / sin; focal:
            // the alpha_y load), off the path from the exchange to the gradient sweep
            float zy2 = 0.0f, dphi = 1.0f, al = 1.0f;
            if (!ign && valid) tgt_target<MODE>(a, xy, y, zy2, dphi, al);
            if (xch) {
                // slot x is next written two rows later, which no CTA starts before it has this CTA's
                // partial of the row in between, sent after the reads below
                mbar_wait_cluster(&xb[x], xpar);
                v = make_float2(sl[x][0].x, sl[x][0].y);
                for (int c = 1; c < cs; c++) {   // rank order
                    const float om = sl[x][c].x, os = sl[x][c].y;
                    const float M = fmaxf(v.x, om);
                    v.y = v.y * rp_rescale(v.x, M) + os * rp_rescale(om, M);
                    v.x = M;
                }
            }
            float loss = 0.0f, lse = 0.0f, A = 0.0f, B = 0.0f, L2 = 0.0f;
            if (!ign && valid) {
                tgt_finish_t<MODE>(a, v.x, v.y, zy2, dphi, al, loss, lse, A, B, L2);
            } else if (!ign) {   // out of range: NaN row, flag
                loss = A = B = NAN;
                L2 = v.x + log2f(v.y);
                lse = L2 * RP_LN2;
            }
            if (rank == 0) {
                if (!ign && !valid) tgt_flag(a);
                if (a.lse) a.lse[r] = lse;
                if (a.none) { if (a.loss) a.loss[r] = loss; }
                else a.rowloss[r] = loss;
            }
            bc = make_float4(L2, A, B, 0.0f);
        }
        __syncthreads();   // why: bc written; sm free again

        if (FUSED) {
            T* drow = (T*)a.dx + r * a.ld;
            const float gr = ign ? 0.0f : gr0;   // loaded at the row's start
            const float L2 = bc.x, gA = gr * bc.y, gB = gr * bc.z;
            // every element as a non-target one (one FFMA + ex2 + FMUL; the target lane reads -inf and
            // gives 0), the target's gradient stored over it by its owner after the sweep; an ignored
            // row writes zeros (a uniform branch per vector)
            auto one = [&](int q) {
                float z[VEC];
                rp_unpack<T>(ts_buf[q], z);
                if (ign) {
#pragma unroll
                    for (int v2 = 0; v2 < VEC; v2++) z[v2] = 0.0f;
                } else {
#pragma unroll
                    for (int v2 = 0; v2 < VEC; v2++) z[v2] = gA * fexp2(fmaf(z[v2], k2, -L2));
                }
                rp_vstore<T, VEC>(drow + (int64_t)(lo + q) * VEC, z);
            };
#pragma unroll
            for (int k = 0; k < TS_NS; k++) {
                const int qhi = (k + 1) * sub < n ? (k + 1) * sub : n;
                int q = k * sub + tid;
                // two vectors an iteration: two shared loads in flight behind each other's math
                for (; q + TS_THREADS < qhi; q += 2 * TS_THREADS) { one(q); one(q + TS_THREADS); }
                if (q < qhi) one(q);
                issue(rn, k);
            }
            if (own && !ign) drow[y] = from_float<T>(gB);   // after this thread's store of its vector
            if (has_x)
                drow[xcol] = from_float<T>(ign ? 0.0f : xcol == y ? gB : gA * exp2f(rp_sload(xrow + xcol) * k2 - L2));
        }
    }
    cp_wait(0);
    if (xch) cg::this_cluster().sync();   // why: this CTA's own st.async to the others may be in flight
#else
    __trap();  // chosen only on sm_90+
#endif
}

// ---- positions: one thread per (n, k), the C classes at stride d --------------------------------------
template <typename T, int MODE, bool FUSED>
__global__ void __launch_bounds__(RP_THREADS) tgt_pos_kernel(TArgs a) {
    const int64_t P = a.nrows;
    for (int64_t pos = (int64_t)blockIdx.x * RP_THREADS + threadIdx.x; pos < P; pos += (int64_t)gridDim.x * RP_THREADS) {
        const int64_t n = pos / a.d, k = pos % a.d;
        const T* xp = (const T*)a.x + n * a.ld + k;
        const int64_t y = rp_label(a.tg, a.lab64, pos);
        float loss = 0.0f;
        if (y == a.ignore) {
            if (FUSED) {
                T* dp = (T*)a.dx + n * a.ld + k;
                for (int64_t c = 0; c < a.V; c++) dp[c * a.d] = from_float<T>(0.0f);
            }
        } else if (y < 0 || y >= a.V) {
            loss = NAN;
            tgt_flag(a);
            if (FUSED) {
                T* dp = (T*)a.dx + n * a.ld + k;
                for (int64_t c = 0; c < a.V; c++) dp[c * a.d] = from_float<T>(NAN);
            }
        } else {
            float m = -INFINITY, S = 0.0f;
            for (int64_t c = 0; c < a.V; c++) {
                if (c == y) continue;
                tgt_online(m, S, to_float(xp[c * a.d]) * a.k2);
            }
            float lse, A, B, L2;
            tgt_finish<MODE>(a, m, S, to_float(xp[y * a.d]), y, loss, lse, A, B, L2);
            if (FUSED) {
                const float gr = tgt_grad(a, pos), gA = gr * A, gB = gr * B;
                T* dp = (T*)a.dx + n * a.ld + k;
                for (int64_t c = 0; c < a.V; c++) {
                    const float v = c == y ? gB : gA * exp2f(to_float(xp[c * a.d]) * a.k2 - L2);
                    dp[c * a.d] = from_float<T>(v);   // in place: this element was read just above
                }
            }
        }
        if (a.none) { if (a.loss) a.loss[pos] = loss; }
        else a.rowloss[pos] = loss;
    }
}

// ---- positions with few classes (C <= CMAX <= 64), PV = 1 / 2 / 4 adjacent positions a thread: the
// C values of each position in registers, loaded together (independent loads in flight), one read and
// one write of the logits. Kept lean (it was ~60 instructions a class, 2.43x the floor at
// 8x19x512x1024 fp32, H200 2026-12-02 s5 run 4): class addresses by pointer steps of d (no 64-bit
// multiply a class), the target's register set to -inf so that the max, the sum and the gradient
// sweep need no per-class target test kept alive (the target's gradient is stored over the sweep's 0
// afterwards, as the rows kernels do), 32-bit position arithmetic when it fits, the reductions'
// upstream gradient once a thread. PV > 1: d, the batch stride and both pointers multiples of PV
// elements, so the PV positions share n and every class is one PV-wide load and store (fewer
// instructions an element, PV x the bytes a warp takes from each class row). Each lane keeps its own
// label, statistics and coefficients; lanes that are ignored or out of range are computed like the
// others on whatever they hold and replaced by 0 / NaN at the store (selects, never a product with a
// stale value). PV = 1 was a kernel of its own (tgt_pos_reg_kernel) until 2026-12-04; it had the
// label-before-loads latency described in the kernel.
template <typename T, int PV>
__device__ __forceinline__ void pv_load(const T* p, float (&o)[PV]) {
    if constexpr (PV == 1) o[0] = to_float(*p);
    else if constexpr (sizeof(T) == 4) {
        if constexpr (PV == 2) { const float2 u = *(const float2*)p; o[0] = u.x; o[1] = u.y; }
        else { const float4 u = *(const float4*)p; o[0] = u.x; o[1] = u.y; o[2] = u.z; o[3] = u.w; }
    } else {
        if constexpr (PV == 2) { const float2 f = rp_u2f(*(const unsigned*)p, T()); o[0] = f.x; o[1] = f.y; }
        else {
            const uint2 u = *(const uint2*)p;
            const float2 f0 = rp_u2f(u.x, T()), f1 = rp_u2f(u.y, T());
            o[0] = f0.x; o[1] = f0.y; o[2] = f1.x; o[3] = f1.y;
        }
    }
}
template <typename T>
__device__ __forceinline__ unsigned pv_pack2(float a, float b) {
    const T lo = from_float<T>(a), hi = from_float<T>(b);
    return (unsigned)*reinterpret_cast<const unsigned short*>(&lo) | ((unsigned)*reinterpret_cast<const unsigned short*>(&hi) << 16);
}
template <typename T, int PV>
__device__ __forceinline__ void pv_store(T* p, const float (&f)[PV]) {
    if constexpr (PV == 1) *p = from_float<T>(f[0]);
    else if constexpr (sizeof(T) == 4) {
        if constexpr (PV == 2) *(float2*)p = make_float2(f[0], f[1]);
        else *(float4*)p = make_float4(f[0], f[1], f[2], f[3]);
    } else {
        if constexpr (PV == 2) *(unsigned*)p = pv_pack2<T>(f[0], f[1]);
        else *(uint2*)p = make_uint2(pv_pack2<T>(f[0], f[1]), pv_pack2<T>(f[2], f[3]));
    }
}

// PM (position mode; FUSEDLOSS_FOCAL_POS_MODE=0 takes PM 0; since s24 a SUM takes PM 1, a MEAN PM 2, and
// since s26 a fused MEAN PM 4):
// 1, the SUM / MEAN partials a warp
// tile (32 PV positions: double sums in lane order, one float a tile at rowloss[g / 32], so the
// reduction reads 1 / (32 PV) of the per-position losses; the order is fixed by the positions and
// PV), and a PDL launch after a MEAN's count (pdl_wait: a no-op otherwise); 0: one float a position
// (the kernels of s23). H100 s24 run 2, focal 8x19x512x1024 fp32 MEAN step in GPU time: 0.300-0.301
// (PM 0) -> 0.281-0.284 ms (1.36-1.38x -> 1.32-1.33x); evict-first logits and dlogits on top (so that
// the labels the count read stay in L2) 0.309-0.310 ms: slower, not kept.
// PM 2 (MEAN's default since s24 run 5; FUSEDLOSS_FOCAL_POS_CODES=0: PM 1): PM 1 reading each
// position's label as the byte tgt_codes_kernel (the MEAN's count) wrote in the workspace's counter
// region (a.cnt, unused by the position kernels) instead of the caller's 4- or 8-byte label: 4.2 MB
// instead of 33.5 MB of int64 labels at 8x19x512x1024, written by a kernel that reads them anyway.
// H100 s24 run 5, focal NCHW fp32 MEAN step in GPU time: 0.272 -> 0.264 ms (1.29 -> 1.25x), twice.
#define TGT_CODE_BAD 126u   // a label out of [0, C) that is not ignore_index (C <= 64 here)
#define TGT_CODE_IGN 127u   // ignore_index
// PM 3 (a fused MEAN's default; session 25, the default since s27): PM 2 without rp_count_final. The codes
// kernel triggers its dependents at its top, so this kernel's CTAs become resident while it runs; each
// prefetches its first positions' class lines into L2, waits (griddepcontrol.wait: the codes kernel
// complete and its writes visible), and its warp 0 sums the count's parts itself (the fixed ranges of
// rp_red_blocks(P), integers: the same D in every CTA); CTA 0 stores D for the loss reduction. One
// launch and its gap fewer, and the first tile's loads under the codes kernel.
// PM 4 (FUSEDLOSS_FOCAL_POS_FOLD=1; the default in s26 only, slower on the H200; POS_EARLY=0: PM 2): PM 3 with
// the loss reduction folded in (no rp_reduce_kernel / rp_reduce_final, two launches and their gaps fewer).
// Each warp adds its tiles' double sums in its loop's order, each CTA its warps' in warp order into a
// double part; the last CTA of each group of blockDim CTAs (a ticket a group) adds the group's parts in a
// fixed order, and the last group (one more ticket) the groups' sums, and writes loss[0] = sum / D. The
// tickets (ng + 1 unsigned at the start of the rowloss region, then the parts) are zeroed by the codes
// kernel, which completes before any CTA passes pdl_wait. The order depends on the grid (the device's
// residency), not on timing: deterministic on a GPU.
__device__ __forceinline__ double tgt_cta_sum(double v, double* sw) {   // fixed order; valid in thread 0
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sw[threadIdx.x >> 5] = v;
    __syncthreads();   // why: the warps' sums for thread 0
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += sw[w];
    return s;
}
template <typename T, int CMAX, int PV, bool FUSED, int PM = 0>
__global__ void __launch_bounds__(RP_THREADS) tgt_pos_vec_kernel(TArgs a) {
    constexpr bool TILES = PM >= 1, CODES = PM >= 2, EARLY = PM >= 3, FOLD = PM == 4;
    if constexpr (TILES && !EARLY) pdl_wait();   // launched with PDL after a MEAN's count (a no-op otherwise)
    const int64_t P = a.nrows, d = a.d, G = P / PV;   // P, d multiples of PV (host)
    const int C = (int)a.V;
    const bool small = P <= (int64_t)0xFFFFFFFF && d <= (int64_t)0xFFFFFFFF;
    float gred = FUSED && !a.none && !EARLY ? tgt_grad(a, 0) : 0.0f;
    float den = 0.0f;   // EARLY: the count D (FOLD's mean)
    if constexpr (EARLY) {
        __shared__ float s_den;
        const int64_t g0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (g0 < G) {
            const int64_t pos = g0 * PV, n0 = pos / d;
            const T* xp = (const T*)a.x + n0 * a.ld + (pos - n0 * d);
            for (int c = 0; c < C; c++) asm volatile("prefetch.global.L2 [%0];" ::"l"(xp + (int64_t)c * d));
        }
        pdl_wait();
        if (threadIdx.x < 32) {
            const long long* part = (const long long*)a.part;
            const int nb = rp_red_blocks(P);
            long long s = 0;
            for (int k = (int)threadIdx.x; k < nb; k += 32) s += __ldcg(part + k);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (threadIdx.x == 0) {
                s_den = (float)s;
                if (!FOLD && blockIdx.x == 0) *(float*)a.Ddev = (float)s;   // the workspace's D (rp_reduce_final)
            }
        }
        __syncthreads();   // why: s_den from warp 0
        gred = tgt_upstream(a, 0) / s_den;
        den = s_den;
    }
    const float k2 = RP_LOG2E;
    double wacc = 0.0;   // FOLD: lane 0's sum of its warp's tiles
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < G; g += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pos = g * PV;
        int64_t n, k;
        if (small) {
            const uint32_t n32 = (uint32_t)pos / (uint32_t)d;
            n = n32;
            k = pos - (int64_t)n32 * d;
        } else {
            n = pos / d;
            k = pos - n * d;
        }
        const int64_t off = n * a.ld + k;
        const T* xp = (const T*)a.x + off;
        T* dp = FUSED ? (T*)a.dx + off : nullptr;
        // the class loads first, then the labels, with no branch on a label before the loads: a
        // branch (all PV positions ignored -> fill) had made each iteration wait for its labels
        // before its class loads, two memory latencies in series, and with the labels first in the
        // source ptxas schedules their tests and widening (which wait for them) ahead of the class
        // loads. Ignored / out-of-range positions are computed on what they hold and replaced by
        // 0 / NaN at the stores.
        float loss[PV];
        {
            float v[CMAX][PV];
            {
                const T* q = xp;
#pragma unroll
                for (int c = 0; c < CMAX; c++) {
                    if (c >= C) break;
                    pv_load<T, PV>(q, v[c]);
                    q += d;
                }
            }
            int yi[PV];
            bool ok[PV], bad[PV];
#pragma unroll
            for (int j = 0; j < PV; j++) {
                if constexpr (CODES) {   // tgt_codes_kernel's byte: the class, TGT_CODE_BAD or TGT_CODE_IGN
                    const int cd = ((const unsigned char*)a.cnt)[pos + j];
                    bad[j] = cd == TGT_CODE_BAD;
                    ok[j] = cd < TGT_CODE_BAD;
                    yi[j] = ok[j] ? cd : -1;
                } else {
                    const int64_t y = rp_label(a.tg, a.lab64, pos + j);
                    bad[j] = y != a.ignore && (y < 0 || y >= C);
                    ok[j] = y != a.ignore && !bad[j];
                    yi[j] = ok[j] ? (int)y : -1;   // -1: no class is the target
                }
                if (bad[j]) tgt_flag(a);
            }
            // the target's logit taken from the registers (a select a class) instead of a load that
            // waits for the label
            float xy[PV];
#pragma unroll
            for (int j = 0; j < PV; j++) xy[j] = 0.0f;
            float m[PV];
#pragma unroll
            for (int j = 0; j < PV; j++) m[j] = -INFINITY;
#pragma unroll
            for (int c = 0; c < CMAX; c++) {
                if (c >= C) break;
#pragma unroll
                for (int j = 0; j < PV; j++) {
                    const bool t = c == yi[j];
                    xy[j] = t ? v[c][j] : xy[j];
                    v[c][j] = t ? -INFINITY : v[c][j];
                    m[j] = fmaxf(m[j], v[c][j]);
                }
            }
            float mu[PV], m2[PV], S[PV];
#pragma unroll
            for (int j = 0; j < PV; j++) {
                m2[j] = m[j] * k2;
                mu[j] = m[j] == -INFINITY ? 0.0f : m2[j];
                S[j] = 0.0f;
            }
#pragma unroll
            for (int c = 0; c < CMAX; c++) {
                if (c >= C) break;
#pragma unroll
                for (int j = 0; j < PV; j++) S[j] += fexp2(fmaf(v[c][j], k2, -mu[j]));
            }
            float gA[PV], gB[PV], L2[PV], fill[PV];
#pragma unroll
            for (int j = 0; j < PV; j++) {
                float lse, A, B, l2, lj;
                tgt_finish<TC_FOCAL>(a, m2[j], S[j], xy[j], ok[j] ? yi[j] : 0, lj, lse, A, B, l2);
                loss[j] = ok[j] ? lj : bad[j] ? NAN : 0.0f;
                if (FUSED) {
                    const float gr = a.none ? tgt_grad(a, pos + j) : gred;
                    gA[j] = gr * A;
                    gB[j] = gr * B;
                    L2[j] = l2;
                    fill[j] = bad[j] ? NAN : 0.0f;
                }
            }
            if (FUSED) {
                int64_t ds;   // opaque copy of the step (see above)
                asm("mov.b64 %0, %1;" : "=l"(ds) : "l"(d));
                T* q = dp;
#pragma unroll
                for (int c = 0; c < CMAX; c++) {
                    if (c >= C) break;
                    float o[PV];
#pragma unroll
                    for (int j = 0; j < PV; j++) o[j] = ok[j] ? gA[j] * fexp2(fmaf(v[c][j], k2, -L2[j])) : fill[j];
                    pv_store<T, PV>(q, o);
                    q += ds;
                }
#pragma unroll
                for (int j = 0; j < PV; j++)   // over the sweep's 0, by the same thread
                    if (ok[j]) dp[(int64_t)yi[j] * d + j] = from_float<T>(gB[j]);
            }
        }
        if (TILES && !a.none) {
            // the tile's lanes are those with g < G: lane l holds g = (g & ~31) + l (blockDim and the
            // grid stride are multiples of 32), so the live lanes are 0 .. k - 1; a down-shuffle tree
            // that adds only live partners, in a fixed order
            double s = 0.0;
#pragma unroll
            for (int j = 0; j < PV; j++) s += (double)loss[j];
            const int64_t gw = g & ~(int64_t)31;
            const int k = G - gw < 32 ? (int)(G - gw) : 32, lane = (int)(threadIdx.x & 31);
            const unsigned mask = k == 32 ? 0xffffffffu : (1u << k) - 1u;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const double t = __shfl_down_sync(mask, s, o);
                if (lane + o < k) s += t;
            }
            if (lane == 0) {
                if constexpr (FOLD) wacc += s;
                else a.rowloss[gw >> 5] = (float)s;
            }
        } else {
#pragma unroll
            for (int j = 0; j < PV; j++) {
                if (a.none) { if (a.loss) a.loss[pos + j] = loss[j]; }
                else a.rowloss[pos + j] = loss[j];
            }
        }
    }
    if constexpr (FOLD) {   // (a fused MEAN: a.loss is the scalar loss here, a.none 0)
        __shared__ double s_w[RP_THREADS / 32];
        __shared__ int s_last, s_top;
        const unsigned nt = blockDim.x, grp = blockIdx.x / nt;
        const unsigned ng = (gridDim.x + nt - 1) / nt;
        unsigned* tk = (unsigned*)a.rowloss;   // ng group tickets, the top ticket
        double* part = (double*)a.rowloss + (ng + 2) / 2;   // gridDim.x CTA sums, then ng group sums
        double* gpart = part + gridDim.x;
        double s = tgt_cta_sum((threadIdx.x & 31) == 0 ? wacc : 0.0, s_w);
        if (threadIdx.x == 0) {
            part[blockIdx.x] = s;
            __threadfence();   // why: the part before the ticket that lets another CTA read it
            const unsigned gsz = gridDim.x - grp * nt < nt ? gridDim.x - grp * nt : nt;
            s_last = atomicAdd(tk + grp, 1u) == gsz - 1;
        }
        __syncthreads();   // why: s_last; s_w read by thread 0 before the next writes
        if (s_last) {   // the group's last CTA: its parts in order
            __threadfence();
            const unsigned i = grp * nt + threadIdx.x;
            s = tgt_cta_sum(i < gridDim.x ? __ldcg(part + i) : 0.0, s_w);
            if (threadIdx.x == 0) {
                gpart[grp] = s;
                __threadfence();
                s_top = atomicAdd(tk + ng, 1u) == ng - 1;
            }
            __syncthreads();   // why: s_top; s_w read by thread 0
            if (s_top) {   // the last group: the groups' sums in order, the mean
                __threadfence();
                double v = 0.0;
                for (unsigned k = threadIdx.x; k < ng; k += nt) v += __ldcg(gpart + k);
                s = tgt_cta_sum(v, s_w);
                if (threadIdx.x == 0) {
                    const double D = (double)den;
                    a.loss[0] = D == 0.0 ? NAN : (float)(s / D);
                }
            }
        }
    }
}

// The MEAN's count for PM 2: rp_count_kernel's count of the labels != ignore (the same ranges and block
// sums, so the same part[] for rp_count_final) that also writes each label's code byte (class,
// TGT_CODE_BAD, TGT_CODE_IGN) to codes[], 4 bytes a store on the vector path (ranges start at
// multiples of 4; codes is 256-byte aligned).
__device__ __forceinline__ unsigned tgt_code(int64_t y, int64_t ignore, int64_t C) {
    return y == ignore ? TGT_CODE_IGN : ((uint64_t)y >= (uint64_t)C) ? TGT_CODE_BAD : (unsigned)y;
}
// code of y into byte b of *word, counted in *c when not ignored
__device__ __forceinline__ void tgt_code_acc(int64_t y, int64_t ignore, int64_t C, int b, unsigned* word, long long* c) {
    const unsigned k = tgt_code(y, ignore, C);
    *c += k != TGT_CODE_IGN;
    *word |= k << (8 * b);
}
#define TGT_CODES_T 512   // (at 1024 threads ptxas held it to 32 registers and spilled)
// TRIGGER (PM 3 / 4): its dependent (the position kernel, PDL) may start at once. U2 (FUSEDLOSS_FOCAL_CODES_U=2,
// session 25): int64 labels, two 4-label groups a thread loaded before either is coded (64 instead of 32
// bytes a thread in flight; 2 CTAs of 512 an SM hold ~32 KB in flight at U 1, about what the H200's
// per-SM share of HBM needs at ~1 us of loaded latency). Integers: the same count and codes either way.
template <bool TRIGGER = false, bool U2 = false>
static __global__ void __launch_bounds__(TGT_CODES_T) tgt_codes_kernel(const void* labels, int lab64, int64_t ignore, int64_t C,
                                                                int64_t n, unsigned char* codes, long long* part,
                                                                unsigned* tk, int ntk) {
    if constexpr (TRIGGER) {
        pdl_trigger();
        if (blockIdx.x == 0)   // PM 4: the position kernel's tickets (read after its pdl_wait)
            for (int k = (int)threadIdx.x; k < ntk; k += TGT_CODES_T) tk[k] = 0u;
    }
    const int64_t per = ((n + gridDim.x - 1) / gridDim.x + 3) & ~(int64_t)3, lo = (int64_t)blockIdx.x * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    long long c = 0;
    int64_t i0 = lo;
    if (((uintptr_t)labels & 15u) == 0 && lo < hi) {
        const int64_t nq = (hi - lo) / 4;
        unsigned* cq = (unsigned*)(codes + lo);
        if (lab64) {
            const longlong2* q = (const longlong2*)((const long long*)labels + lo);
            int64_t g = threadIdx.x;
            if constexpr (U2) {
                for (; g + TGT_CODES_T < nq; g += 2 * TGT_CODES_T) {
                    const int64_t h = g + TGT_CODES_T;
                    const longlong2 u = q[2 * g], w = q[2 * g + 1], u2 = q[2 * h], w2 = q[2 * h + 1];
                    unsigned word = 0, word2 = 0;
                    tgt_code_acc(u.x, ignore, C, 0, &word, &c);
                    tgt_code_acc(u.y, ignore, C, 1, &word, &c);
                    tgt_code_acc(w.x, ignore, C, 2, &word, &c);
                    tgt_code_acc(w.y, ignore, C, 3, &word, &c);
                    tgt_code_acc(u2.x, ignore, C, 0, &word2, &c);
                    tgt_code_acc(u2.y, ignore, C, 1, &word2, &c);
                    tgt_code_acc(w2.x, ignore, C, 2, &word2, &c);
                    tgt_code_acc(w2.y, ignore, C, 3, &word2, &c);
                    cq[g] = word;
                    cq[h] = word2;
                }
            }
            for (; g < nq; g += TGT_CODES_T) {
                const longlong2 u = q[2 * g], w = q[2 * g + 1];
                unsigned word = 0;
                tgt_code_acc(u.x, ignore, C, 0, &word, &c);
                tgt_code_acc(u.y, ignore, C, 1, &word, &c);
                tgt_code_acc(w.x, ignore, C, 2, &word, &c);
                tgt_code_acc(w.y, ignore, C, 3, &word, &c);
                cq[g] = word;   // default-cached: the main kernel reads them next
            }
        } else {
            const int4* q = (const int4*)((const int*)labels + lo);
            for (int64_t g = threadIdx.x; g < nq; g += TGT_CODES_T) {
                const int4 u = q[g];
                unsigned word = 0;
                tgt_code_acc(u.x, ignore, C, 0, &word, &c);
                tgt_code_acc(u.y, ignore, C, 1, &word, &c);
                tgt_code_acc(u.z, ignore, C, 2, &word, &c);
                tgt_code_acc(u.w, ignore, C, 3, &word, &c);
                cq[g] = word;
            }
        }
        i0 = lo + 4 * nq;
    }
    for (int64_t i = i0 + threadIdx.x; i < hi; i += TGT_CODES_T) {
        const unsigned k = tgt_code(rp_label(labels, lab64, i), ignore, C);
        c += k != TGT_CODE_IGN;
        codes[i] = (unsigned char)k;
    }
    c = rp_block_sum<long long, TGT_CODES_T>(c);
    if (threadIdx.x == 0) part[blockIdx.x] = c;
}

// ---- host side ----------------------------------------------------------------------------------
typedef void (*tk_fn)(TArgs);

template <typename T>
static tk_fn pick_t(int mode, bool rows, bool fused) {
    if (mode == TC_MARGIN)
        return rows ? (fused ? tgt_rows_kernel<T, TC_MARGIN, true> : tgt_rows_kernel<T, TC_MARGIN, false>)
                    : (fused ? tgt_pos_kernel<T, TC_MARGIN, true> : tgt_pos_kernel<T, TC_MARGIN, false>);
    return rows ? (fused ? tgt_rows_kernel<T, TC_FOCAL, true> : tgt_rows_kernel<T, TC_FOCAL, false>)
                : (fused ? tgt_pos_kernel<T, TC_FOCAL, true> : tgt_pos_kernel<T, TC_FOCAL, false>);
}
// one position kernel, fused or not; PM 3 / 4 exist fused only (host: a fused MEAN), so no unfused twin is built
template <typename T, int CMAX, int PV, int PM>
static tk_fn pos_k(bool fused) {
    if constexpr (PM >= 3) return tgt_pos_vec_kernel<T, CMAX, PV, true, PM>;
    else return fused ? tgt_pos_vec_kernel<T, CMAX, PV, true, PM> : tgt_pos_vec_kernel<T, CMAX, PV, false, PM>;
}
template <typename T, int PM>
static tk_fn pick_reg_pm(int64_t C, bool fused, int pv) {
    if (pv == 4) return C <= 8 ? pos_k<T, 8, 4, PM>(fused) : pos_k<T, 16, 4, PM>(fused);   // C <= 16 (pos_pv)
    if (pv == 2) {   // C <= 32
        if (C <= 8) return pos_k<T, 8, 2, PM>(fused);
        if (C <= 16) return pos_k<T, 16, 2, PM>(fused);
        return C <= 24 ? pos_k<T, 24, 2, PM>(fused) : pos_k<T, 32, 2, PM>(fused);
    }
    if (C <= 8) return pos_k<T, 8, 1, PM>(fused);
    if (C <= 16) return pos_k<T, 16, 1, PM>(fused);
    if (C <= 24) return pos_k<T, 24, 1, PM>(fused);
    return C <= 32 ? pos_k<T, 32, 1, PM>(fused) : pos_k<T, 64, 1, PM>(fused);
}
template <typename T>
static tk_fn pick_reg_t(int64_t C, bool fused, int pv, int pm) {
    if (pm == 4) return pick_reg_pm<T, 4>(C, fused, pv);
    if (pm == 3) return pick_reg_pm<T, 3>(C, fused, pv);
    if (pm == 2) return pick_reg_pm<T, 2>(C, fused, pv);
    return pm == 1 ? pick_reg_pm<T, 1>(C, fused, pv) : pick_reg_pm<T, 0>(C, fused, pv);
}
// Positions a thread of the focal position kernels (1 / 2 / 4): the widest the layout allows (d, the
// batch stride and the pointers multiples of it) and the registers (C <= 32 for 2, <= 16 for 4), up
// to FUSEDLOSS_FOCAL_PV (default 1 for fp32, 2 for 16-bit). fp32 at 1: with the class loads ahead of
// the labels, PV 1 (56 registers) beat PV 2 (92): 8x19x512x1024 fp32 0.185 vs 0.192 ms (H200 s14 run
// 5); 16-bit logits were not measured and keep PV 2 (a 4-byte load a class instead of 2 bytes).
static int pos_pv(const TArgs& a, size_t es, bool fused) {
    const int def = es == 4 ? 1 : 2;
    int want = (int)rp_env_i64("FUSEDLOSS_FOCAL_PV", def);
    if (want != 1 && want != 2 && want != 4) want = def;
    for (int pv = want; pv > 1; pv /= 2) {
        const uintptr_t al = (uintptr_t)pv * es - 1;
        if ((pv == 4 && a.V > 16) || a.V > 32) continue;
        if (a.d % pv || a.ld % pv || ((uintptr_t)a.x & al) || (fused && ((uintptr_t)a.dx & al))) continue;
        return pv;
    }
    return 1;
}
static tk_fn pick(fl_dtype dt, int mode, bool rows, bool fused, int64_t C, int pv, int pm) {
    if (mode == TC_FOCAL && !rows && C <= 64 && !getenv("FUSEDLOSS_FOCAL_NOREG")) {
        switch (dt) {
            case FL_DTYPE_F32: return pick_reg_t<float>(C, fused, pv, pm);
            case FL_DTYPE_F16: return pick_reg_t<__half>(C, fused, pv, pm);
            default: return pick_reg_t<__nv_bfloat16>(C, fused, pv, pm);
        }
    }
    switch (dt) {
        case FL_DTYPE_F32: return pick_t<float>(mode, rows, fused);
        case FL_DTYPE_F16: return pick_t<__half>(mode, rows, fused);
        default: return pick_t<__nv_bfloat16>(mode, rows, fused);
    }
}
// tgt_warp_kernel for the row length: 32 KE >= C columns (KE 8 / 32 / 64 / 128)
template <typename T, int MODE, bool FUSED>
static tk_fn pick_warp_mf(int64_t C) {
    if (C <= 256) return tgt_warp_kernel<T, MODE, FUSED, 8>;
    if (C <= 1024) return tgt_warp_kernel<T, MODE, FUSED, 32>;
    if (C <= 2048) return tgt_warp_kernel<T, MODE, FUSED, 64>;
    return tgt_warp_kernel<T, MODE, FUSED, 128>;
}
template <typename T>
static tk_fn pick_warp_t(int mode, bool fused, int64_t C) {
    if (mode == TC_MARGIN) return fused ? pick_warp_mf<T, TC_MARGIN, true>(C) : pick_warp_mf<T, TC_MARGIN, false>(C);
    return fused ? pick_warp_mf<T, TC_FOCAL, true>(C) : pick_warp_mf<T, TC_FOCAL, false>(C);
}
static tk_fn pick_warp(fl_dtype dt, int mode, bool fused, int64_t C) {
    switch (dt) {
        case FL_DTYPE_F32: return pick_warp_t<float>(mode, fused, C);
        case FL_DTYPE_F16: return pick_warp_t<__half>(mode, fused, C);
        default: return pick_warp_t<__nv_bfloat16>(mode, fused, C);
    }
}
static int g_occ[3][2][2][2][4][5];   // dtype, mode, rows, fused, register kernel (0: none, 1 + log2 PV), PM

template <typename T>
static const void* pick_staged_t(int mode, bool fused) {
    if (mode == TC_MARGIN)
        return fused ? (const void*)tgt_staged_kernel<T, TC_MARGIN, true> : (const void*)tgt_staged_kernel<T, TC_MARGIN, false>;
    return fused ? (const void*)tgt_staged_kernel<T, TC_FOCAL, true> : (const void*)tgt_staged_kernel<T, TC_FOCAL, false>;
}

// The staged kernel's plan (0: not taken): on by default (FUSEDLOSS_TGT_STAGED=0 off), sm_90,
// rows whose body is 16-byte aligned with >= 1024 vectors, <= FUSEDLOSS_TGT_STAGED_KB (72)
// of a row per CTA in clusters of <= 16. Returns the resident clusters; knobs read on every call.
struct TsPlan { int cs, per, nv; size_t smem; const void* fn; };
static int ts_plan(const TArgs& a, int mode, bool fused, fl_dtype dt, TsPlan* out) {
    const char* knob = getenv("FUSEDLOSS_TGT_STAGED");
    if ((knob && *knob && atoi(knob) <= 0) || a.nrows <= 0) return 0;
    DevInfo d;
    if (dev_info(&d) != cudaSuccess || d.cc_major < 9) { (void)cudaGetLastError(); return 0; }
    const int64_t es = (int64_t)fl__dtype_size(dt), VEC = 16 / es;
    if (((uintptr_t)a.x & 15u) || (a.dx && ((uintptr_t)a.dx & 15u)) || (a.ld * es) % 16) return 0;
    const int64_t nv = a.V / VEC;
    if (nv < 4 * TS_THREADS) return 0;
    int kb = (int)rp_env_i64("FUSEDLOSS_TGT_STAGED_KB", 72);
    if (kb < 8 || kb > 200) kb = 72;
    const int64_t chunk = (int64_t)kb * 1024 / 16;
    int cs = 1;
    while ((int64_t)cs * chunk < nv && cs < TS_MAX_CLUSTER) cs *= 2;
    if ((int64_t)cs * chunk < nv) return 0;
    // (a variant that refilled the buffer with the next row during the statistics sweep and read
    // the row for the gradient from L2, FUSEDLOSS_TGT_STAGED_L2G, measured 27% SLOWER: ArcFace
    // 1.87 vs 1.47 ms, H200 2026-12-02 s5 run 1; removed)
    const int fcs = (int)rp_env_i64("FUSEDLOSS_TGT_STAGED_CS", 0);   // A/B: any cluster size 2..16
    if (fcs >= 2 && fcs <= TS_MAX_CLUSTER && (nv + fcs - 1) / fcs * 16 <= 200 * 1024) cs = fcs;
    out->cs = cs;
    out->nv = (int)nv;
    out->per = (int)((nv + cs - 1) / cs);
    out->smem = (size_t)out->per * 16u;
    switch (dt) {
        case FL_DTYPE_F32: out->fn = pick_staged_t<float>(mode, fused); break;
        case FL_DTYPE_F16: out->fn = pick_staged_t<__half>(mode, fused); break;
        default: out->fn = pick_staged_t<__nv_bfloat16>(mode, fused); break;
    }
    int n = 0;
    if (fl__cluster_occupancy(out->fn, cs, TS_THREADS, out->smem, d.sms, (int)rp_env_i64("FUSEDLOSS_DEBUG", 0),
                              "staged target-loss kernel", &n) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return 0;
    }
    const int gcap = (int)rp_env_i64("FUSEDLOSS_TGT_STAGED_GRID", 0);   // tests: several rows per cluster
    if (gcap > 0 && n > gcap) n = gcap;
    return n;
}

// The common launch of both losses. nrows: rows (N) or positions (N d); rows: the chunked kernel.
static fl_status tgt_cuda(const char* fn, TArgs& a, int mode, bool rows, bool fused, fl_dtype dt,
                          fl_reduction red, float* loss, const void* x, const void* dx, void* workspace,
                          cudaStream_t stream) {
    const int64_t n = a.nrows;
    const int none = red == FL_REDUCTION_NONE;
    char* ws = (char*)workspace;
    const size_t a4 = ((size_t)4 * (size_t)n + 255u) & ~(size_t)255u;
    const size_t a8 = ((size_t)8 * (size_t)n + 255u) & ~(size_t)255u;
    float* Dslot = (float*)(ws + 16);
    const size_t es = fl__dtype_size(dt);
    if (((uintptr_t)x % es) || (dx && ((uintptr_t)dx % es)))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logits and dlogits must be aligned to their element size (%p, %p)",
                        fn, x, dx);
    a.rowloss = (float*)(ws + 256);
    a.cnt = (int*)(ws + 256 + a4);
    a.part = (float*)(ws + 256 + a4 + a8);
    a.loss = none ? loss : nullptr;
    a.none = none;
    a.Ddev = red == FL_REDUCTION_MEAN ? Dslot : nullptr;
    if (n == 0) {
        if (!none && loss) {
            FL_CUDA_TRY(rp_reduce(a.rowloss, 0, a.part, nullptr, red == FL_REDUCTION_SUM ? 1.0f : 0.0f, loss, stream));
        }
        return FL_OK;
    }
    // the focal position kernels' mode (tgt_pos_vec_kernel PM: 1 for SUM / NONE, 2 for MEAN, 0 the s23
    // kernels); with PM >= 1 a MEAN's kernel starts under the count's final kernel (PDL) and waits for it
    // inside (FUSEDLOSS_FOCAL_POS_PDL=0: a plain launch)
    const int reg0 = mode == TC_FOCAL && !rows && a.V <= 64 && !getenv("FUSEDLOSS_FOCAL_NOREG");
    // PM 2 (a MEAN's default; FUSEDLOSS_FOCAL_POS_CODES=0 off): the count also writes the label codes the kernel reads
    int pm = reg0 && rp_env_flag("FUSEDLOSS_FOCAL_POS_MODE", 1) == 1 ? 1 : 0;
    if (pm == 1 && red == FL_REDUCTION_MEAN && rp_env_flag("FUSEDLOSS_FOCAL_POS_CODES", 1) == 1) pm = 2;
    // PM 3 (fused; FUSEDLOSS_FOCAL_POS_EARLY=0 off): PM 2 with the count summed in the position kernel
    if (pm == 2 && fused && rp_env_flag("FUSEDLOSS_FOCAL_POS_EARLY", 1) == 1) pm = 3;
    // PM 4 (FUSEDLOSS_FOCAL_POS_FOLD=1; the default in s26 only): the loss reduction in the position kernel.
    // H100 s26 run 1, focal NCHW 8x19x512x1024 fp32 step in GPU time, two alternations: PM 2 0.269 / 0.269 ms,
    // PM 3 0.266 / 0.266, PM 4 0.264 / 0.263. But on the H200 (s27 run 1, five alternations) PM 4 lost:
    // 0.203-0.206 ms against PM 3's 0.198-0.202, its position kernel 184 us against 174 (the per-CTA ticket
    // and its fence, which waits for the CTA's gradient stores, in ~4 k short CTAs). PM 3 is the default again.
    if (pm == 3 && loss && rp_env_flag("FUSEDLOSS_FOCAL_POS_FOLD", 0) == 1) pm = 4;
    // (s28, H100 runs 1-5, five tries at the step's last us, all lost or tied on the H100 and removed: PM 3 with its
    // CTA barrier on D deferred to the first tile's gradient through an mbarrier, position kernel 234 -> 244 us,
    // step 0.262-0.264 -> 0.265-0.269 ms; the first k tiles of each thread prefetched into L2 under the codes
    // kernel, k = 2 / 3 / 4: 0.273-0.279 / 0.305 / 0.324-0.327 ms; the codes kernel's label range bulk-prefetched
    // into L2, codes 18 -> 23 us; the loss's two reduction kernels as one last-CTA ticket kernel launched with PDL:
    // 0.262-0.265 ms in five pairs (a tie); the class values staged through shared memory by cp.async two tiles
    // ahead (two tiles a thread in flight at 64 registers), 0.275-0.279 ms at 8 waves and 0.281-0.286 ms with long
    // loops (1, 2, 4 waves, a 1024-CTA grid) against 0.265-0.267. NOTES.md "Session 28".)
    const bool pdl = pm >= 1 && red == FL_REDUCTION_MEAN && rp_env_flag("FUSEDLOSS_FOCAL_POS_PDL", 1) != 0;
    // PM >= 2: the codes kernel is launched right before the position kernel (below), once the grid, and so
    // PM 4's number of tickets, is known
    if (pm < 2 && red == FL_REDUCTION_MEAN) FL_CUDA_TRY(rp_count(a.tg, a.lab64, a.ignore, n, a.part, Dslot, stream, pdl));
    TsPlan tp;
    const int ncl = rows ? ts_plan(a, mode, fused, dt, &tp) : 0;
    const bool warp = !ncl && rows && a.V <= TW_MAX_C && rp_env_flag("FUSEDLOSS_TGT_WARP", 1) != 0;
    if (ncl || warp) {   // the staged cluster kernel, or a warp a row (tgt_warp_kernel); then the reduction
        if (ncl) {
            const int64_t G = n < ncl ? n : ncl;   // clusters: one per row up to what is resident
            void* args[] = {&a, &tp.cs, &tp.per, &tp.nv};
            FL_CUDA_TRY(fl__launch_clusters(tp.fn, args, G, tp.cs, TS_THREADS, tp.smem, stream));
        } else {
            pick_warp(dt, mode, fused, a.V)<<<(unsigned)((n + TW_WARPS - 1) / TW_WARPS), TW_WARPS * 32, 0, stream>>>(a);
            FL_CUDA_TRY(cudaGetLastError());
        }
        if (!none && loss) {
            FL_CUDA_TRY(rp_reduce(a.rowloss, n, a.part, a.Ddev, 1.0f, loss, stream));
        }
        return FL_OK;
    }
    const int pv = reg0 ? pos_pv(a, es, fused) : 1;
    const tk_fn kfn = pick(dt, mode, rows, fused, a.V, pv, pm);
    const int reg = reg0 ? (pv == 4 ? 3 : pv) : 0;
    int64_t resident = 0;
    FL_CUDA_TRY(rp_resident((const void*)kfn, &g_occ[(int)dt][mode][rows][fused][reg][pm], &resident));
    int64_t grid;
    int threads = RP_THREADS;
    if (rows) {
        FL_CUDA_TRY(cudaMemsetAsync(ws, 0, 16, stream));
        FL_CUDA_TRY(cudaMemsetAsync(a.cnt, 0, a8, stream));
        a.sc = rp_plan(n, a.V, fused ? 2 : 1, resident, (unsigned long long*)ws);
        grid = resident;
        if (grid > n * a.sc.C * a.sc.P) grid = n * a.sc.C * a.sc.P;
    } else if (reg) {   // the register position kernels: any CTA size <= RP_THREADS (blockDim-strided)
        // 128-thread CTAs by default: at PV 2 the kernel takes 92 registers, so an SM holds 2 CTAs
        // of 256 (16 warps) but 5 of 128 (20 warps); 8x19x512x1024 fp32 kernel 0.217 -> 0.206 ms
        // (1.42 -> 1.35x the floor; T = 192 0.211; H200 2026-12-04 s13 run 4)
        int t = (int)rp_env_i64("FUSEDLOSS_FOCAL_POS_THREADS", 128);
        if (t < 32 || t > RP_THREADS || t % 32) t = RP_THREADS;
        threads = t;
        resident = resident * RP_THREADS / t;   // the same threads in flight (rp_resident counts 256-thread CTAs)
        grid = (n / pv + t - 1) / t;   // pv divides n (d % pv == 0)
        if (grid > 8 * resident) grid = 8 * resident;   // (s27 run 2: 2 or 1 waves of longer CTAs lost, PM 3 and 4)
    } else {
        grid = (n + RP_THREADS - 1) / RP_THREADS;
        if (grid > 8 * resident) grid = 8 * resident;
    }
    if (grid < 1) grid = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid, 1, 1);
    cfg.blockDim = dim3((unsigned)threads, 1, 1);
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    set_pdl(&attr);
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;   // with PDL: after a MEAN's count (pdl above)
    if (pm >= 2) {   // codes in the counter region (8 bytes a position; the position kernels do not use it)
        // the TRIGGER twin for PM 3 with PDL and always for PM 4, whose ng + 1 tickets (FOLD) it zeroes
        const int nb = rp_red_blocks(n), ntk = pm == 4 ? (int)((grid + threads - 1) / threads) + 1 : 0;
        const bool trig = pm == 4 || (pm == 3 && pdl), u2 = rp_env_i64("FUSEDLOSS_FOCAL_CODES_U", 1) == 2;
        auto kc = trig ? (u2 ? tgt_codes_kernel<true, true> : tgt_codes_kernel<true, false>)
                       : (u2 ? tgt_codes_kernel<false, true> : tgt_codes_kernel<false, false>);
        kc<<<nb, TGT_CODES_T, 0, stream>>>(a.tg, a.lab64, a.ignore, a.V, n, (unsigned char*)a.cnt, (long long*)a.part,
                                           pm == 4 ? (unsigned*)a.rowloss : nullptr, ntk);
        if (pm == 2) FL_CUDA_TRY(rp_count_finish(a.part, nb, Dslot, stream, pdl));
        else FL_CUDA_TRY(cudaGetLastError());   // PM 3 / 4: the codes kernel's launch (no count kernel checks it)
    }
    if (pm == 4) a.loss = loss;   // the scalar loss, written by the position kernel's last CTA
    FL_CUDA_TRY(cudaLaunchKernelEx(&cfg, kfn, a));
    if (pm != 4 && !none && loss) {   // PM >= 1: one partial a warp tile of 32 pv positions
        const int64_t nred = pm >= 1 ? (n / pv + 31) / 32 : n;
        FL_CUDA_TRY(rp_reduce(a.rowloss, nred, a.part, a.Ddev, 1.0f, loss, stream));
    }
    return FL_OK;
}

static void margin_args(TArgs& a, const fl__margin_params* p, const void* logits, void* dlogits, float* lse,
                        const void* targets, const float* gl, float grad_scale) {
    memset(&a, 0, sizeof a);
    a.x = logits;
    a.dx = dlogits;
    a.lse = lse;
    a.tg = targets;
    a.gl = gl;
    a.error_flag = p->error_flag;
    a.V = p->C;
    a.ld = p->ld;
    a.d = 1;
    a.nrows = p->N;
    a.ignore = p->ignore_index;
    a.k2 = p->s * RP_LOG2E;
    a.s = p->s;
    a.m1 = p->m1;
    a.m2 = p->m2;
    a.m3 = p->m3;
    a.theta_max = p->theta_max;
    a.sinmm = p->sinmm;
    a.gscale = grad_scale;
    a.easy = p->easy_margin != 0;
    a.straight = p->grad_mode == FL_MARGIN_GRAD_STRAIGHT;
    a.cosface = p->cosface;
    a.lab64 = p->index_dtype == FL_INDEX_I64;
}

static void focal_args(TArgs& a, const fl__focal_params* p, const void* logits, void* dlogits, const void* targets,
                       const float* gl, float grad_scale) {
    memset(&a, 0, sizeof a);
    a.x = logits;
    a.dx = dlogits;
    a.tg = targets;
    a.gl = gl;
    a.alpha = p->alpha;
    a.error_flag = p->error_flag;
    a.V = p->C;
    a.ld = p->ld;
    a.d = p->d;
    a.nrows = p->positions;
    a.ignore = p->ignore_index;
    a.k2 = RP_LOG2E;
    a.gamma = p->gamma;
    a.gscale = grad_scale;
    a.lab64 = p->index_dtype == FL_INDEX_I64;
}

// focal rows go to the chunked kernel when C is large enough for a row to fill a CTA
static bool focal_rows(const fl__focal_params* p) { return p->d == 1 && p->C > 64; }

extern "C" {

fl_status fl_margin_ce_forward_cuda(float* loss, float* lse, const void* logits, int64_t ld, const void* targets,
                                    fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                    const fl_margin_options* opts, void* workspace, size_t workspace_bytes,
                                    fl_stream stream) {
    static const char* fn = "fl_margin_ce_forward_cuda";
    fl__clear_error();
    fl__margin_params p;
    FL_CHECK(fl__margin_validate(fn, FL__PASS_FORWARD, 1, loss, lse, NULL, logits, ld, targets, index_dtype, NULL, 1.0f,
                                 N, C, dtype, opts, workspace, workspace_bytes, &p));
    TArgs a;
    margin_args(a, &p, logits, NULL, lse, targets, NULL, 1.0f);
    return tgt_cuda(fn, a, TC_MARGIN, true, false, dtype, p.reduction, loss, logits, NULL, workspace, (cudaStream_t)stream);
}

fl_status fl_margin_ce_fused_cuda(float* loss, float* lse, void* dlogits, const void* logits, int64_t ld,
                                  const void* targets, fl_index_dtype index_dtype, const float* grad_loss,
                                  float grad_scale, int64_t N, int64_t C, fl_dtype dtype, const fl_margin_options* opts,
                                  void* workspace, size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_margin_ce_fused_cuda";
    fl__clear_error();
    fl__margin_params p;
    FL_CHECK(fl__margin_validate(fn, FL__PASS_FUSED, 1, loss, lse, dlogits, logits, ld, targets, index_dtype, grad_loss,
                                 grad_scale, N, C, dtype, opts, workspace, workspace_bytes, &p));
    TArgs a;
    margin_args(a, &p, logits, dlogits, lse, targets, grad_loss, grad_scale);
    return tgt_cuda(fn, a, TC_MARGIN, true, true, dtype, p.reduction, loss, logits, dlogits, workspace,
                    (cudaStream_t)stream);
}

fl_status fl_softmax_focal_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                        fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                        const fl_focal_options* opts, void* workspace, size_t workspace_bytes,
                                        fl_stream stream) {
    static const char* fn = "fl_softmax_focal_forward_cuda";
    fl__clear_error();
    fl__focal_params p;
    FL_CHECK(fl__focal_validate(fn, FL__PASS_FORWARD, 1, loss, NULL, logits, ld, targets, index_dtype, NULL, 1.0f, N, C,
                                d, dtype, opts, workspace, workspace_bytes, &p));
    TArgs a;
    focal_args(a, &p, logits, NULL, targets, NULL, 1.0f);
    return tgt_cuda(fn, a, TC_FOCAL, focal_rows(&p), false, dtype, p.reduction, loss, logits, NULL, workspace,
                    (cudaStream_t)stream);
}

fl_status fl_softmax_focal_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld, const void* targets,
                                      fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                      int64_t C, int64_t d, fl_dtype dtype, const fl_focal_options* opts,
                                      void* workspace, size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_softmax_focal_fused_cuda";
    fl__clear_error();
    fl__focal_params p;
    FL_CHECK(fl__focal_validate(fn, FL__PASS_FUSED, 1, loss, dlogits, logits, ld, targets, index_dtype, grad_loss,
                                grad_scale, N, C, d, dtype, opts, workspace, workspace_bytes, &p));
    TArgs a;
    focal_args(a, &p, logits, dlogits, targets, grad_loss, grad_scale);
    return tgt_cuda(fn, a, TC_FOCAL, focal_rows(&p), true, dtype, p.reduction, loss, logits, dlogits, workspace,
                    (cudaStream_t)stream);
}

}  // extern "C"
