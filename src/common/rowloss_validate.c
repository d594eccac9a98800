/* rowloss_validate.c — argument checks of the row losses with class targets and no other input:
 * the Taylor softmax cross-entropy (include/fusedloss.h section 14, both backends) and the
 * large-margin softmax cross-entropy (section 15, CPU); their workspace size (src/internal.h) and
 * the public size queries fl_taylor_ce_workspace_size() / fl_large_margin_ce_workspace_size().
 *
 * Every message names the public function and the offending value. Nothing here dereferences a
 * caller pointer except *opts (the CPU backend range-checks the targets; the CUDA kernel flags them).
 * SPDX-License-Identifier: MIT
 */
#include <stdint.h>
#include <string.h>

#include "../internal.h"

size_t fl__taylor_workspace_bytes(int64_t N, fl_reduction reduction) {
    if (reduction == FL_REDUCTION_NONE) return 0;
    if (N < 0) N = 0;
    if ((uint64_t)N > ((uint64_t)SIZE_MAX - FL__TAYLOR_WS_HEAD - 512u) / 4u) return SIZE_MAX;   /* saturate */
    return FL__TAYLOR_WS_HEAD + (((size_t)N * 4u + 255u) & ~(size_t)255u);
}

static fl_status check_reduction(const char* fn, fl_reduction r) {
    if (r != FL_REDUCTION_NONE && r != FL_REDUCTION_MEAN && r != FL_REDUCTION_SUM)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: unknown opts->reduction (%d); use FL_REDUCTION_NONE (0), FL_REDUCTION_MEAN (1) or "
                        "FL_REDUCTION_SUM (2)", fn, (int)r);
    return FL_OK;
}

static int finitef_(float v) { return v == v && v - v == 0.0f; }

static fl_status check_lm_opts(const char* fn, const fl_large_margin_options* o) {
    if (o->struct_size != sizeof(fl_large_margin_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_large_margin_options) (%zu); initialise with "
                        "FL_LARGE_MARGIN_OPTIONS_INIT", fn, o->struct_size, sizeof(fl_large_margin_options));
    if (!finitef_(o->lambda) || !(o->lambda >= 0.0f))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->lambda (%g) must be finite and >= 0", fn,
                        (double)o->lambda);
    return check_reduction(fn, o->reduction);
}

static fl_status check_opts(const char* fn, const fl_taylor_options* o) {
    if (o->struct_size != sizeof(fl_taylor_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_taylor_options) (%zu); initialise with "
                        "FL_TAYLOR_OPTIONS_INIT", fn, o->struct_size, sizeof(fl_taylor_options));
    if (o->order != 2 && o->order != 4)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->order (%d) must be 2 or 4", fn, (int)o->order);
    return check_reduction(fn, o->reduction);
}

static fl_status check_query(const char* fn, size_t* bytes, int64_t N, int64_t C, fl_dtype dtype) {
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    if (fl__dtype_size(dtype) == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    return FL_OK;
}

static fl_status query_bytes(const char* fn, size_t* bytes, int64_t N, fl_reduction reduction) {
    const size_t b = fl__taylor_workspace_bytes(N, reduction);
    if (b == SIZE_MAX)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) rows overflows size_t", fn, (long long)N);
    *bytes = b;
    return FL_OK;
}

fl_status fl_taylor_ce_workspace_size(size_t* bytes, int64_t N, int64_t C, fl_dtype dtype,
                                      const fl_taylor_options* opts) {
    static const char* fn = "fl_taylor_ce_workspace_size";
    static const fl_taylor_options defaults = FL_TAYLOR_OPTIONS_INIT;
    fl__clear_error();
    FL_CHECK(check_query(fn, bytes, N, C, dtype));
    const fl_taylor_options* o = opts ? opts : &defaults;
    FL_CHECK(check_opts(fn, o));
    return query_bytes(fn, bytes, N, o->reduction);
}

fl_status fl_large_margin_ce_workspace_size(size_t* bytes, int64_t N, int64_t C, fl_dtype dtype,
                                            const fl_large_margin_options* opts) {
    static const char* fn = "fl_large_margin_ce_workspace_size";
    static const fl_large_margin_options defaults = FL_LARGE_MARGIN_OPTIONS_INIT;
    fl__clear_error();
    FL_CHECK(check_query(fn, bytes, N, C, dtype));
    if (C < 2) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 2", fn, (long long)C);
    const fl_large_margin_options* o = opts ? opts : &defaults;
    FL_CHECK(check_lm_opts(fn, o));
    return query_bytes(fn, bytes, N, o->reduction);
}

/* the checks after the options: sizes, pointers, alignment, workspace, aliasing */
static fl_status rows_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dlogits,
                               const void* logits, int64_t ld, const void* targets, fl_index_dtype index_dtype,
                               const float* grad_loss, float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                               fl_reduction reduction, const void* workspace, size_t workspace_bytes,
                               const char* query) {
    const int fused = pass == FL__PASS_FUSED;
    if (ld < C) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld (%lld) < C (%lld)", fn, (long long)ld, (long long)C);
    FL_CHECK(fl__check_types_extent(fn, N, ld, dtype, index_dtype));
    const size_t es = fl__dtype_size(dtype), is = fl__index_size(index_dtype);
    if (fused && !finitef_(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) must be finite", fn, (double)grad_scale);

    if (!fused && !loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (N > 0 && !logits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
    if (N > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);
    if (fused && N > 0 && !dlogits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits is NULL", fn);
    if (!fused) { dlogits = NULL; grad_loss = NULL; }

    {
        const void* ps[5] = {logits, dlogits, targets, loss, grad_loss};
        const char* names[5] = {"logits", "dlogits", "targets", "loss", "grad_loss"};
        const size_t al[5] = {es, es, is, 4u, 4u};
        for (int k = 0; k < 5; k++)
            if (ps[k] && ((uintptr_t)ps[k] % al[k]))
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu)",
                                fn, names[k], ps[k], al[k]);
    }

    const size_t need = fl__taylor_workspace_bytes(N, reduction);
    if (need == SIZE_MAX)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) rows overflows size_t", fn, (long long)N);
    if (need > 0)
        FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, query));
    else
        workspace = NULL;

    /* aliasing: dlogits == logits (in place) is the only overlap allowed */
    const size_t nred = reduction == FL_REDUCTION_NONE ? (size_t)N : 1u;
    const size_t mat = N > 0 ? ((size_t)(N - 1) * (size_t)ld + (size_t)C) * es : 0;
    const fl__range r_x = fl__mkrange(logits, mat);
    const fl__range r_dx = fl__mkrange(dlogits, mat);
    const fl__range r_t = fl__mkrange(targets, (size_t)N * is);
    const fl__range r_g = fl__mkrange(grad_loss, nred * 4u);
    const fl__range r_l = fl__mkrange(loss, nred * 4u);
    const fl__range r_ws = fl__mkrange(workspace, need);
    if (dlogits && dlogits != logits && fl__overlap(r_dx, r_x))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dlogits (%p) partially overlaps logits (%p); only dlogits == logits (in place) is "
                        "allowed", fn, dlogits, logits);
    {
        const fl__range others[4] = {r_t, r_g, r_l, r_ws};
        const char* names[4] = {"targets", "grad_loss", "loss", "workspace"};
        const int k = fl__first_overlap(r_dx, others, 4);
        if (k >= 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits (%p) overlaps %s", fn, dlogits, names[k]);
    }
    {
        const fl__range others[4] = {r_x, r_t, r_g, r_ws};
        const char* names[4] = {"logits", "targets", "grad_loss", "workspace"};
        const int k = fl__first_overlap(r_l, others, 4);
        if (k >= 0)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss (%p) overlaps %s", fn, (const void*)loss, names[k]);
    }
    {
        const fl__range others[3] = {r_x, r_t, r_g};
        const char* names[3] = {"logits", "targets", "grad_loss"};
        const int k = fl__first_overlap(r_ws, others, 3);
        if (k >= 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) overlaps %s", fn, workspace, names[k]);
    }

    return FL_OK;
}

/* N and C first (every later size depends on them); min_C: 1 (Taylor) or 2 (large margin) */
static fl_status check_nc(const char* fn, int64_t N, int64_t C, int64_t min_C) {
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < min_C)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < %lld", fn, (long long)C, (long long)min_C);
    return FL_OK;
}

fl_status fl__taylor_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dlogits,
                              const void* logits, int64_t ld, const void* targets, fl_index_dtype index_dtype,
                              const float* grad_loss, float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                              const fl_taylor_options* opts, const void* workspace, size_t workspace_bytes,
                              fl__taylor_params* p) {
    static const fl_taylor_options defaults = FL_TAYLOR_OPTIONS_INIT;
    memset(p, 0, sizeof(*p));
    FL_CHECK(check_nc(fn, N, C, 1));
    const fl_taylor_options* o = opts ? opts : &defaults;
    FL_CHECK(check_opts(fn, o));
    FL_CHECK(rows_validate(fn, pass, is_cuda, loss, dlogits, logits, ld, targets, index_dtype, grad_loss, grad_scale,
                           N, C, dtype, o->reduction, workspace, workspace_bytes, "fl_taylor_ce_workspace_size()"));
    p->N = N;
    p->C = C;
    p->ld = ld;
    p->dtype = dtype;
    p->index_dtype = index_dtype;
    p->order = o->order;
    p->ignore_index = o->ignore_index;
    p->reduction = o->reduction;
    p->error_flag = o->error_flag;
    return FL_OK;
}

fl_status fl__large_margin_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dlogits,
                                    const void* logits, int64_t ld, const void* targets, fl_index_dtype index_dtype,
                                    const float* grad_loss, float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                    const fl_large_margin_options* opts, const void* workspace,
                                    size_t workspace_bytes, fl__large_margin_params* p) {
    static const fl_large_margin_options defaults = FL_LARGE_MARGIN_OPTIONS_INIT;
    memset(p, 0, sizeof(*p));
    FL_CHECK(check_nc(fn, N, C, 2));
    const fl_large_margin_options* o = opts ? opts : &defaults;
    FL_CHECK(check_lm_opts(fn, o));
    FL_CHECK(rows_validate(fn, pass, is_cuda, loss, dlogits, logits, ld, targets, index_dtype, grad_loss, grad_scale,
                           N, C, dtype, o->reduction, workspace, workspace_bytes, "fl_large_margin_ce_workspace_size()"));
    p->N = N;
    p->C = C;
    p->ld = ld;
    p->dtype = dtype;
    p->index_dtype = index_dtype;
    p->lambda = o->lambda;
    p->ignore_index = o->ignore_index;
    p->reduction = o->reduction;
    p->error_flag = o->error_flag;
    return FL_OK;
}
