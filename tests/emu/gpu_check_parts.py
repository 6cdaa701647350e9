#!/usr/bin/env python3
"""Do the parts of a shared spbench-gpu-check run (--part K[-L]/N, each with
--out DIR) together run every check exactly once?

    gpu_check_parts.py DIR [DIR...]

Each DIR holds a part's part.csv (one row, written once its checks are done)
and checks.csv.  The units of checking work are counted alike in every part
(gpu_check.cu, check_unit), so the parts cover every unit once when they
count the same units, their shares tile 1..N and the units they ran add up
to that count.  A check outside any unit would run in every part: no check
(kernel, impl, shape) may appear twice across the parts.  Exit 0: covered;
1: not, each reason on its own line."""
import csv
import os
import sys


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main(dirs):
    errors, parts = [], []
    for d in dirs:
        pf, cf = os.path.join(d, "part.csv"), os.path.join(d, "checks.csv")
        if not os.path.exists(pf) or not os.path.exists(cf):
            errors.append(f"{d}: no part.csv or checks.csv (was the part run with --part and --out {d}?)")
            continue
        rows = read_rows(pf)
        if len(rows) != 1:
            errors.append(f"{d}/part.csv: {len(rows)} rows, 1 expected (a part that dies writes none)")
            continue
        p = {k: (v if k == "git_commit" else int(v)) for k, v in rows[0].items()}
        p["dir"], p["checks_rows"] = d, read_rows(cf)
        if len(p["checks_rows"]) != p["checks"]:
            errors.append(f"{d}: checks.csv has {len(p['checks_rows'])} rows, part.csv counts {p['checks']} checks")
        parts.append(p)
    if parts and not errors:
        for key in ("git_commit", "shares", "units"):
            seen = sorted({str(p[key]) for p in parts})
            if len(seen) > 1:
                errors.append(f"the parts differ in {key}: {', '.join(seen)}")
        n, units = parts[0]["shares"], parts[0]["units"]
        owner = {}
        for p in parts:
            for s in range(p["first_share"], p["last_share"] + 1):
                if s in owner:
                    errors.append(f"share {s} of {n} is in both {owner[s]} and {p['dir']}")
                owner[s] = p["dir"]
        missing = [s for s in range(1, n + 1) if s not in owner]
        if missing:
            errors.append(f"shares {missing} of {n} are in no part")
        run = sum(p["units_run"] for p in parts)
        if run != units:
            errors.append(f"the parts ran {run} units between them, of {units}")
        where = {}
        for p in parts:
            for r in p["checks_rows"]:
                where.setdefault((r["kernel"], r["impl"], r["shape"]), []).append(p["dir"])
        twice = [(k, w) for k, w in where.items() if len(w) > 1]
        for k, w in twice[:10]:
            errors.append(f"check {' | '.join(k)} ran {len(w)} times ({', '.join(w)})")
        if len(twice) > 10:
            errors.append(f"... {len(twice) - 10} more checks ran more than once")
    if errors:
        print("\n".join("FAIL: " + e for e in errors))
        return 1
    shares = ", ".join(f"{p['first_share']}-{p['last_share']}" for p in parts)
    checks = sum(p["checks"] for p in parts)
    print(f"{len(parts)} parts (shares {shares} of {parts[0]['shares']}) ran all {parts[0]['units']} units once: "
          f"{checks} checks, each in one part, {sum(p['failed'] for p in parts)} failed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
