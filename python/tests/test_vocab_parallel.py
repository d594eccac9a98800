"""Tests of fusedloss.vocab_parallel_cross_entropy (include/fusedloss.h section 8, issue 9) and its
raw ops fusedloss::vp_ce_local_stats / vp_ce_combine / vp_ce_backward, on the CPU backend.

Every check compares with fusedloss.cross_entropy on the FULL logits (the shards concatenated)
and with torch.nn.functional.cross_entropy evaluated in float64: the loss, and each rank's shard
of the logits' gradient for a non-trivial upstream gradient.

  - world size 1 without torch.distributed initialised (one rank, no collective), every option;
  - k ranks simulated in one process with the raw ops (steps 1, 3, 4; the test concatenates the
    stats in rank order), k = 1, 2, 3, 5 with uneven shards;
  - real process groups: ONE torch.multiprocessing spawn of 3 processes (gloo, file:// init) that
    runs every case on the world group (k = 3) and on the subgroups {0, 1} and {1, 2} (k = 2; in
    {1, 2} the group's rank 0 is global rank 1, so the rank order used is the group's), fp32 and
    bf16, every option; plus the debug-mode layout check, torch.compile(fullgraph=True), the
    computed vocab_size, and the errors every rank raises alike;
  - bad arguments; CUDA tensors raise NotBuiltError while the C library lacks the CUDA steps.

Run (CPU, CI):  make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_vocab_parallel.py
(about 15 s on 2 cores, most of it the spawn: three processes importing torch).
"""
import datetime
import os

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from fusedloss import NotBuiltError, TargetOutOfRangeError  # noqa: E402
from fusedloss import ops as flops  # noqa: E402
from _zoo_util import assert_close  # noqa: E402

vp_ce = fusedloss.vocab_parallel_cross_entropy

# ---- tolerances: |got - ref| <= atol + rtol * |ref| ---------------------------------------------
# Against F.cross_entropy in float64 on the same (rounded) logits: the CPU steps accumulate in
# double, but the per-row stats cross step 2 as fp32 (the C contract), the loss and lse are fp32,
# the gradient is rounded once to the logits' dtype (the table of test_cross_entropy.py).
LOSS_TOL = (1e-5, 1e-5)
GRAD_TOL = {torch.float32: (1e-7, 1e-5), torch.bfloat16: (1e-7, 8e-3)}
# Against fusedloss.cross_entropy on the full logits: the same formulas in double; they differ by
# the fp32 rounding of the stats (about 1e-7 relative in the lse) and, for bf16, by at most one
# rounding of the gradient to bf16 (2^-8 relative) where that fp32 difference crosses a boundary.
LOSS_TOL_FUSED = (2e-6, 2e-6)
GRAD_TOL_FUSED = {torch.float32: (1e-8, 2e-6), torch.bfloat16: (1e-8, 2 ** -7)}

# The CUDA steps accumulate in fp32 (ex2.approx exponentials) where the CPU ones use double: the
# tables of test_cross_entropy.py's CUDA checks (loss 1e-5; fp32 gradient 3e-5 relative; bf16 one
# rounding step either way, 2^-7 relative at the bottom of a binade).
LOSS_TOL_CUDA = (1e-5, 1e-5)
GRAD_TOL_CUDA = {torch.float32: (1e-7, 3e-5), torch.bfloat16: (1e-7, 2 ** -7 + 1e-4)}

HAS_CUDA = torch.cuda.is_available() and fusedloss.cuda_built()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def reference(x, t, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
              z_loss=0.0, softcap=None, logit_scale=1.0, logit_offset=None):
    """F.cross_entropy on float64 logits x [N, V] transformed as the C API says (softcap(s * x)
    + logit_offset), plus z_loss * lse^2 (not class-weighted; 'mean' over non-ignored rows)."""
    z = x * logit_scale
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    if logit_offset is not None:
        z = z + logit_offset.double().to(z.device)
    w = weight.double() if weight is not None else None
    ce = F.cross_entropy(z, t.long(), w, ignore_index=ignore_index, reduction=reduction,
                         label_smoothing=label_smoothing)
    if not z_loss:
        return ce
    lse = torch.logsumexp(z, dim=1)
    mask = (t != ignore_index).double()
    zl = z_loss * lse.square() * mask
    if reduction == "none":
        return ce + zl
    if reduction == "sum":
        return ce + zl.sum()
    return ce + zl.sum() / mask.sum()


def make_inputs(lead, V, dtype, seed, ignore_index=-100, frac_ignored=0.25, index_dtype=torch.int64):
    """Full logits (*lead, V) of dtype and global targets (*lead), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tuple(lead) + (V,), generator=g, dtype=torch.float64) * 3.0).to(dtype)
    t = torch.randint(0, V, tuple(lead), generator=g)
    if frac_ignored:
        t[torch.rand(tuple(lead), generator=g) < frac_ignored] = ignore_index
    return x, t.to(index_dtype)


def class_weights(V, seed=7):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(V, generator=g) + 0.2


def logit_offsets(V, seed=13):
    """GLOBAL per-class logit offsets (V,) fp32 (e.g. a log-prior), large enough to matter."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, generator=g)


def upstream(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5).float()


def shards(ends):
    """[(start, end)] of consecutive shards ending at `ends` (rank order)."""
    return list(zip([0] + list(ends[:-1]), ends))


def check_against_full(loss, grad_shard, x_full, t, start, end, opts, g, what):
    """Compare one rank's loss and gradient shard with fusedloss.cross_entropy and float64
    F.cross_entropy on the full logits x_full (*lead, V), for the upstream gradient g."""
    V = x_full.shape[-1]
    weight = opts.get("weight")
    cuda = x_full.is_cuda
    loss_fused, loss_ref = (LOSS_TOL_CUDA, LOSS_TOL_CUDA) if cuda else (LOSS_TOL_FUSED, LOSS_TOL)
    grad_fused = GRAD_TOL_CUDA if cuda else GRAD_TOL_FUSED
    grad_ref = GRAD_TOL_CUDA if cuda else GRAD_TOL
    red = opts.get("reduction", "mean")
    x2 = x_full.reshape(-1, V)
    t1 = t.reshape(-1)
    g1 = g.reshape(-1) if red == "none" else g
    # fusedloss.cross_entropy on the full logits (same dtype)
    xf = x2.clone().requires_grad_(True)
    lf = fusedloss.cross_entropy(xf, t1, **opts)
    lf.backward(g1)
    assert_close(loss.reshape(-1) if red == "none" else loss, lf, loss_fused, f"{what}: loss vs fused")
    dt = x_full.dtype
    assert_close(grad_shard.reshape(-1, end - start), xf.grad[:, start:end], grad_fused[dt],
                 f"{what}: grad vs fused")
    # F.cross_entropy in float64
    xr = x2.detach().double().requires_grad_(True)
    ref = reference(xr, t1, **{**opts, "weight": weight})
    ref.backward(g1.double())
    assert_close(loss.reshape(-1) if red == "none" else loss, ref, loss_ref, f"{what}: loss vs float64")
    assert_close(grad_shard.reshape(-1, end - start), xr.grad[:, start:end], grad_ref[dt],
                 f"{what}: grad vs float64")


# ---- the option sets every mode runs ----------------------------------------------------------------
# "weight": True means the global class weights of the case's V.
OPTION_SETS = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(label_smoothing=0.1),
    dict(label_smoothing=0.2, weight=True),
    dict(label_smoothing=0.1, weight=True, reduction="none"),
    dict(weight=True, reduction="sum"),
    dict(z_loss=1e-2),
    dict(z_loss=1e-2, reduction="none"),
    dict(softcap=4.0, logit_scale=0.8),
    dict(softcap=5.0, logit_scale=-1.5, reduction="sum"),
    dict(ignore_index=3, label_smoothing=0.1),
    dict(label_smoothing=0.3, weight=True, z_loss=1e-3, softcap=6.0, logit_scale=1.3),
    dict(label_smoothing=0.1, weight=True, z_loss=1e-3, softcap=6.0, reduction="none"),
]


def _opts(o, V):
    o = dict(o)
    if o.get("weight") is True:
        o["weight"] = class_weights(V)
    return o


def _to(o, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in o.items()}


def _id(o):
    return "-".join(f"{k}={v}" for k, v in o.items()) or "defaults"


# ---- world size 1, torch.distributed not initialised --------------------------------------------
def _dist_off():
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("opts", OPTION_SETS, ids=_id)
def test_world_size_1(opts, dtype, device):
    assert _dist_off()
    V = 13
    o = _to(_opts(opts, V), device)
    x, t = make_inputs((3, 5), V, dtype, seed=11, ignore_index=o.get("ignore_index", -100))
    x, t = x.to(device), t.to(device)
    leaf = x.clone().requires_grad_(True)
    loss = vp_ce(leaf, t, 0, V, **o)
    assert loss.dtype == torch.float32
    assert loss.shape == (t.shape if o.get("reduction") == "none" else ())
    g = upstream(loss.shape).to(device)
    loss.backward(g)
    assert leaf.grad.dtype == dtype and leaf.grad.shape == x.shape
    check_against_full(loss, leaf.grad, x, t, 0, V, o, g, f"k=1 {dtype} {opts}")


@pytest.fixture
def via_ops(monkeypatch):
    """Run eager calls through the custom ops (the path torch.compile traces)."""
    monkeypatch.setattr(fusedloss.functional, "_FORCE_OPS", True)


@pytest.mark.parametrize("opts", [dict(), dict(label_smoothing=0.2, weight=True, z_loss=1e-2,
                                              softcap=5.0, reduction="none")], ids=_id)
def test_world_size_1_via_ops(opts, via_ops):
    V = 9
    o = _opts(opts, V)
    x, t = make_inputs((7,), V, torch.float32, seed=3)
    leaf = x.clone().requires_grad_(True)
    loss = vp_ce(leaf, t, 0, V, vocab_size=V, **o)
    g = upstream(loss.shape)
    loss.backward(g)
    check_against_full(loss, leaf.grad, x, t, 0, V, o, g, f"k=1 via ops {opts}")


# ---- the GLOBAL per-class logit offset (logit_offset), world size 1 ------------------------------
OFFSET_OPTION_SETS = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(label_smoothing=0.1),
    dict(label_smoothing=0.2, weight=True),
    dict(label_smoothing=0.1, weight=True, reduction="none"),
    dict(weight=True, reduction="sum"),
    dict(z_loss=1e-2, softcap=4.0, logit_scale=0.8),
    dict(ignore_index=3, label_smoothing=0.1),
    dict(label_smoothing=0.3, weight=True, z_loss=1e-3, softcap=6.0, logit_scale=1.3),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("opts", OFFSET_OPTION_SETS, ids=_id)
def test_world_size_1_logit_offset(opts, dtype, device):
    """loss and gradient == fusedloss.cross_entropy(..., logit_offset=o) (and float64
    F.cross_entropy(softcap(s x) + o)); the offset gets no gradient."""
    assert _dist_off()
    V = 13
    o = _to(_opts(opts, V), device)
    x, t = make_inputs((3, 5), V, dtype, seed=21, ignore_index=o.get("ignore_index", -100))
    x, t = x.to(device), t.to(device)
    off = logit_offsets(V).to(device).requires_grad_(True)  # a constant: detached inside
    o["logit_offset"] = off
    leaf = x.clone().requires_grad_(True)
    loss = vp_ce(leaf, t, 0, V, **o)
    assert loss.dtype == torch.float32
    assert loss.shape == (t.shape if o.get("reduction") == "none" else ())
    g = upstream(loss.shape).to(device)
    loss.backward(g)
    assert off.grad is None
    assert leaf.grad.dtype == dtype and leaf.grad.shape == x.shape
    check_against_full(loss, leaf.grad, x, t, 0, V, {**o, "logit_offset": off.detach()}, g,
                       f"k=1 offset {dtype} {opts}")
    # the offset matters
    plain = vp_ce(x, t, 0, V, **{k: v for k, v in o.items() if k != "logit_offset"})
    assert not torch.allclose(loss.detach(), plain)


@pytest.mark.parametrize("opts", [dict(), dict(label_smoothing=0.2, weight=True, z_loss=1e-2,
                                              softcap=5.0, reduction="none")], ids=_id)
def test_world_size_1_logit_offset_via_ops(opts, via_ops):
    V = 9
    o = _opts(opts, V)
    o["logit_offset"] = logit_offsets(V)
    x, t = make_inputs((7,), V, torch.float32, seed=3)
    leaf = x.clone().requires_grad_(True)
    loss = vp_ce(leaf, t, 0, V, vocab_size=V, **o)
    g = upstream(loss.shape)
    loss.backward(g)
    check_against_full(loss, leaf.grad, x, t, 0, V, o, g, f"k=1 offset via ops {opts}")


def test_world_size_1_logit_offset_converted():
    """A bf16 / float64 / non-contiguous offset: converted to fp32 contiguous, as
    fusedloss.cross_entropy does; no_grad and the all-ignored / N == 0 cases."""
    V = 10
    x, t = make_inputs((6,), V, torch.float32, seed=31)
    base = logit_offsets(V)
    for off in (base.bfloat16(), base.double(), torch.stack([base, base], 1)[:, 0]):
        leaf = x.clone().requires_grad_(True)
        loss = vp_ce(leaf, t, 0, V, label_smoothing=0.1, logit_offset=off)
        loss.backward()
        check_against_full(loss, leaf.grad, x, t, 0, V, dict(label_smoothing=0.1, logit_offset=off),
                           torch.tensor(1.0), f"offset {off.dtype} stride {off.stride()}")
    with torch.no_grad():
        assert_close(vp_ce(x, t, 0, V, logit_offset=base),
                     fusedloss.cross_entropy(x, t, logit_offset=base), LOSS_TOL_FUSED, "no_grad")
    xi, ti = make_inputs((4,), V, torch.float32, seed=5, frac_ignored=1.0)
    leaf = xi.clone().requires_grad_(True)
    loss = vp_ce(leaf, ti, 0, V, logit_offset=base)
    loss.backward()
    assert torch.isnan(loss) and torch.all(leaf.grad == 0)
    e = torch.empty((0, V), requires_grad=True)
    loss = vp_ce(e, torch.empty((0,), dtype=torch.int64), 0, V, reduction="sum", logit_offset=base)
    loss.backward()
    assert loss.item() == 0.0 and e.grad.shape == (0, V)


def test_world_size_1_edge_cases():
    V = 6
    # all rows ignored: mean NaN with a zero gradient, sum 0, none all zeros
    x, t = make_inputs((4,), V, torch.float32, seed=5, frac_ignored=1.0)
    for red in ("mean", "sum", "none"):
        leaf = x.clone().requires_grad_(True)
        loss = vp_ce(leaf, t, 0, V, reduction=red, label_smoothing=0.1)
        loss.sum().backward()
        if red == "mean":
            assert torch.isnan(loss)
        else:
            assert torch.all(loss == 0)
        assert torch.all(leaf.grad == 0)
    # N == 0
    e = torch.empty((0, V), requires_grad=True)
    te = torch.empty((0,), dtype=torch.int64)
    assert torch.isnan(vp_ce(e, te, 0, V))
    assert vp_ce(e, te, 0, V, reduction="sum").item() == 0.0
    loss = vp_ce(e, te, 0, V, reduction="none")
    assert loss.shape == (0,)
    loss.sum().backward()
    assert e.grad.shape == (0, V)
    # 1-D logits (one row), int32 targets, a strided (column-slice) shard, no grad
    x, t = make_inputs((5,), V, torch.float32, seed=6, frac_ignored=0.0, index_dtype=torch.int32)
    assert_close(vp_ce(x[0], t[0], 0, V), fusedloss.cross_entropy(x[0], t[0].long()), LOSS_TOL_FUSED, "1-D")
    wide = torch.zeros(5, V + 3)
    wide[:, :V] = x
    leaf = wide.clone().requires_grad_(True)
    loss = vp_ce(leaf[:, :V], t, 0, V, reduction="sum")
    loss.backward()
    check_against_full(loss, leaf.grad[:, :V], x, t.long(), 0, V, dict(reduction="sum"),
                       torch.tensor(1.0), "strided")
    assert torch.all(leaf.grad[:, V:] == 0)
    with torch.no_grad():
        assert_close(vp_ce(x.requires_grad_(True), t, 0, V), fusedloss.cross_entropy(x, t.long()),
                     LOSS_TOL_FUSED, "no_grad")


def test_double_backward_raises():
    x, t = make_inputs((4,), 5, torch.float32, seed=2, frac_ignored=0.0)
    leaf = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(vp_ce(leaf, t, 0, 5), leaf, create_graph=True)  # allowed
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


# ---- k ranks simulated in one process: the raw ops, the test concatenates the stats -------------
SIM_LAYOUTS = [[11], [4, 11], [1, 6, 11], [3, 4, 8, 9, 11], [7, 8, 9, 10, 11]]


@pytest.mark.parametrize("offset", [False, True], ids=["no-offset", "offset"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("ends", SIM_LAYOUTS + [pytest.param([20000, 50257], marks=needs_cuda)],
                         ids=lambda e: f"k={len(e)}:{e}")
def test_simulated_ranks_raw_ops(ends, dtype, device, offset):
    """fl_vp_ce_* as the header describes them: step 1 per shard, the gather in rank order by
    hand, step 3 (every "rank" gets the same bits), step 4 per shard; every option; with and
    without the GLOBAL logit offset (every "rank" passes the whole (V,) array to every step)."""
    V = ends[-1]
    for i, opts in enumerate(OPTION_SETS):
        o = _to(_opts(opts, V), device)
        off = logit_offsets(V).to(device) if offset else None
        if offset:
            o["logit_offset"] = off
        x, t = make_inputs((6,), V, dtype, seed=100 + i, ignore_index=o.get("ignore_index", -100))
        x, t = x.to(device), t.to(device)
        red = fusedloss._lib.REDUCTIONS[o.get("reduction", "mean")]
        cap = o.get("softcap") or 0.0
        ce = (o.get("ignore_index", -100), red, o.get("label_smoothing", 0.0), o.get("z_loss", 0.0),
              cap, o.get("logit_scale", 1.0))
        w = o.get("weight")
        stats = [torch.ops.fusedloss.vp_ce_local_stats(x[:, s:e], t, w, s, V, *ce, off)
                 for s, e in shards(ends)]
        gathered = torch.stack(stats)
        loss, lse = torch.ops.fusedloss.vp_ce_combine(gathered, t, w, V, *ce, off)
        g = upstream(loss.shape).to(device)
        grads = [torch.ops.fusedloss.vp_ce_backward(g.reshape(-1), x[:, s:e].contiguous(), t, lse, w,
                                                    s, V, *ce, 1.0, off) for s, e in shards(ends)]
        for s, e in shards(ends):
            check_against_full(loss, grads[ends.index(e)], x, t, s, e, o, g,
                               f"simulated k={len(ends)} {ends} [{s}, {e}) {dtype} {opts}")
        # lse: the global log-sum-exp of the transformed logits, 0 on ignored rows
        z = x.double() * o.get("logit_scale", 1.0)
        if cap:
            z = cap * torch.tanh(z / cap)
        if offset:
            z = z + off.double()
        ref_lse = torch.where(t == o.get("ignore_index", -100), 0.0, torch.logsumexp(z, 1))
        assert_close(lse, ref_lse, (1e-5, 1e-5) if x.is_cuda else (1e-6, 1e-6), f"lse {ends} {opts}")
        if len(ends) > 1:  # ignored rows: (-inf, 0, 0, 0)
            ign = t == o.get("ignore_index", -100)
            if ign.any():
                assert torch.all(gathered[:, ign, 0] == -float("inf"))
                assert torch.all(gathered[:, ign, 1:] == 0)


def test_opcheck_vp_ops():
    from torch.library import opcheck
    V, ends = 10, [3, 10]
    x, t = make_inputs((5,), V, torch.float32, seed=9)
    w = class_weights(V)
    for red in (0, 1):
        ce = (-100, red, 0.1, 1e-3, 0.0, 1.0)
        xs = x[:, 3:].contiguous()
        opcheck(torch.ops.fusedloss.vp_ce_local_stats.default, (xs, t, w, 3, V) + ce)
        opcheck(torch.ops.fusedloss.vp_ce_local_stats.default, (xs, t, None, 3, V) + ce)
        gathered = torch.stack([torch.ops.fusedloss.vp_ce_local_stats(x[:, s:e], t, w, s, V, *ce)
                                for s, e in shards(ends)])
        opcheck(torch.ops.fusedloss.vp_ce_combine.default, (gathered, t, w, V) + ce)
        loss, lse = torch.ops.fusedloss.vp_ce_combine(gathered, t, w, V, *ce)
        gl = upstream((5,) if red == 0 else (1,))
        opcheck(torch.ops.fusedloss.vp_ce_backward.default, (gl, xs, t, lse, w, 3, V) + ce + (0.5,))
        # with the GLOBAL logit offset (the last, optional, argument of every step)
        off = logit_offsets(V)
        opcheck(torch.ops.fusedloss.vp_ce_local_stats.default, (xs, t, w, 3, V) + ce + (off,))
        go = torch.stack([torch.ops.fusedloss.vp_ce_local_stats(x[:, s:e], t, w, s, V, *ce, off)
                          for s, e in shards(ends)])
        opcheck(torch.ops.fusedloss.vp_ce_combine.default, (go, t, w, V) + ce + (off,))
        _, lse_o = torch.ops.fusedloss.vp_ce_combine(go, t, w, V, *ce, off)
        opcheck(torch.ops.fusedloss.vp_ce_backward.default,
                (gl, xs, t, lse_o, w, 3, V) + ce + (0.5, off))


# ---- bad arguments (no collective: each raises before step 2) -----------------------------------
def test_bad_arguments():
    V = 8
    x, t = make_inputs((4,), V, torch.float32, seed=4)
    with pytest.raises(ValueError, match="has 5 classes"):
        vp_ce(x[:, :5], t, 0, V)
    with pytest.raises(ValueError, match="0 <= vocab_start < vocab_end"):
        vp_ce(x, t, 3, 3)
    with pytest.raises(ValueError, match="0 <= vocab_start < vocab_end"):
        vp_ce(x, t, -1, 7)
    with pytest.raises(TypeError, match="vocab_start must be an int"):
        vp_ce(x, t, 0.0, V)
    with pytest.raises(TypeError, match="vocab_end must be an int"):
        vp_ce(x, t, 0, True)
    with pytest.raises(ValueError, match=r"vocab_size \(7\) < vocab_end \(8\)"):
        vp_ce(x, t, 0, V, vocab_size=7)
    with pytest.raises(ValueError, match="rank 0 of the group must hold the first slice"):
        vp_ce(x[:, 2:], t, 2, V)
    with pytest.raises(ValueError, match="last rank of the group"):
        vp_ce(x, t, 0, V, vocab_size=V + 4)
    with pytest.raises(ValueError, match="group was given but torch.distributed is not initialised"):
        vp_ce(x, t, 0, V, group=object())
    with pytest.raises(ValueError, match=r"GLOBAL class weights of shape \(8,\)"):
        vp_ce(x, t, 0, V, weight=torch.ones(5))
    with pytest.raises(ValueError, match="weight must be a 1-D floating tensor"):
        vp_ce(x, t, 0, V, weight=torch.ones(V, dtype=torch.int64))
    with pytest.raises(ValueError, match="target must have shape"):
        vp_ce(x, t[:3], 0, V)
    with pytest.raises(TypeError, match="target dtype"):
        vp_ce(x, t.float(), 0, V)
    with pytest.raises(TypeError, match="local_logits dtype"):
        vp_ce(x.double(), t, 0, V)
    with pytest.raises(TypeError, match="local_logits must be a Tensor"):
        vp_ce(x.tolist(), t, 0, V)
    with pytest.raises(ValueError, match="reduction must be"):
        vp_ce(x, t, 0, V, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        vp_ce(x, t, 0, V, label_smoothing=1.5)
    with pytest.raises(ValueError, match="softcap"):
        vp_ce(x, t, 0, V, softcap=-1.0)
    bad = t.clone()
    bad[1] = V
    with pytest.raises(TargetOutOfRangeError, match="fl_vp_ce_local_stats_cpu"):
        vp_ce(x, bad, 0, V)
    # the raw ops check what the C API cannot see
    ce = (-100, 1, 0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="not inside"):
        torch.ops.fusedloss.vp_ce_local_stats(x, t, None, 1, V, *ce)
    with pytest.raises(ValueError, match=r"gathered must be float32 of shape \(k, N, 4\)"):
        torch.ops.fusedloss.vp_ce_combine(torch.zeros(4, 4), t, None, V, *ce)
    with pytest.raises(ValueError, match=r"GLOBAL class weights, float32 of shape \(8,\)"):
        torch.ops.fusedloss.vp_ce_combine(torch.zeros(1, 4, 4), t, torch.ones(3), V, *ce)
    # bad logit offsets: the GLOBAL (V,) floating tensor on the logits' device
    with pytest.raises(ValueError, match=r"logit_offset must have shape \(8,\)"):
        vp_ce(x, t, 0, V, logit_offset=torch.zeros(5))
    with pytest.raises(ValueError, match="logit_offset must be 1-D"):
        vp_ce(x, t, 0, V, logit_offset=torch.zeros(1, V))
    with pytest.raises(TypeError, match="logit_offset must be floating point"):
        vp_ce(x, t, 0, V, logit_offset=torch.zeros(V, dtype=torch.int64))
    with pytest.raises(TypeError, match="logit_offset must be a Tensor or None"):
        vp_ce(x, t, 0, V, logit_offset=[0.0] * V)
    with pytest.raises(ValueError, match="logit_offset is on meta"):
        vp_ce(x, t, 0, V, logit_offset=torch.zeros(V, device="meta"))
    o8 = torch.zeros(V)
    with pytest.raises(ValueError, match=r"offset must be the GLOBAL per-class logit offsets, float32 of shape \(8,\)"):
        torch.ops.fusedloss.vp_ce_local_stats(x[:, :3], t, None, 0, V, *ce, torch.zeros(3))  # shard's
    with pytest.raises(ValueError, match=r"offset must be the GLOBAL per-class logit offsets, float32"):
        torch.ops.fusedloss.vp_ce_local_stats(x, t, None, 0, V, *ce, o8.double())
    with pytest.raises(ValueError, match=r"offset must be the GLOBAL per-class logit offsets, float32"):
        torch.ops.fusedloss.vp_ce_combine(torch.zeros(1, 4, 4), t, None, V, *ce, o8.half())
    lse = torch.zeros(4)
    with pytest.raises(ValueError, match=r"offset must be the GLOBAL per-class logit offsets, float32"):
        torch.ops.fusedloss.vp_ce_backward(torch.ones(1), x, t, lse, None, 0, V, *ce, 1.0,
                                           torch.zeros(V + 1))
    with pytest.raises(ValueError, match="offset must be contiguous"):
        torch.ops.fusedloss.vp_ce_backward(torch.ones(1), x, t, lse, None, 0, V, *ce, 1.0,
                                           torch.zeros(V, 2)[:, 0])
    # the C library's own checks surface as FusedLossError naming the C function
    with pytest.raises(fusedloss.FusedLossError, match="fl_vp_ce_local_stats_cpu"):
        torch.ops.fusedloss.vp_ce_local_stats(x, t, None, 0, V, -100, 7, 0.0, 0.0, 0.0, 1.0)


def test_cuda_steps_not_built_error():
    """While the C library lacks fl_vp_ce_*_cuda, CUDA calls raise NotBuiltError (a FusedLossError
    and a NotImplementedError) naming the missing steps; no silent fallback."""
    missing = flops.vp_cuda_missing()
    if not missing:
        pytest.skip("this library has the CUDA vocab-parallel steps")
    err = flops.vp_cuda_not_built_error()
    assert isinstance(err, fusedloss.FusedLossError) and isinstance(err, NotImplementedError)
    assert err.status == fusedloss._lib.FL_ERR_NOT_BUILT
    assert "not built yet" in str(err) and all(m in str(err) for m in missing)
    with pytest.raises(NotBuiltError, match="fl_vp_ce_combine_cuda"):
        flops._vp_cuda_fn("fl_vp_ce_combine_cuda")
    # what every raw op checks first (a stand-in: CI has no CUDA tensor to pass)
    from types import SimpleNamespace
    with pytest.raises(NotImplementedError, match="CUDA vocab-parallel steps"):
        flops._vp_check_cuda(SimpleNamespace(device=torch.device("cuda", 0)))
    flops._vp_check_cuda(torch.zeros(1))  # CPU: fine


@needs_cuda
def test_cuda_tensors_raise_until_built():
    if not flops.vp_cuda_missing():
        pytest.skip("this library has the CUDA vocab-parallel steps (tested by the device='cuda' cases)")
    x, t = make_inputs((4,), 8, torch.float32, seed=1)
    x, t = x.cuda(), t.cuda()
    with pytest.raises(NotBuiltError, match="CUDA vocab-parallel steps"):
        vp_ce(x, t, 0, 8)
    with pytest.raises(NotImplementedError, match="not built yet"):
        torch.ops.fusedloss.vp_ce_local_stats(x, t, None, 0, 8, -100, 1, 0.0, 0.0, 0.0, 1.0)


# ---- real process groups: one spawn of 3 gloo processes running every case ------------------------
WORLD = 3
# group name -> (global ranks in group-rank order, shard ends in group-rank order (uneven))
GROUPS = {"world": ([0, 1, 2], [5, 6, 17]), "01": ([0, 1], [10, 17]), "12": ([1, 2], [3, 17])}


def _mp_cases():
    """(group, dtype, opts, extras) of every multi-process case, the same list on every rank."""
    for gname in GROUPS:
        for dtype in (torch.float32, torch.bfloat16):
            for opts in OPTION_SETS:
                if gname != "world" and dtype == torch.bfloat16 and opts.get("reduction") != "none":
                    continue  # bf16 on the subgroups: the per-row cases suffice
                yield gname, dtype, opts, {}
    yield "world", torch.float32, dict(label_smoothing=0.1, weight=True), dict(vocab_size=None)
    yield "12", torch.float32, dict(reduction="none"), dict(vocab_size=None)
    yield "world", torch.float32, dict(z_loss=1e-2, weight=True), dict(force_ops=True)
    yield "world", torch.bfloat16, dict(label_smoothing=0.1, reduction="none"), dict(force_ops=True)
    yield "world", torch.float32, dict(label_smoothing=0.1), dict(all_ignored=True)
    yield "world", torch.float32, dict(reduction="sum"), dict(all_ignored=True)
    yield "world", torch.float32, dict(), dict(lead=(2, 3), index_dtype=torch.int32)
    yield "world", torch.float32, dict(), dict(lead=(0,))
    yield "world", torch.float32, dict(weight=True), dict(no_grad=True)
    yield "world", torch.float32, dict(label_smoothing=0.1), dict(debug=True)
    yield "world", torch.float32, dict(label_smoothing=0.1, weight=True, z_loss=1e-3, softcap=6.0), \
        dict(offset=True)


def _run_case(rank, groups, gname, dtype, opts, extras, seed):
    import torch.distributed as dist
    members, ends = GROUPS[gname]
    if rank not in members:
        return 0
    group = groups[gname]
    r = members.index(rank)
    assert dist.get_rank(group) == r
    V = ends[-1]
    start, end = shards(ends)[r]
    o = _opts(opts, V)
    if extras.get("offset"):  # the GLOBAL (V,) logit offsets, the same on every rank
        o["logit_offset"] = logit_offsets(V)
    ii = o.get("ignore_index", -100)
    lead = extras.get("lead", (7,))
    x, t = make_inputs(lead, V, dtype, seed, ignore_index=ii,
                       frac_ignored=1.0 if extras.get("all_ignored") else 0.25,
                       index_dtype=extras.get("index_dtype", torch.int64))
    what = f"rank {rank} group {gname} [{start}, {end}) {dtype} {opts} {extras}"
    leaf = x[..., start:end].clone().requires_grad_(not extras.get("no_grad"))
    vocab_size = extras.get("vocab_size", V)
    old_ops, old_debug = fusedloss.functional._FORCE_OPS, flops.is_debug()
    fusedloss.functional._FORCE_OPS = bool(extras.get("force_ops"))
    fusedloss.set_debug(bool(extras.get("debug")))
    try:
        loss = vp_ce(leaf, t, start, end, group=group, vocab_size=vocab_size, **o)
    finally:
        fusedloss.functional._FORCE_OPS = old_ops
        fusedloss.set_debug(old_debug)
    assert loss.dtype == torch.float32, what
    # the same loss bits on every rank of the group (the merge is in rank order)
    bits = loss.detach().reshape(-1).view(torch.int32).clone()
    allbits = [torch.empty_like(bits) for _ in members]
    dist.all_gather(allbits, bits, group=group)
    assert all(torch.equal(b, allbits[0]) for b in allbits), f"{what}: loss differs between ranks"
    if extras.get("no_grad"):
        assert loss.grad_fn is None
        ref = fusedloss.cross_entropy(x.reshape(-1, V), t.reshape(-1), o.get("weight"),
                                      logit_offset=o.get("logit_offset"))
        assert_close(loss, ref, LOSS_TOL_FUSED, what)
        return 1
    g = upstream(loss.shape, seed=seed)
    loss.backward(g)
    assert leaf.grad.dtype == dtype and leaf.grad.shape == leaf.shape, what
    if t.numel() == 0:
        assert loss.shape == (() if o.get("reduction", "mean") != "none" else lead)
        return 1
    check_against_full(loss, leaf.grad, x, t.long(), start, end, o, g, what)
    return 1


def _compile_case(rank, groups):
    """torch.compile(fullgraph=True): no graph break; forward and backward match eager."""
    members, ends = GROUPS["01"]
    if rank not in members:
        return 0
    group = groups["01"]
    r = members.index(rank)
    V = ends[-1]
    start, end = shards(ends)[r]
    w = class_weights(V)

    def f(xl, t):
        return vp_ce(xl, t, start, end, group=group, vocab_size=V, weight=w, label_smoothing=0.1,
                     z_loss=1e-3, reduction="none")

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    x, t = make_inputs((6,), V, torch.float32, seed=77)
    a = x[:, start:end].clone().requires_grad_(True)
    b = a.detach().clone().requires_grad_(True)
    la, lb = cf(a, t), f(b, t)
    g = upstream(la.shape)
    la.backward(g)
    lb.backward(g)
    assert torch.equal(la, lb) and torch.equal(a.grad, b.grad), f"rank {rank}: compiled != eager"
    check_against_full(la, a.grad, x, t, start, end, dict(weight=w, label_smoothing=0.1, z_loss=1e-3,
                                                          reduction="none"), g, "compiled")
    return 1


def _error_cases(rank, groups):
    """Errors every rank of the group raises alike (so none is left in a collective)."""
    n = 0
    world = groups["world"]
    _, ends = GROUPS["world"]
    V = ends[-1]
    x, t = make_inputs((5,), V, torch.float32, seed=8)
    # a gap between rank 0's and rank 1's shard: only the debug-mode collective check sees it
    gap = [(0, 4), (5, 6), (6, 17)][rank]
    fusedloss.set_debug(True)
    try:
        with pytest.raises(ValueError, match="not contiguous vocabulary slices in rank order"):
            vp_ce(x[:, gap[0]:gap[1]], t, gap[0], gap[1], group=world, vocab_size=V)
        # targets that differ between ranks
        t2 = t.clone()
        t2[2] = (rank * 5) % V
        with pytest.raises(ValueError, match="target differs between the ranks"):
            vp_ce(x[:, [0, 5, 6][rank]:ends[rank]], t2, [0, 5, 6][rank], ends[rank], group=world,
                  vocab_size=V)
    finally:
        fusedloss.set_debug(False)
    n += 2
    # rank 0 not starting at 0 and the last rank not ending at V: both raise before step 2
    if rank in (0, 1):
        sub = groups["01"]
        s, e = [(1, 10), (10, 16)][rank]
        with pytest.raises(ValueError, match="first slice" if rank == 0 else "last slice"):
            vp_ce(x[:, s:e], t, s, e, group=sub, vocab_size=V)
        n += 1
    # every rank passing the whole vocabulary on a group of 3 (group=None: the world group)
    with pytest.raises(ValueError, match="leaves no class for some other rank"):
        vp_ce(x, t, 0, V, vocab_size=V)
    n += 1
    # not a member of the group
    if rank == 0:
        with pytest.raises(ValueError, match="not a member of group"):
            vp_ce(x[:, :3], t, 0, 3, group=groups["12"], vocab_size=V)
        n += 1
    return n


def _margin_case(rank, groups):
    """fusedloss.vocab_parallel_margin_cross_entropy (ArcFace on class-sharded cosines, uneven shards,
    fp32, some rows ignored): the same loss on every rank, equal to the single-GPU op
    fusedloss.margin_cross_entropy on the full cosines; each rank's gradient is its slice."""
    import torch.distributed as dist
    members, ends = GROUPS["world"]
    group = groups["world"]
    r = members.index(rank)
    V = ends[-1]
    start, end = shards(ends)[r]
    g = torch.Generator().manual_seed(4242)
    x = torch.rand((9, V), generator=g, dtype=torch.float64).mul(1.9).sub(0.95).float()
    t = torch.randint(0, V, (9,), generator=g)
    t[torch.rand(9, generator=g) < 0.25] = -100
    n = 0
    for red in ("mean", "none"):
        leaf = x[:, start:end].clone().requires_grad_(True)
        loss = fusedloss.vocab_parallel_margin_cross_entropy(leaf, t, start, end, group=group, s=16.0, m2=0.5,
                                                             reduction=red, vocab_size=V)
        bits = loss.detach().reshape(-1).view(torch.int32).clone()
        allbits = [torch.empty_like(bits) for _ in members]
        dist.all_gather(allbits, bits, group=group)
        assert all(torch.equal(b, allbits[0]) for b in allbits), f"rank {rank} margin {red}: loss differs"
        full = x.clone().requires_grad_(True)
        ref = fusedloss.margin_cross_entropy(full, t, s=16.0, m2=0.5, reduction=red)
        assert_close(loss, ref, (1e-6, 1e-5), f"rank {rank} margin {red} loss")
        up = upstream(loss.shape, seed=3)
        loss.backward(up)
        ref.backward(up)
        assert_close(leaf.grad, full.grad[:, start:end], (1e-7, 1e-4), f"rank {rank} margin {red} grad")
        n += 1
    return n


def _worker(rank, world, init_file, out_dir):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        # every process creates every group, in the same order (torch.distributed's rule)
        groups = {"world": dist.group.WORLD, "01": dist.new_group([0, 1]),
                  "12": dist.new_group([1, 2])}
        n = 0
        for i, (gname, dtype, opts, extras) in enumerate(_mp_cases()):
            n += _run_case(rank, groups, gname, dtype, opts, extras, seed=1000 + i)
        n += _compile_case(rank, groups)
        n += _margin_case(rank, groups)
        n += _error_cases(rank, groups)
        dist.barrier()
        with open(os.path.join(out_dir, f"rank{rank}"), "w") as fh:
            fh.write(str(n))
        dist.barrier()   # every rank has written its count
    except BaseException:
        dist.destroy_process_group()
        raise
    # why: gloo's teardown once aborted a rank after all its work was done ("terminate called
    # without an active exception", CI 2026-12-02; passes alone): the count file is the result,
    # so the process leaves without the teardown
    os._exit(0)


def spawn_gloo(worker, world, tmp_path):
    """mp.spawn of `world` processes running worker(rank, world, init_file, out_dir) (gloo, file://
    init under tmp_path; one OpenMP thread each: several processes on a 2-core CI machine); skips
    without gloo. Returns each rank's count, read from out_dir/rank<r>."""
    import torch.distributed as dist
    import torch.multiprocessing as mp
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        mp.spawn(worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old
    return [int((tmp_path / f"rank{r}").read_text()) for r in range(world)]


def test_process_groups_gloo(tmp_path):
    """One spawn of 3 processes (gloo): every case on k = 3 and on two k = 2 subgroups."""
    counts = spawn_gloo(_worker, WORLD, tmp_path)
    expect = [sum(r in GROUPS[c[0]][0] for c in _mp_cases())  # the cases of its groups
              + (r in GROUPS["01"][0])                         # torch.compile
              + 2                                              # the margin CE (mean, none)
              + 3 + (r in (0, 1)) + (r == 0)                   # the error cases
              for r in range(WORLD)]
    assert counts == expect, (counts, expect)
