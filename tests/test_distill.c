/* test_distill.c — CPU backend of the distillation divergences (forward KL, reverse KL,
 * generalised JSD on raw logits; include/fusedloss.h section 10) against an independent
 * long-double reference written from the header's definitions (explicit log_softmax, the KL /
 * JSD sums literally, M = beta P + (1 - beta) Q in the linear domain), whose analytic gradient is
 * itself checked by central finite differences of the reference loss. Grid: beta 0 / 1 / 0.3 /
 * 0.5 / 0.9, T 1 / 2 / 0.5, t2_scale, every reduction (NONE, MEAN, SUM, BATCHMEAN), labels NULL /
 * int32 / int64 with ignored rows (their logits are NaN: never read), V from 1 to 20000 (rows
 * crossing the 8192-column chunks), ld > V with NaN padding (neither read nor written), student
 * fp32 / fp16 / bf16 with teacher of the same dtype or fp32, grad_loss NULL / scalar / per row,
 * grad_scale != 1, loss NULL, in place (dstudent == student), logits up to +-80 and one-hot
 * teachers. Edge cases (all rows ignored, N = 0, closed forms, JSD symmetry), thread-count
 * independence, the workspace size query and every bad argument's status and message (outputs
 * untouched on error).
 *
 * Build / run: make test (this is build/test_distill). Prints "N passed, M failed".
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
#include "../src/internal.h" /* fl__distill_validate: the CUDA-only rules and the resolved parameters */

/* ------------------------------------------------------------------------------------------
 * Tolerances, |lib - ref| <= atol + rtol*|ref| + slack. The reference is long double on the same
 * dtype-rounded inputs, the library double rounded once to fp32 (loss) or to the student dtype
 * through fp32 (dstudent).
 *   loss    : rtol RTOL_LOSS (fp32 output: 6e-8; margin for the double sums);
 *   dstudent: 1 ulp of the dtype (rtol 2^-23 / 2^-10 / 2^-7, covering the double -> fp32 ->
 *             dtype rounding) plus one subnormal step of the dtype (atol);
 *   slack   : SLACK_CALC x the element's sensitivity: (p_j + q_j)(1 + |s_j/T| + |t_j/T| + |lse_s|
 *             + |lse_t| + |l| + |H|) (x |g c / T| for dstudent; summed over j for the loss), the
 *             absolute error of double arithmetic on log-probabilities that large.
 *   finite differences (long double, h = FD_H): FD_RTOL relative + FD_ATOL x |g c / T| (1 + |l| +
 *             |lse_s| + |lse_t|).
 * Indexed by fl_dtype: F32 = 0, F16 = 1, BF16 = 2.
 * ---------------------------------------------------------------------------------------- */
static const double RTOL_LOSS = 1e-6;
static const double RTOL_DS[3] = {1.1920928955078125e-7, 9.765625e-4, 7.8125e-3};
static const double ATOL_DS[3] = {1.5e-45, 5.97e-8, 9.2e-41};
static const double SLACK_CALC = 1e-12;
static const long double FD_H = 1e-6L;
static const double FD_RTOL = 1e-7, FD_ATOL = 1e-8;

typedef long double LD;

/* ---- reference ---------------------------------------------------------------------------- */

/* log sum_j exp(z_j), max-shifted */
static LD ref_lse(const LD* z, int64_t V) {
    LD m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; j++) if (z[j] > m) m = z[j];
    for (int64_t j = 0; j < V; j++) s += expl(z[j] - m);
    return m + logl(s);
}

typedef struct {
    LD l;              /* the divergence, unscaled */
    LD lse_s, lse_t;   /* of s/T, t/T */
    LD H;              /* JSD: (1 - beta) KL(Q || M) */
    LD sens;           /* sum_j sensitivity_j */
} ref_row_t;

/* One row from the header's definitions. x, y: raw logits; lq, lp: scratch [V] (log_softmax out);
 * dl: d l / d x_j (NULL: loss only); sens: per-element sensitivity (or NULL). */
static ref_row_t ref_row(const LD* x, const LD* y, int64_t V, LD T, LD beta, LD* lq, LD* lp, LD* dl, LD* sens) {
    ref_row_t r;
    for (int64_t j = 0; j < V; j++) { lq[j] = x[j] / T; lp[j] = y[j] / T; }
    r.lse_s = ref_lse(lq, V);
    r.lse_t = ref_lse(lp, V);
    for (int64_t j = 0; j < V; j++) { lq[j] -= r.lse_s; lp[j] -= r.lse_t; }   /* log_softmax */
    LD l = 0, H = 0;
    for (int64_t j = 0; j < V; j++) {
        const LD q = expl(lq[j]), p = expl(lp[j]);
        if (beta == 0) {                       /* KL(P || Q) = sum p (log p - log q), 0 log 0 = 0 */
            if (p > 0) l += p * (lp[j] - lq[j]);
        } else if (beta == 1) {                /* KL(Q || P) */
            if (q > 0) l += q * (lq[j] - lp[j]);
        } else {                               /* beta KL(P || M) + (1 - beta) KL(Q || M) */
            const LD m = beta * p + (1 - beta) * q, lm = logl(m);
            if (p > 0) l += beta * (p * (lp[j] - lm));
            if (q > 0) { const LD t = (1 - beta) * (q * (lq[j] - lm)); l += t; H += t; }
        }
    }
    r.l = l;
    r.H = H;
    r.sens = 0;
    for (int64_t j = 0; j < V; j++) {
        const LD q = expl(lq[j]), p = expl(lp[j]);
        const LD sj = p + q == 0 ? 0 : (p + q) * (1 + fabsl(x[j] / T) + fabsl(y[j] / T) + fabsl(r.lse_s) +
                                                  fabsl(r.lse_t) + fabsl(l) + fabsl(H));
        if (sens) sens[j] = sj;
        r.sens += sj;
        if (!dl) continue;
        if (beta == 0) dl[j] = (q - p) / T;
        else if (beta == 1) dl[j] = q > 0 ? q * (lq[j] - lp[j] - l) / T : 0;
        else {
            const LD m = beta * p + (1 - beta) * q;
            const LD h = q > 0 ? (1 - beta) * q * (lq[j] - logl(m)) : 0;
            dl[j] = (h - q * H) / T;
        }
    }
    return r;
}

/* ---- one configuration ------------------------------------------------------------------- */
typedef struct {
    int64_t N, V, pad_s, pad_t;   /* ld = V + pad */
    fl_dtype dt, tdt;
    float beta, T;
    int t2;
    fl_reduction red;
    int labels;                   /* 0 NULL, 1 int32, 2 int64 */
    int64_t ignore_index;
    int all_ignored;
    int gl;                       /* grad_loss given */
    float gscale;
    double scale;                 /* logit spread */
    int special;                  /* row 0 logits uniform in [-80, 80]; row 1 a one-hot teacher */
    int masked;                   /* -inf logits (0 log 0 = 0): columns j % 7 == 3 in both, == 5 in the
                                     teacher only (beta != 1), == 6 in the student only (beta != 0) */
} cfg_t;

static const char* red_name(fl_reduction r) {
    return r == FL_REDUCTION_NONE ? "none" : r == FL_REDUCTION_MEAN ? "mean" : r == FL_REDUCTION_SUM ? "sum"
                                                                                                  : "batchmean";
}

static void run_cfg(const cfg_t* c, uint64_t seed) {
    const int64_t N = c->N, V = c->V, lds = V + c->pad_s, ldt = V + c->pad_t;
    const size_t es = tu_dtype_size(c->dt), tes = tu_dtype_size(c->tdt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const size_t sbytes = (size_t)(N * lds) * es, tbytes = (size_t)(N * ldt) * tes;
    tu_rng r = tu_rng_seed(seed);
    char name[256];
    snprintf(name, sizeof name, "beta=%g T=%g t2=%d %s N=%lld V=%lld lds=%lld ldt=%lld %s/%s lab=%d%s gl=%d gs=%g",
             c->beta, c->T, c->t2, red_name(c->red), (long long)N, (long long)V, (long long)lds, (long long)ldt,
             tu_dtype_name(c->dt), tu_dtype_name(c->tdt), c->labels, c->all_ignored ? "(all ignored)" : "", c->gl,
             c->gscale);

    /* inputs: ignored rows NaN (poison); padding columns alternately +30000 (a max taken over
     * them would be wrong: NaN drops out of a max) and NaN (a sum over them would be NaN) */
    void* s = tu_xmalloc(sbytes);
    void* t = tu_xmalloc(tbytes);
    tu_poison(s, sbytes);
    tu_poison(t, tbytes);
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = V; j < lds; j += 2) tu_store(s, c->dt, i * lds + j, 30000.0f);
        for (int64_t j = V; j < ldt; j += 2) tu_store(t, c->tdt, i * ldt + j, 30000.0f);
    }
    int32_t* lab32 = tu_xmalloc((size_t)N * 4 + 4);
    int64_t* lab64 = tu_xmalloc((size_t)N * 8 + 8);
    int* ign = tu_xmalloc((size_t)N * sizeof(int) + sizeof(int));
    int64_t D = 0;
    for (int64_t i = 0; i < N; i++) {
        ign[i] = c->labels && (c->all_ignored || tu_uniform(&r) < 0.3);
        int64_t v = ign[i] ? c->ignore_index : tu_int_in(&r, -5, V + 5);   /* any value: never range-checked */
        if (!ign[i] && v == c->ignore_index) v = c->ignore_index + 1;
        if (!ign[i] && c->labels == 2 && (i % 3 == 1)) v = (int64_t)1 << 40;   /* beyond int32 */
        lab32[i] = (int32_t)v;
        lab64[i] = v;
        D += !ign[i];
        if (ign[i]) continue;
        for (int64_t j = 0; j < V; j++) {
            double sv = c->scale * tu_normal(&r), tv = c->scale * tu_normal(&r) + 0.5 * sv;   /* correlated */
            if (c->special && i == 0) { sv = tu_uniform_in(&r, -80, 80); tv = tu_uniform_in(&r, -80, 80); }
            tu_store(s, c->dt, i * lds + j, (float)sv);
            tu_store(t, c->tdt, i * ldt + j, (float)tv);
        }
        if (c->special && i == 1) {   /* teacher: all mass on one class */
            const int64_t k = tu_int_in(&r, 0, V - 1);
            for (int64_t j = 0; j < V; j++) tu_store(t, c->tdt, i * ldt + j, j == k ? 80.0f : -80.0f);
        } else if (c->masked) {       /* (not the one-hot row: its teacher could be all -inf) */
            for (int64_t j = 0; j < V; j++) {
                const int m7 = (int)(j % 7);
                if (m7 == 3 || (m7 == 6 && c->beta != 0.0f)) tu_store(s, c->dt, i * lds + j, -INFINITY);
                if (m7 == 3 || (m7 == 5 && c->beta != 1.0f)) tu_store(t, c->tdt, i * ldt + j, -INFINITY);
            }
        }
    }
    const void* labels = c->labels == 0 ? NULL : c->labels == 1 ? (const void*)lab32 : (const void*)lab64;
    const fl_index_dtype lt = c->labels == 2 ? FL_INDEX_I64 : FL_INDEX_I32;
    float* gl = tu_xmalloc((size_t)(N + 1) * 4);
    for (int64_t i = 0; i < N + 1; i++) gl[i] = (float)tu_uniform_in(&r, -2.0, 2.0);

    fl_distill_options o = FL_DISTILL_OPTIONS_INIT;
    o.temperature = c->T;
    o.beta = c->beta;
    o.ignore_index = c->ignore_index;
    o.reduction = c->red;
    o.t2_scale = c->t2;
    size_t wsb = 0;
    CHECK_STATUS(fl_distill_workspace_size(&wsb, N, V, c->dt, &o), FL_OK, "workspace size");
    void* ws = tu_xmalloc(wsb);
    tu_poison(ws, wsb);

    /* reference */
    const LD T = c->T, beta = c->beta, cs = c->t2 ? (LD)c->T * (LD)c->T : 1;
    const LD denom = c->red == FL_REDUCTION_MEAN ? (LD)D : c->red == FL_REDUCTION_BATCHMEAN ? (LD)N : 1;
    const size_t ne = (size_t)(N * V) + 1;
    double* lref = tu_xmalloc((size_t)(N + 1) * 8);
    double* lsl = tu_xmalloc((size_t)(N + 1) * 8);
    double* dref = tu_xmalloc(ne * 8);
    double* dsl = tu_xmalloc(ne * 8);
    double* got = tu_xmalloc(ne * 8);
    LD* x = tu_xmalloc((size_t)V * sizeof(LD));
    LD* y = tu_xmalloc((size_t)V * sizeof(LD));
    LD* lq = tu_xmalloc((size_t)V * sizeof(LD));
    LD* lp = tu_xmalloc((size_t)V * sizeof(LD));
    LD* dl = tu_xmalloc((size_t)V * sizeof(LD));
    LD* sens = tu_xmalloc((size_t)V * sizeof(LD));
    /* finite differences kept for the library's own comparison: element index, value, tolerance */
    int64_t* fdi = tu_xmalloc(ne * 8);
    double* fdv = tu_xmalloc(ne * 8);
    double* fdt = tu_xmalloc(ne * 8);
    LD sum = 0, sumsl = 0;
    double fdmax = 0;
    int64_t fdbad = 0, fdn = 0;
    for (int64_t i = 0; i < N; i++) {
        if (ign[i]) {
            lref[i] = 0; lsl[i] = 0;
            for (int64_t j = 0; j < V; j++) { dref[i * V + j] = 0; dsl[i * V + j] = 0; }
            continue;
        }
        for (int64_t j = 0; j < V; j++) { x[j] = tu_load(s, c->dt, i * lds + j); y[j] = tu_load(t, c->tdt, i * ldt + j); }
        const ref_row_t rr = ref_row(x, y, V, T, beta, lq, lp, dl, sens);
        const LD g = (LD)c->gscale * (c->gl ? (LD)gl[none ? i : 0] : 1) / denom;
        lref[i] = (double)(cs * rr.l);
        lsl[i] = SLACK_CALC * (double)(cs * rr.sens);
        sum += cs * rr.l;
        sumsl += cs * rr.sens;
        for (int64_t j = 0; j < V; j++) {
            dref[i * V + j] = (double)(g * cs * dl[j]);
            dsl[i * V + j] = SLACK_CALC * (double)(fabsl(g * cs / T) * sens[j]);
        }
        /* the analytic gradient against central differences of the reference loss: every column
         * of small rows, 5 columns (two at the chunk boundary when present) of large ones */
        const int64_t cols[5] = {0, V - 1, V > 8192 ? 8191 : V / 2, V > 8192 ? 8192 : V / 3, V / 5};
        const int64_t ncol = V <= 64 ? V : 5;
        if (i < 3) {
            for (int64_t k = 0; k < ncol; k++) {
                const int64_t j = V <= 64 ? k : cols[k];
                const LD x0 = x[j];
                x[j] = x0 + FD_H;
                const LD lpl = ref_row(x, y, V, T, beta, lq, lp, NULL, NULL).l;
                x[j] = x0 - FD_H;
                const LD lmi = ref_row(x, y, V, T, beta, lq, lp, NULL, NULL).l;
                x[j] = x0;
                const double fd = (double)(g * cs * (lpl - lmi) / (2 * FD_H));
                const double d = fabs(fd - dref[i * V + j]);
                const double tol = FD_RTOL * fabs(fd) +
                                   FD_ATOL * (double)(fabsl(g * cs / T) * (1 + fabsl(rr.l) + fabsl(rr.lse_s) + fabsl(rr.lse_t)));
                fdi[fdn] = i * V + j;
                fdv[fdn] = fd;
                fdt[fdn] = tol;
                fdn++;
                if (d > fdmax) fdmax = d;
                if (!(d <= tol)) {
                    if (fdbad < 3)
                        printf("  %s: fd row %lld col %lld: analytic %.12g fd %.12g (tol %.3g)\n", name, (long long)i,
                               (long long)j, dref[i * V + j], fd, tol);
                    fdbad++;
                }
            }
        }
    }
    CHECK(fdbad == 0, "%s: %lld of %lld finite differences disagree with the analytic reference (maxdiff %.3g)",
          name, (long long)fdbad, (long long)fdn, fdmax);

    /* reduced reference */
    double lred = 0, lredsl = 0;
    if (!none) {
        lred = c->red == FL_REDUCTION_SUM ? (double)sum : denom > 0 ? (double)(sum / denom) : NAN;
        lredsl = SLACK_CALC * (double)(sumsl / (denom > 0 ? denom : 1)) + 1e-30;
    }

    float* loss = tu_xmalloc((size_t)(nl + 1) * 4);
    float* loss_f = tu_xmalloc((size_t)(nl + 1) * 4);
    void* ds = tu_xmalloc(sbytes + 4);
    void* ds2 = tu_xmalloc(sbytes + 4);
    char nm[320];

    /* forward */
    tu_poison(loss, (size_t)(nl + 1) * 4);
    fl_status st = fl_distill_forward_cpu(loss, s, lds, t, ldt, c->tdt, labels, lt, N, V, c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s forward", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s forward loss", name);
        if (none) {
            for (int64_t i = 0; i < N; i++) got[i] = loss[i];
            check_close_ex(nm, got, lref, lsl, N, 1e-30, RTOL_LOSS);
        } else {
            got[0] = loss[0];
            check_close_ex(nm, got, &lred, &lredsl, 1, 1e-30, RTOL_LOSS);
        }
        CHECK(tu_is_poison(loss, 4, nl), "%s: loss[%lld] (past the end) written", nm, (long long)nl);
        for (int64_t i = 0; none && i < N; i++)
            if (ign[i]) CHECK(loss[i] == 0.0f, "%s: ignored row %lld loss %g != 0", nm, (long long)i, loss[i]);
    }

    /* fused */
    tu_poison(loss_f, (size_t)(nl + 1) * 4);
    tu_poison(ds, sbytes + 4);
    st = fl_distill_fused_cpu(loss_f, ds, s, lds, t, ldt, c->tdt, labels, lt, c->gl ? gl : NULL, c->gscale, N, V,
                              c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s fused", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s fused loss == forward", name);
        check_bitwise(nm, loss_f, loss, (size_t)nl * 4);
        CHECK(tu_is_poison(loss_f, 4, nl), "%s: loss past the end written", nm);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < V; j++) got[i * V + j] = tu_load(ds, c->dt, i * lds + j);
        snprintf(nm, sizeof nm, "%s fused dstudent", name);
        check_close_ex(nm, got, dref, dsl, N * V, ATOL_DS[c->dt], RTOL_DS[c->dt]);
        int64_t badpad = 0, badign = 0;
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = V; j < lds; j++) badpad += !tu_is_poison(ds, es, i * lds + j);
            for (int64_t j = 0; ign[i] && j < V; j++) badign += tu_bits(ds, c->dt, i * lds + j) != 0;
        }
        badpad += !tu_is_poison((char*)ds + sbytes, 4, 0);
        CHECK(badpad == 0, "%s: %lld padding / past-the-end elements of dstudent written", nm, (long long)badpad);
        CHECK(badign == 0, "%s: %lld elements of ignored rows not +0", nm, (long long)badign);
    }

    /* fused, loss NULL: the same dstudent */
    tu_poison(ds2, sbytes + 4);
    st = fl_distill_fused_cpu(NULL, ds2, s, lds, t, ldt, c->tdt, labels, lt, c->gl ? gl : NULL, c->gscale, N, V,
                              c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s fused loss=NULL dstudent", name);
    if (CHECK_STATUS(st, FL_OK, nm)) check_bitwise(nm, ds2, ds, sbytes + 4);

    /* in place: dstudent == student; expected: the first V columns of ds, the padding of s */
    memcpy(ds2, s, sbytes);
    tu_poison((char*)ds2 + sbytes, 4);
    tu_poison(loss_f, (size_t)(nl + 1) * 4);
    st = fl_distill_fused_cpu(loss_f, ds2, ds2, lds, t, ldt, c->tdt, labels, lt, c->gl ? gl : NULL, c->gscale, N, V,
                              c->dt, &o, ws, wsb);
    snprintf(nm, sizeof nm, "%s fused in place", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        void* want = tu_xmalloc(sbytes + 4);
        memcpy(want, s, sbytes);
        tu_poison((char*)want + sbytes, 4);
        for (int64_t i = 0; i < N; i++)
            memcpy((char*)want + (size_t)(i * lds) * es, (char*)ds + (size_t)(i * lds) * es, (size_t)V * es);
        check_bitwise(nm, ds2, want, sbytes + 4);
        check_bitwise(nm, loss_f, loss, (size_t)nl * 4);
        free(want);
    }

    /* the library's dstudent against the finite differences directly (dtype tolerance + theirs) */
    if (fdn > 0) {
        double* fg = tu_xmalloc((size_t)fdn * 8);
        double* fs = tu_xmalloc((size_t)fdn * 8);
        for (int64_t k = 0; k < fdn; k++) {
            const int64_t i = fdi[k] / V, j = fdi[k] % V;
            fg[k] = tu_load(ds, c->dt, i * lds + j);
            fs[k] = fdt[k] + dsl[fdi[k]] + RTOL_DS[c->dt] * fabs(fdv[k]);
        }
        snprintf(nm, sizeof nm, "%s fused dstudent vs finite differences", name);
        check_close_ex(nm, fg, fdv, fs, fdn, ATOL_DS[c->dt], 0.0);
        free(fg); free(fs);
    }

    free(s); free(t); free(lab32); free(lab64); free(ign); free(gl); free(ws); free(lref); free(lsl); free(dref);
    free(dsl); free(got); free(x); free(y); free(lq); free(lp); free(dl); free(sens); free(loss); free(loss_f);
    free(ds); free(ds2); free(fdi); free(fdv); free(fdt);
}

/* ---- closed forms and edge cases -------------------------------------------------------------- */
static void test_values(void) {
    size_t wsb;
    fl_distill_workspace_size(&wsb, 64, 64, FL_DTYPE_F32, NULL);
    void* ws = tu_xmalloc(wsb);
    fl_distill_options o = FL_DISTILL_OPTIONS_INIT;
    float L[8], D[8];

    /* V = 2, s = (0, 0), t = (log 3, 0): q = (1/2, 1/2), p = (3/4, 1/4) */
    {
        const float sv[2] = {0.0f, 0.0f}, tv[2] = {(float)log(3.0), 0.0f};
        const double p0 = exp((double)tv[0]) / (exp((double)tv[0]) + 1.0), p1 = 1 - p0;   /* 3/4 up to fp32 log 3 */
        const double q0 = 0.5, q1 = 0.5;
        o.reduction = FL_REDUCTION_SUM;
        o.beta = 0.0f;
        CHECK_STATUS(fl_distill_fused_cpu(L, D, sv, 2, tv, 2, FL_DTYPE_F32, NULL, FL_INDEX_I32, NULL, 1.0f, 1, 2,
                                          FL_DTYPE_F32, &o, ws, wsb), FL_OK, "closed form fkl");
        double want = p0 * log(p0 / q0) + p1 * log(p1 / q1);
        CHECK(fabs(L[0] - want) <= 1e-7 * fabs(want), "KL(P||Q) = %.9g, want %.9g", L[0], want);
        CHECK(fabs(D[0] - (q0 - p0)) <= 1e-7 && fabs(D[1] - (q1 - p1)) <= 1e-7, "dKL = (%g, %g), want (%g, %g)",
              D[0], D[1], q0 - p0, q1 - p1);
        o.beta = 1.0f;
        CHECK_STATUS(fl_distill_forward_cpu(L, sv, 2, tv, 2, FL_DTYPE_F32, NULL, FL_INDEX_I32, 1, 2, FL_DTYPE_F32, &o,
                                            ws, wsb), FL_OK, "closed form rkl");
        want = q0 * log(q0 / p0) + q1 * log(q1 / p1);
        CHECK(fabs(L[0] - want) <= 1e-7 * fabs(want), "KL(Q||P) = %.9g, want %.9g", L[0], want);
        o.beta = 0.5f;
        CHECK_STATUS(fl_distill_forward_cpu(L, sv, 2, tv, 2, FL_DTYPE_F32, NULL, FL_INDEX_I32, 1, 2, FL_DTYPE_F32, &o,
                                            ws, wsb), FL_OK, "closed form jsd");
        const double m0 = (p0 + q0) / 2, m1 = (p1 + q1) / 2;
        want = 0.5 * (p0 * log(p0 / m0) + p1 * log(p1 / m1)) + 0.5 * (q0 * log(q0 / m0) + q1 * log(q1 / m1));
        CHECK(fabs(L[0] - want) <= 1e-6 * fabs(want), "JSD = %.9g, want %.9g", L[0], want);
        /* T = 2, t2_scale: the loss of s/2, t/2, times 4 */
        o.beta = 0.0f;
        o.temperature = 2.0f;
        o.t2_scale = 1;
        const float s2[2] = {0.0f, 0.0f}, t2[2] = {2.0f * tv[0], 0.0f};
        CHECK_STATUS(fl_distill_forward_cpu(L, s2, 2, t2, 2, FL_DTYPE_F32, NULL, FL_INDEX_I32, 1, 2, FL_DTYPE_F32, &o,
                                            ws, wsb), FL_OK, "closed form T=2");
        want = 4 * (p0 * log(p0 / q0) + p1 * log(p1 / q1));
        CHECK(fabs(L[0] - want) <= 1e-6 * fabs(want), "T=2 t2_scale KL = %.9g, want %.9g", L[0], want);
        o = (fl_distill_options)FL_DISTILL_OPTIONS_INIT;
    }
    /* JSD with beta = 1/2 is symmetric: swapping student and teacher keeps the loss */
    {
        float a[40], b[40], l1, l2;
        tu_rng r = tu_rng_seed(11);
        for (int k = 0; k < 40; k++) { a[k] = (float)(3 * tu_normal(&r)); b[k] = (float)(3 * tu_normal(&r)); }
        o.beta = 0.5f;
        o.reduction = FL_REDUCTION_SUM;
        fl_distill_forward_cpu(&l1, a, 20, b, 20, FL_DTYPE_F32, NULL, FL_INDEX_I32, 2, 20, FL_DTYPE_F32, &o, ws, wsb);
        fl_distill_forward_cpu(&l2, b, 20, a, 20, FL_DTYPE_F32, NULL, FL_INDEX_I32, 2, 20, FL_DTYPE_F32, &o, ws, wsb);
        CHECK(fabsf(l1 - l2) <= 1e-6f * fabsf(l1) && l1 > 0 && l1 <= 2 * logf(2.0f), "JSD(P,Q) %.9g vs JSD(Q,P) %.9g",
              l1, l2);
        /* identical distributions: every divergence 0, gradient 0 */
        const float betas[3] = {0.0f, 1.0f, 0.3f};
        for (int k = 0; k < 3; k++) {
            o.beta = betas[k];
            CHECK_STATUS(fl_distill_fused_cpu(&l1, D, a, 8, a, 8, FL_DTYPE_F32, NULL, FL_INDEX_I32, NULL, 1.0f, 1, 8,
                                              FL_DTYPE_F32, &o, ws, wsb), FL_OK, "P == Q");
            int zero = 1;
            for (int j = 0; j < 8; j++) zero &= fabsf(D[j]) <= 1e-15f;
            CHECK(fabsf(l1) <= 1e-15f && zero, "beta %g: P == Q gives loss %g, dstudent[0] %g", betas[k], l1, D[0]);
        }
        o = (fl_distill_options)FL_DISTILL_OPTIONS_INIT;
    }
    /* log m_j in the log domain: p_1 = e^-744 (a double subnormal) and q_1 = 0 give beta p_1 = 0 in
     * double, so log(beta p + (1 - beta) q) would be -inf and the term p_1 (log p_1 - log m_1)
     * +inf; the true JSD is finite (the reference is long double: no underflow) */
    {
        const float sv[3] = {0.0f, -INFINITY, 1.0f}, tv[3] = {0.0f, -744.0f, 0.5f};
        o.beta = 0.1f;
        o.reduction = FL_REDUCTION_SUM;
        CHECK_STATUS(fl_distill_fused_cpu(L, D, sv, 3, tv, 3, FL_DTYPE_F32, NULL, FL_INDEX_I32, NULL, 1.0f, 1, 3,
                                          FL_DTYPE_F32, &o, ws, wsb), FL_OK, "subnormal p");
        LD x[3] = {0, -INFINITY, 1}, y[3] = {0, -744, 0.5L}, lq[3], lp[3], dl[3];
        const ref_row_t rr = ref_row(x, y, 3, 1, (LD)0.1f, lq, lp, dl, NULL);
        CHECK(isfinite(L[0]) && fabs(L[0] - (double)rr.l) <= 1e-6 * fabs((double)rr.l),
              "JSD with a subnormal p and q = 0: %.9g, want %.9g", L[0], (double)rr.l);
        int ok = 1;
        for (int j = 0; j < 3; j++) ok &= fabs(D[j] - (double)dl[j]) <= 1e-7 * fabs((double)dl[j]) + 1e-30;
        CHECK(ok, "its gradient (%g %g %g), want (%g %g %g)", D[0], D[1], D[2], (double)dl[0], (double)dl[1],
              (double)dl[2]);
        o = (fl_distill_options)FL_DISTILL_OPTIONS_INIT;
    }
    /* every row ignored: MEAN NaN with zero gradient, SUM 0, BATCHMEAN 0 / N = 0, NONE zeros */
    {
        float sv[12], tv[12];
        for (int k = 0; k < 12; k++) { sv[k] = NAN; tv[k] = NAN; }   /* not read */
        const int64_t lab[3] = {-100, -100, -100};
        const fl_reduction reds[4] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_BATCHMEAN, FL_REDUCTION_NONE};
        for (int k = 0; k < 4; k++) {
            o.reduction = reds[k];
            o.beta = k == 1 ? 0.5f : 0.0f;
            tu_poison(L, sizeof L);
            tu_poison(D, sizeof D);
            CHECK_STATUS(fl_distill_fused_cpu(L, D, sv, 4, tv, 4, FL_DTYPE_F32, lab, FL_INDEX_I64, NULL, 1.0f, 2, 4,
                                              FL_DTYPE_F32, &o, ws, wsb), FL_OK, "all ignored");
            int zero = 1;
            for (int j = 0; j < 8; j++) zero &= tu_bits(D, FL_DTYPE_F32, j) == 0;
            if (k == 0) CHECK(isnan(L[0]), "all ignored MEAN = %g, want NaN", L[0]);
            else if (k < 3) CHECK(L[0] == 0.0f, "all ignored %s = %g, want 0", red_name(reds[k]), L[0]);
            else CHECK(L[0] == 0.0f && L[1] == 0.0f, "all ignored NONE = %g %g", L[0], L[1]);
            CHECK(tu_is_poison(L, 4, k < 3 ? 1 : 2), "all ignored %s: loss past the end written", red_name(reds[k]));
            CHECK(zero, "all ignored %s: dstudent not all +0", red_name(reds[k]));
            CHECK_STATUS(fl_distill_forward_cpu(L, sv, 4, tv, 4, FL_DTYPE_F32, lab, FL_INDEX_I64, 2, 4, FL_DTYPE_F32,
                                                &o, ws, wsb), FL_OK, "all ignored forward");
            CHECK(k == 0 ? isnan(L[0]) : L[0] == 0.0f, "all ignored forward %s = %g", red_name(reds[k]), L[0]);
        }
        o = (fl_distill_options)FL_DISTILL_OPTIONS_INIT;
    }
    /* N = 0: SUM 0, MEAN / BATCHMEAN NaN, NONE writes nothing; NULL arrays fine */
    {
        const fl_reduction reds[4] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_BATCHMEAN, FL_REDUCTION_NONE};
        size_t w0;
        CHECK_STATUS(fl_distill_workspace_size(&w0, 0, 5, FL_DTYPE_BF16, NULL), FL_OK, "N=0 size");
        for (int k = 0; k < 4; k++) {
            o.reduction = reds[k];
            L[0] = 5.0f;
            CHECK_STATUS(fl_distill_forward_cpu(L, NULL, 5, NULL, 5, FL_DTYPE_BF16, NULL, FL_INDEX_I32, 0, 5,
                                                FL_DTYPE_BF16, &o, ws, w0), FL_OK, "N=0 forward");
            if (k == 0) CHECK(L[0] == 0.0f, "N = 0 SUM = %g", L[0]);
            else if (k < 3) CHECK(isnan(L[0]), "N = 0 %s = %g, want NaN", red_name(reds[k]), L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 NONE wrote the loss");
            L[0] = 5.0f;
            CHECK_STATUS(fl_distill_fused_cpu(L, NULL, NULL, 5, NULL, 5, FL_DTYPE_F32, NULL, FL_INDEX_I32, NULL, 1.0f,
                                              0, 5, FL_DTYPE_F16, &o, ws, w0), FL_OK, "N=0 fused");
            if (k == 0) CHECK(L[0] == 0.0f, "N = 0 fused SUM = %g", L[0]);
            else if (k < 3) CHECK(isnan(L[0]), "N = 0 fused %s = %g, want NaN", red_name(reds[k]), L[0]);
            else CHECK(L[0] == 5.0f, "N = 0 fused NONE wrote the loss");
        }
        o = (fl_distill_options)FL_DISTILL_OPTIONS_INIT;
    }
    /* F.kl_div(log_softmax(s/T), log_softmax(t/T), log_target=True, "batchmean") * T^2 is the
     * default beta with t2_scale and BATCHMEAN: equal to SUM / N */
    {
        float a[30], b[30], l1, l2;
        tu_rng r = tu_rng_seed(5);
        for (int k = 0; k < 30; k++) { a[k] = (float)(2 * tu_normal(&r)); b[k] = (float)(2 * tu_normal(&r)); }
        o.temperature = 2.0f;
        o.t2_scale = 1;
        o.reduction = FL_REDUCTION_BATCHMEAN;
        fl_distill_forward_cpu(&l1, a, 10, b, 10, FL_DTYPE_F32, NULL, FL_INDEX_I32, 3, 10, FL_DTYPE_F32, &o, ws, wsb);
        o.reduction = FL_REDUCTION_SUM;
        fl_distill_forward_cpu(&l2, a, 10, b, 10, FL_DTYPE_F32, NULL, FL_INDEX_I32, 3, 10, FL_DTYPE_F32, &o, ws, wsb);
        CHECK(fabsf(l1 - l2 / 3) <= 1e-7f * fabsf(l1), "BATCHMEAN %.9g != SUM / N %.9g", l1, l2 / 3);
        o = (fl_distill_options)FL_DISTILL_OPTIONS_INIT;
    }
    /* the default options (opts NULL) are forward KL, T = 1, MEAN, ignore_index -100 */
    {
        float a[6] = {1, 2, 3, 0, -1, 4}, b[6] = {0, 1, -2, 3, 3, 1}, l1, l2;
        const int32_t lab[2] = {-100, 7};
        fl_distill_forward_cpu(&l1, a, 3, b, 3, FL_DTYPE_F32, lab, FL_INDEX_I32, 2, 3, FL_DTYPE_F32, NULL, ws, wsb);
        o.reduction = FL_REDUCTION_SUM;
        fl_distill_forward_cpu(&l2, a + 3, 3, b + 3, 3, FL_DTYPE_F32, NULL, FL_INDEX_I32, 1, 3, FL_DTYPE_F32, &o, ws,
                               wsb);
        CHECK(l1 == l2 && l1 > 0, "opts NULL: %.9g, want the second row's KL %.9g", l1, l2);
        o = (fl_distill_options)FL_DISTILL_OPTIONS_INIT;
    }
    free(ws);
}

/* ---- the results do not depend on the thread count ---------------------------------------------- */
static void test_threads(void) {
#ifdef _OPENMP
    const int64_t N = 64, V = 3001;
    float* s = tu_xmalloc((size_t)(N * V) * 4);
    float* t = tu_xmalloc((size_t)(N * V) * 4);
    float* d1 = tu_xmalloc((size_t)(N * V) * 4);
    float* d2 = tu_xmalloc((size_t)(N * V) * 4);
    tu_rng r = tu_rng_seed(3);
    for (int64_t k = 0; k < N * V; k++) { s[k] = (float)(3 * tu_normal(&r)); t[k] = (float)(3 * tu_normal(&r)); }
    fl_distill_options o = FL_DISTILL_OPTIONS_INIT;
    o.beta = 0.3f;
    o.reduction = FL_REDUCTION_SUM;
    size_t wsb;
    fl_distill_workspace_size(&wsb, N, V, FL_DTYPE_F32, &o);
    void* ws = tu_xmalloc(wsb);
    float a, b;
    const int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK_STATUS(fl_distill_fused_cpu(&a, d1, s, V, t, V, FL_DTYPE_F32, NULL, FL_INDEX_I32, NULL, 1.0f, N, V,
                                      FL_DTYPE_F32, &o, ws, wsb), FL_OK, "1 thread");
    omp_set_num_threads(nt > 1 ? nt : 4);
    CHECK_STATUS(fl_distill_fused_cpu(&b, d2, s, V, t, V, FL_DTYPE_F32, NULL, FL_INDEX_I32, NULL, 1.0f, N, V,
                                      FL_DTYPE_F32, &o, ws, wsb), FL_OK, "n threads");
    omp_set_num_threads(nt);
    check_bitwise("JSD SUM loss, 1 thread == many", &a, &b, 4);
    check_bitwise("JSD dstudent, 1 thread == many", d1, d2, (size_t)(N * V) * 4);
    free(s); free(t); free(d1); free(d2); free(ws);
#endif
}

/* ---- workspace size query ----------------------------------------------------------------------- */
static size_t al256(size_t x) { return (x + 255) / 256 * 256; }

static void test_workspace_size(void) {
    const int64_t Ns[5] = {0, 1, 7, 1000, 4097};
    const int64_t Vs[6] = {1, 8191, 8192, 8193, 20000, 128256};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 6; b++) {
            size_t got = 0;
            const size_t n = (size_t)Ns[a], ch = (size_t)((Vs[b] + 8191) / 8192);
            const size_t want = 256 + al256(4 * n) + al256(8 * n) + al256(32 * n * ch);
            CHECK_STATUS(fl_distill_workspace_size(&got, Ns[a], Vs[b], FL_DTYPE_BF16, NULL), FL_OK, "size");
            CHECK(got == want, "fl_distill_workspace_size(N=%lld, V=%lld) = %zu, want %zu", (long long)Ns[a],
                  (long long)Vs[b], got, want);
            size_t g2 = 0;
            fl_distill_options o = FL_DISTILL_OPTIONS_INIT;
            o.beta = 0.5f;
            fl_distill_workspace_size(&g2, Ns[a], Vs[b], FL_DTYPE_F32, &o);
            CHECK(g2 == got, "workspace size depends on dtype / options: %zu vs %zu", g2, got);
        }
}

/* ---- bad arguments ------------------------------------------------------------------------------ */
/* status, a message naming the function, and no output written */
#define EXPECT(call_, want, what) ZT_EXPECT(call_, want, what, fnname, L, D)

static void test_errors(void) {
    float S[64], Tt[64], L[16], D[64], G[16];
    int64_t lab[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int k = 0; k < 64; k++) { S[k] = (float)(k % 7); Tt[k] = (float)(k % 5); }
    for (int k = 0; k < 16; k++) G[k] = 1.0f;
    size_t wsb;
    fl_distill_workspace_size(&wsb, 8, 8, FL_DTYPE_F32, NULL);
    char* ws = tu_xmalloc(wsb + 512);
    fl_distill_options o = FL_DISTILL_OPTIONS_INIT, ob;
    const fl_dtype F = FL_DTYPE_F32;
    const fl_index_dtype I = FL_INDEX_I64;
    const char* fnname = "fl_distill_forward_cpu";

#define FWD(loss_, s_, lds_, t_, ldt_, tdt_, lab_, lt_, N_, V_, dt_, o_, ws_, wsb_) \
    fl_distill_forward_cpu(loss_, s_, lds_, t_, ldt_, tdt_, lab_, lt_, N_, V_, dt_, o_, ws_, wsb_)
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_OK, "valid forward");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, -1, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N < 0");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 0, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "V < 1");
    EXPECT(FWD(L, S, 7, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld_student < V");
    EXPECT(FWD(L, S, 8, Tt, 7, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld_teacher < V");
    CHECK(strstr(fl_last_error(), "ld_teacher") != NULL, "ld_teacher message: %s", fl_last_error());
    EXPECT(FWD(L, S, INT64_MAX / 4, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N*ld overflow");
    EXPECT(FWD(NULL, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL");
    EXPECT(FWD(NULL, NULL, 8, NULL, 8, F, NULL, I, 0, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL, N=0");
    EXPECT(FWD(L, NULL, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "student NULL");
    EXPECT(FWD(L, S, 8, NULL, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "teacher NULL");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, (fl_dtype)7, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dtype 7");
    EXPECT(FWD(L, S, 8, Tt, 8, (fl_dtype)-1, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "teacher_dtype");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, (fl_index_dtype)5, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "label_dtype");
    EXPECT(FWD(L, S, 8, Tt, 8, F, NULL, (fl_index_dtype)5, 8, 8, F, &o, ws, wsb), FL_OK, "label_dtype unused without labels");
    EXPECT(FWD(L, S, 8, Tt, 8, FL_DTYPE_BF16, lab, I, 8, 8, FL_DTYPE_F16, &o, ws, wsb), FL_OK, "CPU: any teacher dtype");
    EXPECT(FWD(L, (char*)S + 2, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "student misaligned");
    EXPECT(FWD(L, S, 8, Tt, 8, F, (char*)lab + 4, I, 7, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "labels misaligned");
    const float temps[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        ob = o;
        ob.temperature = temps[k];
        EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad temperature");
        CHECK(strstr(fl_last_error(), "temperature") != NULL, "temperature %g message: %s", temps[k], fl_last_error());
    }
    ob = o;
    ob.temperature = 1e20f;
    ob.t2_scale = 1;
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "T^2 overflows");
    const float betas[4] = {-0.1f, 1.1f, NAN, -INFINITY};
    for (int k = 0; k < 4; k++) {
        ob = o;
        ob.beta = betas[k];
        EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad beta");
        CHECK(strstr(fl_last_error(), "beta") != NULL, "beta %g message: %s", betas[k], fl_last_error());
    }
    ob = o;
    ob.reduction = (fl_reduction)7;
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction 7");
    ob.reduction = (fl_reduction)4;
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction 4");
    ob.reduction = (fl_reduction)-1;
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "reduction -1");
    ob = o;
    ob.struct_size = sizeof(fl_distill_options) - 8;
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size");
    CHECK(strstr(fl_last_error(), "struct_size") != NULL, "struct_size message: %s", fl_last_error());
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "zero workspace");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws + 1, wsb), FL_OK, "CPU: unaligned workspace fine");
    /* aliasing */
    EXPECT(FWD(S + 3, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps student");
    ob = o;
    ob.reduction = FL_REDUCTION_NONE;
    EXPECT(FWD(Tt + 60, S, 8, Tt, 8, F, lab, I, 8, 8, F, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss [N] overlaps teacher end");
    EXPECT(FWD((float*)(lab + 6), S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps labels");
    EXPECT(FWD((float*)(ws + 300), S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps workspace");
    EXPECT(FWD(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, (void*)S, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps student");
    EXPECT(FWD(L, S, 8, S, 8, F, lab, I, 8, 8, F, &o, ws, wsb), FL_OK, "teacher == student (inputs may alias)");
#undef FWD

    fnname = "fl_distill_fused_cpu";
#define FUS(loss_, ds_, s_, lds_, t_, ldt_, lab_, gl_, gs_, N_, V_, o_, ws_, wsb_) \
    fl_distill_fused_cpu(loss_, ds_, s_, lds_, t_, ldt_, F, lab_, I, gl_, gs_, N_, V_, F, o_, ws_, wsb_)
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, wsb), FL_OK, "valid fused");
    EXPECT(FUS(NULL, D, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, wsb), FL_OK, "fused loss NULL");
    EXPECT(FUS(L, NULL, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent NULL");
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, G, NAN, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale NaN");
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, G, INFINITY, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale inf");
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, 100), FL_ERR_INSUFFICIENT_WORKSPACE, "fused small ws");
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, G, 1.0f, -3, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused N < 0");
    ob = o;
    ob.temperature = NAN;
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused temperature NaN");
    ob = o;
    ob.beta = 1.5f;
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused beta 1.5");
    EXPECT(FUS(L, S + 1, S, 8, Tt, 8, lab, G, 1.0f, 7, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent partially overlaps student");
    EXPECT(FUS(L, S + 8, S, 8, Tt, 8, lab, G, 1.0f, 7, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent one row off student");
    EXPECT(FUS(L, Tt, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent == teacher");
    EXPECT(FUS(L, (float*)lab, S, 8, Tt, 8, lab, G, 1.0f, 1, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent overlaps labels");
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, D + 63, 1.0f, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent overlaps grad_loss");
    EXPECT(FUS(D + 5, D, S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps dstudent");
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, L, 1.0f, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps grad_loss");
    EXPECT(FUS(L, (float*)(ws + 256), S, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent overlaps workspace");
    EXPECT(FUS(L, D, S, 8, Tt, 8, lab, (const float*)ws, 1.0f, 8, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps grad_loss");
    EXPECT(FUS(L, (char*)D + 2, S, 8, Tt, 8, lab, G, 1.0f, 7, 8, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dstudent misaligned");
    EXPECT(FUS(L, NULL, NULL, 8, NULL, 8, NULL, NULL, 1.0f, 0, 8, &o, ws, wsb), FL_OK, "fused N = 0, NULL arrays");
    {   /* in place is allowed (D used as the student) */
        for (int k = 0; k < 64; k++) D[k] = S[k];
        fl_status st = FUS(L, D, D, 8, Tt, 8, lab, G, 1.0f, 8, 8, &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "in place dstudent == student");
    }
#undef FUS
    fnname = "fl_distill_workspace_size";
    {
        size_t b = 77;
        EXPECT(fl_distill_workspace_size(NULL, 8, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "bytes NULL");
        EXPECT(fl_distill_workspace_size(&b, -1, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "size N < 0");
        EXPECT(fl_distill_workspace_size(&b, 8, 0, F, NULL), FL_ERR_INVALID_ARGUMENT, "size V < 1");
        EXPECT(fl_distill_workspace_size(&b, 8, 8, (fl_dtype)9, NULL), FL_ERR_INVALID_ARGUMENT, "size dtype");
        ob = o;
        ob.struct_size = 3;
        EXPECT(fl_distill_workspace_size(&b, 8, 8, F, &ob), FL_ERR_INVALID_ARGUMENT, "size struct_size");
        EXPECT(fl_distill_workspace_size(&b, INT64_MAX, 8, F, NULL), FL_ERR_INVALID_ARGUMENT, "size overflow");
        CHECK(b == 77, "bytes written on error (%zu)", b);
    }
#ifndef FL_WITH_CUDA
    if (!fl_cuda_built()) {
        fnname = "fl_distill_forward_cuda";
        EXPECT(fl_distill_forward_cuda(L, S, 8, Tt, 8, F, lab, I, 8, 8, F, &o, ws, wsb, NULL), FL_ERR_NOT_BUILT,
               "forward cuda not built");
        fnname = "fl_distill_fused_cuda";
        EXPECT(fl_distill_fused_cuda(L, D, S, 8, Tt, 8, F, lab, I, G, 1.0f, 8, 8, F, &o, ws, wsb, NULL),
               FL_ERR_NOT_BUILT, "fused cuda not built");
    }
#endif
    free(ws);
}

/* ---- the shared validator: CUDA-only rules and the resolved parameters ------------------------- */
static void test_validator(void) {
    const char* fn = "fl_distill_fused_cuda";
    unsigned char* s = aligned_alloc(256, 4096);
    unsigned char* t = aligned_alloc(256, 4096);
    unsigned char* d = aligned_alloc(256, 4096);
    memset(s, 0, 4096); memset(t, 0, 4096);
    float loss[4];
    size_t wsb;
    fl_distill_workspace_size(&wsb, 4, 20000, FL_DTYPE_F16, NULL);
    unsigned char* ws = aligned_alloc(256, (wsb + 256 + 255) / 256 * 256);
    fl_distill_options o = FL_DISTILL_OPTIONS_INIT;
    fl__distill_params p;
    const fl_dtype tds[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    for (int cuda = 0; cuda < 2; cuda++)
        for (int k = 0; k < 3; k++) {
            fl_status st = fl__distill_validate(fn, FL__PASS_FUSED, cuda, loss, d, s, 20, t, 20, tds[k], NULL,
                                                FL_INDEX_I32, NULL, 1.0f, 4, 20, FL_DTYPE_F16, &o, ws, wsb, &p);
            const fl_status want = (cuda && tds[k] == FL_DTYPE_BF16) ? FL_ERR_UNSUPPORTED : FL_OK;
            CHECK(st == want, "validator cuda=%d teacher %s: status %d, want %d (%s)", cuda, tu_dtype_name(tds[k]),
                  (int)st, (int)want, fl_last_error());
            if (st != FL_OK) CHECK(strstr(fl_last_error(), fn) && strstr(fl_last_error(), "teacher_dtype"),
                                   "message: %s", fl_last_error());
        }
    fl_status st = fl__distill_validate(fn, FL__PASS_FUSED, 1, loss, d, s, 20, t, 20, FL_DTYPE_F16, NULL, FL_INDEX_I32,
                                        NULL, 1.0f, 4, 20, FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "aligned"), "cuda: misaligned workspace: %d %s",
          (int)st, fl_last_error());
    st = fl__distill_validate(fn, FL__PASS_FUSED, 0, loss, d, s, 20, t, 20, FL_DTYPE_F16, NULL, FL_INDEX_I32, NULL,
                              1.0f, 4, 20, FL_DTYPE_F16, &o, ws + 16, wsb, &p);
    CHECK(st == FL_OK, "cpu: misaligned workspace accepted: %d %s", (int)st, fl_last_error());
    /* resolved parameters */
    const float betas[4] = {0.0f, 1.0f, 0.5f, 1e-30f};
    const fl__distill_mode modes[4] = {FL__DISTILL_FKL, FL__DISTILL_RKL, FL__DISTILL_JSD, FL__DISTILL_JSD};
    const int64_t Vs[4] = {1, 8192, 8193, 20000};
    for (int k = 0; k < 4; k++) {
        o.beta = betas[k];
        o.temperature = k == 2 ? 3.0f : 0.5f;
        o.t2_scale = k & 1;
        o.reduction = k == 3 ? FL_REDUCTION_BATCHMEAN : FL_REDUCTION_SUM;
        o.ignore_index = 42 + k;
        const int32_t lab[4] = {0, 0, 0, 0};
        st = fl__distill_validate(fn, FL__PASS_FORWARD, 1, loss, NULL, s, 20000, t, 20000, FL_DTYPE_F32, lab,
                                  FL_INDEX_I32, NULL, 1.0f, 2 - (k & 1), Vs[k], FL_DTYPE_F16, &o, ws, wsb, &p);
        CHECK(st == FL_OK, "validator params %d: %s", k, fl_last_error());
        const float ls = (k & 1) ? o.temperature * o.temperature : 1.0f;
        CHECK(p.mode == modes[k] && p.loss_scale == ls && p.chunks == (Vs[k] + 8191) / 8192 && p.N == 2 - (k & 1) &&
              p.V == Vs[k] && p.ld_s == 20000 && p.ld_t == 20000 && p.dtype == FL_DTYPE_F16 &&
              p.teacher_dtype == FL_DTYPE_F32 && p.labels == lab && p.label_dtype == FL_INDEX_I32 &&
              p.ignore_index == 42 + k && p.temperature == o.temperature && p.beta == o.beta &&
              p.reduction == o.reduction, "resolved parameters %d: mode %d loss_scale %g chunks %lld", k, (int)p.mode,
              p.loss_scale, (long long)p.chunks);
    }
    free(s); free(t); free(d); free(ws);
}

int main(void) {
    test_values();
    test_workspace_size();

    /* the grid: beta x T x reduction, with the other knobs cycled through coprime periods */
    const float betas[5] = {0.0f, 1.0f, 0.3f, 0.5f, 0.9f};
    const float temps[3] = {1.0f, 2.0f, 0.5f};
    const fl_reduction reds[4] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_BATCHMEAN};
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const int64_t smallV[7] = {1, 3, 8, 37, 2, 64, 5};
    const int64_t smallN[4] = {1, 2, 5, 9};
    const float gss[3] = {1.0f, 0.7f, -1.5f};
    const double scales[3] = {1.0, 4.0, 12.0};
    uint64_t seed = 1;
    int k = 0;
    tu_quiet = 1;
    for (int b = 0; b < 5; b++)
        for (int ti = 0; ti < 3; ti++)
            for (int ri = 0; ri < 4; ri++, k++) {
                cfg_t c;
                memset(&c, 0, sizeof c);
                c.beta = betas[b];
                c.T = temps[ti];
                c.red = reds[ri];
                c.V = smallV[k % 7];
                c.N = smallN[(k / 2) % 4];
                c.pad_s = (k % 5 == 1) ? 3 : 0;
                c.pad_t = (k % 3 == 2) ? 5 : 0;
                c.dt = dts[k % 3];
                c.tdt = (k % 11) < 5 ? FL_DTYPE_F32 : c.dt;
                c.t2 = (k / 3) % 2;
                c.labels = (k / 5) % 3;
                c.ignore_index = (k % 13 == 4) ? 3 : -100;
                c.all_ignored = 0;
                c.gl = (k % 7) & 1;
                c.gscale = gss[k % 3 == 0 ? 0 : (k / 7) % 3];
                c.scale = scales[(k / 11) % 3];
                c.special = (k % 4) != 3;
                c.masked = c.V >= 7 && (k % 2) == 0;
                run_cfg(&c, seed++);
            }
    /* rows crossing chunk boundaries, and large vocabularies */
    const int64_t bigV[4] = {8191, 8192, 8193, 20000};
    for (int v = 0; v < 4; v++)
        for (int b = 0; b < 5; b++, k++) {
            if (v < 3 && b >= 3) continue;
            cfg_t c;
            memset(&c, 0, sizeof c);
            c.beta = betas[b];
            c.T = temps[k % 3];
            c.red = reds[k % 4];
            c.V = bigV[v];
            c.N = (v == 3) ? 3 : 2;
            c.pad_s = (k % 2) ? 7 : 0;
            c.pad_t = (k % 3) ? 0 : 9;
            c.dt = dts[(k / 2) % 3];
            c.tdt = k % 2 ? FL_DTYPE_F32 : c.dt;
            c.t2 = k % 2;
            c.labels = k % 3;
            c.ignore_index = -100;
            c.gl = 1;
            c.gscale = gss[k % 3];
            c.scale = scales[k % 3];
            c.special = 1;
            c.masked = (k % 2) == 1;
            run_cfg(&c, seed++);
        }
    /* mixed 16-bit dtypes (CPU only: CUDA takes the student's dtype or fp32), every row ignored,
     * custom ignore_index with int32 labels */
    {
        cfg_t c;
        memset(&c, 0, sizeof c);
        c.beta = 0.3f; c.T = 2.0f; c.red = FL_REDUCTION_MEAN; c.V = 50; c.N = 4; c.pad_s = 2; c.pad_t = 0;
        c.dt = FL_DTYPE_F16; c.tdt = FL_DTYPE_BF16; c.t2 = 1; c.labels = 1; c.ignore_index = -1; c.gl = 1;
        c.gscale = 2.0f; c.scale = 3.0; c.special = 1;
        run_cfg(&c, seed++);
        c.dt = FL_DTYPE_BF16; c.tdt = FL_DTYPE_F16; c.beta = 1.0f; c.red = FL_REDUCTION_NONE;
        run_cfg(&c, seed++);
        const fl_reduction rs[4] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_BATCHMEAN};
        for (int ri = 0; ri < 4; ri++) {
            c.red = rs[ri]; c.all_ignored = 1; c.labels = 2; c.dt = FL_DTYPE_F32; c.tdt = FL_DTYPE_F32;
            c.beta = 0.5f;
            run_cfg(&c, seed++);
        }
    }
    tu_quiet = 0;
    test_threads();
    test_validator();
    test_errors();
    return tu_finish();
}
