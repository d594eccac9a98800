/* test_elementwise_loss.c — CPU backend of the elementwise losses (sigmoid focal, BCE with
 * logits; include/fusedloss.h section 9) against long-double references written from the
 * formulas (torchvision.ops.sigmoid_focal_loss, F.binary_cross_entropy_with_logits), the
 * references' own gradients checked by central finite differences, every dtype x reduction x
 * pass (forward / backward / fused) x option (alpha on/off, gamma 0 / 0.5 / 1 / 1.5 / 2, soft or
 * binary targets, weight / pos_weight, grad_loss / grad_scale), edge cases (x = +-1e4, +-inf,
 * NaN, the saturated-sigmoid NaN rule of gamma < 1, n = 0, in place), thread-count independence,
 * and every bad argument's status and message.
 *
 * Build / run: make test (this is build/test_elementwise_loss). Prints "N passed, M failed".
 * SPDX-License-Identifier: MIT
 */
#define LN2_ 0.693147180559945309417
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

/* ------------------------------------------------------------------------------------------
 * Tolerances |lib - ref| <= atol + rtol*|ref| + slack. The reference is exact (long double) on
 * the dtype-rounded inputs; the library works in fp32. rtol: a few fp32 ulps (expf, the log1p series,
 * powf are within 1-2 ulp, the formulas take ~10 roundings), or 1 ulp of the output dtype for
 * dlogits. The loss has no slack: its BCE is a sum of non-negative terms. dlogits' slack: the
 * one cancellation of the gradient, d = p (1 - y) - (1 - p) y for soft y with p ~ y (absolute
 * error ~ 2 fp32 ulps), times |g| and the factor d is multiplied by.
 * ---------------------------------------------------------------------------------------- */
static const double RTOL_LOSS = 8e-7;
static const double ATOL_LOSS = 1e-30;
static const double RTOL_DX[3] = {8e-7, 9.8e-4, 7.9e-3};   /* f32, f16, bf16 */
static const double ATOL_DX[3] = {1e-30, 6e-8, 1e-30};
static const double SLACK = 2.4e-7;                        /* 2 fp32 ulps */
static const double RTOL_SUM = 2e-6;                       /* sums: per-element tolerance + this */

typedef long double LD;

/* ---- references ------------------------------------------------------------------------ */
static LD sigm(LD x) { return x >= 0 ? 1.0L / (1.0L + expl(-x)) : expl(x) / (1.0L + expl(x)); }
/* -[pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))], the textbook form (= PyTorch's
 * (1 - y) x + (1 + (pw - 1) y) softplus(-x), since softplus(x) = x + softplus(-x)); no cancellation */
static LD softplus(LD z) { return (z > 0 ? z : 0) + log1pl(expl(-fabsl(z))); }
static LD bce_ref(LD x, LD y, LD pw) { return pw * y * softplus(-x) + (1 - y) * softplus(x); }
/* torchvision's loss, exactly: a * bce * (1 - p_t)^gamma */
static LD focal_l(LD x, LD y, LD alpha, LD gamma) {
    LD p = sigm(x), pm = sigm(-x);
    LD q = p * (1 - y) + pm * y;
    LD a = alpha >= 0 ? alpha * y + (1 - alpha) * (1 - y) : 1;
    return a * bce_ref(x, y, 1) * (gamma == 0 ? 1 : powl(q, gamma));
}
/* its derivative (derived by hand; verified below by finite differences) and the header's rule
 * for 1 - p_t == 0 in fp32 */
static LD focal_d(LD x, LD y, LD alpha, LD gamma) {
    LD p = sigm(x), pm = sigm(-x);
    LD q = p * (1 - y) + pm * y;
    LD a = alpha >= 0 ? alpha * y + (1 - alpha) * (1 - y) : 1;
    LD bce = bce_ref(x, y, 1);
    if (isnan(bce)) return gamma == 0 ? a * (p - y) : NAN;
    if (gamma == 0) return a * (p - y);
    if ((float)q == 0.0f && gamma < 1) return NAN;   /* torch: 0 * inf */
    return a * ((p - y) * powl(q, gamma) + gamma * bce * (1 - 2 * y) * p * pm * powl(q, gamma - 1));
}
static LD bce_l(LD x, LD y, LD w, LD pw) { return w * bce_ref(x, y, pw); }
static LD bce_d(LD x, LD y, LD w, LD pw) { return w * ((pw * y + 1 - y) * sigm(x) - pw * y); }

/* ---- one configuration -------------------------------------------------------------------- */
typedef struct {
    int bce;              /* 0 focal, 1 bce */
    float alpha, gamma;   /* focal */
    int use_w, use_pw;    /* bce */
    int64_t N, C;         /* focal: n = N, C = 1 */
    fl_dtype dt;
    fl_reduction red;
    int soft;             /* soft targets */
    int with_gl;          /* grad_loss given */
    float gscale;
    double xscale;
} cfg_t;

static void fill(const cfg_t* c, tu_rng* r, void* x, void* y, float* w, float* pw, float* gl) {
    const int64_t n = c->N * c->C;
    for (int64_t k = 0; k < n; k++) {
        tu_store(x, c->dt, k, (float)(c->xscale * tu_normal(r)));
        tu_store(y, c->dt, k, c->soft ? (float)tu_uniform(r) : (float)(tu_uniform(r) < 0.3));
    }
    for (int64_t j = 0; j < c->C; j++) {
        w[j] = (float)tu_uniform_in(r, 0.1, 2.0);
        pw[j] = (float)tu_uniform_in(r, 0.2, 5.0);
    }
    const int64_t ng = c->red == FL_REDUCTION_NONE ? n : 1;
    for (int64_t k = 0; k < ng; k++) gl[k] = (float)tu_uniform_in(r, -2.0, 2.0);
}

static fl_status call(const cfg_t* c, int pass, float* loss, void* dx, const void* x, const void* y, const float* w,
                      const float* pw, const float* gl, void* ws, size_t wsb) {
    const float* glp = c->with_gl ? gl : NULL;
    const float* wp = c->use_w ? w : NULL;
    const float* pwp = c->use_pw ? pw : NULL;
    if (!c->bce) {
        if (pass == 0) return fl_sigmoid_focal_forward_cpu(loss, x, y, c->N, c->dt, c->alpha, c->gamma, c->red, ws, wsb);
        if (pass == 1)
            return fl_sigmoid_focal_backward_cpu(dx, x, y, glp, c->gscale, c->N, c->dt, c->alpha, c->gamma, c->red);
        return fl_sigmoid_focal_fused_cpu(loss, dx, x, y, glp, c->gscale, c->N, c->dt, c->alpha, c->gamma, c->red, ws,
                                          wsb);
    }
    if (pass == 0) return fl_bce_with_logits_forward_cpu(loss, x, y, wp, pwp, c->N, c->C, c->dt, c->red, ws, wsb);
    if (pass == 1)
        return fl_bce_with_logits_backward_cpu(dx, x, y, wp, pwp, glp, c->gscale, c->N, c->C, c->dt, c->red);
    return fl_bce_with_logits_fused_cpu(loss, dx, x, y, wp, pwp, glp, c->gscale, c->N, c->C, c->dt, c->red, ws, wsb);
}

static void run_cfg(const cfg_t* c, uint64_t seed) {
    const int64_t n = c->N * c->C;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    tu_rng r = tu_rng_seed(seed);
    void* x = tu_xmalloc((size_t)n * es);
    void* y = tu_xmalloc((size_t)n * es);
    float* w = tu_xmalloc((size_t)c->C * 4);
    float* pw = tu_xmalloc((size_t)c->C * 4);
    float* gl = tu_xmalloc((size_t)(n + 1) * 4);
    fill(c, &r, x, y, w, pw, gl);
    size_t wsb = 0;
    fl_status st = c->bce ? fl_bce_with_logits_workspace_size(&wsb, c->N, c->C) : fl_sigmoid_focal_workspace_size(&wsb, n);
    CHECK_STATUS(st, FL_OK, "workspace_size");
    void* ws = tu_xmalloc(wsb);
    const int64_t nl = none ? n : 1;
    float* loss = tu_xmalloc((size_t)(nl + 1) * 4);
    float* loss2 = tu_xmalloc((size_t)(nl + 1) * 4);
    void* dx = tu_xmalloc((size_t)n * es + 16);
    void* dx2 = tu_xmalloc((size_t)n * es + 16);
    double *got = tu_xmalloc((size_t)(n + 1) * 8), *ref = tu_xmalloc((size_t)(n + 1) * 8),
           *sl = tu_xmalloc((size_t)(n + 1) * 8);
    char name[200];
    snprintf(name, sizeof name, "%s a=%g g=%g w=%d pw=%d N=%lld C=%lld %s red=%d soft=%d gl=%d gs=%g",
             c->bce ? "bce" : "focal", c->alpha, c->gamma, c->use_w, c->use_pw, (long long)c->N, (long long)c->C,
             tu_dtype_name(c->dt), (int)c->red, c->soft, c->with_gl, c->gscale);

    /* reference values (long double on the rounded inputs) */
    LD sum = 0, sumabs = 0;
    LD g0 = (LD)c->gscale * (c->with_gl ? gl[0] : 1);
    if (c->red == FL_REDUCTION_MEAN) g0 /= (LD)n;
    double* lref = tu_xmalloc((size_t)(n + 1) * 8);
    double* lsl = tu_xmalloc((size_t)(n + 1) * 8);
    for (int64_t k = 0; k < n; k++) {
        LD xv = tu_load(x, c->dt, k), yv = tu_load(y, c->dt, k);
        int64_t j = k % c->C;
        LD l, d, fac;
        if (!c->bce) {
            l = focal_l(xv, yv, c->alpha, c->gamma);
            d = focal_d(xv, yv, c->alpha, c->gamma);
            LD q = sigm(xv) * (1 - yv) + sigm(-xv) * yv;
            LD a = c->alpha >= 0 ? c->alpha * yv + (1 - c->alpha) * (1 - yv) : 1;
            fac = fabsl(a) * (c->gamma == 0 ? 1 : powl(q, c->gamma)) * (1 + c->gamma);
        } else {
            LD wv = c->use_w ? w[j] : 1, pv = c->use_pw ? pw[j] : 1;
            l = bce_l(xv, yv, wv, pv);
            d = bce_d(xv, yv, wv, pv);
            fac = fabsl(wv) * (1 + pv);
        }
        lref[k] = (double)l;
        lsl[k] = 0.0;   /* the library's BCE has no cancellation (header section 9) */
        sum += l;
        sumabs += fabsl(l) * (RTOL_SUM + RTOL_LOSS) + lsl[k];
        LD g = none ? (LD)c->gscale * (c->with_gl ? gl[k] : 1) : g0;
        ref[k] = (double)(g * d);
        sl[k] = SLACK * (double)(fabsl(g) * fac);   /* p (1 - y) - (1 - p) y cancels for soft y */
    }
    for (int pass = 0; pass < 3; pass++) {
        const char* pn[3] = {"forward", "backward", "fused"};
        char nm[260];
        tu_poison(loss, (size_t)(nl + 1) * 4);
        tu_poison(dx, (size_t)n * es + 16);
        st = call(c, pass, pass == 1 ? NULL : loss, pass == 0 ? NULL : dx, x, y, w, pw, gl, ws, wsb);
        snprintf(nm, sizeof nm, "%s %s", name, pn[pass]);
        if (!CHECK_STATUS(st, FL_OK, nm)) continue;
        if (pass != 1) {
            if (none) {
                for (int64_t k = 0; k < n; k++) got[k] = loss[k];
                snprintf(nm, sizeof nm, "%s %s loss", name, pn[pass]);
                check_close_ex(nm, got, lref, lsl, n, ATOL_LOSS, RTOL_LOSS);
            } else {
                double rs = (double)(c->red == FL_REDUCTION_MEAN ? (n ? sum / n : NAN) : sum);
                double tol = (double)(sumabs / (c->red == FL_REDUCTION_MEAN && n ? n : 1)) + 1e-30;
                got[0] = loss[0];
                snprintf(nm, sizeof nm, "%s %s loss", name, pn[pass]);
                check_close_ex(nm, got, &rs, &tol, 1, ATOL_LOSS, RTOL_LOSS);
            }
            CHECK(tu_is_poison(loss, 4, nl), "%s: loss guard overwritten", nm);
        }
        if (pass != 0) {
            for (int64_t k = 0; k < n; k++) got[k] = tu_load(dx, c->dt, k);
            snprintf(nm, sizeof nm, "%s %s dx", name, pn[pass]);
            check_close_ex(nm, got, ref, sl, n, ATOL_DX[c->dt], RTOL_DX[c->dt]);
            CHECK(tu_is_poison((char*)dx + (size_t)n * es, 1, 0), "%s: dx guard overwritten", nm);
        }
        if (pass == 1) memcpy(dx2, dx, (size_t)n * es);
        if (pass == 0) memcpy(loss2, loss, (size_t)nl * 4);
    }
    /* fused == forward + backward, bitwise (the same element math) */
    snprintf(name + strlen(name), sizeof name - strlen(name), " fused==fwd+bwd");
    check_bitwise(name, loss, loss2, (size_t)nl * 4);
    check_bitwise(name, dx, dx2, (size_t)n * es);
    /* in place: dlogits == logits */
    if (n > 0) {
        void* xc = tu_xmalloc((size_t)n * es);
        memcpy(xc, x, (size_t)n * es);
        st = call(c, 2, loss, xc, xc, y, w, pw, gl, ws, wsb);
        CHECK_STATUS(st, FL_OK, "in place fused");
        check_bitwise("  in place (dlogits == logits) == separate", xc, dx2, (size_t)n * es);
        free(xc);
    }
    free(x); free(y); free(w); free(pw); free(gl); free(ws); free(loss); free(loss2); free(dx); free(dx2);
    free(got); free(ref); free(sl); free(lref); free(lsl);
}

/* ---- finite differences of the references' gradients ---------------------------------------- */
static void test_fd(void) {
    tu_rng r = tu_rng_seed(7);
    const float gammas[5] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f};
    double got[400], ref[400];
    int m = 0;
    for (int i = 0; i < 80; i++) {
        LD x = 4 * tu_normal(&r), y = (i & 1) ? tu_uniform(&r) : (LD)(i & 2 ? 1 : 0);
        LD gamma = gammas[i % 5], alpha = (i % 3 == 0) ? -1 : 0.3;
        LD h = 1e-7L * (1 + fabsl(x));
        LD fd = (focal_l(x + h, y, alpha, gamma) - focal_l(x - h, y, alpha, gamma)) / (2 * h);
        got[m] = (double)focal_d(x, y, alpha, gamma);
        ref[m++] = (double)fd;
        LD w = 0.5 + tu_uniform(&r), pw = 0.3 + 3 * tu_uniform(&r);
        fd = (bce_l(x + h, y, w, pw) - bce_l(x - h, y, w, pw)) / (2 * h);
        got[m] = (double)bce_d(x, y, w, pw);
        ref[m++] = (double)fd;
    }
    check_close("finite differences: analytic focal / bce gradients (long double)", got, ref, m, 1e-9, 1e-7);
    /* and the library's fp32 gradient against the same finite differences, soft targets */
    m = 0;
    for (int i = 0; i < 60; i++) {
        float x = (float)(3 * tu_normal(&r)), y = (float)tu_uniform(&r);
        float gamma = gammas[i % 5], alpha = 0.25f, l, d;
        fl_status st = fl_sigmoid_focal_backward_cpu(&d, &x, &y, NULL, 1.0f, 1, FL_DTYPE_F32, alpha, gamma,
                                                     FL_REDUCTION_SUM);
        (void)l;
        CHECK_STATUS(st, FL_OK, "fd focal backward");
        LD h = 1e-7L * (1 + fabsl((LD)x));
        got[m] = d;
        ref[m++] = (double)((focal_l((LD)x + h, y, alpha, gamma) - focal_l((LD)x - h, y, alpha, gamma)) / (2 * h));
    }
    check_close("finite differences vs fl_sigmoid_focal_backward_cpu (fp32)", got, ref, m, 1e-7, 4e-6);
}

/* ---- closed forms and edges ----------------------------------------------------------------- */
static void test_values(void) {
    float x = 0.0f, y = 1.0f, l, d;
    size_t wsb;
    fl_sigmoid_focal_workspace_size(&wsb, 1);
    void* ws = tu_xmalloc(wsb);
    /* x = 0, y = 1: p = 1/2, bce = ln 2, l = 0.25 * ln2 * 0.25; d = 0.25*(-0.5*0.25 + 2 ln2 (-1) 0.25 * 0.5) */
    CHECK_STATUS(fl_sigmoid_focal_forward_cpu(&l, &x, &y, 1, FL_DTYPE_F32, 0.25f, 2.0f, FL_REDUCTION_SUM, ws, wsb), FL_OK, "focal x=0");
    CHECK(fabs(l - 0.25 * LN2_ * 0.25) < 1e-7, "focal(0, 1) = %.9g, want %.9g", l, 0.25 * LN2_ * 0.25);
    CHECK_STATUS(fl_sigmoid_focal_backward_cpu(&d, &x, &y, NULL, 1.0f, 1, FL_DTYPE_F32, 0.25f, 2.0f, FL_REDUCTION_SUM), FL_OK, "focal' x=0");
    double dw = 0.25 * (-0.5 * 0.25 - 2 * LN2_ * 0.25 * 0.5);
    CHECK(fabs(d - dw) < 1e-7, "focal'(0, 1) = %.9g, want %.9g", d, dw);
    CHECK_STATUS(fl_bce_with_logits_forward_cpu(&l, &x, &y, NULL, NULL, 1, 1, FL_DTYPE_F32, FL_REDUCTION_MEAN, ws, wsb), FL_OK, "bce x=0");
    CHECK(fabs(l - LN2_) < 1e-7, "bce(0, 1) = %.9g, want ln 2", l);

    /* x = +-1e4, +-inf, NaN; the NaN table of PyTorch's autograd (float64, CPU; see the header) */
    const float X[8] = {1e4f, -1e4f, 1e4f, -1e4f, INFINITY, -INFINITY, NAN, 40.0f};
    const float Y[8] = {1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.5f, 1.0f};
    const float G[4] = {0.0f, 0.5f, 1.0f, 2.0f};
    /* expected loss / dx classes: 'z' zero, 'n' NaN, 'f' finite nonzero; [gamma][element] */
    const char* WL[4] = {"zzffnnnf", "zzffnnnf", "zzffnnnf", "zzffnnnz"};
    const char* WD[4] = {"zzffzznf", "nnffnnnf", "zzffnnnf", "zzffnnnz"};
    for (int g = 0; g < 4; g++) {
        float L[8], D[8];
        CHECK_STATUS(fl_sigmoid_focal_fused_cpu(L, D, X, Y, NULL, 1.0f, 8, FL_DTYPE_F32, 0.25f, G[g], FL_REDUCTION_NONE, NULL, 0), FL_OK, "edges");
        for (int k = 0; k < 8; k++) {
            char cl = isnan(L[k]) ? 'n' : L[k] == 0.0f ? 'z' : 'f', cd = isnan(D[k]) ? 'n' : D[k] == 0.0f ? 'z' : 'f';
            /* x = 40, y = 1: fp32 does not saturate (finite; torch fp32 / float64 do: see the header);
             * with gamma = 2 the value (~1e-53) underflows fp32 to 0 */
            CHECK(cl == WL[g][k] && cd == WD[g][k], "focal edge gamma=%g x=%g y=%g: loss %g dx %g, want classes %c %c",
                  G[g], X[k], Y[k], L[k], D[k], WL[g][k], WD[g][k]);
            if (k >= 2 && k <= 3) {   /* the large misclassified: loss = a * 1e4, dx = a * (+-1) */
                double a = Y[k] == 1.0f ? 0.25 : 0.75;
                CHECK(fabs(L[k] - a * 1e4) <= 1e-3 && fabs(fabs(D[k]) - a) <= 1e-6, "focal edge misclassified: %g %g", L[k], D[k]);
            }
        }
    }
    /* bce edges: x = +-1e4 exact values; x = inf, y = 1 -> loss NaN (torch), dx = 0 */
    {
        const float bx[4] = {1e4f, -1e4f, INFINITY, 1e4f}, by[4] = {0.0f, 1.0f, 1.0f, 0.3f};
        float L[4], D[4];
        CHECK_STATUS(fl_bce_with_logits_fused_cpu(L, D, bx, by, NULL, NULL, NULL, 1.0f, 4, 1, FL_DTYPE_F32, FL_REDUCTION_NONE, NULL, 0), FL_OK, "bce edges");
        CHECK(L[0] == 1e4f && L[1] == 1e4f && isnan(L[2]) && fabsf(L[3] - 7e3f) <= 1e-3f, "bce edge losses %g %g %g %g", L[0], L[1], L[2], L[3]);
        CHECK(D[0] == 1.0f && D[1] == -1.0f && D[2] == 0.0f && fabsf(D[3] - 0.7f) < 1e-7f, "bce edge dx %g %g %g %g", D[0], D[1], D[2], D[3]);
    }
    /* n = 0: SUM 0, MEAN NaN, NONE nothing (NULL arrays fine) */
    {
        float L = 5.0f;
        CHECK_STATUS(fl_sigmoid_focal_forward_cpu(&L, NULL, NULL, 0, FL_DTYPE_BF16, 0.25f, 2.0f, FL_REDUCTION_SUM, ws, wsb), FL_OK, "n=0 sum");
        CHECK(L == 0.0f, "n = 0 SUM = %g", L);
        CHECK_STATUS(fl_bce_with_logits_forward_cpu(&L, NULL, NULL, NULL, NULL, 0, 3, FL_DTYPE_F16, FL_REDUCTION_MEAN, ws, wsb), FL_OK, "n=0 mean");
        CHECK(isnan(L), "n = 0 MEAN = %g (want NaN)", L);
        L = 5.0f;
        CHECK_STATUS(fl_sigmoid_focal_fused_cpu(&L, NULL, NULL, NULL, NULL, 1.0f, 0, FL_DTYPE_F32, 0.25f, 2.0f, FL_REDUCTION_NONE, NULL, 0), FL_OK, "n=0 none");
        CHECK(L == 5.0f, "n = 0 NONE wrote the loss");
        CHECK_STATUS(fl_bce_with_logits_backward_cpu(NULL, NULL, NULL, NULL, NULL, NULL, 1.0f, 0, 3, FL_DTYPE_F32, FL_REDUCTION_MEAN), FL_OK, "n=0 bwd");
    }
    free(ws);
}

/* ---- the shared first steps over their whole range ------------------------------------------
 * e = exp(-|x|) in (0, 1], log1p(e) (the atanh series of elementwise_math.h) and 1 / (1 + e), over
 * a dense grid of x in [0, 87] (every normal fp32 e = exp(-x): beyond, e is subnormal and holds few
 * bits, so a relative bound has no meaning there; the other tests cover x up to 1e4 and inf): BCE with y = 1, x >= 0 is exactly
 * sp = log1p(e) (its other term is 0) and its gradient -(1 - p) = -e r; y = 0, x >= 0 is x + sp
 * with gradient p = r. Relative to long double, no slack (no cancellation): GRID_RTOL, 2.7 fp32
 * ulps (measured 2.6e-7; dropping the series' last term gives 3.7e-7 and fails). */
#define GRID_RTOL 3.2e-7
static void test_log1p_grid(void) {
    const int64_t n = 400001;
    float* x = tu_xmalloc((size_t)n * 4);
    float* y1 = tu_xmalloc((size_t)n * 4);
    float* y0 = tu_xmalloc((size_t)n * 4);
    float* L = tu_xmalloc((size_t)n * 4);
    float* D = tu_xmalloc((size_t)n * 4);
    for (int64_t k = 0; k < n; k++) {
        /* denser near 0 (e ~ 1, where s is largest), then up to 87 (e ~ 1.6e-38) */
        const double t = (double)k / (double)(n - 1);
        x[k] = (float)(87.0 * t * t);
        y1[k] = 1.0f;
        y0[k] = 0.0f;
    }
    double worst_l = 0, worst_d = 0;
    for (int side = 0; side < 2; side++) {
        const float* y = side ? y0 : y1;
        CHECK_STATUS(fl_bce_with_logits_fused_cpu(L, D, x, y, NULL, NULL, NULL, 1.0f, n, 1, FL_DTYPE_F32,
                                                  FL_REDUCTION_NONE, NULL, 0), FL_OK, "log1p grid");
        for (int64_t k = 0; k < n; k++) {
            const LD e = expl(-(LD)x[k]);
            const LD sp = log1pl(e), r = 1.0L / (1.0L + e);
            const LD wl = side ? (LD)x[k] + sp : sp, wd = side ? r : -e * r;
            const double el = (double)fabsl(((LD)L[k] - wl) / wl), ed = (double)fabsl(((LD)D[k] - wd) / wd);
            if (el > worst_l) worst_l = el;
            if (ed > worst_d) worst_d = ed;
        }
    }
    CHECK(worst_l <= GRID_RTOL, "log1p(exp(-x)) over [0, 87]: worst relative error %.3g (want <= %.3g)", worst_l, GRID_RTOL);
    CHECK(worst_d <= GRID_RTOL, "sigmoid over [0, 87]: worst relative error %.3g (want <= %.3g)", worst_d, GRID_RTOL);
    printf("log1p / sigmoid grid: worst relative errors %.3g (loss), %.3g (dx)\n", worst_l, worst_d);
    free(x); free(y1); free(y0); free(L); free(D);
}

/* ---- the reduction does not depend on the thread count ------------------------------------- */
static void test_threads(void) {
#ifdef _OPENMP
    const int64_t n = 3000001;
    float* x = tu_xmalloc((size_t)n * 4);
    float* y = tu_xmalloc((size_t)n * 4);
    tu_rng r = tu_rng_seed(3);
    for (int64_t k = 0; k < n; k++) { x[k] = (float)(3 * tu_normal(&r)); y[k] = (float)tu_uniform(&r); }
    size_t wsb;
    fl_sigmoid_focal_workspace_size(&wsb, n);
    void* ws = tu_xmalloc(wsb);
    float a, b;
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    CHECK_STATUS(fl_sigmoid_focal_forward_cpu(&a, x, y, n, FL_DTYPE_F32, 0.25f, 2.0f, FL_REDUCTION_MEAN, ws, wsb), FL_OK, "1 thread");
    omp_set_num_threads(nt > 1 ? nt : 4);
    CHECK_STATUS(fl_sigmoid_focal_forward_cpu(&b, x, y, n, FL_DTYPE_F32, 0.25f, 2.0f, FL_REDUCTION_MEAN, ws, wsb), FL_OK, "n threads");
    omp_set_num_threads(nt);
    check_bitwise("MEAN with 1 thread == with many (n = 3000001)", &a, &b, 4);
    free(x); free(y); free(ws);
#endif
}

/* ---- bad arguments ---------------------------------------------------------------------------- */
#define EXPECT(call_, want, what)                                                                        \
    do {                                                                                                 \
        fl_status s_ = (call_);                                                                          \
        CHECK_STATUS(s_, want, what);                                                                    \
        if ((want) != FL_OK)                                                                             \
            CHECK(strstr(fl_last_error(), fnname) != NULL, "%s: message \"%s\" does not name %s", what,  \
                  fl_last_error(), fnname);                                                              \
    } while (0)

static void test_errors(void) {
    float xb[16] = {0}, yb[16] = {0}, L[16], D[16], w[4] = {1, 1, 1, 1};
    size_t wsb;
    fl_sigmoid_focal_workspace_size(&wsb, 16);
    char* ws = tu_xmalloc(wsb + 8);
    const char* fnname = "fl_sigmoid_focal_forward_cpu";
    EXPECT(fl_sigmoid_focal_forward_cpu(NULL, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "loss NULL");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, NULL, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "logits NULL");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, NULL, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "targets NULL");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, -1, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "n < 0");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, (fl_dtype)7, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "dtype");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, (fl_reduction)3, NULL, 0), FL_ERR_INVALID_ARGUMENT, "reduction");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, -0.5f, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "gamma < 0");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, NAN, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "gamma NaN");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, INFINITY, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "alpha inf");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_MEAN, ws, 8), FL_ERR_INSUFFICIENT_WORKSPACE, "small workspace");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_MEAN, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_OK, "no workspace for NONE");
    EXPECT(fl_sigmoid_focal_forward_cpu((float*)((char*)L + 1), xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "loss misaligned");
    EXPECT(fl_sigmoid_focal_forward_cpu(xb + 2, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "loss overlaps logits");
    EXPECT(fl_sigmoid_focal_forward_cpu(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_SUM, (void*)xb, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps logits");
    fnname = "fl_sigmoid_focal_backward_cpu";
    EXPECT(fl_sigmoid_focal_backward_cpu(D, xb, yb, NULL, INFINITY, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "grad_scale inf");
    EXPECT(fl_sigmoid_focal_backward_cpu(NULL, xb, yb, NULL, 1, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "dlogits NULL");
    EXPECT(fl_sigmoid_focal_backward_cpu(yb, xb, yb, NULL, 1, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "dlogits == targets");
    EXPECT(fl_sigmoid_focal_backward_cpu(xb + 1, xb, yb, NULL, 1, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps logits");
    EXPECT(fl_sigmoid_focal_backward_cpu(D, xb, yb, D + 2, 1, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps grad_loss");
    EXPECT(fl_sigmoid_focal_backward_cpu((char*)D + 1, (char*)xb + 1, yb, NULL, 1, 4, FL_DTYPE_F16, 0.25f, 2, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "f16 misaligned");
    fnname = "fl_sigmoid_focal_fused_cpu";
    EXPECT(fl_sigmoid_focal_fused_cpu(L, L, xb, yb, NULL, 1, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "loss == dlogits");
    fnname = "fl_bce_with_logits_forward_cpu";
    EXPECT(fl_bce_with_logits_forward_cpu(L, xb, yb, NULL, NULL, 2, 0, FL_DTYPE_F32, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "C < 1");
    EXPECT(fl_bce_with_logits_forward_cpu(L, xb, yb, NULL, NULL, INT64_MAX / 2, 4, FL_DTYPE_F32, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "N*C overflow");
    EXPECT(fl_bce_with_logits_forward_cpu(L, xb, yb, L, NULL, 2, 4, FL_DTYPE_F32, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "loss overlaps weight");
    EXPECT(fl_bce_with_logits_forward_cpu(L, xb, yb, (float*)((char*)w + 2), NULL, 2, 2, FL_DTYPE_F32, FL_REDUCTION_NONE, NULL, 0), FL_ERR_INVALID_ARGUMENT, "weight misaligned");
    fnname = "fl_bce_with_logits_backward_cpu";
    EXPECT(fl_bce_with_logits_backward_cpu(D, xb, yb, NULL, w, NULL, NAN, 2, 2, FL_DTYPE_F32, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "grad_scale NaN");
    EXPECT(fl_bce_with_logits_backward_cpu(w, xb, yb, NULL, w + 1, NULL, 1, 2, 2, FL_DTYPE_F32, FL_REDUCTION_NONE), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps pos_weight");
    fnname = "fl_bce_with_logits_fused_cpu";
    EXPECT(fl_bce_with_logits_fused_cpu(L, D, xb, yb, NULL, NULL, NULL, 1, 2, 2, FL_DTYPE_F32, FL_REDUCTION_SUM, ws, 0), FL_ERR_INSUFFICIENT_WORKSPACE, "fused ws");
    fnname = "fl_sigmoid_focal_workspace_size";
    EXPECT(fl_sigmoid_focal_workspace_size(NULL, 3), FL_ERR_INVALID_ARGUMENT, "bytes NULL");
    EXPECT(fl_sigmoid_focal_workspace_size(&wsb, -3), FL_ERR_INVALID_ARGUMENT, "n < 0");
    fnname = "fl_bce_with_logits_workspace_size";
    EXPECT(fl_bce_with_logits_workspace_size(&wsb, 3, 0), FL_ERR_INVALID_ARGUMENT, "C < 1");
    {
        size_t a = 0, b = 0, c = 0;
        fl_sigmoid_focal_workspace_size(&a, 0);
        fl_sigmoid_focal_workspace_size(&b, (int64_t)1 << 40);
        fl_bce_with_logits_workspace_size(&c, 1000, 10);
        CHECK(a > 0 && b <= 8448 && c == 256 + 256, "workspace sizes %zu %zu %zu", a, b, c);
    }
#ifndef FL_WITH_CUDA
    fnname = "fl_sigmoid_focal_forward_cuda";
    EXPECT(fl_sigmoid_focal_forward_cuda(L, xb, yb, 4, FL_DTYPE_F32, 0.25f, 2, FL_REDUCTION_NONE, NULL, 0, NULL), FL_ERR_NOT_BUILT, "not built");
    fnname = "fl_bce_with_logits_fused_cuda";
    EXPECT(fl_bce_with_logits_fused_cuda(L, D, xb, yb, NULL, NULL, NULL, 1, 2, 2, FL_DTYPE_F32, FL_REDUCTION_NONE, NULL, 0, NULL), FL_ERR_NOT_BUILT, "not built");
#endif
    free(ws);
}

int main(void) {
    test_fd();
    test_values();
    test_log1p_grid();
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    const float fa[6][2] = {{0.25f, 2.0f}, {-1.0f, 2.0f}, {0.25f, 0.0f}, {0.25f, 0.5f}, {0.7f, 1.0f}, {0.25f, 1.5f}};
    const int64_t ns[4] = {1, 7, 1000, 12345};
    uint64_t seed = 1;
    tu_quiet = 1;
    for (int d = 0; d < 3; d++)
        for (int rr = 0; rr < 3; rr++)
            for (int f = 0; f < 6; f++)
                for (int s = 0; s < 2; s++)
                    for (int ni = 0; ni < 4; ni++) {
                        cfg_t c = {0, fa[f][0], fa[f][1], 0, 0, ns[ni], 1, dts[d], reds[rr], s, (int)(seed & 1),
                                   (seed % 3) ? 1.0f : 0.5f, ni == 3 ? 8.0 : 3.0};
                        run_cfg(&c, seed++);
                    }
    const int64_t bn[4][2] = {{1, 1}, {3, 5}, {64, 33}, {100, 64}};
    for (int d = 0; d < 3; d++)
        for (int rr = 0; rr < 3; rr++)
            for (int wv = 0; wv < 4; wv++)
                for (int s = 0; s < 2; s++)
                    for (int ni = 0; ni < 4; ni++) {
                        cfg_t c = {1, 0, 0, wv & 1, wv >> 1, bn[ni][0], bn[ni][1], dts[d], reds[rr], s, (int)(seed & 1),
                                   (seed % 3) ? 1.0f : 0.5f, ni == 3 ? 8.0 : 3.0};
                        run_cfg(&c, seed++);
                    }
    tu_quiet = 0;
    test_threads();
    test_errors();
    return tu_finish();
}
