"""fusedloss.nn — torch.nn modules backed by the fused kernels (layer 5, STYLE.md section 7).

Swapping ``torch.nn.CrossEntropyLoss`` for ``fusedloss.nn.CrossEntropyLoss`` (or ``torch.nn.GELU``
for ``fusedloss.nn.GELU``) is the whole migration; ``print(model)`` shows ``...(fused, ...)``.
``BiasGELU`` takes over the bias of the Linear before a GeLU: ``Linear(bias=False) -> BiasGELU``
computes the same as ``Linear -> GELU`` with the bias add and its gradient fused into the GeLU.
``LinearCrossEntropyLoss`` is the lm head and its loss in one: ``loss(hidden, lm_head.weight,
target)`` equals ``CrossEntropyLoss()(lm_head(hidden), target)`` without the [N, V] logits.
"""
import math
import numbers

import torch
from torch import Tensor

from .functional import cross_entropy, gelu, linear_cross_entropy
from .functional import _ce_options, _positive_int_or_none

def _finite(v):
    # comparisons, not math.isfinite: they also work on the SymFloats of torch.compile(dynamic=True)
    return -math.inf < v < math.inf


__all__ = ["CrossEntropyLoss", "LinearCrossEntropyLoss", "GELU", "BiasGELU", "MMCVSigmoidFocalLoss"]


def _check_offset(cls, logit_offset, dim):
    """The constructor check of a logit_offset argument: None or a 1-D floating tensor."""
    if logit_offset is None:
        return
    if not isinstance(logit_offset, Tensor):
        raise TypeError(f"{cls}: logit_offset must be a Tensor or None, got {type(logit_offset).__name__}")
    if logit_offset.dim() != 1 or not logit_offset.is_floating_point():
        raise ValueError(f"{cls}: logit_offset must be a 1-D floating tensor ({dim},), got "
                         f"{logit_offset.dtype} of shape {tuple(logit_offset.shape)}")


class CrossEntropyLoss(torch.nn.Module):
    r"""Fused drop-in for :class:`torch.nn.CrossEntropyLoss`.

    Same constructor arguments, in the same order: ``weight``, ``size_average``,
    ``ignore_index``, ``reduce``, ``reduction``, ``label_smoothing``; the deprecated
    ``size_average`` / ``reduce`` are translated into ``reduction`` with torch's own rule and
    warning. Keyword-only extensions: ``z_loss``, ``softcap``, ``logit_scale``, ``logit_offset``,
    ``inplace_backward`` (see :func:`fusedloss.cross_entropy`). ``weight`` is a buffer, as in
    torch, so it follows ``.to(device)``; so is ``logit_offset`` ((C,), a per-class logit offset
    added after softcap: loss = F.cross_entropy(softcap(s*x) + logit_offset, ...); logit
    adjustment (Menon et al. 2021) uses tau * log(class prior)).

    Bad arguments raise ValueError / TypeError at construction, naming the argument.
    forward(input, target) returns a float32 loss; shapes as in torch.
    """

    __constants__ = ["ignore_index", "reduction", "label_smoothing"]

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0, *, z_loss=0.0, softcap=None,
                 logit_scale=1.0, logit_offset=None, inplace_backward=False):
        super().__init__()
        if size_average is not None or reduce is not None:
            from torch.nn import _reduction
            reduction = _reduction.legacy_get_string(size_average, reduce)  # warns, as torch
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"CrossEntropyLoss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
            raise TypeError(f"CrossEntropyLoss: ignore_index must be an int, got {ignore_index!r}")
        ignore_index = int(ignore_index)
        label_smoothing = float(label_smoothing)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be in [0, 1], got {label_smoothing}")
        z_loss = float(z_loss)
        if not (z_loss >= 0.0 and _finite(z_loss)):
            raise ValueError(f"CrossEntropyLoss: z_loss must be finite and >= 0, got {z_loss}")
        if softcap is not None:
            softcap = float(softcap)
            if not (softcap > 0.0 and _finite(softcap)):
                raise ValueError(f"CrossEntropyLoss: softcap must be None or finite and > 0, got {softcap}")
        logit_scale = float(logit_scale)
        if not (_finite(logit_scale) and logit_scale != 0.0):
            raise ValueError(f"CrossEntropyLoss: logit_scale must be finite and nonzero, got {logit_scale}")
        if weight is not None:
            if not isinstance(weight, Tensor):
                raise TypeError(f"CrossEntropyLoss: weight must be a Tensor or None, got {type(weight).__name__}")
            if weight.dim() != 1 or not weight.is_floating_point():
                raise ValueError(f"CrossEntropyLoss: weight must be a 1-D floating tensor (C,), "
                                 f"got {weight.dtype} of shape {tuple(weight.shape)}")
        _check_offset("CrossEntropyLoss", logit_offset, "C")
        self.register_buffer("weight", weight)
        self.register_buffer("logit_offset", logit_offset)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap
        self.logit_scale = logit_scale
        self.inplace_backward = bool(inplace_backward)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing,
                             z_loss=self.z_loss, softcap=self.softcap,
                             logit_scale=self.logit_scale, logit_offset=self.logit_offset,
                             inplace_backward=self.inplace_backward)

    def extra_repr(self):
        s = f"fused, reduction={self.reduction!r}, ignore_index={self.ignore_index}"
        if self.weight is not None:
            s += f", weight=({self.weight.shape[0]},)"
        if self.label_smoothing:
            s += f", label_smoothing={self.label_smoothing}"
        if self.z_loss:
            s += f", z_loss={self.z_loss}"
        if self.softcap is not None:
            s += f", softcap={self.softcap}"
        if self.logit_scale != 1.0:
            s += f", logit_scale={self.logit_scale}"
        if self.logit_offset is not None:
            s += f", logit_offset=({self.logit_offset.shape[0]},)"
        if self.inplace_backward:
            s += ", inplace_backward=True"
        return s


class LinearCrossEntropyLoss(torch.nn.Module):
    r"""Fused ``F.cross_entropy(F.linear(hidden, weight, bias), target)``: the lm head and its loss
    without the [N, V] logits (see :func:`fusedloss.linear_cross_entropy`).

    The module holds the loss options only; the head's parameters are passed to forward, so a
    model keeps its own ``lm_head`` (and weight tying)::

        criterion = fusedloss.nn.LinearCrossEntropyLoss(ignore_index=-100)
        loss = criterion(hidden, model.lm_head.weight, labels)      # hidden (..., H), labels (...)

    Constructor: ``ignore_index``, ``reduction``, ``label_smoothing`` (as torch's
    CrossEntropyLoss), keyword-only ``class_weight`` ((V,), a buffer: it follows ``.to()``),
    ``z_loss``, ``softcap``, ``logit_scale``, ``logit_offset`` ((V,), a buffer too: the per-class
    logit offset added after softcap; logit adjustment uses tau * log(class prior)),
    ``chunk_rows``, ``byte_budget``, ``wgrad_accum``, ``recompute``. Bad values raise ValueError /
    TypeError here, naming the argument.
    forward(hidden, weight, target, bias=None) -> float32 loss.
    """

    __constants__ = ["ignore_index", "reduction", "label_smoothing"]

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0, *,
                 class_weight=None, z_loss=0.0, softcap=None, logit_scale=1.0, logit_offset=None,
                 chunk_rows=None, byte_budget=None, wgrad_accum="auto", recompute=None):
        super().__init__()
        name = "LinearCrossEntropyLoss"
        _ce_options(name, reduction, ignore_index, label_smoothing, z_loss, softcap, logit_scale)
        if class_weight is not None:
            if not isinstance(class_weight, Tensor):
                raise TypeError(f"{name}: class_weight must be a Tensor or None, got "
                                f"{type(class_weight).__name__}")
            if class_weight.dim() != 1 or not class_weight.is_floating_point():
                raise ValueError(f"{name}: class_weight must be a 1-D floating tensor (V,), got "
                                 f"{class_weight.dtype} of shape {tuple(class_weight.shape)}")
        self.chunk_rows = _positive_int_or_none(name, "chunk_rows", chunk_rows)
        self.byte_budget = _positive_int_or_none(name, "byte_budget", byte_budget)
        if wgrad_accum not in ("auto", "fp32", "lean"):
            raise ValueError(f"{name}: wgrad_accum must be 'auto', 'fp32' or 'lean', got {wgrad_accum!r}")
        if recompute is not None and not isinstance(recompute, bool):
            raise TypeError(f"{name}: recompute must be None, True or False, got {recompute!r}")
        if recompute is False and reduction == "none":
            raise ValueError(f"{name}: reduction='none' needs recompute=True or None")
        _check_offset(name, logit_offset, "V")
        self.register_buffer("class_weight", class_weight)
        self.register_buffer("logit_offset", logit_offset)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.label_smoothing = float(label_smoothing)
        self.z_loss = float(z_loss)
        self.softcap = None if softcap is None else float(softcap)
        self.logit_scale = float(logit_scale)
        self.wgrad_accum = wgrad_accum
        self.recompute = recompute

    def forward(self, hidden: Tensor, weight: Tensor, target: Tensor, bias=None) -> Tensor:
        return linear_cross_entropy(hidden, weight, target, bias, ignore_index=self.ignore_index,
                                    reduction=self.reduction, label_smoothing=self.label_smoothing,
                                    class_weight=self.class_weight, z_loss=self.z_loss,
                                    softcap=self.softcap, logit_scale=self.logit_scale,
                                    logit_offset=self.logit_offset, chunk_rows=self.chunk_rows,
                                    byte_budget=self.byte_budget,
                                    wgrad_accum=self.wgrad_accum, recompute=self.recompute)

    def extra_repr(self):
        s = f"fused linear+CE, reduction={self.reduction!r}, ignore_index={self.ignore_index}"
        if self.class_weight is not None:
            s += f", class_weight=({self.class_weight.shape[0]},)"
        for k in ("label_smoothing", "z_loss"):
            if getattr(self, k):
                s += f", {k}={getattr(self, k)}"
        if self.softcap is not None:
            s += f", softcap={self.softcap}"
        if self.logit_scale != 1.0:
            s += f", logit_scale={self.logit_scale}"
        if self.logit_offset is not None:
            s += f", logit_offset=({self.logit_offset.shape[0]},)"
        for k in ("chunk_rows", "byte_budget", "recompute"):
            if getattr(self, k) is not None:
                s += f", {k}={getattr(self, k)}"
        if self.wgrad_accum != "auto":
            s += f", wgrad_accum={self.wgrad_accum!r}"
        return s


def _check_approximate(cls, approximate):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{cls}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


class GELU(torch.nn.Module):
    r"""Fused drop-in for :class:`torch.nn.GELU`: same constructor (``approximate='none'``, torch's
    default, or ``'tanh'``), same results (PyTorch's float32 formulas); see
    :func:`fusedloss.gelu`."""

    __constants__ = ["approximate"]

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = _check_approximate("GELU", approximate)

    def forward(self, input: Tensor) -> Tensor:
        return gelu(input, None, self.approximate)

    def extra_repr(self):
        return f"fused, approximate={self.approximate!r}"


class BiasGELU(torch.nn.Module):
    r"""``gelu(input + bias)`` with a learnable bias of ``features`` entries, fused (forward one
    pass; backward one pass that also sums the bias gradient over the rows).

    Replaces the bias of the Linear in front of a GeLU::

        nn.Linear(768, 3072) -> nn.GELU()      ==   nn.Linear(768, 3072, bias=False) -> BiasGELU(3072)

    or, for an existing pair, ``act = BiasGELU.from_linear(linear, approximate=...)``, which moves
    the linear's bias Parameter into the new module (and sets ``linear.bias = None``).
    ``approximate``: ``'none'`` (torch.nn.GELU's default) or ``'tanh'``. The bias is initialised
    to zeros unless given (``from_linear`` keeps the trained/initialised values). ``device`` and
    ``dtype`` as for torch modules; an fp32 bias with bf16/fp16 activations (autocast) is used as
    it is, and its gradient is fp32.
    """

    __constants__ = ["features", "approximate"]

    def __init__(self, features: int, approximate: str = "none", device=None, dtype=None) -> None:
        super().__init__()
        if isinstance(features, bool) or not isinstance(features, numbers.Integral) or features < 1:
            raise ValueError(f"BiasGELU: features must be a positive int, got {features!r}")
        self.features = int(features)
        self.approximate = _check_approximate("BiasGELU", approximate)
        self.bias = torch.nn.Parameter(torch.zeros(self.features, device=device, dtype=dtype))

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, approximate: str = "none") -> "BiasGELU":
        """A BiasGELU holding ``linear.bias`` (the same Parameter object: optimizer state and
        sharing are kept); ``linear.bias`` becomes None, so ``linear -> act`` computes what
        ``linear -> GELU`` computed before."""
        if not isinstance(linear, torch.nn.Linear) or linear.bias is None:
            raise ValueError("BiasGELU.from_linear: need a torch.nn.Linear with a bias")
        m = cls(linear.out_features, approximate, device=linear.bias.device, dtype=linear.bias.dtype)
        bias = linear.bias
        linear.register_parameter("bias", None)
        m.bias = bias
        return m

    def forward(self, input: Tensor) -> Tensor:
        return gelu(input, self.bias, self.approximate)

    def extra_repr(self):
        return f"fused, features={self.features}, approximate={self.approximate!r}"


class MMCVSigmoidFocalLoss(torch.nn.Module):
    r"""Drop-in for ``mmcv.ops.SigmoidFocalLoss(gamma, alpha, weight=None, reduction='mean')``:
    index targets (the value C = background), mean over rows; see
    :func:`fusedloss.mmcv_sigmoid_focal_loss` (also for the deliberate differences)."""

    def __init__(self, gamma: float, alpha: float, weight=None, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("none", "mean", "sum"):
            raise ValueError(f"MMCVSigmoidFocalLoss: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
        self.gamma = float(gamma)
        self.alpha = float(alpha)
        self.reduction = reduction
        self.register_buffer("weight", weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        from .zoo import mmcv_sigmoid_focal_loss
        return mmcv_sigmoid_focal_loss(input, target, self.gamma, self.alpha, self.weight, self.reduction)

    def extra_repr(self):
        return f"fused, gamma={self.gamma}, alpha={self.alpha}, reduction={self.reduction!r}"
