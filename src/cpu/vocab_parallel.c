/* vocab_parallel.c — CPU reference of the vocab-parallel cross-entropy steps (header section 8).
 *
 * k ranks each hold a contiguous shard [vocab_start, vocab_start + V_local) of the vocabulary's
 * logits. The three CPU steps (the collective between steps 1 and 3 is the caller's):
 *   1. fl_vp_ce_local_stats_cpu : per row, over the shard, (m, s, wz, zt) = (max z, sum exp(z - m),
 *      sum w z, z_t if t is in the shard else 0), stored fp32;
 *   3. fl_vp_ce_combine_cpu     : the k rows merged in rank order into lse and the loss;
 *   4. fl_vp_ce_backward_cpu    : the shard's dlogits from the global lse.
 * Built from the cross-entropy backend's row math (src/cpu/cross_entropy.c, declared in
 * src/internal.h): fl__ce_cpu_row_partial on the shard's columns (step 1), fl__ce_lse and
 * fl__ce_row_terms on the merged statistics (step 3), fl__ce_row_upstream and fl__ce_cpu_row_grad
 * on the shard's columns (step 4); fl__ce_cpu_denoms for the target check, the MEAN denominators
 * and W = sum of the GLOBAL class weights; fl__ce_cpu_reduce for SUM / MEAN. So every formula
 * (transform, smoothing over the whole vocabulary, class weights, z-loss and its own MEAN
 * denominator, ignore_index, reductions, upstream gradient) is the one of
 * fl_cross_entropy_*_cpu; the only difference is that step 2 moves fp32:
 *   - m is stored as fp32 and s is made relative to that STORED m (s * exp(m - (float)m), in
 *     double), so the fp32 pair (m, s) stands for the shard's sum of exp(z) up to s's own
 *     rounding (relative 2^-24, i.e. lse within 2^-24 absolute), not m's;
 *   - wz and zt are rounded to fp32 (relative 2^-24 each).
 * Each step accumulates in double; rows are spread over threads with OpenMP and each row is
 * computed by one thread in a fixed order, so the results do not depend on the thread count. With
 * the same inputs every rank computes the same bits in step 3 (the merge is in rank order).
 */
#include <math.h>
#include <stdint.h>

#include "../internal.h"

/* ---- step 1 ---------------------------------------------------------------------------------- */

void fl__vp_cpu_row_stats(float* st, const void* logits, fl_dtype dtype, int64_t off, int64_t col0, int64_t n,
                          int64_t t, const fl__ce_params* p) {
    double m, s, zt, wz;
    fl__ce_cpu_row_partial(logits, dtype, off, col0, n, t, p, &m, &s, &zt, &wz);
    const float mf = (float)m;
    /* s relative to the m that is stored: exp(m - mf) is exact to double rounding (m - mf is
     * exact). An all-(-inf) shard stores (-inf, 0): its sum of exp is 0 (the row loop leaves
     * s = NaN there, from exp(-inf - -inf), which fl__ce_lse never reads for a whole row but
     * the merge would: NaN * 0) */
    if (isfinite(mf)) s *= exp(m - (double)mf);
    else if (m == -INFINITY) s = 0.0;
    st[0] = mf;
    st[1] = (float)s;
    st[2] = p->label_smoothing > 0.0f ? (float)wz : 0.0f;  /* only smoothing uses it (as CUDA) */
    st[3] = (float)zt;
}

fl_status fl_vp_ce_local_stats_cpu(float* stats, const void* logits, const void* targets, int64_t N,
                                   int64_t V_local, int64_t ld, int64_t vocab_start, int64_t V,
                                   fl_dtype dtype, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                   void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_vp_ce_local_stats_cpu";
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__vp_validate_shard(fn, 0, 0, stats, NULL, logits, targets, NULL, NULL, 1.0f, N, V_local, ld,
                                   vocab_start, V, dtype, index_dtype, opts, workspace, workspace_bytes, &p));
    /* the GLOBAL targets, checked against [0, V) before anything is written (d itself unused) */
    fl__ce_denoms d;
    FL_CHECK(fl__ce_cpu_denoms(fn, targets, index_dtype, N, V, &p, &d));

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * V_local > 65536)
#endif
    for (int64_t i = 0; i < N; i++) {
        float* st = stats + 4 * i;                       /* [N][4]: m, s, wz, zt */
        const int64_t t = fl__ce_load_target(targets, index_dtype, i);
        if (t == p.ignore_index) {                       /* logits not read */
            st[0] = -INFINITY;
            st[1] = st[2] = st[3] = 0.0f;
            continue;
        }
        fl__vp_cpu_row_stats(st, logits, dtype, i * ld, vocab_start, V_local, t, &p);
    }
    return FL_OK;
}

/* ---- step 3 ---------------------------------------------------------------------------------- */

fl_status fl_vp_ce_combine_cpu(float* loss, float* lse, const float* gathered, int k, const void* targets,
                               int64_t N, int64_t V, fl_index_dtype index_dtype, const fl_ce_options* opts,
                               void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_vp_ce_combine_cpu";
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__vp_validate_combine(fn, 0, loss, lse, gathered, k, targets, N, V, index_dtype, opts, workspace,
                                     workspace_bytes, &p));
    fl__ce_denoms d;
    FL_CHECK(fl__ce_cpu_denoms(fn, targets, index_dtype, N, V, &p, &d));
    double* part = (double*)((char*)workspace + 256);   /* [N][2]: a_i, b_i, as cross_entropy.c */
    const int none = p.reduction == FL_REDUCTION_NONE;

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * (int64_t)k > 65536)
#endif
    for (int64_t i = 0; i < N; i++) {
        const int64_t t = fl__ce_load_target(targets, index_dtype, i);
        if (t == p.ignore_index) {                       /* gathered rows not read */
            part[2 * i] = part[2 * i + 1] = 0.0;
            if (none) loss[i] = 0.0f;
            lse[i] = 0.0f;
            continue;
        }
        /* M = max_r m_r; S = sum_r s_r exp(m_r - M), sum w z and z_t, all in rank order */
        double M = -INFINITY;
        for (int r = 0; r < k; r++) {
            const double m_r = (double)gathered[4 * ((size_t)r * (size_t)N + (size_t)i)];
            if (m_r > M) M = m_r;
        }
        double S = 0.0, wz = 0.0, zt = 0.0;
        for (int r = 0; r < k; r++) {
            const float* q = gathered + 4 * ((size_t)r * (size_t)N + (size_t)i);
            const double m_r = (double)q[0];
            /* exp(0) where m_r == M, so that an infinite M (z = +-inf) gives no inf - inf; a shard
             * with m_r = -inf < M adds s_r * 0 (0, or NaN if its s is NaN, as the full row's would) */
            S += (double)q[1] * (m_r == M ? 1.0 : exp(m_r - M));
            wz += (double)q[2];
            zt += (double)q[3];
        }
        const double L = fl__ce_lse(M, S);              /* -inf when every shard is all -inf, as CE */
        double a, b;
        fl__ce_row_terms(&p, V, d.W, t, L, zt, wz, &a, &b);
        part[2 * i] = a;
        part[2 * i + 1] = b;
        if (none) loss[i] = (float)(a + b);
        lse[i] = (float)L;
    }
    fl__ce_cpu_reduce(loss, part, N, &p, &d);
    return FL_OK;
}

/* ---- step 4 ---------------------------------------------------------------------------------- */

fl_status fl_vp_ce_backward_cpu(void* dlogits, const void* logits, const void* targets, const float* lse,
                                const float* grad_loss, float grad_scale, int64_t N, int64_t V_local,
                                int64_t ld, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                fl_index_dtype index_dtype, const fl_ce_options* opts, void* workspace,
                                size_t workspace_bytes) {
    static const char* fn = "fl_vp_ce_backward_cpu";
    fl__clear_error();
    fl__ce_params p;
    FL_CHECK(fl__vp_validate_shard(fn, 1, 0, NULL, dlogits, logits, targets, lse, grad_loss, grad_scale, N,
                                   V_local, ld, vocab_start, V, dtype, index_dtype, opts, workspace,
                                   workspace_bytes, &p));
    /* targets checked; the MEAN denominators and W over the whole batch and vocabulary */
    fl__ce_denoms d;
    FL_CHECK(fl__ce_cpu_denoms(fn, targets, index_dtype, N, V, &p, &d));

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (N * V_local > 65536)
#endif
    for (int64_t i = 0; i < N; i++) {
        const int64_t off = i * ld;                      /* 64-bit: N*ld may exceed 2^31 */
        const int64_t t = fl__ce_load_target(targets, index_dtype, i);
        if (t == p.ignore_index) {                       /* logits and lse not read */
            fl__ce_cpu_row_zero(dlogits, dtype, off, V_local);
            continue;
        }
        double g_a, g_b;
        fl__ce_row_upstream(&p, &d, grad_loss, grad_scale, i, &g_a, &g_b);
        fl__ce_cpu_row_grad(dlogits, logits, dtype, off, vocab_start, V_local, V, t, (double)lse[i], d.W, g_a, g_b,
                            &p);
    }
    return FL_OK;
}
