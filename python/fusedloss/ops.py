"""fusedloss.ops — torch.library custom ops over the C entry points (layer 2, STYLE.md section 7).

Ops (namespace "fusedloss"; each has a CPU kernel calling fl_*_cpu, a CUDA kernel calling
fl_*_cuda on torch's current stream, and a fake kernel for torch.compile / meta tensors):

  cross_entropy_forward(logits, target, weight?, ignore_index, reduction, label_smoothing,
                        z_loss, softcap, logit_scale, offset?=None) -> (loss, lse)
  cross_entropy_backward(grad_loss, logits, target, lse, weight?, ..., grad_scale, offset?=None)
      -> dlogits
  cross_entropy_fused(logits, target, weight?, ..., grad_loss?, grad_scale, offset?=None)
      -> (loss, lse, dlogits)
  cross_entropy_fused_inplace(logits!, target, weight?, ..., grad_loss?, grad_scale, offset?=None)
      -> (loss, lse): the same, with dlogits written over the logits (mutates_args=("logits",))
      offset: fp32 (V,) per-class logit offset o (fl_ce_options.logit_offset), added after the
      softcap: the loss is F.cross_entropy(softcap(s x) + o, ...); no gradient flows to it.
  gelu_forward(x, bias?, approximate) -> y                      (fl_gelu_forward_*)
  gelu_backward(grad, x, bias?, approximate, compute_dbias) -> (dx, dbias)   (fl_gelu_backward_*)
      dbias is a (0,) tensor when not computed; x is any shape (..., F), bias (F,) of x's
      dtype or float32; approximate is the fl_gelu_approx number (0 none/erf, 1 tanh).
  linear_cross_entropy_fused(hidden, weight, bias?, target, class_weight?, <CE options>,
                             chunk_rows, byte_budget, wgrad_accum, wgrad_dtype, compute_dweight,
                             compute_dbias, grad_loss?, grad_scale, class_offset?=None)
      -> (loss, lse, dhidden, dweight, dbias)         mode 1: gradients in the forward
  linear_cross_entropy_forward(hidden, weight, bias?, target, class_weight?, <CE options>,
                               chunk_rows, byte_budget, wgrad_accum, class_offset?=None)
      -> (loss, lse)
  linear_cross_entropy_backward(grad_loss, hidden, weight, bias?, target, lse, class_weight?,
                                <CE options>, chunk_rows, byte_budget, wgrad_accum, wgrad_dtype,
                                compute_dweight, compute_dbias, grad_scale, class_offset?=None)
      -> (dhidden, dweight, dbias)                    mode 2: recompute from the saved lse
      class_offset: fp32 (V,) per-class logit offset, as the cross-entropy ops' offset
      (fl_linear_cross_entropy_*; see the notes at the linear cross-entropy section below)
  vp_ce_local_stats(logits, target, weight?, vocab_start, vocab_size, <CE options>, offset?=None)
      -> stats
  vp_ce_combine(gathered, target, weight?, vocab_size, <CE options>, offset?=None) -> (loss, lse)
  vp_ce_backward(grad_loss, logits, target, lse, weight?, vocab_start, vocab_size, <CE options>,
                 grad_scale, offset?=None) -> dlogits
      vocab-parallel cross-entropy, steps 1, 3, 4 on one rank (fl_vp_ce_*; CPU only until the
      C library has the CUDA steps; see the notes at the vocab-parallel section at the end);
      offset: fp32 (V,) the GLOBAL per-class logit offsets (every rank the whole array)

The ops are deliberately raw: logits are 2-D (N, V) with unit column stride and a row stride
ld = stride(0) >= V (the C API's layout); target is 1-D (N,) int32/int64; weight and offset are
contiguous fp32 (V,) on the logits' device;
reduction is the fl_reduction number (0 none, 1 mean, 2 sum); softcap 0 means off. Shape
handling, defaults, soft targets and autograd live in functional.py / autograd.py.
Outputs: loss fp32, (N,) for reduction none else 0-d; lse fp32 (N,); dlogits has the logits'
dtype, shape (N, V) and the logits' row stride. N == 0 is answered without a C call (sum 0,
mean NaN, as torch). The *_impl functions are the ops' bodies: argument checks, then run_forward /
run_backward / run_fused, which make the C call for a plan() (sizes, dtype codes, device, the
cached fl_ce_options of a CEConfig). The eager path of functional.py / autograd.py checks its
inputs itself and calls the run_* functions directly, skipping the dispatcher (whose Python
layers cost more host time than the whole call at small sizes).

Host cost per call (the eager path at small sizes is host-bound): no ctypes object is created
per call (pointers are passed as ints, the options struct is cached per distinct options), the
workspace size is cached per (N, V, dtype) and the workspace itself per (device, stream) (see
_cuda_workspace), and no device guard is entered when the tensors are on the current device.

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
           "cross_entropy_fused_inplace", "gelu_forward", "gelu_backward",
           "linear_cross_entropy_fused", "linear_cross_entropy_forward",
           "linear_cross_entropy_backward", "vp_ce_local_stats", "vp_ce_combine",
           "vp_ce_backward", "check_errors", "set_debug", "is_debug"]

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
# The C calls below go through the module attribute _fl (tests wrap it to record the calls) with
# plain ints for every pointer (argtypes are set once in _lib). Nothing here allocates a ctypes
# object per call: the fl_ce_options structs are built once per distinct options and kept.
try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # int handle, no Stream object
except AttributeError:  # pragma: no cover - older or CPU-only builds
    def _raw_stream(idx):
        return torch.cuda.current_stream(idx).cuda_stream
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or (lambda: False)


def raw_stream_of(dev):
    """The current stream's handle (an int) of CUDA device `dev` (its index, or the current device's)."""
    return _raw_stream(dev.index if dev.index is not None else _current_device())

_F32 = torch.float32
_U8 = torch.uint8
_CONTIGUOUS = torch.contiguous_format
_CPU = torch.device("cpu")
_cuda_devices = {}  # index -> torch.device("cuda", index)


def _cuda_device(idx):
    d = _cuda_devices.get(idx)
    if d is None:
        d = _cuda_devices[idx] = torch.device("cuda", idx)
    return d


class CEConfig:
    """One distinct (ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale), with
    the fl_ce_options structs built for it, one per (weight, error flag, logit offset) address
    triple.
    Get it from config(); functional.py also maps the user's raw keyword values to it, so that
    a repeated call validates nothing twice."""
    __slots__ = ("args", "reduction", "none", "_structs")

    def __init__(self, ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale):
        self.args = (ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
        self.reduction = reduction
        self.none = reduction == _NONE
        self._structs = {}

    def options(self, wptr, flag, optr=0):
        """(fl_ce_options, its address) for these weight / error-flag / logit-offset addresses
        (0 = NULL). Keep the tuple referenced while the address is in use (the cache may be
        cleared meanwhile)."""
        key = (wptr, flag, optr)
        s = self._structs.get(key)
        if s is None:
            if len(self._structs) >= 64:  # e.g. a new weight tensor at every call
                self._structs.clear()
            ii, red, ls, zl, cap, scale = self.args
            st = _lib.ce_options(ii, red, ls, wptr, zl, cap, scale, flag, optr)
            s = self._structs[key] = (st, ctypes.addressof(st))
        return s


_configs = {}


def config(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale):
    """The CEConfig of these (already converted) options; the C library validates the values."""
    key = (ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    c = _configs.get(key)
    if c is None:
        if len(_configs) >= 256:
            _configs.clear()
        c = _configs[key] = CEConfig(*key)
    return c


_flag_ptrs = {}  # device index -> address of that device's error flag


def flag_ptr(idx):
    """Address of cuda:idx's error flag (0 while capturing before any eager call created it)."""
    p = _flag_ptrs.get(idx)
    if p is None:
        p = _error_flag_ptr(_cuda_device(idx))
        if p:
            _flag_ptrs[idx] = p
    return p


def plan(N, V, ld, dt, it, idx, cfg, wptr, optr=0):
    """Everything a run_* call needs besides the tensors: (N, V, ld, fl dtype, fl index dtype,
    device index (-1 = CPU), (options struct, address), CEConfig, workspace bytes). wptr / optr:
    addresses of the fp32 class weights / logit offsets (0 = none); keep those tensors alive
    while the plan is used."""
    return (N, V, ld, dt, it, idx, cfg.options(wptr, flag_ptr(idx) if idx >= 0 else 0, optr), cfg,
            _ws_bytes(N, V, dt))


_ws_sizes = {}
_tls = threading.local()
_cuda_ws = {}  # (device index, raw stream) -> (uint8 tensor, address, bytes)
_CUDA_WS_CACHE_MAX = 8 << 20  # larger workspaces are allocated per call (cost negligible there)


def _ws_bytes(N, V, dt):
    k = (N, V, dt)
    n = _ws_sizes.get(k)
    if n is None:
        n = _lib.workspace_size(N, V, dt)  # depends only on (N, V, dtype)
        if len(_ws_sizes) >= 4096:
            _ws_sizes.clear()
        _ws_sizes[k] = n
    return n


def _cpu_workspace(nbytes):
    """(tensor, address, bytes): one growing buffer per thread (CPU calls are synchronous)."""
    ws = getattr(_tls, "ws", None)
    if ws is None or ws[2] < nbytes:
        buf = torch.empty(max(nbytes, 1 << 16), dtype=_U8, device=_CPU)
        ws = _tls.ws = (buf, buf.data_ptr(), buf.numel())
    return ws


def _cuda_workspace(idx, stream, nbytes):
    """(tensor, address, bytes) of >= nbytes on cuda:idx for one call on `stream` (the current
    device is idx). Kept per (device, stream): calls on one stream run in order, so a buffer
    per stream never has two users at once, whichever thread enqueues them. Not kept when the
    stream is being captured into a CUDA graph (a replay may run on any stream, concurrently
    with eager calls: the graph gets its own buffer from its private pool), nor above 8 MiB.
    A replaced or fresh buffer goes back to torch's caching allocator, which reuses a block
    only in its stream's order. Hold the tuple until the call is enqueued."""
    if nbytes > _CUDA_WS_CACHE_MAX or _capturing():
        buf = torch.empty(nbytes, dtype=_U8, device=_cuda_device(idx))
        return buf, buf.data_ptr(), nbytes
    key = (idx, stream)
    ws = _cuda_ws.get(key)
    if ws is None or ws[2] < nbytes:
        if ws is None and len(_cuda_ws) >= 256:
            _cuda_ws.clear()
        buf = torch.empty(max(nbytes, 1 << 16), dtype=_U8, device=_cuda_device(idx))
        ws = _cuda_ws[key] = (buf, buf.data_ptr(), buf.numel())
    return ws


def _check_vector(op, name, v, V, device):
    """A per-class fp32 (V,) input (weight, logit offset): dtype, shape, device, contiguity."""
    if v.dtype != torch.float32 or v.shape != (V,) or v.device != device:
        raise ValueError(f"fusedloss::{op}: {name} must be float32 of shape ({V},) on "
                         f"{device}, got {v.dtype} {tuple(v.shape)} on {v.device}")
    if V > 1 and v.stride(0) != 1:
        raise ValueError(f"fusedloss::{op}: {name} must be contiguous")


def _check_args(op, logits, target, weight=None, lse=None, offset=None):
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
        _check_vector(op, "weight", weight, V, logits.device)
    if offset is not None:
        _check_vector(op, "offset", offset, V, logits.device)
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
    """A gradient buffer with the logits' row stride (the C API uses one ld for both); on CUDA
    also with the logits' address modulo 16 bytes (the CUDA backend's rule for a separate
    dlogits: logits that are a view at an odd offset get a buffer at the same offset)."""
    mis = logits.data_ptr() & 15 if logits.is_cuda else 0
    if mis == 0 or N == 0:
        if ld == V:  # then the logits are contiguous
            return torch.empty_like(logits, memory_format=_CONTIGUOUS)
        return torch.empty_strided((N, V), (ld, 1), dtype=logits.dtype, device=logits.device)
    es = logits.element_size()
    base = torch.empty((N - 1) * ld + V + 16 // es, dtype=logits.dtype, device=logits.device)
    return base.as_strided((N, V), (ld, 1), mis // es)


def _device_index(t):
    dev = t.device
    if dev.type == "cpu":
        return -1
    return dev.index if dev.index is not None else torch.cuda.current_device()


# ---- the C calls (inputs already validated; called by the ops below and by autograd.py) ------
def run_forward(logits, target, p, with_lse=True):
    """fl_cross_entropy_forward_{cpu,cuda}: (loss, lse) for a plan() p; N >= 1. with_lse=False:
    no lse is computed (lse NULL in the C call; None returned), e.g. for a no-grad call."""
    N, V, ld, dt, it, idx, opts, cfg, nbytes = p
    if idx < 0:
        loss = torch.empty(size=(N,) if cfg.none else (), dtype=_F32, device=_CPU)
        lse = torch.empty(N, dtype=_F32, device=_CPU) if with_lse else None
        ws = _cpu_workspace(nbytes)
        st = _fl.fl_cross_entropy_forward_cpu(
            loss.data_ptr(), lse.data_ptr() if with_lse else None, logits.data_ptr(),
            target.data_ptr(), N, V, ld, dt, it, opts[1], ws[1], ws[2])
        if st:
            _check(st, "fl_cross_entropy_forward_cpu")
        return loss, lse
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_forward(logits, target, p, with_lse)
    dev = _cuda_device(idx)
    loss = torch.empty(size=(N,) if cfg.none else (), dtype=_F32, device=dev)
    lse = torch.empty(N, dtype=_F32, device=dev) if with_lse else None
    stream = _raw_stream(idx)
    ws = _cuda_workspace(idx, stream, nbytes)
    st = _fl.fl_cross_entropy_forward_cuda(
        loss.data_ptr(), lse.data_ptr() if with_lse else None, logits.data_ptr(),
        target.data_ptr(), N, V, ld, dt, it, opts[1], ws[1], ws[2], stream)
    if st:
        _check(st, "fl_cross_entropy_forward_cuda")
    if _debug:
        _debug_check(dev)
    return loss, lse


def run_backward(grad_loss, logits, target, lse, p, grad_scale=1.0):
    """fl_cross_entropy_backward_{cpu,cuda}: dlogits. grad_loss: fp32, contiguous (N,) for
    reduction none, else one element; N >= 1."""
    N, V, ld, dt, it, idx, opts, cfg, nbytes = p
    if idx < 0:
        dlogits = _new_dlogits(logits, N, V, ld)
        ws = _cpu_workspace(nbytes)
        st = _fl.fl_cross_entropy_backward_cpu(
            dlogits.data_ptr(), logits.data_ptr(), target.data_ptr(), lse.data_ptr(),
            grad_loss.data_ptr(), grad_scale, N, V, ld, dt, it, opts[1], ws[1], ws[2])
        if st:
            _check(st, "fl_cross_entropy_backward_cpu")
        return dlogits
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_backward(grad_loss, logits, target, lse, p, grad_scale)
    dlogits = _new_dlogits(logits, N, V, ld)
    stream = _raw_stream(idx)
    ws = _cuda_workspace(idx, stream, nbytes)
    st = _fl.fl_cross_entropy_backward_cuda(
        dlogits.data_ptr(), logits.data_ptr(), target.data_ptr(), lse.data_ptr(),
        grad_loss.data_ptr(), grad_scale, N, V, ld, dt, it, opts[1], ws[1], ws[2], stream)
    if st:
        _check(st, "fl_cross_entropy_backward_cuda")
    if _debug:
        _debug_check(_cuda_device(idx))
    return dlogits


def run_fused(dlogits, logits, target, grad_loss, grad_scale, p):
    """fl_cross_entropy_fused_{cpu,cuda}: (loss, lse, dlogits); dlogits None: allocated,
    dlogits is logits: in place; grad_loss None means 1; N >= 1."""
    N, V, ld, dt, it, idx, opts, cfg, nbytes = p
    if idx >= 0 and _current_device() != idx:
        with torch.cuda.device(idx):
            return run_fused(dlogits, logits, target, grad_loss, grad_scale, p)
    dev = _CPU if idx < 0 else _cuda_device(idx)
    loss = torch.empty(size=(N,) if cfg.none else (), dtype=_F32, device=dev)
    lse = torch.empty(N, dtype=_F32, device=dev)
    if dlogits is None:
        dlogits = _new_dlogits(logits, N, V, ld)
    gptr = grad_loss.data_ptr() if grad_loss is not None else None
    if idx < 0:
        ws = _cpu_workspace(nbytes)
        st = _fl.fl_cross_entropy_fused_cpu(
            loss.data_ptr(), lse.data_ptr(), dlogits.data_ptr(), logits.data_ptr(),
            target.data_ptr(), gptr, grad_scale, N, V, ld, dt, it, opts[1], ws[1], ws[2])
        if st:
            _check(st, "fl_cross_entropy_fused_cpu")
        return loss, lse, dlogits
    stream = _raw_stream(idx)
    ws = _cuda_workspace(idx, stream, nbytes)
    st = _fl.fl_cross_entropy_fused_cuda(
        loss.data_ptr(), lse.data_ptr(), dlogits.data_ptr(), logits.data_ptr(),
        target.data_ptr(), gptr, grad_scale, N, V, ld, dt, it, opts[1], ws[1], ws[2], stream)
    if st:
        _check(st, "fl_cross_entropy_fused_cuda")
    if _debug:
        _debug_check(dev)
    return loss, lse, dlogits


def run_scale_rows(x, g, per_row):
    """fl_scale_rows_{cpu,cuda}: x *= g (per row when per_row, else the one element of g) in
    place, on the device and without a host sync; rows whose factor is exactly 1 are not
    touched, so the common upstream gradient of 1 costs one tiny launch. x: 1-D or 2-D with a
    unit column stride (what the in-place fused forward wrote); returns x."""
    x2 = x if x.dim() == 2 else x.reshape(1, -1)
    N, V = x2.shape
    if N == 0 or V == 0:
        return x
    ld = x2.stride(0) if N > 1 else V
    g = g.reshape(-1)
    if g.dtype is not _F32:
        g = g.float()
    if not g.is_contiguous():
        g = g.contiguous()
    dt = _DTYPES[x.dtype]
    if x.device.type == "cpu":
        st = _fl.fl_scale_rows_cpu(x2.data_ptr(), N, V, ld, dt, g.data_ptr(), 1 if per_row else 0)
        if st:
            _check(st, "fl_scale_rows_cpu")
        return x
    idx = x.device.index
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_scale_rows(x, g, per_row)
    st = _fl.fl_scale_rows_cuda(x2.data_ptr(), N, V, ld, dt, g.data_ptr(), 1 if per_row else 0,
                                _raw_stream(idx))
    if st:
        _check(st, "fl_scale_rows_cuda")
    return x


# ---- implementations of the ops (checks, then the run_* above) --------------------------------
def _op_plan(logits, N, V, ld, dt, it, weight, ignore_index, reduction, label_smoothing,
             z_loss, softcap, logit_scale, offset=None):
    cfg = config(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    return plan(N, V, ld, dt, it, _device_index(logits), cfg,
                weight.data_ptr() if weight is not None else 0,
                offset.data_ptr() if offset is not None else 0)


def forward_impl(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                 softcap, logit_scale, offset=None):
    """Loss and per-row lse (fl_cross_entropy_forward_{cpu,cuda}); see the module docstring."""
    N, V, ld, dt, it = _check_args("cross_entropy_forward", logits, target, weight, None, offset)
    if N == 0:
        dev = logits.device
        loss = torch.empty(_loss_shape(N, reduction), dtype=torch.float32, device=dev)
        return _empty_loss(loss, reduction), torch.empty((0,), dtype=torch.float32, device=dev)
    return run_forward(logits, target,
                       _op_plan(logits, N, V, ld, dt, it, weight, ignore_index, reduction,
                                label_smoothing, z_loss, softcap, logit_scale, offset))


def backward_impl(grad_loss, logits, target, lse, weight, ignore_index, reduction,
                  label_smoothing, z_loss, softcap, logit_scale, grad_scale, offset=None):
    """dlogits from the logits and the lse saved by forward (fl_cross_entropy_backward_*).

    grad_loss: fp32, (N,) for reduction none, else one element (the loss's gradient)."""
    N, V, ld, dt, it = _check_args("cross_entropy_backward", logits, target, weight, lse, offset)
    _check_grad_loss("cross_entropy_backward", grad_loss, N, reduction, logits.device)
    if N == 0:
        return _new_dlogits(logits, N, V, ld)
    return run_backward(grad_loss, logits, target, lse,
                        _op_plan(logits, N, V, ld, dt, it, weight, ignore_index, reduction,
                                 label_smoothing, z_loss, softcap, logit_scale, offset), grad_scale)


def fused_impl(dlogits, logits, target, weight, ignore_index, reduction, label_smoothing,
               z_loss, softcap, logit_scale, grad_loss, grad_scale, op="cross_entropy_fused",
               offset=None):
    """(loss, lse, dlogits) in one pass (fl_cross_entropy_fused_*); dlogits None: allocated,
    dlogits is logits: in place; grad_loss None means 1."""
    N, V, ld, dt, it = _check_args(op, logits, target, weight, None, offset)
    if grad_loss is not None:
        _check_grad_loss(op, grad_loss, N, reduction, logits.device)
    if N == 0:
        dev = logits.device
        loss = torch.empty(_loss_shape(N, reduction), dtype=torch.float32, device=dev)
        if dlogits is None:
            dlogits = _new_dlogits(logits, N, V, ld)
        return (_empty_loss(loss, reduction), torch.empty((0,), dtype=torch.float32, device=dev),
                dlogits)
    return run_fused(dlogits, logits, target, grad_loss, grad_scale,
                     _op_plan(logits, N, V, ld, dt, it, weight, ignore_index, reduction,
                              label_smoothing, z_loss, softcap, logit_scale, offset))

# ---- the ops ----------------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::cross_entropy_forward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def cross_entropy_forward(logits: Tensor, target: Tensor, weight: Optional[Tensor],
                          ignore_index: int, reduction: int, label_smoothing: float,
                          z_loss: float, softcap: float, logit_scale: float,
                          offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Loss and per-row lse (fl_cross_entropy_forward_{cpu,cuda}); see the module docstring."""
    return forward_impl(logits, target, weight, ignore_index, reduction, label_smoothing,
                        z_loss, softcap, logit_scale, offset)


@cross_entropy_forward.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap,
      logit_scale, offset=None):
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
                           logit_scale: float, grad_scale: float,
                           offset: Optional[Tensor] = None) -> Tensor:
    """dlogits from the logits and the lse saved by forward (fl_cross_entropy_backward_*)."""
    return backward_impl(grad_loss, logits, target, lse, weight, ignore_index, reduction,
                         label_smoothing, z_loss, softcap, logit_scale, grad_scale, offset)


def _fake_dlogits(logits):
    torch._check(logits.dim() == 2, lambda: "fusedloss: logits must be 2-D")
    N, V = logits.shape
    if logits.stride(0) == V or N <= 1:
        return logits.new_empty((N, V))
    return logits.new_empty_strided((N, V), (logits.stride(0), 1))


@cross_entropy_backward.register_fake
def _(grad_loss, logits, target, lse, weight, ignore_index, reduction, label_smoothing, z_loss,
      softcap, logit_scale, grad_scale, offset=None):
    return _fake_dlogits(logits)


# ---- fused (forward + dlogits in one pass) --------------------------------------------------
@torch.library.custom_op("fusedloss::cross_entropy_fused", mutates_args=(),
                         device_types=("cpu", "cuda"))
def cross_entropy_fused(logits: Tensor, target: Tensor, weight: Optional[Tensor],
                        ignore_index: int, reduction: int, label_smoothing: float, z_loss: float,
                        softcap: float, logit_scale: float, grad_loss: Optional[Tensor],
                        grad_scale: float, offset: Optional[Tensor] = None
                        ) -> Tuple[Tensor, Tensor, Tensor]:
    """(loss, lse, dlogits) in one pass (fl_cross_entropy_fused_*); grad_loss None means 1."""
    return fused_impl(None, logits, target, weight, ignore_index, reduction, label_smoothing,
                      z_loss, softcap, logit_scale, grad_loss, grad_scale, offset=offset)


@cross_entropy_fused.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap,
      logit_scale, grad_loss, grad_scale, offset=None):
    N = logits.shape[0]
    return (logits.new_empty(_loss_shape(N, reduction), dtype=torch.float32),
            logits.new_empty((N,), dtype=torch.float32), _fake_dlogits(logits))


@torch.library.custom_op("fusedloss::cross_entropy_fused_inplace", mutates_args=("logits",),
                         device_types=("cpu", "cuda"))
def cross_entropy_fused_inplace(logits: Tensor, target: Tensor, weight: Optional[Tensor],
                                ignore_index: int, reduction: int, label_smoothing: float,
                                z_loss: float, softcap: float, logit_scale: float,
                                grad_loss: Optional[Tensor], grad_scale: float,
                                offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """(loss, lse); dlogits overwrite the logits (dlogits == logits in the C call)."""
    loss, lse, _ = fused_impl(logits, logits, target, weight, ignore_index, reduction,
                              label_smoothing, z_loss, softcap, logit_scale, grad_loss,
                              grad_scale, "cross_entropy_fused_inplace", offset)
    return loss, lse


@cross_entropy_fused_inplace.register_fake
def _(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap,
      logit_scale, grad_loss, grad_scale, offset=None):
    N = logits.shape[0]
    return (logits.new_empty(_loss_shape(N, reduction), dtype=torch.float32),
            logits.new_empty((N,), dtype=torch.float32))


# ---- GeLU (+ bias, + dbias) ---------------------------------------------------------------------
# x is seen as [N, F] rows (F = last dimension): a 2-D tensor with a unit column stride keeps its
# row stride (ld >= F, e.g. a column slice), anything else must be contiguous (else a copy is made).
# Outputs (y, dx) are fresh contiguous tensors of x's shape; dbias has the bias's dtype.
# The CUDA workspace (backward with dbias only) is one buffer per (device, stream) whose first
# 4096 bytes are zeroed once when it is created: the kernels leave their counters zero, so it is
# reused without clearing (the C API's rule). Under CUDA-graph capture a fresh buffer is taken
# from the graph's pool and its counter bytes are zeroed inside the graph (a 4 KiB memset node).
_GELU_COUNTER_BYTES = 4096
_gelu_ws_sizes = {}
_gelu_cuda_ws = {}  # (device index, raw stream) -> (uint8 tensor, address, bytes)


def _gelu_ws_bytes(N, F, dt):
    k = (N, F, dt)
    n = _gelu_ws_sizes.get(k)
    if n is None:
        n = _lib.gelu_workspace_size(N, F, dt)
        if len(_gelu_ws_sizes) >= 4096:
            _gelu_ws_sizes.clear()
        _gelu_ws_sizes[k] = n
    return n


def _gelu_cuda_workspace(idx, stream, nbytes):
    """(tensor, address, bytes) of >= nbytes on cuda:idx whose counter bytes are zero."""
    if _capturing():
        buf = torch.empty(max(nbytes, _GELU_COUNTER_BYTES), dtype=_U8, device=_cuda_device(idx))
        buf[:_GELU_COUNTER_BYTES].zero_()
        return buf, buf.data_ptr(), buf.numel()
    key = (idx, stream)
    ws = _gelu_cuda_ws.get(key)
    if ws is None or ws[2] < nbytes:
        if ws is None and len(_gelu_cuda_ws) >= 256:
            _gelu_cuda_ws.clear()
        buf = torch.empty(max(nbytes, 1 << 16), dtype=_U8, device=_cuda_device(idx))
        buf[:_GELU_COUNTER_BYTES].zero_()  # on this stream, before the kernel that uses it
        ws = _gelu_cuda_ws[key] = (buf, buf.data_ptr(), buf.numel())
    return ws


def _gelu_rows(t):
    """(t', N, F, ld): t as [N, F] rows with a unit column stride and row stride ld."""
    F = t.shape[-1]
    if t.dim() == 2:
        N = t.shape[0]
        if (F <= 1 or t.stride(1) == 1) and (N <= 1 or t.stride(0) >= F):
            return t, N, F, (t.stride(0) if N > 1 else F)
    if not t.is_contiguous():
        t = t.contiguous()
    return t, (t.numel() // F if F else 0), F, F


def gelu_check(op, x, bias, approximate, grad=None):
    """Python-side checks of the GeLU ops' arguments (the C library checks the rest)."""
    if x.dtype not in _DTYPES:
        raise TypeError(f"fusedloss::{op}: x dtype {x.dtype} not supported (float32, float16, bfloat16)")
    if x.dim() < 1:
        raise ValueError(f"fusedloss::{op}: x must have at least 1 dimension (..., F)")
    if approximate not in (_lib.FL_GELU_NONE, _lib.FL_GELU_TANH):
        raise ValueError(f"fusedloss::{op}: approximate must be 0 (none) or 1 (tanh), got {approximate!r}")
    if bias is not None:
        F = x.shape[-1]
        if bias.dim() != 1 or bias.shape[0] != F:
            raise ValueError(f"fusedloss::{op}: bias must have shape ({F},), got {tuple(bias.shape)}")
        if bias.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"fusedloss::{op}: bias dtype {bias.dtype} must be x's ({x.dtype}) or float32")
        if bias.device != x.device:
            raise ValueError(f"fusedloss::{op}: bias is on {bias.device}, x on {x.device}")
    if grad is not None:
        if grad.shape != x.shape or grad.dtype != x.dtype or grad.device != x.device:
            raise ValueError(f"fusedloss::{op}: grad must match x ({x.dtype} {tuple(x.shape)} on {x.device}), "
                             f"got {grad.dtype} {tuple(grad.shape)} on {grad.device}")


def run_gelu_forward(x, bias, approximate):
    """fl_gelu_forward_{cpu,cuda}: y = gelu(x + bias), a new contiguous tensor of x's shape
    (inputs already checked)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x2, N, F, ld = _gelu_rows(x)
    if N == 0 or F == 0:
        return y
    dt = _DTYPES[x.dtype]
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    bdt = _DTYPES[bias.dtype] if bias is not None else dt
    bptr = bias.data_ptr() if bias is not None else None
    if x.device.type == "cpu":
        st = _fl.fl_gelu_forward_cpu(y.data_ptr(), x2.data_ptr(), bptr, N, F, F, ld, dt, bdt, approximate)
        if st:
            _check(st, "fl_gelu_forward_cpu")
        return y
    idx = x.device.index
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_gelu_forward(x, bias, approximate)
    st = _fl.fl_gelu_forward_cuda(y.data_ptr(), x2.data_ptr(), bptr, N, F, F, ld, dt, bdt, approximate,
                                  _raw_stream(idx))
    if st:
        _check(st, "fl_gelu_forward_cuda")
    return y


def run_gelu_backward(grad, x, bias, approximate, compute_dbias):
    """fl_gelu_backward_{cpu,cuda}: (dx, dbias or None); dx a new contiguous tensor of x's shape,
    dbias (F,) of the bias's dtype (zeros when there are no rows)."""
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    want = compute_dbias and bias is not None
    dbias = torch.empty(bias.shape, dtype=bias.dtype, device=bias.device) if want else None
    x2, N, F, ld_x = _gelu_rows(x)
    if N == 0 or F == 0:
        if want:
            dbias.zero_()
        return dx, dbias
    g2, _, _, ld_g = _gelu_rows(grad)
    dt = _DTYPES[x.dtype]
    bdt = _DTYPES[bias.dtype] if bias is not None else dt
    bptr = bias.data_ptr() if bias is not None else None
    dbptr = dbias.data_ptr() if want else None
    if x.device.type == "cpu":
        ws = _cpu_workspace(_gelu_ws_bytes(N, F, dt)) if want else (None, None, 0)
        st = _fl.fl_gelu_backward_cpu(dx.data_ptr(), dbptr, g2.data_ptr(), x2.data_ptr(), bptr, N, F, F, ld_g,
                                      ld_x, dt, bdt, approximate, ws[1], ws[2])
        if st:
            _check(st, "fl_gelu_backward_cpu")
        return dx, dbias
    idx = x.device.index
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_gelu_backward(grad, x, bias, approximate, compute_dbias)
    stream = _raw_stream(idx)
    ws = _gelu_cuda_workspace(idx, stream, _gelu_ws_bytes(N, F, dt)) if want else (None, None, 0)
    st = _fl.fl_gelu_backward_cuda(dx.data_ptr(), dbptr, g2.data_ptr(), x2.data_ptr(), bptr, N, F, F, ld_g, ld_x,
                                   dt, bdt, approximate, ws[1], ws[2], stream)
    if st:
        _check(st, "fl_gelu_backward_cuda")
    return dx, dbias


@torch.library.custom_op("fusedloss::gelu_forward", mutates_args=(), device_types=("cpu", "cuda"))
def gelu_forward(x: Tensor, bias: Optional[Tensor], approximate: int) -> Tensor:
    """y = gelu(x + bias) (fl_gelu_forward_*); see the GeLU notes above."""
    gelu_check("gelu_forward", x, bias, approximate)
    return run_gelu_forward(x, bias, approximate)


@gelu_forward.register_fake
def _(x, bias, approximate):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("fusedloss::gelu_backward", mutates_args=(), device_types=("cpu", "cuda"))
def gelu_backward(grad: Tensor, x: Tensor, bias: Optional[Tensor], approximate: int,
                  compute_dbias: bool) -> Tuple[Tensor, Tensor]:
    """(dx, dbias) = (grad * gelu'(x + bias), its column sums) (fl_gelu_backward_*); dbias is a
    (0,) tensor of x's dtype when not computed (no bias or compute_dbias False)."""
    gelu_check("gelu_backward", x, bias, approximate, grad)
    dx, dbias = run_gelu_backward(grad, x, bias, approximate, compute_dbias)
    return dx, dbias if dbias is not None else x.new_empty((0,))


@gelu_backward.register_fake
def _(grad, x, bias, approximate, compute_dbias):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    if compute_dbias and bias is not None:
        return dx, torch.empty_like(bias, memory_format=torch.contiguous_format)
    return dx, x.new_empty((0,))


# ---- linear + cross-entropy (fl_linear_cross_entropy_*) -------------------------------------------
# logits = hidden . weight^T (+ bias), then the cross-entropy above, never holding the [N, V]
# logits (include/fusedloss.h section 6). Three raw ops:
#   linear_cross_entropy_fused     mode 1: loss, lse and the gradients for an upstream gradient
#                                  given up front (grad_loss / grad_scale; None = 1), one call
#   linear_cross_entropy_forward   mode 2, step 1: loss and lse only (1 GEMM)
#   linear_cross_entropy_backward  mode 2, step 2: the gradients from the saved lse (recomputes)
# Raw layout: hidden [N, H] and weight [V, H] with unit column stride and any row stride >= H,
# bias [V] (or None), all of ONE dtype (fp32 / fp16 / bf16: the caller casts, e.g. for autocast);
# target [N] int64/int32; class_weight and class_offset (the per-class logit offset, added after
# the softcap as the cross-entropy ops' offset) contiguous fp32 [V] or None; reduction, as above, the fl_reduction
# number; softcap 0 = off; chunk_rows 0 = from byte_budget; wgrad_accum the fl_lce_accum number.
# wgrad_dtype (the dtype of dweight and dbias) is the inputs' dtype or torch.float32 (fp32
# parameters under autocast: their gradient accumulated in fp32). Gradients that are not
# computed (compute_dweight / compute_dbias False, or no bias) come back as (0,) tensors of
# wgrad_dtype; dhidden is always computed (the C API needs it whenever dweight or dbias is).
# Outputs: loss fp32 (N,) for reduction none else 0-d; lse fp32 (N,); dhidden contiguous [N, H]
# of the inputs' dtype; dweight [V, H], dbias [V] of wgrad_dtype.
# fp32 inputs use TF32 tensor cores on CUDA when torch.get_float32_matmul_precision() is not
# "highest" (read at each call, as torch's own matmuls do).
#
# CUDA: one fl_lce_context per device, created on first use (keep the first call out of a CUDA
# graph capture, as for any warm-up), used under a lock (one host thread at a time, as the C API
# asks: the forward's thread and autograd's backward thread may differ) and destroyed at
# interpreter exit; the first call of each shape on a device (outside a graph capture) is
# preceded by a tuning call (fl_lce_context_set_tuning; synchronises once; FUSEDLOSS_LCE_TUNE=0
# turns it off); the workspace is a fresh torch.empty(uint8) per call from torch's caching
# allocator (stream-ordered reuse, the graph's private pool under capture), on torch's current
# stream. The CUDA backend needs 16-byte aligned
# matrices whose row strides are multiples of 16 bytes: misaligned inputs are copied, and an H
# whose rows are not a multiple of 16 bytes (H % 8 for fp16/bf16, H % 4 for fp32) is zero-padded
# to one (hidden and weight copied; the zero columns change no logit; the gradients are cut back
# to H), so any shape works, the odd ones at the cost of a copy.
import atexit as _atexit  # noqa: E402

_lce_contexts = {}      # device index -> (fl_lce_context* (int), threading.Lock)
_lce_tuned = set()      # the call shapes (_lce_tune_key) already tuned on their device's context
# FUSEDLOSS_LCE_TUNE=0: no tuning calls (cuBLASLt's heuristic first pick for every GEMM)
_lce_tune = os.environ.get("FUSEDLOSS_LCE_TUNE", "1").strip().lower() not in ("0", "false", "no", "off")
_lce_structs = {}       # (chunk_rows, byte_budget, wgrad_accum, allow_tf32) -> (LCEOptions, address, key)
_lce_ws_sizes = {}
_lce_create_lock = threading.Lock()


def _lce_context(idx):
    """(fl_lce_context*, lock) of cuda:idx (the current device), created on first use. The C
    API allows one host thread at a time per context: calls hold the lock (they only enqueue
    work, so it is held for microseconds); autograd runs backward on its own thread per device."""
    c = _lce_contexts.get(idx)
    if c is None:
        with _lce_create_lock:
            c = _lce_contexts.get(idx)
            if c is None:
                c = _lce_contexts[idx] = (_lib.lce_context_create(), threading.Lock())
    return c


@_atexit.register
def _destroy_lce_contexts():
    while _lce_contexts:
        idx, (c, _) = _lce_contexts.popitem()
        try:  # the work using the context must be done before it is destroyed
            torch.cuda.synchronize(idx)
        except Exception:  # pragma: no cover - a broken CUDA context at exit
            pass
        _lib.lce_context_destroy(c)


def _lce_struct(chunk_rows, byte_budget, wgrad_accum, allow_tf32):
    key = (chunk_rows, byte_budget, wgrad_accum, allow_tf32)
    s = _lce_structs.get(key)
    if s is None:
        if len(_lce_structs) >= 64:
            _lce_structs.clear()
        st = _lib.lce_options(chunk_rows, byte_budget, wgrad_accum, allow_tf32)
        s = _lce_structs[key] = (st, ctypes.addressof(st), key)
    return s


def _lce_ws_bytes(N, H, V, dt, wdt, cfg, ce_addr, has_weight, lce, has_offset=False):
    """fl_linear_cross_entropy_workspace_size, cached per distinct arguments."""
    key = (N, H, V, dt, wdt, cfg.args, has_weight, has_offset, lce[2])
    n = _lce_ws_sizes.get(key)
    if n is None:
        n = _lib.lce_workspace_size(N, H, V, dt, wdt, ce_addr, lce[1])
        if len(_lce_ws_sizes) >= 4096:
            _lce_ws_sizes.clear()
        _lce_ws_sizes[key] = n
    return n


def _lce_rows_ok(op, name, t, cols):
    """(ld) of a 2-D [rows, cols] matrix with unit column stride and row stride >= cols."""
    if t.dim() != 2 or t.shape[1] != cols:
        raise ValueError(f"fusedloss::{op}: {name} must be 2-D (*, {cols}), got shape {tuple(t.shape)}")
    rows = t.shape[0]
    if cols > 1 and t.stride(1) != 1:
        raise ValueError(f"fusedloss::{op}: {name} must have unit column stride, got strides {t.stride()}")
    ld = t.stride(0) if rows > 1 else cols
    if ld < cols:
        raise ValueError(f"fusedloss::{op}: {name} row stride {ld} < H ({cols})")
    return ld


def lce_check_args(op, hidden, weight, bias, target, class_weight, wgrad_dtype, lse=None,
                   class_offset=None):
    """Validate the raw linear-CE op's inputs; returns (N, H, V, fl dtype, fl wgrad dtype, fl
    index dtype)."""
    if hidden.dim() != 2:
        raise ValueError(f"fusedloss::{op}: hidden must be 2-D (N, H), got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"fusedloss::{op}: weight must be 2-D (V, H), got shape {tuple(weight.shape)}")
    dt = _DTYPES.get(hidden.dtype)
    if dt is None:
        raise TypeError(f"fusedloss::{op}: hidden dtype {hidden.dtype} not supported "
                        "(float32, float16, bfloat16)")
    N, H = hidden.shape
    V = weight.shape[0]
    if H < 1 or V < 1:
        raise ValueError(f"fusedloss::{op}: need H >= 1 and V >= 1, got hidden {tuple(hidden.shape)}, "
                         f"weight {tuple(weight.shape)}")
    dev = hidden.device
    if weight.dtype != hidden.dtype or weight.device != dev:
        raise ValueError(f"fusedloss::{op}: weight must be {hidden.dtype} on {dev} like hidden, got "
                         f"{weight.dtype} on {weight.device}")
    _lce_rows_ok(op, "hidden", hidden, H)
    _lce_rows_ok(op, "weight", weight, H)
    if bias is not None:
        if bias.dtype != hidden.dtype or bias.shape != (V,) or bias.device != dev:
            raise ValueError(f"fusedloss::{op}: bias must be {hidden.dtype} of shape ({V},) on {dev}, "
                             f"got {bias.dtype} {tuple(bias.shape)} on {bias.device}")
        if V > 1 and bias.stride(0) != 1:
            raise ValueError(f"fusedloss::{op}: bias must be contiguous")
    it = _INDEX_DTYPES.get(target.dtype)
    if it is None:
        raise TypeError(f"fusedloss::{op}: target dtype {target.dtype} not supported (int64, int32)")
    if target.dim() != 1 or target.shape[0] != N:
        raise ValueError(f"fusedloss::{op}: target must have shape ({N},), got {tuple(target.shape)}")
    if target.device != dev:
        raise ValueError(f"fusedloss::{op}: target is on {target.device}, hidden on {dev}")
    if N > 1 and target.stride(0) != 1:
        raise ValueError(f"fusedloss::{op}: target must be contiguous")
    if class_weight is not None:
        if (class_weight.dtype != torch.float32 or class_weight.shape != (V,)
                or class_weight.device != dev):
            raise ValueError(f"fusedloss::{op}: class_weight must be float32 of shape ({V},) on {dev}, "
                             f"got {class_weight.dtype} {tuple(class_weight.shape)} on {class_weight.device}")
        if V > 1 and class_weight.stride(0) != 1:
            raise ValueError(f"fusedloss::{op}: class_weight must be contiguous")
    if class_offset is not None:
        _check_vector(op, "class_offset", class_offset, V, dev)
    if wgrad_dtype != hidden.dtype and wgrad_dtype != torch.float32:
        raise TypeError(f"fusedloss::{op}: wgrad_dtype must be hidden's dtype ({hidden.dtype}) or "
                        f"torch.float32, got {wgrad_dtype}")
    if lse is not None:
        if lse.dtype != torch.float32 or lse.shape != (N,) or lse.device != dev:
            raise ValueError(f"fusedloss::{op}: lse must be float32 of shape ({N},) on {dev}")
        if N > 1 and lse.stride(0) != 1:
            raise ValueError(f"fusedloss::{op}: lse must be contiguous")
    return N, H, V, dt, _DTYPES[wgrad_dtype], it


def _aligned(t):
    return (t.data_ptr() & 15) == 0


def _lce_cuda_layout(hidden, weight, bias, H):
    """(hidden, weight, bias, Hp) meeting the CUDA backend's layout rules (see the notes above):
    16-byte aligned matrices whose row strides are multiples of 16 bytes."""
    q = 16 // hidden.element_size()  # elements per 16 bytes
    Hp = -(-H // q) * q
    if Hp != H:
        hidden = torch.nn.functional.pad(hidden, (0, Hp - H))
        weight = torch.nn.functional.pad(weight, (0, Hp - H))
    else:
        if not _aligned(hidden) or (hidden.shape[0] > 1 and hidden.stride(0) % q):
            hidden = hidden.clone(memory_format=_CONTIGUOUS)
        if not _aligned(weight) or (weight.shape[0] > 1 and weight.stride(0) % q):
            weight = weight.clone(memory_format=_CONTIGUOUS)
    if bias is not None and not _aligned(bias):
        bias = bias.clone(memory_format=_CONTIGUOUS)
    return hidden, weight, bias, Hp


def _lce_empty_results(hidden, weight, bias, reduction, wgrad_dtype, grads):
    """N == 0 without a C call: loss as torch (sum 0, mean NaN, none empty), zero gradients."""
    dev = hidden.device
    loss = _empty_loss(torch.empty(_loss_shape(0, reduction), dtype=_F32, device=dev), reduction)
    lse = torch.empty((0,), dtype=_F32, device=dev)
    if grads is None:
        return loss, lse, None, None, None
    need_w, need_b = grads
    dh = torch.empty((0, hidden.shape[1]), dtype=hidden.dtype, device=dev)
    dw = torch.zeros(weight.shape, dtype=wgrad_dtype, device=dev) if need_w else None
    db = torch.zeros(bias.shape, dtype=wgrad_dtype, device=dev) if need_b else None
    return loss, lse, dh, dw, db


def run_lce(hidden, weight, bias, target, class_weight, cfg, lce_args, wgrad_dtype, *,
            grads=None, want_lse=True, lse=None, grad_loss=None, grad_scale=1.0, class_offset=None):
    """The C calls of linear cross-entropy (inputs already validated by lce_check_args).

    Forward (lse is None): grads None -> loss-only (mode 2 step 1); grads (need_dweight,
    need_dbias) -> loss and gradients (mode 1) for grad_loss (None = 1) * grad_scale.
    Backward (lse given, grads given): the gradients from the saved lse (mode 2 step 2).
    lce_args: (chunk_rows, byte_budget, wgrad_accum). Returns (loss, lse, dhidden, dweight,
    dbias) with None for what was not computed (loss/lse None in backward). class_offset: the fp32
    [V] logit offset (fl_ce_options.logit_offset) or None."""
    backward = lse is not None
    N, H = hidden.shape
    V = weight.shape[0]
    need_w, need_b = grads if grads is not None else (False, False)
    need_b = need_b and bias is not None
    if N == 0:
        loss, lse0, dh, dw, db = _lce_empty_results(hidden, weight, bias, cfg.reduction,
                                                    wgrad_dtype, None if grads is None else (need_w, need_b))
        return (None, None, dh, dw, db) if backward else (loss, lse0 if want_lse else None, dh, dw, db)
    dt = _DTYPES[hidden.dtype]
    it = _INDEX_DTYPES[target.dtype]
    dev = hidden.device
    if dev.type == "cpu":
        idx = -1
    else:
        idx = dev.index if dev.index is not None else _current_device()
        if _current_device() != idx:
            with torch.cuda.device(idx):
                return run_lce(hidden, weight, bias, target, class_weight, cfg, lce_args,
                               wgrad_dtype, grads=grads, want_lse=want_lse, lse=lse,
                               grad_loss=grad_loss, grad_scale=grad_scale,
                               class_offset=class_offset)
    # a loss-only forward has no weight gradient: with wgrad_dtype fp32 the plan reserves no
    # fp32 accumulator, so its workspace (and with a byte budget, its chunking) is the leanest
    wdt = _DTYPES[wgrad_dtype] if grads is not None else _lib.FL_DTYPE_F32
    Hp = H
    h, w, b = hidden, weight, bias
    if idx >= 0:
        h, w, b, Hp = _lce_cuda_layout(hidden, weight, bias, H)
    ldh = h.stride(0) if N > 1 else Hp
    ldw = w.stride(0) if V > 1 else Hp
    allow_tf32 = idx >= 0 and dt == _lib.FL_DTYPE_F32 and \
        torch.get_float32_matmul_precision() != "highest"
    lce = _lce_struct(lce_args[0], lce_args[1], lce_args[2], allow_tf32)
    wptr = class_weight.data_ptr() if class_weight is not None else 0
    optr = class_offset.data_ptr() if class_offset is not None else 0
    ce = cfg.options(wptr, flag_ptr(idx) if idx >= 0 else 0, optr)
    nbytes = _lce_ws_bytes(N, Hp, V, dt, wdt, cfg, ce[1], wptr != 0, lce, optr != 0)
    ws = torch.empty(nbytes, dtype=_U8, device=dev)
    wdtype = _F32 if wdt == _lib.FL_DTYPE_F32 else hidden.dtype
    loss = None if backward else torch.empty(_loss_shape(N, cfg.reduction), dtype=_F32, device=dev)
    lse_out = None if backward or not want_lse else torch.empty(N, dtype=_F32, device=dev)
    dh = torch.empty((N, Hp), dtype=hidden.dtype, device=dev) if grads is not None else None
    dw = torch.empty((V, Hp), dtype=wdtype, device=dev) if need_w else None
    db = torch.empty((V,), dtype=wdtype, device=dev) if need_b else None
    ptr = _ptr
    gptr = ptr(grad_loss)
    if backward:
        args = (ptr(dh), ptr(dw), ptr(db), h.data_ptr(), ldh, w.data_ptr(), ldw, ptr(b),
                target.data_ptr(), lse.data_ptr(), gptr, grad_scale, N, Hp, V, dt, wdt, it,
                ce[1], lce[1], ws.data_ptr(), nbytes)
        name = "fl_linear_cross_entropy_backward_"
    else:
        args = (loss.data_ptr(), ptr(lse_out), ptr(dh), ptr(dw), ptr(db), h.data_ptr(), ldh,
                w.data_ptr(), ldw, ptr(b), target.data_ptr(), gptr, grad_scale, N, Hp, V, dt, wdt,
                it, ce[1], lce[1], ws.data_ptr(), nbytes)
        name = "fl_linear_cross_entropy_forward_"
    if idx < 0:
        fn = name + "cpu"
        st = getattr(_fl, fn)(*args)
    else:
        fn = name + "cuda"
        ctx, lock = _lce_context(idx)
        stream = _raw_stream(idx)
        with lock:
            # the first call of a shape on a device (outside a CUDA graph capture) is preceded by a
            # tuning call into the same outputs (fl_lce_context_set_tuning: it synchronises once
            # and picks each chunk GEMM's fastest cuBLASLt algorithm when it beats the heuristic's
            # first pick by >= 3%: 3-10% off the step at GPT-2's and Gemma's vocabularies on the
            # H200); the real call then overwrites every output
            tkey = (idx, fn, N, Hp, V, dt, wdt, it, ldh, ldw, b is not None, need_w, need_b, lce[2],
                    cfg.args)
            if _lce_tune and tkey not in _lce_tuned and not torch.cuda.is_current_stream_capturing():
                _lib.lce_context_set_tuning(ctx, True)
                try:
                    st = getattr(_fl, fn)(ctx, *args, stream)
                finally:
                    _lib.lce_context_set_tuning(ctx, False)
                if st:
                    _check(st, fn)
                if len(_lce_tuned) >= 4096:
                    _lce_tuned.clear()
                _lce_tuned.add(tkey)
            st = getattr(_fl, fn)(ctx, *args, stream)
    if st:
        _check(st, fn)
    if idx >= 0 and _debug:
        _debug_check(dev)
    del ws  # back to the caching allocator, reused in this stream's order
    if Hp != H:
        dh = dh[:, :H].contiguous() if dh is not None else None
        dw = dw[:, :H].contiguous() if dw is not None else None
    return loss, lse_out, dh, dw, db


def _ptr(t):
    return t.data_ptr() if t is not None else None


def _or_empty(t, like, dtype):
    # a gradient not computed: a (0,) tensor (a fresh one each: op outputs may not alias)
    return t if t is not None else like.new_empty((0,), dtype=dtype)


def _lce_cfg(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale):
    if reduction not in (_lib.FL_REDUCTION_NONE, _lib.FL_REDUCTION_MEAN, _lib.FL_REDUCTION_SUM):
        raise ValueError(f"fusedloss: reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction!r}")
    return config(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)


def lce_fused_impl(hidden, weight, bias, target, class_weight, ignore_index, reduction,
                   label_smoothing, z_loss, softcap, logit_scale, chunk_rows, byte_budget,
                   wgrad_accum, wgrad_dtype, compute_dweight, compute_dbias, grad_loss, grad_scale,
                   class_offset=None):
    """Mode 1: (loss, lse, dhidden, dweight, dbias) with (0,) tensors for gradients not computed."""
    op = "linear_cross_entropy_fused"
    N = lce_check_args(op, hidden, weight, bias, target, class_weight, wgrad_dtype, None,
                       class_offset)[0]
    cfg = _lce_cfg(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    if grad_loss is not None:
        _check_grad_loss(op, grad_loss, N, reduction, hidden.device)
    loss, lse, dh, dw, db = run_lce(hidden, weight, bias, target, class_weight, cfg,
                                    (chunk_rows, byte_budget, wgrad_accum), wgrad_dtype,
                                    grads=(compute_dweight, compute_dbias), grad_loss=grad_loss,
                                    grad_scale=grad_scale, class_offset=class_offset)
    return loss, lse, dh, _or_empty(dw, hidden, wgrad_dtype), _or_empty(db, hidden, wgrad_dtype)


def lce_forward_impl(hidden, weight, bias, target, class_weight, ignore_index, reduction,
                     label_smoothing, z_loss, softcap, logit_scale, chunk_rows, byte_budget,
                     wgrad_accum, class_offset=None, want_lse=True):
    """Mode 2, step 1: (loss, lse) (lse None when want_lse is False)."""
    lce_check_args("linear_cross_entropy_forward", hidden, weight, bias, target, class_weight,
                   hidden.dtype, None, class_offset)
    cfg = _lce_cfg(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    loss, lse, _, _, _ = run_lce(hidden, weight, bias, target, class_weight, cfg,
                                 (chunk_rows, byte_budget, wgrad_accum), hidden.dtype,
                                 want_lse=want_lse, class_offset=class_offset)
    return loss, lse


def lce_backward_impl(grad_loss, hidden, weight, bias, target, lse, class_weight, ignore_index,
                      reduction, label_smoothing, z_loss, softcap, logit_scale, chunk_rows,
                      byte_budget, wgrad_accum, wgrad_dtype, compute_dweight, compute_dbias,
                      grad_scale, class_offset=None):
    """Mode 2, step 2: (dhidden, dweight, dbias) with (0,) tensors for gradients not computed."""
    op = "linear_cross_entropy_backward"
    N = lce_check_args(op, hidden, weight, bias, target, class_weight, wgrad_dtype, lse,
                       class_offset)[0]
    cfg = _lce_cfg(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    _check_grad_loss(op, grad_loss, N, reduction, hidden.device)
    _, _, dh, dw, db = run_lce(hidden, weight, bias, target, class_weight, cfg,
                               (chunk_rows, byte_budget, wgrad_accum), wgrad_dtype,
                               grads=(compute_dweight, compute_dbias), lse=lse,
                               grad_loss=grad_loss, grad_scale=grad_scale, class_offset=class_offset)
    return dh, _or_empty(dw, hidden, wgrad_dtype), _or_empty(db, hidden, wgrad_dtype)


@torch.library.custom_op("fusedloss::linear_cross_entropy_fused", mutates_args=(),
                         device_types=("cpu", "cuda"))
def linear_cross_entropy_fused(hidden: Tensor, weight: Tensor, bias: Optional[Tensor],
                               target: Tensor, class_weight: Optional[Tensor], ignore_index: int,
                               reduction: int, label_smoothing: float, z_loss: float,
                               softcap: float, logit_scale: float, chunk_rows: int,
                               byte_budget: int, wgrad_accum: int, wgrad_dtype: torch.dtype,
                               compute_dweight: bool, compute_dbias: bool,
                               grad_loss: Optional[Tensor], grad_scale: float,
                               class_offset: Optional[Tensor] = None
                               ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Mode 1 (fl_linear_cross_entropy_forward_* with gradients): (loss, lse, dhidden, dweight,
    dbias); see the linear cross-entropy notes above."""
    return lce_fused_impl(hidden, weight, bias, target, class_weight, ignore_index, reduction,
                          label_smoothing, z_loss, softcap, logit_scale, chunk_rows, byte_budget,
                          wgrad_accum, wgrad_dtype, compute_dweight, compute_dbias, grad_loss,
                          grad_scale, class_offset)


def _fake_lce_grads(hidden, weight, bias, wgrad_dtype, compute_dweight, compute_dbias):
    torch._check(hidden.dim() == 2 and weight.dim() == 2,
                 lambda: "fusedloss: hidden and weight must be 2-D")
    dh = hidden.new_empty(hidden.shape)
    dw = hidden.new_empty(weight.shape, dtype=wgrad_dtype) if compute_dweight else \
        hidden.new_empty((0,), dtype=wgrad_dtype)
    db = hidden.new_empty((weight.shape[0],), dtype=wgrad_dtype) \
        if (compute_dbias and bias is not None) else hidden.new_empty((0,), dtype=wgrad_dtype)
    return dh, dw, db


@linear_cross_entropy_fused.register_fake
def _(hidden, weight, bias, target, class_weight, ignore_index, reduction, label_smoothing,
      z_loss, softcap, logit_scale, chunk_rows, byte_budget, wgrad_accum, wgrad_dtype,
      compute_dweight, compute_dbias, grad_loss, grad_scale, class_offset=None):
    N = hidden.shape[0]
    loss = hidden.new_empty(_loss_shape(N, reduction), dtype=torch.float32)
    lse = hidden.new_empty((N,), dtype=torch.float32)
    return (loss, lse) + _fake_lce_grads(hidden, weight, bias, wgrad_dtype, compute_dweight,
                                         compute_dbias)


@torch.library.custom_op("fusedloss::linear_cross_entropy_forward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def linear_cross_entropy_forward(hidden: Tensor, weight: Tensor, bias: Optional[Tensor],
                                 target: Tensor, class_weight: Optional[Tensor],
                                 ignore_index: int, reduction: int, label_smoothing: float,
                                 z_loss: float, softcap: float, logit_scale: float,
                                 chunk_rows: int, byte_budget: int, wgrad_accum: int,
                                 class_offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Mode 2, step 1 (fl_linear_cross_entropy_forward_* without gradients): (loss, lse)."""
    return lce_forward_impl(hidden, weight, bias, target, class_weight, ignore_index, reduction,
                            label_smoothing, z_loss, softcap, logit_scale, chunk_rows,
                            byte_budget, wgrad_accum, class_offset)


@linear_cross_entropy_forward.register_fake
def _(hidden, weight, bias, target, class_weight, ignore_index, reduction, label_smoothing,
      z_loss, softcap, logit_scale, chunk_rows, byte_budget, wgrad_accum, class_offset=None):
    torch._check(hidden.dim() == 2, lambda: "fusedloss: hidden must be 2-D")
    N = hidden.shape[0]
    return (hidden.new_empty(_loss_shape(N, reduction), dtype=torch.float32),
            hidden.new_empty((N,), dtype=torch.float32))


@torch.library.custom_op("fusedloss::linear_cross_entropy_backward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def linear_cross_entropy_backward(grad_loss: Tensor, hidden: Tensor, weight: Tensor,
                                  bias: Optional[Tensor], target: Tensor, lse: Tensor,
                                  class_weight: Optional[Tensor], ignore_index: int,
                                  reduction: int, label_smoothing: float, z_loss: float,
                                  softcap: float, logit_scale: float, chunk_rows: int,
                                  byte_budget: int, wgrad_accum: int, wgrad_dtype: torch.dtype,
                                  compute_dweight: bool, compute_dbias: bool, grad_scale: float,
                                  class_offset: Optional[Tensor] = None
                                  ) -> Tuple[Tensor, Tensor, Tensor]:
    """Mode 2, step 2 (fl_linear_cross_entropy_backward_*): (dhidden, dweight, dbias) from the
    lse of linear_cross_entropy_forward; grad_loss fp32, (N,) for reduction none else 1 element."""
    return lce_backward_impl(grad_loss, hidden, weight, bias, target, lse, class_weight,
                             ignore_index, reduction, label_smoothing, z_loss, softcap,
                             logit_scale, chunk_rows, byte_budget, wgrad_accum, wgrad_dtype,
                             compute_dweight, compute_dbias, grad_scale, class_offset)


@linear_cross_entropy_backward.register_fake
def _(grad_loss, hidden, weight, bias, target, lse, class_weight, ignore_index, reduction,
      label_smoothing, z_loss, softcap, logit_scale, chunk_rows, byte_budget, wgrad_accum,
      wgrad_dtype, compute_dweight, compute_dbias, grad_scale, class_offset=None):
    return _fake_lce_grads(hidden, weight, bias, wgrad_dtype, compute_dweight, compute_dbias)


# ---- vocab-parallel cross-entropy (fl_vp_ce_*, include/fusedloss.h section 8) -------------------
# The logits' vocabulary is sharded over k ranks (Megatron-style lm head); three raw ops are the C
# API's steps 1, 3 and 4 on one rank. Step 2, the all-gather of every rank's stats IN RANK ORDER,
# belongs to the caller's engine: fusedloss.vocab_parallel_cross_entropy runs it with
# torch.distributed (functional.py).
#   vp_ce_local_stats(logits, target, weight?, vocab_start, vocab_size, <CE options>, offset?)
#       -> stats
#   vp_ce_combine(gathered, target, weight?, vocab_size, <CE options>, offset?) -> (loss, lse)
#   vp_ce_backward(grad_loss, logits, target, lse, weight?, vocab_start, vocab_size,
#                  <CE options>, grad_scale, offset?) -> dlogits
# <CE options> = ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale, as the
# cross-entropy ops (the same values on every step and every rank). Raw layout as those ops:
# logits is this rank's shard [N, V_local] (unit column stride, row stride ld >= V_local) holding
# the GLOBAL classes vocab_start .. vocab_start + V_local - 1 of vocab_size (V); target (N,)
# GLOBAL class ids, the same on every rank; weight fp32 (V,): the GLOBAL class weights (every
# rank passes the whole array), or None; offset fp32 (V,): the GLOBAL per-class logit offsets
# (fl_ce_options.logit_offset, added after softcap; every rank passes the whole array; steps 1 and
# 4 read it, step 3 accepts it), or None; pass the same offset (or None) to every step.
# stats: fp32 [N, 4] contiguous, (max z, sum exp(z - max), sum w z, z_target or 0) over the
# shard ((-inf, 0, 0, 0) on ignored rows); gathered: fp32 [k, N, 4] contiguous, the k ranks'
# stats in rank order; loss fp32 (N,) for reduction none else 0-d; lse fp32 (N,), the global
# log-sum-exp (0 on ignored rows; what backward needs, so backward needs no collective); dlogits
# as cross_entropy_backward's, for this shard's columns only.
# N == 0: answered without a C call (as the cross-entropy ops).
# Workspaces: section 8's "section-5 workspace of its call": fl_cross_entropy_workspace_size with
# (N, V_local, logits dtype) for steps 1 and 4; for step 3 with (N, V) and any dtype (it reads no
# logits): the 16-bit answer, the smallest, is asked for.
# CUDA: the C library has no CUDA steps yet (issue 9). The CUDA path below is written like the
# cross-entropy ops' (torch's current stream, the per-stream workspace, the device error flag) and
# calls the fl_vp_ce_*_cuda symbols that _lib binds when the library has them (_lib._OPTIONAL):
# while it lacks them, any call on CUDA tensors (also N == 0) raises NotBuiltError (a
# FusedLossError and NotImplementedError) naming them; nothing falls back to another
# implementation. Once the C steps exist, nothing here needs to change.
_VP_CUDA_SYMBOLS = ("fl_vp_ce_local_stats_cuda", "fl_vp_ce_combine_cuda", "fl_vp_ce_backward_cuda")


def vp_cuda_missing():
    """Names of the CUDA vocab-parallel entry points the loaded library lacks (() when all exist;
    a CPU-only build that has them answers FL_ERR_NOT_BUILT at the call, as every CUDA entry)."""
    return tuple(n for n in _VP_CUDA_SYMBOLS if _lib.optional_symbol(n) is None)


def vp_cuda_not_built_error(what="vocab-parallel cross-entropy"):
    """The NotBuiltError raised for CUDA tensors while vp_cuda_missing() is not empty."""
    return _lib.NotBuiltError(
        f"fusedloss: {what} on CUDA tensors is not available: the CUDA vocab-parallel steps "
        f"({', '.join(vp_cuda_missing())}) are not built yet in {_lib.library_path} (issue 9; "
        "include/fusedloss.h section 8 declares only the CPU steps so far). Use CPU tensors, or "
        "fusedloss.cross_entropy on the full (gathered) logits.", _lib.FL_ERR_NOT_BUILT)


def _vp_cuda_fn(name):
    fn = _lib.optional_symbol(name)
    if fn is None:
        raise vp_cuda_not_built_error()
    return fn


def _vp_check_cuda(t):
    """Any CUDA call (also N == 0, answered without a C call) raises while the steps are missing."""
    if t.device.type == "cuda" and vp_cuda_missing():
        raise vp_cuda_not_built_error()


def _vp_check_vocab(op, vocab_start, V_local, vocab_size):
    if vocab_start < 0 or vocab_start + V_local > vocab_size:
        raise ValueError(f"fusedloss::{op}: the shard [vocab_start, vocab_start + V_local) = "
                         f"[{vocab_start}, {vocab_start + V_local}) is not inside [0, vocab_size) = "
                         f"[0, {vocab_size})")


def _vp_check_weight(op, weight, V, device, name="weight", what="class weights"):
    if weight is None:
        return 0
    if weight.dtype != torch.float32 or weight.shape != (V,) or weight.device != device:
        raise ValueError(f"fusedloss::{op}: {name} must be the GLOBAL {what}, float32 of shape "
                         f"({V},) (vocab_size) on {device}, got {weight.dtype} {tuple(weight.shape)} "
                         f"on {weight.device}")
    if V > 1 and weight.stride(0) != 1:
        raise ValueError(f"fusedloss::{op}: {name} must be contiguous")
    return weight.data_ptr()


def _vp_check_offset(op, offset, V, device):
    """The GLOBAL per-class logit offsets (V,) fp32 contiguous on device, or None: its address."""
    return _vp_check_weight(op, offset, V, device, "offset", "per-class logit offsets")


def _vp_device(idx):
    return _CPU if idx < 0 else _cuda_device(idx)


def run_vp_local_stats(logits, target, vocab_start, vocab_size, p):
    """Step 1, fl_vp_ce_local_stats_{cpu,cuda}: stats fp32 [N, 4] for a plan() p of the shard
    (V = V_local; inputs already validated); N >= 1."""
    N, Vl, ld, dt, it, idx, opts, cfg, nbytes = p
    if idx < 0:
        stats = torch.empty((N, 4), dtype=_F32, device=_CPU)
        ws = _cpu_workspace(nbytes)
        st = _fl.fl_vp_ce_local_stats_cpu(stats.data_ptr(), logits.data_ptr(), target.data_ptr(), N,
                                          Vl, ld, vocab_start, vocab_size, dt, it, opts[1], ws[1],
                                          ws[2])
        if st:
            _check(st, "fl_vp_ce_local_stats_cpu")
        return stats
    fn = _vp_cuda_fn("fl_vp_ce_local_stats_cuda")
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_vp_local_stats(logits, target, vocab_start, vocab_size, p)
    stats = torch.empty((N, 4), dtype=_F32, device=_cuda_device(idx))
    stream = _raw_stream(idx)
    ws = _cuda_workspace(idx, stream, nbytes)
    st = fn(stats.data_ptr(), logits.data_ptr(), target.data_ptr(), N, Vl, ld, vocab_start,
            vocab_size, dt, it, opts[1], ws[1], ws[2], stream)
    if st:
        _check(st, "fl_vp_ce_local_stats_cuda")
    if _debug:
        _debug_check(_cuda_device(idx))
    return stats


def vp_combine_plan(N, V, it, idx, cfg, wptr, optr=0):
    """The plan() of step 3: no logits; the workspace of (N, V) for a 16-bit dtype (see above).
    optr: the address of the GLOBAL logit offsets (0 = none; step 3 does not read them)."""
    return plan(N, V, V, _lib.FL_DTYPE_BF16, it, idx, cfg, wptr, optr)


def run_vp_combine(gathered, target, p):
    """Step 3, fl_vp_ce_combine_{cpu,cuda}: (loss, lse) from gathered fp32 [k, N, 4] (contiguous,
    rank order) for a vp_combine_plan() p; N >= 1."""
    N, V, _, _, it, idx, opts, cfg, nbytes = p
    k = gathered.shape[0]
    if idx < 0:
        loss = torch.empty(size=(N,) if cfg.none else (), dtype=_F32, device=_CPU)
        lse = torch.empty(N, dtype=_F32, device=_CPU)
        ws = _cpu_workspace(nbytes)
        st = _fl.fl_vp_ce_combine_cpu(loss.data_ptr(), lse.data_ptr(), gathered.data_ptr(), k,
                                      target.data_ptr(), N, V, it, opts[1], ws[1], ws[2])
        if st:
            _check(st, "fl_vp_ce_combine_cpu")
        return loss, lse
    fn = _vp_cuda_fn("fl_vp_ce_combine_cuda")
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_vp_combine(gathered, target, p)
    dev = _cuda_device(idx)
    loss = torch.empty(size=(N,) if cfg.none else (), dtype=_F32, device=dev)
    lse = torch.empty(N, dtype=_F32, device=dev)
    stream = _raw_stream(idx)
    ws = _cuda_workspace(idx, stream, nbytes)
    st = fn(loss.data_ptr(), lse.data_ptr(), gathered.data_ptr(), k, target.data_ptr(), N, V, it,
            opts[1], ws[1], ws[2], stream)
    if st:
        _check(st, "fl_vp_ce_combine_cuda")
    if _debug:
        _debug_check(dev)
    return loss, lse


def run_vp_backward(grad_loss, logits, target, lse, vocab_start, vocab_size, p, grad_scale=1.0):
    """Step 4, fl_vp_ce_backward_{cpu,cuda}: this shard's dlogits from the global lse, for a
    plan() p of the shard; grad_loss fp32 contiguous, (N,) for reduction none else 1 element."""
    N, Vl, ld, dt, it, idx, opts, cfg, nbytes = p
    if idx < 0:
        dlogits = _new_dlogits(logits, N, Vl, ld)
        ws = _cpu_workspace(nbytes)
        st = _fl.fl_vp_ce_backward_cpu(dlogits.data_ptr(), logits.data_ptr(), target.data_ptr(),
                                       lse.data_ptr(), grad_loss.data_ptr(), grad_scale, N, Vl, ld,
                                       vocab_start, vocab_size, dt, it, opts[1], ws[1], ws[2])
        if st:
            _check(st, "fl_vp_ce_backward_cpu")
        return dlogits
    fn = _vp_cuda_fn("fl_vp_ce_backward_cuda")
    if _current_device() != idx:
        with torch.cuda.device(idx):
            return run_vp_backward(grad_loss, logits, target, lse, vocab_start, vocab_size, p,
                                   grad_scale)
    dlogits = _new_dlogits(logits, N, Vl, ld)
    stream = _raw_stream(idx)
    ws = _cuda_workspace(idx, stream, nbytes)
    st = fn(dlogits.data_ptr(), logits.data_ptr(), target.data_ptr(), lse.data_ptr(),
            grad_loss.data_ptr(), grad_scale, N, Vl, ld, vocab_start, vocab_size, dt, it, opts[1],
            ws[1], ws[2], stream)
    if st:
        _check(st, "fl_vp_ce_backward_cuda")
    if _debug:
        _debug_check(_cuda_device(idx))
    return dlogits


def vp_local_stats_impl(logits, target, weight, vocab_start, vocab_size, ignore_index, reduction,
                        label_smoothing, z_loss, softcap, logit_scale, offset=None):
    """Step 1 with its checks: stats fp32 [N, 4] of this shard."""
    op = "vp_ce_local_stats"
    N, Vl, ld, dt, it = _check_args(op, logits, target)
    _vp_check_cuda(logits)
    _vp_check_vocab(op, vocab_start, Vl, vocab_size)
    wptr = _vp_check_weight(op, weight, vocab_size, logits.device)
    optr = _vp_check_offset(op, offset, vocab_size, logits.device)
    if N == 0:
        return torch.empty((0, 4), dtype=_F32, device=logits.device)
    cfg = config(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    return run_vp_local_stats(logits, target, vocab_start, vocab_size,
                              plan(N, Vl, ld, dt, it, _device_index(logits), cfg, wptr, optr))


def vp_combine_impl(gathered, target, weight, vocab_size, ignore_index, reduction,
                    label_smoothing, z_loss, softcap, logit_scale, offset=None):
    """Step 3 with its checks: (loss, lse) from the k ranks' stats gathered in rank order."""
    op = "vp_ce_combine"
    if gathered.dtype != _F32 or gathered.dim() != 3 or gathered.shape[0] < 1 or gathered.shape[2] != 4:
        raise ValueError(f"fusedloss::{op}: gathered must be float32 of shape (k, N, 4) with k >= 1, "
                         f"got {gathered.dtype} {tuple(gathered.shape)}")
    N = gathered.shape[1]
    if not gathered.is_contiguous():
        raise ValueError(f"fusedloss::{op}: gathered must be contiguous")
    it = _INDEX_DTYPES.get(target.dtype)
    if it is None:
        raise TypeError(f"fusedloss::{op}: target dtype {target.dtype} not supported (int64, int32)")
    if target.dim() != 1 or target.shape[0] != N:
        raise ValueError(f"fusedloss::{op}: target must have shape ({N},), got {tuple(target.shape)}")
    dev = gathered.device
    if target.device != dev:
        raise ValueError(f"fusedloss::{op}: target is on {target.device}, gathered on {dev}")
    if N > 1 and target.stride(0) != 1:
        raise ValueError(f"fusedloss::{op}: target must be contiguous")
    if vocab_size < 1:
        raise ValueError(f"fusedloss::{op}: vocab_size must be >= 1, got {vocab_size}")
    _vp_check_cuda(gathered)
    wptr = _vp_check_weight(op, weight, vocab_size, dev)
    optr = _vp_check_offset(op, offset, vocab_size, dev)
    if N == 0:
        loss = torch.empty(_loss_shape(N, reduction), dtype=_F32, device=dev)
        return _empty_loss(loss, reduction), torch.empty((0,), dtype=_F32, device=dev)
    cfg = config(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    return run_vp_combine(gathered, target,
                          vp_combine_plan(N, vocab_size, it, _device_index(gathered), cfg, wptr,
                                          optr))


def vp_backward_impl(grad_loss, logits, target, lse, weight, vocab_start, vocab_size, ignore_index,
                     reduction, label_smoothing, z_loss, softcap, logit_scale, grad_scale,
                     offset=None):
    """Step 4 with its checks: this shard's dlogits from the global lse of step 3."""
    op = "vp_ce_backward"
    N, Vl, ld, dt, it = _check_args(op, logits, target, None, lse)
    _vp_check_cuda(logits)
    _vp_check_vocab(op, vocab_start, Vl, vocab_size)
    wptr = _vp_check_weight(op, weight, vocab_size, logits.device)
    optr = _vp_check_offset(op, offset, vocab_size, logits.device)
    _check_grad_loss(op, grad_loss, N, reduction, logits.device)
    if N == 0:
        return _new_dlogits(logits, N, Vl, ld)
    cfg = config(ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale)
    return run_vp_backward(grad_loss, logits, target, lse, vocab_start, vocab_size,
                           plan(N, Vl, ld, dt, it, _device_index(logits), cfg, wptr, optr),
                           grad_scale)


@torch.library.custom_op("fusedloss::vp_ce_local_stats", mutates_args=(),
                         device_types=("cpu", "cuda"))
def vp_ce_local_stats(logits: Tensor, target: Tensor, weight: Optional[Tensor], vocab_start: int,
                      vocab_size: int, ignore_index: int, reduction: int, label_smoothing: float,
                      z_loss: float, softcap: float, logit_scale: float,
                      offset: Optional[Tensor] = None) -> Tensor:
    """Step 1 (fl_vp_ce_local_stats_*): stats fp32 [N, 4] of this rank's shard of the logits."""
    return vp_local_stats_impl(logits, target, weight, vocab_start, vocab_size, ignore_index,
                               reduction, label_smoothing, z_loss, softcap, logit_scale, offset)


@vp_ce_local_stats.register_fake
def _(logits, target, weight, vocab_start, vocab_size, ignore_index, reduction, label_smoothing,
      z_loss, softcap, logit_scale, offset=None):
    torch._check(logits.dim() == 2, lambda: "fusedloss::vp_ce_local_stats: logits must be 2-D")
    return logits.new_empty((logits.shape[0], 4), dtype=torch.float32)


@torch.library.custom_op("fusedloss::vp_ce_combine", mutates_args=(), device_types=("cpu", "cuda"))
def vp_ce_combine(gathered: Tensor, target: Tensor, weight: Optional[Tensor], vocab_size: int,
                  ignore_index: int, reduction: int, label_smoothing: float, z_loss: float,
                  softcap: float, logit_scale: float,
                  offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Step 3 (fl_vp_ce_combine_*): (loss, global lse) from gathered fp32 [k, N, 4]."""
    return vp_combine_impl(gathered, target, weight, vocab_size, ignore_index, reduction,
                           label_smoothing, z_loss, softcap, logit_scale, offset)


@vp_ce_combine.register_fake
def _(gathered, target, weight, vocab_size, ignore_index, reduction, label_smoothing, z_loss,
      softcap, logit_scale, offset=None):
    torch._check(gathered.dim() == 3, lambda: "fusedloss::vp_ce_combine: gathered must be (k, N, 4)")
    N = gathered.shape[1]
    return (gathered.new_empty(_loss_shape(N, reduction), dtype=torch.float32),
            gathered.new_empty((N,), dtype=torch.float32))


@torch.library.custom_op("fusedloss::vp_ce_backward", mutates_args=(), device_types=("cpu", "cuda"))
def vp_ce_backward(grad_loss: Tensor, logits: Tensor, target: Tensor, lse: Tensor,
                   weight: Optional[Tensor], vocab_start: int, vocab_size: int, ignore_index: int,
                   reduction: int, label_smoothing: float, z_loss: float, softcap: float,
                   logit_scale: float, grad_scale: float, offset: Optional[Tensor] = None) -> Tensor:
    """Step 4 (fl_vp_ce_backward_*): this shard's dlogits from the global lse of step 3."""
    return vp_backward_impl(grad_loss, logits, target, lse, weight, vocab_start, vocab_size,
                            ignore_index, reduction, label_smoothing, z_loss, softcap, logit_scale,
                            grad_scale, offset)


@vp_ce_backward.register_fake
def _(grad_loss, logits, target, lse, weight, vocab_start, vocab_size, ignore_index, reduction,
      label_smoothing, z_loss, softcap, logit_scale, grad_scale, offset=None):
    return _fake_dlogits(logits)
