#!/usr/bin/env python3
"""profile_lovasz.py — where the time of one fused Lovasz-softmax call goes on the GPU: the CUDA
kernels of fusedloss.lovasz_softmax forward + backward (torch.profiler, CUPTI), summed per kernel
name over --reps calls, on the bench's input (4x19x512x512 fp32, 5% ignored, present classes).

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/profile_lovasz.py [--per-image] [--logits] [--pc]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4x19x512x512")
    ap.add_argument("--per-image", action="store_true")
    ap.add_argument("--logits", action="store_true")
    ap.add_argument("--pc", action="store_true", help="the P x C layout: [P, C] input, [P] labels (N = P, d = 1)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--host", action="store_true", help="with --gaps: the host's operations before the first runtime call")
    ap.add_argument("--gaps", action="store_true",
                    help="also print the last profiled step's kernels in order, each with the idle GPU time before it")
    args = ap.parse_args()
    import torch
    import fusedloss
    if not torch.cuda.is_available():
        print("SKIP: needs a CUDA device")
        return 0
    shape = tuple(int(v) for v in args.shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(1)
    z = torch.randn(shape, device="cuda", generator=g) * 2
    x = (z if args.logits else torch.softmax(z, 1)).requires_grad_(True)
    t = torch.randint(0, shape[1], (shape[0],) + shape[2:], device="cuda", generator=g)
    t[torch.rand(t.shape, device="cuda", generator=g) < 0.05] = 255
    if args.pc:
        x = x.detach().movedim(1, -1).reshape(-1, shape[1]).contiguous().requires_grad_(True)
        t = t.reshape(-1)

    def step():
        x.grad = None
        fusedloss.lovasz_softmax(x, t, ignore_index=255, per_image=args.per_image,
                                 from_logits=args.logits).backward()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.reps):
            step()
        torch.cuda.synchronize()
    tot = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = ev.name[:90]
            n, us = tot.get(k, (0, 0.0))
            tot[k] = (n + 1, us + ev.device_time)
    total = sum(us for _, us in tot.values())
    print(f"profile_lovasz {args.shape} per_image={args.per_image} logits={args.logits} pc={args.pc} "
          f"sort={os.environ.get('FUSEDLOSS_LOVASZ_SORT', 'default')} "
          f"jac={os.environ.get('FUSEDLOSS_LOVASZ_JAC', 'default')} "
          f"pc_route={os.environ.get('FUSEDLOSS_LOVASZ_PC', 'default')}: {total / args.reps / 1e3:.3f} ms of "
          "kernels per step")
    for k, (n, us) in sorted(tot.items(), key=lambda kv: -kv[1][1]):
        print(f"  {us / args.reps:9.1f} us  x{n / args.reps:5.1f}  {k}")
    if args.gaps:   # where the GPU idles inside a step: kernel boundaries (a few us each) or the host (one long gap)
        evs = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda ev: ev.time_range.start)
        per = len(evs) // args.reps
        last = evs[-per:]
        idle = 0.0
        for k, ev in enumerate(last):
            gap = ev.time_range.start - last[k - 1].time_range.end if k else 0.0
            idle += max(gap, 0.0)
            print(f"  gap {gap:7.1f} us  run {ev.time_range.end - ev.time_range.start:7.1f} us  {ev.name[:70]}")
        print(f"gaps: {per} GPU operations a step, {idle:.1f} us idle between the first and the last")
        # the host's latency inside one synchronised step: from the step's start (host) to its first runtime
        # call and to its first GPU operation, and where the GPU work ends (the profiler puts CPU and GPU
        # timestamps on one clock)
        from torch.profiler import record_function
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof2:
            for _ in range(3):
                with record_function("fl_step"):
                    step()
                torch.cuda.synchronize()
        evs = list(prof2.events())
        marks = sorted((ev for ev in evs if ev.name == "fl_step"), key=lambda ev: ev.time_range.start)
        for m in marks[1:]:
            t0, t1 = m.time_range.start, m.time_range.end
            api = sorted(ev.time_range.start for ev in evs if ev.device_type == torch.autograd.DeviceType.CPU
                         and ev.name.startswith("cuda") and "Synchronize" not in ev.name and t0 <= ev.time_range.start <= t1)
            gpu = [ev for ev in evs if ev.device_type == torch.autograd.DeviceType.CUDA and ev.time_range.start >= t0
                   and ev.time_range.start <= t1 + 5000]
            g0 = min((ev.time_range.start for ev in gpu), default=float("nan"))
            g1 = max((ev.time_range.end for ev in gpu), default=float("nan"))
            if args.host and api:   # the host's operations before the step's first runtime call
                pre = sorted((ev for ev in evs if ev.device_type == torch.autograd.DeviceType.CPU and ev.name != "fl_step"
                              and t0 <= ev.time_range.start < api[0]), key=lambda ev: ev.time_range.start)
                for ev in pre[:40]:
                    print(f"    +{ev.time_range.start - t0:7.1f} us  {ev.time_range.end - ev.time_range.start:7.1f} us  {ev.name[:60]}")
            print(f"host timeline: step issued in {t1 - t0:.1f} us (profiled); first runtime call at "
                  f"{(api[0] - t0) if api else float('nan'):.1f} us, {len(api)} calls; GPU from {g0 - t0:.1f} to "
                  f"{g1 - t0:.1f} us after the step's start")
    import time
    t0 = time.perf_counter()
    for _ in range(20):
        step()
    host = (time.perf_counter() - t0) / 20 * 1e3
    torch.cuda.synchronize()
    print(f"host: {host:.3f} ms a step to issue (no synchronisation; above the kernels' time = host-bound back to back)")
    # the step's time with the host in it (what bench_lovasz measures: events around one synchronised
    # step) and back to back (the host's launches overlapping the previous step's kernels)
    from torch_timing import timed   # bench/, this script's folder
    one, _ = timed(step, 20, 0)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(20):
        step()
    b.record()
    b.synchronize()
    print(f"step: {one:.3f} ms synchronised (median of 20), {a.elapsed_time(b) / 20:.3f} ms "
          f"back to back; kernels {total / args.reps / 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
