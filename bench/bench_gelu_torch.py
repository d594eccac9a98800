#!/usr/bin/env python3
"""bench_gelu_torch.py — GeLU (+ bias, + bias gradient) through PyTorch: fusedloss against eager
PyTorch and torch.compile in the same run, on one GPU, plus what it does to a whole MLP.

Kernel level, per (N, F, dtype, approx), inputs x (N, F), bias (F,), dy (N, F) (x, dy rotated
over enough copies that > 512 MiB is touched between two uses: HBM, not the 50 MB L2):
  providers   fusedloss   fusedloss.gelu(x, b, approx)               (eager path, autograd.Function)
              eager       F.gelu(x + b, approximate=approx)          (add kernel + gelu kernel;
                                                                      backward: gelu_backward + dy.sum(0))
              compile     torch.compile(that, fullgraph=True, dynamic=False)
              c           fl_gelu_forward_cuda / fl_gelu_backward_cuda via ctypes (no torch, no
                          Python layers): the kernels alone
  fwd_ms      forward under torch.no_grad()
  bwd_ms      backward alone: torch.autograd.grad(y, (x, b), dy, retain_graph=True) on a kept graph
              (dx and dbias); if a provider cannot retain its graph: (fwd+bwd step) - (grad-mode fwd)
  step_ms     x.grad = b.grad = None; f(x, b).backward(dy)
  floors      forward: read x + bias, write y; backward: read x, dy, bias, write dx, dbias; at the
              device-to-device copy bandwidth measured in this run (2 GiB, read + write)
  x_floor     time / floor (issue 6 targets for the kernels: forward <= 1.10, backward <= 1.15)
Times: CUDA events around each call, median of --reps (>= 50) after --warmup calls.

MLP level (the gain must not be oversold): Linear(768 -> 3072) -> GELU -> Linear(3072 -> 768),
N = 8192 tokens, bf16 parameters and activations, forward + backward (x requires grad):
  torch       nn.Linear(768, 3072) -> nn.GELU(approx) -> nn.Linear(3072, 768)
  fusedloss   nn.Linear(768, 3072, bias=False) -> fusedloss.nn.BiasGELU(3072, approx) -> nn.Linear
each eager and torch.compile(fullgraph=True); ms per step and peak extra memory (MiB); the eager
and compiled steps also captured whole in a CUDA graph and replayed (graph_step_ms: the GPU time
of a step without the host's per-op overhead, which at this size is most of a step).

Output: a table on stdout and JSON (--out). Without torch, a GPU or a CUDA build it prints SKIP
and exits 0. Offline: needs only this repository (make lib) and PyTorch.
Expected run time on an H200: ~1.5-2.5 min (mostly torch.compile compiling; --approx tanh only).

Usage: python3 bench/bench_gelu_torch.py [--out FILE.json] [--reps 50] [--warmup 10]
          [--shapes 8192x3072:bf16,8192x16384:bf16,8192x3072:f32,8192x16384:f32]
          [--approx tanh[,none]] [--no-compile] [--no-mlp] [--cpu-smoke]
--cpu-smoke runs the same code on the CPU (tiny shapes, wall-clock timing, the _cpu entry points,
compile with backend aot_eager): a check of this script, not a benchmark.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

DEFAULT_SHAPES = "8192x3072:bf16,8192x16384:bf16,8192x3072:f32,8192x16384:f32"
ROTATE_BYTES = 512 << 20
DEV = "cuda"  # "cpu" with --cpu-smoke


class _WallEvent:
    """torch.cuda.Event stand-in for --cpu-smoke (perf_counter; CPU calls are synchronous)."""

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--approx", default="tanh", help="comma list of tanh, none")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-mlp", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true")
    a = ap.parse_args(argv)
    a.reps = max(a.reps, 50)
    return a


def import_fusedloss():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(os.path.dirname(here), "python"))
    import fusedloss  # noqa: E402
    return fusedloss


def git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], stderr=subprocess.DEVNULL,
                                       cwd=os.path.dirname(os.path.abspath(__file__))).decode().strip()
    except Exception:
        return os.environ.get("FL_COMMIT", "unknown")


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def sync(torch):
    if DEV == "cuda":
        torch.cuda.synchronize()


def time_calls(torch, fn, reps, warmup, nsets):
    """median ms of fn(k) over reps calls, k cycling over the input sets; CUDA events per call."""
    for w in range(warmup):
        fn(w % nsets)
    sync(torch)
    Ev = torch.cuda.Event if DEV == "cuda" else _WallEvent
    ev = [(Ev(enable_timing=True), Ev(enable_timing=True)) for _ in range(reps)]
    for r in range(reps):
        ev[r][0].record()
        fn(r % nsets)
        ev[r][1].record()
    sync(torch)
    return median([a.elapsed_time(b) for a, b in ev])


def copy_gbps(torch):
    n = 2 << 30 if DEV == "cuda" else 64 << 20
    a = torch.empty(n, dtype=torch.uint8, device=DEV).fill_(7)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ms = time_calls(torch, lambda k: (b.copy_(a) if k % 2 == 0 else a.copy_(b)), 30, 2, 2)
    del a, b
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return 2.0 * n / (ms * 1e6)


def kernel_level(torch, F, fusedloss, N, Fdim, dtype, approx, reps, warmup, gbps, use_compile):
    es = torch.empty((), dtype=dtype).element_size()
    mat = N * Fdim * es
    nsets = max(2, min(8, -(-ROTATE_BYTES // (2 * mat)) + 1))
    gen = torch.Generator(device=DEV).manual_seed(1)
    xs = [(2 * torch.randn(N, Fdim, device=DEV, generator=gen)).to(dtype) for _ in range(nsets)]
    dys = [torch.randn(N, Fdim, device=DEV, generator=gen).to(dtype) for _ in range(nsets)]
    b0 = (0.5 * torch.randn(Fdim, device=DEV, generator=gen)).to(dtype)
    floor_fwd = (2 * mat + Fdim * es) / (gbps * 1e6)
    floor_bwd = (3 * mat + 2 * Fdim * es) / (gbps * 1e6)

    def eager_fn(x, b):
        return F.gelu(x + b, approximate=approx)

    provs = {"fusedloss": lambda x, b: fusedloss.gelu(x, b, approx), "eager": eager_fn}
    if use_compile:
        provs["compile"] = torch.compile(eager_fn, fullgraph=True, dynamic=False,
                                         **({} if DEV == "cuda" else {"backend": "aot_eager"}))
    rows = []
    for name, fn in provs.items():
        t0 = time.time()
        leaves = [(x.clone().requires_grad_(True), b0.clone().requires_grad_(True)) for x in xs]
        with torch.no_grad():
            fn(xs[0], b0)  # compile / warm
        first_s = time.time() - t0
        with torch.no_grad():
            fwd = time_calls(torch, lambda k: fn(xs[k], b0), reps, warmup, nsets)
        # backward alone on kept graphs (one per input set)
        ys = [fn(xl, bl) for xl, bl in leaves]
        bwd_note = "direct"
        try:
            bwd = time_calls(torch, lambda k: torch.autograd.grad(ys[k], leaves[k], dys[k], retain_graph=True),
                             reps, warmup, nsets)
        except Exception as e:  # a provider whose graph cannot be retained
            bwd, bwd_note = None, f"step - fwd ({str(e).splitlines()[0][:60]})"
        del ys

        def step(k):
            xl, bl = leaves[k]
            xl.grad = None
            bl.grad = None
            fn(xl, bl).backward(dys[k])

        stepms = time_calls(torch, step, reps, warmup, nsets)
        if bwd is None:
            fwd_g = time_calls(torch, lambda k: fn(*leaves[k]), reps, warmup, nsets)
            bwd = stepms - fwd_g
        rows.append(dict(provider=name, fwd_ms=fwd, bwd_ms=bwd, step_ms=stepms, fwd_x_floor=fwd / floor_fwd,
                         bwd_x_floor=bwd / floor_bwd, first_call_s=first_s, bwd_method=bwd_note))
        del leaves
    # C level: the kernels alone, one ctypes call each
    lib = fusedloss._lib.lib
    dt = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}[dtype]
    code = fusedloss._lib.GELU_APPROX[approx]
    outs = [torch.empty_like(x) for x in xs]
    db = torch.empty_like(b0)
    wsb = fusedloss._lib.gelu_workspace_size(N, Fdim, dt)
    ws = torch.zeros(wsb, dtype=torch.uint8, device=DEV)  # CUDA: counters zero before first use
    if DEV == "cuda":
        stream = torch.cuda.current_stream().cuda_stream
        fwd_c = lambda *a: lib.fl_gelu_forward_cuda(*a, stream)  # noqa: E731
        bwd_c = lambda *a: lib.fl_gelu_backward_cuda(*a, stream)  # noqa: E731
    else:
        fwd_c, bwd_c = lib.fl_gelu_forward_cpu, lib.fl_gelu_backward_cpu

    def cf(k):
        st = fwd_c(outs[k].data_ptr(), xs[k].data_ptr(), b0.data_ptr(), N, Fdim, Fdim, Fdim, dt, dt, code)
        assert st == 0, fusedloss._lib.last_error()

    def cb(k):
        st = bwd_c(outs[k].data_ptr(), db.data_ptr(), dys[k].data_ptr(), xs[k].data_ptr(), b0.data_ptr(), N, Fdim,
                   Fdim, Fdim, Fdim, dt, dt, code, ws.data_ptr(), wsb)
        assert st == 0, fusedloss._lib.last_error()

    cfw = time_calls(torch, cf, reps, warmup, nsets)
    cbw = time_calls(torch, cb, reps, warmup, nsets)
    rows.append(dict(provider="c", fwd_ms=cfw, bwd_ms=cbw, step_ms=float("nan"), fwd_x_floor=cfw / floor_fwd,
                     bwd_x_floor=cbw / floor_bwd, first_call_s=0.0, bwd_method="direct"))
    # correctness of this run's fusedloss against eager in fp32 math (sanity, not the test suite)
    with torch.no_grad():
        ref = F.gelu(xs[0].float() + b0.float(), approximate=approx)
        err = (fusedloss.gelu(xs[0], b0, approx).float() - ref).abs().max().item() / ref.abs().max().item()
    del xs, dys, outs, ws
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return dict(N=N, F=Fdim, dtype=str(dtype).replace("torch.", ""), approx=approx, floor_fwd_ms=floor_fwd,
                floor_bwd_ms=floor_bwd, rel_err_vs_fp32=err, rows=rows)


def mlp_level(torch, fusedloss, approx, reps, warmup, use_compile):
    nn = torch.nn
    N, H, I = (8192, 768, 3072) if DEV == "cuda" else (64, 32, 128)
    dtype = torch.bfloat16
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(H, I), nn.GELU(approximate=approx), nn.Linear(I, H)).to(DEV, dtype)
    l1 = nn.Linear(H, I).to(DEV, dtype)
    l1.load_state_dict(ref[0].state_dict())
    fused = nn.Sequential(l1, fusedloss.nn.BiasGELU.from_linear(l1, approx), nn.Linear(I, H).to(DEV, dtype))
    fused[2].load_state_dict(ref[2].state_dict())
    x = torch.randn(N, H, device=DEV, dtype=dtype, requires_grad=True)
    dy = torch.randn(N, H, device=DEV, dtype=dtype)
    models = {"torch eager": ref, "fusedloss eager": fused}
    if use_compile:
        kw = {} if DEV == "cuda" else {"backend": "aot_eager"}
        models["torch compile"] = torch.compile(ref, fullgraph=True, dynamic=False, **kw)
        models["fusedloss compile"] = torch.compile(fused, fullgraph=True, dynamic=False, **kw)
    out = []
    with torch.no_grad():
        diff = (ref(x) - fused(x)).float().abs().max().item()
    for name, m in models.items():
        params = list(m.parameters())

        def step(k):
            x.grad = None
            for p in params:
                p.grad = None
            m(x).backward(dy)

        t0 = time.time()
        step(0)
        sync(torch)
        first_s = time.time() - t0
        peak = float("nan")
        if DEV == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step(0)
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        ms = time_calls(torch, step, reps, warmup, 1)
        out.append(dict(model=name, step_ms=ms, peak_extra_mib=peak, first_call_s=first_s,
                        graph_step_ms=graph_step_ms(torch, step, reps, warmup)))
    return dict(N=N, H=H, I=I, dtype="bfloat16", approx=approx, max_abs_diff_fwd=diff, rows=out)


def graph_step_ms(torch, step, reps, warmup):
    """GPU time of one training step with the host out of the way: the step captured once in a
    CUDA graph (whole-step capture, as torch.cuda.graph documents), then replayed; NaN on the CPU
    or when capture fails (the reason is printed)."""
    if DEV != "cuda":
        return float("nan")
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step(0)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step(0)
        return time_calls(torch, lambda k: g.replay(), reps, warmup, 1)
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        print(f"  (CUDA-graph step failed: {str(e).splitlines()[0][:100]})")
        return float("nan")


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("SKIP: torch not installed")
        return 0
    global DEV
    fusedloss = import_fusedloss()
    if args.cpu_smoke:
        DEV = "cpu"
        if args.shapes == DEFAULT_SHAPES:
            args.shapes = "64x96:bf16,33x1001:f32"
        args.reps = 50
        args.warmup = 2
    elif not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    elif not fusedloss.cuda_built():
        print("SKIP: libfusedloss has no CUDA backend")
        return 0
    approxes = [a.strip() for a in args.approx.split(",") if a.strip()]
    shapes = []
    for s in args.shapes.split(","):
        nf, dt = s.split(":")
        n, f = nf.lower().split("x")
        shapes.append((int(n), int(f), {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]))
    t_start = time.time()
    gbps = copy_gbps(torch)
    info = dict(gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)", torch=torch.__version__,
                cuda=torch.version.cuda,
                fusedloss_lib=fusedloss._lib.library_path, fusedloss=fusedloss._lib.version_string(),
                commit=git_commit(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                python=platform.python_version(), copy_gbps=gbps, reps=args.reps, warmup=args.warmup)
    print(f"{info['gpu']} | torch {info['torch']} (CUDA {info['cuda']}) | fusedloss {info['fusedloss']} | "
          f"commit {info['commit']} | copy BW {gbps:.0f} GB/s")
    results = dict(info=info, kernel=[], mlp=[])
    print(f"\n{'case':<26} {'provider':<10} {'fwd ms':>8} {'x floor':>8} {'bwd ms':>8} {'x floor':>8} "
          f"{'step ms':>8} {'first s':>7}")
    for (N, Fd, dt) in shapes:
        for approx in approxes:
            r = kernel_level(torch, F, fusedloss, N, Fd, dt, approx, args.reps, args.warmup, gbps,
                             not args.no_compile)
            results["kernel"].append(r)
            case = f"{N}x{Fd} {r['dtype']} {approx}"
            for k, row in enumerate(r["rows"]):
                print(f"{case if k == 0 else '':<26} {row['provider']:<10} {row['fwd_ms']:8.4f} "
                      f"{row['fwd_x_floor']:8.3f} {row['bwd_ms']:8.4f} {row['bwd_x_floor']:8.3f} "
                      f"{row['step_ms']:8.4f} {row['first_call_s']:7.1f}"
                      + ("" if row["bwd_method"] == "direct" else f"  (bwd: {row['bwd_method']})"))
            print(f"{'':<26} floors: fwd {r['floor_fwd_ms']:.4f} ms, bwd {r['floor_bwd_ms']:.4f} ms; "
                  f"rel err vs fp32 math {r['rel_err_vs_fp32']:.2e}")
            sys.stdout.flush()
    if not args.no_mlp:
        for approx in approxes:
            m = mlp_level(torch, fusedloss, approx, args.reps, args.warmup, not args.no_compile)
            results["mlp"].append(m)
            print(f"\nMLP Linear({m['H']}->{m['I']}) -> GELU({approx}) -> Linear({m['I']}->{m['H']}), N={m['N']} bf16, fwd+bwd "
                  f"(max |diff| of the forward outputs {m['max_abs_diff_fwd']:.3g}):")
            base = {r["model"]: r["step_ms"] for r in m["rows"]}
            for row in m["rows"]:
                ref_name = "torch compile" if "compile" in row["model"] else "torch eager"
                print(f"  {row['model']:<18} {row['step_ms']:8.4f} ms  ({base[ref_name] / row['step_ms']:.3f}x "
                      f"vs {ref_name})  peak extra {row['peak_extra_mib']:7.1f} MiB  first {row['first_call_s']:.1f} s")
            gbase = {r["model"]: r["graph_step_ms"] for r in m["rows"]}
            for row in m["rows"]:
                if row["graph_step_ms"] == row["graph_step_ms"]:  # not NaN
                    ref_name = "torch compile" if "compile" in row["model"] else "torch eager"
                    print(f"  {row['model']:<18} {row['graph_step_ms']:8.4f} ms in a CUDA graph (GPU time, no host "
                          f"overhead; {gbase[ref_name] / row['graph_step_ms']:.3f}x vs {ref_name}'s graph)")
    results["info"]["wall_s"] = time.time() - t_start
    print(f"\nwall time {results['info']['wall_s']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
