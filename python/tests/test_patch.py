"""Tests of fusedloss.patch (Hugging Face transformers GPT-2 and Llama trained with
fusedloss.linear_cross_entropy): small randomly initialised models built from configs (nothing is
downloaded), patched vs unpatched copies with the same weights: the loss and every parameter's
gradient, with and without num_items_in_batch, -100 labels, shift_labels, instance- and
class-level patches, revert, no logits materialised, generation unchanged, the fallbacks and the
errors; a bf16 GPU variant (skips without CUDA). The fused bias-GeLU MLP (gelu=True, GPT-2):
the same comparisons for each supported activation_function, with and without the fused loss,
class- and instance-level, revert, the unsupported activations and Llama's refusal.

Run (CPU, CI):   make lib && PYTHONPATH=python python -m pytest -q python/tests/test_patch.py
Needs transformers (5.x; .ci/run installs it); skips without it.
"""
import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP  # noqa: E402

import fusedloss  # noqa: E402
import fusedloss.patch as flp  # noqa: E402

transformers.logging.set_verbosity_error()

# ---- tolerances: |got - ref| <= atol * max(1, max|ref|) + rtol * |ref| -----------------------
# fp32 CPU: transformers' fp32 logits -> fp32 cross-entropy vs the C library's double
# accumulation: differences are fp32 rounding noise.
LOSS_TOL = (1e-6, 1e-5)
GRAD_TOL = (1e-6, 1e-4)
# bf16 on the GPU: both compute bf16 logits; the loss from them in fp32 either way, but the
# GEMMs (and the gradient roundings) run in different orders
BF16_LOSS_TOL = (2e-3, 5e-3)
BF16_GRAD_NORM_TOL = 3e-2   # relative norm error of each parameter's gradient
# fp32 parameters under bf16 autocast: transformers' weight gradient is a bf16 GEMM result,
# fusedloss's is accumulated in fp32
AUTOCAST_GRAD_TOL = (2e-2, 5e-2)

V = 101
HAS_CUDA = torch.cuda.is_available() and fusedloss.cuda_built()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")


def assert_close(got, ref, tol, what):
    atol, rtol = tol
    got = got.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    err = (got - ref).abs()
    bad = err > atol * max(1.0, ref.abs().max().item()) + rtol * ref.abs()
    if bad.any():
        raise AssertionError(f"{what}: {int(bad.sum())} of {ref.numel()} mismatch, maxdiff "
                             f"{err.max().item():.3g} (max |ref| {ref.abs().max().item():.3g})")


def assert_close_norm(got, ref, rel, what):
    """||got - ref|| <= rel * ||ref|| (for 16-bit gradients deep in a network, where single
    elements carry the roundings of many GEMMs in different orders)."""
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    assert got.shape == ref.shape, what
    err, scale = (got - ref).norm().item(), ref.norm().item()
    assert err <= rel * scale + 1e-12, f"{what}: relative norm error {err / max(scale, 1e-30):.3g} > {rel}"


def gpt2(**kw):
    cfg = GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, **kw)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg)


def llama(**kw):
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0, **kw)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


MODELS = {"gpt2": gpt2, "llama": llama}


def batch(B=3, T=11, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100                                      # a masked prompt
    labels[1, -3:] = -100                                     # padding at the end
    labels[torch.rand(B, T, generator=g) < 0.1] = -100       # scattered
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, -3:] = 0
    return ids.to(device), labels.to(device), mask.to(device)


@pytest.fixture(autouse=True)
def _clean():
    yield
    flp.revert()  # no test leaks a patch into the next


def loss_and_grads(model, **inputs):
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out.loss.backward()
    return out, {n.replace("_orig_mod.", ""): p.grad.clone()  # torch.compile's wrapper prefix
                 for n, p in model.named_parameters() if p.grad is not None}


def compare(patched, ref_model, loss_tol=LOSS_TOL, grad_tol=GRAD_TOL, norm_tol=None, **inputs):
    out, grads = loss_and_grads(patched, **inputs)
    ref, ref_grads = loss_and_grads(ref_model, **inputs)
    assert out.logits is None and ref.logits is not None
    assert out.loss.dtype == torch.float32
    assert_close(out.loss, ref.loss, loss_tol, "loss")
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(ref_model.parameters()))
    for n in ref_grads:
        assert grads[n].dtype == ref_grads[n].dtype
        if norm_tol is None:
            assert_close(grads[n], ref_grads[n], grad_tol, f"grad {n}")
        else:
            assert_close_norm(grads[n], ref_grads[n], norm_tol, f"grad {n}")
    return out, ref


# ---- patched == unpatched ------------------------------------------------------------------------
@pytest.mark.parametrize("nib", [None, "tensor", "int"])
@pytest.mark.parametrize("level", ["instance", "class"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_loss_and_grads_match(name, level, nib):
    ref = MODELS[name]()
    model = copy.deepcopy(ref)
    flp.apply(model if level == "instance" else type(model))
    assert flp.is_patched(model)
    if level == "class":
        assert flp.is_patched(ref)  # every instance; compare against the original forward
        ref.forward = flp._class_saved[type(ref)].__get__(ref)
    ids, labels, mask = batch()
    kw = {}
    if nib == "tensor":
        kw["num_items_in_batch"] = torch.tensor(17)  # e.g. the Trainer's count over micro-batches
    elif nib == "int":
        kw["num_items_in_batch"] = 23
    compare(model, ref, input_ids=ids, labels=labels, attention_mask=mask, **kw)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_shift_labels(name):
    ref = MODELS[name]()
    model = flp.apply(copy.deepcopy(ref))
    ids, labels, mask = batch(seed=1)
    shift = torch.randint(0, V, labels.shape)
    shift[:, -1] = -100
    shift[2, :5] = -100
    compare(model, ref, input_ids=ids, labels=labels, shift_labels=shift)
    compare(model, ref, input_ids=ids, labels=labels, shift_labels=shift,
            num_items_in_batch=torch.tensor(9))


def test_all_labels_ignored_is_nan_like_transformers():
    ref = gpt2()
    model = flp.apply(copy.deepcopy(ref))
    ids, labels, _ = batch()
    labels[:] = -100
    a, b = model(input_ids=ids, labels=labels).loss, ref(input_ids=ids, labels=labels).loss
    assert torch.isnan(a) and torch.isnan(b)
    a = model(input_ids=ids, labels=labels, num_items_in_batch=5).loss
    assert a.item() == 0.0 == ref(input_ids=ids, labels=labels, num_items_in_batch=5).loss.item()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_gradient_accumulation_with_num_items(name):
    """The Trainer's recipe: micro-batch losses summed / num_items over all micro-batches."""
    ref = MODELS[name]()
    model = flp.apply(copy.deepcopy(ref))
    micro = [batch(B=2, T=9, seed=s) for s in range(3)]
    n = torch.tensor(sum(int((lab[:, 1:] != -100).sum()) for _, lab, _ in micro))
    grads = []
    for m in (model, ref):
        m.zero_grad(set_to_none=True)
        for ids, lab, mask in micro:
            m(input_ids=ids, labels=lab, attention_mask=mask, num_items_in_batch=n).loss.backward()
        grads.append({k: p.grad.clone() for k, p in m.named_parameters()})
    for k in grads[1]:
        assert_close(grads[0][k], grads[1][k], GRAD_TOL, f"accumulated grad {k}")


def test_tied_weights_gpt2():
    model = flp.apply(gpt2())
    assert model.lm_head.weight is model.transformer.wte.weight
    ids, labels, _ = batch()
    model(input_ids=ids, labels=labels).loss.backward()
    ref = gpt2()
    ref(input_ids=ids, labels=labels).loss.backward()
    # one gradient: embedding + lm head contributions
    assert_close(model.transformer.wte.weight.grad, ref.transformer.wte.weight.grad, GRAD_TOL, "tied")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_autocast_cpu(name):
    ref = MODELS[name]()
    model = flp.apply(copy.deepcopy(ref))
    ids, labels, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, grads = loss_and_grads(model, input_ids=ids, labels=labels, attention_mask=mask)
        r, rgrads = loss_and_grads(ref, input_ids=ids, labels=labels, attention_mask=mask)
    assert out.loss.dtype == torch.float32
    assert_close(out.loss, r.loss, BF16_LOSS_TOL, "autocast loss")
    for k in rgrads:
        assert grads[k].dtype == torch.float32
        assert_close(grads[k], rgrads[k], AUTOCAST_GRAD_TOL, f"autocast grad {k}")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_compile_fullgraph(name):
    """The patched forward traces as one graph (aot_eager: a few seconds per model on the CPU)."""
    ref = MODELS[name]()
    model = flp.apply(copy.deepcopy(ref))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    ids, labels, mask = batch()
    compare(compiled, ref, input_ids=ids, labels=labels, attention_mask=mask,
            num_items_in_batch=torch.tensor(19))


# ---- the outputs ---------------------------------------------------------------------------------
class _ShapeLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                self.shapes.append((str(func), tuple(o.shape)))
        return out


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_no_logits_materialised(name):
    model = flp.apply(MODELS[name]())
    ids, labels, _ = batch(B=2, T=7)
    with _ShapeLog() as log:
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
    assert out.logits is None
    big = [s for s in log.shapes if len(s[1]) and s[1][-1] == V and
           torch.Size(s[1]).numel() >= 2 * 7 * V]
    assert not big, big[:5]
    # the same log of the unpatched model does see them (the check is real)
    with _ShapeLog() as log:
        MODELS[name]()(input_ids=ids, labels=labels).loss.backward()
    assert any(s[1][-1:] == (V,) and torch.Size(s[1]).numel() >= 2 * 7 * V for s in log.shapes)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_without_labels_logits_are_unchanged(name):
    ref = MODELS[name]()
    model = flp.apply(copy.deepcopy(ref))
    ids, _, mask = batch()
    a, b = model(input_ids=ids, attention_mask=mask), ref(input_ids=ids, attention_mask=mask)
    assert a.loss is None and b.loss is None
    assert torch.equal(a.logits, b.logits)
    assert torch.equal(model(input_ids=ids, logits_to_keep=1).logits, ref(input_ids=ids, logits_to_keep=1).logits)
    # past_key_values and hidden states pass through as before
    a = model(input_ids=ids, use_cache=True, output_hidden_states=True)
    b = ref(input_ids=ids, use_cache=True, output_hidden_states=True)
    assert len(a.hidden_states) == len(b.hidden_states)
    assert all(torch.equal(x, y) for x, y in zip(a.hidden_states, b.hidden_states))
    assert a.past_key_values is not None and b.past_key_values is not None


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_is_unchanged(name):
    ref = MODELS[name]()
    model = flp.apply(copy.deepcopy(ref))
    ids, _, _ = batch(B=2, T=5)
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), ref.generate(ids, **kw))


def test_return_dict_false():
    ref = gpt2()
    model = flp.apply(copy.deepcopy(ref))
    ids, labels, _ = batch()
    out = model(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(out, tuple)
    assert_close(out[0], ref(input_ids=ids, labels=labels).loss, LOSS_TOL, "tuple loss")
    assert all(o.shape != (3, 11, V) for o in out if isinstance(o, torch.Tensor))
    ref_out = ref(input_ids=ids, labels=labels, return_dict=False)
    assert len(out) == len(ref_out) - 1  # the tuple has no logits entry (None fields are dropped)


def test_skip_logits_options():
    ref = llama()
    model = flp.apply(copy.deepcopy(ref))
    ids, labels, _ = batch()
    # per call: False = transformers' own path, bit for bit
    a, b = model(input_ids=ids, labels=labels, skip_logits=False), ref(input_ids=ids, labels=labels)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    # "training": fused in train mode, logits in eval mode
    flp.apply(model, skip_logits="training")
    assert model.training and model(input_ids=ids, labels=labels).logits is None
    model.eval()
    ref.eval()
    a, b = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    assert model(input_ids=ids, labels=labels, skip_logits=True).logits is None
    # the default: fused whenever labels are given, also in eval mode
    flp.apply(model)
    assert model(input_ids=ids, labels=labels).logits is None


# ---- apply / revert --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_instance_patch_and_revert(name):
    ref = MODELS[name]()
    model = copy.deepcopy(ref)
    other = copy.deepcopy(ref)
    cls = type(model)
    orig = cls.forward
    assert flp.apply(model) is model and flp.apply(model) is model  # twice: harmless
    assert flp.is_patched(model) and not flp.is_patched(other) and not flp.is_patched(cls)
    assert cls.forward is orig
    ids, labels, _ = batch()
    assert model(input_ids=ids, labels=labels).logits is None
    assert other(input_ids=ids, labels=labels).logits is not None
    assert flp.revert(model) is True and flp.revert(model) is False
    assert "forward" not in model.__dict__ and not flp.is_patched(model)
    a, b = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    assert torch.equal(a.loss, b.loss) and torch.equal(a.logits, b.logits)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_class_patch_and_revert(name):
    ref = MODELS[name]()
    cls = type(ref)
    orig = cls.forward
    fn = flp.patch_gpt2 if name == "gpt2" else flp.patch_llama
    assert fn() is cls
    assert cls.forward is not orig and flp.is_patched(cls) and flp.is_patched(ref)
    new = MODELS[name]()  # created after the patch: patched too
    ids, labels, _ = batch()
    assert new(input_ids=ids, labels=labels).logits is None
    assert (flp.revert_gpt2 if name == "gpt2" else flp.revert_llama)() is True
    assert cls.forward is orig and not flp.is_patched(ref)
    assert "_fusedloss_skip_logits" not in cls.__dict__
    out = new(input_ids=ids, labels=labels)
    assert out.logits is not None
    assert torch.equal(out.loss, ref(input_ids=ids, labels=labels).loss)


def test_revert_all_and_convenience_functions():
    g, lm = gpt2(), llama()
    flp.patch_gpt2(g)
    flp.apply_fusedloss_to_llama()
    assert flp.is_patched(g) and flp.is_patched(lm) and flp.is_patched(LlamaForCausalLM)
    assert not flp.is_patched(GPT2LMHeadModel)
    assert flp.revert() is True
    assert not flp.is_patched(g) and not flp.is_patched(lm) and not flp.is_patched(LlamaForCausalLM)
    assert flp.revert() is False
    assert fusedloss.patch is flp


def test_instance_patch_over_class_patch():
    model = gpt2()
    flp.apply(GPT2LMHeadModel)
    flp.apply(model, skip_logits="training")
    model.eval()
    ids, labels, _ = batch()
    assert model(input_ids=ids, labels=labels).logits is not None  # the instance's setting
    flp.revert(model)
    assert flp.is_patched(model)  # the class patch stays
    assert model(input_ids=ids, labels=labels).logits is None


def test_deepcopy_of_a_patched_model():
    ref = gpt2()
    model = flp.apply(copy.deepcopy(ref))
    twin = copy.deepcopy(model)
    assert flp.is_patched(twin) and twin.forward.__self__ is twin
    ids, labels, _ = batch()
    assert twin(input_ids=ids, labels=labels).logits is None
    assert flp.revert(twin) is True and "forward" not in twin.__dict__
    assert torch.equal(twin(input_ids=ids, labels=labels).loss, ref(input_ids=ids, labels=labels).loss)
    assert flp.is_patched(model)


def test_subclass_keeping_forward_is_supported():
    class MyGPT2(GPT2LMHeadModel):
        pass

    cfg = gpt2().config
    ref = MyGPT2(cfg)
    model = flp.apply(copy.deepcopy(ref))
    compare(model, ref, input_ids=batch()[0], labels=batch()[1])
    flp.apply(MyGPT2)
    assert flp.is_patched(MyGPT2) and not flp.is_patched(GPT2LMHeadModel)
    flp.revert(MyGPT2)
    assert "forward" not in MyGPT2.__dict__


# ---- fallbacks -------------------------------------------------------------------------------------
def test_custom_loss_function_falls_back():
    ref = llama()
    model = flp.apply(copy.deepcopy(ref))
    calls = []

    def my_loss(logits, labels, vocab_size, **kw):
        calls.append(logits.shape)
        return logits.float().square().mean()

    model.loss_function = my_loss
    ids, labels, _ = batch()
    flp._warned.clear()
    with pytest.warns(UserWarning, match="custom loss_function"):
        out = model(input_ids=ids, labels=labels)
    assert calls == [(3, 11, V)] and out.logits is not None
    assert torch.equal(out.loss, ref(input_ids=ids).logits.float().square().mean())


def test_hooked_lm_head_falls_back():
    ref = gpt2()
    model = flp.apply(copy.deepcopy(ref))
    seen = []
    model.lm_head.register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    ids, labels, _ = batch()
    flp._warned.clear()
    with pytest.warns(UserWarning, match="not a plain torch.nn.Linear"):
        out = model(input_ids=ids, labels=labels)
    assert seen == [(3, 11, V)] and out.logits is not None
    assert torch.equal(out.loss, ref(input_ids=ids, labels=labels).loss)


# ---- errors ----------------------------------------------------------------------------------------
def test_errors():
    with pytest.raises(TypeError, match="not a supported model"):
        flp.apply(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="not a supported model"):
        flp.apply(dict)
    with pytest.raises(TypeError, match="expected a model"):
        flp.apply(3)
    with pytest.raises(TypeError, match="not a supported model"):
        flp.patch_llama(gpt2())
    with pytest.raises(ValueError, match="LlamaForCausalLM has no GeLU MLP"):
        flp.apply(LlamaForCausalLM, gelu=True)
    with pytest.raises(ValueError, match="skip_logits"):
        flp.apply(GPT2LMHeadModel, skip_logits=False)
    with pytest.raises(ValueError, match="nothing to apply"):
        flp.apply(GPT2LMHeadModel, linear_cross_entropy=False)
    assert not flp.is_patched(GPT2LMHeadModel)

    class Custom(GPT2LMHeadModel):
        def forward(self, *a, **k):
            return super().forward(*a, **k)

    with pytest.raises(TypeError, match="overrides GPT2LMHeadModel.forward"):
        flp.apply(Custom)


def test_forward_signature_is_checked(monkeypatch):
    spec = flp._SPECS["gpt2"]
    monkeypatch.setattr(spec, "params", spec.params[:-2] + ("kwargs",))
    with pytest.raises(RuntimeError, match="fusedloss.patch mirrors"):
        flp.apply(gpt2())


# ---- the fused bias-GeLU MLP (gelu=True) ------------------------------------------------------------
GELU_ACTS = ["gelu_new", "gelu", "gelu_pytorch_tanh"]   # GPT2Config's default first


@pytest.fixture
def gelu_calls(monkeypatch):
    """The (dtype, bias dtype, approximate) of every fusedloss.gelu call of a patched MLP."""
    calls = []

    def counting(x, bias=None, approximate="tanh"):
        calls.append((x.dtype, bias.dtype, approximate))
        return fusedloss.gelu(x, bias=bias, approximate=approximate)

    monkeypatch.setattr(flp, "_fused_gelu", counting)
    return calls


def match(got, ref, loss_tol=LOSS_TOL, grad_tol=GRAD_TOL, norm_tol=None):
    """got, ref: (output, grads) of loss_and_grads; the loss and every parameter's gradient."""
    (out, grads), (r, rgrads) = got, ref
    assert_close(out.loss, r.loss, loss_tol, "loss")
    assert grads.keys() == rgrads.keys()
    for n in rgrads:
        assert grads[n].dtype == rgrads[n].dtype
        if norm_tol is None:
            assert_close(grads[n], rgrads[n], grad_tol, f"grad {n}")
        else:
            assert_close_norm(grads[n], rgrads[n], norm_tol, f"grad {n}")


def mlps(model):
    return [blk.mlp for blk in model.transformer.h]


@pytest.mark.parametrize("lce", [True, False])
@pytest.mark.parametrize("level", ["instance", "class"])
@pytest.mark.parametrize("act", GELU_ACTS)
def test_gelu_loss_and_grads_match(act, level, lce, gelu_calls):
    ref = gpt2(activation_function=act)
    model = copy.deepcopy(ref)
    ids, labels, mask = batch()
    inputs = dict(input_ids=ids, labels=labels, attention_mask=mask)
    r = loss_and_grads(ref, **inputs)  # before a class patch reaches ref too
    flp.apply(model if level == "instance" else GPT2LMHeadModel, gelu=True, linear_cross_entropy=lce)
    assert flp.is_patched(model) == lce
    got = loss_and_grads(model, **inputs)
    assert (got[0].logits is None) == lce
    approx = "none" if act == "gelu" else "tanh"
    assert gelu_calls == [(torch.float32, torch.float32, approx)] * 2  # one per layer
    assert len(got[1]) == len(list(ref.parameters()))
    match(got, r)


def test_gelu_and_loss_with_num_items_and_shift_labels(gelu_calls):
    ref = gpt2()
    model = flp.patch_gpt2(copy.deepcopy(ref), gelu=True)
    ids, labels, mask = batch(seed=2)
    shift = torch.randint(0, V, labels.shape)
    shift[:, -1] = -100
    kw = dict(input_ids=ids, labels=labels, attention_mask=mask, shift_labels=shift,
              num_items_in_batch=torch.tensor(13))
    compare(model, ref, **kw)
    assert len(gelu_calls) == 2


def test_gelu_instance_patch_and_revert(gelu_calls):
    ref = gpt2()
    model = copy.deepcopy(ref)
    other = copy.deepcopy(ref)
    orig = GPT2MLP.forward
    assert flp.apply(model, gelu=True) is model and flp.apply(model, gelu=True) is model  # twice
    assert GPT2MLP.forward is orig and not flp.is_patched(GPT2MLP)
    assert all(flp.is_patched(m) for m in mlps(model))
    assert not any(flp.is_patched(m) for m in mlps(other))
    assert all(m.forward.__self__ is m for m in mlps(model))
    ids, labels, _ = batch()
    other(input_ids=ids, labels=labels)
    assert gelu_calls == []
    model(input_ids=ids, labels=labels)
    assert len(gelu_calls) == 2
    assert flp.revert(model) is True and flp.revert(model) is False
    assert not any("forward" in m.__dict__ or "_fusedloss_saved_forward" in m.__dict__
                   for m in model.modules())
    a, b = model(input_ids=ids, labels=labels), ref(input_ids=ids, labels=labels)
    assert torch.equal(a.loss, b.loss) and torch.equal(a.logits, b.logits)
    assert len(gelu_calls) == 2
    # the MLP alone, then revert() with no argument
    flp.apply(model, gelu=True, linear_cross_entropy=False)
    assert not flp.is_patched(model) and all(flp.is_patched(m) for m in mlps(model))
    assert flp.revert() is True and not any(flp.is_patched(m) for m in mlps(model))


@pytest.mark.parametrize("lce", [True, False])
def test_gelu_class_patch_and_revert(lce, gelu_calls):
    ref = gpt2()
    ids, labels, _ = batch()
    r = ref(input_ids=ids, labels=labels)
    orig_mlp, orig = GPT2MLP.forward, GPT2LMHeadModel.forward
    assert flp.patch_gpt2(gelu=True, linear_cross_entropy=lce) is GPT2LMHeadModel
    flp.patch_gpt2(gelu=True, linear_cross_entropy=lce)  # twice: harmless
    assert GPT2MLP.forward is not orig_mlp and flp.is_patched(GPT2MLP)
    assert flp.is_patched(GPT2LMHeadModel) == lce
    new = gpt2()  # created after the patch: patched too
    new(input_ids=ids, labels=labels)
    assert len(gelu_calls) == 2
    assert flp.revert_gpt2() is True and flp.revert_gpt2() is False
    assert GPT2MLP.forward is orig_mlp and GPT2LMHeadModel.forward is orig
    out = new(input_ids=ids, labels=labels)
    assert len(gelu_calls) == 2
    assert torch.equal(out.loss, r.loss) and torch.equal(out.logits, r.logits)


def test_gelu_class_patch_shared_by_two_classes():
    class MyGPT2(GPT2LMHeadModel):
        pass

    flp.apply(GPT2LMHeadModel, gelu=True, linear_cross_entropy=False)
    flp.apply(MyGPT2, gelu=True)
    assert flp.revert(MyGPT2) is True
    assert flp.is_patched(GPT2MLP)  # GPT2LMHeadModel's gelu patch still uses it
    assert flp.revert(GPT2LMHeadModel) is True and not flp.is_patched(GPT2MLP)
    flp.apply(MyGPT2, gelu=True, linear_cross_entropy=False)
    assert flp.revert() is True and not flp.is_patched(GPT2MLP) and not flp._mlp_class_users


@pytest.mark.parametrize("act", ["relu", "gelu_fast", "gelu_python", "quick_gelu"])
def test_gelu_unsupported_activation_raises(act):
    model = gpt2(activation_function=act)
    with pytest.raises(ValueError, match=f"activation_function '{act}'"):
        flp.apply(model, gelu=True)
    # nothing was patched: neither the loss nor any MLP
    assert not flp.is_patched(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    # a class patch cannot see the config: that MLP raises when it runs
    flp.apply(GPT2LMHeadModel, gelu=True)
    ids, labels, _ = batch()
    with pytest.raises(ValueError, match="gelu=True fuses GPT-2's MLP only for"):
        model(input_ids=ids, labels=labels)


def test_gelu_llama_raises():
    with pytest.raises(ValueError, match="LlamaForCausalLM has no GeLU MLP"):
        flp.patch_llama(llama(), gelu=True)
    with pytest.raises(ValueError, match="LlamaForCausalLM has no GeLU MLP"):
        flp.patch_llama(gelu=True, linear_cross_entropy=False)
    assert not flp.is_patched(LlamaForCausalLM)


def test_gelu_checks_before_patching(monkeypatch):
    """A failing check of the loss patch leaves the MLPs unpatched too."""
    spec = flp._SPECS["gpt2"]
    monkeypatch.setattr(spec, "params", spec.params[:-2] + ("kwargs",))
    model = gpt2()
    with pytest.raises(RuntimeError, match="fusedloss.patch mirrors"):
        flp.apply(model, gelu=True)
    assert not any(flp.is_patched(m) for m in mlps(model))

    class MyMLP(GPT2MLP):
        def forward(self, hidden_states):
            return super().forward(hidden_states)

    model = gpt2()
    model.transformer.h[1].mlp.__class__ = MyMLP
    with pytest.raises(TypeError, match="overrides GPT2MLP.forward"):
        flp.apply(model, gelu=True, linear_cross_entropy=False)
    assert not any(flp.is_patched(m) for m in mlps(model))


def test_gelu_hooked_c_fc_falls_back(gelu_calls):
    ref = gpt2()
    model = flp.apply(copy.deepcopy(ref), gelu=True, linear_cross_entropy=False)
    seen = []
    model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    ids, labels, _ = batch()
    flp._warned.clear()
    with pytest.warns(UserWarning, match="c_fc is not a plain Conv1D"):
        out = model(input_ids=ids, labels=labels)
    assert seen == [(3, 11, 128)] and len(gelu_calls) == 1  # layer 0 unfused, layer 1 fused
    assert_close(out.loss, ref(input_ids=ids, labels=labels).loss, LOSS_TOL, "loss")


def test_gelu_deepcopy_of_a_patched_model(gelu_calls):
    model = flp.apply(gpt2(), gelu=True)
    twin = copy.deepcopy(model)
    assert all(flp.is_patched(m) and m.forward.__self__ is m for m in mlps(twin))
    ids, labels, _ = batch()
    twin(input_ids=ids, labels=labels)
    assert len(gelu_calls) == 2
    assert flp.revert(twin) is True and not any(flp.is_patched(m) for m in mlps(twin))
    assert all(flp.is_patched(m) for m in mlps(model))


def test_gelu_autocast_cpu(gelu_calls):
    """Under bf16 autocast fusedloss.gelu gets what transformers' activation gets (bf16, the
    addmm's result dtype), the fp32 bias as it is; grads stay fp32."""
    ref = gpt2()
    model = flp.apply(copy.deepcopy(ref), gelu=True)
    seen = []
    ref.transformer.h[0].mlp.act.register_forward_pre_hook(lambda mod, a: seen.append(a[0].dtype))
    ids, labels, mask = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss_and_grads(model, input_ids=ids, labels=labels, attention_mask=mask)
        r = loss_and_grads(ref, input_ids=ids, labels=labels, attention_mask=mask)
    assert seen == [torch.bfloat16]
    assert gelu_calls == [(torch.bfloat16, torch.float32, "tanh")] * 2
    assert got[0].loss.dtype == torch.float32
    assert all(g.dtype == torch.float32 for g in got[1].values())
    match(got, r, BF16_LOSS_TOL, AUTOCAST_GRAD_TOL)


@pytest.mark.parametrize("level", ["instance", "class"])
def test_gelu_compile_fullgraph(level):
    ref = gpt2()
    model = copy.deepcopy(ref)
    ids, labels, mask = batch()
    inputs = dict(input_ids=ids, labels=labels, attention_mask=mask)
    r = loss_and_grads(ref, **inputs)
    flp.apply(model if level == "instance" else GPT2LMHeadModel, gelu=True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    match(loss_and_grads(compiled, **inputs), r)


# ---- GPU -------------------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("nib", [None, "tensor"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_bf16_cuda(name, nib):
    ref = MODELS[name]().to("cuda", torch.bfloat16)
    model = flp.apply(copy.deepcopy(ref))
    ids, labels, mask = batch(B=4, T=33, device="cuda")
    kw = {"num_items_in_batch": torch.tensor(40, device="cuda")} if nib else {}
    out, r = compare(model, ref, BF16_LOSS_TOL, norm_tol=BF16_GRAD_NORM_TOL, input_ids=ids,
                     labels=labels, attention_mask=mask, **kw)
    assert out.loss.device.type == "cuda"


@needs_cuda
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_autocast_cuda(name):
    ref = MODELS[name]().cuda()
    model = flp.apply(copy.deepcopy(ref))
    ids, labels, mask = batch(B=4, T=33, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, grads = loss_and_grads(model, input_ids=ids, labels=labels, attention_mask=mask)
        r, rgrads = loss_and_grads(ref, input_ids=ids, labels=labels, attention_mask=mask)
    assert_close(out.loss, r.loss, BF16_LOSS_TOL, "autocast loss")
    for k in rgrads:
        assert grads[k].dtype == torch.float32
        assert_close_norm(grads[k], rgrads[k], BF16_GRAD_NORM_TOL, f"autocast grad {k}")


@needs_cuda
def test_fp32_cuda_training_steps():
    """A few optimiser steps patched vs unpatched stay together (fp32, TF32 off)."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        ref = llama().cuda()
        model = flp.apply(copy.deepcopy(ref))
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (model, ref)]
        for step in range(5):
            ids, labels, mask = batch(B=4, T=17, seed=step, device="cuda")
            losses = []
            for m, o in zip((model, ref), opts):
                o.zero_grad()
                loss = m(input_ids=ids, labels=labels, attention_mask=mask).loss
                loss.backward()
                o.step()
                losses.append(loss.item())
            assert abs(losses[0] - losses[1]) <= 1e-4 * abs(losses[1]), (step, losses)
    finally:
        torch.set_float32_matmul_precision(old)


@needs_cuda
@pytest.mark.parametrize("lce", [True, False])
@pytest.mark.parametrize("act", GELU_ACTS)
def test_gelu_bf16_cuda(act, lce, gelu_calls):
    ref = gpt2(activation_function=act).to("cuda", torch.bfloat16)
    model = flp.apply(copy.deepcopy(ref), gelu=True, linear_cross_entropy=lce)
    ids, labels, mask = batch(B=4, T=33, device="cuda")
    inputs = dict(input_ids=ids, labels=labels, attention_mask=mask)
    got, r = loss_and_grads(model, **inputs), loss_and_grads(ref, **inputs)
    assert gelu_calls == [(torch.bfloat16, torch.bfloat16, "none" if act == "gelu" else "tanh")] * 2
    match(got, r, BF16_LOSS_TOL, norm_tol=BF16_GRAD_NORM_TOL)


@needs_cuda
@pytest.mark.parametrize("level", ["instance", "class"])
def test_gelu_autocast_cuda(level, gelu_calls):
    ref = gpt2().cuda()
    model = copy.deepcopy(ref)
    ids, labels, mask = batch(B=4, T=33, device="cuda")
    inputs = dict(input_ids=ids, labels=labels, attention_mask=mask)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        r = loss_and_grads(ref, **inputs)
        flp.apply(model if level == "instance" else GPT2LMHeadModel, gelu=True)
        got = loss_and_grads(model, **inputs)
    assert gelu_calls == [(torch.bfloat16, torch.float32, "tanh")] * 2
    assert all(g.dtype == torch.float32 for g in got[1].values())
    match(got, r, BF16_LOSS_TOL, norm_tol=BF16_GRAD_NORM_TOL)
