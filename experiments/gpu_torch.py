#!/usr/bin/env python3
"""Torch companion of spbench-gpu-check: the same shapes through
torch.matmul (bf16) and torch.nn.functional.scaled_dot_product_attention (as
dispatched, and pinned to FlashAttention-2 and to cuDNN's fused attention), timed
with CUDA events (median of several runs after a warm-up), printed side by
side with spbench-gpu-check's own timings.csv rows (ratio = ours / torch);
then a torch eager transformer layer (nn.LayerNorm, nn.Linear in bf16,
F.scaled_dot_product_attention(is_causal=True), tanh GELU) forward + backward
at the 7B shape, whole and at the Megatron-SP and Ulysses per-rank shapes for
P = 8, beside spbench-gpu-layer's layer_timings.csv (ratio = ours / torch in
TFLOP/s by the same paper formula, i.e. torch time / our time).

    gpu_torch.py [--out results/gpu] [--ours results/gpu/timings.csv]
                 [--ours-layer results/gpu/layer_timings.csv] [--sp 8] [--no-layer]
                 [--tokens 4096,8192,16384,32768] [--reps 7] [--commit C] [--smoke] [--cpu]

Writes <out>/torch_timings.csv with GPU, driver, CUDA and git commit per row.
Exits 77 when torch has no CUDA device (and --cpu is not given).

--smoke: the check programs' smoke shape (hidden 1024, 16 heads of 64, ffn
4096; experiments/gpu_env.h), matching their --smoke rows.  --cpu: torch on
the CPU, timed with the host clock: with --smoke, the dress rehearsal of
experiments/gpu-check on the CPU emulation walks this script's code (shapes,
backends, the pairing with our rows, the CSV); its rows say "CPU" and are
no figure."""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/gpu")
    ap.add_argument("--ours", default=None)
    ap.add_argument("--tokens", default="4096,8192,16384,32768")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--ours-layer", default=None)
    ap.add_argument("--sp", type=int, default=8)
    ap.add_argument("--no-layer", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    # hidden, ffn, heads, head dim, peak-reference GEMM size (gpu_env.h's timing models)
    a.shape = (1024, 4096, 16, 64, 256) if a.smoke else (4096, 16384, 32, 128, 8192)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("no torch: skipped")
        return 77
    if not torch.cuda.is_available() and not a.cpu:
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
    if a.cpu:
        dev, gpu, driver, cuda = torch.device("cpu"), "CPU (torch --cpu: no GPU)", "none", "none"
    else:
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
        if a.cpu:
            ms = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ms.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(ms)
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
    layer_path = a.ours_layer or os.path.join(a.out, "layer_timings.csv")
    if os.path.exists(layer_path):
        with open(layer_path) as f:
            for r in csv.DictReader(f):  # the last run's row wins (rows are appended)
                ours[("layer", f"{r['strategy']} {r['pass']}", r["tokens"], r["causal"])] = float(r["paper_tflops"])
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
                     a.reps, f"{ms:.4f}", f"{tf:.6g}", "" if mine is None else f"{mine:.6g}",
                     "" if ratio is None else f"{ratio:.3f}"])

    print(f"torch {torch.__version__} on {gpu}, CUDA {cuda}, driver {driver}, commit {commit}")
    print(f"{'kind':<10} {'name':<24} {'tokens':>6} {'m':>6} {'n':>6} {'k':>6} {'causal':<6} {'median_ms':>9} "
          f"{'TFLOP/s':>8}")
    bf = torch.bfloat16
    C, Fh, H, D, S = a.shape
    x = torch.randn(S, S, device=dev, dtype=bf)
    y = torch.randn(S, S, device=dev, dtype=bf)
    ms = timed(lambda: torch.matmul(x, y.t()), a.reps)
    row("gemm", f"torch square {S}", f"square {S} (peak ref)", 0, S, S, S, None, ms, 2.0 * S ** 3)
    del x, y
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
    if not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0
        print(f"torch {torch.__version__} has no scaled_dot_product_attention: attention and layer rows left out")
        return write_rows(a, rows)
    # SDPA as torch dispatches it, then pinned to each backend that takes
    # the shape: FlashAttention-2 beside our flash kernel, cuDNN's fused
    # attention beside ours through cuDNN's graph API (--attention cudnn).
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        pinned = [("sdpa[flash]", SDPBackend.FLASH_ATTENTION, "flash"),
                  ("sdpa[cudnn]", SDPBackend.CUDNN_ATTENTION, "cudnn")]
    except ImportError:
        sdpa_kernel, pinned = None, []
    import contextlib
    variants = [("sdpa", contextlib.nullcontext, "flash")]
    variants += [(label, (lambda b=b: sdpa_kernel(b)), ours) for label, b, ours in pinned]
    ours_names = {"flash": ("flash fwd (mma)", "flash bwd (mma)"), "cudnn": ("cudnn fwd", "cudnn bwd")}
    for n in tokens:
        q = torch.randn(1, H, n, D, device=dev, dtype=bf, requires_grad=True)
        k = torch.randn(1, H, n, D, device=dev, dtype=bf, requires_grad=True)
        v = torch.randn(1, H, n, D, device=dev, dtype=bf, requires_grad=True)
        for causal in (1, 0):
            pairs = H * (n * (n + 1) / 2 if causal else float(n) * n)
            for label, ctx, ours_kind in variants:
                fwd_name, bwd_name = ours_names[ours_kind]
                try:
                    with ctx():
                        ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)), a.reps)
                        row("attention", f"{label} fwd", fwd_name, n, n, n, D, causal, ms, 4.0 * D * pairs)
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                        g = torch.randn_like(o)

                        def bwd():
                            torch.autograd.grad(o, (q, k, v), g, retain_graph=True)

                        ms = timed(bwd, a.reps)
                        row("attention", f"{label} bwd", bwd_name, n, n, n, D, causal, ms, 10.0 * D * pairs)
                        del o, g
                except RuntimeError as e:  # a pinned backend that refuses the shape
                    print(f"attention  {label}: not run ({str(e).splitlines()[0][:120]})")
        del q, k, v
    # fp16 (the paper's runs' precision), causal, as torch dispatches it,
    # beside our flash kernel's fp16 instance
    for n in tokens:
        q, k, v = (torch.randn(1, H, n, D, device=dev, dtype=torch.float16, requires_grad=True) for _ in range(3))
        pairs = H * n * (n + 1) / 2
        ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.reps)
        row("attention", "sdpa fwd fp16", "flash fwd (mma, fp16)", n, n, n, D, 1, ms, 4.0 * D * pairs)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(o)
        ms = timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True), a.reps)
        row("attention", "sdpa bwd fp16", "flash bwd (mma, fp16)", n, n, n, D, 1, ms, 10.0 * D * pairs)
        del q, k, v, o, g
    if not a.no_layer:
        layer_rows(torch, F, dev, tokens, a, timed, row)
    return write_rows(a, rows)


def write_rows(a, rows):
    """Appends the rows to <out>/torch_timings.csv (a header first in a new file)."""
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


def layer_rows(torch, F, dev, tokens, a, timed, row):
    """Torch eager pre-LN GPT layer, bf16 parameters and activations (the
    residual stream too: ours keeps it in fp32), forward + backward; FLOPs by
    the paper's formula (3 x (24 s h^2 + 4 s^2 h), divided by P for a
    strategy's per-rank share), like spbench-gpu-layer."""
    nn = torch.nn
    C, Fh, H, D, _ = a.shape
    P = a.sp
    bf = torch.bfloat16

    class Layer(nn.Module):
        def __init__(self, heads, ffn, attn_heads):
            super().__init__()
            self.h, self.ah = heads, attn_heads
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * heads * D), nn.Linear(heads * D, C)
            self.fc, self.fcproj = nn.Linear(C, ffn), nn.Linear(ffn, C)

        def forward(self, x):
            B, T, _ = x.shape
            qkv = self.qkv(self.ln1(x))
            # Ulysses: the same elements seen as P*T tokens of H/P heads (a free
            # view: the all-to-all and its permutes are not in torch's time)
            n = T * self.h // self.ah
            q, k, v = qkv.view(B, n, 3, self.ah, D).unbind(2)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            x = x + self.proj(o.transpose(1, 2).reshape(B, T, self.h * D))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    shapes = [("layer", 1, lambda n: (n, H, Fh, H)),
              ("megatron-sp", P, lambda n: (n, H // P, Fh // P, H // P)),
              ("ulysses", P, lambda n: (n // P, H, Fh, H // P))]
    for n in tokens:
        for name, p, shp in shapes:
            if n % p or H % p or Fh % p:
                continue
            T, heads, ffn, ah = shp(n)
            try:
                layer = Layer(heads, ffn, ah).to(device=dev, dtype=bf)
                x = torch.randn(1, T, C, device=dev, dtype=bf, requires_grad=True)
                dy = torch.randn(1, T, C, device=dev, dtype=bf) * 1e-3
                paper = (24.0 * n * C * C + 4.0 * n * n * C) / p
                with torch.no_grad():
                    ms = timed(lambda: layer(x), a.reps)
                row("layer", f"torch {name} fwd", f"{name} fwd", n, T, ah, ffn, 1, ms, paper)

                def step():
                    layer(x).backward(dy)

                ms = timed(step, a.reps)
                row("layer", f"torch {name} fwd+bwd", f"{name} fwd+bwd", n, T, ah, ffn, 1, ms, 3.0 * paper)
                del layer, x, dy
            except torch.cuda.OutOfMemoryError:
                print(f"layer {name} N={n}: out of memory: skipped")
            if not a.cpu:
                torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
