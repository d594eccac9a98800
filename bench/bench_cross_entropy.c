/* bench_cross_entropy.c — cross-entropy benchmark over the PUBLIC API (never an internal kernel).
 * SPDX-License-Identifier: MIT
 *
 * In one run, on one GPU:
 *   1. device-to-device copy bandwidth: cudaMemcpyAsync of a 2 GiB buffer, median of 30;
 *      bytes = read + write (2 x 2 GiB). This is the floor's bandwidth ("copy BW").
 *   2. per case (N, V, dtype, options), each pass timed with CUDA events around every call,
 *      after a warm-up; median and min of --reps (default 50) calls:
 *        fused     fl_cross_entropy_fused_cuda, dlogits in a separate buffer (lse = NULL)
 *        fused_ip  the same in place (dlogits == logits)
 *        forward   fl_cross_entropy_forward_cuda (loss + lse)
 *        backward  fl_cross_entropy_backward_cuda from the forward's lse, separate dlogits
 *        copy_same cudaMemcpyAsync of the case's logits into a dlogits buffer (informational, see P_COPY)
 *      Floor = bytes that must move / copy BW:
 *        fused, backward : read the logits of non-ignored rows + write all of dlogits
 *        forward         : read the logits of non-ignored rows
 *      (ignored rows' logits are never read, their dlogits rows are written as zeros; with no
 *      ignored rows this is "one read + one write of N*V*dtype").
 *      Reported: ms (median), min, ratio = median / floor, achieved GB/s, ns per token (row),
 *      and for calls under 0.2 ms the GPU time of one launch: a CUDA graph of 100 calls is
 *      replayed and its time / 100 reported (no host launch gaps).
 *   Inputs: random logits ~ N(0, 2^2) (never zeros), targets uniform in [0, V), MEAN reduction.
 *   Inputs are bigger than the 50 MB L2: when one logits buffer is smaller than 256 MiB, the
 *   calls rotate over enough distinct buffers (same content, different memory) that >= 256 MiB
 *   is touched between two uses of a buffer; the dlogits buffers rotate likewise.
 *   In-place runs overwrite the logits with the gradient, so every rep after the first of a
 *   buffer runs on gradient values: the memory traffic and the arithmetic are the same, so the
 *   timing is unaffected; they run last so that the other passes see the random logits.
 *
 * Usage: bench_cross_entropy [--case N V dtype]... [--ignore F] [--smoothing F] [--offset] [--weight]
 *                            [--reps R] [--warmup W] [--csv FILE] [--no-graph]
 *   dtype: f32 | f16 | bf16. --case (repeatable) replaces the default grid; --ignore,
 *   --smoothing, --offset (random per-class logit offsets) and --weight (random class weights in [0.5, 1.5):
 *   with --smoothing every element's weight is read, as every element's offset is) apply to the --case entries. --csv appends one row per (case, pass):
 *   op,pass,dtype,N,V,options,ms,ratio_to_floor,gbps,copy_gbps,gpu,commit,date
 *   (commit from $FL_COMMIT, else "unknown"; date UTC ISO-8601).
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusedloss.h"
#include "bench_util.h"



#define ROTATE_BYTES ((size_t)256 << 20) /* distinct bytes touched between two uses of a buffer */
#define GRAPH_CALLS 100

typedef struct {
    int64_t N, V;
    fl_dtype dt;
    double ignore;  /* fraction of rows with target = ignore_index */
    float eps;      /* label smoothing */
    int offset;     /* per-class logit offsets (opts->logit_offset, values in [-2, 2)) */
    int weight;     /* class weights (opts->weight, values in [0.5, 1.5)) */
} bcase;

/* P_COPY ("copy_same", not an API call): cudaMemcpyAsync of this case's logits into its dlogits buffer, the
 * same bytes as the fused pass without ignored rows, to show how much of a small case's ratio a plain device
 * copy of that size pays too (launch, ramp-up and tail are a larger share of a 0.1 ms call than of the 2 GiB
 * copy that sets the floor). Informational: the floor and the targets stay bytes / copy BW. */
enum { P_FUSED = 0, P_FUSED_IP = 1, P_FWD = 2, P_BWD = 3, P_COPY = 4, NPASS = 5 };
static const char* pass_name[NPASS] = {"fused", "fused_ip", "forward", "backward", "copy_same"};
/* run order: in place last (it destroys the logits) */
static const int pass_order[NPASS] = {P_FWD, P_BWD, P_FUSED, P_COPY, P_FUSED_IP};

static int g_reps = 50, g_warmup = 5, g_graph = 1;
static cudaStream_t g_stream;



/* ~2 * N(0, 1) (Irwin-Hall of four 16-bit uniforms); never exactly 0 after the nudge */
static float rnd_logit(uint64_t i) {
    uint64_t h = mix64(i * 0x2545f4914f6cdd1dULL + 12345);
    double s = (double)(h & 0xffffu) + (double)((h >> 16) & 0xffffu) + (double)((h >> 32) & 0xffffu) +
               (double)(h >> 48);
    float x = (float)((s - 2.0 * 65535.0) * (2.0 * 1.7320508075688772 / 65535.0));
    return x == 0.0f ? 0.03125f : x;
}


/* ------------------------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------------------------ */
typedef struct {
    int64_t N, V;
    fl_dtype dt;
    int R;                 /* rotating buffers */
    size_t stride;         /* bytes between buffers */
    unsigned char *x, *dl; /* R logits buffers, R dlogits buffers */
    void* tgt;
    float *loss, *lse;
    void* ws;
    size_t ws_bytes;
    fl_ce_options o;
} ctx_t;

static fl_status launch(const ctx_t* c, int pass, int k) {
    unsigned char* x = c->x + (size_t)(k % c->R) * c->stride;
    unsigned char* dl = c->dl ? c->dl + (size_t)(k % c->R) * c->stride : NULL;
    switch (pass) {
        case P_FUSED:
            return fl_cross_entropy_fused_cuda(c->loss, NULL, dl, x, c->tgt, NULL, 1.0f, c->N, c->V, c->V, c->dt,
                                               FL_INDEX_I64, &c->o, c->ws, c->ws_bytes, g_stream);
        case P_FUSED_IP:
            return fl_cross_entropy_fused_cuda(c->loss, NULL, x, x, c->tgt, NULL, 1.0f, c->N, c->V, c->V, c->dt,
                                               FL_INDEX_I64, &c->o, c->ws, c->ws_bytes, g_stream);
        case P_FWD:
            return fl_cross_entropy_forward_cuda(c->loss, c->lse, x, c->tgt, c->N, c->V, c->V, c->dt, FL_INDEX_I64,
                                                 &c->o, c->ws, c->ws_bytes, g_stream);
        case P_BWD:
            return fl_cross_entropy_backward_cuda(dl, x, c->tgt, c->lse, NULL, 1.0f, c->N, c->V, c->V, c->dt,
                                                  FL_INDEX_I64, &c->o, c->ws, c->ws_bytes, g_stream);
        case P_COPY:
            return cudaMemcpyAsync(dl, x, (size_t)c->N * (size_t)c->V * dt_size(c->dt), cudaMemcpyDeviceToDevice,
                                   g_stream) == cudaSuccess ? FL_OK : FL_ERR_CUDA;
    }
    return FL_ERR_INTERNAL;
}

/* median and min ms of g_reps timed calls; *k is the running buffer index */
static void time_pass(const ctx_t* c, int pass, int* k, float* med, float* mn) {
    for (int w = 0; w < g_warmup; w++) FLK(launch(c, pass, (*k)++));
    cudaEvent_t* e = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * 2 * (size_t)g_reps);
    float* ms = (float*)malloc(sizeof(float) * (size_t)g_reps);
    for (int r = 0; r < 2 * g_reps; r++) CK(cudaEventCreate(&e[r]));
    CK(cudaStreamSynchronize(g_stream));
    for (int r = 0; r < g_reps; r++) {
        CK(cudaEventRecord(e[2 * r], g_stream));
        FLK(launch(c, pass, (*k)++));
        CK(cudaEventRecord(e[2 * r + 1], g_stream));
    }
    CK(cudaStreamSynchronize(g_stream));
    for (int r = 0; r < g_reps; r++) CK(cudaEventElapsedTime(&ms[r], e[2 * r], e[2 * r + 1]));
    for (int r = 0; r < 2 * g_reps; r++) CK(cudaEventDestroy(e[r]));
    *med = median(ms, g_reps);
    *mn = ms[0];
    free(e);
    free(ms);
}

/* GPU time of one call: a graph of GRAPH_CALLS calls, median of 20 replays / GRAPH_CALLS */
static float graph_ms_per_call(const ctx_t* c, int pass, int* k) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamSynchronize(g_stream));
    CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < GRAPH_CALLS; i++) {
        fl_status s = launch(c, pass, (*k)++);
        if (s != FL_OK) {
            cudaGraph_t dummy;
            (void)cudaStreamEndCapture(g_stream, &dummy);
            (void)cudaGetLastError();
            fprintf(stderr, "graph capture of %s failed: %s\n", pass_name[pass], fl_last_error());
            return NAN;
        }
    }
    CK(cudaStreamEndCapture(g_stream, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float ms = bench_graph_replay_ms(ge, g_stream, 20, NULL);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms / (float)GRAPH_CALLS;
}

typedef struct {
    float ms, mn, graph_ms;
    double floor_ms, ratio, gbps;
    int ok;
} result_t;

static void options_str(const bcase* b, char* s, size_t n) {
    int k = snprintf(s, n, "mean");
    if (b->ignore > 0) k += snprintf(s + k, n - (size_t)k, ";ignore=%g", b->ignore);
    if (b->eps > 0) k += snprintf(s + k, n - (size_t)k, ";smoothing=%g", (double)b->eps);
    if (b->offset) k += snprintf(s + k, n - (size_t)k, ";logit_offset");
    if (b->weight) k += snprintf(s + k, n - (size_t)k, ";weight");
}

/* returns 0 if the case could not run (memory) */
static int run_case(const bcase* b, double copy_gbps, result_t res[NPASS]) {
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.N = b->N; c.V = b->V; c.dt = b->dt;
    const size_t es = dt_size(b->dt);
    const size_t B = (size_t)b->N * (size_t)b->V * es;
    c.stride = (B + 255) & ~(size_t)255;
    c.R = B >= ROTATE_BYTES ? 1 : (int)((ROTATE_BYTES + B - 1) / B);
    /* memory: logits + dlogits sets */
    if (cudaMalloc((void**)&c.x, c.stride * (size_t)c.R) != cudaSuccess ||
        cudaMalloc((void**)&c.dl, c.stride * (size_t)c.R) != cudaSuccess) {
        (void)cudaGetLastError();
        if (c.x) CK(cudaFree(c.x));
        fprintf(stderr, "case %lldx%lld %s: not enough device memory\n", (long long)b->N, (long long)b->V,
                dt_name(b->dt));
        return 0;
    }
    /* random logits: one host buffer, copied to every rotating buffer */
    {
        unsigned char* h = (unsigned char*)malloc(B);
        if (!h) { fprintf(stderr, "host malloc(%zu) failed\n", B); exit(1); }
        const int64_t n = b->N * b->V;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (int64_t i = 0; i < n; i++) {
            float v = rnd_logit((uint64_t)i);
            if (b->dt == FL_DTYPE_F32) ((float*)h)[i] = v;
            else if (b->dt == FL_DTYPE_F16) ((uint16_t*)h)[i] = f32_to_f16(v);
            else ((uint16_t*)h)[i] = f32_to_bf16(v);
        }
        CK(cudaMemcpy(c.x, h, B, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize()); /* a pageable copy may still be in flight; the next copies use g_stream */
        for (int r = 1; r < c.R; r++)
            CK(cudaMemcpyAsync(c.x + (size_t)r * c.stride, c.x, B, cudaMemcpyDeviceToDevice, g_stream));
        CK(cudaMemsetAsync(c.dl, 0x3c, c.stride * (size_t)c.R, g_stream));
        free(h);
    }
    /* targets (int64), a fraction set to ignore_index */
    int64_t n_active = 0;
    {
        int64_t* t = (int64_t*)malloc((size_t)b->N * 8);
        for (int64_t i = 0; i < b->N; i++) {
            uint64_t h = mix64((uint64_t)i ^ 0xabcdefULL);
            int ign = (double)(h >> 11) * (1.0 / 9007199254740992.0) < b->ignore;
            t[i] = ign ? -100 : (int64_t)(mix64(h) % (uint64_t)b->V);
            n_active += !ign;
        }
        CK(cudaMalloc(&c.tgt, (size_t)b->N * 8));
        CK(cudaMemcpy(c.tgt, t, (size_t)b->N * 8, cudaMemcpyHostToDevice));
        free(t);
    }
    CK(cudaMalloc((void**)&c.loss, (size_t)b->N * 4));
    CK(cudaMalloc((void**)&c.lse, (size_t)b->N * 4));
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    o.label_smoothing = b->eps;
    float* d_off = NULL;
    if (b->offset) {
        float* h = (float*)malloc((size_t)b->V * 4);
        for (int64_t j = 0; j < b->V; j++) h[j] = (float)((double)(mix64((uint64_t)j ^ 0x0ff5ULL) >> 11) *
                                                         (4.0 / 9007199254740992.0) - 2.0);
        CK(cudaMalloc((void**)&d_off, (size_t)b->V * 4));
        CK(cudaMemcpy(d_off, h, (size_t)b->V * 4, cudaMemcpyHostToDevice));
        free(h);
        o.logit_offset = d_off;
    }
    float* d_w = NULL;
    if (b->weight) {
        float* h = (float*)malloc((size_t)b->V * 4);
        for (int64_t j = 0; j < b->V; j++) h[j] = (float)((double)(mix64((uint64_t)j ^ 0x3e16ULL) >> 11) *
                                                         (1.0 / 9007199254740992.0) + 0.5);
        CK(cudaMalloc((void**)&d_w, (size_t)b->V * 4));
        CK(cudaMemcpy(d_w, h, (size_t)b->V * 4, cudaMemcpyHostToDevice));
        free(h);
        o.weight = d_w;
    }
    c.o = o;
    FLK(fl_cross_entropy_workspace_size(&c.ws_bytes, b->N, b->V, b->dt, &c.o));
    CK(cudaMalloc(&c.ws, c.ws_bytes ? c.ws_bytes : 256));
    CK(cudaDeviceSynchronize());

    const double rd = (double)n_active * (double)b->V * (double)es, wr = (double)B;
    int k = 0;
    for (int q = 0; q < NPASS; q++) {
        const int p = pass_order[q];
        result_t* r = &res[p];
        if (p == P_FUSED_IP) k = 0; /* restart the rotation: each buffer's first in-place call sees random data */
        time_pass(&c, p, &k, &r->ms, &r->mn);
        const double bytes = p == P_FWD ? rd : (p == P_COPY ? 2.0 * (double)B : rd + wr);
        r->floor_ms = bytes / (copy_gbps * 1e6);
        r->ratio = r->ms / r->floor_ms;
        r->gbps = bytes / ((double)r->ms * 1e6);
        r->graph_ms = NAN;
        if (g_graph && r->ms < 0.2f) r->graph_ms = graph_ms_per_call(&c, p, &k);
        r->ok = 1;
    }
    CK(cudaFree(c.x)); CK(cudaFree(c.dl)); CK(cudaFree(c.tgt)); CK(cudaFree(c.loss)); CK(cudaFree(c.lse));
    CK(cudaFree(c.ws));
    if (d_off) CK(cudaFree(d_off));
    if (d_w) CK(cudaFree(d_w));
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
static void usage(void) {
    fprintf(stderr,
            "usage: bench_cross_entropy [--case N V dtype]... [--ignore F] [--smoothing F] [--offset] [--weight]\n"
            "                           [--reps R] [--warmup W] [--csv FILE] [--no-graph]\n");
}

int main(int argc, char** argv) {
    bcase cases[64];
    int ncases = 0;
    double ignore = 0.0;
    float eps = 0.0f;
    int offset = 0, weight = 0;
    const char* csv = NULL;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--case") && a + 3 < argc && ncases < 64) {
            bcase* b = &cases[ncases];
            b->N = atoll(argv[a + 1]);
            b->V = atoll(argv[a + 2]);
            if (b->N < 1 || b->V < 1 || !parse_dt(argv[a + 3], &b->dt)) { usage(); return 2; }
            b->ignore = 0.0; b->eps = 0.0f; b->offset = 0; b->weight = 0;
            ncases++;
            a += 3;
        } else if (!strcmp(argv[a], "--ignore") && a + 1 < argc) ignore = atof(argv[++a]);
        else if (!strcmp(argv[a], "--smoothing") && a + 1 < argc) eps = (float)atof(argv[++a]);
        else if (!strcmp(argv[a], "--offset")) offset = 1;
        else if (!strcmp(argv[a], "--weight")) weight = 1;
        else if (!strcmp(argv[a], "--reps") && a + 1 < argc) g_reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--warmup") && a + 1 < argc) g_warmup = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--csv") && a + 1 < argc) csv = argv[++a];
        else if (!strcmp(argv[a], "--no-graph")) g_graph = 0;
        else { usage(); return 2; }
    }
    if (g_reps < 1) g_reps = 1;
    if (g_warmup < 0) g_warmup = 0;
    if (ncases == 0) {
        static const struct { int64_t N, V; fl_dtype dt; double ign; float eps; int off; } def[] = {
            {8192, 128256, FL_DTYPE_BF16, 0.0, 0.0f, 0}, {4096, 50257, FL_DTYPE_F32, 0.0, 0.0f, 0},
            {2048, 32000, FL_DTYPE_F16, 0.0, 0.0f, 0},   {16384, 32000, FL_DTYPE_BF16, 0.0, 0.0f, 0},
            {4096, 256000, FL_DTYPE_BF16, 0.0, 0.0f, 0}, {128, 1000, FL_DTYPE_F32, 0.0, 0.0f, 0},
            {8192, 128256, FL_DTYPE_BF16, 0.25, 0.0f, 0}, {8192, 128256, FL_DTYPE_BF16, 0.0, 0.1f, 0},
            {8192, 128256, FL_DTYPE_BF16, 0.0, 0.0f, 1},
            /* many short rows (segmentation's 19 classes over 8x512x512 positions; a 10-class head):
             * per-row costs the long-row shapes above never show (H200 runs 35-39) */
            {2097152, 19, FL_DTYPE_F32, 0.1, 0.0f, 0},   {1000000, 10, FL_DTYPE_BF16, 0.0, 0.0f, 0}};
        for (size_t i = 0; i < sizeof def / sizeof def[0]; i++) {
            cases[ncases].N = def[i].N; cases[ncases].V = def[i].V; cases[ncases].dt = def[i].dt;
            cases[ncases].ignore = def[i].ign; cases[ncases].eps = def[i].eps; cases[ncases].offset = def[i].off; cases[ncases].weight = 0;
            ncases++;
        }
    } else {
        for (int i = 0; i < ncases; i++) { cases[i].ignore = ignore; cases[i].eps = eps; cases[i].offset = offset; cases[i].weight = weight; }
    }

    struct cudaDeviceProp prop;
    char commit[64], date[32];
    double copy_gbps = 0.0;
    const int rc = bench_begin(&g_stream, &prop, &copy_gbps, commit, sizeof commit, date, sizeof date);
    if (rc >= 0) return rc;
    printf("reps %d (median), warm-up %d; floor = bytes / copy BW; graph = GPU time of one call in a graph of %d\n\n",
           g_reps, g_warmup, GRAPH_CALLS);
    printf("%-34s %-9s %9s %9s %9s %7s %8s %9s %10s\n", "case", "pass", "ms(med)", "ms(min)", "floor ms", "ratio",
           "GB/s", "ns/token", "graph us");

    FILE* f = NULL;
    if (csv) {
        f = fopen(csv, "a");
        if (!f) { fprintf(stderr, "cannot open %s\n", csv); return 1; }
        fseek(f, 0, SEEK_END);
        if (ftell(f) == 0) fprintf(f, "op,pass,dtype,N,V,options,ms,ratio_to_floor,gbps,copy_gbps,gpu,commit,date\n");
    }
    char summary[64][200];
    int nsum = 0;
    for (int i = 0; i < ncases; i++) {
        const bcase* b = &cases[i];
        char opt[64], name[96];
        options_str(b, opt, sizeof opt);
        snprintf(name, sizeof name, "%lldx%lld %s %s", (long long)b->N, (long long)b->V, dt_name(b->dt), opt);
        result_t res[NPASS];
        memset(res, 0, sizeof res);
        if (!run_case(b, copy_gbps, res)) { printf("%-34s (skipped: memory)\n", name); continue; }
        for (int p = 0; p < NPASS; p++) {
            const result_t* r = &res[p];
            char gs[16] = "-";
            if (!isnan(r->graph_ms)) snprintf(gs, sizeof gs, "%.2f", (double)r->graph_ms * 1e3);
            printf("%-34s %-9s %9.4f %9.4f %9.4f %7.2f %8.0f %9.2f %10s\n", p == 0 ? name : "", pass_name[p],
                   (double)r->ms, (double)r->mn, r->floor_ms, r->ratio, r->gbps, (double)r->ms * 1e6 / (double)b->N,
                   gs);
            if (f) {
                fprintf(f, "cross_entropy,%s,%s,%lld,%lld,%s,%.5f,%.4f,%.1f,%.1f,%s,%s,%s\n", pass_name[p],
                        dt_name(b->dt), (long long)b->N, (long long)b->V, opt, (double)r->ms, r->ratio, r->gbps,
                        copy_gbps, prop.name, commit, date);
                if (!isnan(r->graph_ms)) {
                    const double ratio_g = r->graph_ms / r->floor_ms, gb = r->gbps * r->ms / r->graph_ms;
                    fprintf(f, "cross_entropy,%s_graph,%s,%lld,%lld,%s,%.6f,%.4f,%.1f,%.1f,%s,%s,%s\n", pass_name[p],
                            dt_name(b->dt), (long long)b->N, (long long)b->V, opt, (double)r->graph_ms, ratio_g, gb,
                            copy_gbps, prop.name, commit, date);
                }
            }
        }
        fflush(stdout);
        if (nsum < 64)
            snprintf(summary[nsum++], sizeof summary[0],
                     "SUMMARY %-34s fused %.2fx  fused_ip %.2fx  fwd %.2fx  bwd %.2fx  (copy_same %.2fx)", name,
                     res[P_FUSED].ratio, res[P_FUSED_IP].ratio, res[P_FWD].ratio, res[P_BWD].ratio, res[P_COPY].ratio);
    }
    if (f) fclose(f);
    printf("\n(ratio = median / floor; 1.00 = as fast as the bytes at the 2 GiB copy's bandwidth; copy_same: a device\n"
           " copy of exactly this case's logits, timed the same way, not a target)\n");
    printf("SUMMARY copy BW %.0f GB/s on %s\n", copy_gbps, prop.name);
    for (int i = 0; i < nsum; i++) printf("%s\n", summary[i]);
    return 0;
}
