#!/usr/bin/env bash
# spbench --kernel-timeline and the host-wait count on the CPU emulation of a
# device (cuda_trace.h), fp32 table and bf16 direct kernels, 2 layers:
#   - every kernel the emulator ran in the measured iterations lies inside a
#     timeline interval (none outside); on the fp32 table, where each of our
#     launches is its own interval and cuBLAS's stand-in launches none, the
#     kernel intervals equal the kernels run;
#   - per phase busy >= 0 and busy <= wall (idle >= 0), busy > 0 where the
#     phase computes, the row's columns filled, and empty without the option;
#   - the events change no number: iteration 1's dump (loss, every gradient)
#     is byte-identical with and without the timeline;
#   - the step's host waits: the loss and the gradient norm stay on the
#     device (backend.h's scalar_defer), uploads go through pinned staging
#     (cuda_upload.h) and the bf16 embedding reads its token ids from a host
#     copy, so a step waits twice (the loss's event after the backward is
#     queued, the norm behind AdamW), at most 4 here; before (2026-12-06)
#     it waited 62 times on the fp32 table and 36 on the bf16 one (each
#     parameter tensor's sum of squares read back, 29 here, the loss, the
#     synchronous uploads, the embedding's token ids read back).
#   - through NCCL (where the build has its stand-in): Ulysses at P = 2 on
#     two emulated GPUs, fp32, --comm nccl: every NCCL call is an interval on
#     its communicator's stream (the emulator counts one NCCL kernel per
#     group or ungrouped call; each inside an interval, as many NCCL
#     intervals as NCCL kernels), gpu_comm_busy_<phase>_s > 0 where the
#     phase communicates and <= its busy, busy <= wall, the dump identical
#     with and without the timeline, and no host wait added to the step;
#     and ring at P = 2, whose K/V transfers run on the communicator's
#     stream beside the attention (the same checks; it frees its rotation
#     buffers in every layer, which must not make the step wait: freed
#     device blocks are kept for reuse, not returned through cudaFree);
#     and Ulysses with --ulysses-overlap 2 (4 heads), whose head groups'
#     all-to-alls run on the communicator's stream beside the previous
#     group's attention: the NCCL time hidden behind compute,
#     gpu_comm_hidden_<phase>_s (|NCCL ∩ compute| of the intervals,
#     common/runtime/intervals.h), is >= 0, <= the phase's NCCL busy and <=
#     its compute busy (busy − NCCL busy + hidden), and the summary prints
#     the layer communication's measured exposed/hidden split.  (The
#     interval arithmetic itself: tests/test_intervals.c.)
# Usage: kernel_timeline.sh SPBENCH [MPIEXEC NCCL(0|1)]
set -u
spbench=$1
mpiexec=${2:-}
nccl=${3:-0}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(--device cuda --num-layers 2 --hidden-size 64 --seq-length 32 --vocab-size 64
      --micro-batch-size 1 --global-batch-size 1 --train-iters 3 --timing-warmup 1 --clip-grad 0.5
      --log-interval 100)
failed=0
run() { # label, [mpiexec -np 2,] options...
    local label=$1 launch=()
    shift
    [ "${1:-}" = "$mpiexec" ] && [ -n "$mpiexec" ] && { launch=("$1" -np 2); shift; }
    if ! timeout 600 "${launch[@]}" "$spbench" "${base[@]}" --num-attention-heads "${heads:-2}" "$@" --results "$tmp/$label.csv" --run-name "$label" \
        --dump "$tmp/$label.dump" >"$tmp/$label.out" 2>"$tmp/$label.err"; then
        echo "FAIL $label: spbench exited non-zero"; tail -5 "$tmp/$label.err"; failed=1
    fi
}
run fp32-timeline --precision fp32 --kernel-timeline
run fp32-plain --precision fp32
run bf16-timeline --precision bf16 --bf16-kernels fast --kernel-timeline
run bf16-plain --precision bf16 --bf16-kernels fast
if [ "$nccl" = 1 ]; then
    nccl_args=(--precision fp32 --strategy ulysses --sp-degree 2 --comm nccl)
    SPB_EMU_DEVICES=2 run nccl-timeline "$mpiexec" "${nccl_args[@]}" --kernel-timeline
    SPB_EMU_DEVICES=2 run nccl-plain "$mpiexec" "${nccl_args[@]}"
    # ring: the K/V rotation's send/receive on the communicator's stream beside the attention
    nccl_args=(--precision fp32 --strategy ring --sp-degree 2 --comm nccl)
    SPB_EMU_DEVICES=2 run nccl_ring-timeline "$mpiexec" "${nccl_args[@]}" --kernel-timeline
    SPB_EMU_DEVICES=2 run nccl_ring-plain "$mpiexec" "${nccl_args[@]}"
    # Ulysses with its all-to-all cut into 2 head groups, each exchanged beside the previous group's attention
    heads=4 SPB_EMU_DEVICES=2 run nccl_overlap-timeline "$mpiexec" --precision fp32 --strategy ulysses --sp-degree 2 \
        --comm nccl --ulysses-overlap 2 --kernel-timeline
else
    echo "NCCL case left out: the build has no NCCL stand-in (or no MPIEXEC given)"
fi
[ "$failed" = 0 ] || exit 1
grep -h "kernel timeline\|host waits" "$tmp"/*-timeline.out
python3 - "$tmp" "$nccl" <<'PY'
import csv, filecmp, os, re, sys
tmp, nccl = sys.argv[1], sys.argv[2] == "1"
fails = []
def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        fails.append(what)
def row(label):
    with open(os.path.join(tmp, label + ".csv")) as f:
        return list(csv.DictReader(f))[-1]
phases = ["forward", "backward", "grad_reduce", "optimizer"]
for prec in ["fp32", "bf16"] + (["nccl", "nccl_ring"] if nccl else []):
    through_nccl = prec.startswith("nccl")
    r, plain = row(prec + "-timeline"), row(prec + "-plain")
    out = open(os.path.join(tmp, prec + "-timeline.out")).read()
    m = re.search(r"kernel timeline \(emulated device\): (\d+) kernels run \((\d+) NCCL's\), (\d+) outside any "
                  r"interval, (\d+) intervals \((\d+) library calls, (\d+) NCCL calls\)", out)
    check(m is not None, f"{prec}: the emulator's count is printed")
    if m:
        run_, nccl_run, outside, intervals, library, comm = map(int, m.groups())
        check(run_ > 0 and outside == 0, f"{prec}: {run_} kernels run ({nccl_run} NCCL's), {outside} outside any interval")
        if prec != "bf16":  # fp32 tables: each of our launches and each NCCL call its own interval
            check(intervals - library == run_,
                  f"{prec}: kernel and NCCL intervals {intervals - library} = kernels run {run_} (library calls {library})")
        if through_nccl:
            check(comm > 0 and comm == nccl_run, f"{prec}: {comm} NCCL intervals = {nccl_run} NCCL kernels run")
        else:
            check(comm == 0 and nccl_run == 0, f"{prec}: no NCCL interval on one rank")
    check(r["kernel_timeline"] == "1", f"{prec}: kernel_timeline 1")
    for p in phases:
        busy, idle = float(r[f"gpu_busy_{p}_s"]), float(r[f"gpu_idle_{p}_s"])
        comm_busy = float(r[f"gpu_comm_busy_{p}_s"])
        check(busy >= 0 and idle >= -1e-6, f"{prec} {p}: busy {busy:.3g} s, idle {idle:.3g} s (busy <= wall)")
        if p != "grad_reduce" or through_nccl:  # one rank: nothing to reduce
            check(busy > 0, f"{prec} {p}: kernels timed")
        if through_nccl and p != "optimizer":  # all-to-alls or the ring's transfers, the gradients' all-reduce
            check(0 < comm_busy <= busy + 1e-9, f"{prec} {p}: NCCL busy {comm_busy:.3g} s, within busy {busy:.3g} s")
        else:  # one rank; the optimizer communicates nothing at ZeRO 0
            check(comm_busy == 0, f"{prec} {p}: no NCCL busy")
    check(float(r["gpu_idle_in_phases_s"]) >= -1e-6 and 0 <= float(r["gpu_idle_share"]) <= 1,
          f"{prec}: idle in phases {r['gpu_idle_in_phases_s']} s, idle share {r['gpu_idle_share']}")
    check(float(r["kernel_intervals_per_iter"]) > 0, f"{prec}: {r['kernel_intervals_per_iter']} intervals/iteration")
    check(plain["kernel_timeline"] == "0" and plain["gpu_busy_forward_s"] == "" and plain["gpu_idle_share"] == ""
          and plain["gpu_comm_busy_forward_s"] == "",
          f"{prec}: without --kernel-timeline the columns are empty")
    check(filecmp.cmp(os.path.join(tmp, prec + "-timeline.dump"), os.path.join(tmp, prec + "-plain.dump"),
                      shallow=False), f"{prec}: iteration 1's loss and gradients identical with the timeline")
    waits = float(plain["host_waits_per_iter"])
    # the ring frees its rotation buffers in every layer: freed blocks are kept for reuse
    # (cuda_memory.cu), not returned by cudaFree, which would wait for the device each time
    check(waits <= 4, f"{prec}: {waits:g} host waits per iteration (at most 4)")
for prec in (["nccl", "nccl_ring", "nccl_overlap"] if nccl else []):
    # the NCCL time hidden behind compute: within the NCCL busy time and within the compute busy time
    r = row(prec + "-timeline")
    for p in phases + ["outside"]:
        busy, comm_busy = float(r[f"gpu_busy_{p}_s"]), float(r[f"gpu_comm_busy_{p}_s"])
        hidden = float(r[f"gpu_comm_hidden_{p}_s"])
        compute_busy = busy - comm_busy + hidden  # |comm ∪ compute| = |comm| + |compute| − |comm ∩ compute|
        check(-1e-9 <= hidden <= comm_busy + 1e-9 and hidden <= compute_busy + 1e-9,
              f"{prec} {p}: NCCL hidden {hidden:.3g} s <= NCCL busy {comm_busy:.3g} s and <= compute busy "
              f"{compute_busy:.3g} s")
        # the emulation runs every stream operation when it is issued (emu_streams.cc): no NCCL
        # interval overlaps a compute one, so nothing is hidden there (an overlap taken with the
        # NCCL intervals themselves, or with busy, would read comm_busy)
        check(hidden == 0, f"{prec} {p}: nothing hidden on the emulation (its streams complete at issue)")
    out = open(os.path.join(tmp, prec + "-timeline.out")).read()
    m = re.search(r"layer communication exposed vs hidden behind compute, measured on the kernel timeline "
                  r"\(ms/iteration, rank 0[^)]*\): exposed ([0-9.]+), hidden ([0-9.]+) of ([0-9.]+)", out)
    check(m is not None, f"{prec}: the measured exposed/hidden line is printed")
    if m:
        exposed, hidden, busy = map(float, m.groups())
        check(abs(exposed + hidden - busy) <= 2e-3 and busy > 0,
              f"{prec}: layer NCCL exposed {exposed} + hidden {hidden} = busy {busy} ms/iteration")
sys.exit(1 if fails else 0)
PY
