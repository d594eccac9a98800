/* test_distill_cuda.c — the CUDA distillation divergences (include/fusedloss.h section 10) against the
 * CPU backend (the reference, itself checked against float64 and finite differences by
 * tests/test_distill.c).
 *
 * Grid: student / teacher dtypes (f32/f32, f16/f16, bf16/bf16, bf16/f32, f16/f32) x beta (0 forward KL,
 * 1 reverse KL, 0.5 and 0.2 JSD) x temperature / T^2 scaling x reductions (NONE, SUM, MEAN,
 * BATCHMEAN) x labels (none, int64 with ignored rows, int32 all ignored) x pass (forward, fused with
 * grad_loss NULL / a device value / per row, in place) x shapes (N = 1 .. 300, V = 1 .. 128256, rows
 * crossing the 8192-column chunks, ld > V, odd ld: unaligned rows, a student one element off its
 * 16-byte phase: the scalar path; on sm_90 aligned rows of >= 1024 vectors take the ring kernel
 * for the fused KL (distill_pipe_kernel, default since 2026-12-05) and the fused JSD (since s39;
 * FUSEDLOSS_DISTILL_PIPE_JSD=0: the ticket kernel) and the staged cluster kernel for
 * the forward KL (FUSEDLOSS_DISTILL_STAGED=2: the JSD too); scripts/gpu_check.sh also runs this with
 * the ring on 3 clusters, with FUSEDLOSS_DISTILL_PIPE=0 and STAGED=2 + STAGED_GRID=3 (several rows per
 * cluster), and with PIPE=0 STAGED=0, the ticket kernel everywhere). Fresh random logits (normal, scale 3, some rows with a dominant
 * teacher class and logits of +-60, some with a dominant student class at +60), outputs poisoned before every call (NaN bytes); padding columns
 * of dstudent must stay poisoned, of an in-place student untouched. Plus: two runs bitwise equal
 * (determinism: the ticket order varies from run to run, the merge order does not), CUDA graph
 * capture + replay bitwise equal to eager, N = 0, unsupported teacher dtype, misaligned pointers.
 *
 * Tolerances (GPU fp32 vs CPU double on the same rounded inputs):
 *   loss : |d| <= 2e-6 * scale * (1 + |lse_s| + |lse_t|) + 1e-5 * |ref|   (the KL is formed from
 *          the merged statistics as sum p (b - a) - lse_t + lse_s: fp32 cancellation of the lse)
 *   dstudent[j] : |d| <= 1 ulp of the dtype (rtol) + 4e-6 * |G| * (q_j + p_j) * (1 + |lse_s| + |lse_t|
 *          + |log q_j - log p_j| + |l|): exp2 of an argument carrying ~ulp(lse) absolute error;
 *          + 4 |G| 2^-126 (1 + |l|): probabilities below 2^-126 flushed to zero (ex2.approx.ftz).
 * Run:   build/test_distill_cuda [--small] [--kl] [--min-v V]   (--small: N * V <= 2^18, for
 *        compute-sanitizer; --kl: betas 0 and 1 only; --min-v: shapes with V >= V only)
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

static const double RTOL_D[3] = {2e-6, 9.8e-4, 7.9e-3};   /* dstudent: 1 ulp of f32 (x16) / f16 / bf16 */
static const double ATOL_D[3] = {0.0, 6e-8, 0.0};         /* f16 subnormals (< 6.1e-5): spacing 2^-24 */
static const double ATOL_LOSS = 2e-6, RTOL_LOSS = 1e-5;

static int g_small = 0;
static cudaStream_t g_stream;

typedef struct {
    fl_dtype sdt, tdt;
    float beta, T;
    int t2;
    fl_reduction red;
    int labels;   /* 0 none, 1 int64 some ignored, 2 int32 all ignored, 3 int32 some ignored */
    int pass;     /* 0 forward, 1 fused grad NULL, 2 fused grad value, 3 fused in place */
    int64_t N, V, ld;
    int soff;     /* student (and dstudent) element offset: 1 = off the 16-byte phase */
} cfg_t;

static double row_lse(const void* x, fl_dtype dt, int64_t off, int64_t V, double T) {
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < V; j++) { double v = tu_load(x, dt, off + j) / T; if (v > m) m = v; }
    for (int64_t j = 0; j < V; j++) s += exp(tu_load(x, dt, off + j) / T - m);
    return m + log(s);
}

static int run_case(const cfg_t* c, uint64_t seed, int graph) {
    const int64_t N = c->N, V = c->V, ld = c->ld;
    const size_t es = tu_dtype_size(c->sdt), et = tu_dtype_size(c->tdt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    const int fused = c->pass != 0;
    char name[300];
    snprintf(name, sizeof name, "s=%s t=%s beta=%g T=%g t2=%d red=%d lab=%d pass=%d N=%lld V=%lld ld=%lld soff=%d",
             tu_dtype_name(c->sdt), tu_dtype_name(c->tdt), c->beta, c->T, c->t2, (int)c->red, c->labels, c->pass,
             (long long)N, (long long)V, (long long)ld, c->soff);
    if (getenv("FL_TEST_VERBOSE")) { printf("case %s\n", name); fflush(stdout); }   /* a hang shows its case */
    tu_rng r = tu_rng_seed(seed);
    const int64_t ne = N * ld + 16;
    void* hs = tu_xmalloc((size_t)ne * es);
    void* ht = tu_xmalloc((size_t)ne * et);
    int64_t* lab64 = tu_xmalloc((size_t)(N + 1) * 8);
    int32_t* lab32 = tu_xmalloc((size_t)(N + 1) * 4);
    float* hgl = tu_xmalloc((size_t)(N + 1) * 4);
    for (int64_t k = 0; k < ne; k++) {
        tu_store(hs, c->sdt, k, (float)(3 * tu_normal(&r)));
        tu_store(ht, c->tdt, k, (float)(3 * tu_normal(&r)));
    }
    for (int64_t i = 0; i < N; i++) {
        if (i % 5 == 2) {   /* a teacher sure of one class, large logits */
            const int64_t j = tu_int_in(&r, 0, V - 1);
            tu_store(ht, c->tdt, i * ld + j, 60.0f);
            tu_store(hs, c->sdt, (int64_t)c->soff + i * ld + (V - 1 - j), -60.0f);
        }
        if (i % 5 == 3) {   /* a student sure of one class (the lazy-reference statistics' rebase on the student side) */
            const int64_t j = tu_int_in(&r, 0, V - 1);
            tu_store(hs, c->sdt, (int64_t)c->soff + i * ld + j, 60.0f);
        }
        if ((i % 7 == 4 || (N < 7 && i == N - 1)) && V >= 64)   /* masked classes (header: -inf in the same columns of both), in runs of
                                      * 32 columns: whole vectors, and every thread's first vector in some rows */
            for (int64_t j = 0; j < V; j++)
                if ((j / 32) % 3 == 0) {
                    tu_store(ht, c->tdt, i * ld + j, -INFINITY);
                    tu_store(hs, c->sdt, (int64_t)c->soff + i * ld + j, -INFINITY);
                }
        lab64[i] = (i % 3 == 1) ? -100 : i;
        lab32[i] = c->labels == 2 ? -100 : (int32_t)((i % 4 == 0) ? -100 : i);
        hgl[i] = (float)tu_uniform_in(&r, -2, 2);
    }
    const void* hlab = c->labels == 0 ? NULL : c->labels == 1 ? (const void*)lab64 : (const void*)lab32;
    const fl_index_dtype lt = c->labels == 1 ? FL_INDEX_I64 : FL_INDEX_I32;
    fl_distill_options o = FL_DISTILL_OPTIONS_INIT;
    o.temperature = c->T;
    o.beta = c->beta;
    o.t2_scale = c->t2;
    o.reduction = c->red;
    size_t wsb = 0;
    CHECK_STATUS(fl_distill_workspace_size(&wsb, N, V, c->sdt, &o), FL_OK, name);
    const float gscale = 0.75f;
    const float* glh = c->pass == 2 ? hgl : NULL;

    /* CPU reference */
    void* hws = tu_xmalloc(wsb + 1);
    float* hloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* hd = tu_xmalloc((size_t)ne * es);
    tu_poison(hd, (size_t)ne * es);
    const char* hsp = (const char*)hs + (size_t)c->soff * es;
    char* hdp = (char*)hd + (size_t)c->soff * es;
    fl_status st;
    if (!fused) st = fl_distill_forward_cpu(hloss, hsp, ld, ht, ld, c->tdt, hlab, lt, N, V, c->sdt, &o, hws, wsb);
    else st = fl_distill_fused_cpu(hloss, hdp, hsp, ld, ht, ld, c->tdt, hlab, lt, glh, gscale, N, V, c->sdt, &o, hws, wsb);
    if (!CHECK_STATUS(st, FL_OK, name)) { printf("  %s\n", fl_last_error()); return 0; }

    /* GPU */
    char *ds_, *dt_, *dd_, *dws;
    float *dloss, *dgl;
    void* dlab = NULL;
    CK(cudaMalloc((void**)&ds_, (size_t)ne * es));
    CK(cudaMalloc((void**)&dt_, (size_t)ne * et));
    CK(cudaMalloc((void**)&dd_, (size_t)ne * es));
    CK(cudaMalloc((void**)&dloss, (size_t)(nl + 1) * 4));
    CK(cudaMalloc((void**)&dgl, (size_t)(N + 1) * 4));
    CK(cudaMalloc((void**)&dws, wsb + 1));
    CK(cudaMalloc(&dlab, (size_t)(N + 1) * 8));
    CK(cudaMemcpy(ds_, hs, (size_t)ne * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dt_, ht, (size_t)ne * et, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dgl, hgl, (size_t)(N + 1) * 4, cudaMemcpyHostToDevice));
    if (hlab) CK(cudaMemcpy(dlab, hlab, (size_t)(N + 1) * (lt == FL_INDEX_I64 ? 8 : 4), cudaMemcpyHostToDevice));
    CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
    CK(cudaMemset(dd_, 0xFF, (size_t)ne * es));
    CK(cudaMemset(dws, 0xFF, wsb + 1));
    CK(cudaDeviceSynchronize());
    char* gs = ds_ + (size_t)c->soff * es;
    char* gd = c->pass == 3 ? gs : dd_ + (size_t)c->soff * es;
    const void* glab = hlab ? dlab : NULL;
    const float* gl = c->pass == 2 ? dgl : NULL;
    const int before = (int)tu_failed;
#define GPU_CALL()                                                                                                 \
    (!fused ? fl_distill_forward_cuda(dloss, gs, ld, dt_, ld, c->tdt, glab, lt, N, V, c->sdt, &o, dws, wsb,        \
                                      (fl_stream)g_stream)                                                         \
            : fl_distill_fused_cuda(dloss, gd, gs, ld, dt_, ld, c->tdt, glab, lt, gl, gscale, N, V, c->sdt, &o, dws, \
                                    wsb, (fl_stream)g_stream))
    st = GPU_CALL();
    CHECK_STATUS(st, FL_OK, name);
    CK(cudaStreamSynchronize(g_stream));
    float* gloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* gdh = tu_xmalloc((size_t)ne * es);
    CK(cudaMemcpy(gloss, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gdh, c->pass == 3 ? ds_ : dd_, (size_t)ne * es, cudaMemcpyDeviceToHost));

    /* per-row scales for the tolerances, in double from the inputs */
    const double T = c->T, sc = c->t2 ? T * T : 1.0;
    double* lse_s = tu_xmalloc((size_t)(N + 1) * 8);
    double* lse_t = tu_xmalloc((size_t)(N + 1) * 8);
    for (int64_t i = 0; i < N; i++) {
        lse_s[i] = row_lse(hsp, c->sdt, i * ld, V, T);
        lse_t[i] = row_lse(ht, c->tdt, i * ld, V, T);
    }
    char nm[360];
    {
        double* a = tu_xmalloc((size_t)(nl + 1) * 8);
        double* b = tu_xmalloc((size_t)(nl + 1) * 8);
        double* sl = tu_xmalloc((size_t)(nl + 1) * 8);
        double tot = 0.0;
        int64_t Dl = c->red == FL_REDUCTION_SUM ? 1 : N;
        if (c->red == FL_REDUCTION_MEAN && hlab) {
            Dl = 0;
            for (int64_t i = 0; i < N; i++) Dl += (lt == FL_INDEX_I64 ? lab64[i] : lab32[i]) != -100;
        }
        for (int64_t i = 0; i < N; i++) tot += ATOL_LOSS * sc * (1 + fabs(lse_s[i]) + fabs(lse_t[i]));
        for (int64_t i = 0; i < nl; i++) {
            a[i] = gloss[i];
            b[i] = hloss[i];
            sl[i] = none ? ATOL_LOSS * sc * (1 + fabs(lse_s[i]) + fabs(lse_t[i])) : tot / (Dl ? (double)Dl : 1.0);
        }
        snprintf(nm, sizeof nm, "%s loss", name);
        check_close_ex(nm, a, b, sl, nl, 0.0, RTOL_LOSS);
        CHECK(tu_is_poison(gloss, 4, nl), "%s: loss guard overwritten", name);
        free(a); free(b); free(sl);
    }
    if (fused) {
        const int64_t n = N * V;
        double* a = tu_xmalloc((size_t)(n + 1) * 8);
        double* b = tu_xmalloc((size_t)(n + 1) * 8);
        double* sl = tu_xmalloc((size_t)(n + 1) * 8);
        int64_t D = N;
        if (c->red == FL_REDUCTION_MEAN && hlab) {
            D = 0;
            for (int64_t i = 0; i < N; i++) D += (lt == FL_INDEX_I64 ? lab64[i] : lab32[i]) != -100;
        }
        const char* gdp = (const char*)gdh + (size_t)c->soff * es;
        for (int64_t i = 0; i < N; i++) {
            double g = gscale * (c->pass == 2 ? hgl[none ? i : 0] : 1.0);
            if (c->red == FL_REDUCTION_MEAN || c->red == FL_REDUCTION_BATCHMEAN) g /= D ? (double)D : 1.0;
            const double G = g * sc / T;
            /* a bound of the row's loss (reverse KL's gradient carries it): the row's own, or the whole sum */
            double l = 1.0 + (none ? fabs((double)hloss[i]) : fabs((double)hloss[0]) * (double)(c->red == FL_REDUCTION_SUM ? 1 : D)) / sc;
            if (isnan(l)) l = 1.0;   /* MEAN with every row ignored: NaN loss, zero gradient */
            for (int64_t j = 0; j < V; j++) {
                const int64_t k = i * V + j;
                a[k] = tu_load(gdp, c->sdt, i * ld + j);
                b[k] = tu_load(hdp, c->sdt, i * ld + j);
                const double lq = tu_load(hsp, c->sdt, i * ld + j) / T - lse_s[i];
                const double lp = tu_load(ht, c->tdt, i * ld + j) / T - lse_t[i];
                /* + 4 |G| 2^-126 (1 + l): the staged kernel's ex2.approx.ftz flushes probabilities below
                 * 2^-126 to zero (as the CE kernels do) */
                const double dqp = isinf(lq) && isinf(lp) ? 0.0 : fabs(lq - lp);   /* masked: gradient exactly 0 */
                sl[k] = 4e-6 * fabs(G) * (exp(lq) + exp(lp)) * (1 + fabs(lse_s[i]) + fabs(lse_t[i]) + dqp + l)
                        + 4.0 * fabs(G) * 0x1p-126 * (1.0 + l);
            }
        }
        snprintf(nm, sizeof nm, "%s dstudent", name);
        check_close_ex(nm, a, b, sl, n, ATOL_D[c->sdt], RTOL_D[c->sdt]);
        /* padding columns: dstudent's stay poisoned; an in-place student's keep their values */
        int bad = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = V; j < ld; j++) {
                const int64_t k = (int64_t)c->soff + i * ld + j;
                if (c->pass == 3) bad += tu_bits(gdh, c->sdt, k) != tu_bits(hs, c->sdt, k);
                else bad += !tu_is_poison(gdh, es, k);
            }
        CHECK(bad == 0, "%s: %d padding elements written", name, bad);
        free(a); free(b); free(sl);
    }
    /* determinism and graph replay (not in place: the inputs must survive) */
    if (graph && c->pass != 3) {
        float* l2 = tu_xmalloc((size_t)(nl + 1) * 4);
        void* d2 = tu_xmalloc((size_t)ne * es);
        CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
        CK(cudaMemset(dd_, 0xFF, (size_t)ne * es));
        st = GPU_CALL();
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(l2, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(d2, dd_, (size_t)ne * es, cudaMemcpyDeviceToHost));
        snprintf(nm, sizeof nm, "%s rerun bitwise", name);
        check_bitwise(nm, l2, gloss, (size_t)nl * 4);
        if (fused) check_bitwise(nm, d2, gdh, (size_t)ne * es);
        CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
        CK(cudaMemset(dd_, 0xFF, (size_t)ne * es));
        CK(cudaDeviceSynchronize());
        cudaGraph_t gr;
        cudaGraphExec_t ex;
        CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
        st = GPU_CALL();
        CK(cudaStreamEndCapture(g_stream, &gr));
        CHECK_STATUS(st, FL_OK, "captured call");
        CK(cudaGraphInstantiate(&ex, gr, 0));
        for (int rep = 0; rep < 3; rep++) CK(cudaGraphLaunch(ex, g_stream));
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(l2, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(d2, dd_, (size_t)ne * es, cudaMemcpyDeviceToHost));
        snprintf(nm, sizeof nm, "%s graph replay == eager", name);
        check_bitwise(nm, l2, gloss, (size_t)nl * 4);
        if (fused) check_bitwise(nm, d2, gdh, (size_t)ne * es);
        CK(cudaGraphExecDestroy(ex));
        CK(cudaGraphDestroy(gr));
        free(l2);
        free(d2);
    }
#undef GPU_CALL
    CK(cudaFree(ds_)); CK(cudaFree(dt_)); CK(cudaFree(dd_)); CK(cudaFree(dloss)); CK(cudaFree(dgl));
    CK(cudaFree(dws)); CK(cudaFree(dlab));
    free(hs); free(ht); free(lab64); free(lab32); free(hgl); free(hws); free(hloss); free(hd); free(gloss);
    free(gdh); free(lse_s); free(lse_t);
    return (int)tu_failed == before;
}

static void test_misc(void) {
    fl_distill_options o = FL_DISTILL_OPTIONS_INIT;
    size_t wsb = 0;
    fl_distill_workspace_size(&wsb, 4, 10, FL_DTYPE_BF16, &o);
    void *s, *t, *d, *ws;
    float* l;
    CK(cudaMalloc(&s, 256)); CK(cudaMalloc(&t, 256)); CK(cudaMalloc(&d, 256)); CK(cudaMalloc(&ws, wsb + 256));
    CK(cudaMalloc((void**)&l, 64));
    /* a teacher dtype the CUDA backend does not build (f16 teacher for a bf16 student) */
    fl_status st = fl_distill_forward_cuda(l, s, 10, t, 10, FL_DTYPE_F16, NULL, FL_INDEX_I64, 4, 10, FL_DTYPE_BF16, &o,
                                           ws, wsb, (fl_stream)g_stream);
    CHECK(st == FL_ERR_UNSUPPORTED && strstr(fl_last_error(), "fl_distill_forward_cuda"),
          "f16 teacher for bf16 student: status %d (%s)", (int)st, fl_last_error());
    /* misaligned student */
    st = fl_distill_fused_cuda(l, d, (char*)s + 1, 10, t, 10, FL_DTYPE_BF16, NULL, FL_INDEX_I64, NULL, 1.0f, 4, 10,
                               FL_DTYPE_BF16, &o, ws, wsb, (fl_stream)g_stream);
    CHECK(st == FL_ERR_INVALID_ARGUMENT, "misaligned student: status %d (%s)", (int)st, fl_last_error());
    /* N = 0: SUM 0, MEAN / BATCHMEAN NaN */
    const fl_reduction reds[3] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_BATCHMEAN};
    for (int k = 0; k < 3; k++) {
        o.reduction = reds[k];
        float h = 1.0f;
        CK(cudaMemset(l, 0xFF, 4));
        st = fl_distill_fused_cuda(l, d, s, 10, t, 10, FL_DTYPE_BF16, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 10,
                                   FL_DTYPE_BF16, &o, ws, wsb, (fl_stream)g_stream);
        CHECK_STATUS(st, FL_OK, "N = 0");
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(&h, l, 4, cudaMemcpyDeviceToHost));
        CHECK(k == 0 ? h == 0.0f : isnan(h), "N = 0 reduction %d: loss %g", (int)reds[k], h);
    }
    CK(cudaFree(s)); CK(cudaFree(t)); CK(cudaFree(d)); CK(cudaFree(ws)); CK(cudaFree(l));
}

int main(int argc, char** argv) {
    /* --kl: forward / reverse KL only (no JSD); --min-v V: shapes with V >= V only. For targeted runs
     * of a KL kernel path (e.g. FUSEDLOSS_DISTILL_PIPE=1 ... --kl --min-v 8192: every shape that path
     * takes, without the JSD's and the short rows' cases) */
    int kl_only = 0;
    int64_t min_v = 0;
    {
        char* rest[8];
        int nrest = 0;
        for (int a = 0; a < argc; a++) {
            if (a > 0 && !strcmp(argv[a], "--kl")) kl_only = 1;
            else if (a > 0 && !strcmp(argv[a], "--min-v") && a + 1 < argc) min_v = atoll(argv[++a]);
            else if (nrest < 8) rest[nrest++] = argv[a];
        }
        const int rc = zt_cuda_test_start(nrest, rest, "test_distill_cuda", &g_small);
        if (rc >= 0) {
            if (rc == 2) printf("       (also --kl: forward / reverse KL only; --min-v V: shapes with V >= V)\n");
            return rc;
        }
    }
    CK(cudaStreamCreate(&g_stream));
    tu_quiet = 1;
    const fl_dtype pairs[5][2] = {{FL_DTYPE_F32, FL_DTYPE_F32}, {FL_DTYPE_F16, FL_DTYPE_F16},
                                  {FL_DTYPE_BF16, FL_DTYPE_BF16}, {FL_DTYPE_BF16, FL_DTYPE_F32},
                                  {FL_DTYPE_F16, FL_DTYPE_F32}};
    const float betas[4] = {0.0f, 1.0f, 0.5f, 0.2f};
    const fl_reduction reds[4] = {FL_REDUCTION_NONE, FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_BATCHMEAN};
    /* N, V, ld */
    const int64_t shapes[][3] = {{1, 1, 1},     {7, 3, 5},        {33, 8192, 8192}, {17, 8193, 8200},
                                 {5, 50257, 50257}, {64, 20000, 20011}, {300, 1000, 1000}, {129, 8003, 8003},
                                 {3, 128256, 128256}, {40, 128256, 128256},
                                 /* the staged kernel (sm_90, aligned rows of >= 1024 vectors): clusters of
                                  * 2-8 CTAs, a tail past the last vector; both within --small */
                                 {2, 65541, 65544}, {4, 32768, 32768}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    uint64_t seed = 7;
    long cases = 0, bad = 0;
    for (int pi = 0; pi < 5; pi++)
        for (int bi = 0; bi < (kl_only ? 2 : 4); bi++)
            for (int si = 0; si < nshapes; si++)
                for (int v = 0; v < 6; v++) {
                    if (shapes[si][1] < min_v) continue;
                    cfg_t c;
                    memset(&c, 0, sizeof c);
                    c.sdt = pairs[pi][0];
                    c.tdt = pairs[pi][1];
                    c.beta = betas[bi];
                    c.N = shapes[si][0];
                    c.V = shapes[si][1];
                    c.ld = shapes[si][2];
                    if (g_small && c.N * c.ld > (1 << 18)) continue;
                    /* the variants cycle through the options so that every combination class is hit */
                    c.T = (v & 1) ? 2.0f : 1.0f;
                    c.t2 = (v % 3) == 1;
                    c.red = reds[(v + si + bi) % 4];
                    c.labels = (v + pi) % 4;
                    c.pass = v % 4;
                    c.soff = (v == 5 && c.sdt != FL_DTYPE_F32) ? 1 : 0;
                    if (c.soff && c.pass == 3) c.pass = 1;
                    cases++;
                    if (!run_case(&c, seed++, v == 2 && si == 3)) bad++;
                }
    printf("grid: %ld cases, %ld failed\n", cases, bad);
    test_misc();
    return tu_finish();
}
