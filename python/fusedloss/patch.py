"""fusedloss.patch — Hugging Face transformers models trained with the fused kernels (layer 6,
STYLE.md section 7).

    import fusedloss
    fusedloss.patch.apply(model)              # this GPT2LMHeadModel / LlamaForCausalLM instance
    fusedloss.patch.apply(GPT2LMHeadModel)    # the class: every instance, present and future
    fusedloss.patch.patch_gpt2()              # = apply(transformers.GPT2LMHeadModel)
    fusedloss.patch.patch_llama(model)        # = apply(model), checking that it is a Llama
    fusedloss.patch.revert(model)             # (or the class; revert() undoes every patch)

What a patch does (linear_cross_entropy=True, the default). The model's forward is replaced by a
line-for-line copy of transformers' own (GPT2LMHeadModel.forward, LlamaForCausalLM.forward of
transformers 5.x: the same call of the base model with the same arguments and **kwargs, the same
logits_to_keep slicing, the same output class and fields) in which, when ``labels`` are given,

    logits = self.lm_head(hidden_states); loss = self.loss_function(logits, labels, ...)

becomes ``loss = causal_lm_loss(hidden_states, self.lm_head.weight, labels, ...)``: transformers'
ForCausalLMLoss (labels shifted by one with ignore_index padding, or the caller's
``shift_labels``; ``ignore_index`` -100 unless passed; 'mean' over non-ignored tokens, or the sum
divided by ``num_items_in_batch`` when given, exactly as fixed_cross_entropy does) computed by
:func:`fusedloss.linear_cross_entropy` on the final hidden states, without the [B, T, V] logits
(nor their fp32 upcast, nor the logits' gradient). The output's ``logits`` is then **None**
(with ``return_dict=False`` the tuple has no logits entry, as transformers drops None fields).
Without labels (generation, inference) the forward computes the logits exactly as before.

Keyword ``skip_logits`` (accepted by a patched forward, not passed on to the base model):
``None`` (default) follows the patch's setting (``apply(..., skip_logits=True)``: skip whenever
labels are given; ``"training"``: only in training mode, so that evaluation with labels still
returns logits for metrics); ``False`` computes the logits and the loss as transformers does
(the original code path), ``True`` forces the fused path.

The fused path is taken only when it computes what the original would: the model's
loss_function is transformers' ForCausalLMLoss (not a custom ``model.loss_function``), and
lm_head is a plain ``torch.nn.Linear`` without hooks or a replaced forward (e.g. not wrapped by
PEFT/LoRA or accelerate); otherwise the original code path runs (with a one-time warning).

Numerics: transformers computes the logits in the model's dtype and the loss from their fp32
upcast; fusedloss rounds the logits to the model's dtype and accumulates the loss in fp32 (double
on the CPU): the same loss up to rounding order. Gradients: the lm-head weight gradient is
accumulated in fp32 for fp32 parameters under autocast (transformers: a 16-bit GEMM result cast
up), so it is slightly more accurate.

The fused bias-GeLU MLP (``apply(..., gelu=True)``, GPT-2 only). GPT2MLP.forward,
``c_proj(act(c_fc(x)))`` then dropout, with c_fc a Conv1D (``addmm(bias, x, weight)``), becomes

    u = x.view(-1, in) @ c_fc.weight; h = fusedloss.gelu(u, bias=c_fc.bias, approximate=...)

then c_proj and dropout unchanged: the bias add and the GeLU are one pass forward, and backward
gives du and dbias in one pass (what fusedloss.nn.BiasGELU does). approximate follows the
config's activation_function: "gelu_new" (GPT-2's default) and "gelu_pytorch_tanh": 'tanh';
"gelu": 'none' (erf). Any other activation (including "gelu_python", "gelu_fast", ...) raises
ValueError: at apply time for an instance; with a class patch (GPT2MLP.forward itself is
replaced, for every GPT-2 model until revert) when that MLP runs. A c_fc that is not a plain
Conv1D (e.g. wrapped by PEFT) or hooks on c_fc / act: the MLP runs as transformers' (one-time
warning). Llama: gelu=True raises ValueError (LlamaMLP is a gated SiLU MLP, no GeLU). Numerics:
u has the dtype transformers' activation input has (the model's; bf16 under autocast, as
addmm's result); u + bias is formed in fp32 and not rounded (transformers rounds addmm's output
with its bias, cast to bf16 under autocast, before the activation), and an fp32 bias under
autocast stays fp32, its gradient accumulated in fp32: the same up to rounding.
Hook point: each supported model is a _ModelSpec in _SPECS; ``patch_mlp`` holds its MLP patch.

transformers is imported only when a patch is applied (fusedloss itself does not need it).
Tested with transformers 5.17.
"""
import warnings
import weakref

import torch
import torch.nn.functional as F

from .functional import gelu as _fused_gelu, linear_cross_entropy

__all__ = ["apply", "revert", "is_patched", "patch_gpt2", "patch_llama", "revert_gpt2",
           "revert_llama", "apply_fusedloss_to_gpt2", "apply_fusedloss_to_llama",
           "causal_lm_loss"]


# ---- the loss ------------------------------------------------------------------------------------
def causal_lm_loss(hidden_states, weight, labels, bias=None, num_items_in_batch=None,
                   ignore_index=-100, shift_labels=None, **kwargs):
    """transformers' ForCausalLMLoss(lm_head(hidden_states), labels, ...) without the logits.

    hidden_states (B, T, H) (any (..., H) matching labels), weight (V, H) (lm_head.weight), bias
    (V,) or None; labels (B, T), shifted here (pad with ignore_index, drop the first) unless
    shift_labels (the already shifted targets, labels' shape) is given; num_items_in_batch None:
    mean over the non-ignored tokens, else (tensor or int) the sum divided by it. Extra kwargs
    are accepted and ignored, as transformers' loss does. Returns the float32 loss."""
    if shift_labels is None:
        # Shift so that tokens < n predict n (ForCausalLMLoss's own two lines)
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    H = hidden_states.shape[-1]
    hidden = hidden_states.reshape(-1, H)
    shift_labels = shift_labels.reshape(-1).to(hidden.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = linear_cross_entropy(hidden, weight, shift_labels, bias, ignore_index=ignore_index,
                                reduction=reduction)
    if reduction == "sum":
        # as fixed_cross_entropy: an int is used as it is, a tensor moved to the loss's device
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


_warned = set()


def _warn_once(key, msg):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=4)


# set by _import_loss() when a forward is built: transformers' ForCausalLMLoss, its LOSS_MAPPING
# and PreTrainedModel's loss_function property
_ForCausalLMLoss = _LOSS_MAPPING = _LOSS_PROPERTY = None


def _loss_function(model):
    """model.loss_function, resolved as PreTrainedModel's property does but without its
    warning_once log for an unrecognised loss_type (GPT-2's: a logging call that stops
    torch.compile(fullgraph=True)); a subclass's own property is simply called."""
    if getattr(type(model), "loss_function", None) is not _LOSS_PROPERTY:
        return model.loss_function
    if hasattr(model, "_loss_function"):
        return model._loss_function
    loss_type = getattr(model, "loss_type", None)
    if loss_type is None or loss_type not in _LOSS_MAPPING:
        return _LOSS_MAPPING["ForCausalLM"]
    return _LOSS_MAPPING[loss_type]


def _fusable(model):
    """True when the fused loss computes exactly what model.loss_function(lm_head(h)) would."""
    if _loss_function(model) is not _ForCausalLMLoss:
        _warn_once(("loss", type(model)), f"fusedloss.patch: {type(model).__name__} has a custom "
                   "loss_function; computing the logits and that loss as transformers does")
        return False
    head = model.lm_head
    if (type(head).forward is not torch.nn.Linear.forward or "forward" in head.__dict__
            or head._forward_hooks or head._forward_pre_hooks
            or torch.nn.modules.module._global_forward_hooks
            or torch.nn.modules.module._global_forward_pre_hooks):
        _warn_once(("head", type(model)), f"fusedloss.patch: {type(model).__name__}.lm_head is not "
                   "a plain torch.nn.Linear (wrapped, hooked or replaced); computing the logits "
                   "as transformers does")
        return False
    return True


def _head_and_loss(model, hidden_states, labels, skip_logits, kwargs, positional):
    """(loss, logits) of the lm head on hidden_states (already sliced by logits_to_keep): the fused
    loss and logits None when labels are given and the logits are to be skipped, else
    transformers' own lines (positional: GPT-2 passes logits, labels positionally)."""
    if skip_logits is None:
        mode = getattr(model, "_fusedloss_skip_logits", True)  # the instance's, else the class's
        skip_logits = model.training if mode == "training" else True
    if labels is not None and skip_logits and _fusable(model):
        loss = causal_lm_loss(hidden_states, model.lm_head.weight, labels, bias=model.lm_head.bias,
                              **kwargs)
        return loss, None
    logits = model.lm_head(hidden_states)
    loss = None
    if labels is not None:
        if positional:
            loss = model.loss_function(logits, labels, vocab_size=model.config.vocab_size, **kwargs)
        else:
            loss = model.loss_function(logits=logits, labels=labels,
                                       vocab_size=model.config.vocab_size, **kwargs)
    return loss, logits


# ---- the forwards: transformers 5.x's, with the lm head + loss replaced -------------------------
# Each mirrors the installed class's forward line for line (its parameters are checked against
# the original's when a patch is applied) plus the keyword skip_logits.
def _import_loss():
    global _ForCausalLMLoss, _LOSS_MAPPING, _LOSS_PROPERTY
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss
    from transformers.modeling_utils import PreTrainedModel
    _ForCausalLMLoss, _LOSS_MAPPING = ForCausalLMLoss, LOSS_MAPPING
    _LOSS_PROPERTY = PreTrainedModel.__dict__["loss_function"]


def _make_gpt2_forward():
    _import_loss()
    from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions
    from transformers.utils import can_return_tuple

    @can_return_tuple
    def forward(self, input_ids=None, past_key_values=None, attention_mask=None,
                token_type_ids=None, position_ids=None, inputs_embeds=None,
                encoder_hidden_states=None, encoder_attention_mask=None, labels=None,
                use_cache=None, logits_to_keep=0, skip_logits=None, **kwargs):
        """GPT2LMHeadModel.forward patched by fusedloss: with labels, the loss comes from
        fusedloss.linear_cross_entropy on the final hidden states and logits is None (see
        fusedloss.patch)."""
        transformer_outputs = self.transformer(
            input_ids,
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = transformer_outputs.last_hidden_state

        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        loss, logits = _head_and_loss(self, hidden_states[:, slice_indices, :], labels, skip_logits,
                                      kwargs, positional=True)

        return CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            past_key_values=transformer_outputs.past_key_values,
            hidden_states=transformer_outputs.hidden_states,
            attentions=transformer_outputs.attentions,
            cross_attentions=transformer_outputs.cross_attentions,
        )

    return forward


def _make_llama_forward():
    _import_loss()
    from transformers.modeling_outputs import CausalLMOutputWithPast
    from transformers.utils import can_return_tuple

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, labels=None, use_cache=None,
                logits_to_keep=0, skip_logits=None, **kwargs):
        """LlamaForCausalLM.forward patched by fusedloss: with labels, the loss comes from
        fusedloss.linear_cross_entropy on the final hidden states and logits is None (see
        fusedloss.patch)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )

        hidden_states = outputs.last_hidden_state
        # Only compute necessary logits, and do not upcast them to float if we are not computing the loss
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        loss, logits = _head_and_loss(self, hidden_states[:, slice_indices, :], labels, skip_logits,
                                      kwargs, positional=False)

        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    return forward


# ---- the MLP: GPT-2's c_fc bias add and GeLU in one fusedloss.gelu ------------------------------
# GPT2MLP.forward (transformers 5.x) is  act(c_fc(x)) -> c_proj -> dropout  with c_fc a Conv1D:
# addmm(bias, x.view(-1, in), weight).  The patch computes  u = x.view(-1, in) @ weight  (the
# GEMM without its bias; under autocast u has the dtype addmm's result has, the activation's input
# in transformers) and  fusedloss.gelu(u, bias, approximate)  (bias add + GeLU forward, and in
# backward du and dbias, each one pass), then c_proj and dropout unchanged.
_GELU_NAMES = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
# set by _import_mlp(): transformers' GPT2MLP, Conv1D and the three activation classes
_GPT2MLP = _Conv1D = _ACTS = None


def _import_mlp():
    global _GPT2MLP, _Conv1D, _ACTS
    if _GPT2MLP is None:
        from transformers import activations as A
        from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
        from transformers.pytorch_utils import Conv1D
        _GPT2MLP, _Conv1D = GPT2MLP, Conv1D
        _ACTS = (A.GELUActivation, A.NewGELUActivation, A.GELUTanh)
    return _GPT2MLP


def _act_approximate(act):
    """fusedloss.gelu's approximate for transformers' activation module act (ACT2FN[name]) when
    name is 'gelu' (exact erf: F.gelu), 'gelu_new' (the tanh formula) or 'gelu_pytorch_tanh'
    (F.gelu(approximate='tanh')); None for anything else (other activations, the *_python
    variants, subclasses)."""
    gelu_cls, new_cls, tanh_cls = _ACTS
    t = type(act)
    if t is new_cls:
        return "tanh"
    fn = getattr(act, "act", None)
    if t is gelu_cls and fn is F.gelu:
        return "none"
    if (t is tanh_cls and getattr(fn, "func", None) is F.gelu
            and getattr(fn, "keywords", None) == {"approximate": "tanh"}):
        return "tanh"
    return None


def _unsupported_act(act, name=None):
    what = f"activation_function {name!r} ({type(act).__name__})" if name else type(act).__name__
    return (f"fusedloss.patch: gelu=True fuses GPT-2's MLP only for activation_function "
            f"{', '.join(map(repr, _GELU_NAMES))}; this GPT2MLP has {what}; use gelu=False")


def _plain(m):
    """No hook on m and no forward of its own (else the fused MLP would bypass them)."""
    return not ("forward" in m.__dict__ or m._forward_hooks or m._forward_pre_hooks
                or m._backward_hooks or m._backward_pre_hooks)


def _mlp_approximate(mlp):
    """approximate for mlp's fused path, or None (warned once) when c_fc is not a plain Conv1D or
    c_fc / act carry hooks: then the original forward runs. ValueError for an activation that is
    not one of the three GeLUs."""
    _import_mlp()  # a no-op once imported (a forward unpickled in a fresh process needs it)
    approximate = _act_approximate(mlp.act)
    if approximate is None:
        raise ValueError(_unsupported_act(mlp.act))
    fc = mlp.c_fc
    mod = torch.nn.modules.module
    if (type(fc).forward is not _Conv1D.forward or not _plain(fc) or not _plain(mlp.act)
            or mod._global_forward_hooks or mod._global_forward_pre_hooks
            or mod._global_backward_hooks or mod._global_backward_pre_hooks):
        _warn_once(("mlp", type(mlp)), f"fusedloss.patch: {type(mlp).__name__}.c_fc is not a plain "
                   "Conv1D or c_fc / act are hooked or replaced; running the MLP as transformers does")
        return None
    return approximate


def _gpt2_mlp_forward(self, hidden_states):
    """GPT2MLP.forward patched by fusedloss: act(c_fc(x)) is fusedloss.gelu(x @ c_fc.weight,
    bias=c_fc.bias) (see fusedloss.patch)."""
    approximate = _mlp_approximate(self)
    if approximate is None:
        return _original_forward(type(self))(self, hidden_states)
    fc = self.c_fc
    size_out = hidden_states.size()[:-1] + (fc.nf,)
    hidden_states = torch.mm(hidden_states.view(-1, hidden_states.size(-1)), fc.weight)
    hidden_states = _fused_gelu(hidden_states, bias=fc.bias, approximate=approximate).view(size_out)
    hidden_states = self.c_proj(hidden_states)
    hidden_states = self.dropout(hidden_states)
    return hidden_states


_gpt2_mlp_forward._fusedloss_patch = "gpt2-mlp"
_mlp_class_users = {}              # model class patched with gelu=True -> the MLP class it patched


def _check_mlp_forward(mlp_cls, cls):
    import inspect
    orig = _original_forward(cls)
    if orig is not _original_forward(mlp_cls):
        raise TypeError(f"fusedloss.patch: {cls.__name__} overrides {mlp_cls.__name__}.forward; the "
                        "fused MLP mirrors transformers' own forward and would drop that code")
    params = tuple(inspect.signature(orig).parameters)
    if params != ("self", "hidden_states"):
        import transformers
        raise RuntimeError(
            f"fusedloss.patch: {mlp_cls.__name__}.forward of transformers {transformers.__version__} "
            f"takes {params}, not the ('self', 'hidden_states') that fusedloss.patch mirrors "
            "(transformers 5.x); not patched")


def _patch_gpt2_mlp(target):
    """_ModelSpec.patch_mlp of GPT-2. A class: GPT2MLP.forward itself is replaced (every GPT-2
    model's MLP, whatever its head, until revert(target)); each MLP checks its activation when
    it runs. An instance: each GPT2MLP of the model gets the fused forward as an instance
    attribute, after every one's activation and forward are checked (nothing is changed when one
    fails)."""
    mlp_cls = _import_mlp()
    if isinstance(target, type):
        _check_mlp_forward(mlp_cls, mlp_cls)
        if mlp_cls not in _class_saved:
            _class_saved[mlp_cls] = mlp_cls.__dict__.get("forward", _MISSING)
        mlp_cls.forward = _gpt2_mlp_forward
        _mlp_class_users[target] = mlp_cls
        return
    mlps = [m for m in target.modules() if isinstance(m, mlp_cls)]
    if not mlps:
        raise ValueError(f"fusedloss.patch: gelu=True: {type(target).__name__} has no GPT2MLP")
    name = getattr(getattr(target, "config", None), "activation_function", None)
    for m in mlps:
        _check_mlp_forward(mlp_cls, type(m))
        if _act_approximate(m.act) is None:
            raise ValueError(_unsupported_act(m.act, name))
    for m in mlps:
        d = m.__dict__
        if "_fusedloss_saved_forward" not in d:
            d["_fusedloss_saved_forward"] = d.get("forward", _MISSING)
        d["forward"] = _gpt2_mlp_forward.__get__(m, type(m))
        _instances.add(m)


# ---- the registry ---------------------------------------------------------------------------------
class _ModelSpec:
    """A supported model class: where it lives, its patched forward and the hook points.

    patch_mlp: None, or a callable(target) (a model class or instance) that checks, then patches
    the model's MLP so that its bias add and GeLU run as one fusedloss.gelu; the hook
    apply(..., gelu=True) calls (revert() undoes it: instance patches through
    _fusedloss_saved_forward, class patches through _class_saved and _mlp_class_users).
    no_gelu: why gelu=True is refused for a model without one (ValueError)."""

    def __init__(self, name, module, cls_name, make_forward, params, patch_mlp=None, no_gelu=None):
        self.name, self.module, self.cls_name = name, module, cls_name
        self.make_forward, self.params, self.patch_mlp = make_forward, params, patch_mlp
        self.no_gelu = no_gelu
        self._forward = None

    def cls(self):
        import importlib
        try:
            mod = importlib.import_module(self.module)
        except ImportError as e:
            raise ImportError(f"fusedloss.patch: patching {self.cls_name} needs Hugging Face "
                              f"transformers (pip install transformers): {e}") from e
        return getattr(mod, self.cls_name)

    def forward(self):
        """The patched forward (built once; marked with _fusedloss_patch)."""
        if self._forward is None:
            f = self.make_forward()
            f._fusedloss_patch = self.name
            self._forward = f
        return self._forward


_SPECS = {
    "gpt2": _ModelSpec("gpt2", "transformers.models.gpt2.modeling_gpt2", "GPT2LMHeadModel",
                       _make_gpt2_forward,
                       ("self", "input_ids", "past_key_values", "attention_mask", "token_type_ids",
                        "position_ids", "inputs_embeds", "encoder_hidden_states",
                        "encoder_attention_mask", "labels", "use_cache", "logits_to_keep",
                        "kwargs"),
                       patch_mlp=_patch_gpt2_mlp),
    "llama": _ModelSpec("llama", "transformers.models.llama.modeling_llama", "LlamaForCausalLM",
                        _make_llama_forward,
                        ("self", "input_ids", "attention_mask", "position_ids", "past_key_values",
                         "inputs_embeds", "labels", "use_cache", "logits_to_keep", "kwargs"),
                        no_gelu="LlamaForCausalLM has no GeLU MLP to fuse: LlamaMLP is gated "
                                "(down_proj(act(gate_proj(x)) * up_proj(x)), SiLU by default) with "
                                "no bias before its activation"),
}

class _Missing:
    """'there was no forward of its own' (survives copy.deepcopy of a patched model)."""

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return "_MISSING"

    def __repr__(self):
        return "<no own forward>"


_MISSING = _Missing()
_class_saved = {}                  # patched class -> its own __dict__['forward'] before (or _MISSING)
_instances = weakref.WeakSet()     # instances patched by apply(model)


def _is_patch(f):
    return getattr(f, "_fusedloss_patch", None) is not None


def _original_forward(cls):
    """cls's forward as transformers defines it (the saved one if cls is patched)."""
    for k in cls.__mro__:
        if k in _class_saved and _class_saved[k] is not _MISSING:
            return _class_saved[k]
        f = k.__dict__.get("forward", _MISSING)
        if f is not _MISSING and not _is_patch(f):
            return f
    raise TypeError(f"fusedloss.patch: {cls.__name__} has no forward")


def _spec_for(cls, only=None):
    specs = [_SPECS[only]] if only else list(_SPECS.values())
    for spec in specs:
        base = spec.cls()
        if isinstance(cls, type) and issubclass(cls, base):
            return spec, base
    names = ", ".join(s.cls_name for s in specs)
    raise TypeError(f"fusedloss.patch: {getattr(cls, '__name__', cls)!r} is not a supported model "
                    f"(one of {names}, or a subclass that keeps its forward)")


def _check_forward(spec, base, cls):
    import inspect
    orig = _original_forward(cls)
    if orig is not _original_forward(base):
        raise TypeError(f"fusedloss.patch: {cls.__name__} overrides {base.__name__}.forward; the "
                        "patch mirrors transformers' own forward and would drop that code")
    params = tuple(inspect.signature(inspect.unwrap(orig)).parameters)
    if params != spec.params:
        import transformers
        raise RuntimeError(
            f"fusedloss.patch: {base.__name__}.forward of transformers {transformers.__version__} "
            f"takes {params}, not the {spec.params} that fusedloss.patch mirrors (transformers "
            "5.x); not patched")


def _check_options(linear_cross_entropy, gelu, skip_logits):
    if skip_logits not in (True, "training"):
        raise ValueError(f"fusedloss.patch: skip_logits must be True or 'training', got {skip_logits!r}")
    if not linear_cross_entropy and not gelu:
        raise ValueError("fusedloss.patch: nothing to apply (linear_cross_entropy=False, gelu=False)")


def apply(target, *, linear_cross_entropy=True, gelu=False, skip_logits=True):
    """Patch a GPT2LMHeadModel / LlamaForCausalLM instance, or the class (or a subclass that keeps
    its forward), so that its training loss is computed by fusedloss.linear_cross_entropy.

    target: a model (instance patch: only that model; its forward becomes an instance
    attribute, so revert it before pickling the whole model object) or a class (every
    instance). skip_logits: True (default) returns logits=None whenever labels are given;
    "training": only in training mode (evaluation with labels returns logits). gelu=True (GPT-2
    only; ValueError for Llama): the MLP's c_fc bias add and GeLU run as one fusedloss.gelu
    (see fusedloss.patch); on an instance, ValueError unless its activation_function is 'gelu',
    'gelu_new' or 'gelu_pytorch_tanh' (nothing is patched then); on a class, GPT2MLP itself is
    patched and each MLP raises that ValueError when it runs. linear_cross_entropy=False with
    gelu=True patches the MLP alone. Everything is checked before anything is patched. Applying
    twice is harmless (the second call updates skip_logits; gelu=False does not undo an earlier
    gelu=True, revert does). Returns target."""
    _check_options(linear_cross_entropy, gelu, skip_logits)
    is_cls = isinstance(target, type)
    cls = target if is_cls else type(target)
    if not is_cls and not isinstance(target, torch.nn.Module):
        raise TypeError(f"fusedloss.patch.apply: expected a model or a model class, got {type(target).__name__}")
    spec, base = _spec_for(cls)
    if gelu and spec.patch_mlp is None:
        why = spec.no_gelu or f"{base.__name__} has no fused GeLU MLP patch"
        raise ValueError(f"fusedloss.patch: gelu=True: {why}; use gelu=False")
    if linear_cross_entropy:
        _check_forward(spec, base, cls)
    if gelu:
        spec.patch_mlp(target)  # checks every MLP before patching any
    if not linear_cross_entropy:
        return target
    fwd = spec.forward()
    if is_cls:
        if cls not in _class_saved:
            _class_saved[cls] = cls.__dict__.get("forward", _MISSING)
        cls.forward = fwd
        cls._fusedloss_skip_logits = skip_logits
    else:
        d = target.__dict__
        if "_fusedloss_saved_forward" not in d:
            d["_fusedloss_saved_forward"] = d.get("forward", _MISSING)
        d["forward"] = fwd.__get__(target, cls)
        d["_fusedloss_skip_logits"] = skip_logits
        _instances.add(target)
    return target


def _revert_instance(model):
    """Undo model's own patch and its submodules' (the fused MLPs of apply(model, gelu=True))."""
    done = False
    for m in model.modules():
        if m is not model and "_fusedloss_saved_forward" in m.__dict__:
            done = _revert_one(m) or done
    return _revert_one(model) or done


def _revert_one(model):
    d = model.__dict__
    if "_fusedloss_saved_forward" not in d:
        return False
    saved = d.pop("_fusedloss_saved_forward")
    if saved is _MISSING:
        d.pop("forward", None)
    else:
        d["forward"] = saved
    d.pop("_fusedloss_skip_logits", None)
    _instances.discard(model)
    return True


def _revert_class(cls):
    """Undo cls's patch and the MLP class patch it made (when no other patched class uses it)."""
    done = False
    mlp_cls = _mlp_class_users.pop(cls, None)
    if mlp_cls is not None:
        done = True
        if mlp_cls not in _mlp_class_users.values():
            _revert_class(mlp_cls)
    if cls not in _class_saved:
        return done
    saved = _class_saved.pop(cls)
    if saved is _MISSING:
        if "forward" in cls.__dict__:
            delattr(cls, "forward")
    else:
        cls.forward = saved
    if "_fusedloss_skip_logits" in cls.__dict__:
        delattr(cls, "_fusedloss_skip_logits")
    return True


def revert(target=None):
    """Undo apply(), the fused MLPs (gelu=True) included: on an instance (its own patches; a
    class-level patch stays), on a class, or with no argument every patch made so far (instances
    and classes). Returns True if something was reverted."""
    if target is None:
        done = False
        for m in list(_instances):
            done = _revert_instance(m) or done
        for c in list(_mlp_class_users) + list(_class_saved):
            done = _revert_class(c) or done
        return done
    if isinstance(target, type):
        return _revert_class(target)
    return _revert_instance(target)


def is_patched(target):
    """True if calling target (an instance or a class) runs the fused forward."""
    cls = target if isinstance(target, type) else type(target)
    if not isinstance(target, type):
        f = target.__dict__.get("forward")
        if f is not None:
            return _is_patch(getattr(f, "__func__", f))
    return _is_patch(getattr(cls, "forward", None))


def _named(name, model):
    spec = _SPECS[name]
    if model is None:
        return spec.cls()
    _spec_for(type(model), only=name)  # TypeError if it is not that model
    return model


def patch_gpt2(model=None, *, linear_cross_entropy=True, gelu=False, skip_logits=True):
    """apply() to transformers.GPT2LMHeadModel (the class) or, when given, to that GPT-2 model."""
    return apply(_named("gpt2", model), linear_cross_entropy=linear_cross_entropy, gelu=gelu,
                 skip_logits=skip_logits)


def patch_llama(model=None, *, linear_cross_entropy=True, gelu=False, skip_logits=True):
    """apply() to transformers.LlamaForCausalLM (the class) or, when given, to that Llama model."""
    return apply(_named("llama", model), linear_cross_entropy=linear_cross_entropy, gelu=gelu,
                 skip_logits=skip_logits)


def revert_gpt2(model=None):
    """revert() of patch_gpt2(model)."""
    return revert(_named("gpt2", model))


def revert_llama(model=None):
    """revert() of patch_llama(model)."""
    return revert(_named("llama", model))


# STYLE.md's names (Liger's apply_liger_kernel_to_* convention)
apply_fusedloss_to_gpt2 = patch_gpt2
apply_fusedloss_to_llama = patch_llama
