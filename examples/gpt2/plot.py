"""plot.py — loss vs step of train.py runs (its per-step CSVs), fusedloss on against off.

    python3 examples/gpt2/plot.py runs/gpt2_real_B16_T1024_off.csv runs/gpt2_real_B16_T1024_on.csv -o loss.png
    python3 examples/gpt2/plot.py runs/*_off.csv runs/*_on.csv --smooth 10

Top panel: the training loss of each CSV (and its validation points, if any), labelled with the
CSV's fusedloss column and file name; runs on SYNTHETIC tokens say so in the legend and title.
Bottom panel (when a CSV with fusedloss 'off' is among them): |loss - loss_off| per step for each
other run, on a log scale: the on/off difference against the calibration run's (correctness mode).
Needs matplotlib (pip install matplotlib); runs headless (Agg backend).
"""
import argparse
import csv
import os
import sys


def read(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if not rows or "loss" not in rows[0]:
        raise SystemExit(f"{path}: not a train.py CSV (no 'loss' column)")
    return rows


def label_of(path, rows):
    name = os.path.basename(path)[:-4] if path.endswith(".csv") else os.path.basename(path)
    fl = rows[0].get("fusedloss", "?")
    if name.endswith("_offref"):
        fl = "off, init x(1+2^-8 sign) (calibration)"
    data = rows[0].get("data", "")
    return f"fusedloss {fl}" + (" [SYNTHETIC tokens]" if data == "synthetic" else "") + f" ({name})"


def smooth(v, k):
    if k <= 1:
        return v
    out, acc = [], 0.0
    for i, x in enumerate(v):
        acc += x
        if i >= k:
            acc -= v[i - k]
        out.append(acc / min(i + 1, k))
    return out


def plot(paths, png, smooth_k=1, title=None):
    """Write png from the CSVs in paths; raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(p, read(p)) for p in paths]
    base = next(((p, r) for p, r in runs
                 if r[0].get("fusedloss") == "off" and not p.endswith("_offref.csv")), None)
    n_panels = 2 if base is not None and len(runs) > 1 else 1
    fig, axes = plt.subplots(n_panels, 1, figsize=(9, 4.2 * n_panels), squeeze=False,
                             sharex=True)
    ax = axes[0][0]
    color = {p: f"C{i}" for i, (p, _) in enumerate(runs)}   # one colour per run in both panels
    val_label = "validation loss"
    for p, rows in runs:
        steps = [int(r["step"]) for r in rows]
        loss = [float(r["loss"]) for r in rows]
        ax.plot(steps, smooth(loss, smooth_k), lw=1.2, color=color[p], label=label_of(p, rows))
        val = [(int(r["step"]), float(r["val_loss"])) for r in rows if r.get("val_loss")]
        if val:
            ax.plot(*zip(*val), "o", ms=4, mfc="none", color=color[p], label=val_label)
            val_label = "_nolegend_"
    ax.set_ylabel("training loss" + (f" ({smooth_k}-step mean)" if smooth_k > 1 else ""))
    synthetic = any(r[0].get("data") == "synthetic" for _, r in runs)
    ax.set_title(title or ("loss vs step, fusedloss on / off"
                           + (" (SYNTHETIC tokens)" if synthetic else " (KJV text)")))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if n_panels == 2:
        bp, brows = base
        ref = {int(r["step"]): float(r["loss"]) for r in brows}
        ax2 = axes[1][0]
        for p, rows in runs:
            if p == bp:
                continue
            pts = [(int(r["step"]), abs(float(r["loss"]) - ref[int(r["step"])]))
                   for r in rows if int(r["step"]) in ref]
            if pts:
                s, d = zip(*pts)
                ax2.plot(s, [max(x, 1e-9) for x in d], lw=1.0, color=color[p],
                         label=label_of(p, rows))
        ax2.set_yscale("log")
        ax2.set_ylabel("|loss - loss(off)|  (floor 1e-9)")
        ax2.grid(alpha=0.3, which="both")
        ax2.legend(fontsize=8)
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def main():
    p = argparse.ArgumentParser(description="loss vs step of train.py CSVs (fusedloss on/off)")
    p.add_argument("csv", nargs="+")
    p.add_argument("-o", "--output", default="loss.png")
    p.add_argument("--smooth", type=int, default=1, help="running mean over this many steps")
    p.add_argument("--title", default=None)
    a = p.parse_args()
    try:
        print(plot(a.csv, a.output, a.smooth, a.title))
    except ImportError as e:
        print(f"plot.py needs matplotlib (pip install matplotlib): {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
