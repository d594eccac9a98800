"""fusedloss.zoo — the elementwise losses of include/fusedloss.h section 9 as PyTorch drop-ins:

    loss = fusedloss.sigmoid_focal_loss(logits, targets, alpha=0.25, gamma=2.0, reduction="none")
    loss = fusedloss.binary_cross_entropy_with_logits(logits, targets, pos_weight=pw)

sigmoid_focal_loss mirrors torchvision.ops.sigmoid_focal_loss; binary_cross_entropy_with_logits
mirrors torch.nn.functional.binary_cross_entropy_with_logits (same signature, same results within
fp32 rounding; see the notes on each). All layers of this op family live in this one module:
custom ops (torch.library, CPU and CUDA kernels calling fl_*_cpu / fl_*_cuda on the current
stream, fake kernels for torch.compile / meta tensors), their autograd (register_autograd), and
the functional drop-ins, which in eager mode with plain tensors skip the ops' dispatch (eager twins
of the ops: torch.autograd.Functions making the same C calls; see "the eager fast path" below).
Ops (namespace "fusedloss"):

  sigmoid_focal_forward(x, y, alpha, gamma, reduction) -> loss         (fl_sigmoid_focal_forward_*)
  sigmoid_focal_backward(grad, x, y, alpha, gamma, reduction) -> dx    (fl_sigmoid_focal_backward_*)
  sigmoid_focal_fused(x, y, alpha, gamma, reduction, inplace_backward=False) -> (loss, dx)
                                                                       (fl_sigmoid_focal_fused_*)
  bce_with_logits_forward(x, y, weight?, pos_weight?, reduction) -> loss
  bce_with_logits_backward(grad, x, y, weight?, pos_weight?, reduction) -> dx
  bce_with_logits_fused(x, y, weight?, pos_weight?, reduction, inplace_backward=False) -> (loss, dx)
      x, y: contiguous, same shape and dtype (float32 / float16 / bfloat16); weight, pos_weight
      float32 (C,) with C = x.shape[-1]; reduction the fl_reduction number (0 none, 1 mean, 2
      sum); loss float32 of x's shape (none) or 0-d; dx of x's dtype and shape; grad float32
      of the loss's shape. The fused ops' dx is the gradient for an upstream gradient of 1
      (grad_loss NULL), not differentiable (mark_non_differentiable); their autograd returns dx
      times the upstream gradient, scaling the op's own dx in place in eager mode when
      inplace_backward (the functional wrappers pass True and drop dx; a caller keeping dx leaves
      it False and gets an out-of-place multiply).

Passes over memory (n elements of x's dtype; the loss of a scalar reduction is 4 bytes):
  * reduction "mean" / "sum" with the input requiring grad (and grad mode on): the forward is
    the fused op, ONE pass: read x, read y, write dx (the floor of forward + backward). Only dx
    is held from the forward to the backward (x and y are not saved): the same bytes as the
    gradient itself, which AccumulateGrad adopts as a leaf's .grad without a copy. The backward
    scales dx by the real upstream gradient, a device scalar: in eager mode in place with
    fl_scale_rows (ops.run_scale_rows), which reads the factor on the device (no host sync) and
    touches nothing when it is exactly 1 (the usual loss.backward(): one tiny launch, 3 passes
    in all); otherwise one more read + write of dx (5 passes, and a 16-bit dx is rounded twice:
    by the kernel, then by the multiply in fp32). Traced (torch.compile) the backward is a plain
    `dx * grad` that the tracer sees (one more read + write of dx). In eager mode this backward
    can run only once per forward (a second backward through the same graph, retain_graph=True,
    raises RuntimeError: dx was scaled in place and may be the leaf's .grad by then).
  * reduction "none" (the per-element upstream gradient is not known in the forward): the
    forward saves only the inputs (x, y; weight / pos_weight) and reads x, y, writes the loss;
    backward is one more pass over x and y (read x, y, read grad, write dx): 5 passes over x's
    bytes plus the loss and its gradient. Also the path of a weight not of a [C] layout
    (multiplied onto the unreduced loss in torch), whatever the reduction.
  * inputs not requiring grad (or grad mode off): the forward op only (read x, y); no dx, no
    memory for it.
The functional wrappers return the loss in the input's dtype, as PyTorch does (the kernels
compute it in fp32). Cases the kernels do not serve fall back to the PyTorch formula itself
(float64 or other dtypes, devices other than cpu/cuda, targets / weight / pos_weight requiring
grad, weight or pos_weight not of a [C]-broadcast layout) so the functions stay drop-ins.
Double backward is not supported: differentiating the gradient raises RuntimeError
(backward(create_graph=True) itself is allowed, on every path).
"""
import ctypes
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _lib, ops
from ._lib import REDUCTIONS, _check
from .autograd import eager_ok

__all__ = ["sigmoid_focal_loss", "mmcv_sigmoid_focal_loss", "binary_cross_entropy_with_logits"]

_fl = _lib.lib
_F32 = torch.float32
_CF = torch.contiguous_format
_DTYPES = {torch.float32: _lib.FL_DTYPE_F32, torch.float16: _lib.FL_DTYPE_F16,
           torch.bfloat16: _lib.FL_DTYPE_BF16}
_NONE = _lib.FL_REDUCTION_NONE
_INF = math.inf

# Tests set this to run the eager calls through the custom ops too (the path torch.compile takes).
_FORCE_OPS = False

# ---- the eager fast path ------------------------------------------------------------------------
# A step is host-bound at small sizes (and still at 8192 x 1000 on an H200), and most of that host
# time was the custom ops' Python dispatch: the op, its generated autograd Function, the registered
# backward, then the backward op. So in eager mode with plain tensors -- no torch.compile tracing,
# no dispatch mode (FakeTensorMode, ...), no functorch transform (vmap's batched tensors have no
# storage), no tensor subclass -- the drop-ins below call _run_focal / _run_bce themselves: directly
# when no gradient is needed; else through an eager twin of the op, a torch.autograd.Function with
# the op's autograd state: _SigmoidFocalFused / _BceWithLogitsFused (scalar reductions: the fused
# pass; their backward is _fused_bwd itself) or _SigmoidFocal / _BceWithLogits (reduction none:
# one C call forward, one backward). The same C calls on the same buffers as through the ops, so
# the same bits. Anything else (and _FORCE_OPS) takes the ops, which torch.compile traces.
_is_compiling = torch.compiler.is_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack
_functorch_level = torch._C._functorch.peek_interpreter_stack
_grad_enabled = torch.is_grad_enabled
_PLAIN = (Tensor, torch.nn.Parameter)


def _eager(*ts):
    """True when the C entry points may be called directly on these tensors (None entries
    allowed); autograd.eager_ok's test, plus no functorch transform."""
    if _FORCE_OPS or _is_compiling():   # first: Dynamo cannot trace the other two
        return False
    for t in ts:
        if t is not None and type(t) not in _PLAIN:
            return False
    return not _dispatch_depth() and _functorch_level() is None


def _loss_shape(x, reduction):
    return x.shape if reduction == _NONE else ()


def _new_loss(x, reduction):
    """The fp32 loss buffer (x's shape, contiguous, or 0-d); empty_like is the cheaper call."""
    if reduction == _NONE:
        return torch.empty_like(x, dtype=_F32, memory_format=_CF)
    return torch.empty((), dtype=_F32, device=x.device)


def _workspace(nbytes, x, cuda):
    """(buffer, address, bytes) of scratch for one call on x's device: ops' per-thread (CPU) and
    per-stream (CUDA) buffers, which the cross-entropy calls share (the reduction partials are
    written before they are read, so the contents do not matter)."""
    if cuda:
        idx = x.get_device()
        ws = ops._cuda_workspace(idx, ops._raw_stream(idx), nbytes)
    else:
        ws = ops._cpu_workspace(nbytes)
    return ws[0], ws[1], nbytes


def _stream(x):
    return ops._raw_stream(x.get_device())


def _grad_ptr(grad, x, reduction):
    """fp32 contiguous upstream gradient of the loss's shape, or raise."""
    shape = _loss_shape(x, reduction)
    if tuple(grad.shape) != tuple(shape):
        raise ValueError(f"fusedloss: grad must have the loss's shape {tuple(shape)}, got {tuple(grad.shape)}")
    return grad.to(device=x.device, dtype=torch.float32).contiguous()


def _check_xy(op, x, y):
    if x.dtype not in _DTYPES:
        raise TypeError(f"fusedloss::{op}: dtype {x.dtype} not supported (float32, float16, bfloat16)")
    if y.dtype != x.dtype or y.shape != x.shape or y.device != x.device:
        raise ValueError(f"fusedloss::{op}: targets must match logits ({x.dtype} {tuple(x.shape)} on {x.device}), "
                         f"got {y.dtype} {tuple(y.shape)} on {y.device}")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError(f"fusedloss::{op}: logits and targets must be contiguous")


def _nc(x):
    C = x.shape[-1] if x.dim() >= 1 else 1
    if C == 0:
        return 0, 1
    return x.numel() // C, C


# ---- sigmoid focal ------------------------------------------------------------------------------

_FWD, _BWD, _FUSED = 0, 1, 2   # pass_ of _run_focal / _run_bce
# the C entry points' names by [cuda][pass_] (looked up on _fl at each call: tests may wrap it)
_FOCAL_FNS, _BCE_FNS = (
    tuple(tuple(f"fl_{op}_{p}_{d}" for p in ("forward", "backward", "fused")) for d in ("cpu", "cuda"))
    for op in ("sigmoid_focal", "bce_with_logits"))


def _run_focal(pass_, x, y, grad, alpha, gamma, reduction):
    """_FWD: loss; _BWD: dx for the upstream gradient grad; _FUSED: (loss, dx) for an upstream
    gradient of 1 (grad_loss NULL), one pass."""
    _check_xy("sigmoid_focal", x, y)
    if x.is_cuda and ops._current_device() != x.get_device():   # launch on x's GPU (as ops.py does)
        with torch.cuda.device(x.get_device()):
            return _run_focal(pass_, x, y, grad, alpha, gamma, reduction)
    dt = _DTYPES[x.dtype]
    n = x.numel()
    cuda = x.is_cuda
    name = _FOCAL_FNS[cuda][pass_]
    tail = (_stream(x),) if cuda else ()
    if pass_ == _BWD:
        grad = _grad_ptr(grad, x, reduction)
        dx = torch.empty_like(x, memory_format=_CF)
        st = getattr(_fl, name)(dx.data_ptr(), x.data_ptr(), y.data_ptr(), grad.data_ptr(), 1.0, n, dt, alpha,
                                gamma, reduction, *tail)
        if st:
            _check(st, name)
        return dx
    loss = _new_loss(x, reduction)
    ws = (None, None, 0) if reduction == _NONE else _workspace(_lib_ws_focal(n), x, cuda)
    if pass_ == _FWD:
        st = getattr(_fl, name)(loss.data_ptr(), x.data_ptr(), y.data_ptr(), n, dt, alpha, gamma, reduction,
                                ws[1], ws[2], *tail)
        if st:
            _check(st, name)
        return loss
    dx = torch.empty_like(x, memory_format=_CF)
    st = getattr(_fl, name)(loss.data_ptr(), dx.data_ptr(), x.data_ptr(), y.data_ptr(), None, 1.0, n, dt,
                            alpha, gamma, reduction, ws[1], ws[2], *tail)
    if st:
        _check(st, name)
    return loss, dx


# workspace bytes by n (focal) / (N, C) (bce): a function of the sizes only (include/fusedloss.h)
_WS_FOCAL = {}
_WS_BCE = {}


def _lib_ws_focal(n):
    b = _WS_FOCAL.get(n)
    if b is None:
        out = ctypes.c_size_t(0)
        _check(_fl.fl_sigmoid_focal_workspace_size(ctypes.byref(out), int(n)), "fl_sigmoid_focal_workspace_size")
        if len(_WS_FOCAL) >= 256:
            _WS_FOCAL.clear()
        b = _WS_FOCAL[n] = out.value
    return b


def _lib_ws_bce(N, C):
    b = _WS_BCE.get((N, C))
    if b is None:
        out = ctypes.c_size_t(0)
        _check(_fl.fl_bce_with_logits_workspace_size(ctypes.byref(out), int(N), int(C)),
               "fl_bce_with_logits_workspace_size")
        if len(_WS_BCE) >= 256:
            _WS_BCE.clear()
        b = _WS_BCE[(N, C)] = out.value
    return b


@torch.library.custom_op("fusedloss::sigmoid_focal_forward", mutates_args=(), device_types=("cpu", "cuda"))
def sigmoid_focal_forward(x: Tensor, y: Tensor, alpha: float, gamma: float, reduction: int) -> Tensor:
    """torchvision's sigmoid focal loss (fl_sigmoid_focal_forward_*); fp32 loss."""
    return _run_focal(_FWD, x, y, None, alpha, gamma, reduction)


@sigmoid_focal_forward.register_fake
def _(x, y, alpha, gamma, reduction):
    return x.new_empty(_loss_shape(x, reduction), dtype=torch.float32)


@torch.library.custom_op("fusedloss::sigmoid_focal_backward", mutates_args=(), device_types=("cpu", "cuda"))
def sigmoid_focal_backward(grad: Tensor, x: Tensor, y: Tensor, alpha: float, gamma: float,
                           reduction: int) -> Tensor:
    """dx = grad * dloss/dx (fl_sigmoid_focal_backward_*); x's dtype."""
    return _run_focal(_BWD, x, y, grad, alpha, gamma, reduction)


@sigmoid_focal_backward.register_fake
def _(grad, x, y, alpha, gamma, reduction):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _focal_setup(ctx, inputs, output):
    x, y, alpha, gamma, reduction = inputs
    ctx.save_for_backward(x, y)
    ctx.args = (alpha, gamma, reduction)


def _focal_bwd(ctx, grad):
    x, y = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None, None, None, None, None
    dx = torch.ops.fusedloss.sigmoid_focal_backward(grad.float().contiguous(), x, y, *ctx.args)
    return dx, None, None, None, None


def _no_double_backward(ctx, *grads):
    raise RuntimeError("fusedloss.zoo: double backward (differentiating the gradient) is not supported")


def _no_setup(ctx, inputs, output):
    pass


sigmoid_focal_forward.register_autograd(_focal_bwd, setup_context=_focal_setup)
sigmoid_focal_backward.register_autograd(_no_double_backward, setup_context=_no_setup)


# ---- the fused ops' autograd: dx formed in the forward, scaled in the backward ------------------
# setup_context keeps dx only (not x, y); dx is marked non-differentiable and no zeros are
# materialised for its (unused) gradient. backward returns dx times the upstream gradient:
#   traced (torch.compile, fake tensors, dispatch modes): dx * grad, a torch op the tracer sees;
#   eager, backward(create_graph=True): dx * grad out of place through _ScaleNoDoubleBackward,
#     whose own backward raises (differentiating the gradient is not supported);
#   eager, inplace_backward=True (what the functional wrappers pass; they drop the op's dx
#     output), scalar reduction: in place with ops.run_scale_rows (on the device, no host sync,
#     nothing moved when grad == 1), returning a fresh alias of dx so that AccumulateGrad may
#     adopt it as .grad without a copy; such a backward may run only once;
#   eager otherwise (a direct op call, whose caller may hold dx; reduction none): dx * grad.
def _times(dx, grad, reduction):
    out = dx * (grad if reduction == _NONE else grad.reshape(()))
    return out if out.dtype == dx.dtype else out.to(dx.dtype)


class _ScaleNoDoubleBackward(torch.autograd.Function):
    """apply(dx, grad, reduction, anchor) -> dx * grad, for backward(create_graph=True): anchor is a
    leaf that requires grad, so the result has this node, whose backward raises, as the two-pass
    path's backward op does when its result is differentiated."""

    @staticmethod
    def forward(ctx, dx, grad, reduction, anchor):
        return _times(dx, grad, reduction)

    @staticmethod
    def backward(ctx, *grads):
        _no_double_backward(ctx)


def _fused_setup(ctx, inputs, output):
    _, dx = output
    ctx.mark_non_differentiable(dx)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(dx)
    ctx.reduction = inputs[-2]
    ctx.inplace = inputs[-1]
    ctx.nargs = len(inputs)
    ctx.used = False


def _fused_bwd(ctx, grad, grad_dx):
    nones = (None,) * (ctx.nargs - 1)
    if grad is None or not ctx.needs_input_grad[0]:
        return (None,) + nones
    if ctx.used:
        raise RuntimeError("fusedloss.zoo: this loss's backward can run only once (its gradient was formed in "
                           "the forward and scaled in place by the first backward); a second backward through "
                           "the same graph (retain_graph=True) is not supported; compute the loss with "
                           "reduction='none' and reduce it in torch for that")
    (dx,) = ctx.saved_tensors
    if grad.device != dx.device:
        grad = grad.to(dx.device)
    red = ctx.reduction
    if not (eager_ok(dx) and eager_ok(grad)):
        return (_times(dx, grad, red),) + nones
    if torch.is_grad_enabled():
        anchor = torch.empty(0, device=dx.device, requires_grad=True)
        return (_ScaleNoDoubleBackward.apply(dx, grad, red, anchor),) + nones
    if not ctx.inplace or red == _NONE:
        return (_times(dx, grad, red),) + nones
    ctx.used = True
    ops.run_scale_rows(dx, grad, False)
    return (dx.detach(),) + nones


@torch.library.custom_op("fusedloss::sigmoid_focal_fused", mutates_args=(), device_types=("cpu", "cuda"))
def sigmoid_focal_fused(x: Tensor, y: Tensor, alpha: float, gamma: float, reduction: int,
                        inplace_backward: bool = False) -> Tuple[Tensor, Tensor]:
    """(loss, dx) in one pass (fl_sigmoid_focal_fused_*): dx = dloss/dx for an upstream gradient of 1,
    x's dtype, not differentiable. inplace_backward=True: in eager mode the backward scales this dx
    in place (the caller must not keep it); see the comment above."""
    return _run_focal(_FUSED, x, y, None, alpha, gamma, reduction)


@sigmoid_focal_fused.register_fake
def _(x, y, alpha, gamma, reduction, inplace_backward=False):
    return (x.new_empty(_loss_shape(x, reduction), dtype=torch.float32),
            torch.empty_like(x, memory_format=torch.contiguous_format))


sigmoid_focal_fused.register_autograd(_fused_bwd, setup_context=_fused_setup)


# ---- BCE with logits ----------------------------------------------------------------------------

def _run_bce(pass_, x, y, w, pw, grad, reduction):
    _check_xy("bce_with_logits", x, y)
    if x.is_cuda and ops._current_device() != x.get_device():   # launch on x's GPU (as ops.py does)
        with torch.cuda.device(x.get_device()):
            return _run_bce(pass_, x, y, w, pw, grad, reduction)
    N, C = _nc(x)
    for what, t in (("weight", w), ("pos_weight", pw)):
        if t is not None and (t.dtype != _F32 or t.shape != (C,) or t.device != x.device or not t.is_contiguous()):
            raise ValueError(f"fusedloss::bce_with_logits: {what} must be a contiguous float32 ({C},) tensor on "
                             f"{x.device}, got {t.dtype} {tuple(t.shape)} on {t.device}")
    dt = _DTYPES[x.dtype]
    cuda = x.is_cuda
    name = _BCE_FNS[cuda][pass_]
    tail = (_stream(x),) if cuda else ()
    wp = w.data_ptr() if w is not None else None
    pwp = pw.data_ptr() if pw is not None else None
    if pass_ == _BWD:
        grad = _grad_ptr(grad, x, reduction)
        dx = torch.empty_like(x, memory_format=_CF)
        st = getattr(_fl, name)(dx.data_ptr(), x.data_ptr(), y.data_ptr(), wp, pwp, grad.data_ptr(), 1.0,
                                N, C, dt, reduction, *tail)
        if st:
            _check(st, name)
        return dx
    loss = _new_loss(x, reduction)
    ws = (None, None, 0) if reduction == _NONE else _workspace(_lib_ws_bce(N, C), x, cuda)
    if pass_ == _FWD:
        st = getattr(_fl, name)(loss.data_ptr(), x.data_ptr(), y.data_ptr(), wp, pwp, N, C, dt, reduction,
                                ws[1], ws[2], *tail)
        if st:
            _check(st, name)
        return loss
    dx = torch.empty_like(x, memory_format=_CF)
    st = getattr(_fl, name)(loss.data_ptr(), dx.data_ptr(), x.data_ptr(), y.data_ptr(), wp, pwp, None,
                            1.0, N, C, dt, reduction, ws[1], ws[2], *tail)
    if st:
        _check(st, name)
    return loss, dx


@torch.library.custom_op("fusedloss::bce_with_logits_forward", mutates_args=(), device_types=("cpu", "cuda"))
def bce_with_logits_forward(x: Tensor, y: Tensor, weight: Optional[Tensor], pos_weight: Optional[Tensor],
                            reduction: int) -> Tensor:
    """F.binary_cross_entropy_with_logits (fl_bce_with_logits_forward_*); fp32 loss."""
    return _run_bce(_FWD, x, y, weight, pos_weight, None, reduction)


@bce_with_logits_forward.register_fake
def _(x, y, weight, pos_weight, reduction):
    return x.new_empty(_loss_shape(x, reduction), dtype=torch.float32)


@torch.library.custom_op("fusedloss::bce_with_logits_backward", mutates_args=(), device_types=("cpu", "cuda"))
def bce_with_logits_backward(grad: Tensor, x: Tensor, y: Tensor, weight: Optional[Tensor],
                             pos_weight: Optional[Tensor], reduction: int) -> Tensor:
    """dx = grad * dloss/dx (fl_bce_with_logits_backward_*); x's dtype."""
    return _run_bce(_BWD, x, y, weight, pos_weight, grad, reduction)


@bce_with_logits_backward.register_fake
def _(grad, x, y, weight, pos_weight, reduction):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _bce_setup(ctx, inputs, output):
    x, y, w, pw, reduction = inputs
    ctx.save_for_backward(x, y, w, pw)
    ctx.reduction = reduction


def _bce_bwd(ctx, grad):
    x, y, w, pw = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None, None, None, None, None
    dx = torch.ops.fusedloss.bce_with_logits_backward(grad.float().contiguous(), x, y, w, pw, ctx.reduction)
    return dx, None, None, None, None


bce_with_logits_forward.register_autograd(_bce_bwd, setup_context=_bce_setup)
bce_with_logits_backward.register_autograd(_no_double_backward, setup_context=_no_setup)


@torch.library.custom_op("fusedloss::bce_with_logits_fused", mutates_args=(), device_types=("cpu", "cuda"))
def bce_with_logits_fused(x: Tensor, y: Tensor, weight: Optional[Tensor], pos_weight: Optional[Tensor],
                          reduction: int, inplace_backward: bool = False) -> Tuple[Tensor, Tensor]:
    """(loss, dx) in one pass (fl_bce_with_logits_fused_*), as fusedloss::sigmoid_focal_fused."""
    return _run_bce(_FUSED, x, y, weight, pos_weight, None, reduction)


@bce_with_logits_fused.register_fake
def _(x, y, weight, pos_weight, reduction, inplace_backward=False):
    return (x.new_empty(_loss_shape(x, reduction), dtype=torch.float32),
            torch.empty_like(x, memory_format=torch.contiguous_format))


bce_with_logits_fused.register_autograd(_fused_bwd, setup_context=_fused_setup)


# ---- the eager twins of the ops (see "the eager fast path" above) -------------------------------
# Inputs as the ops get them (checked again by _run_focal / _run_bce); x requires grad.
class _EagerFused(torch.autograd.Function):
    """The fused ops' autograd with inplace_backward=True: the forward keeps dx only; backward is
    _fused_bwd (in place on dx, once; create_graph / traced grads as there)."""

    @staticmethod
    def backward(ctx, grad):
        return _fused_bwd(ctx, grad, None)


def _fused_ctx(ctx, dx, reduction, nargs):
    """_fused_setup's state, for a node of nargs inputs."""
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(dx)
    ctx.reduction = reduction
    ctx.inplace = True
    ctx.nargs = nargs
    ctx.used = False


class _SigmoidFocalFused(_EagerFused):
    """apply(x, y, alpha, gamma, reduction) -> loss: fusedloss::sigmoid_focal_fused(..., True)[0]."""

    @staticmethod
    def forward(ctx, x, y, alpha, gamma, reduction):
        loss, dx = _run_focal(_FUSED, x, y, None, alpha, gamma, reduction)
        _fused_ctx(ctx, dx, reduction, 5)
        return loss


class _BceWithLogitsFused(_EagerFused):
    """apply(x, y, weight, pos_weight, reduction) -> loss: fusedloss::bce_with_logits_fused(..., True)[0]."""

    @staticmethod
    def forward(ctx, x, y, w, pw, reduction):
        loss, dx = _run_bce(_FUSED, x, y, w, pw, None, reduction)
        _fused_ctx(ctx, dx, reduction, 5)
        return loss


class _SigmoidFocal(torch.autograd.Function):
    """apply(x, y, alpha, gamma, reduction) -> loss: fusedloss::sigmoid_focal_forward and its autograd
    (_focal_setup, _focal_bwd) with the backward's C call made directly."""

    @staticmethod
    def forward(ctx, x, y, alpha, gamma, reduction):
        ctx.save_for_backward(x, y)
        ctx.args = (alpha, gamma, reduction)
        return _run_focal(_FWD, x, y, None, alpha, gamma, reduction)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        g = grad.float().contiguous()
        if _grad_enabled() or not eager_ok(g):   # create_graph=True: the op, whose own backward raises
            dx = torch.ops.fusedloss.sigmoid_focal_backward(g, x, y, *ctx.args)
        else:
            dx = _run_focal(_BWD, x, y, g, *ctx.args)
        return dx, None, None, None, None


class _BceWithLogits(torch.autograd.Function):
    """apply(x, y, weight, pos_weight, reduction) -> loss: fusedloss::bce_with_logits_forward and its
    autograd (_bce_setup, _bce_bwd) with the backward's C call made directly."""

    @staticmethod
    def forward(ctx, x, y, w, pw, reduction):
        ctx.save_for_backward(x, y, w, pw)
        ctx.reduction = reduction
        return _run_bce(_FWD, x, y, w, pw, None, reduction)

    @staticmethod
    def backward(ctx, grad):
        x, y, w, pw = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        g = grad.float().contiguous()
        if _grad_enabled() or not eager_ok(g):   # create_graph=True: the op, whose own backward raises
            dx = torch.ops.fusedloss.bce_with_logits_backward(g, x, y, w, pw, ctx.reduction)
        else:
            dx = _run_bce(_BWD, x, y, w, pw, g, ctx.reduction)
        return dx, None, None, None, None


# ---- functional drop-ins ---------------------------------------------------------------------------

def _served(x):
    return isinstance(x, Tensor) and x.dtype in _DTYPES and (x.is_cuda or x.is_cpu)


def _fuse(x, reduction):
    """The fused forward (loss and dx in one pass) serves a scalar reduction whose input needs a
    gradient; reduction none (per-element upstream gradient unknown up front) and forward-only
    calls keep the forward op (no dx, no memory for it)."""
    return reduction != _NONE and x.requires_grad and torch.is_grad_enabled()


def _reference_focal(inputs, targets, alpha, gamma, reduction):
    """torchvision.ops.sigmoid_focal_loss, operation for operation (the fallback)."""
    p = torch.sigmoid(inputs)
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce_loss * ((1 - p_t) ** gamma)
    if alpha >= 0:
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        loss = alpha_t * loss
    if reduction == "mean":
        loss = loss.mean()
    elif reduction == "sum":
        loss = loss.sum()
    return loss


def sigmoid_focal_loss(inputs, targets, alpha: float = 0.25, gamma: float = 2.0, reduction: str = "none"):
    r"""torchvision.ops.sigmoid_focal_loss, fused: ``'mean'`` / ``'sum'`` with a gradient needed make
    ONE pass (loss and gradient together in the forward; backward only scales the gradient by the
    upstream gradient, free when it is 1); ``'none'``: one pass forward, one pass backward.

    ``loss = alpha_t * (1 - p_t)^gamma * BCEWithLogits(inputs, targets)`` with ``p = sigmoid(inputs)``,
    ``p_t = p t + (1 - p)(1 - t)``, ``alpha_t = alpha t + (1 - alpha)(1 - t)`` (``alpha < 0``: no
    alpha weighting). Soft targets in [0, 1] allowed. ``reduction``: ``'none'`` (default, as
    torchvision), ``'mean'`` (over all elements), ``'sum'``. Inputs of any shape, float32 / float16 /
    bfloat16 (computed in float32; the loss is returned in the inputs' dtype); targets are cast
    to the inputs' dtype and broadcast to their shape. Gradient w.r.t. ``inputs`` only (targets
    requiring grad fall back to torchvision's formula in torch ops). Where ``1 - p_t`` is exactly 0
    in fp32 and ``0 < gamma < 1`` the gradient is NaN, as PyTorch's autograd of torchvision's
    expression (include/fusedloss.h section 9). Works under torch.compile(fullgraph=True).
    """
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"Invalid Value for arg 'reduction': '{reduction} \n Supported reduction modes: "
                         "'none', 'mean', 'sum'")
    if not isinstance(inputs, Tensor) or not isinstance(targets, Tensor):
        raise TypeError("sigmoid_focal_loss: inputs and targets must be Tensors")
    alpha, gamma = float(alpha), float(gamma)
    if not _served(inputs) or targets.requires_grad or not (gamma >= 0 and gamma < _INF) \
            or not (-_INF < alpha < _INF):
        return _reference_focal(inputs, targets, alpha, gamma, reduction)
    y = targets
    if y.dtype != inputs.dtype:
        y = y.to(inputs.dtype)
    if y.shape != inputs.shape:
        y = y.expand(inputs.shape)
    red = REDUCTIONS[reduction]
    x = inputs.contiguous()
    y = y.contiguous()
    if _eager(inputs, targets):
        if not (inputs.requires_grad and _grad_enabled()):
            loss = _run_focal(_FWD, x, y, None, alpha, gamma, red)
        elif red != _NONE:   # as _fuse: loss and dx in one pass; backward scales dx
            loss = _SigmoidFocalFused.apply(x, y, alpha, gamma, red)
        else:
            loss = _SigmoidFocal.apply(x, y, alpha, gamma, red)
    elif _fuse(inputs, red):   # loss and dx in one pass; backward scales dx
        loss, _ = torch.ops.fusedloss.sigmoid_focal_fused(x, y, alpha, gamma, red, True)
    else:
        loss = torch.ops.fusedloss.sigmoid_focal_forward(x, y, alpha, gamma, red)
    return loss if loss.dtype == inputs.dtype else loss.to(inputs.dtype)



def mmcv_sigmoid_focal_loss(input, target, gamma: float = 2.0, alpha: float = 0.25, weight=None,
                            reduction: str = "mean"):
    r"""mmcv.ops.sigmoid_focal_loss (index targets), on the fused sigmoid focal kernels.

    ``input`` (N, C) logits, ``target`` (N,) integer class indices in [0, C]: class c is the one
    positive of its row, the value C means background (every class negative). Per element, with
    ``p = sigmoid(input)``: ``-alpha (1 - p)^gamma log p`` for the row's class and
    ``-(1 - alpha) p^gamma log(1 - p)`` for the others (alpha is applied whatever its sign, as
    mmcv). Note mmcv's argument order: gamma before alpha.

    ``weight`` (optional): per-class, (C,) or (C + 1,); row n's losses are multiplied by
    ``weight[target[n]]``. With a (C,) weight a background row is unweighted (mmcv reads
    ``weight[C]`` past the end there); a (C + 1,) weight gives the background's own.
    ``reduction``: ``'none'`` (N, C), ``'sum'``, or ``'mean'`` = the sum divided by N (rows, not
    N * C: mmcv's convention). A target outside [0, C] makes its row's losses NaN (so a reduced loss
    is NaN): no host synchronisation, no device assert.

    Differences from mmcv, deliberate: log p and log(1 - p) are computed as log-sigmoid (mmcv takes
    log(max(p, FLT_MIN)), so its loss saturates at 87.34 for logits beyond about -87 and its
    gradient there is that of the clamp); float16 / bfloat16 inputs are computed in float32.
    """
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"mmcv_sigmoid_focal_loss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if not isinstance(input, Tensor) or not isinstance(target, Tensor):
        raise TypeError("mmcv_sigmoid_focal_loss: input and target must be Tensors")
    if input.dim() != 2 or target.dim() != 1 or target.shape[0] != input.shape[0]:
        raise ValueError(f"mmcv_sigmoid_focal_loss: input must be (N, C) and target (N,), got "
                         f"{tuple(input.shape)} and {tuple(target.shape)}")
    if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype is torch.bool:
        raise TypeError(f"mmcv_sigmoid_focal_loss: target must hold integer class indices, got {target.dtype}")
    if target.device != input.device:
        raise ValueError(f"mmcv_sigmoid_focal_loss: target is on {target.device} but input is on {input.device}")
    N, C = input.shape
    if weight is not None:
        if not isinstance(weight, Tensor) or weight.dim() != 1 or weight.shape[0] not in (C, C + 1):
            raise ValueError(f"mmcv_sigmoid_focal_loss: weight must be a (C,) or (C + 1,) tensor with C = {C}, got "
                             f"{tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__}")
        if weight.device != input.device:
            raise ValueError(f"mmcv_sigmoid_focal_loss: weight is on {weight.device} but input is on {input.device}")
    gamma, alpha = float(gamma), float(alpha)
    t = target.long()
    bad = (t < 0) | (t > C)
    # the one-hot targets (background: an all-zero row), in the input's dtype
    y = (t.unsqueeze(1) == torch.arange(C, device=input.device)).to(input.dtype)
    nan = torch.tensor(float("nan"), dtype=torch.float32, device=input.device)
    if alpha >= 0:
        # torchvision's loss on {0, 1} targets is this one: alpha_t = alpha t + (1 - alpha)(1 - t)
        if weight is None and reduction != "none":
            loss = sigmoid_focal_loss(input, y, alpha, gamma, "sum").float()
            loss = loss + torch.where(bad.any(), nan, 0.0)
            if reduction == "mean":
                loss = loss / max(N, 1) if N else loss * nan   # mmcv: sum / N (N = 0: NaN, as 0 / 0)
            return loss.to(input.dtype) if input.dtype != torch.float32 else loss
        el = sigmoid_focal_loss(input, y, alpha, gamma, "none").float()
    else:   # mmcv keeps a negative alpha as a weight; torchvision's op would drop the weighting
        xf = input.float()
        p = torch.sigmoid(xf)
        yf = y.float()
        el = -(alpha * yf * (1 - p) ** gamma * F.logsigmoid(xf)
               + (1 - alpha) * (1 - yf) * p ** gamma * F.logsigmoid(-xf))
    if weight is not None:
        w = weight.float()
        if w.shape[0] == C:
            w = torch.cat([w, w.new_ones(1)])
        el = el * w[t.clamp(0, C)].unsqueeze(1)
    el = torch.where(bad.unsqueeze(1), nan, el)
    if reduction == "sum":
        el = el.sum()
    elif reduction == "mean":
        el = el.sum() / N if N else el.sum() * nan
    return el.to(input.dtype) if input.dtype != torch.float32 else el

def _as_c_vector(t, C, device):
    """t as a float32 (C,) vector if it broadcasts along the last dim only (shape (C,), (1,), (),
    or with leading 1s), else None."""
    if t.dtype is _F32 and t.shape == (C,) and t.is_contiguous():   # the usual case: as it is
        return t
    if t.dim() > 0 and any(s != 1 for s in t.shape[:-1]):
        return None
    last = t.shape[-1] if t.dim() > 0 else 1
    if last not in (1, C):
        return None
    return t.reshape(-1).to(device=device, dtype=torch.float32).expand(C).contiguous()


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction: str = "mean", pos_weight=None):
    r"""torch.nn.functional.binary_cross_entropy_with_logits, fused (same signature and semantics).

    ``loss = weight * [(1 - t) x + (1 + (pos_weight - 1) t) * softplus(-x)]``; ``weight`` and
    ``pos_weight`` broadcast along the last dimension (C = input.shape[-1]) and are applied in
    float32 by the kernel; a ``weight`` of another broadcastable shape is multiplied onto the
    unreduced loss here (then reduced in torch). float32 / float16 / bfloat16 inputs, computed in
    float32 without the cancellation of PyTorch's own fp32 order (so within fp32 rounding of the
    exact value, slightly closer to it than PyTorch); loss in the input's dtype. Gradient w.r.t.
    ``input`` only: target / weight / pos_weight requiring grad, float64, or a pos_weight not of a
    [C] layout fall back to F.binary_cross_entropy_with_logits. Passes as sigmoid_focal_loss: one for
    ``'mean'`` / ``'sum'`` with a gradient needed (except a weight not of a [C] layout: two), else
    one forward and one backward.
    """
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    if reduction not in REDUCTIONS:
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if not isinstance(input, Tensor) or not isinstance(target, Tensor):
        raise TypeError("binary_cross_entropy_with_logits: input and target must be Tensors")
    if target.size() != input.size():
        raise ValueError(f"Target size ({target.size()}) must be the same as input size ({input.size()})")

    def fallback():
        return F.binary_cross_entropy_with_logits(input, target, weight, reduction=reduction, pos_weight=pos_weight)
    if not _served(input) or target.requires_grad:
        return fallback()
    for t in (weight, pos_weight):
        if t is not None and (not isinstance(t, Tensor) or t.requires_grad or t.device != input.device):
            return fallback()
    N, C = _nc(input)
    pw = None
    if pos_weight is not None:
        pw = _as_c_vector(pos_weight, C, input.device)
        if pw is None:
            return fallback()
    w = None
    post_w = None
    if weight is not None:
        w = _as_c_vector(weight, C, input.device)
        if w is None:
            try:
                torch.broadcast_shapes(weight.shape, input.shape)
            except RuntimeError:
                return fallback()   # torch raises its own error
            post_w = weight
    y = target if target.dtype == input.dtype else target.to(input.dtype)
    x = input.contiguous()
    y = y.contiguous()
    red = REDUCTIONS[reduction] if post_w is None else _NONE
    if _eager(input, target, weight, pos_weight):
        if not (input.requires_grad and _grad_enabled()):
            loss = _run_bce(_FWD, x, y, w, pw, None, red)
        elif red != _NONE:   # as _fuse: loss and dx in one pass; backward scales dx
            loss = _BceWithLogitsFused.apply(x, y, w, pw, red)
        else:
            loss = _BceWithLogits.apply(x, y, w, pw, red)
    elif post_w is None and _fuse(input, red):   # loss and dx in one pass; backward scales dx
        loss, _ = torch.ops.fusedloss.bce_with_logits_fused(x, y, w, pw, red, True)
    else:
        loss = torch.ops.fusedloss.bce_with_logits_forward(x, y, w, pw, red)
    if post_w is not None:
        loss = loss * post_w
        loss = loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss
    return loss if loss.dtype == input.dtype else loss.to(input.dtype)
