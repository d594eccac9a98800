/* bench_util.h — helpers shared by the C benchmarks (bench_cross_entropy.c, bench_gelu.c):
 * error-checking macros, dtype names and host conversions, a counter-based hash for random
 * inputs, the median, and the device-to-device copy bandwidth that every floor is measured
 * against. Header-only (static functions): each benchmark is one translation unit.
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_BENCH_UTIL_H
#define FL_BENCH_UTIL_H

#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusedloss.h"

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "CUDA error: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#define FLK(x)                                                                                       \
    do {                                                                                             \
        fl_status s_ = (x);                                                                          \
        if (s_ != FL_OK) {                                                                           \
            fprintf(stderr, "fusedloss error: %s: %s: %s (%s:%d)\n", #x, fl_status_string(s_),       \
                    fl_last_error(), __FILE__, __LINE__);                                            \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static size_t dt_size(fl_dtype d) { return d == FL_DTYPE_F32 ? 4 : 2; }
static const char* dt_name(fl_dtype d) { return d == FL_DTYPE_F32 ? "f32" : d == FL_DTYPE_F16 ? "f16" : "bf16"; }
static int parse_dt(const char* s, fl_dtype* d) {
    if (!strcmp(s, "f32") || !strcmp(s, "fp32") || !strcmp(s, "float32")) { *d = FL_DTYPE_F32; return 1; }
    if (!strcmp(s, "f16") || !strcmp(s, "fp16") || !strcmp(s, "float16")) { *d = FL_DTYPE_F16; return 1; }
    if (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")) { *d = FL_DTYPE_BF16; return 1; }
    return 0;
}

/* host conversions, round to nearest even */
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static uint16_t f32_to_f16(float f) { /* |f| < 65504, normal or subnormal range */
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a < 0x38800000u) {
        float v;
        memcpy(&v, &a, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(v * 16777216.0f));
    }
    uint32_t h = (((a >> 23) - 112u) << 10) | ((a & 0x7fffffu) >> 13);
    uint32_t r = a & 0x1fffu;
    if (r > 0x1000u || (r == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int cmp_float(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return x < y ? -1 : x > y;
}
static float median(float* v, int n) {
    qsort(v, (size_t)n, sizeof(float), cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

/* device-to-device copy bandwidth (bytes read + written), median of 30 copies of 2 GiB */
static double copy_bandwidth_gbps(cudaStream_t stream) {
    const size_t bytes = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "copy bandwidth: cannot allocate 2 x 2 GiB\n");
        exit(1);
    }
    CK(cudaMemsetAsync(a, 0x3c, bytes, stream)); /* non-zero content */
    enum { REPS = 30 };
    cudaEvent_t e0[REPS], e1[REPS];
    for (int k = 0; k < REPS; k++) { CK(cudaEventCreate(&e0[k])); CK(cudaEventCreate(&e1[k])); }
    for (int k = 0; k < 3; k++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
    for (int k = 0; k < REPS; k++) {
        CK(cudaEventRecord(e0[k], stream));
        CK(cudaMemcpyAsync(k & 1 ? a : b, k & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, stream));
        CK(cudaEventRecord(e1[k], stream));
    }
    CK(cudaStreamSynchronize(stream));
    float ms[REPS];
    for (int k = 0; k < REPS; k++) {
        CK(cudaEventElapsedTime(&ms[k], e0[k], e1[k]));
        CK(cudaEventDestroy(e0[k]));
        CK(cudaEventDestroy(e1[k]));
    }
    float med = median(ms, REPS);
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)bytes / ((double)med * 1e6);
}

/* n random elements of dt on the device, uniform in (-s, s) from a counter hash of (seed, i), never 0
 * (an exact 0 becomes s * 1e-3); exits on failure. */
static inline void* bench_dev_random(size_t n, fl_dtype dt, float s, uint64_t seed) {
    const size_t es = dt_size(dt);
    void* h = malloc(n * es);
    if (!h) { fprintf(stderr, "host OOM\n"); exit(1); }
    for (size_t i = 0; i < n; i++) {
        uint64_t z = mix64(seed * 0x9e3779b97f4a7c15ULL + i);
        float u = ((float)(z >> 40) + 0.5f) * (1.0f / 16777216.0f);  /* (0, 1) */
        float x = s * (2.0f * u - 1.0f);
        if (x == 0.0f) x = s * 1e-3f;
        if (dt == FL_DTYPE_F32) ((float*)h)[i] = x;
        else ((uint16_t*)h)[i] = dt == FL_DTYPE_BF16 ? f32_to_bf16(x) : f32_to_f16(x);
    }
    void* d = NULL;
    CK(cudaMalloc(&d, n * es));
    CK(cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* Median ms of `reps` calls of f(arg) on `stream` (CUDA events around each call), after `warmup`
 * untimed calls. */
static inline float bench_time_median(void (*f)(void*), void* arg, cudaStream_t stream, int warmup, int reps) {
    for (int k = 0; k < warmup; k++) f(arg);
    float* ms = (float*)malloc(sizeof(float) * (size_t)reps);
    if (!ms) { fprintf(stderr, "host OOM\n"); exit(1); }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int k = 0; k < reps; k++) {
        CK(cudaEventRecord(e0, stream));
        f(arg);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms[k], e0, e1));
    }
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    float m = median(ms, reps);
    free(ms);
    return m;
}

/* Median ms of `reps` replays of an instantiated CUDA graph on `stream` (CUDA events around each
 * replay), after one untimed replay; *min_ms (if not NULL) gets the fastest. */
static inline float bench_graph_replay_ms(cudaGraphExec_t ge, cudaStream_t stream, int reps, float* min_ms) {
    cudaEvent_t* e = (cudaEvent_t*)malloc(sizeof(cudaEvent_t) * 2 * (size_t)reps);
    float* ms = (float*)malloc(sizeof(float) * (size_t)reps);
    if (!e || !ms) { fprintf(stderr, "host OOM\n"); exit(1); }
    CK(cudaGraphLaunch(ge, stream)); /* warm-up */
    for (int r = 0; r < 2 * reps; r++) CK(cudaEventCreate(&e[r]));
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e[2 * r], stream));
        CK(cudaGraphLaunch(ge, stream));
        CK(cudaEventRecord(e[2 * r + 1], stream));
    }
    CK(cudaStreamSynchronize(stream));
    for (int r = 0; r < reps; r++) CK(cudaEventElapsedTime(&ms[r], e[2 * r], e[2 * r + 1]));
    for (int r = 0; r < 2 * reps; r++) CK(cudaEventDestroy(e[r]));
    const float m = median(ms, reps);  /* sorts ms */
    if (min_ms) *min_ms = ms[0];
    free(e);
    free(ms);
    return m;
}

/* The start every benchmark makes: a CUDA device and backend (else "SKIP" and return 0, or
 * return 1 without a CUDA backend), a non-blocking stream, the commit (FL_COMMIT) and UTC date,
 * the device's properties, the copy bandwidth, and the header lines with them. Returns -1 when the benchmark should run. */
static int bench_begin(cudaStream_t* stream, struct cudaDeviceProp* prop, double* copy_gbps, char* commit,
                       size_t ncommit, char* date, size_t ndate) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    if (!fl_cuda_built()) {
        printf("this libfusedloss has no CUDA backend (fl_cuda_built() == 0)\n");
        return 1;
    }
    CK(cudaGetDeviceProperties(prop, 0));
    CK(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
    const char* c = getenv("FL_COMMIT");
    snprintf(commit, ncommit, "%s", (c && c[0]) ? c : "unknown");
    time_t now = time(NULL);
    strftime(date, ndate, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    *copy_gbps = copy_bandwidth_gbps(*stream);
    printf("fusedloss %s | %s (%d SMs, L2 %d MB) | commit %s | %s\n", fl_version_string(), prop->name,
           prop->multiProcessorCount, prop->l2CacheSize >> 20, commit, date);
    printf("copy BW (D2D cudaMemcpyAsync 2 GiB, read+write, median of 30): %.0f GB/s\n", *copy_gbps);
    return -1;
}

#endif /* FL_BENCH_UTIL_H */
