#!/usr/bin/env python3
"""bench_lovasz.py — the Lovasz-softmax loss (include/fusedloss.h section 13) on the GPU: fusedloss's
CUDA op vs sort-based PyTorch formulations (eager, and torch.compile where it works).

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_lovasz.py [--out F.json]

Input (--shape, default 4x19x512x512; --dtype float32): NCHW, labels uniform over the C classes
with 5% ignore_index = 255; classes="present" (every class is present), per_image=False.
Cases: probas (the input is probabilities: softmax of randn * 2, computed once outside the timed
step; the gradient is w.r.t. the probabilities, as Berman's lovasz_softmax) and logits
(from_logits=True: the softmax is part of the loss).
Providers (a failing one prints why; the run goes on):
  fusedloss  fusedloss.lovasz_softmax (the CUDA op: one fused call in the forward, the kept
             gradient scaled in the backward)
  fusedloss_pc  the same op on the input in the P x C layout (Berman's flat [P, C] probabilities, labels
             [P]: N = P pixels of one position each), permuted and made contiguous once outside the timed
             step; its gradient is permuted back for the error columns (the issue asks "fast for both
             P x C and C x P layouts")
  rows       the best PyTorch layout: fusedloss.lovasz._lovasz_reference, each class's errors a
             contiguous row of a [C, P] tensor, torch.sort(dim=1, stable), cumsum lovasz_grad,
             autograd through the sort (loss-zoo.md measured 14.6 ms fwd+bwd on this shape)
  dim0       the reference code's default layout: errors [P, C] sorted along dim 0 (loss-zoo.md:
             716 ms), timed with --slow-reps repetitions
  compile    torch.compile of `rows` (its boolean-mask indexing may break the graph; reported)
Per (case, provider): median ms of forward + backward (loss.backward(); CUDA events; two input
sets rotated), the ratio to the floor (read the input + write its gradient at the copy bandwidth
measured in the same run), the peak extra memory of one step, and the error of the loss (abs) and
of the gradient (max abs and relative L1) vs a float64 run of `rows` on the same rounded inputs
(near-ties within an fp32 rounding may rank differently: the header's numerics note). Last lines:
one "SUMMARY <case> ..." per case, then the speedups the issue asks for. Needs CUDA (SKIP otherwise).
"""
import argparse
import datetime
import gc
import math
import os
import sys
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = ["probas", "logits"]
PROVIDERS = ["fusedloss", "fusedloss_pc", "rows", "compile", "dim0"]
IGNORE = 255


def lovasz_dim0(x, y, from_logits):
    """The reference code's layout: valid pixels x classes, sorted along dim 0."""
    import torch
    N, C = x.shape[:2]
    p = torch.softmax(x.float(), 1) if from_logits else x.float()
    p = p.permute(0, 2, 3, 1).reshape(-1, C)
    yf = y.reshape(-1)
    valid = yf != IGNORE
    p, yf = p[valid], yf[valid]
    fg = torch.nn.functional.one_hot(yf, C).float()
    errors = (fg - p).abs()
    errors_sorted, perm = torch.sort(errors, 0, descending=True)
    fg_sorted = fg.gather(0, perm)
    gts = fg_sorted.sum(0)
    inter = gts - fg_sorted.cumsum(0)
    union = gts + (1 - fg_sorted).cumsum(0)
    jac = 1 - inter / union
    jac = torch.cat([jac[:1], jac[1:] - jac[:-1]], 0)
    losses = (errors_sorted * jac).sum(0)
    present = gts > 0
    return losses[present].mean()


def make_provider(name, from_logits):
    import torch
    import fusedloss
    from fusedloss.lovasz import _lovasz_reference

    def rows(x, y):
        N, C = x.shape[:2]
        return _lovasz_reference(x.reshape(N, C, -1), y.reshape(N, -1), 0, False, IGNORE, from_logits)

    if name in ("fusedloss", "fusedloss_pc"):   # fusedloss_pc: called on to_pc()'s [P, C] / [P] inputs
        return lambda x, y: fusedloss.lovasz_softmax(x, y, ignore_index=IGNORE, from_logits=from_logits)
    if name == "rows":
        return rows
    if name == "compile":
        return torch.compile(rows)
    if name == "dim0":
        return lambda x, y: lovasz_dim0(x, y, from_logits)
    raise ValueError(f"unknown provider {name!r}")


def to_pc(x, y):
    """[N, C, d1, ...] / [N, d1, ...] -> the P x C layout: [P, C] contiguous (a leaf that requires grad
    when x does) / [P]"""
    C = x.shape[1]
    xp = x.detach().movedim(1, -1).reshape(-1, C).contiguous().requires_grad_(x.requires_grad)
    return xp, y.reshape(-1)


def from_pc(g, shape):
    """a [P, C] gradient back to [N, C, d1, ...]"""
    return g.reshape((shape[0],) + tuple(shape[2:]) + (shape[1],)).movedim(-1, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="4x19x512x512", help="NxCxHxW")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--slow-reps", type=int, default=3, help="repetitions of the dim0 provider")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--graph", default="fusedloss,compile",
                    help="comma list of providers also timed replayed from CUDA graphs (the GPU time of the step, "
                         "the host out of the way; '' for none)")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("SKIP: bench_lovasz.py needs a CUDA device")
        return 0
    import fusedloss
    from fusedloss.lovasz import _lovasz_reference
    from torch_timing import (add_graph_time, copy_bw, rotating_step, step_extra_bytes, summary_parts, timed,
                              write_results)

    dt = getattr(torch, args.dtype)
    shape = tuple(int(v) for v in args.shape.lower().split("x"))
    N, C = shape[:2]
    numel = math.prod(shape)
    es = torch.empty((), dtype=dt).element_size()
    bw = copy_bw()
    floor_ms = 2 * numel * es / bw * 1e3
    print(f"bench_lovasz: torch {torch.__version__} | {torch.cuda.get_device_name()} | fusedloss "
          f"{fusedloss._lib.version_string()} | commit {os.environ.get('FL_COMMIT', 'unknown')} | "
          f"{datetime.datetime.utcnow().isoformat(timespec='seconds')}Z | copy {bw / 1e12:.2f} TB/s | "
          f"shape {args.shape} {args.dtype} | floor {floor_ms:.3f} ms")
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows_out, summaries, best = [], [], {}
    for case in args.cases.split(","):
        from_logits = case == "logits"
        xs, ts = [], []
        for _ in range(2):
            z = torch.randn(shape, device="cuda", generator=gen) * 2
            x = (z if from_logits else torch.softmax(z, 1)).to(dt).requires_grad_(True)
            t = torch.randint(0, C, (N,) + shape[2:], device="cuda", generator=gen)
            t[torch.rand(t.shape, device="cuda", generator=gen) < 0.05] = IGNORE
            xs.append(x)
            ts.append(t)
        # float64 reference on the same rounded inputs
        xr = xs[0].detach().double().requires_grad_(True)
        lr = _lovasz_reference(xr.reshape(N, C, -1), ts[0].reshape(N, -1), 0, False, IGNORE, from_logits)
        lr.backward()
        ref_loss, ref_grad = lr.detach(), xr.grad.detach()
        del xr
        res = {}
        for name in args.providers.split(","):
            r = dict(case=case, provider=name, shape=list(shape), dtype=args.dtype, floor_ms=floor_ms)
            try:
                f = make_provider(name, from_logits)
                pc = name == "fusedloss_pc"
                xu, tu = (xs, ts) if not pc else map(list, zip(*[to_pc(x, t) for x, t in zip(xs, ts)]))
                step = rotating_step(f, xu, tu)
                reps = args.slow_reps if name == "dim0" else args.reps
                med, mn = timed(step, reps, 1 if name == "dim0" else args.warmup)
                extra = step_extra_bytes(f, xu, tu)
                sk = xu[0].detach().clone().requires_grad_(True)
                lk = f(sk, tu[0])
                lk.backward()
                gd = (from_pc(sk.grad, shape) if pc else sk.grad).double() - ref_grad
                err_loss = abs(lk.double().item() - ref_loss.item())
                err_grad = gd.abs().max().item()
                rel_l1 = (gd.abs().sum() / ref_grad.abs().sum().clamp_min(1e-300)).item()
                r.update(ms=med, min_ms=mn, ratio=med / floor_ms, extra_mib=extra / 2**20, err_loss=err_loss,
                         err_grad=err_grad, rel_l1_grad=rel_l1, ref_loss=ref_loss.item())
                print(f"{case:>7} {name:>10}: {med:9.3f} ms (min {mn:.3f}) {med / floor_ms:7.2f}x floor extra "
                      f"{extra / 2**20:8.1f} MiB |dloss| {err_loss:.2e} |dgrad| {err_grad:.2e} rel L1 {rel_l1:.1e}")
                add_graph_time(r, name, args.graph, f, xu, tu, args.reps, floor_ms, 7)   # GPU time
                del sk, lk, gd
            except Exception as e:  # noqa: BLE001  (report, continue)
                r.update(error=f"{type(e).__name__}: {e}")
                print(f"{case:>7} {name:>10}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                if os.environ.get("BENCH_TRACEBACK"):
                    traceback.print_exc()
            finally:
                for x in xs:
                    x.grad = None
                xu = tu = None
                gc.collect()
                torch.cuda.empty_cache()
            res[name] = r
            rows_out.append(r)
        summaries.append(f"SUMMARY lovasz {case} {args.shape} {args.dtype} floor {floor_ms:.3f} ms: "
                         + " | ".join(summary_parts(res)))
        for mine in ("fusedloss", "fusedloss_pc"):
            fl = res.get(mine, {}).get("ms")
            if fl:
                for other in ("rows", "compile", "dim0"):
                    o = res.get(other, {}).get("ms")
                    if o:
                        best[(case, mine, other)] = o / fl
        xs = ts = None
        gc.collect()
        torch.cuda.empty_cache()
    for line in summaries:
        print(line)
    for (case, mine, other), sp in best.items():
        print(f"SPEEDUP lovasz {case}: {mine} {sp:.1f}x faster than {other}")
    if args.out:
        write_results(args.out, bw, rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
