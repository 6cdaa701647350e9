#!/usr/bin/env bash
# experiments/gpu-check's order for a short lease: section 1 (correctness:
# kernel checks, layer checks, strategy runs), then section 2 (the core
# step, the layer timings), then section 3 (kernel timings, profile); each
# program's pass says which half it runs (--check-only / --timings-only), so
# no check runs twice; and a --deadline that falls in section 2 keeps
# section 1's CSVs and section 2's partial rows, and skips section 3 saying
# so.  With stand-in programs (SPB_GPU_CHECK_PREBUILT), so no GPU is needed;
# the stand-in spbench fails at once, which the strategy runs and the core
# step report and go past.  Usage: gpu_check_order.sh SOURCE_DIR
set -u
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build"
echo "SPB_CUDA_EMU:BOOL=ON" > "$tmp/build/CMakeCache.txt"
# prog NAME CSV-OF-CHECKS CSV-OF-TIMINGS: a stand-in that records its call and
# writes the CSV of the half it was asked for; with SLOW_TIMINGS set, the
# layer's timings write one row and then hang (a run the deadline cuts)
for spec in "spbench-gpu-check checks.csv timings.csv" "spbench-gpu-layer layer_checks.csv layer_timings.csv"; do
    read -r name checks timings <<<"$spec"
    cat > "$tmp/build/$name" <<STUB
#!/usr/bin/env bash
echo "$name \$*" >> "\$CALLS"
out=.
mode=both
while [ \$# -gt 0 ]; do
    case "\$1" in --out) out=\$2; shift 2 ;; --check-only) mode=checks; shift ;; --timings-only) mode=timings; shift ;;
    *) shift ;; esac
done
mkdir -p "\$out"
if [ \$mode != timings ]; then echo "kernel,result" > "\$out/$checks"; echo "x,PASS" >> "\$out/$checks"; fi
if [ \$mode != checks ]; then
    echo "name,ms" > "\$out/$timings"; echo "first,1" >> "\$out/$timings"
    [ "$name" = spbench-gpu-layer ] && [ -n "\${SLOW_TIMINGS:-}" ] && sleep 300
fi
exit 0
STUB
done
for p in spbench spbench-dump-compare spbrun; do printf '#!/bin/sh\nexit 1\n' > "$tmp/build/$p"; done
chmod +x "$tmp/build/"*
export CALLS="$tmp/calls.txt"
passed=0 failed=0
verdict() { # label, status
    if [ "$2" = 0 ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
run() { # out, extra gpu-check args...
    local o=$1
    shift
    SPB_GPU_CHECK_EMULATE=1 SPB_GPU_CHECK_PREBUILT=1 SPB_GPU_CHECK_BUILD="$tmp/build" SPB_GPU_CHECK_NCU=none \
        "$root/experiments/gpu-check" --out "$o" --skip torch "$@" > "$o.log" 2>&1
}
# line N of the log where PATTERN first appears (0: nowhere)
at() { grep -n -m1 -- "$2" "$1" | cut -d: -f1 | grep . || echo 0; }

run "$tmp/full"
log=$tmp/full.log
order=("spbench-gpu-check --check-only" "spbench-gpu-layer --check-only" "experiments/gpu-strategies"
       "experiments/gpu-core-step" "spbench-gpu-layer --timings-only" "spbench-gpu-check --timings-only" "profile:")
prev=0 ok=0
for step in "${order[@]}"; do
    n=$(at "$log" "$step")
    if [ "$n" = 0 ] || [ "$n" -le "$prev" ]; then ok=1; echo "     out of order or missing: $step (line $n)"; fi
    prev=$n
done
verdict "sections in order: checks, layer checks, strategies | core step, layer timings | kernel timings, profile" $ok
verdict "the section headers in the log" \
    $([ "$(grep -c 'section [123] of 3' "$log")" = 3 ] && echo 0 || echo 1)
verdict "each program's checks ran once, in the --check-only pass" \
    $([ "$(grep -c -- '--check-only' "$CALLS")" = 2 ] && [ "$(grep -c -- '--timings-only' "$CALLS")" = 2 ] &&
      ! grep -q -- '--check-only.*--timings-only\|--timings-only.*--check-only' "$CALLS" && echo 0 || echo 1)
verdict "every CSV written" \
    $(for f in checks.csv layer_checks.csv layer_timings.csv timings.csv; do [ -s "$tmp/full/$f" ] || echo no; done |
      grep -q no && echo 1 || echo 0)

: > "$CALLS"
# a deadline that ends in section 2: the layer's timings hang after one row
SLOW_TIMINGS=1 run "$tmp/cut" --deadline 45
log=$tmp/cut.log
verdict "cut short in section 2: section 1's CSVs kept" \
    $(grep -q "x,PASS" "$tmp/cut/checks.csv" && grep -q "x,PASS" "$tmp/cut/layer_checks.csv" && echo 0 || echo 1)
verdict "... the layer timings' row written before the cut kept" \
    $(grep -q "first,1" "$tmp/cut/layer_timings.csv" 2>/dev/null && echo 0 || echo 1)
verdict "... section 3 skipped, and the log says why" \
    $(grep -q "kernel-timings: skipped (.*--deadline" "$log" && ! grep -q -- "--timings-only" <(grep spbench-gpu-check "$CALLS") &&
      echo 0 || echo 1)
[ "$failed" = 0 ] || { echo "--- full run:"; cat "$tmp/full.log"; echo "--- cut run:"; cat "$tmp/cut.log"; }
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
