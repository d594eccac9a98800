/* vp_validate.c — argument checks of the vocab-parallel cross-entropy steps (header section 8),
 * shared by the CPU backend (src/cpu/vocab_parallel.c) and the CUDA steps to come, so the CPU
 * tests in CI exercise the checks the CUDA path will use.
 *
 * Every message names the public function and the offending value; an aliasing message names
 * both buffers. The options and the class weights go through the cross-entropy validator's own
 * pieces (fl__ce_resolve_options, fl__ce_check_weights in src/common/validate.c). Nothing here
 * dereferences a caller pointer except, on the CPU, the class weights. */
#include <math.h>
#include <stdint.h>

#include "../internal.h"

size_t fl__vp_combine_workspace_bytes(int64_t N, int64_t V) {
    /* step 3 reads no logits: the smallest section-5 answer (16-bit dtypes) for N rows, V classes
     * is enough, so the answer for any dtype the caller queries is accepted */
    return fl__ce_workspace_bytes(N, V, FL_DTYPE_F16);
}

/* One input buffer that an output or the workspace must not overlap. */
typedef struct {
    const char* name;
    const void* p;
    size_t      bytes;
} vp_buf;

static fl_status check_disjoint(const char* fn, vp_buf out, const vp_buf* in, int n) {
    const fl__range ro = fl__mkrange(out.p, out.bytes);
    for (int k = 0; k < n; k++)
        if (fl__overlap(ro, fl__mkrange(in[k].p, in[k].bytes)))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p, %zu bytes) overlaps %s (%p, %zu bytes)", fn,
                            out.name, out.p, out.bytes, in[k].name, in[k].p, in[k].bytes);
    return FL_OK;
}


/* Section 5's per-row target probability output is not one of the steps' outputs (the per-class
 * logit offsets are: the GLOBAL [V] array, as the class weights). */
static fl_status no_v2_options(const char* fn, const fl__ce_params* p) {
    if (p->target_prob)
        return fl__fail(FL_ERR_UNSUPPORTED, "%s: opts->target_prob is not supported by the vocab-parallel steps", fn);
    return FL_OK;
}

fl_status fl__vp_validate_shard(const char* fn, int backward, int is_cuda, const float* stats, const void* dlogits,
                                const void* logits, const void* targets, const float* lse, const float* grad_loss,
                                float grad_scale, int64_t N, int64_t V_local, int64_t ld, int64_t vocab_start,
                                int64_t V, fl_dtype dtype, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                const void* workspace, size_t workspace_bytes, fl__ce_params* p) {
    /* sizes first: every byte-range computation below depends on them */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (V_local < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V_local (%lld) < 1", fn, (long long)V_local);
    if (ld < V_local)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld (%lld) < V_local (%lld)", fn, (long long)ld,
                        (long long)V_local);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (vocab_start < 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: vocab_start (%lld) < 0", fn, (long long)vocab_start);
    if (vocab_start > V - V_local)   /* vocab_start + V_local > V, without the overflow */
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: vocab_start (%lld) + V_local (%lld) > V (%lld): the shard is not inside the vocabulary",
                        fn, (long long)vocab_start, (long long)V_local, (long long)V);
    FL_CHECK(fl__check_types_extent(fn, N, ld, dtype, index_dtype));
    const size_t esize = fl__dtype_size(dtype), isize = fl__index_size(index_dtype);

    /* options */
    FL_CHECK(fl__ce_resolve_options(fn, "opts", opts, p));
    FL_CHECK(no_v2_options(fn, p));
    if (backward && !isfinite(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) is not finite", fn, (double)grad_scale);

    /* required pointers */
    if (!backward && N > 0 && !stats) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: stats is NULL", fn);
    if (backward && N > 0 && !dlogits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dlogits is NULL", fn);
    if (N > 0 && !logits) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: logits is NULL", fn);
    if (N > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);
    if (backward && N > 0 && !lse)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lse is NULL (backward needs the global lse of step 3)", fn);

    /* class weights: the GLOBAL [V] array; values checkable only where they are host memory */
    FL_CHECK(fl__ce_check_weights(fn, "weight", p->weight, V, is_cuda));
    FL_CHECK(fl__ce_check_offset(fn, "logit_offset", p->logit_offset, V, is_cuda));

    /* workspace: section 5's for N rows of V_local classes */
    const size_t need = fl__ce_workspace_bytes(N, V_local, dtype);
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, NULL));

    /* aliasing */
    const size_t mat_bytes = N > 0 ? ((size_t)(N - 1) * (size_t)ld + (size_t)V_local) * esize : 0;
    const size_t ngrad = (p->reduction == FL_REDUCTION_NONE) ? (size_t)N : 1u;
    const vp_buf b_logits = {"logits", logits, mat_bytes};
    const vp_buf b_targets = {"targets", targets, (size_t)N * isize};
    const vp_buf b_weight = {"weight", p->weight, (size_t)V * sizeof(float)};
    const vp_buf b_offset = {"logit_offset", p->logit_offset, (size_t)V * sizeof(float)};
    const vp_buf b_ws = {"workspace", workspace, need};
    if (!backward) {
        const vp_buf b_stats = {"stats", stats, (size_t)N * 4u * sizeof(float)};
        const vp_buf in[] = {b_logits, b_targets, b_weight, b_offset, b_ws};
        FL_CHECK(check_disjoint(fn, b_stats, in, 5));
        FL_CHECK(check_disjoint(fn, b_ws, in, 4));
        return FL_OK;
    }
    const vp_buf b_lse = {"lse", lse, (size_t)N * sizeof(float)};
    const vp_buf b_gl = {"grad_loss", grad_loss, ngrad * sizeof(float)};
    if (dlogits && dlogits != logits && fl__overlap(fl__mkrange(dlogits, mat_bytes), fl__mkrange(logits, mat_bytes)))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dlogits (%p) partially overlaps logits (%p); only dlogits == logits (in place) is allowed",
                        fn, dlogits, logits);
    const vp_buf b_dl = {"dlogits", dlogits, mat_bytes};
    const vp_buf in[] = {b_targets, b_lse, b_gl, b_weight, b_offset, b_ws, b_logits};
    FL_CHECK(check_disjoint(fn, b_dl, in, 6));      /* logits: the in-place rule above */
    FL_CHECK(check_disjoint(fn, b_ws, in, 5));
    FL_CHECK(check_disjoint(fn, b_ws, &b_logits, 1));
    return FL_OK;
}

fl_status fl__vp_validate_combine(const char* fn, int is_cuda, const float* loss, const float* lse,
                                  const float* gathered, int k, const void* targets, int64_t N, int64_t V,
                                  fl_index_dtype index_dtype, const fl_ce_options* opts, const void* workspace,
                                  size_t workspace_bytes, fl__ce_params* p) {
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (k < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: k (%d) < 1 (the number of ranks)", fn, k);
    const size_t isize = fl__index_size(index_dtype);
    if (isize == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown index_dtype (%d)", fn, (int)index_dtype);
    /* gathered holds k*N*4 floats: guard the byte count */
    if (N > 0 && (uint64_t)N > (uint64_t)SIZE_MAX / 16u / (uint64_t)k)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: k*N*16 bytes of gathered (%d*%lld*16) overflows", fn, k,
                        (long long)N);

    FL_CHECK(fl__ce_resolve_options(fn, "opts", opts, p));
    FL_CHECK(no_v2_options(fn, p));

    if (!loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (N > 0 && !lse) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lse is NULL (required: step 4 needs it)", fn);
    if (N > 0 && !gathered) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: gathered is NULL", fn);
    if (N > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);

    FL_CHECK(fl__ce_check_weights(fn, "weight", p->weight, V, is_cuda));
    FL_CHECK(fl__ce_check_offset(fn, "logit_offset", p->logit_offset, V, is_cuda));

    const size_t need = fl__vp_combine_workspace_bytes(N, V);
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, NULL));

    const size_t nloss = (p->reduction == FL_REDUCTION_NONE) ? (size_t)N : 1u;
    const vp_buf b_loss = {"loss", loss, nloss * sizeof(float)};
    const vp_buf b_lse = {"lse", lse, (size_t)N * sizeof(float)};
    const vp_buf b_gathered = {"gathered", gathered, (size_t)k * (size_t)N * 4u * sizeof(float)};
    const vp_buf b_targets = {"targets", targets, (size_t)N * isize};
    const vp_buf b_weight = {"weight", p->weight, (size_t)V * sizeof(float)};
    const vp_buf b_ws = {"workspace", workspace, need};
    const vp_buf in[] = {b_gathered, b_targets, b_weight, b_ws, b_lse};
    FL_CHECK(check_disjoint(fn, b_loss, in, 5));
    FL_CHECK(check_disjoint(fn, b_lse, in, 4));
    FL_CHECK(check_disjoint(fn, b_ws, in, 3));
    return FL_OK;
}
