/* distill.cu — CUDA backend of the distillation divergences on raw logits (include/fusedloss.h
 * section 10): forward KL, reverse KL and the generalised JSD between student and teacher logits
 * with a temperature, forward and fused forward + student gradient.
 *
 * The CPU backend (src/cpu/distill.c) is the specification; tests/test_distill_cuda.c checks this
 * file against it.
 *
 * Work decomposition. A row is cut into chunks of FL__DISTILL_CHUNK (8192) columns; a work item is
 * (phase, row, chunk). Phases (P of them):
 *   1  statistics: per chunk, the online max / sum of 2^(x log2e / T) of student and teacher and
 *      the one weighted sum the KL needs (forward KL: sum_j e_t (b - a); reverse: sum_j e_s (a - b),
 *      in log2 units); the last item of a row to finish merges the row's chunks (fixed order).
 *   2  JSD only: per chunk sum_j p (log p - log m) and sum_j q (log q - log m); merged likewise.
 *   last (fused only): the student gradient of the chunk, written once.
 * Persistent CTAs take items from one ticket counter (atomicAdd in the workspace) in an order that
 * interleaves the phases by blocks of rows: round k holds phase 1 of row block k, phase 2 of block
 * k - 1, phase 3 of block k - 2. A block is ~2 items per resident CTA (S = R rows x C chunks), so a
 * row is re-read about one round (~10-20 MB of traffic) after its first read: mostly L2 hits, and
 * the items a later phase waits for were ticketed a round earlier (rarely still running). A CTA only
 * ever waits for items with smaller tickets, which CTAs already running hold: no deadlock whatever
 * the number of co-resident CTAs. Completion is counted per row (int counter: C items, then +1 by
 * the merger once the row's merged statistics are in the workspace).
 *
 * Memory order: an item stores its partials, __threadfence(), then atomicAdd on the row counter;
 * the merger and the waiters read partials / merged stats with ld.global.cg (L2, not the
 * incoherent L1) after observing the count.
 *
 * Reduction: the merger writes each row's loss (x loss_scale) to loss[i] (NONE) or the per-row fp32
 * array of the workspace; for SUM / MEAN / BATCHMEAN rp_reduce (rowpass.cuh: fixed ranges per CTA,
 * then the partials in order, in double) sums those. MEAN with labels counts the non-ignored rows first (one small kernel) since
 * the gradient needs 1 / D. Launches: memset of the counters, [count], main kernel, [reduce].
 * No allocation, no host sync; graph-capturable. Deterministic (no order-dependent float atomics:
 * the only atomics are integer counters; which CTA merges a row does not change the merge order).
 * SPDX-License-Identifier: MIT
 */
#include <cooperative_groups.h>
#include <string.h>

#include "cluster.cuh"
#include "rowpass.cuh"

namespace cg = cooperative_groups;

// workspace slots: 8 fp32 per (row, chunk)
//   phase 0 partial : [0] m_s [1] S_s [2] m_t [3] S_t [4] U (FKL) / W (RKL)   (log2 units)
//   phase 1 partial : [5] A = sum p (log p - log m) [6] B = sum q (log q - log m)   (natural units)
//   merged row stats (slot of chunk 0, written by the merger after it read every partial):
//                     [0] L2s = log2 sum 2^a   [1] L2t   [2] loss (natural, unscaled)   [3] sum h (JSD)
struct DArgs {
    RpSched sc;
    const void* s;
    const void* t;
    void* ds;
    float* loss;           // NONE: [N] (may be NULL in fused); else unused here
    float* rowloss;        // [N] scaled row losses for the reduce kernel (SUM / MEAN / BATCHMEAN)
    const void* labels;
    const float* gl;       // grad_loss or NULL
    const float* Ddev;     // MEAN with labels: the count of non-ignored rows (device); else NULL
    int* cnt1;             // [N] phase-0 completion counters
    int* cnt2;             // [N] phase-1 completion counters (JSD)
    float* part;           // [N * C * 8]
    int64_t V, lds, ldt;
    int64_t ignore;
    float k2;              // log2(e) / T
    float beta;
    float loss_scale;      // T^2 or 1
    float inv_T;
    float gscale;          // grad_scale
    float Dhost;           // denominator known on the host (N for BATCHMEAN / MEAN without labels, 1 for SUM / NONE)
    int lab64;
    int none;
};

struct Stat1 {
    float ms, Ss, mt, St, u;   // u rides with the teacher max (FKL) or the student max (RKL)
};

template <int MODE>
__device__ __forceinline__ Stat1 combine1(const Stat1& a, const Stat1& b) {
    Stat1 r;
    r.ms = fmaxf(a.ms, b.ms);
    r.mt = fmaxf(a.mt, b.mt);
    const float as = rp_rescale(a.ms, r.ms), bs = rp_rescale(b.ms, r.ms);
    const float at = rp_rescale(a.mt, r.mt), bt = rp_rescale(b.mt, r.mt);
    r.Ss = a.Ss * as + b.Ss * bs;
    r.St = a.St * at + b.St * bt;
    if (MODE == FL__DISTILL_FKL) r.u = a.u * at + b.u * bt;
    else if (MODE == FL__DISTILL_RKL) r.u = a.u * as + b.u * bs;
    else r.u = 0.0f;
    return r;
}

// raise st's maxima to gs / gt (scaled, log2 units) where larger, rescaling the sums (u rides with
// the teacher max for FKL, the student max for RKL); FAST: the SFU's 2^x alone (fexp2)
template <int MODE, bool FAST>
__device__ __forceinline__ void raise1(Stat1& st, float gs, float gt) {
    if (gs > st.ms) {
        const float f = st.ms == -INFINITY ? 0.0f : FAST ? fexp2(st.ms - gs) : exp2f(st.ms - gs);
        st.Ss *= f;
        if (MODE == FL__DISTILL_RKL) st.u *= f;
        st.ms = gs;
    }
    if (gt > st.mt) {
        const float f = st.mt == -INFINITY ? 0.0f : FAST ? fexp2(st.mt - gt) : exp2f(st.mt - gt);
        st.St *= f;
        if (MODE == FL__DISTILL_FKL) st.u *= f;
        st.mt = gt;
    }
}

__device__ __forceinline__ Stat1 shfl1(const Stat1& a, int off) {
    Stat1 r;
    r.ms = __shfl_xor_sync(0xffffffffu, a.ms, off);
    r.Ss = __shfl_xor_sync(0xffffffffu, a.Ss, off);
    r.mt = __shfl_xor_sync(0xffffffffu, a.mt, off);
    r.St = __shfl_xor_sync(0xffffffffu, a.St, off);
    r.u = __shfl_xor_sync(0xffffffffu, a.u, off);
    return r;
}

// fixed-tree reduction over the CTA; the result is valid in thread 0
template <int MODE, int NW = RP_THREADS / 32>
__device__ __forceinline__ Stat1 block_reduce1(Stat1 v, Stat1* sm) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const Stat1 o = shfl1(v, off);
        v = combine1<MODE>(v, o);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) sm[w] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < NW; k++) v = combine1<MODE>(v, sm[k]);
    }
    __syncthreads();
    return v;
}

template <int NW = RP_THREADS / 32>
__device__ __forceinline__ float2 block_sum2(float2 v, float2* sm) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, off);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, off);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) sm[w] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < NW; k++) { v.x += sm[k].x; v.y += sm[k].y; }
    }
    __syncthreads();
    return v;
}

// -FLT_MAX: a difference of logits clamped to it below, so that a masked column (-inf in both
// inputs: difference NaN, or -inf in the weighting input: weight exactly 0) adds 0 * -FLT_MAX = 0
// instead of 0 * NaN; +inf (mass where the other input has none) stays +inf (header section 13)
#define DS_NEG_BIG (-3.402823466e+38f)

// log2 of the JSD mixture m = beta p + (1 - beta) q on the SFU (MUFU.LG2; log2f is a ~20-instruction
// polynomial, once per element in two sweeps). m is clamped at 2^-126 first: lg2.approx.ftz would
// take a subnormal m (p or q just above 2^-126, the other ~0) as 0, -inf, and p (log p - log m)
// would be +inf; the clamp moves log m there by < 1 (both terms then < 2^-125 each). m = 0 (p = q
// = 0): -126 instead of -inf, and neither term is added (their weights are 0).
__device__ __forceinline__ float jsd_lm(float beta, float omb, float p, float q) {
    return flog2(fmaxf(fmaf(beta, p, omb * q), 1.17549435e-38f));
}

// the row's upstream gradient times loss_scale / T
__device__ __forceinline__ float row_upstream(const DArgs& a, int64_t r) {   // before / D
    return a.gscale * (a.gl ? __ldg(a.gl + (a.none ? r : 0)) : 1.0f);
}
__device__ __forceinline__ float row_grad(const DArgs& a, int64_t r) {
    float g = row_upstream(a, r);
    if (!a.none) g = g / (a.Ddev ? __ldcg(a.Ddev) : a.Dhost);
    return g * a.loss_scale * a.inv_T;
}

// ---- the kernel ---------------------------------------------------------------------------------
template <typename TS, typename TT, int MODE, bool FUSED>
__global__ void __launch_bounds__(RP_THREADS, 2) distill_kernel(DArgs a) {
    constexpr int VEC = RpT<TS>::VEC;   // 16 bytes of the student; the teacher VEC elements likewise
    constexpr int U = 16 / VEC;          // vectors per thread per step: 16 elements of each input
    __shared__ Stat1 sm1[RP_THREADS / 32];
    __shared__ float2 sm2[RP_THREADS / 32];
    __shared__ unsigned long long s_ticket;
    __shared__ int s_merge;

    const int tid = threadIdx.x;
    if (tid == 0) s_ticket = atomicAdd(a.sc.ticket, 1ull);
    __syncthreads();
    unsigned long long t = s_ticket;
    while ((int64_t)t < a.sc.total) {
        unsigned long long next = 0;
        if (tid == 0) next = atomicAdd(a.sc.ticket, 1ull);   // in flight while this item runs
        int phase;
        int64_t r, c;
        if (rp_decode(a.sc, (int64_t)t, phase, r, c)) {
            const TS* srow = (const TS*)a.s + r * a.lds;
            const TT* trow = (const TT*)a.t + r * a.ldt;
            TS* drow = FUSED ? (TS*)a.ds + r * a.lds : nullptr;
            const int64_t h = (int64_t)(((16u - ((uintptr_t)srow & 15u)) & 15u) / sizeof(TS));
            const bool vec_ok = ((uintptr_t)(trow + h) & 15u) == 0 && (!FUSED || ((uintptr_t)(drow + h) & 15u) == 0);
            const RpRange g = rp_range<VEC>(c, a.sc.C, a.V, a.sc.chk, h, vec_ok);
            const bool ign = a.labels && rp_label(a.labels, a.lab64, r) == a.ignore;
            float* slotp = a.part + (r * a.sc.C + c) * 8;
            float* row0 = a.part + r * a.sc.C * 8;
            const bool last_phase = FUSED && phase == a.sc.P - 1;
            const float k2 = a.k2;

            if (phase == 0) {
                // ---- statistics of the chunk
                Stat1 st = {-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
                if (!ign) {
                    rp_stream<TS, TT, true, MODE != FL__DISTILL_JSD && !FUSED, U>(srow, trow, g,
                        [&](float (&xs)[U][VEC], float (&xt)[U][VEC], const bool (&in)[U], int64_t) {
                            float gs = -INFINITY, gt = -INFINITY;
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
#pragma unroll
                                for (int e = 0; e < VEC; e++) {
                                    xs[u][e] *= k2; xt[u][e] *= k2;
                                    gs = fmaxf(gs, xs[u][e]); gt = fmaxf(gt, xt[u][e]);
                                }
                            }
                            raise1<MODE, false>(st, gs, gt);
                            // a max still -inf (every column so far masked): the exps of -inf are 0
                            const float mus = st.ms == -INFINITY ? 0.0f : st.ms, mut = st.mt == -INFINITY ? 0.0f : st.mt;
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
#pragma unroll
                                for (int e = 0; e < VEC; e++) {
                                    const float es = fexp2(xs[u][e] - mus), et = fexp2(xt[u][e] - mut);   // sums >= 1: a flushed term is < 2^-126 of them
                                    st.Ss += es;
                                    st.St += et;
                                    if (MODE == FL__DISTILL_FKL) st.u += et * fmaxf(xt[u][e] - xs[u][e], DS_NEG_BIG);
                                    if (MODE == FL__DISTILL_RKL) st.u += es * fmaxf(xs[u][e] - xt[u][e], DS_NEG_BIG);
                                }
                            }
                        });
                    // scalar head / tail (or the whole chunk when the row cannot be vectorised)
                    rp_scalars(g, [&](int64_t col) {
                        const float xs = rp_sload(srow + col) * k2, xt = rp_sload(trow + col) * k2;
                        Stat1 one = {xs, 1.0f, xt, 1.0f, 0.0f};
                        if (MODE == FL__DISTILL_FKL) one.u = fmaxf(xt - xs, DS_NEG_BIG);
                        if (MODE == FL__DISTILL_RKL) one.u = fmaxf(xs - xt, DS_NEG_BIG);
                        st = combine1<MODE>(st, one);
                    });
                }
                st = block_reduce1<MODE>(st, sm1);
                if (tid == 0) {
                    slotp[0] = st.ms; slotp[1] = st.Ss; slotp[2] = st.mt; slotp[3] = st.St; slotp[4] = st.u;
                    __threadfence();
                    const int done = atomicAdd(a.cnt1 + r, 1);
                    s_merge = done == (int)a.sc.C - 1;
                }
                __syncthreads();
                if (s_merge && tid < 32) {
                    // the merger: warp 0 merges the row's C partials in a fixed order
                    __threadfence();
                    Stat1 m = {-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
                    for (int64_t q = tid; q < a.sc.C; q += 32) {
                        const float* pp = row0 + q * 8;
                        const Stat1 o = {__ldcg(pp), __ldcg(pp + 1), __ldcg(pp + 2), __ldcg(pp + 3), __ldcg(pp + 4)};
                        m = combine1<MODE>(m, o);
                    }
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) {
                        const Stat1 o = shfl1(m, off);
                        m = combine1<MODE>(m, o);
                    }
                    if (tid == 0) {
                        const float L2s = m.ms + log2f(m.Ss), L2t = m.mt + log2f(m.St);
                        float l = 0.0f;
                        if (MODE == FL__DISTILL_FKL) l = RP_LN2 * (m.u / m.St - L2t + L2s);
                        if (MODE == FL__DISTILL_RKL) l = RP_LN2 * (m.u / m.Ss - L2s + L2t);
                        if (ign) l = 0.0f;
                        row0[0] = L2s; row0[1] = L2t; row0[2] = l; row0[3] = 0.0f;
                        if (MODE != FL__DISTILL_JSD) {
                            if (a.none) { if (a.loss) a.loss[r] = l * a.loss_scale; }
                            else a.rowloss[r] = l * a.loss_scale;
                        }
                        __threadfence();
                        atomicAdd(a.cnt1 + r, 1);
                    }
                }
            } else if (MODE == FL__DISTILL_JSD && phase == 1) {
                // ---- JSD: sums of p (log p - log m) and q (log q - log m)
                rp_wait(a.cnt1 + r, (int)a.sc.C + 1);
                const float L2s = __ldcg(row0), L2t = __ldcg(row0 + 1);
                const float beta = a.beta, omb = 1.0f - a.beta;
                float2 acc = make_float2(0.0f, 0.0f);
                auto elem = [&](float xs, float xt) {
                    const float ls2 = xs * k2 - L2s, lt2 = xt * k2 - L2t;   // log2 q, log2 p
                    const float q = fexp2(ls2), p = fexp2(lt2);   // < 2^-126 flushed: that term is not added
                    const float lm = jsd_lm(beta, omb, p, q);
                    if (p > 0.0f) acc.x += p * (lt2 - lm);
                    if (q > 0.0f) acc.y += q * (ls2 - lm);
                };
                if (!ign) {
                    rp_stream<TS, TT, true, !FUSED, U>(srow, trow, g,
                        [&](float (&xs)[U][VEC], float (&xt)[U][VEC], const bool (&in)[U], int64_t) {
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
#pragma unroll
                                for (int e = 0; e < VEC; e++) elem(xs[u][e], xt[u][e]);
                            }
                        });
                    rp_scalars(g, [&](int64_t col) { elem(rp_sload(srow + col), rp_sload(trow + col)); });
                }
                acc = block_sum2(acc, sm2);
                if (tid == 0) {
                    slotp[5] = acc.x * RP_LN2; slotp[6] = acc.y * RP_LN2;
                    __threadfence();
                    const int done = atomicAdd(a.cnt2 + r, 1);
                    s_merge = done == (int)a.sc.C - 1;
                }
                __syncthreads();
                float A = 0.0f, B = 0.0f;
                if (s_merge && tid < 32) {
                    __threadfence();
                    // lane-strided, then a fixed shuffle tree
                    for (int64_t q = tid; q < a.sc.C; q += 32) { A += __ldcg(row0 + q * 8 + 5); B += __ldcg(row0 + q * 8 + 6); }
#pragma unroll
                    for (int off = 16; off > 0; off >>= 1) {
                        A += __shfl_xor_sync(0xffffffffu, A, off);
                        B += __shfl_xor_sync(0xffffffffu, B, off);
                    }
                }
                if (s_merge && tid == 0) {
                    float l = beta * A + omb * B;
                    if (ign) l = 0.0f;
                    row0[2] = l; row0[3] = omb * B;
                    if (a.none) { if (a.loss) a.loss[r] = l * a.loss_scale; }
                    else a.rowloss[r] = l * a.loss_scale;
                    __threadfence();
                    atomicAdd(a.cnt2 + r, 1);
                }
            } else if (last_phase) {
                // ---- the gradient of the chunk
                rp_wait((MODE == FL__DISTILL_JSD ? a.cnt2 : a.cnt1) + r, (int)a.sc.C + 1);
                if (ign) {
                    for (int64_t col = g.lo + tid; col < g.hi; col += RP_THREADS) drow[col] = from_float<TS>(0.0f);
                } else {
                    const float L2s = __ldcg(row0), L2t = __ldcg(row0 + 1), l = __ldcg(row0 + 2), sh = __ldcg(row0 + 3);
                    const float G = row_grad(a, r);
                    const float beta = a.beta, omb = 1.0f - a.beta;
                    auto grad = [&](float xs, float xt) -> float {
                        const float ls2 = xs * k2 - L2s, lt2 = xt * k2 - L2t;
                        const float q = MODE == FL__DISTILL_JSD ? fexp2(ls2) : exp2f(ls2);
                        if (MODE == FL__DISTILL_FKL) return G * (q - exp2f(lt2));
                        if (MODE == FL__DISTILL_RKL) return G * (q * (RP_LN2 * fmaxf(ls2 - lt2, DS_NEG_BIG) - l));
                        const float p = fexp2(lt2);
                        const float hq = q > 0.0f ? omb * q * (RP_LN2 * (ls2 - jsd_lm(beta, omb, p, q))) : 0.0f;
                        return G * (hq - q * sh);
                    };
                    rp_stream<TS, TT, true, true, U>(srow, trow, g,
                        [&](float (&xs)[U][VEC], float (&xt)[U][VEC], const bool (&in)[U], int64_t col0) {
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
#pragma unroll
                                for (int e = 0; e < VEC; e++) xs[u][e] = grad(xs[u][e], xt[u][e]);
                                rp_vstore<TS, VEC>(drow + col0 + (int64_t)u * RP_THREADS * VEC, xs[u]);
                            }
                        });
                    rp_scalars(g, [&](int64_t col) { drow[col] = from_float<TS>(grad(rp_sload(srow + col), rp_sload(trow + col))); });
                }
            }
        }
        __syncthreads();
        if (tid == 0) s_ticket = next;
        __syncthreads();
        t = s_ticket;
    }
}

// ---- the staged kernel (sm_90): one HBM read of both inputs ---------------------------------------
// A thread-block cluster of cs CTAs owns a row at a time (persistent clusters walk rows cid, cid +
// G, ...); CTA `rank` stages vectors [rank * per, rank * per + n) of the student and the teacher
// row in shared memory with per-thread cp.async (16 bytes, L2 only). Each thread only ever reads the
// vectors it copied, so the data needs no CTA barrier: cp.async.wait_group is enough, and the next
// row's copies into sub-chunk k are issued as soon as this thread is done with sub-chunk k (the
// copies of row r + G are in flight while row r's gradient is written). Per row: the statistics
// sweep, one exchange of the CTA partials over DSMEM (st.async + an mbarrier per slot, no cluster
// barrier: cluster.cuh), merged in rank order (the same bits in every CTA), [JSD: the KL-to-mixture
// sweep and a second exchange], then the gradient sweep from shared memory. Rows whose body is not
// 16-byte aligned, and short rows, take the ticket kernel above. The < VEC elements past the last
// full vector are read directly by rank 0 (twice: the second read is an L2 hit).
#define DC_THREADS 256
#define DC_THREADS_WIDE 768   // FUSEDLOSS_DISTILL_STAGED_THREADS (dc_plan)
#define DC_NS 2            // sub-chunks per CTA piece (each a cp.async group)
#define DC_MAX_CLUSTER 16


template <typename TS, typename TT>
__device__ __forceinline__ void dc_unpack(const uint4* sb, const uint4* tb, int q, float (&xs)[RpT<TS>::VEC],
                                          float (&xt)[RpT<TS>::VEC]) {
    constexpr int VEC = RpT<TS>::VEC, NT = (int)(VEC * sizeof(TT) / 16);
    rp_unpack<TS>(sb[q], xs);
#pragma unroll
    for (int k = 0; k < NT; k++) rp_unpack<TT>(tb[q * NT + k], xt + k * (VEC / NT));
}

// the staged kernels' statistics of one vector q (the student's VEC elements and the teacher's):
// the row's online maxima raised, then sum 2^(x k2 - m) of both and the KL's weighted sum u. FAST
// (the sweep): no guards, a masked column (-inf in both inputs) gives NaN, and the thread then redoes
// its vectors with FAST = false (the guarded formulas: -inf maxima taken as 0, the differences
// clamped at -FLT_MAX, the weight multiplied first). JSD: u unused.
template <typename TS, typename TT, int MODE, bool FAST>
__device__ __forceinline__ void dc_acc(Stat1& st, const uint4* sb, const uint4* tb, int q, float k2) {
    constexpr int VEC = RpT<TS>::VEC;
    float xs[VEC], xt[VEC];
    dc_unpack<TS, TT>(sb, tb, q, xs, xt);
    float gs = xs[0], gt = xt[0];
#pragma unroll
    for (int v = 1; v < VEC; v++) { gs = fmaxf(gs, xs[v]); gt = fmaxf(gt, xt[v]); }
    if (FAST) {
        gs *= k2; gt *= k2;   // k2 > 0: the max of the scaled values
        raise1<MODE, true>(st, gs, gt);
        float ss = 0.0f, stt = 0.0f, su = 0.0f;
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            const float es = fexp2(fmaf(xs[v], k2, -st.ms)), et = fexp2(fmaf(xt[v], k2, -st.mt));
            ss += es;
            stt += et;
            if (MODE == FL__DISTILL_FKL) su = fmaf(et, xt[v] - xs[v], su);
            if (MODE == FL__DISTILL_RKL) su = fmaf(es, xs[v] - xt[v], su);
        }
        st.Ss += ss;
        st.St += stt;
        if (MODE != FL__DISTILL_JSD) st.u = fmaf(su, k2, st.u);
    } else {
        raise1<MODE, false>(st, gs * k2, gt * k2);
        const float mus = st.ms == -INFINITY ? 0.0f : st.ms, mut = st.mt == -INFINITY ? 0.0f : st.mt;
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            // the SFU's 2^x alone (exp2f adds a denormal range fix: 4 instructions, twice an
            // element); the sums hold their maximum's 1, so a term flushed below 2^-126 is lost
            // at < 2^-126 relative, and u's weight is the same flushed et
            const float es = fexp2(fmaf(xs[v], k2, -mus)), et = fexp2(fmaf(xt[v], k2, -mut));
            st.Ss += es;
            st.St += et;
            // (et k2) first: a 0 weight times the clamped difference is 0 (k2 > 1 could make
            // -FLT_MAX k2 = -inf)
            if (MODE == FL__DISTILL_FKL) st.u = fmaf(et * k2, fmaxf(xt[v] - xs[v], DS_NEG_BIG), st.u);
            if (MODE == FL__DISTILL_RKL) st.u = fmaf(es * k2, fmaxf(xs[v] - xt[v], DS_NEG_BIG), st.u);
        }
    }
}

// LZ (FUSEDLOSS_DISTILL_PIPE_LAZY, the default since session 29): dc_acc<FAST> with a LAZY reference and no maxima. dc_acc
// takes each vector's maxima first (two chains of VEC - 1 FMNMX), raises the running maxima and only then
// forms the 2 VEC exponentials, so every exponential waits for the maxima, and the maxima cost 2 (VEC - 1)
// of the sweep's instructions a vector. Here the exponentials are taken against the references st.ms /
// st.mt as they are and summed by trees; the vector is redone (its maxima, raise1, the exponentials again)
// only when a sum exceeds 2^DC_LZ_LIM2, i.e. an element lies more than DC_LZ_LIM2 - log2(VEC) above its
// reference (or the sum is +inf; NaN never rebases and reaches the guarded redo as before). Each
// thread's first vector of a row (reference -inf) takes dc_acc itself, so the references are values
// of the row and never more than DC_LZ_LIM2 below the thread's maxima: terms <= 2^DC_LZ_LIM2, a thread's
// sums < 2^(DC_LZ_LIM2 + 11), log2 of a merged sum < 2^6 (an ulp of 2^-18 in L2s / L2t: inside the loss
// and gradient tolerances of tests/test_distill_cuda.c). u: |xt - xs| would have to exceed ~1e28 to
// overflow. sm_90 SASS (bf16 / bf16 FKL): ~100 instead of ~118 instructions a vector on the sweep's hot path.
// Why: the ncu source profile of H200 s29 (bench/results/2026-12-06-h200-s29-run2) has the statistics group as
// the ring's critical path (gradient warps waiting for its rows 32% of their samples). A first version that kept
// maxima trees for the rebase test and an exact-max finish tied (H200 s29 run 2): the maxima were the cost.
#define DC_LZ_LIM2 16.0f
template <int VEC>
__device__ __forceinline__ float dc_tree_max(const float* x) {
    float m[VEC / 2];
#pragma unroll
    for (int v = 0; v < VEC / 2; v++) m[v] = fmaxf(x[2 * v], x[2 * v + 1]);
#pragma unroll
    for (int w = VEC / 4; w >= 1; w >>= 1)
#pragma unroll
        for (int v = 0; v < w; v++) m[v] = fmaxf(m[v], m[v + w]);
    return m[0];
}
template <typename TS, typename TT, int MODE>
__device__ __forceinline__ void dc_acc_lz(Stat1& st, const uint4* sb, const uint4* tb, int q, float k2) {
    constexpr int VEC = RpT<TS>::VEC;
    if (st.ms == -INFINITY || st.mt == -INFINITY) {   // the row's first vector (or masked columns so far)
        dc_acc<TS, TT, MODE, true>(st, sb, tb, q, k2);
        return;
    }
    float xs[VEC], xt[VEC], es[VEC], et[VEC], su[2] = {0.0f, 0.0f};
    dc_unpack<TS, TT>(sb, tb, q, xs, xt);
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        es[v] = fexp2(fmaf(xs[v], k2, -st.ms));
        et[v] = fexp2(fmaf(xt[v], k2, -st.mt));
    }
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        if (MODE == FL__DISTILL_FKL) su[v & 1] = fmaf(et[v], xt[v] - xs[v], su[v & 1]);
        if (MODE == FL__DISTILL_RKL) su[v & 1] = fmaf(es[v], xs[v] - xt[v], su[v & 1]);
    }
    float ss = tree_sum<VEC>(es), stt = tree_sum<VEC>(et);
    if (ss > exp2f(DC_LZ_LIM2) || stt > exp2f(DC_LZ_LIM2)) {   // rare past the row's first vector
        // (the same formulas again, inline: a shared lambda made ptxas schedule the hot path differently, unmeasured)
        raise1<MODE, true>(st, dc_tree_max<VEC>(xs) * k2, dc_tree_max<VEC>(xt) * k2);   // k2 > 0
        su[0] = su[1] = 0.0f;
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            es[v] = fexp2(fmaf(xs[v], k2, -st.ms));
            et[v] = fexp2(fmaf(xt[v], k2, -st.mt));
            if (MODE == FL__DISTILL_FKL) su[v & 1] = fmaf(et[v], xt[v] - xs[v], su[v & 1]);
            if (MODE == FL__DISTILL_RKL) su[v & 1] = fmaf(es[v], xs[v] - xt[v], su[v & 1]);
        }
        ss = tree_sum<VEC>(es);
        stt = tree_sum<VEC>(et);
    }
    st.Ss += ss;
    st.St += stt;
    st.u = fmaf(su[0] + su[1], k2, st.u);
}

// a row's exchanged partials [rank][2] (ms, Ss, mt, St | u), merged in rank order: the same bits in
// every thread and CTA
template <int MODE>
__device__ __forceinline__ Stat1 dc_merge(const float4 (*p)[2], int cs) {
    Stat1 m = {-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
    for (int c = 0; c < cs; c++) {
        const float4 p0 = p[c][0], p1 = p[c][1];
        const Stat1 o = {p0.x, p0.y, p0.z, p0.w, p1.x};
        m = c == 0 ? o : combine1<MODE>(m, o);
    }
    return m;
}

// the KL of a row (natural units, before loss_scale) from its merged statistics; L2s / L2t: the
// log2 normalisers of the scaled student and teacher (JSD: 0, its loss comes from a later sweep)
template <int MODE>
__device__ __forceinline__ float dc_kl(const Stat1& m, float& L2s, float& L2t) {
    L2s = m.ms + log2f(m.Ss);
    L2t = m.mt + log2f(m.St);
    float l = 0.0f;
    if (MODE == FL__DISTILL_FKL) l = RP_LN2 * (m.u / m.St - L2t + L2s);
    if (MODE == FL__DISTILL_RKL) l = RP_LN2 * (m.u / m.Ss - L2s + L2t);
    return l;
}

// the statistics of one scalar column (the tail past the last vector), scaled values
template <int MODE>
__device__ __forceinline__ Stat1 dc_one(float xs, float xt) {
    Stat1 one = {xs, 1.0f, xt, 1.0f, 0.0f};
    if (MODE == FL__DISTILL_FKL) one.u = fmaxf(xt - xs, DS_NEG_BIG);
    if (MODE == FL__DISTILL_RKL) one.u = fmaxf(xs - xt, DS_NEG_BIG);
    return one;
}

template <typename TS, typename TT, int MODE, bool FUSED, int NTH = DC_THREADS>
__global__ void __launch_bounds__(NTH, NTH == DC_THREADS ? 3 : 1) distill_staged_kernel(DArgs a, int cs, int per,
                                                                                        int nv, int nb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int VEC = RpT<TS>::VEC;
    constexpr int NT = (int)(VEC * sizeof(TT) / 16);
    constexpr bool JSD = MODE == FL__DISTILL_JSD;
    // the sweep that frees the buffer (its sub-chunks are refilled with the next row as it goes).
    // (Refilling it during the statistics sweep and reading the row for the gradient from L2,
    // FUSEDLOSS_DISTILL_STAGED_L2G, measured 18% SLOWER: KL T=2 2.23 vs 1.88 ms, H200 2026-12-02
    // s5 run 2; removed)
    constexpr int LAST = FUSED ? 2 : (JSD ? 1 : 0);   // 0 statistics, 1 JSD sums, 2 gradient
    // nb (1 or 2) row buffers, each [per] student vectors then [per * NT] teacher: with 2, the
    // copies of row j + 2 are in flight while row j + 1 is swept (FUSEDLOSS_DISTILL_STAGED_ROWS)
    extern __shared__ __align__(16) uint4 dc_buf[];
    __shared__ __align__(8) uint64_t xb1[2], xb2[2];
    __shared__ float4 sl1[2][DC_MAX_CLUSTER][2];      // statistics partials by rank (slot parity)
    __shared__ float4 sl2[2][DC_MAX_CLUSTER];         // JSD sums by rank
    __shared__ Stat1 sm1[NTH / 32];
    __shared__ float2 sm2[NTH / 32];
    __shared__ float4 bc;                             // the merged row values, for every thread
    uint4* sb = dc_buf;
    uint4* tb = dc_buf + per;
    const int bstride = per * (1 + NT);
    const int tid = (int)threadIdx.x;
    int rank = 0;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int64_t cid = blockIdx.x / cs, ncl = gridDim.x / cs;
    const int lo = rank * per;
    const int n = nv - lo < per ? (nv - lo > 0 ? nv - lo : 0) : per;   // this CTA's vectors
    const int sub = (n + DC_NS - 1) / DC_NS;
    const int tail = (int)(a.V - (int64_t)nv * VEC);                   // 0 .. VEC-1 scalar columns
    const bool has_x = rank == 0 && tid < tail;
    const int64_t xcol = (int64_t)nv * VEC + tid;
    const bool xch = cs > 1;   // st.async needs a cluster of >= 2 CTAs
    const float k2 = a.k2, beta = a.beta, omb = 1.0f - a.beta;

    if (tid == 0) {
        mbar_init(&xb1[0], 1u); mbar_init(&xb1[1], 1u); mbar_init(&xb2[0], 1u); mbar_init(&xb2[1], 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (xch) cg::this_cluster().sync();   // why: barriers initialised and every CTA started before DSMEM stores

    auto issue = [&](int64_t r, int k, int b) {
        uint4* const sb = dc_buf + b * bstride;
        uint4* const tb = sb + per;
        if (r < a.sc.N) {
            const uint4* srow = reinterpret_cast<const uint4*>((const TS*)a.s + r * a.lds) + lo;
            const uint4* trow = reinterpret_cast<const uint4*>((const TT*)a.t + r * a.ldt) + (int64_t)lo * NT;
            const int qhi = (k + 1) * sub < n ? (k + 1) * sub : n;
            for (int q = k * sub + tid; q < qhi; q += NTH) {
                cp_async16(sb + q, srow + q);
#pragma unroll
                for (int c = 0; c < NT; c++) cp_async16(tb + q * NT + c, trow + (int64_t)q * NT + c);
            }
        }
        cp_commit();   // an empty group past the last row keeps the per-thread group count uniform
    };

    int64_t r = cid;
    for (int b = 0; b < nb; b++)
        for (int k = 0; k < DC_NS; k++) issue(r + b * ncl, k, b);
    const int npend = nb * DC_NS - 1;   // groups issued after a row's first one, until it is swept
    int e = 0;   // rows done = exchanges done (the same count in every CTA of the cluster)
    // the row's scalars a row ahead (the label) or at the row's start (the upstream gradient; the
    // denominator once): their load latency behind the sweeps, not in front of the gradient's
    const float Dd = a.Ddev ? __ldcg(a.Ddev) : a.Dhost;   // row_grad's denominator
    bool ign_next = a.labels && r < a.sc.N && rp_label(a.labels, a.lab64, r) == a.ignore;
    for (; r < a.sc.N; r += ncl) {
        const int64_t rn = r + nb * ncl;   // the row that refills this row's buffer
        const int buf = nb > 1 ? (e & 1) : 0;
        sb = dc_buf + buf * bstride;
        tb = sb + per;
        const bool ign = ign_next;
        if (a.labels && r + ncl < a.sc.N) ign_next = rp_label(a.labels, a.lab64, r + ncl) == a.ignore;
        float G0 = FUSED ? row_upstream(a, r) : 0.0f;   // = row_grad(a, r)
        if (!a.none) G0 = G0 / Dd;
        G0 = G0 * a.loss_scale * a.inv_T;
        const TS* srow = (const TS*)a.s + r * a.lds;
        const TT* trow = (const TT*)a.t + r * a.ldt;
        const int x = e & 1;
        const uint32_t xpar = (uint32_t)((e >> 1) & 1);
        e++;

        // ---- statistics (online max / sum of 2^(x k2) of both inputs, and the KL's weighted sum)
        // two accumulators (even / odd vectors of the thread): two independent chains
        Stat1 st = {-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f}, st1 = st;
        auto acc = [&](Stat1& st, int q) { dc_acc<TS, TT, MODE, true>(st, sb, tb, q, k2); };
#pragma unroll
        for (int k = 0; k < DC_NS; k++) {
            cp_wait(LAST == 0 ? npend : npend - k);
            const int qhi = (k + 1) * sub < n ? (k + 1) * sub : n;
            int q = k * sub + tid;
            for (; q + NTH < qhi; q += 2 * NTH) { acc(st, q); acc(st1, q + NTH); }
            if (q < qhi) acc(st, q);
            if (LAST == 0) issue(rn, k, buf);
        }
        st = combine1<MODE>(st, st1);
        if (isnan(st.Ss) || isnan(st.St) || isnan(st.u)) {
            // masked classes (-inf in both inputs; header section 13): the sweep above gives NaN for
            // them (-inf - -inf, 0 * -inf) and is kept free of guards; this thread redoes its own
            // vectors with them, from global memory (the row is intact there: the gradient is
            // written later, and a forward-only sweep may already have refilled shared memory).
            // NaN inputs give NaN again, as they should.
            const uint4* gsb = reinterpret_cast<const uint4*>(srow) + lo;
            const uint4* gtb = reinterpret_cast<const uint4*>(trow) + (int64_t)lo * NT;
            st = Stat1{-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
            // exactly the vectors of this thread's sweep (sub-chunk by sub-chunk, as above)
            for (int k = 0; k < DC_NS; k++)
            for (int q = k * sub + tid, qhi = (k + 1) * sub < n ? (k + 1) * sub : n; q < qhi; q += NTH)
                dc_acc<TS, TT, MODE, false>(st, gsb, gtb, q, k2);
        }
        if (has_x) {
            st = combine1<MODE>(st, dc_one<MODE>(rp_sload(srow + xcol) * k2, rp_sload(trow + xcol) * k2));
        }
        st = block_reduce1<MODE, NTH / 32>(st, sm1);
        if (tid == 0) {
            Stat1 m = st;
            if (xch) {
                // arm this CTA's barrier for the cs partials (a remote st.async may land first: its
                // tx count then goes negative until this expect_tx); slot x is next written two
                // exchanges later, which no CTA starts before it has this CTA's partial of the
                // exchange in between, sent after the reads below
                mbar_arrive_tx(&xb1[x], (uint32_t)cs * 32u);
                const uint32_t ls = smem_addr(&sl1[x][rank][0]), lb = smem_addr(&xb1[x]);
                const float4 v0 = make_float4(st.ms, st.Ss, st.mt, st.St), v1 = make_float4(st.u, 0.0f, 0.0f, 0.0f);
                for (int c = 0; c < cs; c++) {
                    st_async_f4(mapa_shared(ls, c), v0, mapa_shared(lb, c));
                    st_async_f4(mapa_shared(ls + 16u, c), v1, mapa_shared(lb, c));
                }
                mbar_wait_cluster(&xb1[x], xpar);
                for (int c = 0; c < cs; c++) {   // rank order
                    const float4 p0 = sl1[x][c][0], p1 = sl1[x][c][1];
                    const Stat1 o = {p0.x, p0.y, p0.z, p0.w, p1.x};
                    m = c == 0 ? o : combine1<MODE>(m, o);
                }
            }
            float L2s, L2t;
            float l = dc_kl<MODE>(m, L2s, L2t);
            if (ign) l = 0.0f;
            if (!JSD && rank == 0) {
                if (a.none) { if (a.loss) a.loss[r] = l * a.loss_scale; }
                else a.rowloss[r] = l * a.loss_scale;
            }
            bc = make_float4(L2s, L2t, l, 0.0f);
        }
        __syncthreads();   // why: bc written; sm1 free again
        const float L2s = bc.x, L2t = bc.y;
        float l = bc.z, sh = 0.0f;

        if (JSD) {
            // ---- sum p (log p - log m) and q (log q - log m) over the row
            float2 acc = make_float2(0.0f, 0.0f);
            auto elem = [&](float xs, float xt) {
                const float ls2 = fmaf(xs, k2, -L2s), lt2 = fmaf(xt, k2, -L2t);   // log2 q, log2 p
                const float q = fexp2(ls2), p = fexp2(lt2);
                const float lm = jsd_lm(beta, omb, p, q);   // p = q = 0: -126, and neither term is added
                if (p > 0.0f) acc.x = fmaf(p, lt2 - lm, acc.x);
                if (q > 0.0f) acc.y = fmaf(q, ls2 - lm, acc.y);
            };
#pragma unroll
            for (int k = 0; k < DC_NS; k++) {
                const int qhi = (k + 1) * sub < n ? (k + 1) * sub : n;
#pragma unroll 2
                for (int q = k * sub + tid; q < qhi; q += NTH) {
                    float xs[VEC], xt[VEC];
                    dc_unpack<TS, TT>(sb, tb, q, xs, xt);
#pragma unroll
                    for (int v = 0; v < VEC; v++) elem(xs[v], xt[v]);
                }
                if (LAST == 1) issue(rn, k, buf);
            }
            if (has_x) elem(rp_sload(srow + xcol), rp_sload(trow + xcol));
            acc = block_sum2<NTH / 32>(acc, sm2);
            if (tid == 0) {
                float A = acc.x * RP_LN2, B = acc.y * RP_LN2;
                if (xch) {
                    mbar_arrive_tx(&xb2[x], (uint32_t)cs * 16u);
                    const uint32_t ls = smem_addr(&sl2[x][rank]), lb = smem_addr(&xb2[x]);
                    const float4 v0 = make_float4(A, B, 0.0f, 0.0f);
                    for (int c = 0; c < cs; c++) st_async_f4(mapa_shared(ls, c), v0, mapa_shared(lb, c));
                    mbar_wait_cluster(&xb2[x], xpar);
                    A = 0.0f; B = 0.0f;
                    for (int c = 0; c < cs; c++) { A += sl2[x][c].x; B += sl2[x][c].y; }   // rank order
                }
                float lj = beta * A + omb * B;
                if (ign) lj = 0.0f;
                if (rank == 0) {
                    if (a.none) { if (a.loss) a.loss[r] = lj * a.loss_scale; }
                    else a.rowloss[r] = lj * a.loss_scale;
                }
                bc.z = lj;
                bc.w = omb * B;
            }
            __syncthreads();   // why: bc.z / bc.w written
            l = bc.z;
            sh = bc.w;
        }

        if (FUSED) {
            // ---- the student gradient, from shared memory, written once
            TS* drow = (TS*)a.ds + r * a.lds;
            const float G = ign ? 0.0f : G0;   // loaded at the row's start
            auto grad = [&](float xs, float xt) -> float {
                const float ls2 = fmaf(xs, k2, -L2s), lt2 = fmaf(xt, k2, -L2t);
                const float q = fexp2(ls2);
                if (MODE == FL__DISTILL_FKL) return G * (q - fexp2(lt2));
                if (MODE == FL__DISTILL_RKL) return G * (q * (RP_LN2 * fmaxf(ls2 - lt2, DS_NEG_BIG) - l));
                const float p = fexp2(lt2);
                const float hq = q > 0.0f ? omb * q * (RP_LN2 * (ls2 - jsd_lm(beta, omb, p, q))) : 0.0f;
                return G * (hq - q * sh);
            };
            auto one = [&](int q) {
                float xs[VEC], xt[VEC];
                dc_unpack<TS, TT>(sb, tb, q, xs, xt);
                if (ign) {   // zeros (the row is not finite-checked: its values are never used)
#pragma unroll
                    for (int v = 0; v < VEC; v++) xs[v] = 0.0f;
                } else {
#pragma unroll
                    for (int v = 0; v < VEC; v++) xs[v] = grad(xs[v], xt[v]);
                }
                rp_vstore<TS, VEC>(drow + (int64_t)(lo + q) * VEC, xs);
            };
#pragma unroll
            for (int k = 0; k < DC_NS; k++) {
                const int qhi = (k + 1) * sub < n ? (k + 1) * sub : n;
                int q = k * sub + tid;
                // two vectors an iteration: two shared loads in flight behind each other's math
                for (; q + NTH < qhi; q += 2 * NTH) { one(q); one(q + NTH); }
                if (q < qhi) one(q);
                if (LAST == 2) issue(rn, k, buf);
            }
            if (has_x) drow[xcol] = from_float<TS>(ign ? 0.0f : grad(rp_sload(srow + xcol), rp_sload(trow + xcol)));
        }
    }
    cp_wait(0);
    // every partial sent to this CTA has landed (waited above), but its own st.async to the others
    // may still be in flight: no CTA exits before all have passed their last exchange
    if (xch) cg::this_cluster().sync();
#else
    __trap();  // chosen only on sm_90+
#endif
}

// ---- the warp-specialised ring kernel (sm_90, fused forward / reverse KL and JSD) --------------------
// The default for the fused KL since 2026-12-05 (FUSEDLOSS_DISTILL_PIPE=0: the staged kernel; s16 runs
// 1-3: correct under every plan tried, memcheck 0, 1.52x against the staged kernel's 1.65x), and for the
// fused JSD since s39 (FUSEDLOSS_DISTILL_PIPE_JSD=0: the ticket kernel; the JSD's second sweep and exchange
// are the gradient group's, see JSD below and dp_plan).
// Why: the staged kernel above runs a row as phases (copy wait, statistics sweep, block reduction and
// exchange, gradient sweep) in one group of warps, and its measured time is the SUM of its memory
// and SFU times (KL T=2 4096x128256 bf16: 1.256 ms = 0.738 memory + 0.534 SFU; NOTES "Session 15").
// The cross-entropy went from the same structure (1.23x) to 1.11x with ce_pipe_kernel's roles, which
// this kernel copies for two inputs: a cluster of cs CTAs owns a row at a time, CTA `rank` its
// vectors [rank per, rank per + n); each CTA holds its chunk of several rows in a RING of R slots of
// `sub` student vectors (then sub NT teacher vectors), the rows one after another around the ring
// (row k's sub-chunk j at position P = k nsub + j, slot P % R), and its warps run three roles at once:
//  - PRODUCER (the last warp): position P goes to slot P % R once every gradient warp has released
//    position P - R (empty[s], one arrival per gradient warp), as bulk async copies completing
//    full[s]; ignored rows and sub-chunks past the chunk's end complete full[s] at once.
//  - STATISTICS (threads [0, Ts)): row k's online (max, sum 2^x) of both inputs and the KL's
//    weighted sum, slot by slot as each lands, reduced over the group (named barrier 1) and sent to
//    every CTA of the cluster (st.async into xslot k % DP_XSLOTS; cs == 1: a local store + arrive).
//    Masked columns (NaN sums) are redone from global memory, as in the staged kernel.
//  - GRADIENT (threads [Ts, T - 32)): waits for row k's partials, merges them in rank order (the same
//    bits in every thread and CTA), [JSD: sweeps the KL-to-mixture sums from the ring (JS, the default since
//    s40: writing each element's log2 q - log2 m over its teacher value there; since s43 free of the p > 0 /
//    q > 0 guards, masked columns redone) and exchanges them over the
//    cluster, one more phase of jbar[x] a row], writes the row loss (rank 0) and sweeps the gradient from
//    the ring, each warp releasing each slot.
// Every position of every row, ignored rows included, completes one phase of full[s] and one of
// empty[s], and every row one phase of xbar[x]; the gradient group touches a row's positions only
// after its exchange, which follows this CTA's statistics having waited on all of them (so no warp
// can run two phases ahead of the producer). xslot reuse: as ce_pipe_kernel (cross_entropy.cu), the
// host keeps R <= (DP_XSLOTS / 2 + 1) nsub - 1.
// HD (rows not 16-byte aligned whose student, teacher and dstudent rows share one phase: the host checks
// rows 0-15, addresses mod 16 repeating every 16 rows): each row's vectors start at the student row's
// first 16-byte boundary (RrRow, rowpass.cuh: h head columns before it, (V - h) / VEC vectors, the tail
// after them); `nv` is then V / VEC, the most any row has, and the chunk of each CTA is cut from that;
// the head and tail columns are rank 0's extras (the aligned kernel's tail columns, generalised).
// Written in session 18 without a GPU; first run and made the default in s22 (FUSEDLOSS_DISTILL_PIPE_HEAD=0: off).
#define DP_MAX_SLOTS 16
#define DP_XSLOTS 8
#define DP_MAX_THREADS 768   // plans above 672 threads (FUSEDLOSS_DISTILL_PIPE_THREADS); 24 warps keep the 80-register cap (800 would cap at 72)
#define DP_PIECE 256   // vectors per bulk copy (4 KB); the producer's lanes issue the pieces
#define DP_WX_MAX 32   // WX: partials an xslot holds (cs Ts / 32 of them, one a lane of the gradient warps' merge)
#define DP_WX_MAX_JSD 64   // the JSD's (s40): two a lane, so that cluster 8 keeps 8 statistics warps

__device__ __forceinline__ void dp_bar(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
// NB (FUSEDLOSS_DISTILL_PIPE_NBAR=1; not yet run): slot s released through hardware barrier NB_BASE + s
// (cluster.cuh: nbar_release / nbar_wait_refill) instead of the mbarrier empty[s]; R <= NB_MAX_SLOTS.

// fixed-tree reduction over the statistics group (threads [0, n), named barrier 1); valid in thread 0
// (block_reduce1's tree with named barriers; not shared with it: a common warp-tree helper changed
// the ticket kernel's machine code, sm_90 CUDA 13)
template <int MODE>
__device__ __forceinline__ Stat1 dp_group_reduce1(Stat1 v, Stat1* sm, int n) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const Stat1 o = shfl1(v, off);
        v = combine1<MODE>(v, o);
    }
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) sm[w] = v;
    dp_bar(1, n);   // why: the warp partials visible to thread 0
    if (threadIdx.x == 0)
        for (int k = 1; k < (n >> 5); k++) v = combine1<MODE>(v, sm[k]);
    dp_bar(1, n);   // why: sm is rewritten by the next row's reduction
    return v;
}

// WX: a warp's Stat1 partials combined, the result in every lane, bitwise the same: the maxima first (xor trees
// of fmaxf: exact), then each lane's sums rescaled to them once (two exponentials in parallel, not four a tree
// level as combine1's tree) and added by xor trees (every lane adds the same two operands at each level, in either
// order: IEEE addition commutes, so the lanes agree bit for bit)
template <int MODE>
__device__ __forceinline__ Stat1 dp_warp_reduce1(const Stat1& v) {
    float ms = v.ms, mt = v.mt;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        ms = fmaxf(ms, __shfl_xor_sync(0xffffffffu, ms, off));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
    }
    const float as = rp_rescale(v.ms, ms), at = rp_rescale(v.mt, mt);
    float Ss = v.Ss * as, St = v.St * at;
    float u = MODE == FL__DISTILL_FKL ? v.u * at : MODE == FL__DISTILL_RKL ? v.u * as : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        Ss += __shfl_xor_sync(0xffffffffu, Ss, off);
        St += __shfl_xor_sync(0xffffffffu, St, off);
        u += __shfl_xor_sync(0xffffffffu, u, off);
    }
    return Stat1{ms, Ss, mt, St, u};
}

// the producer warp: position (row r, sub-chunk j) of this CTA's chunk [lo, lo + n) into slot buffer
// `dst` (sub student vectors, then sub NT teacher vectors), completing `bar`. TM (FUSEDLOSS_DISTILL_PIPE_TMAP=1;
// session 19, not yet run; cluster.cuh): through tensor maps *tm, one arrive for both inputs' box bytes,
// the lanes issuing the student's boxes then the teacher's (sub % 8 == 0: 128-byte-aligned halves with
// room for the last box's over-read).
template <typename TS, typename TT, bool TM = false>
__device__ __forceinline__ void dp_issue(const DArgs& a, int64_t r, int64_t h, bool ign, int lo, int n, int sub, int j,
                                         uint4* dst, uint64_t* bar, const FlTmaps2* tm = nullptr) {
    constexpr int VEC = RpT<TS>::VEC;
    constexpr int NT = (int)(VEC * sizeof(TT) / 16);
    const int lane = threadIdx.x & 31;
    const int v0 = j * sub;
    const int cnt = ign ? 0 : (n - v0 < sub ? (n - v0 > 0 ? n - v0 : 0) : sub);
    if (lane == 0) {
        if (cnt > 0) mbar_arrive_tx(bar, TM ? tmap_bytes(cnt) + tmap_bytes(cnt * NT) : (uint32_t)cnt * 16u * (1u + NT));
        else mbar_arrive(bar);
    }
    __syncwarp();
    if (cnt <= 0) return;
    const uint4* srow = reinterpret_cast<const uint4*>((const TS*)a.s + r * a.lds + h) + lo + v0;
    const uint4* trow = reinterpret_cast<const uint4*>((const TT*)a.t + r * a.ldt + h) + (int64_t)(lo + v0) * NT;
    if constexpr (TM) {
        const int rs = tmap_row(a.s, srow), rt = tmap_row(a.t, trow), bs = tmap_nbox(cnt);
        for (int p = lane; p < bs + tmap_nbox(cnt * NT); p += 32) {
            if (p < bs) tmap_box(dst, tm->s, rs, cnt, p, bar);
            else tmap_box(dst + sub, tm->t, rt, cnt * NT, p - bs, bar);
        }
        return;
    }
    const int ps = (cnt + DP_PIECE - 1) / DP_PIECE, pt = (cnt * NT + DP_PIECE - 1) / DP_PIECE;
    for (int p = lane; p < ps + pt; p += 32) {
        if (p < ps) {
            const int o = p * DP_PIECE, m = cnt - o < DP_PIECE ? cnt - o : DP_PIECE;
            bulk_load(dst + o, srow + o, (uint32_t)m * 16u, bar);
        } else {
            const int o = (p - ps) * DP_PIECE, m = cnt * NT - o < DP_PIECE ? cnt * NT - o : DP_PIECE;
            bulk_load(dst + sub + o, trow + o, (uint32_t)m * 16u, bar);
        }
    }
}

// JS (the JSD's stash, FUSEDLOSS_DISTILL_PIPE_JST, default 1): the JSD's second sweep writes each element's
// d = log2 q - log2 m over its teacher value in the ring (2-byte teachers: fp16; 4-byte: fp32, exact), and the
// gradient sweep takes q's exponential alone (1 SFU operation an element instead of 3) and q (Gc d - G sh). Each
// thread rewrites only the vectors it later reads.
// d is saturated to the finite range (fp16: cvt's satfinite; fp32: clamped at -FLT_MAX; NaN stays NaN), so that the
// gradient's q (Gc d - G sh) is 0, not NaN, where q is 0 and d is -inf (a -inf student logit).
template <typename TT, int VEC>
__device__ __forceinline__ void dp_stash(uint4* tb, const float (&d)[VEC]) {
    if constexpr (sizeof(TT) == 4) {
        float c[VEC];
#pragma unroll
        for (int v = 0; v < VEC; v++) c[v] = fmaxf(d[v], DS_NEG_BIG);
#pragma unroll
        for (int k = 0; k < VEC / 4; k++) tb[k] = make_uint4(__float_as_uint(c[4 * k]), __float_as_uint(c[4 * k + 1]),
                                                             __float_as_uint(c[4 * k + 2]), __float_as_uint(c[4 * k + 3]));
    } else {
        static_assert(VEC == 8, "2-byte teachers pair 2-byte students");
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(d[2 * k + 1]), "f"(d[2 * k]));
        tb[0] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}
// an exchange barrier (xbar / jbar): completed by the cluster's CTAs when cs > 1. (s40's nanosleep backoff of the
// waits, JST=3, lost: H100 s43 run 1, 1.654 / 1.644 ms against 1.636 / 1.626 without it.)
__device__ __forceinline__ void dp_wait_x(uint64_t* bar, uint32_t parity, int cs) {
    if (cs > 1) {
        mbar_wait_cluster(bar, parity);
    } else {
        mbar_wait(bar, parity);
    }
}
template <typename TT, int VEC>
__device__ __forceinline__ void dp_unstash(const uint4* tb, float (&d)[VEC]) {
    if constexpr (sizeof(TT) == 4) {
#pragma unroll
        for (int k = 0; k < VEC / 4; k++) rp_unpack<float>(tb[k], d + 4 * k);
    } else {
        rp_unpack<__half>(tb[0], d);
    }
}

template <typename TS, typename TT, int MODE, bool PST, bool HD, bool NB = false, bool TM = false, bool LZ = false,
          bool WX = false, int JS = 0>
__global__ void __launch_bounds__(DP_MAX_THREADS, 1) distill_pipe_kernel(DArgs a, int cs, int per, int nv, int sub,
                                                                          int R, int Ts,
                                                                          const __grid_constant__ FlTmaps2 tm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int VEC = RpT<TS>::VEC;
    constexpr int NT = (int)(VEC * sizeof(TT) / 16);
    extern __shared__ __align__(128) uint4 dp_ring[];            // [R][sub (1 + NT)] 16-byte vectors
    __shared__ __align__(8) uint64_t full[DP_MAX_SLOTS];         // slot s's sub-chunk landed
    __shared__ __align__(8) uint64_t empty[DP_MAX_SLOTS];        // every gradient warp is done with slot s
    __shared__ __align__(8) uint64_t xbar[DP_XSLOTS];            // xslot x's cs partials landed
    // the partials by rank, [x][rank][0] (ms, Ss, mt, St) and [1] (u, 0, 0, 0); WX: one a statistics warp of each
    // rank (index rank Ts / 32 + warp), [x][k][0] (ms, Ss, mt, St) for k < WXM, their u after them as floats
    constexpr bool JSD = MODE == FL__DISTILL_JSD;
    constexpr int WXM = JSD ? DP_WX_MAX_JSD : DP_WX_MAX;
    __shared__ float4 sl[DP_XSLOTS][WX ? WXM + WXM / 4 : DC_MAX_CLUSTER][WX ? 1 : 2];
    __shared__ Stat1 sm1[DP_MAX_THREADS / 32];
    // JSD (the fused JSD's ring, FUSEDLOSS_DISTILL_PIPE_JSD): the second sweep's sums, per gradient warp (jw) and
    // per rank of the cluster by xslot (sl2, completing jbar[x]); one element for the KL instances (their ring keeps
    // its room)
    __shared__ __align__(8) uint64_t jbar[JSD ? DP_XSLOTS : 1];
    __shared__ float4 sl2[JSD ? DP_XSLOTS : 1][JSD ? DC_MAX_CLUSTER : 1];
    __shared__ float2 jw[JSD ? DP_MAX_THREADS / 32 : 1];
    const int tid = (int)threadIdx.x;
    const int ngw = ((int)blockDim.x - Ts - 32) >> 5;   // gradient warps
    const int slot_vecs = sub * (1 + NT);
    int rank = 0;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    const int64_t cid = blockIdx.x / cs, ncl = gridDim.x / cs;
    const int lo = rank * per;
    const int n = nv - lo < per ? (nv - lo > 0 ? nv - lo : 0) : per;   // this CTA's vectors
    const int nsub = (per + sub - 1) / sub;                            // positions per row (every CTA)
    const int tail = (int)(a.V - (int64_t)nv * VEC);                   // 0 .. VEC-1 scalar columns
    const float k2 = a.k2;
    if (tid == 0) {
        for (int k = 0; k < R; k++) {
            mbar_init(&full[k], 1u);
            mbar_init(&empty[k], (uint32_t)(WX ? ngw * 32 : ngw));   // WX: counted in lanes (the release below)
        }
        // one arrival a phase (thread 0's, the expect_tx of the partials' bytes when cs > 1); WX: one a statistics
        // warp (each warp's own arrive orders its ring reads before the gradient warps' slot releases, also to
        // racecheck, which does not see st.async's complete_tx as a release)
        for (int k = 0; k < DP_XSLOTS; k++) mbar_init(&xbar[k], WX ? (uint32_t)(Ts >> 5) : 1u);
        if constexpr (JSD)
            for (int k = 0; k < DP_XSLOTS; k++) mbar_init(&jbar[k], 1u);   // the gradient group's thread 0
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();   // why: barriers initialised before any copy is issued or waited on
    if (cs > 1) cg::this_cluster().sync();   // why: st.async into a CTA needs it started, its barriers initialised
    int s = 0;
    uint32_t ph = 0u;
    auto next_pos = [&]() {
        if (++s == R) { s = 0; ph ^= 1u; }
    };
    // a row's layout (rowpass.cuh's RrRow): the aligned kernel's constants, or (HD) the student row's own;
    // and this CTA's share of its vectors
    auto row_layout = [&](const TS* srow) -> RrRow {
        if (HD) return rr_row<TS>(srow, a.V);
        RrRow g;
        g.h = 0;
        g.nv = nv;
        g.nex = tail;
        g.t0 = (int64_t)nv * VEC;
        return g;
    };
    auto cta_vecs = [&](const RrRow& g) -> int {
        if (!HD) return n;
        const int nvr = (int)g.nv;
        return nvr - lo < per ? (nvr - lo > 0 ? nvr - lo : 0) : per;
    };
    if (tid < Ts) {
        // ---------------- statistics group ----------------
        bool ign_next = a.labels && cid < a.sc.N && rp_label(a.labels, a.lab64, cid) == a.ignore;
        int64_t it = 0;
        for (int64_t r = cid; r < a.sc.N; r += ncl, it++) {
            const bool ign = ign_next;
            if (a.labels && r + ncl < a.sc.N) ign_next = rp_label(a.labels, a.lab64, r + ncl) == a.ignore;
            const TS* srow = (const TS*)a.s + r * a.lds;
            const TT* trow = (const TT*)a.t + r * a.ldt;
            const RrRow w = row_layout(srow);
            const int wn = cta_vecs(w);
            const bool has_x = !ign && rank == 0 && tid < w.nex;
            const int64_t xcol = HD ? w.extra(tid) : w.t0 + tid;
            const float xs_x = has_x ? rp_sload(srow + xcol) * k2 : 0.0f, xt_x = has_x ? rp_sload(trow + xcol) * k2 : 0.0f;
            Stat1 st = {-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f}, st1 = st;
            auto acc = [&](Stat1& st, const uint4* sb, const uint4* tb, int q) {
                if constexpr (LZ) dc_acc_lz<TS, TT, MODE>(st, sb, tb, q, k2);
                else dc_acc<TS, TT, MODE, true>(st, sb, tb, q, k2);
            };
            // c: this thread's next vector in chunk coordinates, carried across slots (balanced shares)
            int c = tid;
            for (int j = 0; j < nsub; j++, next_pos()) {
                mbar_wait(&full[s], ph);
                const int v0 = j * sub;
                const int hi = ign ? 0 : (wn - v0 < sub ? wn - v0 : sub) + v0;   // chunk coordinates
                if (hi <= v0) continue;
                const uint4* sb = dp_ring + (size_t)s * slot_vecs - v0;   // sb[c], c in [v0, hi)
                const uint4* tb = dp_ring + (size_t)s * slot_vecs + sub - (size_t)v0 * NT;
                for (; c + Ts < hi; c += 2 * Ts) { acc(st, sb, tb, c); acc(st1, sb, tb, c + Ts); }
                if (c < hi) { acc(st, sb, tb, c); c += Ts; }
            }
            st = combine1<MODE>(st, st1);
            if (!ign && (isnan(st.Ss) || isnan(st.St) || isnan(st.u))) {
                // masked classes (-inf in both inputs): redo this thread's vectors from global memory
                // with the guarded formulas, as the staged kernel (the row is intact there: its
                // gradient is written after this exchange)
                const uint4* gsb = reinterpret_cast<const uint4*>(srow + w.h) + lo;
                const uint4* gtb = reinterpret_cast<const uint4*>(trow + w.h) + (int64_t)lo * NT;
                st = Stat1{-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
                for (int q = tid; q < wn; q += Ts) dc_acc<TS, TT, MODE, false>(st, gsb, gtb, q, k2);
            }
            if (has_x) st = combine1<MODE>(st, dc_one<MODE>(xs_x, xt_x));
            if constexpr (WX) {
                // WX (FUSEDLOSS_DISTILL_PIPE_WX, s34): each statistics warp sends its own partial to every rank and
                // the gradient warps merge the cs Ts / 32 of them over their lanes. Why: the group reduction held
                // every statistics warp at two named barriers a row, the second while thread 0 combined the warps'
                // partials one after another (combine1, four exponentials each): in the ncu source profile of H200
                // s29 run 2, ~10% of the statistics warps' samples, on the ring's critical path (the gradient warps
                // wait for the row's exchange 43% of theirs).
                st = dp_warp_reduce1<MODE>(st);
                if ((tid & 31) == 0) {
                    const int x = (int)(it % DP_XSLOTS), k = rank * (Ts >> 5) + (tid >> 5);
                    const float4 v0 = make_float4(st.ms, st.Ss, st.mt, st.St);
                    float* su = reinterpret_cast<float*>(&sl[x][WXM][0]);
                    if (cs > 1) {
                        // arm for every rank's partials (remote ones may land first: the tx count then goes negative
                        // until this expect_tx)
                        if (tid == 0) mbar_arrive_tx(&xbar[x], (uint32_t)(cs * (Ts >> 5)) * 20u);
                        const uint32_t l4 = smem_addr(&sl[x][k][0]), lu = smem_addr(su + k), lb = smem_addr(&xbar[x]);
                        for (int cc = 0; cc < cs; cc++) {
                            st_async_f4(mapa_shared(l4, cc), v0, mapa_shared(lb, cc));
                            st_async_f32(mapa_shared(lu, cc), st.u, mapa_shared(lb, cc));
                        }
                        if (tid != 0) mbar_arrive(&xbar[x]);
                    } else {
                        sl[x][k][0] = v0;
                        su[k] = st.u;
                        mbar_arrive(&xbar[x]);   // release: the stores above are visible to the waiters
                    }
                }
                continue;
            }
            st = dp_group_reduce1<MODE>(st, sm1, Ts);
            if (tid == 0) {
                const int x = (int)(it % DP_XSLOTS);
                const float4 v0 = make_float4(st.ms, st.Ss, st.mt, st.St), v1 = make_float4(st.u, 0.0f, 0.0f, 0.0f);
                if (cs > 1) {
                    // arm for the cs partials (a remote one may land first: the tx count then goes
                    // negative until this expect_tx)
                    mbar_arrive_tx(&xbar[x], (uint32_t)cs * 32u);
                    const uint32_t ls = smem_addr(&sl[x][rank][0]), lb = smem_addr(&xbar[x]);
                    for (int cc = 0; cc < cs; cc++) {
                        st_async_f4(mapa_shared(ls, cc), v0, mapa_shared(lb, cc));
                        st_async_f4(mapa_shared(ls + 16u, cc), v1, mapa_shared(lb, cc));
                    }
                } else {
                    sl[x][0][0] = v0;
                    sl[x][0][1] = v1;
                    mbar_arrive(&xbar[x]);   // release: the stores above are visible to the waiters
                }
            }
        }
    } else if (tid >= (int)blockDim.x - 32) {
        // ---------------- producer warp ----------------
        int64_t P = 0;
        for (int64_t r = cid; r < a.sc.N; r += ncl) {
            const bool ign = a.labels && rp_label(a.labels, a.lab64, r) == a.ignore;
            const RrRow w = row_layout((const TS*)a.s + r * a.lds);
            const int wn = cta_vecs(w);
            for (int j = 0; j < nsub; j++, P++, next_pos()) {
                if (P >= R) {   // position P - R released
                    if constexpr (NB) nbar_wait_refill(s, (ngw + 1) * 32);   // (cluster.cuh)
                    else mbar_wait_refill(&empty[s], ph ^ 1u);
                }
                dp_issue<TS, TT, TM>(a, r, w.h, ign, lo, wn, sub, j, dp_ring + (size_t)s * slot_vecs, &full[s], &tm);
            }
        }
    } else {
        // ---------------- gradient group ----------------
        const int gt = tid - Ts, ng = ngw * 32, lane = tid & 31;
        const float Dd = a.Ddev ? __ldcg(a.Ddev) : a.Dhost;   // row_grad's denominator
        bool ign_next = a.labels && cid < a.sc.N && rp_label(a.labels, a.lab64, cid) == a.ignore;
        int64_t it = 0;
        for (int64_t r = cid; r < a.sc.N; r += ncl, it++) {
            const bool ign = ign_next;
            if (a.labels && r + ncl < a.sc.N) ign_next = rp_label(a.labels, a.lab64, r + ncl) == a.ignore;
            float G = row_upstream(a, r);
            if (!a.none) G = G / Dd;
            G = ign ? 0.0f : G * a.loss_scale * a.inv_T;
            const TS* srow = (const TS*)a.s + r * a.lds;
            const TT* trow = (const TT*)a.t + r * a.ldt;
            TS* drow = (TS*)a.ds + r * a.lds;
            const RrRow w = row_layout(srow);
            const int wn = cta_vecs(w);
            const bool has_x = rank == 0 && gt < w.nex;
            const int64_t xcol = HD ? w.extra(gt) : w.t0 + gt;
            const float xs_x = (has_x && !ign) ? rp_sload(srow + xcol) : 0.0f;
            const float xt_x = (has_x && !ign) ? rp_sload(trow + xcol) : 0.0f;
            const int x = (int)(it % DP_XSLOTS);
            // every row's exchange completes one phase (ignored rows send empty partials)
            dp_wait_x(&xbar[x], (uint32_t)((it / DP_XSLOTS) & 1), cs);
            float L2s, L2t;
            Stat1 mg;
            if constexpr (WX) {   // lane k takes partial k (cs Ts / 32 <= WXM): every lane, warp and CTA the same bits
                Stat1 v = {-INFINITY, 0.0f, -INFINITY, 0.0f, 0.0f};
                const float* su = reinterpret_cast<const float*>(&sl[x][WXM][0]);
                if (lane < cs * (Ts >> 5)) {
                    const float4 p4 = sl[x][lane][0];
                    v = Stat1{p4.x, p4.y, p4.z, p4.w, su[lane]};
                }
                if constexpr (JSD) {   // (JSD: up to 64, lane k also partial k + 32, combined first)
                    if (lane + 32 < cs * (Ts >> 5)) {
                        const float4 p4 = sl[x][lane + 32][0];
                        v = combine1<MODE>(v, Stat1{p4.x, p4.y, p4.z, p4.w, su[lane + 32]});
                    }
                }
                mg = dp_warp_reduce1<MODE>(v);
            } else {
                mg = dc_merge<MODE>(sl[x], cs);
            }
            float l = dc_kl<MODE>(mg, L2s, L2t);
            const float beta = a.beta, omb = 1.0f - a.beta;
            float sh = 0.0f;   // JSD: (1 - beta) sum q (log q - log m) over the row
            if constexpr (JSD) {
                // the JSD's second sweep (sum p (log p - log m) and q (log q - log m), the staged kernel's
                // formulas), by the gradient warps over the vectors each later writes, from the ring: the row's
                // positions are complete (the statistics group waited on them) and stay until this warp's
                // releases below. Then the sums over the group (xor trees, the warps in order: named barrier 2,
                // which the JSD instances, never NB, leave free) and over the cluster (thread gt 0 sends the CTA's
                // to every rank; all merge them in rank order: the same bits in every thread and CTA). sl2 /
                // jbar reuse by row it + DP_XSLOTS follows the statistics exchange's rule (one hop later).
                float2 acc = make_float2(0.0f, 0.0f);
                auto elem = [&](float xs, float xt) {   // with the guards: JS 0, and JS's redo below
                    const float ls2 = fmaf(xs, k2, -L2s), lt2 = fmaf(xt, k2, -L2t);   // log2 q, log2 p
                    const float q = fexp2(ls2), p = fexp2(lt2);
                    const float lm = jsd_lm(beta, omb, p, q);   // p = q = 0: -126, and neither term is added
                    if (p > 0.0f) acc.x = fmaf(p, lt2 - lm, acc.x);
                    if (q > 0.0f) acc.y = fmaf(q, ls2 - lm, acc.y);
                };
                // JS: free of the guards (see the redo below); returns d = log2 q - log2 m, the stash
                auto elem_f = [&](float xs, float xt) -> float {
                    const float ls2 = fmaf(xs, k2, -L2s), lt2 = fmaf(xt, k2, -L2t);
                    const float q = fexp2(ls2), p = fexp2(lt2);
                    const float lm = jsd_lm(beta, omb, p, q);
                    acc.x = fmaf(p, lt2 - lm, acc.x);
                    acc.y = fmaf(q, ls2 - lm, acc.y);
                    return ls2 - lm;
                };
                if (!ign) {
                    int s2 = s;
                    uint32_t ph2 = ph;
                    int q2 = gt;
                    for (int j = 0; j < nsub; j++) {
                        const int v0 = j * sub;
                        const int hi = (wn - v0 < sub ? wn - v0 : sub) + v0;
                        if (hi > v0) {
                            mbar_wait(&full[s2], ph2);
                            const uint4* sb = dp_ring + (size_t)s2 * slot_vecs - v0;
                            const uint4* tb = dp_ring + (size_t)s2 * slot_vecs + sub - (size_t)v0 * NT;
#pragma unroll 2
                            for (; q2 < hi; q2 += ng) {
                                float xs[VEC], xt[VEC];
                                dc_unpack<TS, TT>(sb, tb, q2, xs, xt);
                                if constexpr (JS) {
                                    // where q > 0 (elsewhere the gradient multiplies d by q = 0): -126 <= log2 q
                                    // and log2 m <= 0, and log2 q - log2 m <= -log2(1 - beta): |d| < 2^8, fp16's
                                    // relative 2^-11 holds
                                    float d[VEC];
#pragma unroll
                                    for (int v = 0; v < VEC; v++) d[v] = elem_f(xs[v], xt[v]);
                                    dp_stash<TT, VEC>(const_cast<uint4*>(tb) + (size_t)q2 * NT, d);
                                } else {
#pragma unroll
                                    for (int v = 0; v < VEC; v++) elem(xs[v], xt[v]);
                                }
                            }
                        }
                        if (++s2 == R) { s2 = 0; ph2 ^= 1u; }
                    }
                    // JS: this thread's generic-proxy writes of the ring before the async-proxy refills that follow
                    // its releases (the producer fences too, after its acquire: mbar_wait_refill)
                    if constexpr (JS) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    if constexpr (JS) {
                        if (has_x) elem_f(xs_x, xt_x);
                        // JS (s41; default since s43): the sweep above is free of the p > 0 / q > 0 guards (0 *
                        // finite = 0 where an exponential underflows); a -inf logit (masked column) makes this
                        // thread's sums NaN, and it then redoes them from global memory with the guards, as the
                        // statistics group does (the stash needs no redo: satfinite keeps d finite, and q is 0
                        // there). NaN inputs give NaN again.
                        if (isnan(acc.x) || isnan(acc.y)) {
                            const uint4* gsb = reinterpret_cast<const uint4*>(srow + w.h) + lo;
                            const uint4* gtb = reinterpret_cast<const uint4*>(trow + w.h) + (int64_t)lo * NT;
                            acc = make_float2(0.0f, 0.0f);
                            for (int qq = gt; qq < wn; qq += ng) {
                                float xs[VEC], xt[VEC];
                                dc_unpack<TS, TT>(gsb, gtb, qq, xs, xt);
#pragma unroll
                                for (int v = 0; v < VEC; v++) elem(xs[v], xt[v]);
                            }
                            if (has_x) elem(xs_x, xt_x);
                        }
                    } else {
                        if (has_x) elem(xs_x, xt_x);
                    }
                }
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) {
                    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off);
                    acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off);
                }
                if (lane == 0) jw[gt >> 5] = acc;
                dp_bar(2, ng);   // why: the warps' sums visible to thread gt 0
                if (gt == 0) {
                    float A = 0.0f, B = 0.0f;
                    for (int k = 0; k < ngw; k++) { A += jw[k].x; B += jw[k].y; }
                    const float4 v0 = make_float4(A * RP_LN2, B * RP_LN2, 0.0f, 0.0f);
                    if (cs > 1) {
                        // arm for the cs sums (a remote one may land first: the tx count then goes negative until
                        // this expect_tx); jw is rewritten by the next row only after this phase completes
                        mbar_arrive_tx(&jbar[x], (uint32_t)cs * 16u);
                        const uint32_t ls = smem_addr(&sl2[x][rank]), lb = smem_addr(&jbar[x]);
                        for (int cc = 0; cc < cs; cc++) st_async_f4(mapa_shared(ls, cc), v0, mapa_shared(lb, cc));
                    } else {
                        sl2[x][0] = v0;
                        mbar_arrive(&jbar[x]);   // release: the store above (and the reads of jw) before the waiters
                    }
                }
                dp_wait_x(&jbar[x], (uint32_t)((it / DP_XSLOTS) & 1), cs);
                float A = 0.0f, B = 0.0f;
                for (int cc = 0; cc < cs; cc++) { A += sl2[x][cc].x; B += sl2[x][cc].y; }   // rank order
                l = beta * A + omb * B;
                sh = omb * B;
            }
            if (ign) l = 0.0f;
            if (rank == 0 && gt == 0) {
                if (a.none) { if (a.loss) a.loss[r] = l * a.loss_scale; }
                else a.rowloss[r] = l * a.loss_scale;
            }
            auto grad = [&](float xs, float xt) -> float {
                const float ls2 = fmaf(xs, k2, -L2s), lt2 = fmaf(xt, k2, -L2t);
                const float q = fexp2(ls2);
                if (MODE == FL__DISTILL_FKL) return G * (q - fexp2(lt2));
                if (MODE == FL__DISTILL_RKL) return G * (q * (RP_LN2 * fmaxf(ls2 - lt2, DS_NEG_BIG) - l));
                const float p = fexp2(lt2);
                const float hq = q > 0.0f ? omb * q * (RP_LN2 * (ls2 - jsd_lm(beta, omb, p, q))) : 0.0f;
                return G * (hq - q * sh);
            };
            const float Gc = G * omb * RP_LN2, Gsh = G * sh;   // (JS)
            int q = gt;   // this thread's next vector in chunk coordinates, carried across slots
            for (int j = 0; j < nsub; j++, next_pos()) {
                const int v0 = j * sub;
                const int hi = (wn - v0 < sub ? wn - v0 : sub) + v0;
                if (ign) {
                    float z[VEC];
#pragma unroll
                    for (int v = 0; v < VEC; v++) z[v] = 0.0f;
                    for (; q < hi; q += ng) rp_vstore<TS, VEC, !PST>(drow + w.h + (int64_t)(lo + q) * VEC, z);
                } else if (hi > v0) {
                    // already complete (the statistics group waited on it; it cannot be refilled before
                    // this warp's release): the acquire makes the bulk copy's bytes visible here
                    mbar_wait(&full[s], ph);
                    const uint4* sb = dp_ring + (size_t)s * slot_vecs - v0;
                    const uint4* tb = dp_ring + (size_t)s * slot_vecs + sub - (size_t)v0 * NT;
#pragma unroll 2
                    for (; q < hi; q += ng) {
                        float xs[VEC], xt[VEC];
                        if constexpr (JS) {   // q (Gc d - G sh), xt: the stashed d (finite: satfinite; the sweep above)
                            rp_unpack<TS>(sb[q], xs);
                            dp_unstash<TT, VEC>(tb + (size_t)q * NT, xt);
#pragma unroll
                            for (int v = 0; v < VEC; v++) xs[v] = fexp2(fmaf(xs[v], k2, -L2s)) * fmaf(Gc, xt[v], -Gsh);
                        } else {
                            dc_unpack<TS, TT>(sb, tb, q, xs, xt);
#pragma unroll
                            for (int v = 0; v < VEC; v++) xs[v] = grad(xs[v], xt[v]);
                        }
                        rp_vstore<TS, VEC, !PST>(drow + w.h + (int64_t)(lo + q) * VEC, xs);
                    }
                }
                if constexpr (NB) {
                    nbar_release(s, (ngw + 1) * 32);
                } else if (WX && j == 0) {
                    // WX: lane k alone read the row's partial k (above), so every lane releases its own reads on the
                    // row's first position: the xslot's reuse by row + DP_XSLOTS is ordered after it through the
                    // ring's refill chain (the reuse rule) by an edge racecheck can see. With lane 0's arrival after
                    // __syncwarp (s35-s38's WX) racecheck reported every such read (s38 run 1: 144 errors; it takes
                    // no edge from bar.warp.sync between lanes); this per-lane release: 0 hazards (s39 run 1).
                    mbar_arrive(&empty[s]);
                } else {
                    __syncwarp();   // why: the warp's reads of slot s are done before its release
                    if (lane == 0) {
                        if constexpr (WX) mbar_arrive_n(&empty[s], 32u);
                        else mbar_arrive(&empty[s]);
                    }
                }
            }
            if (has_x) drow[xcol] = from_float<TS>(ign ? 0.0f : grad(xs_x, xt_x));
        }
    }
    // every partial sent to this CTA has landed (waited above), but its own st.async to the others
    // may still be in flight: no CTA exits before all have passed their last exchange
    if (cs > 1) cg::this_cluster().sync();
#else
    __trap();  // chosen only on sm_90+
#endif
}

// ---- host side ----------------------------------------------------------------------------------
typedef void (*dk_fn)(DArgs);

template <typename TS, typename TT>
static dk_fn pick2(int mode, bool fused) {
    switch (mode) {
        case FL__DISTILL_FKL: return fused ? distill_kernel<TS, TT, FL__DISTILL_FKL, true> : distill_kernel<TS, TT, FL__DISTILL_FKL, false>;
        case FL__DISTILL_RKL: return fused ? distill_kernel<TS, TT, FL__DISTILL_RKL, true> : distill_kernel<TS, TT, FL__DISTILL_RKL, false>;
        default: return fused ? distill_kernel<TS, TT, FL__DISTILL_JSD, true> : distill_kernel<TS, TT, FL__DISTILL_JSD, false>;
    }
}

static dk_fn pick(fl_dtype sdt, fl_dtype tdt, int mode, bool fused) {
    const bool t32 = tdt == FL_DTYPE_F32;
    switch (sdt) {
        case FL_DTYPE_F32: return pick2<float, float>(mode, fused);
        case FL_DTYPE_F16: return t32 ? pick2<__half, float>(mode, fused) : pick2<__half, __half>(mode, fused);
        default: return t32 ? pick2<__nv_bfloat16, float>(mode, fused) : pick2<__nv_bfloat16, __nv_bfloat16>(mode, fused);
    }
}

#define DS_NKERN 30
static int g_occ[DS_NKERN];   // occupancy per kernel (the same on every device of one architecture)

static int kernel_index(fl_dtype sdt, fl_dtype tdt, int mode, bool fused) {
    const int pair = sdt == FL_DTYPE_F32 ? 0 : (sdt == FL_DTYPE_F16 ? 1 : 3) + (tdt == FL_DTYPE_F32);
    return (pair * 3 + mode) * 2 + (fused ? 1 : 0);
}

template <typename TS, typename TT>
static const void* pick_staged2(int mode, bool fused, int nt) {
    if (nt == DC_THREADS_WIDE) {   // forward / reverse KL only (dc_plan)
        if (mode == FL__DISTILL_FKL)
            return fused ? (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_FKL, true, DC_THREADS_WIDE>
                         : (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_FKL, false, DC_THREADS_WIDE>;
        return fused ? (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_RKL, true, DC_THREADS_WIDE>
                     : (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_RKL, false, DC_THREADS_WIDE>;
    }
    switch (mode) {
        case FL__DISTILL_FKL: return fused ? (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_FKL, true>
                                           : (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_FKL, false>;
        case FL__DISTILL_RKL: return fused ? (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_RKL, true>
                                           : (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_RKL, false>;
        default: return fused ? (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_JSD, true>
                              : (const void*)distill_staged_kernel<TS, TT, FL__DISTILL_JSD, false>;
    }
}

static const void* pick_staged(fl_dtype sdt, fl_dtype tdt, int mode, bool fused, int nt) {
    const bool t32 = tdt == FL_DTYPE_F32;
    switch (sdt) {
        case FL_DTYPE_F32: return pick_staged2<float, float>(mode, fused, nt);
        case FL_DTYPE_F16:
            return t32 ? pick_staged2<__half, float>(mode, fused, nt) : pick_staged2<__half, __half>(mode, fused, nt);
        default: return t32 ? pick_staged2<__nv_bfloat16, float>(mode, fused, nt)
                            : pick_staged2<__nv_bfloat16, __nv_bfloat16>(mode, fused, nt);
    }
}

// Knobs (A/B runs): FUSEDLOSS_DISTILL_STAGED=0 turns the staged kernel off, =2 takes it for the JSD
// too (default 1: forward / reverse KL only); FUSEDLOSS_DISTILL_STAGED_KB
// (default 72: three CTAs per SM) caps the shared memory of one CTA, the cluster size follows
// (<= 16 CTAs); FUSEDLOSS_DISTILL_STAGED_GRID caps the clusters launched (tests: the row loop and
// its cross-row prefetch at small N); FUSEDLOSS_DISTILL_STAGED_ROWS=2 gives each CTA two row buffers
// in the same KB (so clusters twice as large): the next row's copies then also overlap this row's
// statistics sweep (H200 2026-12-02 session 4 run 1: correct, --small 4668/0 and memcheck 0, but
// SLOWER: KL T=2 4096x128256 bf16 2.54 ms vs 1.84 with one buffer; clusters of 16 halve each CTA's
// share of a row and double the per-row fixed cost per byte; kept as a knob, not the default);
// FUSEDLOSS_DISTILL_STAGED_THREADS=768 (forward / reverse KL; experimental, not yet measured: written
// in session 15, which had no GPU): one 768-thread CTA an SM instead of three of 256 (the same warps
// and register budget), meant for ROWS=2 with KB=128: two 64 KB row buffers at clusters of 8 (s4's
// ROWS=2 doubled the clusters instead), so the next row's copies are in flight during this row's
// statistics sweep and exchange, which with one buffer leave HBM idle (NOTES "Distillation: the
// staged cluster kernel"): FUSEDLOSS_DISTILL_STAGED_THREADS=768 FUSEDLOSS_DISTILL_STAGED_ROWS=2
// FUSEDLOSS_DISTILL_STAGED_KB=128.
// FUSEDLOSS_DEBUG=1 prints the occupancy of each new plan.
struct DcPlan { int cs, per, nv, nb, nt; size_t smem; const void* fn; };

// sm_90 (dev_info) and every row's body 16-byte aligned (base pointers and row strides), as the
// staged and the ring kernels need: 1, with the device, the vectors of a row (*nv) and the teacher's
// 16-byte vectors per student vector (*NT); else 0
static int dc_aligned_rows(const fl__distill_params* p, const void* s, const void* t, const void* ds, DevInfo* d,
                           int64_t* nv, int64_t* NT) {
    if (dev_info(d) != cudaSuccess || d->cc_major < 9) { (void)cudaGetLastError(); return 0; }
    const size_t es = fl__dtype_size(p->dtype), et = fl__dtype_size(p->teacher_dtype);
    const int64_t VEC = (int64_t)(16 / es);
    if (((uintptr_t)s & 15u) || ((uintptr_t)t & 15u) || (ds && ((uintptr_t)ds & 15u))) return 0;
    if ((p->ld_s * (int64_t)es) % 16 || (p->ld_t * (int64_t)et) % 16) return 0;
    *nv = p->V / VEC;
    *NT = VEC * (int64_t)et / 16;
    return 1;
}


static int dc_plan(const fl__distill_params* p, const void* s, const void* t, const void* ds, bool fused, DcPlan* out) {
    // read on every call, as rp_plan's knobs (an A/B in one process: bench_distill.py --ab)
    const char* knob = getenv("FUSEDLOSS_DISTILL_STAGED");
    const int want = knob && *knob ? atoi(knob) : 1;
    if (want <= 0 || p->N <= 0) return 0;
    // JSD (three sweeps, 8 MUFU operations an element) measured no faster staged than on the
    // ticket kernel (H200 2026-12-02 runs 13-14: 3.90 / 3.67 ms vs 3.68 / 3.60 ms at 4096x128256
    // bf16): the ticket kernel by default, the staged one with FUSEDLOSS_DISTILL_STAGED=2
    if (p->mode == FL__DISTILL_JSD && want < 2) return 0;
    const int gcap = (int)rp_env_i64("FUSEDLOSS_DISTILL_STAGED_GRID", 0);
    int kb = (int)rp_env_i64("FUSEDLOSS_DISTILL_STAGED_KB", 72);
    if (kb < 8 || kb > 200) kb = 72;
    const int debug = (int)rp_env_i64("FUSEDLOSS_DEBUG", 0);
    const int nb = rp_env_i64("FUSEDLOSS_DISTILL_STAGED_ROWS", 1) >= 2 ? 2 : 1;
    const int nt = rp_env_i64("FUSEDLOSS_DISTILL_STAGED_THREADS", DC_THREADS) == DC_THREADS_WIDE &&
                           p->mode != FL__DISTILL_JSD ? DC_THREADS_WIDE : DC_THREADS;
    DevInfo d;
    int64_t nv, NT;
    if (!dc_aligned_rows(p, s, t, ds, &d, &nv, &NT)) return 0;
    if (nv < 4 * nt) return 0;   // short rows: the ticket kernel (a CTA per several rows)
    const int64_t vb = 16 * (1 + NT);    // shared bytes per vector of the row
    const int64_t chunk = (int64_t)kb * 1024 / (vb * nb);
    int maxcs = (int)rp_env_i64("FUSEDLOSS_DISTILL_STAGED_MAXCS", DC_MAX_CLUSTER);
    if (maxcs > DC_MAX_CLUSTER) maxcs = DC_MAX_CLUSTER;
    int cs = 1;
    while ((int64_t)cs * chunk < nv && cs < maxcs) cs *= 2;
    if ((int64_t)cs * chunk < nv) return 0;
    out->cs = cs;
    out->nv = (int)nv;
    out->per = (int)((nv + cs - 1) / cs);
    out->nb = nb;
    out->nt = nt;
    out->smem = (size_t)nb * (size_t)out->per * (size_t)vb;
    out->fn = pick_staged(p->dtype, p->teacher_dtype, (int)p->mode, fused, nt);
    int n = 0;
    if (fl__cluster_occupancy(out->fn, cs, nt, out->smem, d.sms, debug, "staged distillation kernel", &n) !=
            cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return 0;
    }
    if (gcap > 0 && n > gcap) n = gcap;   // tests: several rows per cluster at small N
    return n;   // resident clusters
}

// The default since 2026-12-05 for the fused forward / reverse KL on sm_90 (FUSEDLOSS_DISTILL_PIPE=0:
// the staged kernel), for rows the staged kernel's alignment rules admit: distill_pipe_kernel. H200
// s16 runs 2-3, KL T=2 4096x128256 bf16 kernel: staged 1.254-1.263 ms (1.65-1.67x the floor), ring
// 1.147-1.150 ms (1.52x; 672 threads with 384 statistics threads 1.49x, 3-CTA clusters 1.59-1.79x,
// 192 / 320 statistics threads 1.69 / 1.55x). Other shapes not timed yet. Knobs, read on every call: _PIPE_THREADS (CTA size, default 544, at most 672),
// _PIPE_STATS (statistics threads, default half of the non-producer warps), _PIPE_RING (KB of ring,
// default 220 since s23; the cluster picked as for 200: _PIPE_RING_PICK), _PIPE_SUB (KB a slot at most, default 32), _PIPE_SLACK (KB of the ring beyond one
// row's chunk, i.e. of the next row in flight, default 48), _PIPE_CS (force a cluster size),
// _PIPE_GRID (cap the clusters: tests of the row loop at small N), _PIPE_PLAIN_ST (default 1: the
// gradient stored default-cached, as the CE ring mode measured best in s12 run 4; 0: evict-first,
// as the staged kernel). The plan takes the smallest cluster whose per-CTA chunk leaves the slack
// free and that the device holds. KL T=2 4096x128256 bf16: cs 4, 4 slots of
// 1002 vectors (31 KB), R = 6 (188 KB), 33 clusters.
// _PIPE_HEAD (default 1 since s22; 0: the ticket kernel): rows that are not 16-byte aligned but of one
// phase in student, teacher and dstudent (GPT-2's 50257 columns in bf16) take the HD kernel instead of
// the ticket kernel. H100 s22 run 2, KL T=2 kernel x floor, ticket / HD: 8192x50257 bf16 1.93 / 1.21x,
// bf16 student / fp32 teacher 1.80 / 1.19x; tests 3098/0 (--kl --min-v 8192: 20 unaligned ring plans),
// memcheck 0.
// _PIPE_NBAR=1 (off; session 18, not yet run): the slots released through hardware barriers (NB above;
// aligned rows, _PLAIN_ST=1).
// _PIPE_TMAP=1 (off; session 19, not yet run): the producer through tensor maps (TM above; aligned rows,
// _PLAIN_ST=1, not with _NBAR), slots rounded to 8 vectors.
struct DpPlan {
    int cs, per, nv, sub, R, T, Ts, tm;
    size_t smem;
    const void* fn;
    FlTmaps2 maps;   // tm: the student's and teacher's maps; else zero. The kernel's last argument.
};

// JSD (FUSEDLOSS_DISTILL_PIPE_JSD, default 1): only with the WX exchange and the lazy statistics or tensor maps, default-cached
// stores, not NB (its named barrier 2 is NB's first slot barrier); else no kernel (the staged / ticket kernels)
template <typename TS, typename TT, bool PST, bool HD, bool NB = false, bool TM = false, bool LZ = false, bool WX = false>
static const void* pick_pipe3(int mode, int js = 0) {
    if (mode == FL__DISTILL_JSD) {
        if constexpr (PST && !NB && (LZ || TM) && WX) {
            return js ? (const void*)distill_pipe_kernel<TS, TT, FL__DISTILL_JSD, PST, HD, NB, TM, LZ, WX, 1>
                      : (const void*)distill_pipe_kernel<TS, TT, FL__DISTILL_JSD, PST, HD, NB, TM, LZ, WX>;
        }
        return nullptr;
    }
    return mode == FL__DISTILL_FKL ? (const void*)distill_pipe_kernel<TS, TT, FL__DISTILL_FKL, PST, HD, NB, TM, LZ, WX>
                                   : (const void*)distill_pipe_kernel<TS, TT, FL__DISTILL_RKL, PST, HD, NB, TM, LZ, WX>;
}

// (the unaligned-row kernels with default-cached stores only: _PLAIN_ST=0 on such rows takes the
// kernels below the ring)
// (NB, TM: the aligned kernels with default-cached stores only)
// (LZ, the lazy-reference statistics: the default-cached kernels without NB / TM, aligned or not; WX: with LZ, and
// with TM, whose copies racecheck can follow, so that WX's exchange can be racechecked)
// (WX on the kernels that take it: PST, not NB)
template <typename TS, typename TT, bool HD, bool TM, bool LZ>
static const void* pick_pipe_wx(int mode, int js) {
    return pick_pipe3<TS, TT, true, HD, false, TM, LZ, true>(mode, js);
}
template <typename TS, typename TT>
static const void* pick_pipe2(int mode, bool pst, bool hd, bool nb, bool tm, bool lz, bool wx, int js) {
    if (tm && wx) return pst && !hd && !nb ? pick_pipe_wx<TS, TT, false, true, false>(mode, js) : nullptr;
    if (tm) return pst && !hd && !nb ? pick_pipe3<TS, TT, true, false, false, true>(mode) : nullptr;
    if (nb) return pst && !hd ? pick_pipe3<TS, TT, true, false, true>(mode) : nullptr;
    if (lz && pst && wx) return hd ? pick_pipe_wx<TS, TT, true, false, true>(mode, js)
                                   : pick_pipe_wx<TS, TT, false, false, true>(mode, js);
    if (lz && pst) return hd ? pick_pipe3<TS, TT, true, true, false, false, true>(mode)
                             : pick_pipe3<TS, TT, true, false, false, false, true>(mode);
    if (hd) return pst ? pick_pipe3<TS, TT, true, true>(mode) : nullptr;
    return pst ? pick_pipe3<TS, TT, true, false>(mode) : pick_pipe3<TS, TT, false, false>(mode);
}

static const void* pick_pipe(fl_dtype sdt, fl_dtype tdt, int mode, bool pst, bool hd, bool nb, bool tm, bool lz,
                             bool wx = false, int js = 0) {
    const bool t32 = tdt == FL_DTYPE_F32;
    switch (sdt) {
        case FL_DTYPE_F32: return pick_pipe2<float, float>(mode, pst, hd, nb, tm, lz, wx, js);
        case FL_DTYPE_F16:
            return t32 ? pick_pipe2<__half, float>(mode, pst, hd, nb, tm, lz, wx, js)
                       : pick_pipe2<__half, __half>(mode, pst, hd, nb, tm, lz, wx, js);
        default:
            return t32 ? pick_pipe2<__nv_bfloat16, float>(mode, pst, hd, nb, tm, lz, wx, js)
                       : pick_pipe2<__nv_bfloat16, __nv_bfloat16>(mode, pst, hd, nb, tm, lz, wx, js);
    }
}

// Rows not 16-byte aligned that distill_pipe_kernel<..., HD = true> takes: sm_90, and in every row the
// teacher and dstudent are 16-byte aligned at the student row's first 16-byte boundary (column h).
// A row's address mod 16 repeats every 16 rows (16 / gcd(ld bytes, 16) divides 16), so rows 0-15 decide
// for all. E.g. bf16 / bf16 rows of 50257 with equally aligned bases, or a bf16 student with an fp32
// teacher of the same row length (the teacher's phase is twice the student's). Fills as dc_aligned_rows
// (*nv = V / VEC, the most vectors a row can have).
static int dp_head_rows(const fl__distill_params* p, const void* s, const void* t, const void* ds, DevInfo* d,
                        int64_t* nv, int64_t* NT) {
    if (dev_info(d) != cudaSuccess || d->cc_major < 9) { (void)cudaGetLastError(); return 0; }
    const size_t es = fl__dtype_size(p->dtype), et = fl__dtype_size(p->teacher_dtype);
    const int64_t VEC = (int64_t)(16 / es);
    for (int64_t r = 0; r < p->N && r < 16; r++) {
        const uintptr_t sa = (uintptr_t)s + (uintptr_t)(r * p->ld_s * (int64_t)es);
        const uintptr_t h = ((16u - (sa & 15u)) & 15u) / es;   // s is element-aligned (distill_cuda)
        if (((uintptr_t)t + (uintptr_t)((r * p->ld_t + (int64_t)h) * (int64_t)et)) & 15u) return 0;
        if (ds && (((uintptr_t)ds + (uintptr_t)((r * p->ld_s + (int64_t)h) * (int64_t)es)) & 15u)) return 0;
    }
    *nv = p->V / VEC;
    *NT = VEC * (int64_t)et / 16;
    return 1;
}

// the ring's slots of sb vectors for a chunk of ns of them: what `ring` vectors hold, within DP_MAX_SLOTS
// (NB_MAX_SLOTS with nb) and the xslot reuse rule
static int64_t dp_slots(int64_t ring, int64_t sb, int64_t ns, bool nb) {
    int64_t r = ring / sb;
    if (r > DP_MAX_SLOTS) r = DP_MAX_SLOTS;
    if (nb && r > NB_MAX_SLOTS) r = NB_MAX_SLOTS;
    if (r > (DP_XSLOTS / 2 + 1) * ns - 1) r = (DP_XSLOTS / 2 + 1) * ns - 1;   // the xslot reuse rule
    return r;
}

static int dp_plan(const fl__distill_params* p, const void* s, const void* t, const void* ds, bool fused, DpPlan* out) {
    // _PIPE_JSD (default 1 since s39; 0: the ticket kernel): the fused JSD on the ring too, its second sweep (the
    // KL-to-mixture sums) by the gradient warps from the ring and a second exchange (distill_pipe_kernel's JSD). Why:
    // the ticket / staged kernels run the JSD's three sweeps as phases whose memory, SFU and issue times add (2.78x
    // the floor at 4096x128256 bf16 on the H200); the ring overlaps the copies with both groups' sweeps. H100 s39
    // runs 1-2, JSD beta 0.5 T 1 4096x128256 bf16 kernel time (profile_zoo_step): ticket 2.52 ms (2.40x) -> ring
    // 1.89-1.90 ms with 192 statistics threads, 1.79-1.81 ms (1.71-1.72x) with 256, 1.90 with 128; 768 threads
    // with 256: 1.88. So 672 threads, 256 statistics (40% of the non-producer warps; fewer where the cluster's
    // statistics warps would exceed the merge's 32 lanes), and a ring 4 KB smaller (the second exchange's static
    // shared memory). _PIPE_THREADS / _PIPE_STATS still override.
    const bool jsd = p->mode == FL__DISTILL_JSD;
    if (!fused || p->N <= 0 || (jsd && rp_env_flag("FUSEDLOSS_DISTILL_PIPE_JSD", 1) != 1)) return 0;
    if (rp_env_flag("FUSEDLOSS_DISTILL_PIPE", 1) != 1) return 0;
    DevInfo d;
    int64_t nv, NT;
    bool hd = false;   // rows not 16-byte aligned, of one phase (FUSEDLOSS_DISTILL_PIPE_HEAD=0: the ticket kernel)
    if (!dc_aligned_rows(p, s, t, ds, &d, &nv, &NT)) {
        if (rp_env_flag("FUSEDLOSS_DISTILL_PIPE_HEAD", 1) != 1 || !dp_head_rows(p, s, t, ds, &d, &nv, &NT)) return 0;
        hd = true;
    }
    if (nv < 1024) return 0;
    const int T0 = jsd ? 672 : 544;
    int T = (int)rp_env_i64("FUSEDLOSS_DISTILL_PIPE_THREADS", T0) / 32 * 32;
    if (T < 128 || T > DP_MAX_THREADS) T = T0;
    const int Ts0 = jsd ? (T - 32) / 32 * 2 / 5 * 32   // JSD: 40% of the non-producer warps (672: 256)
                        : (T - 32) / 64 * 32;
    int Ts = (int)rp_env_i64("FUSEDLOSS_DISTILL_PIPE_STATS", Ts0) / 32 * 32;
    if (Ts < 32 || Ts > T - 64) Ts = Ts0;
    // (JSD: 211 KB since s40, the WX merge's 64 partials a xslot taking 5 KB more static shared memory; at 216 KB a
    // forced cluster 8 failed cudaFuncSetAttribute, 4 API errors under memcheck in H100 s40 run 3)
    const int ring_max = jsd ? 211 : 220;
    int ring_kb = (int)rp_env_i64("FUSEDLOSS_DISTILL_PIPE_RING", ring_max);
    if (ring_kb < 16 || ring_kb > ring_max) ring_kb = ring_max;
    /* the ring size that picks the cluster (the slack rule below), ring_kb then sizing the slots of that cluster.
     * Why (s22, not yet run as a pair): RING=220 alone was 1-6% faster at 4096x128256 bf16 (cluster 4, 7 slots
     * instead of 6) but 12% slower at 2048x256000, where it moved the cluster from 8 CTAs to 7 (15 clusters of 7
     * resident: 105 of 132 SMs). FUSEDLOSS_DISTILL_PIPE_RING=220 FUSEDLOSS_DISTILL_PIPE_RING_PICK=200 keeps
     * the 200 KB ring's cluster and adds the slot. The default since s23 (H100 run 1, bench_distill step x floor,
     * 220/200 against the old 200/200, two alternations: 4096x128256 1.30, 1.29 / 1.32, 1.34; 2048x256000 1.25, 1.21
     * / 1.33, 1.32; 8192x32000 1.31, 1.46 / 1.39, 1.26 (noise; min 0.655, 0.646 / 0.665, 0.662 ms); 8192x50257
     * 1.48, 1.46 / 1.48, 1.43); tests 4668/0. RING_PICK defaults to the smaller of 200 and RING. */
    int pick_kb = (int)rp_env_i64("FUSEDLOSS_DISTILL_PIPE_RING_PICK", ring_kb < 200 ? ring_kb : 200);
    if (pick_kb < 16 || pick_kb > ring_kb) pick_kb = ring_kb;
    int sub_kb = (int)rp_env_i64("FUSEDLOSS_DISTILL_PIPE_SUB", 32);
    if (sub_kb < 1 || sub_kb > 64) sub_kb = 32;
    const int64_t slack = rp_env_i64("FUSEDLOSS_DISTILL_PIPE_SLACK", 48) * 1024;
    const int force = (int)rp_env_i64("FUSEDLOSS_DISTILL_PIPE_CS", 0);
    const int gcap = (int)rp_env_i64("FUSEDLOSS_DISTILL_PIPE_GRID", 0);
    const int debug = (int)rp_env_i64("FUSEDLOSS_DEBUG", 0);
    const bool pst = rp_env_flag("FUSEDLOSS_DISTILL_PIPE_PLAIN_ST", 1) != 0;
    const bool nb = rp_env_flag("FUSEDLOSS_DISTILL_PIPE_NBAR", 0) != 0;
    bool tm = !nb && !hd && pst && rp_env_flag("FUSEDLOSS_DISTILL_PIPE_TMAP", 0) != 0;
    memset(&out->maps, 0, sizeof out->maps);
    if (tm) {   // no driver entry point / too big: raw copies
        const int ok = fl__tmaps_encode(s, (size_t)((p->N - 1) * p->ld_s + p->V) * fl__dtype_size(p->dtype),
                                        &out->maps.s) == 0 &&
                       fl__tmaps_encode(t, (size_t)((p->N - 1) * p->ld_t + p->V) * fl__dtype_size(p->teacher_dtype),
                                        &out->maps.t) == 0;
        tm = fl__tmap_note(ok, "pipelined distillation kernel", (int)rp_env_i64("FUSEDLOSS_DEBUG", 0)) != 0;
        if (!tm) memset(&out->maps, 0, sizeof out->maps);
    }
    out->tm = tm;
    const int64_t vb = 16 * (1 + NT);   // shared bytes per vector of the row
    const int64_t ring = (int64_t)ring_kb * 1024 / vb, ring_pick = (int64_t)pick_kb * 1024 / vb, subv = (int64_t)sub_kb * 1024 / vb > 0 ? (int64_t)sub_kb * 1024 / vb : 1;
    const int lo = force > 0 && force <= DC_MAX_CLUSTER ? force : 1, hi = force > 0 && force <= DC_MAX_CLUSTER ? force : DC_MAX_CLUSTER;
    // _PIPE_LAZY (default 1 since session 29; 0: dc_acc, the exact per-vector maxima): the statistics group's
    // exponentials against lazy references (dc_acc_lz above); not with _NBAR / _TMAP. H100 s29 run 3, KL T=2
    // 4096x128256 bf16, kernel GPU time (profile_zoo_step, two alternations): 1.143 / 1.142 ms -> 1.105 / 1.104 ms
    // (1.07x -> 1.04x of that card's floor); tests --small --kl 2338/0, --kl --min-v 8192 3098/0, memcheck 0.
    const bool lz = !nb && !tm && rp_env_flag("FUSEDLOSS_DISTILL_PIPE_LAZY", 1) != 0;
    const void* fn_plain = pick_pipe(p->dtype, p->teacher_dtype, (int)p->mode, pst, hd, nb, tm, lz);   // JSD: none
    if (!fn_plain && !jsd) return 0;
    // _PIPE_WX (default 1 since s35; 0: the group reduction): the statistics warps' partials exchanged one a warp
    // and merged by the gradient warps (distill_pipe_kernel's WX), with the lazy statistics (or with _TMAP, for
    // racecheck), where the cluster's statistics warps fit the merge's 32 lanes and the WX kernel fits the SM;
    // else the plain kernel. KL T=2 4096x128256 bf16 kernel GPU time (profile_zoo_step): H200 s35 run 1 1.093 ->
    // 0.950 ms (1.46x -> 1.24x of the floor), bench_distill graphed 1.50x -> 1.29x; H100 s34 run 3 with the teacher
    // aliased 1.111 -> 0.967 ms. Since s39 every lane releases its own partial's read (the ring's first position of
    // a row): racecheck through tensor maps 144 errors (s38, lane 0's release) -> 0 hazards, kernel time 1.058 /
    // 1.059 -> 1.053 / 1.054 ms (H100 s39 run 1, alternated); the lane-0 release's instances were removed.
    const bool wx = rp_env_flag("FUSEDLOSS_DISTILL_PIPE_WX", 1) != 0;
    // _PIPE_JST (default 1 since s40; JSD only; 0: no stash): the JSD's stash (distill_pipe_kernel's JS): the second
    // sweep keeps d = log2 q - log2 m in the ring over the teacher's value and the gradient sweep takes one exponential
    // an element, not three (8 -> 6 SFU operations an element). Why: H100 s40 run 1's ncu source counters of the ring
    // at 4096x128256 bf16 (1.80 ms): the statistics warps wait for their slots 47% of their samples (the gradient
    // warps, with 6 of the 8 SFU operations an element, hold the ring's slots through two sweeps). H100 s40 run 2, JSD
    // beta 0.5 kernel time (profile_zoo_step, alternated): 4096x128256 bf16 1.799 / 1.799 -> 1.678 / 1.676 ms (1.69x
    // -> 1.60x), 8192x32000 0.798 -> 0.742, 2048x256000 1.921 -> 1.784, 8192x50257 (unaligned) 1.347 -> 1.193, fp32
    // teacher 2.528 -> 2.429; tests --small 4668/0 in five plans, --min-v 8192 6188/0, memcheck 0, racecheck through
    // tensor maps 0 hazards, pytest distill -k cuda 269 passed (the fp16 d within the existing tolerances).
    // Since s43 the stash's kernel is s41's (then JST=4): the gradient sweep's diet (q (Gc d - G sh), d saturated to
    // the finite range: no q > 0 test, select or two multiplies an element) and the second sweep free of its p > 0 /
    // q > 0 guards (masked columns: the thread's sums redone with them). H100 s43 run 1, 4096x128256 bf16 kernel
    // time (profile_zoo_step, two alternations): s40's stash 1.672 / 1.672 ms (1.58x) -> 1.628 / 1.617 (1.54x);
    // 8192x32000 0.739 -> 0.715, 2048x256000 1.678 -> 1.639, 4096x32000 1.47x -> 1.42x / 1.40x; tests --small 4668/0
    // (also with _CS=8 and _TMAP=1), the full grid 9228/0, --min-v 8192 6188/0, memcheck 0, racecheck through tensor
    // maps 0 hazards, pytest distill/jsd/kl 797 passed. The diet alone (s40's JST=2) 1.636 / 1.626 ms; with the
    // waits backing off with nanosleep (JST=3) 1.654 / 1.644: both removed.
    int js = jsd ? (int)rp_env_flag("FUSEDLOSS_DISTILL_PIPE_JST", 1) : 0;
    if (js != 0) js = 1;
    const void* fn_wx = wx && (lz || tm)
                            ? pick_pipe(p->dtype, p->teacher_dtype, (int)p->mode, pst, hd, nb, tm, lz, true, js)
                            : nullptr;
    if (!fn_plain && !fn_wx) return 0;
    out->nv = (int)nv;
    out->T = T;
    // the smallest cluster whose per-CTA chunk leaves the slack free and that the device can hold
    for (int cc = lo; cc <= hi; cc++) {
        const int64_t per = (nv + cc - 1) / cc;
        int64_t ns = (per + subv - 1) / subv;
        int64_t sb = (per + ns - 1) / ns;
        if (tm) fl__tmap_round(per, &sb, &ns);   // TM (cluster.cuh)
        const int64_t rp = dp_slots(ring_pick, sb, ns, nb);   // the picking ring's slots: the slack rule
        if (rp - ns < 1 || (rp - ns) * sb * vb < slack) continue;
        const int64_t r = dp_slots(ring, sb, ns, nb);   // >= rp (ring >= ring_pick)
        out->cs = cc;
        out->per = (int)per;
        out->sub = (int)sb;
        out->R = (int)r;
        out->smem = (size_t)r * (size_t)sb * (size_t)vb;
        // JSD (WX only): the statistics group cut to what the merge's 32 lanes hold at this cluster size
        // (DP_WX_MAX_JSD since s40: two partials a lane, cluster 8 keeps 8 statistics warps)
        const int wxm = jsd ? DP_WX_MAX_JSD : DP_WX_MAX;
        out->Ts = jsd && cc * (Ts >> 5) > wxm ? wxm / cc * 32 : Ts;
        // the WX kernel where its merge's lanes hold the cluster's statistics warps and it fits, else the plain one
        const void* const fns[2] = {cc * (out->Ts >> 5) <= wxm ? fn_wx : nullptr, fn_plain};
        int n = 0;
        for (const void* f : fns) {
            if (!f) continue;
            if (fl__cluster_occupancy(f, cc, T, out->smem, d.sms, debug,
                                      f == fn_wx ? "pipelined distillation kernel (WX)"
                                      : hd       ? "pipelined distillation kernel (unaligned rows)"
                                                 : "pipelined distillation kernel",
                                      &n) == cudaSuccess && n > 0) {
                out->fn = f;
                break;
            }
            (void)cudaGetLastError();
            n = 0;
        }
        if (n <= 0) continue;   // e.g. a cluster wider than the device schedules: try the next size
        if (gcap > 0 && n > gcap) n = gcap;
        return n;   // resident clusters
    }
    return 0;
}

static fl_status distill_cuda(const char* fn, fl__pass pass, const fl__distill_params* p, float* loss, void* ds,
                              const void* s, const void* t, const float* gl, float grad_scale, void* workspace,
                              cudaStream_t stream) {
    const int64_t N = p->N;
    const bool fused = pass == FL__PASS_FUSED;
    const int none = p->reduction == FL_REDUCTION_NONE;
    char* ws = (char*)workspace;
    const size_t a4 = ((size_t)4 * (size_t)N + 255u) & ~(size_t)255u;
    const size_t a8 = ((size_t)8 * (size_t)N + 255u) & ~(size_t)255u;
    float* Dslot = (float*)(ws + 16);
    float* rowloss = (float*)(ws + 256);
    int* cnt = (int*)(ws + 256 + a4);
    float* part = (float*)(ws + 256 + a4 + a8);
    const bool count_rows = p->reduction == FL_REDUCTION_MEAN && p->labels != NULL;
    float Dhost = 1.0f;
    if (p->reduction == FL_REDUCTION_MEAN || p->reduction == FL_REDUCTION_BATCHMEAN) Dhost = (float)N;

    const size_t es = fl__dtype_size(p->dtype), et = fl__dtype_size(p->teacher_dtype);
    if (((uintptr_t)s % es) || ((uintptr_t)t % et) || (ds && ((uintptr_t)ds % es)))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: student, teacher and dstudent must be aligned to their element "
                        "sizes (%p, %p, %p)", fn, s, t, ds);
    if (N == 0) {
        if (!none && loss) {
            FL_CUDA_TRY(rp_reduce(rowloss, 0, part, nullptr, p->reduction == FL_REDUCTION_SUM ? 1.0f : 0.0f, loss, stream));
        }
        return FL_OK;
    }
    DpPlan pp;
    const int npc = dp_plan(p, s, t, ds, fused, &pp);
    DcPlan dp;
    const int ncl = npc ? npc : dc_plan(p, s, t, ds, fused, &dp);
    // counters and the ticket start at 0 (the ticket kernel only)
    if (!ncl) FL_CUDA_TRY(cudaMemsetAsync(ws, 0, 16, stream));
    if (!ncl) FL_CUDA_TRY(cudaMemsetAsync(cnt, 0, a8, stream));
    if (count_rows) {
        FL_CUDA_TRY(rp_count(p->labels, p->label_dtype == FL_INDEX_I64, p->ignore_index, N, part, Dslot, stream));
    }

    const dk_fn kfn = pick(p->dtype, p->teacher_dtype, (int)p->mode, fused);
    int64_t resident = 0;
    const int P = (p->mode == FL__DISTILL_JSD ? 2 : 1) + (fused ? 1 : 0);

    DArgs a;
    if (ncl) {
        memset(&a.sc, 0, sizeof a.sc);
        a.sc.N = N;
    } else {
        FL_CUDA_TRY(rp_resident((const void*)kfn,
                                &g_occ[kernel_index(p->dtype, p->teacher_dtype, (int)p->mode, fused)], &resident));
        a.sc = rp_plan(N, p->V, P, resident, (unsigned long long*)ws);
    }
    a.s = s;
    a.t = t;
    a.ds = ds;
    a.loss = none ? loss : nullptr;
    a.rowloss = rowloss;
    a.labels = p->labels;
    a.gl = gl;
    a.Ddev = count_rows ? Dslot : nullptr;
    a.cnt1 = cnt;
    a.cnt2 = cnt + N;
    a.part = part;
    a.V = p->V;
    a.lds = p->ld_s;
    a.ldt = p->ld_t;
    a.ignore = p->ignore_index;
    a.k2 = RP_LOG2E / p->temperature;
    a.beta = p->beta;
    a.loss_scale = p->loss_scale;
    a.inv_T = 1.0f / p->temperature;
    a.gscale = grad_scale;
    a.Dhost = Dhost;
    a.lab64 = p->label_dtype == FL_INDEX_I64;
    a.none = none;

    if (npc) {
        const int64_t G = N < npc ? N : npc;   // clusters: one per row up to what is resident
        void* args[] = {&a, &pp.cs, &pp.per, &pp.nv, &pp.sub, &pp.R, &pp.Ts, &pp.maps};
        FL_CUDA_TRY(fl__launch_clusters(pp.fn, args, G, pp.cs, pp.T, pp.smem, stream));
    } else if (ncl) {
        const int64_t G = N < ncl ? N : ncl;   // clusters: one per row up to what is resident
        void* args[] = {&a, &dp.cs, &dp.per, &dp.nv, &dp.nb};
        FL_CUDA_TRY(fl__launch_clusters(dp.fn, args, G, dp.cs, dp.nt, dp.smem, stream));
    } else {
        int64_t grid = resident;
        const int64_t useful = N * a.sc.C * P;
        if (grid > useful) grid = useful;
        if (grid < 1) grid = 1;
        kfn<<<(unsigned)grid, RP_THREADS, 0, stream>>>(a);
        FL_CUDA_TRY(cudaGetLastError());
    }
    if (!none && loss) {
        FL_CUDA_TRY(rp_reduce(rowloss, N, part, count_rows ? Dslot : nullptr, Dhost, loss, stream));
    }
    return FL_OK;
}

extern "C" {

fl_status fl_distill_forward_cuda(float* loss, const void* student, int64_t ld_student, const void* teacher,
                                  int64_t ld_teacher, fl_dtype teacher_dtype, const void* labels,
                                  fl_index_dtype label_dtype, int64_t N, int64_t V, fl_dtype dtype,
                                  const fl_distill_options* opts, void* workspace, size_t workspace_bytes,
                                  fl_stream stream) {
    static const char* fn = "fl_distill_forward_cuda";
    fl__clear_error();
    fl__distill_params p;
    FL_CHECK(fl__distill_validate(fn, FL__PASS_FORWARD, 1, loss, NULL, student, ld_student, teacher, ld_teacher,
                                  teacher_dtype, labels, label_dtype, NULL, 1.0f, N, V, dtype, opts, workspace,
                                  workspace_bytes, &p));
    return distill_cuda(fn, FL__PASS_FORWARD, &p, loss, NULL, student, teacher, NULL, 1.0f, workspace,
                        (cudaStream_t)stream);
}

fl_status fl_distill_fused_cuda(float* loss, void* dstudent, const void* student, int64_t ld_student,
                                const void* teacher, int64_t ld_teacher, fl_dtype teacher_dtype, const void* labels,
                                fl_index_dtype label_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                int64_t V, fl_dtype dtype, const fl_distill_options* opts, void* workspace,
                                size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_distill_fused_cuda";
    fl__clear_error();
    fl__distill_params p;
    FL_CHECK(fl__distill_validate(fn, FL__PASS_FUSED, 1, loss, dstudent, student, ld_student, teacher, ld_teacher,
                                  teacher_dtype, labels, label_dtype, grad_loss, grad_scale, N, V, dtype, opts,
                                  workspace, workspace_bytes, &p));
    return distill_cuda(fn, FL__PASS_FUSED, &p, loss, dstudent, student, teacher, grad_loss, grad_scale, workspace,
                        (cudaStream_t)stream);
}

}  // extern "C"
