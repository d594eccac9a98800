/* ref_cross_entropy.h — independent long-double reference for cross-entropy on logits,
 * derived from the formulas in include/fusedloss.h (section 5), shared by
 * tests/test_cross_entropy.c and tests/fuzz_cross_entropy.c. Header-only; include after
 * test_util.h.
 *
 * Per non-ignored row i with target t (eps = label_smoothing, w = weights or 1,
 * zeta = z_loss, c = softcap, s = logit_scale):
 *   u_j = s*x_j;  z_j = u_j (c == 0) or c*tanh(u_j/c), plus o_j (logit_offset, 0 without);
 *   lse = log sum_j exp z_j
 *   ce_i = (1-eps) w_t (lse - z_t) + (eps/V) sum_j w_j (lse - z_j)
 *   zl_i = zeta * lse^2;   l_i = ce_i + zl_i
 * Reductions: NONE l_i; SUM sum l_i; MEAN sum ce_i / D_w + sum zl_i / D_n (NaN when D_n == 0).
 *
 * Gradient, derived by hand (proved against central differences in test_cross_entropy.c):
 *   p_j = exp(z_j - lse),  W = sum_j w_j
 *   d ce_i / d z_j = (1-eps) w_t (p_j - [j==t]) + (eps/V) (W p_j - w_j)
 *   d zl_i / d z_j = 2 zeta lse p_j
 *   d z_j / d x_j  = s                      (c == 0)
 *                  = s (1 - tanh^2(u_j/c))  (c  > 0)
 *   dx_ij = (a_ce * d ce_i/d z_j + a_zl * d zl_i/d z_j) * d z_j/d x_j with
 *   NONE: a_ce = a_zl = gs*gl[i];  SUM: a_ce = a_zl = gs*gl[0];
 *   MEAN: a_ce = gs*gl[0]/D_w, a_zl = gs*gl[0]/D_n (when D_n == 0 no row counts: all zeros).
 *   (gs = grad_scale, gl = grad_loss or 1.)
 */
#ifndef FL_REF_CROSS_ENTROPY_H
#define FL_REF_CROSS_ENTROPY_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "fusedloss.h"
#include "test_util.h"

/* Where the reference reads logits from: a library buffer of dtype `dt` with row stride
 * `ld`, or (dt == REF_LDOUBLE) a dense long double array, used for finite differences. */
#define REF_LDOUBLE ((fl_dtype)100)
typedef struct {
    const void* p;
    fl_dtype    dt;
    int64_t     ld;
} ref_logits;

static inline long double ref_x(const ref_logits* x, int64_t i, int64_t j) {
    int64_t k = i * x->ld + j;
    if (x->dt == REF_LDOUBLE) return ((const long double*)x->p)[k];
    return (long double)tu_load(x->p, x->dt, k);
}

static inline int64_t ref_target(const void* targets, fl_index_dtype it, int64_t i) {
    return it == FL_INDEX_I32 ? (int64_t)((const int32_t*)targets)[i] : ((const int64_t*)targets)[i];
}

/* z_j and dz_j/dx_j for one raw logit. */
static inline void ref_transform(long double x, long double s, long double c, long double* z, long double* dzdx) {
    long double u = s * x;
    if (c > 0) {
        long double th = tanhl(u / c);
        *z = c * th;
        *dzdx = s * (1.0L - th * th);
    } else {
        *z = u;
        *dzdx = s;
    }
}

/* p_t = exp(z_t - lse) per row (1 for ignored rows): the target_prob output of section 5. */
static inline void ref_target_prob(const ref_logits* x, const void* targets, fl_index_dtype it, int64_t N,
                                   int64_t V, const fl_ce_options* o, long double* out) {
    for (int64_t i = 0; i < N; i++) {
        const int64_t t = ref_target(targets, it, i);
        if (t == o->ignore_index) { out[i] = 1.0L; continue; }
        long double m = -INFINITY, sum = 0.0L, zt = 0.0L, z, dz;
        for (int64_t j = 0; j < V; j++) {
            ref_transform(ref_x(x, i, j), o->logit_scale, o->softcap, &z, &dz);
            if (o->logit_offset) z += (long double)o->logit_offset[j];
            if (z > m) m = z;
        }
        for (int64_t j = 0; j < V; j++) {
            ref_transform(ref_x(x, i, j), o->logit_scale, o->softcap, &z, &dz);
            if (o->logit_offset) z += (long double)o->logit_offset[j];
            sum += expl(z - m);
            if (j == t) zt = z;
        }
        out[i] = expl(zt - m) / sum;
    }
}

/* ref_ce() : loss ([N] for NONE, [1] otherwise), lse [N] and the gradient dx (dense [N*V],
 * double) of the reduced loss times the upstream gradient. Any output may be NULL.
 * dx_saved: the same gradient computed with the given fp32 lse_saved values in place of the
 * exact lse, i.e. what a backward pass fed with the forward's saved lse computes; the
 * difference dx - dx_saved is what lse's fp32 rounding explains.
 * Targets must be valid (in [0, V) or ignore_index). */
static inline void ref_ce(const ref_logits* x, const void* targets, fl_index_dtype it, int64_t N, int64_t V,
                          const fl_ce_options* opts, const float* grad_loss, float grad_scale,
                          const float* lse_saved, long double* loss, long double* lse_out, double* dx,
                          double* dx_saved) {
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    if (opts) o = *opts;
    const long double eps = o.label_smoothing, zeta = o.z_loss, c = o.softcap, s = o.logit_scale;
    long double W = 0.0L;
    for (int64_t j = 0; j < V; j++) W += o.weight ? (long double)o.weight[j] : 1.0L;
    if (!lse_saved) dx_saved = NULL;

    /* the denominators depend on the targets only */
    long double D_w = 0.0L;
    int64_t D_n = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = ref_target(targets, it, i);
        if (t == o.ignore_index) continue;
        D_w += o.weight ? (long double)o.weight[t] : 1.0L;
        D_n++;
    }

    long double* z = (long double*)tu_xmalloc((size_t)V * sizeof(long double));
    long double* dz = (long double*)tu_xmalloc((size_t)V * sizeof(long double));
    long double* e = (long double*)tu_xmalloc((size_t)V * sizeof(long double));
    long double sum_ce = 0.0L, sum_zl = 0.0L;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = ref_target(targets, it, i);
        if (t == o.ignore_index) {
            if (lse_out) lse_out[i] = 0.0L;
            if (loss && o.reduction == FL_REDUCTION_NONE) loss[i] = 0.0L;
            for (int64_t j = 0; j < V; j++) {
                if (dx) dx[i * V + j] = 0.0;
                if (dx_saved) dx_saved[i * V + j] = 0.0;
            }
            continue;
        }
        /* lse = m + log sum_j exp(z_j - m) */
        long double m = -INFINITY, sum = 0.0L;
        for (int64_t j = 0; j < V; j++) {
            ref_transform(ref_x(x, i, j), s, c, &z[j], &dz[j]);
            if (o.logit_offset) z[j] += (long double)o.logit_offset[j];   /* dz/dx unchanged */
            if (z[j] > m) m = z[j];
        }
        for (int64_t j = 0; j < V; j++) sum += (e[j] = expl(z[j] - m));
        const long double L = m + logl(sum);
        if (lse_out) lse_out[i] = L;
        /* loss terms */
        const long double wt = o.weight ? (long double)o.weight[t] : 1.0L;
        long double smooth = 0.0L;
        if (eps != 0.0L)
            for (int64_t j = 0; j < V; j++) smooth += (o.weight ? (long double)o.weight[j] : 1.0L) * (L - z[j]);
        const long double ce = (1.0L - eps) * wt * (L - z[t]) + (eps / (long double)V) * smooth;
        const long double zl = zeta * L * L;
        if (loss && o.reduction == FL_REDUCTION_NONE) loss[i] = ce + zl;
        sum_ce += ce;
        sum_zl += zl;
        /* gradients: p_j = exp(z_j - lse) = e_j / sum; with a saved lse Ls,
         * exp(z_j - Ls) = p_j * exp(lse - Ls) */
        long double g = (long double)grad_scale;
        if (grad_loss) g *= (long double)grad_loss[o.reduction == FL_REDUCTION_NONE ? i : 0];
        long double a_ce = g, a_zl = g;
        if (o.reduction == FL_REDUCTION_MEAN) { a_ce = g / D_w; a_zl = g / (long double)D_n; }
        for (int k = 0; k < 2; k++) {
            double* row = k == 0 ? dx : dx_saved;
            if (!row) continue;
            row += i * V;
            const long double Lk = k == 0 ? L : (long double)lse_saved[i];
            const long double scale_p = k == 0 ? 1.0L / sum : expl(L - Lk) / sum;
            for (int64_t j = 0; j < V; j++) {
                long double p = e[j] * scale_p;
                long double wj = o.weight ? (long double)o.weight[j] : 1.0L;
                long double dce = (1.0L - eps) * wt * (p - (j == t ? 1.0L : 0.0L)) +
                                  (eps / (long double)V) * (W * p - wj);
                long double dzl = 2.0L * zeta * Lk * p;
                row[j] = (double)((a_ce * dce + a_zl * dzl) * dz[j]);
            }
        }
    }
    if (loss && o.reduction == FL_REDUCTION_SUM) loss[0] = sum_ce + sum_zl;
    if (loss && o.reduction == FL_REDUCTION_MEAN)
        loss[0] = D_n == 0 ? (long double)NAN : sum_ce / D_w + sum_zl / (long double)D_n;
    free(z);
    free(dz);
    free(e);
}

/* The scalar whose gradient backward/fused compute: sum_r gs*gl[r]*loss[r]. */
static inline long double ref_objective(const long double* loss, int64_t N, fl_reduction red,
                                 const float* grad_loss, float grad_scale) {
    if (red != FL_REDUCTION_NONE) return (long double)grad_scale * (grad_loss ? grad_loss[0] : 1.0f) * loss[0];
    long double acc = 0.0L;
    for (int64_t i = 0; i < N; i++) acc += (long double)grad_scale * (grad_loss ? grad_loss[i] : 1.0f) * loss[i];
    return acc;
}

/* ------------------------------------------------------------------------------------------
 * Checks on library outputs shared by the test and the fuzz.
 * ---------------------------------------------------------------------------------------- */

/* Slack for a backward pass, which works from the fp32 lse saved by forward: its exact
 * result is g_saved (the reference run with that lse), which it then rounds with the usual
 * tolerance atol + rtol*|g_saved|. Measured against the exact gradient g:
 *   |got - g| <= atol + rtol*|g| + (1 + rtol)*|g_saved - g|.
 * slack may alias g_saved. */
static inline void ref_slack(double* slack, const double* g_saved, const double* g, int64_t n, double rtol) {
    for (int64_t k = 0; k < n; k++) slack[k] = (1.0 + rtol) * fabs(g_saved[k] - g[k]);
}

/* dlogits [N, ld] of dtype dt: the padding columns V..ld-1 still hold the poison, every used
 * element was written (no poison left), and the used part is close to ref (dense [N*V]),
 * with an optional per-element slack. Counts as at most three checks. */
static inline int ref_check_dlogits(const char* name, const void* dl, fl_dtype dt, int64_t N, int64_t V,
                                    int64_t ld, const double* ref, const double* slack, double atol,
                                    double rtol) {
    const size_t es = tu_dtype_size(dt);
    int64_t unwritten = 0, pad_touched = 0;
    double* got = (double*)tu_xmalloc((size_t)(N * V > 0 ? N * V : 1) * sizeof(double));
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = 0; j < ld; j++) {
            int poison = tu_is_poison(dl, es, i * ld + j);
            if (j < V) {
                unwritten += poison;
                got[i * V + j] = tu_load(dl, dt, i * ld + j);
            } else {
                pad_touched += !poison;
            }
        }
    }
    int ok = 1;
    if (ld > V) ok &= CHECK(pad_touched == 0, "%s: %lld padding elements (columns V..ld-1) written", name,
                            (long long)pad_touched);
    ok &= CHECK(unwritten == 0, "%s: %lld of %lld elements not written (poison left)", name,
                (long long)unwritten, (long long)(N * V));
    ok &= check_close_ex(name, got, ref, slack, N * V, atol, rtol);
    free(got);
    return ok;
}

/* loss/lse outputs (fp32 [n]) vs a long-double reference; elements whose reference is NaN
 * may hold anything NaN (the poison is NaN too: callers test written-ness of NaN results
 * separately with a finite poison). */
static inline int ref_check_f32(const char* name, const float* got, const long double* ref, int64_t n,
                                double atol, double rtol) {
    double* g = (double*)tu_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    double* r = (double*)tu_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    int64_t unwritten = 0;
    for (int64_t i = 0; i < n; i++) {
        g[i] = got[i];
        r[i] = (double)ref[i];
        if (!isnan(r[i]) && tu_is_poison(got, 4, i)) unwritten++;
    }
    int ok = CHECK(unwritten == 0, "%s: %lld of %lld elements not written", name, (long long)unwritten,
                   (long long)n);
    ok &= check_close(name, g, r, n, atol, rtol);
    free(g);
    free(r);
    return ok;
}

/* Rounding of fp16/bf16 dlogits: the CPU backend computes in double and rounds once
 * (round-to-nearest-even, via fp32), so each element must equal the reference rounded the
 * same way, except where the reference lies within 1/100 ulp of a rounding boundary (the
 * library's double result may fall on either side) or below 1e-8 in magnitude (where
 * cancellation in double dominates the relative error). `exact` is the gradient the pass
 * computes (for backward: the reference run with the saved lse). fp32 dlogits are not held
 * to this. Catches truncation and broken subnormal rounding, which the tolerance admits. */
static inline int ref_check_rounding(const char* name, const void* dl, fl_dtype dt, int64_t N, int64_t V,
                                     int64_t ld, const double* exact) {
    if (dt == FL_DTYPE_F32) return 1;
    int64_t bad = 0, checked = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < V; j++) {
            double r = exact[i * V + j];
            if (!(fabs(r) >= 1e-8)) continue;
            int e;
            frexp(r, &e);                                   /* |r| in [2^(e-1), 2^e) */
            int mant = dt == FL_DTYPE_F16 ? 10 : 7;
            double ulp = ldexp(1.0, e - 1 - mant);
            if (dt == FL_DTYPE_F16 && ulp < 5.9604644775390625e-08) ulp = 5.9604644775390625e-08;
            float lo = tu_round_to(dt, (float)(r - 0.01 * ulp)), hi = tu_round_to(dt, (float)(r + 0.01 * ulp));
            if (lo != hi) continue;                         /* within the guard band of a tie */
            checked++;
            float got = tu_load(dl, dt, i * ld + j);
            if (got != lo) {
                if (bad < 5)
                    printf("  %s%s%s[%lld]: got %.9g, correctly rounded reference %.9g (exact %.12g)\n", tu_context,
                           tu_context[0] ? " " : "", name, (long long)(i * V + j), got, lo, r);
                bad++;
            }
        }
    return CHECK(bad == 0, "%s: %lld of %lld elements not correctly rounded to %s", name, (long long)bad,
                 (long long)checked, tu_dtype_name(dt));
}

#endif /* FL_REF_CROSS_ENTROPY_H */
