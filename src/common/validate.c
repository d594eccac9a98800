/* validate.c — argument checks shared by the CPU and CUDA cross-entropy backends.
 *
 * Every message names the public function and the offending value (NCCL ArgsCheck style).
 * Nothing here dereferences a caller pointer except, on the CPU, the class weights. */
#include <math.h>
#include <stdint.h>

#include "../internal.h"

size_t fl__dtype_size(fl_dtype dtype) {
    switch (dtype) {
        case FL_DTYPE_F32: return 4;
        case FL_DTYPE_F16: return 2;
        case FL_DTYPE_BF16: return 2;
    }
    return 0;
}

size_t fl__index_size(fl_index_dtype dtype) {
    switch (dtype) {
        case FL_INDEX_I32: return 4;
        case FL_INDEX_I64: return 8;
    }
    return 0;
}

static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

int64_t fl__ce_chunks(int64_t V, size_t esize) {
    /* an upper bound for choose_config() in src/cuda/cross_entropy.cu: rows of more than 512
     * 16-byte vectors are cut into chunks of T threads x 8 vectors, T >= 64 */
    const int64_t nv = V / (int64_t)(16u / esize) + 1;
    return nv <= 512 ? 1 : (nv + 511) / 512;
}

size_t fl__ce_workspace_bytes(int64_t N, int64_t V, fl_dtype dtype) {
    const size_t n = (size_t)(N > 0 ? N : 0);
    const size_t es = fl__dtype_size(dtype) ? fl__dtype_size(dtype) : 4u;
    /* header | per-row partial losses (16 B) | per-(row, chunk) statistics (float4) */
    return 256u + align256(n * 16u) + align256(n * (size_t)fl__ce_chunks(V > 0 ? V : 1, es) * 16u);
}

fl_status fl_cross_entropy_workspace_size(size_t* bytes, int64_t N, int64_t V, fl_dtype dtype,
                                          const fl_ce_options* opts) {
    static const char* fn = "fl_cross_entropy_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (fl__dtype_size(dtype) == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (opts && !fl__ce_options_size_ok(opts->struct_size))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->struct_size (%zu) != sizeof(fl_ce_options) (%zu)",
                        fn, opts->struct_size, sizeof(fl_ce_options));
    *bytes = fl__ce_workspace_bytes(N, V, dtype);
    return FL_OK;
}

/* Byte range [lo, hi) of a buffer; empty when p is NULL or n == 0 (fl__range: src/internal.h). */
typedef fl__range range;

fl__range fl__mkrange(const void* p, size_t n) {
    range r;
    r.lo = (uintptr_t)p;
    r.hi = p ? r.lo + n : r.lo;
    return r;
}

int fl__overlap(fl__range a, fl__range b) {
    if (a.lo == a.hi || b.lo == b.hi) return 0;
    return a.lo < b.hi && b.lo < a.hi;
}

int fl__first_overlap(fl__range a, const fl__range* others, int n) {
    for (int k = 0; k < n; k++)
        if (fl__overlap(a, others[k])) return k;
    return -1;
}

fl_status fl__check_ncd(const char* fn, int64_t N, int64_t C, int64_t d, int64_t ld) {
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    if (d < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: d (%lld) < 1", fn, (long long)d);
    if (C > INT64_MAX / d)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C*d (%lld*%lld) overflows", fn, (long long)C, (long long)d);
    if (ld < C * d)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld (%lld) < C*d (%lld*%lld = %lld)", fn, (long long)ld,
                        (long long)C, (long long)d, (long long)(C * d));
    return FL_OK;
}

int fl__ce_options_size_ok(size_t struct_size) {
    return struct_size == sizeof(fl_ce_options) || struct_size == FL_CE_OPTIONS_V1_SIZE;
}

/* The options part of every cross-entropy validation (fl__ce_validate and the linear
 * cross-entropy's fl__lce_validate): field checks, then *p filled. `name` is how the caller's
 * argument is called in messages ("opts", "ce_opts"). opts NULL = FL_CE_OPTIONS_INIT. */
fl_status fl__ce_resolve_options(const char* fn, const char* name, const fl_ce_options* opts,
                                 fl__ce_params* p) {
    static const fl_ce_options defaults = FL_CE_OPTIONS_INIT;
    const fl_ce_options* o = opts ? opts : &defaults;
    if (!fl__ce_options_size_ok(o->struct_size))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: %s->struct_size (%zu) != sizeof(fl_ce_options) (%zu); initialise with FL_CE_OPTIONS_INIT",
                        fn, name, o->struct_size, sizeof(fl_ce_options));
    const int v2 = o->struct_size == sizeof(fl_ce_options);  /* else version 1: no fields after error_flag */
    if (o->reduction != FL_REDUCTION_NONE && o->reduction != FL_REDUCTION_MEAN && o->reduction != FL_REDUCTION_SUM)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown reduction (%d)", fn, (int)o->reduction);
    if (!(o->label_smoothing >= 0.0f && o->label_smoothing <= 1.0f))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: label_smoothing (%g) not in [0, 1]", fn,
                        (double)o->label_smoothing);
    if (!(o->z_loss >= 0.0f) || isinf(o->z_loss))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: z_loss (%g) must be finite and >= 0", fn, (double)o->z_loss);
    if (!(o->softcap >= 0.0f) || isinf(o->softcap))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: softcap (%g) must be finite and >= 0 (0 = off)", fn,
                        (double)o->softcap);
    if (!isfinite(o->logit_scale) || o->logit_scale == 0.0f)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logit_scale (%g) must be finite and nonzero", fn,
                        (double)o->logit_scale);
    p->ignore_index = o->ignore_index;
    p->reduction = o->reduction;
    p->label_smoothing = o->label_smoothing;
    p->weight = o->weight;
    p->z_loss = o->z_loss;
    p->softcap = o->softcap;
    p->logit_scale = o->logit_scale;
    p->error_flag = o->error_flag;
    p->logit_offset = v2 ? o->logit_offset : NULL;
    p->target_prob = v2 ? o->target_prob : NULL;
    return FL_OK;
}

fl_status fl__ce_check_offset(const char* fn, const char* name, const float* offset, int64_t V, int is_cuda) {
    if (!offset || is_cuda) return FL_OK;   /* device memory: not readable here */
    for (int64_t j = 0; j < V; j++)
        if (!isfinite(offset[j]))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s[%lld] (%g) must be finite", fn, name, (long long)j,
                            (double)offset[j]);
    return FL_OK;
}

fl_status fl__ce_check_weights(const char* fn, const char* name, const float* weight, int64_t V, int is_cuda) {
    if (!weight || is_cuda) return FL_OK;   /* device memory: not readable here */
    for (int64_t j = 0; j < V; j++) {
        float w = weight[j];
        if (!(w >= 0.0f) || isinf(w))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s[%lld] (%g) must be finite and >= 0", fn,
                            name, (long long)j, (double)w);
    }
    return FL_OK;
}

/* workspace of `need` bytes: enough (checked first), non-NULL, and 256-byte aligned for CUDA;
 * hint names the size query in the message ("; see hint") or is NULL */
fl_status fl__check_workspace(const char* fn, int is_cuda, const void* workspace, size_t workspace_bytes,
                              size_t need, const char* hint) {
    if (workspace_bytes < need)
        return fl__fail(FL_ERR_INSUFFICIENT_WORKSPACE, "%s: workspace_bytes (%zu) < required (%zu)%s%s", fn,
                        workspace_bytes, need, hint ? "; see " : "", hint ? hint : "");
    if (!workspace) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace is NULL (need %zu bytes)", fn, need);
    if (is_cuda && ((uintptr_t)workspace & 255u))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) is not 256-byte aligned", fn, workspace);
    return FL_OK;
}

/* dtype and index dtype known, and N rows of stride ld addressable in 64 bits */
fl_status fl__check_types_extent(const char* fn, int64_t N, int64_t ld, fl_dtype dtype, fl_index_dtype index_dtype) {
    const size_t esize = fl__dtype_size(dtype);
    if (esize == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (fl__index_size(index_dtype) == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown index_dtype (%d)", fn, (int)index_dtype);
    /* N*ld elements must be addressable: guard the 64-bit products used everywhere */
    if (N > 0 && (uint64_t)ld > (uint64_t)INT64_MAX / (uint64_t)N / esize)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N*ld (%lld*%lld) overflows", fn, (long long)N,
                        (long long)ld);
    return FL_OK;
}

fl_status fl__ce_validate(const char* fn, fl__pass pass, int is_cuda,
                          const float* loss, const float* lse, const void* dlogits,
                          const void* logits, const void* targets, const float* grad_loss,
                          int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                          fl_index_dtype index_dtype, const fl_ce_options* opts,
                          const void* workspace, size_t workspace_bytes, fl__ce_params* p) {
    const int has_loss = pass != FL__PASS_BACKWARD;
    const int has_grad = pass != FL__PASS_FORWARD;

    /* sizes first: every byte-range computation below depends on them */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (ld < V)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld (%lld) < V (%lld)", fn, (long long)ld, (long long)V);
    FL_CHECK(fl__check_types_extent(fn, N, ld, dtype, index_dtype));
    const size_t esize = fl__dtype_size(dtype), isize = fl__index_size(index_dtype);

    /* options */
    FL_CHECK(fl__ce_resolve_options(fn, "opts", opts, p));

    /* required pointers */
    if (N > 0 && !logits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
    if (N > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);
    if (has_loss && !loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (has_grad && N > 0 && !dlogits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits is NULL", fn);
    if (pass == FL__PASS_BACKWARD && N > 0 && !lse)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lse is NULL (backward needs the lse saved by forward)", fn);

    /* class weights: values checkable only where they are host memory */
    FL_CHECK(fl__ce_check_weights(fn, "weight", p->weight, V, is_cuda));
    FL_CHECK(fl__ce_check_offset(fn, "logit_offset", p->logit_offset, V, is_cuda));

    /* workspace */
    const size_t need = fl__ce_workspace_bytes(N, V, dtype);
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, NULL));

    /* aliasing */
    const size_t nloss = (p->reduction == FL_REDUCTION_NONE) ? (size_t)N : 1u;
    const size_t mat_bytes = N > 0 ? ((size_t)(N - 1) * (size_t)ld + (size_t)V) * esize : 0;
    const size_t ngrad = (p->reduction == FL_REDUCTION_NONE) ? (size_t)N : 1u;
    range r_logits = fl__mkrange(logits, mat_bytes);
    range r_targets = fl__mkrange(targets, (size_t)N * isize);
    range r_loss = fl__mkrange(has_loss ? loss : NULL, nloss * sizeof(float));
    range r_lse = fl__mkrange(lse, (size_t)N * sizeof(float));
    range r_dl = fl__mkrange(has_grad ? dlogits : NULL, mat_bytes);
    range r_gl = fl__mkrange(has_grad ? grad_loss : NULL, ngrad * sizeof(float));
    range r_ws = fl__mkrange(workspace, need);
    range r_w = fl__mkrange(p->weight, (size_t)V * sizeof(float));
    range r_o = fl__mkrange(p->logit_offset, (size_t)V * sizeof(float));
    range r_tp = fl__mkrange(has_loss ? p->target_prob : NULL, (size_t)N * sizeof(float));

    /* the second output of forward / fused: overlaps nothing (the offset, like the weights, is an input
     * that may alias the other inputs) */
    {
        const range others[] = {r_logits, r_targets, r_loss, r_lse, r_dl, r_gl, r_w, r_o, r_ws};
        if (fl__first_overlap(r_tp, others, (int)(sizeof others / sizeof others[0])) >= 0)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->target_prob (%p) overlaps another argument", fn,
                            (const void*)p->target_prob);
    }
    if (fl__overlap(r_o, r_dl) || fl__overlap(r_o, r_loss) || fl__overlap(r_o, r_lse) || fl__overlap(r_o, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->logit_offset (%p) overlaps an output or the workspace",
                        fn, (const void*)p->logit_offset);

    if (fl__overlap(r_loss, r_logits) || fl__overlap(r_loss, r_targets) || fl__overlap(r_loss, r_lse) ||
        fl__overlap(r_loss, r_dl) || fl__overlap(r_loss, r_gl) || fl__overlap(r_loss, r_w) || fl__overlap(r_loss, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss (%p) overlaps another argument", fn, (const void*)loss);
    if (pass != FL__PASS_BACKWARD) {  /* lse is an output */
        if (fl__overlap(r_lse, r_logits) || fl__overlap(r_lse, r_targets) || fl__overlap(r_lse, r_dl) ||
            fl__overlap(r_lse, r_gl) || fl__overlap(r_lse, r_w) || fl__overlap(r_lse, r_ws))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lse (%p) overlaps another argument", fn, (const void*)lse);
    }
    if (has_grad && dlogits) {
        if (dlogits != logits && fl__overlap(r_dl, r_logits))
            return fl__fail(FL_ERR_INVALID_ARGUMENT,
                            "%s: dlogits (%p) partially overlaps logits (%p); only dlogits == logits (in place) is allowed",
                            fn, dlogits, logits);
        if (fl__overlap(r_dl, r_targets) || fl__overlap(r_dl, r_lse) || fl__overlap(r_dl, r_gl) || fl__overlap(r_dl, r_w) ||
            fl__overlap(r_dl, r_ws))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits (%p) overlaps another argument", fn, dlogits);
    }
    if (fl__overlap(r_ws, r_logits) || fl__overlap(r_ws, r_targets) || fl__overlap(r_ws, r_lse) || fl__overlap(r_ws, r_gl) ||
        fl__overlap(r_ws, r_w))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) overlaps another argument", fn, workspace);

    return FL_OK;
}

fl_status fl__scale_validate(const char* fn, const void* x, int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                             const float* g) {
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (ld < V) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld (%lld) < V (%lld)", fn, (long long)ld, (long long)V);
    if (fl__dtype_size(dtype) == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (N > 0 && !x) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: x is NULL", fn);
    if (N > 0 && !g) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: g is NULL", fn);
    if (N > 0 && (uintptr_t)x % fl__dtype_size(dtype))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: x (%p) not aligned to the dtype size", fn, x);
    if (N > 0 && (N - 1) > (INT64_MAX - V) / ld)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: (N - 1) * ld + V overflows", fn);
    return FL_OK;
}
