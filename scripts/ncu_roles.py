#!/usr/bin/env python3
"""ncu_roles.py — split a warp-specialised ring kernel's ncu stall samples by role (producer, statistics,
gradient), from the control flow of its SASS, so that a device run's profile says which role waits on what.

    python3 scripts/ncu_roles.py PROFILE.csv [--top 12]     # ncu ... --section SourceCounters --page source
                                                            #   --print-source sass --csv > PROFILE.csv
    python3 scripts/ncu_roles.py KERNEL.sass                # cuobjdump -sass -fun NAME OBJ > KERNEL.sass:
                                                            #   the role split alone (no samples)

How: basic blocks from the branch targets, the control-flow graph's strongly connected components (Tarjan),
and each role's row loop is one component holding its anchor: the producer's bulk copy (UBLKCP), the
statistics group's named barrier 1 (BAR.SYNC ... 0x1) or, with the WX exchange, its st.async sends (STAS) in a
loop without global stores, and for the gradient group the largest remaining
component with global stores (STG). Instructions outside those loops are 'setup' (before the first role
loop) or 'other'. The s8 per-role profile of the CE ring was mapped by hand (bench/results/
2026-12-03-h200-s8-run1/ncu-roles-*.txt); this does the same for any of the ring kernels (session 18,
written for scripts/tasks/next-s19-run1.txt's ncu of the KL ring).
Samples are warp-time: a role's share also reflects how many warps it has.
SPDX-License-Identifier: MIT
"""
import argparse
import csv
import gzip
import re
import sys
from collections import defaultdict

# a branch's target: its last hex operand (BRA 0x..., BRA.DIV UR4, 0x..., BRA.U.ANY 0x..., CALL.REL.NOINC 0x...)
BRA = re.compile(r"\b(?:BRA|BRX|JMP|CALL)\S*\s+(?:[^;]*?,\s*)?(0x[0-9a-f]+)", re.I)
ENDS = re.compile(r"\b(?:EXIT|RET|BRA|BRX|JMP|BPT\.TRAP)\b")


def parse_sass(path):
    """[(addr, text, {}), ...] from a cuobjdump listing."""
    out = []
    for line in open(path):
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip(), {}))
    return out


EXEC = "Instructions Executed"


def parse_csv(path):
    """[(addr, text, {column: samples}), ...] from ncu's source page (SASS, --csv). Addresses and branch
    targets may be absolute: both are made relative to the first instruction."""
    f = gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")
    rows = list(csv.reader(f))
    head = None
    for i, r in enumerate(rows):
        if any(c.strip().strip("#").strip() == "Address" for c in r) and any(c.strip() == "Source" for c in r):
            head = i
            break
    if head is None:
        sys.exit(f"{path}: no header with 'Address' and 'Source' (ncu --page source --print-source sass --csv?)")
    cols = [c.strip().strip("#").strip() for c in rows[head]]
    ia, isrc = cols.index("Address"), cols.index("Source")
    # the stall samples, and the warp instructions each line executed (where the page has them: where a role's
    # issue goes, beside where its time goes)
    samp = [j for j, c in enumerate(cols) if "Sampl" in c or c.lower().startswith("stall") or c == EXEC]
    out = []
    for r in rows[head + 1:]:
        if len(r) <= max(ia, isrc):
            continue
        try:
            a = int(r[ia].strip(), 16)
        except ValueError:
            continue
        s = {}
        for j in samp:
            try:
                s[cols[j]] = float(r[j] or 0)
            except ValueError:
                pass
        out.append((a, r[isrc].strip().rstrip(";"), s))
    if not out:
        sys.exit(f"{path}: no instructions")
    base = min(a for a, _, _ in out)
    fix = lambda t: BRA.sub(lambda m: m.group(0).replace(m.group(1), hex(int(m.group(1), 16) - base)), t) \
        if base else t
    return [(a - base, fix(t), s) for a, t, s in out]


def blocks(ins):
    """Basic blocks [(first, last) indices] and successor lists."""
    idx = {a: i for i, (a, _, _) in enumerate(ins)}
    starts = {0}
    for i, (a, t, _) in enumerate(ins):
        m = BRA.search(t)
        if m and int(m.group(1), 16) in idx:
            starts.add(idx[int(m.group(1), 16)])
        if ENDS.search(t) and i + 1 < len(ins):
            starts.add(i + 1)
    starts = sorted(starts)
    bl = [(s, (starts[k + 1] if k + 1 < len(starts) else len(ins)) - 1) for k, s in enumerate(starts)]
    of = {s: k for k, (s, _) in enumerate(bl)}
    succ = []
    for k, (s, e) in enumerate(bl):
        t = ins[e][1]
        nx = []
        m = BRA.search(t)
        if m and int(m.group(1), 16) in idx:
            nx.append(of[idx[int(m.group(1), 16)]])
        # no predicate and no condition (BRA.DIV / BRA.U.ANY fall through when not taken): no fall-through
        uncond = re.match(r"^(?:(?:BRA|JMP)\s+0x|EXIT\b|RET\b)", t) is not None
        if not uncond and k + 1 < len(bl):
            nx.append(k + 1)
        succ.append(nx)
    return bl, succ


def sccs(n, succ):
    """Tarjan's strongly connected components, iterative; [component id per node]."""
    index, low, comp = [None] * n, [0] * n, [-1] * n
    stack, on, counter, ncomp = [], [False] * n, 0, 0
    for root in range(n):
        if index[root] is not None:
            continue
        work = [(root, 0)]
        while work:
            v, pi = work.pop()
            if pi == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on[v] = True
            recurse = False
            for k in range(pi, len(succ[v])):
                w = succ[v][k]
                if index[w] is None:
                    work.append((v, k + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                if on[w]:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return comp


def roles(ins):
    """A role name per instruction."""
    bl, succ = blocks(ins)
    comp = sccs(len(bl), succ)
    members = defaultdict(list)
    for k, c in enumerate(comp):
        members[c].append(k)
    loops = {c: ks for c, ks in members.items() if len(ks) > 1 or k_self_loop(ks[0], succ)}
    text = lambda c: [ins[i][1] for k in loops[c] for i in range(bl[k][0], bl[k][1] + 1)]
    name = {}
    for c in loops:
        t = text(c)
        if any("UBLKCP" in x for x in t):
            name[c] = "producer"
        elif any(re.search(r"\bBAR\.SYNC\S*\s+0x1\b", x) for x in t):
            name[c] = "stats"
        elif any(re.search(r"\bSTAS\b", x) for x in t) and not any(re.search(r"\bSTG\b", x) for x in t):
            name[c] = "stats"   # the WX exchange (s34 on): no named barrier 1, the partials sent by st.async
    rest = [c for c in loops if c not in name and any(x.startswith("STG") or " STG" in x for x in text(c))]
    if rest:
        name[max(rest, key=lambda c: sum(bl[k][1] - bl[k][0] + 1 for k in loops[c]))] = "gradient"
    first = min((bl[k][0] for c in name for k in loops[c]), default=len(ins))
    out = []
    for k, (s, e) in enumerate(bl):
        r = name.get(comp[k], "setup" if s < first else "other")
        out += [r] * (e - s + 1)
    return out


def k_self_loop(k, succ):
    return k in succ[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("path")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    # the task lists keep the source page gzipped (*_source.csv.gz): read as it is
    ins = parse_csv(a.path) if a.path.endswith((".csv", ".csv.gz")) else parse_sass(a.path)
    rl = roles(ins)
    tot = defaultdict(float)
    per = defaultdict(lambda: defaultdict(float))
    count = defaultdict(int)
    main_col = None
    for (_, _, s), r in zip(ins, rl):
        count[r] += 1
        for col, v in s.items():
            per[r][col] += v
    if ins and ins[0][2]:
        cols = list(ins[0][2])
        main_col = next((c for c in cols if "All Samples" in c), next((c for c in cols if "Sampl" in c), cols[0]))
        for r in per:
            tot[r] = per[r][main_col]
    allt = sum(tot.values()) or 1.0
    alle = sum(per[r].get(EXEC, 0.0) for r in per) or 1.0
    for r in ("setup", "producer", "stats", "gradient", "other"):
        if r not in count:
            continue
        line = f"{r:9s} {count[r]:6d} instructions"
        if main_col:
            reasons = sorted(((v, c) for c, v in per[r].items()
                              if c not in (main_col, EXEC) and "Not-issued" not in c and v > 0), reverse=True)[:8]
            rs = " ".join(f"{c.replace('stall_', '')}={100 * v / (tot[r] or 1):.0f}%" for v, c in reasons)
            ex = per[r].get(EXEC, 0.0)
            if ex:
                line += f"   executed {ex / 1e6:8.1f} M ({100 * ex / alle:4.1f}%)"
            line += f"   samples {tot[r]:10.0f} ({100 * tot[r] / allt:4.1f}%)   {rs}"
        print(line)
    if main_col:
        print(f"\ntop {a.top} instructions by {main_col}:")
        top = sorted(((s.get(main_col, 0.0), addr, t, r) for (addr, t, s), r in zip(ins, rl)), reverse=True)[:a.top]
        for v, addr, t, r in top:
            print(f"{addr:06x} {r:9s} {100 * v / allt:5.1f}%  {t[:60]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
