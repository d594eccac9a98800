"""Tests of fusedloss.taylor_cross_entropy / TaylorCrossEntropyLoss (fusedloss.taylor, the op of
include/fusedloss.h section 14).

Against an independent float64 reference written from pytorch-loss's TaylorSoftmax (fn = 1 +
sum_i x^i / i!, p = fn / fn.sum(dim=1)) and the negative log of p at the target (gather, mask,
reduce: no F.nll_loss), gradients by autograd, evaluated on the same (rounded) inputs: order 2 and
4, every reduction, fp32 / fp16 / bf16 (the C op) and float64 (the PyTorch formulation), C = 37 and
3000 (CUDA: the one-warp and the one-CTA-per-row kernels), ignored rows (some, all: mean NaN),
ignore_index -1 / a class id, [N, C, H, W] / [N, C, d] / [C] inputs, upstream gradients != 1
(reduction none: a random per-element upstream), gradient accumulation, non-contiguous inputs, the
C calls each path makes, torch.compile(fullgraph=True) (aot_eager on CPU), torch.library.opcheck on
the three ops, double backward refused, bad arguments, out-of-range targets (CPU raises; CUDA: NaN
and the device error flag). CUDA cases skip without a GPU (and a CUDA build of the library).

Run (CPU): make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_taylor.py
"""
import pytest

torch = pytest.importorskip("torch")

import fusedloss  # noqa: E402
from fusedloss import taylor as tl  # noqa: E402
from _zoo_util import DEVICES, close, needs_cuda  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
REDS = ["none", "sum", "mean"]
RED_CODE = {"none": 0, "mean": 1, "sum": 2}

# (atol, rtol): |got - ref| <= atol * max|ref| + rtol * |ref| (see _zoo_util.close). The loss is
# computed in double (CPU) / fp32 (CUDA) and rounded once to the dtype; so is the gradient, and an
# upstream gradient != 1 of a scalar loss rounds it a second time (the in-place scale).
TOL = {
    torch.float32: {"loss": (1e-5, 2e-5), "grad": (3e-5, 1e-4)},
    torch.float16: {"loss": (1e-5, 2e-3), "grad": (3e-4, 2e-3)},
    torch.bfloat16: {"loss": (1e-5, 1.6e-2), "grad": (3e-3, 1.6e-2)},
    torch.float64: {"loss": (1e-12, 1e-10), "grad": (1e-12, 1e-10)},
}


# ---- reference (float64) ---------------------------------------------------------------------------
def ref_taylor_softmax(x, n):
    """pytorch-loss's TaylorSoftmax(dim=1, n) forward, as written there."""
    fn = torch.ones_like(x)
    denor = 1.0
    for i in range(1, n + 1):
        denor *= i
        fn = fn + x.pow(i) / denor
    return fn / fn.sum(dim=1, keepdim=True)


def ref_loss(x, t, order=2, ignore_index=-100, reduction="mean"):
    """x [N, C, ...] float64, t [N, ...]: -log p_y, ignored positions 0, reduced (mean over kept)."""
    logp = ref_taylor_softmax(x, order).log()
    t = t.long()
    keep = t != ignore_index
    tc = torch.where(keep, t, torch.zeros_like(t))
    l = -logp.gather(1, tc.unsqueeze(1)).squeeze(1)
    l = torch.where(keep, l, torch.zeros((), dtype=l.dtype))
    if reduction == "none":
        return l
    if reduction == "sum":
        return l.sum()
    return l.sum() / keep.sum()


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
    loss = fusedloss.taylor_cross_entropy(xg, t, **kw)
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
    ref, rg = ref_run(x, t, up, **kw)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(gx, rg, TOL[dtype]["grad"], "dlogits")
    return loss, gx


# ---- against the reference ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", [2, 4])
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("N,C", [(13, 37), (5, 3000)])
def test_vs_reference(device, dtype, order, reduction, N, C):
    x, t = make((N, C), dtype, device, seed=N * C + order, ignored=(2,))
    loss, gx = check(x, t, order=order, reduction=reduction)
    assert (gx[2] == 0).all()
    if reduction == "none":
        assert loss.shape == (N,) and loss[2].item() == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", [2, 4])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_upstream_one(device, dtype, order, reduction):
    """loss.backward() (upstream 1: the gradient formed in the forward is used as is)."""
    x, t = make((9, 50), dtype, device, seed=3 + order, ignored=())
    check(x, t, upstream="one", order=order, reduction=reduction)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", [2, 4])
@pytest.mark.parametrize("scale", [0.05, 8.0, 40.0])
def test_logit_ranges(device, order, scale):
    """Tiny logits (f ~ 1 + x: p close to uniform) and large ones (the polynomial regime)."""
    x, t = make((16, 64), torch.float32, device, seed=5, ignored=(3,), scale=scale)
    for red in REDS:
        check(x, t, order=order, reduction=red)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ignore_index", [-1, 3])
def test_ignore_index_values(device, ignore_index):
    """pytorch-loss's -1 and a class id (rows of class 3 are then ignored)."""
    x, t = make((40, 6), torch.float32, device, seed=6, ignored=(0, 7), ignore_index=ignore_index)
    assert (t == ignore_index).sum() >= 2
    for red in REDS:
        loss, gx = check(x, t, ignore_index=ignore_index, reduction=red)
        assert (gx[t == ignore_index] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", REDS)
def test_all_ignored(device, dtype, reduction):
    x, t = make((5, 8), dtype, device, seed=8, ignored=range(5))
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.taylor_cross_entropy(xg, t, reduction=reduction)
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
    lb = fusedloss.taylor_cross_entropy(xg, tb, reduction=reduction)
    lb.sum().backward()
    assert torch.isfinite(lb).all() and torch.isfinite(xg.grad).all()
    assert (xg.grad[1:] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", REDS)
def test_nchw_and_other_shapes(device, dtype, reduction):
    """[N, C, H, W] maps (class dimension 1), [N, C, d] and one unbatched sample [C]."""
    for shape, seed in (((2, 5, 3, 4), 9), ((3, 7, 6), 10)):
        x, t = make(shape, dtype, device, seed=seed, ignored=(1, 5))
        loss, gx = check(x, t, order=4 if seed == 9 else 2, reduction=reduction)
        if reduction == "none":
            assert loss.shape == t.shape
    x, t = make((11,), dtype, device, seed=11, ignored=())
    loss, gx = check(x, t, reduction=reduction)
    assert loss.shape == ()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_target_dtypes(device, index_dtype):
    x, t = make((7, 9), torch.float32, device, seed=12, ignored=(), index_dtype=torch.int64)
    ref = fusedloss.taylor_cross_entropy(x, t, reduction="none")
    got = fusedloss.taylor_cross_entropy(x, t.to(index_dtype), reduction="none")
    assert torch.equal(got, ref)


def test_module():
    m = fusedloss.TaylorCrossEntropyLoss(order=4, ignore_index=-1, reduction="sum")
    assert repr(m) == "TaylorCrossEntropyLoss(order=4, ignore_index=-1, reduction='sum')"
    x, t = make((6, 10), torch.float32, "cpu", seed=13, ignored=(2,), ignore_index=-1)
    assert torch.equal(m(x, t), fusedloss.taylor_cross_entropy(x, t, order=4, ignore_index=-1, reduction="sum"))
    d = fusedloss.TaylorCrossEntropyLoss()
    assert (d.order, d.ignore_index, d.reduction) == (2, -100, "mean")
    assert isinstance(d, torch.nn.Module)


def test_meta_device():
    x = torch.empty(4, 6, device="meta")
    t = torch.zeros(4, dtype=torch.long, device="meta")
    assert fusedloss.taylor_cross_entropy(x, t).shape == ()
    assert fusedloss.taylor_cross_entropy(x, t, reduction="none").shape == (4,)


# ---- accumulation, layouts, C calls -------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_gradient_accumulation(device, reduction):
    x, t = make((6, 40), torch.float32, device, seed=14, ignored=(0,))
    t2 = make((6, 40), torch.float32, device, seed=15, ignored=(1,))[1]
    xg = x.clone().requires_grad_(True)
    for tt, w, order in ((t, 1.0, 2), (t2, 0.5, 4)):
        (fusedloss.taylor_cross_entropy(xg, tt, order=order, reduction=reduction).sum() * w).backward()
    xd = x.double().cpu().requires_grad_(True)
    sum(ref_loss(xd, tt.cpu(), order=order, reduction=reduction).sum() * w
        for tt, w, order in ((t, 1.0, 2), (t2, 0.5, 4))).backward()
    close(xg.grad, xd.grad, TOL[torch.float32]["grad"], "accumulated dlogits")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_non_contiguous(device, reduction):
    """A column slice (row stride > C: passed as ld, no copy), a transposed input (made contiguous),
    channels_last maps: results and gradients equal those of contiguous copies."""
    base = make((6, 50), torch.float32, device, seed=16, ignored=())[0]
    t = make((6, 37), torch.float32, device, seed=17, ignored=(4,))[1]
    for view, cols in ((lambda b: b[:, 3:40], slice(3, 40)), (lambda b: b.t().contiguous().t()[:, 5:42], slice(5, 42))):
        a = base.clone().requires_grad_(True)
        xa = view(a)
        assert not xa.is_contiguous()
        la = fusedloss.taylor_cross_entropy(xa, t, reduction=reduction)
        b = xa.detach().contiguous().requires_grad_(True)
        lb = fusedloss.taylor_cross_entropy(b, t, reduction=reduction)
        up = torch.rand(la.shape, device=device) + 0.5
        la.backward(up)
        lb.backward(up)
        assert torch.equal(la, lb)
        assert torch.equal(a.grad[:, cols], b.grad)
        outside = a.grad.clone()
        outside[:, cols] = 0
        assert (outside == 0).all()
    # the raw op keeps the row stride for dlogits (padding columns not written)
    x = base[:, 3:40]
    d = tl.taylor_ce_fused(x, t, None, 2, -100, 1)
    assert d.stride() == x.stride()
    assert torch.equal(d, tl.taylor_ce_fused(x.contiguous(), t, None, 2, -100, 1))
    z, u = make((4, 5, 6, 7), torch.float32, device, seed=18, ignored=(3,))
    for strided in (False, True):  # channels_last maps; a batch slice of a map
        a = z.clone().requires_grad_(True)
        za = a[::2] if strided else a.contiguous(memory_format=torch.channels_last)
        uu = u[::2] if strided else u
        assert not za.is_contiguous()
        la = fusedloss.taylor_cross_entropy(za, uu, reduction=reduction)
        b = za.detach().contiguous().requires_grad_(True)
        lb = fusedloss.taylor_cross_entropy(b, uu, reduction=reduction)
        up = torch.rand(la.shape, device=device) + 0.5
        la.backward(up)
        lb.backward(up)
        assert torch.equal(la, lb)
        assert torch.equal(a.grad[::2] if strided else a.grad, b.grad)
        if strided:
            assert (a.grad[1::2] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_c_calls_per_path(device, monkeypatch):
    """Scalar loss, input requiring grad: one fused call in the forward, none in the backward (only
    the in-place scale); reduction none: forward, then fused with the per-row gradient; no grad:
    the forward only."""
    calls = []
    real = tl._sym

    def rec(name):
        calls.append(name)
        return real(name)
    monkeypatch.setattr(tl, "_sym", rec)
    sfx = "cuda" if device == "cuda" else "cpu"
    x, t = make((4, 25), torch.float32, device, seed=19)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.taylor_cross_entropy(xg, t)
    assert calls == [f"fl_taylor_ce_fused_{sfx}"]
    loss.backward()
    assert calls == [f"fl_taylor_ce_fused_{sfx}"]
    calls.clear()
    fusedloss.taylor_cross_entropy(xg, t, reduction="none").sum().backward()
    assert calls == [f"fl_taylor_ce_forward_{sfx}", f"fl_taylor_ce_fused_{sfx}"]
    calls.clear()
    fusedloss.taylor_cross_entropy(x, t, reduction="sum")
    assert calls == [f"fl_taylor_ce_forward_{sfx}"]
    calls.clear()
    fusedloss.taylor_cross_entropy(x.double(), t)  # the PyTorch formulation: no C call
    assert calls == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_empty(device, reduction):
    for x, t in ((torch.randn(0, 11, device=device, requires_grad=True),
                  torch.zeros(0, dtype=torch.long, device=device)),
                 (torch.randn(2, 3, 0, 4, device=device, requires_grad=True),
                  torch.zeros(2, 0, 4, dtype=torch.long, device=device))):
        loss = fusedloss.taylor_cross_entropy(x, t, reduction=reduction)
        if reduction == "none":
            assert loss.shape == t.shape
        elif reduction == "sum":
            assert loss.item() == 0.0
        else:
            assert torch.isnan(loss).item()
        loss.sum().backward()
        assert x.grad.shape == x.shape


# ---- autograd rules --------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_double_backward_raises(device, reduction):
    x, t = make((4, 13), torch.float32, device, seed=20)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.taylor_cross_entropy(xg, t, reduction=reduction).sum()
    with pytest.raises(RuntimeError, match="double backward"):
        (g,) = torch.autograd.grad(loss, xg, create_graph=True)
        g.sum().backward()
    # the float64 PyTorch formulation does support it
    xd = x.double().requires_grad_(True)
    (g,) = torch.autograd.grad(fusedloss.taylor_cross_entropy(xd, t, reduction=reduction).sum(), xd,
                               create_graph=True)
    g.pow(2).sum().backward()
    assert torch.isfinite(xd.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_backward_twice(device):
    x, t = make((5, 9), torch.float32, device, seed=21)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.taylor_cross_entropy(xg, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()
    xg.grad = None
    loss = fusedloss.taylor_cross_entropy(xg, t, reduction="none")  # the none path recomputes: twice is fine
    loss.sum().backward(retain_graph=True)
    g1 = xg.grad.clone()
    loss.sum().backward()
    torch.testing.assert_close(xg.grad, 2 * g1)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad(device):
    x, t = make((5, 9), torch.float32, device, seed=22)
    ref = fusedloss.taylor_cross_entropy(x, t)
    xg = x.clone().requires_grad_(True)
    with torch.no_grad():
        l1 = fusedloss.taylor_cross_entropy(xg, t)
    l2 = fusedloss.taylor_cross_entropy(xg, t)
    assert not l1.requires_grad and l2.requires_grad
    assert torch.equal(l1, ref) and torch.equal(l2.detach(), ref)


# ---- torch.compile and opcheck ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph(device, dtype):
    x, t = make((8, 30), dtype, device, seed=23, ignored=(2,))
    z, u = make((2, 6, 4, 5), dtype, device, seed=24, ignored=(3,))
    crit = fusedloss.TaylorCrossEntropyLoss(order=4)

    def f(a, b, c, d):
        return (fusedloss.taylor_cross_entropy(a, b) + crit(a, b)
                + 0.5 * fusedloss.taylor_cross_entropy(a, b, reduction="none").float().sum()
                + 0.25 * fusedloss.taylor_cross_entropy(c, d, order=4, reduction="none").float().sum()
                + fusedloss.taylor_cross_entropy(c, d, reduction="sum"))
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
    ref = (ref_loss(xd, tc) + ref_loss(xd, tc, order=4) + 0.5 * ref_loss(xd, tc, reduction="none").sum()
           + 0.25 * ref_loss(zd, uc, order=4, reduction="none").sum() + ref_loss(zd, uc, reduction="sum"))
    (ref * 0.7).backward()
    close(xb.grad, xd.grad, TOL[dtype]["grad"], "compiled dlogits (rows)")
    close(zb.grad, zd.grad, TOL[dtype]["grad"], "compiled dlogits (maps)")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from torch.library import opcheck
    for dtype, (N, C), strided in [(torch.float32, (6, 9), False), (torch.bfloat16, (5, 12), True),
                                   (torch.float16, (4, 7), False)]:
        x, t = make((N, C + 3 if strided else C), dtype, device, seed=25, ignored=(1,))
        if strided:
            x = x[:, :C]
            t = t.clamp_max(C - 1)
            t[1] = -100
        for red in (0, 1, 2):
            args = (2 if red != 2 else 4, -100, red)
            xg = x.detach().clone().requires_grad_(True) if not strided else x.detach().requires_grad_(True)
            opcheck(torch.ops.fusedloss.taylor_ce_forward.default, (xg, t) + args)
            opcheck(torch.ops.fusedloss.taylor_ce_forward.default, (x.detach(), t) + args)
            opcheck(torch.ops.fusedloss.taylor_ce_loss_and_grad.default, (xg, t) + args)
            g = torch.rand(N if red == 0 else 1, device=device) + 0.5
            opcheck(torch.ops.fusedloss.taylor_ce_fused.default, (x.detach(), t, g) + args)
            opcheck(torch.ops.fusedloss.taylor_ce_fused.default, (x.detach(), t, None) + args)
            opcheck(torch.ops.fusedloss.taylor_ce_forward.default, (x.detach(), t.int()) + args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("red", [0, 1, 2])
@pytest.mark.parametrize("order", [2, 4])
def test_raw_ops_agree(device, red, order):
    x, t = make((6, 33), torch.float32, device, seed=26, ignored=(2,))
    args = (order, -100, red)
    loss = tl.taylor_ce_forward(x, t, *args)
    loss2, d1 = tl.taylor_ce_loss_and_grad(x, t, *args)
    assert loss.dtype == torch.float32 and loss.shape == ((6,) if red == 0 else ())
    assert d1.shape == x.shape and d1.dtype == x.dtype
    torch.testing.assert_close(loss, loss2, rtol=1e-6, atol=0)
    torch.testing.assert_close(tl.taylor_ce_fused(x, t, None, *args), d1, rtol=1e-6, atol=0)
    ones = torch.ones(6 if red == 0 else 1, device=device)
    torch.testing.assert_close(tl.taylor_ce_fused(x, t, ones, *args), d1, rtol=1e-6, atol=0)
    g = torch.rand(6 if red == 0 else 1, device=device) + 0.5
    gb = g.reshape(-1, 1) if red == 0 else g
    torch.testing.assert_close(tl.taylor_ce_fused(x, t, g, *args), d1 * gb, rtol=1e-5, atol=1e-9)
    # the header's closed form: dx_j = g (f'(x_j) / S - [j == y] f'(x_y) / f(x_y)), f'_n = f_{n-1}
    xd = x.double().cpu()
    f = tl._taylor_f(xd, order)
    df = 1 + xd + (xd * xd / 2 + xd ** 3 / 6 if order == 4 else 0)
    S = f.sum(1, keepdim=True)
    tc = t.cpu().clamp_min(0)
    want = df / S
    want.scatter_add_(1, tc[:, None], -(df.gather(1, tc[:, None]) / f.gather(1, tc[:, None])))
    want[t.cpu() == -100] = 0
    if red == 1:
        want = want / (t != -100).sum().item()
    close(d1, want, TOL[torch.float32]["grad"], "dlogits vs the header's formula")


def test_workspace_size():
    L = fusedloss._lib
    none = L.taylor_options(reduction=L.FL_REDUCTION_NONE)
    assert L.taylor_ce_workspace_size(1000, 50, L.FL_DTYPE_F32, none) == 0
    sizes = [L.taylor_ce_workspace_size(N, 50, L.FL_DTYPE_BF16, L.taylor_options(reduction=r))
             for N in (0, 1, 1000) for r in (L.FL_REDUCTION_MEAN, L.FL_REDUCTION_SUM)]
    assert all(s > 0 for s in sizes)
    assert sizes[4] >= sizes[0] + 4 * 1000
    assert L.taylor_ce_workspace_size(10, 5, 0) == L.taylor_ce_workspace_size(10, 5, 0, L.taylor_options())
    with pytest.raises(fusedloss.FusedLossError, match="order"):
        L.taylor_ce_workspace_size(10, 5, 0, L.taylor_options(order=3))
    assert L.TaylorOptions().__class__.__name__ == "TaylorOptions"


# ---- bad arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    x, t = make((4, 10), torch.float32, device, seed=27, ignored=())
    tce = fusedloss.taylor_cross_entropy
    for v in (3, 0, 1, 6, -2, True, "2", None, 2.5):
        with pytest.raises(ValueError, match="order"):
            tce(x, t, order=v)
    with pytest.raises(ValueError, match="order"):
        fusedloss.TaylorCrossEntropyLoss(order=3)
    with pytest.raises(ValueError, match="reduction"):
        tce(x, t, reduction="avg")
    with pytest.raises(ValueError, match="reduction"):
        fusedloss.TaylorCrossEntropyLoss(reduction="batchmean")
    with pytest.raises(ValueError, match="target shape"):
        tce(x, t[:3])
    with pytest.raises(ValueError, match="target shape"):
        tce(x, t[:, None])
    with pytest.raises(ValueError, match="target shape"):
        tce(x.reshape(2, 2, 10), t.reshape(2, 2))  # [N, C, d]: the class dimension is 1
    with pytest.raises(TypeError, match="target"):
        tce(x, t.float())
    with pytest.raises(TypeError, match="target"):
        tce(x, t > 0)
    with pytest.raises(TypeError, match="floating-point"):
        tce(t[:, None].expand(4, 10).contiguous(), t)
    with pytest.raises(TypeError):
        tce(x.cpu().numpy(), t)
    with pytest.raises(ValueError, match="0-d"):
        tce(x[0], t[:1])
    with pytest.raises(ValueError, match="0-d"):
        tce(x[0, 0], t[0])
    with pytest.raises(ValueError, match="C"):
        tce(x[:, :0], t)
    # the raw ops
    with pytest.raises(ValueError, match="2-D"):
        tl.taylor_ce_forward(x.reshape(2, 2, 10), t.reshape(2, 2), 2, -100, 1)
    with pytest.raises(ValueError, match="order"):
        tl.taylor_ce_forward(x, t, 3, -100, 1)
    with pytest.raises(ValueError, match="reduction"):
        tl.taylor_ce_forward(x, t, 2, -100, 3)
    with pytest.raises(ValueError, match="grad"):
        tl.taylor_ce_fused(x, t, torch.ones(4, device=device), 2, -100, 1)
    with pytest.raises(ValueError, match="grad"):
        tl.taylor_ce_fused(x, t, torch.ones(1, device=device, dtype=torch.float64), 2, -100, 0)
    with pytest.raises(ValueError, match="column stride"):
        tl.taylor_ce_forward(x.t().contiguous().t(), t, 2, -100, 1)
    with pytest.raises(TypeError, match="target dtype"):
        tl.taylor_ce_forward(x, t.to(torch.int16), 2, -100, 1)
    with pytest.raises(TypeError, match="logits dtype"):
        tl.taylor_ce_forward(x.double(), t, 2, -100, 1)
    with pytest.raises(ValueError, match="target must have shape"):
        tl.taylor_ce_loss_and_grad(x, t[:2], 2, -100, 1)


@pytest.mark.parametrize("reduction", REDS)
def test_out_of_range_cpu(reduction):
    """CPU: TargetOutOfRangeError (an IndexError) from the C status, nothing returned; on every path
    (forward, fused with a gradient needed, the float64 PyTorch formulation)."""
    x, t = make((4, 10), torch.float32, "cpu", seed=28, ignored=())
    for bad_value in (10, -1, 1 << 40):
        bad = t.clone()
        bad[2] = bad_value
        with pytest.raises(IndexError, match="targets\\[2\\]"):
            fusedloss.taylor_cross_entropy(x, bad, reduction=reduction)
        with pytest.raises(fusedloss.TargetOutOfRangeError):
            fusedloss.taylor_cross_entropy(x.clone().requires_grad_(True), bad, reduction=reduction)
        with pytest.raises(fusedloss.TargetOutOfRangeError, match="targets\\[2\\]"):
            fusedloss.taylor_cross_entropy(x.double(), bad, reduction=reduction)
    bad = t.clone()
    bad[3] = 10
    with pytest.raises(fusedloss.TargetOutOfRangeError, match="targets\\[3\\]"):
        tl.taylor_ce_fused(x, bad.int(), None, 2, -100, RED_CODE[reduction])
    with pytest.raises(fusedloss.TargetOutOfRangeError):
        tl.taylor_ce_loss_and_grad(x, bad, 4, -100, RED_CODE[reduction])


# ---- CUDA specifics ---------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("reduction", REDS)
def test_cuda_out_of_range_flag(reduction):
    """CUDA: no host sync; the bad row's loss and gradient are NaN, the device error flag is set."""
    x, t = make((4, 10), torch.float32, "cuda", seed=29, ignored=())
    fusedloss.check_errors()  # start clean
    t[1] = 10
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.taylor_cross_entropy(xg, t, reduction=reduction)
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


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("C", [1, 31, 1000, 1024, 1025, 20000])
@pytest.mark.parametrize("order", [2, 4])
def test_cuda_matches_cpu(dtype, C, order):
    x, t = make((9, C), dtype, "cpu", seed=30 + C, ignored=(3,))
    for red in (0, 1, 2):
        args = (order, -100, red)
        lc, dc = tl.taylor_ce_loss_and_grad(x, t, *args)
        lg, dg = tl.taylor_ce_loss_and_grad(x.cuda(), t.cuda(), *args)
        if C == 1:  # p = 1: loss and gradient 0 (up to a rounding of f / S)
            assert lg.abs().max().item() < 1e-6 and dg.float().abs().max().item() < 1e-6
            continue
        close(lg, lc, (1e-6, 1e-5), "cuda vs cpu loss")
        close(dg, dc.float(), TOL[dtype]["grad"], "cuda vs cpu dlogits")
        lf = tl.taylor_ce_forward(x.cuda(), t.cuda(), *args)
        if C <= 1024:  # one warp kernel for both passes: the same sums, bitwise
            assert torch.equal(lg, lf)
        else:  # sm_90's fused call takes the ring kernel (its own summation order), forward the CTA kernel
            close(lf, lg, (1e-6, 2e-6), "cuda forward vs fused loss")


@needs_cuda
def test_cuda_side_stream_graph_and_determinism():
    x, t = make((64, 3000), torch.bfloat16, "cuda", seed=31, ignored=(5, 9))
    ref = fusedloss.taylor_cross_entropy(x, t)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        got = fusedloss.taylor_cross_entropy(x, t)
    torch.cuda.current_stream().wait_stream(st)
    assert torch.equal(got, ref)
    for C in (300, 3000):
        x, t = make((64, C), torch.float32, "cuda", seed=32, ignored=(5,))
        args = (2, -100, 1)
        l1, g1 = tl.taylor_ce_loss_and_grad(x, t, *args)
        l2, g2 = tl.taylor_ce_loss_and_grad(x, t, *args)
        assert torch.equal(l1, l2) and torch.equal(g1, g2)  # bitwise, run to run
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(graph):
                l3, g3 = tl.taylor_ce_loss_and_grad(x, t, *args)
        torch.cuda.current_stream().wait_stream(s)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(l3, l1) and torch.equal(g3, g1)
