"""Tests of the per-class logit offset (fl_ce_options.logit_offset, include/fusedloss.h section 5):
fusedloss.cross_entropy(..., logit_offset=o) / linear_cross_entropy(..., logit_offset=o) / the nn
modules / the raw ops' `offset` / `class_offset` against F.cross_entropy(softcap(s*x) + o, ...)
evaluated in float64 (loss and .grad by autograd of the reference), every dtype, reduction,
ignore_index, label smoothing, class weights, z_loss, (N, C, d) inputs, inplace_backward,
return_lse, soft targets (the torch fallback), both eager paths and the custom ops,
torch.compile(fullgraph=True), opcheck, the C struct plumbing (CEOptions and target_prob), and
bad offsets. Every test runs on CPU and again on CUDA (skipped without a GPU and a CUDA build).

Run (CPU, CI):   make lib && PYTHONPATH=python python -m pytest -q python/tests/test_logit_offset.py
Run (H200):      make lib && PYTHONPATH=python python3 -m pytest -q python/tests/test_logit_offset.py -k cuda
"""
import ctypes

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import fusedloss  # noqa: E402
from _zoo_util import assert_close  # noqa: E402
from fusedloss import _lib  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HAS_CUDA = torch.cuda.is_available() and fusedloss.cuda_built()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
REDUCTIONS = ["none", "mean", "sum"]

# tolerances as python/tests/test_cross_entropy.py: |got - ref| <= atol + rtol * |ref|
LOSS_TOL = {"cpu": (1e-5, 1e-5), "cuda": (1e-5, 2e-5)}
GRAD_TOL = {"cpu": {torch.float32: (1e-7, 1e-5), torch.float16: (1e-7, 1e-3), torch.bfloat16: (1e-7, 8e-3)},
            "cuda": {torch.float32: (1e-7, 1e-4), torch.float16: (1e-7, 2e-3), torch.bfloat16: (1e-7, 1.6e-2)}}


# ---- float64 reference ----------------------------------------------------------------------
def transformed(x, offset, softcap=None, logit_scale=1.0):
    """z = softcap(s * x) + o (o broadcast along the class dimension: 0 for 1-D input, else 1)."""
    z = x * logit_scale
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    if offset is not None:
        o = offset.double().to(z.device)
        if z.dim() >= 3:
            o = o.reshape((1, -1) + (1,) * (z.dim() - 2))
        z = z + o
    return z


def reference(x, t, offset, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
              z_loss=0.0, softcap=None, logit_scale=1.0):
    """F.cross_entropy(softcap(s*x) + o, ...) in float64, plus z_loss * lse(z)^2 per row (not
    class-weighted; 'mean' over non-ignored rows)."""
    z = transformed(x, offset, softcap, logit_scale)
    w = weight.double() if weight is not None else None
    soft = t.is_floating_point()
    tt = t.double() if soft else t.long()
    ce = F.cross_entropy(z, tt, w, ignore_index=ignore_index, reduction=reduction,
                         label_smoothing=label_smoothing)
    if not z_loss:
        return ce
    lse = torch.logsumexp(z, dim=1 if z.dim() >= 2 else 0)
    mask = torch.ones_like(lse) if soft else (t != ignore_index).double()
    zl = z_loss * lse.square() * mask
    if reduction == "none":
        return ce + zl
    if reduction == "sum":
        return ce + zl.sum()
    return ce + zl.sum() / mask.sum()


def log_prior_offset(C, device, tau=1.0, seed=3):
    """Logit adjustment (Menon et al. 2021): tau * log(class prior) of a skewed prior, fp32."""
    g = torch.Generator().manual_seed(seed)
    prior = torch.softmax(torch.randn(C, generator=g, dtype=torch.float64) * 1.5, 0)
    return (tau * prior.log()).float().to(device)


def make_inputs(shape, dtype, device, ignore_index=-100, frac_ignored=0.25, seed=0, soft=False):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3.0).to(dtype).to(device)
    C = shape[1] if len(shape) >= 2 else shape[0]
    if soft:
        t = torch.rand(shape, generator=g, dtype=torch.float64)
        t = (t / t.sum(dim=1 if len(shape) >= 2 else 0, keepdim=True)).float().to(device)
        return x, t
    tshape = shape[:1] + shape[2:] if len(shape) >= 2 else ()
    t = torch.randint(0, C, tshape, generator=g)
    if frac_ignored and t.dim() > 0:
        t[torch.rand(tshape, generator=g) < frac_ignored] = ignore_index
    return x, t.to(device)


def upstream(loss, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(loss.shape, generator=g, dtype=torch.float64) + 0.5).to(loss.device)


def _materialize(opts, C, device):
    opts = dict(opts)
    if opts.get("weight"):
        g = torch.Generator().manual_seed(7)
        opts["weight"] = (torch.rand(C, generator=g) + 0.2).to(device)
    else:
        opts.pop("weight", None)
    return opts


def _id(o):
    return "-".join(("classweights" if v else "noweights") if k == "weight" else f"{k}={v}"
                    for k, v in o.items()) or "default"


def check_case(shape, dtype, device, *, soft=False, inplace_backward=False, offset=None, grad_tol=None,
               calls=2, **opts):
    """fusedloss vs the float64 reference: loss, and the input gradient for a random upstream
    gradient; `calls` times (the first call with new options takes the general path, the next the
    eager fast path with its cached options)."""
    C = shape[1] if len(shape) >= 2 else shape[0]
    opts = _materialize(opts, C, device)
    o = log_prior_offset(C, device) if offset is None else offset
    x, t = make_inputs(shape, dtype, device, ignore_index=opts.get("ignore_index", -100), soft=soft)
    xr = x.detach().double().requires_grad_(True)
    ref = reference(xr, t, o, **opts)
    gout = upstream(ref)
    ref.backward(gout)
    grad_tol = grad_tol or GRAD_TOL[device][dtype]
    for k in range(calls):
        leaf = x.detach().clone().requires_grad_(True)
        xin = leaf * 1 if inplace_backward else leaf  # a non-leaf whose storage may be overwritten
        loss = fusedloss.cross_entropy(xin, t, logit_offset=o, inplace_backward=inplace_backward, **opts)
        assert loss.dtype == torch.float32
        what = f"{shape} {dtype} {device} {opts} call {k}"
        assert_close(loss, ref, LOSS_TOL[device], "loss " + what)
        loss.backward(gout.float())
        assert leaf.grad.dtype == dtype
        assert_close(leaf.grad, xr.grad, grad_tol, "grad " + what)


@pytest.fixture(params=["eager", "ops"])
def path(request, monkeypatch):
    """eager: the direct autograd.Function path; ops: the torch.library custom ops (what
    torch.compile traces)."""
    monkeypatch.setattr(fusedloss.functional, "_FORCE_OPS", request.param == "ops")
    return request.param


# ---- the grid -----------------------------------------------------------------------------------
SHAPES = [(7,), (1, 1), (8, 11), (9, 41), (3, 7, 5), (2, 5, 3, 4)]
OPTIONS = [
    dict(reduction=r, **kw) for r in REDUCTIONS for kw in (
        dict(),
        dict(ignore_index=0),
        dict(label_smoothing=0.1),
        dict(weight=True),
        dict(weight=True, label_smoothing=0.1, ignore_index=2),
        dict(z_loss=1e-2),
        dict(softcap=5.0, logit_scale=0.5),
        dict(weight=True, label_smoothing=0.05, z_loss=1e-2, softcap=4.0, logit_scale=1.3),
    )
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("opts", OPTIONS, ids=_id)
def test_grid(opts, shape, dtype, device, path):
    check_case(shape, dtype, device, **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", [dict(), dict(reduction="none"), dict(reduction="sum", weight=True),
                                  dict(label_smoothing=0.1, z_loss=1e-3, softcap=6.0)], ids=_id)
@pytest.mark.parametrize("shape", [(8, 11), (3, 7, 5)], ids=str)
def test_inplace_backward(shape, opts, dtype, device, path):
    # fp16/bf16 gradients are rounded twice on this path (kernel, then the multiply)
    tol = GRAD_TOL[device][dtype]
    check_case(shape, dtype, device, inplace_backward=True, grad_tol=(tol[0], 2 * tol[1]), **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(7,), (8, 11), (2, 5, 3, 4)], ids=str)
@pytest.mark.parametrize("opts", [dict(), dict(reduction="none"), dict(weight=True, label_smoothing=0.1),
                                  dict(z_loss=1e-2, softcap=4.0, logit_scale=0.7, reduction="sum")], ids=_id)
def test_soft_targets(opts, shape, dtype, device):
    """Probability targets take the torch fallback (_soft_cross_entropy): offset added after softcap."""
    check_case(shape, dtype, device, soft=True, **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("grad", [True, False])
def test_return_lse(device, inplace, grad, path):
    x, t = make_inputs((8, 11), torch.float32, device)
    o = log_prior_offset(11, device, tau=0.7)
    z = transformed(x.double(), o, softcap=3.0)
    ref = torch.where(t != -100, torch.logsumexp(z, 1), torch.zeros((), dtype=torch.float64, device=device))
    for _ in range(2):  # general path, then the fast path
        xin = x.clone().requires_grad_(grad)
        loss, lse = fusedloss.cross_entropy(xin * 1 if grad else xin, t, softcap=3.0, logit_offset=o,
                                            return_lse=True, inplace_backward=inplace)
        assert lse.shape == (8,) and lse.dtype == torch.float32 and not lse.requires_grad
        assert_close(lse, ref, (1e-5, 1e-6), "lse")
        if grad:
            loss.backward()
            assert xin.grad is not None
    x3, t3 = make_inputs((2, 5, 3), torch.float32, device)
    _, lse3 = fusedloss.cross_entropy(x3, t3, logit_offset=o[:5], return_lse=True, reduction="none")
    ref3 = torch.where(t3 != -100, torch.logsumexp(transformed(x3.double(), o[:5]), 1),
                       torch.zeros((), dtype=torch.float64, device=device))
    assert lse3.shape == (2, 3)
    assert_close(lse3, ref3, (1e-5, 1e-6), "lse 3-D")


@pytest.mark.parametrize("device", DEVICES)
def test_zero_offset_equals_no_offset(device, path):
    x, t = make_inputs((9, 41), torch.float32, device)
    for kw in (dict(), dict(label_smoothing=0.1, z_loss=1e-3, softcap=5.0, reduction="none")):
        a = x.clone().requires_grad_(True)
        b = x.clone().requires_grad_(True)
        la = fusedloss.cross_entropy(a, t, **kw)
        lb = fusedloss.cross_entropy(b, t, logit_offset=torch.zeros(41, device=device), **kw)
        assert_close(lb, la, (1e-6, 1e-6), "loss")
        la.sum().backward()
        lb.sum().backward()
        assert_close(b.grad, a.grad, (1e-7, 1e-6), "grad")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_ignored_and_empty(device, reduction, path):
    o = log_prior_offset(9, device)
    x = torch.randn(4, 9, device=device, requires_grad=True)
    t = torch.full((4,), -100, device=device)
    for _ in range(2):
        loss = fusedloss.cross_entropy(x, t, reduction=reduction, logit_offset=o)
        ref = F.cross_entropy(x.detach() + o, t, reduction=reduction)
        assert_close(loss, ref, LOSS_TOL[device], "all ignored")
        x.grad = None
        loss.sum().backward()
        assert torch.count_nonzero(x.grad).item() == 0
    e = torch.randn(0, 9, device=device, requires_grad=True)
    te = torch.zeros(0, dtype=torch.long, device=device)
    out = fusedloss.cross_entropy(e, te, reduction=reduction, logit_offset=o)
    assert out.shape == ((0,) if reduction == "none" else ())
    out.sum().backward()
    assert e.grad.shape == (0, 9)


@pytest.mark.parametrize("device", DEVICES)
def test_constant_offset_is_a_no_op(device):
    """A constant offset shifts every z_j alike: the softmax and so the loss are unchanged."""
    x, t = make_inputs((8, 11), torch.float32, device)
    a = fusedloss.cross_entropy(x, t, reduction="none")
    b = fusedloss.cross_entropy(x, t, reduction="none", logit_offset=torch.full((11,), 2.5, device=device))
    assert_close(b, a, (1e-5, 1e-5), "constant offset")


@pytest.mark.parametrize("device", DEVICES)
def test_offsets_are_not_mixed_up_by_the_caches(device, path):
    """The options struct is cached per (weight, flag, offset) address: changing or dropping the
    offset between calls with the same options gives each call its own result."""
    x, t = make_inputs((8, 11), torch.float32, device)
    offsets = [log_prior_offset(11, device, seed=s) for s in (1, 2)] + [None, log_prior_offset(11, device, seed=1)]
    for o in offsets:
        for _ in range(2):
            loss = fusedloss.cross_entropy(x, t, label_smoothing=0.1, logit_offset=o)
            assert_close(loss, reference(x.double(), t, o, label_smoothing=0.1), LOSS_TOL[device], f"{o}")


@pytest.mark.parametrize("device", DEVICES)
def test_offset_conversions(device, path):
    """float64 / float16 / strided / Parameter / requires_grad offsets: used as fp32, detached; the
    offset itself never gets a gradient."""
    x, t = make_inputs((8, 11), torch.float32, device)
    o = log_prior_offset(11, device)
    ref_x = x.double().requires_grad_(True)
    ref = reference(ref_x, t, o.double(), reduction="sum")
    ref.backward()
    variants = [o.double(), torch.stack([o, o], 1)[:, 0], torch.nn.Parameter(o.clone()),
                o.clone().requires_grad_(True), torch.nn.Parameter(o.clone(), requires_grad=False)]
    for v in variants:
        for _ in range(2):
            xg = x.clone().requires_grad_(True)
            loss = fusedloss.cross_entropy(xg, t, reduction="sum", logit_offset=v)
            loss.backward()
            assert_close(loss, ref, LOSS_TOL[device], f"loss {v.dtype} {v.stride()}")
            assert_close(xg.grad, ref_x.grad, GRAD_TOL[device][torch.float32], "grad")
            assert v.grad is None
    half = o.half()
    assert_close(fusedloss.cross_entropy(x, t, logit_offset=half),
                 reference(x.double(), t, half.double()), LOSS_TOL[device], "fp16 offset")


@pytest.mark.parametrize("device", DEVICES)
def test_create_graph_backward(device, path):
    """backward(create_graph=True) goes through the backward op, which gets the offset too."""
    x, t = make_inputs((8, 11), torch.float32, device)
    o = log_prior_offset(11, device)
    xr = x.double().requires_grad_(True)
    (gr,) = torch.autograd.grad(reference(xr, t, o, weight=torch.arange(1.0, 12.0, device=device)), xr)
    for _ in range(2):
        xg = x.clone().requires_grad_(True)
        loss = fusedloss.cross_entropy(xg, t, torch.arange(1.0, 12.0, device=device), logit_offset=o)
        (g,) = torch.autograd.grad(loss, xg, create_graph=True)
        assert_close(g, gr, GRAD_TOL[device][torch.float32], "create_graph grad")


@pytest.mark.parametrize("device", DEVICES)
def test_offset_is_version_checked(device):
    """The eager path saves the (fp32, contiguous: not copied) offset: changing it in place between
    forward and backward raises torch's error instead of a silently wrong gradient."""
    x = torch.randn(6, 10, device=device, requires_grad=True)
    t = torch.randint(0, 10, (6,), device=device)
    o = log_prior_offset(10, device)
    for _ in range(2):
        loss = fusedloss.cross_entropy(x, t, logit_offset=o)
    o.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


# ---- the C calls: the offset's address reaches fl_ce_options -----------------------------------
class _Spy:
    """Records the C calls that fusedloss.ops makes (name, arguments)."""

    def __init__(self, lib):
        self._lib = lib
        self.calls = []

    def __getattr__(self, name):
        fn = getattr(self._lib, name)

        def wrapped(*args):
            self.calls.append((name, args))
            return fn(*args)
        return wrapped


def test_ce_options_struct_layout():
    fields = [f[0] for f in _lib.CEOptions._fields_]
    assert fields[-3:] == ["error_flag", "logit_offset", "target_prob"]
    ptr = ctypes.sizeof(ctypes.c_void_p)
    assert _lib.CEOptions.target_prob.offset == _lib.CEOptions.logit_offset.offset + ptr
    assert ctypes.sizeof(_lib.CEOptions) == _lib.CEOptions.target_prob.offset + ptr
    o = _lib.ce_options()
    assert o.struct_size == ctypes.sizeof(_lib.CEOptions) and not o.logit_offset and not o.target_prob
    o = _lib.ce_options(logit_offset=1024, target_prob=2048)
    assert (o.logit_offset, o.target_prob) == (1024, 2048)


def test_target_prob_through_the_c_api_cpu():
    """_lib.ce_options(target_prob=...): p_t = exp(z_t - lse) per row (1 on ignored rows)."""
    x, t = make_inputs((8, 11), torch.float32, "cpu")
    o = log_prior_offset(11, "cpu")
    N, V = x.shape
    p = torch.full((N,), -1.0)
    loss = torch.empty(N)
    lse = torch.empty(N)
    opts = _lib.ce_options(reduction=_lib.FL_REDUCTION_NONE, logit_offset=o.data_ptr(), target_prob=p.data_ptr(),
                           softcap=4.0)
    nbytes = _lib.workspace_size(N, V, _lib.FL_DTYPE_F32, opts)
    ws = torch.empty(nbytes, dtype=torch.uint8)
    _lib._check(_lib.lib.fl_cross_entropy_forward_cpu(
        loss.data_ptr(), lse.data_ptr(), x.data_ptr(), t.data_ptr(), N, V, V, _lib.FL_DTYPE_F32,
        _lib.FL_INDEX_I64, ctypes.addressof(opts), ws.data_ptr(), nbytes), "fl_cross_entropy_forward_cpu")
    z = transformed(x.double(), o, softcap=4.0)
    keep = t != -100
    pt = torch.ones(N, dtype=torch.float64)
    pt[keep] = torch.softmax(z[keep], 1).gather(1, t[keep].unsqueeze(1)).squeeze(1)
    assert_close(p, pt, (1e-6, 1e-5), "target_prob")
    assert_close(loss, reference(x.double(), t, o, reduction="none", softcap=4.0), LOSS_TOL["cpu"], "loss")


@pytest.mark.parametrize("inplace", [False, True])
def test_fast_path_passes_the_offset_address_cpu(monkeypatch, inplace):
    x, t = make_inputs((9, 41), torch.float32, "cpu")
    o = log_prior_offset(41, "cpu")
    kw = dict(label_smoothing=0.05, reduction="sum", logit_offset=o, inplace_backward=inplace)
    ref = fusedloss.cross_entropy(x * 1, t, **kw)  # first call: general path, caches the options
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    xg = x.clone().requires_grad_(True)
    loss = fusedloss.cross_entropy(xg * 1, t, **kw)
    loss.backward()
    names = [c[0] for c in spy.calls]
    if inplace:
        assert names == ["fl_cross_entropy_fused_cpu", "fl_scale_rows_cpu"], names
    else:
        assert names == ["fl_cross_entropy_forward_cpu", "fl_cross_entropy_backward_cpu"], names
    opts_arg = 12 if inplace else 9
    st = _lib.CEOptions.from_address(spy.calls[0][1][opts_arg])
    assert st.logit_offset == o.data_ptr()  # the caller's fp32 tensor itself: no copy
    assert st.target_prob is None and st.struct_size == ctypes.sizeof(_lib.CEOptions)
    if not inplace:
        assert _lib.CEOptions.from_address(spy.calls[1][1][11]).logit_offset == o.data_ptr()
    assert torch.equal(loss, ref)
    # without the offset, the same options give a struct with a NULL logit_offset
    fusedloss.cross_entropy(x, t, label_smoothing=0.05, reduction="sum")
    assert _lib.CEOptions.from_address(spy.calls[-1][1][9]).logit_offset is None


def test_vocab_parallel_ops_pass_no_offset_cpu(monkeypatch):
    """The vocab-parallel steps pass NULL without logit_offset, and the GLOBAL (V,) fp32 offset's
    address (to all three steps, forward and backward) with one."""
    spy = _Spy(fusedloss.ops._fl)
    monkeypatch.setattr(fusedloss.ops, "_fl", spy)
    x, t = make_inputs((6, 10), torch.float32, "cpu")

    def offsets_passed():
        got = {}
        for name, args in spy.calls:
            if name.startswith("fl_vp_ce_"):
                opts = args[10] if "local_stats" in name else args[8] if "combine" in name else args[13]
                got.setdefault(name, []).append(_lib.CEOptions.from_address(opts).logit_offset)
        spy.calls.clear()
        return got

    xg = x.clone().requires_grad_(True)
    fusedloss.vocab_parallel_cross_entropy(xg, t, 0, 10).backward()
    got = offsets_passed()
    assert sorted(got) == ["fl_vp_ce_backward_cpu", "fl_vp_ce_combine_cpu", "fl_vp_ce_local_stats_cpu"]
    for name, ptrs in got.items():
        assert ptrs == [None] * len(ptrs), name
    o = log_prior_offset(10, "cpu")
    assert o.dtype == torch.float32 and o.is_contiguous()
    xg = x.clone().requires_grad_(True)
    fusedloss.vocab_parallel_cross_entropy(xg, t, 0, 10, logit_offset=o).backward()
    got = offsets_passed()
    assert sorted(got) == ["fl_vp_ce_backward_cpu", "fl_vp_ce_combine_cpu", "fl_vp_ce_local_stats_cpu"]
    for name, ptrs in got.items():
        assert ptrs == [o.data_ptr()] * len(ptrs), name


# ---- the raw ops -----------------------------------------------------------------------------------
def _op_samples(device):
    samples = []
    for dtype, red, (N, V), w, strided in [
        (torch.float32, 1, (8, 11), False, False), (torch.float32, 0, (5, 7), True, False),
        (torch.bfloat16, 2, (6, 9), False, True), (torch.float16, 1, (4, 16), True, False),
    ]:
        x, t = make_inputs((N, V), dtype, device)
        if strided:
            x = torch.cat([x, x[:, :3]], 1)[:, :V]
        weight = (torch.rand(V) + 0.5).to(device) if w else None
        samples.append((x, t, weight, red, log_prior_offset(V, device)))
    return samples


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_ops_with_offset(device):
    from torch.library import opcheck
    for x, t, weight, red, o in _op_samples(device):
        args = (-100, red, 0.1, 1e-3, 0.0, 1.0)
        xg = x.detach().clone().requires_grad_(True)
        opcheck(torch.ops.fusedloss.cross_entropy_forward.default, (xg, t, weight) + args + (o,))
        opcheck(torch.ops.fusedloss.cross_entropy_forward.default, (x, t, weight) + args + (o,))
        loss, lse = torch.ops.fusedloss.cross_entropy_forward(x, t, weight, *args, o)
        gl = torch.rand(loss.numel(), dtype=torch.float32, device=device) + 0.5
        opcheck(torch.ops.fusedloss.cross_entropy_backward.default, (gl, x, t, lse, weight) + args + (0.5, o))
        opcheck(torch.ops.fusedloss.cross_entropy_fused.default, (x, t, weight) + args + (gl, 0.5, o))
        opcheck(torch.ops.fusedloss.cross_entropy_fused_inplace.default,
                (x.clone(), t, weight) + args + (gl, 0.5, o))


@pytest.mark.parametrize("device", DEVICES)
def test_raw_ops_with_offset_match_reference(device):
    for x, t, weight, red, o in _op_samples(device):
        args = (-100, red, 0.1, 1e-3, 2.0, 0.9)
        reduction = ["none", "mean", "sum"][red]
        xr = x.detach().double().requires_grad_(True)
        ref = reference(xr, t, o, weight, -100, reduction, 0.1, 1e-3, 2.0, 0.9)
        gl = torch.rand(ref.numel(), dtype=torch.float32, device=device) + 0.5
        ref.backward(gl.double().reshape(ref.shape) * 0.5)
        loss, lse = torch.ops.fusedloss.cross_entropy_forward(x, t, weight, *args, o)
        assert_close(loss, ref, LOSS_TOL[device], "forward")
        lse_ref = torch.where(t != -100, torch.logsumexp(transformed(x.double(), o, 2.0, 0.9), 1),
                              torch.zeros((), dtype=torch.float64, device=device))
        assert_close(lse, lse_ref, (1e-5, 1e-6), "lse")
        tol = GRAD_TOL[device][x.dtype]
        d = torch.ops.fusedloss.cross_entropy_backward(gl, x, t, lse, weight, *args, 0.5, o)
        assert_close(d, xr.grad, tol, "backward")
        l2, lse2, d2 = torch.ops.fusedloss.cross_entropy_fused(x, t, weight, *args, gl, 0.5, o)
        if device == "cpu":  # one code path: the same bits
            assert torch.equal(loss, l2) and torch.equal(lse, lse2)
        else:  # CUDA: the forward and the fused pass are different kernels (summation order)
            assert_close(l2, loss, (1e-6, 1e-6), "fused loss vs forward")
            assert_close(lse2, lse, (1e-6, 1e-6), "fused lse vs forward")
        assert_close(d2, xr.grad, tol, "fused")
        xi = x.clone()  # contiguous even when x is a strided view: on CUDA another row layout
        l3, lse3 = torch.ops.fusedloss.cross_entropy_fused_inplace(xi, t, weight, *args, gl, 0.5, o)
        if device == "cpu" or xi.stride() == x.stride():  # the same kernel on the same layout: same bits
            assert torch.equal(l2, l3) and torch.equal(lse2, lse3) and torch.equal(d2, xi)
        else:  # CUDA splits rows by 16-byte alignment: another summation order
            assert_close(l3, l2, (1e-6, 1e-6), "in-place loss vs fused")
            assert_close(lse3, lse2, (1e-6, 1e-6), "in-place lse vs fused")
            assert_close(xi, xr.grad, tol, "in place")
        # keyword use of the new last argument
        l4, _ = torch.ops.fusedloss.cross_entropy_forward(x, t, weight, *args, offset=o)
        assert torch.equal(loss, l4)


# ---- errors ------------------------------------------------------------------------------------------
def _bad_calls():
    x = torch.randn(4, 5)
    t = torch.randint(0, 5, (4,))
    ce = fusedloss.cross_entropy
    return [
        (lambda: ce(x, t, logit_offset=torch.zeros(4)), ValueError, r"logit_offset must have shape \(5,\)"),
        (lambda: ce(x, t, logit_offset=torch.zeros(1, 5)), ValueError, r"logit_offset must have shape \(5,\)"),
        (lambda: ce(x, t, logit_offset=torch.zeros(())), ValueError, "logit_offset must have shape"),
        (lambda: ce(x, t, logit_offset=torch.zeros(5, dtype=torch.long)), TypeError, "logit_offset must be floating"),
        (lambda: ce(x, t, logit_offset=[0.0] * 5), TypeError, "logit_offset must be a Tensor or None"),
        (lambda: ce(x, t, logit_offset=torch.zeros(5, device="meta")), ValueError, "logit_offset is on meta"),
        (lambda: ce(x[None].transpose(1, 2), t[None], logit_offset=torch.zeros(4)), ValueError,
         r"logit_offset must have shape \(5,\)"),
        (lambda: ce(x, torch.rand(4, 5), logit_offset=torch.zeros(3)), ValueError, "logit_offset"),
        (lambda: fusedloss.linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), t,
                                                logit_offset=torch.zeros(4)), ValueError,
         r"linear_cross_entropy: logit_offset must have shape \(5,\)"),
        (lambda: fusedloss.linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), t,
                                                logit_offset=torch.zeros(5, dtype=torch.int32)), TypeError,
         "linear_cross_entropy: logit_offset must be floating"),
        (lambda: fusedloss.linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), t,
                                                logit_offset=torch.zeros(5, device="meta")), ValueError,
         "linear_cross_entropy: logit_offset is on meta"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_argument_errors(i):
    fn, exc, match = _bad_calls()[i]
    for _ in range(2):  # also once the options are cached (the fast path must not accept them)
        with pytest.raises(exc, match=match):
            fn()


@needs_cuda
def test_offset_on_another_device_cuda():
    x, t = make_inputs((4, 5), torch.float32, "cuda")
    for _ in range(2):
        with pytest.raises(ValueError, match="logit_offset is on cpu"):
            fusedloss.cross_entropy(x, t, logit_offset=torch.zeros(5))
    with pytest.raises(ValueError, match="logit_offset is on cpu"):
        fusedloss.linear_cross_entropy(torch.randn(4, 8, device="cuda"), torch.randn(5, 8, device="cuda"), t,
                                       logit_offset=torch.zeros(5))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_offset_is_a_library_error_cpu(bad):
    o = torch.zeros(5)
    o[2] = bad
    for _ in range(2):
        with pytest.raises(fusedloss.FusedLossError, match="logit_offset"):
            fusedloss.cross_entropy(torch.randn(4, 5), torch.randint(0, 5, (4,)), logit_offset=o)
    with pytest.raises(fusedloss.FusedLossError, match="logit_offset"):
        fusedloss.linear_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), torch.randint(0, 5, (4,)),
                                       logit_offset=o)


def test_raw_op_offset_checks():
    x = torch.randn(4, 5)
    t = torch.randint(0, 5, (4,))
    args = (-100, 1, 0.0, 0.0, 0.0, 1.0)
    for bad, match in [(torch.zeros(5, dtype=torch.float64), "offset must be float32"),
                       (torch.zeros(4), r"offset must be float32 of shape \(5,\)"),
                       (torch.zeros(5, 2)[:, 0], "offset must be contiguous")]:
        with pytest.raises(ValueError, match=match):
            torch.ops.fusedloss.cross_entropy_forward(x, t, None, *args, bad)
        with pytest.raises(ValueError, match=match):
            torch.ops.fusedloss.cross_entropy_fused(x, t, None, *args, None, 1.0, bad)
        with pytest.raises(ValueError, match=match):
            torch.ops.fusedloss.cross_entropy_fused_inplace(x.clone(), t, None, *args, None, 1.0, bad)
        with pytest.raises(ValueError, match=match):
            torch.ops.fusedloss.cross_entropy_backward(torch.ones(1), x, t, torch.zeros(4), None, *args, 1.0, bad)
    h, W = torch.randn(4, 3), torch.randn(5, 3)
    lce = (0, 1 << 20, 0)
    with pytest.raises(ValueError, match=r"class_offset must be float32 of shape \(5,\)"):
        torch.ops.fusedloss.linear_cross_entropy_forward(h, W, None, t, None, *args, *lce, torch.zeros(4))
    with pytest.raises(ValueError, match="class_offset must be float32"):
        torch.ops.fusedloss.linear_cross_entropy_fused(h, W, None, t, None, *args, *lce, torch.float32, True,
                                                       False, None, 1.0, torch.zeros(5, dtype=torch.float16))


# ---- nn.CrossEntropyLoss ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_module(device):
    o = log_prior_offset(11, "cpu", tau=1.0)
    w = torch.rand(11) + 0.5
    m = fusedloss.nn.CrossEntropyLoss(weight=w, label_smoothing=0.1, reduction="sum", logit_offset=o).to(device)
    assert "logit_offset" in dict(m.named_buffers()) and m.logit_offset.device.type == device
    assert "logit_offset=(11,)" in repr(m)
    assert "logit_offset" in m.state_dict()
    x, t = make_inputs((8, 11), torch.float32, device)
    xg = x.clone().requires_grad_(True)
    xr = x.double().requires_grad_(True)
    loss = m(xg, t)
    ref = reference(xr, t, o, w.to(device), label_smoothing=0.1, reduction="sum")
    assert_close(loss, ref, LOSS_TOL[device], "module loss")
    loss.backward()
    ref.backward()
    assert_close(xg.grad, xr.grad, GRAD_TOL[device][torch.float32], "module grad")
    plain = fusedloss.nn.CrossEntropyLoss()
    assert plain.logit_offset is None and "logit_offset" not in plain.state_dict()
    assert "logit_offset" not in repr(plain)


@pytest.mark.parametrize("cls", ["CrossEntropyLoss", "LinearCrossEntropyLoss"])
@pytest.mark.parametrize("bad,exc", [([0.0, 1.0], TypeError), (torch.zeros(2, 2), ValueError),
                                     (torch.zeros(3, dtype=torch.long), ValueError)])
def test_module_constructor_errors(cls, bad, exc):
    with pytest.raises(exc, match=f"{cls}: logit_offset"):
        getattr(fusedloss.nn, cls)(logit_offset=bad)


# ---- torch.compile ------------------------------------------------------------------------------------
def _compile_check(device, backend, dynamic=False, inplace=False):
    torch._dynamo.reset()
    w = (torch.rand(11) + 0.5).to(device)
    o = log_prior_offset(11, device)

    def fn(h, W, t):
        logits = h @ W.t()
        return fusedloss.cross_entropy(logits, t, weight=w, label_smoothing=0.05, z_loss=1e-3,
                                       logit_offset=o, inplace_backward=inplace)

    def fn_none(h, W, t):
        logits = (h @ W.t()).reshape(4, 4, 11).transpose(1, 2)  # (N, C, d)
        return (fusedloss.cross_entropy(logits, t.reshape(4, 4), reduction="none", softcap=3.0,
                                        logit_offset=o) * 0.3).sum()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 11, device=device)
            self.loss = fusedloss.nn.CrossEntropyLoss(reduction="sum", softcap=5.0, logit_offset=o * 0.5,
                                                      inplace_backward=inplace)

        def forward(self, h, t):
            return self.loss(self.lin(h), t)

    h = torch.randn(16, 6, device=device)
    t = torch.randint(0, 11, (16,), device=device)
    t[3] = -100
    W = torch.randn(11, 6, device=device)
    for f in (fn, fn_none):
        fc = torch.compile(f, fullgraph=True, backend=backend, dynamic=dynamic)
        a1 = [a.clone().requires_grad_(a.is_floating_point()) for a in (h, W, t)]
        a2 = [a.clone().requires_grad_(a.is_floating_point()) for a in (h, W, t)]
        l1, l2 = f(*a1), fc(*a2)
        l1.backward()
        l2.backward()
        assert torch.allclose(l1, l2, atol=1e-5, rtol=1e-5)
        for u, v in zip(a1, a2):
            if u.grad is not None:
                assert torch.allclose(u.grad, v.grad, atol=1e-6, rtol=1e-4)
        # and against the float64 reference
        hr, Wr = h.double().requires_grad_(True), W.double().requires_grad_(True)
        if f is fn:
            ref = reference(hr @ Wr.t(), t, o, w, label_smoothing=0.05, z_loss=1e-3)
        else:
            ref = (reference((hr @ Wr.t()).reshape(4, 4, 11).transpose(1, 2), t.reshape(4, 4), o,
                             reduction="none", softcap=3.0) * 0.3).sum()
        ref.backward()
        assert_close(l2, ref, (1e-5, 1e-5), "compiled loss vs reference")
        assert_close(a2[1].grad, Wr.grad, (1e-5, 1e-4), "compiled dW vs reference")
    m = Model()
    mc = torch.compile(m, fullgraph=True, backend=backend, dynamic=dynamic)
    l1 = m(h, t)
    l1.backward()
    g1 = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    l2 = mc(h, t)
    l2.backward()
    assert torch.allclose(l1, l2, atol=1e-5, rtol=1e-5)
    for u, p in zip(g1, m.parameters()):
        assert torch.allclose(u, p.grad, atol=1e-5, rtol=1e-4)
    # the offset really is used: without it the compiled module gives another loss
    m.loss.logit_offset = None
    torch._dynamo.reset()
    assert not torch.allclose(torch.compile(m, fullgraph=True, backend=backend)(h, t), l2, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend, device):
    _compile_check(device, backend)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_inplace_and_dynamic(device):
    _compile_check(device, "aot_eager", dynamic=True)
    _compile_check(device, "aot_eager", inplace=True)


# ---- linear cross-entropy ----------------------------------------------------------------------------
LCE_LOSS_TOL = {"cpu": {torch.float32: (1e-6, 1e-5), torch.float16: (1e-5, 1e-4), torch.bfloat16: (1e-5, 1e-4)},
                "cuda": {torch.float32: (1e-5, 1e-4), torch.float16: (1e-4, 1e-3), torch.bfloat16: (1e-4, 2e-3)}}
LCE_GRAD_TOL = {"cpu": {torch.float32: (1e-6, 1e-4), torch.float16: (2e-4, 4e-3), torch.bfloat16: (2e-3, 1.6e-2)},
                "cuda": {torch.float32: (1e-5, 1e-3), torch.float16: (5e-4, 8e-3), torch.bfloat16: (4e-3, 3e-2)}}


def lce_assert_close(got, ref, tol, what):
    """|got - ref| <= atol * max(1, max|ref|) + rtol * |ref| (python/tests/test_linear_cross_entropy.py)."""
    atol, rtol = tol
    scale = max(1.0, ref.detach().abs().max().item()) if ref.numel() else 1.0
    assert_close(got, ref, (atol * scale, rtol), what)


def lce_reference(h, W, b, t, dtype, offset, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  class_weight=None, z_loss=0.0, softcap=None, logit_scale=1.0, **_):
    """F.linear in float64 with the logits rounded to dtype (as F.linear returns them), then the
    cross-entropy reference on softcap(s * logits) + offset."""
    V = W.shape[0]
    logits = F.linear(h, W, b).to(dtype).double().reshape(-1, V)
    loss = reference(logits, t.reshape(-1), offset, class_weight, ignore_index, reduction,
                     label_smoothing, z_loss, softcap, logit_scale)
    return loss.reshape(t.shape) if reduction == "none" else loss


def lce_inputs(lead, H, V, dtype, device, bias=True, seed=0, ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, H, generator=g, dtype=torch.float64).to(dtype).to(device)
    W = (torch.randn(V, H, generator=g, dtype=torch.float64) / H ** 0.5 * 3).to(dtype).to(device)
    b = (torch.randn(V, generator=g, dtype=torch.float64) * 0.5).to(dtype).to(device) if bias else None
    t = torch.randint(0, V, lead, generator=g)
    t[torch.rand(lead, generator=g) < 0.25] = ignore_index
    return h, W, b, t.to(device)


def lce_check(lead, H, V, dtype, device, *, bias=True, requires=(True, True, True), **opts):
    opts = dict(opts)
    if opts.pop("class_weight", False):
        g = torch.Generator().manual_seed(7)
        opts["class_weight"] = (torch.rand(V, generator=g) + 0.2).to(device)
    o = log_prior_offset(V, device)
    h, W, b, t = lce_inputs(lead, H, V, dtype, device, bias=bias, ignore_index=opts.get("ignore_index", -100))
    refs = [x.detach().double().requires_grad_(r) if x is not None else None for x, r in zip((h, W, b), requires)]
    ref = lce_reference(*refs, t, dtype, o, **opts)
    leaves = [x.detach().clone().requires_grad_(r) if x is not None else None for x, r in zip((h, W, b), requires)]
    loss = fusedloss.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], logit_offset=o, **opts)
    what = f"{lead} H={H} V={V} {dtype} {device} {opts}"
    lce_assert_close(loss, ref, LCE_LOSS_TOL[device][dtype], "loss " + what)
    g = upstream(ref)
    if any(requires):
        ref.backward(g)
        loss.backward(g.float())
    tol = LCE_GRAD_TOL[device][dtype]
    if dtype != torch.float32 and not opts.get("recompute"):
        # mode 1 rounds 16-bit gradients twice (the kernel's for an upstream gradient of 1, then
        # the scaling's), the reference once: dhidden, a sum over V of such terms, drifts further
        tol = (2 * tol[0], 2 * tol[1])
    for name, x, xr, r in zip(("hidden", "weight", "bias"), leaves, refs, requires):
        if x is None or not r:
            continue
        assert x.grad is not None and x.grad.dtype == dtype, name
        lce_assert_close(x.grad, xr.grad, tol, f"d{name} " + what)


@pytest.fixture
def highest_precision():
    """fp32 comparisons against float64 run without TF32 on CUDA (the library follows torch's setting)."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


LCE_OPTIONS = [
    dict(),
    dict(label_smoothing=0.1, ignore_index=3),
    dict(class_weight=True),
    dict(z_loss=1e-2),
    dict(softcap=3.0, logit_scale=1.7, z_loss=1e-3, label_smoothing=0.05, class_weight=True),
]


def _lce_id(o):
    return ",".join(f"{k}={'w' if v is True else v}" for k, v in o.items()) or "default"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recompute", [None, True], ids=["mode1", "recompute"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("opts", LCE_OPTIONS, ids=_lce_id)
def test_linear_cross_entropy(opts, dtype, reduction, recompute, device, path, highest_precision):
    lce_check((2, 5), 16, 37, dtype, device, reduction=reduction, recompute=recompute, **opts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires", [(True, False, False), (False, True, True), (False, False, False)], ids=str)
def test_linear_cross_entropy_partial_and_no_grad(requires, device, path, highest_precision):
    lce_check((9,), 12, 21, torch.float32, device, requires=requires, label_smoothing=0.1)
    with torch.no_grad():  # nothing to differentiate: the loss-only call
        lce_check((9,), 12, 21, torch.float32, device, requires=(False, False, False), reduction="none")


@pytest.mark.parametrize("device", DEVICES)
def test_linear_module(device, highest_precision):
    h, W, b, t = lce_inputs((2, 6), 16, 29, torch.float32, device)
    o = log_prior_offset(29, "cpu")
    m = fusedloss.nn.LinearCrossEntropyLoss(reduction="sum", label_smoothing=0.1, logit_offset=o,
                                            chunk_rows=5).to(device)
    assert "logit_offset" in dict(m.named_buffers()) and m.logit_offset.device.type == device
    assert "logit_offset=(29,)" in repr(m)
    xs = [x.clone().requires_grad_(True) for x in (h, W, b)]
    loss = m(xs[0], xs[1], t, xs[2])
    refs = [x.double().requires_grad_(True) for x in (h, W, b)]
    ref = lce_reference(*refs, t, torch.float32, o, reduction="sum", label_smoothing=0.1)
    lce_assert_close(loss, ref, LCE_LOSS_TOL[device][torch.float32], "module loss")
    loss.backward()
    ref.backward()
    for x, y, n in zip(xs, refs, ("hidden", "weight", "bias")):
        lce_assert_close(x.grad, y.grad, LCE_GRAD_TOL[device][torch.float32], "module d" + n)
    assert fusedloss.nn.LinearCrossEntropyLoss().logit_offset is None


@pytest.mark.parametrize("device", DEVICES)
def test_linear_raw_ops_with_class_offset(device, highest_precision):
    from torch.library import opcheck
    h, W, b, t = lce_inputs((11,), 16, 37, torch.float32, device)
    o = log_prior_offset(37, device)
    lce = (4, 1 << 20, 0)
    for red in (0, 1, 2):
        ce = (-100, red, 0.1, 1e-3, 0.0, 1.0)
        gl = torch.rand(11 if red == 0 else 1, device=device) + 0.5
        loss, lse, dh, dw, db = torch.ops.fusedloss.linear_cross_entropy_fused(
            h, W, b, t, None, *ce, *lce, torch.float32, True, True, gl, 0.5, o)
        l2, lse2 = torch.ops.fusedloss.linear_cross_entropy_forward(h, W, b, t, None, *ce, *lce, o)
        dh2, dw2, db2 = torch.ops.fusedloss.linear_cross_entropy_backward(
            gl, h, W, b, t, lse2, None, *ce, *lce, torch.float32, True, True, 0.5, o)
        assert_close(loss, l2, (1e-7, 1e-6), "fused vs forward loss")
        assert_close(lse, lse2, (1e-7, 1e-6), "fused vs forward lse")
        for u, v in ((dh, dh2), (dw, dw2), (db, db2)):
            assert_close(u, v, (1e-6, 1e-5), f"fused vs backward red={red}")
        reduction = ["none", "mean", "sum"][red]
        ref = lce_reference(h.double(), W.double(), b.double(), t, torch.float32, o, reduction=reduction,
                            label_smoothing=0.1, z_loss=1e-3)
        lce_assert_close(l2, ref, LCE_LOSS_TOL[device][torch.float32], "raw forward vs reference")
        # without the offset the loss differs: the offset reached the C call
        l0, _ = torch.ops.fusedloss.linear_cross_entropy_forward(h, W, b, t, None, *ce, *lce)
        assert not torch.allclose(l0, l2, atol=1e-4)
        if device == "cpu":
            opcheck(torch.ops.fusedloss.linear_cross_entropy_forward.default, (h, W, b, t, None) + ce + lce + (o,))
            opcheck(torch.ops.fusedloss.linear_cross_entropy_fused.default,
                    (h, W, b, t, None) + ce + lce + (torch.float32, True, True, gl, 0.5, o))
            opcheck(torch.ops.fusedloss.linear_cross_entropy_backward.default,
                    (gl, h, W, b, t, lse2, None) + ce + lce + (torch.float32, True, True, 0.5, o))


@pytest.mark.parametrize("device", DEVICES)
def test_linear_compile_fullgraph(device, highest_precision):
    torch._dynamo.reset()
    o = log_prior_offset(37, device)

    def fn(h, W, b, t):
        return fusedloss.linear_cross_entropy(h, W, t, b, label_smoothing=0.05, z_loss=1e-3,
                                              logit_offset=o, chunk_rows=4)

    def fn_recompute(h, W, b, t):
        return fusedloss.linear_cross_entropy(h, W, t, b, reduction="sum", recompute=True,
                                              logit_offset=o, softcap=3.0) / 7

    h, W, b, t = lce_inputs((3, 4), 16, 37, torch.float32, device)
    for f in (fn, fn_recompute):
        fc = torch.compile(f, fullgraph=True, backend="aot_eager")
        a1 = [x.clone().requires_grad_(True) for x in (h, W, b)]
        a2 = [x.clone().requires_grad_(True) for x in (h, W, b)]
        l1, l2 = f(*a1, t), fc(*a2, t)
        l1.backward()
        l2.backward()
        tol = LCE_GRAD_TOL[device][torch.float32]
        lce_assert_close(l2, l1, tol, f"compiled loss {f.__name__}")
        for u, v in zip(a1, a2):
            lce_assert_close(v.grad, u.grad, tol, f"compiled grad {f.__name__}")
        refs = [x.double().requires_grad_(True) for x in (h, W, b)]
        if f is fn:
            ref = lce_reference(*refs, t, torch.float32, o, label_smoothing=0.05, z_loss=1e-3)
        else:
            ref = lce_reference(*refs, t, torch.float32, o, reduction="sum", softcap=3.0) / 7
        lce_assert_close(l2, ref, LCE_LOSS_TOL[device][torch.float32], "compiled vs reference")
