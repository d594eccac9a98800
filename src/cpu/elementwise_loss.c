/* elementwise_loss.c — CPU reference backend of the elementwise losses: sigmoid focal
 * (torchvision semantics) and BCE with logits (PyTorch semantics), forward / backward / fused:
 * the executable specification of include/fusedloss.h section 9.
 *
 * Element math: fp32, from src/cpu/elementwise_math.h (the same source the CUDA kernel
 * compiles). The library is built as ISO C11 (-ffp-contract=off), so nothing is contracted here.
 * Reductions: the n elements are cut into fl__ew_blocks(n) fixed contiguous blocks, each summed
 * in element order in double (into the workspace), then the partials in block order: the result
 * does not depend on the thread count. Threads: OpenMP over the blocks when available.
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"
#include "dtype.h"
#include "elementwise_math.h"

/* The whole call: every pass, both ops. */
static void ew_cpu(const fl__ew_params* p, fl__pass pass, float* loss, void* dx, const void* x, const void* y,
                   const float* grad_loss, float grad_scale, fl_dtype dt, void* workspace) {
    const int64_t n = p->n, C = p->C;
    const int want_loss = pass != FL__PASS_BACKWARD, want_grad = pass != FL__PASS_FORWARD;
    const int none = p->reduction == FL_REDUCTION_NONE;
    const int64_t B = fl__ew_blocks(n);
    const int64_t chunk = B ? (n + B - 1) / B : 0;
    double* part = (want_loss && !none) ? (double*)((char*)workspace + 256) : NULL;
    /* upstream gradient of SUM / MEAN (one value); NONE reads grad_loss[k] per element */
    float g0 = 0.0f;
    if (want_grad && !none) {
        g0 = grad_scale * (grad_loss ? grad_loss[0] : 1.0f);
        if (p->reduction == FL_REDUCTION_MEAN) g0 = (float)((double)g0 / (double)n);
    }
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n > 65536)
#endif
    for (int64_t b = 0; b < B; b++) {
        const int64_t k0 = b * chunk, k1 = (b + 1) * chunk < n ? (b + 1) * chunk : n;
        int64_t j = k0 % C;   /* column of element k (bce weights) */
        double acc = 0.0;
        for (int64_t k = k0; k < k1; k++) {   /* 64-bit: n may exceed 2^31 */
            const float xv = fl__load_f32(x, dt, k), yv = fl__load_f32(y, dt, k);
            float l, d;
            if (p->op == FL__EW_FOCAL) {
                fl__ew_focal(xv, yv, p->alpha, p->use_alpha, p->gamma, p->gamma_kind, 0, &l, &d);
            } else {
                fl__ew_bce(xv, yv, p->weight ? p->weight[j] : 1.0f, p->weight != NULL,
                           p->pos_weight ? p->pos_weight[j] : 1.0f, p->pos_weight != NULL, 0, &l, &d);
                if (++j == C) j = 0;
            }
            if (want_loss) {
                if (none) loss[k] = l;
                else acc += (double)l;
            }
            if (want_grad) {
                const float g = none ? grad_scale * (grad_loss ? grad_loss[k] : 1.0f) : g0;
                fl__store_f32(dx, dt, k, g * d);   /* in place: x[k] was read above */
            }
        }
        if (part) part[b] = acc;
    }
    if (want_loss && !none) {
        double s = 0.0;
        for (int64_t b = 0; b < B; b++) s += part[b];   /* fixed block order */
        if (p->reduction == FL_REDUCTION_MEAN) s = n > 0 ? s / (double)n : NAN;   /* empty mean: NaN, as torch */
        loss[0] = (float)s;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* entry points                                                                               */

fl_status fl_sigmoid_focal_forward_cpu(float* loss, const void* logits, const void* targets, int64_t n,
                                       fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                                       void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_sigmoid_focal_forward_cpu";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_FOCAL, FL__PASS_FORWARD, 0, loss, NULL, logits, targets, NULL, NULL, NULL,
                             1.0f, n, 1, dtype, alpha, gamma, reduction, workspace, workspace_bytes, &p));
    ew_cpu(&p, FL__PASS_FORWARD, loss, NULL, logits, targets, NULL, 1.0f, dtype, workspace);
    return FL_OK;
}

fl_status fl_sigmoid_focal_backward_cpu(void* dlogits, const void* logits, const void* targets,
                                        const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                        float alpha, float gamma, fl_reduction reduction) {
    static const char* fn = "fl_sigmoid_focal_backward_cpu";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_FOCAL, FL__PASS_BACKWARD, 0, NULL, dlogits, logits, targets, NULL, NULL,
                             grad_loss, grad_scale, n, 1, dtype, alpha, gamma, reduction, NULL, 0, &p));
    ew_cpu(&p, FL__PASS_BACKWARD, NULL, dlogits, logits, targets, grad_loss, grad_scale, dtype, NULL);
    return FL_OK;
}

fl_status fl_sigmoid_focal_fused_cpu(float* loss, void* dlogits, const void* logits, const void* targets,
                                     const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                     float alpha, float gamma, fl_reduction reduction, void* workspace,
                                     size_t workspace_bytes) {
    static const char* fn = "fl_sigmoid_focal_fused_cpu";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_FOCAL, FL__PASS_FUSED, 0, loss, dlogits, logits, targets, NULL, NULL,
                             grad_loss, grad_scale, n, 1, dtype, alpha, gamma, reduction, workspace,
                             workspace_bytes, &p));
    ew_cpu(&p, FL__PASS_FUSED, loss, dlogits, logits, targets, grad_loss, grad_scale, dtype, workspace);
    return FL_OK;
}

fl_status fl_bce_with_logits_forward_cpu(float* loss, const void* logits, const void* targets, const float* weight,
                                         const float* pos_weight, int64_t N, int64_t C, fl_dtype dtype,
                                         fl_reduction reduction, void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_bce_with_logits_forward_cpu";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_BCE, FL__PASS_FORWARD, 0, loss, NULL, logits, targets, weight, pos_weight,
                             NULL, 1.0f, N, C, dtype, 0.0f, 0.0f, reduction, workspace, workspace_bytes, &p));
    ew_cpu(&p, FL__PASS_FORWARD, loss, NULL, logits, targets, NULL, 1.0f, dtype, workspace);
    return FL_OK;
}

fl_status fl_bce_with_logits_backward_cpu(void* dlogits, const void* logits, const void* targets,
                                          const float* weight, const float* pos_weight, const float* grad_loss,
                                          float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                          fl_reduction reduction) {
    static const char* fn = "fl_bce_with_logits_backward_cpu";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_BCE, FL__PASS_BACKWARD, 0, NULL, dlogits, logits, targets, weight,
                             pos_weight, grad_loss, grad_scale, N, C, dtype, 0.0f, 0.0f, reduction, NULL, 0, &p));
    ew_cpu(&p, FL__PASS_BACKWARD, NULL, dlogits, logits, targets, grad_loss, grad_scale, dtype, NULL);
    return FL_OK;
}

fl_status fl_bce_with_logits_fused_cpu(float* loss, void* dlogits, const void* logits, const void* targets,
                                       const float* weight, const float* pos_weight, const float* grad_loss,
                                       float grad_scale, int64_t N, int64_t C, fl_dtype dtype, fl_reduction reduction,
                                       void* workspace, size_t workspace_bytes) {
    static const char* fn = "fl_bce_with_logits_fused_cpu";
    fl__clear_error();
    fl__ew_params p;
    FL_CHECK(fl__ew_validate(fn, FL__EW_BCE, FL__PASS_FUSED, 0, loss, dlogits, logits, targets, weight, pos_weight,
                             grad_loss, grad_scale, N, C, dtype, 0.0f, 0.0f, reduction, workspace, workspace_bytes,
                             &p));
    ew_cpu(&p, FL__PASS_FUSED, loss, dlogits, logits, targets, grad_loss, grad_scale, dtype, workspace);
    return FL_OK;
}
