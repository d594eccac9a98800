/* test_linear_cross_entropy.c — the CPU linear + cross-entropy backend (include/fusedloss.h
 * section 6) against an independent long-double reference written from the definitions:
 *
 *   logits = hidden · weightᵀ (+ bias), summed exactly (long double) and rounded to dtype
 *   the cross-entropy of section 5 on those rounded logits (tests/ref_cross_entropy.h, itself
 *   proved by finite differences in tests/test_cross_entropy.c), all options
 *   dlogits = its gradient (times the upstream gradient), rounded to dtype
 *   dhidden = dlogits · weight, dweight = dlogitsᵀ · hidden, dbias = column sums of dlogits,
 *   summed exactly (outputs compared within one rounding to their dtype)
 *
 * Rounding "once to dtype" is taken, as everywhere in this library's CPU backend and in
 * tests/ref_cross_entropy.h, as round-to-nearest-even via fp32 (what the CUDA backend's fp32
 * accumulator rounded to dtype gives when its fp32 value is the correctly rounded sum).
 *
 * The reference's gradients (without the roundings) are checked against central finite
 * differences of its own loss, in long double, for every option configuration. Then the
 * backend, in both modes (gradients in the forward; forward + backward from the saved lse),
 * over dtypes, index dtypes, shapes (N = 0, 1, 7, 129; V = 1, 3, 257; odd H), row strides,
 * bias or not, every option and combinations, chunk_rows, wgrad_dtype, thread counts; the plan
 * and workspace size query; and every bad argument with its exact status and a message that
 * names the function (the CUDA-only rules through the shared validator, src/internal.h).
 * Outputs are poisoned (NaN) before every call; inputs are random, their padding NaN (never
 * read); a guard after the workspace must stay intact.
 *
 * Build and run (the Makefile does this in `make test`):
 *   cc -std=c11 -O2 -Iinclude tests/test_linear_cross_entropy.c build/libfusedloss.a -lm \
 *      -lpthread -fopenmp -o build/test_linear_cross_entropy && ./build/test_linear_cross_entropy
 * Optional argument: the seed. Ends with "N passed, M failed"; exit code 0 only when nothing failed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fusedloss.h"
#include "test_util.h"
#include "ref_cross_entropy.h"
#include "../src/internal.h" /* fl__lce_make_plan, fl__lce_validate: the plan and the CUDA-only checks */

/* ------------------------------------------------------------------------------------------
 * Tolerances, |got - ref| <= atol + rtol*|ref| + slack, per dtype (the output's own dtype:
 * dtype for loss/lse/dhidden, wgrad_dtype for dweight/dbias). The reference works on the same
 * rounded logits and (up to ties) the same rounded dlogits, so only the outputs' rounding and
 * the backend's double accumulation remain:
 *   loss / lse : fp32 rounded once from double                    -> rtol 1e-6
 *   gradients  : rounded once to their dtype (half an ulp)        -> about 2 half-ulps; fp16's
 *                atol is one subnormal step. slack = GEMM_SLACK * sum of |terms| of the sum:
 *                double accumulation, and an fp32 dlogit that the backend's double rounds the
 *                other way than the reference's long double at a tie (a one-ulp fp32 change).
 * 16-bit gradients must moreover be the correctly rounded reference except within a guard band
 * next to a tie (check_rounded), which the tolerance alone would not catch (e.g. truncation).
 * ---------------------------------------------------------------------------------------- */
typedef struct { double loss_atol, loss_rtol, g_atol, g_rtol; } tol_t;
static const tol_t TOL[3] = {
    /* FL_DTYPE_F32  */ {1e-8, 1e-6, 1e-12, 1e-6},
    /* FL_DTYPE_F16  */ {1e-8, 1e-6, 6e-8, 1e-3},
    /* FL_DTYPE_BF16 */ {1e-8, 1e-6, 1e-12, 8e-3},
};
#define GEMM_SLACK 1.2e-7   /* times sum |terms| (2^-23: one fp32 ulp of the absolute sum) */
/* Finite differences of the long-double objective: step and tolerance (as test_cross_entropy.c). */
#define FD_STEP 1e-6L
#define FD_ATOL 1e-9        /* times (1 + |objective|) */
#define FD_RTOL 1e-7
#define WS_GUARD 256        /* poisoned bytes after the workspace: must stay untouched */

static const char* const FWD = "fl_linear_cross_entropy_forward_cpu";
static const char* const BWD = "fl_linear_cross_entropy_backward_cpu";
static int contains(const char* hay, const char* needle) { return hay && strstr(hay, needle) != NULL; }

/* ------------------------------------------------------------------------------------------
 * Option configurations (as tests/test_cross_entropy.c): every option alone and combined.
 * ---------------------------------------------------------------------------------------- */
#include "ce_configs.h"

static const fl_dtype DTS[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};

/* ------------------------------------------------------------------------------------------
 * A problem: library buffers (padding NaN), their exact values as dense long double arrays.
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t        N, H, V, ldh, ldw;
    fl_dtype       dt, wdt;
    fl_index_dtype it;
    fl_ce_options  o;
    float*         cw;              /* class weights (owned) or NULL */
    float*         coff;            /* per-class logit offsets (owned) or NULL */
    void*          x;               /* hidden [N, ldh] of dt */
    void*          w;               /* weight [V, ldw] of dt */
    void*          b;               /* bias [V] of dt, or NULL */
    void*          t;               /* targets [N] of it */
    float*         gl;              /* grad_loss ([N] for NONE, [1] otherwise) or NULL */
    float          gs;              /* grad_scale */
    long double   *xh, *xw, *xb;    /* exact values: [N*H], [V*H], [V] (xb NULL without bias) */
} prob_t;

static int64_t n_loss(const prob_t* p) { return p->o.reduction == FL_REDUCTION_NONE ? p->N : 1; }
static int64_t tgt(const prob_t* p, int64_t i) { return ref_target(p->t, p->it, i); }
static void set_tgt(void* t, fl_index_dtype it, int64_t i, int64_t v) {
    if (it == FL_INDEX_I32) ((int32_t*)t)[i] = (int32_t)v;
    else ((int64_t*)t)[i] = v;
}
static size_t nz(int64_t n) { return (size_t)(n > 0 ? n : 1); }

/* ignore_pct: percentage of rows forced to ignore_index (100: all). gmode: 0 grad_loss NULL,
 * 1 a random grad_loss. */
static prob_t make_prob(tu_rng* rng, const cfg_t* c, int64_t N, int64_t H, int64_t V, int64_t ldh, int64_t ldw,
                        fl_dtype dt, fl_dtype wdt, fl_index_dtype it, int bias, int ignore_pct, int gmode,
                        float gs) {
    prob_t p;
    memset(&p, 0, sizeof p);
    p.N = N; p.H = H; p.V = V; p.ldh = ldh; p.ldw = ldw; p.dt = dt; p.wdt = wdt; p.it = it; p.gs = gs;
    p.o = cfg_options(c, V, rng, &p.cw, &p.coff);
    const fl_ce_options o = p.o;
    p.t = tu_xmalloc(nz(N) * 8);
    for (int64_t i = 0; i < N; i++) {
        int64_t t = tu_int_in(rng, 0, V - 1);
        if (tu_int_in(rng, 0, 99) < ignore_pct) t = o.ignore_index;
        set_tgt(p.t, it, i, t);
    }
    /* MEAN with weights: keep D_w > 0 whenever a row counts (0/0 is not a case tested here) */
    if (p.cw && o.reduction == FL_REDUCTION_MEAN) {
        double dw = 0; int64_t first = -1;
        for (int64_t i = 0; i < N; i++)
            if (tgt(&p, i) != o.ignore_index) { dw += p.cw[tgt(&p, i)]; if (first < 0) first = i; }
        if (first >= 0 && dw == 0.0) p.cw[tgt(&p, first)] = 1.0f;
    }
    const size_t es = tu_dtype_size(dt);
    const size_t xb = (size_t)(N > 0 ? (N - 1) * ldh + H : 1) * es, wb = (size_t)((V - 1) * ldw + H) * es;
    p.x = tu_xmalloc(xb);
    p.w = tu_xmalloc(wb);
    tu_poison(p.x, xb);                /* the padding columns stay NaN: they must not be read */
    tu_poison(p.w, wb);
    p.xh = (long double*)tu_xmalloc(nz(N * H) * sizeof(long double));
    p.xw = (long double*)tu_xmalloc((size_t)(V * H) * sizeof(long double));
    const double wscale = 2.0 / sqrt((double)H);          /* logits of standard deviation ~2 */
    for (int64_t i = 0; i < N; i++)
        for (int64_t k = 0; k < H; k++) {
            tu_store(p.x, dt, i * ldh + k, (float)tu_normal(rng));
            p.xh[i * H + k] = tu_load(p.x, dt, i * ldh + k);
        }
    for (int64_t j = 0; j < V; j++)
        for (int64_t k = 0; k < H; k++) {
            tu_store(p.w, dt, j * ldw + k, (float)(wscale * tu_normal(rng)));
            p.xw[j * H + k] = tu_load(p.w, dt, j * ldw + k);
        }
    if (bias) {
        p.b = tu_xmalloc((size_t)V * es);
        p.xb = (long double*)tu_xmalloc((size_t)V * sizeof(long double));
        for (int64_t j = 0; j < V; j++) {
            tu_store(p.b, dt, j, (float)(0.5 * tu_normal(rng)));
            p.xb[j] = tu_load(p.b, dt, j);
        }
    }
    if (gmode) {
        const int64_t n = n_loss(&p);
        p.gl = (float*)tu_xmalloc(nz(n) * sizeof(float));
        for (int64_t i = 0; i < n; i++) p.gl[i] = (float)tu_uniform_in(rng, -2.0, 2.0);
    }
    return p;
}

static void free_prob(prob_t* p) {
    free(p->cw); free(p->coff); free(p->x); free(p->w); free(p->b); free(p->t); free(p->gl);
    free(p->xh); free(p->xw); free(p->xb);
    memset(p, 0, sizeof *p);
}

static uint64_t fnv(uint64_t h, const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    for (size_t i = 0; p && i < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
    return h;
}
/* hash of everything the library may read (it must write none of it) */
static uint64_t inputs_hash(const prob_t* p) {
    const size_t es = tu_dtype_size(p->dt);
    uint64_t h = 1469598103934665603ull;
    if (p->N > 0) h = fnv(h, p->x, (size_t)((p->N - 1) * p->ldh + p->H) * es);
    h = fnv(h, p->w, (size_t)((p->V - 1) * p->ldw + p->H) * es);
    if (p->b) h = fnv(h, p->b, (size_t)p->V * es);
    h = fnv(h, p->t, (size_t)p->N * (p->it == FL_INDEX_I32 ? 4 : 8));
    if (p->cw) h = fnv(h, p->cw, (size_t)p->V * 4);
    if (p->gl) h = fnv(h, p->gl, (size_t)n_loss(p) * 4);
    return h;
}

/* ------------------------------------------------------------------------------------------
 * The reference. round_dt: the dtype logits and dlogits are rounded to, or REF_LDOUBLE for
 * none (finite differences). lse_saved: the gradients of a backward fed with that fp32 lse
 * (mode 2) instead of the exact one. Any output may be NULL.
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    long double *loss, *lse;        /* [max(N,1)] */
    double *dh, *dw, *db;           /* exact sums of the (rounded) dlogits' products */
    double *adh, *adw, *adb;        /* sums of the |terms| of those sums */
} ref_out;

static void ref_lce(const prob_t* p, fl_dtype round_dt, const long double* xh, const long double* xw,
                    const long double* xb, const float* lse_saved, ref_out* r) {
    const int64_t N = p->N, H = p->H, V = p->V;
    long double* L = (long double*)tu_xmalloc(nz(N * V) * sizeof(long double));
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < V; j++) {
            long double s = 0.0L;
            for (int64_t k = 0; k < H; k++) s += xh[i * H + k] * xw[j * H + k];
            if (xb) s += xb[j];
            if (round_dt != REF_LDOUBLE) s = (long double)tu_round_to(round_dt, (float)s);
            L[i * V + j] = s;
        }
    const int grads = r->dh || r->dw || r->db;
    double* dx = grads ? (double*)tu_xmalloc(nz(N * V) * sizeof(double)) : NULL;
    double* dxs = grads && lse_saved ? (double*)tu_xmalloc(nz(N * V) * sizeof(double)) : NULL;
    ref_logits rx = {L, REF_LDOUBLE, V};
    ref_ce(&rx, p->t, p->it, N, V, &p->o, p->gl, p->gs, lse_saved, r->loss, r->lse, dx, dxs);
    if (grads) {
        double* g = lse_saved ? dxs : dx;
        if (round_dt != REF_LDOUBLE)
            for (int64_t k = 0; k < N * V; k++) g[k] = (double)tu_round_to(round_dt, (float)g[k]);
        for (int64_t i = 0; r->dh && i < N; i++)
            for (int64_t k = 0; k < H; k++) {
                long double s = 0.0L, a = 0.0L;
                for (int64_t j = 0; j < V; j++) {
                    long double t = (long double)g[i * V + j] * xw[j * H + k];
                    s += t; a += fabsl(t);
                }
                r->dh[i * H + k] = (double)s;
                if (r->adh) r->adh[i * H + k] = (double)a;
            }
        for (int64_t j = 0; j < V; j++) {
            for (int64_t k = 0; r->dw && k < H; k++) {
                long double s = 0.0L, a = 0.0L;
                for (int64_t i = 0; i < N; i++) {
                    long double t = (long double)g[i * V + j] * xh[i * H + k];
                    s += t; a += fabsl(t);
                }
                r->dw[j * H + k] = (double)s;
                if (r->adw) r->adw[j * H + k] = (double)a;
            }
            if (r->db) {
                long double s = 0.0L, a = 0.0L;
                for (int64_t i = 0; i < N; i++) { s += g[i * V + j]; a += fabs(g[i * V + j]); }
                r->db[j] = (double)s;
                if (r->adb) r->adb[j] = (double)a;
            }
        }
    }
    free(L); free(dx); free(dxs);
}

static ref_out ref_alloc(const prob_t* p) {
    ref_out r;
    const size_t nh = nz(p->N * p->H), vh = (size_t)(p->V * p->H), v = (size_t)p->V;
    r.loss = (long double*)tu_xmalloc(nz(p->N) * sizeof(long double));
    r.lse = (long double*)tu_xmalloc(nz(p->N) * sizeof(long double));
    r.dh = (double*)tu_xmalloc(nh * sizeof(double));
    r.adh = (double*)tu_xmalloc(nh * sizeof(double));
    r.dw = (double*)tu_xmalloc(vh * sizeof(double));
    r.adw = (double*)tu_xmalloc(vh * sizeof(double));
    r.db = (double*)tu_xmalloc(v * sizeof(double));
    r.adb = (double*)tu_xmalloc(v * sizeof(double));
    return r;
}
static void ref_free(ref_out* r) {
    free(r->loss); free(r->lse); free(r->dh); free(r->adh); free(r->dw); free(r->adw); free(r->db); free(r->adb);
}

/* ------------------------------------------------------------------------------------------
 * Comparisons. Worst |err| / tol per output kind and dtype, printed at the end.
 * ---------------------------------------------------------------------------------------- */
enum { K_LOSS, K_LSE, K_DH, K_DW, K_DB, N_KINDS };
static const char* const KIND[N_KINDS] = {"loss", "lse", "dhidden", "dweight", "dbias"};
static double g_worst[N_KINDS][3];
static int g_track = 1;   /* 0: comparisons between two runs, not against the reference */

static int cmp(const char* label, int kind, fl_dtype stat_dt, const double* got, const double* ref, const double* absum,
               double slack_k, int64_t n, double atol, double rtol) {
    int64_t bad = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double g = got[i], r = ref[i];
        const double tol = atol + rtol * fabs(r) + (absum ? slack_k * absum[i] : 0.0);
        int ok;
        if (isnan(r) || isnan(g)) ok = isnan(r) && isnan(g);
        else if (isinf(r) || isinf(g)) ok = g == r;
        else {
            const double q = fabs(g - r) / tol;
            ok = q <= 1.0;
            if (q > worst) worst = q;
        }
        if (!ok) {
            if (bad < 5)
                printf("  %s %s[%lld]: got %.9g, ref %.9g, diff %.3g (tol %.3g)\n", label, KIND[kind], (long long)i, g,
                       r, fabs(g - r), tol);
            bad++;
        }
    }
    if (g_track && worst > g_worst[kind][stat_dt]) g_worst[kind][stat_dt] = worst;
    return CHECK(bad == 0, "%s: %s: %lld of %lld elements out of tolerance (worst err/tol %.3g)", label, KIND[kind],
                 (long long)bad, (long long)n, worst);
}

/* A 16-bit output must be the exact value rounded to its dtype (via fp32) except within a guard
 * band (1/100 ulp, and the double accumulation's error) of a tie, or below 1e-30. */
static int check_rounded(const char* label, int kind, const void* buf, fl_dtype odt, const double* exact,
                         const double* absum, int64_t n) {
    if (odt == FL_DTYPE_F32) return 1;
    int64_t bad = 0, checked = 0;
    for (int64_t i = 0; i < n; i++) {
        const double r = exact[i];
        if (!(fabs(r) >= 1e-30)) continue;
        int e;
        frexp(r, &e);
        double ulp = ldexp(1.0, e - 1 - (odt == FL_DTYPE_F16 ? 10 : 7));
        if (odt == FL_DTYPE_F16 && ulp < 5.9604644775390625e-08) ulp = 5.9604644775390625e-08;
        const double guard = 0.01 * ulp + 1e-12 * absum[i];
        const float lo = tu_round_to(odt, (float)(r - guard)), hi = tu_round_to(odt, (float)(r + guard));
        if (lo != hi) continue;
        checked++;
        if (tu_load(buf, odt, i) != lo) {
            if (bad < 5)
                printf("  %s %s[%lld]: got %.9g, correctly rounded %.9g (exact %.12g)\n", label, KIND[kind],
                       (long long)i, tu_load(buf, odt, i), lo, r);
            bad++;
        }
    }
    return CHECK(bad == 0, "%s: %s: %lld of %lld elements not correctly rounded to %s", label, KIND[kind],
                 (long long)bad, (long long)checked, tu_dtype_name(odt));
}

/* every element written (no poison left) */
static int check_written(const char* label, const char* what, const void* buf, size_t es, int64_t n) {
    int64_t left = 0;
    for (int64_t i = 0; i < n; i++) left += tu_is_poison(buf, es, i);
    return CHECK(left == 0, "%s: %s: %lld of %lld elements not written (poison left)", label, what, (long long)left,
                 (long long)n);
}

static int check_untouched(const char* label, const char* what, const void* buf, size_t bytes) {
    size_t touched = 0;
    for (size_t i = 0; i < bytes; i++) touched += ((const unsigned char*)buf)[i] != TU_POISON_BYTE;
    return CHECK(touched == 0, "%s: %s: %zu of %zu bytes written, expected untouched", label, what, touched, bytes);
}

static void poison_finite(void* p, size_t bytes) { memset(p, 0x7F, bytes); } /* 0x7F7F7F7F: finite */

static double* to_double(const void* buf, fl_dtype dt, int64_t n) {
    double* d = (double*)tu_xmalloc(nz(n) * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = tu_load(buf, dt, i);
    return d;
}

static int cmp_f32(const char* label, int kind, const float* got, const long double* ref, int64_t n, fl_dtype dt) {
    const tol_t* t = &TOL[dt];
    double* g = (double*)tu_xmalloc(nz(n) * sizeof(double));
    double* r = (double*)tu_xmalloc(nz(n) * sizeof(double));
    for (int64_t i = 0; i < n; i++) { g[i] = got[i]; r[i] = (double)ref[i]; }
    int ok = cmp(label, kind, dt, g, r, NULL, 0.0, n, t->loss_atol, t->loss_rtol);
    free(g); free(r);
    return ok;
}

/* gradient output `buf` (n elements of odt) vs the reference sums (exact, absum) */
static int cmp_grad(const char* label, int kind, const void* buf, fl_dtype odt, const double* exact,
                    const double* absum, int64_t n) {
    double* g = to_double(buf, odt, n);
    const tol_t* t = &TOL[odt];
    int ok = cmp(label, kind, odt, g, exact, absum, GEMM_SLACK, n, t->g_atol, t->g_rtol);
    ok &= check_rounded(label, kind, buf, odt, exact, absum, n);
    free(g);
    return ok;
}

/* ------------------------------------------------------------------------------------------
 * Library runs: both modes on one problem, with poisoned outputs and a guarded workspace.
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    float *loss, *lse;     /* mode 1: forward with gradients */
    void *dh, *dw, *db;
    float *loss2, *lse2;   /* mode 2: forward without gradients ... */
    void *dh2, *dw2, *db2; /* ... then backward from lse2 */
    int ok;                /* every status FL_OK */
} run_t;

static void* alloc_ws(const prob_t* p, const fl_lce_options* lo, size_t* bytes) {
    fl_status st = fl_linear_cross_entropy_workspace_size(bytes, p->N, p->H, p->V, p->dt, p->wdt, &p->o, lo);
    CHECK_STATUS(st, FL_OK, "fl_linear_cross_entropy_workspace_size");
    if (st != FL_OK) *bytes = 0;
    void* ws = tu_xmalloc(*bytes + WS_GUARD);
    tu_poison(ws, *bytes + WS_GUARD); /* content need not be initialised */
    return ws;
}

static void free_run(run_t* r) {
    free(r->loss); free(r->lse); free(r->dh); free(r->dw); free(r->db);
    free(r->loss2); free(r->lse2); free(r->dh2); free(r->dw2); free(r->db2);
    memset(r, 0, sizeof *r);
}

/* want_dw / want_db: pass dweight / dbias (dbias only with a bias). */
static run_t lib_run(const prob_t* p, const fl_lce_options* lo, const char* label, int want_dw, int want_db) {
    run_t r;
    memset(&r, 0, sizeof r);
    const int64_t N = p->N, H = p->H, V = p->V;
    const size_t es = tu_dtype_size(p->dt), ws_ = tu_dtype_size(p->wdt);
    const size_t b_loss = nz(N) * 4, b_dh = nz(N * H) * es, b_dw = (size_t)(V * H) * ws_, b_db = (size_t)V * ws_;
    want_db = want_db && p->b;
    r.loss = (float*)tu_xmalloc(b_loss); r.lse = (float*)tu_xmalloc(b_loss);
    r.loss2 = (float*)tu_xmalloc(b_loss); r.lse2 = (float*)tu_xmalloc(b_loss);
    r.dh = tu_xmalloc(b_dh); r.dh2 = tu_xmalloc(b_dh);
    r.dw = tu_xmalloc(b_dw); r.dw2 = tu_xmalloc(b_dw);
    r.db = tu_xmalloc(b_db); r.db2 = tu_xmalloc(b_db);
    tu_poison(r.loss, b_loss); tu_poison(r.lse, b_loss); tu_poison(r.loss2, b_loss); tu_poison(r.lse2, b_loss);
    tu_poison(r.dh, b_dh); tu_poison(r.dh2, b_dh); tu_poison(r.dw, b_dw); tu_poison(r.dw2, b_dw);
    tu_poison(r.db, b_db); tu_poison(r.db2, b_db);
    size_t wsb;
    unsigned char* ws = (unsigned char*)alloc_ws(p, lo, &wsb);
    const uint64_t h0 = inputs_hash(p);
    char name[400];

    /* mode 1 */
    fl_status st = fl_linear_cross_entropy_forward_cpu(r.loss, r.lse, r.dh, want_dw ? r.dw : NULL, want_db ? r.db : NULL,
                                                       p->x, p->ldh, p->w, p->ldw, p->b, p->t, p->gl, p->gs, N, H, V,
                                                       p->dt, p->wdt, p->it, &p->o, lo, ws, wsb);
    snprintf(name, sizeof name, "%s: forward (mode 1)", label);
    r.ok = CHECK_STATUS(st, FL_OK, name);
    /* mode 2 */
    tu_poison(ws, wsb);
    st = fl_linear_cross_entropy_forward_cpu(r.loss2, r.lse2, NULL, NULL, NULL, p->x, p->ldh, p->w, p->ldw, p->b, p->t,
                                             p->gl, p->gs, N, H, V, p->dt, p->wdt, p->it, &p->o, lo, ws, wsb);
    snprintf(name, sizeof name, "%s: forward (mode 2)", label);
    r.ok &= CHECK_STATUS(st, FL_OK, name);
    tu_poison(ws, wsb);
    st = fl_linear_cross_entropy_backward_cpu(r.dh2, want_dw ? r.dw2 : NULL, want_db ? r.db2 : NULL, p->x, p->ldh,
                                              p->w, p->ldw, p->b, p->t, r.lse2, p->gl, p->gs, N, H, V, p->dt, p->wdt,
                                              p->it, &p->o, lo, ws, wsb);
    snprintf(name, sizeof name, "%s: backward (mode 2)", label);
    r.ok &= CHECK_STATUS(st, FL_OK, name);
    /* ce_opts->target_prob (the forward's per-row p_t): with plain per-row CE losses (NONE, no
     * smoothing, weights or z-loss) p_t = exp(-loss_i); 1 on ignored rows; nothing past N written */
    if (r.ok && p->o.reduction == FL_REDUCTION_NONE && p->o.label_smoothing == 0.0f && !p->o.weight &&
        p->o.z_loss == 0.0f) {
        float* tp = (float*)tu_xmalloc(b_loss + 64);
        tu_poison(tp, b_loss + 64);
        fl_ce_options o2 = p->o;
        o2.target_prob = tp;
        tu_poison(ws, wsb);
        st = fl_linear_cross_entropy_forward_cpu(r.loss2, r.lse2, NULL, NULL, NULL, p->x, p->ldh, p->w, p->ldw, p->b,
                                                 p->t, p->gl, p->gs, N, H, V, p->dt, p->wdt, p->it, &o2, lo, ws, wsb);
        snprintf(name, sizeof name, "%s: forward with target_prob", label);
        if (CHECK_STATUS(st, FL_OK, name)) {
            int64_t bad_rows = 0;
            for (int64_t i = 0; i < N; i++) {
                const double want = tgt(p, i) == p->o.ignore_index ? 1.0 : exp(-(double)r.loss2[i]);
                if (!(fabs((double)tp[i] - want) <= 2e-6 + 2e-6 * want)) bad_rows++;
            }
            CHECK(bad_rows == 0, "%s: target_prob != exp(-loss) in %lld rows", label, (long long)bad_rows);
            check_untouched(label, "past target_prob[N-1]", (unsigned char*)tp + (size_t)N * 4, b_loss + 64 - (size_t)N * 4);
        }
        free(tp);
    }

    CHECK(inputs_hash(p) == h0, "%s: an input was modified", label);
    check_untouched(label, "workspace guard", ws + wsb, WS_GUARD);
    free(ws);
    /* written / untouched */
    const int64_t nl = n_loss(p);
    check_written(label, "dhidden (mode 1)", r.dh, es, N * H);
    check_written(label, "dhidden (mode 2)", r.dh2, es, N * H);
    if (want_dw) { check_written(label, "dweight (mode 1)", r.dw, ws_, V * H); check_written(label, "dweight (mode 2)", r.dw2, ws_, V * H); }
    else { check_untouched(label, "dweight (NULL)", r.dw, b_dw); }
    if (want_db) { check_written(label, "dbias (mode 1)", r.db, ws_, V); check_written(label, "dbias (mode 2)", r.db2, ws_, V); }
    if (N > 0 || nl > 0) {
        /* a MEAN loss of nothing is NaN, like the poison: checked separately (test_special) */
        int64_t unwritten = 0;
        for (int64_t i = 0; i < nl; i++) unwritten += tu_is_poison(r.loss, 4, i) + tu_is_poison(r.loss2, 4, i);
        for (int64_t i = 0; i < N; i++) unwritten += tu_is_poison(r.lse, 4, i) + tu_is_poison(r.lse2, 4, i);
        int all_ignored_mean = p->o.reduction == FL_REDUCTION_MEAN;
        for (int64_t i = 0; i < N; i++) all_ignored_mean &= tgt(p, i) == p->o.ignore_index;
        if (!all_ignored_mean) CHECK(unwritten == 0, "%s: %lld loss/lse elements not written", label, (long long)unwritten);
    }
    return r;
}

/* run_case: both modes vs the reference; mode 2's forward equals mode 1's loss/lse bitwise;
 * mode 2's gradients vs the reference fed with the saved lse, and vs mode 1 (within what the
 * saved lse's fp32 rounding explains). Returns the run (caller frees) when keep, else frees. */
static run_t run_case(const prob_t* p, const fl_lce_options* lo, const char* label, int want_dw, int want_db,
                      int keep) {
    run_t r = lib_run(p, lo, label, want_dw, want_db);
    want_db = want_db && p->b;
    const int64_t N = p->N, H = p->H, V = p->V, nl = n_loss(p);
    char name[400];
    if (r.ok) {
        ref_out r1 = ref_alloc(p), r2 = ref_alloc(p);
        ref_lce(p, p->dt, p->xh, p->xw, p->xb, NULL, &r1);
        ref_lce(p, p->dt, p->xh, p->xw, p->xb, r.lse2, &r2);
        snprintf(name, sizeof name, "%s (mode 1)", label);
        cmp_f32(name, K_LOSS, r.loss, r1.loss, nl, p->dt);
        cmp_f32(name, K_LSE, r.lse, r1.lse, N, p->dt);
        cmp_grad(name, K_DH, r.dh, p->dt, r1.dh, r1.adh, N * H);
        if (want_dw) cmp_grad(name, K_DW, r.dw, p->wdt, r1.dw, r1.adw, V * H);
        if (want_db) cmp_grad(name, K_DB, r.db, p->wdt, r1.db, r1.adb, V);
        snprintf(name, sizeof name, "%s: mode 2 forward == mode 1 forward", label);
        check_bitwise(name, r.loss2, r.loss, (size_t)nl * 4);
        check_bitwise(name, r.lse2, r.lse, (size_t)N * 4);
        snprintf(name, sizeof name, "%s (mode 2)", label);
        cmp_grad(name, K_DH, r.dh2, p->dt, r2.dh, r2.adh, N * H);
        if (want_dw) cmp_grad(name, K_DW, r.dw2, p->wdt, r2.dw, r2.adw, V * H);
        if (want_db) cmp_grad(name, K_DB, r.db2, p->wdt, r2.db, r2.adb, V);
        /* mode 1 vs mode 2: the two references differ by what the saved lse explains */
        snprintf(name, sizeof name, "%s (mode 2 vs mode 1)", label);
        const void* g1[3] = {r.dh, r.dw, r.db};
        const void* g2[3] = {r.dh2, r.dw2, r.db2};
        const double* e1[3] = {r1.dh, r1.dw, r1.db};
        const double* e2[3] = {r2.dh, r2.dw, r2.db};
        const double* a1[3] = {r1.adh, r1.adw, r1.adb};
        const int64_t n[3] = {N * H, V * H, V};
        const int on[3] = {1, want_dw, want_db};
        for (int k = 0; k < 3; k++) {
            if (!on[k]) continue;
            const fl_dtype odt = k == 0 ? p->dt : p->wdt;
            double* x1 = to_double(g1[k], odt, n[k]);
            double* x2 = to_double(g2[k], odt, n[k]);
            double* s = (double*)tu_xmalloc(nz(n[k]) * sizeof(double));
            /* |got2 - got1| <= |got2 - e2| + |e2 - e1| + |e1 - got1|: |e2 - e1| + both tolerances */
            const tol_t* to = &TOL[odt];
            for (int64_t i = 0; i < n[k]; i++) {
                const double m = fabs(e1[k][i]) > fabs(e2[k][i]) ? fabs(e1[k][i]) : fabs(e2[k][i]);
                s[i] = fabs(e2[k][i] - e1[k][i]) + 2.0 * (to->g_atol + to->g_rtol * m + GEMM_SLACK * a1[k][i]);
            }
            g_track = 0;
            cmp(name, K_DH + k, odt, x2, x1, s, 1.0, n[k], 0.0, 0.0);
            g_track = 1;
            free(x1); free(x2); free(s);
        }
        ref_free(&r1);
        ref_free(&r2);
    }
    if (!keep) free_run(&r);
    return r;
}

/* bitwise equality of two runs of the same problem (all outputs of both modes) */
static void same_run(const char* label, const prob_t* p, const run_t* a, const run_t* b, int with_dw, int with_db) {
    const size_t es = tu_dtype_size(p->dt), ws_ = tu_dtype_size(p->wdt);
    const size_t nl = (size_t)n_loss(p), N = (size_t)p->N, H = (size_t)p->H, V = (size_t)p->V;
    char name[400];
#define SAME(field, bytes)                                                   \
    do {                                                                     \
        snprintf(name, sizeof name, "%s: " #field " bitwise equal", label);  \
        check_bitwise(name, a->field, b->field, bytes);                      \
    } while (0)
    SAME(loss, nl * 4); SAME(lse, N * 4); SAME(loss2, nl * 4); SAME(lse2, N * 4);
    SAME(dh, N * H * es); SAME(dh2, N * H * es);
    if (with_dw) { SAME(dw, V * H * ws_); SAME(dw2, V * H * ws_); }
    if (with_db && p->b) { SAME(db, V * ws_); SAME(db2, V * ws_); }
#undef SAME
}

/* ------------------------------------------------------------------------------------------
 * 1. The reference itself: its gradients (no rounding) vs central finite differences.
 * ---------------------------------------------------------------------------------------- */
static long double objective(const prob_t* p, const long double* xh, const long double* xw, const long double* xb) {
    long double loss[8];
    ref_out r;
    memset(&r, 0, sizeof r);
    r.loss = loss;
    ref_lce(p, REF_LDOUBLE, xh, xw, xb, NULL, &r);
    return ref_objective(loss, p->N, p->o.reduction, p->gl, p->gs);
}

static void test_reference_fd(tu_rng* rng) {
    double worst = 0.0;
    for (int c = 0; c < N_CFGS; c++) {
        const int64_t N = 4, H = 3, V = 5;
        prob_t p = make_prob(rng, &CFGS[c], N, H, V, H, H, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, 1, 20, c % 2,
                             c % 3 == 0 ? 0.6f : 1.0f);
        /* row 0 counts (target 0 or 1, weight > 0), row 1 is ignored: MEAN is never 0/0 */
        set_tgt(p.t, p.it, 0, p.o.ignore_index == 0 ? 1 : 0);
        set_tgt(p.t, p.it, 1, p.o.ignore_index);
        ref_out r = ref_alloc(&p);
        ref_lce(&p, REF_LDOUBLE, p.xh, p.xw, p.xb, NULL, &r);
        const long double obj0 = objective(&p, p.xh, p.xw, p.xb);
        long double* arrs[3] = {p.xh, p.xw, p.xb};
        const double* an[3] = {r.dh, r.dw, r.db};
        const int64_t n[3] = {N * H, V * H, V};
        for (int k = 0; k < 3; k++) {
            double* fd = (double*)tu_xmalloc((size_t)n[k] * sizeof(double));
            for (int64_t e = 0; e < n[k]; e++) {
                const long double x0 = arrs[k][e];
                arrs[k][e] = x0 + FD_STEP;
                const long double fp = objective(&p, p.xh, p.xw, p.xb);
                arrs[k][e] = x0 - FD_STEP;
                const long double fm = objective(&p, p.xh, p.xw, p.xb);
                arrs[k][e] = x0;
                fd[e] = (double)((fp - fm) / (2.0L * FD_STEP));
                const double tol = FD_ATOL * (1.0 + fabs((double)obj0)) + FD_RTOL * fabs(an[k][e]);
                if (fabs(fd[e] - an[k][e]) / tol > worst) worst = fabs(fd[e] - an[k][e]) / tol;
            }
            char name[300];
            snprintf(name, sizeof name, "reference %s vs finite differences, %s", KIND[K_DH + k], CFGS[c].name);
            check_close(name, fd, an[k], n[k], FD_ATOL * (1.0 + fabs((double)obj0)), FD_RTOL);
            free(fd);
        }
        ref_free(&r);
        free_prob(&p);
    }
    printf("reference dhidden/dweight/dbias vs central differences, %d configs: worst err/tol %.3g\n", N_CFGS, worst);
}

/* ------------------------------------------------------------------------------------------
 * 2. Every option configuration x dtype on two odd shapes, with row strides > H.
 * ---------------------------------------------------------------------------------------- */
static const int64_t CHUNKS[5] = {0, 1, 3, 64, -1 /* = N */};

static void test_options(tu_rng* rng) {
    int k = 0;
    for (int big = 0; big < 2; big++)
    for (int d = 0; d < 3; d++)
        for (int c = 0; c < N_CFGS; c++, k++) {
            const fl_dtype dt = DTS[d];
            const fl_dtype wdt = (dt != FL_DTYPE_F32 && c % 4 == 1 + big) ? FL_DTYPE_F32 : dt;
            const int64_t N = big ? 129 : 37, H = big ? 37 : 13, V = big ? 257 : 50;
            prob_t p = make_prob(rng, &CFGS[c], N, H, V, H + 3, H + (c % 2), dt, wdt,
                                 c % 2 ? FL_INDEX_I32 : FL_INDEX_I64, c % 3 != 2, 15, c % 2 == 0, c % 5 == 0 ? 0.37f : 1.0f);
            fl_lce_options lo = FL_LCE_OPTIONS_INIT;
            lo.chunk_rows = CHUNKS[k % 5] < 0 ? N : CHUNKS[k % 5];
            char label[300];
            snprintf(label, sizeof label, "%s %s%s N=%lld H=%lld V=%lld chunk_rows=%lld %s", tu_dtype_name(dt),
                     wdt != dt ? "wgrad f32 " : "", p.b ? "bias" : "no bias", (long long)N, (long long)H,
                     (long long)V, (long long)lo.chunk_rows, CFGS[c].name);
            run_case(&p, &lo, label, 1, 1, 0);
            free_prob(&p);
        }
}

/* ------------------------------------------------------------------------------------------
 * 3. Shapes: N = 0, 1, 7, 129; V = 1, 3, 257; H = 1, 5, 37; each dtype, rotating options.
 * ---------------------------------------------------------------------------------------- */
static void test_shapes(tu_rng* rng) {
    const int64_t Ns[4] = {0, 1, 7, 129}, Vs[3] = {1, 3, 257}, Hs[3] = {1, 5, 37};
    int k = 0;
    for (int d = 0; d < 3; d++)
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 3; b++)
                for (int c = 0; c < 3; c++, k++) {
                    const int64_t N = Ns[a], V = Vs[b], H = Hs[c];
                    const fl_dtype dt = DTS[d];
                    const fl_dtype wdt = (dt != FL_DTYPE_F32 && k % 3 == 0) ? FL_DTYPE_F32 : dt;
                    const cfg_t* cfg = &CFGS[(k * 7) % N_CFGS];
                    prob_t p = make_prob(rng, cfg, N, H, V, H + (k % 2 ? 3 : 0), H + (k % 3 == 0 ? 2 : 0), dt, wdt,
                                         k % 2 ? FL_INDEX_I64 : FL_INDEX_I32, k % 2 == 0, 12, k % 3 == 1, 1.0f);
                    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
                    lo.chunk_rows = CHUNKS[k % 5] < 0 ? (N > 0 ? N : 1) : CHUNKS[k % 5];
                    char label[300];
                    snprintf(label, sizeof label, "%s %s%s N=%lld H=%lld V=%lld ldh=%lld ldw=%lld chunk_rows=%lld %s",
                             tu_dtype_name(dt), wdt != dt ? "wgrad f32 " : "", p.b ? "bias" : "no bias", (long long)N,
                             (long long)H, (long long)V, (long long)p.ldh, (long long)p.ldw, (long long)lo.chunk_rows,
                             cfg->name);
                    run_case(&p, &lo, label, 1, 1, 0);
                    free_prob(&p);
                }
}

/* ------------------------------------------------------------------------------------------
 * 4. chunk_rows 1, 3, 64, N and from a budget (several balanced chunks): all outputs bitwise
 *    equal (the loss is required to be; the CPU backend's double accumulation makes the
 *    gradients so too, since every sum runs over the rows in order whatever the chunks).
 * ---------------------------------------------------------------------------------------- */
static void test_chunks(tu_rng* rng) {
    const int cfgs[2] = {CFG_EVERYTHING_MEAN, CFG_EVERYTHING_NONE};
    for (int d = 0; d < 3; d++)
        for (int c = 0; c < 2; c++) {
            const fl_dtype dt = DTS[d];
            const int64_t N = 129, H = 21, V = 257;
            prob_t p = make_prob(rng, &CFGS[cfgs[c]], N, H, V, H + 1, H, dt, dt, FL_INDEX_I64, 1, 10, c, 0.8f);
            fl_lce_options lo = FL_LCE_OPTIONS_INIT;
            lo.chunk_rows = N;
            char label[300];
            snprintf(label, sizeof label, "%s chunk_rows=N=%lld %s", tu_dtype_name(dt), (long long)N, CFGS[cfgs[c]].name);
            run_t base = run_case(&p, &lo, label, 1, 1, 1);
            /* a budget that leaves room for ~70 rows: 64-row chunks, balanced (129 -> 3 x 64) */
            fl__lce_plan plan;
            fl_lce_options big = FL_LCE_OPTIONS_INIT;
            big.chunk_rows = 1;
            fl__lce_make_plan("test", N, H, V, dt, dt, &p.o, &big, &plan);
            const size_t es = tu_dtype_size(dt);
            const size_t per_row = (size_t)plan.ldl * es + es + (V % 64 && es == 2 ? 4 * (size_t)H : 0) +
                                   16 * (size_t)fl__ce_chunks(V, es);
            const size_t fixed = plan.total - (plan.off_acc - plan.off_logits) - (plan.off_blas - plan.off_ones);
            const int64_t settings[5] = {1, 3, 64, 100, 0};
            for (int s = 0; s < 5; s++) {
                fl_lce_options l2 = FL_LCE_OPTIONS_INIT;
                l2.chunk_rows = settings[s];
                if (settings[s] == 0) l2.byte_budget = fixed + 4096 + 70 * per_row;
                fl__lce_plan q;
                fl__lce_make_plan("test", N, H, V, dt, dt, &p.o, &l2, &q);
                snprintf(label, sizeof label, "%s chunk_rows=%lld (plan: %lld x %lld rows) %s", tu_dtype_name(dt),
                         (long long)settings[s], (long long)q.chunks, (long long)q.chunk_rows, CFGS[cfgs[c]].name);
                if (settings[s] == 0)
                    CHECK(q.chunk_rows == 64 && q.chunks == 3, "%s: budget plan %lld x %lld, expected 3 x 64", label,
                          (long long)q.chunks, (long long)q.chunk_rows);
                run_t r = lib_run(&p, &l2, label, 1, 1);
                if (r.ok && base.ok) same_run(label, &p, &base, &r, 1, 1);
                free_run(&r);
            }
            free_run(&base);
            free_prob(&p);
        }
}

/* ------------------------------------------------------------------------------------------
 * 5. Thread count: 1 thread vs all, bitwise (large enough that every loop goes parallel).
 * ---------------------------------------------------------------------------------------- */
static void test_threads(tu_rng* rng) {
#ifdef _OPENMP
    const int nt = omp_get_max_threads();
    const int64_t N = 300, H = 40, V = 300;
    for (int d = 0; d < 3; d += 2) {
        prob_t p = make_prob(rng, &CFGS[CFG_EVERYTHING_MEAN], N, H, V, H, H, DTS[d], DTS[d], FL_INDEX_I64, 1, 10, 1, 1.0f);
        fl_lce_options lo = FL_LCE_OPTIONS_INIT;
        lo.chunk_rows = 100;
        char label[200];
        snprintf(label, sizeof label, "%s N=%lld H=%lld V=%lld, %d threads", tu_dtype_name(DTS[d]), (long long)N,
                 (long long)H, (long long)V, nt);
        run_t a = run_case(&p, &lo, label, 1, 1, 1);
        omp_set_num_threads(1);
        snprintf(label, sizeof label, "%s N=%lld H=%lld V=%lld, 1 thread vs %d", tu_dtype_name(DTS[d]), (long long)N,
                 (long long)H, (long long)V, nt);
        run_t b = lib_run(&p, &lo, label, 1, 1);
        omp_set_num_threads(nt);
        if (a.ok && b.ok) same_run(label, &p, &a, &b, 1, 1);
        free_run(&a);
        free_run(&b);
        free_prob(&p);
    }
    printf("threads: %d (1 vs %d compared)\n", nt, nt);
#else
    (void)rng;
    printf("SKIP: threads (built without OpenMP)\n");
#endif
}

/* ------------------------------------------------------------------------------------------
 * 6. wgrad_dtype fp32 with 16-bit dtype; the accumulation modes (the CPU always uses double:
 *    FP32, LEAN and AUTO give bitwise the same result); allow_tf32 changes nothing on the CPU.
 * ---------------------------------------------------------------------------------------- */
static void test_wgrad(tu_rng* rng) {
    for (int d = 1; d < 3; d++)
        for (int wf = 0; wf < 2; wf++) {
            const fl_dtype dt = DTS[d], wdt = wf ? FL_DTYPE_F32 : dt;
            const int64_t N = 70, H = 9, V = 67;
            prob_t p = make_prob(rng, &CFGS[wf ? 9 : 20], N, H, V, H, H + 5, dt, wdt, FL_INDEX_I32, 1, 10, 1, 1.0f);
            fl_lce_options lo = FL_LCE_OPTIONS_INIT;
            lo.chunk_rows = 16;
            lo.wgrad_accum = FL_LCE_ACCUM_FP32;
            char label[200];
            snprintf(label, sizeof label, "%s wgrad %s accum FP32 chunk_rows 16", tu_dtype_name(dt), tu_dtype_name(wdt));
            run_t a = run_case(&p, &lo, label, 1, 1, 1);
            const fl_lce_accum modes[2] = {FL_LCE_ACCUM_LEAN, FL_LCE_ACCUM_AUTO};
            for (int m = 0; m < 2; m++) {
                fl_lce_options l2 = lo;
                l2.wgrad_accum = modes[m];
                l2.allow_tf32 = 1;
                snprintf(label, sizeof label, "%s wgrad %s accum %s, tf32 allowed", tu_dtype_name(dt),
                         tu_dtype_name(wdt), m ? "AUTO" : "LEAN");
                run_t b = lib_run(&p, &l2, label, 1, 1);
                if (a.ok && b.ok) same_run(label, &p, &a, &b, 1, 1);
                free_run(&b);
            }
            free_run(&a);
            free_prob(&p);
        }
}

/* ------------------------------------------------------------------------------------------
 * 7. Special cases: N = 0, every row ignored, frozen weight / bias (NULL gradients), lse NULL,
 *    options NULL, per-row grad_loss with reduction NONE and grad_scale.
 * ---------------------------------------------------------------------------------------- */
static void test_special(tu_rng* rng) {
    const int64_t H = 6, V = 11;
    /* N = 0: SUM -> 0, MEAN -> NaN, NONE -> nothing written; dweight/dbias zeros; NULLs allowed */
    for (int red = 0; red < 3; red++) {
        cfg_t c = CFGS[0];
        c.red = (fl_reduction)red;
        prob_t p = make_prob(rng, &c, 0, H, V, H, H, FL_DTYPE_BF16, FL_DTYPE_F32, FL_INDEX_I64, 1, 0, 0, 1.0f);
        size_t wsb;
        void* ws = alloc_ws(&p, NULL, &wsb);
        float loss[2];
        float dw[11 * 6], db[11];
        poison_finite(loss, sizeof loss);
        tu_poison(dw, sizeof dw);
        tu_poison(db, sizeof db);
        fl_status st = fl_linear_cross_entropy_forward_cpu(loss, NULL, NULL, dw, db, NULL, H, p.w, H, p.b, NULL, NULL,
                                                           1.0f, 0, H, V, p.dt, p.wdt, p.it, &p.o, NULL, ws, wsb);
        CHECK_STATUS(st, FL_OK, "N = 0 forward (dhidden, hidden, targets NULL; dweight, dbias given)");
        int zeros = 1;
        for (int k = 0; k < 66; k++) zeros &= dw[k] == 0.0f && !signbit(dw[k]);
        for (int k = 0; k < 11; k++) zeros &= db[k] == 0.0f && !signbit(db[k]);
        CHECK(zeros, "N = 0: dweight / dbias not all +0");
        if (red == FL_REDUCTION_SUM) CHECK(loss[0] == 0.0f, "N = 0 SUM: loss %g, expected 0", loss[0]);
        if (red == FL_REDUCTION_MEAN) CHECK(isnan(loss[0]), "N = 0 MEAN: loss %g, expected NaN", loss[0]);
        if (red == FL_REDUCTION_NONE) CHECK(tu_bits(loss, FL_DTYPE_F32, 0) == 0x7F7F7F7Fu, "N = 0 NONE: loss written");
        tu_poison(dw, sizeof dw);
        st = fl_linear_cross_entropy_backward_cpu(NULL, dw, NULL, NULL, H, NULL, H, NULL, NULL, NULL, NULL, 1.0f, 0, H,
                                                  V, p.dt, p.wdt, p.it, &p.o, NULL, ws, wsb);
        CHECK_STATUS(st, FL_OK, "N = 0 backward (all NULL but dweight)");
        zeros = 1;
        for (int k = 0; k < 66; k++) zeros &= dw[k] == 0.0f;
        CHECK(zeros, "N = 0 backward: dweight not all 0");
        free(ws);
        free_prob(&p);
    }
    /* every row ignored: MEAN NaN, SUM 0, NONE zeros; lse 0; gradients all zero (both modes) */
    for (int red = 0; red < 3; red++) {
        cfg_t c = CFGS[CFG_EVERYTHING_MEAN];
        c.red = (fl_reduction)red;
        prob_t p = make_prob(rng, &c, 9, H, V, H, H, FL_DTYPE_F16, FL_DTYPE_F16, FL_INDEX_I32, 1, 100, 1, 1.0f);
        const int64_t N = 9;
        size_t wsb;
        void* ws = alloc_ws(&p, NULL, &wsb);
        float loss[9], lse[9];
        uint16_t dh[9 * 6], dw[11 * 6], db[11];
        poison_finite(loss, sizeof loss); tu_poison(lse, sizeof lse);
        tu_poison(dh, sizeof dh); tu_poison(dw, sizeof dw); tu_poison(db, sizeof db);
        fl_status st = fl_linear_cross_entropy_forward_cpu(loss, lse, dh, dw, db, p.x, H, p.w, H, p.b, p.t, p.gl, 1.0f,
                                                           N, H, V, p.dt, p.wdt, p.it, &p.o, NULL, ws, wsb);
        char label[100];
        snprintf(label, sizeof label, "all rows ignored, reduction %d", red);
        CHECK_STATUS(st, FL_OK, label);
        int ok = 1;
        for (int k = 0; k < 54; k++) ok &= tu_load(dh, FL_DTYPE_F16, k) == 0.0f;
        for (int k = 0; k < 66; k++) ok &= tu_load(dw, FL_DTYPE_F16, k) == 0.0f;
        for (int k = 0; k < 11; k++) ok &= tu_load(db, FL_DTYPE_F16, k) == 0.0f;
        for (int k = 0; k < 9; k++) ok &= lse[k] == 0.0f;
        CHECK(ok, "%s: gradients / lse not all zero", label);
        if (red == FL_REDUCTION_MEAN) CHECK(isnan(loss[0]), "%s: MEAN loss %g, expected NaN", label, loss[0]);
        if (red == FL_REDUCTION_SUM) CHECK(loss[0] == 0.0f, "%s: SUM loss %g, expected 0", label, loss[0]);
        if (red == FL_REDUCTION_NONE) {
            ok = 1;
            for (int k = 0; k < 9; k++) ok &= loss[k] == 0.0f;
            CHECK(ok, "%s: NONE losses not all 0", label);
        }
        tu_poison(dh, sizeof dh); tu_poison(dw, sizeof dw);
        st = fl_linear_cross_entropy_backward_cpu(dh, dw, NULL, p.x, H, p.w, H, p.b, p.t, lse, p.gl, 2.0f, N, H, V, p.dt,
                                                  p.wdt, p.it, &p.o, NULL, ws, wsb);
        CHECK_STATUS(st, FL_OK, "all rows ignored: backward");
        ok = 1;
        for (int k = 0; k < 54; k++) ok &= tu_load(dh, FL_DTYPE_F16, k) == 0.0f;
        for (int k = 0; k < 66; k++) ok &= tu_load(dw, FL_DTYPE_F16, k) == 0.0f;
        CHECK(ok, "all rows ignored, backward: gradients not all zero");
        free(ws);
        free_prob(&p);
    }
    /* frozen weight (dweight NULL), frozen bias (dbias NULL, bias given), dhidden only */
    {
        prob_t p = make_prob(rng, &CFGS[3], 20, 7, 30, 7, 9, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64, 1, 10, 0, 1.0f);
        run_case(&p, NULL, "f32 frozen weight and bias (dhidden only), lce_opts NULL", 0, 0, 0);
        run_case(&p, NULL, "f32 frozen bias (dbias NULL)", 1, 0, 0);
        run_case(&p, NULL, "f32 frozen weight (dweight NULL)", 0, 1, 0);
        free_prob(&p);
    }
    /* lse NULL in forward, ce_opts NULL (defaults: MEAN, ignore -100): same loss as with lse */
    {
        prob_t p = make_prob(rng, &CFGS[0], 33, 5, 40, 5, 5, FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I64, 0, 10, 0, 1.0f);
        size_t wsb;
        void* ws = alloc_ws(&p, NULL, &wsb);
        float l1, l2, lse[33];
        fl_status st = fl_linear_cross_entropy_forward_cpu(&l1, lse, NULL, NULL, NULL, p.x, 5, p.w, 5, NULL, p.t, NULL,
                                                           1.0f, 33, 5, 40, p.dt, p.wdt, p.it, &p.o, NULL, ws, wsb);
        CHECK_STATUS(st, FL_OK, "forward, lse given");
        st = fl_linear_cross_entropy_forward_cpu(&l2, NULL, NULL, NULL, NULL, p.x, 5, p.w, 5, NULL, p.t, NULL, 1.0f, 33,
                                                 5, 40, p.dt, p.wdt, p.it, NULL, NULL, ws, wsb);
        CHECK_STATUS(st, FL_OK, "forward, lse NULL, ce_opts NULL");
        CHECK(memcmp(&l1, &l2, 4) == 0, "lse NULL / ce_opts NULL: loss %.9g vs %.9g", l2, l1);
        free(ws);
        free_prob(&p);
    }
    /* per-row grad_loss (NONE) and grad_scale, both modes; grad_scale 0 */
    {
        prob_t p = make_prob(rng, &CFGS[CFG_EVERYTHING_NONE], 45, 11, 33, 12, 11, FL_DTYPE_F16, FL_DTYPE_F32,
                             FL_INDEX_I32, 1, 10, 1, -1.75f);
        run_case(&p, NULL, "f16 NONE, per-row grad_loss, grad_scale -1.75", 1, 1, 0);
        p.gs = 0.0f;
        run_case(&p, NULL, "f16 NONE, per-row grad_loss, grad_scale 0", 1, 1, 0);
        free_prob(&p);
    }
    /* large logits (|logit| ~ 1e3): softmax saturates; still matches */
    {
        prob_t p = make_prob(rng, &CFGS[CFG_EVERYTHING_MEAN], 16, 4, 20, 4, 4, FL_DTYPE_F32, FL_DTYPE_F32, FL_INDEX_I64,
                             1, 10, 0, 1.0f);
        for (int64_t k = 0; k < 20 * 4; k++) {
            ((float*)p.w)[k] *= 500.0f;
            p.xw[k] = ((float*)p.w)[k];
        }
        run_case(&p, NULL, "f32 logits ~ 1e3", 1, 1, 0);
        free_prob(&p);
    }
}

/* ------------------------------------------------------------------------------------------
 * 8. The plan and the workspace size query, against the rules written out independently.
 * ---------------------------------------------------------------------------------------- */
static uint64_t al256(uint64_t x) { return (x + 255u) & ~(uint64_t)255u; }

typedef struct { int64_t rows, chunks, ldl; int acc; uint64_t total; } xplan;

static xplan expect_plan(int64_t N, int64_t H, int64_t V, fl_dtype dt, fl_dtype wdt, fl_lce_accum accum,
                         uint64_t budget, int64_t chunk_opt) {
    xplan e;
    const uint64_t es = tu_dtype_size(dt), ldl = ((uint64_t)V + 63) / 64 * 64, acc = 4ull * (uint64_t)V * (uint64_t)H;
    /* the CE region: header + per-row partials of all N rows, statistics of one chunk of rows */
    const uint64_t ce0 = 256 + al256(16ull * (uint64_t)N), srow = 16ull * (uint64_t)fl__ce_chunks(V, es);
    e.ldl = (int64_t)ldl;
    e.acc = wdt != FL_DTYPE_F32 && (accum == FL_LCE_ACCUM_FP32 || (accum == FL_LCE_ACCUM_AUTO && acc <= budget / 2));
    const uint64_t fixed = ce0 + 3072 + 256 + (e.acc ? acc : 0) + 4ull * (uint64_t)V + ((uint64_t)8 << 20) + 4096;
    const uint64_t dh32 = (V % 64 && es == 2) ? 4ull * (uint64_t)H : 0;  /* odd V, 16-bit: fp32 dhidden rows */
    const uint64_t per = ldl * es + es + dh32 + srow;
    if (N == 0) e.rows = 1;
    else if (chunk_opt > 0) e.rows = chunk_opt < N ? chunk_opt : N;
    else {
        uint64_t r = budget > fixed ? (budget - fixed) / per : 0;
        r = r / 64 * 64;
        if (r < 64) r = 64;
        if (r >= (uint64_t)N) e.rows = N;
        else {
            uint64_t ch = ((uint64_t)N + r - 1) / r, ev = ((uint64_t)N + ch - 1) / ch;
            ev = (ev + 63) / 64 * 64;
            e.rows = (int64_t)(ev < r ? ev : r);
        }
    }
    e.chunks = N == 0 ? 0 : (N + e.rows - 1) / e.rows;
    const uint64_t st = (uint64_t)e.rows * srow < 3072 ? 3072 : (uint64_t)e.rows * srow;
    uint64_t off = al256(ce0 + al256(st));
    off = al256(off + (uint64_t)e.rows * ldl * es);
    off = al256(off + (e.acc ? acc : 0));
    off = al256(off + 4ull * (uint64_t)V);
    off = al256(off + (uint64_t)e.rows * es);
    off = al256(off + (uint64_t)e.rows * dh32);
    e.total = off + ((uint64_t)8 << 20);
    return e;
}

static size_t query(int64_t N, int64_t H, int64_t V, fl_dtype dt, fl_dtype wdt, fl_lce_accum accum, size_t budget,
                    int64_t chunk_opt) {
    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
    lo.wgrad_accum = accum;
    lo.byte_budget = budget;
    lo.chunk_rows = chunk_opt;
    size_t b = 0;
    fl_status st = fl_linear_cross_entropy_workspace_size(&b, N, H, V, dt, wdt, NULL, &lo);
    if (st != FL_OK) { CHECK_STATUS(st, FL_OK, "fl_linear_cross_entropy_workspace_size"); return 0; }
    return b;
}

static void test_plan(tu_rng* rng) {
    (void)rng;
    const int64_t Ns[] = {0, 1, 63, 64, 65, 1000, 4097, 100000};
    const int64_t Vs[] = {1, 7, 50257, 128256};
    const int64_t Hs[] = {1, 768, 4096};
    const size_t budgets[] = {0, (size_t)1 << 20, (size_t)9 << 20, (size_t)64 << 20, (size_t)512 << 20, (size_t)8 << 30};
    const int64_t copts[] = {0, 0, 1, 100, (int64_t)1 << 40};
    long mismatches = 0, cases = 0, layout_bad = 0, fit_bad = 0;
    for (size_t a = 0; a < sizeof Ns / sizeof Ns[0]; a++)
        for (size_t b = 0; b < sizeof Vs / sizeof Vs[0]; b++)
            for (size_t c = 0; c < sizeof Hs / sizeof Hs[0]; c++)
                for (int d = 0; d < 3; d++)
                    for (int m = 0; m < 3; m++)
                        for (size_t u = 0; u < sizeof budgets / sizeof budgets[0]; u++) {
                            const int64_t N = Ns[a], V = Vs[b], H = Hs[c];
                            const fl_dtype dt = DTS[d], wdt = (m == 2 || d == 0) ? FL_DTYPE_F32 : dt;
                            const fl_lce_accum acc = (fl_lce_accum)(cases % 3);
                            const int64_t copt = copts[(a + b + c + u) % 5];
                            fl_lce_options lo = FL_LCE_OPTIONS_INIT;
                            lo.wgrad_accum = acc;
                            lo.byte_budget = budgets[u];
                            lo.chunk_rows = copt;
                            fl__lce_plan pl;
                            fl_status st = fl__lce_make_plan("test", N, H, V, dt, wdt, NULL, &lo, &pl);
                            const xplan e = expect_plan(N, H, V, dt, wdt, acc, budgets[u], copt);
                            cases++;
                            if (st != FL_OK || pl.chunk_rows != e.rows || pl.chunks != e.chunks || pl.ldl != e.ldl ||
                                pl.accum_fp32 != e.acc || (uint64_t)pl.total != e.total ||
                                query(N, H, V, dt, wdt, acc, budgets[u], copt) != pl.total) {
                                if (mismatches++ < 5)
                                    printf("  plan N=%lld H=%lld V=%lld %s wgrad %s accum %d budget %zu chunk_rows %lld: "
                                           "got %lld x %lld rows, acc %d, total %zu; expected %lld x %lld, acc %d, total %llu\n",
                                           (long long)N, (long long)H, (long long)V, tu_dtype_name(dt),
                                           tu_dtype_name(wdt), (int)acc, budgets[u], (long long)copt,
                                           (long long)pl.chunks, (long long)pl.chunk_rows, pl.accum_fp32, pl.total,
                                           (long long)e.chunks, (long long)e.rows, e.acc, (unsigned long long)e.total);
                                continue;
                            }
                            /* layout: order, 256-alignment, sizes, disjoint, the total covers it all */
                            const size_t es = tu_dtype_size(dt);
                            const size_t srow = 16 * (size_t)fl__ce_chunks(V, es);
                            const size_t st_b = (size_t)pl.chunk_rows * srow < 3072 ? 3072 : (size_t)pl.chunk_rows * srow;
                            const size_t ceb = 256 + (size_t)al256(16 * (uint64_t)N) + st_b;
                            const size_t dh32 = (V % 64 && es == 2) ? 4 * (size_t)H : 0;
                            const size_t offs[7] = {pl.off_ce, pl.off_logits, pl.off_acc, pl.off_bacc, pl.off_ones,
                                                    pl.off_dh32, pl.off_blas};
                            const size_t sizes[7] = {ceb, (size_t)pl.chunk_rows * (size_t)pl.ldl * es,
                                                     pl.accum_fp32 ? 4 * (size_t)V * (size_t)H : 0, 4 * (size_t)V,
                                                     (size_t)pl.chunk_rows * es, (size_t)pl.chunk_rows * dh32,
                                                     (size_t)8 << 20};
                            int ok = pl.off_ce == 0 && pl.total == pl.off_blas + ((size_t)8 << 20);
                            for (int k = 0; k < 7; k++) {
                                ok &= offs[k] % 256 == 0;
                                if (k < 6) ok &= offs[k] + sizes[k] <= offs[k + 1];
                            }
                            ok &= pl.chunk_rows >= 1 && (N == 0 || pl.chunk_rows <= N) &&
                                  (N == 0 ? pl.chunks == 0 : (pl.chunks - 1) * pl.chunk_rows < N &&
                                                              pl.chunks * pl.chunk_rows >= N);
                            if (copt == 0 && N > 0)  /* a multiple of 64 unless it is N */
                                ok &= pl.chunk_rows == N || pl.chunk_rows % 64 == 0;
                            layout_bad += !ok;
                            /* fits the budget when chunk_rows == 0 and the budget holds one 64-row chunk */
                            const uint64_t fixed = 256 + al256(16 * (uint64_t)N) + 3072 + 256 +
                                                   (pl.accum_fp32 ? 4ull * V * H : 0) + 4ull * V + (8ull << 20) + 4096;
                            if (copt == 0 && budgets[u] >= fixed + 64ull * ((uint64_t)pl.ldl * es + es + dh32 + srow))
                                fit_bad += pl.total > budgets[u];
                        }
    CHECK(mismatches == 0, "plan: %ld of %ld cases differ from the rules", mismatches, cases);
    CHECK(layout_bad == 0, "plan: %ld of %ld layouts wrong (order, alignment, overlap, chunk count)", layout_bad, cases);
    CHECK(fit_bad == 0, "plan: %ld of %ld budget plans exceed the budget", fit_bad, cases);
    printf("plan: %ld cases checked against the rules\n", cases);

    /* balancing, worked examples: N = 1000, room for 512 rows -> 2 x 500 -> 512 (no change);
     * room for 448 -> 3 chunks of ceil(1000/3) = 334 -> 384; room for 960 -> 2 x 512 */
    {
        const int64_t N = 1000, H = 64, V = 1000;
        const fl_dtype dt = FL_DTYPE_BF16;
        /* CE: 256 + 16 N aligned + the stage scratch and its alignment; per row: the logits row, a
         * ones element, the fp32 dhidden row (odd V) and 16 bytes of statistics (V = 1000 bf16: one
         * V chunk) */
        const uint64_t ce0 = 256 + al256(16 * (uint64_t)N) + 3072 + 256;
        const uint64_t per = 1024 * 2 + 2 + 4 * 64 + 16, fixed = ce0 + 4ull * 64 * 1000 + 4000 + (8ull << 20) + 4096;
        const int64_t room[4] = {448, 512, 960, 63}, want_rows[4] = {384, 512, 512, 64}, want_chunks[4] = {3, 2, 2, 16};
        for (int k = 0; k < 4; k++) {
            fl_lce_options lo = FL_LCE_OPTIONS_INIT;
            lo.byte_budget = (size_t)(fixed + (uint64_t)room[k] * per + 17);
            lo.wgrad_accum = FL_LCE_ACCUM_FP32;
            fl__lce_plan pl;
            fl_status st = fl__lce_make_plan("test", N, H, V, dt, dt, NULL, &lo, &pl);
            CHECK(st == FL_OK && pl.chunk_rows == want_rows[k] && pl.chunks == want_chunks[k],
                  "balance: room for %lld rows: plan %lld x %lld, expected %lld x %lld", (long long)room[k],
                  (long long)pl.chunks, (long long)pl.chunk_rows, (long long)want_chunks[k], (long long)want_rows[k]);
        }
    }
    /* monotone in the budget, for a fixed accumulation mode (AUTO alone may shrink the total at
     * the one budget where it switches to FP32 and takes the accumulator from the chunk) */
    {
        long bad = 0, steps = 0;
        const int64_t shapes[3][3] = {{5000, 768, 50257}, {100, 64, 1000}, {70000, 4096, 128256}};
        for (int s = 0; s < 3; s++)
            for (int m = 0; m < 3; m++) {
                const int64_t N = shapes[s][0], H = shapes[s][1], V = shapes[s][2];
                const fl_dtype wdt = m == 2 ? FL_DTYPE_F32 : FL_DTYPE_BF16;
                const fl_lce_accum acc = m == 0 ? FL_LCE_ACCUM_FP32 : FL_LCE_ACCUM_LEAN;
                size_t prev = 0;
                for (uint64_t bgt = 0; bgt < (16ull << 30); bgt = bgt * 9 / 8 + 123457) {
                    const size_t t = query(N, H, V, FL_DTYPE_BF16, wdt, acc, (size_t)bgt, 0);
                    bad += t < prev;
                    prev = t;
                    steps++;
                }
            }
        CHECK(bad == 0, "workspace size not monotone in byte_budget: %ld of %ld steps decrease", bad, steps);
        printf("workspace size monotone in byte_budget: %ld steps\n", steps);
    }
    /* AUTO switches to FP32 exactly at 4*V*H <= budget / 2 (16-bit wgrad), never for fp32 wgrad */
    {
        const int64_t N = 100, H = 100, V = 1000;
        const size_t acc = 4 * 100 * 1000;
        fl_lce_options lo = FL_LCE_OPTIONS_INIT;
        fl__lce_plan pl;
        lo.byte_budget = 2 * acc;
        fl__lce_make_plan("test", N, H, V, FL_DTYPE_F16, FL_DTYPE_F16, NULL, &lo, &pl);
        CHECK(pl.accum_fp32 == 1, "AUTO at budget = 8VH: accum_fp32 %d, expected 1", pl.accum_fp32);
        lo.byte_budget = 2 * acc - 1;
        fl__lce_make_plan("test", N, H, V, FL_DTYPE_F16, FL_DTYPE_F16, NULL, &lo, &pl);
        CHECK(pl.accum_fp32 == 0, "AUTO at budget = 8VH - 1: accum_fp32 %d, expected 0", pl.accum_fp32);
        lo.wgrad_accum = FL_LCE_ACCUM_FP32;
        fl__lce_make_plan("test", N, H, V, FL_DTYPE_F16, FL_DTYPE_F32, NULL, &lo, &pl);
        CHECK(pl.accum_fp32 == 0, "wgrad fp32: accum_fp32 %d, expected 0", pl.accum_fp32);
        lo.wgrad_accum = FL_LCE_ACCUM_LEAN;
        lo.byte_budget = (size_t)64 << 30;
        fl__lce_make_plan("test", N, H, V, FL_DTYPE_F16, FL_DTYPE_F16, NULL, &lo, &pl);
        CHECK(pl.accum_fp32 == 0, "LEAN: accum_fp32 %d, expected 0", pl.accum_fp32);
    }
    /* never 0, NULL options = defaults, N = 0 */
    {
        size_t a = 0, b = 0;
        fl_lce_options lo = FL_LCE_OPTIONS_INIT;
        fl_ce_options co = FL_CE_OPTIONS_INIT;
        CHECK_STATUS(fl_linear_cross_entropy_workspace_size(&a, 0, 1, 1, FL_DTYPE_F32, FL_DTYPE_F32, NULL, NULL), FL_OK,
                     "size query N = 0");
        CHECK(a >= ((size_t)8 << 20), "size query N = 0: %zu bytes", a);
        CHECK_STATUS(fl_linear_cross_entropy_workspace_size(&a, 8192, 768, 50257, FL_DTYPE_BF16, FL_DTYPE_BF16, NULL, NULL),
                     FL_OK, "size query defaults");
        CHECK_STATUS(fl_linear_cross_entropy_workspace_size(&b, 8192, 768, 50257, FL_DTYPE_BF16, FL_DTYPE_BF16, &co, &lo),
                     FL_OK, "size query explicit defaults");
        CHECK(a == b && a > 0 && a <= ((size_t)512 << 20), "size query: NULL options %zu, explicit defaults %zu", a, b);
        printf("workspace for N=8192 H=768 V=50257 bf16, defaults: %zu bytes (%.1f MiB)\n", a, (double)a / 1048576.0);
        fl__lce_plan pl;
        fl__lce_make_plan("test", 0, 5, 5, FL_DTYPE_F32, FL_DTYPE_F32, NULL, NULL, &pl);
        CHECK(pl.chunk_rows == 1 && pl.chunks == 0, "N = 0: plan %lld x %lld, expected 0 x 1", (long long)pl.chunks,
              (long long)pl.chunk_rows);
    }
    /* bad arguments of the query */
    {
        const char* fn = "fl_linear_cross_entropy_workspace_size";
        size_t b;
        fl_lce_options lo = FL_LCE_OPTIONS_INIT;
        fl_ce_options co = FL_CE_OPTIONS_INIT;
        struct { const char* what; fl_status want; int64_t N, H, V; int dt, wdt; int lo_kind; } cases_[] = {
            {"N < 0", FL_ERR_INVALID_ARGUMENT, -1, 4, 4, 0, 0, 0},
            {"H < 1", FL_ERR_INVALID_ARGUMENT, 4, 0, 4, 0, 0, 0},
            {"V < 1", FL_ERR_INVALID_ARGUMENT, 4, 4, 0, 0, 0, 0},
            {"bad dtype", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 9, 0, 0},
            {"bad wgrad_dtype", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 1, 9, 0},
            {"wgrad bf16 with f16", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 1, 2, 0},
            {"wgrad f16 with f32", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 0, 1, 0},
            {"lce struct_size", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 0, 0, 1},
            {"chunk_rows < 0", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 0, 0, 2},
            {"wgrad_accum 3", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 0, 0, 3},
            {"allow_tf32 2", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 0, 0, 4},
            {"ce struct_size", FL_ERR_INVALID_ARGUMENT, 4, 4, 4, 0, 0, 5},
            {"V*H overflow", FL_ERR_INVALID_ARGUMENT, 4, (int64_t)1 << 40, (int64_t)1 << 40, 0, 0, 0},
            {"V near INT64_MAX", FL_ERR_INVALID_ARGUMENT, 4, 1, INT64_MAX - 3, 0, 0, 0},
            {"N*chunks overflow", FL_ERR_INVALID_ARGUMENT, INT64_MAX / 4, 1, 64, 0, 0, 0},
            {"chunk_rows*ldl overflow", FL_ERR_INVALID_ARGUMENT, (int64_t)1 << 40, 1, (int64_t)1 << 30, 0, 0, 6},
        };
        for (size_t k = 0; k < sizeof cases_ / sizeof cases_[0]; k++) {
            fl_lce_options l = lo;
            fl_ce_options c = co;
            if (cases_[k].lo_kind == 1) l.struct_size = 8;
            if (cases_[k].lo_kind == 2) l.chunk_rows = -1;
            if (cases_[k].lo_kind == 3) l.wgrad_accum = (fl_lce_accum)3;
            if (cases_[k].lo_kind == 4) l.allow_tf32 = 2;
            if (cases_[k].lo_kind == 5) c.struct_size = 4;
            if (cases_[k].lo_kind == 6) l.chunk_rows = (int64_t)1 << 40;
            fl_status st = fl_linear_cross_entropy_workspace_size(&b, cases_[k].N, cases_[k].H, cases_[k].V,
                                                                  (fl_dtype)cases_[k].dt, (fl_dtype)cases_[k].wdt, &c, &l);
            CHECK_STATUS(st, cases_[k].want, cases_[k].what);
            CHECK(contains(fl_last_error(), fn), "%s: message does not name %s: \"%s\"", cases_[k].what, fn, fl_last_error());
        }
        CHECK_STATUS(fl_linear_cross_entropy_workspace_size(NULL, 4, 4, 4, FL_DTYPE_F32, FL_DTYPE_F32, NULL, NULL),
                     FL_ERR_INVALID_ARGUMENT, "bytes NULL");
        CHECK_STATUS(fl_linear_cross_entropy_workspace_size(&b, 4, 4, 4, FL_DTYPE_BF16, FL_DTYPE_F32, NULL, NULL), FL_OK,
                     "wgrad f32 with bf16");
        CHECK(fl_last_error()[0] == '\0', "success leaves an error message: \"%s\"", fl_last_error());
    }
}

/* ------------------------------------------------------------------------------------------
 * 9. Bad arguments of both entry points: exact status, a message naming the function, and
 *    nothing written.
 * ---------------------------------------------------------------------------------------- */
enum { EN = 5, EH = 8, EV = 7 };
typedef struct {
    float *loss, *lse;
    void *dh, *dw, *db;
    const void *x, *w, *b, *t;
    int64_t ldh, ldw;
    const float *gl, *lse_in;
    float gs;
    int64_t N, H, V;
    fl_dtype dt, wdt;
    fl_index_dtype it;
    const fl_ce_options* co;
    const fl_lce_options* lo;
    void* ws;
    size_t wsb;
} args_t;

static float   e_x[EN * EH + 64], e_w[EV * EH + 64], e_b[EV], e_gl[EN], e_lse_in[EN], e_cw[EV];
static float   e_loss[EN], e_lse[EN], e_dh[EN * EH], e_dw[EV * EH], e_db[EV];
static int64_t e_t[EN];
static void*   e_ws;
static size_t  e_wsb;

static args_t valid_args(int bwd, const fl_ce_options* co, const fl_lce_options* lo) {
    args_t a;
    memset(&a, 0, sizeof a);
    if (!bwd) { a.loss = e_loss; a.lse = e_lse; }
    a.dh = e_dh; a.dw = e_dw; a.db = e_db;
    a.x = e_x; a.w = e_w; a.b = e_b; a.t = e_t; a.ldh = EH; a.ldw = EH;
    a.gl = e_gl; a.lse_in = bwd ? e_lse_in : NULL; a.gs = 1.0f;
    a.N = EN; a.H = EH; a.V = EV; a.dt = FL_DTYPE_F32; a.wdt = FL_DTYPE_F32; a.it = FL_INDEX_I64;
    a.co = co; a.lo = lo; a.ws = e_ws; a.wsb = e_wsb;
    return a;
}

static fl_status call(int bwd, const args_t* a) {
    if (bwd)
        return fl_linear_cross_entropy_backward_cpu(a->dh, a->dw, a->db, a->x, a->ldh, a->w, a->ldw, a->b, a->t,
                                                    a->lse_in, a->gl, a->gs, a->N, a->H, a->V, a->dt, a->wdt, a->it,
                                                    a->co, a->lo, a->ws, a->wsb);
    return fl_linear_cross_entropy_forward_cpu(a->loss, a->lse, a->dh, a->dw, a->db, a->x, a->ldh, a->w, a->ldw, a->b,
                                               a->t, a->gl, a->gs, a->N, a->H, a->V, a->dt, a->wdt, a->it, a->co, a->lo,
                                               a->ws, a->wsb);
}

static void poison_outputs(void) {
    tu_poison(e_loss, sizeof e_loss); tu_poison(e_lse, sizeof e_lse); tu_poison(e_dh, sizeof e_dh);
    tu_poison(e_dw, sizeof e_dw); tu_poison(e_db, sizeof e_db);
}
static int outputs_untouched(void) {
    const void* b[5] = {e_loss, e_lse, e_dh, e_dw, e_db};
    const size_t n[5] = {sizeof e_loss, sizeof e_lse, sizeof e_dh, sizeof e_dw, sizeof e_db};
    for (int k = 0; k < 5; k++)
        for (size_t i = 0; i < n[k]; i++)
            if (((const unsigned char*)b[k])[i] != TU_POISON_BYTE) return 0;
    return 1;
}

static void expect(int bwd, const args_t* a, fl_status want, const char* what, const char* needle) {
    poison_outputs();
    fl_status st = call(bwd, a);
    char label[300];
    snprintf(label, sizeof label, "%s: %s", bwd ? "backward" : "forward", what);
    CHECK_STATUS(st, want, label);
    if (want != FL_OK) {
        const char* fn = bwd ? BWD : FWD;
        CHECK(contains(fl_last_error(), fn), "%s: message does not name %s: \"%s\"", label, fn, fl_last_error());
        if (needle)
            CHECK(contains(fl_last_error(), needle), "%s: message does not mention \"%s\": \"%s\"", label, needle,
                  fl_last_error());
        CHECK(outputs_untouched(), "%s: an output was written before the error", label);
    } else {
        CHECK(fl_last_error()[0] == '\0', "%s: success leaves an error message: \"%s\"", label, fl_last_error());
    }
}

static void test_errors(tu_rng* rng) {
    for (int k = 0; k < EN * EH + 64; k++) e_x[k] = (float)tu_normal(rng);
    for (int k = 0; k < EV * EH + 64; k++) e_w[k] = (float)(0.3 * tu_normal(rng));
    for (int k = 0; k < EV; k++) { e_b[k] = (float)tu_normal(rng); e_cw[k] = 1.0f + 0.1f * (float)k; }
    for (int k = 0; k < EN; k++) { e_t[k] = k % EV; e_gl[k] = 1.0f; e_lse_in[k] = 2.0f; }
    e_t[1] = -100;
    fl_status st = fl_linear_cross_entropy_workspace_size(&e_wsb, EN, EH, EV, FL_DTYPE_F32, FL_DTYPE_F32, NULL, NULL);
    CHECK_STATUS(st, FL_OK, "workspace size");
    e_ws = tu_xmalloc(e_wsb);
    fl_ce_options co = FL_CE_OPTIONS_INIT;
    fl_lce_options lo = FL_LCE_OPTIONS_INIT;
    args_t a;

    for (int bwd = 0; bwd < 2; bwd++) {
        /* the valid baseline, and the valid variants */
        a = valid_args(bwd, &co, &lo); expect(bwd, &a, FL_OK, "valid", NULL);
        a = valid_args(bwd, NULL, NULL); expect(bwd, &a, FL_OK, "valid, options NULL", NULL);
        a = valid_args(bwd, &co, &lo); a.dw = NULL; a.db = NULL; expect(bwd, &a, FL_OK, "dweight, dbias NULL", NULL);
        a = valid_args(bwd, &co, &lo); a.db = NULL; expect(bwd, &a, FL_OK, "bias without dbias (frozen bias)", NULL);
        a = valid_args(bwd, &co, &lo); a.gl = NULL; expect(bwd, &a, FL_OK, "grad_loss NULL", NULL);
        a = valid_args(bwd, &co, &lo); a.wdt = FL_DTYPE_F32; a.dt = FL_DTYPE_F32; a.N = 0; a.x = NULL; a.t = NULL;
        a.dh = NULL; a.lse_in = NULL; a.lse = NULL; expect(bwd, &a, FL_OK, "N = 0 with NULL hidden/targets/dhidden/lse", NULL);

        /* sizes and dtypes */
        a = valid_args(bwd, &co, &lo); a.N = -1; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "N < 0", "N (-1)");
        a = valid_args(bwd, &co, &lo); a.H = 0; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "H < 1", "H (0)");
        a = valid_args(bwd, &co, &lo); a.V = 0; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "V < 1", "V (0)");
        a = valid_args(bwd, &co, &lo); a.ldh = EH - 1; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "ld_hidden < H", "ld_hidden (7)");
        a = valid_args(bwd, &co, &lo); a.ldw = EH - 1; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "ld_weight < H", "ld_weight (7)");
        a = valid_args(bwd, &co, &lo); a.dt = (fl_dtype)7; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "bad dtype", "dtype (7)");
        a = valid_args(bwd, &co, &lo); a.wdt = (fl_dtype)7; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "bad wgrad_dtype", "wgrad_dtype (7)");
        a = valid_args(bwd, &co, &lo); a.wdt = FL_DTYPE_BF16; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "wgrad bf16 with f32 dtype", "wgrad_dtype (2)");
        a = valid_args(bwd, &co, &lo); a.it = (fl_index_dtype)3; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "bad index_dtype", "index_dtype (3)");
        a = valid_args(bwd, &co, &lo); a.N = INT64_MAX / 2; a.ldh = INT64_MAX / 2;
        expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "hidden extent overflows", "overflows");
        a = valid_args(bwd, &co, &lo); a.V = INT64_MAX / 8; a.ldw = 64;
        expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "weight extent overflows", "overflows");

        /* cross-entropy options */
        fl_ce_options c;
        c = co; c.struct_size = 8; a = valid_args(bwd, &c, &lo);
        expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "ce_opts->struct_size", "ce_opts->struct_size (8)");
        c = co; c.reduction = (fl_reduction)5; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "bad reduction", "reduction (5)");
        c = co; c.label_smoothing = 1.5f; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "smoothing 1.5", "label_smoothing (1.5)");
        c = co; c.label_smoothing = NAN; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "smoothing NaN", "label_smoothing");
        c = co; c.z_loss = -1.0f; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "z_loss < 0", "z_loss (-1)");
        c = co; c.z_loss = INFINITY; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "z_loss inf", "z_loss (inf)");
        c = co; c.softcap = -2.0f; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "softcap < 0", "softcap (-2)");
        c = co; c.logit_scale = 0.0f; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "logit_scale 0", "logit_scale (0)");
        c = co; c.logit_scale = INFINITY; a = valid_args(bwd, &c, &lo); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "logit_scale inf", "logit_scale (inf)");
        c = co; c.weight = e_cw; e_cw[3] = -1.0f; a = valid_args(bwd, &c, &lo);
        expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "class weight < 0", "ce_opts->weight[3] (-1)");
        e_cw[3] = NAN; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "class weight NaN", "ce_opts->weight[3]");
        e_cw[3] = 1.3f; expect(bwd, &a, FL_OK, "class weights valid", NULL);

        /* linear cross-entropy options */
        fl_lce_options l;
        l = lo; l.struct_size = 4; a = valid_args(bwd, &co, &l); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "lce_opts->struct_size", "lce_opts->struct_size (4)");
        l = lo; l.chunk_rows = -1; a = valid_args(bwd, &co, &l); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "chunk_rows < 0", "chunk_rows (-1)");
        l = lo; l.wgrad_accum = (fl_lce_accum)3; a = valid_args(bwd, &co, &l); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "wgrad_accum 3", "wgrad_accum (3)");
        l = lo; l.allow_tf32 = 2; a = valid_args(bwd, &co, &l); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "allow_tf32 2", "allow_tf32 (2)");
        l = lo; l.chunk_rows = 2; a = valid_args(bwd, &co, &l); a.wsb = e_wsb; expect(bwd, &a, FL_OK, "chunk_rows 2 (smaller workspace)", NULL);

        /* required pointers */
        a = valid_args(bwd, &co, &lo); a.x = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "hidden NULL", "hidden is NULL");
        a = valid_args(bwd, &co, &lo); a.w = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "weight NULL", "weight is NULL");
        a = valid_args(bwd, &co, &lo); a.t = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "targets NULL", "targets is NULL");
        a = valid_args(bwd, &co, &lo); a.b = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dbias without bias", "dbias");
        a = valid_args(bwd, &co, &lo); a.gs = NAN; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "grad_scale NaN", "grad_scale (nan)");
        a = valid_args(bwd, &co, &lo); a.gs = -INFINITY; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "grad_scale -inf", "grad_scale (-inf)");
        if (bwd) {
            a = valid_args(bwd, &co, &lo); a.lse_in = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "lse NULL", "lse is NULL");
            a = valid_args(bwd, &co, &lo); a.dh = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dhidden NULL", "dhidden is NULL");
            a = valid_args(bwd, &co, &lo); a.dh = NULL; a.dw = NULL; a.db = NULL;
            expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "all gradients NULL", "dhidden is NULL");
        } else {
            a = valid_args(bwd, &co, &lo); a.loss = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "loss NULL", "loss is NULL");
            a = valid_args(bwd, &co, &lo); a.loss = NULL; a.N = 0; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "loss NULL, N = 0", "loss is NULL");
            a = valid_args(bwd, &co, &lo); a.dh = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dweight without dhidden", "dhidden is NULL");
            a = valid_args(bwd, &co, &lo); a.dh = NULL; a.dw = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dbias without dhidden", "dhidden is NULL");
            a = valid_args(bwd, &co, &lo); a.dh = NULL; a.dw = NULL; a.db = NULL; a.gs = NAN;
            expect(bwd, &a, FL_OK, "loss only: grad_scale NaN ignored", NULL);
            a = valid_args(bwd, &co, &lo); a.lse = NULL; expect(bwd, &a, FL_OK, "lse NULL", NULL);
        }

        /* workspace */
        a = valid_args(bwd, &co, &lo); a.ws = NULL; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "workspace NULL", "workspace is NULL");
        a = valid_args(bwd, &co, &lo); a.wsb = e_wsb - 1; expect(bwd, &a, FL_ERR_INSUFFICIENT_WORKSPACE, "workspace too small", "workspace_bytes");
        a = valid_args(bwd, &co, &lo); a.ws = NULL; a.wsb = 0; expect(bwd, &a, FL_ERR_INSUFFICIENT_WORKSPACE, "workspace NULL, 0 bytes", "workspace_bytes (0)");
        l = lo; l.chunk_rows = 0; l.byte_budget = 0; a = valid_args(bwd, &co, &l);
        expect(bwd, &a, FL_OK, "byte_budget 0: one 64-row chunk (N = 5 rows) still fits", NULL);

        /* alignment to the element size */
        a = valid_args(bwd, &co, &lo); a.x = (const char*)e_x + 2; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "hidden misaligned", "hidden");
        a = valid_args(bwd, &co, &lo); a.dw = (char*)e_dw + 1; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dweight misaligned", "dweight");

        /* aliasing: outputs vs outputs, outputs vs inputs, the workspace */
        a = valid_args(bwd, &co, &lo); a.dh = (void*)e_x; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dhidden == hidden", "overlaps");
        a = valid_args(bwd, &co, &lo); a.dw = (void*)(e_w + 3); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dweight overlaps weight", "overlaps");
        a = valid_args(bwd, &co, &lo); a.db = (void*)e_b; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dbias == bias", "overlaps");
        a = valid_args(bwd, &co, &lo); a.dw = (void*)((float*)e_dh + 4); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dweight overlaps dhidden", "overlaps");
        a = valid_args(bwd, &co, &lo); a.db = (void*)((float*)e_dw + EV * EH - 2); expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dbias overlaps dweight", "overlaps");
        a = valid_args(bwd, &co, &lo); a.dh = (void*)e_gl; a.N = 1; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dhidden overlaps grad_loss", "overlaps");
        a = valid_args(bwd, &co, &lo); a.dw = (void*)e_t; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dweight overlaps targets", "overlaps");
        c = co; c.weight = e_cw; a = valid_args(bwd, &c, &lo); a.db = (void*)e_cw; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dbias == class weights", "overlaps");
        a = valid_args(bwd, &co, &lo); a.ws = (void*)e_x; a.wsb = e_wsb; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "workspace overlaps hidden", "overlaps");
        a = valid_args(bwd, &co, &lo); a.dh = e_ws; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dhidden inside the workspace", "overlaps");
        if (bwd) {
            a = valid_args(bwd, &co, &lo); a.dh = (void*)e_lse_in; a.N = 1; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dhidden overlaps lse", "overlaps");
        } else {
            a = valid_args(bwd, &co, &lo); a.lse = e_loss; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "lse == loss", "overlaps");
            a = valid_args(bwd, &co, &lo); a.lse = (float*)e_x; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "lse overlaps hidden", "overlaps");
            a = valid_args(bwd, &co, &lo); a.loss = (float*)e_t; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "loss overlaps targets", "overlaps");
            a = valid_args(bwd, &co, &lo); a.loss = (float*)e_b; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "loss overlaps bias", "overlaps");
            a = valid_args(bwd, &co, &lo); a.dw = (void*)e_loss; expect(bwd, &a, FL_ERR_INVALID_ARGUMENT, "dweight overlaps loss", "overlaps");
            /* without gradients grad_loss is not read: an output may then share its memory */
            a = valid_args(bwd, &co, &lo); a.dh = a.dw = a.db = NULL; a.lse = (float*)e_gl;
            expect(bwd, &a, FL_OK, "loss only: lse over the (unused) grad_loss", NULL);
            for (int k = 0; k < EN; k++) e_gl[k] = 1.0f;
        }

        /* targets out of range: checked before anything is written */
        a = valid_args(bwd, &co, &lo);
        e_t[2] = EV; expect(bwd, &a, FL_ERR_TARGET_OUT_OF_RANGE, "target == V", "targets[2] = 7");
        e_t[2] = -5; expect(bwd, &a, FL_ERR_TARGET_OUT_OF_RANGE, "target -5", "targets[2] = -5");
        e_t[2] = 2;
        c = co; c.ignore_index = -5; a = valid_args(bwd, &c, &lo); e_t[1] = -5; e_t[2] = -5;
        expect(bwd, &a, FL_OK, "target -5 == ignore_index", NULL);
        e_t[1] = -100; e_t[2] = 2;
    }
    free(e_ws);

    /* the CPU backend's own allocation failing: dweight's double accumulator for V = H = 2^24
     * is 2^51 bytes, more than any address space; N = 0, so nothing else is touched. The
     * dweight / weight pointers are placeholders above the user address space (never
     * dereferenced: the failure comes first). */
    {
        const int64_t V = (int64_t)1 << 24, H = (int64_t)1 << 24;
        fl_lce_options l = FL_LCE_OPTIONS_INIT;
        l.wgrad_accum = FL_LCE_ACCUM_LEAN;
        size_t wsb = 0;
        fl_status st = fl_linear_cross_entropy_workspace_size(&wsb, 0, H, V, FL_DTYPE_BF16, FL_DTYPE_BF16, NULL, &l);
        CHECK_STATUS(st, FL_OK, "size query V = H = 2^24");
        void* ws = tu_xmalloc(wsb); /* ~100 MB, not touched */
        void* fake_dw = (void*)((uintptr_t)1 << 52);
        const void* fake_w = (const void*)((uintptr_t)1 << 53);
        float loss;
        poison_finite(&loss, sizeof loss);
        st = fl_linear_cross_entropy_forward_cpu(&loss, NULL, NULL, fake_dw, NULL, NULL, H, fake_w, H, NULL, NULL, NULL,
                                                 1.0f, 0, H, V, FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I64, NULL, &l, ws,
                                                 wsb);
        CHECK_STATUS(st, FL_ERR_OUT_OF_MEMORY, "forward: dweight accumulator of 2^51 bytes");
        CHECK(contains(fl_last_error(), FWD), "OOM message: \"%s\"", fl_last_error());
        CHECK(tu_bits(&loss, FL_DTYPE_F32, 0) == 0x7F7F7F7Fu, "OOM: loss written before the failure");
        st = fl_linear_cross_entropy_backward_cpu(NULL, fake_dw, NULL, NULL, H, fake_w, H, NULL, NULL, NULL, NULL, 1.0f, 0,
                                                  H, V, FL_DTYPE_BF16, FL_DTYPE_BF16, FL_INDEX_I64, NULL, &l, ws, wsb);
        CHECK_STATUS(st, FL_ERR_OUT_OF_MEMORY, "backward: dweight accumulator of 2^51 bytes");
        CHECK(contains(fl_last_error(), BWD), "OOM message: \"%s\"", fl_last_error());
        free(ws);
    }
}

/* ------------------------------------------------------------------------------------------
 * 10. The CUDA-only rules, through the validator both backends share (src/common/lce_validate.c):
 *     16-byte pointers and row strides (FL_ERR_UNSUPPORTED), a 256-byte aligned workspace,
 *     class weights not read (device memory).
 * ---------------------------------------------------------------------------------------- */
static void test_cuda_rules(tu_rng* rng) {
    (void)rng;
    const char* fn = "fl_linear_cross_entropy_forward_cuda";
    const int64_t N = 4, H = 16, V = 7;
    unsigned char* x = (unsigned char*)aligned_alloc(256, 4096);
    unsigned char* w = (unsigned char*)aligned_alloc(256, 4096);
    unsigned char* bb = (unsigned char*)aligned_alloc(256, 256);
    unsigned char* dh = (unsigned char*)aligned_alloc(256, 4096);
    unsigned char* dw = (unsigned char*)aligned_alloc(256, 4096);
    unsigned char* db = (unsigned char*)aligned_alloc(256, 256);
    float loss[4], lse[4], cw[7] = {1, 1, 1, -1, 1, 1, 1};
    int64_t t[4] = {0, 1, 2, 3};
    size_t wsb;
    fl_linear_cross_entropy_workspace_size(&wsb, N, H, V, FL_DTYPE_F16, FL_DTYPE_F16, NULL, NULL);
    unsigned char* ws = (unsigned char*)aligned_alloc(256, (wsb + 511) / 256 * 256);
    fl__ce_params p;
    fl__lce_plan plan;
    fl_ce_options co = FL_CE_OPTIONS_INIT;
#define V_CALL(cuda, X, LDH, W, LDW, B, DH, DW, DB, WS, WSB, DT)                                                    \
    fl__lce_validate(fn, 0, cuda, loss, lse, DH, DW, DB, X, LDH, W, LDW, B, t, NULL, 1.0f, N, H, V, DT, DT,           \
                     FL_INDEX_I64, &co, NULL, WS, WSB, &p, &plan)
    struct { const char* what; fl_status want; int cuda; size_t ox, ow, ob, odh, odw, odb, ows; int64_t ldh, ldw; fl_dtype dt; } cs[] = {
        {"valid (f16, ld 16)", FL_OK, 1, 0, 0, 0, 0, 0, 0, 0, 16, 16, FL_DTYPE_F16},
        {"hidden +2 bytes", FL_ERR_UNSUPPORTED, 1, 2, 0, 0, 0, 0, 0, 0, 16, 16, FL_DTYPE_F16},
        {"weight +8 bytes", FL_ERR_UNSUPPORTED, 1, 0, 8, 0, 0, 0, 0, 0, 16, 16, FL_DTYPE_F16},
        {"bias +2 bytes", FL_ERR_UNSUPPORTED, 1, 0, 0, 2, 0, 0, 0, 0, 16, 16, FL_DTYPE_F16},
        {"dhidden +4 bytes", FL_ERR_UNSUPPORTED, 1, 0, 0, 0, 4, 0, 0, 0, 16, 16, FL_DTYPE_F16},
        {"dweight +2 bytes", FL_ERR_UNSUPPORTED, 1, 0, 0, 0, 0, 2, 0, 0, 16, 16, FL_DTYPE_F16},
        {"dbias +6 bytes", FL_ERR_UNSUPPORTED, 1, 0, 0, 0, 0, 0, 6, 0, 16, 16, FL_DTYPE_F16},
        {"ld_hidden 20 (40 bytes)", FL_ERR_UNSUPPORTED, 1, 0, 0, 0, 0, 0, 0, 0, 20, 16, FL_DTYPE_F16},
        {"ld_weight 17", FL_ERR_UNSUPPORTED, 1, 0, 0, 0, 0, 0, 0, 0, 16, 17, FL_DTYPE_F16},
        {"workspace +16 bytes", FL_ERR_INVALID_ARGUMENT, 1, 0, 0, 0, 0, 0, 0, 16, 16, 16, FL_DTYPE_F16},
        {"f32, ld 20 (80 bytes: a multiple of 16)", FL_OK, 1, 0, 0, 0, 0, 0, 0, 0, 20, 20, FL_DTYPE_F32},
        {"f32, ld 18 (72 bytes)", FL_ERR_UNSUPPORTED, 1, 0, 0, 0, 0, 0, 0, 0, 18, 16, FL_DTYPE_F32},
        {"CPU: hidden +2 bytes (element-aligned f16) is fine", FL_OK, 0, 2, 0, 0, 0, 0, 0, 0, 16, 16, FL_DTYPE_F16},
        {"CPU: ld_hidden 17 is fine", FL_OK, 0, 0, 0, 0, 0, 0, 0, 0, 17, 17, FL_DTYPE_F16},
        {"CPU: workspace +16 bytes is fine", FL_OK, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, FL_DTYPE_F16},
    };
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        size_t need;
        fl_linear_cross_entropy_workspace_size(&need, N, H, V, cs[k].dt, cs[k].dt, NULL, NULL);
        fl__clear_error();
        fl_status st = V_CALL(cs[k].cuda, x + cs[k].ox, cs[k].ldh, w + cs[k].ow, cs[k].ldw, bb + cs[k].ob, dh + cs[k].odh,
                              dw + cs[k].odw, db + cs[k].odb, ws + cs[k].ows, need, cs[k].dt);
        CHECK_STATUS(st, cs[k].want, cs[k].what);
        if (st != FL_OK) CHECK(contains(fl_last_error(), fn), "%s: message \"%s\"", cs[k].what, fl_last_error());
    }
    /* class weights are device memory on CUDA: not read (a negative one passes), read on the CPU */
    co.weight = cw;
    fl_status st = V_CALL(1, x, 16, w, 16, bb, dh, dw, db, ws, wsb, FL_DTYPE_F16);
    CHECK_STATUS(st, FL_OK, "CUDA: class weights not read");
    st = V_CALL(0, x, 16, w, 16, bb, dh, dw, db, ws, wsb, FL_DTYPE_F16);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "CPU: negative class weight");
#undef V_CALL
    free(x); free(w); free(bb); free(dh); free(dw); free(db); free(ws);
}

/* ------------------------------------------------------------------------------------------ */
static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261202ull;
    printf("seed %llu\n", (unsigned long long)seed);
    tu_quiet = 1; /* print failures only; each section prints its count */
    tu_rng rng = tu_rng_seed(seed);
    static void (*const sections[])(tu_rng*) = {test_errors, test_cuda_rules, test_plan, test_reference_fd,
                                                 test_options, test_shapes, test_chunks, test_threads,
                                                 test_wgrad, test_special};
    static const char* const names[] = {"bad arguments", "CUDA-only rules (shared validator)", "plan / workspace size",
                                        "reference vs finite differences", "options x dtypes", "shapes x dtypes",
                                        "chunk_rows independence", "threads", "wgrad_dtype / accumulation",
                                        "N=0 / all ignored / frozen / grad_loss"};
    for (size_t k = 0; k < sizeof sections / sizeof sections[0]; k++) {
        double t0 = now_s();
        long f0 = tu_failed, p0 = tu_passed;
        sections[k](&rng);
        printf("== section %-40s %6ld checks, %s  (%.2f s)\n", names[k], (tu_passed - p0) + (tu_failed - f0),
               tu_failed == f0 ? "ok" : "FAILED", now_s() - t0);
    }
    printf("worst |err| / tolerance vs the reference, per output and dtype (f32, f16, bf16):\n");
    for (int k = 0; k < N_KINDS; k++)
        printf("  %-8s %.3g  %.3g  %.3g\n", KIND[k], g_worst[k][0], g_worst[k][1], g_worst[k][2]);
    return tu_finish();
}
