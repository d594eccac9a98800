#!/usr/bin/env python3
"""check_tasks.py — pre-flight of the device task lists (scripts/device_tasks.sh input): what a typo would
otherwise cost is a device run, and the device is scarce.

For each task line "<seconds> <command>" of the given files (default: scripts/tasks/next-*.txt):
  - the seconds are an integer in [1, 600], and the command parses (bash -n);
  - every FUSEDLOSS_* knob it sets is read somewhere under src/ or python/ (a misspelt knob does nothing,
    silently);
  - every build/<name> it runs has a source (tests/<name>.c*, bench/<name>.c*) or a Makefile rule, and every
    --flag given to it appears in that source;
  - every bench/ or scripts/ Python script it runs exists and defines each --flag given to it, and each name
    given to its --cases is in its module-level CASES.
Also every FUSEDLOSS_* knob scripts/gpu_check.sh sets. Exit 1 with one line per problem; 0 when all is clean.

    python3 scripts/check_tasks.py [LIST ...]
"""
import ast
import glob
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEPARATORS = {";", "|", "||", "&&", "&", ">", ">>", "2>&1", "<", "do", "done", "then", "fi", "(", ")"}


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def knob_sources():
    text = []
    for pat in ("src/**/*.c", "src/**/*.cu", "src/**/*.cuh", "src/**/*.h", "python/**/*.py", "include/*.h"):
        for p in glob.glob(os.path.join(REPO, pat), recursive=True):
            text.append(read(p))
    return "\n".join(text)


def knob_known(knob, text):
    """the knob's name as a literal, or composed as the rings compose theirs: a "FUSEDLOSS_<loss>_PIPE"
    prefix literal and a "<suffix>" literal (ringrow.cuh's rr_knob(prefix, "NBAR", ...))"""
    if knob in text:
        return True
    parts = knob.split("_")
    for k in range(2, len(parts)):
        if f'"{"_".join(parts[:k])}"' in text and f'"{"_".join(parts[k:])}"' in text:
            return True
    return False


def binary_source(name):
    for pat in (f"tests/{name}.c", f"tests/{name}.cu", f"bench/{name}.c", f"bench/{name}.cu"):
        p = os.path.join(REPO, pat)
        if os.path.exists(p):
            return p
    return None


def flags_after(tokens, k):
    """the --flags of the command whose program is tokens[k], up to a shell separator"""
    out = []
    for t in tokens[k + 1:]:
        if t in SEPARATORS or t.startswith((">", "2>", "|", ";")):
            break
        if t.startswith("--"):
            out.append(t.split("=", 1)[0])
    return out


def check_line(where, secs, cmd, knobs_text, problems):
    if not secs.isdigit() or not 1 <= int(secs) <= 600:
        problems.append(f"{where}: the time limit {secs!r} is not an integer in [1, 600]")
    r = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True)
    if r.returncode != 0:
        problems.append(f"{where}: bash -n: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else 'fails'}")
    for knob in sorted(set(re.findall(r"\b(FUSEDLOSS_[A-Z0-9_]+)=", cmd))):
        if not knob_known(knob, knobs_text):
            problems.append(f"{where}: knob {knob} is read nowhere under src/, python/ or include/")
    try:
        tokens = shlex.split(cmd.replace(";", " ; ").replace("|", " | "), posix=True)
    except ValueError as e:
        problems.append(f"{where}: cannot tokenise: {e}")
        return
    problems.extend(f"{where}: {q}" for q in program_problems(tokens))


def program_problems(tokens):
    """problems with the programs a tokenised command runs: build/<name> without a tests/ or bench/ source or a
    Makefile rule, a --flag its source does not mention, a bench/ or scripts/ Python script that is missing or
    defines no such --flag (also used by check_gpu_check.py on gpu_check.sh's steps)"""
    out = []
    for k, t in enumerate(tokens):
        m = re.fullmatch(r"(?:\./)?build/([A-Za-z0-9_]+)", t)
        if m:
            name = m.group(1)
            src = binary_source(name)
            if src is None:
                if not re.search(rf"\b{name}\b", read(os.path.join(REPO, "Makefile"))):
                    out.append(f"build/{name}: no tests/ or bench/ source and no Makefile rule")
                continue
            text = read(src)
            for fl in flags_after(tokens, k):
                if not re.search(rf"(?<![\w-]){re.escape(fl)}(?![\w-])", text):
                    out.append(f"build/{name} has no option {fl} ({os.path.relpath(src, REPO)})")
            continue
        m = re.fullmatch(r"(?:\./)?((?:bench|scripts)/[A-Za-z0-9_]+\.py)", t)
        if m and k > 0 and os.path.basename(tokens[k - 1]).startswith("python"):
            path = os.path.join(REPO, m.group(1))
            if not os.path.exists(path):
                out.append(f"{m.group(1)} does not exist")
                continue
            text = read(path)
            for fl in flags_after(tokens, k):
                if f'"{fl}"' not in text and f"'{fl}'" not in text:
                    out.append(f"{m.group(1)} defines no option {fl}")
            known = script_cases(text)
            for j in range(k + 1, len(tokens) - 1):
                if tokens[j] in SEPARATORS:
                    break
                if tokens[j] == "--cases" and known is not None:
                    for c in tokens[j + 1].split(","):
                        if c and c not in known:
                            out.append(f"{m.group(1)} has no case {c} (its CASES: {', '.join(sorted(known))})")
    return out


def script_cases(text):
    """The names in a bench script's module-level CASES (a list / tuple of strings, or a dict's string keys), or
    None. (s44 run 1 lost a task to `--cases kl,jsd` where bench_distill.py calls the KL case kl_t2.)"""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CASES" for t in node.targets):
            v = node.value
            items = v.keys if isinstance(v, ast.Dict) else v.elts if isinstance(v, (ast.List, ast.Tuple)) else []
            names = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            return names or None
    return None


def main():
    lists = sys.argv[1:] or sorted(glob.glob(os.path.join(REPO, "scripts/tasks/next-*.txt")))
    knobs_text = knob_sources()
    problems, n = [], 0
    for path in lists:
        for ln, line in enumerate(read(path).splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            secs, _, cmd = line.partition(" ")
            n += 1
            check_line(f"{os.path.relpath(path, REPO)}:{ln}", secs, cmd, knobs_text, problems)
    # the knobs gpu_check.sh sets (its steps are not task lines, but a misspelt knob there is as silent)
    for path in (os.path.join(REPO, "scripts/gpu_check.sh"),):
        if os.path.exists(path):
            for ln, line in enumerate(read(path).splitlines(), 1):
                for knob in sorted(set(re.findall(r"\b(FUSEDLOSS_[A-Z0-9_]+)=", line))):
                    if not knob_known(knob, knobs_text):
                        problems.append(f"{os.path.relpath(path, REPO)}:{ln}: knob {knob} is read nowhere")
    for p in problems:
        print(p)
    print(f"check_tasks: {len(lists)} lists, {n} tasks, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
