/* test_elementwise_loss_cuda.c — the CUDA elementwise losses (sigmoid focal, BCE with logits;
 * include/fusedloss.h section 9) against the CPU backend (the specification).
 * SPDX-License-Identifier: MIT
 *
 * Grid: both ops x every dtype x reduction x pass (forward / backward / fused) x options (focal
 * alpha on/off, gamma 0 / 0.5 / 2 / 1.5; bce weight / pos_weight) x sizes (1, 7, 8, 9, 4095,
 * 4097, 100003, 1 << 20 + 3; C = 1, 5, 64) x base offsets (0: vector path with head/tail; an
 * element offset that puts targets out of phase with logits: the scalar path; in place).
 * Every output is poisoned (0xFF: NaN in every dtype) before each call, with a poisoned guard
 * element after it that must survive. Extra sections: determinism (two runs bitwise equal), CUDA
 * graph capture + replay bitwise equal to eager, n = 0, and (without --small) n = 2^31 + 9
 * bf16 elements (64-bit indexing; the SUM against the CPU, dx sampled).
 *
 * Build: make (tests/NAME_cuda.c is a GPU test) -> build/test_elementwise_loss_cuda
 * Run:   build/test_elementwise_loss_cuda [--small]   (--small: n <= 2^17, for compute-sanitizer)
 * Prints one line per failing check, then "overall okay: 0|1" and "N passed, M failed"; exit 0
 * iff none failed. Without a CUDA device: "SKIP: no CUDA device", exit 0.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"

/* |gpu - cpu| <= atol + rtol*|cpu|: the same fp32 formulas; libdevice vs C library expf / powf
 * (<= 2 ulp each), MUFU.RCP + Newton vs IEEE division (<= 1 ulp) and nvcc's fma contraction
 * move results by a few fp32 ulps; 16-bit dx
 * may land on the neighbouring value (1 ulp of the dtype). Sums: both in double, different
 * order, rounded once to fp32: a few ulps. */
static const double ATOL[3] = {1e-30, 6e-8, 1e-30};
static const double RTOL[3] = {4e-6, 9.8e-4, 7.9e-3};
static const double RTOL_LOSS = 4e-6;
/* fp16 / bf16 logits use the fast forms by default (elementwise_math.h; FUSEDLOSS_EW_EXACT16=1:
 * the exact ones, tested with RTOL_LOSS): e = exp(-|x|) within |x| 2^-24 + 2^-22.5 relative, the
 * focal loss ~ sp q^2 three times that (|x| <= 29 where it is a normal fp32), the log1p series
 * 1.5e-6: 3e-5 covers a loss element; the gradient's cancellation slack grows by e's error. */
static const double RTOL_LOSS_FAST16 = 3e-5;
static int g_fast16 = 1;

#include "cuda_check.h"

static int g_small = 0;
static cudaStream_t g_stream;

typedef struct {
    int bce;
    float alpha, gamma;
    int use_w, use_pw;
    int64_t N, C;
    fl_dtype dt;
    fl_reduction red;
    int pass;     /* 0 forward, 1 backward, 2 fused */
    int yoff;     /* element offset of targets (1: out of phase: scalar path) */
    int inplace;
    int with_gl;
} cfg_t;

static fl_status call_cpu(const cfg_t* c, float* loss, void* dx, const void* x, const void* y, const float* w,
                          const float* pw, const float* gl, void* ws, size_t wsb) {
    const float* wp = c->use_w ? w : NULL;
    const float* pwp = c->use_pw ? pw : NULL;
    const float* glp = c->with_gl ? gl : NULL;
    if (!c->bce) {
        if (c->pass == 0) return fl_sigmoid_focal_forward_cpu(loss, x, y, c->N, c->dt, c->alpha, c->gamma, c->red, ws, wsb);
        if (c->pass == 1) return fl_sigmoid_focal_backward_cpu(dx, x, y, glp, 0.5f, c->N, c->dt, c->alpha, c->gamma, c->red);
        return fl_sigmoid_focal_fused_cpu(loss, dx, x, y, glp, 0.5f, c->N, c->dt, c->alpha, c->gamma, c->red, ws, wsb);
    }
    if (c->pass == 0) return fl_bce_with_logits_forward_cpu(loss, x, y, wp, pwp, c->N, c->C, c->dt, c->red, ws, wsb);
    if (c->pass == 1) return fl_bce_with_logits_backward_cpu(dx, x, y, wp, pwp, glp, 0.5f, c->N, c->C, c->dt, c->red);
    return fl_bce_with_logits_fused_cpu(loss, dx, x, y, wp, pwp, glp, 0.5f, c->N, c->C, c->dt, c->red, ws, wsb);
}

static fl_status call_gpu(const cfg_t* c, float* loss, void* dx, const void* x, const void* y, const float* w,
                          const float* pw, const float* gl, void* ws, size_t wsb) {
    const float* wp = c->use_w ? w : NULL;
    const float* pwp = c->use_pw ? pw : NULL;
    const float* glp = c->with_gl ? gl : NULL;
    fl_stream s = (fl_stream)g_stream;
    if (!c->bce) {
        if (c->pass == 0) return fl_sigmoid_focal_forward_cuda(loss, x, y, c->N, c->dt, c->alpha, c->gamma, c->red, ws, wsb, s);
        if (c->pass == 1) return fl_sigmoid_focal_backward_cuda(dx, x, y, glp, 0.5f, c->N, c->dt, c->alpha, c->gamma, c->red, s);
        return fl_sigmoid_focal_fused_cuda(loss, dx, x, y, glp, 0.5f, c->N, c->dt, c->alpha, c->gamma, c->red, ws, wsb, s);
    }
    if (c->pass == 0) return fl_bce_with_logits_forward_cuda(loss, x, y, wp, pwp, c->N, c->C, c->dt, c->red, ws, wsb, s);
    if (c->pass == 1) return fl_bce_with_logits_backward_cuda(dx, x, y, wp, pwp, glp, 0.5f, c->N, c->C, c->dt, c->red, s);
    return fl_bce_with_logits_fused_cuda(loss, dx, x, y, wp, pwp, glp, 0.5f, c->N, c->C, c->dt, c->red, ws, wsb, s);
}

/* Runs one case on both backends; returns 1 if all matched. graph: also capture + replay. */
static int run_case(const cfg_t* c, uint64_t seed, int graph) {
    const int64_t n = c->N * c->C;
    const size_t es = tu_dtype_size(c->dt);
    const int none = c->red == FL_REDUCTION_NONE;
    const int fast = g_fast16 && c->dt != FL_DTYPE_F32;
    const int64_t nl = none ? n : 1;
    const int want_loss = c->pass != 1, want_grad = c->pass != 0;
    char name[256];
    snprintf(name, sizeof name, "%s a=%g g=%g w=%d pw=%d N=%lld C=%lld %s red=%d pass=%d yoff=%d inpl=%d gl=%d",
             c->bce ? "bce" : "focal", c->alpha, c->gamma, c->use_w, c->use_pw, (long long)c->N, (long long)c->C,
             tu_dtype_name(c->dt), (int)c->red, c->pass, c->yoff, c->inplace, c->with_gl);
    tu_rng r = tu_rng_seed(seed);
    const int64_t pad = 16;   /* elements of slack for the offsets and the guard */
    void* hx = tu_xmalloc((size_t)(n + pad) * es);
    void* hy = tu_xmalloc((size_t)(n + pad) * es);
    float* hw = tu_xmalloc((size_t)c->C * 4);
    float* hpw = tu_xmalloc((size_t)c->C * 4);
    float* hgl = tu_xmalloc((size_t)(nl + 1) * 4);
    for (int64_t k = 0; k < n + pad; k++) {
        tu_store(hx, c->dt, k, (float)(4 * tu_normal(&r)));
        tu_store(hy, c->dt, k, (k & 1) ? (float)tu_uniform(&r) : (float)(tu_uniform(&r) < 0.3));
    }
    for (int64_t j = 0; j < c->C; j++) { hw[j] = (float)tu_uniform_in(&r, 0.1, 2); hpw[j] = (float)tu_uniform_in(&r, 0.2, 4); }
    for (int64_t k = 0; k < nl; k++) hgl[k] = (float)tu_uniform_in(&r, -2, 2);
    size_t wsb = 0;
    if (c->bce) fl_bce_with_logits_workspace_size(&wsb, c->N, c->C);
    else fl_sigmoid_focal_workspace_size(&wsb, n);
    void* hws = tu_xmalloc(wsb);
    float* hloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* hdx = tu_xmalloc((size_t)(n + 1) * es);
    /* CPU reference (x at offset 0, y at yoff: the same values the GPU sees) */
    const char* hyp = (const char*)hy + (size_t)c->yoff * es;
    CHECK_STATUS(call_cpu(c, hloss, hdx, hx, hyp, hw, hpw, hgl, hws, wsb), FL_OK, name);

    char *dx_, *dy_, *ddx, *dws;
    float *dloss, *dw, *dpw, *dgl;
    CK(cudaMalloc((void**)&dx_, (size_t)(n + pad) * es));
    CK(cudaMalloc((void**)&dy_, (size_t)(n + pad) * es));
    CK(cudaMalloc((void**)&ddx, (size_t)(n + pad) * es));
    CK(cudaMalloc((void**)&dloss, (size_t)(nl + 1) * 4));
    CK(cudaMalloc((void**)&dw, (size_t)c->C * 4));
    CK(cudaMalloc((void**)&dpw, (size_t)c->C * 4));
    CK(cudaMalloc((void**)&dgl, (size_t)(nl + 1) * 4));
    CK(cudaMalloc((void**)&dws, wsb));
    CK(cudaMemcpy(dx_, hx, (size_t)(n + pad) * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy_, hy, (size_t)(n + pad) * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dw, hw, (size_t)c->C * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpw, hpw, (size_t)c->C * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dgl, hgl, (size_t)nl * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
    CK(cudaMemset(ddx, 0xFF, (size_t)(n + pad) * es));
    void* gdx = c->inplace ? (void*)dx_ : (void*)ddx;
    const int before = (int)tu_failed;
    fl_status st = call_gpu(c, want_loss ? dloss : NULL, want_grad ? gdx : NULL, dx_, dy_ + (size_t)c->yoff * es, dw,
                            dpw, dgl, dws, wsb);
    CHECK_STATUS(st, FL_OK, name);
    CK(cudaStreamSynchronize(g_stream));
    float* gloss = tu_xmalloc((size_t)(nl + 1) * 4);
    void* gdxh = tu_xmalloc((size_t)(n + 1) * es);
    CK(cudaMemcpy(gloss, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gdxh, gdx, (size_t)(n + 1) * es, cudaMemcpyDeviceToHost));
    double* a = tu_xmalloc((size_t)(n + 1) * 8);
    double* b = tu_xmalloc((size_t)(n + 1) * 8);
    char nm[300];
    if (want_loss) {
        for (int64_t k = 0; k < nl; k++) { a[k] = gloss[k]; b[k] = hloss[k]; }
        snprintf(nm, sizeof nm, "%s loss", name);
        check_close(nm, a, b, nl, 1e-30, fast ? RTOL_LOSS_FAST16 : RTOL_LOSS);
        CHECK(tu_is_poison(gloss, 4, nl), "%s: loss guard overwritten", name);
    }
    if (want_grad) {
        /* slack for the cancellation of p (1 - y) - (1 - p) y (soft y; BCE's pos_weight term): both
         * backends are fp32 evaluations of it, each within ~2 ulps of the sum of the terms' magnitudes
         * (the bound tests/test_elementwise_loss.c checks the CPU against), so they may differ by
         * twice that, scaled by the upstream gradient; relative to the result that is unbounded. */
        double* sl = tu_xmalloc((size_t)(n + 1) * 8);
        memset(sl, 0, (size_t)(n + 1) * 8);
        const double g0 = 0.5 * (c->with_gl ? hgl[0] : 1.0) / (c->red == FL_REDUCTION_MEAN && n ? (double)n : 1.0);
        for (int64_t k = 0; k < n; k++) {
            a[k] = tu_load(gdxh, c->dt, k);
            b[k] = tu_load(hdx, c->dt, k);
            const double xv = tu_load(hx, c->dt, k), yv = tu_load(hyp, c->dt, k);
            const double g = none ? 0.5 * (c->with_gl ? hgl[k] : 1.0) : g0;
            double fac;
            if (c->bce) {
                const int64_t j = k % c->C;
                fac = (c->use_w ? fabs(hw[j]) : 1.0) * (1.0 + (c->use_pw ? hpw[j] : 1.0));
            } else {
                const double p = 1.0 / (1.0 + exp(-xv)), q = p * (1 - yv) + (1 - p) * yv;
                const double al = c->alpha >= 0 ? fabs(c->alpha * yv + (1 - c->alpha) * (1 - yv)) : 1.0;
                fac = al * (c->gamma == 0 ? 1.0 : pow(q, c->gamma)) * (1.0 + c->gamma);
            }
            /* 4 fp32 ulps of the terms; fast: + e's relative error, twice (p and 1 - p) */
            sl[k] = (4.8e-7 + (fast ? 2 * (6e-8 * fabs(xv) + 2e-7) : 0.0)) * fabs(g) * fac;
        }
        snprintf(nm, sizeof nm, "%s dx", name);
        const int dx_ok = check_close_ex(nm, a, b, sl, n, ATOL[c->dt], RTOL[c->dt]);
        free(sl);
        if (!dx_ok) {
            /* the inputs of the first mismatches, to reproduce them on the CPU */
            int shown = 0;
            for (int64_t k = 0; k < n && shown < 3; k++) {
                if (fabs(a[k] - b[k]) <= ATOL[c->dt] + RTOL[c->dt] * fabs(b[k]) || (isnan(a[k]) && isnan(b[k])))
                    continue;
                const int64_t j = k % c->C;
                printf("  input of dx[%lld]: x %.9g y %.9g w %.9g pw %.9g -> gpu %.9g cpu %.9g\n", (long long)k,
                       (double)tu_load(hx, c->dt, k), (double)tu_load(hyp, c->dt, k), (double)hw[j], (double)hpw[j],
                       a[k], b[k]);
                shown++;
            }
        }
        if (!c->inplace) CHECK(tu_is_poison(gdxh, es, n), "%s: dx guard overwritten", name);
    }
    /* determinism and graph replay (not in place: the inputs must survive) */
    if (graph && !c->inplace) {
        float* l2 = tu_xmalloc((size_t)(nl + 1) * 4);
        void* d2 = tu_xmalloc((size_t)(n + 1) * es);
        CK(cudaMemset(dloss, 0xFF, (size_t)(nl + 1) * 4));
        CK(cudaMemset(ddx, 0xFF, (size_t)(n + pad) * es));
        cudaGraph_t gr;
        cudaGraphExec_t ex;
        CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
        st = call_gpu(c, want_loss ? dloss : NULL, want_grad ? ddx : NULL, dx_, dy_ + (size_t)c->yoff * es, dw, dpw,
                      dgl, dws, wsb);
        CK(cudaStreamEndCapture(g_stream, &gr));
        CHECK_STATUS(st, FL_OK, "captured call");
        CK(cudaGraphInstantiate(&ex, gr, 0));
        for (int rep = 0; rep < 3; rep++) CK(cudaGraphLaunch(ex, g_stream));
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(l2, dloss, (size_t)(nl + 1) * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(d2, ddx, (size_t)(n + 1) * es, cudaMemcpyDeviceToHost));
        snprintf(nm, sizeof nm, "%s graph replay == eager", name);
        if (want_loss) check_bitwise(nm, l2, gloss, (size_t)nl * 4);
        if (want_grad) check_bitwise(nm, d2, gdxh, (size_t)n * es);
        CK(cudaGraphExecDestroy(ex));
        CK(cudaGraphDestroy(gr));
        free(l2);
        free(d2);
    }
    CK(cudaFree(dx_)); CK(cudaFree(dy_)); CK(cudaFree(ddx)); CK(cudaFree(dloss)); CK(cudaFree(dw));
    CK(cudaFree(dpw)); CK(cudaFree(dgl)); CK(cudaFree(dws));
    free(hx); free(hy); free(hw); free(hpw); free(hgl); free(hws); free(hloss); free(hdx); free(gloss); free(gdxh);
    free(a); free(b);
    return (int)tu_failed == before;
}

/* n = 2^31 + 9 bf16 elements: 64-bit offsets. SUM vs the CPU; dx at sampled positions. */
static void test_big(void) {
    const int64_t n = ((int64_t)1 << 31) + 9;
    const size_t bytes = (size_t)n * 2;
    size_t freeb, totalb;
    CK(cudaMemGetInfo(&freeb, &totalb));
    if (freeb < 3 * bytes + ((size_t)1 << 30)) { printf("big case skipped: %zu bytes free\n", freeb); return; }
    uint16_t* hx = tu_xmalloc(bytes);
    uint16_t* hy = tu_xmalloc(bytes);
    uint16_t* hdx = tu_xmalloc(bytes);
    for (int64_t k = 0; k < n; k++) {
        uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ull;
        hx[k] = tu_f32_to_bf16((float)((double)(h >> 40) / (1 << 24) * 8.0 - 4.0));
        hy[k] = tu_f32_to_bf16((float)((h >> 20) & 1));
    }
    size_t wsb;
    fl_sigmoid_focal_workspace_size(&wsb, n);
    void* hws = tu_xmalloc(wsb);
    float lc, lg;
    CHECK_STATUS(fl_sigmoid_focal_fused_cpu(&lc, hdx, hx, hy, NULL, 1.0f, n, FL_DTYPE_BF16, 0.25f, 2.0f, FL_REDUCTION_SUM, hws, wsb), FL_OK, "big cpu");
    void *dx_, *dy_, *ddx, *dws;
    float* dl;
    CK(cudaMalloc(&dx_, bytes)); CK(cudaMalloc(&dy_, bytes)); CK(cudaMalloc(&ddx, bytes)); CK(cudaMalloc(&dws, wsb));
    CK(cudaMalloc((void**)&dl, 4));
    CK(cudaMemcpy(dx_, hx, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy_, hy, bytes, cudaMemcpyHostToDevice));
    CHECK_STATUS(fl_sigmoid_focal_fused_cuda(dl, ddx, dx_, dy_, NULL, 1.0f, n, FL_DTYPE_BF16, 0.25f, 2.0f, FL_REDUCTION_SUM, dws, wsb, (fl_stream)g_stream), FL_OK, "big cuda");
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(&lg, dl, 4, cudaMemcpyDeviceToHost));
    double a = lg, b = lc;
    check_close("n = 2^31 + 9 bf16 focal SUM", &a, &b, 1, 0, 1e-5);
    int bad = 0;
    for (int s = 0; s < 4096; s++) {
        int64_t k = s < 16 ? n - 1 - s : (int64_t)(((uint64_t)s * 0x9E3779B97F4A7C15ull) % (uint64_t)n);
        uint16_t g;
        CK(cudaMemcpy(&g, (char*)ddx + 2 * k, 2, cudaMemcpyDeviceToHost));
        double d = fabs((double)tu_bf16_to_f32(g) - tu_bf16_to_f32(hdx[k]));
        if (d > 1e-30 + 7.9e-3 * fabs(tu_bf16_to_f32(hdx[k]))) bad++;
    }
    CHECK(bad == 0, "n = 2^31 + 9: %d of 4096 sampled dx differ", bad);
    CK(cudaFree(dx_)); CK(cudaFree(dy_)); CK(cudaFree(ddx)); CK(cudaFree(dws)); CK(cudaFree(dl));
    free(hx); free(hy); free(hdx); free(hws);
}

int main(int argc, char** argv) {
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--small")) g_small = 1;
        else { printf("usage: test_elementwise_loss_cuda [--small]\n"); return 2; }
    }
    if (!fl_cuda_built()) { printf("SKIP: this build of fusedloss has no CUDA backend\n"); return 0; }
    {
        const char* ev = getenv("FUSEDLOSS_EW_EXACT16");
        g_fast16 = !(ev && !strcmp(ev, "1"));
        printf("16-bit logits: %s forms (FUSEDLOSS_EW_EXACT16=%s)\n", g_fast16 ? "fast" : "exact", ev ? ev : "unset");
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    CK(cudaStreamCreate(&g_stream));
    tu_quiet = 1;
    const fl_dtype dts[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    const fl_reduction reds[3] = {FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM};
    const int64_t ns[8] = {1, 7, 8, 9, 4095, 4097, 100003, (1 << 20) + 3};
    const float fa[4][2] = {{0.25f, 2.0f}, {-1.0f, 2.0f}, {0.25f, 0.0f}, {0.3f, 0.5f}};
    uint64_t seed = 11;
    long cases = 0, bad = 0;
    for (int op = 0; op < 2; op++)
        for (int d = 0; d < 3; d++)
            for (int rr = 0; rr < 3; rr++)
                for (int ps = 0; ps < 3; ps++)
                    for (int o = 0; o < 4; o++)
                        for (int ni = 0; ni < 8; ni++)
                            for (int variant = 0; variant < 3; variant++) {
                                if (g_small && ns[ni] > (1 << 17)) continue;
                                if (variant == 2 && ps == 0) continue;   /* in place needs dlogits */
                                cfg_t c = {op, fa[o][0], fa[o][1], o & 1, (o >> 1) & 1, ns[ni], 1, dts[d], reds[rr], ps,
                                           variant == 1, variant == 2, (int)(seed & 1)};
                                if (op == 1) {   /* bce: [N, C] */
                                    const int64_t Cs[3] = {1, 5, 64};
                                    c.C = Cs[ni % 3];
                                    c.N = (ns[ni] + c.C - 1) / c.C;
                                }
                                cases++;
                                if (!run_case(&c, seed++, ni == 5 && variant == 0)) bad++;
                            }
    printf("grid: %ld cases, %ld failed\n", cases, bad);
    /* n = 0 */
    {
        float* dl;
        CK(cudaMalloc((void**)&dl, 4));
        void* dws;
        size_t wsb;
        fl_sigmoid_focal_workspace_size(&wsb, 0);
        CK(cudaMalloc(&dws, wsb));
        float h;
        CHECK_STATUS(fl_sigmoid_focal_forward_cuda(dl, NULL, NULL, 0, FL_DTYPE_F32, 0.25f, 2.0f, FL_REDUCTION_MEAN, dws, wsb, (fl_stream)g_stream), FL_OK, "n=0 mean");
        CK(cudaMemcpy(&h, dl, 4, cudaMemcpyDeviceToHost));
        CHECK(isnan(h), "n = 0 MEAN = %g, want NaN", h);
        CHECK_STATUS(fl_bce_with_logits_forward_cuda(dl, NULL, NULL, NULL, NULL, 0, 3, FL_DTYPE_BF16, FL_REDUCTION_SUM, dws, wsb, (fl_stream)g_stream), FL_OK, "n=0 sum");
        CK(cudaMemcpy(&h, dl, 4, cudaMemcpyDeviceToHost));
        CHECK(h == 0.0f, "n = 0 SUM = %g, want 0", h);
        CHECK_STATUS(fl_sigmoid_focal_backward_cuda(NULL, NULL, NULL, NULL, 1.0f, 0, FL_DTYPE_F16, 0.25f, 2.0f, FL_REDUCTION_NONE, (fl_stream)g_stream), FL_OK, "n=0 bwd");
        CHECK_STATUS(fl_sigmoid_focal_forward_cuda(dl, NULL, NULL, 0, FL_DTYPE_F32, 0.25f, 2.0f, FL_REDUCTION_MEAN, (char*)dws + 8, wsb, (fl_stream)g_stream), FL_ERR_INVALID_ARGUMENT, "misaligned workspace");
        CK(cudaFree(dl));
        CK(cudaFree(dws));
    }
    if (!g_small) test_big();
    CK(cudaStreamDestroy(g_stream));
    return tu_finish();
}
