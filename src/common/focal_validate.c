/* focal_validate.c — argument checks shared by the CPU and CUDA backends of the softmax focal loss
 * (include/fusedloss.h section 12: multi-class focal loss on logits [N, C, d]), the workspace
 * layout (src/internal.h, fl__focal_workspace_bytes) and the public size query
 * fl_softmax_focal_workspace_size().
 *
 * Every message names the public function and the offending value (NCCL ArgsCheck style).
 * Nothing here dereferences a caller pointer except *opts (alpha and the targets are device memory
 * for _cuda; the CPU backend range-checks the targets itself, alpha values are not checked).
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

/* work items per position: rows (d == 1) are cut into column chunks as distillation's rows; a
 * spatial position (d > 1) is one item (its C classes are strided by d, C is small in practice) */
static int64_t focal_chunks(int64_t C, int64_t d) {
    if (d != 1) return 1;
    return C > 0 ? (C + FL__DISTILL_CHUNK - 1) / FL__DISTILL_CHUNK : 1;
}

/* 1 when P = N d does not fit in an int64, or 256 + align256(4P) + align256(8P) + align256(32 P
 * chunks) does not fit in a size_t (N >= 0, C >= 1, d >= 1): per-position bytes (12 + 32 chunks)
 * times P, plus 4 x 255 bytes of rounding */
static int focal_ws_overflows(int64_t N, int64_t C, int64_t d) {
    if (N <= 0) return 0;
    if (d > INT64_MAX / N) return 1;
    const uint64_t P = (uint64_t)N * (uint64_t)d;
    const uint64_t per_pos = 12u + 32u * (uint64_t)focal_chunks(C, d);   /* chunks < 2^51: no overflow */
    return P > ((uint64_t)SIZE_MAX - 1024u) / per_pos;
}

size_t fl__focal_workspace_bytes(int64_t N, int64_t C, int64_t d) {
    if (focal_ws_overflows(N, C, d)) return SIZE_MAX;   /* saturate: no workspace can be that large */
    const size_t P = (size_t)(N > 0 ? N : 0) * (size_t)(d > 0 ? d : 1);
    const size_t chunks = (size_t)focal_chunks(C, d);
    /* header | fp32 per-position losses | two int32 counters per position (the CUDA position kernels of a
       MEAN: one label code byte a position) | 8 fp32 per (position, chunk) */
    return 256u + align256(4u * P) + align256(8u * P) + align256(32u * P * chunks);
}

fl_status fl_softmax_focal_workspace_size(size_t* bytes, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                          const fl_focal_options* opts) {
    static const char* fn = "fl_softmax_focal_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    if (d < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: d (%lld) < 1", fn, (long long)d);
    if (fl__dtype_size(dtype) == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (opts && opts->struct_size != sizeof(fl_focal_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_focal_options) (%zu); initialise with "
                        "FL_FOCAL_OPTIONS_INIT", fn, opts->struct_size, sizeof(fl_focal_options));
    if (focal_ws_overflows(N, C, d))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) x d (%lld) positions overflows size_t",
                        fn, (long long)N, (long long)d);
    *bytes = fl__focal_workspace_bytes(N, C, d);
    return FL_OK;
}

static int finitef_(float v) { return v == v && v - v == 0.0f; }

fl_status fl__focal_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dlogits,
                             const void* logits, int64_t ld, const void* targets, fl_index_dtype index_dtype,
                             const float* grad_loss, float grad_scale, int64_t N, int64_t C, int64_t d,
                             fl_dtype dtype, const fl_focal_options* opts, const void* workspace,
                             size_t workspace_bytes, fl__focal_params* p) {
    static const fl_focal_options defaults = FL_FOCAL_OPTIONS_INIT;
    const int fused = pass == FL__PASS_FUSED;
    memset(p, 0, sizeof(*p));

    /* sizes first: every byte-range computation below depends on them */
    FL_CHECK(fl__check_ncd(fn, N, C, d, ld));
    const int64_t Cd = C * d;   /* one sample's C classes x d positions */

    /* dtypes and 64-bit extents (N*ld elements; N*d <= N*ld then fits too) */
    FL_CHECK(fl__check_types_extent(fn, N, ld, dtype, index_dtype));
    const size_t es = fl__dtype_size(dtype), is = fl__index_size(index_dtype);
    if (focal_ws_overflows(N, C, d))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) x d (%lld) positions overflows size_t",
                        fn, (long long)N, (long long)d);
    const int64_t P = N * d;

    /* options (NULL = FL_FOCAL_OPTIONS_INIT) */
    const fl_focal_options* o = opts ? opts : &defaults;
    if (o->struct_size != sizeof(fl_focal_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_focal_options) (%zu); initialise with "
                        "FL_FOCAL_OPTIONS_INIT", fn, o->struct_size, sizeof(fl_focal_options));
    if (!finitef_(o->gamma) || !(o->gamma >= 0.0f))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->gamma (%g) must be finite and >= 0", fn,
                        (double)o->gamma);
    if (o->reduction != FL_REDUCTION_NONE && o->reduction != FL_REDUCTION_MEAN && o->reduction != FL_REDUCTION_SUM)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: unknown opts->reduction (%d); use FL_REDUCTION_NONE (0), FL_REDUCTION_MEAN (1) or "
                        "FL_REDUCTION_SUM (2)", fn, (int)o->reduction);
    if (fused && !finitef_(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) must be finite", fn, (double)grad_scale);

    /* required pointers */
    if (!fused && !loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (N > 0 && !logits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
    if (N > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);
    if (fused && N > 0 && !dlogits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits is NULL", fn);
    if (!fused) { dlogits = NULL; grad_loss = NULL; }   /* not used by the forward */
    const float* alpha = o->alpha;

    /* every pointer aligned to its element size (both backends: the CPU dereferences them) */
    {
        const void* ps[6] = {logits, dlogits, targets, loss, grad_loss, alpha};
        const char* names[6] = {"logits", "dlogits", "targets", "loss", "grad_loss", "opts->alpha"};
        const size_t al[6] = {es, es, is, 4u, 4u, 4u};
        for (int k = 0; k < 6; k++)
            if (ps[k] && ((uintptr_t)ps[k] % al[k]))
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu)",
                                fn, names[k], ps[k], al[k]);
    }

    /* workspace */
    const size_t need = fl__focal_workspace_bytes(N, C, d);
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need,
                                 "fl_softmax_focal_workspace_size()"));

    /* aliasing: dlogits == logits (in place) is the only overlap allowed; the workspace (clobbered)
     * counts as an output */
    const size_t nred = o->reduction == FL_REDUCTION_NONE ? (size_t)P : 1u;
    const size_t x_bytes = N > 0 ? ((size_t)(N - 1) * (size_t)ld + (size_t)Cd) * es : 0;
    const fl__range r_x = fl__mkrange(logits, x_bytes);
    const fl__range r_dx = fl__mkrange(dlogits, x_bytes);
    const fl__range r_t = fl__mkrange(targets, (size_t)P * is);
    const fl__range r_l = fl__mkrange(loss, nred * 4u);
    const fl__range r_g = fl__mkrange(grad_loss, nred * 4u);
    const fl__range r_a = fl__mkrange(alpha, (size_t)C * 4u);
    const fl__range r_ws = fl__mkrange(workspace, need);
    if (dlogits && dlogits != logits && fl__overlap(r_dx, r_x))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dlogits (%p) partially overlaps logits (%p); only dlogits == logits (in place) is "
                        "allowed", fn, dlogits, logits);
    {
        const fl__range others[5] = {r_t, r_a, r_g, r_l, r_ws};
        const char* names[5] = {"targets", "opts->alpha", "grad_loss", "loss", "workspace"};
        const int k = fl__first_overlap(r_dx, others, 5);
        if (k >= 0)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits (%p) overlaps %s", fn, dlogits, names[k]);
    }
    {
        const fl__range others[5] = {r_x, r_t, r_a, r_g, r_ws};
        const char* names[5] = {"logits", "targets", "opts->alpha", "grad_loss", "workspace"};
        const int k = fl__first_overlap(r_l, others, 5);
        if (k >= 0)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss (%p) overlaps %s", fn, (const void*)loss, names[k]);
    }
    {
        const fl__range others[4] = {r_x, r_t, r_a, r_g};
        const char* names[4] = {"logits", "targets", "opts->alpha", "grad_loss"};
        const int k = fl__first_overlap(r_ws, others, 4);
        if (k >= 0)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) overlaps %s", fn, workspace, names[k]);
    }

    /* resolved parameters */
    p->N = N;
    p->C = C;
    p->d = d;
    p->ld = ld;
    p->dtype = dtype;
    p->index_dtype = index_dtype;
    p->gamma = o->gamma;
    p->alpha = alpha;
    p->ignore_index = o->ignore_index;
    p->reduction = o->reduction;
    p->error_flag = o->error_flag;
    p->positions = P;
    p->chunks = focal_chunks(C, d);
    return FL_OK;
}
