"""fusedloss.linear_distill — distillation loss of a linear head without its logits:

    loss = fusedloss.linear_distillation_loss(h_student, lm_head.weight, teacher_logits,
                                              temperature=2.0, t2_scale=True)
    loss = fusedloss.linear_distillation_loss(h_student, lm_head.weight,
                                              teacher_hidden=h_teacher, teacher_weight=t_head.weight,
                                              labels=labels, beta=0.5, reduction="mean")
    criterion = fusedloss.LinearDistillationLoss(temperature=2.0, t2_scale=True)

The loss is fusedloss.distillation_loss(F.linear(student_hidden, student_weight, student_bias),
teacher_logits, labels, ...) (the divergences of include/fusedloss.h section 10: forward KL for
beta 0, reverse KL for beta 1, JSD_beta otherwise; temperature, T^2 scaling, ignored rows,
reductions none / sum / mean / batchmean), where the teacher logits are either given ([..., V]) or
teacher_hidden @ teacher_weight.T (+ teacher_bias), computed chunk by chunk under no_grad. Neither
the full [N, V] student logits nor the full teacher logits are ever materialised. A Python loop
over row chunks (as fusedloss.vocab_parallel_linear, without its collectives), each chunk:

    z   = h_c W^T (+ b)                    # [C, V] in the hidden's dtype (as F.linear): cuBLAS / MKL
    t   = given[rows] or F.linear(th_c, tW, tb) under no_grad            # [C, V]
    scalar reductions ("mode 1", the gradient formed in the forward, as linear_cross_entropy):
        loss_c      = fusedloss::distill_forward(z, t, reduction sum)          (mean / batchmean)
        dz          = fusedloss::distill_fused(z, t, grad = 1 / D, reduction sum)
        (loss_c, dz) = fusedloss::distill_loss_and_grad(z, t, reduction sum)   (sum: one C call)
        dh_c = dz W ;  dW += dz^T h_c ;  db += sum_rows(dz)
    reduction "none" ("mode 2": the per-row upstream gradient is known only in backward):
        loss[rows] = fusedloss::distill_forward(z, t, reduction none); backward recomputes z and t
        per chunk and calls distill_fused with the rows' upstream gradient.

Denominators (exact, whole batch, no host sync): every chunk is reduced with 'sum'; 'batchmean'
divides the total by N, 'mean' by D = (labels != ignore_index).sum() (N without labels), a device
tensor. The gradient of a chunk is made by the C op for the upstream gradient 1 / D (an fp32 device
tensor), i.e. exactly what distillation_loss(reduction='mean' / 'batchmean') computes for those
rows (one rounding of the fp32 / double gradient to the logits' dtype). mean with every row ignored
is NaN (gradient 0), as distillation_loss.

Gradients (for student_hidden, student_weight, student_bias; the teacher is a constant: teacher
inputs are detached, never differentiated): dh in the compute dtype (then the hidden's dtype); dW:
accumulated directly into an fp32 gradient when the weight is fp32 (addmm_ in place), else into an
fp32 accumulator (4 V H bytes, alive during the forward / mode-2 backward only; each chunk's product
dz^T h_c is a 16-bit GEMM with fp32 internal accumulation, a transient 2 V H bytes, added to it in
fp32) rounded once to the weight's dtype at the end; db accumulated in fp32, rounded once.
Backward of mode 1 scales the kept gradients by the real upstream gradient: eager in place with
fusedloss.ops.run_scale_rows (on the device, no host sync, nothing touched when the gradient is 1);
traced (torch.compile) as a plain multiply. Eager mode-1 backward runs once (retain_graph + a second
backward raise); create_graph=True and double backward raise.

Memory: chunk temporaries (student logits, their gradient, the teacher chunk, the C workspace)
fit byte_budget (default 512 MiB) unless chunk_rows is given. Held between forward and backward:
mode 1: dh [N, H] (hidden's dtype), dW [V, H] (weight's dtype), db [V] (what require grad); mode 2:
only references to the inputs (hidden, weights, bias, teacher logits or teacher hidden / weight,
labels); the backward then costs the student GEMM again (plus the teacher's) on top of 2 GEMMs.

torch.compile: works with fullgraph=True (the chunk loop is unrolled at trace time, the C calls are
the custom ops' fake kernels; tested with the aot_eager backend on the CPU).

Fallback: a compute dtype other than float32 / float16 / bfloat16 (float64) or a device other than
cpu / cuda runs the unfused reference (F.linear, then fusedloss.distillation_loss, which itself
uses the PyTorch formula there): same values, full logits held.
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from . import distill  # noqa: F401  (registers torch.ops.fusedloss.distill_*)
from . import ops as _ops
from ._lib import DISTILL_REDUCTIONS
from .autograd import eager_ok
from .distill import _check_options, distillation_loss
from .functional import _autocast_dtype

__all__ = ["linear_distillation_loss", "LinearDistillationLoss"]

_F32 = torch.float32
_SERVED = (torch.float32, torch.float16, torch.bfloat16)
_INDEX = (torch.int32, torch.int64)
_NONE = DISTILL_REDUCTIONS["none"]
_SUM = DISTILL_REDUCTIONS["sum"]
_MEAN = DISTILL_REDUCTIONS["mean"]
_BATCHMEAN = DISTILL_REDUCTIONS["batchmean"]
DEFAULT_BYTE_BUDGET = 512 * 2 ** 20
_FN = "fusedloss.linear_distillation_loss"

# the ops, looked up here at call time (tests wrap them to watch chunk shapes)
_fl = torch.ops.fusedloss


def _op_forward(*a):
    return _fl.distill_forward(*a)


def _op_fused(*a):
    return _fl.distill_fused(*a)


def _op_loss_and_grad(*a):
    return _fl.distill_loss_and_grad(*a)


# ---- chunking ------------------------------------------------------------------------------------
def chunk_rows_for(V, dtype, teacher_dtype=None, byte_budget=DEFAULT_BYTE_BUDGET, grads=True):
    """Rows per chunk so that one chunk's temporaries fit byte_budget: the student logits, their
    gradient (when grads), the teacher chunk (teacher_dtype; the student's when None) and the C
    workspace (about 12 + 32 ceil(V / 8192) bytes per row). At least 1."""
    es = dtype.itemsize
    tes = (teacher_dtype or dtype).itemsize
    per_row = V * (es * (2 if grads else 1) + tes) + 12 + 32 * math.ceil(V / 8192)
    return max(1, int(byte_budget) // per_row)


def _rows_ok(x, V):
    """A 2-D [C, V] chunk the distill ops read as is (unit column stride, row stride >= V)."""
    if V > 1 and x.stride(1) != 1:
        return False
    return x.shape[0] <= 1 or x.stride(0) >= V


# ---- one chunk's pieces --------------------------------------------------------------------------
def _student_logits(hc, W, b):
    z = torch.addmm(b, hc, W.t()) if b is not None else hc @ W.t()
    return z if _rows_ok(z, W.shape[0]) else z.contiguous()


def _teacher_chunk(teacher, r0, r1, cdt):
    """The teacher logits of rows [r0, r1) (no autograd), of the compute dtype or float32."""
    kind = teacher[0]
    with torch.no_grad():
        if kind == "logits":
            t = teacher[1][r0:r1]
        else:
            _, th, tW, tb = teacher
            t = F.linear(th[r0:r1], tW, tb)
        if t.dtype != cdt and t.dtype != _F32:
            t = t.to(cdt)
        V = t.shape[1]
        return t if _rows_ok(t, V) else t.contiguous()


def _grad_buffers(N, H, V, dev, cdt, wdt, need, has_b):
    need_h, need_w, need_b = need
    dh = torch.empty((N, H), dtype=cdt, device=dev) if need_h else None
    # dW: fp32 (the weight's own gradient when fp32, else the accumulator rounded once at the end)
    dW = torch.zeros((V, H), dtype=_F32, device=dev) if need_w else None
    db = torch.zeros((V,), dtype=_F32, device=dev) if (need_b and has_b) else None
    return dh, dW, db


def _chunk_grads(dz, hc, W, r0, r1, dh, dW, db):
    if dh is not None:
        dh[r0:r1] = dz @ W
    if dW is not None:
        if dz.dtype == _F32:
            dW.addmm_(dz.t(), hc)           # fp32: accumulated in place by the GEMM
        else:
            dW.add_(dz.t() @ hc)            # 16-bit GEMM (fp32 inside), summed over chunks in fp32
    if db is not None:
        db.add_(dz.sum(0, dtype=_F32))


def _finish(x, dtype):
    return None if x is None else (x if x.dtype == dtype else x.to(dtype))


# ---- autograd ------------------------------------------------------------------------------------
class LinearDistillFunction(torch.autograd.Function):
    """apply(h [N, H], W [V, H], b [V] or None, labels [N] or None, tl, th, tW, tb, meta) -> loss
    (fp32, [N] for reduction none, else 0-d).

    h, W, b already in the compute dtype (autocast dtype or their common dtype); the teacher,
    detached: tl the logits [N, V] (th, tW, tb None), or tl None and th [N, Ht], tW [V, Ht], tb [V]
    or None; labels int32 / int64, contiguous; meta: (args = (T, beta, ignore_index, fl reduction,
    t2_scale), chunk rows, the dtypes of hidden / weight / bias for their gradients, which of the
    three need a gradient). Inputs are checked by linear_distillation_loss."""

    @staticmethod
    def forward(ctx, h, W, b, labels, tl, th, tW, tb, meta):
        args, chunk, out_dtypes, need = meta
        T, beta, ii, red, t2 = args
        N, H = h.shape
        V = W.shape[0]
        dev, cdt = h.device, h.dtype
        teacher = ("logits", tl) if tl is not None else ("hidden", th, tW, tb)
        need = tuple(bool(x and y) for x, y in zip(need, ctx.needs_input_grad[:3]))
        grads = any(need)
        none = red == _NONE
        ctx.meta = (args, chunk, out_dtypes, need)
        ctx.mode1 = grads and not none
        ctx.used = False
        sum_args = (T, beta, ii, _SUM, t2)
        if none:
            loss = torch.empty((N,), dtype=_F32, device=dev)
        else:
            loss = torch.zeros((), dtype=_F32, device=dev)
        # the whole batch's denominator D (fp32 device tensor; no host sync): N for batchmean (and
        # mean without labels), the rows not ignored for mean
        d = None
        if red == _MEAN and labels is not None:
            d = (labels != ii).sum().to(_F32)
        elif red in (_MEAN, _BATCHMEAN):
            d = torch.full((), float(N), dtype=_F32, device=dev)
        if ctx.mode1:
            dh, dW, db = _grad_buffers(N, H, V, dev, cdt, W.dtype, need, b is not None)
            # the chunks' upstream gradient 1 / D (inf for D == 0: every row ignored, gradient 0)
            inv_d = None if d is None else (1.0 / d).reshape(1)
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            hc = h[r0:r1]
            lc = labels[r0:r1] if labels is not None else None
            z = _student_logits(hc, W, b)
            t = _teacher_chunk(teacher, r0, r1, cdt)
            if none:
                loss[r0:r1] = _op_forward(z, t, lc, *args)
            elif not ctx.mode1:
                loss.add_(_op_forward(z, t, lc, *sum_args))
            else:
                if inv_d is None:
                    l_c, dz = _op_loss_and_grad(z, t, lc, *sum_args)
                else:
                    l_c = _op_forward(z, t, lc, *sum_args)
                    dz = _op_fused(z, t, lc, inv_d, *sum_args)
                del z, t
                loss.add_(l_c)
                _chunk_grads(dz, hc, W, r0, r1, dh, dW, db)
                del dz
        if d is not None:
            loss = loss / d  # 0 / 0: NaN (N == 0, or mean with every row ignored), as the header
        hdt, wdt, bdt = out_dtypes
        if ctx.mode1:
            # rounded once to the parameters' dtypes; the fp32 accumulators are freed here
            ctx.save_for_backward(_finish(dh, hdt), _finish(dW, wdt), _finish(db, bdt))
        elif grads:  # mode 2: references to the inputs only
            ctx.save_for_backward(h, W, b, labels, tl, th, tW, tb)
        return loss

    @staticmethod
    def backward(ctx, grad):
        args, chunk, out_dtypes, need = ctx.meta
        nones = (None,) * 6
        if grad is None or not any(need):
            return (None, None, None) + nones
        eager = eager_ok(grad)
        if eager and torch.is_grad_enabled():
            raise RuntimeError(f"{_FN}: double backward / create_graph=True is not supported (the gradient is "
                               "formed by fused ops without a graph)")
        if ctx.mode1:
            if eager and ctx.used:
                raise RuntimeError(f"{_FN}: backward can run only once for a mean / sum / batchmean loss (the "
                                   "gradients formed in the forward are scaled in place)")
            dh, dW, db = ctx.saved_tensors
            if eager:
                ctx.used = True
                g = grad if grad.dtype == _F32 else grad.float()
                # in place, on the device; nothing moved when g == 1; fresh aliases for AccumulateGrad
                dh, dW, db = [None if x is None else _ops.run_scale_rows(x, g, False).detach()
                              for x in (dh, dW, db)]
            else:
                g = grad.reshape(())
                dh, dW, db = [None if x is None else x * g.to(x.dtype) for x in (dh, dW, db)]
            return (dh, dW, db) + nones
        # mode 2 (reduction none): recompute the chunks with the per-row upstream gradient
        h, W, b, labels, tl, th, tW, tb = ctx.saved_tensors
        teacher = ("logits", tl) if tl is not None else ("hidden", th, tW, tb)
        N, H = h.shape
        V = W.shape[0]
        cdt = h.dtype
        dh, dW, db = _grad_buffers(N, H, V, h.device, cdt, W.dtype, need, b is not None)
        g_all = grad.reshape(-1).to(_F32).contiguous()
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            hc = h[r0:r1]
            lc = labels[r0:r1] if labels is not None else None
            z = _student_logits(hc, W, b)
            t = _teacher_chunk(teacher, r0, r1, cdt)
            dz = _op_fused(z, t, lc, g_all[r0:r1], *args)
            del z, t
            _chunk_grads(dz, hc, W, r0, r1, dh, dW, db)
            del dz
        hdt, wdt, bdt = out_dtypes
        return (_finish(dh, hdt), _finish(dW, wdt), _finish(db, bdt)) + nones


# ---- argument checks -----------------------------------------------------------------------------
def _tensor(name, x, optional=False):
    if x is None and optional:
        return
    if not isinstance(x, Tensor):
        raise TypeError(f"{_FN}: {name} must be a Tensor{' or None' if optional else ''}, got {type(x).__name__}")


def _positive_int_or_none(name, v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{_FN}: {name} must be a positive int or None, got {v!r}")
    return v


def _rows(name, x, lead, N, last):
    """x of shape lead + (last,) or (N, last) -> (N, last) rows."""
    if x.dim() < 1 or x.shape[-1] != last or (x.shape[:-1] != lead and x.shape != (N, last)):
        raise ValueError(f"{_FN}: {name} must have shape {tuple(lead) + (last,)} (or ({N}, {last})), got "
                         f"{tuple(x.shape)}")
    return x.reshape(N, last)


# ---- functional API ------------------------------------------------------------------------------
def linear_distillation_loss(student_hidden: Tensor, student_weight: Tensor, teacher_logits: Optional[Tensor] = None,
                             *, teacher_hidden: Optional[Tensor] = None, teacher_weight: Optional[Tensor] = None,
                             teacher_bias: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                             student_bias: Optional[Tensor] = None, temperature: float = 1.0, beta: float = 0.0,
                             ignore_index: int = -100, reduction: str = "batchmean", t2_scale: bool = False,
                             chunk_rows: Optional[int] = None, byte_budget: int = DEFAULT_BYTE_BUDGET) -> Tensor:
    r"""``fusedloss.distillation_loss(F.linear(student_hidden, student_weight, student_bias), teacher, labels,
    ...)`` without the [N, V] logits (see the module docstring for the algorithm and its memory).

    - ``student_hidden``: ``[..., H]`` (leading dims flattened to N rows); ``student_weight``: ``[V, H]``;
      ``student_bias``: ``[V]`` or None. One dtype (float32 / float16 / bfloat16; float64 falls back to the
      unfused reference), or any under ``torch.autocast`` (cast to the autocast dtype, as F.linear).
    - the teacher, exactly one of: ``teacher_logits`` ``[..., V]`` (or ``[N, V]``), or ``teacher_hidden``
      ``[..., Ht]`` (or ``[N, Ht]``) with ``teacher_weight`` ``[V, Ht]`` (and optional ``teacher_bias``
      ``[V]``), whose logits are computed chunk by chunk under no_grad. A constant: never differentiated.
      A teacher of another dtype than the student's compute dtype is cast to it per chunk (float32 is
      kept).
    - ``labels``: optional integer tensor of the leading shape (or ``[N]``): rows equal to ``ignore_index``
      count 0 and get no gradient.
    - ``temperature``, ``beta`` (0 forward KL, 1 reverse KL, else JSD_beta), ``t2_scale``, ``reduction``
      (``'batchmean'`` default: sum / N; ``'mean'``: sum / rows not ignored; ``'sum'``; ``'none'``: per row,
      of the leading shape): as :func:`fusedloss.distillation_loss`, denominators over the whole batch.
    - ``chunk_rows``: rows per chunk (None: the most whose temporaries fit ``byte_budget`` bytes, default
      512 MiB; see :func:`chunk_rows_for`).

    Returns the loss in the student's compute dtype (as distillation_loss on F.linear's logits).
    Gradients for student_hidden, student_weight, student_bias (those that require grad).
    """
    _tensor("student_hidden", student_hidden)
    _tensor("student_weight", student_weight)
    for name, x in (("teacher_logits", teacher_logits), ("teacher_hidden", teacher_hidden),
                    ("teacher_weight", teacher_weight), ("teacher_bias", teacher_bias), ("labels", labels),
                    ("student_bias", student_bias)):
        _tensor(name, x, optional=True)
    _check_options(temperature, beta, reduction)
    chunk_rows = _positive_int_or_none("chunk_rows", chunk_rows)
    if isinstance(byte_budget, bool) or not isinstance(byte_budget, int) or byte_budget < 1:
        raise ValueError(f"{_FN}: byte_budget must be a positive int, got {byte_budget!r}")
    by_hidden = teacher_hidden is not None or teacher_weight is not None or teacher_bias is not None
    if teacher_logits is not None and by_hidden:
        raise ValueError(f"{_FN}: give the teacher either as teacher_logits or as teacher_hidden + teacher_weight, "
                         "not both")
    if teacher_logits is None and not by_hidden:
        raise ValueError(f"{_FN}: no teacher: give teacher_logits, or teacher_hidden and teacher_weight")
    if by_hidden and (teacher_hidden is None or teacher_weight is None):
        raise ValueError(f"{_FN}: teacher_hidden and teacher_weight must be given together")

    h, W, b = student_hidden, student_weight, student_bias
    if h.dim() < 1:
        raise ValueError(f"{_FN}: student_hidden must be [..., H], got a 0-d tensor")
    H = h.shape[-1]
    if W.dim() != 2 or W.shape[1] != H:
        raise ValueError(f"{_FN}: student_weight must have shape (V, {H}) for student_hidden of shape "
                         f"{tuple(h.shape)}, got {tuple(W.shape)}")
    V = W.shape[0]
    if V < 1 or H < 1:
        raise ValueError(f"{_FN}: need V >= 1 and H >= 1, got student_weight of shape {tuple(W.shape)}")
    if b is not None and b.shape != (V,):
        raise ValueError(f"{_FN}: student_bias must have shape ({V},), got {tuple(b.shape)}")
    lead = h.shape[:-1]
    N = math.prod(lead)
    dev = h.device
    for name, x in (("student_weight", W), ("student_bias", b), ("teacher_logits", teacher_logits),
                    ("teacher_hidden", teacher_hidden), ("teacher_weight", teacher_weight),
                    ("teacher_bias", teacher_bias), ("labels", labels)):
        if x is not None and x.device != dev:
            raise ValueError(f"{_FN}: {name} is on {x.device} but student_hidden is on {dev}")
    if by_hidden:
        Ht = teacher_hidden.shape[-1] if teacher_hidden.dim() >= 1 else 0
        if teacher_weight.dim() != 2 or teacher_weight.shape != (V, Ht) or Ht < 1:
            raise ValueError(f"{_FN}: teacher_weight must have shape ({V}, Ht) with Ht = teacher_hidden.shape[-1] "
                             f"= {Ht} >= 1, got {tuple(teacher_weight.shape)}")
        if teacher_bias is not None and teacher_bias.shape != (V,):
            raise ValueError(f"{_FN}: teacher_bias must have shape ({V},), got {tuple(teacher_bias.shape)}")
        th = _rows("teacher_hidden", teacher_hidden, lead, N, Ht).detach()
        tl = None
    else:
        tl = _rows("teacher_logits", teacher_logits, lead, N, V).detach()
        th = None
    lab = None
    if labels is not None:
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
            raise TypeError(f"{_FN}: labels must be an integer Tensor, got {labels.dtype}")
        if labels.shape != lead and labels.shape != (N,):
            raise ValueError(f"{_FN}: labels must have shape {tuple(lead)} (or ({N},)), got {tuple(labels.shape)}")
        lab = labels.reshape(-1)
        if lab.dtype not in _INDEX:
            lab = lab.long()
        lab = lab.contiguous()

    cdt = _autocast_dtype(dev.type)
    if cdt is None:  # as F.linear: one dtype
        cdt = h.dtype
        for name, x in (("student_weight", W), ("student_bias", b)):
            if x is not None and x.dtype != cdt:
                raise TypeError(f"{_FN}: {name} dtype {x.dtype} differs from student_hidden's ({cdt}); cast them "
                                "to one dtype or run under torch.autocast")
    red = DISTILL_REDUCTIONS[reduction]
    temperature, beta = float(temperature), float(beta)

    if cdt not in _SERVED or dev.type not in ("cpu", "cuda"):  # the unfused reference
        s = F.linear(h, W, b)
        if by_hidden:
            with torch.no_grad():
                t = F.linear(teacher_hidden, teacher_weight, teacher_bias)
            t = t.reshape(s.shape)
        else:
            t = teacher_logits.detach().reshape(s.shape)
        return distillation_loss(s, t, labels.reshape(lead) if labels is not None else None,
                                 temperature=temperature, beta=beta, ignore_index=ignore_index,
                                 reduction=reduction, t2_scale=t2_scale)

    h2 = h.reshape(N, H)
    tW = tb = None
    if by_hidden:
        tcdt = _autocast_dtype(dev.type) or th.dtype
        if tcdt not in _SERVED:
            tcdt = cdt
        th = th if th.dtype == tcdt else th.to(tcdt)
        tW = teacher_weight.detach()
        tW = tW if tW.dtype == tcdt else tW.to(tcdt)
        if teacher_bias is not None:
            tb = teacher_bias.detach()
            tb = tb if tb.dtype == tcdt else tb.to(tcdt)
        t_es_dtype = tcdt if tcdt in (cdt, _F32) else cdt
    else:
        t_es_dtype = tl.dtype if tl.dtype in (cdt, _F32) else cdt
    grad_on = torch.is_grad_enabled() and (h.requires_grad or W.requires_grad
                                           or (b is not None and b.requires_grad))
    chunk = chunk_rows or chunk_rows_for(V, cdt, t_es_dtype, byte_budget, grads=grad_on)
    out_dtypes = (h.dtype, W.dtype, None if b is None else b.dtype)
    need = (grad_on and h.requires_grad, grad_on and W.requires_grad,
            grad_on and b is not None and b.requires_grad)
    meta = ((temperature, beta, int(ignore_index), red, bool(t2_scale)), chunk, out_dtypes, need)
    with torch.autocast(dev.type, enabled=False):
        hc, Wc = h2.to(cdt), W.to(cdt)
        bc = b.to(cdt) if b is not None else None
        loss = LinearDistillFunction.apply(hc, Wc, bc, lab, tl, th, tW, tb, meta)
    if red == _NONE:
        loss = loss.reshape(lead)
    return loss if loss.dtype == cdt else loss.to(cdt)


class LinearDistillationLoss(torch.nn.Module):
    """Module form of fusedloss.linear_distillation_loss:
    forward(student_hidden, student_weight, teacher_logits=None, *, teacher_hidden=None,
    teacher_weight=None, teacher_bias=None, labels=None, student_bias=None).

    Options as linear_distillation_loss's keywords (validated here): temperature, beta, ignore_index,
    reduction ('batchmean' default, 'mean', 'sum', 'none'), t2_scale, chunk_rows, byte_budget."""

    def __init__(self, temperature: float = 1.0, beta: float = 0.0, ignore_index: int = -100,
                 reduction: str = "batchmean", t2_scale: bool = False, chunk_rows: Optional[int] = None,
                 byte_budget: int = DEFAULT_BYTE_BUDGET):
        super().__init__()
        _check_options(temperature, beta, reduction)
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.t2_scale = bool(t2_scale)
        self.chunk_rows = _positive_int_or_none("chunk_rows", chunk_rows)
        if isinstance(byte_budget, bool) or not isinstance(byte_budget, int) or byte_budget < 1:
            raise ValueError(f"{_FN}: byte_budget must be a positive int, got {byte_budget!r}")
        self.byte_budget = byte_budget

    def forward(self, student_hidden: Tensor, student_weight: Tensor, teacher_logits: Optional[Tensor] = None, *,
                teacher_hidden: Optional[Tensor] = None, teacher_weight: Optional[Tensor] = None,
                teacher_bias: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                student_bias: Optional[Tensor] = None) -> Tensor:
        return linear_distillation_loss(student_hidden, student_weight, teacher_logits, teacher_hidden=teacher_hidden,
                                        teacher_weight=teacher_weight, teacher_bias=teacher_bias, labels=labels,
                                        student_bias=student_bias, temperature=self.temperature, beta=self.beta,
                                        ignore_index=self.ignore_index, reduction=self.reduction,
                                        t2_scale=self.t2_scale, chunk_rows=self.chunk_rows,
                                        byte_budget=self.byte_budget)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, beta={self.beta}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}, t2_scale={self.t2_scale}, chunk_rows={self.chunk_rows}, "
                f"byte_budget={self.byte_budget}")
