#!/usr/bin/env python3
"""profile_zoo_step.py — where the GPU time of one fused-loss training step goes (torch.profiler):
the kernels, their CUDA time per step, and the step's wall time between CUDA events, so that a
bench's per-step number can be split into the fused kernel and everything around it (host gaps,
extra kernels of the Python op and of autograd).

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/profile_zoo_step.py \
        [--case arcface|kl_t2] [--steps 10]
"""
import argparse
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fusedloss  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="arcface", choices=["arcface", "kl_t2"])
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(1)
    sets = []
    for _ in range(3):
        if args.case == "arcface":
            x = ((torch.rand(4096, 100000, device="cuda", generator=g) * 2 - 1) * (1 - 2 ** -20)).requires_grad_(True)
            t = torch.randint(0, 100000, (4096,), device="cuda", generator=g)
            sets.append((x, t))
        else:
            s = torch.randn(4096, 128256, device="cuda", generator=g).to(torch.bfloat16).requires_grad_(True)
            te = torch.randn(4096, 128256, device="cuda", generator=g).to(torch.bfloat16)
            sets.append((s, te))

    def step(i):
        x, t = sets[i % len(sets)]
        x.grad = None
        if args.case == "arcface":
            loss = fusedloss.margin_cross_entropy(x, t, s=64.0, m2=0.5)
        else:
            loss = fusedloss.distillation_loss(x, t, temperature=2.0, beta=0.0, t2_scale=True, reduction="batchmean")
        loss.backward()

    for i in range(5):
        step(i)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.steps)]
    for i, (a, b) in enumerate(ev):
        a.record()
        step(i)
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in ev)
    print(f"{args.case}: step between CUDA events, median {ms[len(ms) // 2]:.3f} ms (min {ms[0]:.3f})")
    # the same steps back to back (no event sync between them): GPU-bound if the host keeps up
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(args.steps):
        step(i)
    b.record()
    torch.cuda.synchronize()
    print(f"{args.case}: {args.steps} steps back to back: {a.elapsed_time(b) / args.steps:.3f} ms per step")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            step(i)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
