#!/usr/bin/env bash
# The spbench program end to end: two separate runs with the same seed give
# bit-identical losses; a run resumed from --save/--load reproduces the
# straight run; --results appends whole rows under one header; --help works.
# Usage: cli.sh SPBENCH MPIEXEC
set -u
spbench=$1
mpiexec=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
passed=0
failed=0
verdict() { # name, condition status
  if [ "$2" -eq 0 ]; then passed=$((passed + 1)); echo "ok   $1"; else failed=$((failed + 1)); echo "FAIL $1"; fi
}
text=/usr/share/common-licenses/GPL-3
# (spbench refuses an option given twice: the micro-batch is added per run)
base=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 48
      --global-batch-size 4 --data "$text" --lr 3e-3 --quiet)
args=("${base[@]}" --micro-batch-size 2)

# 1. Bit-identical losses across processes (2 ranks, data parallel).
"$mpiexec" -np 2 "$spbench" "${args[@]}" --train-iters 6 --loss-log "$tmp/a.csv" &&
"$mpiexec" -np 2 "$spbench" "${args[@]}" --train-iters 6 --loss-log "$tmp/b.csv"
cut -d, -f1-4 "$tmp/a.csv" > "$tmp/a.loss"; cut -d, -f1-4 "$tmp/b.csv" > "$tmp/b.loss"
[ "$(wc -l < "$tmp/a.loss")" -eq 7 ] && cmp -s "$tmp/a.loss" "$tmp/b.loss"
verdict "same seed, two processes: identical loss, lr and grad-norm columns" $?
"$spbench" "${args[@]}" --train-iters 6 --seed 7 --loss-log "$tmp/c.csv"
cut -d, -f1-2 "$tmp/c.csv" | cmp -s - <(cut -d, -f1-2 "$tmp/a.csv")
[ $? -ne 0 ]
verdict "another seed: another loss sequence" $?

# 2. Resume: 3 steps + save, load + 3 steps == 6 steps straight.
"$spbench" "${base[@]}" --micro-batch-size 4 --train-iters 6 --loss-log "$tmp/straight.csv" --save "$tmp/s.ckpt" &&
"$spbench" "${base[@]}" --micro-batch-size 4 --train-iters 3 --save "$tmp/half.ckpt" &&
"$spbench" "${base[@]}" --micro-batch-size 4 --train-iters 3 --load "$tmp/half.ckpt" --loss-log "$tmp/resumed.csv" \
    --save "$tmp/r.ckpt"
tail -n 3 "$tmp/straight.csv" | cut -d, -f1-2 > "$tmp/s.tail"
tail -n 3 "$tmp/resumed.csv" | cut -d, -f1-2 > "$tmp/r.tail"
cmp -s "$tmp/s.tail" "$tmp/r.tail" && cmp -s "$tmp/s.ckpt" "$tmp/r.ckpt"
verdict "save after 3, load, 3 more: same losses and same checkpoint as 6 straight" $?

# 2b. The same resume for Megatron-SP with one K/V head replicated on both
# ranks (ZeRO-1: the moments of the replicated rows are sliced too), and its
# checkpoint loads under another split (one rank, no strategy).
mega=("${base[@]}" --micro-batch-size 4 --strategy megatron --sp-degree 2 --num-query-groups 1 --zero-stage 1)
"$mpiexec" -np 2 "$spbench" "${mega[@]}" --train-iters 6 --loss-log "$tmp/ms.csv" --save "$tmp/ms.ckpt" &&
"$mpiexec" -np 2 "$spbench" "${mega[@]}" --train-iters 3 --save "$tmp/mh.ckpt" &&
"$mpiexec" -np 2 "$spbench" "${mega[@]}" --train-iters 3 --load "$tmp/mh.ckpt" --loss-log "$tmp/mr.csv" \
    --save "$tmp/mr.ckpt" &&
"$spbench" "${base[@]}" --micro-batch-size 4 --num-query-groups 1 --train-iters 1 --load "$tmp/mh.ckpt"
tail -n 3 "$tmp/ms.csv" | cut -d, -f1-2 > "$tmp/ms.tail"
tail -n 3 "$tmp/mr.csv" | cut -d, -f1-2 > "$tmp/mr.tail"
cmp -s "$tmp/ms.tail" "$tmp/mr.tail" && cmp -s "$tmp/ms.ckpt" "$tmp/mr.ckpt"
verdict "megatron G=1 < P=2: save after 3, load, 3 more = 6 straight; loads on one rank" $?

# 3. Results rows: one header, one whole row per run, fixed column count.
"$spbench" "${args[@]}" --train-iters 2 --results "$tmp/r.csv" --run-name first &&
"$mpiexec" -np 2 "$spbench" "${args[@]}" --train-iters 2 --results "$tmp/r.csv" --run-name second
awk -F, 'NR==1 {n=NF; if ($1 != "run_name") exit 1} NF != n {exit 1} END {if (NR != 3) exit 1}' "$tmp/r.csv" &&
  grep -q '^second,ok,none,cpu,mpi,fp32,,flash,,,,,2,2,1,' "$tmp/r.csv"
verdict "results CSV: header + 2 whole rows (1 and 2 ranks)" $?

# 4. Every iteration warm-up: the summary says there is nothing timed, and prints no nan.
loud=()
for a in "${args[@]}"; do [ "$a" = --quiet ] || loud+=("$a"); done
"$spbench" "${loud[@]}" --train-iters 1 > "$tmp/warm.out" 2>&1 &&
  grep -q '^summary: no measured iterations (--train-iters 1, the first 1 excluded by --timing-warmup)' \
    "$tmp/warm.out" && grep -q '^peak memory/rank' "$tmp/warm.out" && ! grep -qiw 'nan' "$tmp/warm.out"
verdict "--train-iters 1: no measured iterations, said so, no nan" $?
"$spbench" "${loud[@]}" --train-iters 2 > "$tmp/timed.out" 2>&1 &&
  grep -q '^summary: 1 measured iterations | iteration time median' "$tmp/timed.out" &&
  grep -q '^time/iteration' "$tmp/timed.out"
verdict "--train-iters 2: one measured iteration and its timings" $?

# 5. --help exits 0 and lists the options.
"$spbench" --help | grep -q -- '--num-attention-heads'
verdict "--help" $?

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
