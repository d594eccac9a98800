/* test_linear_cross_entropy_cuda.c — GPU tests of the CUDA linear cross-entropy against the CPU
 * backend (itself checked against float64 and finite differences by test_linear_cross_entropy.c).
 *
 * For each case: fresh random hidden / weight / bias / targets; the CUDA call's outputs are
 * poisoned (0xff bytes: NaN in every dtype) before the call, so an unwritten element shows;
 * the CPU backend on the same inputs is the reference. Checked:
 *   - loss (reduced, or per row for NONE), lse, dhidden, dweight, dbias, in both modes
 *     (gradients in the forward; loss-only forward + backward), every dtype, fp32 dweight with
 *     16-bit inputs, chunk sizes from 1 row to all rows, odd V and H, ld > H, every CE option;
 *   - the dweight error of FP32 and LEAN accumulation against an fp32-output CPU reference
 *     (double accumulation), printed, and bounded;
 *   - CUDA graph capture + replay == eager, bitwise; two runs bitwise equal;
 *   - an out-of-range target: error flag set, loss NaN, no crash;
 *   - N * V > 2^31 (64-bit offsets): rows at the end of the batch against the CPU;
 *   - bad arguments: NULL context, misaligned ld.
 *   - fl_lce_context_set_tuning: its bad arguments; with --tune every case and the graph test
 *     run after a tuning call on the same shapes (the tuned picks must give the same checks).
 * Usage: test_linear_cross_entropy_cuda [--small] [--tune] [--filter SUBSTR]
 *   (--small: compute-sanitizer grid; --filter: only the grid cases whose name contains SUBSTR)
 * Prints "N passed, M failed"; exit status 1 on any failure; "SKIP" without a GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

/* normwise relative error bounds ||cuda - cpu|| / ||cpu|| per dtype of the compared tensor, and
 * per-element loss bounds |cuda - cpu| <= atol + rtol |cpu| (16-bit: logits rounded from fp32 on
 * the GPU and from double on the CPU may differ by one ulp of the dtype). */
typedef struct { double grad_norm, loss_atol, loss_rtol; } tol_t;
static const tol_t TOL[3] = {
    /* F32  */ {2e-5, 1e-5, 1e-5},
    /* F16  */ {4e-3, 2e-3, 1e-3},
    /* BF16 */ {2e-2, 2e-2, 4e-3},
};

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            printf("CUDA error: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__);  \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static cudaStream_t g_stream;
static fl_lce_context* g_ctx;
static int g_small;
static int g_tune;  /* --tune: every case after a tuning call on the context (fl_lce_context_set_tuning) */
static const char* g_filter;  /* --filter SUBSTR: only the grid cases whose name contains it */

typedef struct {
    const char* name;
    int64_t N, H, V, ldh, ldw;
    fl_dtype dt, wdt;
    int bias, i64;
    int64_t chunk_rows;
    fl_lce_accum accum;
    fl_reduction red;
    float eps, zeta, softcap, scale;
    int cw;          /* class weights */
    int ignore_frac; /* percent of rows ignored (100 = all) */
    int grad_loss;   /* pass a device grad_loss (and grad_scale 0.5) */
} tcase;

static void* dalloc(size_t n) { void* p = NULL; CK(cudaMalloc(&p, n ? n : 16)); return p; }
static void h2d(void* d, const void* h, size_t n) { if (n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
static void d2h(void* h, const void* d, size_t n) { if (n) CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); }

static void fill(void* h, size_t n, fl_dtype dt, tu_rng* r, double s) {
    for (size_t i = 0; i < n; i++) {
        double x = s * tu_uniform_in(r, -1.0, 1.0);
        if (x == 0.0) x = s * 1e-3;
        tu_store(h, dt, (int64_t)i, (float)x);
    }
}

/* ||a - b|| / ||b|| over n elements (NaN if a has a NaN) */
static double relerr(const void* a, const void* b, size_t n, fl_dtype dt) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = tu_load(a, dt, (int64_t)i), y = tu_load(b, dt, (int64_t)i);
        if (isnan(x) != isnan(y)) return NAN;
        if (isnan(x)) continue;
        num += (x - y) * (x - y);
        den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Run one case in one mode (0: gradients in the forward, 1: forward + backward) on both backends. */
static void run_case(const tcase* c, int mode) {
    char what[256];
    snprintf(what, sizeof(what), "%s [%s N=%lld H=%lld V=%lld %s/%s mode %d rows %lld]", c->name,
             tu_dtype_name(c->dt), (long long)c->N, (long long)c->H, (long long)c->V, tu_dtype_name(c->dt),
             tu_dtype_name(c->wdt), mode, (long long)c->chunk_rows);
    tu_rng r = tu_rng_seed(0x51ce + (uint64_t)c->N * 131 + (uint64_t)c->V * 7 + (uint64_t)c->H + (uint64_t)mode);
    const size_t es = tu_dtype_size(c->dt), wes = tu_dtype_size(c->wdt);
    const size_t nh = (size_t)(c->N > 0 ? (c->N - 1) * c->ldh + c->H : 0), nw = (size_t)((c->V - 1) * c->ldw + c->H);
    void* hh = tu_xmalloc(nh * es + 16);
    void* hw = tu_xmalloc(nw * es + 16);
    void* hb = tu_xmalloc((size_t)c->V * es + 16);
    fill(hh, nh, c->dt, &r, 1.0);
    fill(hw, nw, c->dt, &r, 2.0 / sqrt((double)c->H));
    fill(hb, (size_t)c->V, c->dt, &r, 0.5);
    const size_t isz = c->i64 ? 8 : 4;
    void* ht = tu_xmalloc((size_t)c->N * isz + 16);
    for (int64_t i = 0; i < c->N; i++) {
        int64_t t = tu_int_in(&r, 0, c->V - 1);
        if (c->ignore_frac && tu_int_in(&r, 0, 99) < c->ignore_frac) t = -100;
        if (c->i64) ((int64_t*)ht)[i] = t; else ((int32_t*)ht)[i] = (int32_t)t;
    }
    float* hcw = (float*)tu_xmalloc((size_t)c->V * 4 + 16);
    for (int64_t j = 0; j < c->V; j++) hcw[j] = (float)tu_uniform_in(&r, 0.2, 2.0);
    /* the class-weight cases also carry per-class logit offsets (ce_opts->logit_offset) */
    float* hoff = (float*)tu_xmalloc((size_t)c->V * 4 + 16);
    for (int64_t j = 0; j < c->V; j++) hoff[j] = (float)tu_uniform_in(&r, -1.0, 1.0);
    const int none = c->red == FL_REDUCTION_NONE;
    const size_t nl = none ? (size_t)c->N : 1;
    float* hg = (float*)tu_xmalloc(nl * 4 + 16);
    for (size_t i = 0; i < nl; i++) hg[i] = (float)tu_uniform_in(&r, 0.5, 1.5);

    fl_ce_options ce = FL_CE_OPTIONS_INIT;
    ce.reduction = c->red; ce.label_smoothing = c->eps; ce.z_loss = c->zeta; ce.softcap = c->softcap;
    ce.logit_scale = c->scale;
    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
    lo.chunk_rows = c->chunk_rows;
    lo.wgrad_accum = c->accum;
    const float gs = c->grad_loss ? 0.5f : 1.0f;

    /* CPU reference */
    size_t wsb = 0;
    fl_status st = fl_linear_cross_entropy_workspace_size(&wsb, c->N, c->H, c->V, c->dt, c->wdt, &ce, &lo);
    CHECK_STATUS(st, FL_OK, what);
    ce.weight = c->cw ? hcw : NULL;
    ce.logit_offset = c->cw ? hoff : NULL;
    float* c_tp = (float*)tu_xmalloc((size_t)c->N * 4 + 16);   /* ce_opts->target_prob, every case */
    ce.target_prob = c_tp;
    void* cws = tu_xmalloc(wsb);
    float* c_loss = (float*)tu_xmalloc(nl * 4 + 16);
    float* c_lse = (float*)tu_xmalloc((size_t)c->N * 4 + 16);
    void* c_dh = tu_xmalloc((size_t)(c->N * c->H) * es + 16);
    void* c_dw = tu_xmalloc((size_t)(c->V * c->H) * wes + 16);
    void* c_db = tu_xmalloc((size_t)c->V * wes + 16);
    st = fl_linear_cross_entropy_forward_cpu(c_loss, c_lse, c_dh, c_dw, c->bias ? c_db : NULL, hh, c->ldh, hw, c->ldw,
                                             c->bias ? hb : NULL, ht, c->grad_loss ? hg : NULL, gs, c->N, c->H, c->V,
                                             c->dt, c->wdt, c->i64 ? FL_INDEX_I64 : FL_INDEX_I32, &ce, &lo, cws, wsb);
    if (!CHECK_STATUS(st, FL_OK, what)) goto done_cpu;

    /* CUDA */
    {
        void* dh_in = dalloc(nh * es); h2d(dh_in, hh, nh * es);
        void* dw_in = dalloc(nw * es); h2d(dw_in, hw, nw * es);
        void* db_in = dalloc((size_t)c->V * es); h2d(db_in, hb, (size_t)c->V * es);
        void* dt_in = dalloc((size_t)c->N * isz); h2d(dt_in, ht, (size_t)c->N * isz);
        float* dcw = (float*)dalloc((size_t)c->V * 4); h2d(dcw, hcw, (size_t)c->V * 4);
        float* doff = (float*)dalloc((size_t)c->V * 4); h2d(doff, hoff, (size_t)c->V * 4);
        float* g_tp = (float*)dalloc((size_t)c->N * 4 + 64);
        CK(cudaMemsetAsync(g_tp, 0xff, (size_t)c->N * 4 + 64, g_stream));
        float* dg = (float*)dalloc(nl * 4); h2d(dg, hg, nl * 4);
        int32_t* flag = (int32_t*)dalloc(4); CK(cudaMemsetAsync(flag, 0, 4, g_stream));
        float* g_loss = (float*)dalloc(nl * 4);
        float* g_lse = (float*)dalloc((size_t)c->N * 4);
        void* g_dh = dalloc((size_t)(c->N * c->H) * es);
        void* g_dw = dalloc((size_t)(c->V * c->H) * wes);
        void* g_db = dalloc((size_t)c->V * wes);
        void* gws = dalloc(wsb);
        CK(cudaMemsetAsync(g_loss, 0xff, nl * 4, g_stream)); CK(cudaMemsetAsync(g_lse, 0xff, (size_t)c->N * 4, g_stream));
        CK(cudaMemsetAsync(g_dh, 0xff, (size_t)(c->N * c->H) * es, g_stream)); CK(cudaMemsetAsync(g_dw, 0xff, (size_t)(c->V * c->H) * wes, g_stream));
        CK(cudaMemsetAsync(g_db, 0xff, (size_t)c->V * wes, g_stream)); CK(cudaMemsetAsync(gws, 0xff, wsb, g_stream));
        /* why: cudaMemcpy from pageable memory may return before its DMA lands, and it runs on the
         * legacy stream, which g_stream (non-blocking) does not wait for */
        CK(cudaDeviceSynchronize());
        fl_ce_options gce = ce;
        gce.weight = c->cw ? dcw : NULL;
        gce.logit_offset = c->cw ? doff : NULL;
        gce.target_prob = g_tp;
        gce.error_flag = flag;
        const fl_index_dtype it = c->i64 ? FL_INDEX_I64 : FL_INDEX_I32;
        if (g_tune) {
            /* --tune: a tuning call of the same mode first (its outputs unspecified), then every
             * output poisoned again: the real call below must run on the tuned picks */
            CHECK_STATUS(fl_lce_context_set_tuning(g_ctx, 1), FL_OK, what);
            if (mode == 0) {
                st = fl_linear_cross_entropy_forward_cuda(g_ctx, g_loss, g_lse, g_dh, g_dw, c->bias ? g_db : NULL,
                                                          dh_in, c->ldh, dw_in, c->ldw, c->bias ? db_in : NULL, dt_in,
                                                          c->grad_loss ? dg : NULL, gs, c->N, c->H, c->V, c->dt,
                                                          c->wdt, it, &gce, &lo, gws, wsb, (fl_stream)g_stream);
            } else {
                st = fl_linear_cross_entropy_forward_cuda(g_ctx, g_loss, g_lse, NULL, NULL, NULL, dh_in, c->ldh, dw_in,
                                                          c->ldw, c->bias ? db_in : NULL, dt_in, NULL, 1.0f, c->N,
                                                          c->H, c->V, c->dt, c->wdt, it, &gce, &lo, gws, wsb,
                                                          (fl_stream)g_stream);
                if (st == FL_OK)
                    st = fl_linear_cross_entropy_backward_cuda(g_ctx, g_dh, g_dw, c->bias ? g_db : NULL, dh_in, c->ldh,
                                                               dw_in, c->ldw, c->bias ? db_in : NULL, dt_in, g_lse,
                                                               c->grad_loss ? dg : NULL, gs, c->N, c->H, c->V, c->dt,
                                                               c->wdt, it, &gce, &lo, gws, wsb, (fl_stream)g_stream);
            }
            CHECK_STATUS(st, FL_OK, what);
            CHECK_STATUS(fl_lce_context_set_tuning(g_ctx, 0), FL_OK, what);
            CK(cudaStreamSynchronize(g_stream));
            CK(cudaMemsetAsync(g_tp, 0xff, (size_t)c->N * 4 + 64, g_stream)); CK(cudaMemsetAsync(flag, 0, 4, g_stream));
            CK(cudaMemsetAsync(g_loss, 0xff, nl * 4, g_stream)); CK(cudaMemsetAsync(g_lse, 0xff, (size_t)c->N * 4, g_stream));
            CK(cudaMemsetAsync(g_dh, 0xff, (size_t)(c->N * c->H) * es, g_stream)); CK(cudaMemsetAsync(g_dw, 0xff, (size_t)(c->V * c->H) * wes, g_stream));
            CK(cudaMemsetAsync(g_db, 0xff, (size_t)c->V * wes, g_stream)); CK(cudaMemsetAsync(gws, 0xff, wsb, g_stream));
        }
        if (mode == 0) {
            st = fl_linear_cross_entropy_forward_cuda(g_ctx, g_loss, g_lse, g_dh, g_dw, c->bias ? g_db : NULL, dh_in,
                                                      c->ldh, dw_in, c->ldw, c->bias ? db_in : NULL, dt_in,
                                                      c->grad_loss ? dg : NULL, gs, c->N, c->H, c->V, c->dt, c->wdt, it,
                                                      &gce, &lo, gws, wsb, (fl_stream)g_stream);
            CHECK_STATUS(st, FL_OK, what);
        } else {
            st = fl_linear_cross_entropy_forward_cuda(g_ctx, g_loss, g_lse, NULL, NULL, NULL, dh_in, c->ldh, dw_in,
                                                      c->ldw, c->bias ? db_in : NULL, dt_in, NULL, 1.0f, c->N, c->H,
                                                      c->V, c->dt, c->wdt, it, &gce, &lo, gws, wsb, (fl_stream)g_stream);
            CHECK_STATUS(st, FL_OK, what);
            st = fl_linear_cross_entropy_backward_cuda(g_ctx, g_dh, g_dw, c->bias ? g_db : NULL, dh_in, c->ldh, dw_in,
                                                       c->ldw, c->bias ? db_in : NULL, dt_in, g_lse,
                                                       c->grad_loss ? dg : NULL, gs, c->N, c->H, c->V, c->dt, c->wdt,
                                                       it, &gce, &lo, gws, wsb, (fl_stream)g_stream);
            CHECK_STATUS(st, FL_OK, what);
        }
        CK(cudaStreamSynchronize(g_stream));
        float* o_loss = (float*)tu_xmalloc(nl * 4 + 16);
        float* o_lse = (float*)tu_xmalloc((size_t)c->N * 4 + 16);
        void* o_dh = tu_xmalloc((size_t)(c->N * c->H) * es + 16);
        void* o_dw = tu_xmalloc((size_t)(c->V * c->H) * wes + 16);
        void* o_db = tu_xmalloc((size_t)c->V * wes + 16);
        d2h(o_loss, g_loss, nl * 4); d2h(o_lse, g_lse, (size_t)c->N * 4);
        d2h(o_dh, g_dh, (size_t)(c->N * c->H) * es); d2h(o_dw, g_dw, (size_t)(c->V * c->H) * wes);
        d2h(o_db, g_db, (size_t)c->V * wes);
        int32_t hflag = -1;
        d2h(&hflag, flag, 4);
        CHECK(hflag == 0, "%s: error flag %d", what, hflag);

        const tol_t* tl = &TOL[c->dt];
        int bad_loss = 0;
        for (size_t i = 0; i < nl; i++) {
            const double a = o_loss[i], b = c_loss[i];
            const int nan_ok = isnan(a) && isnan(b);
            if (!nan_ok && !(fabs(a - b) <= tl->loss_atol + tl->loss_rtol * fabs(b))) {
                if (bad_loss++ < 3) printf("  %s: loss[%zu] cuda %.7g cpu %.7g\n", what, i, a, b);
            }
        }
        CHECK(bad_loss == 0, "%s: %d loss values off", what, bad_loss);
        if (bad_loss && !none && c->N > 0) {  /* diagnosis: the CE workspace (src/internal.h layout) */
            double hdr[3];
            float* part = (float*)tu_xmalloc((size_t)c->N * 8);
            d2h(hdr, gws, sizeof(hdr));
            d2h(part, (char*)gws + 256, (size_t)c->N * 8);
            int nan_a = 0, nan_b = 0, first = -1;
            for (int64_t i = 0; i < c->N; i++) {
                if (isnan(part[2 * i])) { nan_a++; if (first < 0) first = (int)i; }
                if (isnan(part[2 * i + 1])) nan_b++;
            }
            printf("  %s: workspace header D_w %g D_n %g W %g; NaN partials a %d b %d (first row %d)\n", what, hdr[0],
                   hdr[1], hdr[2], nan_a, nan_b, first);
            free(part);
        }
        int bad_lse = 0;
        for (int64_t i = 0; i < c->N; i++) {
            const double a = o_lse[i], b = c_lse[i];
            if (!(fabs(a - b) <= tl->loss_atol + tl->loss_rtol * fabs(b)) && bad_lse++ < 3)
                printf("  %s: lse[%lld] cuda %.7g cpu %.7g\n", what, (long long)i, a, b);
        }
        CHECK(bad_lse == 0, "%s: %d lse values off", what, bad_lse);
        {   /* target_prob (forward in both modes): as the CPU's, 1 on ignored rows; nothing past N */
            float* o_tp = (float*)tu_xmalloc((size_t)c->N * 4 + 64);
            d2h(o_tp, g_tp, (size_t)c->N * 4 + 64);
            int bad_tp = 0;
            for (int64_t i = 0; i < c->N; i++) {
                const double a = o_tp[i], b = c_tp[i];
                if (!(fabs(a - b) <= tl->loss_atol + tl->loss_rtol * fabs(b)) && bad_tp++ < 3)
                    printf("  %s: target_prob[%lld] cuda %.7g cpu %.7g\n", what, (long long)i, a, b);
            }
            CHECK(bad_tp == 0, "%s: %d target_prob values off", what, bad_tp);
            int past = 0;
            for (int k = 0; k < 64; k++) past |= ((const unsigned char*)o_tp)[(size_t)c->N * 4 + (size_t)k] != 0xff;
            CHECK(!past, "%s: bytes past target_prob[N-1] written", what);
            free(o_tp);
        }
        const double edh = relerr(o_dh, c_dh, (size_t)(c->N * c->H), c->dt);
        const double edw = relerr(o_dw, c_dw, (size_t)(c->V * c->H), c->wdt);
        const double gt = TOL[c->dt].grad_norm > TOL[c->wdt].grad_norm ? TOL[c->dt].grad_norm : TOL[c->wdt].grad_norm;
        CHECK(edh <= TOL[c->dt].grad_norm, "%s: dhidden rel err %.3g", what, edh);
        CHECK(edw <= gt, "%s: dweight rel err %.3g", what, edw);
        if (c->bias) {
            const double edb = relerr(o_db, c_db, (size_t)c->V, c->wdt);
            CHECK(edb <= gt, "%s: dbias rel err %.3g", what, edb);
        }
        free(o_loss); free(o_lse); free(o_dh); free(o_dw); free(o_db);
        CK(cudaFree(dh_in)); CK(cudaFree(dw_in)); CK(cudaFree(db_in)); CK(cudaFree(dt_in)); CK(cudaFree(dcw));
        CK(cudaFree(dg)); CK(cudaFree(flag)); CK(cudaFree(doff)); CK(cudaFree(g_tp)); CK(cudaFree(g_loss)); CK(cudaFree(g_lse)); CK(cudaFree(g_dh));
        CK(cudaFree(g_dw)); CK(cudaFree(g_db)); CK(cudaFree(gws));
    }
done_cpu:
    free(hh); free(hw); free(hb); free(ht); free(hcw); free(hoff); free(c_tp); free(hg); free(cws); free(c_loss); free(c_lse); free(c_dh);
    free(c_dw); free(c_db);
}

/* dweight accuracy of FP32 vs LEAN accumulation (16-bit dweight) against an fp32 dweight made by
 * the CPU backend (double accumulation, rounded to fp32). Also: graph replay == eager bitwise, and
 * two runs bitwise equal. */
static void accuracy_graph_determinism(fl_dtype dt, int64_t N, int64_t H, int64_t V, int64_t rows) {
    char what[160];
    snprintf(what, sizeof(what), "accum/graph %s N=%lld H=%lld V=%lld rows=%lld", tu_dtype_name(dt), (long long)N,
             (long long)H, (long long)V, (long long)rows);
    tu_rng r = tu_rng_seed(0xacc + (uint64_t)V);
    const size_t es = tu_dtype_size(dt);
    void* hh = tu_xmalloc((size_t)(N * H) * es);
    void* hw = tu_xmalloc((size_t)(V * H) * es);
    fill(hh, (size_t)(N * H), dt, &r, 1.0);
    fill(hw, (size_t)(V * H), dt, &r, 2.0 / sqrt((double)H));
    int64_t* ht = (int64_t*)tu_xmalloc((size_t)N * 8);
    for (int64_t i = 0; i < N; i++) ht[i] = tu_int_in(&r, 0, V - 1);
    fl_ce_options ce = FL_CE_OPTIONS_INIT;
    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
    lo.chunk_rows = rows;
    size_t wsb = 0, wsb32 = 0;
    lo.wgrad_accum = FL_LCE_ACCUM_FP32;
    CHECK_STATUS(fl_linear_cross_entropy_workspace_size(&wsb, N, H, V, dt, dt, &ce, &lo), FL_OK, what);
    CHECK_STATUS(fl_linear_cross_entropy_workspace_size(&wsb32, N, H, V, dt, FL_DTYPE_F32, &ce, &lo), FL_OK, what);
    /* CPU reference with an fp32 dweight */
    float loss_c;
    float* ref_dw = (float*)tu_xmalloc((size_t)(V * H) * 4);
    void* cdh = tu_xmalloc((size_t)(N * H) * es);
    void* cws = tu_xmalloc(wsb32);
    CHECK_STATUS(fl_linear_cross_entropy_forward_cpu(&loss_c, NULL, cdh, ref_dw, NULL, hh, H, hw, H, NULL, ht, NULL,
                                                     1.0f, N, H, V, dt, FL_DTYPE_F32, FL_INDEX_I64, &ce, &lo, cws,
                                                     wsb32),
                 FL_OK, what);
    void *dh = dalloc((size_t)(N * H) * es), *dw = dalloc((size_t)(V * H) * es), *dtg = dalloc((size_t)N * 8);
    h2d(dh, hh, (size_t)(N * H) * es); h2d(dw, hw, (size_t)(V * H) * es); h2d(dtg, ht, (size_t)N * 8);
    CK(cudaDeviceSynchronize());  /* why: see run_case */
    void *gdh = dalloc((size_t)(N * H) * es), *gdw = dalloc((size_t)(V * H) * es), *ws = dalloc(wsb);
    float* gl = (float*)dalloc(4);
    void* odw = tu_xmalloc((size_t)(V * H) * es);
    void* ref16 = tu_xmalloc((size_t)(V * H) * es);
    for (int64_t i = 0; i < V * H; i++) tu_store(ref16, dt, i, ref_dw[i]);
    double err[3];
    const fl_lce_accum modes[2] = {FL_LCE_ACCUM_FP32, FL_LCE_ACCUM_LEAN};
    for (int m = 0; m < 2; m++) {
        lo.wgrad_accum = modes[m];
        if (g_tune) {  /* both accumulation modes' GEMMs tuned; the graph below captures tuned picks */
            CHECK_STATUS(fl_lce_context_set_tuning(g_ctx, 1), FL_OK, what);
            CHECK_STATUS(fl_linear_cross_entropy_forward_cuda(g_ctx, gl, NULL, gdh, gdw, NULL, dh, H, dw, H, NULL, dtg,
                                                              NULL, 1.0f, N, H, V, dt, dt, FL_INDEX_I64, &ce, &lo, ws,
                                                              wsb, (fl_stream)g_stream),
                         FL_OK, what);
            CHECK_STATUS(fl_lce_context_set_tuning(g_ctx, 0), FL_OK, what);
        }
        CK(cudaMemsetAsync(gdw, 0xff, (size_t)(V * H) * es, g_stream));
        CHECK_STATUS(fl_linear_cross_entropy_forward_cuda(g_ctx, gl, NULL, gdh, gdw, NULL, dh, H, dw, H, NULL, dtg, NULL,
                                                          1.0f, N, H, V, dt, dt, FL_INDEX_I64, &ce, &lo, ws, wsb,
                                                          (fl_stream)g_stream),
                     FL_OK, what);
        CK(cudaStreamSynchronize(g_stream));
        d2h(odw, gdw, (size_t)(V * H) * es);
        double num = 0, den = 0;
        for (int64_t i = 0; i < V * H; i++) {
            const double a = tu_load(odw, dt, i), b = ref_dw[i];
            num += (a - b) * (a - b);
            den += b * b;
        }
        err[m] = sqrt(num / den);
    }
    /* the error of rounding the exact dweight once to dtype: what one unchunked GEMM gives */
    {
        double num = 0, den = 0;
        for (int64_t i = 0; i < V * H; i++) {
            const double a = tu_load(ref16, dt, i), b = ref_dw[i];
            num += (a - b) * (a - b);
            den += b * b;
        }
        err[2] = sqrt(num / den);
    }
    printf("  %s: dweight rel err vs float64: FP32 accum %.3e, LEAN %.3e, one rounding %.3e (%lld chunks)\n", what,
           err[0], err[1], err[2], (long long)((N + rows - 1) / rows));
    CHECK(err[0] <= 1.5 * err[2] + 1e-7, "%s: FP32-accumulated dweight err %.3g vs one rounding %.3g", what, err[0],
          err[2]);
    CHECK(err[1] <= 2.0 * sqrt((double)((N + rows - 1) / rows)) * err[2] + 1e-7,
          "%s: LEAN dweight err %.3g vs one rounding %.3g", what, err[1], err[2]);

    /* determinism and graph replay, FP32 accumulation */
    lo.wgrad_accum = FL_LCE_ACCUM_FP32;
    void* a1 = tu_xmalloc((size_t)(V * H) * es);
    void* a2 = tu_xmalloc((size_t)(V * H) * es);
    void* h1 = tu_xmalloc((size_t)(N * H) * es);
    void* h2 = tu_xmalloc((size_t)(N * H) * es);
    float l1 = 0, l2 = 0;
    for (int k = 0; k < 2; k++) {
        CK(cudaMemsetAsync(gdw, 0xff, (size_t)(V * H) * es, g_stream)); CK(cudaMemsetAsync(gdh, 0xff, (size_t)(N * H) * es, g_stream));
        CHECK_STATUS(fl_linear_cross_entropy_forward_cuda(g_ctx, gl, NULL, gdh, gdw, NULL, dh, H, dw, H, NULL, dtg, NULL,
                                                          1.0f, N, H, V, dt, dt, FL_INDEX_I64, &ce, &lo, ws, wsb,
                                                          (fl_stream)g_stream),
                     FL_OK, what);
        CK(cudaStreamSynchronize(g_stream));
        d2h(k ? a2 : a1, gdw, (size_t)(V * H) * es); d2h(k ? h2 : h1, gdh, (size_t)(N * H) * es);
        d2h(k ? &l2 : &l1, gl, 4);
    }
    CHECK(!memcmp(a1, a2, (size_t)(V * H) * es) && !memcmp(h1, h2, (size_t)(N * H) * es) && !memcmp(&l1, &l2, 4),
          "%s: two runs differ", what);
    /* graph */
    CK(cudaMemsetAsync(gdw, 0xff, (size_t)(V * H) * es, g_stream)); CK(cudaMemsetAsync(gdh, 0xff, (size_t)(N * H) * es, g_stream));
    CK(cudaMemsetAsync(gl, 0xff, 4, g_stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    fl_status st = fl_linear_cross_entropy_forward_cuda(g_ctx, gl, NULL, gdh, gdw, NULL, dh, H, dw, H, NULL, dtg, NULL,
                                                        1.0f, N, H, V, dt, dt, FL_INDEX_I64, &ce, &lo, ws, wsb,
                                                        (fl_stream)g_stream);
    CK(cudaStreamEndCapture(g_stream, &graph));
    CHECK_STATUS(st, FL_OK, what);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaStreamSynchronize(g_stream));
    d2h(a2, gdw, (size_t)(V * H) * es); d2h(h2, gdh, (size_t)(N * H) * es); d2h(&l2, gl, 4);
    CHECK(!memcmp(a1, a2, (size_t)(V * H) * es) && !memcmp(h1, h2, (size_t)(N * H) * es) && !memcmp(&l1, &l2, 4),
          "%s: graph replay differs from eager", what);
    CK(cudaGraphExecDestroy(exec)); CK(cudaGraphDestroy(graph));
    free(a1); free(a2); free(h1); free(h2); free(odw); free(ref16);
    free(hh); free(hw); free(ht); free(ref_dw); free(cdh); free(cws);
    CK(cudaFree(dh)); CK(cudaFree(dw)); CK(cudaFree(dtg)); CK(cudaFree(gdh)); CK(cudaFree(gdw)); CK(cudaFree(ws));
    CK(cudaFree(gl));
}

/* out-of-range target; bad arguments */
static void bad_inputs(void) {
    const int64_t N = 8, H = 16, V = 40;
    void *h = dalloc((size_t)(N * H) * 2), *w = dalloc((size_t)(V * H) * 2), *dh = dalloc((size_t)(N * H) * 2);
    void* dw = dalloc((size_t)(V * H) * 2);
    CK(cudaMemsetAsync(h, 0x3c, (size_t)(N * H) * 2, g_stream)); CK(cudaMemsetAsync(w, 0x3c, (size_t)(V * H) * 2, g_stream));
    int64_t ht[8] = {1, 2, 3, 400, 5, -100, 7, 8};
    void* t = dalloc(sizeof(ht)); h2d(t, ht, sizeof(ht));
    CK(cudaDeviceSynchronize());  /* why: see run_case */
    float* loss = (float*)dalloc(4 * N);
    int32_t* flag = (int32_t*)dalloc(4); CK(cudaMemsetAsync(flag, 0, 4, g_stream));
    fl_ce_options ce = FL_CE_OPTIONS_INIT;
    ce.error_flag = flag;
    ce.reduction = FL_REDUCTION_NONE;
    size_t wsb = 0;
    fl_linear_cross_entropy_workspace_size(&wsb, N, H, V, FL_DTYPE_BF16, FL_DTYPE_BF16, &ce, NULL);
    void* ws = dalloc(wsb);
    fl_status st = fl_linear_cross_entropy_forward_cuda(g_ctx, loss, NULL, dh, dw, NULL, h, H, w, H, NULL, t, NULL, 1.0f,
                                                        N, H, V, FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I64, &ce, NULL,
                                                        ws, wsb, (fl_stream)g_stream);
    CHECK_STATUS(st, FL_OK, "out-of-range target");
    CK(cudaStreamSynchronize(g_stream));
    float hl[8];
    int32_t hf = 0;
    d2h(hl, loss, sizeof(hl)); d2h(&hf, flag, 4);
    CHECK(hf == 1, "out-of-range target: flag %d", hf);
    CHECK(isnan(hl[3]) && isfinite(hl[2]) && hl[5] == 0.0f, "out-of-range target: loss %g %g %g", hl[3], hl[2], hl[5]);
    st = fl_linear_cross_entropy_forward_cuda(NULL, loss, NULL, dh, dw, NULL, h, H, w, H, NULL, t, NULL, 1.0f, N, H, V,
                                              FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I64, &ce, NULL, ws, wsb,
                                              (fl_stream)g_stream);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "NULL context");
    CHECK(strstr(fl_last_error(), "fl_linear_cross_entropy_forward_cuda") != NULL, "message names the function: %s",
          fl_last_error());
    CHECK_STATUS(fl_lce_context_set_tuning(NULL, 1), FL_ERR_INVALID_ARGUMENT, "set_tuning(NULL)");
    CHECK_STATUS(fl_lce_context_set_tuning(g_ctx, 2), FL_ERR_INVALID_ARGUMENT, "set_tuning(ctx, 2)");
    CHECK(strstr(fl_last_error(), "fl_lce_context_set_tuning") != NULL, "set_tuning message: \"%s\"", fl_last_error());
    st = fl_linear_cross_entropy_forward_cuda(g_ctx, loss, NULL, dh, dw, NULL, h, H - 2, w, H, NULL, t, NULL, 1.0f, N,
                                              H - 2, V, FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I64, &ce, NULL, ws, wsb,
                                              (fl_stream)g_stream);
    CHECK(st == FL_ERR_UNSUPPORTED || st == FL_ERR_INVALID_ARGUMENT, "ld_hidden 14 (28 bytes): status %s",
          fl_status_string(st));
    CK(cudaFree(h)); CK(cudaFree(w)); CK(cudaFree(dh)); CK(cudaFree(dw)); CK(cudaFree(t)); CK(cudaFree(loss));
    CK(cudaFree(flag)); CK(cudaFree(ws));
}

/* N * V > 2^31: the last rows of a big batch against the CPU on just those rows (NONE rows are
 * independent), loss and dhidden. */
static void big(void) {
    const int64_t N = 17000, H = 64, V = 128256, K = 48;
    const char* what = "big N*V > 2^31";
    tu_rng r = tu_rng_seed(0xb16);
    void* hh = tu_xmalloc((size_t)(N * H) * 2);
    void* hw = tu_xmalloc((size_t)(V * H) * 2);
    fill(hh, (size_t)(N * H), FL_DTYPE_BF16, &r, 1.0);
    fill(hw, (size_t)(V * H), FL_DTYPE_BF16, &r, 0.25);
    int32_t* ht = (int32_t*)tu_xmalloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) ht[i] = (int32_t)tu_int_in(&r, 0, V - 1);
    fl_ce_options ce = FL_CE_OPTIONS_INIT;
    ce.reduction = FL_REDUCTION_NONE;
    size_t wsb = 0, wsk = 0;
    fl_linear_cross_entropy_workspace_size(&wsb, N, H, V, FL_DTYPE_BF16, FL_DTYPE_F32, &ce, NULL);
    fl_linear_cross_entropy_workspace_size(&wsk, K, H, V, FL_DTYPE_BF16, FL_DTYPE_F32, &ce, NULL);
    void *h = dalloc((size_t)(N * H) * 2), *w = dalloc((size_t)(V * H) * 2), *t = dalloc((size_t)N * 4);
    h2d(h, hh, (size_t)(N * H) * 2); h2d(w, hw, (size_t)(V * H) * 2); h2d(t, ht, (size_t)N * 4);
    float* loss = (float*)dalloc((size_t)N * 4);
    void* dh = dalloc((size_t)(N * H) * 2);
    float* dw = (float*)dalloc((size_t)(V * H) * 4);
    void* ws = dalloc(wsb);
    CK(cudaMemsetAsync(loss, 0xff, (size_t)N * 4, g_stream)); CK(cudaMemsetAsync(dh, 0xff, (size_t)(N * H) * 2, g_stream));
    CK(cudaDeviceSynchronize());  /* why: see run_case */
    fl_status st = fl_linear_cross_entropy_forward_cuda(g_ctx, loss, NULL, dh, dw, NULL, h, H, w, H, NULL, t, NULL, 1.0f,
                                                        N, H, V, FL_DTYPE_BF16, FL_DTYPE_F32, FL_INDEX_I32, &ce, NULL,
                                                        ws, wsb, (fl_stream)g_stream);
    CHECK_STATUS(st, FL_OK, what);
    CK(cudaStreamSynchronize(g_stream));
    float* gl = (float*)tu_xmalloc((size_t)K * 4);
    void* gdh = tu_xmalloc((size_t)(K * H) * 2);
    d2h(gl, loss + (N - K), (size_t)K * 4);
    d2h(gdh, (char*)dh + (size_t)((N - K) * H) * 2, (size_t)(K * H) * 2);
    float* cl = (float*)tu_xmalloc((size_t)K * 4);
    void* cdh = tu_xmalloc((size_t)(K * H) * 2);
    void* cws = tu_xmalloc(wsk);
    st = fl_linear_cross_entropy_forward_cpu(cl, NULL, cdh, NULL, NULL, (char*)hh + (size_t)((N - K) * H) * 2, H, hw, H,
                                             NULL, ht + (N - K), NULL, 1.0f, K, H, V, FL_DTYPE_BF16, FL_DTYPE_F32,
                                             FL_INDEX_I32, &ce, NULL, cws, wsk);
    CHECK_STATUS(st, FL_OK, what);
    int bad = 0;
    for (int64_t i = 0; i < K; i++)
        if (!(fabs(gl[i] - cl[i]) <= TOL[FL_DTYPE_BF16].loss_atol + TOL[FL_DTYPE_BF16].loss_rtol * fabs(cl[i]))) bad++;
    CHECK(bad == 0, "%s: %d of the last %lld rows' loss off (e.g. %g vs %g)", what, bad, (long long)K, gl[0], cl[0]);
    const double e = relerr(gdh, cdh, (size_t)(K * H), FL_DTYPE_BF16);
    CHECK(e <= TOL[FL_DTYPE_BF16].grad_norm, "%s: dhidden of the last rows rel err %.3g", what, e);
    free(hh); free(hw); free(ht); free(gl); free(gdh); free(cl); free(cdh); free(cws);
    CK(cudaFree(h)); CK(cudaFree(w)); CK(cudaFree(t)); CK(cudaFree(loss)); CK(cudaFree(dh)); CK(cudaFree(dw));
    CK(cudaFree(ws));
}

int main(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) g_small = 1;
        else if (!strcmp(argv[i], "--tune")) g_tune = 1;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) g_filter = argv[++i];
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0 || !fl_cuda_built()) {
        printf("SKIP: no CUDA device or no CUDA backend\n");
        return 0;
    }
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    if (fl_lce_context_create(&g_ctx) != FL_OK) {
        printf("FAIL: fl_lce_context_create: %s\n", fl_last_error());
        return 1;
    }
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    /* name, N, H, V, ldh, ldw, dt, wdt, bias, i64, rows, accum, red, eps, zeta, softcap, scale, cw, ign, gl */
    for (int d = 0; d < 3; d++) {
        const fl_dtype dt = dts[d];
        tcase cs[] = {
            {"plain mean", 96, 64, 1000, 64, 64, dt, dt, 0, 1, 0, FL_LCE_ACCUM_AUTO, FL_REDUCTION_MEAN, 0, 0, 0, 1, 0, 0, 0},
            {"odd V chunks", 130, 72, 8003, 72, 72, dt, dt, 1, 0, 64, FL_LCE_ACCUM_FP32, FL_REDUCTION_MEAN, 0, 0, 0, 1, 0, 10, 0},
            {"lean sum", 130, 64, 2048, 64, 64, dt, dt, 0, 1, 40, FL_LCE_ACCUM_LEAN, FL_REDUCTION_SUM, 0, 0, 0, 1, 0, 0, 1},
            {"none gl", 77, 40, 3001, 48, 56, dt, dt, 1, 1, 16, FL_LCE_ACCUM_AUTO, FL_REDUCTION_NONE, 0, 0, 0, 1, 0, 20, 1},
            {"smooth+cw+ign", 100, 64, 777, 64, 64, dt, dt, 0, 1, 33, FL_LCE_ACCUM_AUTO, FL_REDUCTION_MEAN, 0.1f, 0, 0, 1, 1, 25, 0},
            {"zloss+softcap", 64, 32, 5000, 32, 32, dt, dt, 1, 0, 0, FL_LCE_ACCUM_AUTO, FL_REDUCTION_MEAN, 0, 1e-4f, 30.0f, 1, 0, 0, 1},
            {"scale+zloss+cw", 50, 48, 1024, 48, 48, dt, dt, 0, 1, 7, FL_LCE_ACCUM_AUTO, FL_REDUCTION_MEAN, 0.05f, 1e-3f, 0, 0.7f, 1, 10, 0},
            {"all ignored", 20, 16, 300, 16, 16, dt, dt, 1, 1, 0, FL_LCE_ACCUM_AUTO, FL_REDUCTION_MEAN, 0, 0, 0, 1, 0, 100, 0},
            {"N=1 V=1", 1, 8, 1, 8, 8, dt, dt, 1, 1, 0, FL_LCE_ACCUM_AUTO, FL_REDUCTION_SUM, 0, 0, 0, 1, 0, 0, 0},
            {"N=0", 0, 8, 10, 8, 8, dt, dt, 1, 1, 0, FL_LCE_ACCUM_AUTO, FL_REDUCTION_SUM, 0, 0, 0, 1, 0, 0, 0},
            {"wgrad fp32", 200, 64, 4000, 64, 64, dt, FL_DTYPE_F32, 1, 1, 64, FL_LCE_ACCUM_AUTO, FL_REDUCTION_MEAN, 0.1f, 0, 0, 1, 0, 5, 0},
            {"rows 1", 9, 24, 333, 24, 24, dt, dt, 1, 0, 1, FL_LCE_ACCUM_FP32, FL_REDUCTION_MEAN, 0, 0, 0, 1, 0, 0, 0},
            {"gpt2-like", g_small ? 64 : 512, 768, g_small ? 5003 : 50257, 768, 768, dt, dt, 0, 1, g_small ? 0 : 192,
             FL_LCE_ACCUM_AUTO, FL_REDUCTION_MEAN, 0, 0, 0, 1, 0, 3, 0},
            {"gpt2-like none", g_small ? 32 : 256, 768, g_small ? 5003 : 50257, 768, 768, dt, dt, 1, 0,
             g_small ? 0 : 96, FL_LCE_ACCUM_AUTO, FL_REDUCTION_NONE, 0, 0, 0, 1, 0, 3, 1},
        };
        const int nc = (int)(sizeof(cs) / sizeof(cs[0]));
        for (int k = 0; k < nc; k++) {
            if (dt == FL_DTYPE_F32 && cs[k].wdt == FL_DTYPE_F32 && !strcmp(cs[k].name, "wgrad fp32")) continue;
            if (g_small && k % 2 && k != 1) continue;
            if (g_filter && !strstr(cs[k].name, g_filter)) continue;
            run_case(&cs[k], 0);
            run_case(&cs[k], 1);
        }
    }
    if (g_filter) {
        fl_lce_context_destroy(g_ctx);
        return tu_finish();
    }
    if (!g_small) {
        accuracy_graph_determinism(FL_DTYPE_BF16, 1024, 256, 4096, 128);
        accuracy_graph_determinism(FL_DTYPE_F16, 512, 128, 3000, 64);
        big();
    } else {
        accuracy_graph_determinism(FL_DTYPE_BF16, 128, 64, 512, 32);
    }
    bad_inputs();
    fl_lce_context_destroy(g_ctx);
    return tu_finish();
}
