/* gelu_validate.c — argument checks shared by the CPU and CUDA GeLU backends, the CUDA work
 * plan (pure integer arithmetic, so the workspace size query and the launcher agree), and
 * fl_gelu_workspace_size().
 *
 * Every message names the public function and the offending value. Nothing here dereferences
 * a caller pointer. */
#include <stdint.h>
#include <string.h>

#include "../internal.h"

static int64_t cdiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }
static size_t align256(size_t x) { return (x + 255u) & ~(size_t)255u; }

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) { int64_t t = a % b; a = b; b = t; }
    return a;
}

/* Work decomposition of the CUDA kernels (see src/cuda/gelu.cu for what each field drives).
 * Only N, F, esize, the path, whether dbias is wanted and the launch knobs (unroll = rows in
 * flight per thread, tx = threads along a row, target_ctas) matter: never the device for dbias
 * (its target is a fixed number, so the dbias summation order and so its bits are the same on
 * every GPU; the launcher sizes target_ctas from the device only without dbias). */
#define GELU_DBIAS_NB_CAP 64                 /* row blocks with dbias */
#define GELU_PART_BUDGET ((size_t)2 << 20)   /* bytes of fp32 dbias partials (nb * width * 4) */

void fl__gelu_make_plan_ex(fl__gelu_plan* p, fl__gelu_path path, int64_t N, int64_t F, size_t esize,
                           int with_dbias, int unroll, int tx, int64_t target_ctas, int dbias_rpb,
                           int sum_kernel) {
    memset(p, 0, sizeof(*p));
    p->path = path;
    p->vec = path == FL__GELU_SCALAR ? 1 : (int)(16u / esize);
    /* flat path: a virtual row is the smallest number of real rows whose bytes are a multiple
     * of 16, so every virtual row starts 16-byte aligned when the base does */
    p->group = path == FL__GELU_FLAT ? (int)(16 / gcd64(F * (int64_t)esize, 16)) : 1;
    p->rows = N > 0 ? cdiv64(N, p->group) : 0;
    p->width = (int64_t)p->group * F;
    p->last = N > 0 ? (N - (p->rows - 1) * p->group) * F : 0;
    p->wvec = cdiv64(p->width, p->vec);
    if (p->vec > 1) {
        /* tx x 16 B of each row per CTA (512 B at tx = 32: four full 128-byte lines per warp
         * access). With dbias, narrow slabs make the last-CTA finish short (it reads
         * tx * vec * nb partials) and give more slabs, so fewer row blocks, for the same CTAs. */
        if (tx != 32 && tx != 64 && tx != 128 && tx != 256) tx = with_dbias ? 32 : 64;
        while (tx > 32 && p->wvec <= tx / 2) tx /= 2;
        p->tx = tx;
    } else {
        p->tx = p->wvec <= 32 ? 32 : p->wvec <= 64 ? 64 : p->wvec <= 128 ? 128 : 256;
    }
    p->ty = 256 / p->tx;
    p->slabs = cdiv64(p->wvec, p->tx);
    if (p->rows == 0) return;
    if (unroll != 1 && unroll != 2 && unroll != 4 && unroll != 8) unroll = FL__GELU_UNROLL;
    if (p->vec == 1) unroll = 4;   /* the scalar path is built with 4 only */
    const int64_t step = (int64_t)p->ty * unroll;
    /* Row blocks: about target_ctas CTAs in all, rounded down (the launcher's target is whole
     * waves). With dbias each row block writes one fp32 partial per position, so their number
     * is capped (64, and 2 MiB of partials: ~1% of the N x F traffic at N = 8192). */
    if (with_dbias && dbias_rpb > 0 && p->vec > 1 && path != FL__GELU_FLAT) {
        /* short row blocks (finish 4): rpb ~ dbias_rpb rows in whole steps, at most
         * FL__GELU_DBIAS_NB_MAX blocks (longer blocks for larger N); the CTAs write their
         * partials and exit (no fence, no counter: a fence waits for the CTA's gradient stores
         * to drain, which made short blocks with an in-kernel finish 1.6x slower), and a second
         * kernel adds the nb partials of each column (float4 columns; else the scalar one) */
        if (dbias_rpb > FL__GELU_DBIAS_RPB_MAX) dbias_rpb = FL__GELU_DBIAS_RPB_MAX;
        int64_t rpb = cdiv64(dbias_rpb, step) * step;
        if (cdiv64(p->rows, rpb) > FL__GELU_DBIAS_NB_MAX) rpb = cdiv64(cdiv64(p->rows, FL__GELU_DBIAS_NB_MAX), step) * step;
        p->rpb = rpb;
        p->nb = cdiv64(p->rows, rpb);
        p->finish = (p->width & 3) == 0 ? 4 : 2;
        p->ws_bytes = FL__GELU_COUNTER_BYTES + align256((size_t)p->nb * (size_t)p->width * 4u);
        return;
    }
    if (target_ctas < 1) target_ctas = 1;
    if (with_dbias && target_ctas > FL__GELU_DBIAS_CTAS_MAX) target_ctas = FL__GELU_DBIAS_CTAS_MAX;
    int64_t nb = target_ctas / p->slabs;
    if (with_dbias) {
        const int64_t budget = (int64_t)(GELU_PART_BUDGET / ((size_t)p->width * 4u));
        if (nb > GELU_DBIAS_NB_CAP) nb = GELU_DBIAS_NB_CAP;
        if (nb > budget) nb = budget;
    } else if (nb > 65535) {
        nb = 65535;
    }
    if (nb > cdiv64(p->rows, step)) nb = cdiv64(p->rows, step);
    if (nb < 1) nb = 1;
    p->rpb = cdiv64(cdiv64(p->rows, nb), step) * step; /* whole unrolled steps per thread */
    p->nb = cdiv64(p->rows, p->rpb);
    if (with_dbias) {
        /* the last-CTA-per-slab finish needs each slab's positions to be whole columns (not
         * true of the flat path, where a column's positions are F apart) and a counter each;
         * sum_kernel: the same partials added by the float4 sum kernel instead (finish 4) */
        p->finish = (path == FL__GELU_FLAT || p->slabs > FL__GELU_MAX_COUNTERS) ? 2
                    : (sum_kernel && (p->width & 3) == 0) ? 4 : 1;
        p->ws_bytes = FL__GELU_COUNTER_BYTES + align256((size_t)p->nb * (size_t)p->width * 4u);
    }
}

int64_t fl__gelu_cpu_blocks(int64_t N) {
    /* at most 16 blocks (of >= 16 rows): 16 threads share the dbias work, and the double
     * partials (16 x F x 8 bytes) stay below the CUDA backend's own workspace need */
    if (N <= 0) return 0;
    int64_t b = cdiv64(N, 16);
    return b > 16 ? 16 : b;
}

size_t fl__gelu_workspace_bytes(int64_t N, int64_t F, fl_dtype dtype) {
    const size_t es = fl__dtype_size(dtype) ? fl__dtype_size(dtype) : 4u;
    size_t need = 256u + align256((size_t)fl__gelu_cpu_blocks(N) * (size_t)F * sizeof(double));
    /* every path x every knob setting the CUDA launcher accepts (at the largest CTA target: nb
     * only grows with it), so a workspace sized once serves any FUSEDLOSS_GELU_* setting */
    static const int TX[4] = {32, 64, 128, 256};
    for (int path = 0; path < 3; path++)
        for (int u = 1; u <= 8; u *= 2)
            for (int t = 0; t < 4; t++)
                for (int r = 0; r < 2; r++) {  /* the long-block plan, and the shortest row blocks */
                    fl__gelu_plan p;
                    fl__gelu_make_plan_ex(&p, (fl__gelu_path)path, N, F, es, 1, u, TX[t], FL__GELU_DBIAS_CTAS_MAX,
                                          r ? 1 : 0, 0);  /* sum_kernel: same partials either way */
                    if (p.ws_bytes > need) need = p.ws_bytes;
                }
    return need;
}

fl_status fl_gelu_workspace_size(size_t* bytes, int64_t N, int64_t F, fl_dtype dtype) {
    static const char* fn = "fl_gelu_workspace_size";
    fl__clear_error();
    if (!bytes) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: bytes is NULL", fn);
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (F < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: F (%lld) < 1", fn, (long long)F);
    if (fl__dtype_size(dtype) == 0)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (F > INT64_MAX / 4096 || (N > 0 && F > INT64_MAX / 16 / N))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N*F (%lld*%lld) overflows", fn, (long long)N,
                        (long long)F);
    *bytes = fl__gelu_workspace_bytes(N, F, dtype);
    return FL_OK;
}

/* Byte range [lo, hi) of a buffer; empty when p is NULL or n == 0. */
typedef struct { uintptr_t lo, hi; } grange;

static grange mkr(const void* p, size_t n) {
    grange r;
    r.lo = (uintptr_t)p;
    r.hi = p ? r.lo + n : r.lo;
    return r;
}

static int ovl(grange a, grange b) {
    if (a.lo == a.hi || b.lo == b.hi) return 0;
    return a.lo < b.hi && b.lo < a.hi;
}

static size_t mat_bytes(int64_t N, int64_t F, int64_t ld, size_t es) {
    return N > 0 ? ((size_t)(N - 1) * (size_t)ld + (size_t)F) * es : 0;
}

fl_status fl__gelu_validate(const char* fn, int backward, int is_cuda, const void* out,
                            const void* dbias, const void* dy, const void* x, const void* bias,
                            int64_t N, int64_t F, int64_t ld_out, int64_t ld_dy, int64_t ld_x,
                            fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                            const void* workspace, size_t workspace_bytes) {
    const char* on = backward ? "dx" : "y";
    const char* lon = backward ? "ld_dx" : "ld_y";

    /* sizes, dtypes, mode */
    if (N < 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N (%lld) < 0", fn, (long long)N);
    if (F < 1) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: F (%lld) < 1", fn, (long long)F);
    const size_t es = fl__dtype_size(dtype);
    if (es == 0) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown dtype (%d)", fn, (int)dtype);
    if (approx != FL_GELU_NONE && approx != FL_GELU_TANH)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: unknown approx (%d); use FL_GELU_NONE (0, erf) or FL_GELU_TANH (1)", fn,
                        (int)approx);
    size_t bes = 0;
    if (bias || dbias) {
        bes = fl__dtype_size(bias_dtype);
        if (bes == 0)
            return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: unknown bias_dtype (%d)", fn, (int)bias_dtype);
        if (bias_dtype != dtype && bias_dtype != FL_DTYPE_F32)
            return fl__fail(FL_ERR_INVALID_ARGUMENT,
                            "%s: bias_dtype (%d) must be dtype (%d) or FL_DTYPE_F32 (0)", fn,
                            (int)bias_dtype, (int)dtype);
    }
    if (ld_out < F)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%lld) < F (%lld)", fn, lon, (long long)ld_out,
                        (long long)F);
    if (ld_x < F)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_x (%lld) < F (%lld)", fn, (long long)ld_x,
                        (long long)F);
    if (backward && ld_dy < F)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: ld_dy (%lld) < F (%lld)", fn, (long long)ld_dy,
                        (long long)F);
    /* every 64-bit product used below and in the kernels: N*ld*esize, and the workspace's F*8*64*4 */
    if (F > INT64_MAX / 4096)
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: F (%lld) too large", fn, (long long)F);
    {
        const int64_t lds[3] = {ld_out, ld_x, backward ? ld_dy : ld_x};
        const char* names[3] = {lon, "ld_x", "ld_dy"};
        for (int k = 0; k < 3; k++)
            if (N > 0 && lds[k] > INT64_MAX / (int64_t)es / N)
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: N*%s (%lld*%lld) overflows", fn, names[k],
                                (long long)N, (long long)lds[k]);
    }

    /* pointers */
    if (N > 0 && !x) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: x is NULL", fn);
    if (N > 0 && !out) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, on);
    if (backward && N > 0 && !dy) return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dy is NULL", fn);
    if (dbias && !bias)
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dbias is given but bias is NULL (dbias is the gradient of the bias)", fn);
    {
        const void* ps[5] = {out, x, dy, bias, dbias};
        const char* names[5] = {on, "x", "dy", "bias", "dbias"};
        const size_t al[5] = {es, es, es, bes, bes};
        for (int k = 0; k < 5; k++)
            if (ps[k] && al[k] && ((uintptr_t)ps[k] % al[k]))
                return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) is not aligned to its element size (%zu)",
                                fn, names[k], ps[k], al[k]);
    }

    /* workspace: only backward with dbias and rows to sum */
    const int ws_used = backward && dbias && N > 0;
    size_t need = 0;
    if (ws_used) {
        need = fl__gelu_workspace_bytes(N, F, dtype);
        FL_CHECK(fl__check_workspace(fn, is_cuda, workspace, workspace_bytes, need, "fl_gelu_workspace_size()"));
    }

    /* aliasing */
    const grange r_out = mkr(out, mat_bytes(N, F, ld_out, es));
    const grange r_x = mkr(x, mat_bytes(N, F, ld_x, es));
    const grange r_dy = mkr(backward ? dy : NULL, mat_bytes(N, F, ld_dy, es));
    const grange r_b = mkr(bias, (size_t)F * bes);
    const grange r_db = mkr(dbias, (size_t)F * bes);
    const grange r_ws = mkr(ws_used ? workspace : NULL, need);
    if (ovl(r_out, r_x) && !(out == x && ld_out == ld_x))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: %s (%p) overlaps x (%p); only %s == x with %s == ld_x (in place) is allowed", fn, on,
                        out, x, on, lon);
    if (backward && ovl(r_out, r_dy) && !(out == dy && ld_out == ld_dy))
        return fl__fail(FL_ERR_INVALID_ARGUMENT,
                        "%s: dx (%p) overlaps dy (%p); only dx == dy with ld_dx == ld_dy (in place) is allowed",
                        fn, out, dy);
    if (ovl(r_out, r_b) || ovl(r_out, r_db) || ovl(r_out, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: %s (%p) overlaps bias, dbias or the workspace", fn, on, out);
    if (ovl(r_db, r_x) || ovl(r_db, r_dy) || ovl(r_db, r_b) || ovl(r_db, r_ws))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: dbias (%p) overlaps another argument", fn, dbias);
    if (ovl(r_ws, r_x) || ovl(r_ws, r_dy) || ovl(r_ws, r_b))
        return fl__fail(FL_ERR_INVALID_ARGUMENT, "%s: workspace (%p) overlaps another argument", fn, workspace);
    return FL_OK;
}
