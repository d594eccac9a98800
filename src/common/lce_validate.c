/* lce_validate.c — linear cross-entropy: the chunk plan (how a call is cut into row chunks and
 * how the workspace is laid out), the public workspace size query, and the argument checks
 * shared by the CPU and CUDA backends, so that CI's CPU tests exercise the checks the CUDA path
 * uses (include/fusedloss.h section 6).
 *
 * Pure integer arithmetic. Every byte count is checked against overflow: a size that does not
 * fit in both size_t and int64_t (the kernels' offsets) is FL_ERR_INVALID_ARGUMENT. Nothing here
 * dereferences a caller pointer except, on the CPU, the class weights (fl__ce_check_weights).
 * Messages name the public function and the offending value (NCCL ArgsCheck style).
 *
 * ---- The plan (fl__lce_make_plan) -------------------------------------------------------------
 *   ldl        = V rounded up to FL__LCE_V_ALIGN (64): the logits chunk's row stride
 *   accum_fp32 = wgrad_dtype is 16-bit and (wgrad_accum == FP32, or AUTO and 4*V*H <= budget/2)
 *   regions, in this order, each starting 256-aligned:
 *     off_ce     256 + align(16 N) + align(max(16 chunk_rows ce_chunks, FL__CE_STAGE_SCRATCH)): the CE
 *                workspace (fl__ce_workspace_bytes' layout) with the header and per-row partials of
 *                all N rows, and the per-(row, V chunk) statistics of ONE chunk of rows (each CE
 *                call is one chunk, indexed from its first row; ce_chunks = fl__ce_chunks(V, esize))
 *     off_logits chunk_rows * ldl * esize              logits, then dlogits in place
 *     off_acc    4*V*H if accum_fp32, else 0           fp32 dweight accumulator
 *     off_bacc   4*V                                   fp32 dbias accumulator
 *     off_ones   chunk_rows * esize                    a column of ones (dbias as a GEMV)
 *     off_dh32   chunk_rows * 4*H if V % 64 != 0 and dtype is 16-bit, else 0: fp32 dhidden of a
 *                chunk (the CUDA GEMMs split V at a multiple of 64; see linear_cross_entropy.cu)
 *     off_blas   FL__LCE_BLAS_BYTES                    cuBLASLt's workspace
 *   total = the end of the last region.
 *   chunk_rows = lce_opts->chunk_rows when > 0 (at most N when N > 0); else
 *     rows = (byte_budget - fixed) / (ldl*esize + esize + dh32 + 16 ce_chunks bytes per row), fixed = the
 *     regions that do not grow with chunk_rows (the CE's 256 + align(16 N) + FL__CE_STAGE_SCRATCH + 256)
 *     + 4 KiB of slack (covers the <= 5 x 255 bytes of alignment padding, so the total fits the
 *     budget); rounded down to a multiple of 64; at least 64; then N if that is
 *     >= N, else balanced: chunks = ceil(N/rows), rows = min(rows, roundup64(ceil(N/chunks)))
 *     (the same number of chunks, as even as 64-row granularity allows).
 *   N == 0: chunk_rows = 1, chunks = 0.
 */
#include <math.h>
#include <stdint.h>

#include "../internal.h"

/* Largest byte count we accept: it must fit size_t and int64_t alike. */
#define LIM ((uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX : (uint64_t)SIZE_MAX)

/* a*b, a+b and roundup(a, 256) bounded by LIM; return 1 on overflow (then *r is unspecified). */
static int mul_ov(uint64_t a, uint64_t b, uint64_t* r) {
    if (a != 0 && b > LIM / a) return 1;
    *r = a * b;
    return 0;
}
static int add_ov(uint64_t a, uint64_t b, uint64_t* r) {
    if (a > LIM || b > LIM - a) return 1;
    *r = a + b;
    return 0;
}
static int align_ov(uint64_t a, uint64_t* r) {
    if (add_ov(a, 255u, r)) return 1;
    *r &= ~(uint64_t)255u;
    return 0;
}

static fl_status overflow(const char* fn, const char* what, int64_t N, int64_t H, int64_t V) {
    return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s overflows (N = %lld, H = %lld, V = %lld)", fn, what,
                    (long long)N, (long long)H, (long long)V);
}

/* ---------------------------------------------------------------------------------------- */
/* the plan                                                                                   */

fl_status fl__lce_make_plan(const char* fn, int64_t N, int64_t H, int64_t V, fl_dtype dtype,
                            fl_dtype wgrad_dtype, const fl_ce_options* ce_opts,
                            const fl_lce_options* lce_opts, fl__lce_plan* plan) {
    return fl__lce_make_plan_ex(fn, N, H, V, dtype, wgrad_dtype, ce_opts, lce_opts, 0, plan);
}

fl_status fl__lce_make_plan_ex(const char* fn, int64_t N, int64_t H, int64_t V, fl_dtype dtype,
                               fl_dtype wgrad_dtype, const fl_ce_options* ce_opts,
                               const fl_lce_options* lce_opts, int force_dh32, fl__lce_plan* plan) {
    static const fl_lce_options defaults = FL_LCE_OPTIONS_INIT;
    const fl_lce_options* o = lce_opts ? lce_opts : &defaults;

    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (H < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: H (%lld) < 1", fn, (long long)H);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    const size_t esize = fl__dtype_size(dtype);
    if (esize == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    const size_t wsize = fl__dtype_size(wgrad_dtype);
    if (wsize == 0 || (wgrad_dtype != dtype && wgrad_dtype != FL_DTYPE_F32))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: wgrad_dtype (%d) must be dtype (%d) or FL_DTYPE_F32 (%d)", fn,
                        (int)wgrad_dtype, (int)dtype, (int)FL_DTYPE_F32);
    if (ce_opts && !fl__ce_options_size_ok(ce_opts->struct_size))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: ce_opts->struct_size (%zu) != sizeof(fl_ce_options) (%zu); initialise with FL_CE_OPTIONS_INIT",
                        fn, ce_opts->struct_size, sizeof(fl_ce_options));
    if (o->struct_size != sizeof(fl_lce_options))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: lce_opts->struct_size (%zu) != sizeof(fl_lce_options) (%zu); initialise with FL_LCE_OPTIONS_INIT",
                        fn, o->struct_size, sizeof(fl_lce_options));
    if (o->chunk_rows < 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lce_opts->chunk_rows (%lld) < 0 (0 = from byte_budget)", fn,
                        (long long)o->chunk_rows);
    if (o->wgrad_accum != FL_LCE_ACCUM_AUTO && o->wgrad_accum != FL_LCE_ACCUM_FP32 &&
        o->wgrad_accum != FL_LCE_ACCUM_LEAN)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown lce_opts->wgrad_accum (%d)", fn, (int)o->wgrad_accum);
    if (o->allow_tf32 != 0 && o->allow_tf32 != 1)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lce_opts->allow_tf32 (%d) must be 0 or 1", fn,
                        (int)o->allow_tf32);

    /* sizes that do not depend on chunk_rows */
    const uint64_t n = (uint64_t)N, v = (uint64_t)V, h = (uint64_t)H;
    if (v > (uint64_t)INT64_MAX - (FL__LCE_V_ALIGN - 1)) return overflow(fn, "V rounded up to 64", N, H, V);
    const uint64_t ldl = (v + FL__LCE_V_ALIGN - 1) / FL__LCE_V_ALIGN * FL__LCE_V_ALIGN;
    uint64_t ce, t0, acc_bytes, bacc, row_bytes;
    /* the CE workspace: 256 + align(16 N) now, the chunk's statistics once chunk_rows is known
     * (why per chunk and not for all N rows, as fl__ce_workspace_bytes(N, ...) has it: at
     * 8192 x 4096 x 128256 bf16 the N-row region took 4.2 MB of the 512 MiB default budget and
     * pushed the chunks from 4 x 2048 rows down to 5 x 1664, 5% slower on the H200, s9 run 3) */
    const uint64_t stats_row = 16u * (uint64_t)fl__ce_chunks(V, esize);  /* <= 16 (V + 1): no overflow */
    if (mul_ov(n, 16u, &t0) || align_ov(t0, &t0) || add_ov(t0, 256u, &ce))
        return overflow(fn, "the cross-entropy workspace (16*N bytes)", N, H, V);
    if (mul_ov(v, h, &t0) || mul_ov(t0, 4u, &acc_bytes)) return overflow(fn, "4*V*H (bytes)", N, H, V);
    bacc = 4u * v;                                                   /* <= acc_bytes: no overflow */
    if (mul_ov(ldl, esize, &row_bytes) || add_ov(row_bytes, esize, &row_bytes) ||
        add_ov(row_bytes, stats_row, &row_bytes))
        return overflow(fn, "a logits row (ldl*esize bytes)", N, H, V);
    const int odd16 = (v % FL__LCE_V_ALIGN) != 0 && esize == 2;
    const uint64_t dh32_row = (odd16 || force_dh32) ? 4u * h : 0u;                   /* <= acc_bytes: no overflow */
    if (add_ov(row_bytes, dh32_row, &row_bytes)) return overflow(fn, "a logits row (ldl*esize bytes)", N, H, V);

    const int wgrad16 = wsize == 2;
    const uint64_t budget = (uint64_t)o->byte_budget;
    const int accum_fp32 = wgrad16 && (o->wgrad_accum == FL_LCE_ACCUM_FP32 ||
                                       (o->wgrad_accum == FL_LCE_ACCUM_AUTO && acc_bytes <= budget / 2u));
    if (!accum_fp32) acc_bytes = 0;

    /* chunk_rows */
    int64_t rows;
    if (N == 0) {
        rows = 1;
    } else if (o->chunk_rows > 0) {
        rows = o->chunk_rows < N ? o->chunk_rows : N;
    } else {
        uint64_t fixed;
        uint64_t r = 0;
        if (!add_ov(ce, FL__CE_STAGE_SCRATCH + 256u, &fixed) && !add_ov(fixed, acc_bytes, &fixed) &&
            !add_ov(fixed, bacc, &fixed) &&
            !add_ov(fixed, FL__LCE_BLAS_BYTES, &fixed) && !add_ov(fixed, 4096u, &fixed) && budget > fixed)
            r = (budget - fixed) / row_bytes;                         /* row_bytes >= 130 */
        r -= r % FL__LCE_ROW_ALIGN;
        if (r < FL__LCE_ROW_ALIGN) r = FL__LCE_ROW_ALIGN;
        if (r >= n) {
            rows = N;
        } else {
            const uint64_t chunks = (n + r - 1) / r;
            const uint64_t even = (n + chunks - 1) / chunks;          /* rows per chunk if even */
            const uint64_t even64 = (even + FL__LCE_ROW_ALIGN - 1) / FL__LCE_ROW_ALIGN * FL__LCE_ROW_ALIGN;
            rows = (int64_t)(even64 < r ? even64 : r);
        }
    }

    /* the regions */
    uint64_t off = 0, sz;
    plan->off_ce = 0;
    if (mul_ov((uint64_t)rows, stats_row, &sz)) return overflow(fn, "the workspace", N, H, V);
    if (sz < FL__CE_STAGE_SCRATCH) sz = FL__CE_STAGE_SCRATCH;
    if (align_ov(sz, &sz) || add_ov(ce, sz, &ce)) return overflow(fn, "the workspace", N, H, V);
    if (align_ov(ce, &off)) return overflow(fn, "the workspace", N, H, V);
    plan->off_logits = (size_t)off;
    if (mul_ov((uint64_t)rows, ldl, &sz) || mul_ov(sz, esize, &sz) || add_ov(off, sz, &off) || align_ov(off, &off))
        return overflow(fn, "the logits chunk (chunk_rows*ldl*esize bytes)", N, H, V);
    plan->off_acc = (size_t)off;
    if (add_ov(off, acc_bytes, &off) || align_ov(off, &off)) return overflow(fn, "the workspace", N, H, V);
    plan->off_bacc = (size_t)off;
    if (add_ov(off, bacc, &off) || align_ov(off, &off)) return overflow(fn, "the workspace", N, H, V);
    plan->off_ones = (size_t)off;
    if (mul_ov((uint64_t)rows, esize, &sz) || add_ov(off, sz, &off) || align_ov(off, &off))
        return overflow(fn, "the workspace", N, H, V);
    plan->off_dh32 = (size_t)off;
    if (mul_ov((uint64_t)rows, dh32_row, &sz) || add_ov(off, sz, &off) || align_ov(off, &off))
        return overflow(fn, "the workspace", N, H, V);
    plan->off_blas = (size_t)off;
    if (add_ov(off, FL__LCE_BLAS_BYTES, &off)) return overflow(fn, "the workspace", N, H, V);
    plan->total = (size_t)off;

    plan->chunk_rows = rows;
    plan->chunks = N == 0 ? 0 : (N + rows - 1) / rows;               /* rows >= 1: no overflow */
    plan->ldl = (int64_t)ldl;
    plan->accum_fp32 = accum_fp32;
    return FL_OK;
}

fl_status fl_linear_cross_entropy_workspace_size(size_t* bytes, int64_t N, int64_t H, int64_t V,
                                                 fl_dtype dtype, fl_dtype wgrad_dtype,
                                                 const fl_ce_options* ce_opts,
                                                 const fl_lce_options* lce_opts) {
    static const char* fn = "fl_linear_cross_entropy_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    fl__lce_plan plan;
    FL_CHECK(fl__lce_make_plan(fn, N, H, V, dtype, wgrad_dtype, ce_opts, lce_opts, &plan));
    *bytes = plan.total;
    return FL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* the argument checks                                                                        */

/* A named byte range [lo, hi); empty when the pointer is NULL or the size 0. */
typedef struct {
    const char* name;
    uintptr_t   lo, hi;
} nrange;

static nrange mk(const char* name, const void* p, uint64_t bytes) {
    nrange r;
    r.name = name;
    r.lo = (uintptr_t)p;
    r.hi = p ? r.lo + (uintptr_t)bytes : r.lo;
    return r;
}

static int overlap(const nrange* a, const nrange* b) {
    if (a->lo == a->hi || b->lo == b->hi) return 0;
    return a->lo < b->hi && b->lo < a->hi;
}

fl_status fl__lce_validate(const char* fn, int backward, int is_cuda,
                           const float* loss, const float* lse, const void* dhidden,
                           const void* dweight, const void* dbias, const void* hidden,
                           int64_t ld_hidden, const void* weight, int64_t ld_weight,
                           const void* bias, const void* targets, const float* grad_loss,
                           float grad_scale, int64_t N, int64_t H, int64_t V, fl_dtype dtype,
                           fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                           const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                           const void* workspace, size_t workspace_bytes,
                           fl__ce_params* p, fl__lce_plan* plan) {
    /* sizes and dtypes first: every byte-range computation below depends on them */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (H < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: H (%lld) < 1", fn, (long long)H);
    if (V < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: V (%lld) < 1", fn, (long long)V);
    if (ld_hidden < H)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_hidden (%lld) < H (%lld)", fn, (long long)ld_hidden,
                        (long long)H);
    if (ld_weight < H)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_weight (%lld) < H (%lld)", fn, (long long)ld_weight,
                        (long long)H);
    const size_t esize = fl__dtype_size(dtype);
    if (esize == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    const size_t wsize = fl__dtype_size(wgrad_dtype);
    if (wsize == 0 || (wgrad_dtype != dtype && wgrad_dtype != FL_DTYPE_F32))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: wgrad_dtype (%d) must be dtype (%d) or FL_DTYPE_F32 (%d)", fn,
                        (int)wgrad_dtype, (int)dtype, (int)FL_DTYPE_F32);
    const size_t isize = fl__index_size(index_dtype);
    if (isize == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown index_dtype (%d)", fn, (int)index_dtype);

    /* extents in bytes, each addressable with 64-bit offsets */
    const uint64_t n = (uint64_t)N, h = (uint64_t)H, v = (uint64_t)V;
    uint64_t b_hidden = 0, b_weight, b_dhidden, b_dweight, b_targets, b_rows4, t;
    if (N > 0 && (mul_ov(n - 1u, (uint64_t)ld_hidden, &t) || add_ov(t, h, &t) || mul_ov(t, esize, &b_hidden)))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: hidden extent ((N-1)*ld_hidden + H = (%lld-1)*%lld + %lld) overflows",
                        fn, (long long)N, (long long)ld_hidden, (long long)H);
    if (mul_ov(v - 1u, (uint64_t)ld_weight, &t) || add_ov(t, h, &t) || mul_ov(t, esize, &b_weight))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: weight extent ((V-1)*ld_weight + H = (%lld-1)*%lld + %lld) overflows",
                        fn, (long long)V, (long long)ld_weight, (long long)H);
    if (mul_ov(n, h, &t) || mul_ov(t, esize, &b_dhidden))
        return overflow(fn, "dhidden (N*H elements)", N, H, V);
    if (mul_ov(v, h, &t) || mul_ov(t, wsize, &b_dweight))
        return overflow(fn, "dweight (V*H elements)", N, H, V);
    if (mul_ov(n, isize, &b_targets) || mul_ov(n, 4u, &b_rows4)) return overflow(fn, "targets / lse", N, H, V);

    /* options and the plan */
    FL_CHECK(fl__ce_resolve_options(fn, "ce_opts", ce_opts, p));
    FL_CHECK(fl__lce_make_plan(fn, N, H, V, dtype, wgrad_dtype, ce_opts, lce_opts, plan));

    /* required pointers */
    const int has_grad = backward || dhidden || dweight || dbias;
    if (!backward && !loss) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: loss is NULL", fn);
    if (N > 0 && !hidden) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: hidden is NULL", fn);
    if (N > 0 && !weight) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: weight is NULL", fn);
    if (N > 0 && !targets) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: targets is NULL", fn);
    if (backward && N > 0 && !lse)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: lse is NULL (backward needs the lse saved by forward)", fn);
    if (backward && N > 0 && !dhidden)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dhidden is NULL (required by backward)", fn);
    if (!backward && N > 0 && !dhidden && (dweight || dbias))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dhidden is NULL but %s is given (gradients in the forward need dhidden)", fn,
                        dweight ? "dweight" : "dbias");
    if (dbias && !bias)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dbias (%p) given without bias (NULL)", fn, dbias);
    if (has_grad && !isfinite(grad_scale))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: grad_scale (%g) is not finite", fn, (double)grad_scale);

    /* class weights: values checkable only where they are host memory */
    FL_CHECK(fl__ce_check_weights(fn, "ce_opts->weight", p->weight, V, is_cuda));
    FL_CHECK(fl__ce_check_offset(fn, "ce_opts->logit_offset", p->logit_offset, V, is_cuda));

    /* alignment: every array aligned to its element size (both backends); CUDA: the GEMM
     * operands 16-byte aligned with 16-byte row strides (cuBLASLt's fast kernels) */
    {
        const struct { const char* name; const void* ptr; size_t align; } al[] = {
            {"hidden", hidden, esize}, {"weight", weight, esize}, {"bias", bias, esize},
            {"dhidden", dhidden, esize}, {"dweight", dweight, wsize}, {"dbias", dbias, wsize},
            {"loss", backward ? NULL : loss, 4}, {"lse", lse, 4}, {"targets", targets, isize},
            {"grad_loss", has_grad ? grad_loss : NULL, 4}, {"ce_opts->weight", p->weight, 4},
            {"ce_opts->logit_offset", p->logit_offset, 4}, {"ce_opts->target_prob", p->target_prob, 4},
        };
        for (size_t k = 0; k < sizeof al / sizeof al[0]; k++)
            if ((uintptr_t)al[k].ptr % al[k].align)
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu bytes)",
                                fn, al[k].name, al[k].ptr, al[k].align);
        if (is_cuda) {
            for (size_t k = 0; k < 6; k++)
                if ((uintptr_t)al[k].ptr % 16u)
                    return fl__fail(FL_ERR_UNSUPPORTED, "%s: %s (%p) is not 16-byte aligned (CUDA needs it)", fn,
                                    al[k].name, al[k].ptr);
            if (((uint64_t)ld_hidden * esize) % 16u)
                return fl__fail(FL_ERR_UNSUPPORTED,
                                "%s: ld_hidden (%lld) * %zu bytes is not a multiple of 16 bytes (CUDA needs it)", fn,
                                (long long)ld_hidden, esize);
            if (((uint64_t)ld_weight * esize) % 16u)
                return fl__fail(FL_ERR_UNSUPPORTED,
                                "%s: ld_weight (%lld) * %zu bytes is not a multiple of 16 bytes (CUDA needs it)", fn,
                                (long long)ld_weight, esize);
        }
    }

    /* workspace */
    FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, plan->total, NULL));

    /* aliasing: no output (the workspace included) may overlap another output or any input */
    {
        const uint64_t nloss = p->reduction == FL_REDUCTION_NONE ? n : 1u;
        const nrange out[] = {
            mk("loss", backward ? NULL : loss, nloss * 4u),
            mk("lse", backward ? NULL : lse, b_rows4),
            mk("dhidden", dhidden, b_dhidden),
            mk("dweight", dweight, b_dweight),
            mk("dbias", dbias, v * wsize),
            mk("workspace", workspace, plan->total),
            mk("ce_opts->target_prob", backward ? NULL : p->target_prob, b_rows4),
        };
        const nrange in[] = {
            mk("hidden", hidden, b_hidden),
            mk("weight", weight, b_weight),
            mk("bias", bias, v * esize),
            mk("targets", targets, b_targets),
            mk("lse", backward ? lse : NULL, b_rows4),
            mk("grad_loss", has_grad ? grad_loss : NULL, nloss * 4u),
            mk("ce_opts->weight", p->weight, v * 4u),
            mk("ce_opts->logit_offset", p->logit_offset, v * 4u),
        };
        const size_t n_out = sizeof out / sizeof out[0], n_in = sizeof in / sizeof in[0];
        for (size_t a = 0; a < n_out; a++) {
            for (size_t b = a + 1; b < n_out; b++)
                if (overlap(&out[a], &out[b]))
                    return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) overlaps %s (%p)", fn, out[a].name,
                                    (const void*)out[a].lo, out[b].name, (const void*)out[b].lo);
            for (size_t b = 0; b < n_in; b++)
                if (overlap(&out[a], &in[b]))
                    return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) overlaps %s (%p)", fn, out[a].name,
                                    (const void*)out[a].lo, in[b].name, (const void*)in[b].lo);
        }
    }
    return FL_OK;
}
