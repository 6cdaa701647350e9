#!/usr/bin/env bash
# Uneven shares on the emulated device (N or H not divisible by P, zigzag's
# chunks of two sizes, the hybrid's uneven head groups): through
# NCCL the per-rank-count collectives (comm.h's alltoallv, allgatherv,
# reduce_scatterv: grouped send/receive, the reduce-scatter's sum in rank
# order in fp32) and ring blocks of two sizes give the host-staged run's loss
# and gradients byte for byte, and none of them falls back to the staged
# path (results column comm_staged_fallbacks = 0): a device table without
# the entries would give the same bytes through the fallback, so the count
# is what shows NCCL ran them.  (Against the single-rank CPU reference:
# experiments/gpu-strategies' uneven rows.)
# Usage: uneven_identical.sh SPBENCH MPIEXEC NCCL(0|1)
set -u
spbench=$1
mpiexec=$2
nccl=${3:-0}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 SPB_EMU_DEVICES=${SPB_EMU_DEVICES:-4}
if [ "$nccl" != 1 ]; then
    echo "skipped: this build has no NCCL stand-in"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=(--device cuda --num-layers 2 --seq-length 61 --global-batch-size 2
      --micro-batch-size 1 --train-iters 2 --timing-warmup 1 --attention flash --quiet)
# name | ranks | options
runs=(
    "ulysses-P4-heads|4|--strategy ulysses --sp-degree 4"
    "megatron-P3|3|--strategy megatron --sp-degree 3"
    "megatron-P2-D2-zero2|4|--strategy megatron --sp-degree 2 --zero-stage 2"
    "ring-P3|3|--strategy ring --sp-degree 3"
    "allgather-kv-P3|3|--strategy allgather-kv --sp-degree 3"
    "hybrid-P4-U2|4|--strategy hybrid --sp-degree 4 --ulysses-degree 2"
    "ring-P3-zigzag|3|--strategy ring --sp-degree 3 --ring-layout zigzag"
    "hybrid-P4-U2-heads3-zigzag|4|--strategy hybrid --sp-degree 4 --ulysses-degree 2 --ring-layout zigzag --num-attention-heads 3 --hidden-size 48"
    "bf16-allgather-kv-P3|3|--strategy allgather-kv --sp-degree 3 --precision bf16"
)
failed=0
for run in "${runs[@]}"; do
    IFS='|' read -r name np opts <<<"$run"
    [[ $opts == *--num-attention-heads* ]] || opts+=" --hidden-size 96 --num-attention-heads 6" # 6 heads of 16
    read -ra extra <<<"$opts"
    for comm in mpi nccl; do
        if ! timeout 300 "$mpiexec" -np "$np" "$spbench" "${base[@]}" "${extra[@]}" --comm "$comm" \
            --dump "$tmp/$name-$comm" --results "$tmp/$name-$comm.csv" >"$tmp/log" 2>&1; then
            echo "FAIL $name --comm $comm: the run failed"
            tail -5 "$tmp/log"
            failed=1
            continue 2
        fi
    done
    same=""
    [[ $name == bf16-* ]] && same="(bf16: not compared byte for byte) "
    col=$(head -1 "$tmp/$name-nccl.csv" | tr ',' '\n' | grep -nx comm_staged_fallbacks | cut -d: -f1)
    fallbacks=$([ -n "$col" ] && tail -1 "$tmp/$name-nccl.csv" | cut -d, -f"$col")
    # bf16: NCCL's even all-reduce of the gradients sums in bf16, the staged
    # path in fp32, so only the fallbacks are compared there
    if [[ $name != bf16-* ]] && ! cmp -s "$tmp/$name-mpi" "$tmp/$name-nccl"; then
        echo "FAIL $name: NCCL's loss and gradients differ from the host-staged run's"
        failed=1
    elif [ "$fallbacks" != 0 ]; then
        echo "FAIL $name: ${fallbacks:-no} collectives took the staged path under --comm nccl (want 0)"
        failed=1
    else
        echo "ok   $name: ${same:-NCCL = host-staged byte for byte, }0 staged fallbacks"
    fi
done
exit $failed
