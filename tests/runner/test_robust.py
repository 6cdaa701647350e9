#!/usr/bin/env python3
"""The runner's safety (issue 39, classes 7-9, and issue 38's one option
table): bad runner options and sweep values refused without a traceback, a
closed output pipe, points that die with the runner however it dies, one
runner per results directory, and the option table read from spbench.

usage: test_robust.py SPBENCH   (env MPIEXEC: the launcher; default mpiexec)"""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import sweeplib as sl  # noqa: E402

SPBENCH = None
RUN = os.path.join(ROOT, "experiments", "run")
TINY = os.path.join(HERE, "tiny.sweep")

# One long point: a run of many iterations, marked by a seed no other test uses.
LONG = """[sweep]
name = long
title = t
paper = none
claim = none
[paper]
np = 2
[cpu]
np = 2
num-layers = 1
hidden-size = 32
num-attention-heads = 2
seq-length = 64
train-iters = 1000000
seed = %d
timeout = 300
[series only]
strategy = none
"""


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def run(*args, timeout=120):
    return subprocess.run([sys.executable, RUN] + list(args), capture_output=True, text=True, timeout=timeout)


def pids_with(marker):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if marker in cmd and "spbench" in cmd and "point_guard" not in cmd and "mpiexec" not in cmd:
                out.append(int(d))
    return out


class RunnerOptions(unittest.TestCase):
    """Class 7: refused with one line, never a traceback."""

    def refused(self, r, what):
        self.assertNotEqual(r.returncode, 0, what)
        self.assertNotIn("Traceback", r.stderr, what)
        self.assertRegex(r.stderr, r"(run: error|error: argument)", what)

    def test_timeout_and_np(self):
        for bad in ("nan", "inf", "-inf", "0", "-1", "x"):
            self.refused(run(TINY, "--spbench", SPBENCH, "--list", "--timeout", bad), "--timeout " + bad)
        for bad in ("0", "-1", "x", "1.5"):
            self.refused(run(TINY, "--spbench", SPBENCH, "--list", "--np", bad), "--np " + bad)

    def test_sweep_values(self):
        text = read(TINY)
        with tempfile.TemporaryDirectory() as d:
            for bad in ("nan", "inf", "0", "-1", "1e999"):
                path = os.path.join(d, "t.sweep")
                with open(path, "w") as f:
                    f.write(text.replace("timeout = 120", "timeout = " + bad))
                self.refused(run(path, "--spbench", SPBENCH, "--list"), "timeout = " + bad)
            for bad in ("0", "-1", "nan"):
                with open(path, "w") as f:
                    f.write(text.replace("[cpu]\nnp = 2", "[cpu]\nnp = " + bad))
                self.refused(run(path, "--spbench", SPBENCH, "--list"), "np = " + bad)

    def test_closed_pipe(self):
        r = subprocess.run("%s %s %s --spbench %s --list | head -1" % (sys.executable, RUN, TINY, SPBENCH),
                           shell=True, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.stdout.count("\n"), 1)
        self.assertNotIn("Traceback", r.stderr)
        self.assertNotIn("BrokenPipe", r.stderr)


class OptionTable(unittest.TestCase):
    """Issue 38 item 5: spbench lists its options; the runner's copy agrees
    with it, and the runner takes every listed option as a sweep key."""

    def test_no_divergence(self):
        listed = sl.spbench_options(SPBENCH)
        self.assertGreater(len(listed), 40)
        self.assertEqual(sl.option_divergence(listed), [],
                         "experiments/sweeplib.py SPB_OPTIONS and spbench --list-options differ")

    def test_divergence_is_seen(self):
        listed = dict(sl.spbench_options(SPBENCH))
        listed["an-option-added-in-c"] = ("int", None, 0)
        self.assertTrue(any("an-option-added-in-c" in d for d in sl.option_divergence(listed)))

    def test_every_option_is_a_sweep_key(self):
        saved = dict(sl.SPB_OPTIONS)
        try:
            sl.use_spbench_options(SPBENCH)
            text = read(TINY)
            for name, (kind, choices, _) in sl.spbench_options(SPBENCH).items():
                if name in sl.RUNNER_OWNED:
                    continue
                value = choices[0] if choices else {"int": "2", "float": "0.5", "u64": "3", "flag": "yes",
                                                    "size": "1GiB", "str": "x"}[kind]
                sw = sl.parse_sweep("t.sweep", text + "\n[series probe]\n%s = %s\n" % (name, value))
                p = [p for p in sl.expand(sw, "cpu") if p.series == "probe"][0]
                self.assertIn("--" + name, p.args(), name)
        finally:
            sl.SPB_OPTIONS.clear()
            sl.SPB_OPTIONS.update(saved)


class PointsDieWithTheRunner(unittest.TestCase):
    """Class 8: the running point ends within seconds of the runner, however the runner ends."""

    def check(self, sig, seed):
        with tempfile.TemporaryDirectory() as d:
            sweep = os.path.join(d, "long.sweep")
            with open(sweep, "w") as f:
                f.write(LONG % seed)
            marker = "--seed %d" % seed
            p = subprocess.Popen([sys.executable, RUN, sweep, "--spbench", SPBENCH, "--no-plots", "--out", d],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 60
            while time.time() < deadline and len(pids_with(marker)) < 2:
                time.sleep(0.1)
            ranks = pids_with(marker)
            self.assertEqual(len(ranks), 2, "the point's two ranks did not start")
            time.sleep(0.5)
            os.kill(p.pid, sig)
            p.wait(timeout=30)
            deadline = time.time() + 15
            while time.time() < deadline and pids_with(marker):
                time.sleep(0.1)
            left = pids_with(marker)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            self.assertEqual(left, [], "ranks outlived a runner ended by signal %d" % sig)

    def test_sigkill(self):
        self.check(signal.SIGKILL, 390001)

    def test_sighup(self):
        self.check(signal.SIGHUP, 390002)

    def test_sigterm(self):
        self.check(signal.SIGTERM, 390003)


class OneRunnerPerDirectory(unittest.TestCase):
    """Class 9: a second runner on a results directory refuses and names the holder."""

    def test_lock(self):
        with tempfile.TemporaryDirectory() as d:
            holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, %r); "
                                       "import sweeplib as sl; sl.lock_results_dir(%r); print('locked', flush=True); "
                                       "time.sleep(60)" % (os.path.join(ROOT, "experiments"), d)],
                                      stdout=subprocess.PIPE, text=True)
            self.addCleanup(holder.stdout.close)
            try:
                self.assertEqual(holder.stdout.readline().strip(), "locked")
                r = run(TINY, "--spbench", SPBENCH, "--no-plots", "--out", d)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn("in use by another runner (pid %d" % holder.pid, r.stderr)
                self.assertFalse(os.path.exists(os.path.join(d, "results.csv")), "the second runner wrote rows")
            finally:
                holder.kill()
                holder.wait()
            # the lock goes with its process: a runner can take the directory now
            self.assertTrue(sl.lock_results_dir(d))


if __name__ == "__main__":
    SPBENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main()
