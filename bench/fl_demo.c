/* fl_demo.c — the README's main job: fused cross-entropy (loss + dlogits in one pass) on a
 * real-sized problem, timed, and checked against the unfused computation (log-softmax
 * materialised in an fp32 buffer, then NLL, then softmax - onehot), which this file does itself.
 *   build/fl_demo [N V dtype]      dtype: f32 | f16 | bf16
 * Runs on the GPU when the library has CUDA and a device is present, else on the CPU.
 * Defaults: GPU 8192 x 50257 bf16 (GPT-2 vocabulary); CPU 512 x 50257 f32. */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fusedloss.h"
#ifdef FL_WITH_CUDA
#include <cuda_runtime.h>
#endif

#define CHECK_FL(call)                                                                           \
    do {                                                                                         \
        fl_status s_ = (call);                                                                   \
        if (s_ != FL_OK) {                                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, fl_status_string(s_), fl_last_error()); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {  /* xorshift64*, uniform in [0, 1) */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16); }
static float bf2f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t f2h(float f) {  /* normal range only: demo logits are within +-16 */
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a < 0x38800000u) return (uint16_t)s;
    uint32_t h = ((a >> 23) - 112u) << 10 | ((a & 0x7fffffu) >> 13), r = a & 0x1fffu;
    if (r > 0x1000u || (r == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(s | h);
}
static float h2f(uint16_t h) {
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, s = (uint32_t)(h & 0x8000u) << 16;
    if (e == 0) return (s ? -1.f : 1.f) * m * 5.9604644775390625e-8f;
    uint32_t u = s | (e + 112u) << 23 | m << 13; float f; memcpy(&f, &u, 4); return f;
}

static float get(const void* p, fl_dtype dt, size_t i) {
    return dt == FL_DTYPE_F32 ? ((const float*)p)[i] : dt == FL_DTYPE_BF16 ? bf2f(((const uint16_t*)p)[i]) : h2f(((const uint16_t*)p)[i]);
}

/* the unfused computation, on the host: logp = log_softmax(x) stored in fp32 [N, V];
 * loss = mean(-logp[t]); grad = (exp(logp) - onehot) / N. Returns the loss; fills grad. */
static double unfused(const void* x, const int64_t* t, int64_t N, int64_t V, fl_dtype dt, float* grad) {
    float* logp = malloc((size_t)N * V * sizeof(float));
    double total = 0;
    for (int64_t i = 0; i < N; i++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++) m = fmax(m, get(x, dt, i * V + j));
        for (int64_t j = 0; j < V; j++) s += exp(get(x, dt, i * V + j) - m);
        for (int64_t j = 0; j < V; j++) logp[i * V + j] = (float)(get(x, dt, i * V + j) - m - log(s));
        total += -logp[i * V + t[i]];
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < V; j++)
            grad[i * V + j] = (float)((exp(logp[i * V + j]) - (j == t[i])) / N);
    free(logp);
    return total / N;
}

int main(int argc, char** argv) {
    int use_gpu = 0;
#ifdef FL_WITH_CUDA
    int ndev = 0;
    use_gpu = fl_cuda_built() && cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0;
#endif
    int64_t N = use_gpu ? 8192 : 512, V = 50257;
    fl_dtype dt = use_gpu ? FL_DTYPE_BF16 : FL_DTYPE_F32;
    if (argc >= 3) { N = atoll(argv[1]); V = atoll(argv[2]); }
    if (argc >= 4) dt = !strcmp(argv[3], "bf16") ? FL_DTYPE_BF16 : !strcmp(argv[3], "f16") ? FL_DTYPE_F16 : FL_DTYPE_F32;
    const char* dname = dt == FL_DTYPE_F32 ? "f32" : dt == FL_DTYPE_BF16 ? "bf16" : "f16";
    const size_t es = dt == FL_DTYPE_F32 ? 4 : 2, bytes = (size_t)N * V * es;
    printf("fusedloss %s — fused cross-entropy, N=%lld V=%lld %s on the %s\n", fl_version_string(),
           (long long)N, (long long)V, dname, use_gpu ? "GPU" : "CPU");

    void* x = malloc(bytes); void* dx = malloc(bytes);
    int64_t* t = malloc(N * sizeof(int64_t));
    for (size_t k = 0; k < (size_t)N * V; k++) {
        float v = (float)(4.0 * (urand() - 0.5) + 2.0 * (urand() - 0.5));
        if (dt == FL_DTYPE_F32) ((float*)x)[k] = v;
        else ((uint16_t*)x)[k] = dt == FL_DTYPE_BF16 ? f2bf(v) : f2h(v);
    }
    for (int64_t i = 0; i < N; i++) t[i] = (int64_t)(urand() * V);
    fl_ce_options opts = FL_CE_OPTIONS_INIT;  /* mean over rows, like F.cross_entropy */
    size_t ws_bytes = 0;
    CHECK_FL(fl_cross_entropy_workspace_size(&ws_bytes, N, V, dt, &opts));
    float loss = NAN, ms = 0;

    if (!use_gpu) {
        void* ws = malloc(ws_bytes);
        double t0 = now();
        CHECK_FL(fl_cross_entropy_fused_cpu(&loss, NULL, dx, x, t, NULL, 1.0f, N, V, V, dt, FL_INDEX_I64, &opts, ws, ws_bytes));
        ms = (float)((now() - t0) * 1e3);
        free(ws);
    }
#ifdef FL_WITH_CUDA
    else {
        void *d_x, *d_dx, *d_ws; int64_t* d_t; float* d_loss;
        cudaEvent_t e0, e1;
        if (cudaMalloc(&d_x, bytes) || cudaMalloc(&d_dx, bytes) || cudaMalloc((void**)&d_t, N * 8) ||
            cudaMalloc((void**)&d_loss, 4) || cudaMalloc(&d_ws, ws_bytes)) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
        cudaMemcpy(d_x, x, bytes, cudaMemcpyHostToDevice);
        cudaMemcpy(d_t, t, N * 8, cudaMemcpyHostToDevice);
        cudaEventCreate(&e0); cudaEventCreate(&e1);
        float best = 1e30f;
        for (int r = 0; r < 20; r++) {  /* first call warms up; report the best of the rest */
            cudaEventRecord(e0, 0);
            CHECK_FL(fl_cross_entropy_fused_cuda(d_loss, NULL, d_dx, d_x, d_t, NULL, 1.0f, N, V, V, dt, FL_INDEX_I64, &opts, d_ws, ws_bytes, NULL));
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float m; cudaEventElapsedTime(&m, e0, e1);
            if (r > 0 && m < best) best = m;
        }
        ms = best;
        cudaMemcpy(&loss, d_loss, 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(dx, d_dx, bytes, cudaMemcpyDeviceToHost);
        if (cudaGetLastError() != cudaSuccess) { fprintf(stderr, "CUDA error\n"); return 1; }
        printf("  one read of logits + one write of dlogits: %.1f MB -> %.0f GB/s\n", 2.0 * bytes / 1e6, 2.0 * bytes / (ms * 1e6));
        cudaFree(d_x); cudaFree(d_dx); cudaFree(d_t); cudaFree(d_loss); cudaFree(d_ws);
    }
#endif
    printf("  fused loss+grad: loss = %.7f   time = %.3f ms\n", loss, ms);

    float* g = malloc((size_t)N * V * sizeof(float));
    double t0 = now();
    double ref = unfused(x, t, N, V, dt, g);
    double ums = (now() - t0) * 1e3;
    double maxd = 0;
    for (size_t k = 0; k < (size_t)N * V; k++) maxd = fmax(maxd, fabs((double)get(dx, dt, k) - g[k]));
    double rel = fabs(loss - ref) / fabs(ref);
    /* tolerance: the unfused path rounds log-probs to fp32; the gradient has the logits' dtype */
    double gtol = dt == FL_DTYPE_F32 ? 1e-6 : 1e-2 / N;
    printf("  unfused (log_softmax buffer on the host, %.0f ms): loss = %.7f\n", ums, ref);
    printf("  check: |loss - unfused| / unfused = %.2e, max |dlogits - unfused grad| = %.2e -> %s\n", rel, maxd,
           (rel < 1e-5 && maxd < gtol) ? "OK" : "MISMATCH");
    free(x); free(dx); free(t); free(g);
    return (rel < 1e-5 && maxd < gtol) ? 0 : 1;
}
