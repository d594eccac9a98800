#!/usr/bin/env python3
"""ring_protocol_model.py — a randomised model check of the mbarrier protocol that the warp-specialised
ring kernels share (ce_pipe_kernel in src/cuda/cross_entropy.cu, distill_pipe_kernel in
src/cuda/distill.cu): a producer warp, a statistics group and gradient warps per CTA, R ring slots with
full[s] / empty[s] barriers, DP_XSLOTS exchange slots with xbar[x] barriers filled by st.async from
every CTA of the cluster.

    python3 scripts/ring_protocol_model.py [--runs 200] [--seed 1]      # must report 0 bad runs
    python3 scripts/ring_protocol_model.py --violate [--runs 100]       # R one past the host's bound:
                                                                         # must report bad runs

Each run draws a cluster size (1-4), positions per row (nsub 1-5), a ring size R in [nsub + 1,
min(16, (XSLOTS / 2 + 1) nsub - 1)] (the bound the hosts keep), rows per cluster (1-40), gradient
warps (1-3), a fraction of ignored rows, a short last CTA, and per-actor speeds; the actors and the
asynchronous completions (bulk copies, st.async) then interleave at random. A run fails when a
waiter passes on the wrong phase of a barrier (an ABA: a phase completed twice), when a reader finds
a slot or an exchange slot holding another position or row than it expects (before or after it
yields), or when nothing can progress (deadlock). With --violate R = (XSLOTS / 2 + 1) nsub, which
lets an exchange slot be overwritten before its reader is done: the check must then find failures
(it did: 648 of 3526 runs when written), which shows it can fail.
--nbar models the NB variant of the release (FUSEDLOSS_*_PIPE_NBAR, session 18): the gradient warps
bar.arrive on a hardware barrier per slot and the producer bar.syncs on it before the refill, R <= 14.
A hardware barrier has no phases: it counts arrivals and completes at its count, so an arrival meant
for the next lap of a slot, made before the producer's sync of this lap, would complete the wrong
lap; the model asserts that every arrival belongs to the barrier's current lap. --nbar --violate
lets the producer bar.arrive instead of bar.sync (no wait): the slot checks must then fail.
--gp models the JSD ring's gradient group pipelined over two rows (distill_pipe_kernel's JS 2,
FUSEDLOSS_DISTILL_PIPE_GP, session 44): each gradient warp runs phase A of row k + 1 (the statistics
exchange, the second sweep over the row's slots, its sums into jw[k & 1][warp], named barrier 2, then
warp 0 reads the warps' sums and sends the CTA's to every rank's sums slot, completing jbar[x]) before
phase B of row k (jbar, the gradient sweep, the releases), with R in [2 nsub, min(16, (XSLOTS / 2 + 1)
nsub - 1)]. --gp --violate takes R = 2 nsub - 1, where phase A of row k + 1 waits for slots only phase
B of row k frees: the check must find deadlocks (38 of 40 runs when written); --gp --single-jw keeps
one jw buffer, which a fast warp's next row overwrites before warp 0 read it: failures expected (19 of
60 runs when written).
This models the protocol, not the kernels' code: it does not replace the GPU tests.
SPDX-License-Identifier: MIT
"""
import argparse
import random
import sys

XSLOTS = 8


class Barrier:
    """An mbarrier: `count` arrivals and a transaction count complete a phase."""

    def __init__(self, count):
        self.count = count
        self.pending = count
        self.tx = 0
        self.done = 0  # phases completed

    def arrive(self, tx=0):
        self.tx += tx
        self.pending -= 1
        self._check()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._check()

    def _check(self):
        assert self.pending >= 0, "more arrivals than the barrier's count"
        if self.pending == 0 and self.tx == 0:
            self.done += 1
            self.pending = self.count

    def try_wait(self, parity, phase):
        """try_wait.parity: true once the phase of this parity completed; `phase` is the one the caller
        means, which must be the one that completed (else an ABA)."""
        ok = (self.done & 1) != parity
        if ok:
            assert self.done == phase + 1, f"phase aliasing: {self.done} phases done, waited for phase {phase}"
        return ok


class HwBarrier:
    """A hardware (named) barrier: bar.arrive / bar.sync add one arrival (a warp each here); the barrier
    completes at `count` arrivals (waking the bar.sync waiters) and starts over. `lap`: which completion
    an arrival is meant for, which must be the current one."""

    def __init__(self, count):
        self.count = count
        self.n = 0
        self.gen = 0  # completions so far

    def arrive(self, lap):
        assert lap == self.gen, f"hardware barrier: an arrival for lap {lap} while lap {self.gen} is open"
        self.n += 1
        if self.n == self.count:
            self.gen += 1
            self.n = 0


def run(rng, cs, R, nsub, sub, rows, ngw, p_ignored, nbar=False, nowait=False, gp=False, single_jw=False):
    per = nsub * sub
    nv = per * cs - rng.randrange(0, per // 2 + 1) if cs > 1 else per
    ignored = [rng.random() < p_ignored for _ in range(rows)]
    ctas = []
    for rank in range(cs):
        n = max(0, min(per, nv - rank * per))
        ctas.append(dict(rank=rank, n=n, full=[Barrier(1) for _ in range(R)], empty=[Barrier(ngw) for _ in range(R)],
                         hb=[HwBarrier(ngw + 1) for _ in range(R)],
                         xbar=[Barrier(1) for _ in range(XSLOTS)], slot=[None] * R,
                         xs=[[None] * cs for _ in range(XSLOTS)],
                         # gp: the JSD's second exchange (jbar[x], the sums by rank js[x][r]), the gradient warps'
                         # sums jw[buffer][warp] and named barrier 2 (n arrivals of this lap, gen laps completed)
                         jbar=[Barrier(1) for _ in range(XSLOTS)], js=[[None] * cs for _ in range(XSLOTS)],
                         jw=[[None] * ngw for _ in range(2)], nb2=dict(n=0, gen=0)))
    pending = []  # asynchronous completions not yet landed

    def count(c, row, j):
        return 0 if ignored[row] else max(0, min(sub, c["n"] - j * sub))

    def producer(c):
        P = 0
        for row in range(rows):
            for j in range(nsub):
                s, ph = P % R, (P // R) & 1
                if P >= R and nbar:   # bar.sync (nowait: bar.arrive, the --violate variant)
                    lap = P // R - 1
                    c["hb"][s].arrive(lap)
                    while not nowait and c["hb"][s].gen <= lap:
                        yield
                elif P >= R:
                    while not c["empty"][s].try_wait(ph ^ 1, P // R - 1):
                        yield
                k = count(c, row, j)
                if k > 0:
                    c["full"][s].arrive(k)
                    c["slot"][s] = "in flight"

                    def land(c=c, s=s, row=row, j=j, k=k):
                        c["slot"][s] = (row, j)
                        c["full"][s].complete_tx(k)
                    pending.append(land)
                else:
                    c["full"][s].arrive()
                P += 1
                yield

    def statistics(c):
        P = 0
        for row in range(rows):
            for j in range(nsub):
                s, ph = P % R, (P // R) & 1
                while not c["full"][s].try_wait(ph, P // R):
                    yield
                if count(c, row, j) > 0:
                    assert c["slot"][s] == (row, j), f"statistics read slot {s}: {c['slot'][s]}, want {(row, j)}"
                    yield
                    assert c["slot"][s] == (row, j), f"statistics read slot {s} (2): {c['slot'][s]}"
                P += 1
            x = row % XSLOTS
            if cs > 1:
                c["xbar"][x].arrive(cs)
                for d in ctas:
                    def land(d=d, x=x, r=c["rank"], row=row):
                        d["xs"][x][r] = row
                        d["xbar"][x].complete_tx(1)
                    pending.append(land)
            else:
                c["xs"][x][0] = row
                c["xbar"][x].arrive()
            yield

    def gradient(c):
        P = 0
        for row in range(rows):
            x = row % XSLOTS
            while not c["xbar"][x].try_wait((row // XSLOTS) & 1, row // XSLOTS):
                yield
            for r in range(cs):
                assert c["xs"][x][r] == row, f"exchange slot {x} rank {r}: row {c['xs'][x][r]}, want {row}"
            yield
            for r in range(cs):
                assert c["xs"][x][r] == row, f"exchange slot {x} rank {r} (2): row {c['xs'][x][r]}, want {row}"
            for j in range(nsub):
                s, ph = P % R, (P // R) & 1
                if count(c, row, j) > 0:
                    while not c["full"][s].try_wait(ph, P // R):
                        yield
                    assert c["slot"][s] == (row, j), f"gradient read slot {s}: {c['slot'][s]}, want {(row, j)}"
                    yield
                    assert c["slot"][s] == (row, j), f"gradient read slot {s} (2): {c['slot'][s]}"
                if nbar:
                    c["hb"][s].arrive(P // R)
                else:
                    c["empty"][s].arrive()
                P += 1
                yield

    def gradient_gp(c, w):
        """distill_pipe_kernel's JS 2 (FUSEDLOSS_DISTILL_PIPE_GP): phase A of row k + 1 (the statistics exchange,
        the second sweep over the row's slots, the warp sums jw, named barrier 2, warp 0 sending the CTA's sums
        to every rank's js completing jbar) before phase B of row k (jbar, the gradient sweep, the releases)."""
        def exchange(bar, slots, row, what):   # wait for row's phase of bar, then read its cs slots (across a yield)
            x = row % XSLOTS
            while not c[bar][x].try_wait((row // XSLOTS) & 1, row // XSLOTS):
                yield
            for again in ("", " (2)"):
                for r in range(cs):
                    got = c[slots][x][r]
                    assert got == row, f"gp: {what} slot {x} rank {r}{again}: row {got}, want {row}"
                if not again:
                    yield

        def sweep(row, what, release):   # the row's slots in order (and each released after its read)
            P = row * nsub
            for j in range(nsub):
                s, ph = P % R, (P // R) & 1
                if count(c, row, j) > 0:
                    while not c["full"][s].try_wait(ph, P // R):
                        yield
                    for again in ("", " (2)"):
                        got = c["slot"][s]
                        assert got == (row, j), f"gp {what} read slot {s}{again}: {got}, want {(row, j)}"
                        if not again:
                            yield
                if release:
                    c["empty"][s].arrive()
                    yield
                P += 1

        def phase_a(row):
            x = row % XSLOTS
            yield from exchange("xbar", "xs", row, "exchange")
            yield from sweep(row, "sweep", False)
            b = 0 if single_jw else row & 1
            c["jw"][b][w] = row
            nb = c["nb2"]   # bar.sync 2 over the gradient warps
            nb["n"] += 1
            if nb["n"] == ngw:
                nb["gen"] += 1
                nb["n"] = 0
            while nb["gen"] <= row:
                yield
            if w == 0:   # thread gt 0: the warps' sums, then the CTA's to every rank
                for again in ("", " (2)"):
                    for k in range(ngw):
                        assert c["jw"][b][k] == row, f"gp: jw[{b}][{k}]{again} holds row {c['jw'][b][k]}, want {row}"
                    if not again:
                        yield
                if cs > 1:
                    c["jbar"][x].arrive(cs)
                    for d in ctas:
                        def land(d=d, x=x, r=c["rank"], row=row):
                            d["js"][x][r] = row
                            d["jbar"][x].complete_tx(1)
                        pending.append(land)
                else:
                    c["js"][x][0] = row
                    c["jbar"][x].arrive()

        def phase_b(row):
            yield from exchange("jbar", "js", row, "sums")
            yield from sweep(row, "gradient", True)

        for it in range(rows + 1):
            if it < rows:
                yield from phase_a(it)
            if it > 0:
                yield from phase_b(it - 1)

    actors = []
    for c in ctas:
        grads = [gradient_gp(c, w) for w in range(ngw)] if gp else [gradient(c) for _ in range(ngw)]
        actors += [producer(c), statistics(c)] + grads
    speed = {id(a): rng.choice([0.02, 0.2, 1.0, 5.0]) for a in actors}
    live, stall = list(actors), 0
    while live or pending:
        if pending and (not live or rng.random() < 0.3):
            pending.pop(rng.randrange(len(pending)))()
            stall = 0
            continue
        a = rng.choices(live, weights=[speed[id(x)] for x in live])[0]
        try:
            next(a)
        except StopIteration:
            live.remove(a)
        stall += 1
        if stall > 200000:
            return "deadlock"
    return "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--violate", action="store_true", help="R one past the hosts' bound: failures expected")
    ap.add_argument("--nbar", action="store_true", help="the hardware-barrier release (NB); with --violate: "
                    "the producer does not wait")
    ap.add_argument("--gp", action="store_true", help="the JSD ring's gradient group pipelined over two rows "
                    "(JS 2, FUSEDLOSS_DISTILL_PIPE_GP), R >= 2 nsub; with --violate R = 2 nsub - 1: failures expected")
    ap.add_argument("--single-jw", action="store_true", help="with --gp: one buffer of warp sums, not two by row "
                    "parity: failures expected")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    bad = done = 0
    while done < args.runs:
        cs = rng.choice([1, 1, 2, 3, 4])
        nsub = rng.randint(1, 5)
        hi = min(14 if args.nbar else 16, (XSLOTS // 2 + 1) * nsub - 1)
        if args.gp:
            if 2 * nsub > hi or (args.violate and nsub < 2):
                continue
            R = 2 * nsub - 1 if args.violate else rng.randint(2 * nsub, hi)
        elif args.violate and args.nbar:
            R = rng.randint(nsub + 1, hi)
        elif args.violate:
            if (XSLOTS // 2 + 1) * nsub > 16:
                continue
            R = (XSLOTS // 2 + 1) * nsub
        else:
            R = rng.randint(nsub + 1, hi)
        cfg = (cs, R, nsub, rng.randint(1, 4), rng.randint(1, 40), rng.randint(1, 3), rng.choice([0.0, 0.3, 1.0]))
        try:
            r = run(rng, *cfg, nbar=args.nbar, nowait=args.violate and args.nbar, gp=args.gp, single_jw=args.single_jw)
        except AssertionError as e:
            r = f"assertion: {e}"
        done += 1
        if r != "ok":
            bad += 1
            if bad <= 5:
                print("cs R nsub sub rows ngw p_ignored =", cfg, "->", r)
    expect_bad = args.violate or (args.gp and args.single_jw)
    what = (" (the producer does not wait: failures expected)" if args.nbar
            else " (one jw buffer: failures expected)" if args.single_jw and not args.violate
            else " (R = 2 nsub - 1: failures expected)" if args.gp
            else " (R past the bound: failures expected)") if expect_bad else ""
    flags = "".join(f" --{f}" for f, on in (("nbar", args.nbar), ("gp", args.gp), ("single-jw", args.single_jw)) if on)
    print(f"ring_protocol_model{flags}: {done} runs, {bad} bad{what}")
    ok = bad > 0 if expect_bad else bad == 0
    print("overall okay:", int(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
