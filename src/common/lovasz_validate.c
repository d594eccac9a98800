/* lovasz_validate.c — argument checks of the Lovasz-softmax loss (include/fusedloss.h section 13;
 * both backends), the CPU workspace layout (src/internal.h, fl__lovasz_workspace_bytes) and the
 * public size queries fl_lovasz_softmax_workspace_size() (CPU) and
 * fl_lovasz_softmax_workspace_size_cuda() (src/cuda/lovasz.cu plans the CUDA workspace).
 *
 * Every message names the public function and the offending value. Nothing here dereferences a
 * caller pointer except *opts (the CPU backend range-checks the labels itself).
 * SPDX-License-Identifier: MIT
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../internal.h"

/* 1 when P = N d does not fit in an int64 or 64 + 8 C + P (16 [+ 8 + 8 C]) does not fit in a
 * size_t (N >= 0, C >= 1, d >= 1) */
static int lovasz_ws_overflows(int64_t N, int64_t C, int64_t d, int from_logits) {
    const uint64_t lim = (uint64_t)SIZE_MAX - 64u;
    if ((uint64_t)C > lim / 16u) return 1;                    /* 8 C and 8 + 8 C fit, with room */
    const uint64_t rest = lim - 8u * (uint64_t)C;
    if (N <= 0) return 0;
    if (d > INT64_MAX / N) return 1;
    const uint64_t P = (uint64_t)N * (uint64_t)d;
    const uint64_t per = 16u + (from_logits ? 8u + 8u * (uint64_t)C : 0u);
    return P > rest / per;
}

size_t fl__lovasz_workspace_bytes(int64_t N, int64_t C, int64_t d, int from_logits) {
    if (lovasz_ws_overflows(N, C, d, from_logits)) return SIZE_MAX;   /* saturate */
    const size_t P = (size_t)(N > 0 ? N : 0) * (size_t)(d > 0 ? d : 1);
    const size_t Cs = (size_t)(C > 0 ? C : 1);
    size_t b = 64u + 16u * P + 8u * Cs;
    if (from_logits) b += 8u * P + 8u * P * Cs;
    return b;
}

static fl_status check_opts(const char* fn, const fl_lovasz_options* o) {
    if (o->struct_size != sizeof(fl_lovasz_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: opts->struct_size (%zu) != sizeof(fl_lovasz_options) (%zu); initialise with "
                        "FL_LOVASZ_OPTIONS_INIT", fn, o->struct_size, sizeof(fl_lovasz_options));
    if (o->classes != FL_LOVASZ_PRESENT && o->classes != FL_LOVASZ_ALL)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: unknown opts->classes (%d); use FL_LOVASZ_PRESENT (0) or FL_LOVASZ_ALL (1)", fn,
                        (int)o->classes);
    return FL_OK;
}

/* the size queries' common checks; *o the options to use */
static fl_status check_query(const char* fn, size_t* bytes, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                             const fl_lovasz_options* opts, const fl_lovasz_options** o) {
    static const fl_lovasz_options defaults = FL_LOVASZ_OPTIONS_INIT;
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (C < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: C (%lld) < 1", fn, (long long)C);
    if (d < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: d (%lld) < 1", fn, (long long)d);
    if (fl__dtype_size(dtype) == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    *o = opts ? opts : &defaults;
    FL_CHECK(check_opts(fn, *o));
    if (lovasz_ws_overflows(N, C, d, (*o)->from_logits != 0))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: workspace for N (%lld) x d (%lld) pixels x C (%lld) classes overflows size_t", fn,
                        (long long)N, (long long)d, (long long)C);
    return FL_OK;
}

#ifdef FL_WITH_CUDA
/* CUDA: C N d elements must fit the sort's int count */
static fl_status check_cuda_extent(const char* fn, int64_t N, int64_t C, int64_t d) {
    if (N > 0 && (d > INT32_MAX / N || C > INT32_MAX / (N * d)))
        return fl__fail(FL_ERR_UNSUPPORTED,
                        "%s: C x N x d (%lld x %lld x %lld) elements > 2^31 - 1, the CUDA backend's limit", fn,
                        (long long)C, (long long)N, (long long)d);
    return FL_OK;
}
#endif

/* the CUDA workspace of a call (0: the CUB size query failed) */
static fl_status cuda_need(const char* fn, int64_t N, int64_t C, int64_t d, const fl_lovasz_options* o,
                           size_t* need) {
#ifdef FL_WITH_CUDA
    FL_CHECK(check_cuda_extent(fn, N, C, d));
    *need = fl__lovasz_cuda_workspace_bytes(N, C, d, o->per_image != 0, o->from_logits != 0);
    if (*need == 0) return fl__fail(FL_ERR_CUDA, "%s: the CUB scratch size query failed (no usable device?)", fn);
    return FL_OK;
#else
    (void)N; (void)C; (void)d; (void)o; (void)need;
    return fl__fail(FL_ERR_NOT_BUILT, "%s: this build of fusedloss has no CUDA backend", fn);
#endif
}

fl_status fl_lovasz_softmax_workspace_size(size_t* bytes, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                           const fl_lovasz_options* opts) {
    static const char* fn = "fl_lovasz_softmax_workspace_size";
    const fl_lovasz_options* o;
    fl__clear_error();
    FL_CHECK(check_query(fn, bytes, N, C, d, dtype, opts, &o));
    *bytes = fl__lovasz_workspace_bytes(N, C, d, o->from_logits != 0);
    return FL_OK;
}

fl_status fl_lovasz_softmax_workspace_size_cuda(size_t* bytes, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                                const fl_lovasz_options* opts) {
    static const char* fn = "fl_lovasz_softmax_workspace_size_cuda";
    const fl_lovasz_options* o;
    fl__clear_error();
    FL_CHECK(check_query(fn, bytes, N, C, d, dtype, opts, &o));
    return cuda_need(fn, N, C, d, o, bytes);
}

static int finitef_(float v) { return v == v && v - v == 0.0f; }

fl_status fl__lovasz_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dinput,
                              const void* input, int64_t ld, const void* labels, fl_index_dtype index_dtype,
                              const float* grad_loss, float grad_scale, int64_t N, int64_t C, int64_t d,
                              fl_dtype dtype, const fl_lovasz_options* opts, const void* workspace,
                              size_t workspace_bytes, fl__lovasz_params* p) {
    static const fl_lovasz_options defaults = FL_LOVASZ_OPTIONS_INIT;
    const int fused = pass == FL__PASS_FUSED;
    memset(p, 0, sizeof(*p));

    FL_CHECK(fl__check_ncd(fn, N, C, d, ld));
    const int64_t Cd = C * d;   /* one sample's C classes x d positions */
    FL_CHECK(fl__check_types_extent(fn, N, ld, dtype, index_dtype));
    const size_t es = fl__dtype_size(dtype), is = fl__index_size(index_dtype);

    const fl_lovasz_options* o = opts ? opts : &defaults;
    FL_CHECK(check_opts(fn, o));
    const int from_logits = o->from_logits != 0;
    if (lovasz_ws_overflows(N, C, d, from_logits))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: workspace for N (%lld) x d (%lld) pixels x C (%lld) classes overflows size_t", fn,
                        (long long)N, (long long)d, (long long)C);
    const int64_t P = N * d;
    if (fused && !finitef_(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) must be finite", fn, (double)grad_scale);

    if (!fused && !loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (N > 0 && !input) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: input is NULL", fn);
    if (N > 0 && !labels) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: labels is NULL", fn);
    if (fused && N > 0 && !dinput) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dinput is NULL", fn);
    if (!fused) { dinput = NULL; grad_loss = NULL; }

    {
        const void* ps[5] = {input, dinput, labels, loss, grad_loss};
        const char* names[5] = {"input", "dinput", "labels", "loss", "grad_loss"};
        const size_t al[5] = {es, es, is, 4u, 4u};
        for (int k = 0; k < 5; k++)
            if (ps[k] && ((uintptr_t)ps[k] % al[k]))
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu)",
                                fn, names[k], ps[k], al[k]);
    }

    size_t need = 0;
    if (is_cuda) FL_CHECK(cuda_need(fn, N, C, d, o, &need));
    else need = fl__lovasz_workspace_bytes(N, C, d, from_logits);
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need,
                                 is_cuda ? "fl_lovasz_softmax_workspace_size_cuda()"
                                         : "fl_lovasz_softmax_workspace_size()"));

    /* aliasing: dinput == input is the only overlap allowed; the workspace is an output */
    const size_t x_bytes = N > 0 ? ((size_t)(N - 1) * (size_t)ld + (size_t)Cd) * es : 0;
    const fl__range r_x = fl__mkrange(input, x_bytes);
    const fl__range r_dx = fl__mkrange(dinput, x_bytes);
    const fl__range r_t = fl__mkrange(labels, (size_t)P * is);
    const fl__range r_l = fl__mkrange(loss, 4u);
    const fl__range r_g = fl__mkrange(grad_loss, 4u);
    const fl__range r_ws = fl__mkrange(workspace, need);
    if (dinput && dinput != input && fl__overlap(r_dx, r_x))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dinput (%p) partially overlaps input (%p); only dinput == input (in place) is allowed",
                        fn, dinput, input);
    {
        const fl__range others[4] = {r_t, r_g, r_l, r_ws};
        const char* names[4] = {"labels", "grad_loss", "loss", "workspace"};
        const int k = fl__first_overlap(r_dx, others, 4);
        if (k >= 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dinput (%p) overlaps %s", fn, dinput, names[k]);
    }
    {
        const fl__range others[4] = {r_x, r_t, r_g, r_ws};
        const char* names[4] = {"input", "labels", "grad_loss", "workspace"};
        const int k = fl__first_overlap(r_l, others, 4);
        if (k >= 0)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss (%p) overlaps %s", fn, (const void*)loss, names[k]);
    }
    {
        const fl__range others[3] = {r_x, r_t, r_g};
        const char* names[3] = {"input", "labels", "grad_loss"};
        const int k = fl__first_overlap(r_ws, others, 3);
        if (k >= 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) overlaps %s", fn, workspace, names[k]);
    }

    p->N = N;
    p->C = C;
    p->d = d;
    p->ld = ld;
    p->dtype = dtype;
    p->index_dtype = index_dtype;
    p->classes = o->classes;
    p->per_image = o->per_image != 0;
    p->from_logits = from_logits;
    p->ignore_index = o->ignore_index;
    p->pixels = P;
    return FL_OK;
}
