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


def run(rng, cs, R, nsub, sub, rows, ngw, p_ignored, nbar=False, nowait=False):
    per = nsub * sub
    nv = per * cs - rng.randrange(0, per // 2 + 1) if cs > 1 else per
    ignored = [rng.random() < p_ignored for _ in range(rows)]
    ctas = []
    for rank in range(cs):
        n = max(0, min(per, nv - rank * per))
        ctas.append(dict(rank=rank, n=n, full=[Barrier(1) for _ in range(R)], empty=[Barrier(ngw) for _ in range(R)],
                         hb=[HwBarrier(ngw + 1) for _ in range(R)],
                         xbar=[Barrier(1) for _ in range(XSLOTS)], slot=[None] * R,
                         xs=[[None] * cs for _ in range(XSLOTS)]))
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

    actors = []
    for c in ctas:
        actors += [producer(c), statistics(c)] + [gradient(c) for _ in range(ngw)]
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
    args = ap.parse_args()
    rng = random.Random(args.seed)
    bad = done = 0
    while done < args.runs:
        cs = rng.choice([1, 1, 2, 3, 4])
        nsub = rng.randint(1, 5)
        hi = min(14 if args.nbar else 16, (XSLOTS // 2 + 1) * nsub - 1)
        if args.violate and args.nbar:
            R = rng.randint(nsub + 1, hi)
        elif args.violate:
            if (XSLOTS // 2 + 1) * nsub > 16:
                continue
            R = (XSLOTS // 2 + 1) * nsub
        else:
            R = rng.randint(nsub + 1, hi)
        cfg = (cs, R, nsub, rng.randint(1, 4), rng.randint(1, 40), rng.randint(1, 3), rng.choice([0.0, 0.3, 1.0]))
        try:
            r = run(rng, *cfg, nbar=args.nbar, nowait=args.violate and args.nbar)
        except AssertionError as e:
            r = f"assertion: {e}"
        done += 1
        if r != "ok":
            bad += 1
            if bad <= 5:
                print("cs R nsub sub rows ngw p_ignored =", cfg, "->", r)
    what = (" (the producer does not wait: failures expected)" if args.nbar else " (R past the bound: failures expected)") \
        if args.violate else ""
    print(f"ring_protocol_model{' --nbar' if args.nbar else ''}: {done} runs, {bad} bad{what}")
    ok = bad > 0 if args.violate else bad == 0
    print("overall okay:", int(ok))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
