"""Tests of fusedloss.margin_cross_entropy / ArcFaceLoss / CosFaceLoss / CombinedMarginLoss and
fusedloss.softmax_focal_loss / SoftmaxFocalLoss (fusedloss.softmax_losses, the ops of
include/fusedloss.h sections 11 and 12).

Margin: against float64 PyTorch references evaluated on the same (rounded) inputs: insightface's
old ArcFace head (sin_theta = sqrt(1 - x^2), cos_theta_m = x cos(m) - sin_theta sin(m),
torch.where(x > cos(pi - m), cos_theta_m, x - sin(pi - m) m), times s, F.cross_entropy) for ArcFace
in exact mode (loss and gradient; the target cosines are kept away from +-1 and from the branch
boundaries, but both branches are visited), CosFace (x - m3), straight mode against the detach
formula z_y = s (x_y + (phi - x_y).detach()), easy_margin, a combined margin with m1 > 1 (acos
formula), ignored rows, every reduction, fp32 / fp16 / bf16, C = 100 and 10000, cosines of +-1 and
beyond (finite, the header's clamp, C kernel vs the PyTorch fallback).
Focal: against a float64 reference -alpha_y (1 - p_y)^gamma log p_y (log_softmax based, autograd):
gamma 0 / 0.5 / 2, alpha None / tensor / float, rows [N, C] and NCHW maps (2x19x8x16), ignore_index,
every reduction (mean over positions not ignored), fp32 / fp16 / bf16, the gamma = 0 identity with
F.cross_entropy(weight=alpha, reduction='sum') / count, confident positions (p_y = 1: finite).
Both: upstream gradient 1 and not 1, gradient accumulation, non-contiguous inputs, the C calls each
path makes, torch.compile(fullgraph=True) (aot_eager on CPU), torch.library.opcheck on the six ops,
double backward, the fallbacks (float64) and bad arguments. CUDA cases skip without a GPU (and a
CUDA build of the library).

Run (CPU, CI): make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_softmax_losses.py
"""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from fusedloss import softmax_losses as sl  # noqa: E402
from _zoo_util import DEVICES, close, needs_cuda  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDS = ["none", "sum", "mean"]

# (atol, rtol) per dtype, for the loss and the gradient: |got - ref| <= atol * max|ref| + rtol * |ref|
# (atol relative to the tensor's largest magnitude). The loss is computed in fp32 (CUDA) / double
# (CPU) and rounded once to the dtype; so is the gradient, and an upstream gradient != 1 of a scalar
# loss rounds it a second time (the in-place scale).
TOL = {
    torch.float32: {"loss": (1e-5, 2e-5), "grad": (3e-5, 1e-4)},
    torch.float16: {"loss": (1e-5, 2e-3), "grad": (3e-4, 2e-3)},
    torch.bfloat16: {"loss": (1e-5, 1.6e-2), "grad": (3e-3, 1.6e-2)},
}


def upstream_for(loss, kind, seed=7):
    if kind == "one":
        return torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(loss.shape, generator=gen) + 0.5).to(loss.device, loss.dtype)


# ---- margin: references (float64) -----------------------------------------------------------------
def ref_insightface_arcface(x, t, s=64.0, m=0.5, easy_margin=False, ignore_index=-100, reduction="mean",
                            straight=False):
    """insightface's (old) ArcMarginProduct head followed by F.cross_entropy, on cosines x [N, C].
    straight: the margin as a constant shift, z_y = s (x_y + (phi - x_y).detach())."""
    cos_m, sin_m = math.cos(m), math.sin(m)
    th = math.cos(math.pi - m)
    mm = math.sin(math.pi - m) * m
    cosine = x
    sine = torch.sqrt((1.0 - torch.pow(cosine, 2)).clamp(0, 1))
    phi = cosine * cos_m - sine * sin_m
    if easy_margin:
        phi = torch.where(cosine > 0, phi, cosine)
    else:
        phi = torch.where(cosine > th, phi, cosine - mm)
    if straight:
        phi = cosine + (phi - cosine).detach()
    tc = torch.where(t == ignore_index, torch.zeros_like(t), t)
    one_hot = torch.zeros_like(cosine)
    one_hot.scatter_(1, tc.view(-1, 1).long(), 1)
    output = (one_hot * phi) + ((1.0 - one_hot) * cosine)
    output = output * s
    return F.cross_entropy(output, t, ignore_index=ignore_index, reduction=reduction)


def ref_cosface(x, t, s=64.0, m=0.4, ignore_index=-100, reduction="mean"):
    tc = torch.where(t == ignore_index, torch.zeros_like(t), t)
    one_hot = F.one_hot(tc, x.shape[1]).bool()
    return F.cross_entropy(torch.where(one_hot, x - m, x) * s, t, ignore_index=ignore_index, reduction=reduction)


def ref_combined(x, t, s, m1, m2, m3, easy_margin=False, straight=False, ignore_index=-100, reduction="mean"):
    """Header section 11 written out with acos (any m1), for the target column only."""
    tc = torch.where(t == ignore_index, torch.zeros_like(t), t)
    xy = x.gather(1, tc[:, None])
    a = m1 * torch.acos(xy.clamp(-1, 1)) + m2
    applies = (xy > 0) if easy_margin else (a <= math.pi)
    phi = torch.where(applies, torch.cos(a) - m3, xy - m3 if easy_margin else xy - m3 - m2 * math.sin(m2))
    if straight:
        phi = xy + (phi - xy).detach()
    z = (s * x).scatter(1, tc[:, None], s * phi)
    return F.cross_entropy(z, t, ignore_index=ignore_index, reduction=reduction)


# target cosines: four bands that stay clear of +-1 and of the branch boundaries of every margin used
# here (ArcFace m = 0.5: cos(pi - 0.5) = -0.878; easy_margin: 0; m1 = 1.35, m2 = 0.25: -0.540), so
# that the gradient is smooth there; the first band is ArcFace's fallback branch (x - m sin m)
_BANDS = [(-0.97, -0.90), (-0.85, -0.60), (-0.48, -0.05), (0.05, 0.97)]


def make_cosines(N, C, dtype, device, seed=0, ignored=(1,), index_dtype=torch.int64):
    """Cosines [N, C] in [-0.95, 0.95] (rounded to dtype), targets with their cosine in a band."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(N, C, generator=g) * 1.9 - 0.95
    t = torch.randint(0, C, (N,), generator=g)
    for i in range(N):
        lo, hi = _BANDS[i % len(_BANDS)]
        x[i, t[i]] = lo + (hi - lo) * torch.rand((), generator=g)
    for i in ignored:
        t[i % N] = -100
    return x.to(dtype).to(device), t.to(index_dtype).to(device)


def margin_run(x, t, upstream, **kw):
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.margin_cross_entropy(xg, t, **kw)
    up = upstream_for(loss, upstream)
    loss.backward(up)
    return loss, xg.grad, up


def margin_ref_grad(ref_fn, x, t, up, **kw):
    xd = x.detach().double().cpu().requires_grad_(True)
    ref = ref_fn(xd, t.cpu().long(), **kw)
    (g,) = torch.autograd.grad(ref, xd, up.double().cpu())
    return ref, g


# ---- margin: against insightface --------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("N,C", [(9, 100), (6, 10000)])
def test_arcface_vs_insightface(device, dtype, reduction, N, C):
    x, t = make_cosines(N, C, dtype, device, seed=C + N, ignored=(2,))
    loss, gx, up = margin_run(x, t, "rand", s=64.0, m2=0.5, reduction=reduction)
    assert loss.dtype == dtype and gx.dtype == dtype
    ref, rg = margin_ref_grad(ref_insightface_arcface, x, t, up, s=64.0, m=0.5, reduction=reduction)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dcosine")
    assert (gx[2] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_arcface_upstream_one(device, dtype, reduction):
    """loss.backward() (upstream 1: the gradient formed in the forward is used as is)."""
    x, t = make_cosines(8, 300, dtype, device, seed=11, ignored=())
    loss, gx, up = margin_run(x, t, "one", s=30.0, m2=0.5, reduction=reduction)
    ref, rg = margin_ref_grad(ref_insightface_arcface, x, t, up, s=30.0, m=0.5, reduction=reduction)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dcosine")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
def test_arcface_easy_margin(device, dtype, reduction):
    x, t = make_cosines(8, 100, dtype, device, seed=12, ignored=(5,))
    loss, gx, up = margin_run(x, t, "rand", s=64.0, m2=0.5, easy_margin=True, reduction=reduction)
    ref, rg = margin_ref_grad(ref_insightface_arcface, x, t, up, s=64.0, m=0.5, easy_margin=True,
                              reduction=reduction)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dcosine")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("C", [100, 10000])
def test_cosface(device, dtype, reduction, C):
    x, t = make_cosines(6, C, dtype, device, seed=13 + C, ignored=(0,))
    loss, gx, up = margin_run(x, t, "rand", s=64.0, m2=0.0, m3=0.4, reduction=reduction)
    ref, rg = margin_ref_grad(ref_cosface, x, t, up, s=64.0, m=0.4, reduction=reduction)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dcosine")
    # CosFace has no branch: the same for any cosine, also beyond [-1, 1], and in either grad mode
    l2 = fusedloss.margin_cross_entropy(x, t, s=64.0, m2=0.0, m3=0.4, reduction=reduction, grad_mode="straight",
                                        easy_margin=True)
    assert torch.equal(l2, loss.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("easy", [False, True])
def test_straight_mode(device, dtype, reduction, easy):
    x, t = make_cosines(8, 200, dtype, device, seed=14, ignored=(3,))
    loss, gx, up = margin_run(x, t, "rand", s=64.0, m2=0.5, grad_mode="straight", easy_margin=easy,
                              reduction=reduction)
    ref, rg = margin_ref_grad(ref_insightface_arcface, x, t, up, s=64.0, m=0.5, easy_margin=easy,
                              reduction=reduction, straight=True)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dcosine")
    # same loss as exact mode; only the target column's gradient differs
    le = fusedloss.margin_cross_entropy(x, t, s=64.0, m2=0.5, easy_margin=easy, reduction=reduction)
    assert torch.equal(le, loss.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad_mode", ["exact", "straight"])
@pytest.mark.parametrize("reduction", REDS)
def test_combined_margin_m1(device, dtype, grad_mode, reduction):
    """m1 > 1 (SphereFace-style) with m2 and m3: the acos formula, both branches."""
    x, t = make_cosines(8, 150, dtype, device, seed=15, ignored=(6,))
    kw = dict(s=32.0, m1=1.35, m2=0.25, m3=0.1)
    loss, gx, up = margin_run(x, t, "rand", grad_mode=grad_mode, reduction=reduction, **kw)
    ref, rg = margin_ref_grad(ref_combined, x, t, up, straight=grad_mode == "straight", reduction=reduction, **kw)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dcosine")
    crit = fusedloss.CombinedMarginLoss(32.0, 1.35, 0.25, 0.1, grad_mode=grad_mode, reduction=reduction)
    assert torch.equal(crit(x, t), loss.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_mode", ["exact", "straight"])
@pytest.mark.parametrize("easy", [False, True])
def test_margin_edge_cosines(device, grad_mode, easy):
    """Target cosines of exactly +-1 and beyond [-1, 1]: finite loss and gradient (the header's
    max(sin theta, 1e-6) clamp), the same in the C kernel (fp32) and the PyTorch fallback (float64)."""
    x, t = make_cosines(6, 40, torch.float32, device, seed=16, ignored=())
    tl = t.tolist()
    for i, v in enumerate([1.0, -1.0, 1.0 + 2 ** -10, -1.0 - 2 ** -10, 0.999999, -0.5]):
        x[i, tl[i]] = v
    kw = dict(s=16.0, m2=0.5, grad_mode=grad_mode, easy_margin=easy, reduction="none")
    loss, gx, up = margin_run(x, t, "rand", **kw)
    assert torch.isfinite(loss).all() and torch.isfinite(gx).all()
    x64 = x.double().requires_grad_(True)
    l64 = fusedloss.margin_cross_entropy(x64, t, **kw)  # the fallback
    l64.backward(up.double())
    close(loss, l64, TOL[torch.float32]["loss"], "loss vs fallback")
    close(gx, x64.grad, TOL[torch.float32]["grad"], "dcosine vs fallback")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_margin_all_ignored(device, reduction):
    x, t = make_cosines(4, 19, torch.float32, device, seed=17, ignored=())
    t = torch.full_like(t, -1)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.margin_cross_entropy(xg, t, ignore_index=-1, reduction=reduction)
    if reduction == "mean":
        assert torch.isnan(loss).item()
    elif reduction == "none":
        assert loss.shape == (4,) and (loss == 0).all()
    else:
        assert loss.item() == 0.0
    loss.sum().backward() if reduction == "none" else loss.backward()
    assert torch.equal(xg.grad, torch.zeros_like(x))


@pytest.mark.parametrize("device", DEVICES)
def test_margin_modules_shapes_and_targets(device):
    x, t = make_cosines(12, 64, torch.float32, device, seed=18, ignored=(4, 7))
    ref = fusedloss.margin_cross_entropy(x, t, s=64.0, m2=0.5)
    assert torch.equal(fusedloss.ArcFaceLoss()(x, t), ref)
    assert torch.equal(fusedloss.ArcFaceLoss(s=64.0, m=0.5)(x, t.int()), ref)   # int32 targets
    assert torch.equal(fusedloss.margin_cross_entropy(x, t.to(torch.int16)), ref)  # cast to int64
    assert torch.equal(fusedloss.CosFaceLoss(s=30.0, m=0.35, reduction="sum")(x, t),
                       fusedloss.margin_cross_entropy(x, t, s=30.0, m2=0.0, m3=0.35, reduction="sum"))
    assert torch.equal(fusedloss.CombinedMarginLoss(64.0, 1.0, 0.5, 0.0)(x, t), ref)
    # [..., C] inputs: leading dims flattened; target of the leading shape or flattened
    x3, t2 = x.reshape(3, 4, 64), t.reshape(3, 4)
    assert torch.equal(fusedloss.margin_cross_entropy(x3, t2), ref)
    assert torch.equal(fusedloss.margin_cross_entropy(x3, t), ref)
    none = fusedloss.margin_cross_entropy(x3, t2, reduction="none")
    assert none.shape == (3, 4)
    assert torch.equal(none.reshape(-1), fusedloss.margin_cross_entropy(x, t, reduction="none"))
    r = repr(fusedloss.ArcFaceLoss(m=0.3, grad_mode="straight"))
    assert "m2=0.3" in r and "straight" in r


# ---- focal: reference (float64) ------------------------------------------------------------------
def ref_focal(x, t, alpha=None, gamma=2.0, ignore_index=-100, reduction="mean"):
    """-alpha_y (1 - p_y)^gamma log p_y per position (log_softmax over dim 1), float64, autograd."""
    logp_all = F.log_softmax(x, dim=1)
    keep = t != ignore_index
    tc = torch.where(keep, t, torch.zeros_like(t))
    logp = logp_all.gather(1, tc.unsqueeze(1)).squeeze(1)
    w = (1 - logp.exp()) ** gamma if gamma != 0 else 1.0
    l = -w * logp
    if isinstance(alpha, torch.Tensor):
        l = alpha.double()[tc] * l
    elif alpha is not None:
        l = alpha * l
    l = torch.where(keep, l, torch.zeros((), dtype=l.dtype))
    if reduction == "none":
        return l
    if reduction == "sum":
        return l.sum()
    return l.sum() / keep.sum()


def make_focal(shape, dtype, device, seed=0, ignored=(1,), scale=3.0, index_dtype=torch.int64):
    """Logits of shape [N, C, ...] (rounded to dtype) and targets [N, ...] with some positions ignored."""
    g = torch.Generator().manual_seed(seed)
    x = (scale * torch.randn(shape, generator=g)).to(dtype)
    C = shape[1]
    tshape = (shape[0],) + tuple(shape[2:])
    t = torch.randint(0, C, tshape, generator=g).reshape(-1)
    for i in ignored:
        t[(i * 37) % t.numel()] = -100
    return x.to(device), t.reshape(tshape).to(index_dtype).to(device)


def make_alpha(kind, C, device, seed=0):
    if kind == "none":
        return None
    if kind == "float":
        return 0.25
    g = torch.Generator().manual_seed(seed + 5)
    return (torch.rand(C, generator=g) + 0.1).to(device)


def focal_run(x, t, upstream, **kw):
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.softmax_focal_loss(xg, t, **kw)
    up = upstream_for(loss, upstream)
    loss.backward(up)
    xd = x.detach().double().cpu().requires_grad_(True)
    rkw = dict(kw)
    if isinstance(rkw.get("alpha"), torch.Tensor):
        rkw["alpha"] = rkw["alpha"].cpu()
    ref = ref_focal(xd, t.cpu().long(), **rkw)
    (rg,) = torch.autograd.grad(ref, xd, up.double().cpu())
    return loss, xg.grad, ref, rg


LAYOUTS = {"rows": (7, 13), "nchw": (2, 19, 8, 16)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("alpha", ["none", "tensor", "float"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("reduction", REDS)
def test_focal_grid(device, dtype, gamma, alpha, layout, reduction):
    shape = LAYOUTS[layout]
    x, t = make_focal(shape, dtype, device, seed=len(shape) * 10 + int(gamma * 2), ignored=(1, 3))
    a = make_alpha(alpha, shape[1], device)
    loss, gx, ref, rg = focal_run(x, t, "rand", alpha=a, gamma=gamma, reduction=reduction)
    assert loss.dtype == dtype and gx.dtype == dtype and gx.shape == x.shape
    if reduction == "none":
        assert loss.shape == t.shape
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dlogits")
    ign = (t == -100)
    assert ign.sum() == 2
    gm = gx.movedim(1, -1)[ign]  # [positions ignored, C]
    assert (gm == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_focal_upstream_one(device, dtype, layout, reduction):
    x, t = make_focal(LAYOUTS[layout], dtype, device, seed=20, ignored=())
    loss, gx, ref, rg = focal_run(x, t, "one", gamma=2.0, reduction=reduction)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dlogits")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_focal_gamma0_is_weighted_ce_sum_over_count(device, layout):
    """gamma = 0 with alpha: F.cross_entropy(weight=alpha, reduction='sum') / positions not ignored
    (kornia's mean), which is NOT F.cross_entropy's weighted mean (sum / sum of alpha_y)."""
    x, t = make_focal(LAYOUTS[layout], torch.float32, device, seed=21, ignored=(0, 2, 5))
    a = make_alpha("tensor", x.shape[1], device, seed=3)
    got = fusedloss.softmax_focal_loss(x, t, alpha=a, gamma=0.0)
    count = (t != -100).sum()
    want = F.cross_entropy(x, t, weight=a, reduction="sum") / count
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    weighted_mean = F.cross_entropy(x, t, weight=a)
    assert not torch.allclose(got, weighted_mean, rtol=1e-3)
    # without alpha: exactly the cross-entropy mean
    torch.testing.assert_close(fusedloss.softmax_focal_loss(x, t, gamma=0.0), F.cross_entropy(x, t),
                               rtol=1e-5, atol=1e-6)
    # alpha float: every class weighted the same
    torch.testing.assert_close(fusedloss.softmax_focal_loss(x, t, alpha=0.25, gamma=0.0),
                               0.25 * F.cross_entropy(x, t), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0])
def test_focal_confident_positions(device, gamma):
    """p_y == 1 (in fp32 and double): a finite loss 0 and gradient (the header's limit, not
    autograd's 0 * inf = NaN for gamma < 1); the C kernel (fp32) matches the fallback (float64)."""
    x, t = make_focal((6, 11), torch.float32, device, seed=22, ignored=())
    tl = t.tolist()
    for i in range(3):
        x[i, tl[i]] = 80.0 + 20 * i  # p_y rounds to 1
    kw = dict(gamma=gamma, reduction="none")
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.softmax_focal_loss(xg, t, **kw)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(xg.grad).all()
    assert (loss[:3] == 0).all()
    x64 = x.double().requires_grad_(True)
    l64 = fusedloss.softmax_focal_loss(x64, t, **kw)  # the fallback
    l64.sum().backward()
    assert torch.isfinite(x64.grad).all()
    close(loss, l64, TOL[torch.float32]["loss"], "loss vs fallback")
    close(xg.grad, x64.grad, TOL[torch.float32]["grad"], "dlogits vs fallback")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 300), (3, 9000), (2, 19, 8, 16)])
def test_focal_masked_classes(device, dtype, shape):
    """-inf non-target logits are masked classes (the header's softmax focal section): p_c = 0, gradient 0, finite
    loss, as log_softmax; runs of 32 masked columns cover whole 16-byte vectors and the first
    vector of every thread of a row (the NaN the CUDA kernels gave before 2026-12-02). (3, 9000)
    fp32 rows take the staged kernel on sm_90."""
    x, t = make_focal(shape, dtype, device, seed=31, ignored=(1,))
    x = x.clone()
    C = shape[1]
    if len(shape) == 2:
        cols = torch.tensor([(k // 32) % 3 == 0 for k in range(C)], device=device)
        for i, ti in enumerate(t.tolist()):
            if ti < 0:   # ignored rows stay finite (the float64 reference gathers column 0 there)
                continue
            m = cols.clone()
            m[ti] = False
            x[i, m] = float("-inf")
    else:
        tt = t.clone()
        for k in range(6):   # classes 0..5 masked wherever they are not the target (not ignored)
            x[:, k][(tt != k) & (tt >= 0)] = float("-inf")
    for reduction in ("none", "mean"):
        loss, g, ref, rg = focal_run(x, t, "rand", gamma=2.0, reduction=reduction)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all()
        close(loss, ref, TOL[dtype]["loss"], f"loss {reduction}")
        close(g, rg, TOL[dtype]["grad"], f"dlogits {reduction}")
        assert (g[torch.isinf(x)] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_focal_all_ignored(device, reduction):
    x, t = make_focal((2, 5, 3, 4), torch.float32, device, seed=23, ignored=())
    t = torch.full_like(t, 255)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.softmax_focal_loss(xg, t, ignore_index=255, reduction=reduction)
    if reduction == "mean":
        assert torch.isnan(loss).item()
    elif reduction == "none":
        assert loss.shape == (2, 3, 4) and (loss == 0).all()
    else:
        assert loss.item() == 0.0
    loss.sum().backward() if reduction == "none" else loss.backward()
    assert torch.equal(xg.grad, torch.zeros_like(x))


@pytest.mark.parametrize("device", DEVICES)
def test_focal_module_targets_and_shapes(device):
    x, t = make_focal((3, 7, 5), torch.float32, device, seed=24, ignored=(2,))
    a = make_alpha("tensor", 7, "cpu", seed=4)
    crit = fusedloss.SoftmaxFocalLoss(alpha=a, gamma=1.5, reduction="sum").to(device)
    assert crit.alpha.device.type == torch.device(device).type  # a buffer
    ref = fusedloss.softmax_focal_loss(x, t, alpha=a.to(device), gamma=1.5, reduction="sum")
    assert torch.equal(crit(x, t), ref)
    assert torch.equal(fusedloss.softmax_focal_loss(x, t, alpha=a, gamma=1.5, reduction="sum"), ref)  # alpha moved
    assert torch.equal(fusedloss.softmax_focal_loss(x, t.int(), alpha=a.to(device), gamma=1.5, reduction="sum"), ref)
    assert torch.equal(fusedloss.SoftmaxFocalLoss(alpha=0.5)(x, t), fusedloss.softmax_focal_loss(x, t, alpha=0.5))
    assert "gamma=1.5" in repr(crit)
    # 1-D spatial dims of size 1 and an unbatched sample [C] with a 0-d target
    x1 = x[:, :, :1]
    assert fusedloss.softmax_focal_loss(x1, t[:, :1], reduction="none").shape == (3, 1)
    u = fusedloss.softmax_focal_loss(x[0, :, 0], t[0, 0], reduction="none")
    assert u.shape == () and torch.equal(u, fusedloss.softmax_focal_loss(x[:1, :, 0], t[:1, 0], reduction="none")[0])


def test_focal_alpha_requires_grad_fallback():
    """An alpha tensor that requires grad: the PyTorch formula, differentiating alpha too."""
    x, t = make_focal((2, 6, 4, 3), torch.float32, "cpu", seed=25, ignored=(1,))
    a = make_alpha("tensor", 6, "cpu").requires_grad_(True)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.softmax_focal_loss(xg, t, alpha=a, gamma=2.0)
    loss.backward()
    xd, ad = x.double().requires_grad_(True), a.detach().double().requires_grad_(True)
    ref = ref_focal(xd, t, alpha=ad, gamma=2.0)
    ref.backward()
    close(loss, ref, TOL[torch.float32]["loss"], "loss")
    close(xg.grad, xd.grad, TOL[torch.float32]["grad"], "dlogits")
    close(a.grad, ad.grad, TOL[torch.float32]["grad"], "dalpha")


# ---- both: fallbacks ------------------------------------------------------------------------------
def test_fallback_float64():
    x, t = make_cosines(7, 50, torch.float64, "cpu", seed=26, ignored=(3,))
    for kw, ref_fn, rkw in [(dict(s=64.0, m2=0.5), ref_insightface_arcface, dict(s=64.0, m=0.5)),
                            (dict(s=64.0, m2=0.5, grad_mode="straight"), ref_insightface_arcface,
                             dict(s=64.0, m=0.5, straight=True)),
                            (dict(s=64.0, m2=0.0, m3=0.4), ref_cosface, dict(s=64.0, m=0.4)),
                            (dict(s=32.0, m1=1.35, m2=0.25, m3=0.1), ref_combined,
                             dict(s=32.0, m1=1.35, m2=0.25, m3=0.1))]:
        for red in REDS:
            loss, gx, up = margin_run(x, t, "rand", reduction=red, **kw)
            ref, rg = margin_ref_grad(ref_fn, x, t, up, reduction=red, **rkw)
            assert loss.dtype == torch.float64
            torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(gx, rg, rtol=1e-8, atol=1e-12)
    for shape in ((6, 9), (2, 5, 3, 4)):
        x, t = make_focal(shape, torch.float64, "cpu", seed=27, ignored=(1,))
        for gamma in (0.0, 0.5, 2.0):
            for red in REDS:
                loss, gx, ref, rg = focal_run(x, t, "rand", alpha=make_alpha("tensor", shape[1], "cpu"),
                                              gamma=gamma, reduction=red)
                assert loss.dtype == torch.float64
                torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
                torch.testing.assert_close(gx, rg, rtol=1e-8, atol=1e-12)


# ---- both: accumulation, layouts, C calls -------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_gradient_accumulation(device, reduction):
    x, t = make_cosines(6, 40, torch.float32, device, seed=28, ignored=(0,))
    t2 = make_cosines(6, 40, torch.float32, device, seed=29, ignored=(1,))[1]
    xg = x.clone().requires_grad_(True)
    for tt, w in ((t, 1.0), (t2, 0.5)):
        (fusedloss.margin_cross_entropy(xg, tt, reduction=reduction).sum() * w).backward()
    xd = x.double().cpu().requires_grad_(True)
    sum(ref_insightface_arcface(xd, tt.cpu(), reduction=reduction).sum() * w for tt, w in ((t, 1.0), (t2, 0.5))
        ).backward()
    close(xg.grad, xd.grad, TOL[torch.float32]["grad"], "accumulated margin grad")

    z, u = make_focal((2, 5, 4, 3), torch.float32, device, seed=30, ignored=(2,))
    u2 = make_focal((2, 5, 4, 3), torch.float32, device, seed=31, ignored=(4,))[1]
    zg = z.clone().requires_grad_(True)
    for uu, w in ((u, 1.0), (u2, 0.5)):
        (fusedloss.softmax_focal_loss(zg, uu, gamma=2.0, reduction=reduction).sum() * w).backward()
    zd = z.double().cpu().requires_grad_(True)
    sum(ref_focal(zd, uu.cpu(), gamma=2.0, reduction=reduction).sum() * w for uu, w in ((u, 1.0), (u2, 0.5))
        ).backward()
    close(zg.grad, zd.grad, TOL[torch.float32]["grad"], "accumulated focal grad")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_non_contiguous(device, reduction):
    """Margin: a column slice (row stride > C: passed as ld, no copy) and a transposed input (made
    contiguous). Focal: a batch slice of an NCHW map (batch stride > C d: ld) and channels_last
    (made contiguous). Results and gradients equal those of contiguous copies."""
    base = make_cosines(6, 50, torch.float32, device, seed=32, ignored=())[0]
    t = make_cosines(6, 37, torch.float32, device, seed=33, ignored=(4,))[1]
    for view, cols in ((lambda b: b[:, 3:40], slice(3, 40)), (lambda b: b.t().contiguous().t()[:, 5:42], slice(5, 42))):
        a = base.clone().requires_grad_(True)
        xa = view(a)
        assert not xa.is_contiguous()
        la = fusedloss.margin_cross_entropy(xa, t, reduction=reduction)
        b = xa.detach().contiguous().requires_grad_(True)
        lb = fusedloss.margin_cross_entropy(b, t, reduction=reduction)
        up = torch.rand(la.shape, device=device) + 0.5
        la.backward(up)
        lb.backward(up)
        assert torch.equal(la, lb)
        assert torch.equal(a.grad[:, cols], b.grad)
        outside = a.grad.clone()
        outside[:, cols] = 0
        assert (outside == 0).all()  # nothing outside the view
    # the raw op keeps the row stride for dlogits
    x = base[:, 3:40]
    d = sl.margin_ce_fused(x, t, None, 64.0, 1.0, 0.5, 0.0, False, 0, -100, 1)
    assert d.stride() == x.stride()
    assert torch.equal(d, sl.margin_ce_fused(x.contiguous(), t, None, 64.0, 1.0, 0.5, 0.0, False, 0, -100, 1))

    zb, u = make_focal((4, 5, 6, 7), torch.float32, device, seed=34, ignored=(1,))
    u = u[::2]
    for view in (lambda b: b[::2], lambda b: b[::2].contiguous(memory_format=torch.channels_last)):
        a = zb.clone().requires_grad_(True)
        za = view(a)
        assert not za.is_contiguous()
        la = fusedloss.softmax_focal_loss(za, u, gamma=2.0, reduction=reduction)
        b = za.detach().contiguous().requires_grad_(True)
        lb = fusedloss.softmax_focal_loss(b, u, gamma=2.0, reduction=reduction)
        up = torch.rand(la.shape, device=device) + 0.5
        la.backward(up)
        lb.backward(up)
        assert torch.equal(la, lb)
        assert torch.equal(a.grad[::2], b.grad)
        assert (a.grad[1::2] == 0).all()
    z3 = zb.reshape(4, 5, 42)[::2]
    d = sl.softmax_focal_fused(z3, u.reshape(2, 42).contiguous(), None, None, 2.0, -100, 1)
    assert d.stride() == z3.stride()


@pytest.mark.parametrize("device", DEVICES)
def test_c_calls_per_path(device, monkeypatch):
    """Scalar loss, input requiring grad: one fused call in the forward, none in the backward (only
    the in-place scale); reduction none: forward, then fused with the per-position gradient; no
    grad: the forward only."""
    calls = []
    real = sl._sym

    def rec(name):
        calls.append(name)
        return real(name)
    monkeypatch.setattr(sl, "_sym", rec)
    sfx = "cuda" if device == "cuda" else "cpu"
    x, t = make_cosines(4, 25, torch.float32, device, seed=35)
    z, u = make_focal((2, 4, 3, 5), torch.float32, device, seed=36)
    for fn, a, b, fam in ((fusedloss.margin_cross_entropy, x, t, "margin_ce"),
                          (fusedloss.softmax_focal_loss, z, u, "softmax_focal")):
        calls.clear()
        ag = a.clone().requires_grad_(True)
        loss = fn(ag, b)
        assert calls == [f"fl_{fam}_fused_{sfx}"]
        loss.backward()
        assert calls == [f"fl_{fam}_fused_{sfx}"]
        calls.clear()
        fn(ag, b, reduction="none").sum().backward()
        assert calls == [f"fl_{fam}_forward_{sfx}", f"fl_{fam}_fused_{sfx}"]
        calls.clear()
        fn(a, b, reduction="mean")
        assert calls == [f"fl_{fam}_forward_{sfx}"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_empty(device, reduction):
    x = torch.randn(0, 11, device=device, requires_grad=True)
    t = torch.zeros(0, dtype=torch.long, device=device)
    z = torch.randn(2, 3, 0, 4, device=device, requires_grad=True)
    u = torch.zeros(2, 0, 4, dtype=torch.long, device=device)
    for loss, inp in ((fusedloss.margin_cross_entropy(x, t, reduction=reduction), x),
                      (fusedloss.softmax_focal_loss(z, u, reduction=reduction), z)):
        if reduction == "none":
            assert loss.numel() == 0
        elif reduction == "sum":
            assert loss.item() == 0.0
        else:
            assert torch.isnan(loss).item()
        loss.sum().backward()
        assert inp.grad.shape == inp.shape


# ---- autograd rules --------------------------------------------------------------------------------
def _both(device):
    x, t = make_cosines(4, 13, torch.float32, device, seed=37)
    z, u = make_focal((2, 5, 3), torch.float32, device, seed=38)
    return [(fusedloss.margin_cross_entropy, x, t), (fusedloss.softmax_focal_loss, z, u)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_double_backward_raises(device, reduction):
    for fn, a, b in _both(device):
        ag = a.clone().requires_grad_(True)
        loss = fn(ag, b, reduction=reduction).sum()
        with pytest.raises(RuntimeError, match="double backward"):
            (g,) = torch.autograd.grad(loss, ag, create_graph=True)
            g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_twice(device):
    for fn, a, b in _both(device):
        ag = a.clone().requires_grad_(True)
        loss = fn(ag, b)
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="only once"):
            loss.backward()
        ag.grad = None
        loss = fn(ag, b, reduction="none")  # the none path recomputes: twice is fine
        loss.sum().backward(retain_graph=True)
        g1 = ag.grad.clone()
        loss.sum().backward()
        torch.testing.assert_close(ag.grad, 2 * g1)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad(device):
    for fn, a, b in _both(device):
        ref = fn(a, b)
        ag = a.clone().requires_grad_(True)
        with torch.no_grad():
            l1 = fn(ag, b)
        l2 = fn(ag, b)
        assert not l1.requires_grad and l2.requires_grad
        assert torch.equal(l1, ref) and torch.equal(l2.detach(), ref)


# ---- torch.compile and opcheck ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph(device, dtype):
    x, t = make_cosines(8, 30, dtype, device, seed=39, ignored=(2,))
    z, u = make_focal((2, 6, 4, 5), dtype, device, seed=40, ignored=(3,))
    alpha = make_alpha("tensor", 6, device)
    arc = fusedloss.ArcFaceLoss(s=32.0)
    foc = fusedloss.SoftmaxFocalLoss(alpha=alpha, gamma=2.0).to(device)

    def f(a, b, c, d):
        return (arc(a, b) + 0.5 * fusedloss.margin_cross_entropy(a, b, s=32.0, m2=0.0, m3=0.35, reduction="none")
                .float().sum() + foc(c, d) + 0.25 * fusedloss.softmax_focal_loss(c, d, alpha=0.5, gamma=0.5,
                                                                                reduction="none").float().sum()
                + fusedloss.softmax_focal_loss(c[:, :, 0, 0], d[:, 0, 0], reduction="sum"))
    cf = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    za, zb = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    la, lb = f(xa, t, za, u), cf(xb, t, zb, u)
    (la * 0.7).backward()
    (lb * 0.7).backward()
    # eager scales the kept 16-bit gradient in place, inductor multiplies in its own fused order:
    # both round twice, so compare within the dtype's tolerance
    close(lb, la, TOL[dtype]["loss"], "compiled loss")
    close(xb.grad, xa.grad, TOL[dtype]["grad"], "compiled vs eager dcosine")
    close(zb.grad, za.grad, TOL[dtype]["grad"], "compiled vs eager dlogits")
    # and against the references
    xd, zd = x.double().cpu().requires_grad_(True), z.double().cpu().requires_grad_(True)
    tc, uc, ac = t.cpu(), u.cpu(), alpha.cpu()
    ref = (ref_insightface_arcface(xd, tc, s=32.0) + 0.5 * ref_cosface(xd, tc, s=32.0, m=0.35, reduction="none").sum()
           + ref_focal(zd, uc, alpha=ac) + 0.25 * ref_focal(zd, uc, alpha=0.5, gamma=0.5, reduction="none").sum()
           + ref_focal(zd[:, :, 0, 0], uc[:, 0, 0], reduction="sum"))
    (ref * 0.7).backward()
    close(xb.grad, xd.grad, TOL[dtype]["grad"], "compiled dcosine")
    close(zb.grad, zd.grad, TOL[dtype]["grad"], "compiled dlogits")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from torch.library import opcheck
    for dtype, (N, C), strided in [(torch.float32, (6, 9), False), (torch.bfloat16, (5, 12), True),
                                   (torch.float16, (4, 7), False)]:
        x, t = make_cosines(N, C + 3 if strided else C, dtype, device, seed=41, ignored=(1,))
        if strided:
            x = x[:, :C]
            t = t.clamp_max(C - 1)
            t[1] = -100
        for red in (0, 1, 2):
            args = (32.0, 1.0, 0.5 if red != 2 else 0.0, 0.0 if red != 2 else 0.35, red == 1, red % 2, -100, red)
            xg = x.detach().clone().requires_grad_(True) if not strided else x.detach().requires_grad_(True)
            opcheck(torch.ops.fusedloss.margin_ce_forward.default, (xg, t) + args)
            opcheck(torch.ops.fusedloss.margin_ce_forward.default, (x.detach(), t) + args)
            opcheck(torch.ops.fusedloss.margin_ce_loss_and_grad.default, (xg, t) + args)
            g = torch.rand(N if red == 0 else 1, device=device) + 0.5
            opcheck(torch.ops.fusedloss.margin_ce_fused.default, (x.detach(), t, g) + args)
            opcheck(torch.ops.fusedloss.margin_ce_fused.default, (x.detach(), t, None) + args)
    for dtype, shape, with_alpha in [(torch.float32, (6, 9), True), (torch.bfloat16, (2, 5, 12), True),
                                     (torch.float16, (3, 4, 6), False)]:
        z, u = make_focal(shape, dtype, device, seed=42, ignored=(1,))
        a = make_alpha("tensor", shape[1], device) if with_alpha else None
        for red in (0, 1, 2):
            args = (2.0 if red else 0.5, -100, red)
            zg = z.detach().clone().requires_grad_(True)
            opcheck(torch.ops.fusedloss.softmax_focal_forward.default, (zg, u, a) + args)
            opcheck(torch.ops.fusedloss.softmax_focal_loss_and_grad.default, (zg, u, a) + args)
            g = torch.rand(u.numel() if red == 0 else 1, device=device) + 0.5
            opcheck(torch.ops.fusedloss.softmax_focal_fused.default, (z.detach(), u, a, g) + args)
            opcheck(torch.ops.fusedloss.softmax_focal_fused.default, (z.detach(), u, a, None) + args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("red", [0, 1, 2])
def test_raw_ops_agree(device, red):
    x, t = make_cosines(6, 33, torch.float32, device, seed=43, ignored=(2,))
    z, u = make_focal((3, 5, 7), torch.float32, device, seed=44, ignored=(2,))
    a = make_alpha("tensor", 5, device)
    margs = (48.0, 1.0, 0.4, 0.05, False, 0, -100, red)
    fargs = (1.5, -100, red)
    for fwd, fused, lg, inp, n in (
            (lambda: sl.margin_ce_forward(x, t, *margs), lambda g: sl.margin_ce_fused(x, t, g, *margs),
             lambda: sl.margin_ce_loss_and_grad(x, t, *margs), x, 6),
            (lambda: sl.softmax_focal_forward(z, u, a, *fargs), lambda g: sl.softmax_focal_fused(z, u, a, g, *fargs),
             lambda: sl.softmax_focal_loss_and_grad(z, u, a, *fargs), z, 21)):
        loss = fwd()
        loss2, d1 = lg()
        torch.testing.assert_close(loss, loss2, rtol=1e-6, atol=0)
        torch.testing.assert_close(fused(None), d1, rtol=1e-6, atol=0)
        ones = torch.ones(n if red == 0 else 1, device=device)
        torch.testing.assert_close(fused(ones), d1, rtol=1e-6, atol=0)
        g = torch.rand(n if red == 0 else 1, device=device) + 0.5
        if red == 0:
            gb = g.reshape(-1, 1) if inp.dim() == 2 else g.reshape(3, 1, 7)
        else:
            gb = g
        torch.testing.assert_close(fused(g), d1 * gb, rtol=1e-5, atol=1e-9)
        assert loss.dtype == torch.float32 and d1.shape == inp.shape


# ---- bad arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_margin(device):
    x, t = make_cosines(4, 10, torch.float32, device, seed=45, ignored=())
    mce = fusedloss.margin_cross_entropy
    for v in (0.0, -1.0, float("inf"), float("nan"), 1e39):  # 1e39: fp32 overflow
        with pytest.raises(ValueError, match="s \\(the scale\\)"):
            mce(x, t, s=v)
    for v in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="m1"):
            mce(x, t, m1=v)
    for v in (-0.1, math.pi, 3.14159265, 4.0, float("nan")):  # 3.14159265 rounds to an fp32 above pi
        with pytest.raises(ValueError, match="m2"):
            mce(x, t, m2=v)
    for v in (-0.1, float("inf")):
        with pytest.raises(ValueError, match="m3"):
            mce(x, t, m3=v)
    with pytest.raises(ValueError, match="grad_mode"):
        mce(x, t, grad_mode="approx")
    with pytest.raises(ValueError, match="reduction"):
        mce(x, t, reduction="avg")
    with pytest.raises(ValueError, match="m2"):
        fusedloss.ArcFaceLoss(m=3.5)
    with pytest.raises(ValueError, match="s \\(the scale\\)"):
        fusedloss.CosFaceLoss(s=0)
    with pytest.raises(ValueError, match="target shape"):
        mce(x, t[:3])
    with pytest.raises(TypeError, match="target"):
        mce(x, t.float())
    with pytest.raises(TypeError, match="floating-point"):
        mce(t[:, None].expand(4, 10).contiguous(), t)
    with pytest.raises(TypeError):
        mce(x.cpu().numpy(), t)
    with pytest.raises(ValueError, match="C"):
        mce(x[:, :0], t)
    if device == "cpu":  # out-of-range targets raise on CPU (CUDA: NaN + the device flag)
        bad = t.clone()
        bad[2] = 10
        with pytest.raises(IndexError, match="targets\\[2\\]"):
            mce(x, bad)
        with pytest.raises(fusedloss.TargetOutOfRangeError):
            mce(x.clone().requires_grad_(True), bad)
    # the raw ops
    with pytest.raises(ValueError, match="2-D"):
        sl.margin_ce_forward(x.reshape(2, 2, 10), t.reshape(2, 2), 64.0, 1.0, 0.5, 0.0, False, 0, -100, 1)
    with pytest.raises(ValueError, match="grad_mode"):
        sl.margin_ce_forward(x, t, 64.0, 1.0, 0.5, 0.0, False, 2, -100, 1)
    with pytest.raises(ValueError, match="reduction"):
        sl.margin_ce_forward(x, t, 64.0, 1.0, 0.5, 0.0, False, 0, -100, 3)
    with pytest.raises(ValueError, match="grad"):
        sl.margin_ce_fused(x, t, torch.ones(4, device=device), 64.0, 1.0, 0.5, 0.0, False, 0, -100, 1)
    with pytest.raises(ValueError, match="column stride"):
        sl.margin_ce_forward(x.t().contiguous().t(), t, 64.0, 1.0, 0.5, 0.0, False, 0, -100, 1)
    with pytest.raises(TypeError, match="target dtype"):
        sl.margin_ce_forward(x, t.to(torch.int16), 64.0, 1.0, 0.5, 0.0, False, 0, -100, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments_focal(device):
    z, u = make_focal((2, 5, 3, 4), torch.float32, device, seed=46, ignored=())
    sfl = fusedloss.softmax_focal_loss
    for v in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="gamma"):
            sfl(z, u, gamma=v)
    with pytest.raises(ValueError, match="reduction"):
        sfl(z, u, reduction="batchmean")
    with pytest.raises(ValueError, match="target shape"):
        sfl(z, u.transpose(1, 2))
    with pytest.raises(ValueError, match="target shape"):
        sfl(z, u.reshape(2, 12))
    with pytest.raises(ValueError, match="alpha"):
        sfl(z, u, alpha=torch.ones(4, device=device))
    with pytest.raises(TypeError, match="alpha"):
        sfl(z, u, alpha="balanced")
    with pytest.raises(TypeError, match="target"):
        sfl(z, u.float())
    with pytest.raises(ValueError, match="0-d"):
        sfl(z[0, 0, 0], u[0, 0])
    with pytest.raises(ValueError, match="gamma"):
        fusedloss.SoftmaxFocalLoss(gamma=-2)
    if device == "cpu":
        bad = u.clone()
        bad[1, 2, 3] = 5
        with pytest.raises(IndexError, match="position n = 1, k = 11"):
            sfl(z, bad)
    # the raw ops
    z3, u2 = z.reshape(2, 5, 12), u.reshape(2, 12)
    with pytest.raises(ValueError, match="2-D \\[N, C\\] or 3-D"):
        sl.softmax_focal_forward(z, u, None, 2.0, -100, 1)
    with pytest.raises(ValueError, match="alpha"):
        sl.softmax_focal_forward(z3, u2, torch.ones(5, dtype=torch.float64, device=device), 2.0, -100, 1)
    with pytest.raises(ValueError, match="target must have shape"):
        sl.softmax_focal_forward(z3, u2.reshape(-1), None, 2.0, -100, 1)
    with pytest.raises(ValueError, match="strides"):
        sl.softmax_focal_forward(z3.transpose(1, 2).contiguous().transpose(1, 2), u2, None, 2.0, -100, 1)
    with pytest.raises(ValueError, match="grad"):
        sl.softmax_focal_fused(z3, u2, None, torch.ones(3, device=device), 2.0, -100, 0)


# ---- CUDA specifics ---------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("grad_mode", [0, 1])
def test_cuda_matches_cpu_margin(grad_mode):
    x, t = make_cosines(7, 20000, torch.bfloat16, "cpu", seed=47, ignored=(3,))
    args = (64.0, 1.0, 0.5, 0.0, False, grad_mode, -100, 0)
    lc, dc = sl.margin_ce_loss_and_grad(x, t, *args)
    lg, dg = sl.margin_ce_loss_and_grad(x.cuda(), t.cuda(), *args)
    torch.testing.assert_close(lg.cpu(), lc, rtol=1e-4, atol=1e-5)
    close(dg, dc.float(), TOL[torch.bfloat16]["grad"], "cuda vs cpu dcosine")


@needs_cuda
@pytest.mark.parametrize("shape", [(9, 1000), (2, 19, 64, 32)])
def test_cuda_matches_cpu_focal(shape):
    z, u = make_focal(shape, torch.float32, "cpu", seed=48, ignored=(3,))
    z3 = z if len(shape) == 2 else z.reshape(shape[0], shape[1], -1)
    u2 = u if len(shape) == 2 else u.reshape(shape[0], -1)
    a = make_alpha("tensor", shape[1], "cpu")
    args = (2.0, -100, 0)
    lc, dc = sl.softmax_focal_loss_and_grad(z3, u2, a, *args)
    lg, dg = sl.softmax_focal_loss_and_grad(z3.cuda(), u2.cuda(), a.cuda(), *args)
    torch.testing.assert_close(lg.cpu(), lc, rtol=1e-4, atol=1e-6)
    close(dg, dc, TOL[torch.float32]["grad"], "cuda vs cpu dlogits")


@needs_cuda
def test_cuda_side_stream():
    x, t = make_cosines(8, 5000, torch.float32, "cuda", seed=49)
    z, u = make_focal((2, 19, 32, 32), torch.float32, "cuda", seed=50)
    ref = (fusedloss.margin_cross_entropy(x, t), fusedloss.softmax_focal_loss(z, u))
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        got = (fusedloss.margin_cross_entropy(x, t), fusedloss.softmax_focal_loss(z, u))
    torch.cuda.current_stream().wait_stream(st)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@needs_cuda
def test_cuda_out_of_range_flag():
    x, t = make_cosines(4, 10, torch.float32, "cuda", seed=51, ignored=())
    t[1] = 10
    loss = fusedloss.margin_cross_entropy(x, t, reduction="none")
    assert torch.isnan(loss[1]).item() and torch.isfinite(loss[[0, 2, 3]]).all()
    with pytest.raises(fusedloss.TargetOutOfRangeError):
        fusedloss.check_errors()
    fusedloss.check_errors()  # reset
