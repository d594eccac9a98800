/* test_softmax_focal_cuda.c — the CUDA softmax (multi-class) focal loss on logits [N, C, d]
 * (include/fusedloss.h section 12) against the CPU backend (the reference, itself checked against
 * a long-double reference and finite differences by tests/test_softmax_focal.c).
 *
 * Grid: dtypes f32 / f16 / bf16 x gamma 0 / 0.5 / 2 / 3.5 x alpha NULL / per class (device array;
 * values in [0.1, 2]) x reductions NONE / SUM / MEAN x targets (int64 some ignored, int32 some
 * ignored, int64 none ignored, int32 all ignored) x pass (forward, fused with grad_loss NULL / a
 * device value (per position for NONE) / in place, loss NULL in some fused cases) x layouts: rows
 * (d = 1; (N, C, ld) from (1, 1, 1) to C = 50257, rows crossing the 8192-column chunks, ld > C, odd
 * ld) and maps (d > 1: (N, C, d) = (2, 19, 1000), (1, 3, 7), (4, 5, 64), (2, 19, 65536), (3, 100, 33)
 * with ld = C d + 5) x a logits pointer one element off its 16-byte phase (the scalar path).
 * Logits 3 x (about normal: a centred sum of two uniforms, variance 1); positions with a dominant
 * target logit (max + 25: 1 - p_y ~ 1e-11; 1000: 1 - p_y == 0 even in double, the gamma < 1 limit
 * must give a finite gradient) and with a tiny p_y (min - 20); the 2.5M-element map runs half the
 * variants (host time). Ignored positions hold NaN logits (never read). Outputs poisoned (0xFF bytes:
 * NaN in every dtype) before every call; every dlogits element outside the first C d columns of a
 * batch row (padding, the guards around the tensor) must stay poisoned, or keep the input's value
 * in place; a forward / out-of-place call must leave the logits intact; a valid call must leave
 * the device error flag 0. Plus: two runs bitwise equal (determinism), CUDA graph capture + replay
 * bitwise equal to eager, out-of-range targets (that position's loss and gradient NaN, the flag
 * set, the other positions right, the context still usable), N = 0, bad arguments.
 *
 * Tolerances (GPU fp32 vs CPU double on the same dtype-rounded logits; per position this test
 * recomputes in double lse, L = -log p_y, q = 1 - p_y = -expm1(-L) and F(L), F the gradient
 * factor of the header: F = -(q^g + g q^(g-1) p_y L), so that l = a q^g L has dl/dL = -a F and
 * |F| <= (1 + g) q^g since p_y L / q = L / (e^L - 1) <= 1):
 *   L on the GPU is an fp32 difference of merged statistics: |dL| <= dL = 2e-6 (1 + |lse| + |x_y|)
 *          (~16 fp32 ulps of both terms).
 *   loss (per position): |d| <= a dL Fhi + 1e-5 |ref|, Fhi = (1 + g) q(L + dL)^g >= max |F| over
 *          [L - dL, L + dL] (q^g increases with L): the mean value theorem on l(L). For a confident
 *          position (q << dL) this is what fp32 can give, (1 + g) dL^(1+g); a reduction takes the
 *          sum of its positions' bounds (/ D for MEAN).
 *   dlogits[c] = g a F (delta_cy - p_c): |d| <= 1 ulp of the dtype (rtol) + |g| a (dF w_c + Fhi e_c),
 *          dF = 2 max(|F(L + dL) - F(L)|, |F(L) - F(L - dL)|) (F's change over the interval; x2 for
 *          the curvature and the GPU's own rounding), w_c = p_c (c != y) or q (c == y), and the
 *          error of w_c: e_c = p_c 4e-6 (1 + |lse| + |x_c|) (exp2 of an argument carrying ~ulp(lse) +
 *          ulp(x_c)) for c != y, 2 dL for c == y (q from L, or 1 - p_y: absolute); c != y also
 *          + |g| a (dF + Fhi) 2^-126 (p_c below 2^-126 may be flushed to 0: ex2.approx.ftz).
 *   atol: f16 6e-8 (subnormals below 6.1e-5 have spacing 2^-24), f32 / bf16 2^-126 (fp32 subnormals:
 *          exp2f loses bits there, or flushes to 0); ignored positions exactly 0.
 * Run:   build/test_softmax_focal_cuda [--small]   (--small: N * ld <= 2^18 and half the variants, for
 *        compute-sanitizer)
 * SPDX-License-Identifier: MIT
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "cuda_check.h"
#include "zoo_test_util.h"

static const double RTOL_D[3] = {2e-6, 9.8e-4, 7.9e-3};   /* dlogits: 1 ulp of f32 (x16) / f16 / bf16 */
/* atol: f16 subnormals (< 6.1e-5) have spacing 2^-24; f32 / bf16 results below 2^-126 (FLT_MIN) are
 * fp32 subnormals, where exp2f loses bits or a flush-to-zero build gives 0 */
static const double ATOL_D[3] = {1.1754944e-38, 6e-8, 1.1754944e-38};
static const double ATOL_LOSS = 2e-6, RTOL_LOSS = 1e-5;   /* dL's constant; the loss's rtol */
static const double SLACK_D = 4e-6;                        /* e_c's fp32 constant */

static int g_small = 0;
static cudaStream_t g_stream;

typedef struct {
    fl_dtype dt;
    float gamma;
    int use_alpha;
    fl_reduction red;
    int targets;  /* 0 int64 some ignored, 1 int32 some ignored, 2 int64 none ignored, 3 int32 all ignored */
    int pass;     /* 0 forward, 1 fused grad NULL, 2 fused grad value(s) on the device, 3 fused in place */
    int noloss;   /* fused: loss NULL */
    int64_t N, C, d, ld;
    int xoff;     /* logits (and dlogits) element offset: 1 = off the 16-byte phase */
} cfg_t;

static fl_index_dtype idx_dtype(const cfg_t* c) { return (c->targets & 1) ? FL_INDEX_I32 : FL_INDEX_I64; }

static fl_focal_options make_opts(const cfg_t* c, const float* alpha, int32_t* flag) {
    fl_focal_options o = FL_FOCAL_OPTIONS_INIT;
    o.gamma = c->gamma;
    o.alpha = c->use_alpha ? alpha : NULL;
    o.reduction = c->red;
    o.error_flag = flag;
    return o;
}

/* One call on either backend (pointers of that backend). */
static fl_status call_focal(const cfg_t* c, int cuda, float* loss, void* dx, const void* x, const void* tg,
                            const float* gl, float gs, const fl_focal_options* o, void* ws, size_t wsb) {
    const fl_index_dtype it = idx_dtype(c);
    if (c->pass == 0)
        return cuda ? fl_softmax_focal_forward_cuda(loss, x, c->ld, tg, it, c->N, c->C, c->d, c->dt, o, ws, wsb,
                                                    (fl_stream)g_stream)
                    : fl_softmax_focal_forward_cpu(loss, x, c->ld, tg, it, c->N, c->C, c->d, c->dt, o, ws, wsb);
    return cuda ? fl_softmax_focal_fused_cuda(loss, dx, x, c->ld, tg, it, gl, gs, c->N, c->C, c->d, c->dt, o, ws,
                                              wsb, (fl_stream)g_stream)
                : fl_softmax_focal_fused_cpu(loss, dx, x, c->ld, tg, it, gl, gs, c->N, c->C, c->d, c->dt, o, ws, wsb);
}

/* element (position p, class k) of the logits: pos_base(p) + k d */
static int64_t pos_base(const cfg_t* c, int64_t p) { return (p / c->d) * c->ld + p % c->d; }
static int64_t elem(const cfg_t* c, int64_t p, int64_t k) { return pos_base(c, p) + k * c->d; }

/* ------------------------------------------------------------------------------------------
 * The position statistics in double, for the tolerances
 * ---------------------------------------------------------------------------------------- */
/* F(L) = -(q^g + g q^g (p L / q)), q = 1 - e^-L, p = e^-L: the header's factor (limits at q = 0) */
static double focal_F(double gamma, double L) {
    if (L < 0.0) L = 0.0;
    if (gamma == 0.0) return -1.0;
    const double q = -expm1(-L);
    if (q == 0.0) return 0.0;
    const double qg = pow(q, gamma);
    return -(qg + gamma * qg * (exp(-L) * L / q));
}

typedef struct {
    int ign;
    double a, xy, lse, L, q, dL, Fhi, dF;
} posstat;

/* buf: C doubles of scratch */
static void pos_stats(const cfg_t* c, const void* x, const float* alpha, int64_t p, int64_t y, double* buf,
                      posstat* r) {
    memset(r, 0, sizeof *r);
    if (y == -100) { r->ign = 1; return; }
    const double g = c->gamma;
    const int64_t base = pos_base(c, p);
    r->a = c->use_alpha ? fabs((double)alpha[y]) : 1.0;
    double m = -INFINITY, so = 0.0;
    for (int64_t k = 0; k < c->C; k++) {
        buf[k] = tu_load(x, c->dt, base + k * c->d);
        if (buf[k] > m) m = buf[k];
    }
    r->xy = buf[y];
    for (int64_t k = 0; k < c->C; k++)
        if (k != y) so += exp(buf[k] - m);
    r->lse = m + log(so + exp(r->xy - m));
    r->L = r->xy == m ? log1p(so) : r->lse - r->xy;
    r->q = -expm1(-r->L);
    r->dL = ATOL_LOSS * (1.0 + fabs(r->lse) + fabs(r->xy));
    r->Fhi = (1.0 + g) * (g == 0.0 ? 1.0 : pow(-expm1(-(r->L + r->dL)), g));
    const double F0 = focal_F(g, r->L);
    const double d1 = fabs(focal_F(g, r->L + r->dL) - F0), d2 = fabs(F0 - focal_F(g, r->L - r->dL));
    r->dF = 2.0 * (d1 > d2 ? d1 : d2);
}

static double pos_loss_tol(const posstat* r) { return r->ign ? 0.0 : r->a * r->dL * r->Fhi; }

/* Losses: NONE per position (P entries), else the one reduced value (the bounds summed, / Dl). */
static int check_loss(const char* name, const cfg_t* c, const float* gpu, const float* cpu, const posstat* ps,
                      const unsigned char* skip, int64_t Dl) {
    const int64_t P = c->N * c->d;
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? P : 1;
    double* a = tu_xmalloc((size_t)(nl + 1) * 8);
    double* b = tu_xmalloc((size_t)(nl + 1) * 8);
    double* sl = tu_xmalloc((size_t)(nl + 1) * 8);
    double tot = 0.0;
    for (int64_t p = 0; p < P; p++) tot += pos_loss_tol(&ps[p]);
    int64_t n = 0;
    for (int64_t i = 0; i < nl; i++) {
        if (skip && skip[i]) continue;
        a[n] = gpu[i];
        b[n] = cpu[i];
        sl[n] = none ? pos_loss_tol(&ps[i]) : tot / (Dl ? (double)Dl : 1.0);
        n++;
    }
    const int ok = check_close_ex(name, a, b, sl, n, 0.0, RTOL_LOSS);
    free(a); free(b); free(sl);
    return ok;
}

/* The C elements of every position (gpu, cpu at the logits' offset), positions with skip[p] left
 * out; g[p]: the position's upstream gradient (grad_scale, grad_loss, / D folded in). */
static int check_grad(const char* name, const cfg_t* c, const void* gpu, const void* cpu, const void* x,
                      const int64_t* tg, const posstat* ps, const double* g, const unsigned char* skip) {
    const int64_t P = c->N * c->d, C = c->C;
    const size_t n = (size_t)P * (size_t)C;
    double* a = tu_xmalloc((n + 1) * 8);
    double* b = tu_xmalloc((n + 1) * 8);
    double* sl = tu_xmalloc((n + 1) * 8);
    int64_t k = 0;
    for (int64_t p = 0; p < P; p++) {
        if (skip && skip[p]) continue;
        const posstat* r = &ps[p];
        const double ga = fabs(g[p]) * r->a;
        const int64_t base = pos_base(c, p);
        for (int64_t cl = 0; cl < C; cl++, k++) {
            const int64_t e = base + cl * c->d;
            a[k] = tu_load(gpu, c->dt, e);
            b[k] = tu_load(cpu, c->dt, e);
            if (r->ign) { sl[k] = 0.0; continue; }
            if (cl == tg[p]) {
                sl[k] = ga * (r->dF * r->q + r->Fhi * 2.0 * r->dL);
            } else {
                const double xc = tu_load(x, c->dt, e), pc = exp(xc - r->lse);
                /* + the flush of a probability below 2^-126 to 0 (the staged kernel's ex2.approx.ftz);
                 * a masked (-inf) class: gradient 0 */
                sl[k] = isinf(xc) ? 0.0
                                  : ga * (pc * (r->dF + r->Fhi * SLACK_D * (1.0 + fabs(r->lse) + fabs(xc))) + (r->dF + r->Fhi) * 0x1p-126);
            }
        }
    }
    const int ok = check_close_ex(name, a, b, sl, k, ATOL_D[c->dt], RTOL_D[c->dt]);
    free(a); free(b); free(sl);
    return ok;
}

/* Every element of a dlogits buffer (ne elements) outside the first C d columns of the N batch
 * rows at offset xoff: poisoned (out of place) or the input's value (in place, in = the upload). */
static int64_t count_outside_written(const cfg_t* c, const void* buf, const void* in, int64_t ne) {
    const size_t es = tu_dtype_size(c->dt);
    int64_t bad = 0;
    for (int64_t k = 0, col = -c->xoff; k < ne; k++, col = col + 1 == c->ld ? 0 : col + 1) {
        if (col >= 0 && col < c->C * c->d && k - c->xoff < c->N * c->ld) continue;   /* col: k - xoff mod ld */
        if (in) bad += tu_bits(buf, c->dt, k) != tu_bits(in, c->dt, k);
        else bad += !tu_is_poison(buf, es, k);
    }
    return bad;
}

/* about normal(0, 1) and cheap (one draw): the sum of two 32-bit uniforms, centred, variance 1 */
static double approx_normal(tu_rng* r) {
    const uint64_t u = tu_next(r);
    return ((double)(u >> 32) + (double)(u & 0xFFFFFFFFu) - 4294967295.0) * (2.449489742783178 / 4294967296.0);
}

/* ------------------------------------------------------------------------------------------
 * One grid case
 * ---------------------------------------------------------------------------------------- */
static int run_case(const cfg_t* c, uint64_t seed, int graph) {
    const int64_t N = c->N, C = c->C, d = c->d, ld = c->ld, P = N * d;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? P : 1;
    const int fused = c->pass != 0, inplace = c->pass == 3;
    const int want_loss = !(fused && c->noloss);
    char name[300];
    snprintf(name, sizeof name,
             "%s gamma=%g alpha=%d red=%d tg=%d pass=%d noloss=%d N=%lld C=%lld d=%lld ld=%lld xoff=%d",
             tu_dtype_name(c->dt), c->gamma, c->use_alpha, (int)c->red, c->targets, c->pass, c->noloss, (long long)N,
             (long long)C, (long long)d, (long long)ld, c->xoff);
    tu_rng r = tu_rng_seed(seed);
    const int64_t ne = N * ld + 16;
    void* hx = tu_xmalloc((size_t)ne * es);
    int64_t* tg = tu_xmalloc((size_t)(P + 1) * 8);
    int64_t* lab64 = tu_xmalloc((size_t)(P + 1) * 8);
    int32_t* lab32 = tu_xmalloc((size_t)(P + 1) * 4);
    float* hgl = tu_xmalloc((size_t)(P + 1) * 4);
    float* halpha = tu_xmalloc((size_t)C * 4);
    for (int64_t k = 0; k < ne; k++) tu_store(hx, c->dt, k, (float)(3.0 * approx_normal(&r)));
    for (int64_t k = 0; k < C; k++) halpha[k] = (float)tu_uniform_in(&r, 0.1, 2.0);
    char* hxp = (char*)hx + (size_t)c->xoff * es;   /* the logits as the library sees them */
    for (int64_t p = 0; p < P; p++) {
        const int ign = c->targets == 3 || (c->targets != 2 && p % 3 == 1);
        tg[p] = ign ? -100 : tu_int_in(&r, 0, C - 1);
        if (ign) {
            for (int64_t k = 0; k < C; k++) tu_store(hxp, c->dt, elem(c, p, k), NAN);   /* never read */
        } else if (C > 1 && (p % 7 == 2 || p % 11 == 6 || p % 13 == 4)) {
            double mx = -INFINITY, mn = INFINITY;
            for (int64_t k = 0; k < C; k++) {
                const double v = tu_load(hxp, c->dt, elem(c, p, k));
                if (k == tg[p]) continue;
                if (v > mx) mx = v;
                if (v < mn) mn = v;
            }
            const double v = p % 7 == 2 ? mx + 25.0 : p % 11 == 6 ? 1000.0 : mn - 20.0;
            tu_store(hxp, c->dt, elem(c, p, tg[p]), (float)v);
        }
        if (!ign && C >= 64 && (p % 5 == 3 || (P < 5 && p == P - 1)))   /* masked classes (-inf) in runs of 32: whole vectors, and every
                                              * thread's first vector in some rows (the target stays finite) */
            for (int64_t k = 0; k < C; k++)
                if ((k / 32) % 3 == 0 && k != tg[p]) tu_store(hxp, c->dt, elem(c, p, k), -INFINITY);
        lab64[p] = tg[p];
        lab32[p] = (int32_t)tg[p];
        hgl[p] = (float)tu_uniform_in(&r, -2, 2);
    }
    lab64[P] = 0; lab32[P] = 0; hgl[P] = 0.0f;
    const fl_index_dtype it = idx_dtype(c);
    const void* hlab = it == FL_INDEX_I64 ? (const void*)lab64 : (const void*)lab32;
    int64_t D = 0;
    for (int64_t p = 0; p < P; p++) D += tg[p] != -100;
    size_t wsb = 0;
    fl_focal_options oc = make_opts(c, halpha, NULL);
    CHECK_STATUS(fl_softmax_focal_workspace_size(&wsb, N, C, d, c->dt, &oc), FL_OK, name);
    const float gscale = 0.75f;
    const float* glh = c->pass == 2 ? hgl : NULL;

    /* CPU reference */
    void* hws = tu_xmalloc(wsb + 1);
    float* hloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* hd = tu_xmalloc((size_t)ne * es);
    tu_poison(hd, (size_t)ne * es);
    tu_poison(hloss, (size_t)(nl + 1) * 4);
    char* hdp = (char*)hd + (size_t)c->xoff * es;
    fl_status st = call_focal(c, 0, want_loss ? hloss : NULL, hdp, hxp, hlab, glh, gscale, &oc, hws, wsb);
    if (!CHECK_STATUS(st, FL_OK, name)) {
        free(hx); free(tg); free(lab64); free(lab32); free(hgl); free(halpha); free(hws); free(hloss); free(hd);
        return 0;
    }

    /* GPU */
    char *dx_, *dd_, *dws;
    float *dloss, *dgl, *dalpha;
    int32_t* dflag;
    void* dlab;
    CK(cudaMalloc((void**)&dx_, (size_t)ne * es));
    CK(cudaMalloc((void**)&dd_, (size_t)ne * es));
    CK(cudaMalloc((void**)&dloss, (size_t)(nl + 1) * 4));
    CK(cudaMalloc((void**)&dgl, (size_t)(P + 1) * 4));
    CK(cudaMalloc((void**)&dalpha, (size_t)C * 4));
    CK(cudaMalloc((void**)&dws, wsb + 1));
    CK(cudaMalloc((void**)&dflag, 4));
    CK(cudaMalloc(&dlab, (size_t)(P + 1) * 8));
    CK(cudaMemcpy(dx_, hx, (size_t)ne * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dgl, hgl, (size_t)(P + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dalpha, halpha, (size_t)C * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlab, hlab, (size_t)(P + 1) * (it == FL_INDEX_I64 ? 8 : 4), cudaMemcpyHostToDevice));
    CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
    CK(cudaMemset(dd_, 0xFF, (size_t)ne * es));
    CK(cudaMemset(dws, 0xFF, wsb + 1));
    CK(cudaMemset(dflag, 0, 4));
    CK(cudaDeviceSynchronize());   /* the legacy-stream uploads land before the non-blocking stream runs */
    fl_focal_options og = make_opts(c, dalpha, dflag);
    char* gx = dx_ + (size_t)c->xoff * es;
    char* gd = inplace ? gx : dd_ + (size_t)c->xoff * es;
    float* gloss_p = want_loss ? dloss : NULL;
    const float* gl = c->pass == 2 ? dgl : NULL;
    const int before = (int)tu_failed;
#define GPU_CALL() call_focal(c, 1, gloss_p, gd, gx, dlab, gl, gscale, &og, dws, wsb)
    st = GPU_CALL();
    CHECK_STATUS(st, FL_OK, name);
    CK(cudaStreamSynchronize(g_stream));
    float* gloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* gdh = tu_xmalloc((size_t)ne * es);
    void* gxh = tu_xmalloc((size_t)ne * es);
    int32_t hflag = -1;
    CK(cudaMemcpy(gloss, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gdh, inplace ? dx_ : dd_, (size_t)ne * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gxh, dx_, (size_t)ne * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hflag, dflag, 4, cudaMemcpyDeviceToHost));
    CHECK(hflag == 0, "%s: valid targets but *error_flag = %d", name, (int)hflag);

    posstat* ps = tu_xmalloc((size_t)(P + 1) * sizeof(posstat));
    double* sbuf = tu_xmalloc((size_t)C * 8);
    for (int64_t p = 0; p < P; p++) pos_stats(c, hxp, halpha, p, tg[p], sbuf, &ps[p]);
    free(sbuf);
    char nm[360];
    if (want_loss) {
        snprintf(nm, sizeof nm, "%s loss", name);
        check_loss(nm, c, gloss, hloss, ps, NULL, c->red == FL_REDUCTION_MEAN ? D : 1);
        CHECK(tu_is_poison(gloss, 4, nl), "%s: loss guard overwritten", name);
    } else {
        int w = 0;
        for (int64_t i = 0; i <= nl; i++) w += !tu_is_poison(gloss, 4, i);
        CHECK(w == 0, "%s: loss NULL but %d loss elements written", name, w);
    }
    if (fused) {
        double* g = tu_xmalloc((size_t)(P + 1) * 8);
        for (int64_t p = 0; p < P; p++) {
            g[p] = gscale * (c->pass == 2 ? hgl[none ? p : 0] : 1.0);
            if (c->red == FL_REDUCTION_MEAN) g[p] /= D ? (double)D : 1.0;
        }
        snprintf(nm, sizeof nm, "%s dlogits", name);
        check_grad(nm, c, (const char*)gdh + (size_t)c->xoff * es, hdp, hxp, tg, ps, g, NULL);
        free(g);
    }
    {   /* outside the first C d columns: poison stays (padding, guards), or the input's value in place */
        const int64_t bad = count_outside_written(c, gdh, inplace ? hx : NULL, ne);
        CHECK(bad == 0, "%s: %lld dlogits elements outside the batch rows' C*d columns written", name, (long long)bad);
        if (!inplace) CHECK(memcmp(gxh, hx, (size_t)ne * es) == 0, "%s: logits modified", name);
    }
    /* determinism and graph replay (not in place: the inputs must survive) */
    if (!inplace && (graph || !g_small)) {
        float* l2 = tu_xmalloc((size_t)(nl + 1) * 4);
        void* d2 = tu_xmalloc((size_t)ne * es);
        for (int rep = 0; rep < (graph ? 2 : 1); rep++) {
            CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
            CK(cudaMemset(dd_, 0xFF, (size_t)ne * es));
            CK(cudaMemset(dws, 0xFF, wsb + 1));
            CK(cudaDeviceSynchronize());
            cudaGraph_t gr;
            cudaGraphExec_t ex;
            if (rep == 0) {
                st = GPU_CALL();
                CHECK_STATUS(st, FL_OK, "second run");
            } else {
                CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
                st = GPU_CALL();
                CK(cudaStreamEndCapture(g_stream, &gr));
                CHECK_STATUS(st, FL_OK, "captured call");
                CK(cudaGraphInstantiate(&ex, gr, 0));
                for (int k = 0; k < 3; k++) CK(cudaGraphLaunch(ex, g_stream));
            }
            CK(cudaStreamSynchronize(g_stream));
            CK(cudaMemcpy(l2, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(d2, dd_, (size_t)ne * es, cudaMemcpyDeviceToHost));
            snprintf(nm, sizeof nm, "%s %s", name, rep == 0 ? "rerun bitwise" : "graph replay == eager");
            check_bitwise(nm, l2, gloss, (size_t)(nl + 1) * 4);
            check_bitwise(nm, d2, gdh, (size_t)ne * es);
            if (rep == 1) {
                CK(cudaGraphExecDestroy(ex));
                CK(cudaGraphDestroy(gr));
            }
        }
        free(l2); free(d2);
    }
#undef GPU_CALL
    CK(cudaFree(dx_)); CK(cudaFree(dd_)); CK(cudaFree(dloss)); CK(cudaFree(dgl)); CK(cudaFree(dalpha));
    CK(cudaFree(dws)); CK(cudaFree(dflag)); CK(cudaFree(dlab));
    free(hx); free(tg); free(lab64); free(lab32); free(hgl); free(halpha); free(hws); free(hloss); free(hd);
    free(gloss); free(gdh); free(gxh); free(ps);
    return (int)tu_failed == before;
}

/* ------------------------------------------------------------------------------------------
 * Out-of-range targets: that position's loss NaN (NONE; any SUM / MEAN NaN), its gradient NaN, the
 * flag set, the other positions as the CPU with the bad ones ignored (the bad positions count in
 * MEAN's D, as section 5), then the context still usable. Poison here is finite (0x3F bytes) so
 * that an unwritten position cannot pass as NaN.
 * ---------------------------------------------------------------------------------------- */
static void test_oob(fl_dtype dt, int64_t N, int64_t C, int64_t d, int targets, fl_reduction red, int use_flag,
                     int use_alpha) {
    cfg_t c;
    memset(&c, 0, sizeof c);
    c.dt = dt; c.gamma = 2.0f; c.use_alpha = use_alpha; c.red = red; c.targets = targets; c.pass = 1;
    c.N = N; c.C = C; c.d = d; c.ld = C * d;
    const int64_t P = N * d, n = N * c.ld;
    const size_t es = tu_dtype_size(dt);
    const fl_index_dtype it = idx_dtype(&c);
    const int none = red == FL_REDUCTION_NONE;
    char name[200];
    snprintf(name, sizeof name, "out-of-range targets: %s %s N=%lld C=%lld d=%lld red=%d flag=%d alpha=%d",
             tu_dtype_name(dt), it == FL_INDEX_I32 ? "i32" : "i64", (long long)N, (long long)C, (long long)d,
             (int)red, use_flag, use_alpha);
    tu_rng r = tu_rng_seed(4321 + (uint64_t)targets * 7 + (uint64_t)red + (uint64_t)d);
    void* hx = tu_xmalloc((size_t)n * es);
    float* halpha = tu_xmalloc((size_t)C * 4);
    int64_t* tg = tu_xmalloc((size_t)P * 8);     /* the bad targets */
    int64_t* tgc = tu_xmalloc((size_t)P * 8);    /* bad positions -> ignore_index: the CPU's view */
    int64_t* lab64 = tu_xmalloc((size_t)P * 8);
    int32_t* lab32 = tu_xmalloc((size_t)P * 4);
    int64_t* labc64 = tu_xmalloc((size_t)P * 8);
    int32_t* labc32 = tu_xmalloc((size_t)P * 4);
    unsigned char* bad = calloc((size_t)P, 1);
    for (int64_t k = 0; k < n; k++) tu_store(hx, dt, k, (float)(3.0 * approx_normal(&r)));
    for (int64_t k = 0; k < C; k++) halpha[k] = (float)tu_uniform_in(&r, 0.1, 2.0);
    for (int64_t p = 0; p < P; p++) tg[p] = p % 7 == 6 ? -100 : tu_int_in(&r, 0, C - 1);
    tg[3] = C; tg[4] = -5; tg[P - 2] = C + 1000;
    bad[3] = bad[4] = bad[P - 2] = 1;
    if (it == FL_INDEX_I64) { tg[5] = ((int64_t)1 << 32) + 1; bad[5] = 1; }   /* truncates to 1 */
    tg[0] = 0; tg[1] = C - 1;                                                /* the edges, valid */
    int64_t Dbad = 0;
    for (int64_t p = 0; p < P; p++) {
        Dbad += tg[p] != -100;
        tgc[p] = bad[p] ? -100 : tg[p];
        lab64[p] = tg[p]; lab32[p] = (int32_t)tg[p]; labc64[p] = tgc[p]; labc32[p] = (int32_t)tgc[p];
    }
    const void* hlab = it == FL_INDEX_I64 ? (const void*)lab64 : (const void*)lab32;
    const void* hlabc = it == FL_INDEX_I64 ? (const void*)labc64 : (const void*)labc32;
    const size_t isz = it == FL_INDEX_I64 ? 8 : 4;
    const float gs = 0.75f;
    /* CPU reference: NONE, per-position upstream = what the GPU applies to the good positions */
    cfg_t cn = c;
    cn.red = FL_REDUCTION_NONE;
    fl_focal_options on = make_opts(&cn, halpha, NULL);
    size_t wsb = 0;
    fl_softmax_focal_workspace_size(&wsb, N, C, d, dt, &on);
    void* hws = tu_xmalloc(wsb);
    float* rl = tu_xmalloc((size_t)P * 4);
    float* rg = tu_xmalloc((size_t)P * 4);
    double* g = tu_xmalloc((size_t)P * 8);
    void* rd = tu_xmalloc((size_t)n * es);
    for (int64_t p = 0; p < P; p++) {
        rg[p] = (float)(red == FL_REDUCTION_MEAN ? gs / (double)Dbad : gs);
        g[p] = rg[p];
    }
    CHECK_STATUS(fl_softmax_focal_fused_cpu(rl, rd, hx, c.ld, hlabc, it, rg, 1.0f, N, C, d, dt, &on, hws, wsb), FL_OK,
                 "oob cpu reference");
    {   /* the CPU itself rejects the bad targets */
        float* l2 = tu_xmalloc((size_t)P * 4);
        void* d2 = tu_xmalloc((size_t)n * es);
        fl_status s2 = fl_softmax_focal_fused_cpu(l2, d2, hx, c.ld, hlab, it, NULL, 1.0f, N, C, d, dt, &on, hws, wsb);
        CHECK_STATUS(s2, FL_ERR_TARGET_OUT_OF_RANGE, "oob cpu with the bad targets");
        free(l2); free(d2);
    }
    posstat* ps = tu_xmalloc((size_t)P * sizeof(posstat));
    double* sbuf = tu_xmalloc((size_t)C * 8);
    for (int64_t p = 0; p < P; p++) pos_stats(&c, hx, halpha, p, tgc[p], sbuf, &ps[p]);
    free(sbuf);

    const size_t nlb = (size_t)(none ? P : 1) * 4;
    void *dx, *dw, *dd, *dlab, *dlabc, *dws;
    float *dl, *dgl, *dalpha;
    int32_t* dflag;
    CK(cudaMalloc(&dx, (size_t)n * es)); CK(cudaMalloc(&dw, (size_t)n * es)); CK(cudaMalloc(&dd, (size_t)n * es));
    CK(cudaMalloc(&dlab, (size_t)P * 8)); CK(cudaMalloc(&dlabc, (size_t)P * 8)); CK(cudaMalloc(&dws, wsb));
    CK(cudaMalloc((void**)&dl, (size_t)P * 4)); CK(cudaMalloc((void**)&dgl, (size_t)P * 4));
    CK(cudaMalloc((void**)&dalpha, (size_t)C * 4)); CK(cudaMalloc((void**)&dflag, 4));
    CK(cudaMemcpy(dx, hx, (size_t)n * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlab, hlab, (size_t)P * isz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlabc, hlabc, (size_t)P * isz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dgl, rg, (size_t)P * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dalpha, halpha, (size_t)C * 4, cudaMemcpyHostToDevice));
    fl_focal_options o = make_opts(&c, dalpha, use_flag ? dflag : NULL);
    float* hl = tu_xmalloc((size_t)P * 4);
    void* hd = tu_xmalloc((size_t)n * es);
    char nm[260], nm2[320];
    for (int op = 0; op < 3; op++) {   /* forward, fused, fused in place */
        CK(cudaMemset(dflag, 0, 4));
        CK(cudaMemset(dl, 0x3F, (size_t)P * 4));
        CK(cudaMemset(dd, 0x3F, (size_t)n * es));
        CK(cudaMemcpy(dw, dx, (size_t)n * es, cudaMemcpyDeviceToDevice));
        CK(cudaDeviceSynchronize());
        void* gdl = op == 2 ? dw : dd;
        const void* gx = op == 2 ? dw : dx;
        fl_status st = op == 0 ? fl_softmax_focal_forward_cuda(dl, gx, c.ld, dlab, it, N, C, d, dt, &o, dws, wsb,
                                                               (fl_stream)g_stream)
                               : fl_softmax_focal_fused_cuda(dl, gdl, gx, c.ld, dlab, it, NULL, gs, N, C, d, dt, &o,
                                                             dws, wsb, (fl_stream)g_stream);
        snprintf(nm, sizeof nm, "%s op=%d", name, op);
        CHECK_STATUS(st, FL_OK, nm);
        zt_check_call_ok(nm, dflag, use_flag);
        CK(cudaMemcpy(hl, dl, nlb, cudaMemcpyDeviceToHost));
        if (none) {
            int nn = 0;
            for (int64_t p = 0; p < P; p++) nn += bad[p] && !isnan(hl[p]);
            CHECK(nn == 0, "%s: %d bad positions with a loss that is not NaN", nm, nn);
            snprintf(nm2, sizeof nm2, "%s loss (good positions)", nm);
            check_loss(nm2, &cn, hl, rl, ps, bad, 1);
        } else {
            CHECK(isnan(hl[0]), "%s: loss %g, want NaN", nm, (double)hl[0]);
        }
        if (op != 0) {
            CK(cudaMemcpy(hd, gdl, (size_t)n * es, cudaMemcpyDeviceToHost));
            int64_t notnan = 0;
            for (int64_t p = 0; p < P; p++)
                if (bad[p])
                    for (int64_t k = 0; k < C; k++) notnan += !isnan(tu_load(hd, dt, elem(&c, p, k)));
            CHECK(notnan == 0, "%s: %lld gradient entries of bad positions not NaN", nm, (long long)notnan);
            snprintf(nm2, sizeof nm2, "%s dlogits (good positions)", nm);
            check_grad(nm2, &cn, hd, rd, hx, tgc, ps, g, bad);
        }
    }
    {   /* the context still works: a valid call (bad positions ignored), the flag stays 0 */
        CK(cudaMemset(dflag, 0, 4));
        CK(cudaMemset(dl, 0xFF, (size_t)P * 4));
        CK(cudaMemset(dd, 0xFF, (size_t)n * es));
        CK(cudaDeviceSynchronize());
        fl_focal_options ov = make_opts(&cn, dalpha, dflag);
        fl_status st = fl_softmax_focal_fused_cuda(dl, dd, dx, c.ld, dlabc, it, dgl, 1.0f, N, C, d, dt, &ov, dws, wsb,
                                                   (fl_stream)g_stream);
        snprintf(nm, sizeof nm, "%s: valid call after", name);
        CHECK_STATUS(st, FL_OK, nm);
        CK(cudaDeviceSynchronize());
        int32_t hf = -1;
        CK(cudaMemcpy(&hf, dflag, 4, cudaMemcpyDeviceToHost));
        CHECK(hf == 0, "%s: *error_flag = %d", nm, (int)hf);
        CK(cudaMemcpy(hl, dl, (size_t)P * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hd, dd, (size_t)n * es, cudaMemcpyDeviceToHost));
        snprintf(nm2, sizeof nm2, "%s loss", nm);
        check_loss(nm2, &cn, hl, rl, ps, NULL, 1);
        snprintf(nm2, sizeof nm2, "%s dlogits", nm);
        check_grad(nm2, &cn, hd, rd, hx, tgc, ps, g, NULL);
    }
    CK(cudaFree(dx)); CK(cudaFree(dw)); CK(cudaFree(dd)); CK(cudaFree(dlab)); CK(cudaFree(dlabc)); CK(cudaFree(dws));
    CK(cudaFree(dl)); CK(cudaFree(dgl)); CK(cudaFree(dalpha)); CK(cudaFree(dflag));
    free(hx); free(halpha); free(tg); free(tgc); free(lab64); free(lab32); free(labc64); free(labc32); free(bad);
    free(hws); free(rl); free(rg); free(g); free(rd); free(ps); free(hl); free(hd);
}

/* ------------------------------------------------------------------------------------------
 * N = 0, bad arguments through the CUDA entries (outputs untouched)
 * ---------------------------------------------------------------------------------------- */
static void test_misc(void) {
    fl_focal_options o = FL_FOCAL_OPTIONS_INIT;
    size_t wsb = 0;
    fl_softmax_focal_workspace_size(&wsb, 4, 10, 3, FL_DTYPE_BF16, &o);
    void *x, *t, *d, *ws;
    float* l;
    CK(cudaMalloc(&x, 512)); CK(cudaMalloc(&t, 512)); CK(cudaMalloc(&d, 512)); CK(cudaMalloc(&ws, wsb + 256));
    CK(cudaMalloc((void**)&l, 64));
    CK(cudaMemset(x, 0, 512)); CK(cudaMemset(t, 0, 512));
    /* N = 0: SUM 0, MEAN NaN (forward and fused; rows and d > 1) */
    const fl_reduction reds[2] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
    for (int k = 0; k < 8; k++) {
        o.reduction = reds[k & 1];
        const int64_t dd = (k & 4) ? 3 : 1;
        float h = 1.0f;
        CK(cudaMemset(l, 0xFF, 64));
        CK(cudaDeviceSynchronize());
        fl_status st = (k & 2) == 0
                           ? fl_softmax_focal_forward_cuda(l, x, 10 * dd, t, FL_INDEX_I64, 0, 10, dd, FL_DTYPE_BF16, &o,
                                                           ws, wsb, (fl_stream)g_stream)
                           : fl_softmax_focal_fused_cuda(l, d, x, 10 * dd, t, FL_INDEX_I64, NULL, 1.0f, 0, 10, dd,
                                                         FL_DTYPE_BF16, &o, ws, wsb, (fl_stream)g_stream);
        CHECK_STATUS(st, FL_OK, "N = 0");
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(&h, l, 4, cudaMemcpyDeviceToHost));
        CHECK((k & 1) == 0 ? h == 0.0f : isnan(h), "N = 0 %s d=%lld reduction %d: loss %g",
              (k & 2) ? "fused" : "forward", (long long)dd, (int)reds[k & 1], (double)h);
    }
    /* bad arguments: the status, the function named, nothing written */
    CK(cudaMemset(l, 0xFF, 64));
    CK(cudaMemset(d, 0xFF, 512));
    CK(cudaDeviceSynchronize());
    fl_focal_options ob = FL_FOCAL_OPTIONS_INIT;
    ob.reduction = (fl_reduction)7;
    fl_status st = fl_softmax_focal_forward_cuda(l, x, 30, t, FL_INDEX_I64, 4, 10, 3, FL_DTYPE_BF16, &ob, ws, wsb,
                                                 (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "fl_softmax_focal_forward_cuda"),
          "reduction 7 (forward): status %d (%s)", (int)st, fl_last_error());
    st = fl_softmax_focal_fused_cuda(l, d, x, 30, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, 3, FL_DTYPE_BF16, &ob, ws, wsb,
                                     (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "fl_softmax_focal_fused_cuda"),
          "reduction 7 (fused): status %d (%s)", (int)st, fl_last_error());
    ob = o;
    ob.gamma = -1.0f;
    st = fl_softmax_focal_fused_cuda(l, d, x, 30, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, 3, FL_DTYPE_BF16, &ob, ws, wsb,
                                     (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "gamma"), "gamma = -1: status %d (%s)", (int)st,
          fl_last_error());
    st = fl_softmax_focal_fused_cuda(l, d, x, 29, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, 3, FL_DTYPE_BF16, &o, ws, wsb,
                                     (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT, "ld < C d: status %d (%s)", (int)st, fl_last_error());
    st = fl_softmax_focal_fused_cuda(l, d, x, 30, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, 0, FL_DTYPE_BF16, &o, ws, wsb,
                                     (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT, "d = 0: status %d (%s)", (int)st, fl_last_error());
    st = fl_softmax_focal_fused_cuda(l, d, (char*)x + 1, 30, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, 3, FL_DTYPE_BF16, &o,
                                     ws, wsb, (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT, "misaligned logits: status %d (%s)", (int)st, fl_last_error());
    st = fl_softmax_focal_fused_cuda(l, d, x, 30, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, 3, FL_DTYPE_BF16, &o,
                                     (char*)ws + 128, wsb, (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT, "workspace not 256-byte aligned: status %d (%s)", (int)st, fl_last_error());
    CK(cudaDeviceSynchronize());
    {
        const int w = zt_count_written(d, 512, l, 16);
        CHECK(w == 0, "bad arguments: %d output bytes / floats written", w);
    }
    CK(cudaFree(x)); CK(cudaFree(t)); CK(cudaFree(d)); CK(cudaFree(ws)); CK(cudaFree(l));
}

int main(int argc, char** argv) {
    {
        const int rc = zt_cuda_test_start(argc, argv, "test_softmax_focal_cuda", &g_small);
        if (rc >= 0) return rc;
    }
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    tu_quiet = 1;
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const float gammas[4] = {0.0f, 0.5f, 2.0f, 3.5f};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
    /* N, C, d, ld */
    const int64_t shapes[][4] = {{1, 1, 1, 1},         {7, 3, 1, 5},          {64, 19, 1, 19},
                                 {300, 1000, 1, 1000}, {33, 8192, 1, 8192},   {17, 8193, 1, 8200},
                                 {5, 50257, 1, 50257}, {256, 512, 1, 512},    {2, 19, 1000, 19000},
                                 {1, 3, 7, 21},        {4, 5, 64, 320},       {2, 19, 65536, 19 * 65536},
                                 {3, 100, 33, 3305},
                                 /* the staged kernel (sm_90 default): clusters of 2-8 CTAs and a tail, within --small */
                                 {2, 65541, 1, 65544},
                                 /* the warp-a-row kernel's other register widths (32 KE >= C: 8, 64, 128), odd ld */
                                 {9, 200, 1, 203},     {6, 1500, 1, 1500},    {5, 3000, 1, 3001}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    uint64_t seed = 23;
    long cases = 0, bad = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < 4; gi++)
            for (int si = 0; si < nshapes; si++)
                for (int v = 0; v < 6; v++) {
                    cfg_t c;
                    memset(&c, 0, sizeof c);
                    c.dt = dts[di];
                    c.gamma = gammas[gi];
                    c.N = shapes[si][0];
                    c.C = shapes[si][1];
                    c.d = shapes[si][2];
                    c.ld = shapes[si][3];
                    if (g_small && (c.N * c.ld > (1 << 18) || (v + gi + si) % 2)) continue;   /* half the variants */
                    if (c.N * c.ld > (1 << 21) && (v + gi) % 2) continue;   /* the 2.5M-element map: half */
                    /* the variants cycle through the options so that every combination class is hit */
                    c.pass = v % 4;
                    c.red = reds[(v + si + gi) % 3];
                    c.use_alpha = (v + si + di) & 1;
                    c.targets = (v + si + gi + di) % 3;
                    if (v == 5 && (si + gi) % 4 == 0) c.targets = 3;   /* every position ignored */
                    c.noloss = (c.pass == 2 && (si + di) % 2 == 0) || (c.pass == 3 && (si + gi) % 3 == 0);
                    c.xoff = v >= 4 && (si + gi) % 2 == 0;
                    const int graph = (si == 5 || si == 10) && gi == di + 1 && v == 1 + (di & 1);
                    cases++;
                    if (!run_case(&c, seed++, graph)) bad++;
                }
    printf("grid: %ld cases, %ld failed\n", cases, bad);
    for (int k = 0; k < 4; k++) {
        const fl_dtype dt = k < 2 ? FL_DTYPE_F32 : FL_DTYPE_BF16;
        const int64_t N = k & 1 ? 3 : 37, C = k & 1 ? 19 : 1000, d = k & 1 ? 50 : 1;
        test_oob(dt, N, C, d, k & 1 ? 1 : 0, FL_REDUCTION_NONE, 1, k >= 2);
        test_oob(dt, N, C, d, k & 1 ? 0 : 1, FL_REDUCTION_MEAN, k != 3, k < 2);
    }
    test_misc();
    CK(cudaStreamDestroy(g_stream));
    return tu_finish();
}
