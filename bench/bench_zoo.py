"""bench_zoo.py — issue 8's elementwise losses on the GPU: fusedloss vs eager and torch.compile.

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_zoo.py [--out F.json]

Forward + backward (loss.backward() of the reduced loss), median of --reps with CUDA events after
warm-up, two input sets rotated (each larger than L2), random logits and targets (never zeros).
Floor = (read x + read y + write dx) bytes at the device-to-device copy bandwidth measured in the
same run (the loss itself is 4 bytes). Target (issue 8): fusedloss <= 1.5x the floor.
Each step is timed twice: eagerly (what a Python training loop pays, host overhead included: at
8192x1000 every provider is host-bound) and replayed from a CUDA graph captured per input set
(*_graph_ms: the GPU time of the same kernels with the host out of the way).
Shapes: sigmoid focal 8x19x512x1024 fp32 (the segmentation shape of loss-zoo.md) and bf16;
BCE with logits 8192x1000 fp32 with pos_weight and weight, and 8x19x512x1024 fp32 plain.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import fusedloss

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_timing import copy_bw, graph_ms, median_ms  # noqa: E402


def tv_focal(inputs, targets, alpha=0.25, gamma=2.0, reduction="mean"):
    """torchvision.ops.sigmoid_focal_loss's formula (torchvision may be absent)."""
    p = torch.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    if alpha >= 0:
        loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    bw = copy_bw()
    cases = []
    for shape, dt in (((8, 19, 512, 1024), torch.float32), ((8, 19, 512, 1024), torch.bfloat16)):
        cases.append(("sigmoid_focal", shape, dt, {}))
    cases.append(("bce_logits", (8192, 1000), torch.float32, {"pos_weight": True, "weight": True}))
    cases.append(("bce_logits", (8, 19, 512, 1024), torch.float32, {}))
    rows = []
    for kind, shape, dt, extra in cases:
        g = torch.Generator(device="cuda").manual_seed(1)
        xs = [(torch.randn(shape, device="cuda", generator=g) * 3).to(dt).requires_grad_(True) for _ in range(2)]
        ys = [(torch.rand(shape, device="cuda", generator=g) > 0.7).to(dt) for _ in range(2)]
        C = shape[-1]
        pw = (torch.rand(C, device="cuda", generator=g) + 0.5) if extra.get("pos_weight") else None
        w = (torch.rand(C, device="cuda", generator=g) + 0.5) if extra.get("weight") else None
        it = [0]
        if kind == "sigmoid_focal":
            fl = lambda x, y: fusedloss.sigmoid_focal_loss(x, y, 0.25, 2.0, reduction="mean")  # noqa: E731
            ref = lambda x, y: tv_focal(x, y, 0.25, 2.0, "mean")  # noqa: E731
        else:
            fl = lambda x, y: fusedloss.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=pw)  # noqa: E731
            ref = lambda x, y: F.binary_cross_entropy_with_logits(x, y, weight=w, pos_weight=pw)  # noqa: E731
        comp = torch.compile(ref)

        def runner(f):
            def go():
                i = it[0] & 1
                it[0] += 1
                xs[i].grad = None
                f(xs[i], ys[i]).backward()
            return go

        def setstep(f):
            def step(i):
                xs[i].grad = None
                f(xs[i], ys[i]).backward()
            return step

        m = {}
        for name, f in (("fusedloss", fl), ("eager", ref), ("compile", comp)):
            try:
                m[name] = median_ms(runner(f), args.reps)
            except Exception as e:  # noqa: BLE001
                m[name] = float("nan")
                print(f"{kind} {shape} {dt} {name}: {type(e).__name__}: {e}")
            m[name + "_graph"], why = graph_ms(setstep(f), 2, args.reps)
            if why:
                print(f"{kind} {shape} {dt} {name}: CUDA graph: {why}")
        n = xs[0].numel()
        es = xs[0].element_size()
        floor = 3 * n * es / bw * 1e3
        rows.append(dict(kind=kind, shape=list(shape), dtype=str(dt).replace("torch.", ""), extra=sorted(extra),
                         floor_ms=floor, **{f"{k}_ms": v for k, v in m.items()},
                         ratio=m["fusedloss"] / floor, graph_ratio=m["fusedloss_graph"] / floor,
                         met=m["fusedloss"] <= 1.5 * floor, graph_met=m["fusedloss_graph"] <= 1.5 * floor))
    print(f"bench_zoo: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, copy {bw / 1e12:.2f} TB/s")
    print(f"{'loss':>14} {'shape':>20} {'dtype':>9} {'floor':>7} {'fusedl':>7} {'eager':>7} {'compile':>7} "
          f"{'fl/floor':>8}  target 1.5x   | CUDA graph: {'fusedl':>7} {'eager':>7} {'compile':>7} {'fl/floor':>8}")
    for r in rows:
        print(f"{r['kind']:>14} {'x'.join(map(str, r['shape'])):>20} {r['dtype']:>9} {r['floor_ms']:7.3f} "
              f"{r['fusedloss_ms']:7.3f} {r['eager_ms']:7.3f} {r['compile_ms']:7.3f} {r['ratio']:8.2f}  "
              f"{'met   ' if r['met'] else 'MISSED'}       |             {r['fusedloss_graph_ms']:7.3f} "
              f"{r['eager_graph_ms']:7.3f} {r['compile_graph_ms']:7.3f} {r['graph_ratio']:8.2f} "
              f"{'met' if r['graph_met'] else 'MISSED'}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
