"""Tests of fusedloss.linear_distillation_loss / LinearDistillationLoss (fusedloss.linear_distill:
the distillation divergences of include/fusedloss.h section 10 on the logits of a linear head,
computed chunk by chunk without the [N, V] logits) against the unfused reference: the logits by
F.linear in the inputs' dtype (as the fused path rounds them), then a float64 formula of KL /
reverse KL / JSD_beta (log_softmax, F.kl_div(log_target=True), the JSD with M = beta P + (1 - beta)
Q) and its float64 gradient pulled back through the linear head in float64.

Covered: loss and the gradients of hidden, weight and bias for beta 0 / 1 / 0.5, T 1 and T 2 with
T^2 scaling, reductions none / sum / mean / batchmean, labels with ignored rows (and all ignored),
the teacher as logits and as hidden + weight (+ bias), forced small chunks (chunk_rows = 3 with
N = 10: a ragged last chunk), V = 1001, fp32 / bf16, upstream gradients 1 and != 1, 3-D inputs,
chunk sizing from byte_budget, that no [N, V] tensor is ever allocated (a dispatch mode watching
every op's output; on CUDA torch.cuda.max_memory_allocated), backward once / twice, gradient
accumulation, no_grad, the float64 fallback, torch.compile (aot_eager: the traced path) and bad
arguments. CUDA cases skip without a GPU (and a CUDA build of the library).

Run (CPU): make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_linear_distill.py
"""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import fusedloss  # noqa: E402
from fusedloss import linear_distill as LD  # noqa: E402
from _zoo_util import DEVICES, close, needs_cuda  # noqa: E402

REDS = ["none", "sum", "mean", "batchmean"]
BETAS = [0.0, 1.0, 0.5]
TEMPS = [(1.0, False), (2.0, True)]
N, H, V, HT = 10, 16, 1001, 12

# (atol, rtol) per dtype: |got - ref| <= atol * max|ref| + rtol * |ref|. The reference uses the
# same rounded logits; the fused path rounds dlogits to the dtype and runs the GEMMs in it (fp32
# accumulation inside), so bf16 gradients carry a few bf16 roundings; the loss is returned in the
# dtype (rounded once).
TOL = {
    torch.float32: {"loss": (1e-5, 2e-5), "grad": (2e-5, 1e-4)},
    torch.bfloat16: {"loss": (1e-5, 1.6e-2), "grad": (5e-3, 1.6e-2)},
}


# ---- reference ---------------------------------------------------------------------------------
def ref_rows(s, t, T, beta):
    lq = F.log_softmax(s / T, dim=-1)
    lp = F.log_softmax(t / T, dim=-1)
    if beta == 0:
        return F.kl_div(lq, lp, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(lp, lq, reduction="none", log_target=True).sum(-1)
    p, q = lp.exp(), lq.exp()
    lm = torch.log(beta * p + (1 - beta) * q)
    return beta * (p * (lp - lm)).sum(-1) + (1 - beta) * (q * (lq - lm)).sum(-1)


def ref_loss(s, t, labels, T, beta, ignore_index, reduction, t2_scale):
    lead, Vv = s.shape[:-1], s.shape[-1]
    l = ref_rows(s.reshape(-1, Vv), t.reshape(-1, Vv), T, beta)
    if t2_scale:
        l = l * T * T
    n, kept = l.shape[0], l.shape[0]
    if labels is not None:
        keep = labels.reshape(-1) != ignore_index
        l = torch.where(keep, l, torch.zeros((), dtype=l.dtype))
        kept = int(keep.sum())
    if reduction == "none":
        return l.reshape(lead)
    if reduction == "sum":
        return l.sum()
    if reduction == "batchmean":
        return l.sum() / n if n else l.sum() * math.nan
    return l.sum() / kept if kept else l.sum() * math.nan


def reference(h, W, b, teacher, labels, up, T=1.0, beta=0.0, ignore_index=-100, reduction="batchmean",
              t2_scale=False):
    """(loss, dh, dW, db) in float64: logits by F.linear in the inputs' dtype, the rest in float64."""
    with torch.no_grad():
        s = F.linear(h, W, b)
        if teacher[0] == "logits":
            t = teacher[1]
        else:
            t = F.linear(teacher[1], teacher[2], teacher[3] if len(teacher) > 3 else None)
    s64 = s.detach().double().cpu().requires_grad_(True)
    loss = ref_loss(s64, t.double().cpu().reshape(s64.shape), None if labels is None else labels.cpu(), T, beta,
                    ignore_index, reduction, t2_scale)
    (ds,) = torch.autograd.grad(loss, s64, up.double().cpu().expand(loss.shape))
    ds = ds.reshape(-1, ds.shape[-1])
    h64, W64 = h.detach().double().cpu().reshape(-1, h.shape[-1]), W.detach().double().cpu()
    dh = (ds @ W64).reshape(h.shape)
    dW = ds.t() @ h64
    db = ds.sum(0)
    return loss.detach(), dh, dW, db


def make(lead, dtype, device, seed=0, teacher="logits", bias=True, tdtype=None):
    """Student hidden [*lead, H], weight [V, H], bias [V]; teacher ('logits', [*lead, V]) or
    ('hidden', [*lead, HT], [V, HT], [V]); leaf tensors that require grad (student side)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, H, generator=g).to(dtype).to(device).requires_grad_(True)
    W = (0.5 * torch.randn(V, H, generator=g)).to(dtype).to(device).requires_grad_(True)
    b = (0.5 * torch.randn(V, generator=g)).to(dtype).to(device).requires_grad_(True) if bias else None
    td = tdtype or dtype
    if teacher == "logits":
        tch = ("logits", (2.0 * torch.randn(*lead, V, generator=g)).to(td).to(device))
    else:
        tch = ("hidden", torch.randn(*lead, HT, generator=g).to(td).to(device),
               (0.5 * torch.randn(V, HT, generator=g)).to(td).to(device),
               (0.5 * torch.randn(V, generator=g)).to(td).to(device))
    return h, W, b, tch


def labels_for(lead, device, ignored=(1, 6)):
    n = math.prod(lead)
    lab = torch.arange(n) % 7
    for i in ignored:
        lab[i % n] = -100
    return lab.reshape(lead).to(device)


def teacher_kw(tch):
    if tch[0] == "logits":
        return {"teacher_logits": tch[1]}
    return {"teacher_hidden": tch[1], "teacher_weight": tch[2], "teacher_bias": tch[3]}


def upstream_for(loss, kind):
    if kind == "one":
        return torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)
    gen = torch.Generator().manual_seed(7)
    if loss.dim() == 0:
        return torch.tensor(2.5, dtype=loss.dtype, device=loss.device)
    return (torch.rand(loss.shape, generator=gen) + 0.5).to(loss.device, loss.dtype)


def run(h, W, b, tch, labels, upstream="one", **kw):
    """Fused loss and (dh, dW, db) (fresh .grad), plus the reference's."""
    for x in (h, W, b):
        if x is not None:
            x.grad = None
    kw.setdefault("chunk_rows", 3)
    loss = fusedloss.linear_distillation_loss(h, W, labels=labels, student_bias=b, **teacher_kw(tch), **kw)
    up = upstream_for(loss, upstream)
    loss.backward(up)
    rk = {k: v for k, v in kw.items() if k not in ("chunk_rows", "byte_budget")}
    rk["T"] = rk.pop("temperature", 1.0)
    ref = reference(h, W, b, tch, labels, up, **rk)
    return (loss, h.grad, W.grad, None if b is None else b.grad), ref


def check(got, ref, dtype, what=""):
    tol = TOL[dtype]
    close(got[0], ref[0], tol["loss"], f"loss {what}")
    for name, g, r in zip(("dh", "dW", "db"), got[1:], ref[1:]):
        if g is not None:
            close(g, r, tol["grad"], f"{name} {what}")


# ---- the grid ------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temp", TEMPS)
@pytest.mark.parametrize("teacher", ["logits", "hidden"])
def test_grid(device, dtype, reduction, beta, temp, teacher):
    T, t2 = temp
    h, W, b, tch = make((N,), dtype, device, teacher=teacher)
    lab = labels_for((N,), device)
    up = "rand" if (beta == 0.5 or reduction == "none") else "one"
    got, ref = run(h, W, b, tch, lab, up, temperature=T, beta=beta, reduction=reduction, t2_scale=t2)
    assert got[0].dtype == dtype
    check(got, ref, dtype, f"{reduction} beta={beta} T={T}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDS)
@pytest.mark.parametrize("upstream", ["one", "rand"])
def test_3d_inputs(device, reduction, upstream):
    lead = (2, 5)
    h, W, b, tch = make(lead, torch.float32, device)
    lab = labels_for(lead, device)
    got, ref = run(h, W, b, tch, lab, upstream, reduction=reduction, temperature=2.0, t2_scale=True)
    assert got[0].shape == (lead if reduction == "none" else ())
    check(got, ref, torch.float32)
    # the teacher as hidden [2, 5, HT], labels flattened to [N]
    h, W, b, tch = make(lead, torch.float32, device, teacher="hidden")
    got, ref = run(h, W, b, tch, lab.reshape(-1), upstream, reduction=reduction, beta=0.5)
    check(got, ref, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk_rows", [1, 3, 4, 10, 64])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunk_sizes(device, chunk_rows, reduction):
    h, W, b, tch = make((N,), torch.float32, device)
    lab = labels_for((N,), device)
    got, ref = run(h, W, b, tch, lab, "rand", reduction=reduction, chunk_rows=chunk_rows, beta=1.0)
    check(got, ref, torch.float32, f"chunk_rows={chunk_rows}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "batchmean", "sum"])
def test_no_labels_no_bias(device, reduction):
    h, W, _, tch = make((N,), torch.float32, device, bias=False)
    got, ref = run(h, W, None, tch, None, "rand", reduction=reduction)
    check(got, ref, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_all_rows_ignored(device):
    h, W, b, tch = make((N,), torch.float32, device)
    lab = torch.full((N,), -100, device=device)
    loss = fusedloss.linear_distillation_loss(h, W, tch[1], labels=lab, student_bias=b, reduction="mean", chunk_rows=3)
    assert torch.isnan(loss)
    loss.backward()
    for g in (h.grad, W.grad, b.grad):
        assert torch.count_nonzero(g) == 0
    for red in ("sum", "batchmean"):
        loss = fusedloss.linear_distillation_loss(h, W, tch[1], labels=lab, reduction=red, chunk_rows=3)
        assert loss.item() == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_teacher_bf16_student(device):
    h, W, b, tch = make((N,), torch.bfloat16, device, tdtype=torch.float32)
    got, ref = run(h, W, b, tch, labels_for((N,), device), "rand", beta=0.5, reduction="sum")
    check(got, ref, torch.bfloat16)
    h, W, b, tch = make((N,), torch.bfloat16, device, teacher="hidden", tdtype=torch.float32)
    got, ref = run(h, W, b, tch, None, "one", reduction="batchmean")
    check(got, ref, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_partial_requires_grad(device):
    """Only the weight requires grad (frozen hidden, no bias); then only the hidden."""
    h, W, b, tch = make((N,), torch.float32, device)
    h0 = h.detach()
    loss = fusedloss.linear_distillation_loss(h0, W, tch[1], reduction="sum", chunk_rows=3)
    loss.backward()
    ref = reference(h0, W, None, tch, None, torch.tensor(1.0), reduction="sum")
    close(W.grad, ref[2], TOL[torch.float32]["grad"], "dW")
    W0 = W.detach()
    loss = fusedloss.linear_distillation_loss(h, W0, tch[1], reduction="none", chunk_rows=3)
    loss.sum().backward()
    ref = reference(h, W0, None, tch, None, torch.tensor(1.0), reduction="none")
    close(h.grad, ref[1], TOL[torch.float32]["grad"], "dh")


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_and_teacher_constant(device):
    h, W, b, tch = make((N,), torch.float32, device)
    t = tch[1].clone().requires_grad_(True)
    with torch.no_grad():
        l0 = fusedloss.linear_distillation_loss(h, W, t, student_bias=b, chunk_rows=3)
    assert not l0.requires_grad
    l1 = fusedloss.linear_distillation_loss(h, W, t, student_bias=b, chunk_rows=3)
    l1.backward()
    assert t.grad is None  # the teacher is a constant
    ref = reference(h, W, b, tch, None, torch.tensor(1.0))
    close(l0, ref[0], TOL[torch.float32]["loss"], "no_grad loss")
    close(l1, ref[0], TOL[torch.float32]["loss"], "loss")


@pytest.mark.parametrize("device", DEVICES)
def test_backward_once_and_accumulation(device):
    h, W, b, tch = make((N,), torch.float32, device)
    loss = fusedloss.linear_distillation_loss(h, W, tch[1], student_bias=b, chunk_rows=3)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="only once"):
        loss.backward()
    # gradient accumulation over two calls: .grad sums
    h.grad = W.grad = b.grad = None
    for _ in range(2):
        fusedloss.linear_distillation_loss(h, W, tch[1], student_bias=b, chunk_rows=3).backward()
    ref = reference(h, W, b, tch, None, torch.tensor(2.0))
    for g, r in zip((h.grad, W.grad, b.grad), ref[1:]):
        close(g, r, TOL[torch.float32]["grad"], "accumulated")
    # reduction none recomputes: backward twice is fine
    h.grad = None
    loss = fusedloss.linear_distillation_loss(h, W, tch[1], reduction="none", chunk_rows=3)
    loss.sum().backward(retain_graph=True)
    g1 = h.grad.clone()
    loss.sum().backward()
    close(h.grad, 2 * g1, TOL[torch.float32]["grad"], "twice")


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises(device):
    h, W, b, tch = make((N,), torch.float32, device)
    for red in ("sum", "none"):
        loss = fusedloss.linear_distillation_loss(h, W, tch[1], reduction=red, chunk_rows=3)
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(loss.sum(), h, create_graph=True)


def test_float64_fallback():
    h, W, b, tch = make((N,), torch.float64, "cpu")
    lab = labels_for((N,), "cpu")
    got, ref = run(h, W, b, tch, lab, "rand", reduction="mean", beta=0.5, temperature=2.0, t2_scale=True)
    assert got[0].dtype == torch.float64
    for g, r in zip(got, ref):
        close(g, r, (1e-12, 1e-10), "float64")


@pytest.mark.parametrize("device", DEVICES)
def test_autocast(device):
    """fp32 parameters under autocast bf16: the logits in bf16 (as F.linear), fp32 gradients."""
    h, W, b, tch = make((N,), torch.float32, device)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = fusedloss.linear_distillation_loss(h, W, tch[1], student_bias=b, chunk_rows=3, reduction="sum")
    assert loss.dtype == torch.bfloat16
    loss.backward()
    assert h.grad.dtype == W.grad.dtype == b.grad.dtype == torch.float32
    hb, Wb, bb = (x.detach().bfloat16() for x in (h, W, b))
    ref = reference(hb, Wb, bb, tch, None, torch.tensor(1.0), reduction="sum")
    check((loss, h.grad, W.grad, b.grad), ref, torch.bfloat16, "autocast")


@pytest.mark.parametrize("device", DEVICES)
def test_module(device):
    h, W, b, tch = make((2, 5), torch.float32, device, teacher="hidden")
    crit = fusedloss.LinearDistillationLoss(temperature=2.0, beta=0.5, reduction="mean", t2_scale=True,
                                            chunk_rows=3)
    assert "beta=0.5" in repr(crit)
    lab = labels_for((2, 5), device)
    loss = crit(h, W, teacher_hidden=tch[1], teacher_weight=tch[2], teacher_bias=tch[3], labels=lab,
                student_bias=b)
    ref = fusedloss.linear_distillation_loss(h, W, teacher_hidden=tch[1], teacher_weight=tch[2],
                                             teacher_bias=tch[3], labels=lab, student_bias=b, temperature=2.0,
                                             beta=0.5, reduction="mean", t2_scale=True, chunk_rows=3)
    assert torch.equal(loss, ref)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_traced_path(reduction):
    """torch.compile(fullgraph=True), aot_eager: the Function traced with fake tensors (the chunk
    loop unrolled; the ops' fake kernels; mode-1 backward as a plain multiply)."""
    h, W, b, tch = make((N,), torch.float32, "cpu", teacher="hidden")
    lab = labels_for((N,), "cpu")

    def f(h, W, b, th, tW, lab):
        return fusedloss.linear_distillation_loss(h, W, teacher_hidden=th, teacher_weight=tW, labels=lab,
                                                  student_bias=b, reduction=reduction, beta=0.5, chunk_rows=3)

    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    loss = cf(h, W, b, tch[1], tch[2], lab)
    up = upstream_for(loss, "rand")
    loss.backward(up)
    ref = reference(h, W, b, tch[:3], lab, up, reduction=reduction, beta=0.5)
    check((loss, h.grad, W.grad, b.grad), ref, torch.float32, "compiled")


# ---- memory: no [N, V] tensor --------------------------------------------------------------------
class _Watch(TorchDispatchMode):
    """Records the largest tensor any op allocates (an output whose storage is none of its
    inputs': views and in-place results do not count), and the row counts the distill ops see."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0
        self.distill_rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if "distill" in str(func):
            self.distill_rows.append(args[0].shape[0])
        ins = {x.untyped_storage().data_ptr() for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)}
        for o in tree_leaves(out):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in ins:
                self.max_numel = max(self.max_numel, o.untyped_storage().nbytes() // o.element_size())
        return out


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("teacher", ["logits", "hidden"])
def test_no_full_logits_allocated(reduction, teacher):
    n = 64  # N V = 64064 > V H = 16016 > 8 V
    h, W, b, tch = make((n,), torch.float32, "cpu", teacher=teacher)
    with _Watch() as w:
        loss = fusedloss.linear_distillation_loss(h, W, student_bias=b, reduction=reduction, chunk_rows=8,
                                                  **teacher_kw(tch))
        loss.sum().backward()
    assert w.distill_rows and max(w.distill_rows) == 8
    # the largest allocation: a parameter-sized gradient / accumulator, a chunk or dh; never [N, V]
    assert w.max_numel <= max(V * H, 8 * V, n * H, V * HT) < n * V, w.max_numel
    ref = reference(h, W, b, tch, None, torch.ones(()), reduction=reduction)
    for g, r, name in zip((h.grad, W.grad, b.grad), ref[1:], ("dh", "dW", "db")):
        close(g, r, TOL[torch.float32]["grad"], name)


def test_byte_budget_sets_chunks(monkeypatch):
    seen = []
    real = LD._op_forward

    def spy(z, t, *a):
        seen.append(z.shape[0])
        return real(z, t, *a)

    def spy_lg(z, t, *a):
        seen.append(z.shape[0])
        return real_lg(z, t, *a)

    real_lg = LD._op_loss_and_grad
    monkeypatch.setattr(LD, "_op_forward", spy)
    monkeypatch.setattr(LD, "_op_loss_and_grad", spy_lg)
    h, W, b, tch = make((N,), torch.float32, "cpu")
    per_row = V * (4 * 2 + 4) + 12 + 32  # logits + dlogits + teacher (fp32) + workspace
    budget = 3 * per_row + 5
    assert LD.chunk_rows_for(V, torch.float32, torch.float32, budget) == 3
    assert LD.chunk_rows_for(V, torch.float32, torch.float32, 1) == 1
    got, ref = run(h, W, b, tch, None, "one", reduction="mean", chunk_rows=None, byte_budget=budget)
    assert seen == [3, 3, 3, 1]
    check(got, ref, torch.float32)
    seen.clear()
    with torch.no_grad():  # no gradient buffer: more rows fit
        fusedloss.linear_distillation_loss(h, W, tch[1], reduction="sum", byte_budget=budget)
    assert seen[0] == LD.chunk_rows_for(V, torch.float32, torch.float32, budget, grads=False) == 4
    seen.clear()
    fusedloss.linear_distillation_loss(h, W, tch[1], reduction="sum", byte_budget=10 ** 9)
    assert seen == [N]  # one chunk; reduction sum with grads: one distill_loss_and_grad call


@needs_cuda
@pytest.mark.parametrize("reduction", ["batchmean", "none"])
def test_cuda_peak_memory(reduction):
    n, hid, v = 8192, 256, 32000
    dev = "cuda"
    h = torch.randn(n, hid, device=dev, dtype=torch.bfloat16, requires_grad=True)
    W = (0.05 * torch.randn(v, hid, device=dev)).bfloat16().requires_grad_(True)
    th = torch.randn(n, hid, device=dev, dtype=torch.bfloat16)
    tW = (0.05 * torch.randn(v, hid, device=dev)).bfloat16()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fusedloss.linear_distillation_loss(h, W, teacher_hidden=th, teacher_weight=tW, reduction=reduction,
                                              chunk_rows=256)
    loss.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    full = n * v * 2  # one [N, V] bf16 tensor
    # chunk temporaries (~3 x 256 V x 2 bytes) + gradients (N H + 3 V H fp32 accumulator) + slack
    assert peak < full / 2, (peak, full)


# ---- bad arguments -------------------------------------------------------------------------------
def test_bad_arguments():
    h, W, b, tch = make((N,), torch.float32, "cpu")
    t = tch[1]
    th, tW = torch.randn(N, HT), torch.randn(V, HT)
    f = fusedloss.linear_distillation_loss
    with pytest.raises(ValueError, match="not both"):
        f(h, W, t, teacher_hidden=th, teacher_weight=tW)
    with pytest.raises(ValueError, match="no teacher"):
        f(h, W)
    with pytest.raises(ValueError, match="together"):
        f(h, W, teacher_hidden=th)
    with pytest.raises(ValueError, match="together"):
        f(h, W, teacher_weight=tW)
    with pytest.raises(ValueError, match="student_weight must have shape"):
        f(h, torch.randn(V, H + 1), t)
    with pytest.raises(ValueError, match="teacher_logits must have shape"):
        f(h, W, torch.randn(N, V + 1))
    with pytest.raises(ValueError, match="teacher_logits must have shape"):
        f(h, W, torch.randn(N + 1, V))
    with pytest.raises(ValueError, match="teacher_weight must have shape"):
        f(h, W, teacher_hidden=th, teacher_weight=torch.randn(V - 1, HT))
    with pytest.raises(ValueError, match="teacher_weight must have shape"):
        f(h, W, teacher_hidden=th, teacher_weight=torch.randn(V, HT + 1))
    with pytest.raises(ValueError, match="teacher_hidden must have shape"):
        f(h, W, teacher_hidden=torch.randn(N - 1, HT), teacher_weight=tW)
    with pytest.raises(ValueError, match="student_bias must have shape"):
        f(h, W, t, student_bias=torch.randn(V + 1))
    with pytest.raises(ValueError, match="labels must have shape"):
        f(h, W, t, labels=torch.zeros(N + 1, dtype=torch.long))
    with pytest.raises(TypeError, match="labels must be an integer"):
        f(h, W, t, labels=torch.zeros(N))
    with pytest.raises(TypeError, match="differs from student_hidden"):
        f(h, W.detach().bfloat16(), t)
    with pytest.raises(ValueError, match="reduction"):
        f(h, W, t, reduction="avg")
    with pytest.raises(ValueError, match="temperature"):
        f(h, W, t, temperature=0.0)
    with pytest.raises(ValueError, match="beta"):
        f(h, W, t, beta=1.5)
    with pytest.raises(ValueError, match="chunk_rows"):
        f(h, W, t, chunk_rows=0)
    with pytest.raises(ValueError, match="byte_budget"):
        f(h, W, t, byte_budget=0)
    with pytest.raises(TypeError, match="must be a Tensor"):
        f(h, W, t.tolist())
    with pytest.raises(ValueError, match="chunk_rows"):
        fusedloss.LinearDistillationLoss(chunk_rows=-1)
    if torch.device("meta") != h.device:
        with pytest.raises(ValueError, match="is on meta"):
            f(h, W, t.to("meta"))


def test_empty_batch():
    h = torch.randn(0, H, requires_grad=True)
    W = torch.randn(V, H, requires_grad=True)
    t = torch.randn(0, V)
    assert fusedloss.linear_distillation_loss(h, W, t, reduction="none").shape == (0,)
    assert fusedloss.linear_distillation_loss(h, W, t, reduction="sum").item() == 0.0
    loss = fusedloss.linear_distillation_loss(h, W, t, reduction="batchmean")
    assert torch.isnan(loss)
    loss.backward()
    assert torch.count_nonzero(W.grad) == 0
