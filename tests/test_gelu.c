/* test_gelu.c — the CPU GeLU backend (forward, backward, fused bias and dbias) against an
 * independent float64 reference whose derivative is itself proved by central finite
 * differences; finite differences of the library's own fp32 forward for dx and dbias; every
 * dtype x approx x bias dtype, odd F, separate row strides (ld > F, padding untouched), in
 * place, N = 0 / 1, special values, thread-count independence, and every bad argument with its
 * exact status (also through the CUDA entry points: the validation is shared).
 *
 * Build and run (the Makefile does this in `make test`):
 *   cc -std=c11 -O2 -Iinclude tests/test_gelu.c build/libfusedloss.a -lm -fopenmp -o build/test_gelu
 *   ./build/test_gelu [seed]
 * Ends with "N passed, M failed"; exit code 0 only when nothing failed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fusedloss.h"
#include "test_util.h"

/* ------------------------------------------------------------------------------------------
 * Tolerances: |got - ref| <= atol + rtol*|ref| + slack, ref = float64 on the same (rounded)
 * inputs. rtol/atol: the output's rounding to its dtype (1 ulp, so that an fp32 result next to
 * a rounding boundary may go either way; fp16's atol is one subnormal step). slack: what the
 * fp32 formula itself loses, mostly where PyTorch's formula cancels (1 + tanh -> 0 for u << 0,
 * 1 - t^2 -> 0): a few fp32 ulps of t times the sensitivity to t:
 *   forward  : SLACK_Y  * |u|
 *   backward : SLACK_DX * |dy| * (1 + |u| (1 + 0.15 u^2))
 * dbias: the sum over rows of the per-element tolerances, plus 1 ulp of the bias dtype.
 * ---------------------------------------------------------------------------------------- */
static const double ATOL[3] = {/* F32 */ 1e-37, /* F16 */ 6e-8, /* BF16 */ 1e-37};
static const double RTOL[3] = {/* F32 */ 1e-6, /* F16 */ 9.8e-4, /* BF16 */ 7.9e-3};
#define SLACK_Y 3e-7
#define SLACK_DX 4e-7
/* finite differences */
#define FD_REF_H 1e-5      /* of the float64 reference: central step */
#define FD_REF_TOL 1e-8    /* times (1 + |derivative|) */
#define FD_LIB_H 0.00390625 /* 2^-8: of the library's fp32 forward (exact steps) */
#define FD_LIB_TOL 2e-4    /* times (|dy| (1 + |y|)) */

static const fl_dtype DTYPES[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};

/* ------------------------------------------------------------------------------------------
 * float64 reference (exact constants; written from the definitions, not from the library)
 * ---------------------------------------------------------------------------------------- */
#define R_SQRT_2_OVER_PI 0.79788456080286535588
#define R_SQRT1_2 0.70710678118654752440
#define R_INV_SQRT_2PI 0.39894228040143267794

static double ref_gelu(double u, fl_gelu_approx a) {
    if (a == FL_GELU_TANH) return 0.5 * u * (1.0 + tanh(R_SQRT_2_OVER_PI * (u + 0.044715 * u * u * u)));
    return 0.5 * u * (1.0 + erf(u * R_SQRT1_2));
}

static double ref_dgelu(double u, fl_gelu_approx a) {
    if (a == FL_GELU_TANH) {
        double t = tanh(R_SQRT_2_OVER_PI * (u + 0.044715 * u * u * u));
        return 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * R_SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * u * u);
    }
    return 0.5 * (1.0 + erf(u * R_SQRT1_2)) + u * exp(-0.5 * u * u) * R_INV_SQRT_2PI;
}

static double slack_y(double u) { return SLACK_Y * fabs(u); }
static double slack_dx(double u, double dy) { return SLACK_DX * fabs(dy) * (1.0 + fabs(u) * (1.0 + 0.15 * u * u)); }
static int dti(fl_dtype dt) { return dt == FL_DTYPE_F32 ? 0 : dt == FL_DTYPE_F16 ? 1 : 2; }
static const char* ap_name(fl_gelu_approx a) { return a == FL_GELU_TANH ? "tanh" : "erf"; }

/* ------------------------------------------------------------------------------------------
 * A problem: x [N, ld_x], dy [N, ld_dy] of dt, bias [F] of bdt or none; outputs y [N, ld_y]
 * (also used as dx).
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t N, F, ld_y, ld_x, ld_dy;
    fl_dtype dt, bdt;
    int has_bias;
    fl_gelu_approx ap;
    void *x, *dy, *bias;
} prob_t;

static size_t mbytes(int64_t N, int64_t ld, fl_dtype dt) { return (size_t)(N > 0 ? N : 1) * (size_t)ld * tu_dtype_size(dt); }

static prob_t make_prob(tu_rng* rng, int64_t N, int64_t F, int64_t ld_y, int64_t ld_x, int64_t ld_dy, fl_dtype dt,
                        int bias_kind /* 0 none, 1 dt, 2 fp32 */, fl_gelu_approx ap, double xscale) {
    prob_t p;
    memset(&p, 0, sizeof p);
    p.N = N; p.F = F; p.ld_y = ld_y; p.ld_x = ld_x; p.ld_dy = ld_dy; p.dt = dt; p.ap = ap;
    p.has_bias = bias_kind != 0;
    p.bdt = bias_kind == 2 ? FL_DTYPE_F32 : dt;
    p.x = tu_xmalloc(mbytes(N, ld_x, dt));
    p.dy = tu_xmalloc(mbytes(N, ld_dy, dt));
    tu_poison(p.x, mbytes(N, ld_x, dt));    /* padding columns stay NaN: must not be read */
    tu_poison(p.dy, mbytes(N, ld_dy, dt));
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < F; j++) {
            tu_store(p.x, dt, i * ld_x + j, (float)(xscale * tu_normal(rng)));
            tu_store(p.dy, dt, i * ld_dy + j, (float)tu_normal(rng));
        }
    if (p.has_bias) {
        p.bias = tu_xmalloc((size_t)F * tu_dtype_size(p.bdt));
        for (int64_t j = 0; j < F; j++) tu_store(p.bias, p.bdt, j, (float)(0.5 * tu_normal(rng)));
    }
    return p;
}

static void free_prob(prob_t* p) { free(p->x); free(p->dy); free(p->bias); memset(p, 0, sizeof *p); }

static double u_of(const prob_t* p, int64_t i, int64_t j) {
    return (double)tu_load(p->x, p->dt, i * p->ld_x + j) + (p->has_bias ? (double)tu_load(p->bias, p->bdt, j) : 0.0);
}

static void* alloc_ws(int64_t N, int64_t F, fl_dtype dt, size_t* bytes) {
    fl_status st = fl_gelu_workspace_size(bytes, N, F, dt);
    CHECK_STATUS(st, FL_OK, "fl_gelu_workspace_size");
    if (st != FL_OK) *bytes = 0;
    void* ws = tu_xmalloc(*bytes ? *bytes : 1);
    tu_poison(ws, *bytes);  /* CPU: any content */
    return ws;
}

/* padding columns F..ld-1 of every row still poisoned */
static int padding_untouched(const void* m, int64_t N, int64_t F, int64_t ld, fl_dtype dt) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = F; j < ld; j++)
            if (!tu_is_poison(m, tu_dtype_size(dt), i * ld + j)) return 0;
    return 1;
}

/* Forward, backward (with and without dbias), in-place variants; every output vs float64. */
static void run_case(const prob_t* p, const char* label) {
    const int64_t N = p->N, F = p->F, NF = N * F;
    const int d = dti(p->dt);
    const size_t es = tu_dtype_size(p->dt);
    char name[256];
    double* got = (double*)tu_xmalloc((size_t)(NF > 0 ? NF : 1) * sizeof(double));
    double* ref = (double*)tu_xmalloc((size_t)(NF > 0 ? NF : 1) * sizeof(double));
    double* slk = (double*)tu_xmalloc((size_t)(NF > 0 ? NF : 1) * sizeof(double));
    const void* bias = p->has_bias ? p->bias : NULL;

    /* ---- forward ---- */
    void* y = tu_xmalloc(mbytes(N, p->ld_y, p->dt));
    tu_poison(y, mbytes(N, p->ld_y, p->dt));
    fl_status st = fl_gelu_forward_cpu(y, p->x, bias, N, F, p->ld_y, p->ld_x, p->dt, p->bdt, p->ap);
    snprintf(name, sizeof name, "%s fwd", label);
    CHECK_STATUS(st, FL_OK, name);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < F; j++) {
            double u = u_of(p, i, j);
            got[i * F + j] = tu_load(y, p->dt, i * p->ld_y + j);
            ref[i * F + j] = ref_gelu(u, p->ap);
            slk[i * F + j] = slack_y(u);
        }
    check_close_ex(name, got, ref, slk, NF, ATOL[d], RTOL[d]);
    CHECK(padding_untouched(y, N, F, p->ld_y, p->dt), "%s: y padding columns written", name);

    /* in place: y == x (same ld) gives the same bits */
    if (N > 0) {
        void* xi = tu_xmalloc(mbytes(N, p->ld_x, p->dt));
        memcpy(xi, p->x, mbytes(N, p->ld_x, p->dt));
        st = fl_gelu_forward_cpu(xi, xi, bias, N, F, p->ld_x, p->ld_x, p->dt, p->bdt, p->ap);
        int same = st == FL_OK;
        for (int64_t i = 0; i < N && same; i++)
            same = memcmp((char*)xi + (size_t)(i * p->ld_x) * es, (char*)y + (size_t)(i * p->ld_y) * es, (size_t)F * es) == 0;
        CHECK(same, "%s: in-place forward (y == x) differs from out of place (status %d)", name, (int)st);
        free(xi);
    }

    /* ---- backward without dbias ---- */
    void* dx = tu_xmalloc(mbytes(N, p->ld_y, p->dt));
    tu_poison(dx, mbytes(N, p->ld_y, p->dt));
    st = fl_gelu_backward_cpu(dx, NULL, p->dy, p->x, bias, N, F, p->ld_y, p->ld_dy, p->ld_x, p->dt, p->bdt, p->ap,
                              NULL, 0);
    snprintf(name, sizeof name, "%s bwd dx", label);
    CHECK_STATUS(st, FL_OK, name);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < F; j++) {
            double u = u_of(p, i, j), g = tu_load(p->dy, p->dt, i * p->ld_dy + j);
            got[i * F + j] = tu_load(dx, p->dt, i * p->ld_y + j);
            ref[i * F + j] = g * ref_dgelu(u, p->ap);
            slk[i * F + j] = slack_dx(u, g);
        }
    check_close_ex(name, got, ref, slk, NF, ATOL[d], RTOL[d]);
    CHECK(padding_untouched(dx, N, F, p->ld_y, p->dt), "%s: dx padding columns written", name);

    /* ---- backward with dbias: same dx bits, dbias vs the float64 column sums ---- */
    if (p->has_bias) {
        size_t wsb;
        void* ws = alloc_ws(N, F, p->dt, &wsb);
        void* dx2 = tu_xmalloc(mbytes(N, p->ld_y, p->dt));
        tu_poison(dx2, mbytes(N, p->ld_y, p->dt));
        const size_t bes = tu_dtype_size(p->bdt);
        void* db = tu_xmalloc((size_t)F * bes);
        tu_poison(db, (size_t)F * bes);
        st = fl_gelu_backward_cpu(dx2, db, p->dy, p->x, p->bias, N, F, p->ld_y, p->ld_dy, p->ld_x, p->dt, p->bdt,
                                  p->ap, ws, wsb);
        snprintf(name, sizeof name, "%s bwd+dbias", label);
        CHECK_STATUS(st, FL_OK, name);
        int same = 1;
        for (int64_t i = 0; i < N && same; i++)
            same = memcmp((char*)dx2 + (size_t)(i * p->ld_y) * es, (char*)dx + (size_t)(i * p->ld_y) * es, (size_t)F * es) == 0;
        CHECK(same, "%s: dx with dbias differs from dx without", name);
        double* gb = (double*)tu_xmalloc((size_t)F * sizeof(double));
        double* rb = (double*)tu_xmalloc((size_t)F * sizeof(double));
        double* sb = (double*)tu_xmalloc((size_t)F * sizeof(double));
        const int bd = dti(p->bdt);
        for (int64_t j = 0; j < F; j++) {
            double s = 0.0, t = 0.0;
            for (int64_t i = 0; i < N; i++) {
                s += ref[i * F + j];
                t += slk[i * F + j] + RTOL[0] * fabs(ref[i * F + j]);
            }
            gb[j] = tu_load(db, p->bdt, j);
            rb[j] = s;
            sb[j] = t;
        }
        snprintf(name, sizeof name, "%s dbias", label);
        check_close_ex(name, gb, rb, sb, F, ATOL[bd], RTOL[bd]);

        /* in place dx == dy and dx == x: same dx and dbias bits */
        for (int which = 0; which < 2 && N > 0; which++) {
            const int64_t ld = which == 0 ? p->ld_dy : p->ld_x;
            void* buf = tu_xmalloc(mbytes(N, ld, p->dt));
            memcpy(buf, which == 0 ? p->dy : p->x, mbytes(N, ld, p->dt));
            void* db2 = tu_xmalloc((size_t)F * bes);
            st = which == 0 ? fl_gelu_backward_cpu(buf, db2, buf, p->x, p->bias, N, F, ld, ld, p->ld_x, p->dt,
                                                   p->bdt, p->ap, ws, wsb)
                            : fl_gelu_backward_cpu(buf, db2, p->dy, buf, p->bias, N, F, ld, p->ld_dy, ld, p->dt,
                                                   p->bdt, p->ap, ws, wsb);
            int ok = st == FL_OK && memcmp(db2, db, (size_t)F * bes) == 0;
            for (int64_t i = 0; i < N && ok; i++)
                ok = memcmp((char*)buf + (size_t)(i * ld) * es, (char*)dx + (size_t)(i * p->ld_y) * es, (size_t)F * es) == 0;
            CHECK(ok, "%s: in-place backward (dx == %s) differs (status %d)", name, which == 0 ? "dy" : "x", (int)st);
            free(buf);
            free(db2);
        }
        free(gb); free(rb); free(sb); free(db); free(dx2); free(ws);
    }
    free(dx); free(y); free(got); free(ref); free(slk);
}

/* ------------------------------------------------------------------------------------------
 * sections
 * ---------------------------------------------------------------------------------------- */
static void test_reference(tu_rng* rng) {
    (void)rng;
    /* hand values (from the closed forms, evaluated independently) */
    static const struct { double u, tanh_y, erf_y, tanh_d, erf_d; } H[] = {
        {1.0, 0.8411919906082768, 0.8413447460685429, 1.0829640838457826, 1.0833154705876864},
        {-0.5, -0.15428599017485606, -0.15426876936299344, 0.13263009646535764, 0.13250487534383712},
        {2.0, 1.954597694087775, 1.9544997361036416, 1.0860992566236183, 1.085231801078197},
    };
    for (size_t k = 0; k < sizeof H / sizeof H[0]; k++) {
        CHECK(fabs(ref_gelu(H[k].u, FL_GELU_TANH) - H[k].tanh_y) < 1e-15, "ref tanh gelu(%g)", H[k].u);
        CHECK(fabs(ref_gelu(H[k].u, FL_GELU_NONE) - H[k].erf_y) < 1e-15, "ref erf gelu(%g)", H[k].u);
        CHECK(fabs(ref_dgelu(H[k].u, FL_GELU_TANH) - H[k].tanh_d) < 1e-15, "ref tanh gelu'(%g)", H[k].u);
        CHECK(fabs(ref_dgelu(H[k].u, FL_GELU_NONE) - H[k].erf_d) < 1e-15, "ref erf gelu'(%g)", H[k].u);
        /* and the library, fp32 */
        for (int a = 0; a < 2; a++) {
            float x = (float)H[k].u, y, dx, one = 1.0f;
            fl_status s1 = fl_gelu_forward_cpu(&y, &x, NULL, 1, 1, 1, 1, FL_DTYPE_F32, FL_DTYPE_F32, (fl_gelu_approx)a);
            fl_status s2 = fl_gelu_backward_cpu(&dx, NULL, &one, &x, NULL, 1, 1, 1, 1, 1, FL_DTYPE_F32, FL_DTYPE_F32,
                                                (fl_gelu_approx)a, NULL, 0);
            double wy = a ? H[k].tanh_y : H[k].erf_y, wd = a ? H[k].tanh_d : H[k].erf_d;
            CHECK(s1 == FL_OK && fabs(y - wy) <= 2e-7 * fabs(wy), "lib %s gelu(%g) = %.9g, want %.9g", ap_name(a), x, y, wy);
            CHECK(s2 == FL_OK && fabs(dx - wd) <= 4e-7 * fabs(wd), "lib %s gelu'(%g) = %.9g, want %.9g", ap_name(a), x, dx, wd);
        }
    }
    /* the float64 derivative against central differences of the float64 forward */
    for (int a = 0; a < 2; a++) {
        double worst = 0.0;
        int ok = 1;
        for (double u = -9.0; u <= 9.0; u += 0.0371) {
            double fd = (ref_gelu(u + FD_REF_H, (fl_gelu_approx)a) - ref_gelu(u - FD_REF_H, (fl_gelu_approx)a)) / (2 * FD_REF_H);
            double dd = ref_dgelu(u, (fl_gelu_approx)a), e = fabs(fd - dd) / (1.0 + fabs(dd));
            if (e > worst) worst = e;
            if (e > FD_REF_TOL) ok = 0;
        }
        CHECK(ok, "float64 %s derivative vs finite differences: worst %.3g > %.3g", ap_name(a), worst, FD_REF_TOL);
        printf("float64 %-4s derivative vs central differences: worst rel %.3g\n", ap_name(a), worst);
    }
}

/* d/dx and d/dbias of L = sum dy * gelu(x + b) by central differences of the library's fp32
 * forward, against the library's backward */
static void test_fd_library(tu_rng* rng) {
    const int64_t N = 5, F = 13;
    for (int a = 0; a < 2; a++) {
        prob_t p = make_prob(rng, N, F, F, F, F, FL_DTYPE_F32, 2, (fl_gelu_approx)a, 2.0);
        float* x = (float*)p.x;
        float* b = (float*)p.bias;
        const float* dy = (const float*)p.dy;
        float dx[5 * 13], db[13], y[5 * 13];
        size_t wsb;
        void* ws = alloc_ws(N, F, FL_DTYPE_F32, &wsb);
        fl_status st = fl_gelu_backward_cpu(dx, db, dy, x, b, N, F, F, F, F, FL_DTYPE_F32, FL_DTYPE_F32, p.ap, ws, wsb);
        CHECK_STATUS(st, FL_OK, "fd backward");
        double worst = 0.0;
        int ok = 1;
        for (int64_t k = 0; k < N * F; k++) {  /* dx: perturb one element */
            float x0 = x[k];
            double lp, lm;
            x[k] = x0 + (float)FD_LIB_H;
            fl_gelu_forward_cpu(y, x, b, N, F, F, F, FL_DTYPE_F32, FL_DTYPE_F32, p.ap);
            lp = y[k];
            x[k] = x0 - (float)FD_LIB_H;
            fl_gelu_forward_cpu(y, x, b, N, F, F, F, FL_DTYPE_F32, FL_DTYPE_F32, p.ap);
            lm = y[k];
            x[k] = x0;
            double fd = dy[k] * (lp - lm) / (2 * FD_LIB_H);
            double e = fabs(fd - dx[k]), tol = FD_LIB_TOL * fabs(dy[k]) * (1.0 + fabs(lp));
            if (e / (tol > 0 ? tol : 1) > worst) worst = e / (tol > 0 ? tol : 1);
            if (e > tol) ok = 0;
        }
        CHECK(ok, "%s dx vs finite differences of the fp32 forward: worst err/tol %.3g", ap_name(a), worst);
        worst = 0.0;
        ok = 1;
        for (int64_t j = 0; j < F; j++) {  /* dbias: perturb one bias entry, sum dy*y over everything */
            float b0 = b[j];
            double l[2];
            for (int s = 0; s < 2; s++) {
                b[j] = b0 + (s ? -1.0f : 1.0f) * (float)FD_LIB_H;
                fl_gelu_forward_cpu(y, x, b, N, F, F, F, FL_DTYPE_F32, FL_DTYPE_F32, p.ap);
                l[s] = 0.0;
                for (int64_t k = 0; k < N * F; k++) l[s] += (double)dy[k] * y[k];
            }
            b[j] = b0;
            double fd = (l[0] - l[1]) / (2 * FD_LIB_H), tol = 0.0;
            for (int64_t i = 0; i < N; i++) tol += FD_LIB_TOL * fabs(dy[i * F + j]) * (1.0 + fabs(x[i * F + j]));
            double e = fabs(fd - db[j]);
            if (e / tol > worst) worst = e / tol;
            if (e > tol) ok = 0;
        }
        CHECK(ok, "%s dbias vs finite differences of the fp32 forward: worst err/tol %.3g", ap_name(a), worst);
        printf("%-4s finite differences of the library: dx and dbias within tolerance (worst dbias err/tol %.3g)\n",
               ap_name(a), worst);
        free(ws);
        free_prob(&p);
    }
}

static void test_grid(tu_rng* rng) {
    /* real and odd shapes; layouts: contiguous, and separate strides > F */
    static const int64_t SH[][2] = {{1, 1}, {1, 8}, {2, 3}, {5, 7}, {16, 64}, {33, 129}, {64, 768}, {7, 3071}, {3, 1000}};
    long before = tu_failed;
    tu_quiet = 1;
    int ncases = 0;
    for (size_t s = 0; s < sizeof SH / sizeof SH[0]; s++)
        for (int di = 0; di < 3; di++)
            for (int a = 0; a < 2; a++)
                for (int bk = 0; bk < 3; bk++) {
                    if (bk == 2 && DTYPES[di] == FL_DTYPE_F32) continue;  /* same as bk == 1 */
                    for (int lay = 0; lay < 2; lay++) {
                        const int64_t N = SH[s][0], F = SH[s][1];
                        const int64_t ly = lay ? F + 2 : F, lx = lay ? F + 5 : F, ld = lay ? F + 1 : F;
                        prob_t p = make_prob(rng, N, F, ly, lx, ld, DTYPES[di], bk, (fl_gelu_approx)a, 2.0);
                        char label[160];
                        snprintf(label, sizeof label, "%s %s bias=%s N=%lld F=%lld ld=%lld/%lld/%lld",
                                 tu_dtype_name(DTYPES[di]), ap_name(a), bk == 0 ? "none" : bk == 1 ? "dt" : "f32",
                                 (long long)N, (long long)F, (long long)ly, (long long)lx, (long long)ld);
                        run_case(&p, label);
                        free_prob(&p);
                        ncases++;
                    }
                }
    tu_quiet = 0;
    printf("grid: %d cases (dtype x approx x bias dtype x shape x layout), %s\n", ncases,
           tu_failed == before ? "all TENSOR OK" : "FAILURES above");
}

static void test_special(tu_rng* rng) {
    (void)rng;
    /* sign of zero, tiny / huge / NaN inputs, vs the float64 reference (NaN only matches NaN) */
    static const float V[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 5.0f, -5.0f, 10.0f, -10.0f,
                              30.0f, -30.0f, 1e4f, -1e4f, 6e4f, -6e4f};
    const int n = (int)(sizeof V / sizeof V[0]);
    for (int di = 0; di < 3; di++)
        for (int a = 0; a < 2; a++) {
            const fl_dtype dt = DTYPES[di];
            uint16_t xb[32], yb[32], db[32], ob[32];
            float xf[32], yf[32], dxf[32], onef[32];
            void* x = dt == FL_DTYPE_F32 ? (void*)xf : (void*)xb;
            void* y = dt == FL_DTYPE_F32 ? (void*)yf : (void*)yb;
            void* dx = dt == FL_DTYPE_F32 ? (void*)dxf : (void*)db;
            void* one = dt == FL_DTYPE_F32 ? (void*)onef : (void*)ob;
            for (int k = 0; k < n + 1; k++) {
                tu_store(x, dt, k, k < n ? V[k] : NAN);
                tu_store(one, dt, k, 1.0f);
            }
            fl_status s1 = fl_gelu_forward_cpu(y, x, NULL, 1, n + 1, n + 1, n + 1, dt, dt, (fl_gelu_approx)a);
            fl_status s2 = fl_gelu_backward_cpu(dx, NULL, one, x, NULL, 1, n + 1, n + 1, n + 1, n + 1, dt, dt,
                                                (fl_gelu_approx)a, NULL, 0);
            CHECK(s1 == FL_OK && s2 == FL_OK, "special values: status %d %d", (int)s1, (int)s2);
            double got[33], ref[33], slk[33], gd[33], rd[33], sd[33];
            for (int k = 0; k < n + 1; k++) {
                double u = tu_load(x, dt, k);
                got[k] = tu_load(y, dt, k);
                ref[k] = ref_gelu(u, (fl_gelu_approx)a);
                slk[k] = slack_y(u);
                gd[k] = tu_load(dx, dt, k);
                rd[k] = ref_dgelu(u, (fl_gelu_approx)a);
                sd[k] = isnan(u) ? 0 : slack_dx(u, 1.0);
            }
            char name[96];
            snprintf(name, sizeof name, "special values %s %s y", tu_dtype_name(dt), ap_name(a));
            check_close_ex(name, got, ref, slk, n + 1, ATOL[di], RTOL[di]);
            snprintf(name, sizeof name, "special values %s %s dx", tu_dtype_name(dt), ap_name(a));
            check_close_ex(name, gd, rd, sd, n + 1, ATOL[di], RTOL[di]);
            /* gelu(-0) = -0 (no bias: nothing is added), as PyTorch */
            CHECK(signbit(tu_load(y, dt, 1)) && tu_load(y, dt, 1) == 0.0f, "%s %s: gelu(-0) is not -0",
                  tu_dtype_name(dt), ap_name(a));
        }
}

static void test_edges(tu_rng* rng) {
    /* N == 0: nothing read or written; dbias is zeros; NULL matrices and workspace are fine */
    float db[5];
    tu_poison(db, sizeof db);
    float bias[5] = {1, 2, 3, 4, 5};
    CHECK_STATUS(fl_gelu_forward_cpu(NULL, NULL, bias, 0, 5, 5, 5, FL_DTYPE_F32, FL_DTYPE_F32, FL_GELU_TANH), FL_OK,
                 "N=0 forward");
    CHECK_STATUS(fl_gelu_backward_cpu(NULL, db, NULL, NULL, bias, 0, 5, 5, 5, 5, FL_DTYPE_F32, FL_DTYPE_F32,
                                      FL_GELU_TANH, NULL, 0),
                 FL_OK, "N=0 backward with dbias");
    int zeros = 1;
    for (int j = 0; j < 5; j++) zeros &= db[j] == 0.0f && !signbit(db[j]);
    CHECK(zeros, "N=0: dbias must be +0");
    /* workspace size: never 0, grows with F */
    size_t a = 0, b = 0;
    CHECK_STATUS(fl_gelu_workspace_size(&a, 1, 1, FL_DTYPE_BF16), FL_OK, "workspace_size(1,1)");
    CHECK_STATUS(fl_gelu_workspace_size(&b, 8192, 16384, FL_DTYPE_BF16), FL_OK, "workspace_size(8192,16384)");
    CHECK(a > 0 && b > a, "workspace sizes %zu, %zu", a, b);
    printf("workspace bytes: N=1 F=1: %zu; N=8192 F=16384 bf16: %zu\n", a, b);
    /* a big row block count: N = 4099 (> 64 CPU blocks, uneven last block), odd F, bf16 + fp32 bias */
    prob_t p = make_prob(rng, 4099, 31, 31, 31, 31, FL_DTYPE_BF16, 2, FL_GELU_TANH, 3.0);
    tu_quiet = 1;
    long f0 = tu_failed;
    run_case(&p, "bf16 tanh N=4099 F=31 f32 bias");
    tu_quiet = 0;
    CHECK(tu_failed == f0, "N=4099 case failed");
    free_prob(&p);
}

static void test_threads(tu_rng* rng) {
#ifdef _OPENMP
    const int64_t N = 333, F = 777;
    prob_t p = make_prob(rng, N, F, F, F, F, FL_DTYPE_BF16, 2, FL_GELU_NONE, 2.0);
    size_t wsb;
    void* ws = alloc_ws(N, F, p.dt, &wsb);
    size_t mb = mbytes(N, F, p.dt);
    void* dx[2] = {tu_xmalloc(mb), tu_xmalloc(mb)};
    void* y[2] = {tu_xmalloc(mb), tu_xmalloc(mb)};
    float db[2][777];
    const int saved = omp_get_max_threads();
    const int threads[2] = {1, 5};
    for (int r = 0; r < 2; r++) {
        omp_set_num_threads(threads[r]);
        fl_gelu_forward_cpu(y[r], p.x, p.bias, N, F, F, F, p.dt, p.bdt, p.ap);
        fl_gelu_backward_cpu(dx[r], db[r], p.dy, p.x, p.bias, N, F, F, F, F, p.dt, p.bdt, p.ap, ws, wsb);
    }
    omp_set_num_threads(saved);
    check_bitwise("1 vs 5 threads: y", y[0], y[1], mb);
    check_bitwise("1 vs 5 threads: dx", dx[0], dx[1], mb);
    check_bitwise("1 vs 5 threads: dbias", db[0], db[1], sizeof db[0]);
    free(dx[0]); free(dx[1]); free(y[0]); free(y[1]); free(ws);
    free_prob(&p);
#else
    (void)rng;
    printf("threads: built without OpenMP, nothing to compare\n");
#endif
}

/* ------------------------------------------------------------------------------------------
 * bad arguments: exact status, the function named in the message, outputs untouched
 * ---------------------------------------------------------------------------------------- */
#define EN 4
#define EF 6
#define ELD 8
static float e_x[EN * ELD], e_dy[EN * ELD], e_out[EN * ELD], e_b[EF], e_db[EF];
static void* e_ws;
static size_t e_wsb;

typedef struct {
    void *out, *db; const void *dy, *x, *b;
    int64_t N, F, ld_out, ld_dy, ld_x;
    fl_dtype dt, bdt; fl_gelu_approx ap; void* ws; size_t wsb;
} gargs;

static gargs valid(void) {
    gargs a = {e_out, e_db, e_dy, e_x, e_b, EN, EF, ELD, ELD, ELD, FL_DTYPE_F32, FL_DTYPE_F32, FL_GELU_TANH, e_ws, e_wsb};
    return a;
}

static fl_status call(int bwd, int cuda, const gargs* a) {
    if (!bwd)
        return cuda ? fl_gelu_forward_cuda(a->out, a->x, a->b, a->N, a->F, a->ld_out, a->ld_x, a->dt, a->bdt, a->ap, NULL)
                    : fl_gelu_forward_cpu(a->out, a->x, a->b, a->N, a->F, a->ld_out, a->ld_x, a->dt, a->bdt, a->ap);
    return cuda ? fl_gelu_backward_cuda(a->out, a->db, a->dy, a->x, a->b, a->N, a->F, a->ld_out, a->ld_dy, a->ld_x,
                                        a->dt, a->bdt, a->ap, a->ws, a->wsb, NULL)
                : fl_gelu_backward_cpu(a->out, a->db, a->dy, a->x, a->b, a->N, a->F, a->ld_out, a->ld_dy, a->ld_x,
                                       a->dt, a->bdt, a->ap, a->ws, a->wsb);
}

static void expect(int bwd, int cuda, const gargs* a, fl_status want, const char* what) {
    static const char* FN[2][2] = {{"fl_gelu_forward_cpu", "fl_gelu_forward_cuda"},
                                   {"fl_gelu_backward_cpu", "fl_gelu_backward_cuda"}};
    char name[200];
    snprintf(name, sizeof name, "%s: %s", FN[bwd][cuda], what);
    tu_poison(e_out, sizeof e_out);
    tu_poison(e_db, sizeof e_db);
    fl_status st = call(bwd, cuda, a);
    CHECK_STATUS(st, want, name);
    if (want == FL_OK) {
        CHECK(fl_last_error()[0] == '\0', "%s: fl_last_error() after success = \"%s\"", name, fl_last_error());
        return;
    }
    CHECK(strstr(fl_last_error(), FN[bwd][cuda]) != NULL, "%s: message \"%s\" does not name the function", name,
          fl_last_error());
    int untouched = 1;
    for (int k = 0; k < EN * ELD; k++) untouched &= tu_is_poison(e_out, 4, k);
    for (int k = 0; k < EF; k++) untouched &= tu_is_poison(e_db, 4, k);
    CHECK(untouched, "%s: an output was written on failure", name);
}

static void test_errors(tu_rng* rng) {
    for (int k = 0; k < EN * ELD; k++) { e_x[k] = (float)tu_normal(rng); e_dy[k] = (float)tu_normal(rng); }
    for (int j = 0; j < EF; j++) e_b[j] = 0.1f * (float)j;
    fl_status st = fl_gelu_workspace_size(&e_wsb, EN, EF, FL_DTYPE_F32);
    CHECK_STATUS(st, FL_OK, "workspace_size");
    /* 256-aligned, as the CUDA entry points require (the CPU ones do not care) */
    e_ws = aligned_alloc(256, (e_wsb + 255) / 256 * 256);
    const int built = fl_cuda_built();
    for (int cuda = 0; cuda < 2; cuda++)
        for (int bwd = 0; bwd < 2; bwd++) {
            gargs a;
            if (!cuda) { a = valid(); expect(bwd, 0, &a, FL_OK, "valid arguments"); }
            if (cuda && !built) {  /* a build without CUDA: the entry points exist and say so */
                a = valid();
                expect(bwd, 1, &a, FL_ERR_NOT_BUILT, "CPU-only build");
                continue;
            }
            /* CUDA build: only invalid arguments here (no GPU needed: validation comes first) */
#define BAD(stmt, want, what) do { a = valid(); stmt; expect(bwd, cuda, &a, want, what); } while (0)
            BAD(a.N = -1, FL_ERR_INVALID_ARGUMENT, "N < 0");
            BAD(a.F = 0, FL_ERR_INVALID_ARGUMENT, "F = 0");
            BAD(a.F = -3, FL_ERR_INVALID_ARGUMENT, "F < 0");
            BAD(a.ld_out = EF - 1, FL_ERR_INVALID_ARGUMENT, "ld_out < F");
            BAD(a.ld_x = EF - 1, FL_ERR_INVALID_ARGUMENT, "ld_x < F");
            BAD(a.x = NULL, FL_ERR_INVALID_ARGUMENT, "x NULL");
            BAD(a.out = NULL, FL_ERR_INVALID_ARGUMENT, "output NULL");
            BAD(a.dt = (fl_dtype)7, FL_ERR_INVALID_ARGUMENT, "unknown dtype");
            BAD(a.ap = (fl_gelu_approx)2, FL_ERR_INVALID_ARGUMENT, "unknown approx");
            BAD(a.bdt = (fl_dtype)9, FL_ERR_INVALID_ARGUMENT, "unknown bias_dtype");
            BAD((a.dt = FL_DTYPE_BF16, a.bdt = FL_DTYPE_F16), FL_ERR_INVALID_ARGUMENT, "bias fp16 with bf16 x");
            BAD(a.x = (const char*)e_x + 2, FL_ERR_INVALID_ARGUMENT, "x misaligned");
            BAD(a.b = (const char*)e_b + 1, FL_ERR_INVALID_ARGUMENT, "bias misaligned");
            BAD(a.N = INT64_MAX / 4, FL_ERR_INVALID_ARGUMENT, "N*ld overflows");
            BAD(a.out = e_x + 1, FL_ERR_INVALID_ARGUMENT, "output partially overlaps x");
            BAD((a.out = e_x, a.ld_out = ELD + 1), FL_ERR_INVALID_ARGUMENT, "output == x with another ld");
            BAD(a.out = e_b, FL_ERR_INVALID_ARGUMENT, "output overlaps bias");
            if (!bwd) continue;
            BAD(a.ld_dy = EF - 1, FL_ERR_INVALID_ARGUMENT, "ld_dy < F");
            BAD(a.dy = NULL, FL_ERR_INVALID_ARGUMENT, "dy NULL");
            BAD(a.b = NULL, FL_ERR_INVALID_ARGUMENT, "dbias without bias");
            BAD(a.wsb = e_wsb - 1, FL_ERR_INSUFFICIENT_WORKSPACE, "workspace too small");
            BAD(a.ws = NULL, FL_ERR_INVALID_ARGUMENT, "workspace NULL");
            BAD(a.out = e_dy + 3, FL_ERR_INVALID_ARGUMENT, "dx partially overlaps dy");
            BAD((a.out = e_dy, a.ld_out = ELD + 1), FL_ERR_INVALID_ARGUMENT, "dx == dy with another ld");
            BAD(a.db = e_x + 2, FL_ERR_INVALID_ARGUMENT, "dbias overlaps x");
            BAD(a.db = e_b, FL_ERR_INVALID_ARGUMENT, "dbias == bias");
            BAD(a.ws = e_dy, FL_ERR_INVALID_ARGUMENT, "workspace overlaps dy");
            BAD(a.db = (char*)e_db + 2, FL_ERR_INVALID_ARGUMENT, "dbias misaligned");
            if (cuda) BAD(a.ws = (char*)e_ws + 16, FL_ERR_INVALID_ARGUMENT, "workspace not 256-byte aligned");
#undef BAD
        }
    /* valid corner cases (CPU): in place, frozen bias (no dbias), no workspace without dbias */
    gargs a = valid();
    a.out = e_x; expect(0, 0, &a, FL_OK, "in place y == x");
    a = valid(); a.out = e_dy; a.ld_out = ELD; expect(1, 0, &a, FL_OK, "in place dx == dy");
    a = valid(); a.db = NULL; a.ws = NULL; a.wsb = 0; expect(1, 0, &a, FL_OK, "bias without dbias, no workspace");
    a = valid(); a.b = NULL; a.db = NULL; a.ws = NULL; a.wsb = 0; expect(1, 0, &a, FL_OK, "no bias, no workspace");
    /* workspace size query */
    size_t bytes;
    CHECK_STATUS(fl_gelu_workspace_size(NULL, 4, 4, FL_DTYPE_F32), FL_ERR_INVALID_ARGUMENT, "workspace_size bytes NULL");
    CHECK_STATUS(fl_gelu_workspace_size(&bytes, -1, 4, FL_DTYPE_F32), FL_ERR_INVALID_ARGUMENT, "workspace_size N < 0");
    CHECK_STATUS(fl_gelu_workspace_size(&bytes, 4, 0, FL_DTYPE_F32), FL_ERR_INVALID_ARGUMENT, "workspace_size F = 0");
    CHECK_STATUS(fl_gelu_workspace_size(&bytes, 4, 4, (fl_dtype)5), FL_ERR_INVALID_ARGUMENT, "workspace_size dtype");
    CHECK(strstr(fl_last_error(), "fl_gelu_workspace_size") != NULL, "workspace_size message names the function");
    free(e_ws);
}

/* ------------------------------------------------------------------------------------------
 * The CUDA backend's fast fp16/bf16 formulas (src/cuda/gelu.cu, gelu_f_fast / gelu_df_fast),
 * emulated here operation for operation in fp32 (fmaf where the kernel has __fmaf_rn), checked
 * EXHAUSTIVELY over all 65536 bf16 and all 65536 fp16 inputs against the exact GeLU (double:
 * tanh mode u / (1 + exp(-2v)) with PyTorch's constants kB, kK; erf mode u * erfc(-u/sqrt 2) / 2),
 * both rounded to the dtype. MUFU.EX2 / MUFU.RCP (ex2.approx.ftz, rcp.approx.ftz) are emulated
 * by exp2f / 1/x with their documented error bounds applied as a perturbation: every input is
 * evaluated three times, with the two results scaled by 1, 1 + 2^-21 and 1 - 2^-21 (about 4x
 * PTX's stated bounds), and the worst is kept; an ex2 result below 2^-126 is flushed to 0 (ftz).
 * Forward: every result within 1 ulp of the exactly rounded one (asserted), count printed.
 * Backward (dy = 1; tanh mode u*u = inf excluded: NaN there, as PyTorch): within 1 ulp except near gelu's minimum (u ~ -0.75, where gelu' crosses 0
 * and any fp32 formula has an absolute error of a few 2^-24): there the absolute error must be
 * below 2^-21 (asserted), the count is printed.
 * ---------------------------------------------------------------------------------------- */
static double g_pert;  /* relative perturbation of the emulated MUFU results */
static float fx_ex2(float x) {
    float r = exp2f(x);
    r = (float)((double)r * (1.0 + g_pert));
    return r < 0x1p-126f ? 0.0f : r;
}
static float fx_rcp(float x) { return (float)((1.0 / (double)x) * (1.0 - g_pert)); }
static float fx_mills_bwd(float t) {
    float m = 0x1.5ffdc4p-4f;
    m = fmaf(m, t, -0x1.37ce0cp-2f); m = fmaf(m, t, 0x1.0c591cp-2f); m = fmaf(m, t, 0x1.5bfd5ap-5f);
    m = fmaf(m, t, 0x1.f07abap-3f); m = fmaf(m, t, 0x1.23a28ep-2f); m = fmaf(m, t, 0x1.47ccf0p-2f);
    m = fmaf(m, t, 0x1.47ade4p-2f);
    return m * t;
}
static float fx_mills_fwd5_s64(float t) {   /* the kernel's mills_fwd5_s64: 5 terms, scaled by 2^-64 */
    float m = -0x1.d26e12p-67f;
    m = fmaf(m, t, 0x1.fe2486p-66f); m = fmaf(m, t, 0x1.b2dc30p-67f); m = fmaf(m, t, 0x1.95556ap-66f);
    m = fmaf(m, t, 0x1.7fad4cp-66f);
    return m * t;
}
static float fx_gelu(float u, int tanh_mode) {
    if (tanh_mode) {
        const float u2 = u * u, z2 = fmaf(0x1.a5a7d0p-4f, u2, 0x1.26aec2p+1f) * u;
        const float e64 = fx_ex2(64.0f - fabsf(z2)), r = fx_rcp(fmaf(e64, 0x1p-64f, 1.0f));
        return u >= 0.0f ? u * r : ((u * e64) * r) * 0x1p-64f;
    }
    const float a = fabsf(u), t = fx_rcp(fmaf(a, 0x1.810624p-2f, 1.0f));
    const float e0 = fx_ex2(fmaf(a * -0x1.715476p-1f, a, 0x1.f564dep+5f)), q = e0 * fx_mills_fwd5_s64(t);
    return u * (u >= 0.0f ? 1.0f - q : q);
}
static float fx_dgelu(float u, int tanh_mode) {
    if (tanh_mode) {
        const float u2 = u * u, z2 = fmaf(0x1.a5a7d0p-4f, u2, 0x1.26aec2p+1f) * u;
        const float e64 = fx_ex2(64.0f - fabsf(z2)), r = fx_rcp(fmaf(e64, 0x1p-64f, 1.0f));
        const float q = fmaf(0x1.b6676cp-3f, u2, 0x1.988454p+0f), er = (e64 * 0x1p-64f) * r;
        return fmaf(u, q * (er * r), u >= 0.0f ? r : er);
    }
    const float a = fabsf(u), t = fx_rcp(fmaf(a, 0x1.47ae14p-2f, 1.0f)), R = fx_mills_bwd(t);
    const float e0 = fx_ex2(fmaf(a * -0x1.715476p-1f, a, 0x1.f564dep+5f)), eD = e0 * (a - R);
    return u >= 0.0f ? fmaf(eD, 0x1p-64f, 1.0f) : eD * -0x1p-64f;
}
static double ex_gelu(double u, int tanh_mode, int deriv) {
    const double kB = (double)0x1.988454p-1f, kK = (double)0x1.6e4e26p-5f;
    if (tanh_mode) {
        const double v2 = 2.0 * kB * (u + kK * u * u * u), s = 1.0 / (1.0 + exp(-v2)), s1 = 1.0 / (1.0 + exp(v2));
        return deriv ? s + u * s * s1 * 2.0 * kB * (1.0 + 3.0 * kK * u * u) : u * s;
    }
    const double P = 0.5 * erfc(-u / sqrt(2.0)), phi = exp(-0.5 * u * u) * 0.39894228040143267794;
    return deriv ? P + u * phi : u * P;
}
/* ordered position of a 16-bit pattern (-0 == +0) and its value */
static int64_t fx_ord(uint16_t b) { return (b & 0x8000u) ? -(int64_t)(b & 0x7fffu) : (int64_t)b; }
static double fx_val(uint16_t b, int bf) { return bf ? tu_bf16_to_f32(b) : tu_f16_to_f32(b); }
static uint16_t fx_round(double v, int bf) {   /* exact round-to-nearest of a double (finite) */
    uint16_t c = bf ? tu_f32_to_bf16((float)v) : tu_f32_to_f16((float)v);
    for (int k = 0; k < 2; k++) {   /* the double -> float step may have moved it by one */
        const uint16_t up = (uint16_t)(c + ((c & 0x8000u) ? -1 : 1)), dn = (uint16_t)(c - ((c & 0x8000u) ? -1 : 1));
        const double e = fabs(fx_val(c, bf) - v);
        if ((c & 0x7fffu) != 0 && isfinite(fx_val(up, bf)) && fabs(fx_val(up, bf) - v) < e) c = up;
        else if ((c & 0x7fffu) != 0 && isfinite(fx_val(dn, bf)) && fabs(fx_val(dn, bf) - v) < e) c = dn;
    }
    return c;
}
static void test_fast16_exhaustive(void) {
    for (int bf = 1; bf >= 0; bf--)
        for (int tm = 1; tm >= 0; tm--)
            for (int deriv = 0; deriv < 2; deriv++) {
                long n = 0, d1 = 0, dbig = 0, dbig_bad = 0;
                double maxrel = 0.0, maxabs_big = 0.0;
                for (uint32_t b = 0; b < 65536; b++) {
                    const float u = (float)fx_val((uint16_t)b, bf);
                    if (!isfinite(u)) continue;
                    /* tanh backward, |u| > ~1.8e19: u*u overflows and PyTorch's result is NaN; so is ours */
                    if (deriv && tm && isinf(u * u)) {
                        g_pert = 0.0;
                        CHECK(isnan(fx_dgelu(u, tm)), "tanh bwd u = %g: NaN as PyTorch", (double)u);
                        continue;
                    }
                    const double ex = ex_gelu((double)u, tm, deriv);
                    const uint16_t re = fx_round(ex, bf);
                    int64_t worst = 0;
                    double wabs = 0.0;
                    for (int pk = 0; pk < 3; pk++) {
                        g_pert = pk == 0 ? 0.0 : pk == 1 ? 0x1p-21 : -0x1p-21;
                        const float f = deriv ? fx_dgelu(u, tm) : fx_gelu(u, tm);
                        const uint16_t rf = bf ? tu_f32_to_bf16(f) : tu_f32_to_f16(f);
                        int64_t dd = fx_ord(rf) - fx_ord(re);
                        if (dd < 0) dd = -dd;
                        if (dd > worst) worst = dd;
                        if (fabs((double)f - ex) > wabs) wabs = fabs((double)f - ex);
                        if (ex != 0.0 && fabs(((double)f - ex) / ex) > maxrel && fabs(ex) > 1e-30) maxrel = fabs(((double)f - ex) / ex);
                    }
                    n++;
                    if (worst == 1) d1++;
                    if (worst > 1) {
                        dbig++;
                        if (wabs > maxabs_big) maxabs_big = wabs;
                        if (deriv ? wabs > 0x1p-21 : 1) {
                            if (dbig_bad < 5) printf("    %s %s %s u = %.9g: %lld ulp, |err| %.3g\n", bf ? "bf16" : "fp16",
                                                     tm ? "tanh" : "erf", deriv ? "bwd" : "fwd", (double)u, (long long)worst, wabs);
                            dbig_bad++;
                        }
                    }
                }
                printf("  fast %s %-4s %s: %ld inputs, %ld at 1 ulp, %ld > 1 ulp (max |err| there %.3g), max rel err (fp32, |ref| > 1e-30) %.3g\n",
                       bf ? "bf16" : "fp16", tm ? "tanh" : "erf", deriv ? "bwd" : "fwd", n, d1, dbig, maxabs_big, maxrel);
                CHECK(dbig_bad == 0, "fast %s %s %s: %ld inputs beyond the bound", bf ? "bf16" : "fp16", tm ? "tanh" : "erf",
                      deriv ? "bwd" : "fwd", dbig_bad);
            }
}

int main(int argc, char** argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261201ull;
    printf("seed %llu\n", (unsigned long long)seed);
    tu_rng rng = tu_rng_seed(seed);
    static void (*const sections[])(tu_rng*) = {test_errors, test_reference, test_fd_library, test_special,
                                                 test_edges, test_threads, test_grid};
    static const char* const names[] = {"bad arguments", "float64 reference", "finite differences (library)",
                                        "special values", "N=0 / workspace / big N", "threads",
                                        "dtype x approx x bias x shape x layout"};
    for (size_t k = 0; k < sizeof sections / sizeof sections[0]; k++) {
        long f0 = tu_failed, p0 = tu_passed;
        sections[k](&rng);
        printf("== section %-40s %6ld checks, %s\n", names[k], (tu_passed - p0) + (tu_failed - f0),
               tu_failed == f0 ? "ok" : "FAILED");
    }
    {
        long f0 = tu_failed, p0 = tu_passed;
        test_fast16_exhaustive();
        printf("== section %-40s %6ld checks, %s\n", "CUDA fast fp16/bf16 formulas, exhaustive", (tu_passed - p0) + (tu_failed - f0),
               tu_failed == f0 ? "ok" : "FAILED");
    }
    return tu_finish();
}
