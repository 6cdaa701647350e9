#!/usr/bin/python3
"""Independent PyTorch reference for the spbench GPT (see docs/FORMATS.md).

Run with Debian's interpreter, /usr/bin/python3 (it has python3-torch).

  check --dump FILE [--tol 1e-5] [--dtype float64|float32]
      Read FILE.ckpt (parameters) and FILE (inputs, targets, loss, gradients)
      written by the C program, recompute loss and gradients here and compare.
      Exit 0: all relative errors <= tol; 1: some error > tol, or a malformed
      file; 77: torch not importable (ctest SKIP_RETURN_CODE).

  bench --num-layers L --hidden-size C --num-attention-heads H --seq-length T
        --micro-batch-size B --vocab-size V --threads N --iters K --warmup W
      Time K full float32 training steps (forward, backward, AdamW) of the same
      model in eager PyTorch after W warm-up steps.  Prints one line
      "torch_step_ms median=<ms> min=<ms> max=<ms> threads=N" and a human line.

The model is written with plain tensor ops (layer_norm, matmul, an explicit
causal mask + softmax, the tanh GELU formula, cross_entropy) so that it is a
transparent reference, not nn.Transformer.
"""

import argparse
import math
import os
import struct
import sys
import time


def _bench_threads_env(argv):
    """Debian's torch calls a generic libblas (OpenBLAS here) that ignores
    torch.set_num_threads, so pin BLAS/OpenMP threads via the environment
    before torch is imported."""
    if "bench" not in argv:
        return
    n = None
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            n = argv[i + 1]
        elif a.startswith("--threads="):
            n = a.split("=", 1)[1]
    if n is None:
        n = str(os.cpu_count() or 1)
    if n.isdigit() and int(n) > 0:
        for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[k] = n


if __name__ == "__main__":
    _bench_threads_env(sys.argv[1:])

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # ImportError, or a broken install
    if __name__ == "__main__":
        print("torch not available: skipped (%s)" % e)
        sys.exit(77)
    raise

HEADER_BYTES = 256
CKPT_MAGIC = b"SPBCKPT\0"
DUMP_MAGIC = b"SPBDUMP\0"
VERSION = 1
# magic, version, header bytes, 10 x int64, seed
CKPT_HEAD = struct.Struct("<8sII10qQ")
# magic, version, header bytes, B, T, V, num_params, loss
DUMP_HEAD = struct.Struct("<8sII4qd")
# the model variant at byte 136: K/V heads (0: = heads), flags, RoPE base
CKPT_VARIANT = struct.Struct("<qqd")
VARIANT_AT = 136
ROPE, RMSNORM, SWIGLU, UNTIED, NO_BIAS = 1, 2, 4, 8, 16
GPT = {"kv_heads": 0, "flags": 0, "rotary_base": 0.0}

LAYER_TENSORS = ("ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b",
                 "ln2_w", "ln2_b", "fc_w", "fc_b", "fcproj_w", "fcproj_b")


class FormatError(Exception):
    pass


# ---------------------------------------------------------------------------
# Model description
# ---------------------------------------------------------------------------

def param_shapes(L, C, F_, V, Pmax, H=1, variant=GPT):
    """[(name, shape)] in the flat parameter order of FORMATS.md: GPT, or
    its variant (RoPE: no wpe; RMSNorm: no norm biases; no-bias: no linear
    biases; SwiGLU: fc [2F, C] as [gate; up]; G K/V heads: qkv rows
    (H + 2G)·D; untied: lm_head [V, C] last)."""
    fl = variant["flags"]
    D = C // H
    G = variant["kv_heads"] or H
    W = (H + 2 * G) * D
    F2 = 2 * F_ if fl & SWIGLU else F_
    out = [("wte", (V, C))]
    if not fl & ROPE:
        out.append(("wpe", (Pmax, C)))
    for l in range(L):
        shp = {"ln1_w": (C,), "ln1_b": (C,), "qkv_w": (W, C),
               "qkv_b": (W,), "proj_w": (C, C), "proj_b": (C,),
               "ln2_w": (C,), "ln2_b": (C,), "fc_w": (F2, C), "fc_b": (F2,),
               "fcproj_w": (C, F_), "fcproj_b": (C,)}
        for n in LAYER_TENSORS:
            if n in ("ln1_b", "ln2_b") and fl & RMSNORM:
                continue
            if n in ("qkv_b", "proj_b", "fc_b", "fcproj_b") and fl & NO_BIAS:
                continue
            out.append(("h%d.%s" % (l, n), shp[n]))
    out.append(("lnf_w", (C,)))
    if not fl & RMSNORM:
        out.append(("lnf_b", (C,)))
    if fl & UNTIED:
        out.append(("lm_head", (V, C)))
    return out


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w


def rope(x, base):
    """Rotary embedding of x [B, heads, T, D] at positions 0..T-1, Llama's
    rotate_half convention (pairs i and i + D/2)."""
    T, D = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]     # [T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).to(x.dtype)
    half = torch.cat([-x[..., D // 2:], x[..., :D // 2]], dim=-1)
    return x * cos + half * sin


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def split_flat(flat, shapes):
    """Split a flat numpy vector into {name: array} following shapes."""
    out, off = {}, 0
    for name, shp in shapes:
        n = numel(shp)
        out[name] = flat[off:off + n].reshape(shp)
        off += n
    assert off == flat.size
    return out


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) *
                                       (x + 0.044715 * x * x * x)))


def forward(P, cfg, idx, targets):
    """Mean cross-entropy loss.  P: {name: tensor}; idx, targets: [B, T] int64."""
    L, C, H = cfg["num_layers"], cfg["hidden"], cfg["heads"]
    fl = cfg.get("flags", 0)
    G = cfg.get("kv_heads", 0) or H
    D = C // H
    B, T = idx.shape
    eps = 1e-5
    x = F.embedding(idx, P["wte"])                                       # [B,T,C]
    if not fl & ROPE:
        x = x + P["wpe"][:T].unsqueeze(0)

    def norm(x, w, b):
        return rms_norm(x, w, eps) if fl & RMSNORM else F.layer_norm(x, (C,), w, b, eps)

    def linear(x, w, b):
        y = torch.matmul(x, w.t())
        return y if b is None else y + b
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    scale = 1.0 / math.sqrt(D)
    for l in range(L):
        p = lambda n: P.get("h%d.%s" % (l, n))
        a = norm(x, p("ln1_w"), p("ln1_b"))
        qkv = linear(a, p("qkv_w"), p("qkv_b"))                         # [B,T,(H+2G)D]
        q, k, v = qkv.split([H * D, G * D, G * D], dim=-1)  # rows: q all heads | k | v
        # head h = columns h*D .. h*D+D-1 of each of q, k, v
        q = q.reshape(B, T, H, D).transpose(1, 2)                      # [B,H,T,D]
        k = k.reshape(B, T, G, D).transpose(1, 2)                      # [B,G,T,D]
        v = v.reshape(B, T, G, D).transpose(1, 2)
        if fl & ROPE:
            q, k = rope(q, cfg["rotary_base"]), rope(k, cfg["rotary_base"])
        # grouped-query attention: query head h reads K/V head h // (H/G)
        k = k.repeat_interleave(H // G, dim=1)
        v = v.repeat_interleave(H // G, dim=1)
        s = torch.matmul(q, k.transpose(-2, -1)) * scale               # [B,H,T,T]
        s = s.masked_fill(~causal, float("-inf"))
        att = torch.softmax(s, dim=-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(o, p("proj_w"), p("proj_b"))
        m = norm(x, p("ln2_w"), p("ln2_b"))
        if fl & SWIGLU:
            gate, up = linear(m, p("fc_w"), p("fc_b")).chunk(2, dim=-1)
            u = F.silu(gate) * up
        else:
            u = gelu_tanh(linear(m, p("fc_w"), p("fc_b")))
        x = x + linear(u, p("fcproj_w"), p("fcproj_b"))
    y = norm(x, P["lnf_w"], P.get("lnf_b"))
    logits = torch.matmul(y, P["lm_head"].t() if fl & UNTIED else P["wte"].t())  # tied unless untied
    V = P["wte"].shape[0]
    return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))


# ---------------------------------------------------------------------------
# File formats
# ---------------------------------------------------------------------------

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise FormatError("%s: cannot read: %s" % (path, e.strerror))


def read_checkpoint(path):
    """Return (cfg dict, params as flat float32 numpy array)."""
    buf = _read(path)
    if len(buf) < HEADER_BYTES:
        raise FormatError("%s: %d bytes, shorter than the %d-byte header"
                          % (path, len(buf), HEADER_BYTES))
    f = CKPT_HEAD.unpack_from(buf, 0)
    magic, ver, hb = f[0], f[1], f[2]
    if magic != CKPT_MAGIC:
        raise FormatError("%s: bad magic %r (want %r): not a checkpoint"
                          % (path, magic, CKPT_MAGIC))
    if ver != VERSION:
        raise FormatError("%s: version %d, want %d" % (path, ver, VERSION))
    if hb != HEADER_BYTES:
        raise FormatError("%s: header bytes %d, want %d" % (path, hb, HEADER_BYTES))
    keys = ("num_layers", "hidden", "heads", "ffn_hidden", "vocab",
            "max_position_embeddings", "seq_length", "step", "num_params",
            "has_optimizer")
    cfg = dict(zip(keys, f[3:13]))
    cfg["seed"] = f[13]
    cfg["kv_heads"], cfg["flags"], cfg["rotary_base"] = CKPT_VARIANT.unpack_from(buf, VARIANT_AT)
    if cfg["kv_heads"] < 0 or (cfg["kv_heads"] and cfg["heads"] % cfg["kv_heads"]):
        raise FormatError("%s: K/V heads %d do not divide heads %d"
                          % (path, cfg["kv_heads"], cfg["heads"]))
    if cfg["flags"] & ROPE and cfg["rotary_base"] <= 1:
        raise FormatError("%s: RoPE with base %g" % (path, cfg["rotary_base"]))
    for k in ("num_layers", "hidden", "heads", "ffn_hidden", "vocab",
              "max_position_embeddings", "seq_length"):
        if cfg[k] <= 0:
            raise FormatError("%s: %s = %d must be positive" % (path, k, cfg[k]))
    if cfg["hidden"] % cfg["heads"]:
        raise FormatError("%s: hidden %d not divisible by heads %d"
                          % (path, cfg["hidden"], cfg["heads"]))
    if cfg["has_optimizer"] not in (0, 1):
        raise FormatError("%s: has_optimizer = %d, want 0 or 1"
                          % (path, cfg["has_optimizer"]))
    shapes = param_shapes(cfg["num_layers"], cfg["hidden"], cfg["ffn_hidden"],
                          cfg["vocab"], cfg["max_position_embeddings"], cfg["heads"], cfg)
    n = sum(numel(s) for _, s in shapes)
    if cfg["num_params"] != n:
        raise FormatError("%s: num_params %d, but the sizes in the header give %d"
                          % (path, cfg["num_params"], n))
    want = HEADER_BYTES + 4 * n * (3 if cfg["has_optimizer"] else 1)
    if len(buf) != want:
        raise FormatError("%s: %d bytes, want %d (header + %d params%s)"
                          % (path, len(buf), want, n,
                             " + 2 moments" if cfg["has_optimizer"] else ""))
    params = np.frombuffer(buf, dtype="<f4", count=n, offset=HEADER_BYTES)
    return cfg, params.astype(np.float32)


def read_dump(path):
    """Return dict B, T, V, num_params, loss, inputs[B,T], targets[B,T], grad."""
    buf = _read(path)
    if len(buf) < HEADER_BYTES:
        raise FormatError("%s: %d bytes, shorter than the %d-byte header"
                          % (path, len(buf), HEADER_BYTES))
    magic, ver, hb, B, T, V, n, loss = DUMP_HEAD.unpack_from(buf, 0)
    if magic != DUMP_MAGIC:
        raise FormatError("%s: bad magic %r (want %r): not a gradient dump"
                          % (path, magic, DUMP_MAGIC))
    if ver != VERSION:
        raise FormatError("%s: version %d, want %d" % (path, ver, VERSION))
    if hb != HEADER_BYTES:
        raise FormatError("%s: header bytes %d, want %d" % (path, hb, HEADER_BYTES))
    for k, val in (("batch", B), ("seq_length", T), ("vocab", V), ("num_params", n)):
        if val <= 0:
            raise FormatError("%s: %s = %d must be positive" % (path, k, val))
    want = HEADER_BYTES + 4 * (2 * B * T) + 4 * n
    if len(buf) != want:
        raise FormatError("%s: %d bytes, want %d (header + 2x%d tokens + %d grads)"
                          % (path, len(buf), want, B * T, n))
    off = HEADER_BYTES
    inp = np.frombuffer(buf, dtype="<i4", count=B * T, offset=off)
    off += 4 * B * T
    tgt = np.frombuffer(buf, dtype="<i4", count=B * T, offset=off)
    off += 4 * B * T
    grad = np.frombuffer(buf, dtype="<f4", count=n, offset=off)
    for k, a in (("input", inp), ("target", tgt)):
        bad = (a < 0) | (a >= V)
        if bad.any():
            i = int(np.argmax(bad))
            raise FormatError("%s: %s token %d at index %d is outside [0, %d)"
                              % (path, k, int(a[i]), i, V))
    return {"B": B, "T": T, "V": V, "num_params": n, "loss": loss,
            "inputs": inp.astype(np.int64).reshape(B, T),
            "targets": tgt.astype(np.int64).reshape(B, T),
            "grad": grad.astype(np.float32)}


def write_checkpoint(path, cfg, params, step=0, seed=0):
    params = np.ascontiguousarray(params, dtype="<f4")
    head = CKPT_HEAD.pack(CKPT_MAGIC, VERSION, HEADER_BYTES,
                          cfg["num_layers"], cfg["hidden"], cfg["heads"],
                          cfg["ffn_hidden"], cfg["vocab"],
                          cfg["max_position_embeddings"], cfg["seq_length"],
                          step, params.size, 0, seed)
    with open(path, "wb") as f:
        f.write(head.ljust(HEADER_BYTES, b"\0"))
        f.write(params.tobytes())


def write_dump(path, loss, inputs, targets, vocab, grad):
    B, T = inputs.shape
    grad = np.ascontiguousarray(grad, dtype="<f4")
    head = DUMP_HEAD.pack(DUMP_MAGIC, VERSION, HEADER_BYTES, B, T, vocab,
                          grad.size, float(loss))
    with open(path, "wb") as f:
        f.write(head.ljust(HEADER_BYTES, b"\0"))
        f.write(np.ascontiguousarray(inputs, dtype="<i4").tobytes())
        f.write(np.ascontiguousarray(targets, dtype="<i4").tobytes())
        f.write(grad.tobytes())


def loss_and_grads(cfg, flat_params, inputs, targets, dtype):
    """Float loss and {name: float64 numpy grad} for flat float32 params."""
    shapes = param_shapes(cfg["num_layers"], cfg["hidden"], cfg["ffn_hidden"],
                          cfg["vocab"], cfg["max_position_embeddings"], cfg["heads"], cfg)
    P = {k: torch.tensor(v, dtype=dtype, requires_grad=True)
         for k, v in split_flat(flat_params, shapes).items()}
    loss = forward(P, cfg, torch.as_tensor(inputs), torch.as_tensor(targets))
    loss.backward()
    grads = {k: P[k].grad.detach().double().numpy() for k, _ in shapes}
    return float(loss.item()), shapes, grads


# ---------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------

def cmd_check(args):
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    try:
        cfg, params = read_checkpoint(args.dump + ".ckpt")
        d = read_dump(args.dump)
        if d["num_params"] != cfg["num_params"]:
            raise FormatError("%s: num_params %d, but %s.ckpt has %d"
                              % (args.dump, d["num_params"], args.dump,
                                 cfg["num_params"]))
        if d["V"] != cfg["vocab"]:
            raise FormatError("%s: vocab %d, but %s.ckpt has %d"
                              % (args.dump, d["V"], args.dump, cfg["vocab"]))
        if d["T"] > cfg["max_position_embeddings"]:
            raise FormatError("%s: seq_length %d exceeds max_position_embeddings %d"
                              % (args.dump, d["T"], cfg["max_position_embeddings"]))
    except FormatError as e:
        print("error: %s" % e)
        return 1
    if d["T"] != cfg["seq_length"]:
        print("note: dump seq_length %d differs from checkpoint seq_length %d"
              % (d["T"], cfg["seq_length"]))

    fl = cfg["flags"]
    variant = ",".join(n for bit, n in ((ROPE, "rope"), (RMSNORM, "rmsnorm"), (SWIGLU, "swiglu"),
                                        (UNTIED, "untied"), (NO_BIAS, "no-bias")) if fl & bit) or "gpt"
    print("model: L=%d C=%d H=%d G=%d F=%d V=%d Pmax=%d %s | batch B=%d T=%d | "
          "%d params | reference dtype %s"
          % (cfg["num_layers"], cfg["hidden"], cfg["heads"], cfg["kv_heads"] or cfg["heads"],
             cfg["ffn_hidden"], cfg["vocab"], cfg["max_position_embeddings"], variant, d["B"], d["T"],
             cfg["num_params"], args.dtype))
    loss, shapes, grads = loss_and_grads(cfg, params, d["inputs"], d["targets"],
                                         dtype)
    cg = split_flat(d["grad"].astype(np.float64), shapes)

    def ok(err):
        return bool(np.isfinite(err)) and err <= args.tol

    nfail = 0
    worst = ("", -1.0)
    loss_err = abs(d["loss"] - loss) / max(abs(loss), 1e-30)
    if not math.isfinite(loss_err):
        loss_err = float("nan")
    print("%-14s %-14s %14s %12s  %s" % ("tensor", "shape", "norm(torch)",
                                          "rel_err", "status"))
    st = "ok" if ok(loss_err) else "FAIL"
    nfail += st != "ok"
    print("%-14s %-14s %14.6e %12.3e  %s   (C %.9g, torch %.9g)"
          % ("loss", "[]", abs(loss), loss_err, st, d["loss"], loss))
    for name, shp in shapes:
        gt, gc = grads[name], cg[name]
        nt = float(np.linalg.norm(gt))
        err = float(np.linalg.norm(gc - gt)) / max(nt, 1e-30)
        st = "ok" if ok(err) else "FAIL"
        nfail += st != "ok"
        if not math.isnan(worst[1]) and not (err <= worst[1]):
            worst = (name, err)  # NaN wins and sticks
        print("%-14s %-14s %14.6e %12.3e  %s"
              % (name, "[" + ",".join(map(str, shp)) + "]", nt, err, st))
    print("worst gradient: %s rel_err %.3e; loss rel_err %.3e; tol %.1e: %s"
          % (worst[0], worst[1], loss_err, args.tol,
             "PASS" if nfail == 0 else "FAIL (%d tensor(s) over tolerance)" % nfail))
    return 0 if nfail == 0 else 1


# ---------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------

def cmd_bench(args):
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # only settable before any inter-op work has started
    torch.manual_seed(args.seed)
    C, L = args.hidden_size, args.num_layers
    if C % args.num_attention_heads:
        print("error: hidden size %d not divisible by heads %d"
              % (C, args.num_attention_heads))
        return 1
    cfg = {"num_layers": L, "hidden": C, "heads": args.num_attention_heads,
           "ffn_hidden": args.ffn_hidden_size or 4 * C, "vocab": args.vocab_size,
           "max_position_embeddings": args.max_position_embeddings or args.seq_length,
           "seq_length": args.seq_length}
    if cfg["max_position_embeddings"] < args.seq_length:
        print("error: max position embeddings < seq length")
        return 1
    shapes = param_shapes(L, C, cfg["ffn_hidden"], cfg["vocab"],
                          cfg["max_position_embeddings"])
    P = {}
    for name, shp in shapes:
        base = name.split(".")[-1]
        if base.endswith("_b"):
            t = torch.zeros(shp)
        elif base in ("ln1_w", "ln2_w", "lnf_w"):
            t = torch.ones(shp)
        else:
            std = 0.02 / math.sqrt(2 * L) if base in ("proj_w", "fcproj_w") else 0.02
            t = torch.randn(shp) * std
        P[name] = t.float().requires_grad_(True)
    nparam = sum(numel(s) for _, s in shapes)
    opt = torch.optim.AdamW(list(P.values()), lr=args.lr, weight_decay=0.1)
    B, T, V = args.micro_batch_size, args.seq_length, args.vocab_size
    times = []
    loss = None
    for it in range(args.warmup + args.iters):
        idx = torch.randint(0, V, (B, T))
        tgt = torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = forward(P, cfg, idx, tgt)
        loss.backward()
        opt.step()
        dt = (time.perf_counter() - t0) * 1e3
        if it >= args.warmup:
            times.append(dt)
    times.sort()
    med = times[len(times) // 2] if len(times) % 2 else \
        0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
    print("torch_step_ms median=%.3f min=%.3f max=%.3f threads=%d"
          % (med, times[0], times[-1], args.threads))
    print("PyTorch %s eager fp32: L=%d C=%d H=%d F=%d V=%d T=%d B=%d (%d params), "
          "%d threads: median %.1f ms/step over %d steps (%d warm-up), "
          "%.0f tokens/s, last loss %.4f (OPENBLAS_NUM_THREADS=%s)"
          % (torch.__version__, L, C, cfg["heads"], cfg["ffn_hidden"], V, T, B,
             nparam, torch.get_num_threads(), med, len(times), args.warmup,
             B * T / (med / 1e3), loss.item(),
             os.environ.get("OPENBLAS_NUM_THREADS", "unset")))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    sub.required = True
    c = sub.add_parser("check", help="compare a C gradient dump with PyTorch")
    c.add_argument("--dump", required=True,
                   help="dump FILE; parameters are read from FILE.ckpt")
    c.add_argument("--tol", type=float, default=1e-5)
    c.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    b = sub.add_parser("bench", help="time eager PyTorch training steps")
    b.add_argument("--num-layers", type=int, default=4)
    b.add_argument("--hidden-size", type=int, default=256)
    b.add_argument("--num-attention-heads", type=int, default=8)
    b.add_argument("--ffn-hidden-size", type=int, default=0, help="default 4*hidden")
    b.add_argument("--seq-length", type=int, default=1024)
    b.add_argument("--max-position-embeddings", type=int, default=0,
                   help="default seq length")
    b.add_argument("--micro-batch-size", type=int, default=4)
    b.add_argument("--vocab-size", type=int, default=256)
    b.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    b.add_argument("--iters", type=int, default=10)
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--lr", type=float, default=1e-4)
    b.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    if args.cmd == "check":
        return cmd_check(args)
    if args.iters < 1:
        ap.error("--iters must be >= 1")
    return cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
