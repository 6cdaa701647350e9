#!/usr/bin/env python3
"""Bounded fuzzing of spbench's command line (issue 39): seeded random
argument vectors (options from spbench --list-options with valid, edge and
malformed values, repeated options, output paths onto files spbench must not
clobber; --overwrite left out), single-rank and under mpiexec -np 2, four at
a time.  Each case must end with
exit 0, or with a non-zero status and exactly one "spbench: error:" line;
a signal, a timeout, a second error line, a changed guarded file or a
temporary left behind fails.

usage: fuzz_spbench.py SPBENCH MPIEXEC [--seed N] [--seconds S] [--cases N]
Prints a table: cases tried, ran, refused cleanly, crashes, hangs, files clobbered."""
import argparse
import concurrent.futures
import hashlib
import json
import os
import random
import stat
import subprocess
import sys
import tempfile
import time

CASE_TIMEOUT = 30  # a case that takes this long is a hang: sizes are drawn so any accepted run is short

SIZES = {"num-layers", "hidden-size", "num-attention-heads", "ffn-hidden-size", "vocab-size", "seq-length",
         "max-position-embeddings", "micro-batch-size", "global-batch-size", "sp-degree", "sparse-block",
         "sparse-local-blocks", "sparse-global-blocks", "flash-block-rows"}
# Work counts: large values would be long runs, not bugs.
WORK = {"train-iters", "global-batch-size", "log-interval", "timing-warmup", "lr-warmup-iters", "loss-scale-window"}


def malformed(rng):
    return rng.choice(["0x10", " 64", "64 ", "64abc", "+5", "", "1e3", "6.5", "-0", "nan", "inf", "-inf", "1e400",
                       "99999999999999999999", "--", "\u00e9", "1,000", "0b11", "1_000", "NaN", "0x1p3", "\t7"])


def value_for(rng, name, kind, choices, guarded):
    r = rng.random()
    if r < 0.15:
        return malformed(rng)
    if choices and r < 0.8:
        return rng.choice(list(choices))
    if kind == "int":
        if name in WORK:
            return str(rng.choice([-1, 0, 1, 2, 3]))
        if name in SIZES and r < 0.6:
            return str(rng.choice([1, 2, 4, 8, 16, 32, 64, 3, 48]))
        if name in SIZES:
            # beyond what must be refused (overflow, the memory model); not 65536, which a size like
            # --seq-length accepts as a legitimate run of minutes on the default model, not a hang
            return str(rng.choice([0, -1, -2147483648, 2147483647, 1073741824, 1000000, 100000000, 2000000000,
                                   2147483648, 7]))
        return str(rng.choice([0, -1, -2147483648, 2147483647, 1073741824, 65536, 1000000, 100000000, 2000000000,
                               2147483648, 7]))
    if kind == "u64":
        return str(rng.choice([0, 1, 18446744073709551615, 18446744073709551616, -1, 42]))
    if kind == "float":
        return rng.choice(["0", "-1", "1e-3", "0.5", "1", "1e308", "1e-320", "2", "0.999", "65536"])
    if kind == "size":
        return rng.choice(["1KiB", "64MiB", "1GiB", "80GiB", "0", "1e3", "1.5GiB", "1XB", "-1GiB", "100TB", "nan"])
    if kind == "str":
        if name in ("save", "dump", "loss-log", "results", "load", "data"):
            return rng.choice(guarded + ["/nonexistent/x", "", "/dev/full", "/dev/null", "/", "/proc/self/mem"])
        if name == "run-name":
            return rng.choice(["x", "a,b", "a\nb", "z" * 100])
        return rng.choice(["flash", "naive", "cudnn", "all", "none", "products,attention", "bogus", "", "x" * 200])
    return "1"


def make_args(rng, options, guarded):
    names = list(options)
    args = []
    for _ in range(rng.randint(0, 6)):
        name = rng.choice(names)
        kind, choices = options[name]
        if rng.random() < 0.03:
            name = rng.choice(["frobnicate", "help-me", "seq_length", ""])
        if kind == "flag":
            args.append("--" + name + (rng.choice(["", "=1"]) if rng.random() < 0.1 else ""))
        elif rng.random() < 0.1:
            args.append("--%s=%s" % (name, value_for(rng, name, kind, choices, guarded)))
        else:
            args += ["--" + name, value_for(rng, name, kind, choices, guarded)]
        if rng.random() < 0.05:  # the same option again
            args += args[-2:] if not args[-1].startswith("--") else args[-1:]
    if rng.random() < 0.03:
        args.append(rng.choice(["stray", "-x", "--"]))
    if "--train-iters" not in args and not any(a.startswith("--train-iters=") for a in args):
        args += ["--train-iters", "2"]  # an accepted run stays short
    return args + ["--quiet"] if "--quiet" not in args else args


def snapshot(paths):
    out = {}
    for p in paths:
        try:
            st = os.lstat(p)
            kind = stat.S_IFMT(st.st_mode)
            digest = hashlib.sha1(open(p, "rb").read()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
            out[p] = (kind, digest)
        except OSError:
            out[p] = None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("spbench")
    ap.add_argument("mpiexec")
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--seconds", type=float, default=50)
    ap.add_argument("--cases", type=int, default=100000)
    a = ap.parse_args()
    a.spbench = os.path.abspath(a.spbench)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    listed = json.loads(subprocess.run([a.spbench, "--list-options"], capture_output=True, text=True,
                                       check=True).stdout)
    # --overwrite asks for the guarded files to be replaced: it is tested by outputs_safety.sh
    options = {o["name"]: (o["kind"], o["choices"]) for o in listed if o["name"] != "overwrite"}
    rng = random.Random(a.seed)
    counts = dict(tried=0, ran=0, refused=0, crashes=0, hangs=0, clobbered=0)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        precious = os.path.join(tmp, "precious.txt")
        with open(precious, "w") as f:
            f.write("not spbench's: must survive\n")
        fifo = os.path.join(tmp, "fifo")
        os.mkfifo(fifo)
        link = os.path.join(tmp, "link")
        os.symlink(precious, link)
        os.mkdir(os.path.join(tmp, "dir"))
        guarded = [precious, fifo, link, os.path.join(tmp, "dir"), os.path.join(tmp, "new.out")]
        watched = [precious, fifo, link, os.path.join(tmp, "dir"), "/dev/null", "/dev/full"]
        before = snapshot(watched)
        start = time.time()
        def one(cmd):  # -> (verdict, detail)
            t0 = time.time()
            try:
                r = subprocess.run(cmd, capture_output=True, timeout=CASE_TIMEOUT, env=env, cwd=tmp,
                                   stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                subprocess.run(["pkill", "-9", "-f", "--", " ".join(cmd[-3:])], capture_output=True)
                return "hangs", ""
            err = r.stderr.decode("utf-8", "replace")
            lines = [l for l in err.splitlines() if l.startswith("spbench: error:")]
            if r.returncode == 0:
                return "ran", ""
            if 0 < r.returncode < 128 and len(lines) == 1 and "Traceback" not in err and \
                    "backtrace" not in err.lower():
                return "refused", ""
            return "crashes", "rc=%d, %d error lines, %.1f s\n%s" % (r.returncode, len(lines), time.time() - t0,
                                                                     err[-600:])

        # Four cases at a time (they wait mostly on process start-up); the
        # guarded files and temporaries are checked after each batch.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
        while counts["tried"] < a.cases and time.time() - start < a.seconds:
            batch = []
            for _ in range(4):
                args = make_args(rng, options, guarded)
                np2 = rng.random() < 0.15
                batch.append(([a.mpiexec, "-np", "2"] if np2 else []) + [a.spbench] + args)
            counts["tried"] += len(batch)
            for cmd, (verdict, detail) in zip(batch, pool.map(one, batch)):
                counts[verdict] += 1
                if verdict in ("hangs", "crashes"):
                    failures.append((verdict, cmd, detail))
            now = snapshot(watched)
            if now != before:
                counts["clobbered"] += 1
                failures.append(("clobbered (one of a batch)", [x for c in batch for x in c + ["||"]],
                                 str({k: (before[k], now[k]) for k in now if now[k] != before[k]})))
                before = now
            left = [f for f in os.listdir(tmp) if ".tmp." in f]
            if left:  # a temporary outliving its run is a file lost or clobbered later
                counts["clobbered"] += 1
                failures.append(("temporaries left (one of a batch)", [x for c in batch for x in c + ["||"]],
                                 " ".join(left)))
            for f in os.listdir(tmp):  # outputs a run may create; guarded ones stay
                p = os.path.join(tmp, f)
                if p not in guarded or f == "new.out":
                    if os.path.isfile(p) and not os.path.islink(p):
                        os.unlink(p)
        pool.shutdown()
    print("fuzz_spbench seed %d, %.0f s: cases tried %d | ran %d | refused cleanly %d | crashes %d | hangs %d | "
          "files clobbered %d" % (a.seed, time.time() - start, counts["tried"], counts["ran"], counts["refused"],
                                  counts["crashes"], counts["hangs"], counts["clobbered"]))
    for f in failures[:20]:
        print("FAIL", f[0], " ".join(repr(x) for x in f[1]))
        if len(f) > 2:
            print("    " + f[2].replace("\n", "\n    "))
    bad = counts["crashes"] + counts["hangs"] + counts["clobbered"]
    return 1 if bad or counts["tried"] < 20 else 0


if __name__ == "__main__":
    sys.exit(main())
