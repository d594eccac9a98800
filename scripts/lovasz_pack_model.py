#!/usr/bin/env python3
"""lovasz_pack_model.py — a numpy model of FUSEDLOSS_LOVASZ_SORT=3 in src/cuda/lovasz.cu (lv_pack,
lv_unpack and the packed keys' sort), checked against the default 32-bit path on random cases.

The default path (SORT=2) writes at position s L + j a 32-bit error key kq (0 for a NaN error,
0x7FFFFFFF - bits(e) for e >= 0, 0xFFFFFFFF for an ignored pixel) and a value
vq = (s << (jb + 1)) | (j << 1) | fg; it sorts stably by kq (pass A), then stably by the segment
field of vq (pass B). SORT=3 packs both into one 64-bit key [s | k31 | j | fg] and sorts it stably by
bits [jb + 1, jb + 32 + sbits). Checks: lv_unpack(lv_pack(kq, vq)) == (kq, vq) for every element,
and the two sorts give the same permutation (so the Jaccard passes see the same arrays). The errors
include 0, 1, values above 1, +inf, NaN, subnormals and ties (equal errors in one segment).
--violate maps k31 = kq - 0x007FFFFF (+inf then collides with NaN): the model must then fail.

    python3 scripts/lovasz_pack_model.py [--cases 200] [--seed 1] [--violate]
"""
import argparse
import sys

import numpy as np

M32 = 0xFFFFFFFF


def bits_of(n):
    b = 0
    while (1 << b) < n:
        b += 1
    return b


def kq_of(e, ignored):
    """the default path's 32-bit error key (lv_keys)"""
    bits = e.astype(np.float32).view(np.uint32).astype(np.uint64)
    k = np.where(np.isnan(e), 0, 0x7FFFFFFF - bits)
    return np.where(ignored, M32, k).astype(np.uint64)


def pack(kq, vq, jb, violate):
    sub = 0x007FFFFF if violate else 0x007FFFFE
    k31 = np.where(kq == 0, 0, np.where(kq == M32, 0x7F800002, kq - sub)).astype(np.uint64)
    low = vq & np.uint64((2 << jb) - 1)
    return ((vq >> np.uint64(jb + 1)) << np.uint64(jb + 32)) | (k31 << np.uint64(jb + 1)) | low


def unpack(w, jb):
    k31 = (w >> np.uint64(jb + 1)) & np.uint64(0x7FFFFFFF)
    kq = np.where(k31 == 0, 0, np.where(k31 == 0x7F800002, M32, k31 + 0x007FFFFE)).astype(np.uint64)
    vq = ((w >> np.uint64(jb + 32)) << np.uint64(jb + 1)) | (w & np.uint64((2 << jb) - 1))
    return kq, vq


def make_case(rng):
    S = int(rng.choice([1, 2, 5, 19, 76, 300]))
    L = int(rng.integers(1, 400))
    E = S * L
    kind = rng.integers(0, 4)
    if kind == 0:     # probabilities' errors in [0, 1] on a coarse grid: many ties
        e = rng.integers(0, 17, E) / 16.0
    elif kind == 1:   # any fp32 in [0, 1]
        e = rng.random(E)
    else:             # user "probabilities" outside [0, 1], specials
        e = np.abs(rng.normal(0, 3, E))
        sp = rng.random(E)
        e[sp < 0.05] = np.inf
        e[(sp >= 0.05) & (sp < 0.10)] = np.nan
        e[(sp >= 0.10) & (sp < 0.15)] = 0.0
        e[(sp >= 0.15) & (sp < 0.18)] = 1e-42   # subnormal
        e[(sp >= 0.18) & (sp < 0.20)] = 1.0
    e = e.astype(np.float32)
    ignored = rng.random(E) < (0.2 if rng.random() < 0.5 else 0.0)
    fg = (rng.random(E) < 0.3).astype(np.uint64)
    return S, L, e, ignored, fg


def run_case(rng, violate):
    S, L, e, ignored, fg = make_case(rng)
    jb, sb = bits_of(L), bits_of(S)
    if 1 + jb + sb > 32:
        return True
    pos = np.arange(S * L, dtype=np.uint64)
    s = pos // np.uint64(L)
    j = pos - s * np.uint64(L)
    kq = kq_of(e, ignored)
    vq = (s << np.uint64(jb + 1)) | (j << np.uint64(1)) | fg
    # the default path: stable by kq, then stable by the segment field of vq
    a = np.argsort(kq, kind="stable")
    order_default = a[np.argsort((vq[a] >> np.uint64(jb + 1)), kind="stable")]
    # SORT=3
    w = pack(kq, vq, jb, violate)
    key = (w >> np.uint64(jb + 1)) & np.uint64((1 << (31 + sb)) - 1)
    order_packed = np.argsort(key, kind="stable")
    k2, v2 = unpack(w, jb)
    ok_round = bool(np.all(k2 == kq) and np.all(v2 == vq))
    ok_order = bool(np.array_equal(order_default, order_packed))
    ok_bits = bool(np.all(w >> np.uint64(jb + 32 + sb) == 0))   # nothing above the sorted range
    return ok_round and ok_order and ok_bits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--violate", action="store_true")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    bad = sum(not run_case(rng, a.violate) for _ in range(a.cases))
    print(f"lovasz_pack_model: {a.cases} cases, {bad} bad{' (--violate: must be > 0)' if a.violate else ''}")
    if a.violate:
        sys.exit(0 if bad > 0 else 1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
