/* softmax_focal.c — CPU reference backend of the softmax (multi-class) focal loss on logits
 * [N, C, d] (include/fusedloss.h section 12): the executable specification.
 *
 * Plain C11 loops, every quantity in double (inputs converted exactly), one position at a time.
 * Position (n, k), k < d, has its C class logits at n*ld + c*d + k (class stride d) and its target
 * at n*d + k; rows [N, C] are d = 1.
 *   check  : every target in [0, C) or ignore_index, before anything is written (the first bad
 *            position is FL_ERR_TARGET_OUT_OF_RANGE); the MEAN denominator D (positions counted);
 *   pass 1 : m = max_c x_c;
 *   pass 2 : S_o = sum_{c != y} exp(x_c - m), s = S_o + exp(x_y - m), lse = m + log s;
 *            log p_y = -log1p(S_o) when x_y == m (y an argmax: p_y may be within an ulp of 1, and
 *            x_y - lse would cancel), else (x_y - m) - log s (p_y <= 1/2: no cancellation);
 *   pass 3 (fused only): the gradient, element by element (read x_c, then write dlogits_c, so
 *            dlogits == logits works: the position's statistics come from passes 1-2; positions are
 *            disjoint sets of elements, so they are independent).
 * ---- Formulas (position with target y, alpha a = alpha_y or 1, q = 1 - p_y) ----
 *   q   = -expm1(log p_y)                       (no cancellation near p_y = 1)
 *   l   = -a q^gamma log p_y                    (gamma == 0: q^gamma = 1, the alpha-weighted CE)
 *   F   = gamma q^(gamma-1) p_y log p_y - q^gamma
 *         q^(gamma-1) p_y log p_y is formed as q^gamma (p_y log p_y / q) (gamma == 1: p_y log p_y):
 *         no overflow of q^(gamma-1) for gamma < 1 and a subnormal q, and p log p / q in [-1, 0)
 *         is well conditioned; the limit 0 where q == 0 (gamma > 0: F = -q^gamma = 0 exactly, a
 *         finite gradient, not autograd's 0 * inf = NaN) or p_y == 0 (p log p -> 0)
 *   dx_c = g a F (delta_cy - p_c): for c == y the factor is q itself (not 1 - p_y rounded),
 *         for c != y -p_c = -exp(x_c - lse)
 *   Every output is rounded double -> fp32 (RN) -> dtype (RN).
 *   g = grad_scale (grad_loss ? grad_loss[NONE ? position : 0] : 1) [/ D for MEAN].
 * Ignored positions (target == ignore_index): loss 0, gradient 0 (+0 at the position's C
 * elements), logits not read. Padding (columns C*d .. ld-1 of a batch row) is neither read nor
 * written.
 * Reductions: per-position losses go to the workspace ([256, 256 + 8P) as double, P = N d) and are
 * summed in position order afterwards, so results do not depend on the thread count (OpenMP over
 * positions). MEAN divides by D (positions not ignored; NaN if none, the gradient then all zeros),
 * not by an alpha sum (kornia's mean).
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

/* the workspace's per-position doubles, via memcpy: a CPU workspace need not be 8-byte aligned */
static void part_set(void* ws, int64_t i, double v) { memcpy((char*)ws + 256 + 8 * (size_t)i, &v, 8); }
static double part_get(const void* ws, int64_t i) {
    double v;
    memcpy(&v, (const char*)ws + 256 + 8 * (size_t)i, 8);
    return v;
}

/* Statistics of one position (passes 1-2). x: the logits; base: element of class 0; y: target. */
typedef struct {
    double lse, logp, q;   /* log-sum-exp, log p_y, 1 - p_y */
} pos_stats;

static pos_stats focal_pos_stats(const fl__focal_params* p, const void* x, int64_t base, int64_t y) {
    const int64_t C = p->C, d = p->d;
    pos_stats r;
    /* pass 1: the maximum (NaN drops out here and poisons the sums below, as it should) */
    double m = -INFINITY;
    for (int64_t c = 0; c < C; c++) {
        const double v = load_d(x, p->dtype, base + c * d);
        if (v > m) m = v;
    }
    /* pass 2: sums of exponentials relative to the maximum (no overflow) */
    const double xy = load_d(x, p->dtype, base + y * d);
    double so = 0.0;
    for (int64_t c = 0; c < C; c++)
        if (c != y) so += exp(load_d(x, p->dtype, base + c * d) - m);
    const double s = so + exp(xy - m);
    r.lse = m + log(s);
    r.logp = xy == m ? -log1p(so) : (xy - m) - log(s);
    r.q = -expm1(r.logp);
    return r;
}

/* the whole call; dlogits NULL: forward only. loss may be NULL (fused). Targets checked. */
static void focal_cpu(const fl__focal_params* p, int64_t D, float* loss, void* dlogits, const void* logits,
                      const void* targets, const float* grad_loss, float grad_scale, void* ws) {
    const int64_t P = p->positions, C = p->C, d = p->d;
    const int none = p->reduction == FL_REDUCTION_NONE;
    const double gamma = (double)p->gamma;
    const double denom = p->reduction == FL_REDUCTION_MEAN ? (double)D : 1.0;

#ifdef _OPENMP
    const int64_t chunk = C >= 4096 ? 1 : 4096 / C;   /* positions per scheduling unit: ~4k elements */
#pragma omp parallel for schedule(dynamic, chunk) if ((double)P * (double)C > 65536.0)
#endif
    for (int64_t i = 0; i < P; i++) {
        const int64_t n = i / d, k = i % d;
        const int64_t base = n * p->ld + k;   /* 64-bit: N*ld may exceed 2^31 */
        const int64_t y = fl__ce_load_target(targets, p->index_dtype, i);
        if (y == p->ignore_index) {
            part_set(ws, i, 0.0);
            if (loss && none) loss[i] = 0.0f;
            if (dlogits)
                for (int64_t c = 0; c < C; c++) store_grad(dlogits, p->dtype, base + c * d, 0.0);
            continue;
        }
        const pos_stats r = focal_pos_stats(p, logits, base, y);
        const double a = p->alpha ? (double)p->alpha[y] : 1.0;
        /* qg = q^gamma; first = gamma q^(gamma-1) p_y log p_y (see the header comment) */
        double qg = 1.0, first = 0.0;
        if (gamma != 0.0) {
            qg = pow(r.q, gamma);                  /* 0 when q == 0 */
            const double py = exp(r.logp);
            if (r.q == 0.0 || py == 0.0) first = 0.0;   /* the limits */
            else if (gamma == 1.0) first = py * r.logp;
            else first = gamma * qg * (py * r.logp / r.q);
        }
        const double li = a * qg * (0.0 - r.logp);   /* 0.0 - x: +0 rather than -0 when log p_y == 0 */
        part_set(ws, i, li);
        if (loss && none) loss[i] = (float)li;
        if (dlogits) {
            const double gl = grad_loss ? (double)grad_loss[none ? i : 0] : 1.0;
            const double g = (double)grad_scale * gl / denom;   /* denom >= 1 here: this position counts */
            const double gaF = g * a * (first - qg);
            for (int64_t c = 0; c < C; c++) {
                const int64_t idx = base + c * d;
                const double v = c == y ? gaF * r.q : -(gaF * exp(load_d(logits, p->dtype, idx) - r.lse));
                store_grad(dlogits, p->dtype, idx, v);   /* in place: x_c was read above */
            }
        }
    }

    if (loss && !none) {
        double sum = 0.0;
        for (int64_t i = 0; i < P; i++) sum += part_get(ws, i);   /* fixed position order */
        if (p->reduction == FL_REDUCTION_MEAN) sum = D > 0 ? sum / (double)D : NAN;
        loss[0] = (float)sum;
    }
}

/* every target in [0, C) or ignore_index (the first bad position is reported; nothing written);
 * *D = the positions not ignored */
static fl_status focal_check_targets(const char* fn, const fl__focal_params* p, const void* targets, int64_t* D) {
    int64_t cnt = 0;
    for (int64_t i = 0; i < p->positions; i++) {
        const int64_t y = fl__ce_load_target(targets, p->index_dtype, i);
        if (y == p->ignore_index) continue;
        if (y < 0 || y >= p->C)
            return fl__fail(FL_ERR_TARGET_OUT_OF_RANGE,
                            "%s: targets[%lld] = %lld (position n = %lld, k = %lld) not in [0, C = %lld) and not "
                            "ignore_index (%lld)", fn, (long long)i, (long long)y, (long long)(i / p->d),
                            (long long)(i % p->d), (long long)p->C, (long long)p->ignore_index);
        cnt++;
    }
    *D = cnt;
    return FL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                               */

fl_status fl_softmax_focal_forward_cpu(float* loss, const void* logits, int64_t ld, const void* targets,
                                       fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                       const fl_focal_options* opts, void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_softmax_focal_forward_cpu";
    fl__clear_error();
    fl__focal_params p;
    FL_CHECK(fl__focal_validate(fn, FL__PASS_FORWARD, 0, loss, NULL, logits, ld, targets, index_dtype, NULL, 1.0f,
                                N, C, d, dtype, opts, workspace, workspace_bytes, &p));
    int64_t D = 0;
    FL_CHECK(focal_check_targets(fn, &p, targets, &D));
    focal_cpu(&p, D, loss, NULL, logits, targets, NULL, 1.0f, workspace);
    return FL_OK;
}

fl_status fl_softmax_focal_fused_cpu(float* loss, void* dlogits, const void* logits, int64_t ld, const void* targets,
                                     fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                     int64_t C, int64_t d, fl_dtype dtype, const fl_focal_options* opts,
                                     void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_softmax_focal_fused_cpu";
    fl__clear_error();
    fl__focal_params p;
    FL_CHECK(fl__focal_validate(fn, FL__PASS_FUSED, 0, loss, dlogits, logits, ld, targets, index_dtype, grad_loss,
                                grad_scale, N, C, d, dtype, opts, workspace, workspace_bytes, &p));
    int64_t D = 0;
    FL_CHECK(focal_check_targets(fn, &p, targets, &D));
    focal_cpu(&p, D, loss, N > 0 ? dlogits : NULL, logits, targets, grad_loss, grad_scale, workspace);
    return FL_OK;
}
