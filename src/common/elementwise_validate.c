/* elementwise_validate.c — argument checks shared by the CPU and CUDA backends of the
 * elementwise losses (include/fusedloss.h section 9: sigmoid focal, BCE with logits), their work
 * plan (pure integer arithmetic: the size queries and both backends agree) and the two
 * workspace size queries.
 *
 * Every message names the public function and the offending value. Nothing here dereferences
 * a caller pointer (weight / pos_weight values are not checked: PyTorch accepts any).
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"
#include "../cpu/elementwise_math.h"

#define EW_BLOCK_ELEMS 4096  /* elements per reduction block before the 1024-block cap */

int64_t fl__ew_blocks(int64_t n) {
    if (n <= 0) return 0;
    const int64_t b = (n + EW_BLOCK_ELEMS - 1) / EW_BLOCK_ELEMS;
    return b > FL__EW_MAX_BLOCKS ? FL__EW_MAX_BLOCKS : b;
}

size_t fl__ew_workspace_bytes(int64_t n) {
    return 256u + (((size_t)fl__ew_blocks(n) * sizeof(double) + 255u) & ~(size_t)255u);
}

fl_status fl_sigmoid_focal_workspace_size(size_t* bytes, int64_t n) {
    static const char* fn = "fl_sigmoid_focal_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (n < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: n (%lld) < 0", fn, (long long)n);
    *bytes = fl__ew_workspace_bytes(n);
    return FL_OK;
}

fl_status fl_bce_with_logits_workspace_size(size_t* bytes, int64_t N, int64_t C) {
    static const char* fn = "fl_bce_with_logits_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    if (N > 0 && C > INT64_MAX / 4 / N)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N*C (%lld*%lld) overflows", fn, (long long)N, (long long)C);
    *bytes = fl__ew_workspace_bytes(N * C);
    return FL_OK;
}

static int finitef_(float v) { return v == v && v - v == 0.0f; }

fl_status fl__ew_validate(const char* fn, fl__ew_op op, fl__pass pass, int is_cuda, const float* loss,
                          const void* dlogits, const void* logits, const void* targets, const float* weight,
                          const float* pos_weight, const float* grad_loss, float grad_scale, int64_t N,
                          int64_t C, fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                          const void* workspace, size_t workspace_bytes, fl__ew_params* p) {
    const int focal = op == FL__EW_FOCAL;
    const int has_loss = pass != FL__PASS_BACKWARD, has_grad = pass != FL__PASS_FORWARD;
    memset(p, 0, sizeof(*p));

    /* sizes, dtype, reduction, options */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%lld) < 0", fn, focal ? "n" : "N", (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    const size_t es = fl__dtype_size(dtype);
    if (es == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (reduction != FL_REDUCTION_NONE && reduction != FL_REDUCTION_MEAN && reduction != FL_REDUCTION_SUM)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown reduction (%d); use FL_REDUCTION_NONE (0), "
                        "FL_REDUCTION_MEAN (1) or FL_REDUCTION_SUM (2)", fn, (int)reduction);
    /* n elements of 4 bytes (the fp32 loss / grad_loss) addressable: guards every 64-bit product */
    if (N > 0 && C > INT64_MAX / 4 / N)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N*C (%lld*%lld) overflows", fn, (long long)N, (long long)C);
    const int64_t n = N * C;
    if (focal) {
        if (!finitef_(gamma) || gamma < 0.0f)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: gamma (%g) must be finite and >= 0", fn, (double)gamma);
        if (!finitef_(alpha))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: alpha (%g) must be finite (< 0 disables it)", fn,
                            (double)alpha);
    }
    if (has_grad && !finitef_(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) must be finite", fn, (double)grad_scale);

    /* pointers */
    if (has_loss && !loss && (n > 0 || reduction != FL_REDUCTION_NONE))   /* NONE with n == 0: nothing to write */
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (n > 0 && !logits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
    if (n > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);
    if (has_grad && n > 0 && !dlogits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits is NULL", fn);
    {
        const void* ps[6] = {logits, targets, has_grad ? dlogits : NULL, has_loss ? loss : NULL,
                             has_grad ? grad_loss : NULL, weight};
        const char* names[6] = {"logits", "targets", "dlogits", "loss", "grad_loss", "weight"};
        const size_t al[6] = {es, es, es, 4, 4, 4};
        for (int k = 0; k < 6; k++)
            if (ps[k] && ((uintptr_t)ps[k] % al[k]))
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu)",
                                fn, names[k], ps[k], al[k]);
        if (pos_weight && ((uintptr_t)pos_weight % 4u))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: pos_weight (%p) is not aligned to 4 bytes", fn,
                            (const void*)pos_weight);
    }

    /* workspace: forward / fused with a reduction */
    const int ws_used = has_loss && reduction != FL_REDUCTION_NONE;
    const size_t need = ws_used ? fl__ew_workspace_bytes(n) : 0;
    if (ws_used) {
        FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need,
                                     focal ? "fl_sigmoid_focal_workspace_size()"
                                           : "fl_bce_with_logits_workspace_size()"));
    }

    /* aliasing: dlogits == logits only */
    const size_t nred = reduction == FL_REDUCTION_NONE ? (size_t)n : 1u;
    const fl__range r_x = fl__mkrange(logits, (size_t)n * es);
    const fl__range r_y = fl__mkrange(targets, (size_t)n * es);
    const fl__range r_dx = fl__mkrange(has_grad ? dlogits : NULL, (size_t)n * es);
    const fl__range r_l = fl__mkrange(has_loss ? loss : NULL, nred * 4u);
    const fl__range r_g = fl__mkrange(has_grad ? grad_loss : NULL, nred * 4u);
    const fl__range r_w = fl__mkrange(weight, focal ? 0 : (size_t)C * 4u);
    const fl__range r_pw = fl__mkrange(pos_weight, focal ? 0 : (size_t)C * 4u);
    const fl__range r_ws = fl__mkrange(ws_used ? workspace : NULL, need);
    if (fl__overlap(r_dx, r_x) && dlogits != logits)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dlogits (%p) overlaps logits (%p); only dlogits == logits (in place) is allowed", fn,
                        dlogits, logits);
    if (fl__overlap(r_dx, r_y) || fl__overlap(r_dx, r_l) || fl__overlap(r_dx, r_g) || fl__overlap(r_dx, r_w) ||
        fl__overlap(r_dx, r_pw) || fl__overlap(r_dx, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits (%p) overlaps another argument", fn, dlogits);
    if (fl__overlap(r_l, r_x) || fl__overlap(r_l, r_y) || fl__overlap(r_l, r_g) || fl__overlap(r_l, r_w) ||
        fl__overlap(r_l, r_pw) || fl__overlap(r_l, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss (%p) overlaps another argument", fn, (const void*)loss);
    if (fl__overlap(r_ws, r_x) || fl__overlap(r_ws, r_y) || fl__overlap(r_ws, r_g) || fl__overlap(r_ws, r_w) ||
        fl__overlap(r_ws, r_pw))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) overlaps another argument", fn, workspace);

    p->op = op;
    p->reduction = reduction;
    p->alpha = alpha;
    p->gamma = gamma;
    p->use_alpha = focal && alpha >= 0.0f;
    p->gamma_kind = gamma == 0.0f ? 0 : gamma == 1.0f ? 1 : gamma == 2.0f ? 2 : 3;
    p->weight = focal ? NULL : weight;
    p->pos_weight = focal ? NULL : pos_weight;
    p->n = n;
    p->C = C;
    return FL_OK;
}
