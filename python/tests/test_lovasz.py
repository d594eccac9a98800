"""Tests of fusedloss.lovasz_softmax (include/fusedloss.h section 13): the C op (CPU and CUDA, fused
loss + gradient) and the PyTorch formulation (float64) against an independent float64 reference
written from Berman's lovasz_softmax_flat (per class: sort, lovasz_grad, dot), with a Python loop
over classes and images; gradients of the reference by autograd through the sort. Options classes
present / all, per_image, from_logits, ignore_index (ignored pixels, every pixel ignored, an image
without valid pixels), an absent class, fp32 / fp16 / bf16 / float64, upstream gradients != 1,
ties, the module, torch.compile(fullgraph=True) (aot_eager, CPU op path), torch.library.opcheck on
the three ops, double backward refused, and bad arguments. On CUDA (when available): the CUDA op
against the reference and against the CPU op on the same inputs, out-of-range labels (NaN and the
device error flag), run-to-run bitwise equality and CUDA graph replay.

Run: make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_lovasz.py
"""
import pytest

torch = pytest.importorskip("torch")

import fusedloss  # noqa: E402
from fusedloss import lovasz as lv  # noqa: E402

HAS_GPU = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device"))]
TOL = {torch.float32: (2e-6, 1e-6), torch.float16: (2e-3, 1e-3), torch.bfloat16: (1.6e-2, 8e-3),
       torch.float64: (1e-10, 1e-12)}


# ---- reference (float64, Berman's code structure) ------------------------------------------------
def ref_lovasz_grad(gt_sorted):
    gts = gt_sorted.sum()
    intersection = gts - gt_sorted.cumsum(0)
    union = gts + (1 - gt_sorted).cumsum(0)
    jaccard = 1.0 - intersection / union
    if len(gt_sorted) > 1:
        jaccard[1:] = jaccard[1:] - jaccard[0:-1].clone()
    return jaccard


def ref_flat(probas, labels, classes):
    """probas [P, C] float64, labels [P] valid only, in pixel-index order."""
    if probas.numel() == 0:
        return probas.sum() * 0
    C = probas.shape[1]
    losses = []
    for c in range(C):
        fg = (labels == c).double()
        if classes == "present" and fg.sum() == 0:
            continue
        pc = probas[:, c]
        # |fg - p| with the header's derivative (fg ? -1 : +1), also at e == 0 (abs'(0) = 0 in autograd)
        errors = (fg - pc).abs().detach() + (1 - 2 * fg) * (pc - pc.detach())
        errors_sorted, perm = torch.sort(errors, dim=0, descending=True, stable=True)
        losses.append(torch.dot(errors_sorted, ref_lovasz_grad(fg[perm])))
    return torch.stack(losses).mean() if losses else probas.sum() * 0


def ref_loss(x, labels, classes="present", per_image=False, ignore_index=-100, from_logits=False):
    x = x.double()
    p = torch.softmax(x, 1) if from_logits else x
    N, C = p.shape[:2]
    p = p.reshape(N, C, -1)
    y = labels.reshape(N, -1)

    def flat(pp, yy):   # pp [C, P] yy [P]
        v = yy != ignore_index
        return ref_flat(pp.t()[v], yy[v], classes)

    if per_image:
        return torch.stack([flat(p[n], y[n]) for n in range(N)]).mean()
    return flat(p.permute(1, 0, 2).reshape(C, -1), y.reshape(-1))


def make(shape, dtype, device, seed, ignore_frac=0.2, from_logits=False, absent=False, empty_image=False):
    g = torch.Generator().manual_seed(seed)
    N, C = shape[:2]
    x = torch.randn(shape, generator=g) * 2 if from_logits else torch.softmax(torch.randn(shape, generator=g) * 2, 1)
    y = torch.randint(0, C - 1 if (absent and C > 1) else C, (N,) + tuple(shape[2:]), generator=g)
    y[torch.rand(y.shape, generator=g) < ignore_frac] = -100
    if empty_image:
        y[0] = -100
    return x.to(dtype).to(device), y.to(device)


def check(device, dtype, shape, seed, **kw):
    mk = {k: kw.pop(k) for k in ("ignore_frac", "absent", "empty_image") if k in kw}
    x, y = make(shape, dtype, device, seed, from_logits=kw.get("from_logits", False), **mk)
    xr = x.detach().double().cpu().requires_grad_()
    r = ref_loss(xr, y.cpu(), **kw)
    r.backward()
    xx = x.clone().requires_grad_()
    loss = fusedloss.lovasz_softmax(xx, y, **kw)
    assert loss.dtype == dtype and loss.shape == ()
    loss.backward()
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(loss.double().cpu(), r.detach(), rtol=max(rtol, 1e-6), atol=max(atol, 1e-6))
    torch.testing.assert_close(xx.grad.double().cpu(), xr.grad, rtol=rtol, atol=atol * max(1e-3, xr.grad.abs().max()))
    return x, y, loss, xx.grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("classes", ["present", "all"])
@pytest.mark.parametrize("per_image", [False, True])
@pytest.mark.parametrize("from_logits", [False, True])
def test_vs_reference(device, dtype, classes, per_image, from_logits):
    check(device, dtype, (3, 5, 6, 7), 1, classes=classes, per_image=per_image, from_logits=from_logits,
          absent=True, empty_image=per_image)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 1, 3, 3), (2, 2, 1, 1), (2, 19, 8, 8), (1, 3, 300), (2, 4)])
def test_shapes(device, shape):
    for k, fl in enumerate((False, True)):
        check(device, torch.float32, shape, 2 + k, from_logits=fl, classes="all", per_image=True)
        check(device, torch.float32, shape, 4 + k, from_logits=fl)


@pytest.mark.parametrize("device", DEVICES)
def test_all_ignored_and_empty(device):
    x, y = make((2, 3, 4, 4), torch.float32, device, 7)
    y[:] = -100
    xx = x.clone().requires_grad_()
    loss = fusedloss.lovasz_softmax(xx, y, per_image=True)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.count_nonzero(xx.grad) == 0
    z = torch.empty(0, 3, 4, 4, device=device, requires_grad=True)
    l0 = fusedloss.lovasz_softmax(z, torch.empty(0, 4, 4, dtype=torch.long, device=device))
    assert float(l0.detach()) == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_ties_and_upstream(device):
    # probabilities on a coarse grid: many equal errors; the loss is order-independent
    g = torch.Generator().manual_seed(3)
    q = torch.randint(0, 4, (2, 1, 5, 5), generator=g).double() / 4
    x = torch.cat([1 - q, q], 1).float().to(device)
    y = torch.randint(0, 2, (2, 5, 5), generator=g).to(device)
    l1 = fusedloss.lovasz_softmax(x, y)
    perm = torch.randperm(50, generator=g)
    xp = x.permute(1, 0, 2, 3).reshape(2, 50)[:, perm].reshape(2, 2, 5, 5).permute(1, 0, 2, 3).contiguous()
    yp = y.reshape(50)[perm.to(device)].reshape(2, 5, 5)
    l2 = fusedloss.lovasz_softmax(xp, yp)
    torch.testing.assert_close(l1, l2, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(l1.double().cpu(), ref_loss(x.cpu(), y.cpu()), rtol=1e-6, atol=1e-7)
    # gradient with the header's tie order and an upstream gradient != 1
    xx = x.clone().requires_grad_()
    (fusedloss.lovasz_softmax(xx, y) * -2.5).backward()
    xr = x.double().cpu().requires_grad_()
    (ref_loss(xr, y.cpu()) * -2.5).backward()
    torch.testing.assert_close(xx.grad.double().cpu(), xr.grad, rtol=1e-6, atol=1e-7)



@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("from_logits", [False, True])
@pytest.mark.parametrize("per_image", [False, True])
def test_cuda_matches_cpu_op(from_logits, per_image):
    x, y = make((2, 7, 9, 11), torch.float32, "cpu", 11, from_logits=from_logits, absent=True)
    a = x.clone().requires_grad_()
    la = fusedloss.lovasz_softmax(a, y, per_image=per_image, from_logits=from_logits, classes="all")
    la.backward()
    b = x.cuda().requires_grad_()
    lb = fusedloss.lovasz_softmax(b, y.cuda(), per_image=per_image, from_logits=from_logits, classes="all")
    lb.backward()
    torch.testing.assert_close(lb.cpu(), la, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-6)


def test_module_and_accumulation():
    m = fusedloss.LovaszSoftmaxLoss(classes="all", per_image=True, from_logits=True)
    assert "classes='all'" in repr(m)
    x, y = make((2, 4, 5, 5), torch.float32, "cpu", 12, from_logits=True)
    xx = x.clone().requires_grad_()
    m(xx, y).backward()
    g1 = xx.grad.clone()
    m(xx, y).backward()
    torch.testing.assert_close(xx.grad, 2 * g1)
    # the forward op's own backward (fused call with the upstream gradient)
    x3 = x.reshape(2, 4, 25).clone().requires_grad_()
    l = torch.ops.fusedloss.lovasz_softmax_forward(x3, y.reshape(2, 25), 1, True, True, -100)
    (3 * l).backward()
    torch.testing.assert_close(x3.grad.reshape(g1.shape), 3 * g1)
    x4 = x.clone().requires_grad_()
    l2 = fusedloss.lovasz_softmax(x4, y, classes="all", per_image=True, from_logits=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(l2, x4, create_graph=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph(dtype):
    x, y = make((2, 5, 4, 6), dtype, "cpu", 13, from_logits=True)

    def f(a, b):
        return fusedloss.lovasz_softmax(a, b, from_logits=True, per_image=True) * 1.5

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    a1 = x.clone().requires_grad_()
    a2 = x.clone().requires_grad_()
    l1 = f(a1, y)
    l1.backward()
    l2 = cf(a2, y)
    l2.backward()
    torch.testing.assert_close(l2, l1)
    torch.testing.assert_close(a2.grad, a1.grad)


def test_opcheck():
    from torch.library import opcheck
    for dtype, fl in [(torch.float32, False), (torch.bfloat16, True), (torch.float16, False)]:
        x, y = make((2, 4, 12), dtype, "cpu", 14, from_logits=fl)
        args = (0, False, fl, -100)
        opcheck(torch.ops.fusedloss.lovasz_softmax_forward.default, (x, y) + args)
        opcheck(torch.ops.fusedloss.lovasz_softmax_fused.default, (x, y, torch.tensor([0.5])) + args)
        opcheck(torch.ops.fusedloss.lovasz_softmax_fused.default, (x, y, None) + args)
        opcheck(torch.ops.fusedloss.lovasz_softmax_loss_and_grad.default, (x, y) + args,
                test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
        xr = x.clone().requires_grad_()
        opcheck(torch.ops.fusedloss.lovasz_softmax_forward.default, (xr, y) + args)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    x, y = make((2, 3, 4, 4), torch.float32, device, 15)
    with pytest.raises(ValueError, match="classes"):
        fusedloss.lovasz_softmax(x, y, classes=[0, 1])
    with pytest.raises(ValueError, match="classes"):
        fusedloss.LovaszSoftmaxLoss(classes="some")
    with pytest.raises(ValueError, match="labels shape"):
        fusedloss.lovasz_softmax(x, y[:, :3])
    with pytest.raises(TypeError, match="labels"):
        fusedloss.lovasz_softmax(x, y.float())
    with pytest.raises(TypeError, match="floating-point"):
        fusedloss.lovasz_softmax(y, y)
    yb = y.clone()
    yb[1, 2, 3] = 3
    if device == "cuda":
        # no host sync on CUDA: NaN loss, NaN gradient at the bad pixel, the device error flag set
        fusedloss.check_errors()  # start clean
        xb = x.clone().requires_grad_()
        loss = fusedloss.lovasz_softmax(xb, yb)
        loss.backward()
        assert torch.isnan(loss).item()
        assert torch.isnan(xb.grad[1, :, 2, 3]).all().item()
        assert torch.isfinite(xb.grad[0]).all().item()
        with pytest.raises(fusedloss.TargetOutOfRangeError):
            fusedloss.check_errors()
        fusedloss.check_errors()  # the flag was reset
    else:
        with pytest.raises(fusedloss.TargetOutOfRangeError, match="labels"):
            fusedloss.lovasz_softmax(x, yb)
    with pytest.raises(IndexError):
        fusedloss.lovasz_softmax(x.double(), yb)
    if device == "cpu":
        with pytest.raises(ValueError, match="contiguous"):
            torch.ops.fusedloss.lovasz_softmax_forward(x.reshape(2, 3, 16).transpose(1, 2).contiguous()
                                                       .transpose(1, 2), y.reshape(2, 16), 0, False, False, -100)
        with pytest.raises(ValueError, match="grad"):
            torch.ops.fusedloss.lovasz_softmax_fused(x.reshape(2, 3, 16), y.reshape(2, 16), torch.ones(2), 0, False,
                                                     False, -100)


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_and_determinism(dtype):
    x, y = make((2, 19, 33, 31), dtype, "cuda", 16, from_logits=True)
    x, y = x.reshape(2, 19, -1), y.reshape(2, -1)   # the ops take [N, C, d], [N, d]
    args = (0, False, True, -100)
    l1, g1 = torch.ops.fusedloss.lovasz_softmax_loss_and_grad(x, y, *args)
    l2, g2 = torch.ops.fusedloss.lovasz_softmax_loss_and_grad(x, y, *args)
    assert torch.equal(l1, l2) and torch.equal(g1, g2)   # bitwise, run to run
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(graph):
            l3, g3 = torch.ops.fusedloss.lovasz_softmax_loss_and_grad(x, y, *args)
    torch.cuda.current_stream().wait_stream(s)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(l3, l1) and torch.equal(g3, g1)


def test_workspace_size():
    o = fusedloss._lib.lovasz_options(from_logits=True)
    n = fusedloss._lib.lovasz_softmax_workspace_size(3, 19, 7, fusedloss._lib.FL_DTYPE_F32, o)
    assert n == 64 + 16 * 21 + 8 * 19 + 8 * 21 + 8 * 21 * 19
    assert fusedloss._lib.lovasz_softmax_workspace_size(3, 19, 7, 0) == 64 + 16 * 21 + 8 * 19
