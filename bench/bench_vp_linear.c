/* bench_vp_linear.c — the linear vocab-parallel cross-entropy on ONE GPU, over the public API:
 * what rank 0 of a TP = k group computes, against the single-GPU linear CE on its V/k shard.
 * SPDX-License-Identifier: MIT
 *
 * Per case (N, H, V, dtype, k), with V_local = rank 0's shard (V / k rounded up), in one run:
 *   single  fl_linear_cross_entropy_forward_cuda, mode 1 (dhidden + dweight, MEAN), at V_local
 *           classes: the baseline ("the single-GPU linear CE time at V/2");
 *   nccl    fl_vp_linear_cross_entropy_nccl on a ONE-rank NCCL communicator with the shard
 *           [0, V_local) of V: every kernel and GEMM rank 0 runs in TP = k (per chunk GEMM1, stats,
 *           combine, backward, GEMM2 into fp32, convert, GEMM3), with the collectives local (an
 *           all-gather and an fp32 all-reduce over one rank): the time of the real call minus the
 *           network; the loss it reports is not the global one (one shard seen);
 *   steps   the caller's-engine path: fl_vp_linear_ce_local_stats_cuda + fl_vp_ce_combine_cuda
 *           (k = 1 gathered) + fl_vp_linear_ce_backward_cuda: mode 2, 4 GEMMs;
 *   bytes   what the collectives would move per rank: 16 N (stats) + 4 N H (fp32 dhidden).
 * Reported: median ms of --reps (CUDA events, --warmup calls first), ratios nccl / single and
 * steps / single. NCCL is loaded with dlopen (FUSEDLOSS_NCCL_LIBRARY or libnccl.so.2); without it
 * the nccl row is skipped.
 * Usage: bench_vp_linear [--case N H V dtype k]... [--reps R] [--warmup W]
 *   Default: 8192x4096x128256 bf16 k=2 (the target: <= 1.2x single), 8192x768x50257 bf16 k=2.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "bench_util.h"

typedef struct { int64_t N, H, V; fl_dtype dt; int k; } vcase;

static int g_reps = 20, g_warmup = 3;
static cudaStream_t g_stream;

typedef struct {
    fl_lce_context* ctx;
    const vcase* c;
    int64_t Vl;
    void *hidden, *weight, *targets, *dh, *dw, *ws;
    float *loss, *lse, *stats, *dh32;
    size_t ws_bytes;
    void* comm;
    fl_ce_options ce;
} job;

static float time_it(void (*f)(void*), job* j) { return bench_time_median(f, j, g_stream, g_warmup, g_reps); }

static void run_single(void* p) {
    job* j = (job*)p;
    const vcase* c = j->c;
    FLK(fl_linear_cross_entropy_forward_cuda(j->ctx, j->loss, j->lse, j->dh, j->dw, NULL, j->hidden, c->H, j->weight,
                                             c->H, NULL, j->targets, NULL, 1.0f, c->N, c->H, j->Vl, c->dt, c->dt,
                                             FL_INDEX_I64, &j->ce, NULL, j->ws, j->ws_bytes, (fl_stream)g_stream));
}
static void run_nccl(void* p) {
    job* j = (job*)p;
    const vcase* c = j->c;
    FLK(fl_vp_linear_cross_entropy_nccl(j->ctx, j->loss, j->lse, j->dh, j->dw, NULL, j->hidden, c->H, j->weight, c->H,
                                        NULL, j->targets, NULL, 1.0f, c->N, c->H, j->Vl, 0, c->V, c->dt, c->dt,
                                        FL_INDEX_I64, &j->ce, NULL, j->comm, j->ws, j->ws_bytes, (fl_stream)g_stream));
}
static void run_steps(void* p) {
    job* j = (job*)p;
    const vcase* c = j->c;
    FLK(fl_vp_linear_ce_local_stats_cuda(j->ctx, j->stats, j->hidden, c->H, j->weight, c->H, NULL, j->targets, c->N,
                                         c->H, j->Vl, 0, c->V, c->dt, FL_INDEX_I64, &j->ce, NULL, j->ws, j->ws_bytes,
                                         (fl_stream)g_stream));
    FLK(fl_vp_ce_combine_cuda(j->loss, j->lse, j->stats, 1, j->targets, c->N, c->V, FL_INDEX_I64, &j->ce, j->ws,
                              j->ws_bytes, (fl_stream)g_stream));
    FLK(fl_vp_linear_ce_backward_cuda(j->ctx, j->dh32, j->dw, NULL, j->hidden, c->H, j->weight, c->H, NULL, j->targets,
                                      j->lse, NULL, 1.0f, c->N, c->H, j->Vl, 0, c->V, c->dt, c->dt, FL_INDEX_I64,
                                      &j->ce, NULL, j->ws, j->ws_bytes, (fl_stream)g_stream));
}

typedef int (*init_all_fn)(void** comms, int ndev, const int* devlist);

int main(int argc, char** argv) {
    vcase cases[16];
    int nc = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--case") && i + 5 < argc && nc < 16) {
            vcase c;
            c.N = atoll(argv[i + 1]); c.H = atoll(argv[i + 2]); c.V = atoll(argv[i + 3]);
            if (!parse_dt(argv[i + 4], &c.dt)) { fprintf(stderr, "bad dtype %s\n", argv[i + 4]); return 2; }
            c.k = atoi(argv[i + 5]);
            if (c.k < 1 || c.k > c.V) { fprintf(stderr, "bad k %d\n", c.k); return 2; }
            cases[nc++] = c;
            i += 5;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            g_reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            g_warmup = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--case N H V dtype k]... [--reps R] [--warmup W]\n", argv[0]);
            return 2;
        }
    }
    if (nc == 0) {
        const vcase def[] = {{8192, 4096, 128256, FL_DTYPE_BF16, 2}, {8192, 768, 50257, FL_DTYPE_BF16, 2}};
        nc = (int)(sizeof(def) / sizeof(def[0]));
        memcpy(cases, def, sizeof(def));
    }
    struct cudaDeviceProp prop;
    double copy_gbps;
    char commit[64], date[32];
    int rc = bench_begin(&g_stream, &prop, &copy_gbps, commit, sizeof(commit), date, sizeof(date));
    if (rc >= 0) return rc;
    fl_lce_context* ctx = NULL;
    FLK(fl_lce_context_create(&ctx));
    void* comm = NULL;
    {
        const char* lib = getenv("FUSEDLOSS_NCCL_LIBRARY");
        void* h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
        init_all_fn init_all = h ? (init_all_fn)dlsym(h, "ncclCommInitAll") : NULL;
        int dev = 0;
        CK(cudaGetDevice(&dev));
        if (!init_all || init_all(&comm, 1, &dev) != 0) {
            comm = NULL;
            printf("note: NCCL not available: the nccl rows are skipped\n");
        }
    }
    for (int ci = 0; ci < nc; ci++) {
        const vcase* c = &cases[ci];
        job j;
        memset(&j, 0, sizeof j);
        j.ctx = ctx; j.c = c; j.comm = comm;
        j.Vl = (c->V + c->k - 1) / c->k;
        const size_t es = dt_size(c->dt);
        j.hidden = bench_dev_random((size_t)(c->N * c->H), c->dt, 1.0f, 11 + ci);
        j.weight = bench_dev_random((size_t)(j.Vl * c->H), c->dt, 0.05f, 23 + ci);
        int64_t* ht = (int64_t*)malloc(sizeof(int64_t) * (size_t)c->N);
        for (int64_t i = 0; i < c->N; i++) ht[i] = (int64_t)(mix64(1000 + (uint64_t)i) % (uint64_t)c->V);
        CK(cudaMalloc(&j.targets, sizeof(int64_t) * (size_t)c->N));
        CK(cudaMemcpy(j.targets, ht, sizeof(int64_t) * (size_t)c->N, cudaMemcpyHostToDevice));
        free(ht);
        CK(cudaMalloc(&j.dh, (size_t)(c->N * c->H) * es));
        CK(cudaMalloc((void**)&j.dh32, (size_t)(c->N * c->H) * 4));
        CK(cudaMalloc(&j.dw, (size_t)(j.Vl * c->H) * es));
        CK(cudaMalloc((void**)&j.loss, sizeof(float) * (size_t)c->N));
        CK(cudaMalloc((void**)&j.lse, sizeof(float) * (size_t)c->N));
        CK(cudaMalloc((void**)&j.stats, 16 * (size_t)c->N));
        fl_ce_options ce = FL_CE_OPTIONS_INIT;
        j.ce = ce;
        size_t a = 0, b = 0, d = 0;
        FLK(fl_linear_cross_entropy_workspace_size(&a, c->N, c->H, j.Vl, c->dt, c->dt, &j.ce, NULL));
        FLK(fl_vp_linear_ce_workspace_size(&b, c->N, c->H, j.Vl, c->V, c->dt, c->dt, 1, &j.ce, NULL));
        FLK(fl_cross_entropy_workspace_size(&d, c->N, c->V, c->dt, &j.ce));
        j.ws_bytes = a > b ? a : b;
        if (d > j.ws_bytes) j.ws_bytes = d;
        CK(cudaMalloc(&j.ws, j.ws_bytes));

        const float ts = time_it(run_single, &j);
        const float tn = comm ? time_it(run_nccl, &j) : NAN;
        const float tp = time_it(run_steps, &j);
        const double mb = (16.0 * (double)c->N + 4.0 * (double)c->N * (double)c->H) / 1e6;
        printf("\ncase N=%lld H=%lld V=%lld %s TP=%d: rank 0 holds %lld classes; workspace %.3f GiB (vp %.3f)\n",
               (long long)c->N, (long long)c->H, (long long)c->V, dt_name(c->dt), c->k, (long long)j.Vl,
               (double)j.ws_bytes / (double)(1u << 30), (double)b / (double)(1u << 30));
        printf("  single (V_local, mode 1)   %8.3f ms\n", (double)ts);
        printf("  nccl entry (1-rank comm)   %8.3f ms  ratio %.3f  (+ the collectives: %.1f MB per rank)\n",
               (double)tn, (double)(tn / ts), mb);
        printf("  steps (mode 2, 4 GEMMs)    %8.3f ms  ratio %.3f\n", (double)tp, (double)(tp / ts));
        printf("SUMMARY vp-linear %lldx%lldx%lld %s TP=%d single %.3f ms | nccl-local %.3f ms ratio %.3f | steps %.3f ms "
               "ratio %.3f | collective bytes %.1f MB | %s %s\n",
               (long long)c->N, (long long)c->H, (long long)c->V, dt_name(c->dt), c->k, (double)ts, (double)tn,
               (double)(tn / ts), (double)tp, (double)(tp / ts), mb, commit, date);
        fflush(stdout);
        CK(cudaFree(j.hidden)); CK(cudaFree(j.weight)); CK(cudaFree(j.targets)); CK(cudaFree(j.dh));
        CK(cudaFree(j.dh32)); CK(cudaFree(j.dw)); CK(cudaFree(j.loss)); CK(cudaFree(j.lse)); CK(cudaFree(j.stats));
        CK(cudaFree(j.ws));
    }
    fl_lce_context_destroy(ctx);
    return 0;
}
