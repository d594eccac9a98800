"""Tests of fusedloss.sigmoid_focal_loss / binary_cross_entropy_with_logits (fusedloss.zoo, the
ops of include/fusedloss.h section 9) against torchvision's formula re-implemented here and
F.binary_cross_entropy_with_logits, both evaluated in float64 on the same (rounded) inputs:
loss and input gradient, every dtype x reduction x option (alpha on/off, gamma 0 / 0.5 / 1 / 2,
soft and hard targets, weight / pos_weight of [C] and other broadcast layouts), the gamma < 1
saturation NaN rule (torch's own autograd, float64), torch.library.opcheck on the four ops,
torch.compile(fullgraph=True), the fallbacks, errors. CUDA cases skip without a GPU.

Run (CPU, CI): make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_zoo.py
"""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from fusedloss import zoo  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDS = ["none", "mean", "sum"]
HAS_CUDA = torch.cuda.is_available() and fusedloss.cuda_built()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]

# |got - ref| <= atol + rtol*|ref|: the loss is computed in fp32 and rounded to the dtype; the
# gradient likewise (plus the fp32 cancellation of p (1 - y) - (1 - p) y for soft y: atol)
TOL = {torch.float32: (1e-6, 2e-6), torch.float16: (1e-6, 1e-3), torch.bfloat16: (1e-6, 8e-3)}


def tv_focal(inputs, targets, alpha=0.25, gamma=2.0, reduction="none"):
    """torchvision.ops.sigmoid_focal_loss, re-implemented (torchvision may not be installed)."""
    p = torch.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def close(got, ref, tol, what):
    atol, rtol = tol
    got = got.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), f"{what}: NaN pattern differs"
    m = ~torch.isnan(ref)
    err = (got - ref).abs()[m]
    bad = err > atol + rtol * ref.abs()[m]
    assert not bad.any(), f"{what}: {int(bad.sum())} mismatches, maxdiff {err.max().item():.3g}"


def make(shape, dtype, device, soft, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(shape, generator=g)).to(dtype)
    y = torch.rand(shape, generator=g) if soft else (torch.rand(shape, generator=g) < 0.3).float()
    return x.to(device), y.to(dtype).to(device)


def run_and_ref(fn, ref_fn, x, y, reduction, seed=1):
    xg = x.clone().requires_grad_(True)
    loss = fn(xg, y)
    gen = torch.Generator().manual_seed(seed)
    up = torch.randn(loss.shape, generator=gen).to(loss.device, loss.dtype) if reduction == "none" else \
        torch.tensor(0.75, device=loss.device, dtype=loss.dtype)
    loss.backward(up)
    xd = x.detach().double().cpu().requires_grad_(True)
    ref = ref_fn(xd, y.detach().double().cpu())
    (rdx,) = torch.autograd.grad(ref, xd, up.double().cpu())
    return loss, xg.grad, ref, rdx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("alpha,gamma", [(0.25, 2.0), (-1.0, 2.0), (0.25, 0.0), (0.25, 0.5), (0.6, 1.0), (0.25, 1.5)])
@pytest.mark.parametrize("soft", [False, True])
def test_focal(device, dtype, reduction, alpha, gamma, soft):
    x, y = make((37, 11), dtype, device, soft)
    loss, dx, ref, rdx = run_and_ref(
        lambda a, b: fusedloss.sigmoid_focal_loss(a, b, alpha=alpha, gamma=gamma, reduction=reduction),
        lambda a, b: tv_focal(a, b, alpha, gamma, reduction), x, y, reduction)
    assert loss.dtype == dtype and dx.dtype == dtype
    close(loss, ref, TOL[dtype], "loss")
    close(dx, rdx, TOL[dtype], "dx")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("wmode", ["none", "C", "pw", "both", "scalar", "rowwise"])
@pytest.mark.parametrize("soft", [False, True])
def test_bce(device, dtype, reduction, wmode, soft):
    shape = (5, 6, 9)
    x, y = make(shape, dtype, device, soft)
    g = torch.Generator().manual_seed(5)
    w = pw = None
    if wmode in ("C", "both"):
        w = torch.rand(9, generator=g) + 0.2
    if wmode in ("pw", "both"):
        pw = 3 * torch.rand(9, generator=g) + 0.1
    if wmode == "scalar":
        w, pw = torch.tensor(0.7), torch.tensor([2.0])
    if wmode == "rowwise":   # not a [C] layout: multiplied onto the unreduced loss
        w = torch.rand(5, 6, 1, generator=g) + 0.2
    wd = w.to(device) if w is not None else None
    pwd = pw.to(device) if pw is not None else None
    loss, dx, ref, rdx = run_and_ref(
        lambda a, b: fusedloss.binary_cross_entropy_with_logits(a, b, weight=wd, reduction=reduction, pos_weight=pwd),
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, weight=w.double() if w is not None else None,
                                                        reduction=reduction,
                                                        pos_weight=pw.double() if pw is not None else None),
        x, y, reduction)
    assert loss.dtype == dtype and dx.dtype == dtype
    close(loss, ref, TOL[dtype], "loss")
    close(dx, rdx, TOL[dtype], "dx")


def test_focal_saturation_matches_torch_autograd():
    # 1 - p_t == 0 in fp32 (|x| = 1e4): torch's autograd of torchvision's expression (float64)
    x = torch.tensor([1e4, -1e4, 1e4, -1e4, 0.3])
    y = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
    for gamma in (0.0, 0.5, 1.0, 2.0):
        xg = x.clone().requires_grad_(True)
        fusedloss.sigmoid_focal_loss(xg, y, gamma=gamma).sum().backward()
        xd = x.double().requires_grad_(True)
        tv_focal(xd, y.double(), gamma=gamma).sum().backward()
        close(xg.grad, xd.grad, TOL[torch.float32], f"gamma={gamma}")
        assert torch.isnan(xg.grad[:2]).all() == (gamma == 0.5)


def test_empty_and_shapes():
    x = torch.empty(0, 4, requires_grad=True)
    y = torch.empty(0, 4)
    assert fusedloss.sigmoid_focal_loss(x, y, reduction="sum").item() == 0.0
    assert torch.isnan(fusedloss.binary_cross_entropy_with_logits(x, y))
    assert fusedloss.sigmoid_focal_loss(x, y).shape == (0, 4)
    s = torch.tensor(0.4, requires_grad=True)   # 0-d input
    close(fusedloss.binary_cross_entropy_with_logits(s, torch.tensor(1.0)),
          F.binary_cross_entropy_with_logits(s.double(), torch.tensor(1.0).double()), TOL[torch.float32], "0-d")
    xs = torch.randn(6, 8)   # non-contiguous input, broadcast targets
    close(fusedloss.sigmoid_focal_loss(xs.t(), torch.ones(6)), tv_focal(xs.t().double(), torch.ones(6).double().expand(8, 6)),
          TOL[torch.float32], "t()")


def test_fallbacks():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    y = torch.rand(4, 3, dtype=torch.float64)
    torch.testing.assert_close(fusedloss.sigmoid_focal_loss(x, y), tv_focal(x, y))
    assert torch.autograd.gradcheck(lambda a: fusedloss.binary_cross_entropy_with_logits(a, y), (x,))
    yg = torch.rand(4, 3, requires_grad=True)   # target gradient: torch formula
    xf = torch.randn(4, 3, requires_grad=True)
    fusedloss.binary_cross_entropy_with_logits(xf, yg).backward()
    assert yg.grad is not None


def test_errors():
    x, y = torch.randn(3, 4), torch.rand(3, 4)
    with pytest.raises(ValueError):
        fusedloss.sigmoid_focal_loss(x, y, reduction="avg")
    with pytest.raises(ValueError):
        fusedloss.binary_cross_entropy_with_logits(x, y, reduction="avg")
    with pytest.raises(ValueError, match="Target size"):
        fusedloss.binary_cross_entropy_with_logits(x, y[:2])
    with pytest.raises(fusedloss.FusedLossError, match="fl_sigmoid_focal_forward_cpu: .*gamma"):
        torch.ops.fusedloss.sigmoid_focal_forward(x, y, 0.25, -1.0, 0)
    with pytest.raises(ValueError):
        torch.ops.fusedloss.bce_with_logits_forward(x, y, torch.ones(3), None, 1)
    xg = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fusedloss.sigmoid_focal_loss(xg, y, reduction="sum"), xg, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, y = make((6, 5), torch.float32, device, True)
    w = torch.rand(5, device=device) + 0.5
    for red in (0, 1, 2):
        torch.library.opcheck(torch.ops.fusedloss.sigmoid_focal_forward, (x.requires_grad_(True), y, 0.25, 2.0, red))
        torch.library.opcheck(torch.ops.fusedloss.bce_with_logits_forward, (x, y, w, None, red))
        grad = torch.randn(x.shape if red == 0 else (), device=device)
        torch.library.opcheck(torch.ops.fusedloss.sigmoid_focal_backward, (grad, x.detach(), y, 0.25, 0.5, red))
        torch.library.opcheck(torch.ops.fusedloss.bce_with_logits_backward, (grad, x.detach(), y, None, w, red))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    x, y = make((16, 7), torch.float32, device, True)
    pw = torch.rand(7, device=device) + 0.5

    def f(a, b):
        return fusedloss.sigmoid_focal_loss(a, b, reduction="mean") + \
            fusedloss.binary_cross_entropy_with_logits(a, b, pos_weight=pw)
    cf = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    la, lb = f(xa, y), cf(xb, y)
    la.backward()
    lb.backward()
    torch.testing.assert_close(la, lb)
    torch.testing.assert_close(xa.grad, xb.grad)


@needs_cuda
def test_cuda_matches_cpu_bitwise_shapes():
    for n in (1, 7, 8, 9, 1000, 4097, 100003):
        x, y = make((n,), torch.bfloat16, "cpu", True, seed=n)
        lc = fusedloss.sigmoid_focal_loss(x.float(), y.float(), reduction="sum")
        lg = fusedloss.sigmoid_focal_loss(x.float().cuda(), y.float().cuda(), reduction="sum")
        torch.testing.assert_close(lg.cpu(), lc, rtol=1e-5, atol=1e-6)
