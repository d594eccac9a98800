#!/usr/bin/env python3
"""bench_peers.py — cross-entropy forward+backward: fusedloss against PyTorch-side peers, in one
run on one GPU.

Providers (each one that is missing or fails prints why and the run goes on):
  fusedloss          the C library through ctypes (build/libfusedloss.so): one
                     fl_cross_entropy_fused_cuda call gives the loss and dlogits (separate buffer)
  fusedloss-inplace  the same with dlogits == logits
  eager              F.cross_entropy(x, t); loss.backward()       (x: leaf, requires_grad)
  eager-upcast       F.cross_entropy(x.float(), t); loss.backward()
  compile            torch.compile(F.cross_entropy) fwd + backward (dynamic=False)
  liger              liger_kernel LigerCrossEntropyLoss, if importable (writes the gradient
                     into the logits during forward)
  flash-attn         flash_attn.losses.cross_entropy.CrossEntropyLoss (Triton), if importable
All with reduction "mean", targets uniform in [0, V), no ignored rows.

Measured per (shape, provider):
  ms        median (and min) of --reps timed fwd+bwd steps (torch.cuda.Event around each step,
            after --warmup steps; compile's first call, which compiles, is timed separately)
  ratio     ms / floor, floor = (read logits + write the gradient) bytes / copy bandwidth;
            the copy bandwidth is measured in the same run (device-to-device copy of 2 GiB,
            bytes = read + write)
  peak      torch.cuda.max_memory_allocated() during one step minus what was allocated before
            it (the inputs), in GiB and in units of the logits' size; the gradient counts
            (an out-of-place provider is >= 1)
  loss err  |loss - loss_fp64| / |loss_fp64|, loss_fp64 = F.cross_entropy(logits.double(), t)
  grad err  max |grad - grad_fp64| / max |grad_fp64|
Notes: in-place providers (fusedloss-inplace, liger) overwrite the logits, so timed reps after the
first run on gradient values (same traffic, same arithmetic). The smallest shapes fit in L2 /
are launch-bound: compare them only within one run.

Usage: python3 bench/bench_peers.py [--out FILE.json] [--reps 50] [--warmup 5]
          [--shapes 8192x128256:bf16,4096x50257:f32,...] [--providers fusedloss,eager,...]
          [--lib build/libfusedloss.so] [--budget SECONDS]
The last lines printed are "PEERS ..." summaries (ratio to the floor per provider).
"""
import argparse
import ctypes
import datetime
import gc
import json
import os
import statistics
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SHAPES = "8192x128256:bf16,4096x50257:f32,2048x32000:f16,128x1000:f32"
ALL_PROVIDERS = ["fusedloss", "fusedloss-inplace", "eager", "eager-upcast", "compile", "liger", "flash-attn"]

FL_DTYPE = {"f32": 0, "f16": 1, "bf16": 2}
FL_INDEX_I64 = 1
FL_REDUCTION_MEAN = 1


class FlOptions(ctypes.Structure):
    """fl_ce_options of include/fusedloss.h (56 bytes on LP64; checked against sizeof in C)."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("ignore_index", ctypes.c_int64),
        ("reduction", ctypes.c_int),
        ("label_smoothing", ctypes.c_float),
        ("weight", ctypes.c_void_p),
        ("z_loss", ctypes.c_float),
        ("softcap", ctypes.c_float),
        ("logit_scale", ctypes.c_float),
        ("error_flag", ctypes.c_void_p),
    ]


def load_fusedloss(path):
    lib = ctypes.CDLL(path)
    lib.fl_cross_entropy_workspace_size.argtypes = [
        ctypes.POINTER(ctypes.c_size_t), ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.POINTER(FlOptions)]
    lib.fl_cross_entropy_workspace_size.restype = ctypes.c_int
    lib.fl_cross_entropy_fused_cuda.argtypes = [
        ctypes.c_void_p,  # loss
        ctypes.c_void_p,  # lse
        ctypes.c_void_p,  # dlogits
        ctypes.c_void_p,  # logits
        ctypes.c_void_p,  # targets
        ctypes.c_void_p,  # grad_loss
        ctypes.c_float,   # grad_scale
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,  # N, V, ld
        ctypes.c_int,     # dtype
        ctypes.c_int,     # index dtype
        ctypes.POINTER(FlOptions),
        ctypes.c_void_p,  # workspace
        ctypes.c_size_t,  # workspace_bytes
        ctypes.c_void_p,  # stream
    ]
    lib.fl_cross_entropy_fused_cuda.restype = ctypes.c_int
    lib.fl_last_error.argtypes = []
    lib.fl_last_error.restype = ctypes.c_char_p
    lib.fl_cuda_built.argtypes = []
    lib.fl_cuda_built.restype = ctypes.c_int
    lib.fl_version_string.argtypes = []
    lib.fl_version_string.restype = ctypes.c_char_p
    if not lib.fl_cuda_built():
        raise RuntimeError("%s was built without CUDA" % path)
    return lib


def measure_copy_gbps(torch, reps=30):
    nbytes = 2 << 30
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    a.fill_(0x3C)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for e0, e1 in ev:
        e0.record()
        b.copy_(a)
        e1.record()
    torch.cuda.synchronize()
    ms = statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * nbytes / (ms * 1e6)


# ---------------------------------------------------------------------------------------------
# providers: make(shape) -> step(x, t) returning (loss, grad); x is the logits tensor (a leaf
# with requires_grad for autograd providers), t int64 targets.
# ---------------------------------------------------------------------------------------------
class Provider:
    autograd = True
    inplace = False

    def __init__(self, name):
        self.name = name


def make_fusedloss(torch, lib, inplace):
    p = Provider("fusedloss-inplace" if inplace else "fusedloss")
    p.autograd = False
    p.inplace = inplace
    opts = FlOptions(ctypes.sizeof(FlOptions), -100, FL_REDUCTION_MEAN, 0.0, None, 0.0, 0.0, 1.0, None)
    dmap = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

    def step(x, t):
        N, V = x.shape
        ws_bytes = ctypes.c_size_t(0)
        st = lib.fl_cross_entropy_workspace_size(ctypes.byref(ws_bytes), N, V, dmap[x.dtype], ctypes.byref(opts))
        if st != 0:
            raise RuntimeError("workspace_size: %s" % lib.fl_last_error().decode())
        ws = torch.empty(ws_bytes.value + 256, dtype=torch.uint8, device=x.device)
        ws_ptr = (ws.data_ptr() + 255) & ~255  # the CUDA backend wants 256-byte alignment
        loss = torch.empty(1, dtype=torch.float32, device=x.device)
        g = x if inplace else torch.empty_like(x)
        st = lib.fl_cross_entropy_fused_cuda(
            loss.data_ptr(), None, g.data_ptr(), x.data_ptr(), t.data_ptr(), None, 1.0, N, V, V,
            dmap[x.dtype], FL_INDEX_I64, ctypes.byref(opts), ws_ptr, ws_bytes.value,
            torch.cuda.current_stream().cuda_stream)
        if st != 0:
            raise RuntimeError("fl_cross_entropy_fused_cuda: %s" % lib.fl_last_error().decode())
        return loss, g

    p.step = step
    return p


def make_autograd(torch, name, fn, inplace=False):
    p = Provider(name)
    p.inplace = inplace

    def step(x, t):
        x.grad = None
        loss = fn(x, t)
        loss.backward()
        return loss, x.grad

    p.step = step
    return p


def make_providers(torch, F, lib, lib_err, wanted):
    out, missing = [], {}
    for name in wanted:
        try:
            if name in ("fusedloss", "fusedloss-inplace"):
                if lib is None:
                    raise RuntimeError(lib_err)
                out.append(make_fusedloss(torch, lib, name == "fusedloss-inplace"))
            elif name == "eager":
                out.append(make_autograd(torch, name, lambda x, t: F.cross_entropy(x, t)))
            elif name == "eager-upcast":
                out.append(make_autograd(torch, name, lambda x, t: F.cross_entropy(x.float(), t)))
            elif name == "compile":
                cfn = torch.compile(lambda x, t: F.cross_entropy(x, t), dynamic=False)
                out.append(make_autograd(torch, name, cfn))
            elif name == "liger":
                from liger_kernel.transformers import LigerCrossEntropyLoss
                m = LigerCrossEntropyLoss()
                out.append(make_autograd(torch, name, lambda x, t: m(x, t), inplace=True))
            elif name == "flash-attn":
                from flash_attn.losses.cross_entropy import CrossEntropyLoss as FlashCE
                m = FlashCE(inplace_backward=False)
                out.append(make_autograd(torch, name, lambda x, t: m(x, t)))
            else:
                raise RuntimeError("unknown provider")
        except Exception as e:  # missing package or bad library: say why, go on
            missing[name] = "%s: %s" % (type(e).__name__, e)
            print("provider %-17s unavailable: %s" % (name, missing[name]), flush=True)
    return out, missing


def run_provider(torch, p, logits, t, ref_loss, ref_grad, reps, warmup, floor_ms):
    """-> dict of results for one provider and shape"""
    r = {"provider": p.name}
    logit_bytes = logits.numel() * logits.element_size()

    def fresh():
        x = logits.clone()
        return x.requires_grad_() if p.autograd else x

    # first call (compiles, for torch.compile), correctness against float64
    x = fresh()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss, grad = p.step(x, t)
    torch.cuda.synchronize()
    r["first_call_s"] = time.perf_counter() - t0
    lv = float(loss.detach().double().reshape(-1)[0])
    r["loss"] = lv
    r["loss_relerr"] = abs(lv - ref_loss) / abs(ref_loss)
    if ref_grad is not None and grad is not None:
        r["grad_err"] = float((grad.detach().double() - ref_grad).abs().max() / ref_grad.abs().max())
    del loss, grad, x
    gc.collect()

    # peak extra memory of one step (inputs allocated before the measurement)
    x = fresh()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss, grad = p.step(x, t)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    r["peak_extra_bytes"] = int(peak)
    r["peak_extra_x_logits"] = peak / logit_bytes
    del loss, grad
    gc.collect()

    # timing on x (in-place providers keep overwriting it: same traffic)
    for _ in range(warmup):
        p.step(x, t)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda.synchronize()
    for e0, e1 in ev:
        e0.record()
        p.step(x, t)
        e1.record()
    torch.cuda.synchronize()
    ms = [e0.elapsed_time(e1) for e0, e1 in ev]
    r["ms"] = statistics.median(ms)
    r["ms_min"] = min(ms)
    r["ratio_to_floor"] = r["ms"] / floor_ms
    r["gbps"] = 2.0 * logit_bytes / (r["ms"] * 1e6)
    del x
    gc.collect()
    return r


def parse_shapes(s, torch):
    dmap = {"f32": torch.float32, "fp32": torch.float32, "f16": torch.float16, "fp16": torch.float16,
            "bf16": torch.bfloat16}
    out = []
    for item in s.split(","):
        nv, dt = item.strip().split(":")
        n, v = nv.lower().split("x")
        out.append((int(n), int(v), dt, dmap[dt]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write JSON results here")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--providers", default=",".join(ALL_PROVIDERS))
    ap.add_argument("--lib", default=os.path.join(REPO, "build", "libfusedloss.so"))
    ap.add_argument("--budget", type=float, default=0.0, help="seconds; skip what would start after it (0: none)")
    ap.add_argument("--no-grad-check", action="store_true", help="skip the float64 gradient reference")
    a = ap.parse_args()
    a.reps = max(a.reps, 1)
    start = time.time()

    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "commit": os.environ.get("FL_COMMIT", "unknown"), "command": " ".join(sys.argv),
              "reps": a.reps, "warmup": a.warmup, "results": [], "unavailable": {}}

    def dump():
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)

    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:
        print("SKIP: PyTorch not importable: %s" % e)
        result["error"] = "torch: %s" % e
        dump()
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device visible to PyTorch")
        result["error"] = "no CUDA device"
        dump()
        return 0
    result["gpu"] = torch.cuda.get_device_name(0)
    result["torch"] = torch.__version__
    try:
        import triton
        result["triton"] = triton.__version__
    except Exception:
        result["triton"] = None

    lib, lib_err = None, None
    try:
        lib = load_fusedloss(a.lib)
        result["fusedloss"] = lib.fl_version_string().decode()
    except Exception as e:
        lib_err = "cannot load %s: %s" % (a.lib, e)
    wanted = [p.strip() for p in a.providers.split(",") if p.strip()]
    providers, missing = make_providers(torch, F, lib, lib_err, wanted)
    result["unavailable"] = missing

    copy_gbps = measure_copy_gbps(torch)
    result["copy_gbps"] = copy_gbps
    print("%s | torch %s | triton %s | fusedloss %s | copy BW %.0f GB/s (D2D 2 GiB, read+write)" % (
        result["gpu"], result["torch"], result["triton"], result.get("fusedloss"), copy_gbps), flush=True)
    print("reps %d (median), warm-up %d; floor = (read logits + write grad) / copy BW; peak = extra memory "
          "of one step (x logits)" % (a.reps, a.warmup), flush=True)
    hdr = "%-22s %-18s %9s %9s %7s %7s %10s %10s %10s %9s" % (
        "shape", "provider", "ms(med)", "ms(min)", "ratio", "GB/s", "peak(xL)", "loss err", "grad err", "first(s)")
    print(hdr)
    summaries = []
    dump()
    for (N, V, dtn, dt) in parse_shapes(a.shapes, torch):
        shape = "%dx%d %s" % (N, V, dtn)
        if a.budget and time.time() - start > a.budget:
            print("%-22s skipped: time budget (%.0f s) spent" % (shape, a.budget), flush=True)
            result["results"].append({"shape": shape, "skipped": "time budget"})
            continue
        torch.manual_seed(0)
        try:
            logits = (torch.randn(N, V, device="cuda", dtype=torch.float32) * 2.0).to(dt)
            t = torch.randint(0, V, (N,), device="cuda", dtype=torch.int64)
            ref_loss, ref_grad = None, None
            x64 = logits.detach().double().requires_grad_()
            l64 = F.cross_entropy(x64, t)
            ref_loss = float(l64.detach())
            if not a.no_grad_check:
                l64.backward()
                ref_grad = x64.grad
            del x64, l64
            gc.collect()
        except Exception as e:
            print("%-22s setup failed: %s" % (shape, e), flush=True)
            result["results"].append({"shape": shape, "error": "setup: %s" % e})
            torch.cuda.empty_cache()
            continue
        logit_bytes = logits.numel() * logits.element_size()
        floor_ms = 2.0 * logit_bytes / (copy_gbps * 1e6)
        line = []
        for p in providers:
            if a.budget and time.time() - start > a.budget:
                r = {"provider": p.name, "skipped": "time budget"}
                print("%-22s %-18s skipped: time budget" % (shape, p.name), flush=True)
            else:
                try:
                    r = run_provider(torch, p, logits, t, ref_loss, ref_grad, a.reps, a.warmup, floor_ms)
                    print("%-22s %-18s %9.4f %9.4f %7.2f %7.0f %10.2f %10.1e %10.1e %9.1f" % (
                        shape, p.name, r["ms"], r["ms_min"], r["ratio_to_floor"], r["gbps"],
                        r["peak_extra_x_logits"], r["loss_relerr"], r.get("grad_err", float("nan")),
                        r["first_call_s"]), flush=True)
                    line.append("%s %.2fx" % (p.name, r["ratio_to_floor"]))
                except Exception as e:
                    msg = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                    print("%-22s %-18s FAILED: %s" % (shape, p.name, msg), flush=True)
                    if os.environ.get("BENCH_PEERS_TRACEBACK"):
                        traceback.print_exc()
                    r = {"provider": p.name, "error": msg}
                    line.append("%s failed" % p.name)
                gc.collect()
                torch.cuda.empty_cache()
            r.update({"shape": shape, "N": N, "V": V, "dtype": dtn, "floor_ms": floor_ms, "copy_gbps": copy_gbps})
            result["results"].append(r)
            dump()
        for name in missing:
            line.append("%s n/a" % name)
        summaries.append("PEERS %-20s %s" % (shape, ", ".join(line)))
        del logits, t, ref_grad
        gc.collect()
        torch.cuda.empty_cache()
    dump()
    print()
    print("PEERS copy BW %.0f GB/s on %s (ratio = fwd+bwd time / floor)" % (copy_gbps, result["gpu"]))
    for s in summaries:
        print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
