#!/usr/bin/env python3
"""bench_softmax_losses.py — margin softmax cross-entropy (ArcFace, include/fusedloss.h section 11)
and the softmax focal loss (section 12) on the GPU: fusedloss vs eager PyTorch and torch.compile of it.

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_softmax_losses.py [--out F.json]

Cases (float32 unless --dtype; --arc-shape / --nchw-shape / --rows-shape to change):
  arcface     ArcFace s = 64, m = 0.5 + cross-entropy (mean) on cosines 4096x100000 uniform in
              [-1, 1] (times 1 - 2^-20, so that no cosine is exactly +-1: the eager formula's
              sqrt(1 - x^2) has an infinite derivative there)
  focal_nchw  softmax focal, gamma = 2, mean over pixels not ignored (5% of the targets are 255 =
              ignore_index), logits 8x19x512x1024 (NCHW, Cityscapes-like), randn * 3
  focal_rows  the same on rows 8192x1000 (no target ignored)
Providers (a missing or failing one prints why; the run goes on):
  fusedloss  fusedloss.margin_cross_entropy / fusedloss.softmax_focal_loss (one fused call in the forward)
  eager      arcface: insightface's old ArcMarginProduct head on the whole matrix (sine = sqrt((1 -
             x^2).clamp(0, 1)), phi = x cos m - sine sin m, torch.where(x > cos(pi - m), phi, x - sin(pi - m) m),
             one_hot scatter, one_hot * phi + (1 - one_hot) * x, * s) then F.cross_entropy;
             focal: ce = F.cross_entropy(x, t, reduction="none", ignore_index), pt = exp(-ce),
             ((1 - pt)^gamma ce).sum() / (t != ignore_index).sum()
  compile    torch.compile of that eager function
Per (case, provider): median ms of --reps forward + backward steps (loss.backward() of the mean loss;
CUDA events; input sets rotated, together larger than L2), the ratio to the floor (read logits +
write dlogits bytes at the device-to-device copy bandwidth measured in the same run), the peak extra
memory (torch.cuda.max_memory_allocated() during one step minus what was allocated before it minus
the gradient the step leaves), and the max abs error of the loss and of the gradient vs a float64
reference (the header's definitions on the same rounded inputs) on the first --check-rows rows
(arcface, focal_rows) / image rows (focal_nchw: [:1, :, :check_rows, :]), each provider run on those
alone. Last lines: one "SUMMARY <case> ..." per case. Needs CUDA (prints SKIP otherwise).
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

CASES = ["arcface", "focal_nchw", "focal_rows"]
PROVIDERS = ["fusedloss", "eager", "compile"]
ARC = dict(s=64.0, m=0.5)
FOCAL = dict(gamma=2.0, ignore_index=255)


def arcface_eager(cosine, label, s=64.0, m=0.5):
    """insightface's (old) ArcMarginProduct on the cosines, then F.cross_entropy (mean)."""
    import torch
    import torch.nn.functional as F
    cos_m, sin_m = math.cos(m), math.sin(m)
    th, mm = math.cos(math.pi - m), math.sin(math.pi - m) * m
    sine = torch.sqrt((1.0 - torch.pow(cosine, 2)).clamp(0, 1))
    phi = cosine * cos_m - sine * sin_m
    phi = torch.where(cosine > th, phi, cosine - mm)
    one_hot = torch.zeros_like(cosine)
    one_hot.scatter_(1, label.view(-1, 1).long(), 1)
    output = (one_hot * phi) + ((1.0 - one_hot) * cosine)
    output = output * s
    return F.cross_entropy(output, label)


def focal_eager(logits, target, gamma=2.0, ignore_index=255):
    """The usual PyTorch softmax focal loss (via per-position cross-entropy), mean over kept positions."""
    import torch
    import torch.nn.functional as F
    ce = F.cross_entropy(logits, target, reduction="none", ignore_index=ignore_index)
    pt = torch.exp(-ce)
    return ((1 - pt) ** gamma * ce).sum() / (target != ignore_index).sum()


def reference(case, x, t):
    """float64 loss and gradient (header sections 11 / 12)."""
    import torch
    import torch.nn.functional as F
    xd = x.detach().double().requires_grad_(True)
    if case == "arcface":
        s, m = ARC["s"], ARC["m"]
        xy = xd.gather(1, t[:, None])
        a = torch.acos(xy.clamp(-1, 1)) + m
        phi = torch.where(a <= math.pi, torch.cos(a), xy - m * math.sin(m))
        z = (s * xd).scatter(1, t[:, None], s * phi)
        loss = F.cross_entropy(z, t)
    else:
        ii, gamma = FOCAL["ignore_index"], FOCAL["gamma"]
        keep = t != ii
        tc = torch.where(keep, t, torch.zeros_like(t))
        logp = F.log_softmax(xd, dim=1).gather(1, tc.unsqueeze(1)).squeeze(1)
        l = -(-torch.expm1(logp)) ** gamma * logp
        loss = torch.where(keep, l, torch.zeros((), dtype=l.dtype, device=l.device)).sum() / keep.sum()
    (g,) = torch.autograd.grad(loss, xd)
    return loss.detach(), g


def make_provider(name, case):
    """A function (x, target) -> scalar loss, or raise (reported, the run goes on)."""
    import torch
    import fusedloss
    if case == "arcface":
        fl = lambda x, t: fusedloss.margin_cross_entropy(x, t, s=ARC["s"], m2=ARC["m"])  # noqa: E731
        eager = lambda x, t: arcface_eager(x, t, **ARC)  # noqa: E731
    else:
        fl = lambda x, t: fusedloss.softmax_focal_loss(x, t, **FOCAL)  # noqa: E731
        eager = lambda x, t: focal_eager(x, t, **FOCAL)  # noqa: E731
    if name == "fusedloss":
        return fl
    if name == "eager":
        return eager
    if name == "compile":
        return torch.compile(eager)
    raise ValueError(name)


def make_inputs(case, shape, dt, n_sets, gen):
    import torch
    xs, ts = [], []
    for _ in range(n_sets):
        if case == "arcface":
            N, C = shape
            x = (torch.rand(N, C, device="cuda", generator=gen) * 2 - 1) * (1 - 2 ** -20)
            t = torch.randint(0, C, (N,), device="cuda", generator=gen)
        else:
            x = torch.randn(shape, device="cuda", generator=gen) * 3
            tshape = (shape[0],) + tuple(shape[2:])
            t = torch.randint(0, shape[1], tshape, device="cuda", generator=gen)
            if case == "focal_nchw":
                drop = torch.rand(tshape, device="cuda", generator=gen) < 0.05
                t = torch.where(drop, torch.full_like(t, FOCAL["ignore_index"]), t)
        xs.append(x.to(dt).requires_grad_(True))
        ts.append(t)
    return xs, ts


def check_slice(case, x, t, k):
    """The accuracy-check inputs: the first k rows (image rows for NCHW), contiguous copies."""
    if case == "focal_nchw":
        return x.detach()[:1, :, :k, :].contiguous(), t[:1, :k, :].contiguous()
    return x.detach()[:k].contiguous(), t[:k].contiguous()


def parse_shape(s):
    return tuple(int(v) for v in s.lower().split("x"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arc-shape", default="4096x100000", help="NxC of the ArcFace cosines")
    ap.add_argument("--nchw-shape", default="8x19x512x1024", help="NxCxHxW of the focal NCHW logits")
    ap.add_argument("--rows-shape", default="8192x1000", help="NxC of the focal row logits")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help=f"comma list of {', '.join(PROVIDERS)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check-rows", type=int, default=8, help="rows (image rows for NCHW) of the accuracy check")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--graph", default="fusedloss,compile",
                    help="comma list of providers also timed replayed from CUDA graphs (the GPU time of the step, "
                         "the host out of the way; '' for none)")
    ap.add_argument("--ab", default=os.environ.get("SOFTMAX_AB", ""),
                    help="';'-separated variants of the library's knobs ('K=V,K2=V2'), each timed for the "
                         "fusedloss provider after the case's table (e.g. FUSEDLOSS_TGT_STAGED=1)")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("SKIP: bench_softmax_losses.py needs a CUDA device")
        return 0
    import fusedloss
    from torch_timing import (add_graph_time, copy_bw, knob_variant, rotating_step, step_extra_bytes, summary_parts,
                              timed, write_results)

    dt = getattr(torch, args.dtype)
    es = torch.empty((), dtype=dt).element_size()
    bw = copy_bw()
    print(f"bench_softmax_losses: torch {torch.__version__} | {torch.cuda.get_device_name()} | fusedloss "
          f"{fusedloss._lib.version_string()} | commit {os.environ.get('FL_COMMIT', 'unknown')} | "
          f"{datetime.datetime.utcnow().isoformat(timespec='seconds')}Z | copy {bw / 1e12:.2f} TB/s")
    shapes = {"arcface": parse_shape(args.arc_shape), "focal_nchw": parse_shape(args.nchw_shape),
              "focal_rows": parse_shape(args.rows_shape)}
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows, summaries = [], []
    for case in args.cases.split(","):
        if case not in shapes:
            print(f"unknown case {case!r} (choose from {', '.join(CASES)})")
            continue
        shape = shapes[case]
        numel = math.prod(shape)
        nbytes = numel * es
        floor_ms = 2 * nbytes / bw * 1e3  # read logits + write dlogits
        shape_s = "x".join(str(v) for v in shape)
        xs = ts = None
        try:
            n_sets = max(2, min(8, math.ceil((256 << 20) / nbytes)))  # together well over L2
            xs, ts = make_inputs(case, shape, dt, n_sets, gen)
            xk, tk = check_slice(case, xs[0], ts[0], args.check_rows)
            ref_loss, ref_grad = reference(case, xk, tk)
        except Exception as e:  # noqa: BLE001  (report, continue with the next case)
            print(f"{case:>10}: SETUP FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            summaries.append(f"SUMMARY {case} {shape_s} {args.dtype}: setup failed ({type(e).__name__})")
            rows.append(dict(case=case, shape=list(shape), dtype=args.dtype, error=f"{type(e).__name__}: {e}"))
            xs = ts = None
            gc.collect()
            torch.cuda.empty_cache()
            continue
        res = {}
        for name in args.providers.split(","):
            r = dict(case=case, provider=name, shape=list(shape), dtype=args.dtype, floor_ms=floor_ms)
            try:
                f = make_provider(name, case)
                step = rotating_step(f, xs, ts)
                med, mn = timed(step, args.reps, args.warmup)
                # peak extra memory of one step: beyond the inputs and the gradient it leaves
                extra = step_extra_bytes(f, xs, ts)
                # accuracy on the check slice (the provider on it alone)
                sk = xk.clone().requires_grad_(True)
                lk = f(sk, tk)
                lk.backward()
                err_loss = abs(lk.double().item() - ref_loss.item())
                err_grad = (sk.grad.double() - ref_grad).abs().max().item()
                r.update(ms=med, min_ms=mn, ratio=med / floor_ms, extra_mib=extra / 2**20,
                         err_loss=err_loss, err_grad=err_grad, ref_loss=ref_loss.item(),
                         ref_grad_max=ref_grad.abs().max().item())
                print(f"{case:>10} {name:>10}: {med:8.3f} ms (min {mn:.3f}) {med / floor_ms:6.2f}x floor "
                      f"extra {extra / 2**20:9.1f} MiB  |dloss| {err_loss:.2e} |dgrad| {err_grad:.2e} "
                      f"(max |grad| {r['ref_grad_max']:.2e})")
                add_graph_time(r, name, args.graph, f, xs, ts, args.reps, floor_ms, 10)   # GPU time
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
        parts = summary_parts(res)
        summaries.append(f"SUMMARY {case} {shape_s} {args.dtype} floor {floor_ms:.3f} ms: " + " | ".join(parts))
        # A/B of the library's knobs (read by the C entry points on every call: os.environ reaches getenv)
        for variant in [v for v in args.ab.split(";") if v.strip()]:
            try:
                with knob_variant(variant):
                    step = rotating_step(make_provider("fusedloss", case), xs, ts)
                    med, mn = timed(step, args.reps, args.warmup)
                print(f"AB {variant:<40} {case:>10}: {med:8.3f} ms (min {mn:.3f}) {med / floor_ms:6.2f}x floor")
                rows.append(dict(case=case, provider="fusedloss", variant=variant, ms=med, min_ms=mn,
                                 ratio=med / floor_ms))
            except Exception as e:  # noqa: BLE001  (report, continue)
                print(f"AB {variant:<40} {case:>10}: FAILED {type(e).__name__}: {e}")
            finally:
                for x in xs:
                    x.grad = None
        xs = ts = None
        gc.collect()
        torch.cuda.empty_cache()
    for line in summaries:
        print(line)
    if args.out:
        write_results(args.out, bw, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
