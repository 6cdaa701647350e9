#!/usr/bin/env bash
# --flash-fwd wgmma on the CPU emulation of a device: a short run passes on
# the emulated 9.0 device (the instruction's model, emu_wgmma.cc), with the
# backward's dQ split and fused (dkv_wgmma with dQ), and on an
# emulated 8.0 one (SPB_EMU_COMPUTE_CAPABILITY, as an A100) every rank
# stops with one "spbench: error:" line and exit 2, single-rank and under
# mpiexec -np 2, within seconds.  Usage: wgmma_refused.sh SPBENCH MPIEXEC
set -u
spbench=$1
mpiexec=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--device cuda --precision bf16 --flash-fwd wgmma --flash-bwd wgmma --num-layers 1 --hidden-size 128 --num-attention-heads 2
      --seq-length 96 --vocab-size 64 --micro-batch-size 1 --global-batch-size 1 --train-iters 1 --quiet)
passed=0 failed=0
verdict() { # label, status
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}

timeout 300 "$spbench" "${args[@]}" >"$tmp/out" 2>"$tmp/err"
rc=$?
verdict "9.0 device: --flash-fwd wgmma runs (rc=$rc)" $([ "$rc" = 0 ] && echo 0 || echo 1)
[ "$rc" = 0 ] || tail -5 "$tmp/err"
timeout 300 "$spbench" "${args[@]}" --flash-dq fused >"$tmp/out" 2>"$tmp/err"
rc=$?
verdict "9.0 device: --flash-bwd wgmma --flash-dq fused runs (rc=$rc)" $([ "$rc" = 0 ] && echo 0 || echo 1)
[ "$rc" = 0 ] || tail -5 "$tmp/err"

for np in 1 2; do
    if [ "$np" = 1 ]; then
        SPB_EMU_COMPUTE_CAPABILITY=8.0 timeout 60 "$spbench" "${args[@]}" >"$tmp/out" 2>"$tmp/err"
    else
        SPB_EMU_COMPUTE_CAPABILITY=8.0 timeout 60 "$mpiexec" -np 2 "$spbench" "${args[@]}" --strategy ulysses \
            --sp-degree 2 >"$tmp/out" 2>"$tmp/err"
    fi
    rc=$?
    lines=$(grep -c "^spbench: error: --flash-fwd/--flash-bwd wgmma" "$tmp/err")
    verdict "8.0 device, np $np: refused, rc=$rc, $lines error line(s): $(head -1 "$tmp/err" | cut -c1-110)" \
        $([ "$rc" = 2 ] && [ "$lines" = 1 ] && echo 0 || echo 1)
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
