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
#include "rowpass.cuh"

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
template <int MODE>
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
        for (int k = 1; k < RP_THREADS / 32; k++) v = combine1<MODE>(v, sm[k]);
    }
    __syncthreads();
    return v;
}

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
        for (int k = 1; k < RP_THREADS / 32; k++) { v.x += sm[k].x; v.y += sm[k].y; }
    }
    __syncthreads();
    return v;
}

// the row's upstream gradient times loss_scale / T
__device__ __forceinline__ float row_grad(const DArgs& a, int64_t r) {
    float g = a.gscale * (a.gl ? __ldg(a.gl + (a.none ? r : 0)) : 1.0f);
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
                            if (gs > st.ms) {
                                const float f = rp_rescale(st.ms, gs);
                                st.Ss *= f;
                                if (MODE == FL__DISTILL_RKL) st.u *= f;
                                st.ms = gs;
                            }
                            if (gt > st.mt) {
                                const float f = rp_rescale(st.mt, gt);
                                st.St *= f;
                                if (MODE == FL__DISTILL_FKL) st.u *= f;
                                st.mt = gt;
                            }
#pragma unroll
                            for (int u = 0; u < U; u++) {
                                if (!in[u]) continue;
#pragma unroll
                                for (int e = 0; e < VEC; e++) {
                                    const float es = exp2f(xs[u][e] - st.ms), et = exp2f(xt[u][e] - st.mt);
                                    st.Ss += es;
                                    st.St += et;
                                    if (MODE == FL__DISTILL_FKL) st.u += et * (xt[u][e] - xs[u][e]);
                                    if (MODE == FL__DISTILL_RKL) st.u += es * (xs[u][e] - xt[u][e]);
                                }
                            }
                        });
                    // scalar head / tail (or the whole chunk when the row cannot be vectorised)
                    rp_scalars(g, [&](int64_t col) {
                        const float xs = rp_sload(srow + col) * k2, xt = rp_sload(trow + col) * k2;
                        Stat1 one = {xs, 1.0f, xt, 1.0f, 0.0f};
                        if (MODE == FL__DISTILL_FKL) one.u = xt - xs;
                        if (MODE == FL__DISTILL_RKL) one.u = xs - xt;
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
                    const float q = exp2f(ls2), p = exp2f(lt2);
                    const float lm = log2f(beta * p + omb * q);
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
                        const float q = exp2f(ls2);
                        if (MODE == FL__DISTILL_FKL) return G * (q - exp2f(lt2));
                        if (MODE == FL__DISTILL_RKL) return G * (q * (RP_LN2 * (ls2 - lt2) - l));
                        const float p = exp2f(lt2);
                        const float hq = q > 0.0f ? omb * q * (RP_LN2 * (ls2 - log2f(beta * p + omb * q))) : 0.0f;
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
    // counters and the ticket start at 0
    FL_CUDA_TRY(cudaMemsetAsync(ws, 0, 16, stream));
    FL_CUDA_TRY(cudaMemsetAsync(cnt, 0, a8, stream));
    if (count_rows) {
        FL_CUDA_TRY(rp_count(p->labels, p->label_dtype == FL_INDEX_I64, p->ignore_index, N, part, Dslot, stream));
    }

    const dk_fn kfn = pick(p->dtype, p->teacher_dtype, (int)p->mode, fused);
    int64_t resident = 0;
    FL_CUDA_TRY(rp_resident((const void*)kfn, &g_occ[kernel_index(p->dtype, p->teacher_dtype, (int)p->mode, fused)],
                            &resident));
    const int P = (p->mode == FL__DISTILL_JSD ? 2 : 1) + (fused ? 1 : 0);

    DArgs a;
    a.sc = rp_plan(N, p->V, P, resident, (unsigned long long*)ws);
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

    int64_t grid = resident;
    const int64_t useful = N * a.sc.C * P;
    if (grid > useful) grid = useful;
    if (grid < 1) grid = 1;
    kfn<<<(unsigned)grid, RP_THREADS, 0, stream>>>(a);
    FL_CUDA_TRY(cudaGetLastError());
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
