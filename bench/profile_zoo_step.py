#!/usr/bin/env python3
"""profile_zoo_step.py — where the GPU time of one fused-loss training step goes (torch.profiler):
the kernels, their CUDA time per step, and the step's wall time between CUDA events, so that a
bench's per-step number can be split into the fused kernel and everything around it (host gaps,
extra kernels of the Python op and of autograd).

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/profile_zoo_step.py \
        [--case arcface|kl_t2|jsd|focal_nchw|bce] [--steps 20] [--dtype float32|bfloat16|float16]
        [--shape NxV --teacher-dtype D (kl_t2 / jsd)] [--alias-teacher]

Prints, for the case: the floor (read the prediction (+ teacher) and write its gradient at the
device-to-device copy bandwidth measured here, as the benches do); the median step time between
each step's own CUDA events with the steps queued (no host sync between them) and the mean over
the steps back to back: GPU time, the host ahead of the GPU as in a GPU-bound training loop (the
benches' timed() synchronises after every step, so their numbers also hold the host's dispatch
latency before the kernel starts: ArcFace 1.14-1.31 ms there vs 0.98 ms here, H200 2026-12-02 s5);
the profiler's kernel table and each kernel's CUDA time per step against the floor.
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
    ap.add_argument("--case", default="arcface", choices=["arcface", "kl_t2", "jsd", "focal_nchw", "bce"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sets", type=int, default=3, help="input sets rotated (the benches use 2 at these sizes)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="logits dtype of the focal_nchw case (default float32) and of the kl_t2 / jsd student (default bfloat16)")
    ap.add_argument("--shape", default="4096x128256", help="NxV of the kl_t2 / jsd student and teacher logits")
    ap.add_argument("--teacher-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="kl_t2 / jsd teacher dtype (default: the student's)")
    ap.add_argument("--alias-teacher", action="store_true",
                    help="kl_t2 / jsd: the teacher IS the student's storage (a detached view), so the teacher's copies hit L2 "
                         "and HBM moves 2/3 of the bytes (one read, one write) for the same arithmetic: on an H100 "
                         "(~3.0 TB/s) that floor is close to the real one on an H200 (~4.3 TB/s), so a kernel bound by its "
                         "arithmetic there shows it here. The gradient is then 0 and the loss 0 (values, not timing, change)")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(1)
    sets = []
    for _ in range(args.sets):
        if args.case == "arcface":
            x = ((torch.rand(4096, 100000, device="cuda", generator=g) * 2 - 1) * (1 - 2 ** -20)).requires_grad_(True)
            t = torch.randint(0, 100000, (4096,), device="cuda", generator=g)
            sets.append((x, t))
        elif args.case == "bce":   # bench_zoo's BCE with logits 8192x1000 fp32 (weight, pos_weight)
            x = (torch.randn(8192, 1000, device="cuda", generator=g) * 3).requires_grad_(True)
            t = torch.rand(8192, 1000, device="cuda", generator=g)
            sets.append((x, t))
        elif args.case == "focal_nchw":
            x = (torch.randn(8, 19, 512, 1024, device="cuda", generator=g) * 3).to(getattr(torch, args.dtype or "float32")).requires_grad_(True)
            t = torch.randint(0, 19, (8, 512, 1024), device="cuda", generator=g)
            t = torch.where(torch.rand(t.shape, device="cuda", generator=g) < 0.05, torch.full_like(t, 255), t)
            sets.append((x, t))
        else:
            n, v = (int(d) for d in args.shape.lower().split("x"))
            sd = getattr(torch, args.dtype or "bfloat16")
            td = getattr(torch, args.teacher_dtype) if args.teacher_dtype else sd
            s = torch.randn(n, v, device="cuda", generator=g).to(sd).requires_grad_(True)
            te = torch.randn(n, v, device="cuda", generator=g).to(td)
            if args.alias_teacher:
                if td != sd:
                    raise SystemExit("--alias-teacher needs the teacher in the student's dtype")
                te = s.detach()
            sets.append((s, te))

    bce_w = torch.rand(1000, device="cuda", generator=g) + 0.5
    bce_pw = torch.rand(1000, device="cuda", generator=g) + 0.5

    def step(i):
        x, t = sets[i % len(sets)]
        x.grad = None
        if args.case == "bce":
            loss = fusedloss.binary_cross_entropy_with_logits(x, t, weight=bce_w, pos_weight=bce_pw)
        elif args.case == "arcface":
            loss = fusedloss.margin_cross_entropy(x, t, s=64.0, m2=0.5)
        elif args.case == "focal_nchw":
            loss = fusedloss.softmax_focal_loss(x, t, gamma=2.0, ignore_index=255)
        elif args.case == "kl_t2":
            loss = fusedloss.distillation_loss(x, t, temperature=2.0, beta=0.0, t2_scale=True, reduction="batchmean")
        else:
            loss = fusedloss.distillation_loss(x, t, temperature=1.0, beta=0.5, reduction="batchmean")
        loss.backward()

    from torch_timing import copy_bw
    x0, other = sets[0]
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    # read the prediction and write its gradient (+ read the teacher for the distillation)
    moved = 2 * nbytes(x0) + (nbytes(other) if args.case in ("kl_t2", "jsd", "bce") and not args.alias_teacher else 0)
    floor_ms = moved / copy_bw() * 1e3
    print(f"{args.case}: floor {floor_ms:.3f} ms (read the inputs, write the gradient"
          f"{'; the teacher aliased: read once' if args.alias_teacher else ''})")
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
    print(f"{args.case}: step between its own CUDA events (steps queued, no sync between them), median "
          f"{ms[len(ms) // 2]:.3f} ms (min {ms[0]:.3f})")
    # the same steps back to back (no event sync between them): GPU-bound if the host keeps up
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(args.steps):
        step(i)
    b.record()
    torch.cuda.synchronize()
    bb = a.elapsed_time(b) / args.steps
    print(f"{args.case}: {args.steps} steps back to back: {bb:.3f} ms per step = {bb / floor_ms:.2f}x the floor")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            step(i)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
    for ev_ in prof.key_averages():
        if ev_.key.startswith("void ") or "_kernel" in ev_.key:
            t_us = getattr(ev_, "device_time_total", None)  # cuda_time_total in older torch
            t_ms = (ev_.cuda_time_total if t_us is None else t_us) / 1e3 / args.steps
            if t_ms > 0.0005:
                print(f"KERNEL {ev_.key[:70]:<70} {t_ms:.3f} ms per step = {t_ms / floor_ms:.2f}x the floor")


if __name__ == "__main__":
    main()
