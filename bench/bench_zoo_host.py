"""bench_zoo_host.py — host overhead of one eager forward + backward step of the zoo's elementwise
losses (fusedloss.sigmoid_focal_loss, fusedloss.binary_cross_entropy_with_logits): tensors of a
tiny size (64 elements by default; on the CPU, or --device cuda), so the kernels cost nothing and
what is timed is Python, dispatch, autograd and allocation. Each step is `x.grad = None;
f(x, y).backward()`; after warm-up, --blocks blocks of 50 steps are timed: the median and the min
(least disturbed by other load on the machine) of the per-step mean, in microseconds; PyTorch's
own formulas and x.sum().backward() (the autograd engine's floor) for scale.

    PYTHONPATH=python FUSEDLOSS_LIBRARY=build/libfusedloss.so python3 bench/bench_zoo_host.py
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fusedloss


def step_us(f, x, y, blocks, per_block=50, warm=200):
    """(median, min) over `blocks` blocks of per_block steps of the mean step time, us: the min is
    the estimate least disturbed by other load on the machine."""
    def step():
        x.grad = None
        f(x, y).backward()
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    for _ in range(warm):
        step()
    sync()
    clock = time.perf_counter_ns
    ts = []
    for _ in range(blocks):
        t0 = clock()
        for _ in range(per_block):
            step()
        sync()
        ts.append((clock() - t0) / per_block)
    return statistics.median(ts) / 1e3, min(ts) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="elements (a (n/8, 8) tensor)")
    ap.add_argument("--blocks", type=int, default=100, help="timed blocks of 50 steps")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--device", default="cpu", help="cuda: the same steps on the GPU (still host-bound at 64)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dt = getattr(torch, args.dtype)
    C = 8
    dev = torch.device(args.device)
    x = torch.randn(args.n // C, C).to(dev, dt).requires_grad_(True)
    y = torch.rand(args.n // C, C).to(dev, dt)
    w = torch.rand(C, device=dev) + 0.5
    pw = torch.rand(C, device=dev) + 0.5
    cases = [
        ("focal mean (fused)", lambda a, b: fusedloss.sigmoid_focal_loss(a, b, 0.25, 2.0, reduction="mean")),
        ("focal none (.sum())", lambda a, b: fusedloss.sigmoid_focal_loss(a, b, 0.25, 2.0, reduction="none").sum()),
        ("bce mean", lambda a, b: fusedloss.binary_cross_entropy_with_logits(a, b)),
        ("bce mean w+pw (C,)", lambda a, b: fusedloss.binary_cross_entropy_with_logits(a, b, w, pos_weight=pw)),
        ("bce none (.sum())", lambda a, b: fusedloss.binary_cross_entropy_with_logits(a, b, reduction="none").sum()),
        ("torch: F.bce mean", lambda a, b: F.binary_cross_entropy_with_logits(a, b)),
        ("torch: F.bce mean w+pw", lambda a, b: F.binary_cross_entropy_with_logits(a, b, w, pos_weight=pw)),
        ("torch: x.sum()", lambda a, b: a.sum()),
    ]
    print(f"bench_zoo_host: torch {torch.__version__}, {args.n} elements {args.dtype} on {dev}, "
          f"{args.blocks} blocks of 50 steps; us per fwd+bwd step")
    print(f"{'':>24} {'median':>8} {'min':>8}")
    for name, f in cases:
        med, lo = step_us(f, x, y, args.blocks)
        print(f"{name:>24} {med:8.1f} {lo:8.1f}")


if __name__ == "__main__":
    main()
