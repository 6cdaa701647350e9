#!/usr/bin/python3
"""Write a checkpoint FILE.ckpt + gradient dump FILE (docs/FORMATS.md) from a
tiny random model, with loss and gradients computed by tests/torch_gpt.py in
float32.  Self-test aid for `torch_gpt.py check`:

  /usr/bin/python3 tests/make_fake_dump.py --out /tmp/fake.dump
  /usr/bin/python3 tests/torch_gpt.py check --dump /tmp/fake.dump        # passes
  /usr/bin/python3 tests/make_fake_dump.py --out /tmp/bad.dump --perturb h0.qkv_w
  /usr/bin/python3 tests/torch_gpt.py check --dump /tmp/bad.dump         # fails

--perturb NAME scales the largest-magnitude gradient element of tensor NAME
(or the loss, NAME=loss) by (1 + --frac) before writing.
Exit 77 if torch is not available.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import numpy as np
    import torch_gpt as tg
except Exception as e:
    print("torch not available: skipped (%s)" % e)
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=29)
    ap.add_argument("--seq", type=int, default=7)
    ap.add_argument("--pmax", type=int, default=10)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--perturb", default="")
    ap.add_argument("--frac", type=float, default=0.01)
    a = ap.parse_args()

    cfg = {"num_layers": a.layers, "hidden": a.hidden, "heads": a.heads,
           "ffn_hidden": 4 * a.hidden, "vocab": a.vocab,
           "max_position_embeddings": a.pmax, "seq_length": a.seq}
    shapes = tg.param_shapes(a.layers, a.hidden, 4 * a.hidden, a.vocab, a.pmax)
    rng = np.random.default_rng(a.seed)
    parts = []
    for name, shp in shapes:
        base = name.split(".")[-1]
        # Larger than GPT-2 init, and non-trivial LN/bias values, so that every
        # gradient is O(1) and a layout mistake shows up in every tensor.
        if base in ("ln1_w", "ln2_w", "lnf_w"):
            t = 1.0 + 0.2 * rng.standard_normal(shp)
        else:
            t = 0.3 * rng.standard_normal(shp)
        parts.append(t.astype(np.float32).ravel())
    params = np.concatenate(parts)
    inputs = rng.integers(0, a.vocab, (a.batch, a.seq))
    targets = rng.integers(0, a.vocab, (a.batch, a.seq))

    loss, _, grads = tg.loss_and_grads(cfg, params, inputs, targets,
                                       tg.torch.float32)
    if a.perturb == "loss":
        loss *= 1 + a.frac
    elif a.perturb:
        if a.perturb not in grads:
            sys.exit("unknown tensor %r" % a.perturb)
        g = grads[a.perturb].reshape(-1)
        i = int(np.argmax(np.abs(g)))
        print("perturbing %s[%d]: %.6g -> %.6g"
              % (a.perturb, i, g[i], g[i] * (1 + a.frac)))
        g[i] *= 1 + a.frac
    grad = np.concatenate([grads[n].ravel() for n, _ in shapes])
    tg.write_checkpoint(a.out + ".ckpt", cfg, params, step=0, seed=a.seed)
    tg.write_dump(a.out, loss, inputs, targets, a.vocab, grad)
    print("wrote %s and %s.ckpt (%d params, loss %.6f)"
          % (a.out, a.out, params.size, loss))


if __name__ == "__main__":
    main()
