/* fuzz_cross_entropy.c — bounded, seeded fuzz of the CPU cross-entropy entry points against
 * the long-double reference in tests/ref_cross_entropy.h.
 *
 * Each case draws N (0..40), V (1..300, sometimes up to 5000), ld (V..V+7), the logits dtype,
 * the index dtype, every option (ignore_index sometimes inside [0, V), ignored rows, class
 * weights, label smoothing, z-loss, softcap, logit scale, reduction), the logits' spread, the
 * upstream gradient, and one pass (forward / backward after a forward / fused, in place or
 * not, lse NULL or not). Outputs are poisoned first; padding columns and ignored rows of the
 * logits hold NaN, which must never be read. About 3% of cases put an out-of-range target in
 * one or two rows: the call must return FL_ERR_TARGET_OUT_OF_RANGE naming the first of them
 * and write nothing.
 *
 * Build and run (the Makefile does this in `make test`):
 *   cc -std=c11 -O2 -Iinclude tests/fuzz_cross_entropy.c build/libfusedloss.a -lm -lpthread \
 *      -fopenmp -o build/fuzz_cross_entropy && ./build/fuzz_cross_entropy [cases] [seed]
 * Default: 10000 cases, seed 1. A failing case prints its index and parameters; rerun with the
 * same seed (cases are drawn from seed and index alone, so `cases` does not change them).
 * Ends with "N passed, M failed"; exit code 0 only when nothing failed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusedloss.h"
#include "test_util.h"
#include "ref_cross_entropy.h"

/* Tolerances per logits dtype, |got - ref| <= atol + rtol*|ref| (see test_cross_entropy.c for
 * the reasoning): loss and lse are fp32 rounded from double; dlogits are rounded once to the
 * logits' dtype; backward additionally gets the slack its fp32 input lse explains. */
typedef struct { double loss_atol, loss_rtol, grad_atol, grad_rtol; } tol_t;
static const tol_t TOL[3] = {
    /* FL_DTYPE_F32  */ {1e-8, 1e-6, 1e-7, 1e-5},
    /* FL_DTYPE_F16  */ {1e-8, 1e-6, 6e-8, 1e-3},
    /* FL_DTYPE_BF16 */ {1e-8, 1e-6, 1e-9, 8e-3},
};

enum { P_FWD = 0, P_BWD = 1, P_FUSED = 2 };
static const char* const PASS_NAME[3] = {"forward", "backward", "fused"};

typedef struct {
    int64_t        N, V, ld;
    fl_dtype       dt;
    fl_index_dtype it;
    fl_ce_options  o;
    int            pass, in_place, lse_null, gmode;
    float          gs;
    double         sigma;
    int            big;
    int64_t        bad_row;   /* first row with an out-of-range target, or -1 */
} fcase;

static void describe(const fcase* c, char* buf, size_t n) {
    snprintf(buf, n,
             "N=%lld V=%lld ld=%lld %s %s %s%s%s red=%d ignore=%lld eps=%g w=%s zeta=%g cap=%g scale=%g "
             "grad_loss=%s gs=%g sigma=%g%s%s%s%s",
             (long long)c->N, (long long)c->V, (long long)c->ld, tu_dtype_name(c->dt),
             c->it == FL_INDEX_I32 ? "i32" : "i64", PASS_NAME[c->pass], c->in_place ? " in-place" : "",
             c->lse_null ? " lse=NULL" : "", (int)c->o.reduction, (long long)c->o.ignore_index,
             c->o.label_smoothing, c->o.weight ? "yes" : "no", c->o.z_loss, c->o.softcap, c->o.logit_scale,
             c->gmode ? "ptr" : "NULL", c->gs, c->sigma, c->big ? " +-1e4" : "",
             c->bad_row >= 0 ? " bad-target" : "", c->o.logit_offset ? " offset" : "",
             c->o.target_prob ? " target_prob" : "");
}

static void set_target(void* t, fl_index_dtype it, int64_t i, int64_t v) {
    if (it == FL_INDEX_I32) ((int32_t*)t)[i] = (int32_t)v;
    else ((int64_t*)t)[i] = v;
}

/* One case: draw, run, compare. */
static void run_one(uint64_t seed, long k) {
    uint64_t mix = seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(k + 1));
    tu_rng r = tu_rng_seed(mix);
    tu_rng* rng = &r;
    fcase c;
    memset(&c, 0, sizeof c);

    /* ---- shape and dtypes ---- */
    c.N = tu_int_in(rng, 0, 40);
    double u = tu_uniform(rng);
    c.V = u < 0.03 ? tu_int_in(rng, 301, 5000) : u < 0.25 ? tu_int_in(rng, 1, 8) : tu_int_in(rng, 1, 300);
    c.ld = c.V + tu_int_in(rng, 0, 7);
    c.dt = (fl_dtype)tu_int_in(rng, 0, 2);
    c.it = (fl_index_dtype)tu_int_in(rng, 0, 1);

    /* ---- options ---- */
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    u = tu_uniform(rng);
    o.ignore_index = u < 0.5 ? -100 : u < 0.75 ? tu_int_in(rng, 0, c.V - 1) : u < 0.85 ? -1
                   : u < 0.95 ? c.V + tu_int_in(rng, 0, 1000) : ((int64_t)1 << 40);
    o.reduction = (fl_reduction)tu_int_in(rng, 0, 2);
    if (tu_uniform(rng) < 0.3) o.label_smoothing = tu_uniform(rng) < 0.15 ? 1.0f : (float)tu_uniform(rng);
    if (tu_uniform(rng) < 0.25) o.z_loss = (float)tu_uniform_in(rng, 0.0, 0.1);
    if (tu_uniform(rng) < 0.25) o.softcap = (float)tu_uniform_in(rng, 0.5, 30.0);
    if (tu_uniform(rng) < 0.25) {
        o.logit_scale = (float)tu_uniform_in(rng, 0.1, 3.0);
        if (tu_uniform(rng) < 0.3) o.logit_scale = -o.logit_scale;
    }
    float* w = NULL;
    if (tu_uniform(rng) < 0.3) {
        w = (float*)tu_xmalloc((size_t)c.V * sizeof(float));
        for (int64_t j = 0; j < c.V; j++) w[j] = tu_uniform(rng) < 0.1 ? 0.0f : (float)tu_uniform_in(rng, 0.05, 2.0);
        o.weight = w;
    }
    float* off = NULL;   /* per-class logit offsets (version-2 options), 25% of the cases */
    if (tu_uniform(rng) < 0.25) {
        off = (float*)tu_xmalloc((size_t)c.V * sizeof(float));
        for (int64_t j = 0; j < c.V; j++) off[j] = (float)tu_uniform_in(rng, -3.0, 3.0);
        o.logit_offset = off;
    }
    float* tp = NULL;    /* the target_prob output, half of the forward / fused cases */
    if (tu_uniform(rng) < 0.5) {
        tp = (float*)tu_xmalloc((size_t)(c.N > 0 ? c.N : 1) * sizeof(float) + 16);
        tu_poison(tp, (size_t)(c.N > 0 ? c.N : 1) * sizeof(float) + 16);
        o.target_prob = tp;
    }

    /* ---- targets: random classes, some rows ignored ---- */
    const int64_t N = c.N, V = c.V, ld = c.ld;
    const double p_ignore = (u = tu_uniform(rng)) < 0.4 ? 0.0 : u < 0.7 ? 0.2 : u < 0.9 ? 0.5 : 1.0;
    /* an i32 target cannot hold an ignore_index outside int32: then no row is ignored */
    const int can_ignore = c.it == FL_INDEX_I64 || (o.ignore_index >= INT32_MIN && o.ignore_index <= INT32_MAX);
    void* t = tu_xmalloc((size_t)(N > 0 ? N : 1) * 8);
    for (int64_t i = 0; i < N; i++) {
        int64_t v = tu_int_in(rng, 0, V - 1);
        if (can_ignore && tu_uniform(rng) < p_ignore) v = o.ignore_index;
        set_target(t, c.it, i, v);
    }
    if (w && o.reduction == FL_REDUCTION_MEAN) { /* keep D_w > 0 whenever a row counts (no 0/0) */
        double dw = 0;
        int64_t first = -1;
        for (int64_t i = 0; i < N; i++) {
            int64_t ti = ref_target(t, c.it, i);
            if (ti == o.ignore_index) continue;
            dw += w[ti];
            if (first < 0) first = ti;
        }
        if (first >= 0 && dw == 0.0) w[first] = 1.0f;
    }
    c.o = o;

    /* ---- logits: padding and ignored rows NaN ---- */
    const size_t es = tu_dtype_size(c.dt);
    const size_t xb = (size_t)(N > 0 ? N : 1) * (size_t)ld * es;
    static const double sigmas[4] = {0.01, 1.0, 4.0, 20.0};
    c.sigma = sigmas[tu_int_in(rng, 0, 3)];
    c.big = tu_uniform(rng) < 0.03;
    void* x = tu_xmalloc(xb);
    tu_poison(x, xb);
    for (int64_t i = 0; i < N; i++) {
        if (ref_target(t, c.it, i) == o.ignore_index) continue;
        for (int64_t j = 0; j < V; j++) {
            double v = c.sigma * tu_normal(rng);
            if (c.big) v = tu_uniform(rng) < 0.5 ? (tu_uniform(rng) < 0.5 ? 1e4 : -1e4) : tu_uniform_in(rng, -1e4, 1e4);
            tu_store(x, c.dt, i * ld + j, (float)v);
        }
    }

    /* ---- sometimes corrupt one or two targets: the call must fail naming the first bad row ---- */
    int64_t bad_row = -1;
    c.bad_row = -1;
    if (N > 0 && tu_uniform(rng) < 0.03) {
        for (int n_bad = (int)tu_int_in(rng, 1, 2); n_bad > 0; n_bad--) {
            const int64_t cand[7] = {V, V + tu_int_in(rng, 1, 1000000), -1, -100, INT32_MIN, INT32_MAX,
                                     c.it == FL_INDEX_I64 ? INT64_MIN : INT32_MIN + 1};
            int64_t v = cand[tu_int_in(rng, 0, 6)];
            if (v == o.ignore_index) v = (o.ignore_index == V) ? V + 1 : V;
            int64_t row = tu_int_in(rng, 0, N - 1);
            set_target(t, c.it, row, v);
            if (bad_row < 0 || row < bad_row) bad_row = row;
        }
        c.bad_row = bad_row;
    }

    /* ---- pass and upstream gradient ---- */
    c.pass = (int)tu_int_in(rng, 0, 2);
    c.in_place = c.pass != P_FWD && tu_uniform(rng) < 0.5;
    c.lse_null = c.pass != P_BWD && tu_uniform(rng) < 0.3;
    c.gmode = tu_uniform(rng) < 0.6;
    c.gs = tu_uniform(rng) < 0.5 ? 1.0f : (float)tu_uniform_in(rng, -3.0, 3.0);
    const int64_t nl = o.reduction == FL_REDUCTION_NONE ? N : 1, nr = N > 0 ? N : 1;
    float* gl = NULL;
    if (c.gmode) {
        gl = (float*)tu_xmalloc((size_t)(nl > 0 ? nl : 1) * sizeof(float));
        for (int64_t i = 0; i < nl; i++) gl[i] = (float)tu_uniform_in(rng, -2.0, 2.0);
    }

    char desc[512], ctx[600];
    describe(&c, desc, sizeof desc);
    snprintf(ctx, sizeof ctx, "[case %ld: %s]", k, desc);
    tu_context = ctx;
    const tol_t tol = TOL[c.dt];

    /* ---- run ---- */
    size_t wsb = 0;
    fl_status st = fl_cross_entropy_workspace_size(&wsb, N, V, c.dt, &o);
    CHECK_STATUS(st, FL_OK, "workspace_size");
    void* ws = wsb ? tu_xmalloc(wsb) : NULL;
    tu_poison(ws, wsb);

    float* loss = (float*)tu_xmalloc((size_t)nr * 4);
    float* lse = (float*)tu_xmalloc((size_t)nr * 4);
    void* dl = tu_xmalloc(xb);
    tu_poison(loss, (size_t)nr * 4);
    tu_poison(lse, (size_t)nr * 4);
    tu_poison(dl, xb);
    void* xin = x; /* the logits the library reads; in place it is dl, a copy of x */
    if (c.in_place) { memcpy(dl, x, xb); xin = dl; }

    if (bad_row >= 0) {
        /* out-of-range target: exact status, first bad row named, nothing written */
        float* lz = (float*)tu_xmalloc((size_t)nr * 4);
        memset(lz, 0, (size_t)nr * 4);
        static const char* const fn[3] = {"fl_cross_entropy_forward_cpu", "fl_cross_entropy_backward_cpu",
                                          "fl_cross_entropy_fused_cpu"};
        if (c.pass == P_FWD)
            st = fl_cross_entropy_forward_cpu(loss, c.lse_null ? NULL : lse, x, t, N, V, ld, c.dt, c.it, &o, ws, wsb);
        else if (c.pass == P_BWD)
            st = fl_cross_entropy_backward_cpu(dl, xin, t, lz, gl, c.gs, N, V, ld, c.dt, c.it, &o, ws, wsb);
        else
            st = fl_cross_entropy_fused_cpu(loss, c.lse_null ? NULL : lse, dl, xin, t, gl, c.gs, N, V, ld, c.dt, c.it,
                                            &o, ws, wsb);
        CHECK_STATUS(st, FL_ERR_TARGET_OUT_OF_RANGE, "bad target");
        const char* msg = fl_last_error();
        char want[64];
        snprintf(want, sizeof want, "row %lld", (long long)bad_row);
        const char* hit = strstr(msg, want);
        CHECK(hit && !(hit[strlen(want)] >= '0' && hit[strlen(want)] <= '9'),
              "message \"%s\" does not name the first bad row (%s)", msg, want);
        CHECK(strstr(msg, fn[c.pass]) != NULL, "message \"%s\" does not name %s", msg, fn[c.pass]);
        int untouched = 1;
        for (int64_t i = 0; i < nr; i++) untouched &= tu_is_poison(loss, 4, i) && tu_is_poison(lse, 4, i);
        if (c.in_place) untouched &= memcmp(dl, x, xb) == 0;
        else for (int64_t q = 0; q < (int64_t)(xb / es); q++) untouched &= tu_is_poison(dl, es, q);
        if (tp) untouched &= tu_is_poison(tp, 4, 0);
        CHECK(untouched, "an output was written although a target is out of range");
        free(lz);
        goto cleanup;
    }

    int ran_fwd = 0;
    if (c.pass == P_FWD || c.pass == P_BWD) {
        /* backward needs the lse of a forward: run forward with lse first */
        float* lse_arg = (c.pass == P_FWD && c.lse_null) ? NULL : lse;
        st = fl_cross_entropy_forward_cpu(loss, lse_arg, x, t, N, V, ld, c.dt, c.it, &o, ws, wsb);
        ran_fwd = CHECK_STATUS(st, FL_OK, "forward");
    }
    if (c.pass == P_BWD && ran_fwd) {
        st = fl_cross_entropy_backward_cpu(dl, xin, t, lse, gl, c.gs, N, V, ld, c.dt, c.it, &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "backward");
    }
    if (c.pass == P_FUSED) {
        st = fl_cross_entropy_fused_cpu(loss, c.lse_null ? NULL : lse, dl, xin, t, gl, c.gs, N, V, ld, c.dt, c.it,
                                        &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "fused");
    }

    /* ---- compare with the reference ---- */
    if (st == FL_OK) {
        const size_t gbytes = (size_t)(N * V > 0 ? N * V : 1) * sizeof(double);
        long double* rloss = (long double*)tu_xmalloc((size_t)nr * sizeof(long double));
        long double* rlse = (long double*)tu_xmalloc((size_t)nr * sizeof(long double));
        double* rg = c.pass != P_FWD ? (double*)tu_xmalloc(gbytes) : NULL;
        double* rgs = c.pass == P_BWD ? (double*)tu_xmalloc(gbytes) : NULL;
        ref_logits rx = {x, c.dt, ld};
        ref_ce(&rx, t, c.it, N, V, &o, gl, c.gs, c.pass == P_BWD ? lse : NULL, rloss, rlse, rg, rgs);

        ref_check_f32("loss", loss, rloss, nl, tol.loss_atol, tol.loss_rtol);
        CHECK(nl == nr || tu_is_poison(loss, 4, nl), "loss written beyond its %lld entries", (long long)nl);
        if (!c.lse_null || c.pass == P_BWD) ref_check_f32("lse", lse, rlse, N, tol.loss_atol, tol.loss_rtol);
        else {
            int untouched = 1;
            for (int64_t i = 0; i < nr; i++) untouched &= tu_is_poison(lse, 4, i);
            CHECK(untouched, "lse buffer written although lse was NULL");
        }
        if (tp) {   /* the forward / fused call wrote p_t (a backward case ran a forward first); nothing past N */
            long double* rtp = (long double*)tu_xmalloc((size_t)nr * sizeof(long double));
            ref_target_prob(&rx, t, c.it, N, V, &o, rtp);
            ref_check_f32("target_prob", tp, rtp, N, tol.loss_atol, tol.loss_rtol);
            CHECK(tu_is_poison(tp, 4, N > 0 ? N : 1), "target_prob written beyond its %lld entries", (long long)N);
            free(rtp);
        }
        if (c.pass != P_FWD) {
            ref_check_rounding("dlogits", dl, c.dt, N, V, ld, rgs ? rgs : rg);
            double* slack = NULL;
            if (rgs) { /* backward: what the fp32 saved lse explains (see ref_slack) */
                slack = rgs;
                ref_slack(slack, rgs, rg, N * V, tol.grad_rtol);
            }
            /* in place, the padding keeps the logits' NaN poison, which is the same bytes */
            ref_check_dlogits("dlogits", dl, c.dt, N, V, ld, rg, slack, tol.grad_atol, tol.grad_rtol);
        }
        free(rloss); free(rlse); free(rg); free(rgs);
    }
cleanup:
    tu_context = "";
    free(loss); free(lse); free(dl); free(ws); free(x); free(t); free(w); free(off); free(tp); free(gl);
}

int main(int argc, char** argv) {
    long cases = argc > 1 ? strtol(argv[1], NULL, 0) : 10000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    printf("fuzz_cross_entropy: %ld cases, seed %llu\n", cases, (unsigned long long)seed);
    fflush(stdout);
    tu_quiet = 1;
    struct timespec t0, t1;
    timespec_get(&t0, TIME_UTC);
    long failed_cases = 0;
    for (long k = 0; k < cases; k++) {
        long f0 = tu_failed;
        run_one(seed, k);
        if (tu_failed != f0 && ++failed_cases >= 20) {
            printf("stopping after 20 failing cases\n");
            break;
        }
    }
    timespec_get(&t1, TIME_UTC);
    printf("%ld failing case(s); %.2f s\n", failed_cases,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return tu_finish();
}
