/* ringrow.cuh — the warp-specialised ring kernel for row losses on one input (sm_90): one CTA a row,
 * a producer warp, a statistics group and a gradient group working on different rows at once, the
 * row staged in a ring of shared-memory slots so that the logits are read from HBM once and the
 * gradient written once. Users: large_margin_ce.cu (FUSEDLOSS_LM_PIPE=1), taylor_ce.cu
 * (FUSEDLOSS_TC_PIPE=1). The two-input, cluster-wide version is distill_pipe_kernel (distill.cu);
 * the CE's is ce_pipe_kernel (cross_entropy.cu). Written in session 16, which had no GPU: not yet run.
 *
 * Why: the row kernels these losses had (a CTA per row: load, statistics, barriers, gradient) take
 * about their memory time PLUS their arithmetic time (large-margin 8192x32000 bf16: 1.64x the floor =
 * 0.22 ms of memory + ~0.13 ms of exponentials and issue), since their 2-3 CTAs per SM overlap only
 * by chance; rows above 72-100 KB were not staged at all (re-read from L2: 8192x50257 bf16 Taylor
 * 2.07x, large-margin 2.51x). The CE left that structure (1.23x) for 1.11x with these roles:
 *  - PRODUCER (the last warp): row i's vectors, sub at a time, into ring position P (slot P % R)
 *    once every gradient warp released position P - R (empty[s]), as bulk async copies completing
 *    full[s]; rows with an ignored or out-of-range target: no copy, full[s] completed at once.
 *  - STATISTICS (threads [0, Ts)): row i's statistics (L::push over each thread's groups c = tid,
 *    tid + Ts, ..., carried across slots; L::push1 over the extra columns, read from global memory
 *    before the sweep),
 *    a fixed merge tree (L::warp_merge, then warp 0 over the warps' results, named barrier 1), and
 *    warp 0's lane 0 forms the row's loss (into a.rowloss) and gradient coefficients (L::row) in
 *    exchange slot it % RR_XSLOTS, completing xbar[x].
 *  - GRADIENT (threads [Ts, T - 32)): waits for row i's coefficients and writes its gradient from the
 *    ring (L::grad), each warp releasing each slot; the extra columns re-read from global memory
 *    (before the wait for the coefficients).
 * Rows not 16-byte aligned (logits and dlogits of one 16-byte phase: the host checks): each row's
 * vectors start at its first 16-byte boundary; its h head columns and the tail after its last vector
 * are the extras (RrRow). Every position of every row, special rows included, completes one phase of
 * full[s] and of empty[s], every row one of xbar[x]; the gradient group touches a row's positions only
 * after its coefficients, which follow the statistics group's waits on all of them. The host keeps
 * R <= (RR_XSLOTS / 2 + 1) nsub - 1 (the exchange-slot reuse bound; scripts/ring_protocol_model.py).
 * In place (dlogits == logits): x_y and the extras are read by the statistics group before the row's
 * coefficients are published, and every store of the row follows them.
 * Deterministic: fixed per-thread groups and merge order.
 *
 * The loss policy L provides (all __device__, static):
 *   typedef Args (fields x, dx, tg, lab64, N, C, ld, rowloss, error_flag), typedef Stat;
 *   Stat init(); template <int VEC> void push(const Args&, Stat&, const float* v, int64_t dq) (dq: the
 *   target column minus the group's first); void push1(const Args&, Stat&, float v, bool target);
 *   Stat warp_merge(Stat) (the result in lane 0); static constexpr bool kPairs (true: each statistics
 *   thread keeps two sums, its groups alternating between them, joined by Stat merge(Stat, Stat), needed only then); int kind(const Args&, int64_t y) (0 regular, 1
 *   ignored, 2 out of range); float row(const Args&, int64_t i, float xy, const Stat&, float* coef)
 *   (the loss; coef[0..5] for grad); float grad(const Args&, const float* coef, float v, bool target).
 * SPDX-License-Identifier: MIT
 */
#ifndef FL_CUDA_RINGROW_CUH
#define FL_CUDA_RINGROW_CUH

#include <stdint.h>
#include <stdlib.h>

#include "cluster.cuh"
#include "common.cuh"
#include "rowpass.cuh"

#define RR_MAX_SLOTS 16
#define RR_XSLOTS 8
#define RR_MAX_THREADS 672
#define RR_PIECE 256   /* vectors per bulk copy (4 KB); the producer's lanes issue the pieces */

static __device__ __forceinline__ void rr_bar(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

/* NB (FUSEDLOSS_<loss>_PIPE_NBAR=1; not yet run): slot s released through hardware barrier NB_BASE + s
 * (cluster.cuh: nbar_release / nbar_wait_refill) instead of the mbarrier empty[s]; R <= NB_MAX_SLOTS. */

/* TM (default since s21; FUSEDLOSS_<loss>_PIPE_TMAP=0: raw bulk copies): the producer's copies through tensor maps
 * (cluster.cuh: FlTmaps, tmap_issue; for racecheck, as the CE ring's TM), slots of whole 128-byte lines
 * from the dynamic shared memory's first 128-byte boundary (the plan adds 128 bytes). */

template <typename T, class L, bool PST, bool NB = false, bool TM = false>
static __global__ void __launch_bounds__(RR_MAX_THREADS, 1) rr_kernel(typename L::Args a, int sub, int R, int Ts,
                                                                       const __grid_constant__ FlTmaps tm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    typedef typename L::Stat Stat;
    constexpr int VEC = 16 / (int)sizeof(T);
    /* (16-byte alignment is all the bulk copies need; a larger one would move the dynamic shared memory
     * of every kernel of the including file; TM aligns its ring itself) */
    extern __shared__ __align__(16) uint4 rr_dyn[];
    /* [R][sub]; TM: from the first 128-byte boundary, as an offset from rr_dyn (a pointer rebuilt from an integer
     * lost the shared window: the slots were read with generic LD.E.128, not LDS.128, ncu / SASS s29) */
    uint4* const rr_ring = rr_dyn + (TM ? ((128u - (smem_addr(rr_dyn) & 127u)) & 127u) / 16u : 0u);
    __shared__ __align__(8) uint64_t full[RR_MAX_SLOTS];    /* slot s's sub-chunk landed */
    __shared__ __align__(8) uint64_t empty[RR_MAX_SLOTS];   /* every gradient warp is done with slot s */
    __shared__ __align__(8) uint64_t xbar[RR_XSLOTS];       /* exchange slot x's coefficients written */
    __shared__ float xc[RR_XSLOTS][8];                       /* coef[0..5], the row kind */
    __shared__ Stat sh_stat[RR_MAX_THREADS / 32];
    const int tid = (int)threadIdx.x;
    const int ngw = ((int)blockDim.x - Ts - 32) >> 5;
    const int nsub = (int)((a.C / VEC + sub - 1) / sub);   /* positions a row: of the most vectors a row has */
    if (tid == 0) {
        for (int k = 0; k < R; k++) {
            mbar_init(&full[k], 1u);
            mbar_init(&empty[k], (uint32_t)ngw);
        }
        for (int k = 0; k < RR_XSLOTS; k++) mbar_init(&xbar[k], 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();   /* why: barriers initialised before any copy is issued or waited on */
    int s = 0;
    uint32_t ph = 0u;
    auto next_pos = [&]() {
        if (++s == R) { s = 0; ph ^= 1u; }
    };
    if (tid < Ts) {
        /* ---------------- statistics group ---------------- */
        const int lane = tid & 31, wid = tid >> 5, nw = Ts >> 5;
        int64_t yn = blockIdx.x < a.N ? rp_label(a.tg, a.lab64, blockIdx.x) : 0;   /* a row ahead */
        int64_t it = 0;
        for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x, it++) {
            const int64_t y = yn;
            if (i + gridDim.x < a.N) yn = rp_label(a.tg, a.lab64, i + gridDim.x);
            const int kind = L::kind(a, y);
            const T* x = (const T*)a.x + i * a.ld;
            const RrRow g = rr_row<T>(x, a.C);
            const float xy = (kind == 0 && tid == 0) ? to_float(x[y]) : 0.0f;
            /* the extra columns (nex <= 2 VEC - 2 < 32 <= Ts: one a thread at most), loaded before the
             * sweep so that their latency is not on the row's path */
            const int64_t ej = (kind == 0 && tid < g.nex) ? g.extra(tid) : -1;
            const float xe = ej >= 0 ? to_float(__ldcg(x + ej)) : 0.0f;
            Stat st = L::init();
            Stat st2 = L::init();   /* L::kPairs: the second of two independent sums (ILP) */
            int64_t c = tid;   /* this thread's next group, carried across slots */
            for (int j = 0; j < nsub; j++, next_pos()) {
                mbar_wait(&full[s], ph);
                if (kind != 0) continue;
                const int64_t v0 = (int64_t)j * sub, hi = g.nv - v0 < sub ? g.nv : v0 + sub;
                const uint4* buf = rr_ring + (size_t)s * sub - v0;   /* buf[c], c in [v0, hi) */
                if constexpr (L::kPairs) {   /* two groups a step, into st and st2: both loads first */
                    for (; c + Ts < hi; c += 2 * Ts) {
                        const uint4 u0 = buf[c], u1 = buf[c + Ts];
                        float v[VEC], w[VEC];
                        rp_unpack<T>(u0, v);
                        rp_unpack<T>(u1, w);
                        L::template push<VEC>(a, st, v, y - g.h - c * VEC);
                        L::template push<VEC>(a, st2, w, y - g.h - (c + Ts) * VEC);
                    }
                }
                for (; c < hi; c += Ts) {
                    float v[VEC];
                    rp_unpack<T>(buf[c], v);
                    L::template push<VEC>(a, st, v, y - g.h - c * VEC);
                }
            }
            if constexpr (L::kPairs) st = L::merge(st, st2);
            if (ej >= 0) L::push1(a, st, xe, ej == y);
            st = L::warp_merge(st);
            if (lane == 0) sh_stat[wid] = st;
            rr_bar(1, Ts);   /* why: the warps' partials visible to warp 0 */
            if (wid == 0) {
                Stat u = lane < nw ? sh_stat[lane] : L::init();
                u = L::warp_merge(u);
                if (lane == 0) {
                    const int x8 = (int)(it % RR_XSLOTS);
                    float coef[6] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                    if (kind == 0) {
                        const float l = L::row(a, i, xy, u, coef);
                        if (a.rowloss) a.rowloss[i] = l;
                    } else {   /* ignored: loss 0; out of range: NaN, flagged */
                        if (kind == 2 && a.error_flag) atomicOr(a.error_flag, 1);
                        if (a.rowloss) a.rowloss[i] = kind == 1 ? 0.0f : NAN;
                    }
#pragma unroll
                    for (int k = 0; k < 6; k++) xc[x8][k] = coef[k];
                    xc[x8][6] = (float)kind;
                    mbar_arrive(&xbar[x8]);   /* release: the coefficients visible to the waiters */
                }
            }
            rr_bar(1, Ts);   /* why: warp 0 has read sh_stat before the next row's partials */
        }
    } else if (tid >= (int)blockDim.x - 32) {
        /* ---------------- producer warp ---------------- */
        const int lane = tid & 31;
        int64_t P = 0;
        for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x) {
            const bool skip = L::kind(a, rp_label(a.tg, a.lab64, i)) != 0;
            const T* x = (const T*)a.x + i * a.ld;
            const RrRow g = rr_row<T>(x, a.C);
            const uint4* src = reinterpret_cast<const uint4*>(x + g.h);
            for (int j = 0; j < nsub; j++, P++, next_pos()) {
                if (P >= R) {   /* position P - R released */
                    if constexpr (NB) nbar_wait_refill(s, (ngw + 1) * 32);   /* (cluster.cuh) */
                    else mbar_wait_refill(&empty[s], ph ^ 1u);
                }
                const int64_t v0 = (int64_t)j * sub;
                const int cnt = skip ? 0 : (int)(g.nv - v0 < sub ? (g.nv - v0 > 0 ? g.nv - v0 : 0) : sub);
                uint4* dst = rr_ring + (size_t)s * sub;
                if constexpr (TM) {
                    tmap_issue(dst, tm, tmap_row(a.x, src + v0), cnt, &full[s]);
                } else {
                    if (lane == 0) {
                        if (cnt > 0) mbar_arrive_tx(&full[s], (uint32_t)cnt * 16u);
                        else mbar_arrive(&full[s]);
                    }
                    __syncwarp();
                    for (int p = lane; p * RR_PIECE < cnt; p += 32) {
                        const int o = p * RR_PIECE, m = cnt - o < RR_PIECE ? cnt - o : RR_PIECE;
                        bulk_load(dst + o, src + v0 + o, (uint32_t)m * 16u, &full[s]);
                    }
                }
            }
        }
    } else {
        /* ---------------- gradient group ---------------- */
        const int gt = tid - Ts, ng = ngw * 32, lane = tid & 31;
        int64_t yn = blockIdx.x < a.N ? rp_label(a.tg, a.lab64, blockIdx.x) : 0;
        int64_t it = 0;
        for (int64_t i = blockIdx.x; i < a.N; i += gridDim.x, it++) {
            const int64_t y = yn;
            if (i + gridDim.x < a.N) yn = rp_label(a.tg, a.lab64, i + gridDim.x);
            const T* x = (const T*)a.x + i * a.ld;
            const RrRow g = rr_row<T>(x, a.C);
            T* dx = (T*)a.dx + i * a.ld + g.h;   /* from the row's first 16-byte boundary (x's phase) */
            /* this thread's extra column (nex < 32 <= the group's threads), loaded before the wait */
            const int64_t ej = gt < g.nex ? g.extra(gt) : -1;
            const float xe = ej >= 0 ? to_float(__ldcg(x + ej)) : 0.0f;
            const int x8 = (int)(it % RR_XSLOTS);
            mbar_wait(&xbar[x8], (uint32_t)((it / RR_XSLOTS) & 1));
            float coef[6];
#pragma unroll
            for (int k = 0; k < 6; k++) coef[k] = xc[x8][k];
            const int kind = (int)xc[x8][6];
            int64_t q = gt;   /* this thread's next group, carried across slots */
            for (int j = 0; j < nsub; j++, next_pos()) {
                const int64_t v0 = (int64_t)j * sub, hi = g.nv - v0 < sub ? g.nv : v0 + sub;
                if (kind != 0) {   /* every column 0 (ignored) or NaN (out of range) */
                    float v[VEC];
#pragma unroll
                    for (int k = 0; k < VEC; k++) v[k] = kind == 1 ? 0.0f : NAN;
                    for (; q < hi; q += ng) rp_vstore<T, VEC, !PST>(dx + q * VEC, v);
                } else {
                    /* complete already (the statistics group waited on it; not refilled before this
                     * warp's release): the acquire makes the bulk copy's bytes visible here */
                    mbar_wait(&full[s], ph);
                    const uint4* buf = rr_ring + (size_t)s * sub - v0;
#pragma unroll 2
                    for (; q < hi; q += ng) {
                        float v[VEC];
                        rp_unpack<T>(buf[q], v);
                        const int64_t dq = y - g.h - q * VEC;
                        const int ty = dq >= 0 && dq < VEC ? (int)dq : -1;   /* 32-bit compares per element */
#pragma unroll
                        for (int k = 0; k < VEC; k++) v[k] = L::grad(a, coef, v[k], k == ty);
                        rp_vstore<T, VEC, !PST>(dx + q * VEC, v);
                    }
                }
                if constexpr (NB) {
                    nbar_release(s, (ngw + 1) * 32);
                } else {
                    __syncwarp();   /* why: the warp's reads of slot s are done before its release */
                    if (lane == 0) mbar_arrive(&empty[s]);
                }
            }
            if (ej >= 0) dx[ej - g.h] = from_float<T>(kind == 1 ? 0.0f : kind == 2 ? NAN : L::grad(a, coef, xe, ej == y));
        }
    }
#else
    __trap();   /* chosen only on sm_90+ */
#endif
}

/* The host plan: one CTA an SM (its ring), rows of > 1024 classes whose vectors fit the ring with
 * `slack` bytes for the next rows. Knobs <prefix>_THREADS (CTA size, default 544, at most 672),
 * _STATS (statistics threads, default half of the non-producer warps), _RING (KB, default 200), _SUB
 * (KB a slot at most, default 20), _SLACK (KB, default 48), _PLAIN_ST (default 1: default-cached
 * gradient stores, as the CE ring measured best; 0: evict-first), _GRID (cap the CTAs: tests), _NBAR (default
 * 0; 1: the slots released through hardware barriers, NB above, with _PLAIN_ST=1 only), _TMAP (default 1
 * since s21: the producer through tensor maps, TM above, racecheck-clean refills at the same speed, H100 s21
 * run 1 Taylor 8192x32000 bf16 graph step 0.405 raw / 0.406 ms TM; 0: raw copies; not with _NBAR). */
typedef struct {
    int sub, R, T, Ts, pst, nb, tm;
    size_t smem;
    unsigned grid;
    FlTmaps maps;   /* tm: the input's tensor maps (rr_plan); else zero. The kernel's last argument. */
} RrPlan;

/* knob <prefix>_<name>: a size (flag false: <= 0 means the default) or a switch (flag true: 0 is off) */
static inline int64_t rr_knob_read(const char* prefix, const char* name, int64_t dflt, bool flag) {
    char key[96];
    snprintf(key, sizeof key, "%s_%s", prefix, name);
    return flag ? rp_env_flag(key, dflt) : rp_env_i64(key, dflt);
}
static inline int64_t rr_knob(const char* prefix, const char* name, int64_t dflt) {
    return rr_knob_read(prefix, name, dflt, false);
}

/* fills everything but grid; 0 when the rows do not fit */
static inline int rr_plan_shape(const char* prefix, int64_t C, size_t es, RrPlan* out) {
    const int64_t nvec = C / (int64_t)(16 / es);
    int T = (int)rr_knob(prefix, "THREADS", 544) / 32 * 32;
    if (T < 128 || T > RR_MAX_THREADS) T = 544;
    int Ts = (int)rr_knob(prefix, "STATS", (T - 32) / 64 * 32) / 32 * 32;
    if (Ts < 32 || Ts > T - 64) Ts = (T - 32) / 64 * 32;
    int ring_kb = (int)rr_knob(prefix, "RING", 200);
    if (ring_kb < 16 || ring_kb > 220) ring_kb = 200;
    int sub_kb = (int)rr_knob(prefix, "SUB", 20);
    if (sub_kb < 1 || sub_kb > 64) sub_kb = 20;
    const int64_t slack = rr_knob(prefix, "SLACK", 48) * 1024;
    const int64_t ring = (int64_t)ring_kb * 64, subv = (int64_t)sub_kb * 64;   /* 16-byte vectors */
    int64_t ns = (nvec + subv - 1) / subv, sb = (nvec + ns - 1) / ns;
    const int nb = rr_knob_read(prefix, "NBAR", 0, true) != 0;
    const int tm = !nb && rr_knob_read(prefix, "TMAP", 1, true) != 0;   /* TM unless _TMAP=0 or _NBAR=1 */
    if (tm) fl__tmap_round(nvec, &sb, &ns);   /* (cluster.cuh) */
    int64_t r = ring / sb;
    if (r > RR_MAX_SLOTS) r = RR_MAX_SLOTS;
    if (nb && r > NB_MAX_SLOTS) r = NB_MAX_SLOTS;   /* hardware barriers 2-15 */
    if (r > (RR_XSLOTS / 2 + 1) * ns - 1) r = (RR_XSLOTS / 2 + 1) * ns - 1;   /* the xslot reuse bound */
    if (r - ns < 1 || (r - ns) * sb * 16 < slack) return 0;
    out->sub = (int)sb;
    out->R = (int)r;
    out->T = T;
    out->Ts = Ts;
    out->pst = rr_knob_read(prefix, "PLAIN_ST", 1, true) != 0;
    out->nb = nb;
    out->tm = tm;
    out->smem = (size_t)r * (size_t)sb * 16 + (tm ? 128 : 0);   /* TM: room to align the ring to 128 bytes */
    return 1;
}

template <class L, typename T>
static inline const void* rr_pick_t(bool pst, bool nb, bool tm) {
    if (nb) return pst ? (const void*)rr_kernel<T, L, true, true> : nullptr;   /* NB: default-cached stores only */
    if (tm) return pst ? (const void*)rr_kernel<T, L, true, false, true> : (const void*)rr_kernel<T, L, false, false, true>;
    return pst ? (const void*)rr_kernel<T, L, true> : (const void*)rr_kernel<T, L, false>;
}

/* The plan and kernel of loss L for a call (nullptr: the caller's other kernels): fused rows of > 1024
 * classes on sm_90, `vecs` (16-byte aligned rows, or logits and dlogits of one 16-byte phase), the
 * knob `prefix` (on = 1; `on` its default) and the rows fitting the ring. `what` names the kernel in
 * FUSEDLOSS_DEBUG's occupancy line. */
template <class L>
static inline const void* rr_plan(const char* prefix, int on, const char* what, fl_dtype dt, int64_t N, int64_t C,
                                  bool vecs, int fused, const void* x, int64_t ld, RrPlan* p) {
    if (!fused || !vecs || C <= 1024 || N <= 0 || rp_env_flag(prefix, on) != 1) return nullptr;
    DevInfo d;
    if (dev_info(&d) != cudaSuccess || d.cc_major < 9) { (void)cudaGetLastError(); return nullptr; }
    if (!rr_plan_shape(prefix, C, fl__dtype_size(dt), p)) return nullptr;
    memset(&p->maps, 0, sizeof p->maps);
    if (p->tm)   /* no driver entry point / too big: raw copies (the plan's slots stay rounded) */
        p->tm = fl__tmap_note(fl__tmaps_encode(x, (size_t)((N - 1) * ld + C) * fl__dtype_size(dt), &p->maps) == 0,
                              what, (int)rp_env_i64("FUSEDLOSS_DEBUG", 0));
    const void* fn = dt == FL_DTYPE_F32 ? rr_pick_t<L, float>(p->pst, p->nb, p->tm)
                     : dt == FL_DTYPE_F16 ? rr_pick_t<L, __half>(p->pst, p->nb, p->tm)
                                          : rr_pick_t<L, __nv_bfloat16>(p->pst, p->nb, p->tm);
    if (!fn) return nullptr;
    int n = 0;   /* resident CTAs (the occupancy query also raises fn's shared-memory limit) */
    if (fl__cluster_occupancy(fn, 0, p->T, p->smem, d.sms, (int)rp_env_i64("FUSEDLOSS_DEBUG", 0), what, &n) !=
            cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return nullptr;
    }
    const int64_t gcap = rr_knob(prefix, "GRID", 0);
    if (gcap > 0 && n > gcap) n = (int)gcap;
    p->grid = (unsigned)(N < n ? N : n);
    return fn;
}

#endif /* FL_CUDA_RINGROW_CUH */
