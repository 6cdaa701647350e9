#!/usr/bin/env python3
"""`experiments/run SWEEP --scale gpu --list` on a machine without GPUs:
the paper's fig4 fitted to 8 and to 32 GPUs, every command checked option by
option; the GPU count from Slurm's and Open MPI's variables; bad input.
No spbench is started (--list)."""
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, env_extra=None, drop=("SLURM_GPUS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "SPB_GPU_SCALE_TINY")):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_extra or {})
    r = subprocess.run([sys.executable, RUN] + args, capture_output=True, text=True, env=env, timeout=120)
    return r.returncode, r.stdout, r.stderr


def commands(out):
    """[(point id, argv)] from --list's output."""
    lines = out.splitlines()
    res = []
    for i, l in enumerate(lines):
        m = re.match(r"\s*[0-9]+ (\S+)$", l)
        if m and i + 1 < len(lines):
            res.append((m.group(1), shlex.split(lines[i + 1])))
    return res


def opt(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


PAPER_SEQ = ["8192", "16384", "32768", "65536", "131072", "262144"]
SERIES = {"ulysses-zero3", "ulysses-zero2", "megatron", "ring", "ring-zero3"}

for n in (8, 32):
    rc, out, err = run(["fig4", "--scale", "gpu", "--list", "--gpus", str(n), "--gpu-memory", "80GiB",
                        "--mpiexec", "mpirun --map-by ppr:8:node"])
    check(rc == 0, "fig4 --gpus %d: exit 0 (%s)" % (n, err.strip()[-200:]))
    cmds = commands(out)
    check(len(cmds) == 30, "fig4 --gpus %d: 30 points, 5 series x 6 lengths (got %d)" % (n, len(cmds)))
    check(re.search(r"GPU scale: %d GPUs \(--gpus\)" % n, out) is not None, "fig4 --gpus %d: header names N" % n)
    seqs, series = set(), set()
    for pid, argv in cmds:
        where = "fig4 --gpus %d %s" % (n, pid)
        ok = (argv[:3] == ["mpirun", "--map-by", "ppr:8:node"] and opt(argv, "-np") == str(n)
              and opt(argv, "--device") == "cuda" and opt(argv, "--comm") == "nccl"
              and opt(argv, "--precision") == "fp16" and opt(argv, "--memory-budget") == "80GiB"
              and opt(argv, "--sp-degree") == str(n)  # P = the world, as in the paper's fig4
              and opt(argv, "--num-layers") == "32" and opt(argv, "--hidden-size") == "4096"
              and opt(argv, "--num-attention-heads") == "32" and "--checkpoint-activations" in argv
              and "--attention" not in argv  # spbench's default: cuDNN where the build has it
              and pid.startswith(pid.split("/")[0] + "/np=%d/" % n))
        check(ok, "%s: %s" % (where, " ".join(argv[:6]) + " ..."))
        seqs.add(opt(argv, "--seq-length"))
        series.add(pid.split("/")[0])
        if pid.startswith("ulysses-zero3"):
            check(opt(argv, "--zero-stage") == "3" and opt(argv, "--strategy") == "ulysses", where + ": ZeRO-3 Ulysses")
        if pid.startswith("ring/"):
            check(opt(argv, "--ring-layout") == "zigzag", where + ": zigzag ring")
    check(sorted(seqs, key=int) == PAPER_SEQ, "fig4 --gpus %d: the paper's lengths %s" % (n, sorted(seqs, key=int)))
    check(series == SERIES, "fig4 --gpus %d: every series" % n)

# The GPU count from the allocation or the launcher, in that order.
for env, n in (({"SLURM_GPUS": "a100:16"}, 16), ({"SLURM_NTASKS": "4"}, 4), ({"OMPI_COMM_WORLD_SIZE": "2"}, 2),
               ({"SLURM_GPUS": "8", "SLURM_NTASKS": "99"}, 8)):
    rc, out, err = run(["fig4", "--scale", "gpu", "--list", "--gpu-memory", "40GiB"], env)
    cmds = commands(out)
    check(rc == 0 and cmds and all(opt(a, "-np") == str(n) and opt(a, "--memory-budget") == "40GiB" for _, a in cmds),
          "%s: every point at %d ranks, budget 40GiB" % (env, n))

# A GPU-count axis: fig3 (8..64 GPUs) at 16 keeps 8 and 16 and names the rest.
rc, out, err = run(["fig3", "--scale", "gpu", "--list", "--gpus", "16"])
nps = {opt(a, "-np") for _, a in commands(out)}
check(rc == 0 and nps == {"8", "16"} and "needs 32 GPUs" in out and "needs 64 GPUs" in out,
      "fig3 --gpus 16: 8 and 16 GPUs run, 32 and 64 named as left out (%s)" % sorted(nps))
# No GPU memory known and no --gpu-memory: --list assumes 80GiB and says so.
if not any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep)):
    rc, out, err = run(["fig4", "--scale", "gpu", "--list", "--gpus", "8"])
    check(rc == 0 and "assumed" in out and all(opt(a, "--memory-budget") == "80GiB" for _, a in commands(out)),
          "no nvidia-smi: --list assumes 80GiB per GPU and says so")
    rc, out, err = run(["fig4", "--scale", "gpu", "--list"])
    check(rc != 0 and "no GPUs found" in err and err.count("\n") == 1, "no GPUs, no --gpus: one error line")
# Bad input: one error line, non-zero exit.
for args, expect in ((["--gpus", "0"], "--gpus must be >= 1"), (["--gpus", "8", "--gpu-memory", "lots"], "not a size"),
                     (["--gpus", "8", "--np", "4"], "--np does not apply")):
    rc, out, err = run(["fig4", "--scale", "gpu", "--list"] + args)
    check(rc != 0 and expect in err and err.count("\n") == 1, "%s: refused (%s)" % (" ".join(args), err.strip()))

print("%d failures" % len(failures))
sys.exit(1 if failures else 0)
