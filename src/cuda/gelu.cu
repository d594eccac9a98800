/* gelu.cu — CUDA backend of GeLU (+ bias) forward and backward (+ dbias, fused).
 *
 * Semantics: include/fusedloss.h section 7; the CPU backend src/cpu/gelu.c is the
 * specification and tests/test_gelu_cuda.c checks this file against it.
 * Dtypes built: x / y / dy / dx fp32, fp16, bf16; bias / dbias that dtype or fp32.
 * Numerics: fp32 throughout. fp32 data (and fp16/bf16 with FUSEDLOSS_GELU_EXACT16=1): PyTorch's
 * operations, tanhf / erff / expf CUDA's own (no fast-math); the products, sums and fmas are
 * pinned with __fmul_rn / __fadd_rn / __fmaf_rn in exactly the places where nvcc + ptxas
 * contract PyTorch's ActivationGeluKernel.cu expressions (read off the SASS of the same
 * expressions built with CUDA 13.0 for sm_90), so those results are PyTorch's bit for bit on the
 * same toolkit and no compiler flag can change them. fp16/bf16 by default: the fast formulas
 * below (ex2 / rcp, no cancellation; within 1 ulp of the dtype of the exactly rounded GeLU,
 * checked for every 16-bit input by tests/test_gelu.c), 11-18 fp32 instructions per element
 * instead of PyTorch's 22-33, which made the 16-bit kernels instruction-bound (NOTES.md).
 *
 * Work decomposition (fl__gelu_make_plan_ex() in src/common/gelu_validate.c; the same numbers size
 * the workspace): the problem is a matrix of virtual rows x positions. A CTA of tx x ty threads
 * (256) owns a slab of tx 16-byte vectors of positions (grid.x) times a block of rpb virtual
 * rows (grid.y); each thread keeps its vector's columns fixed for all its rows, so the bias
 * sits in registers and the dbias partial sums do too. Three layouts ("paths"):
 *   ROWS   every row of every matrix starts 16-byte aligned: virtual row = row; vector loads
 *          and stores (LDG.E.128 / STG.E.128); a row whose F is not a multiple of the vector
 *          width ends in one masked vector.
 *   FLAT   contiguous matrices (ld == F) whose rows are not 16-byte aligned (odd F): a
 *          virtual row is G = 16 / gcd(F * esize, 16) real rows (G*F elements, a multiple of
 *          the vector width, starting aligned), so odd F is streamed with full vectors as
 *          well; the column of position p is p mod F.
 *   SCALAR anything else (misaligned views, mixed strides): one element per access.
 * Without dbias, contiguous inputs (ROWS or FLAT with ld == F; with a bias also F a multiple of
 * the vector width) take the STREAM path instead (gelu_stream_kernel): one flat array, a tile of
 * 256 x U vectors per CTA (U = 2; 4 for the 16-bit erf forward), no row structure at all
 * (FUSEDLOSS_GELU_STREAM=0: off).
 * Each thread has FL__GELU_UNROLL rows' vectors of every input in flight (all loads issued
 * before any use; streaming cache hints, as everything is touched once).
 *
 * dbias (deterministic, never re-reads x or dy): each thread sums its rows in order in fp32
 * registers; the CTA adds its ty partials in order (shared memory) and writes one fp32 partial
 * per position for its row block into the workspace; then
 *   ROWS (rows a multiple of 4 positions; the default): a second small kernel, launched with
 *          programmatic dependent launch so its launch overlaps the main kernel's tail, adds the
 *          nb partials of each column in a fixed order (finish 4). The main kernel's CTAs just
 *          write their partials and exit: no fence, no counter (a fence waits for the CTA's
 *          gradient stores to drain). The fp32 tanh backward cuts its rows into short blocks
 *          (~32 rows, up to 256 blocks: many waves of CTAs), the others into one wave of long
 *          blocks (FUSEDLOSS_GELU_DBIAS_RPB; the measurements are at the knob);
 *   ROWS with other widths, SCALAR, or FUSEDLOSS_GELU_DBIAS_SUM=0: the last CTA of each slab to
 *          finish (a per-slab counter in the workspace, atomicAdd after a __threadfence) adds the
 *          slab's nb partials in row-block order, writes dbias and resets the counter to 0;
 *   FLAT (a column's positions lie in several slabs) or > 1024 slabs: a second small kernel
 *          adds, for each column, the nb x G partials in a fixed order.
 * The order depends only on (N, F, dtype, approx, path), so dbias has the same bits on every run.
 * Launches per call: forward 1; backward 1 without dbias, 2 with it (1 on the counter paths);
 * N == 0 with dbias: one cudaMemsetAsync. No allocation, no host sync, everything on `stream`:
 * graph-capturable.
 * Cache policy: default-cached or evict-first (.cs) accesses per kernel, see gelu_cs().
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <stdlib.h>

#include "../internal.h"
#include "common.cuh"
#include "cluster.cuh"  // pdl_trigger / pdl_wait / set_pdl, dev_info



// ---------------------------------------------------------------------------------------------
// device helpers

// PyTorch's opmath constants, bit for bit (see src/cpu/gelu.c)
#define GELU_KB 0x1.988454p-1f   // float(sqrt(2) * 2/sqrt(pi) * 0.5)
#define GELU_KK 0x1.6e4e26p-5f   // 0.044715f
#define GELU_K3K 0x1.12ba9cp-3f  // 3.0f * 0.044715f, folded in float
#define GELU_KA 0x1.6a09e6p-1f   // float(1/sqrt(2))
#define GELU_KC 0x1.988454p-2f   // float(2/sqrt(pi) * 1/sqrt(2) * 0.5)

struct GeluArgs {
    void* out;             // y (forward) or dx (backward)
    const void* x;
    const void* dy;
    const void* bias;
    void* dbias;
    int bias_f32;          // bias / dbias are fp32 (else the activation dtype)
    int bias_dt;           // fl_dtype of bias / dbias
    int64_t rows;          // virtual rows
    int64_t width;         // positions of a full virtual row
    int64_t last;          // positions of the last virtual row
    int64_t F;
    int64_t ld_out, ld_x, ld_dy;  // elements between consecutive virtual rows
    int64_t rpb;           // virtual rows per row block
    float* part;           // workspace: [nb][width] fp32 dbias partials
    unsigned* counters;    // workspace: [slabs] arrival counters (zero between calls)
    int finish;            // 0 none, 1 last CTA per slab, 2 separate kernel, 4 separate kernel (PDL)
    int hint;              // load cache hint (load_full)
};


// V elements of T: one 16-byte access when sizeof(T) * V == 16, else V == 1 (scalar path)
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
    T v[V];
};

// MODE: 0 forward, 1 forward + bias, 2 backward, 3 backward + bias (no dbias),
//       4 backward + bias + dbias
enum { M_FWD = 0, M_FWD_BIAS = 1, M_BWD = 2, M_BWD_BIAS = 3, M_BWD_DBIAS = 4 };

// Cache policy of the 16-byte accesses, fixed per kernel at compile time (CS: ld/st.global.cs,
// evict-first; else default-cached), from a same-run A/B of the two for every kernel (H200
// 2026-12-04 s12 run 2, x floor, .cs -> default): the backward kernels (two reads, one write) all
// stream better default-cached (8192x16384 bf16 bwd 1.073 -> 1.031, with dbias 1.135 -> 1.068, fp32
// bwd 1.039 -> 0.985; 8192x3072 bf16 bwd 1.21 -> 1.17); the forward goes either way by kernel,
// consistently in two alternations: default-cached for the 16-bit erf (8192x16384 1.102 -> 1.080)
// and fp32 tanh (1.048 -> 1.019) forwards, evict-first for the 16-bit tanh (1.084 vs 1.143) and
// fp32 erf (1.056 vs 1.103) ones. Why the forward flips with the formula was not found.
template <typename T, int MODE, int A>
__device__ __forceinline__ constexpr bool gelu_cs() {
    return MODE < M_BWD && (sizeof(T) == 2 ? A == FL_GELU_TANH : A == FL_GELU_NONE);
}

// hint: unused. A runtime choice of ld.global.cs / .nc.L1::no_allocate / plain here (uniform
// branch per load) raised the bf16 forward from 46 to 90+ registers (ptxas, CUDA 13, sm_90): rejected.
template <typename T, int V, bool CS>
__device__ __forceinline__ Vec<T, V> load_full(const T* p, int hint) {
    Vec<T, V> r;
    if constexpr (sizeof(T) * V == 16) {
        uint4 u;
        if constexpr (CS) u = __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict first
        else u = *reinterpret_cast<const uint4*>(p);
        r = *reinterpret_cast<Vec<T, V>*>(&u);
    } else {
        static_assert(V == 1, "vector width");
        r.v[0] = p[0];
    }
    return r;
}

template <typename T, int V, bool CS>
__device__ __forceinline__ void store_full(T* p, const Vec<T, V>& r) {
    if constexpr (sizeof(T) * V == 16) {
        if constexpr (CS) __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&r));
        else *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
    } else {
        p[0] = r.v[0];
    }
}

// masked (n < V valid elements): element accesses, zero fill
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_part(const T* p, int n) {
    Vec<T, V> r;
#pragma unroll
    for (int v = 0; v < V; v++) r.v[v] = v < n ? p[v] : from_float<T>(0.0f);
    return r;
}

template <typename T, int V>
__device__ __forceinline__ void store_part(T* p, const Vec<T, V>& r, int n) {
#pragma unroll
    for (int v = 0; v < V; v++)
        if (v < n) p[v] = r.v[v];
}

// y = gelu(u): PyTorch's forward expressions with nvcc's contraction made explicit
template <int A>
__device__ __forceinline__ float gelu_f(float u) {
    if (A == FL_GELU_TANH) {
        const float u3 = __fmul_rn(__fmul_rn(u, u), u);
        const float t = tanhf(__fmul_rn(GELU_KB, __fmaf_rn(GELU_KK, u3, u)));
        return __fmul_rn(__fmul_rn(0.5f, u), __fadd_rn(1.0f, t));
    }
    return __fmul_rn(__fmul_rn(u, 0.5f), __fadd_rn(1.0f, erff(__fmul_rn(u, GELU_KA))));
}

// dy * gelu'(u): PyTorch's gelu_backward expressions, contraction explicit
template <int A>
__device__ __forceinline__ float gelu_df(float u, float dy) {
    if (A == FL_GELU_TANH) {
        const float u2 = __fmul_rn(u, u);
        const float u3 = __fmul_rn(u, u2);
        const float t = tanhf(__fmul_rn(GELU_KB, __fmaf_rn(GELU_KK, u3, u)));
        const float id = __fmul_rn(GELU_KB, __fmaf_rn(GELU_K3K, u2, 1.0f));
        const float rd = __fmul_rn(id, __fmul_rn(__fmul_rn(0.5f, u), __fmaf_rn(-t, t, 1.0f)));
        return __fmul_rn(dy, __fmaf_rn(__fadd_rn(1.0f, t), 0.5f, rd));
    }
    const float pdf = __fmul_rn(expf(__fmul_rn(__fmul_rn(u, -0.5f), u)), GELU_KC);
    return __fmul_rn(dy, __fmaf_rn(__fadd_rn(1.0f, erff(__fmul_rn(u, GELU_KA))), 0.5f, __fmul_rn(u, pdf)));
}

// ---- fast 16-bit path (FAST = true: fp16 / bf16 outputs only, the default; see the file comment)
// MUFU.EX2 / MUFU.RCP, pinned: ex2.approx.ftz (rel. error ~2^-22) and rcp.approx.ftz (~1 ulp).
__device__ __forceinline__ float ex2_approx(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
// The constants of the fast formulas; tests/test_gelu.c repeats them (and the operation order) in
// its CPU emulation, which checks every fp16 / bf16 input exhaustively.
#define FG_C1 0x1.26aec2p+1f    // 2 log2(e) kB: z2 = log2(e) * 2v = u (C1 + C1K u^2)
#define FG_C1K 0x1.a5a7d0p-4f   // C1 * kK
#define FG_Q1 0x1.988454p+0f    // 2 kB:  q = d(2v)/du = Q1 + Q3 u^2
#define FG_Q3 0x1.b6676cp-3f    // 2 kB * 3 kK
#define FG_S64 0x1p-64f         // the tail is computed scaled by 2^64 (no ftz underflow before 2^-190)
#define FG_ALPHA 0x1.47ae14p-2f // erf mode, backward: t = 1 / (1 + ALPHA |u|)
#define FG_NH (-0x1.715476p-1f) // -log2(e) / 2
#define FG_C0 0x1.f564dep+5f    // 64 + log2(1 / sqrt(2 pi))
// Mills ratio Phi(-a) / phi(a) = t * M(t), M a fitted polynomial. Forward: 5 terms with t = 1 /
// (1 + ALPHA_F |u|), relative error 2.9e-5 (since 2026-12-02 session 5; the 6 terms at ALPHA
// before, 1.4e-5, cost one more FFMA per element: bf16 erf forward 1.138x -> 1.098x the floor
// with the select below), scaled by 2^-64 (every intermediate stays normal; the 2^64 of phi
// cancels in the product). Backward: 8 terms at ALPHA, 4.7e-7 (its d = phi (a - R) cancels near
// gelu's minimum u = -0.75).
#define FG_ALPHA_F 0x1.810624p-2f
__device__ __forceinline__ float mills_fwd5_s64(float t) {
    float m = -0x1.d26e12p-67f;
    m = __fmaf_rn(m, t, 0x1.fe2486p-66f);
    m = __fmaf_rn(m, t, 0x1.b2dc30p-67f);
    m = __fmaf_rn(m, t, 0x1.95556ap-66f);
    m = __fmaf_rn(m, t, 0x1.7fad4cp-66f);
    return __fmul_rn(m, t);
}
__device__ __forceinline__ float mills_bwd(float t) {
    float m = 0x1.5ffdc4p-4f;
    m = __fmaf_rn(m, t, -0x1.37ce0cp-2f);
    m = __fmaf_rn(m, t, 0x1.0c591cp-2f);
    m = __fmaf_rn(m, t, 0x1.5bfd5ap-5f);
    m = __fmaf_rn(m, t, 0x1.f07abap-3f);
    m = __fmaf_rn(m, t, 0x1.23a28ep-2f);
    m = __fmaf_rn(m, t, 0x1.47ccf0p-2f);
    m = __fmaf_rn(m, t, 0x1.47ade4p-2f);
    return __fmul_rn(m, t);
}

// tanh mode: 0.5 u (1 + tanh(v)) = u sigmoid(2v) exactly; with e = 2^-|z2| (z2 = 2v log2 e) and
// r = 1 / (1 + e): sigmoid(2v) = r for u >= 0, e r for u < 0: no cancellation on either side.
// erf mode: Phi(u) = 1 - Q (u >= 0) or Q (u < 0), Q = Phi(-|u|) = phi(|u|) R(|u|).
// erf: y = u P, P the selected factor (one select, one multiply: +inf -> +inf, -inf -> NaN as
// PyTorch (-inf * 0), NaN -> NaN, -0 -> -0); the 2^-64 that keeps ex2's result off the ftz flush
// is inside the Mills coefficients, and the Mills polynomial has 5 terms (see mills_fwd5_s64).
// (It was one product per sign, selected after them: 2 more instructions per element.)
template <int A>
__device__ __forceinline__ float gelu_f_fast(float u) {
    if (A == FL_GELU_TANH) {
        const float u2 = __fmul_rn(u, u);
        const float z2 = __fmul_rn(__fmaf_rn(FG_C1K, u2, FG_C1), u);
        const float e64 = ex2_approx(__fadd_rn(64.0f, -fabsf(z2)));   // e * 2^64
        // (y = u P here too, e = e64 2^-64 first, measured 1.3% SLOWER: H200 2026-12-02 session 5
        // run 1, 8192x16384 bf16 forward 1.099-1.101x vs 1.086x: one more operation before the rcp)
        const float r = rcp_approx(__fmaf_rn(e64, FG_S64, 1.0f));
        const float yp = __fmul_rn(u, r);
        const float yn = __fmul_rn(__fmul_rn(__fmul_rn(u, e64), r), FG_S64);
        return u >= 0.0f ? yp : yn;   // NaN: yn (NaN); -0: yp = -0
    }
    const float a = fabsf(u);
    const float e0 = ex2_approx(__fmaf_rn(__fmul_rn(a, FG_NH), a, FG_C0));  // phi(a) * 2^64
    const float t = rcp_approx(__fmaf_rn(a, FG_ALPHA_F, 1.0f));
    const float q = __fmul_rn(e0, mills_fwd5_s64(t));                        // Q
    const float P = u >= 0.0f ? __fadd_rn(1.0f, -q) : q;
    return __fmul_rn(u, P);
}

// d = gelu'(u) (times dy). tanh: d = s + u q s (1 - s), s (1 - s) = e r^2, s = r (u >= 0) or
//   e r (u < 0): d = fma(u, q (e r r), s), one formula for both signs (was one per sign, selected
//   afterwards: 80 registers in the dbias kernel, 3 CTAs per SM; now 64, 4 CTAs).
// erf: d = Phi(u) + u phi(u) = 1 + phi (|u| - R) (u >= 0), phi (R - |u|) (u < 0).
template <int A>
__device__ __forceinline__ float gelu_df_fast(float u, float dy) {
    float d;
    if (A == FL_GELU_TANH) {
        const float u2 = __fmul_rn(u, u);
        const float z2 = __fmul_rn(__fmaf_rn(FG_C1K, u2, FG_C1), u);
        const float e64 = ex2_approx(__fadd_rn(64.0f, -fabsf(z2)));
        const float r = rcp_approx(__fmaf_rn(e64, FG_S64, 1.0f));
        // grouped u (q (e r r)): a vanishing e r r times a finite q gives 0 (u q overflows from
        // |u| ~ 1e13: inf * 0); PyTorch is finite up to |u| ~ 1.8e19, where its u*u overflows and
        // it, like this, gives NaN
        const float q = __fmaf_rn(FG_Q3, u2, FG_Q1);
        const float er = __fmul_rn(__fmul_rn(e64, FG_S64), r);   // e r (e * 2^64 * 2^-64: exact)
        const float sg = u >= 0.0f ? r : er;                      // sigmoid(2v)
        d = __fmaf_rn(u, __fmul_rn(q, __fmul_rn(er, r)), sg);
    } else {
        const float a = fabsf(u);
        const float t = rcp_approx(__fmaf_rn(a, FG_ALPHA, 1.0f));
        const float R = mills_bwd(t);
        const float e0 = ex2_approx(__fmaf_rn(__fmul_rn(a, FG_NH), a, FG_C0));
        const float eD = __fmul_rn(e0, __fadd_rn(a, -R));
        d = u >= 0.0f ? __fmaf_rn(eD, FG_S64, 1.0f) : __fmul_rn(eD, -FG_S64);
    }
    return __fmul_rn(dy, d);
}

__device__ __forceinline__ void store_bias_dt(void* dbias, int dt, int64_t j, float s) {
    if (dt == FL_DTYPE_F32) ((float*)dbias)[j] = s;
    else if (dt == FL_DTYPE_F16) ((__half*)dbias)[j] = __float2half_rn(s);
    else ((__nv_bfloat16*)dbias)[j] = __float2bfloat16_rn(s);
}

// One vector of one row: u = x (+ b) in fp32 (not rounded: see the header), the activation or
// its gradient, rounded once. acc += du over the n valid elements (BWD with bias).
// FAST: the 16-bit formulas above (never instantiated for fp32).
template <typename T, int V, bool BWD, bool BIAS, bool SUM, int A, bool FAST, bool FULL>
__device__ __forceinline__ Vec<T, V> compute_vec(const Vec<T, V>& xv, const Vec<T, V>& gv, const float (&b)[V],
                                                 float (&acc)[V], int n) {
    Vec<T, V> o;
#pragma unroll
    for (int v = 0; v < V; v++) {
        // no "+ 0" without a bias: it would turn gelu(-0) = -0 into +0
        const float u = BIAS ? __fadd_rn(to_float(xv.v[v]), b[v]) : to_float(xv.v[v]);
        float r;
        if (BWD) {
            r = FAST ? gelu_df_fast<A>(u, to_float(gv.v[v])) : gelu_df<A>(u, to_float(gv.v[v]));
            // masked elements (zero-filled) are left out: with an inf/NaN bias 0 * gelu'(b) is NaN
            if (SUM && (FULL || v < n)) acc[v] += r;
        } else {
            r = FAST ? gelu_f_fast<A>(u) : gelu_f<A>(u);
        }
        o.v[v] = from_float<T>(r);
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// kernels

// grid (slabs, nb), block (tx, ty) = 256 threads; see the file comment. U: rows in flight per
// thread. dbias (SUM) with U = 4 is capped at 64 registers: 4 CTAs (32 warps) per SM instead of 3
// at 80 registers; its plan targets one full wave of 4 CTAs on each of 132 SMs.
template <typename T, int V, int MODE, int A, bool FAST, int U>
__device__ __forceinline__ void gelu_body(const GeluArgs& a) {
    constexpr bool BWD = MODE >= M_BWD, BIAS = MODE == M_FWD_BIAS || MODE >= M_BWD_BIAS, SUM = MODE == M_BWD_DBIAS;
    constexpr bool CS = gelu_cs<T, MODE, A>();
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    const int TX = (int)blockDim.x, TY = (int)blockDim.y;
    const int64_t slab = blockIdx.x, rbk = blockIdx.y;
    const int64_t p0 = (slab * TX + tx) * V;  // first position of this thread's vector (64-bit)
    const bool active = p0 < a.width;
    const bool full_col = p0 + V <= a.width;  // false only in a ROWS row's masked last vector
    const bool full_last = p0 + V <= a.last;  // the last virtual row may be shorter (FLAT)

    // bias of this thread's V columns, fixed for all its rows: c = p mod F (one 64-bit modulo)
    float b[V];
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; v++) { b[v] = 0.0f; acc[v] = 0.0f; }
    if (BIAS && active) {
        int64_t c = p0 % a.F;
#pragma unroll
        for (int v = 0; v < V; v++) {
            if (p0 + v < a.width)
                b[v] = a.bias_f32 ? __ldg((const float*)a.bias + c) : to_float(((const T*)a.bias)[c]);
            if (++c == a.F) c = 0;
        }
    }

    const T* xb = (const T*)a.x + p0;
    const T* gb = BWD ? (const T*)a.dy + p0 : nullptr;
    T* ob = (T*)a.out + p0;
    const int64_t m_begin = rbk * a.rpb;
    const int64_t m_end = m_begin + a.rpb < a.rows ? m_begin + a.rpb : a.rows;
    const int hint = a.hint;

    for (int64_t m0 = m_begin + ty; m0 < m_end; m0 += (int64_t)TY * U) {
        const int64_t m_hi = m0 + (int64_t)(U - 1) * TY;  // last row of this step
        if (active && full_col && m_hi < m_end && (m_hi < a.rows - 1 || full_last)) {
            // fast path: U full, aligned vectors per input, all loads issued before any use
            Vec<T, V> xv[U], gv[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t m = m0 + (int64_t)u * TY;  // 64-bit: m * ld exceeds 2^31 for big N*F
                xv[u] = load_full<T, V, CS>(xb + m * a.ld_x, hint);
                if (BWD) gv[u] = load_full<T, V, CS>(gb + m * a.ld_dy, hint);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t m = m0 + (int64_t)u * TY;
                // in place (out == x or dy): this thread read these elements above
                store_full<T, V, CS>(ob + m * a.ld_out,
                                 compute_vec<T, V, BWD, BIAS, SUM, A, FAST, true>(xv[u], gv[u], b, acc, V));
            }
        } else if (active) {
            // block tail, masked last vector of a row, or the short last virtual row: one row at a time
            for (int u = 0; u < U; u++) {
                const int64_t m = m0 + (int64_t)u * TY;
                if (m >= m_end) break;
                const int64_t L = m == a.rows - 1 ? a.last : a.width;
                const int n = p0 + V <= L ? V : (p0 < L ? (int)(L - p0) : 0);
                if (n == 0) continue;
                Vec<T, V> xv = load_part<T, V>(xb + m * a.ld_x, n), gv;
                if (BWD) gv = load_part<T, V>(gb + m * a.ld_dy, n);
                store_part<T, V>(ob + m * a.ld_out,
                                 compute_vec<T, V, BWD, BIAS, SUM, A, FAST, false>(xv, gv, b, acc, n), n);
            }
        }
    }

    if constexpr (SUM) {
        // CTA partial of each position: the ty rows of threads added in order (deterministic)
        __shared__ __align__(16) float red[256 * V > 1024 ? 256 * V : 1024];  // >= 256 float4: the finish
        __shared__ unsigned s_last;
        const int tid = ty * TX + tx, nthr = TX * TY, np = TX * V;
#pragma unroll
        for (int v = 0; v < V; v++) red[ty * np + tx * V + v] = acc[v];
        __syncthreads();  // why: every thread's sums in shared memory before the column sums
        const int64_t pbase = slab * np;
        for (int i = tid; i < np; i += nthr) {
            float s = red[i];
            for (int k = 1; k < TY; k++) s += red[k * np + i];
            if (pbase + i < a.width) a.part[rbk * a.width + pbase + i] = s;
        }
        if (a.finish == 1) {
            __threadfence();  // why: this CTA's partials visible device-wide before its arrival counts
            __syncthreads();  // why: all threads' partials stored and fenced before thread 0 signals
            if (tid == 0) s_last = atomicAdd(a.counters + slab, 1u) == gridDim.y - 1;
            __syncthreads();  // why: the verdict to every thread
            if (s_last) {
                __threadfence();  // why: acquire side of the counter; the loads below go to L2 (ldcg)
                // The slab's np positions x nb row-block partials: every thread of the CTA takes
                // part (was: one thread per position, nb dependent loads each, on the critical
                // path at the end of the kernel). W positions per access (16-byte loads when the
                // partial rows are 16-byte aligned: width % 4 == 0); the nq = np / W column
                // vectors x G = nthr / nq row groups; group g adds row blocks g, g + G, ... in
                // order, then the G group sums are added in group order: fixed by the plan.
                const int nb = (int)gridDim.y;
                const float* q0 = a.part + pbase;
                if ((a.width & 3) == 0) {
                    const int nq = np / 4, G = nthr / nq > 0 ? nthr / nq : 1;
                    float4* red4 = reinterpret_cast<float4*>(red);  // G * nq <= nthr float4 <= sizeof red
                    for (int i = tid; i < G * nq; i += nthr) {
                        const int col = i % nq, g = i / nq;
                        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        if (pbase + 4 * col < a.F) {
                            const float4* q = reinterpret_cast<const float4*>(q0 + 4 * col);
#pragma unroll 4
                            for (int r = g; r < nb; r += G) {
                                const float4 w = __ldcg(q + (int64_t)r * (a.width / 4));
                                s.x += w.x; s.y += w.y; s.z += w.z; s.w += w.w;
                            }
                        }
                        red4[g * nq + col] = s;
                    }
                    __syncthreads();  // why: the G group sums of every column vector visible
                    for (int col = tid; col < nq; col += nthr) {
                        float4 s = red4[col];
                        for (int g = 1; g < G; g++) {
                            const float4 w = red4[g * nq + col];
                            s.x += w.x; s.y += w.y; s.z += w.z; s.w += w.w;
                        }
                        const int64_t p = pbase + 4 * col;  // ROWS / SCALAR: position == column
                        if (p < a.F) store_bias_dt(a.dbias, a.bias_dt, p, s.x);
                        if (p + 1 < a.F) store_bias_dt(a.dbias, a.bias_dt, p + 1, s.y);
                        if (p + 2 < a.F) store_bias_dt(a.dbias, a.bias_dt, p + 2, s.z);
                        if (p + 3 < a.F) store_bias_dt(a.dbias, a.bias_dt, p + 3, s.w);
                    }
                } else {
                    const int G = nthr / np > 0 ? nthr / np : 1;
                    for (int i = tid; i < G * np; i += nthr) {
                        const int col = i % np, g = i / np;
                        float s = 0.0f;
                        if (pbase + col < a.F) {
#pragma unroll 4
                            for (int r = g; r < nb; r += G) s += __ldcg(q0 + col + (int64_t)r * a.width);
                        }
                        red[g * np + col] = s;
                    }
                    __syncthreads();  // why: the G group sums of every column visible
                    for (int col = tid; col < np; col += nthr) {
                        float s = red[col];
                        for (int g = 1; g < G; g++) s += red[g * np + col];
                        if (pbase + col < a.F) store_bias_dt(a.dbias, a.bias_dt, pbase + col, s);
                    }
                }
                if (tid == 0) a.counters[slab] = 0u;  // leave the counter as found: zero
            }
        }
        if (a.finish == 4) pdl_trigger();  // the sum kernel (launched with PDL) may start: it waits for this grid
    }
}

// Without dbias: no minimum-blocks bound. Measured from ptxas (CUDA 13, sm_90): with
// __launch_bounds__(256, 1) ptxas takes 90-160 registers for the same code (it may), with (256, 5)
// it spills; plain (256) gives 37-64 registers, as the first cut.
template <typename T, int V, int MODE, int A, bool FAST, int U>
__global__ void __launch_bounds__(256) gelu_kernel(const GeluArgs a) {
    gelu_body<T, V, MODE, A, FAST, U>(a);
}
// With dbias: 4 CTAs (32 warps) per SM, 64 registers, where ptxas does that without spilling
// (fast 16-bit math at 2 rows in flight). Elsewhere (exact 16-bit, fp32, or 4 rows)
// the plain bound (ptxas spilled 4-8 bytes at 64 or even 80 registers there): gelu_kernel.
template <typename T, int V, int MODE, int A, bool FAST, int U>
__global__ void __launch_bounds__(256, 4)
    gelu_dbias_kernel(const GeluArgs a) {
    gelu_body<T, V, MODE, A, FAST, U>(a);
}

// finish 4 (short row blocks; position == column, F % 4 == 0): dbias[c] = the nb partials of
// column c added in a fixed order: thread (x, y) of an (8, 32) CTA adds rows y, y + 32, ... of the
// float4 column vector 8 b + x, then thread row 0 adds the 32 sums in y order. Launched with PDL
// right after the main kernel: it waits for that grid (its memory visible) before any access.
__global__ void __launch_bounds__(256) gelu_dbias_sum4_kernel(const float* part, void* dbias, int bias_dt,
                                                             int64_t F, int nb) {
    pdl_wait();
    __shared__ float4 red[32][8];
    const int x = (int)threadIdx.x, y = (int)threadIdx.y;
    const int64_t cv = (int64_t)blockIdx.x * 8 + x;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (cv * 4 < F) {
        const float4* q = reinterpret_cast<const float4*>(part) + cv;
        const int64_t st = F / 4;
#pragma unroll 4
        for (int r = y; r < nb; r += 32) {
            const float4 w = __ldcg(q + (int64_t)r * st);
            s.x += w.x; s.y += w.y; s.z += w.z; s.w += w.w;
        }
    }
    red[y][x] = s;
    __syncthreads();  // why: the 32 row-group sums of every column vector visible to thread row 0
    if (y == 0 && cv * 4 < F) {
        float4 t = red[0][x];
        for (int k = 1; k < 32; k++) {
            const float4 w = red[k][x];
            t.x += w.x; t.y += w.y; t.z += w.z; t.w += w.w;
        }
        store_bias_dt(dbias, bias_dt, 4 * cv, t.x);
        store_bias_dt(dbias, bias_dt, 4 * cv + 1, t.y);
        store_bias_dt(dbias, bias_dt, 4 * cv + 2, t.z);
        store_bias_dt(dbias, bias_dt, 4 * cv + 3, t.w);
    }
}

// FLAT path (or > 1024 slabs): dbias[c] = sum over the nb x G partials of column c, in the fixed
// order j = r*G + k (row block r, sub-row k), split over 8 threads by j mod 8 and combined in
// order. grid ceil(F/32), block (32, 8): a warp reads 32 consecutive columns (coalesced).
__global__ void __launch_bounds__(256) gelu_dbias_finish_kernel(const float* part, void* dbias, int bias_dt,
                                                                int64_t F, int64_t width, int64_t nb, int group) {
    __shared__ float red[8][33];
    const int lane = (int)threadIdx.x, ky = (int)threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * 32 + lane;
    float s = 0.0f;
    if (c < F) {
        const int64_t nj = nb * group;
        for (int64_t j = ky; j < nj; j += 8) {
            const int64_t r = j / group, k = j - r * group;
            s += __ldcg(part + r * width + k * F + c);
        }
    }
    red[ky][lane] = s;
    __syncthreads();  // why: the 8 partial sums of each column visible to thread row 0
    if (ky == 0 && c < F) {
        float t = red[0][lane];
        for (int k = 1; k < 8; k++) t += red[k][lane];
        store_bias_dt(dbias, bias_dt, c, t);
    }
}

// STREAM path (no dbias; x, dy and out contiguous and 16-byte aligned; with a bias also F a
// multiple of the vector width and the bias 16-byte aligned): the matrices are one flat array of
// n = N * F elements in 16-byte vectors. A grid of G CTAs strides over it: in iteration it,
// thread t of CTA b takes the U vectors it * U * S + k * S + b * 256 + t (k < U, S = 256 G): a
// warp's access is 512 contiguous bytes, a CTA's 4 KB. By default G = ceil(nvec / (256 U)): one
// iteration per CTA, the hardware scheduler keeping every SM full (a persistent grid of one or
// two waves of resident CTAs measured 5-7% slower, run 4); the interleaved slots make the last
// CTAs' share a few vectors per thread instead of whole idle CTAs. The bias vector of a vector's columns is read from L1 / L2 (the bias is F elements,
// reused by every row); its column-vector index cv moves by S mod (F / V) from one of the
// thread's vectors to the next (s.stepk) and by U S mod (F / V) per iteration (s.stepi). The
// n mod V elements after the last full vector are done by the last CTA, one per thread.
struct GeluStream {
    void* out;
    const void* x;
    const void* dy;
    const void* bias;
    int bias_f32;
    int64_t n;       // elements
    int64_t nvec;    // full vectors: n / V
    unsigned fv;     // F / V (bias only)
    unsigned stepk;  // (256 G) mod fv
    unsigned stepi;  // (U 256 G) mod fv
};

template <typename T, int V>
__device__ __forceinline__ void load_bias_vec(const GeluStream& s, unsigned cv, float (&b)[V]) {
    if (s.bias_f32) {
        const float4* p = reinterpret_cast<const float4*>((const float*)s.bias + (size_t)cv * V);
#pragma unroll
        for (int k = 0; k < V / 4; k++) {
            const float4 w = __ldg(p + k);
            b[4 * k] = w.x; b[4 * k + 1] = w.y; b[4 * k + 2] = w.z; b[4 * k + 3] = w.w;
        }
    } else {
        const Vec<T, V> w = *reinterpret_cast<const Vec<T, V>*>((const T*)s.bias + (size_t)cv * V);
#pragma unroll
        for (int v = 0; v < V; v++) b[v] = to_float(w.v[v]);
    }
}

__device__ __forceinline__ unsigned add_mod(unsigned c, unsigned step, unsigned m) {
    c += step;  // c, step < m <= 2^31: no overflow
    return c >= m ? c - m : c;
}

template <typename T, int V, int MODE, int A, bool FAST, int U>
__global__ void __launch_bounds__(256) gelu_stream_kernel(const GeluStream s) {
    constexpr bool BWD = MODE >= M_BWD, BIAS = MODE == M_FWD_BIAS || MODE == M_BWD_BIAS;
    constexpr bool CS = gelu_cs<T, MODE, A>();
    static_assert(MODE != M_BWD_DBIAS && V > 1, "the stream path has no dbias and no scalar width");
    const int tid = (int)threadIdx.x;
    const T* xb = (const T*)s.x;
    const T* gb = (const T*)s.dy;
    T* ob = (T*)s.out;
    float acc[V];  // unused (no dbias); compute_vec's signature
    const int64_t S = (int64_t)gridDim.x * 256;
    const int64_t v_first = (int64_t)blockIdx.x * 256 + tid;
    unsigned cv0 = 0u;  // column vector of this thread's first vector of the iteration
    if (BIAS) cv0 = (unsigned)((uint64_t)v_first % s.fv);
    for (int64_t v0 = v_first; v0 < s.nvec; v0 += S * U) {
        unsigned cv = cv0;
        if (BIAS) cv0 = add_mod(cv0, s.stepi, s.fv);
        if (v0 + (int64_t)(U - 1) * S < s.nvec) {
            Vec<T, V> xv[U], gv[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                xv[u] = load_full<T, V, CS>(xb + (v0 + S * u) * V, 0);
                if (BWD) gv[u] = load_full<T, V, CS>(gb + (v0 + S * u) * V, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                float b[V];
                if (BIAS) {
                    load_bias_vec<T, V>(s, cv, b);
                    cv = add_mod(cv, s.stepk, s.fv);
                }
                // in place (out == x or dy): this thread read these elements above
                store_full<T, V, CS>(ob + (v0 + S * u) * V,
                                 compute_vec<T, V, BWD, BIAS, false, A, FAST, true>(xv[u], gv[u], b, acc, V));
            }
        } else {  // the last iteration: 0..U-1 of this thread's slots are in range
            for (int u = 0; u < U; u++) {
                const int64_t v = v0 + S * u;
                if (v >= s.nvec) break;
                float b[V];
                if (BIAS) {
                    load_bias_vec<T, V>(s, cv, b);
                    cv = add_mod(cv, s.stepk, s.fv);
                }
                Vec<T, V> xv = load_full<T, V, CS>(xb + v * V, 0), gv;
                if (BWD) gv = load_full<T, V, CS>(gb + v * V, 0);
                store_full<T, V, CS>(ob + v * V, compute_vec<T, V, BWD, BIAS, false, A, FAST, true>(xv, gv, b, acc, V));
            }
        }
    }
    // the last n mod V elements (no bias here: with a bias F is a multiple of V, so is n)
    if (blockIdx.x == gridDim.x - 1) {
        const int64_t e = s.nvec * V + tid;
        if (tid < V && e < s.n) {
            Vec<T, 1> xv, gv;
            xv.v[0] = xb[e];
            if (BWD) gv.v[0] = gb[e];
            float b1[1] = {0.0f}, a1[1];
            ob[e] = compute_vec<T, 1, BWD, false, false, A, FAST, true>(xv, gv, b1, a1, 1).v[0];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// launchers

static fl__gelu_path choose_path(int64_t N, int64_t F, size_t es, const void* const* ptrs, const int64_t* lds,
                                 int n) {
    int aligned = 1, rows_aligned = 1, contiguous = 1;
    for (int k = 0; k < n; k++) {
        if ((uintptr_t)ptrs[k] & 15u) aligned = 0;
        if (((size_t)lds[k] * es) & 15u) rows_aligned = 0;
        if (lds[k] != F) contiguous = 0;
    }
    if (aligned && (rows_aligned || N <= 1)) return FL__GELU_ROWS;
    if (aligned && contiguous) return FL__GELU_FLAT;
    return FL__GELU_SCALAR;
}

// Environment knobs, read once (first call; C++ static initialisation is thread-safe). For A/B
// runs of bench/bench_gelu; the defaults are what ships. Invalid values fall back to the default.
//   FUSEDLOSS_GELU_EXACT16=0|1    fp16/bf16: 0 = the fast formulas (default since 2026-12-02: H200
//                                 runs 1-2, 8192x16384 bf16 tanh forward 1.19x -> 1.06-1.09x, with
//                                 dbias 1.23x -> 1.13x), 1 = the exact fp32 PyTorch operations
//                                 (bitwise eager PyTorch on the same toolkit)
//   FUSEDLOSS_GELU_ROWS=4|8       rows in flight per thread, vector paths, no dbias (default 4)
//   FUSEDLOSS_GELU_DBIAS_ROWS=1|2|4 the same with dbias (default 2 for fp16/bf16: 64 registers with
//                                 4 rows spill; 2 rows x 2 inputs x 16 B x 1024 threads = 64 KiB in
//                                 flight per SM is still ~2x what Little's law asks at 4.8 TB/s; fp32: 4)
//   FUSEDLOSS_GELU_TX=32|64|128|256  threads along a row in a CTA of 256 (default 32 with dbias, 64 without)
//   FUSEDLOSS_GELU_GRID_WAVES=W   no dbias: CTAs = W x (resident CTAs per SM x SMs), W in (0, 64] (default 2)
//   FUSEDLOSS_GELU_STREAM=0|1     contiguous inputs without dbias: 1 = the STREAM path (default),
//                                 0 = the slab path as for everything else (default-cached loads
//                                 and stores instead of the streaming hints measured the same:
//                                 H200 2026-12-02 run 1, not kept)
//   FUSEDLOSS_GELU_STREAM_WAVES=W STREAM grid: W x the resident CTAs, each CTA striding on; 0 =
//                                 one iteration per CTA, ceil(nvec / 1024) CTAs (default: H200
//                                 2026-12-02 run 4, W = 0 / 1 / 2: 8192x3072 f32 forward 1.127 /
//                                 1.199 / 1.200x, 8192x16384 f32 1.064 / 1.116 / 1.113x)
//   FUSEDLOSS_GELU_STREAM_U=1|2|4 STREAM path: 16-byte vectors per input per thread (a CTA's tile is
//                                 256 U vectors). Default: 4 for the 16-bit erf forward (the most
//                                 arithmetic per byte), else 2. H200 2026-12-04 s11 run 2, U = 4 / 1 / 2,
//                                 x floor: 8192x3072 bf16 tanh fwd 1.295 / 1.342 / 1.254, f32 1.161 /
//                                 1.156 / 1.150; 8192x16384 f32 fwd 1.058 / 1.069 / 1.048, bf16 tanh
//                                 1.081 / 1.170 / 1.082, bf16 erf fwd 1.102 / 1.202 / 1.170
//   FUSEDLOSS_GELU_DBIAS_CTAS=C   with dbias: target CTAs (device-independent: fixes dbias's summation
//                                 order), 1..2048 (default 528 = 4 x 132 SMs: one full wave on an H200)
//   FUSEDLOSS_GELU_DBIAS_RPB=R    with dbias (vector ROWS path): 0 = the plan above (long row blocks,
//                                 one wave, the last CTA of a slab sums all its partials); R in
//                                 1..256 = short row blocks of ~R rows (<= 256 blocks), many waves,
//                                 their partials summed by a second kernel launched with PDL (finish 4).
//                                 Default: 32 for the fp32 tanh backward, else 0. H200 2026-12-04 s12
//                                 run 2 (default-cached accesses), bwd_dbias x floor, R = 0 / 32:
//                                 8192x3072 f32 tanh 1.19 / 1.136, erf 1.145 / 1.197; 8192x16384 f32
//                                 tanh 1.073 / 1.024, erf 1.030 / 1.096; bf16 tanh 1.068 / 1.207, 8192x3072
//                                 1.304 / 1.427 (the 16-bit kernels: R = 16..128 all worse, run 1-2).
//                                 An in-kernel two-level finish over short blocks (a fence + counter per
//                                 CTA) measured 1.6x at 8192x3072 bf16 (run 1): the fence waits for
//                                 the CTA's gradient stores to drain.
//   FUSEDLOSS_GELU_DBIAS_SUM=0|1  1 (default): the long-block plan's partials summed by the PDL kernel
//                                 (finish 4) instead of by the last CTA of each slab (finish 1: a fence
//                                 and a counter per CTA); H200 2026-12-04 s12 run 5, bwd_dbias x floor,
//                                 0 / 1 in 3 alternations: 8192x3072 bf16 tanh 1.303-1.315 / 1.279-1.282,
//                                 erf 1.301-1.310 / 1.272-1.280, f32 erf 1.143-1.149 / 1.138-1.139;
//                                 8192x16384 equal or better (bf16 tanh 1.066-1.069 / 1.064-1.066)
struct GeluKnobs {
    int exact16, unroll, dbias_rows, tx_dbias, tx_plain, dbias_ctas, dbias_rpb, dbias_sum, ldhint, stream, stream_u;
    double waves, stream_waves;
};
static long env_long(const char* name, long dflt, long lo, long hi) {
    const char* s = getenv(name);
    if (!s || !*s) return dflt;
    char* end;
    const long v = strtol(s, &end, 10);
    return (*end || v < lo || v > hi) ? dflt : v;
}
static GeluKnobs read_knobs() {
    GeluKnobs k;
    k.exact16 = (int)env_long("FUSEDLOSS_GELU_EXACT16", 0, 0, 1);
    k.unroll = (int)env_long("FUSEDLOSS_GELU_ROWS", 4, 4, 8);
    if (k.unroll != 4 && k.unroll != 8) k.unroll = 4;
    k.dbias_rows = (int)env_long("FUSEDLOSS_GELU_DBIAS_ROWS", 0, 1, 4);
    if (k.dbias_rows == 3) k.dbias_rows = 0;  // 0: per dtype (below)
    const long tx = env_long("FUSEDLOSS_GELU_TX", 0, 32, 256);
    const int txok = tx == 32 || tx == 64 || tx == 128 || tx == 256;
    k.tx_dbias = txok ? (int)tx : 32;
    k.tx_plain = txok ? (int)tx : 64;
    k.dbias_ctas = (int)env_long("FUSEDLOSS_GELU_DBIAS_CTAS", 528, 1, FL__GELU_DBIAS_CTAS_MAX);
    k.dbias_rpb = (int)env_long("FUSEDLOSS_GELU_DBIAS_RPB", -1, 0, FL__GELU_DBIAS_RPB_MAX);  // -1: per kernel
    k.dbias_sum = (int)env_long("FUSEDLOSS_GELU_DBIAS_SUM", 1, 0, 1);
    k.ldhint = (int)env_long("FUSEDLOSS_GELU_LDHINT", 0, 0, 2);
    k.stream = (int)env_long("FUSEDLOSS_GELU_STREAM", 1, 0, 1);
    k.stream_u = (int)env_long("FUSEDLOSS_GELU_STREAM_U", 0, 1, 4);   // 0: per kernel (below)
    if (k.stream_u == 3) k.stream_u = 0;
    k.stream_waves = 0.0;
    const char* sw = getenv("FUSEDLOSS_GELU_STREAM_WAVES");
    if (sw && *sw) {
        char* end;
        const double v = strtod(sw, &end);
        if (!*end && v >= 0.0 && v <= 64.0) k.stream_waves = v;
    }
    k.waves = 2.0;
    const char* w = getenv("FUSEDLOSS_GELU_GRID_WAVES");
    if (w && *w) {
        char* end;
        const double v = strtod(w, &end);
        if (!*end && v > 0.0 && v <= 64.0) k.waves = v;
    }
    return k;
}
static const GeluKnobs& knobs() {
    static const GeluKnobs k = read_knobs();
    return k;
}

// A kernel and its occupancy (resident CTAs of 256 threads per SM), cached per instantiation.
struct KSel {
    const void* fn;
    int* occ;
};
template <typename T, int V, int MODE, int A, bool FAST, int U>
static KSel ksel_u() {
    static int occ = 0;  // benign race: every writer stores the same value
    KSel k = {nullptr, &occ};
    // fast 16-bit math at 2 rows in flight: 64 registers, no spill (ptxas, CUDA 13, sm_80 and sm_90;
    // the fast tanh backward needed 80 under a (256, 3) bound before its one-formula form)
    if constexpr (MODE == M_BWD_DBIAS && FAST && U == 2)
        k.fn = (const void*)gelu_dbias_kernel<T, V, MODE, A, FAST, U>;
    else
        k.fn = (const void*)gelu_kernel<T, V, MODE, A, FAST, U>;
    return k;
}
// built: U = 4 everywhere; vector paths also U = 8 without dbias, U = 2 with dbias
template <typename T, int V, int MODE, int A, bool FAST>
static KSel ksel_f(int unroll) {
    if constexpr (V > 1 && MODE != M_BWD_DBIAS) {
        if (unroll == 8) return ksel_u<T, V, MODE, A, FAST, 8>();
    }
    if constexpr (V > 1 && MODE == M_BWD_DBIAS && FAST) {
        if (unroll == 1) return ksel_u<T, V, MODE, A, FAST, 1>();
        return ksel_u<T, V, MODE, A, FAST, 2>();  // 4 rows spill (4-8 bytes) even unbounded: not built
    } else {
        if constexpr (V > 1 && MODE == M_BWD_DBIAS) {
            if (unroll == 1) return ksel_u<T, V, MODE, A, FAST, 1>();
            if (unroll == 2) return ksel_u<T, V, MODE, A, FAST, 2>();
        }
        return ksel_u<T, V, MODE, A, FAST, 4>();
    }
}
template <typename T, int V, int MODE, int A>
static KSel ksel_a(int fast, int unroll) {
    if constexpr (sizeof(T) == 2) {
        if (fast) return ksel_f<T, V, MODE, A, true>(unroll);
    }
    return ksel_f<T, V, MODE, A, false>(unroll);
}
template <typename T, int V, int MODE>
static KSel ksel_m(int approx, int fast, int unroll) {
    return approx == FL_GELU_TANH ? ksel_a<T, V, MODE, FL_GELU_TANH>(fast, unroll)
                                  : ksel_a<T, V, MODE, FL_GELU_NONE>(fast, unroll);
}
template <typename T, int V>
static KSel ksel_v(int mode, int approx, int fast, int unroll) {
    switch (mode) {
        case M_FWD: return ksel_m<T, V, M_FWD>(approx, fast, unroll);
        case M_FWD_BIAS: return ksel_m<T, V, M_FWD_BIAS>(approx, fast, unroll);
        case M_BWD: return ksel_m<T, V, M_BWD>(approx, fast, unroll);
        case M_BWD_BIAS: return ksel_m<T, V, M_BWD_BIAS>(approx, fast, unroll);
        default: return ksel_m<T, V, M_BWD_DBIAS>(approx, fast, unroll);
    }
}
template <typename T>
static KSel ksel_t(int vec, int mode, int approx, int fast, int unroll) {
    if (vec == 1) return ksel_v<T, 1>(mode, approx, fast, unroll);
    return ksel_v<T, 16 / sizeof(T)>(mode, approx, fast, unroll);
}

// STREAM kernels: U (FUSEDLOSS_GELU_STREAM_U: 1, 2 or 4) vectors per input in flight per thread
template <typename T, int MODE, int A, int U, int V = 16 / (int)sizeof(T)>
static KSel stream_fn_a(int fast) {
    static int occ_fast = 0, occ_exact = 0;  // benign race: every writer stores the same value
    if constexpr (sizeof(T) == 2) {
        if (fast) return KSel{(const void*)gelu_stream_kernel<T, V, MODE, A, true, U>, &occ_fast};
    }
    return KSel{(const void*)gelu_stream_kernel<T, V, MODE, A, false, U>, &occ_exact};
}
template <typename T, int MODE, int U>
static KSel stream_fn_m(int approx, int fast) {
    return approx == FL_GELU_TANH ? stream_fn_a<T, MODE, FL_GELU_TANH, U>(fast)
                                  : stream_fn_a<T, MODE, FL_GELU_NONE, U>(fast);
}
template <typename T, int U>
static KSel stream_fn_u(int mode, int approx, int fast) {
    switch (mode) {
        case M_FWD: return stream_fn_m<T, M_FWD, U>(approx, fast);
        case M_FWD_BIAS: return stream_fn_m<T, M_FWD_BIAS, U>(approx, fast);
        case M_BWD: return stream_fn_m<T, M_BWD, U>(approx, fast);
        default: return stream_fn_m<T, M_BWD_BIAS, U>(approx, fast);
    }
}
template <typename T>
static KSel stream_fn(int mode, int approx, int fast, int u) {
    if (u == 1) return stream_fn_u<T, 1>(mode, approx, fast);
    if (u == 2) return stream_fn_u<T, 2>(mode, approx, fast);
    return stream_fn_u<T, 4>(mode, approx, fast);
}

// resident CTAs of 256 threads per SM of k.fn (cached in *k.occ) and this device's SM count
static cudaError_t occupancy(const KSel& k, int* occ, int* sms) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    if (*k.occ == 0) {
        int o = 0;
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, k.fn, 256, 0);
        if (e != cudaSuccess) return e;
        *k.occ = o > 0 ? o : 1;
    }
    *occ = *k.occ;
    return cudaSuccess;
}

// Shared by forward (dy = dbias = NULL) and backward.
static fl_status gelu_cuda(const char* fn, int bwd, void* out, void* dbias, const void* dy, const void* x,
                           const void* bias, int64_t N, int64_t F, int64_t ld_out, int64_t ld_dy,
                           int64_t ld_x, fl_dtype dt, fl_dtype bdt, fl_gelu_approx approx, void* workspace,
                           cudaStream_t stream) {
    const size_t es = fl__dtype_size(dt);
    if (N == 0) {  // nothing to read; an empty column sum is zero
        if (bwd && dbias) FL_CUDA_TRY(cudaMemsetAsync(dbias, 0, (size_t)F * fl__dtype_size(bdt), stream));
        return FL_OK;
    }
    const void* ptrs[3] = {out, x, dy};
    const int64_t lds[3] = {ld_out, ld_x, ld_dy};
    const fl__gelu_path path = choose_path(N, F, es, ptrs, lds, bwd ? 3 : 2);
    const GeluKnobs& kn = knobs();
    const int with_dbias = bwd && dbias != NULL;
    const int mode = !bwd ? (bias ? M_FWD_BIAS : M_FWD) : !bias ? M_BWD : dbias ? M_BWD_DBIAS : M_BWD_BIAS;
    const int vec = path == FL__GELU_SCALAR ? 1 : (int)(16 / es);
    const int fast = dt != FL_DTYPE_F32 && !kn.exact16;

    // STREAM path: contiguous (FLAT, or ROWS with ld == F everywhere), no dbias; with a bias F a
    // multiple of the vector width (a vector's columns are then one aligned bias vector)
    int contiguous = path == FL__GELU_FLAT;
    if (path == FL__GELU_ROWS) {
        contiguous = 1;
        for (int k = 0; k < (bwd ? 3 : 2); k++)
            if (lds[k] != F && N > 1) contiguous = 0;
    }
    if (kn.stream && contiguous && !with_dbias &&
        (!bias || (F % vec == 0 && F / vec <= 0x7fffffff && ((uintptr_t)bias & 15u) == 0))) {
        GeluStream s;
        s.out = out;
        s.x = x;
        s.dy = dy;
        s.bias = bias;
        s.bias_f32 = bias && bdt == FL_DTYPE_F32;
        s.n = N * F;
        s.nvec = s.n / vec;
        s.fv = bias ? (unsigned)(F / vec) : 1u;
        const int su = kn.stream_u ? kn.stream_u : (dt != FL_DTYPE_F32 && approx == FL_GELU_NONE && !bwd) ? 4 : 2;
        KSel ks;
        switch (dt) {
            case FL_DTYPE_F32: ks = stream_fn<float>(mode, approx, 0, su); break;
            case FL_DTYPE_F16: ks = stream_fn<__half>(mode, approx, fast, su); break;
            default: ks = stream_fn<__nv_bfloat16>(mode, approx, fast, su); break;
        }
        // G: ceil(nvec / (256 U)) CTAs, one iteration each (default, stream_waves = 0); else
        // stream_waves x the resident CTAs, at most ceil(nvec / 256)
        const int64_t tiles = (s.nvec + 256 * su - 1) / (256 * su);
        int64_t g = tiles;
        if (kn.stream_waves > 0.0) {
            int occ = 1, sms = 1;
            FL_CUDA_TRY(occupancy(ks, &occ, &sms));
            const int64_t want = (int64_t)(kn.stream_waves * (double)occ * (double)sms + 0.5);
            const int64_t rows = (s.nvec + 255) / 256;
            g = want < rows ? want : rows;
        }
        g = g < 1 ? 1 : g > (1 << 30) ? (1 << 30) : g;
        if (bias) {
            const uint64_t S = (uint64_t)g * 256u;
            s.stepk = (unsigned)(S % s.fv);
            s.stepi = (unsigned)((S * (uint64_t)su) % s.fv);
        } else {
            s.stepk = s.stepi = 0u;
        }
        void* sargs[1] = {(void*)&s};
        FL_CUDA_TRY(cudaLaunchKernel(ks.fn, dim3((unsigned)g), dim3(256), sargs, 0, stream));
        return FL_OK;
    }

    const int unroll = vec == 1 ? 4
                       : !with_dbias ? kn.unroll
                       : kn.dbias_rows ? kn.dbias_rows : (dt == FL_DTYPE_F32 ? 4 : 2);
    KSel k;
    switch (dt) {
        case FL_DTYPE_F32: k = ksel_t<float>(vec, mode, approx, 0, unroll); break;
        case FL_DTYPE_F16: k = ksel_t<__half>(vec, mode, approx, fast, unroll); break;
        default: k = ksel_t<__nv_bfloat16>(vec, mode, approx, fast, unroll); break;
    }
    int64_t target = kn.dbias_ctas;  // dbias: device-independent (the summation order follows the plan)
    if (!with_dbias) {
        // no reduction: size the grid to whole waves of this device
        int occ = 1, sms = 1;
        FL_CUDA_TRY(occupancy(k, &occ, &sms));
        target = (int64_t)(kn.waves * (double)sms * (double)occ + 0.5);
        if (target < 1) target = 1;
    }
    fl__gelu_plan p;
    fl__gelu_make_plan_ex(&p, path, N, F, es, with_dbias, unroll, with_dbias ? kn.tx_dbias : kn.tx_plain, target,
                          !with_dbias ? 0 : kn.dbias_rpb >= 0 ? kn.dbias_rpb : (dt == FL_DTYPE_F32 && approx == FL_GELU_TANH) ? 32 : 0,
                          kn.dbias_sum);
    if (p.slabs > 0x7fffffff || p.nb > 65535)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: F (%lld) too large for the CUDA grid", fn, (long long)F);

    GeluArgs a;
    a.out = out;
    a.x = x;
    a.dy = dy;
    a.bias = bias;
    a.dbias = dbias;
    a.bias_f32 = bias && bdt == FL_DTYPE_F32;
    a.bias_dt = (int)bdt;
    a.rows = p.rows;
    a.width = p.width;
    a.last = p.last;
    a.F = F;
    const int64_t g = p.group;  // FLAT: a virtual row is g real rows of ld == F
    a.ld_out = path == FL__GELU_FLAT ? g * F : ld_out;
    a.ld_x = path == FL__GELU_FLAT ? g * F : ld_x;
    a.ld_dy = path == FL__GELU_FLAT ? g * F : ld_dy;
    a.rpb = p.rpb;
    a.counters = (unsigned*)workspace;
    a.part = workspace ? (float*)((char*)workspace + FL__GELU_COUNTER_BYTES) : nullptr;
    a.finish = p.finish;
    // ld.global.nc needs inputs that nothing writes during the kernel: not in place
    a.hint = (out == x || (bwd && out == dy)) ? 0 : kn.ldhint;

    const dim3 grid((unsigned)p.slabs, (unsigned)p.nb), block((unsigned)p.tx, (unsigned)p.ty);
    void* args[1] = {(void*)&a};
    FL_CUDA_TRY(cudaLaunchKernel(k.fn, grid, block, args, 0, stream));
    if (p.finish == 4) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr;
        cfg.gridDim = dim3((unsigned)((F / 4 + 7) / 8));
        cfg.blockDim = dim3(8, 32);
        cfg.stream = stream;
        DevInfo di;
        FL_CUDA_TRY(dev_info(&di));
        if (di.cc_major >= 9) {  // PDL: the launch overlaps the main kernel's tail
            set_pdl(&attr);
            cfg.attrs = &attr;
            cfg.numAttrs = 1;
        }
        FL_CUDA_TRY(cudaLaunchKernelEx(&cfg, gelu_dbias_sum4_kernel, (const float*)a.part, dbias, (int)bdt, F,
                                       (int)p.nb));
    }
    if (p.finish == 2) {
        gelu_dbias_finish_kernel<<<dim3((unsigned)((F + 31) / 32)), dim3(32, 8), 0, stream>>>(
            a.part, dbias, (int)bdt, F, p.width, p.nb, p.group);
        FL_CUDA_TRY(cudaGetLastError());
    }
    return FL_OK;
}

// ---------------------------------------------------------------------------------------------
// entry points

extern "C" {

fl_status fl_gelu_forward_cuda(void* y, const void* x, const void* bias, int64_t N, int64_t F, int64_t ld_y,
                               int64_t ld_x, fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                               fl_stream stream) {
    static const char* fn = "fl_gelu_forward_cuda";
    fl__clear_error();
    FL_CHECK(fl__gelu_validate(fn, 0, 1, y, NULL, NULL, x, bias, N, F, ld_y, ld_x, ld_x, dtype, bias_dtype,
                               approx, NULL, 0));
    return gelu_cuda(fn, 0, y, NULL, NULL, x, bias, N, F, ld_y, ld_x, ld_x, dtype, bias_dtype, approx, NULL,
                     (cudaStream_t)stream);
}

fl_status fl_gelu_backward_cuda(void* dx, void* dbias, const void* dy, const void* x, const void* bias,
                                int64_t N, int64_t F, int64_t ld_dx, int64_t ld_dy, int64_t ld_x,
                                fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx, void* workspace,
                                size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_gelu_backward_cuda";
    fl__clear_error();
    FL_CHECK(fl__gelu_validate(fn, 1, 1, dx, dbias, dy, x, bias, N, F, ld_dx, ld_dy, ld_x, dtype, bias_dtype,
                               approx, workspace, workspace_bytes));
    return gelu_cuda(fn, 1, dx, dbias, dy, x, bias, N, F, ld_dx, ld_dy, ld_x, dtype, bias_dtype, approx,
                     dbias ? workspace : NULL, (cudaStream_t)stream);
}

}  // extern "C"
