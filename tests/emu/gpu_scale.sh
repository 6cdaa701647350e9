#!/usr/bin/env bash
# `experiments/run fig4 --scale gpu` end to end on the CPU emulation of two
# GPUs (SPB_EMU_DEVICES=2, NCCL's stand-in over MPI), with the tiny model of
# a dress rehearsal (SPB_GPU_SCALE_TINY=1): the NCCL probe, every point at
# --device cuda --comm nccl --precision fp16, the memory model's verdict
# against a 2 MiB "GPU" (the longest points oom-predicted, not run), the
# sweep CSV with the runner's usual header, the figures, and results/REPORT.md's
# "GPU scale, measured" section; a second run resumes with nothing to do.
# The attention column says flash: the emulation has no cuDNN, and spbench's
# default falls back to the project's kernels (tests/test_runtime.c checks
# the choice on a cuDNN build).
# Usage: gpu_scale.sh SPBENCH MPIEXEC
set -u
spbench=$1
mpiexec=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 SPB_EMU_DEVICES=2 SPB_GPU_SCALE_TINY=1
unset CUDA_VISIBLE_DEVICES SLURM_GPUS SLURM_NTASKS OMPI_COMM_WORLD_SIZE
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/results/gpu/fig4
run=("$root/experiments/run" fig4 --scale gpu --gpus 2 --gpu-memory 2MiB --spbench "$spbench" --mpiexec "$mpiexec"
     --out "$out")
if ! timeout 1200 "${run[@]}" >"$tmp/run.log" 2>&1; then
    echo "FAIL: experiments/run exited non-zero"; tail -n 20 "$tmp/run.log"; exit 1
fi
tail -n 4 "$tmp/run.log"
python3 - "$out" "$tmp" "$root" <<'EOF'
import os, sys, subprocess
out, tmp, root = sys.argv[1:4]
sys.path.insert(0, os.path.join(root, "experiments"))
import sweeplib as sl
fails = []
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails.append(what)
csv_path = os.path.join(out, "results.csv")
with open(csv_path) as f:
    header = f.readline().rstrip("\n").split(",")
check(header == sl.HEADER, "the sweep CSV has the runner's usual header")
rows = sl.read_rows(csv_path)
check(len(rows) == 30, "30 rows, 5 series x 6 lengths (got %d)" % len(rows))
status = {}
for r in rows:
    status[r["status"]] = status.get(r["status"], 0) + 1
check(set(status) <= {"ok", "oom-predicted"}, "every point ran or was predicted not to fit: %s" % status)
check(status.get("ok", 0) >= 5 and status.get("oom-predicted", 0) >= 1,
      "some points ran, the longest did not fit 2 MiB: %s" % status)
for r in rows:
    where = r["point"]
    check(r["scale"] == "gpu" and r["device"] == "cuda" and r["comm"] == "nccl" and r["precision"] == "fp16"
          and r["np"] == "2" and "TINY" in r["message"], where + ": gpu scale, cuda, nccl, fp16, 2 GPUs, marked TINY")
    if r["status"] == "ok":
        check(r["attention"] == "flash" and float(r["iter_time_median_s"]) > 0 and r["sp"] == "2"
              and r["time_between_phases_s"] != "",
              where + ": ran flash (no cuDNN in the emulation), P = 2, a timing and the time between phases")
    else:
        check("exceeds --memory-budget 2MiB" in r["message"], where + ": the memory model's verdict: " + r["message"][:80])
for f in ("gpu.txt", "topology.txt", "nccl_topology.txt", "fig4-seqlen.png", "fig4-memory.png"):
    check(os.path.exists(os.path.join(out, f)), "wrote " + f)
gpu = open(os.path.join(out, "gpu.txt")).read()
check("gpu_count: 2 (--gpus)" in gpu and "CPU emulation" in gpu and "gpu_memory: 2MiB" in gpu,
      "gpu.txt names the emulated GPU, the count and the memory:\n" + gpu)
rep = os.path.join(tmp, "REPORT.md")
r = subprocess.run([os.path.join(root, "experiments", "report"), "--results", os.path.join(tmp, "results"),
                    "--out", rep], capture_output=True, text=True)
check(r.returncode == 0, "experiments/report: exit 0 " + r.stderr[-300:])
text = open(rep).read() if os.path.exists(rep) else ""
sec = text[text.find("### GPU scale, measured"):] if "### GPU scale, measured" in text else ""
check(sec != "", "REPORT.md has a 'GPU scale, measured' section")
check("2 (--gpus) x CPU emulation" in sec and "NCCL's topology" in sec and "nvidia-smi topo -m" in sec
      and "fig4-seqlen.png" in sec and "--scale gpu" in sec,
      "the section names the GPUs, the topology files, the figures and the command")
print("%d failures" % len(fails))
sys.exit(1 if fails else 0)
EOF
rc=$?
# resuming: every point is in the CSV, nothing runs again
"${run[@]}" --no-plots >"$tmp/again.log" 2>&1
if ! grep -q "30 points, 30 already in .*, 0 to run" "$tmp/again.log"; then
    echo "FAIL: a second run did not resume with nothing to do"; cat "$tmp/again.log"; rc=1
else
    echo "ok   a second run resumes with nothing to do"
fi
exit $rc
