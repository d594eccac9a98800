/* test_margin_ce.c — CPU backend of the margin softmax cross-entropy (CosFace / ArcFace / combined
 * margins; include/fusedloss.h section 11) against an independent long-double reference written
 * from the header's definitions (phi by its three cases, sin theta as sqrt(1 - x^2), the loss as
 * -log p_y = log(1 + sum_{j != y} exp(z_j - z_y))), whose analytic gradient is itself checked by
 * central finite differences of the reference loss w.r.t. the cosines: EXACT mode against the
 * derivative of the true loss (away from the branch boundary and x_y = +-1, with a step that
 * shrinks near them), STRAIGHT mode against the derivative of the loss whose margin is frozen into
 * a constant shift. Grid: (m1, m2, m3) = ArcFace (1, 0.5, 0), CosFace (1, 0, 0.4), combined (1, 0.3,
 * 0.2), SphereFace-like (2, 0, 0), (1.35, 0.25, 0.1); easy_margin on / off; s = 64, 30, 1; both
 * grad modes; every reduction; targets int32 / int64 with ignored rows (their logits NaN: never
 * read), custom ignore_index (a valid class, -1, beyond int32); target cosines uniform, high (a
 * trained model, some rows with the other cosines near 0: confident rows with a tiny loss), 0.99999,
 * exactly 1.0, -0.99999, exactly -1.0, +-(1 + 2^-23) (clamped) and in the fallback region (theta >
 * (pi - m2) / m1); C from 1
 * to 20000 (rows crossing the 8192-column chunks); ld > C with NaN / 30000 padding (neither read
 * nor written); fp32 / fp16 / bf16; grad_loss NULL / scalar / per row; grad_scale != 1; loss and
 * lse NULL or not; in place (dlogits == logits); every output poisoned before every call.
 * Also: insightface's CombinedMarginLoss re-implemented literally in double (the old ArcFace /
 * CosFace code with autograd's gradient, and the newer arccos_ / cos_ code under no_grad, whose
 * gradient is STRAIGHT) then F.cross_entropy; CosFace equal to section 5's cross-entropy of the
 * shifted logits; closed forms; all rows ignored; N = 0; thread-count independence; the workspace
 * size query; the resolved parameters of the shared validator; every bad argument's status and
 * message (outputs untouched on error); out-of-range targets (nothing written).
 *
 * Build / run: make test (this is build/test_margin_ce). Prints "N passed, M failed".
 * SPDX-License-Identifier: MIT
 */
#include <float.h>
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
#include "../src/internal.h" /* fl__margin_validate: the CUDA-only rule and the resolved parameters */

/* ------------------------------------------------------------------------------------------
 * Tolerances, |lib - ref| <= atol + rtol*|ref| + slack, indexed by fl_dtype (F32 = 0, F16 = 1,
 * BF16 = 2). The reference is long double on the same dtype-rounded cosines; the library computes
 * in double and rounds once to fp32 (loss, lse) or through fp32 to the logits' dtype (dlogits).
 *   loss, lse : rtol 1e-6 (fp32 output: half an ulp is 6e-8; margin for the double sums);
 *   dlogits   : 1 ulp of the dtype (2^-23 / 2^-10 / 2^-7: the double -> fp32 -> dtype rounding)
 *               plus one subnormal step of the dtype (atol); an fp16 reference beyond 65520 is
 *               +-inf (what the rounding gives: the EXACT gradient at x_y = 1 is ~1e7 for s = 64);
 *   slack     : SLACK_CALC x the element's sensitivity to double rounding: (1 - p_y)(1 + |z_y| +
 *               |lse|) for a row's loss (small for a confident row: its loss is log1p of a tiny
 *               sum), |g s| p_j (1 + |z_j| + |lse|) for dlogits (x |phi'| (1 + s) at the target);
 *   finite differences (long double, step FD_H, shrunk to FD_NEAR x the distance to x_y = +-1 or
 *               to the branch boundary in EXACT mode, skipped closer than FD_SKIP): FD_RTOL
 *               relative + |g| (FD_ATOL s (1 + |phi'|) + 8 eps_ld (1 + |lse| + |z_y|) / step).
 *   insightface re-implementations (double, their operation order): INSIGHT_RTOL.
 * ---------------------------------------------------------------------------------------- */
typedef struct { double loss_rtol, dx_rtol, dx_atol; } tol_t;
static const tol_t TOL[3] = {
    /* FL_DTYPE_F32  */ {1e-6, 1.1920928955078125e-7, 1.5e-45},
    /* FL_DTYPE_F16  */ {1e-6, 9.765625e-4, 5.97e-8},
    /* FL_DTYPE_BF16 */ {1e-6, 7.8125e-3, 9.2e-41},
};
static const double SLACK_CALC = 1e-12;
static const long double FD_H = 1e-6L, FD_NEAR = 1e-4L, FD_SKIP = 1e-8L;
static const double FD_RTOL = 1e-7, FD_ATOL = 1e-10;
static const double INSIGHT_RTOL = 2e-6;

typedef long double LD;
static const LD PI_L = 3.141592653589793238462643383279502884L;

/* ---- reference ---------------------------------------------------------------------------- */

typedef struct {
    LD s, m1, m2, m3;
    int easy, straight;
} ref_opts;

static ref_opts mk_ref(float s, float m1, float m2, float m3, int easy, fl_margin_grad gm) {
    ref_opts o;
    o.s = s; o.m1 = m1; o.m2 = m2; o.m3 = m3;
    o.easy = easy;
    o.straight = gm == FL_MARGIN_GRAD_STRAIGHT;
    return o;
}

static int ref_cosface(const ref_opts* o) { return o->m1 == 1 && o->m2 == 0; }

/* cosine of the branch boundary: the margin applies for x above it (non-easy: theta <= (pi -
 * m2) / m1; easy: x > 0); -2 (none) for CosFace */
static LD ref_boundary(const ref_opts* o) {
    if (ref_cosface(o)) return -2;
    if (o->easy) return 0;
    return cosl((PI_L - o->m2) / o->m1);
}

/* phi(x) and phi'(x) as the header defines them; *region: 0 CosFace, 1 the margin applies,
 * 2 the fallback */
static void ref_phi(const ref_opts* o, LD x, LD* phi, LD* dphi, int* region) {
    if (ref_cosface(o)) { *phi = x - o->m3; *dphi = 1; *region = 0; return; }
    const LD c = x < -1 ? -1 : x > 1 ? 1 : x;
    const LD theta = acosl(c);
    const int applies = o->easy ? x > 0 : o->m1 * theta + o->m2 <= PI_L;
    if (applies) {
        *phi = cosl(o->m1 * theta + o->m2) - o->m3;
        const LD sin_theta = sqrtl(1 - c * c);   /* = sin(acos c) */
        *dphi = o->straight ? 1 : o->m1 * sinl(o->m1 * theta + o->m2) / (sin_theta > 1e-6L ? sin_theta : 1e-6L);
        *region = 1;
    } else {
        *phi = o->easy ? x - o->m3 : x - o->m3 - o->m2 * sinl(o->m2);
        *dphi = 1;
        *region = 2;
    }
}

typedef struct {
    LD l, lse, zy, py, phi, dphi;
    int region;
} ref_row_t;

/* One row: x the cosines [C], y the target. shift non-NULL: phi = x_y + *shift (the margin frozen
 * into a constant, for STRAIGHT's finite differences). dl: d l / d x_j with the mode's phi'
 * (NULL: loss only). */
static ref_row_t ref_row(const ref_opts* o, const LD* x, int64_t C, int64_t y, const LD* shift, LD* dl) {
    ref_row_t r;
    ref_phi(o, x[y], &r.phi, &r.dphi, &r.region);
    if (shift) { r.phi = x[y] + *shift; r.dphi = 1; }
    r.zy = o->s * r.phi;
    LD so = 0;   /* sum_{j != y} exp(z_j - z_y): l = -log p_y = log1p(so) */
    for (int64_t j = 0; j < C; j++)
        if (j != y) so += expl(o->s * x[j] - r.zy);
    r.l = log1pl(so);
    r.lse = r.zy + r.l;
    r.py = 1 / (1 + so);
    if (dl) {
        for (int64_t j = 0; j < C; j++)
            if (j != y) dl[j] = o->s * expl(o->s * x[j] - r.lse);   /* s p_j */
        dl[y] = -o->s * (so / (1 + so)) * r.dphi;                   /* s (p_y - 1) phi', no cancellation */
    }
    return r;
}

/* ---- one configuration ------------------------------------------------------------------- */
typedef struct {
    int64_t N, C, pad;            /* ld = C + pad */
    fl_dtype dt;
    float s, m1, m2, m3;
    int easy;
    fl_margin_grad gm;
    fl_reduction red;
    int tgt64;                    /* targets int64 (else int32) */
    int64_t ignore_index;
    double p_ignore;              /* fraction of rows ignored */
    int all_ignored;
    int gl;                       /* grad_loss given */
    float gscale;
    int rot;                      /* row-kind rotation */
} cfg_t;

static const char* red_name(fl_reduction r) {
    return r == FL_REDUCTION_NONE ? "none" : r == FL_REDUCTION_MEAN ? "mean" : "sum";
}

enum { KINDS = 8 };

static double clamp1(double v) { return v < -1 ? -1 : v > 1 ? 1 : v; }

/* fp16 rounds magnitudes >= 65520 to inf: the reference of an output that overflows */
static double ref_out(fl_dtype dt, double v) {
    if (dt == FL_DTYPE_F16 && fabs(v) >= 65520.0) return v > 0 ? INFINITY : -INFINITY;
    return v;
}

static int64_t fd_total = 0, fd_skipped = 0;   /* over the grid, printed at the end */

static void run_cfg(const cfg_t* c, uint64_t seed) {
    const int64_t N = c->N, C = c->C, ld = C + c->pad;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const size_t xbytes = (size_t)(N * ld) * es;
    const tol_t tol = TOL[c->dt];
    tu_rng r = tu_rng_seed(seed);
    char name[256];
    snprintf(name, sizeof name, "s=%g m=(%g,%g,%g)%s %s %s N=%lld C=%lld ld=%lld %s i%d ign=%lld%s gl=%d gs=%g",
             c->s, c->m1, c->m2, c->m3, c->easy ? " easy" : "", c->gm == FL_MARGIN_GRAD_EXACT ? "exact" : "straight",
             red_name(c->red), (long long)N, (long long)C, (long long)ld, tu_dtype_name(c->dt), c->tgt64 ? 64 : 32,
             (long long)c->ignore_index, c->all_ignored ? "(all)" : "", c->gl, c->gscale);

    const ref_opts ro = mk_ref(c->s, c->m1, c->m2, c->m3, c->easy, c->gm);
    const double xb = (double)ref_boundary(&ro);

    /* inputs: ignored rows NaN (poison); padding columns alternately +30000 (a max over them would
     * be wrong: NaN drops out of a max) and NaN (a sum over them would be NaN) */
    void* x = tu_xmalloc(xbytes + 4);
    tu_poison(x, xbytes + 4);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = C; j < ld; j += 2) tu_store(x, c->dt, i * ld + j, 30000.0f);
    int32_t* t32 = tu_xmalloc((size_t)N * 4 + 4);
    int64_t* t64 = tu_xmalloc((size_t)N * 8 + 8);
    int* ign = tu_xmalloc((size_t)N * sizeof(int) + sizeof(int));
    int64_t D = 0;
    for (int64_t i = 0; i < N; i++) {
        ign[i] = c->all_ignored || tu_uniform(&r) < c->p_ignore;
        int64_t y = c->ignore_index;
        if (!ign[i]) {
            y = tu_int_in(&r, 0, C - 1);
            if (y == c->ignore_index) y = (y + 1) % C;   /* (configs keep C > 1 when ignore_index is a class) */
        }
        t32[i] = (int32_t)y;
        t64[i] = y;
        D += !ign[i];
        if (ign[i]) continue;
        const int kind = (int)((i + c->rot) % KINDS);
        for (int64_t j = 0; j < C; j++) {
            const double v = kind == 2 ? clamp1(0.1 * tu_normal(&r)) : tu_uniform_in(&r, -1.0, 1.0);
            tu_store(x, c->dt, i * ld + j, (float)v);
        }
        double xy;
        switch (kind) {
            case 1: case 2: xy = tu_uniform_in(&r, 0.5, 0.99); break;   /* a trained model's target */
            case 3: xy = 0.99999; break;
            case 4: xy = ((i / KINDS) % 2) ? 1.0000001192092896 : 1.0; break;   /* fp32 rounding may exceed 1 */
            case 5: xy = ((i / KINDS) % 3) == 1 ? -1.0 : ((i / KINDS) % 3) == 2 ? -1.0000001192092896 : -0.99999; break;
            case 6: xy = xb > -1.0 ? tu_uniform_in(&r, -1.0, xb) : tu_uniform_in(&r, -1.0, 1.0); break;   /* fallback */
            default: xy = tu_uniform_in(&r, -1.0, 1.0); break;
        }
        tu_store(x, c->dt, i * ld + y, (float)xy);
    }
    const void* targets = c->tgt64 ? (const void*)t64 : (const void*)t32;
    const fl_index_dtype it = c->tgt64 ? FL_INDEX_I64 : FL_INDEX_I32;
    float* gl = tu_xmalloc((size_t)(N + 1) * 4);
    for (int64_t i = 0; i < N + 1; i++) gl[i] = (float)tu_uniform_in(&r, -2.0, 2.0);

    fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
    o.s = c->s; o.m1 = c->m1; o.m2 = c->m2; o.m3 = c->m3;
    o.easy_margin = c->easy;
    o.grad_mode = c->gm;
    o.ignore_index = c->ignore_index;
    o.reduction = c->red;
    size_t wsb = 0;
    CHECK_STATUS(fl_margin_ce_workspace_size(&wsb, N, C, c->dt, &o), FL_OK, "workspace size");
    void* ws = tu_xmalloc(wsb);
    tu_poison(ws, wsb);

    /* reference */
    const LD denom = c->red == FL_REDUCTION_MEAN ? (LD)D : 1;
    const size_t ne = (size_t)(N * C) + 1;
    double* lref = tu_xmalloc((size_t)(N + 1) * 8);
    double* lsl = tu_xmalloc((size_t)(N + 1) * 8);
    double* lseref = tu_xmalloc((size_t)(N + 1) * 8);
    double* lsesl = tu_xmalloc((size_t)(N + 1) * 8);
    double* dref = tu_xmalloc(ne * 8);
    double* dsl = tu_xmalloc(ne * 8);
    double* got = tu_xmalloc(ne * 8);
    LD* xr = tu_xmalloc((size_t)C * sizeof(LD));
    LD* dl = tu_xmalloc((size_t)C * sizeof(LD));
    int64_t* fdi = tu_xmalloc(ne * 8);   /* finite differences kept for the library: index, value, tol */
    double* fdv = tu_xmalloc(ne * 8);
    double* fdt = tu_xmalloc(ne * 8);
    LD sum = 0, sumsl = 0;
    double fdmax = 0;
    int64_t fdbad = 0, fdn = 0, fdskip = 0;
    for (int64_t i = 0; i < N; i++) {
        if (ign[i]) {
            lref[i] = 0; lsl[i] = 0; lseref[i] = 0; lsesl[i] = 0;
            for (int64_t j = 0; j < C; j++) { dref[i * C + j] = 0; dsl[i * C + j] = 0; }
            continue;
        }
        const int64_t y = t64[i];
        for (int64_t j = 0; j < C; j++) xr[j] = tu_load(x, c->dt, i * ld + j);
        const ref_row_t rr = ref_row(&ro, xr, C, y, NULL, dl);
        const LD g = (LD)c->gscale * (c->gl ? (LD)gl[none ? i : 0] : 1) / denom;
        const LD mag = 1 + fabsl(rr.zy) + fabsl(rr.lse);
        lref[i] = (double)rr.l;
        lsl[i] = SLACK_CALC * (double)((1 - rr.py) * mag);
        lseref[i] = (double)rr.lse;
        lsesl[i] = SLACK_CALC * (double)mag;
        sum += rr.l;
        sumsl += (1 - rr.py) * mag;
        for (int64_t j = 0; j < C; j++) {
            dref[i * C + j] = ref_out(c->dt, (double)(g * dl[j]));
            const LD pj = j == y ? 1 - rr.py : expl(ro.s * xr[j] - rr.lse);
            const LD zj = j == y ? rr.zy : ro.s * xr[j];
            dsl[i * C + j] = SLACK_CALC * (double)(fabsl(g * ro.s) * pj * (1 + fabsl(zj) + fabsl(rr.lse)) *
                                                   (j == y ? fabsl(rr.dphi) * (1 + ro.s) : 1));
        }
        /* the analytic gradient against central differences of the reference loss: every column of
         * small rows, 6 (the target, the ends, the chunk boundary) of large ones */
        const int64_t cols[6] = {y, 0, C - 1, C > 8192 ? 8191 : C / 2, C > 8192 ? 8192 : C / 3, C / 5};
        const int64_t ncol = C <= 128 ? C : 6;
        for (int64_t k = 0; k < ncol; k++) {
            const int64_t j = C <= 128 ? k : cols[k];
            if (C > 128 && k > 0 && j == y) continue;
            LD h = FD_H;
            LD shift = 0;
            const LD* sh = NULL;
            if (j == y && ro.straight) {          /* the margin as a frozen constant shift */
                shift = rr.phi - xr[y];
                sh = &shift;
            } else if (j == y && rr.region != 0) { /* EXACT: keep the step inside the branch, off +-1 */
                LD dist = fabsl(xr[y] - (LD)xb);
                if (rr.region == 1) {
                    if (1 - xr[y] < dist) dist = 1 - xr[y];
                    if (1 + xr[y] < dist) dist = 1 + xr[y];
                }
                if (dist < FD_SKIP) { fdskip++; continue; }
                if (FD_NEAR * dist < h) h = FD_NEAR * dist;
            }
            const LD x0 = xr[j];
            xr[j] = x0 + h;
            const LD lpl = ref_row(&ro, xr, C, y, sh, NULL).l;
            xr[j] = x0 - h;
            const LD lmi = ref_row(&ro, xr, C, y, sh, NULL).l;
            xr[j] = x0;
            const double fd = (double)(g * (lpl - lmi) / (2 * h));
            const double an = (double)(g * dl[j]);
            const double d = fabs(fd - an);
            const double ft = FD_RTOL * fabs(fd) +
                              (double)(fabsl(g) * ((LD)FD_ATOL * ro.s * (1 + fabsl(rr.dphi)) +
                                                   8 * LDBL_EPSILON * (1 + fabsl(rr.lse) + fabsl(rr.zy)) / h));
            if (fabs(an) < 65520.0 || c->dt != FL_DTYPE_F16) {
                fdi[fdn] = i * C + j;
                fdv[fdn] = fd;
                fdt[fdn] = ft;
                fdn++;
            }
            if (d > fdmax) fdmax = d;
            if (!(d <= ft)) {
                if (fdbad < 3)
                    printf("  %s: fd row %lld col %lld (target %lld, x_y %.9g, region %d): analytic %.12g fd %.12g "
                           "(tol %.3g)\n", name, (long long)i, (long long)j, (long long)y, (double)xr[y], rr.region,
                           an, fd, ft);
                fdbad++;
            }
        }
    }
    fd_total += fdn;
    fd_skipped += fdskip;
    CHECK(fdbad == 0, "%s: %lld of %lld finite differences disagree with the analytic reference (maxdiff %.3g, %lld "
          "skipped at +-1 / the boundary)", name, (long long)fdbad, (long long)fdn, fdmax, (long long)fdskip);

    /* reduced reference */
    double lred = 0, lredsl = 0;
    if (!none) {
        lred = c->red == FL_REDUCTION_SUM ? (double)sum : denom > 0 ? (double)(sum / denom) : NAN;
        lredsl = SLACK_CALC * (double)(sumsl / (denom > 0 ? denom : 1)) + 1e-30;
    }

    float* loss = tu_xmalloc((size_t)(nl + 1) * 4);
    float* loss2 = tu_xmalloc((size_t)(nl + 1) * 4);
    float* lse = tu_xmalloc((size_t)(N + 1) * 4);
    float* lse2 = tu_xmalloc((size_t)(N + 1) * 4);
    void* dx = tu_xmalloc(xbytes + 4);
    void* dx2 = tu_xmalloc(xbytes + 4);
    char nm[400];

    /* forward, with lse */
    tu_poison(loss, (size_t)(nl + 1) * 4);
    tu_poison(lse, (size_t)(N + 1) * 4);
    fl_status st = fl_margin_ce_forward_cpu(loss, lse, x, ld, targets, it, N, C, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s forward", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s forward loss", name);
        if (none) {
            for (int64_t i = 0; i < N; i++) got[i] = loss[i];
            check_close_ex(nm, got, lref, lsl, N, 1e-30, tol.loss_rtol);
            for (int64_t i = 0; i < N; i++)
                if (ign[i]) CHECK(tu_bits(loss, FL_DTYPE_F32, i) == 0, "%s: ignored row %lld loss %g != +0", nm,
                                  (long long)i, loss[i]);
        } else {
            got[0] = loss[0];
            check_close_ex(nm, got, &lred, &lredsl, 1, 1e-30, tol.loss_rtol);
        }
        CHECK(tu_is_poison(loss, 4, nl), "%s: loss[%lld] (past the end) written", nm, (long long)nl);
        snprintf(nm, sizeof nm, "%s forward lse", name);
        for (int64_t i = 0; i < N; i++) got[i] = lse[i];
        check_close_ex(nm, got, lseref, lsesl, N, 1e-30, tol.loss_rtol);
        for (int64_t i = 0; i < N; i++)
            if (ign[i]) CHECK(tu_bits(lse, FL_DTYPE_F32, i) == 0, "%s: ignored row %lld lse %g != +0", nm, (long long)i,
                              lse[i]);
        CHECK(tu_is_poison(lse, 4, N), "%s: lse past the end written", nm);
    }

    /* forward without lse: the same loss */
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    st = fl_margin_ce_forward_cpu(loss2, NULL, x, ld, targets, it, N, C, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s forward lse=NULL loss", name);
    if (CHECK_STATUS(st, FL_OK, nm)) check_bitwise(nm, loss2, loss, (size_t)(nl + 1) * 4);

    /* fused, with loss and lse */
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    tu_poison(lse2, (size_t)(N + 1) * 4);
    tu_poison(dx, xbytes + 4);
    st = fl_margin_ce_fused_cpu(loss2, lse2, dx, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o, ws,
                                wsb);
    snprintf(nm, sizeof nm, "%s fused", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s fused loss, lse == forward", name);
        check_bitwise(nm, loss2, loss, (size_t)(nl + 1) * 4);
        check_bitwise(nm, lse2, lse, (size_t)(N + 1) * 4);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < C; j++) got[i * C + j] = tu_load(dx, c->dt, i * ld + j);
        snprintf(nm, sizeof nm, "%s fused dlogits", name);
        check_close_ex(nm, got, dref, dsl, N * C, tol.dx_atol, tol.dx_rtol);
        int64_t badpad = 0, badign = 0, nonfinite = 0;
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = C; j < ld; j++) badpad += !tu_is_poison(dx, es, i * ld + j);
            for (int64_t j = 0; ign[i] && j < C; j++) badign += tu_bits(dx, c->dt, i * ld + j) != 0;
            for (int64_t j = 0; !ign[i] && j < C; j++) nonfinite += !isfinite(got[i * C + j]) && isfinite(dref[i * C + j]);
        }
        badpad += !tu_is_poison((char*)dx + xbytes, 4, 0);
        CHECK(badpad == 0, "%s: %lld padding / past-the-end elements of dlogits written", nm, (long long)badpad);
        CHECK(badign == 0, "%s: %lld elements of ignored rows not +0", nm, (long long)badign);
        CHECK(nonfinite == 0, "%s: %lld non-finite gradients (EXACT at x_y = +-1 must stay finite)", nm,
              (long long)nonfinite);
    }

    /* fused, loss and lse NULL: the same dlogits */
    tu_poison(dx2, xbytes + 4);
    st = fl_margin_ce_fused_cpu(NULL, NULL, dx2, x, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o, ws,
                                wsb);
    snprintf(nm, sizeof nm, "%s fused loss=lse=NULL dlogits", name);
    if (CHECK_STATUS(st, FL_OK, nm)) check_bitwise(nm, dx2, dx, xbytes + 4);

    /* in place: dlogits == logits; expected: the first C columns of dx, the padding of x */
    memcpy(dx2, x, xbytes + 4);
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    tu_poison(lse2, (size_t)(N + 1) * 4);
    st = fl_margin_ce_fused_cpu(loss2, lse2, dx2, dx2, ld, targets, it, c->gl ? gl : NULL, c->gscale, N, C, c->dt, &o,
                                ws, wsb);
    snprintf(nm, sizeof nm, "%s fused in place", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        void* want = tu_xmalloc(xbytes + 4);
        memcpy(want, x, xbytes + 4);
        for (int64_t i = 0; i < N; i++)
            memcpy((char*)want + (size_t)(i * ld) * es, (char*)dx + (size_t)(i * ld) * es, (size_t)C * es);
        check_bitwise(nm, dx2, want, xbytes + 4);
        check_bitwise(nm, loss2, loss, (size_t)nl * 4);
        check_bitwise(nm, lse2, lse, (size_t)N * 4);
        free(want);
    }

    /* the library's dlogits against the finite differences directly (dtype tolerance + theirs) */
    if (fdn > 0) {
        double* fg = tu_xmalloc((size_t)fdn * 8);
        double* fs = tu_xmalloc((size_t)fdn * 8);
        for (int64_t k = 0; k < fdn; k++) {
            const int64_t i = fdi[k] / C, j = fdi[k] % C;
            fg[k] = tu_load(dx, c->dt, i * ld + j);
            fs[k] = fdt[k] + dsl[fdi[k]] + tol.dx_rtol * fabs(fdv[k]);
        }
        snprintf(nm, sizeof nm, "%s fused dlogits vs finite differences", name);
        check_close_ex(nm, fg, fdv, fs, fdn, tol.dx_atol, 0.0);
        free(fg); free(fs);
    }

    free(x); free(t32); free(t64); free(ign); free(gl); free(ws); free(lref); free(lsl); free(lseref); free(lsesl);
    free(dref); free(dsl); free(got); free(xr); free(dl); free(fdi); free(fdv); free(fdt); free(loss); free(loss2);
    free(lse); free(lse2); free(dx); free(dx2);
}

/* ---- insightface's CombinedMarginLoss, literally, then F.cross_entropy (mean) --------------------- */

/* F.cross_entropy(z, labels) (mean over rows whose label != -100) of z [N, C] in double, with its
 * gradient d loss / d z (grad: [N, C]) */
static double torch_cross_entropy(const double* z, const int64_t* lab, int64_t N, int64_t C, double* grad) {
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += lab[i] != -100;
    double sum = 0;
    for (int64_t i = 0; i < N; i++) {
        const double* zi = z + i * C;
        if (lab[i] == -100) { for (int64_t j = 0; j < C; j++) grad[i * C + j] = 0; continue; }
        double mx = -INFINITY, se = 0;
        for (int64_t j = 0; j < C; j++) if (zi[j] > mx) mx = zi[j];
        for (int64_t j = 0; j < C; j++) se += exp(zi[j] - mx);
        const double lse = mx + log(se);   /* log_softmax, then nll */
        sum += lse - zi[lab[i]];
        for (int64_t j = 0; j < C; j++) grad[i * C + j] = (exp(zi[j] - lse) - (j == lab[i])) / (double)cnt;
    }
    return sum / (double)cnt;
}

/* arcface_torch/losses.py CombinedMarginLoss before the arccos_ rewrite (ArcFace branch m1 == 1,
 * m3 == 0, with easy_margin; CosFace branch m3 > 0), forward and autograd's gradient w.r.t. the
 * cosines (dx [N, C]); returns the F.cross_entropy mean */
static double insightface_old(const float* x, const int64_t* lab, int64_t N, int64_t C, double s, double m2,
                              double m3, int easy_margin, double* dx) {
    const double pi = 3.14159265358979323846;
    const double cos_m = cos(m2), sin_m = sin(m2), theta = cos(pi - m2), sinmm = sin(pi - m2) * m2;
    double* z = tu_xmalloc((size_t)(N * C) * 8);
    double* dfin = tu_xmalloc((size_t)N * 8);
    for (int64_t i = 0; i < N * C; i++) z[i] = x[i];
    for (int64_t i = 0; i < N; i++) {
        dfin[i] = 1;
        if (lab[i] == -100) continue;
        const double target_logit = x[i * C + lab[i]];
        double final_target_logit;
        if (m3 > 0) {                                        /* CosFace */
            final_target_logit = target_logit - m3;
        } else {                                             /* ArcFace */
            const double sin_theta = sqrt(1.0 - pow(target_logit, 2));
            const double cos_theta_m = target_logit * cos_m - sin_theta * sin_m;   /* cos(target + margin) */
            const int take = easy_margin ? target_logit > 0 : target_logit > theta;  /* torch.where */
            final_target_logit = take ? cos_theta_m : easy_margin ? target_logit : target_logit - sinmm;
            /* autograd through the selected branch: d/dt (t cos_m - sqrt(1 - t^2) sin_m) */
            if (take) dfin[i] = cos_m + target_logit * sin_m / sin_theta;
        }
        z[i * C + lab[i]] = final_target_logit;
    }
    for (int64_t i = 0; i < N * C; i++) z[i] *= s;           /* logits = logits * self.s */
    const double loss = torch_cross_entropy(z, lab, N, C, dx);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++) dx[i * C + j] *= s * (j == lab[i] ? dfin[i] : 1.0);
    free(z); free(dfin);
    return loss;
}

/* the newer code: with torch.no_grad(): target_logit.arccos_(); logits.arccos_(); final_target_logit
 * = target_logit + m2; logits[index, labels] = final_target_logit; logits.cos_(); then logits * s
 * (the in-place no_grad edit is invisible to autograd: d loss / d x = s dz, phi' = 1) */
static double insightface_new(const float* x, const int64_t* lab, int64_t N, int64_t C, double s, double m2,
                              double* dx) {
    double* z = tu_xmalloc((size_t)(N * C) * 8);
    for (int64_t i = 0; i < N * C; i++) z[i] = acos((double)x[i]);
    for (int64_t i = 0; i < N; i++)
        if (lab[i] != -100) z[i * C + lab[i]] += m2;
    for (int64_t i = 0; i < N * C; i++) z[i] = cos(z[i]) * s;
    const double loss = torch_cross_entropy(z, lab, N, C, dx);
    for (int64_t i = 0; i < N * C; i++) dx[i] *= s;
    free(z);
    return loss;
}

static void test_insightface(void) {
    const int64_t N = 24, C = 50;
    float* x = tu_xmalloc((size_t)(N * C) * 4);
    float* dx = tu_xmalloc((size_t)(N * C) * 4);
    double* want = tu_xmalloc((size_t)(N * C) * 8);
    double* got = tu_xmalloc((size_t)(N * C) * 8);
    int64_t lab[24];
    size_t wsb;
    fl_margin_ce_workspace_size(&wsb, N, C, FL_DTYPE_F32, NULL);
    void* ws = tu_xmalloc(wsb);
    tu_rng r = tu_rng_seed(77);
    /* cosines uniform in (-0.999, 0.999) (sqrt(1 - t^2) and the EXACT formula agree off +-1), some
     * targets high, several in the fallback region of m = 0.5 (t < cos(pi - 0.5) = -0.8776) */
    for (int64_t i = 0; i < N; i++) {
        lab[i] = i == 5 ? -100 : tu_int_in(&r, 0, C - 1);
        for (int64_t j = 0; j < C; j++) x[i * C + j] = (float)tu_uniform_in(&r, -0.999, 0.999);
        if (lab[i] < 0) continue;
        if (i % 4 == 1) x[i * C + lab[i]] = (float)tu_uniform_in(&r, 0.3, 0.95);
        if (i % 6 == 2) x[i * C + lab[i]] = (float)tu_uniform_in(&r, -0.999, -0.9);
    }
    struct { float s, m2, m3; int easy; const char* what; } cases[5] = {
        {64.0f, 0.5f, 0.0f, 0, "ArcFace s=64 m=0.5"},
        {30.0f, 0.3f, 0.0f, 0, "ArcFace s=30 m=0.3"},
        {64.0f, 0.5f, 0.0f, 1, "ArcFace easy_margin"},
        {64.0f, 0.0f, 0.35f, 0, "CosFace s=64 m=0.35"},
        {30.0f, 0.0f, 0.4f, 0, "CosFace s=30 m=0.4"},
    };
    for (int k = 0; k < 5; k++) {
        fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
        o.s = cases[k].s; o.m1 = 1.0f; o.m2 = cases[k].m2; o.m3 = cases[k].m3; o.easy_margin = cases[k].easy;
        float L = NAN;
        CHECK_STATUS(fl_margin_ce_fused_cpu(&L, NULL, dx, x, C, lab, FL_INDEX_I64, NULL, 1.0f, N, C, FL_DTYPE_F32, &o,
                                            ws, wsb), FL_OK, cases[k].what);
        const double ref = insightface_old(x, lab, N, C, cases[k].s, cases[k].m2, cases[k].m3, cases[k].easy, want);
        CHECK(fabs(L - ref) <= INSIGHT_RTOL * fabs(ref), "insightface %s: loss %.9g, insightface %.9g", cases[k].what,
              L, ref);
        for (int64_t e = 0; e < N * C; e++) got[e] = dx[e];
        char nm[128];
        snprintf(nm, sizeof nm, "insightface %s: EXACT dlogits == autograd", cases[k].what);
        check_close(nm, got, want, N * C, 1e-12, INSIGHT_RTOL);
    }
    /* the newer code: STRAIGHT gradient; the same loss where the margin applies (it has no
     * fallback: theta + m > pi takes cos(theta + m) itself), so fallback targets are moved up */
    for (int64_t i = 0; i < N; i++)
        if (lab[i] >= 0 && x[i * C + lab[i]] < -0.85f) x[i * C + lab[i]] = -0.85f;
    {
        fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
        o.grad_mode = FL_MARGIN_GRAD_STRAIGHT;
        float L = NAN;
        CHECK_STATUS(fl_margin_ce_fused_cpu(&L, NULL, dx, x, C, lab, FL_INDEX_I64, NULL, 1.0f, N, C, FL_DTYPE_F32, &o,
                                            ws, wsb), FL_OK, "insightface new");
        const double ref = insightface_new(x, lab, N, C, 64.0, 0.5, want);
        CHECK(fabs(L - ref) <= INSIGHT_RTOL * fabs(ref), "insightface (arccos_ / cos_): loss %.9g, insightface %.9g",
              L, ref);
        for (int64_t e = 0; e < N * C; e++) got[e] = dx[e];
        check_close("insightface (arccos_ / cos_): STRAIGHT dlogits == autograd", got, want, N * C, 1e-12,
                    INSIGHT_RTOL);
    }
    free(x); free(dx); free(want); free(got); free(ws);
}

/* ---- closed forms and edge cases -------------------------------------------------------------- */
static void test_values(void) {
    size_t wsb;
    fl_margin_ce_workspace_size(&wsb, 64, 64, FL_DTYPE_F32, NULL);
    void* ws = tu_xmalloc(wsb);
    fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
    float L[8], LS[8], D[16];

    /* C = 2, ArcFace: x = (cos t, x1), target 0: loss = log(1 + exp(s x1 - s cos(t + m))) */
    {
        const double t = 0.7, x1 = 0.2, s = 10.0, m = 0.5;
        const float xv[2] = {(float)cos(t), (float)x1};
        const int32_t y[1] = {0};
        o.s = 10.0f;
        o.reduction = FL_REDUCTION_SUM;
        CHECK_STATUS(fl_margin_ce_fused_cpu(L, LS, D, xv, 2, y, FL_INDEX_I32, NULL, 1.0f, 1, 2, FL_DTYPE_F32, &o, ws,
                                            wsb), FL_OK, "closed form");
        const double th = acos((double)xv[0]), phi = cos(th + m);
        const double want = log1p(exp(s * (double)xv[1] - s * phi));
        const double p1 = 1.0 / (1.0 + exp(s * phi - s * (double)xv[1]));   /* softmax of the other class */
        const double dphi = sin(th + m) / sin(th);
        CHECK(fabs(L[0] - want) <= 1e-6 * want, "ArcFace C=2: loss %.9g, want %.9g", L[0], want);
        CHECK(fabs(LS[0] - (s * phi + want)) <= 1e-6 * fabs(s * phi + want), "ArcFace C=2: lse %.9g", LS[0]);
        CHECK(fabs(D[0] - (-s * p1 * dphi)) <= 1e-6 * fabs(s * p1 * dphi) && fabs(D[1] - s * p1) <= 1e-6 * s * p1,
              "ArcFace C=2: dlogits (%.9g, %.9g), want (%.9g, %.9g)", D[0], D[1], -s * p1 * dphi, s * p1);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    /* CosFace is section 5's cross-entropy (logit_scale s) of the logits with x_y shifted by -m3 */
    {
        const int64_t N = 6, C = 40;
        float xv[240], xs[240], L2[1];
        int64_t y[6];
        tu_rng r = tu_rng_seed(8);
        for (int k = 0; k < 240; k++) xv[k] = xs[k] = (float)tu_uniform_in(&r, -1, 1);
        for (int64_t i = 0; i < N; i++) {
            y[i] = tu_int_in(&r, 0, C - 1);
            xs[i * C + y[i]] = (float)((double)xv[i * C + y[i]] - (double)0.4f);   /* exact in fp32 here? close */
        }
        o.m2 = 0.0f; o.m3 = 0.4f; o.s = 30.0f; o.reduction = FL_REDUCTION_MEAN;
        CHECK_STATUS(fl_margin_ce_forward_cpu(L, NULL, xv, C, y, FL_INDEX_I64, N, C, FL_DTYPE_F32, &o, ws, wsb), FL_OK,
                     "cosface");
        fl_ce_options co = FL_CE_OPTIONS_INIT;
        co.logit_scale = 30.0f;
        size_t cwb;
        fl_cross_entropy_workspace_size(&cwb, N, C, FL_DTYPE_F32, &co);
        void* cws = tu_xmalloc(cwb);
        CHECK_STATUS(fl_cross_entropy_forward_cpu(L2, NULL, xs, y, N, C, C, FL_DTYPE_F32, FL_INDEX_I64, &co, cws, cwb),
                     FL_OK, "cross-entropy");
        /* x_y - m3 rounded to fp32 for section 5 moves z_y by <= s ulp(1) / 2: 1.8e-6 */
        CHECK(fabs(L[0] - L2[0]) <= 4e-6, "CosFace %.9g vs section 5 on shifted logits %.9g", L[0], L2[0]);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
        free(cws);
    }
    /* x_y = 1 exactly (theta = 0): EXACT's phi' = m1 sin(m2) / 1e-6, finite; x_y = -1 (fallback) */
    {
        const float xv[3] = {1.0f, 0.5f, -0.3f}, xn[3] = {-1.0f, 0.5f, -0.3f};
        const int32_t y[1] = {0};
        const fl_dtype dts[2] = {FL_DTYPE_F32, FL_DTYPE_BF16};
        for (int k = 0; k < 2; k++) {
            uint16_t xb[3], db[3];
            for (int j = 0; j < 3; j++) tu_store(xb, FL_DTYPE_BF16, j, xv[j]);
            o.reduction = FL_REDUCTION_SUM;
            CHECK_STATUS(fl_margin_ce_fused_cpu(L, NULL, k ? (void*)db : (void*)D, k ? (const void*)xb : (const void*)xv,
                                                3, y, FL_INDEX_I32, NULL, 1.0f, 1, 3, dts[k], &o, ws, wsb), FL_OK,
                         "x_y = 1");
            const double zy = 64.0 * cos(0.5), e1 = exp(64.0 * 0.5 - zy), e2 = exp(64.0 * -0.3 - zy);
            const double dy = -64.0 * ((e1 + e2) / (1 + e1 + e2)) * sin(0.5) / 1e-6;   /* p_y - 1, no cancellation */
            const double g0 = k ? tu_load(db, FL_DTYPE_BF16, 0) : D[0];
            CHECK(isfinite(g0) && fabs(g0 - dy) <= (k ? 8e-3 : 1e-6) * fabs(dy) && isfinite(L[0]),
                  "%s x_y = 1: dlogits[y] %.9g, want %.9g (finite)", tu_dtype_name(dts[k]), g0, dy);
        }
        /* a cosine just above 1 (fp32 rounding of a normalised dot product) is clamped where theta is
         * needed: the same loss and gradient as x_y = 1; just below -1 (fallback) it is not */
        {
            const float xa[3] = {1.00000012f, 0.5f, -0.3f};
            float La, Da[3], L1, D1[3];
            o.reduction = FL_REDUCTION_SUM;
            fl_margin_ce_fused_cpu(&La, NULL, Da, xa, 3, y, FL_INDEX_I32, NULL, 1.0f, 1, 3, FL_DTYPE_F32, &o, ws, wsb);
            fl_margin_ce_fused_cpu(&L1, NULL, D1, xv, 3, y, FL_INDEX_I32, NULL, 1.0f, 1, 3, FL_DTYPE_F32, &o, ws, wsb);
            CHECK(La == L1 && memcmp(Da, D1, sizeof Da) == 0, "x_y = 1 + 2^-23: loss %.9g vs %.9g at 1, same gradient %d",
                  La, L1, memcmp(Da, D1, sizeof Da) == 0);
            const float xm[3] = {-1.00000012f, 0.5f, -0.3f};
            fl_margin_ce_forward_cpu(&La, NULL, xm, 3, y, FL_INDEX_I32, 1, 3, FL_DTYPE_F32, &o, ws, wsb);
            const double zy = 64.0 * ((double)xm[0] - 0.5 * sin(0.5));
            const double want = log(exp(64.0 * 0.5 - zy) + exp(64.0 * (double)-0.3f - zy) + 1.0);
            CHECK(fabs(La - want) <= 1e-6 * want, "x_y = -1 - 2^-23: loss %.9g, want %.9g (unclamped fallback)", La,
                  want);
        }
        /* SphereFace-like m1 = 2, m2 = 0 at theta = 0: sin(0) / 1e-6 = 0 (the header's formula; the
         * derivative's limit would be m1^2 = 4) */
        o.m1 = 2.0f; o.m2 = 0.0f;
        CHECK_STATUS(fl_margin_ce_fused_cpu(L, NULL, D, xv, 3, y, FL_INDEX_I32, NULL, 1.0f, 1, 3, FL_DTYPE_F32, &o, ws,
                                            wsb), FL_OK, "m1 = 2 at x_y = 1");
        CHECK(D[0] == 0.0f, "m1 = 2, m2 = 0, x_y = 1: EXACT dlogits[y] %g, the header's formula gives 0", D[0]);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
        /* x_y = -1: ArcFace's fallback phi = -1 - m2 sin m2, phi' = 1 in both modes */
        float De[3], Ds[3], Le, Lsv;
        o.reduction = FL_REDUCTION_SUM;
        fl_margin_ce_fused_cpu(&Le, NULL, De, xn, 3, y, FL_INDEX_I32, NULL, 1.0f, 1, 3, FL_DTYPE_F32, &o, ws, wsb);
        o.grad_mode = FL_MARGIN_GRAD_STRAIGHT;
        fl_margin_ce_fused_cpu(&Lsv, NULL, Ds, xn, 3, y, FL_INDEX_I32, NULL, 1.0f, 1, 3, FL_DTYPE_F32, &o, ws, wsb);
        const double zy = 64.0 * (-1.0 - 0.5 * sin(0.5));
        const double want = log1p(exp(64.0 * 0.5 - zy) + exp(64.0 * -0.3 - zy));
        CHECK(fabs(Le - want) <= 1e-6 * want && Le == Lsv && memcmp(De, Ds, sizeof De) == 0,
              "x_y = -1: loss %.9g (want %.9g), straight %.9g, gradients equal %d", Le, want, Lsv,
              memcmp(De, Ds, sizeof De) == 0);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    /* STRAIGHT vs EXACT: the same loss and lse bitwise, the same non-target gradients bitwise, the
     * target's divided by phi' where the margin applies */
    {
        const int64_t N = 5, C = 30;
        float xv[150], de[150], dsv[150], le[5], ls[5], lse_e[5], lse_s[5];
        int32_t y[5];
        tu_rng r = tu_rng_seed(9);
        for (int k = 0; k < 150; k++) xv[k] = (float)tu_uniform_in(&r, -1, 1);
        for (int64_t i = 0; i < N; i++) { y[i] = (int32_t)tu_int_in(&r, 0, C - 1); xv[i * C + y[i]] = 0.3f + 0.1f * i; }
        o.reduction = FL_REDUCTION_NONE;
        o.m1 = 1.35f; o.m2 = 0.25f; o.m3 = 0.1f; o.s = 30.0f;
        fl_margin_ce_fused_cpu(le, lse_e, de, xv, C, y, FL_INDEX_I32, NULL, 1.0f, N, C, FL_DTYPE_F32, &o, ws, wsb);
        o.grad_mode = FL_MARGIN_GRAD_STRAIGHT;
        fl_margin_ce_fused_cpu(ls, lse_s, dsv, xv, C, y, FL_INDEX_I32, NULL, 1.0f, N, C, FL_DTYPE_F32, &o, ws, wsb);
        int same = memcmp(le, ls, sizeof le) == 0 && memcmp(lse_e, lse_s, sizeof lse_e) == 0, ratio = 1;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < C; j++) {
                if (j != y[i]) { same &= de[i * C + j] == dsv[i * C + j]; continue; }
                const double th = acos((double)xv[i * C + j]);
                const double dphi = 1.35 * sin(1.35 * th + 0.25) / sin(th);
                ratio &= fabs(de[i * C + j] - dsv[i * C + j] * dphi) <= 1e-6 * fabs(de[i * C + j]);
            }
        CHECK(same && ratio, "STRAIGHT vs EXACT: loss / lse / non-target gradients equal %d, target ratio phi' %d",
              same, ratio);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    /* C = 1: p = 1, loss 0, gradient 0 (also at x_y = 1 with EXACT's large phi') */
    {
        const float xv[2] = {1.0f, 0.3f};
        const int64_t y[2] = {0, 0};
        o.reduction = FL_REDUCTION_NONE;
        CHECK_STATUS(fl_margin_ce_fused_cpu(L, LS, D, xv, 1, y, FL_INDEX_I64, NULL, 1.0f, 2, 1, FL_DTYPE_F32, &o, ws,
                                            wsb), FL_OK, "C = 1");
        CHECK(L[0] == 0.0f && L[1] == 0.0f && D[0] == 0.0f && D[1] == 0.0f && fabsf(LS[0] - 64.0f * cosf(0.5f)) < 1e-4f,
              "C = 1: loss (%g, %g), dlogits (%g, %g), lse %g", L[0], L[1], D[0], D[1], LS[0]);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    /* a confident row: loss = log1p(tiny), accurate to the fp32 rounding */
    {
        float xv[10];
        const int32_t y[1] = {0};
        for (int j = 0; j < 10; j++) xv[j] = j == 0 ? 1.0f : 0.5f;
        o.m2 = 0.0f; o.m3 = 0.0f; o.reduction = FL_REDUCTION_SUM;
        CHECK_STATUS(fl_margin_ce_fused_cpu(L, NULL, D, xv, 10, y, FL_INDEX_I32, NULL, 1.0f, 1, 10, FL_DTYPE_F32, &o,
                                            ws, wsb), FL_OK, "confident");
        const double so = 9 * exp(-32.0), want = log1p(so);   /* 1.1e-13: lse - z_y would lose 5% of it */
        CHECK(fabs(L[0] - want) <= 1e-6 * want, "confident row: loss %.9g, want %.9g", L[0], want);
        CHECK(fabs(D[0] + 64 * so / (1 + so)) <= 1e-6 * 64 * so, "confident row: dlogits[y] %.9g", D[0]);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    /* every row ignored: MEAN NaN with zero gradient, SUM 0, NONE zeros; lse zeros */
    {
        float xv[12];
        for (int k = 0; k < 12; k++) xv[k] = NAN;   /* not read */
        const int64_t y[3] = {-100, -100, -100};
        const fl_reduction reds[3] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_NONE};
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            tu_poison(L, sizeof L);
            tu_poison(LS, sizeof LS);
            tu_poison(D, sizeof D);
            CHECK_STATUS(fl_margin_ce_fused_cpu(L, LS, D, xv, 4, y, FL_INDEX_I64, NULL, 1.0f, 3, 4, FL_DTYPE_F32, &o, ws,
                                                wsb), FL_OK, "all ignored");
            int zero = 1;
            for (int j = 0; j < 12; j++) zero &= tu_bits(D, FL_DTYPE_F32, j) == 0;
            for (int j = 0; j < 3; j++) zero &= tu_bits(LS, FL_DTYPE_F32, j) == 0;
            if (k == 0) CHECK(isnan(L[0]), "all ignored MEAN = %g, want NaN", L[0]);
            else if (k == 1) CHECK(L[0] == 0.0f, "all ignored SUM = %g, want 0", L[0]);
            else CHECK(L[0] == 0.0f && L[1] == 0.0f && L[2] == 0.0f, "all ignored NONE = %g %g %g", L[0], L[1], L[2]);
            CHECK(tu_is_poison(L, 4, k < 2 ? 1 : 3), "all ignored %s: loss past the end written", red_name(reds[k]));
            CHECK(zero, "all ignored %s: dlogits / lse not all +0", red_name(reds[k]));
            CHECK_STATUS(fl_margin_ce_forward_cpu(L, NULL, xv, 4, y, FL_INDEX_I64, 3, 4, FL_DTYPE_F32, &o, ws, wsb),
                         FL_OK, "all ignored forward");
            CHECK(k == 0 ? isnan(L[0]) : L[0] == 0.0f, "all ignored forward %s = %g", red_name(reds[k]), L[0]);
        }
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    /* N = 0: SUM 0, MEAN NaN, NONE writes nothing; NULL arrays fine */
    {
        const fl_reduction reds[3] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_NONE};
        size_t w0;
        CHECK_STATUS(fl_margin_ce_workspace_size(&w0, 0, 5, FL_DTYPE_BF16, NULL), FL_OK, "N=0 size");
        for (int k = 0; k < 3; k++) {
            o.reduction = reds[k];
            L[0] = 5.0f;
            CHECK_STATUS(fl_margin_ce_forward_cpu(L, NULL, NULL, 5, NULL, FL_INDEX_I32, 0, 5, FL_DTYPE_BF16, &o, ws, w0),
                         FL_OK, "N=0 forward");
            if (k == 0) CHECK(L[0] == 0.0f, "N = 0 SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 NONE wrote the loss");
            L[0] = 5.0f;
            CHECK_STATUS(fl_margin_ce_fused_cpu(L, NULL, NULL, NULL, 5, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5,
                                                FL_DTYPE_F16, &o, ws, w0), FL_OK, "N=0 fused");
            if (k == 0) CHECK(L[0] == 0.0f, "N = 0 fused SUM = %g", L[0]);
            else if (k == 1) CHECK(isnan(L[0]), "N = 0 fused MEAN = %g, want NaN", L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 fused NONE wrote the loss");
        }
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    /* the default options (opts NULL): s = 64, ArcFace m2 = 0.5, EXACT, MEAN, ignore_index -100 */
    {
        const float xv[6] = {0.1f, 0.9f, -0.3f, 0.5f, 0.2f, -0.8f};
        const int32_t y[2] = {-100, 1};
        float l1, l2;
        fl_margin_ce_forward_cpu(&l1, NULL, xv, 3, y, FL_INDEX_I32, 2, 3, FL_DTYPE_F32, NULL, ws, wsb);
        o.reduction = FL_REDUCTION_SUM;
        fl_margin_ce_forward_cpu(&l2, NULL, xv + 3, 3, y + 1, FL_INDEX_I32, 1, 3, FL_DTYPE_F32, &o, ws, wsb);
        const double zy = 64 * cos(acos((double)0.2f) + 0.5);
        const double want = log1p(exp(64 * (double)0.5f - zy) + exp(64 * (double)-0.8f - zy));
        CHECK(l1 == l2 && fabs(l1 - want) <= 1e-6 * want, "opts NULL: %.9g, want the second row's %.9g (%.9g)", l1,
              l2, want);
        o = (fl_margin_options)FL_MARGIN_OPTIONS_INIT;
    }
    free(ws);
}

/* ---- the results do not depend on the thread count ---------------------------------------------- */
static void test_threads(void) {
#ifdef _OPENMP
    const int64_t N = 64, C = 3001;
    float* x = tu_xmalloc((size_t)(N * C) * 4);
    float* d1 = tu_xmalloc((size_t)(N * C) * 4);
    float* d2 = tu_xmalloc((size_t)(N * C) * 4);
    int32_t y[64];
    tu_rng r = tu_rng_seed(3);
    for (int64_t k = 0; k < N * C; k++) x[k] = (float)tu_uniform_in(&r, -1, 1);
    for (int64_t i = 0; i < N; i++) y[i] = i % 9 == 4 ? -100 : (int32_t)tu_int_in(&r, 0, C - 1);
    fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
    o.m1 = 1.35f; o.m2 = 0.25f; o.m3 = 0.1f;
    size_t wsb;
    fl_margin_ce_workspace_size(&wsb, N, C, FL_DTYPE_F32, &o);
    void* ws = tu_xmalloc(wsb);
    float a, b;
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK_STATUS(fl_margin_ce_fused_cpu(&a, NULL, d1, x, C, y, FL_INDEX_I32, NULL, 1.0f, N, C, FL_DTYPE_F32, &o, ws,
                                        wsb), FL_OK, "1 thread");
    omp_set_num_threads(nt > 1 ? nt : 4);
    CHECK_STATUS(fl_margin_ce_fused_cpu(&b, NULL, d2, x, C, y, FL_INDEX_I32, NULL, 1.0f, N, C, FL_DTYPE_F32, &o, ws,
                                        wsb), FL_OK, "n threads");
    omp_set_num_threads(nt);
    check_bitwise("margin MEAN loss, 1 thread == many", &a, &b, 4);
    check_bitwise("margin dlogits, 1 thread == many", d1, d2, (size_t)(N * C) * 4);
    free(x); free(d1); free(d2); free(ws);
#endif
}

/* ---- workspace size query ----------------------------------------------------------------------- */
static size_t al256(size_t x) { return (x + 255) / 256 * 256; }

static void test_workspace_size(void) {
    const int64_t Ns[5] = {0, 1, 7, 1000, 4097};
    const int64_t Cs[6] = {1, 8191, 8192, 8193, 20000, 100000};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 6; b++) {
            size_t got = 0;
            const size_t n = (size_t)Ns[a], ch = (size_t)((Cs[b] + 8191) / 8192);
            const size_t want = 256 + al256(4 * n) + al256(8 * n) + al256(32 * n * ch);
            CHECK_STATUS(fl_margin_ce_workspace_size(&got, Ns[a], Cs[b], FL_DTYPE_BF16, NULL), FL_OK, "size");
            CHECK(got == want, "fl_margin_ce_workspace_size(N=%lld, C=%lld) = %zu, want %zu", (long long)Ns[a],
                  (long long)Cs[b], got, want);
            size_t g2 = 0;
            fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
            o.m3 = 0.4f;
            fl_margin_ce_workspace_size(&g2, Ns[a], Cs[b], FL_DTYPE_F32, &o);
            CHECK(g2 == got, "workspace size depends on dtype / options: %zu vs %zu", g2, got);
        }
}

/* ---- bad arguments ------------------------------------------------------------------------------ */
/* the last error names `needle` (NULL: nothing to look for) */
static int msg_has(const char* needle) { return !needle || strstr(fl_last_error(), needle) != NULL; }

/* status, a message naming the function (and `what_` when non-NULL), and no output written */
#define EXPECT_MSG(call_, want, what, needle)                                                               \
    do {                                                                                                    \
        tu_poison(L, sizeof L);                                                                             \
        tu_poison(LS, sizeof LS);                                                                           \
        tu_poison(D, sizeof D);                                                                             \
        fl_status s_ = (call_);                                                                             \
        CHECK_STATUS(s_, want, what);                                                                       \
        if ((want) != FL_OK) {                                                                              \
            CHECK(strstr(fl_last_error(), fnname) != NULL, "%s: message \"%s\" does not name %s", what,     \
                  fl_last_error(), fnname);                                                                 \
            CHECK(msg_has(needle), "%s: message \"%s\" does not name \"%s\"", what, fl_last_error(),       \
                  (needle) ? (const char*)(needle) : "");                                                   \
            int clean_ = 1;                                                                                 \
            for (size_t k_ = 0; k_ < sizeof L; k_++) clean_ &= ((unsigned char*)L)[k_] == TU_POISON_BYTE;   \
            for (size_t k_ = 0; k_ < sizeof LS; k_++) clean_ &= ((unsigned char*)LS)[k_] == TU_POISON_BYTE; \
            for (size_t k_ = 0; k_ < sizeof D; k_++) clean_ &= ((unsigned char*)D)[k_] == TU_POISON_BYTE;   \
            CHECK(clean_, "%s: an output was written on error", what);                                      \
        } else {                                                                                            \
            CHECK(fl_last_error()[0] == 0, "%s: last error \"%s\" after success", what, fl_last_error());   \
        }                                                                                                   \
    } while (0)
#define EXPECT(call_, want, what) EXPECT_MSG(call_, want, what, (const char*)NULL)

static void test_errors(void) {
    float X[64], L[16], LS[16], D[64], G[16];
    int64_t y[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int k = 0; k < 64; k++) X[k] = (float)((k % 7) - 3) / 4.0f;
    for (int k = 0; k < 16; k++) G[k] = 1.0f;
    size_t wsb;
    fl_margin_ce_workspace_size(&wsb, 8, 8, FL_DTYPE_F32, NULL);
    char* ws = tu_xmalloc(wsb + 512);
    fl_margin_options o = FL_MARGIN_OPTIONS_INIT, ob;
    const fl_dtype F = FL_DTYPE_F32;
    const fl_index_dtype I = FL_INDEX_I64;
    const char* fnname = "fl_margin_ce_forward_cpu";

#define FWD(loss_, lse_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_) \
    fl_margin_ce_forward_cpu(loss_, lse_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_)
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_OK, "valid forward");
    EXPECT(FWD(L, NULL, X, 8, y, I, 8, 8, F, NULL, ws, wsb), FL_OK, "opts NULL");
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, -1, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N < 0", "N (-1)");
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 0, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "C < 1", "C (0)");
    EXPECT_MSG(FWD(L, LS, X, 7, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld < C", "ld (7)");
    EXPECT(FWD(L, LS, X, INT64_MAX / 4, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N*ld overflow");
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, (fl_dtype)7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dtype 7", "dtype (7)");
    EXPECT_MSG(FWD(L, LS, X, 8, y, (fl_index_dtype)5, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "index_dtype",
               "index_dtype (5)");
    EXPECT_MSG(FWD(NULL, LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL", "loss");
    EXPECT(FWD(NULL, NULL, NULL, 8, NULL, I, 0, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL, N=0");
    EXPECT_MSG(FWD(L, LS, NULL, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "logits NULL", "logits");
    EXPECT_MSG(FWD(L, LS, X, 8, NULL, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "targets NULL", "targets");
    EXPECT(FWD(L, NULL, NULL, 8, NULL, I, 0, 8, F, &o, ws, wsb), FL_OK, "N = 0, NULL arrays");
    EXPECT_MSG(FWD(L, LS, (char*)X + 2, 8, y, I, 7, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "logits misaligned",
               "logits");
    EXPECT_MSG(FWD(L, LS, X, 8, (char*)y + 4, I, 7, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "targets misaligned",
               "targets");
    EXPECT_MSG(FWD((float*)((char*)L + 2), LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
               "loss misaligned", "loss");
    EXPECT_MSG(FWD(L, (float*)((char*)LS + 1), X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
               "lse misaligned", "lse");
    EXPECT(FWD(L, LS, (char*)X + 2, 8, y, I, 8, 8, FL_DTYPE_BF16, &o, ws, wsb), FL_OK, "bf16 logits 2-byte aligned");
    {
        const int32_t y32[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        EXPECT(FWD(L, LS, X, 8, (const char*)y32 + 4, FL_INDEX_I32, 7, 8, F, &o, ws, wsb), FL_OK,
               "int32 targets 4-byte aligned");
    }
    /* options */
    const struct { int field; float v; const char* needle; } bad[] = {
        {0, 0.0f, "opts->s"}, {0, -1.0f, "opts->s"}, {0, NAN, "opts->s"}, {0, INFINITY, "opts->s"},
        {1, 0.5f, "opts->m1"}, {1, 0.0f, "opts->m1"}, {1, NAN, "opts->m1"}, {1, INFINITY, "opts->m1"},
        {2, -0.1f, "opts->m2"}, {2, 3.14159274f, "opts->m2"}, {2, 4.0f, "opts->m2"}, {2, NAN, "opts->m2"},
        {2, INFINITY, "opts->m2"}, {3, -0.1f, "opts->m3"}, {3, NAN, "opts->m3"}, {3, INFINITY, "opts->m3"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ob = o;
        float* f = bad[k].field == 0 ? &ob.s : bad[k].field == 1 ? &ob.m1 : bad[k].field == 2 ? &ob.m2 : &ob.m3;
        *f = bad[k].v;
        char what[64];
        snprintf(what, sizeof what, "%s = %g", bad[k].needle, (double)bad[k].v);
        EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, what, bad[k].needle);
    }
    const struct { int field; float v; } good[] = {
        {0, 1e-30f}, {0, 1e30f}, {1, 1.0f}, {1, 7.5f}, {2, 0.0f}, {2, 3.14159250f}, {3, 0.0f}, {3, 2.0f},
    };
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        ob = o;
        float* f = good[k].field == 0 ? &ob.s : good[k].field == 1 ? &ob.m1 : good[k].field == 2 ? &ob.m2 : &ob.m3;
        *f = good[k].v;
        EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_OK, "boundary option value accepted");
    }
    ob = o;
    ob.grad_mode = (fl_margin_grad)2;
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_mode 2", "grad_mode");
    ob.grad_mode = (fl_margin_grad)-1;
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_mode -1", "grad_mode");
    ob = o;
    ob.reduction = FL_REDUCTION_BATCHMEAN;
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction BATCHMEAN",
               "reduction");
    ob.reduction = (fl_reduction)7;
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction 7");
    ob.reduction = (fl_reduction)-1;
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction -1");
    ob = o;
    ob.easy_margin = 7;
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_OK, "easy_margin any nonzero");
    ob = o;
    ob.ignore_index = 3;
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_OK, "ignore_index a valid class");
    ob = o;
    ob.struct_size = sizeof(fl_margin_options) - 8;
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size", "struct_size");
    /* workspace */
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, F, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL", "workspace");
    EXPECT_MSG(FWD(L, LS, X, 8, y, I, 8, 8, F, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace",
               "fl_margin_ce_workspace_size");
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &o, ws, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "zero workspace");
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &o, ws + 1, wsb), FL_OK, "CPU: unaligned workspace fine");
    /* aliasing (inputs may alias each other) */
    EXPECT_MSG(FWD(X + 3, LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps logits",
               "loss");
    ob = o;
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FWD(X + 60, LS, X, 8, y, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss [N] overlaps logits end");
    EXPECT(FWD((float*)(y + 6), LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps targets");
    EXPECT(FWD((float*)(ws + 300), LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss overlaps workspace");
    EXPECT_MSG(FWD(L, X + 60, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "lse overlaps logits", "lse");
    EXPECT(FWD(L, (float*)(y + 7), X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "lse overlaps targets");
    EXPECT(FWD(LS + 7, LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps lse");
    EXPECT(FWD(LS + 8, LS, X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_OK, "loss right after lse");
    EXPECT(FWD(L, (float*)(ws + 256), X, 8, y, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "lse overlaps workspace");
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &o, (void*)X, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps logits");
    EXPECT(FWD(L, LS, X, 8, y, I, 8, 8, F, &o, (void*)y, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps targets");
    EXPECT(FWD(L, LS, X, 8, X, FL_INDEX_I32, 8, 8, F, &o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE,
           "targets == logits (inputs may alias; then the bits are out-of-range targets)");
#undef FWD

    fnname = "fl_margin_ce_fused_cpu";
#define FUS(loss_, lse_, dx_, x_, t_, gl_, gs_, N_, o_, ws_, wsb_) \
    fl_margin_ce_fused_cpu(loss_, lse_, dx_, x_, 8, t_, I, gl_, gs_, N_, 8, F, o_, ws_, wsb_)
    EXPECT(FUS(L, LS, D, X, y, G, 1.0f, 8, &o, ws, wsb), FL_OK, "valid fused");
    EXPECT(FUS(NULL, LS, D, X, y, G, 1.0f, 8, &o, ws, wsb), FL_OK, "fused loss NULL");
    EXPECT(FUS(NULL, NULL, D, X, y, NULL, 1.0f, 8, &o, ws, wsb), FL_OK, "fused loss, lse, grad_loss NULL");
    EXPECT_MSG(FUS(L, LS, NULL, X, y, G, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits NULL", "dlogits");
    EXPECT_MSG(FUS(L, LS, D, X, y, G, NAN, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale NaN", "grad_scale");
    EXPECT_MSG(FUS(L, LS, D, X, y, G, -INFINITY, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale -inf",
               "grad_scale");
    EXPECT(FUS(L, LS, D, X, y, G, 1.0f, 8, &o, ws, 100), FL_ERR_INSUFFICIENT_WORKSPACE, "fused small ws");
    EXPECT(FUS(L, LS, D, X, y, G, 1.0f, -3, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused N < 0");
    ob = o;
    ob.m2 = NAN;
    EXPECT_MSG(FUS(L, LS, D, X, y, G, 1.0f, 8, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused m2 NaN", "m2");
    ob = o;
    ob.s = -2.0f;
    EXPECT_MSG(FUS(L, LS, D, X, y, G, 1.0f, 8, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused s < 0", "opts->s");
    EXPECT_MSG(FUS(L, LS, X + 1, X, y, G, 1.0f, 7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
               "dlogits partially overlaps logits", "in place");
    EXPECT(FUS(L, LS, X + 8, X, y, G, 1.0f, 7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits one row off logits");
    EXPECT(FUS(L, LS, (float*)y, X, y, G, 1.0f, 1, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps targets");
    EXPECT_MSG(FUS(L, LS, D, X, y, D + 63, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps grad_loss",
               "grad_loss");
    EXPECT(FUS(D + 5, LS, D, X, y, G, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps dlogits");
    EXPECT(FUS(L, D + 60, D, X, y, G, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "lse overlaps dlogits");
    EXPECT(FUS(L, LS, D, X, y, L, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps grad_loss");
    EXPECT(FUS(L, G, D, X, y, G, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "lse overlaps grad_loss");
    EXPECT(FUS(L, LS, (float*)(ws + 256), X, y, G, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "dlogits overlaps workspace");
    EXPECT(FUS(L, LS, D, X, y, (const float*)ws, 1.0f, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "workspace overlaps grad_loss");
    EXPECT(FUS(L, LS, (char*)D + 2, X, y, G, 1.0f, 7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits misaligned");
    EXPECT(FUS(L, LS, D, X, y, (const float*)((char*)G + 2), 1.0f, 7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "grad_loss misaligned");
    EXPECT(FUS(L, LS, D, X, y, X, 1.0f, 8, &o, ws, wsb), FL_OK, "grad_loss == logits (inputs may alias)");
    EXPECT(FUS(L, NULL, NULL, NULL, NULL, NULL, 1.0f, 0, &o, ws, wsb), FL_OK, "fused N = 0, NULL arrays");
    {   /* in place is allowed (D used as the logits) */
        for (int k = 0; k < 64; k++) D[k] = X[k];
        fl_status st = FUS(L, LS, D, D, y, G, 1.0f, 8, &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "in place dlogits == logits");
    }
#undef FUS

    /* out-of-range targets: the first bad row named, nothing written (both passes, both index types) */
    {
        const int64_t bad64[6] = {0, -100, 3, 8, -5, 99};   /* row 3 is the first bad one (8 == C) */
        const int32_t bad32[6] = {1, -5, 8, 0, 2, 2};       /* row 1 */
        const char* fns[2] = {"fl_margin_ce_forward_cpu", "fl_margin_ce_fused_cpu"};
        for (int pass = 0; pass < 2; pass++)
            for (int w = 0; w < 2; w++) {
                fnname = fns[pass];
                const void* t = w ? (const void*)bad32 : (const void*)bad64;
                const fl_index_dtype ti = w ? FL_INDEX_I32 : FL_INDEX_I64;
                const char* needle = w ? "targets[1] = -5" : "targets[3] = 8";
                for (int red = 0; red < 3; red++) {
                    ob = o;
                    ob.reduction = (fl_reduction)red;
                    if (pass == 0)
                        EXPECT_MSG(fl_margin_ce_forward_cpu(L, LS, X, 8, t, ti, 6, 8, F, &ob, ws, wsb),
                                   FL_ERR_TARGET_OUT_OF_RANGE, "out-of-range target", needle);
                    else
                        EXPECT_MSG(fl_margin_ce_fused_cpu(L, LS, D, X, 8, t, ti, G, 1.0f, 6, 8, F, &ob, ws, wsb),
                                   FL_ERR_TARGET_OUT_OF_RANGE, "out-of-range target", needle);
                }
            }
        /* ignore_index -1 (insightface's convention) makes -1 an ignored row, not a bad one */
        const int64_t t1[3] = {-1, 2, 7};
        ob = o;
        ob.ignore_index = -1;
        fnname = "fl_margin_ce_fused_cpu";
        EXPECT(fl_margin_ce_fused_cpu(L, LS, D, X, 8, t1, FL_INDEX_I64, G, 1.0f, 3, 8, F, &ob, ws, wsb), FL_OK,
               "ignore_index -1");
        ob.ignore_index = -100;
        EXPECT_MSG(fl_margin_ce_fused_cpu(L, LS, D, X, 8, t1, FL_INDEX_I64, G, 1.0f, 3, 8, F, &ob, ws, wsb),
                   FL_ERR_TARGET_OUT_OF_RANGE, "-1 not ignored", "targets[0] = -1");
        /* in place with a bad target: the logits are not destroyed */
        float Xc[64];
        memcpy(Xc, X, sizeof Xc);
        fl_status st = fl_margin_ce_fused_cpu(L, LS, Xc, Xc, 8, bad64, FL_INDEX_I64, G, 1.0f, 6, 8, F, &o, ws, wsb);
        CHECK(st == FL_ERR_TARGET_OUT_OF_RANGE && memcmp(Xc, X, sizeof Xc) == 0,
              "in place with a bad target: status %d, logits kept %d", (int)st, memcmp(Xc, X, sizeof Xc) == 0);
    }

    fnname = "fl_margin_ce_workspace_size";
    {
        size_t b = 77;
        EXPECT(fl_margin_ce_workspace_size(NULL, 8, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "bytes NULL");
        EXPECT(fl_margin_ce_workspace_size(&b, -1, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "size N < 0");
        EXPECT(fl_margin_ce_workspace_size(&b, 8, 0, F, NULL), FL_ERR_INVALID_ARGUMENT, "size C < 1");
        EXPECT(fl_margin_ce_workspace_size(&b, 8, 8, (fl_dtype)9, NULL), FL_ERR_INVALID_ARGUMENT, "size dtype");
        ob = o;
        ob.struct_size = 3;
        EXPECT(fl_margin_ce_workspace_size(&b, 8, 8, F, &ob), FL_ERR_INVALID_ARGUMENT, "size struct_size");
        EXPECT(fl_margin_ce_workspace_size(&b, INT64_MAX, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "size overflow");
        CHECK(b == 77, "bytes written on error (%zu)", b);
    }
#ifndef FL_WITH_CUDA
    if (!fl_cuda_built()) {
        fnname = "fl_margin_ce_forward_cuda";
        EXPECT(fl_margin_ce_forward_cuda(L, LS, X, 8, y, I, 8, 8, F, &o, ws, wsb, NULL), FL_ERR_NOT_BUILT,
               "forward cuda not built");
        fnname = "fl_margin_ce_fused_cuda";
        EXPECT(fl_margin_ce_fused_cuda(L, LS, D, X, 8, y, I, G, 1.0f, 8, 8, F, &o, ws, wsb, NULL), FL_ERR_NOT_BUILT,
               "fused cuda not built");
    }
#endif
    free(ws);
}

/* ---- the shared validator: the CUDA-only rule and the resolved parameters -------------------------- */
static void test_validator(void) {
    const char* fn = "fl_margin_ce_fused_cuda";
    unsigned char* x = aligned_alloc(256, 81920);   /* 2 rows of ld 20000 bf16: the ranges the checks see */
    unsigned char* d = aligned_alloc(256, 4096);
    int64_t t[4] = {0, 1, 2, 3};
    memset(x, 0, 81920);
    float loss[4], lse[4];
    size_t wsb;
    fl_margin_ce_workspace_size(&wsb, 4, 20000, FL_DTYPE_F16, NULL);
    unsigned char* ws = aligned_alloc(256, (wsb + 256 + 255) / 256 * 256);
    fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
    fl__margin_params p;
    fl_status st = fl__margin_validate(fn, FL__PASS_FUSED, 1, loss, lse, d, x, 20, t, FL_INDEX_I64, NULL, 1.0f, 4, 20,
                                       FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "aligned") && strstr(fl_last_error(), fn),
          "cuda: misaligned workspace: %d %s", (int)st, fl_last_error());
    st = fl__margin_validate(fn, FL__PASS_FUSED, 0, loss, lse, d, x, 20, t, FL_INDEX_I64, NULL, 1.0f, 4, 20,
                             FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_OK, "cpu: misaligned workspace accepted: %d %s", (int)st, fl_last_error());
    /* resolved parameters */
    const float m1s[4] = {1.0f, 1.0f, 2.0f, 1.35f}, m2s[4] = {0.5f, 0.0f, 0.0f, 0.25f}, m3s[4] = {0.0f, 0.4f, 0.0f, 0.1f};
    const int64_t Cs[4] = {1, 8192, 8193, 20000};
    for (int k = 0; k < 4; k++) {
        o.m1 = m1s[k]; o.m2 = m2s[k]; o.m3 = m3s[k];
        o.s = 30.0f + k;
        o.easy_margin = k == 2 ? 5 : k & 1;
        o.grad_mode = (fl_margin_grad)(k & 1);
        o.reduction = (fl_reduction)(k % 3);
        o.ignore_index = 42 + k;
        int32_t flag;
        o.error_flag = &flag;
        st = fl__margin_validate(fn, FL__PASS_FORWARD, 1, loss, NULL, NULL, x, 20000, t, FL_INDEX_I32, NULL, 1.0f,
                                 2 - (k & 1), Cs[k], FL_DTYPE_BF16, &o, ws, wsb, &p);
        CHECK(st == FL_OK, "validator params %d: %s", k, fl_last_error());
        const float tmax = (float)((3.14159265358979323846 - (double)m2s[k]) / (double)m1s[k]);
        const float smm = (float)((double)m2s[k] * sin((double)m2s[k]));
        CHECK(p.N == 2 - (k & 1) && p.C == Cs[k] && p.ld == 20000 && p.dtype == FL_DTYPE_BF16 &&
              p.index_dtype == FL_INDEX_I32 && p.s == o.s && p.m1 == o.m1 && p.m2 == o.m2 && p.m3 == o.m3 &&
              p.easy_margin == (o.easy_margin != 0) && p.grad_mode == o.grad_mode && p.ignore_index == 42 + k &&
              p.reduction == o.reduction && p.error_flag == &flag && p.cosface == (k == 1) &&
              fabsf(p.theta_max - tmax) <= 2e-7f * tmax && fabsf(p.sinmm - smm) <= 1e-7f &&
              p.chunks == (Cs[k] + 8191) / 8192,
              "resolved parameters %d: cosface %d theta_max %.9g (want %.9g) sinmm %.9g (want %.9g) chunks %lld", k,
              p.cosface, p.theta_max, tmax, p.sinmm, smm, (long long)p.chunks);
    }
    free(x); free(d); free(ws);
}

int main(void) {
    test_values();
    test_insightface();
    test_workspace_size();

    /* the grid: margins x easy_margin x s x grad mode, the other knobs cycled through coprime periods */
    const float M[5][3] = {{1.0f, 0.5f, 0.0f}, {1.0f, 0.0f, 0.4f}, {1.0f, 0.3f, 0.2f}, {2.0f, 0.0f, 0.0f},
                           {1.35f, 0.25f, 0.1f}};
    const float ss[3] = {64.0f, 30.0f, 1.0f};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const int64_t smallC[7] = {3, 100, 8, 37, 2, 64, 5};
    const int64_t smallN[5] = {1, 2, 6, 13, 9};
    const float gss[3] = {1.0f, 0.7f, -1.5f};
    const int64_t igns[4] = {-100, -100, -1, 3};
    uint64_t seed = 1;
    int k = 0;
    tu_quiet = 1;
    for (int mi = 0; mi < 5; mi++)
        for (int e = 0; e < 2; e++)
            for (int si = 0; si < 3; si++)
                for (int gm = 0; gm < 2; gm++)
                    for (int rep = 0; rep < 2; rep++, k++) {
                        cfg_t c;
                        memset(&c, 0, sizeof c);
                        c.m1 = M[mi][0]; c.m2 = M[mi][1]; c.m3 = M[mi][2];
                        c.easy = e;
                        c.s = ss[si];
                        c.gm = (fl_margin_grad)gm;
                        c.red = reds[k % 3];
                        c.dt = dts[(k / 3) % 3];
                        c.C = smallC[k % 7];
                        c.N = smallN[(k / 2) % 5];
                        c.pad = (k % 5 == 1) ? 3 : (k % 5 == 3) ? 1 : 0;
                        c.tgt64 = (k / 4) % 2;
                        c.ignore_index = igns[k % 4];
                        if (c.ignore_index == 3 && c.C <= 3) c.ignore_index = -100;
                        c.p_ignore = (k % 3 == 0) ? 0.0 : 0.25;
                        c.gl = (k % 7) & 1;
                        c.gscale = gss[(k / 7) % 3];
                        c.rot = k;
                        run_cfg(&c, seed++);
                    }
    /* rows crossing chunk boundaries, and large class counts */
    const int64_t bigC[3] = {8191, 8193, 20000};
    for (int v = 0; v < 3; v++)
        for (int mi = 0; mi < 5; mi++, k++) {
            cfg_t c;
            memset(&c, 0, sizeof c);
            c.m1 = M[mi][0]; c.m2 = M[mi][1]; c.m3 = M[mi][2];
            c.easy = k % 2;
            c.s = ss[k % 3];
            c.gm = (fl_margin_grad)((k / 2) % 2);
            c.red = reds[k % 3];
            c.dt = dts[(k / 3) % 3];
            c.C = bigC[v];
            c.N = v == 2 ? 3 : 4;
            c.pad = (k % 2) ? 7 : 0;
            c.tgt64 = k % 2;
            c.ignore_index = -100;
            c.p_ignore = 0.2;
            c.gl = 1;
            c.gscale = gss[k % 3];
            c.rot = k;
            run_cfg(&c, seed++);
        }
    /* every row ignored (each reduction, int64 ignore_index beyond int32), N = 1 with each row kind,
     * C = 1 */
    {
        cfg_t c;
        memset(&c, 0, sizeof c);
        c.m1 = 1.0f; c.m2 = 0.5f; c.m3 = 0.0f; c.s = 64.0f; c.dt = FL_DTYPE_F32; c.C = 20; c.N = 5; c.pad = 2;
        c.tgt64 = 1; c.ignore_index = -((int64_t)1 << 40); c.all_ignored = 1; c.gl = 1; c.gscale = 2.0f;
        for (int ri = 0; ri < 3; ri++) {
            c.red = reds[ri];
            c.dt = dts[ri];
            run_cfg(&c, seed++);
        }
        c.all_ignored = 0;
        c.ignore_index = -100;
        c.N = 1;
        for (int kind = 0; kind < KINDS; kind++) {
            c.m1 = M[kind % 5][0]; c.m2 = M[kind % 5][1]; c.m3 = M[kind % 5][2];
            c.rot = kind;
            c.dt = dts[kind % 3];
            c.red = reds[kind % 3];
            c.gm = (fl_margin_grad)(kind % 2);
            run_cfg(&c, seed++);
        }
        c.C = 1;
        c.N = 8;
        c.pad = 1;
        for (int mi = 0; mi < 5; mi++) {
            c.m1 = M[mi][0]; c.m2 = M[mi][1]; c.m3 = M[mi][2];
            c.rot = mi;
            c.red = reds[mi % 3];
            c.dt = dts[mi % 3];
            c.p_ignore = 0.3;
            run_cfg(&c, seed++);
        }
    }
    tu_quiet = 0;
    printf("%d grid configurations, %lld finite differences checked (%lld skipped at x_y = +-1 / the boundary)\n", k,
           (long long)fd_total, (long long)fd_skipped);
    test_threads();
    test_validator();
    test_errors();
    return tu_finish();
}
