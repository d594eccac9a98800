/* bench_launch_floor: what one small launch costs on this GPU, to read the CE small kernel's
 * GPU time per call (issue 3: 128x1000 fp32 fused fwd+grad, target <= 6 us) against.
 *
 * Each case is a CUDA graph of 100 launches (median of 20 replays / 100), the way
 * bench_cross_entropy times small calls; the inputs rotate over ROT buffers of N x V fp32 (as
 * bench_cross_entropy's do: more bytes than L2 holds over the graph, so a call's reads are not
 * the previous call's lines).
 *   empty          8 CTAs x 512 threads, no cluster, nothing done
 *   empty_cluster  the same as one cluster of 8 CTAs
 *   empty_pdl      the same + programmatic dependent launch (launch_dependents + wait at entry)
 *   touch_pdl      cluster of 8 + PDL; each of the 128 warps reads its 4 KB row (one 16-byte vector
 *                  per lane and step, 8 steps) and writes it back scaled: the row's round trip
 *                  with no reduction, no denominators, no loss
 *   ce_fused       fl_cross_entropy_fused_cuda, MEAN, the library's small kernel
 * Usage: bench_launch_floor [N V]   (default 128 1000)
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "fusedloss.h"
#include "bench_util.h"   /* CK, bench_graph_replay_ms */

enum { CALLS = 100, REPS = 20, ROT = 64 };

__global__ void k_empty(int pdl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
#endif
}

__global__ void k_touch(const float* x, float* y, int N, int V) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    const int lane = threadIdx.x & 31, w = (int)(blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5));
    const int nv = V / 4;
    for (int i = w; i < N; i += (int)(gridDim.x * (blockDim.x >> 5))) {
        const float4* r = (const float4*)(x + (size_t)i * V);
        float4* o = (float4*)(y + (size_t)i * V);
        float4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (lane + 32 * k < nv) v[k] = r[lane + 32 * k];
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (lane + 32 * k < nv) o[lane + 32 * k] = make_float4(v[k].x * 0.5f, v[k].y * 0.5f, v[k].z * 0.5f, v[k].w * 0.5f);
    }
}

static cudaStream_t g_s;

static cudaError_t launch(int which, int cluster, int pdl, const float* x, float* y, int N, int V) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(8, 1, 1);
    cfg.blockDim = dim3(512, 1, 1);
    cfg.stream = g_s;
    cudaLaunchAttribute at[2];
    int na = 0;
    if (cluster) {
        at[na].id = cudaLaunchAttributeClusterDimension;
        at[na].val.clusterDim.x = 8; at[na].val.clusterDim.y = 1; at[na].val.clusterDim.z = 1;
        na++;
    }
    if (pdl) {
        at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[na].val.programmaticStreamSerializationAllowed = 1;
        na++;
    }
    cfg.attrs = at;
    cfg.numAttrs = (unsigned)na;
    if (which == 0) return cudaLaunchKernelEx(&cfg, k_empty, pdl);
    return cudaLaunchKernelEx(&cfg, k_touch, x, y, N, V);
}

int main(int argc, char** argv) {
    const int N = argc > 2 ? atoi(argv[1]) : 128, V = argc > 2 ? atoi(argv[2]) : 1000;
    if (N < 1 || V < 4 || V % 4 || V / 4 > 256) { fprintf(stderr, "N >= 1, V a multiple of 4 in [4, 1024]\n"); return 2; }
    CK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    const size_t ne = (size_t)N * V;
    float *x, *y, *loss;
    int64_t* t;
    CK(cudaMalloc(&x, ne * ROT * sizeof(float)));
    CK(cudaMalloc(&y, ne * ROT * sizeof(float)));
    CK(cudaMalloc(&t, (size_t)N * ROT * sizeof(int64_t)));
    CK(cudaMalloc(&loss, ROT * sizeof(float)));
    {
        float* h = (float*)malloc(ne * ROT * sizeof(float));
        int64_t* ht = (int64_t*)malloc((size_t)N * ROT * sizeof(int64_t));
        uint32_t s = 12345u;
        for (size_t k = 0; k < ne * ROT; k++) { s = s * 1664525u + 1013904223u; h[k] = (float)(s >> 8) * 0x1p-22f - 2.0f; }
        for (size_t k = 0; k < (size_t)N * ROT; k++) { s = s * 1664525u + 1013904223u; ht[k] = (int64_t)((s >> 8) % (uint32_t)V); }
        CK(cudaMemcpy(x, h, ne * ROT * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(t, ht, (size_t)N * ROT * sizeof(int64_t), cudaMemcpyHostToDevice));
        free(h); free(ht);
    }
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    o.reduction = FL_REDUCTION_MEAN;
    size_t wsb = 0;
    void* ws = NULL;
    if (fl_cross_entropy_workspace_size(&wsb, N, V, FL_DTYPE_F32, &o) != FL_OK) { fprintf(stderr, "%s\n", fl_last_error()); return 1; }
    if (wsb) CK(cudaMalloc(&ws, wsb));
    const char* names[] = {"empty", "empty_cluster", "empty_pdl", "touch_pdl", "ce_fused"};
    printf("graph of %d launches, median of %d replays; %d x %d fp32, inputs rotated over %d buffers\n", CALLS, REPS, N, V, ROT);
    for (int c = 0; c < 5; c++) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(g_s, cudaStreamCaptureModeGlobal));
        for (int i = 0; i < CALLS; i++) {
            const int r = i % ROT;
            const float* xr = x + ne * r;
            float* yr = y + ne * r;
            cudaError_t e = cudaSuccess;
            if (c == 0) e = launch(0, 0, 0, xr, yr, N, V);
            else if (c == 1) e = launch(0, 1, 0, xr, yr, N, V);
            else if (c == 2) e = launch(0, 1, 1, xr, yr, N, V);
            else if (c == 3) e = launch(1, 1, 1, xr, yr, N, V);
            else {
                fl_status st = fl_cross_entropy_fused_cuda(loss + r, NULL, yr, xr, t + (size_t)N * r, NULL, 1.0f, N, V, V,
                                                           FL_DTYPE_F32, FL_INDEX_I64, &o, ws, wsb, g_s);
                if (st != FL_OK) { fprintf(stderr, "ce: %s\n", fl_last_error()); return 1; }
            }
            CK(e);
        }
        CK(cudaStreamEndCapture(g_s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        float mn = 0.0f;
        const float med = bench_graph_replay_ms(ge, g_s, REPS, &mn);
        printf("%-14s %7.2f us per launch (min %.2f)\n", names[c], (double)med * 1e3 / CALLS, (double)mn * 1e3 / CALLS);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    }
    return 0;
}
