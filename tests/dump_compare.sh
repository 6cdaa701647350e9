#!/usr/bin/env bash
# spbench-dump-compare: a strategy's dump against the single-rank run passes;
# a gradient changed in one tensor fails naming that tensor; files that cannot
# be compared (other model, other batch, truncated) exit 2.
set -u
spbench=$1 compare=$2 mpiexec=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
verdict() { if [ "$2" -eq 0 ]; then echo "ok   $1"; pass=$((pass + 1)); else echo "FAIL $1"; fail=$((fail + 1)); fi; }
args=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --micro-batch-size 1
      --global-batch-size 2 --train-iters 1 --quiet)
short=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 1
       --global-batch-size 2 --train-iters 1 --quiet)  # args at --seq-length 16 (spbench takes an option once)

"$spbench" "${args[@]}" --dump "$tmp/ref" >/dev/null &&
"$mpiexec" -np 2 "$spbench" "${args[@]}" --strategy ulysses --sp-degree 2 --dump "$tmp/uly" >/dev/null &&
"$spbench" "${short[@]}" --dump "$tmp/short" >/dev/null &&
"$spbench" "${args[@]}" --seed 9 --dump "$tmp/seed" >/dev/null
verdict "runs for the dumps" $?

"$compare" "$tmp/uly" "$tmp/ref" > "$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "h1.fcproj_w" "$tmp/out" && grep -q "PASS" "$tmp/out"
verdict "Ulysses P=2 against the single rank: PASS, every tensor listed" $?

# One gradient element of h1.qkv_w, 1% larger: the tensor is named, exit 1.
python3 - "$tmp/uly" "$tmp/bad" "$compare" <<'PY'
import shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
shutil.copy(src + ".ckpt", dst + ".ckpt")
buf = bytearray(open(src, "rb").read())
B, T, V, n = struct.unpack_from("<4q", buf, 16)
L, C, heads, F, Vc, Pmax = struct.unpack_from("<6q", open(src + ".ckpt", "rb").read(), 16)
# wte, wpe, then h0's 12 tensors, then h1's ln1_w, ln1_b: h1.qkv_w starts here
h = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C
off = V * C + Pmax * C + h + 2 * C + 5
at = 256 + 8 * B * T + 4 * off
(g,) = struct.unpack_from("<f", buf, at)
struct.pack_into("<f", buf, at, g * 1.01 + 1e-3)
open(dst, "wb").write(buf)
PY
"$compare" "$tmp/bad" "$tmp/ref" > "$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "^h1.qkv_w .*FAIL" "$tmp/out" && [ "$(grep -c FAIL "$tmp/out")" -eq 2 ]
verdict "a changed h1.qkv_w gradient: exit 1, that tensor (and the verdict) FAIL" $?

# Uneven shares end to end: 35 tokens and 3 heads on 2 ranks (18/17 tokens,
# 2/1 heads; docs/STRATEGIES.md), Ulysses and contiguous ring, against one rank.
uneven=(--num-layers 2 --hidden-size 24 --num-attention-heads 3 --seq-length 35 --micro-batch-size 1
        --global-batch-size 2 --train-iters 1 --quiet)
"$spbench" "${uneven[@]}" --dump "$tmp/uneven_ref" >/dev/null &&
"$mpiexec" -np 2 "$spbench" "${uneven[@]}" --strategy ulysses --sp-degree 2 --dump "$tmp/uneven_uly" >/dev/null &&
"$mpiexec" -np 2 "$spbench" "${uneven[@]}" --strategy ring --sp-degree 2 --dump "$tmp/uneven_ring" >/dev/null &&
"$compare" "$tmp/uneven_uly" "$tmp/uneven_ref" > /dev/null 2>&1 && "$compare" "$tmp/uneven_ring" "$tmp/uneven_ref" > /dev/null 2>&1
verdict "N = 35 and 3 heads on P = 2 (uneven shares), Ulysses and ring: PASS" $?

"$compare" "$tmp/short" "$tmp/ref" > /dev/null 2>&1
[ $? -eq 2 ]
verdict "another sequence length: exit 2" $?
"$compare" "$tmp/seed" "$tmp/ref" > "$tmp/out" 2>&1
[ $? -eq 2 ] && grep -q "other batches\|other shapes" "$tmp/out"
verdict "another seed (other batch): exit 2 with the reason" $?
head -c 1000 "$tmp/ref" > "$tmp/trunc"; cp "$tmp/ref.ckpt" "$tmp/trunc.ckpt"
"$compare" "$tmp/trunc" "$tmp/ref" > /dev/null 2>&1
[ $? -eq 2 ]
verdict "a truncated dump: exit 2" $?
"$compare" --tol 0 "$tmp/ref" "$tmp/ref" > /dev/null 2>&1
[ $? -eq 2 ]
verdict "--tol 0 refused" $?

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
