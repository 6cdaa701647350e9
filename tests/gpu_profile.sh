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

"$root/scripts/gpu-profile" --out "$tmp/p.profile" >/dev/null
verdict "regenerated from results/gpu/timings.csv: identical to the committed profile" \
    $(cmp -s "$tmp/p.profile" "$profile" && echo 0 || echo 1)

for be in flash cudnn; do
    for n in 4096 32768; do
        "$model" --profile "$profile" --attn-backend "$be" --world-size 1 --num-layers 1 --hidden-size 4096 \
            --num-attention-heads 32 --vocab-size 256 --seq-length "$n" --micro-batch-size 1 --strategy none \
            --results "$tmp/$be-$n.csv" >/dev/null
        case $be in flash) f="flash fwd (mma)" b="flash bwd (mma)" ;; *) f="cudnn fwd" b="cudnn bwd" ;; esac
        python3 - "$root/results/gpu/timings.csv" "$tmp/$be-$n.csv" "$f" "$b" "$n" <<'EOF' >"$tmp/cmp"
import csv, sys
timings, modelled, fwd, bwd, n = sys.argv[1:]
ms = {r["name"]: float(r["median_ms"]) for r in csv.DictReader(open(timings))
      if r["kind"] == "attention" and r["tokens"] == n and r["causal"] == "1" and r["name"] in (fwd, bwd)}
want = (ms[fwd] + ms[bwd]) * 1e-3
got = float(list(csv.DictReader(open(modelled)))[-1]["time_attention_s"])
print("%.6g %.6g %s" % (got, want, "ok" if abs(got - want) <= 1e-4 * want else "differ"))
EOF
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
