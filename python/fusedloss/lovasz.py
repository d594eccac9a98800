"""Lovasz-softmax loss (Berman et al.; include/fusedloss.h section 13): a surrogate of the mean IoU
for semantic segmentation.

    loss = fusedloss.lovasz_softmax(probas, labels)                      # [N, C, H, W], [N, H, W]
    loss = fusedloss.lovasz_softmax(logits, labels, from_logits=True, per_image=True)
    criterion = fusedloss.LovaszSoftmaxLoss(classes="all")

Semantics (Berman's / mmseg's lovasz_softmax): per class c over a set of valid pixels (the whole
batch, or each image with per_image), errors e = |[y == c] - p_c| sorted in decreasing order (ties:
increasing pixel index n * d + k), loss_c = sum_k e_(k) (J_k - J_{k-1}) with J Berman's lovasz_grad
(1 - intersection / union of the cumulative sums). classes="present" averages the classes present
in the set (none: 0), "all" every class (an absent class contributes max p_c). per_image: mean over
the images (an image without valid pixels counts 0). Pixels labelled ignore_index are dropped; no
valid pixel at all: loss 0, gradient 0.

Paths:
  * CPU and CUDA tensors of float32 / float16 / bfloat16: the C op
    (fl_lovasz_softmax_{forward,fused}_{cpu,cuda}) through the custom ops below; with a gradient
    needed, one fused call forms the loss and its gradient (upstream 1) in the forward, scaled in
    the backward (fusedloss.ops.run_scale_rows in eager; a plain multiply when traced by
    torch.compile). On CUDA an out-of-range label does not raise (no host synchronisation): the loss
    is NaN and the device error flag is set (fusedloss.ops.check_errors raises; debug mode checks
    after every call). CPU raises TargetOutOfRangeError.
  * Everything else (float64, other devices): a PyTorch formulation of the same semantics
    (_lovasz_reference): each class's errors as rows of a contiguous [C, P] tensor sorted along the
    last dim with torch.sort(dim=1, descending=True, stable=True) (stable: the pixel-index tie order
    of the header), Berman's cumsum-based lovasz_grad, autograd through the sort. It is also the
    PyTorch baseline of bench/bench_lovasz.py.

Custom ops (torch.library, CPU and CUDA; fake kernels for torch.compile / meta tensors):
  lovasz_softmax_forward(input, labels, classes, per_image, from_logits, ignore_index) -> loss
  lovasz_softmax_fused(input, labels, grad?, classes, per_image, from_logits, ignore_index) -> dinput
  lovasz_softmax_loss_and_grad(input, labels, classes, per_image, from_logits, ignore_index)
      -> (loss, dinput)
input: contiguous [N, C, d] (float32 / float16 / bfloat16), labels contiguous [N, d] int32 / int64;
loss fp32 0-d; dinput the input's dtype and shape.
"""
import math
from typing import Optional

import torch
from torch import Tensor

from . import _lib
from . import ops as _ops
from ._lib import LOVASZ_CLASSES, TargetOutOfRangeError, _check
from .autograd import kept_grad_loss, register_kept_grad_autograd

__all__ = ["lovasz_softmax", "LovaszSoftmaxLoss", "lovasz_softmax_forward", "lovasz_softmax_fused",
           "lovasz_softmax_loss_and_grad"]

_DTYPES = {torch.float32: _lib.FL_DTYPE_F32, torch.float16: _lib.FL_DTYPE_F16,
           torch.bfloat16: _lib.FL_DTYPE_BF16}
_INDEX_DTYPES = {torch.int32: _lib.FL_INDEX_I32, torch.int64: _lib.FL_INDEX_I64}
_F32 = torch.float32
_FN = "fusedloss.lovasz_softmax"
_ARGS = 4  # non-tensor arguments after (input, labels): classes, per_image, from_logits, ignore_index


def _classes_code(classes, fn=_FN):
    if isinstance(classes, str) and classes in LOVASZ_CLASSES:
        return LOVASZ_CLASSES[classes]
    raise ValueError(f"{fn}: classes must be 'present' or 'all', got {classes!r} (a list of class ids is not "
                     "supported)")


def _layout(op, x, labels):
    """Validate the custom ops' tensors: (N, C, d, dtype code, index dtype code)."""
    if x.dim() != 3:
        raise ValueError(f"fusedloss::{op}: input must be 3-D [N, C, d], got shape {tuple(x.shape)}")
    dt = _DTYPES.get(x.dtype)
    if dt is None:
        raise TypeError(f"fusedloss::{op}: input dtype {x.dtype} not supported (float32, float16, bfloat16)")
    N, C, d = x.shape
    if C < 1 or d < 1:
        raise ValueError(f"fusedloss::{op}: C and d must be >= 1, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"fusedloss::{op}: input must be contiguous")
    if tuple(labels.shape) != (N, d):
        raise ValueError(f"fusedloss::{op}: labels must have shape {(N, d)}, got {tuple(labels.shape)}")
    it = _INDEX_DTYPES.get(labels.dtype)
    if it is None:
        raise TypeError(f"fusedloss::{op}: labels dtype {labels.dtype} not supported (int64, int32)")
    if labels.device != x.device:
        raise ValueError(f"fusedloss::{op}: labels are on {labels.device}, the input on {x.device}")
    if not labels.is_contiguous():
        raise ValueError(f"fusedloss::{op}: labels must be contiguous")
    return N, C, d, dt, it


def _check_opts(op, classes):
    if classes not in (0, 1):
        raise ValueError(f"fusedloss::{op}: classes must be 0 (present) or 1 (all), got {classes}")


_opts_cache = {}


def _options(key):
    return _lib.cached_struct(_opts_cache, _lib.lovasz_options, key)


_ws_cache = {}


def _ws_bytes(key, opts_addr, cuda):
    """The workspace size for (N, C, d, dtype, options key, device index), cached (the CUDA query
    asks CUB for its scratch size on the host)."""
    return _lib.cached_value(_ws_cache, key, lambda: _lib.lovasz_softmax_workspace_size(*key[:4], opts_addr,
                                                                                         cuda=cuda), limit=256)


def _run(kind, x, labels, grad, classes, per_image, from_logits, ignore_index):
    """kind 0: loss (forward); 1: dinput for grad (fused, loss NULL); 2: (loss, dinput) for an
    upstream gradient of 1 (fused, grad_loss NULL)."""
    op = ("lovasz_softmax_forward", "lovasz_softmax_fused", "lovasz_softmax_loss_and_grad")[kind]
    _check_opts(op, classes)
    N, C, d, dt, it = _layout(op, x, labels)
    dev = x.device
    if dev.type not in ("cpu", "cuda"):
        raise NotImplementedError(f"fusedloss::{op}: CPU and CUDA tensors only, got {dev}")
    if kind == 1 and grad is not None:
        if grad.dtype != _F32 or grad.numel() != 1 or grad.device != dev:
            raise ValueError(f"fusedloss::{op}: grad must be float32 with 1 element on {dev}, got "
                             f"{grad.dtype} {tuple(grad.shape)} on {grad.device}")
        grad = grad.contiguous()
    # the C op writes the loss (no fill kernel on the step's critical path); N = 0 returns 0 here
    loss = torch.empty((), dtype=_F32, device=dev) if kind != 1 else None
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if kind != 0 else None
    if N == 0:
        if loss is not None:
            loss.zero_()
        return loss if kind == 0 else (dx if kind == 1 else (loss, dx))
    cuda = dev.type == "cuda"
    # (the host's time before the first kernel is part of a synchronised step: s21 run 3 measured ~0.13 ms of
    # Python in the Lovasz step, so the device and the stream come from ops' light getters, as the CE's)
    if cuda and dev.index is not None and _ops._current_device() != dev.index:
        with torch.cuda.device(dev.index):
            return _run(kind, x, labels, grad, classes, per_image, from_logits, ignore_index)
    idx = (dev.index if dev.index is not None else _ops._current_device()) if cuda else -1
    flag = _ops.flag_ptr(idx) if cuda else 0
    opts = _options((int(classes), bool(per_image), bool(from_logits), int(ignore_index), flag))
    nbytes = _ws_bytes((N, C, d, dt, int(classes), bool(per_image), bool(from_logits), idx), opts[1], cuda)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    tail = (_ops._raw_stream(idx),) if cuda else ()
    sfx = "cuda" if cuda else "cpu"
    if kind == 0:
        name = f"fl_lovasz_softmax_forward_{sfx}"
        st = _lib._optional_fn(name, "Lovasz-softmax")(loss.data_ptr(), x.data_ptr(), C * d, labels.data_ptr(),
                                                       it, N, C, d, dt, opts[1], ws.data_ptr(), nbytes, *tail)
    else:
        name = f"fl_lovasz_softmax_fused_{sfx}"
        gptr = grad.data_ptr() if (kind == 1 and grad is not None) else None
        st = _lib._optional_fn(name, "Lovasz-softmax")(loss.data_ptr() if loss is not None else None,
                                                       dx.data_ptr(), x.data_ptr(), C * d, labels.data_ptr(), it,
                                                       gptr, 1.0, N, C, d, dt, opts[1], ws.data_ptr(), nbytes,
                                                       *tail)
    _check(st, name)
    if cuda and _ops.is_debug() and not torch.cuda.is_current_stream_capturing():
        _ops.check_errors(dev)  # synchronises; raises TargetOutOfRangeError if the flag was set
    if kind == 0:
        return loss
    return dx if kind == 1 else (loss, dx)


# ---- custom ops ----------------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::lovasz_softmax_forward", mutates_args=(), device_types=("cpu", "cuda"))
def lovasz_softmax_forward(input: Tensor, labels: Tensor, classes: int, per_image: bool, from_logits: bool,
                           ignore_index: int) -> Tensor:
    """The Lovasz-softmax loss (fl_lovasz_softmax_forward_cpu): fp32, 0-d."""
    return _run(0, input, labels, None, classes, per_image, from_logits, ignore_index)


@lovasz_softmax_forward.register_fake
def _(input, labels, classes, per_image, from_logits, ignore_index):
    _check_opts("lovasz_softmax_forward", classes)
    _layout("lovasz_softmax_forward", input, labels)
    return input.new_empty((), dtype=_F32)


@torch.library.custom_op("fusedloss::lovasz_softmax_fused", mutates_args=(), device_types=("cpu", "cuda"))
def lovasz_softmax_fused(input: Tensor, labels: Tensor, grad: Optional[Tensor], classes: int, per_image: bool,
                         from_logits: bool, ignore_index: int) -> Tensor:
    """dinput = grad * dloss/dinput (fl_lovasz_softmax_fused_cpu, loss NULL); grad fp32 [1] / 0-d or None (1)."""
    return _run(1, input, labels, grad, classes, per_image, from_logits, ignore_index)


@lovasz_softmax_fused.register_fake
def _(input, labels, grad, classes, per_image, from_logits, ignore_index):
    _check_opts("lovasz_softmax_fused", classes)
    _layout("lovasz_softmax_fused", input, labels)
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.custom_op("fusedloss::lovasz_softmax_loss_and_grad", mutates_args=(), device_types=("cpu", "cuda"))
def lovasz_softmax_loss_and_grad(input: Tensor, labels: Tensor, classes: int, per_image: bool, from_logits: bool,
                                 ignore_index: int) -> tuple[Tensor, Tensor]:
    """(loss, dinput) in one fl_lovasz_softmax_fused_cpu call, dinput for an upstream gradient of 1."""
    return _run(2, input, labels, None, classes, per_image, from_logits, ignore_index)


@lovasz_softmax_loss_and_grad.register_fake
def _(input, labels, classes, per_image, from_logits, ignore_index):
    _check_opts("lovasz_softmax_loss_and_grad", classes)
    _layout("lovasz_softmax_loss_and_grad", input, labels)
    return input.new_empty((), dtype=_F32), torch.empty_like(input, memory_format=torch.contiguous_format)


# ---- autograd (the zoo's shared registration: fusedloss.autograd) ----------------------------------
register_kept_grad_autograd(lovasz_softmax_forward, lovasz_softmax_fused, lovasz_softmax_loss_and_grad,
                            "lovasz_softmax_fused", "lovasz_softmax", 2, _ARGS)


# ---- the PyTorch formulation (float64 / other devices; the bench's PyTorch baseline) -------------------
def _flat(p, y, C, all_classes):
    """Loss of one set: p [C, V] (rows contiguous), y [V] valid labels in pixel-index order."""
    if p.shape[1] == 0:
        return p.sum() * 0
    fg = (y[None, :] == torch.arange(C, device=p.device)[:, None]).to(p.dtype)   # [C, V]
    # e = |fg - p| with the header's derivative (fg ? -1 : +1) also where e == 0 (p == fg exactly:
    # autograd's abs'(0) = 0 would drop those pixels' gradient, unlike the C op)
    sgn = 1 - 2 * fg
    e = (fg - p).abs().detach() + sgn * (p - p.detach())
    e_sorted, perm = torch.sort(e, dim=1, descending=True, stable=True)           # ties: pixel index
    fg_sorted = fg.gather(1, perm)
    G = fg.sum(1, keepdim=True)
    inter = G - fg_sorted.cumsum(1)
    union = G + (1 - fg_sorted).cumsum(1)
    J = 1 - inter / union
    D = torch.cat([J[:, :1], J[:, 1:] - J[:, :-1]], dim=1)                          # Berman's lovasz_grad
    loss_c = (e_sorted * D).sum(1)
    if all_classes:
        return loss_c.mean()
    present = G[:, 0] > 0
    return loss_c[present].mean() if bool(present.any()) else p.sum() * 0


def _lovasz_reference(x, labels, classes, per_image, ignore_index, from_logits):
    """x [N, C, d], labels [N, d]: the loss in the compute dtype (float32 at least)."""
    N, C, d = x.shape
    cdt = torch.promote_types(x.dtype, _F32)
    p = x.to(cdt)
    if from_logits:
        p = torch.softmax(p, dim=1)
    y = labels.long()
    all_classes = classes == _lib.FL_LOVASZ_ALL
    if N == 0:
        return p.sum() * 0
    if not per_image:
        pc = p.permute(1, 0, 2).reshape(C, N * d)   # pixel index n * d + k
        yf = y.reshape(-1)
        valid = yf != ignore_index
        return _flat(pc[:, valid].contiguous(), yf[valid], C, all_classes)
    losses = []
    for n in range(N):
        valid = y[n] != ignore_index
        losses.append(_flat(p[n][:, valid].contiguous(), y[n][valid], C, all_classes))
    return torch.stack(losses).mean()


def _check_labels(y, C, ignore_index):
    bad = ((y < 0) | (y >= C)) & (y != ignore_index)
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0, 0])
        raise TargetOutOfRangeError(f"{_FN}: labels[{i}] = {int(y.reshape(-1)[i])} not in [0, C = {C}) and not "
                                    f"ignore_index ({ignore_index})", _lib.FL_ERR_TARGET_OUT_OF_RANGE)


# ---- public API ------------------------------------------------------------------------------------
def lovasz_softmax(probas_or_logits: Tensor, labels: Tensor, classes: str = "present", per_image: bool = False,
                   ignore_index: int = -100, from_logits: bool = False) -> Tensor:
    r"""Lovasz-softmax loss (include/fusedloss.h section 13; Berman et al., mmseg's
    ``lovasz_softmax``).

    ``probas_or_logits``: ``[N, C, H, W]`` (or ``[N, C, d1, ...]``, ``[N, C]``): probabilities
    (the caller's softmax over dim 1), or logits with ``from_logits=True`` (softmax inside).
    ``labels``: ``[N, H, W]`` class indices (int32 / int64); ``ignore_index`` pixels are dropped.
    ``classes``: ``'present'`` (average over the classes present; default) or ``'all'``.
    ``per_image``: mean of per-image losses instead of one loss over the batch. Returns a 0-d loss
    in the input's dtype; differentiable w.r.t. the input. CPU and CUDA float32 / float16 / bfloat16
    run the C op (torch.compile(fullgraph=True) works; on CUDA an out-of-range label gives a NaN loss
    and sets the device error flag instead of raising); other dtypes and devices run the PyTorch
    formulation."""
    fn = _FN
    x = probas_or_logits
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"{fn}: the input must be a floating-point Tensor")
    if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex() \
            or labels.dtype == torch.bool:
        raise TypeError(f"{fn}: labels must be an integer Tensor (class indices)")
    if labels.device != x.device:
        raise ValueError(f"{fn}: labels are on {labels.device}, the input on {x.device}")
    cls = _classes_code(classes)
    if x.dim() < 2:
        raise ValueError(f"{fn}: the input must be [N, C, d1, ...], got shape {tuple(x.shape)}")
    N, C = x.shape[0], x.shape[1]
    if C < 1:
        raise ValueError(f"{fn}: the number of classes C (dimension 1) must be >= 1, got shape {tuple(x.shape)}")
    spatial = tuple(x.shape[2:])
    if tuple(labels.shape) != (N,) + spatial:
        raise ValueError(f"{fn}: labels shape {tuple(labels.shape)} must be {(N,) + spatial} (input "
                         f"{tuple(x.shape)} is [N, C, d1, ...])")
    d = math.prod(spatial)
    ignore_index = int(ignore_index)
    per_image, from_logits = bool(per_image), bool(from_logits)
    if d == 0:
        return (x.sum() * 0).to(x.dtype)
    x3 = x.reshape(N, C, d)
    y = labels.reshape(N, d)
    if x.device.type not in ("cpu", "cuda") or x.dtype not in _DTYPES:
        if not torch.compiler.is_compiling():
            _check_labels(y, C, ignore_index)
        loss = _lovasz_reference(x3, y, cls, per_image, ignore_index, from_logits)
        return loss.to(x.dtype)
    x3 = x3.contiguous()
    if y.dtype not in _INDEX_DTYPES:
        y = y.long()
    y = y.contiguous()
    args = (cls, per_image, from_logits, ignore_index)
    if x.requires_grad and torch.is_grad_enabled():
        loss = kept_grad_loss((x3, y), lambda: _run(2, x3, y, None, *args),
                              lambda: torch.ops.fusedloss.lovasz_softmax_loss_and_grad(x3, y, *args), "lovasz_softmax")
    else:
        loss = torch.ops.fusedloss.lovasz_softmax_forward(x3, y, *args)
    return loss if loss.dtype == x.dtype else loss.to(x.dtype)


class LovaszSoftmaxLoss(torch.nn.Module):
    """Module form of fusedloss.lovasz_softmax: forward(probas_or_logits, labels) -> loss."""

    def __init__(self, classes: str = "present", per_image: bool = False, ignore_index: int = -100,
                 from_logits: bool = False):
        super().__init__()
        _classes_code(classes, fn=f"fusedloss.{type(self).__name__}")
        self.classes = classes
        self.per_image = bool(per_image)
        self.ignore_index = int(ignore_index)
        self.from_logits = bool(from_logits)

    def forward(self, probas_or_logits: Tensor, labels: Tensor) -> Tensor:
        return lovasz_softmax(probas_or_logits, labels, classes=self.classes, per_image=self.per_image,
                              ignore_index=self.ignore_index, from_logits=self.from_logits)

    def extra_repr(self) -> str:
        return (f"classes={self.classes!r}, per_image={self.per_image}, ignore_index={self.ignore_index}, "
                f"from_logits={self.from_logits}")
