#!/usr/bin/env bash
# experiments/gpu-check end to end on the CPU emulation of a GPU (its dress
# rehearsal, docs/EMULATION.md): the script must run every step (kernel
# checks and smoke-shape timings, layer checks and timings, the strategy
# runs, the core step) and write each CSV with rows that name the emulation
# as their GPU, so that the first GPU run cannot lose its time to the
# script.  The strategy runs are emu_gpu_strategies' (left out here).
#   gpu_check_script.sh BUILD OUT [experiments/gpu-check ARGS...]
# (emu_gpu_check passes --part 1-7/20: emu_gpu_check_part2 runs the other
# shares of spbench-gpu-check's checks beside it.)
set -uo pipefail
build=${1:?usage: gpu_check_script.sh BUILD OUT}
out=${2:?usage: gpu_check_script.sh BUILD OUT}
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$out"
fail=0
SPB_GPU_CHECK_EMULATE=1 SPB_GPU_CHECK_BUILD="$build" \
    "$root/experiments/gpu-check" --out "$out" --tokens 64 --reps 1 --skip strategies --deadline 2100 "$@" \
    >"$out.log" 2>&1 || { echo "gpu-check exit code $? (log: $out.log)"; tail -30 "$out.log"; fail=1; }
# require_row CSV PATTERN WHAT: a written CSV must have a row with PATTERN
require_row() {
    [ -s "$out/$1" ] && ! grep -q -- "$2" "$out/$1" && { echo "FAIL: $1 has no $3"; fail=1; }
    return 0
}
# every CSV the script promises, each with data rows from the emulation only
for f in checks.csv timings.csv occupancy.csv layer_checks.csv layer_timings.csv layer_phases.csv core_step.csv; do
    if [ ! -s "$out/$f" ]; then
        echo "FAIL: $out/$f missing or empty"
        fail=1
        continue
    fi
    rows=$(($(wc -l <"$out/$f") - 1))
    [ "$rows" -ge 1 ] || { echo "FAIL: $f has no data rows"; fail=1; }
    echo "$f: $rows rows"
done
for f in checks.csv timings.csv occupancy.csv layer_checks.csv layer_timings.csv layer_phases.csv; do
    [ -s "$out/$f" ] || continue
    bad=$(tail -n +2 "$out/$f" | grep -vc '^CPU emulation of a CUDA device (no GPU),' || true)
    [ "$bad" -eq 0 ] || { echo "FAIL: $bad rows of $f do not name the emulation as their GPU"; fail=1; }
done
# the layer's step by phase: 8 forward (each product with its bias and
# residual) and 10 backward phases, attention among them
if [ -s "$out/layer_phases.csv" ]; then
    n=$(tail -n +2 "$out/layer_phases.csv" | grep -c ',layer,')
    [ "$n" = 18 ] && grep -q ',fwd attention,' "$out/layer_phases.csv" && grep -q ',bwd attention,' "$out/layer_phases.csv" &&
        grep -q ',fwd proj product + bias + residual,' "$out/layer_phases.csv" ||
        { echo "FAIL: layer_phases.csv: $n layer phases (18 expected, attention and the fused proj among them)"; fail=1; }
fi
# the layer with the wgmma backward in one kernel (the emulated device is a 9.0 one)
require_row layer_timings.csv ',layer-wgmma-fdq,fwd+bwd,' "layer-wgmma-fdq row"
# the unfused layer timed beside the fused one
require_row layer_timings.csv ',layer-unfused,fwd+bwd,' "layer-unfused row"
# one occupancy row per forward variant and head dim (17 x 2; zeros on the emulation)
[ -s "$out/occupancy.csv" ] && [ "$(($(wc -l <"$out/occupancy.csv") - 1))" != 34 ] &&
    { echo "FAIL: occupancy.csv: $(($(wc -l <"$out/occupancy.csv") - 1)) rows, 34 expected"; fail=1; }
# the 32-rows-per-warp forward and the exchange backward (both dQ adds) are timed, and the
# zigzag ring's per-rank compute
require_row timings.csv 'flash fwd (mma, 32 rows/warp)' "32-rows-per-warp forward row"
require_row timings.csv 'flash bwd (mma, exchange)' "exchange backward row"
require_row timings.csv 'flash bwd (mma, exchange, bulk dQ)' "exchange backward row with the bulk dQ"
require_row timings.csv 'flash fwd (wgmma, TMA producer, 128 keys)' "TMA forward row"
require_row timings.csv 'flash fwd (wgmma, TMA, ping-pong, 128 keys)' "ping-pong TMA forward row"
require_row timings.csv 'flash bwd (wgmma, fused, bulk dQ)' "fused wgmma backward row"
require_row timings.csv 'flash bwd (wgmma, TMA, fused dQ)' "TMA backward row"
require_row timings.csv 'flash bwd (wgmma, TMA, fused, bulk dQ)' "TMA backward row with the bulk dQ"
require_row timings.csv 'flash bwd (wgmma, TMA, overlapped, bulk dQ)' "overlapped TMA backward row"
require_row layer_timings.csv ',ring-zigzag,fwd+bwd,' "ring-zigzag row"
# one rank's attention at P = 8, with each call's heads in the last column (smoke shape: 16 heads, 64 tokens):
# 2 heads of 64 tokens (Ulysses, Megatron-SP) and 8-token blocks of 16 heads (ring), forward and backward, causal
# and full, 128- and 64-row blocks; every attention row carries its heads, no product row does
if [ -s "$out/timings.csv" ]; then
    read -r shares unheaded < <(python3 - "$out/timings.csv" <<'EOF'
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
share = re.compile(r"flash (fwd|bwd) \(mma(, 64 rows)?\) \((heads|rows)/8 P=8\)$")
good = [r for r in rows if r["kind"] == "attention" and share.match(r["name"]) and
        ((r["name"].endswith("(heads/8 P=8)") and r["m"] == "64" and r["heads"] == "2") or
         (r["name"].endswith("(rows/8 P=8)") and r["m"] == "8" and r["heads"] == "16"))]
print(len(good), sum((r["kind"] == "attention") != bool(r.get("heads")) for r in rows))
EOF
    )
    [ "$(head -1 "$out/timings.csv" | awk -F, '{print $NF}')" = heads ] && [ "$shares" = 16 ] && [ "$unheaded" = 0 ] ||
        { echo "FAIL: timings.csv: $shares per-rank attention rows of 16, $unheaded rows with heads wrong"; fail=1; }
fi
grep -q ',FAIL$' "$out/checks.csv" "$out/layer_checks.csv" 2>/dev/null && { echo "FAIL: a check failed"; fail=1; }
# the torch companion (torch on the CPU at the smoke shape) where python3 has
# torch: its rows must pair with ours (a ratio) for every product
if python3 -c 'import torch' >/dev/null 2>&1; then
    if [ ! -s "$out/torch_timings.csv" ]; then
        echo "FAIL: torch is here but torch_timings.csv was not written"
        fail=1
    else
        paired=$(python3 -c 'import csv, sys
print(sum(1 for r in csv.DictReader(open(sys.argv[1])) if r["kind"] == "gemm" and r["ratio_ours_over_torch"]))' \
            "$out/torch_timings.csv")
        echo "torch_timings.csv: $(($(wc -l <"$out/torch_timings.csv") - 1)) rows, $paired products paired with ours"
        [ "$paired" -ge 13 ] || { echo "FAIL: torch's product rows do not pair with ours (13 expected)"; fail=1; }
    fi
else
    echo "torch companion: no torch for $(command -v python3) here (not checked)"
fi
# the timings are the smoke shape's, said so, and no target verdict is printed for them
grep -q "timings at the smoke shape" "$out.log" || { echo "FAIL: the smoke shape is not announced"; fail=1; }
grep -q "target (issue 6)" "$out.log" && { echo "FAIL: a target verdict printed for smoke timings"; fail=1; }
grep -q "done: " "$out.log" || { echo "FAIL: the script did not reach its end"; fail=1; }
# --profile (what Nsight Compute runs over): every flash variant's passes and
# nothing else, each call named; 31 here (17 forwards, 14 backwards; no cuDNN)
prof=$("$build/spbench-gpu-check" --profile --smoke --tokens 64 2>&1)
if ! grep -q "^profile: 31 calls$" <<<"$prof" || [ "$(grep -c '^profile call ' <<<"$prof")" != 31 ]; then
    echo "FAIL: spbench-gpu-check --profile:"; echo "$prof" | tail -12; fail=1
fi
[ "$fail" = 0 ] && echo "gpu-check dress rehearsal on the emulation: PASS"
exit "$fail"
