/* gelu.cu — CUDA backend of GeLU (+ bias) forward and backward (+ dbias, fused).
 *
 * Semantics: include/fusedloss.h section 7; the CPU backend src/cpu/gelu.c is the
 * specification and tests/test_gelu_cuda.c checks this file against it.
 * Dtypes built: x / y / dy / dx fp32, fp16, bf16; bias / dbias that dtype or fp32.
 * Numerics: fp32 throughout; tanhf / erff / expf are CUDA's own (no fast-math). The products,
 * sums and fmas are pinned with __fmul_rn / __fadd_rn / __fmaf_rn in exactly the places where
 * nvcc + ptxas contract PyTorch's ActivationGeluKernel.cu expressions (read off the SASS of the
 * same expressions built with CUDA 13.0 for sm_90), so the fp32 results are PyTorch's bit for
 * bit on the same toolkit and no compiler flag can change them.
 *
 * Work decomposition (fl__gelu_make_plan() in src/common/gelu_validate.c; the same numbers size
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
 * Each thread has FL__GELU_UNROLL rows' vectors of every input in flight (all loads issued
 * before any use; streaming cache hints, as everything is touched once).
 *
 * dbias (deterministic, never re-reads x or dy): each thread sums its rows in order in fp32
 * registers; the CTA adds its ty partials in order (shared memory) and writes one fp32 partial
 * per position for its row block into the workspace; then
 *   ROWS / SCALAR: the last CTA of each slab to finish (a per-slab counter in the workspace,
 *          atomicAdd after a __threadfence) adds the slab's nb partials in row-block order,
 *          writes dbias and resets the counter to 0: ONE launch per call;
 *   FLAT (a column's positions lie in several slabs) or > 1024 slabs: a second small kernel
 *          adds, for each column, the nb x G partials in a fixed order.
 * The order depends only on (N, F, dtype, path), so dbias has the same bits on every run.
 * Launches per call: forward 1; backward 1 (+1 for FLAT with dbias); N == 0 with dbias: one
 * cudaMemsetAsync. No allocation, no host sync, everything on `stream`: graph-capturable.
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "../internal.h"

#define FL_CUDA_TRY(expr)                                                                   \
    do {                                                                                    \
        cudaError_t fl__e_ = (expr);                                                        \
        if (fl__e_ != cudaSuccess) {                                                        \
            (void)cudaGetLastError(); /* clear a sticky launch error, as NCCL CUDACHECK */  \
            return fl__fail(FL_ERR_CUDA, "%s: %s (%s:%d)", fn, cudaGetErrorString(fl__e_),  \
                            __FILE__, __LINE__);                                            \
        }                                                                                   \
    } while (0)

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
    int finish;            // 0 none, 1 last CTA per slab, 2 separate kernel
};

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// V elements of T: one 16-byte access when sizeof(T) * V == 16, else V == 1 (scalar path)
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
    T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_full(const T* p) {
    Vec<T, V> r;
    if constexpr (sizeof(T) * V == 16) {
        uint4 u = __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict first
        r = *reinterpret_cast<Vec<T, V>*>(&u);
    } else {
        static_assert(V == 1, "vector width");
        r.v[0] = p[0];
    }
    return r;
}

template <typename T, int V>
__device__ __forceinline__ void store_full(T* p, const Vec<T, V>& r) {
    if constexpr (sizeof(T) * V == 16) {
        __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&r));
    } else {
        p[0] = r.v[0];
    }
}

// masked (n < V valid elements): element accesses, zero fill
template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_part(const T* p, int n) {
    Vec<T, V> r;
#pragma unroll
    for (int v = 0; v < V; v++) r.v[v] = v < n ? p[v] : from_f<T>(0.0f);
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

__device__ __forceinline__ void store_bias_dt(void* dbias, int dt, int64_t j, float s) {
    if (dt == FL_DTYPE_F32) ((float*)dbias)[j] = s;
    else if (dt == FL_DTYPE_F16) ((__half*)dbias)[j] = __float2half_rn(s);
    else ((__nv_bfloat16*)dbias)[j] = __float2bfloat16_rn(s);
}

// One vector of one row: u = x (+ b) in fp32 (not rounded: see the header), the activation or
// its gradient, rounded once. acc += du over the n valid elements (BWD with bias).
template <typename T, int V, bool BWD, bool BIAS, bool SUM, int A, bool FULL>
__device__ __forceinline__ Vec<T, V> compute_vec(const Vec<T, V>& xv, const Vec<T, V>& gv, const float (&b)[V],
                                                 float (&acc)[V], int n) {
    Vec<T, V> o;
#pragma unroll
    for (int v = 0; v < V; v++) {
        // no "+ 0" without a bias: it would turn gelu(-0) = -0 into +0
        const float u = BIAS ? __fadd_rn(to_f(xv.v[v]), b[v]) : to_f(xv.v[v]);
        float r;
        if (BWD) {
            r = gelu_df<A>(u, to_f(gv.v[v]));
            // masked elements (zero-filled) are left out: with an inf/NaN bias 0 * gelu'(b) is NaN
            if (SUM && (FULL || v < n)) acc[v] += r;
        } else {
            r = gelu_f<A>(u);
        }
        o.v[v] = from_f<T>(r);
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// kernels

// MODE: 0 forward, 1 forward + bias, 2 backward, 3 backward + bias (no dbias),
//       4 backward + bias + dbias
enum { M_FWD = 0, M_FWD_BIAS = 1, M_BWD = 2, M_BWD_BIAS = 3, M_BWD_DBIAS = 4 };

// grid (slabs, nb), block (tx, ty) = 256 threads; see the file comment.
template <typename T, int V, int MODE, int A>
__global__ void __launch_bounds__(256) gelu_kernel(const GeluArgs a) {
    constexpr bool BWD = MODE >= M_BWD, BIAS = MODE == M_FWD_BIAS || MODE >= M_BWD_BIAS, SUM = MODE == M_BWD_DBIAS;
    constexpr int U = FL__GELU_UNROLL;
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
                b[v] = a.bias_f32 ? __ldg((const float*)a.bias + c) : to_f(((const T*)a.bias)[c]);
            if (++c == a.F) c = 0;
        }
    }

    const T* xb = (const T*)a.x + p0;
    const T* gb = BWD ? (const T*)a.dy + p0 : nullptr;
    T* ob = (T*)a.out + p0;
    const int64_t m_begin = rbk * a.rpb;
    const int64_t m_end = m_begin + a.rpb < a.rows ? m_begin + a.rpb : a.rows;

    for (int64_t m0 = m_begin + ty; m0 < m_end; m0 += (int64_t)TY * U) {
        const int64_t m_hi = m0 + (int64_t)(U - 1) * TY;  // last row of this step
        if (active && full_col && m_hi < m_end && (m_hi < a.rows - 1 || full_last)) {
            // fast path: U full, aligned vectors per input, all loads issued before any use
            Vec<T, V> xv[U], gv[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t m = m0 + (int64_t)u * TY;  // 64-bit: m * ld exceeds 2^31 for big N*F
                xv[u] = load_full<T, V>(xb + m * a.ld_x);
                if (BWD) gv[u] = load_full<T, V>(gb + m * a.ld_dy);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int64_t m = m0 + (int64_t)u * TY;
                // in place (out == x or dy): this thread read these elements above
                store_full<T, V>(ob + m * a.ld_out, compute_vec<T, V, BWD, BIAS, SUM, A, true>(xv[u], gv[u], b, acc, V));
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
                store_part<T, V>(ob + m * a.ld_out, compute_vec<T, V, BWD, BIAS, SUM, A, false>(xv, gv, b, acc, n), n);
            }
        }
    }

    if constexpr (SUM) {
        // CTA partial of each position: the ty rows of threads added in order (deterministic)
        __shared__ float red[256 * V];
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
                const int nb = (int)gridDim.y;
                for (int i = tid; i < np; i += nthr) {
                    const int64_t p = pbase + i;  // ROWS / SCALAR: position == column
                    if (p >= a.F) break;
                    const float* q = a.part + p;
                    float s = 0.0f;
#pragma unroll 8
                    for (int r = 0; r < nb; r++) s += __ldcg(q + (int64_t)r * a.width);  // row-block order
                    store_bias_dt(a.dbias, a.bias_dt, p, s);
                }
                if (tid == 0) a.counters[slab] = 0u;  // leave the counter as found: zero
            }
        }
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

template <typename T, int V, int MODE>
static void launch_a(const GeluArgs& a, int approx, dim3 grid, dim3 block, cudaStream_t s) {
    if (approx == FL_GELU_TANH) gelu_kernel<T, V, MODE, FL_GELU_TANH><<<grid, block, 0, s>>>(a);
    else gelu_kernel<T, V, MODE, FL_GELU_NONE><<<grid, block, 0, s>>>(a);
}

template <typename T, int V>
static void launch_v(const GeluArgs& a, int mode, int approx, dim3 grid, dim3 block, cudaStream_t s) {
    switch (mode) {
        case M_FWD: launch_a<T, V, M_FWD>(a, approx, grid, block, s); break;
        case M_FWD_BIAS: launch_a<T, V, M_FWD_BIAS>(a, approx, grid, block, s); break;
        case M_BWD: launch_a<T, V, M_BWD>(a, approx, grid, block, s); break;
        case M_BWD_BIAS: launch_a<T, V, M_BWD_BIAS>(a, approx, grid, block, s); break;
        default: launch_a<T, V, M_BWD_DBIAS>(a, approx, grid, block, s); break;
    }
}

template <typename T>
static void launch_t(const GeluArgs& a, int vec, int mode, int approx, dim3 grid, dim3 block, cudaStream_t s) {
    if (vec == 1) launch_v<T, 1>(a, mode, approx, grid, block, s);
    else launch_v<T, 16 / sizeof(T)>(a, mode, approx, grid, block, s);
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
    fl__gelu_plan p;
    fl__gelu_make_plan(&p, path, N, F, es, bwd && dbias != NULL);
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

    const dim3 grid((unsigned)p.slabs, (unsigned)p.nb), block((unsigned)p.tx, (unsigned)p.ty);
    const int mode = !bwd ? (bias ? M_FWD_BIAS : M_FWD) : !bias ? M_BWD : dbias ? M_BWD_DBIAS : M_BWD_BIAS;
    switch (dt) {
        case FL_DTYPE_F32: launch_t<float>(a, p.vec, mode, approx, grid, block, stream); break;
        case FL_DTYPE_F16: launch_t<__half>(a, p.vec, mode, approx, grid, block, stream); break;
        case FL_DTYPE_BF16: launch_t<__nv_bfloat16>(a, p.vec, mode, approx, grid, block, stream); break;
    }
    FL_CUDA_TRY(cudaGetLastError());
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
