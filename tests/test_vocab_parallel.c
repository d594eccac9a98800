/* test_vocab_parallel.c — the CPU vocab-parallel cross-entropy steps (header section 8) against the
 * single-rank CPU cross-entropy (fl_cross_entropy_{forward,backward,fused}_cpu) and the
 * independent long-double reference (tests/ref_cross_entropy.h).
 *
 * k ranks are simulated in one process: the vocabulary is cut into k contiguous shards (k = 1, 2,
 * 3, 5; even and uneven splits, shards of one column, shards holding no row's target, row strides
 * ld > V_local), each shard's logits are copied into their own buffer, step 1 runs per shard, the
 * stats are gathered in rank order with memcpy (step 2), step 3 combines them, step 4 runs per
 * shard, and the shards' dlogits are concatenated and compared with the full-vocabulary results.
 * Every configuration of tests/ce_configs.h, every dtype, int32/int64 targets, N = 0, 1, 7, 129,
 * odd V (1, 3, 257, 1001), grad_loss NULL / per row / scalar, in-place backward, thread counts,
 * and every validation rule with its status and a message naming the function.
 *
 * Build and run (the Makefile does this in `make test`):
 *   cc -std=c11 -O2 -Iinclude tests/test_vocab_parallel.c build/libfusedloss.a -lm -lpthread \
 *      -fopenmp -o build/test_vocab_parallel && ./build/test_vocab_parallel [seed]
 * Ends with "N passed, M failed"; exit code 0 only when nothing failed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "fusedloss.h"
#include "test_util.h"
#include "ref_cross_entropy.h"
#include "ce_configs.h"

/* ------------------------------------------------------------------------------------------
 * Tolerances, |got - ref| <= atol + rtol*|ref| + slack.
 *
 * loss and lse versus fl_cross_entropy_forward_cpu (derived, not tuned). Both compute in double
 * from the same logits; the only extra error of the vocab-parallel result is the fp32 rounding
 * of the stats between steps 1 and 3 (u = 2^-24, fp32's unit roundoff):
 *   m    : none — step 1 makes s relative to the m it STORES (fp32), so m's rounding cancels;
 *   s    : relative u per shard; S = sum_r s_r exp(m_r - M) is a sum of positive terms, so S is
 *          within relative u, and lse = M + log S within       e_lse = u (absolute);
 *   zt   : |dzt| <= u |z_t|;   wz: |dwz| <= u sum_r |wz_r| (each shard's sum rounded alone).
 *   Row terms (section 5: a = (1-eps) w_t (lse - z_t) + (eps/V)(W lse - wz), b = zeta lse^2):
 *     e_a = (1-eps) w_t (e_lse + u |z_t|) + (eps/V) (W e_lse + u sum_r |wz_r|)
 *     e_b = zeta (2 |lse| + e_lse) e_lse
 *   NONE: e_a + e_b per row; SUM: sum_i (e_a + e_b); MEAN: sum e_a / D_w + sum e_b / D_n.
 *   The test computes these bounds per row from the gathered stats (slack = VP_SAFETY times the
 *   bound: second-order terms and double rounding), plus, for the two fp32 roundings of the
 *   reported values (CE's and VP's, half an ulp each), rtol = 2^-23, plus DBL_NOISE relative for
 *   the differing order of the double sums. lse: atol = VP_SAFETY * u, rtol = 2^-23.
 * dlogits:
 *   - bitwise equal to fl_cross_entropy_backward_cpu on the full logits fed with the VP lse (step
 *     4 is section 5's backward restricted to the shard's columns: same operations, same inputs);
 *   - within 2 ulp of the dtype of the exact (long-double) gradient for that lse (the GTOL table;
 *     fp16/bf16 moreover correctly rounded except next to a tie, ref_check_rounding);
 *   - versus fl_cross_entropy_fused_cpu (exact lse): both tolerances plus the slack that the lse
 *     difference explains, (1 + 2 rtol) |g(lse_vp) - g(lse_exact)| from the reference.
 * ---------------------------------------------------------------------------------------- */
#define U32 (1.0 / 16777216.0)     /* 2^-24 */
#define RT32 (1.0 / 8388608.0)     /* 2^-23: two fp32 roundings of a reported value */
#define VP_SAFETY 2.0
#define DBL_NOISE 1e-12
typedef struct { double atol, rtol; } gtol_t;
static const gtol_t GTOL[3] = {
    /* FL_DTYPE_F32  */ {1e-13, 2.0 / 8388608.0},  /* 2 ulp <= 2^-22 relative; atol: double noise */
    /* FL_DTYPE_F16  */ {6e-8, 2.0 / 1024.0},      /* 2 ulp <= 2^-9; atol one subnormal step 2^-24 */
    /* FL_DTYPE_BF16 */ {1e-13, 2.0 / 128.0},      /* 2 ulp <= 2^-6 */
};

static const char* const FN[3] = {"fl_vp_ce_local_stats_cpu", "fl_vp_ce_combine_cpu", "fl_vp_ce_backward_cpu"};

/* worst observed |diff| / tolerance of the derived loss / lse bounds (printed at the end) */
static double g_loss_ratio = 0.0, g_lse_ratio = 0.0;
static long g_splits = 0, g_empty_shards = 0, g_one_col_shards = 0;

/* ------------------------------------------------------------------------------------------
 * A problem: full logits [N, ld] (padding and ignored rows poisoned: never read), targets,
 * options, upstream gradient.
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    int64_t        N, V, ld;
    fl_dtype       dt;
    fl_index_dtype it;
    fl_ce_options  o;
    float*         w;
    float*         off;     /* per-class logit offsets (global [V]) or NULL */
    void*          x;
    void*          t;
    float*         gl;
    float          gs;
} prob_t;

enum { IGN_NONE = 0, IGN_SOME = 1, IGN_ALL = 2 };
enum { LOGITS_NORMAL = 0, LOGITS_BIG = 1 };

static size_t xbytes_of(int64_t N, int64_t ld, fl_dtype dt) { return (size_t)(N > 0 ? N : 1) * (size_t)ld * tu_dtype_size(dt); }
static int64_t n_loss(const prob_t* p) { return p->o.reduction == FL_REDUCTION_NONE ? p->N : 1; }
static int64_t tgt(const prob_t* p, int64_t i) { return ref_target(p->t, p->it, i); }
static void set_tgt(void* t, fl_index_dtype it, int64_t i, int64_t v) {
    if (it == FL_INDEX_I32) ((int32_t*)t)[i] = (int32_t)v;
    else ((int64_t*)t)[i] = v;
}

/* Targets uniform over [0, V) minus [avoid_lo, avoid_hi) (empty range: no restriction). */
static prob_t make_prob(tu_rng* rng, const cfg_t* c, int64_t N, int64_t V, int64_t ld, fl_dtype dt, fl_index_dtype it,
                        int ign, int gmode, float gs, int64_t avoid_lo, int64_t avoid_hi, int kind) {
    prob_t p;
    memset(&p, 0, sizeof p);
    p.N = N; p.V = V; p.ld = ld; p.dt = dt; p.it = it; p.gs = gs;
    p.o = cfg_options(c, V, rng, &p.w, &p.off);
    p.t = tu_xmalloc((size_t)(N > 0 ? N : 1) * 8);
    const int64_t navoid = avoid_hi > avoid_lo ? avoid_hi - avoid_lo : 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = tu_int_in(rng, 0, V - 1 - navoid);
        if (navoid && t >= avoid_lo) t += navoid;
        if (ign == IGN_ALL || (ign == IGN_SOME && i % 5 == 1)) t = p.o.ignore_index;
        set_tgt(p.t, it, i, t);
    }
    /* MEAN with weights: keep D_w > 0 whenever a row counts (0/0 is not a case we test) */
    if (p.w && p.o.reduction == FL_REDUCTION_MEAN) {
        double dw = 0;
        int64_t first = -1;
        for (int64_t i = 0; i < N; i++)
            if (tgt(&p, i) != p.o.ignore_index) { dw += p.w[tgt(&p, i)]; if (first < 0) first = i; }
        if (first >= 0 && dw == 0.0) p.w[tgt(&p, first)] = 1.0f;
    }
    p.x = tu_xmalloc(xbytes_of(N, ld, dt));
    tu_poison(p.x, xbytes_of(N, ld, dt));
    for (int64_t i = 0; i < N; i++) {
        if (tgt(&p, i) == p.o.ignore_index) continue;   /* ignored rows stay NaN: must not be read */
        for (int64_t j = 0; j < V; j++) {
            double v;
            if (kind == LOGITS_BIG) {
                double u = tu_uniform(rng);
                v = u < 0.2 ? 1e4 : u < 0.4 ? -1e4 : tu_uniform_in(rng, -1e4, 1e4);
            } else {
                v = 2.0 * tu_normal(rng);
            }
            tu_store(p.x, dt, i * ld + j, (float)v);
        }
    }
    if (gmode) {
        const int64_t n = n_loss(&p);
        p.gl = (float*)tu_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        for (int64_t i = 0; i < n; i++) p.gl[i] = (float)tu_uniform_in(rng, -2.0, 2.0);
    }
    return p;
}

static void free_prob(prob_t* p) {
    free(p->w); free(p->off); free(p->x); free(p->t); free(p->gl);
    memset(p, 0, sizeof *p);
}

static void* alloc_ws(int64_t N, int64_t V, fl_dtype dt, const fl_ce_options* o, size_t* bytes) {
    fl_status st = fl_cross_entropy_workspace_size(bytes, N, V, dt, o);
    CHECK_STATUS(st, FL_OK, "fl_cross_entropy_workspace_size");
    void* ws = tu_xmalloc(*bytes);
    tu_poison(ws, *bytes);                              /* content need not be initialised */
    return ws;
}

/* ------------------------------------------------------------------------------------------
 * Splits of [0, V) into k contiguous shards, each with its own row stride.
 * ---------------------------------------------------------------------------------------- */
#define MAX_K 5
typedef struct {
    int     k;
    int64_t start[MAX_K], len[MAX_K], ld[MAX_K];
    char    desc[96];
} split_t;

/* pad: 0 dense shards, 1 odd ranks get ld = V_local + 3, 2 every rank gets ld = V_local + 1 + r */
static split_t split_from(int k, const int64_t* len, int pad, const char* kind) {
    split_t s;
    memset(&s, 0, sizeof s);
    s.k = k;
    int64_t at = 0;
    int n = snprintf(s.desc, sizeof s.desc, "k=%d %s [", k, kind);
    for (int r = 0; r < k; r++) {
        s.start[r] = at;
        s.len[r] = len[r];
        s.ld[r] = len[r] + (pad == 1 ? (r % 2 ? 3 : 0) : pad == 2 ? 1 + r : 0);
        at += len[r];
        n += snprintf(s.desc + n, sizeof s.desc - (size_t)n, "%s%lld", r ? "," : "", (long long)len[r]);
    }
    snprintf(s.desc + n, sizeof s.desc - (size_t)n, "]");
    return s;
}

static split_t split_even(int k, int64_t V, int pad) {
    int64_t len[MAX_K];
    for (int r = 0; r < k; r++) len[r] = V / k + (r < V % k ? 1 : 0);
    return split_from(k, len, pad, "even");
}

/* k shards, random sizes >= 1, one of them (first or last) a single column */
static split_t split_uneven(tu_rng* rng, int k, int64_t V, int one_last, int pad) {
    int64_t len[MAX_K];
    int64_t rest = V - 1;                               /* after the 1-column shard */
    for (int r = 0; r < k - 1; r++) {                   /* k - 1 shards share `rest`, each >= 1 */
        const int left = k - 2 - r;                     /* shards still to fill after this one */
        int64_t l = left == 0 ? rest : tu_int_in(rng, 1, rest - left);
        len[one_last ? r : r + 1] = l;
        rest -= l;
    }
    len[one_last ? k - 1 : 0] = 1;
    return split_from(k, len, pad, one_last ? "uneven, last 1 column" : "uneven, first 1 column");
}

/* The standard set for V: k = 1; then k = 2, 3, 5 (k <= V) even and uneven (for k = V the even
 * split is all 1-column shards). reduced: k = 1, 2 uneven, 3 even, 5 uneven. */
static int standard_splits(tu_rng* rng, int64_t V, split_t* out, int max_out, int reduced) {
    static const int ks[] = {2, 3, 5};
    int n = 0;
    out[n++] = split_even(1, V, 0);
    for (int q = 0; q < 3; q++) {
        const int k = ks[q];
        if (k > V) break;
        if ((!reduced || k == 3) && n < max_out) out[n++] = split_even(k, V, k == 3 ? 1 : 2);
        if (k < V && (!reduced || k != 3) && n < max_out) out[n++] = split_uneven(rng, k, V, k == 3, k == 2 ? 1 : 0);
    }
    return n;
}

/* ------------------------------------------------------------------------------------------
 * The vocab-parallel pipeline on one split: steps 1 (per shard), 2 (memcpy in rank order),
 * 3, 4 (per shard), the shards' dlogits concatenated into dl [N, p->ld] (padding poisoned).
 * ---------------------------------------------------------------------------------------- */
typedef struct {
    float* gathered;  /* [k][N][4] */
    float* loss;      /* [n_loss] */
    float* lse;       /* [N] */
    void*  dl;        /* [N, p->ld] of dt, padding poison */
} vp_out_t;

static void vp_out_alloc(vp_out_t* v, const prob_t* p, int k) {
    const size_t nr = (size_t)(p->N > 0 ? p->N : 1);
    v->gathered = (float*)tu_xmalloc((size_t)k * nr * 16);
    v->loss = (float*)tu_xmalloc(nr * 4);
    v->lse = (float*)tu_xmalloc(nr * 4);
    v->dl = tu_xmalloc(xbytes_of(p->N, p->ld, p->dt));
    tu_poison(v->gathered, (size_t)k * nr * 16);
    tu_poison(v->loss, nr * 4);
    tu_poison(v->lse, nr * 4);
    tu_poison(v->dl, xbytes_of(p->N, p->ld, p->dt));
}
static void vp_out_free(vp_out_t* v) { free(v->gathered); free(v->loss); free(v->lse); free(v->dl); }

/* Step 1's contract, against long double over the shard's columns: the stored pair stands for the
 * shard's sum of exp(z), m + log s = log sum_j exp z_j within 2u (s's rounding, u = 2^-24; m's
 * rounding must not count: s is relative to the stored m); m is max z rounded to fp32; wz, zt
 * rounded to fp32 (1e-12 terms: double vs long double accumulation). */
static void check_stats(const prob_t* p, int64_t vs, int64_t V_local, const float* stats, const char* name) {
    const long double sc = p->o.logit_scale, cap = p->o.softcap;
    int64_t bad = 0, rows = 0;
    for (int64_t i = 0; i < p->N; i++) {
        const int64_t t = tgt(p, i);
        if (t == p->o.ignore_index) continue;
        long double m = -INFINITY, S = 0.0L, wz = 0.0L, swz = 0.0L, zt = 0.0L, z, dz;
        for (int64_t j = 0; j < V_local; j++) {
            ref_transform((long double)tu_load(p->x, p->dt, i * p->ld + vs + j), sc, cap, &z, &dz);
            if (p->off) z += (long double)p->off[vs + j];
            if (z > m) m = z;
        }
        for (int64_t j = 0; j < V_local; j++) {
            ref_transform((long double)tu_load(p->x, p->dt, i * p->ld + vs + j), sc, cap, &z, &dz);
            if (p->off) z += (long double)p->off[vs + j];
            const long double w = p->w ? (long double)p->w[vs + j] : 1.0L;
            S += expl(z - m);
            wz += w * z;
            swz += fabsl(w * z);
            if (vs + j == t) zt = z;
        }
        if (!(p->o.label_smoothing > 0.0f)) wz = swz = 0.0L;  /* formed only for smoothing */
        if (!isfinite((double)m)) continue;           /* the +-inf rows: compared with CE instead */
        const float* q = stats + 4 * i;
        const double lse_l = (double)(m + logl(S)), got = (double)q[0] + log((double)q[1]);
        const int ok = fabs(got - lse_l) <= 2.0 * U32 + 1e-12 * (1.0 + fabs(lse_l)) &&
                       fabs((double)q[0] - (double)m) <= U32 * fabsl(m) + 1e-12 * (1.0 + fabsl(m)) &&
                       (isinf((double)wz) ? q[2] == (float)wz
                                          : fabs((double)q[2] - (double)wz) <= U32 * fabsl(wz) + 1e-12 * (double)swz) &&
                       (isinf((double)zt) ? q[3] == (float)zt
                                          : fabs((double)q[3] - (double)zt) <= U32 * fabsl(zt) + 1e-12 * (1.0 + fabsl(zt)));
        rows++;
        if (!ok) {
            if (bad < 5)
                printf("  %s: row %lld: stats (%.9g, %.9g, %.9g, %.9g): m + log s = %.12g, exact %.12g; m %.12Lg, "
                       "wz %.12Lg, zt %.12Lg\n", name, (long long)i, (double)q[0], (double)q[1], (double)q[2],
                       (double)q[3], got, lse_l, m, wz, zt);
            bad++;
        }
    }
    CHECK(bad == 0, "%s: %lld of %lld rows' stats off the long-double values", name, (long long)bad, (long long)rows);
}

/* Returns 0 when a step failed (already counted). inplace: also run step 4 in place per shard
 * and require the same bits (and the shard's padding untouched). */
static int run_vp(const prob_t* p, const split_t* s, vp_out_t* v, int inplace, int stats_ref, const char* label) {
    const int64_t N = p->N;
    const size_t es = tu_dtype_size(p->dt);
    const size_t nr = (size_t)(N > 0 ? N : 1);
    char name[400];
    fl_status st;
    void* xr[MAX_K];
    void* ws[MAX_K];
    size_t wsb[MAX_K];
    int ok = 1;
    for (int r = 0; r < s->k; r++) { xr[r] = NULL; ws[r] = NULL; }

    /* step 1 per shard; step 2 = memcpy into gathered in rank order */
    for (int r = 0; r < s->k && ok; r++) {
        const int64_t V_local = s->len[r], ld = s->ld[r], vs = s->start[r];
        xr[r] = tu_xmalloc(xbytes_of(N, ld, p->dt));
        tu_poison(xr[r], xbytes_of(N, ld, p->dt));
        for (int64_t i = 0; i < N; i++)
            memcpy((char*)xr[r] + (size_t)(i * ld) * es, (const char*)p->x + (size_t)(i * p->ld + vs) * es,
                   (size_t)V_local * es);
        ws[r] = alloc_ws(N, V_local, p->dt, &p->o, &wsb[r]);
        float* stats = (float*)tu_xmalloc(nr * 16);
        tu_poison(stats, nr * 16);
        st = fl_vp_ce_local_stats_cpu(stats, xr[r], p->t, N, V_local, ld, vs, p->V, p->dt, p->it, &p->o, ws[r], wsb[r]);
        snprintf(name, sizeof name, "%s %s: step 1, rank %d", label, s->desc, r);
        ok &= CHECK_STATUS(st, FL_OK, name);
        int64_t bad_ign = 0, unwritten = 0, has_target = 0;
        for (int64_t i = 0; i < N; i++) {
            const int64_t t = tgt(p, i);
            const float* q = stats + 4 * i;
            if (t == p->o.ignore_index) {
                bad_ign += !(q[0] == -INFINITY && q[1] == 0.0f && q[2] == 0.0f && q[3] == 0.0f);
            } else {
                for (int c = 0; c < 4; c++) unwritten += tu_is_poison(q, 4, c);
                if (t >= vs && t < vs + V_local) has_target = 1;
                else bad_ign += q[3] != 0.0f;               /* zt = 0 when t is not in the shard */
            }
        }
        CHECK(bad_ign == 0, "%s: %lld rows with wrong ignored / not-here stats", name, (long long)bad_ign);
        CHECK(unwritten == 0, "%s: %lld stats not written", name, (long long)unwritten);
        if (stats_ref) check_stats(p, vs, V_local, stats, name);
        if (!has_target) g_empty_shards++;
        if (V_local == 1) g_one_col_shards++;
        memcpy(v->gathered + (size_t)r * nr * 4, stats, (size_t)N * 16);
        free(stats);
    }

    /* step 3: the section-5 workspace for N rows and V classes (the logits' dtype) */
    if (ok) {
        size_t wsc_b;
        void* wsc = alloc_ws(N, p->V, p->dt, &p->o, &wsc_b);
        st = fl_vp_ce_combine_cpu(v->loss, v->lse, v->gathered, s->k, p->t, N, p->V, p->it, &p->o, wsc, wsc_b);
        snprintf(name, sizeof name, "%s %s: step 3", label, s->desc);
        ok &= CHECK_STATUS(st, FL_OK, name);
        if (ok) {   /* every rank computes the same bits: a second call (another "rank") */
            float* l2 = (float*)tu_xmalloc(nr * 4);
            float* s2 = (float*)tu_xmalloc(nr * 4);
            tu_poison(l2, nr * 4);
            tu_poison(s2, nr * 4);
            st = fl_vp_ce_combine_cpu(l2, s2, v->gathered, s->k, p->t, N, p->V, p->it, &p->o, wsc, wsc_b);
            snprintf(name, sizeof name, "%s %s: step 3 again (loss, lse)", label, s->desc);
            CHECK_STATUS(st, FL_OK, name);
            check_bitwise(name, l2, v->loss, (size_t)n_loss(p) * 4);
            check_bitwise(name, s2, v->lse, (size_t)N * 4);
            free(l2); free(s2);
        }
        free(wsc);
    }

    /* step 4 per shard, concatenated into v->dl */
    for (int r = 0; r < s->k && ok; r++) {
        const int64_t V_local = s->len[r], ld = s->ld[r], vs = s->start[r];
        const size_t xb = xbytes_of(N, ld, p->dt);
        void* dlr = tu_xmalloc(xb);
        tu_poison(dlr, xb);
        st = fl_vp_ce_backward_cpu(dlr, xr[r], p->t, v->lse, p->gl, p->gs, N, V_local, ld, vs, p->V, p->dt, p->it,
                                   &p->o, ws[r], wsb[r]);
        snprintf(name, sizeof name, "%s %s: step 4, rank %d", label, s->desc, r);
        ok &= CHECK_STATUS(st, FL_OK, name);
        int64_t pad_touched = 0;
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = V_local; j < ld; j++) pad_touched += !tu_is_poison(dlr, es, i * ld + j);
            memcpy((char*)v->dl + (size_t)(i * p->ld + vs) * es, (char*)dlr + (size_t)(i * ld) * es,
                   (size_t)V_local * es);
        }
        CHECK(pad_touched == 0, "%s: %lld padding elements written", name, (long long)pad_touched);
        if (inplace && ok) {
            /* in place: dlogits == logits; expected = the shard's logits with the used columns replaced */
            void* ip = tu_xmalloc(xb);
            void* want = tu_xmalloc(xb);
            memcpy(ip, xr[r], xb);
            memcpy(want, xr[r], xb);
            for (int64_t i = 0; i < N; i++)
                memcpy((char*)want + (size_t)(i * ld) * es, (char*)dlr + (size_t)(i * ld) * es, (size_t)V_local * es);
            st = fl_vp_ce_backward_cpu(ip, ip, p->t, v->lse, p->gl, p->gs, N, V_local, ld, vs, p->V, p->dt, p->it,
                                       &p->o, ws[r], wsb[r]);
            snprintf(name, sizeof name, "%s %s: step 4 in place, rank %d", label, s->desc, r);
            CHECK_STATUS(st, FL_OK, name);
            check_bitwise(name, ip, want, N > 0 ? (size_t)N * (size_t)ld * es : 0);
            free(ip); free(want);
        }
        free(dlr);
    }
    for (int r = 0; r < s->k; r++) { free(xr[r]); free(ws[r]); }
    return ok;
}

/* ------------------------------------------------------------------------------------------
 * The derived loss / lse bounds (see the table at the top), per row from the gathered stats.
 * slack_loss[n_loss], slack_lse[N].
 * ---------------------------------------------------------------------------------------- */
static void derived_slack(const prob_t* p, const float* gathered, int k, const float* lse_ref, double* slack_loss,
                          double* slack_lse) {
    const int64_t N = p->N, V = p->V;
    const double eps = p->o.label_smoothing, zeta = p->o.z_loss;
    double W = 0.0, D_w = 0.0, D_n = 0.0, sum_a = 0.0, sum_b = 0.0;
    for (int64_t j = 0; j < V; j++) W += p->w ? (double)p->w[j] : 1.0;
    for (int64_t i = 0; i < N; i++) {
        const int64_t t = tgt(p, i);
        slack_lse[i] = 0.0;
        if (p->o.reduction == FL_REDUCTION_NONE) slack_loss[i] = 0.0;
        if (t == p->o.ignore_index) continue;
        const double w_t = p->w ? (double)p->w[t] : 1.0;
        D_w += w_t;
        D_n += 1.0;
        double zt = 0.0, swz = 0.0;
        for (int r = 0; r < k; r++) {
            const float* q = gathered + 4 * ((size_t)r * (size_t)N + (size_t)i);
            zt += q[3];
            swz += fabs((double)q[2]);
        }
        const double e_lse = U32;
        const double e_a = (1.0 - eps) * w_t * (e_lse + U32 * fabs(zt)) + (eps / (double)V) * (W * e_lse + U32 * swz);
        const double e_b = zeta * (2.0 * fabs((double)lse_ref[i]) + e_lse) * e_lse;
        slack_lse[i] = VP_SAFETY * e_lse;
        /* infinite stats (z = +-inf): CE's loss is then NaN or inf too, compared exactly */
        if (p->o.reduction == FL_REDUCTION_NONE) slack_loss[i] = e_a + e_b >= 0 ? VP_SAFETY * (e_a + e_b) : INFINITY;
        sum_a += e_a;
        sum_b += e_b;
    }
    if (!(sum_a + sum_b >= 0)) sum_a = sum_b = INFINITY;
    if (p->o.reduction == FL_REDUCTION_SUM) slack_loss[0] = VP_SAFETY * (sum_a + sum_b);
    if (p->o.reduction == FL_REDUCTION_MEAN)
        slack_loss[0] = D_n > 0 ? VP_SAFETY * (sum_a / D_w + (zeta > 0 ? sum_b / D_n : 0.0)) : 0.0;
}

static double worst_ratio(const float* got, const float* ref, const double* slack, int64_t n, double atol, double rtol) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(ref[i]) || isinf(ref[i])) continue;
        const double tol = atol + rtol * fabs((double)ref[i]) + slack[i];
        const double d = fabs((double)got[i] - (double)ref[i]);
        if (tol > 0 && d / tol > m) m = d / tol;
    }
    return m;
}

/* fp32 arrays as doubles for check_close_ex */
static double* to_d(const float* a, int64_t n) {
    double* d = (double*)tu_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) d[i] = a[i];
    return d;
}

/* ------------------------------------------------------------------------------------------
 * run_problem: the full-vocabulary CE once, then every split against it.
 * use_ref: REF_GRAD: the long-double gradient (2-ulp and fused comparisons); REF_STATS: step 1's
 * stats against long double (check_stats).
 * ---------------------------------------------------------------------------------------- */
enum { REF_GRAD = 1, REF_STATS = 2, REF_ALL = 3 };
static void run_problem_ex(const prob_t* p, const split_t* splits, int nsplits, const char* label, int use_ref,
                           int inplace, unsigned ref_splits) {
    const int64_t N = p->N, V = p->V, ld = p->ld, nl = n_loss(p);
    const fl_dtype dt = p->dt;
    const size_t nr = (size_t)(N > 0 ? N : 1), xb = xbytes_of(N, ld, dt), es = tu_dtype_size(dt);
    const gtol_t gt = GTOL[dt];
    char name[400];
    fl_status st;

    size_t wsb;
    void* ws = alloc_ws(N, V, dt, &p->o, &wsb);
    float* ce_loss = (float*)tu_xmalloc(nr * 4);
    float* ce_lse = (float*)tu_xmalloc(nr * 4);
    void* ce_fdl = tu_xmalloc(xb);
    void* ce_bdl = tu_xmalloc(xb);
    tu_poison(ce_loss, nr * 4);
    tu_poison(ce_lse, nr * 4);
    tu_poison(ce_fdl, xb);
    st = fl_cross_entropy_forward_cpu(ce_loss, ce_lse, p->x, p->t, N, V, ld, dt, p->it, &p->o, ws, wsb);
    snprintf(name, sizeof name, "%s: CE forward", label);
    CHECK_STATUS(st, FL_OK, name);
    if (use_ref & REF_GRAD) {
        float* l2 = (float*)tu_xmalloc(nr * 4);
        st = fl_cross_entropy_fused_cpu(l2, NULL, ce_fdl, p->x, p->t, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
        snprintf(name, sizeof name, "%s: CE fused", label);
        CHECK_STATUS(st, FL_OK, name);
        free(l2);
    }
    const size_t gbytes = (size_t)(N * V > 0 ? N * V : 1) * sizeof(double);
    const int gref = (use_ref & REF_GRAD) != 0;
    double* rgrad = gref ? (double*)tu_xmalloc(gbytes) : NULL;
    double* rgrad_s = gref ? (double*)tu_xmalloc(gbytes) : NULL;
    double* slack = gref ? (double*)tu_xmalloc(gbytes) : NULL;
    double* sl_loss = (double*)tu_xmalloc(nr * sizeof(double));
    double* sl_lse = (double*)tu_xmalloc(nr * sizeof(double));
    double* d_ce_loss = to_d(ce_loss, nl);
    double* d_ce_lse = to_d(ce_lse, N);
    ref_logits rx = {p->x, dt, ld};

    for (int q = 0; q < nsplits; q++) {
        const split_t* s = &splits[q];
        vp_out_t v;
        vp_out_alloc(&v, p, s->k);
        g_splits++;
        const int on = (ref_splits >> q) & 1u;          /* the long-double checks on this split */
        if (!run_vp(p, s, &v, inplace, on && (use_ref & REF_STATS), label)) { vp_out_free(&v); continue; }

        /* loss and lse vs the full-vocabulary forward, within the derived bounds */
        derived_slack(p, v.gathered, s->k, ce_lse, sl_loss, sl_lse);
        double* dl_loss = to_d(v.loss, nl);
        double* dl_lse = to_d(v.lse, N);
        int64_t unwritten = 0;
        for (int64_t i = 0; i < nl; i++) unwritten += !isnan(ce_loss[i]) && tu_is_poison(v.loss, 4, i);
        for (int64_t i = 0; i < N; i++) unwritten += tu_is_poison(v.lse, 4, i);
        snprintf(name, sizeof name, "%s %s: loss, lse written", label, s->desc);
        CHECK(unwritten == 0, "%s: %lld not written", name, (long long)unwritten);
        snprintf(name, sizeof name, "%s %s: loss vs CE forward", label, s->desc);
        check_close_ex(name, dl_loss, d_ce_loss, sl_loss, nl, 0.0, RT32 + DBL_NOISE);
        snprintf(name, sizeof name, "%s %s: lse vs CE forward", label, s->desc);
        check_close_ex(name, dl_lse, d_ce_lse, sl_lse, N, 0.0, RT32 + DBL_NOISE);
        double r1 = worst_ratio(v.loss, ce_loss, sl_loss, nl, 0.0, RT32 + DBL_NOISE);
        double r2 = worst_ratio(v.lse, ce_lse, sl_lse, N, 0.0, RT32 + DBL_NOISE);
        if (r1 > g_loss_ratio) g_loss_ratio = r1;
        if (r2 > g_lse_ratio) g_lse_ratio = r2;
        free(dl_loss); free(dl_lse);

        /* dlogits: bitwise CE backward on the full logits with the VP lse */
        tu_poison(ce_bdl, xb);
        st = fl_cross_entropy_backward_cpu(ce_bdl, p->x, p->t, v.lse, p->gl, p->gs, N, V, ld, dt, p->it, &p->o, ws, wsb);
        snprintf(name, sizeof name, "%s %s: CE backward (VP lse)", label, s->desc);
        CHECK_STATUS(st, FL_OK, name);
        snprintf(name, sizeof name, "%s %s: dlogits == CE backward with the VP lse", label, s->desc);
        check_bitwise(name, v.dl, ce_bdl, N > 0 ? (size_t)N * (size_t)ld * es : 0);

        if (gref && on) {
            /* the exact gradient (exact lse) and the one for the VP lse */
            ref_ce(&rx, p->t, p->it, N, V, &p->o, p->gl, p->gs, v.lse, NULL, NULL, rgrad, rgrad_s);
            snprintf(name, sizeof name, "%s %s: dlogits vs exact gradient for the VP lse (2 ulp)", label, s->desc);
            ref_check_dlogits(name, v.dl, dt, N, V, ld, rgrad_s, NULL, gt.atol, gt.rtol);
            ref_check_rounding(name, v.dl, dt, N, V, ld, rgrad_s);
            for (int64_t e = 0; e < N * V; e++) slack[e] = (1.0 + 2.0 * gt.rtol) * fabs(rgrad_s[e] - rgrad[e]);
            double* a = (double*)tu_xmalloc(gbytes);
            double* b = (double*)tu_xmalloc(gbytes);
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < V; j++) {
                    a[i * V + j] = tu_load(v.dl, dt, i * ld + j);
                    b[i * V + j] = tu_load(ce_fdl, dt, i * ld + j);
                }
            snprintf(name, sizeof name, "%s %s: dlogits vs CE fused", label, s->desc);
            check_close_ex(name, a, b, slack, N * V, 2.0 * gt.atol, 2.0 * gt.rtol);
            free(a); free(b);
        }
        vp_out_free(&v);
    }
    free(ws); free(ce_loss); free(ce_lse); free(ce_fdl); free(ce_bdl);
    free(rgrad); free(rgrad_s); free(slack); free(sl_loss); free(sl_lse); free(d_ce_loss); free(d_ce_lse);
}

static void run_problem(const prob_t* p, const split_t* splits, int nsplits, const char* label, int use_ref,
                        int inplace) {
    run_problem_ex(p, splits, nsplits, label, use_ref, inplace, ~0u);
}

/* ------------------------------------------------------------------------------------------
 * Sections
 * ---------------------------------------------------------------------------------------- */
static const char* gname(int gm, fl_reduction red) { return gm ? (red == FL_REDUCTION_NONE ? "per-row" : "scalar") : "NULL"; }

/* Every configuration x dtype x index dtype x upstream gradient over small shapes, every split;
 * and N = 129, V = 1001 with the dtype and index dtype rotating over the configurations. */
static void test_options(tu_rng* rng) {
    static const struct { int64_t N, V, ld; int ign; } shapes[] = {
        {7, 3, 4, IGN_SOME},     /* shards of 1 and 2 columns */
        {7, 257, 257, IGN_SOME}, /* odd V, k up to 5 */
        {1, 257, 260, IGN_NONE}, /* one row: k - 1 shards hold no target */
        {7, 1, 2, IGN_NONE},     /* V = 1: k = 1 only */
    };
    char label[320];
    split_t sp[12];
    for (int c = 0; c < N_CFGS; c++) {
        const cfg_t* cf = &CFGS[c];
        const long p0 = tu_passed, f0 = tu_failed;
        tu_quiet = 1;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int dt = 0; dt < 3; dt++)
                for (int it = 0; it < 2; it++)
                    for (int gm = 0; gm < 2; gm++) {
                        const float gs = gm ? (dt == 1 ? -2.0f : 0.37f) : 1.0f;
                        prob_t p = make_prob(rng, cf, shapes[s].N, shapes[s].V, shapes[s].ld, (fl_dtype)dt,
                                             (fl_index_dtype)it, shapes[s].ign, gm, gs, 0, 0, LOGITS_NORMAL);
                        const int ns = standard_splits(rng, p.V, sp, 12, 0);
                        snprintf(label, sizeof label, "[%s] N=%lld V=%lld ld=%lld %s %s grad_loss=%s gs=%g", cf->name,
                                 (long long)p.N, (long long)p.V, (long long)p.ld, tu_dtype_name(p.dt),
                                 it ? "i64" : "i32", gname(gm, cf->red), gs);
                        run_problem(&p, sp, ns, label, REF_ALL, 1);
                        free_prob(&p);
                    }
        {   /* N = 129, V = 1001, ld > V: the dtype and index dtype rotate over the configurations */
            const fl_dtype dt = (fl_dtype)(c % 3);
            const fl_index_dtype it = (fl_index_dtype)((c / 3) % 2);
            prob_t p = make_prob(rng, cf, 129, 1001, 1003, dt, it, IGN_SOME, 1, 0.8f, 0, 0, LOGITS_NORMAL);
            const int ns = standard_splits(rng, p.V, sp, 12, 1);
            snprintf(label, sizeof label, "[%s] N=129 V=1001 ld=1003 %s %s grad_loss=%s", cf->name,
                     tu_dtype_name(dt), it ? "i64" : "i32", gname(1, cf->red));
            /* the long-double checks on the uneven k = 2 and k = 5 splits only (runtime) */
            run_problem_ex(&p, sp, ns, label, REF_ALL, 0, 0xAu);
            free_prob(&p);
        }
        tu_quiet = 0;
        printf("[%s] VP vs CE over dtypes x index dtypes x shapes x splits x upstream gradients: %ld checks, %s\n",
               cf->name, (tu_passed - p0) + (tu_failed - f0), tu_failed == f0 ? "all OK" : "FAILURES above");
    }
}

/* Targets that avoid one shard entirely (a 1-column shard in the middle, a whole half, the last
 * shard holding the zero class weight). */
static void test_empty_shards(tu_rng* rng) {
    const int cfgs[] = {0, 1, 3, 6, 19, 21, 23, 24, 25, 26};
    char label[320];
    const long p0 = tu_passed, f0 = tu_failed, e0 = g_empty_shards;
    tu_quiet = 1;
    for (size_t q = 0; q < sizeof cfgs / sizeof cfgs[0]; q++) {
        const cfg_t* cf = &CFGS[cfgs[q]];
        for (int dt = 0; dt < 3; dt++) {
            const int64_t l3[3] = {100, 1, 156}, l2[2] = {129, 128}, l5[5] = {50, 60, 1, 70, 76};
            split_t sp[3] = {split_from(3, l3, 1, "1-column shard without targets"),
                             split_from(2, l2, 0, "first half without targets"),
                             split_from(5, l5, 2, "last shard without targets")};
            static const int64_t avoid[3][2] = {{100, 101}, {0, 129}, {187, 257}};
            for (int a = 0; a < 3; a++) {
                prob_t p = make_prob(rng, cf, 7, 257, 259, (fl_dtype)dt, FL_INDEX_I64, IGN_SOME, 1, 1.0f, avoid[a][0],
                                     avoid[a][1], LOGITS_NORMAL);
                snprintf(label, sizeof label, "[%s] targets avoid [%lld, %lld) %s", cf->name, (long long)avoid[a][0],
                         (long long)avoid[a][1], tu_dtype_name(p.dt));
                run_problem(&p, &sp[a], 1, label, REF_ALL, 1);
                free_prob(&p);
            }
        }
    }
    tu_quiet = 0;
    printf("shards holding no row's target: %ld shards, %ld checks, %s\n", g_empty_shards - e0,
           (tu_passed - p0) + (tu_failed - f0), tu_failed == f0 ? "all OK" : "FAILURES above");
}

/* N = 0 and every row ignored, every configuration; the reduced loss is written (NaN for MEAN,
 * 0 for SUM), lse 0, dlogits 0. */
static void test_empty_and_all_ignored(tu_rng* rng) {
    char label[320];
    split_t sp[12];
    const long p0 = tu_passed, f0 = tu_failed;
    tu_quiet = 1;
    for (int c = 0; c < N_CFGS; c++) {
        const cfg_t* cf = &CFGS[c];
        for (int dt = 0; dt < 3; dt++) {
            prob_t p0p = make_prob(rng, cf, 0, 5, 6, (fl_dtype)dt, FL_INDEX_I64, IGN_NONE, 1, 1.0f, 0, 0, LOGITS_NORMAL);
            int ns = standard_splits(rng, p0p.V, sp, 12, 0);
            snprintf(label, sizeof label, "[%s] N=0 %s", cf->name, tu_dtype_name(p0p.dt));
            run_problem(&p0p, sp, ns, label, REF_ALL, 1);
            free_prob(&p0p);
            prob_t pa = make_prob(rng, cf, 9, 11, 11, (fl_dtype)dt, FL_INDEX_I32, IGN_ALL, 1, 0.5f, 0, 0, LOGITS_NORMAL);
            ns = standard_splits(rng, pa.V, sp, 12, 0);
            snprintf(label, sizeof label, "[%s] all rows ignored %s", cf->name, tu_dtype_name(pa.dt));
            run_problem(&pa, sp, ns, label, REF_ALL, 1);
            /* finite poison: the NaN / 0 results are really written */
            float g[9 * 4 * 2], loss[9], lse[9];
            for (int k = 0; k < 9 * 8; k++) g[k] = 12345.0f;       /* not read for ignored rows */
            for (int k = 0; k < 9; k++) loss[k] = lse[k] = 777.0f;
            size_t wsb;
            void* ws = alloc_ws(9, 11, pa.dt, &pa.o, &wsb);
            fl_status st = fl_vp_ce_combine_cpu(loss, lse, g, 2, pa.t, 9, 11, pa.it, &pa.o, ws, wsb);
            snprintf(label, sizeof label, "[%s] all rows ignored, combine with finite poison", cf->name);
            CHECK_STATUS(st, FL_OK, label);
            int ok = 1;
            for (int i = 0; i < 9; i++) ok &= lse[i] == 0.0f;
            if (cf->red == FL_REDUCTION_NONE) for (int i = 0; i < 9; i++) ok &= loss[i] == 0.0f;
            if (cf->red == FL_REDUCTION_SUM) ok &= loss[0] == 0.0f;
            if (cf->red == FL_REDUCTION_MEAN) ok &= isnan(loss[0]);
            CHECK(ok, "%s: loss[0] = %g, lse[0] = %g", label, (double)loss[0], (double)lse[0]);
            free(ws);
            free_prob(&pa);
        }
        /* N = 0 with NULL arrays (nothing to point at) */
        float loss = 777.0f;
        fl_ce_options o = FL_CE_OPTIONS_INIT;
        o.reduction = cf->red;
        size_t wsb;
        void* ws = alloc_ws(0, 4, FL_DTYPE_F32, &o, &wsb);
        fl_status st = fl_vp_ce_local_stats_cpu(NULL, NULL, NULL, 0, 4, 4, 0, 4, FL_DTYPE_F32, FL_INDEX_I64, &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "N=0 step 1 with NULL arrays");
        st = fl_vp_ce_combine_cpu(&loss, NULL, NULL, 3, NULL, 0, 4, FL_INDEX_I64, &o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "N=0 step 3 with NULL arrays");
        if (cf->red != FL_REDUCTION_NONE)
            CHECK(cf->red == FL_REDUCTION_MEAN ? isnan(loss) : loss == 0.0f, "N=0 step 3: loss %g", (double)loss);
        st = fl_vp_ce_backward_cpu(NULL, NULL, NULL, NULL, NULL, 1.0f, 0, 4, 4, 0, 4, FL_DTYPE_F32, FL_INDEX_I64, &o,
                                   ws, wsb);
        CHECK_STATUS(st, FL_OK, "N=0 step 4 with NULL arrays");
        free(ws);
    }
    tu_quiet = 0;
    printf("N = 0 and all rows ignored, every configuration: %ld checks, %s\n", (tu_passed - p0) + (tu_failed - f0),
           tu_failed == f0 ? "all OK" : "FAILURES above");
}

/* Logits of +-1e4 (exact in every dtype): the shards' maxima differ by thousands. */
static void test_big_logits(tu_rng* rng) {
    const int cfgs[] = {0, 1, 14, 17, 23, 24};
    char label[320];
    split_t sp[12];
    const long p0 = tu_passed, f0 = tu_failed;
    tu_quiet = 1;
    for (size_t q = 0; q < sizeof cfgs / sizeof cfgs[0]; q++)
        for (int dt = 0; dt < 3; dt++) {
            prob_t p = make_prob(rng, &CFGS[cfgs[q]], 7, 37, 40, (fl_dtype)dt, FL_INDEX_I32, IGN_SOME, 1, 1.0f, 0, 0,
                                 LOGITS_BIG);
            const int ns = standard_splits(rng, p.V, sp, 12, 0);
            snprintf(label, sizeof label, "[%s] logits +-1e4 %s", CFGS[cfgs[q]].name, tu_dtype_name(p.dt));
            run_problem(&p, sp, ns, label, REF_ALL, 0);
            free_prob(&p);
        }
    tu_quiet = 0;
    printf("logits +-1e4: %ld checks, %s\n", (tu_passed - p0) + (tu_failed - f0), tu_failed == f0 ? "all OK" : "FAILURES above");
}

/* Infinite logits (a masked vocabulary entry, a whole shard masked, a masked target, an all
 * -inf row, a single +inf): the VP result is CE's, NaN / inf included (with logit_scale < 0 the
 * signs flip, with a softcap z is finite). No long-double gradient here (CE's loss is NaN for a row
 * with an infinite z whatever the smoothing: 0 * inf in the smoothing term). */
static void test_inf_logits(tu_rng* rng) {
    const int cfgs[] = {0, 1, 2, 3, 4, 7, 14, 16, 21, 24};
    static const int64_t tg[8] = {8, 4, 0, 0, 4, 10, 10, 8};
    char label[320];
    const long p0 = tu_passed, f0 = tu_failed;
    tu_quiet = 1;
    for (size_t q = 0; q < sizeof cfgs / sizeof cfgs[0]; q++)
        for (int dt = 0; dt < 3; dt++) {
            prob_t p = make_prob(rng, &CFGS[cfgs[q]], 8, 11, 12, (fl_dtype)dt, FL_INDEX_I64, IGN_NONE, 1, 1.0f, 0, 0,
                                 LOGITS_NORMAL);
            for (int64_t i = 0; i < 8; i++) {
                set_tgt(p.t, p.it, i, tg[i]);   /* none of them an ignore_index of ce_configs.h */
                for (int64_t j = 0; j < 11; j++) tu_store(p.x, p.dt, i * 12 + j, (float)(2.0 * tu_normal(rng)));
            }
            for (int64_t j = 0; j < 5; j++) tu_store(p.x, p.dt, 0 * 12 + j, -INFINITY);  /* row 0: shard [0, 5) */
            tu_store(p.x, p.dt, 2 * 12 + 7, -INFINITY);                               /* row 2: one column */
            for (int64_t j = 0; j < 11; j++) tu_store(p.x, p.dt, 3 * 12 + j, -INFINITY); /* row 3: all */
            tu_store(p.x, p.dt, 4 * 12 + 4, -INFINITY);                               /* row 4: the target */
            tu_store(p.x, p.dt, 5 * 12 + 6, INFINITY);                                /* row 5: one +inf */
            tu_store(p.x, p.dt, 6 * 12 + 5, -INFINITY);                               /* row 6: both */
            tu_store(p.x, p.dt, 6 * 12 + 9, INFINITY);
            if (p.w && p.o.reduction == FL_REDUCTION_MEAN) p.w[4] = 1.0f;            /* D_w > 0 */
            const int64_t l1[1] = {11}, l2[2] = {5, 6}, l3[3] = {5, 1, 5}, l5[5] = {2, 3, 1, 4, 1};
            split_t sp[4] = {split_from(1, l1, 0, "one rank"), split_from(2, l2, 1, "row 0's first shard all -inf"),
                             split_from(3, l3, 2, "uneven"), split_from(5, l5, 1, "uneven")};
            snprintf(label, sizeof label, "[%s] +-inf logits %s", CFGS[cfgs[q]].name, tu_dtype_name(p.dt));
            run_problem(&p, sp, 4, label, REF_STATS, 1);
            free_prob(&p);
        }
    tu_quiet = 0;
    printf("+-inf logits: %ld checks, %s\n", (tu_passed - p0) + (tu_failed - f0), tu_failed == f0 ? "all OK" : "FAILURES above");
}

/* The OpenMP paths (N * V_local > 65536 for steps 1 and 4, N * k > 65536 for step 3): every step
 * gives the same bits with 1, 2 and 3 threads; and the results are checked against CE. */
static void test_threads(tu_rng* rng) {
#ifdef _OPENMP
    const int nthreads[3] = {1, 2, 3};
    const int saved = omp_get_max_threads();
#else
    const int nthreads[3] = {1, 1, 1};
#endif
    static const struct { int64_t N, V, ld; int c; fl_dtype dt; } cases[] = {
        {129, 2003, 2005, 23, FL_DTYPE_F32}, {129, 2003, 2003, 24, FL_DTYPE_BF16}, {33000, 5, 5, 25, FL_DTYPE_F16},
    };
    char label[320];
    for (size_t q = 0; q < sizeof cases / sizeof cases[0]; q++) {
        const long p0 = tu_passed, f0 = tu_failed;
        tu_quiet = 1;
        prob_t p = make_prob(rng, &CFGS[cases[q].c], cases[q].N, cases[q].V, cases[q].ld, cases[q].dt, FL_INDEX_I64,
                             IGN_SOME, 1, 0.25f, 0, 0, LOGITS_NORMAL);
        int64_t l3[3] = {p.V / 2, 1, p.V - p.V / 2 - 1};
        int64_t l2[2] = {p.V / 2, p.V - p.V / 2};
        split_t sp[2] = {split_from(3, l3, 1, "uneven"), split_from(2, l2, 2, "even")};
        snprintf(label, sizeof label, "[%s] threads N=%lld V=%lld %s", CFGS[cases[q].c].name, (long long)p.N,
                 (long long)p.V, tu_dtype_name(p.dt));
        run_problem(&p, sp, 2, label, p.N * p.V <= 300000 ? REF_ALL : 0, 0);   /* vs CE (and the reference when small) */
        for (int s = 0; s < 2; s++) {
            vp_out_t v[3];
            for (int k = 0; k < 3; k++) {
#ifdef _OPENMP
                omp_set_num_threads(nthreads[k]);
#endif
                vp_out_alloc(&v[k], &p, sp[s].k);
                run_vp(&p, &sp[s], &v[k], 0, 0, label);
            }
            for (int k = 1; k < 3; k++) {
                char name[400];
                snprintf(name, sizeof name, "%s %s: %d vs %d thread(s): gathered stats", label, sp[s].desc, nthreads[k], nthreads[0]);
                check_bitwise(name, v[k].gathered, v[0].gathered, (size_t)sp[s].k * (size_t)p.N * 16);
                snprintf(name, sizeof name, "%s %s: %d vs %d thread(s): loss", label, sp[s].desc, nthreads[k], nthreads[0]);
                check_bitwise(name, v[k].loss, v[0].loss, (size_t)n_loss(&p) * 4);
                snprintf(name, sizeof name, "%s %s: %d vs %d thread(s): lse", label, sp[s].desc, nthreads[k], nthreads[0]);
                check_bitwise(name, v[k].lse, v[0].lse, (size_t)p.N * 4);
                snprintf(name, sizeof name, "%s %s: %d vs %d thread(s): dlogits", label, sp[s].desc, nthreads[k], nthreads[0]);
                check_bitwise(name, v[k].dl, v[0].dl, xbytes_of(p.N, p.ld, p.dt));
            }
            for (int k = 0; k < 3; k++) vp_out_free(&v[k]);
        }
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
        tu_quiet = 0;
        printf("%s: %ld checks, %s\n", label, (tu_passed - p0) + (tu_failed - f0), tu_failed == f0 ? "all OK" : "FAILURES above");
        free_prob(&p);
    }
}

/* ------------------------------------------------------------------------------------------
 * Bad arguments: every validation rule of the three steps, with its exact status, a message
 * naming the function (and the value where given), and nothing written.
 * ---------------------------------------------------------------------------------------- */
enum { S1 = 0, S3 = 1, S4 = 2 };
enum { EN = 10, EV = 9, EVL = 4, EVS = 3, ELD = 6, EK = 3 };  /* shard [3, 7) of 9 classes */

typedef struct {
    float* stats;                                             /* step 1 */
    float* loss; float* lse_out; const float* gathered; int k; /* step 3 */
    void* dl; const float* lse_in; const float* gl; float gs; /* step 4 */
    const void* x; const void* t;
    int64_t N, V_local, ld, vs, V;
    fl_dtype dt; fl_index_dtype it; const fl_ce_options* o;
    void* ws; size_t wsb;
} vargs_t;

static fl_status call_step(int step, const vargs_t* a) {
    if (step == S1)
        return fl_vp_ce_local_stats_cpu(a->stats, a->x, a->t, a->N, a->V_local, a->ld, a->vs, a->V, a->dt, a->it, a->o,
                                        a->ws, a->wsb);
    if (step == S3)
        return fl_vp_ce_combine_cpu(a->loss, a->lse_out, a->gathered, a->k, a->t, a->N, a->V, a->it, a->o, a->ws, a->wsb);
    return fl_vp_ce_backward_cpu(a->dl, a->x, a->t, a->lse_in, a->gl, a->gs, a->N, a->V_local, a->ld, a->vs, a->V, a->dt,
                                 a->it, a->o, a->ws, a->wsb);
}

static float   e_x[EN * ELD], e_stats[EN * 4], e_gath[EK * EN * 4], e_loss[EN], e_lse[EN], e_lse_in[EN], e_gl[EN],
               e_dl[EN * ELD], e_w[EV];
static int64_t e_t64[EN];
static int32_t e_t32[EN];
static char*   e_ws;
static size_t  e_wsb_shard, e_wsb_comb, e_ws_cap;

static vargs_t valid_args(int step, const fl_ce_options* o) {
    vargs_t a;
    memset(&a, 0, sizeof a);
    a.stats = e_stats;
    a.loss = e_loss; a.lse_out = e_lse; a.gathered = e_gath; a.k = EK;
    a.dl = e_dl; a.lse_in = e_lse_in; a.gl = e_gl; a.gs = 1.0f;
    a.x = e_x; a.t = e_t64;
    a.N = EN; a.V_local = EVL; a.ld = ELD; a.vs = EVS; a.V = EV;
    a.dt = FL_DTYPE_F32; a.it = FL_INDEX_I64; a.o = o;
    a.ws = e_ws; a.wsb = step == S3 ? e_wsb_comb : e_wsb_shard;
    return a;
}
static void poison_outputs(void) {
    tu_poison(e_stats, sizeof e_stats);
    tu_poison(e_loss, sizeof e_loss);
    tu_poison(e_lse, sizeof e_lse);
    tu_poison(e_dl, sizeof e_dl);
}
static int outputs_untouched(void) {
    int ok = 1;
    for (size_t k = 0; k < sizeof e_stats / 4; k++) ok &= tu_is_poison(e_stats, 4, (int64_t)k);
    for (size_t k = 0; k < sizeof e_loss / 4; k++) ok &= tu_is_poison(e_loss, 4, (int64_t)k);
    for (size_t k = 0; k < sizeof e_lse / 4; k++) ok &= tu_is_poison(e_lse, 4, (int64_t)k);
    for (size_t k = 0; k < sizeof e_dl / 4; k++) ok &= tu_is_poison(e_dl, 4, (int64_t)k);
    return ok;
}

static void expect(int step, const vargs_t* a, fl_status want, const char* what, int check_outputs,
                   const char* must_contain) {
    char name[256];
    snprintf(name, sizeof name, "%s: %s", FN[step], what);
    if (check_outputs) poison_outputs();
    fl_status st = call_step(step, a);
    CHECK_STATUS(st, want, name);
    if (want == FL_OK) {
        CHECK(fl_last_error()[0] == '\0', "%s: fl_last_error() after success = \"%s\"", name, fl_last_error());
        return;
    }
    CHECK(strstr(fl_last_error(), FN[step]) != NULL, "%s: message \"%s\" does not name %s", name, fl_last_error(),
          FN[step]);
    if (must_contain)
        CHECK(strstr(fl_last_error(), must_contain) != NULL, "%s: message \"%s\" does not contain \"%s\"", name,
              fl_last_error(), must_contain);
    if (check_outputs) CHECK(outputs_untouched(), "%s: an output was written on failure", name);
}

static void test_errors(tu_rng* rng) {
    for (int k = 0; k < EN * ELD; k++) e_x[k] = (float)tu_normal(rng);
    for (int i = 0; i < EN; i++) {
        e_t64[i] = tu_int_in(rng, 0, EV - 1);        /* global classes: most rows' targets are not in the shard */
        e_t32[i] = (int32_t)e_t64[i];
        e_gl[i] = 1.0f;
        e_lse_in[i] = 3.0f;
    }
    for (int k = 0; k < EK * EN; k++) {
        e_gath[4 * k] = (float)tu_normal(rng);
        e_gath[4 * k + 1] = 1.5f; e_gath[4 * k + 2] = 0.5f; e_gath[4 * k + 3] = 0.0f;
    }
    for (int j = 0; j < EV; j++) e_w[j] = 1.0f;
    fl_ce_options base = FL_CE_OPTIONS_INIT;
    base.reduction = FL_REDUCTION_NONE;                 /* loss and grad_loss have N entries */
    size_t comb_f32;
    CHECK_STATUS(fl_cross_entropy_workspace_size(&e_wsb_shard, EN, EVL, FL_DTYPE_F32, &base), FL_OK, "ws size");
    CHECK_STATUS(fl_cross_entropy_workspace_size(&e_wsb_comb, EN, EV, FL_DTYPE_BF16, &base), FL_OK, "ws size");
    CHECK_STATUS(fl_cross_entropy_workspace_size(&comb_f32, EN, EV, FL_DTYPE_F32, &base), FL_OK, "ws size");
    e_ws_cap = 2 * (comb_f32 > e_wsb_shard ? comb_f32 : e_wsb_shard);
    e_ws = (char*)tu_xmalloc(e_ws_cap);
    printf("workspace for N=%d: steps 1/4 (V_local=%d, f32) %zu bytes, step 3 (V=%d, bf16 / f32 answer) %zu / %zu\n",
           EN, EVL, e_wsb_shard, EV, e_wsb_comb, comb_f32);

    static float big[4 * EN * ELD + 64];
    static int64_t tbig[EN * ELD];
    for (int step = 0; step < 3; step++) {
        vargs_t a;
        fl_ce_options o;
        const int shard = step != S3;
        a = valid_args(step, &base);
        expect(step, &a, FL_OK, "valid arguments", 0, NULL);
        if (step == S3) {
            a.wsb = comb_f32;
            expect(step, &a, FL_OK, "workspace of the fp32 answer", 0, NULL);
        }

#define BAD(field_stmt, want, what, must)               \
        do {                                            \
            a = valid_args(step, &base);                \
            o = base;                                   \
            a.o = &o;                                   \
            field_stmt;                                 \
            expect(step, &a, want, what, 1, must);      \
        } while (0)

        /* NULLs */
        if (step == S1) BAD(a.stats = NULL, FL_ERR_INVALID_ARGUMENT, "stats NULL", "stats");
        if (step == S3) {
            BAD(a.loss = NULL, FL_ERR_INVALID_ARGUMENT, "loss NULL", "loss");
            BAD(a.lse_out = NULL, FL_ERR_INVALID_ARGUMENT, "lse NULL", "lse");
            BAD(a.gathered = NULL, FL_ERR_INVALID_ARGUMENT, "gathered NULL", "gathered");
        }
        if (step == S4) {
            BAD(a.dl = NULL, FL_ERR_INVALID_ARGUMENT, "dlogits NULL", "dlogits");
            BAD(a.lse_in = NULL, FL_ERR_INVALID_ARGUMENT, "lse NULL", "lse");
        }
        if (shard) BAD(a.x = NULL, FL_ERR_INVALID_ARGUMENT, "logits NULL", "logits");
        BAD(a.t = NULL, FL_ERR_INVALID_ARGUMENT, "targets NULL", "targets");
        /* sizes */
        BAD(a.N = -1, FL_ERR_INVALID_ARGUMENT, "N = -1", "N (-1)");
        BAD(a.N = INT64_MIN, FL_ERR_INVALID_ARGUMENT, "N = INT64_MIN", NULL);
        BAD(a.V = 0, FL_ERR_INVALID_ARGUMENT, "V = 0", "V (0)");
        BAD(a.V = INT64_MIN, FL_ERR_INVALID_ARGUMENT, "V = INT64_MIN", NULL);
        if (shard) {
            BAD(a.V_local = 0, FL_ERR_INVALID_ARGUMENT, "V_local = 0", "V_local (0)");
            BAD(a.V_local = -3, FL_ERR_INVALID_ARGUMENT, "V_local = -3", "V_local (-3)");
            BAD(a.ld = EVL - 1, FL_ERR_INVALID_ARGUMENT, "ld < V_local", "ld (3)");
            BAD(a.vs = -1, FL_ERR_INVALID_ARGUMENT, "vocab_start = -1", "vocab_start (-1)");
            BAD(a.vs = INT64_MIN, FL_ERR_INVALID_ARGUMENT, "vocab_start = INT64_MIN", "vocab_start");
            BAD(a.vs = EV - EVL + 1, FL_ERR_INVALID_ARGUMENT, "vocab_start + V_local = V + 1", "vocab_start (6)");
            BAD(a.vs = INT64_MAX, FL_ERR_INVALID_ARGUMENT, "vocab_start = INT64_MAX (no overflow)", "vocab_start");
            BAD((a.vs = 0, a.V = EVL - 1), FL_ERR_INVALID_ARGUMENT, "V_local > V", "V (3)");
            BAD(a.dt = (fl_dtype)7, FL_ERR_INVALID_ARGUMENT, "dtype 7", "dtype (7)");
            BAD(a.dt = (fl_dtype)-1, FL_ERR_INVALID_ARGUMENT, "dtype -1", "dtype (-1)");
            BAD((a.N = 2, a.ld = INT64_MAX / 2), FL_ERR_INVALID_ARGUMENT, "N*ld overflows", "overflows");
        } else {
            BAD(a.k = 0, FL_ERR_INVALID_ARGUMENT, "k = 0", "k (0)");
            BAD(a.k = -1, FL_ERR_INVALID_ARGUMENT, "k = -1", "k (-1)");
            BAD(a.N = INT64_MAX / 8, FL_ERR_INVALID_ARGUMENT, "k*N*16 overflows", "overflows");
        }
        BAD(a.it = (fl_index_dtype)7, FL_ERR_INVALID_ARGUMENT, "index dtype 7", "index_dtype (7)");
        BAD(a.it = (fl_index_dtype)-1, FL_ERR_INVALID_ARGUMENT, "index dtype -1", "index_dtype (-1)");
        if (step == S4) {
            BAD(a.gs = NAN, FL_ERR_INVALID_ARGUMENT, "grad_scale NaN", "grad_scale");
            BAD(a.gs = INFINITY, FL_ERR_INVALID_ARGUMENT, "grad_scale inf", "grad_scale");
        }
        /* options */
        BAD(o.struct_size = 0, FL_ERR_INVALID_ARGUMENT, "struct_size 0", "struct_size");
        BAD(o.struct_size = sizeof(fl_ce_options) + 8, FL_ERR_INVALID_ARGUMENT, "struct_size sizeof+8", "struct_size");
        BAD(o.label_smoothing = 1.5f, FL_ERR_INVALID_ARGUMENT, "label_smoothing 1.5", "label_smoothing");
        BAD(o.label_smoothing = NAN, FL_ERR_INVALID_ARGUMENT, "label_smoothing NaN", "label_smoothing");
        BAD(o.z_loss = -1e-4f, FL_ERR_INVALID_ARGUMENT, "z_loss -1e-4", "z_loss");
        BAD(o.softcap = -1.0f, FL_ERR_INVALID_ARGUMENT, "softcap -1", "softcap");
        BAD(o.logit_scale = 0.0f, FL_ERR_INVALID_ARGUMENT, "logit_scale 0", "logit_scale");
        BAD(o.logit_scale = INFINITY, FL_ERR_INVALID_ARGUMENT, "logit_scale inf", "logit_scale");
        BAD(o.reduction = (fl_reduction)3, FL_ERR_INVALID_ARGUMENT, "reduction 3", "reduction (3)");
        /* the per-row target probability output is not one of the steps'; offsets are global, finite */
        BAD(o.target_prob = e_w, FL_ERR_UNSUPPORTED, "target_prob given", "target_prob");
        BAD((e_w[8] = NAN, o.logit_offset = e_w), FL_ERR_INVALID_ARGUMENT, "logit_offset[8] = NaN (outside the shard)",
            "logit_offset[8]");
        e_w[8] = 1.0f;
        /* class weights: the global [V] array, checked also outside the shard [3, 7) */
        BAD((e_w[4] = -1.0f, o.weight = e_w), FL_ERR_INVALID_ARGUMENT, "weight[4] = -1 (in the shard)", "weight[4]");
        e_w[4] = 1.0f;
        BAD((e_w[8] = NAN, o.weight = e_w), FL_ERR_INVALID_ARGUMENT, "weight[8] = NaN (outside the shard)", "weight[8]");
        e_w[8] = 1.0f;
        BAD((e_w[0] = INFINITY, o.weight = e_w), FL_ERR_INVALID_ARGUMENT, "weight[0] = inf (outside the shard)", "weight[0]");
        e_w[0] = 1.0f;
        /* workspace */
        BAD(a.wsb = a.wsb - 1, FL_ERR_INSUFFICIENT_WORKSPACE, "workspace_bytes = size - 1", "workspace_bytes");
        BAD((a.ws = NULL, a.wsb = 0), FL_ERR_INSUFFICIENT_WORKSPACE, "workspace NULL, 0 bytes", "workspace_bytes");
        BAD(a.ws = NULL, FL_ERR_INVALID_ARGUMENT, "workspace NULL, enough bytes", "workspace is NULL");
#undef BAD

        /* aliasing (outputs not poisoned: they overlap inputs) */
        if (step == S1) {
            a = valid_args(step, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.stats = big + 5;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "stats inside logits", 0, "stats");
            a = valid_args(step, &base);
            memcpy(tbig, e_t64, sizeof e_t64);
            a.t = tbig; a.stats = (float*)(tbig + 3);
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "stats inside targets", 0, "targets");
            a = valid_args(step, &base);
            o = base; o.weight = big + 2; a.o = &o;
            for (int j = 0; j < EV; j++) big[2 + j] = 1.0f;
            a.stats = big;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "stats overlapping weight", 0, "weight");
            a = valid_args(step, &base);
            a.stats = (float*)(e_ws + 64);
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "stats inside workspace", 0, "workspace");
            a = valid_args(step, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.ws = big + 8; a.wsb = e_wsb_shard;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "workspace overlapping logits", 0, "workspace");
        }
        if (step == S3) {
            a = valid_args(step, &base);
            a.lse_out = a.loss;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "lse == loss", 0, "lse");
            a = valid_args(step, &base);
            a.lse_out = a.loss + 1;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "lse overlapping loss (offset 1)", 0, "lse");
            a = valid_args(step, &base);
            memcpy(big, e_gath, sizeof e_gath);
            a.gathered = big; a.loss = big + 4 * EN;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "loss inside gathered (rank 1)", 0, "gathered");
            a = valid_args(step, &base);
            memcpy(big, e_gath, sizeof e_gath);
            a.gathered = big; a.lse_out = big + 4 * EN * (EK - 1) + 3;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "lse inside gathered (last rank)", 0, "gathered");
            a = valid_args(step, &base);
            memcpy(tbig, e_t64, sizeof e_t64);
            a.t = tbig; a.loss = (float*)(tbig + 2);
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "loss inside targets", 0, "targets");
            a = valid_args(step, &base);
            o = base; o.weight = e_w; a.o = &o;
            a.lse_out = e_w + 1;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "lse overlapping weight", 0, "weight");
            a = valid_args(step, &base);
            a.loss = (float*)(e_ws + 300);
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "loss inside workspace", 0, "workspace");
            a = valid_args(step, &base);
            memcpy(big, e_gath, sizeof e_gath);
            a.gathered = big; a.ws = big + 16; a.wsb = e_wsb_comb;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "workspace overlapping gathered", 0, "workspace");
        }
        if (step == S4) {
            a = valid_args(step, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.dl = big + 1;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "dlogits = logits + 1 element", 0, "partially overlaps");
            a = valid_args(step, &base);
            memcpy(big + 1, e_x, sizeof e_x);
            a.x = big + 1; a.dl = big;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "dlogits = logits - 1 element", 0, "partially overlaps");
            a = valid_args(step, &base);
            memcpy(tbig, e_t64, sizeof e_t64);
            a.t = tbig; a.dl = (float*)(tbig + 1);
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping targets", 0, "targets");
            a = valid_args(step, &base);
            a.gl = e_dl + 5;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping grad_loss", 0, "grad_loss");
            a = valid_args(step, &base);
            memcpy(big + 2 * ELD, e_lse_in, sizeof e_lse_in);
            a.dl = big; a.lse_in = big + 2 * ELD;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping lse", 0, "lse");
            a = valid_args(step, &base);
            o = base; o.weight = e_dl + 3; a.o = &o;
            for (int j = 0; j < EV; j++) e_dl[3 + j] = 1.0f;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "dlogits overlapping weight", 0, "weight");
            a = valid_args(step, &base);
            a.dl = e_ws + 16;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "dlogits inside workspace", 0, "workspace");
            a = valid_args(step, &base);
            a.ws = e_lse_in; a.wsb = e_wsb_shard;
            expect(step, &a, FL_ERR_INVALID_ARGUMENT, "workspace overlapping lse", 0, "workspace");
            /* in place is allowed */
            a = valid_args(step, &base);
            memcpy(big, e_x, sizeof e_x);
            a.x = big; a.dl = big;
            expect(step, &a, FL_OK, "dlogits == logits (in place)", 0, NULL);
        }

        /* targets: global classes; out of [0, V) (and not ignore_index) -> TARGET_OUT_OF_RANGE naming
         * the first bad row, nothing written; a target outside the shard but inside [0, V) is fine */
        static const struct { int64_t ignore, bad5, bad8; int i32; const char* what; } oor[] = {
            {-100, EV, -1, 0, "target V at row 5 (and -1 at row 8), i64"},
            {-100, -1, EV, 1, "target -1 at row 5, i32"},
            {2, -100, 2, 0, "target -100 with ignore_index 2, i64"},
            {-100, (int64_t)1 << 40, 0, 0, "target 2^40 at row 5, i64"},
            {-100, INT32_MIN, 0, 1, "target INT32_MIN at row 5, i32"},
        };
        for (size_t k = 0; k < sizeof oor / sizeof oor[0]; k++) {
            for (int red = 0; red < 3; red++) {
                int64_t t64[EN];
                int32_t t32[EN];
                memcpy(t64, e_t64, sizeof t64);
                for (int i = 0; i < EN; i++) if (t64[i] == oor[k].ignore) t64[i] = (oor[k].ignore + 1) % EV;
                t64[5] = oor[k].bad5;
                t64[8] = oor[k].bad8;
                for (int i = 0; i < EN; i++) t32[i] = (int32_t)t64[i];
                o = base;
                o.reduction = (fl_reduction)red;
                o.ignore_index = oor[k].ignore;
                a = valid_args(step, &o);
                if (oor[k].i32) { a.t = t32; a.it = FL_INDEX_I32; } else a.t = t64;
                char what[200];
                snprintf(what, sizeof what, "%s (reduction %d)", oor[k].what, red);
                expect(step, &a, FL_ERR_TARGET_OUT_OF_RANGE, what, 1, "row 5");
                CHECK(strstr(fl_last_error(), "row 8") == NULL, "%s: message names row 8, not the first bad row: \"%s\"",
                      what, fl_last_error());
            }
        }
        {   /* every target in the shard's complement [0, 3) u [7, 9): valid */
            int64_t t64[EN];
            for (int i = 0; i < EN; i++) t64[i] = i % 2 ? 8 : 0;
            a = valid_args(step, &base);
            a.t = t64;
            expect(step, &a, FL_OK, "no target in the shard", 0, NULL);
        }
    }
    free(e_ws);

    {   /* workspace sizes where they differ: steps 1 and 4 take section 5's for (N, V_local), not (N, V);
         * step 3 takes (N, V) of any dtype (its 16-bit answer is below the fp32 one at this V) */
        enum { WN = 64, WV = 5000, WVL = 100, WVS = 4900 };
        static float wx[WN * WVL], wdl[WN * WVL], wstats[WN * 4], wgath[2 * WN * 4], wloss[1], wlse[WN];
        static int64_t wt[WN];
        for (int k = 0; k < WN * WVL; k++) wx[k] = (float)tu_normal(rng);
        for (int i = 0; i < WN; i++) wt[i] = tu_int_in(rng, 0, WV - 1);
        size_t b_loc, b_glob, b_16, b_32;
        fl_cross_entropy_workspace_size(&b_loc, WN, WVL, FL_DTYPE_F32, NULL);
        fl_cross_entropy_workspace_size(&b_glob, WN, WV, FL_DTYPE_F32, NULL);
        fl_cross_entropy_workspace_size(&b_16, WN, WV, FL_DTYPE_BF16, NULL);
        b_32 = b_glob;
        CHECK(b_loc < b_glob && b_16 < b_32, "workspace sizes: V_local %zu, V %zu, V bf16 %zu", b_loc, b_glob, b_16);
        char* w = (char*)tu_xmalloc(b_glob);
        fl_status st = fl_vp_ce_local_stats_cpu(wstats, wx, wt, WN, WVL, WVL, WVS, WV, FL_DTYPE_F32, FL_INDEX_I64, NULL,
                                                w, b_loc);
        CHECK_STATUS(st, FL_OK, "step 1 with the (N, V_local) workspace (smaller than (N, V)'s)");
        st = fl_vp_ce_local_stats_cpu(wstats, wx, wt, WN, WVL, WVL, WVS, WV, FL_DTYPE_F32, FL_INDEX_I64, NULL, w, b_loc - 1);
        CHECK_STATUS(st, FL_ERR_INSUFFICIENT_WORKSPACE, "step 1 with (N, V_local)'s workspace - 1");
        for (int k = 0; k < 2 * WN * 4; k++) wgath[k] = k % 4 == 1 ? 1.0f : 0.0f;
        st = fl_vp_ce_combine_cpu(wloss, wlse, wgath, 2, wt, WN, WV, FL_INDEX_I64, NULL, w, b_16);
        CHECK_STATUS(st, FL_OK, "step 3 with the (N, V) bf16 workspace (smaller than fp32's)");
        st = fl_vp_ce_combine_cpu(wloss, wlse, wgath, 2, wt, WN, WV, FL_INDEX_I64, NULL, w, b_32);
        CHECK_STATUS(st, FL_OK, "step 3 with the (N, V) fp32 workspace");
        st = fl_vp_ce_combine_cpu(wloss, wlse, wgath, 2, wt, WN, WV, FL_INDEX_I64, NULL, w, b_16 - 1);
        CHECK_STATUS(st, FL_ERR_INSUFFICIENT_WORKSPACE, "step 3 with (N, V) bf16's workspace - 1");
        st = fl_vp_ce_backward_cpu(wdl, wx, wt, wlse, NULL, 1.0f, WN, WVL, WVL, WVS, WV, FL_DTYPE_F32, FL_INDEX_I64, NULL,
                                   w, b_loc);
        CHECK_STATUS(st, FL_OK, "step 4 with the (N, V_local) workspace");
        st = fl_vp_ce_backward_cpu(wdl, wx, wt, wlse, NULL, 1.0f, WN, WVL, WVL, WVS, WV, FL_DTYPE_F32, FL_INDEX_I64, NULL,
                                   w, b_loc - 1);
        CHECK_STATUS(st, FL_ERR_INSUFFICIENT_WORKSPACE, "step 4 with (N, V_local)'s workspace - 1");
        free(w);
    }
}

static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261201ull;
    printf("seed %llu\n", (unsigned long long)seed);
    printf("tolerances: loss/lse rtol 2^-23 + %.0e + derived stats-rounding slack x %.0f (u = 2^-24); dlogits bitwise vs "
           "CE backward(VP lse), 2 ulp of the dtype vs the exact gradient\n", DBL_NOISE, VP_SAFETY);
    tu_rng rng = tu_rng_seed(seed);
    static void (*const sections[])(tu_rng*) = {test_errors, test_empty_and_all_ignored, test_options,
                                                 test_empty_shards, test_big_logits, test_inf_logits, test_threads};
    static const char* const names[] = {"errors", "N=0 / all ignored", "options x dtypes x shapes x splits",
                                        "shards without targets", "logits +-1e4", "+-inf logits", "threads"};
    for (size_t k = 0; k < sizeof sections / sizeof sections[0]; k++) {
        double t0 = now_s();
        long f0 = tu_failed, p0 = tu_passed;
        sections[k](&rng);
        printf("== section %-36s %6ld checks, %s  (%.2f s)\n", names[k], (tu_passed - p0) + (tu_failed - f0),
               tu_failed == f0 ? "ok" : "FAILED", now_s() - t0);
    }
    printf("splits run: %ld (shards of 1 column: %ld, shards holding no row's target: %ld)\n", g_splits,
           g_one_col_shards, g_empty_shards);
    printf("worst |VP - CE| / tolerance: loss %.3f, lse %.3f (1 = at the derived bound)\n", g_loss_ratio, g_lse_ratio);
    return tu_finish();
}
