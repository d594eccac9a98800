/* test_margin_ce_cuda.c — the CUDA margin softmax cross-entropy (CosFace / ArcFace / combined
 * margins; include/fusedloss.h section 11) against the CPU backend (the reference, itself checked
 * against a long-double reference, insightface re-implementations and finite differences by
 * tests/test_margin_ce.c).
 *
 * Grid: dtypes f32 / f16 / bf16 x margins (m1, m2, m3) = ArcFace (1, 0.5, 0), CosFace (1, 0, 0.4),
 * combined (1, 0.3, 0.2), SphereFace-like (2, 0, 0) x easy_margin 0 / 1 x grad modes EXACT /
 * STRAIGHT x s = 64 / 1 x reductions NONE / SUM / MEAN x targets (int64 some ignored, int32 some
 * ignored, int64 none ignored, int32 all ignored) x pass (forward, fused with grad_loss NULL / a
 * device value (per row for NONE) / in place, loss NULL in some fused cases) x lse NULL or not x
 * shapes (N, C, ld) = (1, 1, 1) .. (8, 100000, 100000): rows crossing the 8192-column chunks, ld > C,
 * odd ld (unaligned rows), a logits pointer one element off its 16-byte phase (the scalar path).
 * Cosines uniform in [-1, 1]; every 5th row a confident one (target cosine 0.95 - 0.999, the others
 * in [-0.1, 0.3]: a tiny loss at s = 64), every 5th + 1 a target cosine in [-0.999, -0.99]; the
 * target cosines keep 1e-4 away from +-1, from the branch boundary cos((pi - m2) / m1) and (easy
 * margin) from 0, where the CPU's double and the GPU's float legitimately take different branches
 * or the EXACT phi' = m1 sin(m1 theta + m2) / sin theta explodes. Ignored rows hold NaN cosines (never
 * read). Outputs poisoned (0xFF bytes: NaN in every dtype) before every call; every dlogits element
 * outside the first C columns of a row (padding, the guards around the matrix) must stay poisoned,
 * or keep the input's value in place; a forward / out-of-place call must leave the logits intact; a
 * valid call must leave the device error flag 0. Plus: two runs bitwise equal (determinism), CUDA
 * graph capture + replay bitwise equal to eager, x_y = 1.0 exactly (loss and gradient finite, f32 /
 * bf16: the sin theta clamp), out-of-range targets (that row's loss and gradient NaN, the flag set,
 * the other rows right, the context still usable), N = 0, bad arguments through the CUDA entries.
 *
 * Tolerances (GPU fp32 vs CPU double on the same dtype-rounded cosines; lse, z_y, p_y, phi and its
 * derivatives recomputed per row in double by this test to scale them):
 *   phi(x_y) in fp32 (acosf / cosf, or sqrt(1 - x^2) forms): theta off by 2 ulps of itself or of an
 *          x_y perturbed by 2 ulps, dth = 2.4e-7 (theta + |x_y| / sin theta), a = m1 theta + m2 off
 *          by da = m1 dth + 2.4e-7 |a|; so |dphi| <= phi_err = |sin a| da (+ roundings) and the
 *          EXACT |dphi'| <= dphi_err = |m1 cos a / sin theta| da + |m1 sin a cos theta / sin^2 theta|
 *          dth (large only near x_y = +-1 or where sin a ~ 0); dz = s phi_err.
 *   loss (per row): |d| <= 2e-6 (1 + |lse| + |z_y|) + dz + 1e-5 |ref|   (l = lse - z_y from fp32
 *          merged statistics: ~16 fp32 ulps of both terms, plus z_y's own error); a reduction takes
 *          the sum of its rows' bounds (/ D for MEAN); lse: 2e-6 (1 + |lse|) + p_y dz.
 *   dlogits[j != y] : |d| <= 1 ulp of the dtype (rtol) + |g| s p_j E_j,
 *          E_j = 4e-6 (1 + |lse| + |z_j|) + dz   (exp2 of an argument carrying ~ulp(lse) + ulp(z_j)
 *          absolute error, plus lse's error through z_y) + |g| s 2^-126 (p_j below 2^-126 may be
 *          flushed to 0: the staged kernel's ex2.approx.ftz);
 *   dlogits[y] : 1 ulp + |g| s (|phi'_m| (1 + p_y) E_y + (1 - p_y) dphi_err)   (p_y - 1 known to
 *          E_y absolutely, not relatively: it may be formed as p_y - 1; phi'_m the gradient's factor:
 *          the EXACT derivative, 1 (dphi_err 0) for STRAIGHT or outside the margin).
 *   atol: f16 6e-8 (subnormals below 6.1e-5 have spacing 2^-24), f32 / bf16 2^-126 (fp32 subnormals:
 *          exp2f loses bits there, or flushes to 0); ignored rows exactly 0.
 * Run:   build/test_margin_ce_cuda [--small]   (--small: N * ld <= 2^18, for compute-sanitizer)
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
static const double ATOL_LOSS = 2e-6, RTOL_LOSS = 1e-5;
static const double SLACK_D = 4e-6;                        /* dlogits: E_j's fp32 constant */
static const double XULP = 2.4e-7;                         /* 2 fp32 ulps, relative (phi's error model) */
static const double PI_D = 3.14159265358979323846;

static int g_small = 0;
static cudaStream_t g_stream;

typedef struct {
    fl_dtype dt;
    float s, m1, m2, m3;
    int easy;
    fl_margin_grad gm;
    fl_reduction red;
    int targets;  /* 0 int64 some ignored, 1 int32 some ignored, 2 int64 none ignored, 3 int32 all ignored */
    int pass;     /* 0 forward, 1 fused grad NULL, 2 fused grad value(s) on the device, 3 fused in place */
    int want_lse; /* lse output non-NULL */
    int noloss;   /* fused: loss NULL */
    int64_t N, C, ld;
    int xoff;     /* logits (and dlogits) element offset: 1 = off the 16-byte phase */
} cfg_t;

static fl_index_dtype idx_dtype(const cfg_t* c) { return (c->targets & 1) ? FL_INDEX_I32 : FL_INDEX_I64; }

static fl_margin_options make_opts(const cfg_t* c, int32_t* flag) {
    fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
    o.s = c->s;
    o.m1 = c->m1;
    o.m2 = c->m2;
    o.m3 = c->m3;
    o.easy_margin = c->easy;
    o.grad_mode = c->gm;
    o.reduction = c->red;
    o.error_flag = flag;
    return o;
}

/* One call on either backend (pointers of that backend). */
static fl_status call_margin(const cfg_t* c, int cuda, float* loss, float* lse, void* dx, const void* x,
                             const void* tg, const float* gl, float gs, const fl_margin_options* o, void* ws,
                             size_t wsb) {
    const fl_index_dtype it = idx_dtype(c);
    if (c->pass == 0)
        return cuda ? fl_margin_ce_forward_cuda(loss, lse, x, c->ld, tg, it, c->N, c->C, c->dt, o, ws, wsb,
                                                (fl_stream)g_stream)
                    : fl_margin_ce_forward_cpu(loss, lse, x, c->ld, tg, it, c->N, c->C, c->dt, o, ws, wsb);
    return cuda ? fl_margin_ce_fused_cuda(loss, lse, dx, x, c->ld, tg, it, gl, gs, c->N, c->C, c->dt, o, ws, wsb,
                                          (fl_stream)g_stream)
                : fl_margin_ce_fused_cpu(loss, lse, dx, x, c->ld, tg, it, gl, gs, c->N, c->C, c->dt, o, ws, wsb);
}

/* ------------------------------------------------------------------------------------------
 * The row statistics in double (from the header's formulas), for the tolerances
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    double phi;        /* phi(x_y) */
    double dphi_m;     /* the gradient's factor at the target (EXACT: phi'; STRAIGHT / no margin: 1) */
    double phi_err;    /* a bound of the fp32 evaluation's error of phi */
    double dphi_err;   /* ... and of dphi_m */
} phi_t;

/* The error model of an fp32 phi / phi': theta carries acosf's relative error or that of an x_y
 * perturbed by 2 ulps (sqrt(1 - x^2) forms), dth = 2.4e-7 (theta + |x| / sin theta); a = m1 theta + m2
 * adds its rounding, da = m1 dth + 2.4e-7 |a|. Then |dphi| <= |sin a| da (+ the rounding of cos and
 * of - m3), |dphi'| <= |m1 cos a / sin theta| da + |m1 sin a cos theta / sin^2 theta| dth. */
static phi_t margin_phi(const cfg_t* c, double x) {
    const double m1 = c->m1, m2 = c->m2, m3 = c->m3;
    phi_t r = {x - m3, 1.0, XULP * (fabs(x) + m3), 0.0};
    if (m1 == 1.0 && m2 == 0.0) return r;   /* CosFace: phi = x - m3 exactly */
    const double xc = x < -1.0 ? -1.0 : x > 1.0 ? 1.0 : x;
    const double th = acos(xc), a = m1 * th + m2;
    const int applies = c->easy ? x > 0.0 : a <= PI_D;
    if (!applies) {
        r.phi = c->easy ? x - m3 : x - m3 - m2 * sin(m2);
        r.phi_err = XULP * (fabs(x) + m3 + m2 * sin(m2));
        return r;
    }
    const double st = sin(th) > 1e-6 ? sin(th) : 1e-6;
    const double dth = XULP * (th + fabs(x) / st), da = m1 * dth + XULP * fabs(a);
    r.phi = cos(a) - m3;
    r.phi_err = fabs(sin(a)) * da + XULP * (1.0 + m3);
    if (c->gm == FL_MARGIN_GRAD_EXACT) {
        r.dphi_m = m1 * sin(a) / st;
        r.dphi_err = fabs(m1 * cos(a) / st) * da + fabs(m1 * sin(a) * cos(th) / (st * st)) * dth +
                     XULP * fabs(r.dphi_m);
    }
    return r;
}

/* 1 when a target cosine is too close to a point where the backends may legitimately differ */
static int cos_excluded(const cfg_t* c, double x) {
    if (fabs(x) > 1.0 - 1e-4) return 1;
    if (c->easy && fabs(x) < 1e-4) return 1;
    const double xb = cos((PI_D - (double)c->m2) / (double)c->m1);
    return fabs(x - xb) < 1e-4;
}

static float draw_cos(const cfg_t* c, tu_rng* r, double lo, double hi, int target) {
    for (;;) {
        const float v = tu_round_to(c->dt, (float)tu_uniform_in(r, lo, hi));
        if (!target || !cos_excluded(c, v)) return v;
    }
}

typedef struct {
    int ign;
    double xy, zy, lse, py, dz;
    phi_t ph;
} rowstat;

/* x: the logits as the library sees them (element (i, j) at i * ld + j) */
static void row_stats(const cfg_t* c, const void* x, int64_t i, int64_t y, rowstat* r) {
    memset(r, 0, sizeof *r);
    if (y == -100) { r->ign = 1; return; }
    const int64_t off = i * c->ld;
    const double s = c->s;
    r->xy = tu_load(x, c->dt, off + y);
    r->ph = margin_phi(c, r->xy);
    r->zy = s * r->ph.phi;
    double m = r->zy, sum = 0.0;
    for (int64_t j = 0; j < c->C; j++)
        if (j != y && s * tu_load(x, c->dt, off + j) > m) m = s * tu_load(x, c->dt, off + j);
    for (int64_t j = 0; j < c->C; j++) sum += exp((j == y ? r->zy : s * tu_load(x, c->dt, off + j)) - m);
    r->lse = m + log(sum);
    r->py = exp(r->zy - r->lse);
    r->dz = s * r->ph.phi_err;
}

static double row_loss_tol(const rowstat* r) {
    return r->ign ? 0.0 : ATOL_LOSS * (1.0 + fabs(r->lse) + fabs(r->zy)) + r->dz;
}

/* Losses: nl entries (NONE: per row; else the one reduced value, the rows' bounds summed, / Dl). */
static int check_loss(const char* name, const cfg_t* c, const float* gpu, const float* cpu, const rowstat* rs,
                      const unsigned char* skip, int64_t Dl) {
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? c->N : 1;
    double* a = tu_xmalloc((size_t)(nl + 1) * 8);
    double* b = tu_xmalloc((size_t)(nl + 1) * 8);
    double* sl = tu_xmalloc((size_t)(nl + 1) * 8);
    double tot = 0.0;
    for (int64_t i = 0; i < c->N; i++) tot += row_loss_tol(&rs[i]);
    int64_t n = 0;
    for (int64_t i = 0; i < nl; i++) {
        if (skip && skip[i]) continue;
        a[n] = gpu[i];
        b[n] = cpu[i];
        sl[n] = none ? row_loss_tol(&rs[i]) : tot / (Dl ? (double)Dl : 1.0);
        n++;
    }
    const int ok = check_close_ex(name, a, b, sl, n, 0.0, RTOL_LOSS);
    free(a); free(b); free(sl);
    return ok;
}

static int check_lse(const char* name, const cfg_t* c, const float* gpu, const float* cpu, const rowstat* rs,
                     const unsigned char* skip) {
    double* a = tu_xmalloc((size_t)(c->N + 1) * 8);
    double* b = tu_xmalloc((size_t)(c->N + 1) * 8);
    double* sl = tu_xmalloc((size_t)(c->N + 1) * 8);
    int64_t n = 0;
    for (int64_t i = 0; i < c->N; i++) {
        if (skip && skip[i]) continue;
        a[n] = gpu[i];
        b[n] = cpu[i];
        sl[n] = rs[i].ign ? 0.0 : ATOL_LOSS * (1.0 + fabs(rs[i].lse)) + rs[i].dz * rs[i].py;   /* ignored: 0 */
        n++;
    }
    const int ok = check_close_ex(name, a, b, sl, n, 0.0, RTOL_LOSS);
    free(a); free(b); free(sl);
    return ok;
}

/* The first C columns of every row of the gradients (gpu, cpu at the logits' offset), rows with
 * skip[i] left out; g[i]: the row's upstream gradient (grad_scale, grad_loss, / D folded in). */
static int check_grad(const char* name, const cfg_t* c, const void* gpu, const void* cpu, const void* x,
                      const int64_t* tg, const rowstat* rs, const double* g, const unsigned char* skip) {
    const int64_t N = c->N, C = c->C, ld = c->ld;
    const size_t n = (size_t)N * (size_t)C;
    double* a = tu_xmalloc((n + 1) * 8);
    double* b = tu_xmalloc((n + 1) * 8);
    double* sl = tu_xmalloc((n + 1) * 8);
    const double s = c->s;
    int64_t k = 0;
    for (int64_t i = 0; i < N; i++) {
        if (skip && skip[i]) continue;
        const rowstat* r = &rs[i];
        const double gsl = fabs(g[i]) * s;
        for (int64_t j = 0; j < C; j++, k++) {
            a[k] = tu_load(gpu, c->dt, i * ld + j);
            b[k] = tu_load(cpu, c->dt, i * ld + j);
            if (r->ign) { sl[k] = 0.0; continue; }
            if (j == tg[i]) {
                const double Ey = SLACK_D * (1.0 + fabs(r->lse) + fabs(r->zy)) + r->dz;
                sl[k] = gsl * (fabs(r->ph.dphi_m) * (1.0 + r->py) * Ey + (1.0 - r->py) * r->ph.dphi_err);
            } else {
                const double zj = s * tu_load(x, c->dt, i * ld + j);
                const double Ej = SLACK_D * (1.0 + fabs(r->lse) + fabs(zj)) + r->dz;
                /* + the flush of a probability below 2^-126 to 0 (ex2.approx.ftz): <= |g| s 2^-126 */
                sl[k] = gsl * (exp(zj - r->lse) * Ej + 0x1p-126);
            }
        }
    }
    const int ok = check_close_ex(name, a, b, sl, k, ATOL_D[c->dt], RTOL_D[c->dt]);
    free(a); free(b); free(sl);
    return ok;
}

/* Every element of a dlogits buffer (ne elements) outside the first C columns of the N rows at
 * offset xoff: poisoned (out of place) or the input's value (in place, in = the uploaded logits). */
static int64_t count_outside_written(const cfg_t* c, const void* buf, const void* in, int64_t ne) {
    const size_t es = tu_dtype_size(c->dt);
    int64_t bad = 0;
    for (int64_t k = 0, col = -c->xoff; k < ne; k++, col = col + 1 == c->ld ? 0 : col + 1) {
        if (col >= 0 && col < c->C && k - c->xoff < c->N * c->ld) continue;   /* col: k - xoff mod ld */
        if (in) bad += tu_bits(buf, c->dt, k) != tu_bits(in, c->dt, k);
        else bad += !tu_is_poison(buf, es, k);
    }
    return bad;
}

/* ------------------------------------------------------------------------------------------
 * One grid case
 * ---------------------------------------------------------------------------------------- */
static int run_case(const cfg_t* c, uint64_t seed, int graph) {
    const int64_t N = c->N, C = c->C, ld = c->ld;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const int fused = c->pass != 0, inplace = c->pass == 3;
    const int want_loss = !(fused && c->noloss);
    char name[300];
    snprintf(name, sizeof name,
             "%s s=%g m=(%g,%g,%g) easy=%d gm=%d red=%d tg=%d pass=%d lse=%d noloss=%d N=%lld C=%lld ld=%lld xoff=%d",
             tu_dtype_name(c->dt), c->s, c->m1, c->m2, c->m3, c->easy, (int)c->gm, (int)c->red, c->targets, c->pass,
             c->want_lse, c->noloss, (long long)N, (long long)C, (long long)ld, c->xoff);
    tu_rng r = tu_rng_seed(seed);
    const int64_t ne = N * ld + 16;
    void* hx = tu_xmalloc((size_t)ne * es);
    int64_t* tg = tu_xmalloc((size_t)(N + 1) * 8);
    int64_t* lab64 = tu_xmalloc((size_t)(N + 1) * 8);
    int32_t* lab32 = tu_xmalloc((size_t)(N + 1) * 4);
    float* hgl = tu_xmalloc((size_t)(N + 1) * 4);
    for (int64_t k = 0; k < ne; k++) tu_store(hx, c->dt, k, (float)tu_uniform_in(&r, -1, 1));
    char* hxp = (char*)hx + (size_t)c->xoff * es;   /* the logits as the library sees them */
    for (int64_t i = 0; i < N; i++) {
        const int ign = c->targets == 3 || (c->targets != 2 && i % 3 == 1);
        tg[i] = ign ? -100 : tu_int_in(&r, 0, C - 1);
        if (ign) {
            for (int64_t j = 0; j < C; j++) tu_store(hxp, c->dt, i * ld + j, NAN);   /* never read */
        } else {
            float xy = draw_cos(c, &r, -1, 1, 1);
            if (i % 5 == 0) {   /* confident: high target cosine, the others low */
                xy = draw_cos(c, &r, 0.95, 0.999, 1);
                for (int64_t j = 0; j < C; j++) tu_store(hxp, c->dt, i * ld + j, (float)tu_uniform_in(&r, -0.1, 0.3));
            } else if (i % 5 == 1) {
                xy = draw_cos(c, &r, -0.999, -0.99, 1);
            }
            tu_store(hxp, c->dt, i * ld + tg[i], xy);
        }
        lab64[i] = tg[i];
        lab32[i] = (int32_t)tg[i];
        hgl[i] = (float)tu_uniform_in(&r, -2, 2);
    }
    lab64[N] = 0; lab32[N] = 0; hgl[N] = 0.0f;
    const fl_index_dtype it = idx_dtype(c);
    const void* hlab = it == FL_INDEX_I64 ? (const void*)lab64 : (const void*)lab32;
    int64_t D = 0;
    for (int64_t i = 0; i < N; i++) D += tg[i] != -100;
    size_t wsb = 0;
    fl_margin_options oc = make_opts(c, NULL);
    CHECK_STATUS(fl_margin_ce_workspace_size(&wsb, N, C, c->dt, &oc), FL_OK, name);
    const float gscale = 0.75f;
    const float* glh = c->pass == 2 ? hgl : NULL;

    /* CPU reference */
    void* hws = tu_xmalloc(wsb + 1);
    float* hloss = tu_xmalloc((size_t)(nl + 1) * 4);
    float* hlse = tu_xmalloc((size_t)(N + 1) * 4);
    void* hd = tu_xmalloc((size_t)ne * es);
    tu_poison(hd, (size_t)ne * es);
    tu_poison(hloss, (size_t)(nl + 1) * 4);
    char* hdp = (char*)hd + (size_t)c->xoff * es;
    fl_status st = call_margin(c, 0, want_loss ? hloss : NULL, c->want_lse ? hlse : NULL, hdp, hxp, hlab, glh,
                               gscale, &oc, hws, wsb);
    if (!CHECK_STATUS(st, FL_OK, name)) {
        free(hx); free(tg); free(lab64); free(lab32); free(hgl); free(hws); free(hloss); free(hlse); free(hd);
        return 0;
    }

    /* GPU */
    char *dx_, *dd_, *dws;
    float *dloss, *dlse, *dgl;
    int32_t* dflag;
    void* dlab;
    CK(cudaMalloc((void**)&dx_, (size_t)ne * es));
    CK(cudaMalloc((void**)&dd_, (size_t)ne * es));
    CK(cudaMalloc((void**)&dloss, (size_t)(nl + 1) * 4));
    CK(cudaMalloc((void**)&dlse, (size_t)(N + 1) * 4));
    CK(cudaMalloc((void**)&dgl, (size_t)(N + 1) * 4));
    CK(cudaMalloc((void**)&dws, wsb + 1));
    CK(cudaMalloc((void**)&dflag, 4));
    CK(cudaMalloc(&dlab, (size_t)(N + 1) * 8));
    CK(cudaMemcpy(dx_, hx, (size_t)ne * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dgl, hgl, (size_t)(N + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlab, hlab, (size_t)(N + 1) * (it == FL_INDEX_I64 ? 8 : 4), cudaMemcpyHostToDevice));
    CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
    CK(cudaMemset(dlse, 0xFF, (size_t)(N + 1) * 4));
    CK(cudaMemset(dd_, 0xFF, (size_t)ne * es));
    CK(cudaMemset(dws, 0xFF, wsb + 1));
    CK(cudaMemset(dflag, 0, 4));
    CK(cudaDeviceSynchronize());   /* the legacy-stream uploads land before the non-blocking stream runs */
    fl_margin_options og = make_opts(c, dflag);
    char* gx = dx_ + (size_t)c->xoff * es;
    char* gd = inplace ? gx : dd_ + (size_t)c->xoff * es;
    float* gloss_p = want_loss ? dloss : NULL;
    float* glse_p = c->want_lse ? dlse : NULL;
    const float* gl = c->pass == 2 ? dgl : NULL;
    const int before = (int)tu_failed;
#define GPU_CALL() call_margin(c, 1, gloss_p, glse_p, gd, gx, dlab, gl, gscale, &og, dws, wsb)
    st = GPU_CALL();
    CHECK_STATUS(st, FL_OK, name);
    CK(cudaStreamSynchronize(g_stream));
    float* gloss = tu_xmalloc((size_t)(nl + 1) * 4);
    float* glse = tu_xmalloc((size_t)(N + 1) * 4);
    void* gdh = tu_xmalloc((size_t)ne * es);
    void* gxh = tu_xmalloc((size_t)ne * es);
    int32_t hflag = -1;
    CK(cudaMemcpy(gloss, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(glse, dlse, (size_t)(N + 1) * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gdh, inplace ? dx_ : dd_, (size_t)ne * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gxh, dx_, (size_t)ne * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hflag, dflag, 4, cudaMemcpyDeviceToHost));
    CHECK(hflag == 0, "%s: valid targets but *error_flag = %d", name, (int)hflag);

    rowstat* rs = tu_xmalloc((size_t)(N + 1) * sizeof(rowstat));
    for (int64_t i = 0; i < N; i++) row_stats(c, hxp, i, tg[i], &rs[i]);
    char nm[360];
    if (want_loss) {
        snprintf(nm, sizeof nm, "%s loss", name);
        check_loss(nm, c, gloss, hloss, rs, NULL, c->red == FL_REDUCTION_MEAN ? D : 1);
        CHECK(tu_is_poison(gloss, 4, nl), "%s: loss guard overwritten", name);
    } else {
        int w = 0;
        for (int64_t i = 0; i <= nl; i++) w += !tu_is_poison(gloss, 4, i);
        CHECK(w == 0, "%s: loss NULL but %d loss elements written", name, w);
    }
    if (c->want_lse) {
        snprintf(nm, sizeof nm, "%s lse", name);
        check_lse(nm, c, glse, hlse, rs, NULL);
        CHECK(tu_is_poison(glse, 4, N), "%s: lse guard overwritten", name);
    } else {
        int w = 0;
        for (int64_t i = 0; i <= N; i++) w += !tu_is_poison(glse, 4, i);
        CHECK(w == 0, "%s: lse NULL but %d lse elements written", name, w);
    }
    if (fused) {
        double* g = tu_xmalloc((size_t)(N + 1) * 8);
        for (int64_t i = 0; i < N; i++) {
            g[i] = gscale * (c->pass == 2 ? hgl[none ? i : 0] : 1.0);
            if (c->red == FL_REDUCTION_MEAN) g[i] /= D ? (double)D : 1.0;
        }
        snprintf(nm, sizeof nm, "%s dlogits", name);
        check_grad(nm, c, (const char*)gdh + (size_t)c->xoff * es, hdp, hxp, tg, rs, g, NULL);
        free(g);
    }
    {   /* outside the first C columns: poison stays (padding, guards), or the input's value in place */
        const int64_t bad = count_outside_written(c, gdh, inplace ? hx : NULL, ne);
        CHECK(bad == 0, "%s: %lld dlogits elements outside the first C columns written", name, (long long)bad);
        if (!inplace) CHECK(memcmp(gxh, hx, (size_t)ne * es) == 0, "%s: logits modified", name);
    }
    /* determinism and graph replay (not in place: the inputs must survive) */
    if (!inplace && (graph || !g_small)) {
        float* l2 = tu_xmalloc((size_t)(nl + 1) * 4);
        float* s2 = tu_xmalloc((size_t)(N + 1) * 4);
        void* d2 = tu_xmalloc((size_t)ne * es);
        for (int rep = 0; rep < (graph ? 2 : 1); rep++) {
            CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
            CK(cudaMemset(dlse, 0xFF, (size_t)(N + 1) * 4));
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
            CK(cudaMemcpy(s2, dlse, (size_t)(N + 1) * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(d2, dd_, (size_t)ne * es, cudaMemcpyDeviceToHost));
            snprintf(nm, sizeof nm, "%s %s", name, rep == 0 ? "rerun bitwise" : "graph replay == eager");
            check_bitwise(nm, l2, gloss, (size_t)(nl + 1) * 4);
            check_bitwise(nm, s2, glse, (size_t)(N + 1) * 4);
            check_bitwise(nm, d2, gdh, (size_t)ne * es);
            if (rep == 1) {
                CK(cudaGraphExecDestroy(ex));
                CK(cudaGraphDestroy(gr));
            }
        }
        free(l2); free(s2); free(d2);
    }
#undef GPU_CALL
    CK(cudaFree(dx_)); CK(cudaFree(dd_)); CK(cudaFree(dloss)); CK(cudaFree(dlse)); CK(cudaFree(dgl));
    CK(cudaFree(dws)); CK(cudaFree(dflag)); CK(cudaFree(dlab));
    free(hx); free(tg); free(lab64); free(lab32); free(hgl); free(hws); free(hloss); free(hlse); free(hd);
    free(gloss); free(glse); free(gdh); free(gxh); free(rs);
    return (int)tu_failed == before;
}

/* ------------------------------------------------------------------------------------------
 * x_y = 1.0 exactly: the EXACT phi' is m1 sin(m2) / 1e-6 there (the clamp): finite loss and
 * gradient (f32 / bf16; f16 would overflow legitimately at s = 64)
 * ---------------------------------------------------------------------------------------- */
static void test_xy_one(fl_dtype dt, float m2, float m3, fl_reduction red) {
    cfg_t c;
    memset(&c, 0, sizeof c);
    c.dt = dt; c.s = 64.0f; c.m1 = 1.0f; c.m2 = m2; c.m3 = m3; c.gm = FL_MARGIN_GRAD_EXACT; c.red = red;
    c.targets = 2; c.pass = 1; c.want_lse = 1; c.N = 12; c.C = 777; c.ld = 777;
    char name[160];
    snprintf(name, sizeof name, "x_y = 1: %s m2=%g m3=%g red=%d", tu_dtype_name(dt), m2, m3, (int)red);
    const int64_t N = c.N, C = c.C, n = N * C;
    const size_t es = tu_dtype_size(dt);
    tu_rng r = tu_rng_seed(99 + (uint64_t)dt);
    void* hx = tu_xmalloc((size_t)n * es);
    int64_t* tg = tu_xmalloc((size_t)N * 8);
    for (int64_t i = 0; i < N; i++) {
        tg[i] = tu_int_in(&r, 0, C - 1);
        for (int64_t j = 0; j < C; j++)
            tu_store(hx, dt, i * C + j, (float)(i & 1 ? tu_uniform_in(&r, -0.1, 0.3) : tu_uniform_in(&r, -1, 1)));
        tu_store(hx, dt, i * C + tg[i], 1.0f);
    }
    fl_margin_options o = make_opts(&c, NULL);
    size_t wsb = 0;
    fl_margin_ce_workspace_size(&wsb, N, C, dt, &o);
    void *dx, *dd, *dws, *dt_;
    float *dl, *dls;
    int32_t* dflag;
    CK(cudaMalloc(&dx, (size_t)n * es)); CK(cudaMalloc(&dd, (size_t)n * es)); CK(cudaMalloc(&dws, wsb));
    CK(cudaMalloc(&dt_, (size_t)N * 8)); CK(cudaMalloc((void**)&dl, (size_t)N * 4));
    CK(cudaMalloc((void**)&dls, (size_t)N * 4)); CK(cudaMalloc((void**)&dflag, 4));
    CK(cudaMemcpy(dx, hx, (size_t)n * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dt_, tg, (size_t)N * 8, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd, 0xFF, (size_t)n * es)); CK(cudaMemset(dl, 0xFF, (size_t)N * 4));
    CK(cudaMemset(dls, 0xFF, (size_t)N * 4)); CK(cudaMemset(dflag, 0, 4));
    CK(cudaDeviceSynchronize());
    o.error_flag = dflag;
    fl_status st = fl_margin_ce_fused_cuda(dl, dls, dd, dx, C, dt_, FL_INDEX_I64, NULL, 1.0f, N, C, dt, &o, dws, wsb,
                                           (fl_stream)g_stream);
    CHECK_STATUS(st, FL_OK, name);
    CK(cudaStreamSynchronize(g_stream));
    float* hl = tu_xmalloc((size_t)N * 4);
    void* hd = tu_xmalloc((size_t)n * es);
    int32_t hf = -1;
    CK(cudaMemcpy(hl, dl, (size_t)N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hd, dd, (size_t)n * es, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&hf, dflag, 4, cudaMemcpyDeviceToHost));
    int badl = 0, badd = 0;
    for (int64_t i = 0; i < (red == FL_REDUCTION_NONE ? N : 1); i++) badl += !isfinite(hl[i]);
    for (int64_t k = 0; k < n; k++) badd += !isfinite(tu_load(hd, dt, k));
    CHECK(badl == 0 && badd == 0 && hf == 0, "%s: %d losses and %d gradients not finite, flag %d", name, badl, badd,
          (int)hf);
    CK(cudaFree(dx)); CK(cudaFree(dd)); CK(cudaFree(dws)); CK(cudaFree(dt_)); CK(cudaFree(dl)); CK(cudaFree(dls));
    CK(cudaFree(dflag));
    free(hx); free(tg); free(hl); free(hd);
}

/* ------------------------------------------------------------------------------------------
 * Out-of-range targets: that row's loss NaN (NONE; any SUM / MEAN NaN), its gradient NaN, the flag
 * set, the other rows as the CPU with the bad rows ignored (the bad rows count in MEAN's D, as
 * section 5), then the context still usable. Poison here is finite (0x3F bytes) so that an
 * unwritten row cannot pass as NaN.
 * ---------------------------------------------------------------------------------------- */
static void test_oob(fl_dtype dt, int targets, fl_reduction red, int use_flag) {
    cfg_t c;
    memset(&c, 0, sizeof c);
    c.dt = dt; c.s = 64.0f; c.m1 = 1.0f; c.m2 = 0.5f; c.m3 = 0.0f; c.gm = FL_MARGIN_GRAD_EXACT; c.red = red;
    c.targets = targets; c.pass = 1; c.want_lse = 1; c.N = 37; c.C = 1000; c.ld = 1000;
    const int64_t N = c.N, C = c.C, n = N * C;
    const size_t es = tu_dtype_size(dt);
    const fl_index_dtype it = idx_dtype(&c);
    const int none = red == FL_REDUCTION_NONE;
    char name[160];
    snprintf(name, sizeof name, "out-of-range targets: %s %s red=%d flag=%d", tu_dtype_name(dt),
             it == FL_INDEX_I32 ? "i32" : "i64", (int)red, use_flag);
    tu_rng r = tu_rng_seed(1234 + (uint64_t)targets * 7 + (uint64_t)red);
    void* hx = tu_xmalloc((size_t)n * es);
    int64_t* tg = tu_xmalloc((size_t)N * 8);     /* the bad targets */
    int64_t* tgc = tu_xmalloc((size_t)N * 8);    /* bad rows -> ignore_index: the CPU's view */
    int64_t* lab64 = tu_xmalloc((size_t)N * 8);
    int32_t* lab32 = tu_xmalloc((size_t)N * 4);
    int64_t* labc64 = tu_xmalloc((size_t)N * 8);
    int32_t* labc32 = tu_xmalloc((size_t)N * 4);
    unsigned char* badrow = calloc((size_t)N, 1);
    for (int64_t i = 0; i < N; i++) {
        tg[i] = i % 7 == 6 ? -100 : tu_int_in(&r, 0, C - 1);
        for (int64_t j = 0; j < C; j++) tu_store(hx, dt, i * C + j, (float)tu_uniform_in(&r, -1, 1));
        if (tg[i] != -100) tu_store(hx, dt, i * C + tg[i], draw_cos(&c, &r, -1, 1, 1));
    }
    tg[3] = C; tg[4] = -5; tg[10] = C + 1000;
    badrow[3] = badrow[4] = badrow[10] = 1;
    if (it == FL_INDEX_I64) { tg[5] = ((int64_t)1 << 32) + 1; badrow[5] = 1; }   /* truncates to 1 */
    tg[0] = 0; tg[1] = C - 1;                                                   /* the edges, valid */
    int64_t Dbad = 0;
    for (int64_t i = 0; i < N; i++) {
        Dbad += tg[i] != -100;
        tgc[i] = badrow[i] ? -100 : tg[i];
        lab64[i] = tg[i]; lab32[i] = (int32_t)tg[i]; labc64[i] = tgc[i]; labc32[i] = (int32_t)tgc[i];
    }
    const void* hlab = it == FL_INDEX_I64 ? (const void*)lab64 : (const void*)lab32;
    const void* hlabc = it == FL_INDEX_I64 ? (const void*)labc64 : (const void*)labc32;
    const size_t isz = it == FL_INDEX_I64 ? 8 : 4;
    const float gs = 0.75f;
    /* CPU reference: NONE, per-row upstream = what the GPU applies to the good rows */
    cfg_t cn = c;
    cn.red = FL_REDUCTION_NONE;
    fl_margin_options on = make_opts(&cn, NULL);
    size_t wsb = 0;
    fl_margin_ce_workspace_size(&wsb, N, C, dt, &on);
    void* hws = tu_xmalloc(wsb);
    float* rl = tu_xmalloc((size_t)N * 4);
    float* rlse = tu_xmalloc((size_t)N * 4);
    float* rg = tu_xmalloc((size_t)N * 4);
    double* g = tu_xmalloc((size_t)N * 8);
    void* rd = tu_xmalloc((size_t)n * es);
    for (int64_t i = 0; i < N; i++) {
        rg[i] = (float)(red == FL_REDUCTION_MEAN ? gs / (double)Dbad : gs);
        g[i] = rg[i];
    }
    CHECK_STATUS(fl_margin_ce_fused_cpu(rl, rlse, rd, hx, C, hlabc, it, rg, 1.0f, N, C, dt, &on, hws, wsb), FL_OK,
                 "oob cpu reference");
    {   /* the CPU itself rejects the bad targets */
        float* l2 = tu_xmalloc((size_t)N * 4);
        void* d2 = tu_xmalloc((size_t)n * es);
        fl_status s2 = fl_margin_ce_fused_cpu(l2, NULL, d2, hx, C, hlab, it, NULL, 1.0f, N, C, dt, &on, hws, wsb);
        CHECK_STATUS(s2, FL_ERR_TARGET_OUT_OF_RANGE, "oob cpu with the bad targets");
        free(l2); free(d2);
    }
    rowstat* rs = tu_xmalloc((size_t)N * sizeof(rowstat));
    for (int64_t i = 0; i < N; i++) row_stats(&c, hx, i, tgc[i], &rs[i]);

    fl_margin_options o = make_opts(&c, NULL);
    const size_t nlb = (size_t)(none ? N : 1) * 4;
    void *dx, *dw, *dd, *dlab, *dlabc, *dws;
    float *dl, *dls, *dgl;
    int32_t* dflag;
    CK(cudaMalloc(&dx, (size_t)n * es)); CK(cudaMalloc(&dw, (size_t)n * es)); CK(cudaMalloc(&dd, (size_t)n * es));
    CK(cudaMalloc(&dlab, (size_t)N * 8)); CK(cudaMalloc(&dlabc, (size_t)N * 8)); CK(cudaMalloc(&dws, wsb));
    CK(cudaMalloc((void**)&dl, (size_t)N * 4)); CK(cudaMalloc((void**)&dls, (size_t)N * 4));
    CK(cudaMalloc((void**)&dgl, (size_t)N * 4)); CK(cudaMalloc((void**)&dflag, 4));
    CK(cudaMemcpy(dx, hx, (size_t)n * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlab, hlab, (size_t)N * isz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlabc, hlabc, (size_t)N * isz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dgl, rg, (size_t)N * 4, cudaMemcpyHostToDevice));
    o.error_flag = use_flag ? dflag : NULL;
    float* hl = tu_xmalloc((size_t)N * 4);
    float* hls = tu_xmalloc((size_t)N * 4);
    void* hd = tu_xmalloc((size_t)n * es);
    char nm[240];
    for (int op = 0; op < 3; op++) {   /* forward, fused, fused in place */
        CK(cudaMemset(dflag, 0, 4));
        CK(cudaMemset(dl, 0x3F, (size_t)N * 4));
        CK(cudaMemset(dls, 0x3F, (size_t)N * 4));
        CK(cudaMemset(dd, 0x3F, (size_t)n * es));
        CK(cudaMemcpy(dw, dx, (size_t)n * es, cudaMemcpyDeviceToDevice));
        CK(cudaDeviceSynchronize());
        void* gdl = op == 2 ? dw : dd;
        const void* gx = op == 2 ? dw : dx;
        fl_status st = op == 0 ? fl_margin_ce_forward_cuda(dl, dls, gx, C, dlab, it, N, C, dt, &o, dws, wsb,
                                                           (fl_stream)g_stream)
                               : fl_margin_ce_fused_cuda(dl, dls, gdl, gx, C, dlab, it, NULL, gs, N, C, dt, &o, dws,
                                                         wsb, (fl_stream)g_stream);
        snprintf(nm, sizeof nm, "%s op=%d", name, op);
        CHECK_STATUS(st, FL_OK, nm);
        zt_check_call_ok(nm, dflag, use_flag);
        CK(cudaMemcpy(hl, dl, nlb, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hls, dls, (size_t)N * 4, cudaMemcpyDeviceToHost));
        char nm2[300];
        if (none) {
            int nn = 0;
            for (int64_t i = 0; i < N; i++) nn += badrow[i] && !isnan(hl[i]);
            CHECK(nn == 0, "%s: %d bad rows with a loss that is not NaN", nm, nn);
            snprintf(nm2, sizeof nm2, "%s loss (good rows)", nm);
            check_loss(nm2, &cn, hl, rl, rs, badrow, 1);
        } else {
            CHECK(isnan(hl[0]), "%s: loss %g, want NaN", nm, (double)hl[0]);
        }
        snprintf(nm2, sizeof nm2, "%s lse (good rows)", nm);
        check_lse(nm2, &cn, hls, rlse, rs, badrow);   /* a bad row's lse is not specified */
        if (op != 0) {
            CK(cudaMemcpy(hd, gdl, (size_t)n * es, cudaMemcpyDeviceToHost));
            int64_t notnan = 0;
            for (int64_t i = 0; i < N; i++)
                if (badrow[i])
                    for (int64_t j = 0; j < C; j++) notnan += !isnan(tu_load(hd, dt, i * C + j));
            CHECK(notnan == 0, "%s: %lld gradient entries of bad rows not NaN", nm, (long long)notnan);
            snprintf(nm2, sizeof nm2, "%s dlogits (good rows)", nm);
            check_grad(nm2, &cn, hd, rd, hx, tgc, rs, g, badrow);
        }
    }
    {   /* the context still works: a valid call (bad rows ignored), the flag stays 0 */
        CK(cudaMemset(dflag, 0, 4));
        CK(cudaMemset(dl, 0xFF, (size_t)N * 4));
        CK(cudaMemset(dd, 0xFF, (size_t)n * es));
        CK(cudaDeviceSynchronize());
        fl_margin_options ov = make_opts(&cn, dflag);
        fl_status st = fl_margin_ce_fused_cuda(dl, NULL, dd, dx, C, dlabc, it, dgl, 1.0f, N, C, dt, &ov, dws, wsb,
                                               (fl_stream)g_stream);
        snprintf(nm, sizeof nm, "%s: valid call after", name);
        CHECK_STATUS(st, FL_OK, nm);
        CK(cudaDeviceSynchronize());
        int32_t hf = -1;
        CK(cudaMemcpy(&hf, dflag, 4, cudaMemcpyDeviceToHost));
        CHECK(hf == 0, "%s: *error_flag = %d", nm, (int)hf);
        CK(cudaMemcpy(hl, dl, (size_t)N * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hd, dd, (size_t)n * es, cudaMemcpyDeviceToHost));
        char nm2[300];
        snprintf(nm2, sizeof nm2, "%s loss", nm);
        check_loss(nm2, &cn, hl, rl, rs, NULL, 1);
        snprintf(nm2, sizeof nm2, "%s dlogits", nm);
        check_grad(nm2, &cn, hd, rd, hx, tgc, rs, g, NULL);
    }
    CK(cudaFree(dx)); CK(cudaFree(dw)); CK(cudaFree(dd)); CK(cudaFree(dlab)); CK(cudaFree(dlabc)); CK(cudaFree(dws));
    CK(cudaFree(dl)); CK(cudaFree(dls)); CK(cudaFree(dgl)); CK(cudaFree(dflag));
    free(hx); free(tg); free(tgc); free(lab64); free(lab32); free(labc64); free(labc32); free(badrow); free(hws);
    free(rl); free(rlse); free(rg); free(g); free(rd); free(rs); free(hl); free(hls); free(hd);
}

/* ------------------------------------------------------------------------------------------
 * N = 0, bad arguments through the CUDA entries (outputs untouched)
 * ---------------------------------------------------------------------------------------- */
static void test_misc(void) {
    fl_margin_options o = FL_MARGIN_OPTIONS_INIT;
    size_t wsb = 0;
    fl_margin_ce_workspace_size(&wsb, 4, 10, FL_DTYPE_BF16, &o);
    void *x, *t, *d, *ws;
    float* l;
    CK(cudaMalloc(&x, 256)); CK(cudaMalloc(&t, 256)); CK(cudaMalloc(&d, 256)); CK(cudaMalloc(&ws, wsb + 256));
    CK(cudaMalloc((void**)&l, 64));
    CK(cudaMemset(x, 0, 256)); CK(cudaMemset(t, 0, 256));
    /* N = 0: SUM 0, MEAN NaN (forward and fused) */
    const fl_reduction reds[2] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
    for (int k = 0; k < 4; k++) {
        o.reduction = reds[k & 1];
        float h = 1.0f;
        CK(cudaMemset(l, 0xFF, 64));
        CK(cudaDeviceSynchronize());
        fl_status st = k < 2 ? fl_margin_ce_forward_cuda(l, NULL, x, 10, t, FL_INDEX_I64, 0, 10, FL_DTYPE_BF16, &o, ws,
                                                         wsb, (fl_stream)g_stream)
                             : fl_margin_ce_fused_cuda(l, NULL, d, x, 10, t, FL_INDEX_I64, NULL, 1.0f, 0, 10,
                                                       FL_DTYPE_BF16, &o, ws, wsb, (fl_stream)g_stream);
        CHECK_STATUS(st, FL_OK, "N = 0");
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(&h, l, 4, cudaMemcpyDeviceToHost));
        CHECK((k & 1) == 0 ? h == 0.0f : isnan(h), "N = 0 %s reduction %d: loss %g", k < 2 ? "forward" : "fused",
              (int)reds[k & 1], (double)h);
    }
    /* bad arguments: the status, the function named, nothing written */
    CK(cudaMemset(l, 0xFF, 64));
    CK(cudaMemset(d, 0xFF, 256));
    CK(cudaDeviceSynchronize());
    fl_margin_options ob = FL_MARGIN_OPTIONS_INIT;
    ob.reduction = (fl_reduction)7;
    fl_status st = fl_margin_ce_forward_cuda(l, NULL, x, 10, t, FL_INDEX_I64, 4, 10, FL_DTYPE_BF16, &ob, ws, wsb,
                                             (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "fl_margin_ce_forward_cuda"),
          "reduction 7 (forward): status %d (%s)", (int)st, fl_last_error());
    st = fl_margin_ce_fused_cuda(l, NULL, d, x, 10, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, FL_DTYPE_BF16, &ob, ws, wsb,
                                 (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "fl_margin_ce_fused_cuda"),
          "reduction 7 (fused): status %d (%s)", (int)st, fl_last_error());
    ob = o;
    ob.m2 = 3.5f;
    st = fl_margin_ce_fused_cuda(l, NULL, d, x, 10, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, FL_DTYPE_BF16, &ob, ws, wsb,
                                 (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "m2"), "m2 = 3.5: status %d (%s)", (int)st,
          fl_last_error());
    st = fl_margin_ce_fused_cuda(l, NULL, d, (char*)x + 1, 10, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, FL_DTYPE_BF16, &o,
                                 ws, wsb, (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT, "misaligned logits: status %d (%s)", (int)st, fl_last_error());
    st = fl_margin_ce_fused_cuda(l, NULL, d, x, 10, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, FL_DTYPE_BF16, &o,
                                 (char*)ws + 128, wsb, (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT, "workspace not 256-byte aligned: status %d (%s)", (int)st, fl_last_error());
    CK(cudaDeviceSynchronize());
    {
        const int w = zt_count_written(d, 256, l, 16);
        CHECK(w == 0, "bad arguments: %d output bytes / floats written", w);
    }
    CK(cudaFree(x)); CK(cudaFree(t)); CK(cudaFree(d)); CK(cudaFree(ws)); CK(cudaFree(l));
}

int main(int argc, char** argv) {
    {
        const int rc = zt_cuda_test_start(argc, argv, "test_margin_ce_cuda", &g_small);
        if (rc >= 0) return rc;
    }
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    tu_quiet = 1;
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const float margins[4][3] = {{1.0f, 0.5f, 0.0f}, {1.0f, 0.0f, 0.4f}, {1.0f, 0.3f, 0.2f}, {2.0f, 0.0f, 0.0f}};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
    /* N, C, ld */
    const int64_t shapes[][3] = {{1, 1, 1},         {7, 3, 5},         {33, 8192, 8192},  {17, 8193, 8200},
                                 {129, 8003, 8003}, {64, 20000, 20011}, {300, 1000, 1000}, {8, 100000, 100000},
                                 {256, 512, 512},
                                 /* the staged kernel (sm_90 default): clusters of 2-8 CTAs and a tail, within --small */
                                 {2, 65541, 65544},
                                 /* the warp-a-row kernel's other register widths (32 KE >= C: 8, 64, 128), odd ld */
                                 {9, 200, 203},     {6, 1500, 1500},   {5, 3000, 3001}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    uint64_t seed = 17;
    long cases = 0, bad = 0;
    for (int di = 0; di < 3; di++)
        for (int mi = 0; mi < 4; mi++)
            for (int si = 0; si < nshapes; si++)
                for (int v = 0; v < 6; v++) {
                    cfg_t c;
                    memset(&c, 0, sizeof c);
                    c.dt = dts[di];
                    c.m1 = margins[mi][0];
                    c.m2 = margins[mi][1];
                    c.m3 = margins[mi][2];
                    c.N = shapes[si][0];
                    c.C = shapes[si][1];
                    c.ld = shapes[si][2];
                    if (g_small && c.N * c.ld > (1 << 18)) continue;
                    /* the variants cycle through the options so that every combination class is hit */
                    c.pass = v % 4;
                    c.red = reds[(v + si + mi) % 3];
                    c.s = (v + si) % 3 == 2 ? 1.0f : 64.0f;
                    c.easy = (v + mi + di) & 1;
                    c.gm = ((v / 2 + si + di) & 1) ? FL_MARGIN_GRAD_STRAIGHT : FL_MARGIN_GRAD_EXACT;
                    c.targets = (v + si + di) % 3;
                    if (v == 5 && (si + mi) % 4 == 0) c.targets = 3;   /* every row ignored */
                    c.want_lse = (v + si + mi + di) & 1;
                    c.noloss = (c.pass == 2 && (si + di) % 2 == 0) || (c.pass == 3 && (si + mi) % 3 == 0);
                    c.xoff = v >= 4 && (si + mi) % 2 == 0;
                    const int graph = si == 3 && mi == di && v == 1 + (di & 1);
                    cases++;
                    if (!run_case(&c, seed++, graph)) bad++;
                }
    printf("grid: %ld cases, %ld failed\n", cases, bad);
    test_xy_one(FL_DTYPE_F32, 0.5f, 0.0f, FL_REDUCTION_NONE);
    test_xy_one(FL_DTYPE_BF16, 0.5f, 0.0f, FL_REDUCTION_MEAN);
    test_xy_one(FL_DTYPE_F32, 0.3f, 0.2f, FL_REDUCTION_SUM);
    test_xy_one(FL_DTYPE_BF16, 0.3f, 0.2f, FL_REDUCTION_NONE);
    for (int k = 0; k < 4; k++) {
        const fl_dtype dt = k < 2 ? FL_DTYPE_F32 : FL_DTYPE_BF16;
        test_oob(dt, k & 1 ? 1 : 0, FL_REDUCTION_NONE, 1);
        test_oob(dt, k & 1 ? 0 : 1, FL_REDUCTION_MEAN, k != 3);
    }
    test_misc();
    CK(cudaStreamDestroy(g_stream));
    return tu_finish();
}
