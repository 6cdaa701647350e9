#!/usr/bin/env bash
# Cross-check against an independent implementation: spbench writes a
# checkpoint and a gradient dump, tests/torch_gpt.py rebuilds the model in
# PyTorch (float64) and compares the loss and every gradient (rel <= 1e-5).
# Exit 77 (skipped) when Debian's python3-torch is not installed.
# Usage: torch_check.sh SPBENCH MPIEXEC
set -u
spbench=$1
mpiexec=$2
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "python3-torch not installed: skipped"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
text=/usr/share/common-licenses/GPL-3
passed=0
failed=0
run() { # label, launcher..., then spbench options
  local label=$1; shift
  if "$@" --train-iters 1 --quiet --dump "$tmp/$label" > "$tmp/$label.log" 2>&1 &&
     "$py" "$here/torch_gpt.py" check --dump "$tmp/$label" --tol 1e-5 > "$tmp/$label.check" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $label: $(tail -n 1 "$tmp/$label.check")"
  else
    failed=$((failed + 1))
    echo "FAIL $label"
    cat "$tmp/$label.log" "$tmp/$label.check" 2>/dev/null | tail -n 40
  fi
}
small_model="--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 24 --vocab-size 50"
small="$small_model --micro-batch-size 3"  # spbench takes an option once: dp2-accum sets its own micro-batch
# shellcheck disable=SC2086
run synthetic-flash "$spbench" $small --attention flash
# shellcheck disable=SC2086
run synthetic-naive "$spbench" $small --attention naive
# shellcheck disable=SC2086
run checkpointed "$spbench" $small --checkpoint-activations
# Longer than one flash tile; real text; larger init so softmaxes are peaked.
# shellcheck disable=SC2086
run text-multitile "$spbench" --num-layers 3 --hidden-size 48 --num-attention-heads 3 --seq-length 150 \
    --max-position-embeddings 160 --micro-batch-size 2 --init-method-std 0.1 --data "$text"
# Data parallel over 2 ranks with gradient accumulation: the dump is the
# gradient of the whole global batch.
# shellcheck disable=SC2086
run dp2-accum "$mpiexec" -np 2 "$spbench" $small_model --micro-batch-size 1 --global-batch-size 4
# Ulysses over 2 ranks with ZeRO-3: the dump gathers the reduce-scattered
# gradient slices and the checkpoint the partitioned parameters.
# shellcheck disable=SC2086
run ulysses-zero3 "$mpiexec" -np 2 "$spbench" $small --strategy ulysses --sp-degree 2 --zero-stage 3 \
    --global-batch-size 6
# Today's models (issue 35): the Llama preset (RoPE, RMSNorm, SwiGLU, untied
# head, no biases) with grouped-query and multi-query attention, on one rank
# and split by Ulysses (K/V head replicated, G < P), Megatron-SP and ring;
# GPT with some of the options alone.
# shellcheck disable=SC2086
run llama-gqa "$spbench" $small --model llama --num-query-groups 2 --ffn-hidden-size 48
# shellcheck disable=SC2086
run llama-mqa-ulysses "$mpiexec" -np 2 "$spbench" $small --model llama --num-query-groups 1 --ffn-hidden-size 48 \
    --strategy ulysses --sp-degree 2
# shellcheck disable=SC2086
run llama-megatron-zero2 "$mpiexec" -np 2 "$spbench" $small --model llama --num-query-groups 2 \
    --ffn-hidden-size 48 --strategy megatron --sp-degree 2 --zero-stage 2
# Megatron-SP with one K/V head on 2 ranks (its rows replicated on both, their
# gradients summed), GPT with biases, ZeRO-3 and two micro-steps: the dump
# and the checkpoint carry the one-rank layout.
# shellcheck disable=SC2086
run gpt-mqa-megatron-zero3 "$mpiexec" -np 2 "$spbench" $small --num-query-groups 1 --strategy megatron \
    --sp-degree 2 --zero-stage 3 --global-batch-size 6
# shellcheck disable=SC2086
run gpt-gqa-rope-ring "$mpiexec" -np 2 "$spbench" $small --num-query-groups 2 --position-embedding-type rope \
    --strategy ring --ring-layout zigzag --sp-degree 2
# shellcheck disable=SC2086
run gpt-swiglu-untied "$spbench" $small --swiglu --untie-embeddings-and-output-weights --normalization rmsnorm
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
