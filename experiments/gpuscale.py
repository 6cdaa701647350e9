"""`experiments/run SWEEP --scale gpu`: a sweep's paper configuration run
for real on the GPUs at hand (docs/RUNNER.md, docs/CLUSTER.md).

The points are the sweep's [paper] points, fitted to N GPUs:
  - N: --gpus, else the allocation or launcher (SLURM_GPUS, SLURM_NTASKS,
    OMPI_COMM_WORLD_SIZE), else `nvidia-smi -L`'s count;
  - a sweep whose [paper] points all take one rank count (fig4: 32) runs at
    min(that, N) ranks; a sweep whose rank count is an axis (fig3: 8..64
    GPUs) keeps the counts that fit in N and leaves the others out (named
    by --list), or where none fits (table2: 64..256) fits its smallest to N;
    sequence parallelism shrinks with the ranks (P = np where
    the paper's P was the world, else the largest P <= the paper's that
    divides the ranks and the heads);
  - --device cuda --comm nccl, the paper's precision (fp16, DeepSpeed's;
    a series that names its precision keeps it), the paper's model shapes
    and sequence lengths, and --memory-budget at one GPU's memory: spbench's
    memory model refuses a point that cannot fit before any work starts, and
    the row says oom-predicted;
  - the model-only keys (model.*: the modelled sparse density of fig6/7)
    do not apply: the run is dense, and its rows say so.
SPB_GPU_SCALE_TINY=1 (or --tiny) shrinks the model and the sequences for a
dress rehearsal on the CPU emulation of a GPU (tests/emu/gpu_scale.sh): the
same code path, a model that runs in seconds there.

Python 3 standard library only.
"""
import math
import os
import re
import shutil
import subprocess

import sweeplib as sl

# Dense 16-bit tensor-core peak per GPU, TFLOP/s, from NVIDIA's data sheets
# (without sparsity): the runner's check that no row claims more work than
# the GPU can do.  A name not here gets no check unless --peak-tflops.
DENSE_16BIT_PEAK_TFLOPS = [("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0),
                           ("L40S", 362.0), ("A10", 125.0), ("V100", 125.0)]
# The memory a GPU has, where no nvidia-smi can say (--list on a machine
# without GPUs): the paper's A100 80 GB.
ASSUMED_GPU_MEMORY = "80GiB"
PAPER_PRECISION = "fp16"
TINY_ENV = "SPB_GPU_SCALE_TINY"


class GpuScaleError(Exception):
    pass


def _smi(args):
    """nvidia-smi's output lines, or None where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        r = subprocess.run([exe] + args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.splitlines() if r.returncode == 0 else None


def _count(text):
    """A count from an environment value: "8", "8(x2)", "a100:8" (SLURM_GPUS)."""
    m = re.search(r"([0-9]+)(?:\(x([0-9]+)\))?\s*$", text or "")
    if not m:
        return None
    n = int(m.group(1)) * (int(m.group(2)) if m.group(2) else 1)
    return n if n > 0 else None


def detect_gpus(requested, env=None):
    """(N, where N came from)."""
    env = os.environ if env is None else env
    if requested is not None:
        if requested < 1:
            raise GpuScaleError("--gpus must be >= 1 (got %d)" % requested)
        return requested, "--gpus"
    for var in ("SLURM_GPUS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        n = _count(env.get(var))
        if n:
            return n, var
    lines = _smi(["-L"])
    n = len([l for l in lines or [] if l.startswith("GPU ")])
    if n:
        return n, "nvidia-smi -L"
    raise GpuScaleError("--scale gpu: no GPUs found (no SLURM_GPUS, SLURM_NTASKS or OMPI_COMM_WORLD_SIZE, and "
                        "nvidia-smi -L lists none); give --gpus N")


def gpu_inventory():
    """{'names': [...], 'memory_mib': [...]} from nvidia-smi, empty lists without it."""
    lines = _smi(["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]) or []
    names, mem = [], []
    for l in lines:
        parts = [p.strip() for p in l.split(",")]
        if len(parts) == 2 and re.fullmatch(r"[0-9.]+", parts[1]):
            names.append(parts[0])
            mem.append(float(parts[1]))
    return {"names": names, "memory_mib": mem}


def peak_tflops_for(name):
    for key, peak in DENSE_16BIT_PEAK_TFLOPS:
        if key.lower() in (name or "").lower():
            return peak
    return 0.0


def tiny_requested(flag):
    return bool(flag) or os.environ.get(TINY_ENV, "") not in ("", "0")


def _largest_divisor(limit, *multiples_of):
    """The largest p <= limit that divides every number given."""
    for p in range(max(1, limit), 0, -1):
        if all(m % p == 0 for m in multiples_of):
            return p
    return 1


def gpu_points(sw, n_gpus, memory_budget, tiny=False, peak=None):
    """The sweep's [paper] points fitted to n_gpus GPUs; returns (points,
    notes): notes name what was left out and why."""
    paper = sl.expand(sw, "paper")
    paper_nps = sorted({p.np for p in paper})
    np_is_axis = len(paper_nps) > 1
    points, notes, seen = [], [], set()
    # a GPU-count axis none of whose counts fits: its smallest, fitted to N
    # (table2/3's 64..256 GPUs on one node: one column of the table)
    smallest_only = np_is_axis and paper_nps[0] > n_gpus
    if smallest_only:
        notes.append("every rank count of the paper (%s) exceeds %d GPUs: its smallest, %d, fitted to %d"
                     % (" ".join(map(str, paper_nps)), n_gpus, paper_nps[0], n_gpus))
    for p in paper:
        if smallest_only and p.np != paper_nps[0]:
            continue
        if np_is_axis and not smallest_only and p.np > n_gpus:
            notes.append("%s: needs %d GPUs (%d here)" % (p.id, p.np, n_gpus))
            continue
        o = dict(p.options)
        np_ = min(p.np, n_gpus)
        heads = int(o.get("num-attention-heads", sl.SPB_OPTIONS["num-attention-heads"][1]))
        sp = int(o.get("sp-degree", 1))
        sp = np_ if sp == p.np and sp > 1 else _largest_divisor(min(sp, np_), np_, heads)
        o["sp-degree"] = str(sp)
        o["device"], o["comm"] = "cuda", "nccl"
        o.setdefault("precision", p.model_options.get("precision") or PAPER_PRECISION)
        o["memory-budget"] = memory_budget
        runner = dict(p.runner)
        runner.pop("profile", None)
        runner["peak-tflops"] = "%g" % peak if peak else "0"
        if tiny:
            _shrink(o, np_)
            runner.setdefault("timeout", "300")
        axes = [("np", str(np_))] + [(k, o.get(k, v)) for k, v in p.axes if k != "np"]
        q = sl.Point(p.sweep, "gpu", p.series, p.label, o, np_, axes, runner)
        if q.id in seen:  # two paper points that became one at this size
            continue
        seen.add(q.id)
        q.note = "TINY model (%s): a dress rehearsal, not the paper's shapes" % TINY_ENV if tiny else ""
        dens = p.model_options.get("attn-density")
        if dens and float(dens) < 1:
            q.note += ("; " if q.note else "") + \
                "dense attention: the paper's density %s is the model's (model.attn-density)" % dens
        points.append(q)
    if not points:
        raise GpuScaleError("sweep %s: no [paper] point fits %d GPUs (its rank counts: %s)"
                            % (sw.name, n_gpus, " ".join(map(str, paper_nps))))
    return points, notes


def _shrink(o, np_):
    """The tiny model of a dress rehearsal: 2 layers of hidden 64 in 8 heads
    (head dim 8, which cuDNN's graph and the flash kernels take), a byte
    vocabulary, each paper length divided by 512 (8K -> 16 tokens) and kept a
    multiple of 2P (ring-zigzag's halves), 3 iterations."""
    o.update({"num-layers": "2", "hidden-size": "64", "num-attention-heads": "8", "vocab-size": "256",
              "train-iters": "3", "timing-warmup": "1"})
    o.pop("ffn-hidden-size", None)
    o.pop("max-position-embeddings", None)
    step = 2 * np_
    n = max(int(o.get("seq-length", 64)) // 512, step)
    o["seq-length"] = str((n + step - 1) // step * step)
    sp = int(o["sp-degree"])
    o["sp-degree"] = str(_largest_divisor(sp, np_, 8))
    if o.get("global-batch-size"):
        o["global-batch-size"] = str(max(1, np_ // int(o["sp-degree"])) * int(o.get("micro-batch-size", 1)))


def memory_budget(arg, inventory, listing):
    """One GPU's memory as a --memory-budget size: --gpu-memory, else the
    smallest GPU nvidia-smi lists, else (only for --list) the paper's 80 GiB."""
    if arg:
        if not re.fullmatch(r"[0-9.]+([KMGT]i?B|B)?", arg):
            raise GpuScaleError("--gpu-memory '%s' is not a size (e.g. 80GiB)" % arg)
        return arg, "--gpu-memory"
    if inventory["memory_mib"]:
        return "%dMiB" % int(min(inventory["memory_mib"])), "nvidia-smi"
    if listing:
        return ASSUMED_GPU_MEMORY, "assumed (no nvidia-smi here; --gpu-memory SIZE to set it)"
    raise GpuScaleError("--scale gpu: cannot tell the GPUs' memory (no nvidia-smi); give --gpu-memory SIZE")


def describe_machine(outdir, n_gpus, source, budget, budget_source, inventory, probe):
    """gpu.txt beside the CSV: what the report's "GPU scale, measured" section
    names (GPU name and count, memory, topology)."""
    os.makedirs(outdir, exist_ok=True)
    names = inventory["names"]
    name = names[0] if names else (probe.get("device") or "unknown")
    lines = ["gpu_name: %s" % name,
             "gpu_count: %d (%s)" % (n_gpus, source),
             "gpus_on_this_machine: %d" % len(names) if names else "gpus_on_this_machine: unknown (no nvidia-smi)",
             "gpu_memory: %s (%s)" % (budget, budget_source)]
    with open(os.path.join(outdir, "gpu.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    topo = _smi(["topo", "-m"])
    with open(os.path.join(outdir, "topology.txt"), "w") as f:
        f.write("\n".join(topo) + "\n" if topo else "nvidia-smi topo -m: not available on this machine\n")
    with open(os.path.join(outdir, "nccl_topology.txt"), "w") as f:
        f.write("\n".join(probe.get("nccl") or ["NCCL reported nothing (NCCL_DEBUG=INFO gave no lines: the "
                                                "emulation's NCCL stand-in, or a probe that failed)"]) + "\n")
        if probe.get("error"):
            f.write("probe: %s\n" % probe["error"])


def nccl_probe(mpiexec, n_gpus, spbench, timeout=300):
    """One small run on every GPU through NCCL with NCCL_DEBUG=INFO: the
    topology NCCL reports (its INIT and GRAPH lines: rings, trees, which
    links), and the device name spbench's banner gives."""
    args = ["--device", "cuda", "--comm", "nccl", "--precision", PAPER_PRECISION, "--strategy",
            "ulysses" if n_gpus > 1 else "none", "--sp-degree", str(_largest_divisor(n_gpus, n_gpus, 8)),
            "--num-layers", "1", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length",
            str(16 * n_gpus), "--micro-batch-size", "1", "--train-iters", "1"]
    env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,GRAPH")
    cmd = sl.launch_command(mpiexec, n_gpus, spbench, args)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": "could not run: %s" % e}
    out = r.stdout + "\n" + r.stderr
    keep = re.compile(r"NCCL INFO (.*(Channel|Ring|Tree|P2P|NVLS|NVLink|NET/|via|Trees|comm .* rank|"
                      r"Pattern|nRanks|Connected|cudaDev|busId).*)")
    nccl = [m.group(0).strip() for m in map(keep.search, out.splitlines()) if m]
    device = ""
    for l in r.stdout.splitlines():
        if l.startswith("CUDA build:"):
            device = re.sub(r"^[0-9]+ x ", "", l.split(":", 1)[1].strip())  # "2 x NAME": the count is ours
    res = {"nccl": nccl[:400], "device": device}
    if r.returncode:
        err = [l for l in r.stderr.splitlines() if "error" in l.lower()]
        res["error"] = "exit %d%s" % (r.returncode, (": " + err[0]) if err else "")
    return res
