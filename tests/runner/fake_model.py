#!/usr/bin/env python3
"""A stand-in for build/spbench-model in the runner's tests: checks that it gets
--world-size, --profile and --results, and appends a row with status
"modelled" (fits = 0 when --seq-length is over 100) and, as the real model
does, the --profile path it was given (absolute)."""
import csv
import os
import sys

a = sys.argv[1:]
opt = {a[i][2:]: (a[i + 1] if i + 1 < len(a) and not a[i + 1].startswith("--") else "") for i in range(len(a))
       if a[i].startswith("--")}
for need in ("world-size", "profile", "results", "seq-length"):
    if need not in opt:
        sys.exit("spbench-model: error: fake model needs --%s" % need)
n = int(opt["seq-length"])
row = {"run_name": opt.get("run-name", ""), "status": "modelled", "strategy": opt.get("strategy", "none"),
       "world_size": opt["world-size"], "sp": opt.get("sp-degree", "1"), "seq_length": n,
       "iter_time_median_s": 1.0, "tokens_per_s": 1000.0 * n, "tflops_paper_per_rank": 100.0,
       "fits": int(n <= 100), "memory_needed_bytes": n * 2 ** 30, "memory_capacity_bytes": 100 * 2 ** 30,
       "machine": os.path.basename(opt["profile"]), "profile": opt["profile"],
       "attn_density": opt.get("attn-density", "1")}
new = not os.path.exists(opt["results"])
with open(opt["results"], "a", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(row))
    if new:
        w.writeheader()
    w.writerow(row)
