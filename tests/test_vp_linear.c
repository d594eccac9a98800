/* test_vp_linear.c — the CPU linear vocab-parallel cross-entropy (header section 8, linear
 * variant: fl_vp_linear_ce_local_stats_cpu, fl_vp_linear_ce_backward_cpu) with k simulated ranks.
 *
 * Per problem (tests/vp_linear_util.h: hidden, the full weight cut into k contiguous shards by
 * rows, even or uneven with one-column shards, every configuration of tests/ce_configs.h):
 *   1. step 1' on every rank, BITWISE equal to the logits step fl_vp_ce_local_stats_cpu on the
 *      shard's logits formed as section 6 specifies (vpl_shard_logits);
 *   2. the stats gathered in rank order (memcpy), step 3 (fl_vp_ce_combine_cpu): loss and lse
 *      versus the single-rank fl_linear_cross_entropy_forward_cpu on the full weight;
 *   3. step 4' on every rank: dhidden_partial, dweight, dbias BITWISE equal to the composition
 *      fl_vp_ce_backward_cpu on the shard's logits + the GEMMs in the CPU backend's order
 *      (vpl_shard_grads); and the partials summed over the ranks, and the shards' dweight / dbias
 *      rows, versus the single-rank mode-1 gradients (same upstream gradient);
 *   4. chunking (lce_opts->chunk_rows 1, 3, 64, or from the budget) never changes a bit (1 and 3
 *      are checked bitwise against the unchunked composition);
 *   5. outputs poisoned (NaN) before each call: a row left unwritten fails the bitwise checks;
 *   6. every validation rule of the variant, with its status and a message naming the function.
 *
 * Tolerances of 2. and 3. (the single-rank lse is exact in double; the VP one comes from fp32 stats):
 *   loss, lse : |d| <= 1e-5 (1 + |ref|) (NONE, lse) or 1e-5 (1 + |ref|) (SUM / MEAN: N rows each within
 *               that, sums of them; the derived bounds are test_vocab_parallel.c's business).
 *   gradients : versus fl_linear_cross_entropy_backward_cpu (mode 2) fed with the VP lse: its
 *               dlogits are the VP ones bit for bit (same logits, lse and row formula), so dweight
 *               and dbias rows are compared BITWISE, and dhidden within the rounding of the
 *               reference to dtype (u |ref|, or half fp16's subnormal step) plus (k + 1) fp32
 *               roundings of the partial sums (2^-24 sum_j |dl_ij W_jh| each).
 * Exits 0 only when nothing failed; ends with "N passed, M failed".
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "ce_configs.h"
#include "vp_linear_util.h"

static const char* DT[3] = {"f32", "f16", "bf16"};

/* a call checked for FL_OK, evaluated once (CHECK_STATUS evaluates its argument several times) */
#define RUN(expr, what)                  \
    do {                                 \
        const fl_status st_ = (expr);    \
        CHECK_STATUS(st_, FL_OK, what);  \
    } while (0)
static long g_cases = 0, g_uneven = 0;
#define U32 (1.0 / 16777216.0) /* fp32 unit roundoff */

static void run_case(tu_rng* rng, int64_t N, int64_t H, int64_t V, fl_dtype dt, fl_dtype wdt, fl_index_dtype it,
                     int cfg, int k, int uneven, int has_bias, int grad_mode, int64_t chunk_rows, int want_dw,
                     int want_db) {
    vpl_prob P;
    vpl_make(&P, rng, N, H, V, dt, wdt, it, cfg, k, uneven, has_bias, grad_mode);
    char ctx[256];
    snprintf(ctx, sizeof ctx, "[N=%lld H=%lld V=%lld %s/w%s k=%d%s cfg=%d '%s' bias=%d g=%d chunk=%lld]",
             (long long)N, (long long)H, (long long)V, DT[dt], DT[wdt], k, uneven ? " uneven" : "", cfg,
             CFGS[cfg].name, has_bias, grad_mode, (long long)chunk_rows);
    tu_context = ctx;
    g_cases++;
    g_uneven += uneven;
    const size_t es = vpl_es(dt), ws_es = vpl_es(wdt);
    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
    lo.chunk_rows = chunk_rows;
    const int none = P.opts.reduction == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const size_t n1 = (size_t)(N > 0 ? N : 1);

    /* ---- single rank, full weight: the loss and lse (mode 2 forward) ---- */
    float* loss_ref = (float*)tu_xmalloc((size_t)(nl > 0 ? nl : 1) * 4);
    float* lse_ref = (float*)tu_xmalloc(n1 * 4);
    void* dh_ref = tu_xmalloc(n1 * (size_t)H * es);
    void* dw_ref = tu_xmalloc((size_t)V * (size_t)H * ws_es);
    void* db_ref = tu_xmalloc((size_t)V * ws_es);
    size_t wsb = 0;
    RUN(fl_linear_cross_entropy_workspace_size(&wsb, N, H, V, dt, wdt, &P.opts, &lo), "lce ws");
    void* lce_ws = tu_xmalloc(wsb);
    RUN(fl_linear_cross_entropy_forward_cpu(loss_ref, lse_ref, NULL, NULL, NULL, P.hidden, P.ldh, P.weight, P.ldw,
                                            P.bias, P.targets, NULL, 1.0f, N, H, V, dt, wdt, it, &P.opts, &lo, lce_ws,
                                            wsb),
        "fl_linear_cross_entropy_forward_cpu (reference)");
    void* ws;

    /* ---- steps 1' / 2 / 3 ---- */
    float* gathered = (float*)tu_xmalloc((size_t)k * n1 * 16);
    float* st_ref = (float*)tu_xmalloc(n1 * 16);
    for (int r = 0; r < k; r++) {
        const int64_t vl = vpl_vl(&P, r), ldl = vl + 3;
        size_t b = 0;
        RUN(fl_vp_linear_ce_workspace_size(&b, N, H, vl, V, dt, wdt, 1, &P.opts, &lo), "vpl ws");
        ws = tu_xmalloc(b);
        float* st = gathered + (size_t)r * n1 * 4;
        tu_poison(st, n1 * 16);
        RUN(fl_vp_linear_ce_local_stats_cpu(st, P.hidden, P.ldh, vpl_weight_shard(&P, r), P.ldw,
                                                     P.bias_shard[r], P.targets, N, H, vl, P.cut[r], V, dt, it, &P.opts,
                                                     &lo, ws, b), "fl_vp_linear_ce_local_stats_cpu");
        free(ws);
        /* the logits step on the shard's logits */
        void* L = tu_xmalloc(n1 * (size_t)ldl * es);
        vpl_shard_logits(&P, r, L, ldl);
        RUN(fl_cross_entropy_workspace_size(&b, N, vl, dt, &P.opts), "ce ws");
        ws = tu_xmalloc(b);
        tu_poison(st_ref, n1 * 16);
        RUN(fl_vp_ce_local_stats_cpu(st_ref, L, P.targets, N, vl, ldl, P.cut[r], V, dt, it, &P.opts, ws, b), "fl_vp_ce_local_stats_cpu");
        free(ws);
        free(L);
        char nm[64];
        snprintf(nm, sizeof nm, "stats rank %d == the logits step's", r);
        check_bitwise(nm, st, st_ref, (size_t)N * 16);
    }
    float* loss = (float*)tu_xmalloc((size_t)(nl > 0 ? nl : 1) * 4);
    float* lse = (float*)tu_xmalloc(n1 * 4);
    {
        size_t b = 0;
        RUN(fl_cross_entropy_workspace_size(&b, N, V, FL_DTYPE_F32, &P.opts), "ce ws");
        ws = tu_xmalloc(b);
        tu_poison(loss, (size_t)(nl > 0 ? nl : 1) * 4);
        tu_poison(lse, n1 * 4);
        RUN(fl_vp_ce_combine_cpu(loss, lse, gathered, k, P.targets, N, V, it, &P.opts, ws, b), "fl_vp_ce_combine_cpu");
        free(ws);
        double* g = (double*)tu_xmalloc(n1 * 8);
        double* rf = (double*)tu_xmalloc(n1 * 8);
        for (int64_t i = 0; i < nl; i++) { g[i] = loss[i]; rf[i] = loss_ref[i]; }
        check_close("loss vs single-rank linear CE", g, rf, nl, 1e-5, 1e-5);
        for (int64_t i = 0; i < N; i++) { g[i] = lse[i]; rf[i] = lse_ref[i]; }
        check_close("lse vs single-rank linear CE", g, rf, N, 1e-5, 1e-5);
        free(g);
        free(rf);
    }

    /* the single-rank gradients from the same (fp32) lse: mode 2's backward. Its dlogits are the
     * VP ones bit for bit (same logits, same lse, same row formula), so dweight and dbias rows
     * must match bitwise, and dhidden up to its rounding (to dtype there, per-rank fp32 here) */
    RUN(fl_linear_cross_entropy_backward_cpu(dh_ref, dw_ref, has_bias ? db_ref : NULL, P.hidden, P.ldh, P.weight,
                                             P.ldw, P.bias, P.targets, lse, P.grad_loss, P.grad_scale, N, H, V, dt,
                                             wdt, it, &P.opts, &lo, lce_ws, wsb),
        "fl_linear_cross_entropy_backward_cpu (reference)");
    free(lce_ws);

    /* ---- step 4' ---- */
    double* dh_sum = (double*)calloc(n1 * (size_t)H, sizeof(double));
    double* bh_sum = (double*)calloc(n1 * (size_t)H, sizeof(double));
    for (int r = 0; r < k; r++) {
        const int64_t vl = vpl_vl(&P, r), ldl = vl + 1;
        size_t b = 0;
        RUN(fl_vp_linear_ce_workspace_size(&b, N, H, vl, V, dt, wdt, 1, &P.opts, &lo), "vpl ws");
        ws = tu_xmalloc(b);
        float* dhp = (float*)tu_xmalloc(n1 * (size_t)H * 4);
        void* dw = tu_xmalloc((size_t)vl * (size_t)H * ws_es);
        void* db = tu_xmalloc((size_t)vl * ws_es);
        tu_poison(dhp, n1 * (size_t)H * 4);
        tu_poison(dw, (size_t)vl * (size_t)H * ws_es);
        tu_poison(db, (size_t)vl * ws_es);
        void* dwp = want_dw ? dw : NULL;
        void* dbp = (has_bias && want_db) ? db : NULL;
        RUN(fl_vp_linear_ce_backward_cpu(dhp, dwp, dbp, P.hidden, P.ldh, vpl_weight_shard(&P, r), P.ldw,
                                                  P.bias_shard[r], P.targets, lse, P.grad_loss, P.grad_scale, N, H, vl,
                                                  P.cut[r], V, dt, wdt, it, &P.opts, &lo, ws, b), "fl_vp_linear_ce_backward_cpu");
        free(ws);
        /* the composition: the logits step's dlogits, then the GEMMs in the backend's order */
        void* L = tu_xmalloc(n1 * (size_t)ldl * es);
        vpl_shard_logits(&P, r, L, ldl);
        RUN(fl_cross_entropy_workspace_size(&b, N, vl, dt, &P.opts), "ce ws");
        ws = tu_xmalloc(b);
        RUN(fl_vp_ce_backward_cpu(L, L, P.targets, lse, P.grad_loss, P.grad_scale, N, vl, ldl, P.cut[r], V,
                                           dt, it, &P.opts, ws, b), "fl_vp_ce_backward_cpu");
        free(ws);
        float* dhp_c = (float*)tu_xmalloc(n1 * (size_t)H * 4);
        void* dw_c = tu_xmalloc((size_t)vl * (size_t)H * ws_es);
        void* db_c = tu_xmalloc((size_t)vl * ws_es);
        double* bh = (double*)tu_xmalloc(n1 * (size_t)H * 8);
        double* bw = (double*)tu_xmalloc((size_t)vl * (size_t)H * 8);
        vpl_shard_grads(&P, r, L, ldl, dhp_c, dw_c, db_c, bh, bw);
        char nm[96];
        snprintf(nm, sizeof nm, "dhidden_partial rank %d == composition", r);
        check_bitwise(nm, dhp, dhp_c, (size_t)N * (size_t)H * 4);
        if (dwp) {
            snprintf(nm, sizeof nm, "dweight rank %d == composition", r);
            check_bitwise(nm, dw, dw_c, (size_t)vl * (size_t)H * ws_es);
        }
        if (dbp) {
            snprintf(nm, sizeof nm, "dbias rank %d == composition", r);
            check_bitwise(nm, db, db_c, (size_t)vl * ws_es);
        }
        for (size_t q = 0; q < (size_t)N * (size_t)H; q++) {
            dh_sum[q] += (double)dhp[q];
            bh_sum[q] += bh[q];
        }
        /* the shard's rows of the single-rank dweight / dbias: bitwise */
        if (dwp) {
            snprintf(nm, sizeof nm, "dweight rank %d == single-rank rows", r);
            check_bitwise(nm, dw, (const char*)dw_ref + (size_t)P.cut[r] * (size_t)H * ws_es,
                          (size_t)vl * (size_t)H * ws_es);
        }
        if (dbp) {
            snprintf(nm, sizeof nm, "dbias rank %d == single-rank rows", r);
            check_bitwise(nm, db, (const char*)db_ref + (size_t)P.cut[r] * ws_es, (size_t)vl * ws_es);
        }
        free(L); free(dhp); free(dw); free(db); free(dhp_c); free(dw_c); free(db_c); free(bh); free(bw);
    }
    {
        const size_t n = (size_t)N * (size_t)H;
        const double u = vpl_u(dt);
        double* rf = (double*)tu_xmalloc((n > 0 ? n : 1) * 8);
        double* sl = (double*)tu_xmalloc((n > 0 ? n : 1) * 8);
        for (size_t q = 0; q < n; q++) {
            rf[q] = tu_load(dh_ref, dt, (int64_t)q);
            sl[q] = u * fabs(rf[q]) + (double)(k + 1) * U32 * bh_sum[q];
        }
        /* atol: half the subnormal step of fp16 (2^-25), where u |ref| is not the rounding bound */
        check_close_ex("dhidden (partials summed over ranks) vs single-rank", dh_sum, rf, sl, (int64_t)n,
                       dt == FL_DTYPE_F16 ? 1.0 / 33554432.0 : 1e-30, 0.0);
        free(rf);
        free(sl);
    }
    free(dh_sum); free(bh_sum); free(gathered); free(st_ref); free(loss); free(lse);
    free(loss_ref); free(lse_ref); free(dh_ref); free(dw_ref); free(db_ref);
    vpl_free(&P);
    tu_context = "";
}

/* ---- validation ---------------------------------------------------------------------------- */

static void expect(fl_status got, fl_status want, const char* fn, const char* what) {
    const char* msg = fl_last_error();
    CHECK(got == want && (want == FL_OK || strstr(msg, fn)), "%s: status %d (want %d), message '%s'", what, (int)got,
          (int)want, msg);
}

static void validation(tu_rng* rng) {
    vpl_prob P;
    vpl_make(&P, rng, 8, 16, 40, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, 0, 2, 0, 1, 1);
    const int64_t vl = vpl_vl(&P, 1), v0 = P.cut[1], H = 16, N = 8, V = 40;
    const char* S = "fl_vp_linear_ce_local_stats_cpu";
    const char* B = "fl_vp_linear_ce_backward_cpu";
    size_t b = 0;
    RUN(fl_vp_linear_ce_workspace_size(&b, N, H, vl, V, FL_DTYPE_F32, FL_DTYPE_F32, 1, &P.opts, NULL), "ws");
    void* ws = tu_xmalloc(b);
    float st[8 * 4], lse[8];
    float* dhp = (float*)tu_xmalloc((size_t)N * (size_t)H * 4 + 16);
    float* dw = (float*)tu_xmalloc((size_t)vl * (size_t)H * 4);
    for (int i = 0; i < 8; i++) lse[i] = 3.0f;
    const void* W = vpl_weight_shard(&P, 1);
    const void* bs = P.bias_shard[1];
#define STATS(...) fl_vp_linear_ce_local_stats_cpu(__VA_ARGS__)
    expect(STATS(st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, v0, V, FL_DTYPE_F32, FL_INDEX_I64, &P.opts,
                 NULL, ws, b),
           FL_OK, S, "valid stats call");
    expect(STATS(st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, V - vl + 1, V, FL_DTYPE_F32, FL_INDEX_I64,
                 &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, S, "shard past V");
    expect(STATS(st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, -1, V, FL_DTYPE_F32, FL_INDEX_I64, &P.opts,
                 NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, S, "vocab_start < 0");
    expect(STATS(st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, 0, v0, V, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL,
                 ws, b),
           FL_ERR_INVALID_ARGUMENT, S, "V_local 0");
    expect(STATS(NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, v0, V, FL_DTYPE_F32, FL_INDEX_I64, &P.opts,
                 NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, S, "stats NULL");
    expect(STATS(st, P.hidden, H - 1, W, P.ldw, bs, P.targets, N, H, vl, v0, V, FL_DTYPE_F32, FL_INDEX_I64, &P.opts,
                 NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, S, "ld_hidden < H");
    expect(STATS(st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, v0, V, FL_DTYPE_F32, FL_INDEX_I64, &P.opts,
                 NULL, ws, 1024),
           FL_ERR_INSUFFICIENT_WORKSPACE, S, "workspace of 1 KiB");
    expect(STATS((float*)P.hidden, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, v0, V, FL_DTYPE_F32,
                 FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, S, "stats overlaps hidden");
    {
        fl_ce_options o = P.opts;
        float tp[8];
        o.target_prob = tp;
        expect(STATS(st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, v0, V, FL_DTYPE_F32, FL_INDEX_I64, &o, NULL,
                     ws, b),
               FL_ERR_UNSUPPORTED, S, "target_prob refused");
    }
    {
        int64_t* t = (int64_t*)P.targets;
        const int64_t keep = t[3];
        t[3] = V;  /* a GLOBAL target out of [0, V) */
        expect(STATS(st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, v0, V, FL_DTYPE_F32, FL_INDEX_I64,
                     &P.opts, NULL, ws, b),
               FL_ERR_TARGET_OUT_OF_RANGE, S, "target V");
        t[3] = keep;
    }
#undef STATS
#define BWD(...) fl_vp_linear_ce_backward_cpu(__VA_ARGS__)
    expect(BWD(dhp, dw, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, lse, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_OK, B, "valid backward call");
    expect(BWD(NULL, dw, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, lse, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, B, "dhidden_partial NULL");
    expect(BWD(dhp, dw, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, NULL, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, B, "lse NULL");
    expect(BWD(dhp, dw, dw, P.hidden, P.ldh, W, P.ldw, NULL, P.targets, lse, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, B, "dbias without bias");
    expect(BWD(dhp, dw, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, lse, P.grad_loss, NAN, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, B, "grad_scale NaN");
    expect(BWD(dhp, dhp + 4, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, lse, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, B, "dweight overlaps dhidden_partial");
    expect(BWD(dhp, (void*)W, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, lse, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, B, "dweight overlaps weight");
    expect(BWD(dhp, dw, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, lse, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_BF16, FL_DTYPE_F16, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_ERR_INVALID_ARGUMENT, B, "wgrad_dtype f16 with bf16");
    expect(BWD(dhp + 1, dw, NULL, P.hidden, P.ldh, W, P.ldw, bs, P.targets, lse, P.grad_loss, 1.0f, N, H, vl, v0, V,
               FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b),
           FL_OK, B, "dhidden_partial 4-byte aligned is fine on the CPU");
#undef BWD
    /* the workspace size query */
    expect(fl_vp_linear_ce_workspace_size(NULL, N, H, vl, V, FL_DTYPE_F32, FL_DTYPE_F32, 1, NULL, NULL),
           FL_ERR_INVALID_ARGUMENT, "fl_vp_linear_ce_workspace_size", "bytes NULL");
    expect(fl_vp_linear_ce_workspace_size(&b, N, H, vl, V, FL_DTYPE_F32, FL_DTYPE_F32, 0, NULL, NULL),
           FL_ERR_INVALID_ARGUMENT, "fl_vp_linear_ce_workspace_size", "k 0");
    {
        size_t b1 = 0, b2 = 0;
        fl_vp_linear_ce_workspace_size(&b1, N, H, vl, V, FL_DTYPE_F32, FL_DTYPE_F32, 1, NULL, NULL);
        fl_vp_linear_ce_workspace_size(&b2, N, H, vl, V, FL_DTYPE_F32, FL_DTYPE_F32, 4, NULL, NULL);
        CHECK(b2 > b1, "the NCCL regions grow with k (%zu vs %zu)", b2, b1);
    }
    /* CUDA entry points exist in every build (FL_ERR_NOT_BUILT without CUDA) */
    {
        fl_status s = fl_vp_linear_ce_local_stats_cuda(NULL, st, P.hidden, P.ldh, W, P.ldw, bs, P.targets, N, H, vl, v0,
                                                       V, FL_DTYPE_F32, FL_INDEX_I64, &P.opts, NULL, ws, b, NULL);
        CHECK(s == FL_ERR_NOT_BUILT || s == FL_ERR_INVALID_ARGUMENT, "CUDA stats without ctx: %d (%s)", (int)s,
              fl_last_error());
    }
    free(ws); free(dhp); free(dw);
    vpl_free(&P);
}

int main(int argc, char** argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 20261201u;
    tu_rng rng = tu_rng_seed(seed);
    tu_quiet = 1;
    printf("test_vp_linear: seed %llu, %d option configurations\n", (unsigned long long)seed, N_CFGS);
    static const int KS[4] = {1, 2, 3, 5};
    static const fl_dtype DTS[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    static const int64_t CHUNKS[4] = {0, 1, 3, 64};
    int n = 0;
    for (int c = 0; c < N_CFGS; c++)
        for (int d = 0; d < 3; d++) {
            const fl_dtype dt = DTS[d];
            const fl_dtype wdt = (n % 3 == 0) ? FL_DTYPE_F32 : dt;
            const int k = KS[n % 4];
            const int64_t V = (n % 5 == 0) ? 129 : (n % 5 == 1) ? 7 : (n % 5 == 2) ? 64 : (n % 5 == 3) ? 300 : 33;
            const int64_t H = (n % 4 == 0) ? 1 : (n % 4 == 1) ? 5 : (n % 4 == 2) ? 16 : 33;
            const int64_t N = (n % 7 == 0) ? 1 : (n % 7 == 1) ? 7 : 29;
            run_case(&rng, N, H, V, dt, wdt, (n % 2) ? FL_INDEX_I64 : FL_INDEX_I32, c, k, n % 2, (n % 3) != 1,
                     (n % 4) != 3, CHUNKS[n % 4], (n % 6) != 5, (n % 5) != 4);
            n++;
        }
    /* edges: N = 0, V = 1 (one rank), k = V (one column each), many chunks */
    run_case(&rng, 0, 8, 12, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, 0, 2, 0, 1, 1, 0, 1, 1);
    run_case(&rng, 0, 8, 12, FL_DTYPE_BF16, FL_DTYPE_F32, FL_INDEX_I64, 2, 3, 1, 1, 0, 0, 1, 1);
    run_case(&rng, 9, 8, 1, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, CFG_EVERYTHING_MEAN, 1, 0, 1, 1, 2, 1, 1);
    run_case(&rng, 13, 6, 5, FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I32, CFG_EVERYTHING_NONE, 5, 0, 1, 1, 4, 1, 1);
    run_case(&rng, 130, 24, 77, FL_DTYPE_F16, FL_DTYPE_F32, FL_INDEX_I64, CFG_EVERYTHING_MEAN, 3, 1, 1, 1, 7, 1, 1);
    printf("cases: %ld (%ld with uneven shards)\n", g_cases, g_uneven);
    validation(&rng);
    return tu_finish();
}
