#!/usr/bin/env python3
"""bench_logit_offset.py — cross-entropy with a per-class logit offset (logit adjustment; header
section 5's logit_offset) and OHEM on the GPU: fusedloss vs what a PyTorch user writes, eager and
torch.compile, in the same run.

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_logit_offset.py [--out F.json]

Cases (reduction mean, logits randn * 2, targets uniform; offsets tau * log(prior) with a Zipf prior):
  offset_cls    65536x1000 float32 (an ImageNet-LT-sized classifier batch)
  offset_vocab  8192x32000 bfloat16
  ohem_seg      8x19x512x512 float32 (Cityscapes-like logits; thresh 0.7, min_kept 100000, ignore 255)
Providers:
  fusedloss  fusedloss.cross_entropy(x, t, logit_offset=o) / fusedloss.ohem_cross_entropy
  eager      F.cross_entropy(x + o, t) / HRNet's OhemCrossEntropy (softmax, gather, sort, mask, mean)
  compile    torch.compile of the eager function (inductor)
Per (case, provider): median ms of --reps forward + backward steps (CUDA events, input sets rotated,
together larger than L2) and the ratio to the floor (read the logits + write their gradient at the
copy bandwidth measured in the same run). Last lines: one SUMMARY per case. Needs CUDA.
"""
import argparse
import datetime
import math
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = {"offset_cls": ((65536, 1000), "float32"), "offset_vocab": ((8192, 32000), "bfloat16"),
         "ohem_seg": ((8, 19, 512, 512), "float32")}
PROVIDERS = ["fusedloss", "eager", "compile"]


def eager_ohem(x, t, thresh=0.7, min_kept=100000, ignore=255):
    """HRNet-Semantic-Segmentation's OhemCrossEntropy (what users copy)."""
    import torch
    import torch.nn.functional as F
    pixel = F.cross_entropy(x, t, ignore_index=ignore, reduction="none").reshape(-1)
    with torch.no_grad():
        pred = F.softmax(x, dim=1)
        tt = t.clone()
        tt[tt == ignore] = 0
        pred = pred.gather(1, tt.unsqueeze(1)).reshape(-1)
        mask = t.reshape(-1) != ignore
        sp, _ = pred[mask].sort()
        min_value = sp[min(min_kept, sp.numel() - 1)]
        threshold = torch.clamp(min_value, min=thresh)
        keep = mask & (pred < threshold)
    return (pixel * keep).sum() / keep.sum()


def make_provider(case, name, offset):
    import torch
    import torch.nn.functional as F
    import fusedloss
    if case == "ohem_seg":
        if name == "fusedloss":
            return lambda x, t: fusedloss.ohem_cross_entropy(x, t, 0.7, 100000, ignore_index=255)
        f = eager_ohem
    else:
        if name == "fusedloss":
            return lambda x, t: fusedloss.cross_entropy(x, t, logit_offset=offset)
        def f(x, t):  # x + o promotes a 16-bit x to fp32 (the offset is fp32), as a user's code does
            return F.cross_entropy(x + offset, t)
    if name == "eager":
        return f
    if name == "compile":
        return torch.compile(f)
    raise ValueError(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--providers", default=",".join(PROVIDERS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("SKIP: needs CUDA")
        return 0
    import fusedloss
    from torch_timing import copy_bw, rotating_step, timed, write_results
    bw = copy_bw()
    print(f"bench_logit_offset: torch {torch.__version__} | {torch.cuda.get_device_name()} | fusedloss "
          f"{fusedloss._lib.version_string()} | commit {os.environ.get('FL_COMMIT', 'unknown')} | "
          f"{datetime.datetime.utcnow().isoformat(timespec='seconds')}Z | copy {bw / 1e12:.2f} TB/s")
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows, summaries = [], []
    for case in args.cases.split(","):
        shape, dname = CASES[case]
        dt = getattr(torch, dname)
        C = shape[1]
        nbytes = math.prod(shape) * torch.empty((), dtype=dt).element_size()
        floor_ms = 2 * nbytes / bw * 1e3
        n_sets = max(2, min(8, math.ceil((256 << 20) / nbytes)))
        xs = [(2 * torch.randn(shape, device="cuda", generator=gen)).to(dt).requires_grad_(True) for _ in range(n_sets)]
        tshape = (shape[0],) + tuple(shape[2:])
        ts = [torch.randint(0, C, tshape, device="cuda", generator=gen) for _ in range(n_sets)]
        if case == "ohem_seg":
            for t in ts:
                t[torch.rand(t.shape, device="cuda", generator=gen) < 0.05] = 255
        prior = 1.0 / torch.arange(1, C + 1, device="cuda", dtype=torch.float32)
        offset = (prior / prior.sum()).log()   # tau = 1
        parts = []
        for name in args.providers.split(","):
            try:
                f = make_provider(case, name, offset)
                ms, mn = timed(rotating_step(f, xs, ts), args.reps, warmup=3)
                ratio = ms / floor_ms
                print(f"{case:>13} {name:>9}: {ms:8.3f} ms (min {mn:.3f})  {ratio:6.2f}x floor")
                rows.append({"case": case, "provider": name, "ms": ms, "min_ms": mn, "floor_ms": floor_ms,
                             "ratio": ratio, "shape": list(shape), "dtype": dname})
                parts.append(f"{name} {ms:.3f} ms {ratio:.2f}x")
            except Exception as e:  # report and go on
                print(f"{case:>13} {name:>9}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:160]}")
                parts.append(f"{name} failed")
        summaries.append(f"SUMMARY {case} {'x'.join(map(str, shape))} {dname} floor {floor_ms:.3f} ms: " + " | ".join(parts))
        del xs, ts
        torch.cuda.empty_cache()
    for s in summaries:
        print(s)
    if args.out:
        write_results(args.out, bw, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
