"""fusedloss._lib — ctypes binding of libfusedloss.so (the C API of include/fusedloss.h).

Layer 1 of the Python package (STYLE.md section 7): plain ctypes, no torch import, so the
C API is usable from any Python program. Every fl_* symbol is declared in one table below
(_SIGNATURES; a missing one fails the import), except the few declared entry points not written
yet, in _OPTIONAL (bound when present; optional_symbol() gives None otherwise, and the Python
caller raises NotBuiltError). Each call goes through _check(), which turns a non-FL_OK status
into a FusedLossError carrying the status name and fl_last_error()'s detail (the subclasses
TargetOutOfRangeError for FL_ERR_TARGET_OUT_OF_RANGE, NotBuiltError for FL_ERR_NOT_BUILT).

Where the library is looked for, first match wins:
  1. the file named by the environment variable FUSEDLOSS_LIBRARY;
  2. libfusedloss.so next to this file (what `pip install .` puts there);
  3. <repository>/build/libfusedloss.so (an in-tree `make lib`, with PYTHONPATH=python).

Example (no torch):
    from fusedloss import _lib
    print(_lib.version_string(), _lib.cuda_built())
"""
import ctypes
import os

__all__ = [
    "FusedLossError", "TargetOutOfRangeError", "lib", "library_path", "version_number",
    "version_string", "cuda_built", "status_string", "last_error", "CEOptions",
    "ce_options", "workspace_size", "gelu_workspace_size", "GELU_APPROX", "LCEOptions",
    "lce_options", "lce_workspace_size", "lce_context_create", "lce_context_destroy",
    "lce_context_set_tuning", "LCE_ACCUM",
    "NotBuiltError", "optional_symbol", "DistillOptions", "distill_options",
    "distill_workspace_size", "DISTILL_REDUCTIONS", "MarginOptions", "margin_options",
    "margin_ce_workspace_size", "MARGIN_GRAD", "FocalOptions", "focal_options",
    "softmax_focal_workspace_size", "LovaszOptions", "lovasz_options", "lovasz_softmax_workspace_size",
    "LOVASZ_CLASSES", "TaylorOptions", "taylor_options", "taylor_ce_workspace_size",
    "LargeMarginOptions", "large_margin_options", "large_margin_ce_workspace_size",
]

EXPECTED_VERSION_NUMBER = 100  # FL_VERSION_NUMBER of 0.1.0 (MAJOR*10000 + MINOR*100 + PATCH)

# ---- constants: values of include/fusedloss.h (pinned there forever) ----------------------
FL_OK = 0
FL_ERR_INVALID_ARGUMENT = 1
FL_ERR_UNSUPPORTED = 2
FL_ERR_OUT_OF_MEMORY = 3
FL_ERR_CUDA = 4
FL_ERR_NOT_BUILT = 5
FL_ERR_TARGET_OUT_OF_RANGE = 6
FL_ERR_INTERNAL = 7
FL_ERR_INSUFFICIENT_WORKSPACE = 8

FL_DTYPE_F32, FL_DTYPE_F16, FL_DTYPE_BF16 = 0, 1, 2
FL_INDEX_I32, FL_INDEX_I64 = 0, 1
FL_REDUCTION_NONE, FL_REDUCTION_MEAN, FL_REDUCTION_SUM = 0, 1, 2
REDUCTIONS = {"none": FL_REDUCTION_NONE, "mean": FL_REDUCTION_MEAN, "sum": FL_REDUCTION_SUM}
FL_REDUCTION_BATCHMEAN = 3  # distillation entry points only (section 10): sum / N
DISTILL_REDUCTIONS = dict(REDUCTIONS, batchmean=FL_REDUCTION_BATCHMEAN)
FL_GELU_NONE, FL_GELU_TANH = 0, 1
GELU_APPROX = {"none": FL_GELU_NONE, "tanh": FL_GELU_TANH}  # PyTorch's approximate= strings
FL_LCE_ACCUM_AUTO, FL_LCE_ACCUM_FP32, FL_LCE_ACCUM_LEAN = 0, 1, 2
LCE_ACCUM = {"auto": FL_LCE_ACCUM_AUTO, "fp32": FL_LCE_ACCUM_FP32, "lean": FL_LCE_ACCUM_LEAN}
FL_LCE_DEFAULT_BYTE_BUDGET = 512 << 20  # FL_LCE_OPTIONS_INIT's byte_budget
FL_MARGIN_GRAD_EXACT, FL_MARGIN_GRAD_STRAIGHT = 0, 1  # fl_margin_grad (section 11)
MARGIN_GRAD = {"exact": FL_MARGIN_GRAD_EXACT, "straight": FL_MARGIN_GRAD_STRAIGHT}


class FusedLossError(RuntimeError):
    """A fusedloss C call failed: message is '<fl function>: <status name>: <fl_last_error()>'."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class TargetOutOfRangeError(FusedLossError, IndexError):
    """A class-index target not in [0, V) and not ignore_index (IndexError, as PyTorch raises)."""


class NotBuiltError(FusedLossError, NotImplementedError):
    """The loaded library cannot run this call: FL_ERR_NOT_BUILT (a CUDA entry point of a build
    without CUDA), or an entry point the library does not contain yet (see _OPTIONAL below)."""


class CEOptions(ctypes.Structure):
    """fl_ce_options; build it with ce_options() (the FL_CE_OPTIONS_INIT defaults)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),          # fl_reduction (a C enum: int-sized)
        ("label_smoothing", ctypes.c_float),
        ("weight", ctypes.c_void_p),          # const float*
        ("z_loss", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("logit_scale", ctypes.c_float),
        ("error_flag", ctypes.c_void_p),      # int32_t* (device memory, CUDA only)
        # version 2
        ("logit_offset", ctypes.c_void_p),    # const float* [V] (host for CPU / device for CUDA) or NULL
        ("target_prob", ctypes.c_void_p),     # float* [N] output p_t per row (forward / fused) or NULL
    ]


class LCEOptions(ctypes.Structure):
    """fl_lce_options; build it with lce_options() (the FL_LCE_OPTIONS_INIT defaults)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("chunk_rows", ctypes.c_int64),       # 0 = from byte_budget
        ("byte_budget", ctypes.c_size_t),
        ("wgrad_accum", ctypes.c_int),        # fl_lce_accum (a C enum: int-sized)
        ("allow_tf32", ctypes.c_int32),
    ]


class DistillOptions(ctypes.Structure):
    """fl_distill_options (section 10); build it with distill_options() (FL_DISTILL_OPTIONS_INIT)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("temperature", ctypes.c_float),
        ("beta", ctypes.c_float),
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),          # fl_reduction (a C enum: int-sized); 3 = BATCHMEAN
        ("t2_scale", ctypes.c_int32),
    ]


class MarginOptions(ctypes.Structure):
    """fl_margin_options (section 11); build it with margin_options() (FL_MARGIN_OPTIONS_INIT)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("s", ctypes.c_float),
        ("m1", ctypes.c_float),
        ("m2", ctypes.c_float),
        ("m3", ctypes.c_float),
        ("easy_margin", ctypes.c_int32),
        ("grad_mode", ctypes.c_int),          # fl_margin_grad (a C enum: int-sized)
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),          # fl_reduction
        ("error_flag", ctypes.c_void_p),      # int32_t* (device memory, CUDA only)
    ]


class FocalOptions(ctypes.Structure):
    """fl_focal_options (section 12); build it with focal_options() (FL_FOCAL_OPTIONS_INIT)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("gamma", ctypes.c_float),
        ("alpha", ctypes.c_void_p),           # const float* [C] (host for CPU / device for CUDA) or NULL
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),          # fl_reduction
        ("error_flag", ctypes.c_void_p),      # int32_t* (device memory, CUDA only)
    ]


class LovaszOptions(ctypes.Structure):
    """fl_lovasz_options (section 13); build it with lovasz_options() (FL_LOVASZ_OPTIONS_INIT)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("classes", ctypes.c_int),            # fl_lovasz_classes (a C enum: int-sized)
        ("per_image", ctypes.c_int32),
        ("from_logits", ctypes.c_int32),
        ("ignore_index", ctypes.c_int64),
        ("error_flag", ctypes.c_void_p),      # int32_t* (device memory, CUDA only)
    ]


class TaylorOptions(ctypes.Structure):
    """fl_taylor_options (section 14); build it with taylor_options() (FL_TAYLOR_OPTIONS_INIT)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("order", ctypes.c_int32),            # n: 2 or 4
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),          # fl_reduction
        ("error_flag", ctypes.c_void_p),      # int32_t* (device memory, CUDA only)
    ]


class LargeMarginOptions(ctypes.Structure):
    """fl_large_margin_options (section 15); build it with large_margin_options()
    (FL_LARGE_MARGIN_OPTIONS_INIT)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("lambda_", ctypes.c_float),          # lambda (a Python keyword): finite, >= 0
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),          # fl_reduction
        ("error_flag", ctypes.c_void_p),      # int32_t* (reserved for the CUDA backend; NULL)
    ]


FL_LOVASZ_PRESENT = 0
FL_LOVASZ_ALL = 1
LOVASZ_CLASSES = {"present": FL_LOVASZ_PRESENT, "all": FL_LOVASZ_ALL}

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_F32 = ctypes.c_float
_SZ = ctypes.c_size_t
# const fl_ce_options*: c_void_p, so that callers may pass ctypes.byref(opts), None, or the
# struct's address as a plain int (what fusedloss.ops does: no ctypes object per call)
_OPTS = ctypes.c_void_p

# name: (restype, argtypes) — every public symbol of include/fusedloss.h
_CE_FWD = [_P, _P, _P, _P, _I64, _I64, _I64, _INT, _INT, _OPTS, _P, _SZ]
_CE_BWD = [_P, _P, _P, _P, _P, _F32, _I64, _I64, _I64, _INT, _INT, _OPTS, _P, _SZ]
_CE_FUSED = [_P, _P, _P, _P, _P, _P, _F32, _I64, _I64, _I64, _INT, _INT, _OPTS, _P, _SZ]
# y, x, bias, N, F, ld_y, ld_x, dtype, bias_dtype, approx
_GELU_FWD = [_P, _P, _P, _I64, _I64, _I64, _I64, _INT, _INT, _INT]
# dx, dbias, dy, x, bias, N, F, ld_dx, ld_dy, ld_x, dtype, bias_dtype, approx, workspace, bytes
_GELU_BWD = [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _INT, _INT, _INT, _P, _SZ]
# linear cross-entropy (section 6). forward: [ctx,] loss, lse, dhidden, dweight, dbias, hidden,
# ld_hidden, weight, ld_weight, bias, targets, grad_loss, grad_scale, N, H, V, dtype, wgrad_dtype,
# index_dtype, ce_opts, lce_opts, workspace, bytes[, stream]
_LCE_FWD = [_P, _P, _P, _P, _P, _P, _I64, _P, _I64, _P, _P, _P, _F32, _I64, _I64, _I64,
            _INT, _INT, _INT, _OPTS, _OPTS, _P, _SZ]
# backward: [ctx,] dhidden, dweight, dbias, hidden, ld_hidden, weight, ld_weight, bias, targets,
# lse, grad_loss, grad_scale, N, H, V, dtype, wgrad_dtype, index_dtype, ce_opts, lce_opts,
# workspace, bytes[, stream]
_LCE_BWD = [_P, _P, _P, _P, _I64, _P, _I64, _P, _P, _P, _P, _F32, _I64, _I64, _I64,
            _INT, _INT, _INT, _OPTS, _OPTS, _P, _SZ]
# vocab-parallel cross-entropy (section 8). local stats: stats, logits, targets, N, V_local, ld,
# vocab_start, V, dtype, index_dtype, opts, workspace, bytes[, stream]
_VP_STATS = [_P, _P, _P, _I64, _I64, _I64, _I64, _I64, _INT, _INT, _OPTS, _P, _SZ]
# combine: loss, lse, gathered, k (int), targets, N, V, index_dtype, opts, workspace, bytes[, stream]
_VP_COMBINE = [_P, _P, _P, _INT, _P, _I64, _I64, _INT, _OPTS, _P, _SZ]
# backward: dlogits, logits, targets, lse, grad_loss, grad_scale, N, V_local, ld, vocab_start, V,
# dtype, index_dtype, opts, workspace, bytes[, stream]
_VP_BWD = [_P, _P, _P, _P, _P, _F32, _I64, _I64, _I64, _I64, _I64, _INT, _INT, _OPTS, _P, _SZ]
_SIGNATURES = {
    "fl_version_number": (ctypes.c_uint, []),
    "fl_version_string": (ctypes.c_char_p, []),
    "fl_cuda_built": (_INT, []),
    "fl_status_string": (ctypes.c_char_p, [_INT]),
    "fl_last_error": (ctypes.c_char_p, []),
    "fl_cross_entropy_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _INT, _OPTS]),
    "fl_cross_entropy_forward_cpu": (_INT, _CE_FWD),
    "fl_cross_entropy_forward_cuda": (_INT, _CE_FWD + [_P]),
    "fl_cross_entropy_backward_cpu": (_INT, _CE_BWD),
    "fl_cross_entropy_backward_cuda": (_INT, _CE_BWD + [_P]),
    "fl_cross_entropy_fused_cpu": (_INT, _CE_FUSED),
    "fl_cross_entropy_fused_cuda": (_INT, _CE_FUSED + [_P]),
    "fl_scale_rows_cpu": (_INT, [_P, _I64, _I64, _I64, _INT, _P, _INT]),
    "fl_scale_rows_cuda": (_INT, [_P, _I64, _I64, _I64, _INT, _P, _INT, _P]),
    "fl_gelu_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _INT]),
    "fl_gelu_forward_cpu": (_INT, _GELU_FWD),
    "fl_gelu_forward_cuda": (_INT, _GELU_FWD + [_P]),
    "fl_gelu_backward_cpu": (_INT, _GELU_BWD),
    "fl_gelu_backward_cuda": (_INT, _GELU_BWD + [_P]),
    "fl_lce_context_create": (_INT, [ctypes.POINTER(ctypes.c_void_p)]),
    "fl_lce_context_destroy": (None, [_P]),
    "fl_lce_context_set_tuning": (_INT, [_P, _INT]),
    "fl_linear_cross_entropy_workspace_size": (
        _INT, [ctypes.POINTER(_SZ), _I64, _I64, _I64, _INT, _INT, _OPTS, _OPTS]),
    "fl_linear_cross_entropy_forward_cpu": (_INT, _LCE_FWD),
    "fl_linear_cross_entropy_forward_cuda": (_INT, [_P] + _LCE_FWD + [_P]),
    "fl_linear_cross_entropy_backward_cpu": (_INT, _LCE_BWD),
    "fl_linear_cross_entropy_backward_cuda": (_INT, [_P] + _LCE_BWD + [_P]),
    "fl_vp_ce_local_stats_cpu": (_INT, _VP_STATS),
    "fl_vp_ce_combine_cpu": (_INT, _VP_COMBINE),
    "fl_vp_ce_backward_cpu": (_INT, _VP_BWD),
}
# ---- section 9: elementwise losses (sigmoid focal, BCE with logits; used by fusedloss.zoo) ----
# focal forward: loss, logits, targets, n, dtype, alpha, gamma, reduction, workspace, bytes[, stream]
_FOCAL_FWD = [_P, _P, _P, _I64, _INT, _F32, _F32, _INT, _P, _SZ]
# focal backward: dlogits, logits, targets, grad_loss, grad_scale, n, dtype, alpha, gamma, reduction[, stream]
_FOCAL_BWD = [_P, _P, _P, _P, _F32, _I64, _INT, _F32, _F32, _INT]
# focal fused: loss, dlogits, logits, targets, grad_loss, grad_scale, n, dtype, alpha, gamma, reduction,
# workspace, bytes[, stream]
_FOCAL_FUSED = [_P, _P, _P, _P, _P, _F32, _I64, _INT, _F32, _F32, _INT, _P, _SZ]
# bce forward: loss, logits, targets, weight, pos_weight, N, C, dtype, reduction, workspace, bytes[, stream]
_BCE_FWD = [_P, _P, _P, _P, _P, _I64, _I64, _INT, _INT, _P, _SZ]
# bce backward: dlogits, logits, targets, weight, pos_weight, grad_loss, grad_scale, N, C, dtype,
# reduction[, stream]
_BCE_BWD = [_P, _P, _P, _P, _P, _P, _F32, _I64, _I64, _INT, _INT]
# bce fused: loss, dlogits, logits, targets, weight, pos_weight, grad_loss, grad_scale, N, C, dtype,
# reduction, workspace, bytes[, stream]
_BCE_FUSED = [_P, _P, _P, _P, _P, _P, _P, _F32, _I64, _I64, _INT, _INT, _P, _SZ]
_SIGNATURES.update({
    "fl_sigmoid_focal_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64]),
    "fl_bce_with_logits_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64]),
    "fl_sigmoid_focal_forward_cpu": (_INT, _FOCAL_FWD),
    "fl_sigmoid_focal_forward_cuda": (_INT, _FOCAL_FWD + [_P]),
    "fl_sigmoid_focal_backward_cpu": (_INT, _FOCAL_BWD),
    "fl_sigmoid_focal_backward_cuda": (_INT, _FOCAL_BWD + [_P]),
    "fl_sigmoid_focal_fused_cpu": (_INT, _FOCAL_FUSED),
    "fl_sigmoid_focal_fused_cuda": (_INT, _FOCAL_FUSED + [_P]),
    "fl_bce_with_logits_forward_cpu": (_INT, _BCE_FWD),
    "fl_bce_with_logits_forward_cuda": (_INT, _BCE_FWD + [_P]),
    "fl_bce_with_logits_backward_cpu": (_INT, _BCE_BWD),
    "fl_bce_with_logits_backward_cuda": (_INT, _BCE_BWD + [_P]),
    "fl_bce_with_logits_fused_cpu": (_INT, _BCE_FUSED),
    "fl_bce_with_logits_fused_cuda": (_INT, _BCE_FUSED + [_P]),
})
# ---- end of section 9 ----------------------------------------------------------------------------
# Symbols a library may lack: bound when present, else None in _optional (optional_symbol()).
# The CUDA vocab-parallel steps (section 8: "the CPU steps' arguments plus a stream") are not
# written yet (issue 9); once they exist (in every build: a CPU-only build answers
# FL_ERR_NOT_BUILT, as for every CUDA entry point) they move up into _SIGNATURES.
_OPTIONAL = {
    "fl_vp_ce_local_stats_cuda": (_INT, _VP_STATS + [_P]),
    "fl_vp_ce_combine_cuda": (_INT, _VP_COMBINE + [_P]),
    "fl_vp_ce_backward_cuda": (_INT, _VP_BWD + [_P]),
}
# ---- section 10: distillation divergences (used by fusedloss.distill) ----------------------------
# Optional while the backends are being written (a library built before them still imports; the
# distill functions then raise NotBuiltError); they move up into _SIGNATURES once every build has
# them (the CPU-only build's CUDA entries as FL_ERR_NOT_BUILT stubs in src/cuda/stub.c).
# forward: loss, student, ld_student, teacher, ld_teacher, teacher_dtype, labels, label_dtype, N, V,
# dtype, opts, workspace, bytes[, stream]
_DISTILL_FWD = [_P, _P, _I64, _P, _I64, _INT, _P, _INT, _I64, _I64, _INT, _OPTS, _P, _SZ]
# fused: loss, dstudent, student, ld_student, teacher, ld_teacher, teacher_dtype, labels, label_dtype,
# grad_loss, grad_scale, N, V, dtype, opts, workspace, bytes[, stream]
_DISTILL_FUSED = [_P, _P, _P, _I64, _P, _I64, _INT, _P, _INT, _P, _F32, _I64, _I64, _INT, _OPTS, _P, _SZ]
_OPTIONAL.update({
    "fl_distill_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _INT, _OPTS]),
    "fl_distill_forward_cpu": (_INT, _DISTILL_FWD),
    "fl_distill_forward_cuda": (_INT, _DISTILL_FWD + [_P]),
    "fl_distill_fused_cpu": (_INT, _DISTILL_FUSED),
    "fl_distill_fused_cuda": (_INT, _DISTILL_FUSED + [_P]),
})
# ---- end of section 10 ---------------------------------------------------------------------------
# ---- sections 11 / 12: margin softmax cross-entropy, softmax focal loss (used by
# fusedloss.softmax_losses). Optional for the same reason as section 10: a library built before
# them still imports (the functions then raise NotBuiltError).
# margin forward: loss, lse, logits, ld, targets, index_dtype, N, C, dtype, opts, workspace, bytes[, stream]
_MARGIN_FWD = [_P, _P, _P, _I64, _P, _INT, _I64, _I64, _INT, _OPTS, _P, _SZ]
# margin fused: loss, lse, dlogits, logits, ld, targets, index_dtype, grad_loss, grad_scale, N, C, dtype,
# opts, workspace, bytes[, stream]
_MARGIN_FUSED = [_P, _P, _P, _P, _I64, _P, _INT, _P, _F32, _I64, _I64, _INT, _OPTS, _P, _SZ]
# focal forward: loss, logits, ld, targets, index_dtype, N, C, d, dtype, opts, workspace, bytes[, stream]
_SFOCAL_FWD = [_P, _P, _I64, _P, _INT, _I64, _I64, _I64, _INT, _OPTS, _P, _SZ]
# focal fused: loss, dlogits, logits, ld, targets, index_dtype, grad_loss, grad_scale, N, C, d, dtype,
# opts, workspace, bytes[, stream]
_SFOCAL_FUSED = [_P, _P, _P, _I64, _P, _INT, _P, _F32, _I64, _I64, _I64, _INT, _OPTS, _P, _SZ]
_OPTIONAL.update({
    "fl_margin_ce_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _INT, _OPTS]),
    "fl_margin_ce_forward_cpu": (_INT, _MARGIN_FWD),
    "fl_margin_ce_forward_cuda": (_INT, _MARGIN_FWD + [_P]),
    "fl_margin_ce_fused_cpu": (_INT, _MARGIN_FUSED),
    "fl_margin_ce_fused_cuda": (_INT, _MARGIN_FUSED + [_P]),
    "fl_softmax_focal_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _I64, _INT, _OPTS]),
    "fl_softmax_focal_forward_cpu": (_INT, _SFOCAL_FWD),
    "fl_softmax_focal_forward_cuda": (_INT, _SFOCAL_FWD + [_P]),
    "fl_softmax_focal_fused_cpu": (_INT, _SFOCAL_FUSED),
    "fl_softmax_focal_fused_cuda": (_INT, _SFOCAL_FUSED + [_P]),
})
# ---- end of sections 11 / 12 ---------------------------------------------------------------------
# ---- section 13: Lovasz-softmax (optional as above; CUDA entries take the stream last) ----------------
# forward: loss, input, ld, labels, index_dtype, N, C, d, dtype, opts, workspace, bytes
_LOVASZ_FWD = [_P, _P, _I64, _P, _INT, _I64, _I64, _I64, _INT, _OPTS, _P, _SZ]
# fused: loss, dinput, input, ld, labels, index_dtype, grad_loss, grad_scale, N, C, d, dtype, opts, workspace,
# bytes
_LOVASZ_FUSED = [_P, _P, _P, _I64, _P, _INT, _P, _F32, _I64, _I64, _I64, _INT, _OPTS, _P, _SZ]
_OPTIONAL.update({
    "fl_lovasz_softmax_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _I64, _INT, _OPTS]),
    "fl_lovasz_softmax_forward_cpu": (_INT, _LOVASZ_FWD),
    "fl_lovasz_softmax_fused_cpu": (_INT, _LOVASZ_FUSED),
    "fl_lovasz_softmax_workspace_size_cuda": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _I64, _INT, _OPTS]),
    "fl_lovasz_softmax_forward_cuda": (_INT, _LOVASZ_FWD + [_P]),
    "fl_lovasz_softmax_fused_cuda": (_INT, _LOVASZ_FUSED + [_P]),
})
# ---- end of section 13 ---------------------------------------------------------------------------
# ---- section 14: Taylor softmax cross-entropy (optional as above; used by fusedloss.taylor) ---------
# forward: loss, logits, ld, targets, index_dtype, N, C, dtype, opts, workspace, bytes[, stream]
_TAYLOR_FWD = [_P, _P, _I64, _P, _INT, _I64, _I64, _INT, _OPTS, _P, _SZ]
# fused: loss, dlogits, logits, ld, targets, index_dtype, grad_loss, grad_scale, N, C, dtype, opts, workspace,
# bytes[, stream]
_TAYLOR_FUSED = [_P, _P, _P, _I64, _P, _INT, _P, _F32, _I64, _I64, _INT, _OPTS, _P, _SZ]
_OPTIONAL.update({
    "fl_taylor_ce_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _INT, _OPTS]),
    "fl_taylor_ce_forward_cpu": (_INT, _TAYLOR_FWD),
    "fl_taylor_ce_forward_cuda": (_INT, _TAYLOR_FWD + [_P]),
    "fl_taylor_ce_fused_cpu": (_INT, _TAYLOR_FUSED),
    "fl_taylor_ce_fused_cuda": (_INT, _TAYLOR_FUSED + [_P]),
})
# ---- end of section 14 ---------------------------------------------------------------------------
# ---- section 15: large-margin softmax cross-entropy (optional as above; used by
# fusedloss.large_margin). The entry points take section 14's arguments (CUDA: the stream last).
_OPTIONAL.update({
    "fl_large_margin_ce_workspace_size": (_INT, [ctypes.POINTER(_SZ), _I64, _I64, _INT, _OPTS]),
    "fl_large_margin_ce_forward_cpu": (_INT, _TAYLOR_FWD),
    "fl_large_margin_ce_forward_cuda": (_INT, _TAYLOR_FWD + [_P]),
    "fl_large_margin_ce_fused_cpu": (_INT, _TAYLOR_FUSED),
    "fl_large_margin_ce_fused_cuda": (_INT, _TAYLOR_FUSED + [_P]),
})
# ---- end of section 15 ---------------------------------------------------------------------------


def _candidates():
    env = os.environ.get("FUSEDLOSS_LIBRARY")
    if env:
        return [env]  # explicit choice: do not silently fall back to another copy
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    return [os.path.join(here, "libfusedloss.so"), os.path.join(repo, "build", "libfusedloss.so")]


def _load():
    tried = []
    for path in _candidates():
        if os.path.isfile(path):
            try:
                return ctypes.CDLL(path), path
            except OSError as e:
                tried.append(f"{path} ({e})")
        else:
            tried.append(f"{path} (not found)")
    raise ImportError(
        "fusedloss: cannot load libfusedloss.so; tried: " + "; ".join(tried)
        + ". Install with `pip install .`, or run `make lib` in the repository and put its "
        "python/ folder on PYTHONPATH, or set FUSEDLOSS_LIBRARY to the library's path.")


lib, library_path = _load()
for _name, (_res, _args) in _SIGNATURES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError:
        raise ImportError(f"fusedloss: {library_path} lacks the symbol {_name}; rebuild it") from None
    _fn.restype = _res
    _fn.argtypes = _args
_optional = {}
for _name, (_res, _args) in _OPTIONAL.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = _res
        _fn.argtypes = _args
    _optional[_name] = _fn
del _name, _res, _args, _fn


def optional_symbol(name):
    """The bound C function `name` of the _OPTIONAL table, or None if the library lacks it."""
    return _optional[name]


def cached_struct(cache, build, key, limit=64):
    """(struct, its address) for an options key: build(*key) once, kept in `cache` (a dict owned by
    the caller; cleared when it reaches `limit` entries), so every call passes a live address."""
    o = cache.get(key)
    if o is None:
        if len(cache) >= limit:
            cache.clear()
        st = build(*key)
        o = cache[key] = (st, ctypes.addressof(st))
    return o


def cached_value(cache, key, compute, limit=4096):
    """cache[key], computed once by compute() (e.g. a workspace size query); cleared at `limit`."""
    v = cache.get(key)
    if v is None:
        if len(cache) >= limit:
            cache.clear()
        v = cache[key] = compute()
    return v


def entry_point(name, what):
    """The bound C function `name` (an _OPTIONAL one or, once moved up, an _SIGNATURES one); raises
    NotBuiltError naming `what` (e.g. "distillation entry points (header section 10)") when the
    loaded library lacks it."""
    try:
        fn = optional_symbol(name)
    except KeyError:  # moved up into _SIGNATURES: always bound
        fn = getattr(lib, name)
    if fn is None:
        raise NotBuiltError(f"{name}: {library_path} has no {what}; rebuild it", FL_ERR_NOT_BUILT)
    return fn


def version_number():
    """fl_version_number(): FL_VERSION_NUMBER of the linked library (100 for 0.1.0)."""
    return int(lib.fl_version_number())


def version_string():
    """fl_version_string(): e.g. '0.1.0 (cuda)'."""
    return lib.fl_version_string().decode()


def cuda_built():
    """True if the loaded library contains the CUDA backend (fl_cuda_built())."""
    return bool(lib.fl_cuda_built())


def status_string(status):
    return lib.fl_status_string(int(status)).decode()


def last_error():
    return (lib.fl_last_error() or b"").decode(errors="replace")


if version_number() != EXPECTED_VERSION_NUMBER:
    raise ImportError(
        f"fusedloss: {library_path} is version {version_number()} ({version_string()}); this "
        f"package needs {EXPECTED_VERSION_NUMBER}. Rebuild the library or reinstall the package.")


_ERROR_CLASSES = {FL_ERR_TARGET_OUT_OF_RANGE: TargetOutOfRangeError,
                  FL_ERR_NOT_BUILT: NotBuiltError}


def _check(status, fn_name):
    """Raise FusedLossError(f"{fn_name}: {status_string}: {last_error}") unless status is FL_OK.

    Call it right after the C call, on the same thread (fl_last_error() is thread-local)."""
    if status != FL_OK:
        cls = _ERROR_CLASSES.get(status, FusedLossError)
        raise cls(f"{fn_name}: {status_string(status)}: {last_error()}", status)


def ce_options(ignore_index=-100, reduction=FL_REDUCTION_MEAN, label_smoothing=0.0, weight=0,
               z_loss=0.0, softcap=0.0, logit_scale=1.0, error_flag=0, logit_offset=0, target_prob=0):
    """An fl_ce_options (FL_CE_OPTIONS_INIT defaults); weight / error_flag / logit_offset (fp32 [V]
    added to the logits after softcap) / target_prob (fp32 [N] output p_t) are addresses (0 = NULL)."""
    return CEOptions(ctypes.sizeof(CEOptions), int(ignore_index), int(reduction),
                     float(label_smoothing), weight or None, float(z_loss), float(softcap),
                     float(logit_scale), error_flag or None, logit_offset or None, target_prob or None)


def workspace_size(N, V, dtype, opts=None):
    """fl_cross_entropy_workspace_size(): bytes of scratch memory the cross-entropy calls need."""
    out = ctypes.c_size_t(0)
    _check(lib.fl_cross_entropy_workspace_size(ctypes.byref(out), int(N), int(V), int(dtype),
                                               ctypes.byref(opts) if opts is not None else None),
           "fl_cross_entropy_workspace_size")
    return out.value


def gelu_workspace_size(N, F, dtype):
    """fl_gelu_workspace_size(): bytes of workspace a GeLU backward with dbias needs (CUDA: its
    first 4096 bytes must be zero before first use; the library leaves them zero)."""
    out = ctypes.c_size_t(0)
    _check(lib.fl_gelu_workspace_size(ctypes.byref(out), int(N), int(F), int(dtype)),
           "fl_gelu_workspace_size")
    return out.value


def lce_options(chunk_rows=0, byte_budget=FL_LCE_DEFAULT_BYTE_BUDGET,
                wgrad_accum=FL_LCE_ACCUM_AUTO, allow_tf32=False):
    """An fl_lce_options (FL_LCE_OPTIONS_INIT defaults): chunk_rows 0 = from byte_budget."""
    return LCEOptions(ctypes.sizeof(LCEOptions), int(chunk_rows), int(byte_budget),
                      int(wgrad_accum), 1 if allow_tf32 else 0)


def lce_workspace_size(N, H, V, dtype, wgrad_dtype, ce_opts=None, lce_opts=None):
    """fl_linear_cross_entropy_workspace_size(): bytes of workspace every linear cross-entropy
    call needs. ce_opts / lce_opts: CEOptions / LCEOptions, their addresses (ints), or None."""
    out = ctypes.c_size_t(0)

    def ref(o):
        return o if o is None or isinstance(o, int) else ctypes.byref(o)
    _check(lib.fl_linear_cross_entropy_workspace_size(ctypes.byref(out), int(N), int(H), int(V),
                                                      int(dtype), int(wgrad_dtype), ref(ce_opts),
                                                      ref(lce_opts)),
           "fl_linear_cross_entropy_workspace_size")
    return out.value


def lce_context_create():
    """fl_lce_context_create(): a new fl_lce_context* (an int address) on the current CUDA
    device; FusedLossError (FL_ERR_NOT_BUILT) in a build without CUDA."""
    ctx = ctypes.c_void_p(None)
    _check(lib.fl_lce_context_create(ctypes.byref(ctx)), "fl_lce_context_create")
    return ctx.value


def lce_context_set_tuning(ctx, on):
    """fl_lce_context_set_tuning(): while on, calls on ctx time cuBLASLt's ranked algorithms for
    every GEMM shape not tuned yet and keep the fastest (such calls synchronise and leave their
    outputs unspecified: see the header)."""
    _check(lib.fl_lce_context_set_tuning(ctx, 1 if on else 0), "fl_lce_context_set_tuning")


def lce_context_destroy(ctx):
    """fl_lce_context_destroy() (None / 0 is a no-op)."""
    lib.fl_lce_context_destroy(ctx or None)


def distill_options(temperature=1.0, beta=0.0, ignore_index=-100, reduction=FL_REDUCTION_MEAN,
                    t2_scale=False):
    """An fl_distill_options (FL_DISTILL_OPTIONS_INIT defaults; reduction an fl_reduction number,
    FL_REDUCTION_BATCHMEAN included). The C library validates the values."""
    return DistillOptions(ctypes.sizeof(DistillOptions), float(temperature), float(beta),
                          int(ignore_index), int(reduction), 1 if t2_scale else 0)


def distill_workspace_size(N, V, dtype, opts=None):
    """fl_distill_workspace_size(): bytes of workspace every distillation call needs. opts: a
    DistillOptions, its address (int), or None (defaults). NotBuiltError if the library predates
    section 10."""
    fn = _optional["fl_distill_workspace_size"]
    if fn is None:
        raise NotBuiltError(f"fl_distill_workspace_size: {library_path} has no distillation entry points "
                            "(built before include/fusedloss.h section 10); rebuild it", FL_ERR_NOT_BUILT)
    out = ctypes.c_size_t(0)
    ref = opts if opts is None or isinstance(opts, int) else ctypes.byref(opts)
    _check(fn(ctypes.byref(out), int(N), int(V), int(dtype), ref), "fl_distill_workspace_size")
    return out.value


def _optional_fn(name, what):
    fn = _optional[name]
    if fn is None:
        raise NotBuiltError(f"{name}: {library_path} has no {what} entry points (built before "
                            "include/fusedloss.h sections 11 / 12); rebuild it", FL_ERR_NOT_BUILT)
    return fn


def margin_options(s=64.0, m1=1.0, m2=0.5, m3=0.0, easy_margin=False, grad_mode=FL_MARGIN_GRAD_EXACT,
                   ignore_index=-100, reduction=FL_REDUCTION_MEAN, error_flag=0):
    """An fl_margin_options (FL_MARGIN_OPTIONS_INIT defaults: ArcFace s 64, m2 0.5); grad_mode and
    reduction fl_* numbers, error_flag an address (0 = NULL). The C library validates the values."""
    return MarginOptions(ctypes.sizeof(MarginOptions), float(s), float(m1), float(m2), float(m3),
                         1 if easy_margin else 0, int(grad_mode), int(ignore_index), int(reduction),
                         error_flag or None)


def margin_ce_workspace_size(N, C, dtype, opts=None):
    """fl_margin_ce_workspace_size(): bytes of workspace every margin cross-entropy call needs.
    opts: a MarginOptions, its address (int), or None. NotBuiltError if the library predates
    section 11."""
    fn = _optional_fn("fl_margin_ce_workspace_size", "margin cross-entropy")
    out = ctypes.c_size_t(0)
    ref = opts if opts is None or isinstance(opts, int) else ctypes.byref(opts)
    _check(fn(ctypes.byref(out), int(N), int(C), int(dtype), ref), "fl_margin_ce_workspace_size")
    return out.value


def focal_options(gamma=2.0, alpha=0, ignore_index=-100, reduction=FL_REDUCTION_MEAN, error_flag=0):
    """An fl_focal_options (FL_FOCAL_OPTIONS_INIT defaults); alpha / error_flag addresses (0 = NULL)
    of an fp32 [C] array / a device int32. The C library validates the values."""
    return FocalOptions(ctypes.sizeof(FocalOptions), float(gamma), alpha or None, int(ignore_index),
                        int(reduction), error_flag or None)


def softmax_focal_workspace_size(N, C, d, dtype, opts=None):
    """fl_softmax_focal_workspace_size(): bytes of workspace every softmax focal call needs for N
    samples of C classes at d positions. opts: a FocalOptions, its address (int), or None.
    NotBuiltError if the library predates section 12."""
    fn = _optional_fn("fl_softmax_focal_workspace_size", "softmax focal")
    out = ctypes.c_size_t(0)
    ref = opts if opts is None or isinstance(opts, int) else ctypes.byref(opts)
    _check(fn(ctypes.byref(out), int(N), int(C), int(d), int(dtype), ref), "fl_softmax_focal_workspace_size")
    return out.value


def lovasz_options(classes=FL_LOVASZ_PRESENT, per_image=False, from_logits=False, ignore_index=-100,
                   error_flag=0):
    """An fl_lovasz_options (FL_LOVASZ_OPTIONS_INIT defaults); classes an fl_lovasz_classes number,
    error_flag an address (0 = NULL). The C library validates the values."""
    return LovaszOptions(ctypes.sizeof(LovaszOptions), int(classes), 1 if per_image else 0,
                         1 if from_logits else 0, int(ignore_index), error_flag or None)


def lovasz_softmax_workspace_size(N, C, d, dtype, opts=None, cuda=False):
    """fl_lovasz_softmax_workspace_size() (host workspace of the CPU calls) or, with cuda=True,
    fl_lovasz_softmax_workspace_size_cuda() (device workspace on the current device): bytes for N
    images of C classes and d pixels (it depends on the options). opts: a LovaszOptions, its
    address (int), or None. NotBuiltError if the library predates section 13 (or its CUDA part)."""
    name = "fl_lovasz_softmax_workspace_size_cuda" if cuda else "fl_lovasz_softmax_workspace_size"
    fn = _optional_fn(name, "Lovasz-softmax")
    out = ctypes.c_size_t(0)
    ref = opts if opts is None or isinstance(opts, int) else ctypes.byref(opts)
    _check(fn(ctypes.byref(out), int(N), int(C), int(d), int(dtype), ref), name)
    return out.value


def taylor_options(order=2, ignore_index=-100, reduction=FL_REDUCTION_MEAN, error_flag=0):
    """An fl_taylor_options (FL_TAYLOR_OPTIONS_INIT defaults: order 2, ignore_index -100, MEAN);
    reduction an fl_reduction number, error_flag an address (0 = NULL). The C library validates the
    values."""
    return TaylorOptions(ctypes.sizeof(TaylorOptions), int(order), int(ignore_index), int(reduction),
                         error_flag or None)


def taylor_ce_workspace_size(N, C, dtype, opts=None):
    """fl_taylor_ce_workspace_size(): bytes of workspace every Taylor softmax cross-entropy call needs
    (both backends; 0 for reduction none). opts: a TaylorOptions, its address (int), or None.
    NotBuiltError if the library predates section 14."""
    fn = entry_point("fl_taylor_ce_workspace_size",
                     "Taylor softmax cross-entropy entry points (include/fusedloss.h section 14)")
    out = ctypes.c_size_t(0)
    ref = opts if opts is None or isinstance(opts, int) else ctypes.byref(opts)
    _check(fn(ctypes.byref(out), int(N), int(C), int(dtype), ref), "fl_taylor_ce_workspace_size")
    return out.value


def large_margin_options(lam=0.3, ignore_index=-100, reduction=FL_REDUCTION_MEAN, error_flag=0):
    """An fl_large_margin_options (FL_LARGE_MARGIN_OPTIONS_INIT defaults: lambda 0.3, ignore_index -100,
    MEAN); reduction an fl_reduction number, error_flag an address (0 = NULL; reserved for the CUDA
    backend). The C library validates the values."""
    return LargeMarginOptions(ctypes.sizeof(LargeMarginOptions), float(lam), int(ignore_index), int(reduction),
                              error_flag or None)


def large_margin_ce_workspace_size(N, C, dtype, opts=None):
    """fl_large_margin_ce_workspace_size(): bytes of workspace every large-margin softmax cross-entropy
    call needs (0 for reduction none; the rule of section 14). opts: a LargeMarginOptions, its address
    (int), or None. NotBuiltError if the library predates section 15."""
    fn = entry_point("fl_large_margin_ce_workspace_size",
                     "large-margin softmax cross-entropy entry points (include/fusedloss.h section 15)")
    out = ctypes.c_size_t(0)
    ref = opts if opts is None or isinstance(opts, int) else ctypes.byref(opts)
    _check(fn(ctypes.byref(out), int(N), int(C), int(dtype), ref), "fl_large_margin_ce_workspace_size")
    return out.value
