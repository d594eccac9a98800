#!/usr/bin/env python3
"""bench_distill.py — distillation divergences on raw logits (include/fusedloss.h section 10) on
the GPU: fusedloss.distillation_loss vs eager PyTorch, torch.compile of it, and Liger-Kernel.

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_distill.py [--out F.json]

Cases (default shape 4096x128256 bf16, the Llama-3 vocabulary; --shape NxV to change):
  kl_t2   forward KL, T = 2, t2_scale, batchmean (Hinton KD: F.kl_div(...) * T^2)
  jsd     generalised JSD, beta = 0.5, T = 1, batchmean (= Liger's mean: no row ignored)
Providers (a missing or failing one prints why; the run goes on):
  fusedloss  fusedloss.distillation_loss(s, t, ...)  (one fused call in the forward)
  eager      log_softmax of the fp32-upcast logits / T, then F.kl_div(log_target=True) (kl_t2) or
             the JSD formula with log M = logaddexp(log beta + log p, log(1 - beta) + log q) (jsd)
  compile    torch.compile of that eager function
  liger      liger_kernel.transformers LigerKLDIVLoss(reduction="batchmean", log_target=True) (x T^2)
             / LigerJSD(beta=0.5), if importable; they take log-probabilities, so the log_softmax
             (of s / T in the logits' dtype, as a user would feed them) is part of their timing
Per (case, provider): median ms of --reps forward + backward steps (loss.backward() of the reduced
loss; CUDA events; two input sets rotated, each larger than L2), the ratio to the floor (read
student + read teacher + write dstudent bytes at the device-to-device copy bandwidth measured in
the same run), the peak extra memory (torch.cuda.max_memory_allocated() during one step minus
what was allocated before it minus the student gradient the step leaves), and the max abs error
of the loss and of the gradient vs a float64 reference (the header's definitions on the same
rounded inputs) on the first --check-rows rows (each provider run on those rows alone).
Last lines: one "SUMMARY <case> ..." per case. Needs CUDA (prints SKIP otherwise).
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

CASES = {
    "kl_t2": dict(temperature=2.0, beta=0.0, t2_scale=True, reduction="batchmean"),
    "jsd": dict(temperature=1.0, beta=0.5, t2_scale=False, reduction="batchmean"),
}
PROVIDERS = ["fusedloss", "eager", "compile", "liger"]


def eager_loss(s, t, temperature, beta, t2_scale, reduction):
    """The PyTorch formula a user writes: log_softmax of the fp32-upcast logits, then kl_div / JSD."""
    import torch
    import torch.nn.functional as F
    T = temperature
    lq = F.log_softmax(s.float() / T, dim=-1)
    lp = F.log_softmax(t.float() / T, dim=-1)
    N = s.shape[0]
    if beta == 0:
        rows = F.kl_div(lq, lp, reduction="none", log_target=True)
    elif beta == 1:
        rows = F.kl_div(lp, lq, reduction="none", log_target=True)
    else:
        lm = torch.logaddexp(lp + math.log(beta), lq + math.log1p(-beta))
        rows = beta * F.kl_div(lm, lp, reduction="none", log_target=True) + \
            (1 - beta) * F.kl_div(lm, lq, reduction="none", log_target=True)
    loss = rows.sum() / N if reduction == "batchmean" else rows.sum()
    return loss * (T * T) if t2_scale else loss


def reference(s, t, temperature, beta, t2_scale, reduction):
    """float64 loss and student gradient (header section 10's definitions)."""
    import torch
    import torch.nn.functional as F
    sd = s.detach().double().requires_grad_(True)
    T = temperature
    lq = F.log_softmax(sd / T, dim=-1)
    lp = F.log_softmax(t.detach().double() / T, dim=-1)
    if beta == 0:
        rows = (lp.exp() * (lp - lq)).sum(-1)
    elif beta == 1:
        rows = (lq.exp() * (lq - lp)).sum(-1)
    else:
        p, q = lp.exp(), lq.exp()
        lm = torch.log(beta * p + (1 - beta) * q)
        rows = beta * (p * (lp - lm)).sum(-1) + (1 - beta) * (q * (lq - lm)).sum(-1)
    loss = rows.sum() / rows.shape[0] if reduction == "batchmean" else rows.sum()
    if t2_scale:
        loss = loss * T * T
    (g,) = torch.autograd.grad(loss, sd)
    return loss.detach(), g


def make_provider(name, kw):
    """A function (student, teacher) -> scalar loss, or raise (reported, the run goes on)."""
    import torch
    import torch.nn.functional as F
    import fusedloss
    T, beta = kw["temperature"], kw["beta"]
    if name == "fusedloss":
        return lambda s, t: fusedloss.distillation_loss(s, t, **kw)
    if name == "eager":
        return lambda s, t: eager_loss(s, t, **kw)
    if name == "compile":
        comp = torch.compile(lambda s, t: eager_loss(s, t, **kw))
        return comp
    if name == "liger":
        from liger_kernel.transformers import LigerJSD, LigerKLDIVLoss
        if beta == 0:
            crit = LigerKLDIVLoss(reduction="batchmean", log_target=True)
            scale = T * T if kw["t2_scale"] else 1.0

            def f(s, t):
                # F.kl_div convention: crit(input = student log-probs, target = teacher log-probs)
                return crit(F.log_softmax(s / T, dim=-1), F.log_softmax(t / T, dim=-1)) * scale
            return f
        if T != 1.0 or kw["t2_scale"]:
            raise ValueError("LigerJSD has no temperature; case not comparable")
        crit = LigerJSD(beta=beta)
        return lambda s, t: crit(F.log_softmax(s, dim=-1), F.log_softmax(t, dim=-1))
    raise ValueError(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="4096x128256", help="NxV of the student / teacher logits")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help=f"comma list of {', '.join(PROVIDERS)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check-rows", type=int, default=8, help="rows of the accuracy check vs float64")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--graph", default="fusedloss,compile",
                    help="comma list of providers also timed replayed from CUDA graphs (the GPU time of the step, "
                         "the host out of the way; '' for none)")
    ap.add_argument("--ab", default=os.environ.get("DISTILL_AB", ""),
                    help="';'-separated variants of the library's knobs ('K=V,K2=V2'), each timed for the "
                         "fusedloss provider only after the main table (e.g. FUSEDLOSS_ROWPASS_ITEMS=528)")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("SKIP: bench_distill.py needs a CUDA device")
        return 0
    import fusedloss
    from torch_timing import (add_graph_time, copy_bw, rotating_step, step_extra_bytes, summary_parts, timed,
                              write_results)

    N, V = (int(x) for x in args.shape.lower().split("x"))
    dt = getattr(torch, args.dtype)
    es = torch.empty((), dtype=dt).element_size()
    bw = copy_bw()
    print(f"bench_distill: torch {torch.__version__} | {torch.cuda.get_device_name()} | fusedloss "
          f"{fusedloss._lib.version_string()} | commit {os.environ.get('FL_COMMIT', 'unknown')} | "
          f"{datetime.datetime.utcnow().isoformat(timespec='seconds')}Z | copy {bw / 1e12:.2f} TB/s")
    g = torch.Generator(device="cuda").manual_seed(1)
    ss = [(torch.randn(N, V, device="cuda", generator=g) * 3).to(dt).requires_grad_(True) for _ in range(2)]
    ts = [(torch.randn(N, V, device="cuda", generator=g) * 3 + 0.5 * ss[i].detach().float()).to(dt)
          for i in range(2)]
    k = min(args.check_rows, N)
    floor_ms = 3 * N * V * es / bw * 1e3  # read s + read t + write ds
    rows, summaries = [], []
    for case in args.cases.split(","):
        kw = CASES[case]
        ref_loss, ref_grad = reference(ss[0][:k], ts[0][:k], **kw)
        res = {}
        for name in args.providers.split(","):
            r = dict(case=case, provider=name, shape=[N, V], dtype=args.dtype, floor_ms=floor_ms, **kw)
            try:
                f = make_provider(name, kw)
                step = rotating_step(f, ss, ts)
                med, mn = timed(step, args.reps, args.warmup)
                # peak extra memory of one step: beyond the inputs and the gradient it leaves
                extra = step_extra_bytes(f, ss, ts)
                # accuracy on the first k rows (the provider on those rows alone)
                sk = ss[0][:k].detach().clone().requires_grad_(True)
                lk = f(sk, ts[0][:k].clone())
                lk.backward()
                err_loss = abs(lk.double().item() - ref_loss.item())
                err_grad = (sk.grad.double() - ref_grad).abs().max().item()
                r.update(ms=med, min_ms=mn, ratio=med / floor_ms, extra_mib=extra / 2**20,
                         err_loss=err_loss, err_grad=err_grad, ref_loss=ref_loss.item(),
                         ref_grad_max=ref_grad.abs().max().item())
                print(f"{case:>6} {name:>10}: {med:8.3f} ms (min {mn:.3f}) {med / floor_ms:6.2f}x floor "
                      f"extra {extra / 2**20:9.1f} MiB  |dloss| {err_loss:.2e} |dgrad| {err_grad:.2e} "
                      f"(max |grad| {r['ref_grad_max']:.2e})")
                add_graph_time(r, name, args.graph, f, ss, ts, args.reps, floor_ms, 6)   # GPU time
            except Exception as e:  # noqa: BLE001  (report, continue)
                r.update(error=f"{type(e).__name__}: {e}")
                print(f"{case:>6} {name:>10}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                if os.environ.get("BENCH_TRACEBACK"):
                    traceback.print_exc()
            finally:
                for x in ss:
                    x.grad = None
                gc.collect()
                torch.cuda.empty_cache()
            res[name] = r
            rows.append(r)
        parts = summary_parts(res)
        summaries.append(f"SUMMARY {case} {N}x{V} {args.dtype} floor {floor_ms:.3f} ms: " + " | ".join(parts))
    # A/B of the library's knobs (read by the C entry points on every call: os.environ reaches getenv)
    for variant in [v for v in args.ab.split(";") if v.strip()]:
        kv = dict(item.split("=", 1) for item in variant.split(",") if "=" in item)
        saved = {key: os.environ.get(key) for key in kv}
        os.environ.update(kv)
        try:
            for case in args.cases.split(","):
                f = make_provider("fusedloss", CASES[case])
                step = rotating_step(f, ss, ts)
                med, mn = timed(step, args.reps, args.warmup)
                print(f"AB {variant:<40} {case:>6}: {med:8.3f} ms (min {mn:.3f}) {med / floor_ms:6.2f}x floor")
                rows.append(dict(case=case, provider="fusedloss", variant=variant, ms=med, min_ms=mn,
                                 ratio=med / floor_ms))
        finally:
            for key, val in saved.items():
                if val is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = val
            for x in ss:
                x.grad = None
    for line in summaries:
        print(line)
    if args.out:
        write_results(args.out, bw, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
