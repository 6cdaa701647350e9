#!/usr/bin/env bash
# scripts/gpu-profile and the profile it made from the H200 run: the
# committed profiles/H200-141GB-HGX-measured.profile is exactly what the
# script writes from the committed results/gpu/timings.csv (no number typed
# by hand), and spbench-model with it reproduces the measured attention: for
# one layer of the 7B shape on one GPU, one sequence of N tokens (the very
# call the GPU check timed), the model's attention time equals the run's
# forward + backward median, for spbench's flash kernels and for cuDNN
# (--attn-backend), causal, at 4K and 32K tokens.  A backend the profile did
# not measure, and a missing CSV, are one error each.  The projections
# (scripts/project-gpu-measured) and the model-against-H200 table
# (scripts/validate-model-gpu) are written, whole, into a scratch directory.
# A run that recorded each attention call's heads and one rank's calls at
# P = 8 (spbench-gpu-check since 2026-12-03; synthetic rows here): every
# attn_point carries its head count, and Ulysses' and Megatron-SP's 4-head
# calls are priced at the 4-head rate, the layer's at the 32-head one.
# Usage: gpu_profile.sh SOURCE_DIR SPBENCH_MODEL
set -u
root=$1
model=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
verdict() { # label, status
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
profile=$root/profiles/H200-141GB-HGX-measured.profile

# attn_cmp.py RESULT_CSV WANT_S: the model's attention time against WANT_S (1e-4); prints "got want ok|differ".
# WANT_S is a number, or "measured TIMINGS N FWD BWD": the sum of those rows' medians (causal, N tokens)
cat >"$tmp/attn_cmp.py" <<'EOF'
import csv, sys
got = float(list(csv.DictReader(open(sys.argv[1])))[-1]["time_attention_s"])
if sys.argv[2] == "measured":
    timings, n, fwd, bwd = sys.argv[3:]
    ms = {r["name"]: float(r["median_ms"]) for r in csv.DictReader(open(timings))
          if r["kind"] == "attention" and r["tokens"] == n and r["causal"] == "1" and r["name"] in (fwd, bwd)}
    want = (ms[fwd] + ms[bwd]) * 1e-3
else:
    want = float(sys.argv[2])
print("%.6g %.6g %s" % (got, want, "ok" if abs(got - want) <= 1e-4 * want else "differ"))
EOF

"$root/scripts/gpu-profile" --out "$tmp/p.profile" >/dev/null
verdict "regenerated from results/gpu/timings.csv: identical to the committed profile" \
    $(cmp -s "$tmp/p.profile" "$profile" && echo 0 || echo 1)

for be in flash cudnn; do
    for n in 4096 32768; do
        "$model" --profile "$profile" --attn-backend "$be" --world-size 1 --num-layers 1 --hidden-size 4096 \
            --num-attention-heads 32 --vocab-size 256 --seq-length "$n" --micro-batch-size 1 --strategy none \
            --results "$tmp/$be-$n.csv" >/dev/null
        case $be in flash) f="flash fwd (mma)" b="flash bwd (mma)" ;; *) f="cudnn fwd" b="cudnn bwd" ;; esac
        python3 "$tmp/attn_cmp.py" "$tmp/$be-$n.csv" measured "$root/results/gpu/timings.csv" "$n" "$f" "$b" \
            >"$tmp/cmp"
        read -r got want word <"$tmp/cmp"
        verdict "$be, $n tokens causal: modelled attention ${got} s = measured fwd + bwd ${want} s" \
            $([ "$word" = ok ] && echo 0 || echo 1)
    done
done

# a run that also timed one rank's products (spbench-gpu-check since the per-rank shares): every shape becomes
# a gemm_point, each op's row mapped back to the layer's rows, in, out
cp "$root/results/gpu/timings.csv" "$tmp/shares.csv"
cp "$root/profiles/H200-141GB-HGX.profile" "$tmp/" # what it includes, beside it
g="NVIDIA H200,13.0,13.0,5ebdda91b913,gemm"
{ echo "$g,qkv fwd (megatron-sp P=8),4096,4096,1536,4096,,7,0.1,300,30"
  echo "$g,qkv bwd dinp (megatron-sp P=8),4096,4096,4096,1536,,7,0.1,310,31"
  echo "$g,qkv bwd dW (megatron-sp P=8),4096,1536,4096,4096,,7,0.1,320,32"; } >> "$tmp/shares.csv"
"$root/scripts/gpu-profile" --timings "$tmp/shares.csv" --out "$tmp/shares.profile" >/dev/null
verdict "per-rank shares timed: a gemm_point per shape (17), the share's and the layer's mapped right" \
    $([ "$(grep -c '^gemm_point = ' "$tmp/shares.profile")" = 17 ] &&
      grep -q '^gemm_point = 4096 4096 1536 3e+14 3.1e+14 3.2e+14$' "$tmp/shares.profile" &&
      grep -q '^gemm_point = 4096 4096 12288 7.72152e+14 7.77698e+14 7.22046e+14$' "$tmp/shares.profile" &&
      "$model" --profile "$tmp/shares.profile" --world-size 1 >/dev/null && echo 0 || echo 1)
verdict "... and none from the committed run, which timed no shares" \
    $(! grep -q '^gemm_point' "$profile" && echo 0 || echo 1)

# the projections from it (scripts/project-gpu-measured), into a scratch directory
BUILD=$(dirname "$model") OUT="$tmp/proj" "$root/scripts/project-gpu-measured" >/dev/null 2>"$tmp/perr"
rc=$?
verdict "project-gpu-measured: 36 modelled rows, the table's 12 lines and a figure (rc=$rc)" \
    $([ "$rc" = 0 ] && [ "$(grep -c ',modelled,' "$tmp/proj/h200-measured.csv")" = 36 ] &&
      [ "$(grep -cE '^\| (ulysses|megatron|ring) \| [0-9]+K \| yes \|' "$tmp/proj/h200-measured.md")" = 12 ] &&
      [ -s "$tmp/proj/model-h200-measured.png" ] && echo 0 || echo 1)
[ "$rc" = 0 ] || cat "$tmp/perr"

# and the model against the layer times of the same run (scripts/validate-model-gpu): a row per measured row
BUILD=$(dirname "$model") OUT="$tmp/val" "$root/scripts/validate-model-gpu" >/dev/null 2>"$tmp/verr"
rc=$?
want=$(awk -F, '$6 == "fwd+bwd" && $5 ~ /^(layer|megatron-sp|ulysses|ring|ring-zigzag)$/' \
       "$root/results/gpu/layer_timings.csv" | wc -l)
verdict "validate-model-gpu: a row per measured fwd+bwd row ($want) (rc=$rc)" \
    $([ "$rc" = 0 ] && [ "$(grep -cE '^\| [a-z-]+ \| [0-9]+K \| ' "$tmp/val/validation-h200.md")" = "$want" ] &&
      echo 0 || echo 1)
[ "$rc" = 0 ] || cat "$tmp/verr"

# a run that recorded each call's heads and timed one rank's attention at P = 8 (spbench-gpu-check since
# 2026-12-03): the committed rows with a heads column, plus flash rows of 4 heads at 4K and 32K tokens and of
# 512- and 4096-token blocks of 32 heads (rates chosen here, unlike any measured)
python3 - "$root/results/gpu/timings.csv" "$tmp/heads.csv" <<'EOF'
import csv, sys
src, dst = sys.argv[1:]
rows = list(csv.DictReader(open(src)))
fields = list(rows[0].keys()) + ["heads"]
for r in rows:
    r["heads"] = "32" if r["kind"] == "attention" else ""
def add(name, tokens, length, causal, tflops, heads):
    pairs = heads * (length * (length + 1) / 2 if causal else length * length)
    flops = (4.0 if " fwd " in name else 10.0) * 128 * pairs
    rows.append(dict(rows[0], kind="attention", name=name, tokens=tokens, m=length, n=length, k=128,
                     causal=causal, median_ms="%.6g" % (flops / (tflops * 1e12) * 1e3), tflops=tflops,
                     pct_of_peak="", heads=heads))
for n in (4096, 32768):
    for c in (1, 0):
        add("flash fwd (mma) (heads/8 P=8)", n, n, c, 61 + 1 - c + n // 4096, 4)
        add("flash bwd (mma) (heads/8 P=8)", n, n, c, 41 + 1 - c + n // 4096, 4)
        add("flash fwd (mma) (rows/8 P=8)", n, n // 8, c, 71 + c, 32)  # 32768 / 8: the layer's own 4K shape
        add("flash bwd (mma) (rows/8 P=8)", n, n // 8, c, 51 + c, 32)
w = csv.DictWriter(open(dst, "w", newline=""), fieldnames=fields)
w.writeheader()
w.writerows(rows)
EOF
"$root/scripts/gpu-profile" --timings "$tmp/heads.csv" --out "$tmp/heads.profile" >/dev/null
verdict "heads recorded: every attn_point carries them (22: 16 of 32 heads, 4 of 4 heads, 2 of 512-token blocks)" \
    $([ "$(grep -c '^attn_point = ' "$tmp/heads.profile")" = 22 ] &&
      [ "$(grep -cE '^attn_point = \S+ \S+ [0-9]+ 128 \S+ \S+ (32|4)$' "$tmp/heads.profile")" = 22 ] &&
      grep -q '^attn_point = flash causal 32768 128 6.9e+13 4.9e+13 4$' "$tmp/heads.profile" &&
      grep -q '^attn_point = flash full 512 128 7.1e+13 5.1e+13 32$' "$tmp/heads.profile" &&
      grep -q '^attn_point = flash causal 4096 128 1.53254e+14 1.1086e+14 32$' "$tmp/heads.profile" &&
      echo 0 || echo 1)
# Ulysses and Megatron-SP at P = 8 price their 4-head calls at the 4-head rate; the layer (P = 1) its
# 32-head call at the measured one
for case in "ulysses 8 69 49" "megatron 8 69 49" "none 1 0 0"; do
    set -- $case
    "$model" --profile "$tmp/heads.profile" --world-size "$2" --sp-degree "$2" --strategy "$1" --num-layers 1 \
        --hidden-size 4096 --num-attention-heads 32 --vocab-size 256 --seq-length 32768 --micro-batch-size 1 \
        --results "$tmp/h-$1.csv" >/dev/null
    if [ "$3" = 0 ]; then # the layer's 32 heads: the measured medians
        want=(measured "$root/results/gpu/timings.csv" 32768 "flash fwd (mma)" "flash bwd (mma)")
    else # 4 heads at the rates chosen above: 4 heads x 128 x the causal pairs, 4 and 10 FLOPs each
        want=("$(python3 -c "print(4 * 128 * 32768 * 32769 / 2 * (4 / ($3 * 1e12) + 10 / ($4 * 1e12)))")")
    fi
    python3 "$tmp/attn_cmp.py" "$tmp/h-$1.csv" "${want[@]}" >"$tmp/cmp"
    read -r got want word <"$tmp/cmp"
    verdict "$1 at P = $2, 32K tokens: modelled attention ${got} s = ${want} s, from the points of its heads" \
        $([ "$word" = ok ] && echo 0 || echo 1)
done
# the validation table names what the strategies' rows rest on: here the 4-head and short-block points
BUILD=$(dirname "$model") OUT="$tmp/valh" PROFILE="$tmp/heads.profile" "$root/scripts/validate-model-gpu" \
    >/dev/null 2>"$tmp/verr"
verdict "validate-model-gpu with head-counted points: says the attention is priced by them, products by the ramp" \
    $(grep -q "products by the layer's efficiency down the assumed ramp.*attention by calls timed at their own" \
      "$tmp/valh/validation-h200.md" && grep -q "the P = 8 rows are out of sample" "$tmp/valh/validation-h200.md" &&
      ! grep -q "tile model" "$tmp/valh/validation-h200.md" && echo 0 || echo 1)
verdict "... and with the committed profile (32 heads only): by the tile model, out of sample" \
    $(grep -q "the attention by the layer's 32-head rates carried to each call by the profile's tile model (132 SMs" \
      "$root/results/model/validation-h200.md" && echo 0 || echo 1)
printf 'name = x\ninclude = H200-141GB-HGX.profile\nattn_point = flash causal 4096 128 1e14 1e14 0\n' \
    >"$tmp/zero.profile"
"$model" --profile "$tmp/zero.profile" --world-size 1 >/dev/null 2>"$tmp/err"
rc=$?
verdict "an attn_point of 0 heads: one error naming its line (rc=$rc)" \
    $([ "$rc" != 0 ] && grep -q "zero.profile:3: bad value for 'attn_point'" "$tmp/err" && echo 0 || echo 1)

"$model" --profile "$profile" --attn-backend naive --world-size 1 >/dev/null 2>"$tmp/err"
rc=$?
verdict "--attn-backend naive (not measured): one error (rc=$rc)" \
    $([ "$rc" = 2 ] && [ "$(grep -c '^spbench-model: error: --attn-backend naive' "$tmp/err")" = 1 ] &&
      echo 0 || echo 1)
"$root/scripts/gpu-profile" --timings "$tmp/none.csv" --out "$tmp/q.profile" >/dev/null 2>"$tmp/err"
rc=$?
verdict "a missing timings CSV: one error (rc=$rc), no profile" \
    $([ "$rc" = 2 ] && [ "$(grep -c '^gpu-profile: error:' "$tmp/err")" = 1 ] && [ ! -e "$tmp/q.profile" ] &&
      echo 0 || echo 1)

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
