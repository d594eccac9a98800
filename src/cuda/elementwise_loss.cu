/* elementwise_loss.cu — CUDA backend of the elementwise losses: sigmoid focal (torchvision
 * semantics) and BCE with logits (PyTorch semantics), forward / backward / fused.
 *
 * Semantics: include/fusedloss.h section 9; the CPU backend src/cpu/elementwise_loss.c is the
 * specification and tests/test_elementwise_loss_cuda.c checks this file against it. The element
 * math is the same source (src/cpu/elementwise_math.h, __host__ __device__ here): fp32, CUDA's
 * own expf / powf, log1p(exp(-|x|)) by an atanh series and the reciprocals by MUFU.RCP plus a
 * Newton step (no fast-math; nvcc may contract a*b+c into fma, the CPU does not, so the two
 * differ by a few fp32 ulps at most). Per element that is ~58 instructions for focal with
 * gamma = 2 (it was ~100 and 4 branches with log1pf, two IEEE divisions and the runtime gamma
 * kind: the 16-bit kernels were compute-bound at 4x their floor, H200 2026-12-02 run 4).
 * Kernel variants: focal with gamma == 2 compiled apart from the generic gamma (whose powf is
 * an out-of-line call), BCE without weight / pos_weight apart from the weighted one.
 * Dtypes built: logits / targets / dlogits fp32, fp16, bf16; loss and grad_loss fp32.
 *
 * Work decomposition: a grid of fl__ew_blocks(n) CTAs of 256 threads (a function of n only:
 * the reduction order, and so the bits of a MEAN / SUM, are the same on every GPU), grid-stride
 * over 16-byte vectors (VEC = 16 / sizeof(T) elements: LDG.128 / STG.128) when logits, targets
 * and every other per-element array have the same address phase modulo 16 bytes; the < VEC
 * elements before the first aligned vector (head) and after the last (tail) are done by the
 * first threads one element each. Otherwise (mismatched phases) the same kernel with VEC = 1.
 * Streaming cache hints (__ldcs / __stcs via FL_LDCS / FL_STCS, common.cuh): every byte is touched once.
 * MEAN / SUM: each thread adds its elements' fp32 losses (a vector's VEC values summed in fp32
 * first) into a double; the CTA reduces its 256 doubles in a fixed tree (warp shuffles, then the
 * 8 warp sums in order) into workspace[blockIdx.x]; one 256-thread reduce kernel adds those in a
 * fixed order and writes loss[0]. No float atomics: deterministic.
 * Launches per call: 1 (NONE, backward) or 2 (MEAN / SUM). No allocation, no host sync; all on
 * `stream`: graph-capturable. 64-bit element offsets throughout (n may exceed 2^31).
 * SPDX-License-Identifier: MIT
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "../internal.h"
// the generic focal's powf, out of line (see elementwise_math.h): libdevice's powf, same bits
static __host__ __device__ __noinline__ float ew_powf(float q, float g) { return powf(q, g); }
#define FL_EW_POWF ew_powf
#include "../cpu/elementwise_math.h"
#include "common.cuh"

// ---------------------------------------------------------------------------------------------
// device helpers

#define EW_THREADS 256
// vectors per input in flight per thread in the body's unrolled loop: 4 fp32 / 2 fp16-bf16 (16
// elements either way; 4 16-bit vectors took 80 registers and spilled 8 bytes: ptxas, sm_90)
template <typename T> struct EwUnroll { static constexpr int U = sizeof(T) == 4 ? 4 : 2; };

struct EwArgs {
    float* loss;            // NONE: [n]; else unused (partials go to part)
    void* dx;
    const void* x;
    const void* y;
    const float* gl;        // grad_loss or NULL
    const float* w;         // bce weight [C] or NULL
    const float* pw;        // bce pos_weight [C] or NULL
    double* part;           // [gridDim.x] per-CTA partial sums (MEAN / SUM forward / fused)
    int64_t n, head, nvec;  // head elements, then nvec vectors of VEC, then the tail
    int64_t C;
    float gscale;
    float alpha, gamma;
    int use_alpha, gk;
    int none;               // reduction NONE
    int mean;
    // (two more fields here, the weighted BCE's column step and vector flag, changed the machine
    // code of EVERY variant of ew_kernel, CUDA 13, and cost the bf16 focal 3% (H200 s11 run 4): the
    // kernel derives them itself)
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
    T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> vload(const T* p) {
    Vec<T, V> r;
    if constexpr (sizeof(T) * V == 16) {
        uint4 u = FL_LDCS(reinterpret_cast<const uint4*>(p));  // read once: evict first
        r = *reinterpret_cast<Vec<T, V>*>(&u);
    } else {
        r.v[0] = p[0];
    }
    return r;
}
template <typename T, int V>
__device__ __forceinline__ void vstore(T* p, const Vec<T, V>& r) {
    if constexpr (sizeof(T) * V == 16) {
        FL_STCS(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&r));
    } else {
        p[0] = r.v[0];
    }
}
// V fp32 values at p (16-byte aligned when V >= 4): float4 accesses
template <int V>
__device__ __forceinline__ void fload(float (&d)[V], const float* p) {
    if constexpr (V >= 4) {
#pragma unroll
        for (int k = 0; k < V; k += 4) {
            const float4 u = FL_LDCS(reinterpret_cast<const float4*>(p + k));
            d[k] = u.x; d[k + 1] = u.y; d[k + 2] = u.z; d[k + 3] = u.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) d[k] = p[k];
    }
}
template <int V>
__device__ __forceinline__ void fstore(float* p, const float (&d)[V]) {
    if constexpr (V >= 4) {
#pragma unroll
        for (int k = 0; k < V; k += 4) FL_STCS(reinterpret_cast<float4*>(p + k), make_float4(d[k], d[k + 1], d[k + 2], d[k + 3]));
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) p[k] = d[k];
    }
}

// Kernel variants (OP): the generic focal (gamma a runtime value: q^gamma by kind, powf for
// "other"), focal with gamma == 2 known at compile time (torchvision's default: no powf, no
// division in the gradient, no per-element branches on the kind), BCE with a weight and / or
// pos_weight [C] (per-column loads, the column tracked per element), and plain BCE (neither:
// no column at all; the k % C per vector was a 64-bit division even when nothing used it).
// EW_FAST (or-ed in, 16-bit logits only): the fast forms of elementwise_math.h (the default for
// fp16 / bf16; FUSEDLOSS_EW_EXACT16=1: the fp32 kernels' exact forms).
enum { EW_FOCAL = FL__EW_FOCAL, EW_BCE_W = FL__EW_BCE, EW_FOCAL2, EW_BCE, EW_FAST = 4 };

// V consecutive elements starting at k (column j of the first, weighted bce): losses l[], gradients d[]
// j: the column of xv[0] (bce weights); wvec: j .. j + V - 1 do not wrap and the weights are
// 16-byte aligned (the kernel's test)
template <int OP, int V>
__device__ __forceinline__ void elems(const EwArgs& a, const float (&xv)[V], const float (&yv)[V], int64_t j,
                                      bool wvec, float (&l)[V], float (&d)[V]) {
    constexpr int op = OP & 3, fast = (OP & EW_FAST) ? 1 : 0;
    if constexpr (op == EW_BCE_W && V % 4 == 0) {
        if (wvec) {   // columns j .. j + V - 1 (no wrap inside a vector) as float4s: the values of the loop below
            float w[V], pw[V];
#pragma unroll
            for (int q = 0; q < V / 4; q++) {
                const float4 a4 = a.w ? __ldg(reinterpret_cast<const float4*>(a.w + j) + q) : make_float4(1.f, 1.f, 1.f, 1.f);
                const float4 b4 = a.pw ? __ldg(reinterpret_cast<const float4*>(a.pw + j) + q) : make_float4(1.f, 1.f, 1.f, 1.f);
                w[4 * q] = a4.x; w[4 * q + 1] = a4.y; w[4 * q + 2] = a4.z; w[4 * q + 3] = a4.w;
                pw[4 * q] = b4.x; pw[4 * q + 1] = b4.y; pw[4 * q + 2] = b4.z; pw[4 * q + 3] = b4.w;
            }
#pragma unroll
            for (int v = 0; v < V; v++)
                fl__ew_bce(xv[v], yv[v], w[v], a.w != nullptr, pw[v], a.pw != nullptr, fast, &l[v], &d[v]);
            return;
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        if constexpr (op == EW_FOCAL) {
            fl__ew_focal(xv[v], yv[v], a.alpha, a.use_alpha, a.gamma, a.gk, fast, &l[v], &d[v]);
        } else if constexpr (op == EW_FOCAL2) {
            fl__ew_focal(xv[v], yv[v], a.alpha, a.use_alpha, 2.0f, 2, fast, &l[v], &d[v]);
        } else if constexpr (op == EW_BCE) {
            fl__ew_bce(xv[v], yv[v], 1.0f, 0, 1.0f, 0, fast, &l[v], &d[v]);
        } else {
            fl__ew_bce(xv[v], yv[v], a.w ? a.w[j] : 1.0f, a.w != nullptr, a.pw ? a.pw[j] : 1.0f, a.pw != nullptr,
                       fast, &l[v], &d[v]);
            if (++j == a.C) j = 0;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// kernels

// One vector of V elements at element k (loaded by the caller): loss (NONE: stored; else added
// to acc, the V values in fp32 first) and the gradient (stored; in place: the caller read x[k..]).
// j: the column of element k (bce weights; else unused), from the caller's running column; wvec:
// see elems
template <typename T, int V, int OP, int PASS>
__device__ __forceinline__ void ew_vec(const EwArgs& a, int64_t k, int64_t j, bool wvec, const Vec<T, V>& xr,
                                       const Vec<T, V>& yr, float g0, double& acc, T* dx) {
    constexpr bool LOSS = PASS != FL__PASS_BACKWARD, GRAD = PASS != FL__PASS_FORWARD;
    float xv[V], yv[V], l[V], d[V];
#pragma unroll
    for (int v = 0; v < V; v++) { xv[v] = to_float(xr.v[v]); yv[v] = to_float(yr.v[v]); }
    elems<OP, V>(a, xv, yv, (OP & 3) == EW_BCE_W ? j : 0, (OP & 3) == EW_BCE_W && wvec, l, d);
    if constexpr (LOSS) {
        if (a.none) {
            fstore<V>(a.loss + k, l);
        } else {
            float s = 0.0f;   // fp32 over the V values, then double
#pragma unroll
            for (int v = 0; v < V; v++) s += l[v];
            acc += (double)s;
        }
    }
    if constexpr (GRAD) {
        float g[V];
        if (a.none) {
            if (a.gl) {
                fload<V>(g, a.gl + k);
#pragma unroll
                for (int v = 0; v < V; v++) g[v] *= a.gscale;
            } else {
#pragma unroll
                for (int v = 0; v < V; v++) g[v] = a.gscale;
            }
        } else {
#pragma unroll
            for (int v = 0; v < V; v++) g[v] = g0;
        }
        Vec<T, V> o;
#pragma unroll
        for (int v = 0; v < V; v++) o.v[v] = from_float<T>(g[v] * d[v]);
        vstore<T, V>(dx + k, o);
    }
}

// bce weights: the next vector's column, j + step (step = (grid threads x V) mod C), wrapped at C
__device__ __forceinline__ int64_t ew_next_col(int64_t j, int64_t step, int64_t C) {
    if (C <= 1) return 0;
    j += step;
    return j >= C ? j - C : j;
}

// PASS: FL__PASS_FORWARD / BACKWARD / FUSED. One thread: its grid-stride vectors, then at most
// one head and one tail element. (256, 4): at most 64 registers, 4 CTAs per SM, so the grid of
// fl__ew_blocks(n) <= 1024 CTAs runs in 2 nearly full waves on 132 SMs (528 + 496); unbounded,
// fp32 took 34-40 registers (7 CTAs per SM: 924 resident, then a second wave of 100 CTAs, each
// with as much work as the others) and the unrolled loop 59-73. Under this bound ptxas (CUDA 13)
// spills 4-20 bytes (stores) in the weighted-BCE variants only (fp32 forward / backward / fused,
// 16-bit fused; the fp32 fused spilled 24-32 bytes before the running column).
template <typename T, int V, int OP, int PASS>
__global__ void __launch_bounds__(EW_THREADS, 4) ew_kernel(const EwArgs a) {
    constexpr bool LOSS = PASS != FL__PASS_BACKWARD, GRAD = PASS != FL__PASS_FORWARD;
    const T* x = static_cast<const T*>(a.x);
    const T* y = static_cast<const T*>(a.y);
    T* dx = static_cast<T*>(a.dx);
    const int64_t tid = (int64_t)blockIdx.x * EW_THREADS + threadIdx.x;   // 64-bit: n may exceed 2^31
    const int64_t nthreads = (int64_t)gridDim.x * EW_THREADS;
    // SUM / MEAN upstream gradient: one value for all elements (device memory: no host sync)
    float g0 = 0.0f;
    if (GRAD && !a.none) {
        g0 = a.gscale * (a.gl ? a.gl[0] : 1.0f);
        if (a.mean) g0 = (float)((double)g0 / (double)a.n);
    }
    double acc = 0.0;
    // bce weights: the column of this thread's current vector, advanced by cstep (mod C) per
    // vector: one 64-bit modulo per thread instead of one per vector (it was a division call)
    constexpr bool COLS = (OP & 3) == EW_BCE_W;
    int64_t jc = 0, cstep = 0;
    bool wvec = false;   // a vector's V columns are j .. j + V - 1 (C and head multiples of V), float4 weights
    if constexpr (COLS) {
        if (a.C > 1) {
            jc = (a.head + tid * V) % a.C;
            cstep = (int64_t)(((uint64_t)nthreads % (uint64_t)a.C) * (uint64_t)V % (uint64_t)a.C);
        }
        wvec = V % 4 == 0 && a.C % V == 0 && a.head % V == 0 &&
               (((uintptr_t)a.w | (uintptr_t)a.pw) & 15u) == 0;
    }
    // body: vectors [head + i V, head + (i + 1) V), this thread's i = tid + m nthreads in order of
    // m; EwUnroll<T>::U of them loaded before the first is used (one vector per input in flight per
    // thread measured 2.4x the floor: H200 2026-12-01 run 23). The loss is added in the same m
    // order either way, so the MEAN / SUM bits do not depend on the unroll.
    int64_t i = tid;
    if constexpr (V > 1) {
        constexpr int EW_UNROLL = EwUnroll<T>::U;
        for (; i + (int64_t)(EW_UNROLL - 1) * nthreads < a.nvec; i += (int64_t)EW_UNROLL * nthreads) {
            Vec<T, V> xr[EW_UNROLL], yr[EW_UNROLL];
#pragma unroll
            for (int u = 0; u < EW_UNROLL; u++) {
                xr[u] = vload<T, V>(x + a.head + (i + u * nthreads) * V);
                yr[u] = vload<T, V>(y + a.head + (i + u * nthreads) * V);
            }
#pragma unroll
            for (int u = 0; u < EW_UNROLL; u++) {
                ew_vec<T, V, OP, PASS>(a, a.head + (i + u * nthreads) * V, jc, wvec, xr[u], yr[u], g0, acc, dx);
                if constexpr (COLS) jc = ew_next_col(jc, cstep, a.C);
            }
        }
    }
    for (; i < a.nvec; i += nthreads) {
        const int64_t k = a.head + i * V;
        ew_vec<T, V, OP, PASS>(a, k, jc, wvec, vload<T, V>(x + k), vload<T, V>(y + k), g0, acc, dx);
        if constexpr (COLS) jc = ew_next_col(jc, cstep, a.C);
    }
    // head [0, head) and tail [head + nvec V, n): fewer than V elements each, one per thread
    const int64_t tail0 = a.head + a.nvec * V;
    for (int side = 0; side < 2; side++) {
        const int64_t k = side == 0 ? tid : tail0 + tid;
        if (side == 0 ? tid >= a.head : k >= a.n) continue;
        float xv[1] = {to_float(x[k])}, yv[1] = {to_float(y[k])}, l[1], d[1];
        elems<OP, 1>(a, xv, yv, (OP & 3) == EW_BCE_W && a.C > 1 ? k % a.C : 0, false, l, d);
        if constexpr (LOSS) {
            if (a.none) a.loss[k] = l[0];
            else acc += (double)l[0];
        }
        if constexpr (GRAD) {
            const float g = a.none ? a.gscale * (a.gl ? a.gl[k] : 1.0f) : g0;
            dx[k] = from_float<T>(g * d[0]);
        }
    }
    if constexpr (LOSS) {
        if (!a.none) {
            // CTA sum in a fixed tree: warp shuffles, then the 8 warp sums in order
            __shared__ double ws[EW_THREADS / 32];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
            if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = acc;
            __syncthreads();   // the warp sums are in shared memory
            if (threadIdx.x == 0) {
                double s = 0.0;
                for (int w = 0; w < EW_THREADS / 32; w++) s += ws[w];
                a.part[blockIdx.x] = s;
            }
        }
    }
}

// loss[0] = sum of part[0, nb) in a fixed order (/ n for MEAN; n == 0: SUM 0, MEAN NaN)
__global__ void __launch_bounds__(EW_THREADS) ew_reduce_kernel(float* loss, const double* part, int64_t nb, int64_t n,
                                                               int mean) {
    __shared__ double ws[EW_THREADS / 32];
    double s = 0.0;
    for (int64_t b = threadIdx.x; b < nb; b += EW_THREADS) s += part[b];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = s;
    __syncthreads();   // the warp sums are in shared memory
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < EW_THREADS / 32; w++) t += ws[w];
        if (mean) t = n > 0 ? t / (double)n : __longlong_as_double(0x7ff8000000000000ll);
        loss[0] = (float)t;
    }
}

// ---------------------------------------------------------------------------------------------
// launchers

template <typename T, int V, int OP>
static const void* pick_pass(int pass) {
    switch (pass) {
        case FL__PASS_FORWARD: return (const void*)ew_kernel<T, V, OP, FL__PASS_FORWARD>;
        case FL__PASS_BACKWARD: return (const void*)ew_kernel<T, V, OP, FL__PASS_BACKWARD>;
        default: return (const void*)ew_kernel<T, V, OP, FL__PASS_FUSED>;
    }
}
template <typename T, int V>
static const void* pick_op(int op, int pass) {
    if constexpr (sizeof(T) == 2) {
        switch (op) {
            case EW_FOCAL | EW_FAST: return pick_pass<T, V, EW_FOCAL | EW_FAST>(pass);
            case EW_FOCAL2 | EW_FAST: return pick_pass<T, V, EW_FOCAL2 | EW_FAST>(pass);
            case EW_BCE_W | EW_FAST: return pick_pass<T, V, EW_BCE_W | EW_FAST>(pass);
            case EW_BCE | EW_FAST: return pick_pass<T, V, EW_BCE | EW_FAST>(pass);
            default: break;
        }
    }
    switch (op & 3) {
        case EW_FOCAL: return pick_pass<T, V, EW_FOCAL>(pass);
        case EW_FOCAL2: return pick_pass<T, V, EW_FOCAL2>(pass);
        case EW_BCE_W: return pick_pass<T, V, EW_BCE_W>(pass);
        default: return pick_pass<T, V, EW_BCE>(pass);
    }
}
template <typename T>
static const void* pick(int vec, int op, int pass) {
    return vec == 1 ? pick_op<T, 1>(op, pass) : pick_op<T, 16 / sizeof(T)>(op, pass);
}

//   FUSEDLOSS_EW_EXACT16=0|1   fp16 / bf16 logits: 0 = the fast forms (default), 1 = the exact forms
//                              of the fp32 kernels (read once, at the first call)
static int exact16() {
    static int v = -1;
    if (v < 0) {
        const char* s = getenv("FUSEDLOSS_EW_EXACT16");
        v = s && s[0] == '1' && s[1] == 0;
    }
    return v;
}

static int aligned16(const void* p, int64_t off_bytes) { return p == NULL || (((uintptr_t)p + (uintptr_t)off_bytes) & 15u) == 0; }

static fl_status ew_cuda(const char* fn, const fl__ew_params* p, fl__pass pass, float* loss, void* dx, const void* x,
                         const void* y, const float* gl, float gscale, fl_dtype dt, void* workspace,
                         cudaStream_t stream) {
    const int64_t n = p->n;
    const int want_loss = pass != FL__PASS_BACKWARD, want_grad = pass != FL__PASS_FORWARD;
    const int none = p->reduction == FL_REDUCTION_NONE;
    const int64_t nb = fl__ew_blocks(n);
    double* part = (want_loss && !none) ? (double*)((char*)workspace + 256) : nullptr;
    if (n > 0) {
        const size_t es = fl__dtype_size(dt);
        const int VV = (int)(16 / es);
        // vector path: every per-element array has the same phase as x (head elements to 16 B)
        const int64_t head = (int64_t)(((16u - ((uintptr_t)x & 15u)) & 15u) / es);
        int vec = head < n;
        vec = vec && aligned16(y, head * (int64_t)es);
        if (want_grad) vec = vec && aligned16(dx, head * (int64_t)es) && (!none || aligned16(gl, head * 4));
        if (want_loss && none) vec = vec && aligned16(loss, head * 4);
        EwArgs a;
        a.loss = none ? loss : nullptr;
        a.dx = dx;
        a.x = x;
        a.y = y;
        a.gl = gl;
        a.w = p->weight;
        a.pw = p->pos_weight;
        a.part = part;
        a.n = n;
        a.head = vec ? head : 0;
        a.nvec = vec ? (n - head) / VV : n;
        a.C = p->C;
        a.gscale = gscale;
        a.alpha = p->alpha;
        a.gamma = p->gamma;
        a.use_alpha = p->use_alpha;
        a.gk = p->gamma_kind;
        a.none = none;
        a.mean = p->reduction == FL_REDUCTION_MEAN;
        const int v = vec ? VV : 1;
        const int op = (p->op == FL__EW_FOCAL ? (p->gamma_kind == 2 ? EW_FOCAL2 : EW_FOCAL)
                                              : (p->weight || p->pos_weight ? EW_BCE_W : EW_BCE)) |
                       (dt != FL_DTYPE_F32 && !exact16() ? EW_FAST : 0);
        const void* k;
        switch (dt) {
            case FL_DTYPE_F32: k = pick<float>(v, op, pass); break;
            case FL_DTYPE_F16: k = pick<__half>(v, op, pass); break;
            default: k = pick<__nv_bfloat16>(v, op, pass); break;
        }
        void* args[1] = {(void*)&a};
        FL_CUDA_TRY(cudaLaunchKernel(k, dim3((unsigned)nb), dim3(EW_THREADS), args, 0, stream));
    }
    if (want_loss && !none) {
        ew_reduce_kernel<<<1, EW_THREADS, 0, stream>>>(loss, part, nb, n, p->reduction == FL_REDUCTION_MEAN);
        FL_CUDA_TRY(cudaGetLastError());
    }
    return FL_OK;
}

// ---------------------------------------------------------------------------------------------
// entry points

extern "C" {

fl_status fl_sigmoid_focal_forward_cuda(float* loss, const void* logits, const void* targets, int64_t n,
                                        fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                                        void* workspace, size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_sigmoid_focal_forward_cuda";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_FOCAL, FL__PASS_FORWARD, 1, loss, NULL, logits, targets, NULL, NULL, NULL,
                             1.0f, n, 1, dtype, alpha, gamma, reduction, workspace, workspace_bytes, &p));
    return ew_cuda(fn, &p, FL__PASS_FORWARD, loss, NULL, logits, targets, NULL, 1.0f, dtype, workspace,
                   (cudaStream_t)stream);
}

fl_status fl_sigmoid_focal_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                         const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                         float alpha, float gamma, fl_reduction reduction, fl_stream stream) {
    static const char* fn = "fl_sigmoid_focal_backward_cuda";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_FOCAL, FL__PASS_BACKWARD, 1, NULL, dlogits, logits, targets, NULL, NULL,
                             grad_loss, grad_scale, n, 1, dtype, alpha, gamma, reduction, NULL, 0, &p));
    return ew_cuda(fn, &p, FL__PASS_BACKWARD, NULL, dlogits, logits, targets, grad_loss, grad_scale, dtype, NULL,
                   (cudaStream_t)stream);
}

fl_status fl_sigmoid_focal_fused_cuda(float* loss, void* dlogits, const void* logits, const void* targets,
                                      const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                      float alpha, float gamma, fl_reduction reduction, void* workspace,
                                      size_t workspace_bytes, fl_stream stream) {
    static const char* fn = "fl_sigmoid_focal_fused_cuda";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_FOCAL, FL__PASS_FUSED, 1, loss, dlogits, logits, targets, NULL, NULL,
                             grad_loss, grad_scale, n, 1, dtype, alpha, gamma, reduction, workspace, workspace_bytes,
                             &p));
    return ew_cuda(fn, &p, FL__PASS_FUSED, loss, dlogits, logits, targets, grad_loss, grad_scale, dtype, workspace,
                   (cudaStream_t)stream);
}

fl_status fl_bce_with_logits_forward_cuda(float* loss, const void* logits, const void* targets, const float* weight,
                                          const float* pos_weight, int64_t N, int64_t C, fl_dtype dtype,
                                          fl_reduction reduction, void* workspace, size_t workspace_bytes,
                                          fl_stream stream) {
    static const char* fn = "fl_bce_with_logits_forward_cuda";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_BCE, FL__PASS_FORWARD, 1, loss, NULL, logits, targets, weight, pos_weight,
                             NULL, 1.0f, N, C, dtype, 0.0f, 0.0f, reduction, workspace, workspace_bytes, &p));
    return ew_cuda(fn, &p, FL__PASS_FORWARD, loss, NULL, logits, targets, NULL, 1.0f, dtype, workspace,
                   (cudaStream_t)stream);
}

fl_status fl_bce_with_logits_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                           const float* weight, const float* pos_weight, const float* grad_loss,
                                           float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                           fl_reduction reduction, fl_stream stream) {
    static const char* fn = "fl_bce_with_logits_backward_cuda";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_BCE, FL__PASS_BACKWARD, 1, NULL, dlogits, logits, targets, weight,
                             pos_weight, grad_loss, grad_scale, N, C, dtype, 0.0f, 0.0f, reduction, NULL, 0, &p));
    return ew_cuda(fn, &p, FL__PASS_BACKWARD, NULL, dlogits, logits, targets, grad_loss, grad_scale, dtype, NULL,
                   (cudaStream_t)stream);
}

fl_status fl_bce_with_logits_fused_cuda(float* loss, void* dlogits, const void* logits, const void* targets,
                                        const float* weight, const float* pos_weight, const float* grad_loss,
                                        float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                        fl_reduction reduction, void* workspace, size_t workspace_bytes,
                                        fl_stream stream) {
    static const char* fn = "fl_bce_with_logits_fused_cuda";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_BCE, FL__PASS_FUSED, 1, loss, dlogits, logits, targets, weight, pos_weight,
                             grad_loss, grad_scale, N, C, dtype, 0.0f, 0.0f, reduction, workspace, workspace_bytes,
                             &p));
    return ew_cuda(fn, &p, FL__PASS_FUSED, loss, dlogits, logits, targets, grad_loss, grad_scale, dtype, workspace,
                   (cudaStream_t)stream);
}

}  // extern "C"
