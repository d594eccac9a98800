#!/usr/bin/env python3
"""bench_kept_scale.py — what an upstream gradient other than 1 costs the zoo's kept-gradient backward
(fl_scale_rows_cuda scaling the gradient formed in the forward, in place): a fused forward + backward
step with loss.backward() (factor 1: the scale kernel exits at once) against (loss * 0.5).backward()
(every element read and written once more; floor: 2 x the gradient's bytes at the copy bandwidth).

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_kept_scale.py

Cases: softmax focal 8x19x512x1024 fp32 (gamma 2) and Lovasz-softmax 4x19x512x512 fp32 probabilities:
kept gradients of few, long rows ([N, C d]), the shape that fl_scale_rows_cuda cut into (row, chunk)
items in session 20 (before: N CTAs). Prints the median ms of each step and their difference.
"""
import sys

import torch


def timed(fn, reps=20):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    if not torch.cuda.is_available():
        print("bench_kept_scale: SKIP (no CUDA)")
        return 0
    import fusedloss
    torch.manual_seed(0)
    cases = []
    x = torch.randn(8, 19, 512, 1024, device="cuda").requires_grad_()
    y = torch.randint(0, 19, (8, 512, 1024), device="cuda")
    cases.append(("softmax focal 8x19x512x1024 fp32", x, lambda: fusedloss.softmax_focal_loss(x, y, gamma=2.0)))
    p = torch.softmax(torch.randn(4, 19, 512, 512, device="cuda") * 2, 1).requires_grad_()
    yl = torch.randint(0, 19, (4, 512, 512), device="cuda")
    cases.append(("lovasz 4x19x512x512 fp32 probas", p, lambda: fusedloss.lovasz_softmax(p, yl)))
    a = torch.empty(64 << 20, device="cuda")
    b = torch.empty_like(a)
    t = timed(lambda: b.copy_(a))
    gbps = 2 * a.numel() * 4 / (t * 1e-3) / 1e9
    print(f"copy bandwidth {gbps:.0f} GB/s")
    for name, leaf, f in cases:
        def step1():
            leaf.grad = None
            f().backward()

        def step_half():
            leaf.grad = None
            (f() * 0.5).backward()
        t1, th = timed(step1), timed(step_half)
        floor = 2 * leaf.numel() * leaf.element_size() / (gbps * 1e9) * 1e3
        print(f"{name}: step {t1:.3f} ms (factor 1), {th:.3f} ms (factor 0.5): the scale {th - t1:.3f} ms, "
              f"floor {floor:.3f} ms")
        # the scale kernel's own GPU time (the steps above are synchronised, so the host's time is in their
        # difference: s21 run 2 measured the focal step host-bound); the table with --profile
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step_half()
            torch.cuda.synchronize()
        ks = [ev.device_time for ev in prof.events()
              if ev.device_type == torch.autograd.DeviceType.CUDA and "scale_rows_kernel" in ev.name]
        if ks:
            print(f"{name}: scale_rows_kernel {sum(ks) / len(ks) / 1e3:.3f} ms a call ({len(ks)} calls), floor {floor:.3f} ms")
        if "--profile" in sys.argv:   # the factor-0.5 step's kernels (where the difference goes)
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
