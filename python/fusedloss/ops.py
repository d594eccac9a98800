"""fusedloss.ops — torch.library custom ops over the C entry points (layer 2, STYLE.md section 7).

Ops (namespace "fusedloss"; each has a CPU kernel calling fl_*_cpu, a CUDA kernel calling
fl_*_cuda on torch's current stream, and a fake kernel for torch.compile / meta tensors):

  cross_entropy_forward(logits, target, weight?, ignore_index, reduction, label_smoothing,
                        z_loss, softcap, logit_scale) -> (loss, lse)
  cross_entropy_backward(grad_loss, logits, target, lse, weight?, ..., grad_scale) -> dlogits
  cross_entropy_fused(logits, target, weight?, ..., grad_loss?, grad_scale) -> (loss, lse, dlogits)
  cross_entropy_fused_inplace(logits!, target, weight?, ..., grad_loss?, grad_scale) -> (loss, lse)
      the same, with dlogits written over the logits (mutates_args=("logits",))

The ops are deliberately raw: logits are 2-D (N, V) with unit column stride and a row stride
ld = stride(0) >= V (the C API's layout); target is 1-D (N,) int32/int64; weight is fp32 (V,);
reduction is the fl_reduction number (0 none, 1 mean, 2 sum); softcap 0 means off. Shape
handling, defaults, soft targets and autograd live in functional.py / autograd.py.
Outputs: loss fp32, (N,) for reduction none else 0-d; lse fp32 (N,); dlogits has the logits'
dtype, shape (N, V) and the logits' row stride. N == 0 is answered without a C call (sum 0,
mean NaN, as torch). The *_impl functions are the ops' bodies; autograd.py's eager path calls
them directly, skipping the dispatcher.

Out-of-range targets: the CPU kernels raise TargetOutOfRangeError (an IndexError). The CUDA
kernels cannot check without a host sync; they make the row's loss and gradient NaN and set a
per-device int32 flag kept by this module (passed as fl_ce_options.error_flag). The flag is
read only by check_errors() (which synchronises), or after every op call in debug mode
(FUSEDLOSS_DEBUG=1 in the environment, or set_debug(True)); never implicitly otherwise.
"""
import ctypes
import os
import threading
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib
from ._lib import TargetOutOfRangeError, _check

__all__ = ["cross_entropy_forward", "cross_entropy_backward", "cross_entropy_fused",
           "cross_entropy_fused_inplace", "check_errors", "set_debug", "is_debug"]

_fl = _lib.lib
_DTYPES = {torch.float32: _lib.FL_DTYPE_F32, torch.float16: _lib.FL_DTYPE_F16,
           torch.bfloat16: _lib.FL_DTYPE_BF16}
_INDEX_DTYPES = {torch.int32: _lib.FL_INDEX_I32, torch.int64: _lib.FL_INDEX_I64}
_NONE = _lib.FL_REDUCTION_NONE

# ---- debug mode and the device error flag ------------------------------------------------
_debug = os.environ.get("FUSEDLOSS_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def set_debug(enabled=True):
    """Debug mode: after every CUDA op call, synchronise and raise at once if a target was out of
    range (check_errors()). Slow (one host sync per call); skipped while a CUDA graph is being
    captured. Also switched on by FUSEDLOSS_DEBUG=1 in the environment at import."""
    global _debug
    _debug = bool(enabled)


def is_debug():
    return _debug


_error_flags = {}  # device index -> int32 tensor of 1 element (zeroed; kernels only store 1)


def _error_flag_ptr(device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    flag = _error_flags.get(idx)
    if flag is None:
        if torch.cuda.is_current_stream_capturing():
            # Allocating (and zeroing) during capture would put the flag in the graph's private
            # pool and re-zero it at every replay; run one eager call first (the warm-up that
            # torch.cuda.graph asks for anyway). Without a flag the row is still NaN.
            return 0
        flag = torch.zeros(1, dtype=torch.int32, device=torch.device("cuda", idx))
        _error_flags[idx] = flag
    return flag.data_ptr()


def check_errors(device=None):
    """Raise TargetOutOfRangeError if a CUDA kernel saw an out-of-range target since the last check.

    Synchronises the device(s) (so call it where you already sync, e.g. when you log
    loss.item()), then resets the flag. device: None (every device used so far), an index, or a
    torch.device. CPU calls never need this: they raise at once."""
    if device is None:
        devices = list(_error_flags)
    else:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type != "cuda":
            return
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    bad = []
    for idx in devices:
        flag = _error_flags.get(idx)
        if flag is None:
            continue
        torch.cuda.synchronize(idx)  # the kernels may have run on any stream of that device
        if int(flag.item()) != 0:
            flag.zero_()
            torch.cuda.synchronize(idx)
            bad.append(idx)
    if bad:
        raise TargetOutOfRangeError(
            "fusedloss: a cross-entropy target not in [0, V) and not ignore_index was seen on "
            + ", ".join(f"cuda:{i}" for i in bad)
            + " since the last check (those rows' loss and gradient are NaN; a mean/sum loss is "
            "NaN). Use fusedloss.set_debug(True) or FUSEDLOSS_DEBUG=1 to find the call.",
            _lib.FL_ERR_TARGET_OUT_OF_RANGE)


def _debug_check(device):
    if not torch.cuda.is_current_stream_capturing():
        check_errors(device)


# ---- per-call helpers -----------------------------------------------------------------------
try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # int handle, no Stream object
except AttributeError:  # pragma: no cover - older or CPU-only builds
    def _raw_stream(idx):
        return torch.cuda.current_stream(idx).cuda_stream

_opts_cache = {}


def _options(ignore_index, reduction, label_smoothing, weight, z_loss, softcap, logit_scale,
             flag_ptr):
    wptr = weight.data_ptr() if weight is not None else 0
    key = (ignore_index, reduction, label_smoothing, wptr, z_loss, softcap, logit_scale, flag_ptr)
    opts = _opts_cache.get(key)
    if opts is None:
        if len(_opts_cache) > 512:
            _opts_cache.clear()
        opts = _lib.ce_options(ignore_index, reduction, label_smoothing, wptr, z_loss, softcap,
                               logit_scale, flag_ptr)
        _opts_cache[key] = opts
    return opts, key


_ws_cache = {}
_tls = threading.local()


def _workspace(N, V, dt, opts, key, device):
    """Scratch memory for one call. CUDA: a fresh tensor from torch's caching allocator (stream
    ordered, so safe with concurrent streams and inside CUDA graphs). CPU: the calls are
    synchronous, so one growing buffer per thread is reused."""
    k = (N, V, dt, key[1])  # size depends on sizes, dtype and (at most) the reduction
    nbytes = _ws_cache.get(k)
    if nbytes is None:
        nbytes = _lib.workspace_size(N, V, dt, opts)
        if len(_ws_cache) > 4096:
            _ws_cache.clear()
        _ws_cache[k] = nbytes
    if nbytes == 0:
        return None, 0
    if device.type == "cpu":
        buf = getattr(_tls, "workspace", None)
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8)
            _tls.workspace = buf
        return buf, nbytes
    return torch.empty(nbytes, dtype=torch.uint8, device=device), nbytes


def _check_args(op, logits, target, weight=None, lse=None):
    """Validate the raw op's inputs (Python CHECK_DEVICE/CHECK_SHAPE); returns N, V, ld, codes."""
    if logits.dim() != 2:
        raise ValueError(f"fusedloss::{op}: logits must be 2-D (N, V), got shape {tuple(logits.shape)}")
    dt = _DTYPES.get(logits.dtype)
    if dt is None:
        raise TypeError(f"fusedloss::{op}: logits dtype {logits.dtype} not supported "
                        "(float32, float16, bfloat16)")
    N, V = logits.shape
    if V < 1:
        raise ValueError(f"fusedloss::{op}: logits must have V >= 1 classes, got shape {tuple(logits.shape)}")
    if V > 1 and logits.stride(1) != 1:
        raise ValueError(f"fusedloss::{op}: logits must have unit column stride, got strides {logits.stride()}")
    ld = logits.stride(0) if N > 1 else V
    if ld < V:
        raise ValueError(f"fusedloss::{op}: logits row stride {ld} < V ({V})")
    it = _INDEX_DTYPES.get(target.dtype)
    if it is None:
        raise TypeError(f"fusedloss::{op}: target dtype {target.dtype} not supported (int64, int32)")
    if target.dim() != 1 or target.shape[0] != N:
        raise ValueError(f"fusedloss::{op}: target must have shape ({N},), got {tuple(target.shape)}")
    if target.device != logits.device:
        raise ValueError(f"fusedloss::{op}: target is on {target.device}, logits on {logits.device}")
    if N > 1 and target.stride(0) != 1:
        raise ValueError(f"fusedloss::{op}: target must be contiguous")
    if weight is not None:
        if weight.dtype != torch.float32 or weight.shape != (V,) or weight.device != logits.device:
            raise ValueError(f"fusedloss::{op}: weight must be float32 of shape ({V},) on "
                             f"{logits.device}, got {weight.dtype} {tuple(weight.shape)} on {weight.device}")
        if V > 1 and weight.stride(0) != 1:
            raise ValueError(f"fusedloss::{op}: weight must be contiguous")
    if lse is not None:
        if lse.dtype != torch.float32 or lse.shape != (N,) or lse.device != logits.device:
            raise ValueError(f"fusedloss::{op}: lse must be float32 of shape ({N},) on {logits.device}")
        if N > 1 and lse.stride(0) != 1:
            raise ValueError(f"fusedloss::{op}: lse must be contiguous")
    return N, V, ld, dt, it


def _check_grad_loss(op, grad_loss, N, reduction, device):
    n = N if reduction == _NONE else 1
    if grad_loss.dtype != torch.float32 or grad_loss.numel() != n or grad_loss.device != device:
        raise ValueError(f"fusedloss::{op}: grad_loss must be float32 with {n} element(s) on "
                         f"{device}, got {grad_loss.dtype} {tuple(grad_loss.shape)} on {grad_loss.device}")
    if n > 1 and (grad_loss.dim() != 1 or grad_loss.stride(0) != 1):
        raise ValueError(f"fusedloss::{op}: grad_loss must be a contiguous ({n},) tensor")


def _loss_shape(N, reduction):
    return (N,) if reduction == _NONE else ()


def _empty_loss(loss, reduction):
    """N == 0: torch's values (sum 0, mean NaN) without a C call (a 0-element tensor's data_ptr
    may be NULL, which the C API rejects as a missing output)."""
    if reduction != _NONE:
        loss.fill_(float("nan") if reduction == _lib.FL_REDUCTION_MEAN else 0.0)
    return loss


def _new_dlogits(logits, N, V, ld):
    if ld == V:
        return torch.empty((N, V), dtype=logits.dtype, device=logits.device)
    # the C API writes dlogits with the logits' row stride (one ld for both)
    return torch.empty_strided((N, V), (ld, 1), dtype=logits.dtype, device=logits.device)


def _ptr(t):
    return t.data_ptr() if t is not None else None


class _Device:
    """Device guard + stream for a CUDA call; no-op context for CPU."""
    __slots__ = ("idx", "prev")

    def __init__(self, device):
        self.idx = device.index if device.index is not None else torch.cuda.current_device()

    def __enter__(self):
        self.prev = torch.cuda.current_device()
        if self.prev != self.idx:
            torch.cuda.set_device(self.idx)
        return _raw_stream(self.idx)

    def __exit__(self, *exc):
        if self.prev != self.idx:
            torch.cuda.set_device(self.prev)
        return False


# ---- implementations (called by the ops below, and directly by autograd.py's eager path) -----
def forward_impl(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                 softcap, logit_scale):
    """Loss and per-row lse (fl_cross_entropy_forward_{cpu,cuda}); see the module docstring."""
    N, V, ld, dt, it = _check_args("cross_entropy_forward", logits, target, weight)
    dev = logits.device
    loss = torch.empty(_loss_shape(N, reduction), dtype=torch.float32, device=dev)
    lse = torch.empty((N,), dtype=torch.float32, device=dev)
    if N == 0:
        return _empty_loss(loss, reduction), lse
    if dev.type == "cuda":
        opts, key = _options(ignore_index, reduction, label_smoothing, weight, z_loss, softcap,
                             logit_scale, _error_flag_ptr(dev))
        ws, nbytes = _workspace(N, V, dt, opts, key, dev)
        with _Device(dev) as stream:
            st = _fl.fl_cross_entropy_forward_cuda(
                loss.data_ptr(), lse.data_ptr(), logits.data_ptr(), target.data_ptr(), N, V, ld,
                dt, it, ctypes.byref(opts), _ptr(ws), nbytes, stream)
        _check(st, "fl_cross_entropy_forward_cuda")
        if _debug:
            _debug_check(dev)
    else:
        opts, key = _options(ignore_index, reduction, label_smoothing, weight, z_loss, softcap,
                             logit_scale, 0)
        ws, nbytes = _workspace(N, V, dt, opts, key, dev)
        st = _fl.fl_cross_entropy_forward_cpu(
            loss.data_ptr(), lse.data_ptr(), logits.data_ptr(), target.data_ptr(), N, V, ld, dt,
            it, ctypes.byref(opts), _ptr(ws), nbytes)
        _check(st, "fl_cross_entropy_forward_cpu")
    return loss, lse


def backward_impl(grad_loss, logits, target, lse, weight, ignore_index, reduction,
                  label_smoothing, z_loss, softcap, logit_scale, grad_scale):
    """dlogits from the logits and the lse saved by forward (fl_cross_entropy_backward_*).

    grad_loss: fp32, (N,) for reduction none, else one element (the loss's gradient)."""
    N, V, ld, dt, it = _check_args("cross_entropy_backward", logits, target, weight, lse)
    dev = logits.device
    _check_grad_loss("cross_entropy_backward", grad_loss, N, reduction, dev)
    dlogits = _new_dlogits(logits, N, V, ld)
    if N == 0:
        return dlogits
    if dev.type == "cuda":
        opts, key = _options(ignore_index, reduction, label_smoothing, weight, z_loss, softcap,
                             logit_scale, _error_flag_ptr(dev))
        ws, nbytes = _workspace(N, V, dt, opts, key, dev)
        with _Device(dev) as stream:
            st = _fl.fl_cross_entropy_backward_cuda(
                dlogits.data_ptr(), logits.data_ptr(), target.data_ptr(), lse.data_ptr(),
                grad_loss.data_ptr(), grad_scale, N, V, ld, dt, it, ctypes.byref(opts), _ptr(ws),
                nbytes, stream)
        _check(st, "fl_cross_entropy_backward_cuda")
        if _debug:
            _debug_check(dev)
    else:
        opts, key = _options(ignore_index, reduction, label_smoothing, weight, z_loss, softcap,
                             logit_scale, 0)
        ws, nbytes = _workspace(N, V, dt, opts, key, dev)
        st = _fl.fl_cross_entropy_backward_cpu(
            dlogits.data_ptr(), logits.data_ptr(), target.data_ptr(), lse.data_ptr(),
            grad_loss.data_ptr(), grad_scale, N, V, ld, dt, it, ctypes.byref(opts), _ptr(ws),
            nbytes)
        _check(st, "fl_cross_entropy_backward_cpu")
    return dlogits


def fused_impl(dlogits, logits, target, weight, ignore_index, reduction, label_smoothing,
               z_loss, softcap, logit_scale, grad_loss, grad_scale, op="cross_entropy_fused"):
    """(loss, lse, dlogits) in one pass (fl_cross_entropy_fused_*); dlogits None: allocated,
    dlogits is logits: in place; grad_loss None means 1."""
    N, V, ld, dt, it = _check_args(op, logits, target, weight)
    dev = logits.device
    if grad_loss is not None:
        _check_grad_loss(op, grad_loss, N, reduction, dev)
    loss = torch.empty(_loss_shape(N, reduction), dtype=torch.float32, device=dev)
    lse = torch.empty((N,), dtype=torch.float32, device=dev)
    if dlogits is None:
        dlogits = _new_dlogits(logits, N, V, ld)
    if N == 0:
        return _empty_loss(loss, reduction), lse, dlogits
    if dev.type == "cuda":
        opts, key = _options(ignore_index, reduction, label_smoothing, weight, z_loss, softcap,
                             logit_scale, _error_flag_ptr(dev))
        ws, nbytes = _workspace(N, V, dt, opts, key, dev)
        with _Device(dev) as stream:
            st = _fl.fl_cross_entropy_fused_cuda(
                loss.data_ptr(), lse.data_ptr(), dlogits.data_ptr(), logits.data_ptr(),
                target.data_ptr(), _ptr(grad_loss), grad_scale, N, V, ld, dt, it,
                ctypes.byref(opts), _ptr(ws), nbytes, stream)
        _check(st, "fl_cross_entropy_fused_cuda")
        if _debug:
            _debug_check(dev)
    else:
        opts, key = _options(ignore_index, reduction, label_smoothing, weight, z_loss, softcap,
                             logit_scale, 0)
        ws, nbytes = _workspace(N, V, dt, opts, key, dev)
        st = _fl.fl_cross_entropy_fused_cpu(
            loss.data_ptr(), lse.data_ptr(), dlogits.data_ptr(), logits.data_ptr(),
            target.data_ptr(), _ptr(grad_loss), grad_scale, N, V, ld, dt, it,
            ctypes.byref(opts), _ptr(ws), nbytes)
        _check(st, "fl_cross_entropy_fused_cpu")
    return loss, lse, dlogits


# ---- the ops ----------------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::cross_entropy_forward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def cross_entropy_forward(logits: Tensor, target: Tensor, weight: Optional[Tensor],
                          ignore_index: int, reduction: int, label_smoothing: float,
                          z_loss: float, softcap: float, logit_scale: float
                          ) -> Tuple[Tensor, Tensor]:
    """Loss and per-row lse (fl_cross_entropy_forward_{cpu,cuda}); see the module docstring."""
    return forward_impl(logits, target, weight, ignore_index, reduction, label_smoothing,
                        z_loss, softcap, logit_scale)


@cross_entropy_forward.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap,
      logit_scale):
    torch._check(logits.dim() == 2, lambda: "fusedloss::cross_entropy_forward: logits must be 2-D")
    N = logits.shape[0]
    loss = logits.new_empty(_loss_shape(N, reduction), dtype=torch.float32)
    lse = logits.new_empty((N,), dtype=torch.float32)
    return loss, lse


# ---- backward -----------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::cross_entropy_backward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def cross_entropy_backward(grad_loss: Tensor, logits: Tensor, target: Tensor, lse: Tensor,
                           weight: Optional[Tensor], ignore_index: int, reduction: int,
                           label_smoothing: float, z_loss: float, softcap: float,
                           logit_scale: float, grad_scale: float) -> Tensor:
    """dlogits from the logits and the lse saved by forward (fl_cross_entropy_backward_*)."""
    return backward_impl(grad_loss, logits, target, lse, weight, ignore_index, reduction,
                         label_smoothing, z_loss, softcap, logit_scale, grad_scale)


def _fake_dlogits(logits):
    torch._check(logits.dim() == 2, lambda: "fusedloss: logits must be 2-D")
    N, V = logits.shape
    if logits.stride(0) == V or N <= 1:
        return logits.new_empty((N, V))
    return logits.new_empty_strided((N, V), (logits.stride(0), 1))


@cross_entropy_backward.register_fake
def _(grad_loss, logits, target, lse, weight, ignore_index, reduction, label_smoothing, z_loss,
      softcap, logit_scale, grad_scale):
    return _fake_dlogits(logits)


# ---- fused (forward + dlogits in one pass) --------------------------------------------------
@torch.library.custom_op("fusedloss::cross_entropy_fused", mutates_args=(),
                         device_types=("cpu", "cuda"))
def cross_entropy_fused(logits: Tensor, target: Tensor, weight: Optional[Tensor],
                        ignore_index: int, reduction: int, label_smoothing: float, z_loss: float,
                        softcap: float, logit_scale: float, grad_loss: Optional[Tensor],
                        grad_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    """(loss, lse, dlogits) in one pass (fl_cross_entropy_fused_*); grad_loss None means 1."""
    return fused_impl(None, logits, target, weight, ignore_index, reduction, label_smoothing,
                      z_loss, softcap, logit_scale, grad_loss, grad_scale)


@cross_entropy_fused.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap,
      logit_scale, grad_loss, grad_scale):
    N = logits.shape[0]
    return (logits.new_empty(_loss_shape(N, reduction), dtype=torch.float32),
            logits.new_empty((N,), dtype=torch.float32), _fake_dlogits(logits))


@torch.library.custom_op("fusedloss::cross_entropy_fused_inplace", mutates_args=("logits",),
                         device_types=("cpu", "cuda"))
def cross_entropy_fused_inplace(logits: Tensor, target: Tensor, weight: Optional[Tensor],
                                ignore_index: int, reduction: int, label_smoothing: float,
                                z_loss: float, softcap: float, logit_scale: float,
                                grad_loss: Optional[Tensor], grad_scale: float
                                ) -> Tuple[Tensor, Tensor]:
    """(loss, lse); dlogits overwrite the logits (dlogits == logits in the C call)."""
    loss, lse, _ = fused_impl(logits, logits, target, weight, ignore_index, reduction,
                              label_smoothing, z_loss, softcap, logit_scale, grad_loss,
                              grad_scale, "cross_entropy_fused_inplace")
    return loss, lse


@cross_entropy_fused_inplace.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap,
      logit_scale, grad_loss, grad_scale):
    N = logits.shape[0]
    return (logits.new_empty(_loss_shape(N, reduction), dtype=torch.float32),
            logits.new_empty((N,), dtype=torch.float32))
