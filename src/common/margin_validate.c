/* margin_validate.c — argument checks shared by the CPU and CUDA backends of the margin softmax
 * cross-entropy (include/fusedloss.h section 11: CosFace / ArcFace / combined margins), the
 * workspace layout (src/internal.h, fl__margin_workspace_bytes: the distillation layout with C
 * columns) and the public size query fl_margin_ce_workspace_size().
 *
 * Every message names the public function and the offending value (NCCL ArgsCheck style).
 * Nothing here dereferences a caller pointer except *opts (targets are range-checked by the CPU
 * backend itself, which reads them; the CUDA kernels flag them).
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"

/* pi in double (M_PI is not in strict C11 <math.h>) */
static const double FL__PI = 3.14159265358979323846;

static int64_t margin_chunks(int64_t C) { return C > 0 ? (C + FL__DISTILL_CHUNK - 1) / FL__DISTILL_CHUNK : 1; }

/* The distillation workspace: header | fp32 per-row losses | two int32 per row | 8 fp32 per
 * (row, chunk); the CUDA work items and row merge are the same machinery (header section 11).
 * fl__distill_workspace_bytes saturates to SIZE_MAX when the size does not fit in a size_t (a real
 * answer is a multiple of 256, never SIZE_MAX). */
size_t fl__margin_workspace_bytes(int64_t N, int64_t C) { return fl__distill_workspace_bytes(N, C); }

static int margin_ws_overflows(int64_t N, int64_t C) { return fl__margin_workspace_bytes(N, C) == SIZE_MAX; }

fl_status fl_margin_ce_workspace_size(size_t* bytes, int64_t N, int64_t C, fl_dtype dtype,
                                      const fl_margin_options* opts) {
    static const char* fn = "fl_margin_ce_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    if (fl__dtype_size(dtype) == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (opts && opts->struct_size != sizeof(fl_margin_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_margin_options) (%zu); initialise with "
                        "FL_MARGIN_OPTIONS_INIT", fn, opts->struct_size, sizeof(fl_margin_options));
    if (margin_ws_overflows(N, C))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) x C (%lld) overflows size_t", fn,
                        (long long)N, (long long)C);
    *bytes = fl__margin_workspace_bytes(N, C);
    return FL_OK;
}

static int finitef_(float v) { return v == v && v - v == 0.0f; }

/* One named byte range of the aliasing checks. */
typedef struct {
    const char* name;
    const void* ptr;
    fl__range   r;
} named_range;

/* a (an output) must not overlap any of the n ranges bs[] (inputs, other outputs, the workspace) */
static fl_status check_disjoint(const char* fn, const named_range* a, const named_range* bs, int n) {
    for (int k = 0; k < n; k++)
        if (fl__overlap(a->r, bs[k].r))
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) overlaps %s (%p)", fn, a->name, a->ptr, bs[k].name,
                            bs[k].ptr);
    return FL_OK;
}

fl_status fl__margin_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const float* lse,
                              const void* dlogits, const void* logits, int64_t ld, const void* targets,
                              fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                              int64_t C, fl_dtype dtype, const fl_margin_options* opts, const void* workspace,
                              size_t workspace_bytes, fl__margin_params* p) {
    static const fl_margin_options defaults = FL_MARGIN_OPTIONS_INIT;
    const int fused = pass == FL__PASS_FUSED;
    memset(p, 0, sizeof(*p));

    /* sizes first: every byte-range computation below depends on them */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    if (ld < C) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld (%lld) < C (%lld)", fn, (long long)ld, (long long)C);

    /* dtypes and 64-bit extents (N rows of stride ld) */
    FL_CHECK(fl__check_types_extent(fn, N, ld, dtype, index_dtype));
    const size_t es = fl__dtype_size(dtype), is = fl__index_size(index_dtype);
    if (margin_ws_overflows(N, C))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace for N (%lld) x C (%lld) overflows size_t", fn,
                        (long long)N, (long long)C);

    /* options (NULL = FL_MARGIN_OPTIONS_INIT) */
    const fl_margin_options* o = opts ? opts : &defaults;
    if (o->struct_size != sizeof(fl_margin_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_margin_options) (%zu); initialise with "
                        "FL_MARGIN_OPTIONS_INIT", fn, o->struct_size, sizeof(fl_margin_options));
    if (!finitef_(o->s) || !(o->s > 0.0f))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->s (%g) must be finite and > 0", fn, (double)o->s);
    if (!finitef_(o->m1) || !(o->m1 >= 1.0f))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->m1 (%g) must be finite and >= 1", fn, (double)o->m1);
    if (!(o->m2 >= 0.0f && (double)o->m2 < FL__PI))   /* NaN and +-inf fail too */
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->m2 (%.9g) not in [0, pi)", fn, (double)o->m2);
    if (!finitef_(o->m3) || !(o->m3 >= 0.0f))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: opts->m3 (%g) must be finite and >= 0", fn, (double)o->m3);
    if (o->grad_mode != FL_MARGIN_GRAD_EXACT && o->grad_mode != FL_MARGIN_GRAD_STRAIGHT)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: unknown opts->grad_mode (%d); use FL_MARGIN_GRAD_EXACT (0) or FL_MARGIN_GRAD_STRAIGHT (1)",
                        fn, (int)o->grad_mode);
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

    /* every pointer aligned to its element size (both backends: the CPU dereferences them) */
    {
        const void* ps[6] = {logits, dlogits, targets, loss, lse, grad_loss};
        const char* names[6] = {"logits", "dlogits", "targets", "loss", "lse", "grad_loss"};
        const size_t al[6] = {es, es, is, 4u, 4u, 4u};
        for (int k = 0; k < 6; k++)
            if (ps[k] && ((uintptr_t)ps[k] % al[k]))
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu)",
                                fn, names[k], ps[k], al[k]);
    }

    /* workspace */
    const size_t need = fl__margin_workspace_bytes(N, C);
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, "fl_margin_ce_workspace_size()"));

    /* aliasing: dlogits == logits (in place) is the only overlap allowed; inputs may alias each other */
    const size_t nred = o->reduction == FL_REDUCTION_NONE ? (size_t)N : 1u;
    const size_t mat = N > 0 ? ((size_t)(N - 1) * (size_t)ld + (size_t)C) * es : 0;
    const named_range r_x = {"logits", logits, fl__mkrange(logits, mat)};
    const named_range r_t = {"targets", targets, fl__mkrange(targets, (size_t)N * is)};
    const named_range r_g = {"grad_loss", grad_loss, fl__mkrange(grad_loss, nred * 4u)};
    const named_range r_l = {"loss", loss, fl__mkrange(loss, nred * 4u)};
    const named_range r_lse = {"lse", lse, fl__mkrange(lse, (size_t)N * 4u)};
    const named_range r_dx = {"dlogits", dlogits, fl__mkrange(dlogits, mat)};
    const named_range r_ws = {"workspace", workspace, fl__mkrange(workspace, need)};
    if (dlogits && dlogits != logits && fl__overlap(r_dx.r, r_x.r))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dlogits (%p) partially overlaps logits (%p); only dlogits == logits (in place) is "
                        "allowed", fn, dlogits, logits);
    {
        const named_range others_dx[5] = {r_t, r_g, r_l, r_lse, r_ws};
        FL_CHECK(check_disjoint(fn, &r_dx, others_dx, 5));
        const named_range others_l[5] = {r_x, r_t, r_g, r_lse, r_ws};
        FL_CHECK(check_disjoint(fn, &r_l, others_l, 5));
        const named_range others_lse[4] = {r_x, r_t, r_g, r_ws};
        FL_CHECK(check_disjoint(fn, &r_lse, others_lse, 4));
        const named_range others_ws[3] = {r_x, r_t, r_g};
        FL_CHECK(check_disjoint(fn, &r_ws, others_ws, 3));
    }

    /* resolved parameters */
    p->N = N;
    p->C = C;
    p->ld = ld;
    p->dtype = dtype;
    p->index_dtype = index_dtype;
    p->s = o->s;
    p->m1 = o->m1;
    p->m2 = o->m2;
    p->m3 = o->m3;
    p->easy_margin = o->easy_margin != 0;
    p->grad_mode = o->grad_mode;
    p->ignore_index = o->ignore_index;
    p->reduction = o->reduction;
    p->error_flag = o->error_flag;
    p->cosface = o->m1 == 1.0f && o->m2 == 0.0f;
    p->theta_max = (float)((FL__PI - (double)o->m2) / (double)o->m1);
    p->sinmm = (float)((double)o->m2 * sin((double)o->m2));
    p->chunks = margin_chunks(C);
    return FL_OK;
}
