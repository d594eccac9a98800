/* linear_cross_entropy.cu — CUDA backend of the linear cross-entropy (include/fusedloss.h §6).
 *
 * Per chunk of R rows (the plan of src/common/lce_validate.c), all on the caller's stream:
 *   GEMM1  logits[R, ldl] = hidden_c · weightᵀ (+ bias, cuBLASLt epilogue)   into the workspace
 *   CE     the fused cross-entropy kernel of cross_entropy.cu on those rows, in place
 *          (logits -> dlogits; forward-only: loss and lse), MEAN denominators over all N rows
 *   GEMM2  dhidden_c = dlogits · weight
 *   GEMM3  dweight (+)= dlogitsᵀ · hidden_c   (beta = 0 for the first chunk, 1 after; into the
 *          fp32 accumulator or straight into dweight, see the header's accumulation modes)
 *   GEMV   dbias (+)= dlogitsᵀ · 1 (fp32)
 * then the reduced loss, and the fp32 -> 16-bit conversion of the accumulators.
 * The GEMMs are cuBLASLt's (descriptors initialised in place: no allocation; the algorithm per
 * problem shape is cached in the context). Column-major view: a row-major [r, c] matrix with row
 * stride ld is cuBLASLt's [c, r] with leading dimension ld.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"
#include "common.cuh"

#define LCE_CACHE 32

typedef struct {
    int64_t m, n, k, lda, ldb, ldd;
    int ta, tb, atype, dtype, ctype, compute, epi, beta;
    int align_a, align_b, align_d, align_bias;  // bytes (power of 2, <= 256) the pointers have
} GemmKey;

// the largest power of two <= 256 that divides the address (cuBLASLt's heuristics assume 256
// unless told; an algorithm picked for 256 may fail or misbehave on less)
static int ptr_align(const void* p) {
    const uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (u & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

typedef struct {
    GemmKey key;
    cublasLtMatmulAlgo_t algo;
    int valid;
    int tuned;  // the algorithm was chosen by timing (fl_lce_context_set_tuning), not by the heuristic
} GemmSlot;

struct fl_lce_context_s {
    cublasLtHandle_t lt;
    int device;
    GemmSlot cache[LCE_CACHE];
    int next;    // round-robin eviction
    int tuning;  // fl_lce_context_set_tuning: time the ranked algorithms of every untuned shape
    cudaEvent_t ev[2];  // created on the first tuning call
};

#define LCE_TUNE_ALGOS 16    // candidates a tuning call times (cuBLASLt returned 8 for the H200's shapes)
#define LCE_TUNE_ROUNDS 5    // timed rounds over all candidates (after a warm-up round), the median kept
#define LCE_TUNE_MARGIN 0.03f  // a candidate replaces the heuristic's pick only when this much faster

#define FL_BLAS_TRY(expr)                                                                     \
    do {                                                                                      \
        cublasStatus_t fl__bs_ = (expr);                                                      \
        if (fl__bs_ != CUBLAS_STATUS_SUCCESS)                                                 \
            return fl__fail(FL_ERR_CUDA, "%s: %s failed: %s", fn, #expr,                      \
                            cublasLtGetStatusString(fl__bs_));                                \
    } while (0)

static cudaDataType_t cuda_type(fl_dtype dt) {
    return dt == FL_DTYPE_F32 ? CUDA_R_32F : dt == FL_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

// One cuBLASLt matmul D = alpha op(A) op(B) + beta D (column-major, C == D), 16-byte aligned
// operands (validated by the caller).
typedef struct {
    int ta, tb;
    int64_t m, n, k;
    const void* A; int64_t lda; cudaDataType_t atype;  // A and B share the type
    const void* B; int64_t ldb;
    void* D; int64_t ldd; cudaDataType_t dtype;
    int beta;                // 0 or 1
    const void* bias;        // epilogue BIAS (type = dtype of D), or NULL
    cublasComputeType_t compute;
} Gemm;

// A tuning call (fl_lce_context_set_tuning): each of cuBLASLt's `found` ranked algorithms for this
// GEMM, on the call's own operands, in LCE_TUNE_ROUNDS rounds after a warm-up round, every round
// running every candidate once (CUDA events on s, synchronised), so that each candidate meets the
// same clock and power states; a candidate's time is its median over the rounds. *best (the
// heuristic's pick on entry) changes only for a candidate at least LCE_TUNE_MARGIN faster: back to
// back GEMMs on the H200 vary by 2-3% from call to call (s9 run 3: single-pass timing picked
// slower algorithms at some chunk sizes). D is overwritten (beta 0) or accumulated into many
// times (beta 1): the tuning call's outputs are unspecified.
// Why tune at all (H200, s9 runs 1-3): at 8192x768x50257 and 8192x2304x256000 bf16 the heuristic's
// first picks left 3-10% of the step; at 8192x4096x128256 it was within the noise at 2048 rows.
static fl_status tune_gemm(const char* fn, fl_lce_context* ctx, const Gemm* g, cublasLtMatmulDescOpaque_t* desc,
                           cublasLtMatrixLayoutOpaque_t* la, cublasLtMatrixLayoutOpaque_t* lb,
                           cublasLtMatrixLayoutOpaque_t* ld, const cublasLtMatmulHeuristicResult_t* cand, int found,
                           void* blas_ws, cudaStream_t s, int* best) {
    if (!ctx->ev[0]) {
        FL_CUDA_TRY(cudaEventCreate(&ctx->ev[0]));
        FL_CUDA_TRY(cudaEventCreate(&ctx->ev[1]));
    }
    const float one = 1.0f, zero = 0.0f;
    float ms[LCE_TUNE_ALGOS][LCE_TUNE_ROUNDS];
    int ok[LCE_TUNE_ALGOS];
    for (int i = 0; i < found; i++) ok[i] = 1;
    for (int r = -1; r < LCE_TUNE_ROUNDS; r++) {  // round -1: the warm-up
        for (int i = 0; i < found; i++) {
            if (!ok[i]) continue;
            FL_CUDA_TRY(cudaEventRecord(ctx->ev[0], s));
            ok[i] = cublasLtMatmul(ctx->lt, desc, &one, g->A, la, g->B, lb, g->beta ? &one : &zero, g->D, ld, g->D,
                                   ld, &cand[i].algo, blas_ws, FL__LCE_BLAS_BYTES, s) == CUBLAS_STATUS_SUCCESS;
            FL_CUDA_TRY(cudaEventRecord(ctx->ev[1], s));
            FL_CUDA_TRY(cudaEventSynchronize(ctx->ev[1]));
            if (r >= 0 && ok[i]) FL_CUDA_TRY(cudaEventElapsedTime(&ms[i][r], ctx->ev[0], ctx->ev[1]));
        }
    }
    float med[LCE_TUNE_ALGOS];
    for (int i = 0; i < found; i++) {
        if (!ok[i]) continue;  // an algorithm cuBLASLt proposed but cannot run here: skipped
        float* m = ms[i];
        for (int a = 1; a < LCE_TUNE_ROUNDS; a++)  // insertion sort: the median
            for (int b = a; b > 0 && m[b] < m[b - 1]; b--) { const float t = m[b]; m[b] = m[b - 1]; m[b - 1] = t; }
        med[i] = m[LCE_TUNE_ROUNDS / 2];
    }
    int bi = -1;
    for (int i = 0; i < found; i++)
        if (ok[i] && (bi < 0 || med[i] < med[bi])) bi = i;
    const int h = *best;  // the heuristic's pick: kept unless clearly beaten (or it cannot run)
    if (bi >= 0 && (!ok[h] || med[bi] < (1.0f - LCE_TUNE_MARGIN) * med[h])) *best = bi;
    (void)fn;
    return FL_OK;
}

static fl_status run_gemm(const char* fn, fl_lce_context* ctx, const Gemm* g, void* blas_ws, cudaStream_t s) {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, ld;
    FL_BLAS_TRY(cublasLtMatmulDescInit(&desc, g->compute, CUDA_R_32F));
    const cublasOperation_t ta = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    FL_BLAS_TRY(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FL_BLAS_TRY(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (g->bias) {
        epi = CUBLASLT_EPILOGUE_BIAS;
        FL_BLAS_TRY(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        FL_BLAS_TRY(cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                   sizeof(g->bias)));
    }
    // A is (ta ? k x m : m x k), B is (tb ? n x k : k x n), D is m x n
    FL_BLAS_TRY(cublasLtMatrixLayoutInit(&la, g->atype, g->ta ? g->k : g->m, g->ta ? g->m : g->k, g->lda));
    FL_BLAS_TRY(cublasLtMatrixLayoutInit(&lb, g->atype, g->tb ? g->n : g->k, g->tb ? g->k : g->n, g->ldb));
    FL_BLAS_TRY(cublasLtMatrixLayoutInit(&ld, g->dtype, g->m, g->n, g->ldd));

    GemmKey key;
    memset(&key, 0, sizeof(key));
    key.m = g->m; key.n = g->n; key.k = g->k; key.lda = g->lda; key.ldb = g->ldb; key.ldd = g->ldd;
    key.ta = g->ta; key.tb = g->tb; key.atype = (int)g->atype; key.dtype = (int)g->dtype; key.ctype = (int)g->dtype;
    key.compute = (int)g->compute; key.epi = (int)epi; key.beta = g->beta;
    key.align_a = ptr_align(g->A); key.align_b = ptr_align(g->B); key.align_d = ptr_align(g->D);
    key.align_bias = g->bias ? ptr_align(g->bias) : 256;
    GemmSlot* slot = NULL;
    for (int i = 0; i < LCE_CACHE; i++)
        if (ctx->cache[i].valid && !memcmp(&ctx->cache[i].key, &key, sizeof(key))) { slot = &ctx->cache[i]; break; }
    if (!slot || (ctx->tuning && !slot->tuned)) {
        cublasLtMatmulPreferenceOpaque_t pref;
        FL_BLAS_TRY(cublasLtMatmulPreferenceInit(&pref));
        const uint64_t wsb = FL__LCE_BLAS_BYTES;
        FL_BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                         sizeof(wsb)));
        const uint32_t al[3] = {(uint32_t)key.align_a, (uint32_t)key.align_b, (uint32_t)key.align_d};
        FL_BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0],
                                                         sizeof(al[0])));
        FL_BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1],
                                                         sizeof(al[1])));
        FL_BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2],
                                                         sizeof(al[2])));
        FL_BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2],
                                                         sizeof(al[2])));
        // FUSEDLOSS_LCE_ALGO=k (benchmarking knob): the k-th of cuBLASLt's ranked algorithms
        static int pick = -1;
        if (pick < 0) {
            const char* e = getenv("FUSEDLOSS_LCE_ALGO");
            pick = e ? atoi(e) : 0;
            pick = pick < 0 ? 0 : pick > 7 ? 7 : pick;
        }
        cublasLtMatmulHeuristicResult_t resv[LCE_TUNE_ALGOS];
        int found = 0;
        const int want = ctx->tuning ? LCE_TUNE_ALGOS : pick + 1;
        FL_BLAS_TRY(cublasLtMatmulAlgoGetHeuristic(ctx->lt, &desc, &la, &lb, &ld, &ld, &pref, want, resv, &found));
        if (found < 1)
            return fl__fail(FL_ERR_UNSUPPORTED, "%s: cuBLASLt has no algorithm for a %lld x %lld x %lld GEMM", fn,
                            (long long)g->m, (long long)g->n, (long long)g->k);
        int best = found > pick ? pick : found - 1;
        if (ctx->tuning && found > 1) FL_CHECK(tune_gemm(fn, ctx, g, &desc, &la, &lb, &ld, resv, found, blas_ws, s, &best));
        if (!slot) {
            slot = &ctx->cache[ctx->next];
            ctx->next = (ctx->next + 1) % LCE_CACHE;
        }
        slot->key = key;
        slot->algo = resv[best].algo;
        slot->valid = 1;
        slot->tuned = ctx->tuning;
    }
    const float one = 1.0f, zero = 0.0f;
    FL_BLAS_TRY(cublasLtMatmul(ctx->lt, &desc, &one, g->A, &la, g->B, &lb, g->beta ? &one : &zero, g->D, &ld,
                               g->D, &ld, &slot->algo, blas_ws, FL__LCE_BLAS_BYTES, s));
    return FL_OK;
}

// ---------------------------------------------------------------------------------------------
// small kernels: fp32 accumulator -> 16-bit, the ones vector, zero fill

template <typename T>
__global__ void __launch_bounds__(256) convert_kernel(T* out, const float* in, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x * 4;
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < n; i += stride) {
        if (i + 4 <= n) {
            const float4 v = *(const float4*)(in + i);
            out[i] = from_float<T>(v.x); out[i + 1] = from_float<T>(v.y);
            out[i + 2] = from_float<T>(v.z); out[i + 3] = from_float<T>(v.w);
        } else {
            for (int64_t j = i; j < n; j++) out[j] = from_float<T>(in[j]);
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(256) ones_kernel(T* out, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = from_float<T>(1.0f);
}

static unsigned grid_for(int64_t n, int64_t per_thread) {
    int64_t b = (n / per_thread + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

static fl_status convert(const char* fn, void* out, fl_dtype dt, const float* in, int64_t n, cudaStream_t s) {
    (void)fn;
    if (n == 0) return FL_OK;
    const unsigned g = grid_for(n, 4);
    if (dt == FL_DTYPE_F16) convert_kernel<__half><<<g, 256, 0, s>>>((__half*)out, in, n);
    else convert_kernel<__nv_bfloat16><<<g, 256, 0, s>>>((__nv_bfloat16*)out, in, n);
    FL_CUDA_TRY(cudaGetLastError());
    return FL_OK;
}

static fl_status fill_ones(const char* fn, void* out, fl_dtype dt, int64_t n, cudaStream_t s) {
    (void)fn;
    const unsigned g = grid_for(n, 1);
    if (dt == FL_DTYPE_F32) ones_kernel<float><<<g, 256, 0, s>>>((float*)out, n);
    else if (dt == FL_DTYPE_F16) ones_kernel<__half><<<g, 256, 0, s>>>((__half*)out, n);
    else ones_kernel<__nv_bfloat16><<<g, 256, 0, s>>>((__nv_bfloat16*)out, n);
    FL_CUDA_TRY(cudaGetLastError());
    return FL_OK;
}

// ---------------------------------------------------------------------------------------------
// the GEMMs of one chunk (shared by the linear CE and its vocab-parallel variant)
//
// V is split at V1 = V rounded down to 64: cuBLAS picks slow kernels for an odd M / N / K
// (H200, 2026-12-01: GEMM1 of 8192x768x50257 took 7.9x the time of V = 50304), so every GEMM
// runs on the aligned main part and on the < 64-column tail separately.

typedef struct {
    fl_lce_context* ctx;
    void* blas_ws;
    cudaStream_t s;
    cudaDataType_t at;             // the operands' type
    cublasComputeType_t compute;
    const void* weight; int64_t ldw; const void* bias;
    int64_t V1, Vt, H, ldl;
    const char* w_t; const char* b_t;  // the tail's weight rows and bias
    size_t es;
} ChunkGemms;

static ChunkGemms chunk_gemms(fl_lce_context* ctx, void* blas_ws, cudaStream_t s, fl_dtype dt, int tf32,
                              const void* weight, int64_t ldw, const void* bias, int64_t V, int64_t H, int64_t ldl) {
    ChunkGemms g;
    g.ctx = ctx; g.blas_ws = blas_ws; g.s = s;
    g.at = cuda_type(dt);
    g.compute = dt == FL_DTYPE_F32 ? (tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F) : CUBLAS_COMPUTE_32F;
    g.weight = weight; g.ldw = ldw; g.bias = bias;
    g.V1 = V - V % FL__LCE_V_ALIGN; g.Vt = V - g.V1; g.H = H; g.ldl = ldl;
    g.es = fl__dtype_size(dt);
    g.w_t = (const char*)weight + (size_t)g.V1 * (size_t)ldw * g.es;
    g.b_t = bias ? (const char*)bias + (size_t)g.V1 * g.es : NULL;
    return g;
}

// GEMM1: logits^T [V, R] = (W [H, V])^T · h_c [H, R] (+ bias)
static fl_status gemm_logits(const char* fn, const ChunkGemms* q, void* L, const void* hc, int64_t ldh, int64_t R) {
    char* L_t = (char*)L + (size_t)q->V1 * q->es;
    if (q->V1) {
        Gemm g = {1, 0, q->V1, R, q->H, q->weight, q->ldw, q->at, hc, ldh, L, q->ldl, q->at, 0, q->bias, q->compute};
        FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
    }
    if (q->Vt) {
        Gemm g = {1, 0, q->Vt, R, q->H, q->w_t, q->ldw, q->at, hc, ldh, L_t, q->ldl, q->at, 0, q->b_t, q->compute};
        FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
    }
    return FL_OK;
}

// GEMM2: dh_c^T [H, R] = W [H, V] · dl [V, R], into dst of type dt_dst (the tail added with beta 1)
static fl_status gemm_dhidden(const char* fn, const ChunkGemms* q, void* dst, cudaDataType_t dt_dst, const void* L,
                              int64_t R) {
    const char* L_t = (const char*)L + (size_t)q->V1 * q->es;
    if (q->V1) {
        Gemm g = {0, 0, q->H, R, q->V1, q->weight, q->ldw, q->at, L, q->ldl, dst, q->H, dt_dst, 0, NULL, q->compute};
        FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
    }
    if (q->Vt) {
        Gemm g = {0, 0, q->H, R, q->Vt, q->w_t, q->ldw, q->at, L_t, q->ldl, dst, q->H, dt_dst, q->V1 > 0, NULL,
                  q->compute};
        FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
    }
    return FL_OK;
}

// GEMM3: dW^T [H, V] (+)= h_c [H, R] · (dl [V, R])^T (dW of type dWt, dWes bytes per element; NULL
// to skip), and the GEMV dB [V] (+)= dl [V, R] · ones [R] in fp32 (NULL to skip); beta 0 or 1.
static fl_status gemm_wgrad(const char* fn, const ChunkGemms* q, void* dW, cudaDataType_t dWt, size_t dWes,
                            float* dB, const void* ones, const void* L, const void* hc, int64_t ldh, int64_t R,
                            int beta) {
    const char* L_t = (const char*)L + (size_t)q->V1 * q->es;
    if (dW) {
        if (q->V1) {
            Gemm g = {0, 1, q->H, q->V1, R, hc, ldh, q->at, L, q->ldl, dW, q->H, dWt, beta, NULL, q->compute};
            FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
        }
        if (q->Vt) {
            void* dW_t = (char*)dW + (size_t)q->V1 * (size_t)q->H * dWes;
            Gemm g = {0, 1, q->H, q->Vt, R, hc, ldh, q->at, L_t, q->ldl, dW_t, q->H, dWt, beta, NULL, q->compute};
            FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
        }
    }
    if (dB) {
        if (q->V1) {
            Gemm g = {0, 0, q->V1, 1, R, L, q->ldl, q->at, ones, R, dB, q->V1, CUDA_R_32F, beta, NULL, q->compute};
            FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
        }
        if (q->Vt) {
            Gemm g = {0, 0, q->Vt, 1, R, L_t, q->ldl, q->at, ones, R, dB + q->V1, q->Vt, CUDA_R_32F, beta, NULL,
                      q->compute};
            FL_CHECK(run_gemm(fn, q->ctx, &g, q->blas_ws, q->s));
        }
    }
    return FL_OK;
}

// ---------------------------------------------------------------------------------------------
// the chunk loop

enum { MODE_FORWARD = 0, MODE_BACKWARD = 1 };

static fl_status lce_cuda(const char* fn, int mode, fl_lce_context* ctx, float* loss, float* lse, void* dhidden,
                          void* dweight, void* dbias, const void* hidden, int64_t ld_hidden, const void* weight,
                          int64_t ld_weight, const void* bias, const void* targets, const float* lse_in,
                          const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V, fl_dtype dt,
                          fl_dtype wdt, fl_index_dtype it, const fl_ce_options* ce_opts,
                          const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes,
                          cudaStream_t s) {
    fl__clear_error();
    if (!ctx) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ctx is NULL (create it with fl_lce_context_create)", fn);
    fl__ce_params p;
    fl__lce_plan plan;
    FL_CHECK(fl__lce_validate(fn, mode, 1, loss, mode == MODE_BACKWARD ? lse_in : lse, dhidden, dweight, dbias,
                              hidden, ld_hidden, weight, ld_weight, bias, targets, grad_loss, grad_scale, N, H, V,
                              dt, wdt, it, ce_opts, lce_opts, workspace, workspace_bytes, &p, &plan));
    if (V > INT32_MAX - 64)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: V (%lld) above 2^31 - 64 is not supported on CUDA", fn, (long long)V);
    const int grads = dhidden != NULL;
    const size_t es = fl__dtype_size(dt), wes = fl__dtype_size(wdt);
    char* ws = (char*)workspace;
    void* ce_ws = ws + plan.off_ce;
    void* L = ws + plan.off_logits;
    float* acc = (float*)(ws + plan.off_acc);
    float* bacc = (float*)(ws + plan.off_bacc);
    void* ones = ws + plan.off_ones;
    const ChunkGemms q = chunk_gemms(ctx, ws + plan.off_blas, s, dt, lce_opts && lce_opts->allow_tf32, weight,
                                     ld_weight, bias, V, H, plan.ldl);
    // dweight: into the fp32 accumulator (16-bit dweight, FP32 mode) or into dweight itself
    void* dW = plan.accum_fp32 ? (void*)acc : dweight;
    const cudaDataType_t dWt = plan.accum_fp32 ? CUDA_R_32F : cuda_type(wdt);
    const size_t dWes = plan.accum_fp32 ? 4 : wes;
    float* dB = dbias ? (wdt == FL_DTYPE_F32 ? (float*)dbias : bacc) : NULL;

    FL_CHECK(fl__ce_cuda_chunk_begin(&p, targets, N, V, it, ce_ws, (fl_stream)s));
    if (dbias && N > 0) FL_CHECK(fill_ones(fn, ones, dt, plan.chunk_rows, s));

    // An odd V with 16-bit dhidden: the tail's share of dhidden is added to the main part's in
    // fp32 (dh32) and rounded once, as one GEMM would.
    const int odd16 = q.Vt != 0 && es == 2;
    float* dh32 = (float*)(ws + plan.off_dh32);

    const int ce_pass = mode == MODE_BACKWARD ? FL__PASS_BACKWARD : grads ? FL__PASS_FUSED : FL__PASS_FORWARD;
    for (int64_t c = 0; c < plan.chunks; c++) {
        const int64_t r0 = c * plan.chunk_rows;
        const int64_t R = N - r0 < plan.chunk_rows ? N - r0 : plan.chunk_rows;
        const void* hc = (const char*)hidden + (size_t)r0 * (size_t)ld_hidden * es;
        FL_CHECK(gemm_logits(fn, &q, L, hc, ld_hidden, R));
        FL_CHECK(fl__ce_cuda_chunk_rows(ce_pass, &p, r0, R, N, V, loss, mode == MODE_BACKWARD ? NULL : lse,
                                        grads ? L : NULL, L, plan.ldl, targets, mode == MODE_BACKWARD ? lse_in : NULL,
                                        grad_loss, grad_scale, dt, it, ce_ws, (fl_stream)s));
        if (!grads) continue;
        void* dhc = (char*)dhidden + (size_t)r0 * (size_t)H * es;
        FL_CHECK(gemm_dhidden(fn, &q, odd16 ? (void*)dh32 : dhc, odd16 ? CUDA_R_32F : q.at, L, R));
        if (odd16) FL_CHECK(convert(fn, dhc, dt, dh32, R * H, s));
        FL_CHECK(gemm_wgrad(fn, &q, dweight ? dW : NULL, dWt, dWes, dB, ones, L, hc, ld_hidden, R, c > 0));
    }
    if (mode == MODE_FORWARD) FL_CHECK(fl__ce_cuda_chunk_end(&p, loss, targets, N, V, it, ce_ws, (fl_stream)s));
    if (N == 0) {  // no chunk wrote the gradients of the parameters: they are zero
        if (dweight) FL_CUDA_TRY(cudaMemsetAsync(dweight, 0, (size_t)V * (size_t)H * wes, s));
        if (dbias) FL_CUDA_TRY(cudaMemsetAsync(dbias, 0, (size_t)V * wes, s));
        return FL_OK;
    }
    if (dweight && plan.accum_fp32) FL_CHECK(convert(fn, dweight, wdt, acc, V * H, s));
    if (dbias && wdt != FL_DTYPE_F32) FL_CHECK(convert(fn, dbias, wdt, bacc, V, s));
    return FL_OK;
}

// ---------------------------------------------------------------------------------------------
// the vocab-parallel linear variant (header section 8): which = 0 step 1', 1 step 4', 2 the
// collective entry (coll: the caller's all-gather / all-reduce, e.g. NCCL's from vp_nccl.cu)

fl_status fl__vp_lce_cuda(const char* fn, int which, fl_lce_context* ctx, const fl__vp_coll* coll, float* stats,
                          float* loss, float* lse, void* dhidden, void* dweight, void* dbias, const void* hidden,
                          int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
                          const void* targets, const float* grad_loss, float grad_scale, int64_t N, int64_t H,
                          int64_t Vl, int64_t vocab_start, int64_t V, fl_dtype dt, fl_dtype wdt, fl_index_dtype it,
                          const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace,
                          size_t workspace_bytes, fl_stream stream) {
    if (!ctx) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ctx is NULL (create it with fl_lce_context_create)", fn);
    if (which == 2 && !coll) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: no collectives", fn);
    const int k = which == 2 ? coll->k : 1;
    fl__ce_params p;
    fl__vp_lce_plan vplan;
    FL_CHECK(fl__vp_lce_validate(fn, which, 1, stats, loss, lse, dhidden, dweight, dbias, hidden, ld_hidden, weight,
                                 ld_weight, bias, targets, grad_loss, grad_scale, N, H, Vl, vocab_start, V, dt, wdt,
                                 it, k, ce_opts, lce_opts, workspace, workspace_bytes, &p, &vplan));
    const fl__lce_plan& plan = vplan.lce;
    cudaStream_t s = (cudaStream_t)stream;
    const int grads = which == 1 || (which == 2 && dhidden);
    const size_t es = fl__dtype_size(dt), wes = fl__dtype_size(wdt);
    char* ws = (char*)workspace;
    void* ce_ws = ws + plan.off_ce;
    void* L = ws + plan.off_logits;
    float* acc = (float*)(ws + plan.off_acc);
    float* bacc = (float*)(ws + plan.off_bacc);
    void* ones = ws + plan.off_ones;
    float* dh32 = (float*)(ws + plan.off_dh32);
    float* st_ws = (float*)(ws + vplan.off_stats);
    float* gathered = (float*)(ws + vplan.off_gathered);
    float* lse_rows = which == 1 ? (float*)lse : which == 2 ? (lse ? lse : (float*)(ws + vplan.off_lse)) : NULL;
    const ChunkGemms q = chunk_gemms(ctx, ws + plan.off_blas, s, dt, lce_opts && lce_opts->allow_tf32, weight,
                                     ld_weight, bias, Vl, H, plan.ldl);
    void* dW = plan.accum_fp32 ? (void*)acc : dweight;
    const cudaDataType_t dWt = plan.accum_fp32 ? CUDA_R_32F : cuda_type(wdt);
    const size_t dWes = plan.accum_fp32 ? 4 : wes;
    float* dB = dbias ? (wdt == FL_DTYPE_F32 ? (float*)dbias : bacc) : NULL;

    if (which != 0) FL_CHECK(fl__vp_cuda_chunk_begin(&p, targets, N, Vl, vocab_start, V, it, ce_ws, stream));
    if (dbias && N > 0) FL_CHECK(fill_ones(fn, ones, dt, plan.chunk_rows, s));
    for (int64_t c = 0; c < plan.chunks; c++) {
        const int64_t r0 = c * plan.chunk_rows;
        const int64_t R = N - r0 < plan.chunk_rows ? N - r0 : plan.chunk_rows;
        const void* hc = (const char*)hidden + (size_t)r0 * (size_t)ld_hidden * es;
        FL_CHECK(gemm_logits(fn, &q, L, hc, ld_hidden, R));
        if (which == 0) {
            FL_CHECK(fl__vp_cuda_chunk_stats(&p, r0, R, N, stats + 4 * r0, L, plan.ldl, targets, Vl, vocab_start, V,
                                             dt, it, ce_ws, stream));
            continue;
        }
        if (which == 2) {
            FL_CHECK(fl__vp_cuda_chunk_stats(&p, r0, R, N, st_ws, L, plan.ldl, targets, Vl, vocab_start, V, dt, it,
                                             ce_ws, stream));
            FL_CHECK(coll->all_gather(coll, st_ws, gathered, (size_t)R * 4u, stream));
            FL_CHECK(fl__vp_cuda_chunk_combine(&p, r0, R, N, loss, lse_rows, gathered, k, targets, V, it, ce_ws,
                                               stream));
            if (!grads) continue;
        }
        FL_CHECK(fl__vp_cuda_chunk_backward(&p, r0, R, N, L, L, plan.ldl, targets, lse_rows, grad_loss, grad_scale,
                                            Vl, vocab_start, V, dt, it, ce_ws, stream));
        // dhidden rows: step 4' writes the caller's fp32 partial; the collective entry sums the
        // ranks' fp32 partials (in dhidden itself when it is fp32, else in dh32) and rounds once
        float* dst = which == 1 ? (float*)dhidden + (size_t)r0 * (size_t)H
                     : dt == FL_DTYPE_F32 ? (float*)dhidden + (size_t)r0 * (size_t)H : dh32;
        FL_CHECK(gemm_dhidden(fn, &q, dst, CUDA_R_32F, L, R));
        if (which == 2) {
            FL_CHECK(coll->all_reduce_sum(coll, dst, (size_t)R * (size_t)H, stream));
            if (dt != FL_DTYPE_F32)
                FL_CHECK(convert(fn, (char*)dhidden + (size_t)r0 * (size_t)H * es, dt, dh32, R * H, s));
        }
        FL_CHECK(gemm_wgrad(fn, &q, dweight ? dW : NULL, dWt, dWes, dB, ones, L, hc, ld_hidden, R, c > 0));
    }
    if (which == 2) FL_CHECK(fl__ce_cuda_chunk_end(&p, loss, targets, N, V, it, ce_ws, stream));
    if (which == 0) return FL_OK;
    if (N == 0) {
        if (dweight) FL_CUDA_TRY(cudaMemsetAsync(dweight, 0, (size_t)Vl * (size_t)H * wes, s));
        if (dbias) FL_CUDA_TRY(cudaMemsetAsync(dbias, 0, (size_t)Vl * wes, s));
        return FL_OK;
    }
    if (dweight && plan.accum_fp32) FL_CHECK(convert(fn, dweight, wdt, acc, Vl * H, s));
    if (dbias && wdt != FL_DTYPE_F32) FL_CHECK(convert(fn, dbias, wdt, bacc, Vl, s));
    return FL_OK;
}

extern "C" {

fl_status fl_lce_context_create(fl_lce_context** ctx) {
    static const char* fn = "fl_lce_context_create";
    fl__clear_error();
    if (!ctx) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
    *ctx = NULL;
    fl_lce_context* c = (fl_lce_context*)calloc(1, sizeof(*c));
    if (!c) return fl__fail(FL_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    cudaError_t e = cudaGetDevice(&c->device);
    if (e != cudaSuccess) {
        free(c);
        return fl__fail(FL_ERR_CUDA, "%s: cudaGetDevice: %s", fn, cudaGetErrorString(e));
    }
    cublasStatus_t bs = cublasLtCreate(&c->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        free(c);
        return fl__fail(FL_ERR_CUDA, "%s: cublasLtCreate: %s", fn, cublasLtGetStatusString(bs));
    }
    *ctx = c;
    return FL_OK;
}

fl_status fl_lce_context_set_tuning(fl_lce_context* ctx, int on) {
    static const char* fn = "fl_lce_context_set_tuning";
    fl__clear_error();
    if (!ctx) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
    if (on != 0 && on != 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: on (%d) must be 0 or 1", fn, on);
    ctx->tuning = on;
    return FL_OK;
}

void fl_lce_context_destroy(fl_lce_context* ctx) {
    if (!ctx) return;
    if (ctx->ev[0]) cudaEventDestroy(ctx->ev[0]);
    if (ctx->ev[1]) cudaEventDestroy(ctx->ev[1]);
    cublasLtDestroy(ctx->lt);
    free(ctx);
}

fl_status fl_linear_cross_entropy_forward_cuda(fl_lce_context* ctx, float* loss, float* lse, void* dhidden,
                                               void* dweight, void* dbias, const void* hidden, int64_t ld_hidden,
                                               const void* weight, int64_t ld_weight, const void* bias,
                                               const void* targets, const float* grad_loss, float grad_scale,
                                               int64_t N, int64_t H, int64_t V, fl_dtype dtype, fl_dtype wgrad_dtype,
                                               fl_index_dtype index_dtype, const fl_ce_options* ce_opts,
                                               const fl_lce_options* lce_opts, void* workspace,
                                               size_t workspace_bytes, fl_stream stream) {
    return lce_cuda("fl_linear_cross_entropy_forward_cuda", MODE_FORWARD, ctx, loss, lse, dhidden, dweight, dbias,
                    hidden, ld_hidden, weight, ld_weight, bias, targets, NULL, grad_loss, grad_scale, N, H, V, dtype,
                    wgrad_dtype, index_dtype, ce_opts, lce_opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

fl_status fl_linear_cross_entropy_backward_cuda(fl_lce_context* ctx, void* dhidden, void* dweight, void* dbias,
                                                const void* hidden, int64_t ld_hidden, const void* weight,
                                                int64_t ld_weight, const void* bias, const void* targets,
                                                const float* lse, const float* grad_loss, float grad_scale,
                                                int64_t N, int64_t H, int64_t V, fl_dtype dtype,
                                                fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                                                const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                                void* workspace, size_t workspace_bytes, fl_stream stream) {
    return lce_cuda("fl_linear_cross_entropy_backward_cuda", MODE_BACKWARD, ctx, NULL, NULL, dhidden, dweight, dbias,
                    hidden, ld_hidden, weight, ld_weight, bias, targets, lse, grad_loss, grad_scale, N, H, V, dtype,
                    wgrad_dtype, index_dtype, ce_opts, lce_opts, workspace, workspace_bytes, (cudaStream_t)stream);
}

fl_status fl_vp_linear_ce_local_stats_cuda(fl_lce_context* ctx, float* stats, const void* hidden, int64_t ld_hidden,
                                           const void* weight, int64_t ld_weight, const void* bias,
                                           const void* targets, int64_t N, int64_t H, int64_t V_local,
                                           int64_t vocab_start, int64_t V, fl_dtype dtype, fl_index_dtype index_dtype,
                                           const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                           void* workspace, size_t workspace_bytes, fl_stream stream) {
    fl__clear_error();
    return fl__vp_lce_cuda("fl_vp_linear_ce_local_stats_cuda", 0, ctx, NULL, stats, NULL, NULL, NULL, NULL, NULL,
                           hidden, ld_hidden, weight, ld_weight, bias, targets, NULL, 1.0f, N, H, V_local,
                           vocab_start, V, dtype, dtype, index_dtype, ce_opts, lce_opts, workspace, workspace_bytes,
                           stream);
}

fl_status fl_vp_linear_ce_backward_cuda(fl_lce_context* ctx, float* dhidden_partial, void* dweight, void* dbias,
                                        const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight,
                                        const void* bias, const void* targets, const float* lse,
                                        const float* grad_loss, float grad_scale, int64_t N, int64_t H,
                                        int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                        fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                                        const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                        void* workspace, size_t workspace_bytes, fl_stream stream) {
    fl__clear_error();
    return fl__vp_lce_cuda("fl_vp_linear_ce_backward_cuda", 1, ctx, NULL, NULL, NULL, (float*)lse, dhidden_partial,
                           dweight, dbias, hidden, ld_hidden, weight, ld_weight, bias, targets, grad_loss, grad_scale,
                           N, H, V_local, vocab_start, V, dtype, wgrad_dtype, index_dtype, ce_opts, lce_opts,
                           workspace, workspace_bytes, stream);
}

}  // extern "C"
