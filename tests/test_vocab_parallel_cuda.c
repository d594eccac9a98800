/* test_vocab_parallel_cuda.c — the CUDA vocab-parallel cross-entropy steps (header section 8)
 * against the CPU steps of the same library (the specification; tests/test_vocab_parallel.c checks
 * those against the single-rank cross-entropy and a long-double reference).
 *
 * k ranks are simulated on one GPU: the vocabulary is cut into k contiguous shards (even, uneven,
 * one-column shards, ld > V_local with NaN padding), each shard's logits live in their own device
 * buffer; step 1 runs per shard, step 2 is a device-to-device copy of each rank's stats into the
 * gathered array in rank order, step 3 combines, step 4 runs per shard. The CPU steps run on the
 * same shards. Compared: the stats rows, loss, lse and every dlogits element; padding and the
 * logits of ignored rows (NaN) must stay unread/unwritten; every output is poisoned (0xFF: NaN)
 * before each call. Also: the whole-vocabulary CUDA fused cross-entropy (k = 1 semantics) vs the
 * k-rank result; CUDA graph capture + replay of the four steps (bitwise = eager); determinism
 * (two runs bitwise equal); out-of-range targets (error flag, NaN loss rows, context usable);
 * CUDA-only argument checks.
 *
 * Tolerances (|gpu - cpu| <= atol + rtol |cpu|), as tests/test_cross_entropy_cuda.c derives them
 * (GPU fp32 accumulation vs CPU double, the same inputs):
 *   stats m: rtol 1e-6 (the max of the same values; tanhf vs tanh with a softcap); s: rtol 3e-5
 *   (a sum of positive terms from ex2.approx, whose error grows with |z - m| <= ~60);
 *   wz: atol 1e-6 + 1e-5 sum_j w_j |z_j| (an fp32 sum of signed terms); zt: rtol 1e-6, atol 1e-7.
 *   loss, lse: atol 1e-5, rtol 1e-5.
 *   dlogits: fp32 rtol 3e-5; fp16/bf16 at most 1 ulp apart; plus atol = 1e-5 |G| w_max
 *   ([j == t] + eps/V) (the cancelling entries, see the CE test) and a floor (fp16 2^-24).
 *   With a softcap, fp32 also rtol 2^-21 / (1 - r^2), r = tanh(scale x / cap): the cancellation
 *   of the softcap derivative where |r| -> 1.
 *
 * Build: make test-cuda (cc ... tests/test_vocab_parallel_cuda.c build/libfusedloss.a -lcudart ...)
 * Run:   build/test_vocab_parallel_cuda [--small] [seed]   (--small: shapes for compute-sanitizer)
 * Ends with "N passed, M failed"; exit 0 iff none failed. Without a CUDA device: "SKIP", exit 0.
 */
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "ce_configs.h"

#include "cuda_check.h"

typedef struct { double atol, rtol; } tol2;
static const tol2 TOL_LOSS = {1e-5, 1e-5};
static const double TOL_DL32_RTOL = 3e-5;
static const double TOL_DL_FLOOR[3] = {1e-37, 5.96e-8, 1e-37};  /* f32, f16 (2^-24), bf16 */

static cudaStream_t g_s;
static int g_small;

static void* dalloc(size_t n) {
    void* p = NULL;
    CK(cudaMalloc(&p, n ? n : 16));
    return p;
}
static void h2d(void* d, const void* h, size_t n) { CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, g_s)); CK(cudaStreamSynchronize(g_s)); }
static void d2h(void* h, const void* d, size_t n) { CK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, g_s)); CK(cudaStreamSynchronize(g_s)); }
static void dpoison(void* d, size_t n) { CK(cudaMemsetAsync(d, 0xFF, n, g_s)); }

static int close_to(double got, double ref, double atol, double rtol) {
    if (isnan(ref)) return isnan(got);
    if (isinf(ref)) return got == ref;
    return fabs(got - ref) <= atol + rtol * fabs(ref);
}

/* ordered integer of a 16-bit float's bits, for ulp distances */
static int32_t ord16(uint16_t h) { return (h & 0x8000) ? -(int32_t)(h & 0x7fff) : (int32_t)h; }

/* One problem and its k shards. */
typedef struct {
    int64_t N, V;
    fl_dtype dt;
    fl_index_dtype it;
    fl_ce_options o;
    float* w;
    float* off;       /* per-class logit offsets (global [V]) or NULL */
    void* x;        /* host [N][V] full logits (ignored rows NaN) */
    void* t;        /* host targets */
    float* gl;      /* host upstream gradient or NULL */
    float gs;
    int k;
    int64_t start[8], len[8], ld[8];
} prob_t;

static int64_t tget(const prob_t* p, int64_t i) {
    return p->it == FL_INDEX_I32 ? ((int32_t*)p->t)[i] : ((int64_t*)p->t)[i];
}
static int64_t nloss(const prob_t* p) { return p->o.reduction == FL_REDUCTION_NONE ? p->N : 1; }

static prob_t make_prob(tu_rng* r, const cfg_t* c, int64_t N, int64_t V, fl_dtype dt, fl_index_dtype it, int k,
                        int uneven, int pad, int gmode) {
    prob_t p;
    memset(&p, 0, sizeof p);
    p.N = N; p.V = V; p.dt = dt; p.it = it; p.k = k;
    p.o = cfg_options(c, V, r, &p.w, &p.off);
    p.gs = (float)tu_uniform_in(r, 0.5, 1.5);
    p.t = tu_xmalloc((size_t)(N ? N : 1) * 8);
    for (int64_t i = 0; i < N; i++) {
        int64_t t = tu_int_in(r, 0, V - 1);
        if (i % 7 == 3) t = p.o.ignore_index;
        if (it == FL_INDEX_I32) ((int32_t*)p.t)[i] = (int32_t)t;
        else ((int64_t*)p.t)[i] = t;
    }
    if (p.w && p.o.reduction == FL_REDUCTION_MEAN)  /* keep D_w > 0 */
        for (int64_t i = 0; i < N; i++)
            if (tget(&p, i) != p.o.ignore_index) { p.w[tget(&p, i)] = 1.0f; break; }
    const size_t es = tu_dtype_size(dt);
    p.x = tu_xmalloc((size_t)(N ? N : 1) * (size_t)V * es);
    tu_poison(p.x, (size_t)(N ? N : 1) * (size_t)V * es);
    for (int64_t i = 0; i < N; i++) {
        if (tget(&p, i) == p.o.ignore_index) continue;
        for (int64_t j = 0; j < V; j++) tu_store(p.x, dt, i * V + j, (float)(2.0 * tu_normal(r)));
    }
    if (gmode) {
        p.gl = (float*)tu_xmalloc((size_t)nloss(&p) * 4);
        for (int64_t i = 0; i < nloss(&p); i++) p.gl[i] = (float)tu_uniform_in(r, -2.0, 2.0);
    }
    /* shards: even, or uneven (random cuts, a one-column shard when V allows) */
    int64_t s0 = 0;
    for (int q = 0; q < k; q++) {
        int64_t left = V - s0, rest = k - q - 1, n;
        if (!uneven) n = V / k + (q < V % k ? 1 : 0);
        else if (q == 0 && V >= 3 * k) n = 1;
        else n = rest ? tu_int_in(r, 1, left - rest) : left;
        if (q == k - 1) n = left;
        p.start[q] = s0; p.len[q] = n;
        p.ld[q] = n + (pad ? 1 + (q % 3) * 7 : 0);
        s0 += n;
    }
    return p;
}

static void free_prob(prob_t* p) { free(p->w); free(p->off); free(p->x); free(p->t); free(p->gl); }

/* The outputs of the k-rank computation on one backend. */
typedef struct {
    float* stats;    /* [k][N][4] gathered */
    float* loss;     /* [nloss] */
    float* lse;      /* [N] */
    void* dl[8];     /* per shard [N][ld] */
} vp_out;

static size_t shard_bytes(const prob_t* p, int q) { return (size_t)(p->N ? p->N : 1) * (size_t)p->ld[q] * tu_dtype_size(p->dt); }

/* host shard copy, padding NaN */
static void* host_shard(const prob_t* p, int q) {
    void* s = tu_xmalloc(shard_bytes(p, q));
    tu_poison(s, shard_bytes(p, q));
    const size_t es = tu_dtype_size(p->dt);
    for (int64_t i = 0; i < p->N; i++)
        memcpy((char*)s + (size_t)(i * p->ld[q]) * es, (const char*)p->x + (size_t)(i * p->V + p->start[q]) * es,
               (size_t)p->len[q] * es);
    return s;
}

static void run_cpu(const prob_t* p, void* const* hs, vp_out* v) {
    const int64_t N = p->N;
    size_t b1, b3;
    v->stats = (float*)tu_xmalloc((size_t)p->k * (size_t)(N ? N : 1) * 16);
    v->loss = (float*)tu_xmalloc((size_t)nloss(p) * 4 + 4);
    v->lse = (float*)tu_xmalloc((size_t)(N ? N : 1) * 4);
    for (int q = 0; q < p->k; q++) {
        CHECK_STATUS(fl_cross_entropy_workspace_size(&b1, N, p->len[q], p->dt, &p->o), FL_OK, "ws");
        void* ws = tu_xmalloc(b1);
        CHECK_STATUS(fl_vp_ce_local_stats_cpu(v->stats + 4 * (size_t)q * (size_t)N, hs[q], p->t, N, p->len[q], p->ld[q],
                                              p->start[q], p->V, p->dt, p->it, &p->o, ws, b1),
                     FL_OK, "cpu stats");
        free(ws);
    }
    CHECK_STATUS(fl_cross_entropy_workspace_size(&b3, N, p->V, FL_DTYPE_F16, &p->o), FL_OK, "ws");
    void* ws3 = tu_xmalloc(b3);
    CHECK_STATUS(fl_vp_ce_combine_cpu(v->loss, v->lse, v->stats, p->k, p->t, N, p->V, p->it, &p->o, ws3, b3), FL_OK,
                 "cpu combine");
    free(ws3);
    for (int q = 0; q < p->k; q++) {
        CHECK_STATUS(fl_cross_entropy_workspace_size(&b1, N, p->len[q], p->dt, &p->o), FL_OK, "ws");
        void* ws = tu_xmalloc(b1);
        v->dl[q] = tu_xmalloc(shard_bytes(p, q));
        tu_poison(v->dl[q], shard_bytes(p, q));
        CHECK_STATUS(fl_vp_ce_backward_cpu(v->dl[q], hs[q], p->t, v->lse, p->gl, p->gs, N, p->len[q], p->ld[q],
                                           p->start[q], p->V, p->dt, p->it, &p->o, ws, b1),
                     FL_OK, "cpu backward");
        free(ws);
    }
}

/* Device state of one problem. */
typedef struct {
    void* x[8];       /* shard logits */
    void* dl[8];      /* shard dlogits (== x when in place) */
    void* t;
    float* w;
    float* off;
    float* gl;
    float* stats[8];  /* each rank's step-1 output */
    float* gath;      /* [k][N][4] */
    float* loss;
    float* lse;
    void* ws;
    size_t wsb;
    int32_t* flag;
    fl_ce_options o;
    int inplace;
} dev_t;

static void dev_setup(const prob_t* p, void* const* hs, dev_t* d, int inplace) {
    memset(d, 0, sizeof *d);
    const int64_t N = p->N;
    d->inplace = inplace;
    for (int q = 0; q < p->k; q++) {
        d->x[q] = dalloc(shard_bytes(p, q));
        d->dl[q] = inplace ? d->x[q] : dalloc(shard_bytes(p, q));
        d->stats[q] = (float*)dalloc((size_t)(N ? N : 1) * 16);
    }
    const size_t isz = p->it == FL_INDEX_I32 ? 4 : 8;
    d->t = dalloc((size_t)(N ? N : 1) * isz);
    h2d(d->t, p->t, (size_t)N * isz);
    d->o = p->o;
    if (p->w) {
        d->w = (float*)dalloc((size_t)p->V * 4);
        h2d(d->w, p->w, (size_t)p->V * 4);
        d->o.weight = d->w;
    }
    if (p->off) {
        d->off = (float*)dalloc((size_t)p->V * 4);
        h2d(d->off, p->off, (size_t)p->V * 4);
        d->o.logit_offset = d->off;
    }
    if (p->gl) {
        d->gl = (float*)dalloc((size_t)nloss(p) * 4);
        h2d(d->gl, p->gl, (size_t)nloss(p) * 4);
    }
    d->flag = (int32_t*)dalloc(4);
    CK(cudaMemsetAsync(d->flag, 0, 4, g_s));
    d->o.error_flag = d->flag;
    d->gath = (float*)dalloc((size_t)p->k * (size_t)(N ? N : 1) * 16);
    d->loss = (float*)dalloc((size_t)nloss(p) * 4 + 4);
    d->lse = (float*)dalloc((size_t)(N ? N : 1) * 4);
    size_t need = 0, b;
    for (int q = 0; q < p->k; q++) {
        fl_cross_entropy_workspace_size(&b, N, p->len[q], p->dt, &p->o);
        if (b > need) need = b;
    }
    fl_cross_entropy_workspace_size(&b, N, p->V, FL_DTYPE_F16, &p->o);
    if (b > need) need = b;
    d->ws = dalloc(need);
    d->wsb = need;
    (void)hs;
}

static void dev_upload(const prob_t* p, void* const* hs, dev_t* d) {
    for (int q = 0; q < p->k; q++) {
        h2d(d->x[q], hs[q], shard_bytes(p, q));
        if (!d->inplace) dpoison(d->dl[q], shard_bytes(p, q));
        dpoison(d->stats[q], (size_t)(p->N ? p->N : 1) * 16);
    }
    dpoison(d->gath, (size_t)p->k * (size_t)(p->N ? p->N : 1) * 16);
    dpoison(d->loss, (size_t)nloss(p) * 4);
    dpoison(d->lse, (size_t)(p->N ? p->N : 1) * 4);
    CK(cudaStreamSynchronize(g_s));
}

/* the four steps on g_s (no sync: capturable) */
static int dev_steps(const prob_t* p, dev_t* d) {
    const int64_t N = p->N;
    int ok = 1;
    for (int q = 0; q < p->k; q++)
        ok &= fl_vp_ce_local_stats_cuda(d->stats[q], d->x[q], d->t, N, p->len[q], p->ld[q], p->start[q], p->V, p->dt,
                                        p->it, &d->o, d->ws, d->wsb, (fl_stream)g_s) == FL_OK;
    for (int q = 0; q < p->k; q++)  /* step 2: the "all-gather" in rank order */
        if (N > 0)
            CK(cudaMemcpyAsync(d->gath + 4 * (size_t)q * (size_t)N, d->stats[q], (size_t)N * 16,
                               cudaMemcpyDeviceToDevice, g_s));
    ok &= fl_vp_ce_combine_cuda(d->loss, d->lse, d->gath, p->k, d->t, N, p->V, p->it, &d->o, d->ws, d->wsb,
                                (fl_stream)g_s) == FL_OK;
    for (int q = 0; q < p->k; q++)
        ok &= fl_vp_ce_backward_cuda(d->dl[q], d->x[q], d->t, d->lse, d->gl, p->gs, N, p->len[q], p->ld[q],
                                     p->start[q], p->V, p->dt, p->it, &d->o, d->ws, d->wsb, (fl_stream)g_s) == FL_OK;
    if (!ok) fprintf(stderr, "  step failed: %s\n", fl_last_error());
    return ok;
}

static void dev_free(const prob_t* p, dev_t* d) {
    for (int q = 0; q < p->k; q++) {
        cudaFree(d->x[q]);
        if (!d->inplace) cudaFree(d->dl[q]);
        cudaFree(d->stats[q]);
    }
    cudaFree(d->t); cudaFree(d->w); cudaFree(d->off); cudaFree(d->gl); cudaFree(d->gath); cudaFree(d->loss); cudaFree(d->lse);
    cudaFree(d->ws); cudaFree(d->flag);
}

/* z of the configuration, for the wz tolerance */
static double zmap(const fl_ce_options* o, double x) {
    double z = o->logit_scale * x;
    if (o->softcap > 0) z = o->softcap * tanh(z / o->softcap);
    return z;
}

static long g_cases;

/* Compare the GPU outputs (downloaded) with the CPU's. */
static int compare(const prob_t* p, void* const* hs, const vp_out* c, const vp_out* g, const char* label) {
    const int64_t N = p->N;
    int bad = 0, shown = 0;
#define BAD(...) do { bad++; if (shown++ < 5) { printf("  FAIL %s: ", label); printf(__VA_ARGS__); printf("\n"); } } while (0)
    /* stats */
    for (int q = 0; q < p->k; q++)
        for (int64_t i = 0; i < N; i++) {
            const float* a = g->stats + 4 * ((size_t)q * N + i);
            const float* b = c->stats + 4 * ((size_t)q * N + i);
            /* wz and zt are sums of fp32 terms: their error scales with the terms' magnitudes
             * (|z| and, with offsets, |softcap(s x)| + |o| of each), not with the (cancelling) sum */
            double swz = 0.0, szt = 0.0;
            const int64_t ti = tget(p, i);
            if (ti != p->o.ignore_index) {
                for (int64_t j = 0; j < p->len[q]; j++)
                    swz += (p->w ? p->w[p->start[q] + j] : 1.0) *
                           (fabs(zmap(&p->o, tu_load(hs[q], p->dt, i * p->ld[q] + j))) +
                            (p->off ? fabs(p->off[p->start[q] + j]) : 0.0));
                if (ti >= p->start[q] && ti < p->start[q] + p->len[q])
                    szt = fabs(zmap(&p->o, tu_load(hs[q], p->dt, i * p->ld[q] + (ti - p->start[q])))) +
                          (p->off ? fabs(p->off[ti]) : 0.0);
            }
            if (!close_to(a[0], b[0], 1e-7, 1e-6) || !close_to(a[1], b[1], 1e-30, 3e-5) ||
                !close_to(a[2], b[2], 1e-6 + 1e-5 * swz, 0) || !close_to(a[3], b[3], 1e-7 + 1e-6 * szt, 0))
                BAD("stats rank %d row %lld: gpu (%g %g %g %g) cpu (%g %g %g %g)", q, (long long)i, a[0], a[1], a[2],
                    a[3], b[0], b[1], b[2], b[3]);
        }
    for (int64_t i = 0; i < nloss(p); i++)
        if (!close_to(g->loss[i], c->loss[i], TOL_LOSS.atol, TOL_LOSS.rtol))
            BAD("loss[%lld] gpu %.9g cpu %.9g", (long long)i, g->loss[i], c->loss[i]);
    for (int64_t i = 0; i < N; i++)
        if (!close_to(g->lse[i], c->lse[i], TOL_LOSS.atol, TOL_LOSS.rtol))
            BAD("lse[%lld] gpu %.9g cpu %.9g", (long long)i, g->lse[i], c->lse[i]);
    /* dlogits: the upstream magnitude per row for the cancellation atol */
    double D = 1.0;
    if (p->o.reduction == FL_REDUCTION_MEAN) {
        double dw = 0, dn = 0;
        for (int64_t i = 0; i < N; i++) {
            int64_t t = tget(p, i);
            if (t == p->o.ignore_index) continue;
            dn += 1;
            dw += p->w ? p->w[t] : 1.0;
        }
        D = fmin(dw, dn) > 0 ? fmin(dw, dn) : 1.0;
    }
    double wmax = 1.0;
    if (p->w) for (int64_t j = 0; j < p->V; j++) wmax = fmax(wmax, p->w[j]);
    const int di = p->dt == FL_DTYPE_F32 ? 0 : p->dt == FL_DTYPE_F16 ? 1 : 2;
    for (int q = 0; q < p->k; q++)
        for (int64_t i = 0; i < N; i++) {
            const int64_t t = tget(p, i);
            const double G = fabs(p->gs * (p->gl ? p->gl[p->o.reduction == FL_REDUCTION_NONE ? i : 0] : 1.0f) *
                                  p->o.logit_scale) / D;
            for (int64_t j = 0; j < p->ld[q]; j++) {
                const int64_t e = i * p->ld[q] + j;
                if (j >= p->len[q]) {  /* padding: never written */
                    if (!tu_is_poison(g->dl[q], tu_dtype_size(p->dt), e) &&
                        memcmp((const char*)g->dl[q] + e * tu_dtype_size(p->dt),
                               (const char*)hs[q] + e * tu_dtype_size(p->dt), tu_dtype_size(p->dt)))
                        BAD("shard %d padding (%lld, %lld) written", q, (long long)i, (long long)j);
                    continue;
                }
                const double a = tu_load(g->dl[q], p->dt, e), b = tu_load(c->dl[q], p->dt, e);
                const double atol = TOL_DL_FLOOR[di] +
                                    1e-5 * G * wmax * ((p->start[q] + j == t ? 1.0 : 0.0) + p->o.label_smoothing / p->V);
                /* softcap: the factor 1 - r^2 (r = z / cap = tanh(.)) cancels where |r| -> 1; the
                 * GPU's fp32 r (tanhf, ~1 ulp) then carries 2^-23 / (1 - r^2) relative error into
                 * the element (the CE CUDA test's caps, >= 8 with moderate logits, never get there;
                 * "logit_scale 2 + softcap 2.5" does) */
                double rt_cap = 0.0;
                if (p->o.softcap > 0.0f) {
                    const double r = tanh(p->o.logit_scale * tu_load(hs[q], p->dt, e) / p->o.softcap);
                    rt_cap = 4.0 / 8388608.0 / fmax(1.0 - r * r, 1e-30);
                }
                int ok;
                if (isnan(b) || isnan(a)) ok = isnan(a) && isnan(b);
                else if (p->dt == FL_DTYPE_F32) ok = fabs(a - b) <= atol + (TOL_DL32_RTOL + rt_cap) * fabs(b);
                else {
                    const int32_t ua = ord16((uint16_t)tu_bits(g->dl[q], p->dt, e));
                    const int32_t ub = ord16((uint16_t)tu_bits(c->dl[q], p->dt, e));
                    ok = abs(ua - ub) <= 1 || fabs(a - b) <= atol;
                }
                if (!ok) BAD("dlogits shard %d (%lld, %lld) gpu %.9g cpu %.9g", q, (long long)i, (long long)j, a, b);
            }
        }
#undef BAD
    CHECK(bad == 0, "%s: %d mismatches", label, bad);
    return bad == 0;
}

static void download(const prob_t* p, const dev_t* d, vp_out* g) {
    const int64_t N = p->N;
    g->stats = (float*)tu_xmalloc((size_t)p->k * (size_t)(N ? N : 1) * 16);
    g->loss = (float*)tu_xmalloc((size_t)nloss(p) * 4 + 4);
    g->lse = (float*)tu_xmalloc((size_t)(N ? N : 1) * 4);
    d2h(g->stats, d->gath, (size_t)p->k * (size_t)N * 16);
    d2h(g->loss, d->loss, (size_t)nloss(p) * 4);
    d2h(g->lse, d->lse, (size_t)N * 4);
    for (int q = 0; q < p->k; q++) {
        g->dl[q] = tu_xmalloc(shard_bytes(p, q));
        d2h(g->dl[q], d->dl[q], shard_bytes(p, q));
    }
}

static void free_out(const prob_t* p, vp_out* v) {
    free(v->stats); free(v->loss); free(v->lse);
    for (int q = 0; q < p->k; q++) free(v->dl[q]);
}

/* The whole-vocabulary CUDA fused CE on the same logits: the k-rank loss equals it. */
static void check_vs_fused(const prob_t* p, const vp_out* g, const char* label) {
    const int64_t N = p->N;
    if (N == 0) return;
    const size_t es = tu_dtype_size(p->dt), isz = p->it == FL_INDEX_I32 ? 4 : 8;
    void* x = dalloc((size_t)N * p->V * es);
    void* dl = dalloc((size_t)N * p->V * es);
    void* t = dalloc((size_t)N * isz);
    float* loss = (float*)dalloc((size_t)nloss(p) * 4);
    float* lse = (float*)dalloc((size_t)N * 4);
    float *w = NULL, *gl = NULL;
    fl_ce_options o = p->o;
    if (p->w) { w = (float*)dalloc((size_t)p->V * 4); h2d(w, p->w, (size_t)p->V * 4); o.weight = w; }
    float* off = NULL;
    if (p->off) { off = (float*)dalloc((size_t)p->V * 4); h2d(off, p->off, (size_t)p->V * 4); o.logit_offset = off; }
    if (p->gl) { gl = (float*)dalloc((size_t)nloss(p) * 4); h2d(gl, p->gl, (size_t)nloss(p) * 4); }
    h2d(x, p->x, (size_t)N * p->V * es);
    h2d(t, p->t, (size_t)N * isz);
    size_t b;
    fl_cross_entropy_workspace_size(&b, N, p->V, p->dt, &o);
    void* ws = dalloc(b);
    fl_status st = fl_cross_entropy_fused_cuda(loss, lse, dl, x, t, gl, p->gs, N, p->V, p->V, p->dt, p->it, &o, ws, b,
                                               (fl_stream)g_s);
    CHECK_STATUS(st, FL_OK, "fl_cross_entropy_fused_cuda");
    float* hl = (float*)tu_xmalloc((size_t)nloss(p) * 4);
    float* hlse = (float*)tu_xmalloc((size_t)N * 4);
    d2h(hl, loss, (size_t)nloss(p) * 4);
    d2h(hlse, lse, (size_t)N * 4);
    int bad = 0;
    for (int64_t i = 0; i < nloss(p); i++) bad += !close_to(g->loss[i], hl[i], 2 * TOL_LOSS.atol, 2 * TOL_LOSS.rtol);
    for (int64_t i = 0; i < N; i++) bad += !close_to(g->lse[i], hlse[i], 2 * TOL_LOSS.atol, 2 * TOL_LOSS.rtol);
    CHECK(bad == 0, "%s: k-rank loss/lse vs the whole-vocabulary fused CUDA call: %d mismatches (loss %.9g vs %.9g)",
          label, bad, g->loss[0], hl[0]);
    free(hl); free(hlse);
    cudaFree(x); cudaFree(dl); cudaFree(t); cudaFree(loss); cudaFree(lse); cudaFree(w); cudaFree(off); cudaFree(gl); cudaFree(ws);
}

static void run_case(tu_rng* r, int cfg, int64_t N, int64_t V, fl_dtype dt, int k, int uneven, int pad, int gmode,
                     int inplace, int extras) {
    const fl_index_dtype it = (g_cases & 1) ? FL_INDEX_I32 : FL_INDEX_I64;
    g_cases++;
    prob_t p = make_prob(r, &CFGS[cfg], N, V, dt, it, k, uneven, pad, gmode);
    char label[256];
    snprintf(label, sizeof label, "%s N=%lld V=%lld %s k=%d%s%s g=%s%s", CFGS[cfg].name, (long long)N, (long long)V,
             tu_dtype_name(dt), k, uneven ? " uneven" : "", pad ? " ld>V" : "", gmode ? "given" : "NULL",
             inplace ? " in-place" : "");
    void* hs[8];
    for (int q = 0; q < k; q++) hs[q] = host_shard(&p, q);
    vp_out c, g;
    run_cpu(&p, hs, &c);
    dev_t d;
    dev_setup(&p, hs, &d, inplace);
    dev_upload(&p, hs, &d);
    int ok = CHECK(dev_steps(&p, &d), "%s: CUDA steps returned an error", label);
    CK(cudaStreamSynchronize(g_s));
    CK(cudaGetLastError());
    download(&p, &d, &g);
    ok &= compare(&p, hs, &c, &g, label);
    int32_t flag = -1;
    d2h(&flag, d.flag, 4);
    ok &= CHECK(flag == 0, "%s: error flag %d with in-range targets", label, flag);
    if (extras) {
        check_vs_fused(&p, &g, label);
        /* determinism: a second eager run, bitwise */
        vp_out g2;
        dev_upload(&p, hs, &d);
        dev_steps(&p, &d);
        CK(cudaStreamSynchronize(g_s));
        download(&p, &d, &g2);
        int same = memcmp(g.loss, g2.loss, (size_t)nloss(&p) * 4) == 0 && memcmp(g.lse, g2.lse, (size_t)N * 4) == 0;
        for (int q = 0; q < k; q++) same &= memcmp(g.dl[q], g2.dl[q], shard_bytes(&p, q)) == 0;
        CHECK(same, "%s: two eager runs differ", label);
        free_out(&p, &g2);
        /* graph capture of the four steps, replayed after a re-upload: bitwise = eager */
        if (!inplace) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            dev_upload(&p, hs, &d);
            CK(cudaStreamBeginCapture(g_s, cudaStreamCaptureModeThreadLocal));
            int cap_ok = dev_steps(&p, &d);
            CK(cudaStreamEndCapture(g_s, &graph));
            CK(cudaGraphInstantiate(&exec, graph, 0));
            dev_upload(&p, hs, &d);
            CK(cudaGraphLaunch(exec, g_s));
            CK(cudaStreamSynchronize(g_s));
            vp_out g3;
            download(&p, &d, &g3);
            same = cap_ok && memcmp(g.loss, g3.loss, (size_t)nloss(&p) * 4) == 0 &&
                   memcmp(g.lse, g3.lse, (size_t)N * 4) == 0 &&
                   memcmp(g.stats, g3.stats, (size_t)k * (size_t)N * 16) == 0;
            for (int q = 0; q < k; q++) same &= memcmp(g.dl[q], g3.dl[q], shard_bytes(&p, q)) == 0;
            CHECK(same, "%s: graph replay differs from eager", label);
            free_out(&p, &g3);
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
    }
    printf("%-4s %s\n", ok ? "ok" : "FAIL", label);
    free_out(&p, &c);
    free_out(&p, &g);
    dev_free(&p, &d);
    for (int q = 0; q < k; q++) free(hs[q]);
    free_prob(&p);
}

/* Out-of-range targets: flag set, NaN loss row / NaN reduced loss, NaN gradient row, context fine. */
static void test_bad_targets(tu_rng* r) {
    for (int red = 0; red < 2; red++) {
        const int cfg = red ? 1 : 0;  /* none, mean */
        prob_t p = make_prob(r, &CFGS[cfg], 33, 1001, FL_DTYPE_BF16, FL_INDEX_I64, 2, 1, 0, 0);
        ((int64_t*)p.t)[5] = 1001;  /* == V: out of range */
        ((int64_t*)p.t)[6] = -7;
        void* hs[8];
        for (int q = 0; q < p.k; q++) hs[q] = host_shard(&p, q);
        dev_t d;
        dev_setup(&p, hs, &d, 0);
        dev_upload(&p, hs, &d);
        int ok = dev_steps(&p, &d);
        CK(cudaStreamSynchronize(g_s));
        vp_out g;
        download(&p, &d, &g);
        int32_t flag = 0;
        d2h(&flag, d.flag, 4);
        CHECK(ok && flag == 1, "bad targets (%s): steps ok %d, flag %d (want 1)", CFGS[cfg].name, ok, flag);
        if (red) CHECK(isnan(g.loss[5]) && isnan(g.loss[6]) && !isnan(g.loss[4]), "bad targets: NaN loss rows only");
        else CHECK(isnan(g.loss[0]), "bad targets: NaN mean loss");
        int nan_rows = 1;
        for (int q = 0; q < p.k; q++)
            for (int64_t j = 0; j < p.len[q]; j++) nan_rows &= isnan(tu_load(g.dl[q], p.dt, 5 * p.ld[q] + j));
        CHECK(nan_rows, "bad targets: NaN gradient row");
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "bad targets: context still usable");
        free_out(&p, &g);
        dev_free(&p, &d);
        for (int q = 0; q < p.k; q++) free(hs[q]);
        free_prob(&p);
    }
}

/* Arguments only the CUDA steps check (the rest is fl__vp_validate_*, covered by the CPU test). */
static void test_cuda_args(void) {
    fl_ce_options o = FL_CE_OPTIONS_INIT;
    char* x = (char*)dalloc(4096);
    char* dl = (char*)dalloc(4096);
    int64_t* t = (int64_t*)dalloc(64);
    float* st = (float*)dalloc(256);
    float* lse = (float*)dalloc(64);
    size_t b;
    fl_cross_entropy_workspace_size(&b, 4, 100, FL_DTYPE_BF16, &o);
    void* ws = dalloc(b);
    fl_status s = fl_vp_ce_local_stats_cuda(st, x + 1, t, 4, 50, 50, 0, 100, FL_DTYPE_BF16, FL_INDEX_I64, &o, ws, b,
                                            (fl_stream)g_s);
    CHECK(s == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "fl_vp_ce_local_stats_cuda"),
          "misaligned logits: %s", fl_last_error());
    s = fl_vp_ce_backward_cuda(dl + 2, x, t, lse, NULL, 1.0f, 4, 50, 50, 0, 100, FL_DTYPE_BF16, FL_INDEX_I64, &o, ws, b,
                               (fl_stream)g_s);
    CHECK(s == FL_ERR_UNSUPPORTED && strstr(fl_last_error(), "modulo 16"), "dlogits mod 16: %s", fl_last_error());
    s = fl_vp_ce_backward_cuda(dl, x, t, lse, NULL, 1.0f, 4, 50, 50, 60, 100, FL_DTYPE_BF16, FL_INDEX_I64, &o, ws, b,
                               (fl_stream)g_s);
    CHECK(s == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "vocab_start"), "shard outside V: %s",
          fl_last_error());
    s = fl_vp_ce_combine_cuda(st, lse, st, 0, t, 4, 100, FL_INDEX_I64, &o, ws, b, (fl_stream)g_s);
    CHECK(s == FL_ERR_INVALID_ARGUMENT && strstr(fl_last_error(), "k (0)"), "k = 0: %s", fl_last_error());
    cudaFree(x); cudaFree(dl); cudaFree(t); cudaFree(st); cudaFree(lse); cudaFree(ws);
}

int main(int argc, char** argv) {
    uint64_t seed = 0x76705eedULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) g_small = 1;
        else seed = strtoull(argv[i], NULL, 0);
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 0;
    }
    CK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    tu_rng r = tu_rng_seed(seed);
    printf("seed 0x%llx\n", (unsigned long long)seed);
    static const fl_dtype DT[3] = {FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16};

    /* every option configuration, every dtype, small shapes, even/uneven/padded splits */
    for (int c = 0; c < N_CFGS; c++)
        for (int di = 0; di < 3; di++) {
            const int k = 2 + (c + di) % 4;  /* 2..5 */
            run_case(&r, c, 37, 1001, DT[di], k, (c + di) & 1, c % 3 == 0, (c + di) % 3 != 0, 0, c % 9 == 0);
        }
    /* odd shapes: V = 1 (k = 1), 3, N = 1, 0 columns ... */
    run_case(&r, 0, 7, 1, FL_DTYPE_F32, 1, 0, 0, 0, 0, 1);
    run_case(&r, 1, 7, 3, FL_DTYPE_BF16, 3, 0, 1, 1, 0, 0);
    run_case(&r, 2, 1, 8003, FL_DTYPE_F16, 2, 1, 0, 1, 1, 0);
    run_case(&r, CFG_EVERYTHING_NONE, 129, 8003, FL_DTYPE_BF16, 3, 1, 1, 1, 1, 0);
    run_case(&r, CFG_EVERYTHING_MEAN, 129, 8003, FL_DTYPE_F32, 5, 1, 0, 1, 0, 1);
    if (!g_small) {
        /* real shapes: shard rows long enough for the streaming stats kernel and chunked backward */
        run_case(&r, 0, 512, 50257, FL_DTYPE_BF16, 2, 0, 0, 0, 0, 1);
        run_case(&r, 0, 256, 128256, FL_DTYPE_BF16, 2, 0, 0, 0, 1, 0);
        run_case(&r, 3, 256, 128256, FL_DTYPE_F32, 3, 1, 0, 1, 0, 0);
        run_case(&r, CFG_EVERYTHING_MEAN, 192, 151936, FL_DTYPE_BF16, 2, 1, 1, 1, 0, 1);
        run_case(&r, 20, 128, 256000, FL_DTYPE_F16, 4, 1, 0, 1, 0, 0);
        run_case(&r, 11, 1024, 32000, FL_DTYPE_BF16, 2, 0, 0, 1, 0, 1);
    }
    test_bad_targets(&r);
    test_cuda_args();
    CK(cudaStreamDestroy(g_s));
    return tu_finish();
}
