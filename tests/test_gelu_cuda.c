/* test_gelu_cuda.c — the CUDA GeLU backend against the CPU backend (the specification).
 * SPDX-License-Identifier: MIT
 *
 * Every case runs fl_gelu_forward_cuda / fl_gelu_backward_cuda (with dbias when there is a bias)
 * on the same random inputs as fl_gelu_*_cpu and compares every element of y, dx and dbias
 * (full problems also at N = 8192 x F = 3072 / 16384: the CPU backend is OpenMP-parallel).
 * The grid covers each of the kernels' three layouts: ROWS (16-byte aligned rows), FLAT (odd F,
 * contiguous: G real rows per virtual row, dbias by the second kernel), SCALAR (misaligned base
 * pointers, unaligned strides), plus > 1024 column slabs (second-kernel dbias on ROWS), in
 * place (y == x, dx == dy), separate strides with padding, every dtype, both approximations, no
 * bias / bias of the dtype / fp32 bias.
 * Every output is poisoned (0xFF: NaN in every dtype) before each call and has a poisoned guard
 * tail that must survive; padding columns (ld > F) must stay poisoned; the inputs' padding is NaN
 * (never read). One workspace is zeroed once and reused by every case: after each case its 4096
 * counter bytes must be zero again (the header's contract).
 * Extra sections: determinism (two runs bitwise equal), CUDA graph capture + replay == eager
 * bitwise, N = 0.
 *
 * Build: make (every tests/NAME_cuda.c is a GPU test) -> build/test_gelu_cuda
 * Run:   build/test_gelu_cuda [--small] [--stride K] [--filter SUBSTR] [--seed S] [-v]
 *   --small     shapes with N*F <= 2^17 only, no N = 8192 (for compute-sanitizer)
 *   --stride K  every K-th case of the grid
 *   --exact16   set FUSEDLOSS_GELU_EXACT16=1 before the first call: the exact fp16/bf16 path
 *               (the default)
 *   --fast16    set FUSEDLOSS_GELU_EXACT16=0: the fast fp16/bf16 formulas (the library's default)
 * 16-bit outputs pass when within the tolerance below OR within 1 ulp of the dtype of the CPU's
 * (bit patterns): the fast path (default) is within 1 ulp of the exact GeLU, the CPU's fp32
 * PyTorch formulas are within the slack terms of it (their own cancellation in 1 + tanh / erf).
 * Prints one line per case, then "overall okay: 0|1" and "N passed, M failed"; exit 0 iff none
 * failed. Without a CUDA device: "SKIP: no CUDA device", exit 0.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusedloss.h"
#include "test_util.h"

/* ------------------------------------------------------------------------------------------
 * Tolerances, |gpu - cpu| <= atol + rtol*|cpu| + slack. Both backends do the same fp32
 * operations in the same order; only tanhf / erff / expf differ in their last bits (libdevice vs
 * the C library, <= 2 ulp each). That moves t by a few ulp, which the formula amplifies where it
 * cancels (1 + t, 1 - t^2): the slack terms of tests/test_gelu.c (a few fp32 ulps of t times the
 * sensitivity). rtol/atol: 1 ulp of the output dtype (a rounding boundary between the two fp32
 * values may send them to neighbouring values), fp32: 1e-6.
 * dbias: the GPU sums fp32 (per-thread row sums, then fixed-order trees), the CPU sums double:
 *   + DB_SUM_RTOL * sum_i |dx_i| (about (rows per thread + row blocks) * 2^-24), plus the slack
 *   of every row, plus 1 ulp of the bias dtype.
 * ---------------------------------------------------------------------------------------- */
static const double ATOL[3] = {1e-37, 6e-8, 1e-37};   /* f32, f16, bf16 */
static const double RTOL[3] = {1e-6, 9.8e-4, 7.9e-3};
#define SLACK_Y 3e-7
#define SLACK_DX 4e-7
#define DB_SUM_RTOL 2e-5

/* fp16 / bf16 fast path (the default; --exact16 selects the exact one): also accepted when the
 * result is within 1 ulp of the CPU's, counted on the bit patterns (ordered: -0 == +0). */
static int g_exact16;
static int64_t ord16(uint16_t b) { return (b & 0x8000u) ? -(int64_t)(b & 0x7fffu) : (int64_t)b; }
/* the library's 16-bit path for this process: fast unless FUSEDLOSS_GELU_EXACT16=1 */
static int fast16_on(void) {
    const char* e = getenv("FUSEDLOSS_GELU_EXACT16");
    return !(e && !strcmp(e, "1"));
}

static int g_small, g_stride = 1, g_verbose, g_index;
static const char* g_filter;
static uint64_t g_seed = 0x6e1u;
static cudaStream_t g_stream;
static void* g_ws;          /* shared workspace, zeroed once */
static size_t g_ws_bytes;

#define CK(expr)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int dti(fl_dtype dt) { return dt == FL_DTYPE_F32 ? 0 : dt == FL_DTYPE_F16 ? 1 : 2; }
static const char* ap_name(fl_gelu_approx a) { return a == FL_GELU_TANH ? "tanh" : "erf"; }
static double slack_y(double u) { return SLACK_Y * fabs(u); }
static double slack_dx(double u, double dy) { return SLACK_DX * fabs(dy) * (1.0 + fabs(u) * (1.0 + 0.15 * u * u)); }

static void ensure_ws(size_t need) {
    if (need <= g_ws_bytes) return;
    if (g_ws) CK(cudaFree(g_ws));
    CK(cudaMalloc(&g_ws, need));
    CK(cudaMemset(g_ws, 0xFF, need));   /* scratch part: any content */
    CK(cudaMemset(g_ws, 0, 4096));      /* counters: zero once, the library keeps them zero */
    CK(cudaDeviceSynchronize());         /* why: cudaMemset runs on the legacy stream, which the
                                            non-blocking g_stream does not wait for */
    g_ws_bytes = need;
}

/* device buffer with `off` bytes in front (misalignment) and a 256-byte poisoned guard tail */
typedef struct { char* base; size_t off, bytes; } dbuf;
#define GUARD 256
static dbuf dalloc(size_t bytes, size_t off) {
    dbuf b;
    b.off = off; b.bytes = bytes;
    CK(cudaMalloc((void**)&b.base, off + bytes + GUARD));
    CK(cudaMemset(b.base, TU_POISON_BYTE, off + bytes + GUARD));
    CK(cudaDeviceSynchronize());  /* why: see ensure_ws */
    return b;
}
static void* dptr(const dbuf* b) { return b->base + b->off; }
static void dfree(dbuf* b) { if (b->base) CK(cudaFree(b->base)); b->base = NULL; }
static int guard_ok(const dbuf* b) {
    unsigned char g[GUARD];
    CK(cudaMemcpy(g, b->base + b->off + b->bytes, GUARD, cudaMemcpyDeviceToHost));
    for (int k = 0; k < GUARD; k++) if (g[k] != TU_POISON_BYTE) return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * a case
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t N, F, ld_out, ld_x, ld_dy;
    int off;            /* bytes added to every device base pointer (misaligned views) */
    fl_dtype dt;
    int bk;             /* bias: 0 none, 1 dtype, 2 fp32 */
    fl_gelu_approx ap;
    int inplace;        /* y == x (forward), dx == dy (backward); then ld_out = ld_x = ld_dy */
    int det;            /* also: a second run must give the same bits */
} gcase;

/* fast pseudo-normal in [-4.5, 4.5] (sum of three uniforms): generating 2^27 Box-Muller
 * normals would dominate the run time; GeLU needs both tails and the middle, not exact normality */
static float rnd(tu_rng* r) {
    double s = tu_uniform(r) + tu_uniform(r) + tu_uniform(r) - 1.5;
    return (float)(3.0 * s);
}

typedef struct { long bad; long eq; double maxdiff; int64_t first[5]; } cmp_t;

/* got [N, ld_got] (device copy) vs ref [N, F] (CPU), inputs for the slack */
static int cmp_out(const char* name, int bwd, const gcase* c, const void* got, int64_t ld_got, const void* ref,
                   const void* x, const void* dy, const void* b, fl_dtype bdt, double* abs_colsum) {
    const int64_t N = c->N, F = c->F;
    const int d = dti(c->dt);
    long bad = 0, eq = 0;
    double maxdiff = 0.0;
#ifdef _OPENMP
#pragma omp parallel for reduction(+ : bad, eq) reduction(max : maxdiff) schedule(static)
#endif
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < F; j++) {
            const double g = tu_load(got, c->dt, i * ld_got + j), r = tu_load(ref, c->dt, i * F + j);
            const double u = (double)tu_load(x, c->dt, i * c->ld_x + j) + (b ? (double)tu_load(b, bdt, j) : 0.0);
            const double s = bwd ? slack_dx(u, tu_load(dy, c->dt, i * c->ld_dy + j)) : slack_y(u);
            eq += tu_bits(got, c->dt, i * ld_got + j) == tu_bits(ref, c->dt, i * F + j);
            int ok;
            const int64_t ud = c->dt == FL_DTYPE_F32 ? 2
                               : ord16((uint16_t)tu_bits(got, c->dt, i * ld_got + j)) - ord16((uint16_t)tu_bits(ref, c->dt, i * F + j));
            if (isnan(g) || isnan(r)) ok = isnan(g) && isnan(r);
            else if (ud >= -1 && ud <= 1) ok = 1;   /* 16-bit: within 1 ulp of the dtype */
            else if (isinf(g) || isinf(r)) ok = g == r;
            else {
                double e = fabs(g - r);
                if (e > maxdiff) maxdiff = e;
                ok = e <= ATOL[d] + RTOL[d] * fabs(r) + s;
            }
            bad += !ok;
        }
    if (abs_colsum) {  /* column blocks of 64 in parallel: each thread owns its columns */
        const int64_t nblk = (F + 63) / 64;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (int64_t jb = 0; jb < nblk; jb++) {
            const int64_t j1 = (jb + 1) * 64 < F ? (jb + 1) * 64 : F;
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = jb * 64; j < j1; j++) abs_colsum[j] += fabs(tu_load(ref, c->dt, i * F + j));
        }
    }
    if (bad) {
        int shown = 0;
        for (int64_t i = 0; i < N && shown < 5; i++)
            for (int64_t j = 0; j < F && shown < 5; j++) {
                const double g = tu_load(got, c->dt, i * ld_got + j), r = tu_load(ref, c->dt, i * F + j);
                const double u = (double)tu_load(x, c->dt, i * c->ld_x + j) + (b ? (double)tu_load(b, bdt, j) : 0.0);
                const double s = bwd ? slack_dx(u, tu_load(dy, c->dt, i * c->ld_dy + j)) : slack_y(u);
                const int64_t ud = c->dt == FL_DTYPE_F32 ? 2
                                   : ord16((uint16_t)tu_bits(got, c->dt, i * ld_got + j)) - ord16((uint16_t)tu_bits(ref, c->dt, i * F + j));
                if (!(fabs(g - r) <= ATOL[d] + RTOL[d] * fabs(r) + s) && !(isnan(g) && isnan(r)) && !(ud >= -1 && ud <= 1)) {
                    printf("    %s[%lld, %lld]: gpu %.9g cpu %.9g (u = %.9g)\n", name, (long long)i, (long long)j, g, r, u);
                    shown++;
                }
            }
    }
    const int64_t n = N * F;
    CHECK(bad == 0, "%s: %ld of %lld mismatches, maxdiff %.3g", name, bad, (long long)n, maxdiff);
    if (g_verbose || bad)
        printf("    %-10s maxdiff %.3g, bitwise equal %.4f%%\n", name, maxdiff, n ? 100.0 * (double)eq / (double)n : 100.0);
    return bad == 0;
}

static int padding_ok(const void* m, int64_t N, int64_t F, int64_t ld, size_t es) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = F; j < ld; j++)
            if (!tu_is_poison(m, es, i * ld + j)) return 0;
    return 1;
}

static int counters_zero(void) {
    unsigned char h[4096];
    CK(cudaMemcpy(h, g_ws, 4096, cudaMemcpyDeviceToHost));
    for (int k = 0; k < 4096; k++) if (h[k]) return 0;
    return 1;
}

static void run_case(const gcase* c0, tu_rng* rng) {
    gcase cc = *c0;
    gcase* c = &cc;
    if (c->inplace) c->ld_out = c->ld_dy = c->ld_x;
    const int64_t N = c->N, F = c->F;
    const size_t es = tu_dtype_size(c->dt);
    const fl_dtype bdt = c->bk == 2 ? FL_DTYPE_F32 : c->dt;
    const size_t bes = tu_dtype_size(bdt);
    char desc[200];
    snprintf(desc, sizeof desc, "%s %s bias=%s N=%lld F=%lld ld=%lld/%lld/%lld off=%d%s%s", tu_dtype_name(c->dt),
             ap_name(c->ap), c->bk == 0 ? "none" : c->bk == 1 ? "dt" : "f32", (long long)N, (long long)F,
             (long long)c->ld_out, (long long)c->ld_x, (long long)c->ld_dy, c->off, c->inplace ? " inplace" : "",
             c->det ? " +det" : "");
    const int idx = g_index++;
    if (idx % g_stride) return;
    if (g_filter && !strstr(desc, g_filter)) return;
    const long f0 = tu_failed;
    struct timespec t0, t1;
    timespec_get(&t0, TIME_UTC);

    /* host inputs: padding NaN */
    const size_t bx = (size_t)N * (size_t)c->ld_x * es, bdy = (size_t)N * (size_t)c->ld_dy * es;
    const size_t bo = (size_t)N * (size_t)c->ld_out * es;
    void* x = tu_xmalloc(bx);
    void* dy = tu_xmalloc(bdy);
    tu_poison(x, bx);
    tu_poison(dy, bdy);
    /* rows in parallel, each from its own seeded stream (reproducible for any thread count) */
    const uint64_t cseed = tu_next(rng);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < N; i++) {
        tu_rng r = tu_rng_seed(cseed ^ ((uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull));
        for (int64_t j = 0; j < F; j++) {
            tu_store(x, c->dt, i * c->ld_x + j, rnd(&r));
            tu_store(dy, c->dt, i * c->ld_dy + j, rnd(&r) * 0.5f);
        }
    }
    void* b = NULL;
    if (c->bk) {
        b = tu_xmalloc((size_t)F * bes);
        for (int64_t j = 0; j < F; j++) tu_store(b, bdt, j, rnd(rng) * 0.3f);
    }

    /* CPU reference: packed [N, F] outputs */
    size_t wsb = 0;
    CHECK_STATUS(fl_gelu_workspace_size(&wsb, N, F, c->dt), FL_OK, "fl_gelu_workspace_size");
    void* hws = tu_xmalloc(wsb);
    void* y_ref = tu_xmalloc((size_t)N * (size_t)F * es + 1);
    void* dx_ref = tu_xmalloc((size_t)N * (size_t)F * es + 1);
    void* db_ref = tu_xmalloc((size_t)F * bes);
    CHECK_STATUS(fl_gelu_forward_cpu(y_ref, x, b, N, F, F, c->ld_x, c->dt, bdt, c->ap), FL_OK, "cpu forward");
    CHECK_STATUS(fl_gelu_backward_cpu(dx_ref, b ? db_ref : NULL, dy, x, b, N, F, F, c->ld_dy, c->ld_x, c->dt, bdt,
                                      c->ap, hws, wsb),
                 FL_OK, "cpu backward");

    /* device */
    ensure_ws(wsb);
    dbuf d_x = dalloc(bx, (size_t)c->off), d_dy = dalloc(bdy, (size_t)c->off), d_o = dalloc(bo, (size_t)c->off);
    dbuf d_b = dalloc((size_t)F * bes, 0), d_db = dalloc((size_t)F * bes, 0);
    CK(cudaMemcpy(dptr(&d_x), x, bx, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dptr(&d_dy), dy, bdy, cudaMemcpyHostToDevice));
    if (b) CK(cudaMemcpy(dptr(&d_b), b, (size_t)F * bes, cudaMemcpyHostToDevice));
    void* got = tu_xmalloc(bo + 1);

    /* forward */
    void* yo = dptr(&d_o);
    if (c->inplace) { CK(cudaMemcpy(yo, dptr(&d_x), bx, cudaMemcpyDeviceToDevice)); }
    CK(cudaDeviceSynchronize());  /* why: the copies above (legacy stream; D2D and pageable H2D
                                     return before they land) must finish before g_stream's kernel */
    fl_status st = fl_gelu_forward_cuda(yo, c->inplace ? yo : dptr(&d_x), b ? dptr(&d_b) : NULL, N, F, c->ld_out,
                                        c->ld_x, c->dt, bdt, c->ap, g_stream);
    CHECK_STATUS(st, FL_OK, "fl_gelu_forward_cuda");
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(got, yo, bo, cudaMemcpyDeviceToHost));
    cmp_out("y", 0, c, got, c->ld_out, y_ref, x, dy, b, bdt, NULL);
    CHECK(padding_ok(got, N, F, c->ld_out, es), "y: padding columns written");
    CHECK(guard_ok(&d_o), "y: guard bytes after the buffer written");

    /* backward (+ dbias) */
    CK(cudaMemset(d_o.base, TU_POISON_BYTE, d_o.off + d_o.bytes + GUARD));
    void* dxo = dptr(&d_o);
    if (c->inplace) CK(cudaMemcpy(dxo, dptr(&d_dy), bdy, cudaMemcpyDeviceToDevice));
    CK(cudaDeviceSynchronize());  /* why: as above */
    st = fl_gelu_backward_cuda(dxo, b ? dptr(&d_db) : NULL, c->inplace ? dxo : dptr(&d_dy), dptr(&d_x),
                               b ? dptr(&d_b) : NULL, N, F, c->ld_out, c->ld_dy, c->ld_x, c->dt, bdt, c->ap, g_ws,
                               g_ws_bytes, g_stream);
    CHECK_STATUS(st, FL_OK, "fl_gelu_backward_cuda");
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(got, dxo, bo, cudaMemcpyDeviceToHost));
    double* colsum = (double*)calloc((size_t)F, sizeof(double));
    cmp_out("dx", 1, c, got, c->ld_out, dx_ref, x, dy, b, bdt, colsum);
    CHECK(padding_ok(got, N, F, c->ld_out, es), "dx: padding columns written");
    CHECK(guard_ok(&d_o), "dx: guard bytes after the buffer written");
    void* db_got = NULL;
    if (b) {
        db_got = tu_xmalloc((size_t)F * bes);
        CK(cudaMemcpy(db_got, dptr(&d_db), (size_t)F * bes, cudaMemcpyDeviceToHost));
        long bad = 0;
        double maxdiff = 0.0;
        const int bd = dti(bdt);
        /* fast 16-bit formulas: dbias sums their fp32 du, which the header bounds by 1 ulp of the
         * dtype relative, or 2^-21 |dy| absolute next to gelu's minimum (u ~ -0.75, where du
         * crosses 0): with an fp32 dbias that bound shows (H200 2026-12-02 run 2: N = 1, F = 7,
         * |diff| 3.7e-9 at du = 5.8e-5, within 2^-21 |dy|), so it is added per row here */
        double* dysum = NULL;
        if (fast16_on() && c->dt != FL_DTYPE_F32) {
            dysum = (double*)calloc((size_t)F, sizeof(double));
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < F; j++) dysum[j] += fabs(tu_load(dy, c->dt, i * c->ld_dy + j));
        }
        for (int64_t j = 0; j < F; j++) {
            const double g = tu_load(db_got, bdt, j), r = tu_load(db_ref, bdt, j);
            /* per-row slack summed: bounded by SLACK_DX * sum |dx| * (1 + 4.5 * 4.05) for |u| <= 4.5+ */
            const double tol = ATOL[bd] + RTOL[bd] * fabs(r) + (DB_SUM_RTOL + 20.0 * SLACK_DX) * colsum[j] +
                               (dysum ? 0x1p-21 * dysum[j] : 0.0);
            const double e = fabs(g - r);
            if (!(e <= tol)) {
                if (bad < 5) printf("    dbias[%lld]: gpu %.9g cpu %.9g (tol %.3g)\n", (long long)j, g, r, tol);
                bad++;
            }
            if (e > maxdiff) maxdiff = e;
        }
        free(dysum);
        CHECK(bad == 0, "dbias: %ld of %lld mismatches, maxdiff %.3g", bad, (long long)F, maxdiff);
        CHECK(guard_ok(&d_db), "dbias: guard bytes written");
        CHECK(counters_zero(), "workspace counters not zero after the call");
    }

    /* determinism: the same call again gives the same bits */
    if (c->det && !c->inplace) {
        void* got2 = tu_xmalloc(bo + 1);
        void* db2 = tu_xmalloc((size_t)F * bes + 1);
        st = fl_gelu_backward_cuda(dxo, b ? dptr(&d_db) : NULL, dptr(&d_dy), dptr(&d_x), b ? dptr(&d_b) : NULL, N, F,
                                   c->ld_out, c->ld_dy, c->ld_x, c->dt, bdt, c->ap, g_ws, g_ws_bytes, g_stream);
        CHECK_STATUS(st, FL_OK, "second backward");
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(got2, dxo, bo, cudaMemcpyDeviceToHost));
        CHECK(memcmp(got, got2, bo) == 0, "determinism: dx differs between two runs");
        if (b) {
            CK(cudaMemcpy(db2, dptr(&d_db), (size_t)F * bes, cudaMemcpyDeviceToHost));
            CHECK(memcmp(db_got, db2, (size_t)F * bes) == 0, "determinism: dbias differs between two runs");
        }
        free(got2);
        free(db2);
    }

    timespec_get(&t1, TIME_UTC);
    printf("%s [%3d] %-78s (%.2f s)\n", tu_failed == f0 ? "OK  " : "FAIL", idx, desc,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    fflush(stdout);
    free(colsum); free(db_got); free(got); free(x); free(dy); free(b); free(hws); free(y_ref); free(dx_ref); free(db_ref);
    dfree(&d_x); dfree(&d_dy); dfree(&d_o); dfree(&d_b); dfree(&d_db);
}

/* ------------------------------------------------------------------------------------------
 * special sections
 * ---------------------------------------------------------------------------------------- */

/* forward + backward with dbias captured in a CUDA graph, replayed twice: bitwise == eager */
static void test_graph(tu_rng* rng, int64_t N, int64_t F, fl_dtype dt) {
    const size_t es = tu_dtype_size(dt), bytes = (size_t)N * (size_t)F * es, bb = (size_t)F * es;
    void* hx = tu_xmalloc(bytes);
    void* hdy = tu_xmalloc(bytes);
    void* hb = tu_xmalloc(bb);
    for (int64_t k = 0; k < N * F; k++) { tu_store(hx, dt, k, rnd(rng)); tu_store(hdy, dt, k, rnd(rng)); }
    for (int64_t j = 0; j < F; j++) tu_store(hb, dt, j, rnd(rng) * 0.3f);
    size_t wsb;
    fl_gelu_workspace_size(&wsb, N, F, dt);
    ensure_ws(wsb);
    void *x, *dy, *bias, *y, *dx, *db;
    CK(cudaMalloc(&x, bytes)); CK(cudaMalloc(&dy, bytes)); CK(cudaMalloc(&y, bytes)); CK(cudaMalloc(&dx, bytes));
    CK(cudaMalloc(&bias, bb)); CK(cudaMalloc(&db, bb));
    CK(cudaMemcpy(x, hx, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dy, hdy, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bias, hb, bb, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());  /* why: see ensure_ws */
    void* e_y = tu_xmalloc(bytes); void* e_dx = tu_xmalloc(bytes); void* e_db = tu_xmalloc(bb);
    void* g_y = tu_xmalloc(bytes); void* g_dx = tu_xmalloc(bytes); void* g_db = tu_xmalloc(bb);
    /* eager */
    CHECK_STATUS(fl_gelu_forward_cuda(y, x, bias, N, F, F, F, dt, dt, FL_GELU_TANH, g_stream), FL_OK, "graph: eager fwd");
    CHECK_STATUS(fl_gelu_backward_cuda(dx, db, dy, x, bias, N, F, F, F, F, dt, dt, FL_GELU_TANH, g_ws, g_ws_bytes, g_stream),
                 FL_OK, "graph: eager bwd");
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaMemcpy(e_y, y, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(e_dx, dx, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(e_db, db, bb, cudaMemcpyDeviceToHost));
    /* capture */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    fl_status s1 = fl_gelu_forward_cuda(y, x, bias, N, F, F, F, dt, dt, FL_GELU_TANH, g_stream);
    fl_status s2 = fl_gelu_backward_cuda(dx, db, dy, x, bias, N, F, F, F, F, dt, dt, FL_GELU_TANH, g_ws, g_ws_bytes, g_stream);
    CK(cudaStreamEndCapture(g_stream, &graph));
    CHECK(s1 == FL_OK && s2 == FL_OK, "graph: capture statuses %d %d (%s)", (int)s1, (int)s2, fl_last_error());
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemsetAsync(y, 0xFF, bytes, g_stream));
        CK(cudaMemsetAsync(dx, 0xFF, bytes, g_stream));
        CK(cudaMemsetAsync(db, 0xFF, bb, g_stream));
        CK(cudaGraphLaunch(exec, g_stream));
        CK(cudaStreamSynchronize(g_stream));
        CK(cudaMemcpy(g_y, y, bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(g_dx, dx, bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(g_db, db, bb, cudaMemcpyDeviceToHost));
        char name[96];
        snprintf(name, sizeof name, "graph replay %d (%lldx%lld %s): y", rep, (long long)N, (long long)F, tu_dtype_name(dt));
        check_bitwise(name, e_y, g_y, bytes);
        snprintf(name, sizeof name, "graph replay %d (%lldx%lld %s): dx", rep, (long long)N, (long long)F, tu_dtype_name(dt));
        check_bitwise(name, e_dx, g_dx, bytes);
        snprintf(name, sizeof name, "graph replay %d (%lldx%lld %s): dbias", rep, (long long)N, (long long)F, tu_dtype_name(dt));
        check_bitwise(name, e_db, g_db, bb);
    }
    CHECK(counters_zero(), "graph: workspace counters not zero after the replays");
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaFree(x)); CK(cudaFree(dy)); CK(cudaFree(y)); CK(cudaFree(dx)); CK(cudaFree(bias)); CK(cudaFree(db));
    free(hx); free(hdy); free(hb); free(e_y); free(e_dx); free(e_db); free(g_y); free(g_dx); free(g_db);
}

static void test_empty(void) {
    void* db;
    CK(cudaMalloc(&db, 64));
    CK(cudaMemset(db, 0xFF, 64));
    CK(cudaDeviceSynchronize());  /* why: see ensure_ws */
    fl_status st = fl_gelu_backward_cuda(NULL, db, NULL, NULL, (void*)db /* any non-NULL: not read */, 0, 7, 7, 7, 7,
                                         FL_DTYPE_BF16, FL_DTYPE_F32, FL_GELU_TANH, NULL, 0, g_stream);
    /* bias == dbias overlap is rejected; use a separate bias pointer */
    CHECK_STATUS(st, FL_ERR_INVALID_ARGUMENT, "N=0: dbias overlapping bias still rejected");
    float hb[7] = {0};
    void* bias;
    CK(cudaMalloc(&bias, 64));
    st = fl_gelu_backward_cuda(NULL, db, NULL, NULL, bias, 0, 7, 7, 7, 7, FL_DTYPE_BF16, FL_DTYPE_F32, FL_GELU_TANH, NULL,
                               0, g_stream);
    CHECK_STATUS(st, FL_OK, "N=0 backward with dbias");
    CK(cudaStreamSynchronize(g_stream));
    float got[7];
    CK(cudaMemcpy(got, db, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got, hb, sizeof got) == 0, "N=0: dbias must be zeros");
    st = fl_gelu_forward_cuda(NULL, NULL, NULL, 0, 7, 7, 7, FL_DTYPE_F16, FL_DTYPE_F16, FL_GELU_NONE, g_stream);
    CHECK_STATUS(st, FL_OK, "N=0 forward");
    CK(cudaFree(db));
    CK(cudaFree(bias));
}

/* ------------------------------------------------------------------------------------------
 * the grid
 * ---------------------------------------------------------------------------------------- */
static void grid(tu_rng* rng) {
    static const fl_dtype DT[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};
    /* odd and small shapes; every layout */
    static const int64_t SH[][2] = {{1, 1}, {1, 7}, {3, 5}, {2, 8}, {7, 1001}, {9, 1002}, {17, 1004},
                                    {33, 1000}, {129, 24}, {130, 3071}, {64, 4096}, {5, 50257},
                                    /* many short dbias row blocks (FUSEDLOSS_GELU_DBIAS_RPB): uneven groups */
                                    {1000, 128}, {2049, 64}};
    for (size_t s = 0; s < sizeof SH / sizeof SH[0]; s++) {
        const int64_t N = SH[s][0], F = SH[s][1];
        if (g_small && N * F > (1 << 17)) continue;
        for (int di = 0; di < 3; di++)
            for (int ap = 0; ap < 2; ap++)
                for (int bk = 0; bk < 3; bk++) {
                    if (bk == 2 && DT[di] == FL_DTYPE_F32) continue;
                    /* layouts: 0 contiguous, 1 padded aligned ld, 2 odd strides, 3 misaligned bases,
                     * 4 in place (contiguous) */
                    for (int lay = 0; lay < 5; lay++) {
                        gcase c;
                        memset(&c, 0, sizeof c);
                        c.N = N; c.F = F; c.dt = DT[di]; c.ap = (fl_gelu_approx)ap; c.bk = bk;
                        c.ld_out = c.ld_x = c.ld_dy = F;
                        if (lay == 1) { int64_t v = 16 / (int64_t)tu_dtype_size(c.dt); c.ld_out = c.ld_x = c.ld_dy = (F + v) / v * v + v; }
                        if (lay == 2) { c.ld_out = F + 1; c.ld_x = F + 3; c.ld_dy = F + 2; }
                        if (lay == 3) c.off = (int)tu_dtype_size(c.dt);
                        if (lay == 4) c.inplace = 1;
                        c.det = lay == 0 && bk == 1;
                        run_case(&c, rng);
                    }
                }
    }
    if (g_small) return;
    /* > 1024 column slabs: ROWS (16-byte rows) and SCALAR with the second dbias kernel */
    {
        gcase c;
        memset(&c, 0, sizeof c);
        c.N = 3; c.F = 600000; c.ld_out = c.ld_x = c.ld_dy = 600000; c.dt = FL_DTYPE_BF16; c.bk = 1; c.ap = FL_GELU_TANH;
        c.det = 1;
        run_case(&c, rng);
        c.off = 2;
        run_case(&c, rng);
    }
    /* the real shapes: every dtype x approx with a bias (fp32 too for 16-bit), no bias once per dtype */
    static const int64_t BIG[][2] = {{8192, 3072}, {8192, 16384}};
    for (int s = 0; s < 2; s++)
        for (int di = 0; di < 3; di++)
            for (int ap = 0; ap < 2; ap++)
                for (int bk = 0; bk < 3; bk++) {
                    if (bk == 2 && DT[di] == FL_DTYPE_F32) continue;
                    if (bk == 0 && ap == FL_GELU_NONE) continue;
                    gcase c;
                    memset(&c, 0, sizeof c);
                    c.N = BIG[s][0]; c.F = BIG[s][1]; c.ld_out = c.ld_x = c.ld_dy = c.F;
                    c.dt = DT[di]; c.ap = (fl_gelu_approx)ap; c.bk = bk;
                    c.det = bk == 1 && ap == FL_GELU_TANH;
                    run_case(&c, rng);
                }
    /* 8192 x 1000 with a bias: F / V (125 at 16 bits, 250 at fp32) does not divide the STREAM
     * grid's stride (256 x resident CTAs, a multiple of 2^10 x 33 on an H200, which every F above
     * divides), so the bias column stepping between a thread's vectors is not the identity */
    for (int di = 0; di < 3; di++) {
        gcase c;
        memset(&c, 0, sizeof c);
        c.N = 8192; c.F = 1000; c.ld_out = c.ld_x = c.ld_dy = 1000; c.dt = DT[di]; c.ap = FL_GELU_TANH;
        c.bk = di == 0 ? 1 : 2;
        run_case(&c, rng);
    }
    /* N = 8191 x odd F: the FLAT path at size */
    {
        gcase c;
        memset(&c, 0, sizeof c);
        c.N = 8191; c.F = 3071; c.ld_out = c.ld_x = c.ld_dy = 3071; c.dt = FL_DTYPE_BF16; c.bk = 2; c.ap = FL_GELU_TANH;
        c.det = 1;
        run_case(&c, rng);
    }
}

int main(int argc, char** argv) {
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--small")) g_small = 1;
        else if (!strcmp(argv[a], "-v")) g_verbose = 1;
        else if (!strcmp(argv[a], "--exact16")) g_exact16 = 1;
        else if (!strcmp(argv[a], "--fast16")) g_exact16 = -1;
        else if (!strcmp(argv[a], "--stride") && a + 1 < argc) g_stride = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--filter") && a + 1 < argc) g_filter = argv[++a];
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) g_seed = strtoull(argv[++a], NULL, 0);
        else {
            printf("usage: test_gelu_cuda [--small] [--exact16|--fast16] [--stride K] [--filter SUBSTR] [--seed S] [-v]\n");
            return 2;
        }
    }
    if (g_stride < 1) g_stride = 1;
    /* the library reads FUSEDLOSS_GELU_EXACT16 once, at its first CUDA GeLU call: set it first */
    if (g_exact16) setenv("FUSEDLOSS_GELU_EXACT16", g_exact16 > 0 ? "1" : "0", 1);
    printf("16-bit path: %s\n", fast16_on() ? "fast formulas (default)" : "exact fp32 operations (FUSEDLOSS_GELU_EXACT16=1)");
    if (!fl_cuda_built()) {
        printf("SKIP: this build of fusedloss has no CUDA backend\n");
        return 0;
    }
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), seed 0x%llx%s\n", prop.name, prop.major, prop.minor, (unsigned long long)g_seed,
           g_small ? ", small grid" : "");
    CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    tu_rng rng = tu_rng_seed(g_seed);
    grid(&rng);
    test_empty();
    test_graph(&rng, g_small ? 33 : 8192, g_small ? 1001 : 3072, FL_DTYPE_BF16);
    test_graph(&rng, g_small ? 17 : 1000, g_small ? 64 : 3071, FL_DTYPE_F32);
    cudaError_t last = cudaDeviceSynchronize();
    CHECK(last == cudaSuccess, "device error at the end: %s", cudaGetErrorString(last));
    if (g_ws) CK(cudaFree(g_ws));
    CK(cudaStreamDestroy(g_stream));
    return tu_finish();
}
