/* internal.h — shared internals of fusedloss (not installed).
 *
 * fl__fail() records a message in the thread-local error buffer and returns the status;
 * FL_CHECK() forwards a non-OK status. Validation shared by the CPU and CUDA backends
 * lives in src/common/validate.c so CI's CPU tests exercise the checks the CUDA path uses.
 */
#ifndef FL_INTERNAL_H
#define FL_INTERNAL_H

#include "fusedloss.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#  define FL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#  define FL_PRINTF(a, b)
#endif

/* Record "fmt..." as this thread's last error and return `status`. */
fl_status fl__fail(fl_status status, const char* fmt, ...) FL_PRINTF(2, 3);
/* Clear this thread's last error (called on entry to every public function). */
void fl__clear_error(void);

#define FL_CHECK(expr)                          \
    do {                                        \
        fl_status fl__st_ = (expr);             \
        if (fl__st_ != FL_OK) return fl__st_;   \
    } while (0)

/* ---- cross-entropy: resolved options and shared validation ---------------------------- */

typedef enum { FL__PASS_FORWARD = 0, FL__PASS_BACKWARD = 1, FL__PASS_FUSED = 2 } fl__pass;

typedef struct {
    int64_t      ignore_index;
    fl_reduction reduction;
    float        label_smoothing;
    const float* weight;
    float        z_loss;
    float        softcap;
    float        logit_scale;
    int32_t*     error_flag;
    const float* logit_offset;   /* version 2 fields (NULL for a version-1 struct) */
    float*       target_prob;
} fl__ce_params;

/* Bytes per logit of a dtype (0 if unknown). */
size_t fl__dtype_size(fl_dtype dtype);
/* Arguments of fl_scale_rows_*: shared by both backends. */
fl_status fl__scale_validate(const char* fn, const void* x, int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                             const float* g);
size_t fl__index_size(fl_index_dtype dtype);

/* Workspace bytes the CE entry points require (same for both backends). Layout (CUDA):
 *   [0, 256)                     header: denominators and class-weight sum
 *   [256, 256 + align(16*N))     per-row partial losses (two values per row)
 *   then align(16*N*chunks)      per-(row, chunk) statistics: max, sum-exp, sum w z, target logit */
size_t fl__ce_workspace_bytes(int64_t N, int64_t V, fl_dtype dtype);
/* Upper bound of the chunks per row of the CUDA row kernels (sizes the workspace). */
int64_t fl__ce_chunks(int64_t V, size_t esize);
/* The least size of the statistics region above: the two-stage setup / reduce kernels of a big
 * batch keep 3 doubles per CTA there (CE_STAGE_CTAS = 128 in src/cuda/cross_entropy.cu). */
#define FL__CE_STAGE_SCRATCH 3072

/* Byte range [lo, hi) of a buffer (empty when p is NULL or n == 0) and whether two overlap: the
 * aliasing checks of every validator. */
typedef struct { uintptr_t lo, hi; } fl__range;
fl__range fl__mkrange(const void* p, size_t n);
int fl__overlap(fl__range a, fl__range b);
/* The index of the first of the n ranges others[] that `a` overlaps, or -1. */
int fl__first_overlap(fl__range a, const fl__range* others, int n);
/* The [N, C, d] layout checks of sections 12-13 (N >= 0, C >= 1, d >= 1, C * d without overflow,
 * ld >= C * d), messages naming fn. */
fl_status fl__check_ncd(const char* fn, int64_t N, int64_t C, int64_t d, int64_t ld);

/* The workspace checks of every entry point: enough bytes (FL_ERR_INSUFFICIENT_WORKSPACE, checked
 * first), non-NULL, 256-byte aligned when is_cuda; hint (or NULL) names the size query. */
fl_status fl__check_workspace(const char* fn, int is_cuda, const void* workspace, size_t workspace_bytes,
                              size_t need, const char* hint);

/* dtype and index_dtype known and N rows of stride ld elements addressable in 64 bits (the checks
 * every logits-taking entry point starts with). */
fl_status fl__check_types_extent(const char* fn, int64_t N, int64_t ld, fl_dtype dtype, fl_index_dtype index_dtype);

/* Validate every argument of a cross-entropy entry point (either backend) and resolve the
 * options into *p. Pointers that a pass does not use must be given as NULL by the caller
 * wrapper (e.g. dlogits for forward). `is_cuda` only changes which checks are possible:
 * on the CPU the class weights' values are checked (they are host memory). Targets are
 * range-checked by the CPU backend itself (it reads them); the CUDA kernels flag them. */
fl_status fl__ce_validate(const char* fn, fl__pass pass, int is_cuda,
                          const float* loss, const float* lse, const void* dlogits,
                          const void* logits, const void* targets, const float* grad_loss,
                          int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                          fl_index_dtype index_dtype, const fl_ce_options* opts,
                          const void* workspace, size_t workspace_bytes, fl__ce_params* p);

/* The options part of fl__ce_validate, shared with fl__lce_validate: checks every field of
 * *opts (NULL = FL_CE_OPTIONS_INIT) and fills *p. `name` is the argument's name in messages
 * ("opts" for cross-entropy, "ce_opts" for linear cross-entropy). */
fl_status fl__ce_resolve_options(const char* fn, const char* name, const fl_ce_options* opts,
                                 fl__ce_params* p);
/* Class weights finite and >= 0 (CPU only: is_cuda = 1 or weight NULL checks nothing).
 * `name` is how messages call the array ("weight", "ce_opts->weight"). */
fl_status fl__ce_check_weights(const char* fn, const char* name, const float* weight, int64_t V,
                               int is_cuda);
/* Per-class logit offsets finite (CPU only, as fl__ce_check_weights). */
fl_status fl__ce_check_offset(const char* fn, const char* name, const float* offset, int64_t V, int is_cuda);
/* struct_size of an fl_ce_options this version accepts (the current one or version 1). */
int fl__ce_options_size_ok(size_t struct_size);

/* ---- cross-entropy CPU backend pieces shared with linear cross-entropy (src/cpu/cross_entropy.c) */

/* Batch-wide quantities the per-row work needs: D_w = sum of w_t over non-ignored rows, D_n =
 * their count (the MEAN denominators), W = sum_j w_j (V without class weights). */
typedef struct {
    double D_w, D_n, W;
} fl__ce_denoms;

/* Checks the targets of rows [0, N) (the first one not in [0, V) and not ignore_index is
 * FL_ERR_TARGET_OUT_OF_RANGE, naming fn and the row) and computes *d. Writes nothing else. */
fl_status fl__ce_cpu_denoms(const char* fn, const void* targets, fl_index_dtype index_dtype, int64_t N,
                            int64_t V, const fl__ce_params* p, fl__ce_denoms* d);

/* The per-row work of fl_cross_entropy_{forward,backward,fused}_cpu for rows [r0, r0 + C) of a
 * batch whose denominators *d were computed over the whole batch (fl__ce_cpu_denoms).
 * logits / dlogits point at row r0 (row r0 + k at + k*ld elements; dlogits may equal logits);
 * targets, loss (NONE only), lse_out, lse_in, grad_loss (NONE only) and part are indexed by the
 * absolute row. part[2i], part[2i+1]: row i's CE and z-loss terms (forward/fused; 0 for ignored
 * rows), for fl__ce_cpu_reduce. Targets must have been checked. OpenMP over the rows. */
void fl__ce_cpu_rows(fl__pass pass, const fl__ce_params* p, const fl__ce_denoms* d, float* loss,
                     float* lse_out, void* dlogits, const void* logits, int64_t ld, const void* targets,
                     fl_index_dtype index_dtype, const float* lse_in, const float* grad_loss,
                     float grad_scale, int64_t r0, int64_t C, int64_t V, fl_dtype dtype, double* part);

/* loss[0] from the N rows' part[] in row order (thread-count and chunk independent); nothing
 * for reduction NONE. */
void fl__ce_cpu_reduce(float* loss, const double* part, int64_t N, const fl__ce_params* p,
                       const fl__ce_denoms* d);

/* Row-level pieces under fl__ce_cpu_rows, shared with the vocab-parallel steps
 * (src/cpu/vocab_parallel.c), which run them on a vocabulary shard: columns [col0, col0 + n) of
 * the global vocabulary [0, V), element `off` of the shard's buffer being column col0 (the whole
 * row is col0 = 0, n = V). t is the GLOBAL target (checked: in [0, V)); weights are indexed
 * globally (p->weight[col0 + j]). Formulas in the header comment of src/cpu/cross_entropy.c. */
int64_t fl__ce_load_target(const void* targets, fl_index_dtype index_dtype, int64_t i);
/* Pass 1 over the slice: online max *m and sum-exp *s (relative to *m; m = -inf, s = 0 for an
 * all-(-inf) slice), z_t (0 unless t is in the slice) and sum_j w_j z_j. Double throughout. */
void fl__ce_cpu_row_partial(const void* logits, fl_dtype dtype, int64_t off, int64_t col0, int64_t n, int64_t t,
                            const fl__ce_params* p, double* m, double* s, double* zt, double* wz);
/* lse = m + log s (-inf when m = -inf). */
double fl__ce_lse(double m, double s);
/* The row's CE + smoothing term *a and z-loss term *b from its lse, z_t and sum w z (V, W global). */
void fl__ce_row_terms(const fl__ce_params* p, int64_t V, double W, int64_t t, double lse, double zt, double wz,
                      double* a, double* b);
/* Upstream gradient of row i: g_a for the CE part, g_b for z-loss (MEAN: divided by D_w, D_n). */
void fl__ce_row_upstream(const fl__ce_params* p, const fl__ce_denoms* d, const float* grad_loss, float grad_scale,
                         int64_t i, double* g_a, double* g_b);
/* dlogits of the slice (may alias logits), from the row's lse and W = d->W. */
void fl__ce_cpu_row_grad(void* dlogits, const void* logits, fl_dtype dtype, int64_t off, int64_t col0, int64_t n,
                         int64_t V, int64_t t, double lse, double W, double g_a, double g_b,
                         const fl__ce_params* p);
/* n zeros (an ignored row's gradient). */
void fl__ce_cpu_row_zero(void* dlogits, fl_dtype dtype, int64_t off, int64_t n);

/* Element conversion of the CPU backend: dst[k] = element off + k of base (dtype), exactly;
 * and the store, double -> fp32 (RN) -> dtype (RN), the rounding every CPU output uses. */
void fl__cpu_load_row(double* dst, const void* base, fl_dtype dtype, int64_t off, int64_t n);
void fl__cpu_store_row(void* base, fl_dtype dtype, int64_t off, const double* src, int64_t n);

/* ---- vocab-parallel cross-entropy: shared validation (src/common/vp_validate.c) ------------- */

/* Workspace bytes step 3 (combine) requires: section 5's for N rows and V classes with the
 * smallest (16-bit) dtype, so that any dtype's fl_cross_entropy_workspace_size() answer passes. */
size_t fl__vp_combine_workspace_bytes(int64_t N, int64_t V);

/* Validate every argument of a vocab-parallel shard step (either backend) and resolve the options
 * into *p. backward = 0: step 1 (local stats; output `stats`, pass dlogits/lse/grad_loss NULL);
 * backward = 1: step 4 (output dlogits; stats NULL). Checks sizes (N >= 0, V_local >= 1,
 * ld >= V_local, V >= 1, 0 <= vocab_start, vocab_start + V_local <= V), dtypes, options,
 * grad_scale (step 4), NULLs, the GLOBAL class weights [V] (CPU), the workspace (section 5's
 * for N, V_local; 256-byte aligned when is_cuda) and aliasing (outputs vs every input and the
 * workspace; dlogits == logits allowed). Targets are range-checked by the backend. */
fl_status fl__vp_validate_shard(const char* fn, int backward, int is_cuda, const float* stats, const void* dlogits,
                                const void* logits, const void* targets, const float* lse, const float* grad_loss,
                                float grad_scale, int64_t N, int64_t V_local, int64_t ld, int64_t vocab_start,
                                int64_t V, fl_dtype dtype, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                const void* workspace, size_t workspace_bytes, fl__ce_params* p);

/* The same for step 3 (combine): N >= 0, V >= 1, k >= 1, index dtype, options, NULLs (loss always;
 * lse, gathered, targets when N > 0), class weights, workspace (fl__vp_combine_workspace_bytes),
 * aliasing of loss and lse with each other and every input. */
fl_status fl__vp_validate_combine(const char* fn, int is_cuda, const float* loss, const float* lse,
                                  const float* gathered, int k, const void* targets, int64_t N, int64_t V,
                                  fl_index_dtype index_dtype, const fl_ce_options* opts, const void* workspace,
                                  size_t workspace_bytes, fl__ce_params* p);

/* Step 1's per-row stats (m, s, wz, zt) of the slice [col0, col0 + n) of a row at `off` (the CPU
 * backend's formula and fp32 rounding: s relative to the stored m; -inf, 0 for an all -inf
 * slice; wz 0 without label smoothing). Shared by the logits and the linear variants. */
void fl__vp_cpu_row_stats(float* st, const void* logits, fl_dtype dtype, int64_t off, int64_t col0, int64_t n,
                          int64_t t, const fl__ce_params* p);

/* ---- GeLU: shared validation and the CUDA work plan (src/common/gelu_validate.c) --------- */

/* How the CUDA backend cuts a GeLU call (pure integer arithmetic, so that the workspace size
 * query and the CUDA launcher agree; also compiled into CPU-only builds).
 * The [N, F] problem is seen as a matrix of `rows` virtual rows of `width` positions, each
 * virtual row being `group` consecutive real rows (group = 1 unless the flat path is taken);
 * the column of position p is p mod F. A CTA of tx x ty threads owns `tx` vectors of `vec`
 * positions (a slab) times `rpb` virtual rows (a row block). */
typedef enum { FL__GELU_ROWS = 0,   /* every row of every matrix 16-byte aligned: vectors   */
               FL__GELU_FLAT = 1,   /* contiguous (ld == F), aligned bases, F*esize % 16 != 0 */
               FL__GELU_SCALAR = 2  /* anything else: one element per access              */
} fl__gelu_path;

#define FL__GELU_COUNTER_BYTES 4096  /* zeroed slab counters at the start of a CUDA workspace */
#define FL__GELU_MAX_COUNTERS (FL__GELU_COUNTER_BYTES / 4)
#define FL__GELU_UNROLL 4            /* virtual rows in flight per thread (kernel unroll)    */

typedef struct {
    fl__gelu_path path;
    int     vec;        /* elements per access (16 / esize, or 1) */
    int     group;      /* real rows per virtual row */
    int     tx, ty;     /* CTA shape */
    int64_t rows;       /* virtual rows = ceil(N / group) */
    int64_t width;      /* positions of a full virtual row = group * F */
    int64_t last;       /* positions of the last virtual row */
    int64_t wvec;       /* vector columns = ceil(width / vec) */
    int64_t slabs;      /* grid.x = ceil(wvec / tx) */
    int64_t rpb;        /* virtual rows per row block */
    int64_t nb;         /* row blocks = grid.y */
    int     finish;     /* dbias total: 0 none, 1 last CTA of each slab, 2 second kernel,
                           4 second kernel over float4 columns, launched with PDL (short row
                           blocks: many CTAs, each writes its partials and exits) */
    size_t  ws_bytes;   /* CUDA workspace bytes this plan needs (0 without dbias) */
} fl__gelu_plan;

/* The plan for the launch knobs of src/cuda/gelu.cu (unroll = rows in flight per thread, tx =
 * threads along a row, target_ctas; with dbias target_ctas <= FL__GELU_DBIAS_CTAS_MAX).
 * dbias_rpb > 0 (with dbias, vector paths but FLAT): short row blocks of about dbias_rpb rows
 * (whole unrolled steps; at most FL__GELU_DBIAS_NB_MAX blocks) summed by a second kernel
 * (finish 4, or 2 when the row width is not a multiple of 4); target_ctas is then unused.
 * sum_kernel (long blocks): finish 4 instead of 1 where the width allows (the same workspace). */
#define FL__GELU_DBIAS_CTAS_MAX 2048
#define FL__GELU_DBIAS_NB_MAX 256
#define FL__GELU_DBIAS_RPB_MAX 256
void fl__gelu_make_plan_ex(fl__gelu_plan* p, fl__gelu_path path, int64_t N, int64_t F, size_t esize,
                           int with_dbias, int unroll, int tx, int64_t target_ctas, int dbias_rpb,
                           int sum_kernel);
/* Row blocks of the CPU backend's dbias (fixed: thread-count independent) and its bytes. */
int64_t fl__gelu_cpu_blocks(int64_t N);
size_t fl__gelu_workspace_bytes(int64_t N, int64_t F, fl_dtype dtype);

/* Validate every argument of a GeLU entry point. Forward: out = y, dy = NULL, dbias = NULL,
 * ld_dy = ld_x. Backward: out = dx. Checks sizes, dtypes, approx, NULLs, element alignment,
 * 64-bit overflow, aliasing (only out == x / out == dy with equal strides), workspace size
 * (backward with dbias) and, when is_cuda, the workspace's 256-byte alignment. */
fl_status fl__gelu_validate(const char* fn, int backward, int is_cuda, const void* out,
                            const void* dbias, const void* dy, const void* x, const void* bias,
                            int64_t N, int64_t F, int64_t ld_out, int64_t ld_dy, int64_t ld_x,
                            fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                            const void* workspace, size_t workspace_bytes);


/* ---- linear cross-entropy: the chunk plan and shared validation (src/common/lce_validate.c) -- */

#define FL__LCE_BLAS_BYTES ((size_t)8 << 20)  /* cuBLASLt workspace inside ours */
#define FL__LCE_ROW_ALIGN 64                  /* chunk_rows multiple (unless N is smaller)   */
#define FL__LCE_V_ALIGN 64                    /* logits chunk row stride: V rounded up to this */

/* How a linear-CE call is cut (pure integer arithmetic: the size query, the CPU backend and the
 * CUDA backend agree). Byte offsets into the workspace, each 256-aligned; a region a backend
 * does not use may still be reserved. */
typedef struct {
    int64_t chunk_rows;   /* rows per chunk (>= 1; == N when N <= chunk_rows) */
    int64_t chunks;       /* ceil(N / chunk_rows) (0 when N == 0) */
    int64_t ldl;          /* row stride (elements) of the logits chunk: V rounded up to 64 */
    int     accum_fp32;   /* 1: an fp32 [V, H] dweight accumulator (16-bit wgrad_dtype, FP32/AUTO) */
    size_t  off_ce;       /* CE workspace: header and per-row partials of all N rows, the
                             statistics region for one chunk of rows (see lce_validate.c) */
    size_t  off_logits;   /* chunk_rows * ldl * esize(dtype): logits, then dlogits in place */
    size_t  off_acc;      /* accum_fp32: 4 * V * H bytes, else 0 bytes */
    size_t  off_bacc;     /* fp32 [V] dbias accumulator (+ spare) */
    size_t  off_ones;     /* chunk_rows elements of dtype, all 1 (dbias as a GEMV) */
    size_t  off_dh32;     /* odd V (V % 64 != 0) with 16-bit dtype: fp32 [chunk_rows, H] for dhidden,
                             whose GEMM is split at V rounded down to 64 (else 0 bytes) */
    size_t  off_blas;     /* FL__LCE_BLAS_BYTES for cuBLASLt */
    size_t  total;        /* workspace bytes the entry points require */
} fl__lce_plan;

/* The plan for these arguments (lce_opts resolved: NULL = defaults). Fails with
 * FL_ERR_INVALID_ARGUMENT on bad sizes/dtypes/options or a size_t overflow. */
fl_status fl__lce_make_plan(const char* fn, int64_t N, int64_t H, int64_t V, fl_dtype dtype,
                            fl_dtype wgrad_dtype, const fl_ce_options* ce_opts,
                            const fl_lce_options* lce_opts, fl__lce_plan* plan);
/* The same, with the fp32 dhidden region sized for every V when force_dh32 (the linear VP). */
fl_status fl__lce_make_plan_ex(const char* fn, int64_t N, int64_t H, int64_t V, fl_dtype dtype,
                               fl_dtype wgrad_dtype, const fl_ce_options* ce_opts,
                               const fl_lce_options* lce_opts, int force_dh32, fl__lce_plan* plan);

/* Validate every argument of a linear-CE entry point (either backend), resolve the CE options
 * into *p (as fl__ce_validate does), and the plan into *plan. backward = 0: the forward (lse
 * optional output, gradients optional outputs); backward = 1: lse is an input, loss unused
 * (pass NULL). is_cuda: the 16-byte alignment rules of the header (hidden, weight, bias and the
 * gradients 16-byte aligned, ld_hidden * esize and ld_weight * esize multiples of 16 bytes:
 * FL_ERR_UNSUPPORTED), the workspace's 256-byte alignment, and class weights not read (device
 * memory). Both backends: every pointer aligned to its element size. */
fl_status fl__lce_validate(const char* fn, int backward, int is_cuda,
                           const float* loss, const float* lse, const void* dhidden,
                           const void* dweight, const void* dbias, const void* hidden,
                           int64_t ld_hidden, const void* weight, int64_t ld_weight,
                           const void* bias, const void* targets, const float* grad_loss,
                           float grad_scale, int64_t N, int64_t H, int64_t V, fl_dtype dtype,
                           fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
                           const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
                           const void* workspace, size_t workspace_bytes,
                           fl__ce_params* p, fl__lce_plan* plan);


/* The CUDA cross-entropy kernels on chunks of rows of one batch (src/cuda/cross_entropy.cu), for the
 * linear cross-entropy. ce_ws is a CE workspace for all N rows (fl__ce_workspace_bytes(N, V, dt)).
 * begin: the MEAN denominators / class-weight sum over all N targets (one small launch, if needed);
 * rows: the main kernel of `pass` (fl__pass) over rows [r0, r0 + C) of the batch: logits/dlogits
 *       point at the chunk (row stride ld), loss/lse_out/lse_in/targets/grad_loss at the batch;
 * end: the reduced loss[0] from every row's partials (SUM / MEAN; nothing for NONE). */
fl_status fl__ce_cuda_chunk_begin(const fl__ce_params* p, const void* targets, int64_t N, int64_t V,
                                  fl_index_dtype it, void* ce_ws, fl_stream stream);
fl_status fl__ce_cuda_chunk_rows(int pass, const fl__ce_params* p, int64_t r0, int64_t C, int64_t N, int64_t V,
                                 float* loss, float* lse_out, void* dlogits, const void* logits, int64_t ld,
                                 const void* targets, const float* lse_in, const float* grad_loss, float grad_scale,
                                 fl_dtype dt, fl_index_dtype it, void* ce_ws, fl_stream stream);
fl_status fl__ce_cuda_chunk_end(const fl__ce_params* p, float* loss, const void* targets, int64_t N, int64_t V,
                                fl_index_dtype it, void* ce_ws, fl_stream stream);

/* The vocab-parallel steps on chunks of rows of one batch (the linear variant). ce_ws: a CE
 * workspace for all N rows of V_local classes. begin: MEAN denominators and the GLOBAL class-weight
 * sum over all N targets (one launch, if needed). stats: step 1 of rows [r0, r0 + R) into
 * stats[R][4] (chunk-relative; logits point at the chunk). combine: step 3 of those rows from
 * gathered[k][R][4] into lse[r0..] and loss[r0..] (NONE) or the row partials (reduced: finish
 * with fl__ce_cuda_chunk_end over V). backward: step 4 of those rows (dlogits may be logits). */
fl_status fl__vp_cuda_chunk_begin(const fl__ce_params* p, const void* targets, int64_t N, int64_t V_local,
                                  int64_t vocab_start, int64_t V, fl_index_dtype it, void* ce_ws, fl_stream stream);
fl_status fl__vp_cuda_chunk_stats(const fl__ce_params* p, int64_t r0, int64_t R, int64_t N, float* stats,
                                  const void* logits, int64_t ld, const void* targets, int64_t V_local,
                                  int64_t vocab_start, int64_t V, fl_dtype dt, fl_index_dtype it, void* ce_ws,
                                  fl_stream stream);
fl_status fl__vp_cuda_chunk_combine(const fl__ce_params* p, int64_t r0, int64_t R, int64_t N, float* loss,
                                    float* lse, const float* gathered, int k, const void* targets, int64_t V,
                                    fl_index_dtype it, void* ce_ws, fl_stream stream);
fl_status fl__vp_cuda_chunk_backward(const fl__ce_params* p, int64_t r0, int64_t R, int64_t N, void* dlogits,
                                     const void* logits, int64_t ld, const void* targets, const float* lse,
                                     const float* grad_loss, float grad_scale, int64_t V_local, int64_t vocab_start,
                                     int64_t V, fl_dtype dt, fl_index_dtype it, void* ce_ws, fl_stream stream);

/* ---- vocab-parallel linear cross-entropy (header section 8, linear variant) ---------------- */

/* Workspace of the linear VP entry points: section 6's plan for (N, H, V_local) with the fp32
 * [chunk_rows, H] dhidden region always present (plan.off_dh32), then the NCCL entry's regions. */
typedef struct {
    fl__lce_plan lce;
    size_t off_stats;     /* [chunk_rows][4] fp32: a chunk's stats (NCCL) */
    size_t off_gathered;  /* [k][chunk_rows][4] fp32: the gathered stats (NCCL) */
    size_t off_lse;       /* [N] fp32: lse when the caller passes none (NCCL) */
    size_t total;
} fl__vp_lce_plan;

fl_status fl__vp_lce_make_plan(const char* fn, int64_t N, int64_t H, int64_t V_local, int64_t V, fl_dtype dtype,
                               fl_dtype wgrad_dtype, int k, const fl_ce_options* ce_opts,
                               const fl_lce_options* lce_opts, fl__vp_lce_plan* plan);

/* Validate a linear VP entry point. which: 0 = step 1' (stats output; dhidden, dweight, dbias,
 * lse, grad_loss NULL), 1 = step 4' (dhidden is the fp32 partial, required; lse required),
 * 2 = the NCCL entry (loss required, lse optional output, dhidden of dtype optional). Checks the
 * shard (0 <= vocab_start, vocab_start + V_local <= V), sizes, dtypes, options (target_prob
 * refused; weight / logit_offset GLOBAL [V]), NULLs, alignment (CUDA: section 6's 16-byte rules),
 * the workspace (plan->total) and aliasing. Resolves *p and *plan. */
fl_status fl__vp_lce_validate(const char* fn, int which, int is_cuda, const float* stats, const float* loss,
                              const float* lse, const void* dhidden, const void* dweight, const void* dbias,
                              const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight,
                              const void* bias, const void* targets, const float* grad_loss, float grad_scale,
                              int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
                              fl_dtype wgrad_dtype, fl_index_dtype index_dtype, int k, const fl_ce_options* ce_opts,
                              const fl_lce_options* lce_opts, const void* workspace, size_t workspace_bytes,
                              fl__ce_params* p, fl__vp_lce_plan* plan);

/* The collectives of the linear VP's collective entry (vp_nccl.cu fills them from NCCL): an
 * all-gather of `count` floats per rank in rank order, and an in-place fp32 sum all-reduce. */
typedef struct fl__vp_coll_s fl__vp_coll;
struct fl__vp_coll_s {
    int   k;      /* ranks */
    void* comm;
    fl_status (*all_gather)(const fl__vp_coll* c, const float* send, float* recv, size_t count, fl_stream s);
    fl_status (*all_reduce_sum)(const fl__vp_coll* c, float* buf, size_t count, fl_stream s);
};

/* The CUDA linear VP driver (src/cuda/linear_cross_entropy.cu): which = 0 step 1' (stats), 1 step 4'
 * (lse input, dhidden the fp32 partial), 2 the collective entry (coll required; loss, lse output,
 * dhidden of dtype). */
fl_status fl__vp_lce_cuda(const char* fn, int which, fl_lce_context* ctx, const fl__vp_coll* coll, float* stats,
                          float* loss, float* lse, void* dhidden, void* dweight, void* dbias, const void* hidden,
                          int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
                          const void* targets, const float* grad_loss, float grad_scale, int64_t N, int64_t H,
                          int64_t Vl, int64_t vocab_start, int64_t V, fl_dtype dt, fl_dtype wdt, fl_index_dtype it,
                          const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace,
                          size_t workspace_bytes, fl_stream stream);

/* ---- distillation divergences (include/fusedloss.h section 10) ---------------------------- */

#define FL__DISTILL_CHUNK 8192  /* columns per chunk of a row: the CUDA work item; sizes the workspace */

typedef enum { FL__DISTILL_FKL = 0, FL__DISTILL_RKL = 1, FL__DISTILL_JSD = 2 } fl__distill_mode;

typedef struct {
    int64_t          N, V, ld_s, ld_t;
    fl_dtype         dtype, teacher_dtype;
    fl_index_dtype   label_dtype;
    const void*      labels;        /* NULL: no row ignored */
    int64_t          ignore_index;
    float            temperature;   /* T */
    float            beta;
    fl__distill_mode mode;          /* from beta: 0 -> FKL, 1 -> RKL, else JSD */
    float            loss_scale;    /* T^2 with t2_scale, else 1 */
    fl_reduction     reduction;     /* NONE, SUM, MEAN or FL_REDUCTION_BATCHMEAN */
    int64_t          chunks;        /* ceil(V / FL__DISTILL_CHUNK) */
} fl__distill_params;

/* Workspace bytes of every distillation entry point (both backends). Layout (CUDA; the CPU uses
 * [256, 256 + 8 N) as double per-row losses):
 *   [0, 256)                         header (denominator, counters)
 *   [256, +align256(4 N))            fp32 per-row losses
 *   then align256(8 N)               two int32 per row (work-item completion counters)
 *   then align256(32 N chunks)       per-(row, chunk) statistics: 8 fp32 each */
size_t fl__distill_workspace_bytes(int64_t N, int64_t V);

/* Validate every argument of a distillation entry point (either backend) and resolve the options
 * into *p. pass: FL__PASS_FORWARD (dstudent, grad_loss NULL) or FL__PASS_FUSED (loss may be NULL).
 * is_cuda: CUDA-only limits (teacher_dtype the student's or fp32: FL_ERR_UNSUPPORTED otherwise;
 * 256-byte aligned workspace). Messages name `fn` and the offending value. */
fl_status fl__distill_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dstudent,
                               const void* student, int64_t ld_student, const void* teacher, int64_t ld_teacher,
                               fl_dtype teacher_dtype, const void* labels, fl_index_dtype label_dtype,
                               const float* grad_loss, float grad_scale, int64_t N, int64_t V, fl_dtype dtype,
                               const fl_distill_options* opts, const void* workspace, size_t workspace_bytes,
                               fl__distill_params* p);

/* ---- margin softmax cross-entropy (header section 11) ------------------------------------- */

typedef struct {
    int64_t          N, C, ld;
    fl_dtype         dtype;
    fl_index_dtype   index_dtype;
    float            s, m1, m2, m3;
    int              easy_margin;
    fl_margin_grad   grad_mode;
    int64_t          ignore_index;
    fl_reduction     reduction;     /* NONE, SUM or MEAN */
    int32_t*         error_flag;
    int              cosface;       /* m1 == 1 and m2 == 0: phi = x_y - m3, no acos */
    float            theta_max;     /* (pi - m2) / m1: the margin applies for theta <= theta_max (non-easy) */
    float            sinmm;         /* m2 * sin(m2) */
    int64_t          chunks;        /* ceil(C / FL__DISTILL_CHUNK) */
} fl__margin_params;

/* Same layout as fl__distill_workspace_bytes (N rows of C columns). */
size_t fl__margin_workspace_bytes(int64_t N, int64_t C);
/* pass FL__PASS_FORWARD (dlogits, grad_loss NULL) or FL__PASS_FUSED (loss may be NULL). Checks as
 * section 5's (targets range only on the CPU, by the backend) plus the options' ranges. */
fl_status fl__margin_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const float* lse,
                              const void* dlogits, const void* logits, int64_t ld, const void* targets,
                              fl_index_dtype index_dtype, const float* grad_loss, float grad_scale, int64_t N,
                              int64_t C, fl_dtype dtype, const fl_margin_options* opts, const void* workspace,
                              size_t workspace_bytes, fl__margin_params* p);

/* ---- softmax focal (header section 12) ------------------------------------------------------ */

typedef struct {
    int64_t          N, C, d, ld;
    fl_dtype         dtype;
    fl_index_dtype   index_dtype;
    float            gamma;
    const float*     alpha;
    int64_t          ignore_index;
    fl_reduction     reduction;
    int32_t*         error_flag;
    int64_t          positions;     /* N * d */
    int64_t          chunks;        /* d == 1: ceil(C / FL__DISTILL_CHUNK); else 1 */
} fl__focal_params;

/* Layout: 256 + align256(4 P) + align256(8 P) + align256(32 P chunks), P = N * d positions. */
size_t fl__focal_workspace_bytes(int64_t N, int64_t C, int64_t d);
fl_status fl__focal_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dlogits,
                             const void* logits, int64_t ld, const void* targets, fl_index_dtype index_dtype,
                             const float* grad_loss, float grad_scale, int64_t N, int64_t C, int64_t d,
                             fl_dtype dtype, const fl_focal_options* opts, const void* workspace,
                             size_t workspace_bytes, fl__focal_params* p);

/* ---- Lovasz-softmax (header section 13) --------------------------------------------------- */

typedef struct {
    int64_t            N, C, d, ld;
    fl_dtype           dtype;
    fl_index_dtype     index_dtype;
    fl_lovasz_classes  classes;
    int                per_image;     /* 0 / 1 */
    int                from_logits;   /* 0 / 1 */
    int64_t            ignore_index;
    int64_t            pixels;        /* P = N * d */
} fl__lovasz_params;

/* Host workspace of the CPU entry points, P = N * d pixels:
 *   64 + 16 P + 8 C                    from_logits == 0
 *   64 + 16 P + 8 C + 8 P + 8 P C      from_logits != 0
 * i.e. up to 64 bytes of alignment slack (the arrays start at the first 16-byte aligned address:
 * a CPU workspace need not be aligned), then P (error double, pixel index int64) pairs (one class
 * of one set at a time, sorted in place by qsort), C int64 class counts G_c of the current set,
 * then (logits only) P doubles lse and P * C doubles gp (dloss/dp per pixel and class,
 * pixel-major; zeroed by the fused call). SIZE_MAX when that does not fit in a size_t (the
 * size query and the validator report FL_ERR_INVALID_ARGUMENT). */
size_t fl__lovasz_workspace_bytes(int64_t N, int64_t C, int64_t d, int from_logits);
/* Device workspace of the CUDA entry points (src/cuda/lovasz.cu: its plan, header comment there),
 * C N d <= 2^31 - 1 (checked by the caller); 0 when CUB's scratch size query failed. */
size_t fl__lovasz_cuda_workspace_bytes(int64_t N, int64_t C, int64_t d, int per_image, int from_logits);
/* pass FL__PASS_FORWARD (dinput, grad_loss NULL; loss required) or FL__PASS_FUSED (loss may be
 * NULL, dinput required when N > 0). Labels are range-checked by the backend. is_cuda: the CUDA
 * workspace (256-byte aligned) and extent limit. */
fl_status fl__lovasz_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dinput,
                              const void* input, int64_t ld, const void* labels, fl_index_dtype index_dtype,
                              const float* grad_loss, float grad_scale, int64_t N, int64_t C, int64_t d,
                              fl_dtype dtype, const fl_lovasz_options* opts, const void* workspace,
                              size_t workspace_bytes, fl__lovasz_params* p);

/* ---- Taylor softmax cross-entropy (header section 14) ----------------------------------------- */

typedef struct {
    int64_t         N, C, ld;
    fl_dtype        dtype;
    fl_index_dtype  index_dtype;
    int             order;          /* 2 or 4 */
    int64_t         ignore_index;
    fl_reduction    reduction;
    int32_t*        error_flag;
} fl__taylor_params;

/* Workspace of every entry point (both backends; the CPU ignores its content): 0 for NONE, else
 * FL__TAYLOR_WS_HEAD bytes (a float D = MEAN's count at 16; the two-stage reductions' partials,
 * 8 x RP_RED_MAX = 2048 bytes, from 256) then align256(4 N) per-row fp32 losses. */
#define FL__TAYLOR_WS_HEAD 2304u
size_t fl__taylor_workspace_bytes(int64_t N, fl_reduction reduction);
/* pass FL__PASS_FORWARD (dlogits, grad_loss NULL; loss required) or FL__PASS_FUSED (loss may be
 * NULL, dlogits required when N > 0). Targets are range-checked by the backend. */
fl_status fl__taylor_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dlogits,
                              const void* logits, int64_t ld, const void* targets, fl_index_dtype index_dtype,
                              const float* grad_loss, float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                              const fl_taylor_options* opts, const void* workspace, size_t workspace_bytes,
                              fl__taylor_params* p);

/* ---- large-margin softmax cross-entropy (header section 15) -------------------------------------- */

typedef struct {
    int64_t         N, C, ld;
    fl_dtype        dtype;
    fl_index_dtype  index_dtype;
    float           lambda;
    int64_t         ignore_index;
    fl_reduction    reduction;
    int32_t*        error_flag;
} fl__large_margin_params;

/* as fl__taylor_validate (the workspace rule of section 14, is_cuda the same), C >= 2 */
fl_status fl__large_margin_validate(const char* fn, fl__pass pass, int is_cuda, const float* loss, const void* dlogits,
                                    const void* logits, int64_t ld, const void* targets, fl_index_dtype index_dtype,
                                    const float* grad_loss, float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                    const fl_large_margin_options* opts, const void* workspace,
                                    size_t workspace_bytes, fl__large_margin_params* p);

#ifdef __cplusplus
}
#endif

#endif /* FL_INTERNAL_H */
