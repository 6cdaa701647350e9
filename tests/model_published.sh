#!/usr/bin/env bash
# The performance model against the published multi-GPU measurements
# (results/model/published/points.csv): fails when the median |error| rises
# above 15% or fewer than 25 points run; and the model refuses a counted rate
# above the device's peak.  Writes only inside its own temporary directory.
#   model_published.sh SOURCE_DIR SPBENCH_MODEL
set -euo pipefail
src=$1 model=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
BUILD=$(dirname "$model") python3 "$src/scripts/validate-model-published" --check "$tmp"
# an impossible profile: GEMMs at twice the peak
printf 'include = %s\ngemm_eff = 2\n' "$src/profiles/A100-80GB-DGX.profile" > "$tmp/impossible.profile"
if "$model" --profile "$tmp/impossible.profile" --world-size 8 --num-layers 2 --hidden-size 1024 \
    --num-attention-heads 8 --seq-length 2048 > "$tmp/out.txt" 2>&1; then
    echo "model_published: a counted rate above the peak was not refused"; cat "$tmp/out.txt"; exit 1
fi
grep -q "refused: counted rate" "$tmp/out.txt" || { echo "model_published: no refusal message"; cat "$tmp/out.txt"; exit 1; }
echo "model_published: ok"
