"""fusedloss.large_margin — the large-margin softmax cross-entropy (include/fusedloss.h section 15;
Kobayashi, BMVC'19; pytorch-loss's LargeMarginSoftmaxV1):

    loss = fusedloss.large_margin_cross_entropy(logits, target)              # lam 0.3, mean
    loss = fusedloss.large_margin_cross_entropy(seg_logits, seg_target, lam=0.5, ignore_index=255)
    criterion = fusedloss.LargeMarginSoftmaxLoss(lam=0.3)

Semantics: logits x [N, C] (or [N, C, d1, ...], the class dimension 1 as F.cross_entropy's; a
single [C] sample with a 0-d target too), C >= 2, class targets y [N] (or [N, d1, ...]). With q the
softmax over the C - 1 non-target logits (q_k = exp(x_k) / sum_{j != y} exp(x_j), k != y):

    l = (logsumexp(x) - x_y) + (lam / 2) sum_{k != y} (q_k - 1 / (C - 1)) log q_k

the cross-entropy plus a term that pushes the non-target distribution towards uniform (lam = 0:
exactly the cross-entropy). Positions whose target equals ignore_index count 0 and get a zero
gradient (their logits are not read). Reductions "none" (the target's shape), "sum", "mean" (over
the positions not ignored; NaN if none, gradient then 0). Defaults: lam 0.3 (pytorch-loss's) and
ignore_index -100 (PyTorch's; pytorch-loss's module uses 255: pass ignore_index=255 for that; its
reduction "none" also drops the ignored rows, this one keeps them as 0, in the target's shape).
Targets int32 / int64 (other integer dtypes are cast). The loss is returned in the logits' dtype
(computed in fp32 by CUDA, in double by the CPU backend; rounded once). Out-of-range targets (not
in [0, C) and not ignore_index): TargetOutOfRangeError (an IndexError) before anything is written
on CPU and on the PyTorch formulation in eager mode (a host sync on CUDA there: the check reads the
targets; under torch.compile that row's loss is NaN instead); on the CUDA C op that row's loss
and gradient are NaN and the device error flag is set (no host sync: fusedloss.check_errors();
debug mode: see fusedloss.ops), as fusedloss.taylor.

Paths:
  * CPU and CUDA tensors of float32 / float16 / bfloat16: the C op
    (fl_large_margin_ce_{forward,fused}_{cpu,cuda}: double on the CPU, fp32 on CUDA) through the
    custom ops below on rows [N, C] (unit column stride, row stride ld >= C: a 2-D row-strided view
    such as a column slice is passed as is; [N, C, d1, ...] maps are moved to [N * d1 * ..., C]
    rows, which copies; any other layout is made contiguous). CUDA tensors take the C op when the
    loaded library has the CUDA backend of section 15 (_C_DEVICES), else the PyTorch formulation.
  * Everything else (float64, other devices): the PyTorch formulation _large_margin_torch (the
    target masked with -inf, one log_softmax over the rest, its term zeroed; 16-bit inputs computed
    in float32), also the reference of the tests and the eager baseline of bench/bench_taylor.py.
    It is traceable by torch.compile(fullgraph=True) and differentiable to any order.

Custom ops (namespace "fusedloss"; torch.library, CPU and CUDA kernels on the current stream, fake
kernels for torch.compile / meta tensors):

  large_margin_ce_forward(logits, target, lam, ignore_index, reduction) -> loss
      (fl_large_margin_ce_forward_*)
  large_margin_ce_fused(logits, target, grad?, lam, ignore_index, reduction) -> dlogits
      (fl_large_margin_ce_fused_*, loss NULL): the backward of large_margin_ce_forward for the
      upstream gradient grad (fp32, N elements for reduction none, else 1; None = 1)
  large_margin_ce_loss_and_grad(logits, target, lam, ignore_index, reduction) -> (loss, dlogits)
      both in one fused call, dlogits for an upstream gradient of 1 (non-differentiable output)

  logits 2-D [N, C] float32 / float16 / bfloat16, C >= 2, unit column stride, row stride ld >= C;
  target [N] int32 / int64 contiguous; lam finite >= 0; reduction 0 none / 1 mean / 2 sum (the fl_*
  numbers). Losses float32, [N] (none) or 0-d; dlogits of the logits' dtype and shape with the row
  stride ld (padding columns not written). No C call for N = 0 (none: empty, sum 0, mean NaN).

Autograd (as fusedloss.taylor, through fusedloss.autograd.register_kept_grad_autograd):
  * scalar reductions with logits that require grad: ONE C call in the forward
    (large_margin_ce_loss_and_grad); backward scales the kept gradient by the real upstream
    gradient (eager: in place with fl_scale_rows; traced: a multiply). Eager backward may run only
    once; create_graph=True is refused.
  * reduction none, or logits that do not require grad: large_margin_ce_forward in the forward
    (saves the inputs), large_margin_ce_fused with the per-row upstream gradient in the backward.
  * double backward raises RuntimeError (use the PyTorch formulation, float64, for that).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib
from . import ops as _ops
from .autograd import register_kept_grad_autograd
from .taylor import _call_rows, _row_loss
# generic row-layout helpers shared with the other softmax-family zoo ops
from .softmax_losses import _check_grad, _check_reduction, _empty_result, _fake_grad, _finite, _new_grad
from .softmax_losses import _rows_layout

__all__ = ["large_margin_cross_entropy", "LargeMarginSoftmaxLoss", "large_margin_ce_forward",
           "large_margin_ce_fused", "large_margin_ce_loss_and_grad"]

_DTYPES = {torch.float32: _lib.FL_DTYPE_F32, torch.float16: _lib.FL_DTYPE_F16,
           torch.bfloat16: _lib.FL_DTYPE_BF16}
_NONE = _lib.FL_REDUCTION_NONE
_F32 = torch.float32
_FN = "fusedloss.large_margin_cross_entropy"
_ARGS = 3  # non-tensor arguments after (logits, target): lam, ignore_index, reduction


# ---- argument checks (shared by the functional API, the op bodies and the fake kernels) -----------
def _check_lam(fn, lam):
    if not (_finite(lam) and lam >= 0):  # finite also as the fp32 the options struct holds
        raise ValueError(f"{fn}: lam (the margin weight lambda) must be a finite number >= 0, got {lam!r}")


def _check_opts(fn, lam, reduction):
    _check_reduction(fn, reduction)
    _check_lam(fn, lam)


def _layout(op, logits, target):
    """_rows_layout plus section 15's C >= 2."""
    r = _rows_layout(op, logits, target)
    if r[1] < 2:
        raise ValueError(f"fusedloss::{op}: C must be >= 2 (q is a softmax over the C - 1 non-target classes), got "
                         f"shape {tuple(logits.shape)}")
    return r


# ---- the C calls ---------------------------------------------------------------------------------
_opts_cache = {}  # (lam, ignore_index, reduction, error flag address) -> (options struct, address)
_ws_cache = {}    # (N, C, dtype, reduction) -> bytes


def _options(key):
    return _lib.cached_struct(_opts_cache, _lib.large_margin_options, key)


def _ws_bytes(key, addr):
    return _lib.cached_value(_ws_cache, key,
                             lambda: _lib.large_margin_ce_workspace_size(key[0], key[1], key[2], addr))


def _sym(name):
    """The bound C function (NotBuiltError if the loaded library has no such entry point)."""
    return _lib.entry_point(name, "large-margin softmax cross-entropy entry points (include/fusedloss.h section 15)")


_CUDA_NAMES = ("fl_large_margin_ce_forward_cuda", "fl_large_margin_ce_fused_cuda")
# CUDA tensors run the C op when the library has the CUDA backend of section 15; else (a CPU-only
# build, an older library) the PyTorch formulation, as before the kernel existed
_C_DEVICES = (("cpu", "cuda") if _lib.cuda_built() and all(_lib.optional_symbol(n) is not None for n in _CUDA_NAMES)
              else ("cpu",))


def _run(kind, logits, target, grad, lam, ignore_index, reduction):
    """kind 0: loss (forward); 1: dlogits for grad (fused, loss NULL); 2: (loss, dlogits) for an
    upstream gradient of 1 (fused, grad_loss NULL)."""
    op = ("large_margin_ce_forward", "large_margin_ce_fused", "large_margin_ce_loss_and_grad")[kind]
    _check_opts(f"fusedloss::{op}", lam, reduction)
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
            return _run(kind, logits, target, grad, lam, ignore_index, reduction)
    flag = _ops.flag_ptr(dev.index if dev.index is not None else _ops._current_device()) if cuda else 0
    opts = _options((float(lam), int(ignore_index), int(reduction), flag))
    nbytes = _ws_bytes((N, C, dt, int(reduction)), opts[1])
    return _call_rows(kind, "fl_large_margin_ce", _sym, logits, target, grad, loss, dl, N, C, ld, dt, it, opts[1],
                      nbytes)


# ---- custom ops ----------------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::large_margin_ce_forward", mutates_args=(), device_types=("cpu", "cuda"))
def large_margin_ce_forward(logits: Tensor, target: Tensor, lam: float, ignore_index: int, reduction: int) -> Tensor:
    """The large-margin softmax cross-entropy (fl_large_margin_ce_forward_*): fp32, [N] for reduction
    none, else 0-d."""
    return _run(0, logits, target, None, lam, ignore_index, reduction)


@large_margin_ce_forward.register_fake
def _(logits, target, lam, ignore_index, reduction):
    _check_opts("fusedloss::large_margin_ce_forward", lam, reduction)
    N = _layout("large_margin_ce_forward", logits, target)[0]
    return logits.new_empty((N,) if reduction == _NONE else (), dtype=_F32)


@torch.library.custom_op("fusedloss::large_margin_ce_fused", mutates_args=(), device_types=("cpu", "cuda"))
def large_margin_ce_fused(logits: Tensor, target: Tensor, grad: Optional[Tensor], lam: float, ignore_index: int,
                          reduction: int) -> Tensor:
    """dlogits = grad * dloss/dlogits (fl_large_margin_ce_fused_*, loss NULL); grad fp32 with N
    elements for reduction none, else 1 (None = 1). The logits' dtype, shape and row stride."""
    return _run(1, logits, target, grad, lam, ignore_index, reduction)


@large_margin_ce_fused.register_fake
def _(logits, target, grad, lam, ignore_index, reduction):
    _check_opts("fusedloss::large_margin_ce_fused", lam, reduction)
    N, C, ld = _layout("large_margin_ce_fused", logits, target)[:3]
    if grad is not None:
        _check_grad("large_margin_ce_fused", grad, N if reduction == _NONE else 1, logits.device)
    return _fake_grad(logits, ld)


@torch.library.custom_op("fusedloss::large_margin_ce_loss_and_grad", mutates_args=(), device_types=("cpu", "cuda"))
def large_margin_ce_loss_and_grad(logits: Tensor, target: Tensor, lam: float, ignore_index: int,
                                  reduction: int) -> Tuple[Tensor, Tensor]:
    """(loss, dlogits) in one fl_large_margin_ce_fused_* call, dlogits for an upstream gradient of 1."""
    return _run(2, logits, target, None, lam, ignore_index, reduction)


@large_margin_ce_loss_and_grad.register_fake
def _(logits, target, lam, ignore_index, reduction):
    _check_opts("fusedloss::large_margin_ce_loss_and_grad", lam, reduction)
    N, C, ld = _layout("large_margin_ce_loss_and_grad", logits, target)[:3]
    return logits.new_empty((N,) if reduction == _NONE else (), dtype=_F32), _fake_grad(logits, ld)


# ---- autograd (the zoo's shared registration: fusedloss.autograd) ----------------------------------
register_kept_grad_autograd(large_margin_ce_forward, large_margin_ce_fused, large_margin_ce_loss_and_grad,
                            "large_margin_ce_fused", "large_margin_cross_entropy", 2, _ARGS,
                            reduction_index=2 + _ARGS - 1)


# ---- the PyTorch formulation (float64, other devices; the tests' and the bench's reference) --------
def _large_margin_torch(logits, target, lam=0.3, ignore_index=-100, reduction="mean"):
    """Rows logits [N, C] (C >= 2; any floating dtype, 16-bit computed in float32), target [N] integer:
    the header's loss in torch ops, in the logits' dtype; differentiable (to any order), traceable
    by torch.compile(fullgraph=True), no host sync. Ignored rows are not read (zeroed first): loss 0,
    gradient 0; an out-of-range target (the eager caller raises before this) gives that row NaN."""
    x = logits.to(torch.promote_types(logits.dtype, _F32))
    C = x.shape[1]
    t = target.long()
    keep = t != ignore_index
    bad = keep & ((t < 0) | (t >= C))
    tc = t.masked_fill(~keep | bad, 0)
    x = x.masked_fill(~keep[:, None], 0.0)
    # the cross-entropy: logsumexp(x) - x_y
    l = torch.logsumexp(x, 1) - x.gather(1, tc[:, None]).squeeze(1)
    if lam != 0:
        # q over the non-target classes: the target masked with -inf (q_y = exp(-inf) = 0 exactly, so
        # no gradient reaches it), its log q zeroed before the product (no 0 * inf)
        onehot = torch.arange(C, device=x.device) == tc[:, None]
        log_q = torch.log_softmax(x.masked_fill(onehot, float("-inf")), 1)
        q = log_q.exp()
        log_q = log_q.masked_fill(onehot, 0.0)
        l = l + (0.5 * float(lam)) * ((q - 1.0 / (C - 1)) * log_q).sum(1)
    l = l.masked_fill(bad, float("nan")).masked_fill(~keep, 0.0)
    if reduction == "sum":
        l = l.sum()
    elif reduction == "mean":
        l = l.sum() / keep.sum()  # NaN when every row is ignored (0 / 0), gradient then 0
    return l.to(logits.dtype)


# ---- public API ------------------------------------------------------------------------------------
def large_margin_cross_entropy(logits: Tensor, target: Tensor, lam: float = 0.3, ignore_index: int = -100,
                               reduction: str = "mean") -> Tensor:
    r"""Large-margin softmax cross-entropy (include/fusedloss.h section 15): pytorch-loss's
    ``LargeMarginSoftmaxV1`` (Kobayashi, BMVC'19).

    ``logits``: ``[N, C]`` or ``[N, C, d1, d2, ...]`` (class dimension 1, as ``F.cross_entropy``; a
    single ``[C]`` sample with a 0-d target too), C >= 2; ``target``: class indices ``[N]`` or
    ``[N, d1, ...]``. With q the softmax over the non-target logits, the loss of a position is
    ``CE + (lam / 2) * sum_{k != y} (q_k - 1 / (C - 1)) * log q_k`` (``lam`` finite >= 0; 0 gives
    the cross-entropy). Positions whose target is ``ignore_index`` count 0. ``reduction``:
    ``'mean'`` (over positions not ignored; NaN if none), ``'sum'``, ``'none'`` (the target's
    shape). Returns the loss in the logits' dtype; gradient w.r.t. the logits. float32 / float16 /
    bfloat16 on CPU / CUDA run the C op (double / fp32 inside); float64 and other devices (and CUDA
    with a library built without CUDA) run the PyTorch formulation. Works under
    torch.compile(fullgraph=True). Out-of-range targets raise TargetOutOfRangeError on CPU (and on
    the PyTorch formulation in eager mode); on CUDA they give NaN and set the device error flag
    (fusedloss.check_errors())."""
    fn = _FN
    if not isinstance(logits, Tensor):
        raise TypeError(f"{fn}: logits must be a Tensor")
    if not logits.is_floating_point():
        raise TypeError(f"{fn}: logits must be a floating-point Tensor, got {logits.dtype}")
    _check_opts(fn, lam, reduction)
    return _row_loss(fn, logits, target, float(lam), ignore_index, reduction, 2,
                     " (q is a softmax over the C - 1 non-target classes)", _DTYPES, _C_DEVICES,
                     _large_margin_torch,
                     (torch.ops.fusedloss.large_margin_ce_forward,
                      torch.ops.fusedloss.large_margin_ce_loss_and_grad,
                      lambda x, t, *a: _run(2, x, t, None, *a)),
                     lambda x, t: large_margin_cross_entropy(x, t, lam, ignore_index, reduction))


class LargeMarginSoftmaxLoss(torch.nn.Module):
    """Module form of fusedloss.large_margin_cross_entropy (pytorch-loss's LargeMarginSoftmaxV1):
    forward(logits, target) -> loss.

    lam (default 0.3, finite >= 0); ignore_index (default -100; pytorch-loss: 255); reduction ('mean'
    over positions not ignored, 'sum', 'none'). float32 / float16 / bfloat16 on CPU / CUDA run the C
    op; float64 runs the PyTorch formulation."""

    def __init__(self, lam: float = 0.3, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        _check_opts(f"fusedloss.{type(self).__name__}", lam, reduction)
        self.lam = float(lam)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return large_margin_cross_entropy(logits, target, self.lam, self.ignore_index, self.reduction)

    def extra_repr(self) -> str:
        return f"lam={self.lam}, ignore_index={self.ignore_index}, reduction={self.reduction!r}"
