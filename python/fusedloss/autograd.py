"""fusedloss.autograd — backward formulas for the ops of ops.py (layer 3, STYLE.md section 7).

Default (inplace_backward=False): forward reads the logits once and saves (logits, target,
weight, logit offset, lse); no (N, V) buffer is allocated in forward. Backward runs the C
backward entry with the upstream gradient as a *device pointer* (grad_loss), so the real
gradient is applied inside the one backward pass: one read of the logits and one write of
dlogits, no host synchronisation, capturable in a CUDA graph. Forward + backward traffic:
2 reads + 1 write of (N, V); extra memory: the (N, V) gradient.
  - Under torch.compile this is torch.library.register_autograd on the custom op
    fusedloss::cross_entropy_forward, whose backward calls fusedloss::cross_entropy_backward.
  - In eager mode functional.py uses CrossEntropyFunction instead: the same formula and the same
    C calls (ops.run_forward / ops.run_backward) without the custom-op dispatcher's Python
    layers and without re-validating what functional.py checked (at small sizes the call is
    host-bound). Its one differentiable output is the loss; the lse stays on ctx. The custom
    ops remain the traceable path and are checked with opcheck and torch.compile. Host time of
    4x8 fp32 forward + loss.backward() on the 2-core CI machine: 260 us before this path was
    made lean, 196 us after, F.cross_entropy 150 us, and x.sum().backward() alone 110-120 us
    (the autograd engine's own floor there).

In place (inplace_backward=True): CrossEntropyInplaceFunction (in eager mode its lean twin
EagerInplaceFunction), a torch.autograd.Function around fusedloss::cross_entropy_fused_inplace
(register_autograd cannot be used: that op mutates its input, and torch only accepts autograd
formulas for functional ops). Forward runs the fused kernel with grad_loss = NULL (upstream
gradient 1) and writes dlogits over the logits' storage: one read + one write, zero extra
(N, V) memory. Backward must still apply the real
upstream gradient, a device tensor; reading it on the host would need a sync, so backward
calls fl_scale_rows (ops.run_scale_rows): a kernel that reads the upstream gradient on the
device and scales the rows in place only where it is not exactly 1. For the usual
loss.backward() (gradient 1) that is one tiny launch and no (N, V) traffic: total 1 read +
1 write, the floor. Otherwise one more read + write of (N, V), and fp16/bf16 gradients are
rounded twice (by the kernel, then by the multiply, in fp32 as torch's mul_). The gradient
returned is a fresh alias of the logits' storage, so AccumulateGrad adopts it as .grad
without a copy (zero extra (N, V) memory, also for a leaf). Under torch.compile the traced
backward multiplies with dlogits.mul_(grad) instead (a torch op the tracer sees; one more read +
write). The logits
are destroyed: the logits' version counter is bumped, so any other autograd node that saved
them (e.g. a user's tanh) raises torch's "modified by an inplace operation" error at backward
instead of computing a wrong gradient. backward may run only once.

Double backward raises a RuntimeError: on the default path when the gradient is
differentiated (create_graph=True alone is fine); on the in-place path already at
backward(create_graph=True), since that gradient has no graph to differentiate.
The lse output is never differentiable (use z_loss to train on lse^2). The per-class logit
offset (fl_ce_options.logit_offset) is a constant: it never gets a gradient.
"""
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import ops
from ._lib import FL_REDUCTION_NONE

__all__ = ["CrossEntropyFunction", "EagerInplaceFunction", "CrossEntropyInplaceFunction",
           "GeluFunction", "LinearCrossEntropyFunction", "VocabParallelCrossEntropyFunction",
           "eager_ok", "KeptGradEager", "kept_grad_loss"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def eager_ok(x):
    """True when the C entry points may be called directly (plain tensors, no tracing): not under
    torch.compile/export, no dispatch mode (FakeTensorMode, ...), no tensor subclass, no functorch
    transform (torch.vmap's batched tensors look like plain tensors but have no storage)."""
    return (not torch.compiler.is_compiling() and type(x) in _PLAIN
            and _get_current_dispatch_mode() is None
            and torch._C._functorch.peek_interpreter_stack() is None)

_DOUBLE_BACKWARD_MSG = (
    "fusedloss.cross_entropy: double backward (differentiating the gradient of the loss) is not "
    "supported; use torch.nn.functional.cross_entropy for higher-order gradients")


def _scale_inplace_grad(ctx, grad, per_row):
    """Backward of both in-place paths: the logits' storage holds dlogits for an upstream gradient
    of 1; scale it by the real upstream gradient in place (one more read + write)."""
    if torch.is_grad_enabled():  # create_graph=True: this gradient is not differentiable
        raise RuntimeError(_DOUBLE_BACKWARD_MSG + " (with inplace_backward=True, "
                           "create_graph=True itself is refused)")
    if ctx.used:
        raise RuntimeError("fusedloss.cross_entropy(inplace_backward=True): backward can run "
                           "only once (the gradient lives in the logits' storage)")
    ctx.used = True
    (dlogits,) = ctx.saved_tensors
    if grad is None:
        return None
    if not eager_ok(dlogits):  # traced (torch.compile): a plain torch op the tracer can see
        return dlogits.mul_(grad.reshape(-1, 1) if per_row else grad.reshape(()))
    ops.run_scale_rows(dlogits, grad, per_row)  # on the device; no traffic when grad is 1
    # a fresh alias of the same storage: AccumulateGrad can adopt it as .grad instead of cloning
    # it (a tensor that is also the saved logits / the leaf itself counts as shared)
    return dlogits.detach()


KEPT_GRAD_DOUBLE_BACKWARD_MSG = ("fusedloss.{}: double backward (differentiating the gradient of the loss) "
                                 "is not supported; use the PyTorch formula for higher-order gradients")


def _upstream_like(grad, ds, per_pos):
    """The upstream gradient shaped to broadcast against the kept gradient ds: 0-d for a scalar loss,
    one value per row ([N, C]) or per position ([N, C, d]) for reduction none."""
    if not per_pos:
        return grad.reshape(())
    if ds.dim() == 2:
        return grad.reshape(-1, 1)
    return grad.reshape(ds.shape[0], 1, ds.shape[2])


def scale_kept_grad(ctx, grad, ds, family, reductions="mean / sum"):
    """Backward of the zoo's *_loss_and_grad ops: ds (formed in the forward for an upstream gradient
    of 1) times the real upstream gradient; ctx.per_pos (reduction none) and ctx.used are the node's.
    Eager: in place on the device (fl_scale_rows: no host sync, nothing moved when the factor is 1),
    returned as a fresh alias that AccumulateGrad adopts as .grad; traced: a plain multiply."""
    if not eager_ok(grad):  # traced (torch.compile): a plain torch op the tracer sees
        g = _upstream_like(grad, ds, ctx.per_pos)
        return ds * g if ds.dtype == _F32 else (ds.to(_F32) * g).to(ds.dtype)
    if torch.is_grad_enabled():
        raise RuntimeError(KEPT_GRAD_DOUBLE_BACKWARD_MSG.format(family) + f" (the gradient of a {reductions} "
                           "loss is formed in the forward: backward(create_graph=True) itself is refused)")
    if ctx.used:
        raise RuntimeError(f"fusedloss.{family}: backward can run only once for a {reductions} loss (the "
                           "gradient formed in the forward is scaled in place)")
    ctx.used = True
    if ctx.per_pos and ds.dim() == 3:  # one factor per (n, k) position: no row scaling kernel for that
        ds.mul_(_upstream_like(grad.to(_F32), ds, True))
    else:
        # rows whose factor is 1 are not touched (all of them for the usual loss.backward() of a
        # scalar loss). A 3-D [N, C, d] buffer is scaled as [N, C d] rows.
        ds2 = ds if ds.dim() == 2 else ds.view(ds.shape[0], -1)
        ops.run_scale_rows(ds2, grad, ctx.per_pos)
    return ds.detach()


class KeptGradEager(torch.autograd.Function):
    """The eager fast path of a zoo loss's *_loss_and_grad op: apply(x, run, family, reductions) calls
    run() -> (loss, dx), the same C call as the custom op, keeps dx and scales it in backward
    (scale_kept_grad), without the custom op's Python dispatch in the forward and the backward (host
    time before the first kernel is part of a synchronised step: Lovasz 4x19x512x512 spent ~0.29 ms
    outside its 1.36 ms of kernels through the op, s16 run 3). x is the one differentiable input (the
    prediction; run closes over it and the rest). Plain tensors only (eager_ok); the custom ops stay
    for torch.compile, fake tensors and functorch transforms. Scalar reductions only (no per-position
    upstream gradient)."""

    @staticmethod
    def forward(ctx, x, run, family, reductions):
        loss, dx = run()
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(dx)
        ctx.per_pos = False
        ctx.used = False
        ctx.family, ctx.reductions = family, reductions
        return loss

    @staticmethod
    def backward(ctx, grad):
        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None
        (dx,) = ctx.saved_tensors
        return scale_kept_grad(ctx, grad, dx, ctx.family, ctx.reductions), None, None, None


def kept_grad_loss(tensors, run, op, family, reductions="mean / sum"):
    """The loss of a zoo loss's scalar-reduction step with a gradient: KeptGradEager.apply(tensors[0], run, ...)
    when every tensor (None skipped; the first the differentiable prediction) is plain (eager_ok), else the
    custom op, op() -> (loss, dx), for torch.compile, fake tensors and functorch transforms."""
    if all(t is None or eager_ok(t) for t in tensors):
        return KeptGradEager.apply(tensors[0], run, family, reductions)
    return op()[0]


def register_kept_grad_autograd(forward, fused, loss_and_grad, fused_name, family, n_tensors, n_args,
                                reduction_index=None, reductions="mean / sum"):
    """The autograd of a zoo loss's three custom ops (distillation, margin CE, softmax focal,
    Lovasz, Taylor CE): inputs are n_tensors tensors (the first, the only differentiable one, the
    prediction) then n_args non-tensor arguments.
      forward       : saves its tensors; backward calls torch.ops.fusedloss.<fused_name>(*tensors,
                      g, *args) with the upstream gradient g (fp32, contiguous, flattened): the
                      gradient in one more pass.
      fused         : its backward (double backward) raises.
      loss_and_grad : the gradient formed in the forward (output 1, non-differentiable) is kept;
                      backward scales it by the upstream gradient (scale_kept_grad). reduction_index:
                      the input holding the reduction (NONE: one upstream gradient per row or
                      position), or None for a loss that is always a scalar."""
    nones = (None,) * (n_tensors - 1 + n_args)
    double_msg = KEPT_GRAD_DOUBLE_BACKWARD_MSG.format(family)

    def fwd_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:n_tensors])
        ctx.args = tuple(inputs[n_tensors:])

    def fwd_bwd(ctx, grad):
        if grad is None or not ctx.needs_input_grad[0]:
            return (None,) + nones
        g = grad.reshape(-1)
        if g.dtype != torch.float32:
            g = g.float()
        op = getattr(torch.ops.fusedloss, fused_name)
        return (op(*ctx.saved_tensors, g.contiguous(), *ctx.args),) + nones

    def lg_setup(ctx, inputs, output):
        # no zero tensor for the (non-differentiable) gradient output's incoming gradient: autograd
        # would fill one of the gradient's size in every backward (aten::zeros, 0.35 ms of a 1.33 ms
        # ArcFace 4096x100000 fp32 step on the H200, 2026-12-02 s5: profile_zoo_step.py)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])
        ctx.per_pos = reduction_index is not None and inputs[reduction_index] == FL_REDUCTION_NONE
        ctx.used = False

    def lg_bwd(ctx, grad, grad_ds):
        if grad is None or not ctx.needs_input_grad[0]:
            return (None,) + nones
        (ds,) = ctx.saved_tensors
        return (scale_kept_grad(ctx, grad, ds, family, reductions),) + nones

    def no_double_backward(ctx, *grads):
        raise RuntimeError(double_msg)

    def no_setup(ctx, inputs, output):
        pass

    forward.register_autograd(fwd_bwd, setup_context=fwd_setup)
    fused.register_autograd(no_double_backward, setup_context=no_setup)
    loss_and_grad.register_autograd(lg_bwd, setup_context=lg_setup)


def _grad_loss(grad, reduction):
    """The upstream gradient as the contiguous fp32 buffer the C API reads (N or 1 floats)."""
    g = grad if grad.dtype == torch.float32 else grad.float()
    return g.reshape(-1).contiguous() if reduction == FL_REDUCTION_NONE else g.reshape(1)


# ---- default path, traceable: register_autograd on the functional forward op -----------------
def _forward_setup_context(ctx, inputs, output):
    (logits, target, weight, ignore_index, reduction, label_smoothing, z_loss, softcap, scale,
     offset) = inputs
    _, lse = output
    ctx.set_materialize_grads(False)  # no zero-filled grad_lse (a fill launch per backward)
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(logits, target, weight, lse, offset)
    ctx.options = (ignore_index, reduction, label_smoothing, z_loss, softcap, scale)


def _forward_backward(ctx, grad_loss, grad_lse):
    if not ctx.needs_input_grad[0] or grad_loss is None:
        return (None,) * 10
    logits, target, weight, lse, offset = ctx.saved_tensors
    ignore_index, reduction, label_smoothing, z_loss, softcap, scale = ctx.options
    dlogits = torch.ops.fusedloss.cross_entropy_backward(
        _grad_loss(grad_loss, reduction), logits, target, lse, weight, ignore_index, reduction,
        label_smoothing, z_loss, softcap, scale, 1.0, offset)
    return (dlogits,) + (None,) * 9  # the offset is a constant: no gradient


ops.cross_entropy_forward.register_autograd(_forward_backward,
                                            setup_context=_forward_setup_context)


def _no_setup(ctx, inputs, output):
    return None


def _double_backward(ctx, grad):
    raise RuntimeError(_DOUBLE_BACKWARD_MSG)


# The backward op's own "backward" only exists to fail clearly if someone differentiates it.
ops.cross_entropy_backward.register_autograd(_double_backward, setup_context=_no_setup)


def _fused_setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(*output)


def _fused_backward(ctx, *grads):
    raise RuntimeError("fusedloss::cross_entropy_fused is a raw op with no autograd; use "
                       "fusedloss.cross_entropy (its gradient is the op's dlogits output)")


# The fused op returns the gradient itself: its outputs are marked non-differentiable so that
# calling it on logits that require grad is allowed (there is nothing to differentiate).
ops.cross_entropy_fused.register_autograd(_fused_backward, setup_context=_fused_setup_context)


# ---- eager path: the same formulas without the dispatcher -------------------------------------
# functional.py has checked the inputs and built the plan (ops.plan: sizes, dtype codes, device,
# cached options struct). One differentiable output (the loss); the lse is kept on ctx (not a
# saved tensor: it is an intermediate of this node) and read back by functional.py from
# loss.grad_fn.lse when return_lse=True. The logits, target (and weight, logit offset) go through
# save_for_backward, so modifying them in place before backward raises torch's usual error (the
# plan holds the weight's and the offset's addresses: saving them also keeps them alive).
_F32 = torch.float32


class CrossEntropyFunction(torch.autograd.Function):
    """Eager twin of fusedloss::cross_entropy_forward + its registered autograd:
    apply(logits, target, weight_or_None, offset_or_None, plan) -> loss."""

    @staticmethod
    def forward(ctx, logits, target, weight, offset, plan):
        loss, lse = ops.run_forward(logits, target, plan)
        if offset is not None:
            ctx.save_for_backward(logits, target, weight, offset)
        elif weight is not None:
            ctx.save_for_backward(logits, target, weight)
        else:
            ctx.save_for_backward(logits, target)
        ctx.plan = plan
        ctx.lse = lse
        return loss

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        plan = ctx.plan
        cfg = plan[7]
        if torch.is_grad_enabled():
            # create_graph=True: go through the op, whose autograd raises if differentiated
            weight = saved[2] if len(saved) > 2 else None
            offset = saved[3] if len(saved) > 3 else None
            dlogits = torch.ops.fusedloss.cross_entropy_backward(
                _grad_loss(grad, cfg.reduction), saved[0], saved[1], ctx.lse, weight, *cfg.args,
                1.0, offset)
        else:
            if grad.dtype is not _F32:
                grad = grad.float()
            if cfg.none and not grad.is_contiguous():  # e.g. the expanded ones of loss.sum()
                grad = grad.contiguous()
            dlogits = ops.run_backward(grad, saved[0], saved[1], ctx.lse, plan)
        return dlogits, None, None, None, None


class EagerInplaceFunction(torch.autograd.Function):
    """Eager twin of CrossEntropyInplaceFunction (below): apply(logits, target, weight, offset,
    plan) -> loss; the fused pass writes the gradient (for an upstream gradient of 1) over the
    logits."""

    @staticmethod
    def forward(ctx, logits, target, weight, offset, plan):
        loss, lse, _ = ops.run_fused(logits, logits, target, None, 1.0, plan)
        torch.autograd.graph.increment_version(logits)  # as the mutating op would
        ctx.save_for_backward(logits)  # now holds dlogits for an upstream gradient of 1
        ctx.none = plan[7].none
        ctx.lse = lse
        ctx.used = False
        return loss

    @staticmethod
    def backward(ctx, grad):
        return _scale_inplace_grad(ctx, grad, ctx.none), None, None, None, None


# ---- in-place path: autograd.Function around the mutating fused op ---------------------------
class CrossEntropyInplaceFunction(torch.autograd.Function):
    """Fused forward writing the gradient over the logits; see the module docstring."""

    @staticmethod
    def forward(ctx, logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                softcap, logit_scale, offset=None):
        if not eager_ok(logits):
            loss, lse = torch.ops.fusedloss.cross_entropy_fused_inplace(
                logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                softcap, logit_scale, None, 1.0, offset)
        else:  # same C call without the dispatcher; bump the version as the op would
            loss, lse, _ = ops.fused_impl(logits, logits, target, weight, ignore_index,
                                          reduction, label_smoothing, z_loss, softcap,
                                          logit_scale, None, 1.0, "cross_entropy_fused_inplace",
                                          offset)
            torch.autograd.graph.increment_version(logits)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(logits)  # now holds dlogits for an upstream gradient of 1
        ctx.reduction = reduction
        ctx.used = False
        return loss, lse

    @staticmethod
    def backward(ctx, grad_loss, grad_lse):
        return (_scale_inplace_grad(ctx, grad_loss, ctx.reduction == FL_REDUCTION_NONE),) + (None,) * 9



# ---- GeLU (+ bias) -------------------------------------------------------------------------------
# Forward saves x and the bias (never x + b: nothing of (N, F) beyond the input autograd keeps
# anyway); backward makes ONE C call that writes dx and, when the bias needs a gradient, dbias
# (the column sums, fused: x and dy are read once). Traceable path: register_autograd on
# fusedloss::gelu_forward; eager path: GeluFunction, the same C calls without the dispatcher.
_GELU_DOUBLE_BACKWARD_MSG = (
    "fusedloss.gelu: double backward (differentiating the gradient) is not supported; use "
    "torch.nn.functional.gelu for higher-order gradients")


def _gelu_setup_context(ctx, inputs, output):
    x, bias, approximate = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate = approximate


def _gelu_backward_formula(ctx, grad):
    x, bias = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_b = bias is not None and ctx.needs_input_grad[1]
    if grad is None or not (need_x or need_b):
        return None, None, None
    dx, dbias = torch.ops.fusedloss.gelu_backward(grad.contiguous(), x, bias, ctx.approximate, need_b)
    return (dx if need_x else None), (dbias if need_b else None), None


ops.gelu_forward.register_autograd(_gelu_backward_formula, setup_context=_gelu_setup_context)


def _gelu_no_double_backward(ctx, *grads):
    raise RuntimeError(_GELU_DOUBLE_BACKWARD_MSG)


ops.gelu_backward.register_autograd(_gelu_no_double_backward, setup_context=_no_setup)


class GeluFunction(torch.autograd.Function):
    """Eager twin of fusedloss::gelu_forward + its registered autograd:
    apply(x, bias_or_None, approximate) -> y. Inputs checked by functional.gelu."""

    @staticmethod
    def forward(ctx, x, bias, approximate):
        y = ops.run_gelu_forward(x, bias, approximate)
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        return y

    @staticmethod
    def backward(ctx, grad):
        x, bias = ctx.saved_tensors
        need_x = ctx.needs_input_grad[0]
        need_b = bias is not None and ctx.needs_input_grad[1]
        if torch.is_grad_enabled():  # create_graph=True: through the op, which refuses to be differentiated
            dx, dbias = torch.ops.fusedloss.gelu_backward(grad.contiguous(), x, bias, ctx.approximate, need_b)
        else:
            if grad.dtype is not x.dtype:
                grad = grad.to(x.dtype)
            dx, dbias = ops.run_gelu_backward(grad, x, bias, ctx.approximate, need_b)
        return (dx if need_x else None), (dbias if need_b else None), None


# ---- linear + cross-entropy ----------------------------------------------------------------------
# One torch.autograd.Function for eager mode and torch.compile alike (Dynamo traces it; the C calls
# are the custom ops fusedloss::linear_cross_entropy_* when traced, their bodies ops.lce_*_impl
# directly in eager mode). It is a Function rather than register_autograd on the raw ops because
# it takes the parameters in their own dtype: under autocast it casts them itself (as F.linear
# does) and returns the weight gradient in the weight's dtype, accumulated in fp32 by the C call
# for fp32 parameters, instead of a 16-bit gradient that autograd would cast up afterwards.
#
# Mode 1 (scalar reductions, the default when a gradient is needed): the forward makes the one C
# call that writes the loss AND dhidden, dweight, dbias for an upstream gradient of 1 (3 GEMMs);
# the gradients are held until backward, which scales them by the real upstream gradient, a
# device scalar: in eager mode in place with fl_scale_rows, which reads the factor on the device
# and touches nothing when it is exactly 1 (the usual loss.backward()): no host sync, no extra
# pass, capturable in a CUDA graph; the tensors handed to autograd are aliases of the held ones,
# so AccumulateGrad can adopt them without a copy. Traced (torch.compile), backward multiplies
# out of place (a torch op the tracer sees). Extra memory: dweight (V x H) and dhidden from the
# forward to the backward. Backward may run only once (the gradients are scaled in place).
# Mode 2 (recompute; reduction "none", or recompute=True): the forward computes the loss and the
# per-row lse only (1 GEMM) and saves the (cast) inputs; backward recomputes the logits chunk by
# chunk from the lse with any upstream gradient (3 GEMMs; 8·N·H·V FLOP in all).
# Only the gradients of inputs that require grad are computed, except dhidden, which the C API
# always forms when any gradient is asked for. Double backward raises RuntimeError (also
# backward(create_graph=True) itself, in eager mode: the gradients are not differentiable).
_LCE_DOUBLE_BACKWARD_MSG = (
    "fusedloss.linear_cross_entropy: double backward (backward with create_graph=True) is not "
    "supported; use torch.nn.functional.linear + cross_entropy for higher-order gradients")


def _lce_raw_backward(ctx, *grads):
    raise RuntimeError("fusedloss::linear_cross_entropy_* are raw ops with no autograd (their "
                       "gradients are outputs); use fusedloss.linear_cross_entropy")


# The raw ops return gradients (or the lse) themselves: all outputs non-differentiable, so calling
# them on tensors that require grad is allowed; fusedloss.linear_cross_entropy is the autograd path.
for _op in (ops.linear_cross_entropy_fused, ops.linear_cross_entropy_forward,
            ops.linear_cross_entropy_backward):
    _op.register_autograd(_lce_raw_backward, setup_context=_fused_setup_context)
del _op


def _lce_cast(t, dtype):
    return t if t is None or t.dtype == dtype else t.to(dtype)


class LinearCrossEntropyFunction(torch.autograd.Function):
    """apply(hidden [N, H], weight [V, H], bias [V] or None, target [N], class_weight fp32 [V] or
    None, dtype, ce_args, lce_args, needs, recompute, eager, class_offset fp32 [V] or None) -> loss
    (fp32, (N,) or 0-d).

    dtype: the compute dtype (hidden, weight, bias are cast to it: the autocast dtype, else their
    common dtype); ce_args: (ignore_index, fl reduction, label_smoothing, z_loss, softcap (0 =
    off), logit_scale); lce_args: (chunk_rows (0 = auto), byte_budget, fl_lce_accum); needs:
    (hidden, weight, bias) require grad; recompute: mode 2 instead of mode 1; eager: make the C
    calls directly (not traced); class_offset: the per-class logit offset (a constant, no gradient).
    Inputs are checked by functional.linear_cross_entropy."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, class_weight, dtype, ce_args, lce_args, needs,
                recompute, eager, class_offset=None):
        need_h, need_w, need_b = needs
        h, w, b = _lce_cast(hidden, dtype), _lce_cast(weight, dtype), _lce_cast(bias, dtype)
        # gradient dtype of the C call: the parameter's own when the C API can write it (its
        # compute dtype, or fp32: fp32 parameters under autocast get an exact fp32 gradient)
        pdt = weight.dtype if need_w else (bias.dtype if need_b else dtype)
        wgrad_dtype = pdt if pdt in (dtype, _F32) else _F32
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.needs = needs
        ctx.recompute = recompute
        ctx.used = False
        if not recompute:
            args = (h, w, b, target, class_weight) + ce_args + lce_args + (
                wgrad_dtype, need_w, need_b, None, 1.0, class_offset)
            if eager:
                loss, _, dh, dw, db = ops.lce_fused_impl(*args)
            else:
                loss, _, dh, dw, db = torch.ops.fusedloss.linear_cross_entropy_fused(*args)
            ctx.save_for_backward(dh if need_h else None, dw if need_w else None,
                                  db if need_b else None)
            return loss
        args = (h, w, b, target, class_weight) + ce_args + lce_args + (class_offset,)
        if eager:
            loss, lse = ops.lce_forward_impl(*args)
        else:
            loss, lse = torch.ops.fusedloss.linear_cross_entropy_forward(*args)
        ctx.save_for_backward(h, w, b, target, class_weight, lse, class_offset)
        ctx.args = (ce_args, lce_args, wgrad_dtype)
        return loss

    @staticmethod
    def backward(ctx, grad):
        nones = (None,) * 9
        need_h, need_w, need_b = ctx.needs
        if grad is None:
            return (None, None, None) + nones
        eager = eager_ok(grad)
        if eager and torch.is_grad_enabled():
            raise RuntimeError(_LCE_DOUBLE_BACKWARD_MSG)
        if not ctx.recompute:
            if eager and ctx.used:
                raise RuntimeError("fusedloss.linear_cross_entropy: backward can run only once "
                                   "(the gradients formed in the forward are scaled in place); "
                                   "use recompute=True to backward through the graph again")
            dh, dw, db = ctx.saved_tensors
            if eager:
                ctx.used = True
                g = grad if grad.dtype is _F32 else grad.float()
                # in place, on the device, nothing moved when g == 1; then fresh aliases so that
                # AccumulateGrad may adopt them as .grad without a copy
                dh, dw, db = [None if x is None else ops.run_scale_rows(x, g, False).detach()
                              for x in (dh, dw, db)]
            else:
                g = grad.reshape(())
                dh, dw, db = [None if x is None else x * g for x in (dh, dw, db)]
        else:
            h, w, b, target, class_weight, lse, class_offset = ctx.saved_tensors
            ce_args, lce_args, wgrad_dtype = ctx.args
            args = (_grad_loss(grad, ce_args[1]), h, w, b, target, lse, class_weight) + ce_args + \
                lce_args + (wgrad_dtype, need_w, need_b, 1.0, class_offset)
            if eager:
                dh, dw, db = ops.lce_backward_impl(*args)
            else:
                dh, dw, db = torch.ops.fusedloss.linear_cross_entropy_backward(*args)
        hdt, wdt, bdt = ctx.dtypes
        dh = _lce_cast(dh, hdt) if need_h else None
        dw = _lce_cast(dw, wdt) if need_w else None
        db = _lce_cast(db, bdt) if need_b else None
        return (dh, dw, db) + nones


# ---- vocab-parallel cross-entropy ------------------------------------------------------------------
# functional.vocab_parallel_cross_entropy runs step 1 (the shard's stats, on the detached logits)
# and step 2 (the all-gather in rank order); this Function is steps 3 and 4: its forward combines
# the gathered stats into the loss and the global lse, its backward makes the shard's gradient from
# the saved logits and that lse with the upstream gradient (a device tensor, read on the device):
# no collective, no host sync. The loss depends on the logits only through the gathered stats,
# which carry no autograd history; the Function takes the logits as an input so that autograd
# routes the loss's gradient to them, and its backward returns the whole gradient of the global
# loss w.r.t. this shard (the other ranks' shards get theirs on their own ranks). One Function for
# eager mode and torch.compile alike, as for linear cross-entropy: the C calls are the custom ops
# fusedloss::vp_ce_* when traced, their bodies ops.vp_*_impl directly in eager mode. Double
# backward raises RuntimeError (create_graph=True alone is fine, as for cross_entropy).
_VP_DOUBLE_BACKWARD_MSG = (
    "fusedloss.vocab_parallel_cross_entropy: double backward (differentiating the gradient of the "
    "loss) is not supported")


def _vp_double_backward(ctx, *grads):
    raise RuntimeError(_VP_DOUBLE_BACKWARD_MSG)


# Steps 1 and 3 return statistics, not a differentiable function of their tensor inputs (the
# gradient is step 4's output): all outputs non-differentiable, so they may be called on tensors
# that require grad; step 4's own "backward" only fails clearly if someone differentiates it.
def _vp_raw_backward(ctx, *grads):
    raise RuntimeError("fusedloss::vp_ce_local_stats / vp_ce_combine are raw ops with no autograd "
                       "(the gradient is fusedloss::vp_ce_backward's output); use "
                       "fusedloss.vocab_parallel_cross_entropy")


for _op in (ops.vp_ce_local_stats, ops.vp_ce_combine):
    _op.register_autograd(_vp_raw_backward, setup_context=_fused_setup_context)
del _op
ops.vp_ce_backward.register_autograd(_vp_double_backward, setup_context=_no_setup)


class VocabParallelCrossEntropyFunction(torch.autograd.Function):
    """apply(logits [N, V_local], gathered fp32 [k, N, 4], target [N], weight fp32 [V] or None,
    vocab_start, V, ce_args, eager, offset fp32 [V] or None) -> loss (fp32, (N,) for reduction
    none else 0-d).

    gathered: step 1's stats of every rank's shard of these rows, in rank order, without autograd
    history; ce_args: (ignore_index, fl reduction, label_smoothing, z_loss, softcap (0 = off),
    logit_scale); eager: call the C steps directly (not traced); offset: the GLOBAL per-class
    logit offsets (detached; saved for backward, which reads them). Inputs are checked by
    functional.vocab_parallel_cross_entropy."""

    @staticmethod
    def forward(ctx, logits, gathered, target, weight, vocab_start, V, ce_args, eager, offset=None):
        args = (gathered, target, weight, V) + ce_args + (offset,)
        if eager:
            loss, lse = ops.vp_combine_impl(*args)
        else:
            loss, lse = torch.ops.fusedloss.vp_ce_combine(*args)
        ctx.save_for_backward(logits, target, weight, lse, offset)
        ctx.args = (vocab_start, V, ce_args)
        return loss

    @staticmethod
    def backward(ctx, grad):
        nones = (None,) * 8
        if grad is None or not ctx.needs_input_grad[0]:
            return (None,) + nones
        logits, target, weight, lse, offset = ctx.saved_tensors
        vocab_start, V, ce_args = ctx.args
        args = (_grad_loss(grad, ce_args[1]), logits, target, lse, weight, vocab_start, V) + \
            ce_args + (1.0, offset)
        if eager_ok(grad) and not torch.is_grad_enabled():
            dlogits = ops.vp_backward_impl(*args)
        else:  # traced, or create_graph=True: the op (whose autograd refuses double backward)
            dlogits = torch.ops.fusedloss.vp_ce_backward(*args)
        return (dlogits,) + nones
