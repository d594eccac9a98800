/* vp_linear_util.h — problems and test-side compositions for the linear vocab-parallel
 * cross-entropy tests (tests/test_vp_linear.c on the CPU, tests/test_vp_linear_cuda.c on the GPU).
 *
 * A problem is one lm_head + cross-entropy: hidden [N, ldh], the FULL weight [V, ldw] and bias [V],
 * global targets, section-5 options (tests/ce_configs.h), an upstream gradient, and a cut of the
 * vocabulary into k contiguous shards [cut[r], cut[r+1]). Rank r's weight is the view of rows
 * cut[r].. of the full weight (rows are 16-byte aligned: ldw * esize is a multiple of 16); its bias
 * is copied into its own buffer (a shard's bias must be 16-byte aligned on CUDA).
 *
 * vpl_shard_logits() forms a shard's logits the way the CPU backend specifies them (section 6: the
 * dot product in double, h ascending, + bias, rounded double -> fp32 -> dtype), so the CPU steps
 * can be checked BITWISE against the logits steps (fl_vp_ce_*_cpu) on those logits, and
 * vpl_shard_grads() forms dhidden_partial / dweight / dbias from a shard's dlogits in the CPU
 * backend's summation order (j ascending for dhidden, rows ascending for dweight and dbias).
 * Header-only; include once per test program (after test_util.h and ce_configs.h).
 */
#ifndef FL_VP_LINEAR_UTIL_H
#define FL_VP_LINEAR_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "ce_configs.h"

#define VPL_MAX_K 8

typedef struct {
    int64_t N, H, V, ldh, ldw;
    fl_dtype dt, wdt;
    fl_index_dtype it;
    int cfg, k, has_bias, grad_mode;  /* grad_mode: 0 grad_loss NULL, 1 given ([N] for NONE, [1] else) */
    int64_t cut[VPL_MAX_K + 1];
    void* hidden;                     /* [N, ldh] of dt */
    void* weight;                     /* [V, ldw] of dt */
    void* bias;                       /* [V] of dt or NULL */
    void* bias_shard[VPL_MAX_K];      /* copies of bias rows cut[r].. (NULL without bias) */
    void* targets;                    /* [N] int32 / int64 */
    float* w;                         /* class weights [V] or NULL */
    float* off;                       /* logit offsets [V] or NULL */
    fl_ce_options opts;
    float* grad_loss;                 /* NULL or [N] / [1] */
    float grad_scale;
} vpl_prob;

static inline size_t vpl_es(fl_dtype dt) { return tu_dtype_size(dt); }

/* ld rounded up so that a row is a multiple of 16 bytes, plus `pad` such steps */
static inline int64_t vpl_ld(int64_t H, fl_dtype dt, int pad) {
    const int64_t per = (int64_t)(16 / vpl_es(dt));
    return (H + per - 1) / per * per + pad * per;
}

static inline const void* vpl_weight_shard(const vpl_prob* P, int r) {
    return (const char*)P->weight + (size_t)P->cut[r] * (size_t)P->ldw * vpl_es(P->dt);
}
static inline int64_t vpl_vl(const vpl_prob* P, int r) { return P->cut[r + 1] - P->cut[r]; }

/* cut[] for k shards of V: even (uneven = 0) or random cuts with at least one column each (uneven). */
static inline void vpl_cuts(vpl_prob* P, tu_rng* rng, int uneven) {
    const int k = P->k;
    P->cut[0] = 0;
    P->cut[k] = P->V;
    if (!uneven) {
        for (int r = 1; r < k; r++) P->cut[r] = P->V * r / k;
        return;
    }
    /* k - 1 distinct cut points in [1, V - 1], sorted; shard 0 of one column when possible */
    for (int r = 1; r < k; r++) {
        int64_t c;
        int dup;
        do {
            c = (r == 1 && P->V > k) ? 1 : tu_int_in(rng, 1, P->V - 1);
            dup = 0;
            for (int q = 1; q < r; q++) dup |= P->cut[q] == c;
        } while (dup);
        P->cut[r] = c;
    }
    for (int a = 1; a < k; a++)
        for (int b = a + 1; b < k; b++)
            if (P->cut[b] < P->cut[a]) { int64_t t = P->cut[a]; P->cut[a] = P->cut[b]; P->cut[b] = t; }
}

/* A fresh problem (k <= V; V >= 1). Logits come out O(3): hidden ~ N(0, 1), weight ~ N(0, 3/sqrt(H)). */
static inline void vpl_make(vpl_prob* P, tu_rng* rng, int64_t N, int64_t H, int64_t V, fl_dtype dt, fl_dtype wdt,
                            fl_index_dtype it, int cfg, int k, int uneven, int has_bias, int grad_mode) {
    memset(P, 0, sizeof *P);
    P->N = N; P->H = H; P->V = V; P->dt = dt; P->wdt = wdt; P->it = it; P->cfg = cfg; P->k = k;
    P->has_bias = has_bias; P->grad_mode = grad_mode;
    P->ldh = vpl_ld(H, dt, (int)(tu_next(rng) % 2));
    P->ldw = vpl_ld(H, dt, (int)(tu_next(rng) % 2));
    const size_t es = vpl_es(dt);
    P->hidden = tu_xmalloc((size_t)(N > 0 ? N : 1) * (size_t)P->ldh * es);
    P->weight = tu_xmalloc((size_t)V * (size_t)P->ldw * es);
    tu_poison(P->hidden, (size_t)(N > 0 ? N : 1) * (size_t)P->ldh * es);
    tu_poison(P->weight, (size_t)V * (size_t)P->ldw * es);  /* padding stays NaN: never read */
    for (int64_t i = 0; i < N; i++)
        for (int64_t h = 0; h < H; h++) tu_store(P->hidden, dt, i * P->ldh + h, (float)tu_normal(rng));
    const double ws = 3.0 / sqrt((double)H);
    for (int64_t j = 0; j < V; j++)
        for (int64_t h = 0; h < H; h++) tu_store(P->weight, dt, j * P->ldw + h, (float)(ws * tu_normal(rng)));
    if (has_bias) {
        P->bias = tu_xmalloc((size_t)V * es);
        for (int64_t j = 0; j < V; j++) tu_store(P->bias, dt, j, (float)tu_uniform_in(rng, -1.0, 1.0));
    }
    P->opts = cfg_options(&CFGS[cfg], V, rng, &P->w, &P->off);
    /* targets: any class, some rows the ignore_index (when it is not a class of the row) */
    const size_t is = it == FL_INDEX_I64 ? 8 : 4;
    P->targets = tu_xmalloc((size_t)(N > 0 ? N : 1) * is);
    for (int64_t i = 0; i < N; i++) {
        int64_t t = tu_int_in(rng, 0, V - 1);
        if (tu_next(rng) % 5 == 0) t = P->opts.ignore_index;
        if (it == FL_INDEX_I64) ((int64_t*)P->targets)[i] = t;
        else ((int32_t*)P->targets)[i] = (int32_t)t;
    }
    vpl_cuts(P, rng, uneven);
    for (int r = 0; r < k; r++) {
        if (!has_bias) continue;
        const int64_t vl = vpl_vl(P, r);
        P->bias_shard[r] = tu_xmalloc((size_t)vl * es);
        memcpy(P->bias_shard[r], (const char*)P->bias + (size_t)P->cut[r] * es, (size_t)vl * es);
    }
    P->grad_scale = (float)tu_uniform_in(rng, 0.5, 2.0);
    if (grad_mode) {
        const int64_t ng = P->opts.reduction == FL_REDUCTION_NONE ? N : 1;
        P->grad_loss = (float*)tu_xmalloc((size_t)(ng > 0 ? ng : 1) * sizeof(float));
        for (int64_t i = 0; i < ng; i++) P->grad_loss[i] = (float)tu_uniform_in(rng, -1.5, 1.5);
    }
}

static inline void vpl_free(vpl_prob* P) {
    free(P->hidden); free(P->weight); free(P->bias); free(P->targets); free(P->w); free(P->off); free(P->grad_loss);
    for (int r = 0; r < P->k; r++) free(P->bias_shard[r]);
    memset(P, 0, sizeof *P);
}

/* Shard r's logits [N, ldl] (ldl >= V_local) as section 6 specifies them on the CPU. */
static inline void vpl_shard_logits(const vpl_prob* P, int r, void* L, int64_t ldl) {
    const int64_t vl = vpl_vl(P, r), c0 = P->cut[r];
    for (int64_t i = 0; i < P->N; i++)
        for (int64_t j = 0; j < vl; j++) {
            double acc = 0.0;
            for (int64_t h = 0; h < P->H; h++)
                acc += (double)tu_load(P->hidden, P->dt, i * P->ldh + h) *
                       (double)tu_load(P->weight, P->dt, (c0 + j) * P->ldw + h);
            if (P->bias) acc += (double)tu_load(P->bias, P->dt, c0 + j);
            tu_store(L, P->dt, i * ldl + j, tu_round_to(P->dt, (float)acc));
        }
}

/* From shard r's dlogits dL [N, ldl] (dtype): dhp [N, H] fp32 = sum_j dL W_j (j ascending),
 * dW [V_local, H] and db [V_local] (wdt) = sums over the rows (ascending), each in double and
 * rounded double -> fp32 -> wdt once; and the bounds bh[N*H] = sum_j |dL| |W| and bw[V_local*H]
 * = sum_i |dL| |hidden| (either may be NULL). */
static inline void vpl_shard_grads(const vpl_prob* P, int r, const void* dL, int64_t ldl, float* dhp, void* dW,
                                   void* db, double* bh, double* bw) {
    const int64_t vl = vpl_vl(P, r), c0 = P->cut[r], N = P->N, H = P->H;
    for (int64_t i = 0; i < N; i++)
        for (int64_t h = 0; h < H; h++) {
            double acc = 0.0, b = 0.0;
            for (int64_t j = 0; j < vl; j++) {
                const double g = tu_load(dL, P->dt, i * ldl + j), w = tu_load(P->weight, P->dt, (c0 + j) * P->ldw + h);
                acc += g * w;
                b += fabs(g * w);
            }
            dhp[i * H + h] = (float)acc;
            if (bh) bh[i * H + h] = b;
        }
    for (int64_t j = 0; j < vl; j++) {
        double sb = 0.0;
        for (int64_t i = 0; i < N; i++) sb += tu_load(dL, P->dt, i * ldl + j);
        if (db) tu_store(db, P->wdt, j, tu_round_to(P->wdt, (float)sb));
        for (int64_t h = 0; h < H; h++) {
            double acc = 0.0, b = 0.0;
            for (int64_t i = 0; i < N; i++) {
                const double g = tu_load(dL, P->dt, i * ldl + j), x = tu_load(P->hidden, P->dt, i * P->ldh + h);
                acc += g * x;
                b += fabs(g * x);
            }
            if (dW) tu_store(dW, P->wdt, j * H + h, tu_round_to(P->wdt, (float)acc));
            if (bw) bw[j * H + h] = b;
        }
    }
}

/* unit roundoff of a dtype */
static inline double vpl_u(fl_dtype dt) {
    return dt == FL_DTYPE_F32 ? 1.0 / 16777216.0 : dt == FL_DTYPE_F16 ? 1.0 / 2048.0 : 1.0 / 256.0;
}

#endif /* FL_VP_LINEAR_UTIL_H */
