/* lovasz.c — CPU reference backend of the Lovasz-softmax loss (include/fusedloss.h section 13;
 * Berman et al., "The Lovasz-Softmax loss"): the executable specification. Single-threaded, every
 * quantity in double (inputs converted exactly).
 *
 * Pixel i = n * d + k (image n, position k); element (n, c, k) at n * ld + c * d + k.
 *   check   : every label in [0, C) or ignore_index before anything is written (the first bad
 *             pixel is FL_ERR_TARGET_OUT_OF_RANGE);
 * Workspace (src/internal.h): 16-byte aligned pairs [P] | G [C] int64 | lse [P] | gp [P][C].
 *   logits  : lse_i = m + log sum_c exp(x_c - m) per valid pixel (workspace), p = exp(x - lse);
 *   sets    : the batch's valid pixels (per_image == 0) or each image's (per_image != 0). Per set,
 *             G_c = #{i: y_i == c}; the classes averaged K = #{c: G_c > 0} (PRESENT) or C (ALL);
 *             a set without valid pixels has loss 0 and is skipped (gradient 0). For each averaged
 *             class: the (e_i, i) pairs of the set are sorted with qsort (e descending, pixel index
 *             ascending: a total order, so the result is deterministic), then in rank order
 *             J_k = 1 - (G - cum fg) / (G + cum (1 - fg)), D_k = J_k - J_{k-1}, loss_c += e D_k
 *             and the gradient w D_k (fg ? -1 : +1), w = g / K [/ N for per_image].
 *   probabilities: the gradient of class c is stored right after class c's pairs are sorted (the
 *             class's inputs are all in the pairs by then, so dinput == input works); ignored
 *             pixels and classes not averaged get +0.
 *   logits  : the gradient w.r.t. p goes to gp (workspace, [P][C] doubles, zeroed first); at the
 *             end, per pixel, s = sum_c p_c gp_c (every x_c read), then dx_c = p_c (gp_c - s)
 *             (read x_c, then write dx_c: in place works).
 * Every output is rounded double -> fp32 (RN) -> dtype (RN). Padding (columns C*d .. ld-1) is
 * neither read nor written; ignored pixels' inputs are not read.
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../internal.h"
#include "dtype.h"

typedef struct {
    double  e;   /* error |fg - p| */
    int64_t i;   /* pixel index n * d + k */
} lv_pair;

static double load_d(const void* base, fl_dtype dt, int64_t idx) { return (double)fl__load_f32(base, dt, idx); }
static void store_grad(void* base, fl_dtype dt, int64_t idx, double v) { fl__store_f32(base, dt, idx, (float)v); }

/* error descending, then pixel index ascending; NaN errors first (a total order for qsort) */
static int lv_cmp(const void* a, const void* b) {
    const lv_pair* x = (const lv_pair*)a;
    const lv_pair* y = (const lv_pair*)b;
    const int nx = x->e != x->e, ny = y->e != y->e;
    if (nx != ny) return nx ? -1 : 1;
    if (!nx) {
        if (x->e > y->e) return -1;
        if (x->e < y->e) return 1;
    }
    return x->i < y->i ? -1 : x->i > y->i ? 1 : 0;
}

static int64_t elem(const fl__lovasz_params* p, int64_t i, int64_t c) {
    return (i / p->d) * p->ld + c * p->d + i % p->d;
}

/* p_{i,c}: the input itself, or exp(x - lse_i) */
static double prob(const fl__lovasz_params* p, const void* x, const double* lse, int64_t i, int64_t c) {
    const double v = load_d(x, p->dtype, elem(p, i, c));
    return p->from_logits ? exp(v - lse[i]) : v;
}

static fl_status lovasz_check_labels(const char* fn, const fl__lovasz_params* p, const void* labels) {
    for (int64_t i = 0; i < p->pixels; i++) {
        const int64_t y = fl__ce_load_target(labels, p->index_dtype, i);
        if (y == p->ignore_index) continue;
        if (y < 0 || y >= p->C)
            return fl__fail(FL_ERR_TARGET_OUT_OF_RANGE,
                            "%s: labels[%lld] = %lld (pixel n = %lld, k = %lld) not in [0, C = %lld) and not "
                            "ignore_index (%lld)", fn, (long long)i, (long long)y, (long long)(i / p->d),
                            (long long)(i % p->d), (long long)p->C, (long long)p->ignore_index);
    }
    return FL_OK;
}

static void lovasz_cpu(const fl__lovasz_params* p, float* loss, void* dinput, const void* x, const void* labels,
                       const float* grad_loss, float grad_scale, void* workspace) {
    const int64_t P = p->pixels, C = p->C, d = p->d, N = p->N;
    const fl_index_dtype it = p->index_dtype;
    const int64_t ign = p->ignore_index;
    char* base = (char*)(((uintptr_t)workspace + 15u) & ~(uintptr_t)15u);
    lv_pair* pairs = (lv_pair*)base;
    int64_t* G = (int64_t*)(base + 16u * (size_t)P);   /* the set's class counts */
    double* lse = p->from_logits ? (double*)(G + C) : NULL;
    double* gp = p->from_logits ? lse + P : NULL;
    const double g = (double)grad_scale * (grad_loss ? (double)grad_loss[0] : 1.0);

    if (p->from_logits) {
        for (int64_t i = 0; i < P; i++) {
            if (fl__ce_load_target(labels, it, i) == ign) { lse[i] = 0.0; continue; }
            double m = -INFINITY, s = 0.0;
            for (int64_t c = 0; c < C; c++) {
                const double v = load_d(x, p->dtype, elem(p, i, c));
                if (v > m) m = v;
            }
            for (int64_t c = 0; c < C; c++) s += exp(load_d(x, p->dtype, elem(p, i, c)) - m);
            lse[i] = m + log(s);
        }
        if (dinput) memset(gp, 0, 8u * (size_t)P * (size_t)C);
    }

    const int64_t nsets = p->per_image ? N : (N > 0 ? 1 : 0);
    const int64_t set_len = p->per_image ? d : P;
    double total = 0.0;
    for (int64_t s = 0; s < nsets; s++) {
        const int64_t i0 = s * set_len, i1 = i0 + set_len;
        int64_t V = 0;
        for (int64_t c = 0; c < C; c++) G[c] = 0;
        for (int64_t i = i0; i < i1; i++) {
            const int64_t y = fl__ce_load_target(labels, it, i);
            if (y == ign) continue;
            G[y]++;
            V++;
        }
        int64_t K = 0;
        for (int64_t c = 0; c < C; c++) K += p->classes == FL_LOVASZ_ALL || G[c] > 0;
        const int active = V > 0;
        const double w = active ? g / (double)K / (p->per_image ? (double)N : 1.0) : 0.0;
        double set_loss = 0.0;
        for (int64_t c = 0; c < C; c++) {
            const int counted = active && (p->classes == FL_LOVASZ_ALL || G[c] > 0);
            if (!counted) {
                if (dinput && !p->from_logits)
                    for (int64_t i = i0; i < i1; i++) store_grad(dinput, p->dtype, elem(p, i, c), 0.0);
                continue;
            }
            int64_t n = 0;
            for (int64_t i = i0; i < i1; i++) {
                const int64_t y = fl__ce_load_target(labels, it, i);
                if (y == ign) continue;
                const double pc = prob(p, x, lse, i, c);
                pairs[n].e = fabs((y == c ? 1.0 : 0.0) - pc);
                pairs[n].i = i;
                n++;
            }
            qsort(pairs, (size_t)n, sizeof(lv_pair), lv_cmp);
            const double Gc = (double)G[c];
            double cfg = 0.0, cbg = 0.0, Jprev = 0.0, lc = 0.0;
            for (int64_t k = 0; k < n; k++) {
                const int64_t i = pairs[k].i;
                const int fg = fl__ce_load_target(labels, it, i) == c;
                if (fg) cfg += 1.0; else cbg += 1.0;
                const double J = 1.0 - (Gc - cfg) / (Gc + cbg);
                const double D = J - Jprev;
                Jprev = J;
                lc += pairs[k].e * D;
                if (dinput) {
                    const double v = w * D * (fg ? -1.0 : 1.0);
                    if (p->from_logits) gp[i * C + c] = v;
                    else store_grad(dinput, p->dtype, elem(p, i, c), v);
                }
            }
            if (dinput && !p->from_logits)
                for (int64_t i = i0; i < i1; i++)
                    if (fl__ce_load_target(labels, it, i) == ign) store_grad(dinput, p->dtype, elem(p, i, c), 0.0);
            set_loss += lc;
        }
        if (active) total += set_loss / (double)K;
    }
    if (p->per_image && N > 0) total /= (double)N;
    if (loss) loss[0] = (float)total;

    if (dinput && p->from_logits) {
        for (int64_t i = 0; i < P; i++) {
            if (fl__ce_load_target(labels, it, i) == ign) {
                for (int64_t c = 0; c < C; c++) store_grad(dinput, p->dtype, elem(p, i, c), 0.0);
                continue;
            }
            const double* gpi = gp + i * C;
            double sp = 0.0;
            for (int64_t c = 0; c < C; c++) sp += prob(p, x, lse, i, c) * gpi[c];
            for (int64_t c = 0; c < C; c++) {
                const double pc = prob(p, x, lse, i, c);   /* read, then write: in place works */
                store_grad(dinput, p->dtype, elem(p, i, c), pc * (gpi[c] - sp));
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                               */

static fl_status lovasz_run(const char* fn, const fl__lovasz_params* p, float* loss, void* dinput, const void* x,
                            const void* labels, const float* grad_loss, float grad_scale, void* ws) {
    FL_CHECK(lovasz_check_labels(fn, p, labels));
    if (p->N == 0) {
        if (loss) loss[0] = 0.0f;
        return FL_OK;
    }
    lovasz_cpu(p, loss, dinput, x, labels, grad_loss, grad_scale, ws);
    return FL_OK;
}

fl_status fl_lovasz_softmax_forward_cpu(float* loss, const void* input, int64_t ld, const void* labels,
                                        fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                        const fl_lovasz_options* opts, void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_lovasz_softmax_forward_cpu";
    fl__clear_error();
    fl__lovasz_params p;
    FL_CHECK(fl__lovasz_validate(fn, FL__PASS_FORWARD, 0, loss, NULL, input, ld, labels, index_dtype, NULL, 1.0f, N, C,
                                 d, dtype, opts, workspace, workspace_bytes, &p));
    return lovasz_run(fn, &p, loss, NULL, input, labels, NULL, 1.0f, workspace);
}

fl_status fl_lovasz_softmax_fused_cpu(float* loss, void* dinput, const void* input, int64_t ld, const void* labels,
                                      fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                      int64_t C, int64_t d, fl_dtype dtype, const fl_lovasz_options* opts,
                                      void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_lovasz_softmax_fused_cpu";
    fl__clear_error();
    fl__lovasz_params p;
    FL_CHECK(fl__lovasz_validate(fn, FL__PASS_FUSED, 0, loss, dinput, input, ld, labels, index_dtype, grad_loss,
                                 grad_scale, N, C, d, dtype, opts, workspace, workspace_bytes, &p));
    return lovasz_run(fn, &p, loss, dinput, input, labels, grad_loss, grad_scale, workspace);
}
