#!/usr/bin/env python3
"""lovasz_v2_model.py — a numpy model of the index arithmetic of src/cuda/lovasz.cu's v2 Jaccard pass
(FUSEDLOSS_LOVASZ_JAC=2: lv_count, lv_prep, lv_jaccard2, lv_flush), checked against the default pass
(lv_segments + lv_jaccard: a scan of the fg bits, one direct store a position) on random shapes.

What it models, as the kernels do it:
  - the sorted arrays as the default sort leaves them: segment s = set C + c holds L positions, its
    valid pixels by decreasing error (ties by pixel), then its ignored pixels; values pack
    (s << (jb + 1)) | (j << 1) | fg;
  - G_s counted from the labels, base_s = exclusive prefix of G (lv_prep);
  - tiles of TILE = 256 x 16 positions; each thread's exclusive fg count = its tile's prefix (the
    look-back: the fg bits of all earlier tiles) + the earlier threads of its tile; the running
    segment / rank (s, r) stepped item by item;
  - with buckets: local bucket lb = (s - s_lo) nb + (j >> bits), ranks in a bucket handed out in a
    random order (shared-memory atomics), b_off = exclusive scan of the counts, one cursor atomic a
    (tile, bucket) taken in a random tile order, b_dst, the staging arrays, the runs' destinations;
    lv_flush per bucket: the window, the mask, the pixel order out.
Checks: every valid (class, pixel) gets the default pass's rank count A and position k (so the same
D bit for bit), from the same sorted position; no bucket overflows its region (cursor <= its pixels);
R <= LV_LB_MAX whenever the host takes the bucketed path; ignored pixels are never written.
--violate drops the look-back (each tile's prefix taken as 0): the model must then fail.

    python3 scripts/lovasz_v2_model.py [--cases 300] [--seed 1] [--violate]
"""
import argparse
import sys

import numpy as np

THREADS, ITEMS = 256, 16
TILE = THREADS * ITEMS
LB_MAX, BB_MIN, BB_MAX = 512, 5, 13


def bits_of(n):
    b = 0
    while (1 << b) < n:
        b += 1
    return b


def make_case(rng):
    N = int(rng.integers(1, 4))
    C = int(rng.choice([1, 2, 5, 19]))
    d = int(rng.choice([1, 7, 64, 1000, 4099, 5000, 20000]))
    per_image = bool(rng.integers(0, 2))
    P = N * d
    nsets = N if per_image else 1
    L = d if per_image else P
    lab = rng.integers(0, C, P)
    ign = rng.random(P) < rng.choice([0.0, 0.3, 1.0 if rng.random() < 0.05 else 0.1])
    lab[ign] = -1
    # errors on a coarse grid: many ties (ordered by pixel index, as the stable sorts do)
    err = rng.integers(0, 64, (C, P))
    return dict(N=N, C=C, d=d, per_image=per_image, P=P, nsets=nsets, L=L, S=nsets * C, E=nsets * C * L,
                lab=lab, err=err)


def sorted_arrays(cs):
    """keys (error rank, bigger = later) and packed values in the default sort's order"""
    C, L, S, jb = cs["C"], cs["L"], cs["S"], bits_of(cs["L"])
    keys = np.empty(cs["E"], np.int64)
    vals = np.empty(cs["E"], np.int64)
    for s in range(S):
        st, c = divmod(s, C)
        j = np.arange(L)
        i = st * cs["d"] + j if cs["per_image"] else j
        y = cs["lab"][i]
        valid = y >= 0
        fg = (y == c) & valid
        k = np.where(valid, 1000 - cs["err"][c, i], 10**9)   # decreasing error, ignored last
        order = np.lexsort((j, k))                           # ties by pixel index
        keys[s * L:(s + 1) * L] = k[order]
        vals[s * L:(s + 1) * L] = (s << (jb + 1)) | (j[order] << 1) | fg[order].astype(np.int64)
    return keys, vals, jb


def default_pass(cs, vals, jb):
    """lv_segments + lv_jaccard: (A, k) a valid (c, i), from the scan"""
    C, L, S = cs["C"], cs["L"], cs["S"]
    fgb = vals & 1
    scan = np.cumsum(fgb)
    out = {}
    G = np.zeros(S, np.int64)
    V = np.zeros(S, np.int64)
    for s in range(S):
        p0 = s * L
        b = scan[p0 - 1] if p0 > 0 else 0
        G[s] = scan[p0 + L - 1] - b
    for st in range(cs["nsets"]):
        V[st * C:(st + 1) * C] = G[st * C:(st + 1) * C].sum()
    for pos in range(cs["E"]):
        s, r = divmod(pos, L)
        if r >= V[s]:
            continue
        b = scan[s * L - 1] if s > 0 else 0
        A = scan[pos] - b
        j = (vals[pos] >> 1) & ((1 << jb) - 1)
        st, c = divmod(s, C)
        i = st * cs["d"] + j if cs["per_image"] else j
        out[(c, int(i))] = (int(A), r + 1, pos)
    return out, G, V


def v2_pass(cs, vals, jb, rng, bits, violate):
    C, L, S, E = cs["C"], cs["L"], cs["S"], cs["E"]
    # lv_count + lv_prep
    G = np.zeros(S, np.int64)
    for p in range(cs["P"]):
        y = cs["lab"][p]
        if y < 0:
            continue
        st = p // cs["d"] if cs["per_image"] else 0
        G[st * C + y] += 1
    base = np.concatenate([[0], np.cumsum(G)[:-1]])
    V = np.zeros(S, np.int64)
    for st in range(cs["nsets"]):
        V[st * C:(st + 1) * C] = G[st * C:(st + 1) * C].sum()
    # host: bucket decision
    nb = (L + (1 << bits) - 1) >> bits
    segs = min(S, (TILE - 1) // L + 2)
    bkt = segs * nb <= LB_MAX
    ntiles = (E + TILE - 1) // TILE
    fgb = np.zeros(ntiles * TILE, np.int64)
    fgb[:E] = vals & 1
    vpad = np.zeros(ntiles * TILE, np.int64)
    vpad[:E] = vals
    out = {}
    cur = np.zeros(S * nb, np.int64)
    tiles_staged = []
    prefix = 0   # the look-back: fg bits of all earlier tiles
    for t in range(ntiles):
        t0 = t * TILE
        s_lo = t0 // L
        s_hi = min(t0 + TILE - 1, E - 1) // L
        R = (s_hi - s_lo + 1) * nb
        if bkt:
            assert R <= LB_MAX, (R, segs, nb)
        cnt = fgb[t0:t0 + TILE].reshape(THREADS, ITEMS).sum(1)
        ex = np.concatenate([[0], np.cumsum(cnt)[:-1]]) + (0 if violate else prefix)
        prefix += int(cnt.sum())
        entries = []   # (thread, item, lb, gv-id)
        for th in range(THREADS):
            p0 = t0 + th * ITEMS
            run = int(ex[th])
            s, r = divmod(p0, L)
            for it in range(ITEMS):
                pos = p0 + it
                fg = int(fgb[pos])
                run += fg
                if pos < E and r < V[s]:
                    A = run - base[s]
                    j = (int(vpad[pos]) >> 1) & ((1 << jb) - 1)
                    st, c = divmod(s, C)
                    i = st * cs["d"] + j if cs["per_image"] else j
                    rec = (int(A), r + 1, pos)
                    if bkt:
                        lb = (s - s_lo) * nb + (j >> bits)
                        assert lb < R
                        entries.append((lb, j & ((1 << bits) - 1), rec, (c, int(i))))
                    else:
                        assert (c, int(i)) not in out
                        out[(c, int(i))] = rec
                r += 1
                if r == L:
                    r, s = 0, s + 1
        if bkt:
            tiles_staged.append((t, s_lo, R, entries))
    if bkt:
        # ranks by shared-memory atomics (any order), cursors by global atomics (any tile order)
        win = {}
        for (t, s_lo, R, entries) in [tiles_staged[k] for k in rng.permutation(len(tiles_staged))]:
            b_cnt = np.zeros(R, np.int64)
            ranks = [0] * len(entries)
            for e in rng.permutation(len(entries)):
                lb = entries[e][0]
                ranks[e] = b_cnt[lb]
                b_cnt[lb] += 1
            assert b_cnt.max(initial=0) < (1 << 16) and R < (1 << 16)
            b_off = np.concatenate([[0], np.cumsum(b_cnt)[:-1]])
            total = int(b_cnt.sum())
            b_dst = np.zeros(R, np.int64)
            for q in range(R):
                if b_cnt[q] > 0:
                    sq, bq = s_lo + q // nb, q % nb
                    got = cur[sq * nb + bq]
                    cur[sq * nb + bq] += b_cnt[q]
                    b_dst[q] = sq * L + (bq << bits) + got - b_off[q]
            st_lb = np.full(total, -1)
            st_jl = np.zeros(total, np.int64)
            st_rec = [None] * total
            for e, (lb, jl, rec, key) in enumerate(entries):
                at = b_off[lb] + ranks[e]
                assert st_lb[at] == -1
                st_lb[at], st_jl[at], st_rec[at] = lb, jl, (rec, key)
            for k in range(total):
                dst = int(b_dst[st_lb[k]] + k)
                assert 0 <= dst < E and dst not in win
                win[dst] = (st_jl[k], st_rec[k])
        # lv_flush
        for gb in range(S * nb):
            s, b = divmod(gb, nb)
            lo = b << bits
            npx = min(L - lo, 1 << bits)
            n = int(cur[gb])
            assert n <= npx, ("bucket overflow", gb, n, npx)
            reg = s * L + lo
            seen = set()
            for e in range(n):
                jl, (rec, key) = win[reg + e]
                assert jl < npx and jl not in seen
                seen.add(jl)
                st, c = divmod(s, C)
                j = lo + jl
                i = st * cs["d"] + j if cs["per_image"] else j
                assert key == (c, int(i)), (key, (c, i))
                assert key not in out
                out[key] = rec
    return out, G, V, bkt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--violate", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    bad = nb_cases = 0
    for n in range(args.cases):
        cs = make_case(rng)
        keys, vals, jb = sorted_arrays(cs)
        ref, G0, V0 = default_pass(cs, vals, jb)
        bits = int(rng.integers(BB_MIN, BB_MAX + 1))
        try:
            got, G1, V1, bkt = v2_pass(cs, vals, jb, rng, bits, args.violate)
            nb_cases += bkt
            ok = np.array_equal(G0, G1) and np.array_equal(V0, V1) and got == ref
            why = "" if ok else f"{sum(1 for k in ref if got.get(k) != ref[k])} of {len(ref)} entries differ"
        except AssertionError as e:
            ok, why = False, f"assertion {e}"
        if not ok:
            bad += 1
            if bad <= 5:
                print(f"case {n}: N {cs['N']} C {cs['C']} d {cs['d']} per_image {cs['per_image']} bits {bits}: {why}")
    print(f"lovasz_v2_model: {args.cases} cases ({nb_cases} bucketed), {bad} bad" + (" (--violate)" if args.violate else ""))
    if args.violate:
        return 0 if bad > 0 else 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
