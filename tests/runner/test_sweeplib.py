#!/usr/bin/env python3
"""The sweep parser and the sweep CSV writer, without running spbench."""
import csv
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import sweeplib as sl  # noqa: E402

SWEEPS = os.path.join(ROOT, "experiments", "sweeps")
REQUIRED = {"fig3", "fig4", "fig5", "fig6", "fig7", "fig8", "table2", "table3", "zero-vs-comm", "sp-degree",
            "ring-vs-ulysses", "weak-scaling"}


class Parser(unittest.TestCase):
    def test_every_project_sweep_parses_at_both_scales(self):
        names = {f[:-6] for f in os.listdir(SWEEPS) if f.endswith(".sweep")}
        self.assertTrue(REQUIRED <= names, REQUIRED - names)
        for n in names:
            sw = sl.parse_sweep(os.path.join(SWEEPS, n + ".sweep"))
            self.assertEqual(sw.name, n)
            for scale in sl.SCALES:
                pts = sl.expand(sw, scale)
                self.assertTrue(pts, (n, scale))
                for p in pts:
                    self.assertGreater(p.np, 0)
                    sp = int(p.options.get("sp-degree", "1"))
                    self.assertEqual(p.np % sp, 0, (n, scale, p.id))

    def test_expansion_cross_zip_series_and_np(self):
        sw = sl.parse_sweep(os.path.join(HERE, "tiny.sweep"))
        pts = sl.expand(sw, "cpu")
        self.assertEqual(len(pts), 5 * 2)
        self.assertEqual(pts[0].id, "ulysses/np=2/seq-length=64")
        self.assertEqual(pts[0].options["sp-degree"], "2")  # sp-degree = np
        self.assertIn("--seq-length", pts[0].args())
        self.assertEqual([p.series for p in pts[:3]], ["ulysses", "megatron", "bad-heads"])  # interleaved
        bad = [p for p in pts if p.id == "bad-heads/np=2/seq-length=64"][0]
        self.assertEqual(bad.options["num-attention-heads"], "1")  # series overrides the scale
        self.assertEqual(sw.tune["cpu"], {"micro-batch-size": (["1", "2"], 29)})
        t3 = sl.expand(sl.parse_sweep(os.path.join(SWEEPS, "table3.sweep")), "cpu")
        self.assertEqual([(p.np, p.options["seq-length"]) for p in t3], [(1, "1024"), (2, "2048"), (4, "4096")])
        self.assertEqual([p.np for p in sl.expand(sw, "cpu", np_override=4)][:1], [4])
        zc = sl.expand(sl.parse_sweep(os.path.join(SWEEPS, "zero-vs-comm.sweep")), "cpu")
        self.assertEqual(len(zc), 6)
        self.assertEqual({p.options["zero-stage"] for p in zc}, {"0", "3"})
        flags = [p for p in zc if p.options.get("checkpoint-activations") == "yes"]
        self.assertIn("--checkpoint-activations", flags[0].args())
        f6 = [p for p in sl.expand(sl.parse_sweep(os.path.join(SWEEPS, "fig6.sweep")), "paper") if p.series == "megatron"]
        self.assertEqual([(p.options["seq-length"], p.model_options["attn-density"]) for p in f6][:2],
                         [("8192", "1"), ("16384", "0.5")])
        # a series' `scales`: the hybrid's U = 1, 2, 4 series at CPU scale, its U axis per profile at paper scale
        hy = sl.parse_sweep(os.path.join(SWEEPS, "hybrid.sweep"))
        self.assertEqual({p.series for p in sl.expand(hy, "cpu")}, {"u1", "u2", "u4", "allgather-kv"})
        hp = sl.expand(hy, "paper")
        self.assertEqual({p.series for p in hp}, {"a100", "h100"})
        self.assertEqual({p.options["ulysses-degree"] for p in hp}, {"1", "2", "4", "8", "16", "32", "64"})
        self.assertTrue(all("scales" not in p.runner for p in hp))

    def check_bad(self, name, *fragments):
        path = os.path.join(HERE, "bad", name + ".sweep")
        with self.assertRaises(sl.SweepError) as cm:
            sl.parse_sweep(path)
        msg = str(cm.exception)
        self.assertTrue(msg.startswith(name + ".sweep"), msg)
        for f in fragments:
            self.assertIn(f, msg)
        self.assertNotIn("\n", msg)
        return msg

    def test_bad_files_get_one_clear_line(self):
        self.check_bad("unknown-key", ":10:", "unknown key 'hidden-sise'")
        self.check_bad("bad-value", ":10:", "bad value '1k' for 'seq-length'")
        self.check_bad("bad-enum", ":11:", "bad value 'ulyses' for 'strategy'", "ulysses")
        self.check_bad("missing-field", "missing field 'claim'")
        self.check_bad("missing-np", "missing field 'np' in [cpu]")
        self.check_bad("missing-scale", "missing section [paper]")
        self.check_bad("zip-lengths", "different lengths")
        self.check_bad("runner-owned", "'results' is set by the runner")
        self.check_bad("no-series", "missing section [series NAME]")

    def test_inline_errors(self):
        cases = [("[sweep]\nname = x\n[nonsense]\n", "unknown section"),
                 ("[sweep]\nname = x\nname = y\n", "set twice"),
                 ("np = 2\n", "outside a section"),
                 ("[sweep]\nname\n", "expected 'key = value'"),
                 ("[sweep]\nplots = seqlen pie\n", "bad value 'pie' in plots"),
                 ("[sweep]\nname = x\n[cpu]\nnp = two\n", "bad value 'two' for 'np'"),
                 ("[sweep]\nname = x\n[cpu]\ncheckpoint-activations = 1\n", "(yes or no)"),
                 ("[sweep]\nname = x\n[cpu]\nmemory-budget = lots\n", "a size such as"),
                 ("[sweep]\nname = x\n[paper]\nmodel.speed = 2\n", "unknown key 'model.speed'"),
                 ("[sweep]\nname = x\n[cpu]\nmodel.attn-density = 0.5\n", "belongs in [paper]"),
                 ("[sweep]\nname = x\n[paper]\nmodel.attn-density = half\n", "bad value 'half'"),
                 ("[sweep]\nname = x\n[cpu]\nscales = cpu\n", "belongs in a [series] section"),
                 ("[sweep]\nname = x\n[series a]\nscales = gpu\n", "bad value 'gpu' for scales")]
        for text, frag in cases:
            with self.assertRaises(sl.SweepError, msg=text) as cm:
                sl.parse_sweep("inline.sweep", text)
            self.assertIn(frag, str(cm.exception))


class Launcher(unittest.TestCase):
    def test_np_appended_or_put_where_the_launcher_says(self):
        self.assertEqual(sl.launch_command(["mpiexec", "--bind-to", "core"], 4, "spbench", ["--x", "1"]),
                         ["mpiexec", "--bind-to", "core", "-np", "4", "spbench", "--x", "1"])
        self.assertEqual(sl.launch_command(["srun", "--ntasks={np}", "--gpus-per-task=1"], 8, "spbench", []),
                         ["srun", "--ntasks=8", "--gpus-per-task=1", "spbench"])
        self.assertEqual(sl.launch_command(["srun", "-n", "{np}"], 2, "b", ["a"]), ["srun", "-n", "2", "b", "a"])


class CsvWriter(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "sub", "results.csv")

    def tearDown(self):
        self.dir.cleanup()

    def test_round_trip(self):
        rows = [{"point": "a/np=2", "status": "ok", "message": 'has, commas and "quotes"', "tokens_per_s": "123.5"},
                {"point": "b/np=2", "status": "invalid", "message": "line one\nline two", "seq_length": "64"}]
        for r in rows:
            sl.append_row(self.path, r)
        back = sl.read_rows(self.path)
        self.assertEqual(len(back), 2)
        for r, b in zip(rows, back):
            for k, v in r.items():
                self.assertEqual(b[k], v)
            self.assertEqual(list(b.keys()), sl.HEADER)
        with open(self.path) as f:
            self.assertEqual(f.readline().rstrip("\n").split(","), sl.HEADER)

    def test_torn_last_line_is_dropped_and_repaired(self):
        sl.append_row(self.path, {"point": "a", "status": "ok"})
        with open(self.path, "a") as f:
            f.write("tiny,cpu,b/np=2,b,label,o")  # a write cut short: no newline
        self.assertEqual([r["point"] for r in sl.read_rows(self.path)], ["a"])
        rows = sl.prepare_csv(self.path)
        self.assertEqual([r["point"] for r in rows], ["a"])
        with open(self.path) as f:
            text = f.read()
        self.assertTrue(text.endswith("\n"))
        self.assertEqual(len(text.splitlines()), 2)

    def test_old_header_is_migrated_by_name(self):
        os.makedirs(os.path.dirname(self.path))
        with open(self.path, "w") as f:
            f.write("status,point,obsolete\nok,a,zzz\n")
        rows = sl.prepare_csv(self.path)
        self.assertEqual(rows[0]["point"], "a")
        back = sl.read_rows(self.path)
        self.assertEqual(list(back[0].keys()), sl.HEADER)
        self.assertEqual((back[0]["point"], back[0]["status"]), ("a", "ok"))

    def test_replace_row(self):
        for p in ("a", "b", "c"):
            sl.append_row(self.path, {"point": p, "status": "failed"})
        sl.replace_row(self.path, "b", {"point": "b", "status": "ok"})
        self.assertEqual({r["point"]: r["status"] for r in sl.read_rows(self.path)},
                         {"a": "failed", "b": "ok", "c": "failed"})

    def test_classify(self):
        self.assertEqual(sl.classify(2, "spbench: error: predicted 1 GiB ... exceeds --memory-budget 1KiB\n", False)[0],
                         "oom-predicted")
        self.assertEqual(sl.classify(2, "spbench: error: --device cuda: not implemented in this build\n", False),
                         ("unsupported", "--device cuda: not implemented in this build"))
        self.assertEqual(sl.classify(2, "spbench: error: --device cuda: no CUDA device on this machine (x)\n", False),
                         ("unsupported", "--device cuda: no CUDA device on this machine (x)"))
        self.assertEqual(sl.classify(2, "spbench: error: --num-attention-heads 3 is not divisible\n", False)[0],
                         "invalid")
        self.assertEqual(sl.classify(137, "Killed\n", False), ("failed", "exit 137: Killed"))
        self.assertEqual(sl.classify(-9, "", True)[0], "timeout")

    def test_predicted_bytes_follow_the_papers_ratios(self):
        # Ulysses: constant when N and P double; Megatron: grows with N whatever P.
        u1 = sl.predicted_layer_bytes("ulysses", "alltoall", 1024, 64, 1, 2)
        u2 = sl.predicted_layer_bytes("ulysses", "alltoall", 2048, 64, 1, 4)
        self.assertAlmostEqual(u2 / u1, 1.5 * 0.5 * 2 / 1)  # (P-1)/P^2 * N: 3/16*2048 / (1/4*1024)
        m1 = sl.predicted_layer_bytes("megatron", "alltoall", 1024, 64, 1, 2)
        m2 = sl.predicted_layer_bytes("megatron", "alltoall", 2048, 64, 1, 4)
        self.assertAlmostEqual(m2 / m1, 3.0)
        self.assertEqual(sl.predicted_layer_bytes("ulysses", "allgather", 1024, 64, 1, 4),
                         4 * sl.predicted_layer_bytes("ulysses", "alltoall", 1024, 64, 1, 4))

    def test_predicted_bytes_take_the_kv_heads(self):
        # Equal to what spbench recorded in strategies_mpi4 (N = 96, h = 32, H = 4, b = 1, Llama
        # preset), forward + backward per layer.
        def pred(strategy, p, g, comm="alltoall"):
            return sl.predicted_layer_bytes(strategy, comm, 96, 32, 1, p, heads=4, groups=g)
        self.assertEqual(pred("ulysses", 4, 1), 9216 + 9216)    # G < P: one K/V replica per rank
        self.assertEqual(pred("ulysses", 2, 1), 9216 + 9216)
        self.assertEqual(pred("ulysses", 4, 1, "allgather"), 36864 + 36864)
        self.assertEqual(pred("ring", 4, 1), 4608 + 10752)      # K/V blocks shrink by G/H
        self.assertEqual(pred("ring", 2, 1), 3072 + 9216)
        self.assertEqual(pred("megatron", 4, 1), 36864 + 55296)  # activations only
        # G = H (or not given) is the old formula.
        for strategy in ("ulysses", "ring", "megatron", "allgather-kv", "hybrid"):
            self.assertEqual(pred(strategy, 4, 4), sl.predicted_layer_bytes(strategy, "alltoall", 96, 32, 1, 4))
        # Megatron-SP's replica all-reduce, per layer (GPT with biases, 2 layers: 6336 and 4224
        # bytes per link for P = 4 with G = 1 and 2).
        self.assertEqual(2 * sl.kv_replica_link_bytes("megatron", 32, 4, 1, 4), 6336)
        self.assertEqual(2 * sl.kv_replica_link_bytes("megatron", 32, 4, 2, 4), 4224)
        self.assertEqual(sl.kv_replica_link_bytes("megatron", 32, 4, 4, 4), 0)
        self.assertEqual(sl.kv_replica_link_bytes("ulysses", 32, 4, 1, 4), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
