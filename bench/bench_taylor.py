#!/usr/bin/env python3
"""bench_taylor.py — the Taylor softmax cross-entropy (include/fusedloss.h section 14) and the
large-margin softmax cross-entropy (section 15) on the GPU: fusedloss's CUDA op vs the PyTorch
formulation (eager) and torch.compile of it.

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_taylor.py [--out F.json]

Cases (Taylor order 2 unless --order, large margin lambda 0.3 unless --lam; reduction mean, logits
randn * 2, targets uniform in [0, C)):
  rows       65536x1000 float32 (--rows-shape), no target ignored
  vocab      8192x32000 bfloat16 (--vocab-shape), no target ignored
  vocab_ign  the same with 5% of the targets ignore_index (-100)
  lm_rows    the large-margin CE on the rows case's shape and dtype
  lm_vocab   the large-margin CE on the vocab case's shape and dtype
Providers (a missing or failing one prints why; the run goes on):
  fusedloss  fusedloss.taylor_cross_entropy / large_margin_cross_entropy (one fused call in the
             forward: loss and dlogits; the backward only scales the kept gradient, nothing moved for
             loss.backward())
  eager      the PyTorch formulation (fusedloss.taylor._taylor_torch: x in float32, f = 1 + x + x^2/2
             (order 4: + x^3/6 + x^4/24), log p = log f - log f.sum(-1), F.nll_loss, the loss cast back;
             fusedloss.large_margin._large_margin_torch: logsumexp - x_y plus the regulariser from one
             log_softmax over the target-masked logits, in float32)
  compile    torch.compile of that eager function (inductor)
Per (case, provider): median ms of --reps forward + backward steps (loss.backward(); CUDA events;
input sets rotated, together larger than L2; "graph": the same steps captured in one CUDA graph per
input set and replayed, the GPU time with the host out of the way), the ratio to the floor (read the logits + write
dlogits at the device-to-device copy bandwidth measured in the same run), the peak extra memory of
one step (torch.cuda.max_memory_allocated() during it minus what was allocated before minus the
gradient it leaves), and the abs error of the loss and the max abs error of the gradient vs a float64
reference (pytorch-loss's TaylorSoftmax written out, NLL of its log; pytorch-loss's
LargeMarginSoftmaxV1 written out) on the first --check-rows rows (the provider run on those alone).
Last lines: one "SUMMARY <case> ..." per case, then "SPEEDUP" lines (fusedloss vs eager / compile).
Needs CUDA (prints SKIP otherwise).
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

CASES = ["rows", "vocab", "vocab_ign", "lm_rows", "lm_vocab"]
PROVIDERS = ["fusedloss", "eager", "compile"]
IGNORE = -100
IGNORE_FRAC = {"rows": 0.0, "vocab": 0.0, "vocab_ign": 0.05, "lm_rows": 0.0, "lm_vocab": 0.0}


def reference(x, t, order):
    """float64 loss (mean over rows not ignored) and gradient: pytorch-loss's TaylorSoftmax (fn = 1 +
    sum_i x^i / i!, fn / fn.sum), the negative log at the target."""
    import torch
    xd = x.detach().double().requires_grad_(True)
    fn = torch.ones_like(xd)
    denor = 1.0
    for i in range(1, order + 1):
        denor *= i
        fn = fn + xd.pow(i) / denor
    logp = (fn / fn.sum(dim=1, keepdim=True)).log()
    keep = t != IGNORE
    tc = torch.where(keep, t, torch.zeros_like(t))
    l = -logp.gather(1, tc[:, None]).squeeze(1)
    loss = torch.where(keep, l, torch.zeros((), dtype=l.dtype, device=l.device)).sum() / keep.sum()
    (g,) = torch.autograd.grad(loss, xd)
    return loss.detach(), g


def reference_lm(x, t, lam):
    """float64 loss (mean over rows not ignored) and gradient of pytorch-loss's LargeMarginSoftmaxV1:
    the target pushed down by 1e6, q = softmax * (1 - onehot), log q = log_softmax * (1 - onehot),
    (lam / 2) sum (q - 1 / (C - 1)) log q, plus the cross-entropy."""
    import torch
    import torch.nn.functional as F
    xd = x.detach().double().requires_grad_(True)
    C = xd.shape[1]
    keep = t != IGNORE
    tc = torch.where(keep, t, torch.zeros_like(t))
    idx = F.one_hot(tc, C).double()
    lg = xd - idx * 1.0e6
    q = lg.softmax(1) * (1.0 - idx)
    log_q = lg.log_softmax(1) * (1.0 - idx)
    mg = ((q - 1.0 / (C - 1)) * log_q * (1.0 - idx)).sum(1) * (lam / 2)
    l = F.cross_entropy(xd, tc, reduction="none") + mg
    loss = torch.where(keep, l, torch.zeros((), dtype=l.dtype, device=l.device)).sum() / keep.sum()
    (g,) = torch.autograd.grad(loss, xd)
    return loss.detach(), g


def make_provider(name, order, lam=None):
    """A function (x, target) -> scalar loss, or raise (reported, the run goes on). lam None: the
    Taylor CE of `order`, else the large-margin CE of that lambda."""
    import torch
    import fusedloss
    from fusedloss.large_margin import _large_margin_torch
    from fusedloss.taylor import _taylor_torch

    def eager(x, t):
        if lam is not None:
            return _large_margin_torch(x, t, lam, IGNORE, "mean")
        return _taylor_torch(x, t, order, IGNORE, "mean")
    if name == "fusedloss":
        if lam is not None:
            return lambda x, t: fusedloss.large_margin_cross_entropy(x, t, lam=lam, ignore_index=IGNORE)
        return lambda x, t: fusedloss.taylor_cross_entropy(x, t, order=order, ignore_index=IGNORE)
    if name == "eager":
        return eager
    if name == "compile":
        return torch.compile(eager)
    raise ValueError(name)


def make_inputs(shape, dt, ignore_frac, n_sets, gen):
    import torch
    N, C = shape
    xs, ts = [], []
    for _ in range(n_sets):
        x = torch.randn(N, C, device="cuda", generator=gen) * 2
        t = torch.randint(0, C, (N,), device="cuda", generator=gen)
        if ignore_frac > 0:
            drop = torch.rand(N, device="cuda", generator=gen) < ignore_frac
            t = torch.where(drop, torch.full_like(t, IGNORE), t)
        xs.append(x.to(dt).requires_grad_(True))
        ts.append(t)
    return xs, ts


def parse_shape(s):
    return tuple(int(v) for v in s.lower().split("x"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows-shape", default="65536x1000", help="NxC of the rows case (float32)")
    ap.add_argument("--vocab-shape", default="8192x32000", help="NxC of the vocab cases (bfloat16)")
    ap.add_argument("--rows-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--vocab-dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--order", type=int, default=2, choices=[2, 4])
    ap.add_argument("--lam", type=float, default=0.3, help="lambda of the large-margin cases")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help=f"comma list of {', '.join(PROVIDERS)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check-rows", type=int, default=16, help="rows of the accuracy check")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("SKIP: bench_taylor.py needs a CUDA device")
        return 0
    import fusedloss
    from torch_timing import (copy_bw, graph_ms, rotating_step, step_extra_bytes, summary_parts, timed,
                              write_results)

    bw = copy_bw()
    print(f"bench_taylor: torch {torch.__version__} | {torch.cuda.get_device_name()} | fusedloss "
          f"{fusedloss._lib.version_string()} | commit {os.environ.get('FL_COMMIT', 'unknown')} | "
          f"{datetime.datetime.utcnow().isoformat(timespec='seconds')}Z | copy {bw / 1e12:.2f} TB/s | "
          f"order {args.order} | lambda {args.lam}")
    setups = {"rows": (parse_shape(args.rows_shape), args.rows_dtype),
              "vocab": (parse_shape(args.vocab_shape), args.vocab_dtype),
              "vocab_ign": (parse_shape(args.vocab_shape), args.vocab_dtype),
              "lm_rows": (parse_shape(args.rows_shape), args.rows_dtype),
              "lm_vocab": (parse_shape(args.vocab_shape), args.vocab_dtype)}
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows, summaries, speedups = [], [], []
    for case in args.cases.split(","):
        if case not in setups:
            print(f"unknown case {case!r} (choose from {', '.join(CASES)})")
            continue
        shape, dname = setups[case]
        lam = args.lam if case.startswith("lm_") else None   # None: the Taylor CE
        dt = getattr(torch, dname)
        es = torch.empty((), dtype=dt).element_size()
        nbytes = math.prod(shape) * es
        floor_ms = 2 * nbytes / bw * 1e3  # read logits + write dlogits
        shape_s = "x".join(str(v) for v in shape)
        tag = (f"{case} {'large-margin lambda ' + str(lam) if lam is not None else 'Taylor order ' + str(args.order)} "
               f"{shape_s} {dname} ignored {IGNORE_FRAC[case]:.0%}")
        xs = ts = None
        try:
            n_sets = max(2, min(8, math.ceil((256 << 20) / nbytes)))  # together well over L2
            xs, ts = make_inputs(shape, dt, IGNORE_FRAC[case], n_sets, gen)
            k = min(args.check_rows, shape[0])
            xk, tk = xs[0].detach()[:k].contiguous(), ts[0][:k].contiguous()
            ref_loss, ref_grad = reference(xk, tk, args.order) if lam is None else reference_lm(xk, tk, lam)
        except Exception as e:  # noqa: BLE001  (report, continue with the next case)
            print(f"{case:>10}: SETUP FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            summaries.append(f"SUMMARY {tag}: setup failed ({type(e).__name__})")
            rows.append(dict(case=case, shape=list(shape), dtype=dname, error=f"{type(e).__name__}: {e}"))
            xs = ts = None
            gc.collect()
            torch.cuda.empty_cache()
            continue
        res = {}
        for name in args.providers.split(","):
            r = dict(case=case, provider=name, shape=list(shape), dtype=dname,
                     loss="large_margin" if lam is not None else "taylor", order=args.order, lam=lam,
                     ignore_frac=IGNORE_FRAC[case], floor_ms=floor_ms)
            try:
                f = make_provider(name, args.order, lam)
                step = rotating_step(f, xs, ts)
                med, mn = timed(step, args.reps, args.warmup)

                def gstep(i, f=f):
                    xs[i].grad = None
                    f(xs[i], ts[i]).backward()
                gms, why = graph_ms(gstep, len(xs), args.reps)
                if why:
                    print(f"{case:>10} {name:>10}: CUDA graph: {why}")
                extra = step_extra_bytes(f, xs, ts)
                sk = xk.clone().requires_grad_(True)
                lk = f(sk, tk)
                lk.backward()
                err_loss = abs(lk.double().item() - ref_loss.item())
                err_grad = (sk.grad.double() - ref_grad).abs().max().item()
                r.update(ms=med, min_ms=mn, ratio=med / floor_ms, graph_ms=gms, graph_ratio=gms / floor_ms,
                         extra_mib=extra / 2**20,
                         err_loss=err_loss, err_grad=err_grad, ref_loss=ref_loss.item(),
                         ref_grad_max=ref_grad.abs().max().item())
                print(f"{case:>10} {name:>10}: {med:8.3f} ms (min {mn:.3f}) {med / floor_ms:6.2f}x floor "
                      f"| graph {gms:8.3f} ms {gms / floor_ms:6.2f}x "
                      f"extra {extra / 2**20:9.1f} MiB  |dloss| {err_loss:.2e} |dgrad| {err_grad:.2e} "
                      f"(max |grad| {r['ref_grad_max']:.2e})")
            except Exception as e:  # noqa: BLE001  (report, continue)
                r.update(error=f"{type(e).__name__}: {e}")
                print(f"{case:>10} {name:>10}: FAILED {type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''}")
                if os.environ.get("BENCH_TRACEBACK"):
                    traceback.print_exc()
            finally:
                for x in xs:
                    x.grad = None
                gc.collect()
                torch.cuda.empty_cache()
            res[name] = r
            rows.append(r)
        summaries.append(f"SUMMARY {tag} floor {floor_ms:.3f} ms: " + " | ".join(summary_parts(res)))
        fl = res.get("fusedloss", {})
        if "ms" in fl:
            sp = [f"{other} {res[other]['ms'] / fl['ms']:.2f}x" for other in ("eager", "compile")
                  if other in res and "ms" in res[other]]
            if sp:
                speedups.append(f"SPEEDUP {case}: fusedloss vs " + ", ".join(sp))
        xs = ts = None
        gc.collect()
        torch.cuda.empty_cache()
    for line in summaries + speedups:
        print(line)
    if args.out:
        write_results(args.out, bw, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
