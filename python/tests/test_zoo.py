"""Tests of fusedloss.sigmoid_focal_loss / binary_cross_entropy_with_logits (fusedloss.zoo, the
ops of include/fusedloss.h section 9) against torchvision's formula re-implemented here and
F.binary_cross_entropy_with_logits, both evaluated in float64 on the same (rounded) inputs:
loss and input gradient, every dtype x reduction x option (alpha on/off, gamma 0 / 0.5 / 1 / 2,
soft and hard targets, weight / pos_weight of [C] and other broadcast layouts), the gamma < 1
saturation NaN rule (torch's own autograd, float64), torch.library.opcheck on the six ops,
torch.compile(fullgraph=True), the fallbacks, errors. The one-pass fused path (reduction mean /
sum with a gradient: fusedloss::*_fused, dx formed in the forward and scaled in the backward) is
checked against the two-pass path (the forward op + its backward op) and the float64 reference
for upstream gradients 1 and != 1, gradient accumulation, which path each call takes, the
backward-only-once and double-backward errors. The eager fast path (zoo._eager: the ops' eager
twins, no dispatcher) is checked bitwise against the custom ops (zoo._FORCE_OPS) for loss and
gradient, and for the same errors, in-place scaling and fallbacks to the ops (fake tensors, vmap).
CUDA cases skip without a GPU.

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
    close(fusedloss.sigmoid_focal_loss(xs.t(), torch.ones(6)),
          tv_focal(xs.t().double(), torch.ones(6).double().expand(8, 6)),
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
    # double backward: create_graph=True itself works (right gradient), differentiating it raises;
    # "sum" / "mean" take the fused path, "none" the two-pass one
    for fn in (lambda a, red: fusedloss.sigmoid_focal_loss(a, y, reduction=red),
               lambda a, red: fusedloss.binary_cross_entropy_with_logits(a, y, reduction=red,
                                                                         pos_weight=torch.ones(4))):
        for red in ("sum", "mean", "none"):
            xg = x.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(fn(xg, red).sum(), xg, create_graph=True)
            (g1,) = torch.autograd.grad(fn(xg, red).sum(), xg)
            torch.testing.assert_close(g.detach(), g1)
            assert g.requires_grad
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
        for inplace in (False, True):
            torch.library.opcheck(torch.ops.fusedloss.sigmoid_focal_fused,
                                  (x.detach().requires_grad_(True), y, 0.25, 2.0, red, inplace))
            torch.library.opcheck(torch.ops.fusedloss.bce_with_logits_fused,
                                  (x.detach().requires_grad_(True), y, w, w + 1, red, inplace))


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


# ---- the fused path (reduction mean / sum with a gradient: one pass) -----------------------------

def _grad_fn_names(t):
    """Names of the autograd nodes reachable from t's grad_fn. The node wrappers are kept alive
    while walking: next_functions hands out fresh Python objects, and the id of a freed one is
    reused, which made the walk skip nodes (seen on CUDA: 16-bit BCE with a row-wise weight)."""
    names, todo, seen, keep = [], [t.grad_fn], set(), []
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        keep.append(fn)
        seen.add(id(fn))
        names.append(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return names


# the autograd node of each op's eager twin (zoo's eager fast path: plain tensors, no tracing)
EAGER_NODES = {"sigmoid_focal_fused": "_SigmoidFocalFusedBackward",
               "sigmoid_focal_forward": "_SigmoidFocalBackward",
               "bce_with_logits_fused": "_BceWithLogitsFusedBackward",
               "bce_with_logits_forward": "_BceWithLogitsBackward"}


def _uses(t, op):
    """t's graph holds the op, through the dispatcher or as its eager twin."""
    return any(f"fusedloss_{op}_" in n or n == EAGER_NODES.get(op) for n in _grad_fn_names(t))


def _upstream(loss, mode):
    """Backward of loss with upstream gradient 1 ('one'), 3 ((loss * 3).backward()) or 0.5
    (loss.backward(tensor(0.5))); returns the factor."""
    if mode == "one":
        loss.backward()
        return 1.0
    if mode == "times3":
        (loss * 3).backward()
        return 3.0
    loss.backward(torch.tensor(0.5, dtype=loss.dtype, device=loss.device))
    return 0.5


FUSED_CASES = ["focal", "focal_noalpha", "bce", "bce_w", "bce_pw", "bce_both"]


def _fused_case(case, device, C):
    """(functional call, two-pass call, float64 reference, fused op name) for a FUSED_CASES entry."""
    g = torch.Generator().manual_seed(11)
    w = torch.rand(C, generator=g) + 0.2 if case in ("bce_w", "bce_both") else None
    pw = 3 * torch.rand(C, generator=g) + 0.1 if case in ("bce_pw", "bce_both") else None
    wd = w.to(device) if w is not None else None
    pwd = pw.to(device) if pw is not None else None
    if case.startswith("focal"):
        alpha = 0.25 if case == "focal" else -1.0
        return (lambda a, b, red: fusedloss.sigmoid_focal_loss(a, b, alpha=alpha, gamma=2.0, reduction=red),
                lambda a, b, red: torch.ops.fusedloss.sigmoid_focal_forward(a, b, alpha, 2.0, zoo.REDUCTIONS[red]),
                lambda a, b, red: tv_focal(a, b, alpha, 2.0, red), "sigmoid_focal")
    return (lambda a, b, red: fusedloss.binary_cross_entropy_with_logits(a, b, weight=wd, reduction=red,
                                                                         pos_weight=pwd),
            lambda a, b, red: torch.ops.fusedloss.bce_with_logits_forward(a, b, wd, pwd, zoo.REDUCTIONS[red]),
            lambda a, b, red: F.binary_cross_entropy_with_logits(
                a, b, weight=w.double() if w is not None else None, reduction=red,
                pos_weight=pw.double() if pw is not None else None), "bce_with_logits")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case", FUSED_CASES)
@pytest.mark.parametrize("up", ["one", "times3", "half"])
def test_fused_matches_two_pass_and_reference(device, dtype, reduction, case, up):
    x, y = make((13, 3, 17), dtype, device, soft=True, seed=3)
    fn, two_pass, ref_fn, op = _fused_case(case, device, 17)
    xf = x.clone().requires_grad_(True)
    lf = fn(xf, y, reduction)
    assert lf.dtype == dtype and lf.shape == ()
    assert _uses(lf, f"{op}_fused") and not _uses(lf, f"{op}_forward")
    k = _upstream(lf, up)
    xt = x.clone().requires_grad_(True)
    lt = two_pass(xt, y, reduction).to(dtype)
    assert _uses(lt, f"{op}_forward")
    _upstream(lt, up)
    xd = x.detach().double().cpu().requires_grad_(True)
    ref = ref_fn(xd, y.detach().double().cpu(), reduction)
    (rdx,) = torch.autograd.grad(ref * k, xd)
    assert xf.grad.dtype == dtype and xf.grad.shape == x.shape
    # the same kernels' loss (bitwise); the gradient bitwise for an upstream 1 (the fused pass and
    # the backward pass compute it the same way), else rounded twice (kernel, then the multiply)
    assert torch.equal(lf, lt)
    if up == "one":
        assert torch.equal(xf.grad, xt.grad)
    else:
        close(xf.grad, xt.grad.double(), TOL[dtype], "dx vs two-pass")
    close(lf, ref, TOL[dtype], "loss vs reference")
    close(xf.grad, rdx, TOL[dtype], "dx vs reference")


def _ref_grad_t(ref_fn, w, y):
    """float64 reference gradient of ref_fn(w.t(), y, 'mean') w.r.t. w."""
    wd = w.detach().double().cpu().requires_grad_(True)
    (g,) = torch.autograd.grad(ref_fn(wd.t(), y.detach().double().cpu(), "mean"), wd)
    return g


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["focal", "bce_both"])
def test_fused_grad_accumulation(device, dtype, case):
    x, y = make((9, 7), dtype, device, soft=False, seed=4)
    fn, _, ref_fn, _ = _fused_case(case, device, 7)
    xd = x.detach().double().cpu().requires_grad_(True)
    (rdx,) = torch.autograd.grad(ref_fn(xd, y.detach().double().cpu(), "mean"), xd)
    xg = x.clone().requires_grad_(True)
    xg.grad = torch.full_like(x, 0.5)   # an existing .grad: accumulated into
    fn(xg, y, "mean").backward()
    close(xg.grad, rdx + 0.5, TOL[dtype], "first accumulation")
    (fn(xg, y, "mean") * 2).backward()
    close(xg.grad, 3 * rdx + 0.5, (TOL[dtype][0], 2 * TOL[dtype][1]), "second accumulation")
    # a leaf without .grad: the gradient is adopted, then accumulated into, twice
    xg.grad = None
    fn(xg, y, "sum").backward()
    fn(xg, y, "sum").backward(torch.tensor(0.5, dtype=dtype, device=device))
    close(xg.grad, 1.5 * rdx * x.numel(), (TOL[dtype][0], 2 * TOL[dtype][1]), "adopted then accumulated")
    # non-leaf input (the gradient flows on through torch ops) and a non-contiguous one
    w = torch.randn(7, 9, generator=torch.Generator().manual_seed(2)).to(dtype).to(device).requires_grad_(True)
    fn(w.t() * 1, y, "mean").backward(torch.tensor(0.25, device=device))
    close(w.grad, 0.25 * _ref_grad_t(ref_fn, w, y), TOL[dtype], "non-leaf, transposed")


def test_fused_path_selection(monkeypatch):
    """Which kernels run: the fused pass only for mean / sum with a gradient; none keeps forward +
    backward; no gradient (or no_grad / inference_mode) the forward only; a non-[C] weight the
    unfused path."""
    calls = []
    for name in ("_run_focal", "_run_bce"):
        real = getattr(zoo, name)
        monkeypatch.setattr(zoo, name, lambda *a, _r=real, _n=name: calls.append((_n, a[0])) or _r(*a))
    x, y = make((6, 5), torch.float32, "cpu", soft=True)
    xg = x.clone().requires_grad_(True)
    F_, B_, U_ = zoo._FWD, zoo._BWD, zoo._FUSED

    def run(f, backward=True):
        calls.clear()
        loss = f()
        if backward and loss.requires_grad:
            loss.sum().backward()
        return [c[1] for c in calls]
    for f in (lambda a: fusedloss.sigmoid_focal_loss(a, y, reduction="mean"),
              lambda a: fusedloss.binary_cross_entropy_with_logits(a, y, reduction="sum", weight=torch.rand(5))):
        assert run(lambda: f(xg)) == [U_]
        assert run(lambda: f(x)) == [F_]
        with torch.no_grad():
            assert run(lambda: f(xg)) == [F_]
        with torch.inference_mode():
            assert run(lambda: f(xg)) == [F_]
    assert run(lambda: fusedloss.sigmoid_focal_loss(xg, y)) == [F_, B_]
    assert run(lambda: fusedloss.binary_cross_entropy_with_logits(xg, y, reduction="none")) == [F_, B_]
    rowwise = torch.rand(6, 1) + 0.5
    assert run(lambda: fusedloss.binary_cross_entropy_with_logits(xg, y, weight=rowwise)) == [F_, B_]
    # the fused op's dx is not differentiable, and the wrapper returns the loss only
    loss, dx = torch.ops.fusedloss.sigmoid_focal_fused(xg, y, 0.25, 2.0, 1)
    assert loss.requires_grad and not dx.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_fused_op_direct(device):
    """The raw fused ops: dx is the gradient for an upstream 1; with inplace_backward=False the
    caller's dx is left alone by the backward, with True the backward scales it in place."""
    x, y = make((8, 6), torch.float16, device, soft=True)
    pw = torch.rand(6, device=device) + 0.5
    for inplace in (False, True):
        xg = x.clone().requires_grad_(True)
        loss, dx = torch.ops.fusedloss.bce_with_logits_fused(xg, y, None, pw, 1, inplace)
        l2 = torch.ops.fusedloss.bce_with_logits_forward(x, y, None, pw, 1)
        assert torch.equal(loss, l2) and dx.dtype == torch.float16
        (g1,) = torch.autograd.grad(torch.ops.fusedloss.bce_with_logits_forward(xg, y, None, pw, 1), xg)
        assert torch.equal(dx, g1)
        d0 = dx.clone()
        loss.backward(torch.tensor(2.0, device=device))
        assert torch.equal(xg.grad, d0 * 2)
        assert torch.equal(dx, d0 * 2 if inplace else d0)
    # reduction none through the fused op: dx * the per-element upstream gradient
    xg = x.clone().requires_grad_(True)
    loss, dx = torch.ops.fusedloss.sigmoid_focal_fused(xg, y, 0.25, 2.0, 0, True)
    up = torch.rand(x.shape, device=device)
    loss.backward(up)
    torch.testing.assert_close(xg.grad, (dx.float() * up).half())


def test_fused_backward_only_once():
    x, y = make((5, 4), torch.float32, "cpu", soft=True)
    for f in (lambda a: fusedloss.sigmoid_focal_loss(a, y, reduction="sum"),
              lambda a: fusedloss.binary_cross_entropy_with_logits(a, y)):
        xg = x.clone().requires_grad_(True)
        loss = f(xg)
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="only once"):
            loss.backward()
    # the two-pass paths keep allowing it
    xg = x.clone().requires_grad_(True)
    for loss in (fusedloss.sigmoid_focal_loss(xg, y).sum(),
                 fusedloss.binary_cross_entropy_with_logits(xg, y, reduction="none").mean()):
        loss.backward(retain_graph=True)
        loss.backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph_fused(device, dtype):
    """torch.compile(fullgraph=True) over the fused path, upstream gradient != 1, both reductions;
    the Dynamo graph holds the fused ops (no graph break, no fallback)."""
    from torch._dynamo.testing import EagerAndRecordGraphs
    x, y = make((12, 9), dtype, device, soft=True, seed=8)
    w = torch.rand(9, device=device) + 0.5

    def f(a, b):
        return fusedloss.sigmoid_focal_loss(a, b, reduction="sum") * 0.5 + \
            fusedloss.binary_cross_entropy_with_logits(a, b, weight=w, reduction="mean") * 3
    torch._dynamo.reset()
    rec = EagerAndRecordGraphs()
    torch.compile(f, fullgraph=True, backend=rec)(x.clone().requires_grad_(True), y)
    targets = [str(n.target) for g in rec.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any("sigmoid_focal_fused" in t for t in targets) and any("bce_with_logits_fused" in t for t in targets)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    la, lb = f(xa, y), cf(xb, y)
    la.backward(torch.tensor(0.7, dtype=dtype, device=device))
    lb.backward(torch.tensor(0.7, dtype=dtype, device=device))
    torch.testing.assert_close(la, lb)
    torch.testing.assert_close(xa.grad, xb.grad)
    # a second compiled step accumulates into .grad
    cf(xb, y).backward()
    f(xa, y).backward()
    torch.testing.assert_close(xa.grad, xb.grad)


# ---- the eager fast path vs the custom ops ------------------------------------------------------

EAGER_CASES = ["focal", "focal_noalpha", "focal_gamma05", "focal_bcast", "bce", "bce_w", "bce_pw", "bce_both",
               "bce_scalar", "bce_rowwise"]


def _eager_case(case, device, C):
    """fn(a, b, reduction) for an EAGER_CASES entry (shape [..., C]; rowwise: [3, 5, C] only)."""
    g = torch.Generator().manual_seed(21)
    if case.startswith("focal"):
        alpha = -1.0 if case == "focal_noalpha" else 0.25
        gamma = 0.5 if case == "focal_gamma05" else 2.0
        if case == "focal_bcast":   # fp32 (C,) targets: cast to the input's dtype and broadcast
            return lambda a, b, red: fusedloss.sigmoid_focal_loss(a, b[(0,) * (b.dim() - 1)].float(), alpha, gamma,
                                                                  reduction=red)
        return lambda a, b, red: fusedloss.sigmoid_focal_loss(a, b, alpha, gamma, reduction=red)
    w = pw = None
    if case in ("bce_w", "bce_both"):
        w = torch.rand(C, generator=g) + 0.2
    if case in ("bce_pw", "bce_both"):
        pw = 3 * torch.rand(C, generator=g) + 0.1
    if case == "bce_scalar":
        w, pw = torch.tensor(0.7), torch.tensor([2.0])
    if case == "bce_rowwise":   # not a [C] layout: multiplied onto the unreduced loss
        w = torch.rand(3, 5, 1, generator=g) + 0.2
    w = w.to(device) if w is not None else None
    pw = pw.to(device) if pw is not None else None
    return lambda a, b, red: fusedloss.binary_cross_entropy_with_logits(a, b, weight=w, reduction=red, pos_weight=pw)


def _step(fn, x, y, red, up, transposed):
    """One forward + backward from a fresh leaf (transposed: a non-contiguous view of it); returns
    (loss, leaf gradient, autograd node names)."""
    leaf = (x.transpose(-1, -2).contiguous() if transposed else x.clone()).requires_grad_(True)
    loss = fn(leaf.transpose(-1, -2) if transposed else leaf, y, red)
    names = _grad_fn_names(loss)
    if up == "one":
        loss.backward()
    elif up == "half":
        loss.backward(torch.tensor(0.5, dtype=loss.dtype, device=loss.device))
    elif up == "times3":
        (loss * 3).backward()
    elif up == "sum":   # expanded (stride 0) upstream gradient
        loss.sum().backward()
    else:
        loss.backward(torch.randn(loss.shape, generator=torch.Generator().manual_seed(9)).to(loss.device, loss.dtype))
    return loss.detach(), leaf.grad, names


def _fast_and_ops(monkeypatch, f):
    """(f() on the eager fast path, f() through the custom ops)."""
    monkeypatch.setattr(zoo, "_FORCE_OPS", False)
    fast = f()
    monkeypatch.setattr(zoo, "_FORCE_OPS", True)
    slow = f()
    monkeypatch.setattr(zoo, "_FORCE_OPS", False)
    return fast, slow


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("case", EAGER_CASES)
def test_eager_matches_ops_bitwise(monkeypatch, device, dtype, reduction, case):
    x, y = make((3, 5, 17), dtype, device, soft=True, seed=12)
    fn = _eager_case(case, device, 17)
    for up in (["one", "half", "times3"] if reduction != "none" else ["sum", "rand"]):
        for transposed in (False, True):
            yy = y.transpose(-1, -2).contiguous() if transposed and case == "bce_rowwise" else y
            if transposed and case == "bce_rowwise":
                continue   # its weight is laid out for [3, 5, C]
            (lf, gf, nf), (lo, go, no) = _fast_and_ops(monkeypatch, lambda: _step(fn, x, yy, reduction, up, transposed))
            what = f"{case} {reduction} up={up} transposed={transposed}"
            assert lf.dtype == lo.dtype == dtype and gf.dtype == go.dtype == dtype, what
            assert torch.equal(lf, lo), f"{what}: loss"
            assert torch.equal(gf, go), f"{what}: gradient"
            assert not any("fusedloss_" in n for n in nf) and any(n in EAGER_NODES.values() for n in nf), nf
            assert any("fusedloss_" in n for n in no) and not any(n in EAGER_NODES.values() for n in no), no
            fused = reduction != "none" and case != "bce_rowwise"
            op = ("sigmoid_focal" if case.startswith("focal") else "bce_with_logits") + \
                ("_fused" if fused else "_forward")
            assert EAGER_NODES[op] in nf and any(f"fusedloss_{op}_" in n for n in no), (op, nf, no)
    # no gradient asked for: the forward kernel only, no graph, the same bits
    for ctx in (torch.no_grad, torch.enable_grad):
        with ctx():
            lf, lo = _fast_and_ops(monkeypatch, lambda: fn(x, y, reduction))
        assert lf.grad_fn is None and lo.grad_fn is None and torch.equal(lf, lo)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_backward_once_create_graph_in_place(monkeypatch, device):
    """The fused path's backward as through the ops: in place on the forward's dx (fl_scale_rows,
    once; x.grad adopts that storage), a second backward raises the same error, create_graph=True
    gives the same gradient whose own backward raises; reduction none allows both."""
    x, y = make((6, 5), torch.float32, device, soft=True, seed=5)
    pw = torch.rand(5, device=device) + 0.5
    w = torch.rand(5, device=device) + 0.5
    calls = []
    real = zoo.ops.run_scale_rows
    monkeypatch.setattr(zoo.ops, "run_scale_rows", lambda *a: calls.append(a[1].item()) or real(*a))
    fns = [lambda a, red: fusedloss.sigmoid_focal_loss(a, y, reduction=red),
           lambda a, red: fusedloss.binary_cross_entropy_with_logits(a, y, w, reduction=red, pos_weight=pw)]
    for f in fns:
        for red in ("mean", "sum"):
            def run():
                calls.clear()
                xg = x.clone().requires_grad_(True)
                loss = f(xg, red)
                dx_ptr = loss.grad_fn.saved_tensors[0].data_ptr()
                loss.backward(retain_graph=True)
                assert xg.grad.data_ptr() == dx_ptr and calls == [1.0]   # adopted, scaled in place
                with pytest.raises(RuntimeError, match="only once") as err:
                    loss.backward()
                x2 = x.clone().requires_grad_(True)
                f(x2, red).backward(torch.tensor(0.5, device=device))
                assert calls == [1.0, 0.5]
                x3 = x.clone().requires_grad_(True)
                (g,) = torch.autograd.grad(f(x3, red) * 2, x3, create_graph=True)
                assert g.requires_grad
                with pytest.raises(RuntimeError, match="double backward") as err2:
                    g.sum().backward()
                return xg.grad, x2.grad, g.detach(), str(err.value), str(err2.value)
            fast, slow = _fast_and_ops(monkeypatch, run)
            for a, b in zip(fast, slow):
                assert (a == b) if isinstance(a, str) else torch.equal(a, b)
        for red in ("none",):   # two passes: backward twice is fine, create_graph as the ops
            def run_none():
                xg = x.clone().requires_grad_(True)
                loss = f(xg, red).sum()
                loss.backward(retain_graph=True)
                loss.backward()
                (g,) = torch.autograd.grad(f(xg, red).sum(), xg, create_graph=True)
                assert g.requires_grad
                with pytest.raises(RuntimeError, match="double backward") as err:
                    g.sum().backward()
                return xg.grad, g.detach(), str(err.value)
            fast, slow = _fast_and_ops(monkeypatch, run_none)
            for a, b in zip(fast, slow):
                assert (a == b) if isinstance(a, str) else torch.equal(a, b)


def test_eager_targets_on_another_device():
    """Targets not on the input's device raise (the C-call helpers' check). Through the ops, meta
    targets with CPU inputs would dispatch to the ops' fake kernels instead (uninitialised output)."""
    x = torch.randn(3, 4, requires_grad=True)
    for red in REDS:
        with pytest.raises(ValueError, match="targets must match logits"):
            fusedloss.sigmoid_focal_loss(x, torch.rand(3, 4, device="meta"), reduction=red)
        with pytest.raises(ValueError, match="targets must match logits"):
            fusedloss.binary_cross_entropy_with_logits(x, torch.rand(3, 4, device="meta"), reduction=red)


def test_eager_not_taken_when_traced_or_transformed(monkeypatch):
    """Fake tensors (a dispatch mode) take the ops' fake kernels (no C call), vmap (functorch: batched
    tensors have no storage) the ops' batching fallback, one C call per sample."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    calls = []
    for name in ("_run_focal", "_run_bce"):
        real = getattr(zoo, name)
        monkeypatch.setattr(zoo, name, lambda *a, _r=real: calls.append(a[0]) or _r(*a))
    with FakeTensorMode():
        x = torch.empty(4, 3, requires_grad=True)
        y = torch.empty(4, 3)
        for red in REDS:
            for loss in (fusedloss.sigmoid_focal_loss(x, y, reduction=red),
                         fusedloss.binary_cross_entropy_with_logits(x, y, reduction=red, pos_weight=torch.ones(3))):
                assert loss.shape == ((4, 3) if red == "none" else ()) and loss.requires_grad
    assert calls == []
    x, y = make((4, 3), torch.float32, "cpu", soft=True)
    for f in (lambda a, b: fusedloss.sigmoid_focal_loss(a, b, reduction="sum"),
              lambda a, b: fusedloss.binary_cross_entropy_with_logits(a, b, pos_weight=torch.ones(3))):
        calls.clear()
        got = torch.vmap(f)(x, y)
        assert calls == [zoo._FWD] * 4
        assert torch.equal(got, torch.stack([f(a, b) for a, b in zip(x, y)]))


# ---- mmcv's index-target variant (fusedloss.mmcv_sigmoid_focal_loss) ---------------------------
def mmcv_focal_ref(x, t, gamma=2.0, alpha=0.25, weight=None, reduction="mean"):
    """mmcv's sigmoid_focal_loss kernel, written out per element in float64 from its definition
    (positive: -alpha (1-p)^gamma log p; negatives: -(1-alpha) p^gamma log(1-p); target C =
    background; row weight weight[t]), with log-sigmoid for log p (mmcv clamps p at FLT_MIN)."""
    N, C = x.shape
    p = torch.sigmoid(x)
    pos = t.unsqueeze(1) == torch.arange(C).unsqueeze(0)
    el = torch.where(pos, -alpha * (1 - p) ** gamma * F.logsigmoid(x),
                     -(1 - alpha) * p ** gamma * F.logsigmoid(-x))
    if weight is not None:
        w = weight.double()
        if w.shape[0] == C:
            w = torch.cat([w, w.new_ones(1)])
        el = el * w[t].unsqueeze(1)
    return el.sum() / N if reduction == "mean" else el.sum() if reduction == "sum" else el


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("wkind", [None, "C", "C+1"])
@pytest.mark.parametrize("alpha", [0.25, -0.5])
def test_mmcv_focal_matches_reference(device, dtype, reduction, wkind, alpha):
    N, C = 37, 11
    g = torch.Generator().manual_seed(5)
    x = (3 * torch.randn(N, C, generator=g)).to(dtype)
    t = torch.randint(0, C + 1, (N,), generator=g)   # C: background rows
    t[:3] = C
    w = None if wkind is None else torch.rand(C if wkind == "C" else C + 1, generator=g) + 0.5
    xg = x.to(device).requires_grad_(True)
    loss = fusedloss.mmcv_sigmoid_focal_loss(xg, t.to(device), 1.5, alpha,
                                             None if w is None else w.to(device), reduction)
    assert loss.dtype == dtype and loss.shape == ((N, C) if reduction == "none" else ())
    up = torch.randn(loss.shape, generator=g) if reduction == "none" else torch.tensor(0.75)
    loss.backward(up.to(device, dtype))
    xd = x.double().requires_grad_(True)
    ref = mmcv_focal_ref(xd, t, 1.5, alpha, w, reduction)
    (rdx,) = torch.autograd.grad(ref, xd, up.double())
    atol, rtol = TOL[dtype]
    # the sums: fp32 accumulation of N x C terms, then rounded to the dtype
    close(loss, ref, (atol + (1e-5 if reduction != "none" else 0), rtol), "loss")
    close(xg.grad, rdx, (atol * 4, rtol * 2), "grad")


@pytest.mark.parametrize("device", DEVICES)
def test_mmcv_focal_edges(device):
    x = torch.randn(6, 4, device=device)
    t = torch.tensor([0, 1, 2, 3, 4, 4], device=device)   # 4 = C: background
    # equals torchvision's focal on the one-hot targets (alpha >= 0), with mmcv's mean (/ N rows)
    y = torch.nn.functional.one_hot(t, 5)[:, :4].float()
    tv = tv_focal(x, y, 0.25, 2.0, "sum")
    got = fusedloss.mmcv_sigmoid_focal_loss(x, t)
    assert torch.allclose(got, tv / 6, rtol=1e-6, atol=1e-7)
    # out-of-range targets: that row NaN, the reduced losses NaN; no error, no device assert
    tb = t.clone()
    tb[2] = 7
    tb[3] = -1
    el = fusedloss.mmcv_sigmoid_focal_loss(x, tb, reduction="none")
    assert torch.isnan(el[2]).all() and torch.isnan(el[3]).all() and torch.isfinite(el[[0, 1, 4, 5]]).all()
    for red in ("mean", "sum"):
        assert torch.isnan(fusedloss.mmcv_sigmoid_focal_loss(x, tb, reduction=red))
        assert torch.isnan(fusedloss.mmcv_sigmoid_focal_loss(x, tb, weight=torch.ones(4, device=device),
                                                              reduction=red))
    # int32 targets are accepted
    assert torch.equal(fusedloss.mmcv_sigmoid_focal_loss(x, t.int()), got)
    with pytest.raises(ValueError, match="reduction"):
        fusedloss.mmcv_sigmoid_focal_loss(x, t, reduction="batchmean")
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        fusedloss.mmcv_sigmoid_focal_loss(x[0], t)
    with pytest.raises(ValueError, match=r"\(N, C\)"):
        fusedloss.mmcv_sigmoid_focal_loss(x, t[:5])
    with pytest.raises(TypeError, match="integer"):
        fusedloss.mmcv_sigmoid_focal_loss(x, t.float())
    with pytest.raises(ValueError, match="weight"):
        fusedloss.mmcv_sigmoid_focal_loss(x, t, weight=torch.ones(3, device=device))
    with pytest.raises(ValueError, match="on meta"):
        fusedloss.mmcv_sigmoid_focal_loss(x, t.to("meta"))


def test_mmcv_focal_compiles():
    x = torch.randn(8, 5)
    t = torch.randint(0, 6, (8,))
    f = torch.compile(lambda a, b: fusedloss.mmcv_sigmoid_focal_loss(a, b, weight=torch.ones(5)), fullgraph=True)
    assert torch.allclose(f(x, t), fusedloss.mmcv_sigmoid_focal_loss(x, t, weight=torch.ones(5)), rtol=1e-6)


def test_mmcv_focal_module():
    x = torch.randn(9, 6, requires_grad=True)
    t = torch.randint(0, 7, (9,))
    w = torch.rand(6) + 0.5
    m = fusedloss.nn.MMCVSigmoidFocalLoss(2.0, 0.25, w, "sum")
    assert "fused" in repr(m) and torch.equal(m.weight, w)
    assert torch.equal(m(x, t), fusedloss.mmcv_sigmoid_focal_loss(x, t, 2.0, 0.25, w, "sum"))
    m(x, t).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
