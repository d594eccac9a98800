/* test_taylor_ce.c — CPU backend of the Taylor softmax cross-entropy (include/fusedloss.h section
 * 14) against an independent long-double reference written from the header's definitions: f_n by
 * Horner's rule on the series sum_k x^k / k! (the library sums powers), the loss as
 * log1p(sum_{k != y} f(x_k) / f(x_y)) (no cancellation; the library takes log S - log f(x_y)), the
 * target's gradient as -f'(x_y) (S - f(x_y)) / (S f(x_y)). The reference's analytic gradient is
 * itself checked by central finite differences of the reference loss (long double), and the
 * library's fused gradient by central finite differences of the library's own forward (fp32
 * losses, differenced in double) on small fp32 cases. Grid: order 2 and 4; every reduction;
 * fp32 / fp16 / bf16 logits (inputs rounded to the dtype first); int32 / int64 targets; ignore_index
 * -100 and 255 (255 out of range for C <= 255, a real class for C > 255), some rows / no rows
 * ignored (their logits NaN: never read), every row ignored (MEAN NaN, SUM 0); N from 0 to 1000, C
 * from 1 to 20000; ld > C with NaN / 30000 padding (neither read nor written); grad_loss NULL /
 * [1] (SUM, MEAN: the rest NaN, never read) / [N] (NONE); grad_scale 1, 0.7, -2.5; loss NULL in
 * fused; in place (dlogits == logits); every output poisoned before every call. Row kinds:
 * uniform, normal, near the minima of f (x ~ -1: f_2 = 1/2, f_2' = 0; x ~ -1.596 for f_4), large
 * |x| (50, and 300 for order 4), a tiny target probability, constant rows (l = log C), small |x|.
 * Also: closed forms (C = 2 at x = 0; f_2 at -1; f_4 at -1; C = 1), the pytorch-loss module
 * (TaylorSoftmax + log + F.nll_loss) re-implemented literally in double, default options, N = 0,
 * the workspace size query, the shared validator (CUDA-only workspace alignment, resolved
 * parameters), every bad argument's status and message (outputs untouched on error), out-of-range
 * targets (FL_ERR_TARGET_OUT_OF_RANGE, nothing written).
 *
 * Build / run: make test (this is build/test_taylor_ce). Prints "N passed, M failed".
 * SPDX-License-Identifier: MIT
 */
#include <float.h>
#include <math.h>

#include "rowloss_test_util.h"   /* fusedloss.h, test_util.h, zoo_test_util.h and the libc headers */
#include "../src/internal.h" /* fl__taylor_validate, fl__taylor_workspace_bytes, FL__TAYLOR_WS_HEAD */

/* ------------------------------------------------------------------------------------------
 * Tolerances, |lib - ref| <= atol + rtol*|ref| + slack, indexed by fl_dtype (F32 = 0, F16 = 1,
 * BF16 = 2). The reference is long double on the same dtype-rounded logits; the library computes
 * in double and rounds once to fp32 (loss) or through fp32 to the logits' dtype (dlogits).
 *   loss    : rtol RTOL_LOSS = 1 fp32 ulp (2^-23: the double -> fp32 rounding is half of it);
 *   dlogits : rtol 1 ulp of the dtype (2^-23 / 2^-10 / 2^-7: double -> fp32 -> dtype), atol one
 *             subnormal step of the dtype;
 *   slack   : the error of the library's double arithmetic, u = EPS_DBL (2 x 2^-53):
 *             A(x) = sum_{k <= n} |x|^k / k!, A'(x) = sum_{k < n} |x|^k / k! (f and f' are
 *             accurate to 8 u A, 8 u A' absolutely: cancellation near their minima / roots),
 *             eS  = u (C + 8 + 8 sum_k A(x_k) / S)         relative error of S (sum of C terms),
 *             efy = 8 u A(x_y) / f(x_y)                     relative error of f(x_y),
 *             loss: eS + efy + u (|log S| + |log f(x_y)|);  SUM / MEAN: the rows' sum + u N sum |l|;
 *             dx_j: |g| ((8 u A'_j + |f'_j| (eS + 2u)) / S + [j == y] (8 u A'_y + |f'_y| (efy + 2u)) / f_y);
 *   reference finite differences (long double, h = FD_H_REF max(1, |x|)): FD_REF_RTOL relative +
 *             FD_REF_ATOL (1 + |l|) / max(1, |x|);
 *   library finite differences (the library's fp32 forward at x +- h, h = FD_H_LIB max(1, |x|),
 *             both points rounded to fp32, differenced in double over the exact step): |fd - dx| <=
 *             T + (2^-24 (|l+| + |l-|) + 1e-15 (1 + |l+| + |l-|)) / step + 2^-23 |dx|, where T is
 *             the truncation error of that same step, measured exactly on the long-double
 *             reference (|fd_ref - dx_ref|, x FD_LIB_TRUNC): the fp32 rounding of the two losses
 *             is the only other error (about 3e-5 |l| here);
 *   pytorch-loss re-implementation (double, its operation order): PT_RTOL.
 * ---------------------------------------------------------------------------------------- */
static const double RTOL_LOSS = 1.1920928955078125e-7, ATOL_LOSS = 1.5e-45;
static const double RTOL_DX[3] = {1.1920928955078125e-7, 9.765625e-4, 7.8125e-3};
static const double ATOL_DX[3] = {1.5e-45, 5.97e-8, 9.2e-41};
static const double EPS_DBL = 2.220446049250313e-16;
static const long double FD_H_REF = 1e-6L;
static const double FD_REF_RTOL = 1e-7, FD_REF_ATOL = 1e-11;
static const double FD_H_LIB = 1.0 / 512.0, FD_LIB_TRUNC = 1.05;
static const double PT_RTOL = 1e-6;

typedef long double LD;


RL_DEFINE_OPS(OPS, fl_taylor_ce, fl_taylor_options);   /* the op, for the shared harness (rowloss_test_util.h) */

/* ---- reference ---------------------------------------------------------------------------- */

/* f_n(x) = sum_{k <= n} x^k / k! by Horner's rule; f_n' = f_{n-1}; A_n(x) = f_n(|x|) */
static LD ref_fk(LD x, int k) {
    LD v = 1;
    for (int m = k; m >= 1; m--) v = 1 + v * x / m;   /* 1 + x/1 (1 + x/2 (1 + x/3 (...))) */
    return v;
}
static LD ref_f(LD x, int n) { return ref_fk(x, n); }
static LD ref_df(LD x, int n) { return ref_fk(x, n - 1); }
static LD ref_A(LD x, int n) { return ref_fk(fabsl(x), n); }
static LD ref_dA(LD x, int n) { return ref_fk(fabsl(x), n - 1); }

typedef struct {
    LD l, S, fy, eS, efy, sl;   /* loss, S, f(x_y), relative errors of S and f(x_y), the loss's slack */
} ref_row_t;

/* one row: x[C] the dtype-rounded logits, y the target; dl (or NULL): d l / d x_j */
static ref_row_t ref_row(const LD* x, int64_t C, int64_t y, int n, LD* dl) {
    ref_row_t r;
    LD so = 0, sa = 0;   /* sum_{k != y} f(x_k), sum_k A(x_k) */
    for (int64_t k = 0; k < C; k++) {
        if (k != y) so += ref_f(x[k], n);
        sa += ref_A(x[k], n);
    }
    r.fy = ref_f(x[y], n);
    r.S = so + r.fy;
    r.l = log1pl(so / r.fy);
    r.eS = (LD)EPS_DBL * ((LD)C + 8 + 8 * sa / r.S);
    r.efy = (LD)EPS_DBL * 8 * ref_A(x[y], n) / r.fy;
    r.sl = r.eS + r.efy + (LD)EPS_DBL * (fabsl(logl(r.S)) + fabsl(logl(r.fy)));
    if (dl) {
        for (int64_t j = 0; j < C; j++)
            if (j != y) dl[j] = ref_df(x[j], n) / r.S;
        dl[y] = -ref_df(x[y], n) * (so / r.S) / r.fy;   /* f'(x_y) (1/S - 1/f_y), no cancellation */
    }
    return r;
}

/* the slack of the library's double arithmetic for dx_j (without the factor |g|) */
static double ref_dslack(const ref_row_t* rr, const LD* x, int64_t j, int64_t y, int n) {
    const LD u = (LD)EPS_DBL;
    LD s = (8 * u * ref_dA(x[j], n) + fabsl(ref_df(x[j], n)) * (rr->eS + 2 * u)) / rr->S;
    if (j == y) s += (8 * u * ref_dA(x[y], n) + fabsl(ref_df(x[y], n)) * (rr->efy + 2 * u)) / rr->fy;
    return (double)s;
}

/* the reference for rl_check_lib_fd: ctx the order n (no loss slack: the library's double error is
 * 1e-15 (1 + |l+| + |l-|) of the fp32 losses) */
static LD ref_fd_cb(const void* ctx, const LD* x, int64_t C, int64_t y, LD* dl, LD* ds, LD* sl) {
    (void)ds;
    if (sl) *sl = 0;
    return ref_row(x, C, y, *(const int*)ctx, dl).l;
}
static double fd_loss_slack(double lp, double lm, LD slp, LD slm) {
    (void)slp; (void)slm;
    return 1e-15 * (1 + fabs(lp) + fabs(lm));
}

/* the tolerance of the reference's finite differences: tctx the row's loss (LD) */
static double ref_fd_tol(const void* tctx, double fd, double an, LD sc) {
    (void)an;
    return FD_REF_RTOL * fabs(fd) + FD_REF_ATOL * (1 + (double)fabsl(*(const LD*)tctx)) / (double)sc;
}

/* ---- one configuration ------------------------------------------------------------------- */
typedef struct {
    int64_t N, C, pad;            /* ld = C + pad */
    fl_dtype dt;
    int order;
    fl_reduction red;
    int tgt64;                    /* targets int64 (else int32) */
    int64_t ignore_index;
    int ign_mode;                 /* 0: no row ignored, 1: about 30 %, 2: every row */
    int gl;                       /* grad_loss given */
    float gscale;
    int rot;                      /* row-kind rotation */
} cfg_t;

enum { KINDS = 7 };
static const double F4_MIN_X = -1.5960716379833215;   /* the real root of f_3: f_4's minimum (0.2706) */

/* row i (not ignored) of x, kind 0..KINDS-1; returns the value stored at the target (rounded) */
static void fill_row(const void* cfg, tu_rng* r, void* x, int64_t base, int64_t y, int kind) {
    const cfg_t* c = cfg;
    const int64_t C = c->C;
    const fl_dtype dt = c->dt;
    switch (kind) {
        case 1:   /* normal, scale 2 */
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, (float)(2.0 * tu_normal(r)));
            break;
        case 2:   /* near the minima of f: -1 (f_2 = 1/2, f_2' = 0), -1.596 (f_4's minimum) */
            for (int64_t j = 0; j < C; j++) {
                const double m = (c->order == 4 && j % 2) ? F4_MIN_X : -1.0;
                tu_store(x, dt, base + j, j % 3 == 0 ? (float)m : (float)(m + 1e-3 * tu_normal(r)));
            }
            break;
        case 3:   /* large |x|: +-50 every 7th column and at the target, +-300 every 11th for order 4 */
            for (int64_t j = 0; j < C; j++) {
                double v = tu_uniform_in(r, -3.0, 3.0);
                const double sg = tu_uniform(r) < 0.5 ? -1.0 : 1.0;
                if (j % 7 == 3) v = 50.0 * sg;
                if (c->order == 4 && j % 11 == 5) v = 300.0 * sg;
                tu_store(x, dt, base + j, (float)v);
            }
            tu_store(x, dt, base + y, tu_uniform(r) < 0.5 ? 50.0f : -50.0f);
            break;
        case 4:   /* a tiny target probability: f(x_y) at its minimum, the others large */
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, (float)tu_uniform_in(r, 1.0, 4.0));
            tu_store(x, dt, base + y, c->order == 2 ? -1.0f : (float)F4_MIN_X);
            break;
        case 5: { /* constant row: l = log C */
            const float v = (float)tu_uniform_in(r, -3.0, 3.0);
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, v);
            break;
        }
        case 6:   /* small |x| */
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, (float)tu_uniform_in(r, -0.5, 0.5));
            break;
        default:  /* uniform [-3, 3] */
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, (float)tu_uniform_in(r, -3.0, 3.0));
            break;
    }
}

static int64_t fdref_total = 0, fdlib_total = 0;   /* over the grid, printed at the end */

static void run_cfg(const cfg_t* c, uint64_t seed) {
    const int64_t N = c->N, C = c->C, ld = C + c->pad;
    const int n = c->order;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const size_t xbytes = (size_t)(N * ld) * es;
    tu_rng r = tu_rng_seed(seed);
    char name[256];
    char pre[32];
    snprintf(pre, sizeof pre, "n=%d", n);
    rl_cfg_name(name, sizeof name, pre, c->red, N, C, ld, c->dt, c->tgt64, c->ignore_index, c->ign_mode, c->gl,
                c->gscale);

    /* inputs (rl_make_inputs): ignored rows NaN (never read), padding alternately 30000 and NaN */
    rl_inputs in;
    rl_make_inputs(&in, N, C, ld, c->dt, c->tgt64, c->ignore_index, c->ign_mode, none, &r, fill_row, c, c->rot, KINDS);

    fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT;
    o.order = n;
    o.ignore_index = c->ignore_index;
    o.reduction = c->red;
    size_t wsb = 0;
    CHECK_STATUS(fl_taylor_ce_workspace_size(&wsb, N, C, c->dt, &o), FL_OK, "workspace size");
    void* ws = tu_xmalloc(wsb);
    tu_poison(ws, wsb);

    /* reference */
    const LD denom = c->red == FL_REDUCTION_MEAN ? (LD)in.D : 1;
    rl_ref R;
    rl_ref_alloc(&R, N, C, 0);
    for (int64_t i = 0; i < N; i++) {
        if (in.ign[i]) {
            rl_ref_zero_row(&R, i, C);
            continue;
        }
        const int64_t y = in.t64[i];
        for (int64_t j = 0; j < C; j++) R.xr[j] = tu_load(in.x, c->dt, i * ld + j);
        const ref_row_t rr = ref_row(R.xr, C, y, n, R.dl);
        const LD g = rl_ref_gain(c->gscale, c->gl ? in.gl : NULL, none, i, denom);
        rl_ref_add_row(&R, i, rr.l, rr.sl);
        for (int64_t j = 0; j < C; j++) {
            R.dref[i * C + j] = (double)(g * R.dl[j]);
            R.dsl[i * C + j] = (double)fabsl(g) * ref_dslack(&rr, R.xr, j, y, n);
        }
        /* the reference's analytic gradient against its own central differences: every column of
         * small rows, 6 (the target, the ends, three inside) of large ones; the first 3 rows */
        if (R.fdrows < 3) {
            R.fdrows++;
            rl_ref_fd_row(name, i, R.xr, C, y, R.dl, ref_fd_cb, &n, FD_H_REF, 1, ref_fd_tol, &rr.l, &R.fds);
        }
    }
    fdref_total += rl_ref_fd_report(name, &R.fds);

    double lred = 0, lredsl = 0;
    if (!none) rl_ref_reduce(c->red, R.sum, R.sumsl, R.sumabs, N, in.D, denom, EPS_DBL, &lred, &lredsl);

    rl_outs u;
    rl_outs_alloc(&u, nl, xbytes);

    /* forward, fused, fused with loss NULL, in place */
    const rl_case kc = {name, N, C, ld, c->dt, none, &in, c->gl ? in.gl : NULL, c->gscale, ws, wsb, R.lref,
                        R.lsl, &lred, &lredsl, R.dref, R.dsl, R.got, ATOL_LOSS, RTOL_LOSS, ATOL_DX[c->dt],
                        RTOL_DX[c->dt], 0};
    rl_check_outputs(&OPS, &o, &kc, &u);

    /* the library's fused gradient against central differences of the library's own forward
     * (small fp32 cases: every column of the first 3 rows not ignored; reduction NONE, g = 1) */
    if (c->dt == FL_DTYPE_F32 && C <= 16 && N > 0)
        fdlib_total += rl_check_lib_fd(&OPS, &o, name, &in, N, C, ld, ref_fd_cb, &n, fd_loss_slack, FD_H_LIB,
                                       FD_LIB_TRUNC, R.xr, R.dl, NULL);

    rl_free_inputs(&in);
    rl_ref_free(&R);
    rl_outs_free(&u);
    free(ws);
}

/* ---- pytorch-loss (CoinCheung), literally: TaylorSoftmax(dim=1, n) then log then F.nll_loss ------ */
/*   fn = torch.ones_like(x); denor = 1.
 *   for i in range(1, n+1): denor *= i; fn = fn + x.pow(i) / denor
 *   out = fn / fn.sum(dim=1, keepdims=True);  loss = F.nll_loss(out.log(), labels, reduction, ignore_index) */
static double pytorch_loss_taylor_ce(const float* x, int64_t ld, const int64_t* lab, int64_t N, int64_t C, int n,
                                     int64_t ignore_index, int mean) {
    double* fn = tu_xmalloc((size_t)C * 8);
    double tot = 0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) {
        if (lab[i] == ignore_index) continue;
        double s = 0, denor = 1;
        for (int64_t j = 0; j < C; j++) fn[j] = 1.0;
        for (int k = 1; k <= n; k++) {
            denor *= k;
            for (int64_t j = 0; j < C; j++) fn[j] = fn[j] + pow((double)x[i * ld + j], k) / denor;
        }
        for (int64_t j = 0; j < C; j++) s += fn[j];
        tot += -log(fn[lab[i]] / s);
        cnt++;
    }
    free(fn);
    return mean ? tot / (double)cnt : tot;   /* 0 / 0 = NaN when every row is ignored */
}

/* ---- closed forms and edge cases -------------------------------------------------------------- */
static void test_values(void) {
    size_t wsb;
    fl_taylor_ce_workspace_size(&wsb, 64, 64, FL_DTYPE_F32, NULL);
    void* ws = tu_xmalloc(wsb);
    fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT;
    float L[64], Dx[64];

    /* C = 2, x = (0, 0), y = 0, both orders: f = 1, f' = 1, S = 2: l = log 2, dx = g (-1/2, 1/2) */
    for (int n = 2; n <= 4; n += 2) {
        const float xv[2] = {0.0f, 0.0f};
        const int32_t y[1] = {0};
        o.order = n;
        o.reduction = FL_REDUCTION_SUM;
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        CHECK_STATUS(fl_taylor_ce_fused_cpu(L, Dx, xv, 2, y, FL_INDEX_I32, NULL, 0.5f, 1, 2, FL_DTYPE_F32, &o, ws, wsb),
                     FL_OK, "closed form C = 2");
        CHECK(close_rel(L[0], log(2.0), 6e-8, 0) && Dx[0] == -0.25f && Dx[1] == 0.25f,
              "n = %d, x = 0: loss %.9g (want log 2), dx (%.9g %.9g) (want -0.25 0.25)", n, L[0], Dx[0], Dx[1]);
    }
    /* order 2 at x = -1 (the minimum: f = 1/2, f' = 0): a row of -1 gives l = log C and dx = 0;
     * x = (-1, -1, 1), y = 2: f = (1/2, 1/2, 5/2), S = 7/2, l = log(7/5), dx = g (0, 0, 2/S - 2/f_y) */
    {
        o.order = 2;
        o.reduction = FL_REDUCTION_NONE;
        const float xa[4] = {-1, -1, -1, -1};
        const float xb[3] = {-1, -1, 1};
        const int64_t ya[1] = {1}, yb[1] = {2};
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        CHECK_STATUS(fl_taylor_ce_fused_cpu(L, Dx, xa, 4, ya, FL_INDEX_I64, NULL, 1.5f, 1, 4, FL_DTYPE_F32, &o, ws, wsb),
                     FL_OK, "f_2 at -1");
        CHECK(close_rel(L[0], log(4.0), 6e-8, 0) && Dx[0] == 0 && Dx[1] == 0 && Dx[2] == 0 && Dx[3] == 0,
              "f_2 at -1: loss %.9g (want log 4), dx (%g %g %g %g) (want 0)", L[0], Dx[0], Dx[1], Dx[2], Dx[3]);
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        CHECK_STATUS(fl_taylor_ce_fused_cpu(L, Dx, xb, 3, yb, FL_INDEX_I64, NULL, 1.5f, 1, 3, FL_DTYPE_F32, &o, ws, wsb),
                     FL_OK, "f_2 at (-1, -1, 1)");
        const double want = 1.5 * (2.0 / 3.5 - 2.0 / 2.5);
        CHECK(close_rel(L[0], log(1.4), 6e-8, 0) && Dx[0] == 0 && Dx[1] == 0 && close_rel(Dx[2], want, 6e-8, 0),
              "f_2 at (-1, -1, 1): loss %.9g (want %.9g), dx (%g %g %.9g) (want 0 0 %.9g)", L[0], log(1.4), Dx[0], Dx[1],
              Dx[2], want);
    }
    /* order 4 at x = -1: f = 3/8, f' = f_3(-1) = 1/3. x = (-1, 0), y = 0: S = 11/8, l = log(11/3),
     * dx = g (8/33 - 8/9, 8/11) */
    {
        o.order = 4;
        o.reduction = FL_REDUCTION_MEAN;
        const float xv[2] = {-1.0f, 0.0f};
        const int32_t y[1] = {0};
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        CHECK_STATUS(fl_taylor_ce_fused_cpu(L, Dx, xv, 2, y, FL_INDEX_I32, NULL, -2.0f, 1, 2, FL_DTYPE_F32, &o, ws, wsb),
                     FL_OK, "f_4 at -1");
        CHECK(close_rel(L[0], log(11.0 / 3.0), 6e-8, 0) && close_rel(Dx[0], -2.0 * (8.0 / 33 - 8.0 / 9), 6e-8, 0) &&
              close_rel(Dx[1], -2.0 * 8.0 / 11, 6e-8, 0), "f_4 at -1: loss %.9g dx (%.9g %.9g), want %.9g (%.9g %.9g)",
              L[0], Dx[0], Dx[1], log(11.0 / 3.0), -2.0 * (8.0 / 33 - 8.0 / 9), -2.0 * 8.0 / 11);
    }
    /* C = 1: p = 1 for any x: loss 0 and gradient 0 (both orders, every dtype) */
    {
        const float xs[6] = {-1.0f, 50.0f, -50.0f, 3.75f, -1.59375f, 0.125f};
        const int32_t y[6] = {0, 0, 0, 0, 0, 0};
        const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
        for (int n = 2; n <= 4; n += 2)
            for (int d = 0; d < 3; d++) {
                uint16_t h[6];
                if (d != 0)   /* fp32 reads xs itself (h holds 16-bit values only) */
                    for (int k = 0; k < 6; k++) tu_store(h, dts[d], k, xs[k]);
                o.order = n;
                o.reduction = FL_REDUCTION_NONE;
                tu_poison(L, sizeof L);
                tu_poison(Dx, sizeof Dx);
                const void* xin = d == 0 ? (const void*)xs : (const void*)h;
                CHECK_STATUS(fl_taylor_ce_fused_cpu(L, Dx, xin, 1, y, FL_INDEX_I32, NULL, 3.0f, 6, 1, dts[d], &o, ws,
                                                    wsb), FL_OK, "C = 1");
                int zero = 1;
                for (int k = 0; k < 6; k++) zero &= L[k] == 0.0f && tu_load(Dx, dts[d], k) == 0.0f;
                CHECK(zero, "n = %d %s, C = 1: loss / gradient not 0 (loss %g %g ..)", n, tu_dtype_name(dts[d]), L[0],
                      L[1]);
            }
    }
    /* large |x| for order 4 against the reference: x = (50, -50, 0.5), both targets */
    {
        o.order = 4;
        o.reduction = FL_REDUCTION_NONE;
        const float xv[6] = {50.0f, -50.0f, 0.5f, 50.0f, -50.0f, 0.5f};
        const int64_t y[2] = {0, 1};
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        CHECK_STATUS(fl_taylor_ce_fused_cpu(L, Dx, xv, 3, y, FL_INDEX_I64, NULL, 1.0f, 2, 3, FL_DTYPE_F32, &o, ws, wsb),
                     FL_OK, "large x");
        for (int i = 0; i < 2; i++) {
            LD xx[3] = {50, -50, 0.5L}, dd[3];
            const ref_row_t rr = ref_row(xx, 3, y[i], 4, dd);
            CHECK(close_rel(L[i], (double)rr.l, 1.2e-7, 0) && close_rel(Dx[3 * i], (double)dd[0], 1.2e-7, 0) &&
                  close_rel(Dx[3 * i + 1], (double)dd[1], 1.2e-7, 0) && close_rel(Dx[3 * i + 2], (double)dd[2], 1.2e-7, 0),
                  "large x, y = %lld: loss %.9g dx (%.9g %.9g %.9g), want %.9g (%.9g %.9g %.9g)", (long long)y[i], L[i],
                  Dx[3 * i], Dx[3 * i + 1], Dx[3 * i + 2], (double)rr.l, (double)dd[0], (double)dd[1], (double)dd[2]);
        }
    }
    /* the pytorch-loss module, literally (double), on random rows with ignored ones: MEAN and SUM */
    {
        enum { NN = 9, CC = 37, LDR = 40 };
        float xv[NN * LDR];
        int64_t lab[NN];
        tu_rng r = tu_rng_seed(4242);
        for (int k = 0; k < NN * LDR; k++) xv[k] = (float)(2.5 * tu_normal(&r));
        for (int i = 0; i < NN; i++) lab[i] = i % 4 == 2 ? -100 : tu_int_in(&r, 0, CC - 1);
        for (int n = 2; n <= 4; n += 2)
            for (int mean = 0; mean < 2; mean++) {
                o.order = n;
                o.reduction = mean ? FL_REDUCTION_MEAN : FL_REDUCTION_SUM;
                o.ignore_index = -100;
                float l;
                CHECK_STATUS(fl_taylor_ce_forward_cpu(&l, xv, LDR, lab, FL_INDEX_I64, NN, CC, FL_DTYPE_F32, &o, ws,
                                                      wsb), FL_OK, "pytorch-loss comparison");
                const double want = pytorch_loss_taylor_ce(xv, LDR, lab, NN, CC, n, -100, mean);
                CHECK(close_rel(l, want, PT_RTOL, 0), "n = %d %s: loss %.9g, pytorch-loss %.9g", n,
                      mean ? "mean" : "sum", l, want);
            }
        /* every row ignored: the module's 0 / 0 = NaN for mean, 0 for sum */
        for (int i = 0; i < NN; i++) lab[i] = 255;
        o.ignore_index = 255;
        o.order = 2;
        for (int mean = 0; mean < 2; mean++) {
            o.reduction = mean ? FL_REDUCTION_MEAN : FL_REDUCTION_SUM;
            float l;
            CHECK_STATUS(fl_taylor_ce_forward_cpu(&l, xv, LDR, lab, FL_INDEX_I64, NN, CC, FL_DTYPE_F32, &o, ws, wsb),
                         FL_OK, "all ignored (255)");
            const double want = pytorch_loss_taylor_ce(xv, LDR, lab, NN, CC, 2, 255, mean);
            CHECK(mean ? isnan(l) && isnan(want) : l == 0.0f && want == 0.0, "all ignored %s: %g, pytorch-loss %g",
                  mean ? "mean" : "sum", l, want);
        }
        o = (fl_taylor_options)FL_TAYLOR_OPTIONS_INIT;
    }
    /* every row ignored: MEAN NaN with zero gradient, SUM +0, NONE zeros (orders 2, 4, 2) */
    {
        fl_taylor_options oa[3] = {FL_TAYLOR_OPTIONS_INIT, FL_TAYLOR_OPTIONS_INIT, FL_TAYLOR_OPTIONS_INIT};
        const fl_reduction reds[3] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) { oa[k].reduction = reds[k]; oa[k].order = k == 1 ? 4 : 2; }
        const void* const po[3] = {&oa[0], &oa[1], &oa[2]};
        rl_check_all_ignored(&OPS, po, ws, wsb);
    }
    /* N = 0: SUM 0, MEAN NaN, NONE writes nothing; NULL arrays fine */
    rl_check_n0(&OPS, &o, FL__TAYLOR_WS_HEAD, ws);
    /* the default options (opts NULL) are order 2, ignore_index -100, MEAN */
    {
        float xv[12] = {1, 2, 3, 0.5f, -1, 4, 2, 2, 0.5f, -3, 1, 1}, l1, l2, d1[12], d2[12];
        const int32_t y[4] = {-100, 2, 0, 1};
        CHECK_STATUS(fl_taylor_ce_fused_cpu(&l1, d1, xv, 3, y, FL_INDEX_I32, NULL, 1.0f, 4, 3, FL_DTYPE_F32, NULL, ws,
                                            wsb), FL_OK, "opts NULL");
        o.order = 2;
        o.ignore_index = -100;
        o.reduction = FL_REDUCTION_MEAN;
        CHECK_STATUS(fl_taylor_ce_fused_cpu(&l2, d2, xv, 3, y, FL_INDEX_I32, NULL, 1.0f, 4, 3, FL_DTYPE_F32, &o, ws,
                                            wsb), FL_OK, "explicit defaults");
        CHECK(l1 == l2 && l1 > 0 && memcmp(d1, d2, sizeof d1) == 0, "opts NULL: %.9g, explicit defaults %.9g", l1, l2);
        const fl_taylor_options init = FL_TAYLOR_OPTIONS_INIT;
        CHECK(init.struct_size == sizeof(fl_taylor_options) && init.order == 2 && init.ignore_index == -100 &&
              init.reduction == FL_REDUCTION_MEAN && init.error_flag == NULL, "FL_TAYLOR_OPTIONS_INIT");
        o = (fl_taylor_options)FL_TAYLOR_OPTIONS_INIT;
    }
    free(ws);
}

/* ---- workspace size query ----------------------------------------------------------------------- */
static void test_workspace_size(void) {
    const int64_t Ns[7] = {0, 1, 63, 64, 65, 1000, (int64_t)1 << 20};
    const int64_t Cs[3] = {1, 1025, 131072};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    int ok = 1;
    for (int a = 0; a < 7; a++)
        for (int b = 0; b < 3; b++)
            for (int ri = 0; ri < 3; ri++)
                for (int d = 0; d < 3; d++) {
                    fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT;
                    o.reduction = reds[ri];
                    o.order = (a + b) % 2 ? 4 : 2;
                    size_t got = 12345;
                    const fl_status st = fl_taylor_ce_workspace_size(&got, Ns[a], Cs[b], dts[d], &o);
                    const size_t want = ri == 0 ? 0 : FL__TAYLOR_WS_HEAD + al256(4 * (size_t)Ns[a]);
                    if (st != FL_OK || got != want || got != fl__taylor_workspace_bytes(Ns[a], reds[ri])) {
                        if (ok)
                            printf("  fl_taylor_ce_workspace_size(N=%lld, C=%lld, %s, %s) = %zu (status %d), want %zu\n",
                                   (long long)Ns[a], (long long)Cs[b], tu_dtype_name(dts[d]), red_name(reds[ri]), got,
                                   (int)st, want);
                        ok = 0;
                    }
                }
    CHECK(ok, "workspace size: 0 for NONE, else %u + align256(4 N), independent of C, dtype and order",
          (unsigned)FL__TAYLOR_WS_HEAD);
    {
        size_t b = 0;
        CHECK_STATUS(fl_taylor_ce_workspace_size(&b, 10, 7, FL_DTYPE_F32, NULL), FL_OK, "size opts NULL");
        CHECK(b == FL__TAYLOR_WS_HEAD + 256, "opts NULL (MEAN): %zu", b);
        fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT;
        o.reduction = FL_REDUCTION_NONE;
        b = 9;
        CHECK_STATUS(fl_taylor_ce_workspace_size(&b, INT64_MAX, 7, FL_DTYPE_F32, &o), FL_OK, "NONE, N huge");
        CHECK(b == 0, "NONE, N = INT64_MAX: %zu", b);
    }
    /* overflow saturates internally */
    CHECK(fl__taylor_workspace_bytes(INT64_MAX, FL_REDUCTION_SUM) == SIZE_MAX, "N = INT64_MAX: not SIZE_MAX");
    CHECK(fl__taylor_workspace_bytes((int64_t)1 << 62, FL_REDUCTION_MEAN) == SIZE_MAX, "4 N > 2^64: not SIZE_MAX");
    CHECK(fl__taylor_workspace_bytes((int64_t)1 << 60, FL_REDUCTION_MEAN) == FL__TAYLOR_WS_HEAD + ((size_t)1 << 62),
          "N = 2^60: saturated");
    CHECK(fl__taylor_workspace_bytes(-5, FL_REDUCTION_SUM) == FL__TAYLOR_WS_HEAD, "N < 0: not clamped to 0");
}

/* ---- the shared validator: the CUDA-only rule and the resolved parameters ----------------------- */
static void test_validator(void) {
    const char* fn = "fl_taylor_ce_fused_cuda";
    unsigned char* x = aligned_alloc(256, 8192);
    unsigned char* dx = aligned_alloc(256, 8192);
    int64_t* y = aligned_alloc(256, 4096);
    memset(x, 0, 8192);
    memset(y, 0, 4096);
    float loss[64];
    int32_t flag;
    size_t wsb;
    fl_taylor_ce_workspace_size(&wsb, 64, 8, FL_DTYPE_F16, NULL);
    unsigned char* ws = aligned_alloc(256, (wsb + 256 + 255) / 256 * 256);
    fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT;
    fl__taylor_params p;
    fl_status st = fl__taylor_validate(fn, FL__PASS_FUSED, 1, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5,
                                       FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "aligned") && strstr(fl_last_error(), fn),
          "cuda: misaligned workspace: %d %s", (int)st, fl_last_error());
    st = fl__taylor_validate(fn, FL__PASS_FUSED, 0, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F16, &o,
                             ws + 16, wsb, &p);
    CHECK(st == FL_OK, "cpu: misaligned workspace refused: %d %s", (int)st, fl_last_error());
    st = fl__taylor_validate(fn, FL__PASS_FUSED, 1, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F16, &o,
                             ws, wsb - 1, &p);
    CHECK(st == FL_ERR_INSUFFICIENT_WORKSPACE && strstr(fl_last_error(), "fl_taylor_ce_workspace_size"),
          "cuda: small workspace: %d %s", (int)st, fl_last_error());
    o.reduction = FL_REDUCTION_NONE;   /* no workspace at all: any pointer, aligned or not, even NULL */
    st = fl__taylor_validate(fn, FL__PASS_FUSED, 1, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F16, &o,
                             ws + 16, 0, &p);
    CHECK(st == FL_OK, "cuda NONE: workspace (misaligned, 0 bytes) refused: %d %s", (int)st, fl_last_error());
    st = fl__taylor_validate(fn, FL__PASS_FUSED, 1, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F16, &o,
                             NULL, 0, &p);
    CHECK(st == FL_OK, "cuda NONE: workspace NULL refused: %d %s", (int)st, fl_last_error());
    o = (fl_taylor_options)FL_TAYLOR_OPTIONS_INIT;
    /* the validator never reads the targets (device memory for CUDA): out of range passes it */
    y[0] = 99;
    st = fl__taylor_validate(fn, FL__PASS_FUSED, 1, loss, dx, x, 8, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F16, &o,
                             ws, wsb, &p);
    CHECK(st == FL_OK, "validator read the targets: %d %s", (int)st, fl_last_error());
    y[0] = 0;
    /* resolved parameters */
    const fl_reduction reds[4] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    for (int k = 0; k < 4; k++) {
        o.order = k & 1 ? 4 : 2;
        o.reduction = reds[k];
        o.ignore_index = k == 3 ? (int64_t)1 << 40 : 42 + k;
        o.error_flag = k & 2 ? &flag : NULL;
        const int64_t N = 2 + k, C = 3 + k, ld = C + k;
        st = fl__taylor_validate(fn, k == 2 ? FL__PASS_FORWARD : FL__PASS_FUSED, 1, loss, k == 2 ? NULL : dx, x, ld, y,
                                 FL_INDEX_I32, NULL, 1.0f, N, C, FL_DTYPE_BF16, &o, ws, wsb, &p);
        CHECK(st == FL_OK, "validator params %d: %s", k, fl_last_error());
        CHECK(p.N == N && p.C == C && p.ld == ld && p.dtype == FL_DTYPE_BF16 && p.index_dtype == FL_INDEX_I32 &&
              p.order == o.order && p.ignore_index == o.ignore_index && p.reduction == o.reduction &&
              p.error_flag == o.error_flag, "resolved parameters %d", k);
    }
    st = fl__taylor_validate(fn, FL__PASS_FORWARD, 1, loss, NULL, x, 8, y, FL_INDEX_I32, NULL, 1.0f, 4, 5,
                             FL_DTYPE_BF16, NULL, ws, wsb, &p);
    CHECK(st == FL_OK && p.order == 2 && p.ignore_index == -100 && p.reduction == FL_REDUCTION_MEAN &&
          p.error_flag == NULL, "opts NULL: the defaults (%d %s)", (int)st, fl_last_error());
    free(x); free(dx); free(y); free(ws);
}

/* ---- bad arguments ------------------------------------------------------------------------------ */
/* status, a message naming the function, and no output written */
#define EXPECT(call_, want, what) ZT_EXPECT(call_, want, what, e.fnname, e.L, e.D)

static void test_errors(void) {
    fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT, ob;
    rl_err e;   /* N = 2 rows, C = 4 classes, ld = 8: the logits span X[0, 12) */
    rl_err_init(&e, &OPS, &o, 1.5f);
    RL_ERR_LOCALS(&e);

#define FWD(loss_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_) \
    fl_taylor_ce_forward_cpu(loss_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_)
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_OK, "valid forward");
    EXPECT(FWD(L, X, 8, tg, I, -1, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N < 0");
    CHECK(strstr(fl_last_error(), "N (-1)") != NULL, "N message: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, 0, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C = 0");
    CHECK(strstr(fl_last_error(), "C (0)") != NULL, "C message: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, -3, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C < 0");
    EXPECT(FWD(L, X, 3, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld < C");
    CHECK(strstr(fl_last_error(), "ld (3)") != NULL, "ld message: %s", fl_last_error());
    rl_err_forward_args(&e);
    const int32_t orders[6] = {3, 0, 1, 6, -2, 5};
    for (int k = 0; k < 6; k++) {
        ob = o;
        ob.order = orders[k];
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad order");
        CHECK(strstr(fl_last_error(), "order") != NULL, "order %d message: %s", (int)orders[k], fl_last_error());
    }
    rl_err_forward_opts(&e);
    rl_err_forward_align(&e);
    /* workspace */
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL");
    CHECK(strstr(fl_last_error(), "workspace") != NULL, "workspace message: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace");
    CHECK(strstr(fl_last_error(), "fl_taylor_ce_workspace_size") != NULL, "workspace hint: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "zero workspace");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, NULL, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "NULL, 0 bytes (MEAN)");
    rl_err_forward_alias(&e);
    ob = o;
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FWD(X + 12, X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_OK, "loss in the last row's padding");
    EXPECT(FWD(L, X, 8, (const void*)X, FL_INDEX_I32, 1, 4, F, &ob, NULL, 0), FL_ERR_TARGET_OUT_OF_RANGE,
           "targets may alias the logits (inputs): then out of range");
    rl_err_out_of_range(&e);
    {   /* the CPU never writes the error flag */
        int64_t tb[8];
        memcpy(tb, tg, sizeof tb);
        tb[1] = (int64_t)1 << 40;   /* out of range */
        int32_t flag = 7;
        ob = o;
        ob.error_flag = &flag;
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &ob, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "with error_flag");
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_OK, "valid, with error_flag");
        CHECK(flag == 7, "the CPU backend wrote *error_flag (%d)", (int)flag);
    }
#undef FWD

#define FUS(loss_, dx_, x_, ld_, t_, gl_, gs_, N_, C_, o_, ws_, wsb_) \
    fl_taylor_ce_fused_cpu(loss_, dx_, x_, ld_, t_, I, gl_, gs_, N_, C_, F, o_, ws_, wsb_)
    rl_err_fused_args(&e);   /* fnname: the fused */
    {
        fl_taylor_options oc = o;
        oc.order = 3;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused order 3");
    }
    rl_err_fused_opts(&e);
    rl_err_fused_alias(&e);
#undef FUS
    e.fnname = "fl_taylor_ce_workspace_size";
    {
        size_t b = 77;
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 0, F, NULL), FL_ERR_INVALID_ARGUMENT, "size C < 1");
        ob = o;
        ob.order = 3;
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size order 3");
        rl_err_workspace_size(&e, &b, FL__TAYLOR_WS_HEAD + 256);
    }
#ifndef FL_WITH_CUDA
    if (!fl_cuda_built()) {
        e.fnname = "fl_taylor_ce_forward_cuda";
        EXPECT(fl_taylor_ce_forward_cuda(L, X, 8, tg, I, 2, 4, F, &o, ws, wsb, NULL), FL_ERR_NOT_BUILT,
               "forward cuda not built");
        e.fnname = "fl_taylor_ce_fused_cuda";
        EXPECT(fl_taylor_ce_fused_cuda(L, D, X, 8, tg, I, G, 1.0f, 2, 4, F, &o, ws, wsb, NULL), FL_ERR_NOT_BUILT,
               "fused cuda not built");
    }
#endif
    free(ws);
}

int main(void) {
    test_values();
    test_workspace_size();

    /* the grid: order x dtype x shape, the other knobs cycled through coprime periods */
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const float gss[3] = {1.0f, 0.7f, -2.5f};
    static const int64_t shapes[][2] = {   /* N, C */
        {1, 1},   {3, 1},   {4, 2},    {7, 3},   {5, 10},   {16, 31},  {9, 32},   {6, 33},   {64, 7},   {2, 2},
        {3, 100}, {4, 255}, {3, 256},  {3, 300}, {2, 1000}, {2, 1025}, {2, 4099}, {1, 20000}, {0, 5},   {0, 1},
        {5, 16},  {11, 4},  {257, 5},  {1000, 2}, {129, 33},
    };
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    uint64_t seed = 1;
    int k = 0, ncfg = 0;
    tu_quiet = 1;
    for (int n = 2; n <= 4; n += 2)
        for (int d = 0; d < 3; d++)
            for (int s = 0; s < nshapes; s++, k++) {
                cfg_t c;
                memset(&c, 0, sizeof c);
                c.N = shapes[s][0];
                c.C = shapes[s][1];
                c.order = n;
                c.dt = dts[d];
                c.red = reds[(k + d) % 3];
                RL_CYCLE_KNOBS(c, k, gss, KINDS);
                run_cfg(&c, seed++);
                ncfg++;
            }
    /* every row ignored: each reduction and dtype, both orders and ignore indices */
    for (int ri = 0; ri < 3; ri++)
        for (int m = 0; m < 2; m++) {
            cfg_t c;
            memset(&c, 0, sizeof c);
            c.N = 5; c.C = m ? 300 : 7; c.pad = 3; c.dt = dts[(ri + m) % 3]; c.order = m ? 4 : 2;
            c.red = reds[ri]; c.tgt64 = m; c.ignore_index = m ? 255 : -100; c.ign_mode = 2;
            c.gl = 1; c.gscale = 2.0f;
            run_cfg(&c, seed++);
            ncfg++;
        }
    tu_quiet = 0;
    printf("grid: %d configurations, %lld reference finite differences, %lld library finite differences\n", ncfg,
           (long long)fdref_total, (long long)fdlib_total);
    test_validator();
    test_errors();
    return tu_finish();
}
