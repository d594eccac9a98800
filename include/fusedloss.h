/* fusedloss — fused loss kernels for training: the one public header.
 * SPDX-License-Identifier: MIT
 *
 * C99 and C++ clean; includes only <stddef.h> and <stdint.h>; no CUDA header needed.
 */
#ifndef FUSEDLOSS_H
#define FUSEDLOSS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define FL_API
#elif defined(__GNUC__)
#  define FL_API __attribute__((visibility("default")))
#else
#  define FL_API
#endif

/*-****************************************************************************
 *  Introduction
 *
 *  fusedloss computes training losses and their gradients without the extra
 *  passes over memory that an op-by-op framework makes. Every op has two
 *  backends with the same semantics and the same argument list:
 *
 *    - `_cpu`  : plain C11 (optionally OpenMP); all pointers are host pointers;
 *                synchronous; the executable specification.
 *    - `_cuda` : CUDA kernels; all array pointers are device pointers; every
 *                call is asynchronous on `stream`, never synchronises the host,
 *                never allocates, and can be captured in a CUDA graph.
 *                In a build without CUDA these return FL_ERR_NOT_BUILT.
 *
 *  Errors: every function returns an fl_status. The detail (function name and
 *  offending value) is in fl_last_error(), a thread-local string. Faults that
 *  happen inside a kernel surface at the caller's next synchronising call, as
 *  usual for CUDA; data errors found inside a kernel (an out-of-range target)
 *  are reported through a caller-provided device flag, never by killing the
 *  CUDA context (see fl_ce_options.error_flag).
 *
 *  Outputs are always overwritten, never accumulated into. Nothing the caller
 *  owns is written except the outputs named in a call; in-place gradients
 *  (dlogits == logits) are allowed where a function says so.
 *
 *  Layout: logits are row-major [N, ld] with the first V columns used
 *  (ld >= V; columns V..ld-1 are neither read nor written). N, V, ld are int64;
 *  offsets are computed in 64 bits everywhere (N*V may exceed 2^31).
 ******************************************************************************/

/*-****************************************************************************
 *  1. Version
 ******************************************************************************/
#define FL_VERSION_MAJOR 0
#define FL_VERSION_MINOR 1
#define FL_VERSION_PATCH 0
#define FL_VERSION_NUMBER (FL_VERSION_MAJOR * 10000 + FL_VERSION_MINOR * 100 + FL_VERSION_PATCH)

/*! fl_version_number() : FL_VERSION_NUMBER of the library actually linked. */
FL_API unsigned fl_version_number(void);
/*! fl_version_string() : "MAJOR.MINOR.PATCH" plus build flags, e.g. "0.1.0 (cuda)". Static string. */
FL_API const char* fl_version_string(void);
/*! fl_cuda_built() : 1 if this build contains the CUDA backend, else 0. */
FL_API int fl_cuda_built(void);

/*-****************************************************************************
 *  2. Status codes — values are fixed forever; new codes are only appended.
 ******************************************************************************/
typedef enum {
    FL_OK                         = 0,
    FL_ERR_INVALID_ARGUMENT       = 1, /* null pointer, bad size, bad option, bad aliasing */
    FL_ERR_UNSUPPORTED            = 2, /* valid request this build/device cannot serve      */
    FL_ERR_OUT_OF_MEMORY          = 3,
    FL_ERR_CUDA                   = 4, /* a CUDA runtime call failed; detail in fl_last_error() */
    FL_ERR_NOT_BUILT              = 5, /* CUDA entry point in a build without CUDA          */
    FL_ERR_TARGET_OUT_OF_RANGE    = 6, /* a target not in [0, V) and not ignore_index (CPU) */
    FL_ERR_INTERNAL               = 7,
    FL_ERR_INSUFFICIENT_WORKSPACE = 8  /* workspace_bytes below the size query's answer     */
} fl_status;

/*! fl_status_string() : static English name of a status; never NULL ("unknown status" if out of range). */
FL_API const char* fl_status_string(fl_status status);
/*! fl_last_error() : detail of the last failure on this thread, naming the function and the
 *  bad value; "" after a successful call. Valid until the next fusedloss call on this thread. */
FL_API const char* fl_last_error(void);

/*-****************************************************************************
 *  3. Types
 ******************************************************************************/
typedef enum { FL_DTYPE_F32 = 0, FL_DTYPE_F16 = 1, FL_DTYPE_BF16 = 2 } fl_dtype;
typedef enum { FL_INDEX_I32 = 0, FL_INDEX_I64 = 1 } fl_index_dtype;
/* Same numbering as PyTorch's at::Reduction. */
typedef enum { FL_REDUCTION_NONE = 0, FL_REDUCTION_MEAN = 1, FL_REDUCTION_SUM = 2 } fl_reduction;

/* ABI-identical to cudaStream_t; NULL is the legacy default stream. */
typedef struct CUstream_st* fl_stream;

/*-****************************************************************************
 *  5. Cross-entropy on logits
 *
 *  For row i with target t = targets[i] (class index), raw logits x[j], j < V:
 *
 *    z_j   = s * x_j + o_j                 when softcap c == 0  (s = logit_scale)
 *    z_j   = c * tanh(s * x_j / c) + o_j   when softcap c  > 0  (Gemma-2 style)
 *    o_j   = logit_offset[j], a per-class offset (0 when logit_offset == NULL): logit
 *            adjustment (Menon et al.: o_j = tau log prior_j) and PC-softmax style priors;
 *            every formula below uses z, so the loss is exactly
 *            F.cross_entropy(softcap(s x) + o, ...).
 *    lse   = log sum_j exp(z_j)
 *    nll   = lse - z_t
 *    with eps = label_smoothing, w = class weights (all 1 when weight == NULL),
 *    the per-row loss, exactly as PyTorch F.cross_entropy:
 *      l_i = (1-eps) * w_t * (lse - z_t)  +  (eps/V) * sum_j w_j * (lse - z_j)
 *    plus the z-loss (PaLM / Liger lse_square_scale; NOT multiplied by class weights):
 *      l_i += zeta * lse^2                                   (zeta = z_loss)
 *
 *  Rows whose target equals ignore_index are ignored: loss 0, gradient 0, lse 0,
 *  and their logits are not read.
 *
 *  Reductions:
 *    NONE : loss[i] = l_i                                (loss has N entries)
 *    SUM  : loss[0] = sum_i l_i                          (one entry)
 *    MEAN : loss[0] = sum_i (l_i - zeta*lse_i^2) / D_w  +  sum_i zeta*lse_i^2 / D_n
 *           D_w = sum of w_t over non-ignored rows (= D_n without weights),
 *           D_n = number of non-ignored rows.
 *           This is PyTorch's weighted mean (sum w_t l_i / sum w_t, the smoothing
 *           term divided by the same sum) and Liger's z-loss mean (over tokens).
 *           If every row is ignored (or N == 0), D = 0 and the MEAN loss is NaN,
 *           as in PyTorch; the gradient is then all zeros. If rows count but all their
 *           target weights are 0 (D_w = 0), the loss is NaN (no smoothing) or +inf (with
 *           smoothing; PyTorch gives NaN) and the gradient is NaN/inf.
 *
 *  Gradients: dlogits[i, j] = g_i * d l_i / d x_j, where the upstream gradient
 *    g_i = grad_scale * (grad_loss ? grad_loss[r] : 1) [/ D for MEAN],
 *    r = i for reduction NONE, r = 0 otherwise. Formulas beside src/cpu/cross_entropy.c.
 *
 *  Numerics: fp32 (CUDA) / double (CPU) accumulation for every input dtype; the loss and
 *  lse are fp32; dlogits has the logits' dtype and is rounded once from fp32/double.
 *  backward starts from the fp32 lse, so its gradient carries an extra error of about
 *  p_j * |g| * ulp(lse) / 2 (e.g. 1e-6 when lse ~ 32): fused, which keeps lse on chip in
 *  full precision, is the more accurate (and faster) of the two.
 *  grad_scale must be finite (else FL_ERR_INVALID_ARGUMENT).
 *
 *  Out-of-range targets (not in [0, V), not ignore_index):
 *    CPU : checked before anything is written; returns FL_ERR_TARGET_OUT_OF_RANGE naming
 *          the first bad row.
 *    CUDA: cannot be checked without a host sync, so the kernel never reads out of
 *          bounds, makes that row's loss (and so any SUM/MEAN) NaN, fills that row's
 *          dlogits with NaN (fused and backward), writes its lse as computed (the target
 *          plays no part in it), counts it as a non-ignored row of weight 1, and, when
 *          opts->error_flag is non-NULL, stores 1 into *error_flag (device memory the
 *          caller zeroed beforehand). The CUDA context stays usable.
 *
 *  Class weights (opts->weight, fp32 [V], host for CPU / device for CUDA) must be finite
 *  and >= 0; the CPU backend checks this, the CUDA backend cannot without a sync.
 *
 *  Determinism: both backends give bitwise-identical results on every run for the same
 *  inputs (no order-dependent float atomics). CPU results do not depend on the thread count.
 ******************************************************************************/
/*  Per-row target probability (OHEM, hard-example mining), opts->target_prob non-NULL:
 *    target_prob[i] = p_t = exp(z_t - lse), fp32 [N], written by forward and fused (not by
 *    backward); 1 for ignored rows (a zero loss: never "hard"), NaN for an out-of-range target
 *    (CUDA). With reduction NONE the per-row losses come with it, so a sampler (mmseg's
 *    OHEMPixelSampler: keep the rows with p_t below a threshold, at least min_kept of them) can
 *    select rows on the device and pass its 0/1 (or weighted) mask as backward's per-row grad_loss.
 *    Not available to the vocab-parallel steps (section 8): FL_ERR_UNSUPPORTED there; their
 *    logit_offset is the GLOBAL [V] array, as the class weights.
 *
 * Options. struct_size is sizeof(fl_ce_options) of the header the caller was built with: this
 * version also accepts the size of version 1 (the fields up to error_flag, without logit_offset
 * and target_prob), whose missing fields then take their defaults (NULL). */
typedef struct fl_ce_options {
    size_t        struct_size;     /* = sizeof(fl_ce_options); set by FL_CE_OPTIONS_INIT */
    int64_t       ignore_index;    /* default -100 */
    fl_reduction  reduction;       /* default FL_REDUCTION_MEAN */
    float         label_smoothing; /* eps in [0, 1]; default 0 */
    const float*  weight;          /* class weights, fp32 [V], or NULL; default NULL */
    float         z_loss;          /* zeta >= 0, coefficient of lse^2; default 0 */
    float         softcap;         /* c >= 0; 0 = off; default 0 */
    float         logit_scale;     /* s, finite and != 0; multiplies logits first; default 1 */
    int32_t*      error_flag;      /* CUDA: device int set to 1 on an out-of-range target; or NULL */
    /* version 2 */
    const float*  logit_offset;    /* o, fp32 [V] (host for CPU / device for CUDA), finite, or NULL */
    float*        target_prob;     /* output, fp32 [N]: p_t per row (forward / fused), or NULL */
} fl_ce_options;

#define FL_CE_OPTIONS_INIT { sizeof(fl_ce_options), -100, FL_REDUCTION_MEAN, 0.0f, NULL, 0.0f, 0.0f, 1.0f, NULL, \
                             NULL, NULL }
/* sizeof the version-1 struct (fields up to error_flag), accepted as struct_size */
#define FL_CE_OPTIONS_V1_SIZE (offsetof(fl_ce_options, error_flag) + sizeof(int32_t*))

/*! fl_cross_entropy_workspace_size() :
 *  Bytes of scratch memory that every cross-entropy entry point (both backends) needs for
 *  these arguments; pass at least this much as `workspace, workspace_bytes` (CUDA:
 *  device memory, 256-byte aligned; CPU: host memory). The answer is never 0 (about
 *  256 + 16*N + 16*N*ceil(V/4096) bytes for 16-bit logits); a NULL workspace is
 *  FL_ERR_INVALID_ARGUMENT, too few bytes FL_ERR_INSUFFICIENT_WORKSPACE.
 *  The workspace's content need not be initialised and is clobbered by each call.
 *  opts may be NULL (defaults). Never fails for valid arguments.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_cross_entropy_workspace_size(size_t* bytes, int64_t N, int64_t V,
                                                 fl_dtype dtype, const fl_ce_options* opts);

/*! fl_cross_entropy_forward_{cpu,cuda}() :
 *  loss : fp32, [N] for reduction NONE, [1] otherwise. Overwritten. Required.
 *  lse  : fp32 [N] log-sum-exp of the transformed logits z (0 for ignored rows), or NULL.
 *         Save it to call fl_cross_entropy_backward_*() later.
 *  logits : [N, ld] of `dtype`; targets : [N] of `index_dtype`.
 *  N >= 0, V >= 1, ld >= V. opts may be NULL (defaults).
 *  Aliasing: loss and lse must not overlap each other, logits or targets.
 *  CUDA: logits/dlogits aligned to their element size; a separate dlogits buffer must have
 *  the same address modulo 16 bytes as logits (true for any two framework allocations with
 *  the same strides), else FL_ERR_UNSUPPORTED.
 * @return : FL_OK or an error status (fl_last_error() has the detail). */
FL_API fl_status fl_cross_entropy_forward_cpu(float* loss, float* lse, const void* logits,
                                              const void* targets, int64_t N, int64_t V, int64_t ld,
                                              fl_dtype dtype, fl_index_dtype index_dtype,
                                              const fl_ce_options* opts,
                                              void* workspace, size_t workspace_bytes);
FL_API fl_status fl_cross_entropy_forward_cuda(float* loss, float* lse, const void* logits,
                                               const void* targets, int64_t N, int64_t V, int64_t ld,
                                               fl_dtype dtype, fl_index_dtype index_dtype,
                                               const fl_ce_options* opts,
                                               void* workspace, size_t workspace_bytes,
                                               fl_stream stream);

/*! fl_cross_entropy_backward_{cpu,cuda}() :
 *  dlogits[N, ld] (dtype of logits; first V columns overwritten) from the logits, the
 *  targets, the lse saved by forward (same options!) and the upstream gradient:
 *    grad_loss : fp32, [N] for reduction NONE, [1] otherwise, or NULL meaning 1.
 *    grad_scale: multiplies grad_loss (e.g. 1/accumulation_steps); 1 for plain autograd.
 *  For MEAN the library divides by D itself (do not pre-divide).
 *  In place: dlogits == logits is allowed (the logits are destroyed); any other overlap
 *  of dlogits with an input is an error.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_cross_entropy_backward_cpu(void* dlogits, const void* logits,
                                               const void* targets, const float* lse,
                                               const float* grad_loss, float grad_scale,
                                               int64_t N, int64_t V, int64_t ld,
                                               fl_dtype dtype, fl_index_dtype index_dtype,
                                               const fl_ce_options* opts,
                                               void* workspace, size_t workspace_bytes);
FL_API fl_status fl_cross_entropy_backward_cuda(void* dlogits, const void* logits,
                                                const void* targets, const float* lse,
                                                const float* grad_loss, float grad_scale,
                                                int64_t N, int64_t V, int64_t ld,
                                                fl_dtype dtype, fl_index_dtype index_dtype,
                                                const fl_ce_options* opts,
                                                void* workspace, size_t workspace_bytes,
                                                fl_stream stream);

/*! fl_cross_entropy_fused_{cpu,cuda}() :
 *  Forward and backward in one pass over the logits, with the upstream gradient known up
 *  front (grad_loss / grad_scale exactly as for backward; grad_loss may be a device
 *  pointer computed on the device, so no host sync is ever needed).
 *  Outputs: loss (as forward), lse (optional, as forward), dlogits (as backward).
 *  In place: dlogits == logits is allowed (the logits are destroyed).
 * @return : FL_OK or an error status. */
FL_API fl_status fl_cross_entropy_fused_cpu(float* loss, float* lse, void* dlogits,
                                            const void* logits, const void* targets,
                                            const float* grad_loss, float grad_scale,
                                            int64_t N, int64_t V, int64_t ld,
                                            fl_dtype dtype, fl_index_dtype index_dtype,
                                            const fl_ce_options* opts,
                                            void* workspace, size_t workspace_bytes);
FL_API fl_status fl_cross_entropy_fused_cuda(float* loss, float* lse, void* dlogits,
                                             const void* logits, const void* targets,
                                             const float* grad_loss, float grad_scale,
                                             int64_t N, int64_t V, int64_t ld,
                                             fl_dtype dtype, fl_index_dtype index_dtype,
                                             const fl_ce_options* opts,
                                             void* workspace, size_t workspace_bytes,
                                             fl_stream stream);

/*! fl_scale_rows_{cpu,cuda}() :
 *  x[i, j] *= g[per_row ? i : 0] for i < N, j < V (x: [N, ld] of dtype, fp32 arithmetic,
 *  rounded once to dtype, as torch's mul_). A row whose factor is exactly 1 is not read or
 *  written, so the call moves no (N, V) bytes at all when g is all ones. For applying the real
 *  upstream gradient to a gradient made with grad_loss = NULL (upstream 1), e.g. by an in-place
 *  fused forward, when that upstream gradient lives on the device: no host sync, and the usual
 *  loss.backward() (g = 1) costs one tiny launch instead of a read + write of the gradient.
 *    g : fp32, [N] when per_row, else [1]; device memory for _cuda, host memory for _cpu.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_scale_rows_cpu(void* x, int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                   const float* g, int per_row);
FL_API fl_status fl_scale_rows_cuda(void* x, int64_t N, int64_t V, int64_t ld, fl_dtype dtype,
                                    const float* g, int per_row, fl_stream stream);

/*-****************************************************************************
 *  6. Linear + cross-entropy (the lm_head and its loss without the logits)
 *
 *  logits = hidden · weightᵀ (+ bias), then the cross-entropy of section 5 on them, without
 *  ever holding the [N, V] logits: the rows are cut into chunks of `chunk_rows`; for each chunk
 *  the GEMM (cuBLASLt on CUDA) writes that chunk's logits into the workspace, the fused
 *  cross-entropy kernel turns them into dlogits in place, and two more GEMMs add the chunk's
 *  share of dhidden and dweight. Sizes: hidden [N, H] (row stride ld_hidden >= H), weight
 *  [V, H] (row stride ld_weight >= H), bias [V] or NULL, targets [N]; dhidden [N, H]
 *  contiguous, dweight [V, H] contiguous, dbias [V]. N >= 0, H >= 1, V >= 1, int64 sizes,
 *  64-bit offsets (N·V, V·H may exceed 2^31).
 *
 *  Semantics: exactly F.cross_entropy(F.linear(hidden, weight, bias), targets, ...) in the
 *  precision PyTorch runs it: the logits are accumulated in fp32 (double on the CPU) and rounded
 *  ONCE to `dtype` (the tensor F.linear returns), then section 5 applies to them (every
 *  fl_ce_options option; fp32 loss/lse; dlogits rounded to dtype); dhidden = dlogits · weight
 *  and dweight = dlogitsᵀ · hidden accumulate in fp32 (double on the CPU) and are rounded once
 *  to their dtype, except in the lean accumulation mode below.
 *
 *  Dtypes: hidden, weight, bias, dhidden: `dtype` (fp32 / fp16 / bf16). dweight and dbias:
 *  `wgrad_dtype`, either dtype or FL_DTYPE_F32 (fp32 parameters under autocast: their gradient
 *  is accumulated straight into the fp32 dweight, exactly). fp32 GEMMs use TF32 tensor cores
 *  only when lce_opts->allow_tf32 (PyTorch's matmul precision "high"/"medium").
 *
 *  Two modes (the costs, in GEMM FLOP, with one GEMM = 2·N·H·V):
 *   (1) gradients in the forward: fl_linear_cross_entropy_forward_*() with dhidden (and
 *       dweight, dbias) non-NULL computes the loss and the gradients for an upstream gradient
 *       given up front (grad_loss / grad_scale as in section 5; for a scalar loss pass NULL and
 *       scale the kept gradients by the real upstream gradient later with fl_scale_rows_*(),
 *       which costs nothing when it is 1). 3 GEMMs = 6·N·H·V FLOP; dweight must be held from the
 *       forward to the backward.
 *   (2) recompute: fl_linear_cross_entropy_forward_*() with all gradient pointers NULL (1 GEMM;
 *       loss and lse), then fl_linear_cross_entropy_backward_*() from the saved lse with any
 *       upstream gradient, e.g. per row for reduction NONE (3 GEMMs: the logits again, then
 *       dhidden and dweight). 4 GEMMs in all = 8·N·H·V FLOP.
 *
 *  dweight accumulation over the chunks (lce_opts->wgrad_accum), when wgrad_dtype is 16-bit:
 *    FL_LCE_ACCUM_FP32 : an fp32 [V, H] accumulator in the workspace (+4·V·H bytes), rounded
 *                        once at the end: the same rounding as one unchunked GEMM.
 *    FL_LCE_ACCUM_LEAN : the GEMM adds each chunk into dweight itself (fp32 arithmetic, the sum
 *                        rounded to 16 bits after every chunk): no extra memory; the error grows
 *                        with the number of chunks (about sqrt(chunks) half-ulps).
 *    FL_LCE_ACCUM_AUTO : FP32 when 4·V·H <= byte_budget / 2, else LEAN (default).
 *  With wgrad_dtype fp32 the accumulation is always exact and free. The CPU backend always
 *  accumulates in double (the reference).
 *  The CPU backend allocates its double dweight accumulator (8·V·H bytes) itself, per call (malloc;
 *  FL_ERR_OUT_OF_MEMORY before anything is written if that fails).
 *
 *  Workspace: fl_linear_cross_entropy_workspace_size() bytes (CUDA: device memory, 256-byte
 *  aligned), content ignored and clobbered; its size is about chunk_rows·Vpad·esize (the logits
 *  chunk; Vpad = V rounded up to 64) + the accumulator (FP32 mode) + the cuBLASLt workspace
 *  (8 MiB) + 16·N bytes + 16·chunk_rows bytes per 8 KB of a logits row (+ chunk_rows·4·H when V
 *  is not a multiple of 64 and dtype is 16-bit: the CUDA GEMMs then run on V rounded down to 64
 *  and on the rest separately, because cuBLAS is several times slower on an odd V, and dhidden's
 *  two parts are summed in fp32). chunk_rows is
 *  lce_opts->chunk_rows when > 0, else about the most rows (a multiple of 64 unless N is smaller)
 *  whose workspace fits byte_budget (default 512 MiB; at least one 64-row chunk whatever the
 *  budget), then evened out over the chunks (N = 8192 with room for 1900 rows: 4 x 1664 + 1536,
 *  not 4 x 1856 + 768).
 *  Chunking and the LEAN mode aside, the CUDA result does not depend on the chunk size except
 *  through cuBLAS's choice of GEMM kernel per shape; the CPU result does not depend on it at all.
 ******************************************************************************/
typedef struct fl_lce_context_s fl_lce_context;

/*! fl_lce_context_create() / fl_lce_context_destroy() :
 *  The CUDA state of linear cross-entropy on the current device: a cuBLASLt handle and the
 *  device's properties. Create once (it allocates host memory and may take milliseconds),
 *  use from one host thread at a time, with any streams; destroy after the work using it is
 *  done. In a build without CUDA, create returns FL_ERR_NOT_BUILT. destroy(NULL) is a no-op.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_lce_context_create(fl_lce_context** ctx);
FL_API void fl_lce_context_destroy(fl_lce_context* ctx);

/*! fl_lce_context_set_tuning() :
 *  on = 1: every later CUDA linear cross-entropy call on ctx (forward, backward, vocab-parallel)
 *  is a TUNING call until on = 0: each GEMM it makes whose shape (sizes, strides, types, pointer
 *  alignment, beta) ctx has not tuned yet is run under each of cuBLASLt's ranked algorithms
 *  (up to 16, timed in 5 interleaved rounds after a warm-up round; medians compared) and the
 *  fastest is kept in ctx for every later call with that shape, if it beats cuBLASLt's heuristic
 *  first pick by >= 3% (else that pick stays). On the H200 tuning took 3-10% off the step at
 *  8192x768x50257 and 8192x2304x256000 bf16 (NOTES.md, "Linear cross-entropy").
 *  A tuning call SYNCHRONISES its stream (not capturable in a CUDA graph), costs about 50 times
 *  the call, and leaves its outputs and workspace UNSPECIFIED (the trial runs accumulate into
 *  dweight): tune with the real shapes and throw-away or to-be-overwritten outputs, switch
 *  tuning off, then make the real calls. Tuned picks depend on timing, so two processes may
 *  pick differently; results are bitwise reproducible for the same picks (same ctx).
 *  on must be 0 or 1. CUDA builds only (else FL_ERR_NOT_BUILT).
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_lce_context_set_tuning(fl_lce_context* ctx, int on);

typedef enum { FL_LCE_ACCUM_AUTO = 0, FL_LCE_ACCUM_FP32 = 1, FL_LCE_ACCUM_LEAN = 2 } fl_lce_accum;

typedef struct fl_lce_options {
    size_t       struct_size;  /* = sizeof(fl_lce_options); set by FL_LCE_OPTIONS_INIT */
    int64_t      chunk_rows;   /* rows per chunk; 0 = from byte_budget (default 0) */
    size_t       byte_budget;  /* workspace bound used when chunk_rows == 0; default 512 MiB */
    fl_lce_accum wgrad_accum;  /* 16-bit dweight: see above; default FL_LCE_ACCUM_AUTO */
    int32_t      allow_tf32;   /* fp32 GEMMs on TF32 tensor cores; default 0 */
} fl_lce_options;

#define FL_LCE_OPTIONS_INIT { sizeof(fl_lce_options), 0, (size_t)512 << 20, FL_LCE_ACCUM_AUTO, 0 }

/*! fl_linear_cross_entropy_workspace_size() :
 *  Bytes of workspace every linear cross-entropy entry point (both backends, both modes) needs
 *  for these arguments; never 0. ce_opts / lce_opts may be NULL (defaults).
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_linear_cross_entropy_workspace_size(size_t* bytes, int64_t N, int64_t H, int64_t V,
                                                        fl_dtype dtype, fl_dtype wgrad_dtype,
                                                        const fl_ce_options* ce_opts,
                                                        const fl_lce_options* lce_opts);

/*! fl_linear_cross_entropy_forward_{cpu,cuda}() :
 *  loss : fp32, [N] for reduction NONE, [1] otherwise; overwritten; required.
 *  lse  : fp32 [N] (0 for ignored rows) or NULL; keep it for the backward of mode (2).
 *  dhidden, dweight, dbias : the gradients (mode 1) for the upstream gradient grad_loss /
 *         grad_scale (as in section 5), overwritten; all NULL for a loss-only forward (mode 2,
 *         grad_loss and grad_scale then ignored). dweight and dbias may be NULL independently
 *         (a frozen weight or bias); dbias requires bias; dhidden is required when dweight or
 *         dbias is given.
 *  ctx : CUDA only, from fl_lce_context_create() on the device that owns the pointers.
 *  In place / aliasing: no output may overlap another output or any input.
 *  CUDA: hidden, weight, bias, dhidden, dweight, dbias 16-byte aligned, and rows of hidden and
 *  weight 16-byte aligned (ld_hidden, ld_weight a multiple of 16 bytes: 8 elements at 16 bits,
 *  4 at fp32) — what cuBLASLt's fast kernels need; else FL_ERR_UNSUPPORTED.
 * @return : FL_OK or an error status (fl_last_error() has the detail). */
FL_API fl_status fl_linear_cross_entropy_forward_cpu(
    float* loss, float* lse, void* dhidden, void* dweight, void* dbias,
    const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
    const void* targets, const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V,
    fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
    const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes);
FL_API fl_status fl_linear_cross_entropy_forward_cuda(
    fl_lce_context* ctx,
    float* loss, float* lse, void* dhidden, void* dweight, void* dbias,
    const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
    const void* targets, const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V,
    fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
    const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes,
    fl_stream stream);

/*! fl_linear_cross_entropy_backward_{cpu,cuda}() :
 *  Mode (2): dhidden (required), dweight, dbias (each optional; dbias requires bias) from the
 *  forward's inputs, the lse it saved (same options!) and the upstream gradient grad_loss
 *  (fp32, [N] for NONE, [1] otherwise, or NULL meaning 1) times grad_scale. Recomputes the
 *  logits chunk by chunk. Outputs overwritten; no overlap with anything.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_linear_cross_entropy_backward_cpu(
    void* dhidden, void* dweight, void* dbias,
    const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
    const void* targets, const float* lse, const float* grad_loss, float grad_scale,
    int64_t N, int64_t H, int64_t V, fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
    const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes);
FL_API fl_status fl_linear_cross_entropy_backward_cuda(
    fl_lce_context* ctx,
    void* dhidden, void* dweight, void* dbias,
    const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
    const void* targets, const float* lse, const float* grad_loss, float grad_scale,
    int64_t N, int64_t H, int64_t V, fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype,
    const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes,
    fl_stream stream);

/*-****************************************************************************
 *  7. GeLU (tanh approximation or exact erf), with an optional fused bias
 *
 *  The activation of the transformer MLP, the bias of the preceding Linear folded in, and the
 *  bias gradient (a column sum over the N rows) fused into the backward pass.
 *  Layout: x, y, dy, dx are row-major [N, ld] with the first F columns used (ld >= F; columns
 *  F..ld-1 are neither read nor written); each matrix has its own row stride. bias, dbias: [F].
 *  Sizes are int64 and offsets are 64-bit everywhere (N*ld may exceed 2^31).
 *
 *  With u = x + b (b = bias[j] of the element's column j; b = 0 without a bias), exactly
 *  PyTorch's F.gelu(u, approximate=...) in opmath float (aten ActivationGeluKernel.cu):
 *    FL_GELU_TANH : y = (0.5 u) (1 + tanh(kB fma(kK, u^3, u))),  u^3 = (u u) u,
 *                   kB = float(sqrt(2) * 2/sqrt(pi) * 0.5) = 0.7978845608f, kK = 0.044715f
 *    FL_GELU_NONE : y = (0.5 u) (1 + erf(u kA)),                   kA = float(1/sqrt(2))
 *  Backward, du = dy * gelu'(u) (again PyTorch's gelu_backward, operation for operation):
 *    TANH : t = tanh(kB fma(kK, u^3, u)),
 *           du = dy fma(1 + t, 0.5, (0.5 u) fma(-t, t, 1) kB fma(3kK, u u, 1))
 *    NONE : du = dy fma(1 + erf(u kA), 0.5, u (exp((-0.5 u) u) kC)),  kC = float(2/sqrt(pi) * 0.5/sqrt(2))
 *  dx = du (rounded once to dtype); dbias[j] = sum over the N rows of du[i, j].
 *  The fma/product order shown is the one nvcc compiles PyTorch's expressions to, and the one
 *  both backends use (pinned with explicit fma/__fmul_rn; the CPU backend uses C fmaf).
 *
 *  Numerics: every operation in fp32 whatever the dtype (x, bias, dy converted exactly; u is
 *  formed in fp32 and NOT rounded to dtype before the activation, as torch.compile's fused
 *  kernel does; eager F.gelu(x + b) rounds x + b to fp16/bf16 first, so with 16-bit dtypes and
 *  a bias the results may differ from eager by 1 ulp of the dtype on a few elements; fp32 and
 *  bias-free calls follow eager's operations exactly).
 *  The only difference from PyTorch's CUDA kernel is the tanhf/erff/expf implementation:
 *    _cuda: CUDA's own tanhf/erff/expf (libdevice, max 2 / 2 / 2 ulp): the same functions
 *           PyTorch's CUDA kernel calls, so on the same toolkit the fp32 results are
 *           bitwise PyTorch's (not guaranteed across CUDA versions: then within 2 ulp of
 *           tanh/erf, i.e. |y - y_torch| <= ~2.4e-7 * |u| near the tails).
 *    _cpu : the C library's tanhf/erff/expf (glibc: <= 2 ulp), same operation order, so CPU
 *           and CUDA differ only by those functions' last bits (the tests' tolerance table).
 *  CUDA fp16 / bf16, by default (since 2026-12-02): a faster fp32 evaluation of the same
 *  function (FUSEDLOSS_GELU_EXACT16=1 in the environment, read once at the first CUDA GeLU call,
 *  selects the exact fp32 operations above instead: bitwise eager PyTorch on the same toolkit;
 *  the GPU tests and the PyTorch comparisons pass with either, H200 2026-12-02): tanh mode as
 *  u * sigmoid(2 v) = u / (1 + 2^(-2 v log2 e)), erf mode as u * Phi(u) with
 *  Phi(-|u|) = phi(u) * R(|u|), R a fitted rational (rel. error 1.4e-5 forward, 4.7e-7
 *  backward), both with ex2.approx / rcp.approx and no cancellation on the negative side. Every fp16 and bf16 input (checked exhaustively, tests/test_gelu.c) gives y
 *  within 1 ulp of the dtype of the exactly rounded GeLU, and dx (dy = 1) too except at <= 2 fp16
 *  inputs per mode next to gelu's minimum u ~ -0.75 (absolute error < 3e-7 there). The fp32 du
 *  summed into dbias is within the same bounds: relative error up to ~3e-4 where du crosses 0
 *  (u ~ -0.75), absolute <= 2^-21 |dy| there (eager PyTorch sums dx rounded to 16 bits). Versus
 *  PyTorch's 16-bit results: within 1 ulp of the dtype, except where PyTorch's own fp32 formula
 *  cancels (u < ~-3: 1 + tanh / 1 + erf; its error there is ~|u| 2^-23, ours is smaller), and
 *  zeros may differ in sign. fp32 is unchanged (PyTorch's operations, above). NaN/inf as PyTorch:
 *  NaN at u = -inf (both modes), at |u| = inf in backward, and in tanh-mode backward where u*u
 *  overflows (|u| > ~1.8e19); no NaN where PyTorch is finite.
 *  dbias accumulates in fp32 on CUDA (per-thread row sums, then a fixed-order tree over
 *  threads and row blocks) and in double on the CPU; it is rounded once to bias_dtype.
 *  NaN/inf propagate as in PyTorch (e.g. tanh-mode backward at |u| > ~1.8e19 is NaN there too).
 *
 *  Dtypes: dtype (x, y, dy, dx) fp32 / fp16 / bf16. bias_dtype (bias and dbias) is dtype or
 *  fp32 (an fp32 bias parameter with bf16 activations, as under autocast). Outputs overwritten.
 *
 *  Aliasing: in-place is allowed exactly as y == x (forward), dx == dy or dx == x (backward),
 *  with equal row strides (each element is read before it is written, by the same thread);
 *  inputs may alias each other; any other overlap of an output with anything is
 *  FL_ERR_INVALID_ARGUMENT.
 *
 *  Determinism: both backends give bitwise-identical outputs on every run; dbias is summed in
 *  a fixed order (CUDA: the order depends only on N, F, dtype and the buffers' 16-byte
 *  alignment, never on the GPU or timing; CPU: not on the thread count).
 *
 *  CUDA speed notes: 16-byte vector accesses when every row of every matrix starts 16-byte
 *  aligned, or when the matrices are contiguous (ld == F) with 16-byte aligned bases (odd F:
 *  the matrix is then streamed as a flat array); otherwise a slower scalar path. One launch,
 *  plus (backward with dbias, in most layouts) one small launch for the dbias total.
 *  No allocation, no host synchronisation; graph-capturable.
 ******************************************************************************/
typedef enum { FL_GELU_NONE = 0, FL_GELU_TANH = 1 } fl_gelu_approx;

/*! fl_gelu_workspace_size() :
 *  Bytes of workspace fl_gelu_backward_{cpu,cuda}() need for these sizes when dbias is
 *  requested (either backend; the same answer for both). Without dbias no workspace is needed
 *  (pass NULL, 0). The answer is never 0 and at most about 4 KiB + max(2 MiB, 1024 bytes * F)
 *  (3 MiB at F = 3072, 16 MiB at F = 16384: fp32 partial column sums of up to 256 row blocks).
 *  CUDA workspace rules: device memory, 256-byte aligned, and its first 4096 bytes (the
 *  row-block counters) must be ZERO before the first call that uses it, e.g. one
 *  cudaMemsetAsync after allocating it; every backward call leaves them zero again, so the
 *  same workspace can serve any later GeLU backward call on the same stream without being
 *  cleared again. Do not share it with other ops (or clear those 4096 bytes after they ran).
 *  The rest of the workspace is scratch. CPU: host memory, any content.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_gelu_workspace_size(size_t* bytes, int64_t N, int64_t F, fl_dtype dtype);

/*! fl_gelu_forward_{cpu,cuda}() :
 *  y[N, ld_y] = gelu(x + bias) (see above), rounded once to dtype. bias: [F] of bias_dtype,
 *  or NULL (then bias_dtype is ignored). N >= 0 (N == 0: nothing is done), F >= 1,
 *  ld_y >= F, ld_x >= F. In place: y == x with ld_y == ld_x. Pointers aligned to their element
 *  size. CUDA: asynchronous on `stream`; one launch.
 * @return : FL_OK or an error status (fl_last_error() has the detail). */
FL_API fl_status fl_gelu_forward_cpu(void* y, const void* x, const void* bias,
                                     int64_t N, int64_t F, int64_t ld_y, int64_t ld_x,
                                     fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx);
FL_API fl_status fl_gelu_forward_cuda(void* y, const void* x, const void* bias,
                                      int64_t N, int64_t F, int64_t ld_y, int64_t ld_x,
                                      fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                                      fl_stream stream);

/*! fl_gelu_backward_{cpu,cuda}() :
 *  From the forward's inputs x, bias (NOT its output: nothing but x and the [F] bias needs to
 *  be kept for backward) and the upstream gradient dy[N, ld_dy]:
 *    dx[N, ld_dx] = dy * gelu'(x + bias), dtype, overwritten; required when N > 0;
 *    dbias[F]     = column sums of dy * gelu'(x + bias) over the N rows, bias_dtype, overwritten
 *                   (zeros when N == 0); or NULL to skip it. dbias requires bias (a bias
 *                   without dbias is fine: a frozen bias).
 *  In place: dx == dy (ld_dx == ld_dy) or dx == x (ld_dx == ld_x).
 *  workspace: fl_gelu_workspace_size() bytes when dbias != NULL (see its rules), else unused.
 *  CUDA: asynchronous on `stream`; dx and dbias come from one kernel that reads x and dy once
 *  (row blocks write fp32 partial column sums) and a small second kernel that adds the partials
 *  in an order fixed by N, F, dtype and approx alone (deterministic); in a few layouts the
 *  last thread blocks of the first kernel add them instead (one launch).
 * @return : FL_OK or an error status. */
FL_API fl_status fl_gelu_backward_cpu(void* dx, void* dbias, const void* dy, const void* x,
                                      const void* bias, int64_t N, int64_t F,
                                      int64_t ld_dx, int64_t ld_dy, int64_t ld_x,
                                      fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                                      void* workspace, size_t workspace_bytes);
FL_API fl_status fl_gelu_backward_cuda(void* dx, void* dbias, const void* dy, const void* x,
                                       const void* bias, int64_t N, int64_t F,
                                       int64_t ld_dx, int64_t ld_dy, int64_t ld_x,
                                       fl_dtype dtype, fl_dtype bias_dtype, fl_gelu_approx approx,
                                       void* workspace, size_t workspace_bytes, fl_stream stream);

/*-****************************************************************************
 *  8. Vocab-parallel cross-entropy (logits sharded by vocabulary over ranks)
 *
 *  Each of k ranks holds the logits of a contiguous slice [vocab_start, vocab_start + V_local) of
 *  the global vocabulary [0, V) for the same N rows (shards may be uneven; together they cover
 *  [0, V) exactly once). Targets are GLOBAL class ids, the same [N] array on every rank. The
 *  result is section 5's cross-entropy of the concatenated logits, bit-for-bit the same formulas
 *  (label smoothing and its class weights over the WHOLE vocabulary, z-loss, softcap, logit scale,
 *  ignore_index, every reduction), with one small collective the caller runs on its own engine:
 *
 *    1. fl_vp_ce_local_stats_*()  on every rank: stats[N][4] fp32 per row from its shard:
 *         (m, s, wz, zt) = (max_j z_j, sum_j exp(z_j - m), sum_j w_j z_j, z_t if t is in this shard
 *         else 0), j over the shard, z as in section 5 (w_j = 1 without class weights; wz is
 *         only formed with label smoothing, which alone needs it, and is 0 otherwise); m is the
 *         fp32 value stored and s is relative to that stored m (so m's rounding cancels in step 3);
 *         a shard whose z are all -inf gives (-inf, 0, ...).
 *    2. the caller all-gathers the k stats arrays IN RANK ORDER (shard order: rank r's slice
 *       starts after rank r-1's) into gathered[k][N][4]: O(N) bytes (16 N per rank), never
 *       O(N V). E.g. ncclAllGather / torch.distributed.all_gather_into_tensor.
 *    3. fl_vp_ce_combine_*()      on every rank: merges the k partial rows in rank order (so every
 *       rank gets the same bits, whatever the collective's algorithm) into the global lse[N] and
 *       the loss (as section 5's forward: [N] for NONE, [1] otherwise).
 *    4. fl_vp_ce_backward_*()     on every rank: dlogits of its shard from its logits, the global
 *       lse and the upstream gradient (section 5's backward restricted to the shard's columns).
 *
 *  Options (fl_ce_options) are section 5's; opts->weight, when given, is the GLOBAL class-weight
 *  array [V] (every rank passes the whole array; its sum W is computed from it), and so is
 *  opts->logit_offset; opts->target_prob is refused (FL_ERR_UNSUPPORTED). The same options must be
 *  passed to all steps on all ranks.
 *  Out-of-range targets (not in [0, V), not ignore_index): CPU steps 1, 3 and 4 (all read the
 *  targets) return FL_ERR_TARGET_OUT_OF_RANGE before writing anything; the CUDA steps behave as
 *  section 5's CUDA backend (NaN, flag).
 *  Numerics: as section 5 (fp32 on CUDA, double on the CPU, fp32 outputs); the merge of step 3 is
 *  M = max_r m_r, S = sum_r s_r exp(m_r - M) (in rank order), lse = M + log S, sum w z and z_t
 *  summed in rank order; so with k = 1 the results equal fl_cross_entropy_*'s up to the rounding
 *  of the stats to fp32 between the steps (the CPU backend keeps them in double internally, but
 *  step 2 moves fp32).
 *  Workspace: every step takes the section-5 workspace of its call (fl_cross_entropy_workspace_size
 *  with N and, for steps 1 and 4, V_local and the logits' dtype; for step 3, V and any dtype: step 3
 *  has no dtype argument and reads no logits, so the smallest answer, a 16-bit dtype's, suffices).
 *  CUDA steps (`_cuda`): the same arguments plus a stream; asynchronous, no allocation, no host
 *  sync, graph-capturable. Step 1 reads the shard once (section 5's streaming forward kernel), step
 *  3 is one thread per row plus section 5's reduce kernel, step 4 is section 5's backward (one read,
 *  one write). Step 2 is the caller's collective on the same stream (or one ordered after it).
 *  fl_vp_cross_entropy_nccl() does steps 1-4 with NCCL's all-gather (below).
 *
 *  LINEAR VARIANT (the lm_head's weight sharded by vocabulary rows, Megatron style): rank r holds
 *  weight rows [vocab_start, vocab_start + V_local) ([V_local, H], row stride ld_weight) and, if
 *  any, their bias [V_local]; hidden [N, H] and the targets are the same on every rank. The shard's
 *  logits hidden · weightᵀ (+ bias) are section 6's (accumulated in fp32, double on the CPU,
 *  rounded once to dtype), formed a chunk of rows at a time (section 6's chunk plan with V_local
 *  for V, byte budget in lce_opts): no rank holds more than a chunk of its own shard's logits.
 *    1'. fl_vp_linear_ce_local_stats_*(): step 1's stats [N][4] of the shard's logits (1 GEMM).
 *    2, 3 as above (the caller's all-gather; fl_vp_ce_combine_*: the global lse and the loss).
 *    4'. fl_vp_linear_ce_backward_*(): recomputes the shard's logits chunk by chunk, forms their
 *        gradient (step 4) and from it this rank's dhidden PARTIAL (fp32 [N, H], = dlogits_shard ·
 *        weight_shard: the sum over the ranks is dhidden; the caller all-reduces it, e.g. with
 *        torch.distributed.all_reduce, and rounds it to its dtype once), and the shard's dweight
 *        [V_local, H] and dbias [V_local] (wgrad_dtype and lce_opts->wgrad_accum as section 6).
 *        3 GEMMs; with 1' that is section 6's mode (2): 4 GEMMs in all, any upstream gradient.
 *  fl_vp_linear_cross_entropy_nccl() (below) does it all on an NCCL communicator in section 6's
 *  mode (1): per chunk of rows GEMM1, step 1, an all-gather of the chunk's stats (16 bytes per row
 *  and rank), step 3, step 4 in place, GEMM2 into fp32, an fp32 all-reduce (sum) of the chunk's
 *  dhidden rows rounded once to dtype, GEMM3; 3 GEMMs, moving 16 N + 4 N H bytes per rank.
 *  Workspace of all three: fl_vp_linear_ce_workspace_size() (k = the number of ranks; only the NCCL
 *  entry uses the k-dependent part; step 1' forms no gradients, so the answer for any wgrad_dtype
 *  suffices for it). Options as the other steps (ce_opts->weight and
 *  ->logit_offset GLOBAL [V] arrays, target_prob refused); alignment rules (CUDA) and aliasing as
 *  section 6, with dhidden of 4'. fp32 16-byte aligned.
 ******************************************************************************/

/*! fl_vp_ce_local_stats_{cpu,cuda}() :
 *  stats : fp32 [N][4], overwritten (rows of ignored targets: (-inf, 0, 0, 0)).
 *  logits: this rank's [N, ld] of dtype, V_local >= 1 columns used (ld >= V_local), the global
 *          classes vocab_start .. vocab_start + V_local - 1 (0 <= vocab_start, vocab_start + V_local <= V).
 * @return : FL_OK or an error status. */
FL_API fl_status fl_vp_ce_local_stats_cpu(float* stats, const void* logits, const void* targets, int64_t N,
                                          int64_t V_local, int64_t ld, int64_t vocab_start, int64_t V,
                                          fl_dtype dtype, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                          void* workspace, size_t workspace_bytes);

/*! fl_vp_ce_combine_{cpu,cuda}() :
 *  gathered : fp32 [k][N][4], the k ranks' stats in rank order (k >= 1).
 *  loss : fp32 [N] (NONE) or [1]; lse : fp32 [N] (0 for ignored rows), required (step 4 needs it).
 * @return : FL_OK or an error status. */
FL_API fl_status fl_vp_ce_combine_cpu(float* loss, float* lse, const float* gathered, int k, const void* targets,
                                      int64_t N, int64_t V, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                      void* workspace, size_t workspace_bytes);

/*! fl_vp_ce_backward_{cpu,cuda}() :
 *  dlogits [N, ld] (this rank's shard, dtype of logits, first V_local columns overwritten) =
 *  section 5's gradient of the global loss w.r.t. this shard's logits, from the global lse of
 *  step 3 and grad_loss / grad_scale as in section 5. In place (dlogits == logits) allowed.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_vp_ce_backward_cpu(void* dlogits, const void* logits, const void* targets, const float* lse,
                                       const float* grad_loss, float grad_scale, int64_t N, int64_t V_local,
                                       int64_t ld, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                       fl_index_dtype index_dtype, const fl_ce_options* opts, void* workspace,
                                       size_t workspace_bytes);

FL_API fl_status fl_vp_ce_local_stats_cuda(float* stats, const void* logits, const void* targets, int64_t N,
                                           int64_t V_local, int64_t ld, int64_t vocab_start, int64_t V,
                                           fl_dtype dtype, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                           void* workspace, size_t workspace_bytes, fl_stream stream);
FL_API fl_status fl_vp_ce_combine_cuda(float* loss, float* lse, const float* gathered, int k, const void* targets,
                                       int64_t N, int64_t V, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                       void* workspace, size_t workspace_bytes, fl_stream stream);
FL_API fl_status fl_vp_ce_backward_cuda(void* dlogits, const void* logits, const void* targets, const float* lse,
                                        const float* grad_loss, float grad_scale, int64_t N, int64_t V_local,
                                        int64_t ld, int64_t vocab_start, int64_t V, fl_dtype dtype,
                                        fl_index_dtype index_dtype, const fl_ce_options* opts, void* workspace,
                                        size_t workspace_bytes, fl_stream stream);

/*! fl_vp_cross_entropy_nccl() : steps 1-4 on every rank of an NCCL communicator, on `stream`.
 *  nccl_comm : the caller's ncclComm_t (passed as void*: this header does not include nccl.h),
 *         one rank per vocabulary shard, communicator rank r holding shard r (shards in rank order,
 *         as above); k = ncclCommCount(comm). NCCL is found at run time (dlopen: the process's
 *         libnccl.so.2, e.g. PyTorch's, or FUSEDLOSS_NCCL_LIBRARY); not a link dependency.
 *  loss, lse : as fl_vp_ce_combine (lse may be NULL: then kept in the workspace).
 *  dlogits : NULL for the loss only; else this shard's gradient, formed in the same call from the
 *         upstream gradient given up front (grad_loss / grad_scale as section 5's fused call);
 *         dlogits == logits (in place) allowed.
 *  Every rank must make the same call (same N, V, options); an argument error returns before
 *  the collective on the rank that has it (the others then wait in NCCL: check arguments the
 *  same way on every rank). Workspace: fl_vp_cross_entropy_nccl_workspace_size(N, V_local, V,
 *  dtype, k) bytes of device memory (section 5's workspace, the stats, the gathered stats, lse).
 *  Moves 16 N bytes per rank (NCCL all-gather), never O(N V).
 * @return : FL_OK or an error status (FL_ERR_UNSUPPORTED when NCCL cannot be loaded). */
FL_API fl_status fl_vp_cross_entropy_nccl_workspace_size(size_t* bytes, int64_t N, int64_t V_local, int64_t V,
                                                         fl_dtype dtype, int k, const fl_ce_options* opts);
FL_API fl_status fl_vp_cross_entropy_nccl(float* loss, float* lse, void* dlogits, const void* logits,
                                          const void* targets, const float* grad_loss, float grad_scale, int64_t N,
                                          int64_t V_local, int64_t ld, int64_t vocab_start, int64_t V,
                                          fl_dtype dtype, fl_index_dtype index_dtype, const fl_ce_options* opts,
                                          void* nccl_comm, void* workspace, size_t workspace_bytes,
                                          fl_stream stream);

/*! fl_vp_linear_ce_workspace_size() :
 *  Bytes of workspace the linear vocab-parallel entry points (1', 4', the NCCL entry; both
 *  backends) need: section 6's plan for N, H, V_local, plus (NCCL) an fp32 [chunk_rows, H] dhidden
 *  chunk, the chunk's stats [chunk_rows][4], gathered stats [k][chunk_rows][4] and lse [N]. Never 0.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_vp_linear_ce_workspace_size(size_t* bytes, int64_t N, int64_t H, int64_t V_local, int64_t V,
                                                fl_dtype dtype, fl_dtype wgrad_dtype, int k,
                                                const fl_ce_options* ce_opts, const fl_lce_options* lce_opts);

/*! fl_vp_linear_ce_local_stats_{cpu,cuda}() :
 *  stats : fp32 [N][4] as fl_vp_ce_local_stats (rows of ignored targets (-inf, 0, 0, 0)).
 *  hidden [N, ld_hidden], weight = this rank's rows [V_local, ld_weight], bias [V_local] or NULL.
 *  ctx : CUDA only (section 6's context). */
FL_API fl_status fl_vp_linear_ce_local_stats_cpu(
    float* stats, const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias,
    const void* targets, int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
    fl_index_dtype index_dtype, const fl_ce_options* ce_opts, const fl_lce_options* lce_opts, void* workspace,
    size_t workspace_bytes);
FL_API fl_status fl_vp_linear_ce_local_stats_cuda(
    fl_lce_context* ctx, float* stats, const void* hidden, int64_t ld_hidden, const void* weight, int64_t ld_weight,
    const void* bias, const void* targets, int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V,
    fl_dtype dtype, fl_index_dtype index_dtype, const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
    void* workspace, size_t workspace_bytes, fl_stream stream);

/*! fl_vp_linear_ce_backward_{cpu,cuda}() :
 *  dhidden_partial : fp32 [N, H] contiguous, overwritten (required): this rank's share of dhidden.
 *  dweight [V_local, H] (wgrad_dtype), dbias [V_local] (wgrad_dtype): the shard's gradients,
 *         overwritten, each optional (dbias requires bias).
 *  lse : the global lse of step 3; grad_loss / grad_scale as section 5's backward. Same options
 *  as step 1' and 3. No output may overlap another output or any input.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_vp_linear_ce_backward_cpu(
    float* dhidden_partial, void* dweight, void* dbias, const void* hidden, int64_t ld_hidden, const void* weight,
    int64_t ld_weight, const void* bias, const void* targets, const float* lse, const float* grad_loss,
    float grad_scale, int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V, fl_dtype dtype,
    fl_dtype wgrad_dtype, fl_index_dtype index_dtype, const fl_ce_options* ce_opts, const fl_lce_options* lce_opts,
    void* workspace, size_t workspace_bytes);
FL_API fl_status fl_vp_linear_ce_backward_cuda(
    fl_lce_context* ctx, float* dhidden_partial, void* dweight, void* dbias, const void* hidden, int64_t ld_hidden,
    const void* weight, int64_t ld_weight, const void* bias, const void* targets, const float* lse,
    const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V,
    fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype, const fl_ce_options* ce_opts,
    const fl_lce_options* lce_opts, void* workspace, size_t workspace_bytes, fl_stream stream);

/*! fl_vp_linear_cross_entropy_nccl() : the linear variant on an NCCL communicator (rank r holds
 *  weight shard r, shards in rank order, k = ncclCommCount), mode (1), on `stream`.
 *  loss : [N] (NONE) or [1], every rank the same bits; lse [N] or NULL.
 *  dhidden [N, H] (dtype, contiguous): the FULL gradient (summed over the ranks in fp32, rounded
 *         once), the same on every rank; NULL for the loss only (then dweight and dbias must be
 *         NULL too, and grad_loss / grad_scale are ignored).
 *  dweight [V_local, H], dbias [V_local] (wgrad_dtype, optional): this shard's, for the upstream
 *         gradient grad_loss / grad_scale given up front (section 5's fused call).
 *  NCCL is loaded at run time as for fl_vp_cross_entropy_nccl. Every rank must make the same call.
 * @return : FL_OK or an error status (FL_ERR_UNSUPPORTED when NCCL cannot be loaded). */
FL_API fl_status fl_vp_linear_cross_entropy_nccl(
    fl_lce_context* ctx, float* loss, float* lse, void* dhidden, void* dweight, void* dbias, const void* hidden,
    int64_t ld_hidden, const void* weight, int64_t ld_weight, const void* bias, const void* targets,
    const float* grad_loss, float grad_scale, int64_t N, int64_t H, int64_t V_local, int64_t vocab_start, int64_t V,
    fl_dtype dtype, fl_dtype wgrad_dtype, fl_index_dtype index_dtype, const fl_ce_options* ce_opts,
    const fl_lce_options* lce_opts, void* nccl_comm, void* workspace, size_t workspace_bytes, fl_stream stream);

/*-****************************************************************************
 *  9. Elementwise losses: sigmoid focal, BCE with logits
 *
 *  Two losses of one logit x and one target y each (targets are probabilities: any real y in
 *  [0, 1], soft labels included; same shape and dtype as the logits). Per element, with
 *  sp = log1p(exp(-|x|)) and the binary cross-entropy on logits in PyTorch's operation order
 *  (F.binary_cross_entropy_with_logits: (1 - y) x - log_sigmoid(x) log_weight):
 *
 *    bce(x, y, pw) = (1 - y) * x + (1 + (pw - 1) * y) * (sp + max(-x, 0))
 *
 *  (= max(x, 0) - x y + sp for pw = 1, the usual stable form; PyTorch's order is used because
 *  it does not cancel for large x and y near 1.)
 *
 *  SIGMOID FOCAL (torchvision.ops.sigmoid_focal_loss, = detectron / fvcore), pw = 1:
 *    p = sigmoid(x), q = 1 - p_t = p (1 - y) + (1 - p) y,  a = alpha y + (1 - alpha)(1 - y)
 *    l = a * (bce(x, y, 1) * q^gamma)             (a = 1 when alpha < 0: no alpha weighting)
 *    gamma >= 0 (0: l = a * bce), any finite alpha (torchvision's default 0.25; < 0 disables).
 *    dl/dx = a * [ (p - y) q^gamma + gamma * bce * (1 - 2y) p (1 - p) q^(gamma - 1) ]
 *    evaluated as a * q^gamma * [ d + gamma * bce * (1 - 2y) * (p (1 - p) / q) ] with
 *    d = p (1 - y) - (1 - p) y (= p - y without its cancellation) and p (1 - p) / q <= 1
 *    (gamma 1 and 2: a * [ d q^gamma + gamma * bce * (1 - 2y) * p (1 - p) * q^(gamma - 1) ]).
 *    Where q == 0 in fp32 (the sigmoid saturated: y = 1 and x > ~104, or y = 0 and x < ~-104;
 *    never for soft y in (0, 1)) the derivative of q^gamma is q^(gamma-1) = inf for gamma < 1;
 *    the gradient is then exactly what PyTorch's autograd gives for torchvision's expression:
 *      gamma == 0     : a * (p - y)           (torch's pow backward is 0 for exponent 0)
 *      0 < gamma < 1  : NaN                   (torch: 0 * inf, checked in float64 and fp32)
 *      gamma == 1     : a * (q + bce * (1 - 2y) p (1 - p)) = 0 (NaN if bce is NaN)
 *      gamma > 1      : 0                     (NaN if bce is NaN)
 *    This deliberately follows PyTorch (the "focal loss NaN" of gamma < 1) rather than taking the
 *    limit 0: a drop-in must not hide what the reference does. Note fp32 saturates later
 *    (|x| ~ 104, subnormals kept) than PyTorch's fp32 sigmoid (1 - p_t rounds to 0 at |x| ~ 17)
 *    and float64's (|x| ~ 37), so between those points PyTorch may give NaN where this is finite.
 *    q^gamma is q*q for gamma == 2, q for 1, 1 for 0 (as torch's pow), else powf.
 *
 *  BCE WITH LOGITS (torch.nn.functional.binary_cross_entropy_with_logits):
 *    logits, targets viewed as [N, C] row-major contiguous (C = the last dimension);
 *    weight [C] and pos_weight [C] fp32 (host for _cpu, device for _cuda), each optional (NULL:
 *    all ones), broadcast over the rows (only this layout: a weight of another broadcast shape
 *    is the caller's multiply, as fusedloss.binary_cross_entropy_with_logits does it):
 *    l[i, c] = weight[c] * bce(x, y, pos_weight[c])
 *    dl/dx = weight[c] * ((pw y + 1 - y) sigmoid(x) - pw y)     (PyTorch's backward formula)
 *    evaluated as weight[c] * (p (1 - y) - pw y (1 - p)) (no cancellation for y in {0, 1}).
 *    Values of weight / pos_weight are not checked (PyTorch allows any).
 *
 *  NaN / inf: as PyTorch: e.g. x = +inf with y = 1 gives bce = 0 * inf = NaN (PyTorch too).
 *
 *  Reductions (n = number of elements; n = N*C for BCE):
 *    NONE : loss[k] = l_k, [n] fp32.   SUM : loss[0] = sum_k l_k.   MEAN : loss[0] = sum / n
 *    (n == 0: SUM 0, MEAN NaN, as PyTorch). Sums in double (CPU: fixed contiguous blocks;
 *    CUDA: fp32 per 8 elements, then double per thread, block trees and one reduce kernel), so
 *    the result is deterministic and does not depend on the thread count or the GPU.
 *
 *  Gradients: dlogits[k] = g_k * dl_k/dx_k, rounded once to dtype, where the upstream gradient
 *    g_k = grad_scale * (grad_loss ? grad_loss[r] : 1) [/ n for MEAN], r = k for NONE, 0
 *    otherwise (fp32; host memory for _cpu, device memory for _cuda: no host sync); exactly as
 *    section 5's cross-entropy. grad_scale must be finite. No gradient w.r.t. the targets.
 *
 *  Numerics: inputs converted exactly to fp32, every operation in fp32, no fast-math: expf for
 *  e = exp(-|x|); sp = log1p(e) as 2 atanh(s), s = e / (2 + e), by its series to the w^6 term
 *  (w = s^2 <= 1/9: within ~2 fp32 ulps, measured 2.6e-7 relative at worst over e in (0, 1]);
 *  1 / (1 + e) and 1 / (2 + e) an IEEE division on the CPU, the hardware reciprocal plus one
 *  Newton step on CUDA (within 1 ulp); q^gamma by powf only for gamma not in {0, 1, 2}, and for
 *  gamma 1 and 2 the gradient's p (1 - p) q^(gamma - 1) multiplied out (no division). Both
 *  backends evaluate the same formulas (src/cpu/elementwise_math.h), so they differ only in
 *  expf / powf's last bits, the reciprocals and nvcc's fma contraction. The loss fp32, dlogits
 *  in the logits' dtype.
 *  fp16 / bf16 logits on CUDA use faster forms by default: e = ex2.approx(-|x| log2 e), bare
 *  hardware reciprocals and the log1p series to its w^3 term, so each loss element is within
 *  ~1e-5 relative of the exact forms' (|x| 6e-8 + 2e-7 relative in e, the series 1.5e-6; focal's
 *  q^2 triples e's part) and dlogits within 1 ulp of its dtype, ~20% fewer instructions (the
 *  16-bit kernels are compute-bound). The environment variable FUSEDLOSS_EW_EXACT16=1, read at
 *  the first call, selects the exact forms above for them too. fp32 logits and the CPU backend
 *  always use the exact forms. Elements are independent: any n
 *  (including 0 and > 2^31; 64-bit offsets).
 *  Dtypes: logits / targets / dlogits fp32, fp16, bf16 (targets in the logits' dtype).
 *  Aliasing: dlogits == logits is allowed (in place; each element is read before it is written);
 *  no other overlap of an output with anything (FL_ERR_INVALID_ARGUMENT).
 *  Workspace: MEAN / SUM forward and fused need fl_{sigmoid_focal,bce_with_logits}_workspace_size()
 *  bytes (CUDA: device memory, 256-byte aligned; content ignored, clobbered); NONE and backward
 *  need none (pass NULL, 0).
 *  CUDA: one grid-stride kernel (16-byte vector accesses when logits, targets and the other arrays
 *  share their alignment; a scalar head / tail; else a scalar path) plus, for MEAN / SUM, one
 *  small reduce kernel; the grid depends only on n. Asynchronous on `stream`, no allocation, no
 *  host sync, graph-capturable.
 ******************************************************************************/

/*! fl_sigmoid_focal_workspace_size() / fl_bce_with_logits_workspace_size() :
 *  Bytes of workspace a MEAN / SUM forward or fused call needs for n (= N*C) elements, either
 *  backend; never 0, at most 8448.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_sigmoid_focal_workspace_size(size_t* bytes, int64_t n);
FL_API fl_status fl_bce_with_logits_workspace_size(size_t* bytes, int64_t N, int64_t C);

/*! fl_sigmoid_focal_forward_{cpu,cuda}() :
 *  loss : fp32, [n] for reduction NONE, [1] otherwise; overwritten; required (may be NULL only
 *         for NONE with n == 0).
 *  logits, targets : [n] of dtype. n >= 0; gamma >= 0 and finite; alpha finite (< 0: off).
 * @return : FL_OK or an error status (fl_last_error() has the detail). */
FL_API fl_status fl_sigmoid_focal_forward_cpu(float* loss, const void* logits, const void* targets, int64_t n,
                                              fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                                              void* workspace, size_t workspace_bytes);
FL_API fl_status fl_sigmoid_focal_forward_cuda(float* loss, const void* logits, const void* targets, int64_t n,
                                               fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                                               void* workspace, size_t workspace_bytes, fl_stream stream);

/*! fl_sigmoid_focal_backward_{cpu,cuda}() :
 *  dlogits [n] (dtype, overwritten) from logits, targets and grad_loss / grad_scale (above).
 *  dlogits == logits allowed. No workspace.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_sigmoid_focal_backward_cpu(void* dlogits, const void* logits, const void* targets,
                                               const float* grad_loss, float grad_scale, int64_t n,
                                               fl_dtype dtype, float alpha, float gamma, fl_reduction reduction);
FL_API fl_status fl_sigmoid_focal_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                                const float* grad_loss, float grad_scale, int64_t n,
                                                fl_dtype dtype, float alpha, float gamma, fl_reduction reduction,
                                                fl_stream stream);

/*! fl_sigmoid_focal_fused_{cpu,cuda}() :
 *  loss (as forward) and dlogits (as backward) in one pass, the upstream gradient known up front
 *  (grad_loss may be a device pointer computed on the device). dlogits == logits allowed.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_sigmoid_focal_fused_cpu(float* loss, void* dlogits, const void* logits, const void* targets,
                                            const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                            float alpha, float gamma, fl_reduction reduction,
                                            void* workspace, size_t workspace_bytes);
FL_API fl_status fl_sigmoid_focal_fused_cuda(float* loss, void* dlogits, const void* logits, const void* targets,
                                             const float* grad_loss, float grad_scale, int64_t n, fl_dtype dtype,
                                             float alpha, float gamma, fl_reduction reduction,
                                             void* workspace, size_t workspace_bytes, fl_stream stream);

/*! fl_bce_with_logits_forward_{cpu,cuda}() :
 *  loss : fp32, [N*C] for reduction NONE, [1] otherwise; overwritten; required.
 *  logits, targets : [N, C] contiguous of dtype; weight, pos_weight : fp32 [C] or NULL.
 *  N >= 0, C >= 1.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_bce_with_logits_forward_cpu(float* loss, const void* logits, const void* targets,
                                                const float* weight, const float* pos_weight, int64_t N, int64_t C,
                                                fl_dtype dtype, fl_reduction reduction,
                                                void* workspace, size_t workspace_bytes);
FL_API fl_status fl_bce_with_logits_forward_cuda(float* loss, const void* logits, const void* targets,
                                                 const float* weight, const float* pos_weight, int64_t N, int64_t C,
                                                 fl_dtype dtype, fl_reduction reduction,
                                                 void* workspace, size_t workspace_bytes, fl_stream stream);

/*! fl_bce_with_logits_backward_{cpu,cuda}() :
 *  dlogits [N, C] (dtype, overwritten); grad_loss / grad_scale as above. No workspace.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_bce_with_logits_backward_cpu(void* dlogits, const void* logits, const void* targets,
                                                 const float* weight, const float* pos_weight,
                                                 const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                                 fl_dtype dtype, fl_reduction reduction);
FL_API fl_status fl_bce_with_logits_backward_cuda(void* dlogits, const void* logits, const void* targets,
                                                  const float* weight, const float* pos_weight,
                                                  const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                                  fl_dtype dtype, fl_reduction reduction, fl_stream stream);

/*! fl_bce_with_logits_fused_{cpu,cuda}() : loss and dlogits in one pass (as the focal fused).
 * @return : FL_OK or an error status. */
FL_API fl_status fl_bce_with_logits_fused_cpu(float* loss, void* dlogits, const void* logits, const void* targets,
                                              const float* weight, const float* pos_weight,
                                              const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                              fl_dtype dtype, fl_reduction reduction,
                                              void* workspace, size_t workspace_bytes);
FL_API fl_status fl_bce_with_logits_fused_cuda(float* loss, void* dlogits, const void* logits, const void* targets,
                                               const float* weight, const float* pos_weight,
                                               const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                               fl_dtype dtype, fl_reduction reduction,
                                               void* workspace, size_t workspace_bytes, fl_stream stream);

/*-****************************************************************************
 *  10. Distillation divergences on raw logits: KL, reverse KL, generalised JSD
 *
 *  Student logits s and teacher logits t, both [N, V] row-major with row strides ld_student,
 *  ld_teacher >= V (columns V.. are neither read nor written). Per row i, temperature T > 0:
 *
 *    log q_j = s_j / T - log sum_k exp(s_k / T)        (student distribution Q)
 *    log p_j = t_j / T - log sum_k exp(t_k / T)        (teacher distribution P)
 *
 *  and, with beta in [0, 1] (Liger-Kernel's LigerJSD convention, 0 log 0 = 0):
 *
 *    beta == 0 : l_i = KL(P || Q) = sum_j p_j (log p_j - log q_j)    forward KL (Hinton)
 *    beta == 1 : l_i = KL(Q || P) = sum_j q_j (log q_j - log p_j)    reverse KL
 *    otherwise : l_i = beta KL(P || M) + (1 - beta) KL(Q || M),  M = beta P + (1 - beta) Q
 *
 *  The general formula tends to 0 as beta -> 0 or 1; the two end points are the named KL
 *  divergences (as in Liger), so l is not continuous in beta there. With opts->t2_scale != 0
 *  every l_i is multiplied by T^2 (Hinton's scaling: gradient magnitudes independent of T).
 *  F.kl_div(log_softmax(s/T), log_softmax(t/T), log_target=True, reduction="batchmean") * T^2
 *  is beta = 0, t2_scale = 1, FL_REDUCTION_BATCHMEAN.
 *
 *  Ignored rows: labels (optional, [N] of label_dtype; NULL = no row ignored) with
 *  labels[i] == opts->ignore_index: l_i = 0, gradient 0, neither row is read. Other label
 *  values are not looked at (any value, no range check: they only mask rows).
 *
 *  Reductions:
 *    NONE      : loss[i] = l_i (loss has N entries)
 *    SUM       : loss[0] = sum_i l_i
 *    MEAN      : loss[0] = sum_i l_i / (number of rows not ignored)   (Liger's JSD mean; NaN if
 *                every row is ignored or N == 0, gradient then 0)
 *    BATCHMEAN : loss[0] = sum_i l_i / N   (F.kl_div's "batchmean"; NaN if N == 0; 0 when every row
 *                of N > 0 is ignored)
 *
 *  Gradient, w.r.t. the student logits only (the teacher is a constant):
 *    dstudent[i, j] = g_i * d l_i / d s_j, with the upstream gradient
 *    g_i = grad_scale * (grad_loss ? grad_loss[r] : 1) [/ D for MEAN, BATCHMEAN], r = i for NONE,
 *    0 otherwise (fp32; device memory for _cuda, no host sync), as section 5. Per row (x T^2 with
 *    t2_scale):
 *      beta == 0 : d l / d s_j = (q_j - p_j) / T
 *      beta == 1 : d l / d s_j = q_j (log q_j - log p_j - l) / T    (l the row's divergence before T^2)
 *      otherwise : d l / d s_j = (h_j - q_j sum_k h_k) / T,  h_j = (1 - beta) q_j (log q_j - log m_j)
 *  (sum_k h_k = (1 - beta) KL(Q || M)). grad_scale must be finite.
 *
 *  Numerics: inputs converted exactly to fp32; CUDA accumulates in fp32 (online max / sum of
 *  exponentials per chunk of a row, chunks merged in a fixed order), the CPU backend in double
 *  (the reference). The loss is fp32, dstudent has the student's dtype (rounded from the fp32
 *  value; the CPU rounds its double to fp32, then to the dtype).
 *  Deterministic on both backends (no order-dependent float atomics).
 *  Dtypes: student fp32 / fp16 / bf16; teacher_dtype the student's dtype or FL_DTYPE_F32 (a
 *  teacher kept in fp32); labels int32 / int64.
 *  Alignment: every array aligned to its element size (FL_ERR_INVALID_ARGUMENT otherwise).
 *  Infinite logits: -inf in the same columns of both inputs is a masked class (no NaN); a student
 *  -inf where the teacher has mass gives forward KL +inf (as the mathematics), a teacher -inf where
 *  the student has mass reverse KL +inf with a NaN gradient.
 *  Aliasing: dstudent == student is allowed (in place, the student logits are destroyed); no
 *  other overlap of an output with an input or another output.
 *
 *  Passes over memory (CUDA): rows are cut into chunks of a few thousand columns handled by
 *  independent CTAs; per-chunk statistics are merged per row in the workspace. forward reads s
 *  and t once for beta 0 / 1 and twice for the JSD (the JSD's row sums need both lse first);
 *  fused adds one more read of s and t and writes dstudent once. The work is ordered so that
 *  the re-reads of a row follow its first read closely (mostly L2 hits). One kernel per call
 *  plus one small reduce kernel for SUM / MEAN / BATCHMEAN; no allocation, no host sync,
 *  graph-capturable. 64-bit offsets (N * V may exceed 2^31).
 ******************************************************************************/
typedef struct fl_distill_options {
    size_t        struct_size;  /* = sizeof(fl_distill_options); set by FL_DISTILL_OPTIONS_INIT */
    float         temperature;  /* T, finite and > 0; default 1 */
    float         beta;         /* in [0, 1]; 0 forward KL (default), 1 reverse KL, else JSD_beta */
    int64_t       ignore_index; /* rows whose label equals it are ignored; default -100 */
    fl_reduction  reduction;    /* NONE, SUM, MEAN (default) or FL_REDUCTION_BATCHMEAN */
    int32_t       t2_scale;     /* != 0: multiply the loss (and gradient) by T^2; default 0 */
} fl_distill_options;

/* Reduction value accepted by the distillation entry points only (sum / N, F.kl_div's). */
#define FL_REDUCTION_BATCHMEAN ((fl_reduction)3)

#define FL_DISTILL_OPTIONS_INIT { sizeof(fl_distill_options), 1.0f, 0.0f, -100, FL_REDUCTION_MEAN, 0 }

/*! fl_distill_workspace_size() :
 *  Bytes of workspace every distillation entry point (both backends) needs for these
 *  arguments: about 256 + 12 N + 32 N ceil(V / 8192) bytes (CUDA: device memory, 256-byte
 *  aligned; content ignored and clobbered). opts may be NULL (defaults).
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_distill_workspace_size(size_t* bytes, int64_t N, int64_t V, fl_dtype dtype,
                                           const fl_distill_options* opts);

/*! fl_distill_forward_{cpu,cuda}() :
 *  loss : fp32, [N] for NONE, [1] otherwise; overwritten; required.
 *  student [N, ld_student] of dtype, teacher [N, ld_teacher] of teacher_dtype, labels [N] of
 *  label_dtype or NULL. N >= 0, V >= 1. opts may be NULL (defaults).
 * @return : FL_OK or an error status (fl_last_error() has the detail). */
FL_API fl_status fl_distill_forward_cpu(float* loss, const void* student, int64_t ld_student,
                                        const void* teacher, int64_t ld_teacher, fl_dtype teacher_dtype,
                                        const void* labels, fl_index_dtype label_dtype,
                                        int64_t N, int64_t V, fl_dtype dtype,
                                        const fl_distill_options* opts,
                                        void* workspace, size_t workspace_bytes);
FL_API fl_status fl_distill_forward_cuda(float* loss, const void* student, int64_t ld_student,
                                         const void* teacher, int64_t ld_teacher, fl_dtype teacher_dtype,
                                         const void* labels, fl_index_dtype label_dtype,
                                         int64_t N, int64_t V, fl_dtype dtype,
                                         const fl_distill_options* opts,
                                         void* workspace, size_t workspace_bytes, fl_stream stream);

/*! fl_distill_fused_{cpu,cuda}() :
 *  The loss (optional: loss may be NULL) and dstudent ([N, ld_student] of dtype, first V
 *  columns of every row overwritten, ignored rows with zeros) in one call, for the upstream
 *  gradient grad_loss / grad_scale given up front. Also the backward of a NONE forward: pass the
 *  per-row grad_loss and loss = NULL. dstudent == student allowed.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_distill_fused_cpu(float* loss, void* dstudent, const void* student, int64_t ld_student,
                                      const void* teacher, int64_t ld_teacher, fl_dtype teacher_dtype,
                                      const void* labels, fl_index_dtype label_dtype,
                                      const float* grad_loss, float grad_scale,
                                      int64_t N, int64_t V, fl_dtype dtype,
                                      const fl_distill_options* opts,
                                      void* workspace, size_t workspace_bytes);
FL_API fl_status fl_distill_fused_cuda(float* loss, void* dstudent, const void* student, int64_t ld_student,
                                       const void* teacher, int64_t ld_teacher, fl_dtype teacher_dtype,
                                       const void* labels, fl_index_dtype label_dtype,
                                       const float* grad_loss, float grad_scale,
                                       int64_t N, int64_t V, fl_dtype dtype,
                                       const fl_distill_options* opts,
                                       void* workspace, size_t workspace_bytes, fl_stream stream);

/*-****************************************************************************
 *  11. Margin softmax cross-entropy (CosFace / ArcFace / combined margins)
 *
 *  insightface's CombinedMarginLoss(s, m1, m2, m3) followed by cross-entropy, on cosine logits
 *  x [N, C] (row stride ld >= C; values are cosines, clamped to [-1, 1] where the margin needs
 *  theta) with class targets y. For row i with target y (theta = acos(clamp(x_y, -1, 1))):
 *
 *    phi = cos(m1 theta + m2) - m3            when the margin applies (below)
 *    phi = x_y - m3 - m2 sin(m2)              otherwise, non-easy (insightface's "x - sinmm";
 *                                               keeps phi monotonic where m1 theta + m2 > pi)
 *    phi = x_y - m3                           otherwise, easy_margin
 *    the margin applies: easy_margin ? x_y > 0 : m1 theta + m2 <= pi
 *    z_j = s x_j (j != y),  z_y = s phi,  l_i = lse(z) - z_y
 *
 *  ArcFace = (m1, m2, m3) = (1, 0.5, 0); CosFace = (1, 0, 0.4) (then phi = x_y - m3 exactly, no
 *  acos); SphereFace-style m1 > 1 allowed. Ignored rows (target == ignore_index): loss 0, gradient
 *  0, the row is not read. Reductions NONE / SUM / MEAN (over rows not ignored; NaN if none).
 *
 *  Gradient: dz_j = g_i (p_j - [j == y]) with p = softmax(z) and g_i as section 5 (grad_loss [N] for
 *  NONE else [1], times grad_scale, / D for MEAN); dx_j = s dz_j for j != y and
 *    dx_y = s dz_y phi'(x_y), where with grad_mode
 *      FL_MARGIN_GRAD_EXACT    : phi' = m1 sin(m1 theta + m2) / max(sin theta, 1e-6) where the margin
 *                                applies (the derivative of cos(m1 acos x + m2); the clamp keeps
 *                                x_y = +-1 finite: no NaN from sqrt(1 - x^2)), else 1;
 *      FL_MARGIN_GRAD_STRAIGHT : phi' = 1 (the margin is a constant shift: insightface's newer
 *                                arccos_ / cos_ under no_grad, "margin without gradient").
 *
 *  Numerics, dtypes, aliasing, workspace, CUDA behaviour (asynchronous, no allocation, graph-
 *  capturable, deterministic) as section 10 (the CUDA work items and row merge are the same
 *  machinery). dlogits == logits allowed (in place). Out-of-range targets: CPU
 *  FL_ERR_TARGET_OUT_OF_RANGE before anything is written; CUDA: that row's loss and gradient NaN
 *  and *error_flag = 1 when error_flag is non-NULL (as section 5).
 ******************************************************************************/
typedef enum { FL_MARGIN_GRAD_EXACT = 0, FL_MARGIN_GRAD_STRAIGHT = 1 } fl_margin_grad;

typedef struct fl_margin_options {
    size_t         struct_size;  /* = sizeof(fl_margin_options); set by FL_MARGIN_OPTIONS_INIT */
    float          s;            /* scale, finite and > 0; default 64 */
    float          m1;           /* multiplicative angular margin, finite and >= 1; default 1 */
    float          m2;           /* additive angular margin, finite, in [0, pi); default 0.5 (ArcFace) */
    float          m3;           /* additive cosine margin, finite, >= 0; default 0 */
    int32_t        easy_margin;  /* default 0 */
    fl_margin_grad grad_mode;    /* default FL_MARGIN_GRAD_EXACT */
    int64_t        ignore_index; /* default -100 */
    fl_reduction   reduction;    /* NONE, SUM or MEAN (default) */
    int32_t*       error_flag;   /* CUDA: device int set to 1 on an out-of-range target; or NULL */
} fl_margin_options;

#define FL_MARGIN_OPTIONS_INIT { sizeof(fl_margin_options), 64.0f, 1.0f, 0.5f, 0.0f, 0, FL_MARGIN_GRAD_EXACT, \
                                 -100, FL_REDUCTION_MEAN, NULL }

/*! fl_margin_ce_workspace_size() : bytes of workspace of every margin entry point (both backends),
 *  about 256 + 12 N + 32 N ceil(C / 8192). opts may be NULL.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_margin_ce_workspace_size(size_t* bytes, int64_t N, int64_t C, fl_dtype dtype,
                                             const fl_margin_options* opts);

/*! fl_margin_ce_forward_{cpu,cuda}() :
 *  loss : fp32 [N] (NONE) or [1]; required. lse : fp32 [N] log-sum-exp of z (0 for ignored rows)
 *  or NULL. logits [N, ld] of dtype (cosines), targets [N] of index_dtype. N >= 0, C >= 1.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_margin_ce_forward_cpu(float* loss, float* lse, const void* logits, int64_t ld,
                                          const void* targets, fl_index_dtype index_dtype, int64_t N, int64_t C,
                                          fl_dtype dtype, const fl_margin_options* opts,
                                          void* workspace, size_t workspace_bytes);
FL_API fl_status fl_margin_ce_forward_cuda(float* loss, float* lse, const void* logits, int64_t ld,
                                           const void* targets, fl_index_dtype index_dtype, int64_t N, int64_t C,
                                           fl_dtype dtype, const fl_margin_options* opts,
                                           void* workspace, size_t workspace_bytes, fl_stream stream);

/*! fl_margin_ce_fused_{cpu,cuda}() :
 *  loss (optional, NULL allowed), lse (optional) and dlogits [N, ld] of dtype (first C columns of
 *  every row; ignored rows zeros) for the upstream gradient grad_loss / grad_scale given up front;
 *  also the backward of a NONE forward (per-row grad_loss, loss NULL). dlogits == logits allowed.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_margin_ce_fused_cpu(float* loss, float* lse, void* dlogits, const void* logits, int64_t ld,
                                        const void* targets, fl_index_dtype index_dtype,
                                        const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                        fl_dtype dtype, const fl_margin_options* opts,
                                        void* workspace, size_t workspace_bytes);
FL_API fl_status fl_margin_ce_fused_cuda(float* loss, float* lse, void* dlogits, const void* logits, int64_t ld,
                                         const void* targets, fl_index_dtype index_dtype,
                                         const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                         fl_dtype dtype, const fl_margin_options* opts,
                                         void* workspace, size_t workspace_bytes, fl_stream stream);

/*-****************************************************************************
 *  12. Softmax focal loss (multi-class, rows and N x C x d layouts)
 *
 *  Logits [N, C, d]: element (n, c, k) at n * ld + c * d + k (d >= 1 positions per sample, class
 *  stride d, batch stride ld >= C * d; d = 1 is plain rows [N, C] with row stride ld; NCHW
 *  segmentation maps are d = H * W, ld = C * d). Targets [N, d] contiguous (position (n, k) at
 *  n * d + k). Per position with target y, p = softmax over the C classes at that position:
 *
 *    l = -alpha_y (1 - p_y)^gamma log p_y
 *
 *  alpha: fp32 [C] per-class weights (kornia / MONAI semantics) or NULL (all 1); gamma >= 0 (0: the
 *  alpha-weighted cross-entropy). 1 - p_y is formed as -expm1(log p_y) (no cancellation near 1).
 *  Ignored positions (target == ignore_index): loss 0, gradient 0, not read.
 *  Reductions: NONE loss[n * d + k] ([N * d]); SUM; MEAN over positions not ignored (NaN if none;
 *  NOT divided by the alpha sum, unlike a weighted cross-entropy: kornia's mean).
 *  Gradient: dx_c = g alpha_y F (delta_cy - p_c),  F = gamma (1 - p_y)^(gamma - 1) p_y log p_y - (1 - p_y)^gamma,
 *  with the limit F = 0 - (1 - p_y)^gamma for the first term where 1 - p_y == 0 (gamma > 0: a
 *  finite 0, not autograd's 0 * inf = NaN for gamma < 1); g as section 5 (grad_loss [N * d] for
 *  NONE). alpha values are not checked.
 *  Numerics, dtypes, aliasing (dlogits == logits allowed), workspace, determinism and the CUDA
 *  behaviour as section 10; out-of-range targets as section 11. Infinite logits: a -inf non-target
 *  logit is a masked class (p_c = 0, gradient 0, no NaN: both backends, as PyTorch's log_softmax).
 ******************************************************************************/
typedef struct fl_focal_options {
    size_t        struct_size;   /* = sizeof(fl_focal_options); set by FL_FOCAL_OPTIONS_INIT */
    float         gamma;         /* >= 0, finite; default 2 */
    const float*  alpha;         /* fp32 [C] or NULL; default NULL */
    int64_t       ignore_index;  /* default -100 */
    fl_reduction  reduction;     /* NONE, SUM or MEAN (default) */
    int32_t*      error_flag;    /* CUDA: device int set to 1 on an out-of-range target; or NULL */
} fl_focal_options;

#define FL_FOCAL_OPTIONS_INIT { sizeof(fl_focal_options), 2.0f, NULL, -100, FL_REDUCTION_MEAN, NULL }

/*! fl_softmax_focal_workspace_size() : bytes of workspace of every softmax focal entry point (both
 *  backends) for N samples of C classes at d positions; opts may be NULL.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_softmax_focal_workspace_size(size_t* bytes, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                                 const fl_focal_options* opts);

/*! fl_softmax_focal_forward_{cpu,cuda}() / fl_softmax_focal_fused_{cpu,cuda}() :
 *  As the margin entries: loss fp32 ([N * d] for NONE, else [1]; required for forward, optional for
 *  fused), dlogits of dtype in the logits' layout (fused; == logits allowed), targets [N * d].
 *  N >= 0, C >= 1, d >= 1, ld >= C * d.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_softmax_focal_forward_cpu(float* loss, const void* logits, int64_t ld, const void* targets,
                                              fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d,
                                              fl_dtype dtype, const fl_focal_options* opts,
                                              void* workspace, size_t workspace_bytes);
FL_API fl_status fl_softmax_focal_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                               fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d,
                                               fl_dtype dtype, const fl_focal_options* opts,
                                               void* workspace, size_t workspace_bytes, fl_stream stream);
FL_API fl_status fl_softmax_focal_fused_cpu(float* loss, void* dlogits, const void* logits, int64_t ld,
                                            const void* targets, fl_index_dtype index_dtype,
                                            const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                            int64_t d, fl_dtype dtype, const fl_focal_options* opts,
                                            void* workspace, size_t workspace_bytes);
FL_API fl_status fl_softmax_focal_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld,
                                             const void* targets, fl_index_dtype index_dtype,
                                             const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                             int64_t d, fl_dtype dtype, const fl_focal_options* opts,
                                             void* workspace, size_t workspace_bytes, fl_stream stream);

/*-****************************************************************************
 *  13. Lovasz-softmax (Berman et al.; segmentation IoU surrogate)
 *
 *  Input [N, C, d] in the layout of section 12 (element (n, c, k) at n * ld + c * d + k; d = H * W
 *  pixels per image), labels [N, d] (index dtype), either probabilities (from_logits == 0: the
 *  caller's softmax, Berman's `probas`) or logits (from_logits != 0: p = softmax over the C classes
 *  at each pixel, computed inside). Pixels whose label == ignore_index are dropped. For a class c
 *  over a set of pixels (all valid pixels of the batch, or of one image with per_image):
 *
 *    fg_i = [y_i == c],  e_i = |fg_i - p_{i,c}|, sorted in decreasing order (ties: increasing pixel
 *    index n * d + k; the loss does not depend on the tie order, the gradient does),
 *    G = sum fg,  J_k = 1 - (G - sum_{j<=k} fg_(j)) / (G + sum_{j<=k} (1 - fg_(j))),
 *    D_1 = J_1, D_k = J_k - J_{k-1},   loss_c = sum_k e_(k) D_k      (Berman's lovasz_grad)
 *
 *  Classes averaged: FL_LOVASZ_PRESENT (default, mmseg's): the classes with G > 0 in the set (none:
 *  the set's loss is 0); FL_LOVASZ_ALL: all C classes (a class with G = 0 contributes max_i p_{i,c}).
 *  per_image == 0: loss = that average over the whole batch's valid pixels; per_image != 0: the mean
 *  over the N images of each image's average (an image without valid pixels contributes 0 and
 *  counts). No valid pixel at all: loss 0 and gradient 0 (Berman). The loss is one fp32 value.
 *
 *  Gradient (the sort order held fixed, as autograd through torch.sort; where e_i == 0 exactly the sign
 *  rule below is used, while autograd through Berman's |fg - p| gives 0 there): dloss/dp_{i,c} =
 *  w * D_{rank of i in class c} * (fg_i ? -1 : +1), w = g / (classes averaged) [/ N for per_image],
 *  g = grad_scale * (grad_loss ? grad_loss[0] : 1); with from_logits, through the softmax:
 *  dx_{i,c} = p_{i,c} (gp_{i,c} - sum_k p_{i,k} gp_{i,k}). Ignored pixels: gradient 0. dinput has
 *  the input's dtype and layout (padding beyond C * d in a row of ld untouched); dinput == input
 *  allowed (in place).
 *  Numerics: double on the CPU (the reference); inputs fp32 / fp16 / bf16. CUDA: p and e in fp32,
 *  the Jaccard steps and the loss sum in double; errors equal in fp32 tie (increasing pixel index),
 *  so where the CPU's double errors differ by less than an fp32 rounding the two backends may rank
 *  two pixels differently: same loss (it does not depend on the tie order), gradients that differ at
 *  those pixels. Exact fp32 errors (e.g. probabilities on a 2^-k grid) give the CPU's ranks.
 *  Out-of-range labels (not in [0, C), not ignore_index): CPU: FL_ERR_TARGET_OUT_OF_RANGE before
 *  anything is written. CUDA: the pixel is left out, the loss is NaN, the pixel's dinput is NaN, and
 *  *opts->error_flag = 1 when error_flag is set (as section 5).
 *  Workspace: CPU fl_lovasz_softmax_workspace_size() bytes (host memory); CUDA
 *  fl_lovasz_softmax_workspace_size_cuda() bytes (device memory, 256-byte aligned; about 24 bytes per
 *  input element: the sort's keys and values, twice). Content ignored; the sizes depend on the
 *  options (from_logits, per_image), so query with the options of the call.
 *  CUDA method: one 64-bit key per (set, class, pixel) — (set * C + c, error descending) — through
 *  cub::DeviceRadixSort (stable: the pixel order breaks ties), a scan of the foreground bits, then one
 *  pass over the sorted pairs forms D_k in closed form (no J_k - J_{k-1} cancellation) and scatters
 *  the gradient. Limit: C * N * d <= 2^31 - 1 elements (else FL_ERR_UNSUPPORTED).
 ******************************************************************************/
typedef enum { FL_LOVASZ_PRESENT = 0, FL_LOVASZ_ALL = 1 } fl_lovasz_classes;

typedef struct fl_lovasz_options {
    size_t            struct_size;   /* = sizeof(fl_lovasz_options); set by FL_LOVASZ_OPTIONS_INIT */
    fl_lovasz_classes classes;       /* default FL_LOVASZ_PRESENT */
    int32_t           per_image;     /* default 0 */
    int32_t           from_logits;   /* default 0 (the input holds probabilities) */
    int64_t           ignore_index;  /* default -100 */
    int32_t*          error_flag;    /* CUDA: device int set to 1 on an out-of-range label; or NULL */
} fl_lovasz_options;

#define FL_LOVASZ_OPTIONS_INIT { sizeof(fl_lovasz_options), FL_LOVASZ_PRESENT, 0, 0, -100, NULL }

/*! fl_lovasz_softmax_workspace_size() : bytes of workspace of the Lovasz entry points for N images of
 *  C classes and d pixels; opts may be NULL.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_lovasz_softmax_workspace_size(size_t* bytes, int64_t N, int64_t C, int64_t d, fl_dtype dtype,
                                                  const fl_lovasz_options* opts);

/*! fl_lovasz_softmax_forward_cpu() / fl_lovasz_softmax_fused_cpu() :
 *  loss : fp32 [1] (required for forward, optional for fused); dinput (fused) as described above.
 *  N >= 0, C >= 1, d >= 1, ld >= C * d.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_lovasz_softmax_forward_cpu(float* loss, const void* input, int64_t ld, const void* labels,
                                               fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d,
                                               fl_dtype dtype, const fl_lovasz_options* opts,
                                               void* workspace, size_t workspace_bytes);
FL_API fl_status fl_lovasz_softmax_fused_cpu(float* loss, void* dinput, const void* input, int64_t ld,
                                             const void* labels, fl_index_dtype index_dtype,
                                             const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                             int64_t d, fl_dtype dtype, const fl_lovasz_options* opts,
                                             void* workspace, size_t workspace_bytes);

/*! fl_lovasz_softmax_workspace_size_cuda() : bytes of device workspace of the CUDA entry points for
 *  N images of C classes and d pixels on the current device (it asks CUB for its scratch size);
 *  opts may be NULL. In a build without CUDA: FL_ERR_NOT_BUILT.
 * @return : FL_OK, FL_ERR_INVALID_ARGUMENT, FL_ERR_UNSUPPORTED (C * N * d > 2^31 - 1) or FL_ERR_CUDA. */
FL_API fl_status fl_lovasz_softmax_workspace_size_cuda(size_t* bytes, int64_t N, int64_t C, int64_t d,
                                                       fl_dtype dtype, const fl_lovasz_options* opts);

/*! fl_lovasz_softmax_forward_cuda() / fl_lovasz_softmax_fused_cuda() : the CPU entry points' contract
 *  on device pointers (loss, dinput, input, labels, grad_loss), asynchronous on `stream`: no host
 *  synchronisation, no allocation, capturable in a CUDA graph; deterministic (bitwise the same on
 *  every run). */
FL_API fl_status fl_lovasz_softmax_forward_cuda(float* loss, const void* input, int64_t ld, const void* labels,
                                                fl_index_dtype index_dtype, int64_t N, int64_t C, int64_t d,
                                                fl_dtype dtype, const fl_lovasz_options* opts,
                                                void* workspace, size_t workspace_bytes, fl_stream stream);
FL_API fl_status fl_lovasz_softmax_fused_cuda(float* loss, void* dinput, const void* input, int64_t ld,
                                              const void* labels, fl_index_dtype index_dtype,
                                              const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                              int64_t d, fl_dtype dtype, const fl_lovasz_options* opts,
                                              void* workspace, size_t workspace_bytes, fl_stream stream);

/*-****************************************************************************
 *  14. Taylor softmax cross-entropy (pytorch-loss TaylorSoftmax + NLL; Banerjee et al.)
 *
 *  Logits x [N, C] (row stride ld >= C), class targets y [N] (index dtype). With the Taylor
 *  series of exp of even order n (n = 2 or 4; f > 0 for every real x):
 *
 *    f_2(x) = 1 + x + x^2 / 2,   f_4(x) = f_2(x) + x^3 / 6 + x^4 / 24,
 *    p_j = f(x_j) / S,  S = sum_k f(x_k),  l_i = log S - log f(x_y)
 *
 *  Ignored rows (target == ignore_index): loss 0, gradient 0, the row is not read. Reductions NONE
 *  / SUM / MEAN (over rows not ignored; NaN if none), as section 5 without weights.
 *  Gradient: dx_j = g_i (f'(x_j) / S - [j == y] f'(x_y) / f(x_y)), f'_n = f_{n-1} (f'_2 = 1 + x,
 *  f'_4 = 1 + x + x^2 / 2 + x^3 / 6), g_i = grad_scale * (grad_loss ? grad_loss[NONE ? i : 0] : 1)
 *  [/ D for MEAN, D = the number of rows not ignored]. dlogits == logits allowed (in place); the
 *  padding columns C .. ld - 1 are neither read nor written.
 *  Numerics: CUDA computes in fp32 on fp32 / fp16 / bf16 inputs; f grows as x^n, so |x| beyond ~1e9
 *  (n = 4) or ~1e19 (n = 2) overflows S to inf there (loss inf or NaN, as the PyTorch module in
 *  fp32), while the CPU backend, the reference, computes in double and stays finite.
 *  CUDA: one warp per row up to C = 1024 (the row in registers: one read), one
 *  CTA per row beyond (the gradient pass reads the row again); on sm_90 the fused call's rows of
 *  more than 1024 classes take the ring kernel (one read, one write; its own summation order, so
 *  its loss may differ from the forward's in the last bits); deterministic (fixed reduction
 *  order), asynchronous, no allocation, capturable in a CUDA graph.
 *  Out-of-range targets: CPU FL_ERR_TARGET_OUT_OF_RANGE before anything is written; CUDA: that
 *  row's loss and gradient NaN and *error_flag = 1 when error_flag is non-NULL (as section 5).
 ******************************************************************************/
typedef struct fl_taylor_options {
    size_t        struct_size;   /* = sizeof(fl_taylor_options); set by FL_TAYLOR_OPTIONS_INIT */
    int32_t       order;         /* n: 2 (default, pytorch-loss's module) or 4 */
    int64_t       ignore_index;  /* default -100 (PyTorch's; pytorch-loss's module uses -1) */
    fl_reduction  reduction;     /* NONE, SUM or MEAN (default); MEAN's D counts out-of-range rows */
    int32_t*      error_flag;    /* CUDA: device int set to 1 on an out-of-range target; or NULL */
} fl_taylor_options;

#define FL_TAYLOR_OPTIONS_INIT { sizeof(fl_taylor_options), 2, -100, FL_REDUCTION_MEAN, NULL }

/*! fl_taylor_ce_workspace_size() : bytes of workspace of every Taylor CE entry point (both backends;
 *  CUDA: device memory, 256-byte aligned; content ignored and overwritten): 0 for NONE, else
 *  2304 + 4 N rounded up to a multiple of 256. opts may be NULL.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_taylor_ce_workspace_size(size_t* bytes, int64_t N, int64_t C, fl_dtype dtype,
                                             const fl_taylor_options* opts);

/*! fl_taylor_ce_forward_{cpu,cuda}() : loss fp32 ([N] for NONE, else [1]); required.
 *  fl_taylor_ce_fused_{cpu,cuda}() : loss (optional, NULL allowed) and dlogits [N, ld] of dtype
 *  (first C columns of each row written), for the upstream gradient given up front.
 *  N >= 0, C >= 1, ld >= C; opts NULL = FL_TAYLOR_OPTIONS_INIT; no alignment beyond the element
 *  size. CUDA: device pointers, asynchronous on `stream`.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_taylor_ce_forward_cpu(float* loss, const void* logits, int64_t ld, const void* targets,
                                          fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                          const fl_taylor_options* opts, void* workspace, size_t workspace_bytes);
FL_API fl_status fl_taylor_ce_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                           fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                           const fl_taylor_options* opts, void* workspace, size_t workspace_bytes,
                                           fl_stream stream);
FL_API fl_status fl_taylor_ce_fused_cpu(float* loss, void* dlogits, const void* logits, int64_t ld,
                                        const void* targets, fl_index_dtype index_dtype, const float* grad_loss,
                                        float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                        const fl_taylor_options* opts, void* workspace, size_t workspace_bytes);
FL_API fl_status fl_taylor_ce_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld,
                                         const void* targets, fl_index_dtype index_dtype, const float* grad_loss,
                                         float grad_scale, int64_t N, int64_t C, fl_dtype dtype,
                                         const fl_taylor_options* opts, void* workspace, size_t workspace_bytes,
                                         fl_stream stream);

/*-****************************************************************************
 *  15. Large-margin softmax cross-entropy (Kobayashi, BMVC'19; pytorch-loss LargeMarginSoftmaxV1)
 *
 *  Logits x [N, C] (row stride ld >= C, C >= 2), class targets y [N]. With p = softmax(x) and q the
 *  softmax over the C - 1 non-target logits (q_k = exp(x_k) / sum_{j != y} exp(x_j), k != y):
 *
 *    l_i = (lse(x) - x_y) + (lambda / 2) sum_{k != y} (q_k - 1 / (C - 1)) log q_k
 *
 *  (the cross-entropy plus a term that pushes the non-target distribution towards uniform).
 *  Ignored rows (target == ignore_index): loss 0, gradient 0, the row is not read. Reductions NONE /
 *  SUM / MEAN (over rows not ignored; NaN if none).
 *  Gradient: dx_y = g_i (p_y - 1); for j != y,
 *    dx_j = g_i (p_j + (lambda / 2) (q_j (x_j + 1 - sum_{k != y} q_k x_k) - 1 / (C - 1)))
 *  with g_i as section 14. dlogits == logits allowed (in place); padding neither read nor written.
 *  Numerics: the CPU backend computes in double. CUDA computes in fp32 (fp32 / fp16 / bf16 inputs)
 *  from x_y and the non-target statistics shifted by m' = max_{k != y} x_k (the regulariser as
 *  sum q_k (x_k - m') - sum (x_k - m') / (C - 1)); lse - x_y is a log1p and p_y - 1 is
 *  -sum_{k != y} p_k when the target dominates, so neither cancels. A -inf non-target logit gives
 *  NaN (as the CPU backend).
 *  CUDA: one warp per row up to C = 1024 (the row in registers: one read, one write), one CTA per
 *  row beyond (the gradient pass reads the row again, from L2); 16-byte vectors when the rows are
 *  aligned (same results either way); on sm_90 the fused call's rows of more than 1024 classes
 *  take the ring kernel (one read, one write; its own summation order, so its loss may differ from
 *  the forward's in the last bits); deterministic (fixed reduction order), asynchronous, no
 *  allocation, capturable in a CUDA graph.
 *  Out-of-range targets: CPU FL_ERR_TARGET_OUT_OF_RANGE before anything is written; CUDA: that
 *  row's loss and gradient NaN and *error_flag = 1 when error_flag is non-NULL (as section 14).
 ******************************************************************************/
typedef struct fl_large_margin_options {
    size_t        struct_size;   /* = sizeof(fl_large_margin_options); set by FL_LARGE_MARGIN_OPTIONS_INIT */
    float         lambda;        /* finite, >= 0; default 0.3 (pytorch-loss's) */
    int64_t       ignore_index;  /* default -100 (PyTorch's; pytorch-loss's module uses 255) */
    fl_reduction  reduction;     /* NONE, SUM or MEAN (default); MEAN's D counts out-of-range rows */
    int32_t*      error_flag;    /* CUDA: device int set to 1 on an out-of-range target; or NULL */
} fl_large_margin_options;

#define FL_LARGE_MARGIN_OPTIONS_INIT { sizeof(fl_large_margin_options), 0.3f, -100, FL_REDUCTION_MEAN, NULL }

/*! fl_large_margin_ce_workspace_size() : bytes of workspace of the large-margin entry points: the
 *  same rule as fl_taylor_ce_workspace_size() (0 for NONE, else 2304 + 4 N rounded up to a multiple
 *  of 256; CUDA: device memory, 256-byte aligned, content ignored and overwritten; the CPU backend
 *  does not use its content). opts may be NULL.
 * @return : FL_OK or FL_ERR_INVALID_ARGUMENT. */
FL_API fl_status fl_large_margin_ce_workspace_size(size_t* bytes, int64_t N, int64_t C, fl_dtype dtype,
                                                   const fl_large_margin_options* opts);

/*! fl_large_margin_ce_forward_{cpu,cuda}() / fl_large_margin_ce_fused_{cpu,cuda}() : the contract of
 *  section 14's entry points (loss [N] for NONE else [1]; fused: loss optional, dlogits required),
 *  C >= 2. CUDA: device pointers, asynchronous on `stream`.
 * @return : FL_OK or an error status. */
FL_API fl_status fl_large_margin_ce_forward_cpu(float* loss, const void* logits, int64_t ld, const void* targets,
                                                fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                                const fl_large_margin_options* opts, void* workspace,
                                                size_t workspace_bytes);
FL_API fl_status fl_large_margin_ce_fused_cpu(float* loss, void* dlogits, const void* logits, int64_t ld,
                                              const void* targets, fl_index_dtype index_dtype,
                                              const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                              fl_dtype dtype, const fl_large_margin_options* opts,
                                              void* workspace, size_t workspace_bytes);
FL_API fl_status fl_large_margin_ce_forward_cuda(float* loss, const void* logits, int64_t ld, const void* targets,
                                                 fl_index_dtype index_dtype, int64_t N, int64_t C, fl_dtype dtype,
                                                 const fl_large_margin_options* opts, void* workspace,
                                                 size_t workspace_bytes, fl_stream stream);
FL_API fl_status fl_large_margin_ce_fused_cuda(float* loss, void* dlogits, const void* logits, int64_t ld,
                                               const void* targets, fl_index_dtype index_dtype,
                                               const float* grad_loss, float grad_scale, int64_t N, int64_t C,
                                               fl_dtype dtype, const fl_large_margin_options* opts,
                                               void* workspace, size_t workspace_bytes, fl_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSEDLOSS_H */
