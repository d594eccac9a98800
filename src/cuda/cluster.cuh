/* cluster.cuh — what the one-read kernels that stage rows in shared memory across a thread-block
 * cluster share (sm_90): mbarrier, bulk-copy (TMA), per-thread cp.async and st.async primitives,
 * the device query cache, the cluster launch attribute and the cached cluster occupancy.
 * Users: cross_entropy.cu (the staged CE kernel), distill.cu (the staged distillation kernel).
 * Internal, not installed.
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_CUDA_CLUSTER_CUH
#define FL_CUDA_CLUSTER_CUH

#include <cuda.h>   /* CUtensorMap and cuTensorMapEncodeTiled's types (the function: a driver entry point) */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

// ---- device primitives ----------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
// n arrivals by one thread (sm_90: the .count form), for a barrier whose phase some threads complete one a thread
__device__ __forceinline__ void mbar_arrive_n(uint64_t* bar, uint32_t n) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(n) : "memory");
}
// one try of the wait (the hardware may suspend the thread a short, system-dependent time): true once the phase of
// `parity` has completed; mbar_wait loops on it (the distillation ring's opt-in back-off sleeps between tries)
__device__ __forceinline__ bool mbar_try(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    while (!mbar_try(bar, parity)) {
    }
}
// The ring producers' wait before refilling a slot: the consumers' generic-proxy reads of the slot
// are ordered before this thread's async-proxy bulk copies into it by the mbarrier's release/acquire
// and, explicitly, by the proxy fence (the cross-proxy write-after-read order; without it
// compute-sanitizer's racecheck reports every refill as a hazard: s16 runs 4-5)
__device__ __forceinline__ void mbar_wait_refill(uint64_t* bar, uint32_t parity) {
    mbar_wait(bar, parity);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The same release through hardware barriers (the rings' NB variant, FUSEDLOSS_*_PIPE_NBAR=1; session 18,
// not yet run): slot s is barrier NB_BASE + s, counted in threads (the gradient warps + the producer);
// the consumers' bar.arrive is a release and does not wait, the producer's bar.sync an acquire, then the
// proxy fence as above. Barriers 0 (__syncthreads) and 1 (the statistics groups) are taken: at most
// NB_MAX_SLOTS slots. A hardware barrier has no phases: the rings never let a slot's next-lap arrival
// precede the producer's sync of this lap (scripts/ring_protocol_model.py --nbar). Purpose:
// compute-sanitizer's racecheck, which reports every refill under the mbarrier protocol (s16-s17) and
// is expected to model hardware barriers. Both are warp-aligned: every lane executes them.
#define NB_BASE 2
#define NB_MAX_SLOTS 14
__device__ __forceinline__ void nbar_release(int s, int n) {
    __syncwarp();   // why: the warp's reads of the slot are done before its release
    asm volatile("bar.arrive %0, %1;" ::"r"(NB_BASE + s), "r"(n) : "memory");
}
__device__ __forceinline__ void nbar_wait_refill(int s, int n) {
    __syncwarp();   // why: bar.sync is warp-aligned (the producer's lanes left its copy loop apart)
    asm volatile("bar.sync %0, %1;" ::"r"(NB_BASE + s), "r"(n) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}

// ---- the same copies through tensor maps (the rings' default since s21; the KL ring's opt-in) ----------
// Why: compute-sanitizer's racecheck attributes a raw cp.async.bulk's shared-memory write to the thread
// that issued it and does not take the mbarrier protocol that orders it against other warps' reads as
// a happens-before edge, so every ring slot refill is reported (s16-s17: the CE ring's 1.8M hazards,
// the KL and Taylor rings' too). flash-attention met the same with its raw bulk copies and found the
// descriptor form (cp.async.bulk.tensor) reported clean, the write then belonging to no thread
// (flash_attn/cute, "RACECHECK_TMA_HAZARD", 2025). The view: the whole input buffer as a 1-D array of
// 8-byte elements (uint64 [2 rows]) from its 16-byte-aligned base, addressed by 16-byte row r (element
// 2 r); three maps whose boxes are FL_TMAP_BOX[k] rows (2 KB, 256 B, 128 B), so that every destination
// is 128-byte aligned (the tensor copies' shared-memory alignment) given a 128-byte-aligned slot: n
// vectors go as n / 128 big boxes, then 16-row boxes, then one or two 8-row boxes that may read up to
// 7 vectors past n. (Session 19 viewed it as uint8 [rows][16] with 4 KB boxes of 256 16-byte rows: racecheck
// clean on the Taylor and KL rings, but the CE ring 1.07 -> 1.30x its floor, H100 s20 run 1: a box's
// 16-byte inner rows are the unit the copy engine walks; here the inner extent is the whole box)
// (into the slot's own rounding: the slot's capacity must be a multiple of 8 vectors; past the
// buffer's last whole 16-byte row the map zero-fills, reading nothing). expect_tx counts the boxes'
// bytes, over-read included.
#define FL_TMAP_NBOX 3
static const int FL_TMAP_BOX[FL_TMAP_NBOX] = {128, 16, 8};
typedef struct {
    CUtensorMap m[FL_TMAP_NBOX];
} FlTmaps;

__device__ __forceinline__ void bulk_tensor_load(void* dst, const CUtensorMap* map, int row, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2}], "
        "[%3];" ::"r"(smem_addr(dst)),
        "l"((uint64_t)(uintptr_t)map), "r"(2 * row), "r"(smem_addr(bar))
        : "memory");
}
// The 16-byte row of the maps' view where p (16-byte aligned, inside the buffer at base) starts.
__device__ __forceinline__ int tmap_row(const void* base, const void* p) {
    return (int)(((uintptr_t)p - ((uintptr_t)base & ~(uintptr_t)15)) >> 4);
}
// n vectors as boxes: n / 128 of 128 rows, then 16-row boxes, then one or two 8-row boxes (the last may
// read up to 7 vectors past n); tmap_box issues box p of them from view row r0 to dst (128-byte aligned,
// room for n rounded up to 8 vectors)
__device__ __forceinline__ int tmap_nbox(int n) { return (n >> 7) + ((n & 127) >> 4) + (((n & 15) + 7) >> 3); }
__device__ __forceinline__ uint32_t tmap_bytes(int n) {
    return (uint32_t)((n >> 7) * 128 + ((n & 127) >> 4) * 16 + (((n & 15) + 7) >> 3) * 8) * 16u;
}
__device__ __forceinline__ void tmap_box(uint4* dst, const FlTmaps& tm, int r0, int n, int p, uint64_t* bar) {
    const int n128 = n >> 7, n16 = (n & 127) >> 4;
    int off, k;
    if (p < n128) { off = p * 128; k = 0; }
    else if (p < n128 + n16) { off = n128 * 128 + (p - n128) * 16; k = 1; }
    else { off = n128 * 128 + n16 * 16 + (p - n128 - n16) * 8; k = 2; }
    bulk_tensor_load(dst + off, &tm.m[k], r0 + off, bar);
}
// n vectors from view row r0 to dst, counted on bar: lane 0 arrives with the byte count (or without, n =
// 0), then the warp's lanes issue the boxes, one a lane (as the raw copies' pieces). Every lane calls it.
__device__ __forceinline__ void tmap_issue(uint4* dst, const FlTmaps& tm, int r0, int n, uint64_t* bar) {
    const int lane = threadIdx.x & 31;
    if (lane == 0) {
        if (n > 0) mbar_arrive_tx(bar, tmap_bytes(n));
        else mbar_arrive(bar);
    }
    __syncwarp();
    for (int p = lane; p < tmap_nbox(n); p += 32) tmap_box(dst, tm, r0, n, p, bar);
}
// two inputs' maps (the KL ring: student, teacher)
typedef struct {
    FlTmaps s, t;
} FlTmaps2;

// Per-thread 16-byte asynchronous copies (sm_80+ LDGSTS, L1 bypassed), their completion tracked
// by the same mbarrier: each thread's arrive fires once its own copies have landed (init count T).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// DSMEM exchange without a cluster barrier (the default; FUSEDLOSS_CE_TMA_XCH=0: the barrier): st.async writes 16 bytes
// into CTA `rank`'s shared memory and counts them on ITS mbarrier (complete_tx, release at
// cluster scope); the receiver waits on its own mbarrier with acquire at cluster scope. The
// cluster barrier it replaces compiles to MEMBAR.ALL.GPU + UCGABAR + CCTL.IVALL per row (SASS,
// sm_90): the membar waits for this thread's outstanding gradient stores of the previous row.
__device__ __forceinline__ uint32_t mapa_shared(uint32_t local, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}
__device__ __forceinline__ void st_async_f4(uint32_t raddr, float4 v, uint32_t rbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(raddr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rbar)
                 : "memory");
}
__device__ __forceinline__ void st_async_f32(uint32_t raddr, float v, uint32_t rbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];" ::"r"(raddr), "f"(v), "r"(rbar)
                 : "memory");
}
// mbar_try with cluster-scope acquire (the phase completed by other CTAs' st.async / arrivals)
__device__ __forceinline__ bool mbar_try_cluster(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return done != 0;
}
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
    while (!mbar_try_cluster(bar, parity)) {
    }
}

// cp.async groups of the issuing thread: commit, and wait until at most n are pending (n a
// runtime value mapped to the immediates 0 .. 3)
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait(int n) {
    switch (n) {
        case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    }
}

// Programmatic dependent launch (sm_90; no-ops below): pdl_trigger lets the next kernel on the
// stream, if launched with cudaLaunchAttributeProgrammaticStreamSerialization, start before this
// grid ends; pdl_wait (in a grid launched so) waits until the previous grid has completed and its
// memory is visible. A thread that has not passed pdl_wait may touch only memory the previous
// grid neither writes nor reads.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A launch attribute that lets the kernel start while the previous one on the stream finishes.
static inline void set_pdl(cudaLaunchAttribute* attr) {
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
}

// ---- host helpers ---------------------------------------------------------------------------
// An empty kernel whose attributes tell which code of this translation unit's fatbin the driver
// loaded for the current device. The sm_90-only kernels (TMA, clusters, st.async, PDL waits) are
// compiled for __CUDA_ARCH__ >= 900 only (a __trap() or nothing below): on a device newer than the
// fatbin's SASS (the build carries sm_90 and sm_80 SASS and compute_80 PTX; sm_90 SASS does not run
// on sm_100 and later) the driver JITs the compute_80 PTX, where those bodies are gone although the
// device's compute capability is >= 9. So dev_info() reports cc_major 8 there: no caller picks them.
static __global__ void fl_code_arch_probe() {}

// cc_major: the device's compute capability major, capped at 8 when the code loaded for it was
// built for an older virtual architecture than compute_90 (see fl_code_arch_probe); sms: SMs.
struct DevInfo { int cc_major; int sms; };

static inline cudaError_t dev_info(DevInfo* out) {
    // Cached per device: attribute queries do not synchronise, but skip them on the hot path.
    static DevInfo cache[64];
    static int have[64];
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64 && have[dev]) { *out = cache[dev]; return cudaSuccess; }
    DevInfo d;
    e = cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return e;
    e = cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    if (d.cc_major >= 9) {
        cudaFuncAttributes fa;
        e = cudaFuncGetAttributes(&fa, (const void*)fl_code_arch_probe);
        if (e != cudaSuccess) return e;
        if (fa.ptxVersion > 0 && fa.ptxVersion < 90) d.cc_major = 8;  // JIT from compute_80 PTX
    }
    if (dev >= 0 && dev < 64) { cache[dev] = d; have[dev] = 1; }
    *out = d;
    return cudaSuccess;
}

// One launch attribute: a 1-D thread-block cluster of cs CTAs.
static inline void set_cluster(cudaLaunchConfig_t* cfg, cudaLaunchAttribute* attr, unsigned cs) {
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = cs;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg->attrs = attr;
    cfg->numAttrs = 1;
}

// Launches fn on `clusters` 1-D clusters of cs CTAs of T threads and smem bytes of dynamic shared
// memory; args as for cudaLaunchKernelExC.
static inline cudaError_t fl__launch_clusters(const void* fn, void** args, int64_t clusters, int cs, int T,
                                              size_t smem, cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    cfg.gridDim = dim3((unsigned)(clusters * cs), 1, 1);
    cfg.blockDim = dim3((unsigned)T, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    set_cluster(&cfg, &attr, (unsigned)cs);
    return cudaLaunchKernelExC(&cfg, fn, args);
}

// Occupancy of a (kernel, cluster size, shared memory) triple, cached: clusters (or CTAs when
// cs == 0) that are resident at once on this device. 0 = does not fit.
struct OccEntry { const void* fn; int dev, cs, T; size_t smem; int n; };

static inline cudaError_t fl__cluster_occupancy(const void* fn, int cs, int T, size_t smem, int sms, int debug,
                                                const char* what, int* out) {
    static OccEntry cache[256];
    static int used = 0;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    pthread_mutex_lock(&mu);
    for (int k = 0; k < used; k++)
        if (cache[k].fn == fn && cache[k].dev == dev && cache[k].cs == cs && cache[k].T == T && cache[k].smem == smem) {
            *out = cache[k].n;
            pthread_mutex_unlock(&mu);
            return cudaSuccess;
        }
    int n = 0;
    // The dynamic shared-memory limit is an attribute of the function, not of a launch: only ever
    // raise it (a later, smaller plan must not invalidate an earlier, larger one's launches).
    size_t fmax = 0;
    for (int k = 0; k < used; k++)
        if (cache[k].fn == fn && cache[k].dev == dev && cache[k].n > 0 && cache[k].smem > fmax) fmax = cache[k].smem;
    e = cudaSuccess;
    if (smem > fmax) e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess && cs > 8) e = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e == cudaSuccess) {
        if (cs == 0) {
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, T, smem);
            n *= sms;
        } else {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)cs, 1, 1);
            cfg.blockDim = dim3((unsigned)T, 1, 1);
            cfg.dynamicSmemBytes = smem;
            cudaLaunchAttribute attr;
            set_cluster(&cfg, &attr, (unsigned)cs);
            e = cudaOccupancyMaxActiveClusters(&n, fn, &cfg);
        }
    }
    if (e != cudaSuccess) {  // e.g. a cluster size this device cannot schedule: use the other path
        (void)cudaGetLastError();
        e = cudaSuccess;
        n = 0;
    }
    if (used < 256) {
        OccEntry c = {fn, dev, cs, T, smem, n};
        cache[used++] = c;
    }
    if (debug)
        fprintf(stderr, "fusedloss: %s %p: cluster %d, %d threads, %zu B shared: %d %s resident\n", what, fn, cs, T,
                smem, n, cs ? "clusters" : "CTAs");
    pthread_mutex_unlock(&mu);
    *out = n;
    return e;
}

// FlTmaps over [base, base + bytes) (bulk_tensor_load's view: uint64 [2 rows] from base rounded down to 16
// bytes, rows = the whole 16-byte rows up to base + bytes). cuTensorMapEncodeTiled comes from the
// driver through the runtime's entry-point query (no link against libcuda), looked up once. Host-only
// work: no device call, nothing allocated, capturable. 0 on success; nonzero (no driver entry point,
// rows >= 2^31, an encode error) means: use the raw copies.
typedef CUresult (*fl_encode_tiled_fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                       const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static inline fl_encode_tiled_fn fl__encode_tiled(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    static fl_encode_tiled_fn fn = NULL;
    struct L {
        static void look(void) {
            void* p = NULL;
            cudaDriverEntryPointQueryResult q;
            if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                    cudaSuccess &&
                q == cudaDriverEntryPointSuccess)
                fn = (fl_encode_tiled_fn)p;
            else
                (void)cudaGetLastError();
        }
    };
    pthread_once(&once, L::look);
    return fn;
}
static inline int fl__tmaps_encode(const void* base, size_t bytes, FlTmaps* out) {
    const fl_encode_tiled_fn enc = fl__encode_tiled();
    if (!enc) return 1;
    const uintptr_t b16 = (uintptr_t)base & ~(uintptr_t)15;
    const uint64_t rows = ((uint64_t)((uintptr_t)base - b16) + bytes) >> 4;
    if (rows == 0 || rows >= ((uint64_t)1 << 31)) return 1;
    const cuuint64_t gdim[1] = {2 * rows};
    const cuuint64_t gstride[1] = {0};   /* rank 1: no stride is read */
    const cuuint32_t estride[1] = {1};
    for (int k = 0; k < FL_TMAP_NBOX; k++) {
        const cuuint32_t box[1] = {(cuuint32_t)(2 * FL_TMAP_BOX[k])};
        if (enc(&out->m[k], CU_TENSOR_MAP_DATA_TYPE_UINT64, 1, (void*)b16, gdim, gstride, box, estride,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
            return 1;
    }
    return 0;
}

// The TM plans' slots: whole 128-byte lines (8 vectors, tmap_issue's alignment and over-read room), and
// the sub-chunks a chunk of `per` vectors then takes (the kernels count them from the slot size)
static inline void fl__tmap_round(int64_t per, int64_t* sb, int64_t* ns) {
    *sb = (*sb + 7) / 8 * 8;
    *ns = (per + *sb - 1) / *sb;
}
// FUSEDLOSS_DEBUG's line on which copies a TM launch of kernel `what` takes; returns `ok`
static inline int fl__tmap_note(int ok, const char* what, int debug) {
    if (debug)
        fprintf(stderr, "fusedloss: %s: %s\n", what,
                ok ? "producer through tensor maps" : "tensor maps unavailable, raw copies");
    return ok;
}

#endif /* FL_CUDA_CLUSTER_CUH */
