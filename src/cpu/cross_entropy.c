/* cross_entropy.c — CPU reference backend of cross-entropy (the executable specification).
 *
 * Plain C11 loops, double accumulation, one row at a time:
 *   pass 1 over the row: online max/sum-exp (rescaled when the max grows), the target logit
 *          and the weighted logit sum needed by label smoothing;
 *   pass 2 (gradient passes only): p_j = exp(z_j - lse) and the gradient below.
 * Rows are spread over threads with OpenMP when it is available; sums over rows are done
 * afterwards in a fixed order from per-row values kept in the workspace, so the result is
 * bitwise independent of the thread count. The same pieces (fl__ce_cpu_denoms, fl__ce_cpu_rows
 * on a range of rows, fl__ce_cpu_reduce; src/internal.h) run linear cross-entropy's chunks
 * (src/cpu/linear_cross_entropy.c), and the row-level pieces below them (fl__ce_cpu_row_partial
 * on a slice of the columns, fl__ce_lse, fl__ce_row_terms, fl__ce_row_upstream,
 * fl__ce_cpu_row_grad) run the vocab-parallel steps on a vocabulary shard
 * (src/cpu/vocab_parallel.c), so all three ops share one implementation of the row math.
 *
 * ---- Formulas (row i, target t, upstream gradient g_a for the CE part, g_b for z-loss) ----
 *   y_j  = s x_j                       (softcap c == 0)      dy_j/dx_j = s
 *   y_j  = c tanh(s x_j / c)           (softcap c  > 0)      dy_j/dx_j = s (1 - (y_j/c)^2)
 *   z_j  = y_j + o_j                   (o = logit_offset, 0 without)     dz_j/dx_j = dy_j/dx_j
 *   lse  = log sum_j exp z_j,  p_j = exp(z_j - lse)
 *   W    = sum_j w_j  (= V without class weights; w_j = 1 then)
 *   a_i  = (1-eps) w_t (lse - z_t) + (eps/V) (W lse - sum_j w_j z_j)     CE + smoothing
 *   b_i  = zeta lse^2                                                      z-loss
 *   d a_i / d z_j = (1-eps) w_t (p_j - [j==t]) + (eps/V) (W p_j - w_j)
 *   d b_i / d z_j = 2 zeta lse p_j
 *   dlogits_ij    = (g_a d a_i/d z_j + g_b d b_i/d z_j) dz_j/dx_j
 * Upstream: G_i = grad_scale * (grad_loss ? grad_loss[NONE ? i : 0] : 1);
 *   NONE, SUM: g_a = g_b = G_i;  MEAN: g_a = G/D_w, g_b = G/D_n with
 *   D_w = sum of w_t over non-ignored rows, D_n = their count.
 * Ignored rows (target == ignore_index): a = b = 0, gradient 0, lse reported as 0.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"
#include "dtype.h"

static double load_logit(const void* base, fl_dtype dt, int64_t idx) { return (double)fl__load_f32(base, dt, idx); }

/* double -> float (RN) -> output dtype (RN); the CUDA backend rounds its fp32 the same way */
static void store_grad(void* base, fl_dtype dt, int64_t idx, double v) { fl__store_f32(base, dt, idx, (float)v); }

int64_t fl__ce_load_target(const void* t, fl_index_dtype it, int64_t i) {
    return it == FL_INDEX_I32 ? (int64_t)((const int32_t*)t)[i] : ((const int64_t*)t)[i];
}

void fl__cpu_load_row(double* dst, const void* base, fl_dtype dt, int64_t off, int64_t n) {
    for (int64_t k = 0; k < n; k++) dst[k] = load_logit(base, dt, off + k);
}

void fl__cpu_store_row(void* base, fl_dtype dt, int64_t off, const double* src, int64_t n) {
    for (int64_t k = 0; k < n; k++) store_grad(base, dt, off + k, src[k]);
}

/* ---------------------------------------------------------------------------------------- */
/* per-row math                                                                               */

static double transform(double x, const fl__ce_params* p) {
    double z = (double)p->logit_scale * x;
    if (p->softcap > 0.0f) z = (double)p->softcap * tanh(z / (double)p->softcap);
    return z;
}

static double dtransform(double z, const fl__ce_params* p) {
    if (p->softcap > 0.0f) {
        double r = z / (double)p->softcap;
        return (double)p->logit_scale * (1.0 - r * r);
    }
    return (double)p->logit_scale;
}

/* z_j = transform(x_j) + o_j: the logit the loss sees (dz/dx = dtransform of the transform) */
static double offset_at(const fl__ce_params* p, int64_t j) {
    return p->logit_offset ? (double)p->logit_offset[j] : 0.0;
}

/* Pass 1 over columns [col0, col0 + n) of one row (element `off` of logits is column col0): the
 * online max m and sum-exp s (s relative to m), the target logit z_t (0 unless col0 <= t <
 * col0 + n) and sum_j w_j z_j. The whole row is col0 = 0, n = V; a vocabulary shard
 * (src/cpu/vocab_parallel.c) is its own slice of the global columns. */
void fl__ce_cpu_row_partial(const void* logits, fl_dtype dt, int64_t off, int64_t col0, int64_t n, int64_t t,
                            const fl__ce_params* p, double* m_out, double* s_out, double* zt, double* wz) {
    const int64_t tl = t - col0;                   /* t's column in this slice; outside [0, n) if not here */
    const float* w = p->weight ? p->weight + col0 : NULL;
    double m = -INFINITY, s = 0.0, sw = 0.0, z_t = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double z = transform(load_logit(logits, dt, off + j), p) + offset_at(p, col0 + j);
        if (j == tl) z_t = z;
        sw += (w ? (double)w[j] : 1.0) * z;
        if (z > m) {                       /* online rescale: s was relative to the old max */
            s = (m == -INFINITY ? 0.0 : s * exp(m - z)) + 1.0;
            m = z;
        } else {
            s += exp(z - m);               /* NaN z falls here and poisons s, as it should */
        }
    }
    *m_out = m;
    *s_out = s;
    *zt = z_t;
    *wz = sw;
}

double fl__ce_lse(double m, double s) {
    /* all-(-inf) row: m = -inf -> lse = -inf, the loss is +inf (as PyTorch); s is not read (the
     * row loop leaves it NaN there, from exp(-inf - -inf)) */
    return (m == -INFINITY) ? -INFINITY : m + log(s);
}

/* Pass 1: lse, target logit z_t and sum_j w_j z_j of one row. */
static void row_stats(const void* logits, fl_dtype dt, int64_t off, int64_t V, int64_t t,
                      const fl__ce_params* p, double* lse, double* zt, double* wz) {
    double m, s;
    fl__ce_cpu_row_partial(logits, dt, off, 0, V, t, p, &m, &s, zt, wz);
    *lse = fl__ce_lse(m, s);
}

void fl__ce_row_terms(const fl__ce_params* p, int64_t V, double W, int64_t t, double lse, double z_t, double wz,
                      double* a, double* b) {
    const double eps = (double)p->label_smoothing;
    const double w_t = p->weight ? (double)p->weight[t] : 1.0;
    /* without smoothing the smoothing term is left out, not multiplied by 0: with a -inf logit
     * W lse - wz is inf and 0 * inf would make the loss NaN (PyTorch's is finite; so is CUDA's) */
    *a = (1.0 - eps) * w_t * (lse - z_t);
    if (eps != 0.0) *a += (eps / (double)V) * (W * lse - wz);
    *b = (double)p->z_loss * lse * lse;
}

void fl__ce_row_upstream(const fl__ce_params* p, const fl__ce_denoms* d, const float* grad_loss, float grad_scale,
                         int64_t i, double* g_a, double* g_b) {
    const int none = p->reduction == FL_REDUCTION_NONE, mean = p->reduction == FL_REDUCTION_MEAN;
    double G = (double)grad_scale * (grad_loss ? (double)grad_loss[none ? i : 0] : 1.0);
    *g_a = mean ? G / d->D_w : G;
    *g_b = mean ? G / d->D_n : G;
}

/* Gradient of columns [col0, col0 + n) of one row into dlogits (may alias logits: element j is
 * read before written); V is the whole vocabulary (smoothing's eps / V), t the global target. */
void fl__ce_cpu_row_grad(void* dlogits, const void* logits, fl_dtype dt, int64_t off, int64_t col0, int64_t n,
                         int64_t V, int64_t t, double lse, double W, double g_a, double g_b,
                         const fl__ce_params* p) {
    const double eps = (double)p->label_smoothing;
    const double w_t = p->weight ? (double)p->weight[t] : 1.0;
    const double c_t = (1.0 - eps) * w_t;          /* coefficient of (p_j - [j==t]) */
    const double c_s = eps / (double)V;            /* coefficient of (W p_j - w_j)  */
    const double c_z = 2.0 * (double)p->z_loss * lse;
    const int64_t tl = t - col0;
    const float* w = p->weight ? p->weight + col0 : NULL;
    for (int64_t j = 0; j < n; j++) {
        double y = transform(load_logit(logits, dt, off + j), p);
        double pj = exp(y + offset_at(p, col0 + j) - lse);
        double w_j = w ? (double)w[j] : 1.0;
        double da = c_t * (pj - (j == tl ? 1.0 : 0.0)) + c_s * (W * pj - w_j);
        double db = c_z * pj;
        store_grad(dlogits, dt, off + j, (g_a * da + g_b * db) * dtransform(y, p));
    }
}

void fl__ce_cpu_row_zero(void* dlogits, fl_dtype dt, int64_t off, int64_t n) {
    for (int64_t j = 0; j < n; j++) store_grad(dlogits, dt, off + j, 0.0);
}

/* ---------------------------------------------------------------------------------------- */
/* the three passes share one driver, and linear cross-entropy (src/cpu/linear_cross_entropy.c)
 * the same pieces: denominators over the batch, the per-row work on a range of rows, the fixed-
 * order reduction                                                                             */

fl_status fl__ce_cpu_denoms(const char* fn, const void* targets, fl_index_dtype it, int64_t N, int64_t V,
                            const fl__ce_params* p, fl__ce_denoms* d) {
    /* targets are checked before anything is written: the first bad row is reported */
    double D_w = 0.0, D_n = 0.0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = fl__ce_load_target(targets, it, i);
        if (t == p->ignore_index) continue;
        if (t < 0 || t >= V)
            return fl__fail(FL_ERR_TARGET_OUT_OF_RANGE, "%s: targets[%lld] = %lld (row %lld) not in [0, %lld) and not ignore_index (%lld)",
                            fn, (long long)i, (long long)t, (long long)i, (long long)V, (long long)p->ignore_index);
        D_n += 1.0;
        D_w += p->weight ? (double)p->weight[t] : 1.0;
    }
    double W = (double)V;
    if (p->weight) {
        W = 0.0;
        for (int64_t j = 0; j < V; j++) W += (double)p->weight[j];
    }
    d->D_w = D_w;
    d->D_n = D_n;
    d->W = W;
    return FL_OK;
}

void fl__ce_cpu_rows(fl__pass pass, const fl__ce_params* p, const fl__ce_denoms* d, float* loss,
                     float* lse_out, void* dlogits, const void* logits, int64_t ld, const void* targets,
                     fl_index_dtype it, const float* lse_in, const float* grad_loss, float grad_scale,
                     int64_t r0, int64_t C, int64_t V, fl_dtype dt, double* part) {
    const int none = p->reduction == FL_REDUCTION_NONE;

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (C * V > 65536)
#endif
    for (int64_t k = 0; k < C; k++) {
        const int64_t i = r0 + k;                        /* absolute row: targets, loss, lse, part */
        const int64_t off = k * ld;                      /* 64-bit: C*ld may exceed 2^31 */
        const int64_t t = fl__ce_load_target(targets, it, i);
        if (t == p->ignore_index) {
            part[2 * i] = part[2 * i + 1] = 0.0;
            if (pass != FL__PASS_BACKWARD) {
                if (none) loss[i] = 0.0f;
                if (lse_out) lse_out[i] = 0.0f;
                if (p->target_prob) p->target_prob[i] = 1.0f;
            }
            if (pass != FL__PASS_FORWARD) fl__ce_cpu_row_zero(dlogits, dt, off, V);
            continue;
        }
        double lse, z_t = 0.0, wz = 0.0;
        if (pass == FL__PASS_BACKWARD) {
            lse = (double)lse_in[i];
        } else {
            double a, b;
            row_stats(logits, dt, off, V, t, p, &lse, &z_t, &wz);
            fl__ce_row_terms(p, V, d->W, t, lse, z_t, wz, &a, &b);
            part[2 * i] = a;
            part[2 * i + 1] = b;
            if (none) loss[i] = (float)(a + b);
            if (lse_out) lse_out[i] = (float)lse;
            if (p->target_prob) p->target_prob[i] = (float)exp(z_t - lse);
        }
        if (pass != FL__PASS_FORWARD) {
            double g_a, g_b;
            fl__ce_row_upstream(p, d, grad_loss, grad_scale, i, &g_a, &g_b);
            fl__ce_cpu_row_grad(dlogits, logits, dt, off, 0, V, V, t, lse, d->W, g_a, g_b, p);
        }
    }
}

void fl__ce_cpu_reduce(float* loss, const double* part, int64_t N, const fl__ce_params* p,
                       const fl__ce_denoms* d) {
    if (p->reduction == FL_REDUCTION_NONE) return;
    const int mean = p->reduction == FL_REDUCTION_MEAN;
    double sa = 0.0, sb = 0.0;                           /* fixed order: thread-count independent */
    for (int64_t i = 0; i < N; i++) { sa += part[2 * i]; sb += part[2 * i + 1]; }
    double total = mean ? sa / d->D_w + (p->z_loss > 0.0f ? sb / d->D_n : 0.0) : sa + sb;
    loss[0] = (float)total;
}

static fl_status ce_cpu(const char* fn, fl__pass pass, float* loss, float* lse_out, void* dlogits,
                        const void* logits, const void* targets, const float* lse_in,
                        const float* grad_loss, float grad_scale, int64_t N, int64_t V, int64_t ld,
                        fl_dtype dt, fl_index_dtype it, const fl_ce_options* opts,
                        void* workspace, size_t workspace_bytes) {
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__ce_validate(fn, pass, 0, loss, pass == FL__PASS_BACKWARD ? lse_in : lse_out, dlogits,
                             logits, targets, grad_loss, N, V, ld, dt, it, opts, workspace, workspace_bytes, &p));
    if (pass != FL__PASS_FORWARD && !isfinite(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) is not finite", fn, (double)grad_scale);

    fl__ce_denoms d;
    FL_CHECK(fl__ce_cpu_denoms(fn, targets, it, N, V, &p, &d));
    double* part = (double*)((char*)workspace + 256);   /* [N][2]: a_i, b_i */
    fl__ce_cpu_rows(pass, &p, &d, loss, lse_out, dlogits, logits, ld, targets, it, lse_in, grad_loss, grad_scale,
                    0, N, V, dt, part);
    if (pass != FL__PASS_BACKWARD) fl__ce_cpu_reduce(loss, part, N, &p, &d);
    return FL_OK;
}

fl_status fl_cross_entropy_forward_cpu(float* loss, float* lse, const void* logits, const void* targets,
                                       int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                       fl_index_dtype index_dtype, const fl_ce_options* opts,
                                       void* workspace, size_t workspace_bytes) {
    return ce_cpu("fl_cross_entropy_forward_cpu", FL__PASS_FORWARD, loss, lse, NULL, logits, targets, NULL,
                  NULL, 1.0f, N, V, ld, dtype, index_dtype, opts, workspace, workspace_bytes);
}

fl_status fl_cross_entropy_backward_cpu(void* dlogits, const void* logits, const void* targets,
                                        const float* lse, const float* grad_loss, float grad_scale,
                                        int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                        fl_index_dtype index_dtype, const fl_ce_options* opts,
                                        void* workspace, size_t workspace_bytes) {
    return ce_cpu("fl_cross_entropy_backward_cpu", FL__PASS_BACKWARD, NULL, NULL, dlogits, logits, targets,
                  lse, grad_loss, grad_scale, N, V, ld, dtype, index_dtype, opts, workspace, workspace_bytes);
}

fl_status fl_cross_entropy_fused_cpu(float* loss, float* lse, void* dlogits, const void* logits,
                                     const void* targets, const float* grad_loss, float grad_scale,
                                     int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                     fl_index_dtype index_dtype, const fl_ce_options* opts,
                                     void* workspace, size_t workspace_bytes) {
    return ce_cpu("fl_cross_entropy_fused_cpu", FL__PASS_FUSED, loss, lse, dlogits, logits, targets, NULL,
                  grad_loss, grad_scale, N, V, ld, dtype, index_dtype, opts, workspace, workspace_bytes);
}

/* ---- fl_scale_rows_cpu ----------------------------------------------------------------------- */

fl_status fl_scale_rows_cpu(void* x, int64_t N, int64_t V, int64_t ld, fl_dtype dtype, const float* g,
                            int per_row) {
    static const char* fn = "fl_scale_rows_cpu";
    fl__clear_error();
    FL_CHECK(fl__scale_validate(fn, x, N, V, ld, dtype, g));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        const float f = g[per_row ? i : 0];
        if (f == 1.0f) continue; /* untouched, as on the GPU */
        const int64_t off = i * ld;
        for (int64_t j = 0; j < V; j++) {
            /* fp32 product rounded once to the dtype (store_grad rounds a double holding it) */
            const float v = (float)load_logit(x, dtype, off + j) * f;
            store_grad(x, dtype, off + j, (double)v);
        }
    }
    return FL_OK;
}
