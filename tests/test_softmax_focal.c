/* test_softmax_focal.c — CPU backend of the softmax (multi-class) focal loss on logits [N, C, d]
 * (include/fusedloss.h section 12) against an independent long-double reference written from the
 * definition l = -alpha_y (1 - p_y)^gamma log p_y, with 1 - p_y formed as sum_{c != y} p_c and
 * log p_y as -log1p(sum_{c != y} exp(x_c - x_y)) (no cancellation, and not the library's expm1 /
 * max-shift formulation). Its closed-form gradient is itself checked by central finite differences
 * of the reference loss, and the library's gradient is compared with both. Grid: gamma 0 / 0.5 / 1 /
 * 2 / 3.5, alpha NULL / random per class, rows (d = 1) and spatial maps (d = 7, 64, 1000), N = 0, 1,
 * 3, 8, C = 1, 2, 19, 100, and 8191 / 8193 / 20000 (rows), ld > C*d with NaN / +30000 padding
 * (neither read nor written), int32 / int64 targets with ignored positions (their logits are NaN:
 * never read) and every position ignored, a custom in-range ignore_index, fp32 / fp16 / bf16,
 * grad_loss NULL / scalar / per position (NONE), grad_scale != 1, loss NULL, in place, outputs
 * poisoned before every call, fresh random logits (normal, scale 3) plus positions with a dominant
 * target logit (1 - p_y ~ 1e-4, ~ 1e-16 and exactly 0 in double: finite loss and gradient, the
 * gamma < 1 limit) and with a tiny p_y. gamma = 0 is compared with a plain cross-entropy reference
 * (and with fl_cross_entropy_fused_cpu with class weights = alpha). Edge cases (closed forms, all
 * ignored, N = 0, default options), thread-count independence, the workspace size query, the
 * shared validator, out-of-range targets and every bad argument's status and message (outputs
 * untouched on error).
 *
 * Build / run: make test (this is build/test_softmax_focal). Prints "N passed, M failed".
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fusedloss.h"
#include "test_util.h"
#include "zoo_test_util.h"
#include "../src/internal.h" /* fl__focal_validate: the CUDA-only rules and the resolved parameters */

/* ------------------------------------------------------------------------------------------
 * Tolerances, |lib - ref| <= atol + rtol*|ref| + slack. The reference is long double on the same
 * dtype-rounded inputs, the library double rounded once to fp32 (loss) or to the logits' dtype
 * through fp32 (dlogits).
 *   loss    : rtol RTOL_LOSS (fp32 output: 6e-8; margin for the double sums), atol ATOL_LOSS;
 *   dlogits : 1 ulp of the dtype (rtol 2^-23 / 2^-10 / 2^-7, covering the double -> fp32 -> dtype
 *             rounding) plus one subnormal step of the dtype (atol);
 *   slack   : SLACK_CALC x the element's sensitivity (1 + gamma) |value| (1 + |x_c| + |x_y| + |lse|),
 *             the error of double arithmetic on logits that large (log p_y, then (1 - p_y)^gamma);
 *   finite differences (long double, h = FD_H): FD_RTOL relative + FD_ATOL x |g alpha_y| (1 + |l| +
 *             |x_y| + |lse|);
 *   plain CE reference (gamma = 0): itself computes lse - x_y and p_y - 1 with cancellation, so its
 *             own absolute error CE_SLACK x |g alpha_y| (1 + |x| + |lse|) is added.
 * Indexed by fl_dtype: F32 = 0, F16 = 1, BF16 = 2.
 * ---------------------------------------------------------------------------------------- */
static const double RTOL_LOSS = 1e-6, ATOL_LOSS = 1e-30;
static const double RTOL_DX[3] = {1.1920928955078125e-7, 9.765625e-4, 7.8125e-3};
static const double ATOL_DX[3] = {1.5e-45, 5.97e-8, 9.2e-41};
static const double SLACK_CALC = 1e-12;
static const long double FD_H = 1e-6L;
static const double FD_RTOL = 1e-7, FD_ATOL = 1e-8;
static const double CE_SLACK = 1e-17;

typedef long double LD;

/* ---- reference ---------------------------------------------------------------------------- */

typedef struct {
    LD l;       /* -a q^gamma log p_y */
    LD logp;    /* log p_y */
    LD q;       /* 1 - p_y */
    LD lse;     /* log sum_c exp x_c */
    LD sens;    /* the loss's sensitivity (slack) */
} ref_pos_t;

/* One position from the definition. x[C]: the (dtype-rounded) logits of the position, y the target,
 * a = alpha_y. dl (or NULL): the closed-form d l / d x_c; sens (or NULL): its sensitivities. */
static ref_pos_t ref_pos(const LD* x, int64_t C, int64_t y, LD a, LD gamma, LD* dl, LD* sens) {
    ref_pos_t r;
    LD S = 0;   /* sum_{c != y} p_c / p_y */
    for (int64_t c = 0; c < C; c++)
        if (c != y) S += expl(x[c] - x[y]);
    const LD py = 1 / (1 + S);
    r.q = S / (1 + S);                           /* 1 - p_y = sum_{c != y} p_c */
    r.logp = -log1pl(S);
    r.lse = x[y] + log1pl(S);
    r.l = -a * powl(r.q, gamma) * r.logp;        /* powl(q, 0) = 1, also for q = 0 */
    r.sens = (1 + gamma) * fabsl(r.l) * (1 + fabsl(x[y]) + fabsl(r.lse));
    if (dl) {
        /* d l / d x_c = a (delta_cy - p_c) (gamma q^(gamma-1) p_y log p_y - q^gamma), first term 0 at q = 0 */
        const LD first = r.q > 0 ? gamma * powl(r.q, gamma - 1) * py * r.logp : 0;
        const LD F = first - powl(r.q, gamma);
        for (int64_t c = 0; c < C; c++) {
            const LD pc = c == y ? py : expl(x[c] - x[y]) * py;
            dl[c] = a * F * (c == y ? r.q : -pc);
            if (sens) sens[c] = (1 + gamma) * fabsl(dl[c]) * (1 + fabsl(x[c]) + fabsl(x[y]) + fabsl(r.lse));
        }
    }
    return r;
}

/* Plain alpha-weighted cross-entropy of one position (gamma = 0), the textbook way: max-shifted
 * lse, l = a (lse - x_y), d l / d x_c = a (p_c - delta_cy). Returns l; *lse_out its lse. */
static LD ref_ce(const LD* x, int64_t C, int64_t y, LD a, LD* dl, LD* lse_out) {
    LD m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; c++) if (x[c] > m) m = x[c];
    for (int64_t c = 0; c < C; c++) s += expl(x[c] - m);
    const LD lse = m + logl(s);
    for (int64_t c = 0; c < C; c++) dl[c] = a * (expl(x[c] - lse) - (c == y ? 1 : 0));
    *lse_out = lse;
    return a * (lse - x[y]);
}

/* ---- one configuration ------------------------------------------------------------------- */
typedef struct {
    int64_t N, C, d, pad;   /* ld = C*d + pad */
    fl_dtype dt;
    float gamma;
    int alpha;              /* 0: NULL; 1: random per class in [0.05, 2] */
    fl_reduction red;
    int tgt;                /* 1 int32, 2 int64 targets */
    int64_t ignore_index;
    double ign_frac;        /* fraction of positions ignored */
    int all_ignored;
    int gl;                 /* grad_loss given */
    float gscale;
    int special;            /* dominant / tiny target logits at positions i % 11 < 4 */
} cfg_t;

static const char* red_name(fl_reduction r) {
    return r == FL_REDUCTION_NONE ? "none" : r == FL_REDUCTION_MEAN ? "mean" : r == FL_REDUCTION_SUM ? "sum" : "?";
}

static void run_cfg(const cfg_t* c, uint64_t seed) {
    const int64_t N = c->N, C = c->C, d = c->d, Cd = C * d, ld = Cd + c->pad, P = N * d;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? P : 1;
    const size_t xbytes = (size_t)(N * ld) * es;
    tu_rng r = tu_rng_seed(seed);
    char name[256];
    snprintf(name, sizeof name, "gamma=%g %s N=%lld C=%lld d=%lld ld=%lld %s alpha=%d tgt=i%d ign=%lld%s gl=%d gs=%g",
             c->gamma, red_name(c->red), (long long)N, (long long)C, (long long)d, (long long)ld,
             tu_dtype_name(c->dt), c->alpha, c->tgt == 1 ? 32 : 64, (long long)c->ignore_index,
             c->all_ignored ? "(all ignored)" : "", c->gl, c->gscale);

    /* inputs: everything poisoned (NaN) first, so ignored positions stay NaN (never read); padding
     * columns alternately +30000 (a max taken over them would be wrong: NaN drops out of a max)
     * and NaN (a sum over them would be NaN) */
    void* x = tu_xmalloc(xbytes);
    tu_poison(x, xbytes);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = Cd; j < ld; j += 2) tu_store(x, c->dt, n * ld + j, 30000.0f);
    float* alpha = tu_xmalloc((size_t)C * 4);
    for (int64_t k = 0; k < C; k++) alpha[k] = (float)tu_uniform_in(&r, 0.05, 2.0);
    int32_t* t32 = tu_xmalloc((size_t)P * 4 + 4);
    int64_t* t64 = tu_xmalloc((size_t)P * 8 + 8);
    int* ign = tu_xmalloc((size_t)P * sizeof(int) + sizeof(int));
    int64_t D = 0;
    for (int64_t i = 0; i < P; i++) {
        ign[i] = c->all_ignored || tu_uniform(&r) < c->ign_frac;
        const int64_t y = ign[i] ? c->ignore_index : tu_int_in(&r, 0, C - 1);
        if (y == c->ignore_index) ign[i] = 1;   /* an in-range ignore_index: that class is ignored */
        t32[i] = (int32_t)y;
        t64[i] = y;
        D += !ign[i];
        if (ign[i]) continue;
        const int64_t base = (i / d) * ld + i % d;
        for (int64_t k = 0; k < C; k++) tu_store(x, c->dt, base + k * d, (float)(3.0 * tu_normal(&r)));
        if (c->special && C >= 2) {
            /* 800: 1 - p_y = 0 in double; 40: ~1e-16 (1 - exp(log p) would be noise); 15: ~1e-5;
             * -20: p_y tiny (log p_y large) */
            const float dom[4] = {800.0f, 40.0f, 15.0f, -20.0f};
            if (i % 11 < 4) tu_store(x, c->dt, base + y * d, dom[i % 11]);
        }
    }
    const void* targets = c->tgt == 1 ? (const void*)t32 : (const void*)t64;
    const fl_index_dtype it = c->tgt == 1 ? FL_INDEX_I32 : FL_INDEX_I64;
    float* gl = tu_xmalloc((size_t)(P + 1) * 4);
    for (int64_t i = 0; i < P + 1; i++) gl[i] = (float)tu_uniform_in(&r, -2.0, 2.0);

    fl_focal_options o = FL_FOCAL_OPTIONS_INIT;
    o.gamma = c->gamma;
    o.alpha = c->alpha ? alpha : NULL;
    o.ignore_index = c->ignore_index;
    o.reduction = c->red;
    size_t wsb = 0;
    CHECK_STATUS(fl_softmax_focal_workspace_size(&wsb, N, C, d, c->dt, &o), FL_OK, "workspace size");
    void* ws = tu_xmalloc(wsb);
    tu_poison(ws, wsb);

    /* reference */
    const LD gamma = c->gamma;
    const LD denom = c->red == FL_REDUCTION_MEAN ? (LD)D : 1;
    const size_t ne = (size_t)(P * C) + 1;
    double* lref = tu_xmalloc((size_t)(P + 1) * 8);
    double* lsl = tu_xmalloc((size_t)(P + 1) * 8);
    double* dref = tu_xmalloc(ne * 8);
    double* dsl = tu_xmalloc(ne * 8);
    double* got = tu_xmalloc(ne * 8);
    double* ceref = tu_xmalloc((size_t)(P + 1) * 8);   /* gamma = 0: plain CE loss and gradient */
    double* cesl = tu_xmalloc((size_t)(P + 1) * 8);
    double* cedref = tu_xmalloc(ne * 8);
    double* cedsl = tu_xmalloc(ne * 8);
    LD* xv = tu_xmalloc((size_t)C * sizeof(LD));
    LD* dl = tu_xmalloc((size_t)C * sizeof(LD));
    LD* sens = tu_xmalloc((size_t)C * sizeof(LD));
    /* finite differences kept for the library's own comparison: element index, value, tolerance */
    int64_t* fdi = tu_xmalloc(ne * 8);
    double* fdv = tu_xmalloc(ne * 8);
    double* fdt = tu_xmalloc(ne * 8);
    LD sum = 0, sumsl = 0, cesum = 0, cesumsl = 0;
    double fdmax = 0;
    int64_t fdbad = 0, fdn = 0, fdpos = 0;
    for (int64_t i = 0; i < P; i++) {
        if (ign[i]) {
            lref[i] = lsl[i] = ceref[i] = cesl[i] = 0;
            for (int64_t k = 0; k < C; k++) dref[i * C + k] = dsl[i * C + k] = cedref[i * C + k] = cedsl[i * C + k] = 0;
            continue;
        }
        const int64_t base = (i / d) * ld + i % d, y = t64[i];
        for (int64_t k = 0; k < C; k++) xv[k] = tu_load(x, c->dt, base + k * d);
        const LD a = c->alpha ? (LD)alpha[y] : 1;
        const ref_pos_t rr = ref_pos(xv, C, y, a, gamma, dl, sens);
        const LD g = (LD)c->gscale * (c->gl ? (LD)gl[none ? i : 0] : 1) / denom;
        lref[i] = (double)rr.l;
        lsl[i] = SLACK_CALC * (double)rr.sens;
        sum += rr.l;
        sumsl += rr.sens;
        for (int64_t k = 0; k < C; k++) {
            dref[i * C + k] = (double)(g * dl[k]);
            dsl[i * C + k] = SLACK_CALC * (double)(fabsl(g) * sens[k]);
        }
        if (c->gamma == 0.0f) {   /* the alpha-weighted cross-entropy, computed the plain way */
            LD lse_ce;
            const LD lce = ref_ce(xv, C, y, a, dl, &lse_ce);
            ceref[i] = (double)lce;
            cesl[i] = CE_SLACK * (double)(a * (1 + fabsl(xv[y]) + fabsl(lse_ce)));
            cesum += lce;
            cesumsl += a * (1 + fabsl(xv[y]) + fabsl(lse_ce));
            for (int64_t k = 0; k < C; k++) {
                cedref[i * C + k] = (double)(g * dl[k]);
                cedsl[i * C + k] = CE_SLACK * (double)(fabsl(g * a) * (1 + fabsl(xv[k]) + fabsl(lse_ce)));
            }
        }
        /* the closed-form gradient against central differences of the reference loss: every class
         * of small C, 5 classes (the target, the ends, two at the 8192-column chunk boundary when
         * present) of large ones; the first 3 positions not ignored */
        if (fdpos < 3) {
            fdpos++;
            const int64_t cols[5] = {0, C - 1, y, C > 8192 ? 8191 : C / 2, C > 8192 ? 8192 : C / 3};
            const int64_t ncol = C <= 64 ? C : 5;
            for (int64_t kk = 0; kk < ncol; kk++) {
                const int64_t k = C <= 64 ? kk : cols[kk];
                const LD x0 = xv[k];
                xv[k] = x0 + FD_H;
                const LD lp = ref_pos(xv, C, y, a, gamma, NULL, NULL).l;
                xv[k] = x0 - FD_H;
                const LD lm = ref_pos(xv, C, y, a, gamma, NULL, NULL).l;
                xv[k] = x0;
                const double fd = (double)(g * (lp - lm) / (2 * FD_H));
                const double diff = fabs(fd - dref[i * C + k]);
                const double tol = FD_RTOL * fabs(fd) + FD_ATOL * (double)(fabsl(g * a) * (1 + fabsl(rr.l) +
                                                                  fabsl(xv[y]) + fabsl(rr.lse)));
                fdi[fdn] = i * C + k;
                fdv[fdn] = fd;
                fdt[fdn] = tol;
                fdn++;
                if (diff > fdmax) fdmax = diff;
                if (!(diff <= tol)) {
                    if (fdbad < 3)
                        printf("  %s: fd position %lld class %lld: analytic %.12g fd %.12g (tol %.3g)\n", name,
                               (long long)i, (long long)k, dref[i * C + k], fd, tol);
                    fdbad++;
                }
            }
        }
    }
    CHECK(fdbad == 0, "%s: %lld of %lld finite differences disagree with the closed form (maxdiff %.3g)", name,
          (long long)fdbad, (long long)fdn, fdmax);

    /* reduced references */
    double lred = 0, lredsl = 0, cered = 0, ceredsl = 0;
    if (!none) {
        lred = c->red == FL_REDUCTION_SUM ? (double)sum : D > 0 ? (double)(sum / denom) : NAN;
        lredsl = SLACK_CALC * (double)(sumsl / (D > 0 ? denom : 1)) + 1e-30;
        cered = c->red == FL_REDUCTION_SUM ? (double)cesum : D > 0 ? (double)(cesum / denom) : NAN;
        ceredsl = CE_SLACK * (double)(cesumsl / (D > 0 ? denom : 1)) + 1e-30;
    }

    float* loss = tu_xmalloc((size_t)(nl + 1) * 4);
    float* loss_f = tu_xmalloc((size_t)(nl + 1) * 4);
    void* dx = tu_xmalloc(xbytes + 4);
    void* dx2 = tu_xmalloc(xbytes + 4);
    char nm[400];

    /* forward */
    tu_poison(loss, (size_t)(nl + 1) * 4);
    fl_status st = fl_softmax_focal_forward_cpu(loss, x, ld, targets, it, N, C, d, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s forward", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s forward loss", name);
        if (none) {
            for (int64_t i = 0; i < P; i++) got[i] = loss[i];
            check_close_ex(nm, got, lref, lsl, P, ATOL_LOSS, RTOL_LOSS);
            if (c->gamma == 0.0f) {
                snprintf(nm, sizeof nm, "%s forward loss == plain CE", name);
                check_close_ex(nm, got, ceref, cesl, P, ATOL_LOSS, RTOL_LOSS);
            }
        } else {
            got[0] = loss[0];
            check_close_ex(nm, got, &lred, &lredsl, 1, ATOL_LOSS, RTOL_LOSS);
            if (c->gamma == 0.0f) {
                snprintf(nm, sizeof nm, "%s forward loss == plain CE", name);
                check_close_ex(nm, got, &cered, &ceredsl, 1, ATOL_LOSS, RTOL_LOSS);
            }
        }
        CHECK(tu_is_poison(loss, 4, nl), "%s: loss[%lld] (past the end) written", nm, (long long)nl);
        int64_t badign = 0;
        for (int64_t i = 0; none && i < P; i++) badign += ign[i] && tu_f32_bits(loss[i]) != 0;
        CHECK(badign == 0, "%s: %lld ignored positions with a loss other than +0", nm, (long long)badign);
    }

    /* fused */
    tu_poison(loss_f, (size_t)(nl + 1) * 4);
    tu_poison(dx, xbytes + 4);
    st = fl_softmax_focal_fused_cpu(loss_f, dx, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, d, c->dt, &o,
                                    ws, wsb);
    snprintf(nm, sizeof nm, "%s fused", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s fused loss == forward", name);
        check_bitwise(nm, loss_f, loss, (size_t)nl * 4);
        CHECK(tu_is_poison(loss_f, 4, nl), "%s: loss past the end written", nm);
        for (int64_t i = 0; i < P; i++) {
            const int64_t base = (i / d) * ld + i % d;
            for (int64_t k = 0; k < C; k++) got[i * C + k] = tu_load(dx, c->dt, base + k * d);
        }
        snprintf(nm, sizeof nm, "%s fused dlogits", name);
        check_close_ex(nm, got, dref, dsl, P * C, ATOL_DX[c->dt], RTOL_DX[c->dt]);
        if (c->gamma == 0.0f) {
            snprintf(nm, sizeof nm, "%s fused dlogits == plain CE", name);
            for (int64_t e = 0; e < P * C; e++) cedsl[e] += RTOL_DX[c->dt] * fabs(cedref[e]);
            check_close_ex(nm, got, cedref, cedsl, P * C, ATOL_DX[c->dt], RTOL_DX[c->dt]);
        }
        int64_t badpad = 0, badign = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = Cd; j < ld; j++) badpad += !tu_is_poison(dx, es, n * ld + j);
        for (int64_t i = 0; i < P; i++) {
            const int64_t base = (i / d) * ld + i % d;
            for (int64_t k = 0; ign[i] && k < C; k++) badign += tu_bits(dx, c->dt, base + k * d) != 0;
        }
        badpad += !tu_is_poison((char*)dx + xbytes, 4, 0);
        CHECK(badpad == 0, "%s: %lld padding / past-the-end elements of dlogits written", nm, (long long)badpad);
        CHECK(badign == 0, "%s: %lld elements of ignored positions not +0", nm, (long long)badign);
    }

    /* fused, loss NULL: the same dlogits */
    tu_poison(dx2, xbytes + 4);
    st = fl_softmax_focal_fused_cpu(NULL, dx2, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, d, c->dt, &o,
                                    ws, wsb);
    snprintf(nm, sizeof nm, "%s fused loss=NULL dlogits", name);
    if (CHECK_STATUS(st, FL_OK, nm)) check_bitwise(nm, dx2, dx, xbytes + 4);

    /* in place: dlogits == logits; expected: the first C*d columns of every batch row of dx, the
     * padding of x */
    memcpy(dx2, x, xbytes);
    tu_poison((char*)dx2 + xbytes, 4);
    tu_poison(loss_f, (size_t)(nl + 1) * 4);
    st = fl_softmax_focal_fused_cpu(loss_f, dx2, dx2, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, d, c->dt,
                                    &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s fused in place", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        void* want = tu_xmalloc(xbytes + 4);
        memcpy(want, x, xbytes);
        tu_poison((char*)want + xbytes, 4);
        for (int64_t n = 0; n < N; n++)
            memcpy((char*)want + (size_t)(n * ld) * es, (char*)dx + (size_t)(n * ld) * es, (size_t)Cd * es);
        check_bitwise(nm, dx2, want, xbytes + 4);
        check_bitwise(nm, loss_f, loss, (size_t)nl * 4);
        free(want);
    }

    /* the library's dlogits against the finite differences directly (dtype tolerance + theirs) */
    if (fdn > 0) {
        double* fg = tu_xmalloc((size_t)fdn * 8);
        double* fs = tu_xmalloc((size_t)fdn * 8);
        for (int64_t k = 0; k < fdn; k++) {
            fg[k] = got[fdi[k]];
            fs[k] = fdt[k] + dsl[fdi[k]] + RTOL_DX[c->dt] * fabs(fdv[k]);
        }
        snprintf(nm, sizeof nm, "%s fused dlogits vs finite differences", name);
        check_close_ex(nm, fg, fdv, fs, fdn, ATOL_DX[c->dt], 0.0);
        free(fg); free(fs);
    }

    free(x); free(alpha); free(t32); free(t64); free(ign); free(gl); free(ws); free(lref); free(lsl); free(dref);
    free(dsl); free(got); free(ceref); free(cesl); free(cedref); free(cedsl); free(xv); free(dl); free(sens);
    free(fdi); free(fdv); free(fdt); free(loss); free(loss_f); free(dx); free(dx2);
}

/* ---- closed forms and edge cases -------------------------------------------------------------- */
static int close_rel(double got, double want, double rtol, double atol) {
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static void test_values(void) {
    size_t wsb;
    fl_softmax_focal_workspace_size(&wsb, 64, 64, 64, FL_DTYPE_F32, NULL);
    void* ws = tu_xmalloc(wsb);
    fl_focal_options o = FL_FOCAL_OPTIONS_INIT;
    float L[64], Dx[64];

    /* C = 2, x = (0, 0), y = 0: p = 1/2, l = a 2^-gamma log 2,
     * F = -2^-gamma (gamma log 2 + 1), dx = g a F (1/2, -1/2) */
    {
        const float xv[2] = {0.0f, 0.0f}, al[2] = {0.25f, 0.75f};
        const int32_t y[1] = {0};
        const float gammas[5] = {0.0f, 0.5f, 1.0f, 2.0f, 3.5f};
        for (int k = 0; k < 5; k++) {
            o.gamma = gammas[k];
            o.alpha = al;
            o.reduction = FL_REDUCTION_SUM;
            const float gs = 0.5f;
            CHECK_STATUS(fl_softmax_focal_fused_cpu(L, Dx, xv, 2, y, FL_INDEX_I32, NULL, gs, 1, 2, 1, FL_DTYPE_F32,
                                                    &o, ws, wsb), FL_OK, "closed form");
            const double gm = gammas[k], q = pow(0.5, gm);
            const double want = 0.25 * q * log(2.0), F = -q * (gm * log(2.0) + 1.0);
            CHECK(close_rel(L[0], want, 1e-7, 0), "gamma %g: l = %.9g, want %.9g", gm, L[0], want);
            CHECK(close_rel(Dx[0], gs * 0.25 * F * 0.5, 2e-7, 0) && close_rel(Dx[1], -gs * 0.25 * F * 0.5, 2e-7, 0),
                  "gamma %g: dx = (%.9g, %.9g), want (%.9g, %.9g)", gm, Dx[0], Dx[1], gs * 0.25 * F * 0.5,
                  -gs * 0.25 * F * 0.5);
        }
        o = (fl_focal_options)FL_FOCAL_OPTIONS_INIT;
    }
    /* the limit where 1 - p_y == 0 in double (x_y - x_c = 800): loss 0 and gradient exactly 0 for
     * gamma > 0 (autograd would give 0 * inf = NaN for gamma < 1); gamma = 0: the CE gradient, 0 here.
     * C = 1: p_y = 1 always. x_y - x_c = 40: 1 - p_y ~ 4e-18, loss (1 - p)^1.5 ~ 9e-27 > 0, finite,
     * equal to the reference (1 - exp(log p) would be 0 or 1e-16 noise) */
    {
        const float gammas[4] = {0.5f, 0.0f, 1.0f, 0.01f};
        for (int k = 0; k < 4; k++) {
            o.gamma = gammas[k];
            o.reduction = FL_REDUCTION_NONE;
            const float xv[6] = {800.0f, 0.0f, 5.0f, -3.0f, 799.0f, 0.0f};   /* d = 3: classes strided */
            const int64_t y[3] = {0, 0, 1};   /* positions (0, 0), (0, 1), (0, 2) */
            /* position 0: (800, -3); position 1: (0, 799) target 0 -> p tiny; position 2: (5, 0) target 1 */
            tu_poison(L, sizeof L);
            tu_poison(Dx, sizeof Dx);
            CHECK_STATUS(fl_softmax_focal_fused_cpu(L, Dx, xv, 6, y, FL_INDEX_I64, NULL, 1.0f, 1, 2, 3, FL_DTYPE_F32,
                                                    &o, ws, wsb), FL_OK, "limit");
            int finite = 1;
            for (int j = 0; j < 6; j++) finite &= isfinite(Dx[j]);
            for (int j = 0; j < 3; j++) finite &= isfinite(L[j]);
            CHECK(finite, "gamma %g: a NaN / inf at the limit: loss (%g %g %g)", (double)gammas[k], L[0], L[1], L[2]);
            CHECK(tu_f32_bits(L[0]) == 0 && Dx[0] == 0.0f && Dx[3] == 0.0f,
                  "gamma %g: 1 - p == 0: loss %g (want +0), dx (%g, %g) (want 0)", (double)gammas[k], L[0], Dx[0],
                  Dx[3]);
            for (int j = 1; j < 3; j++) {
                LD xx[2] = {xv[j], xv[j + 3]}, dd[2];
                const ref_pos_t rr = ref_pos(xx, 2, y[j], 1, gammas[k], dd, NULL);
                CHECK(close_rel(L[j], (double)rr.l, 1e-6, 0) && close_rel(Dx[j], (double)dd[0], 2e-7, 1e-45) &&
                      close_rel(Dx[j + 3], (double)dd[1], 2e-7, 1e-45),
                      "gamma %g position %d: loss %.9g dx (%.9g %.9g), want %.9g (%.9g %.9g)", (double)gammas[k], j,
                      L[j], Dx[j], Dx[j + 3], (double)rr.l, (double)dd[0], (double)dd[1]);
            }
            /* C = 1 */
            const float x1[2] = {3.0f, -7.0f};
            const int32_t y1[2] = {0, 0};
            tu_poison(L, sizeof L);
            tu_poison(Dx, sizeof Dx);
            CHECK_STATUS(fl_softmax_focal_fused_cpu(L, Dx, x1, 1, y1, FL_INDEX_I32, NULL, 1.0f, 2, 1, 1, FL_DTYPE_F32,
                                                    &o, ws, wsb), FL_OK, "C = 1");
            CHECK(L[0] == 0.0f && L[1] == 0.0f && Dx[0] == 0.0f && Dx[1] == 0.0f,
                  "gamma %g, C = 1: loss (%g %g) dx (%g %g), want zeros", (double)gammas[k], L[0], L[1], Dx[0], Dx[1]);
        }
        /* 1 - p_y ~ 4.2e-18: (1 - p)^gamma (-log p) = q^(gamma + 1) */
        const float x2[2] = {40.0f, 0.0f};
        const int32_t y2[1] = {0};
        o.gamma = 0.5f;
        CHECK_STATUS(fl_softmax_focal_fused_cpu(L, Dx, x2, 2, y2, FL_INDEX_I32, NULL, 1.0f, 1, 2, 1, FL_DTYPE_F32, &o,
                                                ws, wsb), FL_OK, "tiny 1 - p");
        LD xx[2] = {40, 0}, dd[2];
        const ref_pos_t rr = ref_pos(xx, 2, 0, 1, 0.5L, dd, NULL);
        CHECK(L[0] > 0 && close_rel(L[0], (double)rr.l, 1e-6, 0) && close_rel(Dx[0], (double)dd[0], 2e-7, 0) &&
              close_rel(Dx[1], (double)dd[1], 2e-7, 0), "tiny 1 - p: loss %.9g dx (%.9g %.9g), want %.9g (%.9g %.9g)",
              L[0], Dx[0], Dx[1], (double)rr.l, (double)dd[0], (double)dd[1]);
        o = (fl_focal_options)FL_FOCAL_OPTIONS_INIT;
    }
    /* gamma = 0 is the alpha-weighted cross-entropy: fl_cross_entropy_fused_cpu with weight = alpha
     * (NONE and SUM; MEAN differs by design: focal divides by the count, CE by the weight sum), on
     * rows (d = 1, ld > C) and on an N x C x d map transposed to rows */
    {
        enum { NN = 3, CC = 37, DD = 7, LDR = 40 };
        float* xr = tu_xmalloc(sizeof(float) * NN * LDR);
        float* xm = tu_xmalloc(sizeof(float) * NN * CC * DD);
        float* xt = tu_xmalloc(sizeof(float) * NN * DD * CC);   /* the map as rows [N*d, C] */
        float al[CC], lf[NN * DD], lc[NN * DD], df[NN * CC * DD], dc[NN * CC * DD];
        int64_t tr[NN * DD];
        tu_rng r = tu_rng_seed(77);
        for (int k = 0; k < NN * LDR; k++) xr[k] = (float)(3 * tu_normal(&r));
        for (int k = 0; k < NN * CC * DD; k++) xm[k] = (float)(3 * tu_normal(&r));
        for (int n = 0; n < NN; n++)
            for (int c = 0; c < CC; c++)
                for (int k = 0; k < DD; k++) xt[(n * DD + k) * CC + c] = xm[n * CC * DD + c * DD + k];
        for (int c = 0; c < CC; c++) al[c] = (float)tu_uniform_in(&r, 0.1, 2.0);
        for (int k = 0; k < NN * DD; k++) tr[k] = k % 5 == 3 ? -100 : tu_int_in(&r, 0, CC - 1);
        size_t cwb;
        fl_cross_entropy_workspace_size(&cwb, NN * DD, CC, FL_DTYPE_F32, NULL);
        void* cws = tu_xmalloc(cwb);
        fl_ce_options co = FL_CE_OPTIONS_INIT;
        co.weight = al;
        o.gamma = 0.0f;
        o.alpha = al;
        const float gs = 1.7f;
        const fl_reduction reds[2] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM};
        for (int ri = 0; ri < 2; ri++)
            for (int map = 0; map < 2; map++) {
                co.reduction = o.reduction = reds[ri];
                const int64_t rows = map ? NN * DD : NN, nl = ri == 0 ? rows : 1;
                CHECK_STATUS(map ? fl_softmax_focal_fused_cpu(lf, df, xm, CC * DD, tr, FL_INDEX_I64, NULL, gs, NN, CC,
                                                              DD, FL_DTYPE_F32, &o, ws, wsb)
                                 : fl_softmax_focal_fused_cpu(lf, df, xr, LDR, tr, FL_INDEX_I64, NULL, gs, NN, CC, 1,
                                                              FL_DTYPE_F32, &o, ws, wsb), FL_OK, "focal gamma 0");
                CHECK_STATUS(fl_cross_entropy_fused_cpu(lc, NULL, dc, map ? xt : xr, tr, NULL, gs, rows, CC,
                                                        map ? CC : LDR, FL_DTYPE_F32, FL_INDEX_I64, &co, cws, cwb),
                             FL_OK, "CE with weights");
                int ok = 1;
                for (int64_t k = 0; k < nl; k++) ok &= close_rel(lf[k], lc[k], 1e-6, 1e-7);
                CHECK(ok, "gamma 0 %s %s: focal loss %.9g != CE %.9g", red_name(reds[ri]), map ? "map" : "rows", lf[0],
                      lc[0]);
                ok = 1;
                for (int64_t i = 0; i < rows; i++)
                    for (int c = 0; c < CC; c++) {
                        const float a = map ? df[(i / DD) * CC * DD + c * DD + i % DD] : df[i * LDR + c];
                        const float b = map ? dc[i * CC + c] : dc[i * LDR + c];
                        ok &= close_rel(a, b, 2.4e-7, 1e-12);
                    }
                CHECK(ok, "gamma 0 %s %s: focal dlogits != CE dlogits", red_name(reds[ri]), map ? "map" : "rows");
            }
        /* MEAN is SUM / (positions not ignored), not / sum alpha_y */
        float ls, lm;
        o.reduction = FL_REDUCTION_SUM;
        fl_softmax_focal_forward_cpu(&ls, xm, CC * DD, tr, FL_INDEX_I64, NN, CC, DD, FL_DTYPE_F32, &o, ws, wsb);
        o.reduction = FL_REDUCTION_MEAN;
        fl_softmax_focal_forward_cpu(&lm, xm, CC * DD, tr, FL_INDEX_I64, NN, CC, DD, FL_DTYPE_F32, &o, ws, wsb);
        int cnt = 0;
        for (int k = 0; k < NN * DD; k++) cnt += tr[k] != -100;
        CHECK(close_rel(lm, (double)ls / cnt, 1e-6, 0), "MEAN %.9g != SUM / count %.9g", lm, (double)ls / cnt);
        free(xr); free(xm); free(xt); free(cws);
        o = (fl_focal_options)FL_FOCAL_OPTIONS_INIT;
    }
    /* every position ignored: MEAN NaN with zero gradient, SUM 0, NONE zeros; logits not read */
    {
        float xv[24];
        for (int k = 0; k < 24; k++) xv[k] = NAN;
        const int64_t y[4] = {-100, -100, -100, -100};
        const fl_reduction reds[3] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            tu_poison(L, sizeof L);
            tu_poison(Dx, sizeof Dx);
            CHECK_STATUS(fl_softmax_focal_fused_cpu(L, Dx, xv, 6, y, FL_INDEX_I64, NULL, 1.0f, 2, 3, 2, FL_DTYPE_F32,
                                                    &o, ws, wsb), FL_OK, "all ignored");
            int zero = 1;
            for (int j = 0; j < 12; j++) zero &= tu_bits(Dx, FL_DTYPE_F32, j) == 0;
            if (k == 0) CHECK(isnan(L[0]), "all ignored MEAN = %g, want NaN", L[0]);
            else if (k == 1) CHECK(tu_f32_bits(L[0]) == 0, "all ignored SUM = %g, want +0", L[0]);
            else CHECK(L[0] == 0 && L[1] == 0 && L[2] == 0 && L[3] == 0, "all ignored NONE = %g %g %g %g", L[0], L[1],
                       L[2], L[3]);
            CHECK(tu_is_poison(L, 4, k < 2 ? 1 : 4), "all ignored %s: loss past the end written", red_name(reds[k]));
            CHECK(zero, "all ignored %s: dlogits not all +0", red_name(reds[k]));
            CHECK(tu_is_poison(Dx, 4, 12), "all ignored %s: dlogits past the end written", red_name(reds[k]));
            CHECK_STATUS(fl_softmax_focal_forward_cpu(L, xv, 6, y, FL_INDEX_I64, 2, 3, 2, FL_DTYPE_F32, &o, ws, wsb),
                         FL_OK, "all ignored forward");
            CHECK(k == 0 ? isnan(L[0]) : L[0] == 0.0f, "all ignored forward %s = %g", red_name(reds[k]), L[0]);
        }
        o = (fl_focal_options)FL_FOCAL_OPTIONS_INIT;
    }
    /* N = 0: SUM 0, MEAN NaN, NONE writes nothing; NULL arrays fine */
    {
        const fl_reduction reds[3] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_NONE};
        size_t w0;
        CHECK_STATUS(fl_softmax_focal_workspace_size(&w0, 0, 5, 3, FL_DTYPE_BF16, NULL), FL_OK, "N=0 size");
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            L[0] = 5.0f;
            CHECK_STATUS(fl_softmax_focal_forward_cpu(L, NULL, 15, NULL, FL_INDEX_I32, 0, 5, 3, FL_DTYPE_BF16, &o, ws,
                                                      w0), FL_OK, "N=0 forward");
            if (k == 0) CHECK(L[0] == 0.0f, "N = 0 SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 NONE wrote the loss");
            L[0] = 5.0f;
            CHECK_STATUS(fl_softmax_focal_fused_cpu(L, NULL, NULL, 15, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5, 3,
                                                    FL_DTYPE_F16, &o, ws, w0), FL_OK, "N=0 fused");
            if (k == 0) CHECK(L[0] == 0.0f, "N = 0 fused SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 fused MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 fused NONE wrote the loss");
        }
        o = (fl_focal_options)FL_FOCAL_OPTIONS_INIT;
    }
    /* the default options (opts NULL) are gamma 2, alpha NULL, MEAN, ignore_index -100 */
    {
        float xv[12] = {1, 2, 3, 0, -1, 4, 2, 2, 0.5f, -3, 1, 1}, l1, l2, d1[12], d2[12];
        const int32_t y[4] = {-100, 2, 0, 1};
        CHECK_STATUS(fl_softmax_focal_fused_cpu(&l1, d1, xv, 6, y, FL_INDEX_I32, NULL, 1.0f, 2, 3, 2, FL_DTYPE_F32,
                                                NULL, ws, wsb), FL_OK, "opts NULL");
        o.gamma = 2.0f;
        o.alpha = NULL;
        o.ignore_index = -100;
        o.reduction = FL_REDUCTION_MEAN;
        CHECK_STATUS(fl_softmax_focal_fused_cpu(&l2, d2, xv, 6, y, FL_INDEX_I32, NULL, 1.0f, 2, 3, 2, FL_DTYPE_F32,
                                                &o, ws, wsb), FL_OK, "explicit defaults");
        CHECK(l1 == l2 && l1 > 0 && memcmp(d1, d2, sizeof d1) == 0, "opts NULL: %.9g, explicit defaults %.9g", l1, l2);
        o = (fl_focal_options)FL_FOCAL_OPTIONS_INIT;
    }
    free(ws);
}

/* ---- the results do not depend on the thread count ---------------------------------------------- */
static void test_threads(void) {
#ifdef _OPENMP
    const int64_t shapes[2][3] = {{4, 300, 64}, {6, 20000, 1}};   /* N, C, d */
    for (int s = 0; s < 2; s++) {
        const int64_t N = shapes[s][0], C = shapes[s][1], d = shapes[s][2], n = N * C * d;
        float* x = tu_xmalloc((size_t)n * 4);
        float* d1 = tu_xmalloc((size_t)n * 4);
        float* d2 = tu_xmalloc((size_t)n * 4);
        float* al = tu_xmalloc((size_t)C * 4);
        int32_t* y = tu_xmalloc((size_t)(N * d) * 4);
        tu_rng r = tu_rng_seed(3 + s);
        for (int64_t k = 0; k < n; k++) x[k] = (float)(3 * tu_normal(&r));
        for (int64_t k = 0; k < C; k++) al[k] = (float)tu_uniform_in(&r, 0.1, 1.0);
        for (int64_t k = 0; k < N * d; k++) y[k] = k % 9 == 4 ? -100 : (int32_t)tu_int_in(&r, 0, C - 1);
        fl_focal_options o = FL_FOCAL_OPTIONS_INIT;
        o.gamma = 1.5f;
        o.alpha = al;
        const fl_reduction reds[2] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
        for (int ri = 0; ri < 2; ri++) {
            o.reduction = reds[ri];
            size_t wsb;
            fl_softmax_focal_workspace_size(&wsb, N, C, d, FL_DTYPE_F32, &o);
            void* ws = tu_xmalloc(wsb);
            float a, b;
            const int nt = omp_get_max_threads();
            omp_set_num_threads(1);
            CHECK_STATUS(fl_softmax_focal_fused_cpu(&a, d1, x, C * d, y, FL_INDEX_I32, NULL, 1.0f, N, C, d,
                                                    FL_DTYPE_F32, &o, ws, wsb), FL_OK, "1 thread");
            omp_set_num_threads(nt > 1 ? nt : 4);
            CHECK_STATUS(fl_softmax_focal_fused_cpu(&b, d2, x, C * d, y, FL_INDEX_I32, NULL, 1.0f, N, C, d,
                                                    FL_DTYPE_F32, &o, ws, wsb), FL_OK, "n threads");
            omp_set_num_threads(nt);
            char nm[128];
            snprintf(nm, sizeof nm, "C=%lld d=%lld %s loss, 1 thread == many", (long long)C, (long long)d,
                     red_name(reds[ri]));
            check_bitwise(nm, &a, &b, 4);
            snprintf(nm, sizeof nm, "C=%lld d=%lld %s dlogits, 1 thread == many", (long long)C, (long long)d,
                     red_name(reds[ri]));
            check_bitwise(nm, d1, d2, (size_t)n * 4);
            free(ws);
        }
        free(x); free(d1); free(d2); free(al); free(y);
    }
#endif
}

/* ---- workspace size query ----------------------------------------------------------------------- */
static size_t al256(size_t x) { return (x + 255) / 256 * 256; }

static void test_workspace_size(void) {
    const int64_t Ns[4] = {0, 1, 7, 1000};
    const int64_t Cs[5] = {1, 8191, 8192, 8193, 20000};
    const int64_t ds[3] = {1, 7, 4096};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 5; b++)
            for (int e = 0; e < 3; e++) {
                size_t got = 0;
                const size_t P = (size_t)(Ns[a] * ds[e]), ch = ds[e] == 1 ? (size_t)((Cs[b] + 8191) / 8192) : 1;
                const size_t want = 256 + al256(4 * P) + al256(8 * P) + al256(32 * P * ch);
                CHECK_STATUS(fl_softmax_focal_workspace_size(&got, Ns[a], Cs[b], ds[e], FL_DTYPE_BF16, NULL), FL_OK,
                             "size");
                CHECK(got == want && got == fl__focal_workspace_bytes(Ns[a], Cs[b], ds[e]),
                      "fl_softmax_focal_workspace_size(N=%lld, C=%lld, d=%lld) = %zu, want %zu", (long long)Ns[a],
                      (long long)Cs[b], (long long)ds[e], got, want);
                size_t g2 = 0;
                fl_focal_options o = FL_FOCAL_OPTIONS_INIT;
                o.gamma = 0.5f;
                o.reduction = FL_REDUCTION_NONE;
                fl_softmax_focal_workspace_size(&g2, Ns[a], Cs[b], ds[e], FL_DTYPE_F32, &o);
                CHECK(g2 == got, "workspace size depends on dtype / options: %zu vs %zu", g2, got);
            }
    /* overflow saturates internally (no workspace can be that large) */
    CHECK(fl__focal_workspace_bytes(INT64_MAX, 1, 2) == SIZE_MAX, "N*d overflow: not SIZE_MAX");
    CHECK(fl__focal_workspace_bytes((int64_t)1 << 60, 1, 1) == SIZE_MAX, "44 P overflow: not SIZE_MAX");
    CHECK(fl__focal_workspace_bytes((int64_t)1 << 58, 1, 1) != SIZE_MAX, "44 P < 2^64 saturated");
    CHECK(fl__focal_workspace_bytes((int64_t)1 << 54, 1 << 20, 1) == SIZE_MAX, "P chunks overflow: not SIZE_MAX");
    CHECK(fl__focal_workspace_bytes((int64_t)1 << 54, 1 << 20, 2) != SIZE_MAX, "d > 1: one chunk, yet saturated");
}

/* ---- the shared validator: CUDA-only rules and the resolved parameters ------------------------- */
static void test_validator(void) {
    const char* fn = "fl_softmax_focal_fused_cuda";
    unsigned char* x = aligned_alloc(256, 1 << 17);   /* up to 2 x 20003 bf16 */
    unsigned char* dx = aligned_alloc(256, 8192);
    int64_t* y = aligned_alloc(256, 4096);
    memset(x, 0, 1 << 17);
    memset(y, 0, 4096);
    float loss[64], al[64];
    int32_t flag;
    size_t wsb;
    fl_softmax_focal_workspace_size(&wsb, 4, 20000, 16, FL_DTYPE_F16, NULL);
    unsigned char* ws = aligned_alloc(256, (wsb + 256 + 255) / 256 * 256);
    fl_focal_options o = FL_FOCAL_OPTIONS_INIT;
    fl__focal_params p;
    fl_status st = fl__focal_validate(fn, FL__PASS_FUSED, 1, loss, dx, x, 20, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, 4,
                                      FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "aligned") && strstr(fl_last_error(), fn),
          "cuda: misaligned workspace: %d %s", (int)st, fl_last_error());
    st = fl__focal_validate(fn, FL__PASS_FUSED, 0, loss, dx, x, 20, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, 4,
                            FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_OK, "cpu: misaligned workspace accepted: %d %s", (int)st, fl_last_error());
    /* the validator never reads the targets (device memory for CUDA): out of range passes it */
    y[0] = 99;
    st = fl__focal_validate(fn, FL__PASS_FUSED, 1, loss, dx, x, 20, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, 4,
                            FL_DTYPE_F16, &o, ws, wsb, &p);
    CHECK(st == FL_OK, "validator read the targets: %d %s", (int)st, fl_last_error());
    y[0] = 0;
    /* resolved parameters */
    const int64_t Cs[4] = {1, 8192, 8193, 20000}, dd[4] = {1, 1, 3, 1};
    const float gammas[4] = {0.0f, 2.0f, 0.5f, 3.5f};
    const fl_reduction reds[4] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    for (int k = 0; k < 4; k++) {
        o.gamma = gammas[k];
        o.alpha = k & 1 ? al : NULL;
        o.reduction = reds[k];
        o.ignore_index = 42 + k;
        o.error_flag = k & 2 ? &flag : NULL;
        const int64_t N = 2 - (k & 1), C = k == 2 ? 5 : Cs[k], d = dd[k], ld = C * d + k;
        st = fl__focal_validate(fn, FL__PASS_FORWARD, 1, loss, NULL, x, ld, y, FL_INDEX_I32, NULL, 1.0f, N, C, d,
                                FL_DTYPE_BF16, &o, ws, wsb, &p);
        CHECK(st == FL_OK, "validator params %d: %s", k, fl_last_error());
        const int64_t ch = d == 1 ? (C + 8191) / 8192 : 1;
        CHECK(p.N == N && p.C == C && p.d == d && p.ld == ld && p.dtype == FL_DTYPE_BF16 &&
              p.index_dtype == FL_INDEX_I32 && p.gamma == o.gamma && p.alpha == o.alpha && p.ignore_index == 42 + k &&
              p.reduction == o.reduction && p.error_flag == o.error_flag && p.positions == N * d && p.chunks == ch,
              "resolved parameters %d: positions %lld chunks %lld (want %lld)", k, (long long)p.positions,
              (long long)p.chunks, (long long)ch);
    }
    free(x); free(dx); free(y); free(ws);
}

/* ---- bad arguments ------------------------------------------------------------------------------ */
/* status, a message naming the function, and no output written */
#define EXPECT(call_, want, what) ZT_EXPECT(call_, want, what, fnname, L, D)

static void test_errors(void) {
    /* N = 2 samples, C = 4 classes, d = 8 positions, ld = 32: P = 16 */
    float X[64], L[16], D[64], G[16], A[4] = {0.25f, 1.0f, 0.5f, 2.0f};
    int64_t tg[16];
    int32_t t32[16];
    for (int k = 0; k < 64; k++) X[k] = (float)(k % 7) - 3.0f;
    for (int k = 0; k < 16; k++) { G[k] = 1.0f; tg[k] = k % 4; t32[k] = k % 4; }
    tg[2] = -100;
    size_t wsb;
    fl_softmax_focal_workspace_size(&wsb, 2, 4, 8, FL_DTYPE_F32, NULL);
    char* ws = tu_xmalloc(wsb + 512);
    fl_focal_options o = FL_FOCAL_OPTIONS_INIT, ob;
    o.alpha = A;
    const fl_dtype F = FL_DTYPE_F32;
    const fl_index_dtype I = FL_INDEX_I64;
    const char* fnname = "fl_softmax_focal_forward_cpu";

#define FWD(loss_, x_, ld_, t_, it_, N_, C_, d_, dt_, o_, ws_, wsb_) \
    fl_softmax_focal_forward_cpu(loss_, x_, ld_, t_, it_, N_, C_, d_, dt_, o_, ws_, wsb_)
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_OK, "valid forward");
    EXPECT(FWD(L, X, 32, tg, I, -1, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N < 0");
    EXPECT(FWD(L, X, 32, tg, I, 2, 0, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C < 1");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 0, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "d < 1");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, -8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "d < 0");
    EXPECT(FWD(L, X, 31, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld < C*d");
    CHECK(strstr(fl_last_error(), "ld (31)") != NULL, "ld message: %s", fl_last_error());
    EXPECT(FWD(L, X, INT64_MAX, tg, I, 2, INT64_MAX / 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C*d overflows");
    CHECK(strstr(fl_last_error(), "C*d") != NULL, "C*d message: %s", fl_last_error());
    EXPECT(FWD(L, X, INT64_MAX / 4, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N*ld overflow");
    EXPECT(FWD(NULL, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL");
    EXPECT(FWD(NULL, NULL, 32, NULL, I, 0, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL, N=0");
    EXPECT(FWD(L, NULL, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "logits NULL");
    EXPECT(FWD(L, X, 32, NULL, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "targets NULL");
    EXPECT(FWD(L, NULL, 32, NULL, I, 0, 4, 8, F, &o, ws, wsb), FL_OK, "N = 0, NULL arrays");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, (fl_dtype)7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dtype 7");
    EXPECT(FWD(L, X, 32, tg, (fl_index_dtype)5, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "index_dtype 5");
    EXPECT(FWD(L, X, 32, t32, FL_INDEX_I32, 2, 4, 8, F, &o, ws, wsb), FL_OK, "int32 targets");
    EXPECT(FWD(L, X, 64, tg, I, 1, 4, 8, FL_DTYPE_BF16, &o, ws, wsb), FL_OK, "bf16 logits");
    EXPECT(FWD(L, (char*)X + 2, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "logits misaligned");
    EXPECT(FWD(L, (char*)X + 2, 32, tg, I, 2, 4, 8, FL_DTYPE_F16, &o, ws, wsb), FL_OK, "fp16: 2-byte aligned fine");
    EXPECT(FWD(L, X, 32, (char*)tg + 4, I, 1, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "targets misaligned");
    EXPECT(FWD((float*)((char*)L + 1), X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss misaligned");
    ob = o;
    ob.alpha = (const float*)((const char*)A + 2);
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "alpha misaligned");
    CHECK(strstr(fl_last_error(), "alpha") != NULL, "alpha message: %s", fl_last_error());
    const float gammas[4] = {-1.0f, -1e-30f, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        ob = o;
        ob.gamma = gammas[k];
        EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad gamma");
        CHECK(strstr(fl_last_error(), "gamma") != NULL, "gamma %g message: %s", (double)gammas[k], fl_last_error());
    }
    ob = o;
    ob.reduction = FL_REDUCTION_BATCHMEAN;
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction BATCHMEAN");
    CHECK(strstr(fl_last_error(), "reduction") != NULL, "reduction message: %s", fl_last_error());
    ob.reduction = (fl_reduction)7;
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction 7");
    ob.reduction = (fl_reduction)-1;
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction -1");
    ob = o;
    ob.struct_size = sizeof(fl_focal_options) - 8;
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size");
    CHECK(strstr(fl_last_error(), "struct_size") != NULL, "struct_size message: %s", fl_last_error());
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace");
    CHECK(strstr(fl_last_error(), "fl_softmax_focal_workspace_size") != NULL, "workspace hint: %s", fl_last_error());
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, ws, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "zero workspace");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, ws + 1, wsb), FL_OK, "CPU: unaligned workspace fine");
    /* aliasing */
    EXPECT(FWD(X + 3, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps logits");
    ob = o;
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FWD(X + 60, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss [P] overlaps logits end");
    ob.reduction = FL_REDUCTION_SUM;   /* [N, C, d] = [2, 4, 4], ld = 20: row 0's padding is X[16..20) */
    EXPECT(FWD(X + 17, X, 20, tg, I, 2, 4, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss between batch rows");
    EXPECT(FWD(X + 17, X, 20, tg, I, 1, 4, 4, F, &ob, ws, wsb), FL_OK, "loss in the last row's padding");
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FWD(X + 32, X, 32, tg, I, 1, 4, 8, F, &ob, ws, wsb), FL_OK, "loss right after the logits");
    EXPECT(FWD((float*)(tg + 6), X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps targets");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "loss / targets message: %s", fl_last_error());
    EXPECT(FWD(A + 3, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps alpha");
    EXPECT(FWD((float*)(ws + 300), X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps workspace");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, (void*)X, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps logits");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, (void*)tg, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps targets");
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &o, (void*)A, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps alpha");
    ob = o;
    ob.alpha = X;
    EXPECT(FWD(L, X, 32, tg, I, 2, 4, 8, F, &ob, ws, wsb), FL_OK, "alpha may alias the logits (inputs)");
    /* out-of-range targets: the first bad position is named, nothing written */
    {
        int64_t tb[16];
        int32_t tb32[16];
        memcpy(tb, tg, sizeof tb);
        memcpy(tb32, t32, sizeof tb32);
        tb[2] = 0; tb[11] = 4; tb[5] = -1; tb32[9] = 1000; tb32[13] = -100 + 1;
        EXPECT(FWD(L, X, 32, tb, I, 2, 4, 8, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target -1");
        CHECK(strstr(fl_last_error(), "targets[5] = -1") && strstr(fl_last_error(), "k = 5"),
              "first bad position: %s", fl_last_error());
        ob = o;
        ob.ignore_index = -1;   /* -1 is now ignored: position 11 (target C) is the first bad one */
        EXPECT(FWD(L, X, 32, tb, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target C");
        CHECK(strstr(fl_last_error(), "targets[11] = 4") && strstr(fl_last_error(), "n = 1, k = 3"),
              "bad position 11: %s", fl_last_error());
        EXPECT(FWD(L, X, 32, tb32, FL_INDEX_I32, 2, 4, 8, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "int32 target");
        CHECK(strstr(fl_last_error(), "targets[9] = 1000") != NULL, "int32: %s", fl_last_error());
        tb[5] = (int64_t)1 << 40;   /* beyond int32 */
        EXPECT(FWD(L, X, 32, tb, I, 2, 4, 8, F, &ob, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target 2^40");
        CHECK(strstr(fl_last_error(), "targets[5] = 1099511627776") != NULL, "2^40: %s", fl_last_error());
        ob.ignore_index = (int64_t)1 << 40;
        tb[11] = 0;
        EXPECT(FWD(L, X, 32, tb, I, 2, 4, 8, F, &ob, ws, wsb), FL_OK, "ignore_index 2^40 (int64 targets)");
        fnname = "fl_softmax_focal_fused_cpu";
        tb[11] = 4;
        EXPECT(fl_softmax_focal_fused_cpu(L, D, X, 32, tb, I, G, 1.0f, 2, 4, 8, F, &o, ws, wsb),
               FL_ERR_TARGET_OUT_OF_RANGE, "fused target out of range");
        EXPECT(fl_softmax_focal_fused_cpu(NULL, D, X, 32, tb, I, NULL, 1.0f, 2, 4, 8, F, &o, ws, wsb),
               FL_ERR_TARGET_OUT_OF_RANGE, "fused loss NULL target out of range");
        fnname = "fl_softmax_focal_forward_cpu";
    }
#undef FWD

    fnname = "fl_softmax_focal_fused_cpu";
#define FUS(loss_, dx_, x_, ld_, t_, gl_, gs_, N_, C_, d_, o_, ws_, wsb_) \
    fl_softmax_focal_fused_cpu(loss_, dx_, x_, ld_, t_, I, gl_, gs_, N_, C_, d_, F, o_, ws_, wsb_)
    EXPECT(FUS(L, D, X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_OK, "valid fused");
    EXPECT(FUS(NULL, D, X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_OK, "fused loss NULL");
    EXPECT(FUS(L, NULL, X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits NULL");
    EXPECT(FUS(L, NULL, NULL, 32, NULL, NULL, 1.0f, 0, 4, 8, &o, ws, wsb), FL_OK, "fused N = 0, NULL arrays");
    EXPECT(FUS(L, D, NULL, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused logits NULL");
    EXPECT(FUS(L, D, X, 32, NULL, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused targets NULL");
    EXPECT(FUS(L, D, X, 32, tg, G, NAN, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale NaN");
    CHECK(strstr(fl_last_error(), "grad_scale") != NULL, "grad_scale message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, 32, tg, G, -INFINITY, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale -inf");
    EXPECT(FUS(L, D, X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, 100), FL_ERR_INSUFFICIENT_WORKSPACE, "fused small ws");
    EXPECT(FUS(L, D, X, 32, tg, G, 1.0f, -3, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused N < 0");
    EXPECT(FUS(L, D, X, 31, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused ld < C*d");
    ob = o;
    ob.gamma = NAN;
    EXPECT(FUS(L, D, X, 32, tg, G, 1.0f, 2, 4, 8, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused gamma NaN");
    ob = o;
    ob.reduction = FL_REDUCTION_BATCHMEAN;
    EXPECT(FUS(L, D, X, 32, tg, G, 1.0f, 2, 4, 8, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused BATCHMEAN");
    EXPECT(FUS(L, (char*)D + 2, X, 32, tg, G, 1.0f, 1, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits misaligned");
    EXPECT(FUS(L, D, X, 32, tg, (const float*)((const char*)G + 2), 1.0f, 2, 4, 8, &o, ws, wsb),
           FL_ERR_INVALID_ARGUMENT, "grad_loss misaligned");
    EXPECT(FUS(L, X + 1, X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits partially overlaps logits");
    CHECK(strstr(fl_last_error(), "in place") != NULL, "partial overlap message: %s", fl_last_error());
    EXPECT(FUS(L, X + 16, X, 32, tg, G, 1.0f, 1, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits half a row off");
    EXPECT(FUS(L, X + 32, X, 32, tg, G, 1.0f, 1, 4, 8, &o, ws, wsb), FL_OK, "dlogits right after the logits");
    EXPECT(FUS(L, (float*)tg, X, 32, tg, G, 1.0f, 1, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits == targets");
    EXPECT(FUS(L, A, X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps alpha");
    CHECK(strstr(fl_last_error(), "alpha") != NULL, "dlogits / alpha message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, 32, tg, D + 63, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps grad_loss");
    EXPECT(FUS(D + 5, D, X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps dlogits");
    EXPECT(FUS(L, D, X, 32, tg, L, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps grad_loss");
    ob = o;
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FUS(L, D, X, 32, tg, L + 15, 1.0f, 2, 4, 8, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss [P] overlaps grad_loss [P]");
    EXPECT(FUS(L, (float*)(ws + 256), X, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "dlogits overlaps workspace");
    EXPECT(FUS(L, D, X, 32, tg, (const float*)ws, 1.0f, 2, 4, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "workspace overlaps grad_loss");
    EXPECT(FUS(L, D, X, 32, tg, X, 1.0f, 2, 4, 8, &o, ws, wsb), FL_OK, "grad_loss may alias the logits (inputs)");
    {   /* in place is allowed (D used as the logits) */
        memcpy(D, X, sizeof X);
        fl_status st = FUS(L, D, D, 32, tg, G, 1.0f, 2, 4, 8, &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "in place dlogits == logits");
    }
#undef FUS
    fnname = "fl_softmax_focal_workspace_size";
    {
        size_t b = 77;
        EXPECT(fl_softmax_focal_workspace_size(NULL, 2, 4, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "bytes NULL");
        EXPECT(fl_softmax_focal_workspace_size(&b, -1, 4, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "size N < 0");
        EXPECT(fl_softmax_focal_workspace_size(&b, 2, 0, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "size C < 1");
        EXPECT(fl_softmax_focal_workspace_size(&b, 2, 4, 0, F, NULL), FL_ERR_INVALID_ARGUMENT, "size d < 1");
        EXPECT(fl_softmax_focal_workspace_size(&b, 2, 4, 8, (fl_dtype)9, NULL), FL_ERR_INVALID_ARGUMENT, "size dtype");
        ob = o;
        ob.struct_size = 3;
        EXPECT(fl_softmax_focal_workspace_size(&b, 2, 4, 8, F, &ob), FL_ERR_INVALID_ARGUMENT, "size struct_size");
        EXPECT(fl_softmax_focal_workspace_size(&b, INT64_MAX, 4, 8, F, NULL), FL_ERR_INVALID_ARGUMENT,
               "size N*d overflow");
        EXPECT(fl_softmax_focal_workspace_size(&b, (int64_t)1 << 60, 4, 1, F, NULL), FL_ERR_INVALID_ARGUMENT,
               "size overflow");
        CHECK(b == 77, "bytes written on error (%zu)", b);
    }
#ifndef FL_WITH_CUDA
    if (!fl_cuda_built()) {
        fnname = "fl_softmax_focal_forward_cuda";
        EXPECT(fl_softmax_focal_forward_cuda(L, X, 32, tg, I, 2, 4, 8, F, &o, ws, wsb, NULL), FL_ERR_NOT_BUILT,
               "forward cuda not built");
        fnname = "fl_softmax_focal_fused_cuda";
        EXPECT(fl_softmax_focal_fused_cuda(L, D, X, 32, tg, I, G, 1.0f, 2, 4, 8, F, &o, ws, wsb, NULL),
               FL_ERR_NOT_BUILT, "fused cuda not built");
    }
#endif
    free(ws);
}

int main(void) {
    test_values();
    test_workspace_size();

    /* the grid: gamma x shape, the other knobs cycled through coprime periods */
    const float gammas[5] = {0.0f, 0.5f, 1.0f, 2.0f, 3.5f};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const float gss[3] = {1.0f, 0.7f, -1.5f};
    static const int64_t shapes[][3] = {   /* N, C, d */
        {1, 1, 1},   {3, 2, 1},    {8, 19, 1},  {3, 100, 1}, {8, 1, 7},    {1, 2, 7},  {3, 19, 7},
        {8, 100, 7}, {3, 19, 64},  {1, 100, 64}, {8, 2, 64},  {3, 19, 1000}, {1, 2, 1000}, {2, 37, 1000},
        {3, 1, 64},  {0, 19, 1},   {0, 5, 64},
        {3, 8191, 1}, {2, 8193, 1}, {3, 20000, 1},
    };
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    uint64_t seed = 1;
    int k = 0;
    tu_quiet = 1;
    for (int g = 0; g < 5; g++)
        for (int s = 0; s < nshapes; s++, k++) {
            cfg_t c;
            memset(&c, 0, sizeof c);
            c.N = shapes[s][0];
            c.C = shapes[s][1];
            c.d = shapes[s][2];
            c.gamma = gammas[g];
            c.red = reds[k % 3];
            c.dt = dts[(k / 3) % 3];
            c.pad = k % 4 == 1 ? 5 : k % 4 == 3 ? c.d + 3 : 0;
            c.alpha = (k / 2) % 2;
            c.tgt = 1 + (k / 5) % 2;
            c.ignore_index = (k % 13 == 4 && c.C > 1) ? 1 : (k % 13 == 7 && c.tgt == 2) ? (int64_t)1 << 40 : -100;
            c.ign_frac = k % 7 < 5 ? 0.3 : 0.0;
            c.gl = (k % 5) & 1;
            c.gscale = gss[(k / 7) % 3];
            c.special = k % 4 != 2;
            run_cfg(&c, seed++);
        }
    /* every position ignored, each reduction, rows and maps, int32 and int64 */
    for (int ri = 0; ri < 3; ri++)
        for (int m = 0; m < 2; m++) {
            cfg_t c;
            memset(&c, 0, sizeof c);
            c.N = 3; c.C = m ? 19 : 5; c.d = m ? 7 : 1; c.pad = 2; c.dt = dts[ri]; c.gamma = gammas[ri + m];
            c.alpha = m; c.red = reds[ri]; c.tgt = 1 + m; c.ignore_index = m ? -1 : -100; c.all_ignored = 1;
            c.gl = 1; c.gscale = 2.0f; c.special = 1;
            run_cfg(&c, seed++);
        }
    tu_quiet = 0;
    test_threads();
    test_validator();
    test_errors();
    return tu_finish();
}
