"""torch_timing.py — the CUDA-event timing the Python benchmarks share (bench_lce_torch.py,
bench_vp.py, bench_zoo.py): warm-up, then the median (and min) of `reps` event-timed calls, and
the device-to-device copy bandwidth (bytes read + written per second) that floors are made of."""
import statistics

import torch


def timed(fn, reps, warmup=5):
    """(median ms, min ms) of fn() over reps calls after warmup calls, CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts), min(ts)


def median_ms(fn, reps, warm=5):
    return timed(fn, reps, warm)[0]


def copy_bw(device="cuda", nbytes=1 << 30):
    """Bytes (read + written) per second of a large device-to-device copy."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() / (median_ms(lambda: y.copy_(x), 20) * 1e-3)
