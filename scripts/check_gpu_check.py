#!/usr/bin/env python3
"""check_gpu_check.py - every step command of scripts/gpu_check.sh parses on its own.

gpu_check.sh passes each step to `bash -c` as one single-quoted string (run_step NAME CAP '...').
An apostrophe inside such a string (in a comment, say "the ring's") ends it early: the outer script
still parses (`bash -n scripts/gpu_check.sh` passes), but the step's command is cut and fails at once
with "unexpected end of file". The zoo step was broken that way from session 21 to session 28 and
nothing noticed. This script finds every run_step string (the opening quote ends its line and the
closing quote stands alone on a later line, or both quotes are on one line), refuses any apostrophe
inside it, runs `bash -n` on its text, and checks the programs it names as check_tasks.py checks task lists
(build/<name> and bench/ or scripts/ Python scripts exist and know each --flag given). Exit status 1 on any problem.

  python3 scripts/check_gpu_check.py [path]     # default scripts/gpu_check.sh
  python3 scripts/check_gpu_check.py --selftest # shows that a planted apostrophe is caught
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_tasks as ct  # noqa: E402  (its program and option rules, shared)

OPEN = re.compile(r"^\s*run_step\s+(\S+)\s+\S+\s+'(.*)$")


def steps(lines):
    """(name, first line number, body, problems) for each run_step string."""
    out = []
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        name, rest = m.group(1), m.group(2)
        start = i + 1
        probs = []
        if rest.strip() == "":   # multi-line: the body runs to a line holding only the closing quote
            j = i + 1
            while j < len(lines) and lines[j].strip() != "'":
                if "'" in lines[j]:
                    probs.append(f"line {j + 1}: an apostrophe inside the step string ends it early: {lines[j].strip()[:90]}")
                j += 1
            if j == len(lines):
                probs.append("no closing quote on a line of its own")
            body = "\n".join(lines[i + 1:j])
            i = j + 1
        else:                    # one line: exactly one more quote, at its end
            if rest.count("'") != 1 or not rest.rstrip().endswith("'"):
                probs.append("a one-line step string must hold no apostrophe and end with its closing quote")
            body = rest.rstrip()[:-1]
            i += 1
        out.append((name, start, body, probs))
    return out


def options(body):
    """problems with the programs a step runs: build/<name> without a source or Makefile rule, a --flag its source
    does not know, a bench/ or scripts/ Python script that is missing or lacks a --flag (check_tasks.py's rules,
    line by line; names built from shell variables, such as build/$t, are not checked)"""
    probs = []
    for line in body.split("\n"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            tokens = shlex.split(line.replace(";", " ; ").replace("|", " | "), posix=True)
        except ValueError:
            continue   # a quote that spans lines: not checked
        probs.extend(ct.program_problems(tokens))
    return probs


def check(path):
    lines = open(path).read().split("\n")
    found = steps(lines)
    bad = 0
    for name, start, body, probs in found:
        probs.extend(options(body))
        with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
            f.write(body + "\n")
            f.flush()
            r = subprocess.run(["bash", "-n", f.name], capture_output=True, text=True)
        if r.returncode != 0:
            probs.append("bash -n: " + r.stderr.strip().replace(f.name, "<step>")[:200])
        for p in probs:
            print(f"{path}:{start}: step {name}: {p}")
            bad += 1
    print(f"check_gpu_check: {len(found)} step strings, {bad} problems")
    return bad == 0 and len(found) > 0


def selftest():
    src = ("run_step ok 10 '\n    echo fine\n'\n"
           "run_step broken 10 '\n    # the ring's default\n    echo x\n'\n"
           "run_step one 10 'echo one'\n")
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as f:
        f.write(src)
        f.flush()
        lines = src.split("\n")
        res = {n: p for n, _, _, p in steps(lines)}
    ok = not res["ok"] and res["broken"] and not res["one"]
    print("selftest:", "the planted apostrophe is caught" if ok else "FAILED to catch the planted apostrophe")
    good = options("build/test_cross_entropy_cuda --small --stride 2")
    planted = options("build/test_cross_entropy_cuda --no-such-flag\nbuild/no_such_program")
    ok2 = not good and len(planted) == 2
    print("selftest:", "the planted option and program are caught" if ok2 else f"FAILED on options: {good} {planted}")
    return ok and ok2


if __name__ == "__main__":
    if "--selftest" in sys.argv[1:]:
        sys.exit(0 if selftest() else 1)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    sys.exit(0 if check(args[0] if args else "scripts/gpu_check.sh") else 1)
