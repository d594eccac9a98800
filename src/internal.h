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
    int     finish;     /* dbias total: 0 none, 1 last CTA of each slab, 2 second kernel */
    size_t  ws_bytes;   /* CUDA workspace bytes this plan needs (0 without dbias) */
} fl__gelu_plan;

void fl__gelu_make_plan(fl__gelu_plan* p, fl__gelu_path path, int64_t N, int64_t F, size_t esize,
                        int with_dbias);
/* The same with the launch knobs of src/cuda/gelu.cu (unroll = rows in flight per thread, tx =
 * threads along a row, target_ctas; with dbias target_ctas <= FL__GELU_DBIAS_CTAS_MAX). */
#define FL__GELU_DBIAS_CTAS_MAX 2048
void fl__gelu_make_plan_ex(fl__gelu_plan* p, fl__gelu_path path, int64_t N, int64_t F, size_t esize,
                           int with_dbias, int unroll, int tx, int64_t target_ctas);
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

#ifdef __cplusplus
}
#endif

#endif /* FL_INTERNAL_H */
