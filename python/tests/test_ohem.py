"""Tests of fusedloss.ohem_cross_entropy / OhemCrossEntropyLoss (fusedloss.ohem).

The reference is a float64 transcription of HRNet-Semantic-Segmentation's OhemCrossEntropy (per-pixel
CE with reduction 'none', softmax probability of the target, sort of the valid pixels, threshold =
max(p[min(min_kept, n - 1)], thresh), mean of the losses with p < threshold), evaluated on the same
rounded inputs, gradients by autograd. Cases: thresh 0.7 / 0.3 / None, min_kept below / above the
number of valid positions, class weights, label smoothing, ignored positions (some / all: NaN),
[N, C, H, W] / [N, C] inputs, every dtype, the three reductions, the module, torch.compile
(fullgraph, aot_eager on CPU), bad arguments. CUDA cases skip without a GPU.
"""
import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fusedloss  # noqa: E402
from _zoo_util import DEVICES, close  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (atol, rtol) for _zoo_util.close (atol relative to max |ref|): loss in fp32 from 16-bit logits,
# gradients rounded once to the dtype
LOSS_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-6, 1e-5), torch.bfloat16: (1e-6, 1e-5)}
GRAD_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (8e-3, 8e-3)}


def ohem_reference(x, t, thresh, min_kept, weight, ignore_index, reduction, eps):
    """HRNet's OhemCrossEntropy in float64 (class dimension 1), as a function of x (autograd)."""
    x = x.double()
    w = weight.double() if weight is not None else None
    pixel = F.cross_entropy(x, t, weight=w, ignore_index=ignore_index, reduction="none",
                            label_smoothing=eps).reshape(-1)
    with torch.no_grad():
        prob = F.softmax(x, dim=1)
        tt = t.clone()
        tt[tt == ignore_index] = 0
        pred = prob.gather(1, tt.unsqueeze(1)).reshape(-1)
        mask = t.reshape(-1) != ignore_index
        sp, ind = pred[mask].sort()
        if sp.numel() == 0:
            keep = torch.zeros_like(mask)
        else:
            min_value = sp[min(min_kept, sp.numel() - 1)]
            threshold = min_value if thresh is None else max(min_value.item(), thresh)
            keep = mask & (pred < threshold)
    kept = pixel * keep.double()
    if reduction == "none":
        return kept.reshape(t.shape)
    if reduction == "sum":
        return kept.sum()
    return kept.sum() / keep.sum().double()


def make(device, dtype, shape, C, ignore_frac, seed):
    g = torch.Generator().manual_seed(seed)
    N = shape[0]
    rest = shape[1:]
    x = (2.0 * torch.randn((N, C) + tuple(rest), generator=g)).to(dtype)
    t = torch.randint(0, C, (N,) + tuple(rest), generator=g)
    t[torch.rand(t.shape, generator=g) < ignore_frac] = 255
    return x.to(device), t.to(device)


CASES = [  # thresh, min_kept, weights, eps
    (0.7, 50, False, 0.0),
    (0.3, 10, True, 0.0),
    (None, 25, False, 0.1),
    (0.7, 100000, False, 0.0),   # min_kept > valid positions: keeps all but the easiest
    (0.9, 0, True, 0.05),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("layout", ["nchw", "rows"])
def test_vs_reference(device, dtype, case, reduction, layout):
    thresh, min_kept, use_w, eps = CASES[case]
    shape, C = ((2, 5, 7), 6) if layout == "nchw" else ((90,), 11)
    x, t = make(device, dtype, shape, C, 0.15, 1000 + case)
    w = (torch.rand(C, generator=torch.Generator().manual_seed(7)) + 0.25).to(device) if use_w else None
    xr = x.detach().cpu().double().requires_grad_(True)
    ref = ohem_reference(xr, t.cpu(), thresh, min_kept, w.cpu() if w is not None else None, 255, reduction, eps)
    xg = x.detach().clone().requires_grad_(True)
    got = fusedloss.ohem_cross_entropy(xg, t, thresh, min_kept, w, 255, reduction, eps)
    assert got.dtype == torch.float32
    close(got, ref, LOSS_TOL[dtype], f"ohem loss {reduction}")
    up = torch.randn(ref.shape, dtype=torch.float64) if reduction == "none" else torch.tensor(0.75, dtype=torch.float64)
    (ref * up).sum().backward()
    (got * up.to(device=device, dtype=torch.float32)).sum().backward()
    assert xg.grad.dtype == dtype
    close(xg.grad, xr.grad, GRAD_TOL[dtype], f"ohem grad {reduction}")


@pytest.mark.parametrize("device", DEVICES)
def test_keeps_at_least_min_kept_and_all_below_thresh(device):
    x, t = make(device, torch.float32, (4, 16, 16), 19, 0.1, 5)
    loss = fusedloss.ohem_cross_entropy(x, t, 0.7, 200, ignore_index=255, reduction="none")
    kept = loss != 0
    p = F.softmax(x.double(), 1).gather(1, t.clamp(max=18).unsqueeze(1)).squeeze(1)
    valid = t != 255
    assert int(kept.sum()) >= min(200, int(valid.sum()) - 1)
    assert bool((kept | ~(valid & (p < 0.7))).all()), "a valid position below thresh was dropped"
    assert not bool((kept & ~valid).any()), "an ignored position was kept"


@pytest.mark.parametrize("device", DEVICES)
def test_all_ignored_nan_and_zero_grad(device):
    x, t = make(device, torch.float32, (2, 4, 4), 5, 1.0, 3)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.ohem_cross_entropy(xg, t, ignore_index=255)
    assert math.isnan(loss.item())
    s = fusedloss.ohem_cross_entropy(xg, t, ignore_index=255, reduction="sum")
    assert s.item() == 0.0
    s.backward()
    assert bool((xg.grad == 0).all())


def test_module_and_repr():
    x, t = make("cpu", torch.float32, (2, 6, 6), 7, 0.2, 11)
    w = torch.rand(7) + 0.5
    m = fusedloss.OhemCrossEntropyLoss(thresh=0.6, min_kept=20, weight=w, ignore_index=255)
    got = m(x, t)
    ref = ohem_reference(x.double(), t, 0.6, 20, w, 255, "mean", 0.0)
    close(got, ref, LOSS_TOL[torch.float32], "module")
    assert "min_kept=20" in repr(m)
    assert m.state_dict()["weight"].shape == (7,)


def test_compile_fullgraph():
    x, t = make("cpu", torch.float32, (2, 5, 5), 6, 0.2, 13)
    fn = torch.compile(lambda a, b: fusedloss.ohem_cross_entropy(a, b, 0.7, 10, ignore_index=255),
                       backend="aot_eager", fullgraph=True)
    xg = x.clone().requires_grad_(True)
    got = fn(xg, t)
    got.backward()
    xr = x.double().requires_grad_(True)
    ref = ohem_reference(xr, t, 0.7, 10, None, 255, "mean", 0.0)
    ref.backward()
    close(got, ref, LOSS_TOL[torch.float32], "compiled loss")
    close(xg.grad, xr.grad, GRAD_TOL[torch.float32], "compiled grad")


@pytest.mark.parametrize("kw, exc, msg", [
    ({"reduction": "batchmean"}, ValueError, "reduction"),
    ({"min_kept": -1}, ValueError, "min_kept"),
    ({"min_kept": 2.5}, ValueError, "min_kept"),
    ({"thresh": 1.5}, ValueError, "thresh"),
])
def test_bad_arguments(kw, exc, msg):
    x, t = make("cpu", torch.float32, (1, 3, 3), 4, 0.0, 1)
    with pytest.raises(exc, match=msg):
        fusedloss.ohem_cross_entropy(x, t, **kw)
    with pytest.raises(TypeError, match="class indices"):
        fusedloss.ohem_cross_entropy(x, t.float())
