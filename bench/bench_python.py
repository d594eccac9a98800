#!/usr/bin/env python3
"""bench_python.py — the Python benchmark of issue 4: fusedloss.cross_entropy through autograd
against PyTorch, on one GPU, with the C-level fused kernel time as the reference.

Providers (each gets logits that are a leaf with requires_grad, int64 targets, reduction "mean"):
  fusedloss           fusedloss.cross_entropy(x, t); loss.backward()
  fusedloss-inplace   fusedloss.cross_entropy(x, t, inplace_backward=True); loss.backward()
                      (the gradient is written over x's storage; later reps run on gradient
                      values: same traffic, same arithmetic)
  eager               F.cross_entropy(x, t)
  eager-upcast        F.cross_entropy(x.float(), t)
  compile             torch.compile(F.cross_entropy, dynamic=False), compiled per shape (the first
                      call, which compiles, is timed separately as first_call_s)
  autograd-floor      x.sum(); loss.backward(): no loss at all, one reduction and its backward;
                      the host floor of "a forward op + loss.backward()" on this machine (what
                      the 0.025 ms host target must be read against); not checked for errors
C level (no torch autograd, no Python package layers; one ctypes call each, arguments prepared
once): c_fused = fl_cross_entropy_fused_cuda (loss + dlogits into a separate buffer, upstream
gradient 1), c_fused_inplace (dlogits == logits), c_forward (loss + lse), c_backward.

Measured per (shape, provider):
  fwd_ms        median over --reps (>= 50) of the training forward (grad on, graph dropped),
                CUDA events around each call, after --warmup calls
  fwdbwd_ms     the same for a whole step: x.grad = None; loss = f(x, t); loss.backward()
  *_wall_ms     host wall time per call of --reps back-to-back calls + one synchronize (for the
                small shapes, where the step is host-bound, this is the host cost)
  fwdbwd_graph_ms  logits <= 64 MB only: the whole step (x.grad = None; f(x, t).backward())
                captured once with torch.cuda.graph and replayed 200 times, ms per replay: the
                GPU time of the autograd step with no host in the loop
  x_c_fused     fwdbwd_ms / c_fused_ms ("floor" of the plot: what the kernel alone takes;
                c_fused_inplace_ms for fusedloss-inplace); issue 4's target for fusedloss:
                <= 1.15 (8192x128256 bf16)
  x_bw_floor    fwdbwd_ms / bw_floor_ms, bw_floor = (read logits + write gradient) / copy
                bandwidth measured in the same run (2 GiB device-to-device copy)
  peak_fwd_x, peak_x
                torch.cuda.max_memory_allocated() during the forward / the whole step, minus
                what was allocated before it (logits and targets), in units of the logits' size;
                the gradient counts (out of place >= 1). Targets: fusedloss-inplace 0, fusedloss
                <= 1 (eager: about 3)
  loss_err      |loss - ref| / |ref|, ref = F.cross_entropy(logits.float(), t)
  grad_err      max |grad - ref_grad| / max |ref_grad| (fp32 torch reference; --no-grad-check
                skips it)
Targets checked at the end (lines starting with TARGET): 128x1000 fp32 fusedloss fwd+bwd
<= 0.025 ms; 8192x128256 bf16 fusedloss fwd+bwd <= 1.15x c_fused; peak memory as above.

Output: a table on stdout, JSON (--out), and a PNG (--png; needs matplotlib, else skipped with a
note): per shape, bars per provider of fwd+bwd / c_fused and forward / c_forward (log scale,
line at 1.15), and peak extra memory.
Without torch or a CUDA device it prints SKIP and exits 0 (CI imports and runs it that way).
--cpu-smoke runs the same code on the CPU (small shapes, perf_counter timing, no memory
statistics, the C level through the _cpu entry points): a check of this script, not a benchmark.

Usage: python3 bench/bench_python.py [--out FILE.json] [--png FILE.png] [--reps 50]
          [--warmup 10] [--shapes 8192x128256:bf16,128x1000:f32,...]
          [--providers fusedloss,fusedloss-inplace,eager,eager-upcast,compile]
          [--budget SECONDS] [--no-grad-check] [--cpu-smoke]
The package is this repository's python/fusedloss (library: FUSEDLOSS_LIBRARY or
<repo>/build/libfusedloss.so, so run `make lib` first), else an installed fusedloss; the JSON
records which (package, library).
"""
import argparse
import ctypes
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SHAPES = ("8192x128256:bf16,4096x50257:f32,2048x32000:f16,16384x32000:bf16,"
                  "4096x256000:bf16,128x1000:f32")
SMOKE_SHAPES = "64x1000:f32,16x3000:bf16,8x128:f16"
ALL_PROVIDERS = ["fusedloss", "fusedloss-inplace", "eager", "eager-upcast", "compile",
                 "autograd-floor"]
DTYPE_NAMES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
               "bf16": "bfloat16"}
# C-level references per provider: (for fwd+bwd, for the forward)
C_REF = {"fusedloss-inplace": ("c_fused_inplace_ms", "c_fused_inplace_ms")}
C_REF_DEFAULT = ("c_fused_ms", "c_forward_ms")
HOST_TARGET_SHAPE, HOST_TARGET_MS = "128x1000 f32", 0.025
FUSED_TARGET_SHAPE, FUSED_TARGET_RATIO = "8192x128256 bf16", 1.15


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write JSON results here")
    ap.add_argument("--png", default=None, help="write the plot here (needs matplotlib)")
    ap.add_argument("--reps", type=int, default=50, help="timed calls per measurement (min 50)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="NxV:dtype,... (dtype f32|f16|bf16)")
    ap.add_argument("--providers", default=",".join(ALL_PROVIDERS))
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds; skip what would start after it (0: no limit)")
    ap.add_argument("--no-grad-check", action="store_true",
                    help="skip the fp32 reference gradient (saves time and memory)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="run everything on the CPU with small shapes (checks this script)")
    a = ap.parse_args(argv)
    a.reps = max(a.reps, 50)
    a.device = "cpu" if a.cpu_smoke else "cuda"
    if a.cpu_smoke and a.shapes == DEFAULT_SHAPES:
        a.shapes = SMOKE_SHAPES
    a.warmup = max(a.warmup, 1)
    return a


def parse_shapes(spec):
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        nv, dt = item.split(":")
        n, v = nv.lower().split("x")
        if dt not in DTYPE_NAMES:
            raise SystemExit("unknown dtype %r in --shapes (f32, f16, bf16)" % dt)
        out.append((int(n), int(v), dt))
    return out


def git_commit():
    if os.environ.get("FL_COMMIT"):
        return os.environ["FL_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        return out or "unknown"
    except Exception:
        return "unknown"


def import_fusedloss():
    """This repository's python/fusedloss (with <repo>/build/libfusedloss.so or
    FUSEDLOSS_LIBRARY) when it loads, else an installed fusedloss package."""
    tree = os.path.join(REPO, "python")
    if os.path.isdir(os.path.join(tree, "fusedloss")):
        sys.path.insert(0, tree)
        try:
            import fusedloss
            return fusedloss
        except ImportError as e:
            print("in-tree fusedloss not loadable (%s); trying an installed one" % e)
            sys.path.remove(tree)
            for m in [m for m in sys.modules if m == "fusedloss" or m.startswith("fusedloss.")]:
                del sys.modules[m]
    import fusedloss
    return fusedloss


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
class Device:
    """What differs between the CUDA run and --cpu-smoke: synchronisation, timing, memory."""

    def __init__(self, torch, kind):
        self.torch, self.kind, self.cuda = torch, kind, kind == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def empty_cache(self):
        if self.cuda:
            self.torch.cuda.empty_cache()

    def start_peak(self):
        """-> bytes allocated now (after resetting the peak), or None on the CPU"""
        if not self.cuda:
            return None
        self.sync()
        self.torch.cuda.reset_peak_memory_stats()
        return self.torch.cuda.memory_allocated()

    def peak_since(self, base):
        if base is None:
            return None
        self.sync()
        return self.torch.cuda.max_memory_allocated() - base

    def time_calls(self, fn, reps, warmup):
        """(median ms, min ms, wall ms per call): CUDA events around each call after warm-up
        (perf_counter on the CPU), then reps back-to-back calls timed on the host with one
        synchronize at the end."""
        torch = self.torch
        for _ in range(warmup):
            fn()
        self.sync()
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
            for e0, e1 in ev:
                e0.record()
                fn()
                e1.record()
            torch.cuda.synchronize()
            ms = [e0.elapsed_time(e1) for e0, e1 in ev]
        else:
            ms = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        self.sync()
        wall = (time.perf_counter() - t0) * 1e3 / reps
        return statistics.median(ms), min(ms), wall


def measure_copy_gbps(dev, reps=30):
    torch = dev.torch
    nbytes = (2 << 30) if dev.cuda else (64 << 20)
    a = torch.empty(nbytes, dtype=torch.uint8, device=dev.kind)
    a.fill_(0x3C)
    b = torch.empty_like(a)
    med, _, _ = dev.time_calls(lambda: b.copy_(a), reps, 3)
    a = b = None  # noqa: F841 (free before empty_cache)
    dev.empty_cache()
    return 2.0 * nbytes / (med * 1e6)


# ---------------------------------------------------------------------------------------------
# providers: f(x, t) -> loss
# ---------------------------------------------------------------------------------------------
def make_provider(name, torch, F, fusedloss):
    if name == "fusedloss":
        if fusedloss is None:
            raise RuntimeError("fusedloss not importable")
        return lambda x, t: fusedloss.cross_entropy(x, t)
    if name == "fusedloss-inplace":
        if fusedloss is None:
            raise RuntimeError("fusedloss not importable")
        return lambda x, t: fusedloss.cross_entropy(x, t, inplace_backward=True)
    if name == "eager":
        return lambda x, t: F.cross_entropy(x, t)
    if name == "eager-upcast":
        return lambda x, t: F.cross_entropy(x.float(), t)
    if name == "autograd-floor":
        return lambda x, t: x.sum()
    if name == "compile":  # a fresh compiled function per shape (static shapes)
        return torch.compile(lambda x, t: F.cross_entropy(x, t), dynamic=False)
    raise RuntimeError("unknown provider %r" % name)


def run_provider(dev, fn, logits, t, ref_loss, ref_grad, reps, warmup, check=True):
    r = {}
    logit_bytes = logits.numel() * logits.element_size()

    # first call (torch.compile compiles here) and correctness
    x0 = logits.clone().requires_grad_()
    dev.sync()
    t0 = time.perf_counter()
    loss = fn(x0, t)
    loss.backward()
    dev.sync()
    r["first_call_s"] = time.perf_counter() - t0
    lv = float(loss.detach().float())
    r["loss"] = lv
    r["loss_err"] = abs(lv - ref_loss) / max(abs(ref_loss), 1e-30) if check else None
    if ref_grad is not None and check:
        g = x0.grad.float()
        r["grad_err"] = float((g - ref_grad).abs().max() / ref_grad.abs().max())
        del g
    del loss, x0
    gc.collect()

    # peak extra memory of one step (logits and targets are allocated before)
    x = logits.clone().requires_grad_()
    base = dev.start_peak()
    loss = fn(x, t)
    peak = dev.peak_since(base)
    r["peak_fwd_x"] = peak / logit_bytes if peak is not None else None
    loss.backward()
    peak = dev.peak_since(base)
    r["peak_x"] = peak / logit_bytes if peak is not None else None
    del loss
    x.grad = None
    gc.collect()

    # timing: the training forward alone, then whole steps
    def fwd():
        fn(x, t)

    def step():
        x.grad = None
        fn(x, t).backward()

    r["fwd_ms"], r["fwd_ms_min"], r["fwd_wall_ms"] = dev.time_calls(fwd, reps, warmup)
    r["fwdbwd_ms"], r["fwdbwd_ms_min"], r["fwdbwd_wall_ms"] = dev.time_calls(step, reps, warmup)
    x.grad = None
    # small shapes: the same step captured in a CUDA graph and replayed (GPU time of the autograd
    # step without the host: what the step costs inside a graph-captured training loop)
    r["fwdbwd_graph_ms"] = None
    if dev.cuda and logit_bytes <= (64 << 20):
        try:
            r["fwdbwd_graph_ms"] = graph_step_ms(dev.torch, fn, x, t)
        except Exception as e:  # noqa: BLE001 (recorded, not fatal: e.g. a provider that cannot be captured)
            r["graph_error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
        x.grad = None
    return r


def graph_step_ms(torch, fn, x, t, replays=200):
    """ms per replay of `x.grad = None; fn(x, t).backward()` captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as torch.cuda.graph requires
        for _ in range(3):
            x.grad = None
            fn(x, t).backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    x.grad = None
    with torch.cuda.graph(g):
        fn(x, t).backward()
    for _ in range(5):
        g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(replays):
        g.replay()
    e1.record()
    torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / replays
    del g
    return ms


def c_level(dev, fusedloss, logits, t, reps, warmup):
    """Times of the bare C entry points (ctypes, arguments prepared once); the _cpu entry points
    under --cpu-smoke."""
    torch = dev.torch
    L = fusedloss._lib
    lib = L.lib
    N, V = logits.shape
    dt = {torch.float32: L.FL_DTYPE_F32, torch.float16: L.FL_DTYPE_F16,
          torch.bfloat16: L.FL_DTYPE_BF16}[logits.dtype]
    opts = L.ce_options(reduction=L.FL_REDUCTION_MEAN)
    popts = ctypes.byref(opts)
    nbytes = L.workspace_size(N, V, dt, opts)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev.kind)
    loss = torch.empty(1, dtype=torch.float32, device=dev.kind)
    lse = torch.empty(N, dtype=torch.float32, device=dev.kind)
    dl = torch.empty_like(logits)
    xi = logits.clone()
    if dev.cuda:
        sfx, tail = "_cuda", (torch.cuda.current_stream().cuda_stream,)
    else:
        sfx, tail = "_cpu", ()
    c_fused = getattr(lib, "fl_cross_entropy_fused" + sfx)
    c_forward = getattr(lib, "fl_cross_entropy_forward" + sfx)
    c_backward = getattr(lib, "fl_cross_entropy_backward" + sfx)
    I64 = L.FL_INDEX_I64
    p_loss, p_lse, p_dl, p_x, p_t, p_xi, p_ws = (loss.data_ptr(), lse.data_ptr(), dl.data_ptr(),
                                                 logits.data_ptr(), t.data_ptr(), xi.data_ptr(),
                                                 ws.data_ptr())

    def chk(st, name):
        if st != 0:
            raise RuntimeError("%s: %s: %s" % (name, L.status_string(st), L.last_error()))

    def fused():
        chk(c_fused(p_loss, None, p_dl, p_x, p_t, None, 1.0, N, V, V, dt, I64, popts, p_ws,
                    nbytes, *tail), "fused")

    def fused_inplace():
        chk(c_fused(p_loss, None, p_xi, p_xi, p_t, None, 1.0, N, V, V, dt, I64, popts, p_ws,
                    nbytes, *tail), "fused inplace")

    def forward():
        chk(c_forward(p_loss, p_lse, p_x, p_t, N, V, V, dt, I64, popts, p_ws, nbytes, *tail),
            "forward")

    def backward():
        chk(c_backward(p_dl, p_x, p_t, p_lse, None, 1.0, N, V, V, dt, I64, popts, p_ws, nbytes,
                       *tail), "backward")

    forward()  # the lse that backward reads

    r = {}
    for name, f in [("c_fused", fused), ("c_fused_inplace", fused_inplace),
                    ("c_forward", forward), ("c_backward", backward)]:
        r[name + "_ms"], r[name + "_ms_min"], r[name + "_wall_ms"] = dev.time_calls(
            f, reps, warmup)
    del ws, loss, lse, dl, xi
    return r


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def fmt(v, spec):
    return (spec % v) if isinstance(v, (int, float)) else "-"


def plot(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        print("PNG skipped: matplotlib not importable (%s)" % e)
        return False
    shapes = [s for s in result["shapes"] if s.get("c") and s.get("providers")]
    if not shapes:
        print("PNG skipped: no complete shape to plot")
        return False
    provs = [p for p in ALL_PROVIDERS
             if any("fwdbwd_ms" in s["providers"].get(p, {}) for s in shapes)]
    fig, axes = plt.subplots(3, 1, figsize=(max(8, 1.6 * len(shapes) * max(len(provs), 1) / 2), 12))
    width = 0.8 / max(len(provs), 1)
    xs = range(len(shapes))
    panels = [("fwdbwd_ms", 0, "forward+backward / C-level fused kernel "
                                "(fusedloss-inplace: / C-level fused in place)", True),
              ("fwd_ms", 1, "forward / C-level forward kernel "
                            "(fusedloss-inplace: / C-level fused in place)", True),
              ("peak_x", None, "peak extra memory (x logits), forward+backward", False)]
    for ax, (key, which, title, ratio) in zip(axes, panels):
        for k, p in enumerate(provs):
            vals = []
            for s in shapes:
                r = s["providers"].get(p, {})
                v = r.get(key)
                if ratio and v is not None:
                    ref = C_REF.get(p, C_REF_DEFAULT)[which]
                    v = v / s["c"][ref] if s["c"].get(ref) else None
                vals.append(v if v is not None else 0.0)
            ax.bar([i + (k - (len(provs) - 1) / 2) * width for i in xs], vals, width, label=p)
        if ratio:
            ax.set_yscale("log")
            ax.axhline(1.0, color="k", lw=0.8)
            if key == "fwdbwd_ms":
                ax.axhline(FUSED_TARGET_RATIO, color="r", ls="--", lw=0.8,
                           label="target %.2fx" % FUSED_TARGET_RATIO)
        else:
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([s["shape"] for s in shapes], rotation=15)
        ax.set_title(title)
        ax.legend(fontsize=8, ncol=3)
    fig.suptitle("fusedloss vs PyTorch, %s, torch %s" % (result.get("gpu"), result.get("torch")))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("PNG written: %s" % path)
    return True


def summarize(result):
    lines = []
    by = {s["shape"]: s for s in result["shapes"]}
    s = by.get(HOST_TARGET_SHAPE)
    r = s and s["providers"].get("fusedloss", {})
    if r and "fwdbwd_ms" in r:
        eager = s["providers"].get("eager", {}).get("fwdbwd_ms")
        floor = s["providers"].get("autograd-floor", {}).get("fwdbwd_ms")
        lines.append("TARGET host   %s fusedloss fwd+bwd %.4f ms (wall %.4f ms) <= %.3f ms: %s"
                     " (eager %s ms; autograd floor x.sum().backward() %s ms)" % (
                         HOST_TARGET_SHAPE, r["fwdbwd_ms"], r["fwdbwd_wall_ms"], HOST_TARGET_MS,
                         "PASS" if r["fwdbwd_ms"] <= HOST_TARGET_MS else "FAIL",
                         fmt(eager, "%.4f"), fmt(floor, "%.4f")))
        gl = ["%s %s" % (p, fmt(q.get("fwdbwd_graph_ms"), "%.4f")) for p, q in s["providers"].items()
              if q.get("fwdbwd_graph_ms") is not None or q.get("graph_error")]
        if gl:
            lines.append("graph        %s fwd+bwd step replayed in a CUDA graph, ms: %s" % (
                HOST_TARGET_SHAPE, ", ".join(gl)))
    for sh in result["shapes"]:
        c = sh.get("c") or {}
        for p in ("fusedloss", "fusedloss-inplace"):
            r = sh["providers"].get(p, {})
            ref = c.get("c_fused_inplace_ms" if p.endswith("inplace") else "c_fused_ms")
            if "fwdbwd_ms" in r and ref:
                ratio = r["fwdbwd_ms"] / ref
                tag = "TARGET fused " if sh["shape"] == FUSED_TARGET_SHAPE else "ratio        "
                lines.append("%s %-18s %-18s fwd+bwd %.4f ms = %.3fx C-level fused (%.4f ms)%s" % (
                    tag, sh["shape"], p, r["fwdbwd_ms"], ratio, ref,
                    (": PASS" if ratio <= FUSED_TARGET_RATIO else ": FAIL")
                    if sh["shape"] == FUSED_TARGET_SHAPE else ""))
        for p, limit in (("fusedloss-inplace", 0.02), ("fusedloss", 1.02)):
            r = sh["providers"].get(p, {})
            if r.get("peak_x") is not None:
                lines.append("TARGET memory %-18s %-18s peak %.3fx logits (target %s): %s" % (
                    sh["shape"], p, r["peak_x"], "0" if limit < 1 else "<= 1",
                    "PASS" if r["peak_x"] <= limit else "FAIL"))
    return lines


def main(argv=None):
    a = parse_args(argv)
    start = time.time()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "commit": git_commit(), "command": " ".join(sys.argv), "reps": a.reps,
              "warmup": a.warmup, "shapes": [], "unavailable": {}}

    def dump():
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)

    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:
        print("SKIP: PyTorch not importable: %s" % e)
        result["skipped"] = "torch: %s" % e
        dump()
        return 0
    if not a.cpu_smoke and not torch.cuda.is_available():
        print("SKIP: no CUDA device visible to PyTorch")
        result["skipped"] = "no CUDA device"
        dump()
        return 0
    dev = Device(torch, a.device)
    result["device"] = a.device

    fusedloss = None
    try:
        fusedloss = import_fusedloss()
        result["fusedloss"] = fusedloss._lib.version_string()
        result["package"] = os.path.dirname(fusedloss.__file__)
        result["library"] = fusedloss._lib.library_path
        if dev.cuda and not fusedloss.cuda_built():
            raise RuntimeError("%s has no CUDA backend (built without nvcc)"
                               % fusedloss._lib.library_path)
    except Exception as e:
        result["unavailable"]["fusedloss"] = "%s: %s" % (type(e).__name__, e)
        print("fusedloss unavailable: %s" % result["unavailable"]["fusedloss"])
        fusedloss = None
    result["gpu"] = torch.cuda.get_device_name(0) if dev.cuda else "CPU smoke run (not a benchmark)"
    result["torch"] = torch.__version__

    wanted = [p.strip() for p in a.providers.split(",") if p.strip()]
    copy_gbps = measure_copy_gbps(dev)
    result["copy_gbps"] = copy_gbps
    print("%s | torch %s | fusedloss %s | copy BW %.0f GB/s | reps %d (median of %s), "
          "warm-up %d" % (result["gpu"], result["torch"], result.get("fusedloss"), copy_gbps,
                          a.reps, "CUDA events" if dev.cuda else "perf_counter", a.warmup),
          flush=True)
    print("x_c: fwd+bwd / C-level fused time; x_bw: fwd+bwd / ((read + write logits) / copy BW); "
          "peak: extra memory in logits' sizes (forward / whole step)")
    hdr = "%-18s %-18s %9s %9s %9s %9s %7s %7s %6s %6s %8s %8s %7s" % (
        "shape", "provider", "fwd ms", "f+b ms", "f+b wall", "fwd wall", "x_c", "x_bw",
        "pk fwd", "peak", "loss err", "grad err", "first s")
    print(hdr, flush=True)
    dump()
    for N, V, dtn in parse_shapes(a.shapes):
        shape = "%dx%d %s" % (N, V, dtn)
        entry = {"shape": shape, "N": N, "V": V, "dtype": dtn, "providers": {}, "c": {}}
        result["shapes"].append(entry)
        if a.budget and time.time() - start > a.budget:
            entry["skipped"] = "time budget"
            print("%-18s skipped: time budget (%.0f s) spent" % (shape, a.budget), flush=True)
            dump()
            continue
        dtype = getattr(torch, DTYPE_NAMES[dtn])
        try:
            torch.manual_seed(0)
            logits = (torch.randn(N, V, device=dev.kind, dtype=torch.float32) * 2.0).to(dtype)
            t = torch.randint(0, V, (N,), device=dev.kind, dtype=torch.int64)
            xr = logits.detach().to(torch.float32, copy=True).requires_grad_(not a.no_grad_check)
            lr = F.cross_entropy(xr, t)
            ref_loss = float(lr.detach())
            ref_grad = None
            if not a.no_grad_check:
                lr.backward()
                ref_grad = xr.grad
            del xr, lr
            gc.collect()
        except Exception as e:
            entry["error"] = "setup: %s: %s" % (type(e).__name__, e)
            print("%-18s setup failed: %s" % (shape, entry["error"]), flush=True)
            dev.empty_cache()
            dump()
            continue
        logit_bytes = logits.numel() * logits.element_size()
        entry["logit_bytes"] = logit_bytes
        entry["bw_floor_ms"] = bw_floor = 2.0 * logit_bytes / (copy_gbps * 1e6)
        c = entry["c"]
        if fusedloss is not None:
            try:
                c.update(c_level(dev, fusedloss, logits, t, a.reps, a.warmup))
            except Exception as e:
                entry["c_error"] = "%s: %s" % (type(e).__name__, e)
                print("%-18s C level failed: %s" % (shape, entry["c_error"]), flush=True)
            gc.collect()
            dev.empty_cache()
        for p in wanted:
            if a.budget and time.time() - start > a.budget:
                entry["providers"][p] = {"skipped": "time budget"}
                print("%-18s %-18s skipped: time budget" % (shape, p), flush=True)
                continue
            try:
                fn = make_provider(p, torch, F, fusedloss)
                r = run_provider(dev, fn, logits, t, ref_loss, ref_grad, a.reps, a.warmup,
                                 check=p != "autograd-floor")
                cref = c.get(C_REF.get(p, C_REF_DEFAULT)[0])
                if cref:
                    r["x_c_fused"] = r["fwdbwd_ms"] / cref
                r["x_bw_floor"] = r["fwdbwd_ms"] / bw_floor
                print("%-18s %-18s %9.4f %9.4f %9.4f %9.4f %7s %7.2f %6s %6s %8s %8s %7.1f" % (
                    shape, p, r["fwd_ms"], r["fwdbwd_ms"], r["fwdbwd_wall_ms"], r["fwd_wall_ms"],
                    fmt(r.get("x_c_fused"), "%.2f"), r["x_bw_floor"], fmt(r["peak_fwd_x"], "%.2f"),
                    fmt(r["peak_x"], "%.2f"), fmt(r["loss_err"], "%.1e"),
                    fmt(r.get("grad_err"), "%.1e"), r["first_call_s"]), flush=True)
            except Exception as e:
                msg = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0])
                r = {"error": msg}
                print("%-18s %-18s FAILED: %s" % (shape, p, msg), flush=True)
                if os.environ.get("BENCH_TRACEBACK"):
                    traceback.print_exc()
            entry["providers"][p] = r
            gc.collect()
            dev.empty_cache()
            dump()
        if c.get("c_fused_ms"):
            print("%-18s %-18s %9.4f %9.4f %9.4f %9s %7.2f %7.2f   (C level: fused inplace %.4f, "
                  "backward %.4f ms)" % (
                      shape, "C: fwd / fused", c["c_forward_ms"], c["c_fused_ms"],
                      c["c_fused_wall_ms"], "", 1.0, c["c_fused_ms"] / bw_floor,
                      c["c_fused_inplace_ms"], c["c_backward_ms"]), flush=True)
        del logits, t, ref_grad
        gc.collect()
        dev.empty_cache()
        dump()
    lines = summarize(result)
    result["summary"] = lines
    for line in lines:
        print(line)
    if a.png:
        result["png"] = a.png if plot(result, a.png) else None
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
