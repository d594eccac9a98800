/* test_large_margin_ce.c — CPU backend of the large-margin softmax cross-entropy (include/fusedloss.h
 * section 15; Kobayashi BMVC'19, pytorch-loss LargeMarginSoftmaxV1) against an independent
 * long-double reference written from the header's formula:
 *
 *   l = (lse(x) - x_y) + (lambda / 2) sum_{k != y} (q_k - 1 / (C - 1)) log q_k,
 *   q = softmax over the C - 1 non-target logits, with its own max shift.
 *
 * The reference sums the regulariser term by term from log q_k = (x_k - m') - log1p(sum_{k != y,
 * k != argmax'} exp(x_k - m')) (the library rearranges it into A - lse' - c (B - (C - 1) lse')),
 * takes the cross-entropy as (m - x_y) + log1p(...) (no cancellation when the target dominates)
 * and the target's gradient as -sum_{k != y} p_k (not p_y - 1). Its analytic gradient is checked
 * by central finite differences of the reference loss (long double), and the library's fused
 * gradient by central finite differences of the library's own forward (fp32 losses, differenced in
 * double) on small fp32 cases. lambda = 0 is also compared with the library's plain cross-entropy
 * (fl_cross_entropy_fused_cpu), and the pytorch-loss module is re-implemented literally in double
 * (its -1e6 mask, softmax / log_softmax over all C columns, CrossEntropyLoss, loss[mask == 0]).
 *
 * Grid (the full product of the first five, the other knobs cycled through coprime periods):
 * every reduction (NONE / SUM / MEAN); lambda 0, 0.3, 1.7; fp32 / fp16 / bf16 logits (inputs
 * rounded to the dtype first); C in {2, 3, 10, 257, 1000}; N in {1, 5, 129}; int32 / int64
 * targets; ignore_index -100 and 255 (out of range for C <= 255, a real class for C = 257, 1000);
 * about 30 % / no rows ignored (their logits NaN: never read), every row ignored (MEAN NaN, SUM 0);
 * ld = C, C + 1, C + 5 with padding alternately 30000 and NaN (read, it would give inf / NaN), the
 * padding of dlogits poisoned and checked intact; grad_loss NULL / [1] (SUM, MEAN: the rest NaN,
 * never read) / [N] (NONE); grad_scale 1, 0.7, -2.5; loss NULL in fused; in place (dlogits ==
 * logits); N = 0; every output poisoned before every call. Row kinds (seeded random, never zero):
 * uniform, normal, large |x| (uniform in [-80, 80], +-80 columns and target), the target dominating
 * (x_y = 80 over [-3, 3]; x_y = max + 12), constant non-target logits (q uniform: the regulariser
 * 0), a tiny target probability (x_y = -80), small |x|, ties. Also: closed forms (C = 2: the
 * regulariser vanishes for every lambda; constant rows: l = log C), |x| ~ 3e4, default options,
 * the workspace size query (0 for NONE; fl_taylor_ce_workspace_size's answer otherwise), the
 * resolved parameters of the validator, every bad argument's status and message (outputs untouched
 * on error), out-of-range targets (FL_ERR_TARGET_OUT_OF_RANGE, nothing written).
 *
 * Build / run: make test (this is build/test_large_margin_ce). Prints "N passed, M failed".
 * SPDX-License-Identifier: MIT
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "zoo_test_util.h"
#include "../src/internal.h" /* fl__large_margin_validate, fl__taylor_workspace_bytes, FL__TAYLOR_WS_HEAD */

/* ------------------------------------------------------------------------------------------
 * Tolerances, |lib - ref| <= atol + rtol*|ref| + slack, indexed by fl_dtype (F32 = 0, F16 = 1,
 * BF16 = 2). The reference is long double on the same dtype-rounded logits; the library computes
 * in double and rounds once to fp32 (loss) or through fp32 to the logits' dtype (dlogits).
 *
 *            |  loss (fp32, every dtype)  |          dlogits (the logits' dtype)
 *   dtype    |  rtol        atol          |  rtol                  atol (one subnormal step)
 *   fp32     |  2^-23       1.5e-45       |  2^-23  (1 ulp)        1.5e-45  (2^-149)
 *   fp16     |  2^-23       1.5e-45       |  2^-10  (1 ulp)        5.97e-8  (2^-24)
 *   bf16     |  2^-23       1.5e-45       |  2^-7   (1 ulp)        9.2e-41  (2^-133)
 *
 *   (the double -> fp32 rounding is half an fp32 ulp; double -> fp32 -> dtype at most one ulp)
 *   slack  : the error of the library's double arithmetic, a first-order bound doubled
 *            (SLACK_SAFETY), u = EPS_DBL = 2^-52, M = max |x|, c = 1 / (C - 1):
 *            E  = u (|m| + |log s| + C + 4), E' = u (|m'| + |log s'| + C + 4)  (lse, lse' absolute),
 *            q_k relative: E' + u (|x_k - lse'| + 2), p_j relative: E + u (|x_j - lse| + 2),
 *            A = sum q_k x_k: eA = sum q_k |x_k| (E' + u (|x_k - lse'| + 2 + C)), B = sum x_k:
 *            eB = u C sum |x_k|; the regulariser (A - lse') - c (B - (C - 1) lse'):
 *            eR = eA + E' + c (eB + (C - 1) E') + u (|A| + |lse'| + c |B| + |lse'| + |A - lse'| +
 *            c |B - (C - 1) lse'| + |R|); loss: E + u (|x_y| + ce) + (lambda / 2) eR + u |l|;
 *            SUM / MEAN: the rows' sum + u N sum |l| (/ D);
 *            dx_y: p_y rel(p_y) + u;  dx_j: p_j rel(p_j) + (lambda / 2) (q_j |t| rel(q_j) + q_j (eA +
 *            u (|x_j| + 1 + |A| + |t|)) + u (q_j |t| + c + |q_j t - c|)) + u (|..| + |dx_j|),
 *            t = x_j + 1 - A; all times |g|, plus 3 u |g dx|. (It is the library's formulation:
 *            with lambda = 0 and a dominating target, lse - x_y cancels, so a loss of 1e-33 may be
 *            returned as 0; the slack is absolute there, about u (2 M + C).)
 *   reference finite differences (long double, absolute h = FD_H_REF): |fd - dl| <=
 *            FD_REF_RTOL |dl| + FD_REF_ATOL (1 + M) (truncation h^2 / 6 |l'''| with |l'''| = O(1 + M),
 *            rounding 1e-19 |l| / h; the grid passes with 1e-12 (1 + M), 100 x tighter);
 *   library finite differences (the library's fp32 forward at x +- h, h = FD_H_LIB max(1, |x|),
 *            both points rounded to fp32, differenced in double over the exact step): |fd - dx| <=
 *            FD_LIB_TRUNC T + (2^-24 (|l+| + |l-|) + sl+ + sl-) / step + 2^-23 |dx| + slack(dx),
 *            T the truncation error of that same step measured on the long-double reference
 *            (|fd_ref - dx_ref|), sl the losses' slack: the fp32 rounding of the two losses is the
 *            only other error (about 3e-5 |l| here);
 *   lambda = 0 vs fl_cross_entropy_fused_cpu: CE_FACTOR x (rtol, atol, slack) of the reference
 *            check, relative to the cross-entropy's value (both are within the single tolerance of
 *            the reference);
 *   pytorch-loss re-implementation (double, its operation order): PT_RTOL relative + PT_ATOL.
 * ---------------------------------------------------------------------------------------- */
static const double RTOL_LOSS = 1.1920928955078125e-7, ATOL_LOSS = 1.5e-45;
static const double RTOL_DX[3] = {1.1920928955078125e-7, 9.765625e-4, 7.8125e-3};
static const double ATOL_DX[3] = {1.5e-45, 5.97e-8, 9.2e-41};
static const double EPS_DBL = 2.220446049250313e-16;
static const double SLACK_SAFETY = 2.0;
static const long double FD_H_REF = 1e-6L;
static const double FD_REF_RTOL = 1e-7, FD_REF_ATOL = 1e-10;
static const double FD_H_LIB = 1.0 / 512.0, FD_LIB_TRUNC = 1.05;
static const double CE_FACTOR = 2.5;
static const double PT_RTOL = 1e-6, PT_ATOL = 1e-7;

typedef long double LD;

/* ---- reference ---------------------------------------------------------------------------- */

typedef struct {
    LD l, sl;   /* the loss and its slack (the library's double error, absolute) */
} ref_row_t;

/* one row: x[C] the dtype-rounded logits, y the target, lam = lambda. dl (or NULL): d l / d x_j;
 * dsl (or NULL, needs dl): the slack of the library's dx_j without the factor |g| */
static ref_row_t ref_row(const LD* x, int64_t C, int64_t y, LD lam, LD* dl, LD* dsl) {
    const LD u = (LD)EPS_DBL, c = 1.0L / (LD)(C - 1), half = lam / 2;
    const LD Cl = (LD)C;
    int64_t am = 0, amo = y == 0 ? 1 : 0;   /* argmax over all, argmax over k != y */
    LD M = 0;
    for (int64_t j = 0; j < C; j++) {
        if (x[j] > x[am]) am = j;
        if (j != y && x[j] > x[amo]) amo = j;
        if (fabsl(x[j]) > M) M = fabsl(x[j]);
    }
    const LD m = x[am], mo = x[amo];
    LD sr = 0, sor = 0;   /* the sums of exp(x - max) without their max term (which is 1) */
    for (int64_t j = 0; j < C; j++) {
        if (j != am) sr += expl(x[j] - m);
        if (j != y && j != amo) sor += expl(x[j] - mo);
    }
    const LD ls = log1pl(sr), lso = log1pl(sor);   /* log sum exp(x - m), log sum_{k != y} exp(x_k - m') */
    const LD lse = m + ls, lseo = mo + lso;
    const LD ce = (m - x[y]) + ls;                 /* >= 0, no cancellation when y is the argmax */
    const LD E = u * (fabsl(m) + fabsl(ls) + Cl + 4), Eo = u * (fabsl(mo) + fabsl(lso) + Cl + 4);
    LD reg = 0, A = 0, B = 0, absB = 0, eA = 0;
    for (int64_t k = 0; k < C; k++) {
        if (k == y) continue;
        const LD lq = (x[k] - mo) - lso, q = expl(lq);
        reg += (q - c) * lq;   /* the header's sum, term by term */
        A += q * x[k];
        B += x[k];
        absB += fabsl(x[k]);
        eA += q * fabsl(x[k]) * (Eo + u * (fabsl(x[k] - lseo) + 2 + Cl));
    }
    ref_row_t r;
    r.l = ce + half * reg;
    const LD eB = u * Cl * absB;
    const LD eR = eA + Eo + c * (eB + (Cl - 1) * Eo) +
                  u * (fabsl(A) + fabsl(lseo) + c * fabsl(B) + fabsl(lseo) + fabsl(A - lseo) +
                       c * fabsl(B - (Cl - 1) * lseo) + fabsl(reg));
    r.sl = (LD)SLACK_SAFETY * (E + u * (fabsl(x[y]) + ce) + half * eR + u * fabsl(r.l));
    if (dl) {
        LD sp = 0;   /* sum_{k != y} p_k */
        for (int64_t j = 0; j < C; j++) {
            const LD pj = expl((x[j] - m) - ls);
            const LD prel = E + u * (fabsl(x[j] - lse) + 2);
            if (j == y) {
                if (dsl) dsl[j] = (LD)SLACK_SAFETY * (pj * prel + u);
                continue;
            }
            sp += pj;
            const LD qj = expl((x[j] - mo) - lso), t = x[j] + 1 - A, inner = qj * t - c;
            dl[j] = pj + half * inner;
            if (dsl) {
                const LD qrel = Eo + u * (fabsl(x[j] - lseo) + 2);
                const LD ierr = qj * fabsl(t) * qrel + qj * (eA + u * (fabsl(x[j]) + 1 + fabsl(A) + fabsl(t))) +
                                u * (qj * fabsl(t) + c + fabsl(inner));
                dsl[j] = (LD)SLACK_SAFETY * (pj * prel + half * ierr + u * (half * fabsl(inner) + fabsl(dl[j])));
            }
        }
        dl[y] = -sp;   /* p_y - 1 */
    }
    return r;
}

static LD ref_loss(const LD* x, int64_t C, int64_t y, LD lam) { return ref_row(x, C, y, lam, NULL, NULL).l; }

/* ---- one configuration ------------------------------------------------------------------- */
typedef struct {
    int64_t N, C, pad;            /* ld = C + pad */
    fl_dtype dt;
    float lam;
    fl_reduction red;
    int tgt64;                    /* targets int64 (else int32) */
    int64_t ignore_index;
    int ign_mode;                 /* 0: no row ignored, 1: about 30 %, 2: every row */
    int gl;                       /* grad_loss given */
    float gscale;
    int rot;                      /* row-kind rotation */
} cfg_t;

static const char* red_name(fl_reduction r) {
    return r == FL_REDUCTION_NONE ? "none" : r == FL_REDUCTION_MEAN ? "mean" : r == FL_REDUCTION_SUM ? "sum" : "?";
}

/* store v rounded to dt, never an exact zero */
static void st_nz(void* x, fl_dtype dt, int64_t i, double v) {
    float f = (float)v;
    if (tu_round_to(dt, f) == 0.0f) f = 0.0625f;
    tu_store(x, dt, i, f);
}

enum { KINDS = 9 };

/* row kinds 0..KINDS-1 (the target y given) */
static void fill_row(const cfg_t* c, tu_rng* r, void* x, int64_t base, int64_t y, int kind) {
    const int64_t C = c->C;
    const fl_dtype dt = c->dt;
    switch (kind) {
        case 1:   /* normal, scale 2 */
            for (int64_t j = 0; j < C; j++) st_nz(x, dt, base + j, 2.0 * tu_normal(r));
            break;
        case 2:   /* large |x|: uniform in [-80, 80], +-80 every 7th column and at the target */
            for (int64_t j = 0; j < C; j++) {
                double v = tu_uniform_in(r, -80.0, 80.0);
                if (j % 7 == 3) v = tu_uniform(r) < 0.5 ? -80.0 : 80.0;
                st_nz(x, dt, base + j, v);
            }
            st_nz(x, dt, base + y, tu_uniform(r) < 0.5 ? 80.0 : -80.0);
            break;
        case 3:   /* the target dominates: 80 over [-3, 3] (p_y = 1 - 1e-33) */
            for (int64_t j = 0; j < C; j++) st_nz(x, dt, base + j, tu_uniform_in(r, -3.0, 3.0));
            st_nz(x, dt, base + y, 80.0);
            break;
        case 4: { /* the target dominates moderately: max + 12 */
            double mx = -1e30;
            for (int64_t j = 0; j < C; j++) {
                const double v = tu_uniform_in(r, -3.0, 3.0);
                st_nz(x, dt, base + j, v);
                if (j != y && tu_load(x, dt, base + j) > mx) mx = tu_load(x, dt, base + j);
            }
            st_nz(x, dt, base + y, mx + 12.0);
            break;
        }
        case 5: { /* constant non-target logits: q uniform, the regulariser 0 */
            const double v = tu_uniform_in(r, -3.0, 3.0);
            for (int64_t j = 0; j < C; j++) st_nz(x, dt, base + j, v);
            st_nz(x, dt, base + y, tu_uniform_in(r, -3.0, 3.0));
            break;
        }
        case 6:   /* a tiny target probability: -80 under [-3, 3] */
            for (int64_t j = 0; j < C; j++) st_nz(x, dt, base + j, tu_uniform_in(r, -3.0, 3.0));
            st_nz(x, dt, base + y, -80.0);
            break;
        case 7:   /* small |x| */
            for (int64_t j = 0; j < C; j++) st_nz(x, dt, base + j, tu_uniform_in(r, -0.5, 0.5));
            break;
        case 8: { /* ties: three values only (the target tied with the max half of the time) */
            static const double vals[3] = {-1.5, 0.5, 2.25};
            for (int64_t j = 0; j < C; j++) st_nz(x, dt, base + j, vals[tu_int_in(r, 0, 2)]);
            if (tu_uniform(r) < 0.5) st_nz(x, dt, base + y, 2.25);
            break;
        }
        default:  /* uniform [-3, 3] */
            for (int64_t j = 0; j < C; j++) st_nz(x, dt, base + j, tu_uniform_in(r, -3.0, 3.0));
            break;
    }
}

static int64_t fdref_total = 0, fdlib_total = 0, ce_total = 0;   /* over the grid, printed at the end */

static void run_cfg(const cfg_t* c, uint64_t seed) {
    const int64_t N = c->N, C = c->C, ld = C + c->pad;
    const LD lam = (LD)c->lam;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const size_t xbytes = (size_t)(N * ld) * es;
    tu_rng r = tu_rng_seed(seed);
    char name[256];
    snprintf(name, sizeof name, "lam=%g %s N=%lld C=%lld ld=%lld %s i%d ign=%lld%s gl=%d gs=%g", (double)c->lam,
             red_name(c->red), (long long)N, (long long)C, (long long)ld, tu_dtype_name(c->dt), c->tgt64 ? 64 : 32,
             (long long)c->ignore_index, c->ign_mode == 2 ? "(all)" : c->ign_mode == 0 ? "(none)" : "", c->gl,
             (double)c->gscale);

    /* inputs: everything poisoned (NaN) first, so ignored rows stay NaN (never read); padding
     * columns alternately +30000 (exp(30000) = inf in double) and NaN */
    void* x = tu_xmalloc(xbytes + 4);
    tu_poison(x, xbytes + 4);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = C; j < ld; j += 2) tu_store(x, c->dt, i * ld + j, 30000.0f);
    int32_t* t32 = tu_xmalloc((size_t)N * 4 + 4);
    int64_t* t64 = tu_xmalloc((size_t)N * 8 + 8);
    int* ign = tu_xmalloc((size_t)N * sizeof(int) + sizeof(int));
    int64_t D = 0;
    for (int64_t i = 0; i < N; i++) {
        ign[i] = c->ign_mode == 2 || (c->ign_mode == 1 && tu_uniform(&r) < 0.3);
        int64_t y = c->ignore_index;
        if (!ign[i]) {
            y = tu_int_in(&r, 0, C - 1);
            if (y == c->ignore_index) y = (y + 1) % C;   /* (an in-range ignore_index only with C > 255) */
        }
        t32[i] = (int32_t)y;
        t64[i] = y;
        D += !ign[i];
        if (!ign[i]) fill_row(c, &r, x, i * ld, y, (int)((i + c->rot) % KINDS));
    }
    const void* targets = c->tgt64 ? (const void*)t64 : (const void*)t32;
    const fl_index_dtype it = c->tgt64 ? FL_INDEX_I64 : FL_INDEX_I32;
    float* gl = tu_xmalloc((size_t)(N + 1) * 4);
    for (int64_t i = 0; i < N + 1; i++) gl[i] = (none || i == 0) ? (float)tu_uniform_in(&r, -2.0, 2.0) : NAN;
    if (!none) gl[0] = (float)tu_uniform_in(&r, 0.25, 2.0);
    void* x_in = tu_xmalloc(xbytes + 4);   /* the untouched input, to check forward / out of place */
    memcpy(x_in, x, xbytes + 4);

    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT;
    o.lambda = c->lam;
    o.ignore_index = c->ignore_index;
    o.reduction = c->red;
    size_t wsb = 0, wsb_t = 1;
    CHECK_STATUS(fl_large_margin_ce_workspace_size(&wsb, N, C, c->dt, &o), FL_OK, "workspace size");
    {
        fl_taylor_options ot = FL_TAYLOR_OPTIONS_INIT;
        ot.reduction = c->red;
        fl_taylor_ce_workspace_size(&wsb_t, N, C, c->dt, &ot);
        CHECK(wsb == wsb_t && (!none || wsb == 0), "%s: workspace %zu, Taylor's %zu", name, wsb, wsb_t);
    }
    void* ws = tu_xmalloc(wsb);
    tu_poison(ws, wsb);

    /* reference */
    const LD denom = c->red == FL_REDUCTION_MEAN ? (LD)D : 1;
    const size_t ne = (size_t)(N * C) + 1;
    double* lref = tu_xmalloc((size_t)(N + 1) * 8);
    double* lsl = tu_xmalloc((size_t)(N + 1) * 8);
    double* dref = tu_xmalloc(ne * 8);
    double* dsl = tu_xmalloc(ne * 8);
    double* got = tu_xmalloc(ne * 8);
    LD* xr = tu_xmalloc((size_t)C * sizeof(LD));
    LD* dl = tu_xmalloc((size_t)C * sizeof(LD));
    LD* ds = tu_xmalloc((size_t)C * sizeof(LD));
    LD sum = 0, sumsl = 0, sumabs = 0;
    double fdmax = 0;
    int64_t fdbad = 0, fdn = 0, fdrows = 0;
    for (int64_t i = 0; i < N; i++) {
        if (ign[i]) {
            lref[i] = 0; lsl[i] = 0;
            for (int64_t j = 0; j < C; j++) { dref[i * C + j] = 0; dsl[i * C + j] = 0; }
            continue;
        }
        const int64_t y = t64[i];
        LD M = 0;
        for (int64_t j = 0; j < C; j++) {
            xr[j] = tu_load(x, c->dt, i * ld + j);
            if (fabsl(xr[j]) > M) M = fabsl(xr[j]);
        }
        const ref_row_t rr = ref_row(xr, C, y, lam, dl, ds);
        const LD g = (LD)c->gscale * (c->gl ? (LD)gl[none ? i : 0] : 1) / denom;
        lref[i] = (double)rr.l;
        lsl[i] = (double)rr.sl;
        sum += rr.l;
        sumsl += rr.sl;
        sumabs += fabsl(rr.l);
        for (int64_t j = 0; j < C; j++) {
            dref[i * C + j] = (double)(g * dl[j]);
            dsl[i * C + j] = (double)(fabsl(g) * (ds[j] + 3 * (LD)EPS_DBL * fabsl(dl[j])));
        }
        /* the reference's analytic gradient against its own central differences: every column of
         * small rows, 6 (the target, the ends, three inside) of large ones; the first 3 rows */
        if (fdrows < 3) {
            fdrows++;
            const int64_t cols[6] = {y, 0, C - 1, C / 2, C / 3, C / 5};
            const int64_t ncol = C <= 64 ? C : 6;
            for (int64_t k = 0; k < ncol; k++) {
                const int64_t j = C <= 64 ? k : cols[k];
                if (C > 64 && k > 0 && j == y) continue;
                const LD x0 = xr[j];
                const LD xp = x0 + FD_H_REF, xm = x0 - FD_H_REF;
                xr[j] = xp;
                const LD lp = ref_loss(xr, C, y, lam);
                xr[j] = xm;
                const LD lm = ref_loss(xr, C, y, lam);
                xr[j] = x0;
                const double fd = (double)((lp - lm) / (xp - xm));
                const double an = (double)dl[j];
                const double d = fabs(fd - an);
                const double tol = FD_REF_RTOL * fabs(an) + FD_REF_ATOL * (1 + (double)M);
                fdn++;
                if (d > fdmax) fdmax = d;
                if (!(d <= tol)) {
                    if (fdbad < 3)
                        printf("  %s: reference fd row %lld col %lld (target %lld, x %.9g): analytic %.12g fd %.12g "
                               "(tol %.3g)\n", name, (long long)i, (long long)j, (long long)y, (double)x0, an, fd, tol);
                    fdbad++;
                }
            }
        }
    }
    fdref_total += fdn;
    CHECK(fdbad == 0, "%s: %lld of %lld reference finite differences disagree with the analytic gradient "
          "(maxdiff %.3g)", name, (long long)fdbad, (long long)fdn, fdmax);

    double lred = 0, lredsl = 0;
    if (!none) {
        lred = c->red == FL_REDUCTION_SUM ? (double)sum : D > 0 ? (double)(sum / denom) : NAN;
        lredsl = (double)((sumsl + (LD)EPS_DBL * (LD)N * sumabs) / (D > 0 ? denom : 1)) + 1e-300;
    }

    float* loss = tu_xmalloc((size_t)(nl + 1) * 4);
    float* loss2 = tu_xmalloc((size_t)(nl + 1) * 4);
    void* dx = tu_xmalloc(xbytes + 4);
    void* dx2 = tu_xmalloc(xbytes + 4);
    char nm[400];

    /* forward */
    tu_poison(loss, (size_t)(nl + 1) * 4);
    fl_status st = fl_large_margin_ce_forward_cpu(loss, x, ld, targets, it, N, C, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s forward", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s forward loss", name);
        if (none) {
            for (int64_t i = 0; i < N; i++) got[i] = loss[i];
            if (N > 0) check_close_ex(nm, got, lref, lsl, N, ATOL_LOSS, RTOL_LOSS);
            int64_t badign = 0;
            for (int64_t i = 0; i < N; i++) badign += ign[i] && tu_f32_bits(loss[i]) != 0;
            CHECK(badign == 0, "%s: %lld ignored rows with a loss other than +0", nm, (long long)badign);
        } else {
            got[0] = loss[0];
            check_close_ex(nm, got, &lred, &lredsl, 1, ATOL_LOSS, RTOL_LOSS);
            if (D == 0 && c->red == FL_REDUCTION_SUM)
                CHECK(tu_f32_bits(loss[0]) == 0, "%s: SUM over no rows = %g, want +0", nm, loss[0]);
        }
        CHECK(tu_is_poison(loss, 4, nl), "%s: loss[%lld] (past the end) written", nm, (long long)nl);
        CHECK(memcmp(x, x_in, xbytes + 4) == 0, "%s: the logits were modified", nm);
    }

    /* fused, with loss */
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    tu_poison(dx, xbytes + 4);
    st = fl_large_margin_ce_fused_cpu(loss2, dx, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o,
                                      ws, wsb);
    snprintf(nm, sizeof nm, "%s fused", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s fused loss == forward", name);
        check_bitwise(nm, loss2, loss, (size_t)(nl + 1) * 4);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < C; j++) got[i * C + j] = tu_load(dx, c->dt, i * ld + j);
        snprintf(nm, sizeof nm, "%s fused dlogits", name);
        if (N > 0) check_close_ex(nm, got, dref, dsl, N * C, ATOL_DX[c->dt], RTOL_DX[c->dt]);
        int64_t badpad = 0, badign = 0;
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = C; j < ld; j++) badpad += !tu_is_poison(dx, es, i * ld + j);
            for (int64_t j = 0; ign[i] && j < C; j++) badign += tu_bits(dx, c->dt, i * ld + j) != 0;
        }
        badpad += !tu_is_poison((char*)dx + xbytes, 4, 0);
        CHECK(badpad == 0, "%s: %lld padding / past-the-end elements of dlogits written", nm, (long long)badpad);
        CHECK(badign == 0, "%s: %lld elements of ignored rows not +0", nm, (long long)badign);
        CHECK(memcmp(x, x_in, xbytes + 4) == 0, "%s: the logits were modified (out of place)", nm);
    }

    /* fused, loss NULL: the same dlogits */
    tu_poison(dx2, xbytes + 4);
    st = fl_large_margin_ce_fused_cpu(NULL, dx2, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o,
                                      ws, wsb);
    snprintf(nm, sizeof nm, "%s fused loss=NULL dlogits", name);
    if (CHECK_STATUS(st, FL_OK, nm)) check_bitwise(nm, dx2, dx, xbytes + 4);

    /* in place: dlogits == logits; expected: the first C columns of dx, the padding of x */
    memcpy(dx2, x, xbytes + 4);
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    st = fl_large_margin_ce_fused_cpu(loss2, dx2, dx2, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt,
                                      &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s fused in place", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        void* want = tu_xmalloc(xbytes + 4);
        memcpy(want, x, xbytes + 4);
        for (int64_t i = 0; i < N; i++)
            memcpy((char*)want + (size_t)(i * ld) * es, (char*)dx + (size_t)(i * ld) * es, (size_t)C * es);
        check_bitwise(nm, dx2, want, xbytes + 4);
        check_bitwise(nm, loss2, loss, (size_t)(nl + 1) * 4);
        free(want);
    }

    /* lambda = 0 is the plain cross-entropy: the library's own (fl_cross_entropy_fused_cpu) */
    if (c->lam == 0.0f && N > 0) {
        fl_ce_options co = FL_CE_OPTIONS_INIT;
        co.ignore_index = c->ignore_index;
        co.reduction = c->red;
        size_t cwb = 0;
        CHECK_STATUS(fl_cross_entropy_workspace_size(&cwb, N, C, c->dt, &co), FL_OK, "ce workspace");
        void* cws = tu_xmalloc(cwb);
        float* lce = tu_xmalloc((size_t)(nl + 1) * 4);
        void* dce = tu_xmalloc(xbytes + 4);
        st = fl_cross_entropy_fused_cpu(lce, NULL, dce, x, targets, c->gl ? gl : NULL, c->gscale, N, C, ld, c->dt, it,
                                        &co, cws, cwb);
        snprintf(nm, sizeof nm, "%s lambda 0 == cross-entropy", name);
        if (CHECK_STATUS(st, FL_OK, nm)) {
            double* a = tu_xmalloc(ne * 8);
            double* b = tu_xmalloc(ne * 8);
            double* s = tu_xmalloc(ne * 8);
            for (int64_t i = 0; i < nl; i++) {
                a[i] = loss[i];
                b[i] = lce[i];
                s[i] = CE_FACTOR * (none ? lsl[i] : lredsl);
            }
            snprintf(nm, sizeof nm, "%s lambda 0 loss == cross-entropy", name);
            check_close_ex(nm, a, b, s, nl, CE_FACTOR * ATOL_LOSS, CE_FACTOR * RTOL_LOSS);
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < C; j++) {
                    a[i * C + j] = tu_load(dx, c->dt, i * ld + j);
                    b[i * C + j] = tu_load(dce, c->dt, i * ld + j);
                    s[i * C + j] = CE_FACTOR * dsl[i * C + j];
                }
            snprintf(nm, sizeof nm, "%s lambda 0 dlogits == cross-entropy", name);
            check_close_ex(nm, a, b, s, N * C, CE_FACTOR * ATOL_DX[c->dt], CE_FACTOR * RTOL_DX[c->dt]);
            ce_total += N * C + nl;
            free(a); free(b); free(s);
        }
        free(cws); free(lce); free(dce);
    }

    /* the library's fused gradient against central differences of the library's own forward
     * (small fp32 cases: every column of the first 3 rows not ignored; reduction NONE, g = 1) */
    if (c->dt == FL_DTYPE_F32 && C <= 16 && N > 0) {
        fl_large_margin_options o1 = o;
        o1.reduction = FL_REDUCTION_NONE;
        float* row = tu_xmalloc((size_t)C * 4);
        float* drow = tu_xmalloc((size_t)C * 4);
        double* fg = tu_xmalloc((size_t)(3 * C) * 8);
        double* fv = tu_xmalloc((size_t)(3 * C) * 8);
        double* fs = tu_xmalloc((size_t)(3 * C) * 8);
        int64_t k = 0, rows = 0;
        for (int64_t i = 0; i < N && rows < 3; i++) {
            if (ign[i]) continue;
            rows++;
            const int64_t y = t64[i];
            for (int64_t j = 0; j < C; j++) { row[j] = ((const float*)x)[i * ld + j]; xr[j] = row[j]; }
            ref_row(xr, C, y, lam, dl, ds);
            float l0;
            st = fl_large_margin_ce_fused_cpu(&l0, drow, row, C, &y, FL_INDEX_I64, NULL, 1.0f, 1, C, FL_DTYPE_F32, &o1,
                                              NULL, 0);
            CHECK_STATUS(st, FL_OK, "fd: fused row");
            for (int64_t j = 0; j < C; j++, k++) {
                const float x0 = row[j];
                const double h = FD_H_LIB * (fabs((double)x0) > 1 ? fabs((double)x0) : 1.0);
                const float xp = (float)((double)x0 + h), xm = (float)((double)x0 - h);
                const double step = (double)xp - (double)xm;
                float lp, lm;
                row[j] = xp;
                st = fl_large_margin_ce_forward_cpu(&lp, row, C, &y, FL_INDEX_I64, 1, C, FL_DTYPE_F32, &o1, NULL, 0);
                row[j] = xm;
                fl_status st2 = fl_large_margin_ce_forward_cpu(&lm, row, C, &y, FL_INDEX_I64, 1, C, FL_DTYPE_F32, &o1,
                                                               NULL, 0);
                row[j] = x0;
                CHECK(st == FL_OK && st2 == FL_OK, "fd: forward status %d %d", (int)st, (int)st2);
                xr[j] = xp;
                const ref_row_t rp = ref_row(xr, C, y, lam, NULL, NULL);
                xr[j] = xm;
                const ref_row_t rm = ref_row(xr, C, y, lam, NULL, NULL);
                xr[j] = x0;
                const double trunc = fabs((double)((rp.l - rm.l) / (LD)step - dl[j]));
                fg[k] = drow[j];
                fv[k] = ((double)lp - (double)lm) / step;
                fs[k] = FD_LIB_TRUNC * trunc +
                        (5.9604644775390625e-8 * (fabs(lp) + fabs(lm)) + (double)(rp.sl + rm.sl)) / step +
                        1.1920928955078125e-7 * fabs((double)dl[j]) + (double)ds[j] + 1e-300;
            }
        }
        fdlib_total += k;
        snprintf(nm, sizeof nm, "%s fused dlogits vs fd of the forward", name);
        if (k > 0) check_close_ex(nm, fg, fv, fs, k, 0.0, 0.0);
        free(row); free(drow); free(fg); free(fv); free(fs);
    }

    free(x); free(x_in); free(t32); free(t64); free(ign); free(gl); free(ws); free(lref); free(lsl); free(dref);
    free(dsl); free(got); free(xr); free(dl); free(ds); free(loss); free(loss2); free(dx); free(dx2);
}

/* ---- pytorch-loss (CoinCheung) LargeMarginSoftmaxV1, literally, in double ---------------------- */
/*   coeff = 1 / (C - 1); lb = label, 0 where ignored; idx = one_hot(lb)
 *   lgts = logits - idx * 1e6;  q = lgts.softmax(1) * (1 - idx);  log_q = lgts.log_softmax(1) * (1 - idx)
 *   mg = (((q - coeff) * log_q) * (lam / 2) * (1 - idx)).sum(1);  ce = CrossEntropyLoss(none, ignore_index)
 *   loss = (ce + mg)[mask == 0];  mean / sum / (none: the rows not ignored, compacted) */
static void pytorch_loss_lm(const float* x, int64_t ld, const int64_t* lab, int64_t N, int64_t C, double lam,
                            int64_t ignore_index, double* rows, int64_t* nrows, double* sum) {
    double* lg = tu_xmalloc((size_t)C * 8);
    const double coeff = 1.0 / ((double)C - 1.0);
    *nrows = 0;
    *sum = 0;
    for (int64_t i = 0; i < N; i++) {
        const int mask = lab[i] == ignore_index;
        const int64_t lb = mask ? 0 : lab[i];
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < C; j++) {
            lg[j] = (double)x[i * ld + j] - (j == lb ? 1e6 : 0.0);
            if (lg[j] > mx) mx = lg[j];
        }
        for (int64_t j = 0; j < C; j++) s += exp(lg[j] - mx);
        double mg = 0;
        for (int64_t j = 0; j < C; j++) {
            const double idx = j == lb ? 1.0 : 0.0;
            const double q = exp(lg[j] - mx) / s * (1.0 - idx);
            const double log_q = (lg[j] - mx - log(s)) * (1.0 - idx);
            mg += ((q - coeff) * log_q) * (lam / 2) * (1.0 - idx);
        }
        if (mask) continue;
        double m2 = -INFINITY, s2 = 0;   /* CrossEntropyLoss: log_softmax + nll */
        for (int64_t j = 0; j < C; j++) if ((double)x[i * ld + j] > m2) m2 = (double)x[i * ld + j];
        for (int64_t j = 0; j < C; j++) s2 += exp((double)x[i * ld + j] - m2);
        const double ce = -((double)x[i * ld + lab[i]] - m2 - log(s2));
        rows[(*nrows)++] = ce + mg;
        *sum += ce + mg;
    }
    free(lg);
}

/* ---- closed forms and edge cases -------------------------------------------------------------- */
static int close_rel(double got, double want, double rtol, double atol) {
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static void test_values(void) {
    size_t wsb;
    fl_large_margin_ce_workspace_size(&wsb, 64, 64, FL_DTYPE_F32, NULL);
    void* ws = tu_xmalloc(wsb);
    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT;
    float L[64], Dx[64], L0[64], D0[64];
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};

    /* C = 2: q = 1 over the one non-target class, log q = 0, so the regulariser vanishes for every
     * lambda and l = plain CE: x = (1.25, 1.25): l = log 2, dx = g (-1/2, 1/2); random rows: the
     * lambda = 1.7 results bitwise those of lambda = 0 */
    {
        const float xv[2] = {1.25f, 1.25f};
        const int32_t y[1] = {0};
        const float lams[3] = {0.0f, 0.3f, 1.7f};
        for (int k = 0; k < 3; k++) {
            o.lambda = lams[k];
            o.reduction = FL_REDUCTION_SUM;
            tu_poison(L, sizeof L);
            tu_poison(Dx, sizeof Dx);
            CHECK_STATUS(fl_large_margin_ce_fused_cpu(L, Dx, xv, 2, y, FL_INDEX_I32, NULL, 0.5f, 1, 2, FL_DTYPE_F32, &o,
                                                      ws, wsb), FL_OK, "closed form C = 2");
            CHECK(close_rel(L[0], log(2.0), 6e-8, 0) && Dx[0] == -0.25f && Dx[1] == 0.25f,
                  "lambda %g, C = 2, x = (1.25, 1.25): loss %.9g (want log 2), dx (%.9g %.9g) (want -0.25 0.25)",
                  (double)lams[k], L[0], Dx[0], Dx[1]);
        }
        enum { NN = 16 };
        float xr[2 * NN];
        int64_t yr[NN];
        tu_rng r = tu_rng_seed(777);
        for (int k = 0; k < 2 * NN; k++) xr[k] = (float)tu_uniform_in(&r, -6.0, 6.0);
        for (int i = 0; i < NN; i++) yr[i] = tu_int_in(&r, 0, 1);
        o.reduction = FL_REDUCTION_NONE;
        o.lambda = 0.0f;
        CHECK_STATUS(fl_large_margin_ce_fused_cpu(L0, D0, xr, 2, yr, FL_INDEX_I64, NULL, 1.0f, NN, 2, FL_DTYPE_F32, &o,
                                                  NULL, 0), FL_OK, "C = 2 lambda 0");
        o.lambda = 1.7f;
        CHECK_STATUS(fl_large_margin_ce_fused_cpu(L, Dx, xr, 2, yr, FL_INDEX_I64, NULL, 1.0f, NN, 2, FL_DTYPE_F32, &o,
                                                  NULL, 0), FL_OK, "C = 2 lambda 1.7");
        CHECK(memcmp(L, L0, NN * 4) == 0 && memcmp(Dx, D0, 2 * NN * 4) == 0,
              "C = 2: lambda 1.7 differs from lambda 0 (the regulariser must vanish)");
        o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    }
    /* constant rows (q uniform, the regulariser 0): l = log C, dx = g (1/C - [j == y]), every dtype */
    for (int d = 0; d < 3; d++) {
        const float v = 2.5f;
        uint16_t h[7];
        float xf[7];
        for (int k = 0; k < 7; k++) {
            xf[k] = v;
            if (d) tu_store(h, dts[d], k, v);   /* (h holds 16-bit values only) */
        }
        const int64_t y[1] = {3};
        o.lambda = 1.7f;
        o.reduction = FL_REDUCTION_MEAN;
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        const void* xin = d == 0 ? (const void*)xf : (const void*)h;
        CHECK_STATUS(fl_large_margin_ce_fused_cpu(L, Dx, xin, 7, y, FL_INDEX_I64, NULL, -2.0f, 1, 7, dts[d], &o, ws,
                                                  wsb), FL_OK, "constant row");
        int ok = close_rel(L[0], log(7.0), 1.2e-7, 1e-15);
        for (int k = 0; k < 7; k++)
            ok &= close_rel(tu_load(Dx, dts[d], k), -2.0 * (1.0 / 7 - (k == 3)), RTOL_DX[dts[d]], 1e-15);
        CHECK(ok, "%s constant row: loss %.9g (want log 7 = %.9g), dx[0] %.9g dx[3] %.9g (want %.9g %.9g)",
              tu_dtype_name(dts[d]), L[0], log(7.0), tu_load(Dx, dts[d], 0), tu_load(Dx, dts[d], 3), -2.0 / 7,
              -2.0 * (1.0 / 7 - 1));
        o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    }
    /* very large |x| (3e4, fp32) against the reference: no overflow, every target */
    {
        o.reduction = FL_REDUCTION_NONE;
        o.lambda = 0.3f;
        const float row[4] = {30000.0f, -30000.0f, 25000.0f, 0.5f};
        float xv[16];
        int64_t y[4];
        for (int i = 0; i < 4; i++) { memcpy(xv + 4 * i, row, sizeof row); y[i] = i; }
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        CHECK_STATUS(fl_large_margin_ce_fused_cpu(L, Dx, xv, 4, y, FL_INDEX_I64, NULL, 1.0f, 4, 4, FL_DTYPE_F32, &o,
                                                  NULL, 0), FL_OK, "|x| ~ 3e4");
        for (int i = 0; i < 4; i++) {
            LD xx[4] = {30000, -30000, 25000, 0.5L}, dd[4], ss[4];
            const ref_row_t rr = ref_row(xx, 4, y[i], (LD)0.3f, dd, ss);
            int ok = close_rel(L[i], (double)rr.l, RTOL_LOSS, (double)rr.sl);
            for (int j = 0; j < 4; j++)
                ok &= close_rel(Dx[4 * i + j], (double)dd[j], RTOL_DX[0], (double)ss[j] + 1e-45);
            CHECK(ok, "|x| ~ 3e4, y = %d: loss %.9g dx (%.9g %.9g %.9g %.9g), want %.9g (%.9g %.9g %.9g %.9g)", i, L[i],
                  Dx[4 * i], Dx[4 * i + 1], Dx[4 * i + 2], Dx[4 * i + 3], (double)rr.l, (double)dd[0], (double)dd[1],
                  (double)dd[2], (double)dd[3]);
        }
        o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    }
    /* the pytorch-loss module, literally (double), on random rows with ignored ones (its default
     * ignore_index 255): MEAN, SUM, and NONE against the module's compacted rows */
    {
        enum { NN = 9, CC = 19, LDR = 21 };
        float xv[NN * LDR];
        int64_t lab[NN];
        tu_rng r = tu_rng_seed(4242);
        for (int k = 0; k < NN * LDR; k++) xv[k] = (float)(2.5 * tu_normal(&r));
        for (int i = 0; i < NN; i++) lab[i] = i % 4 == 2 ? 255 : tu_int_in(&r, 0, CC - 1);
        const float lams[3] = {0.3f, 1.7f, 0.0f};
        for (int k = 0; k < 3; k++) {
            double rows[NN], tot;
            int64_t nr;
            pytorch_loss_lm(xv, LDR, lab, NN, CC, (double)lams[k], 255, rows, &nr, &tot);
            o.lambda = lams[k];
            o.ignore_index = 255;
            float l, ln[NN];
            o.reduction = FL_REDUCTION_MEAN;
            CHECK_STATUS(fl_large_margin_ce_forward_cpu(&l, xv, LDR, lab, FL_INDEX_I64, NN, CC, FL_DTYPE_F32, &o, ws,
                                                        wsb), FL_OK, "pytorch-loss comparison");
            CHECK(close_rel(l, tot / (double)nr, PT_RTOL, PT_ATOL), "lambda %g mean: loss %.9g, pytorch-loss %.9g",
                  (double)lams[k], l, tot / (double)nr);
            o.reduction = FL_REDUCTION_SUM;
            CHECK_STATUS(fl_large_margin_ce_forward_cpu(&l, xv, LDR, lab, FL_INDEX_I64, NN, CC, FL_DTYPE_F32, &o, ws,
                                                        wsb), FL_OK, "pytorch-loss comparison");
            CHECK(close_rel(l, tot, PT_RTOL, PT_ATOL), "lambda %g sum: loss %.9g, pytorch-loss %.9g", (double)lams[k],
                  l, tot);
            o.reduction = FL_REDUCTION_NONE;
            CHECK_STATUS(fl_large_margin_ce_forward_cpu(ln, xv, LDR, lab, FL_INDEX_I64, NN, CC, FL_DTYPE_F32, &o, NULL,
                                                        0), FL_OK, "pytorch-loss comparison");
            int ok = 1;
            int64_t q = 0;
            for (int i = 0; i < NN; i++) {
                if (lab[i] == 255) { ok &= ln[i] == 0.0f; continue; }
                ok &= q < nr && close_rel(ln[i], rows[q], PT_RTOL, PT_ATOL);
                q++;
            }
            CHECK(ok && q == nr, "lambda %g none: the rows differ from pytorch-loss's", (double)lams[k]);
        }
        /* every row ignored: the module's empty mean (NaN) and sum (0) */
        for (int i = 0; i < NN; i++) lab[i] = 255;
        for (int mean = 0; mean < 2; mean++) {
            o.reduction = mean ? FL_REDUCTION_MEAN : FL_REDUCTION_SUM;
            float l;
            CHECK_STATUS(fl_large_margin_ce_forward_cpu(&l, xv, LDR, lab, FL_INDEX_I64, NN, CC, FL_DTYPE_F32, &o, ws,
                                                        wsb), FL_OK, "all ignored (255)");
            CHECK(mean ? isnan(l) : tu_f32_bits(l) == 0, "all ignored %s: %g", mean ? "mean" : "sum", l);
        }
        o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    }
    /* every row ignored: MEAN NaN with zero gradient, SUM +0, NONE zeros; logits (NaN) not read */
    {
        float xv[24];
        for (int k = 0; k < 24; k++) xv[k] = NAN;
        const int64_t y[4] = {-100, -100, -100, -100};
        const fl_reduction reds[3] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            o.lambda = k == 1 ? 1.7f : 0.3f;
            tu_poison(L, sizeof L);
            tu_poison(Dx, sizeof Dx);
            CHECK_STATUS(fl_large_margin_ce_fused_cpu(L, Dx, xv, 6, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F32, &o,
                                                      ws, wsb), FL_OK, "all ignored");
            int zero = 1, pad = 1;
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 6; j++) {
                    if (j < 5) zero &= tu_bits(Dx, FL_DTYPE_F32, i * 6 + j) == 0;
                    else if (i < 3) pad &= tu_is_poison(Dx, 4, i * 6 + j);
                }
            if (k == 0) CHECK(isnan(L[0]), "all ignored MEAN = %g, want NaN", L[0]);
            else if (k == 1) CHECK(tu_f32_bits(L[0]) == 0, "all ignored SUM = %g, want +0", L[0]);
            else CHECK(tu_f32_bits(L[0]) == 0 && tu_f32_bits(L[1]) == 0 && tu_f32_bits(L[2]) == 0 &&
                       tu_f32_bits(L[3]) == 0, "all ignored NONE = %g %g %g %g", L[0], L[1], L[2], L[3]);
            CHECK(tu_is_poison(L, 4, k < 2 ? 1 : 4), "all ignored %s: loss past the end written", red_name(reds[k]));
            CHECK(zero, "all ignored %s: dlogits not all +0", red_name(reds[k]));
            CHECK(pad, "all ignored %s: dlogits padding written", red_name(reds[k]));
            CHECK_STATUS(fl_large_margin_ce_forward_cpu(L, xv, 6, y, FL_INDEX_I64, 4, 5, FL_DTYPE_F32, &o, ws, wsb),
                         FL_OK, "all ignored forward");
            CHECK(k == 0 ? isnan(L[0]) : L[0] == 0.0f, "all ignored forward %s = %g", red_name(reds[k]), L[0]);
        }
        o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    }
    /* N = 0: SUM 0, MEAN NaN, NONE writes nothing; NULL arrays fine */
    {
        const fl_reduction reds[3] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            size_t w0 = 7;
            CHECK_STATUS(fl_large_margin_ce_workspace_size(&w0, 0, 5, FL_DTYPE_BF16, &o), FL_OK, "N=0 size");
            CHECK(w0 == (k == 2 ? 0u : (size_t)FL__TAYLOR_WS_HEAD), "N = 0 %s workspace %zu", red_name(reds[k]), w0);
            L[0] = 5.0f;
            CHECK_STATUS(fl_large_margin_ce_forward_cpu(L, NULL, 5, NULL, FL_INDEX_I32, 0, 5, FL_DTYPE_BF16, &o,
                                                        k == 2 ? NULL : ws, w0), FL_OK, "N=0 forward");
            if (k == 0) CHECK(tu_f32_bits(L[0]) == 0, "N = 0 SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 NONE wrote the loss");
            L[0] = 5.0f;
            CHECK_STATUS(fl_large_margin_ce_fused_cpu(L, NULL, NULL, 5, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5,
                                                      FL_DTYPE_F16, &o, k == 2 ? NULL : ws, w0), FL_OK, "N=0 fused");
            if (k == 0) CHECK(tu_f32_bits(L[0]) == 0, "N = 0 fused SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 fused MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 fused NONE wrote the loss");
            CHECK_STATUS(fl_large_margin_ce_fused_cpu(NULL, NULL, NULL, 5, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5,
                                                      FL_DTYPE_F16, &o, k == 2 ? NULL : ws, w0), FL_OK,
                         "N=0 fused loss NULL");
        }
        o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    }
    /* the default options (opts NULL) are lambda 0.3, ignore_index -100, MEAN */
    {
        float xv[12] = {1, 2, 3, 0.5f, -1, 4, 2, 2.5f, 0.5f, -3, 1, 1.5f}, l1, l2, d1[12], d2[12];
        const int32_t y[4] = {-100, 2, 0, 1};
        CHECK_STATUS(fl_large_margin_ce_fused_cpu(&l1, d1, xv, 3, y, FL_INDEX_I32, NULL, 1.0f, 4, 3, FL_DTYPE_F32, NULL,
                                                  ws, wsb), FL_OK, "opts NULL");
        o.lambda = 0.3f;
        o.ignore_index = -100;
        o.reduction = FL_REDUCTION_MEAN;
        CHECK_STATUS(fl_large_margin_ce_fused_cpu(&l2, d2, xv, 3, y, FL_INDEX_I32, NULL, 1.0f, 4, 3, FL_DTYPE_F32, &o,
                                                  ws, wsb), FL_OK, "explicit defaults");
        CHECK(l1 == l2 && l1 > 0 && memcmp(d1, d2, sizeof d1) == 0, "opts NULL: %.9g, explicit defaults %.9g", l1, l2);
        const fl_large_margin_options init = FL_LARGE_MARGIN_OPTIONS_INIT;
        CHECK(init.struct_size == sizeof(fl_large_margin_options) && init.lambda == 0.3f && init.ignore_index == -100 &&
              init.reduction == FL_REDUCTION_MEAN && init.error_flag == NULL, "FL_LARGE_MARGIN_OPTIONS_INIT");
        o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    }
    free(ws);
}

/* ---- workspace size query ----------------------------------------------------------------------- */
static size_t al256(size_t x) { return (x + 255) / 256 * 256; }

static void test_workspace_size(void) {
    const int64_t Ns[7] = {0, 1, 63, 64, 65, 1000, (int64_t)1 << 20};
    const int64_t Cs[3] = {2, 1025, 131072};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const float lams[3] = {0.0f, 0.3f, 1.7f};
    int ok = 1;
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 3; b++)
            for (int ri = 0; ri < 3; ri++)
                for (int d = 0; d < 3; d++) {
                    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT;
                    fl_taylor_options ot = FL_TAYLOR_OPTIONS_INIT;
                    o.reduction = ot.reduction = reds[ri];
                    o.lambda = lams[(a + b + d) % 3];
                    size_t got = 12345, tay = 54321;
                    const fl_status st = fl_large_margin_ce_workspace_size(&got, Ns[a], Cs[b], dts[d], &o);
                    const fl_status st2 = fl_taylor_ce_workspace_size(&tay, Ns[a], Cs[b], dts[d], &ot);
                    const size_t want = ri == 0 ? 0 : FL__TAYLOR_WS_HEAD + al256(4 * (size_t)Ns[a]);
                    if (st != FL_OK || st2 != FL_OK || got != want || got != tay) {
                        if (ok)
                            printf("  fl_large_margin_ce_workspace_size(N=%lld, C=%lld, %s, %s) = %zu (status %d), "
                                   "want %zu (Taylor's %zu)\n", (long long)Ns[a], (long long)Cs[b],
                                   tu_dtype_name(dts[d]), red_name(reds[ri]), got, (int)st, want, tay);
                        ok = 0;
                    }
                }
    CHECK(ok, "workspace size: 0 for NONE, else %u + align256(4 N) = fl_taylor_ce_workspace_size, independent of C, "
          "dtype and lambda", (unsigned)FL__TAYLOR_WS_HEAD);
    {
        size_t b = 0;
        CHECK_STATUS(fl_large_margin_ce_workspace_size(&b, 10, 7, FL_DTYPE_F32, NULL), FL_OK, "size opts NULL");
        CHECK(b == FL__TAYLOR_WS_HEAD + 256, "opts NULL (MEAN): %zu", b);
        fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT;
        o.reduction = FL_REDUCTION_NONE;
        b = 9;
        CHECK_STATUS(fl_large_margin_ce_workspace_size(&b, INT64_MAX, 7, FL_DTYPE_F32, &o), FL_OK, "NONE, N huge");
        CHECK(b == 0, "NONE, N = INT64_MAX: %zu", b);
    }
}

/* ---- the validator: the resolved parameters ----------------------------------------------------- */
static void test_validator(void) {
    const char* fn = "fl_large_margin_ce_fused_cpu";
    unsigned char* x = aligned_alloc(256, 8192);
    unsigned char* dx = aligned_alloc(256, 8192);
    int64_t* y = aligned_alloc(256, 4096);
    memset(x, 0, 8192);
    memset(y, 0, 4096);
    float loss[64];
    size_t wsb;
    fl_large_margin_ce_workspace_size(&wsb, 64, 8, FL_DTYPE_F16, NULL);
    unsigned char* ws = aligned_alloc(256, (wsb + 256 + 255) / 256 * 256);
    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT;
    fl__large_margin_params p;
    /* the CPU takes any workspace alignment; the validator never reads the targets */
    y[0] = 99;
    fl_status st = fl__large_margin_validate(fn, FL__PASS_FUSED, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5,
                                             FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_OK, "validator: misaligned workspace or target 99 refused: %d %s", (int)st, fl_last_error());
    y[0] = 0;
    st = fl__large_margin_validate(fn, FL__PASS_FUSED, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F16,
                                   &o, ws, wsb - 1, &p);
    CHECK(st == FL_ERR_INSUFFICIENT_WORKSPACE && strstr(fl_last_error(), "fl_large_margin_ce_workspace_size"),
          "small workspace: %d %s", (int)st, fl_last_error());
    const fl_reduction reds[4] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    const float lams[4] = {0.0f, 0.3f, 1.7f, 1e-30f};
    for (int k = 0; k < 4; k++) {
        o.lambda = lams[k];
        o.reduction = reds[k];
        o.ignore_index = k == 3 ? (int64_t)1 << 40 : 42 + k;
        const int64_t N = 2 + k, C = 3 + k, ld = C + k;
        st = fl__large_margin_validate(fn, k == 2 ? FL__PASS_FORWARD : FL__PASS_FUSED, loss, k == 2 ? NULL : dx, x, ld,
                                       y, FL_INDEX_I32, NULL, 1.0f, N, C, FL_DTYPE_BF16, &o, ws, wsb, &p);
        CHECK(st == FL_OK, "validator params %d: %s", k, fl_last_error());
        CHECK(p.N == N && p.C == C && p.ld == ld && p.dtype == FL_DTYPE_BF16 && p.index_dtype == FL_INDEX_I32 &&
              p.lambda == o.lambda && p.ignore_index == o.ignore_index && p.reduction == o.reduction,
              "resolved parameters %d", k);
    }
    st = fl__large_margin_validate(fn, FL__PASS_FORWARD, loss, NULL, x, 8, y, FL_INDEX_I32, NULL, 1.0f, 4, 5,
                                   FL_DTYPE_BF16, NULL, ws, wsb, &p);
    CHECK(st == FL_OK && p.lambda == 0.3f && p.ignore_index == -100 && p.reduction == FL_REDUCTION_MEAN,
          "opts NULL: the defaults (%d %s)", (int)st, fl_last_error());
    free(x); free(dx); free(y); free(ws);
}

/* ---- bad arguments ------------------------------------------------------------------------------ */
/* status, a message naming the function, and no output written */
#define EXPECT(call_, want, what) ZT_EXPECT(call_, want, what, fnname, L, D)

static void test_errors(void) {
    /* N = 2 rows, C = 4 classes, ld = 8: the logits span X[0, 12) */
    float X[32], L[8], D[32], G[8];
    int64_t tg[8];
    int32_t t32[8];
    for (int k = 0; k < 32; k++) X[k] = (float)(k % 7) * 0.5f - 1.25f;
    for (int k = 0; k < 8; k++) { G[k] = 1.0f; tg[k] = k % 4; t32[k] = k % 4; }
    tg[1] = -100;
    t32[1] = -100;
    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT, ob;
    size_t wsb;
    fl_large_margin_ce_workspace_size(&wsb, 2, 4, FL_DTYPE_F32, &o);
    char* ws = tu_xmalloc(wsb + 512);
    const fl_dtype F = FL_DTYPE_F32;
    const fl_index_dtype I = FL_INDEX_I64;
    const char* fnname = "fl_large_margin_ce_forward_cpu";

#define FWD(loss_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_) \
    fl_large_margin_ce_forward_cpu(loss_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_)
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_OK, "valid forward");
    EXPECT(FWD(L, X, 8, tg, I, -1, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N < 0");
    CHECK(strstr(fl_last_error(), "N (-1)") != NULL, "N message: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, 1, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C = 1");
    CHECK(strstr(fl_last_error(), "C (1)") != NULL, "C = 1 message: %s", fl_last_error());
    EXPECT(FWD(L, X, 1, tg, I, 0, 1, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C = 1, N = 0");
    EXPECT(FWD(L, X, 8, tg, I, 2, 0, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C = 0");
    EXPECT(FWD(L, X, 8, tg, I, 2, -3, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C < 0");
    EXPECT(FWD(L, X, 8, tg, I, 2, 2, F, &o, ws, wsb), FL_OK, "C = 2");
    EXPECT(FWD(L, X, 3, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld < C");
    CHECK(strstr(fl_last_error(), "ld (3)") != NULL, "ld message: %s", fl_last_error());
    EXPECT(FWD(L, X, 4, tg, I, 2, 4, F, &o, ws, wsb), FL_OK, "ld == C");
    EXPECT(FWD(L, X, INT64_MAX / 4, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N*ld overflow");
    EXPECT(FWD(NULL, X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL");
    CHECK(strstr(fl_last_error(), "loss") != NULL, "loss message: %s", fl_last_error());
    EXPECT(FWD(NULL, NULL, 8, NULL, I, 0, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL, N = 0");
    EXPECT(FWD(L, NULL, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "logits NULL");
    CHECK(strstr(fl_last_error(), "logits") != NULL, "logits message: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, NULL, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "targets NULL");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "targets message: %s", fl_last_error());
    EXPECT(FWD(L, NULL, 8, NULL, I, 0, 4, F, &o, ws, wsb), FL_OK, "N = 0, NULL arrays");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, (fl_dtype)7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dtype 7");
    EXPECT(FWD(L, X, 8, tg, (fl_index_dtype)5, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "index_dtype 5");
    EXPECT(FWD(L, X, 8, t32, FL_INDEX_I32, 2, 4, F, &o, ws, wsb), FL_OK, "int32 targets");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, FL_DTYPE_BF16, &o, ws, wsb), FL_OK, "bf16 logits");
    EXPECT(FWD(L, NULL, 8, tg, I, 2, 4, F, NULL, ws, wsb), FL_ERR_INVALID_ARGUMENT, "opts NULL, logits NULL");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, NULL, ws, wsb), FL_OK, "opts NULL");
    /* lambda: finite and >= 0 */
    {
        const float bad[6] = {-0.5f, -1e-30f, -FLT_MIN, NAN, INFINITY, -INFINITY};
        for (int k = 0; k < 6; k++) {
            ob = o;
            ob.lambda = bad[k];
            EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad lambda");
            CHECK(strstr(fl_last_error(), "lambda") != NULL, "lambda %g message: %s", (double)bad[k], fl_last_error());
        }
        const float good[4] = {0.0f, -0.0f, 1e-30f, 100.0f};
        for (int k = 0; k < 4; k++) {
            ob = o;
            ob.lambda = good[k];
            EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_OK, "valid lambda");
        }
    }
    const int reds[3] = {7, -1, 3};   /* 3 = FL_REDUCTION_BATCHMEAN (distillation only) */
    for (int k = 0; k < 3; k++) {
        ob = o;
        ob.reduction = (fl_reduction)reds[k];
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad reduction");
        CHECK(strstr(fl_last_error(), "reduction") != NULL, "reduction %d message: %s", reds[k], fl_last_error());
    }
    ob = o;
    ob.struct_size = sizeof(fl_large_margin_options) - 8;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size - 8");
    CHECK(strstr(fl_last_error(), "struct_size") != NULL, "struct_size message: %s", fl_last_error());
    ob.struct_size = 0;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size 0");
    ob.struct_size = sizeof(fl_large_margin_options) + 8;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size + 8");
    /* error_flag is reserved for CUDA: the CPU accepts it and never writes it */
    {
        int32_t flag = 7;
        ob = o;
        ob.error_flag = &flag;
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_OK, "with error_flag");
        CHECK(flag == 7, "the CPU backend wrote *error_flag (%d)", (int)flag);
    }
    /* alignment */
    EXPECT(FWD(L, (char*)X + 2, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fp32 logits misaligned");
    CHECK(strstr(fl_last_error(), "aligned") != NULL, "alignment message: %s", fl_last_error());
    EXPECT(FWD(L, (char*)X + 2, 8, tg, I, 2, 4, FL_DTYPE_F16, &o, ws, wsb), FL_OK, "fp16: 2-byte aligned fine");
    EXPECT(FWD(L, (char*)X + 1, 8, tg, I, 2, 4, FL_DTYPE_BF16, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "bf16 logits misaligned");
    EXPECT(FWD(L, X, 8, (char*)tg + 4, I, 1, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "int64 targets misaligned");
    EXPECT(FWD(L, X, 8, (char*)t32 + 2, FL_INDEX_I32, 1, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "int32 targets misaligned");
    EXPECT(FWD((float*)((char*)L + 2), X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss misaligned");
    /* workspace */
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL");
    CHECK(strstr(fl_last_error(), "workspace") != NULL, "workspace message: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace (MEAN)");
    CHECK(strstr(fl_last_error(), "fl_large_margin_ce_workspace_size") != NULL, "workspace hint: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "zero workspace (MEAN)");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, NULL, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "NULL, 0 bytes (MEAN)");
    ob = o;
    ob.reduction = FL_REDUCTION_SUM;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace (SUM)");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, NULL, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "NULL, 0 bytes (SUM)");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_OK, "SUM: exact workspace");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws + 1, wsb), FL_OK, "CPU: unaligned workspace fine");
    ob = o;
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, NULL, 0), FL_OK, "NONE: no workspace");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, (void*)X, 4096), FL_OK, "NONE: the workspace is ignored (no overlap)");
    /* aliasing */
    EXPECT(FWD(X + 3, X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps logits");
    CHECK(strstr(fl_last_error(), "overlaps logits") != NULL, "loss / logits message: %s", fl_last_error());
    EXPECT(FWD(X + 5, X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss in the padding between rows");
    EXPECT(FWD(X + 11, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss [N] overlaps logits end");
    EXPECT(FWD(X + 12, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_OK, "loss [N] right after the logits");
    EXPECT(FWD((float*)(tg + 1), X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps targets");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "loss / targets message: %s", fl_last_error());
    EXPECT(FWD((float*)(ws + 300), X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss overlaps workspace");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, (void*)X, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps logits");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, (void*)tg, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps targets");
    /* out-of-range targets: the first bad row is named, nothing written */
    {
        int64_t tb[8];
        int32_t tb32[8];
        memcpy(tb, tg, sizeof tb);
        memcpy(tb32, t32, sizeof tb32);
        tb[1] = 4;   /* C */
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target C");
        CHECK(strstr(fl_last_error(), "targets[1] = 4") != NULL, "target C message: %s", fl_last_error());
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &ob, NULL, 0), FL_ERR_TARGET_OUT_OF_RANGE, "target C (NONE)");
        tb[1] = -7;
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target -7");
        CHECK(strstr(fl_last_error(), "targets[1] = -7") != NULL, "target -7 message: %s", fl_last_error());
        tb[0] = -1;
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target -1 first");
        CHECK(strstr(fl_last_error(), "targets[0] = -1") != NULL, "first bad row: %s", fl_last_error());
        tb[0] = 0;
        ob = o;
        ob.ignore_index = -7;   /* -7 is now ignored */
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &ob, ws, wsb), FL_OK, "ignore_index -7");
        tb32[0] = 1000;
        EXPECT(FWD(L, X, 8, tb32, FL_INDEX_I32, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "int32 target 1000");
        CHECK(strstr(fl_last_error(), "targets[0] = 1000") != NULL, "int32: %s", fl_last_error());
        tb32[0] = 255;
        EXPECT(FWD(L, X, 8, tb32, FL_INDEX_I32, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target 255");
        ob.ignore_index = 255;
        tb32[1] = 2;
        EXPECT(FWD(L, X, 8, tb32, FL_INDEX_I32, 2, 4, F, &ob, ws, wsb), FL_OK, "ignore_index 255");
        tb[1] = ((int64_t)1 << 32) + 1;   /* truncates to 1 */
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target 2^32 + 1");
        tb[1] = (int64_t)1 << 40;
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target 2^40");
        CHECK(strstr(fl_last_error(), "targets[1] = 1099511627776") != NULL, "2^40: %s", fl_last_error());
        ob.ignore_index = (int64_t)1 << 40;
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &ob, ws, wsb), FL_OK, "ignore_index 2^40 (int64 targets)");
        fnname = "fl_large_margin_ce_fused_cpu";
        EXPECT(fl_large_margin_ce_fused_cpu(L, D, X, 8, tb, I, G, 1.0f, 2, 4, F, &o, ws, wsb),
               FL_ERR_TARGET_OUT_OF_RANGE, "fused target out of range");
        EXPECT(fl_large_margin_ce_fused_cpu(NULL, D, X, 8, tb, I, NULL, 1.0f, 2, 4, F, &o, ws, wsb),
               FL_ERR_TARGET_OUT_OF_RANGE, "fused loss NULL, target out of range");
        ob = o;
        ob.reduction = FL_REDUCTION_NONE;
        EXPECT(fl_large_margin_ce_fused_cpu(L, D, X, 8, tb, I, G, 1.0f, 2, 4, F, &ob, NULL, 0),
               FL_ERR_TARGET_OUT_OF_RANGE, "fused NONE target out of range");
        memcpy(D, X, sizeof X);   /* in place: the logits must survive the refusal */
        {
            const fl_status st = fl_large_margin_ce_fused_cpu(L, D, D, 8, tb, I, G, 1.0f, 2, 4, F, &o, ws, wsb);
            CHECK_STATUS(st, FL_ERR_TARGET_OUT_OF_RANGE, "in place, target out of range");
            CHECK(memcmp(D, X, sizeof X) == 0, "in place, target out of range: the logits were written");
        }
        fnname = "fl_large_margin_ce_forward_cpu";
    }
#undef FWD

    fnname = "fl_large_margin_ce_fused_cpu";
#define FUS(loss_, dx_, x_, ld_, t_, gl_, gs_, N_, C_, o_, ws_, wsb_) \
    fl_large_margin_ce_fused_cpu(loss_, dx_, x_, ld_, t_, I, gl_, gs_, N_, C_, F, o_, ws_, wsb_)
    ob = o;
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_OK, "valid fused");
    EXPECT(FUS(NULL, D, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_OK, "fused loss NULL");
    EXPECT(FUS(L, NULL, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits NULL");
    CHECK(strstr(fl_last_error(), "dlogits") != NULL, "dlogits message: %s", fl_last_error());
    EXPECT(FUS(L, NULL, NULL, 8, NULL, NULL, 1.0f, 0, 4, &o, ws, wsb), FL_OK, "fused N = 0, NULL arrays");
    EXPECT(FUS(L, D, NULL, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused logits NULL");
    EXPECT(FUS(L, D, X, 8, NULL, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused targets NULL");
    EXPECT(FUS(L, D, X, 8, tg, G, NAN, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale NaN");
    CHECK(strstr(fl_last_error(), "grad_scale") != NULL, "grad_scale message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, 8, tg, G, INFINITY, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale inf");
    EXPECT(FUS(L, D, X, 8, tg, G, -INFINITY, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale -inf");
    EXPECT(FUS(L, D, X, 8, tg, G, 0.0f, 2, 4, &o, ws, wsb), FL_OK, "grad_scale 0");
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &o, ws, 100), FL_ERR_INSUFFICIENT_WORKSPACE, "fused small workspace");
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "fused workspace NULL");
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &ob, NULL, 0), FL_OK, "fused NONE: no workspace");
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, -3, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused N < 0");
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 1, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused C = 1");
    CHECK(strstr(fl_last_error(), "C (1)") != NULL, "fused C = 1 message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 0, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused C = 0");
    EXPECT(FUS(L, D, X, 3, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused ld < C");
    {
        fl_large_margin_options oc = o;
        oc.lambda = -0.3f;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused lambda < 0");
        oc.lambda = NAN;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused lambda NaN");
        oc.lambda = INFINITY;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused lambda inf");
        oc = o;
        oc.reduction = (fl_reduction)3;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused BATCHMEAN");
        oc = o;
        oc.struct_size = 8;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused struct_size");
    }
    EXPECT(FUS(L, (char*)D + 2, X, 8, tg, G, 1.0f, 1, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits misaligned");
    EXPECT(FUS(L, D, X, 8, tg, (const float*)((const char*)G + 2), 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "grad_loss misaligned");
    EXPECT(FUS((float*)((char*)L + 1), D, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "fused loss misaligned");
    EXPECT(FUS(L, D, (char*)X + 2, 8, tg, G, 1.0f, 1, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "fused logits misaligned");
    EXPECT(FUS(L, X + 1, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "dlogits partially overlaps logits");
    CHECK(strstr(fl_last_error(), "in place") != NULL, "partial overlap message: %s", fl_last_error());
    EXPECT(FUS(L, X + 8, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits one row off");
    EXPECT(FUS(L, X + 12, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_OK, "dlogits right after the logits");
    EXPECT(FUS(L, (float*)tg, X, 8, tg, G, 1.0f, 1, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits == targets");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "dlogits / targets message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, 8, tg, D + 11, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps grad_loss");
    CHECK(strstr(fl_last_error(), "grad_loss") != NULL, "dlogits / grad_loss message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, 8, tg, D + 12, 1.0f, 2, 4, &o, ws, wsb), FL_OK, "grad_loss right after dlogits");
    EXPECT(FUS(D + 5, D, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps dlogits");
    CHECK(strstr(fl_last_error(), "loss") != NULL, "loss / dlogits message: %s", fl_last_error());
    EXPECT(FUS(L, D, X, 8, tg, L, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps grad_loss");
    EXPECT(FUS(L, D, X, 8, tg, L + 1, 1.0f, 2, 4, &ob, NULL, 0), FL_ERR_INVALID_ARGUMENT,
           "NONE: loss [N] overlaps grad_loss [N]");
    EXPECT(FUS(L, D, X, 8, tg, L + 2, 1.0f, 2, 4, &ob, NULL, 0), FL_OK, "NONE: grad_loss right after loss");
    EXPECT(FUS(L, D, X, 8, tg, L + 1, 1.0f, 2, 4, &o, ws, wsb), FL_OK, "MEAN: loss [1], grad_loss [1] adjacent");
    EXPECT(FUS(L, (float*)(ws + 256), X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "dlogits overlaps workspace");
    CHECK(strstr(fl_last_error(), "workspace") != NULL, "dlogits / workspace message: %s", fl_last_error());
    EXPECT(FUS(L, (float*)(ws + 256), X, 8, tg, G, 1.0f, 2, 4, &ob, ws, wsb), FL_OK,
           "NONE: dlogits in the (unused) workspace");
    EXPECT(FUS((float*)ws, D, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss overlaps workspace");
    EXPECT(FUS(L, D, X, 8, tg, (const float*)ws, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "workspace overlaps grad_loss");
    EXPECT(FUS(L, D, X, 8, tg, X, 1.0f, 2, 4, &o, ws, wsb), FL_OK, "grad_loss may alias the logits (inputs)");
    EXPECT(FUS(L, D, X, 8, tg, NULL, 1.0f, 2, 4, &o, ws, wsb), FL_OK, "grad_loss NULL");
    {   /* in place is allowed (D used as the logits) */
        memcpy(D, X, sizeof X);
        const fl_status st = FUS(L, D, D, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "in place dlogits == logits");
        CHECK(fl_last_error()[0] == 0, "in place: last error \"%s\"", fl_last_error());
    }
#undef FUS
    fnname = "fl_large_margin_ce_workspace_size";
    {
        size_t b = 77;
        EXPECT(fl_large_margin_ce_workspace_size(NULL, 2, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "bytes NULL");
        EXPECT(fl_large_margin_ce_workspace_size(&b, -1, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "size N < 0");
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 0, F, NULL), FL_ERR_INVALID_ARGUMENT, "size C = 0");
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, (fl_dtype)9, NULL), FL_ERR_INVALID_ARGUMENT, "size dtype");
        ob = o;
        ob.struct_size = 3;
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size struct_size");
        ob = o;
        ob.lambda = -1.0f;
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size lambda -1");
        ob.lambda = NAN;
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size lambda NaN");
        ob = o;
        ob.reduction = (fl_reduction)9;
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size reduction 9");
        EXPECT(fl_large_margin_ce_workspace_size(&b, INT64_MAX, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "size overflow");
        CHECK(strstr(fl_last_error(), "overflow") != NULL, "overflow message: %s", fl_last_error());
        CHECK(b == 77, "bytes written on error (%zu)", b);
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, F, NULL), FL_OK, "size valid");
        CHECK(b == FL__TAYLOR_WS_HEAD + 256, "size valid: %zu", b);
    }
    free(ws);
}

int main(void) {
    test_values();
    test_workspace_size();

    /* the grid: reduction x lambda x dtype x C x N, the other knobs cycled through coprime periods */
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    const float lams[3] = {0.0f, 0.3f, 1.7f};
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const int64_t Cs[5] = {2, 3, 10, 257, 1000};
    const int64_t Ns[3] = {1, 5, 129};
    const float gss[3] = {1.0f, 0.7f, -2.5f};
    uint64_t seed = 1;
    int k = 0, ncfg = 0;
    tu_quiet = 1;
    for (int ri = 0; ri < 3; ri++)
        for (int li = 0; li < 3; li++)
            for (int d = 0; d < 3; d++)
                for (int ci = 0; ci < 5; ci++)
                    for (int ni = 0; ni < 3; ni++, k++) {
                        cfg_t c;
                        memset(&c, 0, sizeof c);
                        c.N = Ns[ni];
                        c.C = Cs[ci];
                        c.dt = dts[d];
                        c.lam = lams[li];
                        c.red = reds[ri];
                        c.pad = k % 4 == 1 ? 5 : k % 4 == 3 ? 1 : 0;
                        c.tgt64 = (k / 2) % 2;
                        c.ignore_index = k % 3 == 2 ? 255 : -100;
                        c.ign_mode = k % 7 < 4 ? 1 : 0;
                        c.gl = (k % 5) & 1;
                        c.gscale = gss[(k / 7) % 3];
                        c.rot = k % KINDS;
                        run_cfg(&c, seed++);
                        ncfg++;
                    }
    /* every row ignored: each reduction and dtype, both ignore indices; N = 0: each reduction */
    for (int ri = 0; ri < 3; ri++)
        for (int m = 0; m < 2; m++) {
            cfg_t c;
            memset(&c, 0, sizeof c);
            c.N = 5; c.C = m ? 300 : 7; c.pad = 3; c.dt = dts[(ri + m) % 3]; c.lam = lams[(ri + m) % 3];
            c.red = reds[ri]; c.tgt64 = m; c.ignore_index = m ? 255 : -100; c.ign_mode = 2;
            c.gl = 1; c.gscale = 2.0f;
            run_cfg(&c, seed++);
            ncfg++;
            c.N = 0; c.ign_mode = 0; c.gl = m;
            run_cfg(&c, seed++);
            ncfg++;
        }
    tu_quiet = 0;
    printf("grid: %d configurations, %lld reference finite differences, %lld library finite differences, "
           "%lld lambda-0 values compared with the cross-entropy\n", ncfg, (long long)fdref_total,
           (long long)fdlib_total, (long long)ce_total);
    test_validator();
    test_errors();
    return tu_finish();
}
