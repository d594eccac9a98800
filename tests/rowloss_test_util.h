/* rowloss_test_util.h — the harness shared by the CPU tests of the row-wise softmax-family losses
 * with the Taylor CE calling convention (tests/test_taylor_ce.c, tests/test_large_margin_ce.c):
 * loss fp32 ([N] for NONE, else [1]), logits [N, ld] of a dtype, int32 / int64 targets,
 * ignore_index, NONE / SUM / MEAN, an optional fused dlogits (in place allowed) and a workspace.
 * The op is given as an rl_ops (function pointers taking the options as const void*, and the
 * offsets of the common option fields; RL_DEFINE_OPS writes it). Header-only (static inline
 * functions and macros), on top of test_util.h and zoo_test_util.h (included here). */
#ifndef FL_TEST_ROWLOSS_TEST_UTIL_H
#define FL_TEST_ROWLOSS_TEST_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusedloss.h"
#include "test_util.h"
#include "zoo_test_util.h"

/* ---- the op ---------------------------------------------------------------------------------- */
typedef fl_status (*rl_forward_fn)(float* loss, const void* logits, int64_t ld, const void* targets,
                                   fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype, const void* opts,
                                   void* workspace, size_t workspace_bytes);
typedef fl_status (*rl_fused_fn)(float* loss, void* dlogits, const void* logits, int64_t ld, const void* targets,
                                 fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                                 int64_t C, fl_dtype dtype, const void* opts, void* workspace, size_t workspace_bytes);
typedef fl_status (*rl_wsize_fn)(size_t* bytes, int64_t N, int64_t C, fl_dtype dtype, const void* opts);

typedef struct {
    rl_forward_fn forward;
    rl_fused_fn fused;
    rl_wsize_fn workspace_size;
    const char* forward_name;   /* "fl_..._forward_cpu" */
    const char* fused_name;     /* "fl_..._fused_cpu" */
    const char* workspace_size_name;   /* "fl_..._workspace_size" */
    size_t opts_size;           /* sizeof the options struct */
    size_t off_ignore_index, off_reduction, off_struct_size, off_error_flag;   /* offsetof its fields */
} rl_ops;

/* defines `static const rl_ops ops_` for the entry points pfx_##_forward_cpu, pfx_##_fused_cpu and
 * pfx_##_workspace_size taking the options struct opt_t_ (wrappers ops_##_forward, ..: the options
 * as const void*) */
#define RL_DEFINE_OPS(ops_, pfx_, opt_t_)                                                                          \
    static fl_status ops_##_forward(float* loss, const void* x, int64_t ld, const void* t, fl_index_dtype it,     \
                                    int64_t N, int64_t C, fl_dtype dt, const void* o, void* ws, size_t wsb) {     \
        return pfx_##_forward_cpu(loss, x, ld, t, it, N, C, dt, (const opt_t_*)o, ws, wsb);                        \
    }                                                                                                              \
    static fl_status ops_##_fused(float* loss, void* dx, const void* x, int64_t ld, const void* t,                \
                                  fl_index_dtype it, const float* gl, float gs, int64_t N, int64_t C, fl_dtype dt, \
                                  const void* o, void* ws, size_t wsb) {                                           \
        return pfx_##_fused_cpu(loss, dx, x, ld, t, it, gl, gs, N, C, dt, (const opt_t_*)o, ws, wsb);              \
    }                                                                                                              \
    static fl_status ops_##_workspace_size(size_t* bytes, int64_t N, int64_t C, fl_dtype dt, const void* o) {     \
        return pfx_##_workspace_size(bytes, N, C, dt, (const opt_t_*)o);                                          \
    }                                                                                                              \
    static const rl_ops ops_ = {ops_##_forward, ops_##_fused, ops_##_workspace_size, #pfx_ "_forward_cpu",         \
                                #pfx_ "_fused_cpu", #pfx_ "_workspace_size", sizeof(opt_t_),                      \
                                offsetof(opt_t_, ignore_index), offsetof(opt_t_, reduction),                      \
                                offsetof(opt_t_, struct_size), offsetof(opt_t_, error_flag)}

/* an options struct of the op, opaque (at most 64 bytes) */
typedef union {
    max_align_t align_;
    unsigned char b[64];
} rl_opts;

static inline void rl_opts_copy(const rl_ops* op, rl_opts* d, const void* s) {
    memset(d, 0, sizeof *d);
    memcpy(d->b, s, op->opts_size);
}
static inline void rl_opts_set_reduction(const rl_ops* op, rl_opts* d, fl_reduction r) {
    memcpy(d->b + op->off_reduction, &r, sizeof r);
}
static inline void rl_opts_set_ignore_index(const rl_ops* op, rl_opts* d, int64_t v) {
    memcpy(d->b + op->off_ignore_index, &v, sizeof v);
}
static inline void rl_opts_set_struct_size(const rl_ops* op, rl_opts* d, size_t v) {
    memcpy(d->b + op->off_struct_size, &v, sizeof v);
}
static inline void rl_opts_set_error_flag(const rl_ops* op, rl_opts* d, int32_t* v) {
    memcpy(d->b + op->off_error_flag, &v, sizeof v);
}

static inline const char* red_name(fl_reduction r) {
    return r == FL_REDUCTION_NONE ? "none" : r == FL_REDUCTION_MEAN ? "mean" : r == FL_REDUCTION_SUM ? "sum" : "?";
}

static inline int close_rel(double got, double want, double rtol, double atol) {
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static inline size_t al256(size_t x) { return (x + 255) / 256 * 256; }

/* the knobs of grid configuration k cycled through coprime periods (for a cfg struct c_ with the
 * fields pad, tgt64, ignore_index, ign_mode, gl, gscale, rot): padding 0 / 5 / 0 / 1, int32 / int64
 * targets, ignore_index -100 / 255, rows ignored or not, grad_loss given or not, gss_[3] the
 * grad_scales, kinds_ the row kinds */
#define RL_CYCLE_KNOBS(c_, k_, gss_, kinds_)                                                          \
    do {                                                                                              \
        (c_).pad = (k_) % 4 == 1 ? 5 : (k_) % 4 == 3 ? 1 : 0;                                         \
        (c_).tgt64 = ((k_) / 2) % 2;                                                                  \
        (c_).ignore_index = (k_) % 3 == 2 ? 255 : -100;                                               \
        (c_).ign_mode = (k_) % 7 < 4 ? 1 : 0;                                                         \
        (c_).gl = ((k_) % 5) & 1;                                                                     \
        (c_).gscale = (gss_)[((k_) / 7) % 3];                                                         \
        (c_).rot = (k_) % (kinds_);                                                                   \
    } while (0)

/* the name of a configuration: "<pre> <reduction> N=.. C=.. ld=.. <dtype> i32|i64 ign=..[(all)|(none)]
 * gl=.. gs=.." */
static inline void rl_cfg_name(char* buf, size_t size, const char* pre, fl_reduction red, int64_t N, int64_t C,
                               int64_t ld, fl_dtype dt, int tgt64, int64_t ignore_index, int ign_mode, int gl,
                               float gscale) {
    snprintf(buf, size, "%s %s N=%lld C=%lld ld=%lld %s i%d ign=%lld%s gl=%d gs=%g", pre, red_name(red),
             (long long)N, (long long)C, (long long)ld, tu_dtype_name(dt), tgt64 ? 64 : 32, (long long)ignore_index,
             ign_mode == 2 ? "(all)" : ign_mode == 0 ? "(none)" : "", gl, (double)gscale);
}

/* ---- one grid configuration: the inputs ------------------------------------------------------- */
/* fills row `base` (not ignored) of x with kind `kind`, the target y given */
typedef void (*rl_fill_fn)(const void* cfg, tu_rng* r, void* x, int64_t base, int64_t y, int kind);

typedef struct {
    void* x;           /* [N ld] + 4 bytes: ignored rows NaN, padding alternately 30000 and NaN */
    void* x_in;        /* an untouched copy of x */
    int32_t* t32;
    int64_t* t64;
    int* ign;          /* the row is ignored */
    float* gl;         /* grad_loss [N + 1] ([1] for SUM / MEAN, the rest NaN) */
    int64_t D;         /* rows not ignored */
    const void* targets;
    fl_index_dtype it;
} rl_inputs;

/* inputs: everything poisoned (NaN) first, so ignored rows stay NaN (never read); padding columns
 * alternately +30000 and NaN; ign_mode 0: no row ignored, 1: about 30 %, 2: every row */
static inline void rl_make_inputs(rl_inputs* in, int64_t N, int64_t C, int64_t ld, fl_dtype dt, int tgt64,
                           int64_t ignore_index, int ign_mode, int none, tu_rng* r, rl_fill_fn fill,
                           const void* cfg, int rot, int kinds) {
    const size_t xbytes = (size_t)(N * ld) * tu_dtype_size(dt);
    in->x = tu_xmalloc(xbytes + 4);
    tu_poison(in->x, xbytes + 4);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = C; j < ld; j += 2) tu_store(in->x, dt, i * ld + j, 30000.0f);
    in->t32 = tu_xmalloc((size_t)N * 4 + 4);
    in->t64 = tu_xmalloc((size_t)N * 8 + 8);
    in->ign = tu_xmalloc((size_t)N * sizeof(int) + sizeof(int));
    in->D = 0;
    for (int64_t i = 0; i < N; i++) {
        in->ign[i] = ign_mode == 2 || (ign_mode == 1 && tu_uniform(r) < 0.3);
        int64_t y = ignore_index;
        if (!in->ign[i]) {
            y = tu_int_in(r, 0, C - 1);
            if (y == ignore_index) y = (y + 1) % C;   /* (an in-range ignore_index only with C > 255) */
        }
        in->t32[i] = (int32_t)y;
        in->t64[i] = y;
        in->D += !in->ign[i];
        if (!in->ign[i]) fill(cfg, r, in->x, i * ld, y, (int)((i + rot) % kinds));
    }
    in->targets = tgt64 ? (const void*)in->t64 : (const void*)in->t32;
    in->it = tgt64 ? FL_INDEX_I64 : FL_INDEX_I32;
    in->gl = tu_xmalloc((size_t)(N + 1) * 4);
    for (int64_t i = 0; i < N + 1; i++) in->gl[i] = (none || i == 0) ? (float)tu_uniform_in(r, -2.0, 2.0) : NAN;
    if (!none) in->gl[0] = (float)tu_uniform_in(r, 0.25, 2.0);
    in->x_in = tu_xmalloc(xbytes + 4);   /* the untouched input, to check forward / out of place */
    memcpy(in->x_in, in->x, xbytes + 4);
}

static inline void rl_free_inputs(rl_inputs* in) {
    free(in->x); free(in->x_in); free(in->t32); free(in->t64); free(in->ign); free(in->gl);
}

/* ---- one grid configuration: the reference's arrays ------------------------------------------ */
/* the reference's analytic gradient against its own central differences (rl_ref_fd_row) */
typedef struct {
    int64_t n, bad;   /* differences compared, disagreeing */
    double max;       /* the largest |fd - analytic| */
} rl_fd_stats;

typedef struct {
    double *lref, *lsl;          /* [N + 1]: the rows' losses and their slack (0 for ignored rows) */
    double *dref, *dsl, *got;    /* [N C + 1]: dlogits and their slack; scratch */
    long double *xr, *dl, *ds;   /* [C]: a row's logits, gradient, its slack (ds NULL unless asked) */
    long double sum, sumsl, sumabs;   /* over the rows not ignored: l, its slack, |l| */
    rl_fd_stats fds;             /* the reference's own finite differences */
    int64_t fdrows;              /* rows differenced so far */
} rl_ref;

static inline void rl_ref_alloc(rl_ref* R, int64_t N, int64_t C, int with_ds) {
    const size_t ne = (size_t)(N * C) + 1;
    memset(R, 0, sizeof *R);
    R->lref = tu_xmalloc((size_t)(N + 1) * 8);
    R->lsl = tu_xmalloc((size_t)(N + 1) * 8);
    R->dref = tu_xmalloc(ne * 8);
    R->dsl = tu_xmalloc(ne * 8);
    R->got = tu_xmalloc(ne * 8);
    R->xr = tu_xmalloc((size_t)C * sizeof(long double));
    R->dl = tu_xmalloc((size_t)C * sizeof(long double));
    if (with_ds) R->ds = tu_xmalloc((size_t)C * sizeof(long double));
}

static inline void rl_ref_free(rl_ref* R) {
    free(R->lref); free(R->lsl); free(R->dref); free(R->dsl); free(R->got); free(R->xr); free(R->dl); free(R->ds);
}

/* row i ignored: loss 0 and dlogits 0, no slack */
static inline void rl_ref_zero_row(rl_ref* R, int64_t i, int64_t C) {
    R->lref[i] = 0; R->lsl[i] = 0;
    for (int64_t j = 0; j < C; j++) { R->dref[i * C + j] = 0; R->dsl[i * C + j] = 0; }
}

/* row i's loss l and its slack sl */
static inline void rl_ref_add_row(rl_ref* R, int64_t i, long double l, long double sl) {
    R->lref[i] = (double)l;
    R->lsl[i] = (double)sl;
    R->sum += l;
    R->sumsl += sl;
    R->sumabs += fabsl(l);
}

/* the factor of row i's gradient: grad_scale (grad_loss[i] for NONE, [0] else; 1 without) / denom */
static inline long double rl_ref_gain(float gscale, const float* gl, int none, int64_t i, long double denom) {
    return (long double)gscale * (gl ? (long double)gl[none ? i : 0] : 1) / denom;
}

/* the outputs of the calls: loss, loss2 [nl + 1] fp32, dx, dx2 [xbytes + 4] */
typedef struct {
    float *loss, *loss2;
    void *dx, *dx2;
} rl_outs;

static inline void rl_outs_alloc(rl_outs* u, int64_t nl, size_t xbytes) {
    u->loss = tu_xmalloc((size_t)(nl + 1) * 4);
    u->loss2 = tu_xmalloc((size_t)(nl + 1) * 4);
    u->dx = tu_xmalloc(xbytes + 4);
    u->dx2 = tu_xmalloc(xbytes + 4);
}

static inline void rl_outs_free(rl_outs* u) { free(u->loss); free(u->loss2); free(u->dx); free(u->dx2); }

/* ---- one grid configuration: the outputs against the reference ------------------------------- */
typedef struct {
    const char* name;
    int64_t N, C, ld;
    fl_dtype dt;
    int none;          /* reduction NONE */
    const rl_inputs* in;
    const float* gl;   /* grad_loss given, or NULL */
    float gscale;
    void* ws;
    size_t wsb;
    /* the reference: per row (NONE) or reduced, with their slack; dlogits [N C] and slack */
    const double *lref, *lsl, *lred, *lredsl, *dref, *dsl;
    double* got;       /* scratch [N C + 1] */
    double atol_loss, rtol_loss, atol_dx, rtol_dx;
    int skip_empty;    /* no value comparison for N = 0 */
} rl_case;

/* forward; fused (loss == forward bitwise, dlogits, padding and ignored rows, logits intact);
 * fused with loss NULL (the same dlogits); in place. u->loss and u->dx are left holding the
 * forward loss and the fused dlogits. Returns whether the forward
 * succeeded. */
static inline int rl_check_outputs(const rl_ops* op, const void* o, const rl_case* k, rl_outs* u) {
    float *loss = u->loss, *loss2 = u->loss2;
    void *dx = u->dx, *dx2 = u->dx2;
    const int64_t N = k->N, C = k->C, ld = k->ld;
    const fl_dtype dt = k->dt;
    const int none = k->none;
    const int64_t nl = none ? N : 1;
    const size_t es = tu_dtype_size(dt);
    const size_t xbytes = (size_t)(N * ld) * es;
    const void* x = k->in->x;
    const void* x_in = k->in->x_in;
    const int* ign = k->in->ign;
    double* got = k->got;
    const char* name = k->name;
    char nm[400];
    int fwd_ok;

    /* forward */
    tu_poison(loss, (size_t)(nl + 1) * 4);
    fl_status st = op->forward(loss, x, ld, k->in->targets, k->in->it, N, C, dt, o, k->ws, k->wsb);
    snprintf(nm, sizeof nm, "%s forward", name);
    fwd_ok = CHECK_STATUS(st, FL_OK, nm);
    if (fwd_ok) {
        snprintf(nm, sizeof nm, "%s forward loss", name);
        if (none) {
            for (int64_t i = 0; i < N; i++) got[i] = loss[i];
            if (!k->skip_empty || N > 0) check_close_ex(nm, got, k->lref, k->lsl, N, k->atol_loss, k->rtol_loss);
            int64_t badign = 0;
            for (int64_t i = 0; i < N; i++) badign += ign[i] && tu_f32_bits(loss[i]) != 0;
            CHECK(badign == 0, "%s: %lld ignored rows with a loss other than +0", nm, (long long)badign);
        } else {
            got[0] = loss[0];
            check_close_ex(nm, got, k->lred, k->lredsl, 1, k->atol_loss, k->rtol_loss);
        }
        CHECK(tu_is_poison(loss, 4, nl), "%s: loss[%lld] (past the end) written", nm, (long long)nl);
        CHECK(memcmp(x, x_in, xbytes + 4) == 0, "%s: the logits were modified", nm);
    }

    /* fused, with loss */
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    tu_poison(dx, xbytes + 4);
    st = op->fused(loss2, dx, x, ld, k->in->targets, k->in->it, k->gl, k->gscale, N, C, dt, o, k->ws, k->wsb);
    snprintf(nm, sizeof nm, "%s fused", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        snprintf(nm, sizeof nm, "%s fused loss == forward", name);
        check_bitwise(nm, loss2, loss, (size_t)(nl + 1) * 4);
        for (int64_t i = 0; i < N; i++)
            for (int64_t j = 0; j < C; j++) got[i * C + j] = tu_load(dx, dt, i * ld + j);
        snprintf(nm, sizeof nm, "%s fused dlogits", name);
        if (!k->skip_empty || N > 0) check_close_ex(nm, got, k->dref, k->dsl, N * C, k->atol_dx, k->rtol_dx);
        int64_t badpad = 0, badign = 0;
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = C; j < ld; j++) badpad += !tu_is_poison(dx, es, i * ld + j);
            for (int64_t j = 0; ign[i] && j < C; j++) badign += tu_bits(dx, dt, i * ld + j) != 0;
        }
        badpad += !tu_is_poison((char*)dx + xbytes, 4, 0);
        CHECK(badpad == 0, "%s: %lld padding / past-the-end elements of dlogits written", nm, (long long)badpad);
        CHECK(badign == 0, "%s: %lld elements of ignored rows not +0", nm, (long long)badign);
        CHECK(memcmp(x, x_in, xbytes + 4) == 0, "%s: the logits were modified (out of place)", nm);
    }

    /* fused, loss NULL: the same dlogits */
    tu_poison(dx2, xbytes + 4);
    st = op->fused(NULL, dx2, x, ld, k->in->targets, k->in->it, k->gl, k->gscale, N, C, dt, o, k->ws, k->wsb);
    snprintf(nm, sizeof nm, "%s fused loss=NULL dlogits", name);
    if (CHECK_STATUS(st, FL_OK, nm)) check_bitwise(nm, dx2, dx, xbytes + 4);

    /* in place: dlogits == logits; expected: the first C columns of dx, the padding of x */
    memcpy(dx2, x, xbytes + 4);
    tu_poison(loss2, (size_t)(nl + 1) * 4);
    st = op->fused(loss2, dx2, dx2, ld, k->in->targets, k->in->it, k->gl, k->gscale, N, C, dt, o, k->ws, k->wsb);
    snprintf(nm, sizeof nm, "%s fused in place", name);
    if (CHECK_STATUS(st, FL_OK, nm)) {
        void* want = tu_xmalloc(xbytes + 4);
        memcpy(want, x, xbytes + 4);
        for (int64_t i = 0; i < N; i++)
            memcpy((char*)want + (size_t)(i * ld) * es, (char*)dx + (size_t)(i * ld) * es, (size_t)C * es);
        check_bitwise(nm, dx2, want, xbytes + 4);
        check_bitwise(nm, loss2, loss, (size_t)(nl + 1) * 4);
        free(want);
    }
    return fwd_ok;
}

/* ---- the library's fused gradient against central differences of its own forward ------------- */
/* the op's long-double reference for one row x[C], target y: returns the loss; dl (or NULL): the
 * gradient, ds (or NULL): its slack, *sl (or NULL): the loss's slack (0 where the op has none) */
typedef long double (*rl_ref_fn)(const void* ctx, const long double* x, int64_t C, int64_t y, long double* dl,
                                 long double* ds, long double* sl);
/* the rounding slack of the two fp32 losses lp, lm (slp, slm: the reference's loss slack there),
 * beyond 2^-24 (|lp| + |lm|) */
typedef double (*rl_fd_loss_slack_fn)(double lp, double lm, long double slp, long double slm);

/* ---- the reference's analytic gradient against its own central differences (long double) ----- */

/* the tolerance of |fd - an| (sc = max(1, |x|) of the column) */
typedef double (*rl_fd_tol_fn)(const void* tctx, double fd, double an, long double sc);

/* row i (logits xr[C], restored on return; target y; analytic gradient dl): every column of small
 * rows (C <= 64), 6 of large ones (the target, the ends, three inside). scaled_h: the step is
 * h0 max(1, |x|) and the difference taken over 2 h; else h0, over the rounded (x + h0) - (x - h0) */
static inline void rl_ref_fd_row(const char* name, int64_t i, long double* xr, int64_t C, int64_t y,
                                 const long double* dl, rl_ref_fn ref, const void* ctx, long double h0, int scaled_h,
                                 rl_fd_tol_fn tol_fn, const void* tctx, rl_fd_stats* s) {
    const int64_t cols[6] = {y, 0, C - 1, C / 2, C / 3, C / 5};
    const int64_t ncol = C <= 64 ? C : 6;
    for (int64_t k = 0; k < ncol; k++) {
        const int64_t j = C <= 64 ? k : cols[k];
        if (C > 64 && k > 0 && j == y) continue;
        const long double x0 = xr[j], sc = fabsl(x0) > 1 ? fabsl(x0) : 1, h = scaled_h ? h0 * sc : h0;
        const long double xp = x0 + h, xm = x0 - h;
        xr[j] = xp;
        const long double lp = ref(ctx, xr, C, y, NULL, NULL, NULL);
        xr[j] = xm;
        const long double lm = ref(ctx, xr, C, y, NULL, NULL, NULL);
        xr[j] = x0;
        const double fd = (double)((lp - lm) / (scaled_h ? 2 * h : xp - xm));
        const double an = (double)dl[j];
        const double d = fabs(fd - an);
        const double tol = tol_fn(tctx, fd, an, sc);
        s->n++;
        if (d > s->max) s->max = d;
        if (!(d <= tol)) {
            if (s->bad < 3)
                printf("  %s: reference fd row %lld col %lld (target %lld, x %.9g): analytic %.12g fd %.12g "
                       "(tol %.3g)\n", name, (long long)i, (long long)j, (long long)y, (double)x0, an, fd, tol);
            s->bad++;
        }
    }
}

/* one check over the configuration's rows; returns the number compared */
static inline int64_t rl_ref_fd_report(const char* name, const rl_fd_stats* s) {
    CHECK(s->bad == 0, "%s: %lld of %lld reference finite differences disagree with the analytic gradient "
          "(maxdiff %.3g)", name, (long long)s->bad, (long long)s->n, s->max);
    return s->n;
}

/* the reduced loss of the reference (SUM, or MEAN over D rows: NaN for none) and its slack: the
 * rows' sum + eps N sum |l| (/ D) */
static inline void rl_ref_reduce(fl_reduction red, long double sum, long double sumsl, long double sumabs, int64_t N,
                                 int64_t D, long double denom, double eps, double* lred, double* lredsl) {
    *lred = red == FL_REDUCTION_SUM ? (double)sum : D > 0 ? (double)(sum / denom) : NAN;
    *lredsl = (double)((sumsl + (long double)eps * (long double)N * sumabs) / (D > 0 ? denom : 1)) + 1e-300;
}

/* fp32 logits, C <= 16, N > 0: every column of the first 3 rows not ignored; reduction NONE, g = 1;
 * h = fd_h max(1, |x|), both points rounded to fp32, differenced in double over the exact step:
 * |fd - dx| <= trunc_factor T + (2^-24 (|l+| + |l-|) + loss_slack) / step + 2^-23 |dx| + ds, T the
 * truncation error of that same step on the reference. xr, dl [C] scratch, ds [C] or NULL. Returns
 * the number of differences compared. */
static inline int64_t rl_check_lib_fd(const rl_ops* op, const void* o, const char* name, const rl_inputs* in,
                                      int64_t N, int64_t C, int64_t ld, rl_ref_fn ref, const void* ctx,
                                      rl_fd_loss_slack_fn loss_slack, double fd_h, double trunc_factor,
                                      long double* xr, long double* dl, long double* ds) {
    rl_opts o1;
    rl_opts_copy(op, &o1, o);
    rl_opts_set_reduction(op, &o1, FL_REDUCTION_NONE);
    float* row = tu_xmalloc((size_t)C * 4);
    float* drow = tu_xmalloc((size_t)C * 4);
    double* fg = tu_xmalloc((size_t)(3 * C) * 8);
    double* fv = tu_xmalloc((size_t)(3 * C) * 8);
    double* fs = tu_xmalloc((size_t)(3 * C) * 8);
    char nm[400];
    fl_status st;
    int64_t k = 0, rows = 0;
    for (int64_t i = 0; i < N && rows < 3; i++) {
        if (in->ign[i]) continue;
        rows++;
        const int64_t y = in->t64[i];
        for (int64_t j = 0; j < C; j++) { row[j] = ((const float*)in->x)[i * ld + j]; xr[j] = row[j]; }
        ref(ctx, xr, C, y, dl, ds, NULL);
        float l0;
        st = op->fused(&l0, drow, row, C, &y, FL_INDEX_I64, NULL, 1.0f, 1, C, FL_DTYPE_F32, &o1, NULL, 0);
        CHECK_STATUS(st, FL_OK, "fd: fused row");
        for (int64_t j = 0; j < C; j++, k++) {
            const float x0 = row[j];
            const double h = fd_h * (fabs((double)x0) > 1 ? fabs((double)x0) : 1.0);
            const float xp = (float)((double)x0 + h), xm = (float)((double)x0 - h);
            const double step = (double)xp - (double)xm;
            float lp, lm;
            row[j] = xp;
            st = op->forward(&lp, row, C, &y, FL_INDEX_I64, 1, C, FL_DTYPE_F32, &o1, NULL, 0);
            row[j] = xm;
            fl_status st2 = op->forward(&lm, row, C, &y, FL_INDEX_I64, 1, C, FL_DTYPE_F32, &o1, NULL, 0);
            row[j] = x0;
            CHECK(st == FL_OK && st2 == FL_OK, "fd: forward status %d %d", (int)st, (int)st2);
            long double slp = 0, slm = 0;
            xr[j] = xp;
            const long double rp = ref(ctx, xr, C, y, NULL, NULL, &slp);
            xr[j] = xm;
            const long double rm = ref(ctx, xr, C, y, NULL, NULL, &slm);
            xr[j] = x0;
            const double trunc = fabs((double)((rp - rm) / (long double)step - dl[j]));
            fg[k] = drow[j];
            fv[k] = ((double)lp - (double)lm) / step;
            fs[k] = trunc_factor * trunc +
                    (5.9604644775390625e-8 * (fabs(lp) + fabs(lm)) + loss_slack(lp, lm, slp, slm)) / step +
                    1.1920928955078125e-7 * fabs((double)dl[j]) + (ds ? (double)ds[j] : 0.0) + 1e-300;
        }
    }
    snprintf(nm, sizeof nm, "%s fused dlogits vs fd of the forward", name);
    if (k > 0) check_close_ex(nm, fg, fv, fs, k, 0.0, 0.0);
    free(row); free(drow); free(fg); free(fv); free(fs);
    return k;
}

/* ---- edge cases --------------------------------------------------------------------------------- */
/* every row ignored: MEAN NaN with zero gradient, SUM +0, NONE zeros; logits (NaN) not read.
 * opts[k] has the reduction MEAN, SUM, NONE for k = 0, 1, 2 (and the op's knob as the caller likes) */
static inline void rl_check_all_ignored(const rl_ops* op, const void* const opts[3], void* ws, size_t wsb) {
    float L[64], Dx[64];
    float xv[24];
    for (int k = 0; k < 24; k++) xv[k] = NAN;
    const int64_t y[4] = {-100, -100, -100, -100};
    const fl_reduction reds[3] = {FL_REDUCTION_MEAN, FL_REDUCTION_SUM, FL_REDUCTION_NONE};
    for (int k = 0; k < 3; k++) {
        tu_poison(L, sizeof L);
        tu_poison(Dx, sizeof Dx);
        CHECK_STATUS(op->fused(L, Dx, xv, 6, y, FL_INDEX_I64, NULL, 1.0f, 4, 5, FL_DTYPE_F32, opts[k], ws, wsb), FL_OK,
                     "all ignored");
        int zero = 1, pad = 1;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 6; j++) {
                if (j < 5) zero &= tu_bits(Dx, FL_DTYPE_F32, i * 6 + j) == 0;
                else if (i < 3) pad &= tu_is_poison(Dx, 4, i * 6 + j);
            }
        if (k == 0) CHECK(isnan(L[0]), "all ignored MEAN = %g, want NaN", L[0]);
        else if (k == 1) CHECK(tu_f32_bits(L[0]) == 0, "all ignored SUM = %g, want +0", L[0]);
        else CHECK(tu_f32_bits(L[0]) == 0 && tu_f32_bits(L[1]) == 0 && tu_f32_bits(L[2]) == 0 &&
                   tu_f32_bits(L[3]) == 0, "all ignored NONE = %g %g %g %g", L[0], L[1], L[2], L[3]);
        CHECK(tu_is_poison(L, 4, k < 2 ? 1 : 4), "all ignored %s: loss past the end written", red_name(reds[k]));
        CHECK(zero, "all ignored %s: dlogits not all +0", red_name(reds[k]));
        CHECK(pad, "all ignored %s: dlogits padding written", red_name(reds[k]));
        CHECK_STATUS(op->forward(L, xv, 6, y, FL_INDEX_I64, 4, 5, FL_DTYPE_F32, opts[k], ws, wsb), FL_OK,
                     "all ignored forward");
        CHECK(k == 0 ? isnan(L[0]) : L[0] == 0.0f, "all ignored forward %s = %g", red_name(reds[k]), L[0]);
    }
}

/* N = 0: SUM 0, MEAN NaN, NONE writes nothing; NULL arrays fine. o: the op's options (any
 * reduction: it is set here); ws_head: the workspace of N = 0 for SUM / MEAN */
static inline void rl_check_n0(const rl_ops* op, const void* o, size_t ws_head, void* ws) {
    float L[1];
    const fl_reduction reds[3] = {FL_REDUCTION_SUM, FL_REDUCTION_MEAN, FL_REDUCTION_NONE};
    rl_opts ob;
    for (int k = 0; k < 3; k++) {
        rl_opts_copy(op, &ob, o);
        rl_opts_set_reduction(op, &ob, reds[k]);
        size_t w0 = 7;
        CHECK_STATUS(op->workspace_size(&w0, 0, 5, FL_DTYPE_BF16, &ob), FL_OK, "N=0 size");
        CHECK(w0 == (k == 2 ? 0u : ws_head), "N = 0 %s workspace %zu", red_name(reds[k]), w0);
        L[0] = 5.0f;
        CHECK_STATUS(op->forward(L, NULL, 5, NULL, FL_INDEX_I32, 0, 5, FL_DTYPE_BF16, &ob, k == 2 ? NULL : ws, w0),
                     FL_OK, "N=0 forward");
        if (k == 0) CHECK(tu_f32_bits(L[0]) == 0, "N = 0 SUM = %g", L[0]);
        else if (k == 1) CHECK(isnan(L[0]), "N = 0 MEAN = %g, want NaN", L[0]);
        else CHECK(L[0] == 5.0f, "N = 0 NONE wrote the loss");
        L[0] = 5.0f;
        CHECK_STATUS(op->fused(L, NULL, NULL, 5, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5, FL_DTYPE_F16, &ob,
                               k == 2 ? NULL : ws, w0), FL_OK, "N=0 fused");
        if (k == 0) CHECK(tu_f32_bits(L[0]) == 0, "N = 0 fused SUM = %g", L[0]);
        else if (k == 1) CHECK(isnan(L[0]), "N = 0 fused MEAN = %g, want NaN", L[0]);
        else CHECK(L[0] == 5.0f, "N = 0 fused NONE wrote the loss");
        CHECK_STATUS(op->fused(NULL, NULL, NULL, 5, NULL, FL_INDEX_I64, NULL, 1.0f, 0, 5, FL_DTYPE_F16, &ob,
                               k == 2 ? NULL : ws, w0), FL_OK, "N=0 fused loss NULL");
    }
}

/* ---- bad arguments ------------------------------------------------------------------------------ */
/* N = 2 rows, C = 4 classes, ld = 8: the logits span X[0, 12). Each helper checks a status, a
 * message naming e->fnname, and no output written (ZT_EXPECT); fnname is the forward's unless a
 * helper says otherwise (and is left so). */
typedef struct {
    float X[32], L[8], D[32], G[8];
    int64_t tg[8];
    int32_t t32[8];
    char* ws;          /* the workspace of (2, 4, fp32, o) + 512 bytes */
    size_t wsb;
    const char* fnname;
    const rl_ops* op;
    rl_opts o;         /* the options given */
    rl_opts onone;     /* the same with reduction NONE */
} rl_err;

/* x0: X[k] = (k % 7) / 2 - x0 */
static inline void rl_err_init(rl_err* e, const rl_ops* op, const void* o, float x0) {
    for (int k = 0; k < 32; k++) e->X[k] = (float)(k % 7) * 0.5f - x0;
    for (int k = 0; k < 8; k++) { e->G[k] = 1.0f; e->tg[k] = k % 4; e->t32[k] = k % 4; }
    e->tg[1] = -100;
    e->t32[1] = -100;
    e->op = op;
    rl_opts_copy(op, &e->o, o);
    rl_opts_copy(op, &e->onone, o);
    rl_opts_set_reduction(op, &e->onone, FL_REDUCTION_NONE);
    op->workspace_size(&e->wsb, 2, 4, FL_DTYPE_F32, o);
    e->ws = tu_xmalloc(e->wsb + 512);
    e->fnname = op->forward_name;
}

#define RL_EXPECT_(call_, want, what) ZT_EXPECT(call_, want, what, e->fnname, e->L, e->D)
#define RL_FWD_(loss_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_) \
    e->op->forward(loss_, x_, ld_, t_, it_, N_, C_, dt_, o_, ws_, wsb_)
#define RL_FUS_(loss_, dx_, x_, ld_, t_, gl_, gs_, N_, C_, o_, ws_, wsb_) \
    e->op->fused(loss_, dx_, x_, ld_, t_, I, gl_, gs_, N_, C_, F, o_, ws_, wsb_)
/* the short names of the bad-argument checks for the rl_err *ep: X L D G tg t32 ws wsb, and F (fp32
 * logits), I (int64 targets) */
#define RL_ERR_LOCALS(ep)                                                                               \
    float *X = (ep)->X, *L = (ep)->L, *D = (ep)->D, *G = (ep)->G;                                       \
    int64_t* tg = (ep)->tg;                                                                             \
    int32_t* t32 = (ep)->t32;                                                                           \
    char* ws = (ep)->ws;                                                                                \
    const size_t wsb = (ep)->wsb;                                                                       \
    const fl_dtype F = FL_DTYPE_F32;                                                                    \
    const fl_index_dtype I = FL_INDEX_I64;                                                              \
    (void)X; (void)L; (void)D; (void)G; (void)tg; (void)t32; (void)ws; (void)wsb; (void)F; (void)I
#define RL_ERR_LOCALS_                                                                                  \
    RL_ERR_LOCALS(e);                                                                                   \
    const void* o = &e->o;                                                                              \
    const void* ob = &e->onone;                                                                         \
    (void)o; (void)ob

/* forward: the arguments (sizes, NULL arrays, dtypes, opts NULL) */
static inline void rl_err_forward_args(rl_err* e) {
    RL_ERR_LOCALS_;
    RL_EXPECT_(RL_FWD_(L, X, INT64_MAX / 4, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "N*ld overflow");
    RL_EXPECT_(RL_FWD_(NULL, X, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL");
    CHECK(strstr(fl_last_error(), "loss") != NULL, "loss message: %s", fl_last_error());
    RL_EXPECT_(RL_FWD_(NULL, NULL, 8, NULL, I, 0, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss NULL, N = 0");
    RL_EXPECT_(RL_FWD_(L, NULL, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "logits NULL");
    CHECK(strstr(fl_last_error(), "logits") != NULL, "logits message: %s", fl_last_error());
    RL_EXPECT_(RL_FWD_(L, X, 8, NULL, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "targets NULL");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "targets message: %s", fl_last_error());
    RL_EXPECT_(RL_FWD_(L, NULL, 8, NULL, I, 0, 4, F, o, ws, wsb), FL_OK, "N = 0, NULL arrays");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, (fl_dtype)7, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dtype 7");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, (fl_index_dtype)5, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "index_dtype 5");
    RL_EXPECT_(RL_FWD_(L, X, 8, t32, FL_INDEX_I32, 2, 4, F, o, ws, wsb), FL_OK, "int32 targets");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, FL_DTYPE_BF16, o, ws, wsb), FL_OK, "bf16 logits");
    RL_EXPECT_(RL_FWD_(L, NULL, 8, tg, I, 2, 4, F, NULL, ws, wsb), FL_ERR_INVALID_ARGUMENT, "opts NULL, logits NULL");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, NULL, ws, wsb), FL_OK, "opts NULL");
}

/* forward: bad reductions and struct sizes */
static inline void rl_err_forward_opts(rl_err* e) {
    RL_ERR_LOCALS_;
    rl_opts oc;
    const int reds[3] = {7, -1, 3};   /* 3 = FL_REDUCTION_BATCHMEAN (distillation only) */
    for (int k = 0; k < 3; k++) {
        rl_opts_copy(e->op, &oc, o);
        rl_opts_set_reduction(e->op, &oc, (fl_reduction)reds[k]);
        RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "bad reduction");
        CHECK(strstr(fl_last_error(), "reduction") != NULL, "reduction %d message: %s", reds[k], fl_last_error());
    }
    rl_opts_copy(e->op, &oc, o);
    rl_opts_set_struct_size(e->op, &oc, e->op->opts_size - 8);
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size - 8");
    CHECK(strstr(fl_last_error(), "struct_size") != NULL, "struct_size message: %s", fl_last_error());
    rl_opts_set_struct_size(e->op, &oc, 0);
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size 0");
    rl_opts_set_struct_size(e->op, &oc, e->op->opts_size + 8);
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "struct_size + 8");
}

/* forward: alignment */
static inline void rl_err_forward_align(rl_err* e) {
    RL_ERR_LOCALS_;
    RL_EXPECT_(RL_FWD_(L, (char*)X + 2, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fp32 logits misaligned");
    CHECK(strstr(fl_last_error(), "aligned") != NULL, "alignment message: %s", fl_last_error());
    RL_EXPECT_(RL_FWD_(L, (char*)X + 2, 8, tg, I, 2, 4, FL_DTYPE_F16, o, ws, wsb), FL_OK, "fp16: 2-byte aligned fine");
    RL_EXPECT_(RL_FWD_(L, (char*)X + 1, 8, tg, I, 2, 4, FL_DTYPE_BF16, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "bf16 logits misaligned");
    RL_EXPECT_(RL_FWD_(L, X, 8, (char*)tg + 4, I, 1, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "int64 targets misaligned");
    RL_EXPECT_(RL_FWD_(L, X, 8, (char*)t32 + 2, FL_INDEX_I32, 1, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "int32 targets misaligned");
    RL_EXPECT_(RL_FWD_((float*)((char*)L + 2), X, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss misaligned");
}

/* forward: the workspace is CPU-unaligned / unused for NONE; aliasing */
static inline void rl_err_forward_alias(rl_err* e) {
    RL_ERR_LOCALS_;
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, o, ws + 1, wsb), FL_OK, "CPU: unaligned workspace fine");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, ob, NULL, 0), FL_OK, "NONE: no workspace");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, ob, (void*)X, 4096), FL_OK, "NONE: the workspace is ignored (no overlap)");
    RL_EXPECT_(RL_FWD_(X + 3, X, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps logits");
    CHECK(strstr(fl_last_error(), "overlaps logits") != NULL, "loss / logits message: %s", fl_last_error());
    RL_EXPECT_(RL_FWD_(X + 5, X, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss in the padding between rows");
    RL_EXPECT_(RL_FWD_(X + 11, X, 8, tg, I, 2, 4, F, ob, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss [N] overlaps logits end");
    RL_EXPECT_(RL_FWD_(X + 12, X, 8, tg, I, 2, 4, F, ob, ws, wsb), FL_OK, "loss [N] right after the logits");
    RL_EXPECT_(RL_FWD_((float*)(tg + 1), X, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps targets");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "loss / targets message: %s", fl_last_error());
    RL_EXPECT_(RL_FWD_((float*)(ws + 300), X, 8, tg, I, 2, 4, F, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "loss overlaps workspace");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, o, (void*)X, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps logits");
    RL_EXPECT_(RL_FWD_(L, X, 8, tg, I, 2, 4, F, o, (void*)tg, wsb), FL_ERR_INVALID_ARGUMENT, "workspace overlaps targets");
}

/* out-of-range targets: the first bad row is named, nothing written (forward, fused, in place) */
static inline void rl_err_out_of_range(rl_err* e) {
    RL_ERR_LOCALS_;
    rl_opts oi;
    int64_t tb[8];
    int32_t tb32[8];
    memcpy(tb, tg, sizeof tb);
    memcpy(tb32, t32, sizeof tb32);
    tb[1] = 4;   /* C */
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target C");
    CHECK(strstr(fl_last_error(), "targets[1] = 4") != NULL, "target C message: %s", fl_last_error());
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, ob, NULL, 0), FL_ERR_TARGET_OUT_OF_RANGE, "target C (NONE)");
    tb[1] = -7;
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target -7");
    CHECK(strstr(fl_last_error(), "targets[1] = -7") != NULL, "target -7 message: %s", fl_last_error());
    tb[0] = -1;
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target -1 first");
    CHECK(strstr(fl_last_error(), "targets[0] = -1") != NULL, "first bad row: %s", fl_last_error());
    tb[0] = 0;
    rl_opts_copy(e->op, &oi, o);
    rl_opts_set_ignore_index(e->op, &oi, -7);   /* -7 is now ignored */
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, &oi, ws, wsb), FL_OK, "ignore_index -7");
    tb32[0] = 1000;
    RL_EXPECT_(RL_FWD_(L, X, 8, tb32, FL_INDEX_I32, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "int32 target 1000");
    CHECK(strstr(fl_last_error(), "targets[0] = 1000") != NULL, "int32: %s", fl_last_error());
    tb32[0] = 255;
    RL_EXPECT_(RL_FWD_(L, X, 8, tb32, FL_INDEX_I32, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target 255");
    rl_opts_set_ignore_index(e->op, &oi, 255);
    tb32[1] = 2;
    RL_EXPECT_(RL_FWD_(L, X, 8, tb32, FL_INDEX_I32, 2, 4, F, &oi, ws, wsb), FL_OK, "ignore_index 255");
    tb[1] = ((int64_t)1 << 32) + 1;   /* truncates to 1 */
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target 2^32 + 1");
    tb[1] = (int64_t)1 << 40;
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE, "target 2^40");
    CHECK(strstr(fl_last_error(), "targets[1] = 1099511627776") != NULL, "2^40: %s", fl_last_error());
    rl_opts_set_ignore_index(e->op, &oi, (int64_t)1 << 40);
    RL_EXPECT_(RL_FWD_(L, X, 8, tb, I, 2, 4, F, &oi, ws, wsb), FL_OK, "ignore_index 2^40 (int64 targets)");
    e->fnname = e->op->fused_name;
    RL_EXPECT_(e->op->fused(L, D, X, 8, tb, I, G, 1.0f, 2, 4, F, o, ws, wsb), FL_ERR_TARGET_OUT_OF_RANGE,
           "fused target out of range");
    RL_EXPECT_(e->op->fused(NULL, D, X, 8, tb, I, NULL, 1.0f, 2, 4, F, o, ws, wsb),
           FL_ERR_TARGET_OUT_OF_RANGE, "fused loss NULL, target out of range");
    memcpy(D, X, sizeof e->X);   /* in place: the logits must survive the refusal */
    {
        const fl_status st = e->op->fused(L, D, D, 8, tb, I, G, 1.0f, 2, 4, F, o, ws, wsb);
        CHECK_STATUS(st, FL_ERR_TARGET_OUT_OF_RANGE, "in place, target out of range");
        CHECK(memcmp(D, X, sizeof e->X) == 0, "in place, target out of range: the logits were written");
    }
    e->fnname = e->op->forward_name;
}

/* fused: the arguments (NULL arrays, grad_scale, workspace, sizes) */
static inline void rl_err_fused_args(rl_err* e) {
    RL_ERR_LOCALS_;
    e->fnname = e->op->fused_name;
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_OK, "valid fused");
    RL_EXPECT_(RL_FUS_(NULL, D, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_OK, "fused loss NULL");
    RL_EXPECT_(RL_FUS_(L, NULL, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits NULL");
    CHECK(strstr(fl_last_error(), "dlogits") != NULL, "dlogits message: %s", fl_last_error());
    RL_EXPECT_(RL_FUS_(L, NULL, NULL, 8, NULL, NULL, 1.0f, 0, 4, o, ws, wsb), FL_OK, "fused N = 0, NULL arrays");
    RL_EXPECT_(RL_FUS_(L, D, NULL, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused logits NULL");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, NULL, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused targets NULL");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, NAN, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale NaN");
    CHECK(strstr(fl_last_error(), "grad_scale") != NULL, "grad_scale message: %s", fl_last_error());
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, INFINITY, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale inf");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, -INFINITY, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "grad_scale -inf");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 0.0f, 2, 4, o, ws, wsb), FL_OK, "grad_scale 0");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, 2, 4, o, ws, 100), FL_ERR_INSUFFICIENT_WORKSPACE, "fused small workspace");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, 2, 4, o, NULL, wsb), FL_ERR_INVALID_ARGUMENT, "fused workspace NULL");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, 2, 4, ob, NULL, 0), FL_OK, "fused NONE: no workspace");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, -3, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused N < 0");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, 2, 0, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused C = 0");
    RL_EXPECT_(RL_FUS_(L, D, X, 3, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused ld < C");
}

/* fused: alignment and aliasing; in place allowed */
static inline void rl_err_fused_alias(rl_err* e) {
    RL_ERR_LOCALS_;
    e->fnname = e->op->fused_name;
    RL_EXPECT_(RL_FUS_(L, (char*)D + 2, X, 8, tg, G, 1.0f, 1, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits misaligned");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, (const float*)((const char*)G + 2), 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "grad_loss misaligned");
    RL_EXPECT_(RL_FUS_((float*)((char*)L + 1), D, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "fused loss misaligned");
    RL_EXPECT_(RL_FUS_(L, X + 1, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "dlogits partially overlaps logits");
    CHECK(strstr(fl_last_error(), "in place") != NULL, "partial overlap message: %s", fl_last_error());
    RL_EXPECT_(RL_FUS_(L, X + 8, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits one row off");
    RL_EXPECT_(RL_FUS_(L, X + 12, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_OK, "dlogits right after the logits");
    RL_EXPECT_(RL_FUS_(L, (float*)tg, X, 8, tg, G, 1.0f, 1, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits == targets");
    CHECK(strstr(fl_last_error(), "targets") != NULL, "dlogits / targets message: %s", fl_last_error());
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, D + 11, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "dlogits overlaps grad_loss");
    CHECK(strstr(fl_last_error(), "grad_loss") != NULL, "dlogits / grad_loss message: %s", fl_last_error());
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, D + 12, 1.0f, 2, 4, o, ws, wsb), FL_OK, "grad_loss right after dlogits");
    RL_EXPECT_(RL_FUS_(D + 5, D, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps dlogits");
    CHECK(strstr(fl_last_error(), "loss") != NULL, "loss / dlogits message: %s", fl_last_error());
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, L, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps grad_loss");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, L + 1, 1.0f, 2, 4, ob, NULL, 0), FL_ERR_INVALID_ARGUMENT,
           "NONE: loss [N] overlaps grad_loss [N]");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, L + 2, 1.0f, 2, 4, ob, NULL, 0), FL_OK, "NONE: grad_loss right after loss");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, L + 1, 1.0f, 2, 4, o, ws, wsb), FL_OK, "MEAN: loss [1], grad_loss [1] adjacent");
    RL_EXPECT_(RL_FUS_(L, (float*)(ws + 256), X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "dlogits overlaps workspace");
    CHECK(strstr(fl_last_error(), "workspace") != NULL, "dlogits / workspace message: %s", fl_last_error());
    RL_EXPECT_(RL_FUS_(L, (float*)(ws + 256), X, 8, tg, G, 1.0f, 2, 4, ob, ws, wsb), FL_OK,
           "NONE: dlogits in the (unused) workspace");
    RL_EXPECT_(RL_FUS_((float*)ws, D, X, 8, tg, G, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT, "loss overlaps workspace");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, (const float*)ws, 1.0f, 2, 4, o, ws, wsb), FL_ERR_INVALID_ARGUMENT,
           "workspace overlaps grad_loss");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, X, 1.0f, 2, 4, o, ws, wsb), FL_OK, "grad_loss may alias the logits (inputs)");
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, NULL, 1.0f, 2, 4, o, ws, wsb), FL_OK, "grad_loss NULL");
    {   /* in place is allowed (D used as the logits) */
        memcpy(D, X, sizeof e->X);
        const fl_status st = RL_FUS_(L, D, D, 8, tg, G, 1.0f, 2, 4, o, ws, wsb);
        CHECK_STATUS(st, FL_OK, "in place dlogits == logits");
        CHECK(fl_last_error()[0] == 0, "in place: last error \"%s\"", fl_last_error());
    }
}

/* fused: BATCHMEAN (the distillation's only) and a bad struct_size; fnname the fused */
static inline void rl_err_fused_opts(rl_err* e) {
    RL_ERR_LOCALS_;
    rl_opts oc;
    e->fnname = e->op->fused_name;
    rl_opts_copy(e->op, &oc, o);
    rl_opts_set_reduction(e->op, &oc, (fl_reduction)3);
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused BATCHMEAN");
    rl_opts_copy(e->op, &oc, o);
    rl_opts_set_struct_size(e->op, &oc, 8);
    RL_EXPECT_(RL_FUS_(L, D, X, 8, tg, G, 1.0f, 2, 4, &oc, ws, wsb), FL_ERR_INVALID_ARGUMENT, "fused struct_size");
}

/* the workspace size query: bytes NULL, N < 0, a bad dtype / struct_size / reduction, overflow,
 * then *b (77, and left so by the caller's own bad calls) unwritten and the valid size: want
 * (MEAN, N = 2). fnname the query */
static inline void rl_err_workspace_size(rl_err* e, size_t* b, size_t want) {
    const fl_dtype F = FL_DTYPE_F32;
    rl_opts ob;
    e->fnname = e->op->workspace_size_name;
    RL_EXPECT_(e->op->workspace_size(NULL, 2, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "bytes NULL");
    RL_EXPECT_(e->op->workspace_size(b, -1, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "size N < 0");
    RL_EXPECT_(e->op->workspace_size(b, 2, 4, (fl_dtype)9, NULL), FL_ERR_INVALID_ARGUMENT, "size dtype");
    rl_opts_copy(e->op, &ob, &e->o);
    rl_opts_set_struct_size(e->op, &ob, 3);
    RL_EXPECT_(e->op->workspace_size(b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size struct_size");
    rl_opts_copy(e->op, &ob, &e->o);
    rl_opts_set_reduction(e->op, &ob, (fl_reduction)9);
    RL_EXPECT_(e->op->workspace_size(b, 2, 4, F, &ob), FL_ERR_INVALID_ARGUMENT, "size reduction 9");
    RL_EXPECT_(e->op->workspace_size(b, INT64_MAX, 4, F, NULL), FL_ERR_INVALID_ARGUMENT, "size overflow");
    CHECK(strstr(fl_last_error(), "overflow") != NULL, "overflow message: %s", fl_last_error());
    CHECK(*b == 77, "bytes written on error (%zu)", *b);
    RL_EXPECT_(e->op->workspace_size(b, 2, 4, F, NULL), FL_OK, "size valid");
    CHECK(*b == want, "size valid: %zu", *b);
}

#undef RL_ERR_LOCALS_
#undef RL_FUS_
#undef RL_FWD_
#undef RL_EXPECT_

#endif /* FL_TEST_ROWLOSS_TEST_UTIL_H */
