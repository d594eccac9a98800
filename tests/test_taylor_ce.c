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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "zoo_test_util.h"
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

static const char* red_name(fl_reduction r) {
    return r == FL_REDUCTION_NONE ? "none" : r == FL_REDUCTION_MEAN ? "mean" : r == FL_REDUCTION_SUM ? "sum" : "?";
}

enum { KINDS = 7 };
static const double F4_MIN_X = -1.5960716379833215;   /* the real root of f_3: f_4's minimum (0.2706) */

/* row i (not ignored) of x, kind 0..KINDS-1; returns the value stored at the target (rounded) */
static void fill_row(const cfg_t* c, tu_rng* r, void* x, int64_t base, int64_t y, int kind) {
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
    snprintf(name, sizeof name, "n=%d %s N=%lld C=%lld ld=%lld %s i%d ign=%lld%s gl=%d gs=%g", n, red_name(c->red),
             (long long)N, (long long)C, (long long)ld, tu_dtype_name(c->dt), c->tgt64 ? 64 : 32,
             (long long)c->ignore_index, c->ign_mode == 2 ? "(all)" : c->ign_mode == 0 ? "(none)" : "", c->gl,
             c->gscale);

    /* inputs: everything poisoned (NaN) first, so ignored rows stay NaN (never read); padding
     * columns alternately +30000 (f(30000) ~ 1e8 / 3e16 would swamp S) and NaN */
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
            if (y == c->ignore_index) y = (y + 1) % C;   /* (an in-range ignore_index only with C > 256) */
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

    fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT;
    o.order = n;
    o.ignore_index = c->ignore_index;
    o.reduction = c->red;
    size_t wsb = 0;
    CHECK_STATUS(fl_taylor_ce_workspace_size(&wsb, N, C, c->dt, &o), FL_OK, "workspace size");
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
        for (int64_t j = 0; j < C; j++) xr[j] = tu_load(x, c->dt, i * ld + j);
        const ref_row_t rr = ref_row(xr, C, y, n, dl);
        const LD g = (LD)c->gscale * (c->gl ? (LD)gl[none ? i : 0] : 1) / denom;
        lref[i] = (double)rr.l;
        lsl[i] = (double)rr.sl;
        sum += rr.l;
        sumsl += rr.sl;
        sumabs += fabsl(rr.l);
        for (int64_t j = 0; j < C; j++) {
            dref[i * C + j] = (double)(g * dl[j]);
            dsl[i * C + j] = (double)fabsl(g) * ref_dslack(&rr, xr, j, y, n);
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
                const LD x0 = xr[j], sc = fabsl(x0) > 1 ? fabsl(x0) : 1, h = FD_H_REF * sc;
                xr[j] = x0 + h;
                const LD lp = ref_row(xr, C, y, n, NULL).l;
                xr[j] = x0 - h;
                const LD lm = ref_row(xr, C, y, n, NULL).l;
                xr[j] = x0;
                const double fd = (double)((lp - lm) / (2 * h));
                const double an = (double)dl[j];
                const double d = fabs(fd - an);
                const double tol = FD_REF_RTOL * fabs(fd) + FD_REF_ATOL * (1 + (double)fabsl(rr.l)) / (double)sc;
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
    fl_status st = fl_taylor_ce_forward_cpu(loss, x, ld, targets, it, N, C, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s forward", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s forward loss", name);
        if (none) {
            for (int64_t i = 0; i < N; i++) got[i] = loss[i];
            check_close_ex(nm, got, lref, lsl, N, ATOL_LOSS, RTOL_LOSS);
            int64_t badign = 0;
            for (int64_t i = 0; i < N; i++) badign += ign[i] && tu_f32_bits(loss[i]) != 0;
            CHECK(badign == 0, "%s: %lld ignored rows with a loss other than +0", nm, (long long)badign);
        } else {
            got[0] = loss[0];
            check_close_ex(nm, got, &lred, &lredsl, 1, ATOL_LOSS, RTOL_LOSS);
        }
        CHECK(tu_is_poison(loss, 4, nl), "%s: loss[%lld] (past the end) written", nm, (long long)nl);
        CHECK(memcmp(x, x_in, xbytes + 4) == 0, "%s: the logits were modified", nm);
    }

    /* fused, with loss */
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    tu_poison(dx, xbytes + 4);
    st = fl_taylor_ce_fused_cpu(loss2, dx, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s fused", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s fused loss == forward", name);
        check_bitwise(nm, loss2, loss, (size_t)(nl + 1) * 4);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < C; j++) got[i * C + j] = tu_load(dx, c->dt, i * ld + j);
        snprintf(nm, sizeof nm, "%s fused dlogits", name);
        check_close_ex(nm, got, dref, dsl, N * C, ATOL_DX[c->dt], RTOL_DX[c->dt]);
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
    st = fl_taylor_ce_fused_cpu(NULL, dx2, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s fused loss=NULL dlogits", name);
    if (CHECK_STATUS(st, FL_OK, nm)) check_bitwise(nm, dx2, dx, xbytes + 4);

    /* in place: dlogits == logits; expected: the first C columns of dx, the padding of x */
    memcpy(dx2, x, xbytes + 4);
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    st = fl_taylor_ce_fused_cpu(loss2, dx2, dx2, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o, ws,
                                wsb);
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

    /* the library's fused gradient against central differences of the library's own forward
     * (small fp32 cases: every column of the first 3 rows not ignored; reduction NONE, g = 1) */
    if (c->dt == FL_DTYPE_F32 && C <= 16 && N > 0) {
        fl_taylor_options o1 = o;
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
            ref_row(xr, C, y, n, dl);
            float l0;
            st = fl_taylor_ce_fused_cpu(&l0, drow, row, C, &y, FL_INDEX_I64, NULL, 1.0f, 1, C, FL_DTYPE_F32, &o1, NULL,
                                        0);
            CHECK_STATUS(st, FL_OK, "fd: fused row");
            for (int64_t j = 0; j < C; j++, k++) {
                const float x0 = row[j];
                const double h = FD_H_LIB * (fabs((double)x0) > 1 ? fabs((double)x0) : 1.0);
                const float xp = (float)((double)x0 + h), xm = (float)((double)x0 - h);
                const double step = (double)xp - (double)xm;
                float lp, lm;
                row[j] = xp;
                st = fl_taylor_ce_forward_cpu(&lp, row, C, &y, FL_INDEX_I64, 1, C, FL_DTYPE_F32, &o1, NULL, 0);
                row[j] = xm;
                fl_status st2 = fl_taylor_ce_forward_cpu(&lm, row, C, &y, FL_INDEX_I64, 1, C, FL_DTYPE_F32, &o1, NULL,
                                                         0);
                row[j] = x0;
                CHECK(st == FL_OK && st2 == FL_OK, "fd: forward status %d %d", (int)st, (int)st2);
                xr[j] = xp;
                const LD rp = ref_row(xr, C, y, n, NULL).l;
                xr[j] = xm;
                const LD rm = ref_row(xr, C, y, n, NULL).l;
                xr[j] = x0;
                const double trunc = fabs((double)((rp - rm) / (LD)step - dl[j]));
                fg[k] = drow[j];
                fv[k] = ((double)lp - (double)lm) / step;
                fs[k] = FD_LIB_TRUNC * trunc +
                        (5.9604644775390625e-8 * (fabs(lp) + fabs(lm)) + 1e-15 * (1 + fabs(lp) + fabs(lm))) / step +
                        1.1920928955078125e-7 * fabs((double)dl[j]) + 1e-300;
            }
        }
        fdlib_total += k;
        snprintf(nm, sizeof nm, "%s fused dlogits vs fd of the forward", name);
        if (k > 0) check_close_ex(nm, fg, fv, fs, k, 0.0, 0.0);
        free(row); free(drow); free(fg); free(fv); free(fs);
    }

    free(x); free(x_in); free(t32); free(t64); free(ign); free(gl); free(ws); free(lref); free(lsl); free(dref);
    free(dsl); free(got); free(xr); free(dl); free(loss); free(loss2); free(dx); free(dx2);
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
static int close_rel(double got, double want, double rtol, double atol) {
    return fabs(got - want) <= atol + rtol * fabs(want);
}

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
    /* every row ignored: MEAN NaN with zero gradient, SUM +0, NONE zeros; logits (NaN) not read */
    {
        float xv[24];
        for (int k = 0; k < 24; k++) xv[k] = NAN;
        const int64_t y[4] = {-100, -100, -100, -100};
        const fl_reduction reds[3] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            o.order = k == 1 ? 4 : 2;
            tu_poison(L, sizeof L);
            tu_poison(Dx, sizeof Dx);
            CHECK_STATUS(fl_taylor_ce_fused_cpu(L, Dx, xv, 6, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F32, &o, ws,
                                                wsb), FL_OK, "all ignored");
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
            CHECK_STATUS(fl_taylor_ce_forward_cpu(L, xv, 6, y, FL_INDEX_I64, 4, 5, FL_DTYPE_F32, &o, ws, wsb), FL_OK,
                         "all ignored forward");
            CHECK(k == 0 ? isnan(L[0]) : L[0] == 0.0f, "all ignored forward %s = %g", red_name(reds[k]), L[0]);
        }
        o = (fl_taylor_options)FL_TAYLOR_OPTIONS_INIT;
    }
    /* N = 0: SUM 0, MEAN NaN, NONE writes nothing; NULL arrays fine */
    {
        const fl_reduction reds[3] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            size_t w0 = 7;
            CHECK_STATUS(fl_taylor_ce_workspace_size(&w0, 0, 5, FL_DTYPE_BF16, &o), FL_OK, "N=0 size");
            CHECK(w0 == (k == 2 ? 0u : (size_t)FL__TAYLOR_WS_HEAD), "N = 0 %s workspace %zu", red_name(reds[k]), w0);
            L[0] = 5.0f;
            CHECK_STATUS(fl_taylor_ce_forward_cpu(L, NULL, 5, NULL, FL_INDEX_I32, 0, 5, FL_DTYPE_BF16, &o,
                                                  k == 2 ? NULL : ws, w0), FL_OK, "N=0 forward");
            if (k == 0) CHECK(tu_f32_bits(L[0]) == 0, "N = 0 SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 NONE wrote the loss");
            L[0] = 5.0f;
            CHECK_STATUS(fl_taylor_ce_fused_cpu(L, NULL, NULL, 5, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5, FL_DTYPE_F16,
                                                &o, k == 2 ? NULL : ws, w0), FL_OK, "N=0 fused");
            if (k == 0) CHECK(tu_f32_bits(L[0]) == 0, "N = 0 fused SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 fused MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 fused NONE wrote the loss");
            CHECK_STATUS(fl_taylor_ce_fused_cpu(NULL, NULL, NULL, 5, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5,
                                                FL_DTYPE_F16, &o, k == 2 ? NULL : ws, w0), FL_OK, "N=0 fused loss NULL");
        }
        o = (fl_taylor_options)FL_TAYLOR_OPTIONS_INIT;
    }
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
static size_t al256(size_t x) { return (x + 255) / 256 * 256; }

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
#define EXPECT(call_, want, what) ZT_EXPECT(call_, want, what, fnname, L, D)

static void test_errors(void) {
    /* N = 2 rows, C = 4 classes, ld = 8: the logits span X[0, 12) */
    float X[32], L[8], D[32], G[8];
    int64_t tg[8];
    int32_t t32[8];
    for (int k = 0; k < 32; k++) X[k] = (float)(k % 7) * 0.5f - 1.5f;
    for (int k = 0; k < 8; k++) { G[k] = 1.0f; tg[k] = k % 4; t32[k] = k % 4; }
    tg[1] = -100;
    t32[1] = -100;
    fl_taylor_options o = FL_TAYLOR_OPTIONS_INIT, ob;
    size_t wsb;
    fl_taylor_ce_workspace_size(&wsb, 2, 4, FL_DTYPE_F32, &o);
    char* ws = tu_xmalloc(wsb + 512);
    const fl_dtype F = FL_DTYPE_F32;
    const fl_index_dtype I = FL_INDEX_I64;
    const char* fnname = "fl_taylor_ce_forward_cpu";

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
    const int32_t orders[6] = {3, 0, 1, 6, -2, 5};
    for (int k = 0; k < 6; k++) {
        ob = o;
        ob.order = orders[k];
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad order");
        CHECK(strstr(fl_last_error(), "order") != NULL, "order %d message: %s", (int)orders[k], fl_last_error());
    }
    const int reds[3] = {7, -1, 3};   /* 3 = FL_REDUCTION_BATCHMEAN (distillation only) */
    for (int k = 0; k < 3; k++) {
        ob = o;
        ob.reduction = (fl_reduction)reds[k];
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad reduction");
        CHECK(strstr(fl_last_error(), "reduction") != NULL, "reduction %d message: %s", reds[k], fl_last_error());
    }
    ob = o;
    ob.struct_size = sizeof(fl_taylor_options) - 8;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size - 8");
    CHECK(strstr(fl_last_error(), "struct_size") != NULL, "struct_size message: %s", fl_last_error());
    ob.struct_size = 0;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size 0");
    ob.struct_size = sizeof(fl_taylor_options) + 8;
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size + 8");
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
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace");
    CHECK(strstr(fl_last_error(), "fl_taylor_ce_workspace_size") != NULL, "workspace hint: %s", fl_last_error());
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, ws, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "zero workspace");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, NULL, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "NULL, 0 bytes (MEAN)");
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
    EXPECT(FWD(X + 12, X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_OK, "loss in the last row's padding");
    EXPECT(FWD((float*)(tg + 1), X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps targets");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "loss / targets message: %s", fl_last_error());
    EXPECT(FWD((float*)(ws + 300), X, 8, tg, I, 2, 4, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss overlaps workspace");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, (void*)X, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps logits");
    EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &o, (void*)tg, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps targets");
    EXPECT(FWD(L, X, 8, (const void*)X, FL_INDEX_I32, 1, 4, F, &ob, NULL, 0), FL_ERR_TARGET_OUT_OF_RANGE,
           "targets may alias the logits (inputs): then out of range");
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
        /* the CPU never writes the error flag */
        int32_t flag = 7;
        ob = o;
        ob.error_flag = &flag;
        EXPECT(FWD(L, X, 8, tb, I, 2, 4, F, &ob, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "with error_flag");
        EXPECT(FWD(L, X, 8, tg, I, 2, 4, F, &ob, ws, wsb), FL_OK, "valid, with error_flag");
        CHECK(flag == 7, "the CPU backend wrote *error_flag (%d)", (int)flag);
        fnname = "fl_taylor_ce_fused_cpu";
        EXPECT(fl_taylor_ce_fused_cpu(L, D, X, 8, tb, I, G, 1.0f, 2, 4, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE,
               "fused target out of range");
        EXPECT(fl_taylor_ce_fused_cpu(NULL, D, X, 8, tb, I, NULL, 1.0f, 2, 4, F, &o, ws, wsb),
               FL_ERR_TARGET_OUT_OF_RANGE, "fused loss NULL, target out of range");
        memcpy(D, X, sizeof X);   /* in place: the logits must survive the refusal */
        {
            const fl_status st = fl_taylor_ce_fused_cpu(L, D, D, 8, tb, I, G, 1.0f, 2, 4, F, &o, ws, wsb);
            CHECK_STATUS(st, FL_ERR_TARGET_OUT_OF_RANGE, "in place, target out of range");
            CHECK(memcmp(D, X, sizeof X) == 0, "in place, target out of range: the logits were written");
        }
        fnname = "fl_taylor_ce_forward_cpu";
    }
#undef FWD

    fnname = "fl_taylor_ce_fused_cpu";
#define FUS(loss_, dx_, x_, ld_, t_, gl_, gs_, N_, C_, o_, ws_, wsb_) \
    fl_taylor_ce_fused_cpu(loss_, dx_, x_, ld_, t_, I, gl_, gs_, N_, C_, F, o_, ws_, wsb_)
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
    EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 0, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused C = 0");
    EXPECT(FUS(L, D, X, 3, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused ld < C");
    {
        fl_taylor_options oc = o;
        oc.order = 3;
        EXPECT(FUS(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused order 3");
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
    EXPECT(FUS((float*)ws, D, X, 8, tg, G, 1.0f, 2, 4, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps workspace");
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
    fnname = "fl_taylor_ce_workspace_size";
    {
        size_t b = 77;
        EXPECT(fl_taylor_ce_workspace_size(NULL, 2, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "bytes NULL");
        EXPECT(fl_taylor_ce_workspace_size(&b, -1, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "size N < 0");
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 0, F, NULL), FL_ERR_INVALID_ARGUMENT, "size C < 1");
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 4, (fl_dtype)9, NULL), FL_ERR_INVALID_ARGUMENT, "size dtype");
        ob = o;
        ob.struct_size = 3;
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size struct_size");
        ob = o;
        ob.order = 3;
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size order 3");
        ob = o;
        ob.reduction = (fl_reduction)9;
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size reduction 9");
        EXPECT(fl_taylor_ce_workspace_size(&b, INT64_MAX, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "size overflow");
        CHECK(strstr(fl_last_error(), "overflow") != NULL, "overflow message: %s", fl_last_error());
        CHECK(b == 77, "bytes written on error (%zu)", b);
        EXPECT(fl_taylor_ce_workspace_size(&b, 2, 4, F, NULL), FL_OK, "size valid");
        CHECK(b == FL__TAYLOR_WS_HEAD + 256, "size valid: %zu", b);
    }
#ifndef FL_WITH_CUDA
    if (!fl_cuda_built()) {
        fnname = "fl_taylor_ce_forward_cuda";
        EXPECT(fl_taylor_ce_forward_cuda(L, X, 8, tg, I, 2, 4, F, &o, ws, wsb, NULL), FL_ERR_NOT_BUILT,
               "forward cuda not built");
        fnname = "fl_taylor_ce_fused_cuda";
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
