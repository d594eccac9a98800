/* test_vp_nccl_cuda.c — fl_vp_cross_entropy_nccl on real NCCL communicators, one process.
 *
 * k = 1 (one GPU: a one-rank communicator) and, when the machine has >= 2 GPUs, k = 2 (one
 * communicator per GPU from ncclCommInitAll, one host thread per rank so that each rank's call —
 * stats, all-gather, combine, backward on its stream — runs as it would in its own process).
 * Every rank's loss must be bitwise the same, and equal (CUDA tolerance) to
 * fl_cross_entropy_fused_cuda on the full logits on GPU 0; each rank's dlogits equal to that
 * call's dlogits columns. Uneven shards, bf16 and fp32, MEAN with the default options, NONE with
 * smoothing + class weights + a per-row upstream gradient, a loss-only call (dlogits NULL), in
 * place; bad arguments (NULL comm). NCCL is loaded with dlopen (as the library does):
 * FUSEDLOSS_NCCL_LIBRARY or libnccl.so.2. Without NCCL or a GPU: "SKIP", exit 0.
 * Tolerances as tests/test_vocab_parallel_cuda.c: loss 1e-5 abs + rel; dlogits fp32 rtol 3e-5,
 * bf16 within 1 ulp (2^-7 relative at worst), plus 1e-7 absolute.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"

#include "cuda_check.h"

typedef int (*init_all_fn)(void** comms, int ndev, const int* devlist);
typedef int (*destroy_fn)(void* comm);
static init_all_fn nccl_init_all;
static destroy_fn nccl_destroy;

typedef struct {
    int rank, dev, k;
    void* comm;
    /* problem (shared, host) */
    int64_t N, V, start, len;
    fl_dtype dt;
    const void* hx;          /* full logits [N][V] */
    const int64_t* ht;
    const float* hw;         /* weights [V] or NULL */
    const float* hg;         /* upstream (per row for NONE, [1] otherwise) or NULL */
    fl_reduction red;
    float eps;
    int want_grad, inplace;
    /* results (host) */
    float* loss;
    void* dl;                /* [N][len] */
    fl_status st;
    char err[256];
} rank_job;

static size_t esz(fl_dtype dt) { return dt == FL_DTYPE_F32 ? 4 : 2; }

static void* run_rank(void* arg) {
    rank_job* j = (rank_job*)arg;
    CK(cudaSetDevice(j->dev));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const size_t es = esz(j->dt), nl = j->red == FL_REDUCTION_NONE ? (size_t)j->N : 1u;
    char* hs = (char*)tu_xmalloc((size_t)j->N * (size_t)j->len * es);
    for (int64_t i = 0; i < j->N; i++)
        memcpy(hs + (size_t)(i * j->len) * es, (const char*)j->hx + (size_t)(i * j->V + j->start) * es,
               (size_t)j->len * es);
    void *x, *dl, *t, *ws;
    float *loss, *lse, *w = NULL, *g = NULL;
    CK(cudaMalloc(&x, (size_t)j->N * j->len * es));
    CK(cudaMalloc(&t, (size_t)j->N * 8));
    CK(cudaMalloc((void**)&loss, nl * 4));
    CK(cudaMalloc((void**)&lse, (size_t)j->N * 4));
    CK(cudaMemcpyAsync(x, hs, (size_t)j->N * j->len * es, cudaMemcpyHostToDevice, s));
    CK(cudaMemcpyAsync(t, j->ht, (size_t)j->N * 8, cudaMemcpyHostToDevice, s));
    dl = j->inplace ? x : NULL;
    if (j->want_grad && !j->inplace) {
        CK(cudaMalloc(&dl, (size_t)j->N * j->len * es));
        CK(cudaMemsetAsync(dl, 0xFF, (size_t)j->N * j->len * es, s));
    }
    CK(cudaMemsetAsync(loss, 0xFF, nl * 4, s));
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    o.reduction = j->red;
    o.label_smoothing = j->eps;
    if (j->hw) {
        CK(cudaMalloc((void**)&w, (size_t)j->V * 4));
        CK(cudaMemcpyAsync(w, j->hw, (size_t)j->V * 4, cudaMemcpyHostToDevice, s));
        o.weight = w;
    }
    if (j->hg) {
        CK(cudaMalloc((void**)&g, nl * 4));
        CK(cudaMemcpyAsync(g, j->hg, nl * 4, cudaMemcpyHostToDevice, s));
    }
    size_t wb = 0;
    fl_vp_cross_entropy_nccl_workspace_size(&wb, j->N, j->len, j->V, j->dt, j->k, &o);
    CK(cudaMalloc(&ws, wb));
    j->st = fl_vp_cross_entropy_nccl(loss, lse, j->want_grad ? dl : NULL, x, t, g, 1.0f, j->N, j->len, j->len,
                                     j->start, j->V, j->dt, FL_INDEX_I64, &o, j->comm, ws, wb, (fl_stream)s);
    if (j->st != FL_OK) snprintf(j->err, sizeof j->err, "%s", fl_last_error());
    CK(cudaStreamSynchronize(s));
    j->loss = (float*)tu_xmalloc(nl * 4);
    CK(cudaMemcpy(j->loss, loss, nl * 4, cudaMemcpyDeviceToHost));
    if (j->want_grad) {
        j->dl = tu_xmalloc((size_t)j->N * j->len * es);
        CK(cudaMemcpy(j->dl, dl, (size_t)j->N * j->len * es, cudaMemcpyDeviceToHost));
    }
    cudaFree(x); if (dl && dl != x) cudaFree(dl);
    cudaFree(t); cudaFree(loss); cudaFree(lse); cudaFree(w); cudaFree(g); cudaFree(ws);
    CK(cudaStreamDestroy(s));
    free(hs);
    return NULL;
}

/* fl_cross_entropy_fused_cuda on the full logits on device 0 */
static void reference(const rank_job* j, float* rloss, void* rdl) {
    CK(cudaSetDevice(0));
    const size_t es = esz(j->dt), nl = j->red == FL_REDUCTION_NONE ? (size_t)j->N : 1u;
    void *x, *dl, *t, *ws;
    float *loss, *w = NULL, *g = NULL;
    CK(cudaMalloc(&x, (size_t)j->N * j->V * es));
    CK(cudaMalloc(&dl, (size_t)j->N * j->V * es));
    CK(cudaMalloc(&t, (size_t)j->N * 8));
    CK(cudaMalloc((void**)&loss, nl * 4));
    CK(cudaMemcpy(x, j->hx, (size_t)j->N * j->V * es, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(t, j->ht, (size_t)j->N * 8, cudaMemcpyHostToDevice));
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    o.reduction = j->red;
    o.label_smoothing = j->eps;
    if (j->hw) {
        CK(cudaMalloc((void**)&w, (size_t)j->V * 4));
        CK(cudaMemcpy(w, j->hw, (size_t)j->V * 4, cudaMemcpyHostToDevice));
        o.weight = w;
    }
    if (j->hg) {
        CK(cudaMalloc((void**)&g, nl * 4));
        CK(cudaMemcpy(g, j->hg, nl * 4, cudaMemcpyHostToDevice));
    }
    size_t wb = 0;
    fl_cross_entropy_workspace_size(&wb, j->N, j->V, j->dt, &o);
    CK(cudaMalloc(&ws, wb));
    fl_status st = fl_cross_entropy_fused_cuda(loss, NULL, dl, x, t, g, 1.0f, j->N, j->V, j->V, j->dt, FL_INDEX_I64, &o,
                                               ws, wb, 0);
    CHECK_STATUS(st, FL_OK, "reference fl_cross_entropy_fused_cuda");
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(rloss, loss, nl * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rdl, dl, (size_t)j->N * j->V * es, cudaMemcpyDeviceToHost));
    cudaFree(x); cudaFree(dl); cudaFree(t); cudaFree(loss); cudaFree(w); cudaFree(g); cudaFree(ws);
}

static void run(int k, void** comms, int64_t N, int64_t V, fl_dtype dt, fl_reduction red, float eps, int weights,
                int want_grad, int inplace, uint64_t seed) {
    tu_rng r = tu_rng_seed(seed);
    const size_t es = esz(dt), nl = red == FL_REDUCTION_NONE ? (size_t)N : 1u;
    void* hx = tu_xmalloc((size_t)N * V * es);
    int64_t* ht = (int64_t*)tu_xmalloc((size_t)N * 8);
    float* hw = weights ? (float*)tu_xmalloc((size_t)V * 4) : NULL;
    float* hg = (float*)tu_xmalloc(nl * 4);
    for (int64_t e = 0; e < N * V; e++) tu_store(hx, dt, e, (float)(2.0 * tu_normal(&r)));
    for (int64_t i = 0; i < N; i++) ht[i] = (i % 9 == 4) ? -100 : tu_int_in(&r, 0, V - 1);
    if (hw) for (int64_t c = 0; c < V; c++) hw[c] = (float)tu_uniform_in(&r, 0.2, 2.0);
    for (size_t i = 0; i < nl; i++) hg[i] = (float)tu_uniform_in(&r, 0.5, 1.5);
    rank_job jobs[2];
    memset(jobs, 0, sizeof jobs);
    const int64_t cut = k == 2 ? V * 2 / 5 : V;  /* uneven */
    for (int q = 0; q < k; q++) {
        rank_job* j = &jobs[q];
        j->rank = q; j->dev = q; j->k = k; j->comm = comms[q];
        j->N = N; j->V = V; j->start = q ? cut : 0; j->len = q ? V - cut : cut;
        j->dt = dt; j->hx = hx; j->ht = ht; j->hw = hw; j->hg = hg; j->red = red; j->eps = eps;
        j->want_grad = want_grad; j->inplace = inplace;
    }
    pthread_t th[2];
    for (int q = 0; q < k; q++) pthread_create(&th[q], NULL, run_rank, &jobs[q]);
    for (int q = 0; q < k; q++) pthread_join(th[q], NULL);
    char label[160];
    snprintf(label, sizeof label, "k=%d N=%lld V=%lld %s %s eps=%g%s%s%s", k, (long long)N, (long long)V,
             tu_dtype_name(dt), red == FL_REDUCTION_NONE ? "none" : red == FL_REDUCTION_SUM ? "sum" : "mean",
             (double)eps, weights ? " weights" : "", want_grad ? "" : " loss-only", inplace ? " in-place" : "");
    int ok = 1;
    for (int q = 0; q < k; q++) ok &= CHECK(jobs[q].st == FL_OK, "%s: rank %d: %s", label, q, jobs[q].err);
    if (ok) {
        float* rl = (float*)tu_xmalloc(nl * 4);
        void* rd = tu_xmalloc((size_t)N * V * es);
        reference(&jobs[0], rl, rd);
        int bad = 0;
        for (int q = 1; q < k; q++) bad += memcmp(jobs[q].loss, jobs[0].loss, nl * 4) != 0;
        ok &= CHECK(bad == 0, "%s: loss bits differ between ranks", label);
        bad = 0;
        for (size_t i = 0; i < nl; i++)
            if (!(fabs(jobs[0].loss[i] - rl[i]) <= 1e-5 + 1e-5 * fabs(rl[i]))) bad++;
        ok &= CHECK(bad == 0, "%s: %d loss values off the single-GPU fused call (%.9g vs %.9g)", label, bad,
                    jobs[0].loss[0], rl[0]);
        if (want_grad) {
            bad = 0;
            const double rt = dt == FL_DTYPE_F32 ? 3e-5 : 1.0 / 128.0;
            for (int q = 0; q < k; q++)
                for (int64_t i = 0; i < N; i++)
                    for (int64_t c = 0; c < jobs[q].len; c++) {
                        const double a = tu_load(jobs[q].dl, dt, i * jobs[q].len + c);
                        const double b = tu_load(rd, dt, i * V + jobs[q].start + c);
                        if (!(fabs(a - b) <= 1e-7 + rt * fabs(b))) bad++;
                    }
            ok &= CHECK(bad == 0, "%s: %d dlogits off the single-GPU fused call", label, bad);
        }
        free(rl); free(rd);
    }
    printf("%-4s %s\n", ok ? "ok" : "FAIL", label);
    for (int q = 0; q < k; q++) { free(jobs[q].loss); free(jobs[q].dl); }
    free(hx); free(ht); free(hw); free(hg);
}

int main(void) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    const char* lib = getenv("FUSEDLOSS_NCCL_LIBRARY");
    void* h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("SKIP: NCCL not found (%s); set FUSEDLOSS_NCCL_LIBRARY\n", dlerror());
        return 0;
    }
    nccl_init_all = (init_all_fn)dlsym(h, "ncclCommInitAll");
    nccl_destroy = (destroy_fn)dlsym(h, "ncclCommDestroy");
    if (!lib || !*lib) setenv("FUSEDLOSS_NCCL_LIBRARY", "libnccl.so.2", 0);
    /* bad arguments */
    float dummy;
    fl_status st = fl_vp_cross_entropy_nccl(&dummy, NULL, NULL, &dummy, &dummy, NULL, 1.0f, 1, 1, 1, 0, 1,
                                            FL_DTYPE_F32, FL_INDEX_I64, NULL, NULL, NULL, 0, 0);
    CHECK(st == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "nccl_comm"), "NULL comm: %s", fl_last_error());
    for (int k = 1; k <= (ndev >= 2 ? 2 : 1); k++) {
        void* comms[2] = {NULL, NULL};
        int devs[2] = {0, 1};
        if (nccl_init_all(comms, k, devs) != 0) {
            CHECK(0, "ncclCommInitAll(%d) failed", k);
            continue;
        }
        run(k, comms, 1024, 50257, FL_DTYPE_BF16, FL_REDUCTION_MEAN, 0.0f, 0, 1, 0, 11);
        run(k, comms, 512, 50257, FL_DTYPE_F32, FL_REDUCTION_NONE, 0.1f, 1, 1, 0, 12);
        run(k, comms, 256, 128256, FL_DTYPE_BF16, FL_REDUCTION_SUM, 0.1f, 0, 1, 1, 13);
        run(k, comms, 333, 8003, FL_DTYPE_F32, FL_REDUCTION_MEAN, 0.0f, 1, 0, 0, 14);
        for (int q = 0; q < k; q++) nccl_destroy(comms[q]);
    }
    if (ndev < 2) printf("note: one GPU: only k = 1 ran (k = 2 needs two GPUs)\n");
    return tu_finish();
}
