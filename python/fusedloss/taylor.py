"""fusedloss.taylor — the Taylor softmax cross-entropy (include/fusedloss.h section 14; pytorch-loss's
TaylorSoftmax + NLL, Banerjee et al.):

    loss = fusedloss.taylor_cross_entropy(logits, target)                 # order 2, mean
    loss = fusedloss.taylor_cross_entropy(seg_logits, seg_target, order=4, ignore_index=255)
    criterion = fusedloss.TaylorCrossEntropyLoss(order=2)

Semantics: logits x [N, C] (or [N, C, d1, ...], the class dimension 1 as F.cross_entropy's; a
single [C] sample with a 0-d target too), class targets y [N] (or [N, d1, ...]). With the Taylor
series of exp of even order n (2 or 4: f > 0 for every real x):

    f_2(x) = 1 + x + x^2 / 2,   f_4(x) = f_2(x) + x^3 / 6 + x^4 / 24,
    l = log sum_k f(x_k) - log f(x_y)        (= -log of the Taylor softmax at the target)

Positions whose target equals ignore_index count 0 and get a zero gradient (their logits are not
read). Reductions "none" (the target's shape), "sum", "mean" (over the positions not ignored; NaN
if none, gradient then 0). Defaults: order 2 (pytorch-loss's module; its function defaults to 4)
and ignore_index -100 (PyTorch's; pytorch-loss uses -1: pass ignore_index=-1 for that). Targets
int32 / int64 (other integer dtypes are cast). The loss is returned in the logits' dtype
(computed in fp32 by CUDA, in double by the CPU backend; rounded once). Out-of-range targets:
TargetOutOfRangeError (an IndexError) on CPU; on CUDA that row's loss and gradient are NaN and the
device error flag is set (fusedloss.check_errors(); debug mode: see fusedloss.ops).

Paths:
  * CPU and CUDA tensors of float32 / float16 / bfloat16: the C op (fl_taylor_ce_{forward,fused}_*)
    through the custom ops below on rows [N, C] (unit column stride, row stride ld >= C: a 2-D
    row-strided view such as a column slice is passed as is; [N, C, d1, ...] maps are moved to
    [N * d1 * ..., C] rows, which copies; any other layout is made contiguous).
  * Everything else (float64, other devices): the PyTorch formulation _taylor_torch (f, log p =
    log f - log sum f, F.nll_loss), which is also the eager baseline of bench/bench_taylor.py.

Custom ops (namespace "fusedloss"; torch.library, CPU and CUDA kernels on the current stream, fake
kernels for torch.compile / meta tensors):

  taylor_ce_forward(logits, target, order, ignore_index, reduction) -> loss
      (fl_taylor_ce_forward_*)
  taylor_ce_fused(logits, target, grad?, order, ignore_index, reduction) -> dlogits
      (fl_taylor_ce_fused_*, loss NULL): the backward of taylor_ce_forward for the upstream
      gradient grad (fp32, N elements for reduction none, else 1; None = 1)
  taylor_ce_loss_and_grad(logits, target, order, ignore_index, reduction) -> (loss, dlogits)
      both in one fused call, dlogits for an upstream gradient of 1 (non-differentiable output)

  logits 2-D [N, C] float32 / float16 / bfloat16, unit column stride, row stride ld >= C; target [N]
  int32 / int64 contiguous; order 2 or 4; reduction 0 none / 1 mean / 2 sum (the fl_* numbers).
  Losses float32, [N] (none) or 0-d; dlogits of the logits' dtype and shape with the row stride ld
  (padding columns not written). No C call for N = 0 (none: empty, sum 0, mean NaN, as the header).

Autograd (as fusedloss.softmax_losses):
  * scalar reductions with logits that require grad: ONE C call in the forward
    (taylor_ce_loss_and_grad); backward scales the kept gradient by the real upstream gradient
    (eager: in place with fl_scale_rows, nothing moved for the usual loss.backward(); traced: a
    multiply). Eager backward may run only once; create_graph=True is refused.
  * reduction none, or logits that do not require grad: taylor_ce_forward in the forward (saves
    the inputs), taylor_ce_fused with the per-row upstream gradient in the backward.
  * double backward raises RuntimeError (use the PyTorch formulation, float64, for that).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _lib
from . import ops as _ops
from ._lib import REDUCTIONS, TargetOutOfRangeError, _check
from .autograd import kept_grad_loss, register_kept_grad_autograd
# generic row-layout helpers shared with the other softmax-family zoo ops
from .softmax_losses import (_after_cuda_call, _as_index, _check_grad, _check_reduction, _empty_result,
                             _fake_grad, _index_target, _new_grad, _rows_ld)
from .softmax_losses import _rows_layout as _layout

__all__ = ["taylor_cross_entropy", "TaylorCrossEntropyLoss", "taylor_ce_forward", "taylor_ce_fused",
           "taylor_ce_loss_and_grad"]

_DTYPES = {torch.float32: _lib.FL_DTYPE_F32, torch.float16: _lib.FL_DTYPE_F16,
           torch.bfloat16: _lib.FL_DTYPE_BF16}
_INDEX_DTYPES = {torch.int32: _lib.FL_INDEX_I32, torch.int64: _lib.FL_INDEX_I64}
_NONE = _lib.FL_REDUCTION_NONE
_F32 = torch.float32
_FN = "fusedloss.taylor_cross_entropy"
_ARGS = 3  # non-tensor arguments after (logits, target): order, ignore_index, reduction
_ORDERS = (2, 4)


# ---- argument checks (shared by the functional API, the op bodies and the fake kernels) -----------
def _check_order(fn, order):
    if isinstance(order, bool) or not isinstance(order, (int, float)) or order not in _ORDERS:
        raise ValueError(f"{fn}: order must be 2 or 4 (an even Taylor order: f > 0), got {order!r}")


def _check_opts(fn, order, reduction):
    _check_reduction(fn, reduction)
    _check_order(fn, order)


# ---- the C calls ---------------------------------------------------------------------------------
_opts_cache = {}  # (order, ignore_index, reduction, error flag address) -> (options struct, address)
_ws_cache = {}    # (N, C, dtype, reduction) -> bytes


def _options(key):
    return _lib.cached_struct(_opts_cache, _lib.taylor_options, key)


def _ws_bytes(key, addr):
    return _lib.cached_value(_ws_cache, key, lambda: _lib.taylor_ce_workspace_size(key[0], key[1], key[2], addr))


def _sym(name):
    """The bound C function (NotBuiltError if the loaded library has no such entry point)."""
    return _lib.entry_point(name, "Taylor softmax cross-entropy entry points (include/fusedloss.h section 14)")


def _run(kind, logits, target, grad, order, ignore_index, reduction):
    """kind 0: loss (forward); 1: dlogits for grad (fused, loss NULL); 2: (loss, dlogits) for an
    upstream gradient of 1 (fused, grad_loss NULL)."""
    op = ("taylor_ce_forward", "taylor_ce_fused", "taylor_ce_loss_and_grad")[kind]
    _check_opts(f"fusedloss::{op}", order, reduction)
    N, C, ld, dt, it = _layout(op, logits, target)
    dev = logits.device
    if dev.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"fusedloss::{op}: CPU and CUDA tensors only, got {dev}")
    if kind == 1 and grad is not None:
        _check_grad(op, grad, N if reduction == _NONE else 1, dev)
    loss = torch.empty((N,) if reduction == _NONE else (), dtype=_F32, device=dev) if kind != 1 else None
    dl = _new_grad(logits, ld) if kind != 0 else None
    if N == 0:
        return _empty_result(kind, loss, dl, reduction)
    cuda = dev.type == "cuda"
    if cuda and dev.index is not None and _ops._current_device() != dev.index:
        with torch.cuda.device(dev.index):
            return _run(kind, logits, target, grad, order, ignore_index, reduction)
    flag = _ops.flag_ptr(dev.index if dev.index is not None else _ops._current_device()) if cuda else 0
    opts = _options((int(order), int(ignore_index), int(reduction), flag))
    nbytes = _ws_bytes((N, C, dt, int(reduction)), opts[1])
    return _call_rows(kind, "fl_taylor_ce", _sym, logits, target, grad, loss, dl, N, C, ld, dt, it, opts[1], nbytes)


def _call_rows(kind, stem, sym, logits, target, grad, loss, dl, N, C, ld, dt, it, opts_addr, nbytes):
    """The C call of a row loss with the entry-point contract of header sections 14 / 15:
    <stem>_forward_<dev> (kind 0) or <stem>_fused_<dev> (kind 1: grad given; kind 2: grad NULL),
    with its workspace (none: 0 bytes, NULL) and, on CUDA, the current stream; returns the op's
    outputs (loss / dlogits / both)."""
    dev = logits.device
    cuda = dev.type == "cuda"
    wst = torch.empty(nbytes, dtype=torch.uint8, device=dev) if nbytes else None
    ws = wst.data_ptr() if wst is not None else None
    tail = (_ops.raw_stream_of(dev),) if cuda else ()
    sfx = "cuda" if cuda else "cpu"
    if kind == 0:
        name = f"{stem}_forward_{sfx}"
        st = sym(name)(loss.data_ptr(), logits.data_ptr(), ld, target.data_ptr(), it, N, C, dt, opts_addr,
                       ws, nbytes, *tail)
    else:
        name = f"{stem}_fused_{sfx}"
        gptr = grad.data_ptr() if (kind == 1 and grad is not None) else None
        st = sym(name)(loss.data_ptr() if loss is not None else None, dl.data_ptr(), logits.data_ptr(), ld,
                       target.data_ptr(), it, gptr, 1.0, N, C, dt, opts_addr, ws, nbytes, *tail)
    _check(st, name)
    if cuda:
        _after_cuda_call(dev)
    if kind == 0:
        return loss
    return dl if kind == 1 else (loss, dl)


# ---- custom ops ----------------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::taylor_ce_forward", mutates_args=(), device_types=("cpu", "cuda"))
def taylor_ce_forward(logits: Tensor, target: Tensor, order: int, ignore_index: int, reduction: int) -> Tensor:
    """The Taylor softmax cross-entropy (fl_taylor_ce_forward_*): fp32, [N] for reduction none, else 0-d."""
    return _run(0, logits, target, None, order, ignore_index, reduction)


@taylor_ce_forward.register_fake
def _(logits, target, order, ignore_index, reduction):
    _check_opts("fusedloss::taylor_ce_forward", order, reduction)
    N = _layout("taylor_ce_forward", logits, target)[0]
    return logits.new_empty((N,) if reduction == _NONE else (), dtype=_F32)


@torch.library.custom_op("fusedloss::taylor_ce_fused", mutates_args=(), device_types=("cpu", "cuda"))
def taylor_ce_fused(logits: Tensor, target: Tensor, grad: Optional[Tensor], order: int, ignore_index: int,
                    reduction: int) -> Tensor:
    """dlogits = grad * dloss/dlogits (fl_taylor_ce_fused_*, loss NULL); grad fp32 with N elements for
    reduction none, else 1 (None = 1). The logits' dtype, shape and row stride."""
    return _run(1, logits, target, grad, order, ignore_index, reduction)


@taylor_ce_fused.register_fake
def _(logits, target, grad, order, ignore_index, reduction):
    _check_opts("fusedloss::taylor_ce_fused", order, reduction)
    N, C, ld = _layout("taylor_ce_fused", logits, target)[:3]
    if grad is not None:
        _check_grad("taylor_ce_fused", grad, N if reduction == _NONE else 1, logits.device)
    return _fake_grad(logits, ld)


@torch.library.custom_op("fusedloss::taylor_ce_loss_and_grad", mutates_args=(), device_types=("cpu", "cuda"))
def taylor_ce_loss_and_grad(logits: Tensor, target: Tensor, order: int, ignore_index: int,
                            reduction: int) -> Tuple[Tensor, Tensor]:
    """(loss, dlogits) in one fl_taylor_ce_fused_* call, dlogits for an upstream gradient of 1."""
    return _run(2, logits, target, None, order, ignore_index, reduction)


@taylor_ce_loss_and_grad.register_fake
def _(logits, target, order, ignore_index, reduction):
    _check_opts("fusedloss::taylor_ce_loss_and_grad", order, reduction)
    N, C, ld = _layout("taylor_ce_loss_and_grad", logits, target)[:3]
    return logits.new_empty((N,) if reduction == _NONE else (), dtype=_F32), _fake_grad(logits, ld)


# ---- autograd (the zoo's shared registration: fusedloss.autograd) ----------------------------------
register_kept_grad_autograd(taylor_ce_forward, taylor_ce_fused, taylor_ce_loss_and_grad, "taylor_ce_fused",
                            "taylor_cross_entropy", 2, _ARGS, reduction_index=2 + _ARGS - 1)


# ---- the PyTorch formulation (float64 / other devices; the bench's eager baseline) -----------------
def _taylor_f(x, order):
    """f_n(x) = sum_{i <= n} x^i / i! (Horner)."""
    if order == 2:
        return 1 + x * (1 + 0.5 * x)
    return 1 + x * (1 + x * (0.5 + x * (1.0 / 6 + x * (1.0 / 24))))


def _taylor_torch(logits, target, order=2, ignore_index=-100, reduction="mean"):
    """Rows logits [N, C] (any floating dtype; 16-bit computed in float32), target [N]: f = 1 + x +
    x^2/2 (+ x^3/6 + x^4/24), log p = log f - log sum f, F.nll_loss; the loss in the logits' dtype.
    What one writes in PyTorch (bench/bench_taylor.py's eager baseline); differentiable."""
    x = logits.to(torch.promote_types(logits.dtype, _F32))
    f = _taylor_f(x, order)
    logp = f.log() - f.sum(-1, keepdim=True).log()
    return F.nll_loss(logp, target, ignore_index=ignore_index, reduction=reduction).to(logits.dtype)


def _taylor_reference(x, t, order, ignore_index, reduction):
    """The fallback: _taylor_torch with the header's "ignored rows are not read" (zeros there)."""
    keep = t != ignore_index
    x = torch.where(keep[:, None], x, torch.zeros((), dtype=x.dtype, device=x.device))
    return _taylor_torch(x, t, order, ignore_index, reduction)


def _check_targets(fn, t, C, ignore_index):
    bad = ((t < 0) | (t >= C)) & (t != ignore_index)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise TargetOutOfRangeError(f"{fn}: targets[{i}] = {int(t[i])} not in [0, C = {C}) and not ignore_index "
                                    f"({ignore_index})", _lib.FL_ERR_TARGET_OUT_OF_RANGE)


def _row_loss(fn, logits, target, opt, ignore_index, reduction, min_c, why, c_dtypes, c_devices, reference, ops,
              again):
    """The public functions' shared body (taylor_cross_entropy, large_margin_cross_entropy), after
    their option checks: [C] / [N, C] / [N, C, d1, ...] logits to rows [M, C] (the class dimension
    last), the PyTorch formulation reference(x, t, opt, ignore_index, reduction) for dtypes and
    devices the C op does not serve (c_dtypes, c_devices), else the C op: ops = (forward, loss_and_grad, run),
    the latter two when a gradient is needed for a scalar loss: run(x, t, *args) -> (loss, dlogits), the C
    call of loss_and_grad, in eager mode on plain tensors (autograd.kept_grad_loss: no custom-op dispatch).
    again(logits, target): the public function itself, for the unbatched [C] case. min_c / why: the
    class-count rule and its reason."""
    _index_target(fn, target, logits.device)
    if logits.dim() == 0:
        raise ValueError(f"{fn}: logits must be [N, C] or [N, C, d1, ...], got a 0-d tensor")
    if logits.dim() == 1:  # one unbatched sample [C], target [] (as F.cross_entropy)
        if target.dim() != 0:
            raise ValueError(f"{fn}: for logits of shape ({logits.shape[0]},) the target must be 0-d, got "
                             f"shape {tuple(target.shape)}")
        out = again(logits[None], target[None])
        return out.reshape(()) if reduction == "none" else out
    N, C = logits.shape[0], logits.shape[1]
    if C < min_c:
        raise ValueError(f"{fn}: the number of classes C (dimension 1) must be >= {min_c}{why}, got shape "
                         f"{tuple(logits.shape)}")
    want = (N,) + tuple(logits.shape[2:])
    if tuple(target.shape) != want:
        raise ValueError(f"{fn}: target shape {tuple(target.shape)} must be {want} (logits {tuple(logits.shape)} "
                         "are [N, C, d1, ...]: the class dimension is 1)")
    ignore_index = int(ignore_index)
    # rows [M, C]: the class dimension last (a copy for [N, C, d1, ...] maps)
    x = logits if logits.dim() == 2 else logits.movedim(1, -1).reshape(-1, C)
    t = target.reshape(-1)
    if logits.dtype not in c_dtypes or logits.device.type not in c_devices:
        if not torch.compiler.is_compiling() and x.device.type != "meta":
            _check_targets(fn, t, C, ignore_index)
        loss = reference(x, t, opt, ignore_index, reduction)
        return loss.reshape(target.shape) if reduction == "none" else loss
    if _rows_ld(x, C) is None:
        x = x.contiguous()
    t = _as_index(t)
    red = REDUCTIONS[reduction]
    args = (opt, ignore_index, red)
    if red != _NONE and logits.requires_grad and torch.is_grad_enabled():
        loss = kept_grad_loss((x, t), lambda: ops[2](x, t, *args), lambda: ops[1](x, t, *args), fn.rsplit(".", 1)[-1])
    else:
        loss = ops[0](x, t, *args)
        if red == _NONE:
            loss = loss.reshape(target.shape)
    return loss if loss.dtype == logits.dtype else loss.to(logits.dtype)


# ---- public API ------------------------------------------------------------------------------------
def taylor_cross_entropy(logits: Tensor, target: Tensor, order: int = 2, ignore_index: int = -100,
                         reduction: str = "mean") -> Tensor:
    r"""Taylor softmax cross-entropy (include/fusedloss.h section 14): pytorch-loss's
    ``TaylorCrossEntropyLoss`` (``TaylorSoftmax(n=order)`` then ``F.nll_loss`` of its log).

    ``logits``: ``[N, C]`` or ``[N, C, d1, d2, ...]`` (class dimension 1, as ``F.cross_entropy``; a
    single ``[C]`` sample with a 0-d target too), float32 / float16 / bfloat16 on CPU / CUDA (the C
    op; other dtypes and devices use the PyTorch formulation); ``target``: class indices ``[N]`` or
    ``[N, d1, ...]``. With f(x) = 1 + x + x^2/2 (order 2) or + x^3/6 + x^4/24 (order 4), the loss
    of a position is ``log sum_k f(x_k) - log f(x_y)``. Positions whose target is ``ignore_index``
    count 0. ``reduction``: ``'mean'`` (over positions not ignored; NaN if none), ``'sum'``,
    ``'none'`` (the target's shape). Returns the loss in the logits' dtype; gradient w.r.t. the
    logits. Works under torch.compile(fullgraph=True). Out-of-range targets raise
    TargetOutOfRangeError on CPU; on CUDA they give NaN and set the device error flag
    (fusedloss.check_errors())."""
    fn = _FN
    if not isinstance(logits, Tensor):
        raise TypeError(f"{fn}: logits must be a Tensor")
    if not logits.is_floating_point():
        raise TypeError(f"{fn}: logits must be a floating-point Tensor, got {logits.dtype}")
    _check_opts(fn, order, reduction)
    return _row_loss(fn, logits, target, int(order), ignore_index, reduction, 1, "", _DTYPES, ("cpu", "cuda"),
                     lambda x, t, *a: _taylor_reference(x, t.long(), *a),
                     (torch.ops.fusedloss.taylor_ce_forward, torch.ops.fusedloss.taylor_ce_loss_and_grad,
                      lambda x, t, *a: _run(2, x, t, None, *a)),
                     lambda x, t: taylor_cross_entropy(x, t, order, ignore_index, reduction))


class TaylorCrossEntropyLoss(torch.nn.Module):
    """Module form of fusedloss.taylor_cross_entropy: forward(logits, target) -> loss.

    order: 2 (default, pytorch-loss's module) or 4; ignore_index (default -100; pytorch-loss: -1);
    reduction ('mean' over positions not ignored, 'sum', 'none')."""

    def __init__(self, order: int = 2, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        _check_opts(f"fusedloss.{type(self).__name__}", order, reduction)
        self.order = int(order)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return taylor_cross_entropy(logits, target, self.order, self.ignore_index, self.reduction)

    def extra_repr(self) -> str:
        return f"order={self.order}, ignore_index={self.ignore_index}, reduction={self.reduction!r}"
