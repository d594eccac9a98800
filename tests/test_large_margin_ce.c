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

#include "rowloss_test_util.h"   /* fusedloss.h, test_util.h, zoo_test_util.h and the libc headers */
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


RL_DEFINE_OPS(OPS, fl_large_margin_ce, fl_large_margin_options);   /* the op, for the shared harness (rowloss_test_util.h) */

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

/* the reference for rl_check_lib_fd: ctx the lambda (LD); the losses' slack is the reference's */
static LD ref_fd_cb(const void* ctx, const LD* x, int64_t C, int64_t y, LD* dl, LD* ds, LD* sl) {
    const ref_row_t r = ref_row(x, C, y, *(const LD*)ctx, dl, ds);
    if (sl) *sl = r.sl;
    return r.l;
}
static double fd_loss_slack(double lp, double lm, LD slp, LD slm) {
    (void)lp; (void)lm;
    return (double)(slp + slm);
}

/* the tolerance of the reference's finite differences: tctx the row's max |x| (LD) */
static double ref_fd_tol(const void* tctx, double fd, double an, LD sc) {
    (void)fd; (void)sc;
    return FD_REF_RTOL * fabs(an) + FD_REF_ATOL * (1 + (double)*(const LD*)tctx);
}

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

/* store v rounded to dt, never an exact zero */
static void st_nz(void* x, fl_dtype dt, int64_t i, double v) {
    float f = (float)v;
    if (tu_round_to(dt, f) == 0.0f) f = 0.0625f;
    tu_store(x, dt, i, f);
}

enum { KINDS = 9 };

/* row kinds 0..KINDS-1 (the target y given) */
static void fill_row(const void* cfg, tu_rng* r, void* x, int64_t base, int64_t y, int kind) {
    const cfg_t* c = cfg;
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
    char pre[32];
    snprintf(pre, sizeof pre, "lam=%g", (double)c->lam);
    rl_cfg_name(name, sizeof name, pre, c->red, N, C, ld, c->dt, c->tgt64, c->ignore_index, c->ign_mode, c->gl,
                c->gscale);

    /* inputs (rl_make_inputs): ignored rows NaN (never read), padding alternately 30000 and NaN */
    rl_inputs in;
    rl_make_inputs(&in, N, C, ld, c->dt, c->tgt64, c->ignore_index, c->ign_mode, none, &r, fill_row, c, c->rot, KINDS);

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
    const LD denom = c->red == FL_REDUCTION_MEAN ? (LD)in.D : 1;
    const size_t ne = (size_t)(N * C) + 1;
    rl_ref R;
    rl_ref_alloc(&R, N, C, 1);
    for (int64_t i = 0; i < N; i++) {
        if (in.ign[i]) {
            rl_ref_zero_row(&R, i, C);
            continue;
        }
        const int64_t y = in.t64[i];
        LD M = 0;
        for (int64_t j = 0; j < C; j++) {
            R.xr[j] = tu_load(in.x, c->dt, i * ld + j);
            if (fabsl(R.xr[j]) > M) M = fabsl(R.xr[j]);
        }
        const ref_row_t rr = ref_row(R.xr, C, y, lam, R.dl, R.ds);
        const LD g = rl_ref_gain(c->gscale, c->gl ? in.gl : NULL, none, i, denom);
        rl_ref_add_row(&R, i, rr.l, rr.sl);
        for (int64_t j = 0; j < C; j++) {
            R.dref[i * C + j] = (double)(g * R.dl[j]);
            R.dsl[i * C + j] = (double)(fabsl(g) * (R.ds[j] + 3 * (LD)EPS_DBL * fabsl(R.dl[j])));
        }
        /* the reference's analytic gradient against its own central differences: every column of
         * small rows, 6 (the target, the ends, three inside) of large ones; the first 3 rows */
        if (R.fdrows < 3) {
            R.fdrows++;
            rl_ref_fd_row(name, i, R.xr, C, y, R.dl, ref_fd_cb, &lam, FD_H_REF, 0, ref_fd_tol, &M, &R.fds);
        }
    }
    fdref_total += rl_ref_fd_report(name, &R.fds);

    double lred = 0, lredsl = 0;
    if (!none) rl_ref_reduce(c->red, R.sum, R.sumsl, R.sumabs, N, in.D, denom, EPS_DBL, &lred, &lredsl);

    rl_outs u;
    rl_outs_alloc(&u, nl, xbytes);
    char nm[400];

    /* forward, fused, fused with loss NULL, in place */
    const rl_case kc = {name, N, C, ld, c->dt, none, &in, c->gl ? in.gl : NULL, c->gscale, ws, wsb, R.lref,
                        R.lsl, &lred, &lredsl, R.dref, R.dsl, R.got, ATOL_LOSS, RTOL_LOSS, ATOL_DX[c->dt],
                        RTOL_DX[c->dt], 1};
    const int fwd_ok = rl_check_outputs(&OPS, &o, &kc, &u);
    fl_status st;
    if (fwd_ok && !none && in.D == 0 && c->red == FL_REDUCTION_SUM)
        CHECK(tu_f32_bits(u.loss[0]) == 0, "%s forward loss: SUM over no rows = %g, want +0", name, u.loss[0]);

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
        st = fl_cross_entropy_fused_cpu(lce, NULL, dce, in.x, in.targets, c->gl ? in.gl : NULL, c->gscale, N, C, ld,
                                        c->dt, in.it, &co, cws, cwb);
        snprintf(nm, sizeof nm, "%s lambda 0 == cross-entropy", name);
        if (CHECK_STATUS(st, FL_OK, nm)) {
            double* a = tu_xmalloc(ne * 8);
            double* b = tu_xmalloc(ne * 8);
            double* s = tu_xmalloc(ne * 8);
            for (int64_t i = 0; i < nl; i++) {
                a[i] = u.loss[i];
                b[i] = lce[i];
                s[i] = CE_FACTOR * (none ? R.lsl[i] : lredsl);
            }
            snprintf(nm, sizeof nm, "%s lambda 0 loss == cross-entropy", name);
            check_close_ex(nm, a, b, s, nl, CE_FACTOR * ATOL_LOSS, CE_FACTOR * RTOL_LOSS);
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < C; j++) {
                    a[i * C + j] = tu_load(u.dx, c->dt, i * ld + j);
                    b[i * C + j] = tu_load(dce, c->dt, i * ld + j);
                    s[i * C + j] = CE_FACTOR * R.dsl[i * C + j];
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
    if (c->dt == FL_DTYPE_F32 && C <= 16 && N > 0)
        fdlib_total += rl_check_lib_fd(&OPS, &o, name, &in, N, C, ld, ref_fd_cb, &lam, fd_loss_slack, FD_H_LIB,
                                       FD_LIB_TRUNC, R.xr, R.dl, R.ds);

    rl_free_inputs(&in);
    rl_ref_free(&R);
    rl_outs_free(&u);
    free(ws);
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
    /* every row ignored: MEAN NaN with zero gradient, SUM +0, NONE zeros (lambda 0.3, 1.7, 0.3) */
    {
        fl_large_margin_options oa[3] = {FL_LARGE_MARGIN_OPTIONS_INIT, FL_LARGE_MARGIN_OPTIONS_INIT,
                                         FL_LARGE_MARGIN_OPTIONS_INIT};
        const fl_reduction reds[3] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) { oa[k].reduction = reds[k]; oa[k].lambda = k == 1 ? 1.7f : 0.3f; }
        const void* const po[3] = {&oa[0], &oa[1], &oa[2]};
        rl_check_all_ignored(&OPS, po, ws, wsb);
    }
    /* N = 0: SUM 0, MEAN NaN, NONE writes nothing; NULL arrays fine */
    rl_check_n0(&OPS, &o, FL__TAYLOR_WS_HEAD, ws);
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
    fl_status st = fl__large_margin_validate(fn, FL__PASS_FUSED, 0, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5,
                                             FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_OK, "validator: misaligned workspace or target 99 refused: %d %s", (int)st, fl_last_error());
    y[0] = 0;
    st = fl__large_margin_validate(fn, FL__PASS_FUSED, 0, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F16,
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
        st = fl__large_margin_validate(fn, k == 2 ? FL__PASS_FORWARD : FL__PASS_FUSED, 0, loss, k == 2 ? NULL : dx, x, ld,
                                       y, FL_INDEX_I32, NULL, 1.0f, N, C, FL_DTYPE_BF16, &o, ws, wsb, &p);
        CHECK(st == FL_OK, "validator params %d: %s", k, fl_last_error());
        CHECK(p.N == N && p.C == C && p.ld == ld && p.dtype == FL_DTYPE_BF16 && p.index_dtype == FL_INDEX_I32 &&
              p.lambda == o.lambda && p.ignore_index == o.ignore_index && p.reduction == o.reduction,
              "resolved parameters %d", k);
    }
    st = fl__large_margin_validate(fn, FL__PASS_FORWARD, 0, loss, NULL, x, 8, y, FL_INDEX_I32, NULL, 1.0f, 4, 5,
                                   FL_DTYPE_BF16, NULL, ws, wsb, &p);
    CHECK(st == FL_OK && p.lambda == 0.3f && p.ignore_index == -100 && p.reduction == FL_REDUCTION_MEAN,
          "opts NULL: the defaults (%d %s)", (int)st, fl_last_error());
    free(x); free(dx); free(y); free(ws);
}

/* ---- bad arguments ------------------------------------------------------------------------------ */
/* status, a message naming the function, and no output written */
#define EXPECT(call_, want, what) ZT_EXPECT(call_, want, what, e.fnname, e.L, e.D)

static void test_errors(void) {
    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT, ob;
    rl_err e;   /* N = 2 rows, C = 4 classes, ld = 8: the logits span X[0, 12) */
    rl_err_init(&e, &OPS, &o, 1.25f);
    RL_ERR_LOCALS(&e);

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
    rl_err_forward_args(&e);
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
    rl_err_forward_opts(&e);
    /* error_flag is reserved for CUDA: the CPU accepts it and never writes it */
    {
        int32_t flag = 7;
        ob = o;
        ob.error_flag = &flag;
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_OK, "with error_flag");
        CHECK(flag == 7, "the CPU backend wrote *error_flag (%d)", (int)flag);
    }
    rl_err_forward_align(&e);
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
    rl_err_forward_alias(&e);
    rl_err_out_of_range(&e);
    {   /* fused, NONE (no workspace) */
        int64_t tb[8];
        memcpy(tb, tg, sizeof tb);
        tb[1] = (int64_t)1 << 40;   /* out of range */
        e.fnname = "fl_large_margin_ce_fused_cpu";
        ob = o;
        ob.reduction = FL_REDUCTION_NONE;
        EXPECT(fl_large_margin_ce_fused_cpu(L, D, X, 8, tb, I, G, 1.0f, 2, 4, F, &ob, NULL, 0),
               FL_ERR_TARGET_OUT_OF_RANGE, "fused NONE target out of range");
    }
#undef FWD

#define FUS(loss_, dx_, x_, ld_, t_, gl_, gs_, N_, C_, o_, ws_, wsb_) \
    fl_large_margin_ce_fused_cpu(loss_, dx_, x_, ld_, t_, I, gl_, gs_, N_, C_, F, o_, ws_, wsb_)
    rl_err_fused_args(&e);   /* fnname: the fused */
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 1, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused C = 1");
    CHECK(strstr(fl_last_error(), "C (1)") != NULL, "fused C = 1 message: %s", fl_last_error());
    {
        fl_large_margin_options oc = o;
        oc.lambda = -0.3f;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused lambda < 0");
        oc.lambda = NAN;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused lambda NaN");
        oc.lambda = INFINITY;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused lambda inf");
    }
    rl_err_fused_opts(&e);
    rl_err_fused_alias(&e);
    EXPECT(FUS(L, D, (char*)X + 2, 8, tg, G, 1.0f, 1, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "fused logits misaligned");
#undef FUS
    e.fnname = "fl_large_margin_ce_workspace_size";
    {
        size_t b = 77;
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 0, F, NULL), FL_ERR_INVALID_ARGUMENT, "size C = 0");
        ob = o;
        ob.lambda = -1.0f;
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size lambda -1");
        ob.lambda = NAN;
        EXPECT(fl_large_margin_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size lambda NaN");
        rl_err_workspace_size(&e, &b, FL__TAYLOR_WS_HEAD + 256);
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
                        RL_CYCLE_KNOBS(c, k, gss, KINDS);
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
