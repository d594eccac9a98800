"""fusedloss.functional — drop-ins for torch.nn.functional.cross_entropy and gelu (layer 4, STYLE.md section 7).

    import fusedloss
    loss = fusedloss.cross_entropy(logits.view(-1, V), targets.view(-1))
    h = fusedloss.gelu(x, bias, approximate="tanh")          # F.gelu(x + bias), bias grad fused
    loss = fusedloss.linear_cross_entropy(hidden, lm_head.weight, targets)   # no [N, V] logits
    loss = fusedloss.vocab_parallel_cross_entropy(local_logits, targets, start, end, group=tp_group)

Shapes, options and results follow F.cross_entropy; the fast path is 2-D (N, C) logits whose
rows are contiguous (any row stride >= C). See cross_entropy's docstring for the differences.
"""
import math
import numbers

import torch
from torch import Tensor

from . import autograd as _autograd
from . import ops  # also registers torch.ops.fusedloss.*
from ._lib import REDUCTIONS

def _finite(v):
    # comparisons, not math.isfinite: they also work on the SymFloats of torch.compile(dynamic=True)
    return -math.inf < v < math.inf


__all__ = ["cross_entropy", "gelu", "linear_cross_entropy", "vocab_parallel_cross_entropy"]

# Tests set this to run the eager calls through the custom ops too (the path torch.compile takes).
_FORCE_OPS = False

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int64, torch.int32)

# ---- the eager fast path -------------------------------------------------------------------
# At small sizes a call is host-bound, so the common case -- eager mode, plain tensors, 2-D
# (N, C) logits with unit column stride, (N,) class indices, options seen before -- is handled
# by _eager() with a handful of attribute checks, then one autograd.Function whose forward and
# backward make the C calls directly (ops.run_*). Anything else (first call with some options,
# other shapes, soft targets, weights needing a conversion, errors, tensor subclasses, dispatch
# modes, torch.compile) takes the general path below, which validates everything, names the
# bad argument, and ends in _eager() too when it can.
_is_compiling = torch.compiler.is_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack
_functorch_level = torch._C._functorch.peek_interpreter_stack
_grad_enabled = torch.is_grad_enabled
_Parameter = torch.nn.Parameter
_F32 = torch.float32
_FL_DTYPES = ops._DTYPES
_FL_INDEX_DTYPES = ops._INDEX_DTYPES

# (ignore_index, type(ignore_index), reduction, label_smoothing, z_loss, softcap, logit_scale) as
# the caller passed them -> ops.CEConfig of the validated values. Filled by the general path
# after validation, only for values of these exact types (bounded, hashable by value), so a hit
# means the options were valid; the type of ignore_index is part of the key (True == 1).
_CONFIGS = {}
_CACHEABLE = (int, float, str, bool, type(None))


def _remember(key, ignore_index, red, label_smoothing, z_loss, cap, logit_scale):
    cfg = ops.config(ignore_index, red, label_smoothing, z_loss, cap, logit_scale)
    if all(type(v) in _CACHEABLE for v in (key[0],) + key[2:]):
        if len(_CONFIGS) >= 256:
            _CONFIGS.clear()
        _CONFIGS[key] = cfg
    return cfg


def _plain_vector(v, V, x, idx):
    """True when v (a weight or logit offset) can go to the C call as it is: a plain fp32 (V,)
    contiguous tensor without grad on x's device."""
    tv = type(v)
    return not ((tv is not Tensor and tv is not _Parameter) or v.dtype is not _F32
                or v.requires_grad or v.dim() != 1 or v.shape[0] != V
                or (V > 1 and not v.is_contiguous())
                or v.is_cuda != x.is_cuda or (idx >= 0 and v.get_device() != idx)
                or not (v.is_cuda or v.is_cpu))


def _eager(x, t, weight, cfg, inplace, return_lse, offset=None):
    """Loss (and lse if return_lse) for 2-D logits x, 1-D class indices t, fp32 weight and logit
    offset or None, through the C calls directly; None when anything is not the plain case (the
    caller then takes the general path, which reports errors). Does not check
    ignore_index/option values (cfg holds validated ones) nor target values (the C library
    does)."""
    tx = type(x)
    if ((tx is not Tensor and tx is not _Parameter) or type(t) is not Tensor or _dispatch_depth()
            or _functorch_level() is not None):   # vmap / grad transforms: the ops path
        return None
    dt = _FL_DTYPES.get(x.dtype)
    it = _FL_INDEX_DTYPES.get(t.dtype)
    if dt is None or it is None or x.dim() != 2 or t.dim() != 1:
        return None
    N, V = x.shape
    if N == 0 or V == 0 or t.shape[0] != N:
        return None
    if x.is_contiguous():
        ld = V
    else:
        s0, s1 = x.stride()
        if (V > 1 and s1 != 1) or (N > 1 and s0 < V):
            return None
        ld = s0 if N > 1 else V
    if N > 1 and not t.is_contiguous():
        return None
    if x.is_cuda:
        idx = x.get_device()
        if not t.is_cuda or t.get_device() != idx:
            return None
    elif x.is_cpu and t.is_cpu:
        idx = -1
    else:
        return None
    if weight is None:
        wptr = 0
    else:
        if not _plain_vector(weight, V, x, idx):
            return None
        wptr = weight.data_ptr()
    if offset is None:
        optr = 0
    else:
        if not _plain_vector(offset, V, x, idx):
            return None
        optr = offset.data_ptr()
    plan = ops.plan(N, V, ld, dt, it, idx, cfg, wptr, optr)
    if x.requires_grad and _grad_enabled():
        if inplace:
            loss = _autograd.EagerInplaceFunction.apply(x, t, weight, offset, plan)
        else:
            loss = _autograd.CrossEntropyFunction.apply(x, t, weight, offset, plan)
        return (loss, loss.grad_fn.lse) if return_lse else loss
    loss, lse = ops.run_forward(x, t, plan, return_lse)
    return (loss, lse) if return_lse else loss


def _ce_options(fn, reduction, ignore_index, label_smoothing, z_loss, softcap, logit_scale):
    """Check the cross-entropy options (errors name fn and the argument); returns (fl reduction,
    ignore_index, label_smoothing, z_loss, softcap (0.0 = off), logit_scale) as int/floats."""
    red = REDUCTIONS.get(reduction) if isinstance(reduction, str) else None
    if red is None:
        raise ValueError(f"{fn}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{fn}: ignore_index must be an int, got {ignore_index!r}")
    ignore_index = int(ignore_index)
    label_smoothing = float(label_smoothing)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{fn}: label_smoothing must be in [0, 1], got {label_smoothing}")
    z_loss = float(z_loss)
    if not (z_loss >= 0.0 and _finite(z_loss)):
        raise ValueError(f"{fn}: z_loss must be finite and >= 0, got {z_loss}")
    cap = 0.0 if softcap is None else float(softcap)
    if not (cap >= 0.0 and _finite(cap)):
        raise ValueError(f"{fn}: softcap must be None or finite and > 0, got {softcap}")
    logit_scale = float(logit_scale)
    if not (_finite(logit_scale) and logit_scale != 0.0):
        raise ValueError(f"{fn}: logit_scale must be finite and nonzero, got {logit_scale}")
    return red, ignore_index, label_smoothing, z_loss, cap, logit_scale


def cross_entropy(input, target, weight=None, ignore_index=-100, reduction="mean",
                  label_smoothing=0.0, *, z_loss=0.0, softcap=None, logit_scale=1.0,
                  logit_offset=None, inplace_backward=False, return_lse=False):
    r"""Cross-entropy of logits and targets, fused: F.cross_entropy's semantics, one pass each way.

    Arguments shared with :func:`torch.nn.functional.cross_entropy` mean exactly the same:

    - ``input``: logits of shape (C,), (N, C) or (N, C, d1, ..., dK) with the class dimension 1;
      float32, float16 or bfloat16 (float64 raises TypeError: there is no double kernel).
    - ``target``: class indices (int64, or int32 as an extension) of shape (), (N) or
      (N, d1, ..., dK); or class probabilities (a floating tensor of the input's shape).
    - ``weight`` (C,), ``ignore_index``, ``reduction`` ('none' | 'mean' | 'sum'),
      ``label_smoothing`` in [0, 1]; weighted mean = sum w_t l_i / sum w_t; all rows ignored
      gives a NaN mean (and a zero gradient), as in PyTorch.

    The deprecated ``size_average`` / ``reduce`` are not accepted, so pass ``ignore_index`` and
    the later arguments by keyword when porting code that used them positionally.

    Extensions (keyword-only):

    - ``z_loss``: adds ``z_loss * lse**2`` per row (PaLM's z-loss, Liger's lse_square_scale),
      not multiplied by class weights; with reduction 'mean' it is averaged over the
      non-ignored rows.
    - ``softcap``: if given (> 0), logits become ``softcap * tanh(x / softcap)`` first
      (Gemma 2); ``logit_scale`` multiplies the logits before that (default 1).
    - ``logit_offset``: (C,) floating tensor on the input's device, a per-class logit offset
      added after softcap: loss = F.cross_entropy(softcap(s*x) + logit_offset, ...); logit
      adjustment (Menon et al. 2021) uses tau * log(class prior). A constant (used as float32,
      detached: it gets no gradient); it must be finite (the CPU kernels check it; on CUDA a
      non-finite offset gives NaN losses).
    - ``inplace_backward``: the gradient is computed during forward, in one fused pass, and
      written **over the logits' storage** (no (N, C) gradient buffer is allocated; the logits
      are destroyed). Backward then multiplies it by the upstream gradient in place, one more
      pass (see fusedloss.autograd). Only for class-index targets; for 2-D contiguous-row
      inputs it is the caller's tensor that is overwritten.
    - ``return_lse``: also return the per-row log-sum-exp (float32, the target's shape, 0 on
      ignored rows), as a tensor without gradient (of the offset logits when logit_offset is
      given).

    Results: the loss is always float32 (fp32 accumulation whatever the input dtype, also under
    torch.autocast: fp16/bf16 logits reach the kernel as they are, with no upcast copy); the
    gradient has the input's dtype. Double backward raises RuntimeError.

    Probability (soft) targets are computed with torch ops (log_softmax based, including label
    smoothing, class weights, z_loss, softcap, logit_scale and logit_offset) because the C API
    only takes class indices: correct, differentiable, but not fused. Inputs with the class in dimension 1
    and trailing dimensions are moved to class-last with movedim + reshape (a copy): correct,
    not fast.

    Out-of-range class indices (not in [0, C) and not ignore_index) raise
    fusedloss.TargetOutOfRangeError (an IndexError) on CPU. On CUDA they cannot be checked
    without a host sync: that row's loss and gradient become NaN and a device flag is set;
    fusedloss.check_errors() synchronises and raises if the flag is set. With
    fusedloss.set_debug(True) (or FUSEDLOSS_DEBUG=1) every call checks at once.
    """
    key = None
    if not _FORCE_OPS and not _is_compiling():
        key = (ignore_index, type(ignore_index), reduction, label_smoothing, z_loss, softcap,
               logit_scale)
        try:
            cfg = _CONFIGS[key]
        except (KeyError, TypeError):  # first call with these options, or unhashable values
            cfg = None
        if cfg is not None:
            out = _eager(input, target, weight, cfg, inplace_backward, return_lse, logit_offset)
            if out is not None:
                return out

    # ---- argument checks (each error names the argument) ----
    if not isinstance(input, Tensor):
        raise TypeError(f"cross_entropy: input must be a Tensor, got {type(input).__name__}")
    if not isinstance(target, Tensor):
        raise TypeError(f"cross_entropy: target must be a Tensor, got {type(target).__name__}")
    if input.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"cross_entropy: input dtype {input.dtype} is not supported "
                        "(float32, float16, bfloat16)")
    red, ignore_index, label_smoothing, z_loss, cap, logit_scale = _ce_options(
        "cross_entropy", reduction, ignore_index, label_smoothing, z_loss, softcap, logit_scale)

    ndim = input.dim()
    if ndim == 0:
        raise ValueError("cross_entropy: input must have at least 1 dimension (C,), got a 0-d tensor")
    C = input.shape[1] if ndim >= 2 else input.shape[0]
    if C < 1:
        raise ValueError(f"cross_entropy: input has no classes (shape {tuple(input.shape)})")
    if target.device != input.device:
        raise ValueError(f"cross_entropy: target is on {target.device} but input is on {input.device}")
    soft = target.is_floating_point()
    if soft:
        if target.shape != input.shape:
            raise ValueError(f"cross_entropy: probability target must have the input's shape "
                             f"{tuple(input.shape)}, got {tuple(target.shape)}")
    else:
        if target.dtype not in _INDEX_DTYPES:
            raise TypeError(f"cross_entropy: target dtype {target.dtype} is not supported "
                            "(int64 or int32 class indices, or floating probabilities)")
        sample_shape = input.shape[:1] + input.shape[2:] if ndim >= 2 else torch.Size([])
        if target.shape != sample_shape:
            raise ValueError(f"cross_entropy: target must have shape {tuple(sample_shape)} for "
                             f"input of shape {tuple(input.shape)}, got {tuple(target.shape)}")
    if weight is not None:
        if not isinstance(weight, Tensor):
            raise TypeError(f"cross_entropy: weight must be a Tensor or None, got {type(weight).__name__}")
        if not weight.is_floating_point():
            raise TypeError(f"cross_entropy: weight must be floating point, got {weight.dtype}")
        if weight.shape != (C,):
            raise ValueError(f"cross_entropy: weight must have shape ({C},), got {tuple(weight.shape)}")
        if weight.device != input.device:
            raise ValueError(f"cross_entropy: weight is on {weight.device} but input is on {input.device}")
        weight = weight.detach().to(torch.float32).contiguous()
    logit_offset = _class_vector("cross_entropy", "logit_offset", logit_offset, C, input.device)

    # ---- to 2-D (M, C) class-last ----
    if ndim == 1:
        x = input.unsqueeze(0)
    elif ndim == 2:
        x = input
    else:
        x = input.movedim(1, -1).reshape(-1, C)
    out_shape = input.shape[:1] + input.shape[2:] if ndim >= 2 else torch.Size([])

    if soft:
        t = target.unsqueeze(0) if ndim == 1 else target if ndim == 2 else \
            target.movedim(1, -1).reshape(-1, C)
        loss, lse = _soft_cross_entropy(x, t, weight, red, label_smoothing, z_loss, cap,
                                        logit_scale, logit_offset)
    else:
        M = x.shape[0]
        if (C > 1 and x.stride(1) != 1) or (M > 1 and x.stride(0) < C):
            x = x.contiguous()
        t = target if ndim == 2 else target.reshape(M)
        if M > 1 and t.stride(0) != 1:
            t = t.contiguous()
        out = None
        if key is not None and _autograd.eager_ok(x):
            cfg = _remember(key, ignore_index, red, label_smoothing, z_loss, cap, logit_scale)
            out = _eager(x, t, weight, cfg, inplace_backward, return_lse, logit_offset)
        if out is not None:
            loss, lse = out if return_lse else (out, None)
        elif inplace_backward and x.requires_grad and torch.is_grad_enabled():
            loss, lse = _autograd.CrossEntropyInplaceFunction.apply(
                x, t, weight, ignore_index, red, label_smoothing, z_loss, cap, logit_scale,
                logit_offset)
        else:  # torch.compile / export / fake tensors / N == 0: the custom op (register_autograd)
            loss, lse = torch.ops.fusedloss.cross_entropy_forward(
                x, t, weight, ignore_index, red, label_smoothing, z_loss, cap, logit_scale,
                logit_offset)

    if red == REDUCTIONS["none"]:
        loss = loss.reshape(out_shape)
    if return_lse:
        return loss, lse.reshape(out_shape)
    return loss


def _class_vector(fn, name, v, C, device):
    """Check a per-class (C,) floating tensor argument (errors name it); returns it detached as
    contiguous float32, or None."""
    if v is None:
        return None
    if not isinstance(v, Tensor):
        raise TypeError(f"{fn}: {name} must be a Tensor or None, got {type(v).__name__}")
    if not v.is_floating_point():
        raise TypeError(f"{fn}: {name} must be floating point, got {v.dtype}")
    if v.shape != (C,):
        raise ValueError(f"{fn}: {name} must have shape ({C},), got {tuple(v.shape)}")
    if v.device != device:
        raise ValueError(f"{fn}: {name} is on {v.device} but input is on {device}")
    return v.detach().to(_F32).contiguous()


def _soft_cross_entropy(x, t, weight, red, eps, z_loss, cap, scale, offset=None):
    """Probability targets with torch ops, as F.cross_entropy defines them:
    l_i = -sum_c w_c * y_c * log_softmax(z)_c with y = (1 - eps) * t + eps / C; the 'mean' is
    over rows (not weighted); plus z_loss * lse_i^2 (mean over rows). z = softcap(scale * x) +
    offset."""
    C = x.shape[-1]
    z = x.float()
    if scale != 1.0:
        z = z * scale
    if cap > 0.0:
        z = cap * torch.tanh(z / cap)
    if offset is not None:
        z = z + offset
    lse = torch.logsumexp(z, dim=-1)
    logp = z - lse.unsqueeze(-1)
    y = t.float()
    if eps > 0.0:
        y = y * (1.0 - eps) + eps / C
    if weight is not None:
        y = y * weight
    loss = -(y * logp).sum(-1)
    if z_loss > 0.0:
        loss = loss + z_loss * lse.square()
    if red == REDUCTIONS["sum"]:
        loss = loss.sum()
    elif red == REDUCTIONS["mean"]:
        loss = loss.mean()
    return loss, lse.detach()


# ---- GeLU (+ bias) ---------------------------------------------------------------------------
from ._lib import GELU_APPROX as _GELU_APPROX  # noqa: E402


def gelu(input, bias=None, approximate="tanh"):
    r"""GeLU of ``input + bias``, fused: ``F.gelu(input + bias, approximate=approximate)`` in one
    pass forward and one pass backward (dinput and, when the bias requires grad, dbias = the
    column sums, from the same single read of input and the gradient).

    - ``input``: (..., F), float32 / float16 / bfloat16 (float64 raises TypeError); rows must be
      contiguous (a 2-D tensor with any row stride >= F is used as it is, else a copy is made).
    - ``bias``: None or (F,), of input's dtype or float32 (e.g. an fp32 parameter under
      autocast; fp16/bf16 biases of the other 16-bit dtype are upcast to float32 first).
    - ``approximate``: ``'tanh'`` (the default here, GPT-2's "gelu_new") or ``'none'`` (exact
      erf, torch's default) -- PyTorch's formulas operation for operation in float32 (bitwise
      eager on the same CUDA toolkit); on CUDA, float16 / bfloat16 use faster fp32 formulas
      within 1 ulp of the dtype of the exactly rounded GeLU (more accurate than PyTorch's where
      its 1 + tanh cancels; environment FUSEDLOSS_GELU_EXACT16=1 selects PyTorch's operations).

    Returns a new contiguous tensor of input's shape and dtype. input + bias is formed in
    float32 and not rounded before the activation (as torch.compile's fused kernel; eager
    ``F.gelu(x + b)`` rounds the sum to fp16/bf16 first, so with a bias and 16-bit inputs the
    result may differ from eager by one ulp on a few elements). Backward saves input and bias
    only. Double backward raises RuntimeError. Works under torch.compile(fullgraph=True) and in
    CUDA graphs (custom ops fusedloss::gelu_forward / gelu_backward).
    """
    if not isinstance(input, Tensor):
        raise TypeError(f"gelu: input must be a Tensor, got {type(input).__name__}")
    code = _GELU_APPROX.get(approximate) if isinstance(approximate, str) else None
    if code is None:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    if input.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"gelu: input dtype {input.dtype} is not supported (float32, float16, bfloat16)")
    if input.dim() == 0:
        raise ValueError("gelu: input must have at least 1 dimension (..., F), got a 0-d tensor")
    if bias is not None:
        if not isinstance(bias, Tensor):
            raise TypeError(f"gelu: bias must be a Tensor or None, got {type(bias).__name__}")
        F_ = input.shape[-1]
        if bias.shape != (F_,):
            raise ValueError(f"gelu: bias must have shape ({F_},) (the last dimension of input), got "
                             f"{tuple(bias.shape)}")
        if bias.device != input.device:
            raise ValueError(f"gelu: bias is on {bias.device} but input is on {input.device}")
        if bias.dtype not in (input.dtype, _F32):
            if bias.dtype not in _FLOAT_DTYPES:
                raise TypeError(f"gelu: bias dtype {bias.dtype} is not supported (input's dtype or float32)")
            bias = bias.float()  # exact for fp16/bf16; differentiable, so its grad comes back cast
    if not _FORCE_OPS and _autograd.eager_ok(input) and (bias is None or _autograd.eager_ok(bias)):
        if _grad_enabled() and (input.requires_grad or (bias is not None and bias.requires_grad)):
            return _autograd.GeluFunction.apply(input, bias, code)
        return ops.run_gelu_forward(input, bias, code)
    return torch.ops.fusedloss.gelu_forward(input, bias, code)


# ---- linear + cross-entropy ---------------------------------------------------------------------
from ._lib import LCE_ACCUM as _LCE_ACCUM, FL_LCE_DEFAULT_BYTE_BUDGET as _LCE_BUDGET  # noqa: E402


def _autocast_dtype(device_type):
    """torch.autocast's dtype for tensors on this device type, or None where autocast is off."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _positive_int_or_none(fn, name, v):
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{fn}: {name} must be None or an int >= 1, got {v!r}")
    return int(v)


def linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0, *, class_weight=None, z_loss=0.0, softcap=None,
                         logit_scale=1.0, logit_offset=None, chunk_rows=None, byte_budget=None,
                         wgrad_accum="auto", recompute=None):
    r"""``F.cross_entropy(F.linear(hidden, weight, bias), target, ...)`` without the logits.

    The language-model head and its loss in one op: the [N, V] logits are never held (the C
    library computes them a chunk of rows at a time into its workspace, turns each chunk into its
    gradient in place, and accumulates dhidden / dweight / dbias from it; include/fusedloss.h
    section 6).

    - ``hidden``: (..., H), float32 / float16 / bfloat16; flattened to (N, H) rows.
    - ``weight``: (V, H), the lm-head weight (``lm_head.weight``); ``bias``: (V,) or None.
    - ``target``: class indices (int64, or int32) of shape ``hidden.shape[:-1]``.
    - ``ignore_index``, ``reduction`` ('none' | 'mean' | 'sum'), ``label_smoothing``, and the
      keyword-only ``class_weight`` ((V,), F.cross_entropy's ``weight``), ``z_loss``,
      ``softcap``, ``logit_scale``: exactly as :func:`fusedloss.cross_entropy`.
    - ``logit_offset``: (V,), a per-class logit offset added after softcap: loss =
      F.cross_entropy(softcap(s * F.linear(hidden, weight, bias)) + logit_offset, ...); logit
      adjustment (Menon et al. 2021) uses tau * log(class prior). A constant (no gradient).

    Results match the unfused ops in the precision PyTorch runs them: the logits are accumulated
    in fp32 (double on the CPU backend) and rounded once to the input dtype, as F.linear returns
    them; the cross-entropy is then computed from those in fp32 (the loss is float32); the
    gradients have their inputs' dtypes. ``reduction='none'`` returns the per-row loss in
    ``target``'s shape. Under ``torch.autocast`` hidden, weight and bias are cast to the autocast
    dtype as F.linear is, and the weight (and bias) gradient is formed in the parameter's own
    dtype: an fp32 weight gets an fp32 gradient accumulated exactly (not a bf16 one cast up).

    Gradient modes (``recompute``):

    - ``None`` (default): for 'mean' / 'sum', the gradients are computed in the forward for an
      upstream gradient of 1 and scaled by the real one in backward (in place, on the device,
      free when it is 1): 3 GEMMs; dweight and dhidden are held from forward to backward.
      For 'none' (a per-row upstream gradient) the recompute mode.
    - ``True``: recompute: the forward keeps only the per-row lse (1 GEMM); backward recomputes
      the logits (3 GEMMs). Less memory between forward and backward, about 1/3 more FLOP.
    - ``False``: the first mode; an error with reduction='none'.

    Without a gradient to compute (no input requires grad, or under ``torch.no_grad()``) only the
    loss is computed (1 GEMM). Gradients are computed only for the inputs that require grad,
    except dhidden, which the C library always forms. Backward runs once (use recompute=True to
    backward twice through the same graph); double backward raises RuntimeError.

    Tuning (keyword-only): ``chunk_rows`` rows per chunk (None: the most that fit
    ``byte_budget`` bytes of workspace, default 512 MiB); ``wgrad_accum`` for a 16-bit weight
    gradient: 'fp32' (an fp32 accumulator in the workspace, one rounding), 'lean' (no extra
    memory, rounded after each chunk) or 'auto' (fp32 when the accumulator fits half the budget).
    fp32 inputs use TF32 on CUDA unless ``torch.get_float32_matmul_precision() == 'highest'``.

    Works under torch.compile(fullgraph=True) and in CUDA graphs (no host synchronisation; make
    the first call on a device outside the capture: it creates that device's library context).
    Out-of-range targets: as :func:`fusedloss.cross_entropy` (an IndexError on the CPU, NaN rows
    and fusedloss.check_errors() on CUDA).
    """
    fn = "linear_cross_entropy"
    for name, t in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{fn}: {name} must be a Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, Tensor):
        raise TypeError(f"{fn}: bias must be a Tensor or None, got {type(bias).__name__}")
    red, ignore_index, label_smoothing, z_loss, cap, logit_scale = _ce_options(
        fn, reduction, ignore_index, label_smoothing, z_loss, softcap, logit_scale)
    chunk_rows = _positive_int_or_none(fn, "chunk_rows", chunk_rows)
    byte_budget = _positive_int_or_none(fn, "byte_budget", byte_budget)
    accum = _LCE_ACCUM.get(wgrad_accum) if isinstance(wgrad_accum, str) else None
    if accum is None:
        raise ValueError(f"{fn}: wgrad_accum must be 'auto', 'fp32' or 'lean', got {wgrad_accum!r}")
    if recompute is not None and not isinstance(recompute, bool):
        raise TypeError(f"{fn}: recompute must be None, True or False, got {recompute!r}")
    if recompute is False and red == REDUCTIONS["none"]:
        raise ValueError(f"{fn}: reduction='none' needs recompute=True or None (a per-row upstream "
                         "gradient is known only in backward)")

    dev = hidden.device
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{fn}: hidden is on {dev}; only cpu and cuda tensors are supported")
    for name, t in (("weight", weight), ("target", target), ("bias", bias),
                    ("class_weight", class_weight), ("logit_offset", logit_offset)):
        if t is not None and isinstance(t, Tensor) and t.device != dev:
            raise ValueError(f"{fn}: {name} is on {t.device} but hidden is on {dev}")
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if t is not None and t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{fn}: {name} dtype {t.dtype} is not supported (float32, float16, bfloat16)")
    if hidden.dim() < 1:
        raise ValueError(f"{fn}: hidden must have at least 1 dimension (..., H), got a 0-d tensor")
    H = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != H:
        raise ValueError(f"{fn}: weight must have shape (V, {H}) for hidden of shape "
                         f"{tuple(hidden.shape)}, got {tuple(weight.shape)}")
    V = weight.shape[0]
    if V < 1 or H < 1:
        raise ValueError(f"{fn}: need V >= 1 classes and H >= 1 features, got weight of shape "
                         f"{tuple(weight.shape)}")
    if bias is not None and bias.shape != (V,):
        raise ValueError(f"{fn}: bias must have shape ({V},), got {tuple(bias.shape)}")
    if target.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{fn}: target dtype {target.dtype} is not supported (int64 or int32 class "
                        "indices)")
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"{fn}: target must have shape {tuple(hidden.shape[:-1])} for hidden of shape "
                         f"{tuple(hidden.shape)}, got {tuple(target.shape)}")
    if class_weight is not None:
        if not isinstance(class_weight, Tensor):
            raise TypeError(f"{fn}: class_weight must be a Tensor or None, got {type(class_weight).__name__}")
        if not class_weight.is_floating_point() or class_weight.shape != (V,):
            raise ValueError(f"{fn}: class_weight must be a floating tensor of shape ({V},), got "
                             f"{class_weight.dtype} {tuple(class_weight.shape)}")
        class_weight = class_weight.detach().to(_F32).contiguous()
    logit_offset = _class_vector(fn, "logit_offset", logit_offset, V, dev)

    dtype = _autocast_dtype(dev.type)
    if dtype is None:  # as F.linear: one dtype for all three
        dtype = hidden.dtype
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None and t.dtype != dtype:
                raise TypeError(f"{fn}: {name} dtype {t.dtype} differs from hidden's ({dtype}); cast "
                                "them to one dtype or run under torch.autocast")
    elif dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{fn}: autocast dtype {dtype} is not supported (float16, bfloat16)")

    # ---- to rows: hidden (N, H) with unit column stride, target (N,) contiguous ----
    h = hidden.reshape(-1, H)
    N = h.shape[0]
    if (H > 1 and h.stride(1) != 1) or (N > 1 and h.stride(0) < H):
        h = h.contiguous()
    w = weight
    if (H > 1 and w.stride(1) != 1) or (V > 1 and w.stride(0) < H):
        w = w.contiguous()
    b = bias
    if b is not None and V > 1 and b.stride(0) != 1:
        b = b.contiguous()
    t = target.reshape(-1)
    if N > 1 and t.stride(0) != 1:
        t = t.contiguous()

    ce_args = (ignore_index, red, label_smoothing, z_loss, cap, logit_scale)
    lce_args = (chunk_rows or 0, byte_budget or _LCE_BUDGET, accum)
    eager = (not _FORCE_OPS and _autograd.eager_ok(hidden) and _autograd.eager_ok(weight)
             and (bias is None or _autograd.eager_ok(bias)))
    grad = _grad_enabled()
    needs = (grad and hidden.requires_grad, grad and weight.requires_grad,
             grad and bias is not None and bias.requires_grad)
    if needs[0] or needs[1] or needs[2]:
        rc = recompute if recompute is not None else red == REDUCTIONS["none"]
        loss = _autograd.LinearCrossEntropyFunction.apply(h, w, b, t, class_weight, dtype, ce_args,
                                                          lce_args, needs, rc, eager, logit_offset)
    else:  # nothing to differentiate: the loss only (1 GEMM)
        h, w = h.to(dtype), w.to(dtype)
        b = b.to(dtype) if b is not None else None
        if eager:
            loss, _ = ops.lce_forward_impl(h, w, b, t, class_weight, *ce_args, *lce_args,
                                           logit_offset, want_lse=False)
        else:
            loss, _ = torch.ops.fusedloss.linear_cross_entropy_forward(h, w, b, t, class_weight,
                                                                       *ce_args, *lce_args,
                                                                       logit_offset)
    if red == REDUCTIONS["none"]:
        loss = loss.reshape(target.shape)
    return loss


# ---- vocab-parallel cross-entropy -------------------------------------------------------------
def _vp_dist():
    """torch.distributed when it is built and initialised, else None (world size 1)."""
    d = torch.distributed
    return d if d.is_available() and d.is_initialized() else None


def _vp_funcol():
    from torch.distributed import _functional_collectives as fc
    return fc


def _vp_all_gather(stats, group, k):
    """Step 2: the k ranks' stats [N, 4] -> gathered [k, N, 4] in rank order (rank r's rows at
    [r]). Eager: all_gather_into_tensor into a (k*N, 4) buffer (the output shape every backend
    takes; gloo refuses (k, N, 4)); traced: the functional collective, which torch.compile keeps in
    its graph (no graph break)."""
    N = stats.shape[0]
    if _is_compiling():
        fc = _vp_funcol()
        gather = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor  # all_gather_tensor: deprecated name
        return gather(stats, 0, group).reshape(k, N, 4)
    out = torch.empty((k * N, 4), dtype=stats.dtype, device=stats.device)
    torch.distributed.all_gather_into_tensor(out, stats, group=group)
    return out.view(k, N, 4)


def _vp_max_vocab_end(vocab_end, group, device):
    """V = the largest vocab_end of the group: one all-reduce of one int64 and a host read (a
    device sync on CUDA; a graph break under torch.compile)."""
    t = torch.tensor([vocab_end], dtype=torch.int64, device=device)
    if _is_compiling():
        t = _vp_funcol().all_reduce(t, "max", group)
    else:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX, group=group)
    return int(t.item())


def _vp_check_layout(fn, vocab_start, vocab_end, V, N, t, group, k, device):
    """Debug mode: the shards of the group, gathered, must tile [0, V) in rank order, with one V
    and one N, and the targets must be the same on every rank. Every rank sees the same gathered
    values, so every rank raises the same error (none is left waiting in a collective)."""
    d = torch.distributed
    info = torch.tensor([vocab_start, vocab_end, V, N], dtype=torch.int64, device=device)
    out = torch.empty((4 * k,), dtype=torch.int64, device=device)
    d.all_gather_into_tensor(out, info, group=group)
    rows = out.view(k, 4).tolist()
    expect = 0
    for r, (s, e, v, n) in enumerate(rows):
        if s != expect or v != V or n != N or e <= s:
            layout = ", ".join(f"rank {i}: [{a}, {b}) of V={c}, N={m}" for i, (a, b, c, m) in
                               enumerate(rows))
            raise ValueError(f"{fn}: the shards are not contiguous vocabulary slices in rank order "
                             f"covering [0, V) with one V and one N (rank {r} is the first that is "
                             f"wrong); got {layout}")
        expect = e
    if expect != V:
        raise ValueError(f"{fn}: the shards end at {expect}, not at V = {V}")
    if N:
        hi, lo = t.clone(), t.clone()
        d.all_reduce(hi, op=d.ReduceOp.MAX, group=group)
        d.all_reduce(lo, op=d.ReduceOp.MIN, group=group)
        if not torch.equal(hi, lo):
            row = int((hi != lo).nonzero()[0, 0])
            raise ValueError(f"{fn}: target differs between the ranks of the group (first at row "
                             f"{row}); every rank must pass the same (global) class ids")


def _int_arg(fn, name, v):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{fn}: {name} must be an int, got {v!r}")
    return int(v)


def vocab_parallel_cross_entropy(local_logits, target, vocab_start, vocab_end, group=None,
                                 ignore_index=-100, reduction="mean", label_smoothing=0.0, *,
                                 weight=None, z_loss=0.0, softcap=None, logit_scale=1.0,
                                 vocab_size=None, logit_offset=None):
    r"""Cross-entropy of logits sharded by vocabulary over the ranks of a process group.

    Rank r holds ``local_logits`` (..., V_local) for the classes ``[vocab_start, vocab_end)`` of the
    global vocabulary ``[0, V)`` (a Megatron-style vocab-parallel lm head), the same rows on every
    rank. The result is exactly :func:`fusedloss.cross_entropy` of the full logits (every rank's
    shard concatenated): the same loss on every rank (bit for bit), and each rank's gradient is
    the slice of the full gradient for its own shard, with one small collective in the forward:
    an all-gather of 16 bytes per row per rank (O(N), never O(N V)); the backward needs no
    collective (the global log-sum-exp is kept from the forward). Steps (include/fusedloss.h
    section 8): 1. per-row statistics of the shard; 2. their all-gather in rank order; 3. their
    combination into the loss and the global log-sum-exp; 4. in backward, the shard's gradient.

    - ``local_logits``: (..., V_local) with ``V_local = vocab_end - vocab_start``, float32,
      float16 or bfloat16 (classes last, as an lm head's output; any leading shape).
    - ``target``: int64 / int32 GLOBAL class ids of shape ``local_logits.shape[:-1]``, the same on
      every rank; ``ignore_index`` rows count for nothing (all ignored: a NaN mean and a zero
      gradient, as in PyTorch).
    - ``vocab_start``, ``vocab_end``: this rank's slice. **Shards must be in rank order**: rank 0
      holds ``[0, e_0)``, rank r holds ``[e_{r-1}, e_r)``, the last rank ends at V. Uneven shards
      are fine. Checked without a collective: ``0 <= vocab_start < vocab_end <= V``, rank 0 starts
      at 0, the last rank ends at V, rank r leaves room for a class on each other rank (so every
      rank passing the whole vocabulary on a group of k > 1, e.g. group=None in a data-parallel
      job, raises on every rank); an error raised on one rank only leaves the others waiting in
      the all-gather until the group's timeout. With ``fusedloss.set_debug(True)`` (or
      FUSEDLOSS_DEBUG=1) every call also gathers every rank's slice, V and N and compares the
      targets across ranks (three more small collectives; eager mode only), so a bad layout
      raises on every rank.
    - ``group``: the torch.distributed process group of the vocabulary shards (the tensor-parallel
      group), in the group's rank order; None = the default (world) group. Without an initialised
      torch.distributed, the world size is 1: one rank holds the whole vocabulary, no collective.
    - ``vocab_size``: the global V. If None, V is the largest ``vocab_end`` of the group, found
      with one more all-reduce of one int64 and a host read of its result (a device sync on CUDA
      and, under torch.compile, a graph break): pass it when you know it (always in a training
      loop). With world size 1 it defaults to ``vocab_end``.
    - ``weight``: the GLOBAL class weights (V,) (every rank passes the whole array), or None;
      ``label_smoothing`` is over the WHOLE vocabulary (eps / V per class, weighted by the global
      weights), not over the shard.
    - ``logit_offset``: the GLOBAL per-class logit offsets, a (V,) floating tensor on the logits'
      device (every rank passes the whole array), or None; added after softcap, exactly as
      :func:`fusedloss.cross_entropy`'s ``logit_offset`` on the full logits (a constant: no
      gradient; converted to float32 contiguous).
    - ``ignore_index``, ``reduction`` ('none' | 'mean' | 'sum'), ``label_smoothing`` and the
      keyword-only ``z_loss``, ``softcap``, ``logit_scale``: exactly as
      :func:`fusedloss.cross_entropy`. ``reduction='none'`` returns the per-row loss in
      ``target``'s shape.

    The loss is float32 and the same on every rank; call ``backward()`` on it on every rank with
    the same upstream gradient (as a loss replicated over the tensor-parallel group is): each
    rank's backward then gives its shard's gradient, of the logits' dtype. The gradient of
    anything upstream of the logits that is replicated across the group (e.g. the hidden states
    fed to a column-parallel lm head) is the model-parallel framework's business, as usual.
    Double backward raises RuntimeError.

    torch.compile: traceable with ``fullgraph=True`` when ``vocab_size`` is given (the all-gather
    is then the functional collective ``all_gather_single``, kept in the graph; the steps are the
    custom ops ``fusedloss::vp_ce_local_stats`` / ``vp_ce_combine`` / ``vp_ce_backward``). The
    debug-mode layout check is skipped while tracing.

    CPU and CUDA tensors (CUDA: the fl_vp_ce_*_cuda steps on the current stream, no host sync;
    with NCCL the all-gather is capturable in a CUDA graph). A library built without the CUDA
    steps raises :class:`fusedloss.NotBuiltError` for CUDA tensors. Out-of-range targets raise
    TargetOutOfRangeError on the CPU; on CUDA they give NaN rows and set the device error flag,
    as :func:`fusedloss.cross_entropy` does.
    """
    fn = "vocab_parallel_cross_entropy"
    if not isinstance(local_logits, Tensor):
        raise TypeError(f"{fn}: local_logits must be a Tensor, got {type(local_logits).__name__}")
    if not isinstance(target, Tensor):
        raise TypeError(f"{fn}: target must be a Tensor, got {type(target).__name__}")
    red, ignore_index, label_smoothing, z_loss, cap, logit_scale = _ce_options(
        fn, reduction, ignore_index, label_smoothing, z_loss, softcap, logit_scale)
    vocab_start = _int_arg(fn, "vocab_start", vocab_start)
    vocab_end = _int_arg(fn, "vocab_end", vocab_end)
    if local_logits.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{fn}: local_logits dtype {local_logits.dtype} is not supported "
                        "(float32, float16, bfloat16)")
    if local_logits.dim() < 1:
        raise ValueError(f"{fn}: local_logits must have at least 1 dimension (..., V_local), got a "
                         "0-d tensor")
    Vl = local_logits.shape[-1]
    if vocab_start < 0 or vocab_end <= vocab_start:
        raise ValueError(f"{fn}: need 0 <= vocab_start < vocab_end, got vocab_start={vocab_start}, "
                         f"vocab_end={vocab_end}")
    if Vl != vocab_end - vocab_start:
        raise ValueError(f"{fn}: local_logits has {Vl} classes in its last dimension but "
                         f"[vocab_start, vocab_end) = [{vocab_start}, {vocab_end}) has "
                         f"{vocab_end - vocab_start}")
    if vocab_size is not None:
        vocab_size = _int_arg(fn, "vocab_size", vocab_size)
        if vocab_size < vocab_end:
            raise ValueError(f"{fn}: vocab_size ({vocab_size}) < vocab_end ({vocab_end})")
    dev = local_logits.device
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{fn}: local_logits is on {dev}; only cpu and cuda tensors are supported")
    if target.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{fn}: target dtype {target.dtype} is not supported (int64 or int32 class "
                        "indices)")
    if target.shape != local_logits.shape[:-1]:
        raise ValueError(f"{fn}: target must have shape {tuple(local_logits.shape[:-1])} for "
                         f"local_logits of shape {tuple(local_logits.shape)}, got {tuple(target.shape)}")
    if target.device != dev:
        raise ValueError(f"{fn}: target is on {target.device} but local_logits is on {dev}")
    if weight is not None:
        if not isinstance(weight, Tensor):
            raise TypeError(f"{fn}: weight must be a Tensor or None, got {type(weight).__name__}")
        if not weight.is_floating_point() or weight.dim() != 1:
            raise ValueError(f"{fn}: weight must be a 1-D floating tensor (the GLOBAL class weights, "
                             f"shape (V,)), got {weight.dtype} {tuple(weight.shape)}")
        if weight.device != dev:
            raise ValueError(f"{fn}: weight is on {weight.device} but local_logits is on {dev}")
    if logit_offset is not None:
        if not isinstance(logit_offset, Tensor):
            raise TypeError(f"{fn}: logit_offset must be a Tensor or None, got "
                            f"{type(logit_offset).__name__}")
        if not logit_offset.is_floating_point():
            raise TypeError(f"{fn}: logit_offset must be floating point, got {logit_offset.dtype}")
        if logit_offset.dim() != 1:
            raise ValueError(f"{fn}: logit_offset must be 1-D (the GLOBAL per-class logit offsets, "
                             f"shape (V,)), got shape {tuple(logit_offset.shape)}")
        if logit_offset.device != dev:
            raise ValueError(f"{fn}: logit_offset is on {logit_offset.device} but local_logits is "
                             f"on {dev}")
    if dev.type == "cuda" and ops.vp_cuda_missing():
        raise ops.vp_cuda_not_built_error(fn)  # before any collective: on every rank alike

    # ---- the group: k ranks, this one's place among them ----
    dist = _vp_dist()
    if dist is None:
        if group is not None:
            raise ValueError(f"{fn}: group was given but torch.distributed is not initialised "
                             "(call torch.distributed.init_process_group first, or pass group=None "
                             "for a single rank)")
        k, rank = 1, 0
    else:
        if group is None:
            group = dist.group.WORLD
        k = dist.get_world_size(group)
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError(f"{fn}: this process (global rank {dist.get_rank()}) is not a member "
                             "of group")
    if vocab_size is None:
        vocab_size = vocab_end if k == 1 else _vp_max_vocab_end(vocab_end, group, dev)
    V = vocab_size
    if rank == 0 and vocab_start != 0:
        raise ValueError(f"{fn}: rank 0 of the group must hold the first slice of the vocabulary "
                         f"(vocab_start 0), got vocab_start={vocab_start} (shards go in rank order)")
    if rank == k - 1 and vocab_end != V:
        raise ValueError(f"{fn}: the last rank of the group ({rank}) must hold the last slice of "
                         f"the vocabulary (vocab_end = V = {V}), got vocab_end={vocab_end} (shards "
                         "go in rank order)")
    if vocab_start < rank or V - vocab_end < k - 1 - rank:
        # e.g. every rank passing the whole vocabulary with group=None in a data-parallel job
        raise ValueError(f"{fn}: rank {rank} of a group of {k} holds [{vocab_start}, {vocab_end}) "
                         f"of V = {V}, which leaves no class for some other rank (each of the {k} "
                         "ranks holds a non-empty slice, in rank order); is group the group the "
                         "vocabulary is sharded over? (group=None is the default, world, group)")
    if weight is not None:
        if weight.shape[0] != V:
            raise ValueError(f"{fn}: weight must be the GLOBAL class weights of shape ({V},), got "
                             f"{tuple(weight.shape)}")
        weight = weight.detach().to(_F32).contiguous()
    logit_offset = _class_vector(fn, "logit_offset", logit_offset, V, dev)  # the GLOBAL (V,)

    # ---- to rows: logits (N, V_local) with unit column stride, target (N,) contiguous ----
    x = local_logits.reshape(-1, Vl)
    N = x.shape[0]
    if (Vl > 1 and x.stride(1) != 1) or (N > 1 and x.stride(0) < Vl):
        x = x.contiguous()
    t = target.reshape(-1)
    if N > 1 and t.stride(0) != 1:
        t = t.contiguous()
    if k > 1 and ops.is_debug() and not _is_compiling():
        _vp_check_layout(fn, vocab_start, vocab_end, V, N, t, group, k, dev)

    ce_args = (ignore_index, red, label_smoothing, z_loss, cap, logit_scale)
    eager = not _FORCE_OPS and _autograd.eager_ok(x)
    xd = x.detach()
    if eager:
        stats = ops.vp_local_stats_impl(xd, t, weight, vocab_start, V, *ce_args, logit_offset)
    else:
        stats = torch.ops.fusedloss.vp_ce_local_stats(xd, t, weight, vocab_start, V, *ce_args,
                                                      logit_offset)
    if k == 1:
        gathered = stats.unsqueeze(0)
    elif N == 0:  # N is the same on every rank: no rank enters the collective
        gathered = stats.new_empty((k, 0, 4))
    else:
        gathered = _vp_all_gather(stats, group, k)
    if x.requires_grad and _grad_enabled():
        loss = _autograd.VocabParallelCrossEntropyFunction.apply(x, gathered, t, weight,
                                                                 vocab_start, V, ce_args, eager,
                                                                 logit_offset)
    elif eager:
        loss, _ = ops.vp_combine_impl(gathered, t, weight, V, *ce_args, logit_offset)
    else:
        loss, _ = torch.ops.fusedloss.vp_ce_combine(gathered, t, weight, V, *ce_args,
                                                    logit_offset)
    if red == REDUCTIONS["none"]:
        loss = loss.reshape(target.shape)
    return loss
