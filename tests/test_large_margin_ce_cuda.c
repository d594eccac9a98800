/* test_large_margin_ce_cuda.c — the CUDA large-margin softmax cross-entropy (include/fusedloss.h
 * section 15) against the CPU backend (the reference in double, itself checked against a
 * long-double reference, finite differences and pytorch-loss's formulation by
 * tests/test_large_margin_ce.c). Modelled on tests/test_taylor_ce_cuda.c.
 *
 * Grid: N in {1, 7, 129, 1031} x C in {2, 3, 7, 32, 33, 100, 1000, 1024, 1025, 5000, 32000, 20000, 20001} (the
 * backend takes one warp per row up to C = 1024 and one CTA per row beyond: both sides of the
 * switch; C = 2: one non-target class), N * C capped at 8M (1031 x 32000 is the big graph case
 * instead), 8 variants per shape up to N * C = 2^20, 4 beyond; each variant draws, through
 * cycles over (shape, variant): fp32 / fp16 / bf16, lambda 0 / 0.3 / 1, NONE / SUM / MEAN, int32
 * / int64 targets, ignored rows (none, some with -100, some with 255 (a real class when C > 255,
 * rows with target 255 then ignored), every row), pass (forward, fused out of place, fused in
 * place), grad_loss a device array ([N] for NONE, [1] else: the rest NaN, never read) or NULL,
 * grad_scale 1 / -2.5, loss NULL in some fused cases, ld = C or C + 1 / 3 / 7 (padding NaN /
 * 30000 in the logits: never read; poisoned in dlogits: never written), the logits one element
 * off their 16-byte phase (the unaligned kernels), and (out of place) a dlogits buffer of another
 * phase than the logits. Row kinds: uniform [-3, 3]; an offset row 500 + [-3, 3] (the shift by
 * m'); a wide row [-80, 80]; the target dominating (x_y = 15 or 33 over [-3, 3]: tiny losses,
 * the log1p path); constant non-target logits (q uniform: the regulariser 0); a tiny target
 * probability (x_y = -30 over [1, 4]). Ignored rows hold NaN logits (never read). Outputs are
 * poisoned (0xFF bytes: NaN in every dtype, cudaMemsetAsync on the test's stream) before every
 * call, so an element not written fails the comparison; every element outside the first C columns
 * of a row (padding, the guards around the matrix) must stay poisoned, or keep the input's value
 * in place; a forward / out-of-place call must leave the logits intact; a valid call must leave
 * the device error flag 0. Plus: two runs bitwise equal (determinism), CUDA graph capture
 * (non-default stream) + replay bitwise equal to eager (grid cases on both sides of C = 1024, and
 * N = 4096, C = 32000 bf16 MEAN fused with grad_loss on the device, its loss and sampled rows
 * against the CPU), out-of-range targets (C, -7, C + 1000, -1, 2^32 + 1: FL_OK, that row's loss
 * / the reduced loss NaN, that row's gradient NaN, the other rows right (the bad rows count in
 * MEAN's D), *error_flag = 1; the context still usable), N = 0, bad arguments through the CUDA
 * entries (nothing written).
 *
 * Tolerances: |gpu - cpu| <= atol + rtol |cpu| + slack, (atol, rtol) per dtype in the table
 * below, slack a first-order bound of the kernel's fp32 arithmetic (u = 2^-24) times SAFETY,
 * computed per row in double from the same dtype-rounded logits with the kernel's formulation
 * (src/cuda/large_margin_ce.cu: m' = max_{k != y} x_k, d_k = x_k - m', e_k = exp(d_k), s = sum
 * e_k, w = sum e_k d_k, b = sum d_k, A' = w / s, reg = A' - b / (C - 1), dd = m' - x_y,
 * P = exp(m' - lse), 1 - p_y = s P):
 *   es   = u (K_SUM sqrt(C) + 8 + K_E + sum e_k |d_k| / s + [C > 1024] 3 R)   relative error of s
 *          (fp32 sums in runs, a tree; R = C / (512 VEC) + 10 re-shifts of the CTA kernel's
 *          running statistics, each rounding exp(m_old - m_new));
 *   eA   = (sum e_k |d_k| (es + u (K_E + 2)) + u sum e_k d_k^2) / s + |A'| (es + u);
 *   eb   = u (K_SUM sqrt(C) + 9 + [C > 1024] 3 R) |b|;   ereg = eA + eb / (C - 1) + 2 u (|A'| + |b| / (C - 1));
 *   eCE  = (1 - p_y) (es + u (|dd| + K_E)) + [dd >= 0] p_y u (|dd| + K_E) + 4 u CE
 *          (relative to CE when the target dominates: the log1p form);
 *   loss : SAFETY (eCE + (lambda / 2) ereg) + RTOL_LOSS |ref|; SUM / MEAN: the rows' bounds summed +
 *          u (K_SUM sqrt(N) + 8) sum_i |l_i|, / D for MEAN;
 *   eP   = (1 - p_y) es + ([dd < 0] + [dd >= 0] p_y) u (|dd| + K_E) + 3 u;
 *   dlogits[j != y] (e = e_j, ee = u (|d_j| + K_E), dk = d_j + 1 - A'):
 *          |g| SAFETY (e P (ee + eP + 4u) + (lambda / 2)(e / s)(|dk| (ee + es + 4u) + u |d_j| + eA +
 *          u (1 + |A'|)) + 3u (lambda / 2) / (C - 1) + 2u (e P + (lambda / 2)((e / s)|dk| + 1 / (C - 1))));
 *   dlogits[y] : |g| SAFETY (1 - p_y)(es + eP + 4u).
 *   Plus the CPU reference's own error (U64 = 2^-53, inside SAFETY): it forms the regulariser
 *   unshifted in double, which cancels for large logits (lse - x_y and p_y - 1 take the GPU's
 *   log1p / -sum p_k forms when the target dominates since s30: with the target's 1 inside the
 *   sum, the CPU's p_y - 1 was 1.4e-4 off at 1 - p_y = 5e-10, C = 32000, the first time a seed
 *   drew that row, while the GPU was right to 6e-7 of a 40-digit sum; the bounds stay as they
 *   were): loss U64 (4 (|lse| + |x_y| + 2) + (lambda / 2) (8 + 2 sqrt(C)) 2 (max |x| + |lse'|)); dlogits[y] |g| U64 (4 + 2 p_y (|x_y| + |lse| + 2));
 *   dlogits[j] |g| U64 (p_j (|x_j| + |lse| + 4) + (lambda / 2)(q_j (|x_j| + 1 + |A|)(|x_j| + |lse'| + 6)
 *   + 2 / (C - 1))).
 *   SAFETY = 2, K_SUM = 2, K_E = 6 (the kernels' per-element exp is ex2.approx.ftz of d log2(e):
 *   relative error <= 2^-22 = 4 u, plus the rounding of the product and of d), RTOL_LOSS = 1e-6;
 *   an element whose e_j < 2^-126 is flushed to 0 by the kernel: its dlogits bound gains
 *   2^-126 (P + (lambda / 2) |dk| / s). A host
 *   emulation of the kernels' fp32 arithmetic (same partition and trees; with expf, before the
 *   ex2 form) used at most 7 % (loss) /
 *   18 % (dlogits) of the slack over the --small grid, 10 % of the whole loss tolerance and 98 %
 *   of the dlogits one (a 1-ulp difference of the output dtype at a binade edge, within rtol).
 *   Gradient rtol: one rounding of the output dtype on each side (the GPU rounds fp32 -> dtype
 *   once, the CPU double -> fp32 -> dtype); atol: f16 6e-8 (subnormal spacing 2^-24), f32 / bf16
 *   2^-126; ignored rows exactly 0. The worst |gpu - cpu| / tolerance seen is printed at the end.
 * Run:   build/test_large_margin_ce_cuda [--small]   (--small: N * ld <= 2^18 and half the
 *        variants, the big graph case at N = 8, for compute-sanitizer)
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L /* setenv: the prefetch-path A/B of test_graph_big */
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "cuda_check.h"
#include "zoo_test_util.h"

/*                                  fp32      fp16 (1 ulp)  bf16 (1 ulp) */
static const double RTOL_D[3] = {2e-6, 9.8e-4, 7.9e-3};   /* dlogits */
static const double ATOL_D[3] = {1.1754944e-38, 6e-8, 1.1754944e-38};
static const double RTOL_LOSS = 1e-6;                     /* loss (fp32 in every dtype) */
static const double U32 = 5.9604644775390625e-8;          /* 2^-24 */
static const double U64 = 1.1102230246251565e-16;         /* 2^-53: the CPU reference's double */
static const double K_SUM = 2.0, K_E = 6.0, SAFETY = 2.0;
static const int64_t NC_CAP = (int64_t)8 << 20;           /* N * C per grid case */

static int g_small = 0;
static cudaStream_t g_stream;
static double g_worst_loss = 0.0, g_worst_grad = 0.0;    /* max |gpu - cpu| / tolerance seen */
static char g_worst_where[2][480];                        /* the case, row and column of each */

/* ------------------------------------------------------------------------------------------
 * Checks that print only the first SHOW_MAX failures (with the case), then count silently
 * ---------------------------------------------------------------------------------------- */
enum { SHOW_MAX = 20 };
static long g_shown = 0;

static int t_check(int ok, int line, const char* fmt, ...) {
    if (ok) { tu_passed++; return 1; }
    tu_failed++;
    if (g_shown++ < SHOW_MAX) {
        va_list ap;
        printf("FAIL %s:%d: ", __FILE__, line);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
    }
    return 0;
}
#define TCHECK(cond, ...) t_check(!!(cond), __LINE__, __VA_ARGS__)
#define TSTATUS(got, want, what)                                                                   \
    TCHECK((got) == (want), "%s: status %d (%s), expected %d (%s); last error: \"%s\"", (what),    \
           (int)(got), fl_status_string(got), (int)(want), fl_status_string(want), fl_last_error())

/* |got - ref| <= atol + rtol |ref| + sl[k] (sl may be NULL); NaN matches only NaN, an infinity only
 * the same one. One check; the first 3 mismatches shown (row k / C, column k % C). *worst: the
 * largest |got - ref| / tolerance (or NULL). */
static int t_close(const char* name, const double* got, const double* ref, const double* sl, int64_t n, double atol,
                   double rtol, int64_t C, double* worst) {
    int64_t bad = 0, first[3] = {0, 0, 0};
    for (int64_t k = 0; k < n; k++) {
        const double g = got[k], r = ref[k];
        int ok;
        if (isnan(r) || isnan(g)) ok = isnan(r) && isnan(g);
        else if (isinf(r) || isinf(g)) ok = g == r;
        else {
            const double tol = atol + rtol * fabs(r) + (sl ? sl[k] : 0.0), d = fabs(g - r);
            ok = d <= tol;
            if (worst && tol > 0 && d / tol > *worst) {
                *worst = d / tol;
                snprintf(g_worst_where[worst == &g_worst_grad], sizeof g_worst_where[0],
                         "%s [row %lld, col %lld]: got %.9g, ref %.9g, tol %.3g", name, (long long)(k / C),
                         (long long)(k % C), g, r, tol);
            }
        }
        if (!ok) {
            if (bad < 3) first[bad] = k;
            bad++;
        }
    }
    if (bad == 0) { tu_passed++; return 1; }
    tu_failed++;
    if (g_shown++ < SHOW_MAX) {
        printf("FAIL %s: %lld of %lld elements off\n", name, (long long)bad, (long long)n);
        for (int m = 0; m < 3 && m < bad; m++) {
            const int64_t k = first[m];
            printf("    [row %lld, col %lld]: got %.9g, ref %.9g, diff %.3g, tol %.3g\n", (long long)(k / C),
                   (long long)(k % C), got[k], ref[k], fabs(got[k] - ref[k]),
                   atol + rtol * fabs(ref[k]) + (sl ? sl[k] : 0.0));
        }
    }
    return 0;
}

static int t_bitwise(const char* name, const void* a, const void* b, size_t bytes) {
    if (bytes == 0 || memcmp(a, b, bytes) == 0) { tu_passed++; return 1; }
    size_t i = 0;
    while (((const unsigned char*)a)[i] == ((const unsigned char*)b)[i]) i++;
    return TCHECK(0, "%s: not bitwise equal (first differing byte %zu of %zu)", name, i, bytes);
}

/* Device transfers and fills, all on the test's (non-blocking) stream: a legacy-stream cudaMemset
 * or pageable cudaMemcpy is not ordered with it (NOTES.md, "Traps seen") */
static void up(void* d, const void* h, size_t n) { CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, g_stream)); }
static void fill(void* d, int byte, size_t n) { CK(cudaMemsetAsync(d, byte, n, g_stream)); }
static void down(void* h, const void* d, size_t n) {
    CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, g_stream));
    CK(cudaStreamSynchronize(g_stream));
}

/* after a call that must have run: the context alive (else FATAL, exit 2), no pending error, and
 * (dflag non-NULL) *dflag == want_flag */
static void sync_ok(const char* nm, const int32_t* dflag, int want_flag) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("FATAL: %s killed the context: %s\n", nm, cudaGetErrorString(e));
        exit(2);
    }
    e = cudaGetLastError();
    TCHECK(e == cudaSuccess, "%s: cudaGetLastError() = %s", nm, cudaGetErrorString(e));
    if (dflag) {
        int32_t hf = -1;
        down(&hf, dflag, 4);
        TCHECK(hf == want_flag, "%s: *error_flag = %d, want %d", nm, (int)hf, want_flag);
    }
}

/* ------------------------------------------------------------------------------------------
 * Configuration
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    fl_dtype dt;
    float lam;
    fl_reduction red;
    int i64;      /* int64 targets (else int32) */
    int ign;      /* 0 none ignored, 1 some (-100), 2 some (ignore_index 255), 3 every row (-100) */
    int pass;     /* 0 forward, 1 fused out of place, 2 fused in place */
    int gl;       /* fused: grad_loss a device array */
    float gs;     /* fused: grad_scale */
    int noloss;   /* fused: loss NULL */
    int64_t N, C, ld;
    int xoff, doff;   /* element offsets of the logits / the (out of place) dlogits in their buffers */
} cfg_t;

static int64_t ign_index(const cfg_t* c) { return c->ign == 2 ? 255 : -100; }
static fl_index_dtype idx_dtype(const cfg_t* c) { return c->i64 ? FL_INDEX_I64 : FL_INDEX_I32; }
static const char* red_name(fl_reduction r) {
    return r == FL_REDUCTION_NONE ? "none" : r == FL_REDUCTION_MEAN ? "mean" : r == FL_REDUCTION_SUM ? "sum" : "?";
}

static fl_large_margin_options make_opts(const cfg_t* c, int32_t* flag) {
    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT;
    o.lambda = c->lam;
    o.ignore_index = ign_index(c);
    o.reduction = c->red;
    o.error_flag = flag;
    return o;
}

/* One call on either backend (pointers of that backend). */
static fl_status call_lm(const cfg_t* c, int cuda, float* loss, void* dx, const void* x, const void* tg,
                         const float* gl, const fl_large_margin_options* o, void* ws, size_t wsb) {
    const fl_index_dtype it = idx_dtype(c);
    if (c->pass == 0)
        return cuda ? fl_large_margin_ce_forward_cuda(loss, x, c->ld, tg, it, c->N, c->C, c->dt, o, ws, wsb,
                                                      (fl_stream)g_stream)
                    : fl_large_margin_ce_forward_cpu(loss, x, c->ld, tg, it, c->N, c->C, c->dt, o, ws, wsb);
    return cuda ? fl_large_margin_ce_fused_cuda(loss, dx, x, c->ld, tg, it, gl, c->gs, c->N, c->C, c->dt, o, ws, wsb,
                                                (fl_stream)g_stream)
                : fl_large_margin_ce_fused_cpu(loss, dx, x, c->ld, tg, it, gl, c->gs, c->N, c->C, c->dt, o, ws, wsb);
}

/* ------------------------------------------------------------------------------------------
 * Row statistics in double with the kernel's formulation, and the error bounds of the header
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    int ign;
    double mo, s, As, dd, P, omp, py, ce, l;   /* m', s, A', m' - x_y, exp(m' - lse), 1 - p_y, p_y, lse - x_y, loss */
    double lse, lseo, M;                      /* lse, lse' = m' + log s, max |x| (the CPU's error) */
    double es, eA, eP, dl;                    /* dl: the loss's absolute bound */
} rowstat;

static double re_shifts(const cfg_t* c) {   /* R of the header comment (CTA kernel) */
    return (double)c->C / (512.0 * (16.0 / (double)tu_dtype_size(c->dt))) + 10.0;
}

static void row_stats(const cfg_t* c, const void* x, int64_t i, int64_t y, rowstat* r) {
    memset(r, 0, sizeof *r);
    if (y == ign_index(c)) { r->ign = 1; return; }
    const int64_t C = c->C, r0 = i * c->ld;
    const double u = U32, cc = 1.0 / (double)(C - 1), half = 0.5 * (double)c->lam;
    const double xy = tu_load(x, c->dt, r0 + y);
    double mo = -INFINITY;
    for (int64_t j = 0; j < C; j++)
        if (j != y) mo = fmax(mo, tu_load(x, c->dt, r0 + j));
    double s = 0, w = 0, b = 0, sd = 0, sd2 = 0;
    for (int64_t j = 0; j < C; j++) {
        if (j == y) continue;
        const double d = tu_load(x, c->dt, r0 + j) - mo, e = exp(d);
        s += e;
        w += e * d;
        b += d;
        sd += e * fabs(d);
        sd2 += e * d * d;
    }
    const double As = w / s, reg = As - cc * b, dd = mo - xy;
    double ce, P, py;
    if (dd >= 0) {
        const double den = s + exp(-dd);
        ce = dd + log(den);
        P = 1.0 / den;
        py = exp(-dd) / den;
    } else {
        const double rr = exp(dd), t = s * rr;
        ce = log1p(t);
        P = rr / (1.0 + t);
        py = 1.0 / (1.0 + t);
    }
    const double omp = s * P;
    const double cta = C > 1024 ? 3.0 * re_shifts(c) : 0.0;
    const double es = u * (K_SUM * sqrt((double)C) + 8.0 + K_E + sd / s + cta);
    const double eA = (sd * (es + u * (K_E + 2.0)) + u * sd2) / s + fabs(As) * (es + u);
    const double eb = u * (K_SUM * sqrt((double)C) + 9.0 + cta) * fabs(b);
    const double ereg = eA + cc * eb + 2.0 * u * (fabs(As) + cc * fabs(b));
    const double ex = u * (fabs(dd) + K_E);
    const double eCE = omp * (es + ex) + (dd >= 0 ? py * ex : 0.0) + 4.0 * u * ce;
    r->mo = mo; r->s = s; r->As = As; r->dd = dd; r->P = P; r->omp = omp; r->py = py; r->ce = ce;
    r->l = ce + half * reg;
    r->es = es;
    r->eA = eA;
    r->eP = omp * es + (dd < 0 ? 1.0 : py) * ex + 3.0 * u;
    r->lse = xy + ce;
    r->lseo = mo + log(s);
    r->M = 0.0;
    for (int64_t j = 0; j < C; j++) r->M = fmax(r->M, fabs(tu_load(x, c->dt, r0 + j)));
    /* the CPU reference's own error (double, unshifted: lse - x_y and the regulariser cancel there) */
    const double ecpu = U64 * (4.0 * (fabs(r->lse) + fabs(xy) + 2.0) +
                               half * (8.0 + 2.0 * sqrt((double)C)) * 2.0 * (r->M + fabs(r->lseo)));
    r->dl = SAFETY * (eCE + half * ereg + ecpu);
}

/* Losses: NONE per row (rows with skip[i] left out), else the one reduced value (Dm: MEAN's D) */
static int check_loss(const char* name, const cfg_t* c, const float* gpu, const float* cpu, const rowstat* rs,
                      const unsigned char* skip, double Dm) {
    const int64_t N = c->N;
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    double* a = tu_xmalloc((size_t)(nl + 1) * 8);
    double* b = tu_xmalloc((size_t)(nl + 1) * 8);
    double* sl = tu_xmalloc((size_t)(nl + 1) * 8);
    double tot = 0.0, labs = 0.0;
    for (int64_t i = 0; i < N; i++)
        if (!rs[i].ign && !(skip && skip[i])) { tot += rs[i].dl; labs += fabs(rs[i].l); }
    int64_t k = 0;
    for (int64_t i = 0; i < nl; i++) {
        if (skip && skip[i]) continue;
        a[k] = gpu[i];
        b[k] = cpu[i];
        sl[k] = none ? rs[i].dl : (tot + U32 * (K_SUM * sqrt((double)N) + 8.0) * labs) / (Dm > 0 ? Dm : 1.0);
        k++;
    }
    const int ok = t_close(name, a, b, sl, k, 0.0, RTOL_LOSS, 1, &g_worst_loss);
    free(a); free(b); free(sl);
    return ok;
}

/* The first C columns of every row (gpu, cpu: the matrices as the library sees them, row stride
 * ld), rows with skip[i] left out; g[i]: the row's upstream gradient (grad_scale, grad_loss, / D) */
static int check_grad(const char* name, const cfg_t* c, const void* gpu, const void* cpu, const void* x,
                      const int64_t* tg, const rowstat* rs, const double* g, const unsigned char* skip) {
    const int64_t N = c->N, C = c->C, ld = c->ld;
    const double u = U32, cc = 1.0 / (double)(C - 1), half = 0.5 * (double)c->lam;
    const size_t ne = (size_t)N * (size_t)C;
    double* a = tu_xmalloc((ne + 1) * 8);
    double* b = tu_xmalloc((ne + 1) * 8);
    double* sl = tu_xmalloc((ne + 1) * 8);
    int64_t k = 0;
    for (int64_t i = 0; i < N; i++) {
        if (skip && skip[i]) continue;
        const rowstat* r = &rs[i];
        const double ga = fabs(g[i]);
        for (int64_t j = 0; j < C; j++, k++) {
            a[k] = tu_load(gpu, c->dt, i * ld + j);
            b[k] = tu_load(cpu, c->dt, i * ld + j);
            if (r->ign) { sl[k] = 0.0; continue; }
            const double v = tu_load(x, c->dt, i * ld + j);
            if (j == tg[i]) {   /* the CPU's p_y - 1 cancels when the target dominates */
                const double ecpu = U64 * (4.0 + 2.0 * r->py * (fabs(v) + fabs(r->lse) + 2.0));
                sl[k] = ga * SAFETY * (r->omp * (r->es + r->eP + 4.0 * u) + ecpu);
                continue;
            }
            const double d = v - r->mo, e = exp(d), ee = u * (fabs(d) + K_E);
            const double p = e * r->P, q = e / r->s, dk = fabs(d + 1.0 - r->As);
            const double ftz = e < 0x1p-126 ? 0x1p-126 * (r->P + half * dk / r->s) : 0.0;   /* flushed e_j */
            const double err = ftz +
                p * (ee + r->eP + 4.0 * u) +
                half * q * (dk * (ee + r->es + 4.0 * u) + u * fabs(d) + r->eA + u * (1.0 + fabs(r->As))) +
                3.0 * u * half * cc + 2.0 * u * (p + half * (q * dk + cc));
            const double va = fabs(v) + 1.0 + fabs(r->As + r->mo);   /* |x_j| + 1 + |A|: the CPU's unshifted terms */
            const double ecpu = U64 * (p * (fabs(v) + fabs(r->lse) + 4.0) +
                                       half * (q * va * (fabs(v) + fabs(r->lseo) + 6.0) + 2.0 * cc));
            sl[k] = ga * SAFETY * (err + ecpu);
        }
    }
    const int ok = t_close(name, a, b, sl, k, ATOL_D[c->dt], RTOL_D[c->dt], C, &g_worst_grad);
    free(a); free(b); free(sl);
    return ok;
}

/* Elements of a buffer of nb elements outside the first C columns of the N rows at offset off:
 * poisoned (in == NULL) or the input's value (in place, in = the uploaded buffer) */
static int64_t count_outside_written(const cfg_t* c, const void* buf, const void* in, int64_t nb, int64_t off) {
    const size_t es = tu_dtype_size(c->dt);
    const int64_t span = c->N * c->ld;
    int64_t bad = 0;
    for (int64_t k = 0; k < nb; k++) {
        const int64_t rel = k - off;
        if (rel >= 0 && rel < span && rel % c->ld < c->C) continue;
        if (in) bad += tu_bits(buf, c->dt, k) != tu_bits(in, c->dt, k);
        else bad += !tu_is_poison(buf, es, k);
    }
    return bad;
}

/* the logits of row i (not ignored), as the library sees them (x at the logits' offset) */
static void fill_row(const cfg_t* c, tu_rng* r, void* x, int64_t i, int64_t y) {
    const int64_t C = c->C, base = i * c->ld;
    const fl_dtype dt = c->dt;
    const int kind = (int)(i % 8), alt = (int)((i / 8) % 2);
    switch (kind) {
        case 4:   /* an offset row (the shift by m' matters) or a wide one (exps underflow) */
            for (int64_t j = 0; j < C; j++)
                tu_store(x, dt, base + j, (float)(alt ? 500.0 + tu_uniform_in(r, -3, 3) : tu_uniform_in(r, -80, 80)));
            break;
        case 5:   /* the target dominating: a tiny loss (lse - x_y = log1p(...)) */
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, (float)tu_uniform_in(r, -3, 3));
            tu_store(x, dt, base + y, alt ? 33.0f : 15.0f);
            break;
        case 6: { /* constant non-target logits: q uniform, the regulariser 0 */
            const float v = (float)tu_uniform_in(r, -3, 3);
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, v);
            tu_store(x, dt, base + y, (float)tu_uniform_in(r, -3, 3));
            break;
        }
        case 7:   /* a tiny target probability */
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, (float)tu_uniform_in(r, 1, 4));
            tu_store(x, dt, base + y, -30.0f);
            break;
        default:
            for (int64_t j = 0; j < C; j++) tu_store(x, dt, base + j, (float)tu_uniform_in(r, -3, 3));
            break;
    }
}

/* ------------------------------------------------------------------------------------------
 * One grid case
 * ---------------------------------------------------------------------------------------- */
static int run_case(const cfg_t* c, uint64_t seed, int graph) {
    const int64_t N = c->N, C = c->C, ld = c->ld;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const int fused = c->pass != 0, inplace = c->pass == 2;
    const int want_loss = !(fused && c->noloss);
    const int64_t ii = ign_index(c);
    const long failed_before = tu_failed;
    char name[300];
    snprintf(name, sizeof name,
             "%s lam=%g %s i%d ign=%d pass=%d gl=%d gs=%g noloss=%d N=%lld C=%lld ld=%lld xoff=%d doff=%d%s",
             tu_dtype_name(c->dt), (double)c->lam, red_name(c->red), c->i64 ? 64 : 32, c->ign, c->pass, c->gl,
             (double)c->gs, c->noloss, (long long)N, (long long)C, (long long)ld, c->xoff, c->doff,
             graph ? " graph" : "");
    tu_rng r = tu_rng_seed(seed);
    const int64_t nb = N * ld + 16;   /* buffer elements: the matrix at an offset < 2, guards around it */
    void* hx = tu_xmalloc((size_t)nb * es);
    tu_poison(hx, (size_t)nb * es);
    char* hxp = (char*)hx + (size_t)c->xoff * es;   /* the logits as the library sees them */
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = C; j < ld; j++) tu_store(hxp, c->dt, i * ld + j, (j - C) % 2 ? NAN : 30000.0f);
    int64_t* tg = tu_xmalloc((size_t)(N + 1) * 8);
    int64_t* lab64 = tu_xmalloc((size_t)(N + 1) * 8);
    int32_t* lab32 = tu_xmalloc((size_t)(N + 1) * 4);
    float* hgl = tu_xmalloc((size_t)(N + 1) * 4);
    int64_t D = 0;
    for (int64_t i = 0; i < N; i++) {
        int ign = c->ign == 3 || (c->ign != 0 && i % 4 == 1);
        int64_t y = ign ? ii : tu_int_in(&r, 0, C - 1);
        if (!ign && c->ign == 2 && C > 255 && i % 4 == 3) y = 255;   /* a real class, ignored */
        if (y == ii) ign = 1;
        tg[i] = y;
        lab64[i] = y;
        lab32[i] = (int32_t)y;
        D += !ign;
        if (!ign) fill_row(c, &r, hxp, i, y);   /* ignored rows stay NaN (never read) */
        hgl[i] = (none || i == 0) ? (float)tu_uniform_in(&r, -2, 2) : NAN;   /* SUM / MEAN read [0] only */
    }
    lab64[N] = 0; lab32[N] = 0; hgl[N] = NAN;
    if (!none && N > 0 && fabsf(hgl[0]) < 0.25f) hgl[0] = 0.75f;
    const fl_index_dtype it = idx_dtype(c);
    const void* hlab = it == FL_INDEX_I64 ? (const void*)lab64 : (const void*)lab32;
    size_t wsb = 0;
    fl_large_margin_options oc = make_opts(c, NULL);
    TSTATUS(fl_large_margin_ce_workspace_size(&wsb, N, C, c->dt, &oc), FL_OK, name);
    const float* glh = fused && c->gl ? hgl : NULL;

    /* CPU reference (out of place, also for the in-place GPU case) */
    void* hws = tu_xmalloc(wsb + 1);
    float* hloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* hd = tu_xmalloc((size_t)nb * es);
    tu_poison(hd, (size_t)nb * es);
    tu_poison(hloss, (size_t)(nl + 1) * 4);
    char* hdp = (char*)hd + (size_t)c->xoff * es;
    fl_status st = call_lm(c, 0, want_loss ? hloss : NULL, hdp, hxp, hlab, glh, &oc, hws, wsb);
    if (!TSTATUS(st, FL_OK, name)) {
        free(hx); free(tg); free(lab64); free(lab32); free(hgl); free(hws); free(hloss); free(hd);
        return 0;
    }

    /* GPU */
    char *dx_, *dd_, *dws;
    float *dloss, *dgl;
    int32_t* dflag;
    void* dlab;
    CK(cudaMalloc((void**)&dx_, (size_t)nb * es));
    CK(cudaMalloc((void**)&dd_, (size_t)nb * es));
    CK(cudaMalloc((void**)&dloss, (size_t)(nl + 1) * 4));
    CK(cudaMalloc((void**)&dgl, (size_t)(N + 1) * 4));
    CK(cudaMalloc((void**)&dws, wsb + 256));
    CK(cudaMalloc((void**)&dflag, 4));
    CK(cudaMalloc(&dlab, (size_t)(N + 1) * 8));
    up(dx_, hx, (size_t)nb * es);
    up(dgl, hgl, (size_t)(N + 1) * 4);
    up(dlab, hlab, (size_t)(N + 1) * (it == FL_INDEX_I64 ? 8 : 4));
    fill(dloss, 0xFF, (size_t)(nl + 1) * 4);
    fill(dd_, 0xFF, (size_t)nb * es);
    fill(dws, 0xFF, wsb + 256);
    fill(dflag, 0, 4);
    fl_large_margin_options og = make_opts(c, dflag);
    char* gx = dx_ + (size_t)c->xoff * es;
    char* gd = inplace ? gx : dd_ + (size_t)c->doff * es;
    float* gloss_p = want_loss ? dloss : NULL;
    const float* gl = fused && c->gl ? dgl : NULL;
    void* gws = none && (seed & 1) ? NULL : dws;   /* NONE needs no workspace: NULL or a pointer */
#define GPU_CALL() call_lm(c, 1, gloss_p, gd, gx, dlab, gl, &og, gws, wsb)
    st = GPU_CALL();
    TSTATUS(st, FL_OK, name);
    sync_ok(name, dflag, 0);
    float* gloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* gdh = tu_xmalloc((size_t)nb * es);
    void* gxh = tu_xmalloc((size_t)nb * es);
    down(gloss, dloss, (size_t)(nl + 1) * 4);
    down(gdh, inplace ? dx_ : dd_, (size_t)nb * es);
    down(gxh, dx_, (size_t)nb * es);

    rowstat* rs = tu_xmalloc((size_t)(N + 1) * sizeof(rowstat));
    for (int64_t i = 0; i < N; i++) row_stats(c, hxp, i, tg[i], &rs[i]);
    char nm[400];
    if (want_loss) {
        snprintf(nm, sizeof nm, "%s loss", name);
        check_loss(nm, c, gloss, hloss, rs, NULL, c->red == FL_REDUCTION_MEAN ? (double)D : 1.0);
        TCHECK(tu_is_poison(gloss, 4, nl), "%s: loss guard overwritten", name);
        int64_t badign = 0;
        for (int64_t i = 0; none && i < N; i++) badign += rs[i].ign && gloss[i] != 0.0f;
        TCHECK(badign == 0, "%s: %lld ignored rows with a loss other than 0", name, (long long)badign);
    } else {
        int w = 0;
        for (int64_t i = 0; i <= nl; i++) w += !tu_is_poison(gloss, 4, i);
        TCHECK(w == 0, "%s: loss NULL but %d loss elements written", name, w);
    }
    const int goff = inplace ? c->xoff : c->doff;   /* dlogits' offset in its buffer */
    if (fused) {
        double* g = tu_xmalloc((size_t)(N + 1) * 8);
        for (int64_t i = 0; i < N; i++) {
            g[i] = c->gs * (c->gl ? hgl[none ? i : 0] : 1.0);
            if (c->red == FL_REDUCTION_MEAN) g[i] /= D ? (double)D : 1.0;
        }
        snprintf(nm, sizeof nm, "%s dlogits", name);
        check_grad(nm, c, (const char*)gdh + (size_t)goff * es, hdp, hxp, tg, rs, g, NULL);
        free(g);
    }
    {   /* outside the first C columns: poison stays (padding, guards), or the input's value in place */
        const int64_t bad = count_outside_written(c, gdh, inplace ? hx : NULL, nb, goff);
        TCHECK(bad == 0, "%s: %lld dlogits elements outside the first C columns written", name, (long long)bad);
        if (!inplace) TCHECK(memcmp(gxh, hx, (size_t)nb * es) == 0, "%s: logits modified", name);
    }
    /* determinism and graph replay (not in place: the inputs must survive) */
    if (!inplace && (graph || !g_small)) {
        float* l2 = tu_xmalloc((size_t)(nl + 1) * 4);
        void* d2 = tu_xmalloc((size_t)nb * es);
        for (int rep = 0; rep < (graph ? 2 : 1); rep++) {
            fill(dloss, 0xFF, (size_t)(nl + 1) * 4);
            fill(dd_, 0xFF, (size_t)nb * es);
            fill(dws, 0xFF, wsb + 256);
            cudaGraph_t gr;
            cudaGraphExec_t ex;
            if (rep == 0) {
                st = GPU_CALL();
                TSTATUS(st, FL_OK, "second run");
            } else {
                CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
                st = GPU_CALL();
                CK(cudaStreamEndCapture(g_stream, &gr));
                TSTATUS(st, FL_OK, "captured call");
                CK(cudaGraphInstantiate(&ex, gr, 0));
                for (int k = 0; k < 3; k++) {
                    if (k > 0) {   /* poison between replays: each replay must rewrite everything */
                        fill(dloss, 0xFF, (size_t)(nl + 1) * 4);
                        fill(dd_, 0xFF, (size_t)nb * es);
                        fill(dws, 0xFF, wsb + 256);
                    }
                    CK(cudaGraphLaunch(ex, g_stream));
                }
            }
            sync_ok(name, dflag, 0);
            down(l2, dloss, (size_t)(nl + 1) * 4);
            down(d2, dd_, (size_t)nb * es);
            snprintf(nm, sizeof nm, "%s %s", name, rep == 0 ? "rerun bitwise" : "graph replay == eager");
            t_bitwise(nm, l2, gloss, (size_t)(nl + 1) * 4);
            t_bitwise(nm, d2, gdh, (size_t)nb * es);
            if (rep == 1) {
                CK(cudaGraphExecDestroy(ex));
                CK(cudaGraphDestroy(gr));
            }
        }
        free(l2); free(d2);
    }
#undef GPU_CALL
    CK(cudaFree(dx_)); CK(cudaFree(dd_)); CK(cudaFree(dloss)); CK(cudaFree(dgl)); CK(cudaFree(dws));
    CK(cudaFree(dflag)); CK(cudaFree(dlab));
    free(hx); free(tg); free(lab64); free(lab32); free(hgl); free(hws); free(hloss); free(hd);
    free(gloss); free(gdh); free(gxh); free(rs);
    return tu_failed == failed_before;
}

/* ------------------------------------------------------------------------------------------
 * Graph capture on a big case: N = 4096, C = 32000, bf16, MEAN, fused, grad_loss on the device.
 * Eager twice (bitwise), captured + replayed (bitwise == eager), eager on the other staged-row
 * prefetch path (bitwise == eager; the knob in src/cuda); the loss against the CPU; the
 * gradient of sampled rows against the CPU (NONE on those rows with g = grad_scale gl / D).
 * ---------------------------------------------------------------------------------------- */
static void test_graph_big(int64_t N, int64_t C, float lam) {
    cfg_t c;
    memset(&c, 0, sizeof c);
    c.dt = FL_DTYPE_BF16; c.lam = lam; c.red = FL_REDUCTION_MEAN; c.i64 = 1; c.ign = 1; c.pass = 1; c.gl = 1;
    c.gs = 2.5f; c.N = N; c.C = C; c.ld = C;
    const size_t es = 2, n = (size_t)N * (size_t)C;
    char name[160];
    snprintf(name, sizeof name, "graph big: bf16 lam=%g mean fused N=%lld C=%lld", (double)lam, (long long)N,
             (long long)C);
    tu_rng r = tu_rng_seed(777 + (uint64_t)(lam * 10));
    void* hx = tu_xmalloc(n * es);
    tu_poison(hx, n * es);
    int64_t* tg = tu_xmalloc((size_t)N * 8);
    int64_t D = 0;
    for (int64_t i = 0; i < N; i++) {
        const int ign = i % 9 == 4;
        tg[i] = ign ? -100 : tu_int_in(&r, 0, C - 1);
        D += !ign;
        if (!ign) fill_row(&c, &r, hx, i, tg[i]);
    }
    const float hgl = 0.8f;
    size_t wsb = 0;
    fl_large_margin_options oc = make_opts(&c, NULL);
    fl_large_margin_ce_workspace_size(&wsb, N, C, c.dt, &oc);
    void *dx, *dd, *dws, *dlab;
    float *dl, *dgl;
    int32_t* dflag;
    CK(cudaMalloc(&dx, n * es)); CK(cudaMalloc(&dd, n * es)); CK(cudaMalloc(&dws, wsb));
    CK(cudaMalloc(&dlab, (size_t)N * 8)); CK(cudaMalloc((void**)&dl, 4)); CK(cudaMalloc((void**)&dgl, 4));
    CK(cudaMalloc((void**)&dflag, 4));
    up(dx, hx, n * es);
    up(dlab, tg, (size_t)N * 8);
    up(dgl, &hgl, 4);
    fill(dflag, 0, 4);
    fl_large_margin_options og = make_opts(&c, dflag);
    void* d1 = tu_xmalloc(n * es);
    void* d2 = tu_xmalloc(n * es);
    float l1 = 0, l2 = 0;
    char nm[260];
    /* eager, eager again, captured + replayed, then eager on the other prefetch path (FUSEDLOSS_LM_PREFETCH
     * 0 <-> 1, read on every call: the same values into the same slots, so bitwise the same outputs) */
    zt_env_saved sv;
    const char* pf = "";
    for (int rep = 0; rep < 4; rep++) {
        if (rep == 3) pf = zt_env_other(&sv, "FUSEDLOSS_LM_PREFETCH", "0", "1");
        fill(dd, 0xFF, n * es);
        fill(dl, 0xFF, 4);
        fill(dws, 0xFF, wsb);
        fl_status st;
        cudaGraph_t gr;
        cudaGraphExec_t ex;
        if (rep != 2) {
            st = fl_large_margin_ce_fused_cuda(dl, dd, dx, C, dlab, FL_INDEX_I64, dgl, c.gs, N, C, c.dt, &og, dws,
                                               wsb, (fl_stream)g_stream);
        } else {
            CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
            st = fl_large_margin_ce_fused_cuda(dl, dd, dx, C, dlab, FL_INDEX_I64, dgl, c.gs, N, C, c.dt, &og, dws,
                                               wsb, (fl_stream)g_stream);
            CK(cudaStreamEndCapture(g_stream, &gr));
            CK(cudaGraphInstantiate(&ex, gr, 0));
            for (int k = 0; k < 3; k++) {
                if (k > 0) {   /* poison between replays: each replay must rewrite everything */
                    fill(dd, 0xFF, n * es);
                    fill(dl, 0xFF, 4);
                }
                CK(cudaGraphLaunch(ex, g_stream));
            }
        }
        snprintf(nm, sizeof nm, "%s rep %d", name, rep);
        TSTATUS(st, FL_OK, nm);
        sync_ok(nm, dflag, 0);
        down(rep == 0 ? d1 : d2, dd, n * es);
        down(rep == 0 ? &l1 : &l2, dl, 4);
        if (rep > 0) {
            if (rep == 3) snprintf(nm, sizeof nm, "%s %s=%s == eager", name, "FUSEDLOSS_LM_PREFETCH", pf);
            else snprintf(nm, sizeof nm, "%s %s", name, rep == 1 ? "rerun bitwise" : "graph replay == eager");
            t_bitwise(nm, &l2, &l1, 4);
            t_bitwise(nm, d2, d1, n * es);
        }
        if (rep == 2) {
            CK(cudaGraphExecDestroy(ex));
            CK(cudaGraphDestroy(gr));
        }
        if (rep == 3) zt_env_restore(&sv);
    }
    /* the loss against the CPU's (every row) */
    rowstat* rs = tu_xmalloc((size_t)N * sizeof(rowstat));
    for (int64_t i = 0; i < N; i++) row_stats(&c, hx, i, tg[i], &rs[i]);
    {
        void* hws = tu_xmalloc(wsb);
        float lc = 0;
        fl_status st = fl_large_margin_ce_forward_cpu(&lc, hx, C, tg, FL_INDEX_I64, N, C, c.dt, &oc, hws, wsb);
        TSTATUS(st, FL_OK, "graph big: cpu forward");
        snprintf(nm, sizeof nm, "%s loss", name);
        check_loss(nm, &c, &l1, &lc, rs, NULL, (double)D);
        free(hws);
    }
    /* sampled rows against the CPU: NONE on a copy of those rows, g = grad_scale gl / D */
    {
        enum { R = 24 };
        int64_t rows[R];
        for (int k = 0; k < R; k++) rows[k] = k < 8 ? k % N : k == R - 1 ? N - 1 : tu_int_in(&r, 0, N - 1);
        cfg_t cs = c;
        cs.N = R;
        cs.red = FL_REDUCTION_NONE;
        void* sx = tu_xmalloc((size_t)R * C * es);
        void* sg = tu_xmalloc((size_t)R * C * es);
        void* sc = tu_xmalloc((size_t)R * C * es);
        int64_t* st_ = tu_xmalloc((size_t)R * 8);
        float* sgl = tu_xmalloc((size_t)R * 4);
        float* sl = tu_xmalloc((size_t)R * 4);
        double* g = tu_xmalloc((size_t)R * 8);
        rowstat* srs = tu_xmalloc((size_t)R * sizeof(rowstat));
        for (int k = 0; k < R; k++) {
            memcpy((char*)sx + (size_t)k * C * es, (char*)hx + (size_t)rows[k] * C * es, (size_t)C * es);
            memcpy((char*)sg + (size_t)k * C * es, (char*)d1 + (size_t)rows[k] * C * es, (size_t)C * es);
            st_[k] = tg[rows[k]];
            sgl[k] = (float)(c.gs * (double)hgl / (double)D);
            g[k] = sgl[k];
            srs[k] = rs[rows[k]];
        }
        fl_large_margin_options on = make_opts(&cs, NULL);
        fl_status st = fl_large_margin_ce_fused_cpu(sl, sc, sx, C, st_, FL_INDEX_I64, sgl, 1.0f, R, C, c.dt, &on,
                                                    NULL, 0);
        TSTATUS(st, FL_OK, "graph big: cpu rows");
        snprintf(nm, sizeof nm, "%s sampled rows' dlogits", name);
        check_grad(nm, &cs, sg, sc, sx, st_, srs, g, NULL);
        free(sx); free(sg); free(sc); free(st_); free(sgl); free(sl); free(g); free(srs);
    }
    CK(cudaFree(dx)); CK(cudaFree(dd)); CK(cudaFree(dws)); CK(cudaFree(dlab)); CK(cudaFree(dl)); CK(cudaFree(dgl));
    CK(cudaFree(dflag));
    free(hx); free(tg); free(d1); free(d2); free(rs);
}

/* ------------------------------------------------------------------------------------------
 * Out-of-range targets: FL_OK; that row's loss NaN (NONE; any SUM / MEAN NaN), its gradient NaN,
 * the flag set, the other rows as the CPU with the bad ones ignored (the bad rows count in MEAN's
 * D), then the context still usable. Poison here is finite (0x3F bytes) so that an unwritten row
 * cannot pass as NaN.
 * ---------------------------------------------------------------------------------------- */
static void test_oob(fl_dtype dt, int64_t N, int64_t C, int i64, fl_reduction red, float lam, int use_flag, int gl) {
    cfg_t c;
    memset(&c, 0, sizeof c);
    c.dt = dt; c.lam = lam; c.red = red; c.i64 = i64; c.ign = 1; c.pass = 1; c.gs = 2.5f; c.gl = gl;
    c.N = N; c.C = C; c.ld = C;
    const int64_t n = N * C;
    const size_t es = tu_dtype_size(dt);
    const fl_index_dtype it = idx_dtype(&c);
    const int none = red == FL_REDUCTION_NONE;
    char name[200];
    snprintf(name, sizeof name, "out-of-range targets: %s lam=%g %s N=%lld C=%lld %s flag=%d gl=%d",
             tu_dtype_name(dt), (double)lam, i64 ? "i64" : "i32", (long long)N, (long long)C, red_name(red),
             use_flag, gl);
    tu_rng r = tu_rng_seed(4321 + (uint64_t)C * 3 + (uint64_t)red + (uint64_t)i64 * 11);
    void* hx = tu_xmalloc((size_t)n * es);
    int64_t* tg = tu_xmalloc((size_t)N * 8);    /* the bad targets */
    int64_t* tgc = tu_xmalloc((size_t)N * 8);   /* bad rows -> ignore_index: the CPU's view */
    int64_t* lab64 = tu_xmalloc((size_t)N * 8);
    int32_t* lab32 = tu_xmalloc((size_t)N * 4);
    int64_t* labc64 = tu_xmalloc((size_t)N * 8);
    int32_t* labc32 = tu_xmalloc((size_t)N * 4);
    unsigned char* bad = calloc((size_t)N, 1);
    for (int64_t i = 0; i < N; i++) tg[i] = i % 7 == 6 ? -100 : tu_int_in(&r, 0, C - 1);
    tg[3] = C; tg[4] = -7; tg[N - 2] = C + 1000; tg[9] = -1;
    bad[3] = bad[4] = bad[N - 2] = bad[9] = 1;
    if (i64) { tg[5] = ((int64_t)1 << 32) + 1; bad[5] = 1; }   /* truncates to 1 */
    tg[0] = 0; tg[1] = C - 1;                                 /* the edges, valid */
    int64_t Dbad = 0;
    for (int64_t i = 0; i < N; i++) {
        Dbad += tg[i] != -100;
        tgc[i] = bad[i] ? -100 : tg[i];
        lab64[i] = tg[i]; lab32[i] = (int32_t)tg[i]; labc64[i] = tgc[i]; labc32[i] = (int32_t)tgc[i];
        for (int64_t j = 0; j < C; j++) tu_store(hx, dt, i * C + j, (float)tu_uniform_in(&r, -3, 3));
    }
    const void* hlab = i64 ? (const void*)lab64 : (const void*)lab32;
    const void* hlabc = i64 ? (const void*)labc64 : (const void*)labc32;
    const size_t isz = i64 ? 8 : 4;
    float* hgl = tu_xmalloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) hgl[i] = (none || i == 0) ? (float)tu_uniform_in(&r, 0.5, 1.5) : NAN;
    /* CPU reference: NONE, per-row upstream = what the GPU applies to the good rows */
    cfg_t cn = c;
    cn.red = FL_REDUCTION_NONE;
    fl_large_margin_options on = make_opts(&cn, NULL);
    float* rl = tu_xmalloc((size_t)N * 4);
    float* rg = tu_xmalloc((size_t)N * 4);
    double* g = tu_xmalloc((size_t)N * 8);
    void* rd = tu_xmalloc((size_t)n * es);
    for (int64_t i = 0; i < N; i++) {
        double v = c.gs * (gl ? hgl[none ? i : 0] : 1.0);
        if (red == FL_REDUCTION_MEAN) v /= (double)Dbad;
        rg[i] = (float)v;
        g[i] = rg[i];
    }
    TSTATUS(fl_large_margin_ce_fused_cpu(rl, rd, hx, C, hlabc, it, rg, 1.0f, N, C, dt, &on, NULL, 0), FL_OK,
            "oob cpu reference");
    {   /* the CPU itself rejects the bad targets */
        float* l2 = tu_xmalloc((size_t)N * 4);
        void* d2 = tu_xmalloc((size_t)n * es);
        fl_status s2 = fl_large_margin_ce_fused_cpu(l2, d2, hx, C, hlab, it, NULL, 1.0f, N, C, dt, &on, NULL, 0);
        TSTATUS(s2, FL_ERR_TARGET_OUT_OF_RANGE, "oob cpu with the bad targets");
        free(l2); free(d2);
    }
    rowstat* rs = tu_xmalloc((size_t)N * sizeof(rowstat));
    for (int64_t i = 0; i < N; i++) row_stats(&c, hx, i, tgc[i], &rs[i]);

    fl_large_margin_options oc = make_opts(&c, NULL);
    size_t wsb = 0;
    fl_large_margin_ce_workspace_size(&wsb, N, C, dt, &oc);
    const size_t nlb = (size_t)(none ? N : 1) * 4;
    void *dx, *dw, *dd, *dlab, *dlabc, *dws;
    float *dl, *dgl;
    int32_t* dflag;
    CK(cudaMalloc(&dx, (size_t)n * es)); CK(cudaMalloc(&dw, (size_t)n * es)); CK(cudaMalloc(&dd, (size_t)n * es));
    CK(cudaMalloc(&dlab, (size_t)N * 8)); CK(cudaMalloc(&dlabc, (size_t)N * 8)); CK(cudaMalloc(&dws, wsb + 256));
    CK(cudaMalloc((void**)&dl, (size_t)N * 4)); CK(cudaMalloc((void**)&dgl, (size_t)N * 4));
    CK(cudaMalloc((void**)&dflag, 4));
    up(dx, hx, (size_t)n * es);
    up(dlab, hlab, (size_t)N * isz);
    up(dlabc, hlabc, (size_t)N * isz);
    up(dgl, hgl, (size_t)N * 4);
    fl_large_margin_options o = make_opts(&c, use_flag ? dflag : NULL);
    float* hl = tu_xmalloc((size_t)N * 4);
    void* hd = tu_xmalloc((size_t)n * es);
    char nm[260], nm2[320];
    for (int op = 0; op < 3; op++) {   /* forward, fused, fused in place */
        fill(dflag, 0, 4);
        fill(dl, 0x3F, (size_t)N * 4);
        fill(dd, 0x3F, (size_t)n * es);
        CK(cudaMemcpyAsync(dw, dx, (size_t)n * es, cudaMemcpyDeviceToDevice, g_stream));
        void* gdl = op == 2 ? dw : dd;
        const void* gx = op == 2 ? dw : dx;
        fl_status st = op == 0 ? fl_large_margin_ce_forward_cuda(dl, gx, C, dlab, it, N, C, dt, &o, dws, wsb,
                                                                 (fl_stream)g_stream)
                               : fl_large_margin_ce_fused_cuda(dl, gdl, gx, C, dlab, it, gl ? dgl : NULL, c.gs, N, C,
                                                               dt, &o, dws, wsb, (fl_stream)g_stream);
        snprintf(nm, sizeof nm, "%s op=%d", name, op);
        TSTATUS(st, FL_OK, nm);
        sync_ok(nm, use_flag ? dflag : NULL, 1);
        if (!use_flag) {   /* no flag given: the device int stays untouched (0) */
            int32_t hf = -1;
            down(&hf, dflag, 4);
            TCHECK(hf == 0, "%s: error_flag NULL, yet the device int became %d", nm, (int)hf);
        }
        down(hl, dl, nlb);
        if (none) {
            int nn = 0;
            for (int64_t i = 0; i < N; i++) nn += bad[i] && !isnan(hl[i]);
            TCHECK(nn == 0, "%s: %d bad rows with a loss that is not NaN", nm, nn);
            snprintf(nm2, sizeof nm2, "%s loss (good rows)", nm);
            check_loss(nm2, &cn, hl, rl, rs, bad, 1.0);
        } else {
            TCHECK(isnan(hl[0]), "%s: loss %g, want NaN", nm, (double)hl[0]);
        }
        if (op != 0) {
            down(hd, gdl, (size_t)n * es);
            int64_t notnan = 0;
            for (int64_t i = 0; i < N; i++)
                if (bad[i])
                    for (int64_t j = 0; j < C; j++) notnan += !isnan(tu_load(hd, dt, i * C + j));
            TCHECK(notnan == 0, "%s: %lld gradient entries of bad rows not NaN", nm, (long long)notnan);
            snprintf(nm2, sizeof nm2, "%s dlogits (good rows)", nm);
            check_grad(nm2, &cn, hd, rd, hx, tgc, rs, g, bad);
        }
    }
    {   /* the context still works: a valid call (the bad rows ignored), the flag stays 0 */
        fill(dflag, 0, 4);
        fill(dl, 0xFF, (size_t)N * 4);
        fill(dd, 0xFF, (size_t)n * es);
        up(dgl, rg, (size_t)N * 4);
        fl_large_margin_options ov = make_opts(&cn, dflag);
        fl_status st = fl_large_margin_ce_fused_cuda(dl, dd, dx, C, dlabc, it, dgl, 1.0f, N, C, dt, &ov, NULL, 0,
                                                     (fl_stream)g_stream);
        snprintf(nm, sizeof nm, "%s: valid call after", name);
        TSTATUS(st, FL_OK, nm);
        sync_ok(nm, dflag, 0);
        down(hl, dl, (size_t)N * 4);
        down(hd, dd, (size_t)n * es);
        snprintf(nm2, sizeof nm2, "%s loss", nm);
        check_loss(nm2, &cn, hl, rl, rs, NULL, 1.0);
        snprintf(nm2, sizeof nm2, "%s dlogits", nm);
        check_grad(nm2, &cn, hd, rd, hx, tgc, rs, g, NULL);
    }
    CK(cudaFree(dx)); CK(cudaFree(dw)); CK(cudaFree(dd)); CK(cudaFree(dlab)); CK(cudaFree(dlabc)); CK(cudaFree(dws));
    CK(cudaFree(dl)); CK(cudaFree(dgl)); CK(cudaFree(dflag));
    free(hx); free(tg); free(tgc); free(lab64); free(lab32); free(labc64); free(labc32); free(bad); free(hgl);
    free(rl); free(rg); free(g); free(rd); free(rs); free(hl); free(hd);
}

/* ------------------------------------------------------------------------------------------
 * N = 0, bad arguments through the CUDA entries (outputs untouched)
 * ---------------------------------------------------------------------------------------- */
static void test_misc(void) {
    fl_large_margin_options o = FL_LARGE_MARGIN_OPTIONS_INIT;
    size_t wsb = 0;
    fl_large_margin_ce_workspace_size(&wsb, 4, 10, FL_DTYPE_BF16, &o);
    void *x, *t, *d, *ws;
    float* l;
    CK(cudaMalloc(&x, 512)); CK(cudaMalloc(&t, 512)); CK(cudaMalloc(&d, 512)); CK(cudaMalloc(&ws, wsb + 512));
    CK(cudaMalloc((void**)&l, 64));
    fill(x, 0, 512); fill(t, 0, 512);
    /* N = 0: SUM 0, MEAN NaN (forward and fused, loss given or not), NONE: nothing written */
    const fl_reduction reds[3] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_NONE};
    for (int k = 0; k < 6; k++) {
        o.reduction = reds[k % 3];
        size_t w0 = 0;
        fl_large_margin_ce_workspace_size(&w0, 0, 10, FL_DTYPE_BF16, &o);
        float h = 1.0f;
        fill(l, 0xFF, 64);
        fl_status st = k < 3 ? fl_large_margin_ce_forward_cuda(l, x, 10, t, FL_INDEX_I64, 0, 10, FL_DTYPE_BF16, &o,
                                                               ws, w0, (fl_stream)g_stream)
                             : fl_large_margin_ce_fused_cuda(l, NULL, NULL, 10, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 10,
                                                             FL_DTYPE_BF16, &o, ws, w0, (fl_stream)g_stream);
        TSTATUS(st, FL_OK, "N = 0");
        sync_ok("N = 0", NULL, 0);
        down(&h, l, 4);
        TCHECK(k % 3 == 0 ? h == 0.0f : k % 3 == 1 ? isnan(h) : tu_is_poison(&h, 4, 0), "N = 0 %s %s: loss %g",
               k < 3 ? "forward" : "fused", red_name(reds[k % 3]), (double)h);
    }
    o = (fl_large_margin_options)FL_LARGE_MARGIN_OPTIONS_INIT;
    /* NONE needs no workspace: NULL, 0 bytes, or any pointer (even misaligned) */
    {
        fl_large_margin_options on = o;
        on.reduction = FL_REDUCTION_NONE;
        fill(d, 0xFF, 512);
        fl_status st = fl_large_margin_ce_fused_cuda(l, d, x, 10, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, FL_DTYPE_BF16,
                                                     &on, NULL, 0, (fl_stream)g_stream);
        TSTATUS(st, FL_OK, "NONE, workspace NULL");
        st = fl_large_margin_ce_fused_cuda(l, d, x, 10, t, FL_INDEX_I64, NULL, 1.0f, 4, 10, FL_DTYPE_BF16, &on,
                                           (char*)ws + 16, 0, (fl_stream)g_stream);
        TSTATUS(st, FL_OK, "NONE, workspace misaligned");
        sync_ok("NONE without workspace", NULL, 0);
    }
    /* bad arguments: the status, the function named, nothing written */
    fill(l, 0xFF, 64);
    fill(d, 0xFF, 512);
    CK(cudaStreamSynchronize(g_stream));
    const char* FWD = "fl_large_margin_ce_forward_cuda";
    const char* FUS = "fl_large_margin_ce_fused_cuda";
#define BAD(call_, want_, fn_, what_)                                                                           \
    do {                                                                                                        \
        const fl_status s_ = (call_);                                                                           \
        TCHECK(s_ == (want_) && strstr(fl_last_error(), fn_) != NULL, "%s: status %d (%s), want %d; \"%s\"", \
               what_, (int)s_, fl_status_string(s_), (int)(want_), fl_last_error());                            \
    } while (0)
    const fl_stream S = (fl_stream)g_stream;
    const fl_index_dtype I = FL_INDEX_I64;
    const fl_dtype B = FL_DTYPE_BF16;
    BAD(fl_large_margin_ce_forward_cuda(l, x, 10, t, I, 4, 10, B, &o, (char*)ws + 128, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FWD, "workspace not 256-byte aligned (forward, MEAN)");
    TCHECK(strstr(fl_last_error(), "aligned") != NULL, "alignment message: %s", fl_last_error());
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, (char*)ws + 16, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "workspace not 256-byte aligned (fused, MEAN)");
    {
        fl_large_margin_options os = o;
        os.reduction = FL_REDUCTION_SUM;
        BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &os, (char*)ws + 64, wsb, S),
            FL_ERR_INVALID_ARGUMENT, FUS, "workspace not 256-byte aligned (fused, SUM)");
        BAD(fl_large_margin_ce_forward_cuda(l, x, 10, t, I, 4, 10, B, &os, ws, wsb - 1, S),
            FL_ERR_INSUFFICIENT_WORKSPACE, FWD, "workspace too small (SUM)");
    }
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb - 4, S),
        FL_ERR_INSUFFICIENT_WORKSPACE, FUS, "workspace too small (fused)");
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, NULL, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "workspace NULL");
    BAD(fl_large_margin_ce_fused_cuda(l, NULL, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "dlogits NULL");
    BAD(fl_large_margin_ce_forward_cuda(NULL, x, 10, t, I, 4, 10, B, &o, ws, wsb, S), FL_ERR_INVALID_ARGUMENT, FWD,
        "loss NULL (forward)");
    BAD(fl_large_margin_ce_forward_cuda(l, NULL, 10, t, I, 4, 10, B, &o, ws, wsb, S), FL_ERR_INVALID_ARGUMENT, FWD,
        "logits NULL");
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, NULL, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "targets NULL");
    {
        fl_large_margin_options ob = o;
        const float bad_lam[3] = {-0.5f, NAN, INFINITY};
        for (int k = 0; k < 3; k++) {
            ob.lambda = bad_lam[k];
            BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &ob, ws, wsb, S),
                FL_ERR_INVALID_ARGUMENT, FUS, "lambda < 0 / NaN / inf");
            TCHECK(strstr(fl_last_error(), "lambda") != NULL, "lambda message: %s", fl_last_error());
        }
        ob = o;
        ob.reduction = (fl_reduction)7;
        BAD(fl_large_margin_ce_forward_cuda(l, x, 10, t, I, 4, 10, B, &ob, ws, wsb, S), FL_ERR_INVALID_ARGUMENT, FWD,
            "reduction 7");
        ob = o;
        ob.struct_size = sizeof(fl_large_margin_options) + 4;
        BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &ob, ws, wsb, S),
            FL_ERR_INVALID_ARGUMENT, FUS, "struct_size");
    }
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 9, t, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "ld < C");
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 1, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "C = 1");
    TCHECK(strstr(fl_last_error(), "C (1) < 2") != NULL, "C = 1 message: %s", fl_last_error());
    BAD(fl_large_margin_ce_forward_cuda(l, x, 10, t, I, 4, 0, B, &o, ws, wsb, S), FL_ERR_INVALID_ARGUMENT, FWD,
        "C = 0");
    BAD(fl_large_margin_ce_forward_cuda(l, x, 10, t, I, -1, 10, B, &o, ws, wsb, S), FL_ERR_INVALID_ARGUMENT, FWD,
        "N < 0");
    BAD(fl_large_margin_ce_fused_cuda(l, d, (char*)x + 2, 10, t, I, NULL, 1.0f, 4, 10, FL_DTYPE_F32, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "fp32 logits misaligned");
    BAD(fl_large_margin_ce_fused_cuda(l, (char*)d + 1, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "dlogits misaligned");
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, (char*)t + 4, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "targets misaligned");
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, NAN, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "grad_scale NaN");
    BAD(fl_large_margin_ce_fused_cuda(l, (char*)x + 2, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "dlogits partially overlaps logits");
    BAD(fl_large_margin_ce_fused_cuda((float*)d, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, ws, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "loss overlaps dlogits");
    BAD(fl_large_margin_ce_fused_cuda(l, d, x, 10, t, I, NULL, 1.0f, 4, 10, B, &o, d, wsb, S),
        FL_ERR_INVALID_ARGUMENT, FUS, "workspace overlaps dlogits");
#undef BAD
    sync_ok("bad arguments", NULL, 0);
    {
        const int w = zt_count_written(d, 512, l, 16);
        TCHECK(w == 0, "bad arguments: %d output bytes / floats written", w);
    }
    CK(cudaFree(x)); CK(cudaFree(t)); CK(cudaFree(d)); CK(cudaFree(ws)); CK(cudaFree(l));
}

int main(int argc, char** argv) {
    {
        const int rc = zt_cuda_test_start(argc, argv, "test_large_margin_ce_cuda", &g_small);
        if (rc >= 0) return rc;
    }
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    tu_quiet = 1;
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN};
    const float lams[3] = {0.0f, 0.3f, 1.0f};
    static const int64_t Ns[4] = {1, 7, 129, 1031};
    /* 20000 / 20001 (appended, so the other cases keep their variants, not their seeds): fp32 rows of 80 KB,
     * staged only with a stage limit > 78 KB (default since s30; aligned and head kernels), bf16 / fp16 rows of
     * 40 KB staged at any limit */
    static const int64_t Cs[13] = {2, 3, 7, 32, 33, 100, 1000, 1024, 1025, 5000, 32000, 20000, 20001};
    static const int pads[6] = {0, 0, 1, 7, 0, 3};
    uint64_t seed = 31;
    long cases = 0, bad = 0, k = 0;
    for (int si = 0; si < 4; si++)
        for (int ci = 0; ci < 13; ci++) {
            const int64_t N = Ns[si], C = Cs[ci], NC = N * C;
            if (NC > NC_CAP) continue;   /* 1031 x 32000: the big graph case below */
            const int V = NC <= ((int64_t)1 << 20) ? 8 : 4;
            for (int v = 0; v < V; v++, k++) {
                cfg_t c;
                memset(&c, 0, sizeof c);
                c.N = N;
                c.C = C;
                c.dt = dts[(v + ci + si) % 3];
                c.lam = lams[((v / 3) + ci + 2 * si) % 3];
                c.red = reds[(v + v / 3 + ci) % 3];
                c.pass = (v + 2 * si + ci) % 3;
                c.i64 = ((v + ci) % 2) ^ (si & 1);
                c.ign = (v + 3 * si + ci) % 4;
                if (c.ign == 3 && (k % 5) != 0) c.ign = 1;   /* every row ignored: 1 in 5 of those */
                c.gl = c.pass != 0 && ((v / 2 + ci) % 2);
                c.gs = ((v + si) / 2) % 2 ? -2.5f : 1.0f;
                c.noloss = c.pass != 0 && (v + ci + 2 * si) % 4 == 3;
                c.ld = C + pads[(v + 2 * ci + si) % 6];
                c.xoff = (v + ci) % 5 == 4;
                c.doff = c.pass == 1 && (v + si) % 7 == 3 ? !c.xoff : c.xoff;
                /* graph capture: C <= 1024 (one warp per row) and C > 1024 (one CTA per row) */
                const int graph = v == 1 && ((si == 2 && ci == 7) || (si == 3 && ci == 4) || (si == 1 && ci == 8) ||
                                             (si == 2 && ci == 10) || (si == 0 && ci == 0));
                if (graph && c.pass == 2) c.pass = 1;
                if (g_small && (N * c.ld > (1 << 18) || (v % 2 && !graph))) continue;
                cases++;
                if (!run_case(&c, seed++, graph)) bad++;
            }
        }
    printf("grid: %ld cases, %ld failed\n", cases, bad);
    /* graph capture + replay on the big case; a second lambda on a smaller one */
    test_graph_big(g_small ? 8 : 4096, 32000, 0.3f);
    test_graph_big(g_small ? 4 : 64, 1000, 1.0f);
    /* out-of-range targets: both sides of C = 1024, every reduction, both index types */
    test_oob(FL_DTYPE_F32, 37, 10, 1, FL_REDUCTION_NONE, 0.3f, 1, 1);
    test_oob(FL_DTYPE_BF16, 37, 1000, 0, FL_REDUCTION_MEAN, 1.0f, 1, 1);
    test_oob(FL_DTYPE_F16, 21, 4099, 1, FL_REDUCTION_SUM, 0.3f, 1, 0);
    test_oob(FL_DTYPE_F32, 21, 4099, 0, FL_REDUCTION_NONE, 0.0f, 0, 1);
    test_oob(FL_DTYPE_BF16, 33, 1025, 1, FL_REDUCTION_MEAN, 0.3f, 1, 0);
    test_oob(FL_DTYPE_F16, 12, 32, 0, FL_REDUCTION_NONE, 1.0f, 1, 0);
    test_misc();
    CK(cudaStreamDestroy(g_stream));
    printf("worst |gpu - cpu| / tolerance: loss %.3g (%s), dlogits %.3g (%s)\n", g_worst_loss, g_worst_where[0],
           g_worst_grad, g_worst_where[1]);
    if (g_shown > SHOW_MAX) printf("(%ld more failures not shown)\n", g_shown - SHOW_MAX);
    return tu_finish();
}
