#!/usr/bin/env bash
# Bad input: each invalid configuration must end every rank with a non-zero
# exit and exactly one "spbench: error:" line, within seconds, single-rank and
# under mpiexec -np 2.  A rank killed mid-run must not leave the others
# waiting.  Usage: bad_input.sh SPBENCH MPIEXEC
set -u
spbench=$1
mpiexec=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'short' > "$tmp/short.txt"
head -c 4096 /dev/urandom > "$tmp/garbage.ckpt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1

cases=(
  "--num-layers 0"
  "--hidden-size -8"
  "--hidden-size 30 --num-attention-heads 4"
  "--micro-batch-size 0"
  "--seq-length abc"
  "--frobnicate 1"
  "--strategy bogus"
  "--data /nonexistent/corpus.txt"
  "--data $tmp/short.txt"  # 5 bytes
  "--data /usr/share/common-licenses/GPL-3 --vocab-size 100"
  "--seq-length 128 --max-position-embeddings 64"
  "--zero-stage 7"
  "--sp-degree 3"
  "--micro-batch-size 2 --global-batch-size 5"
  "--lr"
  "--train-iters 1 --results $tmp/untimed.csv"   # every iteration warm-up: nothing to record
  "--device tpu"
  "--comm tcp"
  "--comm nccl"  # NCCL moves device buffers: needs --device cuda
  "--attention magic"
  "--attention cudnn"                          # cuDNN runs on the GPU: needs --device cuda
  "--device cuda --attention cudnn"            # ... and 16-bit operands (bf16, fp16)
  "--device cuda --precision bf16 --attention cudnn --hidden-size 144 --num-attention-heads 4"  # head dim 36
  "--load /nonexistent/model.ckpt"
  "--load $tmp/garbage.ckpt"
  "stray-argument"
  "--strategy none --sp-degree 2"
  "--strategy megatron --sp-degree 2 --num-attention-heads 3 --hidden-size 48"
  "--strategy ulysses --sp-degree 2 --num-attention-heads 3 --hidden-size 48"
  "--strategy megatron --sp-degree 2 --seq-length 63"
  "--num-query-groups 3"                                  # K/V heads must divide the 4 heads
  "--strategy megatron --sp-degree 2 --num-query-groups 1"  # Megatron-SP: G divisible by P
  "--strategy ulysses --sp-degree 2 --hidden-size 48 --num-attention-heads 6 --num-query-groups 3"  # G % P, P % G
  "--model mistral"
  "--position-embedding-type alibi"
  "--normalization batchnorm"
  "--rotary-base 0.5"
  "--position-embedding-type rope --hidden-size 36 --num-attention-heads 4"  # odd head dim
  "--swiglu --hidden-size 16 --num-attention-heads 4"     # Megatron's default MLP width is 0 here
  "--model llama --device cuda"                           # CPU only so far
  "--strategy ring --sp-degree 2 --ring-layout zigzag --seq-length 66"
  "--ring-layout spiral"
  "--attention-mask diagonal"
  "--ulysses-comm broadcast"
  "--zero-stage 3 --memory-budget 64KiB"
  "--memory-budget 1MiB"
  "--memory-budget lots"
  "--zero-stage -1"
  "--sparse-block 16 --seq-length 64"                       # no --sparse-local-blocks
  "--sparse-block 24 --sparse-local-blocks 2 --seq-length 64" # 24 does not divide 64
  "--sparse-block -8"
  "--sparse-local-blocks 2"                                 # without --sparse-block
  "--flash-block-rows 64"                                   # the CUDA flash kernels' variant: not on the CPU
  "--flash-dq fused"
  "--device cuda --precision bf16 --flash-block-rows 96"
  "--device cuda --precision bf16 --flash-dq sometimes"
  "--flash-fwd wgmma"                                       # not on the CPU either
  "--device cuda --precision bf16 --flash-fwd tma"
  "--device cuda --precision bf16 --flash-bwd wgmma --flash-dq fused --flash-block-rows 64"  # 128 keys per block
  "--device cuda --precision bf16 --bf16-kernels reference --flash-dq fused"  # the frames have no flash kernels
)

passed=0
failed=0
check_case() { # label, case text, command...
  local label=$1 text=$2; shift 2
  local start=$SECONDS
  timeout 60 "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  local took=$((SECONDS - start))
  local lines
  lines=$(grep -c '^spbench: error:' "$tmp/err")
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -lt 128 ] && [ "$lines" -eq 1 ] && [ "$took" -lt 30 ]; then
    passed=$((passed + 1))
    printf 'ok   %-4s %-52s rc=%d %ds: %s\n' "$label" "$text" "$rc" "$took" "$(grep '^spbench: error:' "$tmp/err")"
  else
    failed=$((failed + 1))
    printf 'FAIL %-4s rc=%d after %ds, %d error lines: %s\n' "$label" "$rc" "$took" "$lines" "$*"
    sed 's/^/     | /' "$tmp/err" | head -20
  fi
}

for c in "${cases[@]}"; do
  # shellcheck disable=SC2086
  check_case "np1" "$c" "$spbench" $c
  # shellcheck disable=SC2086
  check_case "np2" "$c" "$mpiexec" -np 2 "$spbench" $c
done

# A rank killed with SIGKILL mid-run: mpiexec must end the job, not hang.
"$mpiexec" -np 2 "$spbench" --train-iters 100000 --quiet > "$tmp/kill.out" 2>&1 &
launcher=$!
victim=""
for _ in $(seq 1 100); do
  victim=$(pgrep -f -n "^$spbench --train-iters 100000" || true)
  [ -n "$victim" ] && break
  sleep 0.1
done
sleep 1
start=$SECONDS
if [ -n "$victim" ]; then kill -9 "$victim"; fi
rc=0
for _ in $(seq 1 300); do
  if ! kill -0 "$launcher" 2>/dev/null; then break; fi
  sleep 0.1
done
if kill -0 "$launcher" 2>/dev/null; then
  failed=$((failed + 1))
  echo "FAIL killed rank: the job was still running 30 s after one rank was killed"
  pkill -9 -f "^$spbench --train-iters 100000"
  kill -9 "$launcher"
else
  wait "$launcher"; rc=$?
  if [ -n "$victim" ] && [ "$rc" -ne 0 ]; then
    passed=$((passed + 1))
    echo "ok   killed rank: job ended with rc=$rc $((SECONDS - start))s after SIGKILL of pid $victim"
  else
    failed=$((failed + 1))
    echo "FAIL killed rank: victim='$victim' rc=$rc"
  fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
