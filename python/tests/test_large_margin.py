"""Tests of fusedloss.large_margin_cross_entropy / LargeMarginSoftmaxLoss (fusedloss.large_margin, the
op of include/fusedloss.h section 15; CPU and CUDA backends, the PyTorch formulation for float64).

Against an independent float64 reference written as pytorch-loss's LargeMarginSoftmaxV1 forward
(the target pushed down by 1e6, q = softmax * (1 - onehot), log q = log_softmax * (1 - onehot),
mg = (lam / 2) sum (q - 1 / (C - 1)) log q, plus nn.CrossEntropyLoss(reduction='none'), the ignored
rows dropped; ../shared/research/loss-zoo.md's large-margin entry), gradients by autograd, on the
same (rounded) inputs. Three paths, each test parametrized over them where it applies:
  "cpu"       CPU tensors: the C op (fl_large_margin_ce_*_cpu) for fp32 / fp16 / bf16, the PyTorch
              formulation for float64;
  "cpu-torch" CPU tensors with the C op switched off (fusedloss.large_margin._DTYPES emptied): the
              PyTorch formulation for every dtype (the CUDA tests' reference), testable without a
              GPU;
  "cuda"      CUDA tensors: the C op (fl_large_margin_ce_*_cuda, fp32 inside) when the library has
              the CUDA backend, else the PyTorch formulation (skips without a GPU).
Covered: lam 0 (== F.cross_entropy) / 0.3 / 1.7, every reduction, fp32 / fp16 / bf16 / float64,
C = 2 (the regulariser vanishes), 37 and 3000, ignored rows (some, all: mean NaN), ignore_index -1
/ 255 / a class id, [N, C, H, W] / [N, C, d] / [C] inputs, upstream gradients != 1 (reduction none:
a random per-element upstream), gradient accumulation, non-contiguous inputs, the C calls each
path makes, torch.compile(fullgraph=True) (aot_eager on CPU, inductor on CUDA),
torch.library.opcheck on the three ops, the header's closed-form gradient, double backward refused
(C op; the PyTorch formulation supports it), bad arguments (C = 1, lam < 0, reduction, target
shape / dtype), out-of-range targets (TargetOutOfRangeError; NaN under torch.compile on the
PyTorch formulation; the CUDA C op: NaN and the device error flag). CUDA specifics (the C op; skip
without a GPU or a CUDA build of the library): against the CPU C op, against the PyTorch
formulation on the GPU and float64 for every dtype (loss and autograd gradient, every reduction,
both kernels: C <= 1024 and > 1024), the raw C call in place, the error flag, a side stream, CUDA
graph capture and run-to-run determinism, opcheck on CUDA tensors.

Run (CPU): make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_large_margin.py
"""
import ctypes
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from fusedloss import large_margin as lm  # noqa: E402
from _zoo_util import close  # noqa: E402

HAS_GPU = torch.cuda.is_available()  # the "cuda" path runs without a CUDA build (the PyTorch formulation)
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
C_ON_CUDA = HAS_GPU and "cuda" in lm._C_DEVICES  # the library has section 15's CUDA backend
needs_cuda_c = pytest.mark.skipif(not C_ON_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")
PATHS = ["cpu", "cpu-torch", pytest.param("cuda", marks=needs_gpu)]

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
REDS = ["none", "sum", "mean"]
RED_CODE = {"none": 0, "mean": 1, "sum": 2}
LAMS = [0.0, 0.3, 1.7]

# (atol, rtol): |got - ref| <= atol * max|ref| + rtol * |ref| (see _zoo_util.close). The C op computes
# in double, the PyTorch formulation in fp32 (16-bit inputs) or the input's dtype; either rounds once
# to the dtype; an upstream gradient != 1 of a scalar loss on the C op rounds the gradient a second
# time (the in-place scale).
TOL = {
    torch.float32: {"loss": (1e-5, 2e-5), "grad": (3e-5, 1e-4)},
    torch.float16: {"loss": (1e-5, 2e-3), "grad": (3e-4, 2e-3)},
    torch.bfloat16: {"loss": (1e-5, 1.6e-2), "grad": (3e-3, 1.6e-2)},
    torch.float64: {"loss": (1e-12, 1e-10), "grad": (1e-12, 1e-10)},
}


@pytest.fixture(params=PATHS)
def device(request, monkeypatch):
    """The device string of a path; "cpu-torch" switches the C op off (CPU tensors then take the
    PyTorch formulation that CUDA tensors take)."""
    if request.param == "cpu-torch":
        monkeypatch.setattr(lm, "_DTYPES", {})
        return "cpu"
    return request.param


@pytest.fixture
def c_op_path(device):
    """True when fp32 / fp16 / bf16 inputs run the C op on this path."""
    return bool(lm._DTYPES) and device in lm._C_DEVICES


# ---- reference (float64) ---------------------------------------------------------------------------
def ref_lmsv1(x, t, lam=0.3, ignore_index=-100, reduction="mean"):
    """pytorch-loss's LargeMarginSoftmaxV1(lam, reduction, ignore_index).forward, as written there
    (without its .float() cast and gradient hooks: x is float64 here). x [N, C, ...], t [N, ...].
    reduction 'none' returns the loss of the rows not ignored only (its loss[mask == 0])."""
    num_classes = x.size(1)
    coeff = 1.0 / (num_classes - 1.0)
    with torch.no_grad():
        lb = t.clone().detach().long()
        mask = t == ignore_index
        lb[mask] = 0
        idx = torch.zeros_like(x).scatter_(1, lb.unsqueeze(1), 1.0)
    lgts = x - idx * 1.0e6
    q = lgts.softmax(dim=1)
    q = q * (1.0 - idx)
    log_q = lgts.log_softmax(dim=1)
    log_q = log_q * (1.0 - idx)
    mg_loss = ((q - coeff) * log_q) * (lam / 2)
    mg_loss = mg_loss * (1.0 - idx)
    mg_loss = mg_loss.sum(dim=1)
    ce_loss = torch.nn.CrossEntropyLoss(reduction="none", ignore_index=ignore_index)(x, t.long())
    loss = ce_loss + mg_loss
    loss = loss[mask == 0]
    if reduction == "mean":
        loss = loss.mean()
    if reduction == "sum":
        loss = loss.sum()
    return loss


def ref_loss(x, t, lam=0.3, ignore_index=-100, reduction="mean"):
    """The header's semantics from ref_lmsv1: 'none' in the target's shape with ignored positions 0."""
    out = ref_lmsv1(x, t, lam, ignore_index, reduction)
    if reduction != "none":
        return out
    full = torch.zeros(t.shape, dtype=x.dtype)
    full[t != ignore_index] = out
    return full


def make(shape, dtype, device, seed=0, ignored=(1,), scale=2.0, index_dtype=torch.int64, ignore_index=-100):
    """Logits randn * scale (rounded to dtype), targets uniform in [0, C) of shape [N, d1, ...];
    the flat positions in `ignored` set to ignore_index."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    tshape = (shape[0],) + tuple(shape[2:]) if len(shape) > 1 else ()
    t = torch.randint(0, shape[1] if len(shape) > 1 else shape[0], tshape, generator=g)
    tf = t.view(-1)
    for i in ignored:
        if tf.numel():
            tf[i % tf.numel()] = ignore_index
    return x.to(dtype).to(device), t.to(index_dtype).to(device)


def upstream_for(loss, kind, seed=7):
    if kind == "one":
        return torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)
    gen = torch.Generator().manual_seed(seed)
    if loss.dim() == 0:
        return torch.tensor(-1.75, dtype=loss.dtype, device=loss.device)
    return (torch.rand(loss.shape, generator=gen) * 3 - 1).to(loss.device, loss.dtype)  # mixed signs


def run(x, t, upstream="rand", **kw):
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.large_margin_cross_entropy(xg, t, **kw)
    up = upstream_for(loss, upstream)
    loss.backward(up)
    return loss, xg.grad, up


def ref_run(x, t, up, **kw):
    xd = x.detach().double().cpu().requires_grad_(True)
    if xd.dim() == 1:  # one unbatched sample [C], target []
        ref = ref_loss(xd[None], t.cpu()[None], **kw).reshape(())
    else:
        ref = ref_loss(xd, t.cpu(), **kw)
    (g,) = torch.autograd.grad(ref, xd, up.double().cpu())
    return ref.detach(), g


def check(x, t, upstream="rand", **kw):
    dtype = x.dtype
    loss, gx, up = run(x, t, upstream, **kw)
    assert loss.dtype == dtype and gx.dtype == dtype and gx.shape == x.shape
    assert loss.device == x.device and gx.device == x.device
    ref, rg = ref_run(x, t, up, **kw)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dlogits")
    return loss, gx


# ---- the reference itself ---------------------------------------------------------------------------
def test_reference_is_the_formula():
    """ref_lmsv1 (pytorch-loss's code) equals the header's formula written directly."""
    x, t = make((9, 11), torch.float64, "cpu", seed=100, ignored=())
    lam = 0.7
    l = ref_lmsv1(x, t, lam, reduction="none")
    for i in range(9):
        y = int(t[i])
        o = torch.cat([x[i, :y], x[i, y + 1:]])
        q = o.softmax(0)
        want = torch.logsumexp(x[i], 0) - x[i, y] + lam / 2 * ((q - 1 / 10) * q.log()).sum()
        assert abs(l[i].item() - want.item()) < 1e-12


# ---- against the reference ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("N,C", [(13, 37), (5, 3000)])
def test_vs_reference(device, dtype, lam, reduction, N, C):
    x, t = make((N, C), dtype, device, seed=N * C + int(10 * lam), ignored=(2,))
    loss, gx = check(x, t, lam=lam, reduction=reduction)
    assert (gx[2] == 0).all()
    if reduction == "none":
        assert loss.shape == (N,) and loss[2].item() == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lam", [0.3, 1.7])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_upstream_one(device, dtype, lam, reduction):
    """loss.backward() (upstream 1: on the C op the gradient formed in the forward is used as is)."""
    x, t = make((9, 50), dtype, device, seed=3, ignored=())
    check(x, t, upstream="one", lam=lam, reduction=reduction)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
def test_lam_zero_is_cross_entropy(device, dtype, reduction):
    """lam = 0: F.cross_entropy (loss and gradient), ignore_index included."""
    x, t = make((12, 21), dtype, device, seed=4, ignored=(0, 5))
    xa = x.clone().requires_grad_(True)
    xb = x.double().clone().requires_grad_(True)
    la = fusedloss.large_margin_cross_entropy(xa, t, lam=0.0, reduction=reduction)
    lb = F.cross_entropy(xb, t, reduction=reduction)
    up = upstream_for(lb, "rand")
    la.backward(up.to(la.dtype))
    lb.backward(up)
    close(la, lb, TOL[dtype]["loss"], "loss vs F.cross_entropy")
    close(xa.grad, xb.grad, TOL[dtype]["grad"], "dlogits vs F.cross_entropy")


@pytest.mark.parametrize("lam", [0.3, 1.7])
@pytest.mark.parametrize("reduction", REDS)
def test_two_classes(device, lam, reduction):
    """C = 2: one non-target class, q = 1 = 1 / (C - 1), the regulariser vanishes: the cross-entropy."""
    x, t = make((10, 2), torch.float32, device, seed=5, ignored=(3,))
    loss, gx = check(x, t, lam=lam, reduction=reduction)
    xg = x.clone().requires_grad_(True)
    ce = F.cross_entropy(xg, t, reduction=reduction)
    ce.backward(upstream_for(ce, "rand"))
    close(loss, ce, TOL[torch.float32]["loss"], "C = 2 loss vs F.cross_entropy")
    close(gx, xg.grad, TOL[torch.float32]["grad"], "C = 2 dlogits vs F.cross_entropy")


@pytest.mark.parametrize("scale", [0.05, 8.0, 40.0])
def test_logit_ranges(device, scale):
    """Tiny logits (q close to uniform: the regulariser near 0) and large ones (q near one-hot)."""
    x, t = make((16, 64), torch.float32, device, seed=6, ignored=(3,), scale=scale)
    for red in REDS:
        check(x, t, lam=1.0, reduction=red)


@pytest.mark.parametrize("ignore_index", [-1, 255, 3])
def test_ignore_index_values(device, ignore_index):
    """-1, pytorch-loss's 255 and a class id (rows of class 3 are then ignored)."""
    x, t = make((40, 6), torch.float32, device, seed=7, ignored=(0, 7), ignore_index=ignore_index)
    assert (t == ignore_index).sum() >= 2
    for red in REDS:
        loss, gx = check(x, t, ignore_index=ignore_index, reduction=red)
        assert (gx[t == ignore_index] == 0).all()


def test_none_is_pytorch_loss_rows(device):
    """reduction none: pytorch-loss's module returns the kept rows only; here they are in place and
    the ignored ones 0."""
    x, t = make((20, 9), torch.float32, device, seed=8, ignored=(1, 4, 11), ignore_index=255)
    got = fusedloss.large_margin_cross_entropy(x, t, ignore_index=255, reduction="none")
    keep = t != 255
    want = ref_lmsv1(x.double().cpu(), t.cpu(), ignore_index=255, reduction="none")
    close(got[keep], want, TOL[torch.float32]["loss"], "kept rows")
    assert (got[~keep] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", REDS)
def test_all_ignored(device, dtype, reduction):
    x, t = make((5, 8), dtype, device, seed=9, ignored=range(5))
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.large_margin_cross_entropy(xg, t, reduction=reduction)
    if reduction == "mean":
        assert torch.isnan(loss).item()
    elif reduction == "sum":
        assert loss.item() == 0.0
    else:
        assert (loss == 0).all()
    loss.sum().backward()
    assert (xg.grad == 0).all()
    # ignored rows are not read: non-finite logits there change nothing
    xb = x.clone()
    xb[1] = float("nan")
    xb[3] = float("inf")
    tb = t.clone()
    tb[0] = 2
    xg = xb.clone().requires_grad_(True)
    lb = fusedloss.large_margin_cross_entropy(xg, tb, reduction=reduction)
    lb.sum().backward()
    assert torch.isfinite(lb).all() and torch.isfinite(xg.grad).all()
    assert (xg.grad[1:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
def test_nchw_and_other_shapes(device, dtype, reduction):
    """[N, C, H, W] maps (class dimension 1), [N, C, d] and one unbatched sample [C]."""
    for shape, seed, lam in (((2, 5, 3, 4), 10, 0.3), ((3, 7, 6), 11, 1.7)):
        x, t = make(shape, dtype, device, seed=seed, ignored=(1, 5))
        loss, gx = check(x, t, lam=lam, reduction=reduction)
        if reduction == "none":
            assert loss.shape == t.shape
    x, t = make((11,), dtype, device, seed=12, ignored=())
    loss, gx = check(x, t, reduction=reduction)
    assert loss.shape == ()


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_target_dtypes(device, index_dtype):
    x, t = make((7, 9), torch.float32, device, seed=13, ignored=(), index_dtype=torch.int64)
    ref = fusedloss.large_margin_cross_entropy(x, t, reduction="none")
    got = fusedloss.large_margin_cross_entropy(x, t.to(index_dtype), reduction="none")
    assert torch.equal(got, ref)


def test_module(device):
    m = fusedloss.LargeMarginSoftmaxLoss(lam=0.5, ignore_index=255, reduction="sum")
    assert repr(m) == "LargeMarginSoftmaxLoss(lam=0.5, ignore_index=255, reduction='sum')"
    x, t = make((6, 10), torch.float32, device, seed=14, ignored=(2,), ignore_index=255)
    assert torch.equal(m(x, t), fusedloss.large_margin_cross_entropy(x, t, 0.5, 255, "sum"))
    d = fusedloss.LargeMarginSoftmaxLoss()
    assert (d.lam, d.ignore_index, d.reduction) == (0.3, -100, "mean")
    assert isinstance(d, torch.nn.Module)
    assert fusedloss.LargeMarginSoftmaxLoss(lam=1).lam == 1.0  # an int lam is a float


def test_exports():
    assert fusedloss.large_margin_cross_entropy is lm.large_margin_cross_entropy
    assert fusedloss.LargeMarginSoftmaxLoss is lm.LargeMarginSoftmaxLoss
    assert {"large_margin_cross_entropy", "LargeMarginSoftmaxLoss"} <= set(fusedloss.__all__)
    assert "CUDA" in lm.__doc__ and "PyTorch formulation" in lm.__doc__


def test_meta_device():
    x = torch.empty(4, 6, device="meta")
    t = torch.zeros(4, dtype=torch.long, device="meta")
    assert fusedloss.large_margin_cross_entropy(x, t).shape == ()
    assert fusedloss.large_margin_cross_entropy(x, t, reduction="none").shape == (4,)
    # the ops' fake kernels
    assert lm.large_margin_ce_forward(x, t, 0.3, -100, 0).shape == (4,)
    assert lm.large_margin_ce_loss_and_grad(x, t, 0.3, -100, 1)[1].shape == (4, 6)


# ---- accumulation, layouts, C calls -------------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDS)
def test_gradient_accumulation(device, reduction):
    x, t = make((6, 40), torch.float32, device, seed=15, ignored=(0,))
    t2 = make((6, 40), torch.float32, device, seed=16, ignored=(1,))[1]
    xg = x.clone().requires_grad_(True)
    for tt, w, lam in ((t, 1.0, 0.3), (t2, 0.5, 1.7)):
        (fusedloss.large_margin_cross_entropy(xg, tt, lam=lam, reduction=reduction).sum() * w).backward()
    xd = x.double().cpu().requires_grad_(True)
    sum(ref_loss(xd, tt.cpu(), lam=lam, reduction=reduction).sum() * w
        for tt, w, lam in ((t, 1.0, 0.3), (t2, 0.5, 1.7))).backward()
    close(xg.grad, xd.grad, TOL[torch.float32]["grad"], "accumulated dlogits")


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_non_contiguous(device, reduction):
    """A column slice (row stride > C: passed as ld to the C op, no copy), a transposed input,
    channels_last maps, a batch slice of maps: results and gradients equal those of contiguous
    copies."""
    base = make((6, 50), torch.float32, device, seed=17, ignored=())[0]
    t = make((6, 37), torch.float32, device, seed=18, ignored=(4,))[1]
    for view, cols in ((lambda b: b[:, 3:40], slice(3, 40)), (lambda b: b.t().contiguous().t()[:, 5:42], slice(5, 42))):
        a = base.clone().requires_grad_(True)
        xa = view(a)
        assert not xa.is_contiguous()
        la = fusedloss.large_margin_cross_entropy(xa, t, reduction=reduction)
        b = xa.detach().contiguous().requires_grad_(True)
        lb = fusedloss.large_margin_cross_entropy(b, t, reduction=reduction)
        up = torch.rand(la.shape, device=device) + 0.5
        la.backward(up)
        lb.backward(up)
        torch.testing.assert_close(la, lb, rtol=1e-6, atol=0)
        torch.testing.assert_close(a.grad[:, cols], b.grad, rtol=1e-6, atol=1e-9)
        outside = a.grad.clone()
        outside[:, cols] = 0
        assert (outside == 0).all()
    z, u = make((4, 5, 6, 7), torch.float32, device, seed=19, ignored=(3,))
    for strided in (False, True):  # channels_last maps; a batch slice of a map
        a = z.clone().requires_grad_(True)
        za = a[::2] if strided else a.contiguous(memory_format=torch.channels_last)
        uu = u[::2] if strided else u
        assert not za.is_contiguous()
        la = fusedloss.large_margin_cross_entropy(za, uu, reduction=reduction)
        b = za.detach().contiguous().requires_grad_(True)
        lb = fusedloss.large_margin_cross_entropy(b, uu, reduction=reduction)
        up = torch.rand(la.shape, device=device) + 0.5
        la.backward(up)
        lb.backward(up)
        torch.testing.assert_close(la, lb, rtol=1e-6, atol=0)
        torch.testing.assert_close(a.grad[::2] if strided else a.grad, b.grad, rtol=1e-6, atol=1e-9)
        if strided:
            assert (a.grad[1::2] == 0).all()


def test_raw_op_keeps_row_stride():
    base = make((6, 50), torch.float32, "cpu", seed=17, ignored=())[0]
    t = make((6, 37), torch.float32, "cpu", seed=18, ignored=(4,))[1]
    x = base[:, 3:40]
    d = lm.large_margin_ce_fused(x, t, None, 0.3, -100, 1)
    assert d.stride() == x.stride()
    assert torch.equal(d, lm.large_margin_ce_fused(x.contiguous(), t, None, 0.3, -100, 1))


def test_c_calls_per_path(device, c_op_path, monkeypatch):
    """C op: a scalar loss of an input requiring grad makes one fused call in the forward, none in the
    backward (only the in-place scale); reduction none: forward, then fused with the per-row
    gradient; no grad: the forward only. The PyTorch formulation (float64; CUDA; cpu-torch) makes
    no C call."""
    calls = []
    real = lm._sym

    def rec(name):
        calls.append(name)
        return real(name)
    monkeypatch.setattr(lm, "_sym", rec)
    x, t = make((4, 25), torch.float32, device, seed=20)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.large_margin_cross_entropy(xg, t)
    sfx = "cuda" if device == "cuda" else "cpu"
    fused, fwd = f"fl_large_margin_ce_fused_{sfx}", f"fl_large_margin_ce_forward_{sfx}"
    assert calls == ([fused] if c_op_path else [])
    loss.backward()
    assert calls == ([fused] if c_op_path else [])
    calls.clear()
    fusedloss.large_margin_cross_entropy(xg, t, reduction="none").sum().backward()
    assert calls == ([fwd, fused] if c_op_path else [])
    calls.clear()
    fusedloss.large_margin_cross_entropy(x, t, reduction="sum")
    assert calls == ([fwd] if c_op_path else [])
    calls.clear()
    fusedloss.large_margin_cross_entropy(x.double(), t)  # the PyTorch formulation: no C call
    assert calls == []


@pytest.mark.parametrize("reduction", REDS)
def test_empty(device, reduction):
    for x, t in ((torch.randn(0, 11, device=device, requires_grad=True),
                  torch.zeros(0, dtype=torch.long, device=device)),
                 (torch.randn(2, 3, 0, 4, device=device, requires_grad=True),
                  torch.zeros(2, 0, 4, dtype=torch.long, device=device))):
        loss = fusedloss.large_margin_cross_entropy(x, t, reduction=reduction)
        if reduction == "none":
            assert loss.shape == t.shape
        elif reduction == "sum":
            assert loss.item() == 0.0
        else:
            assert torch.isnan(loss).item()
        loss.sum().backward()
        assert x.grad.shape == x.shape


# ---- autograd rules --------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDS)
def test_double_backward_raises(reduction):
    """The C op refuses double backward; the float64 PyTorch formulation supports it."""
    x, t = make((4, 13), torch.float32, "cpu", seed=21)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.large_margin_cross_entropy(xg, t, reduction=reduction).sum()
    with pytest.raises(RuntimeError, match="double backward"):
        (g,) = torch.autograd.grad(loss, xg, create_graph=True)
        g.sum().backward()
    xd = x.double().requires_grad_(True)
    (g,) = torch.autograd.grad(fusedloss.large_margin_cross_entropy(xd, t, reduction=reduction).sum(), xd,
                               create_graph=True)
    g.pow(2).sum().backward()
    assert torch.isfinite(xd.grad).all()


@pytest.mark.parametrize("reduction", REDS)
def test_double_backward_torch_path(device, c_op_path, reduction):
    """The PyTorch formulation (CUDA; cpu-torch) is differentiable twice: its Hessian-vector product
    matches the float64 reference's."""
    if c_op_path:
        pytest.skip("the C op refuses double backward (test_double_backward_raises)")
    x, t = make((4, 13), torch.float32, device, seed=21)
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fusedloss.large_margin_cross_entropy(xg, t, reduction=reduction).sum(), xg,
                               create_graph=True)
    g.pow(2).sum().backward()
    xd = x.double().cpu().requires_grad_(True)
    (gd,) = torch.autograd.grad(ref_loss(xd, t.cpu(), reduction=reduction).sum(), xd, create_graph=True)
    gd.pow(2).sum().backward()
    close(xg.grad, xd.grad, (1e-4, 1e-3), "second-order gradient")


def test_backward_twice():
    x, t = make((5, 9), torch.float32, "cpu", seed=22)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.large_margin_cross_entropy(xg, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()
    xg.grad = None
    loss = fusedloss.large_margin_cross_entropy(xg, t, reduction="none")  # the none path recomputes: twice is fine
    loss.sum().backward(retain_graph=True)
    g1 = xg.grad.clone()
    loss.sum().backward()
    torch.testing.assert_close(xg.grad, 2 * g1)


def test_no_grad(device):
    x, t = make((5, 9), torch.float32, device, seed=23)
    ref = fusedloss.large_margin_cross_entropy(x, t)
    xg = x.clone().requires_grad_(True)
    with torch.no_grad():
        l1 = fusedloss.large_margin_cross_entropy(xg, t)
    l2 = fusedloss.large_margin_cross_entropy(xg, t)
    assert not l1.requires_grad and l2.requires_grad
    assert torch.equal(l1, ref) and torch.equal(l2.detach(), ref)


# ---- torch.compile and opcheck ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph(device, dtype):
    torch._dynamo.reset()
    x, t = make((8, 30), dtype, device, seed=24, ignored=(2,))
    z, u = make((2, 6, 4, 5), dtype, device, seed=25, ignored=(3,))
    crit = fusedloss.LargeMarginSoftmaxLoss(lam=1.7)

    def f(a, b, c, d):
        return (fusedloss.large_margin_cross_entropy(a, b) + crit(a, b)
                + 0.5 * fusedloss.large_margin_cross_entropy(a, b, reduction="none").float().sum()
                + 0.25 * fusedloss.large_margin_cross_entropy(c, d, lam=1.7, reduction="none").float().sum()
                + fusedloss.large_margin_cross_entropy(c, d, lam=0.0, reduction="sum"))
    cf = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    za, zb = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    la, lb = f(xa, t, za, u), cf(xb, t, zb, u)
    (la * 0.7).backward()
    (lb * 0.7).backward()
    close(lb, la, TOL[dtype]["loss"], "compiled loss")
    close(xb.grad, xa.grad, TOL[dtype]["grad"], "compiled vs eager dlogits (rows)")
    close(zb.grad, za.grad, TOL[dtype]["grad"], "compiled vs eager dlogits (maps)")
    xd, zd = x.double().cpu().requires_grad_(True), z.double().cpu().requires_grad_(True)
    tc, uc = t.cpu(), u.cpu()
    ref = (ref_loss(xd, tc) + ref_loss(xd, tc, lam=1.7) + 0.5 * ref_loss(xd, tc, reduction="none").sum()
           + 0.25 * ref_loss(zd, uc, lam=1.7, reduction="none").sum() + ref_loss(zd, uc, lam=0.0, reduction="sum"))
    (ref * 0.7).backward()
    close(xb.grad, xd.grad, TOL[dtype]["grad"], "compiled dlogits (rows)")
    close(zb.grad, zd.grad, TOL[dtype]["grad"], "compiled dlogits (maps)")


def test_compile_out_of_range_is_nan(device, c_op_path):
    """Under torch.compile the PyTorch formulation has no host check: an out-of-range row gives NaN
    (the other rows are right). The CPU C op raises TargetOutOfRangeError, compiled or not; the CUDA
    C op gives NaN too, and sets the device error flag."""
    torch._dynamo.reset()
    x, t = make((5, 8), torch.float32, device, seed=26, ignored=())
    t[2] = 8

    def f(a, b):
        return fusedloss.large_margin_cross_entropy(a, b, reduction="none")
    cf = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    if c_op_path and device == "cpu":  # the C op checks the targets itself, compiled or not
        with pytest.raises(fusedloss.TargetOutOfRangeError, match="targets\\[2\\]"):
            cf(x, t)
        return
    if c_op_path:
        fusedloss.check_errors()  # start clean
    got = cf(x, t)
    assert torch.isnan(got[2]).item()
    if c_op_path:
        with pytest.raises(fusedloss.TargetOutOfRangeError):
            fusedloss.check_errors()
    good = [0, 1, 3, 4]
    close(got[good], ref_loss(x.double().cpu()[good], t.cpu()[good], reduction="none"),
          TOL[torch.float32]["loss"], "the other rows")


def test_compile_float64_cpu():
    """float64 on CPU (the PyTorch formulation) under torch.compile(fullgraph=True)."""
    torch._dynamo.reset()
    x, t = make((7, 12), torch.float64, "cpu", seed=27, ignored=(1,))
    f = torch.compile(lambda a, b: fusedloss.large_margin_cross_entropy(a, b, lam=0.9), fullgraph=True,
                      backend="aot_eager")
    xg = x.clone().requires_grad_(True)
    loss = f(xg, t)
    loss.backward()
    ref, rg = ref_run(x, t, torch.ones((), dtype=torch.float64), lam=0.9)
    close(loss, ref, TOL[torch.float64]["loss"], "compiled float64 loss")
    close(xg.grad, rg, TOL[torch.float64]["grad"], "compiled float64 dlogits")


def test_opcheck():
    from torch.library import opcheck
    for dtype, (N, C), strided in [(torch.float32, (6, 9), False), (torch.bfloat16, (5, 12), True),
                                   (torch.float16, (4, 7), False), (torch.float32, (3, 2), False)]:
        x, t = make((N, C + 3 if strided else C), dtype, "cpu", seed=28, ignored=(1,))
        if strided:
            x = x[:, :C]
            t = t.clamp_max(C - 1)
            t[1] = -100
        for red in (0, 1, 2):
            args = (0.3 if red != 2 else 1.7, -100, red)
            xg = x.detach().clone().requires_grad_(True) if not strided else x.detach().requires_grad_(True)
            opcheck(torch.ops.fusedloss.large_margin_ce_forward.default, (xg, t) + args)
            opcheck(torch.ops.fusedloss.large_margin_ce_forward.default, (x.detach(), t) + args)
            opcheck(torch.ops.fusedloss.large_margin_ce_loss_and_grad.default, (xg, t) + args)
            g = torch.rand(N if red == 0 else 1) + 0.5
            opcheck(torch.ops.fusedloss.large_margin_ce_fused.default, (x.detach(), t, g) + args)
            opcheck(torch.ops.fusedloss.large_margin_ce_fused.default, (x.detach(), t, None) + args)
            opcheck(torch.ops.fusedloss.large_margin_ce_forward.default, (x.detach(), t.int()) + args)


@pytest.mark.parametrize("red", [0, 1, 2])
@pytest.mark.parametrize("lam", LAMS)
def test_raw_ops_agree(red, lam):
    x, t = make((6, 33), torch.float32, "cpu", seed=29, ignored=(2,))
    args = (lam, -100, red)
    loss = lm.large_margin_ce_forward(x, t, *args)
    loss2, d1 = lm.large_margin_ce_loss_and_grad(x, t, *args)
    assert loss.dtype == torch.float32 and loss.shape == ((6,) if red == 0 else ())
    assert d1.shape == x.shape and d1.dtype == x.dtype
    torch.testing.assert_close(loss, loss2, rtol=1e-6, atol=0)
    torch.testing.assert_close(lm.large_margin_ce_fused(x, t, None, *args), d1, rtol=1e-6, atol=0)
    ones = torch.ones(6 if red == 0 else 1)
    torch.testing.assert_close(lm.large_margin_ce_fused(x, t, ones, *args), d1, rtol=1e-6, atol=0)
    g = torch.rand(6 if red == 0 else 1) + 0.5
    gb = g.reshape(-1, 1) if red == 0 else g
    torch.testing.assert_close(lm.large_margin_ce_fused(x, t, g, *args), d1 * gb, rtol=1e-5, atol=1e-9)
    # the header's closed form: dx_y = g (p_y - 1); for j != y,
    # dx_j = g (p_j + (lambda / 2) (q_j (x_j + 1 - sum_{k != y} q_k x_k) - 1 / (C - 1)))
    xd = x.double()
    C = xd.shape[1]
    tc = t.clamp_min(0)
    onehot = torch.nn.functional.one_hot(tc, C).bool()
    p = xd.softmax(1)
    q = xd.masked_fill(onehot, -math.inf).softmax(1)
    A = (q * xd).sum(1, keepdim=True)
    want = torch.where(onehot, p - 1, p + lam / 2 * (q * (xd + 1 - A) - 1 / (C - 1)))
    want[t == -100] = 0
    if red == 1:
        want = want / (t != -100).sum().item()
    close(d1, want, TOL[torch.float32]["grad"], "dlogits vs the header's formula")
    # and the loss vs the header's formula
    lrow = torch.logsumexp(xd, 1) - xd.gather(1, tc[:, None]).squeeze(1) \
        + lam / 2 * torch.where(onehot, 0.0, (q - 1 / (C - 1)) * q.log()).sum(1)
    lrow[t == -100] = 0
    wl = lrow if red == 0 else (lrow.sum() if red == 2 else lrow.sum() / (t != -100).sum())
    close(loss, wl, TOL[torch.float32]["loss"], "loss vs the header's formula")


def test_in_place_c_call():
    """The header allows dlogits == logits: the C entry point called in place gives the same gradient."""
    x, t = make((5, 17), torch.float32, "cpu", seed=30, ignored=(1,))
    want = lm.large_margin_ce_fused(x, t, None, 0.3, -100, 1)
    L = fusedloss._lib
    buf = x.clone()
    opts = L.large_margin_options()
    nb = L.large_margin_ce_workspace_size(5, 17, L.FL_DTYPE_F32, opts)
    ws = torch.empty(nb, dtype=torch.uint8)
    loss = torch.empty((), dtype=torch.float32)
    st = L.optional_symbol("fl_large_margin_ce_fused_cpu")(
        loss.data_ptr(), buf.data_ptr(), buf.data_ptr(), 17, t.data_ptr(), L.FL_INDEX_I64, None, 1.0, 5, 17,
        L.FL_DTYPE_F32, ctypes.addressof(opts), ws.data_ptr(), nb)
    L._check(st, "fl_large_margin_ce_fused_cpu")
    assert torch.equal(buf, want)
    torch.testing.assert_close(loss, lm.large_margin_ce_forward(x, t, 0.3, -100, 1), rtol=0, atol=0)


def test_workspace_size_and_options():
    L = fusedloss._lib
    assert ctypes.sizeof(L.LargeMarginOptions) == 40  # size_t, float, int64, enum, pointer (x86-64 / aarch64)
    none = L.large_margin_options(reduction=L.FL_REDUCTION_NONE)
    assert L.large_margin_ce_workspace_size(1000, 50, L.FL_DTYPE_F32, none) == 0
    for N in (0, 1, 1000):
        for r in (L.FL_REDUCTION_MEAN, L.FL_REDUCTION_SUM):
            got = L.large_margin_ce_workspace_size(N, 50, L.FL_DTYPE_BF16, L.large_margin_options(reduction=r))
            # the header: the same rule as fl_taylor_ce_workspace_size()
            assert got == L.taylor_ce_workspace_size(N, 50, L.FL_DTYPE_BF16, L.taylor_options(reduction=r)) > 0
    assert L.large_margin_ce_workspace_size(10, 5, 0) == L.large_margin_ce_workspace_size(10, 5, 0,
                                                                                         L.large_margin_options())
    for bad in (-0.5, math.inf, math.nan):
        with pytest.raises(fusedloss.FusedLossError, match="lambda"):
            L.large_margin_ce_workspace_size(10, 5, 0, L.large_margin_options(lam=bad))
    d = L.large_margin_options()
    assert abs(d.lambda_ - 0.3) < 1e-7 and d.ignore_index == -100 and d.reduction == L.FL_REDUCTION_MEAN


def test_c_rejects_bad_arguments():
    """The C library's own checks (the Python layer normally catches these first)."""
    L = fusedloss._lib
    fwd = L.optional_symbol("fl_large_margin_ce_forward_cpu")
    x = torch.randn(3, 1)
    t = torch.zeros(3, dtype=torch.long)
    loss = torch.empty(3)
    none = L.large_margin_options(reduction=L.FL_REDUCTION_NONE)
    st = fwd(loss.data_ptr(), x.data_ptr(), 1, t.data_ptr(), L.FL_INDEX_I64, 3, 1, L.FL_DTYPE_F32,
             ctypes.addressof(none), None, 0)
    with pytest.raises(fusedloss.FusedLossError, match="C \\(1\\) < 2"):
        L._check(st, "fl_large_margin_ce_forward_cpu")
    x = torch.randn(3, 4)
    neg = L.large_margin_options(lam=-1.0, reduction=L.FL_REDUCTION_NONE)
    st = fwd(loss.data_ptr(), x.data_ptr(), 4, t.data_ptr(), L.FL_INDEX_I64, 3, 4, L.FL_DTYPE_F32,
             ctypes.addressof(neg), None, 0)
    with pytest.raises(fusedloss.FusedLossError, match="lambda"):
        L._check(st, "fl_large_margin_ce_forward_cpu")


# ---- bad arguments ---------------------------------------------------------------------------------
def test_bad_arguments(device):
    x, t = make((4, 10), torch.float32, device, seed=31, ignored=())
    lmce = fusedloss.large_margin_cross_entropy
    for v in (-0.1, -1, math.inf, -math.inf, math.nan, 1e39, True, "0.3", None):
        with pytest.raises(ValueError, match="lam"):
            lmce(x, t, lam=v)
    with pytest.raises(ValueError, match="lam"):
        fusedloss.LargeMarginSoftmaxLoss(lam=-0.3)
    with pytest.raises(ValueError, match="reduction"):
        lmce(x, t, reduction="avg")
    with pytest.raises(ValueError, match="reduction"):
        fusedloss.LargeMarginSoftmaxLoss(reduction="batchmean")
    with pytest.raises(ValueError, match="C"):
        lmce(x[:, :1], t.clamp_max(0))
    with pytest.raises(ValueError, match=">= 2"):
        lmce(x[:, :1], t.clamp_max(0))
    with pytest.raises(ValueError, match=">= 2"):
        lmce(x[:, :0], t)
    with pytest.raises(ValueError, match=">= 2"):
        lmce(x[0, :1], t[0].clamp_max(0))  # one sample [1]
    with pytest.raises(ValueError, match="target shape"):
        lmce(x, t[:3])
    with pytest.raises(ValueError, match="target shape"):
        lmce(x, t[:, None])
    with pytest.raises(ValueError, match="target shape"):
        lmce(x.reshape(2, 2, 10), t.reshape(2, 2))  # [N, C, d]: the class dimension is 1
    with pytest.raises(TypeError, match="target"):
        lmce(x, t.float())
    with pytest.raises(TypeError, match="target"):
        lmce(x, t > 0)
    with pytest.raises(TypeError, match="floating-point"):
        lmce(t[:, None].expand(4, 10).contiguous(), t)
    with pytest.raises(TypeError):
        lmce(x.cpu().numpy(), t)
    with pytest.raises(ValueError, match="0-d"):
        lmce(x[0], t[:1])
    with pytest.raises(ValueError, match="0-d"):
        lmce(x[0, 0], t[0])


def test_bad_arguments_raw_ops():
    x, t = make((4, 10), torch.float32, "cpu", seed=31, ignored=())
    with pytest.raises(ValueError, match="2-D"):
        lm.large_margin_ce_forward(x.reshape(2, 2, 10), t.reshape(2, 2), 0.3, -100, 1)
    with pytest.raises(ValueError, match=">= 2"):
        lm.large_margin_ce_forward(x[:, :1], t.clamp_max(0), 0.3, -100, 1)
    with pytest.raises(ValueError, match=">= 2"):
        lm.large_margin_ce_fused(x[:, :1].to("meta"), t.clamp_max(0).to("meta"), None, 0.3, -100, 1)  # fake kernel
    with pytest.raises(ValueError, match="lam"):
        lm.large_margin_ce_forward(x, t, -0.3, -100, 1)
    with pytest.raises(ValueError, match="lam"):
        lm.large_margin_ce_loss_and_grad(x, t, math.nan, -100, 1)
    with pytest.raises(ValueError, match="reduction"):
        lm.large_margin_ce_forward(x, t, 0.3, -100, 3)
    with pytest.raises(ValueError, match="grad"):
        lm.large_margin_ce_fused(x, t, torch.ones(4), 0.3, -100, 1)
    with pytest.raises(ValueError, match="grad"):
        lm.large_margin_ce_fused(x, t, torch.ones(1, dtype=torch.float64), 0.3, -100, 0)
    with pytest.raises(ValueError, match="column stride"):
        lm.large_margin_ce_forward(x.t().contiguous().t(), t, 0.3, -100, 1)
    with pytest.raises(TypeError, match="target dtype"):
        lm.large_margin_ce_forward(x, t.to(torch.int16), 0.3, -100, 1)
    with pytest.raises(TypeError, match="logits dtype"):
        lm.large_margin_ce_forward(x.double(), t, 0.3, -100, 1)
    with pytest.raises(ValueError, match="target must have shape"):
        lm.large_margin_ce_loss_and_grad(x, t[:2], 0.3, -100, 1)


@pytest.mark.parametrize("reduction", REDS)
def test_out_of_range(device, c_op_path, reduction):
    """TargetOutOfRangeError (an IndexError), nothing returned: from the C status on the CPU C op, from
    the host check on the PyTorch formulation (float64; cpu-torch; CUDA without the CUDA backend),
    for every path (forward, a gradient needed). The CUDA C op: NaN there and the device flag
    (test_cuda_out_of_range_flag)."""
    x, t = make((4, 10), torch.float32, device, seed=32, ignored=())
    for bad_value in (10, -1, 1 << 40):
        bad = t.clone()
        bad[2] = bad_value
        if c_op_path and device == "cuda":
            fusedloss.check_errors()
            loss = fusedloss.large_margin_cross_entropy(x, bad, reduction=reduction)
            assert torch.isnan(loss[2] if reduction == "none" else loss).item()
            with pytest.raises(fusedloss.TargetOutOfRangeError):
                fusedloss.check_errors()
        else:
            with pytest.raises(IndexError, match="targets\\[2\\]"):
                fusedloss.large_margin_cross_entropy(x, bad, reduction=reduction)
            with pytest.raises(fusedloss.TargetOutOfRangeError):
                fusedloss.large_margin_cross_entropy(x.clone().requires_grad_(True), bad, reduction=reduction)
        with pytest.raises(fusedloss.TargetOutOfRangeError, match="targets\\[2\\]"):
            fusedloss.large_margin_cross_entropy(x.double(), bad, reduction=reduction)


@pytest.mark.parametrize("reduction", REDS)
def test_out_of_range_raw_ops(reduction):
    x, t = make((4, 10), torch.float32, "cpu", seed=33, ignored=())
    bad = t.clone()
    bad[3] = 10
    with pytest.raises(fusedloss.TargetOutOfRangeError, match="targets\\[3\\]"):
        lm.large_margin_ce_fused(x, bad.int(), None, 0.3, -100, RED_CODE[reduction])
    with pytest.raises(fusedloss.TargetOutOfRangeError):
        lm.large_margin_ce_loss_and_grad(x, bad, 1.7, -100, RED_CODE[reduction])
    with pytest.raises(fusedloss.TargetOutOfRangeError):
        lm.large_margin_ce_forward(x, bad, 0.0, -100, RED_CODE[reduction])


# ---- CUDA specifics (the C op; the PyTorch formulation and float64 are the references) ---------------
def _torch_run(x, t, up, **kw):
    """The PyTorch formulation (lm._large_margin_torch, what the C op replaces) on the same device and
    dtype: loss and autograd gradient for the upstream gradient up."""
    xg = x.detach().clone().requires_grad_(True)
    loss = lm._large_margin_torch(xg, t, **kw)
    loss.backward(up.to(loss.dtype))
    return loss.detach(), xg.grad


@needs_cuda_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("C", [2, 31, 1000, 1024, 1025, 20000])
@pytest.mark.parametrize("lam", [0.3, 1.7])
def test_cuda_matches_cpu(dtype, C, lam):
    """CUDA C op (fp32 inside) vs the CPU C op (double inside), loss and gradient; the forward's loss
    is the fused call's: bitwise up to C = 1024 (one warp kernel), within fp32 summation beyond (sm_90's
    fused call takes the ring kernel, the forward the CTA kernel: two summation orders)."""
    x, t = make((9, C), dtype, "cpu", seed=34 + C, ignored=(3,))
    for red in REDS:
        lc, gc, up = run(x, t, lam=lam, reduction=red)
        xg = x.cuda().requires_grad_(True)
        lg = fusedloss.large_margin_cross_entropy(xg, t.cuda(), lam=lam, reduction=red)
        lg.backward(up.cuda())
        assert lg.device.type == "cuda" and lg.dtype == dtype
        close(lg, lc, TOL[dtype]["loss"], "cuda vs cpu loss")
        close(xg.grad, gc.float(), TOL[dtype]["grad"], "cuda vs cpu dlogits")
        args = (lam, -100, RED_CODE[red])
        l2, _ = lm.large_margin_ce_loss_and_grad(x.cuda(), t.cuda(), *args)
        lf = lm.large_margin_ce_forward(x.cuda(), t.cuda(), *args)
        if C <= 1024:
            assert torch.equal(l2, lf)
        else:
            close(lf, l2, (1e-6, 2e-6), "cuda forward vs fused loss")


@needs_cuda_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("N,C", [(37, 257), (6, 3001)])
def test_cuda_vs_torch_and_float64(dtype, reduction, N, C):
    """The C op on CUDA against the PyTorch formulation on CUDA (same dtype) and the float64
    reference: loss and gradient through autograd, lam 0 / 0.3 / 1.7, a row-strided view (ld > C)."""
    for lam in LAMS:
        base, t = make((N, C + 5), dtype, "cuda", seed=40 + C + int(10 * lam), ignored=(1, 4))
        t = t.clamp_max(C - 1)
        bg = base.clone().requires_grad_(True)
        x = bg[:, :C]  # ld = C + 5: passed to the C op as is
        loss = fusedloss.large_margin_cross_entropy(x, t, lam=lam, reduction=reduction)
        up = upstream_for(loss, "rand")
        loss.backward(up)
        gx = bg.grad[:, :C]
        assert (bg.grad[:, C:] == 0).all()
        assert loss.dtype == dtype and gx.dtype == dtype
        lt, gt = _torch_run(x, t, up, lam=lam, reduction=reduction)
        ref, rg = ref_run(x, t, up, lam=lam, reduction=reduction)
        close(loss, ref, TOL[dtype]["loss"], "C op vs float64 loss")
        close(gx, rg, TOL[dtype]["grad"], "C op vs float64 dlogits")
        close(lt, ref, TOL[dtype]["loss"], "PyTorch formulation vs float64 loss")
        close(loss, lt, TOL[dtype]["loss"], "C op vs the PyTorch formulation loss")
        close(gx, gt, TOL[dtype]["grad"], "C op vs the PyTorch formulation dlogits")
        assert (gx[t == -100] == 0).all()


@needs_cuda_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("C", [17, 2000])
def test_cuda_in_place_c_call(dtype, C):
    """The header allows dlogits == logits: the CUDA entry point called in place gives the gradient of
    the out-of-place call, bitwise (both kernels: C <= 1024 and > 1024)."""
    x, t = make((6, C), dtype, "cuda", seed=36, ignored=(1,))
    want = lm.large_margin_ce_fused(x, t, None, 0.3, -100, 1)
    L = fusedloss._lib
    buf = x.clone()
    opts = L.large_margin_options()
    dt = {torch.float32: L.FL_DTYPE_F32, torch.bfloat16: L.FL_DTYPE_BF16}[dtype]
    nb = L.large_margin_ce_workspace_size(6, C, dt, opts)
    ws = torch.empty(nb, dtype=torch.uint8, device="cuda")
    loss = torch.empty((), dtype=torch.float32, device="cuda")
    st = L.optional_symbol("fl_large_margin_ce_fused_cuda")(
        loss.data_ptr(), buf.data_ptr(), buf.data_ptr(), C, t.data_ptr(), L.FL_INDEX_I64, None, 1.0, 6, C, dt,
        ctypes.addressof(opts), ws.data_ptr(), nb, torch.cuda.current_stream().cuda_stream)
    L._check(st, "fl_large_margin_ce_fused_cuda")
    torch.cuda.synchronize()
    assert torch.equal(buf, want)
    lf = lm.large_margin_ce_forward(x, t, 0.3, -100, 1)
    if C <= 1024:
        assert torch.equal(loss, lf)
    else:  # the fused ring's summation order (see test_cuda_matches_cpu)
        close(lf, loss, (1e-6, 2e-6), "cuda forward vs fused loss")


@needs_cuda_c
@pytest.mark.parametrize("reduction", REDS)
def test_cuda_out_of_range_flag(reduction):
    """CUDA: no host sync; the bad row's loss and gradient are NaN, the device error flag is set."""
    x, t = make((4, 10), torch.float32, "cuda", seed=29, ignored=())
    fusedloss.check_errors()  # start clean
    t[1] = 10
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.large_margin_cross_entropy(xg, t, reduction=reduction)
    loss.sum().backward()
    if reduction == "none":
        assert torch.isnan(loss[1]).item() and torch.isfinite(loss[[0, 2, 3]]).all().item()
    else:
        assert torch.isnan(loss).item()
    assert torch.isnan(xg.grad[1]).all().item()
    assert torch.isfinite(xg.grad[[0, 2, 3]]).all().item()
    with pytest.raises(fusedloss.TargetOutOfRangeError):
        fusedloss.check_errors()
    fusedloss.check_errors()  # the flag was reset


@needs_cuda_c
def test_cuda_side_stream_graph_and_determinism():
    x, t = make((64, 3000), torch.bfloat16, "cuda", seed=31, ignored=(5, 9))
    ref = fusedloss.large_margin_cross_entropy(x, t)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        got = fusedloss.large_margin_cross_entropy(x, t)
    torch.cuda.current_stream().wait_stream(st)
    assert torch.equal(got, ref)
    for C in (300, 3000):
        x, t = make((64, C), torch.float32, "cuda", seed=32, ignored=(5,))
        args = (0.3, -100, 1)
        l1, g1 = lm.large_margin_ce_loss_and_grad(x, t, *args)
        l2, g2 = lm.large_margin_ce_loss_and_grad(x, t, *args)
        assert torch.equal(l1, l2) and torch.equal(g1, g2)  # bitwise, run to run
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(graph):
                l3, g3 = lm.large_margin_ce_loss_and_grad(x, t, *args)
        torch.cuda.current_stream().wait_stream(s)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(l3, l1) and torch.equal(g3, g1)


@needs_cuda_c
def test_cuda_opcheck():
    from torch.library import opcheck
    for dtype, (N, C), strided in [(torch.float32, (6, 9), False), (torch.bfloat16, (5, 1100), True),
                                   (torch.float16, (4, 7), False)]:
        x, t = make((N, C + 3 if strided else C), dtype, "cuda", seed=28, ignored=(1,))
        if strided:
            x = x[:, :C]
            t = t.clamp_max(C - 1)
            t[1] = -100
        for red in (0, 1, 2):
            args = (0.3 if red != 2 else 1.7, -100, red)
            xg = x.detach().clone().requires_grad_(True) if not strided else x.detach().requires_grad_(True)
            opcheck(torch.ops.fusedloss.large_margin_ce_forward.default, (xg, t) + args)
            opcheck(torch.ops.fusedloss.large_margin_ce_loss_and_grad.default, (xg, t) + args)
            g = torch.rand(N if red == 0 else 1, device="cuda") + 0.5
            opcheck(torch.ops.fusedloss.large_margin_ce_fused.default, (x.detach(), t, g) + args)
            opcheck(torch.ops.fusedloss.large_margin_ce_fused.default, (x.detach(), t.int(), None) + args)


@needs_gpu
def test_cuda_path_taken():
    """CUDA tensors run the C op when the library has the CUDA backend (the custom ops then have CUDA
    kernels: the raw op equals the public function), else the PyTorch formulation."""
    x, t = make((4, 9), torch.float32, "cuda", seed=35)
    loss = fusedloss.large_margin_cross_entropy(x, t)
    assert torch.isfinite(loss).item()
    if C_ON_CUDA:
        assert torch.equal(loss, torch.ops.fusedloss.large_margin_ce_forward(x, t, 0.3, -100, 1))
    else:
        close(loss, lm._large_margin_torch(x, t), TOL[torch.float32]["loss"], "the PyTorch formulation")
