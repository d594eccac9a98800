/* cluster.cuh — what the one-read kernels that stage rows in shared memory across a thread-block
 * cluster share (sm_90): mbarrier, bulk-copy (TMA), per-thread cp.async and st.async primitives,
 * the device query cache, the cluster launch attribute and the cached cluster occupancy.
 * Users: cross_entropy.cu (the staged CE kernel), distill.cu (the staged distillation kernel).
 * Internal, not installed.
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_CUDA_CLUSTER_CUH
#define FL_CUDA_CLUSTER_CUH

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
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
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
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
    } while (!done);
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

#endif /* FL_CUDA_CLUSTER_CUH */
