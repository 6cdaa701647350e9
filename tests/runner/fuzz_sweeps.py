#!/usr/bin/env python3
"""Bounded fuzzing of the runner (issue 39): seeded mutations of the sweep
files (lines dropped, doubled, swapped; values replaced by malformed,
extreme or non-ASCII ones; bytes flipped; files cut short) given to
experiments/run --list with the real spbench's option table.  Each case
must print the points or one "run: error:" line: a Python traceback, a
signal or a timeout fails.  A few mutants that still parse are run for
real (the tiny sweep at --np 1) to check that they end cleanly too.  Four
cases at a time.

usage: fuzz_sweeps.py SPBENCH [--seed N] [--seconds S]"""
import argparse
import concurrent.futures
import glob
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN = os.path.join(ROOT, "experiments", "run")
VALUES = ["nan", "inf", "-inf", "0", "-1", "1e999", "0x10", "", " ", "yes", "no", "np", "2147483648",
          "99999999999999999999", "1.5", "\u00e9\u00e9", "a b c", "=", "[", "]", "#", "64 64", "1 2 3 4 5 6 7 8",
          "ulysses", "bogus", "1KiB", "nanGiB", "80GiB", "zip", "\x00", "\\", "'", '"', "%s", "{np}"]


def mutate(rng, text):
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        i = rng.randrange(len(lines)) if lines else 0
        if not lines:
            lines = [""]
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op in (3, 4) and "=" in lines[i]:
            k = lines[i].split("=", 1)[0]
            lines[i] = "%s= %s" % (k, rng.choice(VALUES))
        elif op == 5 and lines[i]:
            c = rng.randrange(len(lines[i]))
            lines[i] = lines[i][:c] + chr(rng.randrange(1, 0x250)) + lines[i][c + 1:]
        elif op == 6:
            lines.insert(i, rng.choice(["[series x]", "[cpu]", "[sweep]", "[bogus]", "tune.seq-length = 1 2",
                                        "zip = np seq-length", "model.attn-density = 0.5", "label = x",
                                        "record-loss = yes", "sp-degree = np", "np = 3", "timeout = 1e-9"]))
        else:
            cut = rng.randrange(len(text) + 1)
            return text[:cut]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("spbench")
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--seconds", type=float, default=50)
    ap.add_argument("--real-runs", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    sources = sorted(glob.glob(os.path.join(ROOT, "experiments", "sweeps", "*.sweep"))) + \
        [os.path.join(HERE, "tiny.sweep")]
    texts = [open(p, encoding="utf-8").read() for p in sources]
    counts = dict(tried=0, listed=0, refused=0, crashes=0, hangs=0, real=0)
    failures = []
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        def one(job):  # (index, text, real) -> (verdict, detail)
            i, text, real = job
            path = os.path.join(tmp, "m%d.sweep" % i)
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
            args = [sys.executable, RUN, path, "--spbench", a.spbench, "--no-plots", "--out",
                    os.path.join(tmp, "out%d" % i)]
            args += ["--np", "1", "--timeout", "60"] if real else ["--list"]
            try:
                r = subprocess.run(args, capture_output=True, text=True, errors="replace",
                                   timeout=120 if real else 20)
            except subprocess.TimeoutExpired:
                return "hangs", ""
            finally:
                os.unlink(path)
            if "Traceback" in r.stderr or r.returncode < 0 or r.returncode > 2:
                return "crashes", "rc=%d\n%s" % (r.returncode, r.stderr[-800:])
            return ("listed" if r.returncode == 0 else "refused"), ""

        # Four at a time: each case is mostly an interpreter's start-up.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
        while time.time() - start < a.seconds:
            jobs = []
            for _ in range(4):
                src = rng.randrange(len(texts))
                text = mutate(rng, texts[src])
                real = counts["real"] < a.real_runs and sources[src].endswith("tiny.sweep") and rng.random() < 0.3
                counts["real"] += real  # counted when started: at most real_runs
                jobs.append((counts["tried"], text, real))
                counts["tried"] += 1
            for (_, text, real), (verdict, detail) in zip(jobs, pool.map(one, jobs)):
                counts[verdict] += 1
                if verdict in ("hangs", "crashes"):
                    failures.append((verdict, text, detail))
        pool.shutdown()
    print("fuzz_sweeps seed %d, %.0f s: cases tried %d | listed or ran %d (%d run for real) | refused cleanly %d | "
          "crashes %d | hangs %d" % (a.seed, time.time() - start, counts["tried"], counts["listed"], counts["real"],
                                    counts["refused"], counts["crashes"], counts["hangs"]))
    for f in failures[:10]:
        print("FAIL %s\n--- sweep ---\n%s\n--- stderr ---\n%s" % (f[0], f[1][:1500], f[2] if len(f) > 2 else ""))
    return 1 if counts["crashes"] or counts["hangs"] or counts["tried"] < 20 else 0


if __name__ == "__main__":
    sys.exit(main())
