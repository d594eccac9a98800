/* distill.c — CPU reference backend of the distillation divergences on raw logits (forward KL,
 * reverse KL, generalised JSD; include/fusedloss.h section 10): the executable specification.
 *
 * Plain C11 loops, every quantity in double (inputs converted exactly), one row at a time:
 *   pass 1 over the row: max_j s_j/T and max_j t_j/T;
 *   pass 2: the two sums of exponentials -> lse_s, lse_t (log q_j = s_j/T - lse_s, log p_j = ...);
 *   pass 3: the row's divergence l (and, for the JSD, H = sum_j h_j);
 *   pass 4 (fused only): dstudent, element by element (read s_j, t_j, then write dstudent_j, so
 *          dstudent == student works: the row's statistics come from passes 1-3).
 * ---- Formulas (row i; q = softmax(s/T), p = softmax(t/T), b = beta, c = loss_scale) ----
 *   FKL (b == 0): l = sum_j p_j (log p_j - log q_j)        dl/ds_j = (q_j - p_j) / T
 *   RKL (b == 1): l = sum_j q_j (log q_j - log p_j)        dl/ds_j = q_j (log q_j - log p_j - l) / T
 *   JSD         : log m_j = logaddexp(log b + log p_j, log(1-b) + log q_j)
 *                 l = b sum_j p_j (log p_j - log m_j) + (1-b) sum_j q_j (log q_j - log m_j)
 *                 h_j = (1-b) q_j (log q_j - log m_j), H = sum_j h_j
 *                                                        dl/ds_j = (h_j - q_j H) / T
 *   0 log 0 = 0: a term w (log w - log z) with w == 0 (exp underflowed to 0 in double) is 0, and
 *   so is q_j (...) in the RKL / JSD gradients when q_j == 0 (never inf * 0 = NaN).
 *   log m_j is computed in the log domain (no underflow of b p_j + (1-b) q_j to 0 while p_j > 0).
 *   Row loss c * l; dstudent_ij = g_i c dl/ds_j, rounded double -> fp32 -> dtype (as every CPU
 *   output), g_i = grad_scale (grad_loss ? grad_loss[NONE ? i : 0] : 1) [/ D (MEAN), / N (BATCHMEAN)].
 * Ignored rows (labels[i] == ignore_index): loss 0, gradient 0, neither row read.
 * Reductions: the per-row losses c l_i go to the workspace ([256, 256 + 8N) as double) and are
 * summed in row order afterwards, so results do not depend on the thread count (OpenMP over rows).
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"
#include "dtype.h"

static double load_d(const void* base, fl_dtype dt, int64_t idx) { return (double)fl__load_f32(base, dt, idx); }

/* double -> float (RN) -> dtype (RN), the rounding every CPU output uses */
static void store_grad(void* base, fl_dtype dt, int64_t idx, double v) { fl__store_f32(base, dt, idx, (float)v); }

/* the workspace's per-row doubles, via memcpy: a CPU workspace need not be 8-byte aligned */
static void part_set(void* ws, int64_t i, double v) { memcpy((char*)ws + 256 + 8 * (size_t)i, &v, 8); }
static double part_get(const void* ws, int64_t i) {
    double v;
    memcpy(&v, (const char*)ws + 256 + 8 * (size_t)i, 8);
    return v;
}

static int row_ignored(const fl__distill_params* p, int64_t i) {
    if (!p->labels) return 0;
    const int64_t lab = p->label_dtype == FL_INDEX_I32 ? (int64_t)((const int32_t*)p->labels)[i]
                                                       : ((const int64_t*)p->labels)[i];
    return lab == p->ignore_index;
}

/* w (log w - log z) with 0 log 0 = 0 (w = exp(lw) == 0 contributes nothing, whatever lz is) */
static double xlogx_term(double w, double lw, double lz) { return w == 0.0 ? 0.0 : w * (lw - lz); }

/* log(exp(a) + exp(b)) without overflow or underflow; -inf when both are -inf */
static double logaddexp(double a, double b) {
    if (a != a || b != b) return a + b;   /* NaN */
    const double mx = a > b ? a : b;
    if (mx == -INFINITY) return -INFINITY;
    return mx + log1p(exp(-fabs(a - b)));
}

/* Statistics of one row (passes 1-3): lse of s/T and t/T, the divergence l (unscaled) and, for
 * the JSD, H = sum_j h_j. s, t point at the row's first element. */
typedef struct {
    double lse_s, lse_t, l, H;
} row_stats;

static row_stats distill_row_stats(const fl__distill_params* p, const void* s, int64_t soff, const void* t,
                                   int64_t toff) {
    const int64_t V = p->V;
    const double T = (double)p->temperature, beta = (double)p->beta;
    row_stats r;
    /* pass 1: maxima */
    double ms = -INFINITY, mt = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        const double x = load_d(s, p->dtype, soff + j) / T, y = load_d(t, p->teacher_dtype, toff + j) / T;
        if (x > ms) ms = x;
        if (y > mt) mt = y;
    }
    /* pass 2: sums of exponentials (relative to the maxima: no overflow) */
    double ss = 0.0, st = 0.0;
    for (int64_t j = 0; j < V; j++) {
        ss += exp(load_d(s, p->dtype, soff + j) / T - ms);
        st += exp(load_d(t, p->teacher_dtype, toff + j) / T - mt);
    }
    r.lse_s = ms + log(ss);
    r.lse_t = mt + log(st);
    /* pass 3: the divergence */
    double A = 0.0, B = 0.0;   /* JSD: sum p (log p - log m), sum q (log q - log m); KL: A only */
    const double lb = log(beta), l1b = log1p(-beta);
    for (int64_t j = 0; j < V; j++) {
        const double lq = load_d(s, p->dtype, soff + j) / T - r.lse_s;
        const double lp = load_d(t, p->teacher_dtype, toff + j) / T - r.lse_t;
        const double q = exp(lq), pp = exp(lp);
        switch (p->mode) {
            case FL__DISTILL_FKL: A += xlogx_term(pp, lp, lq); break;
            case FL__DISTILL_RKL: A += xlogx_term(q, lq, lp); break;
            case FL__DISTILL_JSD: {
                const double lm = logaddexp(lb + lp, l1b + lq);
                A += xlogx_term(pp, lp, lm);
                B += xlogx_term(q, lq, lm);
            } break;
        }
    }
    if (p->mode == FL__DISTILL_JSD) {
        r.l = beta * A + (1.0 - beta) * B;
        r.H = (1.0 - beta) * B;
    } else {
        r.l = A;
        r.H = 0.0;
    }
    return r;
}

/* pass 4: ds_j = g (c dl/ds_j), g already including c; reads s_j, t_j then writes ds_j */
static void distill_row_grad(const fl__distill_params* p, const row_stats* r, double g, void* ds, const void* s,
                             int64_t soff, const void* t, int64_t toff) {
    const int64_t V = p->V;
    const double T = (double)p->temperature, beta = (double)p->beta;
    const double lb = log(beta), l1b = log1p(-beta);
    for (int64_t j = 0; j < V; j++) {
        const double lq = load_d(s, p->dtype, soff + j) / T - r->lse_s;
        const double lp = load_d(t, p->teacher_dtype, toff + j) / T - r->lse_t;
        const double q = exp(lq);
        double d = 0.0;   /* T dl/ds_j */
        switch (p->mode) {
            case FL__DISTILL_FKL: d = q - exp(lp); break;
            case FL__DISTILL_RKL: d = q == 0.0 ? 0.0 : q * (lq - lp - r->l); break;
            case FL__DISTILL_JSD: {
                const double lm = logaddexp(lb + lp, l1b + lq);
                const double h = q == 0.0 ? 0.0 : (1.0 - beta) * q * (lq - lm);
                d = h - q * r->H;
            } break;
        }
        store_grad(ds, p->dtype, soff + j, g * (d / T));   /* in place: s_j was read above */
    }
}

/* the whole call; dstudent NULL: forward only. loss may be NULL (fused). */
static void distill_cpu(const fl__distill_params* p, float* loss, void* ds, const void* s, const void* t,
                        const float* grad_loss, float grad_scale, void* ws) {
    const int64_t N = p->N, V = p->V;
    const int none = p->reduction == FL_REDUCTION_NONE;
    /* T^2 in double (p->loss_scale is its fp32 rounding; == 1 exactly when t2_scale is off or T == 1) */
    const double c = p->loss_scale == 1.0f ? 1.0 : (double)p->temperature * (double)p->temperature;

    /* MEAN denominator: rows not ignored (labels are only compared, never range-checked) */
    int64_t D = N;
    if (p->labels && p->reduction == FL_REDUCTION_MEAN) {
        D = 0;
        for (int64_t i = 0; i < N; i++) D += !row_ignored(p, i);
    }
    const double denom = p->reduction == FL_REDUCTION_MEAN ? (double)D
                         : p->reduction == FL_REDUCTION_BATCHMEAN ? (double)N : 1.0;

#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if ((double)N * (double)V > 65536.0)
#endif
    for (int64_t i = 0; i < N; i++) {
        const int64_t soff = i * p->ld_s, toff = i * p->ld_t;   /* 64-bit: N*ld may exceed 2^31 */
        if (row_ignored(p, i)) {
            part_set(ws, i, 0.0);
            if (loss && none) loss[i] = 0.0f;
            if (ds)
                for (int64_t j = 0; j < V; j++) store_grad(ds, p->dtype, soff + j, 0.0);
            continue;
        }
        const row_stats r = distill_row_stats(p, s, soff, t, toff);
        const double li = c * r.l;
        part_set(ws, i, li);
        if (loss && none) loss[i] = (float)li;
        if (ds) {
            const double gl = grad_loss ? (double)grad_loss[none ? i : 0] : 1.0;
            const double g = (double)grad_scale * gl / denom;   /* denom >= 1 here: this row counts */
            distill_row_grad(p, &r, g * c, ds, s, soff, t, toff);
        }
    }

    if (loss && !none) {
        double sum = 0.0;
        for (int64_t i = 0; i < N; i++) sum += part_get(ws, i);   /* fixed row order */
        if (p->reduction == FL_REDUCTION_MEAN) sum = D > 0 ? sum / (double)D : NAN;
        else if (p->reduction == FL_REDUCTION_BATCHMEAN) sum = N > 0 ? sum / (double)N : NAN;
        loss[0] = (float)sum;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                               */

fl_status fl_distill_forward_cpu(float* loss, const void* student, int64_t ld_student, const void* teacher,
                                 int64_t ld_teacher, fl_dtype teacher_dtype, const void* labels,
                                 fl_index_dtype label_dtype, int64_t N, int64_t V, fl_dtype dtype,
                                 const fl_distill_options* opts, void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_distill_forward_cpu";
    fl__clear_error();
    fl__distill_params p;
    FL_CHECK(fl__distill_validate(fn, FL__PASS_FORWARD, 0, loss, NULL, student, ld_student, teacher, ld_teacher,
                                  teacher_dtype, labels, label_dtype, NULL, 1.0f, N, V, dtype, opts, workspace,
                                  workspace_bytes, &p));
    distill_cpu(&p, loss, NULL, student, teacher, NULL, 1.0f, workspace);
    return FL_OK;
}

fl_status fl_distill_fused_cpu(float* loss, void* dstudent, const void* student, int64_t ld_student,
                               const void* teacher, int64_t ld_teacher, fl_dtype teacher_dtype, const void* labels,
                               fl_index_dtype label_dtype, const float* grad_loss, float grad_scale, int64_t N,
                               int64_t V, fl_dtype dtype, const fl_distill_options* opts, void* workspace,
                               size_t workspace_bytes) {
    static const char* fn = "fl_distill_fused_cpu";
    fl__clear_error();
    fl__distill_params p;
    FL_CHECK(fl__distill_validate(fn, FL__PASS_FUSED, 0, loss, dstudent, student, ld_student, teacher, ld_teacher,
                                  teacher_dtype, labels, label_dtype, grad_loss, grad_scale, N, V, dtype, opts,
                                  workspace, workspace_bytes, &p));
    distill_cpu(&p, loss, N > 0 ? dstudent : NULL, student, teacher, grad_loss, grad_scale, workspace);
    return FL_OK;
}
