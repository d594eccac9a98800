/* bench_linear_ce.c — linear cross-entropy benchmark over the PUBLIC API.
 * SPDX-License-Identifier: MIT
 *
 * In one run, on one GPU, per case (N, H, V, dtype, byte budget):
 *   gemm3   the floor: the three full (unchunked) cuBLASLt GEMMs of linear + CE with V rounded up
 *           to a multiple of 64 (an odd V makes cuBLAS pick slow kernels; the floor must not hide
 *           that): logits[N, Vp] = hidden · Wᵀ, dhidden = dlogits · W, dW = dlogitsᵀ · hidden,
 *           bf16/f16 in and out, fp32 accumulation (what torch.matmul runs). Each GEMM timed alone.
 *   fused   mode 1: fl_linear_cross_entropy_forward_cuda with dhidden and dweight (MEAN loss)
 *   recomp  mode 2: loss-only forward + fl_linear_cross_entropy_backward_cuda
 *   fwd     the loss-only forward alone
 *   tuned   the same three calls again after a tuning call of each mode on the context
 *           (fl_lce_context_set_tuning: the chunk GEMMs under their fastest ranked cuBLASLt
 *           algorithm), beside the tuned floor (each full GEMM under its fastest ranked algorithm,
 *           32 MiB cuBLASLt workspace), and the tuned fused call as CUDA graph replays queued back to
 *           back (the GPU time without the host's enqueue); --no-tune skips these.
 *   Reported: ms (median of --reps, CUDA events around each call after --warmup calls), TFLOP/s
 *   of 6·N·H·V (fused) / 2·N·H·V (fwd) / 8·N·H·V (recomp), the ratio to gemm3, the workspace
 *   (= the op's peak memory beyond its inputs and outputs: it allocates nothing else) and the
 *   chunking the plan chose. One "SUMMARY" line per case (grep SUMMARY).
 *   Inputs: hidden ~ U(-1, 1), weight ~ U(-0.05, 0.05) (logits ~ N(0, 1.7) at H = 4096), targets
 *   uniform in [0, V); never zeros.
 * Usage: bench_linear_ce [--case N H V dtype budget_MiB]... [--reps R] [--warmup W] [--phases R] [--algos R]
 *                        [--chunk-rows R] [--overlap R S,S..] [--fused-only] [--no-tune] [--no-floor]
 *   (--no-floor: skip the cuBLASLt floor, e.g. under a profiler; --phases R: each piece of one chunk of
 *   R rows timed alone; --algos R: each chunk GEMM timed with every one of cuBLASLt's ranked algorithms;
 *   --chunk-rows R: that chunk size instead of the budget's; --fused-only: only mode 1, no tuned floor;
 *   --overlap R S,..: one chunk's CE beside another's dX + dW GEMMs on S SMs: see overlap_probe)
 *   Default grid: the targets (8192x4096x128256 bf16 at 512 and 256 MiB, 8192x768x50257
 *   bf16, 8192x2304x256000 bf16 at 256 MiB).
 */
#define _POSIX_C_SOURCE 200809L
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "bench_util.h"

typedef struct { int64_t N, H, V; fl_dtype dt; size_t budget; } lcase;

static int g_reps = 20, g_warmup = 3, g_no_floor = 0, g_tune = 1, g_fused_only = 0;
static int64_t g_chunk_rows = 0;  /* --chunk-rows R: lce_opts.chunk_rows for every case (0: from the budget) */
static int64_t g_phase_rows = 0;  /* --phases R: time the per-chunk pieces at R rows */
static int64_t g_algo_rows = 0;   /* --algos R: time cuBLASLt's ranked algorithms for each chunk GEMM */
static int64_t g_ovl_rows = 0;    /* --overlap R S,S,..: the CE of one chunk beside the dX + dW GEMMs of another */
static int g_ovl_sms[16], g_ovl_n = 0;
static cudaStream_t g_stream;
static cublasLtHandle_t g_lt;
static void* g_blas_ws;
#define BLAS_WS ((size_t)32 << 20)

#define BK(x)                                                                                       \
    do {                                                                                            \
        cublasStatus_t s_ = (x);                                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                          \
            fprintf(stderr, "cuBLASLt error: %s: %s (%s:%d)\n", #x, cublasLtGetStatusString(s_),    \
                    __FILE__, __LINE__);                                                            \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

/* the floor's GEMMs: D[m, n] = op(A) op(B), column-major, one heuristic pick, beta 0 */
typedef struct {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    const void *A, *B;
    void* D;
    int beta;
} gemm_t;

static void gemm_make_ex(gemm_t* g, cudaDataType_t t, int ta, int tb, int64_t m, int64_t n, int64_t k, const void* A,
                         int64_t lda, const void* B, int64_t ldb, void* D, int64_t ldd, int sm_target, int beta) {
    BK(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    g->beta = beta;
    if (sm_target > 0)
        BK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target, sizeof(sm_target)));
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof(oa)));
    BK(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof(ob)));
    BK(cublasLtMatrixLayoutCreate(&g->a, t, ta ? k : m, ta ? m : k, lda));
    BK(cublasLtMatrixLayoutCreate(&g->b, t, tb ? n : k, tb ? k : n, ldb));
    BK(cublasLtMatrixLayoutCreate(&g->d, t, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    BK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = BLAS_WS;
    BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    BK(cublasLtMatmulAlgoGetHeuristic(g_lt, g->desc, g->a, g->b, g->d, g->d, pref, 1, &r, &found));
    if (!found) { fprintf(stderr, "no cuBLASLt algorithm\n"); exit(1); }
    g->algo = r.algo;
    BK(cublasLtMatmulPreferenceDestroy(pref));
    g->A = A; g->B = B; g->D = D;
}
static void gemm_make(gemm_t* g, cudaDataType_t t, int ta, int tb, int64_t m, int64_t n, int64_t k, const void* A,
                      int64_t lda, const void* B, int64_t ldb, void* D, int64_t ldd) {
    gemm_make_ex(g, t, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, 0, 0);
}
static void gemm_run_on(const gemm_t* g, cudaStream_t st) {
    const float one = 1.0f, zero = 0.0f;
    BK(cublasLtMatmul(g_lt, g->desc, &one, g->A, g->a, g->B, g->b, g->beta ? &one : &zero, g->D, g->d, g->D, g->d,
                      &g->algo, g_blas_ws, BLAS_WS, st));
}
static void gemm_run(const gemm_t* g) { gemm_run_on(g, g_stream); }
static void gemm_free(gemm_t* g) {
    cublasLtMatmulDescDestroy(g->desc);
    cublasLtMatrixLayoutDestroy(g->a); cublasLtMatrixLayoutDestroy(g->b); cublasLtMatrixLayoutDestroy(g->d);
}

/* random 16-bit / fp32 fill, U(-s, s), never zero */
typedef void (*run_fn)(void* ctx);

static float time_it(run_fn f, void* arg) { return bench_time_median(f, arg, g_stream, g_warmup, g_reps); }

typedef struct {
    fl_lce_context* ctx;
    const lcase* c;
    void *hidden, *weight, *targets, *dh, *dw, *ws;
    float *loss, *lse;
    size_t ws_bytes;
    fl_ce_options ce;
    fl_lce_options lo;
    gemm_t g[3];
} job;

static void run_fused(void* p) {
    job* j = (job*)p;
    FLK(fl_linear_cross_entropy_forward_cuda(j->ctx, j->loss, j->lse, j->dh, j->dw, NULL, j->hidden, j->c->H,
                                             j->weight, j->c->H, NULL, j->targets, NULL, 1.0f, j->c->N, j->c->H,
                                             j->c->V, j->c->dt, j->c->dt, FL_INDEX_I64, &j->ce, &j->lo, j->ws,
                                             j->ws_bytes, (fl_stream)g_stream));
}
static void run_fwd(void* p) {
    job* j = (job*)p;
    FLK(fl_linear_cross_entropy_forward_cuda(j->ctx, j->loss, j->lse, NULL, NULL, NULL, j->hidden, j->c->H,
                                             j->weight, j->c->H, NULL, j->targets, NULL, 1.0f, j->c->N, j->c->H,
                                             j->c->V, j->c->dt, j->c->dt, FL_INDEX_I64, &j->ce, &j->lo, j->ws,
                                             j->ws_bytes, (fl_stream)g_stream));
}
static void run_recomp(void* p) {
    job* j = (job*)p;
    run_fwd(p);
    FLK(fl_linear_cross_entropy_backward_cuda(j->ctx, j->dh, j->dw, NULL, j->hidden, j->c->H, j->weight, j->c->H,
                                              NULL, j->targets, j->lse, NULL, 1.0f, j->c->N, j->c->H, j->c->V,
                                              j->c->dt, j->c->dt, FL_INDEX_I64, &j->ce, &j->lo, j->ws, j->ws_bytes,
                                              (fl_stream)g_stream));
}
static void run_g0(void* p) { gemm_run(&((job*)p)->g[0]); }
static void run_g1(void* p) { gemm_run(&((job*)p)->g[1]); }
static void run_g2(void* p) { gemm_run(&((job*)p)->g[2]); }

/* --algos R: every chunk GEMM of the library's plan at R rows (logits, dX, dW with beta 0 and with
 * beta 1: the accumulation of every chunk after the first), with the library's cuBLASLt workspace
 * (8 MiB) and 256-byte alignment, timed for each of cuBLASLt's first ALGO_MAX ranked algorithms:
 * what a timed choice would win over the heuristic's first pick (index 0, the library's default). */
#define ALGO_MAX 24
static float algo_sweep(cudaDataType_t t, const char* name, int ta, int tb, int64_t m, int64_t n, int64_t k,
                        const void* A, int64_t lda, const void* B, int64_t ldb, void* D, int64_t ldd, int beta,
                        size_t ws_bytes, int quiet) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    BK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof(oa)));
    BK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof(ob)));
    BK(cublasLtMatrixLayoutCreate(&la, t, ta ? k : m, ta ? m : k, lda));
    BK(cublasLtMatrixLayoutCreate(&lb, t, tb ? n : k, tb ? k : n, ldb));
    BK(cublasLtMatrixLayoutCreate(&ld, t, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    BK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = ws_bytes;
    BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
    cublasLtMatmulHeuristicResult_t r[ALGO_MAX];
    int found = 0;
    BK(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, ld, ld, pref, ALGO_MAX, r, &found));
    const float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    float best = 1e30f, first = NAN;
    int besti = -1;
    for (int i = 0; i < found; i++) {
        float ms[16];
        int ok = 1;
        for (int rep = 0; rep < 2 + 9 && ok; rep++) {
            CK(cudaEventRecord(e0, g_stream));
            cublasStatus_t st = cublasLtMatmul(g_lt, desc, &one, A, la, B, lb, beta ? &one : &zero, D, ld, D, ld,
                                               &r[i].algo, g_blas_ws, wsb, g_stream);
            if (st != CUBLAS_STATUS_SUCCESS) ok = 0;
            CK(cudaEventRecord(e1, g_stream));
            CK(cudaEventSynchronize(e1));
            if (rep >= 2) CK(cudaEventElapsedTime(&ms[rep - 2], e0, e1));
        }
        int id = -1, tile = -1, stages = -1, splitk = -1, swz = -1, cluster = -1;
        size_t sz;
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof(swz), &sz);
        cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                             sizeof(cluster), &sz);
        const float med = ok ? median(ms, 9) : NAN;
        if (i == 0) first = med;
        if (ok && med < best) { best = med; besti = i; }
        if (!quiet)
            printf("    %-10s algo %2d: %s%8.3f ms  id %d tile %d stages %d splitk %d swizzle %d cluster %d waves %.2f\n",
               name, i, ok ? "" : "FAILED ", (double)med, id, tile, stages, splitk, swz, cluster,
               (double)r[i].wavesCount);
    }
    printf("  ALGOS %s m=%lld n=%lld k=%lld beta=%d ws=%zu MiB: first %.3f ms, best %.3f ms (algo %d of %d)\n", name,
           (long long)m, (long long)n, (long long)k, beta, ws_bytes >> 20, (double)first, (double)best, besti, found);
    fflush(stdout);
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    BK(cublasLtMatmulPreferenceDestroy(pref));
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
    return best;
}

/* --overlap R S1,S2,..: can a chunk's CE run beside the previous chunk's dX and dW GEMMs? At R rows,
 * the CE (fused, in place) on one [R, Vp] region while dX and dW (beta 1) read another, the GEMMs
 * limited to S SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET; 0 = no limit), the CE's grid as
 * FUSEDLOSS_CE_TMA_GRID says (clusters; unset = every SM): each alone, then together (fork/join
 * with events; the CE issued first). Exploratory: the library does not overlap yet. */
static float ovl_time(gemm_t* g, int ng, int ce_on, void* buf, void* loss, const void* tg, int64_t R, int64_t V,
                      int64_t Vp, fl_dtype dt, void* cws, size_t cwb, cudaStream_t sa, cudaStream_t sb) {
    cudaEvent_t e0, e1, eb;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1)); CK(cudaEventCreateWithFlags(&eb, cudaEventDisableTiming));
    float ms[64];
    const int n = g_reps < 64 ? g_reps : 64;
    for (int k = 0; k < n + 3; k++) {
        CK(cudaEventRecord(e0, sa));
        if (ce_on) {
            CK(cudaStreamWaitEvent(sb, e0, 0));
            FLK(fl_cross_entropy_fused_cuda((float*)loss, NULL, buf, buf, tg, NULL, 1.0f, R, V, Vp, dt, FL_INDEX_I64,
                                            NULL, cws, cwb, (fl_stream)sb));
            CK(cudaEventRecord(eb, sb));
        }
        for (int i = 0; i < ng; i++) gemm_run_on(&g[i], sa);
        if (ce_on) CK(cudaStreamWaitEvent(sa, eb, 0));
        CK(cudaEventRecord(e1, sa));
        CK(cudaEventSynchronize(e1));
        if (k >= 3) CK(cudaEventElapsedTime(&ms[k - 3], e0, e1));
    }
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1)); CK(cudaEventDestroy(eb));
    return median(ms, n);
}

static void overlap_probe(cudaDataType_t t, const lcase* c, job* j, void* logits, int64_t Vp) {
    const int64_t R = g_ovl_rows;
    const size_t es = dt_size(c->dt);
    if (2 * R > c->N) { printf("  overlap: needs 2 R <= N\n"); return; }
    void* bufB = (char*)logits + (size_t)(R * Vp) * es;  /* the CE's region; the GEMMs read the first */
    size_t cwb = 0;
    FLK(fl_cross_entropy_workspace_size(&cwb, R, c->V, c->dt, NULL));
    void* cws = NULL;
    CK(cudaMalloc(&cws, cwb));
    cudaStream_t sb;
    CK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
    const char* gr = getenv("FUSEDLOSS_CE_TMA_GRID");
    const float ce = ovl_time(NULL, 0, 1, bufB, j->loss, j->targets, R, c->V, Vp, c->dt, cws, cwb, g_stream, sb);
    for (int si = 0; si < g_ovl_n; si++) {
        const int S = g_ovl_sms[si];
        gemm_t g[2];
        gemm_make_ex(&g[0], t, 0, 0, c->H, R, Vp, j->weight, c->H, logits, Vp, j->dh, c->H, S, 0);
        gemm_make_ex(&g[1], t, 0, 1, c->H, Vp, R, j->hidden, c->H, logits, Vp, j->dw, c->H, S, 1);
        const float gx = ovl_time(&g[0], 1, 0, NULL, NULL, NULL, R, c->V, Vp, c->dt, cws, cwb, g_stream, sb);
        const float gw = ovl_time(&g[1], 1, 0, NULL, NULL, NULL, R, c->V, Vp, c->dt, cws, cwb, g_stream, sb);
        const float both = ovl_time(g, 2, 1, bufB, j->loss, j->targets, R, c->V, Vp, c->dt, cws, cwb, g_stream, sb);
        printf("OVERLAP %lldx%lldx%lld rows %lld ce_grid %s gemm_sms %d: CE alone %.3f  dX %.3f  dW(beta 1) %.3f  "
               "sum %.3f  together %.3f ms  (hidden %.3f of the CE's %.3f)\n",
               (long long)c->N, (long long)c->H, (long long)c->V, (long long)R, gr ? gr : "all", S, (double)ce,
               (double)gx, (double)gw, (double)(ce + gx + gw), (double)both, (double)(ce + gx + gw - both), (double)ce);
        fflush(stdout);
        gemm_free(&g[0]);
        gemm_free(&g[1]);
    }
    CK(cudaStreamDestroy(sb));
    CK(cudaFree(cws));
}

int main(int argc, char** argv) {
    lcase cases[32];
    int nc = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--case") && i + 5 < argc && nc < 32) {
            lcase c;
            c.N = atoll(argv[i + 1]); c.H = atoll(argv[i + 2]); c.V = atoll(argv[i + 3]);
            if (!parse_dt(argv[i + 4], &c.dt)) { fprintf(stderr, "bad dtype %s\n", argv[i + 4]); return 2; }
            c.budget = (size_t)atoll(argv[i + 5]) << 20;
            cases[nc++] = c;
            i += 5;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            g_reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            g_warmup = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--phases") && i + 1 < argc) {
            g_phase_rows = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--algos") && i + 1 < argc) {
            g_algo_rows = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--overlap") && i + 2 < argc) {
            g_ovl_rows = atoll(argv[++i]);
            for (char* q = argv[++i]; *q && g_ovl_n < 16;) {
                g_ovl_sms[g_ovl_n++] = (int)strtol(q, &q, 10);
                if (*q == ',') q++; else break;
            }
        } else if (!strcmp(argv[i], "--fused-only")) {
            g_fused_only = 1;  /* chunk-size sweeps: no tuned floor, no recompute / forward-only timing */
        } else if (!strcmp(argv[i], "--chunk-rows") && i + 1 < argc) {
            g_chunk_rows = atoll(argv[++i]);
        } else if (!strcmp(argv[i], "--no-tune")) {
            g_tune = 0;
        } else if (!strcmp(argv[i], "--no-floor")) {
            g_no_floor = 1;  /* for profiles: only the library's kernels */
        } else {
            fprintf(stderr, "usage: bench_linear_ce [--case N H V dtype budget_MiB]... [--reps R] [--warmup W] [--phases R] [--algos R] [--chunk-rows R] [--overlap R S,S..] [--fused-only] [--no-tune] [--no-floor]\n");
            return 2;
        }
    }
    if (nc == 0) {
        const lcase def[] = {
            {8192, 4096, 128256, FL_DTYPE_BF16, (size_t)512 << 20},
            {8192, 4096, 128256, FL_DTYPE_BF16, (size_t)256 << 20},
            {8192, 768, 50257, FL_DTYPE_BF16, (size_t)512 << 20},
            {8192, 2304, 256000, FL_DTYPE_BF16, (size_t)256 << 20},
        };
        nc = (int)(sizeof(def) / sizeof(def[0]));
        memcpy(cases, def, sizeof(def));
    }
    struct cudaDeviceProp prop;
    double copy_gbps;
    char commit[64], date[32];
    int rc = bench_begin(&g_stream, &prop, &copy_gbps, commit, sizeof(commit), date, sizeof(date));
    if (rc >= 0) return rc;
    BK(cublasLtCreate(&g_lt));
    CK(cudaMalloc(&g_blas_ws, BLAS_WS));
    fl_lce_context* ctx = NULL;
    FLK(fl_lce_context_create(&ctx));

    for (int ci = 0; ci < nc; ci++) {
        const lcase* c = &cases[ci];
        job j;
        memset(&j, 0, sizeof(j));
        j.ctx = ctx; j.c = c;
        const size_t es = dt_size(c->dt);
        const int64_t Vp = (c->V + 63) / 64 * 64;
        j.hidden = bench_dev_random((size_t)(c->N * c->H), c->dt, 1.0f, 11 + ci);
        j.weight = bench_dev_random((size_t)(Vp * c->H), c->dt, 0.05f, 23 + ci);  /* Vp rows: the floor uses them */
        int64_t* ht = (int64_t*)malloc(sizeof(int64_t) * (size_t)c->N);
        for (int64_t i = 0; i < c->N; i++) ht[i] = (int64_t)(mix64(1000 + (uint64_t)i) % (uint64_t)c->V);
        CK(cudaMalloc(&j.targets, sizeof(int64_t) * (size_t)c->N));
        CK(cudaMemcpy(j.targets, ht, sizeof(int64_t) * (size_t)c->N, cudaMemcpyHostToDevice));
        free(ht);
        CK(cudaMalloc(&j.dh, (size_t)(c->N * c->H) * es));
        CK(cudaMalloc(&j.dw, (size_t)(Vp * c->H) * es));
        CK(cudaMalloc((void**)&j.loss, sizeof(float) * (size_t)c->N));
        CK(cudaMalloc((void**)&j.lse, sizeof(float) * (size_t)c->N));
        fl_ce_options ce = FL_CE_OPTIONS_INIT;
        fl_lce_options lo = FL_LCE_OPTIONS_INIT;
        lo.byte_budget = c->budget;
        lo.chunk_rows = g_chunk_rows;
        j.ce = ce; j.lo = lo;
        FLK(fl_linear_cross_entropy_workspace_size(&j.ws_bytes, c->N, c->H, c->V, c->dt, c->dt, &j.ce, &j.lo));
        CK(cudaMalloc(&j.ws, j.ws_bytes));

        /* the floor: three full GEMMs at Vp */
        void* logits = NULL;
        CK(cudaMalloc(&logits, (size_t)(c->N * Vp) * es));
        CK(cudaMemsetAsync(logits, 0x3c, (size_t)(c->N * Vp) * es, g_stream)); /* ~1.0 in bf16/f16: non-zero */
        const cudaDataType_t t = c->dt == FL_DTYPE_F32 ? CUDA_R_32F : c->dt == FL_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
        gemm_make(&j.g[0], t, 1, 0, Vp, c->N, c->H, j.weight, c->H, j.hidden, c->H, logits, Vp);
        gemm_make(&j.g[1], t, 0, 0, c->H, c->N, Vp, j.weight, c->H, logits, Vp, j.dh, c->H);
        gemm_make(&j.g[2], t, 0, 1, c->H, Vp, c->N, j.hidden, c->H, logits, Vp, j.dw, c->H);
        const float t0 = g_no_floor ? NAN : time_it(run_g0, &j), t1 = g_no_floor ? NAN : time_it(run_g1, &j),
                    t2 = g_no_floor ? NAN : time_it(run_g2, &j);
        const float floor_ms = t0 + t1 + t2;
        for (int k = 0; k < 3; k++) gemm_free(&j.g[k]);
        /* the tuned floor: each full GEMM under the fastest of cuBLASLt's ranked algorithms (32 MiB
         * of cuBLASLt workspace: every advantage the floor can have), to set beside the tuned op */
        float tfl = NAN;
        if (!g_no_floor && g_tune && !g_fused_only)
            tfl = algo_sweep(t, "full-logits", 1, 0, Vp, c->N, c->H, j.weight, c->H, j.hidden, c->H, logits, Vp, 0,
                             BLAS_WS, 1) +
                  algo_sweep(t, "full-dX", 0, 0, c->H, c->N, Vp, j.weight, c->H, logits, Vp, j.dh, c->H, 0, BLAS_WS, 1) +
                  algo_sweep(t, "full-dW", 0, 1, c->H, Vp, c->N, j.hidden, c->H, logits, Vp, j.dw, c->H, 0, BLAS_WS, 1);
        if (g_phase_rows > 0 && g_phase_rows <= c->N) {
            /* the pieces of one chunk of R rows, each alone: what chunking costs the GEMMs, and the CE */
            const int64_t R = g_phase_rows;
            job q = j;
            gemm_make(&q.g[0], t, 1, 0, Vp, R, c->H, j.weight, c->H, j.hidden, c->H, logits, Vp);
            gemm_make(&q.g[1], t, 0, 0, c->H, R, Vp, j.weight, c->H, logits, Vp, j.dh, c->H);
            gemm_make(&q.g[2], t, 0, 1, c->H, Vp, R, j.hidden, c->H, logits, Vp, j.dw, c->H);
            const float p0 = time_it(run_g0, &q), p1 = time_it(run_g1, &q), p2 = time_it(run_g2, &q);
            for (int k = 0; k < 3; k++) gemm_free(&q.g[k]);
            size_t cwb = 0;
            FLK(fl_cross_entropy_workspace_size(&cwb, R, c->V, c->dt, NULL));
            void* cws = NULL;
            CK(cudaMalloc(&cws, cwb));
            /* the CE alone, in place on the first R rows (overlap_probe's timer, one stream) */
            const float pce = ovl_time(NULL, 0, 1, logits, j.loss, j.targets, R, c->V, Vp, c->dt, cws, cwb, g_stream,
                                       g_stream);
            CK(cudaFree(cws));
            const double nch = (double)((c->N + R - 1) / R);
            printf("  phases at %lld rows (x%.0f chunks): logits %.3f dX %.3f dW(beta 0) %.3f CE fused in place %.3f ms;"
                   " GEMMs x chunks %.3f ms (whole %.3f), CE x chunks %.3f ms\n",
                   (long long)R, nch, (double)p0, (double)p1, (double)p2, (double)pce, nch * (double)(p0 + p1 + p2),
                   (double)floor_ms, nch * (double)pce);
        }
        if (g_ovl_rows > 0) overlap_probe(t, c, &j, logits, Vp);
        if (g_algo_rows > 0 && g_algo_rows <= c->N) {
            const int64_t R = g_algo_rows;
            algo_sweep(t, "logits", 1, 0, Vp, R, c->H, j.weight, c->H, j.hidden, c->H, logits, Vp, 0, (size_t)8 << 20, 0);
            algo_sweep(t, "dX", 0, 0, c->H, R, Vp, j.weight, c->H, logits, Vp, j.dh, c->H, 0, (size_t)8 << 20, 0);
            algo_sweep(t, "dW-beta0", 0, 1, c->H, Vp, R, j.hidden, c->H, logits, Vp, j.dw, c->H, 0, (size_t)8 << 20, 0);
            algo_sweep(t, "dW-beta1", 0, 1, c->H, Vp, R, j.hidden, c->H, logits, Vp, j.dw, c->H, 1, (size_t)8 << 20, 0);
        }
        CK(cudaFree(logits));

        const float tf = time_it(run_fused, &j);
        const float tr = g_fused_only ? NAN : time_it(run_recomp, &j), tw = g_fused_only ? NAN : time_it(run_fwd, &j);
        /* the same calls after a tuning call of each mode on the context (fl_lce_context_set_tuning) */
        float tf2 = NAN, tr2 = NAN, tw2 = NAN;
        if (g_tune) {
            FLK(fl_lce_context_set_tuning(ctx, 1));
            run_fused(&j);
            if (!g_fused_only) run_recomp(&j);
            FLK(fl_lce_context_set_tuning(ctx, 0));
            CK(cudaStreamSynchronize(g_stream));
            tf2 = time_it(run_fused, &j);
            if (!g_fused_only) { tr2 = time_it(run_recomp, &j); tw2 = time_it(run_fwd, &j); }
        }
        /* the tuned fused call captured in a CUDA graph, replays queued back to back: its GPU
         * time with the host's enqueue out of the way (time_it's calls each start on an idle GPU) */
        float tgr = NAN;
        if (g_tune) {
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
            run_fused(&j);
            CK(cudaStreamEndCapture(g_stream, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            tgr = bench_graph_replay_ms(ge, g_stream, g_reps, NULL);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(gr));
        }
        float hloss = 0.0f;
        CK(cudaMemcpy(&hloss, j.loss, sizeof(float), cudaMemcpyDeviceToHost));
        const double fl1 = 2.0 * (double)c->N * (double)c->H * (double)c->V;
        const double wsg = (double)j.ws_bytes / (double)(1u << 30);
        printf("\ncase N=%lld H=%lld V=%lld %s budget %zu MiB chunk_rows %lld: workspace %.3f GiB  loss %.5f\n",
               (long long)c->N, (long long)c->H, (long long)c->V, dt_name(c->dt), c->budget >> 20,
               (long long)g_chunk_rows, wsg, (double)hloss);
        printf("  gemm3 (V->%lld) %8.3f ms  (logits %.3f, dX %.3f, dW %.3f)  %.0f TFLOP/s\n", (long long)Vp,
               (double)floor_ms, (double)t0, (double)t1, (double)t2, 3.0 * fl1 * (double)Vp / (double)c->V /
               ((double)floor_ms * 1e9));
        printf("  fused        %8.3f ms  %.0f TFLOP/s (6NHV)  ratio %.3f\n", (double)tf, 3.0 * fl1 / ((double)tf * 1e9),
               (double)(tf / floor_ms));
        printf("  recompute    %8.3f ms  %.0f TFLOP/s (8NHV)  ratio %.3f\n", (double)tr, 4.0 * fl1 / ((double)tr * 1e9),
               (double)(tr / floor_ms));
        printf("  fwd only     %8.3f ms  %.0f TFLOP/s (2NHV)  ratio to the logits GEMM %.3f\n", (double)tw,
               fl1 / ((double)tw * 1e9), (double)(tw / t0));
        if (g_tune) {
            printf("  tuned gemm3  %8.3f ms  (each full GEMM under its fastest ranked algorithm)\n", (double)tfl);
            printf("  tuned fused  %8.3f ms  ratio %.3f (to the tuned gemm3 %.3f)\n", (double)tf2,
                   (double)(tf2 / floor_ms), (double)(tf2 / tfl));
            printf("  tuned recomp %8.3f ms  ratio %.3f (to the tuned gemm3 %.3f)\n", (double)tr2,
                   (double)(tr2 / floor_ms), (double)(tr2 / tfl));
            printf("  tuned fwd    %8.3f ms\n", (double)tw2);
            printf("  tuned fused, CUDA graph replays %8.3f ms  ratio %.3f\n", (double)tgr, (double)(tgr / floor_ms));
        }
        printf("SUMMARY %lldx%lldx%lld %s budget=%zuMiB rows=%lld fused %.3f ms ratio %.3f | recompute %.3f ms ratio %.3f | "
               "fwd %.3f ms | gemm3 %.3f ms | tuned: fused %.3f ms ratio %.3f (%.3f to tuned gemm3 %.3f ms) "
               "recompute %.3f ms fwd %.3f ms graph %.3f ms | ws %.3f GiB | %s %s\n",
               (long long)c->N, (long long)c->H, (long long)c->V, dt_name(c->dt), c->budget >> 20,
               (long long)g_chunk_rows, (double)tf, (double)(tf / floor_ms), (double)tr, (double)(tr / floor_ms), (double)tw, (double)floor_ms,
               (double)tf2, (double)(tf2 / floor_ms), (double)(tf2 / tfl), (double)tfl, (double)tr2, (double)tw2, (double)tgr, wsg,
               commit, date);
        fflush(stdout);
        CK(cudaFree(j.hidden)); CK(cudaFree(j.weight)); CK(cudaFree(j.targets)); CK(cudaFree(j.dh));
        CK(cudaFree(j.dw)); CK(cudaFree(j.loss)); CK(cudaFree(j.lse)); CK(cudaFree(j.ws));
    }
    fl_lce_context_destroy(ctx);
    cublasLtDestroy(g_lt);
    CK(cudaFree(g_blas_ws));
    return 0;
}
