/* taylor_ce.c — CPU reference backend of the Taylor softmax cross-entropy (include/fusedloss.h
 * section 14): the executable specification. Single-threaded, every quantity in double (inputs
 * converted exactly), outputs rounded double -> fp32 (RN) -> dtype (RN).
 *
 *   check : every target in [0, C) or ignore_index before anything is written;
 *   rows  : S = sum_k f(x_k), l = log S - log f(x_y); dx_j = g (f'(x_j) / S - [j == y] f'(x_y) / f(x_y))
 *           (every x_j read before dx_j is written: in place works); ignored rows: loss 0 and
 *           gradient 0, the row not read;
 *   reduce: SUM / MEAN in double in row order (MEAN over the rows not ignored; NaN if none).
 * The workspace is not used.
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>

#include "../internal.h"
#include "dtype.h"

/* f_n(x) and f_n'(x) = f_{n-1}(x) */
static double taylor_f(double x, int order) {
    const double f2 = 1.0 + x + 0.5 * x * x;
    return order == 2 ? f2 : f2 + x * x * x / 6.0 + x * x * x * x / 24.0;
}
static double taylor_df(double x, int order) {
    return order == 2 ? 1.0 + x : 1.0 + x + 0.5 * x * x + x * x * x / 6.0;
}

static fl_status taylor_cpu(const char* fn, const fl__taylor_params* p, float* loss, void* dlogits, const void* x,
                            const void* targets, const float* grad_loss, float grad_scale) {
    const int64_t N = p->N, C = p->C, ld = p->ld;
    const int none = p->reduction == FL_REDUCTION_NONE;
    for (int64_t i = 0; i < N; i++) {
        const int64_t y = fl__ce_load_target(targets, p->index_dtype, i);
        if (y != p->ignore_index && (y < 0 || y >= C))
            return fl__fail(FL_ERR_TARGET_OUT_OF_RANGE,
                            "%s: targets[%lld] = %lld not in [0, C = %lld) and not ignore_index (%lld)", fn,
                            (long long)i, (long long)y, (long long)C, (long long)p->ignore_index);
    }
    int64_t D = 0;
    for (int64_t i = 0; i < N; i++) D += fl__ce_load_target(targets, p->index_dtype, i) != p->ignore_index;
    double total = 0.0;
    for (int64_t i = 0; i < N; i++) {
        const int64_t y = fl__ce_load_target(targets, p->index_dtype, i);
        const int64_t r0 = i * ld;
        if (y == p->ignore_index) {
            if (none && loss) loss[i] = 0.0f;
            if (dlogits)
                for (int64_t j = 0; j < C; j++) fl__store_f32(dlogits, p->dtype, r0 + j, 0.0f);
            continue;
        }
        double S = 0.0;
        for (int64_t j = 0; j < C; j++) S += taylor_f((double)fl__load_f32(x, p->dtype, r0 + j), p->order);
        const double xy = (double)fl__load_f32(x, p->dtype, r0 + y);
        const double fy = taylor_f(xy, p->order);
        const double l = log(S) - log(fy);
        if (none && loss) loss[i] = (float)l;
        total += l;
        if (dlogits) {
            double g = (double)grad_scale * (grad_loss ? (double)grad_loss[none ? i : 0] : 1.0);
            if (p->reduction == FL_REDUCTION_MEAN) g /= (double)D;
            const double dfy = taylor_df(xy, p->order) / fy;
            for (int64_t j = 0; j < C; j++) {
                const double v = (double)fl__load_f32(x, p->dtype, r0 + j);   /* read, then write */
                const double d = taylor_df(v, p->order) / S - (j == y ? dfy : 0.0);
                fl__store_f32(dlogits, p->dtype, r0 + j, (float)(g * d));
            }
        }
    }
    if (!none && loss)
        loss[0] = p->reduction == FL_REDUCTION_SUM ? (float)total : (D == 0 ? NAN : (float)(total / (double)D));
    return FL_OK;
}

fl_status fl_taylor_ce_forward_cpu(float* loss, const void* logits, int64_t ld, const void* targets,
                                   fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                   const fl_taylor_options* opts, void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_taylor_ce_forward_cpu";
    fl__clear_error();
    fl__taylor_params p;
    FL_CHECK(fl__taylor_validate(fn, FL__PASS_FORWARD, 0, loss, NULL, logits, ld, targets, index_dtype, NULL, 1.0f,
                                 N, C, dtype, opts, workspace, workspace_bytes, &p));
    return taylor_cpu(fn, &p, loss, NULL, logits, targets, NULL, 1.0f);
}

fl_status fl_taylor_ce_fused_cpu(float* loss, void* dlogits, const void* logits, int64_t ld, const void* targets,
                                 fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                 int64_t C, fl_dtype dtype, const fl_taylor_options* opts, void* workspace,
                                 size_t workspace_bytes) {
    static const char* fn = "fl_taylor_ce_fused_cpu";
    fl__clear_error();
    fl__taylor_params p;
    FL_CHECK(fl__taylor_validate(fn, FL__PASS_FUSED, 0, loss, dlogits, logits, ld, targets, index_dtype, grad_loss,
                                 grad_scale, N, C, dtype, opts, workspace, workspace_bytes, &p));
    return taylor_cpu(fn, &p, loss, dlogits, logits, targets, grad_loss, grad_scale);
}
