/* test_vp_linear_cuda.c — GPU tests of the CUDA linear vocab-parallel cross-entropy (header
 * section 8, linear variant) against the CPU backend (itself checked bitwise against the logits
 * steps and the single-rank linear CE by tests/test_vp_linear.c).
 *
 * k ranks simulated on one GPU (every rank's weight a view of rows of one device buffer, its bias
 * its own copy; the all-gather done through the host): per case (tests/vp_linear_util.h problems,
 * CUDA outputs poisoned with 0xff = NaN before every call, so an unwritten element fails):
 *   - step 1' (fl_vp_linear_ce_local_stats_cuda) on every rank, gathered, step 3 on the GPU
 *     (fl_vp_ce_combine_cuda): loss and lse versus the CPU steps on the same inputs;
 *   - step 4' (fl_vp_linear_ce_backward_cuda) on every rank from the GPU lse: the partials summed
 *     over the ranks, and each shard's dweight / dbias, versus the CPU's (normwise relative error,
 *     the tolerance table below, as tests/test_linear_cross_entropy_cuda.c);
 *   - dtypes fp32 / fp16 / bf16, fp32 dweight with 16-bit inputs, uneven shards with an odd
 *     number of rows each (the GEMMs' V % 64 tail), chunks of 1 .. all rows, every CE option group;
 *   - the collective entry fl_vp_linear_cross_entropy_nccl on a one-rank NCCL communicator versus
 *     fl_linear_cross_entropy_forward_cuda (mode 1) on the same GPU (when NCCL can be loaded:
 *     FUSEDLOSS_NCCL_LIBRARY or libnccl.so.2);
 *   - CUDA graph capture + replay of step 4' == eager, bitwise; two eager runs bitwise equal;
 *   - an out-of-range target: the error flag set by step 1', the loss NaN after step 3;
 *   - bad arguments: NULL context, misaligned dhidden_partial / ld (FL_ERR_UNSUPPORTED).
 * Usage: test_vp_linear_cuda [--small] [--no-nccl]  (--small: the compute-sanitizer grid; --no-nccl: skip
 *   the collective entry, e.g. under memcheck, which reports the API errors of NCCL's own kernel-image
 *   probing inside ncclCommInitAll: cudaErrorNoKernelImageForDevice from cudaFuncGetAttributes)
 * Prints "N passed, M failed"; exit status 1 on any failure; "SKIP" without a GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "ce_configs.h"
#include "vp_linear_util.h"
#include "cuda_check.h"

/* normwise ||cuda - cpu|| / ||cpu|| per dtype of the inputs, and per-element loss bounds
 * |cuda - cpu| <= atol + rtol |cpu| (16-bit logits rounded from fp32 on the GPU and from double on
 * the CPU may differ by one ulp of the dtype): tests/test_linear_cross_entropy_cuda.c's table */
typedef struct { double grad_norm, loss_atol, loss_rtol; } tol_t;
static const tol_t TOL[3] = {
    /* F32  */ {2e-5, 1e-5, 1e-5},
    /* F16  */ {4e-3, 2e-3, 1e-3},
    /* BF16 */ {2e-2, 2e-2, 4e-3},
};
static const char* DT[3] = {"f32", "f16", "bf16"};

static cudaStream_t g_s;
static fl_lce_context* g_ctx;

#define RUN(expr, what)                  \
    do {                                 \
        const fl_status st_ = (expr);    \
        CHECK_STATUS(st_, FL_OK, what);  \
    } while (0)

static void* dalloc(size_t n) { void* p = NULL; CK(cudaMalloc(&p, n ? n : 16)); return p; }
static void* dup_d(const void* h, size_t n) {
    void* d = dalloc(n);
    if (n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}
static void d2h(void* h, const void* d, size_t n) { if (n) CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }
static void poison_d(void* d, size_t n) { if (n) CK(cudaMemsetAsync(d, 0xff, n, g_s)); }

/* normwise relative error of got (dtype dt) vs ref (dtype dt), n elements; NaN anywhere fails */
static void check_norm(const char* name, const void* got, fl_dtype gdt, const void* ref, fl_dtype rdt, size_t n,
                       double tol) {
    double num = 0.0, den = 0.0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        const double g = tu_load(got, gdt, (int64_t)i), r = tu_load(ref, rdt, (int64_t)i);
        if (isnan(g) || isnan(r)) nan = 1;
        num += (g - r) * (g - r);
        den += r * r;
    }
    const double err = den > 0.0 ? sqrt(num / den) : sqrt(num);
    CHECK(!nan && err <= tol, "%s %s: normwise error %.3g (tol %.3g)%s", tu_context, name, err, tol,
          nan ? ", NaN present" : "");
}

static void check_loss(const char* name, const float* got, const float* ref, int64_t n, fl_dtype dt) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - (double)ref[i]);
        const int ok = (isnan(got[i]) && isnan(ref[i])) || d <= TOL[dt].loss_atol + TOL[dt].loss_rtol * fabs(ref[i]);
        if (!ok && bad++ < 3) printf("  %s %s[%lld]: got %.9g ref %.9g\n", tu_context, name, (long long)i, got[i], ref[i]);
    }
    CHECK(bad == 0, "%s %s: %lld of %lld outside the tolerance", tu_context, name, (long long)bad, (long long)n);
}

/* the device copy of a problem */
typedef struct {
    void *hidden, *weight, *targets, *bias_shard[VPL_MAX_K];
    float *w, *off, *grad_loss;
    fl_ce_options opts;  /* weight / logit_offset pointing at the device arrays */
} dprob;

static void dprob_make(dprob* D, const vpl_prob* P) {
    memset(D, 0, sizeof *D);
    const size_t es = vpl_es(P->dt), n1 = (size_t)(P->N > 0 ? P->N : 1);
    D->hidden = dup_d(P->hidden, n1 * (size_t)P->ldh * es);
    D->weight = dup_d(P->weight, (size_t)P->V * (size_t)P->ldw * es);
    D->targets = dup_d(P->targets, n1 * (P->it == FL_INDEX_I64 ? 8u : 4u));
    for (int r = 0; r < P->k; r++)
        if (P->bias_shard[r]) D->bias_shard[r] = dup_d(P->bias_shard[r], (size_t)vpl_vl(P, r) * es);
    D->opts = P->opts;
    if (P->w) D->opts.weight = D->w = (float*)dup_d(P->w, (size_t)P->V * 4);
    if (P->off) D->opts.logit_offset = D->off = (float*)dup_d(P->off, (size_t)P->V * 4);
    if (P->grad_loss) {
        const int64_t ng = P->opts.reduction == FL_REDUCTION_NONE ? P->N : 1;
        D->grad_loss = (float*)dup_d(P->grad_loss, (size_t)(ng > 0 ? ng : 1) * 4);
    }
}
static void dprob_free(dprob* D, int k) {
    cudaFree(D->hidden); cudaFree(D->weight); cudaFree(D->targets); cudaFree(D->w); cudaFree(D->off);
    cudaFree(D->grad_loss);
    for (int r = 0; r < k; r++) cudaFree(D->bias_shard[r]);
}
static const void* dweight_shard(const dprob* D, const vpl_prob* P, int r) {
    return (const char*)D->weight + (size_t)P->cut[r] * (size_t)P->ldw * vpl_es(P->dt);
}

static void run_case(tu_rng* rng, int64_t N, int64_t H, int64_t V, fl_dtype dt, fl_dtype wdt, int cfg, int k,
                     int uneven, int has_bias, int grad_mode, int64_t chunk_rows, int graph) {
    vpl_prob P;
    vpl_make(&P, rng, N, H, V, dt, wdt, FL_INDEX_I64, cfg, k, uneven, has_bias, grad_mode);
    dprob D;
    dprob_make(&D, &P);
    char ctx[256];
    snprintf(ctx, sizeof ctx, "[N=%lld H=%lld V=%lld %s/w%s k=%d%s '%s' bias=%d g=%d chunk=%lld]", (long long)N,
             (long long)H, (long long)V, DT[dt], DT[wdt], k, uneven ? " uneven" : "", CFGS[cfg].name, has_bias,
             grad_mode, (long long)chunk_rows);
    tu_context = ctx;
    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
    lo.chunk_rows = chunk_rows;
    const size_t es = vpl_es(dt), wes = vpl_es(wdt), n1 = (size_t)(N > 0 ? N : 1);
    const int none = P.opts.reduction == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;

    /* ---- steps 1' (GPU and CPU), 3 ---- */
    float* g_gpu = (float*)tu_xmalloc((size_t)k * n1 * 16);
    float* g_cpu = (float*)tu_xmalloc((size_t)k * n1 * 16);
    float* st_d = (float*)dalloc(n1 * 16);
    for (int r = 0; r < k; r++) {
        const int64_t vl = vpl_vl(&P, r);
        size_t b = 0;
        RUN(fl_vp_linear_ce_workspace_size(&b, N, H, vl, V, dt, wdt, 1, &P.opts, &lo), "ws size");
        void* ws_d = dalloc(b);
        poison_d(st_d, n1 * 16);
        RUN(fl_vp_linear_ce_local_stats_cuda(g_ctx, st_d, D.hidden, P.ldh, dweight_shard(&D, &P, r), P.ldw,
                                             D.bias_shard[r], D.targets, N, H, vl, P.cut[r], V, dt, FL_INDEX_I64,
                                             &D.opts, &lo, ws_d, b, (fl_stream)g_s),
            "fl_vp_linear_ce_local_stats_cuda");
        CK(cudaStreamSynchronize(g_s));
        d2h(g_gpu + (size_t)r * n1 * 4, st_d, (size_t)N * 16);
        cudaFree(ws_d);
        void* ws = tu_xmalloc(b);
        RUN(fl_vp_linear_ce_local_stats_cpu(g_cpu + (size_t)r * n1 * 4, P.hidden, P.ldh, vpl_weight_shard(&P, r),
                                            P.ldw, P.bias_shard[r], P.targets, N, H, vl, P.cut[r], V, dt,
                                            FL_INDEX_I64, &P.opts, &lo, ws, b),
            "fl_vp_linear_ce_local_stats_cpu");
        free(ws);
    }
    /* the gathered stats are [k][N][4]: repack from the n1 stride */
    for (int r = 1; r < k; r++) {
        memmove(g_gpu + (size_t)r * (size_t)N * 4, g_gpu + (size_t)r * n1 * 4, (size_t)N * 16);
        memmove(g_cpu + (size_t)r * (size_t)N * 4, g_cpu + (size_t)r * n1 * 4, (size_t)N * 16);
    }
    float* loss_c = (float*)tu_xmalloc((size_t)(nl > 0 ? nl : 1) * 4);
    float* lse_c = (float*)tu_xmalloc(n1 * 4);
    float* loss_g = (float*)tu_xmalloc((size_t)(nl > 0 ? nl : 1) * 4);
    float* lse_g = (float*)tu_xmalloc(n1 * 4);
    float* lse_d = (float*)dalloc(n1 * 4);
    {
        size_t b = 0;
        RUN(fl_cross_entropy_workspace_size(&b, N, V, FL_DTYPE_F32, &P.opts), "ce ws");
        void* ws = tu_xmalloc(b);
        RUN(fl_vp_ce_combine_cpu(loss_c, lse_c, g_cpu, k, P.targets, N, V, FL_INDEX_I64, &P.opts, ws, b),
            "fl_vp_ce_combine_cpu");
        free(ws);
        void* ws_d = dalloc(b);
        float* gath_d = (float*)dup_d(g_gpu, (size_t)k * n1 * 16);
        float* loss_d = (float*)dalloc((size_t)(nl > 0 ? nl : 1) * 4);
        poison_d(loss_d, (size_t)(nl > 0 ? nl : 1) * 4);
        poison_d(lse_d, n1 * 4);
        RUN(fl_vp_ce_combine_cuda(loss_d, lse_d, gath_d, k, D.targets, N, V, FL_INDEX_I64, &D.opts, ws_d, b,
                                  (fl_stream)g_s),
            "fl_vp_ce_combine_cuda");
        CK(cudaStreamSynchronize(g_s));
        d2h(loss_g, loss_d, (size_t)nl * 4);
        d2h(lse_g, lse_d, (size_t)N * 4);
        cudaFree(ws_d); cudaFree(gath_d); cudaFree(loss_d);
        check_loss("loss", loss_g, loss_c, nl, dt);
        check_loss("lse", lse_g, lse_c, N, dt);
    }

    /* ---- step 4' ---- */
    float* dh_g = (float*)calloc(n1 * (size_t)H, sizeof(float));
    float* dh_c = (float*)calloc(n1 * (size_t)H, sizeof(float));
    float* dhp_h = (float*)tu_xmalloc(n1 * (size_t)H * 4);
    float* dhp_d = (float*)dalloc(n1 * (size_t)H * 4);
    for (int r = 0; r < k; r++) {
        const int64_t vl = vpl_vl(&P, r);
        size_t b = 0;
        RUN(fl_vp_linear_ce_workspace_size(&b, N, H, vl, V, dt, wdt, 1, &P.opts, &lo), "ws size");
        void* ws_d = dalloc(b);
        void* dw_d = dalloc((size_t)vl * (size_t)H * wes);
        void* db_d = dalloc((size_t)vl * wes);
        poison_d(dhp_d, n1 * (size_t)H * 4);
        poison_d(dw_d, (size_t)vl * (size_t)H * wes);
        poison_d(db_d, (size_t)vl * wes);
        void* dbp = has_bias ? db_d : NULL;
        RUN(fl_vp_linear_ce_backward_cuda(g_ctx, dhp_d, dw_d, dbp, D.hidden, P.ldh, dweight_shard(&D, &P, r), P.ldw,
                                          D.bias_shard[r], D.targets, lse_d, D.grad_loss, P.grad_scale, N, H, vl,
                                          P.cut[r], V, dt, wdt, FL_INDEX_I64, &D.opts, &lo, ws_d, b, (fl_stream)g_s),
            "fl_vp_linear_ce_backward_cuda");
        CK(cudaStreamSynchronize(g_s));
        void* dw_g = tu_xmalloc((size_t)vl * (size_t)H * wes);
        void* db_g = tu_xmalloc((size_t)vl * wes);
        d2h(dhp_h, dhp_d, (size_t)N * (size_t)H * 4);
        d2h(dw_g, dw_d, (size_t)vl * (size_t)H * wes);
        d2h(db_g, db_d, (size_t)vl * wes);
        for (size_t q = 0; q < (size_t)N * (size_t)H; q++) dh_g[q] += dhp_h[q];
        if (graph && r == k - 1) {
            /* the same call captured and replayed, and run again eagerly: bitwise */
            void* dw2 = tu_xmalloc((size_t)vl * (size_t)H * wes);
            float* dhp2 = (float*)tu_xmalloc(n1 * (size_t)H * 4);
            for (int rep = 0; rep < 2; rep++) {
                poison_d(dhp_d, n1 * (size_t)H * 4);
                poison_d(dw_d, (size_t)vl * (size_t)H * wes);
                if (rep == 0) {
                    cudaGraph_t gr;
                    cudaGraphExec_t ge;
                    CK(cudaStreamBeginCapture(g_s, cudaStreamCaptureModeThreadLocal));
                    const fl_status st = fl_vp_linear_ce_backward_cuda(
                        g_ctx, dhp_d, dw_d, dbp, D.hidden, P.ldh, dweight_shard(&D, &P, r), P.ldw, D.bias_shard[r],
                        D.targets, lse_d, D.grad_loss, P.grad_scale, N, H, vl, P.cut[r], V, dt, wdt, FL_INDEX_I64,
                        &D.opts, &lo, ws_d, b, (fl_stream)g_s);
                    CK(cudaStreamEndCapture(g_s, &gr));
                    CHECK_STATUS(st, FL_OK, "captured fl_vp_linear_ce_backward_cuda");
                    CK(cudaGraphInstantiate(&ge, gr, 0));
                    CK(cudaGraphLaunch(ge, g_s));
                    CK(cudaStreamSynchronize(g_s));
                    CK(cudaGraphExecDestroy(ge));
                    CK(cudaGraphDestroy(gr));
                } else {
                    RUN(fl_vp_linear_ce_backward_cuda(g_ctx, dhp_d, dw_d, dbp, D.hidden, P.ldh,
                                                      dweight_shard(&D, &P, r), P.ldw, D.bias_shard[r], D.targets,
                                                      lse_d, D.grad_loss, P.grad_scale, N, H, vl, P.cut[r], V, dt,
                                                      wdt, FL_INDEX_I64, &D.opts, &lo, ws_d, b, (fl_stream)g_s),
                        "fl_vp_linear_ce_backward_cuda (again)");
                    CK(cudaStreamSynchronize(g_s));
                }
                d2h(dhp2, dhp_d, (size_t)N * (size_t)H * 4);
                d2h(dw2, dw_d, (size_t)vl * (size_t)H * wes);
                check_bitwise(rep == 0 ? "graph replay dhidden_partial == eager" : "second run dhidden_partial",
                              dhp2, dhp_h, (size_t)N * (size_t)H * 4);
                check_bitwise(rep == 0 ? "graph replay dweight == eager" : "second run dweight", dw2, dw_g,
                              (size_t)vl * (size_t)H * wes);
            }
            free(dw2);
            free(dhp2);
        }
        /* the CPU step 4' from the CPU lse */
        void* ws = tu_xmalloc(b);
        void* dw_c = tu_xmalloc((size_t)vl * (size_t)H * wes);
        void* db_c = tu_xmalloc((size_t)vl * wes);
        RUN(fl_vp_linear_ce_backward_cpu(dhp_h, dw_c, has_bias ? db_c : NULL, P.hidden, P.ldh, vpl_weight_shard(&P, r),
                                         P.ldw, P.bias_shard[r], P.targets, lse_c, P.grad_loss, P.grad_scale, N, H, vl,
                                         P.cut[r], V, dt, wdt, FL_INDEX_I64, &P.opts, &lo, ws, b),
            "fl_vp_linear_ce_backward_cpu");
        for (size_t q = 0; q < (size_t)N * (size_t)H; q++) dh_c[q] += dhp_h[q];
        char nm[64];
        snprintf(nm, sizeof nm, "dweight rank %d", r);
        check_norm(nm, dw_g, wdt, dw_c, wdt, (size_t)vl * (size_t)H, TOL[dt].grad_norm);
        if (has_bias) {
            snprintf(nm, sizeof nm, "dbias rank %d", r);
            check_norm(nm, db_g, wdt, db_c, wdt, (size_t)vl, TOL[dt].grad_norm);
        }
        free(ws); free(dw_c); free(db_c); free(dw_g); free(db_g);
        cudaFree(ws_d); cudaFree(dw_d); cudaFree(db_d);
    }
    check_norm("dhidden (partials summed)", dh_g, FL_DTYPE_F32, dh_c, FL_DTYPE_F32, (size_t)N * (size_t)H,
               TOL[dt].grad_norm);
    (void)es;
    free(g_gpu); free(g_cpu); free(loss_c); free(lse_c); free(loss_g); free(lse_g); free(dh_g); free(dh_c);
    free(dhp_h);
    cudaFree(st_d); cudaFree(lse_d); cudaFree(dhp_d);
    dprob_free(&D, k);
    vpl_free(&P);
    tu_context = "";
}

/* ---- the collective entry on a one-rank NCCL communicator vs the single-GPU mode 1 ---------- */

typedef int (*init_all_fn)(void** comms, int ndev, const int* devlist);
typedef int (*destroy_fn)(void* comm);

static void nccl_case(void* comm, tu_rng* rng, int64_t N, int64_t H, int64_t V, fl_dtype dt, fl_dtype wdt, int cfg,
                      int has_bias, int64_t chunk_rows, int loss_only) {
    vpl_prob P;
    vpl_make(&P, rng, N, H, V, dt, wdt, FL_INDEX_I64, cfg, 1, 0, has_bias, 1);
    dprob D;
    dprob_make(&D, &P);
    char ctx[256];
    snprintf(ctx, sizeof ctx, "[nccl k=1 N=%lld H=%lld V=%lld %s/w%s '%s' bias=%d chunk=%lld%s]", (long long)N,
             (long long)H, (long long)V, DT[dt], DT[wdt], CFGS[cfg].name, has_bias, (long long)chunk_rows,
             loss_only ? " loss only" : "");
    tu_context = ctx;
    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
    lo.chunk_rows = chunk_rows;
    const size_t es = vpl_es(dt), wes = vpl_es(wdt), n1 = (size_t)(N > 0 ? N : 1);
    const int64_t nl = P.opts.reduction == FL_REDUCTION_NONE ? N : 1;
    float *loss[2], *lse[2];
    void *dh[2], *dw[2], *db[2];
    void* bias_d = D.bias_shard[0];
    for (int m = 0; m < 2; m++) {  /* 0: the NCCL entry, 1: fl_linear_cross_entropy_forward_cuda */
        loss[m] = (float*)dalloc((size_t)(nl > 0 ? nl : 1) * 4);
        lse[m] = (float*)dalloc(n1 * 4);
        dh[m] = dalloc(n1 * (size_t)H * es);
        dw[m] = dalloc((size_t)V * (size_t)H * wes);
        db[m] = dalloc((size_t)V * wes);
        poison_d(loss[m], (size_t)(nl > 0 ? nl : 1) * 4);
        poison_d(lse[m], n1 * 4);
        poison_d(dh[m], n1 * (size_t)H * es);
        poison_d(dw[m], (size_t)V * (size_t)H * wes);
        poison_d(db[m], (size_t)V * wes);
        size_t b = 0;
        if (m == 0) RUN(fl_vp_linear_ce_workspace_size(&b, N, H, V, V, dt, wdt, 1, &P.opts, &lo), "ws");
        else RUN(fl_linear_cross_entropy_workspace_size(&b, N, H, V, dt, wdt, &P.opts, &lo), "ws");
        void* ws = dalloc(b);
        void* g_dh = loss_only ? NULL : dh[m];
        void* g_dw = loss_only ? NULL : dw[m];
        void* g_db = (loss_only || !has_bias) ? NULL : db[m];
        if (m == 0)
            RUN(fl_vp_linear_cross_entropy_nccl(g_ctx, loss[m], lse[m], g_dh, g_dw, g_db, D.hidden, P.ldh, D.weight,
                                                P.ldw, bias_d, D.targets, D.grad_loss, P.grad_scale, N, H, V, 0, V, dt,
                                                wdt, FL_INDEX_I64, &D.opts, &lo, comm, ws, b, (fl_stream)g_s),
                "fl_vp_linear_cross_entropy_nccl");
        else
            RUN(fl_linear_cross_entropy_forward_cuda(g_ctx, loss[m], lse[m], g_dh, g_dw, g_db, D.hidden, P.ldh,
                                                     D.weight, P.ldw, bias_d, D.targets, D.grad_loss, P.grad_scale, N,
                                                     H, V, dt, wdt, FL_INDEX_I64, &D.opts, &lo, ws, b,
                                                     (fl_stream)g_s),
                "fl_linear_cross_entropy_forward_cuda");
        CK(cudaStreamSynchronize(g_s));
        cudaFree(ws);
    }
    float* hl[2];
    void* hbuf[2];
    for (int m = 0; m < 2; m++) {
        hl[m] = (float*)tu_xmalloc((size_t)(nl > 0 ? nl : 1) * 4 + n1 * 4);
        d2h(hl[m], loss[m], (size_t)nl * 4);
        d2h(hl[m] + (nl > 0 ? nl : 1), lse[m], (size_t)N * 4);
    }
    check_loss("loss", hl[0], hl[1], nl, dt);
    check_loss("lse", hl[0] + (nl > 0 ? nl : 1), hl[1] + (nl > 0 ? nl : 1), N, dt);
    if (!loss_only) {
        const size_t sizes[3] = {n1 * (size_t)H * es, (size_t)V * (size_t)H * wes, (size_t)V * wes};
        void** bufs[3] = {dh, dw, db};
        const char* names[3] = {"dhidden", "dweight", "dbias"};
        const fl_dtype dts[3] = {dt, wdt, wdt};
        const size_t counts[3] = {(size_t)N * (size_t)H, (size_t)V * (size_t)H, (size_t)V};
        for (int q = 0; q < (has_bias ? 3 : 2); q++) {
            for (int m = 0; m < 2; m++) {
                hbuf[m] = tu_xmalloc(sizes[q]);
                d2h(hbuf[m], bufs[q][m], sizes[q]);
            }
            check_norm(names[q], hbuf[0], dts[q], hbuf[1], dts[q], counts[q], TOL[dt].grad_norm);
            free(hbuf[0]);
            free(hbuf[1]);
        }
    }
    for (int m = 0; m < 2; m++) {
        free(hl[m]);
        cudaFree(loss[m]); cudaFree(lse[m]); cudaFree(dh[m]); cudaFree(dw[m]); cudaFree(db[m]);
    }
    dprob_free(&D, 1);
    vpl_free(&P);
    tu_context = "";
}

static void nccl_tests(tu_rng* rng, int small) {
    const char* lib = getenv("FUSEDLOSS_NCCL_LIBRARY");
    void* h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("note: NCCL not found (%s): the collective entry is not tested\n", dlerror());
        return;
    }
    init_all_fn init_all = (init_all_fn)dlsym(h, "ncclCommInitAll");
    destroy_fn destroy = (destroy_fn)dlsym(h, "ncclCommDestroy");
    if (!lib || !*lib) setenv("FUSEDLOSS_NCCL_LIBRARY", "libnccl.so.2", 0);
    float dummy = 0;
    const fl_status st = fl_vp_linear_cross_entropy_nccl(g_ctx, &dummy, NULL, NULL, NULL, NULL, &dummy, 8, &dummy, 8,
                                                         NULL, &dummy, NULL, 1.0f, 1, 8, 8, 0, 8, FL_DTYPE_F32,
                                                         FL_DTYPE_F32, FL_INDEX_I64, NULL, NULL, NULL, NULL, 0, 0);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "nccl_comm"), "NULL comm: %s", fl_last_error());
    void* comm = NULL;
    int dev = 0;
    CK(cudaGetDevice(&dev));
    if (!init_all || init_all(&comm, 1, &dev) != 0) {
        CHECK(0, "ncclCommInitAll(1) failed");
        return;
    }
    nccl_case(comm, rng, 67, 64, 333, FL_DTYPE_F32, FL_DTYPE_F32, 0, 1, 16, 0);
    nccl_case(comm, rng, 130, 64, 1031, FL_DTYPE_BF16, FL_DTYPE_F32, CFG_EVERYTHING_MEAN, 1, 48, 0);
    if (!small) {
        nccl_case(comm, rng, 300, 128, 2053, FL_DTYPE_BF16, FL_DTYPE_BF16, CFG_EVERYTHING_NONE, 0, 64, 0);
        nccl_case(comm, rng, 257, 96, 640, FL_DTYPE_F16, FL_DTYPE_F16, 3, 1, 0, 0);
        nccl_case(comm, rng, 200, 64, 999, FL_DTYPE_BF16, FL_DTYPE_BF16, 2, 0, 64, 1);
        nccl_case(comm, rng, 0, 64, 128, FL_DTYPE_BF16, FL_DTYPE_BF16, 0, 1, 0, 0);
    }
    destroy(comm);
}

/* ---- error flag, bad arguments ------------------------------------------------------------ */

static void edge_tests(tu_rng* rng) {
    vpl_prob P;
    vpl_make(&P, rng, 16, 32, 100, FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I64, 1 /* none */, 2, 0, 0, 0);
    ((int64_t*)P.targets)[5] = 100;  /* out of [0, V) */
    dprob D;
    dprob_make(&D, &P);
    int32_t* flag = (int32_t*)dalloc(4);
    CK(cudaMemset(flag, 0, 4));
    D.opts.error_flag = flag;
    const int64_t vl = vpl_vl(&P, 1);
    size_t b = 0;
    fl_vp_linear_ce_workspace_size(&b, 16, 32, vl, 100, FL_DTYPE_BF16, FL_DTYPE_BF16, 1, &P.opts, NULL);
    void* ws = dalloc(b);
    float* st = (float*)dalloc(16 * 16);
    tu_context = "[bad target]";
    RUN(fl_vp_linear_ce_local_stats_cuda(g_ctx, st, D.hidden, P.ldh, dweight_shard(&D, &P, 1), P.ldw, NULL, D.targets,
                                         16, 32, vl, P.cut[1], 100, FL_DTYPE_BF16, FL_INDEX_I64, &D.opts, NULL, ws, b,
                                         (fl_stream)g_s),
        "stats with a bad target");
    CK(cudaStreamSynchronize(g_s));
    int32_t hf = 0;
    d2h(&hf, flag, 4);
    CHECK(hf == 1, "error flag after a target of V: %d", (int)hf);
    /* bad arguments */
    fl_status s = fl_vp_linear_ce_local_stats_cuda(NULL, st, D.hidden, P.ldh, dweight_shard(&D, &P, 1), P.ldw, NULL,
                                                   D.targets, 16, 32, vl, P.cut[1], 100, FL_DTYPE_BF16, FL_INDEX_I64,
                                                   &D.opts, NULL, ws, b, (fl_stream)g_s);
    CHECK(s == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "ctx"), "NULL ctx: %d %s", (int)s, fl_last_error());
    s = fl_vp_linear_ce_local_stats_cuda(g_ctx, st, D.hidden, 33, dweight_shard(&D, &P, 1), P.ldw, NULL, D.targets, 16,
                                         32, vl, P.cut[1], 100, FL_DTYPE_BF16, FL_INDEX_I64, &D.opts, NULL, ws, b,
                                         (fl_stream)g_s);
    CHECK(s == FL_ERR_UNSUPPORTED, "ld_hidden 33 (bf16): %d %s", (int)s, fl_last_error());
    float* dhp = (float*)dalloc(16 * 32 * 4 + 64);
    float lse_h[16];
    for (int i = 0; i < 16; i++) lse_h[i] = 5.0f;
    float* lse_d = (float*)dup_d(lse_h, sizeof lse_h);
    s = fl_vp_linear_ce_backward_cuda(g_ctx, dhp + 1, NULL, NULL, D.hidden, P.ldh, dweight_shard(&D, &P, 1), P.ldw, NULL,
                                      D.targets, lse_d, NULL, 1.0f, 16, 32, vl, P.cut[1], 100, FL_DTYPE_BF16,
                                      FL_DTYPE_BF16, FL_INDEX_I64, &D.opts, NULL, ws, b, (fl_stream)g_s);
    CHECK(s == FL_ERR_UNSUPPORTED && strstr(fl_last_error(), "dhidden_partial"), "dhidden_partial + 4 bytes: %d %s",
          (int)s, fl_last_error());
    tu_context = "";
    cudaFree(flag); cudaFree(ws); cudaFree(st); cudaFree(dhp); cudaFree(lse_d);
    dprob_free(&D, 2);
    vpl_free(&P);
}

int main(int argc, char** argv) {
    int small = 0, no_nccl = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) small = 1;
        else if (!strcmp(argv[i], "--no-nccl")) no_nccl = 1;
        else { fprintf(stderr, "usage: %s [--small] [--no-nccl]\n", argv[0]); return 2; }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    CK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    if (fl_lce_context_create(&g_ctx) != FL_OK) {
        printf("FAIL: fl_lce_context_create: %s\n", fl_last_error());
        return 1;
    }
    tu_rng rng = tu_rng_seed(20261201u);
    tu_quiet = 1;
    static const fl_dtype DTS[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    /* option groups: defaults, none, sum, smoothing, weights, z-loss + softcap, everything, offsets */
    static const int GROUPS[] = {0, 1, 2, 3, 6, 18, CFG_EVERYTHING_MEAN, CFG_EVERYTHING_NONE, 25, 28, 31};
    const int ng = (int)(sizeof GROUPS / sizeof GROUPS[0]);
    int n = 0;
    for (int d = 0; d < 3; d++)
        for (int g = 0; g < (small ? 2 : ng); g++, n++) {
            const fl_dtype dt = DTS[d];
            const fl_dtype wdt = (n % 3 == 0) ? FL_DTYPE_F32 : dt;
            const int k = 1 + n % 3;
            const int64_t N = small ? 37 : (n % 4 == 0) ? 1 : (n % 4 == 1) ? 200 : (n % 4 == 2) ? 130 : 67;
            const int64_t H = small ? 32 : (n % 2) ? 64 : 136;
            const int64_t V = small ? 200 : (n % 3 == 0) ? 1031 : (n % 3 == 1) ? 4099 : 640;
            const int64_t chunk = (n % 4 == 0) ? 0 : (n % 4 == 1) ? 64 : (n % 4 == 2) ? 1 : 7;
            run_case(&rng, N, H, V, dt, wdt, GROUPS[g], k, n % 2, (n % 3) != 2, (n % 4) != 3, small ? 16 : chunk,
                     g == 0 || g == 6);
        }
    if (!small) {
        run_case(&rng, 0, 64, 300, FL_DTYPE_BF16, FL_DTYPE_BF16, 0, 2, 0, 1, 1, 0, 0);        /* N = 0 */
        run_case(&rng, 1100, 128, 20000, FL_DTYPE_BF16, FL_DTYPE_F32, 0, 2, 1, 0, 0, 0, 0);   /* larger */
    }
    edge_tests(&rng);
    if (!no_nccl) nccl_tests(&rng, small);
    fl_lce_context_destroy(g_ctx);
    CK(cudaStreamDestroy(g_s));
    return tu_finish();
}
