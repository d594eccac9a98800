"""_zoo_util.py — helpers shared by the Python tests of the row-softmax losses (test_distill.py,
test_linear_distill.py, test_softmax_losses.py): the CUDA skip marks and the tolerance check; and
the cross-entropy tests' elementwise check assert_close (test_cross_entropy.py, test_logit_offset.py).
Imported by module name (pytest puts this folder on sys.path: python/tests has no __init__.py)."""
import pytest

torch = pytest.importorskip("torch")

import fusedloss  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and fusedloss.cuda_built()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and a CUDA build of libfusedloss")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


def close(got, ref, tol, what):
    atol, rtol = tol
    got = got.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), f"{what}: NaN pattern differs"
    m = ~torch.isnan(ref)
    if not m.any():
        return
    err = (got - ref).abs()[m]
    scale = ref.abs()[m].max()
    bad = err > atol * scale + rtol * ref.abs()[m]
    assert not bad.any(), (f"{what}: {int(bad.sum())} mismatches of {err.numel()}, maxdiff {err.max().item():.3g} "
                           f"(max |ref| {scale.item():.3g})")


def assert_close(got, ref, tol, what):
    atol, rtol = tol
    got = got.detach().double().cpu()
    ref = ref.detach().double().cpu()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    nan_got, nan_ref = torch.isnan(got), torch.isnan(ref)
    assert torch.equal(nan_got, nan_ref), f"{what}: NaN pattern differs"
    g, r = got[~nan_got], ref[~nan_ref]
    err = (g - r).abs()
    bad = err > atol + rtol * r.abs()
    if bad.any():
        idx = bad.nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} mismatches, maxdiff {err.max().item():.3g}; "
                             f"first: {[(g[i].item(), r[i].item()) for i in idx]}")
