#!/usr/bin/env python3
"""tests/emu/gpu_check_parts.py on made-up parts: it passes parts that ran
every unit and every check once, and fails each way a split can go wrong
(a share in no part or in two, parts that counted their units differently,
a part that died before its row, a check that ran in two parts)."""
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
script = os.path.join(root, "tests", "emu", "gpu_check_parts.py")
CHECKS_HEADER = "gpu,driver,cuda_runtime,git_commit,kernel,impl,shape,max_rel_err,tolerance,result\n"
PART_HEADER = "git_commit,first_share,last_share,shares,units,units_run,checks,failed\n"


def write_part(top, name, first, last, shares, units, units_run, checks, commit="abc1234", row=True):
    d = os.path.join(top, name)
    os.makedirs(d)
    with open(os.path.join(d, "checks.csv"), "w") as f:
        f.write(CHECKS_HEADER)
        for kernel, shape in checks:
            f.write(f'emu,-,-,{commit},"{kernel}",fast,"{shape}",1.0e-03,2.0e-03,PASS\n')
    with open(os.path.join(d, "part.csv"), "w") as f:
        f.write(PART_HEADER)
        if row:
            f.write(f"{commit},{first},{last},{shares},{units},{units_run},{len(checks)},0\n")
    return d


def run(case, parts, want_rc, want_text):
    with tempfile.TemporaryDirectory() as top:
        dirs = [write_part(top, f"p{i}", *p[:6], **(p[6] if len(p) > 6 else {})) for i, p in enumerate(parts)]
        r = subprocess.run([sys.executable, script] + dirs, capture_output=True, text=True)
        ok = r.returncode == want_rc and want_text in r.stdout
        print(f"{'ok  ' if ok else 'FAIL'} {case}: rc {r.returncode}: {r.stdout.strip()}")
        return ok


a = [("flash fwd O", "causal, T=64"), ("flash fwd lse", "causal, T=64")]
b = [("flash bwd dQ,dK,dV (+=)", "causal, T=64"), ("adamw m", "n=10000")]
cases = [
    ("two parts that cover everything", [(1, 2, 5, 10, 4, a), (3, 5, 5, 10, 6, b)], 0, "ran all 10 units once"),
    ("share 5 in no part", [(1, 2, 5, 10, 4, a), (3, 4, 5, 10, 4, b)], 1, "shares [5] of 5 are in no part"),
    ("share 2 in both parts", [(1, 2, 5, 10, 4, a), (2, 5, 5, 10, 6, b)], 1, "share 2 of 5 is in both"),
    ("units counted differently", [(1, 2, 5, 10, 4, a), (3, 5, 5, 11, 6, b)], 1, "differ in units"),
    ("units run fall short", [(1, 2, 5, 10, 3, a), (3, 5, 5, 10, 6, b)], 1, "ran 9 units between them, of 10"),
    ("a part died before its row", [(1, 2, 5, 10, 4, a), (3, 5, 5, 10, 6, b, {"row": False})], 1,
     "0 rows, 1 expected"),
    ("a check outside the units ran in both", [(1, 2, 5, 10, 4, a + b[:1]), (3, 5, 5, 10, 6, b)], 1,
     "ran 2 times"),
    ("parts of two builds", [(1, 2, 5, 10, 4, a), (3, 5, 5, 10, 6, b, {"commit": "def5678"})], 1,
     "differ in git_commit"),
]
results = [run(*c) for c in cases]
with tempfile.TemporaryDirectory() as top:
    r = subprocess.run([sys.executable, script, os.path.join(top, "nothing")], capture_output=True, text=True)
    results.append(r.returncode == 1 and "no part.csv" in r.stdout)
    print(f"{'ok  ' if results[-1] else 'FAIL'} a directory without a part: rc {r.returncode}")
print(f"{sum(results)} of {len(results)} cases as expected")
sys.exit(0 if all(results) else 1)
