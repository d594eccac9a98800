#!/usr/bin/env python3
"""sass_diff.py — per-function SASS comparison of two CUDA objects (or .sass dumps), addresses and
encodings stripped: which kernels a change left byte-identical and which it touched.

    python3 scripts/sass_diff.py OLD.o NEW.o [--arch sm_90] [--show NAME_SUBSTRING] [--rename PAT=REPL]

--rename applies re.sub(PAT, REPL) to the OLD side's function names (repeatable): a kernel that gained
a template parameter is compared with its old self, e.g. the KL ring's HD flag (session 18):
    --rename '(distill_pipe_kernel.*?Lb[01]E)(Ev5DArgs)=\1Lb0E\2'

Needs cuobjdump + nvdisasm on PATH (the build machine's CUDA 13 toolkit has neither: pip download
nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels and unzip them; NOTES.md "Session 15").
Prints: functions only in one side, and for common ones 'same' / 'DIFF (n -> m instructions)'.
"""
import argparse
import re
import subprocess
import sys


def functions(path, arch):
    if path.endswith(".sass"):
        text = open(path).read()
    else:
        text = subprocess.run(["cuobjdump", "-sass", "-arch", arch, path], check=True, capture_output=True,
                              text=True).stdout
    funcs, name, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                funcs[name] = body
            name, body = m.group(1), []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if name and m:
            body.append(re.sub(r"\s+", " ", m.group(1)))
    if name:
        funcs[name] = body
    return funcs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--show", default=None, help="print a unified diff of functions whose name contains this")
    ap.add_argument("--rename", action="append", default=[], help="PAT=REPL: re.sub on the old side's names")
    a = ap.parse_args()
    old, new = functions(a.old, a.arch), functions(a.new, a.arch)
    for r in a.rename:
        pat, repl = r.split("=", 1)
        old = {re.sub(pat, repl, n): body for n, body in old.items()}
    same = diff = 0
    for n in sorted(set(old) | set(new)):
        if n not in old:
            print(f"only new: {n} ({len(new[n])} instructions)")
        elif n not in new:
            print(f"only old: {n}")
        elif old[n] == new[n]:
            same += 1
        else:
            diff += 1
            print(f"DIFF ({len(old[n])} -> {len(new[n])} instructions): {n}")
            if a.show and a.show in n:
                import difflib
                sys.stdout.writelines(difflib.unified_diff([l + "\n" for l in old[n]], [l + "\n" for l in new[n]],
                                                           "old", "new", n=2))
    print(f"{same} identical, {diff} different, {len(set(new) - set(old))} new, {len(set(old) - set(new))} removed")


if __name__ == "__main__":
    main()
