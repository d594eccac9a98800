"""fusedloss.distill — knowledge-distillation divergences on raw logits (include/fusedloss.h section 10):

    loss = fusedloss.distillation_loss(student_logits, teacher_logits, labels,
                                       temperature=2.0, beta=0.0, t2_scale=True)   # Hinton KD
    loss = fusedloss.jsd_logits(student_logits, teacher_logits, beta=0.5)           # symmetric JSD
    criterion = fusedloss.DistillationLoss(temperature=2.0, t2_scale=True)

Per row i of [N, V] student logits s and teacher logits t (leading dimensions flattened to rows),
Q = softmax(s / T) (student), P = softmax(t / T) (teacher), beta in [0, 1] (Liger-Kernel's LigerJSD
convention):

    beta == 0 : l_i = KL(P || Q)           forward KL, the Hinton distillation loss
    beta == 1 : l_i = KL(Q || P)           reverse KL
    otherwise : l_i = beta KL(P || M) + (1 - beta) KL(Q || M),   M = beta P + (1 - beta) Q

t2_scale=True multiplies every l_i (and the gradient) by T^2. Rows whose label equals
ignore_index contribute 0 (and get a zero gradient). Reductions: "none" (per row, shape of the
leading dims), "sum", "mean" (sum / number of rows not ignored: NaN when every row is ignored,
gradient then 0), "batchmean" (sum / N, as F.kl_div's; the default here, as for KD with F.kl_div).
F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True,
reduction="batchmean") * T**2 is distillation_loss(s, t, temperature=T, t2_scale=True).
Gradient w.r.t. the student logits only; the teacher is a constant (a teacher that requires grad
makes the functions fall back to the PyTorch formula, which differentiates both).

All layers of this op family live in this one module (as fusedloss.zoo): custom ops
(torch.library; CPU and CUDA kernels calling fl_distill_*_cpu / fl_distill_*_cuda on the current
stream; fake kernels for torch.compile / meta tensors), their autograd (register_autograd), and the
functional API. Ops (namespace "fusedloss"):

  distill_forward(student, teacher, labels?, temperature, beta, ignore_index, reduction, t2_scale)
      -> loss                                            (fl_distill_forward_*)
  distill_fused(student, teacher, labels?, grad?, temperature, beta, ignore_index, reduction,
                t2_scale) -> dstudent                     (fl_distill_fused_*, loss = NULL)
      the student gradient for the upstream gradient grad (fp32, N elements for reduction none,
      else 1; None = 1): the backward of distill_forward
  distill_loss_and_grad(student, teacher, labels?, temperature, beta, ignore_index, reduction,
                        t2_scale) -> (loss, dstudent)    (fl_distill_fused_*, grad_loss = NULL)
      both in one call, dstudent for an upstream gradient of 1 (non-differentiable output)

      student, teacher: 2-D [N, V], unit column stride, row strides ld >= V (passed to C as
      ld_student / ld_teacher; other layouts are refused: the functions make them contiguous);
      student float32 / float16 / bfloat16, teacher of the student's dtype or float32; labels
      int32 / int64 [N] or None (None: no row ignored); reduction the fl_reduction number (0 none,
      1 mean, 2 sum, 3 batchmean). loss float32, [N] (none) or 0-d; dstudent of the student's
      dtype, shape and row stride. N == 0 is answered without a C call (none: empty, sum 0, mean
      and batchmean NaN, as the header).

Autograd (what distillation_loss does, on CPU and CUDA, eager and torch.compile alike):
  * scalar reductions (mean / sum / batchmean) with a student that requires grad: ONE C call in
    the forward (distill_loss_and_grad: loss and dstudent for an upstream gradient of 1; reads s
    and t once or twice, writes dstudent once; eager, plain tensors: the same C call through
    autograd.KeptGradEager, without the custom op's Python dispatch); backward only scales the kept
    dstudent by the real upstream gradient: eager in place with fl_scale_rows (on the device, no host sync, nothing
    moved when the gradient is 1, the usual loss.backward()), traced (torch.compile) as
    dstudent * grad. Extra memory: the [N, V] gradient, formed in the forward. Eager backward may
    run only once (retain_graph=True and a second backward raise) and create_graph=True is
    refused (the gradient formed in the forward has no graph).
  * reduction none, or a student that does not require grad: distill_forward in the forward (saves
    student, teacher, labels), distill_fused with the per-row upstream gradient in the backward.
  * double backward (differentiating the gradient) raises RuntimeError.
The losses are returned in the student's dtype (computed in fp32 by CUDA, in double by the CPU
backend, as the header says; rounded once). Cases the kernels do not serve fall back to the
PyTorch formula itself (float64 or other student dtypes, devices other than cpu / cuda, a teacher
that requires grad) so that the functions stay drop-ins.
"""
import ctypes
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _lib
from . import ops as _ops
from ._lib import DISTILL_REDUCTIONS, _check
from .autograd import kept_grad_loss, register_kept_grad_autograd

__all__ = ["distillation_loss", "kl_div_logits", "jsd_logits", "DistillationLoss",
           "distill_forward", "distill_fused", "distill_loss_and_grad"]

_DTYPES = {torch.float32: _lib.FL_DTYPE_F32, torch.float16: _lib.FL_DTYPE_F16,
           torch.bfloat16: _lib.FL_DTYPE_BF16}
_INDEX_DTYPES = {torch.int32: _lib.FL_INDEX_I32, torch.int64: _lib.FL_INDEX_I64}
_NONE = _lib.FL_REDUCTION_NONE
_MEAN = _lib.FL_REDUCTION_MEAN
_BATCHMEAN = _lib.FL_REDUCTION_BATCHMEAN
_F32 = torch.float32
_REDUCTION_NAMES = {v: k for k, v in DISTILL_REDUCTIONS.items()}


# ---- argument checks (shared by the functional API, the op bodies and the fake kernels) -----------
def _check_options(temperature, beta, reduction):
    """Raise ValueError unless temperature is finite and > 0, beta in [0, 1] and reduction a
    distillation reduction (a name for the functional API, the fl_reduction number for the ops)."""
    if isinstance(reduction, str):
        if reduction not in DISTILL_REDUCTIONS:
            raise ValueError(f"fusedloss.distillation_loss: reduction must be one of "
                             f"{', '.join(repr(k) for k in DISTILL_REDUCTIONS)}, got {reduction!r}")
    elif reduction not in _REDUCTION_NAMES:
        raise ValueError(f"fusedloss::distill: reduction must be an fl_reduction number 0 (none), 1 (mean), "
                         f"2 (sum) or 3 (batchmean), got {reduction!r}")
    t = float(temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"fusedloss.distillation_loss: temperature must be finite and > 0, got {temperature!r}")
    b = float(beta)
    if not (0.0 <= b <= 1.0):
        raise ValueError(f"fusedloss.distillation_loss: beta must be in [0, 1] (0 forward KL, 1 reverse KL, "
                         f"else the generalised JSD), got {beta!r}")


def _rows_ld(x, V):
    """Row stride of a 2-D [N, V] tensor as the C API reads it, or None if not of that layout."""
    N = x.shape[0]
    if V > 1 and x.stride(1) != 1:
        return None
    if N <= 1:
        return V
    ld = x.stride(0)
    return ld if ld >= V else None


def _layout(op, student, teacher, labels):
    """Validate the raw ops' tensors; (N, V, ld_student, ld_teacher, dtype code, teacher dtype code,
    label dtype code or None)."""
    if student.dim() != 2:
        raise ValueError(f"fusedloss::{op}: student must be 2-D [N, V], got shape {tuple(student.shape)}")
    dt = _DTYPES.get(student.dtype)
    if dt is None:
        raise TypeError(f"fusedloss::{op}: student dtype {student.dtype} not supported (float32, float16, bfloat16)")
    N, V = student.shape
    if V < 1:
        raise ValueError(f"fusedloss::{op}: V must be >= 1, got shape {tuple(student.shape)}")
    if teacher.shape != student.shape:
        raise ValueError(f"fusedloss::{op}: teacher shape {tuple(teacher.shape)} != student shape "
                         f"{tuple(student.shape)}")
    if teacher.device != student.device:
        raise ValueError(f"fusedloss::{op}: teacher is on {teacher.device}, student on {student.device}")
    if teacher.dtype != student.dtype and teacher.dtype != _F32:
        raise TypeError(f"fusedloss::{op}: teacher dtype {teacher.dtype} must be the student's ({student.dtype}) "
                        "or float32")
    tdt = _DTYPES[teacher.dtype]
    lds, ldt = _rows_ld(student, V), _rows_ld(teacher, V)
    if lds is None or ldt is None:
        raise ValueError(f"fusedloss::{op}: student and teacher need a unit column stride and a row stride >= V "
                         f"(got strides {student.stride()} and {teacher.stride()}); make them contiguous")
    it = None
    if labels is not None:
        it = _INDEX_DTYPES.get(labels.dtype)
        if it is None:
            raise TypeError(f"fusedloss::{op}: labels dtype {labels.dtype} not supported (int64, int32)")
        if labels.dim() != 1 or labels.shape[0] != N:
            raise ValueError(f"fusedloss::{op}: labels must have shape ({N},), got {tuple(labels.shape)}")
        if labels.device != student.device:
            raise ValueError(f"fusedloss::{op}: labels are on {labels.device}, student on {student.device}")
        if N > 1 and labels.stride(0) != 1:
            raise ValueError(f"fusedloss::{op}: labels must be contiguous")
    return N, V, lds, ldt, dt, tdt, it


def _check_grad(op, grad, N, reduction, device):
    n = N if reduction == _NONE else 1
    if grad.dtype != _F32 or grad.numel() != n or grad.device != device:
        raise ValueError(f"fusedloss::{op}: grad must be float32 with {n} element(s) on {device}, got "
                         f"{grad.dtype} {tuple(grad.shape)} on {grad.device}")
    if n > 1 and (grad.dim() != 1 or grad.stride(0) != 1):
        raise ValueError(f"fusedloss::{op}: grad must be a contiguous ({n},) tensor")


def _loss_shape(N, reduction):
    return (N,) if reduction == _NONE else ()


def _new_dstudent(student, N, V, ld):
    """A gradient buffer with the student's row stride (the C API uses ld_student for both); on
    CUDA also at the student's address modulo 16 bytes (as fusedloss.ops does for dlogits)."""
    mis = student.data_ptr() & 15 if student.device.type == "cuda" else 0
    if mis == 0 or N == 0:
        if ld == V:
            return torch.empty((N, V), dtype=student.dtype, device=student.device)
        return torch.empty_strided((N, V), (ld, 1), dtype=student.dtype, device=student.device)
    es = student.element_size()
    base = torch.empty((N - 1) * ld + V + 16 // es, dtype=student.dtype, device=student.device)
    return base.as_strided((N, V), (ld, 1), mis // es)


def _fake_dstudent(student, N, V, ld):
    if ld == V or N <= 1:
        return student.new_empty((N, V))
    return student.new_empty_strided((N, V), (ld, 1))


# ---- the C calls ---------------------------------------------------------------------------------
_opts_cache = {}  # (T, beta, ignore_index, reduction, t2) -> (DistillOptions, address)
_ws_cache = {}    # (N, V, dtype, options key) -> bytes


def _options(key):
    o = _opts_cache.get(key)
    if o is None:
        if len(_opts_cache) >= 256:
            _opts_cache.clear()
        st = _lib.distill_options(*key)
        o = _opts_cache[key] = (st, ctypes.addressof(st))
    return o


def _ws_bytes(N, V, dt, key, addr):
    k = (N, V, dt, key)
    n = _ws_cache.get(k)
    if n is None:
        n = _lib.distill_workspace_size(N, V, dt, addr)
        if len(_ws_cache) >= 4096:
            _ws_cache.clear()
        _ws_cache[k] = n
    return n


def _sym(name):
    """The bound C function (NotBuiltError if the loaded library has no such entry point)."""
    return _lib.entry_point(name, "distillation entry points (built before include/fusedloss.h section 10)")


def _run(kind, student, teacher, labels, grad, temperature, beta, ignore_index, reduction, t2_scale):
    """kind 0: loss (forward); 1: dstudent for grad (fused, loss NULL); 2: (loss, dstudent) for an
    upstream gradient of 1 (fused, grad_loss NULL)."""
    op = ("distill_forward", "distill_fused", "distill_loss_and_grad")[kind]
    _check_options(temperature, beta, reduction)
    N, V, lds, ldt, dt, tdt, it = _layout(op, student, teacher, labels)
    dev = student.device
    if kind == 1 and grad is not None:
        _check_grad(op, grad, N, reduction, dev)
    loss = torch.empty(_loss_shape(N, reduction), dtype=_F32, device=dev) if kind != 1 else None
    ds = _new_dstudent(student, N, V, lds) if kind != 0 else None
    if N == 0:  # no C call (a 0-element tensor's data_ptr may be NULL)
        if loss is not None and reduction != _NONE:
            loss.fill_(0.0 if reduction == _lib.FL_REDUCTION_SUM else float("nan"))
        return (loss, ds)[kind] if kind != 2 else (loss, ds)
    cuda = dev.type == "cuda"
    if cuda and dev.index is not None and _ops._current_device() != dev.index:
        with torch.cuda.device(dev.index):
            return _run(kind, student, teacher, labels, grad, temperature, beta, ignore_index, reduction,
                        t2_scale)
    key = (float(temperature), float(beta), int(ignore_index), int(reduction), bool(t2_scale))
    opts = _options(key)
    nbytes = _ws_bytes(N, V, dt, key, opts[1])
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    lab = labels.data_ptr() if labels is not None else None
    it = it if it is not None else _lib.FL_INDEX_I64
    tail = (_ops.raw_stream_of(dev),) if cuda else ()
    sfx = "cuda" if cuda else "cpu"
    if kind == 0:
        name = f"fl_distill_forward_{sfx}"
        st = _sym(name)(loss.data_ptr(), student.data_ptr(), lds, teacher.data_ptr(), ldt, tdt, lab, it,
                        N, V, dt, opts[1], ws.data_ptr(), nbytes, *tail)
    else:
        name = f"fl_distill_fused_{sfx}"
        gptr = grad.data_ptr() if (kind == 1 and grad is not None) else None
        st = _sym(name)(loss.data_ptr() if loss is not None else None, ds.data_ptr(), student.data_ptr(), lds,
                        teacher.data_ptr(), ldt, tdt, lab, it, gptr, 1.0, N, V, dt, opts[1],
                        ws.data_ptr(), nbytes, *tail)
    _check(st, name)
    if kind == 0:
        return loss
    return ds if kind == 1 else (loss, ds)


# ---- custom ops ----------------------------------------------------------------------------------
@torch.library.custom_op("fusedloss::distill_forward", mutates_args=(), device_types=("cpu", "cuda"))
def distill_forward(student: Tensor, teacher: Tensor, labels: Optional[Tensor], temperature: float, beta: float,
                    ignore_index: int, reduction: int, t2_scale: bool) -> Tensor:
    """The distillation loss (fl_distill_forward_*): fp32, [N] for reduction none, else 0-d."""
    return _run(0, student, teacher, labels, None, temperature, beta, ignore_index, reduction, t2_scale)


@distill_forward.register_fake
def _(student, teacher, labels, temperature, beta, ignore_index, reduction, t2_scale):
    _check_options(temperature, beta, reduction)
    N = _layout("distill_forward", student, teacher, labels)[0]
    return student.new_empty(_loss_shape(N, reduction), dtype=_F32)


@torch.library.custom_op("fusedloss::distill_fused", mutates_args=(), device_types=("cpu", "cuda"))
def distill_fused(student: Tensor, teacher: Tensor, labels: Optional[Tensor], grad: Optional[Tensor],
                  temperature: float, beta: float, ignore_index: int, reduction: int, t2_scale: bool) -> Tensor:
    """dstudent = grad * dloss/dstudent (fl_distill_fused_*, loss NULL); grad fp32 with N elements
    for reduction none, else 1 (None = 1). The student's dtype, shape and row stride."""
    return _run(1, student, teacher, labels, grad, temperature, beta, ignore_index, reduction, t2_scale)


@distill_fused.register_fake
def _(student, teacher, labels, grad, temperature, beta, ignore_index, reduction, t2_scale):
    _check_options(temperature, beta, reduction)
    N, V, lds = _layout("distill_fused", student, teacher, labels)[:3]
    if grad is not None:
        _check_grad("distill_fused", grad, N, reduction, student.device)
    return _fake_dstudent(student, N, V, lds)


@torch.library.custom_op("fusedloss::distill_loss_and_grad", mutates_args=(), device_types=("cpu", "cuda"))
def distill_loss_and_grad(student: Tensor, teacher: Tensor, labels: Optional[Tensor], temperature: float,
                          beta: float, ignore_index: int, reduction: int, t2_scale: bool) -> Tuple[Tensor, Tensor]:
    """(loss, dstudent) in one fl_distill_fused_* call, dstudent for an upstream gradient of 1."""
    return _run(2, student, teacher, labels, None, temperature, beta, ignore_index, reduction, t2_scale)


@distill_loss_and_grad.register_fake
def _(student, teacher, labels, temperature, beta, ignore_index, reduction, t2_scale):
    _check_options(temperature, beta, reduction)
    N, V, lds = _layout("distill_loss_and_grad", student, teacher, labels)[:3]
    return student.new_empty(_loss_shape(N, reduction), dtype=_F32), _fake_dstudent(student, N, V, lds)


# ---- autograd (the zoo's shared registration: fusedloss.autograd) ----------------------------------
# inputs: student, teacher, labels, then temperature, beta, ignore_index, reduction (input 6), t2_scale;
# no gradient for the teacher (a constant; see the module docstring)
register_kept_grad_autograd(distill_forward, distill_fused, distill_loss_and_grad, "distill_fused",
                            "distillation_loss", 3, 5, reduction_index=6, reductions="mean / sum / batchmean")


# ---- the PyTorch formula (fallback) -----------------------------------------------------------------
def _reference(student, teacher, labels, temperature, beta, ignore_index, reduction, t2_scale):
    """The header's definitions in torch ops (float32 for half inputs, float64 stays float64); the
    loss in the student's dtype, differentiable w.r.t. both inputs."""
    V = student.shape[-1]
    cdt = torch.promote_types(torch.promote_types(student.dtype, teacher.dtype), _F32)
    s = student.reshape(-1, V).to(cdt)
    t = teacher.reshape(-1, V).to(cdt)
    T = float(temperature)
    lq = F.log_softmax(s / T, dim=-1)
    lp = F.log_softmax(t / T, dim=-1)
    if beta == 0:
        l = F.kl_div(lq, lp, reduction="none", log_target=True).sum(-1)
    elif beta == 1:
        l = F.kl_div(lp, lq, reduction="none", log_target=True).sum(-1)
    else:
        lm = torch.logaddexp(lp + math.log(beta), lq + math.log1p(-beta))
        l = beta * F.kl_div(lm, lp, reduction="none", log_target=True).sum(-1) + \
            (1 - beta) * F.kl_div(lm, lq, reduction="none", log_target=True).sum(-1)
    if t2_scale:
        l = l * (T * T)
    N = l.shape[0]
    keep = None
    if labels is not None:
        keep = labels.reshape(-1).to(l.device) != ignore_index
        l = torch.where(keep, l, torch.zeros((), dtype=l.dtype, device=l.device))
    if reduction == "none":
        out = l.reshape(student.shape[:-1])
    elif reduction == "sum":
        out = l.sum()
    elif reduction == "batchmean":
        out = l.sum() / N
    else:
        out = l.sum() / (keep.sum() if keep is not None else N)
    return out.to(student.dtype)


# ---- functional API --------------------------------------------------------------------------------
def _as_rows(x, V):
    x2 = x.reshape(-1, V)
    if _rows_ld(x2, V) is None:
        x2 = x2.contiguous()
    return x2


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, labels: Optional[Tensor] = None, *,
                      temperature: float = 1.0, beta: float = 0.0, ignore_index: int = -100,
                      reduction: str = "batchmean", t2_scale: bool = False) -> Tensor:
    r"""Distillation divergence between student and teacher *logits* (include/fusedloss.h section 10).

    ``student_logits``, ``teacher_logits``: ``[..., V]`` of one shape (leading dims are flattened to
    N rows; e.g. ``[B, T, V]`` LLM logits); the student float32 / float16 / bfloat16, the teacher of
    the student's dtype or float32 (any other teacher dtype is cast to the student's). ``labels``:
    optional integer tensor of the leading shape (``[...]``, or flattened ``[N]``; e.g. the shifted
    LLM labels): rows whose label equals ``ignore_index`` count 0 and get no gradient; other values
    are not looked at. With Q = softmax(s / T) (student), P = softmax(t / T) (teacher):
    ``beta == 0``: KL(P || Q) (forward KL, Hinton; the default); ``beta == 1``: KL(Q || P) (reverse
    KL); otherwise the generalised JSD ``beta KL(P || M) + (1 - beta) KL(Q || M)``,
    ``M = beta P + (1 - beta) Q`` (Liger-Kernel's LigerJSD convention; ``beta = 0.5`` is the usual
    JSD). ``t2_scale``: multiply by T^2 (Hinton's scaling). ``reduction``: ``'batchmean'`` (sum / N,
    F.kl_div's; default), ``'mean'`` (sum / rows not ignored; NaN if all are ignored, gradient 0),
    ``'sum'``, ``'none'`` (per row, of the leading shape). The loss is computed in float32 (CUDA) /
    double (CPU) and returned in the student's dtype. Gradient w.r.t. the student only (a teacher
    that requires grad, a float64 student, or a device other than cpu / cuda falls back to the same
    formula in PyTorch ops). Works under torch.compile(fullgraph=True).
    ``F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), reduction='batchmean',
    log_target=True) * T**2`` equals ``distillation_loss(s, t, temperature=T, t2_scale=True)``.
    """
    if not isinstance(student_logits, Tensor) or not isinstance(teacher_logits, Tensor):
        raise TypeError("fusedloss.distillation_loss: student_logits and teacher_logits must be Tensors")
    _check_options(temperature, beta, reduction)
    s, t = student_logits, teacher_logits
    if s.shape != t.shape:
        raise ValueError(f"fusedloss.distillation_loss: student_logits shape {tuple(s.shape)} != teacher_logits "
                         f"shape {tuple(t.shape)}")
    if s.dim() < 1:
        raise ValueError("fusedloss.distillation_loss: logits must have at least 1 dimension [..., V]")
    if s.device != t.device:
        raise ValueError(f"fusedloss.distillation_loss: teacher_logits are on {t.device}, student_logits on {s.device}")
    V = s.shape[-1]
    lead = s.shape[:-1]
    N = math.prod(lead)
    if labels is not None:
        if not isinstance(labels, Tensor) or labels.is_floating_point() or labels.is_complex():
            raise TypeError("fusedloss.distillation_loss: labels must be an integer Tensor")
        if labels.shape != lead and not (labels.dim() == 1 and labels.shape[0] == N):
            raise ValueError(f"fusedloss.distillation_loss: labels shape {tuple(labels.shape)} must be the logits' "
                             f"leading shape {tuple(lead)} (or ({N},))")
        if labels.device != s.device:
            raise ValueError(f"fusedloss.distillation_loss: labels are on {labels.device}, student_logits on "
                             f"{s.device}")
    temperature, beta = float(temperature), float(beta)
    if (s.dtype not in _DTYPES or s.device.type not in ("cpu", "cuda") or V < 1
            or (t.requires_grad and torch.is_grad_enabled())):
        return _reference(s, t, labels, temperature, beta, ignore_index, reduction, t2_scale)
    if t.dtype != s.dtype and t.dtype != _F32:
        t = t.to(s.dtype)
    s2, t2 = _as_rows(s, V), _as_rows(t.detach(), V)
    lab = None
    if labels is not None:
        lab = labels.reshape(-1)
        if lab.dtype not in _INDEX_DTYPES:
            lab = lab.long()
        lab = lab.contiguous()
    red = DISTILL_REDUCTIONS[reduction]
    args = (temperature, beta, int(ignore_index), red, bool(t2_scale))
    if red != _NONE and s.requires_grad and torch.is_grad_enabled():
        # eager: the custom op's C call without its Python dispatch (s22: the KL step's host time before its
        # kernel was the gap between 1.17x back to back and 1.34-1.43x synchronised)
        loss = kept_grad_loss((s2, t2, lab), lambda: _run(2, s2, t2, lab, None, *args),
                              lambda: torch.ops.fusedloss.distill_loss_and_grad(s2, t2, lab, *args),
                              "distillation_loss", "mean / sum / batchmean")
    else:
        loss = torch.ops.fusedloss.distill_forward(s2, t2, lab, *args)
        if red == _NONE:
            loss = loss.reshape(lead)
    return loss if loss.dtype == s.dtype else loss.to(s.dtype)


def kl_div_logits(student_logits: Tensor, teacher_logits: Tensor, labels: Optional[Tensor] = None, *,
                  temperature: float = 1.0, ignore_index: int = -100, reduction: str = "batchmean",
                  t2_scale: bool = False, reverse: bool = False) -> Tensor:
    """KL(P || Q) of the teacher P and student Q on logits (reverse=True: KL(Q || P)), i.e.
    distillation_loss with beta 0 (1). See distillation_loss."""
    return distillation_loss(student_logits, teacher_logits, labels, temperature=temperature,
                             beta=1.0 if reverse else 0.0, ignore_index=ignore_index, reduction=reduction,
                             t2_scale=t2_scale)


def jsd_logits(student_logits: Tensor, teacher_logits: Tensor, labels: Optional[Tensor] = None, *,
               beta: float = 0.5, temperature: float = 1.0, ignore_index: int = -100,
               reduction: str = "batchmean", t2_scale: bool = False) -> Tensor:
    """The generalised Jensen-Shannon divergence beta KL(P || M) + (1 - beta) KL(Q || M),
    M = beta P + (1 - beta) Q (teacher P, student Q; beta 0.5: the symmetric JSD), i.e.
    distillation_loss with that beta (beta 0 / 1 are forward / reverse KL, as Liger's LigerJSD).
    See distillation_loss."""
    return distillation_loss(student_logits, teacher_logits, labels, temperature=temperature, beta=beta,
                             ignore_index=ignore_index, reduction=reduction, t2_scale=t2_scale)


class DistillationLoss(torch.nn.Module):
    """Module form of fusedloss.distillation_loss: forward(student_logits, teacher_logits, labels=None).

    Options as distillation_loss's keywords (validated here): temperature (T > 0), beta (0 forward
    KL, 1 reverse KL, else JSD_beta), ignore_index, reduction ('batchmean' default, 'mean', 'sum',
    'none'), t2_scale (multiply by T^2)."""

    def __init__(self, temperature: float = 1.0, beta: float = 0.0, ignore_index: int = -100,
                 reduction: str = "batchmean", t2_scale: bool = False):
        super().__init__()
        _check_options(temperature, beta, reduction)
        self.temperature = float(temperature)
        self.beta = float(beta)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.t2_scale = bool(t2_scale)

    def forward(self, student_logits: Tensor, teacher_logits: Tensor, labels: Optional[Tensor] = None) -> Tensor:
        return distillation_loss(student_logits, teacher_logits, labels, temperature=self.temperature,
                                 beta=self.beta, ignore_index=self.ignore_index, reduction=self.reduction,
                                 t2_scale=self.t2_scale)

    def extra_repr(self) -> str:
        return (f"temperature={self.temperature}, beta={self.beta}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}, t2_scale={self.t2_scale}")
