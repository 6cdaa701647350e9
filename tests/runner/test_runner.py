#!/usr/bin/env python3
"""experiments/run end to end on tests/runner/tiny.sweep with the real spbench:
statuses, whole rows when the runner is killed mid-sweep, resume, --retry-failed,
--tune, invalid-tflops, --scale paper without the model.

usage: test_runner.py SPBENCH   (env MPIEXEC: the launcher; default mpiexec)"""
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


def run(*args, check=True):
    r = subprocess.run([sys.executable, RUN, TINY, "--spbench", SPBENCH, "--no-plots"] + list(args),
                       capture_output=True, text=True, timeout=600)
    if check and r.returncode != 0:
        raise AssertionError("run %s failed (%d):\n%s\n%s" % (args, r.returncode, r.stdout, r.stderr))
    return r


def children(pid):
    out = []
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def check_whole(test, path):
    """Every line of the file is a complete CSV record with the header's columns."""
    import csv
    with open(path, newline="") as f:
        text = f.read()
    test.assertTrue(text.endswith("\n"), "last row torn")
    recs = list(csv.reader(text.splitlines()))
    test.assertEqual(recs[0], sl.HEADER)
    for r in recs[1:]:
        test.assertEqual(len(r), len(sl.HEADER), r[:4])
    points = [r[2] for r in recs[1:]]
    test.assertEqual(len(points), len(set(points)), "duplicate points")
    return points


class Runner(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.csv = os.path.join(self.dir.name, "tiny", "results.csv")

    def tearDown(self):
        self.dir.cleanup()

    def test_statuses_kill_resume_retry(self):
        # Kill the runner (SIGKILL, no chance to clean up) while points run.
        p = subprocess.Popen([sys.executable, RUN, TINY, "--spbench", SPBENCH, "--no-plots", "--out", self.csv],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            rows = sl.read_rows(self.csv) if os.path.exists(self.csv) else []
            if len(rows) >= 3:
                break
            time.sleep(0.05)
        kids = children(p.pid)
        p.kill()
        p.wait()
        for k in kids:  # the mpiexec of the point in flight (its own session)
            try:
                os.killpg(k, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        first = check_whole(self, self.csv)
        self.assertGreaterEqual(len(first), 3)
        self.assertLess(len(first), 10, "the sweep finished before it was killed; test proves nothing")

        # Resume: the finished points are skipped, the rest run, nothing twice.
        r = run("--out", self.csv)
        self.assertIn("%d already in" % len(first), r.stdout)
        self.assertIn("[1/%d]" % (10 - len(first)), r.stdout)
        self.assertRegex(r.stdout, r"elapsed \d+:\d\d, ~\d+:\d\d left")
        points = check_whole(self, self.csv)
        self.assertEqual(sorted(points), sorted(p.id for p in sl.expand(sl.parse_sweep(TINY), "cpu")))
        rows = {r["point"]: r for r in sl.read_rows(self.csv)}
        st = {k: v["status"] for k, v in rows.items()}
        for n in (64, 128):
            self.assertEqual(st["ulysses/np=2/seq-length=%d" % n], "ok")
            self.assertEqual(st["megatron/np=2/seq-length=%d" % n], "ok")
            self.assertEqual(st["bad-heads/np=2/seq-length=%d" % n], "invalid")
            self.assertEqual(st["oom/np=2/seq-length=%d" % n], "oom-predicted")
            # bf16 over NCCL on --device cuda: refused as unsupported where the
            # build has no CUDA (or the machine no GPU), as in CI; on a machine
            # that has GPUs it runs (ok) or wants one GPU per rank (invalid).
            cuda = rows["cuda/np=2/seq-length=%d" % n]
            if "not implemented" in cuda["message"] or "no CUDA device" in cuda["message"]:
                self.assertEqual(cuda["status"], "unsupported", cuda["message"])
            else:
                self.assertIn(cuda["status"], ("ok", "invalid"), cuda["message"])
        ok = rows["ulysses/np=2/seq-length=128"]
        for col in ("iter_time_median_s", "iter_time_min_s", "iter_time_max_s", "tokens_per_s",
                    "tflops_paper_per_rank", "tflops_counted_per_rank", "peak_mem_activations_bytes",
                    "alltoall_link_bytes", "forward_comm_s", "comm_fraction", "machine", "commit", "date"):
            self.assertNotEqual(ok[col], "", col)
        self.assertEqual(ok["layer_link_bytes_measured"], ok["layer_link_bytes_predicted"])
        self.assertEqual((ok["machines"], ok["sp_group_machines"], ok["dp_group_machines"]), ("1", "1", "1"))
        self.assertTrue(os.path.getsize(os.path.join(os.path.dirname(self.csv), ok["loss_log"])) > 0)
        bad = rows["bad-heads/np=2/seq-length=64"]
        self.assertIn("not divisible", bad["message"])
        self.assertEqual((bad["strategy"], bad["seq_length"], bad["num_heads"]), ("ulysses", "64", "1"))
        self.assertIn("exceeds --memory-budget", rows["oom/np=2/seq-length=64"]["message"])

        # A rerun does nothing; --retry-failed redoes exactly the 6 points not ok.
        self.assertIn("0 to run", run("--out", self.csv).stdout)
        r = run("--out", self.csv, "--retry-failed")
        self.assertIn("6 to run", r.stdout)
        self.assertEqual(len(check_whole(self, self.csv)), 10)

    def test_tune_tflops_and_no_model(self):
        r = run("--out", self.csv, "--tune", "--peak-tflops", "1e-9")
        rows = {r["point"]: r for r in sl.read_rows(self.csv)}
        t = rows["megatron/np=2/seq-length=64"]
        self.assertEqual(t["status"], "invalid-tflops")
        self.assertIn("exceeds the device peak", t["message"])
        self.assertRegex(t["tune_tried"], r"micro-batch-size=1:\S+; micro-batch-size=2:\S+")
        r = run("--out", os.path.join(self.dir.name, "tuned.csv"), "--tune")
        rows = {r["point"]: r for r in sl.read_rows(os.path.join(self.dir.name, "tuned.csv"))}
        t = rows["megatron/np=2/seq-length=64"]
        self.assertEqual(t["status"], "ok")
        self.assertIn(t["tune_choice"], ("micro-batch-size=1", "micro-batch-size=2"))
        self.assertEqual(t["micro_batch_size"], t["tune_choice"].split("=")[1])
        self.assertEqual(rows["bad-heads/np=2/seq-length=64"]["status"], "invalid")

        paper = os.path.join(self.dir.name, "paper.csv")
        r = run("--scale", "paper", "--out", paper, "--model", os.path.join(self.dir.name, "no-such-model"))
        rows = sl.read_rows(paper)
        self.assertEqual(len(rows), 10)
        self.assertEqual({r["status"] for r in rows}, {"no-model"})
        self.assertIn("performance model is not built", rows[0]["message"])

    def test_paper_scale_with_a_model(self):
        paper = os.path.join(self.dir.name, "paper.csv")
        run("--scale", "paper", "--out", paper, "--model", os.path.join(HERE, "fake_model.py"))
        rows = {r["point"]: r for r in sl.read_rows(paper)}
        self.assertEqual(rows["megatron/np=2/seq-length=64"]["status"], "modelled")
        self.assertEqual(rows["megatron/np=2/seq-length=64"]["machine"], "a100.profile")
        # the model was given an absolute path; the CSV holds it relative to the repository
        self.assertEqual(rows["megatron/np=2/seq-length=64"]["profile"], os.path.join("profiles", "a100.profile"))
        self.assertEqual(rows["megatron/np=2/seq-length=128"]["status"], "oom-predicted")
        self.assertIn("modelled: needs 128 GiB per rank, has 100 GiB", rows["megatron/np=2/seq-length=128"]["message"])

    def test_launcher_with_its_own_count_flag(self):
        # A launcher that takes no -np (srun's --ntasks): the runner puts the
        # count where the launcher's words say {np}.  The stand-in records its
        # words and starts the ranks with the real launcher.
        real = os.environ.get("MPIEXEC")
        if not real:
            try:
                with open(os.path.join(os.path.dirname(SPBENCH), "mpiexec.path")) as f:
                    real = f.read().strip()
            except OSError:
                real = "mpiexec"
        words = os.path.join(self.dir.name, "launcher-words")
        fake = os.path.join(self.dir.name, "fake-srun")
        with open(fake, "w") as f:
            f.write('#!/bin/sh\necho "$@" >> %s\ncase "$1" in --ntasks=*) n=${1#--ntasks=}; shift ;; '
                    '*) echo "fake-srun: --ntasks=N first, got $1" >&2; exit 2 ;; esac\n'
                    'exec %s -np "$n" "$@"\n' % (words, real))
        os.chmod(fake, 0o755)
        sweep = os.path.join(self.dir.name, "one.sweep")
        with open(sweep, "w") as f:
            f.write("[sweep]\nname = one\ntitle = t\npaper = none\nclaim = none\nplots = seqlen\n"
                    "[paper]\nnp = 2\nnum-layers = 1\nhidden-size = 32\nnum-attention-heads = 2\n"
                    "seq-length = 64\n"
                    "[cpu]\nnp = 2\nnum-layers = 1\nhidden-size = 32\nnum-attention-heads = 2\n"
                    "seq-length = 64\nmicro-batch-size = 1\ntrain-iters = 2\ntimeout = 120\n"
                    "[series ulysses]\nlabel = Ulysses\nstrategy = ulysses\nsp-degree = np\n")
        r = subprocess.run([sys.executable, RUN, sweep, "--spbench", SPBENCH, "--no-plots", "--out", self.csv,
                            "--mpiexec", fake + " --ntasks={np}"], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        rows = sl.read_rows(self.csv)
        self.assertEqual([(x["point"], x["status"]) for x in rows], [("ulysses/np=2", "ok")],
                         [x["message"] for x in rows])
        with open(words) as f:
            self.assertTrue(f.read().startswith("--ntasks=2 " + SPBENCH + " "))
        listed = subprocess.run([sys.executable, RUN, sweep, "--spbench", SPBENCH, "--list", "--np", "4",
                                 "--mpiexec", "srun --ntasks={np} --gpus-per-task=1"],
                                capture_output=True, text=True, timeout=60)
        self.assertIn("srun --ntasks=4 --gpus-per-task=1 " + SPBENCH, listed.stdout)
        self.assertNotIn("-np", listed.stdout)

    def test_bad_sweep_and_missing_binary(self):
        r = subprocess.run([sys.executable, RUN, os.path.join(HERE, "bad", "unknown-key.sweep")],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unknown key 'hidden-sise'", r.stderr)
        r = subprocess.run([sys.executable, RUN, TINY, "--spbench", "/nonexistent/spbench", "--out", self.csv],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("not found", r.stderr)


if __name__ == "__main__":
    SPBENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
