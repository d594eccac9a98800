/* margin_ce.c — CPU reference backend of the margin softmax cross-entropy (CosFace / ArcFace /
 * combined margins, insightface's CombinedMarginLoss + cross-entropy; include/fusedloss.h
 * section 11): the executable specification.
 *
 * Plain C11 loops, every quantity in double (inputs converted exactly), one row at a time:
 *   pass 0: the target cosine x_y -> phi and phi' (below);
 *   pass 1 over the row: max_j z_j;
 *   pass 2: sum_j exp(z_j - max) -> lse, loss = lse - z_y (log1p of the others' sum when the
 *           target is the max: accurate for confident rows);
 *   pass 3 (fused only): dlogits, element by element (read x_j, then write dx_j, so dlogits ==
 *          logits works: the row's statistics, z_y and phi' come from passes 0-2).
 * ---- Formulas (row i, target y, x = the row's cosines, s, m1, m2, m3 the options) ----
 *   CosFace (m1 == 1, m2 == 0): phi = x_y - m3 exactly (no acos, no clamp), phi' = 1.
 *   Otherwise theta = acos(clamp(x_y, -1, 1)) and
 *     the margin applies: easy_margin ? x_y > 0 : m1 theta + m2 <= pi   (double, as written)
 *     applies        : phi = cos(m1 theta + m2) - m3
 *                      phi' = m1 sin(m1 theta + m2) / max(sin theta, 1e-6)   (FL_MARGIN_GRAD_EXACT)
 *     not, non-easy  : phi = x_y - m3 - m2 sin(m2)                            phi' = 1
 *     not, easy      : phi = x_y - m3                                         phi' = 1
 *     FL_MARGIN_GRAD_STRAIGHT: phi' = 1 everywhere (the margin as a constant shift).
 *   z_j = s x_j (j != y), z_y = s phi, lse = log sum_j exp z_j, l_i = lse - z_y,
 *   p_j = exp(z_j - lse); dx_j = g_i s (p_j - [j == y]) (x phi' at j == y), rounded double ->
 *   fp32 -> dtype (as every CPU output), with
 *   g_i = grad_scale (grad_loss ? grad_loss[NONE ? i : 0] : 1) [/ D for MEAN],
 *   D = the number of rows not ignored.
 * Ignored rows (targets[i] == ignore_index): loss 0, lse 0, gradient 0 (first C columns), the row
 * is not read. Targets not in [0, C) and not ignore_index: FL_ERR_TARGET_OUT_OF_RANGE naming the
 * first bad row, checked for every row before anything is written.
 * Reductions: the per-row losses go to the workspace ([256, 256 + 8N) as double) and are summed
 * in row order afterwards, so results do not depend on the thread count (OpenMP over rows).
 * MEAN with D == 0 (every row ignored, or N == 0) is NaN, the gradient then all zeros.
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"
#include "dtype.h"

static const double PI_D = 3.14159265358979323846;

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

static int64_t load_target(const void* t, fl_index_dtype it, int64_t i) {
    return it == FL_INDEX_I32 ? (int64_t)((const int32_t*)t)[i] : ((const int64_t*)t)[i];
}

/* Every target in [0, C) or ignore_index (the first bad row is reported; nothing is written),
 * and *D = the number of rows not ignored. */
static fl_status check_targets(const char* fn, const fl__margin_params* p, const void* targets, int64_t* D) {
    int64_t d = 0;
    for (int64_t i = 0; i < p->N; i++) {
        const int64_t t = load_target(targets, p->index_dtype, i);
        if (t == p->ignore_index) continue;
        if (t < 0 || t >= p->C)
            return fl__fail(FL_ERR_TARGET_OUT_OF_RANGE,
                            "%s: targets[%lld] = %lld (row %lld) not in [0, %lld) and not ignore_index (%lld)", fn,
                            (long long)i, (long long)t, (long long)i, (long long)p->C, (long long)p->ignore_index);
        d++;
    }
    *D = d;
    return FL_OK;
}

/* phi(x_y) and phi'(x_y) of the options (formulas above), in double */
static void margin_phi(const fl__margin_params* p, double x, double* phi, double* dphi) {
    const double m1 = (double)p->m1, m2 = (double)p->m2, m3 = (double)p->m3;
    if (p->cosface) {             /* cos(acos x) == x: exactly the shift, for any x */
        *phi = x - m3;
        *dphi = 1.0;
        return;
    }
    const double xc = x < -1.0 ? -1.0 : x > 1.0 ? 1.0 : x;   /* NaN stays NaN (then phi is NaN) */
    const double theta = acos(xc);
    const double a = m1 * theta + m2;
    const int applies = p->easy_margin ? x > 0.0 : a <= PI_D;
    if (applies) {
        *phi = cos(a) - m3;
        if (p->grad_mode == FL_MARGIN_GRAD_EXACT) {
            const double st = sin(theta);
            *dphi = m1 * sin(a) / (st > 1e-6 ? st : 1e-6);   /* finite at x_y = +-1 */
        } else {
            *dphi = 1.0;
        }
    } else {
        *phi = p->easy_margin ? x - m3 : x - m3 - m2 * sin(m2);
        *dphi = 1.0;
    }
}

/* the whole call; dlogits NULL: forward only. loss and lse may be NULL (fused). */
static void margin_cpu(const fl__margin_params* p, float* loss, float* lse, void* dx, const void* x,
                       const void* targets, const float* grad_loss, float grad_scale, int64_t D, void* ws) {
    const int64_t N = p->N, C = p->C;
    const int none = p->reduction == FL_REDUCTION_NONE;
    const double s = (double)p->s;
    const double denom = p->reduction == FL_REDUCTION_MEAN ? (double)D : 1.0;

#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if ((double)N * (double)C > 65536.0)
#endif
    for (int64_t i = 0; i < N; i++) {
        const int64_t off = i * p->ld;   /* 64-bit: N*ld may exceed 2^31 */
        const int64_t y = load_target(targets, p->index_dtype, i);
        if (y == p->ignore_index) {
            part_set(ws, i, 0.0);
            if (loss && none) loss[i] = 0.0f;
            if (lse) lse[i] = 0.0f;
            if (dx)
                for (int64_t j = 0; j < C; j++) store_grad(dx, p->dtype, off + j, 0.0);
            continue;
        }
        /* pass 0: the target's margin */
        double phi, dphi;
        margin_phi(p, load_d(x, p->dtype, off + y), &phi, &dphi);
        const double zy = s * phi;
        /* pass 1: max_j z_j */
        double m = zy;
        for (int64_t j = 0; j < C; j++) {
            if (j == y) continue;
            const double z = s * load_d(x, p->dtype, off + j);
            if (z > m) m = z;   /* NaN drops out here and poisons the sum below */
        }
        /* pass 2: the sums of exponentials relative to the max (no overflow), the target's apart:
         * l = log1p(so) when the target is the max (no cancellation when l is tiny: a confident
         * row), and p_y - 1 = -so / (ey + so) in the gradient */
        double so = 0.0;
        for (int64_t j = 0; j < C; j++)
            if (j != y) so += exp(s * load_d(x, p->dtype, off + j) - m);
        const double ey = exp(zy - m);
        const double lz = (m == -INFINITY) ? -INFINITY : m + log(ey + so);
        const double li = m == zy ? log1p(so) : lz - zy;
        part_set(ws, i, li);
        if (loss && none) loss[i] = (float)li;
        if (lse) lse[i] = (float)lz;
        if (dx) {   /* pass 3: read x_j, then write dx_j (in place works) */
            const double gl = grad_loss ? (double)grad_loss[none ? i : 0] : 1.0;
            const double gs = (double)grad_scale * gl / denom * s;   /* denom >= 1 here: this row counts */
            const double dy = gs * dphi * ((0.0 - so) / (ey + so));   /* g s (p_y - 1) phi' */
            for (int64_t j = 0; j < C; j++)
                store_grad(dx, p->dtype, off + j, j == y ? dy : gs * exp(s * load_d(x, p->dtype, off + j) - lz));
        }
    }

    if (loss && !none) {
        double sum = 0.0;
        for (int64_t i = 0; i < N; i++) sum += part_get(ws, i);   /* fixed row order */
        if (p->reduction == FL_REDUCTION_MEAN) sum = D > 0 ? sum / (double)D : NAN;
        loss[0] = (float)sum;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                               */

fl_status fl_margin_ce_forward_cpu(float* loss, float* lse, const void* logits, int64_t ld, const void* targets,
                                   fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                   const fl_margin_options* opts, void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_margin_ce_forward_cpu";
    fl__clear_error();
    fl__margin_params p;
    FL_CHECK(fl__margin_validate(fn, FL__PASS_FORWARD, 0, loss, lse, NULL, logits, ld, targets, index_dtype, NULL,
                                 1.0f, N, C, dtype, opts, workspace, workspace_bytes, &p));
    int64_t D = 0;
    FL_CHECK(check_targets(fn, &p, targets, &D));
    margin_cpu(&p, loss, lse, NULL, logits, targets, NULL, 1.0f, D, workspace);
    return FL_OK;
}

fl_status fl_margin_ce_fused_cpu(float* loss, float* lse, void* dlogits, const void* logits, int64_t ld,
                                 const void* targets, fl_index_dtype index_dtype, const float* grad_loss,
                                 float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                 const fl_margin_options* opts, void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_margin_ce_fused_cpu";
    fl__clear_error();
    fl__margin_params p;
    FL_CHECK(fl__margin_validate(fn, FL__PASS_FUSED, 0, loss, lse, dlogits, logits, ld, targets, index_dtype,
                                 grad_loss, grad_scale, N, C, dtype, opts, workspace, workspace_bytes, &p));
    int64_t D = 0;
    FL_CHECK(check_targets(fn, &p, targets, &D));
    margin_cpu(&p, loss, lse, N > 0 ? dlogits : NULL, logits, targets, grad_loss, grad_scale, D, workspace);
    return FL_OK;
}
