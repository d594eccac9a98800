/* cross_entropy.cu — CUDA backend of cross-entropy: forward, backward from lse, fused.
 *
 * Semantics and gradient formulas: include/fusedloss.h and src/cpu/cross_entropy.c (the CPU
 * backend is the specification; tests/test_cross_entropy_cuda.c checks this file against it).
 * Dtypes built: logits fp32 / fp16 / bf16 (dlogits in the same dtype), targets int32 / int64.
 * Numerics: all arithmetic in fp32 (ex2.approx for exp, tanhf, logf; no fast-math); sums over rows in double
 * in a fixed order, so results are bitwise reproducible run to run.
 *
 * Kernels:
 *   ce_tma_kernel   sm_90, fused (and, by knob, forward/backward) for rows of > 512 vectors: the
 *                   ONE-read kernel. Persistent thread-block clusters; each CTA stages its chunk of
 *                   a row in shared memory (cp.async.bulk + mbarrier), the row's statistics are
 *                   exchanged over DSMEM with one cluster barrier, the gradient is swept from
 *                   shared memory. Default for fused on sm_90 (see its comment and NOTES.md).
 *   ce_row_kernel   a row is cut into chunks (C = fl__ce_chunks(V) of 256 threads x 8 16-byte
 *                   vectors; one CTA for rows of <= 512 vectors) held in registers:
 *                   PASS_STATS writes each chunk's (max, sum-exp, sum w z, target logit) to the
 *                   workspace; PASS_FUSED merges the row's partials and writes dlogits from its
 *                   chunk; with C == 1 forward/fused do it all in one pass (one read of logits);
 *                   PASS_BACKWARD: lse given, one read + one write.
 *   ce_finish_kernel forward with C > 1: one thread per row merges the partials.
 *   ce_small_kernel sm_90, SUM/MEAN, N <= 1024 short rows: everything in ONE launch of one
 *                   thread-block cluster (denominators and loss sum through DSMEM).
 *   ce_setup_kernel one CTA: denominators D_w, D_n of MEAN and the class-weight sum W; runs first
 *                   when needed (MEAN, or smoothing with weights), so no host sync is ever needed.
 *   ce_reduce_kernel one CTA: fixed-order double sum of the per-row partial losses for SUM/MEAN.
 *   scale_rows_kernel fl_scale_rows_cuda: rows times a device-held factor, factor-1 rows skipped.
 * Launches per call: 1 (backward; small problems; NONE with short rows) to 4 (forward, MEAN, long rows). No allocation, no sync: every
 * launch is on the caller's stream and graph-capturable.
 *
 * Rows with target == ignore_index are not read (their dlogits are zero-filled).
 * Out-of-range targets: loss NaN, dlogits NaN, *error_flag = 1 (see the header).
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"
#include "common.cuh"
#include "cluster.cuh"

namespace cg = cooperative_groups;


// ---------------------------------------------------------------------------------------------
// device helpers

enum { PASS_FORWARD = 0, PASS_BACKWARD = 1, PASS_FUSED = 2, PASS_STATS = 3 };

struct CeArgs {
    float* loss;          // NONE: [N]; else unused by the row kernels
    float* lse_out;       // [N] or NULL
    void* dlogits;
    const void* logits;
    const void* targets;
    const float* lse_in;  // backward
    const float* grad_loss;
    float grad_scale;
    int64_t N, V, ld;
    int idx64;
    int64_t ignore_index;
    int reduction;
    float eps, zeta, softcap, scale;
    const float* weight;
    int32_t* error_flag;
    const float* offset;  // per-class logit offset o_j (F_ZMAP), or NULL; a vocabulary shard's is offset by col0
    float* tprob;         // forward / fused: [N] p_t = exp(z_t - lse) per row, or NULL
    float inv_softcap;   // 1/softcap (0 when off)
    double* hdr;          // workspace header: [0] D_w, [1] D_n, [2] W
    float* part;          // workspace: [N][2] per-row a_i, b_i
    float4* stats;        // workspace: [N][C] per-chunk (max, sum-exp, sum w z, target logit)
    int C;                // chunks per row (fl__ce_chunks)
    // Vocabulary shard (the vocab-parallel steps, header section 8; 0 and V otherwise): these
    // logits are the global classes [col0, col0 + V) of Vg. Targets are global: a target is bad
    // when it is not in [0, Vg), in this shard when t - col0 is in [0, V); the kernels' t is that
    // LOCAL index (so the j == t tests need no change). `weight` then points at the shard's first
    // class (weight[t] is still the global weight of the target), the global array is weight - col0.
    int64_t col0, Vg;
};


// A 16-byte vector of logits; VEC = 4 (fp32) or 8 (fp16/bf16) elements.
template <typename T>
struct alignas(16) Pack {
    static constexpr int VEC = 16 / sizeof(T);
    T v[VEC];
};

__device__ __forceinline__ int64_t load_target(const CeArgs& a, int64_t i) {
    return a.idx64 ? ((const int64_t*)a.targets)[i] : (int64_t)((const int32_t*)a.targets)[i];
}

// Option flags compiled into the per-element code (template F): the common case (no softcap, no
// label smoothing) gets the shortest instruction stream; the unrolled per-element code is what
// limits a memory-bound kernel's speed once its bytes are minimal.
// F_ZMAP: the logit map z = softcap tanh(scale x / softcap) + o_j is not the identity (scale != 1,
// a softcap or a per-class offset); without it z = x and the per-element multiply disappears.
enum { F_ZMAP = 1, F_SMOOTH = 2 };

#define FL_LOG2E 1.4426950408889634f

// fexp2 (2^x on the SFU alone): common.cuh

// z of raw logit x in column j (j indexes a.offset: local to a vocabulary shard)
template <int F>
__device__ __forceinline__ float zval(const CeArgs& a, float x, int j) {
    if (!(F & F_ZMAP)) return x;
    float z = a.scale * x;
    if (a.inv_softcap != 0.0f) z = a.softcap * tanhf(z * a.inv_softcap);
    if (a.offset) z += __ldg(a.offset + j);
    return z;
}

// (max, sum-exp) pair merge; -inf maxima carry no mass.
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) { m = m2; s = s2; return; }
    float M = fmaxf(m, m2);
    s = s * fexp2((m - M) * FL_LOG2E) + s2 * fexp2((m2 - M) * FL_LOG2E);
    m = M;
}

struct RowStats { float m, s, wz; };  // max, sum exp(z - max), sum_j w_j z_j

__device__ __forceinline__ RowStats warp_reduce_stats(RowStats r) {
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, r.m, o), s2 = __shfl_xor_sync(0xffffffffu, r.s, o);
        ms_merge(r.m, r.s, m2, s2);
        r.wz += __shfl_xor_sync(0xffffffffu, r.wz, o);
    }
    return r;
}

// Row groups (ce_row_kernel with blockDim.y > 1): a row is held by a group of L = blockDim.x
// lanes (a power of two, 2 VEC <= L <= 32) of one warp, blockDim.y rows per CTA. The mask names
// the group's own lanes, so a group whose row is ignored (or past N) may leave early while the
// other groups of its warp shuffle. With L = 32 this is warp_reduce_stats: the same bits as the
// one-warp CTA of the block path.
__device__ __forceinline__ unsigned group_mask() {
    const unsigned L = blockDim.x;
    if (L >= 32u) return 0xffffffffu;
    const unsigned lane = (threadIdx.y * L + threadIdx.x) & 31u;
    return ((1u << L) - 1u) << (lane & ~(L - 1u));
}

__device__ __forceinline__ RowStats group_reduce_stats(RowStats r) {
    const unsigned mask = group_mask();
    for (unsigned o = 16; o > 0; o >>= 1) {
        if (o >= blockDim.x) continue;  // uniform: the same o for every lane of the CTA
        float m2 = __shfl_xor_sync(mask, r.m, (int)o), s2 = __shfl_xor_sync(mask, r.s, (int)o);
        ms_merge(r.m, r.s, m2, s2);
        r.wz += __shfl_xor_sync(mask, r.wz, (int)o);
    }
    return r;
}

// Reduce per-thread stats to the whole CTA; result valid in every thread. `sh` has >= 33 slots.
// With more than 4 warps the warp partials are combined by warp 0 with the same shuffle tree
// (fixed order: deterministic), not by a serial loop in every thread, whose chain of dependent
// merges (two ex2 each) sits on the row's critical path (H200 run 9: staged fused 1.83x -> 1.74x
// of the floor at 8192x128256 bf16); with 2-4 warps the serial loop is shorter than the extra
// barrier (forward with 64-thread chunks: 1.53x with the loop, 1.64x with the tree).
__device__ __forceinline__ RowStats block_reduce_stats(RowStats r, RowStats* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    r = warp_reduce_stats(r);
    __syncthreads();  // why: `sh` may still be read by a previous reduction in this CTA
    if (lane == 0) sh[warp] = r;
    __syncthreads();  // why: warp partials visible to warp 0 (or to every thread, below)
    if (nwarps <= 4) {  // few warps: a short serial merge beats a third barrier (measured, run 9)
        RowStats t = sh[0];
        for (int w = 1; w < nwarps; w++) {  // fixed order: identical result in every thread
            ms_merge(t.m, t.s, sh[w].m, sh[w].s);
            t.wz += sh[w].wz;
        }
        return t;
    }
    if (warp == 0) {
        RowStats t = {-INFINITY, 0.0f, 0.0f};
        if (lane < nwarps) t = sh[lane];
        t = warp_reduce_stats(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();  // why: the CTA's total visible to every thread
    return sh[32];
}

// Block-wide (max, sum-exp, sum w z) in two phases: the max first (exact, so any order gives the
// same bits), then every thread rescales its own sum to the block max with ONE ex2 and the sums
// are added by a fixed shuffle tree and a fixed warp order. Cheaper than merging (max, sum) pairs
// up a tree (two ex2 and a compare per merge). Result valid in every thread; `sh` >= 96 floats.
// The first barrier protects `sh` from a previous call's readers.
template <int F>
__device__ __forceinline__ RowStats block_reduce_ms(RowStats r, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    float m = r.m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncthreads();  // why: `sh` may still be read by the previous reduction of this CTA
    if (lane == 0) sh[warp] = m;
    __syncthreads();  // why: the warp maxima visible to every thread
    float M = sh[0];
    for (int w = 1; w < nwarps; w++) M = fmaxf(M, sh[w]);
    // m == M covers m = M = -inf (an all -inf block: s stays 0 instead of 0 * NaN)
    float s = r.m == M ? r.s : r.s * fexp2((r.m - M) * FL_LOG2E), wz = r.wz;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        if (F & F_SMOOTH) wz += __shfl_xor_sync(0xffffffffu, wz, o);
    }
    if (lane == 0) { sh[32 + warp] = s; sh[64 + warp] = wz; }
    __syncthreads();  // why: the warp sums visible to every thread
    RowStats t = {M, sh[32], (F & F_SMOOTH) ? sh[64] : 0.0f};
    for (int w = 1; w < nwarps; w++) {
        t.s += sh[32 + w];
        if (F & F_SMOOTH) t.wz += sh[64 + w];
    }
    return t;
}

// Row-independent scalars: MEAN denominators D_w, D_n and the class-weight sum W (= V without
// weights). Computed on the device (setup kernel, or in-kernel by the small kernel).
struct Denoms { double Dw, Dn, W; };

__device__ __forceinline__ Denoms load_denoms(const CeArgs& a) {
    Denoms d;
    const bool mean = a.reduction == FL_REDUCTION_MEAN;
    d.Dw = mean ? a.hdr[0] : 1.0;
    d.Dn = mean ? a.hdr[1] : 1.0;
    // W only matters with smoothing; hdr[2] is not computed otherwise
    d.W = a.eps > 0.0f ? (a.weight ? a.hdr[2] : (double)a.Vg) : 0.0;
    return d;
}

// Everything the gradient of one element needs, constant over a row:
//   dlogits_j = (P p_j - [j==t] Tt - Wc w_j) * (softcap ? 1 - (z_j/c)^2 : 1),  p_j = 2^(z_j log2e - lseL)
// with P = s (g_a (c_t + c_s W) + g_b 2 zeta lse), Tt = s g_a c_t, Wc = s g_a c_s (see cpu/cross_entropy.c).
// At the target, fmaf(P, p, -Tt) rounds once: no cancellation when p ~ 1.
struct GradCoef { float P, Tt, Wc, lseL; int t; };

// G = grad_scale * upstream gradient of row i's loss, w_t = weight[t] (1 without weights or when bad)
__device__ __forceinline__ float row_upstream(const CeArgs& a, int64_t i) {
    return a.grad_scale * (a.grad_loss ? a.grad_loss[a.reduction == FL_REDUCTION_NONE ? i : 0] : 1.0f);
}
__device__ __forceinline__ float target_weight(const CeArgs& a, int t, bool bad) {
    return (a.weight && !bad) ? a.weight[t] : 1.0f;
}

// g_a, g_b: the upstream gradient over MEAN's denominators (make_coef_v), computed once per
// thread by the small kernel (one upstream gradient for every row of a reduced loss)
__device__ __forceinline__ void upstream_over_denoms(const CeArgs& a, const Denoms& d, float G, float& g_a,
                                                     float& g_b) {
    g_a = G;
    g_b = G;
    if (a.reduction == FL_REDUCTION_MEAN) {
        g_a = (float)((double)G / d.Dw);
        g_b = (float)((double)G / d.Dn);
    }
}

__device__ __forceinline__ GradCoef make_coef_g(const CeArgs& a, const Denoms& d, float g_a, float g_b, int t,
                                                bool bad, float w_t, float lse) {
    if (bad) g_a = g_b = __int_as_float(0x7fc00000);  // out-of-range target: NaN gradient row
    const float c_t = (1.0f - a.eps) * w_t, c_s = a.eps / (float)a.Vg;
    GradCoef c;
    c.P = a.scale * (g_a * (c_t + c_s * (float)d.W) + g_b * (2.0f * a.zeta * lse));
    c.Tt = a.scale * g_a * c_t;
    c.Wc = a.scale * g_a * c_s;
    c.lseL = lse * FL_LOG2E;
    c.t = t;
    return c;
}

__device__ __forceinline__ GradCoef make_coef_v(const CeArgs& a, const Denoms& d, float G, int t, bool bad,
                                                float w_t, float lse) {
    float g_a, g_b;
    upstream_over_denoms(a, d, G, g_a, g_b);
    return make_coef_g(a, d, g_a, g_b, t, bad, w_t, lse);
}

__device__ __forceinline__ GradCoef make_coef(const CeArgs& a, const Denoms& d, int64_t i, int t, bool bad,
                                              float lse) {
    return make_coef_v(a, d, row_upstream(a, i), t, bad, target_weight(a, t, bad), lse);
}

// TGT: whether j may be the target (the vector sweep leaves the target term out and patches the
// one element that is, see vec_grad: P p - 0 rounds exactly like fma(P, p, 0))
template <int F, bool TGT = true>
__device__ __forceinline__ float grad_elem(const CeArgs& a, const GradCoef& c, float z, int j) {
    float p = fexp2(fmaf(z, FL_LOG2E, -c.lseL));
    float g = TGT ? fmaf(c.P, p, j == c.t ? -c.Tt : 0.0f) : c.P * p;
    if (F & F_SMOOTH) g -= c.Wc * (a.weight ? __ldg(a.weight + j) : 1.0f);
    if (F & F_ZMAP) {  // softcap derivative; r = 0 without a softcap (inv_softcap = 0)
        // (of the capped logit y = z - o_j: the offset does not change dz/dx)
        float r = ((a.offset && a.inv_softcap != 0.0f) ? z - __ldg(a.offset + j) : z) * a.inv_softcap;
        g *= 1.0f - r * r;
    }
    return g;
}

// Row layout shared by all kernels. With odd V (50257) and ld = V, rows start at different
// 16-byte alignments, so each row is cut into: `h` head elements before the first 16-byte
// boundary, `nfull` aligned VEC-element vectors (one 16-byte access each), and a tail of
// fewer than VEC elements. Head and tail ("extras", < 2*VEC of them) are handled one element per
// thread by the first threads of the row's first CTA/warp; the vectors need no masks at all.
template <typename T>
struct RowGrid {
    int h, nfull, nextra;  // 32-bit: positions inside a row (V < 2^31 is checked on the host)
    __device__ RowGrid(const T* row, int V) {
        constexpr int VEC = Pack<T>::VEC;
        int hh = (int)(((16u - ((uintptr_t)row & 15u)) & 15u) / sizeof(T));
        h = hh < V ? hh : V;
        nfull = (V - h) / VEC;
        nextra = V - nfull * VEC;
    }
    __device__ int extra_elem(int k) const { return k < h ? k : k + nfull * Pack<T>::VEC; }
    __device__ int vec_elem(int q) const { return h + q * Pack<T>::VEC; }
};

template <typename T>
__device__ __forceinline__ void load_vec(Pack<T>& p, const T* row, int e0, bool streaming) {
    const uint4* src = reinterpret_cast<const uint4*>(row + e0);
    uint4 u = streaming ? FL_LDCS(src) : *src;
    p = *reinterpret_cast<Pack<T>*>(&u);
}

// PLAIN: a default-cached store instead of st.global.cs (evict-first). The ring mode of
// ce_pipe_kernel and the staged kernel's fused pass store PLAIN (FUSEDLOSS_CE_PLAIN_ST, default 1);
// every other kernel evict-first. H200 2026-12-04 s12 run 4 (all stores of a cross_entropy.cu built
// default-cached, same-run A/B in 3 alternations, fused x floor, .cs -> default-cached): ring
// 8192x128256 bf16 1.15-1.16 -> 1.14, 8192x50257 bf16 1.22-1.23 -> 1.18-1.19, 4096x50257 f32 1.21 ->
// 1.20-1.21; staged 4096x256000 bf16 1.26-1.27 -> 1.25; but whole-chunk mode 16384x32000 bf16
// 1.15-1.16 -> 1.19, 2048x32000 f16 1.36 -> 1.37-1.38, and the backward's chunk kernels 1.03 -> 1.05.
template <typename T, bool PLAIN = false>
__device__ __forceinline__ void store_vec(const Pack<T>& p, T* row, int e0) {
    if constexpr (PLAIN) *reinterpret_cast<uint4*>(row + e0) = *reinterpret_cast<const uint4*>(&p);
    else FL_STCS(reinterpret_cast<uint4*>(row + e0), *reinterpret_cast<const uint4*>(&p));
}

// A Pack from shared memory in ONE 16-byte access. Dereferencing a `const Pack<T>*` directly made
// nvcc emit eight 2-byte LDS.U16 per 16-bit vector in the staged kernel (SASS, 2026-12-01: 112
// LDS.U16 vs 10 LDS.128 in ce_tma_kernel<bf16>): 8x the shared-memory instructions, which is what
// the "short scoreboard" stalls and the 77% L1 throughput of the run-4 ncu profile were.
template <typename T>
__device__ __forceinline__ Pack<T> lds_pack(const uint4* p) {
    uint4 u = *p;
    return *reinterpret_cast<const Pack<T>*>(&u);
}

// Max of a vector's logits without converting them: packed 16-bit max (2 elements per
// instruction) for fp16/bf16, fmaxf for fp32. Only valid when z = x (no logit map). NaN lanes are
// skipped like fmaxf does (max.{f16,bf16}x2 returns the non-NaN operand).
__device__ __forceinline__ float pack_max(const Pack<float>& x) {
    return fmaxf(fmaxf(x.v[0], x.v[1]), fmaxf(x.v[2], x.v[3]));
}
__device__ __forceinline__ float pack_max(const Pack<__half>& x) {
    const __half2* h = reinterpret_cast<const __half2*>(x.v);
    __half2 m = __hmax2(__hmax2(h[0], h[1]), __hmax2(h[2], h[3]));
    return fmaxf(__low2float(m), __high2float(m));
}
__device__ __forceinline__ float pack_max(const Pack<__nv_bfloat16>& x) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(x.v);
    __nv_bfloat162 m = __hmax2(__hmax2(h[0], h[1]), __hmax2(h[2], h[3]));
    return fmaxf(__low2float(m), __high2float(m));
}

// A vector's elements as fp32, and fp32 values packed back into a vector, with the fewest
// instructions: bf16 -> fp32 is a shift (low half) or a mask (high half) of each 32-bit word, and
// fp32 -> 16 bit a paired cvt (cvt.rn.{bf16,f16}x2.f32: one instruction per two elements,
// round to nearest even like __float2bfloat16_rn / __float2half_rn). Element-wise conversion made
// nvcc use two instructions for the high half and build the output vector in local memory
// (STL.S16 in the backward kernel's SASS, 2026-12-01).
__device__ __forceinline__ void unpack(const Pack<float>& p, float (&z)[4]) {
#pragma unroll
    for (int v = 0; v < 4; v++) z[v] = p.v[v];
}
__device__ __forceinline__ void unpack(const Pack<__nv_bfloat16>& p, float (&z)[8]) {
    const uint4 u = *reinterpret_cast<const uint4*>(&p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        z[2 * k] = __uint_as_float(w[k] << 16);
        z[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}
__device__ __forceinline__ void unpack(const Pack<__half>& p, float (&z)[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(p.v);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float2 f = __half22float2(h[k]);
        z[2 * k] = f.x;
        z[2 * k + 1] = f.y;
    }
}
template <typename T> __device__ __forceinline__ Pack<T> pack_out(const float (&g)[Pack<T>::VEC]);
template <> __device__ __forceinline__ Pack<float> pack_out<float>(const float (&g)[4]) {
    Pack<float> o;
#pragma unroll
    for (int v = 0; v < 4; v++) o.v[v] = g[v];
    return o;
}
template <> __device__ __forceinline__ Pack<__nv_bfloat16> pack_out<__nv_bfloat16>(const float (&g)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(g[2 * k + 1]), "f"(g[2 * k]));
    const uint4 u = make_uint4(w[0], w[1], w[2], w[3]);
    return *reinterpret_cast<const Pack<__nv_bfloat16>*>(&u);
}
template <> __device__ __forceinline__ Pack<__half> pack_out<__half>(const float (&g)[8]) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(g[2 * k + 1]), "f"(g[2 * k]));
    const uint4 u = make_uint4(w[0], w[1], w[2], w[3]);
    return *reinterpret_cast<const Pack<__half>*>(&u);
}

// e0: the column of the vector's first element. The offsets of a vector are read as float4s
// (read-only path, L1/L2-resident: every row reads the same [V] array) when 16-byte aligned, which
// holds for every vector of a row or for none (e0 = head + 4k or 8k); scalar loads otherwise.
template <int F, typename T>
__device__ __forceinline__ void vec_z(const CeArgs& a, const Pack<T>& x, int e0, float (&z)[Pack<T>::VEC]) {
    constexpr int VEC = Pack<T>::VEC;
    unpack(x, z);
    if (F & F_ZMAP) {
        if (!a.offset) {
#pragma unroll
            for (int v = 0; v < VEC; v++) z[v] = zval<F>(a, z[v], 0);
            return;
        }
        const float* o = a.offset + e0;
        float ov[VEC];
        if (((uintptr_t)o & 15u) == 0) {
#pragma unroll
            for (int k = 0; k < VEC / 4; k++) {
                const float4 q = __ldg(reinterpret_cast<const float4*>(o) + k);
                ov[4 * k] = q.x; ov[4 * k + 1] = q.y; ov[4 * k + 2] = q.z; ov[4 * k + 3] = q.w;
            }
        } else {
#pragma unroll
            for (int v = 0; v < VEC; v++) ov[v] = __ldg(o + v);
        }
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            float y = a.scale * z[v];
            if (a.inv_softcap != 0.0f) y = a.softcap * tanhf(y * a.inv_softcap);
            z[v] = y + ov[v];
        }
    }
}

// Per-thread stats, first sweep (max) and second sweep (sum-exp, weighted sum) over one vector.
template <int F, typename T>
__device__ __forceinline__ float vec_max(const CeArgs& a, const Pack<T>& x, int e0, float m) {
    if (!(F & F_ZMAP)) return fmaxf(m, pack_max(x));
    float z[Pack<T>::VEC];
    vec_z<F>(a, x, e0, z);
#pragma unroll
    for (int v = 0; v < Pack<T>::VEC; v++) m = fmaxf(m, z[v]);
    return m;
}

// (a vector's exponentials are added by tree_sum, common.cuh: one add per vector on s's chain)

// A vector's exponentials against mL as a tree sum (returned), z w summed into wz when WZ (the
// re-referenced second evaluation of a vector must not add it twice); vm (if not NULL): the vector's
// max (packed 16-bit max without a logit map, else of the mapped z: one map).
template <int F, bool WZ, typename T>
__device__ __forceinline__ float vec_esum(const CeArgs& a, const Pack<T>& x, int e0, float mL, float& wz, float* vm) {
    constexpr int VEC = Pack<T>::VEC;
    float z[VEC], e[VEC];
    vec_z<F>(a, x, e0, z);
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        e[v] = fexp2(fmaf(z[v], FL_LOG2E, -mL));
        if (WZ && (F & F_SMOOTH)) wz += (a.weight ? __ldg(a.weight + e0 + v) : 1.0f) * z[v];
    }
    if (vm) {
        if (!(F & F_ZMAP)) {
            *vm = pack_max(x);
        } else {
            float mx = z[0];
#pragma unroll
            for (int v = 1; v < VEC; v++) mx = fmaxf(mx, z[v]);
            *vm = mx;
        }
    }
    return tree_sum(e);
}

template <int F, typename T>
__device__ __forceinline__ void vec_sum(const CeArgs& a, const Pack<T>& x, int e0, float mL, float& s, float& wz) {
    s += vec_esum<F, true>(a, x, e0, mL, wz, NULL);  // NaN z poisons s, so the row's lse is NaN, as PyTorch
}

// One-pass (max, sum-exp) per thread with a LAZY reference (the pipelined kernel's statistics
// sweep): the exponentials are taken against the reference m, which moves only when a vector's max
// exceeds m + CE_REF_SLACK (always at the thread's first finite vector, rarely after). The terms are
// then at most e^CE_REF_SLACK = 2^46 each (no overflow in the fp32 sums: a thread sums < 2^17), and m
// is a value of the row, so no term that matters underflows; (m, s) merges like an exact-max pair
// (lse = m + log s for any reference). Why: the exact per-slot max pass before the sum pass cost
// 16 of the sweep's 56 instructions per vector and a second shared-memory read of the slot; the
// statistics group was the pipeline's critical path (H200 s8 run 1, ncu source counters: the
// gradient warps waited 31% of their time for the next row's statistics). NaN never moves m (the
// comparisons are false) and reaches s through its exponential; +inf moves m to +inf, and s to NaN
// via 2^(inf - inf), as the two-pass sweep does. The exact max mx is tracked beside (one max per two
// vectors) and s moved to it at the end (finish), so that lse = mx + log s takes the log of a sum
// <= V, as with an exact-max sweep: log s up to ~40 (reference 32 below the max) cost up to one
// more ulp of lse, enough to fail the fp32 smoothing-cancellation tolerance at lse ~ 64 (H200 s8
// run 4: ramped rows, 7.6e-6 lse error).
#define CE_REF_SLACK 32.0f
struct OnlineMS {
    float m, mL, mlim, mx;
    __device__ __forceinline__ void init() { m = -INFINITY; mL = 0.0f; mlim = -INFINITY; mx = -INFINITY; }
    __device__ __forceinline__ void init_at(float m0) {  // a first element's z (s = 1 for it)
        m = m0;
        mL = m0 == -INFINITY ? 0.0f : m0 * FL_LOG2E;
        mlim = m0 + CE_REF_SLACK;
        mx = m0;
    }
    // s (against m) moved to the exact max: (m, s) = (mx, s 2^((m - mx) log2e)); NaN max skipped
    __device__ __forceinline__ void finish(float& s) {
        if (mx > m) {  // m finite here: a finite vector max above -inf always rebased
            s *= fexp2((m - mx) * FL_LOG2E);
            m = mx;
        }
    }
    // re-reference to vm (> mlim): returns the factor for the sums taken against the old m
    __device__ __forceinline__ float rebase(float vm) {
        const float f = m == -INFINITY ? 0.0f : fexp2((m - vm) * FL_LOG2E);
        m = vm;
        mL = vm * FL_LOG2E;
        mlim = vm + CE_REF_SLACK;
        return f;
    }
};

// One-pass statistics of the vectors q, q + n, ... < end of a staged chunk (buf[q]: chunk
// coordinates; v0: the chunk's first vector in the row) into (ms, s, wz); returns the thread's next
// vector. Two vectors a step, one rebase test for both.
template <int F, typename T>
__device__ __forceinline__ int sweep_stats(const CeArgs& a, const uint4* buf, const RowGrid<T>& g, int v0, int q,
                                           int end, int n, OnlineMS& ms, float& s, float& wz) {
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 2
    for (; q + n < end; q += 2 * n) {
        const Pack<T> xa = lds_pack<T>(buf + q), xb = lds_pack<T>(buf + q + n);
        const int ea = g.vec_elem(v0 + q), eb = g.vec_elem(v0 + q + n);
        // the exponentials against the current reference, the rebase test off their path
        float ma, mb;
        float va = vec_esum<F, true>(a, xa, ea, ms.mL, wz, &ma), vb = vec_esum<F, true>(a, xb, eb, ms.mL, wz, &mb);
        const float vm = fmaxf(ma, mb);
        ms.mx = fmaxf(ms.mx, vm);
        if (vm > ms.mlim) {  // rare past the thread's first vectors
            const float f = ms.rebase(vm);
            s *= f; s0 *= f; s1 *= f;
            float dz = 0.0f;
            va = vec_esum<F, false>(a, xa, ea, ms.mL, dz, NULL);
            vb = vec_esum<F, false>(a, xb, eb, ms.mL, dz, NULL);
        }
        s0 += va;
        s1 += vb;
    }
    if (q < end) {
        const Pack<T> xa = lds_pack<T>(buf + q);
        const int ea = g.vec_elem(v0 + q);
        float vm;
        float va = vec_esum<F, true>(a, xa, ea, ms.mL, wz, &vm);
        ms.mx = fmaxf(ms.mx, vm);
        if (vm > ms.mlim) {
            const float f = ms.rebase(vm);
            s *= f; s0 *= f; s1 *= f;
            float dz = 0.0f;
            va = vec_esum<F, false>(a, xa, ea, ms.mL, dz, NULL);
        }
        s0 += va;
        q += n;
    }
    s += s0 + s1;
    return q;
}

template <int F, typename T>
__device__ __forceinline__ Pack<T> vec_grad(const CeArgs& a, const GradCoef& c, const Pack<T>& x, int e0) {
    constexpr int VEC = Pack<T>::VEC;
    float z[VEC], g[VEC];
    vec_z<F>(a, x, e0, z);
#pragma unroll
    for (int v = 0; v < VEC; v++) g[v] = grad_elem<F, false>(a, c, z[v], e0 + v);
    const unsigned k = (unsigned)(c.t - e0);  // < VEC only in the target's vector (t = -1 when bad)
    if (k < (unsigned)VEC) {
#pragma unroll
        for (int v = 0; v < VEC; v++)
            if (v == (int)k) g[v] = grad_elem<F, true>(a, c, z[v], e0 + v);
    }
    return pack_out<T>(g);
}

// Row loss pieces (a: CE + smoothing, b: z-loss) from combined stats; writes loss/lse/partials.
__device__ __forceinline__ void finish_row_w(const CeArgs& a, const Denoms& d, int64_t i, bool bad, float w_t,
                                             float lse, float zt, float wz, float* a_out, float* b_out) {
    float a_i, b_i;
    if (bad) {
        a_i = __int_as_float(0x7fc00000);
        b_i = 0.0f;
    } else {
        a_i = (1.0f - a.eps) * w_t * (lse - zt);
        if (a.eps > 0.0f) a_i += (a.eps / (float)a.Vg) * ((float)d.W * lse - wz);
        b_i = a.zeta * lse * lse;
    }
    if (a_out) { *a_out = a_i; *b_out = b_i; }  // the small kernel sums these itself
    else if (a.reduction == FL_REDUCTION_NONE) a.loss[i] = a_i + b_i;
    else { a.part[2 * i] = a_i; a.part[2 * i + 1] = b_i; }
    if (a.lse_out) a.lse_out[i] = lse;
    if (a.tprob) a.tprob[i] = bad ? __int_as_float(0x7fc00000) : expf(zt - lse);
}

__device__ __forceinline__ void finish_row(const CeArgs& a, const Denoms& d, int64_t i, int t, bool bad,
                                           float lse, float zt, float wz, float* a_out, float* b_out) {
    finish_row_w(a, d, i, bad, target_weight(a, t, bad), lse, zt, wz, a_out, b_out);
}

__device__ __forceinline__ void ignored_row_outputs(const CeArgs& a, int64_t i, int pass) {
    if (pass == PASS_BACKWARD) return;
    if (a.reduction == FL_REDUCTION_NONE) a.loss[i] = 0.0f;
    else { a.part[2 * i] = 0.0f; a.part[2 * i + 1] = 0.0f; }
    if (a.lse_out) a.lse_out[i] = 0.0f;
    if (a.tprob) a.tprob[i] = 1.0f;
}

// ---------------------------------------------------------------------------------------------
// kernels

// Row chunks held in registers. grid.x = N * C; CTA `rank` of row i holds vectors
// [rank*T*K, (rank+1)*T*K) of the row, K per thread; the row's extras are held by threads 0.. of
// rank 0. Three passes use it:
//   PASS_STATS    read the chunk once, write its (max, sum-exp, sum w z) and, from rank 0, the
//                 target logit to the workspace (no writes to the logits: safe before in-place)
//   PASS_FUSED    read the chunk again, merge the row's C partials in rank order (every CTA of the
//                 row gets the same lse bitwise), rank 0 finishes the row's loss, write dlogits
//   PASS_BACKWARD read the chunk, lse given, write dlogits
// Why not one pass with the row's chunks exchanging statistics inside a thread-block cluster
// (sm_90 DSMEM)? Measured on the H200 (bench/results/2026-11-30-h200-run1-*): that kernel ran at
// 2.91x the copy floor for 8192x128256 bf16 (one row per cluster, two cluster barriers between
// the loads and the stores, few bytes in flight), while these independent chunks run backward at
// 1.26x. The second read of STATS + FUSED costs 0.5x of the floor; see NOTES.md for what closes it.
// Block-reduced (max, sum-exp, sum w z) of this CTA's chunk (held in x[] and the extra xs).
template <typename T, int K, int F>
__device__ __forceinline__ RowStats chunk_stats(const CeArgs& a, const Pack<T> (&x)[K], const RowGrid<T>& g,
                                                int q0, bool has_x, float xs, int ex, RowStats* sh) {
    const int T_ = (int)blockDim.x;
    float m = has_x ? zval<F>(a, xs, ex) : -INFINITY;
#pragma unroll
    for (int k = 0; k < K; k++)
        if (q0 + k * T_ < g.nfull) m = vec_max<F>(a, x[k], g.vec_elem(q0 + k * T_), m);
    const float mL = m == -INFINITY ? 0.0f : m * FL_LOG2E;
    float s = 0.0f, wz = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        int q = q0 + k * T_;
        if (q < g.nfull) vec_sum<F>(a, x[k], g.vec_elem(q), mL, s, wz);
    }
    if (has_x) {
        float z = zval<F>(a, xs, ex);
        s += fexp2(fmaf(z, FL_LOG2E, -mL));
        if (F & F_SMOOTH) wz += (a.weight ? __ldg(a.weight + ex) : 1.0f) * z;
    }
    RowStats r = {m, s, wz};
    // the block reduction's barrier orders reads before writes; a row group's shuffles do for the
    // group's own lanes (the target logit is broadcast from lane 0 before this, see ce_row_kernel)
    return (K == 2 && blockDim.y > 1) ? group_reduce_stats(r) : block_reduce_stats(r, sh);
}

template <typename T, int K, int PASS, int F>
__global__ void __launch_bounds__(512) ce_row_kernel(CeArgs a) {
    __shared__ RowStats sh[33];
    // blockDim.y > 1: row groups (see group_reduce_stats), C == 1, row blockIdx.x * blockDim.y + y
    const bool grp = K == 2 && blockDim.y > 1;  // (K == 8 rows never run as groups: no code for it)
    const int C = a.C;
    const int64_t i = grp ? (int64_t)blockIdx.x * blockDim.y + threadIdx.y : (int64_t)blockIdx.x / C;
    if (grp && i >= a.N) return;
    const int rank = grp ? 0 : (int)(blockIdx.x % C);
    const int V = (int)a.V, T_ = (int)blockDim.x, tid = (int)threadIdx.x;
    const T* row = (const T*)a.logits + i * a.ld;  // 64-bit: i*ld exceeds 2^31 for big N*V
    T* drow = (T*)a.dlogits + i * a.ld;
    const int64_t t64 = load_target(a, i);
    const bool ignored = t64 == a.ignore_index;
    const bool bad = !ignored && (t64 < 0 || t64 >= a.Vg);
    const int t = bad ? -1 : (int)(t64 - a.col0);  // local; an index only when in [0, V)
    const bool tin = !bad && (unsigned)t < (unsigned)V;  // the target is in these logits
    const RowGrid<T> g(row, V);
    const int q0 = rank * T_ * K + tid;
    const int gt = rank * T_ + tid;
    const bool has_x = gt < g.nextra;
    const int ex = has_x ? g.extra_elem(gt) : 0;

    if (ignored) {  // not read; dlogits zero-filled; loss/lse 0
        if (PASS == PASS_STATS) return;
        if (PASS != PASS_BACKWARD && rank == 0 && tid == 0) ignored_row_outputs(a, i, PASS);
        if (PASS == PASS_BACKWARD || PASS == PASS_FUSED) {  // their gradient rows are zero
            Pack<T> zero;
#pragma unroll
            for (int v = 0; v < Pack<T>::VEC; v++) zero.v[v] = from_float<T>(0.0f);
#pragma unroll
            for (int k = 0; k < K; k++) {
                int q = q0 + k * T_;
                if (q < g.nfull) store_vec(zero, drow, g.vec_elem(q));
            }
            if (has_x) drow[ex] = from_float<T>(0.0f);
        }
        return;
    }
    if (PASS != PASS_STATS && bad && rank == 0 && tid == 0 && a.error_flag) *a.error_flag = 1;

    // all K loads of this CTA's chunk issued before any use
    Pack<T> x[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        int q = q0 + k * T_;
        // STATS keeps the chunk in L2 (normal caching) for the FUSED pass that follows it
        if (q < g.nfull) load_vec(x[k], row, g.vec_elem(q), PASS != PASS_STATS);
    }
    const float xs = has_x ? to_float(row[ex]) : 0.0f;

    float lse;
    if (PASS == PASS_BACKWARD) {
        lse = a.lse_in[i];
    } else {
        // target logit: read before chunk_stats' barrier, after which (C == 1, in place) this
        // CTA overwrites the row; only where it is used (PASS_STATS, C == 1): with C > 1 the
        // fused pass takes it from the stats, and other CTAs of the row may already have
        // overwritten row[t]
        float zt = (rank == 0 && tid == 0 && tin && (PASS == PASS_STATS || C == 1))
                       ? zval<F>(a, to_float(row[t]), t) : 0.0f;
        // a row group has no barrier: every lane waits here for lane 0's load of row[t] (the
        // shuffle reads its register) before any lane of the group can store its gradient
        if (grp) zt = __shfl_sync(group_mask(), zt, 0, (int)blockDim.x);
        float wz;
        if (PASS == PASS_STATS || C == 1) {
            RowStats r = chunk_stats<T, K, F>(a, x, g, q0, has_x, xs, ex, sh);
            if (PASS == PASS_STATS) {
                if (tid == 0) a.stats[i * C + rank] = make_float4(r.m, r.s, r.wz, zt);
                return;
            }
            lse = (r.m == -INFINITY) ? -INFINITY : r.m + logf(r.s);
            wz = r.wz;
            if (rank == 0 && tid == 0) finish_row(a, load_denoms(a), i, t, bad, lse, zt, wz, NULL, NULL);
        } else {  // C > 1: merge the row's partials from PASS_STATS in rank order (same bits in every CTA)
            const float4* st = a.stats + i * C;
            float4 p0 = __ldg(st);
            float m = p0.x, s = p0.y;
            wz = p0.z;
            for (int c = 1; c < C; c++) {
                float4 pc = __ldg(st + c);
                ms_merge(m, s, pc.x, pc.y);
                wz += pc.z;
            }
            lse = (m == -INFINITY) ? -INFINITY : m + logf(s);
            if (rank == 0 && tid == 0) finish_row(a, load_denoms(a), i, t, bad, lse, p0.w, wz, NULL, NULL);
        }
        if (PASS == PASS_FORWARD) return;
    }

    const GradCoef c = make_coef(a, load_denoms(a), i, t, bad, lse);
#pragma unroll
    for (int k = 0; k < K; k++) {
        int q = q0 + k * T_;
        if (q < g.nfull) store_vec(vec_grad<F>(a, c, x[k], g.vec_elem(q)), drow, g.vec_elem(q));
    }
    if (has_x) drow[ex] = from_float<T>(grad_elem<F>(a, c, zval<F>(a, xs, ex), ex));
}

// Tiny rows (V <= TINY_V, C == 1, big batches): one THREAD per row, the row's logits in its
// registers (scalar loads: any alignment), no shuffles and no barriers; the same per-row math as
// ce_row_kernel (stats, finish_row, make_coef / grad_elem), with the row's sums in column order.
// Why: at V = 10 a 16-lane row group did one row's shuffles and bookkeeping for 10 elements (H200
// run 37: 1M x 10 bf16 fused at 49x its floor).
#define TINY_V 16
template <typename T, int PASS, int F>
__global__ void __launch_bounds__(256) ce_tiny_kernel(CeArgs a) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.N) return;
    const int V = (int)a.V;
    const T* row = (const T*)a.logits + i * a.ld;
    T* drow = (T*)a.dlogits + i * a.ld;
    const int64_t t64 = load_target(a, i);
    const bool ignored = t64 == a.ignore_index;
    if (ignored) {
        if (PASS == PASS_STATS) return;
        if (PASS != PASS_BACKWARD) ignored_row_outputs(a, i, PASS);
        if (PASS == PASS_BACKWARD || PASS == PASS_FUSED)
            for (int j = 0; j < V; j++) drow[j] = from_float<T>(0.0f);
        return;
    }
    const bool bad = t64 < 0 || t64 >= a.Vg;
    const int t = bad ? -1 : (int)(t64 - a.col0);
    const bool tin = !bad && (unsigned)t < (unsigned)V;
    if (PASS != PASS_STATS && bad && a.error_flag) *a.error_flag = 1;
    float z[TINY_V];
#pragma unroll
    for (int j = 0; j < TINY_V; j++) z[j] = j < V ? zval<F>(a, to_float(row[j]), j) : -INFINITY;
    float lse;
    if (PASS == PASS_BACKWARD) {
        lse = a.lse_in[i];
    } else {
        float m = -INFINITY, zt = 0.0f;
#pragma unroll
        for (int j = 0; j < TINY_V; j++) {
            if (j < V) m = fmaxf(m, z[j]);
            if (tin && j == t) zt = z[j];
        }
        const float mL = m == -INFINITY ? 0.0f : m * FL_LOG2E;
        float sm = 0.0f, wz = 0.0f;
#pragma unroll
        for (int j = 0; j < TINY_V; j++) {
            if (j >= V) continue;
            sm += fexp2(fmaf(z[j], FL_LOG2E, -mL));  // NaN z poisons the sum, as everywhere
            if (F & F_SMOOTH) wz += (a.weight ? __ldg(a.weight + j) : 1.0f) * z[j];
        }
        if (PASS == PASS_STATS) {  // C == 1
            a.stats[i] = make_float4(m, sm, wz, zt);
            return;
        }
        lse = (m == -INFINITY) ? -INFINITY : m + logf(sm);
        finish_row(a, load_denoms(a), i, t, bad, lse, zt, wz, NULL, NULL);
        if (PASS == PASS_FORWARD) return;
    }
    const GradCoef c = make_coef(a, load_denoms(a), i, t, bad, lse);
#pragma unroll
    for (int j = 0; j < TINY_V; j++)
        if (j < V) drow[j] = from_float<T>(grad_elem<F>(a, c, z[j], j));
}

// Forward only, after PASS_STATS: one thread per row merges the row's partials and finishes it.
template <int F>
__global__ void __launch_bounds__(256) ce_finish_kernel(CeArgs a) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.N) return;
    const int64_t t64 = load_target(a, i);
    if (t64 == a.ignore_index) { ignored_row_outputs(a, i, PASS_FORWARD); return; }
    const bool bad = t64 < 0 || t64 >= a.V;
    if (bad && a.error_flag) *a.error_flag = 1;
    const float4* st = a.stats + i * a.C;
    float4 p0 = st[0];
    float m = p0.x, s = p0.y, wz = p0.z;
    for (int c = 1; c < a.C; c++) {
        float4 pc = st[c];
        ms_merge(m, s, pc.x, pc.y);
        wz += pc.z;
    }
    const float lse = (m == -INFINITY) ? -INFINITY : m + logf(s);
    finish_row(a, load_denoms(a), i, bad ? -1 : (int)t64, bad, lse, p0.w, wz, NULL, NULL);
}

// Long rows, forward statistics (and backward, by knob) on any arch: a persistent grid of CTAs walks units
// u = (row i, chunk c) of `cv` aligned vectors, u = blockIdx.x, + gridDim.x, ...; thread tid
// handles vectors lo + tid + k*T, STREAM_K of them per batch, all of a batch's loads in flight
// before any use. Why (H200 runs 3-10, ce_row_kernel with one 8 KB chunk per 64-thread CTA):
// per-CTA costs (target load before the first logit load, RowGrid, a block reduction per 4096
// elements) made the 16-bit forward instruction-bound at 1.54x the read floor while fp32, with
// half the elements per byte, ran at 1.10x. Here a unit is ~64 KB, the target of the next unit is
// loaded one unit ahead, the batch max is a packed 16-bit max and the block reduction is the
// two-phase one.
//   PASS_STATS    forward with C > 1: (max, sum-exp, sum w z, target logit) per unit into the
//                 workspace; ce_finish_kernel merges them per row
//   PASS_FORWARD  forward with C == 1: the row's loss/lse/partials directly
//   PASS_BACKWARD lse given: read the unit once, write its dlogits (in place allowed: every
//                 element is read and then written by the same thread)
#define STREAM_K 8
#define STREAM_T 256

template <typename T, int PASS, int F>
// Register caps (launch bounds): the common case (no options) 4 CTAs per SM forward (64 regs), 3
// backward (80); with options 2 (128), which their per-element code needs to stay spill-free.
__global__ void __launch_bounds__(STREAM_T, F != 0 ? 2 : PASS == PASS_BACKWARD ? 3 : 4)
    ce_stream_kernel(CeArgs a, int C, int cv) {
    __shared__ float sh[96];
    const int tid = (int)threadIdx.x, V = (int)a.V;
    constexpr int T_ = STREAM_T;  // compile-time: the k-th vector of a batch is at an immediate offset
    const int64_t units = a.N * (int64_t)C;
    const Denoms dn = load_denoms(a);
    int64_t u = blockIdx.x;
    int64_t t_next = u < units ? load_target(a, u / C) : 0;
    for (; u < units; u += gridDim.x) {
        const int64_t i = u / C;
        const int c = (int)(u - i * C);
        const int64_t t64 = t_next;
        if (u + gridDim.x < units) t_next = load_target(a, (u + gridDim.x) / C);  // lands during this unit
        const bool ignored = t64 == a.ignore_index;
        const bool bad = !ignored && (t64 < 0 || t64 >= a.Vg);
        const int t = bad ? -1 : (int)(t64 - a.col0);  // local (see CeArgs); an index only when tin
        const bool tin = !bad && (unsigned)t < (unsigned)V;
        const T* row = (const T*)a.logits + i * a.ld;
        T* drow = (T*)a.dlogits + i * a.ld;
        const RowGrid<T> g(row, V);
        const int lo = c * cv, hi = lo + cv < g.nfull ? lo + cv : g.nfull;
        const bool has_x = c == 0 && tid < g.nextra;
        const int ex = has_x ? g.extra_elem(tid) : 0;

        if (ignored) {  // not read; dlogits zero-filled; loss/lse 0 (C > 1: ce_finish_kernel)
            if (PASS == PASS_BACKWARD) {
                Pack<T> zero;
#pragma unroll
                for (int v = 0; v < Pack<T>::VEC; v++) zero.v[v] = from_float<T>(0.0f);
                for (int q = lo + tid; q < hi; q += T_) store_vec(zero, drow, g.vec_elem(q));
                if (has_x) drow[ex] = from_float<T>(0.0f);
            } else if (PASS == PASS_FORWARD && tid == 0) {
                ignored_row_outputs(a, i, PASS_FORWARD);
            }
            continue;  // uniform over the CTA: no barrier is skipped by part of it
        }
        if (PASS != PASS_STATS && bad && c == 0 && tid == 0 && a.error_flag) *a.error_flag = 1;

        if (PASS == PASS_BACKWARD) {
            const GradCoef cf = make_coef(a, dn, i, t, bad, a.lse_in[i]);
            for (int q0 = lo + tid; q0 < hi; q0 += STREAM_K * T_) {
                const int e0 = g.vec_elem(q0);
                const T* src = row + e0;
                T* dst = drow + e0;
                Pack<T> x[STREAM_K];
#pragma unroll
                for (int k = 0; k < STREAM_K; k++)
                    if (q0 + k * T_ < hi) load_vec(x[k], src, k * T_ * Pack<T>::VEC, true);
#pragma unroll
                for (int k = 0; k < STREAM_K; k++)
                    if (q0 + k * T_ < hi)
                        store_vec(vec_grad<F>(a, cf, x[k], e0 + k * T_ * Pack<T>::VEC), dst, k * T_ * Pack<T>::VEC);
            }
            if (has_x) drow[ex] = from_float<T>(grad_elem<F>(a, cf, zval<F>(a, to_float(row[ex]), ex), ex));
            continue;
        }

        // forward statistics of this unit
        const float zt = (c == 0 && tid == 0 && tin) ? zval<F>(a, to_float(row[t]), t) : 0.0f;
        float m = -INFINITY, s = 0.0f, wz = 0.0f;
        if (has_x) {
            const float z = zval<F>(a, to_float(row[ex]), ex);
            m = z;
            s = 1.0f;  // 2^0: z relative to itself
            if (F & F_SMOOTH) wz = (a.weight ? __ldg(a.weight + ex) : 1.0f) * z;
        }
        for (int q0 = lo + tid; q0 < hi; q0 += STREAM_K * T_) {
            const int e0 = g.vec_elem(q0);
            const T* src = row + e0;
            Pack<T> x[STREAM_K];
#pragma unroll
            for (int k = 0; k < STREAM_K; k++)
                if (q0 + k * T_ < hi) load_vec(x[k], src, k * T_ * Pack<T>::VEC, true);
            float bm = -INFINITY;
#pragma unroll
            for (int k = 0; k < STREAM_K; k++)
                if (q0 + k * T_ < hi) bm = (F & F_ZMAP) ? vec_max<F>(a, x[k], e0 + k * T_ * Pack<T>::VEC, bm) : fmaxf(bm, pack_max(x[k]));
            if (bm > m) {  // false for NaN (skipped, as fmaxf does)
                s = (m == -INFINITY) ? 0.0f : s * fexp2((m - bm) * FL_LOG2E);
                m = bm;
            }
            const float mL = m == -INFINITY ? 0.0f : m * FL_LOG2E;
#pragma unroll
            for (int k = 0; k < STREAM_K; k++)
                if (q0 + k * T_ < hi) vec_sum<F>(a, x[k], e0 + k * T_ * Pack<T>::VEC, mL, s, wz);
        }
        RowStats r = {m, s, wz};
        r = block_reduce_ms<F>(r, sh);
        if (tid == 0) {
            if (PASS == PASS_STATS) {
                a.stats[i * C + c] = make_float4(r.m, r.s, r.wz, zt);
            } else {
                const float lse = (r.m == -INFINITY) ? -INFINITY : r.m + logf(r.s);
                finish_row(a, dn, i, t, bad, lse, zt, r.wz, NULL, NULL);
            }
        }
    }
}

// Small problems (SUM/MEAN, N <= SMALL_MAX_ROWS, rows of <= 8 vectors per lane), sm_90: the whole
// call in ONE launch of ONE cluster of C CTAs x 8 warps, a warp per row with the row in registers.
// The denominators are computed first (each CTA a fixed slice of the targets, combined across the
// cluster through DSMEM) and the loss is summed in a fixed order (row order within a warp, warp
// order within a CTA, rank order across the cluster): deterministic, no atomics, no workspace
// traffic, no second kernel. Launch overhead dominates such shapes, so one launch wins.
#define SMALL_WARPS 16
#define SMALL_MAX_ROWS 1024
#define SMALL_KW 8

// Lane `lane`'s vectors (and head/tail element) of row i, for the small kernel's warp-per-row.
template <typename T>
__device__ __forceinline__ void small_load_row(const CeArgs& a, int64_t i, int lane, Pack<T> (&x)[SMALL_KW], float& xs) {
    const T* row = (const T*)a.logits + i * a.ld;
    const RowGrid<T> g(row, (int)a.V);
#pragma unroll
    for (int k = 0; k < SMALL_KW; k++)
        if (lane + 32 * k < g.nfull) load_vec(x[k], row, g.vec_elem(lane + 32 * k), true);
    xs = lane < g.nextra ? to_float(row[g.extra_elem(lane)]) : 0.0f;
}

template <typename T, int PASS, int F>
__global__ void __launch_bounds__(SMALL_WARPS * 32) ce_small_kernel(CeArgs a, int Cf) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Cf: the cluster size C in the low 8 bits, the FUSEDLOSS_CE_SMALL_OPT bits above (A/B):
    //   1 each warp's first row loaded before the denominators (its latency behind theirs)
    //   2 the loss sums sent to rank 0 by st.async + mbarrier, a relaxed cluster barrier at the end
    //     (instead of cluster.sync(), whose release fence waits for the gradient stores to drain)
    //   4 programmatic dependent launch (the launch carries the attribute): this grid may start
    //     while the previous kernel on the stream finishes, and waits for it (its memory visible)
    //     here, before any global access; it lets the next one start at once in turn (the next
    //     kernel, if launched so, waits for this grid's completion in its own griddepcontrol.wait)
    //   8 the row's statistics max-first (a warp max, then a plain warp sum) instead of merging
    //     per-lane (max, sum-exp) pairs
    const int C = Cf & 0xff, opt = Cf >> 8;
    if (opt & 4) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ double wsum[3][SMALL_WARPS];
    __shared__ __align__(16) double cta_l[8][2];  // rank 0's copy receives every CTA's loss sums (DSMEM)
    __shared__ __align__(8) uint64_t fin_bar;     // opt 2: rank 0's barrier for them
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rank = (int)cluster.block_rank();
    const int V = (int)a.V;
    if ((opt & 2) && threadIdx.x == 0) {
        mbar_init(&fin_bar, 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // why: a CTA may touch another's shared memory only once that CTA has started; arrive now,
    // wait just before the remote store in step 3, so the barrier's latency hides behind the rows
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    const int gw = rank * SMALL_WARPS + warp, nw = C * SMALL_WARPS;
    Pack<T> x[SMALL_KW];
    float xs = 0.0f;
    bool pre = false;
    if ((opt & 1) && gw < a.N) { small_load_row<T>(a, gw, lane, x, xs); pre = true; }

    // 1. denominators, computed redundantly by every CTA (N <= SMALL_MAX_ROWS targets from L2):
    //    no cluster barrier needed before the rows. Fixed striding + fixed-order sums: every CTA
    //    gets the same bits.
    Denoms d;
    const bool mean = a.reduction == FL_REDUCTION_MEAN;
    if (!a.weight) {
        // no class weights: D_w = D_n = the count of non-ignored targets, an integer (exact, the
        // same bits as the sum below); one __syncthreads_count per 512 targets instead of three
        // warp-shuffle reductions and 48 serial double adds: the kernel's time is its warps'
        // instruction chains (ncu, H200 2026-12-02 s5 run 2: ~900 instructions per warp, ~10
        // cycles each). SUM needs no count.
        d.Dw = d.Dn = 1.0;
        if (mean) {
            int cnt = 0;
            for (int64_t i0 = 0; i0 < a.N; i0 += blockDim.x) {
                const int64_t i = i0 + threadIdx.x;
                cnt += __syncthreads_count(i < a.N && load_target(a, i) != a.ignore_index);
            }
            d.Dw = d.Dn = (double)cnt;
        }
        d.W = 0.0;
    } else {
        double dw = 0.0, dn = 0.0, W = 0.0;
        for (int64_t i = threadIdx.x; i < a.N; i += blockDim.x) {
            int64_t t = load_target(a, i);
            if (t == a.ignore_index) continue;
            dn += 1.0;
            dw += (a.weight && t >= 0 && t < a.V) ? (double)a.weight[t] : 1.0;
        }
        if (a.weight && a.eps > 0.0f)
            for (int64_t j = threadIdx.x; j < a.V; j += blockDim.x) W += (double)a.weight[j];
        for (int o = 16; o > 0; o >>= 1) {
            dw += __shfl_xor_sync(0xffffffffu, dw, o);
            dn += __shfl_xor_sync(0xffffffffu, dn, o);
            W += __shfl_xor_sync(0xffffffffu, W, o);
        }
        if (lane == 0) { wsum[0][warp] = dw; wsum[1][warp] = dn; wsum[2][warp] = W; }
        __syncthreads();  // why: warp partials visible to every thread
        d.Dw = 0.0; d.Dn = 0.0; d.W = 0.0;
        for (int w = 0; w < SMALL_WARPS; w++) { d.Dw += wsum[0][w]; d.Dn += wsum[1][w]; d.W += wsum[2][w]; }
    }
    if (!mean) { d.Dw = 1.0; d.Dn = 1.0; }
    d.W = a.eps > 0.0f ? (a.weight ? d.W : (double)a.V) : 0.0;
    // one upstream gradient for every row (reduced loss): over the denominators once, here,
    // where its load and the two double divisions overlap the rows' loads (per row they were on
    // every lane's path between the row's statistics and its gradient)
    float g_a, g_b;
    upstream_over_denoms(a, d, row_upstream(a, 0), g_a, g_b);

    // 2. rows: warp gw handles rows gw, gw + C*WARPS, ...; its lane 0 sums their losses in row order
    double acc_a = 0.0, acc_b = 0.0;
    for (int64_t i = gw; i < a.N; i += nw) {
        const bool have = pre;   // this row already in x (opt 1, the warp's first row)
        pre = false;
        const T* row = (const T*)a.logits + i * a.ld;
        T* drow = (T*)a.dlogits + i * a.ld;
        const int64_t t64 = load_target(a, i);
        const bool ignored = t64 == a.ignore_index;
        const bool bad = !ignored && (t64 < 0 || t64 >= a.V);
        const int t = bad ? -1 : (int)t64;
        const RowGrid<T> g(row, V);
        const bool has_x = lane < g.nextra;
        const int ex = has_x ? g.extra_elem(lane) : 0;
        if (ignored) {
            if (lane == 0 && a.lse_out) a.lse_out[i] = 0.0f;
            if (lane == 0 && a.tprob) a.tprob[i] = 1.0f;
            if (PASS != PASS_FORWARD) {
                Pack<T> zero;
#pragma unroll
                for (int v = 0; v < Pack<T>::VEC; v++) zero.v[v] = from_float<T>(0.0f);
#pragma unroll
                for (int k = 0; k < SMALL_KW; k++)
                    if (lane + 32 * k < g.nfull) store_vec(zero, drow, g.vec_elem(lane + 32 * k));
                if (has_x) drow[ex] = from_float<T>(0.0f);
            }
            continue;
        }
        if (bad && lane == 0 && a.error_flag) *a.error_flag = 1;
        // (loading each warp's first row before step 1, to overlap its latency with the target
        // loads there, measured 6.54 us instead of 6.25 for 128x1000 f32 (H200 2026-12-01 run 4,
        // a run where unrelated small launches were also slower): not kept)
        if (!have) small_load_row<T>(a, i, lane, x, xs);
        // target logit read by lane 0 here; the __syncwarp() before the gradient stores below
        // orders this read before any other lane's (in-place) store (shuffles alone give no
        // memory ordering: the compiler could sink this load into the lane-0 block)
        // (taking it from the registers instead, the owner lane found by a ballot and one shuffle,
        // measured SLOWER: 6.58 vs 6.37 us, H200 2026-12-02 s5 run 2; the kernel's time is its
        // warps' instruction chains (ncu: ~900 instructions per warp at ~10 cycles each), and the
        // owner search adds ~70 to every lane while this load hides behind the row's reductions)
        const float zt = (lane == 0 && !bad) ? zval<F>(a, to_float(row[t]), t) : 0.0f;
        float m = has_x ? zval<F>(a, xs, ex) : -INFINITY;
#pragma unroll
        for (int k = 0; k < SMALL_KW; k++)
            if (lane + 32 * k < g.nfull) m = vec_max<F>(a, x[k], g.vec_elem(lane + 32 * k), m);
        // opt 8: the row's max first (5 shuffles + fmaxf), then every lane's exponentials against
        // it and a plain warp sum: no (max, sum) merges (two exponentials and branches per level)
        if (opt & 8)
            for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float mL = m == -INFINITY ? 0.0f : m * FL_LOG2E;
        float s = 0.0f, wz = 0.0f;
#pragma unroll
        for (int k = 0; k < SMALL_KW; k++)
            if (lane + 32 * k < g.nfull) vec_sum<F>(a, x[k], g.vec_elem(lane + 32 * k), mL, s, wz);
        if (has_x) {
            float z = zval<F>(a, xs, ex);
            s += fexp2(fmaf(z, FL_LOG2E, -mL));
            if (F & F_SMOOTH) wz += (a.weight ? __ldg(a.weight + ex) : 1.0f) * z;
        }
        RowStats r = {m, s, wz};
        if (opt & 8) {
            for (int o = 16; o > 0; o >>= 1) {
                r.s += __shfl_xor_sync(0xffffffffu, r.s, o);
                if (F & F_SMOOTH) r.wz += __shfl_xor_sync(0xffffffffu, r.wz, o);
            }
        } else {
            r = warp_reduce_stats(r);
        }
        const float lse = (r.m == -INFINITY) ? -INFINITY : r.m + logf(r.s);
        if (lane == 0) {
            float ai, bi;
            finish_row(a, d, i, t, bad, lse, zt, r.wz, &ai, &bi);
            acc_a += (double)ai;
            acc_b += (double)bi;
        }
        if (PASS != PASS_FORWARD) {
            __syncwarp();   // lane 0's read of row[t] above happens before these stores
            const GradCoef cf = make_coef_g(a, d, g_a, g_b, t, bad, target_weight(a, t, bad), lse);
#pragma unroll
            for (int k = 0; k < SMALL_KW; k++) {
                int q = lane + 32 * k;
                if (q < g.nfull) store_vec(vec_grad<F>(a, cf, x[k], g.vec_elem(q)), drow, g.vec_elem(q));
            }
            if (has_x) drow[ex] = from_float<T>(grad_elem<F>(a, cf, zval<F>(a, xs, ex), ex));
        }
    }

    // 3. loss: warps in order, then CTAs in rank order. Each CTA stores its sum straight into
    //    rank 0's shared memory (DSMEM); one cluster barrier publishes them, and no CTA touches
    //    another's shared memory after it, so no second barrier is needed before exiting.
    __syncthreads();  // why: wsum is reused
    if (lane == 0) { wsum[0][warp] = acc_a; wsum[1][warp] = acc_b; }
    __syncthreads();  // why: warp sums visible to thread 0
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // pairs with the arrive at entry
    if (opt & 2) {
        if (threadIdx.x == 0) {
            double A = 0, B = 0;
            for (int w = 0; w < SMALL_WARPS; w++) { A += wsum[0][w]; B += wsum[1][w]; }
            // rank 0 arms for C x 16 bytes (a remote st.async may land first: the tx count then
            // goes negative until this expect_tx)
            if (rank == 0) mbar_arrive_tx(&fin_bar, (uint32_t)C * 16u);
            const unsigned long long ua = (unsigned long long)__double_as_longlong(A);
            const unsigned long long ub = (unsigned long long)__double_as_longlong(B);
            const float4 v = make_float4(__uint_as_float((unsigned)ua), __uint_as_float((unsigned)(ua >> 32)),
                                         __uint_as_float((unsigned)ub), __uint_as_float((unsigned)(ub >> 32)));
            st_async_f4(mapa_shared(smem_addr(&cta_l[rank][0]), 0), v, mapa_shared(smem_addr(&fin_bar), 0));
            if (rank == 0) {
                mbar_wait_cluster(&fin_bar, 0u);
                double At = 0, Bt = 0;
                for (int c = 0; c < C; c++) { At += cta_l[c][0]; Bt += cta_l[c][1]; }
                double total = a.reduction == FL_REDUCTION_MEAN ? At / d.Dw + (a.zeta > 0.0f ? Bt / d.Dn : 0.0) : At + Bt;
                a.loss[0] = (float)total;
            }
        }
        // no CTA exits while its st.async may be in flight: rank 0 arrives once all have landed
        // (relaxed: the data is ordered by the mbarrier, no fence over the gradient stores)
        asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
        asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
        return;
    }
    if (threadIdx.x == 0) {
        double A = 0, B = 0;
        for (int w = 0; w < SMALL_WARPS; w++) { A += wsum[0][w]; B += wsum[1][w]; }
        double* dst = cluster.map_shared_rank(&cta_l[0][0], 0);
        dst[2 * rank] = A;
        dst[2 * rank + 1] = B;
    }
    cluster.sync();  // why: all CTAs' sums have landed in rank 0's cta_l
    if (rank == 0 && threadIdx.x == 0) {
        double A = 0, B = 0;
        for (int c = 0; c < C; c++) { A += cta_l[c][0]; B += cta_l[c][1]; }
        double total = a.reduction == FL_REDUCTION_MEAN ? A / d.Dw + (a.zeta > 0.0f ? B / d.Dn : 0.0) : A + B;
        a.loss[0] = (float)total;
    }
#else
    __trap();  // chosen only on sm_90+
#endif
}

// ---------------------------------------------------------------------------------------------
// sm_90: ONE read of the logits for long rows. A persistent kernel; each thread-block cluster of
// `cs` CTAs owns rows grp, grp + ngrp, ...; CTA `rank` stages its contiguous chunk of the row's
// aligned vectors in shared memory with bulk async copies (cp.async.bulk, completion on an
// mbarrier). The chunk is cut into `ns` sub-chunks, each with its own mbarrier, and the buffer is
// recycled sub-chunk by sub-chunk: as soon as the last sweep of this row has left sub-chunk k (a
// CTA barrier), warp 0 issues the copy of the NEXT row's sub-chunk k into it. So the next row's
// bytes are in flight while this row's gradient is swept and stored, and the next row's
// statistics start on sub-chunk 0 while the rest still lands (versions 4-5 waited for this row's
// whole sweep before issuing anything: NOTES.md). Per row: one online (max, sum-exp) sweep, a
// block reduction, each CTA's partial (max, sum-exp, sum w z, target logit) stored into every CTA
// of the cluster (DSMEM), ONE cluster barrier, a rank-ordered merge (same bits everywhere), then
// the gradient sweep (fused) with 16-byte streaming stores.
// HBM traffic: one read of the logits (+ one write of dlogits): the floor.
// Backward (lse given; by knob) uses the same staging without a cluster: work units (row, chunk).
// Head/tail elements outside the row's 16-byte-aligned body are loaded by rank 0 directly.
#define TMA_MAX_CLUSTER 16
#define TMA_MAX_SUB 8       // sub-chunks (mbarriers) per CTA buffer
#define TMA_PIECE_VECS 256  // one bulk copy moves at most 4 KB; warp 0's lanes issue the pieces

// (the mbarrier, bulk-copy, cp.async and st.async primitives: cluster.cuh)

// CTA `rank`'s share of a row: aligned vectors [lo, lo + n) of the row's nfull.
struct TmaChunk { int lo, n; };
__device__ __forceinline__ TmaChunk tma_chunk(int nfull, int cs, int rank) {
    const int per = (nfull + cs - 1) / cs;
    TmaChunk c;
    c.lo = rank * per;
    int hi = c.lo + per < nfull ? c.lo + per : nfull;
    c.n = hi > c.lo ? hi - c.lo : 0;
    return c;
}

// Work unit `it` of this CTA: (row, rank). Clusters walk rows; backward walks (row, chunk) units.
template <int PASS>
__device__ __forceinline__ bool tma_unit(int64_t it, int cs, int crank, int64_t N, int64_t* row, int* rank) {
    if (PASS != PASS_BACKWARD) {
        const int64_t ngrp = gridDim.x / cs;
        *row = (int64_t)(blockIdx.x / cs) + it * ngrp;
        *rank = crank;
    } else {
        const int64_t u = (int64_t)blockIdx.x + it * gridDim.x;
        *row = u / cs;
        *rank = (int)(u % cs);
    }
    return *row < N;
}

// One warp: start the copy of sub-chunk k (vectors [k*sub, (k+1)*sub) of (row, rank)'s chunk) to
// dst (the staged kernel: buf + k*sub; the ring kernel: a ring slot); the mbarrier's phase
// completes when its bytes have landed (at once for ignored rows and empty sub-chunks). t64: the
// row's target, loaded ahead by the caller.
template <typename T>
__device__ __forceinline__ void tma_issue_sub(const CeArgs& a, int64_t i, int rank, int cs, int64_t t64, int sub,
                                              int k, uint4* dst, uint64_t* bar) {
    const int lane = threadIdx.x & 31;
    const T* row = (const T*)a.logits + i * a.ld;
    int lo = k * sub, n = 0;
    const T* src = row;
    if (t64 != a.ignore_index) {
        const RowGrid<T> g(row, (int)a.V);
        const TmaChunk ch = tma_chunk(g.nfull, cs, rank);
        const int hi = lo + sub < ch.n ? lo + sub : ch.n;
        n = hi > lo ? hi - lo : 0;
        src = row + g.vec_elem(ch.lo + lo);
    }
    if (lane == 0) {
        if (n > 0) mbar_arrive_tx(bar, (uint32_t)n * 16u);
        else mbar_arrive(bar);
    }
    __syncwarp();
    for (int p = lane; p * TMA_PIECE_VECS < n; p += 32) {
        const int v0 = p * TMA_PIECE_VECS;
        const int nv = n - v0 < TMA_PIECE_VECS ? n - v0 : TMA_PIECE_VECS;
        bulk_load(dst + v0, src + (size_t)v0 * Pack<T>::VEC, (uint32_t)nv * 16u, bar);
    }
}

// The per-row scalars a unit needs besides its chunk, loaded one unit ahead so that no dependent
// global load (target -> weight[target], target logit) sits on the row's critical path.
struct TmaRow {
    int64_t i, t64;
    int rank;
    bool valid;
    float xs;   // this thread's head/tail element (rank 0, tid < nextra)
    float zt;   // target logit (rank 0, thread 0)
    float w_t;  // weight[target] (1 without weights)
    float G;    // upstream gradient x grad_scale (per row with NONE)
    float lse;  // backward: the given lse
};

template <typename T, int PASS, int F>
__device__ __forceinline__ void tma_row_fetch(const CeArgs& a, TmaRow& r, float Gs) {
    if (!r.valid) return;
    const int tid = (int)threadIdx.x;
    const T* row = (const T*)a.logits + r.i * a.ld;
    const RowGrid<T> g(row, (int)a.V);
    const bool ignored = r.t64 == a.ignore_index;
    const bool bad = !ignored && (r.t64 < 0 || r.t64 >= a.V);
    r.xs = 0.0f; r.zt = 0.0f; r.w_t = 1.0f; r.G = Gs; r.lse = 0.0f;
    if (ignored) return;
    if (r.rank == 0 && tid < g.nextra) r.xs = to_float(row[g.extra_elem(tid)]);
    if (PASS != PASS_BACKWARD && r.rank == 0 && tid == 0 && !bad) r.zt = to_float(row[r.t64]);
    if (a.weight && !bad) r.w_t = __ldg(a.weight + r.t64);
    if (PASS != PASS_FORWARD && a.reduction == FL_REDUCTION_NONE)
        r.G = a.grad_scale * (a.grad_loss ? a.grad_loss[r.i] : 1.0f);
    if (PASS == PASS_BACKWARD) r.lse = a.lse_in[r.i];
}

template <int PASS>
__device__ __forceinline__ TmaRow tma_row_at(const CeArgs& a, int64_t it, int cs, int crank) {
    TmaRow r;
    r.valid = tma_unit<PASS>(it, cs, crank, a.N, &r.i, &r.rank);
    r.t64 = r.valid ? load_target(a, r.i) : a.ignore_index;
    return r;
}

template <typename T, int PASS, int F, bool PST = false>
__global__ void __launch_bounds__(256, 3) ce_tma_kernel(CeArgs a, int cs, int per, int ns, int xasync_req) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // st.async needs a cluster of >= 2 CTAs (compute-sanitizer memcheck: "Invalid __shared__ write
    // ... Cluster needs to have at least 2 blocks", H200 2026-12-02 run 8, a cs = 1 launch; the
    // results were right): one CTA per row exchanges through the barrier path
    const int xasync = xasync_req && cs > 1;
    extern __shared__ __align__(128) uint4 tma_buf[];  // [per] 16-byte vectors, ns sub-chunks
    __shared__ __align__(8) uint64_t bar[TMA_MAX_SUB];
    __shared__ __align__(8) uint64_t xbar[2];  // xasync: slot x's arrival barrier (cs x 16 bytes a phase)
    __shared__ float4 slot[2][TMA_MAX_CLUSTER];  // partials of the cluster's CTAs, by rank
    __shared__ float sh[96];
    const int tid = (int)threadIdx.x, T_ = (int)blockDim.x;
    const int V = (int)a.V;
    const int sub = (per + ns - 1) / ns;
    int crank = 0;
    if (PASS != PASS_BACKWARD) asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(crank));

    if (tid == 0) {
        for (int k = 0; k < ns; k++) mbar_init(&bar[k], 1u);
        mbar_init(&xbar[0], 1u);
        mbar_init(&xbar[1], 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // row-independent scalars, once (the setup kernel ran before this one on the stream)
    const Denoms dn = load_denoms(a);
    const float Gs = (PASS != PASS_FORWARD && a.reduction != FL_REDUCTION_NONE) ? row_upstream(a, 0) : 0.0f;

    // cur: the unit being processed; nx: the next one (its copies are issued during cur's last
    // sweep, its scalars are loaded during cur); nx2: the one after (target only)
    TmaRow cur = tma_row_at<PASS>(a, 0, cs, crank);
    TmaRow nx = tma_row_at<PASS>(a, 1, cs, crank);
    __syncthreads();  // why: barriers initialised before any copy is issued or waited on
    if (PASS != PASS_BACKWARD) cg::this_cluster().sync();  // why: DSMEM stores need every CTA started
    if (tid < 32 && cur.valid)
        for (int k = 0; k < ns; k++) tma_issue_sub<T>(a, cur.i, cur.rank, cs, cur.t64, sub, k, tma_buf + (size_t)k * sub, &bar[k]);
    tma_row_fetch<T, PASS, F>(a, cur, Gs);

    int xch = 0;  // exchanges done: slot parity (every CTA of the cluster counts the same rows)
    for (int64_t it = 0; cur.valid; it++) {
        TmaRow nx2 = tma_row_at<PASS>(a, it + 2, cs, crank);
        tma_row_fetch<T, PASS, F>(a, nx, Gs);  // loads land while this unit is processed

        const int64_t i = cur.i;
        const int rank = cur.rank;
        const uint32_t parity = (uint32_t)(it & 1);  // every barrier completes one phase per unit
        const T* row = (const T*)a.logits + i * a.ld;
        T* drow = (T*)a.dlogits + i * a.ld;
        const int64_t t64 = cur.t64;
        const bool ignored = t64 == a.ignore_index;
        const bool bad = !ignored && (t64 < 0 || t64 >= a.V);
        const int t = bad ? -1 : (int)t64;
        const RowGrid<T> g(row, V);
        const TmaChunk ch = tma_chunk(g.nfull, cs, rank);
        const bool has_x = rank == 0 && tid < g.nextra;
        const int ex = has_x ? g.extra_elem(tid) : 0;
        const float xs = cur.xs;

        if (ignored) {  // not read; dlogits zero-filled; loss/lse 0; no exchange (all CTAs agree)
            if (PASS != PASS_BACKWARD && rank == 0 && tid == 0) ignored_row_outputs(a, i, PASS);
            if (PASS != PASS_FORWARD) {
                Pack<T> zero;
#pragma unroll
                for (int v = 0; v < Pack<T>::VEC; v++) zero.v[v] = from_float<T>(0.0f);
                for (int q = tid; q < ch.n; q += T_) store_vec<T, PST>(zero, drow, g.vec_elem(ch.lo + q));
                if (has_x) drow[ex] = from_float<T>(0.0f);
            }
            // the (empty) phases complete at once; every thread observes them before the barrier
            // moves on (a phase two ahead would alias the parity)
            for (int k = 0; k < ns; k++) mbar_wait(&bar[k], parity);
            __syncthreads();  // why: all threads past their waits before the next copies arm the barriers
            if (tid < 32 && nx.valid)
                for (int k = 0; k < ns; k++) tma_issue_sub<T>(a, nx.i, nx.rank, cs, nx.t64, sub, k, tma_buf + (size_t)k * sub, &bar[k]);
        } else {
            if (bad && rank == 0 && tid == 0 && a.error_flag) *a.error_flag = 1;
            float lse;
            if (PASS == PASS_BACKWARD) {
                lse = cur.lse;
            } else {
                const float m0 = has_x ? zval<F>(a, xs, ex) : -INFINITY;
                float s = has_x ? 1.0f : 0.0f, wz = 0.0f;
                if (has_x && (F & F_SMOOTH)) wz = (a.weight ? __ldg(a.weight + ex) : 1.0f) * m0;
                OnlineMS ms;  // one pass per sub-chunk, lazy reference (see OnlineMS)
                ms.init_at(m0);
                for (int k = 0; k < ns; k++) {
                    const int lo = k * sub, hi = lo + sub < ch.n ? lo + sub : ch.n;
                    mbar_wait(&bar[k], parity);
                    sweep_stats<F, T>(a, tma_buf, g, ch.lo, lo + tid, hi, T_, ms, s, wz);
                    if (PASS == PASS_FORWARD) {  // the forward is done with sub-chunk k: recycle it
                        __syncthreads();  // why: every thread has read sub-chunk k
                        if (tid < 32 && nx.valid)
                            tma_issue_sub<T>(a, nx.i, nx.rank, cs, nx.t64, sub, k, tma_buf + (size_t)k * sub, &bar[k]);
                    }
                }
                ms.finish(s);
                RowStats r = {ms.m, s, wz};
                r = block_reduce_ms<F>(r, sh);
                const int x = xch & 1;
                const uint32_t xpar = (uint32_t)((xch >> 1) & 1);  // phase of slot x's barrier
                xch++;
                if (xasync) {
                    if (tid == 0) {
                        const float zt = (rank == 0 && !bad) ? zval<F>(a, cur.zt, t) : 0.0f;
                        const float4 mine = make_float4(r.m, r.s, r.wz, zt);
                        // arm this CTA's barrier for the cs partials (a remote st.async may land
                        // first: its tx count then goes negative until this expect_tx)
                        mbar_arrive_tx(&xbar[x], (uint32_t)cs * 16u);
                        const uint32_t ls = smem_addr(&slot[x][rank]), lb = smem_addr(&xbar[x]);
                        for (int c = 0; c < cs; c++) st_async_f4(mapa_shared(ls, c), mine, mapa_shared(lb, c));
                    }
                    // why: the phase completes once all cs partials have landed here; slot[x] is
                    // next written two exchanges later, which no CTA starts before it has this
                    // CTA's partial of the exchange in between, sent after the reads below
                    mbar_wait_cluster(&xbar[x], xpar);
                } else {
                if (tid == 0) {
                    const float zt = (rank == 0 && !bad) ? zval<F>(a, cur.zt, t) : 0.0f;
                    const float4 mine = make_float4(r.m, r.s, r.wz, zt);
                    cg::cluster_group cl = cg::this_cluster();
                    for (int c = 0; c < cs; c++) *cl.map_shared_rank(&slot[x][rank], c) = mine;
                }
                // why: every CTA's partial has landed in every CTA's slot[x]; slot[x] is next
                // written two exchanges later, after the next barrier, which this CTA reaches
                // only once it has read slot[x] below
                cg::this_cluster().sync();
                }
                float4 p0 = slot[x][0];
                float M = p0.x, S = p0.y, WZ = p0.z;
                for (int c = 1; c < cs; c++) {  // rank order: the same bits in every CTA
                    float4 pc = slot[x][c];
                    ms_merge(M, S, pc.x, pc.y);
                    WZ += pc.z;
                }
                lse = (M == -INFINITY) ? -INFINITY : M + logf(S);
                if (rank == 0 && tid == 0) finish_row_w(a, dn, i, bad, cur.w_t, lse, p0.w, WZ, NULL, NULL);
            }
            if (PASS != PASS_FORWARD) {
                const GradCoef c = make_coef_v(a, dn, cur.G, t, bad, cur.w_t, lse);
                for (int k = 0; k < ns; k++) {
                    const int lo = k * sub, hi = lo + sub < ch.n ? lo + sub : ch.n;
                    if (PASS == PASS_BACKWARD) mbar_wait(&bar[k], parity);
#pragma unroll 4
                    for (int q = lo + tid; q < hi; q += T_) {
                        const int e0 = g.vec_elem(ch.lo + q);
                        store_vec<T, PST>(vec_grad<F>(a, c, lds_pack<T>(tma_buf + q), e0), drow, e0);
                    }
                    __syncthreads();  // why: every thread has read sub-chunk k before it is refilled
                    if (tid < 32 && nx.valid)
                        tma_issue_sub<T>(a, nx.i, nx.rank, cs, nx.t64, sub, k, tma_buf + (size_t)k * sub, &bar[k]);
                }
                if (has_x) drow[ex] = from_float<T>(grad_elem<F>(a, c, zval<F>(a, xs, ex), ex));
            }
        }
        cur = nx;
        nx = nx2;
    }
    // xasync: every partial sent to this CTA has landed (waited above), but its own st.async to
    // the others may still be in flight: no CTA exits before all have passed their last exchange
    if (PASS != PASS_BACKWARD && xasync) cg::this_cluster().sync();
#else
    __trap();  // chosen only on sm_90+
#endif
}

// sm_90, fused: the staged kernel with WARP-SPECIALISED roles over a RING of row sub-chunks
// (FUSEDLOSS_CE_PIPE=1, the default where it fits). Why: the one-buffer kernel above runs each
// CTA's row as load -> statistics -> exchange -> gradient sweep + stores, so a CTA that stores is
// not computing statistics, and the SM's overlap of the two depends on its 3 CTAs being out of
// phase (fused 8192x128256 bf16 1.23x). A single pipelined CTA alternating statistics and stores
// measured 1.82x (H200 2026-12-02 s6 run 1). Here one CTA per SM holds its chunk of several rows
// in a ring of R slots of `sub` 16-byte vectors (a row's chunk: nsub = ceil(per / sub) slots, the
// rows one after another around the ring) and its warps split in three roles that run at once:
//  - PRODUCER (the last warp): walks the ring positions in order; position P
//    (row P / nsub, sub-chunk P % nsub) goes to slot P % R once every gradient warp has released
//    position P - R (mbarrier empty[s], one arrival per gradient warp), as a bulk async copy that
//    completes full[s]. Ignored rows and sub-chunks past the chunk's end complete full[s] at once.
//  - STATISTICS (threads [0, Ts)): sweeps row k's (max, sum-exp) slot by slot as each lands (an
//    online max per slot), reduces over the group and sends its partial (max, sum-exp, sum w z,
//    target logit) to every CTA of the cluster (st.async into xslot k % PIPE_XSLOTS, counted on that
//    xslot's mbarrier; cs == 1: a local store + arrive).
//  - GRADIENT (threads [Ts, T - 32)): waits for row k's partials, merges them in rank order,
//    sweeps row k's gradient slot by slot from shared memory with streaming stores, each warp
//    releasing each slot.
// So a row needs only its own chunk plus slack in shared memory, not nbuf whole chunks: rows up to
// ~200 KB per CTA run on one CTA per SM (all 132 SMs with cs = 1 or 2). Every position of every row,
// ignored rows included, completes one phase of full[s] and of empty[s], and every row one phase of
// xbar[x]: the roles walk the same sequence, the parities follow the wrap count.
// xslot reuse: a row's last position P needs position P - R released, i.e. the gradient group done
// with row k - B, B = ceil((R - nsub + 1) / nsub). A remote CTA sends row k + X once its chunk of it
// landed: its gradient finished row k + X - B, which needed THIS CTA's partial of that row, sent
// after this CTA's gradient finished row k + X - 2B. X = PIPE_XSLOTS >= 2B keeps this CTA's reads of
// row k's xslot (at the start of its row) before that: the host keeps R <= (X / 2 + 1) nsub - 1.
#define PIPE_MAX_SLOTS 16
#define PIPE_XSLOTS 8
#define PIPE_MAX_THREADS 544
// The option-free variants (F = 0: 72 registers) also compile for up to 800 threads (25 warps; 81
// registers a thread at one CTA per SM), for more warps to hide the sweeps' latencies
// (FUSEDLOSS_CE_PIPE_THREADS; the option variants use 92-96 registers and stay at 544).
#define PIPE_MAX_THREADS_F0 800
#define PIPE_BOUND(F) ((F) == 0 ? PIPE_MAX_THREADS_F0 : PIPE_MAX_THREADS)

__device__ __forceinline__ void group_bar(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
// TM (default since s21; FUSEDLOSS_CE_PIPE_TMAP=0: raw bulk copies): the producer's copies through tensor
// maps (cluster.cuh: FlTmaps, tmap_issue), slots of whole 128-byte lines, so that racecheck sees no thread
// writing the slots (its reports of every refill under the raw bulk copies: s16-s17). H100 s21 run 1,
// fused x floor, raw / TM: 8192x128256 bf16 1.07 / 1.07, 4096x50257 f32 1.11 / 1.11, 2048x32000 f16
// 1.25 / 1.24; the test 208/0 with 334 launches through maps.
// NB (FUSEDLOSS_CE_PIPE_NBAR=1; not yet run): slot s released through hardware barrier NB_BASE + s
// (cluster.cuh: nbar_release / nbar_wait_refill) instead of the mbarrier empty[s]; R <= NB_MAX_SLOTS.

// A walker over the ring: slot and phase parity of the current position.
struct RingPos {
    int s;
    uint32_t ph;
    __device__ __forceinline__ void next(int R) {
        if (++s == R) { s = 0; ph ^= 1u; }
    }
};

// block_reduce_ms over one warp group (threads [base, base + n), named barrier `id`): same fixed
// order as the CTA version. Valid in every thread of the group.
template <int F>
__device__ __forceinline__ RowStats group_reduce_ms(RowStats r, float* sh, int gtid, int n, int id) {
    const int lane = gtid & 31, warp = gtid >> 5, nwarps = n >> 5;
    float m = r.m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    group_bar(id, n);  // why: `sh` may still be read by the group's previous reduction
    if (lane == 0) sh[warp] = m;
    group_bar(id, n);  // why: the warp maxima visible to the group
    float M = sh[0];
    for (int w = 1; w < nwarps; w++) M = fmaxf(M, sh[w]);
    float s = r.m == M ? r.s : r.s * fexp2((r.m - M) * FL_LOG2E), wz = r.wz;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        if (F & F_SMOOTH) wz += __shfl_xor_sync(0xffffffffu, wz, o);
    }
    if (lane == 0) { sh[32 + warp] = s; sh[64 + warp] = wz; }
    group_bar(id, n);  // why: the warp sums visible to the group
    RowStats t = {M, sh[32], (F & F_SMOOTH) ? sh[64] : 0.0f};
    for (int w = 1; w < nwarps; w++) {
        t.s += sh[32 + w];
        if (F & F_SMOOTH) t.wz += sh[64 + w];
    }
    return t;
}

template <typename T, int F, bool PST = false, bool NB = false, bool TM = false, int DN = 0>
__global__ void __launch_bounds__(PIPE_BOUND(F), 1) ce_pipe_kernel(CeArgs a, int cs, int per, int sub, int R, int Ts,
                                                                   const __grid_constant__ FlTmaps tm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) uint4 pipe_buf[];     // [R][sub] 16-byte vectors: the ring
    __shared__ __align__(8) uint64_t full[PIPE_MAX_SLOTS];   // slot s's sub-chunk landed
    __shared__ __align__(8) uint64_t empty[PIPE_MAX_SLOTS];  // every gradient warp is done with slot s
    __shared__ __align__(8) uint64_t xbar[PIPE_XSLOTS];      // xslot x's cs partials landed
    __shared__ float4 slot[PIPE_XSLOTS][TMA_MAX_CLUSTER];
    __shared__ float sh[96];
    __shared__ unsigned long long s_cnt;   // DN: the gradient group's count of non-ignored targets
    const int tid = (int)threadIdx.x;
    const int V = (int)a.V;
    const int nsub = (per + sub - 1) / sub;
    const int ngw = ((int)blockDim.x - Ts - 32) >> 5;  // gradient warps
    int crank = 0;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(crank));
    // PDL: the reduce kernel may launch now (it waits for this grid's end); this grid itself may
    // have been launched during this call's setup kernel (launch_pipe: only then): the producer
    // and the statistics group read only the logits, targets and weights, which the setup does
    // not write and which were complete before it started; the gradient group, which reads the
    // setup's denominators and writes every output, waits for it first
    pdl_trigger();
    if (tid == 0) {
        for (int k = 0; k < R; k++) {
            mbar_init(&full[k], 1u);
            mbar_init(&empty[k], (uint32_t)ngw);
        }
        for (int k = 0; k < PIPE_XSLOTS; k++) mbar_init(&xbar[k], 1u);
        if constexpr (DN) s_cnt = 0ull;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();  // why: barriers initialised before any copy is issued or waited on
    if (cs > 1) cg::this_cluster().sync();  // why: st.async into a CTA needs it started, its barriers initialised
    const int64_t ngrp = gridDim.x / cs;
    const int64_t row0 = (int64_t)(blockIdx.x / cs);
    RingPos rp = {0, 0u};
    if (tid < Ts) {
        // ---------------- statistics group ----------------
        const int n = Ts;
        int64_t tn = row0 < a.N ? load_target(a, row0) : 0;  // targets loaded a row ahead
        for (int64_t it = 0;; it++) {
            const int64_t i = row0 + it * ngrp;
            if (i >= a.N) break;
            const int64_t t64 = tn;
            if (i + ngrp < a.N) tn = load_target(a, i + ngrp);
            const T* row = (const T*)a.logits + i * a.ld;
            const bool ignored = t64 == a.ignore_index;
            const bool bad = !ignored && (t64 < 0 || t64 >= a.V);
            const RowGrid<T> g(row, V);
            const TmaChunk ch = tma_chunk(g.nfull, cs, crank);
            const bool has_x = !ignored && crank == 0 && tid < g.nextra;
            const int ex = has_x ? g.extra_elem(tid) : 0;
            const float xs = has_x ? to_float(row[ex]) : 0.0f;
            const float zraw = (!ignored && !bad && crank == 0 && tid == 0) ? to_float(row[t64]) : 0.0f;
            OnlineMS ms;
            ms.init();
            float s_ = 0.0f, wz = 0.0f;
            // c: this thread's next vector in chunk coordinates, carried across slots, so that the
            // threads' shares stay balanced over the whole chunk (restarting at tid in every slot
            // gave the low threads one vector more per slot: 8 slots, 25% over on the slowest warp)
            int c = tid;
            for (int j = 0; j < nsub; j++, rp.next(R)) {
                mbar_wait(&full[rp.s], rp.ph);
                const int lo = j * sub;
                const int hi = ignored ? 0 : (ch.n - lo < sub ? ch.n - lo : sub);  // vectors in this slot
                if (hi <= 0) continue;
                const uint4* buf = pipe_buf + (size_t)rp.s * sub - lo;  // buf[c], c in [lo, lo + hi)
                c = sweep_stats<F, T>(a, buf, g, ch.lo, c, lo + hi, n, ms, s_, wz);
            }
            ms.finish(s_);
            float m = ms.m;
            if (has_x) {  // the head/tail element, folded in last: its load had the row's sweep to land
                const float z = zval<F>(a, xs, ex);
                if (z > m) {
                    s_ = (m == -INFINITY ? 0.0f : s_ * fexp2((m - z) * FL_LOG2E)) + 1.0f;
                    m = z;
                } else {
                    s_ += (z == -INFINITY) ? 0.0f : fexp2((z - m) * FL_LOG2E);  // NaN stays NaN
                }
                if (F & F_SMOOTH) wz += (a.weight ? __ldg(a.weight + ex) : 1.0f) * z;
            }
            RowStats r = {-INFINITY, 0.0f, 0.0f};
            if (!ignored) {
                r.m = m; r.s = s_; r.wz = wz;
                r = group_reduce_ms<F>(r, sh, tid, n, 1);
            }
            if (tid == 0) {
                const int x = (int)(it % PIPE_XSLOTS);
                const float zt = (!ignored && !bad && crank == 0) ? zval<F>(a, zraw, (int)t64) : 0.0f;
                const float4 mine = make_float4(r.m, r.s, r.wz, zt);
                if (cs > 1) {
                    // arm for the cs partials (a remote one may land first: the tx count then goes
                    // negative until this expect_tx)
                    mbar_arrive_tx(&xbar[x], (uint32_t)cs * 16u);
                    const uint32_t ls = smem_addr(&slot[x][crank]), lb = smem_addr(&xbar[x]);
                    for (int c = 0; c < cs; c++) st_async_f4(mapa_shared(ls, c), mine, mapa_shared(lb, c));
                } else {
                    slot[x][0] = mine;
                    mbar_arrive(&xbar[x]);  // release: the store above is visible to the waiters
                }
            }
        }
    } else if (tid >= (int)blockDim.x - 32) {
        // ---------------- producer warp ----------------
        int64_t P = 0;
        for (int64_t it = 0;; it++) {
            const int64_t i = row0 + it * ngrp;
            if (i >= a.N) break;
            const int64_t t64 = load_target(a, i);
            for (int j = 0; j < nsub; j++, P++, rp.next(R)) {
                if (P >= R) {  // position P - R released
                    if constexpr (NB) nbar_wait_refill(rp.s, (ngw + 1) * 32);  // (cluster.cuh)
                    else mbar_wait_refill(&empty[rp.s], rp.ph ^ 1u);
                }
                if constexpr (TM) {   // the tensor-map copies (cluster.cuh: tmap_issue; sub % 8 == 0)
                    // tma_issue_sub's sub-chunk (vectors [lo, hi) of this CTA's chunk), as view rows
                    const T* row = (const T*)a.logits + i * a.ld;
                    int n = 0, r0 = 0;
                    if (t64 != a.ignore_index) {
                        const RowGrid<T> g(row, V);
                        const TmaChunk ch = tma_chunk(g.nfull, cs, crank);
                        const int lo = j * sub, hi = lo + sub < ch.n ? lo + sub : ch.n;
                        n = hi > lo ? hi - lo : 0;
                        r0 = tmap_row(a.logits, row + g.vec_elem(ch.lo + lo));
                    }
                    tmap_issue(pipe_buf + (size_t)rp.s * sub, tm, r0, n, &full[rp.s]);
                } else {
                    tma_issue_sub<T>(a, i, crank, cs, t64, sub, j, pipe_buf + (size_t)rp.s * sub, &full[rp.s]);
                }
            }
        }
    } else {
        // ---------------- gradient group ----------------
        const int gt = tid - Ts, n = ngw * 32, lane = tid & 31;
        Denoms dn;
        if constexpr (DN) {
            // DN (FUSEDLOSS_CE_PIPE_DN, default since s27; host: an unweighted fused MEAN, launched without a setup
            // kernel, and with PDL only after DN 2's ticket kernel): the group counts the batch's non-ignored
            // targets itself (the same integer in every CTA, D_w = D_n, exact in a double), while the first rows'
            // copies are in flight; CTA 0 stores them in hdr for the reduce kernel (DN 1). Why: the one-CTA setup
            // kernel (1024 threads) held one SM's registers, so one of the one-a-SM pipe CTAs started only after it.
            const int64_t ig = a.ignore_index;
            unsigned long long cnt = 0;
            int64_t i = gt;
            for (; i + 3 * (int64_t)n < a.N; i += 4 * (int64_t)n) {   // four loads in flight
                const int64_t t0 = load_target(a, i), t1 = load_target(a, i + n);
                const int64_t t2 = load_target(a, i + 2 * (int64_t)n), t3 = load_target(a, i + 3 * (int64_t)n);
                cnt += (unsigned long long)((t0 != ig) + (t1 != ig) + (t2 != ig) + (t3 != ig));
            }
            for (; i < a.N; i += n) cnt += load_target(a, i) != ig;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
            if (lane == 0) atomicAdd(&s_cnt, cnt);   // integers: any order gives the same sum
            group_bar(2, n);   // why: every warp's count added before any reads the total
            const double D = (double)s_cnt;
            dn.Dw = D;
            dn.Dn = D;
            dn.W = a.eps > 0.0f ? (double)a.Vg : 0.0;
            if (blockIdx.x == 0 && gt == 0) { a.hdr[0] = D; a.hdr[1] = D; }
        } else {
            pdl_wait();
            dn = load_denoms(a);
        }
        double fa = 0.0, fb = 0.0;   // DN 2: this CTA's row losses (thread gt 0 of rank 0), its rows' order
        const float Gs = a.reduction != FL_REDUCTION_NONE ? row_upstream(a, 0) : 0.0f;
        // a reduced loss's upstream gradient over MEAN's denominators, once (two double divisions
        // per row and thread were ~5% of the gradient group's samples, s8 run 1)
        float ga0 = 0.0f, gb0 = 0.0f;
        if (a.reduction != FL_REDUCTION_NONE) upstream_over_denoms(a, dn, Gs, ga0, gb0);
        int64_t tn = row0 < a.N ? load_target(a, row0) : 0;  // targets loaded a row ahead
        for (int64_t it = 0;; it++) {
            const int64_t i = row0 + it * ngrp;
            if (i >= a.N) break;
            const int64_t t64 = tn;
            if (i + ngrp < a.N) tn = load_target(a, i + ngrp);
            const T* row = (const T*)a.logits + i * a.ld;
            T* drow = (T*)a.dlogits + i * a.ld;
            const bool ignored = t64 == a.ignore_index;
            const bool bad = !ignored && (t64 < 0 || t64 >= a.V);
            const int t = bad ? -1 : (int)t64;
            const RowGrid<T> g(row, V);
            const TmaChunk ch = tma_chunk(g.nfull, cs, crank);
            const bool has_x = crank == 0 && gt < g.nextra;
            const int ex = has_x ? g.extra_elem(gt) : 0;
            const float xs = (has_x && !ignored) ? to_float(row[ex]) : 0.0f;
            const float w_t = (!ignored && !bad && a.weight) ? __ldg(a.weight + t64) : 1.0f;
            const float G = a.reduction == FL_REDUCTION_NONE ? a.grad_scale * (a.grad_loss ? a.grad_loss[i] : 1.0f) : Gs;
            const int x = (int)(it % PIPE_XSLOTS);
            // every row's exchange completes one phase (ignored rows send empty partials)
            if (cs > 1) mbar_wait_cluster(&xbar[x], (uint32_t)((it / PIPE_XSLOTS) & 1));
            else mbar_wait(&xbar[x], (uint32_t)((it / PIPE_XSLOTS) & 1));
            GradCoef c = {};
            if (ignored) {  // not read; dlogits zero-filled; loss/lse 0
                if (crank == 0 && gt == 0) ignored_row_outputs(a, i, PASS_FUSED);
            } else {
                if (bad && crank == 0 && gt == 0 && a.error_flag) *a.error_flag = 1;
                float4 p0 = slot[x][0];
                float M = p0.x, S = p0.y, WZ = p0.z;
                for (int cc = 1; cc < cs; cc++) {  // rank order: the same bits in every CTA
                    float4 pc = slot[x][cc];
                    ms_merge(M, S, pc.x, pc.y);
                    WZ += pc.z;
                }
                const float lse = (M == -INFINITY) ? -INFINITY : M + logf(S);
                if constexpr (DN == 2) {
                    if (crank == 0 && gt == 0) {
                        float ai, bi;
                        finish_row_w(a, dn, i, bad, w_t, lse, p0.w, WZ, &ai, &bi);
                        fa += (double)ai;
                        fb += (double)bi;
                    }
                } else {
                    if (crank == 0 && gt == 0) finish_row_w(a, dn, i, bad, w_t, lse, p0.w, WZ, NULL, NULL);
                }
                c = a.reduction != FL_REDUCTION_NONE ? make_coef_g(a, dn, ga0, gb0, t, bad, w_t, lse)
                                                     : make_coef_v(a, dn, G, t, bad, w_t, lse);
            }
            int q = gt;  // this thread's next vector in chunk coordinates, carried across slots
            for (int j = 0; j < nsub; j++, rp.next(R)) {
                const int lo = j * sub;
                const int hi = ch.n - lo < sub ? ch.n - lo : sub;  // vectors in this slot
                const int end = lo + hi, v0 = ch.lo;
                if (ignored) {
                    Pack<T> zero;
#pragma unroll
                    for (int v = 0; v < Pack<T>::VEC; v++) zero.v[v] = from_float<T>(0.0f);
                    for (; q < end; q += n) store_vec<T, PST>(zero, drow, g.vec_elem(v0 + q));
                } else if (hi > 0) {
                    // already complete (the statistics group waited on it; it cannot refill before
                    // this warp's release): the acquire makes the bulk copy's bytes visible here
                    mbar_wait(&full[rp.s], rp.ph);
                    const uint4* buf = pipe_buf + (size_t)rp.s * sub - lo;  // buf[q], q in [lo, end)
#pragma unroll 4
                    for (; q < end; q += n) {
                        const int e0 = g.vec_elem(v0 + q);
                        store_vec<T, PST>(vec_grad<F>(a, c, lds_pack<T>(buf + q), e0), drow, e0);
                    }
                }
                if constexpr (NB) {
                    nbar_release(rp.s, (ngw + 1) * 32);
                } else {
                    __syncwarp();  // why: the warp's reads of slot s are done before its release
                    if (lane == 0) mbar_arrive(&empty[rp.s]);
                }
            }
            if (has_x) drow[ex] = from_float<T>(ignored ? 0.0f : grad_elem<F>(a, c, zval<F>(a, xs, ex), ex));
        }
        if constexpr (DN == 2) {
            // the MEAN folded in (FUSEDLOSS_CE_PIPE_DN_FOLD, default since s27): each cluster's rank 0 stores its
            // rows' sums in the stats region (unused by this kernel), the last to take a ticket adds them in
            // cluster order and writes the loss, so no reduce kernel runs. The ticket (workspace byte 64) was
            // zeroed by ce_ticket_kernel, this kernel's PDL primary: griddepcontrol.wait before touching it.
            // Deterministic: a fixed grid adds fixed row sets in a fixed order.
            if (crank == 0 && gt < 32) {
                double* fp = (double*)a.stats;   // [ngrp][2]
                unsigned last = 0u;
                if (gt == 0) {
                    fp[2 * row0] = fa;
                    fp[2 * row0 + 1] = fb;
                    __threadfence();   // why: the sums visible before the ticket that counts them
                    pdl_wait();
                    last = atomicAdd((unsigned*)(a.hdr + 8), 1u) == (unsigned)ngrp - 1u;
                }
                last = __shfl_sync(0xffffffffu, last, 0);
                if (last) {
                    __threadfence();   // why: every other cluster's sums (fenced before its ticket) seen
                    double sa = 0.0, sb = 0.0;
                    for (int64_t k = lane; k < ngrp; k += 32) {
                        sa += __ldcg(fp + 2 * k);
                        sb += __ldcg(fp + 2 * k + 1);
                    }
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1) {
                        sa += __shfl_xor_sync(0xffffffffu, sa, o);
                        sb += __shfl_xor_sync(0xffffffffu, sb, o);
                    }
                    if (lane == 0) a.loss[0] = (float)(sa / dn.Dw + (a.zeta > 0.0f ? sb / dn.Dn : 0.0));
                }
            }
        }
    }
    // every partial sent to this CTA has landed (waited above), but its own st.async to the others
    // may still be in flight: no CTA exits before all have passed their last exchange
    if (cs > 1) cg::this_cluster().sync();
#else
    __trap();  // chosen only on sm_90+
#endif
}

// FUSEDLOSS_CE_PIPE_DN_FOLD (default): zeroes the ticket of ce_pipe_kernel<..., DN = 2> (workspace byte 64),
// which is launched right after it with PDL and waits for it only before taking the ticket. One warp: it fits
// beside a pipe CTA on any SM (the one-CTA setup kernel did not).
__global__ void __launch_bounds__(32) ce_ticket_kernel(CeArgs a) {
    pdl_trigger();
    if (threadIdx.x == 0) *(unsigned*)(a.hdr + 8) = 0u;
}

// D_w and D_n of MEAN over the whole batch, summed by one CTA of 1024 threads in a fixed order
// (per-thread striding, shuffle tree, warps in order): the setup and the reduce kernel give the
// same bits. Valid in thread 0. `sh` >= 2 x 32 doubles.
__device__ __forceinline__ void block_denoms(const CeArgs& a, double (*sh)[32], double* Dw, double* Dn) {
    double dw = 0.0, dn = 0.0;
    const float* wg = a.weight ? a.weight - a.col0 : NULL;  // the global class weights
    for (int64_t i = threadIdx.x; i < a.N; i += blockDim.x) {
        int64_t t = load_target(a, i);
        if (t == a.ignore_index) continue;
        dn += 1.0;
        dw += (wg && t >= 0 && t < a.Vg) ? (double)wg[t] : 1.0;  // bad targets weigh 1
    }
    for (int o = 16; o > 0; o >>= 1) {
        dw += __shfl_xor_sync(0xffffffffu, dw, o);
        dn += __shfl_xor_sync(0xffffffffu, dn, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sh[0][warp] = dw; sh[1][warp] = dn; }
    __syncthreads();  // why: warp partials visible to thread 0
    double s0 = 0, s1 = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) { s0 += sh[0][w]; s1 += sh[1][w]; }
    *Dw = s0;
    *Dn = s1;
}

// One CTA: D_w, D_n (MEAN) and W = sum of class weights, into the workspace header (double).
// Fixed per-thread striding + fixed-order tree: deterministic.
__global__ void __launch_bounds__(1024) ce_setup_kernel(CeArgs a) {
    pdl_trigger();  // the fused kernel's statistics need nothing from here (its gradient waits)
    __shared__ double sh[3][32];
    double Dw, Dn;
    block_denoms(a, sh, &Dw, &Dn);
    double W = 0.0;
    if (a.weight)  // over the whole vocabulary (a vocab-parallel shard's weight is offset by col0)
        for (int64_t j = threadIdx.x; j < a.Vg; j += blockDim.x) W += (double)a.weight[j - a.col0];
    for (int o = 16; o > 0; o >>= 1) W += __shfl_xor_sync(0xffffffffu, W, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // why: sh is reused
    if (lane == 0) sh[2][warp] = W;
    __syncthreads();  // why: warp partials visible to thread 0
    if (threadIdx.x == 0) {
        double s2 = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s2 += sh[2][w];
        a.hdr[0] = Dw; a.hdr[1] = Dn; a.hdr[2] = s2;
    }
}

// One CTA: loss[0] from the per-row partials (SUM / MEAN). MEAN: hdr holds D_w, D_n (setup
// kernel), or, with `denoms` (a forward that needed no setup), this kernel sums them itself: one
// launch fewer per forward call.
__global__ void __launch_bounds__(1024) ce_reduce_kernel(CeArgs a, int denoms) {
    pdl_wait();  // launched with PDL: the main kernel's partials (and any earlier write) visible
    __shared__ double sh[2][32];
    double Dw = 0.0, Dn = 0.0;
    if (denoms) {
        block_denoms(a, sh, &Dw, &Dn);
        __syncthreads();  // why: sh is reused below
    }
    double sa = 0.0, sb = 0.0;
    for (int64_t i = threadIdx.x; i < a.N; i += blockDim.x) {
        sa += (double)a.part[2 * i];
        sb += (double)a.part[2 * i + 1];
    }
    for (int o = 16; o > 0; o >>= 1) {
        sa += __shfl_xor_sync(0xffffffffu, sa, o);
        sb += __shfl_xor_sync(0xffffffffu, sb, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sh[0][warp] = sa; sh[1][warp] = sb; }
    __syncthreads();  // why: warp partials visible to thread 0
    if (threadIdx.x == 0) {
        double A = 0, B = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) { A += sh[0][w]; B += sh[1][w]; }
        double total;
        if (!denoms) { Dw = a.hdr[0]; Dn = a.hdr[1]; }
        if (a.reduction == FL_REDUCTION_MEAN)
            total = A / Dw + (a.zeta > 0.0f ? B / Dn : 0.0);
        else
            total = A + B;
        a.loss[0] = (float)total;
    }
}

// Two stages for big batches (N >= CE_TWO_STAGE_ROWS): the one-CTA setup and reduce kernels above
// read 8-16 bytes per row from one SM (H200 run 36: with 2M rows of 19 classes they, not the row
// kernel, made the fused call 27x its floor). Stage 1: CTA b of nb sums fixed ranges (rows [b R,
// (b+1) R), classes [b Q, (b+1) Q)) with the block's fixed-order tree into scratch (doubles, the
// workspace's stats region: free before the main kernels and after them); stage 2: one thread adds
// the nb partials in order. Deterministic; not bitwise the one-CTA sums, so a call takes one path
// for both its setup and its reduce (the reduce never sums denominators itself here).
#define CE_TWO_STAGE_ROWS 4096
#define CE_STAGE_CTAS 128
// the linear CE sizes the statistics region for one chunk of rows, never below this scratch
static_assert(3 * CE_STAGE_CTAS * sizeof(double) <= FL__CE_STAGE_SCRATCH, "stage scratch");

// Fixed-order CTA sum of two doubles (per-thread values): shuffle tree, warps in order. Thread 0.
__device__ __forceinline__ void block_sum2(double& x, double& y, double (*sh)[32]) {
    for (int o = 16; o > 0; o >>= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
        y += __shfl_xor_sync(0xffffffffu, y, o);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // why: sh may be in use by a previous call
    if (lane == 0) { sh[0][warp] = x; sh[1][warp] = y; }
    __syncthreads();  // why: warp partials visible to thread 0
    if (threadIdx.x == 0) {
        double s0 = 0, s1 = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) { s0 += sh[0][w]; s1 += sh[1][w]; }
        x = s0;
        y = s1;
    }
}

__global__ void __launch_bounds__(1024) ce_setup_part_kernel(CeArgs a, double* scratch, int64_t R, int64_t Q) {
    pdl_trigger();  // FUSEDLOSS_CE_PDL_CHAIN: the final stage may launch now (it waits for this grid)
    __shared__ double sh[2][32];
    const float* wg = a.weight ? a.weight - a.col0 : NULL;  // the global class weights
    const int64_t r0 = (int64_t)blockIdx.x * R, r1 = r0 + R < a.N ? r0 + R : a.N;
    double dw = 0.0, dn = 0.0;
    for (int64_t i = r0 + threadIdx.x; i < r1; i += blockDim.x) {
        const int64_t t = load_target(a, i);
        if (t == a.ignore_index) continue;
        dn += 1.0;
        dw += (wg && t >= 0 && t < a.Vg) ? (double)wg[t] : 1.0;  // bad targets weigh 1
    }
    block_sum2(dw, dn, sh);
    double W = 0.0, unused = 0.0;
    if (wg) {
        const int64_t j0 = (int64_t)blockIdx.x * Q, j1 = j0 + Q < a.Vg ? j0 + Q : a.Vg;
        for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) W += (double)wg[j];
    }
    block_sum2(W, unused, sh);
    if (threadIdx.x == 0) {
        scratch[3 * blockIdx.x] = dw;
        scratch[3 * blockIdx.x + 1] = dn;
        scratch[3 * blockIdx.x + 2] = W;
    }
}

__global__ void __launch_bounds__(32) ce_setup_final_kernel(CeArgs a, const double* scratch, int nb) {
    pdl_trigger();  // as in ce_setup_kernel
    pdl_wait();     // launched with PDL (FUSEDLOSS_CE_PDL_CHAIN): stage 1's partials visible; else a no-op
    if (threadIdx.x != 0) return;
    double dw = 0.0, dn = 0.0, W = 0.0;
    for (int b = 0; b < nb; b++) { dw += scratch[3 * b]; dn += scratch[3 * b + 1]; W += scratch[3 * b + 2]; }
    a.hdr[0] = dw; a.hdr[1] = dn; a.hdr[2] = W;
}

__global__ void __launch_bounds__(1024) ce_reduce_part_kernel(CeArgs a, double* scratch, int64_t R) {
    pdl_wait();     // as in ce_reduce_kernel
    pdl_trigger();  // FUSEDLOSS_CE_PDL_CHAIN: the final stage may launch now (it waits for this grid)
    __shared__ double sh[2][32];
    const int64_t r0 = (int64_t)blockIdx.x * R, r1 = r0 + R < a.N ? r0 + R : a.N;
    double sa = 0.0, sb = 0.0;
    for (int64_t i = r0 + threadIdx.x; i < r1; i += blockDim.x) {
        sa += (double)a.part[2 * i];
        sb += (double)a.part[2 * i + 1];
    }
    block_sum2(sa, sb, sh);
    if (threadIdx.x == 0) { scratch[2 * blockIdx.x] = sa; scratch[2 * blockIdx.x + 1] = sb; }
}

__global__ void __launch_bounds__(32) ce_reduce_final_kernel(CeArgs a, const double* scratch, int nb) {
    pdl_wait();  // launched with PDL (FUSEDLOSS_CE_PDL_CHAIN): stage 1's partials visible; else a no-op
    if (threadIdx.x != 0) return;
    double A = 0.0, B = 0.0;
    for (int b = 0; b < nb; b++) { A += scratch[2 * b]; B += scratch[2 * b + 1]; }
    double total;
    if (a.reduction == FL_REDUCTION_MEAN)
        total = A / a.hdr[0] + (a.zeta > 0.0f ? B / a.hdr[1] : 0.0);
    else
        total = A + B;
    a.loss[0] = (float)total;
}

// A/B knobs of the setup / reduce launches (session 15, no GPU: not yet measured; read once):
//   FUSEDLOSS_CE_TWO_STAGE_ROWS  the batch size from which the two-stage kernels serve (default
//       4096). A fused MEAN call of 8192 rows (the flagship 8192x128256) runs five launches with
//       them (setup_part, setup_final, main, reduce_part, reduce_final), three with the one-CTA ones.
//   FUSEDLOSS_CE_PDL_CHAIN=1     (sm_90) the two stages chained by programmatic dependent launch:
//       stage 1 lets stage 2 launch at once and stage 2 waits for it in the kernel, so neither the
//       setup's second launch nor the reduce's last one is a gap in which HBM idles (the main
//       kernel already starts during the setup's last kernel and the reduce during its tail).
// Both host-only (read once with the other knobs); the griddepcontrol instructions in the stage
// kernels are no-ops when a kernel is launched without the PDL attribute (the default).
struct Knobs { int chunk_threads, small_rows, small_opt, stream, stream_kb, on, fwd, bwd, kb, nsub, threads, grid, debug, group_rows, xasync;
               int pipe, pipe_kb, pipe_threads, pipe_nbuf, pipe_stats, pipe_sub, pipe_slack, pipe_maxcs, pipe_cs, pipe_ring, pdl,
               plain_st, two_stage_rows, pdl_chain, pipe_nbar, pipe_tmap, pipe_dn, pipe_dn_rows, pipe_dn_fold;
               int off_pipe, off_kb, off_fwd; };

static int env_int(const char* name, int def) {
    const char* e = getenv(name);
    return (e && *e) ? atoi(e) : def;
}

static const Knobs* knobs(void) {
    static Knobs k;
    static int have = 0;
    if (!__atomic_load_n(&have, __ATOMIC_ACQUIRE)) {
        Knobs n;
        n.chunk_threads = env_int("FUSEDLOSS_CE_CHUNK_THREADS", 0);
        n.small_rows = env_int("FUSEDLOSS_CE_SMALL_MAX_ROWS", 128);
        n.small_opt = env_int("FUSEDLOSS_CE_SMALL_OPT", 15) & 15;
        n.stream = env_int("FUSEDLOSS_CE_STREAM", 1);
        n.stream_kb = env_int("FUSEDLOSS_CE_STREAM_KB", 256);
        n.on = env_int("FUSEDLOSS_CE_TMA", 1);
        n.xasync = env_int("FUSEDLOSS_CE_TMA_XCH", 1) != 0;
        n.fwd = env_int("FUSEDLOSS_CE_TMA_FWD", 0);
        n.bwd = env_int("FUSEDLOSS_CE_TMA_BWD", 0);
        n.kb = env_int("FUSEDLOSS_CE_TMA_KB", 100);
        n.nsub = env_int("FUSEDLOSS_CE_TMA_NSUB", 2);
        n.threads = env_int("FUSEDLOSS_CE_TMA_THREADS", 256);
        n.grid = env_int("FUSEDLOSS_CE_TMA_GRID", 0);
        n.debug = env_int("FUSEDLOSS_DEBUG", 0);
        n.group_rows = env_int("FUSEDLOSS_CE_GROUP_ROWS", 512);
        n.pipe = env_int("FUSEDLOSS_CE_PIPE", 1);
        n.pipe_kb = env_int("FUSEDLOSS_CE_PIPE_KB", 72);
        n.pipe_threads = env_int("FUSEDLOSS_CE_PIPE_THREADS", 0);  // 0: per variant (pipe_threads_for)
        n.pipe_sub = env_int("FUSEDLOSS_CE_PIPE_SUB", -1);      // -1: per variant and cluster (pipe_plan)
        n.pipe_slack = env_int("FUSEDLOSS_CE_PIPE_SLACK", -1);  // -1: per variant (pipe_plan)
        n.pipe_maxcs = env_int("FUSEDLOSS_CE_PIPE_MAXCS", 0);   // 0: per variant (pipe_plan)
        n.pipe_cs = env_int("FUSEDLOSS_CE_PIPE_CS", 0);
        n.pipe_ring = env_int("FUSEDLOSS_CE_PIPE_RING", 220);
        n.pdl = env_int("FUSEDLOSS_CE_PDL", 1) != 0;
        n.plain_st = env_int("FUSEDLOSS_CE_PLAIN_ST", 1) != 0;
        n.two_stage_rows = env_int("FUSEDLOSS_CE_TWO_STAGE_ROWS", CE_TWO_STAGE_ROWS);  // launch_setup
        if (n.two_stage_rows < 1) n.two_stage_rows = CE_TWO_STAGE_ROWS;
        n.pdl_chain = env_int("FUSEDLOSS_CE_PDL_CHAIN", 0) != 0;
        n.pipe_nbar = env_int("FUSEDLOSS_CE_PIPE_NBAR", 0) != 0;  // ce_pipe_kernel's NB
        // ce_pipe_kernel's TM, by default since s21 (H100 run 1: racecheck-clean refills, the same speed);
        // _NBAR=1 takes the raw copies (NB and TM are not combined)
        n.pipe_tmap = !n.pipe_nbar && env_int("FUSEDLOSS_CE_PIPE_TMAP", 1) != 0;
        // ce_pipe_kernel's DN (s26; default since s27): an unweighted fused MEAN of <= _DN_ROWS rows counts its
        // denominators in every CTA instead of after a setup kernel (see ce_pipe_kernel), and with _DN_FOLD
        // (s27, default) also reduces the loss (no reduce kernel). H200 s27 run 1, fused x floor, two
        // alternations, off / DN / DN + FOLD: 2048x32000 f16 1.34 / 1.32 / 1.30-1.31, 4096x50257 f32 1.20 /
        // 1.19 / 1.18, 8192x128256 bf16 1.10 / 1.10 / 1.08
        n.pipe_dn = env_int("FUSEDLOSS_CE_PIPE_DN", 1) != 0;
        n.pipe_dn_rows = env_int("FUSEDLOSS_CE_PIPE_DN_ROWS", 16384);
        n.pipe_dn_fold = env_int("FUSEDLOSS_CE_PIPE_DN_FOLD", 1) != 0;
        if (n.pipe_sub < -1 || n.pipe_sub > 64) n.pipe_sub = -1;
        if (n.pipe_slack < -1 || n.pipe_slack > 200) n.pipe_slack = -1;
        if (n.pipe_maxcs < 0 || n.pipe_maxcs > TMA_MAX_CLUSTER) n.pipe_maxcs = 0;
        if (n.pipe_cs < 0 || n.pipe_cs > TMA_MAX_CLUSTER) n.pipe_cs = 0;
        if (n.pipe_ring < 16 || n.pipe_ring > 224) n.pipe_ring = 220;
        n.pipe_nbuf = env_int("FUSEDLOSS_CE_PIPE_NBUF", 3);
        if (n.pipe_kb < 4 || n.pipe_kb > 112) n.pipe_kb = 72;
        if (n.pipe_threads < 128 || n.pipe_threads > PIPE_MAX_THREADS_F0 || n.pipe_threads % 32) n.pipe_threads = 0;
        if (n.pipe_nbuf < 2 || n.pipe_nbuf > 4) n.pipe_nbuf = 3;
        n.pipe_stats = env_int("FUSEDLOSS_CE_PIPE_STATS", 0);  // 0: 3/8 of the CTA (pipe_threads_for)
        if (n.pipe_stats < 32 || n.pipe_stats % 32) n.pipe_stats = 0;
        // a fused call or a forward with a logit offset (s30, the forward since s31; _OFF_FWD=0: the forward on the
        // streaming kernel): the staged kernel, chunks of <= _OFF_KB, instead of the ring (the streaming kernel);
        // _OFF_PIPE=1: both as before. See ce_launch
        n.off_pipe = env_int("FUSEDLOSS_CE_OFF_PIPE", 0) != 0;
        n.off_kb = env_int("FUSEDLOSS_CE_OFF_KB", 64);
        n.off_fwd = env_int("FUSEDLOSS_CE_OFF_FWD", 1) != 0;   // the forward too (s31: tested, default)
        if (n.off_kb < 1 || n.off_kb > 200) n.off_kb = 64;
        const int ct = n.chunk_threads;
        if (ct != 64 && ct != 128 && ct != 256 && ct != 512) n.chunk_threads = 0;
        if (n.small_rows < 0) n.small_rows = 0;
        if (n.small_rows > SMALL_MAX_ROWS) n.small_rows = SMALL_MAX_ROWS;
        if (n.stream_kb < 8 || n.stream_kb > 1024) n.stream_kb = 256;
        if (n.kb < 1 || n.kb > 200) n.kb = 100;
        if (n.nsub < 1 || n.nsub > TMA_MAX_SUB) n.nsub = 2;
        if (n.threads != 128 && n.threads != 256) n.threads = 256;
        k = n;  // every thread computes the same values: a racing second store is harmless
        __atomic_store_n(&have, 1, __ATOMIC_RELEASE);
    }
    return &k;
}

static int64_t two_stage_rows(void) { return knobs()->two_stage_rows; }
static int pdl_chain(void) { return knobs()->pdl_chain; }

static int stage_ctas(int64_t N) {
    const int64_t nb = (N + 4095) / 4096;
    return (int)(nb < 1 ? 1 : nb > CE_STAGE_CTAS ? CE_STAGE_CTAS : nb);
}

// The setup (MEAN denominators, W) of a.N rows: one CTA, or two stages for big batches. pdl
// (sm_90, with FUSEDLOSS_CE_PDL_CHAIN): the second stage launched during the first.
static cudaError_t launch_setup(const CeArgs& a, int pdl, cudaStream_t s) {
    if (a.N < two_stage_rows()) {
        ce_setup_kernel<<<1, 1024, 0, s>>>(a);
        return cudaGetLastError();
    }
    const int nb = stage_ctas(a.N);
    const int64_t R = (a.N + nb - 1) / nb, Q = (a.Vg + nb - 1) / nb;
    double* scratch = (double*)a.stats;
    ce_setup_part_kernel<<<nb, 1024, 0, s>>>(a, scratch, R, Q);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    cfg.gridDim = dim3(1, 1, 1);
    cfg.blockDim = dim3(32, 1, 1);
    cfg.stream = s;
    if (pdl && pdl_chain()) {
        set_pdl(&attr);
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, ce_setup_final_kernel, a, (const double*)scratch, nb);
}

// Does a reduced call of N rows need the setup for its reduce alone (MEAN, big batch)?
static int setup_for_reduce(int64_t N, int mean) { return mean && N >= two_stage_rows(); }

// loss[0] from a.N rows' partials. denoms: the one-CTA kernel sums the MEAN denominators itself
// (only below CE_TWO_STAGE_ROWS; above, the caller ran launch_setup: setup_for_reduce).
// pdl (sm_90): the first kernel may start while the previous one drains (it waits in pdl_wait
// before any memory access, so whatever ran before is safe); the launch gap of a call's last
// kernel is hidden behind the main kernel's tail.
static cudaError_t launch_reduce(const CeArgs& a, int denoms, int pdl, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    cfg.blockDim = dim3(1024, 1, 1);
    cfg.stream = s;
    if (pdl) {
        set_pdl(&attr);
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
    }
    if (a.N < two_stage_rows()) {
        cfg.gridDim = dim3(1, 1, 1);
        return cudaLaunchKernelEx(&cfg, ce_reduce_kernel, a, denoms);
    }
    const int nb = stage_ctas(a.N);
    const int64_t R = (a.N + nb - 1) / nb;
    double* scratch = (double*)a.stats;
    cfg.gridDim = dim3((unsigned)nb, 1, 1);
    cudaError_t e = cudaLaunchKernelEx(&cfg, ce_reduce_part_kernel, a, scratch, R);
    if (e != cudaSuccess) return e;
    if (!(pdl && pdl_chain())) {
        ce_reduce_final_kernel<<<1, 32, 0, s>>>(a, scratch, nb);
        return cudaGetLastError();
    }
    cfg.gridDim = dim3(1, 1, 1);
    cfg.blockDim = dim3(32, 1, 1);
    return cudaLaunchKernelEx(&cfg, ce_reduce_final_kernel, a, (const double*)scratch, nb);
}

// ---- vocab-parallel steps (header section 8) -------------------------------------------------

// Step 1, after launch_vp_stats: one thread per row merges the row's a.C chunk partials in chunk
// order into the caller's stats[N][4] = (m, s, wz, zt) (s relative to the stored m: the merge is
// in fp32, m is what is stored); ignored rows (-inf, 0, 0, 0); a target outside [0, Vg) raises
// the error flag (its row's stats are computed without a target logit; steps 3 and 4 make its
// loss and gradient NaN).
__global__ void __launch_bounds__(256) vp_stats_kernel(CeArgs a, float* out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.N) return;
    float* o = out + 4 * i;  // the caller's buffer: 4-byte alignment only
    const int64_t t64 = load_target(a, i);
    if (t64 == a.ignore_index) {
        o[0] = -INFINITY; o[1] = 0.0f; o[2] = 0.0f; o[3] = 0.0f;
        return;
    }
    if ((t64 < 0 || t64 >= a.Vg) && a.error_flag) *a.error_flag = 1;
    const float4* st = a.stats + i * a.C;
    const float4 p0 = st[0];
    float m = p0.x, sm = p0.y, wz = p0.z, zt = p0.w;
    for (int c = 1; c < a.C; c++) {
        const float4 pc = st[c];
        ms_merge(m, sm, pc.x, pc.y);
        wz += pc.z;
        zt += pc.w;  // 0 except in the target's chunk
    }
    if (m == -INFINITY) sm = 0.0f;  // an all -inf shard carries no mass
    o[0] = m; o[1] = sm; o[2] = wz; o[3] = zt;
}

// Step 3: one thread per row merges the k ranks' stats in rank order (the CPU backend's formula:
// M = max m_r, S = sum s_r 2^((m_r - M) log2 e) with the factor 1 where m_r == M, wz and zt
// summed), then finishes the row as the forward does (a is the GLOBAL problem: V = Vg, col0 = 0).
// Every rank runs the same instructions on the same gathered bits: the same results everywhere.
__global__ void __launch_bounds__(256) vp_combine_kernel(CeArgs a, const float* g, int k) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.N) return;
    const int64_t t64 = load_target(a, i);
    if (t64 == a.ignore_index) { ignored_row_outputs(a, i, PASS_FORWARD); return; }
    const bool bad = t64 < 0 || t64 >= a.V;
    if (bad && a.error_flag) *a.error_flag = 1;
    float M = -INFINITY;
    for (int r = 0; r < k; r++) {
        const float m_r = g[4 * ((size_t)r * (size_t)a.N + (size_t)i)];
        if (m_r > M) M = m_r;  // NaN maxima skipped, as the CPU backend's merge
    }
    float S = 0.0f, wz = 0.0f, zt = 0.0f;
    for (int r = 0; r < k; r++) {
        const float* q = g + 4 * ((size_t)r * (size_t)a.N + (size_t)i);
        S += q[1] * (q[0] == M ? 1.0f : fexp2((q[0] - M) * FL_LOG2E));
        wz += q[2];
        zt += q[3];
    }
    const float lse = (M == -INFINITY) ? -INFINITY : M + logf(S);
    finish_row(a, load_denoms(a), i, bad ? -1 : (int)t64, bad, lse, zt, wz, NULL, NULL);
}

// ---------------------------------------------------------------------------------------------
// launchers

struct Config { int T, K, C; int tma; int sms; int tcs, tper, tns, tT; size_t tsmem; int stream, sC, scv;
                int pipe, pcs, pper, psub, pR, pT, pTs; size_t psmem; int pdl; int dnf; };

// Knobs for A/B runs on the GPU, read from the environment once (all experimental):
//   FUSEDLOSS_CE_CHUNK_THREADS = 64|128|256|512   chunk CTA size of the two-pass path (below)
//   FUSEDLOSS_CE_SMALL_MAX_ROWS                    rows up to which the small kernel runs
//   FUSEDLOSS_CE_SMALL_OPT = 0..15                 small kernel bits (default 15): 1 first row
//                                                  loaded early, 2 st.async loss sums, 4
//                                                  programmatic dependent launch, 8 max-first row
//                                                  statistics (s5 run 3, after the upstream
//                                                  gradient was hoisted out of the rows: 7 / 15 =
//                                                  5.87-5.88 / 5.63-5.64 us, 13x2000 bf16 6.47 /
//                                                  6.19-6.20) (ce_small_kernel;
//                                                  H200 2026-12-02 s4 run 2, 128x1000 f32 fused
//                                                  per call in a graph: 0: 6.78 / 6.79 us, 4: 6.48
//                                                  / 6.48, 7: 6.36 / 6.36)
//   FUSEDLOSS_CE_STREAM=0|1|2                      streaming kernel off / forward (default) /
//                                                  forward and backward (chunk kernels otherwise)
//   FUSEDLOSS_CE_STREAM_KB                         bytes per streaming unit (KB, 8..1024; 256:
//                                                  H200 2026-12-01, forward 8192x128256 bf16
//                                                  0.96x the copy floor vs 1.01x at 64, 1.17x at 32)
//   FUSEDLOSS_CE_TMA=0                             sm_90 staged one-read kernel off
//   FUSEDLOSS_CE_TMA_FWD=1, _BWD=1                 staged kernel for forward / backward too
//   FUSEDLOSS_CE_TMA_KB                            shared-memory chunk per CTA (cluster size follows)
//   FUSEDLOSS_CE_TMA_NSUB = 1..8                   sub-chunks (recycled one by one) per CTA chunk
//                                                  (2: H200 2026-12-01, fused 8192x128256 bf16
//                                                  1.35x vs 1.37x at 1, 1.39x at 4, 1.44x at 8)
//   FUSEDLOSS_CE_TMA_THREADS = 128|256, _GRID      CTA size (<= 80 registers at 256: 3 CTAs per SM
//                                                  fit); cap on resident clusters / CTAs
//   FUSEDLOSS_CE_GROUP_ROWS                        rows from which one-warp rows run as row groups
//                                                  (several rows per warp; 0 = never; default 512)
//   FUSEDLOSS_CE_TMA_XCH=0|1                       staged kernel's per-row partial exchange: 1 = st.async
//                                                  + mbarrier (default; no MEMBAR.ALL.GPU per row: H200
//                                                  2026-12-02 run 7, fused 8192x128256 bf16 1.32x -> 1.23x),
//                                                  0 = DSMEM stores + a cluster barrier per row
//   FUSEDLOSS_CE_PIPE=0|1|2                        fused: the warp-specialised kernel (ce_pipe_kernel)
//                                                  off / where rows fit 1-2 CTAs (default) / always
//   FUSEDLOSS_CE_PIPE_SUB, _SLACK, _CS, _RING      its ring: slot size cap (KB; default per variant and
//                                                  cluster, see pipe_plan; 0 = whole chunks as ring slots,
//                                                  the s6 plan, by _KB and _NBUF, everywhere), the least
//                                                  free ring space beside a row's chunk (KB; default per
//                                                  variant), the cluster size (0 = the smallest that
//                                                  fits), ring bytes (KB, 220)
//   FUSEDLOSS_CE_OFF_PIPE=0|1, FUSEDLOSS_CE_OFF_KB     fused and (_OFF_FWD=1, default) forward with a logit offset:
//                                                  the plans of other calls (1: the ring / the streaming kernel)
//                                                  or the staged kernel in chunks of <= _OFF_KB (default 0, 64 KB)
//   FUSEDLOSS_CE_PIPE_TMAP=0|1                     its producer's copies as raw bulk copies / tensor-map
//                                                  (descriptor) TMA loads (default 1 since s21: racecheck
//                                                  sees no thread write a slot; cluster.cuh, FlTmaps)
//   FUSEDLOSS_CE_PIPE_MAXCS                        widest cluster the default plan gives the ring
//                                                  (default: 4 for 16-bit logits without options, else 2)
//   FUSEDLOSS_CE_PIPE_KB, _NBUF                    whole-chunk mode: chunk cap (KB), chunks per CTA (2..4)
//   FUSEDLOSS_CE_PIPE_THREADS, _STATS              CTA size (128..544, ..800 without options: statistics
//                                                  + 1 producer warp + gradient; default 672 without
//                                                  options, 544 with), statistics threads (default
//                                                  3/8 of the rest: 256 of 672, 192 of 544)
//   FUSEDLOSS_CE_PDL=0|1                           programmatic dependent launch of the fused kernel after
//                                                  the setup and of the reduce after the main kernel (sm_90;
//                                                  default 1)
//   FUSEDLOSS_CE_PLAIN_ST=0|1                      default-cached gradient stores in the pipelined kernel's
//                                                  ring mode and the staged kernel's fused pass (default 1;
//                                                  0: st.global.cs everywhere, as before; see store_vec)
//   FUSEDLOSS_DEBUG=1                              print each new staged launch plan to stderr
// Rows of up to 512 16-byte vectors: one CTA, as few threads as cover the row with 2 vectors
// each. Longer rows: chunks of 256 threads x 8 vectors (32 KB in flight per CTA, ~107 registers:
// two CTAs per SM), C = fl__ce_chunks() of them per row.
// Threads per chunk CTA for long rows, by pass. Measured on the H200 (run 3, 2026-11-30,
// bench/results/2026-11-30-h200-run3-*), ratio to the copy floor at 8192x128256 bf16 for
// T = 256 / 128 / 64 / 512:
//   fused    2.55 / 2.63 / 2.94 / 2.72   (more chunks = a longer serial merge of partials per CTA)
//   forward  2.00 / 1.78 / 1.69 / 2.53   (read only: small CTAs keep more loads in flight per SM)
//   backward 1.24 / 1.21 / 1.18 / 1.28
// FUSEDLOSS_CE_CHUNK_THREADS overrides every pass, for A/B runs.
static int chunk_threads(int pass) {
    if (knobs()->chunk_threads) return knobs()->chunk_threads;
    return pass == PASS_FUSED ? 256 : 64;
}

static Config choose_config(int64_t V, int esize, int pass) {
    Config c = {};
    const int64_t nv = V / (16 / esize) + 1;  // aligned vectors per row, any alignment (upper bound)
    c.C = 1;
    if (nv <= 512) {
        int64_t T = (nv + 1) / 2;
        c.T = (int)((T + 31) / 32 * 32);
        if (c.T < 32) c.T = 32;
        c.K = 2;
    } else {
        c.T = chunk_threads(pass);
        c.K = 8;
        c.C = (int)((nv + (int64_t)c.T * 8 - 1) / ((int64_t)c.T * 8));  // <= fl__ce_chunks(V) (sized for T = 64)
    }
    return c;
}

static cudaError_t tma_occupancy(const void* fn, int cs, int T, size_t smem, int sms, int* out) {
    return fl__cluster_occupancy(fn, cs, T, smem, sms, knobs()->debug, "staged CE kernel", out);
}

struct TmaPlan { int cs, per, ns, T; size_t smem; };

// Whether (and how) the staged one-read kernel takes this call: sm_90, rows longer than one
// register-resident CTA (> 512 vectors), a row split over <= 16 CTAs of <= kb KB each.
// off: a call with a logit offset (ce_launch), whose forward takes the staged kernel too
static int tma_plan(int pass, int cc_major, int64_t N, int64_t V, int esize, int sms, int kb, int off, TmaPlan* p) {
    const Knobs* k = knobs();
    if (cc_major < 9 || !k->on) return 0;
    if (pass == PASS_BACKWARD && !k->bwd) return 0;
    if (pass == PASS_FORWARD && !k->fwd && !off) return 0;
    const int64_t nv = V / (16 / esize) + 1;  // upper bound of a row's aligned vectors
    if (nv <= 512) return 0;
    const int64_t chunk = (int64_t)kb * 1024 / 16;
    int cs = 1;
    while ((int64_t)cs * chunk < nv && cs < TMA_MAX_CLUSTER) cs *= 2;
    if ((int64_t)cs * chunk < nv) return 0;
    // Splitting rows over more CTAs to balance few rows per cluster lost badly (H200 2026-12-01:
    // 2048x32000 f16 fused 1.57x -> 2.65x with 4 CTAs of 16 KB per row instead of 1 of 64 KB):
    // the per-row costs (reduction, exchange, barriers) outweigh the idle last round.
    (void)N; (void)sms;
    p->cs = cs;
    p->per = (int)((nv + cs - 1) / cs);
    p->ns = k->nsub;
    p->T = k->threads;
    p->smem = (size_t)p->per * 16;
    return 1;
}

// Launches the staged kernel; *done = 0 (nothing launched) when the configuration cannot be
// resident on this device.
template <typename T, int PASS, int F, bool PST>
static cudaError_t launch_tma_st(const CeArgs& a, const TmaPlan& p, int sms, cudaStream_t s, int* done) {
    *done = 0;
    const void* fn = (const void*)ce_tma_kernel<T, PASS, F, PST>;
    const int clustered = PASS != PASS_BACKWARD;
    int n = 0;
    cudaError_t e = tma_occupancy(fn, clustered ? p.cs : 0, p.T, p.smem, sms, &n);
    if (e != cudaSuccess || n <= 0) return e;
    if (knobs()->grid > 0 && knobs()->grid < n) n = knobs()->grid;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    if (clustered) {
        const int64_t G = a.N < n ? a.N : n;  // clusters: one per row up to what is resident
        cfg.gridDim = dim3((unsigned)(G * p.cs), 1, 1);
        set_cluster(&cfg, &attr, (unsigned)p.cs);
    } else {
        const int64_t units = a.N * p.cs;
        cfg.gridDim = dim3((unsigned)(units < n ? units : n), 1, 1);
    }
    cfg.blockDim = dim3((unsigned)p.T, 1, 1);
    cfg.dynamicSmemBytes = p.smem;
    cfg.stream = s;
    e = cudaLaunchKernelEx(&cfg, ce_tma_kernel<T, PASS, F, PST>, a, p.cs, p.per, p.ns, knobs()->xasync);
    if (e == cudaSuccess) *done = 1;
    return e;
}
// the fused pass: default-cached gradient stores (see store_vec)
template <typename T, int PASS, int F>
static cudaError_t launch_tma(const CeArgs& a, const TmaPlan& p, int sms, cudaStream_t s, int* done) {
    if constexpr (PASS == PASS_FUSED) {
        if (knobs()->plain_st) return launch_tma_st<T, PASS, F, true>(a, p, sms, s, done);
    }
    return launch_tma_st<T, PASS, F, false>(a, p, sms, s, done);
}

// The warp-specialised kernel's plan (fused, sm_90, rows of > 512 vectors), by measurement (H200
// 2026-12-03 s7 run 3, fused x floor; ring with 32 KB / 16 KB slots, whole chunks, staged kernel):
//   16384x32000 bf16 (64 KB rows)  1.23 / 1.34 / 1.18 / 1.26    2048x32000 f16  1.52 / 1.63 / 1.47 / 1.57
//   8192x50257 bf16 (100 KB, cs 1) 1.21 / 1.38 / 1.41 (cs 2) / 1.31    4096x65536 bf16  1.24 / 1.32 / 1.26 / 1.27
//   8192x128256 bf16 (cs 2)        1.17 / 1.25 / - / 1.23       4096x50257 f32 (cs 2)  1.23 / 1.24 / 1.23 / 1.25
//   4096x256000 bf16 (cs 3)        1.36 / 1.40 / - / 1.26
// Then every slot cost a max -> sum turn of the statistics sweep and a release, so the fewer slots
// the better as long as the row fits with slack (s8 made the sweep one pass: see the table below).
// Default (knob 1): a row that fits ONE CTA in 3 whole chunks of <= pipe_kb (72) KB takes whole-chunk
// slots (nbuf = 3); else the ring, on the smallest cluster that leaves the slack free, with the slot
// cap, slack and widest cluster of the variant (below); else the staged kernel. Knob 2: the ring on
// any cluster size (pipe_cs forces one). pipe_sub = 0: whole chunks
// everywhere, the s6 plan (nbuf 3 x <= 72 KB on <= 2 CTAs, else 2 x <= 100 KB). R <= PIPE_MAX_SLOTS,
// and few enough rows in flight for the xslot reuse rule at ce_pipe_kernel.
static int pipe_cs(int64_t nv, int kb) {
    const int64_t chunk = (int64_t)kb * 1024 / 16;
    const int64_t need = (nv + chunk - 1) / chunk;  // any cluster size (not only powers of two)
    return need > TMA_MAX_CLUSTER ? 0 : (int)need;
}

//
// The ring's defaults since 2026-12-04 (s13 run 2, after s8's one-pass statistics had made slots
// cheaper; fused x floor at slot caps 12 / 16 / 20 / 24 / 32 KB, the option-free variant):
//   8192x128256 bf16 (cs 2)  1.17 / 1.11 / 1.11 / 1.11 / 1.14 (3 alternations, identical)
//   8192x151936 bf16 (cs 2)  1.20 / 1.12 / 1.12 / 1.15 / 1.13   4096x128256 bf16  1.20 / 1.13 / 1.13 / 1.14 / 1.17
//   2048x128256 bf16 (cs 2)  1.24 / 1.16 / 1.16 / 1.16 / 1.18   4096x50257 f32    1.20 / 1.22 / 1.21 / 1.21 / 1.20
//   8192x50257 bf16 (cs 1)   1.26 / 1.35 / 1.17 / 1.17 / 1.19   4096x65536 bf16   1.24 / 1.23 / 1.23 / 1.18 / 1.22
//   4096x256000 bf16, the ring at cs 3: 16 / 24 / 32 KB 1.23 / 1.20 / 1.23, at cs 4: 1.19 / 1.17 /
//   **1.16** (the staged kernel, which the old plan gave it: 1.25)
// With label smoothing (F_SMOOTH, 544 threads) small slots lose badly (8192x128256 bf16 16 KB
// 1.61x vs 32 KB 1.44x; 4096x50257 f32 1.25 vs 1.17), so the option variants keep the old plan.
// fp32 rows gain nothing from small slots and lose on a cluster of 3 (s13 run 3, new plan / old:
// 4096x50257 f32 1.21 / 1.20, 4096x100000 f32 (ring cs 3 / staged) 1.19 / 1.16-1.17, 8192x128256
// f32 (ring cs 4 / staged) 1.13-1.14 / 1.15), so they keep it too. Hence for 16-bit logits without
// options: 20 KB slots on clusters of <= 2, 32 KB on 3-4, >= 48 KB of slack, clusters up to 4
// (wider rows to the staged kernel); run 3, the same alternation: 8192x128256 bf16 1.14 -> 1.11,
// 4096x256000 1.24 -> 1.16, 2048x256000 1.26 -> 1.18, 4096x200064 1.22 -> 1.17, 8192x50257 1.19-1.20
// -> 1.17, 8192x151936 1.12 = 1.12, 4096x65536 1.23 = 1.23. Else: 32 KB, 24 KB of slack, clusters <= 2.
static int pipe_plan(int pass, int cc_major, int64_t V, int esize, int flags, Config* c) {
    const Knobs* k = knobs();
    if (cc_major < 9 || !k->on || !k->pipe || pass != PASS_FUSED) return 0;
    const int64_t nv = V / (16 / esize) + 1;
    if (nv <= 512) return 0;
    const int plain = flags == 0 && esize == 2;
    const int slack = k->pipe_slack >= 0 ? k->pipe_slack : plain ? 48 : 24;
    const int maxcs = k->pipe_maxcs ? k->pipe_maxcs : plain ? 4 : 2;
    int cs = 0, per = 0, sub = 0, R = 0;
    if (k->pipe_sub == 0 || (k->pipe == 1 && pipe_cs(nv, k->pipe_kb) == 1)) {
        int nb = k->pipe_nbuf;
        cs = pipe_cs(nv, k->pipe_kb);
        if (k->pipe == 1) {
            if (cs < 1 || cs > 2) {
                cs = pipe_cs(nv, 100);
                nb = 2;
            } else if (nb * k->pipe_kb > 216) {
                nb = 216 / k->pipe_kb;
            }
            if (cs < 1 || cs > 2 || nb < 2) return 0;
        }
        if (cs < 1) return 0;
        per = (int)((nv + cs - 1) / cs);
        sub = per;
        R = nb;
        if (k->pipe_tmap) {  // TM: a whole chunk in slots of whole 128-byte lines
            int64_t sb = sub, ns = 1;
            fl__tmap_round(per, &sb, &ns);
            sub = (int)sb;
        }
    } else {
        const int64_t ring = (int64_t)k->pipe_ring * 64;  // vectors
        const int lo = k->pipe_cs ? k->pipe_cs : 1;
        const int hi = k->pipe_cs ? k->pipe_cs : (k->pipe == 1 ? maxcs : TMA_MAX_CLUSTER);
        for (int cc = lo; cc <= hi && !cs; cc++) {
            const int64_t p = (nv + cc - 1) / cc;
            const int subkb = k->pipe_sub > 0 ? k->pipe_sub : (plain && cc <= 2) ? 20 : 32;
            int64_t ns = (p + subkb * 64 - 1) / (subkb * 64);
            int64_t sb = (p + ns - 1) / ns;
            if (k->pipe_tmap) fl__tmap_round(p, &sb, &ns);  // TM (cluster.cuh)
            int64_t r = ring / sb;
            if (r > PIPE_MAX_SLOTS) r = PIPE_MAX_SLOTS;
            if (k->pipe_nbar && r > NB_MAX_SLOTS) r = NB_MAX_SLOTS;
            if (r > (PIPE_XSLOTS / 2 + 1) * ns - 1) r = (PIPE_XSLOTS / 2 + 1) * ns - 1;
            if (r - ns < 1 || (r - ns) * sb * 16 < (int64_t)slack * 1024) continue;
            cs = cc; per = (int)p; sub = (int)sb; R = (int)r;
        }
        if (!cs) return 0;
    }
    c->pipe = 1;
    c->pcs = cs;
    c->pper = per;
    c->psub = sub;
    c->pR = R;
    c->pT = k->pipe_threads;
    c->pTs = k->pipe_stats;
    c->psmem = (size_t)R * (size_t)sub * 16;
    return 1;
}

// CTA size and statistics threads of variant F. Defaults (H200 2026-12-03 s8 run 3, fused x floor
// at 544 / 672 / 800 threads, option-free variant: 8192x128256 bf16 1.16 / 1.15 / 1.16, 16384x32000
// bf16 1.17 / 1.15 / 1.15, 2048x32000 f16 1.38 / 1.35 / 1.36, 4096x50257 f32 1.22 / 1.21 / 1.22):
// 672 threads without options (8 statistics warps, 12 gradient, the producer), 544 with them (their
// 92-96 registers a thread fit no more). Statistics threads 3/8 of the rest (s6 run 2, one CTA per
// row of 512 threads: 16384x32000 bf16 1.15x at 192, 1.20x at 256, 1.33x at 320). A knob above the
// variant's launch bound gets the bound.
static void pipe_threads_for(int F, const Config& c, int* T, int* Ts) {
    const int bound = PIPE_BOUND(F);
    int t = c.pT ? c.pT : (F == 0 ? 672 : PIPE_MAX_THREADS);
    if (t > bound) t = bound;
    int s = c.pTs ? c.pTs : ((t - 32) * 3 / 8 + 31) / 32 * 32;
    if (s > t - 64) s = (t - 64) / 32 * 32;
    *T = t;
    *Ts = s;
}

template <typename T, int F, bool PST, bool NB = false, bool TM = false, int DN = 0>
static cudaError_t launch_pipe_st(const CeArgs& a, const Config& c, cudaStream_t s, int* done) {
    *done = 0;
    FlTmaps tm;
    memset(&tm, 0, sizeof tm);
    if (TM && !fl__tmap_note(fl__tmaps_encode(a.logits, (size_t)((a.N - 1) * a.ld + a.V) * sizeof(T), &tm) == 0,
                             "pipelined CE kernel", knobs()->debug)) {
        if constexpr (DN) return cudaSuccess;   // not done: launch_main runs the setup and another kernel
        else return launch_pipe_st<T, F, PST, NB, false>(a, c, s, done);  // no driver entry point / too big: raw copies
    }
    const void* fn = (const void*)ce_pipe_kernel<T, F, PST, NB, TM, DN>;
    int T_, Ts;
    pipe_threads_for(F, c, &T_, &Ts);
    int n = 0;
    cudaError_t e = fl__cluster_occupancy(fn, c.pcs, T_, c.psmem, c.sms, knobs()->debug, "pipelined CE kernel", &n);
    if (e != cudaSuccess || n <= 0) return e;
    if (knobs()->grid > 0 && knobs()->grid < n) n = knobs()->grid;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    const int64_t G = a.N < n ? a.N : n;
    cfg.gridDim = dim3((unsigned)(G * c.pcs), 1, 1);
    set_cluster(&cfg, &attr[0], (unsigned)c.pcs);
    if (c.pdl || DN == 2) {  // only right after this call's setup (or, DN 2, ticket) kernel: see ce_pipe_kernel
        set_pdl(&attr[1]);
        cfg.numAttrs = 2;
    }
    if constexpr (DN == 2) {
        ce_ticket_kernel<<<1, 32, 0, s>>>(a);
        e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    cfg.blockDim = dim3((unsigned)T_, 1, 1);
    cfg.dynamicSmemBytes = c.psmem;
    cfg.stream = s;
    e = cudaLaunchKernelEx(&cfg, ce_pipe_kernel<T, F, PST, NB, TM, DN>, a, c.pcs, c.pper, c.psub, c.pR, Ts, tm);
    if (e == cudaSuccess) *done = 1;
    return e;
}
// ring mode (a row's chunk in several slots): default-cached gradient stores (see store_vec)
template <typename T, int F>
static cudaError_t launch_pipe(const CeArgs& a, const Config& c, cudaStream_t s, int* done) {
    if (c.dnf == 2) {   // (ce_launch: only with the tensor-map copies, psub % 8 == 0, no NB)
        if (knobs()->plain_st && c.psub < c.pper) return launch_pipe_st<T, F, true, false, true, 2>(a, c, s, done);
        return launch_pipe_st<T, F, false, false, true, 2>(a, c, s, done);
    }
    if (c.dnf) {
        if (knobs()->plain_st && c.psub < c.pper) return launch_pipe_st<T, F, true, false, true, 1>(a, c, s, done);
        return launch_pipe_st<T, F, false, false, true, 1>(a, c, s, done);
    }
    if (knobs()->pipe_tmap && c.psub % 8 == 0) {  // the tensor-map copies (racecheck: see cluster.cuh)
        if (knobs()->plain_st && c.psub < c.pper) return launch_pipe_st<T, F, true, false, true>(a, c, s, done);
        return launch_pipe_st<T, F, false, false, true>(a, c, s, done);
    }
    if (knobs()->pipe_nbar && c.pR <= NB_MAX_SLOTS) {  // (whole-chunk plans: R = nbuf <= 4)
        if (knobs()->plain_st && c.psub < c.pper) return launch_pipe_st<T, F, true, true>(a, c, s, done);
        return launch_pipe_st<T, F, false, true>(a, c, s, done);
    }
    if (knobs()->plain_st && c.psub < c.pper) return launch_pipe_st<T, F, true>(a, c, s, done);
    return launch_pipe_st<T, F, false>(a, c, s, done);
}

// Lanes per row of the row-group launch for one-warp rows (C == 1, T == 32, K == 2): the fewest
// lanes that hold the row (2 vectors each) and its head/tail extras (< 2 VEC, one per lane), a
// power of two; 0 = use one CTA per row (few rows, or FUSEDLOSS_CE_GROUP_ROWS=0). Why: a short row
// (e.g. segmentation's 19 classes over 2M positions) as one 32-thread CTA per row is bound by CTA
// launch and the idle lanes (HRNet's OHEM shape ran at 54x its floor, H200 run 35).
static int group_lanes(const Config& c, int64_t N, int64_t V, int esize) {
    if (c.C != 1 || c.K != 2 || c.T != 32 || N < knobs()->group_rows || knobs()->group_rows <= 0) return 0;
    const int vec = 16 / esize;
    const int64_t nv = V / vec + 1;  // aligned vectors, upper bound (as choose_config)
    int L = 2 * vec;                 // the extras: one per lane
    while (L < 32 && (int64_t)L * 2 < nv) L *= 2;
    // a whole warp per row gains nothing over a one-warp CTA per row (H200 run 37: 65536x250 f32
    // fused 0.077 ms as groups vs 0.074 ms): groups only when they put >= 2 rows in a warp
    return L < 32 ? L : 0;
}

template <typename T, int PASS, int F>
static cudaError_t launch_row(const CeArgs& a, const Config& c, cudaStream_t s) {
    // (PASS_STATS, the vocab-parallel step 1 of short shards, stays on the CTA-per-row path: the
    // GPU tests have no batch of >= 512 rows with such shards)
    if (PASS != PASS_STATS && c.C == 1 && a.V <= TINY_V && knobs()->group_rows > 0 && a.N >= knobs()->group_rows) {
        ce_tiny_kernel<T, PASS, F><<<(unsigned)((a.N + 255) / 256), 256, 0, s>>>(a);
        return cudaGetLastError();
    }
    if constexpr (PASS != PASS_STATS) {   // (a constant L = 0 there had nvcc warn of a division by zero, #39-D)
        const int L = group_lanes(c, a.N, a.V, (int)sizeof(T));
        if (L > 0) {
            const int R = 256 / L;  // rows per CTA
            const dim3 block((unsigned)L, (unsigned)R, 1);
            const unsigned grid = (unsigned)((a.N + R - 1) / R);
            ce_row_kernel<T, 2, PASS, F><<<grid, block, 0, s>>>(a);
            return cudaGetLastError();
        }
    }
    const unsigned grid = (unsigned)(a.N * c.C);
    if (c.K == 2) ce_row_kernel<T, 2, PASS, F><<<grid, c.T, 0, s>>>(a);
    else ce_row_kernel<T, 8, PASS, F><<<grid, c.T, 0, s>>>(a);
    return cudaGetLastError();
}

// The streaming kernel (forward / backward of long rows): a persistent grid of as many CTAs as
// are resident, walking N * sC units; forward with sC > 1 is finished by ce_finish_kernel.
template <typename T, int PASS, int F>
static cudaError_t launch_stream(const CeArgs& a0, const Config& c, cudaStream_t s, int* done) {
    *done = 0;
    const int P = PASS == PASS_BACKWARD ? PASS_BACKWARD : (c.sC > 1 ? PASS_STATS : PASS_FORWARD);
    const void* fn = P == PASS_BACKWARD ? (const void*)ce_stream_kernel<T, PASS_BACKWARD, F>
                     : P == PASS_STATS  ? (const void*)ce_stream_kernel<T, PASS_STATS, F>
                                        : (const void*)ce_stream_kernel<T, PASS_FORWARD, F>;
    int n = 0;
    cudaError_t e = tma_occupancy(fn, 0, STREAM_T, 0, c.sms, &n);  // resident CTAs on the device
    if (e != cudaSuccess || n <= 0) return e;
    CeArgs a = a0;
    a.C = c.sC;
    const int64_t units = a.N * (int64_t)c.sC;
    const unsigned grid = (unsigned)(units < n ? units : n);
    if (P == PASS_BACKWARD) ce_stream_kernel<T, PASS_BACKWARD, F><<<grid, STREAM_T, 0, s>>>(a, c.sC, c.scv);
    else if (P == PASS_STATS) ce_stream_kernel<T, PASS_STATS, F><<<grid, STREAM_T, 0, s>>>(a, c.sC, c.scv);
    else ce_stream_kernel<T, PASS_FORWARD, F><<<grid, STREAM_T, 0, s>>>(a, c.sC, c.scv);
    e = cudaGetLastError();
    if (e == cudaSuccess && P == PASS_STATS) {
        ce_finish_kernel<F><<<(unsigned)((a.N + 255) / 256), 256, 0, s>>>(a);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) *done = 1;
    return e;
}

// Units of the streaming kernel: chunks of <= FUSEDLOSS_CE_STREAM_KB (256 KB) of a row, and at
// least ~8 units per SM so that short-N problems still fill the device (chunks never shorter than
// 2 vectors per thread; C <= fl__ce_chunks(V), which sizes the workspace).
static void stream_plan(int64_t N, int64_t V, int esize, int sms, Config* c) {
    const int64_t nv = V / (16 / esize) + 1;  // upper bound of a row's aligned vectors
    const int64_t cvmax = (int64_t)knobs()->stream_kb * 1024 / 16;
    int64_t C = (nv + cvmax - 1) / cvmax;
    const int64_t want = 8 * (int64_t)sms;
    if (N * C < want) C = (want + N - 1) / N;
    const int64_t cmax = fl__ce_chunks(V, (size_t)esize);
    const int64_t cmin_vecs = (nv + 2 * STREAM_T - 1) / (2 * STREAM_T);
    if (C > cmin_vecs) C = cmin_vecs;
    if (C > cmax) C = cmax;
    if (C < 1) C = 1;
    c->stream = 1;
    c->sC = (int)C;
    c->scv = (int)((nv + C - 1) / C);
}

// The passes of one call, in order, on the stream (no host sync between them).
template <typename T, int PASS, int F>
static cudaError_t launch_main(const CeArgs& a, const Config& c, cudaStream_t s) {
    cudaError_t e = cudaSuccess;
    if (PASS == PASS_FUSED && c.pipe) {
        int done = 0;
        e = launch_pipe<T, F>(a, c, s, &done);
        if (e != cudaSuccess || done) return e;
        if (c.dnf) {   // the pipe kernel that was to count the denominators did not run: the setup instead
            e = launch_setup(a, 0, s);
            if (e != cudaSuccess) return e;
        }
        if (c.dnf == 2) {   // nor was it to reduce the loss: the other kernels, then the reduce (ce_launch skips it)
            Config c2 = c;
            c2.pipe = 0;
            c2.dnf = 0;
            e = launch_main<T, PASS, F>(a, c2, s);
            return e != cudaSuccess ? e : launch_reduce(a, 0, 0, s);
        }
    }
    if (c.tma) {
        const TmaPlan p = {c.tcs, c.tper, c.tns, c.tT, c.tsmem};
        int done = 0;
        e = launch_tma<T, PASS, F>(a, p, c.sms, s, &done);
        if (e != cudaSuccess || done) return e;
    }
    if (c.stream && PASS != PASS_FUSED) {
        int done = 0;
        e = launch_stream<T, PASS, F>(a, c, s, &done);
        if (e != cudaSuccess || done) return e;
    }
    if (PASS == PASS_BACKWARD) return launch_row<T, PASS_BACKWARD, F>(a, c, s);
    if (c.C > 1) {
        e = launch_row<T, PASS_STATS, F>(a, c, s);
        if (e != cudaSuccess) return e;
        if (PASS == PASS_FORWARD) {
            ce_finish_kernel<F><<<(unsigned)((a.N + 255) / 256), 256, 0, s>>>(a);
            return cudaGetLastError();
        }
    }
    return launch_row<T, PASS, F>(a, c, s);  // C == 1: one pass; C > 1: FUSED after STATS
}

// Rows up to which the one-launch small kernel is used. Its grid is one cluster (<= 8 CTAs x 16
// warps), so rows per warp grow with N. Fused, GPU time per call in a CUDA graph (H200, run 12,
// 2026-11-30), small kernel up to 1024 rows / up to 128 / never:
//   128x1000 f32 6.19 / 6.19 / 7.18 us; 256x1000 f32 9.46 / 7.49 / 7.44;
//   512x1000 bf16 17.37 / 7.68 / 7.66; 1024x1000 bf16 31.34 / 8.74 / 8.74.
// FUSEDLOSS_CE_SMALL_MAX_ROWS overrides (A/B).
static int64_t small_max_rows(void) { return knobs()->small_rows; }

template <typename T, int PASS, int F>
static cudaError_t launch_small(const CeArgs& a, int C, cudaStream_t s) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)C, 1, 1);
    cfg.blockDim = dim3(SMALL_WARPS * 32, 1, 1);
    cfg.stream = s;
    cudaLaunchAttribute attr[2];
    set_cluster(&cfg, &attr[0], (unsigned)C);
    // one-CTA clusters: no st.async (it needs >= 2 CTAs), the cluster.sync() path
    const int opt = C > 1 ? knobs()->small_opt : knobs()->small_opt & 13;
    if (opt & 4) {
        attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 2;
    }
    return cudaLaunchKernelEx(&cfg, ce_small_kernel<T, PASS == PASS_FUSED ? PASS_FUSED : PASS_FORWARD, F>, a, C | (opt << 8));
}

// Vocab-parallel step 1's main kernel: the per-chunk (max, sum-exp, sum w z, z_t) of every row
// into the workspace's stats region, a.C per row (vp_stats_kernel merges them): the streaming
// kernel for long shard rows (its forward speed), the row kernel (one chunk) for short ones.
template <typename T, int F>
static cudaError_t launch_vp_stats(const CeArgs& a, const Config& c, cudaStream_t s) {
    if (!c.stream) return launch_row<T, PASS_STATS, F>(a, c, s);
    int n = 0;
    cudaError_t e = tma_occupancy((const void*)ce_stream_kernel<T, PASS_STATS, F>, 0, STREAM_T, 0, c.sms, &n);
    if (e != cudaSuccess) return e;
    if (n <= 0) return cudaErrorInvalidConfiguration;
    const int64_t units = a.N * (int64_t)c.sC;
    const unsigned grid = (unsigned)(units < n ? units : n);
    ce_stream_kernel<T, PASS_STATS, F><<<grid, STREAM_T, 0, s>>>(a, c.sC, c.scv);
    return cudaGetLastError();
}

// kind: 0 = main (row/loop), 1 = small, 2 = vocab-parallel statistics (launch_vp_stats)
template <typename T, int PASS, int F>
static cudaError_t launch_f(int kind, const CeArgs& a, const Config& c, int C, cudaStream_t s) {
    if (kind == 2) return launch_vp_stats<T, F>(a, c, s);
    if (kind == 1) {
        if (PASS == PASS_BACKWARD) return cudaErrorInvalidValue;  // never chosen
        return launch_small<T, PASS, F>(a, C, s);
    }
    return launch_main<T, PASS, F>(a, c, s);
}

template <typename T, int PASS>
static cudaError_t launch_t(int flags, int kind, const CeArgs& a, const Config& c, int C, cudaStream_t s) {
    switch (flags) {
        case 0: return launch_f<T, PASS, 0>(kind, a, c, C, s);
        case F_ZMAP: return launch_f<T, PASS, F_ZMAP>(kind, a, c, C, s);
        case F_SMOOTH: return launch_f<T, PASS, F_SMOOTH>(kind, a, c, C, s);
        default: return launch_f<T, PASS, F_ZMAP | F_SMOOTH>(kind, a, c, C, s);
    }
}

template <int PASS>
static cudaError_t launch_dtype(fl_dtype dt, int flags, int kind, const CeArgs& a, const Config& c, int C,
                                cudaStream_t s) {
    switch (dt) {
        case FL_DTYPE_F32: return launch_t<float, PASS>(flags, kind, a, c, C, s);
        case FL_DTYPE_F16: return launch_t<__half, PASS>(flags, kind, a, c, C, s);
        default: return launch_t<__nv_bfloat16, PASS>(flags, kind, a, c, C, s);
    }
}

static cudaError_t launch_pass(int pass, fl_dtype dt, int flags, int kind, const CeArgs& a, const Config& c,
                               int C, cudaStream_t s) {
    if (pass == PASS_FORWARD) return launch_dtype<PASS_FORWARD>(dt, flags, kind, a, c, C, s);
    if (pass == PASS_BACKWARD) return launch_dtype<PASS_BACKWARD>(dt, flags, kind, a, c, C, s);
    return launch_dtype<PASS_FUSED>(dt, flags, kind, a, c, C, s);
}

// Kernel arguments of a call over N rows whose workspace was laid out for Nws >= N rows (the stats
// region's offset depends on it).
static CeArgs make_args(const fl__ce_params& p, float* loss, float* lse_out, void* dlogits, const void* logits,
                        const void* targets, const float* lse_in, const float* grad_loss, float grad_scale,
                        int64_t N, int64_t V, int64_t ld, fl_index_dtype it, void* workspace, int64_t Nws) {
    CeArgs a;
    a.loss = loss; a.lse_out = lse_out; a.dlogits = dlogits; a.logits = logits; a.targets = targets;
    a.lse_in = lse_in; a.grad_loss = grad_loss; a.grad_scale = grad_scale;
    a.N = N; a.V = V; a.ld = ld; a.idx64 = it == FL_INDEX_I64;
    a.ignore_index = p.ignore_index; a.reduction = (int)p.reduction;
    a.eps = p.label_smoothing; a.zeta = p.z_loss; a.softcap = p.softcap; a.scale = p.logit_scale;
    a.weight = p.weight; a.error_flag = p.error_flag;
    a.offset = p.logit_offset; a.tprob = p.target_prob;
    a.inv_softcap = p.softcap > 0.0f ? 1.0f / p.softcap : 0.0f;
    a.hdr = (double*)workspace;
    a.part = (float*)((char*)workspace + 256);
    a.stats = (float4*)((char*)workspace + 256 + (((size_t)Nws * 16u + 255u) & ~(size_t)255u));
    a.C = 1;
    a.col0 = 0;
    a.Vg = V;
    return a;
}

static fl_status ce_launch(const char* fn, int pass, CeArgs& a, const fl__ce_params& p, fl_dtype dt, int chunk,
                           cudaStream_t stream);

// What the CUDA kernels need beyond fl__ce_validate: dtype-aligned pointers, dlogits with the
// logits' 16-byte phase (the vector sweeps share one row layout), V whose positions fit 32 bits.
static fl_status check_cuda_layout(const char* fn, const void* dlogits, const void* logits, int64_t N, int64_t V,
                                   fl_dtype dt) {
    if ((uintptr_t)logits % fl__dtype_size(dt) || (dlogits && (uintptr_t)dlogits % fl__dtype_size(dt)))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logits/dlogits not aligned to the dtype size", fn);
    if (N > 0 && dlogits && dlogits != logits && ((uintptr_t)dlogits & 15u) != ((uintptr_t)logits & 15u))
        return fl__fail(FL_ERR_UNSUPPORTED,
                        "%s: dlogits (%p) and logits (%p) must have the same address modulo 16 bytes", fn, dlogits,
                        logits);
    if (V > INT32_MAX - 64)  // positions inside a row are 32-bit in the kernels
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: V (%lld) above 2^31 - 64 is not supported on CUDA", fn, (long long)V);
    return FL_OK;
}

// The per-element option flags compiled into the kernels (template F) for these options.
static int ce_flags(const fl__ce_params& p) {
    return ((p.softcap > 0.0f || p.logit_scale != 1.0f || p.logit_offset) ? F_ZMAP : 0) |
           (p.label_smoothing > 0.0f ? F_SMOOTH : 0);
}

static fl_status ce_cuda(const char* fn, int pass, float* loss, float* lse_out, void* dlogits,
                         const void* logits, const void* targets, const float* lse_in,
                         const float* grad_loss, float grad_scale, int64_t N, int64_t V, int64_t ld,
                         fl_dtype dt, fl_index_dtype it, const fl_ce_options* opts, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__ce_validate(fn, (fl__pass)pass, 1, loss, pass == PASS_BACKWARD ? lse_in : lse_out, dlogits,
                             logits, targets, grad_loss, N, V, ld, dt, it, opts, workspace, workspace_bytes, &p));
    if (pass != PASS_FORWARD && !isfinite(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) is not finite", fn, (double)grad_scale);
    FL_CHECK(check_cuda_layout(fn, dlogits, logits, N, V, dt));

    CeArgs a = make_args(p, loss, lse_out, dlogits, logits, targets, lse_in, grad_loss, grad_scale, N, V, ld, it,
                         workspace, N);
    if (pass == PASS_BACKWARD) a.tprob = NULL;  // a forward output
    return ce_launch(fn, pass, a, p, dt, 0, stream);
}

// The launches of one call (chunk = 0), or, for the linear cross-entropy (chunk = 1), only the
// main kernel over the rows in `a` (a slice of a bigger batch): the denominators in a.hdr come
// from fl__ce_cuda_chunk_begin over the whole batch, the per-row partials go to a.part (already
// offset to the slice) and fl__ce_cuda_chunk_end reduces them.
static fl_status ce_launch(const char* fn, int pass, CeArgs& a, const fl__ce_params& p, fl_dtype dt, int chunk,
                           cudaStream_t stream) {
    const int64_t N = a.N, V = a.V;
    const int reduced = p.reduction != FL_REDUCTION_NONE;
    const int mean = p.reduction == FL_REDUCTION_MEAN;
    // the forward's row kernels need only W (weighted smoothing); its MEAN denominators are summed
    // by the reduce kernel itself
    const int needs_setup = !chunk && ((mean && pass != PASS_FORWARD) || (p.weight && p.label_smoothing > 0.0f) ||
                                       (reduced && pass != PASS_BACKWARD && setup_for_reduce(N, mean)));

    if (N == 0) {  // nothing to read; SUM = 0, MEAN = NaN (0/0) still come from the reduce kernel
        if (chunk || !reduced || pass == PASS_BACKWARD) return FL_OK;
    }
    DevInfo d;
    FL_CUDA_TRY(dev_info(&d));
    const int vec = 16 / (int)fl__dtype_size(dt);

    const int flags = ce_flags(p);
    Config none_cfg = {};
    none_cfg.C = 1;
    int folded = 0;   // the pipe kernel (or launch_main's fallback) reduced the loss

    // small reduced problems on sm_90: one launch does everything (see ce_small_kernel)
    if (!chunk && d.cc_major >= 9 && reduced && pass != PASS_BACKWARD && N <= small_max_rows() &&
        V / vec + 1 <= 32 * SMALL_KW) {
        // one row per warp where possible (N = 128: 8 CTAs x 16 warps): the rows' load latencies
        // overlap instead of queueing behind each other in one warp (measured on the H200, run 1:
        // 4 rows per warp on 4 CTAs took 14 us for 128 x 1000 fp32)
        int64_t C = (N + SMALL_WARPS - 1) / SMALL_WARPS;
        C = C < 1 ? 1 : C > 8 ? 8 : C;
        FL_CUDA_TRY(launch_pass(pass, dt, flags, 1, a, none_cfg, (int)C, stream));
        return FL_OK;
    }
    if (N > 0) {
        Config c = choose_config(V, (int)fl__dtype_size(dt), pass);
        const int64_t nvr = V / vec + 1;
        // Fused rows that fit one 512-thread CTA's registers (<= 4096 vectors) with few rows took
        // the row kernel, a CTA per row, from 2026-12-01 run 4 (2048x32000 f16 1.36x vs 1.56x
        // staged) until 2026-12-02: by then that path measured 1.86x (it had regressed unnoticed
        // between run 6 and run 31 of 2026-12-01; its K = 8 fused variant now spills 8 bytes)
        // against the staged kernel's 1.58x (run 10: 2048x32000 f16 / bf16 1.58 / 1.59x vs 1.86
        // / 1.88x, 4096x32000 bf16 1.42x vs 1.78x). The staged kernel takes them now.
        // A logit offset (z = ... + o_j, F_ZMAP) makes every 16-byte vector of a sweep read 32 (16-bit logits) or 16
        // (fp32) bytes of the [V] offsets, from L2 in both sweeps: the ring (one CTA an SM, ~30 KB of L1 left beside
        // it) re-reads a CTA's whole slice every row. The staged kernel with chunks of <= 64 KB (several CTAs an SM)
        // measured 20-27% faster, H100 s30 run 9, fused x floor, ring / staged (FUSEDLOSS_CE_TMA_KB=100) / staged 64
        // KB, two alternations: 8192x128256 bf16 2.92, 2.91 / 2.32, 2.32 / 2.32, 2.32; 8192x32000 bf16 3.15, 3.10 /
        // 2.31, 2.31 / 2.33, 2.31; 16384x32000 bf16 3.06, 3.20 / 2.31, 2.30 / 2.31, 2.32; 4096x50257 f32 1.91, 1.90 /
        // 2.21, 2.21 / 1.70, 1.70. Still 1.7-2.3x: the offsets' reads, not the logits', bound it (NOTES s30).
        // The forward likewise (FUSEDLOSS_CE_OFF_FWD, default 1 since s31; 0: the streaming kernel), s30 run 11,
        // forward x floor, streaming / staged 64 KB, two alternations: 8192x128256 bf16 2.92, 2.90 / 1.92, 1.90;
        // 8192x32000 bf16 2.88, 2.86 / 2.04, 2.04; 4096x50257 f32 1.96, 1.95 / 1.83, 1.81. Tested in s31 run 2
        // (CE 223/0, offset memcheck 0, linear CE 520/0, vocab-parallel 1973/0).
        // Class weights with label smoothing read weight[j] per element too (scalar loads), but the same route
        // did not pay for them (s31 run 2, H100, --smoothing 0.1 --weight, fused x floor, ring / staged 64 KB, two
        // alternations: 8192x128256 bf16 2.07, 2.07 / 2.05, 2.05; 8192x32000 bf16 2.12, 2.11 / 2.05, 2.05;
        // 4096x50257 f32 1.39, 1.39 / 1.48, 1.44; forward staged 1.73 -> 2.08, 2.03 -> 2.16, 1.19 -> 1.52): they
        // stay on the ring and the streaming forward.
        const int off = a.offset != NULL && !knobs()->off_pipe &&
                        (pass == PASS_FUSED || (pass == PASS_FORWARD && knobs()->off_fwd));
        TmaPlan tp;
        if (tma_plan(pass, d.cc_major, N, V, (int)fl__dtype_size(dt), d.sms, off ? knobs()->off_kb : knobs()->kb, off,
                     &tp)) {
            c.tma = 1; c.sms = d.sms; c.tcs = tp.cs; c.tper = tp.per; c.tns = tp.ns; c.tT = tp.T; c.tsmem = tp.smem;
        }
        c.sms = d.sms;
        if (!off || !c.tma) pipe_plan(pass, d.cc_major, V, (int)fl__dtype_size(dt), flags, &c);  // (rows too long
        // for 16 CTAs of _OFF_KB keep the ring)
        // ce_pipe_kernel's DN (FUSEDLOSS_CE_PIPE_DN, default): an unweighted fused MEAN's denominators counted in the
        // pipe kernel itself, no setup kernel (launch_main runs the setup if the pipe kernel does not run)
        const Knobs* kn = knobs();
        c.dnf = needs_setup && pass == PASS_FUSED && mean && !p.weight && c.pipe && kn->pipe_dn &&
                N <= kn->pipe_dn_rows && kn->pipe_tmap && c.psub % 8 == 0;
        // _DN_FOLD (default): that kernel also reduces the loss (dnf 2; no reduce kernel, a one-warp ticket kernel
        // before it)
        if (c.dnf && !chunk && kn->pipe_dn_fold && d.cc_major >= 9) c.dnf = 2;
        folded = c.dnf == 2;
        if (needs_setup && !c.dnf) FL_CUDA_TRY(launch_setup(a, d.cc_major >= 9 && kn->pdl, stream));
        c.pdl = needs_setup && !c.dnf && kn->pdl;
        // the streaming kernel for the forward; the backward stays on the chunk kernels (64-thread
        // CTAs, 8 vectors each), which measured faster for a read+write stream (H200, 2026-12-01:
        // 8192x128256 bf16 backward 1.04x vs 1.30x; FUSEDLOSS_CE_STREAM=2 takes it for both)
        const int stream_on = knobs()->stream == 2 || (knobs()->stream == 1 && pass == PASS_FORWARD);
        if (stream_on && pass != PASS_FUSED && nvr > 512) stream_plan(N, V, (int)fl__dtype_size(dt), d.sms, &c);
        a.C = c.C;
        if (!c.stream && (int64_t)N * c.C > INT32_MAX)
            return fl__fail(FL_ERR_UNSUPPORTED, "%s: N * chunks (%lld * %d) exceeds one launch", fn, (long long)N, c.C);
        FL_CUDA_TRY(launch_pass(pass, dt, flags, 0, a, c, 0, stream));
    } else if (needs_setup) {
        FL_CUDA_TRY(launch_setup(a, d.cc_major >= 9 && knobs()->pdl, stream));
    }
    if (!chunk && reduced && pass != PASS_BACKWARD && !folded)
        FL_CUDA_TRY(launch_reduce(a, mean && !needs_setup, d.cc_major >= 9 && knobs()->pdl, stream));
    return FL_OK;
}

// x[i, :V] *= g[per_row ? i : 0], rows with factor 1 untouched (see fl_scale_rows_cuda). The work
// items are (row, chunk) pairs, nch chunks a row (the row's vectors cut into nch near-equal runs; the
// head / tail elements go with chunk 0): a few long rows (the zoo's kept [N, C d] gradients, e.g.
// Lovasz 4 x (19 x 512 x 512) or focal 8 x (19 x 512 x 1024)) still spread over the whole grid.
// (H100 s21: focal's 318 MB scale takes 0.290 ms, 1.3x the copy floor; 4 vectors a thread loaded before any
// store measured 0.294 ms, so one load in flight is not what holds it; Lovasz's 80 MB 0.058 ms, at its floor.)
template <typename T>
__global__ void __launch_bounds__(256) scale_rows_kernel(T* x, int64_t N, int V, int64_t ld, const float* g,
                                                         int per_row, int nch) {
    const int64_t items = N * (int64_t)nch;
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        const int64_t i = it / nch;
        const int c = (int)(it - i * nch);
        const float f = g[per_row ? i : 0];
        if (f == 1.0f) {
            if (!per_row) return;  // the same factor for every row: nothing to do anywhere
            continue;
        }
        T* row = x + i * ld;
        const RowGrid<T> gr(row, V);
        const int per = (int)(((int64_t)gr.nfull + nch - 1) / nch);
        const int q0 = (int)((int64_t)c * per < gr.nfull ? c * per : gr.nfull);
        const int q1 = (int)((int64_t)q0 + per < gr.nfull ? q0 + per : gr.nfull);
        for (int q = q0 + (int)threadIdx.x; q < q1; q += (int)blockDim.x) {
            Pack<T> p;
            load_vec(p, row, gr.vec_elem(q), true);
#pragma unroll
            for (int v = 0; v < Pack<T>::VEC; v++) p.v[v] = from_float<T>(to_float(p.v[v]) * f);
            store_vec(p, row, gr.vec_elem(q));
        }
        if (c == 0) {
            for (int k = (int)threadIdx.x; k < gr.nextra; k += (int)blockDim.x) {
                const int e = gr.extra_elem(k);
                row[e] = from_float<T>(to_float(row[e]) * f);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// public entry points

extern "C" {

fl_status fl_scale_rows_cuda(void* x, int64_t N, int64_t V, int64_t ld, fl_dtype dtype, const float* g,
                             int per_row, fl_stream stream) {
    static const char* fn = "fl_scale_rows_cuda";
    fl__clear_error();
    FL_CHECK(fl__scale_validate(fn, x, N, V, ld, dtype, g));
    if (V > INT32_MAX - 64)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: V (%lld) above 2^31 - 64 is not supported on CUDA", fn, (long long)V);
    if (N == 0) return FL_OK;
    DevInfo d;
    FL_CUDA_TRY(dev_info(&d));
    const int64_t cap = (int64_t)d.sms * 8;
    // rows cut into chunks of >= 16384 elements while there are fewer (row, chunk) items than cap:
    // 8 x (19 x 512 x 1024) fp32 took 8 CTAs for 320 MB when rows were the only unit
    int64_t nch = 1;
    if (N < cap) {
        const int64_t by_len = (V + 16383) / 16384, by_grid = (cap + N - 1) / N;
        nch = by_len < by_grid ? by_len : by_grid;
        if (nch < 1) nch = 1;
    }
    const int64_t items = N * nch;
    const unsigned grid = (unsigned)(items < cap ? items : cap);
    const int ch = (int)nch;
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
        case FL_DTYPE_F32:
            scale_rows_kernel<float><<<grid, 256, 0, s>>>((float*)x, N, (int)V, ld, g, per_row, ch);
            break;
        case FL_DTYPE_F16:
            scale_rows_kernel<__half><<<grid, 256, 0, s>>>((__half*)x, N, (int)V, ld, g, per_row, ch);
            break;
        default:
            scale_rows_kernel<__nv_bfloat16><<<grid, 256, 0, s>>>((__nv_bfloat16*)x, N, (int)V, ld, g, per_row, ch);
            break;
    }
    FL_CUDA_TRY(cudaGetLastError());
    return FL_OK;
}

fl_status fl_cross_entropy_forward_cuda(float* loss, float* lse, const void* logits, const void* targets,
                                        int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                        fl_index_dtype index_dtype, const fl_ce_options* opts,
                                        void* workspace, size_t workspace_bytes, fl_stream stream) {
    return ce_cuda("fl_cross_entropy_forward_cuda", PASS_FORWARD, loss, lse, NULL, logits, targets, NULL, NULL,
                   1.0f, N, V, ld, dtype, index_dtype, opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

fl_status fl_cross_entropy_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                         const float* lse, const float* grad_loss, float grad_scale,
                                         int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                         fl_index_dtype index_dtype, const fl_ce_options* opts,
                                         void* workspace, size_t workspace_bytes, fl_stream stream) {
    return ce_cuda("fl_cross_entropy_backward_cuda", PASS_BACKWARD, NULL, NULL, dlogits, logits, targets, lse,
                   grad_loss, grad_scale, N, V, ld, dtype, index_dtype, opts, workspace, workspace_bytes,
                   (cudaStream_t)stream);
}

fl_status fl_cross_entropy_fused_cuda(float* loss, float* lse, void* dlogits, const void* logits,
                                      const void* targets, const float* grad_loss, float grad_scale,
                                      int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                      fl_index_dtype index_dtype, const fl_ce_options* opts,
                                      void* workspace, size_t workspace_bytes, fl_stream stream) {
    return ce_cuda("fl_cross_entropy_fused_cuda", PASS_FUSED, loss, lse, dlogits, logits, targets, NULL,
                   grad_loss, grad_scale, N, V, ld, dtype, index_dtype, opts, workspace, workspace_bytes,
                   (cudaStream_t)stream);
}

// ---- chunks of a bigger batch (the linear cross-entropy, src/cuda/linear_cross_entropy.cu) ----

fl_status fl__ce_cuda_chunk_begin(const fl__ce_params* p, const void* targets, int64_t N, int64_t V,
                                  fl_index_dtype it, void* ce_ws, fl_stream stream) {
    static const char* fn = "fl_linear_cross_entropy_cuda";
    const int needs_setup = p->reduction == FL_REDUCTION_MEAN || (p->weight && p->label_smoothing > 0.0f);
    if (!needs_setup) return FL_OK;
    CeArgs a = make_args(*p, NULL, NULL, NULL, NULL, targets, NULL, NULL, 1.0f, N, V, V, it, ce_ws, N);
    FL_CUDA_TRY(launch_setup(a, 0, (cudaStream_t)stream));
    return FL_OK;
}

fl_status fl__ce_cuda_chunk_rows(int pass, const fl__ce_params* p, int64_t r0, int64_t C, int64_t N, int64_t V,
                                 float* loss, float* lse_out, void* dlogits, const void* logits, int64_t ld,
                                 const void* targets, const float* lse_in, const float* grad_loss, float grad_scale,
                                 fl_dtype dt, fl_index_dtype it, void* ce_ws, fl_stream stream) {
    const int none = p->reduction == FL_REDUCTION_NONE;
    const void* tg = (const char*)targets + (size_t)r0 * fl__index_size(it);
    CeArgs a = make_args(*p, none ? loss + r0 : NULL, lse_out ? lse_out + r0 : NULL, dlogits, logits, tg,
                         lse_in ? lse_in + r0 : NULL, (grad_loss && none) ? grad_loss + r0 : grad_loss, grad_scale,
                         C, V, ld, it, ce_ws, N);
    a.part += 2 * r0;
    a.tprob = (pass == PASS_BACKWARD || !a.tprob) ? NULL : a.tprob + r0;
    return ce_launch("fl_linear_cross_entropy_cuda", pass, a, *p, dt, 1, (cudaStream_t)stream);
}

fl_status fl__ce_cuda_chunk_end(const fl__ce_params* p, float* loss, const void* targets, int64_t N, int64_t V,
                                fl_index_dtype it, void* ce_ws, fl_stream stream) {
    static const char* fn = "fl_linear_cross_entropy_cuda";
    if (p->reduction == FL_REDUCTION_NONE) return FL_OK;
    CeArgs a = make_args(*p, loss, NULL, NULL, NULL, targets, NULL, NULL, 1.0f, N, V, V, it, ce_ws, N);
    FL_CUDA_TRY(launch_reduce(a, 0, 0, (cudaStream_t)stream));  // the denominators: chunk_begin's setup
    return FL_OK;
}

}  // extern "C"

// ---- vocab-parallel steps (header section 8) ----

// The kernel arguments of a shard step: section 5's over the shard's V_local columns, with the
// shard's place in the vocabulary (see CeArgs).
// Nws: the rows the workspace is laid out for (N, or a whole batch when these are a chunk of it).
static CeArgs vp_args(const fl__ce_params& p, void* dlogits, const void* logits, const void* targets,
                      const float* lse_in, const float* grad_loss, float grad_scale, int64_t N, int64_t V_local,
                      int64_t ld, int64_t vocab_start, int64_t V, fl_index_dtype it, void* workspace,
                      int64_t Nws = -1) {
    CeArgs a = make_args(p, NULL, NULL, dlogits, logits, targets, lse_in, grad_loss, grad_scale, N, V_local, ld, it,
                         workspace, Nws < 0 ? N : Nws);
    a.col0 = vocab_start;
    a.Vg = V;
    if (a.weight) a.weight += vocab_start;
    if (a.offset) a.offset += vocab_start;  // the global [V] offsets, as the weights
    a.tprob = NULL;                         // not an output of the steps (refused by the validators)
    return a;
}

// Step 1 of a.N rows (a from vp_args): the chunk partials, then one thread per row merges them.
static fl_status vp_stats_launch(const char* fn, const fl__ce_params& p, CeArgs& a, float* stats, fl_dtype dtype,
                                 cudaStream_t s) {
    DevInfo d;
    FL_CUDA_TRY(dev_info(&d));
    const int esize = (int)fl__dtype_size(dtype);
    const int64_t N = a.N, V_local = a.V;
    Config c = choose_config(V_local, esize, PASS_FORWARD);
    c.sms = d.sms;
    if (V_local / (16 / esize) + 1 > 512) stream_plan(N, V_local, esize, d.sms, &c);
    a.C = c.stream ? c.sC : c.C;
    if (!c.stream && N * (int64_t)c.C > INT32_MAX)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: N * chunks (%lld * %d) exceeds one launch", fn, (long long)N, c.C);
    FL_CUDA_TRY(launch_pass(PASS_FORWARD, dtype, ce_flags(p), 2, a, c, 0, s));
    vp_stats_kernel<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(a, stats);
    FL_CUDA_TRY(cudaGetLastError());
    return FL_OK;
}

extern "C" {

fl_status fl_vp_ce_local_stats_cuda(float* stats, const void* logits, const void* targets, int64_t N,
                                    int64_t V_local, int64_t ld, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                    fl_index_dtype index_dtype, const fl_ce_options* opts, void* workspace,
                                    size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_vp_ce_local_stats_cuda";
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__vp_validate_shard(fn, 0, 1, stats, NULL, logits, targets, NULL, NULL, 1.0f, N, V_local, ld,
                                   vocab_start, V, dtype, index_dtype, opts, workspace, workspace_bytes, &p));
    FL_CHECK(check_cuda_layout(fn, NULL, logits, N, V, dtype));
    if (N == 0) return FL_OK;
    CeArgs a = vp_args(p, NULL, logits, targets, NULL, NULL, 1.0f, N, V_local, ld, vocab_start, V, index_dtype,
                       workspace);
    return vp_stats_launch(fn, p, a, stats, dtype, (cudaStream_t)stream);
}

fl_status fl_vp_ce_combine_cuda(float* loss, float* lse, const float* gathered, int k, const void* targets,
                                int64_t N, int64_t V, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                void* workspace, size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_vp_ce_combine_cuda";
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__vp_validate_combine(fn, 1, loss, lse, gathered, k, targets, N, V, index_dtype, opts, workspace,
                                     workspace_bytes, &p));
    if (V > INT32_MAX - 64)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: V (%lld) above 2^31 - 64 is not supported on CUDA", fn, (long long)V);
    const int reduced = p.reduction != FL_REDUCTION_NONE, mean = p.reduction == FL_REDUCTION_MEAN;
    if (N == 0 && !reduced) return FL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    CeArgs a = make_args(p, loss, lse, NULL, NULL, targets, NULL, NULL, 1.0f, N, V, V, index_dtype, workspace, N);
    // W; MEAN's denominators: the reduce kernel, or the setup for a big batch (two stages)
    const int needs_setup = (p.weight && p.label_smoothing > 0.0f) || (reduced && setup_for_reduce(N, mean));
    if (needs_setup) FL_CUDA_TRY(launch_setup(a, 0, s));
    if (N > 0) {
        vp_combine_kernel<<<(unsigned)((N + 255) / 256), 256, 0, s>>>(a, gathered, k);
        FL_CUDA_TRY(cudaGetLastError());
    }
    if (reduced) FL_CUDA_TRY(launch_reduce(a, mean && !needs_setup, 0, s));
    return FL_OK;
}

fl_status fl_vp_ce_backward_cuda(void* dlogits, const void* logits, const void* targets, const float* lse,
                                 const float* grad_loss, float grad_scale, int64_t N, int64_t V_local, int64_t ld,
                                 int64_t vocab_start, int64_t V, fl_dtype dtype, fl_index_dtype index_dtype,
                                 const fl_ce_options* opts, void* workspace, size_t workspace_bytes,
                                 fl_stream stream) {
    static const char* fn = "fl_vp_ce_backward_cuda";
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__vp_validate_shard(fn, 1, 1, NULL, dlogits, logits, targets, lse, grad_loss, grad_scale, N, V_local,
                                   ld, vocab_start, V, dtype, index_dtype, opts, workspace, workspace_bytes, &p));
    FL_CHECK(check_cuda_layout(fn, dlogits, logits, N, V, dtype));
    if (N == 0) return FL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    CeArgs a = vp_args(p, dlogits, logits, targets, lse, grad_loss, grad_scale, N, V_local, ld, vocab_start, V,
                       index_dtype, workspace);
    if (p.reduction == FL_REDUCTION_MEAN || (p.weight && p.label_smoothing > 0.0f)) {
        FL_CUDA_TRY(launch_setup(a, 0, s));  // over all N targets and the global weights
    }
    Config c = choose_config(V_local, (int)fl__dtype_size(dtype), PASS_BACKWARD);
    a.C = c.C;
    if (N * (int64_t)c.C > INT32_MAX)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: N * chunks (%lld * %d) exceeds one launch", fn, (long long)N, c.C);
    FL_CUDA_TRY(launch_pass(PASS_BACKWARD, dtype, ce_flags(p), 0, a, c, 0, s));
    return FL_OK;
}

// ---- the vocab-parallel steps on chunks of rows (the linear variant, linear_cross_entropy.cu) ----
// The workspace keeps the whole batch's layout (Nws = N): header (denominators, W) and row partials
// of all N rows stay valid between the chunks; a chunk's statistics partials use the stats region.

fl_status fl__vp_cuda_chunk_begin(const fl__ce_params* p, const void* targets, int64_t N, int64_t V_local,
                                  int64_t vocab_start, int64_t V, fl_index_dtype it, void* ce_ws, fl_stream stream) {
    static const char* fn = "fl_vp_linear_ce_cuda";
    // N == 0 too (MEAN's 0 / 0 = NaN, as the single-GPU calls give)
    if (!(p->reduction == FL_REDUCTION_MEAN || (p->weight && p->label_smoothing > 0.0f))) return FL_OK;
    CeArgs a = vp_args(*p, NULL, NULL, targets, NULL, NULL, 1.0f, N, V_local, V_local, vocab_start, V, it, ce_ws);
    FL_CUDA_TRY(launch_setup(a, 0, (cudaStream_t)stream));  // over all N targets and the global weights
    return FL_OK;
}

fl_status fl__vp_cuda_chunk_stats(const fl__ce_params* p, int64_t r0, int64_t R, int64_t N, float* stats,
                                  const void* logits, int64_t ld, const void* targets, int64_t V_local,
                                  int64_t vocab_start, int64_t V, fl_dtype dt, fl_index_dtype it, void* ce_ws,
                                  fl_stream stream) {
    if (R == 0) return FL_OK;
    const void* tg = (const char*)targets + (size_t)r0 * fl__index_size(it);
    CeArgs a = vp_args(*p, NULL, logits, tg, NULL, NULL, 1.0f, R, V_local, ld, vocab_start, V, it, ce_ws, N);
    return vp_stats_launch("fl_vp_linear_ce_cuda", *p, a, stats, dt, (cudaStream_t)stream);
}

fl_status fl__vp_cuda_chunk_combine(const fl__ce_params* p, int64_t r0, int64_t R, int64_t N, float* loss,
                                    float* lse, const float* gathered, int k, const void* targets, int64_t V,
                                    fl_index_dtype it, void* ce_ws, fl_stream stream) {
    static const char* fn = "fl_vp_linear_ce_cuda";
    if (R == 0) return FL_OK;
    const int none = p->reduction == FL_REDUCTION_NONE;
    const void* tg = (const char*)targets + (size_t)r0 * fl__index_size(it);
    CeArgs a = make_args(*p, none ? loss + r0 : loss, lse + r0, NULL, NULL, tg, NULL, NULL, 1.0f, R, V, V, it, ce_ws,
                         N);
    a.part += 2 * r0;
    a.tprob = NULL;
    vp_combine_kernel<<<(unsigned)((R + 255) / 256), 256, 0, (cudaStream_t)stream>>>(a, gathered, k);
    FL_CUDA_TRY(cudaGetLastError());
    return FL_OK;
}

fl_status fl__vp_cuda_chunk_backward(const fl__ce_params* p, int64_t r0, int64_t R, int64_t N, void* dlogits,
                                     const void* logits, int64_t ld, const void* targets, const float* lse,
                                     const float* grad_loss, float grad_scale, int64_t V_local, int64_t vocab_start,
                                     int64_t V, fl_dtype dt, fl_index_dtype it, void* ce_ws, fl_stream stream) {
    static const char* fn = "fl_vp_linear_ce_cuda";
    if (R == 0) return FL_OK;
    const int none = p->reduction == FL_REDUCTION_NONE;
    const void* tg = (const char*)targets + (size_t)r0 * fl__index_size(it);
    CeArgs a = vp_args(*p, dlogits, logits, tg, lse + r0, (grad_loss && none) ? grad_loss + r0 : grad_loss,
                       grad_scale, R, V_local, ld, vocab_start, V, it, ce_ws, N);
    Config c = choose_config(V_local, (int)fl__dtype_size(dt), PASS_BACKWARD);
    a.C = c.C;
    if (R * (int64_t)c.C > INT32_MAX)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: rows * chunks (%lld * %d) exceeds one launch", fn, (long long)R, c.C);
    FL_CUDA_TRY(launch_pass(PASS_BACKWARD, dt, ce_flags(*p), 0, a, c, 0, (cudaStream_t)stream));
    return FL_OK;
}

}  // extern "C"
