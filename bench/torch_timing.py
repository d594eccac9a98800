"""torch_timing.py — the CUDA-event timing the Python benchmarks share (bench_lce_torch.py,
bench_vp.py, bench_zoo.py): warm-up, then the median (and min) of `reps` event-timed calls, and
the device-to-device copy bandwidth (bytes read + written per second) that floors are made of.
Two times a step: synchronised (timed: what an eager loop that waits for every step pays, the host's
dispatch latency included) and replayed from CUDA graphs (graph_ms / graph_step_ms: the GPU time of
the same kernels, the host out of the way)."""
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


def graph_ms(step, nsets, reps, warmup=3):
    """GPU time of step(i) (i = input set) with the host out of the way: one CUDA graph captured
    per input set (after warm-up on a side stream, as torch.cuda.graph documents), replayed in
    turn; (median ms, None) or (NaN, the reason) when capture fails."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmup):
                for i in range(nsets):
                    step(i)
        torch.cuda.current_stream().wait_stream(s)
        graphs = []
        for i in range(nsets):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step(i)
            graphs.append(g)
        it = [0]

        def replay():
            graphs[it[0] % nsets].replay()
            it[0] += 1
        return median_ms(replay, reps), None
    except Exception as e:  # noqa: BLE001 - reported by the caller, not hidden
        return float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"


# ---- the forward + backward loop of bench_distill.py / bench_softmax_losses.py ---------------------
def rotating_step(f, xs, ts):
    """A step() that runs f(xs[i], ts[i]).backward() on the input sets in turn (xs require grad)."""
    it = [0]

    def step():
        i = it[0] % len(xs)
        it[0] += 1
        xs[i].grad = None
        f(xs[i], ts[i]).backward()
    return step


def graph_step_ms(f, xs, ts, reps, warmup=2):
    """GPU time of one f(xs[i], ts[i]).backward() step with the host out of the way (graph_ms: one
    CUDA graph per input set, replayed in turn): (median ms, None) or (NaN, why capture failed: a
    provider that synchronises with the host, such as a boolean-mask index, cannot be captured).
    The gradients the graphs leave are cleared after."""
    def step(i):
        xs[i].grad = None
        f(xs[i], ts[i]).backward()
    try:
        return graph_ms(step, len(xs), reps, warmup)
    finally:
        for x in xs:
            x.grad = None


def add_graph_time(r, name, providers, f, xs, ts, reps, floor_ms, width):
    """When name is in providers (the benches' --graph, a comma list): time f's step from CUDA graphs
    (graph_step_ms), record graph_ms / graph_ratio / graph_why in the result row r and print one line
    (name right-aligned after `width` blank columns, as the bench's own lines)."""
    if name not in providers.split(","):
        return
    g, why = graph_step_ms(f, xs, ts, reps)
    r.update(graph_ms=g, graph_ratio=g / floor_ms, graph_why=why)
    print(f"{'':>{width}} {name:>10}: graph {g:8.3f} ms {g / floor_ms:6.2f}x floor" + (f" ({why})" if why else ""))


def graph_part(r):
    """', graph 1.234 ms 1.16x' (GPU time of the step from a CUDA graph) for a result row, or ''."""
    g = r.get("graph_ms")
    if g is None:
        return ""
    return f", graph {g:.3f} ms {r['graph_ratio']:.2f}x" if g == g else ", graph n/a"


def step_extra_bytes(f, xs, ts):
    """Peak extra memory of one f(xs[0], ts[0]).backward(): beyond what was allocated before it and
    the gradient it leaves (all xs' gradients cleared first and after)."""
    import gc
    for x in xs:
        x.grad = None
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    f(xs[0], ts[0]).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - xs[0].grad.numel() * xs[0].grad.element_size()
    xs[0].grad = None
    return extra


def summary_parts(res):
    """One 'provider ms ratio +MiB err' item per provider result (dict name -> row) for a SUMMARY line."""
    parts = []
    for name, r in res.items():
        if "ms" in r:
            parts.append(f"{name} {r['ms']:.3f} ms {r['ratio']:.2f}x +{r['extra_mib']:.0f} MiB "
                         f"err {r['err_loss']:.1e}/{r['err_grad']:.1e}{graph_part(r)}")
        else:
            parts.append(f"{name} n/a")
    return parts


def write_results(path, bw, rows):
    """The JSON results file: device, torch version, copy bandwidth, the rows."""
    import json
    with open(path, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, copy_bw=bw,
                       results=rows), fh, indent=1)


class knob_variant:
    """`with knob_variant("K=V,K2=V2"):` sets those environment variables (the library's knobs are
    read by the C entry points on every call: os.environ reaches getenv) and restores them after."""

    def __init__(self, variant):
        import os
        self._env = os.environ
        self.kv = dict(item.split("=", 1) for item in variant.split(",") if "=" in item)

    def __enter__(self):
        self.saved = {k: self._env.get(k) for k in self.kv}
        self._env.update(self.kv)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                self._env.pop(k, None)
            else:
                self._env[k] = v
        return False
