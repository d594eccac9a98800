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

/* ---- the linear variant (weight rows sharded) ------------------------------------------------ */

static size_t al256(size_t x) { return (x + 255u) & ~(size_t)255u; }

fl_status fl__vp_lce_make_plan(const char* fn, int64_t N, int64_t H, int64_t V_local, int64_t V, fl_dtype dtype,
                               fl_dtype wgrad_dtype, int k, const fl_ce_options* ce_opts,
                               const fl_lce_options* lce_opts, fl__vp_lce_plan* plan) {
    if (V_local < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V_local (%lld) < 1", fn, (long long)V_local);
    if (V < V_local)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < V_local (%lld)", fn, (long long)V,
                        (long long)V_local);
    if (k < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: k (%d) < 1 (the number of ranks)", fn, k);
    FL_CHECK(fl__lce_make_plan_ex(fn, N, H, V_local, dtype, wgrad_dtype, ce_opts, lce_opts, 1, &plan->lce));
    /* the NCCL regions: 16 R + 16 k R + 4 N bytes (R = chunk_rows <= N or 1) */
    const uint64_t R = (uint64_t)plan->lce.chunk_rows, n = (uint64_t)N;
    if (R > (uint64_t)SIZE_MAX / 64u / (uint64_t)k || n > (uint64_t)SIZE_MAX / 64u ||
        plan->lce.total > SIZE_MAX / 2u)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: the workspace size overflows (N = %lld, k = %d)", fn,
                        (long long)N, k);
    size_t off = al256(plan->lce.total);
    plan->off_stats = off;
    off = al256(off + 16u * (size_t)R);
    plan->off_gathered = off;
    off = al256(off + 16u * (size_t)R * (size_t)k);
    plan->off_lse = off;
    off += 4u * (size_t)n;
    if (off < plan->off_lse)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: the workspace size overflows (N = %lld, k = %d)", fn,
                        (long long)N, k);
    plan->total = off;
    return FL_OK;
}

fl_status fl_vp_linear_ce_workspace_size(size_t* bytes, int64_t N, int64_t H, int64_t V_local, int64_t V,
                                         fl_dtype dtype, fl_dtype wgrad_dtype, int k, const fl_ce_options* ce_opts,
                                         const fl_lce_options* lce_opts) {
    static const char* fn = "fl_vp_linear_ce_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    fl__vp_lce_plan plan;
    FL_CHECK(fl__vp_lce_make_plan(fn, N, H, V_local, V, dtype, wgrad_dtype, k, ce_opts, lce_opts, &plan));
    *bytes = plan.total;
    return FL_OK;
}

fl_status fl__vp_lce_validate(const char* fn, int which, int is_cuda, const float* stats, const float* loss,
                              const float* lse, const void* dhidden, const void* dweight, const void* dbias,
                              const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight,
                              const void* bias, const void* targets, const float* grad_loss, float grad_scale,
                              int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
                              fl_dtype wgrad_dtype, fl_index_dtype index_dtype, int k, const fl_ce_options* ce_opts,
                              const fl_lce_options* lce_opts, const void* workspace, size_t workspace_bytes,
                              fl__ce_params* p, fl__vp_lce_plan* plan) {
    /* sizes first */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (H < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: H (%lld) < 1", fn, (long long)H);
    if (V_local < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V_local (%lld) < 1", fn, (long long)V_local);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (vocab_start < 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: vocab_start (%lld) < 0", fn, (long long)vocab_start);
    if (vocab_start > V - V_local)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: vocab_start (%lld) + V_local (%lld) > V (%lld): the shard is not inside the vocabulary",
                        fn, (long long)vocab_start, (long long)V_local, (long long)V);
    if (ld_hidden < H)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_hidden (%lld) < H (%lld)", fn, (long long)ld_hidden,
                        (long long)H);
    if (ld_weight < H)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_weight (%lld) < H (%lld)", fn, (long long)ld_weight,
                        (long long)H);
    const size_t esize = fl__dtype_size(dtype), wsize = fl__dtype_size(wgrad_dtype);
    const size_t isize = fl__index_size(index_dtype);
    if (esize == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (wsize == 0 || (wgrad_dtype != dtype && wgrad_dtype != FL_DTYPE_F32))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: wgrad_dtype (%d) must be dtype (%d) or FL_DTYPE_F32 (%d)", fn,
                        (int)wgrad_dtype, (int)dtype, (int)FL_DTYPE_F32);
    if (isize == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown index_dtype (%d)", fn, (int)index_dtype);
    FL_CHECK(fl__check_types_extent(fn, N, ld_hidden, dtype, index_dtype));
    FL_CHECK(fl__check_types_extent(fn, V_local, ld_weight, dtype, index_dtype));

    /* options (the plan checks the struct sizes and lce_opts). Step 1' forms no gradients: its plan
     * has no dweight accumulator (wgrad fp32), so any wgrad_dtype's size query answer suffices */
    FL_CHECK(fl__vp_lce_make_plan(fn, N, H, V_local, V, dtype, which == 0 ? FL_DTYPE_F32 : wgrad_dtype, k, ce_opts,
                                  lce_opts, plan));
    FL_CHECK(fl__ce_resolve_options(fn, "ce_opts", ce_opts, p));
    FL_CHECK(no_v2_options(fn, p));
    const int grads = which == 1 || (which == 2 && dhidden);
    if (grads && !isfinite(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) is not finite", fn, (double)grad_scale);

    /* required pointers */
    if (which == 0 && N > 0 && !stats) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: stats is NULL", fn);
    if (which == 2 && !loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (which == 1 && N > 0 && !lse)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lse is NULL (backward needs the global lse of step 3)", fn);
    if (which == 1 && N > 0 && !dhidden)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dhidden_partial is NULL (required)", fn);
    if (which == 2 && !dhidden && (dweight || dbias))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dhidden is NULL but %s is given (gradients in the forward need dhidden)", fn,
                        dweight ? "dweight" : "dbias");
    if (dbias && !bias) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dbias (%p) given without bias (NULL)", fn, dbias);
    if (N > 0 && !hidden) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: hidden is NULL", fn);
    if (N > 0 && !weight) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: weight is NULL", fn);
    if (N > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);

    /* the GLOBAL class weights and offsets */
    FL_CHECK(fl__ce_check_weights(fn, "ce_opts->weight", p->weight, V, is_cuda));
    FL_CHECK(fl__ce_check_offset(fn, "ce_opts->logit_offset", p->logit_offset, V, is_cuda));

    /* alignment (section 6's rules; the fp32 partial dhidden of step 4' 16-byte aligned on CUDA) */
    const size_t dhsize = which == 1 ? 4u : esize;
    {
        const struct { const char* name; const void* ptr; size_t align; } al[] = {
            {"hidden", hidden, esize}, {"weight", weight, esize}, {"bias", bias, esize},
            {which == 1 ? "dhidden_partial" : "dhidden", dhidden, dhsize}, {"dweight", dweight, wsize},
            {"dbias", dbias, wsize}, {"stats", stats, 4}, {"loss", loss, 4}, {"lse", lse, 4},
            {"targets", targets, isize}, {"grad_loss", grads ? grad_loss : NULL, 4},
            {"ce_opts->weight", p->weight, 4}, {"ce_opts->logit_offset", p->logit_offset, 4},
        };
        for (size_t q = 0; q < sizeof al / sizeof al[0]; q++)
            if ((uintptr_t)al[q].ptr % al[q].align)
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu bytes)",
                                fn, al[q].name, al[q].ptr, al[q].align);
        if (is_cuda) {
            for (size_t q = 0; q < 6; q++)
                if ((uintptr_t)al[q].ptr % 16u)
                    return fl__fail(FL_ERR_UNSUPPORTED, "%s: %s (%p) is not 16-byte aligned (CUDA needs it)", fn,
                                    al[q].name, al[q].ptr);
            if (((uint64_t)ld_hidden * esize) % 16u || ((uint64_t)ld_weight * esize) % 16u)
                return fl__fail(FL_ERR_UNSUPPORTED,
                                "%s: ld_hidden (%lld) and ld_weight (%lld) times %zu bytes must be multiples of 16 "
                                "bytes (CUDA needs it)",
                                fn, (long long)ld_hidden, (long long)ld_weight, esize);
            if (V > INT32_MAX - 64)
                return fl__fail(FL_ERR_UNSUPPORTED, "%s: V (%lld) above 2^31 - 64 is not supported on CUDA", fn,
                                (long long)V);
        }
    }

    /* workspace: steps 1' and 4' need section 6's part, the NCCL entry all of it */
    const size_t need = which == 2 ? plan->total : plan->lce.total;
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, "fl_vp_linear_ce_workspace_size"));

    /* aliasing: outputs vs each other and every input (extents fit: checked above / by the plan) */
    const size_t n = (size_t)N, h = (size_t)H, vl = (size_t)V_local;
    const size_t b_hidden = N > 0 ? ((n - 1u) * (size_t)ld_hidden + h) * esize : 0;
    const size_t b_weight = ((vl - 1u) * (size_t)ld_weight + h) * esize;
    const size_t nloss = p->reduction == FL_REDUCTION_NONE ? n : 1u;
    const vp_buf out[] = {
        {"stats", stats, n * 16u},
        {"loss", loss, nloss * 4u},
        {"lse", which == 1 ? NULL : lse, n * 4u},
        {which == 1 ? "dhidden_partial" : "dhidden", dhidden, n * h * dhsize},
        {"dweight", dweight, vl * h * wsize},
        {"dbias", dbias, vl * wsize},
        {"workspace", workspace, need},
    };
    const vp_buf in[] = {
        {"hidden", hidden, b_hidden},
        {"weight", weight, b_weight},
        {"bias", bias, vl * esize},
        {"targets", targets, n * isize},
        {"lse", which == 1 ? lse : NULL, n * 4u},
        {"grad_loss", grads ? grad_loss : NULL, nloss * 4u},
        {"ce_opts->weight", p->weight, (size_t)V * 4u},
        {"ce_opts->logit_offset", p->logit_offset, (size_t)V * 4u},
    };
    const int n_out = (int)(sizeof out / sizeof out[0]), n_in = (int)(sizeof in / sizeof in[0]);
    for (int a = 0; a < n_out; a++) {
        FL_CHECK(check_disjoint(fn, out[a], in, n_in));
        if (a + 1 < n_out) FL_CHECK(check_disjoint(fn, out[a], out + a + 1, n_out - a - 1));
    }
    return FL_OK;
}
