"""fusedloss.softmax_losses — margin softmax cross-entropy (CosFace / ArcFace / combined margins,
include/fusedloss.h section 11) and the multi-class softmax focal loss (section 12):

    loss = fusedloss.margin_cross_entropy(cosine, target, s=64.0, m2=0.5)         # ArcFace
    criterion = fusedloss.ArcFaceLoss(s=64.0, m=0.5)        # / CosFaceLoss(m=0.4) / CombinedMarginLoss
    loss = fusedloss.softmax_focal_loss(logits, target, alpha=None, gamma=2.0)   # rows or NCHW maps
    criterion = fusedloss.SoftmaxFocalLoss(alpha=class_weights, gamma=2.0, ignore_index=255)

Margin cross-entropy (insightface's CombinedMarginLoss(s, m1, m2, m3) followed by F.cross_entropy,
in one pass): cosine logits x [N, C] (leading dimensions flattened to rows), class targets y. For a
row with target y, theta = acos(clamp(x_y, -1, 1)):

    phi = cos(m1 theta + m2) - m3          where the margin applies: m1 theta + m2 <= pi
                                           (easy_margin: x_y > 0)
    phi = x_y - m3 - m2 sin(m2)            otherwise (insightface's "x - sinmm"; easy_margin: x_y - m3)
    z_j = s x_j (j != y),  z_y = s phi,    l = logsumexp(z) - z_y

ArcFace = (m1, m2, m3) = (1, 0.5, 0), CosFace = (1, 0, 0.4) (phi = x_y - m3 exactly). The gradient
w.r.t. the cosines: grad_mode "exact" differentiates phi (phi' = m1 sin(m1 theta + m2) /
max(sin theta, 1e-6) where the margin applies, else 1); "straight" treats the margin as a constant
shift, z_y = s (x_y + (phi - x_y).detach()) (insightface's newer arccos_ / cos_ under no_grad).
insightface marks unused rows with label -1: pass ignore_index=-1 for that convention.

Softmax focal loss (kornia / MONAI semantics): logits [N, C] or [N, C, d1, d2, ...] (the class
dimension is 1, as F.cross_entropy's), targets [N] or [N, d1, d2, ...]; per position with target
y and p = softmax over the C classes there:

    l = -alpha_y (1 - p_y)^gamma log p_y

alpha: a per-class tensor [C], a float (the same weight for every class) or None (1). gamma = 0 is
the alpha-weighted cross-entropy, BUT "mean" divides by the number of positions not ignored, not by
the sum of alpha_y as F.cross_entropy(weight=alpha, reduction="mean") does: softmax_focal_loss(x, t,
alpha=w, gamma=0) == F.cross_entropy(x, t, weight=w, reduction="sum") / (t != ignore_index).sum()
(kornia's mean). Reduction "none" gives the target's shape.

Both: positions whose target equals ignore_index count 0 and get a zero gradient (their logits are
not read); reductions "none", "sum", "mean" (over positions not ignored; NaN if none, gradient then
0). Targets int32 / int64 (other integer dtypes are cast). The losses are returned in the input's
dtype (computed in fp32 by CUDA, in double by the CPU backend; rounded once). Out-of-range targets:
TargetOutOfRangeError (an IndexError) on CPU; on CUDA that row's loss and gradient are NaN and the
device error flag is set (fusedloss.check_errors(), debug mode: see fusedloss.ops).

All layers of the two op families live in this one module (as fusedloss.distill): custom ops
(torch.library; CPU and CUDA kernels calling fl_margin_ce_* / fl_softmax_focal_* on the current
stream; fake kernels for torch.compile / meta tensors), their autograd (register_autograd), the
PyTorch formulas (fallbacks) and the functional / nn.Module API. Ops (namespace "fusedloss"):

  margin_ce_forward(logits, target, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction)
      -> loss                                            (fl_margin_ce_forward_*, lse NULL)
  margin_ce_fused(logits, target, grad?, <same options>) -> dlogits
      (fl_margin_ce_fused_*, loss NULL): the backward of margin_ce_forward for the upstream
      gradient grad (fp32, N elements for reduction none, else 1; None = 1)
  margin_ce_loss_and_grad(logits, target, <same options>) -> (loss, dlogits)
      both in one call, dlogits for an upstream gradient of 1 (non-differentiable output)
      logits 2-D [N, C], unit column stride, row stride ld >= C; targets [N] contiguous; grad_mode
      0 exact / 1 straight, reduction 0 none / 1 mean / 2 sum (the fl_* numbers).
  softmax_focal_forward(logits, target, alpha?, gamma, ignore_index, reduction) -> loss
  softmax_focal_fused(logits, target, alpha?, grad?, gamma, ignore_index, reduction) -> dlogits
  softmax_focal_loss_and_grad(logits, target, alpha?, gamma, ignore_index, reduction) -> (loss, dlogits)
      logits 2-D [N, C] (rows, d = 1: unit column stride, row stride ld >= C) or 3-D [N, C, d]
      (element (n, c, k) at n ld + c d + k: strides (ld >= C d, d, 1)); targets [N] resp. [N, d]
      contiguous; alpha fp32 [C] contiguous or None; grad N d elements (none) or 1, contiguous.
  Logits float32 / float16 / bfloat16; targets int32 / int64. Losses float32: the target's shape
  (none) or 0-d; dlogits of the logits' dtype and shape with the C API's strides. No C call for
  zero positions (none: empty, sum 0, mean NaN, as the header).

Autograd (what the functions do, on CPU and CUDA, eager and torch.compile alike; as
fusedloss.distill):
  * scalar reductions (mean / sum) with logits that require grad: ONE C call in the forward
    (*_loss_and_grad: loss and dlogits for an upstream gradient of 1: reads the logits once or
    twice, writes dlogits once); backward only scales the kept dlogits by the real upstream
    gradient: eager in place with fl_scale_rows (on the device, no host sync, nothing moved when
    the gradient is 1, the usual loss.backward()), traced (torch.compile) as dlogits * grad. Extra
    memory: the gradient, formed in the forward. Eager backward may run only once (retain_graph and
    a second backward raise) and create_graph=True is refused.
  * reduction none, or logits that do not require grad: *_forward in the forward (saves the
    inputs), *_fused with the per-position upstream gradient in the backward.
  * double backward (differentiating the gradient) raises RuntimeError.
Cases the kernels do not serve fall back to the PyTorch formulas below (float64 or other floating
dtypes, devices other than cpu / cuda, a focal alpha tensor that requires grad), so that the
functions stay drop-ins.
"""
import ctypes
import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _lib
from . import ops as _ops
from ._lib import MARGIN_GRAD, REDUCTIONS, _check
from .autograd import kept_grad_loss, register_kept_grad_autograd

__all__ = ["margin_cross_entropy", "ArcFaceLoss", "CosFaceLoss", "CombinedMarginLoss",
           "softmax_focal_loss", "SoftmaxFocalLoss",
           "margin_ce_forward", "margin_ce_fused", "margin_ce_loss_and_grad",
           "softmax_focal_forward", "softmax_focal_fused", "softmax_focal_loss_and_grad"]

_DTYPES = {torch.float32: _lib.FL_DTYPE_F32, torch.float16: _lib.FL_DTYPE_F16,
           torch.bfloat16: _lib.FL_DTYPE_BF16}
_INDEX_DTYPES = {torch.int32: _lib.FL_INDEX_I32, torch.int64: _lib.FL_INDEX_I64}
_NONE = _lib.FL_REDUCTION_NONE
_SUM = _lib.FL_REDUCTION_SUM
_F32 = torch.float32
_REDUCTION_NAMES = {v: k for k, v in REDUCTIONS.items()}
_GRAD_MODE_NAMES = {v: k for k, v in MARGIN_GRAD.items()}
_MARGIN_FN = "fusedloss.margin_cross_entropy"
_FOCAL_FN = "fusedloss.softmax_focal_loss"


# ---- argument checks (shared by the functional API, the op bodies and the fake kernels) -----------
def _check_reduction(fn, reduction):
    if isinstance(reduction, str):
        if reduction not in REDUCTIONS:
            raise ValueError(f"{fn}: reduction must be one of {', '.join(repr(k) for k in REDUCTIONS)}, "
                             f"got {reduction!r}")
    elif isinstance(reduction, bool) or reduction not in _REDUCTION_NAMES:
        raise ValueError(f"{fn}: reduction must be an fl_reduction number 0 (none), 1 (mean) or 2 (sum), "
                         f"got {reduction!r}")


_FLT_MAX = 3.4028234663852886e38


def _f32(v):
    """float(v) rounded to the nearest fp32 (ties to even; inf past FLT_MAX), in plain Python so that
    torch.compile can trace it (normal range only: all the checks below need)."""
    v = float(v)
    if v == 0 or not math.isfinite(v):
        return v
    m, e = math.frexp(v)
    r = math.ldexp(round(m * 16777216.0) / 16777216.0, e)  # 24 significant bits
    return r if abs(r) <= _FLT_MAX else math.copysign(math.inf, r)


def _finite(v):
    """A real number that stays finite as the fp32 the options struct holds."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and math.isfinite(_f32(v)))


def _check_margin_options(s, m1, m2, m3, grad_mode, reduction, fn=_MARGIN_FN):
    """Raise ValueError unless the options are those header section 11 accepts: s finite > 0, m1
    finite >= 1, m2 in [0, pi), m3 finite >= 0, grad_mode 'exact' / 'straight' (the functional API)
    or 0 / 1 (the ops), reduction a name (functional) or an fl_reduction number (ops)."""
    _check_reduction(fn, reduction)
    if isinstance(grad_mode, str):
        if grad_mode not in MARGIN_GRAD:
            raise ValueError(f"{fn}: grad_mode must be 'exact' or 'straight', got {grad_mode!r}")
    elif isinstance(grad_mode, bool) or grad_mode not in _GRAD_MODE_NAMES:
        raise ValueError(f"{fn}: grad_mode must be 0 (exact) or 1 (straight), got {grad_mode!r}")
    if not (_finite(s) and s > 0):
        raise ValueError(f"{fn}: s (the scale) must be finite and > 0, got {s!r}")
    if not (_finite(m1) and m1 >= 1):
        raise ValueError(f"{fn}: m1 (the multiplicative angular margin) must be finite and >= 1, got {m1!r}")
    if not (_finite(m2) and 0 <= m2 and _f32(m2) < math.pi):  # as the fp32 the C library checks
        raise ValueError(f"{fn}: m2 (the additive angular margin) must be in [0, pi), got {m2!r}")
    if not (_finite(m3) and m3 >= 0):
        raise ValueError(f"{fn}: m3 (the additive cosine margin) must be finite and >= 0, got {m3!r}")


def _check_focal_options(gamma, reduction, fn=_FOCAL_FN):
    _check_reduction(fn, reduction)
    if not (_finite(gamma) and gamma >= 0):
        raise ValueError(f"{fn}: gamma must be finite and >= 0, got {gamma!r}")


def _rows_ld(x, C):
    """Row stride of a 2-D [N, C] tensor as the C API reads it, or None if not of that layout."""
    N = x.shape[0]
    if N == 0:
        return C  # nothing is read
    if C > 1 and x.stride(1) != 1:
        return None
    if N == 1:
        return C
    ld = x.stride(0)
    return ld if ld >= C else None


def _focal_ld(x):
    """Batch stride ld of 2-D [N, C] / 3-D [N, C, d] logits as the C API reads them (element
    (n, c, k) at n ld + c d + k), or None if the tensor is not of that layout."""
    if x.dim() == 2:
        return _rows_ld(x, x.shape[1])
    N, C, d = x.shape
    if N == 0 or d == 0:
        return C * d  # nothing is read
    if (d > 1 and x.stride(2) != 1) or (C > 1 and x.stride(1) != d):
        return None
    if N <= 1:
        return C * d
    ld = x.stride(0)
    return ld if ld >= C * d else None


def _index_code(op, target, device):
    it = _INDEX_DTYPES.get(target.dtype)
    if it is None:
        raise TypeError(f"fusedloss::{op}: target dtype {target.dtype} not supported (int64, int32)")
    if target.device != device:
        raise ValueError(f"fusedloss::{op}: target is on {target.device}, logits on {device}")
    if not target.is_contiguous():
        raise ValueError(f"fusedloss::{op}: target must be contiguous")
    return it


def _logits_code(op, logits):
    dt = _DTYPES.get(logits.dtype)
    if dt is None:
        raise TypeError(f"fusedloss::{op}: logits dtype {logits.dtype} not supported (float32, float16, bfloat16)")
    return dt


def _rows_layout(op, logits, target):
    """Validate the tensors of a row loss's ops (margin CE, Taylor CE): logits [N, C] with a unit
    column stride, target [N]: (N, C, ld, dtype code, index dtype code)."""
    if logits.dim() != 2:
        raise ValueError(f"fusedloss::{op}: logits must be 2-D [N, C], got shape {tuple(logits.shape)}")
    dt = _logits_code(op, logits)
    N, C = logits.shape
    if C < 1:
        raise ValueError(f"fusedloss::{op}: C must be >= 1, got shape {tuple(logits.shape)}")
    ld = _rows_ld(logits, C)
    if ld is None:
        raise ValueError(f"fusedloss::{op}: logits need a unit column stride and a row stride >= C (got strides "
                         f"{logits.stride()}); make them contiguous")
    if tuple(target.shape) != (N,):
        raise ValueError(f"fusedloss::{op}: target must have shape ({N},), got {tuple(target.shape)}")
    it = _index_code(op, target, logits.device)
    return N, C, ld, dt, it


def _focal_layout(op, logits, target, alpha):
    """Validate the focal ops' tensors: (N, C, d, ld, dtype code, index dtype code)."""
    if logits.dim() not in (2, 3):
        raise ValueError(f"fusedloss::{op}: logits must be 2-D [N, C] or 3-D [N, C, d], got shape "
                         f"{tuple(logits.shape)}")
    dt = _logits_code(op, logits)
    N, C = logits.shape[:2]
    d = logits.shape[2] if logits.dim() == 3 else 1
    if C < 1:
        raise ValueError(f"fusedloss::{op}: C must be >= 1, got shape {tuple(logits.shape)}")
    ld = _focal_ld(logits)
    if ld is None:
        raise ValueError(f"fusedloss::{op}: logits need strides (ld >= C*d, d, 1) for [N, C, d] (row stride >= C "
                         f"and a unit column stride for [N, C]), got strides {logits.stride()}; make them contiguous")
    want = (N, d) if logits.dim() == 3 else (N,)
    if tuple(target.shape) != want:
        raise ValueError(f"fusedloss::{op}: target must have shape {want}, got {tuple(target.shape)}")
    it = _index_code(op, target, logits.device)
    if alpha is not None:
        if alpha.dtype != _F32 or tuple(alpha.shape) != (C,) or alpha.device != logits.device:
            raise ValueError(f"fusedloss::{op}: alpha must be a float32 ({C},) tensor on {logits.device}, got "
                             f"{alpha.dtype} {tuple(alpha.shape)} on {alpha.device}")
        if C > 1 and alpha.stride(0) != 1:
            raise ValueError(f"fusedloss::{op}: alpha must be contiguous")
    return N, C, d, ld, dt, it


def _check_grad(op, grad, n, device):
    if grad.dtype != _F32 or grad.numel() != n or grad.device != device:
        raise ValueError(f"fusedloss::{op}: grad must be float32 with {n} element(s) on {device}, got "
                         f"{grad.dtype} {tuple(grad.shape)} on {grad.device}")
    if not grad.is_contiguous():
        raise ValueError(f"fusedloss::{op}: grad must be contiguous")


def _grad_geometry(logits, ld):
    """(shape, strides, extent in elements) of the dlogits the C API writes (the logits' layout)."""
    if logits.dim() == 2:
        N, C = logits.shape
        return (N, C), (ld, 1), ((N - 1) * ld + C if N > 0 else 0)
    N, C, d = logits.shape
    return (N, C, d), (ld, d, 1), ((N - 1) * ld + C * d if N > 0 else 0)


def _new_grad(logits, ld):
    """A gradient buffer of the logits' layout (the C API uses one ld for both); on CUDA also at the
    logits' address modulo 16 bytes (as fusedloss.ops does for dlogits)."""
    shape, strides, extent = _grad_geometry(logits, ld)
    mis = logits.data_ptr() & 15 if logits.device.type == "cuda" else 0
    if mis == 0 or extent == 0:
        return torch.empty_strided(shape, strides, dtype=logits.dtype, device=logits.device)
    es = logits.element_size()
    base = torch.empty(extent + 16 // es, dtype=logits.dtype, device=logits.device)
    return base.as_strided(shape, strides, mis // es)


def _fake_grad(logits, ld):
    shape, strides, _ = _grad_geometry(logits, ld)
    return logits.new_empty_strided(shape, strides)


# ---- the C calls ---------------------------------------------------------------------------------
_opts_cache = {}  # ("m" / "f", options..., error flag address) -> (options struct, address)
_ws_cache = {}    # ("m" / "f", sizes..., dtype) -> bytes


def _options(key):
    o = _opts_cache.get(key)
    if o is None:
        if len(_opts_cache) >= 256:
            _opts_cache.clear()
        st = _lib.margin_options(*key[1:]) if key[0] == "m" else _lib.focal_options(*key[1:])
        o = _opts_cache[key] = (st, ctypes.addressof(st))
    return o


def _ws_bytes(key, addr):
    n = _ws_cache.get(key)
    if n is None:
        if key[0] == "m":
            n = _lib.margin_ce_workspace_size(key[1], key[2], key[3], addr)
        else:
            n = _lib.softmax_focal_workspace_size(key[1], key[2], key[3], key[4], addr)
        if len(_ws_cache) >= 4096:
            _ws_cache.clear()
        _ws_cache[key] = n
    return n


def _sym(name):
    """The bound C function (NotBuiltError if the loaded library has no such entry point)."""
    return _lib.entry_point(name, "margin / softmax focal entry points (built before include/fusedloss.h sections 11 / 12)")


def _empty_result(kind, loss, dl, reduction):
    """Zero positions: no C call (a 0-element tensor's data_ptr may be NULL); as the header."""
    if loss is not None and reduction != _NONE:
        loss.fill_(0.0 if reduction == _SUM else float("nan"))
    if kind == 0:
        return loss
    return dl if kind == 1 else (loss, dl)


def _after_cuda_call(dev):
    if _ops.is_debug() and not torch.cuda.is_current_stream_capturing():
        _ops.check_errors(dev)  # synchronises; raises TargetOutOfRangeError if the flag was set


def _run_margin(kind, logits, target, grad, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction):
    """kind 0: loss (forward); 1: dlogits for grad (fused, loss NULL); 2: (loss, dlogits) for an
    upstream gradient of 1 (fused, grad_loss NULL)."""
    op = ("margin_ce_forward", "margin_ce_fused", "margin_ce_loss_and_grad")[kind]
    _check_margin_options(s, m1, m2, m3, grad_mode, reduction, fn=f"fusedloss::{op}")
    N, C, ld, dt, it = _rows_layout(op, logits, target)
    dev = logits.device
    if kind == 1 and grad is not None:
        _check_grad(op, grad, N if reduction == _NONE else 1, dev)
    loss = torch.empty((N,) if reduction == _NONE else (), dtype=_F32, device=dev) if kind != 1 else None
    dl = _new_grad(logits, ld) if kind != 0 else None
    if N == 0:
        return _empty_result(kind, loss, dl, reduction)
    cuda = dev.type == "cuda"
    if cuda and dev.index is not None and _ops._current_device() != dev.index:
        with torch.cuda.device(dev.index):
            return _run_margin(kind, logits, target, grad, s, m1, m2, m3, easy_margin, grad_mode, ignore_index,
                               reduction)
    flag = _ops.flag_ptr(dev.index if dev.index is not None else _ops._current_device()) if cuda else 0
    opts = _options(("m", float(s), float(m1), float(m2), float(m3), bool(easy_margin), int(grad_mode),
                     int(ignore_index), int(reduction), flag))
    nbytes = _ws_bytes(("m", N, C, dt), opts[1])
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    tail = (_ops.raw_stream_of(dev),) if cuda else ()
    sfx = "cuda" if cuda else "cpu"
    if kind == 0:
        name = f"fl_margin_ce_forward_{sfx}"
        st = _sym(name)(loss.data_ptr(), None, logits.data_ptr(), ld, target.data_ptr(), it, N, C, dt, opts[1],
                        ws.data_ptr(), nbytes, *tail)
    else:
        name = f"fl_margin_ce_fused_{sfx}"
        gptr = grad.data_ptr() if (kind == 1 and grad is not None) else None
        st = _sym(name)(loss.data_ptr() if loss is not None else None, None, dl.data_ptr(), logits.data_ptr(), ld,
                        target.data_ptr(), it, gptr, 1.0, N, C, dt, opts[1], ws.data_ptr(), nbytes, *tail)
    _check(st, name)
    if cuda:
        _after_cuda_call(dev)
    if kind == 0:
        return loss
    return dl if kind == 1 else (loss, dl)


def _run_focal(kind, logits, target, alpha, grad, gamma, ignore_index, reduction):
    """As _run_margin, for the softmax focal loss."""
    op = ("softmax_focal_forward", "softmax_focal_fused", "softmax_focal_loss_and_grad")[kind]
    _check_focal_options(gamma, reduction, fn=f"fusedloss::{op}")
    N, C, d, ld, dt, it = _focal_layout(op, logits, target, alpha)
    dev = logits.device
    if kind == 1 and grad is not None:
        _check_grad(op, grad, N * d if reduction == _NONE else 1, dev)
    loss = (torch.empty(tuple(target.shape) if reduction == _NONE else (), dtype=_F32, device=dev)
            if kind != 1 else None)
    dl = _new_grad(logits, ld) if kind != 0 else None
    if N * d == 0:
        return _empty_result(kind, loss, dl, reduction)
    cuda = dev.type == "cuda"
    if cuda and dev.index is not None and _ops._current_device() != dev.index:
        with torch.cuda.device(dev.index):
            return _run_focal(kind, logits, target, alpha, grad, gamma, ignore_index, reduction)
    flag = _ops.flag_ptr(dev.index if dev.index is not None else _ops._current_device()) if cuda else 0
    opts = _options(("f", float(gamma), alpha.data_ptr() if alpha is not None else 0, int(ignore_index),
                     int(reduction), flag))
    nbytes = _ws_bytes(("f", N, C, d, dt), opts[1])
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    tail = (_ops.raw_stream_of(dev),) if cuda else ()
    sfx = "cuda" if cuda else "cpu"
    if kind == 0:
        name = f"fl_softmax_focal_forward_{sfx}"
        st = _sym(name)(loss.data_ptr(), logits.data_ptr(), ld, target.data_ptr(), it, N, C, d, dt, opts[1],
                        ws.data_ptr(), nbytes, *tail)
    else:
        name = f"fl_softmax_focal_fused_{sfx}"
        gptr = grad.data_ptr() if (kind == 1 and grad is not None) else None
        st = _sym(name)(loss.data_ptr() if loss is not None else None, dl.data_ptr(), logits.data_ptr(), ld,
                        target.data_ptr(), it, gptr, 1.0, N, C, d, dt, opts[1], ws.data_ptr(), nbytes, *tail)
    _check(st, name)
    if cuda:
        _after_cuda_call(dev)
    if kind == 0:
        return loss
    return dl if kind == 1 else (loss, dl)


# ---- custom ops: margin cross-entropy --------------------------------------------------------------
@torch.library.custom_op("fusedloss::margin_ce_forward", mutates_args=(), device_types=("cpu", "cuda"))
def margin_ce_forward(logits: Tensor, target: Tensor, s: float, m1: float, m2: float, m3: float,
                      easy_margin: bool, grad_mode: int, ignore_index: int, reduction: int) -> Tensor:
    """The margin cross-entropy (fl_margin_ce_forward_*): fp32, [N] for reduction none, else 0-d."""
    return _run_margin(0, logits, target, None, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction)


@margin_ce_forward.register_fake
def _(logits, target, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction):
    _check_margin_options(s, m1, m2, m3, grad_mode, reduction, fn="fusedloss::margin_ce_forward")
    N = _rows_layout("margin_ce_forward", logits, target)[0]
    return logits.new_empty((N,) if reduction == _NONE else (), dtype=_F32)


@torch.library.custom_op("fusedloss::margin_ce_fused", mutates_args=(), device_types=("cpu", "cuda"))
def margin_ce_fused(logits: Tensor, target: Tensor, grad: Optional[Tensor], s: float, m1: float, m2: float,
                    m3: float, easy_margin: bool, grad_mode: int, ignore_index: int, reduction: int) -> Tensor:
    """dlogits = grad * dloss/dlogits (fl_margin_ce_fused_*, loss NULL); grad fp32 with N elements for
    reduction none, else 1 (None = 1). The logits' dtype, shape and row stride."""
    return _run_margin(1, logits, target, grad, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction)


@margin_ce_fused.register_fake
def _(logits, target, grad, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction):
    _check_margin_options(s, m1, m2, m3, grad_mode, reduction, fn="fusedloss::margin_ce_fused")
    N, C, ld = _rows_layout("margin_ce_fused", logits, target)[:3]
    if grad is not None:
        _check_grad("margin_ce_fused", grad, N if reduction == _NONE else 1, logits.device)
    return _fake_grad(logits, ld)


@torch.library.custom_op("fusedloss::margin_ce_loss_and_grad", mutates_args=(), device_types=("cpu", "cuda"))
def margin_ce_loss_and_grad(logits: Tensor, target: Tensor, s: float, m1: float, m2: float, m3: float,
                            easy_margin: bool, grad_mode: int, ignore_index: int,
                            reduction: int) -> Tuple[Tensor, Tensor]:
    """(loss, dlogits) in one fl_margin_ce_fused_* call, dlogits for an upstream gradient of 1."""
    return _run_margin(2, logits, target, None, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction)


@margin_ce_loss_and_grad.register_fake
def _(logits, target, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction):
    _check_margin_options(s, m1, m2, m3, grad_mode, reduction, fn="fusedloss::margin_ce_loss_and_grad")
    N, C, ld = _rows_layout("margin_ce_loss_and_grad", logits, target)[:3]
    return logits.new_empty((N,) if reduction == _NONE else (), dtype=_F32), _fake_grad(logits, ld)


# ---- custom ops: softmax focal ------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::softmax_focal_forward", mutates_args=(), device_types=("cpu", "cuda"))
def softmax_focal_forward(logits: Tensor, target: Tensor, alpha: Optional[Tensor], gamma: float,
                          ignore_index: int, reduction: int) -> Tensor:
    """The softmax focal loss (fl_softmax_focal_forward_*): fp32, the target's shape for reduction
    none, else 0-d."""
    return _run_focal(0, logits, target, alpha, None, gamma, ignore_index, reduction)


@softmax_focal_forward.register_fake
def _(logits, target, alpha, gamma, ignore_index, reduction):
    _check_focal_options(gamma, reduction, fn="fusedloss::softmax_focal_forward")
    _focal_layout("softmax_focal_forward", logits, target, alpha)
    return logits.new_empty(tuple(target.shape) if reduction == _NONE else (), dtype=_F32)


@torch.library.custom_op("fusedloss::softmax_focal_fused", mutates_args=(), device_types=("cpu", "cuda"))
def softmax_focal_fused(logits: Tensor, target: Tensor, alpha: Optional[Tensor], grad: Optional[Tensor],
                        gamma: float, ignore_index: int, reduction: int) -> Tensor:
    """dlogits = grad * dloss/dlogits (fl_softmax_focal_fused_*, loss NULL); grad fp32 with N d
    elements for reduction none, else 1 (None = 1). The logits' dtype, shape and strides."""
    return _run_focal(1, logits, target, alpha, grad, gamma, ignore_index, reduction)


@softmax_focal_fused.register_fake
def _(logits, target, alpha, grad, gamma, ignore_index, reduction):
    _check_focal_options(gamma, reduction, fn="fusedloss::softmax_focal_fused")
    N, C, d, ld = _focal_layout("softmax_focal_fused", logits, target, alpha)[:4]
    if grad is not None:
        _check_grad("softmax_focal_fused", grad, N * d if reduction == _NONE else 1, logits.device)
    return _fake_grad(logits, ld)


@torch.library.custom_op("fusedloss::softmax_focal_loss_and_grad", mutates_args=(),
                         device_types=("cpu", "cuda"))
def softmax_focal_loss_and_grad(logits: Tensor, target: Tensor, alpha: Optional[Tensor], gamma: float,
                                ignore_index: int, reduction: int) -> Tuple[Tensor, Tensor]:
    """(loss, dlogits) in one fl_softmax_focal_fused_* call, dlogits for an upstream gradient of 1."""
    return _run_focal(2, logits, target, alpha, None, gamma, ignore_index, reduction)


@softmax_focal_loss_and_grad.register_fake
def _(logits, target, alpha, gamma, ignore_index, reduction):
    _check_focal_options(gamma, reduction, fn="fusedloss::softmax_focal_loss_and_grad")
    ld = _focal_layout("softmax_focal_loss_and_grad", logits, target, alpha)[3]
    return (logits.new_empty(tuple(target.shape) if reduction == _NONE else (), dtype=_F32),
            _fake_grad(logits, ld))


# ---- autograd (the zoo's shared registration: fusedloss.autograd) ----------------------------------
_MARGIN_ARGS = 8  # non-tensor arguments after (logits, target): s, m1, m2, m3, easy_margin, grad_mode, ...
_FOCAL_ARGS = 3   # after (logits, target, alpha): gamma, ignore_index, reduction
register_kept_grad_autograd(margin_ce_forward, margin_ce_fused, margin_ce_loss_and_grad, "margin_ce_fused",
                            "margin_cross_entropy", 2, _MARGIN_ARGS, reduction_index=2 + _MARGIN_ARGS - 1)
# no gradient for alpha (class weights are constants here; see the module docstring)
register_kept_grad_autograd(softmax_focal_forward, softmax_focal_fused, softmax_focal_loss_and_grad,
                            "softmax_focal_fused", "softmax_focal_loss", 3, _FOCAL_ARGS,
                            reduction_index=3 + _FOCAL_ARGS - 1)


# ---- the PyTorch formulas (fallbacks) ----------------------------------------------------------------
def _compute_dtype(x):
    return torch.promote_types(x.dtype, _F32)


def _reduce(l, keep, reduction, shape):
    if reduction == "none":
        return l.reshape(shape)
    if reduction == "sum":
        return l.sum()
    return l.sum() / keep.sum()  # NaN when every position is ignored (0 / 0), gradient then 0


def _margin_phi(xy, m1, m2, m3, easy_margin):
    """phi(x_y) of header section 11 in torch ops; differentiable with the header's exact phi'
    (m1 sin(m1 theta + m2) / max(sin theta, 1e-6) where the margin applies, else 1)."""
    if m1 == 1.0 and m2 == 0.0:
        return xy - m3  # CosFace: exactly the shift, for any x (no acos, no clamp)
    xc = xy.clamp(-1.0, 1.0)
    # where sin theta < 1e-6 (also beyond [-1, 1], clamped) the header clamps the denominator of
    # phi': dtheta/dx = -1e6 there (a first-order term around the exact value); elsewhere acos
    # itself, differentiable to any order
    edge = (1.0 - xc * xc) < 1e-12
    theta_in = torch.acos(torch.where(edge, torch.zeros_like(xc), xc))
    theta_edge = torch.acos(xc.detach()) - (xy - xy.detach()) * 1e6
    theta = torch.where(edge, theta_edge, theta_in)
    a = m1 * theta + m2
    applies = (xy > 0) if easy_margin else (a <= math.pi)
    phi_m = torch.cos(a) - m3
    phi_o = xy - m3 if easy_margin else xy - m3 - m2 * math.sin(m2)
    return torch.where(applies, phi_m, phi_o)


def _margin_reference(cosine, target, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction):
    """Header section 11 in torch ops (float32 for 16-bit inputs, float64 stays float64), the loss
    in the input's dtype, differentiable w.r.t. the cosines (grad_mode as the kernels)."""
    C = cosine.shape[-1]
    x = cosine.reshape(-1, C).to(_compute_dtype(cosine))
    t = target.reshape(-1).to(x.device).long()
    keep = t != ignore_index
    tc = torch.where(keep, t, torch.zeros_like(t))
    x = torch.where(keep[:, None], x, torch.zeros((), dtype=x.dtype, device=x.device))  # ignored: not read
    xy = x.gather(1, tc[:, None]).squeeze(1)
    if grad_mode == "straight":
        xd = xy.detach()
        phi = xy + (_margin_phi(xd, m1, m2, m3, easy_margin) - xd)  # the margin as a constant shift
    else:
        phi = _margin_phi(xy, m1, m2, m3, easy_margin)
    z = (s * x).scatter(1, tc[:, None], (s * phi)[:, None])
    l = F.cross_entropy(z, tc, reduction="none")
    l = torch.where(keep, l, torch.zeros((), dtype=l.dtype, device=l.device))
    return _reduce(l, keep, reduction, cosine.shape[:-1]).to(cosine.dtype)


def _focal_reference(logits, target, alpha, gamma, ignore_index, reduction):
    """Header section 12 in torch ops (float32 for 16-bit inputs, float64 stays float64), the loss in
    the logits' dtype, differentiable w.r.t. the logits (and an alpha tensor)."""
    N, C = logits.shape[0], logits.shape[1]
    x = logits.reshape(N, C, -1).to(_compute_dtype(logits))
    t = target.reshape(N, -1).to(x.device).long()
    keep = t != ignore_index
    tc = torch.where(keep, t, torch.zeros_like(t))
    x = torch.where(keep[:, None, :], x, torch.zeros((), dtype=x.dtype, device=x.device))  # ignored: not read
    logp = F.log_softmax(x, dim=1).gather(1, tc[:, None, :]).squeeze(1)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if gamma == 0:
        w = -logp
    else:
        q = -torch.expm1(logp)
        # q^gamma with the header's limit where q == 0 (p_y == 1): weight and its derivative 0, not
        # autograd's 0 * inf = NaN for gamma < 1
        pos = q > 0
        w = torch.where(pos, torch.where(pos, q, torch.ones_like(q)) ** gamma, zero) * -logp
    if alpha is None:
        l = w
    elif isinstance(alpha, Tensor):
        l = alpha.to(device=x.device, dtype=x.dtype)[tc] * w
    else:
        l = float(alpha) * w
    l = torch.where(keep, l, zero)
    return _reduce(l, keep, reduction, target.shape).to(logits.dtype)


# ---- functional API --------------------------------------------------------------------------------
def _index_target(fn, target, device):
    if not isinstance(target, Tensor) or target.is_floating_point() or target.is_complex() \
            or target.dtype == torch.bool:
        raise TypeError(f"{fn}: target must be an integer Tensor (class indices)")
    if target.device != device:
        raise ValueError(f"{fn}: target is on {target.device}, the input on {device}")


def _as_index(t):
    if t.dtype not in _INDEX_DTYPES:
        t = t.long()
    return t.contiguous()


def margin_cross_entropy(cosine: Tensor, target: Tensor, *, s: float = 64.0, m1: float = 1.0, m2: float = 0.5,
                         m3: float = 0.0, easy_margin: bool = False, grad_mode: str = "exact",
                         ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    r"""Margin softmax cross-entropy on cosine logits (include/fusedloss.h section 11): insightface's
    ``CombinedMarginLoss(s, m1, m2, m3)`` followed by ``F.cross_entropy``, in one pass.

    ``cosine``: ``[N, C]`` (or ``[..., C]``, leading dims flattened) cosine similarities of the
    embeddings and the class centres, float32 / float16 / bfloat16 (other floating dtypes use the
    PyTorch formula); ``target``: class indices of the leading shape (or ``[N]``), int32 / int64.
    Per row with target y, theta = acos(clamp(x_y, -1, 1)): phi = cos(m1 theta + m2) - m3 where the
    margin applies (m1 theta + m2 <= pi; ``easy_margin``: x_y > 0), else x_y - m3 - m2 sin(m2)
    (``easy_margin``: x_y - m3); the loss is the cross-entropy of z = s x with z_y = s phi. Defaults:
    ArcFace (s 64, m2 0.5); CosFace is m2 = 0, m3 = 0.4 (phi = x_y - m3). ``grad_mode``: ``'exact'``
    (differentiate phi: m1 sin(m1 theta + m2) / max(sin theta, 1e-6) where the margin applies, else 1)
    or ``'straight'`` (phi' = 1: z_y = s (x_y + (phi - x_y).detach()), insightface's newer
    margin-without-gradient). Rows whose target is ``ignore_index`` count 0 (insightface uses -1).
    ``reduction``: ``'mean'`` (over rows not ignored; NaN if none), ``'sum'``, ``'none'`` (the
    leading shape). Returns the loss in the input's dtype; gradient w.r.t. the cosines only. Works
    under torch.compile(fullgraph=True)."""
    fn = _MARGIN_FN
    if not isinstance(cosine, Tensor):
        raise TypeError(f"{fn}: cosine must be a Tensor")
    if not cosine.is_floating_point():
        raise TypeError(f"{fn}: cosine must be a floating-point Tensor, got {cosine.dtype}")
    _check_margin_options(s, m1, m2, m3, grad_mode, reduction)
    if cosine.dim() < 1:
        raise ValueError(f"{fn}: cosine must have at least 1 dimension [..., C]")
    C = cosine.shape[-1]
    if C < 1:
        raise ValueError(f"{fn}: the number of classes C (last dimension) must be >= 1, got shape "
                         f"{tuple(cosine.shape)}")
    lead = cosine.shape[:-1]
    N = math.prod(lead)
    _index_target(fn, target, cosine.device)
    if target.shape != lead and not (target.dim() == 1 and target.shape[0] == N):
        raise ValueError(f"{fn}: target shape {tuple(target.shape)} must be the input's leading shape "
                         f"{tuple(lead)} (or ({N},))")
    s, m1, m2, m3 = float(s), float(m1), float(m2), float(m3)
    easy_margin = bool(easy_margin)
    if cosine.dtype not in _DTYPES or cosine.device.type not in ("cpu", "cuda"):
        return _margin_reference(cosine, target, s, m1, m2, m3, easy_margin, grad_mode, ignore_index, reduction)
    x = cosine.reshape(-1, C)
    if _rows_ld(x, C) is None:
        x = x.contiguous()
    t = _as_index(target.reshape(-1))
    red = REDUCTIONS[reduction]
    args = (s, m1, m2, m3, easy_margin, MARGIN_GRAD[grad_mode], int(ignore_index), red)
    if red != _NONE and cosine.requires_grad and torch.is_grad_enabled():
        loss = kept_grad_loss((x, t), lambda: _run_margin(2, x, t, None, *args),
                              lambda: torch.ops.fusedloss.margin_ce_loss_and_grad(x, t, *args), "margin_cross_entropy")
    else:
        loss = torch.ops.fusedloss.margin_ce_forward(x, t, *args)
        if red == _NONE:
            loss = loss.reshape(lead)
    return loss if loss.dtype == cosine.dtype else loss.to(cosine.dtype)


def softmax_focal_loss(logits: Tensor, target: Tensor, *, alpha: Union[Tensor, float, None] = None,
                       gamma: float = 2.0, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    r"""Multi-class (softmax) focal loss on logits (include/fusedloss.h section 12):
    ``-alpha_y (1 - p_y)^gamma log p_y`` per position, p = softmax over the classes.

    ``logits``: ``[N, C]`` or ``[N, C, d1, d2, ...]`` (class dimension 1, as ``F.cross_entropy``;
    e.g. NCHW segmentation maps; a single ``[C]`` sample too), float32 / float16 / bfloat16 (other
    floating dtypes use the PyTorch formula); ``target``: class indices ``[N]`` or
    ``[N, d1, d2, ...]``, int32 / int64. ``alpha``: per-class weights ``[C]`` (a tensor; one that
    requires grad uses the PyTorch formula, the only path that differentiates alpha), a float (every
    class), or None (1). ``gamma`` >= 0 (0: the alpha-weighted cross-entropy). Positions whose target
    is ``ignore_index`` count 0. ``reduction``: ``'mean'`` over the positions not ignored (NaN if
    none; NOT divided by the alpha sum: with ``gamma = 0`` this is ``F.cross_entropy(logits, target,
    weight=alpha, reduction='sum') / (target != ignore_index).sum()``, unlike the weighted mean of
    ``F.cross_entropy(..., reduction='mean')``), ``'sum'``, ``'none'`` (the target's shape). Returns
    the loss in the logits' dtype; gradient w.r.t. the logits. Works under
    torch.compile(fullgraph=True)."""
    fn = _FOCAL_FN
    if not isinstance(logits, Tensor):
        raise TypeError(f"{fn}: logits must be a Tensor")
    if not logits.is_floating_point():
        raise TypeError(f"{fn}: logits must be a floating-point Tensor, got {logits.dtype}")
    _check_focal_options(gamma, reduction)
    _index_target(fn, target, logits.device)
    if logits.dim() == 0:
        raise ValueError(f"{fn}: logits must be [N, C] or [N, C, d1, ...], got a 0-d tensor")
    if logits.dim() == 1:  # one unbatched sample [C], target [] (as F.cross_entropy)
        if target.dim() != 0:
            raise ValueError(f"{fn}: for logits of shape ({logits.shape[0]},) the target must be 0-d, got "
                             f"shape {tuple(target.shape)}")
        out = softmax_focal_loss(logits[None], target[None], alpha=alpha, gamma=gamma, ignore_index=ignore_index,
                                 reduction=reduction)
        return out.reshape(()) if reduction == "none" else out
    N, C = logits.shape[0], logits.shape[1]
    if C < 1:
        raise ValueError(f"{fn}: the number of classes C (dimension 1) must be >= 1, got shape "
                         f"{tuple(logits.shape)}")
    spatial = logits.shape[2:]
    want = (N,) + tuple(spatial)
    if tuple(target.shape) != want:
        raise ValueError(f"{fn}: target shape {tuple(target.shape)} must be {want} (logits {tuple(logits.shape)} "
                         "are [N, C, d1, ...]: the class dimension is 1)")
    if alpha is not None and not isinstance(alpha, Tensor):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise TypeError(f"{fn}: alpha must be a per-class Tensor [C], a float or None, got {type(alpha).__name__}")
        alpha = float(alpha)
    if isinstance(alpha, Tensor):
        if alpha.dim() != 1 or alpha.shape[0] != C or not (alpha.is_floating_point()):
            raise ValueError(f"{fn}: alpha must be a floating-point tensor of shape ({C},) (one weight per class), "
                             f"got {alpha.dtype} {tuple(alpha.shape)}")
    gamma = float(gamma)
    if (logits.dtype not in _DTYPES or logits.device.type not in ("cpu", "cuda")
            or (isinstance(alpha, Tensor) and alpha.requires_grad and torch.is_grad_enabled())):
        return _focal_reference(logits, target, alpha, gamma, ignore_index, reduction)
    d = math.prod(spatial)
    x = logits if logits.dim() == 2 else logits.reshape(N, C, d)
    if _focal_ld(x) is None:
        x = x.contiguous()
    t = _as_index(target if logits.dim() == 2 else target.reshape(N, d))
    if alpha is None:
        a = None
    elif isinstance(alpha, Tensor):
        a = alpha.detach().to(device=logits.device, dtype=_F32).contiguous()
    else:
        a = torch.full((C,), alpha, dtype=_F32, device=logits.device)
    red = REDUCTIONS[reduction]
    args = (gamma, int(ignore_index), red)
    if red != _NONE and logits.requires_grad and torch.is_grad_enabled():
        loss = kept_grad_loss((x, t, a), lambda: _run_focal(2, x, t, a, None, *args),
                              lambda: torch.ops.fusedloss.softmax_focal_loss_and_grad(x, t, a, *args),
                              "softmax_focal_loss")
    else:
        loss = torch.ops.fusedloss.softmax_focal_forward(x, t, a, *args)
        if red == _NONE:
            loss = loss.reshape(target.shape)
    return loss if loss.dtype == logits.dtype else loss.to(logits.dtype)


# ---- modules ---------------------------------------------------------------------------------------
class CombinedMarginLoss(torch.nn.Module):
    """Module form of fusedloss.margin_cross_entropy: forward(cosine, target) -> loss.

    insightface's CombinedMarginLoss(s, m1, m2, m3) and the cross-entropy after it: phi =
    cos(m1 theta + m2) - m3 on the target cosine (see margin_cross_entropy). Options validated here:
    s > 0, m1 >= 1, m2 in [0, pi), m3 >= 0, easy_margin, grad_mode ('exact' / 'straight'),
    ignore_index (insightface: -1), reduction ('mean' default, 'sum', 'none')."""

    def __init__(self, s: float = 64.0, m1: float = 1.0, m2: float = 0.5, m3: float = 0.0,
                 easy_margin: bool = False, grad_mode: str = "exact", ignore_index: int = -100,
                 reduction: str = "mean"):
        super().__init__()
        _check_margin_options(s, m1, m2, m3, grad_mode, reduction, fn=f"fusedloss.{type(self).__name__}")
        self.s, self.m1, self.m2, self.m3 = float(s), float(m1), float(m2), float(m3)
        self.easy_margin = bool(easy_margin)
        self.grad_mode = grad_mode
        self.ignore_index = int(ignore_index)
        self.reduction = reduction

    def forward(self, cosine: Tensor, target: Tensor) -> Tensor:
        return margin_cross_entropy(cosine, target, s=self.s, m1=self.m1, m2=self.m2, m3=self.m3,
                                    easy_margin=self.easy_margin, grad_mode=self.grad_mode,
                                    ignore_index=self.ignore_index, reduction=self.reduction)

    def extra_repr(self) -> str:
        return (f"s={self.s}, m1={self.m1}, m2={self.m2}, m3={self.m3}, easy_margin={self.easy_margin}, "
                f"grad_mode={self.grad_mode!r}, ignore_index={self.ignore_index}, reduction={self.reduction!r}")


class ArcFaceLoss(CombinedMarginLoss):
    """ArcFace (additive angular margin): CombinedMarginLoss(s, m1=1, m2=m, m3=0);
    forward(cosine, target)."""

    def __init__(self, s: float = 64.0, m: float = 0.5, easy_margin: bool = False, grad_mode: str = "exact",
                 ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(s, 1.0, m, 0.0, easy_margin, grad_mode, ignore_index, reduction)


class CosFaceLoss(CombinedMarginLoss):
    """CosFace (additive cosine margin, phi = x_y - m): CombinedMarginLoss(s, m1=1, m2=0, m3=m);
    forward(cosine, target). (easy_margin and grad_mode change nothing for CosFace: phi' = 1.)"""

    def __init__(self, s: float = 64.0, m: float = 0.4, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__(s, 1.0, 0.0, m, False, "exact", ignore_index, reduction)


class SoftmaxFocalLoss(torch.nn.Module):
    """Module form of fusedloss.softmax_focal_loss: forward(logits, target) -> loss.

    alpha: per-class weights [C] (kept as a buffer, so .to(device) moves it), a float, or None;
    gamma >= 0; ignore_index; reduction ('mean' over positions not ignored, 'sum', 'none')."""

    def __init__(self, alpha: Union[Tensor, float, None] = None, gamma: float = 2.0, ignore_index: int = -100,
                 reduction: str = "mean"):
        super().__init__()
        _check_focal_options(gamma, reduction, fn="fusedloss.SoftmaxFocalLoss")
        if isinstance(alpha, Tensor):
            if alpha.dim() != 1 or not alpha.is_floating_point():
                raise ValueError("fusedloss.SoftmaxFocalLoss: alpha must be a 1-D floating-point tensor [C], "
                                 f"got {alpha.dtype} {tuple(alpha.shape)}")
            self.register_buffer("alpha", alpha.detach().clone())
        else:
            if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))):
                raise TypeError(f"fusedloss.SoftmaxFocalLoss: alpha must be a Tensor [C], a float or None, got "
                                f"{type(alpha).__name__}")
            self.alpha = None if alpha is None else float(alpha)
        self.gamma = float(gamma)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return softmax_focal_loss(logits, target, alpha=self.alpha, gamma=self.gamma,
                                  ignore_index=self.ignore_index, reduction=self.reduction)

    def extra_repr(self) -> str:
        a = f"tensor of {self.alpha.shape[0]}" if isinstance(self.alpha, Tensor) else self.alpha
        return f"alpha={a}, gamma={self.gamma}, ignore_index={self.ignore_index}, reduction={self.reduction!r}"
