/* linear_cross_entropy.c — CPU reference backend of linear + cross-entropy (the executable
 * specification of include/fusedloss.h section 6).
 *
 * The same chunking as the CUDA backend (the plan of src/common/lce_validate.c), with plain
 * loops in place of cuBLASLt and the cross-entropy rows of src/cpu/cross_entropy.c in place of
 * its kernel. For each chunk of rows [r0, r0 + C):
 *   1. logits[k, j] = sum_h hidden[r0+k, h] weight[j, h] (+ bias[j]) in double, rounded ONCE to
 *      dtype (double -> fp32 -> dtype, round to nearest even, as every CPU output), into the
 *      workspace's logits region (row stride ldl);
 *   2. the cross-entropy of section 5 on those rounded logits (fl__ce_cpu_rows), with the MEAN
 *      denominators of the whole batch (fl__ce_cpu_denoms, computed once before any chunk):
 *      loss/lse, and in the gradient passes dlogits rounded to dtype, in place over the chunk;
 *   3. gradient passes: dhidden[r0+k, :] = dlogits[k, :] · weight (double, rounded once: each
 *      row of dhidden belongs to one chunk), dweight += dlogitsᵀ · hidden and dbias += column
 *      sums of dlogits, into double accumulators that are rounded once to wgrad_dtype after the
 *      last chunk.
 * The reduced loss is summed from per-row partials (the CE workspace region) in row order after
 * the last chunk. Every dweight/dbias element is summed in row order too, whatever the chunking.
 * So loss, lse and all the gradients are bitwise independent of chunk_rows and of the thread
 * count (each output element is summed by one thread in a fixed order).
 *
 * Memory: the double accumulators of dweight (8*V*H bytes) and dbias (8*V), and per-thread
 * scratch rows ((TILE+1)*H + TILE doubles per thread) are malloc'ed here, per call — the one
 * place the library allocates (a CPU-only reference; the CUDA backend uses the caller's
 * workspace only). A failed allocation returns FL_ERR_OUT_OF_MEMORY before anything is written.
 * wgrad_accum and allow_tf32 do not change anything here: the CPU always accumulates in double.
 *
 * Threads (OpenMP when available): the logits and dhidden GEMMs over tiles of TILE rows of the
 * chunk, the dweight GEMM over tiles of TILE rows of weight (each dweight row owned by one
 * thread), the CE rows as in cross_entropy.c.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../internal.h"

/* rows per task; the operand rows converted to double once per tile rather than once per use */
#define TILE 16
/* below this many multiply-adds per GEMM, one thread (as cross_entropy.c's rows threshold) */
#define PAR_MIN 65536.0

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* doubles of scratch per thread: a tile of TILE operand rows plus one row, plus TILE values */
static size_t scratch_per_thread(int64_t H) { return (size_t)(TILE + 1) * (size_t)H + TILE; }

/* ---------------------------------------------------------------------------------------- */
/* the three GEMMs of a chunk (rows r0 .. r0 + C - 1 of the batch)                            */

/* L[k, j] (k < C, row stride ldl) = round_dt(sum_h hidden[r0+k, h] * weight[j, h] + bias[j]) */
static void chunk_logits(void* L, int64_t ldl, const void* hidden, int64_t ldh, const void* weight, int64_t ldw,
                         const void* bias, int64_t r0, int64_t C, int64_t H, int64_t V, fl_dtype dt,
                         double* scratch) {
    const int64_t tiles = (C + TILE - 1) / TILE;
    const size_t per = scratch_per_thread(H);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((double)C * (double)V * (double)H > PAR_MIN)
#endif
    for (int64_t tt = 0; tt < tiles; tt++) {
        double* ht = scratch + (size_t)thread_id() * per;  /* [TILE][H] hidden rows */
        double* wr = ht + (size_t)TILE * (size_t)H;         /* [H] one weight row   */
        const int64_t k0 = tt * TILE, nk = C - k0 < TILE ? C - k0 : TILE;
        for (int64_t k = 0; k < nk; k++) fl__cpu_load_row(ht + k * H, hidden, dt, (r0 + k0 + k) * ldh, H);
        for (int64_t j = 0; j < V; j++) {
            fl__cpu_load_row(wr, weight, dt, j * ldw, H);
            double b = 0.0;
            if (bias) fl__cpu_load_row(&b, bias, dt, j, 1);
            for (int64_t k = 0; k < nk; k++) {
                const double* hr = ht + k * H;
                double acc = 0.0;
                for (int64_t h = 0; h < H; h++) acc += hr[h] * wr[h];
                acc += b;
                fl__cpu_store_row(L, dt, (k0 + k) * ldl + j, &acc, 1);  /* 64-bit: C*ldl may exceed 2^31 */
            }
        }
    }
}

/* dhidden[r0+k, :] = round_{dh_dt}(sum_j dL[k, j] * weight[j, :]) for k < C (dhidden contiguous [N, H]) */
static void chunk_dhidden(void* dhidden, fl_dtype dh_dt, const void* dL, int64_t ldl, const void* weight,
                          int64_t ldw, int64_t r0, int64_t C, int64_t H, int64_t V, fl_dtype dt, double* scratch) {
    const int64_t tiles = (C + TILE - 1) / TILE;
    const size_t per = scratch_per_thread(H);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((double)C * (double)V * (double)H > PAR_MIN)
#endif
    for (int64_t tt = 0; tt < tiles; tt++) {
        double* acc = scratch + (size_t)thread_id() * per;  /* [TILE][H] accumulators */
        double* wr = acc + (size_t)TILE * (size_t)H;         /* [H] one weight row    */
        const int64_t k0 = tt * TILE, nk = C - k0 < TILE ? C - k0 : TILE;
        memset(acc, 0, (size_t)nk * (size_t)H * sizeof(double));
        for (int64_t j = 0; j < V; j++) {
            fl__cpu_load_row(wr, weight, dt, j * ldw, H);
            for (int64_t k = 0; k < nk; k++) {
                double g;
                fl__cpu_load_row(&g, dL, dt, (k0 + k) * ldl + j, 1);
                double* a = acc + k * H;
                for (int64_t h = 0; h < H; h++) a[h] += g * wr[h];
            }
        }
        for (int64_t k = 0; k < nk; k++) fl__cpu_store_row(dhidden, dh_dt, (r0 + k0 + k) * H, acc + k * H, H);
    }
}

/* dW[j, :] += sum_k dL[k, j] * hidden[r0+k, :], db[j] += sum_k dL[k, j], k ascending (either
 * accumulator may be NULL). One thread owns a tile of TILE rows j of dW. */
static void chunk_dweight(double* dW, double* db, const void* dL, int64_t ldl, const void* hidden, int64_t ldh,
                          int64_t r0, int64_t C, int64_t H, int64_t V, fl_dtype dt, double* scratch) {
    const int64_t tiles = (V + TILE - 1) / TILE;
    const size_t per = scratch_per_thread(H);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((double)C * (double)V * (double)H > PAR_MIN)
#endif
    for (int64_t tt = 0; tt < tiles; tt++) {
        double* hr = scratch + (size_t)thread_id() * per;  /* [H] one hidden row        */
        double* gt = hr + H;                                /* [TILE] dlogits of the tile */
        const int64_t j0 = tt * TILE, nj = V - j0 < TILE ? V - j0 : TILE;
        for (int64_t k = 0; k < C; k++) {
            if (dW) fl__cpu_load_row(hr, hidden, dt, (r0 + k) * ldh, H);
            fl__cpu_load_row(gt, dL, dt, k * ldl + j0, nj);
            for (int64_t jj = 0; jj < nj; jj++) {
                const double g = gt[jj];
                if (db) db[j0 + jj] += g;
                if (dW) {
                    double* w = dW + (size_t)(j0 + jj) * (size_t)H;
                    for (int64_t h = 0; h < H; h++) w[h] += g * hr[h];
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* both entry points share one driver                                                         */

static fl_status lce_cpu(const char* fn, int backward, float* loss, float* lse_out, const float* lse_in,
                         void* dhidden, void* dweight, void* dbias, const void* hidden, int64_t ld_hidden,
                         const void* weight, int64_t ld_weight, const void* bias, const void* targets,
                         const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V, fl_dtype dt,
                         fl_dtype wdt, fl_index_dtype it, const fl_ce_options* ce_opts,
                         const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes) {
    fl__clear_error();
    fl__ce_params p;
    fl__lce_plan plan;
    FL_CHECK(fl__lce_validate(fn, backward, 0, loss, backward ? lse_in : lse_out, dhidden, dweight, dbias, hidden,
                              ld_hidden, weight, ld_weight, bias, targets, grad_loss, grad_scale, N, H, V, dt, wdt,
                              it, ce_opts, lce_opts, workspace, workspace_bytes, &p, &plan));
    /* targets are checked (and the MEAN denominators summed) before anything is written */
    fl__ce_denoms d;
    FL_CHECK(fl__ce_cpu_denoms(fn, targets, it, N, V, &p, &d));

    const int grads = backward || dhidden || dweight || dbias;
    const fl__pass pass = backward ? FL__PASS_BACKWARD : grads ? FL__PASS_FUSED : FL__PASS_FORWARD;

    /* the double accumulators and the per-thread scratch (see the header comment) */
    double* dW = NULL;
    double* db = NULL;
    double* scratch = NULL;
    const size_t scratch_n = (size_t)max_threads() * scratch_per_thread(H);
    if (dweight) dW = (double*)calloc((size_t)V * (size_t)H, sizeof(double));
    if (dbias) db = (double*)calloc((size_t)V, sizeof(double));
    if (N > 0) scratch = (double*)malloc(scratch_n * sizeof(double));
    if ((dweight && !dW) || (dbias && !db) || (N > 0 && !scratch)) {
        free(dW);
        free(db);
        free(scratch);
        return fl__fail(FL_ERR_OUT_OF_MEMORY,
                        "%s: cannot allocate the CPU backend's double accumulators (%zu + %zu + %zu bytes)", fn,
                        dweight ? (size_t)V * (size_t)H * sizeof(double) : (size_t)0,
                        dbias ? (size_t)V * sizeof(double) : (size_t)0,
                        N > 0 ? scratch_n * sizeof(double) : (size_t)0);
    }

    char* ws = (char*)workspace;
    void* L = ws + plan.off_logits;                       /* [chunk_rows, ldl] of dt */
    double* part = (double*)(ws + plan.off_ce + 256);    /* [N][2], as cross_entropy.c */
    for (int64_t c = 0; c < plan.chunks; c++) {
        const int64_t r0 = c * plan.chunk_rows;
        const int64_t C = N - r0 < plan.chunk_rows ? N - r0 : plan.chunk_rows;
        chunk_logits(L, plan.ldl, hidden, ld_hidden, weight, ld_weight, bias, r0, C, H, V, dt, scratch);
        /* logits -> loss/lse and (gradient passes) dlogits in place */
        fl__ce_cpu_rows(pass, &p, &d, backward ? NULL : loss, lse_out, grads ? L : NULL, L, plan.ldl, targets, it,
                        lse_in, grad_loss, grad_scale, r0, C, V, dt, part);
        if (dhidden) chunk_dhidden(dhidden, dt, L, plan.ldl, weight, ld_weight, r0, C, H, V, dt, scratch);
        if (dW || db) chunk_dweight(dW, db, L, plan.ldl, hidden, ld_hidden, r0, C, H, V, dt, scratch);
    }
    if (!backward) fl__ce_cpu_reduce(loss, part, N, &p, &d);
    if (dweight) fl__cpu_store_row(dweight, wdt, 0, dW, V * H);   /* V*H fits: validated */
    if (dbias) fl__cpu_store_row(dbias, wdt, 0, db, V);
    free(dW);
    free(db);
    free(scratch);
    return FL_OK;
}

fl_status fl_linear_cross_entropy_forward_cpu(
    float* loss, float* lse, void* dhidden, void* dweight, void* dbias,
    const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
    const void* targets, const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V,
    fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
    const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes) {
    return lce_cpu("fl_linear_cross_entropy_forward_cpu", 0, loss, lse, NULL, dhidden, dweight, dbias, hidden,
                   ld_hidden, weight, ld_weight, bias, targets, grad_loss, grad_scale, N, H, V, dtype, wgrad_dtype,
                   index_dtype, ce_opts, lce_opts, workspace, workspace_bytes);
}

fl_status fl_linear_cross_entropy_backward_cpu(
    void* dhidden, void* dweight, void* dbias,
    const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
    const void* targets, const float* lse, const float* grad_loss, float grad_scale,
    int64_t N, int64_t H, int64_t V, fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
    const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes) {
    return lce_cpu("fl_linear_cross_entropy_backward_cpu", 1, NULL, NULL, lse, dhidden, dweight, dbias, hidden,
                   ld_hidden, weight, ld_weight, bias, targets, grad_loss, grad_scale, N, H, V, dtype, wgrad_dtype,
                   index_dtype, ce_opts, lce_opts, workspace, workspace_bytes);
}

/* ---------------------------------------------------------------------------------------- */
/* the vocab-parallel linear variant (header section 8): steps 1' and 4'                      */

/* Step 1' (backward = 0: stats) or 4' (backward = 1: dhidden_partial fp32, dweight, dbias) of this
 * rank's weight shard, chunk by chunk: the shard's logits as lce_cpu forms them (chunk_logits on
 * the V_local weight rows), then the vocab-parallel row math of src/cpu/vocab_parallel.c on them
 * with the global denominators (the targets and class weights of the whole batch / vocabulary). */
static fl_status vp_lce_cpu(const char* fn, int backward, float* stats, float* dhp, void* dweight, void* dbias,
                            const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight,
                            const void* bias, const void* targets, const float* lse, const float* grad_loss,
                            float grad_scale, int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V,
                            fl_dtype dt, fl_dtype wdt, fl_index_dtype it, const fl_ce_options* ce_opts,
                            const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes) {
    fl__clear_error();
    fl__ce_params p;
    fl__vp_lce_plan vplan;
    FL_CHECK(fl__vp_lce_validate(fn, backward, 0, stats, NULL, lse, dhp, dweight, dbias, hidden, ld_hidden, weight,
                                 ld_weight, bias, targets, grad_loss, grad_scale, N, H, V_local, vocab_start, V, dt,
                                 wdt, it, 1, ce_opts, lce_opts, workspace, workspace_bytes, &p, &vplan));
    const fl__lce_plan plan = vplan.lce;
    /* the GLOBAL targets checked (before anything is written); denominators over the batch */
    fl__ce_denoms d;
    FL_CHECK(fl__ce_cpu_denoms(fn, targets, it, N, V, &p, &d));

    double* dW = NULL;
    double* db = NULL;
    double* scratch = NULL;
    const size_t scratch_n = (size_t)max_threads() * scratch_per_thread(H);
    if (dweight) dW = (double*)calloc((size_t)V_local * (size_t)H, sizeof(double));
    if (dbias) db = (double*)calloc((size_t)V_local, sizeof(double));
    if (N > 0) scratch = (double*)malloc(scratch_n * sizeof(double));
    if ((dweight && !dW) || (dbias && !db) || (N > 0 && !scratch)) {
        free(dW);
        free(db);
        free(scratch);
        return fl__fail(FL_ERR_OUT_OF_MEMORY, "%s: cannot allocate the CPU backend's double accumulators", fn);
    }
    void* L = (char*)workspace + plan.off_logits;        /* [chunk_rows, ldl] of dt */
    for (int64_t c = 0; c < plan.chunks; c++) {
        const int64_t r0 = c * plan.chunk_rows;
        const int64_t C = N - r0 < plan.chunk_rows ? N - r0 : plan.chunk_rows;
        chunk_logits(L, plan.ldl, hidden, ld_hidden, weight, ld_weight, bias, r0, C, H, V_local, dt, scratch);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (C * V_local > 65536)
#endif
        for (int64_t k = 0; k < C; k++) {
            const int64_t i = r0 + k, off = k * plan.ldl;
            const int64_t t = fl__ce_load_target(targets, it, i);
            if (!backward) {
                float* st = stats + 4 * i;
                if (t == p.ignore_index) {
                    st[0] = -INFINITY;
                    st[1] = st[2] = st[3] = 0.0f;
                } else {
                    fl__vp_cpu_row_stats(st, L, dt, off, vocab_start, V_local, t, &p);
                }
                continue;
            }
            if (t == p.ignore_index) {
                fl__ce_cpu_row_zero(L, dt, off, V_local);
                continue;
            }
            double g_a, g_b;
            fl__ce_row_upstream(&p, &d, grad_loss, grad_scale, i, &g_a, &g_b);
            fl__ce_cpu_row_grad(L, L, dt, off, vocab_start, V_local, V, t, (double)lse[i], d.W, g_a, g_b, &p);
        }
        if (!backward) continue;
        chunk_dhidden(dhp, FL_DTYPE_F32, L, plan.ldl, weight, ld_weight, r0, C, H, V_local, dt, scratch);
        if (dW || db) chunk_dweight(dW, db, L, plan.ldl, hidden, ld_hidden, r0, C, H, V_local, dt, scratch);
    }
    if (dweight) fl__cpu_store_row(dweight, wdt, 0, dW, V_local * H);
    if (dbias) fl__cpu_store_row(dbias, wdt, 0, db, V_local);
    free(dW);
    free(db);
    free(scratch);
    return FL_OK;
}

fl_status fl_vp_linear_ce_local_stats_cpu(float* stats, const void* hidden, int64_t ld_hidden, const void* weight,
                                          int64_t ld_weight, const void* bias, const void* targets, int64_t N,
                                          int64_t H, int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                          fl_index_dtype index_dtype, const fl_ce_options* ce_opts,
                                          const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes) {
    return vp_lce_cpu("fl_vp_linear_ce_local_stats_cpu", 0, stats, NULL, NULL, NULL, hidden, ld_hidden, weight,
                      ld_weight, bias, targets, NULL, NULL, 1.0f, N, H, V_local, vocab_start, V, dtype, dtype,
                      index_dtype, ce_opts, lce_opts, workspace, workspace_bytes);
}

fl_status fl_vp_linear_ce_backward_cpu(float* dhidden_partial, void* dweight, void* dbias, const void* hidden,
                                       int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
                                       const void* targets, const float* lse, const float* grad_loss,
                                       float grad_scale, int64_t N, int64_t H, int64_t V_local, int64_t vocab_start,
                                       int64_t V, fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                                       const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                                       void* workspace, size_t workspace_bytes) {
    return vp_lce_cpu("fl_vp_linear_ce_backward_cpu", 1, NULL, dhidden_partial, dweight, dbias, hidden, ld_hidden,
                      weight, ld_weight, bias, targets, lse, grad_loss, grad_scale, N, H, V_local, vocab_start, V,
                      dtype, wgrad_dtype, index_dtype, ce_opts, lce_opts, workspace, workspace_bytes);
}
