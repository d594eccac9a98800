"""Tests of fusedloss.distillation_loss / kl_div_logits / jsd_logits / DistillationLoss
(fusedloss.distill, the ops of include/fusedloss.h section 10) against a float64 PyTorch
reference written from the header's definitions (log_softmax, F.kl_div(log_target=True) for the
two KL divergences, the generalised JSD formula with M = beta P + (1 - beta) Q), evaluated on the
same (rounded) inputs: loss and student gradient for beta 0 / 1 / 0.5 / 0.1, T 1 and 2 with and
without T^2 scaling, every reduction (none / sum / mean / batchmean), ignored rows (and all rows
ignored), fp32 / fp16 / bf16 students, an fp32 teacher with a bf16 student, upstream gradient 1 and
not 1, gradient accumulation, non-contiguous and 3-D inputs, odd V (9000 crosses the 8192-column
chunk of the CUDA backend, 50257 the GPT-2 vocabulary), torch.compile(fullgraph=True),
torch.library.opcheck on the three ops, double backward, the fallbacks and bad arguments. CUDA
cases skip without a GPU (and a CUDA build of the library).

Run (CPU, CI): make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_distill.py
"""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from fusedloss import distill  # noqa: E402
from _zoo_util import DEVICES, close, needs_cuda  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDS = ["none", "sum", "mean", "batchmean"]
BETAS = [0.0, 1.0, 0.5, 0.1]

# (atol, rtol) per dtype, for the loss and the student gradient: |got - ref| <= atol * max|ref| +
# rtol * |ref| (atol relative to the tensor's largest magnitude: gradients scale as 1 / (N V)).
# The loss is computed in fp32 (CUDA) / double (CPU) and rounded once to the dtype; so is the
# gradient, and an upstream gradient != 1 of a scalar loss rounds it a second time (the scale).
TOL = {
    torch.float32: {"loss": (1e-5, 2e-5), "grad": (3e-5, 1e-4)},
    torch.float16: {"loss": (1e-5, 2e-3), "grad": (3e-4, 2e-3)},
    torch.bfloat16: {"loss": (1e-5, 1.6e-2), "grad": (3e-3, 1.6e-2)},
}


# ---- reference (float64, from the definitions of include/fusedloss.h section 10) -------------------
def ref_rows(s, t, T, beta):
    """Per-row divergence of student logits s and teacher logits t ([N, V], float64)."""
    lq = F.log_softmax(s / T, dim=-1)  # student Q
    lp = F.log_softmax(t / T, dim=-1)  # teacher P
    if beta == 0:
        return F.kl_div(lq, lp, reduction="none", log_target=True).sum(-1)  # KL(P || Q)
    if beta == 1:
        return F.kl_div(lp, lq, reduction="none", log_target=True).sum(-1)  # KL(Q || P)
    p, q = lp.exp(), lq.exp()
    lm = torch.log(beta * p + (1 - beta) * q)
    return beta * (p * (lp - lm)).sum(-1) + (1 - beta) * (q * (lq - lm)).sum(-1)


def ref_loss(s, t, labels=None, T=1.0, beta=0.0, ignore_index=-100, reduction="batchmean", t2_scale=False):
    V = s.shape[-1]
    lead = s.shape[:-1]
    l = ref_rows(s.reshape(-1, V), t.reshape(-1, V), T, beta)
    if t2_scale:
        l = l * T * T
    N = l.shape[0]
    n_kept = N
    if labels is not None:
        keep = labels.reshape(-1) != ignore_index
        l = torch.where(keep, l, torch.zeros((), dtype=l.dtype))
        n_kept = int(keep.sum())
    if reduction == "none":
        return l.reshape(lead)
    if reduction == "sum":
        return l.sum()
    if reduction == "batchmean":
        return l.sum() / N
    return l.sum() / n_kept if n_kept else l.sum() * float("nan")


def make(shape, dtype, device, seed=0, scale=3.0, teacher_dtype=None):
    """Random student / teacher logits (seeded; never zeros), rounded to the dtypes, on device."""
    g = torch.Generator().manual_seed(seed)
    s = (scale * torch.randn(shape, generator=g)).to(dtype)
    t = (scale * torch.randn(shape, generator=g) + 0.5 * s.float()).to(teacher_dtype or dtype)
    return s.to(device), t.to(device)


def make_labels(lead, device, ignored=(1,), seed=0, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed + 100)
    n = math.prod(lead)
    lab = torch.randint(0, 1000, (n,), generator=g)
    for i in ignored:
        lab[i % n] = -100
    return lab.to(dtype).reshape(lead).to(device)


def run_and_ref(s, t, labels, upstream, **kw):
    """Loss and student gradient of fusedloss.distillation_loss and of the float64 reference."""
    sg = s.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, t, labels, **kw)
    if upstream == "one":
        up = torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)
    else:
        gen = torch.Generator().manual_seed(7)
        up = (torch.rand(loss.shape, generator=gen) + 0.5).to(loss.device, loss.dtype)
    loss.backward(up)
    sd = s.detach().double().cpu().requires_grad_(True)
    ref = ref_loss(sd, t.detach().double().cpu(), None if labels is None else labels.cpu(), **_ref_kw(kw))
    (rds,) = torch.autograd.grad(ref, sd, up.double().cpu())
    return loss, sg.grad, ref, rds


def _ref_kw(kw):
    return {"T": kw.get("temperature", 1.0), "beta": kw.get("beta", 0.0),
            "ignore_index": kw.get("ignore_index", -100), "reduction": kw.get("reduction", "batchmean"),
            "t2_scale": kw.get("t2_scale", False)}


# ---- the grid --------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("T,t2", [(1.0, False), (2.0, False), (2.0, True)])
@pytest.mark.parametrize("reduction", REDS)
def test_grid(device, dtype, beta, T, t2, reduction):
    s, t = make((7, 37), dtype, device, seed=3)
    labels = make_labels((7,), device, ignored=(2, 5))
    loss, ds, ref, rds = run_and_ref(s, t, labels, "rand", temperature=T, beta=beta, reduction=reduction,
                                     t2_scale=t2)
    assert loss.dtype == dtype and ds.dtype == dtype
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(ds, rds, TOL[dtype]["grad"], "dstudent")
    assert (ds[2] == 0).all() and (ds[5] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", ["sum", "mean", "batchmean"])
def test_upstream_one_no_labels(device, dtype, beta, reduction):
    """loss.backward() (upstream 1: the gradient formed in the forward is used as is)."""
    s, t = make((5, 64), dtype, device, seed=4)
    loss, ds, ref, rds = run_and_ref(s, t, None, "one", temperature=2.0, beta=beta, reduction=reduction,
                                     t2_scale=True)
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(ds, rds, TOL[dtype]["grad"], "dstudent")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_all_ignored(device, reduction, beta):
    s, t = make((4, 19), torch.float32, device, seed=5)
    labels = torch.full((4,), -7, dtype=torch.int64, device=device)
    sg = s.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, t, labels, ignore_index=-7, beta=beta, reduction=reduction)
    if reduction == "mean":
        assert torch.isnan(loss).item()
    elif reduction == "none":
        assert loss.shape == (4,) and (loss == 0).all()
    else:
        assert loss.item() == 0.0
    loss.sum().backward() if reduction == "none" else loss.backward()
    assert torch.equal(sg.grad, torch.zeros_like(s))


@pytest.mark.parametrize("device", DEVICES)
def test_teacher_fp32_bf16_student(device):
    s, t = make((6, 300), torch.bfloat16, device, seed=6, teacher_dtype=torch.float32)
    assert t.dtype == torch.float32
    for beta in BETAS:
        loss, ds, ref, rds = run_and_ref(s, t, None, "rand", temperature=2.0, beta=beta, t2_scale=True)
        close(loss, ref, TOL[torch.bfloat16]["loss"], f"loss beta={beta}")
        close(ds, rds, TOL[torch.bfloat16]["grad"], f"dstudent beta={beta}")
    # the fp32 teacher is read as such (not rounded to bf16): the raw op takes it directly
    l32 = distill.distill_forward(s, t, None, 2.0, 0.0, -100, 2, False)
    l16 = distill.distill_forward(s, t.bfloat16(), None, 2.0, 0.0, -100, 2, False)
    r32 = ref_loss(s.double().cpu(), t.double().cpu(), reduction="sum", T=2.0)
    assert abs(l32.item() - r32.item()) <= abs(l16.item() - r32.item()) + 1e-5 * abs(r32.item())


@pytest.mark.parametrize("device", DEVICES)
def test_other_teacher_dtype_is_cast_to_student(device):
    s, t = make((5, 33), torch.bfloat16, device, seed=7, teacher_dtype=torch.float16)
    a = fusedloss.distillation_loss(s, t, beta=0.5)
    b = fusedloss.distillation_loss(s, t.to(torch.bfloat16), beta=0.5)
    assert torch.equal(a, b)
    s64t = fusedloss.distillation_loss(s.float(), t.double())  # float64 teacher, fp32 student
    close(s64t, ref_loss(s.double().cpu(), t.float().double().cpu()), TOL[torch.float32]["loss"], "f64 teacher")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_gradient_accumulation(device, reduction):
    s, t = make((6, 40), torch.float32, device, seed=8)
    t2 = make((6, 40), torch.float32, device, seed=9)[1]
    labels = make_labels((6,), device, ignored=(0,))
    sg = s.clone().requires_grad_(True)
    for tt, w in ((t, 1.0), (t2, 0.5)):
        loss = fusedloss.distillation_loss(sg, tt, labels, temperature=2.0, beta=0.5, reduction=reduction)
        (loss.sum() * w).backward()
    sd = s.double().cpu().requires_grad_(True)
    tot = sum(ref_loss(sd, tt.double().cpu(), labels.cpu(), T=2.0, beta=0.5, reduction=reduction).sum() * w
              for tt, w in ((t, 1.0), (t2, 0.5)))
    tot.backward()
    close(sg.grad, sd.grad, TOL[torch.float32]["grad"], "accumulated grad")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["none", "batchmean"])
def test_non_contiguous(device, reduction):
    """A student of row stride > V (a column slice: passed as ld, no copy) and a transposed teacher
    (made contiguous); results equal those of contiguous copies."""
    base, tb = make((6, 50), torch.float32, device, seed=10)
    s = base[:, 3:40]                      # row stride 50 > V = 37
    t = tb.t().contiguous().t()[:, 5:42]   # column stride != 1
    assert not s.is_contiguous() and t.stride(1) != 1
    labels = make_labels((6,), device, ignored=(4,))
    sg = s.detach().clone()  # contiguous copy
    a = base.clone().requires_grad_(True)
    la = fusedloss.distillation_loss(a[:, 3:40], t, labels, temperature=2.0, beta=0.1, reduction=reduction)
    b = sg.clone().requires_grad_(True)
    lb = fusedloss.distillation_loss(b, t.contiguous(), labels, temperature=2.0, beta=0.1, reduction=reduction)
    up = torch.rand(la.shape, device=device) + 0.5
    la.backward(up)
    lb.backward(up)
    if device == "cpu":   # sequential sums: bitwise
        assert torch.equal(la, lb)
        assert torch.equal(a.grad[:, 3:40], b.grad)
    else:   # CUDA: a row of stride 50 is not 16-byte aligned like a contiguous one (scalar vs vector
        # path: another summation order)
        close(la, lb, TOL[torch.float32]["loss"], "strided loss")
        close(a.grad[:, 3:40], b.grad, TOL[torch.float32]["grad"], "strided dstudent")
    assert (a.grad[:, :3] == 0).all() and (a.grad[:, 40:] == 0).all()
    # the raw op keeps the student's row stride for dstudent
    d = distill.distill_fused(s, t.contiguous(), labels, None, 2.0, 0.1, -100, 3, False)
    assert d.stride() == s.stride()
    d2 = distill.distill_fused(sg, t.contiguous(), labels, None, 2.0, 0.1, -100, 3, False)
    if device == "cpu":
        assert torch.equal(d, d2)
    else:
        close(d, d2, TOL[torch.float32]["grad"], "strided raw dstudent")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDS)
def test_3d_llm_shape(device, dtype, reduction):
    s, t = make((2, 5, 29), dtype, device, seed=11)
    labels = make_labels((2, 5), device, ignored=(0, 7, 9))
    loss, ds, ref, rds = run_and_ref(s, t, labels, "rand", temperature=2.0, t2_scale=True, reduction=reduction)
    assert loss.shape == ((2, 5) if reduction == "none" else ())
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(ds, rds, TOL[dtype]["grad"], "dstudent")
    # labels may also be given flattened ([N]), as shifted LLM labels often are
    l2 = fusedloss.distillation_loss(s, t, labels.reshape(-1), temperature=2.0, t2_scale=True, reduction=reduction)
    assert torch.equal(l2, loss.detach())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N,V", [(3, 50257), (5, 9000), (2, 8193)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_large_odd_vocab(device, N, V, dtype, beta):
    s, t = make((N, V), dtype, device, seed=V)
    labels = make_labels((N,), device, ignored=(1,)) if N > 2 else None
    loss, ds, ref, rds = run_and_ref(s, t, labels, "rand", temperature=2.0, beta=beta, t2_scale=True,
                                     reduction="sum")
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(ds, rds, TOL[dtype]["grad"], "dstudent")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N,V", [(4, 300), (3, 9000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_masked_classes(device, N, V, dtype, beta):
    """-inf in the same columns of student and teacher is a masked class (header: no NaN): the
    loss and gradient equal those of the rows without those columns, and their gradient is 0.
    Runs of 32 masked columns cover whole 16-byte vectors and every thread's first vector of a
    row (the CUDA kernels gave NaN there before 2026-12-02); (3, 9000) takes the staged kernel on
    sm_90 for beta 0 / 1."""
    s, t = make((N, V), dtype, device, seed=V + 3)
    masked = torch.tensor([(k // 32) % 3 == 0 for k in range(V)])
    s, t = s.clone(), t.clone()
    s[:, masked.to(device)] = float("-inf")
    t[:, masked.to(device)] = float("-inf")
    labels = make_labels((N,), device, ignored=(1,))
    kw = dict(temperature=2.0, beta=beta, t2_scale=True, reduction="sum")
    sg = s.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, t, labels, **kw)
    gen = torch.Generator().manual_seed(7)
    up = (torch.rand(loss.shape, generator=gen) + 0.5).to(loss.device, loss.dtype)
    loss.backward(up)
    keep = ~masked
    sd = s.detach().double().cpu()[:, keep].requires_grad_(True)
    ref = ref_loss(sd, t.detach().double().cpu()[:, keep], labels.cpu(), **_ref_kw(kw))
    (rk,) = torch.autograd.grad(ref, sd, up.double().cpu())
    rds = torch.zeros(N, V, dtype=torch.float64)
    rds[:, keep] = rk
    assert torch.isfinite(loss).all() and torch.isfinite(sg.grad).all()
    close(loss, ref, TOL[dtype]["loss"], "loss")
    close(sg.grad, rds, TOL[dtype]["grad"], "dstudent")
    assert (sg.grad[:, masked.to(device)] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_int32_labels_and_kwargs(device):
    s, t = make((6, 21), torch.float16, device, seed=12)
    l64 = make_labels((6,), device, ignored=(3,))
    a = fusedloss.distillation_loss(s, t, l64, reduction="mean", beta=0.5)
    b = fusedloss.distillation_loss(s, t, l64.int(), reduction="mean", beta=0.5)
    c = fusedloss.distillation_loss(s, t, l64.to(torch.int16), reduction="mean", beta=0.5)  # cast to int64
    assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_hinton_identity(device):
    """F.kl_div(log_softmax(s/T), log_softmax(t/T), log_target=True, 'batchmean') * T^2."""
    s, t = make((8, 100), torch.float32, device, seed=13)
    T = 2.0
    ref = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), reduction="batchmean",
                   log_target=True) * T * T
    got = fusedloss.distillation_loss(s, t, temperature=T, t2_scale=True)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_thin_names_and_module(device):
    s, t = make((4, 30), torch.float32, device, seed=14)
    labels = make_labels((4,), device, ignored=(2,))
    kw = dict(temperature=1.5, reduction="sum", t2_scale=True)
    assert torch.equal(fusedloss.kl_div_logits(s, t, labels, **kw),
                       fusedloss.distillation_loss(s, t, labels, beta=0.0, **kw))
    assert torch.equal(fusedloss.kl_div_logits(s, t, labels, reverse=True, **kw),
                       fusedloss.distillation_loss(s, t, labels, beta=1.0, **kw))
    assert torch.equal(fusedloss.jsd_logits(s, t, labels, **kw),
                       fusedloss.distillation_loss(s, t, labels, beta=0.5, **kw))
    assert torch.equal(fusedloss.jsd_logits(s, t, labels, beta=0.2, **kw),
                       fusedloss.distillation_loss(s, t, labels, beta=0.2, **kw))
    m = fusedloss.DistillationLoss(temperature=1.5, beta=0.5, reduction="sum", t2_scale=True)
    assert torch.equal(m(s, t, labels), fusedloss.distillation_loss(s, t, labels, beta=0.5, **kw))
    assert "beta=0.5" in repr(m)
    with pytest.raises(ValueError, match="temperature"):
        fusedloss.DistillationLoss(temperature=0.0)
    with pytest.raises(ValueError, match="reduction"):
        fusedloss.DistillationLoss(reduction="avg")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_empty(device, reduction):
    s = torch.randn(0, 11, device=device, requires_grad=True)
    t = torch.randn(0, 11, device=device)
    loss = fusedloss.distillation_loss(s, t, reduction=reduction)
    if reduction == "none":
        assert loss.shape == (0,)
    elif reduction == "sum":
        assert loss.item() == 0.0
    else:
        assert torch.isnan(loss).item()
    loss.sum().backward()
    assert s.grad.shape == (0, 11)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_and_detached_student(device):
    s, t = make((5, 17), torch.float32, device, seed=15)
    ref = fusedloss.distillation_loss(s, t, beta=0.5)
    sg = s.clone().requires_grad_(True)
    with torch.no_grad():
        a = fusedloss.distillation_loss(sg, t, beta=0.5)
    b = fusedloss.distillation_loss(sg, t, beta=0.5)
    assert not a.requires_grad and b.requires_grad
    assert torch.equal(a, ref) and torch.equal(b.detach(), ref)


@pytest.mark.parametrize("device", DEVICES)
def test_c_calls_per_path(device, monkeypatch):
    """Scalar loss, student requiring grad: one fused call in the forward, none in the backward
    (only the in-place scale); reduction none: forward, then fused with the per-row gradient; no
    grad: the forward only."""
    calls = []
    real = distill._sym

    def rec(name):
        calls.append(name)
        return real(name)
    monkeypatch.setattr(distill, "_sym", rec)
    sfx = "cuda" if device == "cuda" else "cpu"
    s, t = make((4, 25), torch.float32, device, seed=27)
    sg = s.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, t, temperature=2.0, t2_scale=True)
    assert calls == [f"fl_distill_fused_{sfx}"]
    loss.backward()
    assert calls == [f"fl_distill_fused_{sfx}"]
    calls.clear()
    fusedloss.distillation_loss(sg, t, reduction="none").sum().backward()
    assert calls == [f"fl_distill_forward_{sfx}", f"fl_distill_fused_{sfx}"]
    calls.clear()
    fusedloss.distillation_loss(s, t, reduction="mean")
    assert calls == [f"fl_distill_forward_{sfx}"]


# ---- fallbacks ---------------------------------------------------------------------------------
def test_fallback_float64():
    s, t = make((5, 23), torch.float64, "cpu", seed=16)
    labels = make_labels((5,), "cpu")
    loss, ds, ref, rds = run_and_ref(s, t, labels, "rand", temperature=2.0, beta=0.1, reduction="mean")
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ds, rds, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("beta", BETAS)
def test_fallback_teacher_requires_grad(device, beta):
    """A teacher that requires grad: the PyTorch formula, differentiating both inputs."""
    s, t = make((4, 19), torch.float32, device, seed=17)
    sg, tg = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, tg, temperature=2.0, beta=beta, reduction="sum")
    loss.backward()
    sd, td = s.double().cpu().requires_grad_(True), t.double().cpu().requires_grad_(True)
    ref = ref_loss(sd, td, T=2.0, beta=beta, reduction="sum")
    ref.backward()
    close(loss, ref, TOL[torch.float32]["loss"], "loss")
    close(sg.grad, sd.grad, TOL[torch.float32]["grad"], "dstudent")
    close(tg.grad, td.grad, TOL[torch.float32]["grad"], "dteacher")


# ---- autograd rules --------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
def test_double_backward_raises(device, reduction):
    s, t = make((4, 13), torch.float32, device, seed=18)
    sg = s.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, t, beta=0.5, reduction=reduction).sum()
    with pytest.raises(RuntimeError, match="double backward"):
        (g,) = torch.autograd.grad(loss, sg, create_graph=True)
        g.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_backward_twice_raises(device):
    s, t = make((4, 13), torch.float32, device, seed=19)
    sg = s.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()


@pytest.mark.parametrize("device", DEVICES)
def test_none_reduction_backward_twice_ok(device):
    s, t = make((4, 13), torch.float32, device, seed=20)
    sg = s.clone().requires_grad_(True)
    loss = fusedloss.distillation_loss(sg, t, reduction="none")
    loss.sum().backward(retain_graph=True)
    g1 = sg.grad.clone()
    loss.sum().backward()
    torch.testing.assert_close(sg.grad, 2 * g1)


# ---- torch.compile and opcheck ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph(device, dtype):
    s, t = make((2, 6, 45), dtype, device, seed=21)
    labels = make_labels((2, 6), device, ignored=(1, 8))
    crit = fusedloss.DistillationLoss(temperature=2.0, t2_scale=True)

    def f(a, b, lab):
        return crit(a, b, lab) + 0.5 * fusedloss.jsd_logits(a, b, lab, reduction="mean") + \
            0.25 * fusedloss.distillation_loss(a, b, lab, beta=1.0, reduction="none").float().sum()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager" if device == "cpu" else "inductor")
    xa = s.clone().requires_grad_(True)
    xb = s.clone().requires_grad_(True)
    la, lb = f(xa, t, lab=labels), cf(xb, t, lab=labels)
    (la * 0.7).backward()
    (lb * 0.7).backward()
    # eager scales the kept 16-bit gradient in place, inductor multiplies in its own fused order: both
    # round twice, not always to the same neighbour, so compare within the dtype's tolerance
    close(lb, la, TOL[dtype]["loss"], "compiled loss")
    close(xb.grad, xa.grad, TOL[dtype]["grad"], "compiled vs eager dstudent")
    # and against the reference
    sd = s.double().cpu().requires_grad_(True)
    td, lc = t.double().cpu(), labels.cpu()
    ref = ref_loss(sd, td, lc, T=2.0, t2_scale=True) + 0.5 * ref_loss(sd, td, lc, beta=0.5, reduction="mean") + \
        0.25 * ref_loss(sd, td, lc, beta=1.0, reduction="none").sum()
    (ref * 0.7).backward()
    close(xb.grad, sd.grad, TOL[dtype]["grad"], "compiled dstudent")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from torch.library import opcheck
    for dtype, tdt, (N, V), strided, lab in [
        (torch.float32, torch.float32, (6, 9), False, True),
        (torch.bfloat16, torch.float32, (5, 12), True, True),
        (torch.float16, torch.float16, (4, 7), False, False),
    ]:
        s, t = make((N, V + 3 if strided else V), dtype, device, seed=22, teacher_dtype=tdt)
        if strided:
            s, t = s[:, :V], t[:, 1:V + 1]
        labels = make_labels((N,), device, ignored=(1,)) if lab else None
        for red in (0, 1, 2, 3):
            args = (2.0, 0.5 if red % 2 else 0.0, -100, red, red >= 2)
            sg = s.detach().clone().requires_grad_(True) if not strided else s.detach().requires_grad_(True)
            opcheck(torch.ops.fusedloss.distill_forward.default, (sg, t, labels) + args)
            opcheck(torch.ops.fusedloss.distill_forward.default, (s.detach(), t, labels) + args)
            opcheck(torch.ops.fusedloss.distill_loss_and_grad.default, (sg, t, labels) + args)
            g = torch.rand(N if red == 0 else 1, device=device) + 0.5
            opcheck(torch.ops.fusedloss.distill_fused.default, (s.detach(), t, labels, g) + args)
            opcheck(torch.ops.fusedloss.distill_fused.default, (s.detach(), t, labels, None) + args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("red", [0, 1, 2, 3])
def test_raw_ops_agree(device, red):
    s, t = make((6, 33), torch.float32, device, seed=23)
    labels = make_labels((6,), device, ignored=(2,))
    args = (2.0, 0.3, -100, red, True)
    loss = distill.distill_forward(s, t, labels, *args)
    loss2, d1 = distill.distill_loss_and_grad(s, t, labels, *args)
    torch.testing.assert_close(loss, loss2, rtol=1e-6, atol=0)
    d_none = distill.distill_fused(s, t, labels, None, *args)
    ones = torch.ones(6 if red == 0 else 1, device=device)
    torch.testing.assert_close(d_none, d1, rtol=1e-6, atol=0)
    torch.testing.assert_close(distill.distill_fused(s, t, labels, ones, *args), d1, rtol=1e-6, atol=0)
    g = torch.rand(6 if red == 0 else 1, device=device) + 0.5
    dg = distill.distill_fused(s, t, labels, g, *args)
    torch.testing.assert_close(dg, d1 * (g[:, None] if red == 0 else g), rtol=1e-5, atol=1e-9)
    assert loss.shape == ((6,) if red == 0 else ())


# ---- bad arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    s, t = make((4, 10), torch.float32, device, seed=24)
    for T in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            fusedloss.distillation_loss(s, t, temperature=T)
    for b in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="beta"):
            fusedloss.distillation_loss(s, t, beta=b)
    with pytest.raises(ValueError, match="reduction"):
        fusedloss.distillation_loss(s, t, reduction="avg")
    with pytest.raises(ValueError, match="shape"):
        fusedloss.distillation_loss(s, t[:, :9])
    with pytest.raises(ValueError, match="shape"):
        fusedloss.distillation_loss(s, t[:3])
    with pytest.raises(ValueError, match="labels"):
        fusedloss.distillation_loss(s, t, torch.zeros(3, dtype=torch.long, device=device))
    with pytest.raises(TypeError, match="labels"):
        fusedloss.distillation_loss(s, t, torch.zeros(4, device=device))
    with pytest.raises(TypeError):
        fusedloss.distillation_loss(s.cpu().numpy(), t)
    # the raw ops
    with pytest.raises(ValueError, match="2-D"):
        distill.distill_forward(s.reshape(2, 2, 10), t.reshape(2, 2, 10), None, 1.0, 0.0, -100, 1, False)
    with pytest.raises(TypeError, match="teacher dtype"):
        distill.distill_forward(s.bfloat16(), t.half(), None, 1.0, 0.0, -100, 1, False)
    with pytest.raises(ValueError, match="reduction"):
        distill.distill_forward(s, t, None, 1.0, 0.0, -100, 4, False)
    with pytest.raises(ValueError, match="beta"):
        distill.distill_fused(s, t, None, None, 1.0, 2.0, -100, 1, False)
    with pytest.raises(ValueError, match="grad"):
        distill.distill_fused(s, t, None, torch.ones(4, device=device), 1.0, 0.0, -100, 1, False)
    with pytest.raises(ValueError, match="column stride"):
        distill.distill_forward(s.t().contiguous().t(), t, None, 1.0, 0.0, -100, 1, False)


# ---- CUDA specifics ---------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_cuda_matches_cpu(beta):
    s, t = make((7, 20000), torch.bfloat16, "cpu", seed=25, teacher_dtype=torch.float32)
    labels = make_labels((7,), "cpu", ignored=(3,))
    args = (2.0, beta, -100, 0, True)
    lc, dc = distill.distill_loss_and_grad(s, t, labels, *args)
    lg, dg = distill.distill_loss_and_grad(s.cuda(), t.cuda(), labels.cuda(), *args)
    torch.testing.assert_close(lg.cpu(), lc, rtol=1e-4, atol=1e-6)
    close(dg, dc.float(), TOL[torch.bfloat16]["grad"], "cuda vs cpu dstudent")


@needs_cuda
def test_cuda_side_stream():
    s, t = make((8, 5000), torch.float32, "cuda", seed=26)
    ref = fusedloss.distillation_loss(s, t, beta=0.5)
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        got = fusedloss.distillation_loss(s, t, beta=0.5)
    torch.cuda.current_stream().wait_stream(st)
    assert torch.equal(got, ref)
