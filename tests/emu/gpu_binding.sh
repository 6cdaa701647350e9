#!/usr/bin/env bash
# Which GPU each rank takes, on the CPU emulation of a node's devices
# (SPB_EMU_DEVICES; the emulator reads CUDA_VISIBLE_DEVICES as the CUDA
# runtime does).  What a cluster launcher does to spbench:
#   - a GPU per rank through CUDA_VISIBLE_DEVICES (Slurm's --gpus-per-task):
#     every rank sees one device, its "GPU 0", and --comm nccl runs, with the
#     same losses as ranks taking the node's GPUs round-robin;
#   - two ranks left on one GPU under --comm nccl: exit 2 on every rank and
#     one error line naming both ranks and the GPU, before NCCL starts;
#   - one GPU for two ranks under --comm mpi: allowed (the host-staged path);
#   - CUDA_VISIBLE_DEVICES that hides every GPU: exit 2, saying so.
# Usage: gpu_binding.sh SPBENCH MPIEXEC
set -u
spbench=$1
mpiexec=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
unset CUDA_VISIBLE_DEVICES
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--device cuda --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 --vocab-size 64
      --micro-batch-size 1 --global-batch-size 1 --train-iters 2 --strategy ulysses --sp-degree 2 --quiet)
passed=0 failed=0
verdict() { # label, 0 for a pass
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
is() { [ "$1" = "$2" ] && echo 0 || echo 1; }
# The rank on its machine, from whichever launcher started it (Open MPI,
# MPICH/Hydra, the project's spbrun): what a per-rank GPU binding reads.
local_rank='${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SPBRUN_RANK:-0}}}'
# run NAME [VAR=VALUE ...] -- SPBENCH-ARGS...; the VISIBLE variable, when
# given, is a shell expression of $r (the local rank) for CUDA_VISIBLE_DEVICES
run() {
    local name=$1 visible=""
    shift
    local envs=()
    while [ "$1" != -- ]; do
        case "$1" in VISIBLE=*) visible=${1#VISIBLE=} ;; *) envs+=("$1") ;; esac
        shift
    done
    shift
    if [ -n "$visible" ]; then
        env "${envs[@]}" timeout 120 "$mpiexec" -np 2 sh -c \
            "r=$local_rank; CUDA_VISIBLE_DEVICES=$visible exec \"\$0\" \"\$@\"" "$spbench" "$@" \
            >"$tmp/$name.out" 2>"$tmp/$name.err"
    else
        env "${envs[@]}" timeout 120 "$mpiexec" -np 2 "$spbench" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
    fi
    echo $?
}
losses() { cut -d, -f2 "$1" 2>/dev/null | tr '\n' ' '; }
errors() { grep -c "^spbench: error:" "$tmp/$1.err"; }
show() { [ "$2" = 0 ] || tail -n 3 "$tmp/$1.err"; }

# 1. Round-robin over the node's 4 GPUs (ranks 0 and 1 on GPUs 0 and 1), the reference.
rc=$(run rr SPB_EMU_DEVICES=4 -- "${args[@]}" --comm nccl --loss-log "$tmp/rr.csv")
v=$(is "$rc" 0); verdict "4 GPUs, round-robin, --comm nccl: rc=$rc" "$v"; show rr "$v"

# 2. A GPU per rank, in reverse (rank r sees only GPU 3 - r): each rank's
#    "GPU 0" is a different GPU; it must run and repeat the losses.
rc=$(run own SPB_EMU_DEVICES=4 'VISIBLE=$((3 - r))' -- "${args[@]}" --comm nccl --loss-log "$tmp/own.csv")
v=$(is "$rc" 0); verdict "a GPU per rank by CUDA_VISIBLE_DEVICES, --comm nccl: rc=$rc" "$v"; show own "$v"
a=$(losses "$tmp/rr.csv") b=$(losses "$tmp/own.csv")
v=$([ -n "$a" ] && [ "$a" = "$b" ] && echo 0 || echo 1)
verdict "the same losses as round-robin: [$b] vs [$a]" "$v"

# 3. Both ranks given GPU 2 only: refused before NCCL, one line naming the GPU.
rc=$(run same SPB_EMU_DEVICES=4 VISIBLE=2 -- "${args[@]}" --comm nccl)
n=$(errors same)
named=$(grep -c "local ranks 0 and 1 of this machine are both bound to GPU-.*02 (PCI 0000:12:00)" "$tmp/same.err")
verdict "both ranks on GPU 2, --comm nccl: rc=$rc, $n error line(s), GPU named $named time(s)" \
    "$([ "$rc" = 2 ] && [ "$n" = 1 ] && [ "$named" = 1 ] && echo 0 || echo 1)"
head -n 1 "$tmp/same.err" | cut -c1-150

# 4. One GPU on the machine for two ranks: refused under NCCL...
rc=$(run one -- "${args[@]}" --comm nccl)
n=$(errors one)
verdict "one GPU, two ranks, --comm nccl: rc=$rc, $n error line(s)" \
    "$([ "$rc" = 2 ] && [ "$n" = 1 ] && grep -q "both bound to" "$tmp/one.err" && echo 0 || echo 1)"
# ... and shared through the host under --comm mpi, with the same losses.
rc=$(run shared -- "${args[@]}" --comm mpi --loss-log "$tmp/shared.csv")
v=$(is "$rc" 0); verdict "one GPU, two ranks, --comm mpi: rc=$rc" "$v"; show shared "$v"
b=$(losses "$tmp/shared.csv")
v=$([ -n "$a" ] && [ "$a" = "$b" ] && echo 0 || echo 1)
verdict "the same losses through the host: [$b]" "$v"

# 5. CUDA_VISIBLE_DEVICES empty: no GPU for any rank.
rc=$(run hidden SPB_EMU_DEVICES=4 CUDA_VISIBLE_DEVICES= -- "${args[@]}")
n=$(errors hidden)
verdict "CUDA_VISIBLE_DEVICES empty: rc=$rc, $n error line(s)" \
    "$([ "$rc" = 2 ] && [ "$n" = 1 ] && grep -q 'no CUDA device visible.*CUDA_VISIBLE_DEVICES=""' "$tmp/hidden.err" &&
        echo 0 || echo 1)"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
