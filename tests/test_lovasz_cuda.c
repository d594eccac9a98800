/* test_lovasz_cuda.c — the CUDA Lovasz-softmax loss (include/fusedloss.h section 13, src/cuda/lovasz.cu)
 * against the CPU backend (the reference, itself checked against a long-double rank-counting
 * reference, finite differences and Berman's lovasz_grad by tests/test_lovasz.c).
 *
 * Grid: a deterministic pseudo-random sample (seeded: FULL_CASES = 640; --small: SMALL_CASES = 32 with
 * d <= 64) of N 1 / 2 / 3 x C 1 / 2 / 5 / 19 x d 1 / 7 / 64 / 1000 / 4099 x f32 / f16 / bf16 x int32 /
 * int64 labels x classes PRESENT / ALL x per_image 0 / 1 x from_logits 0 / 1 x ignored pixels none /
 * ~30 % / all, ignore_index -100 / 255, ignored pixels' inputs NaN (never read) or valid x ld = C d /
 * C d + 5 / C d + d + 3 (padding poisoned, must stay so) x pass (forward; fused; fused in place, the
 * input copied first and the result compared with the CPU on the original) x grad_loss NULL / a
 * device 0.7 x grad_scale 1 / 2.5 x fused with loss NULL x error_flag NULL / a device int (valid
 * labels: it must stay 0). Every value of every axis is drawn many times (counted: the full run
 * checks each >= 10 times).
 *
 * Inputs are built so that the two backends must rank every pixel the same (the header: the CPU ranks
 * in double, CUDA in fp32 with ties by pixel index):
 *   probabilities (from_logits 0): k / 4096 (f32, f16; f16 rounds k / 4096 above 0.5 to its 2^-11
 *      grid, still on the 2^-12 grid) or k / 256 (bf16), k uniform in [0, 4096] / [0, 256]: e = |fg - p|
 *      is exact in fp32 and in double, so equal errors are true ties on both backends (both order them
 *      by pixel index) and the ranks, D_k and the gradients agree up to the rounding of the result.
 *   logits (from_logits 1): every pixel's logit vector is one of up to 8 per-case prototypes with
 *      entries shift + 0.75 j, j in [0, 3], shift one of 0, -0.75, 0.5, -1.5 (exact in every dtype).
 *      Pixels with the same vector get bitwise the same p on each backend (same computation), and the
 *      prototypes are chosen (greedily, in double) so that for every class the errors 1 - p_c (fg) and
 *      p_c (bg) of different prototypes, and of fg / bg of the same one, differ by > 1e-4 relative:
 *      far beyond the fp32 softmax's ~1e-6, so both backends sort them alike. (Random integer vectors
 *      alone are not enough: e.g. C = 2, (0, 0.75) and (0.75, 1.5) have the same p in exact arithmetic
 *      but not bitwise in floating point, a near tie the backends may order differently.)
 *   random (10 fp32 cases, --small 2; not on a grid): uniform probabilities / 1.5 x normal logits. Errors that
 *      differ by less than an fp32 rounding may rank differently on the two backends (documented in
 *      the header), which changes the gradient at those pixels: the gradient is checked by its relative
 *      L1 distance, the loss (independent of the tie order) elementwise.
 *
 * Tolerance table (GPU vs CPU, both outputs rounded to the dtype; g = grad_scale x grad_loss):
 *   loss        probabilities rel 1e-6, logits rel 1e-5, random rel 1e-5; abs 1e-7 in all.
 *   dinput      |gpu - cpu| <= ATOL_DX[dt] + 1e-13 |g| + RTOL_DX[dt] |cpu|  (+ logits terms)
 *               RTOL_DX  f32 1e-6, f16 2^-10, bf16 2^-7 (one rounding of the output dtype)
 *               ATOL_DX  f32 1e-40, f16 2^-24 (its subnormal step), bf16 1e-38; 1e-13 |g|: the CPU's
 *                        J_k - J_{k-1} in double cancels (absolute error ~1e-16, D_k down to ~1e-12)
 *               logits   + 1e-4 |cpu| (p in fp32) + 1e-5 p_c (|gp_c| + max_k |gp_k|), gp = dloss/dp
 *                        from the CPU on the probabilities (the fp32 sum s = sum_k p_k gp_k and
 *                        gp_c - s cancel: a bound in terms of dx alone does not exist)
 *               random   sum |gpu - cpu| <= 1e-2 sum |cpu| + 1e-30 (near ties, see above)
 *   ignored pixels' dinput exactly 0; every other element written (finite, not the poison); padding
 *   and a 16-element tail guard untouched; the input unchanged (out of place).
 * Plus: out-of-range labels (C and -5: FL_OK, after the sync loss NaN, *error_flag == 1 when given,
 * the bad pixels' dinput NaN for every class, the others as the CPU with them ignored, then a valid
 * call leaves the flag 0); determinism (two runs bitwise; a third on the other sort path,
 * FUSEDLOSS_LOVASZ_SORT 1 <-> 2, bitwise the same; a fourth on the other Jaccard pass,
 * FUSEDLOSS_LOVASZ_JAC 2 <-> 1: the gradient bitwise, the loss within an ulp; one on the other route of a
 * small-d probabilities gradient, FUSEDLOSS_LOVASZ_PC 0 <-> 1, and one on the other key kernel,
 * FUSEDLOSS_LOVASZ_KEYS4 1 <-> 0: bitwise; three on the packed-key sort, FUSEDLOSS_LOVASZ_SORT 2 <-> 3 with
 * digits of the automatic width, 8 and 10 bits: bitwise; four on the v2 pass's staging, flush, keys and H,
 * FUSEDLOSS_LOVASZ_JAC2_SG 1 <-> 0, FLUSH_BATCH 1 <-> 0, KEYS4_MINB 4 <-> 0, JAC2_HOIST 1 <-> 0: bitwise; two on
 * the per-segment sort, FUSEDLOSS_LOVASZ_SEGSORT_MIN 65536 <-> 1 and SEGSORT 1 <-> 0: bitwise)
 * and CUDA graph capture on a non-blocking stream + replay bitwise equal to eager (also after grad_loss changes on the device); the big case
 * N = 4, C = 19, d = 512 x 512 (f32 probabilities and grid logits, fused: loss and gradient); bad
 * arguments (status, the function named, nothing written); the size query's 2^31 - 1 limit; N = 0.
 *
 * Run:   build/test_lovasz_cuda [--small] [--no-big]   (--small: a few seconds, for compute-sanitizer;
 *        --no-big: skip the 20M-element case). Without a CUDA build or device: SKIP, exit 0.
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L /* setenv: the sort-path A/B of test_determinism_graph */
#include <cuda_runtime.h>

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusedloss.h"
#include "test_util.h"
#include "cuda_check.h"
#include "zoo_test_util.h"

/* ---- tolerance table (see the header comment) ------------------------------------------------- */
static const double RTOL_LOSS_PROB = 1e-6, RTOL_LOSS_LOGIT = 1e-5, RTOL_LOSS_RANDOM = 1e-5, ATOL_LOSS = 1e-7;
static const double RTOL_DX[3] = {1e-6, 9.765625e-4, 7.8125e-3};   /* f32, f16, bf16 */
static const double ATOL_DX[3] = {1e-40, 5.9604644775390625e-8, 1e-38};
static const double ATOL_DX_G = 1e-13;        /* x |g| */
static const double RTOL_DX_LOGIT = 1e-4;     /* p in fp32 */
static const double SLACK_DX_LOGIT = 1e-5;    /* x p_c (|gp_c| + max_k |gp_k|) */
static const double L1_RANDOM = 1e-2, L1_ATOL = 1e-30;
static const double PROTO_SEP_REL = 1e-4, PROTO_SEP_ABS = 1e-6;

enum { FULL_CASES = 640, SMALL_CASES = 32, LV_TAIL = 16, LV_MAXPROTO = 8, LV_MAX_PRINT = 20 };
static const float GL_VALUE = 0.7f;   /* the device grad_loss */

static int g_small = 0, g_nobig = 0;
static cudaStream_t g_stream;

/* ---- checks: counted in test_util's counters, the first LV_MAX_PRINT failures printed with the case --- */
static long g_printed = 0;
static char g_case[400] = "";

static int lv_check(int ok, int line, const char* fmt, ...) {
    if (ok) { tu_passed++; return 1; }
    tu_failed++;
    if (g_printed < LV_MAX_PRINT) {
        va_list ap;
        printf("FAIL [%s] line %d: ", g_case, line);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        putchar('\n');
    } else if (g_printed == LV_MAX_PRINT) {
        printf("(further failures are counted, not printed)\n");
    }
    g_printed++;
    fflush(stdout);
    return 0;
}
#define LCHECK(cond, ...) lv_check(!!(cond), __LINE__, __VA_ARGS__)
/* st: a variable (evaluated more than once) */
#define LCHECK_STATUS(st, want, what)                                                                       \
    LCHECK((st) == (want), "%s: status %d (%s), want %d (%s); last error \"%s\"", (what), (int)(st),         \
           fl_status_string(st), (int)(want), fl_status_string(want), fl_last_error())

static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- one case ---------------------------------------------------------------------------------- */
typedef struct {
    int64_t N, C, d, pad;   /* ld = C d + pad */
    fl_dtype dt;
    int i32, all, per_image, logits;
    int ign;                /* 0 none ignored, 1 ~30 %, 2 all */
    int64_t ign_index;
    int nan_ign;            /* ignored pixels' inputs NaN (never read) */
    int pass;               /* 0 forward, 1 fused, 2 fused in place */
    int gl;                 /* fused: grad_loss = device GL_VALUE (else NULL) */
    float gs;               /* grad_scale */
    int noloss;             /* fused: loss NULL */
    int flag;               /* error_flag given */
    int random;             /* fully random fp32 inputs (not on a grid) */
} cfg_t;

static void case_name(const cfg_t* c, char* buf, size_t n) {
    static const char* passes[3] = {"forward", "fused", "fused-inplace"};
    static const char* igns[3] = {"none", "30%", "all"};
    snprintf(buf, n,
             "%s N=%lld C=%lld d=%lld ld=%lld %s i%d %s per_image=%d %s ign=%s(%lld%s) %s gl=%s gs=%g%s flag=%d",
             c->random ? "random" : "grid", (long long)c->N, (long long)c->C, (long long)c->d,
             (long long)(c->C * c->d + c->pad), tu_dtype_name(c->dt), c->i32 ? 32 : 64, c->all ? "ALL" : "PRESENT",
             c->per_image, c->logits ? "logits" : "probs", igns[c->ign], (long long)c->ign_index,
             c->nan_ign ? ",NaN" : "", passes[c->pass], c->gl ? "0.7" : "NULL", (double)c->gs,
             c->noloss ? " loss=NULL" : "", c->flag);
}

static fl_lovasz_options make_opts(const cfg_t* c, int logits, int32_t* flag) {
    fl_lovasz_options o = FL_LOVASZ_OPTIONS_INIT;
    o.classes = c->all ? FL_LOVASZ_ALL : FL_LOVASZ_PRESENT;
    o.per_image = c->per_image;
    o.from_logits = logits;
    o.ignore_index = c->ign_index;
    o.error_flag = flag;
    return o;
}

static fl_index_dtype idx_of(const cfg_t* c) { return c->i32 ? FL_INDEX_I32 : FL_INDEX_I64; }

/* element (pixel i, class k) in rows of stride ld */
static int64_t el(const cfg_t* c, int64_t ld, int64_t i, int64_t k) { return (i / c->d) * ld + k * c->d + i % c->d; }

/* the host side of a case */
typedef struct {
    int64_t P, ld, ne;      /* ne = N ld + LV_TAIL elements */
    size_t es, isz;
    void* x;                /* input [ne]: padding, tail (and NaN-ignored pixels) poison */
    int64_t* lab;           /* reference view: -1 ignored or left out */
    int64_t* t64;           /* labels as passed (int64 / int32) */
    int32_t* t32;
    float* p32;             /* logits on the grid: p in fp32, [N][C][d] (ld = C d) */
} hcase;

static const void* hlabels(const cfg_t* c, const hcase* h) {
    return c->i32 ? (const void*)h->t32 : (const void*)h->t64;
}

static void free_hcase(hcase* h) {
    free(h->x); free(h->lab); free(h->t64); free(h->t32); free(h->p32);
    memset(h, 0, sizeof *h);
}

static int sep_close(double a, double b) {
    return fabs(a - b) <= PROTO_SEP_REL * (a > b ? a : b) + PROTO_SEP_ABS;
}

/* up to LV_MAXPROTO logit vectors (shift + 0.75 j) whose errors are pairwise separated per class
 * (see the header comment); pr [LV_MAXPROTO][C]. C == 1: p = 1 exactly for any vector. Returns M. */
static int build_protos(tu_rng* r, int64_t C, double shift, float* pr) {
    double* ev = tu_xmalloc(sizeof(double) * (size_t)C * 2 * LV_MAXPROTO);   /* ev[c][2 m + fg?0:1] */
    double* cand = tu_xmalloc(sizeof(double) * (size_t)C);
    int M = 0;
    for (int att = 0; att < 4000 && M < LV_MAXPROTO; att++) {
        for (int64_t k = 0; k < C; k++) cand[k] = shift + 0.75 * (double)tu_int_in(r, 0, 3);
        int ok = 1;
        if (C > 1) {
            double m = -INFINITY, s = 0.0;
            for (int64_t k = 0; k < C; k++) m = cand[k] > m ? cand[k] : m;
            for (int64_t k = 0; k < C; k++) s += exp(cand[k] - m);
            const double lse = m + log(s);
            for (int64_t k = 0; k < C && ok; k++) {
                const double p = exp(cand[k] - lse), a0 = 1.0 - p, a1 = p;
                if (sep_close(a0, a1)) ok = 0;
                const double* evk = ev + (size_t)k * 2 * LV_MAXPROTO;
                for (int j = 0; j < M && ok; j++) {
                    const double b0 = evk[2 * j], b1 = evk[2 * j + 1];
                    if (sep_close(a0, b0) || sep_close(a0, b1) || sep_close(a1, b0) || sep_close(a1, b1)) ok = 0;
                }
            }
            if (ok)
                for (int64_t k = 0; k < C; k++) {
                    const double p = exp(cand[k] - lse);
                    ev[(size_t)k * 2 * LV_MAXPROTO + 2 * M] = 1.0 - p;
                    ev[(size_t)k * 2 * LV_MAXPROTO + 2 * M + 1] = p;
                }
        }
        if (ok) {
            for (int64_t k = 0; k < C; k++) pr[(size_t)M * (size_t)C + (size_t)k] = (float)cand[k];
            M++;
        }
    }
    free(ev);
    free(cand);
    return M;
}

/* fresh inputs and labels for case c (seeded) */
static int build_inputs(const cfg_t* c, uint64_t seed, hcase* h) {
    const int64_t N = c->N, C = c->C, d = c->d, P = N * d, Cd = C * d, ld = Cd + c->pad;
    memset(h, 0, sizeof *h);
    h->P = P;
    h->ld = ld;
    h->ne = N * ld + LV_TAIL;
    h->es = tu_dtype_size(c->dt);
    h->isz = c->i32 ? 4 : 8;
    h->x = tu_xmalloc((size_t)h->ne * h->es);
    tu_poison(h->x, (size_t)h->ne * h->es);
    h->lab = tu_xmalloc((size_t)P * 8 + 8);
    h->t64 = tu_xmalloc((size_t)P * 8 + 8);
    h->t32 = tu_xmalloc((size_t)P * 4 + 4);
    const int grid_logits = c->logits && !c->random;
    h->p32 = grid_logits ? tu_xmalloc((size_t)(P * C) * 4 + 4) : NULL;
    tu_rng r = tu_rng_seed(seed);
    static const double shifts[4] = {0.0, -0.75, 0.5, -1.5};
    const double shift = shifts[tu_int_in(&r, 0, 3)];
    float* pr = tu_xmalloc(sizeof(float) * (size_t)C * LV_MAXPROTO);
    int M = 0;
    if (grid_logits) {
        M = build_protos(&r, C, shift, pr);
        LCHECK(M >= 1, "no separated logit prototype found (C = %lld)", (long long)C);
        if (M < 1) { free(pr); return 0; }
    }
    const int kmax = c->dt == FL_DTYPE_BF16 ? 256 : 4096;
    for (int64_t i = 0; i < P; i++) {
        const int ig = c->ign == 2 || (c->ign == 1 && tu_uniform(&r) < 0.3);
        h->lab[i] = ig ? -1 : tu_int_in(&r, 0, C - 1);
        h->t64[i] = ig ? c->ign_index : h->lab[i];
        h->t32[i] = (int32_t)h->t64[i];
        if (ig && c->nan_ign) continue;   /* inputs stay NaN: never read */
        const int m = M > 0 ? (int)tu_int_in(&r, 0, M - 1) : 0;
        for (int64_t k = 0; k < C; k++) {
            float v;
            if (c->random) v = c->logits ? (float)(1.5 * tu_normal(&r)) : (float)tu_uniform(&r);
            else if (c->logits) v = pr[(size_t)m * (size_t)C + (size_t)k];
            else v = (float)tu_int_in(&r, 0, kmax) / (float)kmax;
            tu_store(h->x, c->dt, el(c, ld, i, k), v);
        }
    }
    if (grid_logits)   /* p from the stored (dtype) values, in double, rounded to fp32 */
        for (int64_t i = 0; i < P; i++) {
            if (h->lab[i] < 0) {
                for (int64_t k = 0; k < C; k++) h->p32[el(c, Cd, i, k)] = 0.5f;
                continue;
            }
            double m = -INFINITY, s = 0.0;
            for (int64_t k = 0; k < C; k++) {
                const double v = tu_load(h->x, c->dt, el(c, ld, i, k));
                m = v > m ? v : m;
            }
            for (int64_t k = 0; k < C; k++) s += exp((double)tu_load(h->x, c->dt, el(c, ld, i, k)) - m);
            const double lse = m + log(s);
            for (int64_t k = 0; k < C; k++)
                h->p32[el(c, Cd, i, k)] = (float)exp((double)tu_load(h->x, c->dt, el(c, ld, i, k)) - lse);
        }
    free(pr);
    return 1;
}

/* The CPU backend: forward (dx NULL) or fused; x in rows of stride ld, dtype dt, from_logits logits. */
static fl_status cpu_run(const cfg_t* c, const void* labels, const void* x, int64_t ld, fl_dtype dt, int logits,
                         float* loss, void* dx) {
    fl_lovasz_options o = make_opts(c, logits, NULL);
    size_t wsb = 0;
    fl_status st = fl_lovasz_softmax_workspace_size(&wsb, c->N, c->C, c->d, dt, &o);
    if (st != FL_OK) return st;
    void* ws = tu_xmalloc(wsb);
    if (!dx) st = fl_lovasz_softmax_forward_cpu(loss, x, ld, labels, idx_of(c), c->N, c->C, c->d, dt, &o, ws, wsb);
    else
        st = fl_lovasz_softmax_fused_cpu(loss, dx, x, ld, labels, idx_of(c), c->gl ? &GL_VALUE : NULL, c->gs, c->N,
                                         c->C, c->d, dt, &o, ws, wsb);
    free(ws);
    return st;
}

/* The CPU reference of case c with the labels `labels` (host): loss (always), dinput rd [ne] (fused; poisoned
 * first), gp [N][C][d] = dloss/dp (logits on the grid, fused; else left NULL). Returns 1 on success. */
static int cpu_reference(const cfg_t* c, const hcase* h, const void* labels, float* rl, void** rd, float** gp) {
    const int fused = c->pass != 0;
    *rd = NULL;
    *gp = NULL;
    if (fused) {
        *rd = tu_xmalloc((size_t)h->ne * h->es);
        tu_poison(*rd, (size_t)h->ne * h->es);
    }
    fl_status st = cpu_run(c, labels, h->x, h->ld, c->dt, c->logits, rl, *rd);
    if (!LCHECK_STATUS(st, FL_OK, "CPU reference")) return 0;
    if (fused && h->p32) {
        *gp = tu_xmalloc((size_t)(h->P * c->C) * 4 + 4);
        st = cpu_run(c, labels, h->p32, c->C * c->d, FL_DTYPE_F32, 0, NULL, *gp);
        if (!LCHECK_STATUS(st, FL_OK, "CPU reference (dloss/dp)")) return 0;
    }
    return 1;
}

static fl_status gpu_call(const cfg_t* c, int fused, float* loss, void* dx, const void* x, int64_t ld, const void* lab,
                          const float* gl, const fl_lovasz_options* o, void* ws, size_t wsb) {
    if (!fused)
        return fl_lovasz_softmax_forward_cuda(loss, x, ld, lab, idx_of(c), c->N, c->C, c->d, c->dt, o, ws, wsb,
                                              (fl_stream)g_stream);
    return fl_lovasz_softmax_fused_cuda(loss, dx, x, ld, lab, idx_of(c), gl, c->gs, c->N, c->C, c->d, c->dt, o, ws, wsb,
                                        (fl_stream)g_stream);
}

/* ---- comparisons ------------------------------------------------------------------------------- */
static int cmp_loss(const char* what, const cfg_t* c, float got, float ref) {
    const double rt = c->random ? RTOL_LOSS_RANDOM : c->logits ? RTOL_LOSS_LOGIT : RTOL_LOSS_PROB;
    const double diff = fabs((double)got - (double)ref);
    return LCHECK(isfinite(got) && isfinite(ref) && diff <= ATOL_LOSS + rt * fabs((double)ref),
                  "%s: gpu %.9g, cpu %.9g, diff %.3g (tol %.3g)", what, (double)got, (double)ref, diff,
                  ATOL_LOSS + rt * fabs((double)ref));
}

/* The C d elements of every pixel (skip[i]: not compared) of a fused result, gpu / cpu [ne] in the
 * input's layout; gp: dloss/dp for the logits tolerance (or NULL). Every element must be written
 * (not the poison), finite, ignored pixels exactly 0, the rest within the table's tolerance. */
static int cmp_grad(const char* what, const cfg_t* c, const hcase* h, const void* gpu, const void* cpu,
                    const float* gp, const unsigned char* skip) {
    const int64_t C = c->C, Cd = C * c->d;
    const int dt = (int)c->dt;
    const double g = fabs((double)c->gs * (c->gl ? (double)GL_VALUE : 1.0));
    int64_t unwritten = 0, nonfinite = 0, ignbad = 0, bad = 0, n = 0;
    double l1d = 0.0, l1r = 0.0;
    char ex[400] = "";
    size_t exl = 0;
    for (int64_t i = 0; i < h->P; i++) {
        if (skip && skip[i]) continue;
        double gpmax = 0.0;
        if (gp)
            for (int64_t k = 0; k < C; k++) {
                const double a = fabs((double)gp[el(c, Cd, i, k)]);
                gpmax = a > gpmax ? a : gpmax;
            }
        for (int64_t k = 0; k < C; k++, n++) {
            const int64_t e = el(c, h->ld, i, k);
            if (tu_is_poison(gpu, h->es, e)) { unwritten++; continue; }
            const double a = tu_load(gpu, c->dt, e), r = tu_load(cpu, c->dt, e);
            if (!isfinite(a) || !isfinite(r)) { nonfinite++; continue; }
            if (h->lab[i] < 0) { ignbad += a != 0.0 || r != 0.0; continue; }
            const double diff = fabs(a - r);
            if (c->random) { l1d += diff; l1r += fabs(r); continue; }
            double tol = ATOL_DX[dt] + ATOL_DX_G * g + RTOL_DX[dt] * fabs(r);
            if (gp) {
                const int64_t q = el(c, Cd, i, k);
                tol += RTOL_DX_LOGIT * fabs(r) + SLACK_DX_LOGIT * (double)h->p32[q] * (fabs((double)gp[q]) + gpmax);
            }
            if (!(diff <= tol)) {
                if (bad < 3 && exl < sizeof ex - 1)
                    exl += (size_t)snprintf(ex + exl, sizeof ex - exl,
                                            " [pixel %lld class %lld: gpu %.9g cpu %.9g tol %.3g]", (long long)i,
                                            (long long)k, a, r, tol);
                bad++;
            }
        }
    }
    const int l1ok = !c->random || l1d <= L1_RANDOM * l1r + L1_ATOL;
    return LCHECK(unwritten == 0 && nonfinite == 0 && ignbad == 0 && bad == 0 && l1ok,
                  "%s: of %lld elements %lld off tolerance, %lld unwritten (poison), %lld NaN/inf, %lld ignored not 0%s"
                  "; L1 |gpu - cpu| %.3g vs |cpu| %.3g%s",
                  what, (long long)n, (long long)bad, (long long)unwritten, (long long)nonfinite, (long long)ignbad,
                  c->random ? " (random: L1 only)" : "", l1d, l1r, ex);
}

/* elements of buf in the padding columns C d .. ld-1 and the tail guard that are not poison */
static int64_t count_pad_written(const cfg_t* c, const hcase* h, const void* buf) {
    int64_t w = 0;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t j = c->C * c->d; j < h->ld; j++) w += !tu_is_poison(buf, h->es, n * h->ld + j);
    for (int64_t k = c->N * h->ld; k < h->ne; k++) w += !tu_is_poison(buf, h->es, k);
    return w;
}

/* ---- device buffers of a case ------------------------------------------------------------------ */
typedef struct {
    void *x, *dx, *lab, *ws;
    float *loss, *gl;
    int32_t* flag;
    size_t wsb;
} dcase;

static void dcase_alloc(const cfg_t* c, const hcase* h, dcase* D, const void* labels) {
    memset(D, 0, sizeof *D);
    const size_t xb = (size_t)h->ne * h->es;
    fl_lovasz_options o = make_opts(c, c->logits, NULL);
    fl_status st = fl_lovasz_softmax_workspace_size_cuda(&D->wsb, c->N, c->C, c->d, c->dt, &o);
    LCHECK_STATUS(st, FL_OK, "fl_lovasz_softmax_workspace_size_cuda");
    CK(cudaMalloc(&D->x, xb));
    CK(cudaMalloc(&D->dx, xb));
    CK(cudaMalloc(&D->lab, (size_t)h->P * h->isz + 8));
    CK(cudaMalloc(&D->ws, D->wsb ? D->wsb : 256));
    CK(cudaMalloc((void**)&D->loss, 8));
    CK(cudaMalloc((void**)&D->gl, 4));
    CK(cudaMalloc((void**)&D->flag, 4));
    CK(cudaMemcpy(D->x, h->x, xb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(D->lab, labels, (size_t)h->P * h->isz, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(D->gl, &GL_VALUE, 4, cudaMemcpyHostToDevice));
}

static void dcase_free(dcase* D) {
    CK(cudaFree(D->x)); CK(cudaFree(D->dx)); CK(cudaFree(D->lab)); CK(cudaFree(D->ws));
    CK(cudaFree(D->loss)); CK(cudaFree(D->gl)); CK(cudaFree(D->flag));
}

/* before a call: outputs and workspace poisoned (0xFF: NaN in every dtype), the flag 0; dinput = a copy
 * of the input for in place; then every legacy-stream operation done */
static void dcase_prepare(const hcase* h, dcase* D, int inplace) {
    const size_t xb = (size_t)h->ne * h->es;
    CK(cudaMemset(D->loss, 0xFF, 8));
    if (inplace) CK(cudaMemcpy(D->dx, D->x, xb, cudaMemcpyDeviceToDevice));
    else CK(cudaMemset(D->dx, 0xFF, xb));
    CK(cudaMemset(D->ws, 0xFF, D->wsb ? D->wsb : 256));
    CK(cudaMemset(D->flag, 0, 4));
    CK(cudaDeviceSynchronize());
}

/* ---- one grid (or random, or big) case -------------------------------------------------------- */
static int run_case(const cfg_t* c, uint64_t seed) {
    case_name(c, g_case, sizeof g_case);
    const long fail0 = tu_failed;
    hcase h;
    if (!build_inputs(c, seed, &h)) { free_hcase(&h); return 0; }
    const int fused = c->pass != 0, inplace = c->pass == 2;
    const void* labels = hlabels(c, &h);
    const size_t xb = (size_t)h.ne * h.es;

    float rl = NAN;
    void* rd = NULL;
    float* gp = NULL;
    if (!cpu_reference(c, &h, labels, &rl, &rd, &gp)) {
        free(rd); free(gp); free_hcase(&h);
        return 0;
    }

    dcase D;
    dcase_alloc(c, &h, &D, labels);
    fl_lovasz_options o = make_opts(c, c->logits, c->flag ? D.flag : NULL);
    dcase_prepare(&h, &D, inplace);
    const int want_loss = !(fused && c->noloss);
    void* gin = inplace ? D.dx : D.x;
    fl_status st = gpu_call(c, fused, want_loss ? D.loss : NULL, fused ? D.dx : NULL, gin, h.ld, D.lab,
                            c->gl ? D.gl : NULL, &o, D.ws, D.wsb);
    if (LCHECK_STATUS(st, FL_OK, "CUDA call")) {
        zt_check_call_ok(g_case, D.flag, 0);
        float hl[2];
        CK(cudaMemcpy(hl, D.loss, 8, cudaMemcpyDeviceToHost));
        if (want_loss) {
            cmp_loss("loss", c, hl[0], rl);
            LCHECK(tu_is_poison(hl, 4, 1), "loss[1] written");
        } else {
            LCHECK(tu_is_poison(hl, 4, 0) && tu_is_poison(hl, 4, 1), "loss NULL but the loss buffer was written");
        }
        if (fused) {
            void* hd = tu_xmalloc(xb);
            CK(cudaMemcpy(hd, D.dx, xb, cudaMemcpyDeviceToHost));
            cmp_grad("dinput", c, &h, hd, rd, gp, NULL);
            const int64_t w = count_pad_written(c, &h, hd);
            LCHECK(w == 0, "%lld dinput elements in the padding / tail guard written", (long long)w);
            free(hd);
        }
        if (!inplace) {
            void* hx2 = tu_xmalloc(xb);
            CK(cudaMemcpy(hx2, D.x, xb, cudaMemcpyDeviceToHost));
            LCHECK(memcmp(hx2, h.x, xb) == 0, "the input was modified");
            free(hx2);
        }
    }
    dcase_free(&D);
    free(rd);
    free(gp);
    free_hcase(&h);
    return tu_failed == fail0;
}

/* ---- the grid ---------------------------------------------------------------------------------- */
enum { AX_N, AX_C, AX_D, AX_DT, AX_I32, AX_ALL, AX_PI, AX_LOG, AX_IGN, AX_IGNIDX, AX_NANIGN, AX_PAD, AX_PASS, AX_GL,
       AX_GS, AX_NOLOSS, AX_FLAG, AX_COUNT };
static const char* AX_NAMES[AX_COUNT] = {"N", "C", "d", "dtype", "labels", "classes", "per_image", "from_logits",
                                         "ignored", "ignore_index", "NaN ignored", "ld", "pass", "grad_loss",
                                         "grad_scale", "loss NULL", "error_flag"};
static const int AX_SIZE[AX_COUNT] = {3, 5, 5, 3, 2, 2, 2, 2, 3, 2, 2, 3, 3, 2, 2, 2, 2};

static void gen_case(tu_rng* r, int small, cfg_t* c, int cov[AX_COUNT][5]) {
    /* C = 40: lv_softmax_bwd's loop beyond the 32 classes it keeps in registers */
    static const int64_t Ns[3] = {1, 2, 3}, Cs[5] = {1, 2, 5, 19, 40}, ds[5] = {1, 7, 64, 1000, 4099};
    static const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    int v[AX_COUNT];
    memset(c, 0, sizeof *c);
    v[AX_N] = (int)tu_int_in(r, 0, 2);
    v[AX_C] = (int)tu_int_in(r, 0, 4);
    v[AX_D] = (int)tu_int_in(r, 0, small ? 2 : 4);
    v[AX_DT] = (int)tu_int_in(r, 0, 2);
    v[AX_I32] = (int)tu_int_in(r, 0, 1);
    v[AX_ALL] = (int)tu_int_in(r, 0, 1);
    v[AX_PI] = (int)tu_int_in(r, 0, 1);
    v[AX_LOG] = (int)tu_int_in(r, 0, 1);
    {   /* ignored: none 40 %, ~30 % 45 %, all 15 % */
        const double u = tu_uniform(r);
        v[AX_IGN] = u < 0.40 ? 0 : u < 0.85 ? 1 : 2;
    }
    v[AX_IGNIDX] = tu_uniform(r) < 1.0 / 3.0;   /* 255 in a third */
    v[AX_NANIGN] = (int)tu_int_in(r, 0, 1);
    {   /* ld: C d (half), C d + 5, C d + d + 3 */
        const double u = tu_uniform(r);
        v[AX_PAD] = u < 0.5 ? 0 : u < 0.75 ? 1 : 2;
    }
    {   /* forward 25 %, fused 50 %, fused in place 25 % */
        const double u = tu_uniform(r);
        v[AX_PASS] = u < 0.25 ? 0 : u < 0.75 ? 1 : 2;
    }
    v[AX_GL] = (int)tu_int_in(r, 0, 1);
    v[AX_GS] = (int)tu_int_in(r, 0, 1);
    v[AX_NOLOSS] = v[AX_PASS] != 0 && tu_uniform(r) < 0.25;
    v[AX_FLAG] = tu_uniform(r) < 0.75;
    c->N = Ns[v[AX_N]];
    c->C = Cs[v[AX_C]];
    c->d = ds[v[AX_D]];
    c->dt = dts[v[AX_DT]];
    c->i32 = v[AX_I32];
    c->all = v[AX_ALL];
    c->per_image = v[AX_PI];
    c->logits = v[AX_LOG];
    c->ign = v[AX_IGN];
    c->ign_index = v[AX_IGNIDX] ? 255 : -100;
    c->nan_ign = v[AX_NANIGN];
    c->pad = v[AX_PAD] == 0 ? 0 : v[AX_PAD] == 1 ? 5 : c->d + 3;
    c->pass = v[AX_PASS];
    c->gl = v[AX_PASS] != 0 && v[AX_GL];
    c->gs = v[AX_PASS] != 0 && v[AX_GS] ? 2.5f : 1.0f;
    c->noloss = v[AX_NOLOSS];
    c->flag = v[AX_FLAG];
    for (int a = 0; a < AX_COUNT; a++) {
        if ((a == AX_GL || a == AX_GS || a == AX_NOLOSS) && c->pass == 0) continue;   /* fused only */
        if (a == AX_NANIGN && c->ign == 0) continue;
        cov[a][v[a]]++;
    }
}

static void run_grid(long* ncases, long* nbad) {
    tu_rng r = tu_rng_seed(g_small ? 0x5111 : 0x10BA5);
    int cov[AX_COUNT][5];
    memset(cov, 0, sizeof cov);
    const int n = g_small ? SMALL_CASES : FULL_CASES;
    for (int k = 0; k < n; k++) {
        cfg_t c;
        gen_case(&r, g_small, &c, cov);
        (*ncases)++;
        if (!run_case(&c, 1000 + (uint64_t)k)) (*nbad)++;
    }
    snprintf(g_case, sizeof g_case, "grid coverage");
    if (!g_small)
        for (int a = 0; a < AX_COUNT; a++)
            for (int v = 0; v < AX_SIZE[a]; v++)
                LCHECK(cov[a][v] >= 10, "axis %s value %d drawn %d times (< 10)", AX_NAMES[a], v, cov[a][v]);
}

/* ---- fully random fp32 cases (gradient by relative L1) ---------------------------------------- */
static void run_random(long* ncases, long* nbad) {
    /* N, C, d, logits, per_image, all, pass, ign */
    static const int64_t R[][8] = {
        {1, 5, 1000, 0, 0, 0, 1, 0}, {2, 19, 4099, 0, 0, 0, 1, 1}, {3, 2, 1000, 0, 1, 1, 2, 1},
        {3, 19, 64, 0, 1, 0, 0, 1},  {2, 19, 4099, 1, 0, 0, 1, 1}, {3, 5, 4099, 1, 1, 0, 1, 0},
        {1, 19, 1000, 1, 0, 1, 2, 1}, {2, 2, 4099, 1, 0, 0, 1, 0}, {3, 19, 1000, 1, 1, 1, 0, 1},
        {2, 5, 64, 1, 1, 0, 1, 1},
    };
    static const int64_t Rs[][8] = {{1, 5, 64, 0, 0, 0, 1, 1}, {2, 5, 64, 1, 1, 0, 1, 1}};
    const int n = g_small ? 2 : (int)(sizeof R / sizeof R[0]);
    for (int k = 0; k < n; k++) {
        const int64_t* q = g_small ? Rs[k] : R[k];
        cfg_t c;
        memset(&c, 0, sizeof c);
        c.random = 1;
        c.dt = FL_DTYPE_F32;
        c.N = q[0]; c.C = q[1]; c.d = q[2]; c.logits = (int)q[3]; c.per_image = (int)q[4]; c.all = (int)q[5];
        c.pass = (int)q[6]; c.ign = (int)q[7];
        c.ign_index = k % 3 == 2 ? 255 : -100;
        c.i32 = k & 1;
        c.pad = k % 4 == 1 ? 5 : 0;
        c.gl = c.pass != 0 && (k % 2 == 0);
        c.gs = k % 3 == 0 ? 2.5f : 1.0f;
        c.flag = 1;
        (*ncases)++;
        if (!run_case(&c, 77000 + (uint64_t)k)) (*nbad)++;
    }
}

/* ---- the big case ----------------------------------------------------------------------------- */
static void run_big(long* ncases, long* nbad) {
    for (int logits = 0; logits < 2; logits++) {
        cfg_t c;
        memset(&c, 0, sizeof c);
        c.N = 4; c.C = 19; c.d = 512 * 512;
        c.dt = FL_DTYPE_F32;
        c.logits = logits;
        c.ign = logits;   /* the logits case with ~30 % ignored */
        c.ign_index = logits ? 255 : -100;
        c.pass = 1;
        c.gl = 1;
        c.gs = 1.0f;
        c.flag = 1;
        const double t0 = now_s();
        (*ncases)++;
        const int ok = run_case(&c, 990000 + (uint64_t)logits);
        if (!ok) (*nbad)++;
        printf("big: %s (%.1f s)\n", ok ? "ok" : "FAILED", now_s() - t0);
        fflush(stdout);
    }
}

/* ---- out-of-range labels ---------------------------------------------------------------------- */
static void test_oob(fl_dtype dt, int logits, int per_image, int i32, int use_flag, int64_t N, int64_t C, int64_t d,
                     int64_t ign_index, uint64_t seed) {
    cfg_t c;
    memset(&c, 0, sizeof c);
    c.N = N; c.C = C; c.d = d; c.dt = dt; c.logits = logits; c.per_image = per_image; c.i32 = i32;
    c.ign = 1; c.ign_index = ign_index; c.pass = 1; c.gl = 1; c.gs = 2.5f; c.flag = use_flag;
    c.pad = 3;
    char base[300];
    case_name(&c, base, sizeof base);
    snprintf(g_case, sizeof g_case, "out-of-range labels: %s", base);
    hcase h;
    if (!build_inputs(&c, seed, &h)) { free_hcase(&h); return; }
    const int64_t P = h.P;
    const size_t xb = (size_t)h.ne * h.es;
    /* bad labels C and -5 at two pixels; the CPU's view: those pixels ignored */
    const int64_t b1 = 1 % P, b2 = P - 2 > b1 ? P - 2 : (P - 1 > b1 ? P - 1 : b1);
    unsigned char* bad = calloc((size_t)P, 1);
    int64_t* c64 = tu_xmalloc((size_t)P * 8);
    int32_t* c32 = tu_xmalloc((size_t)P * 4);
    memcpy(c64, h.t64, (size_t)P * 8);
    memcpy(c32, h.t32, (size_t)P * 4);
    h.t64[b1] = C; h.t32[b1] = (int32_t)C;
    h.t64[b2] = -5; h.t32[b2] = -5;
    bad[b1] = bad[b2] = 1;
    c64[b1] = c64[b2] = ign_index;
    c32[b1] = c32[b2] = (int32_t)ign_index;
    h.lab[b1] = h.lab[b2] = -1;
    const void* hbad = hlabels(&c, &h);
    const void* hgood = i32 ? (const void*)c32 : (const void*)c64;
    if (h.p32)   /* the bad pixels' inputs are valid values (nan_ign 0); p32 of an ignored pixel: any value */
        for (int64_t k = 0; k < C; k++) h.p32[el(&c, C * d, b1, k)] = h.p32[el(&c, C * d, b2, k)] = 0.5f;

    float rl = NAN;
    void *rd = NULL;
    float* gp = NULL;
    if (!cpu_reference(&c, &h, hgood, &rl, &rd, &gp)) goto out;
    {   /* the CPU itself rejects the bad labels */
        float l2 = 0.0f;
        void* d2 = tu_xmalloc(xb);
        fl_status s2 = cpu_run(&c, hbad, h.x, h.ld, dt, logits, &l2, d2);
        LCHECK_STATUS(s2, FL_ERR_TARGET_OUT_OF_RANGE, "the CPU with the bad labels");
        free(d2);
    }
    dcase D;
    dcase_alloc(&c, &h, &D, hbad);
    void* dgood;
    CK(cudaMalloc(&dgood, (size_t)P * h.isz + 8));
    CK(cudaMemcpy(dgood, hgood, (size_t)P * h.isz, cudaMemcpyHostToDevice));
    fl_lovasz_options o = make_opts(&c, logits, use_flag ? D.flag : NULL);
    void* hd = tu_xmalloc(xb);
    for (int op = 0; op < 4; op++) {   /* forward, fused, fused in place, fused loss NULL */
        const int fused = op != 0, inplace = op == 2, want_loss = op != 3;
        snprintf(g_case, sizeof g_case, "out-of-range labels op=%d: %s", op, base);
        dcase_prepare(&h, &D, inplace);
        fl_status st = gpu_call(&c, fused, want_loss ? D.loss : NULL, fused ? D.dx : NULL, inplace ? D.dx : D.x, h.ld,
                                D.lab, D.gl, &o, D.ws, D.wsb);
        if (!LCHECK_STATUS(st, FL_OK, "CUDA call (asynchronous: FL_OK)")) continue;
        zt_check_call_ok(g_case, D.flag, use_flag);
        float hl[2];
        CK(cudaMemcpy(hl, D.loss, 8, cudaMemcpyDeviceToHost));
        if (want_loss) LCHECK(isnan(hl[0]), "loss %.9g, want NaN", (double)hl[0]);
        else LCHECK(tu_is_poison(hl, 4, 0), "loss NULL but written");
        LCHECK(tu_is_poison(hl, 4, 1), "loss[1] written");
        if (!fused) continue;
        CK(cudaMemcpy(hd, D.dx, xb, cudaMemcpyDeviceToHost));
        int64_t notnan = 0;
        for (int64_t i = 0; i < P; i++)
            if (bad[i])
                for (int64_t k = 0; k < C; k++) {
                    const int64_t e = el(&c, h.ld, i, k);
                    /* NaN written, not the poison pattern (which is a NaN too) */
                    notnan += !isnan(tu_load(hd, dt, e)) || tu_is_poison(hd, h.es, e);
                }
        LCHECK(notnan == 0, "%lld dinput entries of the bad pixels not a written NaN", (long long)notnan);
        cmp_grad("dinput (good pixels)", &c, &h, hd, rd, gp, bad);
        const int64_t w = count_pad_written(&c, &h, hd);
        LCHECK(w == 0, "%lld dinput elements in the padding / tail guard written", (long long)w);
    }
    {   /* then a valid call with error_flag: the flag stays 0, the results as the CPU's */
        snprintf(g_case, sizeof g_case, "out-of-range labels, valid call after: %s", base);
        fl_lovasz_options ov = make_opts(&c, logits, D.flag);
        dcase_prepare(&h, &D, 0);
        fl_status st = gpu_call(&c, 1, D.loss, D.dx, D.x, h.ld, dgood, D.gl, &ov, D.ws, D.wsb);
        if (LCHECK_STATUS(st, FL_OK, "valid CUDA call")) {
            zt_check_call_ok(g_case, D.flag, 0);
            float hl[2];
            CK(cudaMemcpy(hl, D.loss, 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hd, D.dx, xb, cudaMemcpyDeviceToHost));
            cmp_loss("loss", &c, hl[0], rl);
            cmp_grad("dinput", &c, &h, hd, rd, gp, NULL);
        }
    }
    free(hd);
    CK(cudaFree(dgood));
    dcase_free(&D);
out:
    free(rd); free(gp); free(bad); free(c64); free(c32);
    free_hcase(&h);
}

/* ---- determinism and CUDA graph capture / replay --------------------------------------------- */
static int graph_ok_or_report(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return 1;
    LCHECK(0, "%s: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    return 0;
}

static void test_determinism_graph(const cfg_t* c, uint64_t seed) {
    char base[300];
    case_name(c, base, sizeof base);
    snprintf(g_case, sizeof g_case, "determinism / graph: %s", base);
    hcase h;
    if (!build_inputs(c, seed, &h)) { free_hcase(&h); return; }
    const size_t xb = (size_t)h.ne * h.es;
    const void* labels = hlabels(c, &h);
    float rl = NAN;
    void* rd = NULL;
    float* gp = NULL;
    if (!cpu_reference(c, &h, labels, &rl, &rd, &gp)) { free(rd); free(gp); free_hcase(&h); return; }
    dcase D;
    dcase_alloc(c, &h, &D, labels);
    fl_lovasz_options o = make_opts(c, c->logits, D.flag);
    float la[2], lb[2];
    void* da = tu_xmalloc(xb);
    void* db = tu_xmalloc(xb);
#define LV_CALL() gpu_call(c, 1, D.loss, D.dx, D.x, h.ld, D.lab, D.gl, &o, D.ws, D.wsb)
#define LV_FETCH(l_, d_)                                              \
    do {                                                              \
        CK(cudaMemcpy(l_, D.loss, 8, cudaMemcpyDeviceToHost));        \
        CK(cudaMemcpy(d_, D.dx, xb, cudaMemcpyDeviceToHost));         \
    } while (0)
    fl_status st;
    /* eager twice: bitwise the same; the first also against the CPU */
    for (int rep = 0; rep < 2; rep++) {
        dcase_prepare(&h, &D, 0);
        st = LV_CALL();
        if (!LCHECK_STATUS(st, FL_OK, "eager call")) goto out;
        zt_check_call_ok(g_case, D.flag, 0);
        if (rep == 0) LV_FETCH(la, da);
        else LV_FETCH(lb, db);
    }
    cmp_loss("eager loss", c, la[0], rl);
    cmp_grad("eager dinput", c, &h, da, rd, gp, NULL);
    LCHECK(memcmp(la, lb, 8) == 0 && memcmp(da, db, xb) == 0, "two eager runs differ (loss %.9g / %.9g)",
           (double)la[0], (double)lb[0]);
    /* A/B of the kernel-choice knobs (read on every call; zt_env_other flips each to the value it does
     * not hold now, unset counting as the default) against the eager outputs la / da:
     *   FUSEDLOSS_LOVASZ_SORT 2 <-> 1   the 8-byte-pair / 12-byte-pair sort: the same order and operations
     *   FUSEDLOSS_LOVASZ_KEYS4 1 <-> 0  the 4-pixel key kernel (where d, ld and the input allow it)
     *   FUSEDLOSS_LOVASZ_PC 0 <-> 1     small-d probabilities' gradient through the class-major buffer
     *   FUSEDLOSS_LOVASZ_JAC 2 <-> 1    the v2 Jaccard pass (32-bit sort path): the same ranks and
     *                                   operations, the loss summed per tile (so within an fp32 ulp)
     *   FUSEDLOSS_LOVASZ_SORT 2 <-> 3   the packed 64-bit keys sorted alone (digits of the automatic
     *                                   width, then of 8 and 10 bits: FUSEDLOSS_LOVASZ_RADIX set for
     *                                   the row): the same order
     *   FUSEDLOSS_LOVASZ_JAC2_SG 1 <-> 0 the v2 pass's bucket staging through shared memory (where buckets
     *                                   are taken: segments of >= FUSEDLOSS_LOVASZ_BUCKET_MIN pixels)
     *   FUSEDLOSS_LOVASZ_FLUSH_BATCH 1 <-> 0 the flush's entry loads batched (buckets only)
     *   FUSEDLOSS_LOVASZ_KEYS4_MINB 4 <-> 0 the 4-pixel key kernel bounded to 4 blocks an SM
     *   FUSEDLOSS_LOVASZ_JAC2_HOIST 1 <-> 0 the v2 pass's one-segment threads with their segment's values
     *                                   loaded once and one division an item, and the flush's destination
     *                                   formed once a window (s31; the default since s32)
     *   FUSEDLOSS_LOVASZ_SEGSORT_MIN 65536 <-> 1 and FUSEDLOSS_LOVASZ_SEGSORT 1 <-> 0: each segment sorted on
     *                                   its own by its error keys (no pass B; s33, the default for segments of
     *                                   >= 65536 pixels) against pass A + pass B, for segments of every size
     * all bitwise the same gradient, and the same loss but for JAC's summation order */
    {
        static const struct {
            const char *knob, *dflt, *other;
            int loss_ulp;
            const char *knob2, *val2;   /* a second knob set for the row, or NULL */
        } ab[] = {{"FUSEDLOSS_LOVASZ_SORT", "2", "1", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_KEYS4", "1", "0", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_PC", "0", "1", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_JAC", "2", "1", 1, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_SORT", "2", "3", 0, "FUSEDLOSS_LOVASZ_RADIX", "0"},
                  {"FUSEDLOSS_LOVASZ_SORT", "2", "3", 0, "FUSEDLOSS_LOVASZ_RADIX", "8"},
                  {"FUSEDLOSS_LOVASZ_SORT", "2", "3", 0, "FUSEDLOSS_LOVASZ_RADIX", "10"},
                  {"FUSEDLOSS_LOVASZ_JAC2_SG", "1", "0", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_FLUSH_BATCH", "1", "0", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_KEYS4_MINB", "4", "0", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_JAC2_HOIST", "1", "0", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_SEGSORT_MIN", "65536", "1", 0, NULL, NULL},
                  {"FUSEDLOSS_LOVASZ_SEGSORT", "1", "0", 0, NULL, NULL}};
        for (size_t q = 0; q < sizeof ab / sizeof ab[0]; q++) {
            zt_env_saved sv, sv2;
            if (ab[q].knob2) {
                zt_env_other(&sv2, ab[q].knob2, "", "");   /* saves it; then the row's value */
                setenv(ab[q].knob2, ab[q].val2, 1);
            }
            const char* to = zt_env_other(&sv, ab[q].knob, ab[q].dflt, ab[q].other);
            dcase_prepare(&h, &D, 0);
            st = LV_CALL();
            if (LCHECK_STATUS(st, FL_OK, "eager call, the other path of a knob")) {
                zt_check_call_ok(g_case, D.flag, 0);
                LV_FETCH(lb, db);
                const int same_loss = ab[q].loss_ulp ? (lb[0] == la[0] || fabsf(lb[0] - la[0]) <= 1.2e-7f *
                                                                                    fmaxf(fabsf(la[0]), fabsf(lb[0])))
                                                     : memcmp(la, lb, 8) == 0;
                LCHECK(same_loss && memcmp(da, db, xb) == 0,
                       "%s=%s%s%s%s: %s differs from the other path (loss %.9g / %.9g)", ab[q].knob, to,
                       ab[q].knob2 ? " " : "", ab[q].knob2 ? ab[q].knob2 : "", ab[q].knob2 ? "=" : "",
                       memcmp(da, db, xb) ? "the gradient" : "the loss", (double)lb[0], (double)la[0]);
            }
            zt_env_restore(&sv);
            if (ab[q].knob2) zt_env_restore(&sv2);
        }
    }
    {   /* capture on the non-blocking stream, instantiate, replay three times */
        cudaGraph_t gr = NULL;
        cudaGraphExec_t ex = NULL;
        dcase_prepare(&h, &D, 0);
        if (!graph_ok_or_report(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal), "BeginCapture"))
            goto out;
        st = LV_CALL();
        const cudaError_t ce = cudaStreamEndCapture(g_stream, &gr);
        LCHECK_STATUS(st, FL_OK, "captured call");
        if (!graph_ok_or_report(ce, "EndCapture (the call is not capturable?)")) goto out;
        if (!graph_ok_or_report(cudaGraphInstantiate(&ex, gr, 0), "GraphInstantiate")) {
            cudaGraphDestroy(gr);
            goto out;
        }
        CK(cudaDeviceSynchronize());
        LV_FETCH(lb, db);   /* captured, not run: the outputs still poison */
        LCHECK(tu_is_poison(lb, 4, 0) && tu_is_poison(db, 1, 0), "the captured call ran eagerly (outputs written)");
        for (int rep = 0; rep < 3; rep++) {
            dcase_prepare(&h, &D, 0);
            CK(cudaGraphLaunch(ex, g_stream));
            CK(cudaStreamSynchronize(g_stream));
            zt_check_call_ok(g_case, D.flag, 0);
            LV_FETCH(lb, db);
            LCHECK(memcmp(la, lb, 8) == 0 && memcmp(da, db, xb) == 0, "graph replay %d != eager (loss %.9g / %.9g)",
                   rep, (double)lb[0], (double)la[0]);
        }
        /* grad_loss changed on the device: the replay reads it (no host copy baked in) */
        const float gl2 = -1.5f;
        CK(cudaMemcpy(D.gl, &gl2, 4, cudaMemcpyHostToDevice));
        dcase_prepare(&h, &D, 0);
        CK(cudaGraphLaunch(ex, g_stream));
        CK(cudaStreamSynchronize(g_stream));
        LV_FETCH(lb, db);
        float le[2];
        void* de = tu_xmalloc(xb);
        dcase_prepare(&h, &D, 0);
        st = LV_CALL();
        if (LCHECK_STATUS(st, FL_OK, "eager call, grad_loss -1.5")) {
            zt_check_call_ok(g_case, D.flag, 0);
            LV_FETCH(le, de);
            LCHECK(memcmp(le, lb, 8) == 0 && memcmp(de, db, xb) == 0, "graph replay with grad_loss -1.5 != eager");
            int64_t nz = 0;
            for (int64_t i = 0; i < h.P; i++)
                for (int64_t k = 0; k < c->C; k++) nz += tu_load(da, c->dt, el(c, h.ld, i, k)) != 0.0f;
            LCHECK(nz == 0 || memcmp(da, db, xb) != 0, "replay after grad_loss changed gives the old gradient");
        }
        free(de);
        CK(cudaMemcpy(D.gl, &GL_VALUE, 4, cudaMemcpyHostToDevice));
        CK(cudaGraphExecDestroy(ex));
        CK(cudaGraphDestroy(gr));
    }
#undef LV_CALL
#undef LV_FETCH
out:
    free(da); free(db);
    dcase_free(&D);
    free(rd); free(gp);
    free_hcase(&h);
}

/* ---- bad arguments, size query limits, N = 0 -------------------------------------------------- */
static void test_misc(void) {
    snprintf(g_case, sizeof g_case, "bad arguments");
    const int64_t N = 2, C = 4, d = 8, ld = 32;
    const fl_dtype F = FL_DTYPE_F32;
    const fl_index_dtype I = FL_INDEX_I64;
    const char* FU = "fl_lovasz_softmax_fused_cuda";
    const char* FW = "fl_lovasz_softmax_forward_cuda";
    const char* SZ = "fl_lovasz_softmax_workspace_size_cuda";
    fl_lovasz_options o = FL_LOVASZ_OPTIONS_INIT, ob;
    size_t wsb = 0, wsl = 0;
    fl_status st = fl_lovasz_softmax_workspace_size_cuda(&wsb, N, C, d, F, &o);
    LCHECK_STATUS(st, FL_OK, "size query");
    ob = o;
    ob.from_logits = 1;
    st = fl_lovasz_softmax_workspace_size_cuda(&wsl, N, C, d, F, &ob);
    /* at least one 64-bit sort key per element (the header's CUDA method) */
    LCHECK(st == FL_OK && wsb >= 8 * (size_t)(N * C * d) && wsl >= 8 * (size_t)(N * C * d),
           "size query: %zu (probabilities), %zu (logits)", wsb, wsl);
    float hx[64];
    int64_t ht[16];
    for (int k = 0; k < 64; k++) hx[k] = (float)((k * 37) % 64) / 64.0f;
    for (int k = 0; k < 16; k++) ht[k] = k % 4;
    void *x, *t, *dd;
    char* ws;
    float* l;
    CK(cudaMalloc(&x, 256)); CK(cudaMalloc(&t, 128)); CK(cudaMalloc(&dd, 256)); CK(cudaMalloc((void**)&l, 8));
    CK(cudaMalloc((void**)&ws, wsl + 512));
    CK(cudaMemcpy(x, hx, 256, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t, ht, 128, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd, 0xFF, 256));
    CK(cudaMemset(l, 0xFF, 8));
    CK(cudaDeviceSynchronize());
    const fl_stream s = (fl_stream)g_stream;
#define EXPECT(call_, want_, what_, fn_)                                                                         \
    do {                                                                                                         \
        const fl_status s_ = (call_);                                                                            \
        LCHECK(s_ == (want_) && strstr(fl_last_error(), fn_) != NULL,                                            \
               "%s: status %d (%s), want %d (%s); last error \"%s\" (must name %s)", what_, (int)s_,            \
               fl_status_string(s_), (int)(want_), fl_status_string(want_), fl_last_error(), fn_);               \
    } while (0)
#define FUS(l_, dx_, x_, ld_, gs_, o_, ws_, wsb_) \
    fl_lovasz_softmax_fused_cuda(l_, dx_, x_, ld_, t, I, NULL, gs_, N, C, d, F, o_, ws_, wsb_, s)
#define FWD(l_, x_, o_, ws_, wsb_) fl_lovasz_softmax_forward_cuda(l_, x_, ld, t, I, N, C, d, F, o_, ws_, wsb_, s)
    EXPECT(FUS(l, dd, x, ld, 1.0f, &o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "workspace NULL", FU);
    EXPECT(FUS(l, dd, x, ld, 1.0f, &o, ws + 128, wsb), FL_ERR_INVALID_ARGUMENT, "workspace 128 bytes off 256", FU);
    EXPECT(FUS(l, dd, x, ld, 1.0f, &o, ws + 16, wsb), FL_ERR_INVALID_ARGUMENT, "workspace 16 bytes off 256", FU);
    EXPECT(FWD(l, x, &o, ws + 64, wsb), FL_ERR_INVALID_ARGUMENT, "forward: workspace not 256-byte aligned", FW);
    EXPECT(FUS(l, dd, x, ld, 1.0f, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "workspace_bytes one short", FU);
    EXPECT(FWD(l, x, &o, ws, wsb - 1), FL_ERR_INSUFFICIENT_WORKSPACE, "forward: workspace_bytes one short", FW);
    if (wsl > wsb)   /* the size depends on the options: query with the call's */
        EXPECT(FUS(l, dd, x, ld, 1.0f, &ob, ws, wsb), FL_ERR_INSUFFICIENT_WORKSPACE,
               "logits with the probabilities' workspace size", FU);
    EXPECT(FUS(l, NULL, x, ld, 1.0f, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused: dinput NULL", FU);
    EXPECT(FWD(NULL, x, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "forward: loss NULL", FW);
    ob = o; ob.classes = (fl_lovasz_classes)2;
    EXPECT(FUS(l, dd, x, ld, 1.0f, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused: classes 2", FU);
    EXPECT(FWD(l, x, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "forward: classes 2", FW);
    ob = o; ob.classes = (fl_lovasz_classes)-1;
    EXPECT(FUS(l, dd, x, ld, 1.0f, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused: classes -1", FU);
    ob = o; ob.struct_size = sizeof(fl_lovasz_options) - 8;
    EXPECT(FUS(l, dd, x, ld, 1.0f, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused: struct_size", FU);
    EXPECT(FWD(l, x, &ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "forward: struct_size", FW);
    {
        size_t b = 0;
        EXPECT(fl_lovasz_softmax_workspace_size_cuda(&b, N, C, d, F, &ob), FL_ERR_INVALID_ARGUMENT, "size: struct_size",
               SZ);
    }
    EXPECT(FUS(l, dd, x, ld - 1, 1.0f, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "ld < C d", FU);
    EXPECT(FUS(l, dd, x, ld, NAN, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale NaN", FU);
    EXPECT(FUS(l, dd, (char*)x + 2, ld, 1.0f, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "input misaligned", FU);
    EXPECT(FUS(l, (float*)dd + 1, dd, ld, 1.0f, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "dinput partially overlaps input", FU);
    EXPECT(FUS((float*)ws, dd, x, ld, 1.0f, &o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps the workspace", FU);
    EXPECT(fl_lovasz_softmax_fused_cuda(l, dd, x, ld, t, (fl_index_dtype)5, NULL, 1.0f, N, C, d, F, &o, ws, wsb, s),
           FL_ERR_INVALID_ARGUMENT, "index_dtype 5", FU);
    CK(cudaDeviceSynchronize());
    {
        const int w = zt_count_written(dd, 256, l, 2);
        LCHECK(w == 0, "bad arguments: %d output bytes / floats written", w);
    }
    /* the 2^31 - 1 element limit of the CUDA backend (size queries: no allocation) */
    {
        size_t b = 0;
        EXPECT(fl_lovasz_softmax_workspace_size_cuda(&b, 8, 19, (int64_t)1 << 24, F, &o), FL_ERR_UNSUPPORTED,
               "size: C N d = 19 x 8 x 2^24 > 2^31 - 1", SZ);
        EXPECT(fl_lovasz_softmax_workspace_size_cuda(&b, 1, 1, (int64_t)1 << 31, F, &o), FL_ERR_UNSUPPORTED,
               "size: C N d = 2^31", SZ);
        EXPECT(fl_lovasz_softmax_workspace_size_cuda(NULL, N, C, d, F, &o), FL_ERR_INVALID_ARGUMENT, "size: bytes NULL",
               SZ);
        EXPECT(fl_lovasz_softmax_workspace_size_cuda(&b, N, 0, d, F, &o), FL_ERR_INVALID_ARGUMENT, "size: C = 0", SZ);
        EXPECT(fl_lovasz_softmax_workspace_size_cuda(&b, N, C, d, (fl_dtype)9, &o), FL_ERR_INVALID_ARGUMENT,
               "size: dtype 9", SZ);
        b = 0;
        st = fl_lovasz_softmax_workspace_size_cuda(&b, 1, 1, ((int64_t)1 << 31) - 1, F, &o);
        LCHECK(st == FL_OK && b >= (size_t)8 * (((size_t)1 << 31) - 1),
               "size: C N d = 2^31 - 1: status %d (%s), %zu bytes", (int)st, fl_last_error(), b);
        b = 0;
        st = fl_lovasz_softmax_workspace_size_cuda(&b, 1, 19, 4099, F, NULL);
        LCHECK(st == FL_OK && b > 0, "size: opts NULL: status %d (%s)", (int)st, fl_last_error());
        /* the calls too (validated before anything runs; the small buffers are never touched) */
        const int64_t dbig = (int64_t)1 << 24;
        EXPECT(fl_lovasz_softmax_fused_cuda(l, dd, x, 19 * dbig, t, I, NULL, 1.0f, 8, 19, dbig, F, &o, ws, wsb, s),
               FL_ERR_UNSUPPORTED, "fused: C N d > 2^31 - 1", FU);
        CK(cudaDeviceSynchronize());
        const int w = zt_count_written(dd, 256, l, 2);
        LCHECK(w == 0, "over the limit: %d output bytes / floats written", w);
    }
    /* N = 0: loss 0 (forward and fused, dinput NULL allowed) */
    {
        snprintf(g_case, sizeof g_case, "N = 0");
        size_t b0 = 0;
        st = fl_lovasz_softmax_workspace_size_cuda(&b0, 0, C, d, F, &o);
        LCHECK_STATUS(st, FL_OK, "size N = 0");
        char* ws0;
        CK(cudaMalloc((void**)&ws0, b0 ? b0 : 256));
        {
            for (int k = 0; k < 2; k++) {
                float hl = -1.0f;
                CK(cudaMemset(l, 0xFF, 8));
                CK(cudaDeviceSynchronize());
                st = k == 0 ? fl_lovasz_softmax_forward_cuda(l, NULL, ld, NULL, I, 0, C, d, F, &o, ws0, b0, s)
                            : fl_lovasz_softmax_fused_cuda(l, NULL, NULL, ld, NULL, I, NULL, 1.0f, 0, C, d, F, &o, ws0,
                                                           b0, s);
                LCHECK_STATUS(st, FL_OK, k == 0 ? "forward N = 0" : "fused N = 0");
                CK(cudaStreamSynchronize(g_stream));
                CK(cudaMemcpy(&hl, l, 4, cudaMemcpyDeviceToHost));
                LCHECK(hl == 0.0f, "N = 0 %s: loss %g, want 0", k == 0 ? "forward" : "fused", (double)hl);
            }
        }
        CK(cudaFree(ws0));
    }
#undef EXPECT
#undef FUS
#undef FWD
    CK(cudaFree(x)); CK(cudaFree(t)); CK(cudaFree(dd)); CK(cudaFree(l)); CK(cudaFree(ws));
}

int main(int argc, char** argv) {
    /* --no-big here, the rest (--small, usage, SKIP without a CUDA build / device) by the shared start */
    char* av[16];
    int ac = 0;
    for (int a = 0; a < argc && ac < 16; a++) {
        if (a > 0 && !strcmp(argv[a], "--no-big")) { g_nobig = 1; continue; }
        av[ac++] = argv[a];
    }
    {
        const int rc = zt_cuda_test_start(ac, av, "test_lovasz_cuda [--no-big]", &g_small);
        if (rc >= 0) return rc;
    }
    {
        struct cudaDeviceProp prop;
        CK(cudaGetDeviceProperties(&prop, 0));
        printf("test_lovasz_cuda: fusedloss %s on %s (sm_%d%d)%s%s\n", fl_version_string(), prop.name, prop.major,
               prop.minor, g_small ? ", small grid" : "", g_nobig || g_small ? ", no big case" : "");
        fflush(stdout);
    }
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    tu_quiet = 1;
    const double t0 = now_s();
    test_misc();

    long ncases = 0, nbad = 0;
    run_grid(&ncases, &nbad);
    printf("grid: %ld cases, %ld failed (%.1f s)\n", ncases, nbad, now_s() - t0);
    fflush(stdout);

    long nr = 0, nrbad = 0;
    run_random(&nr, &nrbad);
    printf("random fp32: %ld cases, %ld failed\n", nr, nrbad);

    const long oob0 = tu_failed;
    if (g_small) {
        test_oob(FL_DTYPE_F32, 0, 0, 0, 1, 2, 5, 7, -100, 501);
        test_oob(FL_DTYPE_BF16, 1, 1, 1, 1, 2, 5, 64, 255, 502);
        test_oob(FL_DTYPE_F16, 0, 1, 1, 0, 1, 2, 64, -100, 503);
    } else {
        test_oob(FL_DTYPE_F32, 0, 0, 0, 1, 2, 5, 64, -100, 501);
        test_oob(FL_DTYPE_BF16, 1, 1, 1, 1, 3, 19, 1000, 255, 502);
        test_oob(FL_DTYPE_F16, 0, 1, 1, 0, 2, 19, 4099, -100, 503);
        test_oob(FL_DTYPE_F32, 1, 0, 0, 0, 1, 2, 7, 255, 504);
        test_oob(FL_DTYPE_F32, 1, 1, 0, 1, 3, 5, 64, -100, 505);
        test_oob(FL_DTYPE_BF16, 0, 0, 1, 1, 2, 1, 1000, -100, 506);
    }
    printf("out-of-range labels: %s\n", tu_failed == oob0 ? "ok" : "FAILED");

    const long det0 = tu_failed;
    {
        cfg_t c;
        memset(&c, 0, sizeof c);
        c.N = 2; c.C = g_small ? 5 : 19; c.d = g_small ? 64 : 4099; c.dt = FL_DTYPE_F32; c.logits = 1;
        c.ign = 1; c.ign_index = -100; c.pass = 1; c.gl = 1; c.gs = 1.0f; c.flag = 1; c.pad = 5;
        test_determinism_graph(&c, 601);
        c.dt = FL_DTYPE_BF16; c.logits = 0; c.per_image = 1; c.all = 1; c.N = 3; c.i32 = 1; c.gs = 2.5f; c.pad = 0;
        test_determinism_graph(&c, 602);
        /* the P x C layout ([P, C] probabilities: N = P pixels, d = 1), FUSEDLOSS_LOVASZ_PC's case */
        memset(&c, 0, sizeof c);
        c.N = g_small ? 300 : 70001; c.C = g_small ? 5 : 19; c.d = 1; c.dt = FL_DTYPE_F32; c.ign = 1;
        c.ign_index = 255; c.pass = 1; c.gl = 1; c.gs = 1.0f; c.flag = 1;
        test_determinism_graph(&c, 604);
        /* per image with S = N C = 1140 segments (> LV_GC_SMEM: lv_count's global-atomic path, JAC=2) */
        memset(&c, 0, sizeof c);
        c.N = 60; c.C = 19; c.d = 8; c.dt = FL_DTYPE_BF16; c.per_image = 1; c.ign = 1; c.ign_index = -100;
        c.pass = 1; c.gl = 1; c.gs = 1.0f; c.flag = 1;
        test_determinism_graph(&c, 605);
        if (!g_small) {   /* segments of >= 65536 pixels: FUSEDLOSS_LOVASZ_JAC=2 takes its buckets by default */
            memset(&c, 0, sizeof c);
            c.N = 1; c.C = 19; c.d = 70000; c.dt = FL_DTYPE_F32; c.ign = 1; c.ign_index = 255; c.pass = 1;
            c.gl = 1; c.gs = 1.0f; c.flag = 1;
            test_determinism_graph(&c, 603);
        }
    }
    printf("determinism / graph: %s\n", tu_failed == det0 ? "ok" : "FAILED");

    long nbig = 0, nbigbad = 0;
    if (!g_small && !g_nobig) run_big(&nbig, &nbigbad);

    CK(cudaStreamDestroy(g_stream));
    printf("test_lovasz_cuda: grid %ld cases (%ld failed), random %ld (%ld failed), big %s; %.1f s\n", ncases, nbad, nr,
           nrbad, g_small || g_nobig ? "skipped" : nbigbad ? "FAILED" : "ok", now_s() - t0);
    return tu_finish();
}
