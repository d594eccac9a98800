/* bench_gelu.c — GeLU (+ bias) benchmark over the PUBLIC API (never an internal kernel).
 * SPDX-License-Identifier: MIT
 *
 * In one run, on one GPU:
 *   1. device-to-device copy bandwidth: cudaMemcpyAsync of a 2 GiB buffer, median of 30;
 *      bytes = read + write. This is the floor's bandwidth ("copy BW").
 *   2. per case (N, F, dtype, approx), each pass timed with CUDA events around every call, after
 *      a warm-up; median and min of --reps (default 50) calls:
 *        forward    fl_gelu_forward_cuda(y, x, bias)               floor: read x + bias, write y
 *        bwd_dbias  fl_gelu_backward_cuda(dx, dbias, dy, x, bias)   floor: read x, dy, bias; write dx, dbias
 *        bwd        the same without dbias (what gelu_backward alone does; shows what dbias costs)
 *        copy       cudaMemcpyAsync of x into y: the forward's bytes moved by the driver's own copy,
 *                   timed the same way (a launch + ramp + tail at this size: what the forward's
 *                   ratio is to be read against; at 8192 x 3072 the copy is not at the floor)
 *      Floor = those bytes / copy BW. Reported: ms (median), min, floor ms, ratio = median /
 *      floor, achieved GB/s (floor bytes / median).
 *   Inputs: x ~ 2*N(0,1)-like (Irwin-Hall), dy the same, bias ~ 0.5*; never exactly zero. Every
 *   buffer set (x, dy, out) is rotated so that >= 512 MiB of distinct memory is touched between
 *   two uses of one set (the L2 is 50 MB): timings are from HBM, not L2.
 *   The bias is the activation's dtype; dbias the same.
 *
 * Usage: bench_gelu [--case N F dtype approx]... [--reps R] [--warmup W] [--csv FILE]
 *   dtype: f32 | f16 | bf16; approx: tanh | erf. Default grid: N = 8192, F = 3072 and 16384,
 *   bf16 and f32, tanh and erf. --csv appends one row per (case, pass):
 *   op,pass,dtype,N,F,approx,ms,ratio_to_floor,gbps,copy_gbps,gpu,commit,date
 *   (commit from $FL_COMMIT, else "unknown"). Run time on an H200: ~15 s (mostly input setup).
 *   At the end one "SUMMARY <case> fwd R bwd_dbias R bwd R (knobs)" line per case (grep SUMMARY).
 *   The library's FUSEDLOSS_GELU_* knobs (src/cuda/gelu.cu) are read from the environment once:
 *   run the binary once per setting, e.g. FUSEDLOSS_GELU_EXACT16=1 build/bench_gelu.
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



#define ROTATE_BYTES ((size_t)512 << 20)
#define MAX_SETS 8

typedef struct { int64_t N, F; fl_dtype dt; fl_gelu_approx ap; } bcase;
enum { P_FWD = 0, P_BWD_DB = 1, P_BWD = 2, P_COPY = 3, NPASS = 4 };
static const char* pass_name[NPASS] = {"forward", "bwd_dbias", "bwd", "copy"};

static int g_reps = 50, g_warmup = 10;
static cudaStream_t g_stream;



/* ~scale * N(0, 1) (Irwin-Hall of four 16-bit uniforms), |x| >= 2^-5 * scale: never zero */
static float rnd(uint64_t i, float scale) {
    uint64_t h = mix64(i * 0x2545f4914f6cdd1dULL + 777);
    double s = (double)(h & 0xffffu) + (double)((h >> 16) & 0xffffu) + (double)((h >> 32) & 0xffffu) +
               (double)(h >> 48);
    float x = (float)((s - 2.0 * 65535.0) * (1.7320508075688772 / 65535.0));
    if (fabsf(x) < 0.03125f) x = x < 0 ? -0.03125f : 0.03125f;
    return scale * x;
}

static void fill(void* h, int64_t n, fl_dtype dt, uint64_t salt, float scale) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < n; i++) {
        float v = rnd((uint64_t)i ^ (salt << 40), scale);
        if (dt == FL_DTYPE_F32) ((float*)h)[i] = v;
        else if (dt == FL_DTYPE_BF16) ((uint16_t*)h)[i] = f32_to_bf16(v);
        else ((uint16_t*)h)[i] = f32_to_f16(v);
    }
}



typedef struct { float ms, mn; double floor_ms, ratio, gbps; } result_t;

typedef struct {
    int nsets;
    void *x[MAX_SETS], *dy[MAX_SETS], *out[MAX_SETS];
    void *bias, *dbias, *ws;
    size_t wsb;
} bufs_t;

static void call(int pass, const bcase* b, bufs_t* s, int k) {
    const int64_t N = b->N, F = b->F;
    if (pass == P_COPY)
        CK(cudaMemcpyAsync(s->out[k], s->x[k], (size_t)N * (size_t)F * dt_size(b->dt), cudaMemcpyDeviceToDevice,
                           g_stream));
    else if (pass == P_FWD)
        FLK(fl_gelu_forward_cuda(s->out[k], s->x[k], s->bias, N, F, F, F, b->dt, b->dt, b->ap, g_stream));
    else
        FLK(fl_gelu_backward_cuda(s->out[k], pass == P_BWD_DB ? s->dbias : NULL, s->dy[k], s->x[k], s->bias, N, F, F,
                                  F, F, b->dt, b->dt, b->ap, s->ws, s->wsb, g_stream));
}

static void run_case(const bcase* b, double copy_gbps, result_t res[NPASS]) {
    const size_t es = dt_size(b->dt), mat = (size_t)b->N * (size_t)b->F * es, vb = (size_t)b->F * es;
    bufs_t s;
    memset(&s, 0, sizeof s);
    s.nsets = (int)((ROTATE_BYTES + 3 * mat - 1) / (3 * mat)) + 1;
    if (s.nsets < 2) s.nsets = 2;
    if (s.nsets > MAX_SETS) s.nsets = MAX_SETS;
    void* h = malloc(mat > vb ? mat : vb);
    if (!h) { fprintf(stderr, "out of host memory\n"); exit(1); }
    for (int k = 0; k < s.nsets; k++) {
        CK(cudaMalloc(&s.x[k], mat));
        CK(cudaMalloc(&s.dy[k], mat));
        CK(cudaMalloc(&s.out[k], mat));
    }
    fill(h, b->N * b->F, b->dt, 1, 2.0f);
    for (int k = 0; k < s.nsets; k++) CK(cudaMemcpy(s.x[k], h, mat, cudaMemcpyHostToDevice));
    fill(h, b->N * b->F, b->dt, 2, 1.0f);
    for (int k = 0; k < s.nsets; k++) CK(cudaMemcpy(s.dy[k], h, mat, cudaMemcpyHostToDevice));
    fill(h, b->F, b->dt, 3, 0.5f);
    CK(cudaMalloc(&s.bias, vb));
    CK(cudaMalloc(&s.dbias, vb));
    CK(cudaMemcpy(s.bias, h, vb, cudaMemcpyHostToDevice));
    FLK(fl_gelu_workspace_size(&s.wsb, b->N, b->F, b->dt));
    CK(cudaMalloc(&s.ws, s.wsb));
    CK(cudaMemset(s.ws, 0, s.wsb));  /* the counters must start at zero; the library keeps them so */
    CK(cudaDeviceSynchronize());
    free(h);

    const double mb = (double)mat, bb = (double)vb;
    const double bytes[NPASS] = {2.0 * mb + bb, 3.0 * mb + 2.0 * bb, 3.0 * mb + bb, 2.0 * mb};
    float* ms = (float*)malloc(sizeof(float) * (size_t)g_reps);
    cudaEvent_t* e = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * 2 * (size_t)g_reps);
    for (int r = 0; r < 2 * g_reps; r++) CK(cudaEventCreate(&e[r]));
    for (int p = 0; p < NPASS; p++) {
        int k = 0;
        for (int w = 0; w < g_warmup; w++, k = (k + 1) % s.nsets) call(p, b, &s, k);
        for (int r = 0; r < g_reps; r++, k = (k + 1) % s.nsets) {
            CK(cudaEventRecord(e[2 * r], g_stream));
            call(p, b, &s, k);
            CK(cudaEventRecord(e[2 * r + 1], g_stream));
        }
        CK(cudaStreamSynchronize(g_stream));
        for (int r = 0; r < g_reps; r++) CK(cudaEventElapsedTime(&ms[r], e[2 * r], e[2 * r + 1]));
        result_t* o = &res[p];
        o->ms = median(ms, g_reps);
        o->mn = ms[0];
        o->floor_ms = bytes[p] / (copy_gbps * 1e6);
        o->ratio = (double)o->ms / o->floor_ms;
        o->gbps = bytes[p] / ((double)o->ms * 1e6);
    }
    for (int r = 0; r < 2 * g_reps; r++) CK(cudaEventDestroy(e[r]));
    free(e);
    free(ms);
    for (int k = 0; k < s.nsets; k++) { CK(cudaFree(s.x[k])); CK(cudaFree(s.dy[k])); CK(cudaFree(s.out[k])); }
    CK(cudaFree(s.bias)); CK(cudaFree(s.dbias)); CK(cudaFree(s.ws));
}

int main(int argc, char** argv) {
    bcase cases[64];
    int ncases = 0;
    const char* csv = NULL;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--case") && a + 4 < argc && ncases < 64) {
            bcase* c = &cases[ncases];
            c->N = atoll(argv[a + 1]);
            c->F = atoll(argv[a + 2]);
            if (!parse_dt(argv[a + 3], &c->dt) || (strcmp(argv[a + 4], "tanh") && strcmp(argv[a + 4], "erf"))) {
                fprintf(stderr, "bad --case %s %s %s %s\n", argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4]);
                return 2;
            }
            c->ap = strcmp(argv[a + 4], "tanh") ? FL_GELU_NONE : FL_GELU_TANH;
            ncases++;
            a += 4;
        } else if (!strcmp(argv[a], "--reps") && a + 1 < argc) g_reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--warmup") && a + 1 < argc) g_warmup = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--csv") && a + 1 < argc) csv = argv[++a];
        else {
            fprintf(stderr, "usage: bench_gelu [--case N F dtype tanh|erf]... [--reps R] [--warmup W] [--csv FILE]\n");
            return 2;
        }
    }
    if (g_reps < 1) g_reps = 1;
    if (ncases == 0) {
        static const int64_t Fs[2] = {3072, 16384};
        static const fl_dtype dts[2] = {FL_DTYPE_BF16, FL_DTYPE_F32};
        for (int f = 0; f < 2; f++)
            for (int d = 0; d < 2; d++)
                for (int ap = 1; ap >= 0; ap--) {
                    cases[ncases].N = 8192; cases[ncases].F = Fs[f]; cases[ncases].dt = dts[d];
                    cases[ncases].ap = (fl_gelu_approx)ap;
                    ncases++;
                }
    }
    struct cudaDeviceProp prop;
    char commit[64], date[32];
    double copy_gbps = 0.0;
    const int rc = bench_begin(&g_stream, &prop, &copy_gbps, commit, sizeof commit, date, sizeof date);
    if (rc >= 0) return rc;
    printf("reps %d (median), warm-up %d; floor = bytes that must move / copy BW; targets: forward <= 1.10, "
           "bwd_dbias <= 1.15\n\n", g_reps, g_warmup);
    printf("%-24s %-10s %9s %9s %9s %7s %8s\n", "case", "pass", "ms(med)", "ms(min)", "floor ms", "ratio", "GB/s");
    FILE* f = NULL;
    if (csv) {
        f = fopen(csv, "a");
        if (!f) { fprintf(stderr, "cannot open %s\n", csv); return 1; }
        fseek(f, 0, SEEK_END);
        if (ftell(f) == 0) fprintf(f, "op,pass,dtype,N,F,approx,ms,ratio_to_floor,gbps,copy_gbps,gpu,commit,date\n");
    }
    /* the FUSEDLOSS_GELU_* knobs in effect (read by the library once, at its first call) */
    static const char* const KN[] = {"FUSEDLOSS_GELU_EXACT16", "FUSEDLOSS_GELU_ROWS", "FUSEDLOSS_GELU_DBIAS_ROWS",
                                     "FUSEDLOSS_GELU_TX", "FUSEDLOSS_GELU_GRID_WAVES", "FUSEDLOSS_GELU_DBIAS_CTAS",
                                     "FUSEDLOSS_GELU_DBIAS_RPB", "FUSEDLOSS_GELU_DBIAS_SUM", "FUSEDLOSS_GELU_STREAM", "FUSEDLOSS_GELU_STREAM_WAVES",
                                     "FUSEDLOSS_GELU_STREAM_U"};
    char knob_str[256] = "";
    for (size_t k = 0; k < sizeof KN / sizeof KN[0]; k++) {
        const char* v = getenv(KN[k]);
        if (v && *v) {
            const size_t l = strlen(knob_str);
            snprintf(knob_str + l, sizeof knob_str - l, "%s%s=%s", l ? " " : "", KN[k] + 15, v);
        }
    }
    if (!knob_str[0]) snprintf(knob_str, sizeof knob_str, "defaults");
    printf("knobs: %s\n", knob_str);
    static char summary[64][400];
    int nsum = 0;
    int over = 0;
    for (int i = 0; i < ncases && nsum < 64; i++) {
        const bcase* b = &cases[i];
        char name[64];
        const char* apn = b->ap == FL_GELU_TANH ? "tanh" : "erf";
        snprintf(name, sizeof name, "%lldx%lld %s %s", (long long)b->N, (long long)b->F, dt_name(b->dt), apn);
        result_t res[NPASS];
        run_case(b, copy_gbps, res);
        snprintf(summary[nsum++], sizeof summary[0],
                 "SUMMARY %-22s fwd %.3fx  bwd_dbias %.3fx  bwd %.3fx  same-size copy %.3fx  (%s)", name,
                 res[P_FWD].ratio, res[P_BWD_DB].ratio, res[P_BWD].ratio, res[P_COPY].ratio, knob_str);
        for (int p = 0; p < NPASS; p++) {
            const result_t* r = &res[p];
            const double target = p == P_FWD ? 1.10 : p == P_BWD_DB ? 1.15 : 0.0;
            const int miss = target > 0 && r->ratio > target;
            over += miss;
            printf("%-24s %-10s %9.4f %9.4f %9.4f %7.3f %8.0f%s\n", p == 0 ? name : "", pass_name[p], (double)r->ms,
                   (double)r->mn, r->floor_ms, r->ratio, r->gbps, miss ? "  > target" : "");
            if (f)
                fprintf(f, "gelu,%s,%s,%lld,%lld,%s,%.5f,%.4f,%.1f,%.1f,%s,%s,%s\n", pass_name[p], dt_name(b->dt),
                        (long long)b->N, (long long)b->F, apn, (double)r->ms, r->ratio, r->gbps, copy_gbps,
                        prop.name, commit, date);
        }
        fflush(stdout);
    }
    if (f) fclose(f);
    printf("\n");
    for (int i = 0; i < nsum; i++) printf("%s\n", summary[i]);
    printf("SUMMARY copy BW %.0f GB/s on %s\n", copy_gbps, prop.name);
    printf("\n%d of %d targeted passes above target\n", over, 2 * ncases);
    CK(cudaStreamDestroy(g_stream));
    return 0;
}
