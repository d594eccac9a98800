/* test_cross_entropy.c — the CPU cross-entropy backend against an independent long-double
 * reference (tests/ref_cross_entropy.h), whose gradient is itself proved by central finite
 * differences for every option; edge cases; the required accuracy at GPT-2 size; every
 * bad argument with its exact status.
 *
 * Build and run (the Makefile does this in `make test`):
 *   cc -std=c11 -O2 -Iinclude tests/test_cross_entropy.c build/libfusedloss.a -lm -lpthread \
 *      -fopenmp -o build/test_cross_entropy && ./build/test_cross_entropy
 * Ends with "N passed, M failed"; exit code 0 only when nothing failed.
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

/* ------------------------------------------------------------------------------------------
 * Tolerances, |got - ref| <= atol + rtol*|ref|, per logits dtype. The reference runs on the
 * same (rounded) inputs, so only output rounding and accumulation order remain:
 *   loss / lse : fp32 rounded once from double            -> rtol 1e-6 (half an ulp is 6e-8)
 *   dlogits    : rounded once to the logits' dtype         -> about 2 ulps of that dtype;
 *                fp16's atol is one subnormal step (2^-24).
 * A backward pass uses the fp32 lse saved by forward, so its dlogits may in addition differ
 * from the exact gradient by what that rounding of lse explains (the "slack", computed by
 * running the reference with the saved lse; see ref_slack). fp16/bf16 dlogits must moreover
 * be the correctly rounded reference except next to a tie (ref_check_rounding), which the
 * 2-ulp tolerance alone would not catch.
 * ---------------------------------------------------------------------------------------- */
typedef struct { double loss_atol, loss_rtol, grad_atol, grad_rtol; } tol_t;
static const tol_t TOL[3] = {
    /* FL_DTYPE_F32  */ {1e-8, 1e-6, 1e-7, 1e-5},
    /* FL_DTYPE_F16  */ {1e-8, 1e-6, 6e-8, 1e-3},
    /* FL_DTYPE_BF16 */ {1e-8, 1e-6, 1e-9, 8e-3},
};
/* Required accuracy at N=64, V=50257 (asserted in test_required_accuracy). */
#define REQ_LOSS_REL 1e-6   /* loss relative error vs long double, every dtype */
#define REQ_GRAD_ABS 1e-6   /* dlogits max abs error, fp32 output */
/* Finite differences of the long-double loss: step and tolerance (relative to the objective). */
#define FD_STEP 1e-6L
#define FD_ATOL 1e-9        /* times (1 + |objective|) */
#define FD_RTOL 1e-7

enum { P_FWD = 0, P_BWD = 1, P_FUSED = 2 };
static const char* const FN[3] = {"fl_cross_entropy_forward_cpu", "fl_cross_entropy_backward_cpu",
                                  "fl_cross_entropy_fused_cpu"};

/* ------------------------------------------------------------------------------------------
 * Option configurations: every option alone and in combinations.
 * ---------------------------------------------------------------------------------------- */
#include "ce_configs.h"

/* ------------------------------------------------------------------------------------------
 * A problem instance: logits buffer (padding and ignored rows poisoned: never read),
 * targets, weights, upstream gradient.
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t        N, V, ld;
    fl_dtype       dt;
    fl_index_dtype it;
    fl_ce_options  o;
    float*         w;       /* owned class weights or NULL */
    float*         off;     /* owned per-class logit offsets or NULL */
    void*          x;       /* logits [N, ld] of dt */
    void*          t;       /* targets [N] of it */
    float*         gl;      /* grad_loss ([N] for NONE, [1] otherwise) or NULL */
    float          gs;      /* grad_scale */
} prob_t;

enum { LOGITS_NORMAL = 0, LOGITS_BIG = 1 };

static size_t xbytes(const prob_t* p) { return (size_t)(p->N > 0 ? p->N : 1) * (size_t)p->ld * tu_dtype_size(p->dt); }
static int64_t n_loss(const prob_t* p) { return p->o.reduction == FL_REDUCTION_NONE ? p->N : 1; }
static int64_t tgt(const prob_t* p, int64_t i) { return ref_target(p->t, p->it, i); }
static void set_tgt(prob_t* p, int64_t i, int64_t v) {
    if (p->it == FL_INDEX_I32) ((int32_t*)p->t)[i] = (int32_t)v;
    else ((int64_t*)p->t)[i] = v;
}

/* Build a problem. ignored_rows: bitmask of rows forced to ignore_index (besides rows whose
 * random target happens to equal an in-range ignore_index). gmode: 0 grad_loss NULL,
 * 1 grad_loss pointer ([N] for NONE). */
static prob_t make_prob(tu_rng* rng, const cfg_t* c, int64_t N, int64_t V, int64_t ld, fl_dtype dt,
                        fl_index_dtype it, uint64_t ignored_rows, int gmode, float gs, int logits_kind) {
    prob_t p;
    memset(&p, 0, sizeof p);
    p.N = N; p.V = V; p.ld = ld; p.dt = dt; p.it = it; p.gs = gs;
    p.o = cfg_options(c, V, rng, &p.w, &p.off);
    const fl_ce_options o = p.o;
    p.t = tu_xmalloc((size_t)(N > 0 ? N : 1) * 8);
    for (int64_t i = 0; i < N; i++) {
        int64_t t = tu_int_in(rng, 0, V - 1);
        if (i < 64 && ((ignored_rows >> i) & 1)) t = o.ignore_index;
        set_tgt(&p, i, t);
    }
    /* MEAN with weights: keep D_w > 0 whenever a row counts (0/0 is not a case we test). */
    if (p.w && o.reduction == FL_REDUCTION_MEAN) {
        double dw = 0; int64_t first = -1;
        for (int64_t i = 0; i < N; i++)
            if (tgt(&p, i) != o.ignore_index) { dw += p.w[tgt(&p, i)]; if (first < 0) first = i; }
        if (first >= 0 && dw == 0.0) p.w[tgt(&p, first)] = 1.0f;
    }
    p.x = tu_xmalloc(xbytes(&p));
    tu_poison(p.x, xbytes(&p));
    for (int64_t i = 0; i < N; i++) {
        if (tgt(&p, i) == o.ignore_index) continue; /* ignored rows stay NaN: must not be read */
        for (int64_t j = 0; j < V; j++) {
            double v;
            if (logits_kind == LOGITS_BIG) {
                double u = tu_uniform(rng);
                v = u < 0.2 ? 1e4 : u < 0.4 ? -1e4 : tu_uniform_in(rng, -1e4, 1e4);
            } else {
                v = 2.0 * tu_normal(rng);
            }
            tu_store(p.x, dt, i * ld + j, (float)v);
        }
    }
    if (gmode) {
        int64_t n = n_loss(&p);
        p.gl = (float*)tu_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        for (int64_t i = 0; i < n; i++) p.gl[i] = (float)tu_uniform_in(rng, -2.0, 2.0);
    }
    return p;
}

static void free_prob(prob_t* p) {
    free(p->w); free(p->off); free(p->x); free(p->t); free(p->gl);
    memset(p, 0, sizeof *p);
}

static void* alloc_ws(const prob_t* p, size_t* bytes) {
    fl_status st = fl_cross_entropy_workspace_size(bytes, p->N, p->V, p->dt, &p->o);
    CHECK_STATUS(st, FL_OK, "fl_cross_entropy_workspace_size");
    if (st != FL_OK) *bytes = 0;
    if (*bytes == 0) return NULL;
    void* ws = tu_xmalloc(*bytes);
    tu_poison(ws, *bytes); /* content need not be initialised */
    return ws;
}

/* Finite differences of the long-double objective vs the long-double analytic gradient. */
static void fd_check(const prob_t* p, const char* label) {
    const int64_t N = p->N, V = p->V;
    long double* x = (long double*)tu_xmalloc((size_t)(N * V) * sizeof(long double));
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < V; j++) x[i * V + j] = (long double)tu_load(p->x, p->dt, i * p->ld + j);
    ref_logits rx = {x, REF_LDOUBLE, V};
    long double* loss = (long double*)tu_xmalloc((size_t)(N + 1) * sizeof(long double));
    double* an = (double*)tu_xmalloc((size_t)(N * V) * sizeof(double));
    double* fd = (double*)tu_xmalloc((size_t)(N * V) * sizeof(double));
    ref_ce(&rx, p->t, p->it, N, V, &p->o, p->gl, p->gs, NULL, loss, NULL, an, NULL);
    long double obj0 = ref_objective(loss, N, p->o.reduction, p->gl, p->gs);
    for (int64_t k = 0; k < N * V; k++) {
        if (tgt(p, k / V) == p->o.ignore_index) { fd[k] = 0.0; continue; } /* NaN logits: not a point */
        long double x0 = x[k];
        x[k] = x0 + FD_STEP;
        ref_ce(&rx, p->t, p->it, N, V, &p->o, NULL, 1.0f, NULL, loss, NULL, NULL, NULL);
        long double fp = ref_objective(loss, N, p->o.reduction, p->gl, p->gs);
        x[k] = x0 - FD_STEP;
        ref_ce(&rx, p->t, p->it, N, V, &p->o, NULL, 1.0f, NULL, loss, NULL, NULL, NULL);
        long double fm = ref_objective(loss, N, p->o.reduction, p->gl, p->gs);
        x[k] = x0;
        fd[k] = (double)((fp - fm) / (2.0L * FD_STEP));
    }
    char name[256];
    snprintf(name, sizeof name, "%s: reference grad vs finite differences", label);
    check_close(name, fd, an, N * V, FD_ATOL * (1.0 + fabs((double)obj0)), FD_RTOL);
    free(x); free(loss); free(an); free(fd);
}

/* Largest errors of one run_case, for the required-accuracy assertions. */
typedef struct { double loss_rel, lse_rel, fused_grad_abs, bwd_grad_abs; } errs_t;

static double max_abs_err(const void* dl, fl_dtype dt, int64_t N, int64_t V, int64_t ld, const double* ref) {
    double m = 0;
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < V; j++) {
            double d = fabs((double)tu_load(dl, dt, i * ld + j) - ref[i * V + j]);
            if (!(d <= m)) m = d; /* NaN propagates as a failure */
        }
    return m;
}
static double max_rel_err(const float* got, const long double* ref, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = (double)ref[i];
        double d = r == 0.0 ? fabs((double)got[i]) : fabs((double)got[i] - r) / fabs(r);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* ------------------------------------------------------------------------------------------
 * run_case: every pass of the library on one problem vs the reference, plus in place,
 * lse NULL, determinism, thread count, fused == forward + backward.
 * ---------------------------------------------------------------------------------------- */
static void run_case(const prob_t* p, const char* label, errs_t* errs, int light) {
    const int64_t N = p->N, V = p->V, ld = p->ld;
    const fl_dtype dt = p->dt;
    const tol_t tol = TOL[dt];
    const int64_t nl = n_loss(p), nr = N > 0 ? N : 1;
    const size_t dlb = xbytes(p);
    char name[320];
    fl_status st;

    size_t wsb = 0;
    void* ws = alloc_ws(p, &wsb);

    /* forward */
    ref_logits rx = {p->x, dt, ld};
    const size_t gbytes = (size_t)(N * V > 0 ? N * V : 1) * sizeof(double);
    long double* rloss = (long double*)tu_xmalloc((size_t)nr * sizeof(long double));
    long double* rlse = (long double*)tu_xmalloc((size_t)nr * sizeof(long double));
    double* rgrad = (double*)tu_xmalloc(gbytes);
    double* rgrad_s = (double*)tu_xmalloc(gbytes);
    double* slack = (double*)tu_xmalloc(gbytes);
    float* loss = (float*)tu_xmalloc((size_t)nr * 4);
    float* lse = (float*)tu_xmalloc((size_t)nr * 4);
    tu_poison(loss, (size_t)nr * 4);
    tu_poison(lse, (size_t)nr * 4);
    st = fl_cross_entropy_forward_cpu(loss, lse, p->x, p->t, N, V, ld, dt, p->it, &p->o, ws, wsb);
    snprintf(name, sizeof name, "%s: forward", label);
    if (!CHECK_STATUS(st, FL_OK, name)) goto done;

    /* reference: loss, lse, the exact gradient, and the gradient from the saved fp32 lse */
    ref_ce(&rx, p->t, p->it, N, V, &p->o, p->gl, p->gs, lse, rloss, rlse, rgrad, rgrad_s);
    ref_slack(slack, rgrad_s, rgrad, N * V, tol.grad_rtol);
    snprintf(name, sizeof name, "%s: forward loss", label);
    ref_check_f32(name, loss, rloss, nl, tol.loss_atol, tol.loss_rtol);
    snprintf(name, sizeof name, "%s: forward lse", label);
    ref_check_f32(name, lse, rlse, N, tol.loss_atol, tol.loss_rtol);
    if (errs) {
        errs->loss_rel = max_rel_err(loss, rloss, nl);
        errs->lse_rel = max_rel_err(lse, rlse, N);
    }
    {   /* opts->target_prob (OHEM): p_t per row vs the reference (1 on ignored rows), loss and lse
         * bitwise unchanged by asking for it; fused writes the same p_t bits */
        long double* rtp = (long double*)tu_xmalloc((size_t)nr * sizeof(long double));
        float* tp = (float*)tu_xmalloc((size_t)nr * 4);
        float* tp2 = (float*)tu_xmalloc((size_t)nr * 4);
        float* l2 = (float*)tu_xmalloc((size_t)nr * 4);
        float* s2 = (float*)tu_xmalloc((size_t)nr * 4);
        void* d2 = tu_xmalloc(dlb);
        ref_target_prob(&rx, p->t, p->it, N, V, &p->o, rtp);
        fl_ce_options o2 = p->o;
        o2.target_prob = tp;
        tu_poison(tp, (size_t)nr * 4);
        tu_poison(l2, (size_t)nr * 4);
        tu_poison(s2, (size_t)nr * 4);
        st = fl_cross_entropy_forward_cpu(l2, s2, p->x, p->t, N, V, ld, dt, p->it, &o2, ws, wsb);
        snprintf(name, sizeof name, "%s: forward with target_prob", label);
        CHECK_STATUS(st, FL_OK, name);
        check_bitwise(name, l2, loss, (size_t)nl * 4);
        check_bitwise(name, s2, lse, (size_t)N * 4);
        snprintf(name, sizeof name, "%s: forward target_prob", label);
        ref_check_f32(name, tp, rtp, N, tol.loss_atol, tol.loss_rtol);
        o2.target_prob = tp2;
        tu_poison(tp2, (size_t)nr * 4);
        tu_poison(d2, dlb);
        st = fl_cross_entropy_fused_cpu(l2, s2, d2, p->x, p->t, p->gl, p->gs, N, V, ld, dt, p->it, &o2, ws, wsb);
        snprintf(name, sizeof name, "%s: fused target_prob == forward's", label);
        CHECK_STATUS(st, FL_OK, name);
        check_bitwise(name, tp2, tp, (size_t)N * 4);
        free(rtp); free(tp); free(tp2); free(l2); free(s2); free(d2);
    }
    if (!light) {   /* lse NULL: same loss; and a second call: bitwise the same (determinism) */
        float* loss2 = (float*)tu_xmalloc((size_t)nr * 4);
        float* lse2 = (float*)tu_xmalloc((size_t)nr * 4);
        tu_poison(loss2, (size_t)nr * 4);
        st = fl_cross_entropy_forward_cpu(loss2, NULL, p->x, p->t, N, V, ld, dt, p->it, &p->o, ws, wsb);
        snprintf(name, sizeof name, "%s: forward lse=NULL loss", label);
        CHECK_STATUS(st, FL_OK, name);
        check_bitwise(name, loss2, loss, (size_t)nl * 4);
        tu_poison(loss2, (size_t)nr * 4);
        tu_poison(lse2, (size_t)nr * 4);
        st = fl_cross_entropy_forward_cpu(loss2, lse2, p->x, p->t, N, V, ld, dt, p->it, &p->o, ws, wsb);
        snprintf(name, sizeof name, "%s: forward twice (loss, lse)", label);
        CHECK_STATUS(st, FL_OK, name);
        check_bitwise(name, loss2, loss, (size_t)nl * 4);
        check_bitwise(name, lse2, lse, (size_t)N * 4);
        free(loss2); free(lse2);
    }

    /* backward from the saved lse: the exact gradient, within what lse's fp32 rounding explains */
    void* dl = tu_xmalloc(dlb);
    tu_poison(dl, dlb);
    st = fl_cross_entropy_backward_cpu(dl, p->x, p->t, lse, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
    snprintf(name, sizeof name, "%s: backward", label);
    CHECK_STATUS(st, FL_OK, name);
    snprintf(name, sizeof name, "%s: backward dlogits", label);
    ref_check_dlogits(name, dl, dt, N, V, ld, rgrad, slack, tol.grad_atol, tol.grad_rtol);
    ref_check_rounding(name, dl, dt, N, V, ld, rgrad_s);
    if (errs) errs->bwd_grad_abs = max_abs_err(dl, dt, N, V, ld, rgrad);
    if (!light) {   /* backward in place: dlogits == logits gives the same bits; padding untouched */
        void* ip = tu_xmalloc(dlb);
        memcpy(ip, p->x, dlb);
        st = fl_cross_entropy_backward_cpu(ip, ip, p->t, lse, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
        snprintf(name, sizeof name, "%s: backward in place", label);
        CHECK_STATUS(st, FL_OK, name);
        check_bitwise(name, ip, dl, (size_t)N * ld * tu_dtype_size(dt));
        free(ip);
    }

    /* fused */
    float* floss = (float*)tu_xmalloc((size_t)nr * 4);
    float* flse = (float*)tu_xmalloc((size_t)nr * 4);
    void* fdl = tu_xmalloc(dlb);
    tu_poison(floss, (size_t)nr * 4);
    tu_poison(flse, (size_t)nr * 4);
    tu_poison(fdl, dlb);
    st = fl_cross_entropy_fused_cpu(floss, flse, fdl, p->x, p->t, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
    snprintf(name, sizeof name, "%s: fused", label);
    CHECK_STATUS(st, FL_OK, name);
    snprintf(name, sizeof name, "%s: fused dlogits", label);
    ref_check_dlogits(name, fdl, dt, N, V, ld, rgrad, NULL, tol.grad_atol, tol.grad_rtol);
    ref_check_rounding(name, fdl, dt, N, V, ld, rgrad);
    if (errs) errs->fused_grad_abs = max_abs_err(fdl, dt, N, V, ld, rgrad);
    snprintf(name, sizeof name, "%s: fused loss == forward loss", label);
    check_bitwise(name, floss, loss, (size_t)nl * 4);
    snprintf(name, sizeof name, "%s: fused lse == forward lse", label);
    check_bitwise(name, flse, lse, (size_t)N * 4);
    {   /* fused dlogits == backward dlogits, up to what the saved lse's fp32 rounding explains
         * (fused uses the exact lse, backward the fp32 one it is given) */
        double* a = (double*)tu_xmalloc((size_t)(N * V > 0 ? N * V : 1) * sizeof(double));
        double* b = (double*)tu_xmalloc((size_t)(N * V > 0 ? N * V : 1) * sizeof(double));
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < V; j++) {
                a[i * V + j] = tu_load(fdl, dt, i * ld + j);
                b[i * V + j] = tu_load(dl, dt, i * ld + j);
            }
        snprintf(name, sizeof name, "%s: fused dlogits == backward dlogits", label);
        check_close_ex(name, a, b, slack, N * V, tol.grad_atol, tol.grad_rtol);
        free(a); free(b);
    }
    {
        float* l2 = (float*)tu_xmalloc((size_t)nr * 4);
        float* s2 = (float*)tu_xmalloc((size_t)nr * 4);
        void* d2 = tu_xmalloc(dlb);
        /* lse NULL */
        if (!light) {
        tu_poison(l2, (size_t)nr * 4);
        tu_poison(d2, dlb);
        st = fl_cross_entropy_fused_cpu(l2, NULL, d2, p->x, p->t, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
        snprintf(name, sizeof name, "%s: fused lse=NULL (loss, dlogits)", label);
        CHECK_STATUS(st, FL_OK, name);
        check_bitwise(name, l2, floss, (size_t)nl * 4);
        check_bitwise(name, d2, fdl, dlb);
        /* in place */
        tu_poison(l2, (size_t)nr * 4);
        tu_poison(s2, (size_t)nr * 4);
        memcpy(d2, p->x, dlb);
        st = fl_cross_entropy_fused_cpu(l2, s2, d2, d2, p->t, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
        snprintf(name, sizeof name, "%s: fused in place (loss, lse, dlogits)", label);
        CHECK_STATUS(st, FL_OK, name);
        check_bitwise(name, l2, floss, (size_t)nl * 4);
        check_bitwise(name, s2, flse, (size_t)N * 4);
        check_bitwise(name, d2, fdl, dlb);
        }
        /* determinism and thread count: 1 and 3 OpenMP threads give the same bits */
#ifdef _OPENMP
        const int nthreads[2] = {1, 3};
        const int saved = omp_get_max_threads();
#else
        const int nthreads[2] = {1, 1};
#endif
        for (int k = 0; k < 2; k++) {
#ifdef _OPENMP
            omp_set_num_threads(nthreads[k]);
#endif
            tu_poison(l2, (size_t)nr * 4);
            tu_poison(s2, (size_t)nr * 4);
            tu_poison(d2, dlb);
            st = fl_cross_entropy_fused_cpu(l2, s2, d2, p->x, p->t, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
            snprintf(name, sizeof name, "%s: fused again, %d thread(s)", label, nthreads[k]);
            CHECK_STATUS(st, FL_OK, name);
            snprintf(name, sizeof name, "%s: fused again, %d thread(s): loss", label, nthreads[k]);
            check_bitwise(name, l2, floss, (size_t)nl * 4);
            snprintf(name, sizeof name, "%s: fused again, %d thread(s): lse", label, nthreads[k]);
            check_bitwise(name, s2, flse, (size_t)N * 4);
            snprintf(name, sizeof name, "%s: fused again, %d thread(s): dlogits", label, nthreads[k]);
            check_bitwise(name, d2, fdl, dlb);
        }
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
        free(l2); free(s2); free(d2);
    }
    free(floss); free(flse); free(fdl); free(dl);
done:
    free(rloss); free(rlse); free(rgrad); free(rgrad_s); free(slack); free(loss); free(lse); free(ws);
}

/* ------------------------------------------------------------------------------------------
 * Options alone and combined: FD proof of the reference, then the library, over dtypes,
 * index dtypes, shapes (ld > V, odd V, V = 1) and upstream gradients.
 * ---------------------------------------------------------------------------------------- */
static void test_options(tu_rng* rng) {
    static const struct { int64_t N, V, ld; uint64_t ignored; } shapes[] = {
        {6, 7, 9, 0x12},       /* ld > V, rows 1 and 4 ignored */
        {9, 33, 33, 0x4},      /* odd V, ld == V */
        {3, 1, 2, 0x0},        /* V = 1 */
        {4, 1001, 1003, 0x8},  /* longer odd row */
    };
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    char label[256];
    for (int c = 0; c < N_CFGS; c++) {
        const cfg_t* cf = &CFGS[c];
        /* FD proof: small, fp32, with ignored rows and a non-trivial upstream gradient */
        for (int gm = 0; gm < 2; gm++) {
            prob_t p = make_prob(rng, cf, 5, 6, 7, FL_DTYPE_F32, FL_INDEX_I64, 0x2, gm, gm ? 0.7f : 1.0f, LOGITS_NORMAL);
            snprintf(label, sizeof label, "[%s] FD grad_loss %s", cf->name, gm ? "ptr" : "NULL");
            fd_check(&p, label);
            free_prob(&p);
        }
        {   /* FD on V = 1 */
            prob_t p = make_prob(rng, cf, 3, 1, 1, FL_DTYPE_F32, FL_INDEX_I32, 0x0, 1, 1.0f, LOGITS_NORMAL);
            snprintf(label, sizeof label, "[%s] FD V=1", cf->name);
            fd_check(&p, label);
            free_prob(&p);
        }
        /* the sweep prints failures only, then one line per configuration */
        const long p0 = tu_passed, f0 = tu_failed;
        tu_quiet = 1;
        for (int s = 0; s < n_shapes; s++)
            for (int dt = 0; dt < 3; dt++)
                for (int it = 0; it < 2; it++)
                    for (int gm = 0; gm < 2; gm++) {
                        if (shapes[s].V > 100 && (it == 1 || gm == 0)) continue; /* keep it quick */
                        float gs = gm ? (dt == 1 ? -2.0f : 0.37f) : 1.0f;
                        prob_t p = make_prob(rng, cf, shapes[s].N, shapes[s].V, shapes[s].ld, (fl_dtype)dt,
                                             (fl_index_dtype)it, shapes[s].ignored, gm, gs, LOGITS_NORMAL);
                        snprintf(label, sizeof label, "[%s] N=%lld V=%lld ld=%lld %s %s grad_loss=%s gs=%g",
                                 cf->name, (long long)p.N, (long long)p.V, (long long)p.ld,
                                 tu_dtype_name(p.dt), it ? "i64" : "i32",
                                 gm ? (cf->red == FL_REDUCTION_NONE ? "per-row" : "ptr") : "NULL", gs);
                        run_case(&p, label, NULL, 0);
                        free_prob(&p);
                    }
        tu_quiet = 0;
        printf("[%s] library vs reference over dtypes x index dtypes x shapes x upstream gradients: "
               "%ld checks, %s\n", cf->name, (tu_passed - p0) + (tu_failed - f0),
               tu_failed == f0 ? "all OK" : "FAILURES above");
    }
}

/* Logits of +-1e4 (exactly representable in every dtype) for a few configurations. */
static void test_big_logits(tu_rng* rng) {
    const int cfgs[] = {0, 1, 14, 17, 23, 24};
    char label[256];
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
        const cfg_t* cf = &CFGS[cfgs[k]];
        prob_t q = make_prob(rng, cf, 4, 9, 9, FL_DTYPE_F32, FL_INDEX_I64, 0x0, 1, 0.5f, LOGITS_BIG);
        snprintf(label, sizeof label, "[%s] logits +-1e4 FD", cf->name);
        fd_check(&q, label);
        free_prob(&q);
        const long p0 = tu_passed, f0 = tu_failed;
        tu_quiet = 1;
        for (int dt = 0; dt < 3; dt++) {
            prob_t p = make_prob(rng, cf, 7, 37, 40, (fl_dtype)dt, FL_INDEX_I32, 0x20, 1, 1.0f, LOGITS_BIG);
            snprintf(label, sizeof label, "[%s] logits +-1e4 %s", cf->name, tu_dtype_name(p.dt));
            run_case(&p, label, NULL, 0);
            free_prob(&p);
        }
        tu_quiet = 0;
        printf("[%s] logits +-1e4, library vs reference, f32/f16/bf16: %ld checks, %s\n", cf->name,
               (tu_passed - p0) + (tu_failed - f0), tu_failed == f0 ? "all OK" : "FAILURES above");
    }
}

/* Rows spread over threads (N*V large enough for the OpenMP path): results independent of
 * the thread count (run_case compares 1 and 3 threads with the default). */
static void test_threads(tu_rng* rng) {
    const int cfgs[] = {23, 24, 25};
    char label[256];
    for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++)
        for (int dt = 0; dt < 3; dt += 2) {
            prob_t p = make_prob(rng, &CFGS[cfgs[k]], 37, 2003, 2005, (fl_dtype)dt, FL_INDEX_I64,
                                 0x10204ull, 1, 0.25f, LOGITS_NORMAL);
            snprintf(label, sizeof label, "[%s] threads N=37 V=2003 ld=2005 %s", CFGS[cfgs[k]].name,
                     tu_dtype_name(p.dt));
            const long p0 = tu_passed, f0 = tu_failed;
            tu_quiet = 1;
            run_case(&p, label, NULL, 0);
            tu_quiet = 0;
            printf("%s: %ld checks, %s\n", label, (tu_passed - p0) + (tu_failed - f0),
                   tu_failed == f0 ? "all OK" : "FAILURES above");
            free_prob(&p);
        }
}

/* opts == NULL means FL_CE_OPTIONS_INIT: bitwise the same results. */
static void test_null_opts(tu_rng* rng) {
    prob_t p = make_prob(rng, &CFGS[0], 5, 11, 12, FL_DTYPE_F32, FL_INDEX_I64, 0x1, 0, 1.0f, LOGITS_NORMAL);
    size_t wsb = 0, wsb2 = 0;
    void* ws = alloc_ws(&p, &wsb);
    fl_status st = fl_cross_entropy_workspace_size(&wsb2, p.N, p.V, p.dt, NULL);
    CHECK(st == FL_OK && wsb2 == wsb, "workspace_size(opts NULL) = %zu, with defaults %zu", wsb2, wsb);
    float l1, l2, s1[5], s2[5];
    float* d1 = (float*)tu_xmalloc(xbytes(&p));
    float* d2 = (float*)tu_xmalloc(xbytes(&p));
    tu_poison(d1, xbytes(&p));
    tu_poison(d2, xbytes(&p));
    st = fl_cross_entropy_fused_cpu(&l1, s1, d1, p.x, p.t, NULL, 1.0f, p.N, p.V, p.ld, p.dt, p.it, &p.o, ws, wsb);
    CHECK_STATUS(st, FL_OK, "fused with FL_CE_OPTIONS_INIT");
    st = fl_cross_entropy_fused_cpu(&l2, s2, d2, p.x, p.t, NULL, 1.0f, p.N, p.V, p.ld, p.dt, p.it, NULL, ws, wsb);
    CHECK_STATUS(st, FL_OK, "fused with opts NULL");
    check_bitwise("opts NULL == FL_CE_OPTIONS_INIT (loss)", &l2, &l1, 4);
    check_bitwise("opts NULL == FL_CE_OPTIONS_INIT (lse)", s2, s1, sizeof s1);
    check_bitwise("opts NULL == FL_CE_OPTIONS_INIT (dlogits)", d2, d1, xbytes(&p));
    free(d1); free(d2); free(ws);
    free_prob(&p);
}

/* ------------------------------------------------------------------------------------------
 * N = 0 and all rows ignored. A finite poison (0x7F bytes) shows that a NaN loss was written.
 * ---------------------------------------------------------------------------------------- */
static void poison_finite(void* p, size_t bytes) { memset(p, 0x7F, bytes); }

static void test_empty_and_all_ignored(tu_rng* rng) {
    char name[256];
    for (int red = 0; red < 3; red++) {
        for (int dt = 0; dt < 3; dt++) {
            /* ---- N = 0: MEAN NaN, SUM 0, NONE writes nothing; no dlogits written ---- */
            cfg_t cf = CFGS[23];
            cf.red = (fl_reduction)red;
            prob_t p = make_prob(rng, &cf, 0, 5, 6, (fl_dtype)dt, FL_INDEX_I64, 0, 1, 1.0f, LOGITS_NORMAL);
            size_t wsb = 0;
            void* ws = alloc_ws(&p, &wsb);
            float loss[2], lse[2];
            unsigned char dl[64];
            const char* rn = red == 0 ? "none" : red == 1 ? "mean" : "sum";
            for (int pass = 0; pass < 3; pass++) {
                poison_finite(loss, sizeof loss);
                poison_finite(lse, sizeof lse);
                memset(dl, 0x7F, sizeof dl);
                float lse_in = 0.0f;
                fl_status st;
                if (pass == P_FWD)
                    st = fl_cross_entropy_forward_cpu(loss, lse, p.x, p.t, 0, 5, 6, p.dt, p.it, &p.o, ws, wsb);
                else if (pass == P_BWD)
                    st = fl_cross_entropy_backward_cpu(dl, p.x, p.t, &lse_in, p.gl, 1.0f, 0, 5, 6, p.dt, p.it, &p.o, ws, wsb);
                else
                    st = fl_cross_entropy_fused_cpu(loss, lse, dl, p.x, p.t, p.gl, 1.0f, 0, 5, 6, p.dt, p.it, &p.o, ws, wsb);
                snprintf(name, sizeof name, "N=0 %s %s %s", FN[pass], rn, tu_dtype_name(p.dt));
                CHECK_STATUS(st, FL_OK, name);
                int dl_untouched = 1;
                for (size_t k = 0; k < sizeof dl; k++) dl_untouched &= dl[k] == 0x7F;
                CHECK(dl_untouched, "%s: dlogits written", name);
                uint32_t lse_bits = tu_f32_bits(lse[0]);
                CHECK(lse_bits == 0x7F7F7F7Fu, "%s: lse[0] written with N = 0", name);
                if (pass == P_BWD) continue;
                if (red == FL_REDUCTION_MEAN) CHECK(isnan(loss[0]), "%s: MEAN loss = %g, expected NaN", name, loss[0]);
                if (red == FL_REDUCTION_SUM) CHECK(loss[0] == 0.0f, "%s: SUM loss = %g, expected 0", name, loss[0]);
                if (red == FL_REDUCTION_NONE)
                    CHECK(tu_f32_bits(loss[0]) == 0x7F7F7F7Fu, "%s: NONE wrote loss[0] = %g with N = 0", name, loss[0]);
                CHECK(tu_f32_bits(loss[1]) == 0x7F7F7F7Fu, "%s: loss[1] written", name);
            }
            free(ws);
            free_prob(&p);

            /* ---- every row ignored: logits never read (all NaN), MEAN NaN, gradient all zeros ---- */
            for (int weights = 0; weights < 2; weights++) {
                cfg_t c2 = CFGS[weights ? 23 : 0];
                c2.red = (fl_reduction)red;
                prob_t q = make_prob(rng, &c2, 4, 5, 6, (fl_dtype)dt, FL_INDEX_I32, 0xF, 1, 1.0f, LOGITS_NORMAL);
                tu_poison(q.x, xbytes(&q)); /* nothing may be read */
                ws = alloc_ws(&q, &wsb);
                float ql[4], qs[4];
                void* qd = tu_xmalloc(xbytes(&q));
                const int64_t nl = n_loss(&q);
                for (int pass = 0; pass < 3; pass++) {
                    poison_finite(ql, sizeof ql);
                    poison_finite(qs, sizeof qs);
                    tu_poison(qd, xbytes(&q));
                    float lse_in[4] = {0, 0, 0, 0};
                    fl_status st;
                    if (pass == P_FWD)
                        st = fl_cross_entropy_forward_cpu(ql, qs, q.x, q.t, 4, 5, 6, q.dt, q.it, &q.o, ws, wsb);
                    else if (pass == P_BWD)
                        st = fl_cross_entropy_backward_cpu(qd, q.x, q.t, lse_in, q.gl, 1.0f, 4, 5, 6, q.dt, q.it, &q.o, ws, wsb);
                    else
                        st = fl_cross_entropy_fused_cpu(ql, qs, qd, q.x, q.t, q.gl, 1.0f, 4, 5, 6, q.dt, q.it, &q.o, ws, wsb);
                    snprintf(name, sizeof name, "all rows ignored %s %s %s%s", FN[pass], rn, tu_dtype_name(q.dt),
                             weights ? " (all options)" : "");
                    if (!CHECK_STATUS(st, FL_OK, name)) continue;
                    if (pass != P_FWD) {
                        double zeros[20] = {0};
                        ref_check_dlogits(name, qd, q.dt, 4, 5, 6, zeros, NULL, 0.0, 0.0);
                    }
                    if (pass == P_BWD) continue;
                    int lse_zero = 1;
                    for (int k = 0; k < 4; k++) lse_zero &= qs[k] == 0.0f;
                    CHECK(lse_zero, "%s: lse not all 0 (%g %g %g %g)", name, qs[0], qs[1], qs[2], qs[3]);
                    if (red == FL_REDUCTION_MEAN) CHECK(isnan(ql[0]), "%s: MEAN loss = %g, expected NaN", name, ql[0]);
                    if (red == FL_REDUCTION_SUM) CHECK(ql[0] == 0.0f, "%s: SUM loss = %g, expected 0", name, ql[0]);
                    if (red == FL_REDUCTION_NONE) {
                        int z = 1;
                        for (int64_t k = 0; k < nl; k++) z &= ql[k] == 0.0f;
                        CHECK(z, "%s: NONE losses not all 0", name);
                    }
                }
                free(qd); free(ws);
                free_prob(&q);
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * Required accuracy at GPT-2 size: N = 64, V = 50257.
 * ---------------------------------------------------------------------------------------- */
static void test_required_accuracy(tu_rng* rng) {
    char label[256];
    for (int dt = 0; dt < 3; dt++) {
        for (int red = 0; red < 2; red++) { /* NONE (per-row losses), MEAN */
            cfg_t cf = CFGS[0];
            cf.red = (fl_reduction)red;
            if (dt != 0 && red == 0) continue;
            prob_t p = make_prob(rng, &cf, 64, 50257, 50257, (fl_dtype)dt, FL_INDEX_I64, 0, 0, 1.0f, LOGITS_NORMAL);
            snprintf(label, sizeof label, "[required accuracy] N=64 V=50257 %s %s", tu_dtype_name(p.dt),
                     red ? "mean" : "none");
            errs_t e = {1, 1, 1, 1};
            run_case(&p, label, &e, 1); /* light: the repeat runs are covered at small sizes */
            printf("%s: loss rel err %.3g, lse rel err %.3g, fused grad abs err %.3g, backward grad abs err %.3g\n",
                   label, e.loss_rel, e.lse_rel, e.fused_grad_abs, e.bwd_grad_abs);
            CHECK(e.loss_rel <= REQ_LOSS_REL, "%s: loss relative error %.3g > %g", label, e.loss_rel, REQ_LOSS_REL);
            if (dt == FL_DTYPE_F32) {
                CHECK(e.fused_grad_abs <= REQ_GRAD_ABS, "%s: fused dlogits max abs error %.3g > %g", label,
                      e.fused_grad_abs, REQ_GRAD_ABS);
                CHECK(e.bwd_grad_abs <= REQ_GRAD_ABS, "%s: backward dlogits max abs error %.3g > %g", label,
                      e.bwd_grad_abs, REQ_GRAD_ABS);
            }
            free_prob(&p);
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * Bad input: exact status, fl_last_error() names the function, outputs untouched.
 * ---------------------------------------------------------------------------------------- */
enum { EN = 10, EV = 6, ELD = 8 };

typedef struct {
    float* loss; float* lse; void* dl;
    const void* x; const void* t; const float* lse_in; const float* gl; float gs;
    int64_t N, V, ld; fl_dtype dt; fl_index_dtype it; const fl_ce_options* o; void* ws; size_t wsb;
} args_t;

static fl_status call_pass(int pass, const args_t* a) {
    if (pass == P_FWD)
        return fl_cross_entropy_forward_cpu(a->loss, a->lse, a->x, a->t, a->N, a->V, a->ld, a->dt, a->it, a->o, a->ws, a->wsb);
    if (pass == P_BWD)
        return fl_cross_entropy_backward_cpu(a->dl, a->x, a->t, a->lse_in, a->gl, a->gs, a->N, a->V, a->ld, a->dt,
                                             a->it, a->o, a->ws, a->wsb);
    return fl_cross_entropy_fused_cpu(a->loss, a->lse, a->dl, a->x, a->t, a->gl, a->gs, a->N, a->V, a->ld, a->dt,
                                      a->it, a->o, a->ws, a->wsb);
}

/* Storage behind the valid arguments; outputs are poisoned before each call. */
static float   e_x[EN * ELD], e_loss[EN], e_lse[EN], e_lse_in[EN], e_gl[EN], e_dl[EN * ELD], e_w[EV], e_off[EV];
static int64_t e_t64[EN];
static int32_t e_t32[EN];
static void*   e_ws;
static size_t  e_wsb;

static args_t valid_args(int pass, const fl_ce_options* o) {
    args_t a;
    memset(&a, 0, sizeof a);
    a.loss = pass == P_BWD ? NULL : e_loss;
    a.lse = pass == P_BWD ? NULL : e_lse;
    a.dl = pass == P_FWD ? NULL : e_dl;
    a.x = e_x; a.t = e_t64; a.lse_in = e_lse_in; a.gl = e_gl; a.gs = 1.0f;
    a.N = EN; a.V = EV; a.ld = ELD; a.dt = FL_DTYPE_F32; a.it = FL_INDEX_I64; a.o = o;
    a.ws = e_ws; a.wsb = e_wsb;
    return a;
}

static void poison_outputs(void) {
    tu_poison(e_loss, sizeof e_loss);
    tu_poison(e_lse, sizeof e_lse);
    tu_poison(e_dl, sizeof e_dl);
}
static int outputs_untouched(void) {
    int ok = 1;
    for (size_t k = 0; k < sizeof e_loss / 4; k++) ok &= tu_is_poison(e_loss, 4, (int64_t)k);
    for (size_t k = 0; k < sizeof e_lse / 4; k++) ok &= tu_is_poison(e_lse, 4, (int64_t)k);
    for (size_t k = 0; k < sizeof e_dl / 4; k++) ok &= tu_is_poison(e_dl, 4, (int64_t)k);
    return ok;
}

/* Call, expect `want`, the function's name in the message, and (check_outputs) nothing written. */
static void expect(int pass, const args_t* a, fl_status want, const char* what, int check_outputs,
                   const char* must_contain) {
    char name[256];
    snprintf(name, sizeof name, "%s: %s", FN[pass], what);
    if (check_outputs) poison_outputs();
    fl_status st = call_pass(pass, a);
    CHECK_STATUS(st, want, name);
    if (want == FL_OK) {
        CHECK(fl_last_error()[0] == '\0', "%s: fl_last_error() after success = \"%s\"", name, fl_last_error());
        return;
    }
    CHECK(strstr(fl_last_error(), FN[pass]) != NULL, "%s: message \"%s\" does not name %s", name, fl_last_error(),
          FN[pass]);
    if (must_contain)
        CHECK(strstr(fl_last_error(), must_contain) != NULL, "%s: message \"%s\" does not contain \"%s\"", name,
              fl_last_error(), must_contain);
    if (check_outputs) CHECK(outputs_untouched(), "%s: an output was written on failure", name);
}

static void test_errors(tu_rng* rng) {
    for (int k = 0; k < EN * ELD; k++) e_x[k] = (float)tu_normal(rng);
    for (int i = 0; i < EN; i++) {
        e_t64[i] = tu_int_in(rng, 0, EV - 1);
        e_t32[i] = (int32_t)e_t64[i];
        e_gl[i] = 1.0f;
        e_lse_in[i] = 3.0f;
    }
    for (int j = 0; j < EV; j++) e_w[j] = 1.0f, e_off[j] = 0.5f;
    fl_ce_options base = FL_CE_OPTIONS_INIT;
    base.reduction = FL_REDUCTION_NONE; /* loss has N entries */
    fl_status st = fl_cross_entropy_workspace_size(&e_wsb, EN, EV, FL_DTYPE_F32, &base);
    CHECK_STATUS(st, FL_OK, "workspace_size");
    e_ws = e_wsb ? tu_xmalloc(e_wsb) : NULL;
    printf("CPU workspace for N=%d V=%d: %zu bytes\n", EN, EV, e_wsb);

    for (int pass = 0; pass < 3; pass++) {
        args_t a;
        fl_ce_options o;
        /* sanity: the valid arguments succeed */
        a = valid_args(pass, &base);
        expect(pass, &a, FL_OK, "valid arguments", 0, NULL);

#define BAD(field_stmt, want, what)                 \
        do {                                        \
            a = valid_args(pass, &base);            \
            o = base;                               \
            a.o = &o;                               \
            field_stmt;                             \
            expect(pass, &a, want, what, 1, NULL);  \
        } while (0)

        if (pass != P_BWD) BAD(a.loss = NULL, FL_ERR_INVALID_ARGUMENT, "loss NULL");
        if (pass != P_FWD) BAD(a.dl = NULL, FL_ERR_INVALID_ARGUMENT, "dlogits NULL");
        if (pass == P_BWD) BAD(a.lse_in = NULL, FL_ERR_INVALID_ARGUMENT, "lse NULL");
        BAD(a.x = NULL, FL_ERR_INVALID_ARGUMENT, "logits NULL");
        BAD(a.t = NULL, FL_ERR_INVALID_ARGUMENT, "targets NULL");
        BAD(a.N = -1, FL_ERR_INVALID_ARGUMENT, "N = -1");
        BAD(a.N = INT64_MIN, FL_ERR_INVALID_ARGUMENT, "N = INT64_MIN");
        BAD(a.V = 0, FL_ERR_INVALID_ARGUMENT, "V = 0");
        BAD(a.V = -3, FL_ERR_INVALID_ARGUMENT, "V = -3");
        BAD(a.ld = EV - 1, FL_ERR_INVALID_ARGUMENT, "ld < V");
        BAD(a.dt = (fl_dtype)7, FL_ERR_INVALID_ARGUMENT, "dtype 7");
        BAD(a.dt = (fl_dtype)-1, FL_ERR_INVALID_ARGUMENT, "dtype -1");
        BAD(a.it = (fl_index_dtype)7, FL_ERR_INVALID_ARGUMENT, "index dtype 7");
        BAD(a.it = (fl_index_dtype)-1, FL_ERR_INVALID_ARGUMENT, "index dtype -1");
        BAD(o.struct_size = 0, FL_ERR_INVALID_ARGUMENT, "struct_size 0");
        BAD(o.struct_size = sizeof(fl_ce_options) - 1, FL_ERR_INVALID_ARGUMENT, "struct_size sizeof-1");
        BAD(o.struct_size = sizeof(fl_ce_options) + 8, FL_ERR_INVALID_ARGUMENT, "struct_size sizeof+8");
        BAD(o.label_smoothing = -0.1f, FL_ERR_INVALID_ARGUMENT, "label_smoothing -0.1");
        BAD(o.label_smoothing = 1.5f, FL_ERR_INVALID_ARGUMENT, "label_smoothing 1.5");
        BAD(o.label_smoothing = NAN, FL_ERR_INVALID_ARGUMENT, "label_smoothing NaN");
        BAD((e_w[2] = -1.0f, o.weight = e_w), FL_ERR_INVALID_ARGUMENT, "weight[2] = -1");
        BAD((e_w[2] = NAN, o.weight = e_w), FL_ERR_INVALID_ARGUMENT, "weight[2] = NaN");
        BAD((e_w[2] = INFINITY, o.weight = e_w), FL_ERR_INVALID_ARGUMENT, "weight[2] = inf");
        BAD((e_w[2] = 1.0f, e_w[EV - 1] = -0.5f, o.weight = e_w), FL_ERR_INVALID_ARGUMENT, "weight[V-1] = -0.5");
        e_w[EV - 1] = 1.0f;
        BAD(o.z_loss = -1e-4f, FL_ERR_INVALID_ARGUMENT, "z_loss -1e-4");
        BAD(o.z_loss = NAN, FL_ERR_INVALID_ARGUMENT, "z_loss NaN");
        BAD(o.softcap = -1.0f, FL_ERR_INVALID_ARGUMENT, "softcap -1");
        BAD(o.softcap = NAN, FL_ERR_INVALID_ARGUMENT, "softcap NaN");
        BAD(o.logit_scale = 0.0f, FL_ERR_INVALID_ARGUMENT, "logit_scale 0");
        BAD(o.logit_scale = -0.0f, FL_ERR_INVALID_ARGUMENT, "logit_scale -0");
        BAD(o.logit_scale = NAN, FL_ERR_INVALID_ARGUMENT, "logit_scale NaN");
        BAD(o.logit_scale = INFINITY, FL_ERR_INVALID_ARGUMENT, "logit_scale inf");
        BAD(o.logit_scale = -INFINITY, FL_ERR_INVALID_ARGUMENT, "logit_scale -inf");
        BAD(o.reduction = (fl_reduction)3, FL_ERR_INVALID_ARGUMENT, "reduction 3");
        BAD(o.reduction = (fl_reduction)-1, FL_ERR_INVALID_ARGUMENT, "reduction -1");
        /* version-2 fields: offsets finite; target_prob overlaps nothing (ignored by backward) */
        BAD((e_off[3] = NAN, o.logit_offset = e_off), FL_ERR_INVALID_ARGUMENT, "logit_offset[3] = NaN");
        BAD((e_off[3] = -INFINITY, o.logit_offset = e_off), FL_ERR_INVALID_ARGUMENT, "logit_offset[3] = -inf");
        /* a version-1 struct: the fields after error_flag are not read (the NaN offset would fail) */
        BAD((o.struct_size = FL_CE_OPTIONS_V1_SIZE, o.logit_offset = e_off), FL_OK, "version-1 struct_size");
        e_off[3] = 0.25f;
        BAD(o.logit_offset = e_off, FL_OK, "finite logit_offset");
        if (pass != P_BWD) {
            BAD(o.target_prob = a.loss, FL_ERR_INVALID_ARGUMENT, "target_prob == loss");
            BAD(o.target_prob = (float*)a.x, FL_ERR_INVALID_ARGUMENT, "target_prob over the logits");
            BAD(o.target_prob = (float*)a.t, FL_ERR_INVALID_ARGUMENT, "target_prob over the targets");
            BAD((o.logit_offset = e_off, o.target_prob = e_off), FL_ERR_INVALID_ARGUMENT, "target_prob == logit_offset");
        } else {
            BAD(o.target_prob = (float*)a.x, FL_OK, "backward ignores target_prob");
        }
        if (e_wsb > 0) {
            BAD(a.wsb = e_wsb - 1, FL_ERR_INSUFFICIENT_WORKSPACE, "workspace_bytes = size - 1");
            BAD((a.ws = NULL, a.wsb = 0), FL_ERR_INSUFFICIENT_WORKSPACE, "workspace NULL, 0 bytes");
        } else {
            BAD((a.ws = NULL, a.wsb = 0), FL_OK, "no workspace needed: NULL, 0");
        }
#undef BAD

        /* ---- aliasing (outputs not poisoned here: they overlap inputs) ---- */
        static float big[4 * EN * ELD];
        static int64_t tbig[EN * ELD];
        if (pass != P_BWD) {
            a = valid_args(pass, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.loss = big + 3;
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "loss inside logits", 0, NULL);
            a = valid_args(pass, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.lse = big + ELD * 2 + 1;
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "lse inside logits", 0, NULL);
            a = valid_args(pass, &base);
            a.lse = a.loss + 1;
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "lse overlapping loss (offset 1)", 0, NULL);
            a = valid_args(pass, &base);
            a.lse = a.loss;
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "lse == loss", 0, NULL);
            a = valid_args(pass, &base);
            memcpy(tbig, e_t64, sizeof e_t64);
            a.t = tbig; a.loss = (float*)(tbig + 2);
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "loss inside targets", 0, NULL);
            a = valid_args(pass, &base);
            memcpy(tbig, e_t64, sizeof e_t64);
            a.t = tbig; a.lse = (float*)(tbig + 5);
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "lse inside targets", 0, NULL);
        }
        if (pass != P_FWD) {
            a = valid_args(pass, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.dl = big + 1;
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "dlogits = logits + 1 element", 0, NULL);
            a = valid_args(pass, &base);
            memcpy(big + 1, e_x, sizeof e_x);
            a.x = big + 1; a.dl = big;
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "dlogits = logits - 1 element", 0, NULL);
            a = valid_args(pass, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.dl = big + ELD * (EN - 1); /* starts in the last row */
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping logits' last row", 0, NULL);
            a = valid_args(pass, &base);
            memcpy(tbig, e_t64, sizeof e_t64);
            a.t = tbig; a.dl = (float*)(tbig + 1);
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping targets", 0, NULL);
            a = valid_args(pass, &base);
            a.gl = e_dl + 5;
            expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping grad_loss", 0, NULL);
            if (pass == P_BWD) {
                a = valid_args(pass, &base);
                memcpy(big + 2 * ELD, e_lse_in, sizeof e_lse_in);
                a.dl = big; a.lse_in = big + 2 * ELD;
                expect(pass, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping lse", 0, NULL);
            }
            /* in place is allowed */
            a = valid_args(pass, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.dl = big;
            expect(pass, &a, FL_OK, "dlogits == logits (in place)", 0, NULL);
        }

        /* ---- targets out of range: exact status, first bad row named, nothing written ---- */
        static const struct { int64_t ignore, bad5, bad8; int i32; const char* what; } oor[] = {
            {-100, EV, -1, 0, "target V at row 5 (and -1 at row 8), i64"},
            {-100, EV, EV + 3, 1, "target V at row 5, i32"},
            {-100, -1, EV, 1, "target -1 at row 5, i32"},
            {2, -100, 2, 0, "target -100 with ignore_index 2, i64"},
            {-100, (int64_t)1 << 40, 0, 0, "target 2^40 at row 5, i64"},
            {-100, INT32_MIN, 0, 1, "target INT32_MIN at row 5, i32"},
            {-100, INT64_MIN, 0, 0, "target INT64_MIN at row 5, i64"},
        };
        for (size_t k = 0; k < sizeof oor / sizeof oor[0]; k++) {
            for (int red = 0; red < 3; red++) {
                int64_t t64[EN];
                int32_t t32[EN];
                memcpy(t64, e_t64, sizeof t64);
                for (int i = 0; i < EN; i++) if (t64[i] == oor[k].ignore) t64[i] = (oor[k].ignore + 1) % EV;
                t64[5] = oor[k].bad5;
                t64[8] = oor[k].bad8;
                for (int i = 0; i < EN; i++) t32[i] = (int32_t)t64[i];
                o = base;
                o.reduction = (fl_reduction)red;
                o.ignore_index = oor[k].ignore;
                a = valid_args(pass, &o);
                if (oor[k].i32) { a.t = t32; a.it = FL_INDEX_I32; } else a.t = t64;
                char what[200];
                snprintf(what, sizeof what, "%s (reduction %d)", oor[k].what, red);
                expect(pass, &a, FL_ERR_TARGET_OUT_OF_RANGE, what, 1, "row 5");
                CHECK(strstr(fl_last_error(), "row 8") == NULL, "%s: message names row 8, not the first bad row: \"%s\"",
                      what, fl_last_error());
            }
        }
    }

    /* ---- workspace_size ---- */
    size_t b = 12345;
    st = fl_cross_entropy_workspace_size(NULL, EN, EV, FL_DTYPE_F32, NULL);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "workspace_size(bytes NULL)");
    CHECK(strstr(fl_last_error(), "fl_cross_entropy_workspace_size") != NULL, "message \"%s\"", fl_last_error());
    st = fl_cross_entropy_workspace_size(&b, -1, EV, FL_DTYPE_F32, NULL);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "workspace_size(N = -1)");
    st = fl_cross_entropy_workspace_size(&b, EN, 0, FL_DTYPE_F32, NULL);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "workspace_size(V = 0)");
    st = fl_cross_entropy_workspace_size(&b, EN, EV, (fl_dtype)7, NULL);
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "workspace_size(dtype 7)");
    {
        size_t b0 = 0, b1 = 0;
        CHECK(fl_cross_entropy_workspace_size(&b0, 0, 1, FL_DTYPE_BF16, NULL) == FL_OK, "workspace_size(N = 0)");
        CHECK(fl_cross_entropy_workspace_size(&b1, (int64_t)1 << 20, 128256, FL_DTYPE_BF16, NULL) == FL_OK,
              "workspace_size(N = 2^20, V = 128256)");
        printf("CPU workspace: N=0: %zu bytes, N=2^20 V=128256: %zu bytes\n", b0, b1);
    }
    free(e_ws);
}

static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A -inf logit (a masked class) without smoothing: PyTorch's loss is finite; the smoothing term
 * must not turn it into NaN through 0 * inf. With smoothing the loss is +inf (as PyTorch's). */
static void test_neg_inf_logit(tu_rng* rng) {
    (void)rng;
    const float x[4] = {1.0f, -INFINITY, 2.0f, 0.5f};
    const int64_t t = 0;
    float loss = NAN, lse = NAN, g[4];
    size_t wsb = 0;
    fl_cross_entropy_workspace_size(&wsb, 1, 4, FL_DTYPE_F32, NULL);
    void* ws = tu_xmalloc(wsb);
    const double ref_lse = log(exp(1.0) + exp(2.0) + exp(0.5));
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    CHECK_STATUS(fl_cross_entropy_fused_cpu(&loss, &lse, g, x, &t, NULL, 1.0f, 1, 4, 4, FL_DTYPE_F32, FL_INDEX_I64,
                                            &o, ws, wsb),
                 FL_OK, "-inf logit fused");
    CHECK(fabs(loss - (ref_lse - 1.0)) < 1e-6 && fabs(lse - ref_lse) < 1e-6, "-inf logit: loss %g lse %g, want %g %g",
          loss, lse, ref_lse - 1.0, ref_lse);
    CHECK(g[1] == 0.0f && isfinite(g[0]) && isfinite(g[2]) && isfinite(g[3]), "-inf logit: gradient %g %g %g %g",
          g[0], g[1], g[2], g[3]);
    o.label_smoothing = 0.1f;
    CHECK_STATUS(fl_cross_entropy_forward_cpu(&loss, NULL, x, &t, 1, 4, 4, FL_DTYPE_F32, FL_INDEX_I64, &o, ws, wsb),
                 FL_OK, "-inf logit smoothing");
    CHECK(isinf(loss) && loss > 0, "-inf logit with smoothing: loss %g, want +inf", loss);
    free(ws);
}

int main(int argc, char** argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261130ull;
    printf("seed %llu\n", (unsigned long long)seed);
    tu_rng rng = tu_rng_seed(seed);
    static void (*const sections[])(tu_rng*) = {test_errors, test_null_opts, test_empty_and_all_ignored,
                                                 test_options, test_big_logits, test_threads,
                                                 test_required_accuracy, test_neg_inf_logit};
    static const char* const names[] = {"errors", "opts NULL", "N=0 / all ignored", "options x dtypes x shapes",
                                        "logits +-1e4", "threads", "required accuracy", "-inf logit"};
    for (size_t k = 0; k < sizeof sections / sizeof sections[0]; k++) {
        double t0 = now_s();
        long f0 = tu_failed, p0 = tu_passed;
        sections[k](&rng);
        printf("== section %-28s %6ld checks, %s  (%.2f s)\n", names[k], (tu_passed - p0) + (tu_failed - f0),
               tu_failed == f0 ? "ok" : "FAILED", now_s() - t0);
    }
    return tu_finish();
}
