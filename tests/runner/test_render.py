#!/usr/bin/env python3
"""plots/render draws every kind of figure from the fixture CSV
(tests/runner/fixture/, made by fixture.sweep) as non-empty PNG and SVG."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RENDER = os.path.join(ROOT, "plots", "render")
FIXTURE = os.path.join(HERE, "fixture", "results.csv")
KINDS = ["seqlen", "gpus", "scaling", "spdegree", "loss", "breakdown", "memory", "bytes"]


class Render(unittest.TestCase):
    def test_every_kind_renders(self):
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([sys.executable, RENDER, "--outdir", out, "--kinds", ",".join(KINDS), FIXTURE],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            for k in KINDS:
                for ext in ("png", "svg"):
                    p = os.path.join(out, "fixture-%s.%s" % (k, ext))
                    self.assertTrue(os.path.exists(p), p)
                    self.assertGreater(os.path.getsize(p), 2000, p)
                with open(os.path.join(out, "fixture-%s.png" % k), "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            # The default kinds (no sweep file for the fixture: every kind its rows support).
            r = subprocess.run([sys.executable, RENDER, "--outdir", out, FIXTURE], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)

    def test_report(self):
        """experiments/report on the fixture filed as fig8's results: sections, figures, loss check."""
        import shutil
        with tempfile.TemporaryDirectory() as res:
            d = os.path.join(res, "cpu", "fig8")
            shutil.copytree(os.path.dirname(FIXTURE), d)
            sys.path.insert(0, os.path.join(ROOT, "experiments"))
            import sweeplib as sl
            rows = sl.read_rows(os.path.join(d, "results.csv"))
            for r in rows:
                r["sweep"] = "fig8"
            sl.write_all(os.path.join(d, "results.csv"), rows)
            r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "report"), "--results", res,
                                "--render"], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(res, "REPORT.md")) as f:
                text = f.read()
            for frag in ("## fig4", "## fig8", "### CPU scale (measured)", "![fig8-loss](cpu/fig8/fig8-loss.png)",
                         "largest difference between any two curves", "4 oom-predicted", "not run (`experiments/run"):
                self.assertIn(frag, text)
            self.assertTrue(os.path.getsize(os.path.join(d, "fig8-loss.png")) > 2000)
            self.assertNotIn("## GPU", text)  # no results/gpu: no GPU section

    def test_report_gpu(self):
        """experiments/report's GPU section, computed from the committed results/gpu CSVs; a failing check counts."""
        import shutil
        with tempfile.TemporaryDirectory() as res:
            g = os.path.join(res, "gpu")
            os.makedirs(g)
            for f in ("timings", "layer_timings", "checks", "layer_checks", "strategies"):
                shutil.copy(os.path.join(ROOT, "results", "gpu", f + ".csv"), g)
            # one rank's attention at P = 8 (spbench-gpu-check since 2026-12-03), faster than any layer call here:
            # not the layer's own, so not in the flash range below
            with open(os.path.join(g, "timings.csv")) as f:
                row = next(x for x in f.read().splitlines() if ",flash fwd (mma),16384," in x)
            with open(os.path.join(g, "timings.csv"), "a") as f:
                for share in ("heads/8 P=8", "rows/8 P=8"):
                    cells = row.split(",")
                    cells[5], cells[13] = "flash fwd (mma) (%s)" % share, "999"
                    f.write(",".join(cells) + "\n")
            r = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "report"), "--results", res],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(res, "REPORT.md")) as f:
                text = f.read()
            for frag in ("## GPU: kernels, the 7B layer and every strategy (measured, NVIDIA H200)",
                         "406 of 406 kernel checks", "212 of 212 layer and core checks", "35 `spbench --device cuda`",
                         "84-104 % (median 92 %)", "ours 190-209 TFLOP/s forward and 140-187 backward",
                         "at 32768 tokens: 33.6 % of the data-sheet peak", "Ulysses 0.98-1.72"):
                self.assertIn(frag, text)
            # one kernel check made to fail: the section says so
            with open(os.path.join(g, "checks.csv")) as f:
                lines = f.read().splitlines()
            lines[5] = lines[5].rsplit(",", 1)[0] + ",FAIL"
            with open(os.path.join(g, "checks.csv"), "w") as f:
                f.write("\n".join(lines) + "\n")
            subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "report"), "--results", res],
                           capture_output=True, text=True, timeout=300, check=True)
            with open(os.path.join(res, "REPORT.md")) as f:
                self.assertIn("405 of 406 kernel checks", f.read())

    def test_gqa_grid_and_band(self):
        """The gqa figures (groups: against G; pgroups: against P): a refused point is a marker at
        the panel's foot, never a line point (not a zero); a MODELLED row's bars are the model's
        band, a measured row's its min-max."""
        import importlib.machinery
        import importlib.util
        loader = importlib.machinery.SourceFileLoader("render_mod", RENDER)
        render = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(render)
        sl = render.sl

        def row(series, label, status, g, np_, t=1.0, scale="paper"):
            r = {"sweep": "synthetic", "scale": scale, "series": series, "label": label, "status": status,
                 "point": "%s/np=%d/num-query-groups=%d" % (series, np_, g), "np": np_, "sp": np_,
                 "num_query_groups": g, "num_layers": 2, "hidden_size": 64, "num_heads": 8, "seq_length": 4096,
                 "profile": "profiles/a100.profile"}
            if status in sl.DONE_STATUSES:
                r.update(iter_time_median_s=t, iter_time_low_s=0.8 * t, iter_time_high_s=1.5 * t,
                         iter_time_min_s=0.95 * t, iter_time_max_s=1.05 * t,
                         layer_link_bytes_measured=1048576 * g)
            return r
        rows = [row("u", "Ulysses", "modelled", g, 4, 1.0 + g) for g in (8, 4, 2, 1)]
        rows += [row("m", "Megatron-SP", "modelled", 8, 4, 3.0), row("m", "Megatron-SP", "invalid", 4, 4)]
        rows += [row("r", "ring", "modelled", 2, p, 2.0) for p in (2, 4)]
        for got, want in ((render.time_bars(rows[0]), (9.0, 7.2, 13.5)),                          # the band
                          (render.time_bars(dict(rows[0], status="ok", scale="cpu")), (9.0, 8.55, 9.45))):  # min-max
            for a, b in zip(got, want):
                self.assertAlmostEqual(a, b)
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as tmp:
            csv_path = os.path.join(out, "results.csv")
            sl.write_all(csv_path, rows)
            ctx = render.Ctx(csv_path, sl.read_rows(csv_path), out, tmp, True)
            self.assertTrue(render.plot_groups(ctx))
            self.assertTrue(render.plot_pgroups(ctx))
            for k in ("groups", "pgroups"):
                self.assertGreater(os.path.getsize(os.path.join(out, "synthetic-%s.png" % k)), 2000)
            with open(os.path.join(tmp, "synthetic-groups-panels.dat")) as f:
                panels = f.read()
            # Megatron-SP's refused G = 4: a cross (pt 2) at x = 4 in both panels, and no line point there
            self.assertEqual(panels.count("at first 4, graph 0.05 point pt 2"), 2, panels)
            lines = {}
            for name in os.listdir(tmp):
                if name.startswith("synthetic-groups-p") and name.endswith(".dat") and "panels" not in name:
                    with open(os.path.join(tmp, name)) as f:
                        lines[name] = [l.split() for l in f.read().splitlines() if l.strip()]
            megatron_time = lines["synthetic-groups-p2-1.dat"]   # panel 2 (time), second label
            self.assertEqual(megatron_time, [["8", "3", "2.4", "4.5"]])
            ulysses_time = lines["synthetic-groups-p2-0.dat"]
            self.assertEqual(ulysses_time[0], ["1", "2", "1.6", "3"])

    def test_bad_input(self):
        with tempfile.TemporaryDirectory() as out:
            empty = os.path.join(out, "empty.csv")
            open(empty, "w").close()
            r = subprocess.run([sys.executable, RENDER, empty], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no rows", r.stderr)
            r = subprocess.run([sys.executable, RENDER, "--kinds", "pie", "--outdir", out, FIXTURE],
                               capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("unknown kind 'pie'", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
