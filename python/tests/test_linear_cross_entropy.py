"""Tests of fusedloss.linear_cross_entropy / nn.LinearCrossEntropyLoss (the lm head + its loss
without the logits) against torch.nn.functional.linear + cross_entropy: in float64 from the same
rounded logits (every option, both gradient modes, every reduction, the gradients of hidden,
weight and bias), and against PyTorch running in the same dtype; chunking, autocast,
torch.compile(fullgraph=True), opcheck on the three raw ops, the C calls each path makes, and bad
inputs. GPU cases (the same grid on CUDA, odd H, CUDA graphs, autocast, memory) skip without CUDA.

Run (CPU, CI):   make lib && PYTHONPATH=python python -m pytest -q python/tests/test_linear_cross_entropy.py
Run (H200):      make lib && PYTHONPATH=python python3 -m pytest -q python/tests -k "cuda and linear"
The library comes from FUSEDLOSS_LIBRARY, the installed package, or <repo>/build.
"""
import ctypes

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from fusedloss import TargetOutOfRangeError, _lib  # noqa: E402

# ---- tolerances: |got - ref| <= atol * max(1, max|ref|) + rtol * |ref| ------------------------
# The reference is float64 from the logits rounded to the input dtype (as F.linear returns them;
# its backward rounds dlogits to that dtype too, as the C API does), so the loss agrees to double
# rounding noise; the gradients are rounded once more to their dtype (twice in mode 1 with an
# upstream gradient != 1 for 16-bit gradients: the kernel's, then the scaling's).
LOSS_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-5, 1e-4), torch.bfloat16: (1e-5, 1e-4)}
GRAD_TOL = {torch.float32: (1e-6, 1e-4), torch.float16: (2e-4, 4e-3), torch.bfloat16: (2e-3, 1.6e-2)}
# CUDA: fp32 accumulation in cuBLASLt (and TF32 off for these comparisons) over H and N
CUDA_LOSS_TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (1e-4, 1e-3), torch.bfloat16: (1e-4, 2e-3)}
CUDA_GRAD_TOL = {torch.float32: (1e-5, 1e-3), torch.float16: (5e-4, 8e-3), torch.bfloat16: (4e-3, 3e-2)}
# vs torch running the whole thing in the input dtype (its own roundings differ from ours)
SAME_DTYPE_TOL = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (1e-2, 3e-2)}

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HAS_CUDA = torch.cuda.is_available() and fusedloss.cuda_built()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")
REDUCTIONS = ["mean", "sum", "none"]


def assert_close(got, ref, tol, what):
    atol, rtol = tol
    got = got.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    nan_got, nan_ref = torch.isnan(got), torch.isnan(ref)
    assert torch.equal(nan_got, nan_ref), f"{what}: NaN pattern differs"
    g, r = got[~nan_got], ref[~nan_ref]
    if r.numel() == 0:
        return
    err = (g - r).abs()
    bad = err > atol * max(1.0, r.abs().max().item()) + rtol * r.abs()
    if bad.any():
        idx = bad.nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {r.numel()} mismatch, maxdiff "
                             f"{err.max().item():.3g}; first: {[(g[i].item(), r[i].item()) for i in idx]}")


# ---- float64 reference --------------------------------------------------------------------------
def reference(h, W, b, t, dtype, ignore_index=-100, reduction="mean", label_smoothing=0.0,
              class_weight=None, z_loss=0.0, softcap=None, logit_scale=1.0, **_):
    """F.cross_entropy(F.linear(h, W, b)) in float64 with the logits rounded to dtype, the C
    API's transforms (logit_scale, softcap) and z_loss * lse^2 (not class-weighted; 'mean' over
    non-ignored rows). h, W, b: float64 tensors holding the dtype inputs' values."""
    V = W.shape[0]
    logits = F.linear(h, W, b).to(dtype).double()
    z = (logits * logit_scale).reshape(-1, V)
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    tt = t.reshape(-1).long()
    w = class_weight.double() if class_weight is not None else None
    loss = F.cross_entropy(z, tt, w, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    if z_loss:
        mask = (tt != ignore_index).double()
        zl = z_loss * torch.logsumexp(z, dim=1).square() * mask
        loss = loss + (zl if reduction == "none" else zl.sum() if reduction == "sum"
                       else zl.sum() / mask.sum())
    return loss.reshape(t.shape) if reduction == "none" else loss


def make_inputs(lead, H, V, dtype, device="cpu", bias=True, frac_ignored=0.25, seed=0,
                ignore_index=-100, index_dtype=torch.int64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(*lead, H, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)
    W = (torch.randn(V, H, generator=g, dtype=torch.float64) / H ** 0.5 * 3).to(dtype).to(device)
    b = (torch.randn(V, generator=g, dtype=torch.float64) * 0.5).to(dtype).to(device) if bias else None
    t = torch.randint(0, V, lead, generator=g)
    if frac_ignored and t.dim() > 0:
        t[torch.rand(lead, generator=g) < frac_ignored] = ignore_index
    return h, W, b, t.to(index_dtype).to(device)


def upstream(loss, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5).to(loss.device)


def _materialize(opts, V, device):
    opts = dict(opts)
    if opts.get("class_weight") is True:
        g = torch.Generator().manual_seed(7)
        opts["class_weight"] = (torch.rand(V, generator=g) + 0.2).to(device)
    return opts


def check_case(lead, H, V, dtype, device="cpu", *, bias=True, grad_out=True, loss_tol=None,
               grad_tol=None, requires=(True, True, True), **opts):
    """fusedloss vs the float64 reference: loss, and hidden/weight/bias gradients for a random
    upstream gradient (or 1 when grad_out is False)."""
    cuda = device == "cuda"
    loss_tol = loss_tol or (CUDA_LOSS_TOL if cuda else LOSS_TOL)[dtype]
    grad_tol = grad_tol or (CUDA_GRAD_TOL if cuda else GRAD_TOL)[dtype]
    opts = _materialize(opts, V, device)
    h, W, b, t = make_inputs(lead, H, V, dtype, device, bias=bias,
                             ignore_index=opts.get("ignore_index", -100))
    refs = [x.detach().double().requires_grad_(r) if x is not None else None
            for x, r in zip((h, W, b), requires)]
    ref = reference(*refs, t, dtype, **opts)
    leaves = [x.detach().clone().requires_grad_(r) if x is not None else None
              for x, r in zip((h, W, b), requires)]
    loss = fusedloss.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], **opts)
    assert loss.dtype == torch.float32
    what = f"{lead} H={H} V={V} {dtype} {device} {opts}"
    assert_close(loss, ref, loss_tol, "loss " + what)
    g = upstream(ref) if grad_out else torch.ones_like(ref)
    if any(requires):
        ref.backward(g)
        loss.backward(g.float())
    for name, x, xr, r in zip(("hidden", "weight", "bias"), leaves, refs, requires):
        if x is None:
            continue
        if not r:
            assert x.grad is None
            continue
        assert x.grad is not None and x.grad.dtype == dtype and x.grad.shape == x.shape, name
        assert_close(x.grad, xr.grad, grad_tol, f"d{name} " + what)
    return loss


# ---- the CPU grid ---------------------------------------------------------------------------------
OPTIONS = [
    dict(),
    dict(label_smoothing=0.1),
    dict(ignore_index=0),
    dict(class_weight=True),
    dict(class_weight=True, label_smoothing=0.2, ignore_index=3),
    dict(z_loss=1e-2),
    dict(softcap=2.0),
    dict(logit_scale=0.5),
    dict(softcap=3.0, logit_scale=1.7, z_loss=1e-3, label_smoothing=0.05, class_weight=True),
]


def _id(o):
    return ",".join(f"{k}={'w' if v is True else v}" for k, v in o.items()) or "default"


@pytest.mark.parametrize("recompute", [None, True], ids=["mode1", "recompute"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", OPTIONS, ids=_id)
def test_grid_cpu(opts, dtype, reduction, recompute):
    check_case((2, 5), 16, 37, dtype, reduction=reduction, recompute=recompute, **opts)


@pytest.mark.parametrize("lead,H,V", [((), 8, 11), ((1,), 1, 1), ((7,), 3, 2), ((3, 4, 2), 24, 50),
                                      ((33,), 20, 129)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_shapes_cpu(lead, H, V, bias, reduction):
    for recompute in (None, True):
        check_case(lead, H, V, torch.float32, bias=bias, reduction=reduction, recompute=recompute)


@pytest.mark.parametrize("requires", [(True, False, False), (False, True, False), (False, False, True),
                                      (True, True, False), (False, True, True)], ids=str)
@pytest.mark.parametrize("recompute", [None, True], ids=["mode1", "recompute"])
def test_partial_requires_grad_cpu(requires, recompute):
    check_case((9,), 12, 21, torch.float32, requires=requires, recompute=recompute, label_smoothing=0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_matches_torch_in_same_dtype_cpu(dtype, reduction):
    # what a model does unfused: F.linear in the model's dtype, then cross-entropy on the logits
    h, W, b, t = make_inputs((4, 6), 32, 101, dtype)
    a = [x.clone().requires_grad_(True) for x in (h, W, b)]
    r = [x.clone().requires_grad_(True) for x in (h, W, b)]
    loss = fusedloss.linear_cross_entropy(*a[:2], t, a[2], reduction=reduction, label_smoothing=0.1)
    ref = F.cross_entropy(F.linear(*r).float().reshape(-1, 101), t.reshape(-1), reduction=reduction,
                          label_smoothing=0.1)
    ref = ref.reshape(t.shape) if reduction == "none" else ref
    tol = SAME_DTYPE_TOL[dtype]
    assert_close(loss, ref, tol, "loss")
    g = upstream(ref).float()
    loss.backward(g)
    ref.backward(g)
    for x, y, n in zip(a, r, ("hidden", "weight", "bias")):
        assert x.grad.dtype == dtype
        assert_close(x.grad, y.grad, tol, "d" + n)


# ---- chunking and the tuning knobs ------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_chunk_rows_and_budget_cpu(dtype):
    base = None
    kws = [dict(chunk_rows=c) for c in (1, 2, 7, 64, 1000)] + [
        dict(), dict(byte_budget=1), dict(byte_budget=1 << 14), dict(wgrad_accum="fp32"),
        dict(wgrad_accum="lean", chunk_rows=5), dict(wgrad_accum="auto", byte_budget=1 << 12)]
    h, W, b, t = make_inputs((70,), 24, 45, dtype)
    for recompute in (None, True):
        for kw in kws:
            xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
            loss = fusedloss.linear_cross_entropy(xs[0], xs[1], t, xs[2], recompute=recompute,
                                                  label_smoothing=0.1, **kw)
            (loss * 1.5).backward()
            got = [loss] + [x.grad for x in xs]
            if base is None:
                base = got
                check_case((70,), 24, 45, dtype, grad_out=False, label_smoothing=0.1, **kw)
                continue
            # the CPU backend accumulates in double whatever the chunking: the same to rounding
            for u, v, n in zip(got, base, ("loss", "dh", "dw", "db")):
                assert_close(u, v, (1e-6, 1e-5) if dtype == torch.float32 else (1e-2, 1e-2),
                             f"{n} {kw} recompute={recompute}")


def test_chunk_options_reach_the_c_call_cpu(monkeypatch):
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    h, W, b, t = make_inputs((10,), 8, 13, torch.float32)
    fusedloss.linear_cross_entropy(h, W, t, b, chunk_rows=3, byte_budget=12345, wgrad_accum="lean")
    (name, args), = spy.calls
    assert name == "fl_linear_cross_entropy_forward_cpu"
    opts = _lib.LCEOptions.from_address(args[20])
    assert (opts.struct_size, opts.chunk_rows, opts.byte_budget, opts.wgrad_accum, opts.allow_tf32) == \
        (ctypes.sizeof(_lib.LCEOptions), 3, 12345, _lib.FL_LCE_ACCUM_LEAN, 0)
    ce = _lib.CEOptions.from_address(args[19])
    assert (ce.ignore_index, ce.reduction) == (-100, _lib.FL_REDUCTION_MEAN)
    assert args[22] == _lib.lce_workspace_size(10, 8, 13, _lib.FL_DTYPE_F32, _lib.FL_DTYPE_F32,
                                               args[19], args[20])


# ---- which C calls each path makes ------------------------------------------------------------
class _Spy:
    """Records the C calls that fusedloss.ops makes (name, arguments)."""

    def __init__(self, lib):
        self._lib = lib
        self.calls = []

    def __getattr__(self, name):
        fn = getattr(self._lib, name)

        def wrapped(*args):
            self.calls.append((name, args))
            return fn(*args)
        return wrapped


FWD, BWD, SCALE = ("fl_linear_cross_entropy_forward_cpu", "fl_linear_cross_entropy_backward_cpu",
                   "fl_scale_rows_cpu")


@pytest.mark.parametrize("path", ["eager", "ops"])
def test_mode1_calls_cpu(monkeypatch, path):
    """Scalar loss with grads: one forward call writing loss + dhidden/dweight/dbias (grad_loss
    NULL); backward only scales them (fl_scale_rows, nothing moved for an upstream 1)."""
    if path == "ops":
        monkeypatch.setattr(fusedloss.functional, "_FORCE_OPS", True)
    h, W, b, t = make_inputs((12,), 8, 13, torch.float32)
    h.requires_grad_(True)
    W.requires_grad_(True)  # bias frozen: no dbias
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    loss = fusedloss.linear_cross_entropy(h, W, t, b)
    (name, a), = spy.calls
    assert name == FWD
    assert a[1] is not None and a[2] is not None and a[3] is not None and a[4] is None
    assert a[9] == b.data_ptr() and a[11] is None and a[12] == 1.0
    assert a[16] == a[17] == _lib.FL_DTYPE_F32
    loss.backward()
    assert [c[0] for c in spy.calls[1:]] == [SCALE, SCALE]  # dhidden, dweight: in place
    assert h.grad is not None and W.grad is not None and b.grad is None


def test_mode1_gradient_is_adopted_without_copy_cpu(monkeypatch):
    h, W, b, t = make_inputs((12,), 8, 13, torch.float32)
    W.requires_grad_(True)
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    loss = fusedloss.linear_cross_entropy(h, W, t)
    loss.backward()
    # W.grad is the very buffer the C call wrote (no scaling copy, no AccumulateGrad clone)
    assert W.grad.data_ptr() == spy.calls[0][1][3]
    g1 = W.grad.clone()
    W.grad = None
    (fusedloss.linear_cross_entropy(h, W, t) * 2.5).backward()
    assert_close(W.grad, g1 * 2.5, (1e-7, 1e-6), "scaled")


@pytest.mark.parametrize("path", ["eager", "ops"])
def test_recompute_calls_cpu(monkeypatch, path):
    if path == "ops":
        monkeypatch.setattr(fusedloss.functional, "_FORCE_OPS", True)
    h, W, b, t = make_inputs((12,), 8, 13, torch.float32)
    for x in (h, W, b):
        x.requires_grad_(True)
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    loss = fusedloss.linear_cross_entropy(h, W, t, b, reduction="none")
    (name, a), = spy.calls
    assert name == FWD and a[1] is not None and a[2] is None and a[3] is None and a[4] is None
    assert a[17] == _lib.FL_DTYPE_F32  # loss-only: no accumulator in the workspace
    g = torch.rand(12)
    loss.backward(g)
    (name, a), = spy.calls[1:]
    assert name == BWD and a[0] and a[1] and a[2] and a[10] is not None and a[11] == 1.0


def test_no_grad_is_loss_only_cpu(monkeypatch):
    h, W, b, t = make_inputs((12,), 8, 13, torch.float32)
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    l1 = fusedloss.linear_cross_entropy(h, W, t, b)  # nothing requires grad
    W.requires_grad_(True)
    with torch.no_grad():
        l2 = fusedloss.linear_cross_entropy(h, W, t, b)
    with torch.inference_mode():
        l3 = fusedloss.linear_cross_entropy(h, W, t, b)
    assert len(spy.calls) == 3
    for name, a in spy.calls:
        assert name == FWD and a[1] is None and a[2] is None and a[3] is None and a[4] is None
    assert l1.grad_fn is None and l2.grad_fn is None
    assert torch.equal(l1, l2) and torch.equal(l1, l3)


def test_recompute_false_with_none_reduction_raises():
    h, W, b, t = make_inputs((4,), 8, 13, torch.float32)
    with pytest.raises(ValueError, match="reduction='none' needs recompute"):
        fusedloss.linear_cross_entropy(h.requires_grad_(), W, t, reduction="none", recompute=False)


def test_backward_twice_cpu():
    h, W, b, t = make_inputs((6,), 8, 13, torch.float32)
    x = h.clone().requires_grad_(True)
    loss = fusedloss.linear_cross_entropy(x, W, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()
    # recompute: any number of times
    x.grad = None
    loss = fusedloss.linear_cross_entropy(x, W, t, recompute=True)
    loss.backward(retain_graph=True)
    g1 = x.grad.clone()
    loss.backward()
    assert_close(x.grad, 2 * g1, (1e-7, 1e-6), "twice")


@pytest.mark.parametrize("recompute", [None, True])
def test_double_backward_raises_cpu(recompute):
    h, W, b, t = make_inputs((6,), 8, 13, torch.float32)
    x = h.clone().requires_grad_(True)
    loss = fusedloss.linear_cross_entropy(x, W, t, recompute=recompute)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, x, create_graph=True)


# ---- edge cases ---------------------------------------------------------------------------------
@pytest.mark.parametrize("recompute", [None, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_ignored_cpu(reduction, recompute):
    h, W, b, t = make_inputs((5,), 8, 13, torch.float32)
    t[:] = -100
    xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
    loss = fusedloss.linear_cross_entropy(xs[0], xs[1], t, xs[2], reduction=reduction,
                                          recompute=recompute)
    ref = F.cross_entropy(F.linear(h, W, b), t, reduction=reduction)
    assert torch.equal(torch.isnan(loss), torch.isnan(ref))
    if reduction != "mean":
        assert torch.equal(loss, torch.zeros_like(loss))
    loss.sum().backward() if reduction == "none" else loss.backward()
    for x in xs:
        assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_empty_batch_cpu(reduction):
    h = torch.randn(0, 8, requires_grad=True)
    W = torch.randn(13, 8, requires_grad=True)
    b = torch.randn(13, requires_grad=True)
    t = torch.zeros(0, dtype=torch.int64)
    loss = fusedloss.linear_cross_entropy(h, W, t, b, reduction=reduction)
    ref = F.cross_entropy(F.linear(h, W, b), t, reduction=reduction)
    assert loss.shape == ref.shape and torch.equal(torch.isnan(loss), torch.isnan(ref))
    loss.sum().backward()
    assert h.grad.shape == (0, 8) and torch.equal(W.grad, torch.zeros_like(W))
    assert torch.equal(b.grad, torch.zeros_like(b))
    with torch.no_grad():
        assert fusedloss.linear_cross_entropy(h, W, t, reduction=reduction).shape == ref.shape


def test_strided_inputs_and_int32_targets_cpu():
    h, W, b, t = make_inputs((2, 9), 16, 37, torch.float32)
    wide = torch.randn(37, 40, dtype=torch.float64).float()
    wide[:, :16] = W
    Ws = wide[:, :16].requires_grad_(False)     # row stride 40 > H: passed as it is
    hT = h.transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous (..., H) view
    t32 = t.to(torch.int32).t().contiguous().t()         # non-contiguous int32 targets
    for reduction in REDUCTIONS:
        hl = hT.detach().requires_grad_(True)
        Wl = Ws.detach().requires_grad_(True)
        loss = fusedloss.linear_cross_entropy(hl, Wl, t32, b, reduction=reduction)
        ref = reference(h.double(), W.double(), b.double(), t, torch.float32, reduction=reduction)
        assert_close(loss, ref, LOSS_TOL[torch.float32], "strided loss")
        loss.sum().backward()
        r = [x.double().requires_grad_(True) for x in (h, W)]
        reference(r[0], r[1], b.double(), t, torch.float32, reduction=reduction).sum().backward()
        assert_close(hl.grad, r[0].grad, GRAD_TOL[torch.float32], "strided dh")
        assert_close(Wl.grad, r[1].grad, GRAD_TOL[torch.float32], "strided dW")


def test_weight_row_stride_reaches_c_call_cpu(monkeypatch):
    h, W, b, t = make_inputs((4,), 16, 9, torch.float32)
    wide = torch.zeros(9, 24)
    wide[:, :16] = W
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    loss = fusedloss.linear_cross_entropy(h, wide[:, :16], t)
    (name, a), = spy.calls
    assert a[7] == wide.data_ptr() and a[8] == 24  # no copy: ld_weight = 24
    assert torch.allclose(loss, fusedloss.linear_cross_entropy(h, W, t))


@pytest.mark.parametrize("bad", [13, 100, -1, -101])
def test_out_of_range_target_cpu(bad):
    h, W, b, t = make_inputs((6,), 8, 13, torch.float32, frac_ignored=0)
    t[2] = bad
    for rg in (False, True):
        with pytest.raises(TargetOutOfRangeError, match="fl_linear_cross_entropy"):
            fusedloss.linear_cross_entropy(h.clone().requires_grad_(rg), W, t)
    with pytest.raises(IndexError):
        fusedloss.linear_cross_entropy(h, W, t, reduction="none")


def test_library_validates_class_weight_values_cpu():
    h, W, b, t = make_inputs((6,), 8, 13, torch.float32)
    cw = torch.ones(13)
    cw[3] = -1.0
    with pytest.raises(fusedloss.FusedLossError, match="fl_linear_cross_entropy_forward_cpu"):
        fusedloss.linear_cross_entropy(h, W, t, class_weight=cw)


def test_cuda_layout_rules_on_host_tensors():
    """ops._lce_cuda_layout (the CUDA path's copy/pad decisions), checked on CPU tensors: rows of
    a multiple of 16 bytes and 16-byte aligned bases pass as they are; others are copied or
    zero-padded (which changes no logit)."""
    lay = fusedloss.ops._lce_cuda_layout
    h, W, b, _ = make_inputs((6,), 16, 9, torch.bfloat16)
    h2, W2, b2, Hp = lay(h, W, b, 16)
    assert Hp == 16 and h2 is h and W2 is W and b2 is b
    h, W, b, _ = make_inputs((6,), 13, 9, torch.bfloat16)
    h2, W2, b2, Hp = lay(h, W, b, 13)
    assert Hp == 16 and h2.shape == (6, 16) and W2.shape == (9, 16)
    assert torch.equal(h2[:, :13], h) and not h2[:, 13:].any() and not W2[:, 13:].any()
    _, W4, _, _ = make_inputs((6,), 12, 9, torch.float32)
    assert lay(W4, W4, None, 12)[3] == 12  # fp32: 12 * 4 bytes is a multiple of 16
    assert lay(W4[:, :6], W4[:, :6], None, 6)[3] == 8
    base = torch.zeros(10 * 16 + 1, dtype=torch.bfloat16)
    hv = base[1:].view(10, 16)  # 2 bytes past an aligned address
    h2, _, _, _ = lay(hv, hv, None, 16)
    assert h2 is not hv and h2.data_ptr() % 16 == 0 and torch.equal(h2, hv)
    wide = torch.zeros(9, 20, dtype=torch.bfloat16)
    h2, W2, _, _ = lay(wide[:, :16], wide[:, :16], None, 16)  # row stride 40 bytes
    assert W2.is_contiguous() and torch.equal(W2, wide[:, :16])


# ---- autocast ------------------------------------------------------------------------------------
@pytest.mark.parametrize("recompute", [None, True], ids=["mode1", "recompute"])
def test_autocast_cpu_bf16(monkeypatch, recompute):
    """fp32 parameters under CPU autocast bf16: the C call runs in bf16 (as F.linear would), the
    weight gradient comes back fp32 and accumulated in fp32 (wgrad_dtype F32), the bias gradient
    in the bias's dtype, dhidden in hidden's dtype."""
    h, W, b, t = make_inputs((3, 7), 32, 57, torch.float32)
    xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fusedloss.linear_cross_entropy(xs[0], xs[1], t, xs[2], recompute=recompute,
                                              label_smoothing=0.1)
    loss.backward()
    a = [c for c in spy.calls if "linear" in c[0]][-1][1]
    dt_i = 16 if not recompute else 15
    assert a[dt_i] == _lib.FL_DTYPE_BF16 and a[dt_i + 1] == _lib.FL_DTYPE_F32
    assert loss.dtype == torch.float32
    assert [x.grad.dtype for x in xs] == [torch.float32] * 3
    # reference: the bf16-cast inputs in float64, logits rounded to bf16, dlogits rounded to bf16
    r = [x.to(torch.bfloat16).double().requires_grad_(True) for x in (h, W, b)]
    ref = reference(*r, t, torch.bfloat16, label_smoothing=0.1)
    assert_close(loss, ref, LOSS_TOL[torch.bfloat16], "autocast loss")
    ref.backward()
    # dweight / dbias: fp32 accumulation, no 16-bit rounding of the result: much tighter than bf16
    assert_close(xs[1].grad, r[1].grad, (1e-5, 1e-4), "autocast dW (fp32)")
    assert_close(xs[2].grad, r[2].grad, (1e-5, 1e-4), "autocast db (fp32)")
    assert_close(xs[0].grad, r[0].grad, GRAD_TOL[torch.bfloat16], "autocast dh (bf16, cast up)")
    # the same as torch's unfused ops under the same autocast (their dW is a bf16 GEMM result)
    ys = [x.clone().requires_grad_(True) for x in (h, W, b)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tl = F.cross_entropy(F.linear(*ys).float().reshape(-1, 57), t.reshape(-1), label_smoothing=0.1)
    tl.backward()
    assert_close(loss, tl, SAME_DTYPE_TOL[torch.bfloat16], "vs torch autocast")
    for x, y in zip(xs, ys):
        assert_close(x.grad, y.grad, SAME_DTYPE_TOL[torch.bfloat16], "vs torch autocast grad")


def test_autocast_bf16_weight_fp16_hidden_cpu():
    # a 16-bit parameter of another dtype than the autocast one: gradient formed in fp32, cast back
    h, W, b, t = make_inputs((8,), 16, 21, torch.float16)
    xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fusedloss.linear_cross_entropy(*xs[:2], t, xs[2])
    loss.backward()
    assert [x.grad.dtype for x in xs] == [torch.float16] * 3
    r = [x.to(torch.bfloat16).double().requires_grad_(True) for x in (h, W, b)]
    ref = reference(*r, t, torch.bfloat16)
    ref.backward()
    assert_close(loss, ref, LOSS_TOL[torch.bfloat16], "loss")
    for x, y in zip(xs, r):
        assert_close(x.grad, y.grad, GRAD_TOL[torch.bfloat16], "grad")


def test_dtype_mismatch_without_autocast_raises():
    h, W, b, t = make_inputs((4,), 8, 13, torch.float32)
    with pytest.raises(TypeError, match="weight dtype torch.bfloat16 differs"):
        fusedloss.linear_cross_entropy(h, W.bfloat16(), t)
    with pytest.raises(TypeError, match="bias dtype torch.float16 differs"):
        fusedloss.linear_cross_entropy(h, W, t, b.half())


# ---- nn.Module -----------------------------------------------------------------------------------
def test_module_matches_functional_cpu():
    h, W, b, t = make_inputs((2, 6), 16, 29, torch.float32)
    cw = torch.rand(29) + 0.5
    m = fusedloss.nn.LinearCrossEntropyLoss(ignore_index=-100, reduction="sum", label_smoothing=0.1,
                                            class_weight=cw, z_loss=1e-3, softcap=4.0, chunk_rows=5)
    assert "fused" in repr(m) and "chunk_rows=5" in repr(m) and "class_weight=(29,)" in repr(m)
    assert m.class_weight is cw and "class_weight" in dict(m.named_buffers())
    xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
    ys = [x.clone().requires_grad_(True) for x in (h, W, b)]
    l1 = m(xs[0], xs[1], t, xs[2])
    l2 = fusedloss.linear_cross_entropy(ys[0], ys[1], t, ys[2], reduction="sum", label_smoothing=0.1,
                                        class_weight=cw, z_loss=1e-3, softcap=4.0, chunk_rows=5)
    assert torch.equal(l1, l2)
    l1.backward()
    l2.backward()
    for x, y in zip(xs, ys):
        assert torch.equal(x.grad, y.grad)
    ref = reference(*[x.double() for x in (h, W, b)], t, torch.float32, reduction="sum",
                    label_smoothing=0.1, class_weight=cw, z_loss=1e-3, softcap=4.0)
    assert_close(l1, ref, LOSS_TOL[torch.float32], "module loss")
    # the lm head of a model, as the unfused pair computes it
    head = torch.nn.Linear(16, 29)
    crit = fusedloss.nn.LinearCrossEntropyLoss()
    assert_close(crit(h, head.weight, t, head.bias),
                 torch.nn.CrossEntropyLoss()(head(h).reshape(-1, 29), t.reshape(-1)),
                 (1e-6, 1e-5), "module vs torch")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(reduction="avg"), ValueError, "reduction"),
    (dict(ignore_index=1.5), TypeError, "ignore_index"),
    (dict(label_smoothing=1.5), ValueError, "label_smoothing"),
    (dict(z_loss=-1.0), ValueError, "z_loss"),
    (dict(softcap=-2.0), ValueError, "softcap"),
    (dict(logit_scale=0.0), ValueError, "logit_scale"),
    (dict(class_weight=[1.0, 2.0]), TypeError, "class_weight"),
    (dict(class_weight=torch.ones(2, 2)), ValueError, "class_weight"),
    (dict(chunk_rows=0), ValueError, "chunk_rows"),
    (dict(byte_budget=-5), ValueError, "byte_budget"),
    (dict(wgrad_accum="bf16"), ValueError, "wgrad_accum"),
    (dict(recompute="yes"), TypeError, "recompute"),
    (dict(reduction="none", recompute=False), ValueError, "recompute"),
])
def test_module_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match="LinearCrossEntropyLoss: .*" + match):
        fusedloss.nn.LinearCrossEntropyLoss(**kwargs)


# ---- bad inputs ----------------------------------------------------------------------------------
def _bad_calls():
    h, W, b, t = make_inputs((4,), 8, 13, torch.float32)
    lce = fusedloss.linear_cross_entropy
    return [
        (lambda: lce(h.numpy(), W, t), TypeError, "hidden must be a Tensor"),
        (lambda: lce(h, W, t.tolist()), TypeError, "target must be a Tensor"),
        (lambda: lce(h, W, t, b.tolist()), TypeError, "bias must be a Tensor"),
        (lambda: lce(h.double(), W.double(), t), TypeError, "hidden dtype torch.float64"),
        (lambda: lce(h.long(), W, t), TypeError, "hidden dtype torch.int64"),
        (lambda: lce(h[0, 0], W, t), ValueError, "at least 1 dimension"),
        (lambda: lce(h, W[:, :5], t), ValueError, r"weight must have shape \(V, 8\)"),
        (lambda: lce(h, W[0], t), ValueError, r"weight must have shape \(V, 8\)"),
        (lambda: lce(h, W, t, b[:5]), ValueError, r"bias must have shape \(13,\)"),
        (lambda: lce(h, W, t.float()), TypeError, "target dtype torch.float32"),
        (lambda: lce(h, W, t[:3]), ValueError, r"target must have shape \(4,\)"),
        (lambda: lce(h, W, t, reduction="avg"), ValueError, "reduction must be"),
        (lambda: lce(h, W, t, ignore_index=None), TypeError, "ignore_index must be an int"),
        (lambda: lce(h, W, t, label_smoothing=-0.1), ValueError, "label_smoothing"),
        (lambda: lce(h, W, t, z_loss=float("inf")), ValueError, "z_loss"),
        (lambda: lce(h, W, t, softcap=float("nan")), ValueError, "softcap"),
        (lambda: lce(h, W, t, logit_scale=0), ValueError, "logit_scale"),
        (lambda: lce(h, W, t, class_weight=torch.ones(12)), ValueError, r"class_weight must be"),
        (lambda: lce(h, W, t, class_weight=torch.ones(13, dtype=torch.int64)), ValueError, "class_weight"),
        (lambda: lce(h, W, t, chunk_rows=0), ValueError, "chunk_rows"),
        (lambda: lce(h, W, t, chunk_rows=True), ValueError, "chunk_rows"),
        (lambda: lce(h, W, t, byte_budget=2.5), ValueError, "byte_budget"),
        (lambda: lce(h, W, t, wgrad_accum=None), ValueError, "wgrad_accum"),
        (lambda: lce(h, W, t, recompute=1), TypeError, "recompute"),
        (lambda: lce(h, W, t.to("meta")), ValueError, "target is on meta"),
        (lambda: lce(h.to("meta"), W.to("meta"), t.to("meta")), ValueError, "only cpu and cuda"),
        (lambda: lce(h, torch.empty(0, 8), t), ValueError, "V >= 1"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_argument_errors(i):
    call, exc, match = _bad_calls()[i]
    with pytest.raises(exc, match="linear_cross_entropy: .*" + match):
        call()


def test_raw_op_checks():
    h, W, b, t = make_inputs((4,), 8, 13, torch.float32)
    ce = (-100, 1, 0.0, 0.0, 0.0, 1.0)
    lce = (0, 1 << 20, 0)
    op = torch.ops.fusedloss.linear_cross_entropy_fused
    tail = (torch.float32, True, True, None, 1.0)
    with pytest.raises(ValueError, match="weight must be torch.float32"):
        op(h, W.half(), b, t, None, *ce, *lce, *tail)
    with pytest.raises(ValueError, match="must be 2-D"):
        op(h[None], W, b, t, None, *ce, *lce, *tail)
    with pytest.raises(TypeError, match="wgrad_dtype"):
        op(h.half(), W.half(), b.half(), t, None, *ce, *lce, torch.bfloat16, True, True, None, 1.0)
    with pytest.raises(ValueError, match="unit column stride"):
        op(h, W.t().contiguous().t(), b, t, None, *ce, *lce, *tail)
    with pytest.raises(ValueError, match="reduction must be"):
        op(h, W, b, t, None, -100, 7, 0.0, 0.0, 0.0, 1.0, *lce, *tail)
    with pytest.raises(ValueError, match="grad_loss must be float32 with 1"):
        op(h, W, b, t, None, *ce, *lce, torch.float32, True, True, torch.ones(4), 1.0)
    with pytest.raises(ValueError, match="lse must be float32"):
        torch.ops.fusedloss.linear_cross_entropy_backward(
            torch.ones(1), h, W, b, t, torch.ones(3), None, *ce, *lce, torch.float32, True, True, 1.0)
    # the library's own checks surface as FusedLossError naming the C function
    with pytest.raises(fusedloss.FusedLossError, match="fl_linear_cross_entropy"):
        op(h, W, b, t, None, -100, 1, 0.0, 0.0, 0.0, float("nan"), *lce, *tail)


def test_opcheck_all_ops():
    from torch.library import opcheck
    h, W, b, t = make_inputs((6,), 16, 37, torch.float32)
    cw = torch.rand(37) + 0.5
    lce = (3, 1 << 20, 0)
    for red in (0, 1, 2):
        ce = (-100, red, 0.1, 1e-3, 5.0, 0.7)
        for rg in (False, True):
            hh, WW, bb = [x.clone().requires_grad_(rg) for x in (h, W, b)]
            fused = torch.ops.fusedloss.linear_cross_entropy_fused.default
            opcheck(fused, (hh, WW, bb, t, cw) + ce + lce + (torch.float32, True, True, None, 1.0))
            opcheck(fused, (hh, WW, None, t, None) + ce + lce + (torch.float32, False, False, None, 1.0))
            gl = torch.rand(6 if red == 0 else 1)
            opcheck(fused, (hh, WW, bb, t, None) + ce + lce + (torch.float32, True, False, gl, 0.5))
            opcheck(torch.ops.fusedloss.linear_cross_entropy_forward.default, (hh, WW, bb, t, cw) + ce + lce)
            _, lse = torch.ops.fusedloss.linear_cross_entropy_forward(hh, WW, bb, t, cw, *ce, *lce)
            opcheck(torch.ops.fusedloss.linear_cross_entropy_backward.default,
                    (gl, hh, WW, bb, t, lse, cw) + ce + lce + (torch.float32, True, True, 0.5))
    hb, Wb, bb = h.bfloat16(), W.bfloat16(), b.bfloat16()
    opcheck(torch.ops.fusedloss.linear_cross_entropy_fused.default,
            (hb, Wb, bb, t, None, -100, 1, 0.0, 0.0, 0.0, 1.0) + lce + (torch.float32, True, True, None, 1.0))


def test_raw_ops_agree_cpu():
    """mode 1 with an upstream gradient = mode 2 backward from the saved lse; gradients of the
    fused op with grad_loss = the backward op's."""
    h, W, b, t = make_inputs((11,), 16, 37, torch.float32)
    lce = (4, 1 << 20, 0)
    for red in (0, 1, 2):
        ce = (-100, red, 0.1, 1e-3, 0.0, 1.0)
        gl = torch.rand(11 if red == 0 else 1) + 0.5
        loss, lse, dh, dw, db = torch.ops.fusedloss.linear_cross_entropy_fused(
            h, W, b, t, None, *ce, *lce, torch.float32, True, True, gl, 0.5)
        l2, lse2 = torch.ops.fusedloss.linear_cross_entropy_forward(h, W, b, t, None, *ce, *lce)
        dh2, dw2, db2 = torch.ops.fusedloss.linear_cross_entropy_backward(
            gl, h, W, b, t, lse2, None, *ce, *lce, torch.float32, True, True, 0.5)
        assert torch.equal(loss, l2) and torch.equal(lse, lse2)
        for u, v in ((dh, dh2), (dw, dw2), (db, db2)):
            assert_close(u, v, (1e-7, 1e-6), f"fused vs backward red={red}")
        _, _, _, dwe, dbe = torch.ops.fusedloss.linear_cross_entropy_fused(
            h, W, b, t, None, *ce, *lce, torch.float32, False, False, gl, 0.5)
        assert dwe.shape == (0,) and dbe.shape == (0,)


# ---- torch.compile -------------------------------------------------------------------------------
def _compile_check(device, backend, dynamic=False, autocast=False, dtype=torch.float32):
    torch._dynamo.reset()
    cw = (torch.rand(37) + 0.5).to(device)

    def fn(h, W, b, t):
        return fusedloss.linear_cross_entropy(h, W, t, b, label_smoothing=0.05, z_loss=1e-3,
                                              class_weight=cw, chunk_rows=4)

    def fn_none(h, W, b, t):
        return (fusedloss.linear_cross_entropy(h, W, t, b, reduction="none", softcap=3.0) * 0.3).sum()

    def fn_recompute(h, W, b, t):
        return fusedloss.linear_cross_entropy(h, W, t, b, reduction="sum", recompute=True) / 7

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(16, 16, device=device, dtype=dtype)
            self.head = torch.nn.Linear(16, 37, device=device, dtype=dtype)
            self.loss = fusedloss.nn.LinearCrossEntropyLoss(label_smoothing=0.1)

        def forward(self, x, t):
            return self.loss(torch.tanh(self.body(x)), self.head.weight, t, self.head.bias)

    h, W, b, t = make_inputs((2, 9), 16, 37, dtype, device)
    ac = torch.autocast(device, dtype=torch.bfloat16, enabled=autocast)
    tol = (1e-6, 1e-5) if not autocast and dtype == torch.float32 else (1e-2, 2e-2)
    for f in (fn, fn_none, fn_recompute):
        fc = torch.compile(f, fullgraph=True, backend=backend, dynamic=dynamic)
        a1 = [x.clone().requires_grad_(True) for x in (h, W, b)]
        a2 = [x.clone().requires_grad_(True) for x in (h, W, b)]
        with ac:
            l1, l2 = f(*a1, t), fc(*a2, t)
        (l1 * 2).backward()
        (l2 * 2).backward()
        assert_close(l2, l1, tol, f"compiled loss {f.__name__}")
        for u, v in zip(a1, a2):
            assert v.grad.dtype == u.grad.dtype
            assert_close(v.grad, u.grad, tol, f"compiled grad {f.__name__}")
    m = Model()
    mc = torch.compile(m, fullgraph=True, backend=backend, dynamic=dynamic)
    x = torch.randn(2, 9, 16, device=device, dtype=dtype)
    with ac:
        l1 = m(x, t)
    l1.backward()
    g1 = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    with ac:
        l2 = mc(x, t)
    l2.backward()
    assert_close(l2, l1, tol, "compiled module loss")
    for u, p in zip(g1, m.parameters()):
        assert_close(p.grad, u, tol, "compiled module grad")


def test_compile_fullgraph_aot_eager_cpu():
    _compile_check("cpu", "aot_eager")


def test_compile_fullgraph_dynamic_and_autocast_cpu():
    _compile_check("cpu", "aot_eager", dynamic=True)
    _compile_check("cpu", "aot_eager", autocast=True)


def test_compile_fullgraph_loss_only_cpu():
    torch._dynamo.reset()
    h, W, b, t = make_inputs((3, 4), 8, 13, torch.float32)
    f = torch.compile(lambda h, W, b, t: fusedloss.linear_cross_entropy(h, W, t, b, reduction="none"),
                      fullgraph=True, backend="aot_eager")
    for ac in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ac):
            got, ref = f(h, W, b, t), fusedloss.linear_cross_entropy(h, W, t, b, reduction="none")
        assert got.shape == t.shape and got.grad_fn is None
        assert torch.equal(got, ref)


def test_compile_fullgraph_inductor_cpu():
    # inductor's CPU codegen takes a few seconds per graph: one pass over the three functions
    _compile_check("cpu", "inductor")


# ---- CUDA ----------------------------------------------------------------------------------------
@pytest.fixture
def highest_precision():
    """fp32 comparisons against float64 run without TF32 (the library follows torch's setting)."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


CUDA_CASES = [((2, 5), 16, 37), ((64,), 64, 1000), ((3, 100), 128, 50257), ((512,), 256, 32000),
              ((7,), 13, 101), ((1,), 8, 1)]


@needs_cuda
@pytest.mark.parametrize("recompute", [None, True], ids=["mode1", "recompute"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CUDA_CASES, ids=str)
def test_grid_cuda(case, dtype, reduction, recompute, highest_precision):
    lead, H, V = case
    check_case(lead, H, V, dtype, "cuda", reduction=reduction, recompute=recompute)


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", OPTIONS, ids=_id)
def test_options_cuda(opts, dtype, highest_precision):
    for recompute in (None, True):
        check_case((4, 33), 64, 3001, dtype, "cuda", recompute=recompute, **opts)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_chunking_and_accumulation_cuda(dtype, highest_precision):
    kws = [dict(chunk_rows=64), dict(chunk_rows=100), dict(byte_budget=1 << 20),
           dict(wgrad_accum="fp32", chunk_rows=64), dict(wgrad_accum="lean", chunk_rows=64)]
    for kw in kws:
        tol = CUDA_GRAD_TOL[dtype] if kw.get("wgrad_accum") != "lean" else (1e-2, 6e-2)
        check_case((1000,), 64, 4000, dtype, "cuda", grad_tol=tol, **kw)


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_matches_cpu_backend(dtype, highest_precision):
    h, W, b, t = make_inputs((3, 50), 96, 1201, dtype)
    out = {}
    for dev in ("cpu", "cuda"):
        xs = [x.detach().to(dev).requires_grad_(True) for x in (h, W, b)]
        loss = fusedloss.linear_cross_entropy(xs[0], xs[1], t.to(dev), xs[2], label_smoothing=0.1,
                                              z_loss=1e-3)
        loss.backward()
        out[dev] = [loss] + [x.grad for x in xs]
    for u, v, n in zip(out["cuda"], out["cpu"], ("loss", "dh", "dw", "db")):
        assert_close(u, v, CUDA_GRAD_TOL[dtype], f"cuda vs cpu {n}")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_odd_layouts_cuda(dtype, highest_precision):
    # H not a multiple of 8 (padded copy), a weight view at an odd offset and row stride
    check_case((40,), 13, 301, dtype, "cuda")
    check_case((40,), 5, 64, dtype, "cuda", recompute=True)
    h, W, b, t = make_inputs((40,), 64, 301, dtype, "cuda")
    big = torch.zeros(302, 72, dtype=dtype, device="cuda")
    big[1:, 1:65] = W
    Wv = big[1:, 1:65]  # address not 16-byte aligned, ld 72
    loss = fusedloss.linear_cross_entropy(h, Wv, t, b)
    assert_close(loss, reference(h.double(), W.double(), b.double(), t, dtype),
                 CUDA_LOSS_TOL[dtype], "odd view loss")


@needs_cuda
def test_tf32_follows_matmul_precision_cuda(monkeypatch):
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    h, W, b, t = make_inputs((64,), 64, 512, torch.float32, "cuda")
    old = torch.get_float32_matmul_precision()
    try:
        for prec, want in (("highest", 0), ("high", 1), ("medium", 1)):
            torch.set_float32_matmul_precision(prec)
            fusedloss.linear_cross_entropy(h, W, t, b)
            assert _lib.LCEOptions.from_address(spy.calls[-1][1][21]).allow_tf32 == want, prec
        fusedloss.linear_cross_entropy(h.bfloat16(), W.bfloat16(), t)
        assert _lib.LCEOptions.from_address(spy.calls[-1][1][21]).allow_tf32 == 0  # fp32 only
    finally:
        torch.set_float32_matmul_precision(old)
    assert spy.calls[0][1][0] == fusedloss.ops._lce_contexts[torch.cuda.current_device()][0]


@needs_cuda
@pytest.mark.parametrize("recompute", [None, True], ids=["mode1", "recompute"])
def test_autocast_cuda(recompute, highest_precision):
    h, W, b, t = make_inputs((4, 64), 64, 5000, torch.float32, "cuda")
    for dt in (torch.bfloat16, torch.float16):
        xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
        with torch.autocast("cuda", dtype=dt):
            loss = fusedloss.linear_cross_entropy(xs[0], xs[1], t, xs[2], recompute=recompute)
        loss.backward()
        assert [x.grad.dtype for x in xs] == [torch.float32] * 3
        r = [x.to(dt).double().requires_grad_(True) for x in (h, W, b)]
        ref = reference(*r, t, dt)
        ref.backward()
        assert_close(loss, ref, CUDA_LOSS_TOL[dt], "autocast loss")
        assert_close(xs[1].grad, r[1].grad, (1e-4, 1e-3), "autocast dW fp32")
        assert_close(xs[2].grad, r[2].grad, (1e-4, 1e-3), "autocast db fp32")
        assert_close(xs[0].grad, r[0].grad, CUDA_GRAD_TOL[dt], "autocast dh")


@needs_cuda
def test_non_default_stream_and_device_guard_cuda():
    h, W, b, t = make_inputs((256,), 64, 4099, torch.bfloat16, "cuda")
    ref = reference(h.double(), W.double(), b.double(), t, torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
        loss = fusedloss.linear_cross_entropy(xs[0], xs[1], t, xs[2])
        loss.backward()
    torch.cuda.current_stream().wait_stream(s)
    assert_close(loss, ref, CUDA_LOSS_TOL[torch.bfloat16], "side-stream loss")


@needs_cuda
@pytest.mark.parametrize("recompute", [None, True], ids=["mode1", "recompute"])
def test_cuda_graph_capture_training_step(recompute):
    torch.manual_seed(0)
    N, H, V = 128, 64, 3000
    body = torch.nn.Linear(H, H, device="cuda")
    head = torch.nn.Linear(H, V, device="cuda")
    params = list(body.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    crit = fusedloss.nn.LinearCrossEntropyLoss(label_smoothing=0.1, recompute=recompute)
    static_x = torch.randn(N, H, device="cuda")
    static_t = torch.randint(0, V, (N,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        loss = crit(torch.tanh(body(static_x)), head.weight, static_t, head.bias)
        loss.backward()
        opt.step()
        return loss

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: creates the library context and the error flag
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    ref_body = torch.nn.Linear(H, H, device="cuda")
    ref_head = torch.nn.Linear(H, V, device="cuda")
    ref_body.load_state_dict(body.state_dict())
    ref_head.load_state_dict(head.state_dict())
    ref_opt = torch.optim.SGD(list(ref_body.parameters()) + list(ref_head.parameters()), lr=0.1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = step()
    for i in range(4):
        x = torch.randn(N, H, device="cuda")
        t = torch.randint(0, V, (N,), device="cuda")
        t[i] = -100
        static_x.copy_(x)
        static_t.copy_(t)
        g.replay()
        ref_opt.zero_grad()
        ref = F.cross_entropy(ref_head(torch.tanh(ref_body(x))), t, label_smoothing=0.1)
        ref.backward()
        ref_opt.step()
        torch.cuda.synchronize()
        assert torch.allclose(static_loss, ref, atol=1e-4, rtol=1e-4), (i, static_loss.item(), ref.item())
        assert torch.allclose(head.weight, ref_head.weight, atol=1e-4, rtol=1e-3)
        assert torch.allclose(body.weight, ref_body.weight, atol=1e-4, rtol=1e-3)


@needs_cuda
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_cuda(backend):
    _compile_check("cuda", backend)
    _compile_check("cuda", backend, autocast=True)


@needs_cuda
def test_opcheck_all_ops_cuda():
    from torch.library import opcheck
    h, W, b, t = make_inputs((40,), 64, 1000, torch.bfloat16, "cuda")
    ce = (-100, 1, 0.1, 0.0, 0.0, 1.0)
    lce = (16, 1 << 24, 0)
    opcheck(torch.ops.fusedloss.linear_cross_entropy_fused.default,
            (h, W, b, t, None) + ce + lce + (torch.bfloat16, True, True, None, 1.0))
    opcheck(torch.ops.fusedloss.linear_cross_entropy_forward.default, (h, W, b, t, None) + ce + lce)
    _, lse = torch.ops.fusedloss.linear_cross_entropy_forward(h, W, b, t, None, *ce, *lce)
    opcheck(torch.ops.fusedloss.linear_cross_entropy_backward.default,
            (torch.ones(1, device="cuda"), h, W, b, t, lse, None) + ce + lce + (torch.float32, True, True, 1.0))


@needs_cuda
def test_out_of_range_target_flag_cuda():
    fusedloss.check_errors()
    h, W, b, t = make_inputs((64,), 64, 1000, torch.float32, "cuda", frac_ignored=0)
    t[5] = 1000
    loss = fusedloss.linear_cross_entropy(h, W, t, reduction="none")
    torch.cuda.synchronize()
    assert torch.isnan(loss[5]) and not torch.isnan(loss[4])
    with pytest.raises(TargetOutOfRangeError):
        fusedloss.check_errors()
    fusedloss.check_errors()  # cleared


@needs_cuda
def test_memory_no_logits_cuda():
    """Forward + backward allocate no [N, V] buffer beyond the byte budget: with N*V bf16 logits
    of 256 MB and a 32 MiB budget the peak extra memory stays far below one logits matrix."""
    N, H, V = 4096, 256, 32000
    h, W, b, t = make_inputs((N,), H, V, torch.bfloat16, "cuda", bias=False)
    h.requires_grad_(True)
    W.requires_grad_(True)
    budget = 32 << 20
    fusedloss.linear_cross_entropy(h, W, t, byte_budget=budget).backward()  # warm-up
    h.grad = W.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fusedloss.linear_cross_entropy(h, W, t, byte_budget=budget)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    grads = (N * H + V * H) * 2
    logits = N * V * 2
    assert extra < grads + budget + (24 << 20), (extra, grads, logits)
    assert extra < 0.5 * logits


@needs_cuda
def test_first_call_of_a_shape_is_tuned_cuda(monkeypatch):
    """The first CUDA call of a shape is preceded by one tuning call (fl_lce_context_set_tuning on
    around it, into the same outputs); later calls of that shape make none; FUSEDLOSS_LCE_TUNE=0
    (ops._lce_tune False) makes none; the tuned result is the untuned one within the CUDA
    tolerance, and the CPU backend's."""
    seen = []
    real = _lib.lce_context_set_tuning
    monkeypatch.setattr(_lib, "lce_context_set_tuning", lambda ctx, on: (seen.append(on), real(ctx, on)))
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    h, W, b, t = make_inputs((96,), 64, 1031, torch.bfloat16, "cuda", seed=7)
    monkeypatch.setattr(fusedloss.ops, "_lce_tune", False)
    fusedloss.ops._lce_tuned.clear()
    xs = [x.detach().clone().requires_grad_(True) for x in (h, W, b)]
    untuned = fusedloss.linear_cross_entropy(xs[0], xs[1], t, xs[2])
    untuned.backward()
    lce_calls = lambda: [c[0] for c in spy.calls if "linear_cross_entropy" in c[0]]  # noqa: E731
    assert seen == [] and lce_calls() == ["fl_linear_cross_entropy_forward_cuda"]
    monkeypatch.setattr(fusedloss.ops, "_lce_tune", True)
    outs = []
    for k in range(2):
        ys = [x.detach().clone().requires_grad_(True) for x in (h, W, b)]
        loss = fusedloss.linear_cross_entropy(ys[0], ys[1], t, ys[2])
        loss.backward()
        outs.append([loss] + [y.grad for y in ys])
    assert seen == [True, False]  # one tuning call, for the first of the two
    assert lce_calls() == ["fl_linear_cross_entropy_forward_cuda"] * 4  # untuned, tuning, 2 real
    for u, v in zip(outs[0], outs[1]):
        assert torch.equal(u, v), "two tuned calls differ"
    ref = [untuned] + [x.grad for x in xs]
    for u, v, n in zip(outs[0], ref, ("loss", "dh", "dw", "db")):
        assert_close(u, v, CUDA_GRAD_TOL[torch.bfloat16], f"tuned vs untuned {n}")
