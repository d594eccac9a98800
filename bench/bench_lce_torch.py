#!/usr/bin/env python3
"""bench_lce_torch.py — linear + cross-entropy forward+backward (the lm_head and its loss):
fusedloss against PyTorch and the peers, in one run on one GPU.

Providers (a missing or failing one prints why; the run goes on):
  fusedloss        fusedloss.linear_cross_entropy(hidden, weight, target) (mode 1: gradients in
                   the forward, default byte budget); fusedloss-lean: byte_budget 256 MiB
  eager            F.cross_entropy(F.linear(h, w).float(), t)  (what HF models run)
  compile          torch.compile of the same function (dynamic=False)
  liger            liger_kernel LigerFusedLinearCrossEntropyLoss, if importable
Per (shape, provider): median ms of --reps fwd+bwd steps (CUDA events), the ratio to the three
full cuBLAS GEMMs (torch.matmul at V rounded up to 64, timed in the same run), and the peak extra
memory: torch.cuda.max_memory_allocated() during a step minus what was allocated before it minus
the gradients the step leaves (hidden.grad, weight.grad): the memory the loss needs beyond its
inputs and outputs. Loss and gradient (normwise) relative errors vs float64 (F.linear +
F.cross_entropy in double on the same bf16 inputs) for each provider: eager is PyTorch's unfused
path in the same precision, the yardstick for "no worse than PyTorch".
Usage: python3 bench/bench_lce_torch.py [--shapes 8192x4096x128256,...] [--providers ...]
           [--reps 10] [--warmup 3] [--out FILE.json]
Last lines: "LCE <shape> <provider> ms ratio extra_GiB" summaries.
"""
import argparse
import datetime
import gc
import json
import os
import sys
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEFAULT_SHAPES = "8192x4096x128256,8192x768x50257,8192x2304x256000"
ALL = ["fusedloss", "fusedloss-lean", "eager", "compile", "liger"]


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_timing import timed  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--providers", default=",".join(ALL))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA")
        return 0
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # PyTorch's default
    print(f"torch {torch.__version__} | {torch.cuda.get_device_name()} | commit {os.environ.get('FL_COMMIT', 'unknown')}"
          f" | {datetime.datetime.utcnow().isoformat(timespec='seconds')}Z")
    results = []
    summaries = []
    for shp in args.shapes.split(","):
        N, H, V = (int(x) for x in shp.split("x"))
        g = torch.Generator(device=dev).manual_seed(1234)
        h0 = (torch.rand(N, H, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        w0 = ((torch.rand(V, H, device=dev, generator=g) * 2 - 1) * 0.05).to(torch.bfloat16)
        t = torch.randint(0, V, (N,), device=dev, generator=g)
        # float64 reference loss and gradients on the same bf16 inputs (chunked over rows)
        with torch.no_grad():
            tot = 0.0
            w64 = w0.double()
            gh64 = torch.empty(N, H, device=dev, dtype=torch.float64)
            gw64 = torch.zeros(V, H, device=dev, dtype=torch.float64)
            for r0 in range(0, N, 1024):
                hc = h0[r0:r0 + 1024].double()
                z = hc @ w64.t()
                tc = t[r0:r0 + 1024]
                tot += F.cross_entropy(z, tc, reduction="sum").item()
                p = torch.softmax(z, dim=1)
                p[torch.arange(len(tc), device=dev), tc] -= 1.0
                p /= N
                gh64[r0:r0 + 1024] = p @ w64
                gw64 += p.t() @ hc
                del z, p, hc
            ref = tot / N
            del w64

        def gerr(x, ref64):
            return ((x.double() - ref64).norm() / ref64.norm()).item() if x is not None else float("nan")
        torch.cuda.empty_cache()
        # the floor: three full GEMMs at V rounded up to 64
        Vp = (V + 63) // 64 * 64
        wp = torch.empty(Vp, H, device=dev, dtype=torch.bfloat16).uniform_(-0.05, 0.05)
        lg = torch.empty(N, Vp, device=dev, dtype=torch.bfloat16).uniform_(-1e-4, 1e-4)

        def gemms():
            torch.matmul(h0, wp.t(), out=lg)
            lg @ wp
            lg.t() @ h0
        gm, _ = timed(gemms, args.reps, args.warmup)
        del wp, lg
        torch.cuda.empty_cache()
        print(f"\n{shp} bf16: three GEMMs (V->{Vp}) {gm:.3f} ms; fp64 loss {ref:.6f}")
        for prov in args.providers.split(","):
            h = h0.clone().requires_grad_(True)
            w = w0.clone().requires_grad_(True)
            try:
                if prov.startswith("fusedloss"):
                    import fusedloss
                    kw = {"byte_budget": 256 << 20} if prov == "fusedloss-lean" else {}

                    def step():
                        loss = fusedloss.linear_cross_entropy(h, w, t, **kw)
                        loss.backward()
                        return loss
                elif prov == "eager":
                    def step():
                        loss = F.cross_entropy(F.linear(h, w).float(), t)
                        loss.backward()
                        return loss
                elif prov == "compile":
                    fn = torch.compile(lambda a, b, c: F.cross_entropy(F.linear(a, b).float(), c), dynamic=False)

                    def step():
                        loss = fn(h, w, t)
                        loss.backward()
                        return loss
                elif prov == "liger":
                    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
                    m = LigerFusedLinearCrossEntropyLoss()

                    def step():
                        loss = m(w, h, t)
                        loss.backward()
                        return loss
                else:
                    print(f"  {prov}: unknown provider")
                    continue
                loss = step()  # compiles / warms up
                lossv = loss.item()
                h.grad = None
                w.grad = None
                gc.collect()
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                step()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated()
                grads = sum(x.grad.numel() * x.grad.element_size() for x in (h, w) if x.grad is not None)
                extra = (peak - base - grads) / 2**30

                def rep():
                    h.grad = None
                    w.grad = None
                    step()
                ms, mn = timed(rep, args.reps, args.warmup)
                err = abs(lossv - ref) / abs(ref)
                eh, ew = gerr(h.grad, gh64), gerr(w.grad, gw64)
                print(f"  {prov:15s} {ms:8.3f} ms (min {mn:.3f})  ratio {ms / gm:.3f}  extra {extra:.3f} GiB  "
                      f"loss rel err {err:.2e}  grad rel err vs fp64: hidden {eh:.2e} weight {ew:.2e}")
                results.append(dict(shape=shp, provider=prov, ms=ms, min_ms=mn, gemm3_ms=gm, ratio=ms / gm,
                                    extra_gib=extra, loss_rel_err=err, dhidden_rel_err=eh, dweight_rel_err=ew))
                summaries.append(f"LCE {shp} {prov} {ms:.3f} ms ratio {ms / gm:.3f} extra {extra:.3f} GiB "
                                 f"err loss {err:.1e} dh {eh:.1e} dw {ew:.1e}")
            except Exception as e:  # a peer that fails must not stop the run
                print(f"  {prov}: FAILED {type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc(limit=2)
            finally:
                del h, w
                gc.collect()
                torch.cuda.empty_cache()
        del gh64, gw64
        torch.cuda.empty_cache()
    for s in summaries:
        print(s)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(commit=os.environ.get("FL_COMMIT", "unknown"), gpu=torch.cuda.get_device_name(),
                           date=datetime.datetime.utcnow().isoformat(), results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
