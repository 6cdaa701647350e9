#!/usr/bin/env python3
"""Torch companion of spbench-gpu-check: the same shapes through
torch.matmul (bf16) and torch.nn.functional.scaled_dot_product_attention, timed
with CUDA events (median of several runs after a warm-up), printed side by
side with spbench-gpu-check's own timings.csv rows (ratio = ours / torch).

    gpu_torch.py [--out results/gpu] [--ours results/gpu/timings.csv]
                 [--tokens 4096,8192,16384,32768] [--reps 7] [--commit C]

Writes <out>/torch_timings.csv with GPU, driver, CUDA and git commit per row.
Exits 77 when torch has no CUDA device."""
import argparse
import csv
import os
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/gpu")
    ap.add_argument("--ours", default=None)
    ap.add_argument("--tokens", default="4096,8192,16384,32768")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--commit", default=None)
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("no torch: skipped")
        return 77
    if not torch.cuda.is_available():
        print("torch sees no CUDA device: skipped")
        return 77
    commit = a.commit
    if not commit:
        try:
            here = os.path.dirname(os.path.abspath(__file__))
            commit = subprocess.check_output(["git", "-C", here, "describe", "--always", "--dirty", "--abbrev=12"],
                                             text=True).strip()
        except Exception:
            commit = "unknown"
    dev = torch.device("cuda:0")
    gpu = torch.cuda.get_device_name(0)
    driver = ""
    try:
        driver = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         text=True).splitlines()[0].strip()
    except Exception:
        pass
    cuda = torch.version.cuda or ""
    tokens = [int(t) for t in a.tokens.split(",") if t]

    def timed(fn, reps):
        fn()  # warm-up
        torch.cuda.synchronize()
        ms = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ms.append(s.elapsed_time(e))
        return statistics.median(ms)

    ours = {}
    ours_path = a.ours or os.path.join(a.out, "timings.csv")
    if os.path.exists(ours_path):
        with open(ours_path) as f:
            for r in csv.DictReader(f):
                ours[(r["kind"], r["name"], r["tokens"], r["causal"])] = float(r["tflops"])

    rows = []

    def row(kind, name, ours_name, n, m, nn, k, causal, ms, flops):
        tf = flops / (ms * 1e-3) / 1e12
        key = (kind, ours_name, str(n), "" if causal is None else str(causal))
        mine = ours.get(key)
        ratio = mine / tf if mine else None
        print(f"{kind:<10} {name:<24} {n:>6} {m:>6} {nn:>6} {k:>6} {'-' if causal is None else causal!s:<6} "
              f"{ms:9.3f} {tf:8.1f}  ours {('%.1f' % mine) if mine else '-':>7}  ratio {('%.2f' % ratio) if ratio else '-'}")
        rows.append([gpu, driver, cuda, commit, kind, name, n, m, nn, k, "" if causal is None else causal,
                     a.reps, f"{ms:.4f}", f"{tf:.2f}", "" if mine is None else f"{mine:.2f}",
                     "" if ratio is None else f"{ratio:.3f}"])

    print(f"torch {torch.__version__} on {gpu}, CUDA {cuda}, driver {driver}, commit {commit}")
    print(f"{'kind':<10} {'name':<24} {'tokens':>6} {'m':>6} {'n':>6} {'k':>6} {'causal':<6} {'median_ms':>9} "
          f"{'TFLOP/s':>8}")
    bf = torch.bfloat16
    S = 8192
    x = torch.randn(S, S, device=dev, dtype=bf)
    y = torch.randn(S, S, device=dev, dtype=bf)
    ms = timed(lambda: torch.matmul(x, y.t()), a.reps)
    row("gemm", "torch square 8192", "square 8192 (peak ref)", 0, S, S, S, None, ms, 2.0 * S ** 3)
    del x, y
    C, Fh, H, D = 4096, 16384, 32, 128
    for n in tokens:
        for name, i, o in (("qkv", C, 3 * C), ("proj", C, C), ("fc", C, Fh), ("fcproj", Fh, C)):
            X = torch.randn(n, i, device=dev, dtype=bf)
            W = torch.randn(o, i, device=dev, dtype=bf)
            dY = torch.randn(n, o, device=dev, dtype=bf)
            fl = 2.0 * n * i * o
            ms = timed(lambda: torch.matmul(X, W.t()), a.reps)
            row("gemm", f"{name} fwd", f"{name} fwd", n, n, o, i, None, ms, fl)
            ms = timed(lambda: torch.matmul(dY, W), a.reps)
            row("gemm", f"{name} bwd dinp", f"{name} bwd dinp", n, n, i, o, None, ms, fl)
            ms = timed(lambda: torch.matmul(dY.t(), X), a.reps)  # bf16 out (ours: fp32 accumulate into dW)
            row("gemm", f"{name} bwd dW", f"{name} bwd dW", n, o, i, n, None, ms, fl)
            del X, W, dY
    for n in tokens:
        q = torch.randn(1, H, n, D, device=dev, dtype=bf, requires_grad=True)
        k = torch.randn(1, H, n, D, device=dev, dtype=bf, requires_grad=True)
        v = torch.randn(1, H, n, D, device=dev, dtype=bf, requires_grad=True)
        for causal in (1, 0):
            pairs = H * (n * (n + 1) / 2 if causal else float(n) * n)
            ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)), a.reps)
            row("attention", "sdpa fwd", "flash fwd (mma)", n, n, n, D, causal, ms, 4.0 * D * pairs)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            g = torch.randn_like(o)

            def bwd():
                torch.autograd.grad(o, (q, k, v), g, retain_graph=True)

            ms = timed(bwd, a.reps)
            row("attention", "sdpa bwd", "flash bwd (mma)", n, n, n, D, causal, ms, 10.0 * D * pairs)
            del o, g
        del q, k, v
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "torch_timings.csv")
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["gpu", "driver", "cuda_runtime", "git_commit", "kind", "name", "tokens", "m", "n", "k",
                        "causal", "reps", "median_ms", "tflops", "ours_tflops", "ratio_ours_over_torch"])
        w.writerows(rows)
    print(f"CSV: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
