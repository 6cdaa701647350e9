"""spbench sweeps: the sweep-file parser, point expansion, the sweep CSV
(fixed header, whole-row appends, resume) and running one point.

Python 3 standard library only.  Format: docs/RUNNER.md; CSV: docs/FORMATS.md.
"""
import csv
import io
import itertools
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------
# spbench's options (common/runtime/config.c): kind, default, results column.
# kinds: int, float, u64, str, flag, size, or a tuple of allowed words.
# --------------------------------------------------------------------------
SPB_OPTIONS = {
    "num-layers": ("int", 2, "num_layers"),
    "hidden-size": ("int", 64, "hidden_size"),
    "num-attention-heads": ("int", 4, "num_heads"),
    "ffn-hidden-size": ("int", None, "ffn_hidden_size"),
    # today's models (issue 35; docs/FORMATS.md): a preset and its parts
    "model": (("gpt", "llama"), "gpt", None),
    "num-query-groups": ("int", None, "num_query_groups"),
    "position-embedding-type": (("learned", "rope"), None, None),
    "rotary-base": ("float", None, None),
    "normalization": (("layernorm", "rmsnorm"), None, None),
    "swiglu": ("flag", "no", None),
    "untie-embeddings-and-output-weights": ("flag", "no", None),
    "disable-bias-linear": ("flag", "no", None),
    "vocab-size": ("int", 256, "vocab_size"),
    "seq-length": ("int", 64, "seq_length"),
    "max-position-embeddings": ("int", None, None),
    "init-method-std": ("float", 0.02, None),
    "micro-batch-size": ("int", 4, "micro_batch_size"),
    "global-batch-size": ("int", None, "global_batch_size"),
    "train-iters": ("int", 10, "train_iters"),
    "lr": ("float", 1e-3, None),
    "min-lr": ("float", 0.0, None),
    "lr-warmup-iters": ("int", 0, None),
    "lr-decay-style": (("constant", "linear", "cosine"), "constant", None),
    "weight-decay": ("float", 0.0, None),
    "adam-beta1": ("float", 0.9, None),
    "adam-beta2": ("float", 0.95, None),
    "adam-eps": ("float", 1e-8, None),
    "clip-grad": ("float", 1.0, None),
    "seed": ("u64", 1234, None),
    "sp-degree": ("int", 1, "sp"),
    "strategy": (("none", "ulysses", "megatron", "ring", "hybrid", "allgather-kv"), "none", "strategy"),
    "zero-stage": (("0", "1", "2", "3"), "0", "zero_stage"),
    "checkpoint-activations": ("flag", "no", "checkpoint_activations"),
    "attention": ("str", "flash", "attention"),  # backends grow; spbench validates
    "attention-mask": (("causal", "full"), "causal", "attention_mask"),
    "ulysses-comm": (("alltoall", "allgather"), "alltoall", "ulysses_comm"),
    "ring-layout": (("contiguous", "zigzag"), "contiguous", "ring_layout"),
    "ulysses-degree": ("int", 0, "ulysses_degree"),  # hybrid: all-to-all degree U (0 = P), ring degree P/U
    "ulysses-overlap": ("int", 0, None),  # Ulysses/hybrid: all-to-alls in K head groups overlapping attention
    "sparse-block": ("int", 0, None),           # blocked-sparse attention (docs/SPARSE.md)
    "sparse-local-blocks": ("int", 0, None),
    "sparse-global-blocks": ("int", 0, None),
    "device": (("cpu", "cuda"), "cpu", "device"),
    "comm": (("mpi", "nccl"), "mpi", "comm"),
    "precision": (("fp32", "bf16", "fp16"), "fp32", "precision"),  # at paper scale: the model's precision
    "data": ("str", None, None),
    "log-interval": ("int", 1, None),
    "timing-warmup": ("int", 1, None),
    "memory-budget": ("size", None, "memory_budget"),
    "compare-alltoall": ("flag", "no", None),
    "kernel-timeline": ("flag", "no", None),  # --device cuda: each phase's GPU busy and idle time (docs/FORMATS.md)
    "quiet": ("flag", "yes", None),
    # mixed precision, the CUDA flash kernels' variant, fp16 loss scaling
    "bf16-kernels": (("fast", "reference"), None, None),
    "bf16-direct": ("str", None, None),
    "flash-block-rows": ("int", None, None),
    "flash-dq": (("split", "fused"), None, None),
    "flash-fwd": (("mma", "wgmma"), None, None),
    "flash-bwd": (("mma", "wgmma"), None, None),
    "loss-scale": ("float", 0.0, None),
    "initial-loss-scale": ("float", 65536.0, None),
    "min-loss-scale": ("float", 1.0, None),
    "loss-scale-window": ("int", 1000, None),
}
# Options the runner sets itself, per point.
RUNNER_OWNED = {"results", "loss-log", "run-name", "dump", "save", "load", "overwrite"}

# Keys of the runner in a scale or series section (not spbench options).
RUNNER_KEYS = {
    "np": "int",              # MPI ranks (world size); model: --world-size
    "zip": "keys",            # axes varied together instead of crossed
    "peak-tflops": "float",   # per rank; rows above it are invalid-tflops
    "profile": "str",         # --scale paper: profiles/<name>.profile for the model
    "record-loss": "bool",    # pass --loss-log and keep the curve per point
    "timeout": "seconds",     # seconds per point (positive, finite)
    "label": "str",           # series: legend text
    "scales": "str",          # series: the scales it runs at (default: every scale)
}
# Options only the performance model takes (build/spbench-model; docs/MODEL.md),
# written model.OPTION in [paper].
MODEL_OPTIONS = {"attn-density": "float", "precision": ("fp32", "bf16", "fp16"), "max-seq": "flag"}
SWEEP_KEYS = {"name": True, "title": True, "paper": True, "claim": True, "shows": False, "plots": False,
              "description": False}
PLOT_KINDS = ("seqlen", "gpus", "scaling", "loss", "breakdown", "memory", "bytes", "spdegree", "udegree", "groups", "pgroups")
SCALES = ("cpu", "paper")

# Statuses of a row (docs/FORMATS.md).
DONE_STATUSES = ("ok", "modelled")


class SweepError(Exception):
    pass


class Sweep:
    def __init__(self, path):
        self.path = path
        self.meta = {}
        self.scales = {}       # scale -> {key: (values list, lineno)}
        self.series = []       # [(name, {key: (values, lineno)})]
        self.tune = {s: {} for s in SCALES}   # scale -> {option: [values]}

    @property
    def name(self):
        return self.meta["name"]

    @property
    def plots(self):
        return self.meta.get("plots", "").split()


def _check_value(where, key, value, kind):
    if kind == "int":
        if not re.fullmatch(r"[0-9]+", value) or int(value) <= 0 and key not in ("lr-warmup-iters", "timing-warmup"):
            raise SweepError("%s: bad value '%s' for '%s' (a positive integer)" % (where, value, key))
    elif kind == "u64":
        if not re.fullmatch(r"[0-9]+", value):
            raise SweepError("%s: bad value '%s' for '%s' (a non-negative integer)" % (where, value, key))
    elif kind in ("float", "seconds"):
        try:
            v = float(value)
        except ValueError:
            v = float("nan")
        if not math.isfinite(v) or (kind == "seconds" and v <= 0):
            raise SweepError("%s: bad value '%s' for '%s' (%s)" % (where, value, key, "a finite number" if kind ==
                             "float" else "seconds, a positive finite number"))
    elif kind in ("flag", "bool"):
        if value not in ("yes", "no"):
            raise SweepError("%s: bad value '%s' for '%s' (yes or no)" % (where, value, key))
    elif kind == "size":
        if not re.fullmatch(r"[0-9.]+([KMGT]i?B|B)?", value):
            raise SweepError("%s: bad value '%s' for '%s' (a size such as 512MiB or 80GiB)" % (where, value, key))
    elif isinstance(kind, tuple):
        if value not in kind:
            raise SweepError("%s: bad value '%s' for '%s' (one of: %s)" % (where, value, key, ", ".join(kind)))


def _kind(key):
    if key in SPB_OPTIONS:
        return SPB_OPTIONS[key][0]
    return RUNNER_KEYS.get(key)


def parse_sweep(path, text=None):
    """Parse a sweep file; raise SweepError('file:line: message') on any problem."""
    if text is None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise SweepError("%s: cannot read: %s" % (path, e.strerror))
    sw = Sweep(path)
    section = None
    seen = set()
    fname = os.path.basename(path)
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = "%s:%d" % (fname, lineno)
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[\s*([a-z]+)(?:\s+([A-Za-z0-9_.+-]+))?\s*\]", line)
        if m:
            kind, arg = m.group(1), m.group(2)
            if kind == "sweep" and not arg:
                section = ("sweep", None)
            elif kind in SCALES and not arg:
                section = ("scale", kind)
                sw.scales[kind] = {}
            elif kind == "series" and arg:
                if any(n == arg for n, _ in sw.series):
                    raise SweepError("%s: series '%s' defined twice" % (where, arg))
                section = ("series", arg)
                sw.series.append((arg, {}))
            else:
                raise SweepError("%s: unknown section '%s' (sections: [sweep], [cpu], [paper], [series NAME])"
                                 % (where, line))
            if section in seen:
                raise SweepError("%s: section %s appears twice" % (where, line))
            seen.add(section)
            continue
        if "=" not in line:
            raise SweepError("%s: expected 'key = value', got '%s'" % (where, line))
        key, value = (s.strip() for s in line.split("=", 1))
        key = key.replace("_", "-") if section is None or section[0] != "sweep" else key
        if section is None:
            raise SweepError("%s: '%s' outside a section" % (where, key))
        if not value:
            raise SweepError("%s: '%s' has no value" % (where, key))
        if section[0] == "sweep":
            if key not in SWEEP_KEYS:
                raise SweepError("%s: unknown key '%s' in [sweep] (keys: %s)" % (where, key, ", ".join(SWEEP_KEYS)))
            if key in sw.meta:
                raise SweepError("%s: '%s' set twice" % (where, key))
            if key == "plots":
                for p in value.split():
                    if p not in PLOT_KINDS:
                        raise SweepError("%s: bad value '%s' in plots (kinds: %s)" % (where, p, ", ".join(PLOT_KINDS)))
            if key == "name" and not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
                raise SweepError("%s: bad value '%s' for name (letters, digits, - _ .)" % (where, value))
            sw.meta[key] = value
            continue
        table = sw.scales[section[1]] if section[0] == "scale" else sw.series[-1][1]
        if key.startswith("model."):
            mkey = key[6:]
            if mkey not in MODEL_OPTIONS:
                raise SweepError("%s: unknown key '%s' (model options: %s)" % (where, key, ", ".join(MODEL_OPTIONS)))
            if section[0] == "series" or section[1] != "paper":
                raise SweepError("%s: '%s' belongs in [paper] (options of the performance model)" % (where, key))
            for v in value.split():
                _check_value(where, key, v, MODEL_OPTIONS[mkey])
            if key in table:
                raise SweepError("%s: '%s' set twice in this section" % (where, key))
            table[key] = (value.split(), lineno)
            continue
        tune = key.startswith("tune.")
        okey = key[5:] if tune else key
        if okey in RUNNER_OWNED:
            raise SweepError("%s: '%s' is set by the runner per point; remove it" % (where, okey))
        kind = _kind(okey)
        if kind is None:
            raise SweepError("%s: unknown key '%s' (not a spbench option nor a runner key; see docs/RUNNER.md)"
                             % (where, key))
        if okey in ("label", "scales") and section[0] != "series":
            raise SweepError("%s: '%s' belongs in a [series] section" % (where, okey))
        if okey == "scales" and any(v not in SCALES for v in value.split()):
            raise SweepError("%s: bad value '%s' for scales (%s)" % (where, value, ", ".join(SCALES)))
        if tune and (section[0] != "scale" or okey not in SPB_OPTIONS):
            raise SweepError("%s: '%s': tune.OPTION goes in [cpu] or [paper] and names a spbench option" % (where, key))
        # profile names have no spaces: several are an axis (one point per machine profile)
        values = [value] if (kind in ("str", "keys") and okey != "profile") or okey in ("label",) else value.split()
        if kind == "keys":
            values = value.split()
            for z in values:
                if (_kind(z) is None and not z.startswith("model.")) or z == "zip":
                    raise SweepError("%s: bad value '%s' in zip (a key of this section)" % (where, z))
        else:
            for v in values:
                if okey == "sp-degree" and v == "np":
                    continue
                _check_value(where, okey, v, kind)
        store = sw.tune[section[1]] if tune else table
        if okey in store:
            raise SweepError("%s: '%s' set twice in this section" % (where, key))
        store[okey] = (values, lineno)
    # Required fields.
    for k, required in SWEEP_KEYS.items():
        if required and k not in sw.meta:
            raise SweepError("%s: missing field '%s' in [sweep]" % (fname, k))
    for s in SCALES:
        if s not in sw.scales:
            raise SweepError("%s: missing section [%s] (every sweep names the paper's and a CPU-scale configuration)"
                             % (fname, s))
        if "np" not in sw.scales[s]:
            raise SweepError("%s: missing field 'np' in [%s]" % (fname, s))
    if not sw.series:
        raise SweepError("%s: missing section [series NAME] (at least one)" % fname)
    for s in SCALES:
        z = sw.scales[s].get("zip")
        if z:
            lens = set()
            for k in z[0]:
                if k not in sw.scales[s]:
                    raise SweepError("%s:%d: zip names '%s', which [%s] does not set" % (fname, z[1], k, s))
                lens.add(len(sw.scales[s][k][0]))
            if len(lens) != 1:
                raise SweepError("%s:%d: the zipped keys %s have lists of different lengths" % (fname, z[1], " ".join(z[0])))
    return sw


# --------------------------------------------------------------------------
# Points
# --------------------------------------------------------------------------
class Point:
    def __init__(self, sweep, scale, series, label, options, np_, axes, runner):
        self.sweep, self.scale, self.series, self.label = sweep, scale, series, label
        self.options = options      # spbench option -> value (strings)
        self.np = np_
        self.axes = axes            # [(key, value)] that vary across the sweep
        self.runner = runner        # runner keys (peak-tflops, profile, record-loss, timeout)
        self.id = series + "".join("/%s=%s" % kv for kv in axes)
        self.model_options = {}

    def args(self):
        out = []
        for k, v in self.options.items():
            kind = SPB_OPTIONS[k][0]
            if kind == "flag":
                if v == "yes":
                    out.append("--" + k)
            else:
                out += ["--" + k, v]
        return out


def expand(sw, scale, np_override=None):
    """All points of one scale: the axes' combinations in file order, and at each
    combination every series in file order."""
    base = sw.scales[scale]
    points = []
    order = []   # (combination index, series index): the sweep runs the series back to back at each
                 # combination, so a burst of load on a shared machine does not fall on one series only
    for si, (sname, sopts) in enumerate(sw.series):
        if "scales" in sopts and scale not in sopts["scales"][0][0].split():
            continue
        combo = 0
        merged = dict(base)
        merged.update(sopts)
        if np_override is not None:
            merged["np"] = ([str(np_override)], 0)
        zipped = merged["zip"][0] if "zip" in merged else []
        zipped = [k for k in zipped if k in merged and len(merged[k][0]) > 1]
        axes_cross = [k for k, (v, _) in merged.items() if len(v) > 1 and k not in zipped and k != "zip"]
        zip_rows = list(zip(*[merged[k][0] for k in zipped])) if zipped else [()]
        cross_rows = list(itertools.product(*[merged[k][0] for k in axes_cross])) if axes_cross else [()]
        # Which keys vary anywhere in this sweep (for a stable point id).
        for zr in zip_rows:
            for cr in cross_rows:
                vals = {k: v[0] for k, (v, _) in merged.items() if k != "zip"}
                vals.update(dict(zip(zipped, zr)))
                vals.update(dict(zip(axes_cross, cr)))
                np_ = int(vals["np"])
                if vals.get("sp-degree") == "np":
                    vals["sp-degree"] = str(np_)
                opts = {k: v for k, v in vals.items() if k in SPB_OPTIONS}
                model_opts = {k[6:]: v for k, v in vals.items() if k.startswith("model.")}
                runner = {k: v for k, v in vals.items() if k in RUNNER_KEYS and k != "scales"}
                axes = [("np", str(np_))] + [(k, vals[k]) for k in zipped + axes_cross if k != "np"]
                label = runner.pop("label", sname)
                pt = Point(sw.name, scale, sname, label, opts, np_, axes, runner)
                pt.model_options = model_opts
                points.append(pt)
                order.append((combo, si))
                combo += 1
    points = [p for _, p in sorted(zip(order, points), key=lambda t: t[0])]
    ids = [p.id for p in points]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[0]
        raise SweepError("%s: two points have the same id '%s' (give series distinct names)" % (sw.path, dup))
    return points


# --------------------------------------------------------------------------
# The sweep CSV
# --------------------------------------------------------------------------
RUNNER_COLUMNS = ["sweep", "scale", "point", "series", "label", "status", "message", "np", "ulysses_comm",
                  "ulysses_degree", "num_query_groups",
                  "memory_budget", "tune_choice", "tune_tried", "profile", "loss_log", "elapsed_s",
                  "layer_link_bytes_measured", "layer_link_bytes_predicted"]
# spbench's results row (experiments/run_summary.c), in its order.
SPB_COLUMNS = """run_name strategy device comm precision attention world_size dp sp zero_stage checkpoint_activations ring_layout
attention_mask sparse_block sparse_local_blocks sparse_global_blocks num_layers hidden_size num_heads ffn_hidden_size vocab_size seq_length micro_batch_size
global_batch_size num_params train_iters measured_iters iter_time_median_s iter_time_min_s iter_time_max_s
tokens_per_s tflops_paper_per_rank tflops_counted_per_rank gemm_gflops_per_rank first_loss final_loss
time_data_s time_forward_s time_backward_s time_grad_reduce_s time_optimizer_s time_gemm_s time_attention_s
time_comm_s time_exchange_s peak_mem_params_bytes peak_mem_grads_bytes peak_mem_optimizer_bytes
peak_mem_activations_bytes peak_mem_workspace_bytes peak_mem_comm_bytes peak_mem_total_bytes
device_used_peak_bytes model_fp32_bytes
modelled_bf16_bytes layer_comm_s other_compute_s time_between_phases_s host_waits_per_iter kernel_timeline
gpu_busy_forward_s gpu_idle_forward_s gpu_busy_backward_s gpu_idle_backward_s gpu_busy_grad_reduce_s
gpu_idle_grad_reduce_s gpu_busy_optimizer_s gpu_idle_optimizer_s gpu_busy_outside_s gpu_idle_in_phases_s
gpu_idle_share kernel_intervals_per_iter gpu_comm_busy_forward_s gpu_comm_busy_backward_s
gpu_comm_busy_grad_reduce_s gpu_comm_busy_optimizer_s gpu_comm_busy_outside_s gpu_comm_hidden_forward_s
gpu_comm_hidden_backward_s gpu_comm_hidden_grad_reduce_s gpu_comm_hidden_optimizer_s gpu_comm_hidden_outside_s comm_time_s comm_fraction comm_link_bytes comm_staged_fallbacks
alltoall_pack_unpack_s
alltoall_plain_s alltoall_overhead_ratio alltoall_exposed_s alltoall_hidden_s sendrecv_exposed_s sendrecv_plain_s
sendrecv_hidden_s allreduce_link_bytes allreduce_s allgather_link_bytes allgather_s
reduce_scatter_link_bytes reduce_scatter_s alltoall_link_bytes alltoall_s sendrecv_link_bytes sendrecv_s
forward_link_bytes forward_comm_s backward_link_bytes backward_comm_s recompute_link_bytes recompute_comm_s
zero_link_bytes zero_comm_s grad_reduce_link_bytes grad_reduce_comm_s other_link_bytes other_comm_s
alltoall_forward_link_bytes alltoall_backward_link_bytes alltoall_recompute_link_bytes
allgather_forward_link_bytes allgather_backward_link_bytes allgather_recompute_link_bytes
reduce_scatter_forward_link_bytes reduce_scatter_backward_link_bytes reduce_scatter_recompute_link_bytes
sendrecv_forward_link_bytes sendrecv_backward_link_bytes sendrecv_recompute_link_bytes
predicted_layer_forward_link_bytes predicted_layer_backward_link_bytes predicted_strategy_link_bytes
predicted_zero_and_reduce_link_bytes
machine machines sp_group_machines dp_group_machines blas commit date""".split()
# Columns only the performance model writes (docs/MODEL.md).
MODEL_COLUMNS = ["attn_density", "fits", "memory_needed_bytes", "memory_capacity_bytes",
                 "max_seq_length_fits", "iter_time_low_s", "iter_time_high_s", "tflops_paper_low",
                 "tflops_paper_high", "paper_rate_over_90pct_peak"]
HEADER = RUNNER_COLUMNS + SPB_COLUMNS + MODEL_COLUMNS


def portable(value):
    """A path inside the repository as written to a CSV: relative to the
    repository's root (profiles/a100.profile), so that committed results
    name no directory of the machine that made them."""
    if isinstance(value, str) and value.startswith(ROOT + os.sep):
        return os.path.relpath(value, ROOT)
    return value


def _line(row, header=HEADER):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(["" if row.get(c) is None else portable(row.get(c)) for c in header])
    return buf.getvalue()


def read_rows(path):
    """Rows of a sweep CSV as dicts.  A last line without its newline (a
    write cut short by a power loss) is ignored: rows end with '\\n'."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    if not text:
        return []
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    return list(csv.DictReader(io.StringIO(text)))


def write_all(path, rows, header=HEADER):
    """Replace the whole file atomically (temporary file, fsync, rename)."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sweep-", suffix=".tmp", dir=d)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(_line({c: c for c in header}, header))
        for r in rows:
            f.write(_line(r, header))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def append_row(path, row):
    """Append one row with a single write(2) on an O_APPEND descriptor: the
    row is in the file whole or not at all, whatever kills the runner."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        write_all(path, [])
    data = _line(row).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        n = os.write(fd, data)
        if n != len(data):
            raise OSError("short write to %s" % path)
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_csv(path):
    """Open a sweep CSV for resuming: drop a torn last line, migrate an older
    header to the current one (columns by name).  Returns the rows."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    rows = read_rows(path)
    first = text.split("\n", 1)[0]
    if first != _line({c: c for c in HEADER}).rstrip("\n") or not text.endswith("\n"):
        write_all(path, rows)
    return rows


def replace_row(path, point_id, row):
    rows = [r for r in read_rows(path) if r.get("point") != point_id]
    rows.append(row)
    write_all(path, rows)


# --------------------------------------------------------------------------
# Running one point
# --------------------------------------------------------------------------
_COMMIT = []


def git_commit():
    if _COMMIT:
        return _COMMIT[0]
    _COMMIT.append(_git_commit())
    return _COMMIT[0]


def _git_commit():
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine():
    return "%s/%dcores" % (socket.gethostname(), os.cpu_count() or 0)


def predicted_layer_bytes(strategy, ulysses_comm, n, h, b, p, precision="fp32", ulysses_degree=0, heads=0, groups=0):
    """Bytes per link per layer per micro-step, forward + backward, of the
    layer collectives: the formulas of strategies/*.c comm_volume restated
    (4-byte floats; half that under bf16).  Ulysses 8bNh(P-1)/P^2 (all-to-all)
    or P times that (allgather); Megatron-SP 10·4bNh(P-1)/P; ring 3P-2 blocks
    of 8bNh/P; hybrid Ulysses' over U plus ring's over R = P/U on blocks of
    8bNh/P; allgather-kv 3 collectives of 8bNh(P-1)/P.  With G = groups K/V
    heads of H = heads (0: G = H; docs/STRATEGIES.md): ring's and
    allgather-kv's blocks carry G/H of h; Ulysses' QKV exchange carries
    H + 2·max(G, P) heads instead of 3H (the hybrid's max(G, U)); Megatron-SP
    moves activations only (its K/V replicas' gradient all-reduce for G < P
    is per iteration: kv_replica_link_bytes)."""
    if p <= 1 or strategy == "none":
        return 0.0
    scale = 0.5 if precision in ("bf16", "fp16") else 1.0
    return scale * _fp32_layer_bytes(strategy, ulysses_comm, n, h, b, p, ulysses_degree, heads, groups)


def kv_replica_link_bytes(strategy, h, heads, groups, p, bias=True, precision="fp32"):
    """Megatron-SP with G = groups < P K/V heads: bytes per link of one
    layer's all-reduce of its replicated K/V weight rows over R = P/G ranks,
    4·(2dh + 2d)·2(R-1)/R (no 2d without biases; d = h/H), once per
    iteration (ZeRO 0-1) or per micro-step (ZeRO 2-3): strategies'
    spb_zero_comm_items restated.  0 elsewhere."""
    if strategy != "megatron" or not groups or not heads or groups >= p:
        return 0.0
    d, r = h / heads, p // groups
    scale = 0.5 if precision in ("bf16", "fp16") else 1.0
    return scale * 4.0 * (2 * d * h + (2 * d if bias else 0)) * 2 * (r - 1) / r


def _fp32_layer_bytes(strategy, ulysses_comm, n, h, b, p, ulysses_degree=0, heads=0, groups=0):
    local = b * (n / p) * h
    # K/V heads as a share of the hidden size (G/H; 1 without grouped-query attention)
    kv_share = groups / heads if heads and groups else 1.0

    def qkv_heads_share(degree):  # (H + 2·max(G, degree)) / H, 3 when G = H
        if not (heads and groups):
            return 3.0
        return (heads + 2 * max(groups, degree)) / heads

    if strategy == "hybrid":
        u = ulysses_degree or p
        r = p // u
        f = (u - 1) / u
        gu_share = max(groups, u) / heads if heads and groups else 1.0
        a2a = 2 * (4.0 * (qkv_heads_share(u) + 1) * local) * f * (u if ulysses_comm == "allgather" else 1)
        return a2a + (3 * r - 2) * 4.0 * 2 * local * gu_share if r > 1 else a2a
    if strategy == "allgather-kv":
        return 3 * 4.0 * 2 * local * kv_share * p * (p - 1) / p
    if strategy == "ulysses":
        f = (p - 1) / p
        base = 2 * (4.0 * (qkv_heads_share(p) + 1) * local) * f
        return base * p if ulysses_comm == "allgather" else base
    if strategy == "megatron":
        region = 4.0 * b * n * h * (p - 1) / p
        return 10 * region
    if strategy == "ring":
        return (3 * p - 2) * 4.0 * 2 * b * (n / p) * h * kv_share
    return None


def classify(rc, stderr, timed_out):
    err = [l for l in stderr.splitlines() if l.startswith("spbench: error:") or l.startswith("spbench-model: error:")]
    msg = err[0].split("error:", 1)[1].strip() if err else ""
    if timed_out:
        return "timeout", "no result within the point's timeout"
    if rc == 0:
        return None, msg
    if msg:
        if "exceeds --memory-budget" in msg or "exceeds the memory a rank can have" in msg:
            return "oom-predicted", msg
        if "not implemented" in msg or "no CUDA device" in msg:
            return "unsupported", msg
        if rc == 2:
            return "invalid", msg
    tail = [l for l in stderr.splitlines() if l.strip() and not l.startswith("-") and "mpiexec" not in l]
    return "failed", "exit %d: %s" % (rc, msg or (tail[-1].strip() if tail else "no message"))


def run_process(cmd, timeout):
    """Run cmd in its own process group; kill the group on timeout or when
    the runner is interrupted."""
    p = subprocess.Popen(guarded(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, False
    except subprocess.TimeoutExpired:
        stop_point(p)
        out, err = p.communicate()
        return p.returncode, out, err, True
    except BaseException:
        stop_point(p)
        raise


def base_row(point):
    row = {"sweep": point.sweep, "scale": point.scale, "point": point.id, "series": point.series,
           "label": point.label, "np": point.np, "world_size": point.np, "run_name": point.id,
           "machine": machine(), "commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "profile": point.runner.get("profile", "") if point.scale == "paper" else ""}
    for opt, (kind, default, col) in SPB_OPTIONS.items():
        if col:
            v = point.options.get(opt, default)
            if kind == "flag":
                v = 1 if v == "yes" else 0
            row[col] = v
    if row.get("ffn_hidden_size") in (None, ""):
        gated = point.options.get("swiglu") == "yes" or point.options.get("model") == "llama"
        # Megatron-LM's default under --swiglu (common/runtime/config.c), else 4h
        h = int(row["hidden_size"])
        row["ffn_hidden_size"] = int(4 * h * 2 / 3 / 64) * 64 if gated else 4 * h
    try:
        row["dp"] = point.np // int(row["sp"])
        if not row.get("global_batch_size"):
            row["global_batch_size"] = int(row["micro_batch_size"]) * row["dp"]
    except (ValueError, ZeroDivisionError):
        pass
    return row


def run_name_of(point_id):
    """spbench's --run-name holds 63 characters: long point ids keep their
    start and a hash of the whole (the CSV's point column keeps the id)."""
    if len(point_id) <= 63:
        return point_id
    import hashlib
    return point_id[:54] + "~" + hashlib.sha1(point_id.encode()).hexdigest()[:8]


def launch_command(mpiexec, np, program, args):
    """The command that starts `np` ranks of `program`: the launcher's words
    with every "{np}" replaced by the count where it has one (a launcher
    that does not take -np: "srun --ntasks={np} --gpus-per-task=1"), else
    the launcher followed by -np N (mpiexec, mpirun, spbrun)."""
    if any("{np}" in w for w in mpiexec):
        return [w.replace("{np}", str(np)) for w in mpiexec] + [program] + list(args)
    return list(mpiexec) + ["-np", str(np), program] + list(args)


def run_point(point, spbench, model, mpiexec, outdir, peak_override=None, tune=False, tune_space=None, log=None):
    """Run (or model) one point; return its sweep row."""
    if tune and tune_space:
        return _run_tuned(point, spbench, model, mpiexec, outdir, peak_override, tune_space, log)
    t0 = time.time()
    row = base_row(point)
    timeout = float(point.runner.get("timeout", 900))
    fd, tmp = tempfile.mkstemp(prefix="point-", suffix=".csv")
    os.close(fd)
    os.unlink(tmp)
    args = point.args()
    args += ([] if "--quiet" in args else ["--quiet"]) + ["--results", tmp, "--run-name", run_name_of(point.id)]
    if point.runner.get("record-loss") == "yes":
        rel = os.path.join("loss", re.sub(r"[^A-Za-z0-9_.=-]+", "_", point.id) + ".csv")
        os.makedirs(os.path.join(outdir, "loss"), exist_ok=True)
        args += ["--loss-log", os.path.join(outdir, rel)]
        row["loss_log"] = rel
    try:
        if point.scale == "paper":
            if not model or not os.access(model, os.X_OK):
                row.update(status="no-model", message="%s not found: the performance model is not built yet; "
                           "rerun this sweep with --retry-failed once it exists" % (model or "build/spbench-model"))
                return row
            profile = point.runner.get("profile", "a100")
            cmd = [model] + args + ["--world-size", str(point.np), "--profile",
                                    os.path.join(ROOT, "profiles", profile + ".profile")]
            for k, v in point.model_options.items():
                if MODEL_OPTIONS[k] == "flag":
                    cmd += ["--" + k] if v == "yes" else []
                else:
                    cmd += ["--" + k, v]
        else:
            cmd = launch_command(mpiexec, point.np, spbench, args)
        rc, out, err, timed_out = run_process(cmd, timeout)
        status, msg = classify(rc, err, timed_out)
        got = read_rows(tmp)
        if status is None:
            if not got:
                status, msg = "failed", "exit 0 but no results row"
            else:
                for k, v in got[-1].items():
                    if k in HEADER and k not in ("status",) and v != "":
                        row[k] = v
                status = got[-1].get("status") or "ok"
                if status == "modelled" and got[-1].get("fits") == "0":
                    status = "oom-predicted"
                    msg = "modelled: needs %.3g GiB per rank, has %.3g GiB" % (
                        float(got[-1].get("memory_needed_bytes") or "nan") / 2 ** 30,
                        float(got[-1].get("memory_capacity_bytes") or "nan") / 2 ** 30)
        row["status"], row["message"] = status, " ".join(msg.split())
        if status in DONE_STATUSES:
            _derive(row, point.options)
            peak = peak_override if peak_override is not None else float(point.runner.get("peak-tflops", 0) or 0)
            if peak > 0:
                # Executed work above the device's peak means a wrong
                # measurement: the row is rejected.  The paper's formula
                # counts dense (non-causal, non-sparse) attention, so it can
                # exceed the peak at long N or with sparse attention while
                # the work done does not: that is noted, not rejected.
                def value(col):
                    try:
                        return float(row.get(col) or "nan")
                    except ValueError:
                        return float("nan")
                counted, paper = value("tflops_counted_per_rank"), value("tflops_paper_per_rank")
                if counted > peak:
                    row["status"] = "invalid-tflops"
                    row["message"] = "tflops_counted_per_rank %.4g exceeds the device peak %.4g TFLOPs per rank" % (
                        counted, peak)
                elif paper > peak:
                    note = "paper-formula TFLOPs %.4g exceed the device peak %.4g (the formula counts dense " \
                           "attention; counted %.4g)" % (paper, peak, counted)
                    row["message"] = (row["message"] + "; " if row["message"] else "") + note
        return row
    finally:
        row["elapsed_s"] = "%.1f" % (time.time() - t0)
        if os.path.exists(tmp):
            os.unlink(tmp)


def _derive(row, options=None):
    """Measured and predicted bytes per link per layer per micro-step
    (options: the point's spbench options, for its K/V heads)."""
    options = options or {}
    try:
        L = int(row["num_layers"])
        b = int(row["micro_batch_size"])
        dp = int(row["dp"])
        accum = int(row["global_batch_size"]) // (b * dp)
        meas = sum(float(row.get(k) or 0) for k in ("forward_link_bytes", "backward_link_bytes"))
        row["layer_link_bytes_measured"] = "%.0f" % (meas / (L * accum))
        # spbench's own formula (the strategy's comm_volume) when the row has
        # it; the restatement below for rows that do not (the model's).
        if row.get("predicted_layer_forward_link_bytes"):
            pred = float(row["predicted_layer_forward_link_bytes"]) + float(row["predicted_layer_backward_link_bytes"])
        else:
            pred = predicted_layer_bytes(row["strategy"], row.get("ulysses_comm") or "alltoall",
                                         int(row["seq_length"]), int(row["hidden_size"]), b, int(row["sp"]),
                                         row.get("precision") or "fp32", int(row.get("ulysses_degree") or 0),
                                         int(row.get("num_heads") or 0), int(options.get("num-query-groups") or 0))
        if pred is not None:
            row["layer_link_bytes_predicted"] = "%.0f" % pred
    except (KeyError, ValueError, ZeroDivisionError):
        pass


def _run_tuned(point, spbench, model, mpiexec, outdir, peak_override, tune_space, log):
    keys = list(tune_space)
    best, fallback, tried = None, None, []
    for combo in itertools.product(*[tune_space[k] for k in keys]):
        opts = dict(point.options)
        opts.update(dict(zip(keys, combo)))
        cand = Point(point.sweep, point.scale, point.series, point.label, opts, point.np, point.axes, point.runner)
        cand.model_options = point.model_options
        r = run_point(cand, spbench, model, mpiexec, outdir, peak_override)
        choice = " ".join("%s=%s" % kv for kv in zip(keys, combo))
        tried.append("%s:%s" % (choice, r["status"]))
        if log:
            log("    tune %s: %s %s" % (choice, r["status"], r.get("tokens_per_s", "")))
        if r["status"] in DONE_STATUSES and (best is None or float(r["tokens_per_s"]) > float(best[1]["tokens_per_s"])):
            best = (choice, r)
        elif fallback is None or fallback[1]["status"] == "invalid":
            fallback = (choice, r)
    if best is None:
        choice, r = fallback
        r["tune_choice"] = ""
    else:
        choice, r = best
        r["tune_choice"] = choice
    r["point"], r["run_name"] = point.id, point.id
    r["tune_tried"] = "; ".join(tried)
    return r


# --------------------------------------------------------------------------
# Robustness (issue 39): points die with the runner, one runner per results
# directory, spbench's own option table
# --------------------------------------------------------------------------
GUARD = os.path.join(ROOT, "experiments", "point_guard.py")


def guarded(cmd):
    """cmd under experiments/point_guard.py: its process group is killed
    when the runner dies, however it dies."""
    return [sys.executable, GUARD, "--"] + list(cmd)


def stop_point(p):
    """End a point started under guarded(): SIGTERM makes the guard kill its
    group and every process below it (the ranks, which mpiexec puts in groups
    of their own); SIGKILL to the group if it has not ended in 10 s."""
    try:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.wait()


_LOCKS = {}


def lock_results_dir(outdir):
    """Hold an exclusive flock on OUTDIR/.runner.lock for the life of this
    process; a second runner on the same directory gets a SweepError naming
    the pid that holds it.  The lock goes with the process, however it ends."""
    import fcntl
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, ".runner.lock")
    key = os.path.realpath(path)
    if key in _LOCKS:
        return path
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").split("\n")[0].strip()
        os.close(fd)
        raise SweepError("results directory %s is in use by another runner (%s); wait for it to finish or stop "
                         "it" % (outdir, holder or "pid unknown"))
    os.ftruncate(fd, 0)
    os.pwrite(fd, ("pid %d, started %s\n" % (os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
              .encode(), 0)
    _LOCKS[key] = fd
    return path


_LISTED = {}


def spbench_options(binary):
    """spbench's options as the binary lists them (spbench --list-options):
    {name: (kind, choices tuple or None, default)}, read once per binary."""
    key = os.path.realpath(binary)
    if key not in _LISTED:
        try:
            r = subprocess.run([binary, "--list-options"], capture_output=True, text=True, timeout=60)
            listed = json.loads(r.stdout) if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError):
            listed = None
        if not isinstance(listed, list):
            raise SweepError("%s --list-options did not list its options (an older build? scripts/build)" % binary)
        _LISTED[key] = {o["name"]: (o["kind"], tuple(o["choices"]) if o.get("choices") else None, o.get("default"))
                        for o in listed}
    return _LISTED[key]


def _listed_kind(kind, choices):
    return choices if choices else kind


def option_divergence(listed):
    """How the built-in copy SPB_OPTIONS (+ RUNNER_OWNED) differs from the
    binary's table: one line per difference, empty when they agree."""
    out = []
    for name, (kind, choices, _) in sorted(listed.items()):
        want = _listed_kind(kind, choices)
        if name in RUNNER_OWNED:
            continue
        if name not in SPB_OPTIONS:
            out.append("spbench has --%s (%s), the runner's table does not" % (name, want))
        elif SPB_OPTIONS[name][0] != want:
            out.append("--%s: spbench takes %s, the runner's table says %s" % (name, want, SPB_OPTIONS[name][0]))
    for name in sorted(set(SPB_OPTIONS) | RUNNER_OWNED):
        if name not in listed:
            out.append("the runner's table has --%s, spbench does not" % name)
    return out


def use_spbench_options(binary):
    """Take the option table from the spbench binary (the one source of
    truth, common/runtime/config.c): every option it lists becomes a key of the
    sweep files with its kind and words; options it does not list are
    dropped.  The built-in SPB_OPTIONS keeps the results columns and
    defaults.  Returns option_divergence(), for a note."""
    listed = spbench_options(binary)
    diff = option_divergence(listed)
    for name, (kind, choices, default) in listed.items():
        if name in RUNNER_OWNED:
            continue
        _, default0, column = SPB_OPTIONS.get(name, (None, None, None))
        SPB_OPTIONS[name] = (_listed_kind(kind, choices), default0, column)
    for name in [n for n in SPB_OPTIONS if n not in listed]:
        del SPB_OPTIONS[name]
    return diff
