/* rowpass.cuh — the row-softmax machinery shared by the distillation (distill.cu) and the target
 * losses (margin softmax CE, softmax focal over rows: target_ce.cu): rows cut into chunks, a work
 * item = (phase, row, chunk), persistent CTAs taking items from one ticket counter in an order that
 * interleaves the phases by blocks of rows so that a row's re-read follows its first read by about one
 * round (L2 hits), per-row completion counters and a fixed-order merge, vector loads with register
 * double buffering, and the reduce / count kernels of the scalar reductions.
 *
 * Ticket order: round k holds phase 0 of row block k, then phase 1 of block k - 1, then phase 2 of
 * block k - 2 (P phases, S = R x C slots each; slots past N rows or outside [0, nb) are skipped). A
 * CTA waits only for items of earlier phases of the same row, whose tickets are smaller and so are
 * held by CTAs already running: no deadlock whatever the number of co-resident CTAs.
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_CUDA_ROWPASS_CUH
#define FL_CUDA_ROWPASS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../internal.h"
#include "common.cuh"

#define RP_THREADS 256
#define RP_LOG2E 1.4426950408889634f
#define RP_LN2 0.6931471805599453f

template <typename T> struct RpT;
template <> struct RpT<float> { static constexpr int VEC = 4; };
template <> struct RpT<__half> { static constexpr int VEC = 8; };
template <> struct RpT<__nv_bfloat16> { static constexpr int VEC = 8; };

__device__ __forceinline__ float2 rp_u2f(unsigned v, __half) { return __half22float2(*reinterpret_cast<__half2*>(&v)); }
__device__ __forceinline__ float2 rp_u2f(unsigned v, __nv_bfloat16) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));   // exact
}
// 16 bytes of T -> 16 / sizeof(T) floats at f
template <typename T>
__device__ __forceinline__ void rp_unpack(const uint4& u, float* f) {
    if constexpr (sizeof(T) == 4) {
        f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y); f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
    } else {
        const float2 a = rp_u2f(u.x, T()), b = rp_u2f(u.y, T()), c = rp_u2f(u.z, T()), d = rp_u2f(u.w, T());
        f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y; f[4] = c.x; f[5] = c.y; f[6] = d.x; f[7] = d.y;
    }
}
template <typename T> __device__ __forceinline__ float rp_sload(const T* p) { return to_float(__ldcg(p)); }

// VEC floats -> VEC elements of T at p (16-byte aligned), streaming store (STREAM = false: a
// default-cached one)
template <typename T, int VEC, bool STREAM = true>
__device__ __forceinline__ void rp_vstore(T* p, const float* f) {
    if constexpr (sizeof(T) == 4) {
        if (STREAM) FL_STCS(reinterpret_cast<float4*>(p), make_float4(f[0], f[1], f[2], f[3]));
        else *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    } else {
        unsigned w[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const T lo = from_float<T>(f[2 * k]), hi = from_float<T>(f[2 * k + 1]);
            w[k] = (unsigned)*reinterpret_cast<const unsigned short*>(&lo) |
                   ((unsigned)*reinterpret_cast<const unsigned short*>(&hi) << 16);
        }
        if (STREAM) FL_STCS(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
        else *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// A row's layout for the ring kernels (ringrow.cuh's rr_kernel, distill.cu's distill_pipe_kernel): h
// head columns before its first 16-byte boundary (0 for aligned rows), nv 16-byte vectors from there,
// nex extra columns (the head, then the tail from t0), extra e at column extra(e)
struct RrRow {
    int64_t h, nv, nex, t0;
    __device__ __forceinline__ int64_t extra(int64_t e) const { return e < h ? e : t0 + (e - h); }
};
template <typename T>
static __device__ __forceinline__ RrRow rr_row(const T* x, int64_t C) {
    constexpr int VEC = 16 / (int)sizeof(T);
    RrRow r;
    r.h = (int64_t)(((16u - ((uintptr_t)x & 15u)) & 15u) / sizeof(T));   // x is element-aligned
    if (r.h > C) r.h = C;
    r.nv = (C - r.h) / VEC;
    r.t0 = r.h + r.nv * VEC;
    r.nex = C - r.nv * VEC;
    return r;
}

// Columns [lo, hi) of chunk c of a row (chunks of chk columns; chunk 0 also takes the h scalar head
// elements before the first 16-byte aligned column), and its vector-aligned part [vlo, vhi).
struct RpRange {
    int64_t lo, hi, vlo, vhi;
};
template <int VEC>
__device__ __forceinline__ RpRange rp_range(int64_t c, int64_t C, int64_t V, int64_t chk, int64_t h, bool vec_ok) {
    RpRange g;
    g.lo = c == 0 ? 0 : min(V, c * chk + h);
    g.hi = c == C - 1 ? V : min(V, (c + 1) * chk + h);
    if (!vec_ok) { g.vlo = g.vhi = g.lo; return g; }
    g.vlo = c == 0 ? min(h, V) : g.lo;
    if (g.vlo > g.hi) g.vlo = g.hi;
    g.vhi = g.vlo + ((g.hi - g.vlo) / VEC) * VEC;
    return g;
}

// The vector part of a chunk for one thread, U vectors per step, the next step's loads issued before
// the current step is processed (register double buffering). grp(xs, xt, in, col0) gets the step's
// values as floats (xt: the second input, TWO only), in[u] whether vector u is inside the range, and
// the column of vector 0 (vector u at col0 + u * RP_THREADS * VEC). LAST: evict-first loads (the last
// read of these bytes), else L2-only loads (kept for the re-read).
template <typename TS, typename TT, bool TWO, bool LAST, int U, typename G>
__device__ __forceinline__ void rp_stream(const TS* srow, const TT* trow, const RpRange& g, G&& grp) {
    constexpr int VEC = RpT<TS>::VEC;
    constexpr int NT = TWO ? (int)(VEC * sizeof(TT) / 16) : 1;
    constexpr int64_t STEP = (int64_t)U * RP_THREADS * VEC;
    int64_t v0 = g.vlo + (int64_t)threadIdx.x * VEC;
    if (v0 >= g.vhi) return;
    uint4 cs[U], ct[U][NT];
    bool cin[U];
    auto load = [&](int64_t base, uint4 (&rs)[U], uint4 (&rt)[U][NT], bool (&inn)[U]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t col = base + (int64_t)u * RP_THREADS * VEC;
            inn[u] = col < g.vhi;
            if (inn[u]) {
                const uint4* ps = reinterpret_cast<const uint4*>(srow + col);
                rs[u] = LAST ? FL_LDCS(ps) : __ldcg(ps);
                if constexpr (TWO) {
                    const uint4* pt = reinterpret_cast<const uint4*>(trow + col);
#pragma unroll
                    for (int k = 0; k < NT; k++) rt[u][k] = LAST ? FL_LDCS(pt + k) : __ldcg(pt + k);
                }
            }
        }
    };
    load(v0, cs, ct, cin);
    for (;;) {
        const int64_t v1 = v0 + STEP;
        uint4 ns[U], nt[U][NT];
        bool nin[U];
#pragma unroll
        for (int u = 0; u < U; u++) nin[u] = false;
        const bool more = v1 < g.vhi;
        if (more) load(v1, ns, nt, nin);
        float xs[U][VEC], xt[U][VEC];
#pragma unroll
        for (int u = 0; u < U; u++) {
            rp_unpack<TS>(cs[u], xs[u]);
            if constexpr (TWO) {
#pragma unroll
                for (int k = 0; k < NT; k++) rp_unpack<TT>(ct[u][k], xt[u] + k * (16 / (int)sizeof(TT)));
            }
        }
        grp(xs, xt, cin, v0);
        if (!more) break;
#pragma unroll
        for (int u = 0; u < U; u++) {
            cs[u] = ns[u];
            cin[u] = nin[u];
#pragma unroll
            for (int k = 0; k < NT; k++) ct[u][k] = nt[u][k];
        }
        v0 = v1;
    }
}

// the scalar columns of a chunk ([lo, vlo) then [vhi, hi)), strided over the CTA: f(col)
template <typename F>
__device__ __forceinline__ void rp_scalars(const RpRange& g, F&& f) {
    const int64_t nh = g.vlo - g.lo, ns = nh + (g.hi - g.vhi);
    for (int64_t i = threadIdx.x; i < ns; i += RP_THREADS) f(i < nh ? g.lo + i : g.vhi + (i - nh));
}

__device__ __forceinline__ float rp_rescale(float m_old, float m_new) {
    return m_old == -INFINITY ? 0.0f : exp2f(m_old - m_new);
}

// thread 0 waits until *c >= want (then a fence), the CTA follows
__device__ __forceinline__ void rp_wait(const int* c, int want) {
    if (threadIdx.x == 0) {
        const volatile int* v = c;
        while (*v < want) __nanosleep(64);
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ int64_t rp_label(const void* labels, int lab64, int64_t r) {
    return lab64 ? (int64_t)__ldg((const long long*)labels + r) : (int64_t)__ldg((const int*)labels + r);
}

// The schedule of one launch (host-computed)
struct RpSched {
    unsigned long long* ticket;
    int64_t N, C, chk, R, nb, S, total;
    int P;
};

// decode ticket t: returns false for a padding slot
__device__ __forceinline__ bool rp_decode(const RpSched& s, int64_t t, int& phase, int64_t& r, int64_t& c) {
    const int64_t PS = (int64_t)s.P * s.S;
    const int64_t k = t / PS, rem = t % PS;
    phase = (int)(rem / s.S);
    const int64_t slot = rem % s.S, b = k - phase;
    r = b * s.R + slot / s.C;
    c = slot % s.C;
    return b >= 0 && b < s.nb && r < s.N;
}

// Scalar reductions over n per-row / per-position values, deterministic and spread over the GPU:
// stage 1, rp_red_blocks(n) CTAs (a function of n only) each reduce a fixed contiguous range into
// part[b]; stage 2, one CTA adds part[] in order. The partials live in the caller's scratch (the
// workspace's statistics region, free before the main kernel and after it).
#define RP_RED_MAX 256
static inline __host__ __device__ int rp_red_blocks(int64_t n) {   // (device: target_ce.cu's PM 3)
    int64_t b = (n + 16383) / 16384;
    return (int)(b < 1 ? 1 : b > RP_RED_MAX ? RP_RED_MAX : b);
}

template <typename V, int NT>
__device__ __forceinline__ V rp_block_sum(V v) {
    __shared__ V sm[NT / 32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    V s = 0;
    if (threadIdx.x == 0)
        for (int k = 0; k < NT / 32; k++) s += sm[k];
    return s;   // valid in thread 0
}

// stage 1 of MEAN's count of entries != ignore
// Ranges of a multiple of 4 entries, so that with 16-byte aligned labels each block reads 16-byte
// vectors (2 int64 / 4 int32 a load, two loads a thread in flight): the scalar loop read 8 bytes
// a thread at a time (13 us for 4.2M int64 labels, 2.6 TB/s, H200 2026-12-02 s5 run 4).
static __global__ void __launch_bounds__(1024) rp_count_kernel(const void* labels, int lab64, int64_t ignore, int64_t n,
                                                              long long* part) {
    const int64_t per = ((n + gridDim.x - 1) / gridDim.x + 3) & ~(int64_t)3, lo = (int64_t)blockIdx.x * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    long long c = 0;
    int64_t i0 = lo;
    if (((uintptr_t)labels & 15u) == 0 && lo < hi) {
        const int64_t nq = (hi - lo) / 4;   // 4-entry groups of the range
        if (lab64) {
            const longlong2* q = (const longlong2*)((const long long*)labels + lo);
            for (int64_t g = threadIdx.x; g < nq; g += 1024) {
                const longlong2 u = q[2 * g], w = q[2 * g + 1];   // default-cached: the main kernel reads them next
                c += (u.x != ignore) + (u.y != ignore) + (w.x != ignore) + (w.y != ignore);
            }
        } else {
            const int4* q = (const int4*)((const int*)labels + lo);
            for (int64_t g = threadIdx.x; g < nq; g += 1024) {
                const int4 u = q[g];
                c += ((int64_t)u.x != ignore) + ((int64_t)u.y != ignore) + ((int64_t)u.z != ignore) +
                     ((int64_t)u.w != ignore);
            }
        }
        i0 = lo + 4 * nq;
    }
    for (int64_t i = i0 + threadIdx.x; i < hi; i += 1024) c += rp_label(labels, lab64, i) != ignore;
    c = rp_block_sum<long long, 1024>(c);
    if (threadIdx.x == 0) part[blockIdx.x] = c;
}
// TRIGGER: lets the next kernel, launched with programmatic stream serialisation (PDL), start now; it
// waits (griddepcontrol.wait) before reading D (target_ce.cu's position kernels with PM != 0)
template <bool TRIGGER = false>
static __global__ void __launch_bounds__(32) rp_count_final(const long long* part, int nb, float* D) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (TRIGGER) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    // the warp's lanes add parts l, l + 32, ... and a shuffle tree the lanes (integers: any order is
    // exact): 256 parts (4.2M labels) 5 us -> 2 us from one thread's loop of dependent loads (H100 s24
    // runs 2-3; loading 4 label groups a thread before counting in rp_count_kernel gained nothing there:
    // 17 -> 18 us, not kept)
    long long s = 0;
    for (int k = threadIdx.x; k < nb; k += 32) s += part[k];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) *D = (float)s;
}

// stage 1 of SUM / MEAN / BATCHMEAN: part[b] = the double sum of rowloss over block b's range
// (ranges of a multiple of 4, float4 loads when rowloss is 16-byte aligned, as rp_count_kernel; the
// order of the sum is fixed by n alone, whatever the alignment)
static __global__ void __launch_bounds__(1024) rp_reduce_kernel(const float* rowloss, int64_t n, double* part) {
    const int64_t per = ((n + gridDim.x - 1) / gridDim.x + 3) & ~(int64_t)3, lo = (int64_t)blockIdx.x * per;
    const int64_t hi = lo + per < n ? lo + per : n;
    double s = 0.0;
    const int64_t nq = lo < hi ? (hi - lo) / 4 : 0;   // 4-entry groups; thread t adds groups t, t + 1024, ...
    if (((uintptr_t)rowloss & 15u) == 0) {
        const float4* q = (const float4*)(rowloss + lo);
        for (int64_t g = threadIdx.x; g < nq; g += 1024) {
            const float4 u = __ldcs(q + g);
            s += (double)u.x;
            s += (double)u.y;
            s += (double)u.z;
            s += (double)u.w;
        }
    } else {   // the same order from scalar loads
        for (int64_t g = threadIdx.x; g < nq; g += 1024)
            for (int j = 0; j < 4; j++) s += (double)rowloss[lo + 4 * g + j];
    }
    for (int64_t i = lo + 4 * nq + threadIdx.x; i < hi; i += 1024) s += (double)rowloss[i];
    s = rp_block_sum<double, 1024>(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
// loss[0] = sum of part[] / D (D from Ddev when non-NULL, else Dhost; D == 0: NaN)
static __global__ void __launch_bounds__(32) rp_reduce_final(const double* part, int nb, const float* Ddev, float Dhost,
                                                            float* loss) {
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int k = 0; k < nb; k++) tot += part[k];
        const double D = Ddev ? (double)*Ddev : (double)Dhost;
        loss[0] = D == 0.0 ? NAN : (float)(tot / D);
    }
}

// host: the two stages of each (scratch: >= 8 * rp_red_blocks(n) bytes, 8-byte aligned)
// stage 2 of the count over nb parts in scratch (trigger: rp_count_final's PDL trigger for the next kernel)
static inline cudaError_t rp_count_finish(const void* scratch, int nb, float* D, cudaStream_t stream, bool trigger) {
    if (trigger) rp_count_final<true><<<1, 32, 0, stream>>>((const long long*)scratch, nb, D);
    else rp_count_final<<<1, 32, 0, stream>>>((const long long*)scratch, nb, D);
    return cudaGetLastError();
}
static inline cudaError_t rp_count(const void* labels, int lab64, int64_t ignore, int64_t n, void* scratch, float* D,
                                   cudaStream_t stream, bool trigger = false) {
    const int nb = rp_red_blocks(n);
    rp_count_kernel<<<nb, 1024, 0, stream>>>(labels, lab64, ignore, n, (long long*)scratch);
    return rp_count_finish(scratch, nb, D, stream, trigger);
}
static inline cudaError_t rp_reduce(const float* rowloss, int64_t n, void* scratch, const float* Ddev, float Dhost,
                                    float* loss, cudaStream_t stream) {
    const int nb = rp_red_blocks(n);
    if (n > 0) rp_reduce_kernel<<<nb, 1024, 0, stream>>>(rowloss, n, (double*)scratch);
    rp_reduce_final<<<1, 32, 0, stream>>>((const double*)scratch, n > 0 ? nb : 0, Ddev, Dhost, loss);
    return cudaGetLastError();
}

// ---- the row losses of sections 14-15 (taylor_ce.cu, large_margin_ce.cu): one host plan --------------
// Workspace (SUM / MEAN; src/internal.h): float D at 16 | reduction partials at 256 | per-row fp32
// losses at FL__TAYLOR_WS_HEAD; NONE: the per-row losses go straight to loss[]. Kernels: one warp per
// row up to C = 1024 (warp_threads / 32 rows per CTA, at most 16 CTAs per SM, grid-strided), one CTA
// per row beyond (2 per SM in flight).
struct RlPlan {
    int none, mean;
    float* D;        // MEAN's count (device), else NULL
    void* part;      // the two-stage reductions' partials
    float* rowloss;  // loss[] (NONE) or the workspace's per-row losses
};
static inline RlPlan rl_plan(void* workspace, float* loss, fl_reduction reduction) {
    RlPlan w;
    w.none = reduction == FL_REDUCTION_NONE;
    w.mean = reduction == FL_REDUCTION_MEAN;
    char* ws = (char*)workspace;
    w.D = w.none ? nullptr : (float*)(ws + 16);
    w.part = w.none ? nullptr : (void*)(ws + 256);
    w.rowloss = w.none ? loss : (float*)(ws + FL__TAYLOR_WS_HEAD);
    return w;
}
// before the row kernel: N == 0 writes SUM 0 / MEAN NaN (*done = 1); else MEAN's count
static inline cudaError_t rl_begin(const RlPlan& w, float* loss, const void* targets, int lab64, int64_t ignore,
                                   int64_t N, cudaStream_t stream, int* done) {
    *done = N == 0;
    if (N == 0) return (!w.none && loss) ? rp_reduce(w.rowloss, 0, w.part, nullptr, w.mean ? 0.0f : 1.0f, loss, stream)
                                         : cudaSuccess;
    return w.mean ? rp_count(targets, lab64, ignore, N, w.part, w.D, stream) : cudaSuccess;
}
// after it: SUM / MEAN of the per-row losses (when the loss is wanted)
static inline cudaError_t rl_end(const RlPlan& w, float* loss, int64_t N, cudaStream_t stream) {
    return (!w.none && loss) ? rp_reduce(w.rowloss, N, w.part, w.mean ? w.D : nullptr, 1.0f, loss, stream)
                             : cudaSuccess;
}
// 16-byte vectors usable: logits, dlogits (when written) and the row stride all 16-byte aligned
static inline bool rl_vec16(const void* logits, const void* dlogits, int fused, int64_t ld, size_t es) {
    return ((uintptr_t)logits % 16) == 0 && (!fused || ((uintptr_t)dlogits % 16) == 0) && ((size_t)ld * es) % 16 == 0;
}
// the grid of the row kernels (see above)
static inline cudaError_t rl_grid(int64_t N, int64_t C, int warp_threads, unsigned* grid) {
    int dev = 0, sms = 132;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    const bool warp = C <= 1024;
    const int64_t per_cta = warp ? warp_threads / 32 : 1;
    int64_t g = (N + per_cta - 1) / per_cta;
    const int64_t cap = (int64_t)sms * (warp ? 16 : 2);
    *grid = (unsigned)(g > cap ? cap : g);
    return cudaSuccess;
}

// ---- one read of the row in the CTA-per-row kernels (Taylor, large margin; C > 1024) ---------------
// Their pass 1 reads thread t's 16-byte vectors q = t, t + T, t + 2T, ... of the row and pass 2 reads
// the same vectors again. Staged (RL_STAGE): pass 1 also keeps each vector in dynamic shared memory
// at its index q, and pass 2 takes it from there, so the row leaves HBM once. Every thread reads back
// only the slots it wrote itself, so staging needs no barrier. Without it, pass 2 re-read the row
// from L2 with at most 2 rows per SM in flight (H200 2026-12-01 run 29: Taylor 8192x32000 bf16
// fwd+bwd 2.62x its floor). Used when fused, 16-byte aligned, and the row's vectors fit
// RL_STAGE_MAX_BYTES: at least 2 CTAs per SM, so one CTA's loads overlap another's stores (one
// staged row per SM would run its load, reduction and stores one after another);
// FUSEDLOSS_ROW_STAGE=0 turns it off (A/B).
#define RL_STAGE_MAX_BYTES (100 * 1024)
static inline int rl_stage_knob(void) {
    static int k = -1;
    if (k < 0) {
        const char* v = getenv("FUSEDLOSS_ROW_STAGE");
        k = (v && *v) ? atoi(v) != 0 : 1;
    }
    return k;
}
// dynamic shared memory of the staged kernel for rows of C elements of es bytes (0: not staged);
// max_bytes <= RL_STAGE_MAX_BYTES: the caller's cap
static inline size_t rl_stage_bytes(int64_t C, size_t es, bool vec16, int fused, int64_t max_bytes) {
    const int64_t bytes = (C / (int64_t)(16 / es)) * 16;
    return (fused && vec16 && C > 1024 && rl_stage_knob() && bytes <= max_bytes && bytes <= RL_STAGE_MAX_BYTES)
               ? (size_t)bytes : 0;
}
// grid of a staged kernel: its resident CTAs (with `smem` bytes each; the kernel's shared-memory cap
// raised once), at most one per row
static inline cudaError_t rl_stage_grid(const void* fn, int threads, size_t smem, int64_t N, unsigned* grid) {
    int dev = 0, sms = 0, occ = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, RL_STAGE_MAX_BYTES);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, threads, smem);
    if (e != cudaSuccess) return e;
    const int64_t cap = (int64_t)(sms > 0 ? sms : 1) * (occ > 0 ? occ : 1);
    *grid = (unsigned)(N < cap ? N : cap);
    return cudaSuccess;
}

// ---- host helpers ---------------------------------------------------------------------------------
static inline int64_t rp_env_i64(const char* name, int64_t dflt) {
    const char* v = getenv(name);
    if (!v || !*v) return dflt;
    const long long x = atoll(v);
    return x > 0 ? (int64_t)x : dflt;
}
// an on/off (or mode) knob: its value as set, 0 included (rp_env_i64 maps 0 to the default, so a
// knob read through it could not be switched off: FUSEDLOSS_DISTILL_PIPE=0 and FUSEDLOSS_TC_PIPE=0 ran
// the rings anyway until s17 run 1 showed it)
static inline int64_t rp_env_flag(const char* name, int64_t dflt) {
    const char* v = getenv(name);
    return v && *v ? (int64_t)atoll(v) : dflt;
}

// Resident CTAs of kernel fn (RP_THREADS threads, no dynamic shared memory) on the current device;
// *occ caches the per-SM occupancy (0 = not known yet). 0 on a CUDA error (the caller reports it).
static inline cudaError_t rp_resident(const void* fn, int* occ, int64_t* resident) {
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess && *occ == 0) {
        int o = 0;
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, fn, RP_THREADS, 0);
        *occ = o > 0 ? o : 1;
    }
    *resident = (int64_t)(sms > 0 ? sms : 1) * (*occ > 0 ? *occ : 1);
    return e;
}

// The schedule for N rows of V columns and P phases with `resident` CTAs. Chunks of 8192 columns
// grown (x2 .. x16) while there are still >= 4 items per resident CTA per phase: fewer items, less
// fixed cost per byte (run 22, KL 4096 x 128256 bf16: x4 2.17 ms, x8 2.12, x16 2.05; x1 2.82). Rows per block: about FUSEDLOSS_ROWPASS_ITEMS (default 2 x resident) items per
// phase. The chunk count never exceeds ceil(V / FL__DISTILL_CHUNK) (the workspace's partials).
static inline RpSched rp_plan(int64_t N, int64_t V, int P, int64_t resident, unsigned long long* ticket) {
    RpSched s;
    s.ticket = ticket;
    s.N = N;
    s.P = P;
    const int64_t c8 = (V + FL__DISTILL_CHUNK - 1) / FL__DISTILL_CHUNK;
    int64_t k = rp_env_i64("FUSEDLOSS_ROWPASS_CHUNK_X", 0);
    if (k == 0) {
        k = 1;
        while (k < 16 && c8 >= 2 * k && N * ((c8 + 2 * k - 1) / (2 * k)) >= 4 * resident) k *= 2;
    }
    s.chk = (int64_t)FL__DISTILL_CHUNK * k;
    s.C = (V + s.chk - 1) / s.chk;
    const int64_t items = rp_env_i64("FUSEDLOSS_ROWPASS_ITEMS", 2 * resident);
    int64_t R = P == 1 ? N : (items + s.C - 1) / s.C;   // one phase: nothing to keep close, one block
    if (R > N) R = N;
    if (R < 1) R = 1;
    s.R = R;
    s.nb = (N + R - 1) / R;
    s.S = R * s.C;
    s.total = (s.nb + P - 1) * P * s.S;
    return s;
}

#endif /* FL_CUDA_ROWPASS_CUH */
