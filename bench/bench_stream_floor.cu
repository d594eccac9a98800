/* bench_stream_floor: how close to the copy floor can ANY kernel stream a 50-270 MB array on this
 * GPU? Issue 6 asks the GeLU forward at 8192 x 3072 bf16 (50 MB read + 50 MB written, a 23.5 us
 * floor at the 2 GiB copy bandwidth) for <= 1.10x, while the driver's own cudaMemcpyAsync of the
 * same bytes measured 1.17x (NOTES "GeLU, 2026-12-02"). This sweep answers whether a hand-written
 * streaming kernel does better than the driver's copy, which launch shape does, and what a
 * GeLU-like amount of arithmetic per element costs at the end of the stream (the tail).
 *
 * Every case reads S bytes and writes S bytes (16-byte vectors), timed like bench_gelu: CUDA
 * events around each call, calls queued back to back, buffer sets rotated so that >= 512 MiB of
 * distinct memory lies between two uses of a set, 5 warm-up calls, median of 50. Ratio = median /
 * (2 S / copy BW), copy BW = cudaMemcpyAsync of 2 GiB (bench_util.h), the floor of every bench.
 *
 * Kernel variants (one CTA = B threads, each thread U vectors, interleaved as the GeLU STREAM
 * kernel: vector it U G B + u G B + b B + t, so a warp's access is 512 contiguous bytes):
 *   grid  one  = ceil(nvec / (B U)) CTAs, one iteration each (the GeLU default)
 *         pers = the resident CTAs (occupancy x SMs), striding on
 *   hint  ld   = plain ld.global / st.global
 *         cs   = ld.global.cs / st.global.cs (streaming, evict-first)
 *         nc   = ld.global.nc.L1::no_allocate.L2::256B / st.global (read-only path, 256 B L2 fetch)
 *   work  W    = W dependent FMAs per 16-bit element (8 elements per vector, in fp32; 0 8 16 32), W = 0 is a
 *                pure copy; the bf16 GeLU forward is ~17 SASS instructions an element
 * Printed per size: the 8 fastest variants of each work level and the B256 U4 'one' cases (the
 * GeLU STREAM kernel's shape until 2026-12-04), then a SUMMARY line.
 * --reads 2: every case reads two S-byte arrays and writes one (the GeLU backward's traffic), floor 3 S / BW;
 * memcpy is then still the copy of S bytes (2 S moved), for reference.
 * Usage: bench_stream_floor [--reads 1|2] [MB ...]   (default 50.3 100.7 268.4: 8192 x 3072 bf16, f32, 8192 x 16384 bf16)
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "fusedloss.h"
#include "bench_util.h"   /* CK, median, copy_bandwidth_gbps */

enum { WARMUP = 5, REPS = 50, MAXSETS = 16 };
#define ROTATE_BYTES ((size_t)512 << 20)

enum { H_LD = 0, H_CS = 1, H_NC = 2 };
static const char* hint_name[3] = {"ld", "cs", "nc"};

template <int H>
__device__ __forceinline__ uint4 ldv(const uint4* p) {
    if (H == H_CS) return __ldcs(p);
    if (H == H_NC) {
        uint4 r;
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
        return r;
    }
    return *p;
}

template <int H>
__device__ __forceinline__ void stv(uint4* p, uint4 v) {
    if (H == H_CS) __stcs(p, v);
    else *p = v;
}

/* W dependent FMAs on each of the 8 bf16 halves of v (as fp32), rounded back to bf16 */
template <int W>
__device__ __forceinline__ uint4 work(uint4 v) {
    if (W == 0) return v;
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float lo = __uint_as_float(w[k] << 16), hi = __uint_as_float(w[k] & 0xffff0000u);
#pragma unroll
        for (int i = 0; i < W; i++) { lo = fmaf(lo, 0.9990234f, 0.0009765625f); hi = fmaf(hi, 0.9990234f, 0.0009765625f); }
        w[k] = (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int R>
__device__ __forceinline__ uint4 mix(uint4 a, uint4 b) {
    if (R == 1) return a;
    return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
}

/* R = 1: y = work(x); R = 2: y = work(x ^ z) (the GeLU backward's traffic: read x and dy, write dx) */
template <int B, int U, int H, int W, int R>
__global__ void __launch_bounds__(B) k_stream(const uint4* __restrict__ x, const uint4* __restrict__ z,
                                              uint4* __restrict__ y, int64_t nvec) {
    const int64_t S = (int64_t)gridDim.x * B;
    for (int64_t v0 = (int64_t)blockIdx.x * B + threadIdx.x; v0 < nvec; v0 += S * U) {
        if (v0 + (int64_t)(U - 1) * S < nvec) {
            uint4 r[U], q[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                r[u] = ldv<H>(x + v0 + S * u);
                if (R == 2) q[u] = ldv<H>(z + v0 + S * u);
            }
#pragma unroll
            for (int u = 0; u < U; u++) stv<H>(y + v0 + S * u, work<W>(mix<R>(r[u], q[u])));
        } else {
            for (int u = 0; u < U; u++) {
                const int64_t v = v0 + S * u;
                if (v >= nvec) break;
                stv<H>(y + v, work<W>(mix<R>(ldv<H>(x + v), R == 2 ? ldv<H>(z + v) : make_uint4(0, 0, 0, 0))));
            }
        }
    }
}

typedef void (*kfn)(const uint4*, const uint4*, uint4*, int64_t);
typedef struct { kfn f; int B, U, H, W, R; } kvar;

#define KV(B, U, H, W) {k_stream<B, U, H, W, 1>, B, U, H, W, 1}
#define KV_H(B, U, W) KV(B, U, H_LD, W), KV(B, U, H_CS, W), KV(B, U, H_NC, W)
#define KV_U(B, W) KV_H(B, 1, W), KV_H(B, 2, W), KV_H(B, 4, W), KV_H(B, 8, W)
#define KV2(B, U, H, W) {k_stream<B, U, H, W, 2>, B, U, H, W, 2}
#define KV2_H(B, U, W) KV2(B, U, H_LD, W), KV2(B, U, H_CS, W), KV2(B, U, H_NC, W)
#define KV2_U(B, W) KV2_H(B, 1, W), KV2_H(B, 2, W), KV2_H(B, 4, W)
static const kvar g_vars[] = {
    KV_U(128, 0), KV_U(256, 0), KV_U(512, 0), KV_U(1024, 0),
    KV_U(256, 8), KV_U(256, 16), KV_U(512, 16), KV_U(128, 16), KV_U(128, 32), KV_U(256, 32),
    KV2_U(128, 0), KV2_U(256, 0), KV2_U(512, 0), KV2_U(128, 8), KV2_U(256, 8), KV2_U(128, 16), KV2_U(256, 16),
    KV2_U(256, 32),
};
enum { NVARS = (int)(sizeof g_vars / sizeof g_vars[0]) };

typedef struct { uint4 *x[MAXSETS], *z[MAXSETS], *y[MAXSETS]; int nsets; int64_t nvec; } sets_t;

static float time_calls(int kind, const kvar* kv, unsigned grid, const sets_t* s, cudaStream_t st) {
    static cudaEvent_t e[2 * REPS];
    static int made = 0;
    if (!made) { for (int r = 0; r < 2 * REPS; r++) CK(cudaEventCreate(&e[r])); made = 1; }
    float ms[REPS];
    int k = 0;
    for (int r = -WARMUP; r < REPS; r++, k = (k + 1) % s->nsets) {
        if (r >= 0) CK(cudaEventRecord(e[2 * r], st));
        if (kind == 0) CK(cudaMemcpyAsync(s->y[k], s->x[k], (size_t)s->nvec * 16, cudaMemcpyDeviceToDevice, st));
        else kv->f<<<grid, kv->B, 0, st>>>(s->x[k], s->z[k], s->y[k], s->nvec);
        if (r >= 0) CK(cudaEventRecord(e[2 * r + 1], st));
    }
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(st));
    for (int r = 0; r < REPS; r++) CK(cudaEventElapsedTime(&ms[r], e[2 * r], e[2 * r + 1]));
    return median(ms, REPS);
}

int main(int argc, char** argv) {
    double mbs[8] = {50.331648, 100.663296, 268.435456};
    int nsz = 3, R = 1, given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reads") && i + 1 < argc) {
            R = atoi(argv[++i]);
            if (R != 1 && R != 2) { fprintf(stderr, "--reads: 1 or 2\n"); return 2; }
        } else if (nsz < 8 || !given) {
            if (!given) { nsz = 0; given = 1; }
            if (nsz < 8) mbs[nsz++] = atof(argv[i]);
        }
    }
    cudaStream_t st;
    struct cudaDeviceProp prop;
    double bw = 0.0;
    char commit[64], date[64];
    const int rc = bench_begin(&st, &prop, &bw, commit, sizeof commit, date, sizeof date);
    if (rc >= 0) return rc;
    printf("stream floor sweep, %d input array(s) + 1 output of S bytes each: median of %d calls after %d, sets rotated "
           "over >= %zu MiB; ratio = ms / (%d S / %.0f GB/s)\n", R, REPS, WARMUP, ROTATE_BYTES >> 20, R + 1, bw);
    for (int zi = 0; zi < nsz; zi++) {
        sets_t s;
        memset(&s, 0, sizeof s);
        s.nvec = (int64_t)(mbs[zi] * 1e6 / 16.0);
        const size_t bytes = (size_t)s.nvec * 16;
        s.nsets = (int)((ROTATE_BYTES + (R + 1) * bytes - 1) / ((R + 1) * bytes)) + 1;
        if (s.nsets < 2) s.nsets = 2;
        if (s.nsets > MAXSETS) s.nsets = MAXSETS;
        for (int k = 0; k < s.nsets; k++) {
            CK(cudaMalloc((void**)&s.x[k], bytes));
            CK(cudaMalloc((void**)&s.y[k], bytes));
            CK(cudaMemsetAsync(s.x[k], 0x3c + k, bytes, st));  /* bf16 0x3c3c ~ 0.0115: finite, non-zero */
            if (R == 2) {
                CK(cudaMalloc((void**)&s.z[k], bytes));
                CK(cudaMemsetAsync(s.z[k], 0x01 + k, bytes, st));
            }
        }
        CK(cudaStreamSynchronize(st));
        const double floor_ms = (double)(R + 1) * (double)bytes / (bw * 1e6);
        const float mc = time_calls(0, NULL, 0, &s, st);
        const double copy_floor_ms = 2.0 * (double)bytes / (bw * 1e6);  /* memcpy of S bytes: its own floor */
        printf("size %.1f MB floor %.4f ms  memcpy %.4f ms %.3fx of its 2 S floor\n", bytes / 1e6, floor_ms, mc,
               mc / copy_floor_ms);
        enum { NW = 4 };  /* work levels 0 / 8 / 16 / 32 */
        double best[NW] = {1e30, 1e30, 1e30, 1e30};
        char bestn[NW][64] = {"", "", "", ""};
        static struct { char name[64]; unsigned grid; int occ; float ms; } res[2 * NVARS];
        int nres = 0;
        for (int vi = 0; vi < NVARS; vi++) {
            const kvar* kv = &g_vars[vi];
            if (kv->R != R) continue;
            int occ = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kv->f, kv->B, 0));
            const int64_t one = (s.nvec + (int64_t)kv->B * kv->U - 1) / ((int64_t)kv->B * kv->U);
            const int64_t pers = (int64_t)occ * prop.multiProcessorCount;
            for (int g = 0; g < 2; g++) {
                const unsigned grid = (unsigned)(g == 0 ? one : (pers < one ? pers : one));
                const float ms = time_calls(1, kv, grid, &s, st);
                char name[64];
                snprintf(name, sizeof name, "B%d U%d %s W%d %s", kv->B, kv->U, hint_name[kv->H], kv->W, g ? "pers" : "one");
                snprintf(res[nres].name, sizeof res[nres].name, "%s", name);
                res[nres].grid = grid; res[nres].occ = occ; res[nres].ms = ms; nres++;
                const int wi = kv->W == 0 ? 0 : kv->W == 8 ? 1 : kv->W == 16 ? 2 : 3;
                if (ms < best[wi]) { best[wi] = ms; snprintf(bestn[wi], sizeof bestn[wi], "%s", name); }
            }
        }
        /* the 8 fastest of each work level, and every B256 U4 'one' case (the GeLU STREAM kernel's shape) */
        for (int wi = 0; wi < NW; wi++) {
            const int W = wi == 0 ? 0 : wi == 1 ? 8 : wi == 2 ? 16 : 32;
            char tag[8];
            snprintf(tag, sizeof tag, " W%d ", W);
            int used[2 * NVARS] = {0};
            for (int shown = 0; shown < 8; shown++) {
                int bi = -1;
                for (int i = 0; i < nres; i++)
                    if (!used[i] && strstr(res[i].name, tag) && (bi < 0 || res[i].ms < res[bi].ms)) bi = i;
                if (bi < 0) break;
                used[bi] = 1;
                printf("  %-24s grid %7u occ %2d  %.4f ms %.3fx\n", res[bi].name, res[bi].grid, res[bi].occ,
                       res[bi].ms, res[bi].ms / floor_ms);
            }
        }
        for (int i = 0; i < nres; i++)
            if (strstr(res[i].name, "B256 U4 ") && strstr(res[i].name, " one"))
                printf("  ref %-20s grid %7u occ %2d  %.4f ms %.3fx\n", res[i].name, res[i].grid, res[i].occ, res[i].ms,
                       res[i].ms / floor_ms);
        printf("SUMMARY stream %d-in %.1f MB: memcpy %.3fx; best copy kernel %.3fx (%s); W8 %.3fx (%s); W16 %.3fx (%s); "
               "W32 %.3fx (%s)\n", R, bytes / 1e6, mc / copy_floor_ms, best[0] / floor_ms, bestn[0], best[1] / floor_ms,
               bestn[1], best[2] / floor_ms, bestn[2], best[3] / floor_ms, bestn[3]);
        for (int k = 0; k < s.nsets; k++) { CK(cudaFree(s.x[k])); CK(cudaFree(s.y[k])); if (s.z[k]) CK(cudaFree(s.z[k])); }
    }
    printf("SUMMARY copy BW %.0f GB/s on %s, commit %s, %s\n", bw, prop.name, commit, date);
    return 0;
}
