"""Tests of the fusedloss PyTorch package: fusedloss.cross_entropy / nn.CrossEntropyLoss against
torch.nn.functional.cross_entropy evaluated in float64 (loss and .grad), every option, every
input shape, torch.library.opcheck on every op, torch.compile, errors, double backward.
GPU cases (same grid on CUDA, CUDA graphs, autocast, in-place memory, the error flag) skip
without CUDA.

Run (CPU, CI):   make lib && PYTHONPATH=python python -m pytest -q python/tests
Run (H200):      make lib && PYTHONPATH=python python3 -m pytest -q python/tests -k cuda
                 (about 1 minute; a CUDA fault poisons the context, so after one failure run
                 the failing node alone with CUDA_LAUNCH_BLOCKING=1 to see which C call faulted)
The library comes from FUSEDLOSS_LIBRARY, the installed package, or <repo>/build.
"""
import itertools

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from _zoo_util import assert_close  # noqa: E402
from fusedloss import TargetOutOfRangeError  # noqa: E402

# ---- tolerances: |got - ref| <= atol + rtol * |ref|, ref computed in float64 ---------------
# The loss is accumulated in fp32 (CUDA) / double (CPU) from the rounded inputs, and the
# reference uses the same rounded inputs upcast, so the loss tolerance does not depend on the
# input dtype. The gradient is rounded once to the input dtype.
LOSS_TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-5, 1e-5), torch.bfloat16: (1e-5, 1e-5)}
GRAD_TOL = {torch.float32: (1e-7, 1e-5), torch.float16: (1e-7, 1e-3), torch.bfloat16: (1e-7, 8e-3)}
# CUDA accumulates in fp32 over rows up to 128k long: a little looser
CUDA_LOSS_TOL = {torch.float32: (1e-5, 2e-5), torch.float16: (1e-5, 2e-5), torch.bfloat16: (1e-5, 2e-5)}
CUDA_GRAD_TOL = {torch.float32: (1e-7, 1e-4), torch.float16: (1e-7, 2e-3), torch.bfloat16: (1e-7, 1.6e-2)}

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HAS_CUDA = torch.cuda.is_available() and fusedloss.cuda_built()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")


# ---- float64 reference, incl. the extensions (z_loss, softcap, logit_scale) -----------------
def reference(x, t, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
              z_loss=0.0, softcap=None, logit_scale=1.0):
    """F.cross_entropy on float64 logits transformed as the C API says, plus z_loss * lse^2
    (not class-weighted; 'mean' over non-ignored rows)."""
    z = x * logit_scale
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    w = weight.double() if weight is not None else None
    tt = t.double() if t.is_floating_point() else t.long()
    ce = F.cross_entropy(z, tt, w, ignore_index=ignore_index, reduction=reduction,
                         label_smoothing=label_smoothing)
    if not z_loss:
        return ce
    cdim = 1 if z.dim() >= 2 else 0
    lse = torch.logsumexp(z, dim=cdim)
    mask = torch.ones_like(lse) if t.is_floating_point() else (t != ignore_index).double()
    zl = z_loss * lse.square() * mask
    if reduction == "none":
        return ce + zl
    if reduction == "sum":
        return ce + zl.sum()
    return ce + zl.sum() / mask.sum()


def make_inputs(shape, dtype, device, ignore_index=-100, frac_ignored=0.25, seed=0,
                index_dtype=torch.int64, soft=False, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)
    C = shape[1] if len(shape) >= 2 else shape[0]
    if soft:
        t = torch.rand(shape, generator=g, dtype=torch.float64)
        t = (t / t.sum(dim=1 if len(shape) >= 2 else 0, keepdim=True)).float().to(device)
        return x, t
    tshape = shape[:1] + shape[2:] if len(shape) >= 2 else ()
    t = torch.randint(0, C, tshape, generator=g)
    if frac_ignored and t.dim() > 0:
        t[torch.rand(tshape, generator=g) < frac_ignored] = ignore_index
    return x, t.to(index_dtype).to(device)


def upstream(loss, seed=1):
    """A non-trivial upstream gradient (so grad_loss is really used)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5).to(loss.device)


def check_case(shape, dtype, device, *, loss_tol=None, grad_tol=None, soft=False,
               index_dtype=torch.int64, frac_ignored=0.25, inplace_backward=False,
               make_strided=False, **opts):
    loss_tol = loss_tol or (CUDA_LOSS_TOL if device == "cuda" else LOSS_TOL)[dtype]
    grad_tol = grad_tol or (CUDA_GRAD_TOL if device == "cuda" else GRAD_TOL)[dtype]
    x, t = make_inputs(shape, dtype, device, ignore_index=opts.get("ignore_index", -100),
                       frac_ignored=frac_ignored, index_dtype=index_dtype, soft=soft)
    if make_strided:  # rows with a stride > C: a column slice of a wider tensor
        wide = torch.zeros(shape[0], shape[1] + 5, dtype=dtype, device=device)
        wide[:, : shape[1]] = x
        x = wide[:, : shape[1]]
    xr = x.detach().double().requires_grad_(True)
    ref = reference(xr, t, **opts)
    gout = upstream(ref)
    ref.backward(gout)

    leaf = x.detach().clone().requires_grad_(True)
    xin = leaf
    if make_strided:
        xin = leaf  # the leaf itself is contiguous; build the strided view from a non-leaf
        wide2 = torch.zeros(shape[0], shape[1] + 5, dtype=dtype, device=device)
        xin = torch.cat([leaf, wide2[:, shape[1]:]], dim=1)[:, : shape[1]]
    elif inplace_backward:
        xin = leaf * 1  # a non-leaf whose storage may be overwritten
    loss = fusedloss.cross_entropy(xin, t, inplace_backward=inplace_backward, **opts)
    assert loss.dtype == torch.float32
    assert_close(loss, ref, loss_tol, f"loss {shape} {dtype} {opts}")
    loss.backward(gout.float())
    assert leaf.grad.dtype == dtype
    assert_close(leaf.grad, xr.grad, grad_tol, f"grad {shape} {dtype} {opts}")


# ---- the grid ---------------------------------------------------------------------------
SHAPES = [(7,), (1, 1), (3, 1), (8, 11), (9, 41), (16, 50), (3, 7, 5), (2, 5, 3, 4)]
OPTION_GRID = [
    dict(weight=w, ignore_index=ii, label_smoothing=ls, reduction=red)
    for w, ii, ls, red in itertools.product([False, True], [-100, 0], [0.0, 0.1],
                                            ["none", "mean", "sum"])
]


def _materialize(opts, C, device):
    opts = dict(opts)
    if opts.get("weight") is True:
        g = torch.Generator().manual_seed(7)
        opts["weight"] = (torch.rand(C, generator=g) + 0.2).to(device)
    elif opts.get("weight") is False:
        opts["weight"] = None
    return opts


def _opts_id(o):
    """Test id; class weights show as 'classweights' / 'noweights' (usable with pytest -k)."""
    return "-".join(("classweights" if v else "noweights") if k == "weight" else f"{k}={v}"
                    for k, v in o.items())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("opts", OPTION_GRID, ids=_opts_id)
def test_grid_cpu(shape, dtype, opts):
    C = shape[1] if len(shape) >= 2 else shape[0]
    check_case(shape, dtype, "cpu", **_materialize(opts, C, "cpu"))


@pytest.fixture
def via_ops(monkeypatch):
    """Run eager calls through the torch.library custom ops (the path torch.compile traces)
    instead of the direct eager autograd.Function."""
    monkeypatch.setattr(fusedloss.functional, "_FORCE_OPS", True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(7,), (9, 41), (2, 5, 3, 4)], ids=str)
@pytest.mark.parametrize("opts", OPTION_GRID, ids=_opts_id)
def test_grid_cpu_via_ops(shape, dtype, opts, via_ops):
    C = shape[1] if len(shape) >= 2 else shape[0]
    check_case(shape, dtype, "cpu", **_materialize(opts, C, "cpu"))


EXT_GRID = [
    dict(z_loss=z, softcap=c, logit_scale=s, weight=w, label_smoothing=ls, reduction=red)
    for z, c, s, w, ls, red in itertools.product([0.0, 1e-2], [None, 5.0], [1.0, 0.5],
                                                 [False, True], [0.0, 0.1], ["none", "mean", "sum"])
    if z or c or s != 1.0
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(8, 11), (2, 5, 3)], ids=str)
@pytest.mark.parametrize("opts", EXT_GRID, ids=_opts_id)
def test_extensions_cpu(shape, dtype, opts):
    C = shape[1]
    check_case(shape, dtype, "cpu", **_materialize(opts, C, "cpu"))


@pytest.mark.parametrize("shape", [(7,), (8, 11), (9, 41), (2, 5, 3, 4)], ids=str)
@pytest.mark.parametrize("opts", [
    dict(), dict(reduction="none"), dict(reduction="sum"), dict(label_smoothing=0.2),
    dict(weight=True), dict(weight=True, label_smoothing=0.1, reduction="sum"),
    dict(weight=True, label_smoothing=0.1, reduction="none"),
    dict(z_loss=1e-2, softcap=4.0, logit_scale=0.7), dict(z_loss=1e-2, reduction="none"),
], ids=_opts_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_soft_targets_cpu(shape, opts, dtype):
    C = shape[1] if len(shape) >= 2 else shape[0]
    check_case(shape, dtype, "cpu", soft=True, **_materialize(opts, C, "cpu"))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_row_stride_and_int32_targets_cpu(reduction):
    check_case((6, 13), torch.float32, "cpu", make_strided=True, reduction=reduction)
    check_case((6, 13), torch.float32, "cpu", index_dtype=torch.int32, reduction=reduction)


def test_noncontiguous_input_cpu():
    x = torch.randn(13, 6, dtype=torch.float64)
    xt = x.t().float().requires_grad_(True)  # (6, 13) with column stride 6
    t = torch.randint(0, 13, (6,))
    loss = fusedloss.cross_entropy(xt, t)
    xr = x.t().clone().requires_grad_(True)
    ref = F.cross_entropy(xr, t)
    ref.backward()
    loss.backward()
    assert_close(loss, ref, LOSS_TOL[torch.float32], "loss")
    assert_close(xt.grad, xr.grad, GRAD_TOL[torch.float32], "grad")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_cpu(reduction):
    x = torch.randn(4, 9, requires_grad=True)
    t = torch.full((4,), -100)
    loss = fusedloss.cross_entropy(x, t, reduction=reduction)
    ref = F.cross_entropy(x.detach(), t, reduction=reduction)
    if reduction == "mean":
        assert torch.isnan(loss) and torch.isnan(ref)
        loss.backward()
    else:
        assert_close(loss, ref, LOSS_TOL[torch.float32], "loss")
        loss.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_empty_batch_cpu():
    x = torch.randn(0, 5, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long)
    assert torch.isnan(fusedloss.cross_entropy(x, t))
    assert fusedloss.cross_entropy(x, t, reduction="sum").item() == 0.0
    out = fusedloss.cross_entropy(x, t, reduction="none")
    assert out.shape == (0,)
    fusedloss.cross_entropy(x, t, reduction="sum").backward()
    assert x.grad.shape == (0, 5)


def test_return_lse_cpu():
    x, t = make_inputs((8, 11), torch.float32, "cpu")
    loss, lse = fusedloss.cross_entropy(x, t, reduction="none", return_lse=True, softcap=3.0)
    z = 3.0 * torch.tanh(x.double() / 3.0)
    ref = torch.where(t != -100, torch.logsumexp(z, 1), torch.zeros((), dtype=torch.float64))
    assert lse.dtype == torch.float32 and lse.shape == (8,)
    assert_close(lse, ref, (1e-5, 1e-6), "lse")
    x3, t3 = make_inputs((2, 5, 3), torch.float32, "cpu")
    _, lse3 = fusedloss.cross_entropy(x3, t3, return_lse=True)
    assert lse3.shape == (2, 3)


# ---- in place ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", [dict(), dict(reduction="none"), dict(reduction="sum", weight=True),
                                  dict(label_smoothing=0.1, z_loss=1e-3, softcap=6.0)],
                         ids=_opts_id)
def test_inplace_backward_cpu(dtype, opts):
    # fp16/bf16 gradients are rounded twice on this path (kernel, then the multiply)
    tol = (GRAD_TOL[dtype][0], 2 * GRAD_TOL[dtype][1])
    check_case((8, 11), dtype, "cpu", inplace_backward=True, grad_tol=tol,
               **_materialize(opts, 11, "cpu"))


def test_inplace_backward_overwrites_logits_cpu():
    x = torch.randn(6, 10, requires_grad=True)
    t = torch.randint(0, 10, (6,))
    h = x * 2  # non-leaf: its storage receives the gradient
    loss = fusedloss.cross_entropy(h, t, inplace_backward=True)
    loss.backward()
    ref_x = x.detach().clone().requires_grad_(True)
    F.cross_entropy(ref_x * 2, t).backward()
    assert_close(x.grad, ref_x.grad, (1e-7, 1e-5), "grad")
    # h now holds d loss / d h (documented: the logits are destroyed)
    hh = (x.detach() * 2).requires_grad_(True)
    F.cross_entropy(hh, t).backward()
    assert_close(h.detach(), hh.grad, (1e-7, 1e-5), "logits storage")


def test_inplace_backward_is_detected_when_logits_are_saved_cpu():
    # tanh saves its output for backward; overwriting it must not give a silent wrong gradient
    x = torch.randn(4, 9, requires_grad=True)
    y = torch.tanh(x)
    loss = fusedloss.cross_entropy(y, torch.randint(0, 9, (4,)), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_inplace_backward_twice_raises_cpu():
    x = torch.randn(4, 9, requires_grad=True)
    loss = fusedloss.cross_entropy(x * 1, torch.randint(0, 9, (4,)), inplace_backward=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()


def test_no_grad_and_inference_mode_cpu():
    x, t = make_inputs((8, 11), torch.float32, "cpu")
    ref = F.cross_entropy(x.double(), t)
    with torch.no_grad():
        assert_close(fusedloss.cross_entropy(x.requires_grad_(True), t, inplace_backward=True),
                     ref, LOSS_TOL[torch.float32], "no_grad")
    with torch.inference_mode():
        assert_close(fusedloss.cross_entropy(x, t), ref, LOSS_TOL[torch.float32], "inference_mode")


# ---- double backward --------------------------------------------------------------------
@pytest.mark.parametrize("path", ["eager", "ops"])
@pytest.mark.parametrize("inplace", [False, True])
def test_double_backward_raises_cpu(inplace, path, monkeypatch):
    monkeypatch.setattr(fusedloss.functional, "_FORCE_OPS", path == "ops")
    x = torch.randn(4, 9, requires_grad=True)
    loss = fusedloss.cross_entropy(x * 1, torch.randint(0, 9, (4,)), inplace_backward=inplace)
    with pytest.raises(RuntimeError, match="double backward"):
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        g.square().sum().backward()


# ---- nn.Module ----------------------------------------------------------------------------
def test_module_matches_torch_cpu():
    w = torch.rand(11) + 0.5
    for kwargs in [dict(), dict(weight=w, label_smoothing=0.1, reduction="sum"),
                   dict(ignore_index=3, reduction="none")]:
        ours = fusedloss.nn.CrossEntropyLoss(**kwargs)
        theirs = torch.nn.CrossEntropyLoss(**kwargs).double()
        x, t = make_inputs((8, 11), torch.float32, "cpu", ignore_index=kwargs.get("ignore_index", -100))
        x1 = x.clone().requires_grad_(True)
        x2 = x.double().requires_grad_(True)
        a, b = ours(x1, t), theirs(x2, t)
        assert_close(a, b, LOSS_TOL[torch.float32], f"module {kwargs}")
        a.sum().backward()
        b.sum().backward()
        assert_close(x1.grad, x2.grad, GRAD_TOL[torch.float32], f"module grad {kwargs}")
    r = repr(fusedloss.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1, softcap=30.0))
    assert "fused" in r and "label_smoothing=0.1" in r and "softcap=30.0" in r
    m = fusedloss.nn.CrossEntropyLoss(weight=w)
    assert "weight" in dict(m.named_buffers())


def test_module_legacy_size_average_cpu():
    with pytest.warns(UserWarning):
        m = fusedloss.nn.CrossEntropyLoss(size_average=False)
    assert m.reduction == "sum"


@pytest.mark.parametrize("kwargs,match,exc", [
    (dict(reduction="avg"), "reduction", ValueError),
    (dict(label_smoothing=1.5), "label_smoothing", ValueError),
    (dict(ignore_index=1.5), "ignore_index", TypeError),
    (dict(z_loss=-1.0), "z_loss", ValueError),
    (dict(softcap=0.0), "softcap", ValueError),
    (dict(logit_scale=0.0), "logit_scale", ValueError),
    (dict(weight=[1.0, 2.0]), "weight", TypeError),
    (dict(weight=torch.ones(2, 2)), "weight", ValueError),
])
def test_module_constructor_errors(kwargs, match, exc):
    with pytest.raises(exc, match=match):
        fusedloss.nn.CrossEntropyLoss(**kwargs)


# ---- errors that name the argument ------------------------------------------------------
def _bad_calls():
    x = torch.randn(4, 5)
    t = torch.randint(0, 5, (4,))
    return [
        (lambda: fusedloss.cross_entropy(x.double(), t), TypeError, "input"),
        (lambda: fusedloss.cross_entropy(x.int(), t), TypeError, "input"),
        (lambda: fusedloss.cross_entropy([1.0], t), TypeError, "input"),
        (lambda: fusedloss.cross_entropy(x, t.short()), TypeError, "target"),
        (lambda: fusedloss.cross_entropy(x, t[:3]), ValueError, "target"),
        (lambda: fusedloss.cross_entropy(x, torch.rand(4, 6)), ValueError, "target"),
        (lambda: fusedloss.cross_entropy(x, t.to("meta")), ValueError, "target"),
        (lambda: fusedloss.cross_entropy(torch.randn(()), t), ValueError, "input"),
        (lambda: fusedloss.cross_entropy(x, t, weight=torch.ones(4)), ValueError, "weight"),
        (lambda: fusedloss.cross_entropy(x, t, weight=torch.ones(5, dtype=torch.long)), TypeError, "weight"),
        (lambda: fusedloss.cross_entropy(x, t, weight=torch.ones(5, device="meta")), ValueError, "weight"),
        (lambda: fusedloss.cross_entropy(x, t, reduction="avg"), ValueError, "reduction"),
        (lambda: fusedloss.cross_entropy(x, t, ignore_index=None), TypeError, "ignore_index"),
        (lambda: fusedloss.cross_entropy(x, t, label_smoothing=-0.1), ValueError, "label_smoothing"),
        (lambda: fusedloss.cross_entropy(x, t, z_loss=float("nan")), ValueError, "z_loss"),
        (lambda: fusedloss.cross_entropy(x, t, softcap=-1.0), ValueError, "softcap"),
        (lambda: fusedloss.cross_entropy(x, t, logit_scale=float("inf")), ValueError, "logit_scale"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_argument_errors(i):
    fn, exc, name = _bad_calls()[i]
    with pytest.raises(exc, match=name):
        fn()


@pytest.mark.parametrize("bad", [5, 7, -1, -101])
def test_out_of_range_target_cpu(bad):
    x = torch.randn(4, 5, requires_grad=True)
    t = torch.tensor([0, 1, bad, 2])
    with pytest.raises(TargetOutOfRangeError, match="target"):
        fusedloss.cross_entropy(x, t)
    with pytest.raises(IndexError):  # what F.cross_entropy raises, too
        fusedloss.cross_entropy(x, t, reduction="none")


def test_negative_weight_is_a_library_error_cpu():
    with pytest.raises(fusedloss.FusedLossError, match="weight"):
        fusedloss.cross_entropy(torch.randn(4, 5), torch.randint(0, 5, (4,)),
                                weight=torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0]))


def test_raw_op_checks():
    x = torch.randn(4, 5)
    t = torch.randint(0, 5, (4,))
    with pytest.raises(ValueError, match="logits must be 2-D"):
        torch.ops.fusedloss.cross_entropy_forward(x[0], t, None, -100, 1, 0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="unit column stride"):
        torch.ops.fusedloss.cross_entropy_forward(x.t(), torch.zeros(5, dtype=torch.long), None,
                                                  -100, 1, 0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="grad_loss"):
        _, lse = torch.ops.fusedloss.cross_entropy_forward(x, t, None, -100, 0, 0.0, 0.0, 0.0, 1.0)
        torch.ops.fusedloss.cross_entropy_backward(torch.ones(1), x, t, lse, None, -100, 0, 0.0,
                                                   0.0, 0.0, 1.0, 1.0)


# ---- the raw ops: opcheck and direct use -----------------------------------------------------
def _op_samples(device="cpu"):
    samples = []
    for dtype, red, (N, V), w, strided in [
        (torch.float32, 1, (8, 11), False, False), (torch.float32, 0, (5, 7), True, False),
        (torch.bfloat16, 2, (6, 9), False, True), (torch.float16, 1, (4, 16), True, False),
    ]:
        x, t = make_inputs((N, V), dtype, device)
        if strided:
            x = torch.cat([x, x[:, :3]], 1)[:, :V]
        weight = (torch.rand(V) + 0.5).to(device) if w else None
        samples.append((x, t, weight, red))
    return samples


def test_opcheck_all_ops():
    from torch.library import opcheck
    for x, t, weight, red in _op_samples():
        args = (-100, red, 0.1, 1e-3, 0.0, 1.0)
        xg = x.detach().clone().requires_grad_(True)
        opcheck(torch.ops.fusedloss.cross_entropy_forward.default, (xg, t, weight) + args)
        opcheck(torch.ops.fusedloss.cross_entropy_forward.default, (x, t, weight) + args)
        loss, lse = torch.ops.fusedloss.cross_entropy_forward(x, t, weight, *args)
        gl = torch.rand(loss.numel(), dtype=torch.float32) + 0.5
        opcheck(torch.ops.fusedloss.cross_entropy_backward.default,
                (gl, x, t, lse, weight) + args + (0.5,))
        opcheck(torch.ops.fusedloss.cross_entropy_fused.default, (x, t, weight) + args + (gl, 0.5))
        opcheck(torch.ops.fusedloss.cross_entropy_fused.default, (x, t, weight) + args + (None, 1.0))
        opcheck(torch.ops.fusedloss.cross_entropy_fused_inplace.default,
                (x.clone(), t, weight) + args + (gl, 0.5))


def test_fused_ops_match_forward_backward_cpu():
    for x, t, weight, red in _op_samples():
        args = (-100, red, 0.1, 1e-3, 2.0, 0.9)
        loss, lse = torch.ops.fusedloss.cross_entropy_forward(x, t, weight, *args)
        gl = torch.rand(loss.numel(), dtype=torch.float32) + 0.5
        d = torch.ops.fusedloss.cross_entropy_backward(gl, x, t, lse, weight, *args, 0.5)
        assert d.stride() == x.stride() or x.shape[0] <= 1
        l2, lse2, d2 = torch.ops.fusedloss.cross_entropy_fused(x, t, weight, *args, gl, 0.5)
        # backward starts from the fp32-rounded lse, fused from its own double lse
        tol = GRAD_TOL[x.dtype]
        assert torch.equal(loss, l2) and torch.equal(lse, lse2)
        assert_close(d, d2, tol, "fused vs backward")
        xi = x.clone()
        l3, lse3 = torch.ops.fusedloss.cross_entropy_fused_inplace(xi, t, weight, *args, gl, 0.5)
        assert torch.equal(loss, l3) and torch.equal(lse, lse3) and torch.equal(d2, xi)


# ---- torch.compile ------------------------------------------------------------------------
def _compile_check(device, backend, dynamic=False, inplace=False):
    torch._dynamo.reset()
    w = (torch.rand(11) + 0.5).to(device)

    def fn(h, W, t):
        logits = h @ W.t()
        return fusedloss.cross_entropy(logits, t, weight=w, label_smoothing=0.05, z_loss=1e-3,
                                       inplace_backward=inplace)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 11, device=device)
            self.loss = fusedloss.nn.CrossEntropyLoss(reduction="sum", softcap=5.0,
                                                      inplace_backward=inplace)

        def forward(self, h, t):
            return self.loss(self.lin(h), t)

    h = torch.randn(16, 6, device=device)
    t = torch.randint(0, 11, (16,), device=device)
    t[3] = -100
    W = torch.randn(11, 6, device=device)
    for f_eager, f_comp, args in [
        (fn, torch.compile(fn, fullgraph=True, backend=backend, dynamic=dynamic), (h, W, t)),
    ]:
        a1 = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
        a2 = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
        l1, l2 = f_eager(*a1), f_comp(*a2)
        l1.backward()
        l2.backward()
        assert torch.allclose(l1, l2, atol=1e-5, rtol=1e-5)
        for u, v in zip(a1, a2):
            if u.grad is not None:
                assert torch.allclose(u.grad, v.grad, atol=1e-6, rtol=1e-4)
    m = Model()
    mc = torch.compile(m, fullgraph=True, backend=backend, dynamic=dynamic)
    l1 = m(h, t)
    l1.backward()
    g1 = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    l2 = mc(h, t)
    l2.backward()
    assert torch.allclose(l1, l2, atol=1e-5, rtol=1e-5)
    for u, p in zip(g1, m.parameters()):
        assert torch.allclose(u, p.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_cpu(backend):
    _compile_check("cpu", backend)


def test_compile_fullgraph_inplace_and_dynamic_cpu():
    _compile_check("cpu", "aot_eager", dynamic=True)
    _compile_check("cpu", "aot_eager", inplace=True)


# ---- autocast: the kernel gets the low-precision logits, no upcast copy ----------------------
class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((str(func), [a.dtype for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def test_autocast_cpu_no_upcast():
    lin = torch.nn.Linear(8, 32)
    h = torch.randn(16, 8)
    t = torch.randint(0, 32, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lin(h)
        assert logits.dtype == torch.bfloat16
        with _OpLog() as log:
            loss = fusedloss.cross_entropy(logits, t)
    assert loss.dtype == torch.float32
    names = [c[0] for c in log.calls]
    assert not any("_to_copy" in n or "aten.to" in n for n in names), names
    fwd = [c for c in log.calls if "fusedloss.cross_entropy_forward" in c[0]]
    assert fwd and fwd[0][1][0] == torch.bfloat16
    ref = F.cross_entropy(logits.double(), t)
    assert_close(loss, ref, LOSS_TOL[torch.bfloat16], "autocast loss")
    loss.backward()
    assert lin.weight.grad is not None


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


def test_autocast_cpu_kernel_gets_bf16_eager(monkeypatch):
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    lin = torch.nn.Linear(8, 32)
    h = torch.randn(16, 8)
    t = torch.randint(0, 32, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = lin(h)
        loss = fusedloss.cross_entropy(logits, t)
    loss.backward()
    names = [c[0] for c in spy.calls]
    assert names == ["fl_cross_entropy_forward_cpu", "fl_cross_entropy_backward_cpu"], names
    assert spy.calls[0][1][7] == fusedloss._lib.FL_DTYPE_BF16  # dtype argument: no upcast
    assert spy.calls[0][1][2] == logits.data_ptr()  # the autocast output itself, not a copy
    assert loss.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32


# ---- performance smoke: the Python path adds no (N, V) temporaries -----------------------------
def test_no_extra_copies_on_fast_path_cpu():
    x = torch.randn(64, 100, requires_grad=True)
    t = torch.randint(0, 100, (64,))
    with _OpLog() as log:
        loss = fusedloss.cross_entropy(x, t)
        loss.backward()
    heavy = [c for c in log.calls if any(k in c[0] for k in ("copy", "clone", "contiguous", "mul"))]
    assert not heavy, heavy


# ---- the eager fast path (functional._eager) and its caches ----------------------------------
def test_fast_path_makes_only_the_c_calls_cpu(monkeypatch):
    x, t = make_inputs((9, 41), torch.float32, "cpu")
    kw = dict(label_smoothing=0.05, reduction="sum")
    ref = fusedloss.cross_entropy(x, t, **kw)  # first call: general path, caches the options
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.cross_entropy(xg, t, **kw)
    loss.backward()
    assert [c[0] for c in spy.calls] == ["fl_cross_entropy_forward_cpu",
                                         "fl_cross_entropy_backward_cpu"]
    assert torch.equal(loss, ref)
    with torch.no_grad():
        nl = fusedloss.cross_entropy(x, t, **kw)
    assert spy.calls[-1][0] == "fl_cross_entropy_forward_cpu"
    assert spy.calls[-1][1][1] is None  # no lse computed when nothing needs it
    assert torch.equal(nl, ref)
    # same numbers as the custom ops (the torch.compile path)
    monkeypatch.setattr(fusedloss.functional, "_FORCE_OPS", True)
    xo = x.clone().requires_grad_(True)
    lo = fusedloss.cross_entropy(xo, t, **kw)
    lo.backward()
    assert torch.equal(lo, loss) and torch.equal(xo.grad, xg.grad)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("inplace", [False, True])
def test_fast_path_return_lse_cpu(grad, inplace):
    x, t = make_inputs((8, 11), torch.float32, "cpu")
    ref = torch.where(t != -100, torch.logsumexp(x.double(), 1), torch.zeros((), dtype=torch.float64))
    for _ in range(2):  # first call: general path; second: fast path
        xin = x.clone().requires_grad_(grad)
        loss, lse = fusedloss.cross_entropy(xin * 1 if grad else xin, t, return_lse=True,
                                            inplace_backward=inplace)
        assert lse.shape == (8,) and lse.dtype == torch.float32 and not lse.requires_grad
        assert_close(lse, ref, (1e-5, 1e-6), "lse")
        assert loss.requires_grad == grad
        if grad:
            loss.backward()
            assert xin.grad is not None


def test_options_cache_keeps_validation():
    x = torch.randn(4, 5)
    t = torch.randint(0, 5, (4,))
    for _ in range(2):
        fusedloss.cross_entropy(x, t, ignore_index=1, label_smoothing=0.1)
    with pytest.raises(TypeError, match="ignore_index"):
        fusedloss.cross_entropy(x, t, ignore_index=True, label_smoothing=0.1)  # True == 1
    with pytest.raises(ValueError, match="target"):
        fusedloss.cross_entropy(x, t[:3], ignore_index=1, label_smoothing=0.1)
    with pytest.raises(TypeError, match="target"):
        fusedloss.cross_entropy(x, t.int().short(), ignore_index=1, label_smoothing=0.1)
    with pytest.raises(ValueError, match="weight"):
        fusedloss.cross_entropy(x, t, torch.ones(4), ignore_index=1, label_smoothing=0.1)
    with pytest.raises(TypeError, match="input"):
        fusedloss.cross_entropy(x.double(), t, ignore_index=1, label_smoothing=0.1)


def test_fast_path_weights_cpu():
    x, t = make_inputs((8, 11), torch.float32, "cpu")
    w = torch.rand(11, dtype=torch.float64) + 0.5
    xr = x.double().requires_grad_(True)
    ref = F.cross_entropy(xr, t, w, label_smoothing=0.1)
    ref.backward()
    for weight in [w.float(), w.float(), w, torch.nn.Parameter(w.float()),
                   torch.nn.Parameter(w.float(), requires_grad=False),
                   torch.stack([w.float(), w.float()], 1)[:, 0]]:  # the last: stride 2
        xg = x.clone().requires_grad_(True)
        loss = fusedloss.cross_entropy(xg, t, weight, label_smoothing=0.1)
        loss.backward()
        assert_close(loss, ref, LOSS_TOL[torch.float32], "weighted loss")
        assert_close(xg.grad, xr.grad, GRAD_TOL[torch.float32], "weighted grad")


def test_fast_path_saved_tensors_are_version_checked_cpu():
    x = torch.randn(6, 10, requires_grad=True)
    t = torch.randint(0, 10, (6,))
    for _ in range(2):
        loss = fusedloss.cross_entropy(x, t)
    t.add_(0)  # an in-place change of the target between forward and backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_fast_path_expanded_upstream_gradient_cpu():
    x, t = make_inputs((9, 41), torch.bfloat16, "cpu")
    xr = x.double().requires_grad_(True)
    F.cross_entropy(xr, t, reduction="none").sum().backward()
    for _ in range(2):
        xg = x.clone().requires_grad_(True)
        fusedloss.cross_entropy(xg, t, reduction="none").sum().backward()  # grad: expanded ones
        assert_close(xg.grad, xr.grad, GRAD_TOL[torch.bfloat16], "grad")
        xg = x.clone().requires_grad_(True)
        (fusedloss.cross_entropy(xg, t, reduction="mean") * 3.0).backward()
        assert_close(xg.grad, 3.0 * xr.grad / (t != -100).sum(), GRAD_TOL[torch.bfloat16], "grad")


def test_fast_path_under_default_device_context_cpu():
    x, t = make_inputs((8, 11), torch.float32, "cpu")
    ref = fusedloss.cross_entropy(x, t)
    with torch.device("meta"):  # new tensors default to meta: the CPU path must not use that
        for _ in range(2):
            xg = x.clone().requires_grad_(True)
            loss = fusedloss.cross_entropy(xg, t)
            assert loss.device.type == "cpu" and torch.equal(loss, ref)
            loss.backward()
            assert xg.grad.device.type == "cpu" and torch.isfinite(xg.grad).all()


def test_fast_path_threads_cpu():
    import threading
    cases = [make_inputs((n, v), torch.float32, "cpu", seed=n) for n, v in
             [(8, 11), (33, 500), (5, 3000), (64, 7)]]
    refs = []
    for x, t in cases:
        xg = x.clone().requires_grad_(True)
        fusedloss.cross_entropy(xg, t, reduction="sum").backward()
        refs.append(xg.grad)
    errors = []

    def work(k):
        try:
            for i in range(40):
                x, t = cases[(k + i) % len(cases)]
                xg = x.clone().requires_grad_(True)
                fusedloss.cross_entropy(xg, t, reduction="sum").backward()
                if not torch.equal(xg.grad, refs[(k + i) % len(cases)]):
                    errors.append((k, i))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


# =============================== GPU ==========================================================
CUDA_SHAPES = [(7,), (3, 1), (8, 11), (9, 41), (64, 8003), (3, 7, 5), (2, 5, 3, 4), (33, 50257)]


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=str)
@pytest.mark.parametrize("opts", OPTION_GRID, ids=_opts_id)
def test_grid_cuda(shape, dtype, opts):
    C = shape[1] if len(shape) >= 2 else shape[0]
    check_case(shape, dtype, "cuda", **_materialize(opts, C, "cuda"))


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(8, 11), (2, 5, 3), (128, 32000)], ids=str)
@pytest.mark.parametrize("opts", EXT_GRID, ids=_opts_id)
def test_extensions_cuda(shape, dtype, opts):
    check_case(shape, dtype, "cuda", **_materialize(opts, shape[1], "cuda"))


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", [dict(), dict(reduction="none"), dict(weight=True, label_smoothing=0.1)],
                         ids=_opts_id)
def test_soft_strided_int32_inplace_cuda(dtype, opts):
    opts = _materialize(opts, 257, "cuda")
    check_case((16, 257), dtype, "cuda", soft=True, **opts)
    check_case((16, 257), dtype, "cuda", make_strided=True, **opts)
    check_case((16, 257), dtype, "cuda", index_dtype=torch.int32, **opts)
    tol = (CUDA_GRAD_TOL[dtype][0], 2 * CUDA_GRAD_TOL[dtype][1])
    check_case((16, 257), dtype, "cuda", inplace_backward=True, grad_tol=tol, **opts)


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_matches_cpu_backend(dtype):
    x, t = make_inputs((64, 5003), dtype, "cpu")
    w = torch.rand(5003) + 0.5
    for red in ["none", "mean", "sum"]:
        kw = dict(weight=w, label_smoothing=0.1, reduction=red, z_loss=1e-3, softcap=20.0)
        xc = x.clone().requires_grad_(True)
        xg = x.cuda().requires_grad_(True)
        lc = fusedloss.cross_entropy(xc, t, **kw)
        kw["weight"] = w.cuda()
        lg = fusedloss.cross_entropy(xg, t.cuda(), **kw)
        assert_close(lg, lc, CUDA_LOSS_TOL[dtype], f"cuda vs cpu loss {red}")
        lc.sum().backward()
        lg.sum().backward()
        assert_close(xg.grad, xc.grad, CUDA_GRAD_TOL[dtype], f"cuda vs cpu grad {red}")


@needs_cuda
def test_all_ignored_and_empty_cuda():
    x = torch.randn(4, 9, device="cuda", requires_grad=True)
    t = torch.full((4,), -100, device="cuda")
    loss = fusedloss.cross_entropy(x, t)
    assert torch.isnan(loss).item()
    loss.backward()
    assert torch.count_nonzero(x.grad).item() == 0
    e = torch.randn(0, 5, device="cuda", requires_grad=True)
    assert fusedloss.cross_entropy(e, torch.zeros(0, dtype=torch.long, device="cuda"),
                                   reduction="sum").item() == 0.0


@needs_cuda
def test_opcheck_all_ops_cuda():
    from torch.library import opcheck
    for x, t, weight, red in _op_samples("cuda"):
        args = (-100, red, 0.1, 1e-3, 0.0, 1.0)
        opcheck(torch.ops.fusedloss.cross_entropy_forward.default,
                (x.detach().clone().requires_grad_(True), t, weight) + args)
        loss, lse = torch.ops.fusedloss.cross_entropy_forward(x, t, weight, *args)
        gl = torch.rand(loss.numel(), dtype=torch.float32, device="cuda") + 0.5
        opcheck(torch.ops.fusedloss.cross_entropy_backward.default, (gl, x, t, lse, weight) + args + (0.5,))
        opcheck(torch.ops.fusedloss.cross_entropy_fused.default, (x, t, weight) + args + (gl, 0.5))
        opcheck(torch.ops.fusedloss.cross_entropy_fused_inplace.default,
                (x.clone(), t, weight) + args + (gl, 0.5))


@needs_cuda
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_cuda(backend):
    _compile_check("cuda", backend)
    _compile_check("cuda", backend, inplace=True)


@needs_cuda
def test_non_default_stream_cuda():
    x, t = make_inputs((256, 4099), torch.bfloat16, "cuda")
    ref = F.cross_entropy(x.double(), t)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        xs = x.clone().requires_grad_(True)
        loss = fusedloss.cross_entropy(xs, t)
        loss.backward()
    torch.cuda.current_stream().wait_stream(s)
    assert_close(loss, ref, CUDA_LOSS_TOL[torch.bfloat16], "side-stream loss")


@needs_cuda
@pytest.mark.parametrize("inplace", [False, True])
def test_cuda_graph_capture_training_step(inplace):
    torch.manual_seed(0)
    N, H, V = 64, 32, 1000
    lin = torch.nn.Linear(H, V, device="cuda")
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    crit = fusedloss.nn.CrossEntropyLoss(label_smoothing=0.1, inplace_backward=inplace)
    static_h = torch.randn(N, H, device="cuda")
    static_t = torch.randint(0, V, (N,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        loss = crit(lin(static_h), static_t)
        loss.backward()
        opt.step()
        return loss

    ref_lin = torch.nn.Linear(H, V, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (also creates the error flag outside capture)
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    ref_lin.load_state_dict(lin.state_dict())
    ref_opt = torch.optim.SGD(ref_lin.parameters(), lr=0.1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = step()
    for i in range(4):
        h = torch.randn(N, H, device="cuda")
        t = torch.randint(0, V, (N,), device="cuda")
        t[i] = -100
        static_h.copy_(h)
        static_t.copy_(t)
        g.replay()
        ref_opt.zero_grad()
        ref = F.cross_entropy(ref_lin(h), t, label_smoothing=0.1)
        ref.backward()
        ref_opt.step()
        torch.cuda.synchronize()
        assert torch.allclose(static_loss, ref, atol=1e-4, rtol=1e-4), (i, static_loss.item(), ref.item())
        assert torch.allclose(lin.weight, ref_lin.weight, atol=1e-4, rtol=1e-3)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_cuda_no_upcast_copy(dtype):
    N, H, V = 4096, 64, 32000
    lin = torch.nn.Linear(H, V, device="cuda")
    h = torch.randn(N, H, device="cuda")
    t = torch.randint(0, V, (N,), device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        logits = lin(h)
        assert logits.dtype == dtype
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = fusedloss.cross_entropy(logits, t)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
    assert loss.dtype == torch.float32
    # an fp32 copy of the logits would be N*V*4 bytes; allow only O(N) buffers
    assert extra < 0.05 * logits.numel() * logits.element_size(), extra
    ref = F.cross_entropy(logits.double(), t)
    assert_close(loss, ref, CUDA_LOSS_TOL[dtype], "autocast loss")
    loss.backward()
    assert lin.weight.grad is not None


def _peak_extra_bytes(inplace, N=4096, V=32000, H=64):
    """Peak memory beyond what exists before the loss, over loss forward + backward, for logits
    from an lm-head matmul (whose backward needs no (N, V) buffer of its own)."""
    torch.manual_seed(0)
    h = torch.randn(N, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    W = torch.randn(V, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, V, (N,), device="cuda")
    # warm-up: cuBLAS allocates its workspace (32 MiB on Hopper) at the first matmul backward
    fusedloss.cross_entropy(h @ W.t(), t, inplace_backward=inplace).backward()
    h.grad = W.grad = None
    logits = h @ W.t()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fusedloss.cross_entropy(logits, t, inplace_backward=inplace)
    loss.backward()
    torch.cuda.synchronize()
    # h.grad, W.grad are O((N + V) * H): the budget below is about (N, V) buffers only
    return torch.cuda.max_memory_allocated() - base, logits.numel() * logits.element_size()


@needs_cuda
def test_inplace_backward_peak_memory_cuda():
    extra, nbytes = _peak_extra_bytes(inplace=True)
    assert extra < 0.1 * nbytes, (extra, nbytes)  # no (N, V) buffer beyond the logits
    extra, nbytes = _peak_extra_bytes(inplace=False)
    assert 0.9 * nbytes < extra < 1.1 * nbytes, (extra, nbytes)  # one: the gradient


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logits_view_at_odd_offset_cuda(dtype):
    # rows 1.. of a (N+1, V) tensor with V odd: the logits' address is not 16-byte aligned
    x, t = make_inputs((17, 1001), dtype, "cuda")
    xr = x[1:].double().requires_grad_(True)
    ref = F.cross_entropy(xr, t[1:])
    ref.backward()
    for _ in range(2):
        base = x.clone().requires_grad_(True)
        loss = fusedloss.cross_entropy(base[1:], t[1:])
        loss.backward()
        assert_close(loss, ref, CUDA_LOSS_TOL[dtype], "loss")
        assert_close(base.grad[1:], xr.grad, CUDA_GRAD_TOL[dtype], "grad")


@needs_cuda
def test_workspace_per_stream_cuda():
    # calls in flight on two streams at once: each stream has its own cached workspace
    cases = [make_inputs((512, 32000), torch.bfloat16, "cuda", seed=s) for s in range(2)]
    refs = [F.cross_entropy(x.double(), t) for x, t in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    out = [[], []]
    for _ in range(5):
        for k, ((x, t), s) in enumerate(zip(cases, streams)):
            with torch.cuda.stream(s):
                out[k].append(fusedloss.cross_entropy(x, t))
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    for k in range(2):
        for loss in out[k]:
            assert_close(loss, refs[k], CUDA_LOSS_TOL[torch.bfloat16], "per-stream loss")


@needs_cuda
def test_out_of_range_target_flag_cuda():
    fusedloss.check_errors()  # start clean
    x = torch.randn(8, 11, device="cuda", requires_grad=True)
    t = torch.randint(0, 11, (8,), device="cuda")
    t[5] = 11
    loss = fusedloss.cross_entropy(x, t)  # no sync, no exception here
    loss.backward()
    with pytest.raises(TargetOutOfRangeError, match="cuda:"):
        fusedloss.check_errors()
    assert torch.isnan(loss).item()
    fusedloss.check_errors()  # the flag was reset
    per_row = fusedloss.cross_entropy(x.detach(), t, reduction="none")
    assert torch.isnan(per_row[5]).item() and torch.isfinite(per_row[:5]).all().item()
    with pytest.raises(TargetOutOfRangeError):
        fusedloss.check_errors()
    # debug mode: raises at the call itself
    fusedloss.set_debug(True)
    try:
        with pytest.raises(TargetOutOfRangeError):
            fusedloss.cross_entropy(x.detach(), t)
        fusedloss.cross_entropy(x.detach(), t.clamp(0, 10))  # fine
    finally:
        fusedloss.set_debug(False)
    # the CUDA context is still usable
    assert torch.isfinite(fusedloss.cross_entropy(x.detach(), t.clamp(0, 10))).item()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("leaf", [True, False])
def test_inplace_backward_reuses_logits_storage_cpu(reduction, leaf):
    """inplace_backward=True: .grad is the logits' own storage (no (N, V) copy: AccumulateGrad
    adopts the returned alias), and the values match the default path for any upstream
    gradient (1 for mean/sum's plain backward: the scale kernel leaves it untouched)."""
    g = torch.Generator().manual_seed(11)
    base = torch.randn(6, 13, generator=g)
    t = torch.randint(0, 13, (6,), generator=g)
    ref_x = base.clone().requires_grad_(True)
    ref = fusedloss.cross_entropy(ref_x, t, reduction=reduction)
    up = torch.rand(ref.shape, generator=g) + 0.5 if reduction == "none" else None
    (ref.backward(up) if up is not None else ref.backward())
    x = base.clone().requires_grad_(True)
    xin = x if leaf else x * 1
    ptr = xin.data_ptr()
    loss = fusedloss.cross_entropy(xin, t, reduction=reduction, inplace_backward=True)
    assert_close(loss, ref.detach(), (1e-6, 1e-6), "loss")
    (loss.backward(up) if up is not None else loss.backward())
    if leaf:
        assert x.grad.data_ptr() == ptr, "the gradient must live in the logits' storage"
    assert_close(x.grad, ref_x.grad, (1e-6, 1e-6), "grad")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_vmap_takes_the_ops(device):
    """torch.vmap's batched tensors look like plain tensors but have no storage: the C fast path
    must not take them (on CUDA it crashed, a helper's review found); the ops' batching fallback
    then runs one call per sample, the same bits as calling per sample."""
    xs, ts = zip(*[make_inputs((6, 37), torch.float32, device, seed=s) for s in range(3)])
    x, t = torch.stack(xs), torch.stack(ts)
    for red in ("mean", "sum", "none"):
        got = torch.vmap(lambda a, b: fusedloss.cross_entropy(a, b, reduction=red))(x, t)
        want = torch.stack([fusedloss.cross_entropy(a, b, reduction=red) for a, b in zip(xs, ts)])
        assert torch.equal(got, want), red
