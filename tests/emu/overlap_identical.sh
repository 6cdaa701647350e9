#!/usr/bin/env bash
# --ulysses-overlap on the emulated device gives plain Ulysses' loss and
# gradients bit for bit (as tests/test_hybrid_strategies.c checks on the
# CPU): each head's arithmetic is the same, only the exchange is cut into
# head groups.  fp32, P = 2, K = 2, one and two sequences per micro-batch,
# host-staged (--comm mpi) and, where the build has NCCL's stand-in, through
# NCCL on its communication stream; the dumps (loss and every gradient of
# the first iteration) must be equal byte for byte.
# Usage: overlap_identical.sh SPBENCH MPIEXEC NCCL(0|1)
set -u
spbench=$1
mpiexec=$2
nccl=${3:-0}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1 SPB_EMU_DEVICES=${SPB_EMU_DEVICES:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--device cuda --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --global-batch-size 2
      --train-iters 1 --attention flash --strategy ulysses --sp-degree 2 --quiet)
comms=(mpi)
[ "$nccl" = 1 ] && comms+=(nccl)
failed=0
for comm in "${comms[@]}"; do
    for mb in 1 2; do
        for k in 0 2; do
            if ! timeout 300 "$mpiexec" -np 2 "$spbench" "${args[@]}" --comm "$comm" --micro-batch-size "$mb" \
                --ulysses-overlap "$k" --dump "$tmp/$comm-$mb-$k" >"$tmp/log" 2>&1; then
                echo "FAIL --comm $comm --micro-batch-size $mb --ulysses-overlap $k: the run failed"
                tail -5 "$tmp/log"
                failed=1
                continue 2
            fi
        done
        if cmp -s "$tmp/$comm-$mb-0" "$tmp/$comm-$mb-2"; then
            echo "ok   --comm $comm --micro-batch-size $mb: --ulysses-overlap 2 = plain, byte for byte"
        else
            echo "FAIL --comm $comm --micro-batch-size $mb: --ulysses-overlap 2 differs from plain"
            failed=1
        fi
    done
done
exit $failed
