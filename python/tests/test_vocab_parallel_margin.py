"""Tests of fusedloss.vocab_parallel_margin_cross_entropy / margin_shard_logits (the margin softmax CE
of header section 11 on class-sharded cosines, composed from the vocab-parallel CE).

  * world size 1 (torch.distributed not initialised): fp32 equals the single-GPU op
    fusedloss.margin_cross_entropy (loss and gradient) for ArcFace, CosFace, a combined margin,
    easy_margin and the straight-through gradient, every reduction, ignored rows; 16-bit cosines
    equal a float64 reference that rounds phi to the cosines' dtype (insightface's assignment);
  * sharding of the margin step: for uneven splits of the classes, the shards' margin_shard_logits
    concatenated are bitwise the unsharded one, and so are their gradients (each target is replaced
    on exactly one shard, or none when ignored);
  * the multi-rank loss and gradients over real gloo process groups run in test_vocab_parallel.py's
    spawn (_margin_case);
  * bad arguments.
CUDA cases skip without a GPU.
"""
import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import fusedloss  # noqa: E402
from fusedloss.softmax_losses import _margin_phi  # noqa: E402
from fusedloss.vocab_parallel_margin import margin_shard_logits  # noqa: E402
from _zoo_util import DEVICES, close  # noqa: E402

MARGINS = {  # name -> (s, m1, m2, m3, easy_margin, grad_mode)
    "arcface": (64.0, 1.0, 0.5, 0.0, False, "exact"),
    "cosface": (30.0, 1.0, 0.0, 0.4, False, "exact"),
    "combined": (32.0, 1.1, 0.3, 0.1, False, "exact"),
    "arcface-easy": (64.0, 1.0, 0.5, 0.0, True, "exact"),
    "arcface-straight": (64.0, 1.0, 0.5, 0.0, False, "straight"),
}


def make(device, dtype, N, C, seed, frac_ignored=0.2):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand((N, C), generator=g, dtype=torch.float64) * 1.9 - 0.95)
    t = torch.randint(0, C, (N,), generator=g)
    # a few confident rows (cos near 1 at the target) and one theta + m2 > pi row
    x[0, t[0]] = 0.999
    x[1, t[1]] = -0.99
    t[torch.rand(N, generator=g) < frac_ignored] = -100
    return x.to(dtype).to(device), t.to(device)


def reference16(x, t, s, m1, m2, m3, easy, grad_mode, reduction, dtype):
    """float64 loss of z = s x, z_y = s * round_dtype(phi(x_y)); differentiable in x (float64)."""
    keep = t != -100
    tc = torch.where(keep, t, torch.zeros_like(t))
    xy = x.gather(1, tc[:, None]).squeeze(1)
    if grad_mode == "straight":
        phi = xy + (_margin_phi(xy.detach(), m1, m2, m3, easy) - xy.detach())
    else:
        phi = _margin_phi(xy, m1, m2, m3, easy)
    phi = phi + (phi.detach().to(dtype).double() - phi.detach())
    z = (s * x).scatter(1, tc[:, None], (s * phi)[:, None])
    l = F.cross_entropy(z, tc, reduction="none") * keep.double()
    if reduction == "none":
        return l
    if reduction == "sum":
        return l.sum()
    return l.sum() / keep.sum().double()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("margin", list(MARGINS))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_world_size_1_equals_single_gpu_op_fp32(device, margin, reduction):
    s, m1, m2, m3, easy, gm = MARGINS[margin]
    x, t = make(device, torch.float32, 37, 101, seed=list(MARGINS).index(margin))
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    got = fusedloss.vocab_parallel_margin_cross_entropy(a, t, 0, 101, s=s, m1=m1, m2=m2, m3=m3, easy_margin=easy,
                                                        grad_mode=gm, reduction=reduction, vocab_size=101)
    ref = fusedloss.margin_cross_entropy(b, t, s=s, m1=m1, m2=m2, m3=m3, easy_margin=easy, grad_mode=gm,
                                         reduction=reduction)
    close(got, ref, (1e-6, 1e-5), f"{margin} loss")
    g = torch.rand(got.shape, device=device) + 0.5
    (got * g).sum().backward()
    (ref * g).sum().backward()
    close(a.grad, b.grad, (1e-6, 1e-4), f"{margin} grad")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("margin", ["arcface", "cosface", "arcface-straight"])
def test_world_size_1_16bit_vs_rounded_reference(device, dtype, margin):
    s, m1, m2, m3, easy, gm = MARGINS[margin]
    x, t = make(device, dtype, 29, 64, seed=5)
    a = x.clone().requires_grad_(True)
    got = fusedloss.vocab_parallel_margin_cross_entropy(a, t, 0, 64, s=s, m1=m1, m2=m2, m3=m3, easy_margin=easy,
                                                        grad_mode=gm, vocab_size=64)
    xr = x.detach().cpu().double().requires_grad_(True)
    ref = reference16(xr, t.cpu(), s, m1, m2, m3, easy, gm, "mean", dtype)
    close(got, ref, (1e-6, 1e-5), f"{margin} {dtype} loss")
    got.backward()
    ref.backward()
    close(a.grad, xr.grad, (1e-2, 1e-2), f"{margin} {dtype} grad")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ends", [(40, 101), (1, 50, 51, 101), (33, 34, 100, 101)])
@pytest.mark.parametrize("margin", ["arcface", "combined", "arcface-straight"])
def test_sharded_margin_step_is_the_slice(device, ends, margin):
    _, m1, m2, m3, easy, gm = MARGINS[margin]
    x, t = make(device, torch.float32, 23, 101, seed=9)
    full_in = x.clone().requires_grad_(True)
    full = margin_shard_logits(full_in, t, 0, m1=m1, m2=m2, m3=m3, easy_margin=easy, grad_mode=gm)
    w = torch.randn(full.shape, device=device)
    (full * w).sum().backward()
    starts = (0,) + tuple(ends[:-1])
    replaced = torch.zeros(23, dtype=torch.long, device=device)
    for a0, a1 in zip(starts, ends):
        xin = x[:, a0:a1].clone().requires_grad_(True)
        part = margin_shard_logits(xin, t, a0, m1=m1, m2=m2, m3=m3, easy_margin=easy, grad_mode=gm)
        assert torch.equal(part, full[:, a0:a1].detach()), f"shard [{a0}, {a1})"
        replaced += (part != x[:, a0:a1]).sum(1)
        (part * w[:, a0:a1]).sum().backward()
        assert torch.equal(xin.grad, full_in.grad[:, a0:a1]), f"shard [{a0}, {a1}) grad"
    assert int(replaced.max()) <= 1 and int(replaced[t == -100].sum()) == 0


def test_bad_arguments():
    x, t = make("cpu", torch.float32, 4, 10, seed=1)
    vp = fusedloss.vocab_parallel_margin_cross_entropy
    with pytest.raises(ValueError, match="grad_mode"):
        vp(x, t, 0, 10, grad_mode="none")
    with pytest.raises(ValueError, match="grad_mode"):
        vp(x, t, 0, 10, grad_mode=1)
    with pytest.raises(ValueError, match="s"):
        vp(x, t, 0, 10, s=-1.0)
    with pytest.raises(TypeError, match="class indices"):
        vp(x, t.float(), 0, 10)
    with pytest.raises(TypeError, match="floating"):
        vp(t, t, 0, 10)
    with pytest.raises(ValueError):
        vp(x, t, 0, 9)   # the shard's width disagrees with [vocab_start, vocab_end)
